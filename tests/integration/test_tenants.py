"""test_tenants.py — a request's tenant (`tenant:`, docs/config.md "Tenants")
over real sockets: from a header, a top-level JSON field or the API key; on
the access log, /requests/recent, the workload capture and the span; the
per-tenant view /stats?by=tenant and the opt-in /metrics families; forged,
oversized and binary values refused as `invalid`; the cap under a flood of
distinct tenants; the key in clear in no output; per-tenant TTFT percentiles
equal to the access log's; and `-t` refusing bad settings."""

import glob
import hashlib
import hmac
import json
import os
import random
import re
import shutil
import signal
import struct
import tempfile
import threading
import time
import unittest

import harness
import routing_helpers as rh
from test_admin import parse_exposition, rank_quantile
from test_otlp import fields, otlp_yaml, start_collector

TOKEN = "tenant-test-token"
SALT = "0123456789abcdef-salt"


def answer(sock, req, ctx):
    """200 for every request, except a user or tenant starting with "bad":
    500. Streamed: a first token after the delay the `delay_ms` field asks
    (0 when absent), then two more, and usage with cached tokens."""
    body = json.loads(req.body or b"{}")
    who = (req.header("x-tenant-id") or "") + str(body.get("user", ""))
    if "slow" in who:
        time.sleep(0.5)
    if "bad" in who:
        sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        return True
    if body.get("stream"):
        harness.send_sse_head(sock)
        time.sleep(body.get("delay_ms", 0) / 1000.0)
        harness.send_chat_stream(sock)
        return True
    out = json.dumps({"model": "m", "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                "prompt_tokens_details": {"cached_tokens": 3}}}).encode()
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(out), out))
    return True


def get(port, path):
    r, _ = harness.exchange(port, "GET", path, None, [], timeout=5)
    return r


PROTO_ACCEPT = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"


def proto_samples(body, prefix):
    """{(sample, ((label, value), ...)): value} of the delimited MetricFamily
    stream's families named `prefix`..., in the text format's sample names:
    a counter's value; a histogram's classic buckets (`_bucket`, le as a
    float), `_sum` and `_count`."""
    def msg(buf):
        return {f: v for f, _, v in fields(buf)}

    def double(v):
        return struct.unpack("<d", struct.pack("<Q", v))[0]

    out, i = {}, 0
    while i < len(body):
        n, shift = 0, 0
        while True:
            b = body[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        fam = fields(body[i:i + n])
        i += n
        name = next(v for f, _, v in fam if f == 1).decode()
        if not name.startswith(prefix):
            continue
        for metric in (fields(v) for f, _, v in fam if f == 4):
            labels = tuple(sorted((msg(v)[1].decode(), msg(v)[2].decode()) for f, _, v in metric if f == 1))
            for f, _, v in metric:
                if f == 3:  # Counter: value (double, field 1)
                    out[(name, labels)] = double(msg(v).get(1, 0))
                elif f == 7:  # Histogram: sample_count 1, sample_sum 2, bucket 3 (cumulative 1, upper bound 2)
                    h = fields(v)
                    out[(name + "_count", labels)] = float(next((x for g, _, x in h if g == 1), 0))
                    out[(name + "_sum", labels)] = double(next((x for g, _, x in h if g == 2), 0))
                    for bk in (msg(x) for g, _, x in h if g == 3):
                        le = tuple(sorted(labels + (("le", double(bk.get(2, 0))),)))
                        out[(name + "_bucket", le)] = float(bk.get(1, 0))
    return out


def assert_proto_is_text(test, admin, prefix, min_samples):
    """/metrics in protobuf has the families `prefix`... of the text
    exposition, sample for sample (le compared as numbers; sums within
    the text format's six decimals)."""
    text = get(admin, "/metrics").body.decode()
    r, _ = harness.exchange(admin, "GET", "/metrics", None, [("Accept", PROTO_ACCEPT)], timeout=5)
    test.assertTrue(r.header("content-type").startswith("application/vnd.google.protobuf"))
    got = proto_samples(r.body, prefix)
    want = {}
    for n, lab, v in parse_exposition(test, text)[1]:
        if n.startswith(prefix):
            lab = dict(lab, **({"le": float(lab["le"])} if "le" in lab else {}))
            want[(n, tuple(sorted(lab.items())))] = v
    test.assertGreaterEqual(len(want), min_samples)
    test.assertEqual(sorted(got), sorted(want))
    for k, v in want.items():
        test.assertAlmostEqual(got[k], v, delta=1e-6 if k[0].endswith("_sum") else 0, msg=k)


def chat(**extra):
    b = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    b.update(extra)
    return b


class TenantCase(harness.TestCase):
    def start(self, body, *args, workers=1, store=True, up_extra=()):
        self.datadir = tempfile.mkdtemp(prefix="tokentap-tenant-")
        self.addCleanup(shutil.rmtree, self.datadir, True)
        self.up = harness.start_fake_upstream(self, answer)
        text = rh.upstreams_yaml({"up": self.up.url}, {"up": list(up_extra)}) + body
        if store:
            text = "store: {dir: \"%s\", flush_interval: 100ms}\n" % self.datadir + text
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            tt = rh.start_conf(self, text, "--workers", str(workers), "--admin", "127.0.0.1:0", *args)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        self.tt, self.admin, self.text = tt, harness.admin_port(tt), text
        return tt

    def send(self, body=None, headers=(), path=rh.CHAT):
        r = rh.send(self.tt.port, body if body is not None else chat(), list(headers), path=path)
        self.assertIsNotNone(r)
        return r

    def log(self, n):
        lines = self.tt.wait_log_count(n)
        self.assertEqual(len(lines), n, lines)
        return lines

    def by_tenant(self, total, query=""):
        """{tenant: series} of /stats?by=tenant once it has counted `total`."""
        got = {}

        def ready():
            r = get(self.admin, "/stats?window=5m&by=tenant" + query)
            if r is None or r.status != 200:
                return False
            doc = json.loads(r.body)
            got.clear()
            got.update({s["tenant"]: s for s in doc["series"]})
            return sum(s["requests"] for s in doc["series"]) >= total

        self.assertTrue(harness.wait_until(ready, 8.0, 0.1), got)
        self.assertEqual(sum(s["requests"] for s in got.values()), total, got)
        return got


class TestHeader(TenantCase):
    def test_header_values_forged_oversized_binary(self):
        self.start("tenant:\n  header: X-Tenant-Id\n  metrics_label: true\n"
                   "routes:\n  - name: main\n    upstream: up\n")
        sent = [
            ([("X-Tenant-Id", "acme")], "acme"),
            ([("x-tenant-id", "  acme\t")], "acme"),  # spaces around: dropped
            ([("X-TENANT-ID", "beta.co/team-1")], "beta.co/team-1"),
            ([], None),
            ([("X-Tenant-Id", "")], None),
            ([("X-Tenant-Id", "has space")], "invalid"),
            ([("X-Tenant-Id", 'quo"te\\')], "invalid"),
            ([("X-Tenant-Id", "x" * 65)], "invalid"),  # over 64 bytes
            ([("X-Tenant-Id", "x" * 64)], "x" * 64),
            ([("X-Tenant-Id", "caf\xe9\x80\xff")], "invalid"),  # bytes that are no name (latin-1 on the wire)
            ([("X-Tenant-Id", "acme"), ("X-Tenant-Id", "beta")], "invalid"),  # two: which is the client's choice
            ([("X-Tenant-Id", "{\"a\":1}")], "invalid"),
        ]
        for headers, _ in sent:
            self.assertEqual(self.send(headers=headers).status, 200, headers)
        lines = self.log(len(sent))
        self.assertEqual([e["tenant"] for e in lines], [want for _, want in sent])
        for e in lines:
            self.assertIn("tenant", e)  # on every line, null when none
        raw = open(self.tt.log_path, "rb").read()
        self.assertNotIn(b"has space", raw)
        self.assertNotIn(b"\xc3\xa9\xc2\x80", raw)
        got = self.by_tenant(len(sent))
        self.assertEqual({k: v["requests"] for k, v in got.items()},
                         {"acme": 2, "beta.co/team-1": 1, "none": 2, "invalid": 6, "x" * 64: 1})
        a = got["acme"]
        self.assertEqual(a["route"], "main")
        self.assertEqual((a["input_tokens"], a["output_tokens"], a["cached_tokens"]), (10, 4, 6))
        self.assertIn("goodput", a)
        self.assertIn("p50_ms", a["metrics"]["ttft"])
        # busiest first
        self.assertEqual(list(got)[0], "invalid")
        r = get(self.admin, "/stats?window=5m&by=tenant&tenant=acme")
        self.assertEqual([s["tenant"] for s in json.loads(r.body)["series"]], ["acme"])
        self.assertEqual(get(self.admin, "/stats?by=nope").status, 400)
        # the model series are whole: the tenant series do not add to them
        s = json.loads(get(self.admin, "/stats?window=5m").body)
        self.assertEqual(sum(x["requests"] for x in s["series"]), len(sent))
        m = get(self.admin, "/metrics").body.decode()
        for want in ('tokentap_tenant_requests_total{route="main",tenant="acme",status_class="2xx"} 2',
                     'tokentap_tenant_e2e_seconds_count{route="main",tenant="acme"} 2',
                     'tokentap_tenant_input_tokens_total{route="main",tenant="acme"} 10',
                     'tokentap_tenant_cached_tokens_total{route="main",tenant="acme"} 6'):
            self.assertTrue(want in m, want)
        self.assertFalse("has space" in m)
        # the same tenant families, of the same values, in the protobuf exposition
        assert_proto_is_text(self, self.admin, "tokentap_tenant_", 20)
        self.assertTrue(re.search(r'tokentap_requests_total\{route="main",upstream="up",model="m",status_class="2xx"\} %d'
                         % len(sent), m))
        rec = json.loads(get(self.admin, "/requests/recent?n=%d" % len(sent)).body)
        entries = rec["requests"] if isinstance(rec, dict) else rec
        self.assertEqual(sorted(str(e["tenant"]) for e in entries), sorted(str(w) for _, w in sent))

    def test_metrics_label_is_opt_in(self):
        self.start("tenant: {header: x-tenant-id}\nroutes:\n  - name: main\n    upstream: up\n")
        self.assertEqual(self.send(headers=[("x-tenant-id", "acme")]).status, 200)
        self.by_tenant(1)
        self.assertNotIn("tokentap_tenant_", get(self.admin, "/metrics").body.decode())


class TestRefused(TenantCase):
    def test_a_request_refused_at_admission_has_its_tenant(self):
        """Routed at its head (nothing routes on the body), refused 503 by a
        full upstream before its body was read for anything: still the
        header's tenant, on the log line and in the stats."""
        self.start("tenant: {header: x-tenant-id}\nroutes:\n  - name: main\n    upstream: up\n",
                   up_extra=["max_concurrency: 1"])
        self.assertEqual(self.send(headers=[("x-tenant-id", "b")]).status, 200)  # b admitted
        slow = threading.Thread(target=lambda: self.send(headers=[("x-tenant-id", "slow-a")]))
        slow.start()
        self.assertTrue(harness.wait_until(lambda: len(self.up.requests) >= 2, 5.0, 0.01))
        r = self.send(headers=[("x-tenant-id", "b")])
        slow.join()
        self.assertEqual(r.status, 503)
        lines = self.log(3)
        refused = [e for e in lines if e["status"] == 503]
        self.assertEqual([e["tenant"] for e in refused], ["b"], lines)
        got = self.by_tenant(3)
        # a tenant's failure stays under it once admitted
        self.assertEqual((got["b"]["requests"], got["b"]["status"]["2xx"], got["b"]["status"]["5xx"]), (2, 1, 1))
        self.assertEqual(got["slow-a"]["requests"], 1)


class TestJsonFieldAndRoutes(TenantCase):
    def test_route_json_field_over_top_level_header(self):
        self.start("tenant: {header: x-tenant-id}\n"
                   "routes:\n"
                   "  - name: emb\n    match: {path_prefix: /v1/embeddings}\n    upstream: up\n"
                   "  - name: main\n    upstream: up\n    tenant: {json_field: user}\n")
        self.assertEqual(self.send(chat(user="u-1"), [("x-tenant-id", "hdr")]).status, 200)
        self.assertEqual(self.send(chat(user="u-1", stream=True)).status, 200)
        self.assertEqual(self.send(chat(user=12)).status, 200)  # not a string: none
        self.assertEqual(self.send(chat(user="a b")).status, 200)  # not a name: invalid
        self.assertEqual(self.send(chat(meta={"user": "nested"})).status, 200)  # top-level only
        self.assertEqual(self.send({"model": "m", "input": "x"}, [("x-tenant-id", "hdr")],
                                   path="/v1/embeddings").status, 200)
        lines = self.log(6)
        self.assertEqual([e["tenant"] for e in lines], ["u-1", "u-1", None, "invalid", None, "hdr"])
        got = self.by_tenant(6)
        self.assertEqual({(v["route"], k): v["requests"] for k, v in got.items()},
                         {("main", "u-1"): 2, ("main", "none"): 2, ("main", "invalid"): 1, ("emb", "hdr"): 1})
        self.assertEqual(len(self.by_tenant(1, "&route=emb")), 1)


class TestApiKey(TenantCase):
    K1 = "sk-live-FIRSTKEY-aaaaaaaaaaaaaaaaaaaaaaaa"
    K2 = "sk-live-SECONDKEY-bbbbbbbbbbbbbbbbbbbbbbb"

    def label(self, key, salt=SALT):
        return "key-" + hmac.new(salt.encode(), key.encode(), hashlib.sha256).hexdigest()[:16]

    def test_key_hashed_mapped_and_never_in_clear(self):
        coll = start_collector(self)
        wl = os.path.join(tempfile.mkdtemp(prefix="tokentap-wl-"), "trace.jsonl")
        self.addCleanup(shutil.rmtree, os.path.dirname(wl), True)
        sha1 = hashlib.sha256(self.K1.encode()).hexdigest()
        self.start(otlp_yaml(coll.url) + "workload: {path: \"%s\"}\n" % wl +
                   "tenant:\n  api_key: true\n  salt: %s\n  metrics_label: true\n  keys:\n    %s: acme\n" %
                   (SALT, sha1.upper()) + "routes:\n  - name: main\n    upstream: up\n")
        sent = [
            ([("Authorization", "Bearer " + self.K1)], "acme"),
            ([("Authorization", "bearer  " + self.K2)], self.label(self.K2)),
            ([("x-api-key", self.K2)], self.label(self.K2)),
            ([("Authorization", "Bearer " + self.K2), ("x-api-key", self.K2)], self.label(self.K2)),
            ([("Authorization", "Bearer " + self.K1), ("x-api-key", self.K2)], "invalid"),  # two keys
            ([("Authorization", "Basic " + self.K2)], None),  # not a bearer
            ([], None),
        ]
        for i, (headers, _) in enumerate(sent):
            tp = ("traceparent", "00-%032x-%016x-01" % (i + 1, i + 1))  # sampled: a span each
            self.assertEqual(self.send(chat(stream=True), list(headers) + [tp]).status, 200, headers)
        # the upstream still gets the credential: tokentap only reads it
        self.assertEqual(self.up.requests[0].header("authorization"), "Bearer " + self.K1)
        lines = self.log(len(sent))
        self.assertEqual([e["tenant"] for e in lines], [w for _, w in sent])
        got = self.by_tenant(len(sent))
        self.assertEqual(got["acme"]["requests"], 1)
        self.assertEqual(got[self.label(self.K2)]["requests"], 3)
        rid = lines[1]["id"]
        [(span, _, _, _)] = coll.span_of(rid)
        self.assertEqual(span["attributes"]["tokentap.tenant"], self.label(self.K2))
        self.assertTrue(harness.wait_until(lambda: os.path.exists(wl) and len(open(wl).readlines()) >= len(sent),
                                           8.0, 0.1))
        wl_recs = [json.loads(x) for x in open(wl)]
        self.assertEqual(sorted(str(r.get("tenant")) for r in wl_recs), sorted(str(w) for _, w in sent))
        # every output, the key and its plain SHA-256 in none of them
        outputs = {
            "access log": open(self.tt.log_path, "rb").read(),
            "/requests/recent": get(self.admin, "/requests/recent?n=50").body,
            "/stats": get(self.admin, "/stats?window=5m").body + get(self.admin, "/stats?window=5m&by=tenant").body,
            "/metrics": get(self.admin, "/metrics").body,
            "workload": b"".join(open(p, "rb").read() for p in glob.glob(wl + "*")),
            "spans": b"".join(body for _, _, body in coll.posts),
            "stderr": "\n".join(self.tt.lines).encode(),
        }
        for where, data in outputs.items():
            self.assertTrue(data, where)
            for secret in (self.K1, self.K2, "FIRSTKEY", "SECONDKEY", sha1, hashlib.sha256(self.K2.encode()).hexdigest()):
                self.assertNotIn(secret.encode(), data, "%s holds %s" % (where, secret[:12]))
        self.assertIn(self.label(self.K2).encode(), outputs["/metrics"])

    def test_generated_salt_is_kept_across_restarts(self):
        self.start("tenant: {api_key: true}\nroutes:\n  - name: main\n    upstream: up\n")
        path = os.path.join(self.datadir, "tenant-salt")
        self.assertTrue(os.path.exists(path))
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        salt = open(path).read().strip()
        self.assertRegex(salt, r"^[0-9a-f]{32}$")
        self.assertEqual(self.send(headers=[("x-api-key", self.K1)]).status, 200)
        first = self.log(1)[0]["tenant"]
        self.assertEqual(first, self.label(self.K1, salt))
        datadir = self.datadir
        harness._stop_and_check(self.tt)
        tt2 = rh.start_conf(self, rh.upstreams_yaml({"up": self.up.url}) +
                            "store: {dir: \"%s\"}\ntenant: {api_key: true}\nroutes:\n  - name: main\n"
                            "    upstream: up\n" % datadir, "--workers", "1")
        self.assertEqual(rh.send(tt2.port, chat(), [("x-api-key", self.K1)]).status, 200)
        self.assertEqual(tt2.wait_log_count(1)[0]["tenant"], first)
        self.assertEqual(open(path).read().strip(), salt)


class TestReload(TenantCase):
    def test_reload_changes_the_source_and_salt(self):
        self.start("tenant: {header: x-tenant-id}\nroutes:\n  - name: main\n    upstream: up\n")
        self.assertEqual(self.send(chat(user="u"), [("x-tenant-id", "h"), ("x-api-key", "k-1")]).status, 200)
        for src, salt in (("{json_field: user}", ""), ("{api_key: true}", "salt: 0123456789abcdef\n"),
                          ("{api_key: true}", "salt: fedcba9876543210\n")):
            text = self.text.replace("tenant: {header: x-tenant-id}\n", "tenant:\n  %s\n" % src[1:-1] +
                                     ("  " + salt if salt else ""))
            self.assertTrue(self.reload(text), src)
            self.assertEqual(self.send(chat(user="u"), [("x-tenant-id", "h"), ("x-api-key", "k-1")]).status, 200)
        lines = self.log(4)
        want = ["h", "u", TestApiKey.label(None, "k-1", "0123456789abcdef"),
                TestApiKey.label(None, "k-1", "fedcba9876543210")]
        self.assertEqual([e["tenant"] for e in lines], want)

    def reload(self, text):
        n = self.tt.count_lines(rh.RELOAD_RE)
        rh.write_file(self.tt.path, self.tt._text(text))
        self.tt.signal(signal.SIGHUP)
        return harness.wait_until(lambda: self.tt.count_lines(rh.RELOAD_RE) > n, 5.0, 0.02)


class TestCap(TenantCase):
    def test_flood_of_distinct_tenants(self):
        self.start("tenant:\n  header: x-tenant-id\n  max_per_route: 4\n  metrics_label: true\n"
                   "routes:\n  - name: main\n    upstream: up\n", workers=2)
        conn = rh.KeepAlive(self.tt.port)
        # refused answers first: they take no slot
        for i in range(20):
            self.assertEqual(conn.request("POST", rh.CHAT, chat(), [("x-tenant-id", "bad-%d" % i)]).status, 500)
        for t in ("t-a", "t-b", "t-c", "t-d"):
            self.assertEqual(conn.request("POST", rh.CHAT, chat(), [("x-tenant-id", t)]).status, 200)
        for i in range(300):
            self.assertEqual(conn.request("POST", rh.CHAT, chat(), [("x-tenant-id", "flood-%d" % i)]).status, 200)
        self.assertEqual(conn.request("POST", rh.CHAT, chat(), [("x-tenant-id", "t-a")]).status, 200)
        total = 20 + 4 + 300 + 1
        got = self.by_tenant(total)
        self.assertEqual({k: v["requests"] for k, v in got.items()},
                         {"other": 320, "t-a": 2, "t-b": 1, "t-c": 1, "t-d": 1})
        # the access log keeps each request's own tenant
        lines = self.log(total)
        self.assertEqual(len({e["tenant"] for e in lines}), 20 + 4 + 300)
        m = get(self.admin, "/metrics").body.decode()
        self.assertEqual(len({l.split("tenant=")[1].split(",")[0] for l in m.splitlines()
                              if l.startswith("tokentap_tenant_requests_total{")}), 5)

    def test_idle_tenant_gives_its_slot(self):
        self.start("tenant:\n  header: x-tenant-id\n  max_per_route: 1\n  idle: 1s\n"
                   "routes:\n  - name: main\n    upstream: up\n")
        self.assertEqual(self.send(headers=[("x-tenant-id", "old")]).status, 200)
        self.assertEqual(self.send(headers=[("x-tenant-id", "new")]).status, 200)  # full: other
        time.sleep(1.5)
        self.assertEqual(self.send(headers=[("x-tenant-id", "new")]).status, 200)  # takes old's slot
        self.assertEqual(self.send(headers=[("x-tenant-id", "old")]).status, 200)  # lost it: other
        got = self.by_tenant(4)
        self.assertEqual({k: v["requests"] for k, v in got.items()}, {"old": 1, "new": 1, "other": 2})


class TestPercentiles(TenantCase):
    def test_per_tenant_ttft_equals_access_log(self):
        self.start("tenant: {json_field: user}\nroutes:\n  - name: main\n    upstream: up\n")
        rnd = random.Random(29)
        conn = rh.KeepAlive(self.tt.port)
        n = 0
        for t, base in (("fast", 2), ("slow", 30)):
            for _ in range(40):
                body = chat(user=t, stream=True, delay_ms=base + rnd.random() * base)
                self.assertEqual(conn.request("POST", rh.CHAT, body).status, 200)
                n += 1
        lines = self.log(n)
        got = self.by_tenant(n)
        for t in ("fast", "slow"):
            vals = [e["ttft_ms"] for e in lines if e["tenant"] == t]
            self.assertEqual(len(vals), 40)
            m = got[t]["metrics"]["ttft"]
            self.assertEqual(m["count"], 40)
            self.assertAlmostEqual(m["max_ms"], max(vals), delta=0.001 + 1e-9 * max(vals))
            for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                want = rank_quantile(vals, q)
                self.assertLessEqual(abs(m[key + "_ms"] - want), 0.01 * want + 0.001, (t, key, m, want))
            self.assertEqual(got[t]["output_tokens"], 3 * 40)
            self.assertEqual(got[t]["cached_tokens"], 4 * 40)
        self.assertGreater(got["slow"]["metrics"]["ttft"]["p50_ms"], got["fast"]["metrics"]["ttft"]["p90_ms"])


class TestDashboard(TenantCase):
    def test_tenants_table(self):
        import test_dashboard as td
        self.start("tenant: {header: x-tenant-id}\nroutes:\n  - name: main\n    upstream: up\n")
        for t, n in (("acme", 5), ("beta", 3), ("gamma", 1)):
            for _ in range(n):
                self.assertEqual(self.send(chat(stream=True), [("x-tenant-id", t)]).status, 200)
        self.assertEqual(self.send(chat(stream=True), [("x-tenant-id", "a b")]).status, 200)
        got = self.by_tenant(10)
        out, err = td.run_chromium(self, "http://127.0.0.1:%d/" % self.admin, "--dump-dom")
        dom = td.Dom(out)
        td.check_no_page_errors(self, dom, err)
        self.assertEqual(dom.by_id("tenants")["attrs"].get("data-tenants"), "4")
        rows = [e for e in dom.inside("tenants", "tr") if "data-tenant" in e["attrs"]]
        self.assertEqual([r["attrs"]["data-tenant"] for r in rows], ["acme", "beta", "gamma", "invalid"])
        cells = {(r["attrs"]["data-tenant"], c["attrs"]["data-key"]): c["attrs"]["data-value"]
                 for r in rows for c in dom.inside(r, "td")}
        self.assertEqual(cells[("acme", "requests")], "5")
        self.assertEqual(cells[("acme", "output_tokens")], "15")
        self.assertEqual(cells[("acme", "cached_tokens")], "20")
        self.assertAlmostEqual(float(cells[("acme", "ttft_p50_ms")]), got["acme"]["metrics"]["ttft"]["p50_ms"],
                               delta=1e-6)


UP = "upstreams:\n  - {name: up, url: \"http://127.0.0.1:9\"}\nroutes:\n  - name: main\n    upstream: up\n"


class TestCheck(unittest.TestCase):
    def problems(self, text):
        res, fname = rh.check_config(text)
        self.assertNotEqual(res.returncode, 0, res.stdout + res.stderr)
        return res.stdout + res.stderr

    def test_bad_settings(self):
        cases = [
            ("tenant: {header: x-t, json_field: user}\n", "not two"),
            ("tenant: {header: Authorization}\n", "carries a credential"),
            ("tenant: {header: x-api-key}\n", "carries a credential"),
            ("tenant: {header: \"a b\"}\n", "is not a header name"),
            ("tenant: {api_key: false}\n", "only true"),
            ("tenant: {api_key: maybe}\n", "expected true or false"),
            ("tenant: {bogus: 1}\n", "unknown key 'tenant.bogus'"),
            ("tenant: {max_per_route: 0}\n", "tenant.max_per_route"),
            ("tenant: {api_key: true, salt: short}\n", "at least 16 bytes"),
            ("tenant:\n  api_key: true\n  salt: 0123456789abcdefg\n  keys: {abc: acme}\n", "is not a SHA-256"),
            ("tenant:\n  api_key: true\n  salt: 0123456789abcdefg\n  keys: {%s: \"a b\"}\n" % ("a" * 64),
             "is not a tenant name"),
            ("tenant:\n  header: x-t\n  keys: {%s: acme}\n" % ("a" * 64), "only with tenant.api_key"),
            ("store: {dir: \"off\"}\ntenant: {api_key: true}\n", "needs tenant.salt"),
        ]
        for text, want in cases:
            out = self.problems(text + UP)
            self.assertIn(want, out, text)
        out = self.problems(UP.replace("upstream: up\n", "upstream: up\n    tenant: {}\n"))
        self.assertIn("give one of header, json_field or api_key", out)
        out = self.problems(UP.replace("upstream: up\n", "upstream: up\n    tenant: {max_per_route: 3}\n"))
        self.assertIn("unknown key 'routes[0].tenant.max_per_route'", out)

    def test_good_settings_and_no_salt_file_made_by_check(self):
        d = tempfile.mkdtemp(prefix="tokentap-cfg-")
        self.addCleanup(shutil.rmtree, d, True)
        text = ("store: {dir: \"%s\"}\ntenant:\n  api_key: true\n  keys: {%s: acme}\n" % (d, "A" * 64) + UP +
                "  - name: two\n    match: {path_prefix: /x}\n    upstream: up\n    tenant: {header: X-Team}\n")
        res, _ = rh.check_config(text)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "tenant-salt")))


if __name__ == "__main__":
    unittest.main()
