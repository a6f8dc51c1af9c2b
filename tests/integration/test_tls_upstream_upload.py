"""Uploads to an https upstream that reads slowly, over real sockets, against
Python's ssl as the server: the upstream's receive buffer is small and it
reads nothing for a while after the handshake, then reads in small bites,
so the kernel's buffers fill and tokentap's SSL_write to it stops mid-record
(WANT_WRITE) again and again. A 16 MiB Content-Length body, and a chunked
body of 8 MiB sent in pieces, each arrive whole and in order, the answer
reaches the client, and the pooled connection carries the next request.

And a 16 MiB body that waits for an admission slot (the upstream's one slot
busy), plain TCP and TLS: tokentap stops reading the client once it holds
its stream buffer's worth; when the slot frees, what it held is written at
once, and it must read the client again although no bufferevent write
(whose callback resumes a stopped upload) took part in it."""

import os
import shutil
import socket
import ssl
import tempfile
import threading
import time

import harness
import routing_helpers as rh
from harness_upstream import read_request
from test_tls import make_pki

ANSWER = b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",' \
    b'"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'

UPLOAD_S = 40.0  # the whole upload, client send to answer, on a slow host


class SlowReader:
    """A TLS socket read `bite` bytes at a time, with a pause of `pause_s`
    every `every` reads: an upstream slower than tokentap."""

    def __init__(self, sock, bite=4096, every=64, pause_s=0.002):
        self.sock, self.bite, self.every, self.pause_s = sock, bite, every, pause_s
        self.reads = 0

    def recv(self, n):
        self.reads += 1
        if self.reads % self.every == 0:
            time.sleep(self.pause_s)
        return self.sock.recv(min(n, self.bite))


class SlowServer:
    """An https upstream with a 4 KiB receive buffer that reads nothing for
    `stall_s` after each handshake, then reads slowly, and answers each
    request with a small JSON completion on a kept connection. Bounded:
    every socket wait times out; stop() closes and joins."""

    def __init__(self, ctx, stall_s, hold=None):
        self.ctx, self.stall_s, self.hold = ctx, stall_s, hold
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by accepted sockets
        self.lsock.bind((harness.LOOPBACK, 0))
        self.lsock.listen(8)
        self.lsock.settimeout(0.05)
        self.port = self.lsock.getsockname()[1]
        self.accepted = 0
        self.requests = []
        self.errors = []
        self.stop_event = threading.Event()
        self.conns = []
        self.threads = []
        self.thread = threading.Thread(target=self._accept, name="slow-server", daemon=True)
        self.thread.start()

    def _accept(self):
        deadline = time.monotonic() + 90
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            try:
                raw, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            raw.settimeout(UPLOAD_S)
            self.accepted += 1
            self.conns.append(raw)
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, raw):
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True) if self.ctx else raw
            if self.stall_s:
                time.sleep(self.stall_s)  # the slow upstream: tokentap's writes fill the buffers meanwhile
            rd = SlowReader(conn)
            state = bytearray()
            for _ in range(100):
                req = read_request(rd, state)
                if req is None:
                    break
                self.requests.append(req)
                if self.hold is not None and len(self.requests) == 1:
                    self.hold.wait(UPLOAD_S)  # the first answer held until the test lets it go
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))
        except (EOFError, OSError):
            pass
        except Exception as e:  # surfaced by the tests through .errors
            self.errors.append(repr(e))

    def stop(self):
        self.stop_event.set()
        self.lsock.close()
        self.thread.join(2)
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(5)
        for s in self.conns:
            s.close()


def client_blocked(sent, least, still_s=0.3, timeout=10.0):
    """Polls until the byte count sent[0] is past `least` and has not moved
    for `still_s` (the client's sends block: tokentap stopped reading)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if sent[0] != last:
            last, since = sent[0], now
        elif last >= least and now - since >= still_s:
            return True
        time.sleep(0.01)
    return False


def body_of(n):
    """A chat body of about `n` bytes, every byte position telling."""
    filler = "".join("%07d," % i for i in range(n // 8 + 1))[:n]
    return rh.chat(prompt=filler)


def body_bytes(raw):
    return harness.request_bytes("POST", "/", raw).split(b"\r\n\r\n", 1)[1]


class TlsUpstreamUploadTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-tlsupload-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")

    def front(self, stall_s, tls=True, hold=None, upstream_opts=""):
        ctx = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.cert, self.key)
        srv = SlowServer(ctx, stall_s, hold)
        self.addCleanup(srv.stop)
        if tls:
            conf = "upstreams:\n  - name: secure\n    url: https://localhost:%d\n    tls: {ca_file: %s}\n" % (
                srv.port, self.ca)
        else:
            conf = "upstreams:\n  - name: plain\n    url: http://127.0.0.1:%d\n" % srv.port
        conf += upstream_opts
        tt = rh.start_conf(self, conf, *rh.ONE_WORKER)
        return srv, tt

    def upload(self, tt, head, pieces):
        """Sends `head` and then `pieces` on one connection; the response."""
        conn = harness.HttpConn(tt.port, timeout=UPLOAD_S)
        try:
            conn.send(head)
            for p in pieces:
                conn.send(p)
            return conn.read_response("POST")
        finally:
            conn.close()

    def check_answer(self, resp):
        self.assertIsNotNone(resp)
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertEqual(resp.body, ANSWER)

    def test_a_huge_body_to_a_slow_upstream_arrives_whole(self):
        """16 MiB with Content-Length to an upstream that stalls, then reads
        slowly; then a small request on the same (pooled) connection."""
        self.huge_body(tls=True)

    def test_a_huge_body_to_a_slow_plain_upstream_arrives_whole(self):
        """The same over plain TCP, where the request is written with
        writev in the call that has it."""
        self.huge_body(tls=False)

    def huge_body(self, tls):
        srv, tt = self.front(stall_s=0.5, tls=tls)
        body = body_of(16 << 20)
        raw = harness.request_bytes("POST", rh.CHAT, body, None, tt.port)
        head, _, rest = raw.partition(b"\r\n\r\n")
        # the body in 1 MiB pieces: each read of it meets a full upstream
        self.check_answer(self.upload(tt, head + b"\r\n\r\n", [rest[i:i + (1 << 20)]
                                                               for i in range(0, len(rest), 1 << 20)]))
        small = body_of(300)
        self.check_answer(self.upload(tt, harness.request_bytes("POST", rh.CHAT, small, None, tt.port), []))
        self.assertEqual(srv.errors, [])
        self.assertEqual(srv.accepted, 1)
        self.assertEqual(len(srv.requests), 2)
        self.assertTrue(srv.requests[0].body == body_bytes(body), "the 16 MiB body differs from what was sent")
        self.assertEqual(srv.requests[1].body, body_bytes(small))

    def test_a_huge_body_queued_for_admission_arrives_whole(self):
        """A 16 MiB body that waits in the upstream's admission queue (its
        one slot busy) while tokentap reads the first part of it and stops
        reading the client; admitted onto the pooled connection, its bytes
        queued so far are written at once, and reading the client resumes.
        Plain TCP and TLS alike."""
        for tls in (False, True):
            with self.subTest(tls=tls):
                self.queued_body(tls)

    def queued_body(self, tls):
        hold = threading.Event()
        srv, tt = self.front(stall_s=0.0, tls=tls, hold=hold,
                             upstream_opts="    max_concurrency: 1\n    queue: {max: 4}\n")
        first = body_of(200)
        body = body_of(16 << 20)
        raw = harness.request_bytes("POST", rh.CHAT, body, None, tt.port)
        results, sent = {}, [0]

        def one():
            results["first"] = self.upload(tt, harness.request_bytes("POST", rh.CHAT, first, None, tt.port), [])

        def two():
            conn = harness.HttpConn(tt.port, timeout=UPLOAD_S)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            try:
                for i in range(0, len(raw), 16 << 10):
                    conn.send(raw[i:i + (16 << 10)])
                    sent[0] = i + (16 << 10)
                results["second"] = conn.read_response("POST")
            except OSError as e:
                results["second_error"] = repr(e)
            finally:
                conn.close()

        t1 = threading.Thread(target=one, daemon=True)
        t1.start()
        self.assertTrue(harness.wait_until(lambda: len(srv.requests) == 1, 10, 0.005), "the first request arrives")
        t2 = threading.Thread(target=two, daemon=True)
        t2.start()
        # tokentap reads the body up to its stream buffer (256 KiB) and stops
        # reading the client: the client's sends stop (its send buffer kept
        # small)
        queued = client_blocked(sent, 256 << 10)
        hold.set()
        t1.join(UPLOAD_S)
        t2.join(UPLOAD_S + 5)
        self.assertTrue(queued, "the client's sends stopped past 256 KiB (%d sent)" % sent[0])
        self.check_answer(results.get("first"))
        self.assertNotIn("second_error", results)
        self.check_answer(results.get("second"))
        self.assertEqual(srv.errors, [])
        self.assertEqual(len(srv.requests), 2)
        self.assertTrue(srv.requests[1].body == body_bytes(body), "the queued body differs from what was sent")

    def test_a_chunked_body_to_a_slow_upstream_arrives_as_sent(self):
        """8 MiB chunked (256 KiB chunks), sent in pieces that cut chunks."""
        srv, tt = self.front(stall_s=0.5)
        body = body_of(8 << 20)
        n = len(body_bytes(body))
        raw = harness.request_bytes("POST", rh.CHAT, body, None, tt.port, chunked=[256 << 10] * (n // (256 << 10) + 1))
        head, _, rest = raw.partition(b"\r\n\r\n")
        step = 300 << 10
        self.check_answer(self.upload(tt, head + b"\r\n\r\n", [rest[i:i + step] for i in range(0, len(rest), step)]))
        self.assertEqual(srv.errors, [])
        self.assertEqual(len(srv.requests), 1)
        self.assertEqual(srv.requests[0].header("transfer-encoding"), "chunked")
        self.assertTrue(srv.requests[0].body == body_bytes(body), "the chunked body differs from what was sent")


if __name__ == "__main__":
    import unittest

    unittest.main()
