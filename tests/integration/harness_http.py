"""harness_http.py — the integration tests' HTTP/1.1 client over a raw socket.

HttpConn timestamps every recv the moment it returns (or, with kernel_ts,
with the kernel's receive time), so that TTFT and ITL measured by a test are
not distorted by client-side buffering; Response keeps the body as
(arrival ns, bytes) pieces for the event framer in harness_events.py.
request_bytes serialises a request (Content-Length or chunked) and exchange
runs one on a fresh connection.

This is the lowest of the harness modules (harness.py re-exports them all):
it also holds the loopback address, the client I/O timeout and the monotonic
clock the others use. Invariants: only 127.0.0.1 is connected to; every
read loop is bounded in iterations, every socket has a timeout.
"""

import json
import re
import socket
import struct
import threading
import time

LOOPBACK = "127.0.0.1"

IO_TIMEOUT_S = 10.0


def now_ns():
    return time.monotonic_ns()


# --------------------------------------------------------------------------
# HTTP client over a raw socket


def header_of(headers, name, default=None):
    """The value of the first header `name` (any case) in `headers`, a list
    of (lower-cased name, value); `default` when there is none."""
    name = name.lower()
    for k, v in headers:
        if k == name:
            return v
    return default


class Response:
    def __init__(self):
        self.status = None
        self.reason = ""
        self.version = ""
        self.headers = []  # (lower-cased name, value)
        self.head_ns = None  # when the header block was complete
        self.pieces = []  # (arrival ns, decoded body bytes) as they came
        self.complete = False  # body framing ended properly
        self.closed = False  # peer closed (EOF or reset) while reading
        self.length = 0  # decoded body bytes seen
        self.keep_body = True

    def header(self, name, default=None):
        return header_of(self.headers, name, default)

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    @property
    def body(self):
        return b"".join(p for _, p in self.pieces)

    def json(self):
        return json.loads(self.body)

    def content_type(self):
        return self.header("content-type")


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python does not export it


def realtime_offset_ns():
    """CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few samples."""
    best = None
    for _ in range(20):
        r1 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m = time.monotonic_ns()
        r2 = time.clock_gettime_ns(time.CLOCK_REALTIME)
        if best is None or r2 - r1 < best[0]:
            best = (r2 - r1, (r1 + r2) // 2 - m)
    return best[1]


class HttpConn:
    """One client connection. TCP_NODELAY, blocking with a timeout; every
    recv is timestamped the moment it returns.

    With kernel_ts, a read is timestamped instead with the kernel's receive
    time of its newest segment (SO_TIMESTAMPNS, mapped onto CLOCK_MONOTONIC).
    On loopback that is when the peer wrote it, so the timestamps do not
    include this test process's own wake-up latency on a busy machine."""

    def __init__(self, port, timeout=IO_TIMEOUT_S, rcvbuf=None, kernel_ts=False):
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.kernel_ts = kernel_ts
        self.kernel_ts_used = 0
        if kernel_ts:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self.rt_offset = realtime_offset_ns()
        self.sock.settimeout(timeout)
        self.sock.connect((LOOPBACK, port))
        self.buf = bytearray()
        self.pos = 0
        self.buf_ns = None  # arrival time of the newest bytes in buf
        self.eof = False
        self.reset = False
        self.recv_size = 65536

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def abort(self):
        """Closes with RST (SO_LINGER 0): an impatient client."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send(self, data):
        """Writes everything; returns the monotonic ns just before the first
        byte left."""
        t = now_ns()
        self.sock.sendall(data)
        return t

    def try_send(self, data):
        """Like send, but a peer that closed early (EPIPE/ECONNRESET) is not an
        error here: servers may answer and close before reading a bad request
        to its end."""
        t = now_ns()
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return t

    def send_until_answered(self, pieces, pause, wait_s):
        """Reads the response on a thread while sending `pieces` (bytes
        each, with try_send) `pause` seconds apart, stopping at the first
        piece after the answer came. Returns (the Response, or the exception
        reading it raised, or None when none came within wait_s of the last
        piece; the bytes this call sent)."""
        got = [None]

        def reader():
            try:
                got[0] = self.read_response()
            except Exception as e:  # the caller reports it
                got[0] = e

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        sent = 0
        for piece in pieces:
            if not t.is_alive():
                break
            self.try_send(piece)
            sent += len(piece)
            time.sleep(pause)
        t.join(wait_s)
        return (None if t.is_alive() else got[0]), sent

    def _fill(self):
        """Reads once. Returns False at EOF/reset."""
        if self.eof:
            return False
        try:
            if self.kernel_ts:
                data, anc, _, _ = self.sock.recvmsg(self.recv_size, socket.CMSG_SPACE(16))
            else:
                data = self.sock.recv(self.recv_size)
        except ConnectionResetError:
            self.eof = self.reset = True
            return False
        self.buf_ns = now_ns()
        if self.kernel_ts and data:
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    kts = sec * 1000000000 + nsec - self.rt_offset
                    if kts <= self.buf_ns:
                        self.buf_ns = kts
                        self.kernel_ts_used += 1
        if not data:
            self.eof = True
            return False
        if self.pos and self.pos == len(self.buf):
            self.buf = bytearray()
            self.pos = 0
        elif self.pos > (1 << 20):
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data
        return True

    def _avail(self):
        return len(self.buf) - self.pos

    def _take(self, n):
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def _readline(self, limit=1 << 20):
        for _ in range(1 << 20):
            i = self.buf.find(b"\n", self.pos)
            if i >= 0:
                return self._take(i + 1 - self.pos)
            if self._avail() > limit:
                raise ValueError("line too long")
            if not self._fill():
                return None
        raise ValueError("readline: too many reads")

    def read_head(self, resp=None):
        """Reads a status line and headers (skipping 1xx). Returns a Response,
        or None when the peer closed before a status line."""
        resp = resp or Response()
        for _ in range(16):
            line = self._readline()
            if line is None:
                resp.closed = True
                return None if resp.status is None else resp
            m = re.match(rb"^(HTTP/\d\.\d) (\d{3})(?: ([^\r\n]*))?\r?\n$", line)
            if not m:
                raise ValueError("bad status line %r" % line[:200])
            resp.version = m.group(1).decode()
            resp.status = int(m.group(2))
            resp.reason = (m.group(3) or b"").decode("latin-1")
            resp.headers = []
            for _ in range(1000):
                h = self._readline()
                if h is None:
                    raise ValueError("EOF inside response headers")
                if h in (b"\r\n", b"\n"):
                    break
                name, sep, value = h.decode("latin-1").partition(":")
                if not sep:
                    raise ValueError("bad header line %r" % h[:200])
                resp.headers.append((name.strip().lower(), value.strip()))
            resp.head_ns = self.buf_ns
            if 100 <= resp.status < 200 and resp.status != 101:
                continue
            return resp
        raise ValueError("too many 1xx responses")

    def body_reader(self, resp, method="POST"):
        """Generator over the body: yields (arrival ns, decoded bytes) pieces as
        they arrive. Sets resp.complete when the framing ends properly."""
        if method == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200:
            resp.complete = True
            return
        te = (resp.header("transfer-encoding") or "").lower()
        cl = resp.header("content-length")
        if "chunked" in te:
            yield from self._chunked(resp)
        elif cl is not None:
            yield from self._sized(resp, int(cl))
        else:
            yield from self._until_close(resp)

    def _emit_avail(self, n):
        n = min(n, self._avail())
        if n <= 0:
            return None
        return (self.buf_ns, self._take(n))

    def _next_bytes(self, resp, n):
        """Yields the next n body bytes as they come; returns True, or
        False (resp.closed set) when the peer closed first."""
        left = n
        for _ in range(1 << 24):
            if left == 0:
                return True
            if self._avail() == 0 and not self._fill():
                resp.closed = True
                return False
            piece = self._emit_avail(left)
            left -= len(piece[1])
            yield piece
        raise ValueError("body: too many reads")

    def _sized(self, resp, n):
        if (yield from self._next_bytes(resp, n)):
            resp.complete = True

    def _until_close(self, resp):
        for _ in range(1 << 24):
            if self._avail() == 0 and not self._fill():
                resp.closed = True
                resp.complete = True  # close-delimited: EOF is the end
                return
            yield self._emit_avail(self._avail())
        raise ValueError("body: too many reads")

    def _chunked(self, resp):
        for _ in range(1 << 24):
            line = self._readline()
            if line is None:
                resp.closed = True
                return
            size_txt = line.split(b";", 1)[0].strip()
            if not re.match(rb"^[0-9a-fA-F]+$", size_txt):
                raise ValueError("bad chunk size line %r" % line[:100])
            size = int(size_txt, 16)
            if size == 0:
                for _ in range(1000):  # trailers
                    t = self._readline()
                    if t is None:
                        resp.closed = True
                        return
                    if t in (b"\r\n", b"\n"):
                        resp.complete = True
                        return
                raise ValueError("too many trailers")
            if not (yield from self._next_bytes(resp, size)):
                return
            for _ in range(4):
                if self._avail() >= 2 or not self._fill():
                    break
            crlf = self._take(min(2, self._avail()))
            if crlf != b"\r\n":
                if self.eof and crlf in (b"", b"\r"):
                    resp.closed = True
                    return
                raise ValueError("chunk not followed by CRLF: %r" % crlf)
        raise ValueError("too many chunks")

    def read_response(self, method="POST", keep_body=True, hasher=None):
        """Reads one whole response. Returns None when the peer closed before
        sending a status line."""
        resp = self.read_head()
        if resp is None:
            return None
        self.read_body(resp, method, keep_body, hasher)
        return resp

    def read_body(self, resp, method="POST", keep_body=True, hasher=None):
        resp.keep_body = keep_body
        for ts, piece in self.body_reader(resp, method):
            resp.length += len(piece)
            if hasher is not None:
                hasher.update(piece)
            if keep_body:
                resp.pieces.append((ts, piece))
        return resp

    def wait_closed(self, timeout=2.0):
        """True when the peer closes (EOF or reset) within `timeout`; any bytes
        that arrive meanwhile are discarded and counted in self.extra."""
        self.extra = b""
        deadline = time.monotonic() + timeout
        if self._avail():
            self.extra += self._take(self._avail())
        for _ in range(10000):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.extra += data
        return False


def answer_on_connect(port, timeout=3.0):
    """Connects and, sending nothing, reads what the server says until it
    closes (at most 100 reads): the bytes, e.g. an over-the-cap 503."""
    s = socket.create_connection((LOOPBACK, port), timeout=timeout)
    data = b""
    try:
        for _ in range(100):
            d = s.recv(4096)
            if not d:
                break
            data += d
    finally:
        s.close()
    return data


def request_bytes(method, path, body=None, headers=None, port=None, chunked=None):
    """Serialises one request. `chunked` is a list of chunk sizes to split the
    body into (Transfer-Encoding: chunked); otherwise Content-Length is used
    when there is a body."""
    headers = list((headers or {}).items()) if isinstance(headers, dict) else list(headers or [])
    if isinstance(body, (dict, list)):
        body = json.dumps(body, separators=(",", ":")).encode()
    elif isinstance(body, str):
        body = body.encode()
    names = {k.lower() for k, _ in headers}
    lines = ["%s %s HTTP/1.1" % (method, path)]
    if "host" not in names:
        lines.append("Host: 127.0.0.1" + (":%d" % port if port else ""))
    if body is not None and "content-type" not in names:
        lines.append("Content-Type: application/json")
    payload = b""
    if body is not None:
        if chunked:
            lines.append("Transfer-Encoding: chunked")
            off = 0
            parts = []
            for size in chunked:
                part = body[off : off + size]
                off += size
                if part:
                    parts.append(b"%x\r\n%s\r\n" % (len(part), part))
            if off < len(body):
                rest = body[off:]
                parts.append(b"%x\r\n%s\r\n" % (len(rest), rest))
            parts.append(b"0\r\n\r\n")
            payload = b"".join(parts)
        elif "content-length" not in names:
            lines.append("Content-Length: %d" % len(body))
            payload = body
        else:
            payload = body
    for k, v in headers:
        lines.append("%s: %s" % (k, v))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def exchange(port, method, path, body=None, headers=None, timeout=IO_TIMEOUT_S, chunked=None):
    """One request on a fresh connection; returns (Response, send ns)."""
    conn = HttpConn(port, timeout=timeout)
    try:
        t0 = conn.send(request_bytes(method, path, body, headers, port, chunked))
        resp = conn.read_response(method)
        return resp, t0
    finally:
        conn.close()
