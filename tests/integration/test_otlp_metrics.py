"""test_otlp_metrics.py — the GenAI metrics over OTLP/HTTP and in /metrics,
and the trace samplers of OTEL_TRACES_SAMPLER (docs/observability.md).

A fake collector (test_otlp.py's) receives the POSTs; a protobuf reader
written here decodes ExportMetricsServiceRequest. The reader is first proven
on real OTLP: the official OpenTelemetry JS metrics SDK and its OTLP/HTTP
protobuf exporter (npm) export known exponential histograms, which must read
back exactly as the SDK aggregated them. Then requests go through tokentap
and the histograms it exports are checked against its access log: counts,
sums, min and max, every value in the bucket its own value falls in (within
tokentap's 1 % bucket precision), token buckets exact, the attributes. A
collector that is down or answers 500 costs the requests nothing and loses
only metrics, counted in /metrics."""

import json
import math
import os
import struct
import time
import unittest

import harness
import routing_helpers as rh
import test_bedrock
import test_gemini
from test_otlp import (Collector, decode_export, fields, is_json, json_int, json_key_values, json_scope, key_values,
                       metric, start_collector)

SDK = harness.NodeScript("npm-otlp-metrics", ("@opentelemetry/api@1.9.0", "@opentelemetry/sdk-metrics@2.2.0",
                                              "@opentelemetry/resources@2.2.0",
                                              "@opentelemetry/exporter-metrics-otlp-proto@0.208.0",
                                              "@opentelemetry/exporter-metrics-otlp-http@0.208.0"),
                         "otlp_metrics_sdk.cjs", install_timeout=180, run_timeout=30)

SCALE = 7  # tokentap's (otlp_metrics.h)


def dbl(v):
    return struct.unpack("<d", struct.pack("<Q", v))[0]


def zigzag(v):
    return (v >> 1) ^ -(v & 1)


def packed_varints(b):
    out, i = [], 0
    while i < len(b):
        v, shift = 0, 0
        while True:
            c = b[i]
            i += 1
            v |= (c & 0x7F) << shift
            if not c & 0x80:
                break
            shift += 7
        out.append(v)
    return out


def decode_point(buf):
    p = {"attributes": [], "counts": [], "offset": 0, "zero_count": 0, "scale": 0, "min": None, "max": None,
         "sum": None}
    for num, wt, v in fields(buf):
        if num == 1:
            p["attributes"].append(v)
        elif num == 2:
            p["start"] = v
        elif num == 3:
            p["time"] = v
        elif num == 4:
            p["count"] = v
        elif num == 5:
            p["sum"] = dbl(v)
        elif num == 6:
            p["scale"] = zigzag(v)
        elif num == 7:
            p["zero_count"] = v
        elif num == 8:
            for n2, w2, v2 in fields(v):
                if n2 == 1:
                    p["offset"] = zigzag(v2)
                elif n2 == 2:
                    p["counts"] += packed_varints(v2) if w2 == 2 else [v2]
        elif num == 12:
            p["min"] = dbl(v)
        elif num == 13:
            p["max"] = dbl(v)
    p["attributes"] = key_values(p["attributes"])
    return p


def decode_metric(buf):
    m = {"points": []}
    for num, wt, v in fields(buf):
        if num == 1:
            m["name"] = v.decode()
        elif num == 2:
            m["description"] = v.decode()
        elif num == 3:
            m["unit"] = v.decode()
        elif num == 10:
            m["kind"] = "exponential_histogram"
            for n2, w2, v2 in fields(v):
                if n2 == 1:
                    m["points"].append(decode_point(v2))
                elif n2 == 2:
                    m["temporality"] = v2
        elif num in (5, 7, 9, 11):
            m["kind"] = {5: "gauge", 7: "sum", 9: "histogram", 11: "summary"}[num]
    return m


def decode_metrics_export(buf):
    """[{resource, scope, metrics}] of an ExportMetricsServiceRequest."""
    out = []
    for num, wt, rm in fields(buf):
        if num != 1:
            continue
        r = {"resource": {}, "scope": {}, "metrics": []}
        for n2, w2, v2 in fields(rm):
            if n2 == 1:
                r["resource"] = key_values([v for n, w, v in fields(v2) if n == 1])
            elif n2 == 2:
                for n3, w3, v3 in fields(v2):
                    if n3 == 1:
                        r["scope"] = {n: v.decode() for n, w, v in fields(v3) if n in (1, 2)}
                    elif n3 == 2:
                        r["metrics"].append(decode_metric(v3))
        out.append(r)
    return out


def json_double(v):
    return float(v) if isinstance(v, str) else v  # "NaN", "Infinity"


def decode_point_json(js, strict=False):
    """An ExponentialHistogramDataPoint of OTLP/JSON as decode_point makes it."""
    def u64(key, default=None):
        return json_int(js[key], strict) if key in js else default

    pos = js.get("positive", {})
    for k in ("scale",):
        if k in js and not isinstance(js[k], int):
            raise ValueError("%s is a number in OTLP/JSON, got %r" % (k, js[k]))
    p = {"attributes": json_key_values(js.get("attributes"), strict),
         "counts": [json_int(c, strict) for c in pos.get("bucketCounts", [])], "offset": pos.get("offset", 0),
         "zero_count": u64("zeroCount", 0), "scale": js.get("scale", 0),
         "min": json_double(js["min"]) if "min" in js else None,
         "max": json_double(js["max"]) if "max" in js else None,
         "sum": json_double(js["sum"]) if "sum" in js else None}
    for key, name in (("startTimeUnixNano", "start"), ("timeUnixNano", "time"), ("count", "count")):
        if key in js:
            p[name] = json_int(js[key], strict)
    return p


def decode_metric_json(js, strict=False):
    m = {"points": [], "name": js.get("name", ""), "unit": js.get("unit", "")}
    if "description" in js:
        m["description"] = js["description"]
    if "exponentialHistogram" in js:
        h = js["exponentialHistogram"]
        m["kind"] = "exponential_histogram"
        m["points"] = [decode_point_json(p, strict) for p in h.get("dataPoints", [])]
        t = h.get("aggregationTemporality", 0)
        if not isinstance(t, int):
            raise ValueError("aggregationTemporality is an integer in OTLP/JSON, got %r" % (t,))
        m["temporality"] = t
    else:
        for key, kind in (("gauge", "gauge"), ("sum", "sum"), ("histogram", "histogram"), ("summary", "summary")):
            if key in js:
                m["kind"] = kind
    return m


def decode_metrics_export_json(body, strict=False):
    """ExportMetricsServiceRequest as OTLP/JSON -> decode_metrics_export's shape."""
    out = []
    for rm in json.loads(body).get("resourceMetrics", []):
        r = {"resource": json_key_values(rm.get("resource", {}).get("attributes"), strict), "scope": {},
             "metrics": []}
        for sm in rm.get("scopeMetrics", []):
            r["scope"] = json_scope(sm.get("scope", {}))
            r["metrics"] += [decode_metric_json(m, strict) for m in sm.get("metrics", [])]
        out.append(r)
    return out


def exp_index(v, scale=SCALE):
    """The exponential bucket of v > 0: (base^i, base^(i+1)]."""
    m, e = math.frexp(v)
    if m == 0.5:
        return (e - 1) * (1 << scale) - 1
    return math.ceil(math.log2(v) * (1 << scale)) - 1


def expand(p):
    """The bucket index of every sample, in order."""
    out = []
    for i, c in enumerate(p["counts"]):
        out += [p["offset"] + i] * c
    return out


class TestDecoderOnSdk(unittest.TestCase):
    """The wire reader reads the official exporter's metrics back exactly."""

    @classmethod
    def setUpClass(cls):
        SDK.install()

    def known_metrics(self, json_mode):
        coll = start_collector(self)
        sent = SDK("export", coll.url + "/v1/metrics", *(["json"] if json_mode else []))
        # forceFlush exports, and shutdown once more: the same cumulative points
        bodies = [(p, h, b) for p, h, b in coll.posts if b]
        self.assertIn(len(bodies), (1, 2))
        path, headers, body = bodies[0]
        self.assertEqual(path, "/v1/metrics")
        self.assertEqual(headers["content-type"], "application/json" if json_mode else "application/x-protobuf")
        [rm] = decode_metrics_export_json(body) if json_mode else decode_metrics_export(body)
        self.assertEqual(rm["resource"]["service.name"], "otlp-metrics-sdk-test")
        self.assertEqual(rm["scope"], {1: "otlp_metrics_sdk.cjs", 2: "1.0.0"})
        got = {m["name"]: m for m in rm["metrics"]}
        self.assertEqual(set(got), {m["name"] for m in sent})
        for want in sent:
            m = got[want["name"]]
            self.assertEqual(m["kind"], "exponential_histogram")
            self.assertEqual(m["unit"], want["unit"])
            self.assertEqual(m["temporality"], 2)  # CUMULATIVE on the wire (the SDK's enum says 1)
            self.assertEqual(want["temporality"], 1)
            self.assertEqual(len(m["points"]), len(want["points"]))
            for wp in want["points"]:
                [p] = [p for p in m["points"] if p["attributes"] == wp["attributes"]]
                for k in ("count", "sum", "min", "max", "scale", "offset", "counts"):
                    self.assertEqual(p[k], wp[k], k)
                self.assertEqual(p["zero_count"], wp["zeroCount"])
                # and the reader's bucket arithmetic agrees with the SDK's placement
                vals = {"gen_ai.client.operation.duration": [0.05, 0.1, 0.1, 0.25, 2.5]}.get(m["name"])
                if vals:
                    self.assertEqual(expand(p), sorted(exp_index(v, p["scale"]) for v in vals))

    def test_known_metrics(self):
        self.known_metrics(False)

    def test_known_metrics_json(self):
        self.known_metrics(True)


# ---- tokentap's metrics ----

def answer(sock, req, ctx):
    """A chat answer naming the model it ran ("m1-served"); streamed: three
    tokens 15 ms apart and usage; the model "fail": a 503."""
    try:
        asked = json.loads(req.body or b"{}")
    except ValueError:
        asked = {}
    if asked.get("model") == "fail":
        sock.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        return True
    stream = asked.get("stream")
    if stream:
        harness.send_sse_head(sock)
        for t in ("a", "b", "c"):
            time.sleep(0.015)
            harness.send_chunk(sock, b'data: {"model":"m1-served","choices":[{"index":0,"delta":'
                                     b'{"content":"%s"},"finish_reason":null}]}\n\n' % t.encode())
        harness.send_chunk(sock, b'data: {"model":"m1-served","choices":[],"usage":{"prompt_tokens":7,'
                                 b'"completion_tokens":3}}\n\n')
        harness.send_chunk(sock, b"data: [DONE]\n\n")
        sock.sendall(b"0\r\n\r\n")
        return True
    body = json.dumps({"model": "m1-served", "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    return True


def metrics_yaml(url, extra="", protocol=""):
    return ("metrics:\n  genai_prometheus: true\n" +
            ("  otlp:\n    endpoint: %s\n    interval: 300ms\n" % url if url else "") +
            ("    protocol: %s\n" % protocol if protocol else "") +
            "tracing:\n  otlp:\n    timeout: 500ms\n    service_name: tt-metrics\n" + extra)


def latest(coll):
    """The metrics of the last export with a body: {name: metric}, and its resource."""
    with coll.lock:
        posts = [(h, b) for p, h, b in coll.posts if p == "/v1/metrics" and b]
    if not posts:
        return {}, {}
    h, b = posts[-1]
    [rm] = decode_metrics_export_json(b, strict=True) if is_json(h) else decode_metrics_export(b)
    return {m["name"]: m for m in rm["metrics"]}, rm["resource"]


class TestMetrics(harness.TestCase):
    PROTOCOL = ""  # metrics.otlp.protocol: unset, http/protobuf
    CONTENT_TYPE = "application/x-protobuf"

    @classmethod
    def setUpClass(cls):
        cls.coll = start_collector(cls)
        cls.up = harness.start_fake_upstream(cls, answer)
        cls.tt = rh.start_conf(cls, metrics_yaml(cls.coll.url, protocol=cls.PROTOCOL) +
                               rh.upstreams_yaml({"up": cls.up.url}),
                               "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        cls.admin = harness.admin_port(cls.tt)

    def send_all(self):
        ids = []
        for i, stream in enumerate((True, False, True, True, False)):
            rid = "gm-%d" % i
            resp = rh.send(self.tt.port, rh.chat(model="m1", stream=stream), [("x-request-id", rid)])
            self.assertEqual(resp.status, 200)
            ids.append(rid)
        resp = rh.send(self.tt.port, rh.chat(model="fail"), [("x-request-id", "gm-fail")])
        self.assertEqual(resp.status, 503)
        return [self.log_entry(self.tt.log_path, rid) for rid in ids], self.log_entry(self.tt.log_path, "gm-fail")

    def test_against_access_log(self):
        logs, failed = self.send_all()
        n = len(logs)

        def complete():
            ms, _ = latest(self.coll)
            d = ms.get("gen_ai.client.operation.duration")
            return d is not None and sum(p["count"] for p in d["points"]) == n + 1

        self.assertTrue(harness.wait_until(complete, 8.0, 0.05), "no export with all the requests")
        with self.coll.lock:
            types = {h.get("content-type") for p, h, b in self.coll.posts if p == "/v1/metrics"}
        self.assertEqual(types, {self.CONTENT_TYPE})
        ms, res = latest(self.coll)
        self.assertEqual(res["service.name"], "tt-metrics")
        self.assertRegex(res["service.instance.id"], r"^[0-9a-f]{8}-")
        for m in ms.values():
            self.assertEqual(m["kind"], "exponential_histogram")
            self.assertEqual(m["temporality"], 2)
            for p in m["points"]:
                self.assertEqual(p["scale"], SCALE)
                self.assertEqual(p["zero_count"] + sum(p["counts"]), p["count"], m["name"])
                self.assertLess(p["start"], p["time"])
        ok_attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "m1", "gen_ai.response.model": "m1-served",
                    "server.address": "127.0.0.1", "server.port": self.up.port}
        dur = {json.dumps(p["attributes"], sort_keys=True): p for p in ms["gen_ai.client.operation.duration"]["points"]}
        self.assertEqual(ms["gen_ai.client.operation.duration"]["unit"], "s")
        p = dur[json.dumps(ok_attrs, sort_keys=True)]
        e2e = [e["e2e_ms"] / 1e3 for e in logs]
        self.check_hist(p, e2e)
        fail_attrs = {k: v for k, v in ok_attrs.items() if k != "gen_ai.response.model"}
        fail_attrs["gen_ai.request.model"] = "fail"
        fail_attrs["error.type"] = "503"
        pf = dur[json.dumps(fail_attrs, sort_keys=True)]
        self.assertEqual(failed["status"], 503)
        self.check_hist(pf, [failed["e2e_ms"] / 1e3])
        # streamed only: time to first chunk; every gap of every stream: time per output chunk
        streamed = [e for e in logs if e["stream"]]
        [ttfc] = ms["gen_ai.client.operation.time_to_first_chunk"]["points"]
        self.assertEqual(ttfc["attributes"], ok_attrs)
        self.check_hist(ttfc, [e["ttft_ms"] / 1e3 for e in streamed])
        [tpoc] = ms["gen_ai.client.operation.time_per_output_chunk"]["points"]
        gaps = [g / 1e3 for e in streamed for g in e["itl_ms"]]
        self.assertEqual(len(gaps), 2 * len(streamed))
        self.check_hist(tpoc, gaps)
        # tokens: by type, exact buckets (tokentap's buckets below 128 hold one value each)
        tok = ms["gen_ai.client.token.usage"]
        self.assertEqual(tok["unit"], "{token}")
        by_type = {p["attributes"]["gen_ai.token.type"]: p for p in tok["points"]
                   if p["attributes"].get("gen_ai.response.model")}
        for kind, key in (("input", "input_tokens"), ("output", "output_tokens")):
            vals = [e[key] for e in logs]
            pt = by_type[kind]
            self.assertEqual(pt["count"], n)
            self.assertEqual(pt["sum"], sum(vals))
            self.assertEqual((pt["min"], pt["max"]), (min(vals), max(vals)))
            self.assertEqual(expand(pt), sorted(exp_index(v) for v in vals))
        # the same series in /metrics under their Prometheus names
        r, _ = harness.exchange(self.admin, "GET", "/metrics")
        text = r.body.decode()
        self.assertIn("# TYPE gen_ai_client_operation_duration_seconds histogram", text)
        lab = ('gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m1",'
               'gen_ai_response_model="m1-served",server_address="127.0.0.1",server_port="%d",error_type=""'
               % self.up.port)
        self.assertIn("gen_ai_client_operation_duration_seconds_count{%s} %d\n" % (lab, n), text)
        self.assertIn('gen_ai_client_token_usage_sum{%s,gen_ai_token_type="input"} %d\n'
                      % (lab, sum(e["input_tokens"] for e in logs)), text)
        self.assertIn('gen_ai_client_operation_duration_seconds_bucket{%s,le="+Inf"} %d\n' % (lab, n), text)
        # the exporter's counters
        self.assertGreaterEqual(metric(self.admin, "tokentap_otlp_metric_points_exported_total")[""], 5)
        drops = metric(self.admin, "tokentap_otlp_metric_drops_total")
        self.assertEqual(drops['{reason="queue_full"}'], 0)
        self.assertEqual(drops['{reason="export_failed"}'], 0)
        self.assertEqual(metric(self.admin, "tokentap_otlp_metric_overflow_total")[""], 0)

    def check_hist(self, p, vals):
        """count, sum (the log rounds to the µs), min, max, and each value's
        bucket: tokentap's bucket holds values within 1 % of its midpoint,
        2 buckets of 0.54 % at scale 7."""
        self.assertEqual(p["count"], len(vals))
        self.assertAlmostEqual(p["sum"], sum(vals), delta=2e-6 * len(vals))
        self.assertAlmostEqual(p["min"], min(vals), delta=2e-6)
        self.assertAlmostEqual(p["max"], max(vals), delta=2e-6)
        got, want = expand(p), sorted(exp_index(v) for v in vals)
        self.assertEqual(len(got), len(want))
        for g, w in zip(got, want):
            self.assertLessEqual(abs(g - w), 2, (got, want))


class TestMetricsJson(TestMetrics):
    """The same, exported as OTLP/JSON (metrics.otlp.protocol: http/json):
    the JSON reader, proven on the official exporter's, reads the same
    histograms, against the same access log (strict: tokentap's 64-bit
    integers are decimal strings)."""

    PROTOCOL = "http/json"
    CONTENT_TYPE = "application/json"


class TestOverflow(harness.TestCase):
    """Past metrics.otlp.max_series attribute sets, one set marked
    otel.metric.overflow takes the rest, counted."""

    def test_overflow(self):
        coll = start_collector(self)
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, metrics_yaml(coll.url).replace("interval: 300ms", "interval: 300ms\n    max_series: 2")
                           + rh.upstreams_yaml({"up": up.url}), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        for i, model in enumerate(("a", "b", "c", "d", "a")):
            resp = rh.send(tt.port, rh.chat(model=model), [("x-request-id", "ov-%d" % i)])
            self.assertEqual(resp.status, 200)

        def complete():
            ms, _ = latest(coll)
            d = ms.get("gen_ai.client.operation.duration")
            return d is not None and sum(p["count"] for p in d["points"]) == 5

        self.assertTrue(harness.wait_until(complete, 8.0, 0.05))
        ms, _ = latest(coll)
        pts = ms["gen_ai.client.operation.duration"]["points"]
        by = {p["attributes"].get("gen_ai.request.model", "overflow"): p["count"] for p in pts}
        self.assertEqual(by, {"a": 2, "b": 1, "overflow": 2})
        [ov] = [p for p in pts if "gen_ai.request.model" not in p["attributes"]]
        self.assertEqual(ov["attributes"], {"otel.metric.overflow": True})
        self.assertEqual(metric(admin, "tokentap_otlp_metric_overflow_total")[""], 2)


class TestSpanResponseModel(harness.TestCase):
    """gen_ai.response.model on the span: the model the answer names."""

    def test_span_attribute(self):
        coll = start_collector(self)
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, "tracing:\n  new_traces: true\n  otlp: {endpoint: %s, schedule_delay: 100ms}\n"
                           % coll.url + rh.upstreams_yaml({"up": up.url}), *rh.ONE_WORKER)
        for rid, stream in (("rm-s", True), ("rm-p", False)):
            resp = rh.send(tt.port, rh.chat(model="m1", stream=stream), [("x-request-id", rid)])
            self.assertEqual(resp.status, 200)
            [(s, rs, h, path)] = coll.span_of(rid)
            self.assertEqual(s["attributes"]["gen_ai.request.model"], "m1")
            self.assertEqual(s["attributes"]["gen_ai.response.model"], "m1-served")


class TestResponseModelSim(harness.TestCase):
    """gen_ai.response.model from what Gemini and Bedrock answers name (the
    simulator speaking each API, docs/dev/wire-formats.md): Gemini's
    `modelVersion` (every streamed response, SSE or array, and the body,
    where it comes after the candidates), Bedrock InvokeModel's Anthropic
    `model` (message_start's message, the body); Bedrock Converse names
    none, so the span has none. On the span and on the metrics' points."""

    GEMINI = "gemini-2.5-flash"

    @classmethod
    def setUpClass(cls):
        cls.coll = start_collector(cls)
        cls.sim = harness.start_sim(cls, "--ttft-ms", 0, "--itl-ms", 0, "--tokens", 1200)
        cls.tt = rh.start_conf(cls, metrics_yaml(cls.coll.url).replace("tracing:\n", "tracing:\n  new_traces: true\n")
                               .replace("    service_name: tt-metrics\n",
                                        "    service_name: tt-metrics\n    schedule_delay: 100ms\n")
                               + "    endpoint: %s\n" % cls.coll.url + rh.upstreams_yaml({"sim": cls.sim.url}),
                               *rh.ONE_WORKER)

    def span_model(self, rid, path, body):
        resp = rh.send(self.tt.port, body, [("x-request-id", rid)], path=path)
        self.assertEqual(resp.status, 200, resp.body[:300])
        e = self.log_entry(self.tt.log_path, rid)
        [(s, rs, h, p)] = self.coll.span_of(rid)
        return s["attributes"].get("gen_ai.response.model"), e

    def test_gemini(self):
        body = test_gemini.gemini_body()
        base = "/v1beta/models/%s:" % self.GEMINI
        for rid, path in (("rm-g-sse", base + "streamGenerateContent?alt=sse"),
                          ("rm-g-array", base + "streamGenerateContent"),
                          ("rm-g-body", base + "generateContent")):
            model, e = self.span_model(rid, path, body)
            self.assertEqual(e["api"], "gemini", rid)
            self.assertEqual(model, self.GEMINI, rid)
        # the body's modelVersion is past its first 4 KiB, after the candidates
        self.assertGreater(e["bytes_out"], 4096)

    def test_bedrock(self):
        m = test_bedrock.MODEL
        for rid, path, body, want in (
                ("rm-bi-stream", test_bedrock.invoke_path(m, True), test_bedrock.INVOKE_BODY, m),
                ("rm-bi-body", test_bedrock.invoke_path(m, False), test_bedrock.INVOKE_BODY, m),
                ("rm-bc-stream", test_bedrock.converse_path(m, True), test_bedrock.CONVERSE_BODY, None),
                ("rm-bc-body", test_bedrock.converse_path(m, False), test_bedrock.CONVERSE_BODY, None)):
            model, e = self.span_model(rid, path, body)
            self.assertTrue(e["api"].startswith("bedrock"), rid)
            self.assertEqual(model, want, rid)

    def test_metrics_points(self):
        self.span_model("rm-pt", "/v1beta/models/%s:streamGenerateContent?alt=sse" % self.GEMINI,
                        test_gemini.gemini_body())

        def found():
            ms, _ = latest(self.coll)
            d = ms.get("gen_ai.client.operation.duration")
            return d is not None and any(p["attributes"].get("gen_ai.response.model") == self.GEMINI
                                         for p in d["points"])

        self.assertTrue(harness.wait_until(found, 8.0, 0.05), "no point with Gemini's modelVersion")


class TestCollectorFaults(harness.TestCase):
    """A collector that is down or answers 500: every request answered as
    before, the metrics lost and counted."""

    def run_against(self, url):
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, metrics_yaml(url) + rh.upstreams_yaml({"up": up.url}), "--admin", "127.0.0.1:0",
                           *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        for i in range(4):
            resp = rh.send(tt.port, rh.chat(model="m1", stream=bool(i % 2)), [("x-request-id", "gf-%d" % i)])
            self.assertEqual(resp.status, 200)
            self.assertIsNone(self.log_entry(tt.log_path, "gf-%d" % i).get("error"))

        def failed():
            d = metric(admin, "tokentap_otlp_metric_drops_total")
            return d.get('{reason="export_failed"}', 0) >= 1
        self.assertTrue(harness.wait_until(failed, 8.0, 0.05))
        self.assertGreaterEqual(metric(admin, "tokentap_otlp_metric_export_failures_total")[""], 1)
        self.assertEqual(metric(admin, "tokentap_otlp_metric_points_exported_total")[""], 0)
        self.assertEqual(metric(admin, "tokentap_otlp_metric_drops_total")['{reason="queue_full"}'], 0)
        # /metrics still has every request
        r, _ = harness.exchange(admin, "GET", "/metrics")
        counts = [float(l.rpartition(" ")[2]) for l in r.body.decode().splitlines()
                  if l.startswith("gen_ai_client_operation_duration_seconds_count{")]
        self.assertEqual(sum(counts), 4)

    def test_down(self):
        port = harness.free_port()
        self.run_against("http://127.0.0.1:%d" % port)

    def test_500(self):
        coll = start_collector(self, "500")
        self.run_against(coll.url)
        self.assertGreaterEqual(len(coll.posts), 1)


class TestSlowCollector(harness.TestCase):
    """A collector that holds a POST: the ring is drained meanwhile, so
    /metrics has every request long before the POST ends, and nothing is
    dropped."""

    def test_drained_during_post(self):
        coll = start_collector(self, "slow", 2.0)
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, metrics_yaml(coll.url).replace("timeout: 500ms", "timeout: 10s")
                           + rh.upstreams_yaml({"up": up.url}), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        resp = rh.send(tt.port, rh.chat(model="m1"), [("x-request-id", "sl-0")])
        self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: len(coll.posts) >= 1, 5.0, 0.02))
        t0 = time.monotonic()  # the collector now holds that POST for 2 s
        for i in range(1, 6):
            resp = rh.send(tt.port, rh.chat(model="m1", stream=bool(i % 2)), [("x-request-id", "sl-%d" % i)])
            self.assertEqual(resp.status, 200)

        def counted():
            r, _ = harness.exchange(admin, "GET", "/metrics")
            return sum(float(l.rpartition(" ")[2]) for l in r.body.decode().splitlines()
                       if l.startswith("gen_ai_client_operation_duration_seconds_count{")) == 6
        self.assertTrue(harness.wait_until(counted, 2.0, 0.02))
        self.assertLess(time.monotonic() - t0, 1.9, "counted only once the POST ended")
        self.assertEqual(len(coll.posts), 1)
        self.assertEqual(metric(admin, "tokentap_otlp_metric_drops_total")['{reason="queue_full"}'], 0)
        # the stop: the POST in flight ends, no last one after a slow export (the harness times the stop)


# ---- the samplers ----

def flags_sent(up, rid):
    got = []

    def find():
        got[:] = [r for r in list(up.requests) if r.header("x-request-id") == rid]
        return bool(got)

    assert harness.wait_until(find, 5.0, 0.02)
    tp = got[0].header("traceparent")
    return tp[-2:] if tp else None


class TestSamplers(harness.TestCase):
    """OTEL_TRACES_SAMPLER / _ARG, as an SDK reads them; tracing.sampler wins."""

    def start(self, env, extra=""):
        coll = start_collector(self)
        up = harness.start_fake_upstream(self, answer)
        old = dict(os.environ)
        os.environ.update(env)
        try:
            tt = rh.start_conf(self, "tracing:\n  new_traces: true\n%s  otlp: {endpoint: %s, schedule_delay: 100ms}\n"
                               % (extra, coll.url) + rh.upstreams_yaml({"up": up.url}), *rh.ONE_WORKER)
        finally:
            os.environ.clear()
            os.environ.update(old)
        return tt, up, coll

    def send(self, tt, rid, flags=None, trace="4bf92f3577b34da6a3ce929d0e0e4736"):
        h = [("x-request-id", rid)]
        if flags is not None:
            h.append(("traceparent", "00-%s-00f067aa0ba902b7-%s" % (trace, flags)))
        resp = rh.send(tt.port, rh.chat(), h)
        self.assertEqual(resp.status, 200)

    def exported(self, coll, rids, last):
        coll.span_of(last)  # spans come in order: one after the others means they would have come
        ids = {x[0]["attributes"].get("tokentap.request_id") for x in coll.spans()}
        return {r for r in rids if r in ids}

    def test_default_parentbased_always_on(self):
        tt, up, coll = self.start({})
        self.send(tt, "d-root")
        self.send(tt, "d-on", "01")
        self.send(tt, "d-off", "00")
        self.assertEqual([flags_sent(up, r) for r in ("d-root", "d-on", "d-off")], ["01", "01", "00"])
        self.assertEqual(self.exported(coll, {"d-root", "d-on", "d-off"}, "d-on"), {"d-root", "d-on"})

    def test_always_off(self):
        tt, up, coll = self.start({"OTEL_TRACES_SAMPLER": "always_off"})
        self.send(tt, "a-root")
        self.send(tt, "a-on", "01")
        self.assertEqual([flags_sent(up, r) for r in ("a-root", "a-on")], ["00", "00"])
        time.sleep(0.5)
        self.assertEqual(coll.spans(), [])

    def test_always_on(self):
        tt, up, coll = self.start({"OTEL_TRACES_SAMPLER": "always_on"})
        self.send(tt, "n-off", "00")
        self.assertEqual(flags_sent(up, "n-off"), "01")
        coll.span_of("n-off")

    def test_traceidratio(self):
        # the last 8 bytes of the trace id against ratio * 2^64: 0x1... is below 0.5, 0xf... is not
        tt, up, coll = self.start({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"})
        self.send(tt, "r-low", "00", trace="ffffffffffffffff1000000000000000")
        self.send(tt, "r-high", "01", trace="0000000000000001f00000000000000f")
        self.assertEqual([flags_sent(up, r) for r in ("r-low", "r-high")], ["01", "00"])
        self.assertEqual(self.exported(coll, {"r-low", "r-high"}, "r-low"), {"r-low"})

    def test_parentbased_traceidratio_zero(self):
        tt, up, coll = self.start({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                   "OTEL_TRACES_SAMPLER_ARG": "0"})
        self.send(tt, "p-root")
        self.send(tt, "p-on", "01", trace="ffffffffffffffffffffffffffffffff")
        self.send(tt, "p-off", "00", trace="00000000000000000000000000000001")
        self.assertEqual([flags_sent(up, r) for r in ("p-root", "p-on", "p-off")], ["00", "01", "00"])

    def test_file_wins(self):
        tt, up, coll = self.start({"OTEL_TRACES_SAMPLER": "always_off"}, "  sampler: always_on\n")
        self.send(tt, "f-off", "00")
        self.assertEqual(flags_sent(up, "f-off"), "01")


if __name__ == "__main__":
    unittest.main()
