"""test_routes.py — routes, splitting, sticky keys, the override header,
admission queues, failover, reload under load and drain (docs/config.md),
through tokentap started from a YAML file in front of several simulators.

Each simulator runs with its own --model name, and the requests here name no
model unless the test is about models, so the `model` of an answer tells
which simulator served it; /sim/stats request counts and the access log's
`upstream` field are checked as well where the brief asks for them.
"""

import json
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

CHAT = rh.CHAT


def fast(tokens=2):
    return harness.sim_headers(ttft=0, itl=0, tokens=tokens)


def start_sims(test, spec):
    """{name: (ttft_ms, itl_ms)} -> {name: Sim} with --model sim-NAME."""
    sims = {}
    for name, (ttft, itl) in spec.items():
        sims[name] = harness.start_sim(test, "--ttft-ms", ttft, "--itl-ms", itl, "--tokens", 4,
                                       "--model", "sim-" + name)
    return sims


def who(resp):
    m = rh.served_by(resp)
    return m[4:] if m and m.startswith("sim-") else m


class RoutingTest(harness.TestCase):
    """Matching, splitting, sticky JSON field, override header: one tokentap,
    three simulators of different speeds, routes told apart by Host."""

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": (5, 0), "b": (40, 0), "c": (0, 0)})
        cls.conf = (
            "override_header: x-tt-upstream\n"
            + rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()})
            + """\
routes:
  - name: split
    match: {host: split.test}
    split:
      - {upstream: a, weight: 90}
      - {upstream: b, weight: 10}
  - name: sticky-json
    match: {host: user.test}
    split:
      - {upstream: a, weight: 1}
      - {upstream: b, weight: 1}
    sticky: {json_field: user}
  - name: sticky-conv
    match: {host: conv.test}
    split:
      - {upstream: a, weight: 1}
      - {upstream: b, weight: 1}
    sticky: {json_field: conv}
  - name: zero
    match: {host: zero.test}
    split:
      - {upstream: a, weight: 0}
      - {upstream: c, weight: 2}
  - name: by-host
    match: {host: api.example.internal}
    upstream: c
  - name: by-model
    match: {path_prefix: /v1/, model: big-model}
    upstream: b
  - name: by-method
    match: {path_prefix: /v1/completions, method: POST}
    upstream: c
  - name: first
    match: {path_prefix: /v1/}
    upstream: a
  - name: shadowed
    match: {path_prefix: /v1/chat/completions}
    upstream: b
""")
        cls.tt = rh.start_conf(cls, cls.conf)

    def counts(self):
        return rh.sim_requests(self.sims)

    def one(self, expect, **kw):
        """Sends one request; asserts it reached exactly simulator `expect`
        (None: none at all). Returns the response."""
        before = self.counts()
        resp = rh.send(self.tt.port, **kw)
        d = rh.delta(before, self.counts())
        want = {n: (1 if n == expect else 0) for n in self.sims}
        self.assertEqual(d, want, "request %r reached %r; status %r body %r"
                         % (kw, d, resp and resp.status, resp and resp.body[:200]))
        return resp

    # --- splitting -------------------------------------------------------

    def test_split_90_10_exact(self):
        n = 300
        before = self.counts()
        order = []
        ka = rh.KeepAlive(self.tt.port)
        self.addCleanup(ka.close)
        deadline = time.monotonic() + 30
        for i in range(n):
            self.assertLess(time.monotonic(), deadline, "split loop too slow")
            resp = ka.request("POST", CHAT, rh.chat(),
                              [("Host", "split.test"), ("x-request-id", "split-%03d" % i)]
                              + harness.sim_headers(tokens=1))
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, resp.body[:200])
            order.append(who(resp))
        d = rh.delta(before, self.counts())
        self.assertEqual(d, {"a": 270, "b": 30, "c": 0}, "per-simulator request counts")
        self.assertEqual(order.count("a"), 270)
        # The access log, in order: its upstream field gives 9/1 in every
        # window of 10 consecutive requests.
        want = ["split-%03d" % i for i in range(n)]

        def split_entries():
            got = [e for e in self.tt.access_log() if str(e.get("id", "")).startswith("split-")]
            return got if len(got) >= n else None

        entries = harness.wait_until(split_entries, 5.0, 0.05)
        self.assertTrue(entries, "access log lacks the split requests")
        self.assertEqual([e["id"] for e in entries], want, "access log order")
        ups = [e["upstream"] for e in entries]
        self.assertEqual(ups, order, "access log upstream vs the simulator that answered")
        for i in range(n - 9):
            w = ups[i:i + 10]
            self.assertEqual((w.count("a"), w.count("b")), (9, 1), "window %d..%d: %r" % (i, i + 9, w))

    def test_weight_zero_takes_nothing(self):
        for _ in range(6):
            self.one("c", body=rh.chat(), headers=fast(), host="zero.test")

    # --- matching --------------------------------------------------------

    def test_match_path_prefix_and_first_match_wins(self):
        # /v1/chat/completions without a model: `first` (/v1/) comes before
        # `shadowed` (/v1/chat/completions), so a, never b.
        for _ in range(3):
            resp = self.one("a", body=rh.chat(), headers=fast())
            self.assertEqual(who(resp), "a")
        self.one("a", method="GET", path="/v1/models")

    def test_match_method(self):
        body = {"prompt": "hello", "stream": False}
        resp = self.one("c", path="/v1/completions", body=body, headers=fast())
        self.assertEqual(resp.status, 200)
        # Not POST: falls through to `first`.
        self.one("a", method="GET", path="/v1/completions")

    def test_match_host(self):
        for host in ("api.example.internal", "api.example.internal:8443", "API.Example.Internal",
                     "Api.Example.INTERNAL:80"):
            with self.subTest(host=host):
                resp = self.one("c", body=rh.chat(), headers=fast(), host=host)
                self.assertEqual(who(resp), "c")
        for host in ("api.example.internal.evil", "xapi.example.internal", "127.0.0.1"):
            with self.subTest(host=host):
                self.assertEqual(who(self.one("a", body=rh.chat(), headers=fast(), host=host)), "a")

    def test_match_model(self):
        resp = self.one("b", body=rh.chat(model="big-model"), headers=fast())
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.json()["model"], "big-model")
        # Another model, or none: not this route.
        self.one("a", body=rh.chat(model="big-model-2"), headers=fast())
        self.one("a", body=rh.chat(model="small"), headers=fast())
        # The model after other fields, as clients send it.
        raw = b'{"messages":[{"role":"user","content":"hi"}],"stream":false,"model":"big-model"}'
        self.one("b", body=raw, headers=fast())

    def test_match_model_chunked_body(self):
        body = json.dumps(rh.chat(model="big-model", prompt="p" * 300)).encode()
        resp = self.one("b", body=body, headers=fast(), chunked=[1, 7, 13, 50, 64])
        self.assertEqual(resp.status, 200, resp.body[:200])
        self.assertEqual(resp.json()["model"], "big-model")

    def test_match_model_byte_identical(self):
        # A streamed request routed by its model must reach the simulator
        # byte for byte: the answer (a pure function of path, body and
        # x-sim headers) equals a direct request's.
        cases = [
            ("plain", rh.chat(model="big-model", stream=True, prompt="Tell me about \u00e9t\u00e9 \"quotes\""), None),
            ("chunked", rh.chat(model="big-model", stream=True, prompt="chunks " * 40), [3, 5, 100, 1]),
            # A large body with the model first: the first 64 KiB are read
            # to route, the rest streams on.
            ("large", {"model": "big-model", "stream": True,
                       "messages": [{"role": "user", "content": "y" * (200 * 1024)}]}, None),
            # The model late in the body, still within the first 64 KiB.
            ("late", {"messages": [{"role": "user", "content": "z" * (40 * 1024)}], "stream": True,
                      "model": "big-model"}, None),
        ]
        hdrs = harness.sim_headers(ttft=1, itl=1, tokens=12)
        for name, body, chunked in cases:
            with self.subTest(case=name):
                raw = json.dumps(body).encode()
                resp = self.one("b", body=raw, headers=hdrs, chunked=chunked)
                self.assertEqual(resp.status, 200, resp.body[:200])
                self.assertTrue(resp.complete)
                direct, _ = harness.exchange(self.sims["b"].port, "POST", CHAT, raw, hdrs)
                self.assertEqual(direct.status, 200)
                self.assertEqual(resp.body, direct.body, "body through the proxy differs from a direct request")

    def test_no_route_is_404_json(self):
        for method, path in (("POST", "/api/chat"), ("GET", "/"), ("GET", "/health"), ("POST", "/v2/x")):
            with self.subTest(path=path):
                body = rh.chat() if method == "POST" else None
                resp = self.one(None, method=method, path=path, body=body)
                self.assertProxyError(resp, 404)

    # --- sticky by JSON field ---------------------------------------------

    def test_sticky_json_field(self):
        ka = rh.KeepAlive(self.tt.port)
        self.addCleanup(ka.close)

        def ask(user):
            body = rh.chat() if user is None else rh.chat(user=user)
            resp = ka.request("POST", CHAT, body, [("Host", "user.test")] + fast(1))
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, resp.body[:200])
            return who(resp)

        for user in ("alice", "bob", "carol"):
            got = {ask(user) for _ in range(30)}
            self.assertEqual(len(got), 1, "user %s landed on %r" % (user, got))
        spread = {"a": 0, "b": 0}
        first = {}
        for i in range(100):
            u = "user-%d@example.com" % i
            first[u] = ask(u)
            spread[first[u]] += 1
        self.assertTrue(25 <= spread["a"] <= 75, "100 users over 1:1 spread %r" % spread)
        # Again: every user where it was.
        for u, up in list(first.items())[:40]:
            self.assertEqual(ask(u), up, u)
        # The field in a chunked body counts the same.
        for u in ("alice", "user-7@example.com"):
            raw = json.dumps(rh.chat(user=u, prompt="c" * 200)).encode()
            resp = rh.send(self.tt.port, raw, fast(1), host="user.test", chunked=[5, 17, 40])
            self.assertEqual(resp.status, 200, resp.body[:200])
            self.assertEqual(who(resp), ask(u), u)
        # Without the field: round robin over 1:1, so any 4 in a row split 2/2.
        got = [ask(None) for _ in range(4)]
        self.assertEqual(sorted(got), ["a", "a", "b", "b"], got)

    def test_sticky_json_field_per_route(self):
        """Two routes stick on different fields: each reads its own. Route
        user.test gets one `user` and a different `conv` each time, route
        conv.test the other way round."""
        ka = rh.KeepAlive(self.tt.port)
        self.addCleanup(ka.close)

        def ask(host, **fields):
            resp = ka.request("POST", CHAT, rh.chat(**fields), [("Host", host)] + fast(1))
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, resp.body[:200])
            return who(resp)

        for user in ("alice", "bob"):
            got = {ask("user.test", user=user, conv="c-%d" % i) for i in range(30)}
            self.assertEqual(len(got), 1, "user %s on the user route landed on %r" % (user, got))
        for conv in ("c-1", "c-2"):
            got = {ask("conv.test", conv=conv, user="u-%d" % i) for i in range(30)}
            self.assertEqual(len(got), 1, "conv %s on the conv route landed on %r" % (conv, got))

    # --- override header ---------------------------------------------------

    def test_override_header_pins(self):
        # within the matched route: any of its upstreams, a weight of 0 too
        for host, target in (("split.test", "b"), ("split.test", "a"), ("zero.test", "a"), ("zero.test", "c")):
            with self.subTest(host=host, target=target):
                for _ in range(4):
                    resp = self.one(target, body=rh.chat(), headers=fast() + [("x-tt-upstream", target)], host=host)
                    self.assertEqual(who(resp), target)
        # over a sticky key
        self.one("b", body=rh.chat(user="alice"), headers=fast() + [("X-TT-Upstream", "b")], host="user.test")

    def test_override_header_stays_in_the_route(self):
        # an upstream outside the matched route (a shadow, staging) is
        # refused, unless override_any_upstream says otherwise
        resp = self.one(None, body=rh.chat(user="alice"), headers=fast() + [("X-TT-Upstream", "c")], host="user.test")
        obj = self.assertProxyError(resp, 400)
        self.assertIn("not an upstream of route sticky-json", obj["error"]["message"])
        resp = self.one(None, body=rh.chat(), headers=fast() + [("x-tt-upstream", "b")])  # route first: a only
        self.assertProxyError(resp, 400)
        tt = rh.start_conf(self, "override_any_upstream: true\n" + self.conf)
        before = self.counts()
        resp = rh.send(tt.port, rh.chat(user="alice"), fast() + [("X-TT-Upstream", "c")], host="user.test")
        self.assertEqual(resp.status, 200, resp.body[:200])
        self.assertEqual(who(resp), "c")
        self.assertEqual(rh.delta(before, self.counts()), {"a": 0, "b": 0, "c": 1})

    def test_override_header_unknown_is_400(self):
        for value in ("nope", "", "A", "a,b"):
            with self.subTest(value=value):
                resp = self.one(None, body=rh.chat(), headers=fast() + [("x-tt-upstream", value)])
                self.assertProxyError(resp, 400)


class StickyHeaderTest(harness.TestCase):
    """Sticky by header with weighted rendezvous hashing, and what a weight
    change (by SIGHUP with an edited file) moves."""

    NKEYS = 300

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": (5, 0), "b": (40, 0), "c": (0, 0)})
        cls.ups = rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()})

    def conf(self, wa, wb, wc):
        return self.ups + """\
routes:
  - name: sticky
    split:
      - {upstream: a, weight: %d}
      - {upstream: b, weight: %d}
      - {upstream: c, weight: %d}
    sticky: {header: x-session}
""" % (wa, wb, wc)

    def placement(self, ka, keys):
        out = {}
        deadline = time.monotonic() + 20
        for k in keys:
            self.assertLess(time.monotonic(), deadline, "sticky loop too slow")
            resp = ka.request("POST", CHAT, rh.chat(), [("x-session", k)] + fast(1))
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, resp.body[:200])
            out[k] = who(resp)
        return out

    def test_sticky_header_and_weight_change(self):
        tt = rh.start_conf(self, self.conf(50, 50, 50))
        ka = rh.KeepAlive(tt.port)
        self.addCleanup(ka.close)

        # One key, many requests: one upstream.
        before = rh.sim_requests(self.sims)
        seen = set()
        for _ in range(30):
            seen.add(self.placement(ka, ["conv-42"])["conv-42"])
        self.assertEqual(len(seen), 1, seen)
        d = rh.delta(before, rh.sim_requests(self.sims))
        self.assertEqual(sorted(d.values()), [0, 0, 30], d)

        keys = ["session-%04d-%x" % (i, i * 2654435761 % 4096) for i in range(self.NKEYS)]
        p1 = self.placement(ka, keys)
        share1 = {u: sum(1 for v in p1.values() if v == u) / self.NKEYS for u in "abc"}
        for u in "abc":
            self.assertTrue(0.22 <= share1[u] <= 0.45, "50/50/50 spread %r" % share1)

        # Weight of c doubles: 50/50/100.
        ka.close()
        self.assertTrue(tt.reload(self.conf(50, 50, 100)), tt.stderr_text())
        p2 = self.placement(ka, keys)
        moved = [k for k in keys if p1[k] != p2[k]]
        wrong = [(k, p1[k], p2[k]) for k in moved if p2[k] != "c"]
        self.assertEqual(wrong, [], "keys moved elsewhere than to the upstream whose weight grew")
        # Weighted rendezvous: c's share goes from 1/3 to 1/2, so 1/6 of the
        # keys move (and no more: a key moves only when c now beats it).
        frac = len(moved) / self.NKEYS
        self.assertTrue(1 / 12 <= frac <= 1 / 4, "moved fraction %.3f (%d keys), expected about 1/6"
                        % (frac, len(moved)))
        share2 = {u: sum(1 for v in p2.values() if v == u) / self.NKEYS for u in "abc"}
        self.assertTrue(0.40 <= share2["c"] <= 0.60, "50/50/100 spread %r" % share2)
        # And stable again under the new weights.
        p3 = self.placement(ka, keys[:60])
        self.assertEqual(p3, {k: p2[k] for k in keys[:60]})

    def test_sticky_without_key_round_robins(self):
        tt = rh.start_conf(self, self.conf(1, 1, 2))
        ka = rh.KeepAlive(tt.port)
        self.addCleanup(ka.close)
        got = []
        for _ in range(8):
            resp = ka.request("POST", CHAT, rh.chat(), fast(1))
            self.assertEqual(resp.status, 200)
            got.append(who(resp))
        self.assertEqual((got.count("a"), got.count("b"), got.count("c")), (2, 2, 4), got)


class AdmissionTest(harness.TestCase):
    """max_concurrency 1, queue max 1, queue timeout 500 ms."""

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"q1": (50, 50), "q2": (50, 50)})
        extra = ["max_concurrency: 1", "queue: {max: 1, timeout: 500ms}"]
        cls.tt = rh.start_conf(cls, rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()},
                                                      {"q1": extra, "q2": extra}) + """\
routes:
  - name: r1
    match: {host: q1.test}
    upstream: q1
  - name: r2
    match: {host: q2.test}
    upstream: q2
""")

    def open_stream(self, host, hdrs, rid):
        conn = harness.HttpConn(self.tt.port, timeout=10)
        self.addCleanup(conn.close)
        body = rh.chat(stream=True)
        t0 = conn.send(harness.request_bytes("POST", CHAT, body,
                                             [("Host", host), ("x-request-id", rid)] + hdrs, self.tt.port))
        return conn, t0

    def log_entry(self, rid):
        e = harness.wait_log_entry(self.tt.log_path, lambda e: e.get("id") == rid, 5.0)
        self.assertIsNotNone(e, "no access log line for %s" % rid)
        return e

    def test_queue_then_run_then_full(self):
        sim = self.sims["q1"]
        before = sim.stats()["requests"]
        # ~50 + 19*12 = 278 ms each: the second waits less than the 500 ms timeout.
        hdrs = harness.sim_headers(ttft=50, itl=12, tokens=20)
        c1, t1 = self.open_stream("q1.test", hdrs, "adm-1")
        r1 = c1.read_head()
        self.assertEqual(r1.status, 200)
        c2, t2 = self.open_stream("q1.test", hdrs, "adm-2")
        time.sleep(0.05)
        c3, t3 = self.open_stream("q1.test", hdrs, "adm-3")
        r3 = c3.read_response()
        t3_done = time.monotonic_ns()
        self.assertProxyError(r3, 503)
        self.assertLess((t3_done - t3) / 1e6, 250, "the third (queue full) must be refused at once")
        c1.read_body(r1)
        self.assertTrue(r1.complete)
        r2 = c2.read_response()
        self.assertEqual(r2.status, 200, r2.body[:200])
        self.assertTrue(r2.complete)
        # Whole streams, equal to a direct request's.
        direct, _ = harness.exchange(sim.port, "POST", CHAT, rh.chat(stream=True), hdrs)
        self.assertEqual(r1.body, direct.body)
        self.assertEqual(r2.body, direct.body)
        e1, e2, e3 = self.log_entry("adm-1"), self.log_entry("adm-2"), self.log_entry("adm-3")
        self.assertEqual(e3["status"], 503)
        # Overload, not the client's fault: its own kind, not bad_request.
        self.assertEqual(e3["error"], "queue_full")
        # The second waited for the first to end: its queue time is the
        # first's duration less the gap between the two sends.
        gap_ms = (t2 - t1) / 1e6
        self.assertIsNotNone(e2["queue_ms"])
        self.assertGreaterEqual(e2["queue_ms"], e1["e2e_ms"] - gap_ms - 30,
                                "queue_ms %r, first e2e %r, gap %.1f" % (e2["queue_ms"], e1["e2e_ms"], gap_ms))
        self.assertLess(e2["queue_ms"], 490)
        self.assertLess(e1["queue_ms"] or 0, 20)
        # It started after the first had finished: its first byte came after
        # the first's last.
        self.assertGreater(r2.pieces[0][0], r1.pieces[-1][0] - 5e6)
        self.assertEqual(sim.stats()["requests"] - before, 3)  # 1, 2 and the direct one

    def test_queue_timeout(self):
        sim = self.sims["q2"]
        before = sim.stats()["requests"]
        long_hdrs = harness.sim_headers(ttft=50, itl=50, tokens=20)  # ~1 s
        c1, t1 = self.open_stream("q2.test", long_hdrs, "qt-1")
        r1 = c1.read_head()
        self.assertEqual(r1.status, 200)
        c2, t2 = self.open_stream("q2.test", long_hdrs, "qt-2")
        r2 = c2.read_response()
        waited = (time.monotonic_ns() - t2) / 1e6
        self.assertProxyError(r2, 503)
        self.assertTrue(450 <= waited <= 800, "503 after %.0f ms, expected ~500" % waited)
        c1.read_body(r1)
        self.assertTrue(r1.complete)
        self.assertEqual(sim.stats()["requests"] - before, 1, "the timed-out request reached the upstream")
        e2 = self.log_entry("qt-2")
        self.assertEqual(e2["status"], 503)
        if e2.get("queue_ms") is not None:
            self.assertTrue(450 <= e2["queue_ms"] <= 800, e2)


def reset_handler(sock, req, ctx):
    """Reads the request, then resets: a byte has reached this upstream."""
    harness.reset_socket(sock)
    return False


class FailoverTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "2", "--model", "sim-live")
        cls.dead = harness.free_port()
        cls.hole = harness.Blackhole()
        cls.addClassCleanup(cls.hole.stop)
        cls.rst = harness.start_fake_upstream(cls, reset_handler)
        cls.tt = rh.start_conf(cls, """\
override_header: x-tt-upstream
timeouts: {connect: 1s}
upstreams:
  - name: dead
    url: http://127.0.0.1:%d
    eject: {after: 0}  # the tests count its refusals: never out of the choice
  - name: live
    url: %s
  - name: hole
    url: %s
    timeouts: {connect: 300ms}
  - name: rst
    url: %s
routes:
  - name: slow-connect
    match: {host: hole.test}
    split:
      - {upstream: hole, weight: 1}
      - {upstream: live, weight: 1}
  - name: reset
    match: {host: rst.test}
    split:
      - {upstream: rst, weight: 1}
      - {upstream: live, weight: 1}
  - name: fo
    match: {host: fo.test}
    split:
      - {upstream: dead, weight: 1}
      - {upstream: live, weight: 1}
  - name: nofo
    match: {host: nofo.test}
    split:
      - {upstream: dead, weight: 1}
      - {upstream: live, weight: 1}
    failover: false
""" % (cls.dead, cls.sim.url, cls.hole.url, cls.rst.url), *rh.ONE_WORKER)

    def test_failover_to_live(self):
        before = self.sim.stats()["requests"]
        for i in range(10):
            resp = rh.send(self.tt.port, rh.chat(), fast(), host="fo.test")
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
            self.assertEqual(who(resp), "live")
        self.assertEqual(self.sim.stats()["requests"] - before, 10)

    def test_no_failover_gives_502(self):
        before = self.sim.stats()["requests"]
        statuses = []
        for i in range(10):
            resp = rh.send(self.tt.port, rh.chat(), fast(), host="nofo.test")
            self.assertIsNotNone(resp)
            statuses.append(resp.status)
            if resp.status == 502:
                self.assertProxyError(resp, 502)
        self.assertEqual(sorted(statuses), [200] * 5 + [502] * 5, statuses)
        self.assertEqual(self.sim.stats()["requests"] - before, 5)


    def test_failover_on_connect_timeout(self):
        before = self.sim.stats()["requests"]
        for i in range(4):
            t0 = time.monotonic()
            resp = rh.send(self.tt.port, rh.chat(), fast(), host="hole.test")
            self.assertIsNotNone(resp)
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
            self.assertEqual(who(resp), "live")
            self.assertLess(time.monotonic() - t0, 1.5)
        self.assertEqual(self.sim.stats()["requests"] - before, 4)

    def test_no_failover_once_a_byte_reached_the_upstream(self):
        before = self.sim.stats()["requests"]
        n0 = len(self.rst.requests)
        statuses = []
        for i in range(4):
            resp = rh.send(self.tt.port, rh.chat(), fast(), host="rst.test")
            self.assertIsNotNone(resp)
            statuses.append(resp.status)
            if resp.status != 200:
                self.assertProxyError(resp, 502)
        self.assertEqual(sorted(statuses), [200, 200, 502, 502], statuses)
        self.assertEqual(self.sim.stats()["requests"] - before, 2, "a request that reached an upstream was retried")
        self.assertEqual(len(self.rst.requests) - n0, 2)

    def test_pinned_request_does_not_fail_over(self):
        before = self.sim.stats()["requests"]
        resp = rh.send(self.tt.port, rh.chat(), fast() + [("x-tt-upstream", "dead")], host="fo.test")
        self.assertProxyError(resp, 502)
        self.assertEqual(self.sim.stats()["requests"], before)


LONG = harness.sim_headers(ttft=10, itl=20, tokens=50)  # ~1 s


def run_stream(port, prompt, rid, hdrs=LONG):
    body = rh.chat(stream=True, prompt=prompt)
    resp, _ = harness.exchange(port, "POST", CHAT, body, hdrs + [("x-request-id", rid)], timeout=15)
    return resp


def stream_model(resp):
    for ev in harness.sse_events(resp):
        if ev.data.strip() == "[DONE]":
            continue
        m = ev.json().get("model")
        if m:
            return m[4:] if m.startswith("sim-") else m
    return None


class ReloadTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": (5, 0), "b": (40, 0), "c": (0, 0)})
        cls.ups = rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()})

    def conf(self, weights):
        return self.ups + "routes:\n  - name: main\n    split:\n" + "".join(
            "      - {upstream: %s, weight: %d}\n" % (u, w) for u, w in weights)

    def check_streams(self, results, prompts):
        for i, (kind, resp) in enumerate(results):
            self.assertEqual(kind, "ok", "stream %d: %r" % (i, resp))
            self.assertIsNotNone(resp, "stream %d: no response" % i)
            self.assertEqual(resp.status, 200, resp.body[:200])
            self.assertTrue(resp.complete, "stream %d cut" % i)
            up = stream_model(resp)
            self.assertIn(up, self.sims)
            direct, _ = harness.exchange(self.sims[up].port, "POST", CHAT, rh.chat(stream=True, prompt=prompts[i]),
                                         LONG, timeout=15)
            self.assertEqual(resp.body, direct.body, "stream %d differs from a direct request to %s" % (i, up))

    def test_reload_under_load(self):
        tt = rh.start_conf(self, self.conf([("a", 1), ("b", 1)]), *rh.ONE_WORKER)
        bg = rh.Background()
        prompts = ["stream number %d" % i for i in range(6)]
        for i, p in enumerate(prompts):
            bg.start(run_stream, tt.port, p, "rl-%d" % i)
        time.sleep(0.25)
        # a leaves the config altogether; b and c split 1:3.
        self.assertTrue(tt.reload(self.conf([("b", 1), ("c", 3)])), tt.stderr_text())
        before = rh.sim_requests(self.sims)
        got = []
        for i in range(20):
            resp = rh.send(tt.port, rh.chat(), fast(1))
            self.assertEqual(resp.status, 200, resp.body[:200])
            got.append(who(resp))
        self.assertEqual((got.count("a"), got.count("b"), got.count("c")), (0, 5, 15), got)
        self.assertEqual(rh.delta(before, rh.sim_requests(self.sims)), {"a": 0, "b": 5, "c": 15})
        results = bg.join(15)
        self.check_streams(results, prompts)
        # The running streams stayed where they began: 3 on a, 3 on b.
        ups = sorted(stream_model(r) for _, r in results)
        self.assertEqual(ups, ["a"] * 3 + ["b"] * 3)
        log = tt.wait_log_count(26)
        rl = [e for e in log if str(e.get("id", "")).startswith("rl-")]
        self.assertEqual(len(rl), 6)
        for e in rl:
            self.assertEqual(e["status"], 200, e)
            self.assertIsNone(e["error"], e)
            self.assertEqual(e["token_events"], 50, e)

        # A broken file on SIGHUP: logged, and the running config stays.
        good = tt.body
        bad = good + "  - name: broken\n    upstream: ghost\n    bogus: 1\n"
        self.assertTrue(tt.reload(bad, expect_ok=False), "no 'reload failed' line:\n" + tt.stderr_text())
        self.assertTrue(harness.wait_until(lambda: "tokentap.yaml:" in tt.stderr_text(), 2.0),
                        "the failed reload does not name FILE:LINE:\n" + tt.stderr_text())
        tt.body = good
        got = []
        for i in range(8):
            resp = rh.send(tt.port, rh.chat(), fast(1))
            self.assertEqual(resp.status, 200, resp.body[:200])
            got.append(who(resp))
        self.assertEqual((got.count("b"), got.count("c")), (2, 6), got)
        self.assertTrue(tt.alive())

    def test_reloads_during_nonstop_traffic(self):
        """Two workers, requests without a pause and streams running while
        four SIGHUPs change the weights: every request answered 200 with
        its whole body, every stream complete and byte-exact, and the
        route's series in /stats count every request, from before and
        after each reload alike."""
        tt = rh.start_conf(self, self.conf([("a", 1), ("b", 1)]), "--workers", "2", "--admin", "127.0.0.1:0",
                           "--flush-interval", "100ms")
        admin = harness.admin_port(tt)
        stop = threading.Event()
        quick, streams = [], []

        def send_quick():
            ka = rh.KeepAlive(tt.port)
            deadline = time.monotonic() + 20
            try:
                for i in range(1000000):
                    if stop.is_set() or time.monotonic() > deadline:
                        return
                    # every other request on a fresh connection
                    resp = (ka.request("POST", CHAT, rh.chat(), fast(3)) if i % 2
                            else rh.send(tt.port, rh.chat(), fast(3)))
                    quick.append(resp)
            finally:
                ka.close()

        def send_streams(n):
            for i in range(20):
                if stop.is_set():
                    return
                streams.append(run_stream(tt.port, "nonstop", "ns-%d-%d" % (n, i),
                                          harness.sim_headers(ttft=10, itl=10, tokens=30)))

        threads = [threading.Thread(target=send_quick, daemon=True)] + [
            threading.Thread(target=send_streams, args=(n,), daemon=True) for n in range(2)]
        for t in threads:
            t.start()
        weights = [[("a", 2), ("b", 1)], [("a", 1), ("b", 3)], [("a", 1), ("b", 1)], [("a", 3), ("b", 1)]]
        for w in weights:
            time.sleep(0.3)
            n0 = len(quick)
            self.assertTrue(tt.reload(self.conf(w)), tt.stderr_text())
            self.assertTrue(harness.wait_until(lambda: len(quick) > n0 + 5, 3.0), "traffic stalled at a reload")
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(15)
            self.assertFalse(t.is_alive())
        self.assertGreater(len(quick), 50)
        self.assertGreaterEqual(len(streams), 4)
        for i, resp in enumerate(quick):
            self.assertIsNotNone(resp, "request %d: no answer" % i)
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
            self.assertTrue(resp.complete, "request %d cut" % i)
            self.assertEqual(len(resp.json()["choices"][0]["message"]["content"].split()), 3, resp.body[:200])
        direct = {}
        for i, resp in enumerate(streams):
            self.assertIsNotNone(resp, "stream %d: no answer" % i)
            self.assertEqual(resp.status, 200, resp.body[:200])
            self.assertTrue(resp.complete, "stream %d cut" % i)
            up = stream_model(resp)
            if up not in direct:
                direct[up], _ = harness.exchange(self.sims[up].port, "POST", CHAT,
                                                 rh.chat(stream=True, prompt="nonstop"),
                                                 harness.sim_headers(ttft=10, itl=10, tokens=30), timeout=15)
            self.assertEqual(resp.body, direct[up].body, "stream %d differs from a direct request to %s" % (i, up))
        total = len(quick) + len(streams)

        def counted():
            r, _ = harness.exchange(admin, "GET", "/stats?window=all&route=main")
            return sum(s["requests"] for s in r.json()["series"])
        self.assertTrue(harness.wait_until(lambda: counted() == total, 5.0), (counted(), total))
        r, _ = harness.exchange(admin, "GET", "/stats?window=all&route=main")
        self.assertEqual({s["upstream"] for s in r.json()["series"]}, {"a", "b"})

    def test_reload_keeps_admission_limit(self):
        # max_concurrency 1 and no queue: while a stream runs, another
        # request gets 503. A reload (the same file) must not make room for
        # a second request on the same upstream.
        conf = rh.upstreams_yaml({"a": self.sims["a"].url}, {"a": ["max_concurrency: 1"]})
        tt = rh.start_conf(self, conf)
        bg = rh.Background()
        bg.start(run_stream, tt.port, "admission across reload", "ar-1")
        time.sleep(0.25)
        resp = rh.send(tt.port, rh.chat(), fast(1))
        self.assertProxyError(resp, 503)
        self.assertTrue(tt.reload(conf), tt.stderr_text())
        resp = rh.send(tt.port, rh.chat(), fast(1))
        status_after = resp and resp.status
        (kind, first), = bg.join(10)
        self.assertEqual(kind, "ok", first)
        self.assertEqual(first.status, 200)
        self.assertTrue(first.complete)
        self.assertEqual(status_after, 503,
                         "after a reload a second request ran beside the stream on an upstream with "
                         "max_concurrency 1 (status %r)" % status_after)

    def test_reload_of_startup_only_settings_is_reported(self):
        tt = rh.start_conf(self, self.conf([("a", 1)]))
        with open(tt.path) as f:
            text = f.read().replace("listen: 127.0.0.1:0", "listen: 127.0.0.1:1")
        rh.write_file(tt.path, text)
        n0 = tt.count_lines(rh.RELOAD_RE)
        tt.signal(signal.SIGHUP)
        self.assertTrue(harness.wait_until(lambda: "restart" in tt.stderr_text(), 3.0), tt.stderr_text())
        self.assertTrue(harness.wait_until(lambda: tt.count_lines(rh.RELOAD_RE) > n0, 3.0), tt.stderr_text())
        resp = rh.send(tt.port, rh.chat(), fast(1))
        self.assertEqual(resp.status, 200)

    def test_failed_reload_keeps_the_log_level(self):
        """log_level takes effect with the generation: a file that fails to
        load changes nothing, not even the level it names; one that loads
        does."""
        tt = rh.start_conf(self, self.conf([("a", 1)]), *rh.ONE_WORKER)
        debug = lambda: [l for l in tt.stderr_text().split("\n") if " debug " in l]
        self.assertTrue(tt.reload("log_level: debug\nno_such_key: 1\n" + self.conf([("a", 1)]), expect_ok=False),
                        tt.stderr_text())
        self.assertEqual(rh.send(tt.port, rh.chat(), fast(1)).status, 200)
        self.assertEqual(debug(), [], "a failed reload changed the log level")
        self.assertTrue(tt.reload("log_level: debug\n" + self.conf([("a", 1)])), tt.stderr_text())
        self.assertEqual(rh.send(tt.port, rh.chat(), fast(1)).status, 200)
        self.assertTrue(harness.wait_until(lambda: debug() != [], 3.0), "the loaded file's level did not apply")

    def test_reload_names_each_startup_only_setting(self):
        """Each setting read once at start-up, changed and reloaded: the
        log names it and says a restart is needed; the reload still goes
        through for the rest."""
        def text(slo="", store="", admin="", workers="1"):
            return ("listen: 127.0.0.1:0\naccess_log: off\nworkers: %s\n"
                    "admin: {listen: \"off\"%s}\nstore: {dir: \"off\"%s}\n%s"
                    % (workers, admin, store, slo) + rh.upstreams_yaml({"a": self.sims["a"].url}))
        tt = rh.ConfTokentap(text(), access_log=False, header=False)
        self.addCleanup(harness._stop_and_check, tt)
        token = rh.write_file(os.path.join(tt.workdir, "token"), "secret-token-for-reload\n")
        cases = [
            ("slo.ttft", dict(slo="slo: {ttft: 3s}\n")),
            ("slo.tpot", dict(slo="slo: {tpot: 50ms}\n")),
            ("slo.itl", dict(slo="slo: {itl: 500ms}\n")),
            ("store.flush_interval", dict(store=", flush_interval: 5s")),
            ("store.minute_retention", dict(store=", minute_retention: 2h")),
            ("store.hour_retention", dict(store=", hour_retention: 48h")),
            ("store.max_models", dict(store=", max_models: 4")),
            ("admin.token_file", dict(admin=", token_file: %s" % token)),
            ("workers", dict(workers="2")),
        ]
        for key, kw in cases:
            with self.subTest(key=key):
                self.assertTrue(tt.reload(text(**kw)), tt.stderr_text())
                rx = re.compile(r"reload: .*\b%s\b.*restart" % re.escape(key))
                self.assertTrue(harness.wait_until(lambda: tt.count_lines(rx) > 0, 3.0), tt.stderr_text())
                self.assertEqual(rh.send(tt.port, rh.chat(), fast(1)).status, 200)
                # back to the start-up file: nothing to report
                self.assertTrue(tt.reload(text()), tt.stderr_text())
        self.assertEqual(tt.count_lines(re.compile(r"reload: .*restart")), len(cases), tt.stderr_text())


class DrainTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "5", "--itl-ms", "0", "--tokens", "4", "--model", "sim-d")

    def conf(self, grace):
        return "timeouts: {shutdown_grace: %s}\n" % grace + rh.upstreams_yaml({"d": self.sim.url})

    def watch_exit(self, tt):
        done = {}

        def wait():
            try:
                tt.proc.wait(20)
            except Exception:
                pass
            done["t"] = time.monotonic()

        th = threading.Thread(target=wait, daemon=True)
        th.start()
        return done, th

    def test_sigterm_drains(self):
        tt = rh.start_conf(self, self.conf("5s"))
        # An idle keep-alive connection (one request done on it).
        idle = harness.HttpConn(tt.port)
        self.addCleanup(idle.close)
        idle.send(harness.request_bytes("POST", CHAT, rh.chat(), fast(1), tt.port))
        r = idle.read_response()
        self.assertEqual(r.status, 200)
        bg = rh.Background()
        prompts = ["drain %d" % i for i in range(4)]
        ends = {}

        def stream(i):
            resp = run_stream(tt.port, prompts[i], "dr-%d" % i)
            ends[i] = time.monotonic()
            return resp

        before = self.sim.stats()["requests"]
        for i in range(4):
            bg.start(stream, i)
        self.assertTrue(harness.wait_until(lambda: self.sim.stats()["requests"] >= before + 4, 5.0),
                        "the four streams did not reach the simulator")
        done, th = self.watch_exit(tt)
        t_sig = time.monotonic()
        tt.signal(signal.SIGTERM)
        # every worker has closed its listener once it says so
        workers = int(re.search(r"(\d+) worker\(s\)", tt.stderr_text()).group(1))
        self.assertTrue(harness.wait_until(lambda: tt.stderr_text().count("no longer accepting") >= workers, 2.0),
                        "not every worker stopped accepting; stderr:\n%s" % tt.stderr_text())
        # A new client is turned away now, not left waiting (in the listen
        # backlog) until the last stream ends: connect refused, or closed
        # without an answer, within half a second.
        t_probe = time.monotonic()
        outcome = rh.connect_outcome(tt.port, timeout=0.5)
        probe_msg = ("a new connection %.0f ms into the drain: %s after %.0f ms"
                     % ((t_probe - t_sig) * 1e3, outcome, (time.monotonic() - t_probe) * 1e3))
        self.assertTrue(idle.wait_closed(1.0), "an idle keep-alive connection was left open during the drain")
        results = bg.join(15)
        for i, (kind, resp) in enumerate(results):
            self.assertEqual(kind, "ok", resp)
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete, "stream %d cut by the drain" % i)
            direct, _ = harness.exchange(self.sim.port, "POST", CHAT, rh.chat(stream=True, prompt=prompts[i]),
                                         LONG, timeout=15)
            self.assertEqual(resp.body, direct.body, "stream %d" % i)
        th.join(10)
        self.assertIn("t", done, "tokentap did not exit")
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())
        last = max(ends.values())
        self.assertGreaterEqual(done["t"], last - 0.2, "exited before the last stream ended")
        self.assertLess(done["t"] - last, 1.5, "exit came %.2f s after the last stream" % (done["t"] - last))
        self.assertLess(done["t"] - t_sig, 5.0, "not within the grace period")
        # Checked last, so that the checks above run whatever it says.
        self.assertIn(outcome, ("refused", "closed"), probe_msg)

    def test_grace_period_cuts(self):
        self.grace_cuts(rh.start_conf(self, self.conf("1s")))

    def test_sigterm_flushes_the_store(self):
        """With an hour between flushes, nothing reaches the store on the
        timer: SIGTERM's drain must hand it every request before exit."""
        d = tempfile.mkdtemp(prefix="tokentap-flush-")
        self.addCleanup(shutil.rmtree, d, True)
        args = ("--data-dir", os.path.join(d, "data"), "--flush-interval", "1h", "--admin", "127.0.0.1:0")
        n = 25
        tt = rh.start_conf(self, self.conf("5s"), *args)
        for _ in range(n):
            self.assertEqual(rh.send(tt.port, rh.chat(), fast(2)).status, 200)
        tt.signal(signal.SIGTERM)
        tt.proc.wait(10)
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())
        again = rh.start_conf(self, self.conf("5s"), *args)
        r, _ = harness.exchange(harness.admin_port(again), "GET", "/stats?window=all")
        self.assertEqual(sum(s["requests"] for s in r.json()["series"]), n, r.body[:500])

    def test_grace_period_follows_reload(self):
        tt = rh.start_conf(self, self.conf("30s"))
        self.assertTrue(tt.reload(self.conf("1s")), tt.stderr_text())
        self.grace_cuts(tt)

    def grace_cuts(self, tt):
        bg = rh.Background()
        hdrs = harness.sim_headers(ttft=10, itl=20, tokens=200)  # ~4 s
        bg.start(run_stream, tt.port, "long one", "gr-1", hdrs)
        time.sleep(0.3)
        done, th = self.watch_exit(tt)
        t_sig = time.monotonic()
        tt.signal(signal.SIGTERM)
        th.join(6)
        self.assertIn("t", done, "tokentap did not exit")
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())
        self.assertTrue(0.8 <= done["t"] - t_sig <= 2.5, "exit %.2f s after SIGTERM, grace 1s" % (done["t"] - t_sig))
        (kind, resp), = bg.join(5)
        if kind == "ok" and resp is not None:
            self.assertFalse(resp.complete, "a 4 s stream completed within a 1 s grace period")


if __name__ == "__main__":
    unittest.main()
