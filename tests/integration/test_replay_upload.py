"""The idle-close race of test_pool.py met by a request whose body comes
after its head: the server closes the pooled connection as the request's
head reaches it, while the client is still sending the body. Nothing of the
request can have been acted on (the server closed on a head it never
answered, within the replay window), the request is small enough to keep
whole, so it can go again on a fresh connection once its body is in — as
the same request does when its body came with its head.

Found by tests/soak/soak_all.py: tokentap answered 502 upstream_reset,
since request_replay sent again only a request whose body was done."""

import json
import time
import unittest

import harness
import routing_helpers as rh
import test_pool


class ClosingOnHead(test_pool.ClosingOnReuse):
    """On each connection: answers the first request, then closes as soon as
    the next request's head has arrived, before reading its body."""

    def then(self, c, buf):
        for _ in range(1000):
            if b"\r\n\r\n" in buf:
                return  # closes: the server had decided this connection was idle
            d = c.recv(65536)
            if not d:
                return
            buf += d


class UploadReplayTest(harness.TestCase):
    def setUp(self):
        self.up = ClosingOnHead(self)
        # one worker: one pool, so the second request meets the pooled connection
        self.tt = harness.start_tokentap(self, self.up.url, "--workers", "1")
        self.assertEqual(rh.send(self.tt.port, rh.chat()).status, 200)

    def post(self, pause_s):
        body = json.dumps(rh.chat(), separators=(",", ":")).encode()
        head = harness.request_bytes("POST", rh.CHAT, None, [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        conn = harness.HttpConn(self.tt.port, timeout=10)
        try:
            conn.send(head + (b"" if pause_s else body))
            if pause_s:
                time.sleep(pause_s)  # the head alone reaches the pooled connection, which closes
                conn.send(body)
            return conn.read_response()
        finally:
            conn.close()

    def test_body_with_its_head_is_sent_again(self):
        resp = self.post(0)
        self.assertEqual(resp.status, 200, resp.body)
        self.assertEqual(self.up.connections, 2)

    def test_body_after_its_head_is_sent_again(self):
        resp = self.post(0.3)
        self.assertEqual(resp.status, 200, resp.body)
        self.assertEqual(self.up.connections, 2)


if __name__ == "__main__":
    unittest.main()
