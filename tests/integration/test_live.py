"""The admin API's live views of the proxy: /routes, /upstreams, and the
runtime weight change POST /routes/weights (token-guarded), over real
sockets with two simulators behind one tokentap."""

import json
import os
import re
import threading
import time
import unittest

import harness
import routing_helpers as rh
from test_admin import admin_port

TOKEN = "live-test-token-0123"


def admin_req(port, method, path, body=None, token=None):
    headers = [("Authorization", "Bearer " + token)] if token else []
    if body is not None:
        headers.append(("Content-Type", "application/json"))
    resp, _ = harness.exchange(port, method, path, body=body, headers=headers)
    return resp


class LiveTest(harness.TestCase):
    def setUp(self):
        self.sims = {
            "fast": harness.start_sim(self, "--ttft-ms", "2", "--itl-ms", "1", "--model", "fast"),
            "slow": harness.start_sim(self, "--ttft-ms", "2", "--itl-ms", "1", "--model", "slow"),
        }
        urls = {k: v.url for k, v in self.sims.items()}
        body = rh.upstreams_yaml(
            urls,
            {"fast": ["labels: {runtime: sim-fast, hardware: cpu}"], "slow": ["max_concurrency: 3", "queue: {max: 5}"]},
        ) + (
            "routes:\n"
            "  - name: chat\n"
            "    split:\n"
            "      - {upstream: fast, weight: 3}\n"
            "      - {upstream: slow, weight: 1}\n"
        )
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            self.tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        self.admin = admin_port(self.tt)

    def served(self, n):
        """Sends n chat requests; returns the upstream of each, in order."""
        out = []
        for _ in range(n):
            resp = rh.send(self.tt.port, rh.chat())
            self.assertEqual(resp.status, 200)
            out.append(rh.served_by(resp))
        return out

    def test_routes_shows_the_configuration(self):
        r = admin_req(self.admin, "GET", "/routes")
        self.assertEqual(r.status, 200)
        doc = r.json()
        self.assertEqual(doc["generation"], 1)
        (route,) = doc["routes"]
        self.assertEqual(route["name"], "chat")
        self.assertEqual([(t["upstream"], t["weight"]) for t in route["targets"]], [("fast", 3), ("slow", 1)])
        self.assertAlmostEqual(route["targets"][0]["share"], 0.75)
        self.assertEqual(route["targets"][0]["labels"], {"runtime": "sim-fast", "hardware": "cpu"})
        self.assertTrue(route["failover"])

    def test_upstreams_show_live_state(self):
        self.served(8)
        r = admin_req(self.admin, "GET", "/upstreams")
        self.assertEqual(r.status, 200)
        ups = {u["name"]: u for u in r.json()["upstreams"]}
        self.assertEqual(ups["fast"]["requests"] + ups["slow"]["requests"], 8)
        self.assertEqual(ups["fast"]["requests"], 6)
        self.assertEqual(ups["slow"]["max_concurrency"], 3)
        self.assertEqual(ups["slow"]["queue_max"], 5)
        self.assertIsNone(ups["fast"]["max_concurrency"])
        self.assertEqual(ups["fast"]["in_flight"], 0)
        self.assertTrue(ups["fast"]["reachable"])
        self.assertGreaterEqual(ups["fast"]["pool"]["reused"], 1, "keep-alive pool reused")

        # a running stream shows as in flight on its upstream
        done = threading.Event()

        def stream():
            rh.send(self.tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "40"), ("x-sim-itl-ms", "20")])
            done.set()

        # pin the stream to "slow" through weights: 0 for fast
        r = admin_req(self.admin, "POST", "/routes/weights", json.dumps({"route": "chat", "weights": {"fast": 0}}),
                      TOKEN)
        self.assertEqual(r.status, 200)
        t = threading.Thread(target=stream, daemon=True)
        t.start()
        seen = harness.wait_until(
            lambda: {u["name"]: u for u in admin_req(self.admin, "GET", "/upstreams").json()["upstreams"]}["slow"][
                "in_flight"] == 1, 3.0, 0.02)
        self.assertTrue(seen, "the running stream shows in flight")
        t.join(10)
        self.assertTrue(done.is_set())

    def test_metrics_gauge_in_flight_and_queued(self):
        """/metrics says how many requests run on and wait for each upstream
        now: one stream held on "slow" (max_concurrency 3) shows as 1 in
        flight; four more fill its 3 slots and queue the rest."""
        def gauges():
            r = admin_req(self.admin, "GET", "/metrics")
            self.assertEqual(r.status, 200)
            text = r.body.decode()
            out = {}
            for line in text.splitlines():
                m = re.match(r'^(tokentap_in_flight|tokentap_queued)\{upstream="([^"]*)"\} (\d+)$', line)
                if m:
                    out[(m.group(1), m.group(2))] = int(m.group(3))
            return text, out

        text, g = gauges()
        self.assertIn("# TYPE tokentap_in_flight gauge\n", text)
        self.assertIn("# TYPE tokentap_queued gauge\n", text)
        self.assertEqual(g, {("tokentap_in_flight", "fast"): 0, ("tokentap_queued", "fast"): 0,
                             ("tokentap_in_flight", "slow"): 0, ("tokentap_queued", "slow"): 0})
        r = admin_req(self.admin, "POST", "/routes/weights", json.dumps({"route": "chat", "weights": {"fast": 0}}),
                      TOKEN)
        self.assertEqual(r.status, 200)

        def stream():
            rh.send(self.tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "60"), ("x-sim-itl-ms", "30")],
                    timeout=20.0)

        threads = [threading.Thread(target=stream, daemon=True)]
        threads[0].start()
        self.assertTrue(harness.wait_until(lambda: gauges()[1][("tokentap_in_flight", "slow")] == 1, 3.0, 0.02),
                        gauges()[1])
        self.assertEqual(gauges()[1][("tokentap_queued", "slow")], 0)
        for _ in range(4):
            threads.append(threading.Thread(target=stream, daemon=True))
            threads[-1].start()
        self.assertTrue(harness.wait_until(lambda: gauges()[1][("tokentap_queued", "slow")] >= 1, 3.0, 0.02),
                        gauges()[1])
        g = gauges()[1]
        self.assertEqual(g[("tokentap_in_flight", "slow")], 3)
        self.assertEqual(g[("tokentap_in_flight", "fast")], 0)
        for t in threads:
            t.join(20)
        self.assertTrue(harness.wait_until(
            lambda: gauges()[1][("tokentap_in_flight", "slow")] + gauges()[1][("tokentap_queued", "slow")] == 0,
            3.0, 0.05))

    def test_stats_answers_repeat_the_labels(self):
        self.served(8)

        def labelled():
            doc = admin_req(self.admin, "GET", "/stats?window=5m").json()
            return {s["upstream"]: s.get("labels") for s in doc["series"]} if len(doc["series"]) == 2 else None

        got = harness.wait_until(labelled, 5.0, 0.1)
        self.assertEqual(got, {"fast": {"runtime": "sim-fast", "hardware": "cpu"}, "slow": {}})
        curve = admin_req(self.admin, "GET", "/stats/curve?window=5m&upstream=fast").json()
        self.assertEqual(curve["series"][0]["labels"], {"runtime": "sim-fast", "hardware": "cpu"})

    def test_stats_labels_follow_a_reload(self):
        """The admin thread keeps the upstreams' labels itself (no worker is
        asked per read); a reload that changes them shows in /stats and
        /compare at once."""
        self.served(8)
        self.assertTrue(harness.wait_until(
            lambda: len(admin_req(self.admin, "GET", "/stats?window=5m").json()["series"]) == 2, 5.0, 0.1))
        body = self.tt.body.replace("runtime: sim-fast", "runtime: sim-fast-2")
        self.assertNotEqual(body, self.tt.body)
        self.assertTrue(self.tt.reload(body))
        doc = admin_req(self.admin, "GET", "/stats?window=5m").json()
        self.assertEqual({s["upstream"]: s["labels"] for s in doc["series"]},
                         {"fast": {"runtime": "sim-fast-2", "hardware": "cpu"}, "slow": {}})
        doc = admin_req(self.admin, "GET", "/compare?route=chat&window=5m&cold=include").json()
        self.assertEqual({u["upstream"]: u["labels"] for u in doc["upstreams"]},
                         {"fast": {"runtime": "sim-fast-2", "hardware": "cpu"}, "slow": {}})

    def test_weights_change_the_split_at_once(self):
        self.assertEqual(self.served(8).count("fast"), 6)
        r = admin_req(self.admin, "POST", "/routes/weights",
                      json.dumps({"route": "chat", "weights": {"fast": 1, "slow": 1}}), TOKEN)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual([t["weight"] for t in r.json()["targets"]], [1, 1])
        got = self.served(10)
        self.assertEqual(got.count("fast"), 5)
        self.assertEqual(got.count("slow"), 5)
        r = admin_req(self.admin, "GET", "/routes")
        self.assertEqual([t["weight"] for t in r.json()["routes"][0]["targets"]], [1, 1])

    def test_weight_changes_are_guarded_and_validated(self):
        body = json.dumps({"route": "chat", "weights": {"fast": 0, "slow": 5}})
        self.assertEqual(admin_req(self.admin, "POST", "/routes/weights", body).status, 401)
        self.assertEqual(admin_req(self.admin, "POST", "/routes/weights", body, "wrong").status, 401)
        self.assertEqual(admin_req(self.admin, "GET", "/routes/weights").status, 405)
        cases = [
            ("not json", 400),
            (json.dumps({"weights": {"fast": 1}}), 400),
            (json.dumps({"route": "nope", "weights": {"fast": 1}}), 404),
            (json.dumps({"route": "chat", "weights": {"ghost": 1}}), 400),
            (json.dumps({"route": "chat", "weights": {"fast": -1}}), 400),
            (json.dumps({"route": "chat", "weights": {"fast": 0, "slow": 0}}), 400),
        ]
        for text, status in cases:
            r = admin_req(self.admin, "POST", "/routes/weights", text, TOKEN)
            self.assertEqual(r.status, status, text)
            self.assertIn("message", r.json()["error"])
        # nothing changed
        r = admin_req(self.admin, "GET", "/routes")
        self.assertEqual([t["weight"] for t in r.json()["routes"][0]["targets"]], [3, 1])

    def test_a_reload_restores_the_file_weights(self):
        r = admin_req(self.admin, "POST", "/routes/weights", json.dumps({"route": "chat", "weights": {"slow": 9}}),
                      TOKEN)
        self.assertEqual(r.status, 200)
        self.assertTrue(self.tt.reload(self.tt.body))
        doc = admin_req(self.admin, "GET", "/routes").json()
        self.assertEqual(doc["generation"], 2)
        self.assertEqual([t["weight"] for t in doc["routes"][0]["targets"]], [3, 1])
        # a change meant for the generation a reload replaced changes nothing
        # (what tokentap's own undo of a timed-out change relies on)
        r = admin_req(self.admin, "POST", "/routes/weights",
                      json.dumps({"route": "chat", "weights": {"slow": 9}, "generation": 1}), TOKEN)
        self.assertEqual(r.status, 409, r.body)
        doc = admin_req(self.admin, "GET", "/routes").json()
        self.assertEqual([t["weight"] for t in doc["routes"][0]["targets"]], [3, 1])
        r = admin_req(self.admin, "POST", "/routes/weights",
                      json.dumps({"route": "chat", "weights": {"slow": 9}, "generation": 2}), TOKEN)
        self.assertEqual(r.status, 200, r.body)


if __name__ == "__main__":
    unittest.main()
