"""test_reasoning.py — answer versus reasoning, tool calls, and the usage
details (cached, cache-write and reasoning tokens) through tokentap, per API
that separates them (docs/metrics.md, "Answer, reasoning and tool calls").

A fake upstream scripts one stream per API with known pauses: reasoning
events 40 ms apart after a first pause, a thinking pause, the answer, then a
tool call, and usage with its details. It notes when it sent each event.
For each API:

- the access log's ttft, answer ttft and reasoning span agree with the
  script's own send times (within a few ms), and its reasoning and tool-call
  event counts and usage details are exactly what was scripted, Anthropic's
  prompt normalised to the whole prompt (input + cache reads + writes);
- /stats shows the series with one sample in the answer_ttft and reasoning
  histograms, the cached and reasoning token counters and the prefix-cache
  hit ratio; /stats/prompt keys the request on its prefill tokens by
  default and on the whole prompt with by=prompt;
- the bytes reach the client unchanged;
- tokentap-bench reports the answer ttft of streams that reasoned."""

import json
import os
import subprocess
import threading
import time

import harness

PAUSE_FIRST_MS = 60  # before the first reasoning event
PAUSE_REASONING_MS = 40  # between reasoning events
PAUSE_THINK_MS = 70  # from the last reasoning event to the answer
PAUSE_ANSWER_MS = 20  # between answer events, and before the tool call
TOL_MS = 8.0  # scripted vs logged spans, on a loaded two-core machine
N_REASONING = 3


def sse(name, obj):
    head = ("event: %s\n" % name) if name else ""
    return ("%sdata: %s\n\n" % (head, json.dumps(obj, separators=(",", ":")))).encode()


def ndjson(obj):
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def chat_chunk(delta, **kw):
    c = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    c.update(kw)
    return sse(None, c)


def script_chat():
    """(kind, bytes): kind r/a/t for a reasoning/answer/tool event, None for
    any other."""
    s = [(None, chat_chunk({"role": "assistant", "content": ""}))]
    s += [("r", chat_chunk({"reasoning_content": " step%d" % i})) for i in range(N_REASONING)]
    s += [("a", chat_chunk({"content": "Paris"})), ("a", chat_chunk({"content": " is"}))]
    s += [("t", chat_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                            "function": {"name": "f", "arguments": "{}"}}]}))]
    s += [(None, sse(None, {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
                            "usage": {"prompt_tokens": 1200, "completion_tokens": 9, "total_tokens": 1209,
                                      "prompt_tokens_details": {"cached_tokens": 1024},
                                      "completion_tokens_details": {"reasoning_tokens": 3}}})),
          (None, b"data: [DONE]\n\n")]
    return s


def script_responses():
    seq = iter(range(1000))

    def ev(t, **kw):
        return sse(t, dict({"type": t, "sequence_number": next(seq)}, **kw))
    s = [(None, ev("response.created", response={"id": "r1", "status": "in_progress", "usage": None})),
         (None, ev("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning"}))]
    s += [("r", ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=0,
                   delta=" step%d" % i)) for i in range(N_REASONING)]
    s += [("a", ev("response.output_text.delta", item_id="msg_1", output_index=1, content_index=0, delta=w))
          for w in ("Paris", " is")]
    s += [("t", ev("response.function_call_arguments.delta", item_id="fc_1", output_index=2, delta="{}"))]
    s += [(None, ev("response.completed", response={
        "id": "r1", "status": "completed",
        "usage": {"input_tokens": 2000, "input_tokens_details": {"cached_tokens": 1024}, "output_tokens": 700,
                  "output_tokens_details": {"reasoning_tokens": 640}, "total_tokens": 2700}}))]
    return s


def script_anthropic():
    def ev(t, **kw):
        return sse(t, dict({"type": t}, **kw))

    def delta(i, d):
        return ev("content_block_delta", index=i, delta=d)
    s = [(None, ev("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 300, "cache_read_input_tokens": 4096,
                  "output_tokens": 1}})),
         (None, ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}))]
    s += [("r", delta(0, {"type": "thinking_delta", "thinking": " step%d" % i})) for i in range(N_REASONING)]
    s += [(None, delta(0, {"type": "signature_delta", "signature": "EqoBCkgIARAB"})),
          (None, ev("content_block_stop", index=0)),
          (None, ev("content_block_start", index=1, content_block={"type": "text", "text": ""}))]
    s += [("a", delta(1, {"type": "text_delta", "text": w})) for w in ("Paris", " is")]
    s += [(None, ev("content_block_start", index=2, content_block={"type": "tool_use", "id": "toolu_1",
                                                                   "name": "f", "input": {}})),
          (None, delta(2, {"type": "input_json_delta", "partial_json": ""})),
          ("t", delta(2, {"type": "input_json_delta", "partial_json": "{\"city\": \"Paris\"}"})),
          (None, ev("content_block_stop", index=2)),
          (None, ev("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None},
                    usage={"output_tokens": 40, "output_tokens_details": {"thinking_tokens": 20}})),
          (None, ev("message_stop"))]
    return s


def script_ollama():
    def line(msg, **kw):
        return ndjson(dict({"model": "m", "created_at": "2026-12-01T00:00:00Z",
                            "message": dict({"role": "assistant", "content": ""}, **msg), "done": False}, **kw))
    s = [("r", line({"thinking": " step%d" % i})) for i in range(N_REASONING)]
    s += [("a", line({"content": w})) for w in ("Paris", " is")]
    s += [("t", line({"tool_calls": [{"function": {"name": "f", "arguments": {"city": "Paris"}}}]}))]
    s += [(None, ndjson({"model": "m", "created_at": "2026-12-01T00:00:01Z",
                         "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop",
                         "prompt_eval_count": 26, "eval_count": 9}))]
    return s


# api -> (path, script, content type, expected usage: input, output, cached,
# cache writes, reasoning tokens)
CASES = {
    "openai-chat": ("/v1/chat/completions", script_chat, b"text/event-stream", (1200, 9, 1024, None, 3)),
    "openai-responses": ("/v1/responses", script_responses, b"text/event-stream", (2000, 700, 1024, None, 640)),
    "anthropic": ("/v1/messages", script_anthropic, b"text/event-stream", (12 + 4096 + 300, 40, 4096, 300, 20)),
    "ollama-chat": ("/api/chat", script_ollama, b"application/x-ndjson", (26, 9, None, None, None)),
}


def pause_before(kinds, i):
    """The scripted pause before event i, in ms."""
    k = kinds[i]
    if k is None:
        return 0
    prev = [x for x in kinds[:i] if x is not None]
    if not prev:
        return PAUSE_FIRST_MS
    if k == "r":
        return PAUSE_REASONING_MS
    if prev[-1] == "r":
        return PAUSE_THINK_MS
    return PAUSE_ANSWER_MS


class Sent:
    """When the fake sent each token event, per request id."""

    def __init__(self):
        self.lock = threading.Lock()
        self.times = {}

    def note(self, rid, kind, t):
        with self.lock:
            self.times.setdefault(rid, []).append((kind, t))

    def get(self, rid):
        with self.lock:
            return list(self.times.get(rid, []))


SENT = Sent()


# Non-streamed bodies: api -> (path, body, expected usage as in CASES)
BODIES = {
    "openai-chat": ("/v1/chat/completions", {
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris",
                                             "reasoning_content": "step"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 256},
                  "completion_tokens_details": {"reasoning_tokens": 12}}}, (300, 20, 256, None, 12)),
    "anthropic": ("/v1/messages", {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "Paris"}],
        "usage": {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2000,
                  "output_tokens": 7}}, (2005, 7, 2000, 0, None)),
}


def handler(sock, req, ctx):
    if req.header("x-body"):
        body = json.dumps(BODIES[req.header("x-api")][1]).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        return True
    path, script, ctype, _ = CASES[req.header("x-api")]
    rid = req.header("x-request-id")
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    events = script()
    kinds = [k for k, _ in events]
    for i, (kind, data) in enumerate(events):
        p = pause_before(kinds, i)
        if p:
            time.sleep(p / 1000.0)
        if kind is not None:
            SENT.note(rid, kind, time.monotonic())
        harness.send_chunk(sock, data)
    sock.sendall(b"0\r\n\r\n")
    return True


class ReasoningTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = harness.start_fake_upstream(cls, handler)
        cls.start_logged(cls.up.url, "tokentap-reasoning-", admin=True)

    def run_api(self, api):
        path, script, _, usage = CASES[api]
        model = "m-" + api
        rid = "it-reasoning-" + api
        body = harness.api_body(api, stream=True, model=model)
        resp, _ = harness.exchange(self.tt.port, "POST", path, body, [("x-request-id", rid), ("x-api", api)])
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.body, b"".join(d for _, d in script()), "bytes forwarded unchanged")
        e = self.log_entry(self.log, rid)
        return e, model, usage, SENT.get(rid)

    def check_line(self, api, e, usage, sent):
        self.assertEqual(e["api"], api)
        self.assertIsNone(e["error"])
        kinds = [k for k, _ in sent]
        # counts: exact
        self.assertEqual(e["token_events"], len(kinds))
        self.assertEqual(e["reasoning_events"], kinds.count("r"))
        self.assertEqual(e["tool_call_events"], kinds.count("t"))
        got = (e["input_tokens"], e["output_tokens"], e["cached_tokens"], e["cache_write_tokens"],
               e["reasoning_tokens"])
        self.assertEqual(got, usage, "input, output, cached, cache writes, reasoning tokens")
        # timings: the spans the script made, as it sent them
        t_first = sent[0][1]
        t_first_r = next(t for k, t in sent if k == "r")
        t_last_r = [t for k, t in sent if k == "r"][-1]
        t_answer = next(t for k, t in sent if k != "r")
        want_reasoning = (t_last_r - t_first_r) * 1000
        want_answer_after_ttft = (t_answer - t_first) * 1000
        self.assertGreaterEqual(want_reasoning, (N_REASONING - 1) * PAUSE_REASONING_MS - 1, "test premise")
        self.assertIsNotNone(e["reasoning_ms"])
        self.assertIsNotNone(e["answer_ttft_ms"])
        self.assertAlmostEqual(e["reasoning_ms"], want_reasoning, delta=TOL_MS)
        self.assertAlmostEqual(e["answer_ttft_ms"] - e["ttft_ms"], want_answer_after_ttft, delta=TOL_MS)
        # ttft keeps its meaning: the first token of any kind, here reasoning
        self.assertGreaterEqual(e["ttft_ms"], PAUSE_FIRST_MS - 1)
        self.assertLess(e["ttft_ms"], e["answer_ttft_ms"])
        tl = e["timeline_ms"]
        self.assertAlmostEqual(tl["first_reasoning"], tl["first_token"], delta=0.002)
        self.assertAlmostEqual(e["answer_ttft_ms"], tl["first_answer"], delta=0.002)
        self.assertAlmostEqual(e["reasoning_ms"], tl["last_reasoning"] - tl["first_reasoning"], delta=0.003)

    def stats_series(self, model, path="/stats?window=5m&model=%s"):
        s = harness.model_series(self.admin, model, 1, path)
        self.assertIsNotNone(s, "no series for model %s at %s" % (model, path % model))
        return s

    def check_stats(self, e, model, usage):
        s = self.stats_series(model)
        self.assertEqual(s["requests"], 1)
        m = s["metrics"]
        for name in ("ttft", "answer_ttft", "reasoning"):
            self.assertEqual(m[name]["count"], 1, name)
        # one sample each, as logged (within the histogram's 1 %)
        self.assertAlmostEqual(m["answer_ttft"]["p50_ms"], e["answer_ttft_ms"], delta=e["answer_ttft_ms"] * 0.01 + 0.01)
        self.assertAlmostEqual(m["reasoning"]["p50_ms"], e["reasoning_ms"], delta=e["reasoning_ms"] * 0.01 + 0.01)
        inp, out, cached, write, reasoning = usage
        self.assertEqual(s["input_tokens"], inp)
        self.assertEqual(s["cached_tokens"], cached or 0)
        self.assertEqual(s["cache_write_tokens"], write or 0)
        self.assertEqual(s["reasoning_tokens"], reasoning or 0)
        pc = s["prefix_cache"]
        if cached is None:
            self.assertEqual(pc["input_tokens"], 0)
            self.assertIsNone(pc["hit_ratio"])
        else:
            self.assertEqual(pc["input_tokens"], inp)
            self.assertAlmostEqual(pc["hit_ratio"], cached / inp, places=9)
        # the prompt curve: on prefill tokens by default, the prompt with by=prompt
        prefill = inp - (cached or 0)
        for by, n in (("", prefill), ("&by=prompt", inp)):
            p = self.stats_series(model, "/stats/prompt?window=5m&model=%s" + by)
            self.assertEqual(p["by"], "prompt" if by else "prefill")
            self.assertEqual(len(p["buckets"]), 1, p)
            b = p["buckets"][0]
            self.assertLessEqual(b["input_tokens_low"], n)
            self.assertTrue(b["input_tokens_high"] is None or n <= b["input_tokens_high"], (n, b))

    def test_each_api(self):
        for api in CASES:
            with self.subTest(api=api):
                e, model, usage, sent = self.run_api(api)
                self.check_line(api, e, usage, sent)
                self.check_stats(e, model, usage)

    def test_bench_reports_answer_ttft(self):
        """tokentap-bench straight at the fake: the answer ttft of the
        streams that reasoned, beside the ttft; absent from a stream that
        did not reason (the simulator's)."""
        for api in ("openai-chat", "anthropic"):
            with self.subTest(api=api):
                out = os.path.join(self.dir, "bench-%s.json" % api)
                p = subprocess.run([harness.bench_bin(), "--url", self.up.url, "--api", api, "--requests", "2",
                                    "--no-progress", "-H", "x-api: " + api, "--json", out],
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
                self.assertTrue(os.path.exists(out), "tokentap-bench exited %d: %s" % (p.returncode, p.stderr))
                with open(out) as f:
                    m = json.load(f)["result"]["metrics"]
                self.assertEqual(m["answer_ttft"]["count"], 2)
                want = (N_REASONING - 1) * PAUSE_REASONING_MS + PAUSE_THINK_MS
                self.assertAlmostEqual(m["answer_ttft"]["p50_ms"] - m["ttft"]["p50_ms"], want,
                                       delta=TOL_MS + 0.01 * m["answer_ttft"]["p50_ms"])
                self.assertRegex(p.stdout, r"(?m)^answer_ttft +2 ")
        sim = harness.start_sim(self)
        out = os.path.join(self.dir, "bench-sim.json")
        p = subprocess.run([harness.bench_bin(), "--url", sim.url, "--api", "openai-chat", "--requests", "2",
                            "--no-progress", "-H", "x-sim-tokens: 4", "--json", out],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        with open(out) as f:
            m = json.load(f)["result"]["metrics"]
        self.assertEqual(m["ttft"]["count"], 2, p.stderr)
        self.assertEqual(m["answer_ttft"]["count"], 0)
        self.assertNotRegex(p.stdout, r"(?m)^answer_ttft ")

    def test_not_streamed_usage_details(self):
        """A whole JSON body's usage details, Anthropic's prompt normalised."""
        for api, (path, _, usage) in BODIES.items():
            with self.subTest(api=api):
                rid = "it-reasoning-body-" + api
                resp, _ = harness.exchange(self.tt.port, "POST", path, harness.api_body(api, stream=False),
                                           [("x-request-id", rid), ("x-api", api), ("x-body", "1")])
                self.assertEqual(resp.status, 200)
                e = self.log_entry(self.log, rid)
                self.assertIs(e["stream"], False)
                got = (e["input_tokens"], e["output_tokens"], e["cached_tokens"], e["cache_write_tokens"],
                       e["reasoning_tokens"])
                self.assertEqual(got, usage)
                self.assertIsNone(e["answer_ttft_ms"])
                self.assertIsNone(e["reasoning_ms"])

    def test_bad_by_refused(self):
        r, _ = harness.exchange(self.admin, "GET", "/stats/prompt?by=tokens")
        self.assertEqual(r.status, 400)


if __name__ == "__main__":
    import unittest
    unittest.main()
