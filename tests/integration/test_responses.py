"""test_responses.py — the OpenAI Responses API (POST /v1/responses) through
tokentap: measured as its own API, "openai-responses" (docs/metrics.md).

- The simulator's non-streamed Response: tokens from its usage.
- A fake upstream ending its stream the ways a real server can: completed,
  response.incomplete, response.failed after an error event, an error event
  alone (vLLM), completed with status "incomplete" (vLLM's length cut). Each
  ending gives its error kind in the access log, the bytes reach the client
  unchanged, and /stats shows the series with those kinds.
- A real client: the official `openai` npm SDK (installed with npm into
  tests/artifacts/, as the dashboard test needs Chromium: missing or failing
  to install is a failure with a message, not a skip) streams a Responses
  request through tokentap; every event it yields equals what it yields
  straight from the simulator, and tokentap's ttft is never later than the
  SDK's own time to its first delta.

The streamed simulator case with client-measured timings is in
test_accesslog.py (test_openai_responses_stream)."""

import json
import os
import subprocess
import time

import harness

API = "openai-responses"
PATH = "/v1/responses"
HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(os.path.dirname(HERE), "artifacts")
# The SDK version the test was written against; a newer major may change
# what the stream helper yields.
SDK_SPEC = "openai@5.23.2"
SDK_DIR = os.path.join(ARTIFACTS, "npm-openai")
SDK_SCRIPT = os.path.join(HERE, "responses_sdk.cjs")
ROUND_MS = 0.003  # logged values are ms with µs precision


def sse(name, obj):
    return ("event: %s\ndata: %s\n\n" % (name, json.dumps(obj, separators=(",", ":")))).encode()


def resp_obj(status, usage=None, extra=None):
    r = {"id": "resp_fake", "object": "response", "created_at": 1751642570, "status": status, "model": "fake",
         "output": [], "usage": usage, "error": None, "incomplete_details": None}
    r.update(extra or {})
    return r


def fake_stream(ending, n_deltas=3):
    """The events of one Responses stream, as bytes each, ending `ending`."""
    seq = iter(range(1000))
    ev = lambda t, **kw: sse(t, dict({"type": t, "sequence_number": next(seq)}, **kw))
    usage = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_deltas,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 11 + n_deltas}
    out = [ev("response.created", response=resp_obj("in_progress")),
           ev("response.in_progress", response=resp_obj("in_progress")),
           ev("response.output_item.added", output_index=0,
              item={"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}),
           ev("response.content_part.added", item_id="msg_1", output_index=0, content_index=0,
              part={"type": "output_text", "text": "", "annotations": []})]
    for i in range(n_deltas):
        out.append(ev("response.output_text.delta", item_id="msg_1", output_index=0, content_index=0,
                      delta=" w%d" % i, logprobs=[]))
    if ending == "completed":
        out.append(ev("response.completed", response=resp_obj("completed", usage)))
    elif ending == "completed_incomplete":  # vLLM's length cut
        out.append(ev("response.completed", response=resp_obj("incomplete", usage)))
    elif ending == "incomplete":
        out.append(ev("response.incomplete", response=resp_obj(
            "incomplete", usage, {"incomplete_details": {"reason": "max_output_tokens"}})))
    elif ending == "failed":
        out.append(ev("error", error={"code": "server_error", "message": "boom", "param": None}))
        out.append(ev("response.failed", response=resp_obj(
            "failed", None, {"error": {"code": "server_error", "message": "boom"}})))
    elif ending == "error_only":  # vLLM on a generation error: one error event, no terminal event
        out.append(ev("error", code="server_error", message="boom", param=None))
    else:
        raise ValueError(ending)
    return out


# ending -> (error kind in the access log, input tokens, output tokens)
ENDINGS = {
    "completed": (None, 11, 3),
    "completed_incomplete": ("response_incomplete", 11, 3),
    "incomplete": ("response_incomplete", 11, 3),
    "failed": ("response_failed", None, None),
    "error_only": ("response_failed", None, None),
}


def fake_handler(sock, req, ctx):
    """Streams the ending named by the request's x-ending header."""
    harness.send_sse_head(sock)
    for piece in fake_stream(req.header("x-ending")):
        harness.send_chunk(sock, piece)
    sock.sendall(b"0\r\n\r\n")
    return True


class ResponsesTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "5")
        cls.start_logged(cls.sim.url, "tokentap-responses-")

    def entry(self, rid):
        return self.log_entry(self.log, rid)

    def test_not_streamed(self):
        rid = "it-resp-block"
        body = harness.api_body(API, stream=False)
        resp, _ = harness.exchange(self.tt.port, "POST", PATH, body,
                                   harness.sim_headers(ttft=5, itl=1, tokens=17, request_id=rid))
        self.assertEqual(resp.status, 200)
        obj = resp.json()
        self.assertEqual(obj["object"], "response")
        self.assertEqual(obj["status"], "completed")
        inp, out = harness.body_usage(API, obj)
        self.assertEqual(out, 17, "simulator usage (test premise)")
        e = self.entry(rid)
        self.assertEqual(e["api"], API)
        self.assertIs(e["stream"], False)
        self.assertIsNone(e["error"])
        self.assertEqual((e["input_tokens"], e["output_tokens"]), (inp, out))
        self.assertEqual(e["token_events"], 0)
        self.assertIsNone(e["ttft_ms"])

    def test_unrouted_paths_stay_unknown(self):
        """GET /v1/responses/{id} retrieves a stored response: not a
        generation, not this API."""
        rid = "it-resp-get"
        resp, _ = harness.exchange(self.tt.port, "GET", PATH + "/resp_1", None, [("x-request-id", rid)])
        self.assertEqual(resp.status, 404)
        self.assertEqual(self.entry(rid)["api"], "unknown")


class EndingsTest(harness.TestCase):
    """How a stream ends, from a fake upstream that sends exact bytes."""

    @classmethod
    def setUpClass(cls):
        cls.up = harness.FakeUpstream(fake_handler)
        cls.addClassCleanup(cls.up.stop)
        cls.start_logged(cls.up.url, "tokentap-responses-end-", admin=True)

    def test_endings(self):
        for model, (ending, (kind, inp, out)) in zip(("m-ok", "m-vllm-len", "m-inc", "m-fail", "m-err"),
                                                     ENDINGS.items()):
            with self.subTest(ending=ending):
                rid = "it-resp-end-" + ending
                body = harness.api_body(API, stream=True, model=model)
                resp, _ = harness.exchange(self.tt.port, "POST", PATH, body,
                                           [("x-request-id", rid), ("x-ending", ending)])
                self.assertEqual(resp.status, 200)
                self.assertEqual(resp.body, b"".join(fake_stream(ending)), "bytes forwarded unchanged")
                e = self.log_entry(self.log, rid)
                self.assertEqual(e["api"], API)
                self.assertEqual(e["error"], kind)
                self.assertEqual(e["status"], 200)
                self.assertEqual((e["input_tokens"], e["output_tokens"]), (inp, out))
                self.assertEqual(e["token_events"], 3)
                self.assertEqual(e["itl_count"], 2)
                self.assertIsNotNone(e["ttft_ms"])
                self.assertEqual(e["events"], len(fake_stream(ending)))
                self.check_stats(model, kind, out)

    def test_bench_counts_a_failed_response(self):
        """tokentap-bench --api openai-responses straight at the fake: a
        failed ending is a failed request (kind response_failed), an
        incomplete one is ok (bench sets max_output_tokens itself)."""
        for ending, ok, failed in (("failed", 0, 2), ("error_only", 0, 2), ("incomplete", 2, 0),
                                   ("completed", 2, 0)):
            with self.subTest(ending=ending):
                out = os.path.join(self.dir, "bench-%s.json" % ending)
                p = subprocess.run([harness.bench_bin(), "--url", self.up.url, "--api", API, "--requests", "2",
                                    "--no-progress", "-H", "x-ending: " + ending, "--json", out],
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
                self.assertTrue(os.path.exists(out), "tokentap-bench exited %d: %s" % (p.returncode, p.stderr))
                with open(out) as f:
                    res = json.load(f)["result"]
                self.assertEqual((res["requests"]["ok"], res["requests"]["failed"]), (ok, failed), res)
                self.assertEqual(res["errors"]["response_failed"], failed)

    def check_stats(self, model, kind, out):
        """/stats has the model's series, its error counted under the kind."""
        s = harness.model_series(self.admin, model)
        self.assertIsNotNone(s, "no /stats series for model %s" % model)
        self.assertEqual(s["requests"], 1)
        self.assertEqual(s["output_tokens"], out if out is not None else 3, "unknown usage: token events count")
        for k in ("response_failed", "response_incomplete"):
            self.assertEqual(s["errors"][k], 1 if k == kind else 0, (k, s["errors"]))


# The request responses_sdk.cjs makes (keep the two in step).
SDK_BODY = {"model": "sim-model", "input": [{"role": "user", "content": "Why is the sky blue?"}], "stream": True}


def npm_install_sdk():
    harness.npm_install(SDK_DIR, [SDK_SPEC], timeout=90)


def run_sdk(base_url, rid, ttft, itl, tokens):
    return harness.run_node(SDK_SCRIPT, SDK_DIR, base_url, rid, ttft, itl, tokens)


class OpenAISdkTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        npm_install_sdk()
        cls.sim = harness.start_sim(cls, "--seed", "9")
        cls.start_logged(cls.sim.url, "tokentap-responses-sdk-")

    def test_sdk_stream_through_tokentap(self):
        tokens = 12
        # What the simulator sends for the body the SDK writes (its
        # JSON.stringify of SDK_BODY: the same bytes, so the same stream).
        raw, _ = harness.exchange(self.sim.port, "POST", PATH, SDK_BODY, harness.sim_headers(ttft=0, itl=0,
                                                                                           tokens=tokens))
        self.assertEqual(raw.status, 200)
        sent = harness.events_of(raw)
        self.assertEqual([ev.name for ev in sent], [ev.json()["type"] for ev in sent], "event: line == type")
        sent = [ev.json() for ev in sent]
        direct = run_sdk("http://127.0.0.1:%d/v1" % self.sim.port, "it-resp-sdk-direct", 60, 10, tokens)
        self.assertEqual(direct["events"], sent, "the SDK yields each event's data as the simulator sent it")
        for attempt in range(2):
            rid = "it-resp-sdk-%d" % attempt
            via = run_sdk("http://127.0.0.1:%d/v1" % self.tt.port, rid, 60, 10, tokens)
            # Every event the SDK yields is the one it yields from the simulator directly.
            self.assertEqual(via["events"], direct["events"])
            types = [ev["type"] for ev in via["events"]]
            self.assertEqual(types, ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"] + ["response.output_text.delta"] * tokens +
                             ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "response.completed"])
            self.assertEqual(list(range(len(types))), [ev["sequence_number"] for ev in via["events"]])
            usage = via["events"][-1]["response"]["usage"]
            e = self.log_entry(self.log, rid)
            self.assertEqual(e["api"], API)
            self.assertIsNone(e["error"])
            self.assertEqual(e["token_events"], tokens)
            self.assertEqual(e["itl_count"], tokens - 1)
            self.assertEqual((e["input_tokens"], e["output_tokens"]),
                             (usage["input_tokens"], usage["output_tokens"]))
            # tokentap's clock starts when the request's first byte arrives,
            # the SDK's before it connects; tokentap sees the first delta
            # before the SDK has read and parsed it.
            self.assertLessEqual(e["ttft_ms"], via["first_delta_ms"] + ROUND_MS,
                                 "tokentap ttft %.3f ms later than the SDK's %.3f ms"
                                 % (e["ttft_ms"], via["first_delta_ms"]))
            self.assertGreaterEqual(e["ttft_ms"], 60.0)
