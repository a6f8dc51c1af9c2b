"""GET /compare over real traffic: a 90/10 split between a fast and a slow
simulator is reported as different (the slower one slower, significantly),
a 50/50 split between two identical simulators as not different, and the
answer carries each upstream's labels and the traffic-comparability check."""

import concurrent.futures
import unittest

import harness
import routing_helpers as rh

REQUESTS = 2000


def drive(port, n, workers=4):
    """n short streamed chats through the proxy, a few at a time."""
    body = rh.chat(stream=True, stream_options={"include_usage": True})

    def one(_):
        resp = rh.send(port, body, headers=[("x-sim-tokens", "4")])
        return resp.status

    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        statuses = list(ex.map(one, range(n)))
    return statuses


class CompareTest(harness.TestCase):
    def start(self, sims, weights):
        # one worker: the exact 9:1 counts below are one split sequence's
        # (each worker keeps its own, docs/config.md "Workers")
        extra = {name: ["labels: {runtime: %s-runtime}" % name] for name in sims}
        return rh.start_split(self, {k: v.url for k, v in sims.items()}, weights, extra)

    def test_slower_upstream_is_reported_slower(self):
        sims = {
            "fast": harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "2"),
            "slow": harness.start_sim(self, "--ttft-ms", "15", "--itl-ms", "6"),
        }
        tt, admin = self.start(sims, {"fast": 9, "slow": 1})
        statuses = drive(tt.port, REQUESTS)
        self.assertEqual(statuses.count(200), REQUESTS)
        doc = rh.compare_flushed(self, admin, REQUESTS)
        ups = {u["upstream"]: u for u in doc["upstreams"]}
        self.assertEqual(ups["fast"]["requests"], REQUESTS * 9 // 10)
        self.assertEqual(ups["slow"]["requests"], REQUESTS // 10)
        self.assertEqual(ups["slow"]["labels"], {"runtime": "slow-runtime"})
        self.assertEqual(doc["baseline"], "fast")
        (diff,) = doc["differences"]
        self.assertEqual(diff["upstream"], "slow")
        for metric in ("ttft", "tpot", "e2e", "itl"):
            m = diff["metrics"][metric]
            self.assertTrue(m["significant"], "%s: %r" % (metric, m))
            self.assertEqual(m["verdict"], "slower", metric)
            self.assertGreater(m["p50_diff_ms"], 0, metric)
            self.assertLess(m["p_value"], 0.01, metric)
        self.assertAlmostEqual(diff["metrics"]["ttft"]["p50_diff_ms"], 10.0, delta=3.0)
        # a tenth of the traffic: a ninth of the baseline's throughput, the
        # differences matching the per-upstream rates
        tp = diff["throughput"]
        for key in ("requests_per_s", "input_tokens_per_s", "output_tokens_per_s"):
            self.assertAlmostEqual(tp[key]["diff"], ups["slow"][key] - ups["fast"][key], places=6, msg=key)
        self.assertAlmostEqual(tp["requests_per_s"]["ratio"], 1 / 9, delta=0.001)
        self.assertAlmostEqual(tp["output_tokens_per_s"]["ratio"], 1 / 9, delta=0.001)
        # no errors and every request within the SLO on both: nothing to tell apart
        for key in ("error_rate", "goodput_ratio"):
            self.assertEqual(diff[key], {"diff": 0.0, "z": 0.0, "p_value": 1.0, "significant": False}, key)
        self.assertIn("two-proportion", doc["test"])
        # same client, same prompts: the prompt-length mix is comparable
        self.assertTrue(diff["traffic"]["input_tokens"]["comparable"], diff["traffic"])
        # the slower upstream holds its requests longer, so they meet more
        # requests in flight there (Little's law): reported, not hidden
        self.assertIsNotNone(diff["traffic"]["concurrency"]["ks_distance"])

    def test_identical_upstreams_are_not_different(self):
        # long enough that the scheduling jitter of a shared machine (well
        # under a millisecond) stays below the 1 % the verdict allows
        sims = {
            "one": harness.start_sim(self, "--ttft-ms", "60", "--itl-ms", "20"),
            "two": harness.start_sim(self, "--ttft-ms", "60", "--itl-ms", "20"),
        }
        tt, admin = self.start(sims, {"one": 1, "two": 1})
        drive(tt.port, 600, workers=12)
        doc = rh.compare_flushed(self, admin, 600)
        (diff,) = doc["differences"]
        for metric in ("ttft", "tpot", "e2e"):
            m = diff["metrics"][metric]
            self.assertFalse(m["significant"], "%s: %r" % (metric, m))
            self.assertEqual(m["verdict"], "no difference", metric)
            self.assertAlmostEqual(m["p50_ratio"], 1.0, delta=0.05)
        for key in ("error_rate", "goodput_ratio"):
            self.assertFalse(diff[key]["significant"], "%s: %r" % (key, diff[key]))
            self.assertGreater(diff[key]["p_value"], 0.01, key)
        self.assertAlmostEqual(diff["throughput"]["requests_per_s"]["ratio"], 1.0, delta=0.05)

    def test_error_rate_and_goodput_differences_are_tested(self):
        """Half the requests go to an upstream that refuses connections,
        on a route without failover: each is an error and misses the SLO,
        and the two-proportion tests call both differences significant."""
        live = harness.start_sim(self, "--ttft-ms", "2", "--itl-ms", "1")
        urls = {"live": live.url, "dead": "http://127.0.0.1:%d" % harness.free_port()}
        # ejection off: the dead one keeps its half of the split, every one an error
        tt, admin = rh.start_split(self, urls, {"live": 1, "dead": 1}, extra={"dead": ["eject: {after: 0}"]},
                                   route_opts=["failover: false"])
        statuses = drive(tt.port, 200)
        self.assertEqual(statuses.count(200), 100)
        doc = rh.compare_flushed(self, admin, 200)
        (diff,) = doc["differences"]
        dead_is_base = doc["baseline"] == "dead"
        er, gp = diff["error_rate"], diff["goodput_ratio"]
        self.assertTrue(er["significant"], er)
        self.assertTrue(gp["significant"], gp)
        self.assertLess(er["p_value"], 0.01)
        self.assertAlmostEqual(er["diff"], -1.0 if dead_is_base else 1.0)
        self.assertAlmostEqual(gp["diff"], 1.0 if dead_is_base else -1.0)
        self.assertEqual(diff["error_rate_diff"], er["diff"])

    def test_load_dependent_assignment_is_said(self):
        """Under balance: least_request the answer says that assignment
        depended on load, marks each difference not causal, points to the
        paired comparison and compares ttft at equal load; under weights the
        same route's verdicts stay causal."""
        for balance, kind in (("least_request", "load_dependent"), ("weighted", "load_independent")):
            with self.subTest(balance=balance):
                sims = {
                    "fast": harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "1"),
                    "slow": harness.start_sim(self, "--ttft-ms", "20", "--itl-ms", "1"),
                }
                tt, admin = rh.start_split(self, {k: v.url for k, v in sims.items()}, {"fast": 1, "slow": 1},
                                           route_opts=["balance: %s" % balance])
                self.assertEqual(drive(tt.port, 200).count(200), 200)
                doc = rh.compare_flushed(self, admin, 200)
                self.assertEqual(doc["balance"], balance)
                self.assertEqual(doc["assignment"], kind)
                (diff,) = doc["differences"]
                self.assertEqual(diff["causal"], balance == "weighted")
                if balance == "weighted":
                    self.assertNotIn("not valid", doc["assignment_note"])
                    continue
                self.assertIn("not valid as a causal comparison", doc["assignment_note"])
                self.assertIn("mirror", doc["assignment_note"])
                self.assertIn("`paired`", doc["assignment_note"])
                # the hour's slices keep the load curve: ttft at the
                # in-flight levels both upstreams were seen at
                r, _ = harness.exchange(admin, "GET", "/compare?route=chat&window=1h&cold=include")
                self.assertEqual(r.status, 200)
                (diff,) = r.json()["differences"]
                levels = diff["equal_load"]
                self.assertTrue(levels, diff)
                for lvl in levels:
                    self.assertGreaterEqual(lvl["requests"], 10, lvl)
                    self.assertGreaterEqual(lvl["baseline_requests"], 10, lvl)
                    self.assertLessEqual(lvl["inflight_low"], lvl["inflight_high"] or lvl["inflight_low"])
                # slow is 15 ms slower to a first token at any load
                self.assertTrue(any(lvl["verdict"] in ("slower", "faster") for lvl in levels), levels)
                who_slow = diff["upstream"] == "slow"
                for lvl in levels:
                    if lvl["verdict"] != "no difference":
                        self.assertEqual(lvl["verdict"], "slower" if who_slow else "faster", lvl)

    def test_reload_changes_what_compare_says(self):
        """The policy /compare reports is the configuration in force: a
        reload from least_request to weighted makes the same route's
        differences causal again, without restarting."""
        sims = {"a": harness.start_sim(self, "--ttft-ms", "2"), "b": harness.start_sim(self, "--ttft-ms", "2")}
        tt, admin = rh.start_split(self, {k: v.url for k, v in sims.items()}, {"a": 1, "b": 1},
                                   route_opts=["balance: least_request"])
        self.assertEqual(drive(tt.port, 40).count(200), 40)
        doc = rh.compare_flushed(self, admin, 40)
        self.assertEqual((doc["balance"], doc["assignment"]), ("least_request", "load_dependent"))
        self.assertTrue(tt.reload(tt.body.replace("balance: least_request", "balance: weighted")))
        doc = rh.compare_flushed(self, admin, 40)
        self.assertEqual((doc["balance"], doc["assignment"]), ("weighted", "load_independent"))
        self.assertTrue(all(d["causal"] for d in doc["differences"]), doc["differences"])
        # a route the configuration no longer has: not known how it assigned
        r, _ = harness.exchange(admin, "GET", "/compare?route=gone")
        self.assertEqual((r.json()["balance"], r.json()["assignment"]), (None, "unknown"))

    def test_bad_parameters(self):
        sims = {"only": harness.start_sim(self)}
        tt, admin = self.start(sims, {"only": 1})
        for path, param in (("/compare", "route"), ("/compare?route=chat&window=2h", "window"),
                            ("/compare?route=chat&cold=maybe", "cold"), ("/compare?route=chat&bogus=1", "bogus")):
            r, _ = harness.exchange(admin, "GET", path)
            self.assertEqual(r.status, 400, path)
            self.assertIn(param, r.json()["error"]["message"], path)
        r, _ = harness.exchange(admin, "GET", "/compare?route=nosuch")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["upstreams"], [])


if __name__ == "__main__":
    unittest.main()
