"""test_lab.py — the lab scripts in contrib/lab/ run end to end, small, so
that they cannot rot: ab.py (which drives proxies.py's scenarios, runs and
percentiles) with this build against itself for one round of scenario (c),
late_gaps.py for one round of 20 requests, direct and through tokentap,
same_output.py comparing this build with itself, sim_same_output.py
comparing this build's simulator with itself (--quick) and with the same
simulator on another seed, which it must report as different, and
model_cap_mem.py for 1 and 8 models, and syscalls.py counting scenario (l)'s
system calls.
routing.py and instr.py have smoke tests of their own (test_routing_bench,
test_instr). Neither script here may install anything (nginx and HAProxy are
not asked for). Each must exit 0 and print, per target, figures that show
traffic went through it."""

import os
import re
import shutil
import subprocess
import sys
import unittest

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB = os.path.join(ROOT, "contrib", "lab")
RUN_TIMEOUT_S = 240


class LabSmoke(harness.TestCase):
    def setUp(self):
        self.build = os.path.dirname(os.path.abspath(harness.tokentap_bin()))
        for rel in ("contrib/sim/tokentap-sim", "contrib/bench/tokentap-bench"):
            if not os.access(os.path.join(self.build, rel), os.X_OK):
                self.skipTest("the lab scripts need a build directory's layout; %s/%s is missing" % (self.build, rel))

    def run_script(self, *args):
        p = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        return p.stdout + p.stderr

    def test_ab_one_round_against_itself(self):
        tt = harness.tokentap_bin()
        out = self.run_script(os.path.join(LAB, "ab.py"), tt, "--build", self.build, "--rounds", "1",
                              "--scenarios", "c")
        # the summary table: one row per target, events/s last but one
        # (direct has no cpu column)
        rows = {m.group(1): m.group(2) for m in re.finditer(r"^(direct|old|new) +([0-9. -]+)$", out, re.M)}
        self.assertEqual(set(rows), {"direct", "old", "new"}, out[-2000:])
        for name, cells in rows.items():
            nums = [float(c) for c in cells.split() if c != "-"]
            events_s = nums[3]
            self.assertGreater(events_s, 1000, (name, cells))
            if name != "direct":
                self.assertGreater(nums[4], 0, "%s: cpu s per M events" % name)

    def test_late_gaps_one_round(self):
        out = self.run_script(os.path.join(LAB, "late_gaps.py"), "--build", self.build, "--targets",
                              "direct,tokentap", "--rounds", "1", "--requests", "20")
        for target in ("direct", "tokentap"):
            m = re.search(r"^round 1 %s +(\d+) gaps" % target, out, re.M)
            self.assertIsNotNone(m, "%s: no round line\n%s" % (target, out[-2000:]))
            self.assertGreater(int(m.group(1)), 0, target)
        self.assertRegex(out, r"late gaps per 1,000, rounds \(median\):")

    def test_same_output_of_a_build_and_itself(self):
        out = self.run_script(os.path.join(LAB, "same_output.py"), self.build, self.build)
        m = re.search(r"same_output: (\d+) access-log lines, (\d+) /metrics lines compared, times masked: the same",
                      out)
        self.assertIsNotNone(m, out[-2000:])
        self.assertEqual(int(m.group(1)), 21, "7 requests, 3 rounds: each logged")
        self.assertGreater(int(m.group(2)), 100)

    def test_model_cap_mem_small(self):
        out = self.run_script(os.path.join(LAB, "model_cap_mem.py"), "--build", self.build, "--models", "1,8")
        rows = {int(m.group(1)): m.groups() for m in re.finditer(r"^ +(\d+) +(\d+) +(\d+) +(\d+) +(\d+) +(\S+) +(\S+)$",
                                                               out, re.M)}
        self.assertEqual(set(rows), {1, 8}, out[-2000:])
        self.assertGreater(int(rows[8][1]), int(rows[1][1]), "RSS grows with the models tracked")
        self.assertGreater(float(rows[8][5]), 0, "RSS per model")

    def test_syscalls_per_new_connection(self):
        self.assertTrue(shutil.which("strace"), "strace is missing: contrib/setup.sh installs it")
        out = self.run_script(os.path.join(LAB, "syscalls.py"), "--build", self.build, "--scenarios", "l",
                              "--requests", "128", "--no-haproxy")
        per = {m.group(1): float(m.group(2)) for m in re.finditer(r"^  (\w+) +([0-9.]+)$", out, re.M)}
        # a new connection per request: one accept each, and the request
        # read from the client and the answer from the upstream
        self.assertGreaterEqual(per.get("accept4", 0), 0.9, out[-2000:])
        self.assertGreaterEqual(per.get("recvmsg", 0), 1.9, out[-2000:])
        self.assertGreater(per.get("all", 0), per["accept4"] + per["recvmsg"], out[-2000:])

    def test_sim_same_output(self):
        sim = os.path.join(self.build, "contrib", "sim", "tokentap-sim")
        script = os.path.join(LAB, "sim_same_output.py")
        out = self.run_script(script, sim, sim, "--quick")
        m = re.search(r"sim_same_output: (\d+) responses compared, (\d+) byte for byte, 0 with timing masked: "
                      r"the same", out)
        self.assertIsNotNone(m, out[-2000:])
        self.assertGreater(int(m.group(1)), 150)
        self.assertEqual(m.group(1), m.group(2))
        # the same binary on another seed: other words and ids, which the
        # comparison must catch (a later --seed overrides the script's)
        other = harness.temp_path(self, suffix=".sh")
        with open(other, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "$@" --seed 99\n' % sim)
        os.chmod(other, 0o755)
        p = subprocess.run([sys.executable, script, sim, other, "--quick"], capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
        self.assertEqual(p.returncode, 1, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertRegex(p.stdout, r"sim_same_output: \d+ of \d+ responses differ")
        self.assertRegex(p.stdout, r"fixed chat-b\.plain /v1/chat/completions: differ at byte \d+")


if __name__ == "__main__":
    unittest.main()
