"""test_stats_history.py — GET /stats/history (docs/admin-api.md): what
/stats?window=1m answered every `step` seconds over the last five minutes,
rebuilt from the per-second ring, so that the dashboard opens with its time
charts drawn.

tokentap (memory-only store, 100 ms flushes, admin on 127.0.0.1:0) in front
of tokentap-sim; a burst of streamed requests with a known ttft; then:

- points are one `step` apart, oldest first, none at or after the current
  second and none before collection began; each is a /stats answer of
  window 1m whose `t` is the minute's last second (`end`);
- points before the burst have no series; the points after it count every
  request of the burst, with the ttft percentiles the simulator set (the
  histogram's 1 %, plus loopback slack), and the newest equals what
  /stats?window=1m says, request for request and percentile for percentile;
- the series filters apply; points end on step boundaries; a step that does
  not divide 60, an unknown parameter and a write method are refused as the
  other endpoints refuse them.
"""

import time

import harness
from test_admin import admin_get

TTFT_MS = 40
N = 6


def iso_seconds(s):
    return int(time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone)


class StatsHistoryTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "4")
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--data-dir", "off", "--flush-interval", "100ms",
                                        "--admin", "127.0.0.1:0")
        cls.admin = harness.admin_port(cls.tt)
        cls.started = int(time.time())
        time.sleep(3.2)  # some seconds of history before the burst
        cls.burst = int(time.time())
        for i in range(N):
            resp, _ = harness.exchange(cls.tt.port, "POST", "/v1/chat/completions", harness.api_body("openai-chat"),
                                       harness.sim_headers(ttft=TTFT_MS, itl=2, tokens=4, request_id="hist-%d" % i))
            assert resp.status == 200
        cls.burst_end = int(time.time())

        def flushed():
            doc = admin_get(cls.admin, "/stats?window=1m").json()
            return sum(s["requests"] for s in doc["series"]) == N

        harness.wait_until(flushed, 10.0, 0.05)
        time.sleep(3.2)  # and some seconds after it

    def history(self, query="step=1"):
        resp = admin_get(self.admin, "/stats/history?" + query)
        self.assertEqual(resp.status, 200, resp.body[:300])
        return resp.json()

    def test_points(self):
        now = int(time.time())
        doc = self.history()
        self.assertEqual((doc["step_s"], doc["span_s"]), (1, 60))
        pts = doc["points"]
        ts = [p["t"] for p in pts]
        self.assertGreaterEqual(len(pts), 5)
        self.assertEqual(ts, list(range(ts[0], ts[0] + len(ts))), "one point a second, oldest first")
        self.assertLess(ts[-1], now + 1)
        self.assertGreaterEqual(ts[0], self.started - 1, "nothing before collection began")
        for p in pts:
            self.assertEqual(p["window"], "1m")
            self.assertEqual(iso_seconds(p["end"]), p["t"])
            self.assertEqual(iso_seconds(p["start"]), p["t"] - 59)
        # a request lands in the ring's slot of the flush after it ends
        before = [p for p in pts if p["t"] < self.burst]
        after = [p for p in pts if p["t"] > self.burst_end + 1]
        self.assertTrue(before and after, ts)
        for p in before:
            self.assertEqual(p["series"], [], "no requests yet at %d" % p["t"])
        for p in after:
            self.assertEqual(len(p["series"]), 1)
            s = p["series"][0]
            self.assertEqual(s["requests"], N)
            ttft = s["metrics"]["ttft"]
            self.assertEqual(ttft["count"], N)
            self.assertGreaterEqual(ttft["p50_ms"], TTFT_MS * 0.99)
            self.assertLess(ttft["p99_ms"], TTFT_MS * 1.01 + 50.0)  # loopback and sanitizer slack
        live = admin_get(self.admin, "/stats?window=1m").json()["series"][0]
        newest = pts[-1]["series"][0]
        self.assertEqual((newest["requests"], newest["metrics"]["ttft"]["count"]),
                         (live["requests"], live["metrics"]["ttft"]["count"]))
        for q in ("p50_ms", "p99_ms", "max_ms"):
            self.assertEqual(newest["metrics"]["ttft"][q], live["metrics"]["ttft"][q], q)

    def test_step_and_filters(self):
        pts = self.history("step=2")["points"]
        ts = [p["t"] for p in pts]
        self.assertTrue(all(b - a == 2 for a, b in zip(ts, ts[1:])), ts)
        self.assertTrue(all(t % 2 == 1 for t in ts), "a point ends a 2-second chunk")
        self.assertEqual(self.history("step=60")["step_s"], 60)
        pts = self.history("step=1&model=no-such-model")["points"]
        self.assertTrue(pts and all(p["series"] == [] for p in pts))
        pts = self.history("step=1&model=sim-model&cold=only")["points"]
        self.assertEqual(pts[-1]["series"][0]["requests"], 1, "the first request found the upstream idle")
        self.assertEqual(pts[-1]["cold"], "only")

    def test_refusals(self):
        for q in ("step=0", "step=61", "step=7", "step=x", "step=", "cold=maybe"):
            with self.subTest(query=q):
                self.assertJsonError(admin_get(self.admin, "/stats/history?" + q), 400)
        self.assertJsonError(admin_get(self.admin, "/stats/history?window=1m"), 400)
        self.assertEqual(admin_get(self.admin, "/stats/history", method="POST").status, 405)


if __name__ == "__main__":
    import unittest

    unittest.main()
