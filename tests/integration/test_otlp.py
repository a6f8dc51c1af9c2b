"""test_otlp.py — tokentap's spans over OTLP/HTTP (docs/observability.md).

A fake collector (an HTTP server in this process) receives the POSTs; a
protobuf wire reader written here decodes them. The reader is first proven
on real OTLP: the official OpenTelemetry JS SDK and its OTLP/HTTP protobuf
exporter (npm, installed into tests/artifacts like test_tracectx.py's
propagator) send a known span, which must read back exactly. Then the SDK
makes a client span and sends a request through tokentap: the span tokentap
exports has the client's trace, the client's span as its parent, the span id
the upstream received in traceparent, and the access log's attributes and
timings. A collector that is down, answers 500 or 503, or is slow costs the
requests nothing and loses only spans, counted in /metrics."""

import base64
import gzip
import json
import os
import re
import shutil
import ssl
import statistics
import struct
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import harness
import routing_helpers as rh
from test_tls import make_pki

SDK = harness.NodeScript("npm-otlp", ("@opentelemetry/api@1.9.0", "@opentelemetry/core@2.2.0",
                                      "@opentelemetry/sdk-trace-base@2.2.0", "@opentelemetry/resources@2.2.0",
                                      "@opentelemetry/exporter-trace-otlp-proto@0.208.0",
                                      "@opentelemetry/exporter-trace-otlp-http@0.208.0"),
                         "otlp_sdk.cjs", install_timeout=180, run_timeout=30)
npm_install_sdk = SDK.install
sdk = SDK


# ---- a protobuf wire reader, and OTLP's trace messages on it ----

def fields(buf):
    """[(number, wire type, value)]: varints as ints, fixed64/32 as ints,
    length-delimited as bytes. Raises on a malformed message."""
    out, i = [], 0

    def varint():
        nonlocal i
        v, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    while i < len(buf):
        key = varint()
        num, wt = key >> 3, key & 7
        if wt == 0:
            v = varint()
        elif wt == 1:
            v = struct.unpack_from("<Q", buf, i)[0]
            i += 8
        elif wt == 2:
            n = varint()
            if i + n > len(buf):
                raise ValueError("field %d runs past the message" % num)
            v = bytes(buf[i:i + n])
            i += n
        elif wt == 5:
            v = struct.unpack_from("<I", buf, i)[0]
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((num, wt, v))
    return out


def any_value(buf):
    for num, wt, v in fields(buf):
        if num == 1:
            return v.decode()
        if num == 2:
            return bool(v)
        if num == 3:
            return v - (1 << 64) if v >= 1 << 63 else v
        if num == 4:
            return struct.unpack("<d", struct.pack("<Q", v))[0]
        if num == 7:
            return v
    return None


def key_values(items):
    out = {}
    for b in items:
        k, val = None, None
        for num, wt, v in fields(b):
            if num == 1:
                k = v.decode()
            elif num == 2:
                val = any_value(v)
        out[k] = val
    return out


def decode_span(buf):
    s = {"trace_id": "", "span_id": "", "parent_span_id": "", "trace_state": "", "flags": 0, "kind": 0,
         "start": 0, "end": 0, "events": [], "status": {"code": 0, "message": ""}}
    attrs = []
    for num, wt, v in fields(buf):
        if num == 1:
            s["trace_id"] = v.hex()
        elif num == 2:
            s["span_id"] = v.hex()
        elif num == 3:
            s["trace_state"] = v.decode()
        elif num == 4:
            s["parent_span_id"] = v.hex()
        elif num == 5:
            s["name"] = v.decode()
        elif num == 6:
            s["kind"] = v
        elif num == 7:
            assert wt == 1, "start_time_unix_nano is fixed64"
            s["start"] = v
        elif num == 8:
            assert wt == 1, "end_time_unix_nano is fixed64"
            s["end"] = v
        elif num == 9:
            attrs.append(v)
        elif num == 11:
            ev = {"time": 0, "name": "", "attributes": {}}
            eattrs = []
            for n2, w2, v2 in fields(v):
                if n2 == 1:
                    ev["time"] = v2
                elif n2 == 2:
                    ev["name"] = v2.decode()
                elif n2 == 3:
                    eattrs.append(v2)
            ev["attributes"] = key_values(eattrs)
            s["events"].append(ev)
        elif num == 15:
            for n2, w2, v2 in fields(v):
                if n2 == 2:
                    s["status"]["message"] = v2.decode()
                elif n2 == 3:
                    s["status"]["code"] = v2
        elif num == 16:
            s["flags"] = v
    s["attributes"] = key_values(attrs)
    return s


def decode_export(buf):
    """ExportTraceServiceRequest -> [{resource, scope, spans}]."""
    out = []
    for num, wt, rs in fields(buf):
        if num != 1:
            continue
        resource, scopes = {}, []
        for n2, w2, v2 in fields(rs):
            if n2 == 1:
                resource = key_values([v for n, w, v in fields(v2) if n == 1])
            elif n2 == 2:
                scope, spans = {}, []
                for n3, w3, v3 in fields(v2):
                    if n3 == 1:
                        scope = {n: v.decode() for n, w, v in fields(v3) if n in (1, 2)}
                    elif n3 == 2:
                        spans.append(decode_span(v3))
                scopes.append({"scope": scope, "spans": spans})
        for sc in scopes:
            out.append({"resource": resource, "scope": sc["scope"], "spans": sc["spans"]})
    return out


# ---- OTLP/JSON (the specification's JSON encoding), to the same shapes ----

def json_int(v, strict=False):
    """A 64-bit integer of OTLP/JSON: a decimal string (what the protobuf
    JSON mapping writes), or a number (what a reader must accept too).
    strict: only the string."""
    if isinstance(v, str):
        if not re.fullmatch(r"-?[0-9]+", v):
            raise ValueError("not a decimal integer: %r" % v)
        return int(v)
    if strict or isinstance(v, bool) or not isinstance(v, int):
        raise ValueError("a 64-bit integer is a decimal string in OTLP/JSON, got %r" % (v,))
    return v


def json_id(v, n):
    """traceId / spanId: hex of n bytes (OTLP's exception to base64)."""
    if not isinstance(v, str) or not re.fullmatch(r"[0-9a-fA-F]{%d}" % (2 * n), v):
        raise ValueError("not a hex id of %d bytes: %r" % (n, v))
    return v.lower()


def json_any_value(v, strict=False):
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return json_int(v["intValue"], strict)
    if "doubleValue" in v:
        d = v["doubleValue"]
        return float(d) if isinstance(d, str) else d  # "NaN", "Infinity"
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def json_key_values(items, strict=False):
    return {kv["key"]: json_any_value(kv.get("value", {}), strict) for kv in items or []}


def json_scope(sc):
    return {k: v for k, v in ((1, sc.get("name", "")), (2, sc.get("version", ""))) if v}


def decode_span_json(js, strict=False):
    """One Span of OTLP/JSON as decode_span makes it. strict: tokentap's own
    output, which must write 64-bit integers as strings and enums as
    integers."""
    def t(key):
        return json_int(js[key], strict) if key in js else 0

    kind = js.get("kind", 0)
    if not isinstance(kind, int):
        raise ValueError("kind is an integer in OTLP/JSON, got %r" % (kind,))
    s = {"trace_id": json_id(js["traceId"], 16), "span_id": json_id(js["spanId"], 8),
         "parent_span_id": json_id(js["parentSpanId"], 8) if js.get("parentSpanId") else "",
         "trace_state": js.get("traceState", ""), "flags": js.get("flags", 0), "kind": kind,
         "name": js.get("name", ""), "start": t("startTimeUnixNano"), "end": t("endTimeUnixNano"),
         "attributes": json_key_values(js.get("attributes"), strict), "events": []}
    for ev in js.get("events", []):
        s["events"].append({"time": json_int(ev.get("timeUnixNano", "0"), strict), "name": ev.get("name", ""),
                            "attributes": json_key_values(ev.get("attributes"), strict)})
    st = js.get("status", {})
    if not isinstance(st.get("code", 0), int):
        raise ValueError("status.code is an integer in OTLP/JSON, got %r" % (st["code"],))
    s["status"] = {"code": st.get("code", 0), "message": st.get("message", "")}
    return s


def decode_export_json(body, strict=False):
    """ExportTraceServiceRequest as OTLP/JSON -> decode_export's shape."""
    doc = json.loads(body)
    out = []
    for rs in doc.get("resourceSpans", []):
        resource = json_key_values(rs.get("resource", {}).get("attributes"), strict)
        for ss in rs.get("scopeSpans", []):
            out.append({"resource": resource, "scope": json_scope(ss.get("scope", {})),
                        "spans": [decode_span_json(sp, strict) for sp in ss.get("spans", [])]})
    return out


def is_json(headers):
    return headers.get("content-type", "").split(";")[0].strip() == "application/json"


# ---- the fake collector ----

class Collector:
    """An OTLP/HTTP receiver on an ephemeral port. mode: "ok" (200), an
    HTTP status to answer, or "slow" (waits `delay` s, then 200)."""

    def __init__(self, mode="ok", delay=0.0, tls=None):
        """tls: (cert, key) to answer HTTPS."""
        self.mode, self.delay = mode, delay
        self.posts = []  # (path, headers dict, body)
        self.lock = threading.Lock()
        coll = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    for _ in range(1 << 16):  # bounded: a chunk per turn
                        n = int(self.rfile.readline().split(b";")[0], 16)
                        if n == 0:
                            self.rfile.readline()
                            break
                        body += self.rfile.read(n)
                        self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                with coll.lock:
                    coll.posts.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if coll.mode == "slow":
                    time.sleep(coll.delay)
                code = 200 if coll.mode in ("ok", "slow", "close") else int(coll.mode)
                self.send_response(code)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()
                if coll.mode == "close":  # as an idle timeout would: closed after the answer, unannounced
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *a: None  # a refused handshake is a test's point, not noise
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def spans(self):
        with self.lock:
            posts = list(self.posts)
        out = []
        for path, headers, body in posts:
            for rs in (decode_export_json(body, strict=True) if is_json(headers) else decode_export(body)):
                for s in rs["spans"]:
                    out.append((s, rs, headers, path))
        return out

    def span_of(self, rid, timeout=8.0):
        got = []

        def find():
            got[:] = [x for x in self.spans() if x[0]["attributes"].get("tokentap.request_id") == rid]
            return bool(got)

        assert harness.wait_until(find, timeout, 0.05), "no span for request %s reached the collector" % rid
        return got


def start_collector(test, *args):
    c = Collector(*args)
    harness._add_cleanup(test, c.stop)
    return c


def answer(sock, req, ctx):
    """A chat answer; streamed: three tokens 20 ms apart and usage."""
    if harness.wants_stream(req):
        harness.send_sse_head(sock)
        harness.send_chat_stream(sock, gap_s=0.02)
        return True
    harness.send_json(sock, {"model": "m1", "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    return True


def metric(admin, name):
    """{labels text: value} of a counter family in /metrics."""
    r, _ = harness.exchange(admin, "GET", "/metrics")
    assert r is not None and r.status == 200
    out = {}
    for line in r.body.decode().splitlines():
        if line.startswith(name):
            key, _, val = line.rpartition(" ")
            out[key[len(name):]] = float(val)
    return out


def otlp_yaml(url, extra=""):
    return ("tracing:\n  otlp:\n    endpoint: %s\n    schedule_delay: 100ms\n    timeout: 500ms\n"
            "    headers: \"x-team=gen%%20ai,authorization=Bearer t0k\"\n"
            "    resource_attributes: \"deployment.environment=ci,service.name=ignored\"\n"
            "    service_name: tt-under-test\n%s" % (url, extra))


class TestDecoderOnSdk(unittest.TestCase):
    """The wire reader reads the official exporter's span back exactly; the
    JSON reader the official OTLP/JSON exporter's (exporter-trace-otlp-http)."""

    @classmethod
    def setUpClass(cls):
        npm_install_sdk()

    def known_span(self, json_mode):
        coll = start_collector(self)
        sent = sdk("export", coll.url + "/v1/traces", *(["json"] if json_mode else []))
        self.assertEqual(len(coll.posts), 1)
        path, headers, body = coll.posts[0]
        self.assertEqual(path, "/v1/traces")
        self.assertEqual(headers["content-type"], "application/json" if json_mode else "application/x-protobuf")
        self.assertEqual(is_json(headers), json_mode)
        [rs] = decode_export_json(body) if json_mode else decode_export(body)
        self.assertEqual(rs["resource"]["service.name"], "otlp-sdk-test")
        self.assertEqual(rs["resource"]["deployment.environment"], "ci")
        self.assertEqual(rs["scope"], {1: "otlp_sdk.cjs", 2: "1.0.0"})
        [s] = rs["spans"]
        self.assertEqual(s["trace_id"], sent["traceId"])
        self.assertEqual(s["span_id"], sent["spanId"])
        self.assertEqual(s["parent_span_id"], sent["parentSpanId"])
        self.assertEqual(s["name"], sent["name"])
        self.assertEqual(s["kind"], 2)  # SERVER
        self.assertEqual(s["start"], int(sent["start"]))
        self.assertEqual(s["end"], int(sent["end"]))
        self.assertEqual(s["attributes"], sent["attributes"])
        self.assertEqual([(e["name"], e["time"]) for e in s["events"]],
                         [(n, int(t)) for n, t in sent["events"]])
        self.assertEqual(s["events"][1]["attributes"], {"n": 3})
        self.assertEqual(s["status"], {"code": 2, "message": "boom"})
        self.assertEqual(s["flags"] & 0xFF, 1)
        return body

    def test_known_span(self):
        self.known_span(False)

    def test_known_span_json(self):
        body = self.known_span(True)
        # the keys are the specification's lowerCamelCase: the reader looks for no other
        self.assertIn(b'"resourceSpans"', body)
        self.assertIn(b'"startTimeUnixNano"', body)
        self.assertNotIn(b'"start_time_unix_nano"', body)


class TestSpans(harness.TestCase):
    """The SDK's client span, through tokentap, to tokentap's exported span."""

    PROTOCOL = ""  # tracing.otlp.protocol: unset, http/protobuf
    CONTENT_TYPE = "application/x-protobuf"

    @classmethod
    def setUpClass(cls):
        npm_install_sdk()
        cls.coll = start_collector(cls)
        cls.up = harness.start_fake_upstream(cls, answer)
        extra = "    protocol: %s\n" % cls.PROTOCOL if cls.PROTOCOL else ""
        cls.tt = rh.start_conf(cls, otlp_yaml(cls.coll.url, extra) + rh.upstreams_yaml({"up": cls.up.url}),
                               "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        cls.admin = harness.admin_port(cls.tt)

    def upstream_traceparent(self, rid):
        def find():
            return [r for r in list(self.up.requests) if r.header("x-request-id") == rid]

        self.assertTrue(harness.wait_until(lambda: bool(find()), 5.0, 0.02))
        return find()[0].header("traceparent")

    def check(self, rid, stream):
        sent = sdk("send", self.tt.port, rid, "1" if stream else "0")
        self.assertEqual(sent["status"], 200)
        tp = self.upstream_traceparent(rid)
        e = self.log_entry(self.tt.log_path, rid)
        [(s, rs, headers, path)] = self.coll.span_of(rid)
        self.assertEqual(path, "/v1/traces")
        self.assertEqual(headers["content-type"], self.CONTENT_TYPE)
        self.assertEqual(headers["x-team"], "gen ai")
        self.assertEqual(headers["authorization"], "Bearer t0k")
        res = rs["resource"]
        self.assertEqual(res["service.name"], "tt-under-test")
        self.assertEqual(res["deployment.environment"], "ci")
        self.assertRegex(res["service.instance.id"], r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-")
        self.assertEqual(rs["scope"][1], "tokentap")
        # the trace: the client's, its span the parent, tokentap's span the upstream's parent
        self.assertEqual(s["trace_id"], sent["traceId"])
        self.assertEqual(s["parent_span_id"], sent["spanId"])
        self.assertEqual(tp, "00-%s-%s-01" % (s["trace_id"], s["span_id"]))
        self.assertEqual((s["trace_id"], s["span_id"]), (e["trace_id"], e["span_id"]))
        self.assertEqual(s["flags"], 0x301)  # sampled; the parent is remote
        self.assertEqual(s["kind"], 2)
        self.assertEqual(s["name"], "chat m1")
        a = s["attributes"]
        self.assertEqual(a["gen_ai.operation.name"], "chat")
        self.assertEqual(a["gen_ai.provider.name"], "openai")
        self.assertEqual(a["gen_ai.request.model"], e["model"])
        self.assertEqual(a["gen_ai.usage.input_tokens"], e["input_tokens"])
        self.assertEqual(a["gen_ai.usage.output_tokens"], e["output_tokens"])
        if e["cached_tokens"] is not None:
            self.assertEqual(a["gen_ai.usage.cache_read.input_tokens"], e["cached_tokens"])
        else:
            self.assertNotIn("gen_ai.usage.cache_read.input_tokens", a)
        self.assertEqual(a["server.address"], "127.0.0.1")
        self.assertEqual(a["server.port"], self.up.port)
        self.assertEqual(a["http.response.status_code"], e["status"])
        self.assertEqual(a["http.request.method"], "POST")
        self.assertEqual(a["url.path"], e["path"])
        self.assertEqual(a["tokentap.upstream"], e["upstream"])
        self.assertEqual(a["tokentap.stream"], e["stream"])
        self.assertNotIn("error.type", a)
        self.assertEqual(s["status"]["code"], 0)
        # every derived metric the log has, the same (the log rounds to the microsecond)
        for k, v in e.items():
            if k.endswith("_ms") and k != "itl_ms" and k != "timeline_ms" and v is not None:
                self.assertAlmostEqual(a["tokentap." + k], v, delta=0.0006, msg=k)
        if stream:
            self.assertAlmostEqual(a["gen_ai.response.time_to_first_chunk"], e["ttft_ms"] / 1e3, delta=1e-6)
        else:
            self.assertNotIn("gen_ai.response.time_to_first_chunk", a)
        # the timeline: one event per point the log has, at the same offset from arrival
        tl = {k: v for k, v in e["timeline_ms"].items() if v is not None}
        evs = {ev["name"]: ev["time"] for ev in s["events"]}
        self.assertEqual(set(evs), set(tl))
        self.assertEqual(evs["arrive"], s["start"])
        for k, v in tl.items():
            self.assertAlmostEqual((evs[k] - s["start"]) / 1e6, v, delta=0.0006, msg=k)
        self.assertGreaterEqual(s["end"], evs["resp_end"])
        self.assertAlmostEqual((s["end"] - s["start"]) / 1e6, e["timeline_ms"]["client_done"], delta=0.0006)
        # the span is now: its start within the test's run
        self.assertLess(abs(s["start"] / 1e9 - time.time()), 60)
        return s

    def test_streamed(self):
        s = self.check("ot-stream", True)
        self.assertIn("first_token", {ev["name"] for ev in s["events"]})

    def test_not_streamed(self):
        self.check("ot-plain", False)

    def test_unsampled_not_exported(self):
        trace, parent = "5" * 32, "6" * 16
        resp = rh.send(self.tt.port, rh.chat(), [("x-request-id", "ot-unsampled"),
                                                 ("traceparent", "00-%s-%s-00" % (trace, parent))])
        self.assertEqual(resp.status, 200)
        resp = rh.send(self.tt.port, rh.chat(), [("x-request-id", "ot-untraced")])
        self.assertEqual(resp.status, 200)
        self.check("ot-after", False)  # a later span came: the two before it would have too
        ids = {x[0]["attributes"].get("tokentap.request_id") for x in self.coll.spans()}
        self.assertNotIn("ot-unsampled", ids)
        self.assertNotIn("ot-untraced", ids)

    def test_counters(self):
        self.check("ot-count", False)
        # the collector holds the span before it answers, and the exporter
        # counts it exported only once the answer is read: wait for that
        harness.wait_until(lambda: metric(self.admin, "tokentap_otlp_spans_exported_total")[""] >= 1, 5.0, 0.05)
        exported = metric(self.admin, "tokentap_otlp_spans_exported_total")
        self.assertGreaterEqual(exported[""], 1)
        dropped = metric(self.admin, "tokentap_otlp_spans_dropped_total")
        self.assertEqual(dropped['{reason="queue_full"}'], 0)
        self.assertEqual(dropped['{reason="export_failed"}'], 0)
        self.assertEqual(metric(self.admin, "tokentap_otlp_export_failures_total")[""], 0)


class TestSpansJson(TestSpans):
    """The same, exported as OTLP/JSON (tracing.otlp.protocol: http/json):
    the JSON reader, proven on the official exporter's, reads the same span,
    the access log's attributes and timings; tokentap's 64-bit integers are
    decimal strings and its enums integers (the reader is strict on its
    output)."""

    PROTOCOL = "http/json"
    CONTENT_TYPE = "application/json"

    def test_raw_encoding(self):
        self.check("ot-json-raw", True)
        with self.coll.lock:
            bodies = [b for p, h, b in self.coll.posts if b"ot-json-raw" in b]
        [doc] = [json.loads(b) for b in bodies]
        [rs] = doc["resourceSpans"]
        self.assertEqual(rs["scopeSpans"][0]["scope"]["name"], "tokentap")
        [sp] = [sp for ss in rs["scopeSpans"] for sp in ss["spans"]
                if {"key": "tokentap.request_id", "value": {"stringValue": "ot-json-raw"}} in sp["attributes"]]
        self.assertRegex(sp["traceId"], r"^[0-9a-f]{32}$")
        self.assertRegex(sp["spanId"], r"^[0-9a-f]{16}$")
        self.assertRegex(sp["parentSpanId"], r"^[0-9a-f]{16}$")
        self.assertRegex(sp["startTimeUnixNano"], r"^[0-9]{19}$")
        self.assertEqual(sp["kind"], 2)
        self.assertEqual(sp["flags"], 0x301)
        self.assertNotIn("status", {k for k, v in sp.items() if v})  # UNSET, no message: {}
        ints = [a["value"]["intValue"] for a in sp["attributes"] if "intValue" in a["value"]]
        self.assertTrue(ints and all(isinstance(v, str) for v in ints), ints)


class TestNewRoot(harness.TestCase):
    """A trace tokentap starts: a root span; and the environment's endpoint
    applies when the file names none."""

    @classmethod
    def setUpClass(cls):
        cls.coll = start_collector(cls)
        cls.up = harness.start_fake_upstream(cls, answer)
        old = dict(os.environ)
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = cls.coll.url + "/custom/path"
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "100"
        os.environ["OTEL_SERVICE_NAME"] = "from-env"
        try:
            cls.tt = rh.start_conf(cls, "tracing: {new_traces: true}\n" + rh.upstreams_yaml({"up": cls.up.url}),
                                   *rh.ONE_WORKER)
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_root_span(self):
        resp = rh.send(self.tt.port, rh.chat(), [("x-request-id", "ot-root")])
        self.assertEqual(resp.status, 200)
        e = self.log_entry(self.tt.log_path, "ot-root")
        [(s, rs, headers, path)] = self.coll.span_of("ot-root")
        self.assertEqual(path, "/custom/path")
        self.assertEqual(rs["resource"]["service.name"], "from-env")
        self.assertEqual((s["trace_id"], s["span_id"]), (e["trace_id"], e["span_id"]))
        self.assertEqual(s["parent_span_id"], "")
        self.assertEqual(s["flags"], 0x101)


class TestHttps(harness.TestCase):
    """An https collector: verified with tracing.otlp.certificate; without
    it (the system's store does not know the test CA) nothing is sent, the
    requests still answered and the failures counted."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-otlp-tls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")

    def start(self, extra):
        coll = start_collector(self, "ok", 0.0, (self.cert, self.key))
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, otlp_yaml(coll.url, extra) + rh.upstreams_yaml({"up": up.url}), "--admin",
                           "127.0.0.1:0", *rh.ONE_WORKER)
        return coll, tt, harness.admin_port(tt)

    def test_verified_with_the_certificate(self):
        coll, tt, admin = self.start("    certificate: %s\n" % self.ca)
        for i in range(3):
            resp = rh.send(tt.port, rh.chat(), [("x-request-id", "tls-%d" % i),
                                                ("traceparent", "00-%032x-%s-01" % (i + 9, "8" * 16))])
            self.assertEqual(resp.status, 200)
        for i in range(3):
            [(s, rs, headers, path)] = coll.span_of("tls-%d" % i)
            self.assertEqual(s["trace_id"], "%032x" % (i + 9))
        self.assertEqual(metric(admin, "tokentap_otlp_export_failures_total")[""], 0)

    def test_unknown_ca_refused(self):
        coll, tt, admin = self.start("")
        resp = rh.send(tt.port, rh.chat(), [("x-request-id", "tls-x"), ("traceparent", "00-%032x-%s-01" % (5, "8" * 16))])
        self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(
            lambda: metric(admin, "tokentap_otlp_export_failures_total")[""] >= 1, 5.0, 0.05))
        self.assertEqual(coll.posts, [])
        self.assertEqual(metric(admin, "tokentap_otlp_spans_exported_total")[""], 0)


def stream_times(port, n, prefix):
    """n streamed requests one after another: (statuses, e2e seconds each)."""
    ka = rh.KeepAlive(port)
    statuses, times = [], []
    try:
        for i in range(n):
            t0 = time.monotonic()
            resp = ka.request("POST", rh.CHAT, rh.chat(stream=True),
                              [("x-request-id", "%s-%d" % (prefix, i)),
                               ("traceparent", "00-%032x-%s-01" % (i + 1, "7" * 16))])
            times.append(time.monotonic() - t0)
            statuses.append(resp.status if resp else None)
    finally:
        ka.close()
    return statuses, times


class TestCollectorFaults(harness.TestCase):
    """A collector that is down, refuses, or stalls: every request answered,
    as fast as with a healthy one; the spans are dropped and counted."""
    N = 25

    def run_against(self, mode, delay=0.0, extra=""):
        if mode == "down":
            url = "http://127.0.0.1:%d" % harness.free_port()
            coll = None
        else:
            coll = start_collector(self, mode, delay)
            url = coll.url
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, otlp_yaml(url, extra) + rh.upstreams_yaml({"up": up.url}), "--admin",
                           "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        statuses, times = stream_times(tt.port, self.N, "f-" + str(mode))
        self.assertEqual(statuses, [200] * self.N)
        return coll, admin, statuses, times

    def dropped(self, admin):
        return metric(admin, "tokentap_otlp_spans_dropped_total")

    def test_faults_cost_nothing(self):
        _, admin, _, base = self.run_against("ok")
        harness.wait_until(lambda: metric(admin, "tokentap_otlp_spans_exported_total")[""] == self.N, 5.0, 0.05)
        self.assertEqual(metric(admin, "tokentap_otlp_spans_exported_total")[""], self.N)
        base_med = statistics.median(base)
        for mode in ("down", "500", "503"):
            with self.subTest(mode):
                coll, admin, _, times = self.run_against(mode)
                # the retries (503, down) take ~7.5 s: what matters is that the requests did not wait
                self.assertLess(statistics.median(times), base_med + 0.02, (mode, base_med, times))
                self.assertLess(max(times), base_med + 0.25, (mode, base_med, times))

                def failed():
                    return metric(admin, "tokentap_otlp_export_failures_total")[""] >= 1

                self.assertTrue(harness.wait_until(failed, 5.0, 0.05))
                self.assertEqual(metric(admin, "tokentap_otlp_spans_exported_total")[""], 0)
                if mode == "500":  # not retried: the batch is dropped at once
                    self.assertTrue(harness.wait_until(
                        lambda: self.dropped(admin)['{reason="export_failed"}'] == self.N, 5.0, 0.05),
                        self.dropped(admin))
                if coll is not None and mode == "503":  # retried, with a backoff
                    self.assertTrue(harness.wait_until(lambda: len(coll.posts) >= 2, 5.0, 0.05))

    def test_collector_closing_idle_connections(self):
        """The connection kept from the last export is gone: made again,
        no failure counted, nothing lost."""
        coll = start_collector(self, "close")
        up = harness.start_fake_upstream(self, answer)
        tt = rh.start_conf(self, otlp_yaml(coll.url) + rh.upstreams_yaml({"up": up.url}), "--admin",
                           "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        for i in range(3):
            resp = rh.send(tt.port, rh.chat(), [("x-request-id", "cl-%d" % i),
                                                ("traceparent", "00-%032x-%s-01" % (i + 1, "9" * 16))])
            self.assertEqual(resp.status, 200)
            coll.span_of("cl-%d" % i)  # each its own batch, on the connection the one before left
        self.assertEqual(metric(admin, "tokentap_otlp_export_failures_total")[""], 0)
        self.assertEqual(metric(admin, "tokentap_otlp_spans_exported_total")[""], 3)

    def test_slow_collector_fills_the_queue(self):
        coll, admin, _, times = self.run_against(
            "slow", 2.0, "    max_queue_size: 4\n    max_export_batch_size: 2\n")
        d = self.dropped(admin)
        self.assertGreater(d['{reason="queue_full"}'], 0, d)
        self.assertLess(statistics.median(times), 0.5, times)
        # no POST may take longer than the timeout: each ended by tokentap at 500 ms
        self.assertTrue(harness.wait_until(
            lambda: metric(admin, "tokentap_otlp_export_failures_total")[""] >= 1, 5.0, 0.05))


if __name__ == "__main__":
    unittest.main()
