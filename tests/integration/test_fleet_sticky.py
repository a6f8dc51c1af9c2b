"""test_fleet_sticky.py — two tokentaps with the same configuration send a
sticky key to the same upstream (docs/fleet.md, "What must match").

A fleet behind a round-robin balancer keeps a conversation on its server
only if every instance maps its session key to the same upstream. Three
simulators (each with its own --model, which tells who served an answer)
are shared by two tokentap instances: the first with the configuration as
written and two workers, the second with the same upstream names, urls and
weights but the upstreams and the split targets listed in another order,
and one worker. Two routes: sticky by header (x-session-id) and sticky by
the JSON field `user`. For 60 keys of each, each instance serves every key
twice (the second time on a new connection); every answer for a key comes
from one upstream, the same on both instances, and the keys use all three
upstreams (weights 1, 1, 2).

Also: an instance whose split gives one of the upstreams another weight
moves some keys (the weights are part of what must match) — a check that the
comparison above could fail.
"""

import unittest

import harness
import routing_helpers as rh

KEYS = 60


def who(resp):
    m = rh.served_by(resp)
    return m[4:] if m and m.startswith("sim-") else m


def config(sims, order, weights):
    ups = rh.upstreams_yaml({n: sims[n].url for n in order})
    split = "".join("      - {upstream: %s, weight: %d}\n" % (n, weights[n]) for n in order)
    return ups + ("routes:\n"
                  "  - name: by-header\n"
                  "    match: {host: header.test}\n"
                  "    split:\n" + split + "    sticky: {header: x-session-id}\n"
                  "  - name: by-user\n"
                  "    match: {host: user.test}\n"
                  "    split:\n" + split + "    sticky: {json_field: user}\n")


class FleetStickyTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sims = {}
        for name in ("a", "b", "c"):
            cls.sims[name] = harness.start_sim(cls, "--ttft-ms", 0, "--itl-ms", 0, "--tokens", 2, "--model",
                                               "sim-" + name)

    def choices(self, tt, route):
        """{key: upstream} as instance `tt` routes each key, asked twice."""
        out = {}
        for i in range(KEYS):
            key = "session-%d" % i
            seen = set()
            for _ in range(2):
                if route == "header":
                    resp = rh.send(tt.port, rh.chat(), [("x-session-id", key)], host="header.test")
                else:
                    resp = rh.send(tt.port, rh.chat(user=key), host="user.test")
                self.assertIsNotNone(who(resp), "%s %s: %r" % (route, key, resp and resp.status))
                seen.add(who(resp))
            self.assertEqual(len(seen), 1, "%s: key %s went to %r on one instance" % (route, key, seen))
            out[key] = seen.pop()
        return out

    def test_same_configuration_same_upstream(self):
        weights = {"a": 1, "b": 1, "c": 2}
        one = rh.start_conf(self, config(self.sims, ["a", "b", "c"], weights), "--workers", 2)
        two = rh.start_conf(self, config(self.sims, ["c", "a", "b"], weights), "--workers", 1)
        for route in ("header", "user"):
            with self.subTest(route=route):
                first, second = self.choices(one, route), self.choices(two, route)
                differ = {k: (first[k], second[k]) for k in first if first[k] != second[k]}
                self.assertEqual(differ, {}, "keys routed differently by the two instances")
                self.assertEqual(set(first.values()), {"a", "b", "c"}, "keys do not spread over the upstreams")

    def test_other_weights_move_keys(self):
        one = rh.start_conf(self, config(self.sims, ["a", "b", "c"], {"a": 1, "b": 1, "c": 2}))
        two = rh.start_conf(self, config(self.sims, ["a", "b", "c"], {"a": 1, "b": 1, "c": 8}))
        first, second = self.choices(one, "header"), self.choices(two, "header")
        moved = [k for k in first if first[k] != second[k]]
        self.assertGreater(len(moved), 0)
        # rendezvous hashing: a key only moves to the upstream whose weight grew
        self.assertTrue(all(second[k] == "c" for k in moved), {k: (first[k], second[k]) for k in moved})


if __name__ == "__main__":
    unittest.main()
