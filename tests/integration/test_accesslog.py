"""test_accesslog.py — the access log's numbers agree with what a client
measures on its own socket: TTFT and every inter-token gap within 1 ms (of
what the client can know: LogChecks.timing_problems), token
counts exact, request ids propagated, the timeline ordered and the derived
metrics consistent with their definitions in docs/metrics.md."""

import gc
import gzip
import json
import os
import re
import signal
import tempfile
import time
import unittest

import harness

TOL_MS = 1.0  # client-measured vs logged timings
ATTEMPTS = 3  # timing comparisons only; see LogChecks.check_timing
ROUND_MS = 0.003  # logged values are ms with µs precision

TIMELINE = ["arrive", "req_headers", "dispatch", "up_connected", "req_sent", "resp_headers",
            "first_event", "first_token", "first_reasoning", "last_reasoning", "first_answer", "last_token", "resp_end",
            "client_done"]

KIND_MARKS = ["first_reasoning", "last_reasoning", "first_answer"]

REQUIRED_KEYS = ["id", "method", "path", "api", "model", "stream", "status", "error", "input_tokens",
                 "output_tokens", "events", "token_events", "ttft_ms", "upstream_ttft_ms", "ttfb_ms", "e2e_ms",
                 "tpot_ms", "queue_ms", "connect_ms", "decode_tps", "itl_ms", "timeline_ms"]


def measure(port, api, path, body, headers):
    """Sends one request on a fresh TCP_NODELAY connection and reads the whole
    response, timestamping bytes as they arrive (kernel receive timestamps, so
    this process's own wake-up latency does not count). `sent` is (ns just
    before the first request byte is written, ns once the write returned):
    on loopback the request reaches tokentap's socket within that window.
    Returns (resp, sent, events, token events)."""
    conn = harness.HttpConn(port, kernel_ts=True)
    try:
        raw = harness.request_bytes("POST", path, body, headers, port)
        gc.collect()
        gc.disable()
        try:
            t0 = conn.send(raw)
            sent = (t0, harness.now_ns())
            resp = conn.read_response()
        finally:
            gc.enable()
    finally:
        conn.close()
    evs = harness.events_of(resp) if resp.status == 200 and body.get("stream", True) is not False else []
    toks = [e for e in evs if harness.is_token_event(api, e)]
    return resp, sent, evs, toks


class LogChecks(harness.TestCase):
    """Checks shared by the suites below (no tests of its own)."""

    log = None

    def entry(self, rid, log=None):
        log = log or self.log
        e = self.log_entry(log, rid)
        for k in REQUIRED_KEYS:
            self.assertIn(k, e, "access log line lacks %r: %r" % (k, e))
        for k in TIMELINE:
            self.assertIn(k, e["timeline_ms"], "timeline lacks %r" % k)
        return e

    def check_timeline(self, e, streamed=True):
        tl = e["timeline_ms"]
        self.assertAlmostEqual(tl["arrive"], 0.0, delta=ROUND_MS)
        present = [(k, tl[k]) for k in TIMELINE if tl[k] is not None and k not in KIND_MARKS]
        for (ka, a), (kb, b) in zip(present, present[1:]):
            self.assertLessEqual(a, b + ROUND_MS, "timeline %s=%r after %s=%r" % (ka, a, kb, b))
        # what the token events carried: in any order among themselves
        # (reasoning may resume after the answer), within the token span
        for k in KIND_MARKS:
            if tl[k] is not None:
                self.assertGreaterEqual(tl[k] + ROUND_MS, tl["first_token"], k)
                self.assertLessEqual(tl[k], tl["last_token"] + ROUND_MS, k)
        must = ["arrive", "req_headers", "dispatch", "up_connected", "req_sent", "resp_headers", "resp_end",
                "client_done"]
        if streamed:
            must += ["first_event", "first_token", "last_token"]
        for k in must:
            self.assertIsNotNone(tl[k], "timeline %s not reached" % k)

    def check_derived(self, e, n_out):
        """The derived metrics follow from the timeline as design.md defines."""
        tl = e["timeline_ms"]
        near = lambda a, b, what: self.assertAlmostEqual(a, b, delta=ROUND_MS, msg=what)
        near(e["ttft_ms"], tl["first_token"] - tl["arrive"], "ttft = first_token - arrive")
        near(e["ttfb_ms"], tl["resp_headers"] - tl["arrive"], "ttfb = resp_headers - arrive")
        near(e["e2e_ms"], tl["resp_end"] - tl["arrive"], "e2e = resp_end - arrive")
        near(e["upstream_ttft_ms"], tl["first_token"] - tl["req_sent"], "upstream_ttft = first_token - req_sent")
        near(e["queue_ms"], tl["dispatch"] - tl["req_headers"], "queue = dispatch - req_headers")
        near(e["connect_ms"], tl["up_connected"] - tl["dispatch"], "connect = up_connected - dispatch")
        span = tl["last_token"] - tl["first_token"]
        self.assertAlmostEqual(sum(e["itl_ms"]), span, delta=ROUND_MS * (len(e["itl_ms"]) + 2),
                               msg="itl gaps add up to last_token - first_token")
        if n_out > 1:
            near(e["tpot_ms"], span / (n_out - 1), "tpot = (last_token - first_token) / (N - 1)")
            self.assertAlmostEqual(e["decode_tps"], (n_out - 1) / (span / 1000.0),
                                   delta=0.01 * e["decode_tps"], msg="decode_rate = (N - 1) / span")

    def timing_problems(self, e, sent, resp, toks):
        """Differences over TOL_MS between what the client knows of each token
        event's arrival and the log's ttft and gaps, as text (empty when they
        agree).

        The client knows an arrival exactly only for an event that ends its
        read (harness.read_ends): an event that shared a read with later bytes
        (this process was not running while they queued, and the kernel
        merged the segments under one stamp) arrived between the previous
        read's stamp and its own. Likewise the request reached tokentap
        within `sent`. So each event's logged time since `arrive` (ttft plus
        the gaps before it) must fall within what the client's bounds allow,
        and each gap between two exactly stamped events must agree."""
        out = []
        t0, t1 = sent
        ends = harness.read_ends(resp)
        stamps = sorted(ends)
        exact = [ends.get(t.ts) == t.end for t in toks]
        if e["ttft_ms"] is None or len(e["itl_ms"]) != len(toks) - 1:
            return ["log: ttft %r, %d itl samples for %d token events"
                    % (e["ttft_ms"], len(e["itl_ms"] or []), len(toks))]
        logged = e["ttft_ms"]
        for i, t in enumerate(toks):
            if i:
                logged += e["itl_ms"][i - 1]
            hi = (t.ts - t0) / 1e6
            if exact[i]:
                lo = (t.ts - t1) / 1e6
            else:  # after the previous read's stamp
                before = [s for s in stamps if s < t.ts]
                lo = (before[-1] - t1) / 1e6 if before else 0.0
            if not lo - TOL_MS <= logged <= hi + TOL_MS:
                out.append("token event %d: logged at %.3f ms, client saw it within %.3f .. %.3f ms%s"
                           % (i, logged, lo, hi, "" if exact[i] else " (a merged read)"))
        bad = []
        for i in range(len(toks) - 1):
            if exact[i] and exact[i + 1]:
                g = (toks[i + 1].ts - toks[i].ts) / 1e6
                if abs(g - e["itl_ms"][i]) > TOL_MS:
                    bad.append((i, round(g, 3), e["itl_ms"][i]))
        if bad:
            out.append("itl gaps off by more than %.1f ms (index, client, log): %r" % (TOL_MS, bad))
        return out

    def check_timing(self, run):
        """Runs `run(attempt)` -> (log entry, sent, response, client token
        events), which
        does its own strict checks, and compares timings within TOL_MS.

        Scheduling noise on a loaded machine only ever delays one side (a
        process woken late), so a run may be repeated, at most ATTEMPTS times
        in all; every run must agree exactly on everything else. A systematic
        error (wrong start point, wrong event, batching) fails every run."""
        report = []
        for attempt in range(ATTEMPTS):
            e, sent, resp, toks = run(attempt)
            problems = self.timing_problems(e, sent, resp, toks)
            if not problems:
                return
            report.append("attempt %d: %s" % (attempt + 1, "; ".join(problems)))
        self.fail("client and access log timings disagree in every attempt:\n" + "\n".join(report))


class AccessLogTest(LogChecks):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "3")
        fd, cls.log = tempfile.mkstemp(prefix="tokentap-it-", suffix=".log")
        os.close(fd)
        cls.addClassCleanup(os.unlink, cls.log)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--access-log", cls.log)

    def test_openai_chat_stream(self):
        def extra(e, resp, rid):
            self.assertEqual(e["method"], "POST")
            self.assertEqual(e["path"], "/v1/chat/completions")
            self.assertEqual(e["model"], "sim-model")
            self.assertEqual(e["token_events"], 30, "simulator: one token per event")
            self.assertGreaterEqual(e["ttft_ms"], 100.0)
            self.assertEqual(resp.header_all("x-request-id"), [rid])

        self._stream_case("openai-chat", "it-al-openai", ttft=100, itl=20, tokens=30, include_usage=True,
                          extra=extra)

    def test_generated_request_id(self):
        before = set(x.get("id") for x in harness.read_access_log(self.log))
        body = harness.api_body("openai-chat", True)
        resp, _, _, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                harness.sim_headers(ttft=0, itl=0, tokens=3))
        self.assertEqual(resp.status, 200)
        sim_id = self.sim.stats()["last_request_id"]
        self.assertIsInstance(sim_id, str)
        self.assertTrue(sim_id, "tokentap sent no x-request-id upstream")
        self.assertNotIn(sim_id, before)
        e = self.entry(sim_id)  # the log line carries the id the upstream saw
        self.assertEqual(e["token_events"], 3)
        ids = resp.header_all("x-request-id")
        self.assertTrue(ids, "no x-request-id reached the client (the sim echoes it)")
        self.assertEqual(set(ids), {sim_id})
        # Each request gets its own id.
        measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                 harness.sim_headers(ttft=0, itl=0, tokens=3))
        self.assertNotEqual(self.sim.stats()["last_request_id"], sim_id)

    def test_long_request_id_kept_whole(self):
        """An id of any acceptable length (up to 128 bytes) is the same in the
        log, upstream and back at the client: none of them truncates it."""
        body = harness.api_body("openai-chat", True)
        for n in (71, 72, 100, 128):
            with self.subTest(length=n):
                rid = ("it-al-long-%d-" % n).ljust(n, "x")
                resp, _, _, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                        harness.sim_headers(ttft=0, itl=0, tokens=2, request_id=rid))
                self.assertEqual(resp.status, 200)
                self.assertEqual(self.sim.stats()["last_request_id"], rid)
                self.assertEqual(self.entry(rid)["id"], rid)
                self.assertEqual(resp.header_all("x-request-id"), [rid])

    def test_unacceptable_request_id_replaced(self):
        """An id that is too long or holds a byte unsafe to log is replaced by
        a generated one, the same in the log and upstream; the client's is
        not forwarded."""
        body = harness.api_body("openai-chat", True)
        for rid in ("it-al-bad id", 'it-al-bad"id', "it-al-" + "y" * 123):
            with self.subTest(rid=rid):
                before = set(x.get("id") for x in harness.read_access_log(self.log))
                resp, _, _, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                        harness.sim_headers(ttft=0, itl=0, tokens=2, request_id=rid))
                self.assertEqual(resp.status, 200)
                sim_id = self.sim.stats()["last_request_id"]
                self.assertRegex(sim_id, r"^[0-9a-f]{32}$", "the client's id went upstream")
                self.assertNotIn(sim_id, before)
                self.assertEqual(self.entry(sim_id)["id"], sim_id)
                self.assertEqual(resp.header_all("x-request-id"), [sim_id])

    def test_repeated_request_id_header(self):
        """With two x-request-id headers the first is the request's id, and
        it is the only one the upstream gets: the log and the upstream never
        disagree."""
        body = harness.api_body("openai-chat", True)
        hdrs = harness.sim_headers(ttft=0, itl=0, tokens=2, request_id="it-al-dup-a")
        hdrs.append(("x-request-id", "it-al-dup-b"))
        resp, _, _, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body, hdrs)
        self.assertEqual(resp.status, 200)
        self.assertEqual(self.sim.stats()["last_request_id"], "it-al-dup-a")
        self.assertEqual(self.entry("it-al-dup-a")["id"], "it-al-dup-a")
        self.assertEqual(resp.header_all("x-request-id"), ["it-al-dup-a"])

    def test_keys_documented(self):
        """docs/metrics.md's "Access log" table lists every key of a line, in
        order, and nothing else ("mirror" only appears on mirrored copies,
        the deadline counts only on routes with a ttft_deadline: test_deadline
        checks those; "ttft_from" only on a realtime response's line:
        test_realtime_audio)."""
        rid = "it-al-doc-keys"
        resp, _, _, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions",
                                harness.api_body("openai-chat", True),
                                harness.sim_headers(ttft=0, itl=0, tokens=2, request_id=rid))
        self.assertEqual(resp.status, 200)
        e = self.entry(rid)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "docs", "metrics.md")) as f:
            doc = f.read()
        section = doc[doc.index("\n## Access log\n"):]
        section = section[:section.index("\n## ", 1)]
        documented = []
        for line in section.splitlines():
            if line.startswith("| `"):
                documented += re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
        optional = ("mirror", "ttft_from", "deadline_missed", "deadline_failovers")
        self.assertEqual([k for k in documented if k not in optional], list(e))
        self.assertEqual(sorted(e["timeline_ms"]), sorted(TIMELINE))

    def test_anthropic_stream(self):
        self._stream_case("anthropic", "it-al-anthropic", ttft=60, itl=15, tokens=25)

    def test_ollama_chat_stream(self):
        self._stream_case("ollama-chat", "it-al-ollama-chat", ttft=40, itl=12, tokens=20)

    def test_ollama_generate_stream(self):
        self._stream_case("ollama-generate", "it-al-ollama-gen", ttft=40, itl=12, tokens=20)

    def test_openai_responses_stream(self):
        """The Responses API: event: lines, lifecycle events around the
        output_text deltas, usage in response.completed."""
        def extra(e, resp, rid):
            self.assertEqual(e["token_events"], 20, "simulator: one output_text.delta per token")
            self.assertEqual(e["events"], 20 + 8, "created, in_progress, 2 added, 3 done, completed")
            self.assertEqual(e["itl_count"], 19)

        self._stream_case("openai-responses", "it-al-responses", ttft=40, itl=12, tokens=20, extra=extra)

    def test_openai_completions_stream(self):
        self._stream_case("openai-completions", "it-al-completions", ttft=30, itl=10, tokens=20, include_usage=True)

    def _stream_case(self, api, rid0, ttft, itl, tokens, include_usage=False, extra=None):
        body = harness.api_body(api, True, include_usage=include_usage)

        def run(attempt):
            rid = "%s-%d" % (rid0, attempt)
            resp, sent, evs, toks = measure(self.tt.port, api, harness.API_PATHS[api], body,
                                          harness.sim_headers(ttft=ttft, itl=itl, tokens=tokens, request_id=rid))
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete)
            inp, out = harness.stream_usage(api, evs)
            self.assertEqual(out, tokens, "simulator usage (test premise)")
            self.assertIsNotNone(inp, "simulator reports input tokens (test premise)")
            e = self.entry(rid)
            self.assertEqual(e["api"], api)
            self.assertIs(e["stream"], True)
            self.assertEqual(e["status"], 200)
            self.assertIsNone(e["error"])
            self.assertEqual(e["token_events"], len(toks))
            self.assertEqual(e["output_tokens"], tokens)
            self.assertEqual(e["input_tokens"], inp)
            self.assertEqual(e["events"], len(evs))
            self.check_timeline(e)
            self.check_derived(e, tokens)
            self.assertEqual(self.sim.stats()["last_request_id"], rid)
            if extra:
                extra(e, resp, rid)
            return e, sent, resp, toks

        self.check_timing(run)

    def test_wait_for_a_stalled_proxy_counts_in_ttft(self):
        """A request that reaches tokentap while its event loop cannot run
        (here the process is stopped for STALL_MS; in life, a loop busy with
        other streams) has been waiting from the client's point of view.
        `arrive` is the kernel's receive time of the request's first byte,
        not the moment the loop read it, so the wait is in ttft, as the
        client sees it, instead of hidden."""
        STALL_MS = 200
        api = "openai-chat"
        body = harness.api_body(api, True)

        def run(attempt):
            rid = "it-al-stall-%d" % attempt
            conn = harness.HttpConn(self.tt.port, kernel_ts=True)
            raw = harness.request_bytes("POST", harness.API_PATHS[api], body,
                                        harness.sim_headers(ttft=20, itl=5, tokens=5, request_id=rid), self.tt.port)
            os.kill(self.tt.pid, signal.SIGSTOP)
            try:
                # kill() returns before every thread has stopped
                self.assertTrue(harness.wait_until(lambda: harness.all_threads_stopped(self.tt.pid), 5.0, 0.001),
                                "tokentap did not stop")
                t0 = conn.send(raw)
                sent = (t0, harness.now_ns())
                time.sleep(STALL_MS / 1000.0)
            finally:
                os.kill(self.tt.pid, signal.SIGCONT)
            try:
                resp = conn.read_response()
            finally:
                conn.close()
            self.assertEqual(resp.status, 200)
            toks = [e for e in harness.events_of(resp) if harness.is_token_event(api, e)]
            self.assertEqual(len(toks), 5)
            e = self.entry(rid)
            self.assertGreaterEqual(e["ttft_ms"], STALL_MS + 20 - TOL_MS, e)
            return e, sent, resp, toks

        self.check_timing(run)

    def test_itl_capped(self):
        rid = "it-al-cap"
        body = harness.api_body("openai-chat", True, include_usage=True)
        resp, _, evs, toks = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                     harness.sim_headers(ttft=0, itl=0, tokens=5000, request_id=rid))
        self.assertEqual(resp.status, 200)
        self.assertEqual(len(toks), 5000, "simulator: one token per event (test premise)")
        e = self.entry(rid)
        self.assertEqual(e["token_events"], 5000)
        self.assertEqual(e["output_tokens"], 5000)
        self.assertEqual(e["events"], len(evs))
        self.assertEqual(len(e["itl_ms"]), 4096)
        self.assertTrue(all(isinstance(x, (int, float)) and x >= 0 for x in e["itl_ms"]))

    def test_non_streaming(self):
        for api in ("openai-chat", "anthropic", "ollama-generate"):
            with self.subTest(api=api):
                rid = "it-al-nostream-" + api
                body = harness.api_body(api, False)
                resp, _ = harness.exchange(self.tt.port, "POST", harness.API_PATHS[api], body,
                                           harness.sim_headers(ttft=20, itl=1, tokens=9, request_id=rid))
                self.assertEqual(resp.status, 200)
                inp, out = harness.body_usage(api, resp.json())
                self.assertEqual(out, 9, "simulator usage (test premise)")
                e = self.entry(rid)
                self.assertEqual(e["api"], api)
                self.assertIs(e["stream"], False)
                self.assertEqual(e["status"], 200)
                self.assertEqual(e["input_tokens"], inp)
                self.assertEqual(e["output_tokens"], 9)
                self.assertIsNone(e["ttft_ms"])
                self.assertIn(e["itl_ms"], ([], None))
                self.assertIsNotNone(e["e2e_ms"])
                self.assertGreaterEqual(e["e2e_ms"], 20.0)
                self.check_timeline(e, streamed=False)

    def test_input_tokens_follow_prompt(self):
        # Input tokens = ceil(prompt bytes / 4) in the simulator: a longer
        # prompt must show up as more input tokens in the log.
        counts = []
        for n, prompt in enumerate(("x" * 40, "x" * 4000)):
            rid = "it-al-input-%d" % n
            body = harness.api_body("openai-chat", True, include_usage=True, prompt=prompt)
            resp, _, evs, _ = measure(self.tt.port, "openai-chat", "/v1/chat/completions", body,
                                      harness.sim_headers(ttft=0, itl=0, tokens=2, request_id=rid))
            inp, _ = harness.stream_usage("openai-chat", evs)
            e = self.entry(rid)
            self.assertEqual(e["input_tokens"], inp)
            counts.append(e["input_tokens"])
        self.assertGreaterEqual(counts[1] - counts[0], 990)

    def test_no_model_and_unknown_api(self):
        rid = "it-al-unknown"
        resp, _ = harness.exchange(self.tt.port, "GET", "/sim/stats", None, [("x-request-id", rid)])
        self.assertEqual(resp.status, 200)
        e = self.entry(rid)
        self.assertEqual(e["method"], "GET")
        self.assertEqual(e["path"], "/sim/stats")
        self.assertEqual(e["api"], "unknown")
        self.assertIsNone(e["model"])
        self.assertIs(e["stream"], False)
        self.assertEqual(e["status"], 200)
        self.assertIsNone(e["ttft_ms"])

        rid = "it-al-nomodel"
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": False}
        resp, _ = harness.exchange(self.tt.port, "POST", "/v1/chat/completions", body,
                                   harness.sim_headers(tokens=2, request_id=rid))
        e = self.entry(rid)
        self.assertIsNone(e["model"])
        self.assertEqual(e["status"], resp.status)


class StdoutLogTest(LogChecks):
    def test_access_log_to_stdout(self):
        sim = harness.start_sim(self)
        out = harness.temp_path(self, ".out")
        tt = harness.start_tokentap(self, sim.url, "--access-log", "-", stdout_path=out)
        for i in range(3):
            rid = "it-al-stdout-%d" % i
            resp, _, evs, toks = measure(tt.port, "ollama-generate", "/api/generate",
                                         harness.api_body("ollama-generate", True),
                                         harness.sim_headers(ttft=0, itl=0, tokens=4, request_id=rid))
            self.assertEqual(resp.status, 200)
            e = self.entry(rid, out)
            self.assertEqual(e["token_events"], 4)
            self.assertEqual(e["output_tokens"], 4)
        # Nothing but JSON lines, one per request.
        self.assertEqual([x["id"] for x in harness.read_access_log(out)], ["it-al-stdout-%d" % i for i in range(3)])


class ContentEncodingTest(LogChecks):
    def test_compressed_stream_forwarded_not_framed(self):
        """A gzip'd event stream is forwarded byte for byte but not decoded,
        so not framed: no events, no ttft or itl, no usage (docs/metrics.md)."""
        events = b"".join(b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(5))
        events += b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\ndata: [DONE]\n\n'
        body = gzip.compress(events)

        def handler(sock, req, ctx):
            harness.send_sse_head(sock, b"Content-Encoding: gzip\r\n")
            harness.send_chunk(sock, body[:20])
            time.sleep(0.02)
            harness.send_chunk(sock, body[20:])
            sock.sendall(b"0\r\n\r\n")
            return True

        fu = harness.start_fake_upstream(self, handler)
        log = harness.temp_path(self, ".log")
        tt = harness.start_tokentap(self, fu.url, "--access-log", log)
        resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions",
                                   harness.api_body("openai-chat", True, include_usage=True),
                                   [("x-request-id", "it-al-gzip"), ("accept-encoding", "gzip")])
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.header("content-encoding"), "gzip")
        self.assertEqual(resp.body, body)
        e = self.entry("it-al-gzip", log)
        self.assertIs(e["stream"], False)
        self.assertEqual((e["events"], e["token_events"]), (0, 0))
        self.assertIsNone(e["ttft_ms"])
        self.assertEqual(e["itl_ms"], [])
        self.assertIsNone(e["input_tokens"])
        self.assertIsNone(e["output_tokens"])
        self.assertIsNotNone(e["e2e_ms"])


class JitterTest(LogChecks):
    """Irregular gaps from a scripted upstream, with events that are not
    token-bearing mixed in, and one event split across two writes."""

    GAPS_MS = [7, 41, 13, 2, 27, 64, 5, 18, 33, 9, 50, 11, 3, 22]

    def test_irregular_itl(self):
        chunk = lambda d: b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"
        tok = lambda i: chunk({"id": "x", "object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": {"content": "w%d " % i}, "finish_reason": None}]})
        script = []  # (sleep ms before, bytes, token-bearing)
        script.append((30, chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}), False))
        script.append((25, tok(0), True))
        for i, g in enumerate(self.GAPS_MS):
            if i == 3:
                script.append((3, chunk({"choices": [{"index": 0, "delta": {"content": ""}}]}), False))
            if i == 5:
                script.append((4, b": keep-alive\n\n", False))
            if i == 6:
                script.append((g, chunk({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}), True))
            elif i == 8:
                script.append((g, chunk({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": "{\"a\""}}]}}]}), True))
            elif i == 10:
                full = tok(100 + i)
                script.append((g, full[:20], False))  # first half of an event ...
                script.append((6, full[20:], True))  # ... completes 6 ms later
            else:
                script.append((g, tok(i + 1), True))
        script.append((10, chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), False))
        script.append((5, chunk({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 40,
                                                          "total_tokens": 57}}), False))
        script.append((2, b"data: [DONE]\n\n", False))
        n_token_events = sum(1 for s in script if s[2])

        def handler(sock, req, ctx):
            harness.send_sse_head(sock)
            for ms, data, _ in script:
                time.sleep(ms / 1000.0)
                harness.send_chunk(sock, data)
            sock.sendall(b"0\r\n\r\n")
            return True

        fu = harness.start_fake_upstream(self, handler)
        log = harness.temp_path(self, ".log")
        tt = harness.start_tokentap(self, fu.url, "--access-log", log)
        body = harness.api_body("openai-chat", True, include_usage=True, model="jitter-model")

        def run(attempt):
            rid = "it-al-jitter-%d" % attempt
            resp, sent, evs, toks = measure(tt.port, "openai-chat", "/v1/chat/completions", body,
                                          [("x-request-id", rid)])
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.body, b"".join(s[1] for s in script))
            self.assertEqual(len(toks), n_token_events, "client classifier (test premise)")
            self.assertEqual(fu.requests[-1].header("x-request-id"), rid)
            e = self.entry(rid, log)
            self.assertEqual(e["model"], "jitter-model")
            self.assertEqual(e["token_events"], n_token_events)
            self.assertEqual(e["input_tokens"], 17)
            self.assertEqual(e["output_tokens"], 40, "usage wins over the event count")
            self.check_timeline(e)
            self.check_derived(e, 40)
            tl = e["timeline_ms"]
            self.assertLess(tl["first_event"] + 20, tl["first_token"], "role-only event counted as a token")
            return e, sent, resp, toks

        self.check_timing(run)

if __name__ == "__main__":
    unittest.main()
