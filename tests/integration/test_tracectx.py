"""test_tracectx.py — W3C trace context through tokentap (docs/observability.md):
a client's valid traceparent continued, with tokentap's span as the parent
the upstream sees and the sampled flag kept, its tracestate forwarded when
valid and within bounds; broken, repeated or missing ones replaced by a new
trace (tracing.new_traces) or removed; new roots sampled at
tracing.sample_ratio; the same traceparent on a failover; trace_id and
span_id in the access log and /requests/recent.

The upstreams are fake ones that record every head they receive. A real
OpenTelemetry client (the official @opentelemetry/core W3C propagator,
installed with npm into tests/artifacts like test_responses.py's SDK)
injects the parent and extracts what the upstream got."""

import json
import re
import unittest

import harness
import routing_helpers as rh

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
GOOD = "00-%s-%s-01" % (TRACE, PARENT)
TP_RE = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

INVALID = {
    "short": "00-%s-%s-0" % (TRACE, PARENT),
    "long_v00": GOOD + "0",
    "upper_trace": "00-%s-%s-01" % (TRACE.upper(), PARENT),
    "upper_parent": "00-%s-%s-01" % (TRACE, PARENT.upper()),
    "non_hex": "00-%s-%s-01" % (TRACE[:-1] + "g", PARENT),
    "zero_trace": "00-%s-%s-01" % ("0" * 32, PARENT),
    "zero_parent": "00-%s-%s-01" % (TRACE, "0" * 16),
    "version_ff": "ff-%s-%s-01" % (TRACE, PARENT),
    "separator": "00_%s-%s-01" % (TRACE, PARENT),
    "empty": "",
}


OTEL = harness.NodeScript("npm-otel", ("@opentelemetry/core@2.2.0", "@opentelemetry/api@1.9.0"),
                          "otel_propagate.cjs", install_timeout=90, run_timeout=30)
npm_install_otel = OTEL.install
otel = OTEL


def answer(sock, req, ctx):
    """A chat answer; with "stream": true, one token as SSE."""
    if harness.wants_stream(req):
        harness.send_sse_head(sock)
        harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"hi"},'
                                 b'"finish_reason":null}]}\n\n')
        harness.send_chunk(sock, b"data: [DONE]\n\n")
        sock.sendall(b"0\r\n\r\n")
        return True
    harness.send_json(sock, {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    return True


def stall(sock, req, ctx):
    """A streaming head and no token: the route's ttft_deadline gives up on
    it. Waits (bounded) for tokentap to close the connection."""
    harness.send_sse_head(sock)
    ctx.stop_event.wait(3.0)
    return False


def headers_of(up, rid):
    """Every (name, value) the upstream received with request `rid`."""
    got = []

    def find():
        got[:] = [r.headers for r in list(up.requests) if r.header("x-request-id") == rid]
        return bool(got)

    assert harness.wait_until(find, 5.0, 0.02), "the upstream got no request %s" % rid
    return got


def all_of(headers, name):
    return [v for k, v in headers if k == name]


class TraceBase(harness.TestCase):
    TRACING = ""

    @classmethod
    def setUpClass(cls):
        cls.up = harness.start_fake_upstream(cls, answer)
        cls.tt = rh.start_conf(cls, cls.TRACING + rh.upstreams_yaml({"up": cls.up.url}), "--admin", "127.0.0.1:0",
                               *rh.ONE_WORKER)
        cls.admin = harness.admin_port(cls.tt)

    def send(self, rid, extra=(), stream=False):
        resp = rh.send(self.tt.port, rh.chat(stream=stream), [("x-request-id", rid)] + list(extra))
        self.assertIsNotNone(resp)
        self.assertEqual(resp.status, 200, resp.body[:300])
        heads = headers_of(self.up, rid)
        self.assertEqual(len(heads), 1)
        return heads[0], self.log_entry(self.tt.log_path, rid)

    def assert_child(self, head, entry, trace, flags):
        """The upstream got one traceparent of `trace` whose parent is
        tokentap's span, the one the access log names."""
        tps = all_of(head, "traceparent")
        self.assertEqual(len(tps), 1, head)
        m = TP_RE.match(tps[0])
        self.assertIsNotNone(m, "not a version 00 traceparent: %r" % tps[0])
        if trace is not None:
            self.assertEqual(m.group(1), trace)
        self.assertEqual(m.group(3), flags)
        self.assertEqual(entry["trace_id"], m.group(1))
        self.assertEqual(entry["span_id"], m.group(2))
        self.assertNotEqual(m.group(2), PARENT)
        self.assertNotEqual(m.group(1), "0" * 32)
        self.assertNotEqual(m.group(2), "0" * 16)
        return m.group(1), m.group(2)

    def assert_untraced(self, head, entry):
        self.assertEqual(all_of(head, "traceparent"), [], head)
        self.assertEqual(all_of(head, "tracestate"), [], head)
        self.assertIsNone(entry["trace_id"])
        self.assertIsNone(entry["span_id"])


class TestContinue(TraceBase):
    """The default: incoming traces continued, none started."""

    def test_valid_continued_with_tokentap_as_parent(self):
        head, e = self.send("tc-valid", [("traceparent", GOOD), ("tracestate", "rojo=00f067aa0ba902b7,congo=t61")])
        _, span = self.assert_child(head, e, TRACE, "01")
        self.assertEqual(all_of(head, "tracestate"), ["rojo=00f067aa0ba902b7,congo=t61"])
        # /requests/recent names the same trace and span
        r, _ = harness.exchange(self.admin, "GET", "/requests/recent?n=50")
        self.assertEqual(r.status, 200)
        mine = [x for x in r.json()["requests"] if x["id"] == "tc-valid"]
        self.assertEqual(len(mine), 1)
        self.assertEqual((mine[0]["trace_id"], mine[0]["span_id"]), (TRACE, span))

    def test_each_request_its_own_span(self):
        spans = set()
        for i in range(5):
            head, e = self.send("tc-span-%d" % i, [("traceparent", GOOD)])
            spans.add(self.assert_child(head, e, TRACE, "01")[1])
        self.assertEqual(len(spans), 5)

    def test_unsampled_kept(self):
        head, e = self.send("tc-unsampled", [("traceparent", "00-%s-%s-00" % (TRACE, PARENT))])
        self.assert_child(head, e, TRACE, "00")

    def test_unknown_flags_not_passed_on(self):
        head, e = self.send("tc-flags", [("traceparent", "00-%s-%s-ff" % (TRACE, PARENT))])
        self.assert_child(head, e, TRACE, "01")

    def test_future_version_read_by_its_first_fields(self):
        head, e = self.send("tc-future", [("traceparent", "cc-%s-%s-01-more" % (TRACE, PARENT))])
        self.assert_child(head, e, TRACE, "01")

    def test_streamed(self):
        head, e = self.send("tc-stream", [("traceparent", GOOD)], stream=True)
        self.assert_child(head, e, TRACE, "01")

    def test_invalid_removed(self):
        for name, tp in INVALID.items():
            with self.subTest(name):
                head, e = self.send("tc-bad-" + name, [("traceparent", tp), ("tracestate", "rojo=1")])
                self.assert_untraced(head, e)

    def test_two_traceparents_invalid(self):
        other = "00-%s-%s-01" % ("a" * 32, "b" * 16)
        head, e = self.send("tc-two", [("traceparent", GOOD), ("traceparent", other)])
        self.assert_untraced(head, e)

    def test_none_sent_none_started(self):
        head, e = self.send("tc-none", [("tracestate", "rojo=1")])
        self.assert_untraced(head, e)

    def test_tracestate_bounds(self):
        many = ",".join("k%d=v" % i for i in range(33))
        big = "k=" + "v" * 250 + "," + "j=" + "v" * 250 + ",h=" + "v" * 10  # 517 bytes
        dup = "rojo=1,rojo=2"
        for name, ts in (("many", many), ("big", big), ("dup", dup), ("bad_key", "Rojo=1")):
            with self.subTest(name):
                head, e = self.send("tc-ts-" + name, [("traceparent", GOOD), ("tracestate", ts)])
                self.assert_child(head, e, TRACE, "01")
                self.assertEqual(all_of(head, "tracestate"), [])
        ok32 = ",".join("k%d=v" % i for i in range(32))
        head, e = self.send("tc-ts-32", [("traceparent", GOOD), ("tracestate", ok32)])
        self.assertEqual(all_of(head, "tracestate"), [ok32])
        # two headers: one list, each passed on as it came
        head, e = self.send("tc-ts-2h", [("traceparent", GOOD), ("tracestate", "a=1"), ("tracestate", "b=2")])
        self.assertEqual(all_of(head, "tracestate"), ["a=1", "b=2"])


class TestOpenTelemetryClient(TraceBase):
    """The official propagator injects a client span's context; what the
    upstream receives extracts, with the same propagator, to a remote span
    context of the same trace whose span is tokentap's (the access log's),
    sampled, with the client's tracestate."""

    @classmethod
    def setUpClass(cls):
        npm_install_otel()
        super().setUpClass()

    def test_parent_relationship(self):
        rid = "to-otel"
        sent = otel("send", self.tt.port, rid)
        self.assertEqual(sent["status"], 200)
        self.assertIn("traceparent", sent["carrier"])
        head = headers_of(self.up, rid)[0]
        e = self.log_entry(self.tt.log_path, rid)
        got = otel("extract", json.dumps({k: v for k, v in head if k in ("traceparent", "tracestate")}))
        self.assertIsNotNone(got, "the propagator found no span context in %r" % head)
        self.assertEqual(got["traceId"], sent["traceId"])
        self.assertEqual(got["traceId"], e["trace_id"])
        self.assertEqual(got["spanId"], e["span_id"])
        self.assertNotEqual(got["spanId"], sent["spanId"])
        self.assertEqual(got["traceFlags"], 1)
        self.assertTrue(got["isRemote"])
        self.assertEqual(got["traceState"], sent["carrier"]["tracestate"])


class TestNewTraces(TraceBase):
    TRACING = "tracing: {new_traces: true, sample_ratio: 1}\n"

    def test_none_starts_a_sampled_trace(self):
        head, e = self.send("tn-none")
        trace, _ = self.assert_child(head, e, None, "01")
        head2, e2 = self.send("tn-none-2")
        self.assertNotEqual(self.assert_child(head2, e2, None, "01")[0], trace)

    def test_invalid_replaced(self):
        for name, tp in INVALID.items():
            with self.subTest(name):
                head, e = self.send("tn-bad-" + name, [("traceparent", tp), ("tracestate", "rojo=1")])
                trace, _ = self.assert_child(head, e, None, "01")
                self.assertNotEqual(trace, TRACE)
                self.assertEqual(all_of(head, "tracestate"), [])

    def test_valid_still_continued(self):
        head, e = self.send("tn-valid", [("traceparent", "00-%s-%s-00" % (TRACE, PARENT))])
        self.assert_child(head, e, TRACE, "00")


class TestSampleRatio(TraceBase):
    TRACING = "tracing: {new_traces: true, sample_ratio: 0.5}\n"
    N = 400

    def test_new_roots_by_ratio_parents_by_flag(self):
        ka = rh.KeepAlive(self.tt.port)
        self.addCleanup(ka.close)
        for i in range(self.N):
            resp = ka.request("POST", rh.CHAT, rh.chat(), [("x-request-id", "tr-%d" % i)])
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200)
        sampled, traces = 0, set()
        for i in range(self.N):
            head = headers_of(self.up, "tr-%d" % i)[0]
            m = TP_RE.match(all_of(head, "traceparent")[0])
            sampled += m.group(3) == "01"
            traces.add(m.group(1))
        # binomial(400, 0.5): sd 10; 5 sd either side fails once in ~1.7e6 runs
        self.assertGreaterEqual(sampled, 150, sampled)
        self.assertLessEqual(sampled, 250, sampled)
        self.assertEqual(len(traces), self.N)
        # a parent's decision is kept, whatever the ratio
        for flags in ("00", "01"):
            for i in range(20):
                rid = "tr-p%s-%d" % (flags, i)
                resp = ka.request("POST", rh.CHAT, rh.chat(),
                                  [("x-request-id", rid), ("traceparent", "00-%s-%s-%s" % (TRACE, PARENT, flags))])
                self.assertEqual(resp.status, 200)
                m = TP_RE.match(all_of(headers_of(self.up, rid)[0], "traceparent")[0])
                self.assertEqual((m.group(1), m.group(3)), (TRACE, flags))


class TestFailover(harness.TestCase):
    """A request sent again to another upstream (ttft_deadline) carries the
    same traceparent: tokentap has one span per request."""

    @classmethod
    def setUpClass(cls):
        cls.stall = harness.start_fake_upstream(cls, stall)
        cls.live = harness.start_fake_upstream(cls, answer)
        cls.tt = rh.start_conf(cls, rh.upstreams_yaml({"stall": cls.stall.url, "live": cls.live.url}) + """routes:
  - name: fo
    ttft_deadline: 300ms
    split:
      - {upstream: stall, weight: 1000}
      - {upstream: live, weight: 1}
""", *rh.ONE_WORKER)

    def test_same_span_on_every_attempt(self):
        rid = "tf-deadline"
        resp = rh.send(self.tt.port, rh.chat(stream=True), [("x-request-id", rid), ("traceparent", GOOD)])
        self.assertEqual(resp.status, 200, resp.body[:300])
        first = all_of(headers_of(self.stall, rid)[0], "traceparent")
        second = all_of(headers_of(self.live, rid)[0], "traceparent")
        e = self.log_entry(self.tt.log_path, rid)
        self.assertEqual(e["deadline_failovers"], 1, e)
        self.assertEqual(first, second)
        self.assertEqual(first, ["00-%s-%s-01" % (TRACE, e["span_id"])])


class TestMirror(harness.TestCase):
    """A shadow copy is sent the primary's traceparent, and its log line
    names the same trace and span."""

    @classmethod
    def setUpClass(cls):
        cls.primary = harness.start_fake_upstream(cls, answer)
        cls.shadow = harness.start_fake_upstream(cls, answer)
        cls.tt = rh.start_conf(cls, rh.upstreams_yaml({"primary": cls.primary.url, "shadow": cls.shadow.url})
                               + "routes:\n  - name: chat\n    upstream: primary\n"
                               "    mirror: {upstream: shadow, percent: 100}\n", *rh.ONE_WORKER)

    def test_shadow_same_traceparent(self):
        rid = "tm-mirror"
        resp = rh.send(self.tt.port, rh.chat(), [("x-request-id", rid), ("traceparent", GOOD),
                                                 ("tracestate", "rojo=1")])
        self.assertEqual(resp.status, 200)
        p = headers_of(self.primary, rid)[0]
        s = headers_of(self.shadow, rid)[0]
        self.assertEqual(all_of(s, "traceparent"), all_of(p, "traceparent"))
        self.assertEqual(all_of(s, "tracestate"), ["rojo=1"])
        lines = []

        def both():  # the primary's line and the shadow's
            lines[:] = [e for e in self.tt.access_log() if e.get("id") == rid]
            return len(lines) == 2

        self.assertTrue(harness.wait_until(both, 5.0, 0.02), lines)
        self.assertEqual({(e["trace_id"], e["span_id"]) for e in lines},
                         {(TRACE, TP_RE.match(all_of(p, "traceparent")[0]).group(2))})


class TestConfig(unittest.TestCase):
    def test_ratio_out_of_range(self):
        for bad in ("2", "-0.1", "half", "nan"):
            with self.subTest(bad):
                res, name = rh.check_config("upstreams: [{name: a, url: 'http://127.0.0.1:9'}]\n"
                                            "tracing: {sample_ratio: %s}\n" % bad)
                self.assertNotEqual(res.returncode, 0)
                self.assertIn("sample_ratio: expected a number from 0 to 1", res.stderr)
        res, _ = rh.check_config("upstreams: [{name: a, url: 'http://127.0.0.1:9'}]\n"
                                 "tracing: {new_traces: true, sample_ratio: 0.25}\n")
        self.assertEqual(res.returncode, 0, res.stderr)


if __name__ == "__main__":
    unittest.main()
