"""test_input_bounds.py — numbers an operator writes, bounded with a clear
error: every duration, on the command line, in the file's settings and in
an upstream's own timeouts, is at most 87600h (10 years), so that
`slo.ttft: 99999999999h` no longer wraps; a replay trace whose arrivals
would take longer than that (a timestamp near 2^62 ms) is refused instead
of waited for, and hash_ids that are not whole numbers are refused instead
of read as 0; a good trace still replays against the simulator."""

import os
import shutil
import subprocess
import tempfile
import unittest

import harness
import routing_helpers as rh

BASE = "listen: 127.0.0.1:0\nstore: {dir: \"off\"}\nadmin: {listen: \"off\"}\n"
UPSTREAM = "upstreams:\n  - name: a\n    url: http://127.0.0.1:9\n"


class DurationBound(harness.TestCase):
    def test_durations_at_most_ten_years(self):
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
                             "--slo-ttft", "99999999999h"], timeout=5)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--slo-ttft", r.stderr)
        self.assertIn("at most 87600h", r.stderr)
        for text, key in ((BASE + "slo: {ttft: 99999999999h}\n" + UPSTREAM, "slo.ttft"),
                          (BASE + "timeouts: {idle: 87601h}\n" + UPSTREAM, "timeouts.idle"),
                          (BASE + "store: {dir: \"off\", hour_retention: 999999999999h}\n" + UPSTREAM,
                           "store.hour_retention"),
                          (BASE + UPSTREAM + "    timeouts: {first_byte: 99999999999h}\n", "first_byte"),
                          (BASE + UPSTREAM + "    queue: {max: 4, timeout: 315360001s}\n", "timeout")):
            with self.subTest(key=key):
                text = text.replace("store: {dir: \"off\"}\nadmin", "admin") if "hour_retention" in text else text
                res, name = rh.check_config(text)
                self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
                self.assertIn(key, res.stderr)
                self.assertIn("87600h", res.stderr)
        res, _ = rh.check_config(BASE + "slo: {ttft: 87600h}\ntimeouts: {idle: 87600h}\n" + UPSTREAM
                                 + "    timeouts: {first_byte: 315360000s}\n")
        self.assertEqual(res.returncode, 0, res.stderr)


class ReplayBounds(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-input-bounds-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def trace(self, lines):
        path = os.path.join(self.dir, "trace.jsonl")
        with open(path, "w") as f:
            f.write("".join(l + "\n" for l in lines))
        return path

    def bench(self, url, path, *extra, timeout=20):
        return subprocess.run([harness.bench_bin(), "--url", url, "--replay", path, "--no-progress"]
                              + [str(a) for a in extra], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)

    def test_far_timestamps_and_odd_ids_refused(self):
        sim = harness.start_sim(self, "--ttft-ms", 1, "--itl-ms", 1)
        first = '{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0]}'
        cases = [
            ([first, '{"timestamp": 4611686018427387000, "input_length": 8, "output_length": 2, "hash_ids": [1]}'],
             (), "line 2's timestamp 4611686018427387000"),
            ([first, '{"timestamp": 315360000001, "input_length": 8, "output_length": 2, "hash_ids": [1]}'],
             (), "the longest replay is 87600h"),
            # within the bound at --speed 1, past it at --speed 0.5
            ([first, '{"timestamp": 315360000000, "input_length": 8, "output_length": 2, "hash_ids": [1]}'],
             ("--speed", "0.5"), "at --speed 0.5"),
            ([first, '{"timestamp": 5, "input_length": 8, "output_length": 2, "hash_ids": [1, "2"]}'],
             (), "line 2: hash_ids[1] is not a whole number"),
            (['{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [0, 1.5]}'],
             (), "line 1: hash_ids[1]"),
            (['{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [-3]}'],
             (), "hash_ids[0]"),
            (['{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [null]}'],
             (), "hash_ids[0]"),
        ]
        for lines, extra, want in cases:
            with self.subTest(want=want):
                p = self.bench(sim.url, self.trace(lines), *extra, timeout=10)
                self.assertEqual(p.returncode, 2, p.stdout[-500:] + p.stderr[-500:])
                self.assertIn(want, p.stderr)
        self.assertEqual(harness.sim_stats(sim.port)["requests"], 0, "nothing was sent")
        # a good trace still replays: two requests, 5 ms apart
        p = self.bench(sim.url, self.trace([first, '{"timestamp": 5, "input_length": 8, "output_length": 2, '
                                                   '"hash_ids": [0, 1]}']), "--sim-headers")
        self.assertEqual(p.returncode, 0, p.stderr[-1000:])
        self.assertEqual(harness.sim_stats(sim.port)["requests"], 2)


if __name__ == "__main__":
    unittest.main()
