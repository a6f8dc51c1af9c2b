"""test_tokens_per_event.py — tokens per token event, where the server counts
its output on every chunk (vLLM's stream_options.continuous_usage_stats),
through tokentap to the simulator over real sockets (docs/metrics.md,
"Tokens per event").

- Chat and completions streams from `x-sim-spec-tokens` (each event carries
  1 to N tokens, as a speculative-decoding server's do) with continuous
  usage: the client reads the events it was sent and takes, for each token
  event, the rise of usage.completion_tokens since the last one; the access
  log's tokens_per_event is their mean, /stats' tokens_per_event
  histogram has their count, mean and nearest-rank p50 and p90 and one
  stream in request_tokens_per_event, /metrics' tokentap_tokens_per_event
  buckets, sum and count are theirs and the streams counter is 1.
- A stream with continuous usage and one token per event: mean 1.
- Streams without continuous usage (include_usage only, and no usage at
  all), with the same grouped events: null in the log, nothing in /stats
  or /metrics (not 1)."""

import json
import math
import os
import subprocess

import harness
from test_tenants import assert_proto_is_text

PROMPT = "Count the tokens each event carries."


def body(path, model, stream_options):
    b = {"model": model, "stream": True, "max_tokens": 200}
    if path == "/v1/chat/completions":
        b["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        b["prompt"] = PROMPT
    if stream_options is not None:
        b["stream_options"] = stream_options
    return b


def token_text(path, obj):
    choices = obj.get("choices") or []
    if not choices:
        return ""
    if path == "/v1/chat/completions":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def per_event_tokens(path, resp):
    """What the client was sent: for each event with text, the rise of
    completion_tokens since the last such event; and the usage count."""
    out, last, final = [], 0, None
    for ev in harness.sse_events(resp):
        if ev.data == "[DONE]":
            continue
        obj = json.loads(ev.data)
        usage = obj.get("usage")
        if usage:
            final = usage["completion_tokens"]
        if token_text(path, obj):
            assert usage, "a token event without usage: %r" % ev.data
            out.append(usage["completion_tokens"] - last)
            last = usage["completion_tokens"]
    return out, final


def nearest_rank(values, q):
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s))) - 1]


class TokensPerEventTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "11")
        cls.start_logged(cls.sim.url, "tokentap-tpe-", admin=True)

    def send(self, path, model, rid, stream_options, spec, tokens=60):
        extra = [("x-sim-spec-tokens", str(spec))] if spec else []
        resp, _ = harness.exchange(self.tt.port, "POST", path, body(path, model, stream_options),
                                   harness.sim_headers(ttft=5, itl=1, tokens=tokens, request_id=rid, extra=extra))
        self.assertEqual(resp.status, 200, resp.body[:300])
        return resp, self.log_entry(self.log, rid)

    def metrics_lines(self, model):
        r, _ = harness.exchange(self.admin, "GET", "/metrics")
        self.assertEqual(r.status, 200)
        return [ln for ln in r.body.decode().splitlines()
                if ln.startswith("tokentap_tokens_per_event") and 'model="%s"' % model in ln]

    def check_reported(self, path, model, spec):
        resp, e = self.send(path, model, "it-tpe-" + model, {"include_usage": True, "continuous_usage_stats": True},
                            spec)
        counts, final = per_event_tokens(path, resp)
        self.assertEqual(final, 60)
        self.assertEqual(sum(counts), 60, counts)
        if spec > 1:
            self.assertGreater(max(counts), 1, "the simulator grouped no tokens: %r" % counts)
            self.assertLessEqual(max(counts), spec)
        else:
            self.assertEqual(set(counts), {1})
        mean = sum(counts) / len(counts)

        # the access log
        self.assertEqual(e["token_events"], len(counts))
        self.assertEqual(e["output_tokens"], 60)
        self.assertAlmostEqual(e["tokens_per_event"], mean, delta=0.0005)

        # /stats: the per-event histogram and the one stream
        s = harness.model_series(self.admin, model)
        self.assertIsNotNone(s, "no /stats series for %s" % model)
        h = s["metrics"]["tokens_per_event"]
        self.assertEqual(h["count"], len(counts), h)
        self.assertAlmostEqual(h["mean"], mean, delta=1e-9)
        self.assertEqual(h["p50"], nearest_rank(counts, 0.5), (h, counts))
        self.assertEqual(h["p90"], nearest_rank(counts, 0.9), (h, counts))
        self.assertEqual(h["max"], max(counts))
        r = s["metrics"]["request_tokens_per_event"]
        self.assertEqual(r["count"], 1, r)
        self.assertAlmostEqual(r["mean"], mean, delta=max(mean / 100, 0.002))

        # /metrics: the buckets are exact for small counts
        lines = self.metrics_lines(model)
        for le in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64):
            want = sum(1 for c in counts if c <= le)
            got = [ln for ln in lines if ln.startswith("tokentap_tokens_per_event_bucket") and
                   'le="%d"' % le in ln]
            self.assertEqual(len(got), 1, lines)
            self.assertEqual(float(got[0].split()[-1]), want, got[0])
        by_name = {ln.split("{")[0]: float(ln.split()[-1]) for ln in lines if "_bucket" not in ln}
        self.assertEqual(by_name["tokentap_tokens_per_event_sum"], 60)
        self.assertEqual(by_name["tokentap_tokens_per_event_count"], len(counts))
        self.assertEqual(by_name["tokentap_tokens_per_event_streams_total"], 1)
        # the protobuf exposition (a Prometheus with native histograms asks for it) says the same
        assert_proto_is_text(self, self.admin, "tokentap_tokens_per_event", 18)

    def test_chat_speculative(self):
        self.check_reported("/v1/chat/completions", "tpe-chat-spec", 4)

    def test_completions_speculative(self):
        self.check_reported("/v1/completions", "tpe-compl-spec", 3)

    def test_one_token_per_event(self):
        self.check_reported("/v1/chat/completions", "tpe-chat-one", 0)

    def check_unreported(self, model, stream_options):
        resp, e = self.send("/v1/chat/completions", model, "it-tpe-" + model, stream_options, 4)
        self.assertGreater(e["token_events"], 0)
        self.assertIsNone(e["tokens_per_event"], "no per-chunk usage, yet a figure")
        s = harness.model_series(self.admin, model)
        self.assertIsNotNone(s)
        self.assertEqual(s["metrics"]["tokens_per_event"]["count"], 0)
        self.assertIsNone(s["metrics"]["tokens_per_event"]["mean"])
        self.assertEqual(s["metrics"]["request_tokens_per_event"]["count"], 0)
        lines = self.metrics_lines(model)
        by_name = {ln.split("{")[0]: float(ln.split()[-1]) for ln in lines if "_bucket" not in ln}
        self.assertEqual(by_name["tokentap_tokens_per_event_count"], 0)
        self.assertEqual(by_name["tokentap_tokens_per_event_streams_total"], 0)

    def series_with(self, admin, model, requests):
        """The model's /stats series once it has counted `requests`."""
        got = []

        def ready():
            s = harness.model_series(admin, model)
            got[:] = [s]
            return s is not None and s["requests"] >= requests

        self.assertTrue(harness.wait_until(ready, 8.0, 0.05), got)
        self.assertEqual(got[0]["requests"], requests)
        return got[0]

    def bench(self, model, *extra):
        js = os.path.join(self.dir, model + ".json")
        p = subprocess.run([harness.bench_bin(), "--url", "http://127.0.0.1:%d" % self.tt.port, "--api", "openai-chat",
                            "--model", model, "--concurrency", "2", "--requests", "6", "--output-len", "40",
                            "--input-len", "20", "--seed", "5", "--sim-headers", "-H", "x-sim-spec-tokens: 4",
                            "--json", js, "--no-progress"] + list(extra), capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(js) as f:
            return json.load(f)

    def test_bench_asks_for_continuous_usage(self):
        # tokentap-bench --continuous-usage: the server counts every chunk,
        # so tokentap has tokens per event; without it, none
        d = self.bench("tpe-bench-cont", "--continuous-usage")
        self.assertIs(d["config"]["continuous_usage"], True)
        self.assertEqual(d["result"]["requests"]["ok"], 6, d["result"])
        self.assertEqual(d["result"]["output_tokens"], 240)
        s = self.series_with(self.admin, "tpe-bench-cont", 6)
        h = s["metrics"]["tokens_per_event"]
        self.assertEqual(s["metrics"]["request_tokens_per_event"]["count"], 6)
        self.assertGreater(h["mean"], 1.0, h)
        self.assertLessEqual(h["max"], 4, h)
        self.assertAlmostEqual(h["mean"] * h["count"], 240, delta=1e-6)
        d = self.bench("tpe-bench-plain")
        self.assertIs(d["config"]["continuous_usage"], False)
        s = self.series_with(self.admin, "tpe-bench-plain", 6)
        self.assertEqual(s["metrics"]["request_tokens_per_event"]["count"], 0)

    def test_usage_at_the_end_only(self):
        self.check_unreported("tpe-final-usage", {"include_usage": True})

    def test_no_usage(self):
        self.check_unreported("tpe-no-usage", None)


if __name__ == "__main__":
    harness.unittest.main()
