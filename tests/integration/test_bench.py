"""test_bench.py — tokentap-bench, the load generator: what it reports against
the simulator matches the simulator's configured timing and token counts; run
through tokentap, its per-request ttft and token counts agree with tokentap's
access log (matched by request id) and its percentiles with tokentap's /stats;
open-loop arrivals come at the asked rate; a sweep writes its curve as JSON
and SVG with the knee marked; a bad command line exits 2 naming the flag.

The binary is found next to the simulator (contrib/bench beside contrib/sim)
or through TOKENTAP_BENCH_BIN."""

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET

import harness

TOL_MS = 1.0  # per request: client ttft vs tokentap ttft
HIST_ERR = 0.01  # relative error of a histogram percentile
ATTEMPTS = 10  # timing comparisons only: a 2-core machine running sim, proxy and client has bursts of scheduling noise
RUN_TIMEOUT_S = 30
N_ACC = 12  # requests per accuracy attempt


def run_bench(args, timeout=RUN_TIMEOUT_S):
    return subprocess.run([harness.bench_bin()] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, text=True,
                          start_new_session=True)


def load_json(path):
    with open(path) as f:
        return json.load(f)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def get_json(port, path):
    conn = harness.HttpConn(port)
    try:
        conn.send(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % (path, port)).encode())
        resp = conn.read_response(method="GET")
    finally:
        conn.close()
    if resp is None or resp.status != 200:
        raise AssertionError("GET %s: %r" % (path, resp and (resp.status, resp.body[:300])))
    return resp.json()


class BenchCase(harness.TestCase):
    def tmp(self, name):
        d = tempfile.mkdtemp(prefix="tokentap-bench-it-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        return os.path.join(d, name)

    def bench_ok(self, args, timeout=RUN_TIMEOUT_S):
        p = run_bench(args, timeout)
        self.assertEqual(p.returncode, 0, "tokentap-bench %r exited %d; stderr:\n%s\nstdout:\n%s"
                         % (args, p.returncode, p.stderr[-2000:], p.stdout[-2000:]))
        return p


class DirectToSimulator(BenchCase):
    """Against the simulator, whose timing is known."""

    TTFT, ITL, TOKENS = 30, 10, 8

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", cls.TTFT, "--itl-ms", cls.ITL)

    def test_percentiles_match_configured_timing(self):
        last = None
        for _ in range(ATTEMPTS):
            js, log = self.tmp("out.json"), self.tmp("req.jsonl")
            p = self.bench_ok(["--url", self.sim.url, "--concurrency", 2, "--requests", 12, "--warmup", 2,
                               "--output-len", self.TOKENS, "--input-len", "uniform:10:50", "--sim-headers",
                               "--json", js, "--requests-log", log, "--no-progress"])
            res = load_json(js)["result"]
            reqs = read_jsonl(log)
            # counts are exact whatever the timing
            self.assertEqual(res["requests"]["ok"], 12, p.stdout)
            self.assertEqual(res["warmup"]["requests"]["ok"], 2)
            self.assertEqual(len(reqs), 14)
            self.assertEqual(sum(r["warmup"] for r in reqs), 2)
            self.assertEqual(len({r["id"] for r in reqs}), 14)
            for r in reqs:
                self.assertTrue(r["ok"], r)
                self.assertEqual(r["output_tokens"], self.TOKENS, r)
                self.assertEqual(r["token_events"], self.TOKENS, r)
                self.assertEqual(r["itl_count"], self.TOKENS - 1, r)
                self.assertEqual(len(r["itl_ms"]), self.TOKENS - 1, "every gap in the request log")
                self.assertEqual(r["input_tokens"], r["input_len"], "4 bytes per token, as the simulator counts")
                self.assertRegex(r["id"], r"^bench-[0-9A-Za-z_.]+-\d+$")
            self.assertEqual(res["output_tokens"], 12 * self.TOKENS)
            self.assertEqual(res["metrics"]["itl"]["count"], 12 * (self.TOKENS - 1))
            m = res["metrics"]
            self.assertGreater(res["reads_kernel_stamped"], 0, "SO_TIMESTAMPNS stamps were not used")
            # medians: the simulator's own timers are late now and then on a loaded machine
            checks = [("ttft", "p50_ms", self.TTFT), ("itl", "p50_ms", self.ITL),
                      ("tpot", "p50_ms", self.ITL), ("e2e", "p50_ms", self.TTFT + (self.TOKENS - 1) * self.ITL)]
            bad = ["%s %s = %.3f, configured %d" % (k, q, m[k][q], want) for k, q, want in checks
                   if not (want - 0.5 <= m[k][q] <= want * 1.01 + 2.0)]
            if not bad:
                self.assertIn("ttft", p.stdout)
                self.assertIn("warm-up", p.stdout)
                return
            last = bad
        self.fail("client percentiles off the simulator's timing in every attempt: %s" % last)

    def test_every_api_counts_tokens_exactly(self):
        for api in ("openai-chat", "openai-completions", "anthropic", "ollama-chat", "ollama-generate",
                    "openai-responses", "bedrock-converse", "bedrock-invoke"):
            for stream in ("--stream", "--no-stream"):
                with self.subTest(api=api, stream=stream):
                    js, log = self.tmp("o.json"), self.tmp("r.jsonl")
                    self.bench_ok(["--url", self.sim.url, "--api", api, stream, "--concurrency", 2,
                                   "--requests", 4, "--output-len", "uniform:3:6", "--input-len", 20,
                                   "--json", js, "--requests-log", log, "--no-progress", "--model", "m-1"])
                    res = load_json(js)["result"]
                    self.assertEqual(res["requests"]["ok"], 4, res)
                    for r in read_jsonl(log):
                        self.assertEqual(r["output_tokens"], r["output_len"], r)  # max_tokens obeyed
                        self.assertEqual(r["input_tokens"], 20, r)
                        if stream == "--stream":
                            # tokentap-sim's first token is empty when it draws "," or "." (its words
                            # list: those two lack the leading space the first token drops); an
                            # empty text is not a token event, usage still counts it
                            self.assertIn(r["token_events"], (r["output_len"] - 1, r["output_len"]), r)
                            self.assertIsNotNone(r["ttft_ms"], r)
                        else:
                            self.assertIsNone(r["ttft_ms"], r)
                            self.assertIsNotNone(r["e2e_ms"], r)


class Sessions(BenchCase):
    """--sessions: multi-turn conversations over shared system prompts, each
    turn resending the history, the session named in a header."""

    SYS, USER, ANSWER = 512, 64, 16  # tokens, whole 16-token blocks of the simulator's cache

    def test_bodies_resend_the_history(self):
        def handler(sock, req, ctx):
            body = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            return True

        up = harness.start_fake_upstream(self, handler)
        for api in ("openai-chat", "anthropic", "openai-completions"):
            with self.subTest(api=api):
                with up.lock:
                    up.requests.clear()
                log = self.tmp("r.jsonl")
                self.bench_ok(["--url", up.url, "--api", api, "--no-stream", "--sessions", 3, "--turns", 3,
                               "--system-prompts", 2, "--system-len", 40, "--input-len", 8, "--output-len", 5,
                               "--session-header", "x-conv", "--no-progress", "--run-id", "s",
                               "--requests-log", log])
                system_of = {r["session"]: r["system_prompt"] for r in read_jsonl(log)}
                with up.lock:
                    reqs = sorted(up.requests, key=lambda r: int(r.header("x-request-id").rsplit("-", 1)[1]))
                self.assertEqual(len(reqs), 9, "one round: 3 sessions x 3 turns")
                by, turns = {}, {}
                for i, r in enumerate(reqs):
                    m = re.match(r"^sess-0-(\d+)$", r.header("x-conv") or "")
                    self.assertIsNotNone(m, r.headers)
                    session = int(m.group(1))
                    turn = turns[session] = turns.get(session, -1) + 1
                    self.assertEqual(i // 3, turn, "every session's turn t before any turn t + 1")
                    by[(session, turn)] = json.loads(r.body)
                self.assertEqual(sorted(turns.items()), [(0, 2), (1, 2), (2, 2)])
                for (session, turn), b in by.items():
                    if api == "openai-completions":
                        prompt = b["prompt"]
                        self.assertEqual(len(prompt), 4 * (40 + turn * (8 + 5) + 8))
                        if turn:
                            prev = by[(session, turn - 1)]["prompt"]
                            self.assertTrue(prompt.startswith(prev), "the history is resent")
                        continue
                    msgs = b["messages"]
                    roles = [m["role"] for m in msgs]
                    want = ([] if api == "anthropic" else ["system"]) + ["user"] + ["assistant", "user"] * turn
                    self.assertEqual(roles, want)
                    self.assertEqual(b["max_tokens"], 5)
                    system = b["system"] if api == "anthropic" else msgs[0]["content"]
                    self.assertEqual(len(system), 4 * 40)
                    if turn:
                        prev = by[(session, turn - 1)]["messages"]
                        self.assertEqual(msgs[:len(prev)], prev, "the previous turn's messages come first")
                        self.assertEqual(len(msgs[len(prev)]["content"]), 4 * 5, "the answer: output-len tokens")
                def sys_of(s):
                    b = by[(s, 0)]
                    if api == "openai-completions":
                        return b["prompt"][:4 * 40]
                    return b["system"] if api == "anthropic" else b["messages"][0]["content"]

                for a in range(3):
                    for b in range(a + 1, 3):
                        self.assertEqual(sys_of(a) == sys_of(b), system_of[a] == system_of[b],
                                         "sessions share a system prompt's text exactly when they share its number")
                        self.assertNotEqual(by[(a, 0)], by[(b, 0)], "their user turns differ")
                self.assertLessEqual(len(set(system_of.values())), 2)

    def test_simulator_caches_the_shared_prefixes(self):
        sim = harness.start_sim(self, "--batching", "--prefix-cache", "--prefill-tps", "100000")
        log = self.tmp("r.jsonl")
        S, T, K = 4, 3, 2
        self.bench_ok(["--url", sim.url, "--sessions", S, "--turns", T, "--system-prompts", K,
                       "--system-len", self.SYS, "--input-len", self.USER, "--output-len", self.ANSWER,
                       "--sim-headers", "--concurrency", 1, "--requests-log", log, "--no-progress"])
        reqs = sorted(read_jsonl(log), key=lambda r: r["seq"])
        self.assertEqual(len(reqs), S * T)
        self.assertEqual(sorted((r["session"], r["turn"]) for r in reqs), [(s, t) for s in range(S) for t in range(T)])
        # rounds over the sessions, each rotated, so the order is no fixed cycle
        self.assertNotEqual([r["session"] for r in reqs[:S]], [r["session"] for r in reqs[S:2 * S]])
        want_cached, systems_seen = 0, set()
        for r in reqs:
            session, turn = r["session"], r["turn"]
            self.assertEqual(turn, r["seq"] // S)
            self.assertIn(r["system_prompt"], range(K))
            self.assertTrue(r["ok"], r)
            # the prompt grows by the previous answer and the new user turn
            self.assertEqual(r["input_tokens"], self.SYS + turn * (self.USER + self.ANSWER) + self.USER, r)
            self.assertEqual(r["input_tokens"], r["input_len"])
            # cached: the previous turn's whole prompt, or on a first turn the
            # system prompt when an earlier session opened with it
            want = 0
            if turn:
                want = self.SYS + (turn - 1) * (self.USER + self.ANSWER) + self.USER
            elif r["system_prompt"] in systems_seen:
                want = self.SYS
            systems_seen.add(r["system_prompt"])
            self.assertEqual(r["cached_tokens"], want, "the usage's cached count, in the requests log")
            want_cached += want
        # four sessions over two system prompts: at least two first turns find theirs cached
        self.assertGreaterEqual(sum(1 for r in reqs if r["turn"] == 0 and r["cached_tokens"] == self.SYS), 2)
        st = sim.stats()["prefix_cache"]
        self.assertEqual(st["lookups"], S * T)
        self.assertEqual(st["cached_tokens"], want_cached)

    def test_bad_session_flags(self):
        for args, flag in ((["--turns", "3"], "--turns"), (["--sessions", "0"], "--sessions"),
                           (["--sessions", "2", "--turns", "1001"], "--turns"),
                           (["--sessions", "2", "--session-header", "content-length"], "--session-header"),
                           (["--sessions", "2", "--system-len", "normal:1"], "--system-len")):
            with self.subTest(args=args):
                p = run_bench(args, 10)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn(flag, p.stderr)


class ThroughTokentap(BenchCase):
    """Client and proxy agree on what they measured: the bench's view of the
    same requests is the check that tokentap's numbers are right."""

    def one_attempt(self, sim):
        d = tempfile.mkdtemp(prefix="tokentap-bench-acc-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        access = os.path.join(d, "access.log")
        tt = harness.Tokentap(sim.url, "--access-log", access, "--data-dir", os.path.join(d, "data"),
                              "--admin", "127.0.0.1:0", "--flush-interval", "200ms")
        try:
            aport = harness.admin_port(tt)
            js, log = os.path.join(d, "bench.json"), os.path.join(d, "req.jsonl")
            p = self.bench_ok(["--url", "http://127.0.0.1:%d" % tt.port, "--concurrency", 1, "--requests", N_ACC,
                               "--output-len", 12, "--input-len", 64, "--sim-headers", "--model", "acc-model",
                               "--requests-log", log, "--json", js, "--no-progress",
                               "--compare-admin", "http://127.0.0.1:%d" % aport])
            client = read_jsonl(log)
            res = load_json(js)
            proxy = {}
            harness.wait_until(lambda: len(harness.read_access_log(access)) >= len(client), 5.0, 0.05)
            for e in harness.read_access_log(access):
                proxy[e["id"]] = e
            stats = harness.wait_until(
                lambda: (lambda s: s if s["series"] and s["series"][0]["requests"] >= N_ACC else None)(
                    get_json(aport, "/stats?window=5m")), 5.0, 0.1)
        finally:
            harness._stop_and_check(tt)
        self.assertIsNotNone(stats, "tokentap's /stats never showed the %d requests" % N_ACC)
        self.assertIn("client vs tokentap", p.stdout)
        self.assertIn("compare_admin", res)

        # exact: every request matched by id, token counts equal
        self.assertEqual(len(client), N_ACC)
        for c in client:
            self.assertIn(c["id"], proxy, "request %s missing from tokentap's access log" % c["id"])
            e = proxy[c["id"]]
            self.assertEqual(c["output_tokens"], e["output_tokens"], (c, e))
            self.assertEqual(c["input_tokens"], e["input_tokens"], (c, e))
            self.assertEqual(c["token_events"], e["token_events"], (c, e))
            self.assertEqual(c["itl_count"], e["itl_count"], (c, e))
            self.assertEqual(len(c["itl_ms"]), len(e["itl_ms"]), (c, e))
            self.assertEqual(len(c["itl_ms"]), c["itl_count"], c)
        series = stats["series"]
        self.assertEqual(len(series), 1, series)
        s = series[0]
        self.assertEqual(s["requests"], N_ACC)
        self.assertEqual(s["model"], "acc-model")
        self.assertEqual(s["output_tokens"], res["result"]["output_tokens"])
        self.assertEqual(s["metrics"]["itl"]["count"], res["result"]["metrics"]["itl"]["count"])

        # timing: may be retried (scheduling noise)
        problems = []
        for c in client:
            e = proxy[c["id"]]
            if abs(c["ttft_ms"] - e["ttft_ms"]) > TOL_MS:
                problems.append("%s: ttft client %.3f tokentap %.3f" % (c["id"], c["ttft_ms"], e["ttft_ms"]))
        cm, tm = res["result"]["metrics"], s["metrics"]
        for q in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms"):
            a, b = cm["ttft"][q], tm["ttft"][q]
            if abs(a - b) > TOL_MS + HIST_ERR * max(a, b):
                problems.append("ttft %s: client %.3f tokentap %.3f" % (q, a, b))
            a, b = cm["itl"][q], tm["itl"][q]
            if abs(a - b) > TOL_MS + HIST_ERR * max(a, b):
                problems.append("itl %s: client %.3f tokentap %.3f" % (q, a, b))
        return problems

    def test_client_and_tokentap_agree(self):
        sim = harness.start_sim(self, "--ttft-ms", 20, "--itl-ms", 5)
        problems = None
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(min(0.5 * attempt, 2.0))  # let a burst of load from elsewhere pass
            problems = self.one_attempt(sim)
            if not problems:
                return
        self.fail("client and tokentap disagree beyond %.1f ms in every attempt; last: %s" % (TOL_MS, problems))


class Connections(BenchCase):
    """Keep-alive by default; --new-connection: a connection per request,
    each request saying Connection: close."""

    @staticmethod
    def answer(sock, req, ctx):
        body = b'{"choices":[{"message":{"content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(body), body))
        return True  # the server would keep it: closing is the client's choice

    def run_against(self, *extra):
        fu = harness.start_fake_upstream(self, self.answer)
        out = self.tmp("r.json")
        self.bench_ok(["--url", fu.url, "--no-stream", "--concurrency", 2, "--requests", 12, "--warmup", 0,
                       "--no-progress", "--json", out, *extra])
        res = load_json(out)["result"]
        self.assertEqual(res["requests"]["ok"], 12, res)
        return fu

    def test_keep_alive_by_default(self):
        fu = self.run_against()
        self.assertEqual(fu.accepted, 2, "two closed-loop connections, kept")
        self.assertTrue(all(r.header("connection") is None for r in fu.requests))

    def test_new_connection_per_request(self):
        fu = self.run_against("--new-connection")
        self.assertEqual(fu.accepted, 12, "one connection per request")
        self.assertEqual([r.header("connection") for r in fu.requests], ["close"] * 12)


class OpenLoopAndSweep(BenchCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", 5, "--itl-ms", 2)

    def test_poisson_arrivals_send_rate_times_duration(self):
        rate, dur = 40, 2.0
        js = self.tmp("o.json")
        before = self.sim.stats()["requests"]
        self.bench_ok(["--url", self.sim.url, "--rate", rate, "--duration", "%gs" % dur, "--output-len", 4,
                       "--sim-headers", "--json", js, "--no-progress", "--seed", 7])
        res = load_json(js)["result"]
        n = res["requests"]["started"]
        expect = rate * dur  # poisson: sd = sqrt(80) ~ 9
        self.assertGreaterEqual(n, expect - 30, res)
        self.assertLessEqual(n, expect + 30, res)
        self.assertEqual(res["mode"], "open")
        self.assertEqual(res["requests"]["ok"], n)
        self.assertEqual(self.sim.stats()["requests"] - before, n)

    def test_gamma_arrivals_and_warmup(self):
        js = self.tmp("o.json")
        self.bench_ok(["--url", self.sim.url, "--rate", 50, "--arrivals", "gamma", "--burstiness", "0.5",
                       "--requests", 30, "--warmup", 5, "--output-len", 3, "--json", js, "--no-progress"])
        res = load_json(js)["result"]
        self.assertEqual(res["requests"]["ok"], 30)
        self.assertEqual(res["warmup"]["requests"]["ok"], 5)

    def test_sweep_writes_json_and_svg_with_knee(self):
        js, svg = self.tmp("sweep.json"), self.tmp("sweep.svg")
        p = self.bench_ok(["--url", self.sim.url, "--sweep", "1,2,4", "--requests", 8, "--output-len", 4,
                           "--sim-headers", "--json", js, "--svg", svg, "--no-progress"])
        d = load_json(js)
        self.assertEqual([s["concurrency"] for s in d["steps"]], [1, 2, 4])
        for s in d["steps"]:
            self.assertEqual(s["result"]["requests"]["ok"], 8)
            self.assertGreater(s["requests_per_s"], 0)
            self.assertIsNotNone(s["ttft_p50_ms"])
            self.assertIsNotNone(s["ttft_p99_ms"])
        self.assertIsNotNone(d["knee"])
        self.assertIn(d["knee"]["concurrency"], [1, 2, 4])
        self.assertEqual(sum(s["knee"] for s in d["steps"]), 1)
        root = ET.parse(svg).getroot()
        self.assertTrue(root.tag.endswith("svg"), root.tag)
        ids = {e.get("id") for e in root.iter()}
        for want in ("knee", "throughput", "ttft-p50", "ttft-p99", "y-left", "y-right"):
            self.assertIn(want, ids)
        knee = next(e for e in root.iter() if e.get("id") == "knee")
        self.assertEqual(knee.get("data-concurrency"), str(d["knee"]["concurrency"]))
        self.assertIn("<- knee", p.stdout)

    def test_sigint_stops_and_reports(self):
        proc = subprocess.Popen([harness.bench_bin(), "--url", self.sim.url, "--concurrency", "2", "--duration", "30s",
                                 "--output-len", "50", "--sim-headers", "--no-progress"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            time.sleep(1.0)
            os.kill(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(3)
        self.assertEqual(proc.returncode, 130, err)
        self.assertIn("INTERRUPTED", out)
        self.assertRegex(out, r"requests:\s+\d+ ok")


class CommandLine(BenchCase):
    def test_bad_flags_exit_2_naming_the_flag(self):
        cases = [
            (["--concurrency", "0"], "--concurrency"),
            (["--concurrency", "x"], "--concurrency"),
            (["--rate", "-3"], "--rate"),
            (["--api", "grpc"], "--api"),
            (["--input-len", "weird:3"], "--input-len"),
            (["--output-len", "uniform:9:2"], "--output-len"),
            (["--output-len", "file:/nonexistent/lengths"], "--output-len"),
            (["--duration", "soon"], "--duration"),
            (["--url", "ftp://127.0.0.1:1"], "--url"),
            (["--url", "http://127.0.0.1:99999"], "--url"),
            (["--header", "NoColon"], "--header"),
            (["--sweep", "4,2"], "--sweep"),
            (["--svg", "x.svg"], "--svg"),
            (["--concurrency", "2", "--rate", "3"], "--rate"),
            (["--arrivals", "gamma"], "--arrivals"),
            (["--arrivals", "weibull", "--rate", "1"], "--arrivals"),
            (["--bogus"], "--bogus"),
            (["--requests"], "--requests"),
        ]
        for args, flag in cases:
            with self.subTest(args=args):
                p = run_bench(args, 10)
                self.assertEqual(p.returncode, 2, "args %r: rc %d, stderr %r" % (args, p.returncode, p.stderr))
                self.assertIn(flag, p.stderr)
                self.assertEqual(p.stdout, "")

    def test_help_and_version(self):
        p = run_bench(["--help"], 10)
        self.assertEqual(p.returncode, 0)
        for flag in ("--concurrency", "--rate", "--sweep", "--compare-admin", "--requests-log", "--warmup"):
            self.assertIn(flag, p.stdout)
        p = run_bench(["--version"], 10)
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"^tokentap-bench \d+\.\d+")

    def test_unreachable_server_exits_1(self):
        port = harness.free_port()
        p = run_bench(["--url", "http://127.0.0.1:%d" % port, "--requests", 5, "--no-progress"], 10)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("cannot connect", p.stderr)


if __name__ == "__main__":
    unittest.main()
