"""test_instr.py — contrib/lab/instr.py, the instruction count per event
under callgrind, run small: scenario (c) through tokentap alone, windows of
4 and 8 requests of 512 tokens. Its figures must hold together: the events
between the windows are the 2,048 the bench received, the groups (self cost
per function, grouped by file and object) add up to the thread's total as
callgrind counted it within 1 %, and the measuring, the forwarding and libc
each cost something per event.

valgrind missing is a failure with a message, not a skip: contrib/setup.sh
installs it. A sanitizer build is skipped: valgrind cannot run a binary
built with AddressSanitizer."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "contrib", "lab", "instr.py")
RUN_TIMEOUT_S = 100
TOKENS = 512  # scenario (c)'s output length


class InstrSmoke(unittest.TestCase):
    def run_instr(self, *extra):
        """instr.py's JSON report and its printed table for (c), small."""
        build = os.path.dirname(os.path.abspath(harness.tokentap_bin()))
        work = tempfile.mkdtemp(prefix="tokentap-instr-it-")
        self.addCleanup(shutil.rmtree, work, True)
        out = os.path.join(work, "instr.json")
        r = subprocess.run([sys.executable, SCRIPT, "--build", build, "--scenarios", "c", "--events", "2048",
                            "--no-haproxy", "--no-install", "--json", out] + list(extra), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=RUN_TIMEOUT_S,
                           start_new_session=True)
        self.assertEqual(r.returncode, 0, "instr.py failed:\n%s\n%s" % (r.stdout, r.stderr[-3000:]))
        with open(out) as f:
            return json.load(f), r.stdout

    def test_api_shape(self):
        """--api asks the bench (and so the simulator) for another API's
        events: the Responses API's, counted as chat's are."""
        if harness.is_sanitized():
            self.skipTest("valgrind cannot run an AddressSanitizer build")
        if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
            self.fail("valgrind is not installed: run contrib/setup.sh (it installs Debian's valgrind package)")
        rep, stdout = self.run_instr("--api", "openai-responses")
        tt = rep["scenarios"]["c"]["tokentap"]
        self.assertEqual(tt["api"], "openai-responses")
        self.assertEqual(tt["events"], 4 * TOKENS)
        self.assertGreater(tt["groups"]["measuring"], 0)
        self.assertIn("openai-responses", stdout)

    def test_groups_add_up(self):
        if harness.is_sanitized():
            self.skipTest("valgrind cannot run an AddressSanitizer build")
        if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
            self.fail("valgrind is not installed: run contrib/setup.sh (it installs Debian's valgrind package)")
        build = os.path.dirname(os.path.abspath(harness.tokentap_bin()))
        work = tempfile.mkdtemp(prefix="tokentap-instr-it-")
        self.addCleanup(shutil.rmtree, work, True)
        out = os.path.join(work, "instr.json")
        r = subprocess.run([sys.executable, SCRIPT, "--build", build, "--scenarios", "c", "--events", "2048",
                            "--no-haproxy", "--no-install", "--json", out], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=RUN_TIMEOUT_S,
                           start_new_session=True)
        self.assertEqual(r.returncode, 0, "instr.py failed:\n%s\n%s" % (r.stdout, r.stderr[-3000:]))
        with open(out) as f:
            rep = json.load(f)
        tt = rep["scenarios"]["c"]["tokentap"]
        self.assertEqual(tt["window_requests"], [4, 8])
        self.assertEqual(tt["events"], 4 * TOKENS)
        total, groups = tt["total"], tt["groups"]
        self.assertGreater(total, 0)
        self.assertLess(abs(sum(groups.values()) - total), 0.01 * total, "groups %r, total %r" % (groups, total))
        # each window's functions land in their groups: the two big ones
        # are never near zero. libc is left out: with same-shape events it
        # is a few memcmp calls an event, and a stats flush landing in one
        # window and not the other can move it below zero in so short a run
        for g in ("measuring", "forwarding"):
            self.assertGreater(groups[g], 0, "%s: %r" % (g, groups))
        self.assertGreater(groups["measuring"] + groups["forwarding"], 0.5 * total, groups)
        # the table printed is the JSON's: the total's line names the same figure
        self.assertIn("{:,.0f}".format(total), r.stdout)


if __name__ == "__main__":
    unittest.main()
