"""test_stats_accuracy.py — stored percentiles against the access log.

A few hundred streamed requests, eight at a time, with varied ttft, ITL,
output and prompt lengths, go through tokentap to the simulator. For every
window (1m, 5m, 1h, 24h, 7d, all) the series' ttft, e2e, tpot, itl, input
and output token histograms must agree with the same numbers computed from
the access log's per-request values (itl from the itl_ms arrays): count and
max exact, mean and p50/p90/p95/p99/p99.9 within the histogram's bound.

The bound: tokentap stores times in whole µs (the ns value rounded) and
reports a quantile as the midpoint of the bucket holding the sample of rank
ceil(q*n), within 1 % of that sample (src/record/hist.h); the access log prints
the same µs (ms with three decimals). So a quantile is within 1 % of the
log's sample of that rank, plus 1 µs for the two roundings of one ns value
through doubles; token counts are exact below 128 and within 1 % above.

Then the stored windows (1h, 24h, 7d, all) are compared again after a
SIGTERM restart, and after a kill -9 once a second batch of requests has
been committed (the 1h window, read from LMDB, shows them).
"""

import os
import random
import shutil
import signal
import tempfile
import threading
import unittest

import harness
from test_admin import admin_get, admin_port, rank_quantile

PATH = "/v1/chat/completions"
MODEL = "acc-model"
N1 = 240  # first instance
N2 = 60  # second instance, before the kill -9
CONCURRENCY = 8
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99"), (0.999, "p99_9"))
US_MS = 0.001  # one µs, in ms


def send_batch(port, n, prefix, seed):
    """n streamed requests, CONCURRENCY at a time; raises on any failure."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        plans.append(dict(ttft=rng.choice((1, 3, 8, 20, 45, 90)), itl=rng.choice((0, 1, 1, 2, 3)),
                          tokens=rng.randint(1, 40), words=rng.randint(1, 300), id="%s-%d" % (prefix, i)))
    errors = []
    lock = threading.Lock()

    def run(part):
        for p in part:
            body = harness.api_body("openai-chat", stream=True, include_usage=True, model=MODEL,
                                    prompt=" ".join(["word"] * p["words"]))
            hdrs = harness.sim_headers(ttft=p["ttft"], itl=p["itl"], tokens=p["tokens"], request_id=p["id"])
            try:
                resp, _ = harness.exchange(port, "POST", PATH, body=body, headers=hdrs)
                if resp is None or resp.status != 200:
                    raise AssertionError("proxy answered %r" % (resp and resp.status))
            except Exception as e:  # noqa: BLE001 - reported by the test thread
                with lock:
                    errors.append(repr(e))
                return

    threads = [threading.Thread(target=run, args=(plans[k::CONCURRENCY],)) for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise AssertionError("requests failed: %s" % errors[:3])


def series(doc):
    for s in doc["series"]:
        if s["model"] == MODEL:
            return s
    return None


class StatsAccuracyTest(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-accuracy-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.log = os.path.join(self.dir, "access.log")
        self.args = ("--data-dir", os.path.join(self.dir, "data"), "--flush-interval", "200ms", "--admin",
                     "127.0.0.1:0", "--access-log", self.log)
        self.sim = harness.start_sim(self)

    def start(self):
        tt = harness.start_tokentap(self, self.sim.url, *self.args)
        return tt, admin_port(tt)

    def log_values(self, n):
        """Per-metric lists of the access log's values, once it has n lines."""
        entries = []

        def logged():
            entries[:] = [e for e in harness.read_access_log(self.log) if e.get("model") == MODEL]
            return len(entries) >= n

        self.assertTrue(harness.wait_until(logged, 10.0, 0.05), "access log lines: %d of %d" % (len(entries), n))
        self.assertEqual(len(entries), n)
        v = {"ttft": [], "e2e": [], "tpot": [], "itl": [], "input_tokens": [], "output_tokens": []}
        for e in entries:
            self.assertEqual(e["status"], 200)
            # every gap is in the log: no stream reaches the 4096-sample cap
            self.assertEqual(len(e["itl_ms"]), e["itl_count"], e["id"])
            v["itl"].extend(e["itl_ms"])
            for k in ("ttft", "e2e", "tpot"):
                if e[k + "_ms"] is not None:
                    v[k].append(e[k + "_ms"])
            v["input_tokens"].append(e["input_tokens"])
            v["output_tokens"].append(e["output_tokens"])
        # tpot only where a request had two tokens or more
        self.assertEqual(len(v["tpot"]), sum(1 for e in entries if e["output_tokens"] > 1))
        self.assertGreater(len(v["itl"]), 1000, "enough ITL samples for p99.9 to differ from max")
        return v

    def wait_window(self, port, window, n, timeout=10.0):
        last = []

        def check():
            r = admin_get(port, "/stats?window=%s&model=%s" % (window, MODEL))
            if r is None or r.status != 200:
                return False
            last[:] = [series(r.json())]
            return last[0] is not None and last[0]["requests"] >= n

        harness.wait_until(check, timeout, 0.1)
        self.assertTrue(last and last[0], "no series in window %s" % window)
        return last[0]

    def check_window(self, port, window, values, n):
        s = self.wait_window(port, window, n)
        self.assertEqual(s["requests"], n, window)
        self.assertEqual(s["input_tokens"], sum(values["input_tokens"]), window)
        self.assertEqual(s["output_tokens"], sum(values["output_tokens"]), window)
        for name, vals in values.items():
            m = s["metrics"][name]
            what = "%s %s" % (window, name)
            self.assertEqual(m["count"], len(vals), what)
            suffix = "" if name.endswith("_tokens") else "_ms"
            res = 0 if name.endswith("_tokens") else US_MS
            mean = sum(vals) / len(vals)
            # the admin API prints 10 significant digits
            self.assertAlmostEqual(m["max" + suffix], max(vals), delta=res + 1e-9 * max(vals), msg=what + " max")
            self.assertAlmostEqual(m["mean" + suffix], mean, delta=res + 1e-9 * mean, msg=what + " mean")
            for q, key in QUANTILES:
                want = rank_quantile(vals, q)
                got = m[key + suffix]
                self.assertLessEqual(abs(got - want), 0.01 * want + res + 1e-9 * want,
                                     "%s %s: stats %r, access log %r" % (what, key, got, want))

    def test_windows_match_access_log_across_restarts(self):
        tt, port = self.start()
        send_batch(tt.port, N1, "acc1", 1)
        values = self.log_values(N1)
        for w in ("1m", "5m", "1h", "24h", "7d", "all"):
            self.check_window(port, w, values, N1)

        # SIGTERM: the last flush is committed on the way out
        tt.stop()
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text()[-2000:])
        tt, port = self.start()
        for w in ("1h", "24h", "7d", "all"):
            self.check_window(port, w, values, N1)

        # kill -9 once the second batch is committed: the 1h window is read
        # from LMDB, so seeing every request there means the commit is done
        send_batch(tt.port, N2, "acc2", 2)
        values = self.log_values(N1 + N2)
        self.wait_window(port, "1h", N1 + N2)
        tt.kill(signal.SIGKILL)
        tt, port = self.start()
        for w in ("1h", "24h", "7d", "all"):
            self.check_window(port, w, values, N1 + N2)


if __name__ == "__main__":
    unittest.main()
