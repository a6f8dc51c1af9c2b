"""test_admin_token.py — the admin token's checks, at start and under -t:
from --admin-token-file or from TOKENTAP_ADMIN_TOKEN alike, a token shorter
than 16 bytes, or with a space or a control character, is refused with a
message saying what is needed (exit 2 at start, 1 under -t); one of 16
bytes is accepted and guards the writes over a real socket."""

import os
import shutil
import tempfile
import unittest

import harness
import routing_helpers as rh

MIN = 16
ARGS = ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--data-dir", "off",
        "--admin", "127.0.0.1:0"]


class AdminTokenTest(harness.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-admin-token-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.saved = os.environ.pop("TOKENTAP_ADMIN_TOKEN", None)
        self.addCleanup(self.restore_env)

    def restore_env(self):
        os.environ.pop("TOKENTAP_ADMIN_TOKEN", None)
        if self.saved is not None:
            os.environ["TOKENTAP_ADMIN_TOKEN"] = self.saved

    def token_file(self, text):
        path = os.path.join(self.dir, "token")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
        return path

    def conf(self, extra=""):
        path = os.path.join(self.dir, "tokentap.yaml")
        rh.write_file(path, "listen: 127.0.0.1:0\nstore: {dir: \"off\"}\nadmin: {listen: 127.0.0.1:0%s}\n"
                      "upstreams:\n  - name: a\n    url: http://127.0.0.1:9\n" % extra)
        return path

    BAD = [("x" * (MIN - 1), "at least 16"), ("short", "at least 16"), ("a" * 10 + " " + "b" * 10, "spaces"),
           ("a" * 10 + "\x01" + "b" * 10, "control")]

    def test_short_or_odd_tokens_refused_from_a_file(self):
        for tok, why in self.BAD:
            with self.subTest(tok=tok):
                path = self.token_file(tok + "\n")
                r = harness.run_cli(ARGS + ["--admin-token-file", path], timeout=5)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(why, r.stderr)
                self.assertNotIn(tok, r.stderr, "the token is never echoed")
                r = harness.run_cli(["-t", "-c", self.conf(", token_file: %s" % path)], timeout=5)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(why, r.stderr)

    def test_short_or_odd_tokens_refused_from_the_environment(self):
        for tok, why in self.BAD:
            with self.subTest(tok=tok):
                os.environ["TOKENTAP_ADMIN_TOKEN"] = tok
                r = harness.run_cli(ARGS, timeout=5)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("TOKENTAP_ADMIN_TOKEN", r.stderr)
                self.assertIn(why, r.stderr)
                r = harness.run_cli(["-t", "-c", self.conf()], timeout=5)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn("TOKENTAP_ADMIN_TOKEN", r.stderr)

    def test_sixteen_bytes_accepted_and_guard_writes(self):
        tok = "0123456789abcdef"
        self.assertEqual(len(tok), MIN)
        for source in ("env", "file"):
            with self.subTest(source=source):
                args = ["--data-dir", "off", "--admin", "127.0.0.1:0"]
                if source == "env":
                    os.environ["TOKENTAP_ADMIN_TOKEN"] = tok
                else:
                    args += ["--admin-token-file", self.token_file(tok + "\n")]
                try:
                    tt = harness.start_tokentap(self, "http://127.0.0.1:9", *args)
                finally:
                    os.environ.pop("TOKENTAP_ADMIN_TOKEN", None)
                port = harness.admin_port(tt)
                host = ("Host", "127.0.0.1:%d" % port)
                r, _ = harness.exchange(port, "POST", "/reset", b"", [host])
                self.assertEqual(r.status, 401, r.body)
                r, _ = harness.exchange(port, "POST", "/reset", b"", [host, ("Authorization", "Bearer " + tok)])
                self.assertEqual(r.status, 200, r.body)
                tt.stop()
        r = harness.run_cli(["-t", "-c", self.conf(", token_file: %s" % self.token_file(tok))], timeout=5)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
