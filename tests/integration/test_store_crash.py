"""The stats store survives kill -9.

Crash loop: tokentap is killed with SIGKILL at random moments while traffic
flows and the store commits every 50 ms, many times in a row (a bounded
count). Just before each kill the test reads what is committed (/stats,
window all, per model); every restart must open the database (no file moved
aside as corrupt) and show at least those counts again, so nothing committed
is ever lost, and at most the requests sent so far, so nothing is counted
twice. After every kill every record must decode (tokentap --check-data).
"""

import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
import unittest

import harness

CRASHES = 12
STREAM_BODY = (
    b'{"model":"%s","stream":true,"max_tokens":8,'
    b'"messages":[{"role":"user","content":"hello"}]}'
)


def committed(port):
    """{model: requests} over the whole store (window all)."""
    resp, _ = harness.exchange(port, "GET", "/stats?window=all")
    if resp is None or resp.status != 200:
        raise AssertionError("/stats answered %r" % (resp and resp.status))
    return {s["model"]: s["requests"] for s in resp.json()["series"]}


def drive(port, stop, model, started):
    """Sends streamed requests until `stop` is set or the proxy dies; counts
    each in started[model] before its first byte goes out."""
    body = STREAM_BODY % model.encode()
    sent = 0
    for _ in range(100000):
        if stop.is_set():
            break
        started[model] = started.get(model, 0) + 1
        try:
            conn = harness.HttpConn(port, timeout=2.0)
            conn.send(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nx-sim-itl-ms: 1\r\nx-sim-ttft-ms: 1\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            conn.read_response()
            conn.close()
            sent += 1
        except (OSError, RuntimeError, ValueError):
            break
    return sent


class StoreCrashTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tokentap-crash-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.sim = harness.start_sim(self, "--ttft-ms", "1", "--itl-ms", "1")

    def start(self, *extra):
        return harness.start_tokentap(
            self, self.sim.url, "--data-dir", self.dir, "--flush-interval", "50ms", *extra
        )

    def test_kill_9_loop_keeps_database_readable(self):
        rnd = random.Random(7)
        total_sent = 0
        before, started = {}, {}
        for i in range(CRASHES):
            tt = self.start("--admin", "127.0.0.1:0")
            port = harness.admin_port(tt)
            self.assertNotIn("is corrupt", tt.stderr_text(), "restart %d" % i)
            after = committed(port)
            for model, n in before.items():
                self.assertGreaterEqual(after.get(model, 0), n, "restart %d lost committed stats of %s" % (i, model))
            for model, n in after.items():
                self.assertLessEqual(n, started.get(model, 0), "restart %d counts more %s than were sent" % (i, model))
            stop = threading.Event()
            counts = []
            threads = [
                threading.Thread(target=lambda m=m: counts.append(drive(tt.port, stop, m, started)), daemon=True)
                for m in ("crash-a", "crash-b")
            ]
            for t in threads:
                t.start()
            time.sleep(0.15 + rnd.random() * 0.35)
            # what is committed now must survive the kill that follows
            before = committed(port)
            tt.kill(signal.SIGKILL)
            stop.set()
            for t in threads:
                t.join(5)
            total_sent += sum(counts)
            # every record decodes after every kill, not only the last
            check = harness.run_cli(["--check-data", "--data-dir", self.dir], timeout=30)
            self.assertEqual(check.returncode, 0, "after kill %d: %s" % (i, check.stdout + check.stderr))
            self.assertIn("0 undecodable", check.stdout, "after kill %d" % i)
        self.assertGreater(total_sent, CRASHES, "traffic flowed between the crashes")
        self.assertTrue(before, "something was committed before the last kill")
        # something was committed: at least one series and its slices
        self.assertRegex(check.stdout, r": [1-9]\d* series, [1-9]\d* slices")

        # and a server starts on it once more, with everything in it
        tt = self.start("--admin", "127.0.0.1:0")
        self.assertTrue(tt.alive())
        after = committed(harness.admin_port(tt))
        for model, n in before.items():
            self.assertGreaterEqual(after.get(model, 0), n, model)

    def test_second_instance_refused(self):
        tt = self.start()
        args = ["--upstream", self.sim.url, "--listen", "127.0.0.1:0", "--data-dir", self.dir]
        if "--admin" in harness.tokentap_help():
            args += ["--admin", "off"]
        r = harness.run_cli(args)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("in use by another tokentap", r.stderr)
        self.assertIn(str(tt.pid), r.stderr)


if __name__ == "__main__":
    unittest.main()
