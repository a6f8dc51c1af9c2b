"""Mirroring: a share of a route's requests also goes to a shadow upstream,
measured under its own series and discarded. The primary's answers stay
byte-identical and its ttft unchanged with a slow mirror; a dead mirror or
one that stops reading costs the primary nothing."""

import os
import socket
import statistics
import threading
import unittest

import harness
import routing_helpers as rh
from test_admin import admin_port
from test_pool import ClosingOnReuse

TOKEN = "mirror-test-token-0123"


def route_yaml(percent, mirror="shadow"):
    return ("routes:\n  - name: chat\n    upstream: primary\n"
            "    mirror: {upstream: %s, percent: %d}\n" % (mirror, percent))


class SilentUpstream:
    """Accepts connections and never reads nor answers: a mirror that
    cannot keep up."""

    def __init__(self, test):
        self.sock = socket.socket()
        # a small window, set before listen so accepted sockets inherit it
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind((harness.LOOPBACK, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        test.addCleanup(self.close)

    def run(self):
        self.sock.settimeout(0.1)
        for _ in range(600):
            if self.stop.is_set():
                return
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except socket.timeout:
                pass

    def close(self):
        self.stop.set()
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


class MirrorTest(harness.TestCase):
    def setUp(self):
        self.primary = harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "2", "--model", "primary")

    def start(self, shadow_url, percent):
        self.ups = {"primary": self.primary.url, "shadow": shadow_url}
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            tt = rh.start_conf(self, rh.upstreams_yaml(self.ups) + route_yaml(percent), "--admin", "127.0.0.1:0",
                               *rh.ONE_WORKER)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        return tt, admin_port(tt)

    def upstream(self, admin, name):
        r, _ = harness.exchange(admin, "GET", "/upstreams")
        return {u["name"]: u for u in r.json()["upstreams"]}[name]

    def test_share_is_mirrored_and_measured_apart(self):
        shadow = harness.start_sim(self, "--ttft-ms", "20", "--itl-ms", "5", "--model", "shadow")
        tt, admin = self.start(shadow.url, 30)
        body = rh.chat(stream=True, stream_options={"include_usage": True})
        direct, _ = harness.exchange(self.primary.port, "POST", rh.CHAT, body=body)
        for _ in range(20):
            resp = rh.send(tt.port, body)
            self.assertEqual(resp.status, 200)
            self.assertEqual(resp.body, direct.body, "the client gets the primary's bytes only")
        # exactly 30 % of 20 requests, and all of them complete
        self.assertTrue(harness.wait_until(lambda: shadow.stats()["completed"] == 6, 5.0))
        self.assertEqual(shadow.stats()["requests"], 6)
        log = tt.wait_log_count(26)
        mirrored = [e for e in log if e.get("mirror")]
        primary = [e for e in log if not e.get("mirror")]
        self.assertEqual(len(mirrored), 6)
        self.assertEqual(len(primary), 20)
        self.assertTrue(all(e["upstream"] == "shadow" and e["status"] == 200 for e in mirrored))
        self.assertTrue(all(e["ttft_ms"] is not None and e["output_tokens"] for e in mirrored))
        ids = {e["id"] for e in primary}
        self.assertTrue(all(e["id"] in ids for e in mirrored), "a shadow copy keeps its request's id")
        # the shadow, 15 ms slower to first token, shows so on its own series
        self.assertGreater(statistics.median(e["ttft_ms"] for e in mirrored),
                           statistics.median(e["ttft_ms"] for e in primary) + 10)
        # every gap of every shadow stream is in the shadow's series
        gaps = sum(e["itl_count"] for e in mirrored)
        self.assertGreater(gaps, 0)

        def shadow_itl():
            r, _ = harness.exchange(admin, "GET", "/stats?window=all&upstream=shadow")
            return sum(se["metrics"]["itl"]["count"] for se in r.json()["series"])
        self.assertTrue(harness.wait_until(lambda: shadow_itl() == gaps, 5.0), (shadow_itl(), gaps))

    def test_shadow_load_is_sampled_at_admission(self):
        # A long shadow stream admitted alone, and a short one admitted
        # while it runs: each one's gaps go to the in-flight bucket of its
        # own admission (1 and 2), however the load changes while it runs.
        shadow = harness.start_sim(self, "--model", "shadow")
        tt, admin = self.start(shadow.url, 100)
        body = rh.chat(stream=True)
        plans = [("0", [("x-sim-ttft-ms", "50"), ("x-sim-itl-ms", "20"), ("x-sim-tokens", "10")]),
                 ("0.12", [("x-sim-ttft-ms", "10"), ("x-sim-itl-ms", "10"), ("x-sim-tokens", "3")])]
        threads = []
        for delay, hdrs in plans:
            threads.append(threading.Timer(float(delay), lambda h=hdrs: rh.send(tt.port, body, headers=h)))
            threads[-1].start()
        for t in threads:
            t.join(5)
        self.assertTrue(harness.wait_until(lambda: shadow.stats()["completed"] == 2, 5.0))
        got = {}

        def curve():
            r, _ = harness.exchange(admin, "GET", "/stats/curve?window=5m&upstream=shadow")
            got.clear()
            for s in r.json()["series"]:
                for b in s["buckets"]:
                    got[b["inflight_low"]] = got.get(b["inflight_low"], 0) + b["itl"]["count"]
            return sum(got.values()) == 9 + 2

        self.assertTrue(harness.wait_until(curve, 5.0, 0.1), got)
        self.assertEqual(got, {1: 9, 2: 2})

    def test_slow_mirror_leaves_primary_ttft_alone(self):
        shadow = harness.start_sim(self, "--ttft-ms", "400", "--itl-ms", "50", "--model", "shadow")
        tt, admin = self.start(shadow.url, 0)
        body = rh.chat(stream=True)

        def ttfts(n):
            before = len(tt.access_log())
            for _ in range(n):
                self.assertEqual(rh.send(tt.port, body, headers=[("x-sim-tokens", "8")]).status, 200)
            entries = [e for e in tt.wait_log_count(before + n) if not e.get("mirror")]
            return [e["ttft_ms"] for e in entries[-n:]]

        without = ttfts(20)
        self.assertTrue(tt.reload(rh.upstreams_yaml(self.ups) + route_yaml(100)))
        with_mirror = ttfts(20)
        self.assertGreater(shadow.stats()["requests"], 0)
        self.assertLess(abs(statistics.median(with_mirror) - statistics.median(without)), 3.0,
                        "primary ttft p50 %.2f ms with a slow mirror, %.2f ms without" % (
                            statistics.median(with_mirror), statistics.median(without)))

    def test_copies_in_flight_are_bounded(self):
        """A shadow that holds every copy for seconds: at most
        mirror.max_in_flight copies run at once, the rest are skipped and
        counted as the shadow's `rejected`."""
        limit = 8
        shadow = harness.start_sim(self, "--ttft-ms", "6000", "--itl-ms", "1", "--model", "shadow")
        self.ups = {"primary": self.primary.url, "shadow": shadow.url}
        route = ("routes:\n  - name: chat\n    upstream: primary\n"
                 "    mirror: {upstream: shadow, percent: 100, max_in_flight: %d}\n" % limit)
        tt = rh.start_conf(self, rh.upstreams_yaml(self.ups) + route, "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = admin_port(tt)
        peak = [0]
        stop = threading.Event()

        def watch():
            for _ in range(1000):
                st = shadow.stats()
                peak[0] = max(peak[0], st["requests"] - st["completed"] - st["aborted"])
                if stop.wait(0.01):
                    return
        w = threading.Thread(target=watch, daemon=True)
        w.start()
        ka = rh.KeepAlive(tt.port)
        self.addCleanup(ka.close)
        for _ in range(200):
            resp = ka.request("POST", rh.CHAT, rh.chat(), harness.sim_headers(tokens=1))  # the shadow gets them too
            self.assertEqual(resp.status, 200)
        stop.set()
        w.join(5)
        self.assertEqual(self.primary.stats()["requests"], 200)
        self.assertGreater(peak[0], 0)
        self.assertLessEqual(peak[0], limit)
        self.assertLessEqual(shadow.stats()["requests"], limit)
        self.assertGreaterEqual(self.upstream(admin, "shadow")["rejected"], 200 - limit)

    def test_dead_mirror_costs_the_primary_nothing(self):
        tt, admin = self.start("http://127.0.0.1:%d" % harness.free_port(), 100)
        for _ in range(10):
            self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        self.assertEqual(self.primary.stats()["requests"], 10)
        self.assertTrue(harness.wait_until(
            lambda: self.upstream(admin, "shadow")["errors"].get("connect_failed", 0) == 10, 3.0))
        self.assertEqual(self.upstream(admin, "primary")["errors"], {})

    def test_mirror_that_stops_reading_is_abandoned(self):
        silent = SilentUpstream(self)
        tt, admin = self.start("http://127.0.0.1:%d" % silent.port, 100)
        # a 12 MiB prompt: more than the kernel's socket buffers hold, so the
        # shadow's share piles up in tokentap unless it is let go
        big = rh.chat(prompt="x" * (12 << 20))
        resp = rh.send(tt.port, big, timeout=30)
        self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: self.upstream(admin, "shadow")["rejected"] >= 1, 3.0),
                        "the shadow was abandoned, not buffered")
        # ASan keeps freed memory in quarantine, so RSS says nothing there;
        # the normal build checks that the 12 MiB did not pile up
        if "ASAN_OPTIONS" not in os.environ:
            self.assertLess(tt.rss_kib(), 64 * 1024)

    def shadow_entries(self, tt, n):
        """The access log's first `n` shadow entries, once there are `n`."""
        found = []

        def have():
            found[:] = [e for e in tt.access_log() if e.get("mirror")]
            return len(found) >= n
        self.assertTrue(harness.wait_until(have, 5.0), found)
        return found[:n]

    def test_shadow_non_streamed_usage_is_counted(self):
        # the shadow runs a primary's exchange and meter: a non-streamed 2xx
        # answer's usage is counted for the shadow as for the primary, and
        # its stream flag is false even when the request asked for a stream
        answer = b'{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":7}}'

        def handler(sock, req, ctx):
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            return True
        shadow = harness.start_fake_upstream(self, handler)
        tt, _ = self.start(shadow.url, 100)
        self.assertEqual(rh.send(tt.port, rh.chat(stream=True)).status, 200)
        (e,) = self.shadow_entries(tt, 1)
        self.assertEqual(e["status"], 200)
        self.assertEqual(e["output_tokens"], 7)
        self.assertEqual(e["input_tokens"], 3)
        self.assertIs(e["stream"], False)

    def test_shadow_on_a_pooled_connection_closed_is_replayed(self):
        # as a primary's (the same exchange): the server closes the pooled connection as the
        # shadow reuses it; the shadow goes again once on a new one
        shadow = ClosingOnReuse(self)
        tt, admin = self.start(shadow.url, 100)
        for i in range(3):
            self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
            entries = self.shadow_entries(tt, i + 1)
        self.assertEqual([e["status"] for e in entries], [200, 200, 200], entries)
        self.assertEqual([e["error"] for e in entries], [None, None, None])
        self.assertEqual(shadow.connections, 3)
        self.assertEqual(shadow.requests, 5)
        self.assertEqual(self.upstream(admin, "shadow")["errors"], {})

    def test_shadow_failure_sets_last_error(self):
        # as a primary's: /upstreams names the shadow's last failure
        tt, admin = self.start("http://127.0.0.1:%d" % harness.free_port(), 100)
        self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        self.assertTrue(harness.wait_until(
            lambda: self.upstream(admin, "shadow")["errors"].get("connect_failed", 0) == 1, 3.0))
        last = self.upstream(admin, "shadow")["last_error"]
        self.assertIsNotNone(last)
        self.assertEqual(last["kind"], "connect_failed")
        self.assertGreater(last["unix"], 0)
        self.assertIsNone(self.upstream(admin, "primary")["last_error"])

    def test_shadow_bytes_out_counts_response_bytes_taken(self):
        # as a primary's: a head that never completed gave the client
        # nothing; the shadow counts it as the primary would, 0 bytes
        def handler(sock, req, ctx):
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-half")
            return False
        shadow = harness.start_fake_upstream(self, handler)
        tt, _ = self.start(shadow.url, 100)
        self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        (e,) = self.shadow_entries(tt, 1)
        self.assertEqual(e["error"], "upstream_reset")
        self.assertEqual(e["bytes_out"], 0)

    def test_shadow_connect_timeout_counts_connect_failed(self):
        # kept apart, so that a shadow never delays or fails its primary: a
        # shadow that cannot connect in time is counted connect_failed (a
        # primary's would be a timeout), and the primary is answered as if
        # there were no shadow
        bh = harness.Blackhole()
        self.addCleanup(bh.stop)
        self.ups = {"primary": self.primary.url, "shadow": bh.url}
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            tt = rh.start_conf(self, rh.upstreams_yaml(self.ups) + route_yaml(100), "--admin", "127.0.0.1:0",
                               "--connect-timeout", "300ms", *rh.ONE_WORKER)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        admin = admin_port(tt)
        self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        (e,) = self.shadow_entries(tt, 1)
        self.assertEqual(e["error"], "connect_failed")
        self.assertEqual(self.upstream(admin, "shadow")["errors"], {"connect_failed": 1})
        self.assertEqual(self.upstream(admin, "primary")["errors"], {})


if __name__ == "__main__":
    unittest.main()
