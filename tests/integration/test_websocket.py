"""test_websocket.py — WebSocket tunnelling (src/proxy/tunnel.c,
src/parse/wsframe.c): a session through tokentap with the npm `ws` client
against an echoing upstream; raw frames byte for byte both ways (the
upstream's bytes as the client reads them, the client's as the upstream
reads them, 101 included); malformed frames and oversized messages closed
with 1002 / 1009 on both sides; an idle tunnel closed with 1008; a client
that never reads cut by the idle deadline with bounded memory; an Upgrade
to anything else still 501; the session's access log line."""

import base64
import hashlib
import json
import os
import socket
import struct
import threading
import time

import harness
from harness_npm import NodeScript
from harness_upstream import start_fake_upstream
from routing_helpers import ConfTokentap

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
WS = NodeScript("ws-client", ["ws@8.18.0"], "ws_client.cjs")


def accept_key(key):
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


def frame(op, payload, mask=None, fin=True):
    b = bytes([(0x80 if fin else 0) | op])
    n = len(payload)
    m = 0x80 if mask else 0
    if n < 126:
        b += bytes([n | m])
    elif n < 65536:
        b += bytes([126 | m]) + struct.pack(">H", n)
    else:
        b += bytes([127 | m]) + struct.pack(">Q", n)
    if mask:
        b += mask
        payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
    return b + payload


def read_frame(s, buf):
    """(opcode, payload) of the next frame from `s` (unmasking a client's)."""
    def need(n):
        while len(buf) < n:
            d = s.recv(65536)
            if not d:
                raise EOFError
            buf.extend(d)
    need(2)
    op, ln = buf[0] & 0x0F, buf[1] & 0x7F
    masked, off = buf[1] & 0x80, 2
    if ln == 126:
        need(4)
        ln, off = struct.unpack(">H", bytes(buf[2:4]))[0], 4
    elif ln == 127:
        need(10)
        ln, off = struct.unpack(">Q", bytes(buf[2:10]))[0], 10
    mask = None
    if masked:
        need(off + 4)
        mask, off = bytes(buf[off:off + 4]), off + 4
    need(off + ln)
    p = bytes(buf[off:off + ln])
    del buf[:off + ln]
    if mask:
        p = bytes(c ^ mask[i % 4] for i, c in enumerate(p))
    return op, p


class Upstream:
    """A WebSocket server behind tokentap. mode "echo": each data message
    back, a close answered and the connection ended; "raw": the bytes it
    read kept in .got, SCRIPT's bytes sent after the 101, then it reads
    until EOF; "flood": sends until the socket is closed."""

    def __init__(self, test):
        self.mode, self.script, self.got, self.done = "echo", b"", bytearray(), threading.Event()
        self.head = b""
        self.up = start_fake_upstream(test, self.handle)

    def handle(self, s, req, fu):
        key = req.header("sec-websocket-key")
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req = req
        self.head = (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept_key(key).encode() + b"\r\n\r\n")
        s.sendall(self.head + (self.script if self.mode == "raw" else b""))
        buf = bytearray()
        try:
            if self.mode == "raw":
                s.settimeout(5)
                while True:
                    d = s.recv(65536)
                    if not d:
                        break
                    self.got.extend(d)
            elif self.mode == "realtime":
                self.realtime(s, buf)
            elif self.mode == "flood":
                chunk = frame(2, b"x" * 60000)
                while True:
                    s.sendall(chunk)
            else:
                while True:
                    op, p = read_frame(s, buf)
                    if op == 8:
                        s.sendall(frame(8, p))
                        break
                    if op in (1, 2):
                        s.sendall(frame(op, p))
                    if op == 9:
                        s.sendall(frame(10, p))
        except (OSError, EOFError):
            pass
        finally:
            self.done.set()
        return False


    PREFILL_S, ITL_S, DELTAS, USAGE = 0.05, 0.01, 5, {"input_tokens": 11, "output_tokens": 5,
                                                     "input_token_details": {"cached_tokens": 3}}

    def realtime(self, s, buf):
        """A realtime server: session.created, then per response.create a
        prefill wait, DELTAS text deltas (the last one fragmented, a ping
        between its fragments) ITL_S apart and response.done with USAGE."""
        s.sendall(frame(1, json.dumps({"type": "session.created", "session": {"type": "x"}}).encode()))
        n = 0
        while True:
            op, p = read_frame(s, buf)
            if op == 8:
                s.sendall(frame(8, p))
                return
            if op != 1 or json.loads(p).get("type") != "response.create":
                continue
            n += 1
            time.sleep(self.PREFILL_S)
            for i in range(self.DELTAS):
                d = json.dumps({"type": "response.output_text.delta", "event_id": "e%d" % i,
                                "response_id": "r%d" % n, "delta": "tok%d " % i}).encode()
                if i == self.DELTAS - 1:
                    s.sendall(frame(1, d[:10], fin=False) + frame(9, b"") + frame(0, d[10:]))
                else:
                    s.sendall(frame(1, d))
                time.sleep(self.ITL_S)
            s.sendall(frame(1, json.dumps({"type": "response.done", "response": {
                "id": "r%d" % n, "status": "completed", "output": [{"type": "message"}],
                "usage": self.USAGE}}).encode()))


def handshake(port, path="/ws", extra=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames go at once, as clients send them
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n" % (path, key)).encode() + extra + b"\r\n")
    return s, key


def read_until_close(s, limit=1 << 22):
    data = bytearray()
    s.settimeout(5)
    while len(data) < limit:
        try:
            d = s.recv(65536)
        except socket.timeout:
            break
        if not d:
            break
        data.extend(d)
    return bytes(data)


def close_frames(data):
    """The close frames' (code, reason) in a server's byte stream after its head."""
    buf = bytearray(data[data.index(b"\r\n\r\n") + 4:])
    out = []
    while len(buf) >= 2:
        op, ln = buf[0] & 0x0F, buf[1] & 0x7F
        off = 2 + (2 if ln == 126 else 8 if ln == 127 else 0)
        if ln == 126:
            ln = struct.unpack(">H", bytes(buf[2:4]))[0]
        elif ln == 127:
            ln = struct.unpack(">Q", bytes(buf[2:10]))[0]
        if len(buf) < off + ln:
            break
        p = bytes(buf[off:off + ln])
        if op == 8:
            out.append((struct.unpack(">H", p[:2])[0], p[2:].decode()))
        del buf[:off + ln]
    return out


class WebSocketTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ws = Upstream(cls)
        cls.start_logged(cls.ws.up.url, "tokentap-ws-")

    def setUp(self):
        self.ws.mode, self.ws.script, self.ws.got = "echo", b"", bytearray()
        self.ws.done.clear()

    def test_npm_ws_session_echo(self):
        WS.install()
        msgs = [{"text": "hello"}, {"text": "x" * 70000},
                {"binary": base64.b64encode(bytes(range(256)) * 10).decode()}]
        for deflate in ("0", "1"):
            r = WS("ws://127.0.0.1:%d/v1/echo" % self.tt.port, json.dumps(msgs), deflate)
            self.assertEqual(r["got"], msgs, deflate)
            self.assertEqual((r.get("code"), r.get("reason")), (1000, "done"), r.get("code"))  # echoed
        e = self.log_entry(self.log, "it-ws-npm")
        self.assertEqual(e["status"], 101)
        self.assertIsNone(e["error"])
        self.assertGreater(e["bytes_in"], 70000)
        self.assertGreater(e["bytes_out"], 70000)

    def test_raw_bytes_exact_both_ways(self):
        down = frame(1, b"server text") + frame(2, bytes(300)) + frame(1, b"frag", fin=False) + \
            frame(9, b"p") + frame(0, b"ment") + frame(8, struct.pack(">H", 1000) + b"bye")
        self.ws.mode, self.ws.script = "raw", down
        s, _ = handshake(self.tt.port)
        m = b"\x01\x02\x03\x04"
        up = frame(1, b"client text", m) + frame(2, os.urandom(70000), m) + frame(9, b"", m) + \
            frame(8, struct.pack(">H", 1000), m)
        for i in range(0, len(up), 777):  # cut anywhere
            s.sendall(up[i:i + 777])
        got = read_until_close(s)
        s.close()
        self.assertTrue(self.ws.done.wait(5))
        self.assertEqual(got, self.ws.head + down)
        self.assertEqual(bytes(self.ws.got), up)

    def violation(self, bad, code):
        self.ws.mode = "raw"
        s, _ = handshake(self.tt.port)
        m = b"\x09\x08\x07\x06"
        good = frame(1, b"fine", m)
        s.sendall(good + bad)
        got = read_until_close(s)
        s.close()
        self.assertTrue(self.ws.done.wait(5))
        self.assertEqual(close_frames(got)[-1][0], code, got[-80:])
        # the upstream got the good frame, then tokentap's masked close
        up = bytearray(self.ws.got)
        self.assertTrue(bytes(up).startswith(good), up[:40])
        del up[:len(good)]
        self.assertEqual(up[0], 0x88)
        self.assertTrue(up[1] & 0x80)
        return got

    def test_unmasked_client_frame_1002(self):
        self.violation(frame(1, b"no mask"), 1002)

    def test_reserved_opcode_1002(self):
        self.violation(frame(3, b"x", b"abcd"), 1002)

    def test_oversized_message_1009(self):
        # 16 MiB frame limit by default: declare a frame past it
        bad = bytes([0x82, 0xFF]) + struct.pack(">Q", (16 << 20) + 1) + b"abcd"
        self.violation(bad, 1009)

    def test_other_upgrade_501(self):
        s = socket.create_connection(("127.0.0.1", self.tt.port), timeout=5)
        s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nUpgrade: foo/1\r\nConnection: Upgrade\r\n\r\n")
        got = read_until_close(s)
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 501"), got[:80])

    def test_websocket_post_refused(self):
        s = socket.create_connection(("127.0.0.1", self.tt.port), timeout=5)
        s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Content-Length: 0\r\n\r\n")
        got = read_until_close(s)
        s.close()
        self.assertTrue(got.startswith(b"HTTP/1.1 400"), got[:80])


class RealtimeTest(harness.TestCase):
    """/v1/realtime: each response measured, from the client's
    response.create to the first delta, as the client sees it."""

    @classmethod
    def setUpClass(cls):
        cls.ws = Upstream(cls)
        cls.start_logged(cls.ws.up.url, "tokentap-rt-")

    def test_two_responses_measured(self):
        self.ws.mode = "realtime"
        s, _ = handshake(self.tt.port, "/v1/realtime?model=rt-model", b"x-request-id: it-rt\r\n")
        buf = bytearray()
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        self.assertTrue(head.startswith(b"HTTP/1.1 101"), head)
        m = b"\x11\x22\x33\x44"
        self.assertEqual(json.loads(read_frame(s, buf)[1])["type"], "session.created")
        seen = []
        for _ in range(2):
            s.sendall(frame(1, json.dumps({"type": "conversation.item.create", "item": {"type": "x"}}).encode(), m))
            t0 = time.monotonic()
            s.sendall(frame(1, json.dumps({"type": "response.create", "response": {"type": "t"}}).encode(), m))
            first, acc = None, b""
            while True:
                op, p = read_frame(s, buf)
                if op not in (0, 1):
                    continue
                acc += p
                try:  # a fragmented message is whole once it parses
                    ev = json.loads(acc)
                except ValueError:
                    continue
                acc = b""
                if ev["type"].endswith(".delta") and first is None:
                    first = time.monotonic()
                if ev["type"] == "response.done":
                    break
            seen.append((first - t0) * 1e3)
        s.sendall(frame(8, struct.pack(">H", 1000), m))
        read_until_close(s)
        s.close()
        for i, client_ttft in enumerate(seen, 1):
            e = self.log_entry(self.log, "it-rt/%d" % i)
            self.assertEqual((e["api"], e["method"], e["status"], e["error"]), ("realtime", "WS", 200, None))
            self.assertEqual(e["token_events"], Upstream.DELTAS)
            self.assertEqual((e["input_tokens"], e["output_tokens"], e["cached_tokens"]), (11, 5, 3))
            self.assertGreaterEqual(e["ttft_ms"], Upstream.PREFILL_S * 1e3 - 1)
            self.assertLess(abs(e["ttft_ms"] - client_ttft), 5, (e["ttft_ms"], client_ttft))
            self.assertGreaterEqual(e["tpot_ms"], Upstream.ITL_S * 1e3 * 0.9)
        sess = self.log_entry(self.log, "it-rt")
        self.assertEqual((sess["api"], sess["status"], sess["error"]), ("realtime", 101, None))
        self.assertIsNone(sess["ttft_ms"])


class WebSocketLimitsTest(harness.TestCase):
    """Small limits from the config file: message size over fragments, the
    idle deadline, a client that never reads."""

    @classmethod
    def setUpClass(cls):
        cls.ws = Upstream(cls)
        cls.tt = ConfTokentap("upstreams:\n  - name: ws\n    url: %s\n" % cls.ws.up.url +
                              "limits:\n  ws_max_message_size: 1000\n  ws_max_frame_size: 800\n"
                              "timeouts:\n  ws_idle: 700ms\n")
        harness._add_cleanup(cls, lambda: harness._stop_and_check(cls.tt))

    def setUp(self):
        self.ws.mode, self.ws.script, self.ws.got = "echo", b"", bytearray()
        self.ws.done.clear()

    def test_fragmented_message_over_limit_1009(self):
        s, _ = handshake(self.tt.port)
        m = b"\x01\x01\x01\x01"
        s.sendall(frame(1, b"a" * 600, m, fin=False) + frame(9, b"", m) + frame(0, b"b" * 600, m))
        got = read_until_close(s)
        s.close()
        codes = close_frames(got)
        self.assertEqual(codes[-1][0], 1009, codes)
        self.assertIn("tokentap", codes[-1][1])

    def test_idle_1008(self):
        s, _ = handshake(self.tt.port, extra=b"x-request-id: it-ws-idle\r\n")
        t0 = time.monotonic()
        got = read_until_close(s)
        s.close()
        el = time.monotonic() - t0
        self.assertEqual(close_frames(got)[-1], (1008, "tokentap: idle timeout"))
        self.assertGreater(el, 0.6)
        self.assertLess(el, 3)
        e = self.log_entry(self.tt.log_path, "it-ws-idle")
        self.assertEqual((e["status"], e["error"]), (101, "timeout"))
        self.assertGreaterEqual(e["e2e_ms"], 690)  # the session, not the handshake
        self.assertLess(e["ttfb_ms"], 500)

    def test_client_never_reads(self):
        self.ws.mode = "flood"
        s, _ = handshake(self.tt.port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        t0 = time.monotonic()
        rss0 = self.tt.rss_kib()
        # never read: the upstream pauses behind us, then the idle deadline cuts both
        self.assertTrue(self.ws.done.wait(6), "the upstream was not cut")
        self.assertLess(time.monotonic() - t0, 5)
        s.close()
        if rss0 is not None:
            self.assertLess(self.tt.rss_kib() - rss0, 64 << 10)


if __name__ == "__main__":
    harness.unittest.main()
