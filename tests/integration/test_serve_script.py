"""test_serve_script.py — contrib/serve.sh, the part of the README's main
command (contrib/run.sh) that starts tokentap, with the simulator as its
upstream when none is given.

A signal to the script must do what the same signal to tokentap does, and
nothing more: SIGTERM, or SIGINT sent to the whole process group as a
terminal's Ctrl-C is, drains tokentap once (a stream in flight ends whole,
its upstream still there until tokentap is done) and then nothing of it is
left running; SIGHUP reaches tokentap and stops nothing. Every process the
script starts is found through /proc and stopped again by its PID should a
test fail.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import unittest

import harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVE = os.path.join(ROOT, "contrib", "serve.sh")
CHAT = "/v1/chat/completions"
READY_RE = r"tokentap \S+ listening on 127\.0\.0\.1:(\d+)"
TOKENS = 20
ITL_MS = 50  # a stream of about one second, to signal into


def children(pid):
    """The PIDs of pid's children, from /proc."""
    kids = []
    task_dir = "/proc/%d/task" % pid
    for tid in os.listdir(task_dir):
        with open(os.path.join(task_dir, tid, "children")) as f:
            kids += [int(x) for x in f.read().split()]
    return kids


def running(pid):
    """pid exists and is not a zombie waiting to be reaped."""
    return harness.process_state(pid) not in (None, "Z")


def sim_requests(port):
    """Requests the simulator on `port` has received."""
    return harness.sim_stats(port)["requests"]


def kill_left(pids):
    for pid in pids:
        if running(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ServeScriptTest(harness.TestCase):
    def start(self, *args, env=None, stdout_path=None):
        """serve.sh on an ephemeral port, admin and store off; returns the
        script's Process, tokentap's port and the PIDs the script started."""
        p = harness.Process([SERVE, "--listen", "127.0.0.1:0", "--admin", "off", "--data-dir", "off"] + list(args),
                            READY_RE, "serve.sh", env=dict(os.environ, **(env or {})), stdout_path=stdout_path)
        self.addCleanup(p.stop)
        kids = children(p.pid)
        self.addCleanup(kill_left, kids)
        return p, int(p.match.group(1)), kids

    def start_with_sim(self, stdout_path=None):
        """serve.sh without --upstream; returns its Process, tokentap's port,
        the simulator's port and the PIDs the script started."""
        sim_port = harness.free_port()
        p, port, kids = self.start(env={"TOKENTAP_SIM_LISTEN": "127.0.0.1:%d" % sim_port}, stdout_path=stdout_path)
        self.assertEqual(len(kids), 2, "expected the simulator and tokentap under serve.sh: %r" % kids)
        return p, port, sim_port, kids

    def stream_in_background(self, port, sim_port):
        """Starts one streamed request of about a second and returns once
        the simulator has it; returns a dict that gets the response (or
        the error) and the thread."""
        out = {}

        def run():
            try:
                out["resp"], _ = harness.exchange(port, "POST", CHAT, harness.api_body("openai-chat"),
                                                  harness.sim_headers(ttft=0, itl=ITL_MS, tokens=TOKENS),
                                                  timeout=15)
            except Exception as e:  # reported by the test
                out["error"] = repr(e)

        before = sim_requests(sim_port)
        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.assertTrue(harness.wait_until(lambda: sim_requests(sim_port) > before, timeout=5),
                        "the request never reached the simulator")
        time.sleep(0.1)  # a few tokens out
        return out, th

    def assert_whole_stream(self, out):
        self.assertNotIn("error", out)
        resp = out["resp"]
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete, "the stream in flight was cut")
        events = harness.events_of(resp)
        self.assertEqual(sum(1 for e in events if harness.is_token_event("openai-chat", e)), TOKENS)
        self.assertEqual(events[-1].data, "[DONE]")

    def assert_all_gone(self, p, kids, signame):
        p.proc.wait(15)
        self.assertEqual(p.proc.returncode, 0, p.stderr_text())
        self.assertTrue(harness.wait_until(lambda: not any(running(k) for k in kids), timeout=5),
                        "still running after serve.sh exited: %r" % [k for k in kids if running(k)])
        log = p.stderr_text()
        self.assertEqual(log.count("received %s: draining" % signame), 1, log)
        self.assertNotIn("again: stopping now", log)
        self.assertNotRegex(log, harness.SANITIZER_RE)

    def test_sigterm_drains_then_stops_both(self):
        p, port, sim_port, kids = self.start_with_sim()
        out, th = self.stream_in_background(port, sim_port)
        os.kill(p.pid, signal.SIGTERM)
        th.join(15)
        self.assert_whole_stream(out)
        self.assert_all_gone(p, kids, "SIGTERM")

    def test_ctrl_c_drains_once(self):
        # A terminal sends SIGINT to every process in its foreground group;
        # the simulator must not go first, nor tokentap get it twice.
        p, port, sim_port, kids = self.start_with_sim()
        out, th = self.stream_in_background(port, sim_port)
        os.killpg(p.pid, signal.SIGINT)  # the script leads its own group (harness.Process)
        th.join(15)
        self.assert_whole_stream(out)
        self.assert_all_gone(p, kids, "SIGINT")

    def test_demo_prints_access_log(self):
        """The demo (no --upstream) writes the access log to its stdout: one
        JSON line per request, with the request's id and its whole
        timeline."""
        out = harness.temp_path(self, ".out")
        p, port, sim_port, kids = self.start_with_sim(stdout_path=out)
        resp, _ = harness.exchange(port, "POST", CHAT, harness.api_body("openai-chat"),
                                   harness.sim_headers(ttft=0, itl=0, tokens=5, request_id="it-serve-demo"))
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        e = harness.wait_log_entry(out, lambda e: e.get("id") == "it-serve-demo")
        os.kill(p.pid, signal.SIGTERM)
        self.assert_all_gone(p, kids, "SIGTERM")
        with open(out) as f:
            lines = f.read().splitlines()
        self.assertIsNotNone(e, "no access log line on stdout: %r" % lines)
        self.assertEqual(len(lines), 1, "stdout holds more than the request's line: %r" % lines)
        self.assertEqual(json.loads(lines[0]), e)
        self.assertEqual(e["status"], 200)
        self.assertEqual(e["token_events"], 5)
        timeline = ["arrive", "req_headers", "dispatch", "up_connected", "req_sent", "resp_headers",
                    "first_event", "first_token", "first_answer", "last_token", "resp_end", "client_done"]
        unreached = ["first_reasoning", "last_reasoning"]  # an answer-only stream
        self.assertEqual(sorted(e["timeline_ms"]), sorted(timeline + unreached))
        for k in timeline:
            self.assertIsInstance(e["timeline_ms"][k], (int, float), "timeline_ms.%s not reached" % k)
        for k in unreached:
            self.assertIsNone(e["timeline_ms"][k], "timeline_ms.%s" % k)

    def test_simulator_port_taken(self):
        """When the simulator's address is taken the script stops with a
        message instead of starting tokentap in front of whatever holds it;
        likewise when the simulator cannot start at all."""
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(holder.close)
        holder.bind(("127.0.0.1", 0))
        holder.listen(8)
        taken = "127.0.0.1:%d" % holder.getsockname()[1]
        for what, env, msg in (("port taken", {"TOKENTAP_SIM_LISTEN": taken}, taken + " is already in use"),
                               ("simulator fails", {"TOKENTAP_SIM_LISTEN": "127.0.0.1:%d" % harness.free_port(),
                                                    "TOKENTAP_SIM_BIN": "/bin/false"}, "could not start")):
            with self.subTest(what):
                p = subprocess.Popen([SERVE, "--listen", "127.0.0.1:0", "--admin", "off", "--data-dir", "off"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=dict(os.environ, **env), start_new_session=True)
                try:
                    _, err = p.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    kill_left(children(p.pid))
                    p.kill()
                    _, err = p.communicate()
                    self.fail("serve.sh still running after 10 s: %s" % err)
                self.assertEqual(p.returncode, 1, err)
                self.assertIn(msg, err)
                self.assertNotRegex(err, READY_RE, "tokentap was started")

    def test_given_upstream_and_sighup(self):
        sim = harness.start_sim(self)
        p, port, kids = self.start("--upstream", sim.url)
        self.assertEqual(len(kids), 1, "expected only tokentap under serve.sh: %r" % kids)
        os.kill(p.pid, signal.SIGHUP)
        self.assertTrue(harness.wait_until(lambda: "received SIGHUP" in p.stderr_text(), timeout=5),
                        p.stderr_text())
        self.assertTrue(p.alive() and running(kids[0]), "SIGHUP stopped something")
        out, th = self.stream_in_background(port, sim.port)
        th.join(15)
        self.assert_whole_stream(out)
        os.kill(p.pid, signal.SIGTERM)
        self.assert_all_gone(p, kids, "SIGTERM")


if __name__ == "__main__":
    unittest.main()
