"""Responses that end, over real sockets: 204, 304 and 1xx responses have
no body whatever their framing headers say, so the next request on the
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
