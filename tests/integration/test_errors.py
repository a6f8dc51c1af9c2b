"""test_errors.py — every bad input gets its status and a JSON error body;
request errors close the connection and never reach the upstream; upstream
failures become 502/504 in bounded time; one broken upstream connection never
disturbs another stream. After each refusal, upstream failure or timeout,
tokentap's open fds return to its idle baseline (plus the pooled upstream
connections it reports), so a socket leaked on an error path fails here."""

import json
import threading
import time
import unittest

import harness
import routing_helpers as rh
from test_admin import admin_port

# The upper bound of a timeout's firing: below every default timeout (the
# shortest, timeouts.connect, is 5 s), so that a setting that was not applied
# fails the test, while a timer made late by a loaded machine does not.
LATE_S = 4.0
CHAT = "/v1/chat/completions"
FD_WAIT_S = 4.0  # an error answer may linger-read for 2 s (LINGER_MS) before the close


def chat_body(stream=True, prompt="hello"):
    return harness.api_body("openai-chat", stream, prompt=prompt)


class RequestErrorsTest(harness.TestCase):
    """Malformed and refused requests, against a healthy simulator."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0")
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--admin", "127.0.0.1:0")
        cls.small = harness.start_tokentap(cls, cls.sim.url, "--max-body-size", "1k", "--max-header-size", "4k",
                                           "--admin", "127.0.0.1:0")
        # port -> (process, admin port, fds while fresh and idle)
        cls.watch = {tt.port: (tt, admin_port(tt), harness.fd_targets(tt.pid)) for tt in (cls.tt, cls.small)}

    def _requests_seen(self):
        return self.sim.stats()["requests"]

    def _fds_back(self, conn, port=None, what="after an error answer"):
        """Closes the client's side (`conn`, if any), then checks that
        tokentap keeps no socket of the exchange: back to its idle fds plus
        its pooled upstream connections."""
        if conn is not None:
            conn.close()
        proc, admin, base = self.watch[port or self.tt.port]
        self.assertFdsBack(proc, base, extra=lambda: harness.pooled_connections(admin), timeout=FD_WAIT_S,
                           what=what)

    def _bad(self, raw, status, port=None):
        """Sends `raw`, expects `status` with a JSON error, the connection
        closed afterwards, and the simulator untouched."""
        before = self._requests_seen()
        conn = harness.HttpConn(port or self.tt.port)
        self.addCleanup(conn.close)
        conn.try_send(raw)
        resp = conn.read_response()
        self.assertProxyError(resp, status)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after %d" % status)
        self.assertEqual(self._requests_seen(), before, "a rejected request reached the upstream")
        self._fds_back(conn, port, "after a %d answer" % status)
        return resp

    def test_garbage_request_line(self):
        self._bad(b"THIS IS NOT HTTP AT ALL\r\n\r\n", 400)

    def test_garbage_binary(self):
        self._bad(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(40)) + b"\r\n\r\n", 400)

    def test_invalid_header_name(self):
        for name in (b"Bad Header", b"X-Space-Before-Colon ", b"Bad\x01Name", b"Bad(Name)", b"Bad\tName"):
            with self.subTest(name=name):
                raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + name +
                       b": v\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
                self._bad(raw, 400)

    def test_bad_content_length(self):
        for cl in (b"abc", b"-5", b"12abc", b"99999999999999999999999"):
            with self.subTest(cl=cl):
                raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: " + cl + b"\r\n\r\n{}")
                self._bad(raw, 400)

    def test_conflicting_content_length(self):
        raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{} ")
        self._bad(raw, 400)

    def test_bad_chunk_size(self):
        # A chunked request is routed once its first chunk line has parsed
        # (exchange state AWAIT_CHUNK), so a bad first chunk size is refused
        # before any upstream sees the request, even when it comes well
        # after the head: time enough to have connected and sent it.
        head = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        before = self._requests_seen()
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        conn.send(head)
        time.sleep(0.2)
        conn.try_send(b"zz\r\n{}\r\n0\r\n\r\n")
        resp = conn.read_response()
        self.assertProxyError(resp, 400)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 400")
        self.assertEqual(self._requests_seen(), before, "a request with a bad first chunk reached the upstream")
        self._fds_back(conn, what="after a 400 on a bad chunk size")

    def test_header_too_large(self):
        big = b"X-Big: " + b"a" * (40 * 1024) + b"\r\n"
        raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + big +
               b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        self._bad(raw, 431)

    def test_default_limits(self):
        # Defaults: 32k of header, 32m of body.
        before = self._requests_seen()
        resp, _ = harness.exchange(self.tt.port, "POST", CHAT, chat_body(False),
                                   [("X-Pad", "p" * (28 * 1024))] + harness.sim_headers(tokens=2))
        self.assertEqual(resp.status, 200, "a 28 KiB header is within the 32k default")
        self.assertEqual(self._requests_seen(), before + 1)
        raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (32 * 1024 * 1024 + 1))
        self._bad(raw, 413)

    def test_many_headers_too_large(self):
        # 4k limit on the small instance, crossed by many small headers.
        hs = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 60) for i in range(100))
        raw = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + hs + b"\r\n"
        self._bad(raw, 431, port=self.small.port)

    def test_header_size_limit_is_exact_enough(self):
        # Well under the 4k limit passes through.
        before = self._requests_seen()
        body = chat_body(False)
        resp, _ = harness.exchange(self.small.port, "POST", CHAT, body,
                                   [("X-Pad", "p" * 2000)] + harness.sim_headers(tokens=2))
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertEqual(self._requests_seen(), before + 1)

    def test_body_too_large_declared(self):
        raw = (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n")
        # Only the headers are sent: the 413 must come before any body byte.
        before = self._requests_seen()
        conn = harness.HttpConn(self.small.port)
        self.addCleanup(conn.close)
        conn.send(raw)
        conn.settimeout(3)
        resp = conn.read_response()
        self.assertProxyError(resp, 413)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 413")
        self.assertEqual(self._requests_seen(), before, "a rejected request reached the upstream")

    def test_body_size_limit_boundary(self):
        # 1k means 1024 bytes: exactly 1024 passes, 1025 is refused.
        def padded(n):
            b = json.dumps(chat_body(False, prompt="")).encode()
            pad = n - len(b) - len(',"pad":""')
            self.assertGreater(pad, 0)
            b = b[:-1] + b',"pad":"' + b"x" * pad + b'"}'
            self.assertEqual(len(b), n)
            return b
        resp, _ = harness.exchange(self.small.port, "POST", CHAT, padded(1024), harness.sim_headers(tokens=2))
        self.assertEqual(resp.status, 200, resp.body[:300])
        before = self._requests_seen()
        resp, _ = harness.exchange(self.small.port, "POST", CHAT, padded(1025), harness.sim_headers(tokens=2))
        self.assertProxyError(resp, 413)
        self.assertEqual(self._requests_seen(), before)

    def test_body_too_large_chunked(self):
        body = json.dumps(chat_body(False, prompt="y" * 3000)).encode()
        raw = harness.request_bytes("POST", CHAT, body, harness.sim_headers(tokens=2), chunked=[256] * 12)
        conn = harness.HttpConn(self.small.port)
        self.addCleanup(conn.close)
        conn.try_send(raw)
        resp = conn.read_response()
        self.assertProxyError(resp, 413)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 413")
        self._fds_back(conn, self.small.port, "after a 413 on a chunked body")

    def test_body_too_large_chunked_slowly(self):
        # The limit is crossed while the body trickles in: answered then, not
        # after the client finishes.
        body = json.dumps(chat_body(False, prompt="y" * 3000)).encode()
        raw = harness.request_bytes("POST", CHAT, body, harness.sim_headers(tokens=2), chunked=[200] * 20)
        head_end = raw.index(b"\r\n\r\n") + 4
        conn = harness.HttpConn(self.small.port)
        self.addCleanup(conn.close)
        conn.send(raw[:head_end])
        rest = raw[head_end:]
        got, sent = conn.send_until_answered((rest[i:i + 205] for i in range(0, len(rest), 205)), 0.05, 5)
        self.assertIsNotNone(got, "no response to an oversized chunked body")
        self.assertIsInstance(got, harness.Response, repr(got))
        self.assertProxyError(got, 413)
        self.assertLess(sent, len(rest), "413 only came after the whole body was sent")
        self._fds_back(conn, self.small.port, "after a 413 on a trickled chunked body")

    def test_upgrade_other_than_websocket(self):
        # WebSocket is tunnelled (test_websocket.py); any other protocol
        # switch is still refused
        raw = (b"GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: IRC/6.9\r\n\r\n")
        self._bad(raw, 501)

    def test_upgrade_h2c_ignored(self):
        # Contract reading: "Upgrade → 501" targets protocol switches tokentap
        # cannot relay (WebSocket). An h2c offer is optional for a server to
        # take up (RFC 9110 §7.8): tokentap declines it by answering in
        # HTTP/1.1, so `curl --http2` against plain http keeps working.
        body = chat_body(False)
        headers = [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
                   ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")] + harness.sim_headers(tokens=2)
        direct, _ = harness.exchange(self.sim.port, "POST", CHAT, body, harness.sim_headers(tokens=2))
        resp, _ = harness.exchange(self.tt.port, "POST", CHAT, body, headers)
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertEqual(resp.body, direct.body)

    def test_connect_method(self):
        self._bad(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 501)

    def test_healthy_after_errors(self):
        # A burst of bad requests leaves the proxy serving.
        for _ in range(5):
            c = harness.HttpConn(self.tt.port)
            c.try_send(b"NOPE\r\n\r\n")
            c.close()
        resp, _ = harness.exchange(self.tt.port, "POST", CHAT, chat_body(True), harness.sim_headers(tokens=3))
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self._fds_back(None, what="after a burst of bad requests and a good one")


class HeaderTimeoutTest(harness.TestCase):
    def test_slow_headers_closed(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--header-timeout", "300ms")
        fds = harness.fd_targets(tt.pid)
        before = sim.stats()["requests"]
        conn = harness.HttpConn(tt.port)
        self.addCleanup(conn.close)
        t0 = time.monotonic()
        conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # A head cut short always gets its 408 (client.c, on_client_timer in
        # CL_HEAD), then the close.
        conn.settimeout(LATE_S + 0.5)
        resp = conn.read_response()
        elapsed = time.monotonic() - t0
        self.assertProxyError(resp, 408)
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, LATE_S, "header timeout took %.2f s" % elapsed)
        self.assertTrue(conn.wait_closed(3.0), "connection with unfinished headers not closed")
        self.assertEqual(sim.stats()["requests"], before)
        conn.close()
        self.assertFdsBack(tt, fds, timeout=FD_WAIT_S, what="after a header timeout")


class UpstreamErrorsTest(harness.TestCase):
    def setUp(self):
        self.log = harness.temp_path(self, ".log")

    def _entry(self, rid):
        e = harness.wait_log_entry(self.log, lambda e: e.get("id") == rid)
        self.assertIsNotNone(e, "no access log line for %s: %r" % (rid, harness.read_access_log(self.log)))
        return e

    def _start(self, upstream_url, *args):
        """tokentap in front of `upstream_url`, and its fds while fresh and idle."""
        tt = harness.start_tokentap(self, upstream_url, "--access-log", self.log, *args)
        return tt, harness.fd_targets(tt.pid)

    def _fds_back(self, tt, fds, what):
        """The exchange is over (client gone, upstream failed, reset or
        timed out): tokentap must hold none of its sockets. No connection is
        pooled here except where a test stops its upstream first."""
        self.assertFdsBack(tt, fds, timeout=FD_WAIT_S, what=what)

    def _timed_with_upstream_timeout(self, behaviour, key, rid):
        """One streamed request to a fake upstream whose own `timeouts.<key>`
        is 300 ms under a global 30 s. Returns (response, seconds, tokentap)."""
        fu = harness.start_fake_upstream(self, behaviour)
        tt = rh.start_conf(self, "timeouts: {%s: 30s}\n" % key
                           + rh.upstreams_yaml({"up": fu.url}, {"up": ["timeouts: {%s: 300ms}" % key]})
                           + "routes:\n  - name: all\n    match: {path_prefix: /}\n    upstream: up\n")
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", rid)], timeout=5)
        return resp, time.monotonic() - t0, tt

    def test_connection_refused_502(self):
        tt, fds = self._start("http://127.0.0.1:%d" % harness.free_port())
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-502")])
        self.assertLess(time.monotonic() - t0, LATE_S)
        self.assertProxyError(resp, 502)
        e = self._entry("it-502")
        self.assertEqual(e["status"], 502)
        self.assertEqual(e["error"], "connect_failed")
        self._fds_back(tt, fds, "after a refused upstream connect")

    def test_first_byte_timeout_504(self):
        def silent(sock, req, ctx):
            ctx.stop_event.wait(20)  # accept, read the request, never answer
            return False

        fu = harness.start_fake_upstream(self, silent)
        tt, fds = self._start(fu.url, "--first-byte-timeout", "300ms")
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-504")], timeout=5)
        elapsed = time.monotonic() - t0
        self.assertProxyError(resp, 504)
        self.assertGreaterEqual(elapsed, 0.25, "504 before the timeout ran out")
        self.assertLess(elapsed, LATE_S, "504 took %.2f s with a 300 ms first-byte timeout" % elapsed)
        self.assertEqual(len(fu.requests), 1, "fake upstream never got the request")
        e = self._entry("it-504")
        self.assertEqual(e["status"], 504)
        self.assertEqual(e["error"], "timeout")
        # The upstream still holds its end open: tokentap must close its own.
        self._fds_back(tt, fds, "after a first-byte timeout")

    def test_upstream_first_byte_timeout_from_config(self):
        # The upstream's own `timeouts.first_byte` (300 ms), not the global
        # one (30 s), bounds the wait for its response head.
        def silent(sock, req, ctx):
            ctx.stop_event.wait(20)
            return False

        resp, elapsed, _ = self._timed_with_upstream_timeout(silent, "first_byte", "it-up-fb")
        self.assertProxyError(resp, 504)
        self.assertGreaterEqual(elapsed, 0.25, "504 before the upstream's timeout ran out")
        self.assertLess(elapsed, LATE_S, "504 took %.2f s with the upstream's 300 ms first-byte timeout" % elapsed)
        self.assertIn(b"300 ms", resp.body)

    def test_connect_timeout_504(self):
        bh = harness.Blackhole()
        self.addCleanup(bh.stop)
        tt, fds = self._start(bh.url, "--connect-timeout", "300ms")
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-504c")], timeout=5)
        elapsed = time.monotonic() - t0
        self.assertProxyError(resp, 504)
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, LATE_S, "504 took %.2f s with a 300 ms connect timeout" % elapsed)
        e = self._entry("it-504c")
        self.assertEqual(e["status"], 504)
        self.assertEqual(e["error"], "timeout")
        # The connect attempt is still pending in SYN-SENT: tokentap must
        # have closed that socket when it gave up.
        self._fds_back(tt, fds, "after a connect timeout")

    def test_reset_before_response_502(self):
        def reset(sock, req, ctx):
            harness.reset_socket(sock)
            return False

        fu = harness.start_fake_upstream(self, reset)
        tt, fds = self._start(fu.url)
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-502r")], timeout=5)
        self.assertProxyError(resp, 502)
        e = self._entry("it-502r")
        self.assertEqual(e["status"], 502)
        self.assertEqual(e["error"], "upstream_reset")
        self._fds_back(tt, fds, "after an upstream reset before the response")

    def test_idle_timeout_mid_stream(self):
        # The upstream falls silent mid-stream: with --idle-timeout 300ms the
        # client's response is cut (not ended as if complete) within ~1 s.
        def stall(sock, req, ctx):
            harness.send_sse_head(sock)
            harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
            ctx.stop_event.wait(10)
            return False

        fu = harness.start_fake_upstream(self, stall)
        tt, fds = self._start(fu.url, "--idle-timeout", "300ms")
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-idle")], timeout=5)
        elapsed = time.monotonic() - t0
        self.assertEqual(resp.status, 200)
        self.assertFalse(resp.complete, "a timed-out stream was ended as if complete")
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, LATE_S, "idle timeout took %.2f s" % elapsed)
        e = self._entry("it-idle")
        self.assertEqual(e["error"], "timeout")
        self.assertEqual(e["token_events"], 1)
        self._fds_back(tt, fds, "after an idle timeout mid-stream (upstream still open)")

    def test_upstream_idle_timeout_from_config(self):
        # An upstream's own `timeouts.idle` (300 ms) bounds its silence, not
        # the global one (30 s): events 100 ms apart keep the stream going
        # well past 300 ms, and 300 ms after the last one it is cut.
        def trickle_then_stall(sock, req, ctx):
            harness.send_sse_head(sock)
            for _ in range(8):
                harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
                time.sleep(0.1)
            ctx.stop_event.wait(10)
            return False

        resp, elapsed, tt = self._timed_with_upstream_timeout(trickle_then_stall, "idle", "it-up-idle")
        self.assertEqual(resp.status, 200)
        self.assertFalse(resp.complete, "a timed-out stream was ended as if complete")
        self.assertGreaterEqual(elapsed, 0.95, "cut before 300 ms of silence after the 8th event")
        self.assertLess(elapsed, LATE_S, "the upstream's idle timeout took %.2f s" % elapsed)
        e = harness.wait_log_entry(tt.log_path, lambda e: e.get("id") == "it-up-idle")
        self.assertIsNotNone(e)
        self.assertEqual(e["error"], "timeout")
        self.assertEqual(e["token_events"], 8)

    def test_no_total_duration_limit(self):
        """Every timeout tokentap has bounds a wait, never a whole exchange:
        with header, connect, first-byte and idle timeouts of 300 ms, a
        stream of 3 s (first token at 100 ms, then one every 100 ms) runs to
        its end, uncut and without an error."""
        sim = harness.start_sim(self)
        tt, _ = self._start(sim.url, "--header-timeout", "300ms", "--connect-timeout", "300ms",
                            "--first-byte-timeout", "300ms", "--idle-timeout", "300ms")
        body = harness.api_body("openai-chat", True, include_usage=True)
        resp, _ = harness.exchange(tt.port, "POST", CHAT, body,
                                   harness.sim_headers(ttft=100, itl=100, tokens=30, request_id="it-long"),
                                   timeout=10)
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete, "a stream within every timeout was cut")
        toks = [e for e in harness.events_of(resp) if harness.is_token_event("openai-chat", e)]
        self.assertEqual(len(toks), 30)
        self.assertGreaterEqual((toks[-1].ts - toks[0].ts) / 1e9, 2.8, "test premise: a stream of about 3 s")
        e = self._entry("it-long")
        self.assertIsNone(e["error"])
        self.assertEqual(e["status"], 200)
        self.assertEqual(e["token_events"], 30)
        self.assertEqual(e["output_tokens"], 30)
        self.assertGreaterEqual(e["e2e_ms"], 3000 - 50)

    def test_invalid_chunk_mid_stream(self):
        """The upstream's chunked framing breaks after two events, each in
        its own read: the client keeps those two, then sees the stream cut
        (not ended as if complete); the request is logged upstream_protocol
        and the connection is not kept."""
        events = [b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i for i in range(2)]

        def handler(sock, req, ctx):
            harness.send_sse_head(sock)
            for ev in events:
                time.sleep(0.03)
                harness.send_chunk(sock, ev)
            time.sleep(0.03)
            sock.sendall(b"zz\r\nnot a chunk\r\n")
            time.sleep(0.5)
            return False

        fu = harness.start_fake_upstream(self, handler)
        tt, fds = self._start(fu.url)
        resp, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-request-id", "it-badchunk")],
                                   timeout=5)
        self.assertEqual(resp.status, 200)
        self.assertFalse(resp.complete, "a broken stream was ended as if complete")
        self.assertEqual(resp.body, b"".join(events))
        e = self._entry("it-badchunk")
        self.assertEqual(e["error"], "upstream_protocol")
        self.assertEqual(e["token_events"], 2)
        fu.stop()
        self._fds_back(tt, fds, "after an upstream broke its chunked framing")

    def test_reset_mid_stream_isolated(self):
        """Two concurrent streams through one tokentap to one upstream; the
        upstream resets one mid-stream. The other completes byte for byte."""
        good_events = [b'data: {"choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n' % i for i in range(40)]
        good_events.append(b"data: [DONE]\n\n")
        good_started = threading.Event()

        def handler(sock, req, ctx):
            if req.header("x-behave") == "reset":
                good_started.wait(5)
                harness.send_sse_head(sock)
                for i in range(3):
                    harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"bad%d"}}]}\n\n' % i)
                    time.sleep(0.02)
                harness.reset_socket(sock)
                return False
            harness.send_sse_head(sock)
            good_started.set()
            for ev in good_events:
                harness.send_chunk(sock, ev)
                time.sleep(0.01)
            sock.sendall(b"0\r\n\r\n")
            return True

        fu = harness.start_fake_upstream(self, handler)
        tt, fds = self._start(fu.url)
        results = {}

        def client(name, headers):
            try:
                results[name] = harness.exchange(tt.port, "POST", CHAT, chat_body(True), headers, timeout=5)[0]
            except Exception as e:  # reported below
                results[name] = e

        tg = threading.Thread(target=client, args=("good", [("x-behave", "good"), ("x-request-id", "it-good")]), daemon=True)
        tb = threading.Thread(target=client, args=("bad", [("x-behave", "reset"), ("x-request-id", "it-bad")]), daemon=True)
        tg.start()
        tb.start()
        tg.join(10)
        tb.join(10)
        self.assertFalse(tg.is_alive() or tb.is_alive(), "clients hung")
        self.assertEqual(fu.errors, [])
        good, bad = results["good"], results["bad"]
        self.assertIsInstance(good, harness.Response, repr(good))
        self.assertEqual(good.status, 200)
        self.assertTrue(good.complete, "good stream cut short")
        self.assertEqual(good.body, b"".join(good_events))
        # The reset stream got what the upstream sent, then a cut: it must not
        # look complete to its client.
        self.assertIsInstance(bad, harness.Response, repr(bad))
        self.assertEqual(bad.status, 200)
        self.assertFalse(bad.complete, "a reset upstream stream was ended as if complete")
        self.assertEqual(bad.body, b"".join(b'data: {"choices":[{"index":0,"delta":{"content":"bad%d"}}]}\n\n' % i
                                            for i in range(3)))
        e = self._entry("it-bad")
        self.assertEqual(e["error"], "upstream_reset")
        e = self._entry("it-good")
        self.assertIsNone(e["error"])
        self.assertEqual(e["token_events"], 40)
        # Still serving afterwards.
        after, _ = harness.exchange(tt.port, "POST", CHAT, chat_body(True), [("x-behave", "good")])
        self.assertEqual(after.body, b"".join(good_events))
        # The good stream's connection may be pooled; once the upstream
        # closes it, nothing of either exchange is left.
        fu.stop()
        self._fds_back(tt, fds, "after a reset and a good stream, upstream stopped")


if __name__ == "__main__":
    unittest.main()
