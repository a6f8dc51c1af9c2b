"""test_engine_metrics.py — the engines' own /metrics,
scraped per upstream (docs/metrics.md "The engine's view").

- Config: `metrics_url`, `metrics_interval` and `engine` on an upstream entry
  are checked by `tokentap -t` with FILE:LINE messages.
- Under load, against tokentap-sim --batching (its /metrics in vLLM's names,
  scraped every 100 ms; --server-timing vllm, so that each response carries
  the scheduler's own account of it): per request, the server queue and
  prefill tokentap logs are what the simulator reported (to the logged
  microsecond; most requests queue, by up to ~300 ms), and tokentap's
  phases, the server's and the unattributed remainder add up to the ttft
  (test_server_timing's check, the remainder small and not below 0).
  Each request's logged `engine.waiting` is a value
  the simulator's queue really had within the scrape's staleness. How: a
  thread polls the simulator's /sim/stats (`batch.queued`) every 5 ms; the
  value logged for a request must lie between the smallest and the largest
  queue polled from one interval (+ slack) before the request was sent to
  just after it. TTFT grows with the engine's queue: the mean ttft of
  requests that saw a longer queue (coarse buckets) is never lower. The
  stored curve, `/stats/curve?by=engine_queue` read after a restart from
  LMDB, counts per bucket of `waiting` exactly the logged requests whose
  scrape was fresh (at most two intervals old), and its TTFT p50 does not
  fall from one bucket to the next where the queue grew.
  `/requests/recent` has the same values with the scrape's age; `/upstreams`
  shows the engine's running + waiting beside tokentap's in flight, with no
  note while all traffic goes through tokentap, and says so once requests
  reach the simulator around it.
- `engine: auto` tells SGLang's and llama.cpp's names apart.
- A metrics endpoint that hangs, answers 500, or sends 10 MB of garbage: the
  TTFT p99 of streams through tokentap stays within noise of the same
  streams through a tokentap without scraping (both run side by side in the
  test); each upstream's failure is logged once; `/upstreams` says the
  scrape fails and why. A reload that drops a metrics_url stops its scrapes;
  the shutdown with a scrape hanging is clean and prompt.
- An https metrics_url (the simulator speaking TLS, --tls-cert) is scraped
  verified with the upstream's tls.ca_file; without the CA the scrape fails
  with the TLS reason in `/upstreams`, and forwarding is not involved.
"""

import json
import os
import re
import shutil
import tempfile
import threading
import time
import unittest

import harness
import routing_helpers as rh
import test_server_timing as st

PATH = "/v1/chat/completions"
INTERVAL_MS = 100


def admin_get(port, path):
    resp, _ = harness.exchange(port, "GET", path)
    return resp


def upstream_view(port, name):
    for u in admin_get(port, "/upstreams").json()["upstreams"]:
        if u["name"] == name:
            return u
    raise AssertionError("no upstream %s in /upstreams" % name)


def p99(values):
    s = sorted(values)
    return s[min(len(s) - 1, int(0.99 * len(s)))]

BASE = """\
listen: 127.0.0.1:0
admin: {listen: "off"}
store: {dir: "off"}
upstreams:
  - name: a
    url: http://127.0.0.1:9
"""


class ConfigTest(harness.TestCase):
    def problems(self, extra):
        text = BASE + extra
        res, name = rh.check_config(text)
        return text, res, rh.problem_lines(res, name)

    def test_good_keys(self):
        for extra in ("    metrics_url: http://127.0.0.1:9/metrics\n",
                      "    metrics_url: http://[::1]:9/metrics\n    metrics_interval: 250ms\n    engine: vllm\n",
                      "    metrics_url: http://localhost:9/m?x=1\n    engine: auto\n",
                      "    metrics_url: https://127.0.0.1:9/metrics\n",
                      "    metrics_url: https://localhost\n",
                      "    metrics_url: http://127.0.0.1:9/metrics\n    engine: sglang\n",
                      "    metrics_url: http://127.0.0.1:9/metrics\n    engine: llamacpp\n"):
            with self.subTest(extra=extra):
                _, res, probs = self.problems(extra)
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertEqual(probs, [])

    def test_bad_keys(self):
        cases = [
            ("    metrics_url: ftp://127.0.0.1:9/metrics\n", "metrics_url", "upstreams[0].metrics_url"),
            ("    metrics_url: httpx://127.0.0.1:9/metrics\n", "metrics_url", "http:// or https://"),
            ("    metrics_url: http://127.0.0.1:99999/metrics\n", "metrics_url", "port"),
            ("    metrics_url: http:///metrics\n", "metrics_url", "host"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 5 parsecs\n",
             "metrics_interval", "upstreams[0].metrics_interval"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 10ms\n",
             "metrics_interval", "100ms"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 2h\n",
             "metrics_interval", "5m"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    engine: tgi\n", "engine",
             "auto, vllm, sglang or llamacpp"),
            ("    metrics_interval: 5s\n", "metrics_interval", "needs metrics_url"),
            ("    engine: vllm\n", "engine", "needs metrics_url"),
        ]
        for extra, key, sub in cases:
            with self.subTest(extra=extra):
                text, res, probs = self.problems(extra)
                self.assertEqual(res.returncode, 1, res.stderr)
                self.assertEqual(len(probs), 1, res.stderr)
                self.assertEqual(probs[0][0], rh.line_of(text, key + ":"), res.stderr)
                self.assertIn(sub, probs[0][1])



class QueuePoller:
    """Polls the simulator's batch queue every 5 ms: (monotonic ns, queued)."""

    def __init__(self, sim):
        self.sim, self.samples, self.stop_ev = sim, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        deadline = time.monotonic() + 60
        while not self.stop_ev.is_set() and time.monotonic() < deadline:
            try:
                q = self.sim.stats()["batch"]["queued"]
            except (OSError, ValueError, KeyError):
                continue
            self.samples.append((time.monotonic_ns(), q))
            time.sleep(0.005)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(5)

    def range_between(self, t0, t1):
        vals = [q for t, q in self.samples if t0 <= t <= t1]
        return (min(vals), max(vals)) if vals else None


class EngineViewTest(harness.TestCase):
    def test_requests_record_the_engines_queue(self):
        sim = harness.start_sim(self, "--batching", "--max-batch", "2", "--step-base-ms", "4",
                                "--step-per-seq-ms", "0", "--prefill-tps", "50000", "--metrics-style", "vllm",
                                "--server-timing", "vllm")
        data = tempfile.mkdtemp(prefix="tokentap-engine-curve-")
        self.addCleanup(shutil.rmtree, data, True)
        conf = rh.upstreams_yaml({"sim": sim.url}, {"sim": [
            "metrics_url: %s/metrics" % sim.url, "metrics_interval: %dms" % INTERVAL_MS]})
        args = ("--admin", "127.0.0.1:0", "--data-dir", os.path.join(data, "d"), "--flush-interval", "200ms")
        tt = rh.start_conf(self, conf, *args)
        aport = harness.admin_port(tt)
        # the first scrape is in before the load starts
        self.assertTrue(harness.wait_until(lambda: (upstream_view(aport, "sim")["engine"] or {}).get("scraped"),
                                           5.0, 0.02))
        poller = QueuePoller(sim)
        sent, results, reports, views = {}, {}, {}, []

        def one(i):
            rid = "eng-%d" % i
            # with the usage chunk: the simulator's own account of the request on it
            body = harness.api_body("openai-chat", stream=True, include_usage=True)
            body["max_tokens"] = 12
            resp, t0 = harness.exchange(tt.port, "POST", PATH, body, [("x-request-id", rid)])
            sent[rid] = t0
            results[rid] = resp.status
            reports[rid] = [json.loads(ev.data)["metrics"] for ev in harness.events_of(resp)
                            if ev.data.startswith("{") and "metrics" in json.loads(ev.data)]

        # 36 requests 15 ms apart over a batch of 2 that serves one in ~50 ms:
        # the queue grows most of the way, and the scrapes see it at every size
        threads = []
        for i in range(36):
            threads.append(threading.Thread(target=one, args=(i,)))
            threads[-1].start()
            time.sleep(0.015)
            if i == 30:
                views.append(upstream_view(aport, "sim"))
        for t in threads:
            t.join(60)
        poller.stop()
        self.assertEqual(sorted(results.values()), [200] * 36)
        entries = {}
        self.assertTrue(harness.wait_until(lambda: len({e["id"] for e in tt.access_log()
                                                        if e["id"].startswith("eng-")}) >= 36, 5.0, 0.05))
        for e in tt.access_log():
            entries[e["id"]] = e
        slack_ns = 60 * 1000000
        by_queue, queued = [], 0
        for rid, t0 in sent.items():
            e = entries[rid]
            eng = e["engine"]
            self.assertIsNotNone(eng, e)
            self.assertLessEqual(eng["age_ms"], INTERVAL_MS * 5, e)
            lo_hi = poller.range_between(t0 - INTERVAL_MS * 1000000 - slack_ns, t0 + slack_ns)
            self.assertIsNotNone(lo_hi, "no queue sample around %s" % rid)
            self.assertTrue(lo_hi[0] <= eng["waiting"] <= lo_hi[1],
                            "%s: logged engine waiting %d, the simulator's queue was %r around then"
                            % (rid, eng["waiting"], lo_hi))
            self.assertIn(eng["running"], (0, 1, 2), e)
            self.assertIsNotNone(eng["kv_use"], e)
            by_queue.append((eng["waiting"], e["ttft_ms"]))
            # the server's phases: what the simulator's scheduler did with
            # this request (its report, to the logged microsecond), and
            # tokentap's phases, the server's and the remainder make the ttft
            self.assertEqual(len(reports[rid]), 1, "%s: the simulator reports once, on the usage chunk" % rid)
            m = reports[rid][0]
            self.assertEqual(e["server_timing"], "vllm", e)
            self.assertTrue(st.near(e["server_queue_ms"], m["queue_time_ms"]), (e, m))
            self.assertTrue(st.near(e["server_prefill_ms"], m["time_to_first_token_ms"]), (e, m))
            st.check_sum(self, e)
            queued += m["queue_time_ms"] > 10.0
        self.assertGreaterEqual(queued, 18, "most requests wait in the simulator's queue")
        # TTFT against the engine's queue: coarse buckets, means never lower
        buckets = [(0, 0), (1, 4), (5, 9), (10, 10 ** 6)]
        means = []
        for lo, hi in buckets:
            v = [t for q, t in by_queue if lo <= q <= hi]
            if len(v) >= 2:
                means.append((lo, sum(v) / len(v), len(v)))
        self.assertGreaterEqual(len(means), 3, "the queue did not grow enough: %r" % sorted(by_queue))
        for a, b in zip(means, means[1:]):
            self.assertLessEqual(a[1], b[1], "ttft by engine queue: %r" % means)
        # /requests/recent: the same values and the scrape's age
        recent = {r["id"]: r for r in admin_get(aport, "/requests/recent?n=50").json()["requests"]}
        for rid in list(sent)[:5]:
            self.assertEqual(recent[rid]["engine"], entries[rid]["engine"])
        # /upstreams under load: both views, and no traffic around the proxy
        eng = views[0]["engine"]
        self.assertEqual(eng["engine"], "vllm")
        self.assertFalse(eng["failing"])
        self.assertIsNone(eng["note"], eng)
        self.assertEqual(eng["beyond_proxy"], 0, eng)
        self.assertGreater(eng["running"] + eng["waiting"], 0, eng)
        self.assertIn("tokentap_in_flight", eng)
        self.assertIn("in_flight", views[0])

        # The stored curve: after a restart, read from LMDB
        tt.stop()
        tt2 = rh.start_conf(self, conf, *args)
        aport2 = harness.admin_port(tt2)
        curve = admin_get(aport2, "/stats/curve?by=engine_queue").json()
        self.assertEqual(curve["basis"], "engine_queue")
        self.assertEqual(admin_get(aport2, "/stats/curve").json()["basis"], "inflight")
        self.assertEqual(len(curve["series"]), 1, curve)
        buckets = curve["series"][0]["buckets"]
        fresh = [(e["engine"]["waiting"], e["ttft_ms"]) for e in entries.values()
                 if e["id"].startswith("eng-") and e["engine"]["age_ms"] <= 2 * INTERVAL_MS]
        self.assertGreaterEqual(len(fresh), 30, "too many stale scrapes on this machine")
        for b in buckets:
            hi = b["waiting_high"] if b["waiting_high"] is not None else 10 ** 9
            in_b = [t for q, t in fresh if b["waiting_low"] <= q <= hi]
            self.assertEqual(b["requests"], len(in_b), b)
            self.assertEqual(b["ttft"]["count"], len(in_b), b)
            self.assertNotIn("itl", b)
        self.assertEqual(sum(b["requests"] for b in buckets), len(fresh))
        grown = [b for b in buckets if b["requests"] >= 2]
        # log2 buckets are coarser than the ones above: two at least (three
        # on a quiet machine; under ASan the queue jumps 1 -> 4-7)
        self.assertGreaterEqual(len(grown), 2, "the queue did not grow enough: %r" % buckets)
        p50s = [(b["waiting_low"], b["ttft"]["p50_ms"]) for b in grown]
        for a, b in zip(p50s, p50s[1:]):
            self.assertLessEqual(a[1], b[1], "stored ttft p50 by engine queue: %r" % p50s)
        self.assertEqual(admin_get(aport2, "/stats/curve?by=engine").status, 400)

    def test_traffic_around_the_proxy(self):
        sim = harness.start_sim(self, "--batching", "--max-batch", "2", "--metrics-style", "vllm")
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url}, {"sim": [
            "metrics_url: %s/metrics" % sim.url, "metrics_interval: %dms" % INTERVAL_MS]}),
            "--admin", "127.0.0.1:0")
        aport = harness.admin_port(tt)
        done = []

        def direct(i):
            body = harness.api_body("openai-chat", stream=True)
            body["max_tokens"] = 60
            resp, _ = harness.exchange(sim.port, "POST", PATH, body)
            done.append(resp.status)

        threads = [threading.Thread(target=direct, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        seen = []

        def noted():
            eng = upstream_view(aport, "sim")["engine"]
            seen[:] = [eng]
            return eng.get("beyond_proxy", 0) >= 3

        ok = harness.wait_until(noted, 5.0, 0.02)
        for t in threads:
            t.join(30)
        self.assertTrue(ok, seen)
        self.assertIn("around the proxy", seen[0]["note"])
        self.assertEqual(seen[0]["tokentap_in_flight"], 0)

    def test_auto_tells_the_engines_apart(self):
        sg = harness.start_sim(self, "--batching", "--metrics-style", "sglang")
        lc = harness.start_sim(self, "--batching", "--metrics-style", "llamacpp")
        tt = rh.start_conf(self, rh.upstreams_yaml({"sg": sg.url, "lc": lc.url}, {
            "sg": ["metrics_url: %s/metrics" % sg.url, "metrics_interval: %dms" % INTERVAL_MS],
            "lc": ["metrics_url: %s/metrics" % lc.url, "metrics_interval: %dms" % INTERVAL_MS,
                   "engine: llamacpp"]}) + "routes:\n  - name: r\n    upstream: sg\n",
            "--admin", "127.0.0.1:0")
        aport = harness.admin_port(tt)
        for name, want in (("sg", "sglang"), ("lc", "llamacpp")):
            self.assertTrue(harness.wait_until(
                lambda name=name: (upstream_view(aport, name)["engine"] or {}).get("scraped"), 5.0, 0.02))
            eng = upstream_view(aport, name)["engine"]
            self.assertEqual(eng["engine"], want)
            self.assertEqual((eng["running"], eng["waiting"], eng["kv_use"]), (0, 0, 0.0), eng)
            self.assertEqual(eng["failures"], 0)


# ---- broken metrics endpoints ----

def hang(sock, req, ctx):
    ctx.stop_event.wait(30)
    return False


def fail_500(sock, req, ctx):
    body = b"internal error\n"
    sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return True


GARBAGE = os.urandom(1 << 16)


def garbage(sock, req, ctx):
    total = 10 << 20
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % total)
    sent = 0
    try:
        while sent < total and not ctx.stop_event.is_set():
            sock.sendall(GARBAGE)
            sent += len(GARBAGE)
    except OSError:
        pass
    return False


class TlsScrapeTest(harness.TestCase):
    def test_https_metrics_url(self):
        from test_tls import make_pki

        d = tempfile.mkdtemp(prefix="tokentap-scrape-tls-")
        self.addCleanup(shutil.rmtree, d, True)
        cert, key = make_pki(d)
        ca = os.path.join(d, "ca.pem")
        sim = harness.start_sim(self, "--tls-cert", cert, "--tls-key", key, "--metrics-style", "sglang")
        url = "https://localhost:%d" % sim.port
        conf = ("upstreams:\n"
                "  - name: trusted\n    url: %s\n    tls: {ca_file: %s}\n    metrics_url: %s/metrics\n"
                "    metrics_interval: 1s\n"
                "  - name: untrusted\n    url: %s\n    metrics_url: %s/metrics\n    metrics_interval: 1s\n"
                "routes:\n  - name: all\n    match: {path_prefix: /}\n    upstream: trusted\n"
                % (url, ca, url, url, url))
        tt = rh.start_conf(self, conf, "--admin", "127.0.0.1:0")
        aport = harness.admin_port(tt)
        views = {}  # a scrape every second: the first one's handshake has 900 ms on a loaded machine

        def seen():
            views.update({n: upstream_view(aport, n)["engine"] for n in ("trusted", "untrusted")})
            return views["trusted"]["scraped"] and views["untrusted"]["failures"] >= 2

        self.assertTrue(harness.wait_until(seen, 15.0, 0.05), views)
        good, bad = views["trusted"], views["untrusted"]
        self.assertEqual(good["engine"], "sglang")
        self.assertFalse(good["failing"], good)
        # the very first scrape may miss its deadline on a slow build (seen
        # under ASan: both first handshakes took > 900 ms, the next ones not)
        self.assertLessEqual(good["failures"], 1, (good, tt.stderr_text()[-2000:]))
        self.assertEqual((good["running"], good["waiting"]), (0, 0))
        self.assertTrue(bad["failing"], bad)
        self.assertFalse(bad["scraped"], bad)
        self.assertIn("TLS", bad["error"])
        self.assertIn("certificate", bad["error"])
        # one warning per streak of failures: the untrusted one's never ends
        self.assertEqual(tt.count_lines(re.compile(r"upstream untrusted: scraping https://\S+ failed")), 1)
        self.assertEqual(tt.count_lines(re.compile(r"upstream trusted: scraping https://\S+ failed")), good["failures"])


class BrokenEndpointTest(harness.TestCase):
    def test_broken_endpoints_leave_forwarding_alone(self):
        sim = harness.start_sim(self)
        ends = {"h": harness.start_fake_upstream(self, hang), "e": harness.start_fake_upstream(self, fail_500),
                "g": harness.start_fake_upstream(self, garbage)}
        split = "routes:\n  - name: r\n    split:\n" + "".join(
            "      - {upstream: %s, weight: 1}\n" % n for n in ends)
        scraped = rh.start_conf(self, rh.upstreams_yaml({n: sim.url for n in ends}, {
            n: ["metrics_url: %s/metrics" % f.url, "metrics_interval: 200ms"]
            for n, f in ends.items()}) + split, "--admin", "127.0.0.1:0")
        plain = rh.start_conf(self, rh.upstreams_yaml({n: sim.url for n in ends}) + split)
        aport = harness.admin_port(scraped)

        def ttft(tt):
            body = harness.api_body("openai-chat", stream=True)
            resp, t0 = harness.exchange(tt.port, "POST", PATH, body, harness.sim_headers(ttft=20, itl=1, tokens=3))
            self.assertEqual(resp.status, 200)
            return (resp.pieces[0][0] - t0) / 1e6

        # One request through each in turn, so that the machine's load falls
        # on both alike. Within noise: on a shared two-core machine the p99
        # of 150 streams of 20 ms moves by tens of ms from run to run with
        # nothing scraped; an attempt that misses is tried again (up to 3),
        # as test_accesslog does with its timings.
        tries = []
        for _ in range(3):
            on, off = [], []
            for _ in range(150):
                on.append(ttft(scraped))
                off.append(ttft(plain))
            p50_on, p50_off = sorted(on)[len(on) // 2], sorted(off)[len(off) // 2]
            tries.append("ttft p50 %.1f / p99 %.1f ms with broken scrapes, %.1f / %.1f ms without"
                         % (p50_on, p99(on), p50_off, p99(off)))
            print(tries[-1])
            if p99(on) < p99(off) * 1.5 + 30.0 and p50_on < p50_off + 5.0:
                break
        else:
            self.fail("forwarding slowed down in every attempt:\n" + "\n".join(tries))
        views = {n: upstream_view(aport, n)["engine"] for n in ends}
        for n, why in (("h", "no complete answer"), ("e", "HTTP 500"), ("g", "larger than 4 MiB")):
            self.assertTrue(views[n]["failing"], views[n])
            self.assertFalse(views[n]["scraped"], views[n])
            self.assertIn(why, views[n]["error"], views[n])
            self.assertGreaterEqual(views[n]["failures"], 3, views[n])
            warned = scraped.count_lines(re.compile(r"upstream %s: scraping \S+ failed" % n))
            self.assertEqual(warned, 1, "upstream %s: %d warnings" % (n, warned))

        # a reload that drops h's and e's metrics_url: no more scrapes of them
        self.assertTrue(scraped.reload(rh.upstreams_yaml({n: sim.url for n in ends}, {
            "g": ["metrics_url: %s/metrics" % ends["g"].url, "metrics_interval: 200ms"]}) + split))
        time.sleep(0.3)
        before = {n: len(ends[n].requests) for n in ("h", "e")}
        time.sleep(0.5)
        self.assertEqual({n: len(ends[n].requests) for n in ("h", "e")}, before)
        self.assertIsNone(upstream_view(aport, "h")["engine"])
        # g kept its streak across the reload: still one warning
        self.assertEqual(scraped.count_lines(re.compile(r"upstream g: scraping \S+ failed")), 1)

    def test_shutdown_with_a_scrape_hanging(self):
        sim = harness.start_sim(self)
        h = harness.start_fake_upstream(self, hang)
        tt = rh.start_conf(self, rh.upstreams_yaml({"u": sim.url}, {"u": [
            "metrics_url: %s/metrics" % h.url, "metrics_interval: 5s"]}))
        self.assertTrue(harness.wait_until(lambda: len(h.requests) >= 1, 5.0, 0.02))
        t0 = time.monotonic()
        tt.signal(2)  # SIGINT: drains (nothing runs) and stops
        tt.proc.wait(5)
        self.assertLess(time.monotonic() - t0, 2.0)
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())


if __name__ == "__main__":
    unittest.main()
