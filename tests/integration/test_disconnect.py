"""test_disconnect.py — a client that goes away mid-stream, or while still
waiting for its first token, makes tokentap abort the upstream request at once
(so the server stops generating), and the request is logged as client_aborted.
After each disconnect tokentap's open fds go back to what they were before any
traffic, plus the idle pooled upstream connections it reports in /upstreams:
a socket left behind by an aborted exchange fails the test."""

import os
import tempfile
import time
import unittest

import harness
from test_admin import admin_port

ABORT_BOUND_NS = 100 * 1000 * 1000
FD_WAIT_S = 3.0


class DisconnectTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls)
        fd, cls.log = tempfile.mkstemp(prefix="tokentap-it-", suffix=".log")
        os.close(fd)
        cls.addClassCleanup(os.unlink, cls.log)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--access-log", cls.log, "--admin", "127.0.0.1:0")
        cls.admin = admin_port(cls.tt)
        # Idle and fresh: listeners, event loops, store and log files only.
        cls.fds = harness.fd_targets(cls.tt.pid)

    def _fds_back(self, what):
        self.assertFdsBack(self.tt, self.fds, extra=lambda: harness.pooled_connections(self.admin),
                           timeout=FD_WAIT_S, what=what)

    def _start_stream(self, api, rid, ttft, itl, tokens):
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        body = harness.api_body(api, True)
        conn.send(harness.request_bytes("POST", harness.API_PATHS[api], body,
                                        harness.sim_headers(ttft=ttft, itl=itl, tokens=tokens, request_id=rid)))
        return conn

    def _close_and_measure(self, conn, before, abort):
        if abort:
            conn.abort()
        else:
            conn.close()
        t_close = harness.now_ns()
        stats = harness.wait_until(lambda: (lambda s: s if s["aborted"] > before["aborted"] else None)(self.sim.stats()),
                                   timeout=3.0, interval=0.005)
        self.assertIsNotNone(stats, "the simulator never saw the request aborted")
        self.assertEqual(stats["aborted"], before["aborted"] + 1)
        delay = stats["last_abort_ns"] - t_close
        self.assertLessEqual(delay, ABORT_BOUND_NS, "upstream aborted %.1f ms after the client left" % (delay / 1e6))
        self.assertGreater(delay, -5 * 1000 * 1000, "sim abort before the client closed? clocks disagree")
        return stats

    def _check_logged(self, rid):
        e = harness.wait_log_entry(self.log, lambda e: e.get("id") == rid)
        self.assertIsNotNone(e, "no access log line for %s" % rid)
        self.assertEqual(e["error"], "client_aborted")
        return e

    def test_disconnect_mid_stream(self):
        for api, abort in (("openai-chat", False), ("anthropic", True), ("ollama-generate", False)):
            with self.subTest(api=api, rst=abort):
                rid = "it-disc-mid-%s-%d" % (api, abort)
                before = self.sim.stats()
                conn = self._start_stream(api, rid, ttft=0, itl=10, tokens=100000)
                resp = conn.read_head()
                self.assertEqual(resp.status, 200)
                got = 0
                for ts, piece in conn.body_reader(resp):
                    got += piece.count(b"\n\n") if api != "ollama-generate" else piece.count(b"\n")
                    if got >= 5:
                        break
                self.assertGreaterEqual(got, 5)
                stats = self._close_and_measure(conn, before, abort)
                self.assertEqual(stats["completed"], before["completed"])
                e = self._check_logged(rid)
                self.assertEqual(e["status"], 200)
                self.assertIsNotNone(e["timeline_ms"]["first_token"])
                self._fds_back("after a client left mid-stream")

    def test_disconnect_before_first_token(self):
        for abort in (False, True):
            with self.subTest(rst=abort):
                rid = "it-disc-ttft-%d" % abort
                before = self.sim.stats()
                conn = self._start_stream("openai-chat", rid, ttft=10000, itl=10, tokens=50)
                # Wait until the simulator holds the request.
                seen = harness.wait_until(lambda: self.sim.stats()["requests"] > before["requests"], 3.0)
                self.assertTrue(seen, "request never reached the simulator")
                time.sleep(0.1)
                stats = self._close_and_measure(conn, before, abort)
                self.assertEqual(stats["completed"], before["completed"])
                e = self._check_logged(rid)
                self.assertIsNone(e["timeline_ms"]["first_token"])
                self.assertIsNone(e["ttft_ms"])
                self._fds_back("after a client left before its first token")

    def test_disconnect_during_request_body(self):
        # The client leaves before its body is complete: nothing is left
        # hanging at the upstream.
        before = self.sim.stats()
        conn = harness.HttpConn(self.tt.port)
        raw = harness.request_bytes("POST", "/v1/chat/completions", harness.api_body("openai-chat", True),
                                    harness.sim_headers(ttft=0, itl=10, tokens=100))
        conn.send(raw[:-10])
        time.sleep(0.2)
        conn.close()
        ok = harness.wait_until(lambda: self.sim.stats()["open_connections"] <= before["open_connections"], 2.0)
        stats = self.sim.stats()
        self.assertTrue(ok, "upstream connection left open: %r" % stats)
        self.assertEqual(stats["completed"], before["completed"])
        self._fds_back("after a client left during its upload")

    def test_proxy_still_serves(self):
        resp, _ = harness.exchange(self.tt.port, "POST", "/v1/chat/completions",
                                   harness.api_body("openai-chat", True), harness.sim_headers(ttft=0, itl=0, tokens=5))
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        # The finished request's upstream connection may stay pooled; the
        # client's own socket must be gone.
        self._fds_back("after a completed request")


if __name__ == "__main__":
    unittest.main()
