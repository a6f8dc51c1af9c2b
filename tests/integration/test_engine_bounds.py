"""test_engine_bounds.py — an engine's /metrics with absurd request gauges,
over real sockets: counts past ENGINE_COUNT_MAX (10^9) read as 10^9, a sum
of samples that overflows a double too, so `running + waiting` and
`beyond_proxy` in /upstreams, the gauges in /metrics and a request's logged
`engine` stay exact and never wrap (the sanitizer build runs the same
test: an overflow there aborts tokentap)."""

import re
import unittest

import harness
import routing_helpers as rh

CAP = 10 ** 9
INTERVAL_MS = 100


def metrics_endpoint(test, body):
    """A fake server answering every request with this /metrics text."""

    def handler(sock, req, ctx):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        return True

    return harness.start_fake_upstream(test, handler)


def upstream_view(port, name):
    resp, _ = harness.exchange(port, "GET", "/upstreams")
    for u in resp.json()["upstreams"]:
        if u["name"] == name:
            return u["engine"]
    raise AssertionError("no upstream %s" % name)


class HugeGauges(harness.TestCase):
    CASES = {
        # two gauges of 5e18: their int64 sum wrapped (beyond_proxy: 0)
        "big": (b"vllm:num_requests_running 5e18\nvllm:num_requests_waiting 5e18\n", CAP, CAP),
        # samples whose double sum overflows to +inf
        "inf": (b'vllm:num_requests_running{engine="0"} 1.7e308\nvllm:num_requests_running{engine="1"} 1.7e308\n'
                b"vllm:num_requests_waiting 9.2e18\n", CAP, CAP),
        # just below and at the cap, and a negative one
        "edge": (b"vllm:num_requests_running 999999999.4\nvllm:num_requests_waiting -1e300\n", CAP - 1, 0),
    }

    def test_counts_saturate(self):
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        ends = {n: metrics_endpoint(self, body) for n, (body, _, _) in self.CASES.items()}
        conf = rh.upstreams_yaml({n: sim.url for n in ends}, {
            n: ["metrics_url: %s/metrics" % f.url, "metrics_interval: %dms" % INTERVAL_MS, "engine: vllm"]
            for n, f in ends.items()})
        conf += "routes:\n" + "".join("  - name: %s\n    match: {model: %s}\n    upstream: %s\n" % (n, n, n)
                                       for n in ends)
        tt = rh.start_conf(self, conf, "--admin", "127.0.0.1:0")
        admin = harness.admin_port(tt)
        for n in ends:
            self.assertTrue(harness.wait_until(lambda n=n: upstream_view(admin, n)["scraped"], 5.0, 0.02),
                            upstream_view(admin, n))
        for n, (_, running, waiting) in self.CASES.items():
            with self.subTest(upstream=n):
                eng = upstream_view(admin, n)
                self.assertEqual((eng["running"], eng["waiting"]), (running, waiting), eng)
                self.assertEqual(eng["tokentap_in_flight"], 0)
                self.assertEqual(eng["beyond_proxy"], running + waiting, eng)
                self.assertIsNotNone(eng["note"])
        resp, _ = harness.exchange(admin, "GET", "/metrics")
        text = resp.body.decode()
        for n, (_, running, waiting) in self.CASES.items():
            for fam, want in (("running", running), ("waiting", waiting)):
                m = re.search(r'(?m)^tokentap_engine_requests_%s\{upstream="%s"\} (\S+)$' % (fam, n), text)
                self.assertIsNotNone(m, (n, fam))
                self.assertEqual(float(m.group(1)), want, (n, fam))
        # a request dispatched now records the saturated values
        resp = rh.send(tt.port, rh.chat(model="big"))
        self.assertEqual(resp.status, 200)
        entry = harness.wait_log_entry(tt.log_path, lambda e: e.get("upstream") == "big")
        self.assertIsNotNone(entry, open(tt.log_path).read()[-2000:])
        self.assertEqual((entry["engine"]["running"], entry["engine"]["waiting"]), (CAP, CAP), entry)
        self.assertTrue(tt.alive())


if __name__ == "__main__":
    unittest.main()
