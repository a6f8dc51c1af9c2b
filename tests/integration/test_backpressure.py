"""test_backpressure.py — a client that stops reading makes tokentap stop
reading the upstream: its memory stays bounded while the stream would be tens
of megabytes, and once the client reads again the stream completes intact."""

import hashlib
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


if __name__ == "__main__":
    unittest.main()
