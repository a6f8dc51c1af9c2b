"""test_series_labels.py — the series a request is counted under, by how it
ends: its labels in /stats (route, upstream, model) and its cold count.

The meter (src/measure/meter.c) resolves a request's series once, at its first
inter-token record or when the request is recorded, from the labels the
request's routing has reached by then. So: a request no route matches is
counted under route and upstream "none"; one refused after its route matched
but before an upstream was chosen (an override header naming an upstream
outside the route) under its route and "none"; one that failed over under
the upstream that answered, never the one that refused it; a shadow copy
under its route and the shadow upstream, never cold (a shadow does not
track coldness), while the primary's first request, on a fresh connection
to an upstream that served nothing yet, is cold.

One tokentap, one worker, the admin API on; each test reads /stats for a
model name of its own, so the tests do not see each other's requests.
"""

import unittest

import harness
import routing_helpers as rh

STREAMED_TOKENS = 4


def fast(tokens=STREAMED_TOKENS):
    return harness.sim_headers(ttft=0, itl=1, tokens=tokens)


class SeriesLabelsTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.live = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "1", "--model", "sim-live")
        cls.prim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "1", "--model", "sim-prim")
        cls.shadow = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "1", "--model", "sim-shadow")
        dead = harness.free_port()
        cls.tt = rh.start_conf(cls, """\
override_header: x-tt-upstream
upstreams:
  - name: dead
    url: http://127.0.0.1:%d
  - name: live
    url: %s
  - name: prim
    url: %s
  - name: shadow
    url: %s
routes:
  - name: fo
    match: {host: fo.test}
    split:
      - {upstream: dead, weight: 1}
      - {upstream: live, weight: 1}
  - name: mir
    match: {host: mir.test}
    upstream: prim
    mirror: {upstream: shadow, percent: 100}
  - name: main
    match: {host: main.test}
    upstream: live
""" % (dead, cls.live.url, cls.prim.url, cls.shadow.url), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        cls.admin = harness.admin_port(cls.tt)

    def series(self, route, total):
        """{(upstream, model): (requests, cold_requests)} of /stats for
        `route`, once `total` requests are counted there. Each test has a
        route of its own."""
        got = {}

        def check():
            r, _ = harness.exchange(self.admin, "GET", "/stats?window=all&route=%s" % route)
            got.clear()
            for s in r.json()["series"]:
                self.assertEqual(s["route"], route)
                got[(s["upstream"], s["model"])] = (s["requests"], s["cold_requests"])
            return sum(n for n, _ in got.values()) == total

        self.assertTrue(harness.wait_until(check, 5.0, 0.05), "series of route %s: %r" % (route, got))
        return got

    def test_no_route_counts_under_none(self):
        resp = rh.send(self.tt.port, rh.chat(model="m-noroute"), host="nowhere.test")
        self.assertEqual(resp.status, 404)
        got = self.series("none", 1)
        self.assertEqual(list(got.values()), [(1, 0)], got)
        self.assertEqual([u for u, _ in got], ["none"], got)

    def test_refused_before_an_upstream_counts_under_its_route(self):
        # `shadow` is configured but not an upstream of route main, `nosuch`
        # is not configured: 400 both, once the route matched
        for name in ("shadow", "nosuch"):
            resp = rh.send(self.tt.port, rh.chat(model="m-override"), [("x-tt-upstream", name)], host="main.test")
            self.assertEqual(resp.status, 400, name)
        got = self.series("main", 2)
        self.assertEqual(list(got.values()), [(2, 0)], got)
        self.assertEqual([u for u, _ in got], ["none"], got)

    def test_failover_counts_under_the_upstream_that_answered(self):
        n = 8
        for i in range(n):
            resp = rh.send(self.tt.port, rh.chat(model="m-failover", stream=True), fast(), host="fo.test")
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
        got = self.series("fo", n)
        self.assertEqual(list(got), [("live", "m-failover")], got)
        # its inter-token gaps, recorded from the response body as it
        # streamed, went there too
        r, _ = harness.exchange(self.admin, "GET", "/stats?window=all&route=fo")
        (s,) = r.json()["series"]
        self.assertEqual(s["metrics"]["itl"]["count"], n * (STREAMED_TOKENS - 1))

    def test_shadow_counts_under_its_route_and_upstream_never_cold(self):
        # prim and shadow served nothing before: the primary's first request
        # is cold, the shadow's never. The shadow is started when its
        # primary is routed, here at the head, before the body named the
        # model: it has none.
        n = 3
        for i in range(n):
            resp = rh.send(self.tt.port, rh.chat(model="m-mirror", stream=True), fast(), host="mir.test")
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
        self.assertTrue(harness.wait_until(lambda: self.shadow.stats()["completed"] == n, 5.0))
        got = self.series("mir", 2 * n)
        self.assertEqual(got, {("prim", "m-mirror"): (n, 1), ("shadow", "unknown"): (n, 0)})


if __name__ == "__main__":
    unittest.main()
