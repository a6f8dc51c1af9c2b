"""test_bench_tls.py — TLS on both sides of the proxy benchmarks (scenarios f-i):
tokentap-bench over https:// through tokentap's TLS listener counts the same
tokens per request as over plain HTTP and reports what it negotiated; its
connections after the first resume the server's session; the certificate is
checked unless --insecure; the simulator speaks TLS itself (--tls-cert,
--tls-key, --tls-ciphersuites), to the bench directly and to tokentap as an
https upstream. Certificates are made per class with the openssl command
(test_tls.make_pki)."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness
import routing_helpers as rh
from test_tls import make_pki

RUN_TIMEOUT_S = 30
SUITE = "TLS_AES_128_GCM_SHA256"


def run_bench(args, timeout=RUN_TIMEOUT_S):
    return subprocess.run([harness.bench_bin()] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


class BenchTls(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-bench-tls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")
        cls.sim = harness.start_sim(cls, "--ttft-ms", 2, "--itl-ms", 1)

    def tmp(self, name):
        d = tempfile.mkdtemp(prefix="tokentap-bench-tls-", dir=self.dir)
        return os.path.join(d, name)

    def bench_ok(self, args):
        p = run_bench(args)
        self.assertEqual(p.returncode, 0, "tokentap-bench %r exited %d; stderr:\n%s\nstdout:\n%s" % (
            args, p.returncode, p.stderr, p.stdout))
        return p

    def terminator(self, upstream=None):
        """tokentap, one worker (one ticket key), with a TLS listener."""
        return rh.start_conf(self, rh.upstreams_yaml({"sim": upstream or self.sim.url}) +
                             "tls:\n  cert: %s\n  key: %s\n" % (self.cert, self.key), *rh.ONE_WORKER)

    def per_request(self, url, *extra):
        """Runs 10 requests of varied lengths at concurrency 2; returns
        ({seq: request log line}, result JSON, stdout)."""
        log, js = self.tmp("req.jsonl"), self.tmp("bench.json")
        p = self.bench_ok(["--url", url, "--concurrency", 2, "--requests", 10, "--output-len", "uniform:3:40",
                           "--input-len", "uniform:8:64", "--seed", 7, "--requests-log", log, "--json", js,
                           "--no-progress"] + list(extra))
        with open(log) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        with open(js) as f:
            res = json.load(f)["result"]
        return {r["seq"]: r for r in lines}, res, p.stdout

    def test_tls_through_tokentap_counts_as_plain(self):
        plain_tt = harness.start_tokentap(self, self.sim.url)
        tls_tt = self.terminator()
        plain, plain_res, _ = self.per_request("http://127.0.0.1:%d" % plain_tt.port)
        tls, tls_res, out = self.per_request("https://localhost:%d" % tls_tt.port, "--ca", self.ca,
                                             "--tls-ciphersuites", SUITE)
        self.assertEqual(sorted(plain), list(range(10)))
        self.assertEqual(sorted(tls), sorted(plain))
        for seq, a in plain.items():
            b = tls[seq]
            self.assertTrue(a["ok"] and b["ok"], (a, b))
            for k in ("input_len", "output_len", "input_tokens", "output_tokens", "token_events", "itl_count"):
                self.assertEqual(a[k], b[k], "seq %d %s: plain %r, TLS %r" % (seq, k, a[k], b[k]))
            self.assertEqual(len(b["itl_ms"]), b["itl_count"])
            self.assertGreaterEqual(b["output_tokens"], 3)
        self.assertEqual(plain_res["output_tokens"], tls_res["output_tokens"])
        self.assertIsNone(plain_res["tls"])
        t = tls_res["tls"]
        self.assertEqual(t["protocol"], "TLSv1.3", t)
        self.assertEqual(t["cipher"], SUITE, "tokentap prefers its own order, but only this one is offered")
        self.assertEqual(t["handshakes"], tls_res["connections"])
        self.assertTrue(t["verified"])
        self.assertEqual(tls_res["reads_kernel_stamped"], 0, "TLS reads are stamped in the read callback")
        self.assertRegex(out, r"(?m)^target: +https://localhost:%d/v1/chat/completions$" % tls_tt.port)
        self.assertRegex(out, r"(?m)^tls: +TLSv1\.3 TLS_AES_128_GCM_SHA256; 2 handshakes, \d+ of them resumed; "
                              r"certificate checked$")

    def test_later_connections_resume_the_session(self):
        tt = self.terminator()
        js = self.tmp("sweep.json")
        self.bench_ok(["--url", "https://localhost:%d" % tt.port, "--ca", self.ca, "--sweep", "1,3", "--requests",
                       3, "--output-len", 4, "--json", js, "--no-progress"])
        with open(js) as f:
            steps = [s["result"] for s in json.load(f)["steps"]]
        # the first handshake is full; the next step's three each offer a copy
        # of its session (one shared object was retired by the first of them
        # to close, and the others then fell back to full handshakes)
        self.assertEqual([(s["tls"]["handshakes"], s["tls"]["resumed"]) for s in steps], [(1, 0), (3, 3)])

    def test_certificate_is_checked_unless_insecure(self):
        tt = self.terminator()
        url = "https://localhost:%d" % tt.port
        p = run_bench(["--url", url, "--requests", 2, "--no-progress"])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("certificate verify failed: unable to get local issuer certificate", p.stderr)
        js = self.tmp("insecure.json")
        self.bench_ok(["--url", url, "--insecure", "--requests", 2, "--no-progress", "--json", js])
        with open(js) as f:
            res = json.load(f)["result"]
        self.assertEqual((res["requests"]["ok"], res["tls"]["verified"]), (2, False))
        # plain HTTP to the TLS port: the handshake fails, the run says so
        p = run_bench(["--url", "https://localhost:%d" % self.sim.port, "--insecure", "--requests", 2,
                       "--no-progress"])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("cannot connect to localhost:%d" % self.sim.port, p.stderr)

    def test_tls_flags_need_https(self):
        for args, flag in ((["--url", "http://127.0.0.1:1", "--ca", self.ca], "--ca"),
                           (["--url", "http://127.0.0.1:1", "--insecure"], "--insecure"),
                           (["--url", "https://127.0.0.1:1", "--ca", self.ca, "--insecure"], "--insecure"),
                           (["--url", "https://127.0.0.1:1", "--timestamps", "kernel"], "--timestamps"),
                           (["--url", "http://127.0.0.1:1", "--tls-ciphersuites", SUITE], "--tls-ciphersuites")):
            with self.subTest(args=args):
                p = run_bench(args, 10)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn("tokentap-bench: %s:" % flag, p.stderr)

    def test_simulator_speaks_tls(self):
        sim = harness.start_sim(self, "--ttft-ms", 2, "--itl-ms", 1, "--tls-cert", self.cert, "--tls-key", self.key,
                                "--tls-ciphersuites", SUITE)
        direct, res, out = self.per_request("https://localhost:%d" % sim.port, "--ca", self.ca, "--sim-headers")
        self.assertEqual(res["tls"]["cipher"], SUITE, res["tls"])
        for r in direct.values():
            self.assertTrue(r["ok"], r)
            self.assertEqual(r["output_tokens"], r["output_len"], r)
        # tokentap reaches it as an https upstream, verified, and counts as over plain HTTP
        front = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                              "    tls: {ca_file: %s}\n" % (sim.port, self.ca))
        via, _, _ = self.per_request("http://127.0.0.1:%d" % front.port, "--sim-headers")
        for seq, r in via.items():
            self.assertTrue(r["ok"], r)
            for k in ("output_tokens", "token_events", "itl_count"):
                self.assertEqual(r[k], direct[seq][k], (seq, k))

    def test_simulator_tls_flags(self):
        for args, want in ((["--tls-cert", self.cert], "--tls-cert and --tls-key go together"),
                           (["--tls-ciphersuites", SUITE], "--tls-ciphersuites needs --tls-cert"),
                           (["--tls-cert", self.cert, "--tls-key", os.path.join(self.dir, "missing.key")],
                            "missing.key")):
            with self.subTest(args=args):
                p = subprocess.run([harness.sim_bin(), "--listen", "127.0.0.1:0"] + args, capture_output=True,
                                   text=True, timeout=10, stdin=subprocess.DEVNULL)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn(want, p.stderr)


if __name__ == "__main__":
    unittest.main()
