"""The upstream connection pool: a pooled connection that the server closes
just as tokentap reuses it (a keep-alive timeout racing the next request:
uvicorn, which serves vLLM, closes idle connections after 5 s) is retried
once on a fresh connection when that is safe — the request was small enough
to keep whole and no response byte had come back — and not otherwise."""

import socket
import threading
import time
import unittest

import harness
import routing_helpers as rh


class ClosingOnReuse:
    """A fake upstream: on each connection it answers the first request and
    closes the connection, without a byte of answer, when a second request
    arrives on it."""

    def __init__(self, test):
        self.sock = socket.socket()
        self.sock.bind((harness.LOOPBACK, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = "http://%s:%d" % (harness.LOOPBACK, self.port)
        self.connections = 0
        self.requests = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        test.addCleanup(self.close)

    def read_request(self, c, buf):
        for _ in range(10000):
            if b"\r\n\r\n" in buf:
                head, rest = buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        n = int(v)
                while len(rest) < n:
                    d = c.recv(65536)
                    if not d:
                        return None, b""
                    rest += d
                return head, rest[n:]
            d = c.recv(65536)
            if not d:
                return None, b""
            buf += d
        return None, b""

    def answer_first(self, c):
        """Reads the connection's first request and answers it: what came
        after it, or None when the client went away before it was whole."""
        head, buf = self.read_request(c, b"")
        if head is None:
            return None
        with self.lock:
            self.requests += 1
        body = b'{"ok":true}'
        c.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                  % (len(body), body))
        return buf

    def serve(self, c):
        with c:
            c.settimeout(10)
            buf = self.answer_first(c)
            if buf is not None:
                self.then(c, buf)

    def then(self, c, buf):
        """After the first answer (buf: what came after that request): the
        next request is read and counted, and the connection closed unanswered."""
        head, buf = self.read_request(c, buf)
        if head is None:
            return
        with self.lock:
            self.requests += 1
        # the race: the server had decided this connection was idle

    def run(self):
        self.sock.settimeout(0.1)
        for _ in range(1200):
            if self.stop.is_set():
                return
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            with self.lock:
                self.connections += 1
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


class PoolRetryTest(harness.TestCase):
    def setUp(self):
        self.up = ClosingOnReuse(self)
        # one worker: the test is about one pool (each worker has its own)
        self.tt = harness.start_tokentap(self, self.up.url, "--access-log", "-", "--workers", "1")

    def test_closed_on_reuse_is_retried_once(self):
        for i in range(3):
            resp = rh.send(self.tt.port, rh.chat())
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body))
            self.assertEqual(resp.body, b'{"ok":true}')
        # each reuse met a closing connection, and went again on a new one
        self.assertEqual(self.up.connections, 3)
        self.assertEqual(self.up.requests, 5)

    def test_large_request_is_not_replayed(self):
        self.assertEqual(rh.send(self.tt.port, rh.chat()).status, 200)
        # more than tokentap keeps for a replay: the failure is reported
        resp = rh.send(self.tt.port, rh.chat(prompt="x" * (100 << 10)))
        self.assertEqual(resp.status, 502)
        self.assertEqual(resp.json()["error"]["type"], "upstream_reset")
        self.assertEqual(self.up.connections, 1)


class ResetWhileGeneratingTest(harness.TestCase):
    """A pooled connection that fails after the server has had the request
    for a while is not the idle-close race: the server read the request and
    was working on it (a long generation, then a crash or a reset). A POST
    is not idempotent: it is not sent again, the client gets the 502. An
    idempotent method (RFC 9110 section 9.2.2) may be, once."""

    GENERATING_S = 0.3

    def setUp(self):
        def handler(sock, req, ctx):
            if req.header("x-behave") == "crash":
                time.sleep(self.GENERATING_S)  # "generating"
                harness.reset_socket(sock)
                return False
            body = b'{"ok":true}'
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            return True

        self.up = harness.start_fake_upstream(self, handler)
        self.log = harness.temp_path(self)
        self.tt = harness.start_tokentap(self, self.up.url, "--access-log", self.log, "--workers", "1",
                                         "--admin", "127.0.0.1:0")

    def crash_requests(self):
        with self.up.lock:
            return [r for r in self.up.requests if r.header("x-behave") == "crash"]

    def warm_pool(self):
        resp = rh.send(self.tt.port, rh.chat(), [("x-behave", "ok")])
        self.assertEqual(resp.status, 200, resp.body[:300])
        admin = harness.admin_port(self.tt)
        self.assertTrue(harness.wait_until(lambda: harness.pooled_connections(admin) == 1, 2.0),
                        "the first connection was not pooled")

    def test_post_reset_while_generating_is_not_replayed(self):
        self.warm_pool()
        t0 = time.monotonic()
        resp = rh.send(self.tt.port, rh.chat(), [("x-behave", "crash"), ("x-request-id", "gen-1")])
        elapsed = time.monotonic() - t0
        self.assertProxyError(resp, 502)
        self.assertEqual(resp.json()["error"]["type"], "upstream_reset")
        self.assertIn("not sent again", resp.json()["error"]["message"])
        self.assertGreaterEqual(elapsed, self.GENERATING_S - 0.02)
        # give a replay, had there been one, the time to reach the upstream
        time.sleep(self.GENERATING_S / 2)
        self.assertEqual(len(self.crash_requests()), 1, "the POST ran twice on the upstream")
        self.assertEqual(self.up.accepted, 1, "a second connection was opened for a replay")
        e = harness.wait_log_entry(self.log, lambda e: e.get("id") == "gen-1")
        self.assertEqual((e["status"], e["error"]), (502, "upstream_reset"))
        self.assertNotIn("sending again", self.tt.stderr_text())

    def test_idempotent_reset_while_generating_is_replayed_once(self):
        self.warm_pool()
        resp = rh.send(self.tt.port, None, [("x-behave", "crash")], method="GET", path="/v1/models")
        self.assertProxyError(resp, 502)
        self.assertEqual(resp.json()["error"]["type"], "upstream_reset")
        self.assertEqual([r.method for r in self.crash_requests()], ["GET", "GET"])
        self.assertEqual(self.up.accepted, 2)


class PastTheEndTest(harness.TestCase):
    """An upstream that sends bytes after a response has ended has lost track
    of the exchange: its connection is closed, never pooled, so whatever it
    sent there cannot be read as the next request's answer. The head goes
    out alone first, so the body and the stray bytes arrive in a later read
    (the path that reads a streamed body straight from the socket)."""

    EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'

    STALE = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstale"

    def stray_then_ok(self, send_stray):
        """A streamed answer with stray bytes after it (`send_stray` writes
        it), then a plain request: it must reach a new connection."""
        def handler(sock, req, ctx):
            if req.header("x-behave") == "stray":
                send_stray(sock)
            else:
                body = b'{"ok":true}'
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
            return True

        fu = harness.start_fake_upstream(self, handler)
        tt = harness.start_tokentap(self, fu.url, "--workers", "1")
        resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", rh.chat(stream=True),
                                   [("x-behave", "stray")])
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self.assertEqual(resp.body, self.EVENT)
        resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", rh.chat(), [("x-behave", "ok")])
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.body, b'{"ok":true}')
        self.assertEqual(fu.accepted, 2, "the connection that sent stray bytes was used again")
        self.assertEqual(fu.errors, [])

    def test_stray_bytes_after_a_streamed_body(self):
        def send(sock):
            harness.send_sse_head(sock)
            time.sleep(0.05)
            sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.EVENT), self.EVENT) + self.STALE)

        self.stray_then_ok(send)

    def test_stray_bytes_in_the_read_that_carried_the_head(self):
        """Head, body and stray bytes in one write: they are read into the
        connection's input buffer (the head is not parsed yet), the path that
        finds the stray bytes left in that buffer after the response."""
        def send(sock):
            head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n")
            sock.sendall(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(self.EVENT), self.EVENT) + self.STALE)

        self.stray_then_ok(send)


if __name__ == "__main__":
    unittest.main()
