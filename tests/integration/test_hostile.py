"""test_hostile.py — an attacker controls every byte a client sends.

Request smuggling shapes and malformed requests are refused by tokentap
itself: 400 (or 501 for a transfer coding it does not implement), a JSON
error, the connection closed, and nothing reaching the upstream (the
simulator's /sim/stats "requests", counted when a request head has parsed
there, stays unchanged). Where the llhttp that Debian ships accepts one of
these, tokentap must still refuse it.

Limits: a head over --max-header-size gets 431 (a URL alone, 414), more than
100 header fields gets 431 (never silently dropped), a declared body over
--max-body-size gets 413 before any body byte; Expect: 100-continue is
answered with 100 and then the response, any other expectation with 417.

Slowloris: a request head sent a byte at a time is cut when the header
timeout runs out for the whole head, not re-armed per byte.

Decisions recorded here (docs/security.md): an absolute-form request target
(`GET http://other.host/... HTTP/1.1`) is refused with 400 — tokentap is a
reverse proxy, never a forward proxy, and forwarding such a line would let
the client pick the authority the upstream sees. Two identical
Content-Length headers are refused too (RFC 9112 lets a server merge them;
a proxy that merges while another hop rejects is a smuggling vector).
"""

import socket
import threading
import time
import unittest

import harness
import routing_helpers as rh

CHAT = b"/v1/chat/completions"
HOST = b"Host: 127.0.0.1\r\n"
JSON_CT = b"Content-Type: application/json\r\n"


def post_head(extra, version=b"HTTP/1.1", path=CHAT, host=True):
    """A POST request head: request line, Host, Content-Type, `extra` header
    lines (each ending in CRLF), and the blank line."""
    return (b"POST " + path + b" " + version + b"\r\n" + (HOST if host else b"") + JSON_CT + extra + b"\r\n")


BODY = b'{"model":"sim-model","stream":false,"messages":[{"role":"user","content":"hi"}]}'


class HostileRequestsTest(harness.TestCase):
    """Smuggling shapes and malformed heads, against a healthy simulator."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0")
        cls.tt = harness.start_tokentap(cls, cls.sim.url)
        cls.small = harness.start_tokentap(cls, cls.sim.url, "--max-body-size", "1k", "--max-header-size", "4k")

    def _seen(self):
        return self.sim.stats()["requests"]

    def _refused(self, raw, statuses=(400,), port=None):
        """Sends `raw` in one write; expects one of `statuses` with a JSON
        error, the connection closed, and the simulator untouched."""
        before = self._seen()
        conn = harness.HttpConn(port or self.tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.try_send(raw)
        try:
            resp = conn.read_response()
        except socket.timeout:
            resp = "timeout"
        except ValueError as e:
            resp = "unparsable answer: %s" % e
        reached = harness.wait_until(lambda: self._seen() != before, timeout=0.3)
        if not isinstance(resp, harness.Response):
            self.fail("no answer (%s) to %r; upstream reached: %s" % (resp if resp else "closed", raw[:200],
                                                                      bool(reached)))
        self.assertIn(resp.status, statuses, "status for %r; body=%r; upstream reached: %s"
                      % (raw[:200], resp.body[:200], bool(reached)))
        self.assertProxyError(resp, resp.status)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after %d" % resp.status)
        self.assertFalse(reached, "a refused request reached the upstream: %r" % raw[:200])
        self.assertEqual(self._seen(), before)
        return resp

    # ---- message framing: Content-Length and Transfer-Encoding

    def test_content_length_with_transfer_encoding(self):
        for order in ("cl-te", "te-cl"):
            with self.subTest(order=order):
                cl, te = b"Content-Length: 6\r\n", b"Transfer-Encoding: chunked\r\n"
                head = post_head(cl + te if order == "cl-te" else te + cl)
                self._refused(head + b"0\r\n\r\n")

    def test_empty_transfer_encoding_with_content_length(self):
        # An empty Transfer-Encoding is no coding at all: with a
        # Content-Length beside it, the two framings still disagree.
        self._refused(post_head(b"Transfer-Encoding: \r\nContent-Length: %d\r\n" % len(BODY)) + BODY,
                      statuses=(400, 501))

    def test_two_content_lengths_equal(self):
        n = b"%d" % len(BODY)
        self._refused(post_head(b"Content-Length: " + n + b"\r\nContent-Length: " + n + b"\r\n") + BODY)

    def test_two_content_lengths_different(self):
        n = len(BODY)
        self._refused(post_head(b"Content-Length: %d\r\nContent-Length: %d\r\n" % (n, n - 10)) + BODY)

    def test_content_length_list_and_sign(self):
        n = len(BODY)
        for value in (b"%d, %d" % (n, n), b"%d,%d" % (n, n), b"+%d" % n, b"0x%x" % n, b"%d.0" % n):
            with self.subTest(value=value):
                self._refused(post_head(b"Content-Length: " + value + b"\r\n") + BODY)

    def test_transfer_encoding_not_final_chunked(self):
        chunked_body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
        cases = [
            (b"Transfer-Encoding: gzip\r\n", b"\x1f\x8b" + BODY),
            (b"Transfer-Encoding: chunked, gzip\r\n", chunked_body),
            (b"Transfer-Encoding: gzip, chunked\r\n", chunked_body),
            (b"Transfer-Encoding: identity\r\n", BODY),
            (b"Transfer-Encoding: xchunked\r\n", chunked_body),
            (b"Transfer-Encoding: chunked, chunked\r\n", chunked_body),
            (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked_body),
            (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n", chunked_body),
            (b"Transfer-Encoding: \r\n", BODY),
            # llhttp reads this as no coding, and the body as the next request
            (b"Transfer-Encoding: chunked\t\r\n", chunked_body),
        ]
        for te, body in cases:
            with self.subTest(te=te):
                self._refused(post_head(te) + body, statuses=(400, 501))

    def test_chunked_in_http10(self):
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
        self._refused(post_head(b"Transfer-Encoding: chunked\r\n", version=b"HTTP/1.0") + body)

    def test_invalid_chunk_sizes(self):
        # The whole request in one write: tokentap has all of it before the
        # upstream connection can be up, so it can refuse before anything is
        # sent there.
        head = post_head(b"Transfer-Encoding: chunked\r\n")
        for size in (b"zz", b"-1", b"0x10", b"+10", b"", b" 10", b"1 0", b"10\x00"):
            with self.subTest(size=size):
                self._refused(head + size + b"\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n")

    def test_overflowing_chunk_sizes(self):
        head = post_head(b"Transfer-Encoding: chunked\r\n")
        for size in (b"1" + b"0" * 16, b"f" * 17, b"f" * 40, b"0" * 30 + b"1" + b"0" * 16):
            with self.subTest(size=size):
                self._refused(head + size + b"\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n")

    def test_oversized_chunk_extension(self):
        # Extension bytes are no body bytes: unbounded, they would let a
        # client stream forever without ever reaching --max-body-size.
        head = post_head(b"Transfer-Encoding: chunked\r\n")
        before = self._seen()
        conn = harness.HttpConn(self.tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(head + b"5;ext=" + b"e" * 16384)
        # up to 1 MiB more of extension, until the answer
        got, sent = conn.send_until_answered([b"e" * 16384] * 64, 0.01, 3)
        sent += 16384
        reached = harness.wait_until(lambda: self._seen() != before, timeout=0.3)
        self.assertIsNotNone(got, "no answer after %d bytes of chunk extension" % sent)
        self.assertIsInstance(got, harness.Response, "no answer: %r (upstream reached: %s)"
                              % (got, bool(reached)))
        self.assertProxyError(got, 400)
        self.assertLess(sent, 1 << 20, "the whole 1 MiB of chunk extension was read")
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 400")
        self.assertFalse(reached, "a request with an oversized chunk extension reached the upstream")

    # ---- header syntax

    def test_obs_fold(self):
        for fold in (b"X-A: a\r\n b\r\n", b"X-A: a\r\n\tb\r\n", b"Content-Length: 5\r\n 0\r\n"):
            with self.subTest(fold=fold):
                self._refused(post_head(fold + b"Content-Length: %d\r\n" % len(BODY)) + BODY)

    def test_bare_lf(self):
        for raw in (b"GET /v1/models HTTP/1.1\nHost: 127.0.0.1\n\n",
                    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\nX-A: b\r\n\r\n",
                    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\n"):
            with self.subTest(raw=raw):
                self._refused(raw)

    def test_bare_cr(self):
        for raw in (b"GET /v1/models HTTP/1.1\rHost: 127.0.0.1\r\r",
                    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\rX-A: b\r\n\r\n",
                    b"GET /v1/models HTTP/1.1\r\nX-A: a\rb\r\nHost: 127.0.0.1\r\n\r\n",
                    # llhttp takes CR and any byte as the blank line
                    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\rX"):
            with self.subTest(raw=raw):
                self._refused(raw)

    def test_space_before_colon(self):
        for line in (b"Content-Length : %d\r\n" % len(BODY), b"Transfer-Encoding : chunked\r\n",
                     b"X-A\t: b\r\nContent-Length: %d\r\n" % len(BODY)):
            with self.subTest(line=line):
                self._refused(post_head(line) + BODY)

    def test_empty_header_name(self):
        # llhttp takes ": value" as a header with an empty name
        for line in (b": x\r\nContent-Length: %d\r\n" % len(BODY), b"Content-Length: %d\r\n: x\r\n" % len(BODY)):
            with self.subTest(line=line):
                self._refused(post_head(line) + BODY)

    def test_control_characters_in_values(self):
        for c in (b"\x00", b"\x01", b"\x0b", b"\x0c", b"\x1b", b"\x7f"):
            with self.subTest(c=c):
                self._refused(post_head(b"X-A: a" + c + b"b\r\nContent-Length: %d\r\n" % len(BODY)) + BODY)

    def test_nul_bytes(self):
        for raw in (b"GET /v1/mo\x00dels HTTP/1.1\r\n" + HOST + b"\r\n",
                    b"GE\x00T /v1/models HTTP/1.1\r\n" + HOST + b"\r\n",
                    b"GET /v1/models HTTP/1.1\r\nX-\x00A: b\r\n" + HOST + b"\r\n",
                    b"GET /v1/models HTTP/1.1\x00\r\n" + HOST + b"\r\n",
                    b"\x00GET /v1/models HTTP/1.1\r\n" + HOST + b"\r\n"):
            with self.subTest(raw=raw):
                self._refused(raw)

    def test_two_host_headers(self):
        for hosts in (b"Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n", b"Host: 127.0.0.1\r\nHost: evil.example\r\n",
                      b"Host: a, b\r\n"):
            with self.subTest(hosts=hosts):
                self._refused(b"GET /v1/models HTTP/1.1\r\n" + hosts + b"\r\n")

    def test_missing_http_version(self):
        for line in (b"GET /v1/models\r\n", b"GET /v1/models \r\n", b"GET /v1/models HTTP/\r\n",
                     b"GET /v1/models HTTP/1\r\n", b"GET /v1/models http/1.1\r\n",
                     b"GET /v1/models HTTP/1.1 extra\r\n", b"GET /v1/models HTTP/2.0\r\n"):
            with self.subTest(line=line):
                self._refused(line + HOST + b"\r\n")

    def test_absolute_form_other_host(self):
        # Decision: refused (docs/security.md), whatever the Host header says.
        for raw in (b"GET http://evil.example/v1/models HTTP/1.1\r\nHost: evil.example\r\n\r\n",
                    b"GET http://evil.example/v1/models HTTP/1.1\r\n" + HOST + b"\r\n",
                    b"POST https://169.254.169.254/latest/meta-data HTTP/1.1\r\n" + HOST + JSON_CT +
                    b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY):
            with self.subTest(raw=raw[:60]):
                self._refused(raw)

    def test_still_serving(self):
        # After all of the above on shared instances, a good request works.
        resp, _ = harness.exchange(self.tt.port, "POST", CHAT.decode(), BODY, harness.sim_headers(tokens=2))
        self.assertEqual(resp.status, 200, resp.body[:200])

    # ---- limits

    def test_header_too_large(self):
        self._refused(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Big: " + b"a" * 8192 + b"\r\n\r\n",
                      statuses=(431,), port=self.small.port)

    def test_header_too_large_streamed(self):
        # A head that never ends: answered once it passes the limit, with no
        # need to see its end.
        before = self._seen()
        conn = harness.HttpConn(self.small.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Big: ")
        got, sent = conn.send_until_answered([b"a" * 1024] * 256, 0.005, 3)
        self.assertIsInstance(got, harness.Response, repr(got))
        self.assertProxyError(got, 431)
        self.assertLess(sent, 64 * 1024, "431 only after %d bytes of a 4k-limited head" % sent)
        self.assertEqual(self._seen(), before)

    def test_url_too_long(self):
        self._refused(b"GET /v1/models?q=" + b"u" * 8192 + b" HTTP/1.1\r\n" + HOST + b"\r\n",
                      statuses=(414,), port=self.small.port)

    def test_too_many_headers(self):
        # 101 small fields, far under the 32k size limit: 431, not a request
        # forwarded with some of them missing.
        fields = b"".join(b"X-H%d: v\r\n" % i for i in range(100))
        self._refused(b"GET /v1/models HTTP/1.1\r\n" + HOST + fields + b"\r\n", statuses=(431,))

    def test_body_too_large_declared(self):
        before = self._seen()
        conn = harness.HttpConn(self.small.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(post_head(b"Content-Length: 1025\r\n"))  # the head alone
        resp = conn.read_response()
        self.assertProxyError(resp, 413)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 413")
        self.assertEqual(self._seen(), before)

    def test_expect_unknown(self):
        for value in (b"something", b"100-continue, something", b"100-continuex"):
            with self.subTest(value=value):
                self._refused(post_head(b"Expect: " + value + b"\r\nContent-Length: %d\r\n" % len(BODY)) + BODY,
                              statuses=(417,))

    def test_expect_100_continue(self):
        before = self._seen()
        conn = harness.HttpConn(self.tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(post_head(b"Expect: 100-continue\r\nx-sim-tokens: 2\r\nContent-Length: %d\r\n" % len(BODY)))
        line = conn._readline()
        self.assertEqual(line, b"HTTP/1.1 100 Continue\r\n", "no 100 Continue before the body was sent")
        self.assertEqual(conn._readline(), b"\r\n")
        conn.send(BODY)
        resp = conn.read_response()
        self.assertEqual(resp.status, 200, resp.body[:200])
        self.assertTrue(resp.complete)
        self.assertEqual(self._seen(), before + 1)
        # exactly one interim answer: the next bytes are the final response's
        self.assertNotIn(b"100 Continue", b"".join(p for _, p in resp.pieces))


class RawUpstream:
    """Accepts connections on 127.0.0.1:0 and keeps every byte each one
    sent; answers each request with a small 200 once its body (chunked) has
    ended, then goes on reading until the peer closes or the test stops."""

    def __init__(self, test):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.bind((harness.LOOPBACK, 0))
        self.lsock.listen(8)
        self.lsock.settimeout(0.05)
        self.url = "http://%s:%d" % (harness.LOOPBACK, self.lsock.getsockname()[1])
        self.raw = []  # one bytearray a connection
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        harness._add_cleanup(test, self.close)  # a test, or a class in setUpClass

    def _run(self):
        deadline = time.monotonic() + 60
        conns = []
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                c, _ = self.lsock.accept()
                c.settimeout(0.05)
                conns.append((c, bytearray(), [0]))
                self.raw.append(conns[-1][1])
            except socket.timeout:
                pass
            for c, buf, answered in conns:
                try:
                    data = c.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    continue
                buf += data
                # one answer per chunked body end seen
                while buf.count(b"\r\n0\r\n") > answered[0]:
                    answered[0] += 1
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        for c, _, _ in conns:
            c.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.lsock.close()


class TrailerTest(harness.TestCase):
    """Trailer fields after a chunked request body are checked like header
    fields but never forwarded: tokentap ends the body with its own last
    chunk, so a trailer such as Content-Length can never reach the upstream,
    in the body or (when routing waits for the body) in the head."""

    def _exchange(self, tt, up):
        body = BODY
        raw = (post_head(b"Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n") +
               b"%x\r\n" % len(body) + body + b"\r\n0\r\nX-Checksum: abc\r\nContent-Length: 5\r\n\r\n")
        s = socket.create_connection((harness.LOOPBACK, tt.port), timeout=10)
        try:
            s.sendall(raw)
            got = b""
            for _ in range(1000):
                if b"\r\n\r\n{}" in got:
                    break
                b = s.recv(65536)
                if not b:
                    break
                got += b
        finally:
            s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 200 "), got[:200])
        self.assertTrue(harness.wait_until(lambda: len(up.raw) == 1 and b"\r\n0\r\n\r\n" in up.raw[0], 5.0, 0.02))
        time.sleep(0.2)  # anything sent after the last chunk would be here by now
        sent = bytes(up.raw[0])
        self.assertNotIn(b"x-checksum", sent.lower())
        self.assertNotIn(b"content-length: 5", sent.lower())
        self.assertTrue(sent.endswith(b"\r\n0\r\n\r\n"), sent[-80:])
        self.assertIn(body, sent)

    def test_trailers_not_forwarded(self):
        up = RawUpstream(self)
        tt = harness.start_tokentap(self, up.url)
        self._exchange(tt, up)

    def test_trailers_not_forwarded_when_routing_waits_for_the_body(self):
        # a route matching on the model: the head goes upstream only once
        # the body has told the model
        up = RawUpstream(self)
        tt = rh.start_conf(self, rh.upstreams_yaml({"raw": up.url}) +
                           "routes:\n  - name: chat\n    match: {path_prefix: /v1/, model: sim-model}\n"
                           "    upstream: raw\n")
        self._exchange(tt, up)


class HeaderCountTest(harness.TestCase):
    """At the limit every header reaches the upstream; one over, none does."""

    def test_hundred_fields_all_forwarded(self):
        def ok(sock, req, ctx):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            return True

        fu = harness.start_fake_upstream(self, ok)
        tt = harness.start_tokentap(self, fu.url)
        fields = b"".join(b"X-H%d: v%d\r\n" % (i, i) for i in range(99))  # + Host = 100
        conn = harness.HttpConn(tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + fields + b"\r\n")
        resp = conn.read_response()
        self.assertEqual(resp.status, 200, resp.body[:200])
        self.assertEqual(len(fu.requests), 1)
        got = {k for k, _ in fu.requests[0].headers if k.startswith("x-h")}
        self.assertEqual(got, {"x-h%d" % i for i in range(99)}, "headers dropped on the way")


# Framing that the lenient half of llhttp 8.1 accepts (the first groups) or
# that llhttp accepts even in strict mode (trailers): each is a 400 that
# reaches no upstream. tests/unit/test_reqparse.c feeds the same shapes to
# the parser alone, whole and a byte at a time.
CHUNKED_HEAD = post_head(b"Transfer-Encoding: chunked\r\n")
CHUNK_FRAMING = [
    b"5\r\nhelloXY0\r\n\r\n",          # chunk data not followed by CRLF
    b"5\r\nhello\rZ0\r\n\r\n",
    b"5\r\nhello\nZ0\r\n\r\n",
    b"5\rZhello\r\n0\r\n\r\n",          # chunk-size line ended by CR and any byte
    b"5;a=b\rZhello\r\n0\r\n\r\n",
    b"5\r\nhello\r\n0\rZ\r\n",          # the last chunk's line, likewise
    b"5\r\nhello\r\n0\r\n\rZ",          # CR and any byte as the blank line after it
]
TRAILER_FRAMING = [
    b"5\r\nhello\r\n0\r\n\n",           # a bare LF as the blank line
    b"5\r\nhello\r\n0\r\nX-T: a\r\n\n",
    b"5\r\nhello\r\n0\r\nX-T: a\n\r\n",
    b"5\r\nhello\r\n0\r\nX-T: a\r\n b\r\n\r\n",  # obs-fold in a trailer field
    b"5\r\nhello\r\n0\r\nX-T: a\r\n\tb\r\n\r\n",
    b"5\r\nhello\r\n0\r\nX-T: a\rY: b\r\n\r\n",
]
TARGETS = [b"/v1/models\t/x", b"/v1/models\x0c/x", b"/v1/models?a=\t", b"/v1/models?a=\x0c",
           b"/v1/models#f\t", b"/v1/mod\xc3\xa9ls", b"/v1/models?q=\x80", b"/v1/models\x0b",
           b"/v1/models\x7f"]


class StrictFramingTest(harness.TestCase):
    """Each shape above gets a 400 with the JSON error, the connection is
    closed, and the upstream (which keeps every byte it is sent) receives
    nothing."""

    @classmethod
    def setUpClass(cls):
        cls.up = RawUpstream(cls)
        cls.tt = harness.start_tokentap(cls, cls.up.url)

    def _refused(self, raw):
        conn = harness.HttpConn(self.tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.try_send(raw)
        try:
            resp = conn.read_response()
        except (socket.timeout, ValueError) as e:
            resp = e
        time.sleep(0.05)  # anything forwarded would be there by now
        got = b"".join(bytes(r) for r in self.up.raw)
        self.assertIsInstance(resp, harness.Response, "no answer to %r (upstream got %r)" % (raw, got[:200]))
        self.assertProxyError(resp, 400)
        self.assertTrue(conn.wait_closed(2.0), "connection left open after 400")
        self.assertEqual(got, b"", "the upstream received bytes of %r" % raw)

    def test_chunk_framing(self):
        for body in CHUNK_FRAMING:
            with self.subTest(body=body):
                self._refused(CHUNKED_HEAD + body)

    def test_trailer_framing(self):
        for body in TRAILER_FRAMING:
            with self.subTest(body=body):
                self._refused(CHUNKED_HEAD + body)

    def test_control_and_non_ascii_bytes_in_target(self):
        for target in TARGETS:
            with self.subTest(target=target):
                self._refused(b"GET " + target + b" HTTP/1.1\r\n" + HOST + b"\r\n")

    def test_well_framed_still_served(self):
        # the same shapes framed right: a chunk extension (a TAB inside its
        # quoted value is allowed), a trailer field, and a target with
        # printable ASCII of every class; on an instance of its own, so
        # that the upstream above stays untouched
        up = RawUpstream(self)
        tt = harness.start_tokentap(self, up.url)
        path = b"/v1/chat/completions?a=%20b&c=~!$'()*+,;=:@/?[]"
        raw = post_head(b"Transfer-Encoding: chunked\r\n", path=path) + \
            b"5;a=\"x\ty\"\r\nhello\r\n0\r\nX-T: a\r\n\r\n"
        conn = harness.HttpConn(tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(raw)
        resp = conn.read_response()
        self.assertEqual(resp.status, 200, resp.body[:200])
        sent = bytes(up.raw[0])
        self.assertTrue(sent.startswith(b"POST " + path + b" HTTP/1.1\r\n"), sent[:200])
        self.assertIn(b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n", sent)


class H2cUpgradeTest(harness.TestCase):
    """An h2c upgrade offer (RFC 7540 3.2) is declined by answering the
    request in HTTP/1.1: the offer is not forwarded (Upgrade, HTTP2-Settings
    and the Connection header naming them are hop-by-hop), and the keep-alive
    connection carries the next request as usual."""

    def _ok(self, sock, req, ctx):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        return True

    def test_offer_declined_connection_kept(self):
        fu = harness.start_fake_upstream(self, self._ok)
        tt = harness.start_tokentap(self, fu.url)
        offer = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                 b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n")
        cases = [
            ("GET", b"GET /v1/models HTTP/1.1\r\n" + HOST + offer + b"\r\n"),
            ("POST", post_head(offer + b"Content-Length: %d\r\n" % len(BODY)) + BODY),
        ]
        for method, first in cases:
            with self.subTest(method=method):
                before = len(fu.requests)
                conn = harness.HttpConn(tt.port, timeout=3)
                self.addCleanup(conn.close)
                conn.send(first)
                r1 = conn.read_response()
                self.assertEqual(r1.status, 200, r1.body[:200])
                conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Second: yes\r\n\r\n")
                r2 = conn.read_response()
                self.assertEqual(r2.status, 200, "the request after an h2c offer: %r" % r2.body[:200])
                self.assertTrue(harness.wait_until(lambda: len(fu.requests) == before + 2, 2.0))
                got = fu.requests[before:]
                self.assertEqual([r.method for r in got], [method, "GET"])
                self.assertEqual(got[1].header("x-second"), "yes")
                if method == "POST":
                    self.assertEqual(got[0].body, BODY)
                for name in ("upgrade", "http2-settings"):
                    self.assertIsNone(got[0].header(name), "%s forwarded upstream" % name)
                conn_hdr = (got[0].header("connection") or "").lower()
                self.assertNotIn("upgrade", conn_hdr)
                self.assertNotIn("http2-settings", conn_hdr)

    def test_pipelined_after_offer(self):
        # both requests in one write: the second waits, unparsed, behind the
        # first, and is parsed once the first is answered
        fu = harness.start_fake_upstream(self, self._ok)
        tt = harness.start_tokentap(self, fu.url)
        conn = harness.HttpConn(tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"Connection: Upgrade, HTTP2-Settings\r\n"
                  b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
                  b"GET /v1/models HTTP/1.1\r\n" + HOST + b"\r\n")
        for _ in range(2):
            r = conn.read_response()
            self.assertEqual(r.status, 200, r.body[:200])
        self.assertEqual(len(fu.requests), 2)

    def test_other_upgrade_still_refused(self):
        fu = harness.start_fake_upstream(self, self._ok)
        tt = harness.start_tokentap(self, fu.url)
        conn = harness.HttpConn(tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\nUpgrade: IRC/6.9\r\n\r\n")
        r = conn.read_response()
        self.assertProxyError(r, 501)
        self.assertEqual(len(fu.requests), 0)

    def test_websocket_answered_without_101(self):
        # the upstream declines the handshake: its answer is an ordinary one,
        # and the handshake's own headers went to it
        fu = harness.start_fake_upstream(self, self._ok)
        tt = harness.start_tokentap(self, fu.url)
        conn = harness.HttpConn(tt.port, timeout=3)
        self.addCleanup(conn.close)
        conn.send(b"GET /v1/models HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        r = conn.read_response()
        self.assertEqual(r.status, 200)
        self.assertEqual(len(fu.requests), 1)
        self.assertEqual(fu.requests[0].header("upgrade"), "websocket")
        self.assertEqual(fu.requests[0].header("sec-websocket-key"), "dGhlIHNhbXBsZSBub25jZQ==")


class SlowlorisTest(harness.TestCase):
    def test_head_deadline_not_reset_per_byte(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--header-timeout", "1s")
        before = sim.stats()["requests"]
        head = (b"POST /v1/chat/completions HTTP/1.1\r\n" + HOST + JSON_CT +
                b"X-Slow: " + b"s" * 300 + b"\r\nContent-Length: 2\r\n\r\n{}")
        conn = harness.HttpConn(tt.port, timeout=5)
        self.addCleanup(conn.close)
        stop = threading.Event()
        sent = [0]

        def trickle():
            for b in head:  # 20 ms a byte: ~7 s for the whole head
                if stop.is_set():
                    return
                try:
                    conn.sock.send(bytes([b]))
                except OSError:
                    return
                sent[0] += 1
                time.sleep(0.02)

        t0 = time.monotonic()
        w = threading.Thread(target=trickle, daemon=True)
        w.start()
        closed = conn.wait_closed(4.0)
        elapsed = time.monotonic() - t0
        at_close = sent[0]
        stop.set()
        w.join(2)
        self.assertTrue(closed, "a head trickled a byte at a time was not cut within 4 s")
        self.assertGreaterEqual(elapsed, 0.9, "cut after %.2f s, before the 1 s header timeout" % elapsed)
        # the whole head takes ~7 s to trickle in: a cut before 4 s is the 1 s
        # timeout, however late a loaded machine runs its timer
        self.assertLess(elapsed, 4.0, "cut after %.2f s with a 1 s header timeout" % elapsed)
        self.assertLess(at_close, len(head), "the head was complete before the cut")
        if conn.extra:  # an answer is optional; if there is one, it says 408
            self.assertTrue(conn.extra.startswith(b"HTTP/1.1 408"), conn.extra[:100])
        self.assertEqual(sim.stats()["requests"], before)



class SlowUploadTest(harness.TestCase):
    """A request body must arrive whole within the body timeout of the end
    of its head (timeouts.body), whatever the pace: a client trickling one
    byte per 100 ms gets 408 at the deadline and its upstream connection and
    admission slot go to the next request. Time tokentap itself spends not
    reading the client (upload backpressure) is not counted."""

    def _ok(self, sock, req, ctx):
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        return True

    def _start(self, upstream_url, body_timeout):
        return rh.start_conf(self, rh.upstreams_yaml({"u": upstream_url},
                                                     {"u": ["max_concurrency: 1", "queue: {max: 4, timeout: 20s}"]})
                             + "timeouts:\n  body: %s\n" % body_timeout, "--workers", "1")

    def test_trickled_body_cut_at_deadline_slot_released(self):
        fu = harness.start_fake_upstream(self, self._ok)
        tt = self._start(fu.url, "1s")
        body = b'{"model":"m","messages":[' + b" " * 200 + b"]}"
        slow = harness.HttpConn(tt.port, timeout=5)
        self.addCleanup(slow.close)
        slow.send(post_head(b"Content-Length: %d\r\n" % len(body)))
        t0 = time.monotonic()
        stop = threading.Event()
        sent = [0]

        def trickle():
            for b in body:  # 100 ms a byte: 20 s for the whole body
                if stop.wait(0.1):
                    return
                try:
                    slow.sock.send(bytes([b]))
                except OSError:
                    return
                sent[0] += 1

        w = threading.Thread(target=trickle, daemon=True)
        w.start()
        self.addCleanup(lambda: (stop.set(), w.join(2)))
        # the trickler holds the only slot: this one queues behind it
        self.assertTrue(harness.wait_until(lambda: fu.accepted == 1, 2.0), "the trickled request was not routed")
        fast = {}

        def other():
            resp, _ = harness.exchange(tt.port, "POST", CHAT.decode(), BODY, {"Content-Type": "application/json"},
                                       timeout=10)
            fast["status"] = resp.status
            fast["at"] = time.monotonic() - t0

        o = threading.Thread(target=other, daemon=True)
        o.start()
        try:
            resp = slow.read_response()
        except (socket.timeout, ValueError) as e:
            resp = e
        elapsed = time.monotonic() - t0
        stop.set()
        w.join(2)
        o.join(10)
        self.assertIsInstance(resp, harness.Response, "no answer to a trickled body within %.1f s (%d of %d "
                              "bytes sent)" % (elapsed, sent[0], len(body)))
        obj = self.assertProxyError(resp, 408)
        self.assertIn("body", obj["error"]["message"])
        self.assertGreaterEqual(elapsed, 0.9, "cut after %.2f s, before the 1 s body timeout" % elapsed)
        self.assertLess(elapsed, 2.0, "cut after %.2f s with a 1 s body timeout" % elapsed)
        self.assertLess(sent[0], len(body))
        self.assertTrue(slow.wait_closed(2.0), "connection left open after 408")
        self.assertEqual(fast.get("status"), 200, "the queued request: %r" % fast)
        self.assertLess(fast["at"], 4.0, "the queued request was served %.2f s in" % fast["at"])
        # the trickled request never reached the upstream whole
        self.assertEqual([r.body for r in fu.requests], [BODY])

    def test_fast_large_upload_not_cut(self):
        fu = harness.start_fake_upstream(self, self._ok)
        tt = self._start(fu.url, "1s")
        big = b'{"model":"m","pad":"' + b"x" * (8 << 20) + b'"}'
        resp, _ = harness.exchange(tt.port, "POST", CHAT.decode(), big, {"Content-Type": "application/json"},
                                   timeout=10)
        self.assertEqual(resp.status, 200, resp.body[:200])
        self.assertEqual(len(fu.requests[0].body), len(big))

    def test_backpressure_not_counted(self):
        # An upstream that takes nothing for 3 s: tokentap stops reading the
        # 24 MiB upload once its buffers fill, so the client cannot finish
        # within the 2 s body timeout; the time tokentap was not reading is
        # not the client's, and the request is served.
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind((harness.LOOPBACK, 0))
        lsock.listen(4)
        lsock.settimeout(10)
        self.addCleanup(lsock.close)
        got = {}

        def serve():
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            with c:
                c.settimeout(10)
                time.sleep(3.0)
                req = harness.read_request(c, bytearray())
                got["len"] = len(req.body) if req else None
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        tt = self._start("http://%s:%d" % (harness.LOOPBACK, lsock.getsockname()[1]), "2s")
        big = b'{"model":"m","pad":"' + b"x" * (24 << 20) + b'"}'
        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT.decode(), big, {"Content-Type": "application/json"},
                                   timeout=15)
        elapsed = time.monotonic() - t0
        t.join(5)
        self.assertEqual(resp.status, 200, "after %.2f s: %r" % (elapsed, resp.body[:200]))
        self.assertGreater(elapsed, 2.5, "the upload was never held back: the test shows nothing")
        self.assertEqual(got.get("len"), len(big))

if __name__ == "__main__":
    unittest.main()
