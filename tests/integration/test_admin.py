"""test_admin.py — the admin API over real sockets.

tokentap-sim and tokentap (its own data dir, 200 ms flushes, the admin API on
an ephemeral loopback port) are started; N streamed requests with known
x-sim-ttft-ms / x-sim-itl-ms / x-sim-tokens go through the proxy, and the
answers of /stats, /stats/curve, /stats/prompt, /metrics and /requests/recent
are checked against the access log: counts equal, ttft p50 within 1 % + 1 ms
of the access log's own p50 (same rank rule, ceil(q*n)), output token totals
exact, every /metrics line valid exposition syntax with monotonic buckets
ending at the count, each recent request's timeline equal to its log line.
Then the guards: 400 naming the parameter, 405 with Allow, 403 for a foreign
Host, reset refused (403) without a token set, and with one, 401 for a
missing or wrong token (longer, or as long and one bit off) and 403 for a
cross-origin POST; a listener on 0.0.0.0 starts with a token from the
environment or a file (and is reached over 127.0.0.1 only); /metrics never
goes down across a reset; the dashboard page at / is served with a policy
that forbids anything from elsewhere. The in-flight count of queued requests
counts the queue ahead of them; goodput names its thresholds, and its itl
threshold misses a stream with one long gap whose mean gap is fine
(test_stats_accuracy compares every metric and window with the access log).
Finally a restart: kill
-9 after the data is flushed, start again on the same data dir, and the 1h
window shows the same count and p50; and kill -9 in the middle of traffic
loses at most the requests of one flush interval (plus commit slack).
"""

import math
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import unittest

import harness
import routing_helpers as rh

N = 30
PATH = "/v1/chat/completions"
admin_port = harness.admin_port  # imported from here by other suites


def admin_get(port, path, method="GET", headers=None, body=None):
    resp, _ = harness.exchange(port, method, path, body=body, headers=headers)
    return resp


def rank_quantile(values, q):
    """The sample of rank ceil(q*n) (rank >= 1), as hist_quantile ranks."""
    s = sorted(values)
    rank = max(1, math.ceil(q * len(s)))
    return s[rank - 1]


def send_requests(port, n, seed=0):
    """n streamed chat requests, one after another, with known timings.
    Returns the output token count requested per request."""
    tokens = []
    for i in range(n):
        ttft = 5 + ((i + seed) * 7) % 40  # 5..44 ms, spread
        itl = 1 + i % 3
        ntok = 3 + i % 5
        body = harness.api_body("openai-chat", stream=True, include_usage=True, model="admin-model")
        hdrs = harness.sim_headers(ttft=ttft, itl=itl, tokens=ntok, request_id="adm-%d-%d" % (seed, i))
        resp, _ = harness.exchange(port, "POST", PATH, body=body, headers=hdrs)
        if resp is None or resp.status != 200:
            raise AssertionError("proxy answered %r" % (resp and resp.status))
        tokens.append(ntok)
    return tokens


def series_of(doc, model="admin-model"):
    for s in doc["series"]:
        if s["model"] == model:
            return s
    return None


def wait_stats_count(test, port, n, window="1h", timeout=8.0):
    """Polls /stats until the series shows n requests (flushes are
    asynchronous); returns the last document."""
    last = []

    def check():
        r = admin_get(port, "/stats?window=%s" % window)
        if r is None or r.status != 200:
            return False
        doc = r.json()
        last[:] = [doc]
        s = series_of(doc)
        return s is not None and s["requests"] >= n

    harness.wait_until(check, timeout, 0.1)
    test.assertTrue(last, "no /stats answer")
    return last[0]


# --- exposition format ------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
_VALUE = r"(?:[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)|[+-]Inf|NaN)"
SAMPLE_RE = re.compile(r"^(%s)(?:\{((?:%s)(?:,(?:%s))*)?,?\})? (%s)(?: -?[0-9]+)?$" % (_NAME, _LABEL, _LABEL, _VALUE))
HELP_RE = re.compile(r"^# HELP (%s) .*$" % _NAME)
TYPE_RE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % _NAME)
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"')


def parse_exposition(test, text):
    """Checks every line; returns {family: type} and a list of samples
    (name, {label: value}, float value)."""
    types, samples = {}, []
    test.assertTrue(text.endswith("\n"), "exposition ends with a newline")
    for line in text.split("\n")[:-1]:
        if line.startswith("#"):
            m = TYPE_RE.match(line)
            if m:
                test.assertNotIn(m.group(1), types, "TYPE twice for %s" % m.group(1))
                types[m.group(1)] = m.group(2)
                continue
            test.assertRegex(line, HELP_RE, "bad comment line")
            continue
        m = SAMPLE_RE.match(line)
        test.assertIsNotNone(m, "not valid exposition syntax: %r" % line)
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        samples.append((m.group(1), labels, float(m.group(3))))
    return types, samples


class AdminStatsTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls)
        cls.start_logged(cls.sim.url, "tokentap-admin-", admin=True)
        cls.tokens = send_requests(cls.tt.port, N)

    def log_entries(self):
        found = []

        def check():
            try:
                es = [e for e in harness.read_access_log(self.log) if str(e.get("id", "")).startswith("adm-0-")]
            except ValueError:
                return False
            found[:] = es
            return len(es) >= N

        harness.wait_until(check, 5.0, 0.05)
        self.assertEqual(len(found), N, "access log lines")
        return found

    def test_stats_match_access_log(self):
        doc = wait_stats_count(self, self.admin, N)
        s = series_of(doc)
        self.assertIsNotNone(s, "series for admin-model in %r" % doc)
        self.assertEqual(s["requests"], N)
        self.assertEqual(s["status"]["2xx"], N)
        self.assertEqual(s["route"], "default")
        self.assertEqual(s["cold"], "include")
        self.assertEqual(s["context"]["cold"]["warm_requests"] + s["context"]["cold"]["cold_requests"], N)
        entries = self.log_entries()

        ttfts = [e["ttft_ms"] for e in entries]
        m = s["metrics"]["ttft"]
        self.assertEqual(m["count"], N)
        for q, key in ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")):
            want = rank_quantile(ttfts, q)
            self.assertAlmostEqual(m[key], want, delta=0.01 * want + 1.0,
                                   msg="ttft %s: stats %r, access log %r" % (key, m[key], want))
        self.assertAlmostEqual(m["max_ms"], max(ttfts), delta=0.002)
        self.assertAlmostEqual(m["mean_ms"], sum(ttfts) / N, delta=0.002)

        out_log = sum(e["output_tokens"] for e in entries)
        self.assertEqual(out_log, sum(self.tokens), "access log output tokens vs x-sim-tokens")
        self.assertEqual(s["output_tokens"], out_log)
        self.assertEqual(s["metrics"]["output_tokens"]["count"], N)
        ins = [e["input_tokens"] for e in entries if e.get("input_tokens") is not None]
        self.assertEqual(s["input_tokens"], sum(ins))

        # every metric of the X-macro list, with its unit suffix
        for name in ("ttft", "itl", "e2e", "tpot", "queue", "connect", "ttfb", "upstream_ttft"):
            for k in ("count", "mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms"):
                self.assertIn(k, s["metrics"][name], name)
        self.assertIn("p50_tokens_per_s", s["metrics"]["decode_rate"])
        tp = s["throughput"]
        self.assertGreater(tp["requests_per_s"], 0)
        self.assertAlmostEqual(tp["output_tokens_per_s"] * tp["elapsed_s"], out_log, delta=1e-6 * out_log)
        self.assertEqual(s["goodput"]["slo_met"] + s["goodput"]["slo_missed"], N)
        for k in ("start", "end", "elapsed_from"):
            self.assertRegex(doc[k], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

        # other windows and filters
        for w in ("1m", "5m", "24h", "7d", "all"):
            r = admin_get(self.admin, "/stats?window=%s&model=admin-model" % w)
            self.assertEqual(r.status, 200, w)
            sw = series_of(r.json())
            self.assertEqual(sw["requests"], N, w)
            # every window's percentiles agree with the access log's, within
            # the histogram's 1 % (plus the log's µs rounding)
            for q, key in ((0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")):
                want = rank_quantile(ttfts, q)
                self.assertAlmostEqual(sw["metrics"]["ttft"][key], want, delta=0.01 * want + 0.01,
                                       msg="window %s ttft %s" % (w, key))
        r = admin_get(self.admin, "/stats?model=no-such-model&route=&upstream=")
        self.assertEqual(r.json()["series"], [])
        r = admin_get(self.admin, "/stats?cold=exclude")
        se = series_of(r.json())
        self.assertEqual(se["cold_requests"], 0)
        self.assertEqual(se["requests"], s["context"]["cold"]["warm_requests"])

    def test_itl_samples_match_access_log_even_at_zero_gap(self):
        # itl 0: token events often arrive in one read, so many gaps are
        # 0 ns; each is still an ITL sample and must be counted.
        n = 10
        for i in range(n):
            body = harness.api_body("openai-chat", stream=True, include_usage=True, model="itl0-model")
            hdrs = harness.sim_headers(ttft=1, itl=0, tokens=10, request_id="itl0-%d" % i)
            resp, _ = harness.exchange(self.tt.port, "POST", PATH, body=body, headers=hdrs)
            self.assertEqual(resp.status, 200)
        entries = []

        def logged():
            entries[:] = [e for e in harness.read_access_log(self.log) if str(e.get("id", "")).startswith("itl0-")]
            return len(entries) == n

        self.assertTrue(harness.wait_until(logged, 5.0, 0.05))
        gaps = sum(e["itl_count"] for e in entries)
        self.assertEqual(gaps, n * 9)
        counted = []

        def flushed():
            r = admin_get(self.admin, "/stats?window=5m&model=itl0-model")
            doc = r.json()
            counted[:] = [doc["series"][0]["metrics"]["itl"]["count"] if doc["series"] else 0]
            return counted[0] >= gaps

        harness.wait_until(flushed, 5.0, 0.1)
        self.assertEqual(counted[0], gaps)

    def test_curve_and_prompt(self):
        wait_stats_count(self, self.admin, N)
        r = admin_get(self.admin, "/stats/curve?window=1h")
        self.assertEqual(r.status, 200)
        self.assertIn("application/json", r.content_type())
        s = series_of(r.json())
        self.assertIsNotNone(s)
        # one request at a time: everything at 1 in flight
        self.assertEqual(sum(b["requests"] for b in s["buckets"]), N)
        self.assertEqual(s["buckets"][0]["inflight_low"], 1)
        self.assertEqual(s["buckets"][0]["ttft"]["count"], N)
        self.assertIsNotNone(s["knee"])
        self.assertFalse(s["knee"]["saturated"])

        r = admin_get(self.admin, "/stats/prompt?window=5m")
        self.assertEqual(r.status, 200)
        s = series_of(r.json())
        # include_usage: the simulator reports prompt tokens for every request
        entries = self.log_entries()
        ins = [e["input_tokens"] for e in entries]
        self.assertTrue(all(isinstance(n, int) for n in ins), ins)
        self.assertEqual(sum(b["ttft"]["count"] for b in s["buckets"]), N)
        for b in s["buckets"]:
            self.assertGreater(b["ttft"]["count"], 0, "empty buckets are left out")
            lo, hi = b["input_tokens_low"], b["input_tokens_high"]
            inside = [n for n in ins if n >= lo and (hi is None or n <= hi)]
            self.assertEqual(len(inside), b["requests"], b)

    def test_metrics_exposition(self):
        wait_stats_count(self, self.admin, N, window="all")
        r = admin_get(self.admin, "/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.content_type().startswith("text/plain; version=0.0.4"), r.content_type())
        types, samples = parse_exposition(self, r.body.decode("utf-8"))
        self.assertEqual(types.get("tokentap_ttft_seconds"), "histogram")
        self.assertEqual(types.get("tokentap_requests_total"), "counter")
        for name, _, _ in samples:
            fam = re.sub(r"_(bucket|sum|count)$", "", name)
            self.assertTrue(name in types or fam in types, "sample %s without # TYPE" % name)

        # per histogram and label set: le ascending, counts monotonic, +Inf == _count
        hists = {}
        counts = {}
        for name, labels, value in samples:
            if name.endswith("_bucket"):
                key = (name[:-7], tuple(sorted((k, v) for k, v in labels.items() if k != "le")))
                hists.setdefault(key, []).append((labels["le"], value))
            elif name.endswith("_count") and types.get(name[:-6]) == "histogram":
                counts[(name[:-6], tuple(sorted(labels.items())))] = value
        self.assertTrue(hists)
        for key, buckets in hists.items():
            les = [float(le) for le, _ in buckets]
            self.assertEqual(les, sorted(les), key)
            self.assertEqual(buckets[-1][0], "+Inf", key)
            vals = [v for _, v in buckets]
            for a, b in zip(vals, vals[1:]):
                self.assertLessEqual(a, b, "buckets of %r not monotonic: %r" % (key, vals))
            for v in vals:
                self.assertEqual(v, int(v), "bucket counts are integers")
            self.assertEqual(vals[-1], counts[key], "+Inf == _count for %r" % (key,))
        # our series: the ttft count and the token counter
        mine = [(n, l, v) for n, l, v in samples if l.get("model") == "admin-model"]
        ttft_count = [v for n, l, v in mine if n == "tokentap_ttft_seconds_count"]
        self.assertEqual(ttft_count, [N])
        out = [v for n, l, v in mine if n == "tokentap_output_tokens_total"]
        self.assertEqual(out, [sum(self.tokens)])
        ok = [v for n, l, v in mine if n == "tokentap_requests_total" and l.get("status_class") == "2xx"]
        self.assertEqual(ok, [N])
        # vLLM's TTFT bucket edges are all present
        les = {le for le, _ in hists[[k for k in hists if k[0] == "tokentap_ttft_seconds"][0]]}
        for le in ("0.001", "0.005", "0.02", "0.04", "0.06", "0.08", "0.25", "0.75", "2.5", "7.5", "160.0", "640.0",
                   "2560.0", "0.025", "0.075", "0.15", "0.3", "0.4"):
            self.assertIn(le, les)

    def test_bad_parameters(self):
        for path, param in (("/stats?window=2h", "window"), ("/stats?cold=maybe", "cold"),
                            ("/stats?bogus=1", "bogus"), ("/stats/curve?window=forever", "window"),
                            ("/stats/prompt?colder=only", "colder"), ("/metrics?window=1h", "window"),
                            ("/stats?window=1h&window=5m", "window"), ("/requests/recent?n=0", "n"),
                            ("/requests/recent?n=abc", "n"), ("/requests/recent?n=-3", "n"),
                            ("/requests/recent?n=1025", "n"), ("/requests/recent?n=5&n=6", "n"),
                            ("/requests/recent?count=5", "count"), ("/?x=1", "x"),
                            ("/stats?window", "window"), ("/stats?window=1h&cold", "cold"),
                            ("/requests/recent?n", "n"), ("/compare?route=chat&window", "window")):
            with self.subTest(path=path):
                r = admin_get(self.admin, path)
                self.assertJsonError(r, 400)
                err = r.json()["error"]
                self.assertIn(param, err["message"])
                self.assertEqual(err.get("parameter"), param)

    def test_methods_paths_and_hosts(self):
        r = admin_get(self.admin, "/stats", method="POST", body={})
        self.assertJsonError(r, 405)
        self.assertIn("GET", r.header("allow"))
        r = admin_get(self.admin, "/reset")
        self.assertJsonError(r, 405)
        self.assertEqual(r.header("allow"), "POST")
        r = admin_get(self.admin, "/metrics", method="DELETE")
        self.assertJsonError(r, 405)
        r = admin_get(self.admin, "/no/such/thing")
        self.assertJsonError(r, 404)

        for host in ("evil.example.com", "evil.example.com:%d" % self.admin, "127.0.0.1.nip.io", "localhost.evil"):
            with self.subTest(host=host):
                r = admin_get(self.admin, "/stats", headers=[("Host", host)])
                self.assertJsonError(r, 403)
        for host in ("localhost", "localhost:%d" % self.admin, "127.0.0.1", "[::1]:%d" % self.admin):
            with self.subTest(host=host):
                r = admin_get(self.admin, "/healthz", headers=[("Host", host)])
                self.assertEqual(r.status, 200)
                self.assertEqual(r.json(), {"status": "ok"})
        r = admin_get(self.admin, "/readyz")
        self.assertEqual((r.status, r.json()), (200, {"ready": True}))
        self.assertIn("application/json", r.content_type())

    def test_requests_recent(self):
        entries = {e["id"]: e for e in self.log_entries()}
        r = admin_get(self.admin, "/requests/recent?n=1024")
        self.assertEqual(r.status, 200)
        self.assertIn("application/json", r.content_type())
        doc = r.json()
        self.assertEqual(doc["capacity"], 1024)
        self.assertEqual(doc["n"], len(doc["requests"]))
        reqs = doc["requests"]
        finished = [q["finished"] for q in reqs]
        self.assertEqual(finished, sorted(finished, reverse=True), "newest first")
        mine = [q for q in reqs if q["id"].startswith("adm-0-")]
        self.assertEqual(len(mine), N)
        # the ring and the access log describe each request identically
        for q in mine:
            e = entries[q["id"]]
            for k in ("method", "path", "api", "model", "upstream", "stream", "status", "error", "input_tokens",
                      "output_tokens", "events", "token_events", "bytes_in", "bytes_out", "queue_ms", "connect_ms",
                      "ttfb_ms", "ttft_ms", "upstream_ttft_ms", "tpot_ms", "e2e_ms", "decode_tps"):
                self.assertEqual(q[k], e[k], "%s of %s" % (k, q["id"]))
            self.assertEqual(q["timeline_ms"], e["timeline_ms"], q["id"])
            self.assertEqual(q["itl"]["count"], e["itl_count"])
            gaps = e["itl_ms"]
            self.assertAlmostEqual(q["itl"]["max_ms"], max(gaps), delta=0.0015)
            self.assertAlmostEqual(q["itl"]["mean_ms"], sum(gaps) / len(gaps), delta=0.0015)
            self.assertEqual(q["inflight"], 1, "one request at a time")
            self.assertIsInstance(q["cold"], bool)
            self.assertRegex(q["finished"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        # default and explicit n: a prefix of the same list
        d = admin_get(self.admin, "/requests/recent").json()
        self.assertEqual(len(d["requests"]), min(50, len(reqs)))
        three = admin_get(self.admin, "/requests/recent?n=3").json()["requests"]
        self.assertEqual([q["id"] for q in three], [q["id"] for q in reqs[:3]])
        r = admin_get(self.admin, "/requests/recent", method="POST", body={})
        self.assertJsonError(r, 405)

    def test_dashboard_is_served_self_contained(self):
        r = admin_get(self.admin, "/")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.content_type(), "text/html; charset=utf-8")
        csp = r.header("content-security-policy", "")
        self.assertIn("default-src 'none'", csp)
        self.assertIn("connect-src 'self'", csp)
        page = r.body.decode("utf-8")
        self.assertTrue(page.startswith("<!doctype html>"))
        for needle in ("/stats?window=1m", "/stats/curve", "/stats/prompt", "/requests/recent"):
            self.assertIn(needle, page)
        # nothing from elsewhere: no external scripts, styles, images or fonts
        self.assertNotRegex(page, r"(?i)<script[^>]+src=|<link[^>]+stylesheet|@import|url\(\s*['\"]?https?:")
        for url in re.findall(r"https?://[^\s\"'<>)]+", page):
            self.assertEqual(url, "http://www.w3.org/2000/svg", "external reference %s" % url)
        r = admin_get(self.admin, "/", method="HEAD")
        self.assertEqual(r.status, 200)
        r = admin_get(self.admin, "/", method="POST", body={})
        self.assertJsonError(r, 405)

    def test_reset_without_token_is_refused(self):
        r = admin_get(self.admin, "/reset", method="POST")
        self.assertJsonError(r, 403)
        self.assertIn("token", r.json()["error"]["message"])
        # with no token set, a guessed one gets the same 403: there is nothing to compare it with
        r = admin_get(self.admin, "/reset", method="POST", headers=[("Authorization", "Bearer guess")])
        self.assertJsonError(r, 403)
        self.assertIn("no admin token is set", r.json()["error"]["message"])
        # nothing was reset
        s = series_of(admin_get(self.admin, "/stats?window=all").json())
        self.assertIsNotNone(s)


class AdminTokenTest(harness.TestCase):
    TOKEN = "s3cret-token-for-tests-0123456789"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-admin-tok-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.token_file = os.path.join(self.dir, "token")
        with open(self.token_file, "w") as f:
            f.write(self.TOKEN + "\n")
        os.chmod(self.token_file, 0o600)

    def test_reset_needs_the_token(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--data-dir", os.path.join(self.dir, "data"),
                                    "--flush-interval", "200ms", "--admin", "127.0.0.1:0",
                                    "--admin-token-file", self.token_file)
        port = admin_port(tt)
        send_requests(tt.port, 3, seed=1)
        wait_stats_count(self, port, 3)

        r = admin_get(port, "/reset", method="POST")
        self.assertJsonError(r, 401)
        self.assertIn("Bearer", r.header("www-authenticate", ""))
        r = admin_get(port, "/reset", method="POST", headers=[("Authorization", "Bearer wrong")])
        self.assertJsonError(r, 401)
        r = admin_get(port, "/reset", method="POST", headers=[("Authorization", "Bearer " + self.TOKEN + "x")])
        self.assertJsonError(r, 401)
        # as long as the right one, differing in its last byte only
        same_len = self.TOKEN[:-1] + chr(ord(self.TOKEN[-1]) ^ 1)
        self.assertEqual(len(same_len), len(self.TOKEN))
        r = admin_get(port, "/reset", method="POST", headers=[("Authorization", "Bearer " + same_len)])
        self.assertJsonError(r, 401)
        self.assertEqual(r.json()["error"]["message"], "wrong bearer token")
        r = admin_get(port, "/reset", method="POST", headers=[("Origin", "http://evil.example")])
        self.assertJsonError(r, 403)
        self.assertEqual(series_of(admin_get(port, "/stats").json())["requests"], 3, "nothing reset yet")

        r = admin_get(port, "/reset", method="POST", headers=[("Authorization", "Bearer " + self.TOKEN)])
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json(), {"reset": True})
        self.assertIsNone(series_of(admin_get(port, "/stats").json()))
        self.assertTrue(harness.wait_until(lambda: "stats reset" in tt.stderr_text(), 2.0))
        self.assertNotIn(self.TOKEN, tt.stderr_text(), "the token never reaches the log")

    def test_metrics_never_go_down_across_a_reset(self):
        """/metrics counts since the process started: POST /reset empties
        the stats windows but no counter, bucket or _count of /metrics goes
        down, with the store on disk and with it off (the ring only)."""
        for data in (os.path.join(self.dir, "data"), "off"):
            with self.subTest(data_dir=data):
                sim = harness.start_sim(self)
                tt = harness.start_tokentap(self, sim.url, "--data-dir", data, "--flush-interval", "200ms",
                                            "--admin", "127.0.0.1:0", "--admin-token-file", self.token_file)
                port = admin_port(tt)

                def scrape(want):
                    got = []

                    def check():
                        r = admin_get(port, "/metrics")
                        _, samples = parse_exposition(self, r.body.decode("utf-8"))
                        got[:] = [{(n, tuple(sorted(l.items()))): v for n, l, v in samples}]
                        return [v for (n, l), v in got[0].items()
                                if n == "tokentap_ttft_seconds_count" and ("model", "admin-model") in l] == [want]

                    self.assertTrue(harness.wait_until(check, 5.0, 0.1), "ttft _count never reached %d" % want)
                    return got[0]

                send_requests(tt.port, 3, seed=2)
                before = scrape(3)
                r = admin_get(port, "/reset", method="POST", headers=[("Authorization", "Bearer " + self.TOKEN)])
                self.assertEqual(r.status, 200, r.body)
                self.assertIsNone(series_of(admin_get(port, "/stats?window=all").json()), "the windows are empty")
                send_requests(tt.port, 2, seed=3)
                after = scrape(5)
                cumulative = [k for k in before if re.search(r"(_bucket|_count|_sum|_total)$", k[0])]
                self.assertGreater(len(cumulative), 100)
                for k in cumulative:
                    self.assertGreaterEqual(after.get(k, -1), before[k], k)
                tt.stop()
                sim.stop()

    def test_non_loopback_needs_a_token(self):
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
                             "--admin", "0.0.0.0:0"], timeout=10)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("token", r.stderr)
        self.assertIn("0.0.0.0:0", r.stderr)

    def test_non_loopback_starts_with_a_token(self):
        """Listening on 0.0.0.0 (reached here over 127.0.0.1 only) starts
        when the token comes from the environment or from a file, and writes
        then take that token."""
        sim = harness.start_sim(self)
        for how in ("env", "file"):
            with self.subTest(token_from=how):
                args = ["--data-dir", "off", "--admin", "0.0.0.0:0"]
                if how == "file":
                    args += ["--admin-token-file", self.token_file]
                else:
                    os.environ["TOKENTAP_ADMIN_TOKEN"] = self.TOKEN
                try:
                    tt = harness.start_tokentap(self, sim.url, *args)
                finally:
                    os.environ.pop("TOKENTAP_ADMIN_TOKEN", None)
                port = admin_port(tt)
                self.assertIn("admin listening on 0.0.0.0:%d\n" % port, tt.stderr_text() + "\n")
                self.assertNotIn("writes disabled", tt.stderr_text())
                r = admin_get(port, "/healthz", headers=[("Host", "127.0.0.1:%d" % port)])
                self.assertEqual(r.status, 200, r.body)
                r = admin_get(port, "/reset", method="POST", headers=[("Host", "127.0.0.1:%d" % port)])
                self.assertJsonError(r, 401)
                r = admin_get(port, "/reset", method="POST",
                              headers=[("Host", "127.0.0.1:%d" % port), ("Authorization", "Bearer " + self.TOKEN)])
                self.assertEqual(r.status, 200, r.body)
                tt.stop()

    def test_bad_admin_address(self):
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
                             "--admin", "nonsense"], timeout=10)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("nonsense", r.stderr)

    def test_empty_token_file(self):
        empty = os.path.join(self.dir, "empty")
        open(empty, "w").close()
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
                             "--admin-token-file", empty], timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("empty", r.stderr)


class AdminGoodputTest(harness.TestCase):
    def test_goodput_names_the_thresholds_it_was_judged_against(self):
        sim = harness.start_sim(self)
        for args, want in ((("--slo-ttft", "750ms", "--slo-tpot", "40ms", "--slo-itl", "250ms"),
                            {"ttft_ms": 750, "tpot_ms": 40, "itl_ms": 250}),
                           ((), {"ttft_ms": 2000, "tpot_ms": 100, "itl_ms": None})):
            with self.subTest(args=args):
                tt = harness.start_tokentap(self, sim.url, "--data-dir", "off", "--flush-interval", "200ms",
                                            "--admin", "127.0.0.1:0", *args)
                port = admin_port(tt)
                send_requests(tt.port, 2, seed=4)
                doc = wait_stats_count(self, port, 2, window="5m")
                self.assertEqual(series_of(doc)["goodput"]["slo"], want)
                tt.stop()


def stall_handler(gaps_ms):
    """A fake upstream streaming one token event, then one per gap."""
    def handler(sock, req, fu):
        harness.send_sse_head(sock)
        for gap in [0] + list(gaps_ms):
            time.sleep(gap / 1000.0)
            harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n')
        harness.send_chunk(sock, b"data: [DONE]\n\n")
        harness.send_chunk(sock, b"")
        return True
    return handler


class InflightAtArrivalTest(harness.TestCase):
    def test_inflight_counts_the_queue_at_arrival(self):
        # One slot, four requests at once: each is routed while those before
        # it run or wait, so the load curve sees 1, 2, 3 and 4 in flight,
        # not 1 four times (what a sample taken after the queue would see).
        sim = harness.start_sim(self)
        tt = rh.start_conf(self, rh.upstreams_yaml({"u": sim.url}, {"u": ["max_concurrency: 1",
                                                                         "queue: {max: 8, timeout: 10s}"]}),
                           "--admin", "127.0.0.1:0", "--workers", "1")
        port = admin_port(tt)
        results = []

        def one(i):
            body = harness.api_body("openai-chat", stream=True, model="queue-model")
            hdrs = harness.sim_headers(ttft=150, itl=1, tokens=2, request_id="q-%d" % i)
            resp, _ = harness.exchange(tt.port, "POST", PATH, body=body, headers=hdrs)
            results.append(resp and resp.status)

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=one, args=(i,)))
            threads[-1].start()
            time.sleep(0.03)  # arrive in order, well within the first one's 150 ms
        for t in threads:
            t.join(10)
        self.assertEqual(results, [200] * 4)
        got = {}

        def recent():
            for e in admin_get(port, "/requests/recent?n=10").json()["requests"]:
                got[e["id"]] = e["inflight"]
            return len(got) >= 4

        self.assertTrue(harness.wait_until(recent, 5.0, 0.05))
        self.assertEqual(sorted(got.values()), [1, 2, 3, 4], got)


class SloItlTest(harness.TestCase):
    def goodput(self, port, model):
        found = []

        def check():
            s = series_of(admin_get(port, "/stats?window=5m").json(), model)
            found[:] = [s]
            return s is not None and s["requests"] >= 1

        self.assertTrue(harness.wait_until(check, 5.0, 0.05), "no series for %s" % model)
        return found[0]["goodput"]

    def test_one_long_gap_misses_the_itl_slo(self):
        # Ten gaps, one of 300 ms: the mean (tpot, 30 ms) is within 100 ms,
        # the longest gap is not within 200 ms. Ten even 20 ms gaps meet both.
        stall = harness.start_fake_upstream(self, stall_handler([300] + [0] * 9))
        even = harness.start_fake_upstream(self, stall_handler([20] * 10))
        common = ("--admin", "127.0.0.1:0", "--flush-interval", "100ms", "--workers", "1")
        for how in ("cli", "yaml"):
            if how == "cli":
                tt = harness.start_tokentap(self, stall.url, "--slo-itl", "200ms", "--slo-tpot", "100ms",
                                            "--data-dir", "off", *common)
            else:
                tt = rh.start_conf(self, "slo:\n  itl: 200ms\n  tpot: 100ms\n" + rh.upstreams_yaml({"u": stall.url}),
                                   *common)
            port = admin_port(tt)
            body = harness.api_body("openai-chat", stream=True, model="stall-model")
            resp, _ = harness.exchange(tt.port, "POST", PATH, body=body)
            self.assertEqual(resp.status, 200)
            g = self.goodput(port, "stall-model")
            self.assertEqual((g["slo_met"], g["slo_missed"], g["ratio"]), (0, 1, 0.0), how)
            self.assertEqual(g["slo"]["itl_ms"], 200, how)
            s = series_of(admin_get(port, "/stats?window=5m").json(), "stall-model")
            self.assertLess(s["metrics"]["tpot"]["max_ms"], 100, "the mean gap is within the tpot SLO")
            tt.stop()
        # the same thresholds, even gaps: met
        tt = harness.start_tokentap(self, even.url, "--slo-itl", "200ms", "--admin", "127.0.0.1:0",
                                    "--flush-interval", "100ms", "--data-dir", "off")
        body = harness.api_body("openai-chat", stream=True, model="even-model")
        resp, _ = harness.exchange(tt.port, "POST", PATH, body=body)
        self.assertEqual(resp.status, 200)
        g = self.goodput(admin_port(tt), "even-model")
        self.assertEqual((g["slo_met"], g["slo_missed"], g["ratio"]), (1, 0, 1.0))

    def test_bad_slo_itl(self):
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--slo-itl", "0", "--data-dir", "off"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--slo-itl", r.stderr)
        self.assertIn("positive duration", r.stderr)


class AdminRestartTest(harness.TestCase):
    def test_stats_survive_kill_9(self):
        d = tempfile.mkdtemp(prefix="tokentap-admin-restart-")
        self.addCleanup(shutil.rmtree, d, True)
        data = os.path.join(d, "data")
        sim = harness.start_sim(self)
        args = ("--data-dir", data, "--flush-interval", "200ms", "--admin", "127.0.0.1:0")
        tt = harness.start_tokentap(self, sim.url, *args)
        port = admin_port(tt)
        send_requests(tt.port, N, seed=2)
        before = series_of(wait_stats_count(self, port, N))
        self.assertEqual(before["requests"], N)

        tt.kill(signal.SIGKILL)

        tt2 = harness.start_tokentap(self, sim.url, *args)
        port2 = admin_port(tt2)
        after = series_of(admin_get(port2, "/stats?window=1h").json())
        self.assertIsNotNone(after, "series gone after the restart")
        self.assertEqual(after["requests"], N)
        self.assertEqual(after["metrics"]["ttft"]["p50_ms"], before["metrics"]["ttft"]["p50_ms"])
        self.assertEqual(after["metrics"]["ttft"]["count"], N)
        self.assertEqual(after["output_tokens"], before["output_tokens"])

    def test_kill_9_loses_at_most_one_flush_interval(self):
        # Requests go on from four clients while tokentap is killed; after
        # the restart, every request completed more than a flush interval
        # (plus slack for the commit itself) before the kill is counted,
        # and nothing is counted that was never sent.
        flush_s, slack_s = 0.2, 0.3
        d = tempfile.mkdtemp(prefix="tokentap-admin-loss-")
        self.addCleanup(shutil.rmtree, d, True)
        sim = harness.start_sim(self)
        args = ("--data-dir", os.path.join(d, "data"), "--flush-interval", "200ms", "--admin", "127.0.0.1:0")
        tt = harness.start_tokentap(self, sim.url, *args)
        lock = threading.Lock()
        sent, done = [0], []
        stop = threading.Event()

        def client(k):
            i = 0
            while not stop.is_set() and i < 2000:
                body = harness.api_body("openai-chat", stream=True, model="loss-model")
                hdrs = harness.sim_headers(ttft=2, itl=1, tokens=3, request_id="loss-%d-%d" % (k, i))
                i += 1
                with lock:
                    sent[0] += 1
                try:
                    resp, _ = harness.exchange(tt.port, "POST", PATH, body=body, headers=hdrs, timeout=2)
                except OSError:
                    return
                if resp is None or resp.status != 200:
                    return
                with lock:
                    done.append(time.monotonic())

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()

        def enough():  # more than 50 requests done a flush interval (and slack) ago
            with lock:
                return sum(1 for t in done if t < time.monotonic() - flush_s - slack_s) > 50

        self.assertTrue(harness.wait_until(enough, 15.0, 0.05), "too few requests before the kill")
        killed = time.monotonic()
        tt.kill(signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(10)
        with lock:
            safe = sum(1 for t in done if t < killed - flush_s - slack_s)
            total = sent[0]
        self.assertGreater(safe, 50, "too few requests before the kill to measure anything")

        tt2 = harness.start_tokentap(self, sim.url, *args)
        s = series_of(admin_get(admin_port(tt2), "/stats?window=all").json(), "loss-model")
        self.assertIsNotNone(s, "series gone after the restart")
        self.assertGreaterEqual(s["requests"], safe, "lost more than a flush interval (%d sent)" % total)
        self.assertLessEqual(s["requests"], total)


if __name__ == "__main__":
    unittest.main()
