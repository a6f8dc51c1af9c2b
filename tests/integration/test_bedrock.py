"""test_bedrock.py — AWS Bedrock's ConverseStream and
InvokeModelWithResponseStream through tokentap, over real sockets, against
the simulator's event streams (application/vnd.amazon.eventstream) and a
fake upstream that breaks them (docs/metrics.md, docs/dev/wire-formats.md
section (l)).

- Converse and InvokeModel (Anthropic's events in base64 chunks), streamed:
  the bytes through tokentap equal the simulator's own, byte for byte;
  tokentap's ttft is never later than the raw client's and within 1 ms of
  it at the median, its ITL gaps likewise; the token events, the usage
  exactly as the stream's metadata or invocation metrics say (the whole
  prompt: cache reads and writes added back), the model decoded from the
  path (an inference-profile ARN with %3A and %2F), Bedrock's own
  firstByteLatency recorded as server_ttft_ms beside tokentap's ttft, its
  latencyMs / invocationLatency as server_inference.
- Reasoning (Converse's reasoningContent, InvokeModel's thinking deltas):
  reasoning events and answer_ttft after ttft.
- An in-stream exception (throttlingException): response_failed, counted in
  /stats errors.
- The non-streamed /converse and /invoke: usage from the body.
- AWS's own npm SDK (@aws-sdk/client-bedrock-runtime, its ConverseStream
  and InvokeModelWithResponseStream over HTTP/1.1) through tokentap: it
  decodes every message tokentap forwarded (its decoder checks the CRCs and
  headers), yields the simulator's events, raises ThrottlingException from
  the exception message; tokentap's ttft is not later than the SDK's first
  delta, its usage the SDK's metadata.
- A malformed event stream (bad prelude CRC, bad message CRC, a length past
  the bounds or below the minimum, a header count past the bound): forwarded
  exactly as the upstream sent it, the events before the break measured,
  recorded as upstream_protocol; a good stream on the same tokentap, at the
  same time, untouched.
"""

import base64
import json
import os
import statistics
import struct
import threading
import time
import zlib

import harness
import harness_events

ROUND_MS = 0.003  # logged values are ms with µs precision
TOL_MS = 8.0  # one request's ttft against the client's, on a loaded two-core machine
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku-20240307-v1:0"


def enc(model):
    return model.replace(":", "%3A").replace("/", "%2F")


def converse_path(model=MODEL, stream=True):
    return "/model/%s/%s" % (enc(model), "converse-stream" if stream else "converse")


def invoke_path(model=MODEL, stream=True):
    return "/model/%s/%s" % (enc(model), "invoke-with-response-stream" if stream else "invoke")


CONVERSE_BODY = {"messages": [{"role": "user", "content": [{"text": "Tell me about event streams, briefly."}]}],
                 "system": [{"text": "You are terse."}], "inferenceConfig": {"maxTokens": 400}}
INVOKE_BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 400,
               "messages": [{"role": "user", "content": "Tell me about event streams, briefly."}]}


# --------------------------------------------------------------------------
# the event-stream format, as a client decodes it


def decode(body):
    """[(headers, payload, end offset)] of a whole event stream; fails on
    any CRC or length that is wrong."""
    out, i = [], 0
    while i < len(body):
        total, hlen, pcrc = struct.unpack(">III", body[i:i + 12])
        assert zlib.crc32(body[i:i + 8]) == pcrc, "prelude crc"
        msg = body[i:i + total]
        assert len(msg) == total, "truncated"
        assert zlib.crc32(msg[:-4]) == struct.unpack(">I", msg[-4:])[0], "message crc"
        h, j, hdr = msg[12:12 + hlen], 0, {}
        while j < len(h):
            n = h[j]
            name = h[j + 1:j + 1 + n].decode()
            t = h[j + 1 + n]
            j += 2 + n
            assert t == 7, "the simulator sends string headers only"
            ln = struct.unpack(">H", h[j:j + 2])[0]
            hdr[name] = h[j + 2:j + 2 + ln].decode()
            j += 2 + ln
        out.append((hdr, msg[12 + hlen:-4], i + total))
        i += total
    return out


def message(headers, payload):
    """One message, both CRCs right; headers as (name, type, value bytes)."""
    hb = b""
    for name, t, val in headers:
        hb += bytes([len(name)]) + name.encode() + bytes([t])
        if t in (6, 7):
            hb += struct.pack(">H", len(val))
        hb += val
    total = 16 + len(hb) + len(payload)
    prelude = struct.pack(">II", total, len(hb))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    m = prelude + hb + payload
    return m + struct.pack(">I", zlib.crc32(m))


def event(etype, obj):
    return message([(":event-type", 7, etype.encode()), (":content-type", 7, b"application/json"),
                    (":message-type", 7, b"event")], json.dumps(obj).encode())


def inner(hdr, payload):
    """An event's JSON: a chunk's decoded from its bytes."""
    obj = json.loads(payload)
    if hdr.get(":event-type") == "chunk":
        obj = json.loads(base64.b64decode(obj["bytes"]))
    return obj


def is_token(hdr, obj):
    if hdr.get(":event-type") == "contentBlockDelta":
        d = obj.get("delta", {})
        return bool(d.get("text") or d.get("reasoningContent", {}).get("text"))
    if hdr.get(":event-type") == "chunk":
        d = obj.get("delta", {})
        return obj.get("type") == "content_block_delta" and bool(d.get("text") or d.get("thinking"))
    return False


def client_view(resp, t0):
    """The raw client's ttft and gaps (ms) from the bytes' arrival."""
    at = harness_events._ts_at(resp.pieces)
    toks = [at(end) for hdr, p, end in decode(resp.body) if is_token(hdr, inner(hdr, p))]
    return (toks[0] - t0) / 1e6, [(b - a) / 1e6 for a, b in zip(toks, toks[1:])], len(toks)


class BedrockSimTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "11")
        cls.start_logged(cls.sim.url, "tokentap-bedrock-", admin=True)

    def post(self, path, body, rid, port=None, ttft=None, itl=None, tokens=None, extra=None):
        headers = harness.sim_headers(ttft, itl, tokens, rid, list((extra or {}).items()))
        return harness.exchange(port or self.tt.port, "POST", path, body, headers)

    def check_stream(self, path, body, api, model, tag):
        """Five streams: bytes as the simulator's, timing as the client's,
        the usage as the stream says. Returns the last entry and events."""
        ttft_d, gap_d = [], []
        for i in range(5):
            rid = "it-br-%s-%d" % (tag, i)
            direct, _ = self.post(path, body, rid, port=self.sim.port, ttft=40, itl=12, tokens=9)
            resp, t0 = self.post(path, body, rid, ttft=40, itl=12, tokens=9)
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.content_type(), "application/vnd.amazon.eventstream")
            self.assertTrue(resp.complete)
            self.assertEqual(resp.body, direct.body, "forwarded byte for byte")
            e = self.log_entry(self.log, rid)
            self.assertEqual(e["api"], api)
            self.assertEqual(e["model"], model)
            self.assertIs(e["stream"], True)
            self.assertIsNone(e["error"])
            self.assertEqual(e["token_events"], 9)
            self.assertEqual(e["server_timing"], "bedrock")
            ttft, gaps, n = client_view(resp, t0)
            self.assertEqual(n, 9)
            self.assertLessEqual(e["ttft_ms"], ttft + ROUND_MS, "tokentap's ttft later than the client's")
            self.assertGreaterEqual(e["ttft_ms"], 40.0)
            self.assertLess(ttft - e["ttft_ms"], TOL_MS)
            ttft_d.append(ttft - e["ttft_ms"])
            self.assertEqual(len(e["itl_ms"]), 8)
            gap_d += [abs(a - b) for a, b in zip(gaps, e["itl_ms"])]
        self.assertLess(statistics.median(ttft_d), 1.0, "ttft vs the raw client: %r" % ttft_d)
        self.assertLess(statistics.median(gap_d), 1.0, "gaps vs the raw client: %r" % gap_d)
        return e, [(h, inner(h, p)) for h, p, _ in decode(resp.body)]

    def test_converse_stream(self):
        e, evs = self.check_stream(converse_path(ARN), CONVERSE_BODY, "bedrock-converse", ARN, "conv")
        meta = [o for h, o in evs if h[":event-type"] == "metadata"][0]
        self.assertEqual(e["input_tokens"], meta["usage"]["inputTokens"])
        self.assertEqual(e["output_tokens"], meta["usage"]["outputTokens"])
        self.assertEqual(e["output_tokens"], 9)
        self.assertAlmostEqual(e["server_inference_ms"], meta["metrics"]["latencyMs"], delta=ROUND_MS)
        self.assertIsNone(e["server_ttft_ms"], "Converse reports no first-byte latency")
        self.assertIsNone(e["unattributed_ms"], "nothing the server reported falls in the ttft")
        self.assertEqual([h[":event-type"] for h, _ in evs][:2], ["messageStart", "contentBlockDelta"])

    def test_invoke_stream(self):
        e, evs = self.check_stream(invoke_path(), INVOKE_BODY, "bedrock-invoke", MODEL, "inv")
        m = evs[-1][1]["amazon-bedrock-invocationMetrics"]
        self.assertEqual(e["input_tokens"], m["inputTokenCount"])
        self.assertEqual(e["output_tokens"], m["outputTokenCount"])
        self.assertEqual(m["firstByteLatency"], 40)
        self.assertAlmostEqual(e["server_ttft_ms"], 40.0, delta=ROUND_MS)
        self.assertAlmostEqual(e["server_inference_ms"], m["invocationLatency"], delta=ROUND_MS)
        # the server's ttft is taken out of the upstream's: what is left is
        # the network and Bedrock's front end
        self.assertAlmostEqual(e["unattributed_ms"], e["upstream_ttft_ms"] - 40.0, delta=2 * ROUND_MS)

    def test_cache_and_reasoning(self):
        for path, body, api in ((converse_path(), CONVERSE_BODY, "bedrock-converse"),
                                (invoke_path(), INVOKE_BODY, "bedrock-invoke")):
            with self.subTest(api=api):
                rid = "it-br-reason-" + api
                resp, _ = self.post(path, body, rid, ttft=5, itl=2, tokens=6,
                                    extra={"x-sim-reasoning-tokens": "4", "x-sim-cached-tokens": "3",
                                           "x-sim-cache-write-tokens": "2", "x-sim-think-ms": "40"})
                self.assertEqual(resp.status, 200)
                e = self.log_entry(self.log, rid)
                self.assertEqual(e["token_events"], 10)
                self.assertEqual(e["reasoning_events"], 4)
                # the answer 40 ms after the reasoning: never in the same read
                self.assertGreater(e["answer_ttft_ms"], e["ttft_ms"] + 30)
                self.assertEqual(e["cached_tokens"], 3)
                self.assertEqual(e["cache_write_tokens"], 2)
                evs = [(h, inner(h, p)) for h, p, _ in decode(resp.body)]
                if api == "bedrock-converse":
                    u = [o for h, o in evs if h[":event-type"] == "metadata"][0]["usage"]
                    fresh = u["inputTokens"]
                    self.assertEqual(e["output_tokens"], u["outputTokens"])
                else:
                    fresh = evs[-1][1]["amazon-bedrock-invocationMetrics"]["inputTokenCount"]
                self.assertEqual(e["input_tokens"], fresh + 3 + 2, "the whole prompt")

    def test_exception_counted(self):
        for path, body, api in ((converse_path(), CONVERSE_BODY, "bedrock-converse"),
                                (invoke_path(), INVOKE_BODY, "bedrock-invoke")):
            with self.subTest(api=api):
                rid = "it-br-exc-" + api
                direct, _ = self.post(path, body, rid, port=self.sim.port, ttft=2, itl=1, tokens=3,
                                      extra={"x-sim-exception": "throttlingException"})
                resp, _ = self.post(path, body, rid, ttft=2, itl=1, tokens=3,
                                    extra={"x-sim-exception": "throttlingException"})
                self.assertEqual(resp.body, direct.body)
                last = decode(resp.body)[-1][0]
                self.assertEqual(last[":message-type"], "exception")
                e = self.log_entry(self.log, rid)
                self.assertEqual(e["status"], 200)
                self.assertEqual(e["error"], "response_failed")
                self.assertEqual(e["token_events"], 3)
        r, _ = harness.exchange(self.admin, "GET", "/metrics")
        self.assertIn('kind="response_failed"', r.body.decode())

    def test_not_streamed(self):
        rid = "it-br-conv-whole"
        resp, _ = self.post(converse_path(stream=False), CONVERSE_BODY, rid, tokens=5)
        self.assertEqual(resp.status, 200)
        ans = resp.json()
        e = self.log_entry(self.log, rid)
        self.assertEqual(e["api"], "bedrock-converse")
        self.assertIs(e["stream"], False)
        self.assertEqual(e["input_tokens"], ans["usage"]["inputTokens"])
        self.assertEqual(e["output_tokens"], 5)
        self.assertAlmostEqual(e["server_inference_ms"], ans["metrics"]["latencyMs"], delta=ROUND_MS)
        rid = "it-br-inv-whole"
        resp, _ = self.post(invoke_path(stream=False), INVOKE_BODY, rid, tokens=4)
        ans = resp.json()
        e = self.log_entry(self.log, rid)
        self.assertEqual(e["api"], "bedrock-invoke")
        self.assertEqual(e["input_tokens"], ans["usage"]["input_tokens"])
        self.assertEqual(e["output_tokens"], 4)
        self.assertAlmostEqual(e["server_inference_ms"], float(resp.header("x-amzn-bedrock-invocation-latency")),
                               delta=ROUND_MS)

    def test_stats_series(self):
        rid = "it-br-stats"
        resp, _ = self.post(converse_path("amazon.nova-lite-v1:0"), CONVERSE_BODY, rid, ttft=3, itl=1, tokens=4)
        self.assertEqual(resp.status, 200)
        e = self.log_entry(self.log, rid)
        last = []

        def check():
            r, _ = harness.exchange(self.admin, "GET", "/stats?window=5m&model=amazon.nova-lite-v1:0")
            last[:] = [s for s in r.json()["series"] if s["model"] == "amazon.nova-lite-v1:0"] if r.status == 200 else []
            return bool(last) and last[0]["requests"] >= 1

        harness.wait_until(check, 10.0, 0.1)
        self.assertTrue(last, "no series for the model named in the path")
        self.assertEqual(last[0]["output_tokens"], e["output_tokens"])
        self.assertEqual(last[0]["metrics"]["ttft"]["count"], 1)


# --------------------------------------------------------------------------
# AWS's own SDK

HERE = os.path.dirname(os.path.abspath(__file__))
SDK_DIR = os.path.join(os.path.dirname(HERE), "artifacts", "npm-bedrock")
SDK_SCRIPT = os.path.join(HERE, "bedrock_sdk.cjs")
# No version: the AWS packages are not all served at one version, and npm
# resolves a set that loads together (checked with 3.1178.0).
SDK_SPEC = "@aws-sdk/client-bedrock-runtime"


def npm_install_sdk():
    harness.npm_install(SDK_DIR, [SDK_SPEC], timeout=120)


def run_sdk(port, op, model, rid, ttft, itl, tokens, exception=None):
    return harness.run_node(SDK_SCRIPT, SDK_DIR, "http://127.0.0.1:%d" % port, op, model, rid, ttft, itl, tokens,
                            *([exception] if exception else []))


class BedrockSdkTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        npm_install_sdk()
        cls.sim = harness.start_sim(cls, "--seed", "5")
        cls.start_logged(cls.sim.url, "tokentap-bedrock-sdk-")

    def test_sdk_through_tokentap(self):
        for op, api in (("converse", "bedrock-converse"), ("invoke", "bedrock-invoke")):
            with self.subTest(op=op):
                direct = run_sdk(self.sim.port, op, ARN, "it-br-sdk-direct-" + op, 60, 10, 6)
                rid = "it-br-sdk-" + op
                via = run_sdk(self.tt.port, op, ARN, rid, 60, 10, 6)
                self.assertNotIn("error", via, via)
                self.assertEqual(via["events"], direct["events"], "the SDK decodes what tokentap forwards as the sim's")
                e = self.log_entry(self.log, rid)
                self.assertEqual(e["api"], api)
                self.assertEqual(e["model"], ARN)
                self.assertEqual(e["token_events"], 6)
                self.assertIsNone(e["error"])
                self.assertLessEqual(e["ttft_ms"], via["first_delta_ms"] + ROUND_MS)
                self.assertGreaterEqual(e["ttft_ms"], 60.0)
                if op == "converse":
                    u = via["events"][-1]["metadata"]["usage"]
                    self.assertEqual((e["input_tokens"], e["output_tokens"]), (u["inputTokens"], u["outputTokens"]))
                else:
                    m = via["events"][-1]["amazon-bedrock-invocationMetrics"]
                    self.assertEqual((e["input_tokens"], e["output_tokens"]),
                                     (m["inputTokenCount"], m["outputTokenCount"]))
                    self.assertAlmostEqual(e["server_ttft_ms"], m["firstByteLatency"], delta=ROUND_MS)

    def test_sdk_exception(self):
        rid = "it-br-sdk-exc"
        via = run_sdk(self.tt.port, "converse", MODEL, rid, 5, 1, 3, "throttlingException")
        self.assertEqual(via.get("error"), "ThrottlingException", via)
        self.assertEqual(sum(1 for ev in via["events"] if "contentBlockDelta" in ev), 3)
        e = self.log_entry(self.log, rid)
        self.assertEqual(e["error"], "response_failed")


# --------------------------------------------------------------------------
# malformed streams from a fake upstream


def good_stream(n):
    out = [event("messageStart", {"role": "assistant"})]
    out += [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " w%d" % i}}) for i in range(n)]
    out += [event("contentBlockStop", {"contentBlockIndex": 0}), event("messageStop", {"stopReason": "end_turn"}),
            event("metadata", {"usage": {"inputTokens": 5, "outputTokens": n, "totalTokens": 5 + n},
                               "metrics": {"latencyMs": 20}})]
    return out


def broken(kind):
    """A message the format does not allow."""
    m = bytearray(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " broken"}}))
    if kind == "prelude_crc":
        m[9] ^= 0xFF
    elif kind == "message_crc":
        m[-8] ^= 0x01
    elif kind in ("too_long", "too_short"):
        total = 0x02000000 if kind == "too_long" else 10
        m[0:4] = struct.pack(">I", total)
        m[8:12] = struct.pack(">I", zlib.crc32(bytes(m[0:8])))
    elif kind == "header_count":
        m = bytearray(message([("b", 0, b"")] * 100, b"{}"))
    return bytes(m)


class MalformedStreamTest(harness.TestCase):
    KINDS = ("prelude_crc", "message_crc", "too_long", "too_short", "header_count")

    @classmethod
    def setUpClass(cls):
        cls.sent = {}

        def handler(sock, req, ctx):
            rid = req.header("x-request-id")
            kind = rid.rsplit("-", 1)[-1]
            msgs = good_stream(6)
            if kind in cls.KINDS:
                msgs = msgs[:3] + [broken(kind)] + msgs[3:]
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/vnd.amazon.eventstream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            sent = b""
            for m in msgs:
                # each message in two writes, 3 ms apart: cut inside it
                for piece in (m[:7], m[7:]):
                    harness.send_chunk(sock, piece)
                    sent += piece
                    time.sleep(0.003)
            cls.sent[rid] = sent  # before the end: the client may look as soon as it has it
            sock.sendall(b"0\r\n\r\n")
            return True

        cls.up = harness.start_fake_upstream(cls, handler)
        cls.start_logged(cls.up.url, "tokentap-bedrock-bad-", admin=False)

    def test_malformed_cut_off_measuring_only(self):
        for kind in self.KINDS:
            with self.subTest(kind=kind):
                results = {}

                def run(rid):
                    results[rid] = harness.exchange(self.tt.port, "POST", converse_path(), CONVERSE_BODY,
                                                    [("x-request-id", rid)])[0]

                bad, good = "it-bad-" + kind, "it-good-with-" + kind.replace("_", "")
                threads = [threading.Thread(target=run, args=(r,)) for r in (bad, good)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
                resp = results[bad]
                self.assertEqual(resp.status, 200)
                self.assertTrue(resp.complete)
                self.assertEqual(resp.body, self.sent[bad], "forwarded exactly as the upstream sent it")
                e = self.log_entry(self.log, bad)
                self.assertEqual(e["error"], "upstream_protocol")
                self.assertEqual(e["token_events"], 2, "the events before the break are measured")
                self.assertIsNotNone(e["ttft_ms"])
                self.assertIsNone(e["output_tokens"], "nothing read past the break")
                g = self.log_entry(self.log, good)
                self.assertEqual(results[good].body, self.sent[good])
                self.assertIsNone(g["error"])
                self.assertEqual(g["token_events"], 6)
                self.assertEqual(g["output_tokens"], 6)
                self.assertEqual(g["input_tokens"], 5)
        self.assertIn("event stream is malformed", self.tt.stderr_text())
