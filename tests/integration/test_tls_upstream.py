"""An https upstream read the way a plain one is (tokentap reads the TLS
connection itself once its handshake is done: every record waiting taken
in one wake-up), over real sockets, against Python's ssl as the server:
a stream cut into TLS records of every size from 1 byte up, each written
alone, arrives byte for byte; a burst of hundreds of records written at
once (more than one read takes) arrives whole and in a few reads, not one
per record; an upstream that sends close_notify mid-response has the
response cut (client connection closed, upstream_reset), and one that ends
a close-delimited stream with close_notify has it complete; and a second
connection to the same upstream resumes the first one's TLS session, but
not across a reload, which makes the upstream a new TLS context. And
each event reaches the client when its record's last byte reaches tokentap,
wherever records fall in TCP segments (one cut over two segments, two in
one, one beside the start of the next), not at the upstream's next write.

And the client side, where tokentap writes each upstream read to a TLS
client at once (SSL_write in the read's own call): a client that stops
reading while megabytes stream in large upstream writes (the socket fills
mid-record, that record goes on from the output buffer, the upstream is
paused and resumed), then reads all, gets every byte in order, and small
events each arrive as they are written."""

import os
import re
import shutil
import socket
import ssl
import tempfile
import threading
import time

import harness
import routing_helpers as rh
from test_tls import make_pki, tls_conn

PROMPT_S = 5.0

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tok%05d"}}]}\n\n'


def sse_body(n):
    return b"".join(EVENT % i for i in range(n)) + b"data: [DONE]\n\n"


def sse_head(length=None, close=False):
    h = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if length is not None:
        h += b"Content-Length: %d\r\n" % length
    if close:
        h += b"Connection: close\r\n"
    return h + b"\r\n"


def send_records(sock, data, sizes):
    """`data` in TLS records of the sizes `sizes` cycles through: each
    sendall on an SSLSocket is one record (up to 16 KiB)."""
    i = 0
    k = 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        sock.sendall(data[i:i + n])
        i += n
        k += 1
    return k


def every_size(sock, req, fu):
    """Records of 1, 2, 3, ... 400 bytes, then up to 16 KiB, each alone on
    the wire now and then (a pause), so that reads end inside records."""
    body = sse_body(600)
    sock.sendall(sse_head(len(body)))
    i, n = 0, 1
    while i < len(body):
        sock.sendall(body[i:i + n])
        i += n
        if n % 7 == 0:
            time.sleep(0.002)
        n = n + 1 if n < 400 else min(16384, n * 2)
    return True


def burst(sock, req, fu):
    """Some 1,800 records of 9 to 120 bytes corked into one write: 130 KiB
    waiting at once, more than one read takes (64 KiB)."""
    body = sse_body(2000)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    sock.sendall(sse_head(len(body)))
    fu.records = send_records(sock, body, [9, 120, 33, 77, 64, 101])
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
    return True


def notify_mid_response(sock, req, fu):
    """Half the announced body, then close_notify and the close."""
    body = sse_body(40)
    sock.sendall(sse_head(len(body)) + body[:len(body) // 2])
    time.sleep(0.05)
    close_notify(sock)
    return False


def notify_ends_stream(sock, req, fu):
    """A close-delimited stream, ended by close_notify and the close."""
    sock.sendall(sse_head(close=True) + sse_body(20))
    time.sleep(0.05)
    close_notify(sock)
    return False


def close_notify(sock):
    # unwrap() sends close_notify, then waits for the peer's, which
    # tokentap does not send: a short wait, then the TCP close
    sock.settimeout(0.3)
    try:
        sock.unwrap()
    except (OSError, ValueError):
        pass


def reused(sock, req, fu):
    """A small answer that closes its connection, noting whether this
    connection's handshake resumed a session."""
    fu.reused.append(sock.session_reused)
    body = sse_body(3)
    sock.sendall(sse_head(len(body), close=True) + body)
    return False


def class_pki(cls, prefix):
    """The test PKI in a fresh directory removed after the class: cls.dir,
    cls.cert and cls.key (the server's), cls.ca (the CA's certificate)."""
    cls.dir = tempfile.mkdtemp(prefix=prefix)
    cls.addClassCleanup(shutil.rmtree, cls.dir, True)
    cls.cert, cls.key = make_pki(cls.dir)
    cls.ca = os.path.join(cls.dir, "ca.pem")


class TlsUpstreamTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        class_pki(cls, "tokentap-tlsup-")

    def server_ctx(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def tokentap(self, port, *args):
        """tokentap with one https upstream at `port` (certificate checked)."""
        return rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                             "    tls: {ca_file: %s}\n" % (port, self.ca), *rh.ONE_WORKER, *args)

    def tls_close_line(self, tt):
        """The first upstream connection's TLS read counts, logged at its
        close (--log-level debug): bytes, records, reads, partial."""
        rx = re.compile(r"u1 closed; TLS: (\d+) bytes in (\d+) records, (\d+) reads, (\d+) partial")
        self.assertTrue(harness.wait_until(lambda: tt.count_lines(rx) > 0, PROMPT_S, 0.02), tt.stderr_text())
        return [rx.search(x) for x in tt.lines if rx.search(x)][0]

    def front(self, handler, *args):
        fu = harness.start_fake_upstream(self, handler, tls=self.server_ctx())
        fu.reused = []
        return fu, self.tokentap(fu.port, *args)

    def post(self, tt):
        conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
        conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
        return conn

    def post_whole(self, tt):
        """One streamed chat through `tt`, its response read whole."""
        conn = self.post(tt)
        try:
            return conn.read_response("POST")
        finally:
            conn.close()

    def test_records_of_every_size_arrive_byte_exact(self):
        fu, tt = self.front(every_size)
        for _ in range(2):  # the second on the pooled connection
            resp = self.post_whole(tt)
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.body, sse_body(600))
        entries = tt.wait_log_count(2)
        self.assertEqual([e["token_events"] for e in entries], [600, 600])
        self.assertEqual(fu.accepted, 1)

    def test_a_burst_of_records_is_read_whole_and_in_few_reads(self):
        fu, tt = self.front(burst, "--log-level", "debug")
        resp = self.post_whole(tt)
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.body, sse_body(2000))
        self.assertGreater(fu.records, 1500)
        self.assertEqual(tt.wait_log_count(1)[0]["token_events"], 2000)
        # the connection's read counts, logged when it closes
        fu.stop()
        m = self.tls_close_line(tt)
        nbytes, records, reads, _ = (int(g) for g in m.groups())
        self.assertGreaterEqual(nbytes, len(sse_body(2000)))
        self.assertGreaterEqual(records, fu.records)
        # 130 KiB in 64 KiB reads: 3 at least; a read per record would be
        # 1,800. Loopback segments and a loaded machine may split more.
        self.assertLess(reads, 60, m.group(0))

    def test_close_notify_mid_response_cuts_it(self):
        fu, tt = self.front(notify_mid_response)
        conn = self.post(tt)
        try:
            resp = conn.read_response("POST")
            closed = conn.wait_closed(PROMPT_S)
        finally:
            conn.close()
        self.assertEqual(resp.status, 200)
        self.assertTrue(closed or getattr(resp, "closed", False))
        self.assertEqual(resp.body, sse_body(40)[:len(sse_body(40)) // 2])
        entry = tt.wait_log_count(1)[0]
        self.assertEqual(entry["error"], "upstream_reset", entry)

    def test_close_notify_ends_a_close_delimited_stream(self):
        fu, tt = self.front(notify_ends_stream)
        resp = self.post_whole(tt)
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.body, sse_body(20))
        entry = tt.wait_log_count(1)[0]
        self.assertIsNone(entry.get("error"), entry)
        self.assertEqual(entry["token_events"], 20)

    def test_next_connection_resumes_the_session(self):
        fu, tt = self.front(reused)
        for _ in range(3):
            resp = self.post_whole(tt)
            self.assertEqual(resp.status, 200)
        self.assertEqual(fu.accepted, 3)
        self.assertEqual(fu.reused, [False, True, True])

    def test_reload_drops_the_session(self):
        """A reload gives the upstream a new TLS context (its CA file may
        have changed): a session of the old one is not offered, and the
        next connection's handshake is a full one, checked again."""
        fu, tt = self.front(reused)
        conf = tt.body

        def one():
            conn = self.post(tt)
            try:
                self.assertEqual(conn.read_response("POST").status, 200)
            finally:
                conn.close()

        one()
        one()
        self.assertTrue(tt.reload(conf))
        one()
        one()
        self.assertEqual(fu.reused, [False, True, False, True])

    def test_each_event_arrives_with_its_records_last_byte(self):
        """Each event reaches the client when its record's last byte reaches
        tokentap, wherever the records fall in TCP segments: a record cut
        over two segments waits for the second only, and records read ahead
        with another (two in one segment, or one whole beside the start of
        the next) are not left in OpenSSL's buffer until the upstream's next
        write."""
        srv = RecordServer(self.server_ctx(), cut_records)
        self.addCleanup(srv.stop)
        tt = self.tokentap(srv.port, "--log-level", "debug")
        conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 5)
        try:
            conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(srv.errors, [])
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.body, sse_body(6))
        # when each event's last byte reached the client
        arrived, got = [], 0
        ends = [m.end() for m in re.finditer(rb"\n\n", resp.body)]
        for ts, piece in resp.pieces:
            got += len(piece)
            while len(arrived) < len(ends) and ends[len(arrived)] <= got:
                arrived.append(ts)
        for i in range(7):
            late = arrived[i] - srv.marks["e%d" % i]
            self.assertGreaterEqual(late, -1_000_000, "event %d before its last byte was sent?" % i)
            self.assertLess(late, ON_TIME_NS, "event %d reached the client %.1f ms after its last byte left the "
                            "upstream (the next write came %.0f ms after)" % (i, late / 1e6, PAUSE_S * 1e3))
        # the two cut records were each waited for once (logged at the close)
        srv.stop()
        m = self.tls_close_line(tt)
        self.assertGreaterEqual(int(m.group(4)), 2, m.group(0))


class RecordServer:
    """A one-connection TLS server that decides where its records fall on
    the wire: ssl.SSLObject over memory BIOs, its bytes sent on the TCP
    socket by hand, so a record can be cut across two segments or two
    records share one. `script(srv)` writes the response with srv.record()
    (a record's bytes) and srv.send() (raw bytes, stamped). Bounded: every
    socket wait times out, the thread ends after one request."""

    def __init__(self, ctx, script):
        self.ctx, self.script = ctx, script
        self.lsock = socket.create_server((harness.LOOPBACK, 0))
        self.lsock.settimeout(PROMPT_S)
        self.port = self.lsock.getsockname()[1]
        self.marks = {}
        self.errors = []
        self.raw = None
        self.thread = threading.Thread(target=self._run, name="record-server", daemon=True)
        self.thread.start()

    def stop(self):
        for s in (self.raw, self.lsock):
            if s is not None:
                s.close()
        self.thread.join(PROMPT_S)

    def _flush(self):
        out = self.out.read()
        if out:
            self.raw.sendall(out)

    def _pull(self):
        self._flush()
        data = self.raw.recv(65536)
        if not data:
            raise EOFError("the client closed")
        self.inc.write(data)

    def record(self, data):
        """`data` as one TLS record, not yet sent."""
        self.obj.write(data)
        return self.out.read()

    def send(self, data, mark=None):
        if mark:
            self.marks[mark] = time.monotonic_ns()
        self.raw.sendall(data)

    def _run(self):
        try:
            self.raw, _ = self.lsock.accept()
            self.raw.settimeout(PROMPT_S)
            self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.obj = self.ctx.wrap_bio(self.inc, self.out, server_side=True)
            while True:
                try:
                    self.obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._pull()
            self._flush()  # the handshake's end, session tickets
            req = b""
            while not request_complete(req):
                try:
                    req += self.obj.read(65536)
                except ssl.SSLWantReadError:
                    self._pull()
            self.script(self)
            time.sleep(0.2)  # tokentap pools the connection; then the close
        except Exception as e:  # surfaced by the test through .errors
            self.errors.append(repr(e))


def request_complete(req):
    head, sep, body = req.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(body) >= (int(m.group(1)) if m else 0)


PAUSE_S = 0.4  # before the next write: an event that waited for it is that late
ON_TIME_NS = 150_000_000  # an event on time arrives well within this of its last byte


def cut_records(srv):
    """The event records of three kinds, each followed by a pause: (1) one
    record cut across two segments 60 ms apart; (2) two whole records in one
    segment; (3) a whole record and the start of the next in one segment,
    that record's rest 60 ms later. Every event's last byte is stamped."""
    body = sse_body(6)
    ev = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]  # 6 events and [DONE]
    srv.send(srv.record(sse_head(len(body))))
    srv.send(srv.record(ev[0]), "e0")
    time.sleep(PAUSE_S)
    r = srv.record(ev[1])
    srv.send(r[:12])
    time.sleep(0.06)
    srv.send(r[12:], "e1")
    time.sleep(PAUSE_S)
    srv.send(srv.record(ev[2]) + srv.record(ev[3]), "e3")
    srv.marks["e2"] = srv.marks["e3"]
    time.sleep(PAUSE_S)
    r4, r5 = srv.record(ev[4]), srv.record(ev[5])
    srv.send(r4 + r5[:12], "e4")
    time.sleep(0.06)
    srv.send(r5[12:], "e5")
    time.sleep(PAUSE_S)
    srv.send(srv.record(ev[6]), "e6")


def big_writes(sock, req, fu):
    """8 MiB of events in writes of 256 KiB (each write one upstream read
    of up to 64 KiB for tokentap, many events per read)."""
    body = sse_body(120000)
    sock.sendall(sse_head(len(body)))
    for i in range(0, len(body), 256 << 10):
        sock.sendall(body[i:i + (256 << 10)])
    return True


def paced(sock, req, fu):
    """Ten events 50 ms apart: each should reach the client on its own."""
    body = sse_body(10)
    sock.sendall(sse_head(len(body)))
    events = body.split(b"\n\n")[:-1]
    for e in events:
        sock.sendall(e + b"\n\n")
        time.sleep(0.05)
    return True


def head_and_events_then_paced(sock, req, fu):
    """The head and three events in one write (one upstream read, before
    the head is parsed), then three events 50 ms apart."""
    body = sse_body(6)
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    sock.sendall(sse_head(len(body)) + b"".join(events[:3]))
    for e in events[3:]:
        time.sleep(0.05)
        sock.sendall(e)
    return True


def whole_in_one_write(sock, req, fu):
    """Head and an 8 MiB body in one write: the first read (64 KiB, head
    included) goes the way a read before the head's end goes, and the
    rest is more than the sockets hold."""
    body = sse_body(120000)
    sock.sendall(sse_head(len(body)) + body)
    return True


class RecordClient:
    """A TLS client over a raw socket (ssl.MemoryBIO) that sees the server's
    records: read_records() decrypts one record at a time and keeps, for
    each that carries data, the bytes it carried."""

    def __init__(self, port, cafile, timeout=10.0):
        self.sock = socket.create_connection((harness.LOOPBACK, port), timeout=timeout)
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ssl.create_default_context(cafile=cafile).wrap_bio(self.inc, self.out,
                                                                      server_hostname="localhost")
        self.raw = b""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.out.read())
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("closed during the handshake")
                self.inc.write(data)
        self.sock.sendall(self.out.read())

    def send(self, data):
        self.tls.write(data)
        self.sock.sendall(self.out.read())

    def read_records(self, nbytes, deadline_s=PROMPT_S):
        """The data records until `nbytes` of plaintext have come."""
        got, records = 0, []
        deadline = time.monotonic() + deadline_s
        while got < nbytes and time.monotonic() < deadline:
            while len(self.raw) >= 5 and len(self.raw) >= 5 + int.from_bytes(self.raw[3:5], "big"):
                n = 5 + int.from_bytes(self.raw[3:5], "big")
                self.inc.write(self.raw[:n])
                self.raw = self.raw[n:]
                try:
                    data = self.tls.read(1 << 17)
                except ssl.SSLWantReadError:
                    continue  # a session ticket: no data
                records.append(data)
                got += len(data)
            if got < nbytes:
                chunk = self.sock.recv(1 << 17)
                if not chunk:
                    break
                self.raw += chunk
        return records

    def close(self):
        self.sock.close()


class TlsClientWriteTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        class_pki(cls, "tokentap-tlscl-")

    def front(self, handler, *args):
        fu = harness.start_fake_upstream(self, handler)
        tt = rh.start_conf(self, rh.upstreams_yaml({"up": fu.url}) + "tls:\n  cert: %s\n  key: %s\n"
                           % (self.cert, self.key), *rh.ONE_WORKER, *args)
        return fu, tt

    def tls_counts(self, tt):
        """The client connection's TLS write counts, logged at its close:
        bytes written in the upstream read's call, bytes queued."""
        rx = re.compile(r"TLS: (\d+) response bytes written in the upstream read's call, (\d+) queued")
        self.assertTrue(harness.wait_until(lambda: tt.count_lines(rx) > 0, PROMPT_S, 0.02), tt.stderr_text())
        m = [rx.search(x) for x in tt.lines if rx.search(x)][0]
        return int(m.group(1)), int(m.group(2))

    def test_each_upstream_read_is_one_record_written_at_once(self):
        """The head and the events of the first read leave in one record,
        each later event in its own; none waits in the output buffer for the
        next loop turn (the first read, before the head is parsed, did)."""
        fu, tt = self.front(head_and_events_then_paced, "--log-level", "debug")
        rc = RecordClient(tt.port, self.ca)
        try:
            rc.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
            body = sse_body(6)
            whole = len(sse_head(len(body))) + len(body)
            records = rc.read_records(whole)
        finally:
            rc.close()
        self.assertEqual(b"".join(records), sse_head(len(body)) + body)
        events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
        self.assertEqual(records[0], sse_head(len(body)) + b"".join(events[:3]), [len(r) for r in records])
        self.assertEqual(records[1:], events[3:], [len(r) for r in records])
        self.assertEqual(self.tls_counts(tt), (whole, 0))

    def test_first_read_to_a_stalled_tls_client_keeps_order(self):
        """A whole response in one upstream write to a client that is not
        reading: the first read (head and 64 KiB) is written in the read's
        call, later ones until the socket fills, the unfinished record goes
        on from the output buffer, the rest queues behind it, and every
        byte arrives in order."""
        fu, tt = self.front(whole_in_one_write, "--log-level", "debug")
        conn = tls_conn(tt.port, self.ca, timeout=30)
        try:
            conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
            time.sleep(1.5)  # not reading
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.body == sse_body(120000), "the stream differs from what the upstream sent")
        self.assertEqual(tt.wait_log_count(1)[0]["token_events"], 120000)
        now, queued = self.tls_counts(tt)
        self.assertEqual(now + queued, len(sse_head(len(sse_body(120000)))) + len(sse_body(120000)))
        self.assertGreater(now, 0)
        self.assertGreater(queued, 0)  # the socket filled: the slow path was taken

    def test_stalled_tls_client_gets_every_byte_in_order(self):
        fu, tt = self.front(big_writes)
        conn = tls_conn(tt.port, self.ca, timeout=30)
        try:
            conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
            time.sleep(1.5)  # not reading: the socket fills, the rest waits in tokentap
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(resp.status, 200)
        self.assertEqual(len(resp.body), len(sse_body(120000)))
        self.assertTrue(resp.body == sse_body(120000), "the stream differs from what the upstream sent")
        self.assertEqual(tt.wait_log_count(1)[0]["token_events"], 120000)

    def test_paced_events_arrive_one_by_one(self):
        fu, tt = self.front(paced)
        conn = tls_conn(tt.port, self.ca)
        try:
            conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), None, tt.port))
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(resp.body, sse_body(10))
        # each piece the client read is whole events; at 50 ms apart, most
        # arrive alone (a loaded machine may join a few)
        pieces = [p for _, p in resp.pieces]
        self.assertGreaterEqual(len(pieces), 8, [len(p) for p in pieces])
