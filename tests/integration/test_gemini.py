"""test_gemini.py — Gemini and Vertex AI through tokentap, over real sockets
(docs/metrics.md, "gemini"):

- the simulator's :streamGenerateContent with ?alt=sse (SSE frames) and
  without (one streamed JSON array), on the Google AI path and on Vertex
  AI's, with thoughts: TTFT and every gap within 1 ms of what the client
  measures on its own socket (test_accesslog.LogChecks), answer TTFT at the
  first non-thought part, token events, reasoning events and the usage of
  usageMetadata exact in the access log and in /stats, the model taken from
  the path;
- :generateContent, one body: its usage, no token events;
- every response's bytes equal to what the simulator sends a direct
  request;
- a fake upstream that ends a stream with an in-stream `error` element
  (JSON array, cut into TCP writes at odd offsets) or frame (SSE):
  response_failed in the access log and /stats, bytes unchanged;
- tokentap-bench --api gemini / gemini-array through tokentap: every
  request ok, its tokens from usageMetadata; at the fake, a failed one;
- a route's match.model sees the model of the path (both path styles), a
  `model` in the body is not read;
- a real client: the official `@google/genai` npm SDK (installed with npm
  into tests/artifacts/, as test_responses installs `openai`) streams
  through tokentap; every chunk it yields equals what it yields straight
  from the simulator, the access log holds its usage, and tokentap's ttft
  and answer_ttft are never later than the SDK's own.
"""


def run_bench(test, url, api, n, extra=()):
    out = os.path.join(test.dir, "bench-%s-%d.json" % (api, len(extra)))
    p = subprocess.run([harness.bench_bin(), "--url", url, "--api", api, "--requests", str(n), "--no-progress",
                        "--json", out] + list(extra), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=60)
    test.assertTrue(os.path.exists(out), "tokentap-bench exited %d: %s" % (p.returncode, p.stderr))
    with open(out) as f:
        return json.load(f)["result"]

import json
import os
import subprocess
import time

import harness
import harness_events
import routing_helpers as rh
from test_accesslog import LogChecks, ROUND_MS

GOOGLE = "/v1beta/models/%s:%s"
VERTEX = "/v1/projects/it-proj/locations/us-central1/publishers/google/models/%s:%s"
PROMPT = "Explain, in a few words, why the sky looks blue on a clear afternoon."


def gemini_body(thoughts=None, max_tokens=None):
    body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
    gc = {}
    if thoughts is not None:
        gc["thinkingConfig"] = {"thinkingBudget": thoughts, "includeThoughts": True}
    if max_tokens is not None:
        gc["maxOutputTokens"] = max_tokens
    if gc:
        body["generationConfig"] = gc
    return body


def array_events(resp):
    """The elements of a streamed JSON array, each stamped with the arrival
    of its last byte (harness.Event), as a client that parses the array
    incrementally sees them."""
    body = resp.body.decode("utf-8")
    at = harness_events._ts_at(resp.pieces)
    dec = json.JSONDecoder()
    out = []
    i = body.index("[") + 1
    for _ in range(len(body)):
        while i < len(body) and body[i] in " \t\r\n,":
            i += 1
        if i >= len(body) or body[i] == "]":
            break
        obj, j = dec.raw_decode(body, i)
        end = len(body[:j].encode("utf-8"))
        out.append(harness.Event(None, body[i:j], at(end), end))
        i = j
    return out


def token_kind(obj):
    """Client-side mirror of docs/metrics.md for one GenerateContentResponse:
    "answer", "reasoning", "tool" or None."""
    kinds = set()
    for cand in obj.get("candidates") or []:
        for part in (cand.get("content") or {}).get("parts") or []:
            if isinstance(part.get("text"), str) and part["text"]:
                kinds.add("reasoning" if part.get("thought") is True else "answer")
            elif isinstance(part.get("functionCall"), dict) or isinstance(part.get("executableCode"), dict):
                kinds.add("tool")
    for k in ("answer", "tool", "reasoning"):
        if k in kinds:
            return k
    return None


def usage_of(objs):
    """(input, output, cached, reasoning) as tokentap defines them, from the
    last usageMetadata: output = candidates + thoughts."""
    um = {}
    for o in objs:
        um = o.get("usageMetadata") or um
    thoughts = um.get("thoughtsTokenCount")
    return (um.get("promptTokenCount"), um.get("candidatesTokenCount", 0) + (thoughts or 0),
            um.get("cachedContentTokenCount"), thoughts)


def measure(port, path, body, headers):
    """One request on a fresh connection, body bytes timestamped on arrival
    (as test_accesslog.measure). Returns (resp, sent, events, token events)."""
    conn = harness.HttpConn(port, kernel_ts=True)
    try:
        raw = harness.request_bytes("POST", path, body, headers, port)
        t0 = conn.send(raw)
        sent = (t0, harness.now_ns())
        resp = conn.read_response()
    finally:
        conn.close()
    if resp.status != 200:
        return resp, sent, [], []
    evs = harness.sse_events(resp) if "event-stream" in (resp.content_type() or "") else array_events(resp)
    toks = [e for e in evs if token_kind(e.json())]
    return resp, sent, evs, toks


class GeminiSimTest(LogChecks):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "11")
        cls.start_logged(cls.sim.url, "tokentap-gemini-", admin=True)

    def direct(self, path, body, headers):
        """What the simulator sends for the same request, straight."""
        resp, _ = harness.exchange(self.sim.port, "POST", path, body, headers)
        return resp

    def stream_case(self, rid0, path, model, sse, thoughts, tokens, cached=None):
        body = gemini_body(thoughts=thoughts)
        extra = [("x-sim-cached-tokens", str(cached))] if cached is not None else None
        full = path + ("?alt=sse" if sse else "")

        def run(attempt):
            rid = "%s-%d" % (rid0, attempt)
            headers = harness.sim_headers(ttft=30, itl=8, tokens=tokens, request_id=rid, extra=extra)
            resp, sent, evs, toks = measure(self.tt.port, full, body, headers)
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete)
            ct = resp.content_type() or ""
            self.assertIn("event-stream" if sse else "application/json", ct)
            objs = [e.json() for e in evs]
            kinds = [token_kind(o) for o in objs]
            self.assertEqual(kinds.count("reasoning"), thoughts or 0, "simulator thoughts (test premise)")
            self.assertEqual(kinds.count("answer"), tokens, "simulator answer parts (test premise)")
            inp, out, cach, reas = usage_of(objs)
            self.assertEqual(out, tokens + (thoughts or 0), "simulator usage (test premise)")

            e = self.entry(rid)
            self.assertEqual(e["api"], "gemini")
            self.assertEqual(e["model"], model, "the model is the path's")
            self.assertEqual(e["path"], path)
            self.assertIs(e["stream"], True)
            self.assertEqual(e["status"], 200)
            self.assertIsNone(e["error"])
            self.assertEqual(e["events"], len(evs))
            self.assertEqual(e["token_events"], len(toks))
            self.assertEqual(e["reasoning_events"], thoughts or 0)
            self.assertEqual(e["tool_call_events"], 0)
            self.assertEqual((e["input_tokens"], e["output_tokens"]), (inp, out))
            self.assertEqual(e["cached_tokens"], cach if cach is not None else None)
            self.assertEqual(e["reasoning_tokens"], reas)
            self.check_timeline(e)
            self.check_derived(e, out)
            # answer_ttft: the first token event that is no thought; its
            # place in the log's own ttft + gaps, which timing_problems
            # holds to the client's clock for every token event
            r = thoughts or 0
            want = e["ttft_ms"] + sum(e["itl_ms"][:r])
            self.assertAlmostEqual(e["answer_ttft_ms"], want, delta=ROUND_MS * (r + 2))
            if r:
                self.assertEqual(token_kind(toks[r].json()), "answer")
                self.assertGreater(e["answer_ttft_ms"], e["ttft_ms"])
            # byte for byte what a direct request gets
            d = self.direct(full, body, harness.sim_headers(ttft=0, itl=0, tokens=tokens, request_id=rid,
                                                            extra=extra))
            self.assertEqual(resp.body, d.body, "bytes forwarded unchanged")
            return e, sent, resp, toks

        self.check_timing(run)

    def test_google_sse(self):
        self.stream_case("it-gem-sse", GOOGLE % ("gemini-2.5-flash", "streamGenerateContent"), "gemini-2.5-flash",
                         sse=True, thoughts=4, tokens=12)

    def test_google_json_array(self):
        self.stream_case("it-gem-arr", GOOGLE % ("gemini-2.5-flash-lite", "streamGenerateContent"),
                         "gemini-2.5-flash-lite", sse=False, thoughts=3, tokens=10, cached=5)

    def test_vertex_json_array(self):
        self.stream_case("it-gem-vx-arr", VERTEX % ("gemini-2.5-pro", "streamGenerateContent"), "gemini-2.5-pro",
                         sse=False, thoughts=None, tokens=9)

    def test_vertex_sse(self):
        self.stream_case("it-gem-vx-sse", VERTEX % ("gemini-2.0-flash", "streamGenerateContent"),
                         "gemini-2.0-flash", sse=True, thoughts=2, tokens=7, cached=3)

    def test_not_streamed(self):
        for i, (path, model) in enumerate(((GOOGLE % ("gemini-nostream-a", "generateContent"), "gemini-nostream-a"),
                                           (VERTEX % ("gemini-nostream-b", "generateContent"), "gemini-nostream-b"))):
            with self.subTest(path=path):
                rid = "it-gem-block-%d" % i
                body = gemini_body(thoughts=6)
                headers = harness.sim_headers(ttft=5, itl=1, tokens=11, request_id=rid)
                resp, _ = harness.exchange(self.tt.port, "POST", path, body, headers)
                self.assertEqual(resp.status, 200)
                inp, out, cach, reas = usage_of([resp.json()])
                self.assertEqual((out, reas), (17, 6), "simulator usage (test premise)")
                self.assertEqual(token_kind(resp.json()), "answer")
                e = self.entry(rid)
                self.assertEqual((e["api"], e["model"]), ("gemini", model))
                self.assertIs(e["stream"], False)
                self.assertIsNone(e["error"])
                self.assertEqual((e["input_tokens"], e["output_tokens"], e["reasoning_tokens"]), (inp, 17, 6))
                self.assertEqual(e["token_events"], 0)
                self.assertIsNone(e["ttft_ms"])
                self.assertEqual(resp.body, self.direct(path, body, headers).body, "bytes forwarded unchanged")
                self.check_stats(model, requests=1, output=17, reasoning=6, errors=0)

    def test_stats(self):
        """/stats: a model's series sums the requests' usage."""
        model = "gemini-stats"
        for i, sse in enumerate((True, False, True)):
            path = GOOGLE % (model, "streamGenerateContent") + ("?alt=sse" if sse else "")
            resp, _ = harness.exchange(self.tt.port, "POST", path, gemini_body(thoughts=2),
                                       harness.sim_headers(ttft=1, itl=1, tokens=5, request_id="it-gem-st-%d" % i))
            self.assertEqual(resp.status, 200)
        self.check_stats(model, requests=3, output=3 * 7, reasoning=3 * 2, errors=0)

    def test_error_body(self):
        """A 400 from the upstream (a google.rpc.Status body): counted by
        its status, forwarded as it came."""
        rid = "it-gem-400"
        path = GOOGLE % ("gemini-2.5-flash", "generateContent")
        resp, _ = harness.exchange(self.tt.port, "POST", path, "{", [("x-request-id", rid)])
        self.assertEqual(resp.status, 400)
        self.assertEqual(resp.json()["error"]["status"], "INVALID_ARGUMENT")
        e = self.log_entry(self.log, rid)
        self.assertEqual((e["api"], e["status"], e["model"]), ("gemini", 400, "gemini-2.5-flash"))
        self.assertEqual(resp.body, self.direct(path, "{", [("x-request-id", rid)]).body)

    def test_bench(self):
        """tokentap-bench drives both framings through tokentap: each
        request ok, tokens from usageMetadata, the access log agreeing."""
        for api in ("gemini", "gemini-array"):
            with self.subTest(api=api):
                model = "gemini-bench-" + api
                res = run_bench(self, "http://127.0.0.1:%d" % self.tt.port, api, 3, ["--model", model, "--output-len", "fixed:6",
                                                            "--input-len", "fixed:16"])
                self.assertEqual((res["requests"]["ok"], res["requests"]["failed"]), (3, 0), res)
                self.check_stats(model, requests=3, output=18, reasoning=0, errors=0)

    def check_stats(self, model, requests, output, reasoning, errors):
        last = []

        def check():
            r, _ = harness.exchange(self.admin, "GET", "/stats?window=5m&model=%s" % model)
            if r.status != 200:
                return False
            last[:] = [s for s in r.json()["series"] if s["model"] == model]
            return bool(last) and last[0]["requests"] >= requests

        harness.wait_until(check, 10.0, 0.1)
        self.assertTrue(last, "no /stats series for model %s" % model)
        s = last[0]
        self.assertEqual(s["requests"], requests)
        self.assertEqual(s["output_tokens"], output)
        self.assertEqual(s["reasoning_tokens"], reasoning)
        self.assertEqual(s["errors"]["response_failed"], errors)


# A fake upstream's stream ending in an in-stream error: two answer
# responses, then the google.rpc.Status element / frame.
def fake_objs():
    part = lambda t: {"candidates": [{"content": {"parts": [{"text": t}], "role": "model"}, "index": 0}],
                      "usageMetadata": {"promptTokenCount": 21, "candidatesTokenCount": 1 if t == "Hel" else 2,
                                        "totalTokenCount": 22 if t == "Hel" else 23},
                      "modelVersion": "gemini-fake"}
    return [part("Hel"), part("lo"), {"error": {"code": 503, "message": "The model is overloaded.",
                                                "status": "UNAVAILABLE"}}]


def fake_array_bytes():
    objs = [json.dumps(o, indent=2).encode() for o in fake_objs()]
    return b"[" + b"\n,\r\n".join(objs) + b"\n]"


def fake_sse_bytes():
    return b"".join(b"data: " + json.dumps(o).encode() + b"\r\n\r\n" for o in fake_objs())


def fake_handler(sock, req, ctx):
    sse = "alt=sse" in req.path
    data = fake_sse_bytes() if sse else fake_array_bytes()
    ct = b"text/event-stream" if sse else b"application/json; charset=UTF-8"
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + ct + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    # cut at odd offsets, inside elements and strings, each piece its own
    # write (and TCP segment, with a pause)
    at = 0
    for step in (7, 93, 1, 250, 13, 64, 3, 10 ** 6):
        if at >= len(data):
            break
        harness.send_chunk(sock, data[at:at + step])
        at += step
        time.sleep(0.005)
    sock.sendall(b"0\r\n\r\n")
    return True


class GeminiErrorTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = harness.FakeUpstream(fake_handler)
        cls.addClassCleanup(cls.up.stop)
        cls.start_logged(cls.up.url, "tokentap-gemini-err-", admin=True)

    def test_in_stream_error(self):
        for sse, model, want in ((False, "gemini-err-array", fake_array_bytes()),
                                 (True, "gemini-err-sse", fake_sse_bytes())):
            with self.subTest(sse=sse):
                rid = "it-gem-err-%d" % sse
                path = GOOGLE % (model, "streamGenerateContent") + ("?alt=sse" if sse else "")
                resp, _ = harness.exchange(self.tt.port, "POST", path, gemini_body(), [("x-request-id", rid)])
                self.assertEqual(resp.status, 200)
                self.assertEqual(resp.body, want, "bytes forwarded unchanged")
                e = self.log_entry(self.log, rid)
                self.assertEqual((e["api"], e["model"], e["stream"]), ("gemini", model, True))
                self.assertEqual(e["error"], "response_failed")
                self.assertEqual(e["events"], 3)
                self.assertEqual(e["token_events"], 2)
                self.assertEqual(e["itl_count"], 1)
                self.assertEqual((e["input_tokens"], e["output_tokens"]), (21, 2))
                GeminiSimTest.check_stats(self, model, requests=1, output=2, reasoning=0, errors=1)

    def test_bench_counts_the_error(self):
        for api in ("gemini", "gemini-array"):
            with self.subTest(api=api):
                res = run_bench(self, self.up.url, api, 2)
                self.assertEqual((res["requests"]["ok"], res["requests"]["failed"]), (0, 2), res)
                self.assertEqual(res["errors"]["response_failed"], 2)


class GeminiRouteTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sims = {n: harness.start_sim(cls, "--ttft-ms", 0, "--itl-ms", 0) for n in ("a", "b")}
        conf = rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()}) + """\
routes:
  - name: pro
    match: {model: gemini-2.5-pro}
    upstream: b
  - name: rest
    match: {path_prefix: /}
    upstream: a
"""
        cls.tt = rh.start_conf(cls, conf)

    def test_model_from_path_routes(self):
        cases = [(GOOGLE % ("gemini-2.5-pro", "streamGenerateContent") + "?alt=sse", "b"),
                 (VERTEX % ("gemini-2.5-pro", "generateContent"), "b"),
                 (VERTEX % ("gemini-2.5-flash", "streamGenerateContent"), "a"),
                 (GOOGLE % ("gemini-2.5-flash", "generateContent"), "a")]
        for path, want in cases:
            with self.subTest(path=path):
                before = rh.sim_requests(self.sims)
                body = dict(gemini_body(), model="gemini-2.5-pro")  # no Gemini field: not read
                resp, _ = harness.exchange(self.tt.port, "POST", path, body, harness.sim_headers(tokens=2))
                self.assertEqual(resp.status, 200, resp.body[:200])
                d = rh.delta(before, rh.sim_requests(self.sims))
                self.assertEqual(d, {n: int(n == want) for n in self.sims})


HERE = os.path.dirname(os.path.abspath(__file__))
SDK_SPEC = "@google/genai@3.3.0"  # the version the test was written against
SDK_DIR = os.path.join(os.path.dirname(HERE), "artifacts", "npm-google-genai")
SDK_SCRIPT = os.path.join(HERE, "gemini_sdk.cjs")


def npm_install_sdk():
    harness.npm_install(SDK_DIR, [SDK_SPEC], timeout=120)


def run_sdk(base_url, rid, ttft, itl, tokens):
    return harness.run_node(SDK_SCRIPT, SDK_DIR, base_url, rid, ttft, itl, tokens)


class GeminiSdkTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        npm_install_sdk()
        cls.sim = harness.start_sim(cls, "--seed", "13")
        cls.start_logged(cls.sim.url, "tokentap-gemini-sdk-")

    def test_sdk_stream_through_tokentap(self):
        tokens, thoughts = 8, 3  # gemini_sdk.cjs asks for a thinking budget of 3
        direct = run_sdk("http://127.0.0.1:%d" % self.sim.port, "it-gem-sdk-direct", 0, 0, tokens)
        self.assertEqual((len(direct["texts"]), len(direct["thoughts"])), (tokens, thoughts),
                         "the SDK reads the simulator's thoughts and text (test premise)")
        for attempt in range(2):
            rid = "it-gem-sdk-%d" % attempt
            via = run_sdk("http://127.0.0.1:%d" % self.tt.port, rid, 60, 10, tokens)
            self.assertEqual(via["chunks"], direct["chunks"], "the SDK yields the same chunks through tokentap")
            usage = via["usage"]
            e = self.log_entry(self.log, rid)
            self.assertEqual((e["api"], e["model"], e["stream"], e["error"]), ("gemini", "gemini-2.5-flash", True,
                                                                              None))
            # @google/genai 3.3 calls /v1/ (older ones /v1beta/): both are Gemini
            self.assertIn(e["path"], ("/v1/models/gemini-2.5-flash:streamGenerateContent",
                                      "/v1beta/models/gemini-2.5-flash:streamGenerateContent"))
            self.assertEqual(e["token_events"], tokens + thoughts)
            self.assertEqual(e["reasoning_events"], thoughts)
            self.assertEqual(e["input_tokens"], usage["promptTokenCount"])
            self.assertEqual(e["output_tokens"], usage["candidatesTokenCount"] + usage["thoughtsTokenCount"])
            self.assertEqual(e["reasoning_tokens"], usage["thoughtsTokenCount"])
            # tokentap's clock starts when the request's first byte arrives,
            # the SDK's before it connects
            self.assertLessEqual(e["ttft_ms"], via["firstMs"] + ROUND_MS)
            self.assertLessEqual(e["answer_ttft_ms"], via["firstAnswerMs"] + ROUND_MS)
            self.assertGreaterEqual(e["ttft_ms"], 60.0)
            self.assertGreaterEqual(e["answer_ttft_ms"], 60.0 + thoughts * 10 - 1)


if __name__ == "__main__":
    import unittest

    unittest.main()
