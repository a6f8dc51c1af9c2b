"""Running out of file descriptors: tokentap started under a descriptor
limit too small for the limits.max_connections it was given says so at
start-up, naming it; when idle client sockets use up what is left, the
listener pauses instead of spinning on accept (the log stays a few lines,
the CPU stays idle) and serves again by itself once descriptors free up. A
soft limit below the hard one is raised at start. With limits.max_connections
not set, the cap is lowered to what the limit holds: no warning, and the
connection past it gets the cap's 503."""

import re
import socket
import time
import unittest

import harness
import routing_helpers as rh

IDLE_SOCKETS = 90
WATCH_S = 2.0
WARN_RE = re.compile(r"descriptor limit (\d+) .*limits\.max_connections")
FIT_RE = re.compile(r"info  limits\.max_connections (\d+): what the descriptor limit holds")


def open_files_limits(pid):
    """(soft, hard) "Max open files" in /proc/PID/limits."""
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no 'Max open files' in /proc/%d/limits" % pid)


def request_ok(port):
    """Whether a plain GET through tokentap gets the simulator's answer."""
    try:
        resp, _ = harness.exchange(port, "GET", "/v1/models", headers=[("Connection", "close")], timeout=2.0)
    except OSError:
        return False
    return resp is not None and resp.status == 200


class OutOfDescriptorsTest(harness.TestCase):
    def test_accept_pauses_when_out_of_descriptors(self):
        sim = harness.start_sim(self)
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url}) + "limits: {max_connections: 10000}\n",
                           "--workers", "1", "--admin", harness.LOOPBACK + ":0", access_log=False,
                           rlimit_nofile=(64, 64))
        aport = harness.admin_port(tt)
        self.assertEqual(open_files_limits(tt.pid), (64, 64))
        self.assertTrue(harness.wait_until(lambda: WARN_RE.search(tt.stderr_text()), 2.0),
                        "no start-up warning about the descriptor limit; stderr:\n%s" % tt.stderr_text())
        self.assertTrue(request_ok(tt.port))
        with tt._lock:
            before = len(tt.lines)
        cpu0 = harness.cpu_seconds(tt.pid)
        socks = []
        try:
            for _ in range(IDLE_SOCKETS):
                socks.append(socket.create_connection((harness.LOOPBACK, tt.port), timeout=2.0))
            # the admin listener runs out too: it must not spin either
            for _ in range(3):
                socks.append(socket.create_connection((harness.LOOPBACK, aport), timeout=2.0))
            time.sleep(WATCH_S)
            cpu = harness.cpu_seconds(tt.pid) - cpu0
            with tt._lock:
                lines = tt.lines[before:]
            self.assertTrue(tt.alive())
            # before the fix: tens of megabytes of "accept failed" and a whole core
            self.assertLessEqual(len(lines), 2 * WATCH_S + 3,
                                 "log lines while out of descriptors:\n%s" % "\n".join(lines[:20]))
            self.assertLess(cpu, 0.25 * WATCH_S, "CPU seconds over %.1f s out of descriptors" % WATCH_S)
            self.assertTrue(any("accept failed" in l and "Too many open files" in l for l in lines), lines)
        finally:
            for s in socks:
                s.close()
        # served again by itself: the pause ends and the backlog drains
        self.assertTrue(harness.wait_until(lambda: request_ok(tt.port), 5.0, 0.1),
                        "not served again after the idle sockets closed; stderr:\n%s" % tt.stderr_text())
        resp, _ = harness.exchange(aport, "GET", "/healthz", headers=[("Connection", "close")], timeout=2.0)
        self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: harness.fd_count(tt.pid) < 40, 5.0, 0.1),
                        "%d fds still open" % harness.fd_count(tt.pid))

    def test_defaults_fit_the_limit(self):
        # 1 worker, 1 upstream: 32 fixed + 64 admin + 4 + 1 listener + 256
        # pooled = 357 beside the clients, 2 each: 400 holds 21
        sim = harness.start_sim(self)
        body = rh.upstreams_yaml({"sim": sim.url})
        tt = rh.start_conf(self, body, "--workers", "1", access_log=False, rlimit_nofile=(400, 400))
        self.assertEqual(open_files_limits(tt.pid), (400, 400))
        text = tt.stderr_text()
        self.assertNotIn(" warn ", text)
        m = FIT_RE.search(text)
        self.assertIsNotNone(m, text)
        self.assertEqual(int(m.group(1)), 21, text)
        # a reload fits the cap again (the file does not set it either)
        self.assertTrue(tt.reload(body), tt.stderr_text())
        # the lowered cap is the one in force: 21 idle clients, the next 503
        base = harness.fd_count(tt.pid)
        idle = []
        self.addCleanup(lambda: [s.close() for s in idle])
        for _ in range(21):
            idle.append(socket.create_connection((harness.LOOPBACK, tt.port), timeout=2.0))
        self.assertTrue(harness.wait_until(lambda: harness.fd_count(tt.pid) >= base + 21, 5.0, 0.01),
                        "%d fds, expected %d" % (harness.fd_count(tt.pid), base + 21))
        try:
            data = harness.answer_on_connect(tt.port)
        except socket.timeout:
            self.fail("connection 22 was taken past a cap of 21 (no 503 within 3 s)")
        self.assertTrue(data.startswith(b"HTTP/1.1 503 "), data[:80])
        self.assertNotRegex(tt.stderr_text(), r"descriptor limit \d+ is below")

    def test_cap_set_above_the_limit_is_named(self):
        sim = harness.start_sim(self)
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url}) + "limits: {max_connections: 10000}\n",
                           "--workers", "1", access_log=False, rlimit_nofile=(4096, 4096))
        m = WARN_RE.search(tt.stderr_text())
        self.assertIsNotNone(m, tt.stderr_text())
        self.assertEqual(int(m.group(1)), 4096)
        self.assertIn("limits.max_connections 10000 may need", tt.stderr_text())
        self.assertIsNone(FIT_RE.search(tt.stderr_text()), "a cap the user set was lowered")

    def test_soft_limit_raised_to_hard(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--workers", "1", rlimit_nofile=(64, 4096))
        self.assertEqual(open_files_limits(tt.pid), (4096, 4096))
        self.assertTrue(request_ok(tt.port))


if __name__ == "__main__":
    unittest.main()
