"""test_routing_bench.py — contrib/lab/routing.py, the routing benchmark,
runs end to end so that it cannot rot: --quick, scenario (p) for 3 s, with
tokentap's weighted split and one peer (nginx least_conn, else HAProxy
leastconn, whichever is installed; with neither, tokentap alone: the script
is never allowed to install here). Each target's run must have served
requests without errors, through all four replicas, with the replicas'
prefix caches hit (the chat workload shares its system prompts), no
ttft p99 under the floor the workload's cold first turns put under every
placement, and the report must hold the medians, the rounds and the
checks."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "contrib", "lab", "routing.py")


def installed(prog):
    return shutil.which(prog) or os.access("/usr/sbin/" + prog, os.X_OK)


class RoutingBenchSmoke(harness.TestCase):
    def test_quick_weighted_and_a_peer(self):
        build = os.path.dirname(os.path.abspath(harness.tokentap_bin()))
        for rel in ("contrib/sim/tokentap-sim", "contrib/bench/tokentap-bench"):
            if not os.access(os.path.join(build, rel), os.X_OK):
                self.skipTest("routing.py needs a build directory's layout; %s/%s is missing" % (build, rel))
        peer = ("nginx-least_conn" if installed("nginx") else "haproxy-leastconn" if installed("haproxy")
                else None)
        targets = ["tokentap-weighted"] + ([peer] if peer else [])
        d = tempfile.mkdtemp(prefix="tokentap-routing-it-")
        self.addCleanup(shutil.rmtree, d, True)
        out = os.path.join(d, "report.json")
        p = subprocess.run([sys.executable, SCRIPT, "--quick", "--no-install", "--build", build, "--scenarios", "p",
                            "--duration", "3", "--targets", ",".join(targets), "--json", out],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=90, start_new_session=True)
        self.assertEqual(p.returncode, 0, "routing.py exited %d:\n%s\n%s" % (p.returncode, p.stderr[-3000:],
                                                                           p.stdout[-2000:]))
        with open(out) as f:
            report = json.load(f)
        got = report["scenarios"]["p"]["targets"]
        self.assertEqual(sorted(got), sorted(targets))
        for name in targets:
            r = got[name]["rounds"][0]
            self.assertGreater(r["ok"], 10, (name, r))
            self.assertEqual(r["errors"], 0, (name, r))
            self.assertEqual(len(r["share"]), 4)
            self.assertTrue(all(n > 0 for n in r["share"]), "every replica answered: %r" % r["share"])
            self.assertGreater(r["hit_ratio"], 0, "the shared system prompts are cached")
            self.assertLess(r["hit_ratio"], 1)
            self.assertIsNotNone(r["ttft_p99"])
            self.assertGreaterEqual(r["ttft_p99"], r["ttft_p50"])
            self.assertGreater(r["goodput"], 0)
            # the floor is a bound from the workload alone: no run may beat it
            self.assertGreaterEqual(r["cold"], 0)
            self.assertGreaterEqual(r["ttft_p99_floor"], 0)
            self.assertGreaterEqual(r["ttft_p99"], r["ttft_p99_floor"], (name, r))
            self.assertLessEqual(r["goodput"], r["goodput_ceiling"], (name, r))
            self.assertEqual(got[name]["median"]["ttft_p50"], r["ttft_p50"], "one round: its own median")
            self.assertIn(name, p.stdout)
        self.assertTrue(any(c.startswith("(p) prefix hit ratio") for c in report["checks"]), report["checks"])


if __name__ == "__main__":
    unittest.main()
