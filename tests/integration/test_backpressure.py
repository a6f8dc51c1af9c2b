"""test_backpressure.py — a client that stops reading makes tokentap stop
reading the upstream: its memory stays bounded while the stream would be tens
of megabytes, and once the client reads again the stream completes intact."""

import hashlib
import os
import socket
import tempfile
import time
import unittest

import harness

TOKENS = 600000
PAUSE_S = 4.0
# Total growth while the client does not read: the stream is ~60 MiB, so an
# unbounded proxy would blow through this. Under AddressSanitizer freed memory
# sits in quarantine, so the RSS also counts the bytes that passed through
# before the socket buffers filled (a few MiB): hence the margin.
RSS_GROWTH_LIMIT_KIB = 32 * 1024
# Once the socket buffers are full, nothing more should be read: growth over
# the second part of the pause stays near zero. An unbounded proxy reading the
# simulator at full speed grows by tens of MiB a second.
SETTLE_S = 1.5
SETTLED_GROWTH_LIMIT_KIB = 4 * 1024


class BackpressureTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0")
        cls.tt = harness.start_tokentap(cls, cls.sim.url)

    def _request(self):
        return harness.request_bytes("POST", "/v1/chat/completions",
                                     harness.api_body("openai-chat", True, include_usage=True),
                                     harness.sim_headers(ttft=0, itl=0, tokens=TOKENS))

    def test_slow_reader_bounded_memory(self):
        # Reference: the same stream read directly from the simulator.
        direct_hash = hashlib.sha256()
        conn = harness.HttpConn(self.sim.port, timeout=30)
        conn.send(self._request())
        direct = conn.read_response(keep_body=False, hasher=direct_hash)
        conn.close()
        self.assertEqual(direct.status, 200)
        self.assertTrue(direct.complete)
        self.assertGreater(direct.length, 50 * 1024 * 1024,
                           "test premise: the stream should be tens of MB, got %d bytes" % direct.length)

        # Warm up tokentap so the baseline includes its steady-state buffers.
        for _ in range(3):
            r, _ = harness.exchange(self.tt.port, "POST", "/v1/chat/completions",
                                    harness.api_body("openai-chat", True), harness.sim_headers(ttft=0, itl=0, tokens=200))
            self.assertEqual(r.status, 200)
        base = self.tt.rss_kib()

        conn = harness.HttpConn(self.tt.port, timeout=30, rcvbuf=64 * 1024)
        self.addCleanup(conn.close)
        conn.send(self._request())
        conn.recv_size = 4096
        resp = conn.read_head()
        self.assertEqual(resp.status, 200)
        start = time.monotonic()
        peak = base
        settled = None
        for _ in range(1000):
            now = time.monotonic()
            if now - start >= PAUSE_S:
                break
            rss = self.tt.rss_kib()
            if settled is None and now - start >= SETTLE_S:
                settled = rss
            peak = max(peak, rss)
            time.sleep(0.05)
        growth = peak - base
        self.assertLess(growth, RSS_GROWTH_LIMIT_KIB,
                        "tokentap RSS grew by %d KiB while the client was not reading" % growth)
        self.assertIsNotNone(settled)
        late = peak - settled
        self.assertLess(late, SETTLED_GROWTH_LIMIT_KIB,
                        "tokentap RSS still grew by %d KiB %.1f s after the client stopped reading"
                        % (late, SETTLE_S))

        conn.recv_size = 1 << 20
        h = hashlib.sha256()
        conn.read_body(resp, keep_body=False, hasher=h)
        self.assertTrue(resp.complete, "stream did not complete after the client resumed reading")
        self.assertEqual(resp.length, direct.length)
        self.assertEqual(h.hexdigest(), direct_hash.hexdigest(), "stream differs from the direct one")


class IdleWhilePausedTest(harness.TestCase):
    """While tokentap has stopped reading the upstream for a slow client, the
    idle timeout (300 ms here) times the client, not the upstream: a client
    that keeps reading, however slowly, is not cut; one that reads nothing
    for the whole timeout is, and the access log counts it as the client's."""

    TOKENS = 100000  # ~23 MiB: far more than every buffer on the way holds

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0")
        fd, cls.log = tempfile.mkstemp(prefix="tokentap-it-", suffix=".log")
        os.close(fd)
        cls.addClassCleanup(os.unlink, cls.log)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--idle-timeout", "300ms", "--access-log", cls.log)

    def _open(self, rid):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        s.connect((harness.LOOPBACK, self.tt.port))
        self.addCleanup(s.close)
        s.sendall(harness.request_bytes("POST", "/v1/chat/completions",
                                        harness.api_body("openai-chat", True),
                                        harness.sim_headers(ttft=0, itl=0, tokens=self.TOKENS, request_id=rid)))
        s.settimeout(5)
        return s

    def _entry(self, rid):
        e = harness.wait_log_entry(self.log, lambda e: e.get("id") == rid)
        self.assertIsNotNone(e, "no access log line for %s" % rid)
        return e

    def test_slow_reader_is_not_cut(self):
        s = self._open("paused-slow")
        got = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:  # 16 KiB per 100 ms: 0.8 s to drain 128 KiB
            data = s.recv(16 * 1024)
            self.assertTrue(data, "cut after %.2f s while the client was reading" % (time.monotonic() - t0))
            got += len(data)
            time.sleep(0.1)
        self.assertLess(got, 1 << 20, "test premise: the client read slowly")
        tail = b""
        for _ in range(100000):  # the rest at full speed, up to the last chunk
            data = s.recv(1 << 20)
            if not data:
                break
            tail = (tail + data)[-64:]
            if tail.endswith(b"0\r\n\r\n"):
                break
        self.assertTrue(tail.endswith(b"0\r\n\r\n"), "the stream did not complete: ends %r" % tail[-20:])
        e = self._entry("paused-slow")
        self.assertIsNone(e["error"])
        self.assertEqual(e["status"], 200)

    def test_stalled_reader_is_cut_as_the_client(self):
        s = self._open("paused-stalled")
        self.assertTrue(s.recv(4096).startswith(b"HTTP/1.1 200"))
        time.sleep(1.5)  # buffers fill within milliseconds; then 300 ms of no reading
        tail, closed = b"", False
        try:
            for _ in range(100000):
                data = s.recv(1 << 20)
                if not data:
                    closed = True
                    break
                tail = (tail + data)[-64:]
        except ConnectionResetError:
            closed = True
        self.assertTrue(closed)
        self.assertFalse(tail.endswith(b"0\r\n\r\n"), "a cut stream was ended as if complete")
        e = self._entry("paused-stalled")
        self.assertEqual(e["error"], "client_aborted")


if __name__ == "__main__":
    unittest.main()
