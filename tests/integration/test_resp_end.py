"""Responses that end, over real sockets: an answer delimited by the
upstream's close ends for the client too (its connection closes after it,
HTTP/1.0 keep-alive clients included); 204, 304 and 1xx responses have no
body whatever their framing headers say, so the next request on the
connection and the upstream's admission slot are not held; and a TLS
upstream that closes without close_notify right after a whole response
(the bytes and the FIN in one segment) has every byte delivered, the close
counted as a truncation only when the response is incomplete."""

import os
import shutil
import socket
import ssl
import tempfile
import time

import harness
import routing_helpers as rh
from test_tls import make_pki

# A bounded wait for what must happen at once (the end of a response, the
# next answer): far below every timeout tokentap would otherwise fall back to.
PROMPT_S = 2.0


def json_body(n=1):
    return b'{"id":"x","object":"chat.completion","choices":[{"message":{"content":"%s"}}]}' % (b"a" * n)


SSE_EVENTS = [b'data: {"choices":[{"delta":{"content":"tok%d"}}]}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]


def close_delimited_json(sock, req, fu):
    body = json_body(300)
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + body)
    return False


def close_delimited_sse(sock, req, fu):
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    for ev in SSE_EVENTS:
        time.sleep(0.01)
        sock.sendall(ev)
    return False


def http10(raw):
    return raw.replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1)


class CloseDelimitedTest(harness.TestCase):
    """Whenever the response needed the upstream's EOF to end (or says the
    connection does not persist), the client's connection closes after it:
    the client can tell where such a response ends only by the close, so a
    connection kept open would leave it waiting."""

    def start(self, handler):
        fu = harness.start_fake_upstream(self, handler)
        return fu, rh.start_conf(self, rh.upstreams_yaml({"u": fu.url}))

    def assert_ends_with_close(self, conn, tt, want_body, method="POST"):
        t0 = time.monotonic()
        resp = conn.read_head()
        self.assertIsNotNone(resp, "no response")
        self.assertEqual(resp.status, 200)
        got = b""
        for _ in range(10000):
            if len(got) >= len(want_body) or (conn._avail() == 0 and not conn._fill()):
                break
            got += conn._take(min(conn._avail(), len(want_body) - len(got)))
        self.assertEqual(got, want_body, "every byte of the answer")
        self.assertTrue(conn.wait_closed(PROMPT_S), "client connection still open %.1f s after the answer's end"
                        % (time.monotonic() - t0))
        self.assertEqual(conn.extra, b"", "nothing after the answer")
        (entry,) = tt.wait_log_count(1)
        self.assertEqual((entry["status"], entry["error"]), (200, None), entry)

    def test_close_delimited_answer_closes_a_keep_alive_client(self):
        for name, handler, body in (("json", close_delimited_json, json_body(300)),
                                    ("sse", close_delimited_sse, b"".join(SSE_EVENTS))):
            with self.subTest(answer=name):
                fu, tt = self.start(handler)
                conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
                try:
                    conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=name == "sse"), port=tt.port))
                    self.assert_ends_with_close(conn, tt, body)
                    # a second request on it is not served
                    conn.try_send(harness.request_bytes("POST", rh.CHAT, rh.chat(), port=tt.port))
                    self.assertEqual(len(fu.requests), 1, "the second request reached the upstream")
                finally:
                    conn.close()
                self.assertEqual(len(fu.requests), 1)

    def test_http10_keep_alive_client_gets_the_close(self):
        """tokentap forwards an HTTP/1.0 request with `connection: close`;
        the simulator's streamed answer then says so too, and a client that
        asked for keep-alive (ab -k) waits for the close."""
        sim = harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "1")
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url}))
        conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
        try:
            raw = http10(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True), [("Connection", "keep-alive")],
                                               tt.port))
            conn.send(raw)
            resp = conn.read_response("POST")
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete, "the whole stream")
            self.assertIn(b"data: [DONE]", resp.body)
            t0 = time.monotonic()
            self.assertTrue(conn.wait_closed(PROMPT_S), "HTTP/1.0 client's connection still open %.1f s after the "
                            "answer" % (time.monotonic() - t0))
        finally:
            conn.close()
        (entry,) = tt.wait_log_count(1)
        self.assertEqual((entry["status"], entry["error"]), (200, None), entry)
        self.assertEqual(sim.stats()["requests"], 1)

    def test_keep_alive_answer_keeps_the_client(self):
        """The other side of the rule: a length-delimited answer that does
        not ask for the close leaves an HTTP/1.1 client's connection open."""
        def sized(sock, req, fu):
            body = json_body(10)
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            return True

        fu, tt = self.start(sized)
        conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
        try:
            for _ in range(2):
                conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(), port=tt.port))
                resp = conn.read_response("POST")
                self.assertEqual((resp.status, resp.body), (200, json_body(10)))
        finally:
            conn.close()
        self.assertEqual(len(fu.requests), 2)


def no_body_answers(sock, req, fu):
    """/304: a 304 with a Content-Length; /204: a 204 that says chunked;
    /103: an early hint with a Content-Length, then a 200."""
    if req.path == "/304":
        sock.sendall(b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 123\r\n\r\n")
    elif req.path == "/204":
        sock.sendall(b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n")
    elif req.path == "/103":
        sock.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nContent-Length: 7\r\n\r\n"
                     b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    else:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    return True


class NoBodyTest(harness.TestCase):
    """1xx, 204 and 304 responses end at their head, whatever length they
    claim: RFC 9112 gives them no body, and waiting for one stalls the client."""

    def setUp(self):
        self.fu = harness.start_fake_upstream(self, no_body_answers)
        self.tt = rh.start_conf(self, rh.upstreams_yaml({"u": self.fu.url}, {"u": ["max_concurrency: 1",
                                                                                    "queue: {timeout: 30s}"]}),
                                *rh.ONE_WORKER)

    def test_no_body_statuses_end_at_the_head(self):
        for path, status in (("/304", 304), ("/204", 204), ("/103", 200)):
            with self.subTest(path=path):
                n0 = len(self.fu.requests)
                conn = harness.HttpConn(self.tt.port, timeout=PROMPT_S + 3)
                try:
                    t0 = time.monotonic()
                    conn.send(harness.request_bytes("GET", path, port=self.tt.port))
                    resp = conn.read_response("GET")
                    self.assertEqual(resp.status, status)
                    # the next request on the same connection is answered at once
                    conn.send(harness.request_bytes("GET", "/next", port=self.tt.port))
                    conn.settimeout(PROMPT_S)
                    try:
                        nxt = conn.read_response("GET")
                    except socket.timeout:
                        nxt = None
                    took = time.monotonic() - t0
                    self.assertIsNotNone(nxt, "no answer to the next request within %.1f s" % PROMPT_S)
                    self.assertEqual((nxt.status, nxt.body), (200, b"{}"))
                    self.assertLess(took, PROMPT_S)
                finally:
                    conn.close()
                self.assertEqual([r.path for r in self.fu.requests[n0:]], [path, "/next"])

    def test_no_body_answer_frees_the_slot(self):
        """With max_concurrency 1, a request on another connection is served
        at once after a 304 whose client keeps its connection open."""
        for path in ("/304", "/204"):
            with self.subTest(path=path):
                held = harness.HttpConn(self.tt.port, timeout=PROMPT_S + 3)
                try:
                    held.send(harness.request_bytes("GET", path, port=self.tt.port))
                    self.assertEqual(held.read_response("GET").status, int(path[1:]))
                    t0 = time.monotonic()
                    resp = rh.send(self.tt.port, method="GET", path="/other", timeout=PROMPT_S)
                    took = time.monotonic() - t0
                    self.assertEqual(resp.status, 200)
                    self.assertLess(took, PROMPT_S)
                finally:
                    held.close()
        entries = self.tt.wait_log_count(4)
        self.assertEqual(sorted((e["status"], e["error"]) for e in entries),
                         [(200, None), (200, None), (204, None), (304, None)])


# ---- a TLS upstream's close without close_notify ----


def tls_end(sock, data, split=None):
    """Writes `data` through TLS and closes the TCP connection without a
    close_notify, the bytes and the FIN in one segment: TCP_CORK holds the
    encrypted records until the shutdown sends them with the FIN. `sock` is
    the handler's ssl.SSLSocket; its shutdown() skips the TLS one. With
    `split`, the first `split` bytes go ahead on their own (one record, read
    alone)."""
    if split:
        sock.sendall(data[:split])
        data = data[split:]
        time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_RDWR)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def split(req):
    n = int(req.header("x-split", "0"))
    return n or None


def pad(req):
    """A header that makes the head longer than one TLS record (16 KiB) when
    the request asks for it: the head's first record then waits in
    tokentap's input buffer while the rest arrives with the close."""
    n = int(req.header("x-pad", "0"))
    return b"X-Pad: %s\r\n" % (b"p" * n) if n else b""


def tls_sized(sock, req, fu):
    body = json_body(100)
    tls_end(sock, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
            % (pad(req), len(body), body), split(req))
    return False


def tls_sized_reset(sock, req, fu):
    """The same answer, then a reset instead of a FIN (SO_LINGER 0; not
    corked: a reset discards what was not sent)."""
    body = json_body(100)
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                 % (pad(req), len(body), body))
    harness.reset_socket(sock)
    return False


def tls_sized_short(sock, req, fu):
    body = json_body(100)
    tls_end(sock, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body) + 10, body))
    return False


def tls_chunked_sse(sock, req, fu):
    sock.sendall(SSE_HEAD + chunk(SSE_EVENTS[0]))
    time.sleep(0.05)
    tls_end(sock, b"".join(chunk(e) for e in SSE_EVENTS[1:]) + b"0\r\n\r\n")
    return False


def tls_whole_chunked_sse(sock, req, fu):
    tls_end(sock, SSE_HEAD[:-2] + pad(req) + b"\r\n" + b"".join(chunk(e) for e in SSE_EVENTS) + b"0\r\n\r\n",
            split(req))
    return False


def tls_chunked_sse_cut(sock, req, fu):
    sock.sendall(SSE_HEAD + chunk(SSE_EVENTS[0]))
    time.sleep(0.05)
    tls_end(sock, b"".join(chunk(e) for e in SSE_EVENTS[1:]))  # no last chunk
    return False


def tls_close_delimited(sock, req, fu):
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + SSE_EVENTS[0])
    time.sleep(0.05)
    tls_end(sock, b"".join(SSE_EVENTS[1:]))
    return False


def tls_whole_close_delimited(sock, req, fu):
    tls_end(sock, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s\r\n%s" % (pad(req), b"".join(SSE_EVENTS)),
            split(req))
    return False


class TlsDirtyCloseTest(harness.TestCase):
    """A TLS upstream closes right after the response, without close_notify,
    as many servers do: a response that was whole is still delivered whole."""

    # (padding, split) per round: the head padded by an X-Pad header of
    # `padding` bytes (the answers that take it); with `split`, that many
    # first bytes go ahead alone. libevent's OpenSSL bufferevent reads into
    # an 8 KiB piece of the input buffer (4 KiB asked for) and the head
    # waits there until it is whole; when the rest, smaller than what the
    # piece has left but that is under 4 KiB, comes with the close, libevent
    # reads it into that piece and meets the close reading into a second
    # one, and reports the close before it commits the first: the 6000,
    # 4500 and 7200 splits. The others are the plain shapes.
    SHAPES = ((0, 0), (20000, 0), (6300, 6000), (4700, 4500), (7300, 7200), (20000, 16384))

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-respend-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")

    def front(self, handler):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        fu = harness.start_fake_upstream(self, handler, tls=ctx)
        tt = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                           "    tls: {ca_file: %s}\n" % (fu.port, self.ca), *rh.ONE_WORKER)
        return fu, tt

    def rounds(self, handler, stream, check, closes=True):
        """A request per shape, each on its connection; `check(resp, closed,
        log entry, round)`. `closes`: whether to wait for tokentap to close
        the client's connection (`closed` is None otherwise)."""
        fu, tt = self.front(handler)
        for i, (n, cut) in enumerate(self.SHAPES):
            conn = harness.HttpConn(tt.port, timeout=PROMPT_S + 3)
            try:
                hdrs = [("X-Pad", str(n)), ("X-Split", str(cut))]
                conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=stream), hdrs, tt.port))
                resp = conn.read_response("POST")
                closed = conn.wait_closed(PROMPT_S) if closes else None
            finally:
                conn.close()
            entries = tt.wait_log_count(i + 1)
            self.assertEqual(len(entries), i + 1)
            check(resp, closed, entries[i], i)
        self.assertEqual(fu.errors, [])

    def test_whole_sized_answer_then_dirty_close(self):
        def check(resp, closed, entry, i):
            self.assertEqual(resp.status, 200, "round %d: %r" % (i, resp.body[:200]))
            self.assertEqual(resp.body, json_body(100))
            self.assertIsNone(entry["error"], entry)

        for handler in (tls_sized, tls_sized_reset):
            with self.subTest(handler=handler.__name__):
                self.rounds(handler, False, check, closes=False)

    def test_short_sized_answer_then_dirty_close_is_a_truncation(self):
        def check(resp, closed, entry, i):
            self.assertEqual(resp.status, 200)
            self.assertFalse(resp.complete, "the client sees the answer cut short")
            self.assertEqual(resp.body, json_body(100), "every byte that arrived")
            self.assertTrue(closed)
            self.assertEqual(entry["error"], "upstream_reset", entry)

        self.rounds(tls_sized_short, False, check)

    def test_whole_sse_stream_then_dirty_close(self):
        def check(resp, closed, entry, i):
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete, "round %d: stream cut: %r" % (i, resp.body[-200:]))
            self.assertEqual(resp.body, b"".join(SSE_EVENTS))
            self.assertIsNone(entry["error"], entry)
            self.assertEqual(entry["events"], len(SSE_EVENTS), entry)

        for handler in (tls_chunked_sse, tls_whole_chunked_sse):
            with self.subTest(handler=handler.__name__):
                self.rounds(handler, True, check, closes=False)

    def test_cut_sse_stream_then_dirty_close_is_a_truncation(self):
        def check(resp, closed, entry, i):
            self.assertEqual(resp.status, 200)
            self.assertFalse(resp.complete)
            self.assertEqual(resp.body, b"".join(SSE_EVENTS), "every event that arrived")
            self.assertTrue(closed)
            self.assertEqual(entry["error"], "upstream_reset", entry)

        self.rounds(tls_chunked_sse_cut, True, check)

    def test_close_delimited_answer_ends_at_dirty_close(self):
        """The usual proxy practice: a close-delimited answer's end by a TCP
        close without close_notify is its end, not a truncation."""
        for handler in (tls_close_delimited, tls_whole_close_delimited):
            with self.subTest(handler=handler.__name__):
                def check(resp, closed, entry, i):
                    self.assertEqual(resp.status, 200)
                    self.assertTrue(resp.complete)
                    self.assertEqual(resp.body, b"".join(SSE_EVENTS), "round %d" % i)
                    self.assertTrue(closed)
                    self.assertIsNone(entry["error"], entry)
                    self.assertEqual(entry["events"], len(SSE_EVENTS), entry)

                self.rounds(handler, True, check)
