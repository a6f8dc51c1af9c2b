"""test_cli.py — tokentap's command line: help, version, and rejection of bad
flags and values with exit status 2 and a message naming the flag."""

import os
import subprocess
import tempfile
import unittest

import harness


class CliTest(harness.TestCase):
    def test_help(self):
        r = harness.run_cli(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--upstream", r.stdout)
        self.assertIn("--listen", r.stdout)

    def test_readme_copies_help(self):
        """README's "Command line" block is `tokentap --help`, verbatim
        (the help is generated from the settings table; the copy is not)."""
        readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
        with open(readme, encoding="utf-8") as f:
            text = f.read()
        section = text.split("\n## Command line\n", 1)
        self.assertEqual(len(section), 2, "README has no '## Command line' section")
        block = section[1].split("```\n", 2)
        self.assertGreaterEqual(len(block), 3, "no ``` block in README's Command line section")
        r = harness.run_cli(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.maxDiff = None
        self.assertEqual(block[1], r.stdout, "README's Command line block differs from tokentap --help: paste "
                         "the help there")

    def test_version(self):
        r = harness.run_cli(["--version"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout.strip(), r"^tokentap \d+\.\d+\.\d+")

    def test_unknown_flag(self):
        r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--bogus-flag"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("bogus-flag", r.stderr)

    def test_bad_duration(self):
        for flag, value in (("--first-byte-timeout", "5parsecs"), ("--idle-timeout", "abc"),
                            ("--header-timeout", "-3s"), ("--connect-timeout", ""), ("--body-timeout", "0s")):
            with self.subTest(flag=flag, value=value):
                r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", flag, value])
                self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
                self.assertIn(flag.lstrip("-"), r.stderr)

    def test_bad_size(self):
        for flag, value in (("--max-body-size", "12q"), ("--max-header-size", "lots"),
                            ("--max-body-size", "1.5.3m")):
            with self.subTest(flag=flag, value=value):
                r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", flag, value])
                self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
                self.assertIn(flag.lstrip("-"), r.stderr)

    def test_missing_value(self):
        r = harness.run_cli(["--upstream"])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("upstream", r.stderr)

    def test_missing_upstream(self):
        r = harness.run_cli(["--listen", "127.0.0.1:0"], timeout=5)
        self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
        self.assertIn("upstream", r.stderr.lower())

    def test_bad_upstream_url(self):
        for url in ("not a url", "ftp://127.0.0.1:21", "http://127.0.0.1:99999", "http://127.0.0.1:80/v1",
                    "http://:8000", "http://[::1"):
            with self.subTest(url=url):
                self._rejected_early(["--upstream", url, "--listen", "127.0.0.1:0"], "--upstream", url)

    def test_bad_listen_address(self):
        for addr in ("localhost:8080", "127.0.0.1", "127.0.0.1:70000", "127.0.0.1:", "[::1]8080", "nonsense"):
            with self.subTest(addr=addr):
                self._rejected_early(["--upstream", "http://127.0.0.1:9", "--listen", addr], "--listen", addr)

    def test_bad_admin_address(self):
        """--admin is parsed with the flags, by the parser the admin API binds
        with (localhost allowed), not only when the admin API starts."""
        for addr in ("nonsense", "admin.example:9901", "127.0.0.1:70000", "[::1]9901"):
            with self.subTest(addr=addr):
                self._rejected_early(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin", addr],
                                     "--admin", addr)

    def test_bad_tls_files(self):
        """--tls-cert and --tls-key are checked as the file's tls.cert and
        tls.key are (a readable regular file), with the flags, exit 2."""
        with tempfile.TemporaryDirectory(prefix="tokentap-it-") as d:
            missing = os.path.join(d, "missing.pem")
            for flag, value in (("--tls-cert", missing), ("--tls-key", missing), ("--tls-cert", d)):
                with self.subTest(flag=flag, value=value):
                    self._rejected_early(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                                          flag, value], flag, value)

    def test_tls_key_of_another_certificate(self):
        """A key that does not match the certificate is refused with the
        flags (exit 2), as tokentap -t refuses it in the file."""
        with tempfile.TemporaryDirectory(prefix="tokentap-it-") as d:
            for name in ("a", "b"):
                subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
                                "-out", name + ".pem", "-days", "2", "-subj", "/CN=localhost"],
                               cwd=d, check=True, capture_output=True, timeout=60)
            r = harness.run_cli(["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
                                 "--tls-cert", os.path.join(d, "a.pem"), "--tls-key", os.path.join(d, "b.key")],
                                timeout=5)
        self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
        self.assertTrue(r.stderr.startswith("tokentap: --tls-cert and --tls-key: "), r.stderr)

    def _rejected_early(self, args, flag, value):
        """A bad value is refused with exit 2 and one message that names the
        flag and the value, before anything is created: no access log file,
        no data directory in the working directory."""
        with tempfile.TemporaryDirectory(prefix="tokentap-it-") as cwd:
            r = harness.run_cli(args + ["--access-log", "access.log"], timeout=5, cwd=cwd)
            left = sorted(os.listdir(cwd))
        self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
        self.assertTrue(r.stderr.startswith("tokentap: invalid value "), r.stderr)
        self.assertIn(" for %s: " % flag, r.stderr)
        self.assertIn("'%s'" % value, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertEqual(left, [], "files made before the value was checked")

    def test_suffixes_accepted(self):
        # Every suffix form from the contract starts a working proxy.
        tt = harness.start_tokentap(
            self, "http://127.0.0.1:%d" % harness.free_port(),
            "--max-body-size", "1k", "--max-header-size", "64k",
            "--header-timeout", "300ms", "--body-timeout", "90s", "--connect-timeout", "2s",
            "--first-byte-timeout", "1m", "--idle-timeout", "5s", "--log-level", "debug")
        self.assertTrue(tt.alive())
        tt2 = harness.start_tokentap(
            self, "http://127.0.0.1:%d" % harness.free_port(),
            "--max-body-size", "2m", "--max-header-size", "16384", "--access-log", "-")
        self.assertTrue(tt2.alive())


if __name__ == "__main__":
    unittest.main()
