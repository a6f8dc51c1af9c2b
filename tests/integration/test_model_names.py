"""test_model_names.py — what a client writes as a model name and how it
spells the body's keys cannot break an output or hide from tokentap.

Names that are not text: a model name that is not UTF-8 or holds control
characters (bytes FF FE, a raw 01, an escaped ESC, an overlong C0 AF, a
surrogate ED A0 80, a sequence cut off by the closing quote), answered 2xx,
is recorded as text with U+FFFD in place of each bad byte and each control
character (docs/security.md): the access log line, the workload trace line,
/stats and /requests/recent all have it as their `model`; /metrics stays
valid UTF-8, promtool accepts it, and two real Prometheus processes (one
asking for the protobuf exposition, one for the text) keep the instance up
and store the series under that name.

Keys that hide: the upstream (here Python's json, as vLLM's server uses)
decodes escapes in keys and keeps the last of a duplicate, so
{"model":"junk-N","mod\\u0065l":"real"} is served as `real`; tokentap must
record and admit it as `real` (the model cap is not filled by junk names),
route it by `match.model: real`, read the stream flag and the
sticky.json_field the same way, and record "re\\u0061l" as `real`; the
stream flag of a refused request is read the same way too.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness
import routing_helpers as rh
from test_prometheus import prom_query, prom_result, start_prometheus

FFFD = "\ufffd"

# (raw bytes of the JSON string's text, the name tokentap must record)
NAMES = [
    (b"bad\xff\xfemodel", "bad" + FFFD * 2 + "model"),
    (b"ctl\x01model", "ctl" + FFFD + "model"),
    (b"esc\\u001b[2Jmodel", "esc" + FFFD + "[2Jmodel"),
    (b"over\xc0\xafmodel", "over" + FFFD * 2 + "model"),
    (b"sur\xed\xa0\x80model", "sur" + FFFD * 3 + "model"),
    (b"trunc\xe2\x82", "trunc" + FFFD * 2),
    (b"caf\xc3\xa9-ok", "caf\u00e9-ok"),  # text, kept as it is
]


def answer_json(sock, status, obj):
    body = json.dumps(obj).encode()
    reason = b"OK" if status == 200 else b"Not Found"
    sock.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (status, reason, len(body), body))


def ok_upstream(test, tag="up"):
    """A fake upstream answering 200 to any body, JSON or not."""

    def handler(sock, req, ctx):
        answer_json(sock, 200, {"served_by": tag, "choices": [{"message": {"content": "ok"}}],
                                "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        return True

    return harness.start_fake_upstream(test, handler)


def model_upstream(test, known, tag="up"):
    """A fake upstream that reads the body as vLLM's server does (Python's
    json: escapes decoded, the last duplicate wins) and answers 200 for the
    models in `known`, else 404."""

    def handler(sock, req, ctx):
        model = json.loads(req.body or b"{}").get("model")
        if model in known:
            answer_json(sock, 200, {"model": model, "served_by": tag, "choices": [{"message": {"content": "ok"}}],
                                    "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        else:
            answer_json(sock, 404, {"error": {"message": "model not found"}})
        return True

    return harness.start_fake_upstream(test, handler)


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path, None, [], timeout=5)
    assert resp is not None and resp.status == 200, (path, resp and resp.status)
    return json.loads(resp.body)


def post_raw(port, body, rid):
    """POSTs `body` (bytes, sent as they are) to the chat path with
    x-request-id `rid`; the response."""
    return rh.send(port, body, headers=[("x-request-id", rid)])


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().split(b"\n") if line.strip()]


class NamesCase(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-names-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def start(self, body, *args):
        tt = rh.start_conf(self, body, "--workers", "2", "--admin", "127.0.0.1:0", "--data-dir",
                           os.path.join(self.dir, "data"), "--flush-interval", "100ms", *args)
        return tt, harness.admin_port(tt)

    def by_model(self, admin, total):
        """{model: requests} of /stats once the store counted `total`."""
        stats = harness.wait_until(
            lambda: (lambda s: s if sum(x["requests"] for x in s["series"]) >= total else None)(
                get_json(admin, "/stats?window=5m&cold=include")), 8.0, 0.1)
        self.assertIsNotNone(stats, "the store never counted %d requests" % total)
        out = {}
        for s in stats["series"]:
            out[s["model"]] = out.get(s["model"], 0) + s["requests"]
        return out

    def log_by_id(self, tt, ids):
        lines = harness.wait_until(
            lambda: (lambda ls: ls if set(ids) <= {e.get("id") for e in ls} else None)(tt.access_log()), 5.0, 0.05)
        self.assertTrue(lines, "the access log never held every request: %r" % tt.access_log()[-3:])
        return {e["id"]: e for e in lines if e.get("id") in ids}


class NotText(NamesCase):
    def test_names_that_are_not_text_are_recorded_as_text(self):
        up = ok_upstream(self)
        trace = os.path.join(self.dir, "trace.jsonl")
        tt, admin = self.start(rh.upstreams_yaml({"up": up.url}) + "routes:\n  - name: main\n    upstream: up\n",
                               "--workload", trace)
        ids = []
        for i, (raw, _) in enumerate(NAMES):
            rid = "names-%d" % i
            body = b'{"model":"' + raw + b'","messages":[{"role":"user","content":"hi"}]}'
            resp = post_raw(tt.port, body, rid)
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, raw)
            ids.append(rid)
        want = {rid: name for rid, (_, name) in zip(ids, NAMES)}

        # the access log: every line has its model, as text
        log = self.log_by_id(tt, ids)
        for rid, name in want.items():
            self.assertIn("model", log[rid], log[rid])
            self.assertEqual(log[rid]["model"], name, rid)
        # the workload trace: one line each, the same names
        got = harness.wait_until(lambda: (lambda ls: ls if len(ls) >= len(NAMES) else None)(read_lines(trace)), 8.0,
                                 0.1)
        self.assertTrue(got, "the trace never held %d lines: %r" % (len(NAMES), read_lines(trace)))
        self.assertEqual(sorted(r.get("model") for r in got), sorted(want.values()))
        # /requests/recent
        recent = get_json(admin, "/requests/recent")
        items = recent["requests"] if isinstance(recent, dict) else recent
        by_id = {r["id"]: r for r in items if r.get("id") in want}
        self.assertEqual({rid: r.get("model") for rid, r in by_id.items()}, want)
        # /stats
        self.assertEqual(self.by_model(admin, len(NAMES)), {name: 1 for name in want.values()})

        # /metrics: UTF-8 throughout, accepted by promtool, the names as labels
        resp, _ = harness.exchange(admin, "GET", "/metrics", timeout=10)
        self.assertEqual(resp.status, 200)
        text = resp.body.decode("utf-8")  # strict: raises on a byte that is not UTF-8
        for name in want.values():
            self.assertIn('model="%s"' % name, text)
        self.assertNotRegex(text, "[\x00-\x08\x0b-\x1f\x7f-\x9f]", "a control character in /metrics")
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool is not installed: run contrib/setup.sh (it comes with prometheus)")
        p = subprocess.run([promtool, "check", "metrics"], input=resp.body, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 0, (p.stdout + p.stderr)[-2000:])
        self.assertNotIn(b"error while linting", p.stderr + p.stdout, p.stderr[-2000:])

        # real Prometheus, both expositions: the instance stays up and the
        # series carry the names
        proms = [start_prometheus(self, self.dir, [admin], flags, interval="250ms", name=name)[1]
                 for name, flags in (("native", ["--enable-feature=native-histograms"]), ("classic", []))]
        for prom, kind in zip(proms, ("native", "classic")):
            seen = harness.wait_until(
                lambda: (lambda r: r if len(r) >= len(NAMES) else None)(
                    prom_result(prom, "sum by (model) (tokentap_requests_total)")), 20, 0.25)
            self.assertTrue(seen, "%s Prometheus: up=%r, series %r" % (
                kind, prom_query(prom, "up"), prom_result(prom, "sum by (model) (tokentap_requests_total)")))
            self.assertEqual(prom_query(prom, "up"), 1, kind)
            self.assertEqual(sorted(r["metric"]["model"] for r in seen), sorted(want.values()), kind)


class HiddenKeys(NamesCase):
    def test_escaped_duplicate_key_is_the_model_served(self):
        up = model_upstream(self, {"real"})
        tt, admin = self.start(rh.upstreams_yaml({"up": up.url}) + "routes:\n  - name: main\n    upstream: up\n")
        for i in range(40):  # more than the model cap (32): junk names would fill it
            body = '{"model":"junk-%d","mod\\u0065l":"real","messages":[{"role":"user","content":"hi"}]}' % i
            resp = post_raw(tt.port, body, "dup-%d" % i)
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.json()["model"], "real")  # what the upstream read
        resp = post_raw(tt.port, '{"model":"re\\u0061l","messages":[]}', "esc-value")
        self.assertEqual(resp.status, 200)
        # the stream flag: a refused request keeps the one it asked for
        # (an answer's own framing says otherwise)
        resp = post_raw(tt.port, '{"model":"nope","stream":false,"str\\u0065am":true,"messages":[]}', "esc-stream")
        self.assertEqual(resp.status, 404)
        self.assertEqual(self.by_model(admin, 42), {"real": 41, "other": 1})
        log = self.log_by_id(tt, ["dup-0", "dup-39", "esc-value", "esc-stream"])
        self.assertEqual({e["model"] for e in log.values()}, {"real", "nope"})
        self.assertIs(log["esc-stream"]["stream"], True)

    def test_match_model_reads_the_model_served(self):
        a, b = model_upstream(self, {"real", "junk"}, "a"), model_upstream(self, {"real", "junk"}, "b")
        tt, _ = self.start(rh.upstreams_yaml({"a": a.url, "b": b.url}) +
                           "routes:\n  - name: real\n    upstream: a\n    match: {model: real}\n"
                           "  - name: rest\n    upstream: b\n")
        cases = [('{"model":"junk","mod\\u0065l":"real"}', "a", "real"),
                 ('{"mod\\u0065l":"real","model":"junk"}', "b", "rest"),
                 ('{"model":"\\u0072eal"}', "a", "real")]
        for i, (body, served_by, route) in enumerate(cases):
            resp = post_raw(tt.port, body, "m-%d" % i)
            self.assertEqual(resp.status, 200, body)
            self.assertEqual(resp.json()["served_by"], served_by, body)
        log = self.log_by_id(tt, ["m-%d" % i for i in range(len(cases))])
        for i, (body, served_by, _) in enumerate(cases):
            self.assertEqual(log["m-%d" % i]["upstream"], served_by, body)

    def test_sticky_json_field_reads_the_field_served(self):
        a, b = ok_upstream(self, "a"), ok_upstream(self, "b")
        tt, _ = self.start(rh.upstreams_yaml({"a": a.url, "b": b.url}) +
                           "routes:\n  - name: chat\n    sticky: {json_field: user}\n    split:\n"
                           "      - {upstream: a, weight: 1}\n      - {upstream: b, weight: 1}\n")
        users = ["user-%d" % k for k in range(12)]
        plain = {}
        for u in users:
            resp = post_raw(tt.port, '{"user":"%s","messages":[]}' % u, "p-" + u)
            self.assertEqual(resp.status, 200)
            plain[u] = resp.json()["served_by"]
        # both upstreams are in use, so a decoy that decided the pick would show
        self.assertEqual(set(plain.values()), {"a", "b"}, plain)
        for u in users:
            resp = post_raw(tt.port, '{"user":"decoy","us\\u0065r":"%s","messages":[]}' % u, "e-" + u)
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.json()["served_by"], plain[u], u)


if __name__ == "__main__":
    unittest.main()
