"""harness_upstream.py — small fake upstreams written in Python for
behaviours the simulator does not have (never answering, resetting
mid-stream, irregular inter-token gaps, a full accept queue): a threaded
HTTP server that hands each request to a test's handler, the request reader
it uses, and helpers to read a request's "stream" flag, write a JSON answer
or SSE chunks, or close with RST.

Invariants: only 127.0.0.1 is bound; every loop is bounded in both
iterations and time; every thread started here is joined by stop().
"""

import json
import select
import socket
import struct
import threading
import time

from harness_http import LOOPBACK, header_of
from harness_proc import _add_cleanup


# --------------------------------------------------------------------------
# fake upstreams


class Request:
    def __init__(self, method, path, headers, body):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body

    def header(self, name, default=None):
        return header_of(self.headers, name, default)


def read_request(sock, state):
    """Reads one request (Content-Length or chunked body) from a blocking
    socket; `state` is a bytearray carried between calls. None at EOF."""
    def fill():
        data = sock.recv(65536)
        if not data:
            return False
        state.extend(data)
        return True

    for _ in range(10000):
        i = state.find(b"\r\n\r\n")
        if i >= 0:
            break
        if not fill():
            return None
    else:
        return None
    head = bytes(state[:i]).decode("latin-1").split("\r\n")
    del state[: i + 4]
    method, path, _ = head[0].split(" ", 2)
    headers = []
    for h in head[1:]:
        k, _, v = h.partition(":")
        headers.append((k.strip().lower(), v.strip()))
    hd = dict(headers)
    body = b""
    if "chunked" in hd.get("transfer-encoding", "").lower():
        for _ in range(100000):
            for _ in range(10000):
                j = state.find(b"\r\n")
                if j >= 0:
                    break
                if not fill():
                    return None
            size = int(bytes(state[:j]).split(b";")[0], 16)
            del state[: j + 2]
            for _ in range(100000):
                if len(state) >= size + 2:
                    break
                if not fill():
                    return None
            if size == 0:
                del state[:2]
                break
            body += bytes(state[:size])
            del state[: size + 2]
    else:
        n = int(hd.get("content-length", "0"))
        for _ in range(100000):
            if len(state) >= n:
                break
            if not fill():
                return None
        body = bytes(state[:n])
        del state[:n]
    return Request(method, path, headers, body)


def accept_loop(lsock, stop_event, deadline_s, on_accept, timeout):
    """Accepts on `lsock` (a listening socket with a short timeout) until
    `stop_event` is set, the socket is closed or `deadline_s` seconds have
    passed; each connection, with TCP_NODELAY and a `timeout` s socket
    timeout, goes to on_accept(sock)."""
    deadline = time.monotonic() + deadline_s
    while not stop_event.is_set() and time.monotonic() < deadline:
        try:
            s, _ = lsock.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        on_accept(s)


class FakeUpstream:
    """A tiny threaded HTTP server on 127.0.0.1:0. `handler(sock, req, ctx)`
    writes a response; it returns True to keep the connection for another
    request. `ctx` is this object (its `stop_event` tells handlers to quit).
    With `tls` (a server-side ssl.SSLContext) it speaks HTTPS.

    The defaults suit a test; a long run (tests/soak) sets the rest:
    `deadline_s`, how long it accepts connections; `max_requests`, per
    connection; `keep_requests=False` not to keep every request in
    .requests; `forget_closed=True` to drop closed connections from .conns
    and finished threads from .threads, so neither grows with the run."""

    def __init__(self, handler, backlog=64, tls=None, deadline_s=300, max_requests=1000, keep_requests=True,
                 forget_closed=False):
        self.handler = handler
        self.tls = tls
        self.deadline_s = deadline_s
        self.max_requests = max_requests
        self.keep_requests = keep_requests
        self.forget_closed = forget_closed
        self.stop_event = threading.Event()
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((LOOPBACK, 0))
        self.lsock.listen(backlog)
        self.lsock.settimeout(0.05)
        self.port = self.lsock.getsockname()[1]
        self.url = "%s://%s:%d" % ("https" if tls else "http", LOOPBACK, self.port)
        self.conns = []
        self.threads = []
        self.requests = []
        self.errors = []
        self.lock = threading.Lock()
        self.accepted = 0
        self.thread = threading.Thread(target=self._accept_loop, name="fake-upstream", daemon=True)
        self.thread.start()

    def _accept_loop(self):
        accept_loop(self.lsock, self.stop_event, self.deadline_s, self._accepted, 30)

    def _accepted(self, s):
        with self.lock:
            self.accepted += 1
            self.conns.append(s)
            t = threading.Thread(target=self._serve, args=(s,), daemon=True)
            if self.forget_closed:
                self.threads = [x for x in self.threads if x.is_alive()]
            self.threads.append(t)
        t.start()

    def _serve(self, s):
        state = bytearray()
        try:
            if self.tls is not None:
                raw, s = s, self.tls.wrap_socket(s, server_side=True)
                with self.lock:  # stop() shuts down the socket in use
                    self.conns[self.conns.index(raw)] = s
            for _ in range(self.max_requests):
                if self.stop_event.is_set():
                    break
                req = read_request(s, state)
                if req is None:
                    break
                if self.keep_requests:
                    with self.lock:
                        self.requests.append(req)
                if not self.handler(s, req, self):
                    break
        except OSError:
            pass
        except Exception as e:  # surfaced by tests through .errors
            self.errors.append(repr(e))
        finally:
            if self.forget_closed:
                with self.lock:
                    if s in self.conns:
                        self.conns.remove(s)
            try:
                s.close()
            except OSError:
                pass

    def stop(self):
        self.stop_event.set()
        try:
            self.lsock.close()
        except OSError:
            pass
        self.thread.join(2)
        with self.lock:
            conns = list(self.conns)
            threads = list(self.threads)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(2)


def start_fake_upstream(test, handler, tls=None):
    fu = FakeUpstream(handler, tls=tls)
    _add_cleanup(test, fu.stop)
    return fu


def wants_stream(req):
    """Whether a request's JSON body says "stream": true (False for a body
    that is not JSON)."""
    try:
        return bool(json.loads(req.body or b"{}").get("stream"))
    except ValueError:
        return False


def send_json(sock, obj):
    """A 200 answer of `obj` as JSON with a Content-Length, the connection
    kept."""
    body = json.dumps(obj).encode()
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))


def send_chunk(sock, data):
    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))


def send_sse_head(sock, extra=b""):
    sock.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" + extra + b"\r\n"
    )


def send_chat_stream(sock, gap_s=0.0):
    """A streamed chat answer after its SSE head: tokens a, b, c (`gap_s`
    before each), then usage of 7 prompt tokens (4 cached) and 3 completion
    tokens, [DONE] and the last chunk."""
    for t in ("a", "b", "c"):
        if gap_s:
            time.sleep(gap_s)
        send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"%s"},'
                         b'"finish_reason":null}]}\n\n' % t.encode())
    send_chunk(sock, b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
                     b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n')
    send_chunk(sock, b"data: [DONE]\n\n")
    sock.sendall(b"0\r\n\r\n")


def reset_socket(sock):
    """Closes with RST."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Blackhole:
    """A listener whose accept queue is full, so that further connection
    attempts hang in SYN-SENT (Linux drops SYNs to a full queue): a way to get
    a connect timeout on loopback."""

    def __init__(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.bind((LOOPBACK, 0))
        self.lsock.listen(0)
        self.port = self.lsock.getsockname()[1]
        self.url = "http://%s:%d" % (LOOPBACK, self.port)
        self.fillers = []
        # Fill the queue until a connect no longer completes promptly.
        for _ in range(8):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            self.fillers.append(c)
            c.connect_ex((LOOPBACK, self.port))
            _, w, _ = select.select([], [c], [], 0.2)
            if not w:
                break
        else:
            self.stop()
            raise RuntimeError("could not fill the accept queue")

    def stop(self):
        for c in self.fillers:
            c.close()
        self.fillers = []
        self.lsock.close()
