"""test_cli.py — tokentap's command line: help, version, and rejection of bad
flags and values with exit status 2 and a message naming the flag."""

import unittest

import harness


class CliTest(harness.TestCase):
    def test_help(self):
        r = harness.run_cli(["--help"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--upstream", r.stdout)
        self.assertIn("--listen", r.stdout)

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
                            ("--header-timeout", "-3s"), ("--connect-timeout", "")):
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
        r = harness.run_cli(["--upstream", "not a url", "--listen", "127.0.0.1:0"], timeout=5)
        self.assertEqual(r.returncode, 2, "stdout=%r stderr=%r" % (r.stdout, r.stderr))
        self.assertIn("upstream", r.stderr.lower())

    def test_suffixes_accepted(self):
        # Every suffix form from the contract starts a working proxy.
        tt = harness.start_tokentap(
            self, "http://127.0.0.1:%d" % harness.free_port(),
            "--max-body-size", "1k", "--max-header-size", "64k",
            "--header-timeout", "300ms", "--connect-timeout", "2s",
            "--first-byte-timeout", "1m", "--idle-timeout", "5s", "--log-level", "debug")
        self.assertTrue(tt.alive())
        tt2 = harness.start_tokentap(
            self, "http://127.0.0.1:%d" % harness.free_port(),
            "--max-body-size", "2m", "--max-header-size", "16384", "--access-log", "-")
        self.assertTrue(tt2.alive())


if __name__ == "__main__":
    unittest.main()
