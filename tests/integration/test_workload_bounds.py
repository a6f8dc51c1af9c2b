"""test_workload_bounds.py — what the workload capture keeps of what it is
sent, over real sockets: GET /workload's (route, model) groups go to names
the upstream answered 2xx, so 63 junk names refused with 404 leave the real
model its own group; max_tokens is read as a JSON number (an integral value
in range recorded, anything else null); the hash → id table stops at
workload.max_hash_ids, a block met past it gets a new id each time, counted
in /workload and /metrics; no trace file grows past workload.max_size (a
file found at start counts with what it holds), a line that would not fit
in an empty file dropped and counted."""

import json
import os
import re
import shutil
import tempfile
import unittest

import harness
import routing_helpers as rh
from test_model_cap import model_upstream

CHAT = "/v1/chat/completions"


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path)
    assert resp.status == 200, (path, resp.status, resp.body)
    return resp.json()


class BoundsCase(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-wl-bounds-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.trace = os.path.join(self.dir, "trace.jsonl")

    def start(self, up, workload_extra=""):
        conf = (rh.upstreams_yaml({"up": up.url}) + "routes:\n  - name: main\n    upstream: up\n"
                + "admin: {listen: 127.0.0.1:0}\n"
                + "workload:\n  path: %s\n%s" % (self.trace, workload_extra))
        tt = rh.start_conf(self, conf, "--workers", "1")
        return tt, harness.admin_port(tt)

    def wait_lines(self, admin, n):
        """The trace's lines once the capture has handled `n` records."""
        ok = harness.wait_until(lambda: get_json(admin, "/workload")["records"] >= n, 10.0, 0.02)
        s = get_json(admin, "/workload")
        self.assertTrue(ok, s)
        self.assertEqual(s["records"], n, s)
        return read_jsonl(self.trace)


class JunkGroups(BoundsCase):
    def test_refused_names_take_no_group(self):
        up = model_upstream(self, {"real"})
        tt, admin = self.start(up)
        for i in range(63):
            self.assertEqual(rh.send(tt.port, rh.chat(model="junk-%d" % i)).status, 404)
        for _ in range(3):
            self.assertEqual(rh.send(tt.port, rh.chat(model="real")).status, 200)
        self.wait_lines(admin, 66)
        s = get_json(admin, "/workload?model=real")
        self.assertEqual((s["records"], s["window_records"]), (3, 3), s)
        whole = get_json(admin, "/workload")
        got = {e["model"]: e["records"] for e in whole["by_model"]}
        self.assertEqual(got, {"(other)": 63, "real": 3}, got)
        # the junk names are in the trace as sent: only the summary folds them
        models = [r["model"] for r in read_jsonl(self.trace)]
        self.assertEqual(models, ["junk-%d" % i for i in range(63)] + ["real"] * 3)


class MaxTokens(BoundsCase):
    CASES = [("256", 256), ("256.0", 256), ("1e3", 1000), ("2.5e2", 250), ("0", 0),
             ("1.5", None), ("-5", None), ("1e-3", None), ("1099511627777", 1099511627777),
             ("9007199254740991", 9007199254740991), ("9007199254740992", None),
             ("123456789012345678901234567890", None), ('"256"', None), ("null", None), ("true", None)]

    def test_read_as_a_json_number(self):
        up = model_upstream(self, {"m"})
        tt, admin = self.start(up)
        keys = ("max_tokens", "max_completion_tokens", "max_output_tokens")
        for key in keys:
            for text, _ in self.CASES:
                body = '{"model":"m","messages":[{"role":"user","content":"hi"}],"%s":%s}' % (key, text)
                self.assertEqual(rh.send(tt.port, body).status, 200, body)
        recs = self.wait_lines(admin, len(keys) * len(self.CASES))
        want = [v for _ in keys for _, v in self.CASES]
        self.assertEqual([r["max_tokens"] for r in recs], want)


class HashIdBound(BoundsCase):
    def test_table_stops_at_max_hash_ids(self):
        up = model_upstream(self, {"m"})
        # blocks of 1 token (4 bytes): 3000 bytes of prompt and its separator
        # are 751 blocks; two such prompts are 1502 blocks, 478 past 1024
        tt, admin = self.start(up, "  block_tokens: 1\n  max_hash_ids: 1024\n")
        prompts = ["a" * 3000, "b" * 3000]
        for p in prompts + prompts:
            self.assertEqual(rh.send(tt.port, rh.chat(model="m", prompt=p)).status, 200)
        recs = self.wait_lines(admin, 4)
        a1, b1, a2, b2 = (r["hash_ids"] for r in recs)
        self.assertEqual(len(a1), 751)
        self.assertEqual(a1, list(range(751)))
        self.assertEqual(b1, list(range(751, 1502)))
        self.assertEqual(a2, a1, "remembered blocks keep their ids")
        kept = 1024 - 751
        self.assertEqual(b2[:kept], b1[:kept])
        self.assertEqual(b2[kept:], list(range(1502, 1502 + 751 - kept)), "forgotten blocks get new ids")
        s = get_json(admin, "/workload")
        self.assertEqual((s["max_hash_ids"], s["hash_ids_kept"], s["hash_ids_forgotten"]),
                         (1024, 1024, 2 * (751 - kept)), s)
        self.assertEqual(s["prefix_shared_blocks"], 751 + kept)
        resp, _ = harness.exchange(admin, "GET", "/metrics")
        m = re.search(rb"(?m)^tokentap_workload_hash_ids_forgotten_total (\d+)$", resp.body)
        self.assertIsNotNone(m, resp.body[-2000:])
        self.assertEqual(int(m.group(1)), 2 * (751 - kept))

    def test_setting_bounds(self):
        for value, ok in (("1024", True), ("16777216", True), ("1023", False), ("16777217", False)):
            with self.subTest(value=value):
                res, name = rh.check_config("upstreams:\n  - name: a\n    url: http://127.0.0.1:9\n"
                                            "workload: {path: /tmp/x.jsonl, max_hash_ids: %s}\n" % value)
                self.assertEqual(res.returncode == 0, ok, res.stderr)
                if not ok:
                    self.assertIn("workload.max_hash_ids", res.stderr)


class FileSize(BoundsCase):
    def test_no_file_exceeds_max_size(self):
        up = model_upstream(self, {"m"})
        # a file a previous run left 4000 bytes into its 4096
        with open(self.trace, "w") as f:
            for _ in range(40):
                f.write(json.dumps({"timestamp": 0, "pad": "x" * 72}) + "\n")
        self.assertEqual(os.path.getsize(self.trace), 4000)
        tt, admin = self.start(up, "  max_size: 4k\n  max_files: 3\n  block_tokens: 1\n")
        sent = ["short"] * 3 + ["y" * 4000] + ["short %d" % i for i in range(30)]
        for p in sent:
            self.assertEqual(rh.send(tt.port, rh.chat(model="m", prompt=p)).status, 200)
        self.wait_lines(admin, len(sent))
        files = [self.trace] + ["%s.%d" % (self.trace, k) for k in (1, 2)]
        sizes = {f: os.path.getsize(f) for f in files if os.path.exists(f)}
        self.assertEqual(len(sizes), 3, sizes)
        for f, n in sizes.items():
            self.assertLessEqual(n, 4096, sizes)
            with open(f) as fh:
                for line in fh:
                    json.loads(line)  # whole lines only
        harness.wait_until(lambda: get_json(admin, "/workload")["written"] >= len(sent) - 1, 5.0, 0.02)
        s = get_json(admin, "/workload")
        self.assertEqual(s["dropped"]["too_large"], 1, s["dropped"])
        self.assertEqual(s["written"], len(sent) - 1)
        self.assertTrue(harness.wait_until(
            lambda: "workload capture: 1 records dropped so far (a record longer than workload.max_size)"
            in tt.stderr_text(), 5.0, 0.02), tt.stderr_text())
        resp, _ = harness.exchange(admin, "GET", "/metrics")
        self.assertIn(b'tokentap_workload_dropped_total{reason="too_large"} 1\n', resp.body)
        # every record still counts in the summary: it describes the traffic
        self.assertEqual(s["records"], len(sent))


if __name__ == "__main__":
    unittest.main()
