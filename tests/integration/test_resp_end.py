"""Responses that end, over real sockets: an answer delimited by the
upstream's close ends for the client too (its connection closes after it,
HTTP/1.0 keep-alive clients included); 204, 304 and 1xx responses have no
body whatever their framing headers say, so the next request on the
connection and the upstream's admission slot are not held."""

import socket
import time

import harness
import routing_helpers as rh

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
    connection does not persist), the client's connection closes after it
    (issue #14, item 1)."""

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
    """1xx, 204 and 304 responses end at their head (issue #14, item 2)."""

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
