"""The request to an https upstream, written with SSL_write in the call
that has its bytes (the way a plain upstream's is written with write()),
over real sockets, against Python's ssl as the server, which sees each TLS
record the request came in: a small request arrives whole in one record on
a fresh connection (the handshake just done) and on a pooled one, request
after request; a 100 KiB body arrives whole in records of at most 16 KiB;
a 16 MiB body to an upstream that reads nothing for a while (the socket
fills mid-record: that record goes on from the bufferevent's output, the
rest queues behind it) arrives whole and in order; and a chunked body whose
pieces come apart arrives as sent. The connection's close line (debug
level) counts the request bytes written in the call and those left to the
bufferevent: every byte of a request in the call, unless the socket was
full."""

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
from harness_upstream import read_request
from test_tls import make_pki

PROMPT_S = 5.0
RECORD_MAX = 16384

ANSWER = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",' \
    b'"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'


class RecordConn:
    """One upstream connection's plaintext as a socket-like recv(), one TLS
    record at a time: the records are cut from the raw bytes by their
    headers and fed to ssl.SSLObject one by one, so each data record's
    size is known (handshake records and session tickets carry none)."""

    def __init__(self, raw, ctx, srv):
        self.raw, self.srv = raw, srv
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.inc, self.out, server_side=True)
        self.pending = b""
        self.records = []  # plaintext bytes per data record, in order
        self.plain = b""
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._record()
        self._flush()

    def _flush(self):
        out = self.out.read()
        if out:
            self.raw.sendall(out)

    def _record(self):
        """Feeds the next whole record to OpenSSL."""
        self._flush()
        for _ in range(100000):
            if len(self.pending) >= 5 and len(self.pending) >= 5 + int.from_bytes(self.pending[3:5], "big"):
                break
            data = self.raw.recv(1 << 16)
            if not data:
                raise EOFError("the client closed")
            self.pending += data
        n = 5 + int.from_bytes(self.pending[3:5], "big")
        self.inc.write(self.pending[:n])
        self.pending = self.pending[n:]

    def recv(self, _n):
        for _ in range(100000):
            self._record()
            try:
                data = self.obj.read(1 << 17)
            except ssl.SSLWantReadError:
                continue
            if data:
                self.records.append(len(data))
                self.plain += data
                return data
            return b""
        return b""

    def sendall(self, data):
        self.obj.write(data)
        self._flush()


class SendServer:
    """An https upstream that answers each request with a small JSON
    completion on a kept connection, noting per request the plaintext
    bytes it came in and the records they filled. `stall_s`: how long it
    reads nothing after the handshake (a slow reader). Bounded: every
    socket wait times out; stop() closes and joins."""

    def __init__(self, ctx, stall_s=0.0):
        self.ctx, self.stall_s = ctx, stall_s
        self.lsock = socket.create_server((harness.LOOPBACK, 0))
        self.lsock.settimeout(0.05)
        self.port = self.lsock.getsockname()[1]
        self.accepted = 0
        self.requests = []  # (Request, its plaintext bytes, records it filled)
        self.errors = []
        self.stop_event = threading.Event()
        self.conns = []
        self.threads = []
        self.thread = threading.Thread(target=self._accept, name="send-server", daemon=True)
        self.thread.start()

    def _accept(self):
        deadline = time.monotonic() + 60
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            try:
                raw, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            raw.settimeout(30)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            self.conns.append(raw)
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, raw):
        try:
            conn = RecordConn(raw, self.ctx, self)
            if self.stall_s:
                time.sleep(self.stall_s)
            state = bytearray()
            for _ in range(100):
                n0, r0 = len(conn.plain) - len(state), len(conn.records)
                req = read_request(conn, state)
                if req is None:
                    break
                used = len(conn.plain) - len(state) - n0
                self.requests.append((req, used, conn.records[r0:]))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))
        except EOFError:
            pass
        except OSError:
            pass
        except Exception as e:  # surfaced by the tests through .errors
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.lsock.close()
        self.thread.join(2)
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(5)
        for s in self.conns:
            s.close()


def body_of(n):
    """A chat body of about `n` bytes, every byte position telling."""
    filler = "".join("%07d," % i for i in range(n // 8 + 1))[:n]
    return rh.chat(prompt=filler)


class TlsUpstreamSendTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-tlssend-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")

    def front(self, stall_s=0.0):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        srv = SendServer(ctx, stall_s)
        self.addCleanup(srv.stop)
        tt = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                           "    tls: {ca_file: %s}\n" % (srv.port, self.ca), *rh.ONE_WORKER, "--log-level", "debug")
        return srv, tt

    def exchange(self, tt, raw, timeout=PROMPT_S + 3):
        conn = harness.HttpConn(tt.port, timeout=timeout)
        try:
            conn.send(raw)
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertEqual(resp.body, ANSWER)

    def sent_counts(self, srv, tt):
        """The upstream connection's request bytes written in the call and
        left to the bufferevent, from its close line."""
        srv.stop()
        rx = re.compile(r"u1 closed; TLS: .* request bytes: (\d+) written in the call, (\d+) queued")
        self.assertTrue(harness.wait_until(lambda: tt.count_lines(rx) > 0, PROMPT_S, 0.02), tt.stderr_text()[-3000:])
        m = [rx.search(x) for x in tt.lines if rx.search(x)][0]
        return int(m.group(1)), int(m.group(2))

    def test_small_requests_leave_whole_in_one_record_each(self):
        """On the fresh connection (its handshake just done) and then pooled,
        request after request: each request one record, all written in the
        call that had it."""
        srv, tt = self.front()
        bodies = [body_of(200 + 37 * i) for i in range(4)]
        for b in bodies:
            self.exchange(tt, harness.request_bytes("POST", rh.CHAT, b, None, tt.port))
        self.assertEqual(srv.errors, [])
        self.assertEqual(srv.accepted, 1)
        self.assertEqual([r.body for r, _, _ in srv.requests], [harness.request_bytes("POST", "/", b).split(
            b"\r\n\r\n", 1)[1] for b in bodies])
        self.assertEqual([len(recs) for _, _, recs in srv.requests], [1] * 4, [recs for _, _, recs in srv.requests])
        total = sum(n for _, n, _ in srv.requests)
        self.assertEqual(self.sent_counts(srv, tt), (total, 0))

    def test_a_body_larger_than_a_record_leaves_in_full_records(self):
        srv, tt = self.front()
        body = body_of(100 << 10)
        self.exchange(tt, harness.request_bytes("POST", rh.CHAT, body, None, tt.port))
        self.assertEqual(srv.errors, [])
        req, n, recs = srv.requests[0]
        self.assertEqual(req.body, harness.request_bytes("POST", "/", body).split(b"\r\n\r\n", 1)[1])
        self.assertLessEqual(max(recs), RECORD_MAX)
        now, queued = self.sent_counts(srv, tt)
        self.assertEqual(now + queued, n)
        self.assertGreater(now, 0)

    def test_a_slow_upstream_gets_a_huge_body_whole_and_in_order(self):
        """16 MiB to an upstream that reads nothing for a second: the socket
        fills mid-record, that record and the rest go on from the output
        buffer, and every byte arrives in order."""
        srv, tt = self.front(stall_s=1.0)
        body = body_of(16 << 20)
        self.exchange(tt, harness.request_bytes("POST", rh.CHAT, body, None, tt.port), timeout=60)
        self.assertEqual(srv.errors, [])
        req, n, recs = srv.requests[0]
        self.assertTrue(req.body == harness.request_bytes("POST", "/", body).split(b"\r\n\r\n", 1)[1],
                        "the body differs from what the client sent")
        self.assertLessEqual(max(recs), RECORD_MAX)
        now, queued = self.sent_counts(srv, tt)
        self.assertEqual(now + queued, n)
        self.assertGreater(now, 0)
        self.assertGreater(queued, 0)  # the socket filled: the bufferevent wrote the rest

    def test_a_chunked_body_in_pieces_arrives_as_sent(self):
        """A chunked body whose pieces reach tokentap 30 ms apart: each piece
        is written in the call that read it, and the upstream gets the
        chunks as the client sent them."""
        srv, tt = self.front()
        body = body_of(3000)
        raw = harness.request_bytes("POST", rh.CHAT, body, None, tt.port, chunked=[700, 900, 1, 1000, 4000])
        head, _, rest = raw.partition(b"\r\n\r\n")
        conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
        try:
            conn.send(head + b"\r\n\r\n")
            for i in range(0, len(rest), 611):
                time.sleep(0.03)
                conn.send(rest[i:i + 611])
            resp = conn.read_response("POST")
        finally:
            conn.close()
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertEqual(srv.errors, [])
        req, n, recs = srv.requests[0]
        self.assertEqual(req.header("transfer-encoding"), "chunked")
        self.assertEqual(req.body, harness.request_bytes("POST", "/", body).split(b"\r\n\r\n", 1)[1])
        self.assertGreater(len(recs), 1)  # the pieces were not held back to be joined
        self.assertEqual(self.sent_counts(srv, tt), (n, 0))


if __name__ == "__main__":
    import unittest

    unittest.main()
