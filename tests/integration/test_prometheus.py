"""test_prometheus.py — a real Prometheus scrapes two tokentaps, and its
fleet-wide histogram_quantile agrees with the merged truth.

Two tokentap instances, each with its own simulator, data dir, access log and
admin port, carry different traffic (instance A fast, TTFT 12–46 ms;
instance B slow, TTFT 64–95 ms). Debian's `prometheus` (temporary storage,
a free loopback port, scrape_interval 1s) scrapes both admin /metrics.

A baseline of two quick requests per instance (TTFT 2 and 3 ms, below every
other) is sent first, and Prometheus scrapes it; the rest of the traffic is
then sent in two halves while it scrapes. Once it has seen every request,
the test asks its HTTP API for

    histogram_quantile(0.9, sum by (le) (rate(tokentap_ttft_seconds_bucket[W])))

— the fleet query of the docs and the Grafana dashboard, W spanning every
scrape — and checks that it lies in the `le` interval that holds the true
p90 of the traffic sent while it scraped (the nearest-rank sample of both
access logs' entries, the rule /stats uses). That is all linear
interpolation inside a bucket can promise: the answer may sit on either
edge of that interval and anywhere inside, whatever the true value's place
in it. rate() extrapolates each series to the ends of W by up to half a
scrape interval and scales each instance's buckets by its own factor (its
scrapes' timestamps differ), so the merged counts are weighted a few per
cent unevenly; the traffic puts the p90's rank well inside its bucket
(rank 36 of 40 between cumulative counts 30 and 40), clear of that. One
more allowance, from tokentap's side: a bucket count is read from a
histogram whose buckets are 1 % wide, so a sample within 1 % of an `le`
edge may be counted on the other side of it; then the neighbouring
interval is accepted too.

Without rate(), on the lifetime counts themselves (baseline included),
Prometheus's histogram_quantile(q, sum by (le) (...)) for q = 0.5 and 0.9
must equal exactly what its documented algorithm gives on the bucket
counts both tokentaps export (summed per `le`), and lie in the interval of
the merged truth of every request as above: the fleet sum works as the
exposition promises.

Also: Prometheus's sum of tokentap_ttft_seconds_count equals the sum of both
instances' /stats ttft counts and the number of requests sent, and both
targets are up; every query of contrib/grafana/tokentap-dashboard.json
evaluates in this Prometheus to a non-empty result while the traffic is in
its range (a misspelt metric would answer "success" with nothing), and
promtool accepts contrib/prometheus/prometheus.yml. Each tokentap scrapes
its simulator's engine /metrics (metrics_url): Prometheus reads the engine gauges
and scrape counters of both, per upstream (one series each, values within
their ranges, successful scrapes counted, none failed). Prometheus is stopped by
its PID (SIGTERM, bounded wait, then SIGKILL). Missing `prometheus` is a
failure, not a skip: contrib/setup.sh installs it.
"""

import json
import math
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

import harness
import routing_helpers as rh
from test_admin import admin_get, admin_port, parse_exposition, rank_quantile

PATH = "/v1/chat/completions"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROM_READY_TIMEOUT_S = 40.0
SCRAPE_WAIT_S = 40.0
# Sim TTFTs (ms) kept a few ms clear of every `le` edge (…, 10, 20, 25, 40,
# 50, 60, 75, 80, 100, 150 …), so that proxy overhead cannot move a sample
# across one; the assertions do not rely on it. The p90 of both lists
# merged is B's 90 ms, rank 36 of 40, with 30 samples at or below 80 ms and
# 40 at or below 100 ms.
TTFT_A = [12, 14, 16, 30, 33, 35, 44, 46] * 3  # 24 requests
TTFT_B = [64, 67, 70, 85, 88, 90, 92, 95] * 2  # 16 requests
BASELINE = [2, 3]  # per instance, before Prometheus starts: below every other


def prometheus_bin():
    path = shutil.which(os.environ.get("TOKENTAP_PROMETHEUS") or "prometheus")
    if not path:
        raise AssertionError("prometheus is not installed: run contrib/setup.sh (it installs Debian's "
                             "prometheus package), or point TOKENTAP_PROMETHEUS at a Prometheus binary")
    return path


def send(port, ttfts, tag):
    for i, ttft in enumerate(ttfts):
        body = harness.api_body("openai-chat", stream=True, include_usage=True, model="prom-model")
        hdrs = harness.sim_headers(ttft=ttft, itl=1, tokens=4, request_id="%s-%d" % (tag, i))
        resp, _ = harness.exchange(port, "POST", PATH, body=body, headers=hdrs)
        if resp is None or resp.status != 200:
            raise AssertionError("%s: proxy answered %r" % (tag, resp and resp.status))


def prom_get(port, path):
    resp, _ = harness.exchange(port, "GET", path, timeout=10)
    return resp


def prom_result(port, expr):
    """The result list of an instant query."""
    r = prom_get(port, "/api/v1/query?query=" + urllib.parse.quote(expr, safe=""))
    if r is None or r.status != 200:
        raise AssertionError("query %r: %r %r" % (expr, r and r.status, r and r.body[:300]))
    doc = r.json()
    if doc.get("status") != "success":
        raise AssertionError("query %r: %r" % (expr, doc))
    return doc["data"]["result"]


def prom_query(port, expr):
    """The value of an instant query that returns one sample, or None."""
    res = prom_result(port, expr)
    if not res:
        return None
    if len(res) != 1:
        raise AssertionError("query %r: %d samples, expected 1: %r" % (expr, len(res), res))
    return float(res[0]["value"][1])


def fleet_buckets(test, texts):
    """[(le as float, cumulative count)] of tokentap_ttft_seconds summed over
    every series of every exposition, +Inf last."""
    total = {}
    for text in texts:
        _, samples = parse_exposition(test, text)
        for name, labels, value in samples:
            if name == "tokentap_ttft_seconds_bucket":
                le = float(labels["le"])
                total[le] = total.get(le, 0.0) + value
    return sorted(total.items())


def promql_histogram_quantile(q, buckets):
    """Prometheus's bucketQuantile (promql/quantile.go), for q in (0, 1):
    the first bucket whose cumulative count reaches q × total, linear
    interpolation inside it, 0 as the lower edge of the first bucket, and
    the highest finite edge when the rank falls into +Inf."""
    assert buckets[-1][0] == math.inf and len(buckets) >= 2
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = len(buckets) - 1
    for i in range(len(buckets) - 1):
        if buckets[i][1] >= rank:
            b = i
            break
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def le_interval(v, edges):
    """The (lower, upper] `le` interval holding v (seconds)."""
    lower = 0.0
    for e in edges:
        if v <= e:
            return lower, e
        lower = e
    return lower, math.inf


def start_instance(test, root, name):
    """One fleet member under root/name: a simulator and a tokentap in front
    of it (its own store, 200 ms flushes, admin API, access log), the
    upstream named sim-NAME and its engine /metrics scraped every 200 ms.
    Returns (tokentap, admin port, access-log path)."""
    d = os.path.join(root, name)
    os.makedirs(d)
    sim = harness.start_sim(test)
    log = os.path.join(d, "access.log")
    up = "sim-" + name
    tt = rh.start_conf(test, rh.upstreams_yaml({up: sim.url}, {up: [
        "metrics_url: %s/metrics" % sim.url, "metrics_interval: 200ms"]}),
        "--data-dir", os.path.join(d, "data"), "--flush-interval", "200ms", "--admin", "127.0.0.1:0",
        "--access-log", log, access_log=False)
    return tt, admin_port(tt), log


def start_prometheus(test, root, targets, flags=(), interval="1s", name="prometheus"):
    """Starts Prometheus scraping the admin ports `targets` every `interval`
    with extra command-line `flags`, its config and storage under
    root/name*; stopped at `test`'s cleanup. Returns (process, port)."""
    cfg = os.path.join(root, name + ".yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: tokentap\n    metrics_path: /metrics\n"
                "    static_configs:\n      - targets: [%s]\n"
                % (interval, interval, ", ".join("'127.0.0.1:%d'" % p for p in targets)))
    last_err = ""
    for attempt in range(3):  # a free port can be taken between probe and bind
        port = harness.free_port()
        storage = os.path.join(root, "%s-tsdb-%d" % (name, attempt))
        proc = harness.Process([prometheus_bin(), "--config.file=" + cfg, "--storage.tsdb.path=" + storage,
                                "--web.listen-address=127.0.0.1:%d" % port, "--log.level=info"] + list(flags),
                               None, name, cwd=root)
        test.addCleanup(proc.stop)

        def ready():
            if not proc.alive():
                return "exited"
            try:  # probe first: a refused connect is the normal "not yet"
                socket.create_connection((harness.LOOPBACK, port), timeout=1).close()
                r = prom_get(port, "/-/ready")
            except OSError:
                return False
            return r is not None and r.status == 200

        state = harness.wait_until(ready, PROM_READY_TIMEOUT_S, 0.2)
        if state is True:
            return proc, port
        last_err = proc.stderr_text()[-3000:]
        proc.stop()
        if "address already in use" not in last_err:
            break
    raise AssertionError("%s did not become ready; stderr tail:\n%s" % (name, last_err))


class PrometheusFleetTest(harness.TestCase):
    def start_prometheus(self, root, targets):
        return start_prometheus(self, root, targets)

    def test_fleet_histogram_quantile_matches_merged_truth(self):
        prometheus_bin()
        root = tempfile.mkdtemp(prefix="tokentap-prom-")
        self.addCleanup(shutil.rmtree, root, True)
        tt_a, admin_a, log_a = start_instance(self, root, "a")
        tt_b, admin_b, log_b = start_instance(self, root, "b")

        errors = []

        def run(port, ttfts, tag):
            try:
                send(port, ttfts, tag)
            except Exception as e:  # reported below
                errors.append(repr(e))

        def send_both(a, b, tag):
            threads = [threading.Thread(target=run, args=(tt_a.port, a, "pa" + tag)),
                       threading.Thread(target=run, args=(tt_b.port, b, "pb" + tag))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            self.assertEqual(errors, [])

        def counts():
            """ttft counts (A, B) of /metrics, the lifetime counts Prometheus scrapes."""
            out = []
            for p in (admin_a, admin_b):
                _, samples = parse_exposition(self, admin_get(p, "/metrics").body.decode("utf-8"))
                out.append(sum(v for n, _, v in samples if n == "tokentap_ttft_seconds_count"))
            return tuple(out)

        def prom_count():
            return prom_query(port, "sum(tokentap_ttft_seconds_count)")

        # the baseline: the series exist, at a count Prometheus scrapes
        # before the rest comes
        send_both(BASELINE, BASELINE, "base")
        n_base = 2 * len(BASELINE)
        self.assertTrue(harness.wait_until(lambda: counts() == (len(BASELINE),) * 2, 8.0, 0.1), "baseline flush")
        prom_started = time.monotonic()
        prom, port = self.start_prometheus(root, [admin_a, admin_b])
        seen = []

        def scraped(n):
            up = prom_query(port, 'count(up{job="tokentap"} == 1)')
            seen[:] = [up, prom_count()]
            return up == 2 and seen[1] == n

        self.assertTrue(harness.wait_until(lambda: scraped(n_base), SCRAPE_WAIT_S, 0.2),
                        "prometheus saw (targets up, ttft count) = %r, want (2, %d); stderr:\n%s"
                        % (seen, n_base, prom.stderr_text()[-2000:]))

        # the rest while it scrapes, in two halves a few scrapes apart
        half_a, half_b = len(TTFT_A) // 2, len(TTFT_B) // 2
        send_both(TTFT_A[:half_a], TTFT_B[:half_b], "1")
        self.assertTrue(harness.wait_until(lambda: prom_count() == n_base + half_a + half_b, 10.0, 0.2),
                        "prometheus saw the first half")
        send_both(TTFT_A[half_a:], TTFT_B[half_b:], "2")
        total = n_base + len(TTFT_A) + len(TTFT_B)
        self.assertTrue(harness.wait_until(lambda: counts() == (len(BASELINE) + len(TTFT_A),
                                                                len(BASELINE) + len(TTFT_B)), 8.0, 0.1), "flush")
        self.assertTrue(harness.wait_until(lambda: scraped(total), SCRAPE_WAIT_S, 0.2),
                        "prometheus saw (targets up, ttft count) = %r, want (2, %d)" % (seen, total))

        texts = [admin_get(p, "/metrics").body.decode("utf-8") for p in (admin_a, admin_b)]
        buckets = fleet_buckets(self, texts)
        self.assertEqual(buckets[-1], (math.inf, float(total)))
        edges = [le for le, _ in buckets[:-1]]

        entries = []
        for log in (log_a, log_b):
            entries += [e for e in harness.read_access_log(log) if str(e.get("id", "")).startswith("p")]
        self.assertEqual(len(entries), total, "access log lines")
        ttfts = [e["ttft_ms"] / 1000.0 for e in entries]
        scraped_ttfts = [e["ttft_ms"] / 1000.0 for e in entries if "base" not in e["id"]]
        self.assertEqual(len(scraped_ttfts), len(TTFT_A) + len(TTFT_B))

        # /stats of both agree on the count
        stats_count = 0
        for p in (admin_a, admin_b):
            s = admin_get(p, "/stats?window=all").json()["series"][0]
            stats_count += s["metrics"]["ttft"]["count"]
        self.assertEqual(stats_count, total)

        def check_in_truth_interval(expr, got, q, values):
            truth = rank_quantile(values, q)
            allowed = {le_interval(truth, edges), le_interval(truth * 0.99, edges),
                       le_interval(truth * 1.01, edges)}
            if os.environ.get("TOKENTAP_TEST_VERBOSE"):
                print("\n%s: prometheus %.6f s, merged truth %.6f s in le interval %r"
                      % (expr, got, truth, le_interval(truth, edges)))
            self.assertTrue(any(lo <= got <= hi for lo, hi in allowed),
                            "%s = %.6f s, but the merged p%g of both access logs is %.6f s, in le interval %r "
                            "(accepted: %r)" % (expr, got, q * 100, truth, le_interval(truth, edges),
                                                sorted(allowed)))

        # the fleet query over rate(): every scrape in the range
        window_s = int(time.monotonic() - prom_started) + 10
        expr = ("histogram_quantile(0.9, sum by (le) (rate(tokentap_ttft_seconds_bucket[%ds])))" % window_s)
        got = prom_query(port, expr)
        self.assertIsNotNone(got, expr)
        check_in_truth_interval(expr, got, 0.9, scraped_ttfts)

        # without rate(): exactly Prometheus's algorithm on the exported counts
        for q in (0.5, 0.9):
            with self.subTest(q=q):
                expr = "histogram_quantile(%g, sum by (le) (tokentap_ttft_seconds_bucket))" % q
                got = prom_query(port, expr)
                self.assertIsNotNone(got, expr)
                want_interp = promql_histogram_quantile(q, buckets)
                self.assertAlmostEqual(got, want_interp, delta=1e-9 * max(1.0, abs(want_interp)),
                                       msg="%s: Prometheus %r, its algorithm on the exported buckets %r"
                                       % (expr, got, want_interp))
                check_in_truth_interval(expr, got, q, ttfts)
        # the two instances really differ, so the fleet answer is a merge
        self.assertLess(max(TTFT_A), min(TTFT_B))

        # contrib/grafana: every panel's query is valid PromQL that this
        # Prometheus evaluates over tokentap's metrics (variables set to
        # All) to a non-empty result while the traffic is within its range
        with open(os.path.join(REPO, "contrib", "grafana", "tokentap-dashboard.json")) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 8)
        for expr in exprs:
            e = expr.replace("$__rate_interval", "1m")
            for var in ("route", "upstream", "model"):
                e = e.replace("$" + var, ".*")
            self.assertNotIn("$", e, expr)
            self.assertNotEqual(prom_result(port, e), [], "%s: empty result" % expr)

        # the engines' view, per upstream, as Prometheus read it
        for fam in ("tokentap_engine_requests_running", "tokentap_engine_requests_waiting",
                    "tokentap_engine_kv_cache_usage_ratio", "tokentap_engine_scrape_age_seconds"):
            res = prom_result(port, fam)
            self.assertEqual(sorted(r["metric"]["upstream"] for r in res), ["sim-a", "sim-b"], fam)
            for r in res:
                v = float(r["value"][1])
                self.assertTrue(0 <= v <= (1 if "ratio" in fam else 5 if "age" in fam else 100), (fam, r))
        ok = prom_result(port, 'tokentap_engine_scrapes_total{result="ok"}')
        self.assertEqual(len(ok), 2, ok)
        self.assertTrue(all(float(r["value"][1]) >= 2 for r in ok), ok)
        self.assertEqual(prom_query(port, 'sum(tokentap_engine_scrapes_total{result="failed"})'), 0)

    def test_contrib_scrape_config_is_valid(self):
        promtool = shutil.which("promtool")
        if not promtool:
            raise AssertionError("promtool is not installed: run contrib/setup.sh (Debian's prometheus package)")
        r = subprocess.run([promtool, "check", "config", os.path.join(REPO, "contrib", "prometheus", "prometheus.yml")],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stdout)


if __name__ == "__main__":
    unittest.main()
