"""test_workload.py — the workload capture (--workload) and its replay
(tokentap-bench --replay), over real sockets: tokentap-bench against the
simulator through tokentap writes a trace whose count and lengths are the
access log's exactly and whose arrival rate is the one sent; requests built
with a shared system prompt share their first hash ids; no prompt word or
session value reaches the file, in any spelling, and two starts of tokentap
share no session hash (a fresh salt each start); an unwritable path is
reported and requests are forwarded as ever. Replaying a captured trace against the simulator
reproduces its arrival rate within 5 % and its lengths exactly; replaying a
hand-written Mooncake trace through a capturing tokentap gives back the same
prefix sharing, and the simulator's prefix cache reports as cached exactly
the longest prefix each request shares with an earlier one."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import harness
import routing_helpers as rh

RATE_TOL = 0.05  # replayed arrival rate against the trace's
# Under ASan, tokentap-bench's own timers run late by tens of ms on a busy
# 2-core machine (seen: 5.3 % and 15 % off at a load of 15, in 2 of 5 runs
# of the 0.75 s --speed 2 replay); the normal build keeps 5 %.
REPLAY_TOL = 0.25 if harness.is_sanitized() else RATE_TOL
BLOCK = 16  # tokens per hash block in these tests (64 bytes of prompt text)
RUN_TIMEOUT_S = 60


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def rate_of(times_ms):
    times_ms = sorted(times_ms)
    return (len(times_ms) - 1) / ((times_ms[-1] - times_ms[0]) / 1000.0)


class WorkloadCase(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-workload-it-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def bench(self, args):
        p = subprocess.run([harness.bench_bin()] + [str(a) for a in args] + ["--no-progress"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=RUN_TIMEOUT_S, text=True, start_new_session=True)
        self.assertEqual(p.returncode, 0, "tokentap-bench %r exited %d: %s" % (args, p.returncode, p.stderr[-2000:]))
        return p

    def capturing(self, sim, *extra):
        trace, alog = self.path("trace.jsonl"), self.path("access.jsonl")
        tt = harness.start_tokentap(self, sim.url, "--workers", 1, "--data-dir", "off", "--workload", trace,
                                    "--workload-block-tokens", BLOCK, "--access-log", alog, *extra)
        return tt, trace, alog

    def wait_lines(self, path, n):
        harness.wait_until(lambda: len(read_jsonl(path)) >= n, timeout=10)
        lines = read_jsonl(path)
        self.assertEqual(len(lines), n, "%s: %d lines, expected %d" % (path, len(lines), n))
        return lines


class Capture(WorkloadCase):
    def test_trace_matches_access_log_and_load(self):
        sim = harness.start_sim(self, "--ttft-ms", 5, "--itl-ms", 2)
        tt, trace, alog = self.capturing(sim, "--admin", "127.0.0.1:0")
        n, rate = 40, 25.0
        log = self.path("bench.jsonl")
        self.bench(["--url", "http://127.0.0.1:%d" % tt.port, "--rate", rate, "--requests", n, "--input-len",
                    "uniform:10:300", "--output-len", "uniform:1:12", "--sim-headers", "--requests-log", log])
        recs = self.wait_lines(trace, n)
        acc = self.wait_lines(alog, n)
        sent = read_jsonl(log)
        # one worker: both are written at the request's end, in the same order
        self.assertEqual([(r["input_length"], r["output_length"]) for r in recs],
                         [(a["input_tokens"], a["output_tokens"]) for a in acc])
        self.assertEqual(sorted((r["input_length"], r["output_length"], r["max_tokens"]) for r in recs),
                         sorted((s["input_len"], s["output_len"], s["output_len"]) for s in sent))
        for r in recs:
            self.assertEqual(r["outcome"], "ok", r)
            self.assertEqual(r["api"], "openai-chat")
            self.assertIs(r["stream"], True)
            self.assertEqual(r["route"], "default")
            self.assertIsNone(r["session"])
            self.assertGreater(r["ttft_ms"], 0)
            self.assertGreaterEqual(r["e2e_ms"], r["ttft_ms"])
            # the prompt's JSON string and its separator, in blocks of 64 bytes
            self.assertEqual(len(r["hash_ids"]), (r["input_length"] * 4 + 1 + BLOCK * 4 - 1) // (BLOCK * 4), r)
        # every prompt differs from its first byte: no id is shared
        ids = [i for r in recs for i in r["hash_ids"]]
        self.assertEqual(len(ids), len(set(ids)))
        self.assertEqual(sorted(ids), list(range(len(ids))), "ids numbered from 0 in order of first appearance")
        # arrivals: the trace's rate is the one the client measured sending
        # (both clocks: ms in the trace, µs in the client's log)
        got, sent_rate = rate_of([r["timestamp"] for r in recs]), rate_of([s["start_ms"] for s in sent])
        self.assertLess(abs(got - sent_rate) / sent_rate, RATE_TOL, (got, sent_rate))
        # GET /workload: the same numbers from the capture's own counters
        resp, _ = harness.exchange(harness.admin_port(tt), "GET", "/workload")
        self.assertEqual(resp.status, 200)
        s = resp.json()
        self.assertEqual(s["records"], n)
        self.assertAlmostEqual(s["arrival_rate"], got, delta=0.01 * got)
        ins = sorted(r["input_length"] for r in recs)
        self.assertEqual(s["input_length"]["p50"], ins[n // 2 - 1])  # nearest rank
        self.assertEqual(s["input_length"]["max"], ins[-1])
        self.assertEqual(s["output_length"]["max"], max(r["output_length"] for r in recs))
        self.assertEqual(s["prefix_blocks"], len(ids))
        self.assertEqual(s["prefix_sharing_ratio"], 0)
        gaps = [b - a for a, b in zip(sorted(r["timestamp"] for r in recs), sorted(r["timestamp"] for r in recs)[1:])]
        mean = sum(gaps) / len(gaps)
        cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
        self.assertAlmostEqual(s["interarrival_cv"], cv, delta=0.01)

    def test_conversations_turns_and_previous(self):
        """tokentap-bench --sessions resends each conversation's history; the
        capture links every turn to the one before it (record, previous,
        turn, conversation), keeps sessions that share a system prompt
        apart, and does not take a retried prompt for a new turn."""
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        tt, trace, _ = self.capturing(sim)
        S, T = 4, 3
        log = self.path("bench.jsonl")
        self.bench(["--url", "http://127.0.0.1:%d" % tt.port, "--sessions", S, "--turns", T,
                    "--system-prompts", 2, "--system-len", 100, "--input-len", 20, "--output-len", 6,
                    "--sim-headers", "--concurrency", 1, "--requests-log", log])
        recs = self.wait_lines(trace, S * T)
        sent = sorted(read_jsonl(log), key=lambda r: r["seq"])
        # one connection, one worker: records in sending order
        self.assertEqual([r["record"] for r in recs], list(range(S * T)))
        at = {(b["session"], b["turn"]): k for k, b in enumerate(sent)}
        for k, (r, b) in enumerate(zip(recs, sent)):
            self.assertEqual(r["input_length"], b["input_len"])
            self.assertEqual(r["turn"], b["turn"], (k, r))
            if b["turn"] == 0:
                self.assertIsNone(r["previous"], "a first turn, though sessions share the system prompt")
                self.assertEqual(r["conversation"], k)
            else:
                self.assertEqual(r["previous"], at[(b["session"], b["turn"] - 1)], "the session's previous turn")
                self.assertEqual(r["conversation"], at[(b["session"], 0)])
        # the last prompt sent again: the same turn's retry, not the next turn
        last = recs[-1]
        body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 2}
        for _ in range(2):
            resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body)
            self.assertEqual(resp.status, 200)
        a, b = self.wait_lines(trace, S * T + 2)[-2:]
        self.assertEqual((a["turn"], b["turn"]), (0, 0), "a retry is no new turn")
        self.assertIsNone(b["previous"])
        self.assertNotEqual(last["conversation"], a["conversation"])

    def test_shared_prefix_and_no_prompt_text(self):
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        tt, trace, _ = self.capturing(sim)
        system = ("You are Quixotic Marmalade, an assistant for the Zanzibar lighthouse archive; answer "
                  "briefly, cite the ledger page, and never speculate about the keepers' families.")
        users = ["Which keeper logged the storm of eighteen ninety?",
                 "Summarise the pelican incident in the western gallery.",
                 "Who repaired the clockwork lens mechanism?"]
        for u in users:
            body = {"model": "m1", "stream": False, "max_tokens": 3, "user": "customer-walrus-42",
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": u}]}
            resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body)
            self.assertEqual(resp.status, 200)
        recs = self.wait_lines(trace, 3)
        shared = len(system) // (BLOCK * 4)  # whole blocks inside the system prompt
        self.assertGreaterEqual(shared, 2)
        for a in recs:
            for b in recs:
                if a is not b:
                    self.assertEqual(common_prefix(a["hash_ids"], b["hash_ids"]), shared, (a, b))
        self.assertEqual([r["max_tokens"] for r in recs], [3, 3, 3])
        self.assertEqual(len({r["session"] for r in recs}), 1)
        self.assertRegex(recs[0]["session"], r"^[0-9a-f]{16}$")
        with open(trace) as f:
            text = f.read().lower()
        words = {w.strip(".,;?'").lower() for w in (system + " " + " ".join(users)).split()}
        for w in sorted(words):
            if len(w) >= 5:
                self.assertNotIn(w, text, "a prompt word in the trace")
        self.assertNotIn("walrus", text)

    def test_fresh_salt_per_start_and_no_encoding_of_the_prompt(self):
        # the same traffic captured by two starts of tokentap: the session
        # hashes cannot be joined (a salt drawn at each start, never a fixed
        # one), and the file holds the prompt in no spelling: not as sent,
        # not upper case, not as the JSON escapes a client may send, not in
        # hex or base64
        import base64
        import hashlib
        system = "Marzipan Orchestra Lighthouse Keeper Protocol, revision eleven, for the harbour"
        user = "customer-walrus-42"
        escaped = "".join("\\u%04x" % ord(c) for c in "Quixotic pelican")
        bodies = [
            '{"model":"m1","max_tokens":2,"user":"%s","messages":[{"role":"system","content":"%s"},'
            '{"role":"user","content":"turn %d of the talk"}]}' % (user, system, k) for k in range(3)]
        bodies.append('{"model":"m1","max_tokens":2,"user":"%s","messages":[{"role":"user","content":"%s"}]}'
                      % (user, escaped))
        sessions, texts = [], []
        for run in range(2):
            sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
            trace = self.path("trace-%d.jsonl" % run)
            tt = harness.start_tokentap(self, sim.url, "--workers", 1, "--data-dir", "off", "--workload", trace,
                                        "--workload-block-tokens", BLOCK)
            for b in bodies:
                resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", b)
                self.assertEqual(resp.status, 200)
            recs = self.wait_lines(trace, len(bodies))
            tt.stop()
            got = {r["session"] for r in recs}
            self.assertEqual(len(got), 1, recs)  # one user, one hash within a capture
            sessions.append(got.pop())
            with open(trace, "rb") as f:
                texts.append(f.read())
        self.assertNotEqual(sessions[0], sessions[1], "two captures share a session hash: the salt is not fresh")
        # nor is it a hash anyone could compute: no salt, or a salt of zeros
        for salt in (b"", b"\0" * 16):
            for tag in (b"session", b""):
                guess = hashlib.sha256(salt + tag + user.encode()).hexdigest()[:16]
                self.assertNotIn(guess, sessions)
        words = [w for w in (system + " Quixotic pelican turn talk " + user).replace(",", " ").split() if len(w) >= 5]
        for text in texts:
            spellings = []
            for w in words:
                spellings += [w, w.lower(), w.upper(), w.encode().hex(),
                              base64.b64encode(w.encode()).decode().rstrip("="),
                              "".join("\\u%04x" % ord(c) for c in w)]
            spellings.append(escaped)
            for sp in spellings:
                self.assertNotIn(sp.encode(), text, "%r in the trace" % sp)
                self.assertNotIn(sp.lower().encode(), text.lower(), "%r in the trace" % sp)

    def test_unwritable_path_is_reported_and_forwarding_goes_on(self):
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        bad = os.path.join(self.dir, "no-such-dir", "trace.jsonl")
        tt = harness.start_tokentap(self, sim.url, "--data-dir", "off", "--workload", bad)
        for _ in range(5):
            body = {"stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
            resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body)
            self.assertEqual(resp.status, 200)
            self.assertIn(b"[DONE]", resp.body)
        self.assertTrue(harness.wait_until(lambda: "records are dropped" in tt.stderr_text(), timeout=5),
                        tt.stderr_text())
        self.assertTrue(tt.alive())
        self.assertFalse(os.path.exists(bad))


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path)
    assert resp.status == 200, (path, resp.status, resp.body)
    return resp.json()


def nearest_rank(values, q):
    v = sorted(values)
    k = -(-int(q * 100) * len(v) // 100)  # ceil(q n), exact for q in hundredths
    return v[max(k, 1) - 1]


class Summary(WorkloadCase):
    """GET /workload per route and model: two routes (by Host), two models,
    streamed and not, sequential and concurrent requests; each selection's
    numbers against the trace file itself."""

    def start(self, sim):
        trace = self.path("trace.jsonl")
        body = (rh.upstreams_yaml({"sim": sim.url}) +
                "routes:\n"
                "  - {name: r1, match: {host: r1.test}, upstream: sim}\n"
                "  - {name: r2, match: {host: r2.test}, upstream: sim}\n"
                "admin: {listen: 127.0.0.1:0}\n"
                "workload: {path: %s, block_tokens: %d}\n" % (trace, BLOCK))
        tt = rh.ConfTokentap(body, "--workers", 1)
        self.addCleanup(lambda: harness._stop_and_check(tt))
        return tt, trace, harness.admin_port(tt)

    def send(self, tt, host, model, stream, words):
        body = {"model": model, "stream": stream, "max_tokens": 2 + words % 5,
                "messages": [{"role": "user", "content": " ".join("w%d" % i for i in range(words))}]}
        resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body, headers={"Host": host})
        self.assertEqual(resp.status, 200, resp.body)

    def check_selection(self, s, recs):
        """A selection's summary against its records from the file."""
        self.assertEqual(s["records"], len(recs))
        self.assertEqual(s["window_records"], len(recs))
        self.assertAlmostEqual(s["stream_share"], sum(r["stream"] for r in recs) / len(recs), places=9)
        ins, outs = [r["input_length"] for r in recs], [r["output_length"] for r in recs]
        for key, vals in (("input_length", ins), ("output_length", outs)):
            d = s[key]
            self.assertEqual(d["max"], max(vals), key)
            self.assertEqual(d["p50"], nearest_rank(vals, 0.5), key)
            self.assertEqual(d["p90"], nearest_rank(vals, 0.9), key)
            self.assertEqual(sum(b["count"] for b in d["histogram"]), len(vals))
            for b in d["histogram"]:
                self.assertEqual(b["count"], sum(1 for v in vals if b["le"] // 2 < v <= b["le"]
                                                 or (b["le"] == 1 and v <= 1)), (key, b))
        self.assertEqual(sum(s["arrivals"]["counts"]), len(recs))
        ts = sorted(r["timestamp"] for r in recs)
        if len(ts) > 2:
            # the file's timestamps are whole ms, the summary's µs: the span
            # agrees within 1 ms
            span = ts[-1] - ts[0]
            lo, hi = (len(ts) - 1) / ((span + 1) / 1000.0), (len(ts) - 1) / (max(span - 1, 0.5) / 1000.0)
            self.assertTrue(lo * 0.999 <= s["arrival_rate"] <= hi * 1.001, (s["arrival_rate"], lo, hi, ts))
        ids = [i for r in recs for i in r["hash_ids"]]
        self.assertEqual(s["prefix_blocks"], len(ids))

    def test_by_route_and_model(self):
        sim = harness.start_sim(self, "--ttft-ms", 2, "--itl-ms", 1)
        tt, trace, port = self.start(sim)
        plan = [("r1.test", "m-a", True)] * 6 + [("r1.test", "m-b", False)] * 4 + [("r2.test", "m-a", True)] * 3
        for i, (host, model, stream) in enumerate(plan):
            self.send(tt, host, model, stream, 20 + 37 * i)
        recs = self.wait_lines(trace, len(plan))
        self.assertEqual(sorted({(r["route"], r["model"]) for r in recs}),
                         [("r1", "m-a"), ("r1", "m-b"), ("r2", "m-a")])
        every = get_json(port, "/workload")
        self.check_selection(every, recs)
        self.assertEqual({e["route"]: e["records"] for e in every["by_route"]}, {"r1": 10, "r2": 3})
        self.assertEqual({e["model"]: e["records"] for e in every["by_model"]}, {"m-a": 9, "m-b": 4})
        for q, pick in (("route=r1", lambda r: r["route"] == "r1"), ("model=m-a", lambda r: r["model"] == "m-a"),
                        ("route=r1&model=m-b", lambda r: r["route"] == "r1" and r["model"] == "m-b")):
            s = get_json(port, "/workload?" + q)
            self.check_selection(s, [r for r in recs if pick(r)])
            # one request at a time: each arrival found only itself in flight
            self.assertEqual(s["concurrency"]["max"], 1, q)
        for e in every["by_route"] + every["by_model"]:
            key = "route" if "route" in e else "model"
            self.check_selection(e, [r for r in recs if r[key] == e[key]])
        s = get_json(port, "/workload?route=r1&model=m-b")
        self.assertEqual(s["stream_share"], 0)
        self.assertEqual(s["filter"], {"route": "r1", "model": "m-b"})
        s = get_json(port, "/workload?route=nope")
        self.assertEqual((s["records"], s["by_route"], s["arrival_rate"]), (0, [], None))
        resp, _ = harness.exchange(port, "GET", "/workload?rout=r1")
        self.assertJsonError(resp, 400)
        # the capture's counters in /metrics
        resp, _ = harness.exchange(port, "GET", "/metrics")
        self.assertIn("tokentap_workload_written_total %d\n" % len(plan), resp.body.decode())
        self.assertIn('tokentap_workload_dropped_total{reason="no_space"} 0\n', resp.body.decode())

    def test_concurrency_at_arrival(self):
        # eight requests at once to a simulator that answers after 300 ms:
        # the k-th arrival finds k in flight, itself included
        sim = harness.start_sim(self, "--ttft-ms", 300, "--itl-ms", 1)
        tt, trace, port = self.start(sim)
        threads = [threading.Thread(target=self.send, args=(tt, "r1.test", "m-a", True, 30)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        recs = self.wait_lines(trace, 8)
        ts = sorted(r["timestamp"] for r in recs)
        self.assertLess(ts[-1] - ts[0], 250, "the arrivals did not overlap: %r" % ts)
        c = get_json(port, "/workload?route=r1")["concurrency"]
        self.assertEqual(c["max"], 8, c)
        self.assertEqual(c["p50"], 4, c)
        self.assertEqual(c["mean"], 4.5, c)
        self.assertEqual([(b["le"], b["count"]) for b in c["histogram"]], [(1, 1), (2, 1), (4, 2), (8, 4)])
        # none on the other route
        self.assertIsNone(get_json(port, "/workload?route=r2")["concurrency"]["max"])


class Scraped(WorkloadCase):
    def test_prometheus_reads_the_capture_counters(self):
        # two real Prometheus processes: one asks for the protobuf
        # exposition (native histograms on), one for the text format; both
        # must see the capture's counters
        from test_prometheus import prom_query, start_prometheus
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        tt, trace, _ = self.capturing(sim, "--admin", "127.0.0.1:0")
        port = harness.admin_port(tt)
        for _ in range(3):
            body = {"stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "count me"}]}
            resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body)
            self.assertEqual(resp.status, 200)
        self.wait_lines(trace, 3)
        proms = [start_prometheus(self, self.dir, [port], flags, interval="250ms", name=name)[1]
                 for name, flags in (("native", ["--enable-feature=native-histograms"]), ("classic", []))]
        for prom, name in zip(proms, ("native", "classic")):
            ok = harness.wait_until(lambda: prom_query(prom, "tokentap_workload_written_total") == 3, 20, 0.25)
            self.assertTrue(ok, "%s Prometheus: tokentap_workload_written_total is %r"
                            % (name, prom_query(prom, "tokentap_workload_written_total")))
            for reason in ("queue_full", "no_space", "write_error", "open_error"):
                self.assertEqual(prom_query(prom, 'tokentap_workload_dropped_total{reason="%s"}' % reason), 0,
                                 (name, reason))
            # the store's families are there too: nothing was lost beside them
            self.assertEqual(prom_query(prom, "sum(tokentap_requests_total)"), 3, name)


class Replay(WorkloadCase):
    def test_captured_trace_replayed_against_the_simulator(self):
        sim = harness.start_sim(self, "--ttft-ms", 5, "--itl-ms", 2)
        tt, trace, _ = self.capturing(sim)
        n = 40
        self.bench(["--url", "http://127.0.0.1:%d" % tt.port, "--rate", 20, "--requests", n, "--input-len",
                    "uniform:10:300", "--output-len", "uniform:1:12", "--sim-headers"])
        recs = sorted(self.wait_lines(trace, n), key=lambda r: r["timestamp"])
        target = harness.start_sim(self, "--ttft-ms", 5, "--itl-ms", 2)
        log = self.path("replay.jsonl")
        p = self.bench(["--url", target.url, "--replay", trace, "--block-tokens", BLOCK, "--sim-headers",
                        "--requests-log", log])
        self.assertIn("trace", p.stdout)
        got = sorted(read_jsonl(log), key=lambda r: r["seq"])
        self.assertEqual(len(got), n)
        self.assertEqual(target.stats()["completed"], n)
        # seq k is the trace's k-th arrival: the simulator's own counts
        for r, g in zip(recs, got):
            self.assertTrue(g["ok"], g)
            self.assertEqual(g["input_tokens"], r["input_length"], (r, g))
            self.assertEqual(g["output_tokens"], r["output_length"], (r, g))
        want, have = rate_of([r["timestamp"] for r in recs]), rate_of([g["start_ms"] for g in got])
        self.assertLess(abs(have - want) / want, REPLAY_TOL, (have, want))
        # --speed 2 and --limit: the first 30, twice as fast (a span of
        # about 0.75 s: a few ms of timer lateness stay well inside 5 %)
        log2 = self.path("replay2.jsonl")
        self.bench(["--url", target.url, "--replay", trace, "--block-tokens", BLOCK, "--sim-headers", "--speed", 2,
                    "--limit", 30, "--requests-log", log2])
        got2 = sorted(read_jsonl(log2), key=lambda r: r["seq"])
        self.assertEqual(len(got2), 30)
        want2, have2 = rate_of([r["timestamp"] for r in recs[:30]]) * 2, rate_of([g["start_ms"] for g in got2])
        self.assertLess(abs(have2 - want2) / want2, REPLAY_TOL, (have2, want2))

    def test_mooncake_trace_prefixes_come_back(self):
        # a hand-written trace in Mooncake's shape: conversations that share
        # a system prompt (ids 0-2) and grow turn by turn
        trace = self.path("mooncake.jsonl")
        rows, nxt, convs = [], 3, {}
        for k in range(30):
            c = k % 5
            turn = convs.setdefault(c, [0, 1, 2])
            turn += [nxt, nxt + 1]
            nxt += 2
            rows.append({"timestamp": 1000 + k * 40, "input_length": len(turn) * BLOCK,
                         "output_length": 2 + k % 7, "hash_ids": list(turn)})
        with open(trace, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        # the simulator's prefix cache remembers prompts in 16-token blocks,
        # as BLOCK here: what it reports cached is the sharing replayed
        sim = harness.start_sim(self, "--ttft-ms", 2, "--itl-ms", 1, "--prefix-cache")
        tt, again, _ = self.capturing(sim)
        self.bench(["--url", "http://127.0.0.1:%d" % tt.port, "--replay", trace, "--block-tokens", BLOCK,
                    "--sim-headers"])
        recs = sorted(self.wait_lines(again, len(rows)), key=lambda r: r["timestamp"])
        for r, w in zip(recs, rows):
            self.assertEqual(r["input_length"], w["input_length"])
            self.assertEqual(r["output_length"], w["output_length"])
            self.assertEqual(r["max_tokens"], w["output_length"])
            # the prompt is the blocks' text and a separator byte: one more block
            self.assertEqual(len(r["hash_ids"]), len(w["hash_ids"]) + 1)
        for i, (r, w) in enumerate(zip(recs, rows)):
            longest = max([common_prefix(w["hash_ids"], x["hash_ids"]) for x in rows[:i]] or [0])
            self.assertEqual(r["cached_tokens"], longest * BLOCK, (i, r, w))
        for i, (ra, wa) in enumerate(zip(recs, rows)):
            for rb, wb in zip(recs[i + 1:], rows[i + 1:]):
                self.assertEqual(common_prefix(ra["hash_ids"], rb["hash_ids"]),
                                 common_prefix(wa["hash_ids"], wb["hash_ids"]), (wa, wb))
        want, have = rate_of([w["timestamp"] for w in rows]), rate_of([r["timestamp"] for r in recs])
        self.assertLess(abs(have - want) / want, RATE_TOL, (have, want))

    def test_bad_trace_and_flags(self):
        bad = self.path("bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]}\n{"oops": 1}\n')
        for args, flag in ((["--replay", bad], "line 2"), (["--replay", self.path("none")], "cannot open"),
                           (["--replay", bad, "--rate", 3], "--replay"), (["--speed", 2], "--speed")):
            p = subprocess.run([harness.bench_bin()] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(flag, p.stderr)


if __name__ == "__main__":
    unittest.main()
