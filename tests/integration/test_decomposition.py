"""test_decomposition.py — the TTFT decomposition as histograms per series
(docs/metrics.md, "Where the time went" and "Attributing a difference"),
through tokentap to tokentap-sim in its batching model, whose server timings
are its own scheduler's truth.

- For each engine shape the simulator reports in (vLLM's "metrics" on the
  chat usage chunk, Ollama's durations, llama.cpp's "timings" on the finish
  chunk, and a server that reports nothing), under enough load that requests
  queue: /stats's per-phase histograms (upload, server_queue, server_load,
  server_prefill, server_decode, server_inference, unattributed) hold
  exactly as many samples as the access log has values for that phase
  (none for the phases the shape does not report), their p50 and p90 within
  the histogram's bound of the log's (test_stats_accuracy.py explains it),
  and /metrics exports the same counts.
- /compare between a fast simulator and a queue-bound one (a batch of one
  under the same concurrency), both vLLM-shaped, names the engine's
  queueing as the cause of the slower TTFT, with the counts behind it.
"""

import concurrent.futures
import json
import shutil
import tempfile
import threading

import harness
import routing_helpers as rh
from test_admin import admin_get, admin_port, rank_quantile

BATCH = ["--batching", "--step-base-ms", "5", "--step-per-seq-ms", "1", "--prefill-tps", "20000"]
PHASES = ("upload", "server_queue", "server_load", "server_prefill", "server_decode", "server_inference",
          "unattributed")
ROUNDS, N = 2, 6  # two rounds of 6 concurrent streams over a batch of 2: most queue
US_MS = 0.001


def stream(port, api, model, tag, include_usage=True, prompt_bytes=800, tokens=6):
    """One streamed request; returns its id once answered 200."""
    body = harness.api_body(api, stream=True, include_usage=include_usage, model=model,
                            prompt=("%s " % tag) + "y" * prompt_bytes)
    if api.startswith("openai"):
        body["max_tokens"] = tokens
    else:
        body["options"] = {"num_predict": tokens}
    resp, _ = harness.exchange(port, "POST", harness.API_PATHS[api], body, [("x-request-id", tag)])
    assert resp is not None and resp.status == 200, (tag, resp and resp.status)
    return tag


def concurrently(fn, args, workers):
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, args))


class HistogramsTest(harness.TestCase):
    MODE = None  # the simulator's --server-timing
    SHAPES = ()  # (api, model, include_usage, the server_timing the log must say)

    @classmethod
    def setUpClass(cls):
        if cls.MODE is None and not cls.SHAPES:
            return
        args = BATCH + ["--max-batch", "2"] + (["--server-timing", cls.MODE] if cls.MODE else [])
        cls.sim = harness.start_sim(cls, *args)
        cls.start_logged(cls.sim.url, "tokentap-decomp-", admin=True)

    def entries(self, model, n):
        got = []

        def logged():
            got[:] = [e for e in harness.read_access_log(self.log) if e.get("model") == model]
            return len(got) >= n

        self.assertTrue(harness.wait_until(logged, 10.0, 0.05), "%s: %d of %d log lines" % (model, len(got), n))
        self.assertEqual(len(got), n)
        return got

    def series(self, model, n):
        s = harness.model_series(self.admin, model, n)
        self.assertTrue(s is not None and s["requests"] >= n, "%s: /stats shows all %d" % (model, n))
        return s

    def check_shape(self, api, model, include_usage, source):
        tags = ["it-decomp-%s-%d-%d" % (model, r, i) for r in range(ROUNDS) for i in range(N)]
        for r in range(ROUNDS):
            concurrently(lambda t: stream(self.tt.port, api, model, t, include_usage), tags[r * N:(r + 1) * N], N)
        log = self.entries(model, len(tags))
        reported = self.check_histograms(model, log)
        for e in log:
            self.assertEqual(e["server_timing"], source, e)
        return reported

    def check_histograms(self, model, log):
        """/stats's and /metrics's per-phase histograms of `model` against
        its access log lines; returns the sample count of each phase."""
        s = self.series(model, len(log))
        self.assertEqual(s["requests"], len(log))
        reported = {}
        for phase in PHASES:
            vals = [e[phase + "_ms"] for e in log if e[phase + "_ms"] is not None]
            if phase == "unattributed":  # kept as 0 below 0 (docs/metrics.md)
                vals = [max(0.0, v) for v in vals]
            m = s["metrics"][phase]
            what = "%s %s" % (model, phase)
            self.assertEqual(m["count"], len(vals), what)
            reported[phase] = len(vals)
            for q, key in ((0.5, "p50_ms"), (0.9, "p90_ms")):
                if not vals:
                    self.assertIsNone(m[key], what)
                    continue
                want = rank_quantile(vals, q)
                self.assertLessEqual(abs(m[key] - want), 0.01 * want + 2 * US_MS,
                                     "%s %s: stats %r, access log %r" % (what, key, m[key], want))
        # every request has tokentap's upload; the server rows only where it spoke
        self.assertEqual(reported["upload"], len(log))
        # /metrics: the same counts, in seconds-named families
        r = admin_get(self.admin, "/metrics")
        self.assertEqual(r.status, 200)
        text = r.body.decode()
        for phase in PHASES:
            family = "tokentap_%s_seconds" % phase
            self.assertIn("# TYPE %s histogram" % family, text)
            counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith(family + "_count{") and 'model="%s"' % model in line]
            self.assertEqual(sum(counts), reported[phase], "%s %s: %r" % (model, family, counts))
        return reported


class VllmShapesTest(HistogramsTest):
    MODE = "vllm"

    def test_vllm_chat(self):
        n = self.check_shape("openai-chat", "vllm-shape", True, "vllm")
        for phase in ("server_queue", "server_prefill", "server_decode", "unattributed"):
            self.assertEqual(n[phase], ROUNDS * N, phase)
        for phase in ("server_load", "server_inference"):
            self.assertEqual(n[phase], 0, phase)

    def test_ollama_chat(self):
        n = self.check_shape("ollama-chat", "ollama-shape", True, "ollama")
        for phase in ("server_load", "server_prefill", "server_decode", "unattributed"):
            self.assertEqual(n[phase], ROUNDS * N, phase)
        self.assertEqual(n["server_queue"], 0)


class LlamacppShapeTest(HistogramsTest):
    MODE = "llamacpp"

    def test_llamacpp_chat(self):
        n = self.check_shape("openai-chat", "llamacpp-shape", False, "llamacpp")
        for phase in ("server_prefill", "server_decode", "unattributed"):
            self.assertEqual(n[phase], ROUNDS * N, phase)
        self.assertEqual(n["server_queue"], 0)  # llama.cpp reports none


class SilentServerTest(HistogramsTest):
    MODE = "off"

    def test_no_timings(self):
        n = self.check_shape("openai-chat", "silent-shape", True, None)
        for phase in PHASES[1:]:
            self.assertEqual(n[phase], 0, phase)


class NativeRoutesTest(HistogramsTest):
    """llama.cpp's native /completion and TGI's /generate and
    /generate_stream, as the simulator answers them: tokentap counts their
    tokens and reads their timings as the simulator reported them."""

    MODE = "llamacpp"

    def native(self, path, body, tag):
        resp, _ = harness.exchange(self.tt.port, "POST", path, body, [("x-request-id", tag)])
        self.assertEqual(resp.status, 200, tag)
        return resp

    def test_llamacpp_completion(self):
        model, n = "native-llamacpp", 5
        tags = ["it-native-llamacpp-%d" % i for i in range(N)]

        def one(i):
            body = {"model": model, "prompt": ("%d " % i) + "y" * 800, "n_predict": n, "stream": i % 2 == 0}
            return self.native("/completion", body, tags[i])

        resps = concurrently(one, range(N), N)
        log = {e["id"]: e for e in self.entries(model, N)}
        for i, resp in enumerate(resps):
            e = log[tags[i]]
            if i % 2 == 0:
                events = harness.events_of(resp)
                final = json.loads(events[-1].data)
                self.assertTrue(final["stop"])
                self.assertEqual(e["token_events"], n, e)
                self.assertTrue(e["stream"])
            else:
                final = resp.json()
                self.assertFalse(e["stream"])
            t = final["timings"]
            self.assertEqual(e["api"], "llamacpp")
            self.assertEqual(e["server_timing"], "llamacpp")
            self.assertEqual(e["output_tokens"], n, e)
            self.assertEqual(e["input_tokens"], t["prompt_n"] + t["cache_n"], e)
            self.assertAlmostEqual(e["server_prefill_ms"], t["prompt_ms"], delta=0.0015)
            self.assertAlmostEqual(e["server_decode_ms"], t["predicted_ms"], delta=0.0015)
        counts = self.check_histograms(model, list(log.values()))
        self.assertEqual(counts["server_prefill"], N)
        self.assertEqual(counts["server_queue"], 0)  # llama.cpp reports none

    def test_tgi_generate(self):
        model, n = "native-tgi", 4
        tags = ["it-native-tgi-%d" % i for i in range(N)]

        def one(i):
            body = {"model": model, "inputs": ("%d " % i) + "y" * 800,
                    "parameters": {"max_new_tokens": n, "details": True}}
            return self.native("/generate" if i % 2 else "/generate_stream", body, tags[i])

        resps = concurrently(one, range(N), N)
        log = {e["id"]: e for e in self.entries(model, N)}
        queued = 0
        for i, resp in enumerate(resps):
            e = log[tags[i]]
            self.assertEqual(e["api"], "tgi")
            self.assertEqual(e["output_tokens"], n, e)
            # the route says whether it streams, not the body
            self.assertEqual(e["stream"], i % 2 == 0, e)
            if i % 2 == 0:  # streamed: tokens, no timings (TGI sends none)
                self.assertEqual(e["token_events"], n, e)
                self.assertIsNone(e["server_timing"], e)
                self.assertEqual(json.loads(harness.events_of(resp)[-1].data)["details"]["input_length"],
                                 e["input_tokens"])
                continue
            self.assertEqual(resp.json()["details"]["generated_tokens"], n)
            self.assertEqual(e["server_timing"], "tgi")
            self.assertEqual(e["server_queue_ms"], float(resp.header("x-queue-time")), e)
            self.assertEqual(e["server_inference_ms"], float(resp.header("x-inference-time")), e)
            self.assertEqual(e["server_validation_ms"], 0.0, e)
            self.assertGreater(e["server_inference_ms"], 0.0)
            queued += e["server_queue_ms"] > 0
        counts = self.check_histograms(model, list(log.values()))
        self.assertEqual(counts["server_queue"], N // 2)
        self.assertEqual(counts["server_inference"], N // 2)
        self.assertEqual(counts["unattributed"], N // 2)
        self.assertGreaterEqual(queued, 1, "a batch of 2 under 6 requests makes some queue")


class CompareAttributionTest(harness.TestCase):
    def test_queue_bound_upstream_is_blamed_on_queueing(self):
        sims = {
            "fast": harness.start_sim(self, *BATCH, "--max-batch", "16", "--server-timing", "vllm"),
            "queued": harness.start_sim(self, *BATCH, "--max-batch", "1", "--server-timing", "vllm"),
        }
        tt, admin = rh.start_split(self, {k: v.url for k, v in sims.items()}, {"fast": 2, "queued": 1})
        total = 60
        lock = threading.Lock()
        done = []

        def one(i):
            tag = stream(tt.port, "openai-chat", "cmp-model", "it-decomp-cmp-%d" % i, prompt_bytes=400, tokens=12)
            with lock:
                done.append(tag)

        # 12 at a time: about 4 on the queue-bound one, each ~80 ms of decode
        concurrently(one, range(total), 12)
        self.assertEqual(len(done), total)
        doc = rh.compare_flushed(self, admin, total, timeout=10.0)
        self.assertEqual(doc["baseline"], "fast")
        ups = {u["upstream"]: u for u in doc["upstreams"]}
        self.assertEqual(ups["queued"]["requests"], total // 3)
        self.assertEqual(ups["queued"]["metrics"]["server_queue"]["count"], total // 3)
        (diff,) = doc["differences"]
        self.assertEqual(diff["upstream"], "queued")
        self.assertEqual(diff["metrics"]["ttft"]["verdict"], "slower", diff["metrics"]["ttft"])
        a = diff["ttft_attribution"]
        self.assertTrue(a["slower"], a)
        self.assertEqual(a["cause"], "server_queue", a)
        self.assertEqual(a["cause_label"], "queueing (server)")
        top = a["phases"][0]
        self.assertEqual(top["phase"], "server_queue")
        self.assertEqual(top["count"], total // 3)
        self.assertEqual(top["baseline_count"], total - total // 3)
        self.assertGreater(top["p50_diff_ms"], 0.5 * a["ttft_p50_diff_ms"], a)
        self.assertEqual(len(a["phases"]), 7)
        # the phases the fast one has no queue in still come with both counts
        names = [p["phase"] for p in a["phases"]]
        self.assertEqual(sorted(names), sorted(("queue", "connect", "upload", "server_queue", "server_load",
                                                "server_prefill", "unattributed")))


class DashboardPhasesTest(harness.TestCase):
    """The dashboard (headless Chromium, as test_dashboard.py runs it): in
    the recent-requests table, a stacked bar per request whose segments are
    /requests/recent's phases, in order, adding up to the ttft; a request
    whose server reported nothing shows tokentap's phases and the upstream's
    share whole, marked; vLLM-shaped (queue, prefill), Ollama-shaped
    (model load, prefill), llama.cpp-shaped (a second simulator with
    --server-timing llamacpp, routed by model: prefill only, its queue in
    the remainder) and TGI-shaped (/generate, not streamed: the x-*-time
    headers' queue, validation and inference, the bar the whole response)
    requests each show their own server phases; the upstreams table has,
    per series, the per-phase rows /stats has."""

    def test_stacked_bars(self):
        from test_dashboard import Dom, check_no_page_errors, chromium_bin, run_chromium

        chromium_bin()
        datadir = tempfile.mkdtemp(prefix="tokentap-decomp-dash-")
        self.addCleanup(shutil.rmtree, datadir, True)
        sim = harness.start_sim(self, *BATCH, "--max-batch", "2", "--server-timing", "vllm")
        lsim = harness.start_sim(self, *BATCH, "--max-batch", "2", "--server-timing", "llamacpp")
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url, "llama": lsim.url}) + (
            "routes:\n  - name: llama\n    match: {model: dash-llama}\n    upstream: llama\n"
            "  - name: rest\n    upstream: sim\n"), "--data-dir", datadir, "--flush-interval", "200ms", "--admin",
            "127.0.0.1:0")
        admin = admin_port(tt)
        # vLLM reports only on the usage chunk: without include_usage, nothing
        spoke = ["it-dash-vllm-%d" % i for i in range(4)]
        silent = ["it-dash-silent-%d" % i for i in range(2)]
        ollama = ["it-dash-ollama-%d" % i for i in range(2)]
        # llama.cpp reports on the finish chunk when there is no usage chunk
        llama = ["it-dash-llamacpp-%d" % i for i in range(2)]
        tgi = ["it-dash-tgi-%d" % i for i in range(2)]

        def generate(tag):
            body = {"model": "dash-tgi", "inputs": "%s " % tag + "y" * 800, "parameters": {"max_new_tokens": 6}}
            resp, _ = harness.exchange(tt.port, "POST", "/generate", body, [("x-request-id", tag)])
            self.assertEqual(resp.status, 200, tag)
            self.assertIsNotNone(resp.header("x-queue-time"), tag)

        concurrently(lambda t: stream(tt.port, "openai-chat", "dash-model", t), spoke, 4)
        concurrently(lambda t: stream(tt.port, "openai-chat", "dash-model", t, include_usage=False), silent, 2)
        concurrently(lambda t: stream(tt.port, "ollama-chat", "dash-model", t), ollama, 2)
        concurrently(lambda t: stream(tt.port, "openai-chat", "dash-llama", t, include_usage=False), llama, 2)
        concurrently(generate, tgi, 2)
        self.assertTrue(harness.wait_until(
            lambda: sum(s["requests"] for s in admin_get(admin, "/stats?window=1m").json()["series"]) >= 12, 8.0, 0.1))
        recent = {r["id"]: r for r in admin_get(admin, "/requests/recent?n=15").json()["requests"]}
        series = admin_get(admin, "/stats?window=1m").json()["series"]
        self.assertEqual(len(series), 3, series)  # dash-model, dash-llama and dash-tgi

        out, err = run_chromium(self, "http://127.0.0.1:%d/" % admin, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        rows = {e["attrs"]["data-id"]: e for e in dom.inside("recent", "tr") if "data-id" in e["attrs"]}
        self.assertEqual(sorted(rows), sorted(spoke + silent + ollama + llama + tgi))
        widths = []
        for rid, tr in rows.items():
            r = recent[rid]
            (svg,) = dom.inside(tr, "svg", "phases")
            rects = dom.inside(svg, "rect", "phase")
            got = [(e["attrs"]["data-phase"], float(e["attrs"]["data-ms"])) for e in rects]
            tl = r["timeline_ms"]
            end = r["ttft_ms"]
            if rid in silent:
                self.assertIsNone(r["server_timing"])
                self.assertEqual(svg["attrs"]["data-server"], "none")
                want = [("head", tl["req_headers"]), ("queue", r["queue_ms"]), ("connect", r["connect_ms"]),
                        ("upload", r["upload_ms"]), ("upstream", tl["first_token"] - tl["req_sent"])]
                marks = [e for e in dom.inside(tr, "span") if e["attrs"].get("data-marked") == "no-server-timings"]
                self.assertEqual(len(marks), 1, rid)
            elif rid in ollama:
                self.assertEqual(r["server_timing"], "ollama")
                self.assertEqual(svg["attrs"]["data-server"], "ollama")
                want = [("head", tl["req_headers"]), ("queue", r["queue_ms"]), ("connect", r["connect_ms"]),
                        ("upload", r["upload_ms"]), ("server_load", r["server_load_ms"]),
                        ("server_prefill", r["server_prefill_ms"]), ("unattributed", max(0.0, r["unattributed_ms"]))]
            elif rid in llama:
                # no queue reported: the simulator's queue wait is in the remainder
                self.assertEqual(r["server_timing"], "llamacpp")
                self.assertEqual(svg["attrs"]["data-server"], "llamacpp")
                self.assertIsNone(r["server_queue_ms"])
                want = [("head", tl["req_headers"]), ("queue", r["queue_ms"]), ("connect", r["connect_ms"]),
                        ("upload", r["upload_ms"]), ("server_prefill", r["server_prefill_ms"]),
                        ("unattributed", max(0.0, r["unattributed_ms"]))]
            elif rid in tgi:
                # not streamed: no ttft, the bar is the whole response, its
                # server part the headers' (validation 0: a zero-width segment)
                self.assertEqual(r["server_timing"], "tgi")
                self.assertEqual(svg["attrs"]["data-server"], "tgi")
                self.assertIsNone(r["ttft_ms"])
                end = tl["resp_end"]
                want = [("head", tl["req_headers"]), ("queue", r["queue_ms"]), ("connect", r["connect_ms"]),
                        ("upload", r["upload_ms"]), ("server_queue", r["server_queue_ms"]),
                        ("server_validation", r["server_validation_ms"]),
                        ("server_inference", r["server_inference_ms"]),
                        ("unattributed", max(0.0, r["unattributed_ms"]))]
            else:
                self.assertEqual(r["server_timing"], "vllm")
                self.assertEqual(svg["attrs"]["data-server"], "vllm")
                want = [("head", tl["req_headers"]), ("queue", r["queue_ms"]), ("connect", r["connect_ms"]),
                        ("upload", r["upload_ms"]), ("server_queue", r["server_queue_ms"]),
                        ("server_prefill", r["server_prefill_ms"]), ("unattributed", max(0.0, r["unattributed_ms"]))]
            if rid not in silent:
                self.assertEqual([e for e in dom.inside(tr, "span") if "data-marked" in e["attrs"]], [], rid)
            self.assertEqual([k for k, _ in got], [k for k, _ in want], rid)
            for (k, v), (_, w) in zip(got, want):
                self.assertAlmostEqual(v, w, delta=1e-9 + 1e-9 * abs(w), msg="%s %s" % (rid, k))
            total = sum(v for _, v in got)
            self.assertAlmostEqual(total, end, delta=0.005 + max(0.0, -(r["unattributed_ms"] or 0.0)), msg=rid)
            widths.append((total, sum(float(e["attrs"]["width"]) for e in rects)))
        # one scale for every bar: the longest is the full width
        longest = max(widths)
        self.assertAlmostEqual(longest[1], 240.0, delta=0.01)
        for total, w in widths:
            self.assertAlmostEqual(w, 240.0 * total / longest[0], delta=0.01)
        # the upstreams table: the phase rows /stats has, a column per
        # series (by upstream, route, model); a phase no request of a
        # series reported is empty there (inference: TGI's only)
        series.sort(key=lambda s: (s["upstream"], s["route"], s["model"]))
        for label, key in (("upload p50, ms", "upload"), ("server queue p50, ms", "server_queue"),
                           ("model load p50, ms", "server_load"), ("server prefill p50, ms", "server_prefill"),
                           ("server decode p50, ms", "server_decode"),
                           ("server inference p50, ms", "server_inference"), ("unattributed p50, ms", "unattributed")):
            row = [e for e in dom.inside("upstreams", "tr") if e["attrs"].get("data-row") == label]
            self.assertEqual(len(row), 1, label)
            tds = dom.inside(row[0], "td")[1:]
            self.assertEqual(len(tds), len(series), label)
            for td, s in zip(tds, series):
                want = s["metrics"][key]["p50_ms"]
                if want is None:
                    self.assertEqual(td["attrs"]["data-value"], "", (label, s["model"]))
                else:
                    self.assertAlmostEqual(float(td["attrs"]["data-value"]), want, delta=1e-9, msg=(label, s["model"]))
        inference = {s["model"]: s["metrics"]["server_inference"]["count"] for s in series}
        self.assertEqual(inference, {"dash-model": 0, "dash-llama": 0, "dash-tgi": 2})


class DashboardEngineTest(harness.TestCase):
    """The dashboard's engine view (headless Chromium, as test_dashboard.py
    runs it) against two scraped simulators behind one route, the fast one
    and a queue-bound one: the Engines table shows each engine's running,
    waiting and KV-cache use as /upstreams has them, beside tokentap's in
    flight, with the "beside tokentap" words; the TTFT-by-engine-queue
    chart draws the selected series' buckets of /stats/curve?by=engine_queue
    (counts and p50s); the Compare panel says in words that the queue-bound
    upstream is slower because of the engine's queueing, as /compare's
    ttft_attribution names it."""

    def test_engine_view(self):
        from test_dashboard import Dom, check_no_page_errors, chromium_bin, run_chromium

        chromium_bin()
        datadir = tempfile.mkdtemp(prefix="tokentap-decomp-engine-")
        self.addCleanup(shutil.rmtree, datadir, True)
        sims = {
            "fast": harness.start_sim(self, *BATCH, "--max-batch", "16", "--server-timing", "vllm"),
            "queued": harness.start_sim(self, *BATCH, "--max-batch", "1", "--server-timing", "vllm"),
        }
        scrape = {k: ["metrics_url: %s/metrics" % v.url, "metrics_interval: 100ms"] for k, v in sims.items()}
        body = rh.upstreams_yaml({k: v.url for k, v in sims.items()}, scrape) + (
            "routes:\n  - name: chat\n    split:\n"
            "      - {upstream: fast, weight: 2}\n      - {upstream: queued, weight: 1}\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", "--data-dir", datadir, "--flush-interval",
                           "200ms", *rh.ONE_WORKER)
        admin = admin_port(tt)
        self.assertTrue(harness.wait_until(
            lambda: all((u["engine"] or {}).get("scraped") for u in admin_get(admin, "/upstreams").json()["upstreams"]),
            5.0, 0.05), "first scrapes")
        total = 60
        concurrently(lambda i: stream(tt.port, "openai-chat", "eng-model", "it-decomp-eng-%d" % i, prompt_bytes=400,
                                      tokens=12), range(total), 12)
        compare = []

        def settled():
            doc = admin_get(admin, "/compare?route=chat&window=1m").json()
            curve = admin_get(admin, "/stats/curve?window=1h&by=engine_queue").json()
            compare[:] = [doc, curve]
            return (sum(u["requests"] for u in admin_get(admin, "/stats?window=1m").json()["series"]) >= total
                    and len(doc["differences"]) == 1 and doc["differences"][0]["ttft_attribution"]["cause"]
                    and sum(b["requests"] for s in curve["series"] for b in s["buckets"]) >= total - 6)

        self.assertTrue(harness.wait_until(settled, 10.0, 0.2), "compare and curve: %r" % compare)
        doc, curve = compare
        why = doc["differences"][0]
        self.assertEqual(why["upstream"], "queued")
        self.assertEqual(why["ttft_attribution"]["cause"], "server_queue", why["ttft_attribution"])
        # the engines are idle now: what /upstreams says stays true while the page loads
        self.assertTrue(harness.wait_until(lambda: all(
            u["engine"]["running"] == 0 and u["engine"]["waiting"] == 0
            for u in admin_get(admin, "/upstreams").json()["upstreams"]), 5.0, 0.05))
        ups = {u["name"]: u for u in admin_get(admin, "/upstreams").json()["upstreams"]}
        stats = admin_get(admin, "/stats?window=1m").json()["series"]
        shown = max(stats, key=lambda s: s["requests"])  # the page's default series

        out, err = run_chromium(self, "http://127.0.0.1:%d/" % admin, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        # the Engines table
        self.assertEqual(dom.by_id("engines")["attrs"].get("data-engines"), "2")
        rows = {e["attrs"]["data-upstream"]: e for e in dom.inside("engines", "tr") if "data-upstream" in e["attrs"]}
        self.assertEqual(sorted(rows), ["fast", "queued"])
        for name, tr in rows.items():
            cells = {td["attrs"]["data-key"]: td for td in dom.inside(tr, "td")}
            eng = ups[name]["engine"]
            self.assertEqual(cells["engine"]["text"], "vllm")
            self.assertEqual(cells["in_flight"]["attrs"]["data-value"], str(ups[name]["in_flight"]))
            for key in ("running", "waiting", "beyond_proxy"):
                self.assertEqual(int(cells[key]["attrs"]["data-value"]), eng[key], (name, key))
            self.assertAlmostEqual(float(cells["kv_use"]["attrs"]["data-value"]), eng["kv_use"], delta=1e-12)
            self.assertIn("s ago", cells["age_ms"]["text"])
            self.assertIn("all of its work came through tokentap", cells["beyond_proxy"]["text"])
        # TTFT by the engine's queue: the selected series' buckets
        (series,) = [s for s in curve["series"]
                     if (s["route"], s["upstream"], s["model"]) == (shown["route"], shown["upstream"], shown["model"])]
        bars = [(int(e["attrs"]["data-low"]), int(e["attrs"]["data-count"]), float(e["attrs"]["data-p50-ms"]))
                for e in dom.inside("chart-engine-curve", "rect", "queue-bar")]
        want = [(b["waiting_low"], b["ttft"]["count"], b["ttft"]["p50_ms"]) for b in series["buckets"]]
        self.assertEqual(bars, want)
        self.assertGreater(sum(c for _, c, _ in bars), 0)
        # Compare: the cause in words
        (cell,) = [td for td in dom.inside("compare", "td") if td["attrs"].get("data-cause") == "server_queue"]
        self.assertEqual(cell["parent"]["attrs"].get("data-upstream"), "queued")
        self.assertIn("because of queueing (server)", cell["text"])
