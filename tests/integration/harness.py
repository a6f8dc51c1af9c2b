"""harness.py — shared machinery for tokentap's black-box integration tests.

Starts tokentap and tokentap-sim on ephemeral loopback ports, waits for their
ready lines, and always stops them again (by PID, bounded waits). Provides a
raw-socket HTTP/1.1 client that timestamps body bytes as they arrive (so that
TTFT and ITL measured by the test are not distorted by client-side buffering),
a post-hoc SSE / NDJSON framer over those timestamped bytes, a client-side
token-event classifier mirroring docs/metrics.md, and small fake upstreams
written in Python for behaviours the simulator does not have (never answering,
resetting mid-stream, irregular inter-token gaps, a full accept queue).

Invariants: only 127.0.0.1 is ever bound or connected to; every loop is
bounded in both iterations and time; every process and thread started here is
registered for cleanup the moment it exists.

Binaries come from TOKENTAP_BIN and TOKENTAP_SIM_BIN (set by ctest).
"""

import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

LOOPBACK = "127.0.0.1"

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 3.0
IO_TIMEOUT_S = 10.0


def _binary(env_name, fallback_name):
    path = os.environ.get(env_name)
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for build in ("build",):
        for sub in ("", "contrib/sim"):
            cand = os.path.join(root, build, sub, fallback_name)
            if os.access(cand, os.X_OK):
                return cand
    raise RuntimeError("%s is not set and %s was not found under build/" % (env_name, fallback_name))


def tokentap_bin():
    return _binary("TOKENTAP_BIN", "tokentap")


def bench_bin():
    """tokentap-bench: TOKENTAP_BENCH_BIN, else beside the simulator in the
    build tree (contrib/bench/ next to contrib/sim/)."""
    path = os.environ.get("TOKENTAP_BENCH_BIN")
    if path:
        return path
    sim = sim_bin()
    cand = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sim))), "bench", "tokentap-bench")
    if os.access(cand, os.X_OK):
        return cand
    raise RuntimeError("tokentap-bench not found at %s; set TOKENTAP_BENCH_BIN" % cand)


def is_sanitized(path=None):
    """True for a binary built with AddressSanitizer (it calls __asan_init);
    tokentap's by default."""
    with open(path or tokentap_bin(), "rb") as f:
        return b"__asan_init" in f.read()


def sim_bin():
    return _binary("TOKENTAP_SIM_BIN", "tokentap-sim")


def now_ns():
    return time.monotonic_ns()


ADMIN_RE = re.compile(r"admin listening on ([0-9.]+):(\d+)")


def admin_port(tt, timeout=5.0):
    """The admin port from tokentap's `admin listening on` line (logged just
    after the proxy's own ready line)."""
    found = []

    def check():
        for line in tt.stderr_text().split("\n"):
            m = ADMIN_RE.search(line)
            if m:
                found.append(int(m.group(2)))
                return True
        return False

    if not wait_until(check, timeout, 0.02):
        raise AssertionError("no 'admin listening on' line; stderr:\n%s" % tt.stderr_text())
    return found[0]


def _stat_state(path):
    """The state letter (R, S, T, Z, ...) in a /proc stat file."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def process_state(pid):
    """pid's state letter, or None when there is no such process."""
    try:
        return _stat_state("/proc/%d/stat" % pid)
    except FileNotFoundError:
        return None


def cpu_seconds(pid):
    """User plus system CPU time `pid` has used so far, all threads, in
    seconds (utime and stime in /proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_threads_stopped(pid):
    """Whether every thread of `pid` is in the stopped state (after SIGSTOP)."""
    tasks = os.listdir("/proc/%d/task" % pid)
    for t in tasks:
        if _stat_state("/proc/%d/task/%s/stat" % (pid, t)) not in ("T", "t"):
            return False
    return bool(tasks)


# --------------------------------------------------------------------------
# processes


def _nofile_setter(limits):
    """A preexec_fn that sets RLIMIT_NOFILE to `limits` (soft, hard), or
    None for none."""
    if limits is None:
        return None

    def setter():
        resource.setrlimit(resource.RLIMIT_NOFILE, tuple(limits))

    return setter


class Process:
    """A child process whose stderr is drained by a thread (so a chatty child
    never blocks on a full pipe) and kept for diagnostics."""

    def __init__(self, argv, ready_re, name, cwd=None, stdout_path=None, env=None, rlimit_nofile=None):
        """rlimit_nofile: (soft, hard) descriptor limits the child starts
        with, set between fork and exec; None: this process's own."""
        self.argv = list(argv)
        self.name = name
        self.cwd = cwd
        self.lines = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        out = open(stdout_path, "wb") if stdout_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.PIPE,
                start_new_session=True,
                cwd=cwd,
                env=env,
                preexec_fn=_nofile_setter(rlimit_nofile),
            )
        finally:
            if stdout_path:
                out.close()
        self.pid = self.proc.pid
        self._reader = threading.Thread(target=self._drain, name=name + "-stderr", daemon=True)
        self._reader.start()
        self.match = None
        if ready_re is not None:
            self.match = self._wait_ready(re.compile(ready_re))

    def _drain(self):
        stream = self.proc.stderr
        while True:
            line = stream.readline()
            if not line:
                break
            with self._cond:
                self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait_ready(self, rx):
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen = 0
        with self._cond:
            for _ in range(100000):
                while seen < len(self.lines):
                    m = rx.search(self.lines[seen])
                    seen += 1
                    if m:
                        return m
                if self.proc.poll() is not None and not self._reader.is_alive():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.1))
        rc = self.proc.poll()
        self.stop()
        raise RuntimeError(
            "%s did not become ready (exit status %r); argv=%r; stderr:\n%s"
            % (self.name, rc, self.argv, self.stderr_text())
        )

    def stderr_text(self):
        with self._lock:
            return "\n".join(self.lines[-200:])

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM, bounded wait, then SIGKILL. Safe to call twice."""
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
        self._reader.join(STOP_TIMEOUT_S)
        if self.proc.stderr is not None and not self._reader.is_alive():
            self.proc.stderr.close()
        workdir = getattr(self, "workdir", None)
        if workdir and self.proc.poll() is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def rss_kib(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS for pid %d" % self.pid)


class Sim(Process):
    def __init__(self, *args):
        super().__init__(
            [sim_bin(), "--listen", LOOPBACK + ":0"] + [str(a) for a in args],
            r"^tokentap-sim listening on 127\.0\.0\.1:(\d+)$",
            "tokentap-sim",
        )
        self.port = int(self.match.group(1))
        self.url = "http://%s:%d" % (LOOPBACK, self.port)

    def stats(self):
        return sim_stats(self.port)


def sim_stats(port):
    """GET /sim/stats from the simulator on `port`, as a dict."""
    conn = HttpConn(port)
    try:
        conn.send(b"GET /sim/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        resp = conn.read_response()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError("GET /sim/stats: status %d" % resp.status)
    return json.loads(resp.body)


class Tokentap(Process):
    """tokentap in a fresh temporary working directory of its own, so that
    whatever it writes relative to it by default (its data directory) neither
    lands in the source tree nor is shared between instances."""

    def __init__(self, upstream, *args, stdout_path=None, rlimit_nofile=None):
        args = [str(a) for a in args]
        if "--admin" not in args and "--admin" in tokentap_help():
            # A fixed default admin port would collide between the instances
            # that tests run side by side; tests that want it pass --admin.
            args += ["--admin", "off"]
        self.workdir = tempfile.mkdtemp(prefix="tokentap-it-")
        try:
            super().__init__(
                [tokentap_bin(), "--upstream", upstream, "--listen", LOOPBACK + ":0"] + args,
                r"listening on ([0-9.]+):(\d+)",
                "tokentap",
                cwd=self.workdir,
                stdout_path=stdout_path,
                rlimit_nofile=rlimit_nofile,
            )
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        if self.match.group(1) != LOOPBACK:
            self.stop()
            raise RuntimeError("tokentap listens on %s, expected %s" % (self.match.group(1), LOOPBACK))
        self.port = int(self.match.group(2))


_help_text = None


def tokentap_help():
    """tokentap --help, cached."""
    global _help_text
    if _help_text is None:
        _help_text = run_cli(["--help"]).stdout
    return _help_text


def start_sim(test, *args):
    """Starts a simulator and registers its cleanup on `test` (a TestCase
    instance, or a TestCase class inside setUpClass)."""
    sim = Sim(*args)
    _add_cleanup(test, lambda: _stop_and_check(sim))
    return sim


def start_tokentap(test, upstream, *args, stdout_path=None, rlimit_nofile=None):
    tt = Tokentap(upstream, *args, stdout_path=stdout_path, rlimit_nofile=rlimit_nofile)
    _add_cleanup(test, lambda: _stop_and_check(tt))
    return tt


SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Thread|Memory)Sanitizer|runtime error:")


def _stop_and_check(tt):
    """Stops a process and fails the test (from its cleanup) when it did not
    exit cleanly on SIGTERM or a sanitizer reported anything."""
    was_alive = tt.alive()
    tt.stop()
    rc = tt.proc.returncode
    with tt._lock:
        lines = list(tt.lines)
    san = [i for i, line in enumerate(lines) if SANITIZER_RE.search(line)]
    if san:
        raise AssertionError("%s sanitizer report (exit status %r):\n%s"
                             % (tt.name, rc, "\n".join(lines[san[0]:san[0] + 60])))
    if was_alive and rc not in (0, -signal.SIGTERM):
        raise AssertionError("%s exited with status %r on SIGTERM (-9: it had to be killed); stderr tail:\n%s"
                             % (tt.name, rc, "\n".join(lines[-30:])))
    if not was_alive and rc not in (0, -signal.SIGTERM, -signal.SIGKILL):
        # A crash mid-test shows up as connection errors; make its cause visible.
        print("\n[harness] %s exited early with status %r; stderr tail:\n%s" % (tt.name, rc, "\n".join(lines[-30:])))


def _add_cleanup(test, fn):
    if isinstance(test, type):
        test.addClassCleanup(fn)
    else:
        test.addCleanup(fn)


def temp_path(test, suffix=".log"):
    """An empty temporary file for a process to write (an access log, a
    stdout), removed when `test` (a TestCase or its class) is done."""
    fd, path = tempfile.mkstemp(prefix="tokentap-it-", suffix=suffix)
    os.close(fd)
    _add_cleanup(test, lambda: os.path.exists(path) and os.unlink(path))
    return path


def run_cli(args, timeout=10.0, cwd=None):
    """Runs tokentap to completion in `cwd`, by default a temporary working
    directory removed afterwards; returns CompletedProcess (text)."""
    if cwd is None:
        with tempfile.TemporaryDirectory(prefix="tokentap-it-") as tmp:
            return run_cli(args, timeout, tmp)
    return subprocess.run(
        [tokentap_bin()] + list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=timeout,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )


def free_port():
    """A loopback port that nothing listens on (bound, then closed)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def wait_until(pred, timeout=5.0, interval=0.01):
    """Polls pred() until truthy or timeout; returns the last value."""
    deadline = time.monotonic() + timeout
    value = None
    for _ in range(int(timeout / interval) + 2):
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
    return value


# --------------------------------------------------------------------------
# open file descriptors: leak checks

_TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
               7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}


def fd_targets(pid):
    """{fd number: what it points to} from /proc/PID/fd: "socket:[INODE]",
    "pipe:[INODE]", "anon_inode:[eventpoll]" or a path. An fd that closes
    while the directory is being read is left out."""
    d = "/proc/%d/fd" % pid
    out = {}
    for name in os.listdir(d):
        try:
            out[int(name)] = os.readlink(os.path.join(d, name))
        except (FileNotFoundError, ValueError):
            pass
    return out


def fd_count(pid):
    """How many file descriptors the process has open now."""
    return len(os.listdir("/proc/%d/fd" % pid))


def tcp_sockets():
    """{socket inode: "LOCAL -> REMOTE STATE"} for the TCP sockets of this
    network namespace (/proc/net/tcp and tcp6), to say what a leaked socket
    was connected to."""
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().split("\n")[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10:
                continue
            out[f[9]] = "%s -> %s %s" % (_proc_net_addr(f[1]), _proc_net_addr(f[2]),
                                         _TCP_STATES.get(int(f[3], 16), f[3]))
    return out


def _proc_net_addr(hexaddr):
    """"0100007F:1F90" (as /proc/net/tcp writes it) -> "127.0.0.1:8080"."""
    ip, port = hexaddr.split(":")
    if len(ip) == 8:  # IPv4, in host (little-endian) byte order
        ip = ".".join(str(int(ip[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        ip = "[v6]"
    return "%s:%d" % (ip, int(port, 16))


def describe_fds(targets):
    """One line per fd of a {fd: target} map, sockets resolved to their
    addresses and TCP state where /proc/net knows them."""
    tcp = tcp_sockets()
    lines = []
    for fd in sorted(targets):
        t = targets[fd]
        m = re.match(r"^socket:\[(\d+)\]$", t)
        if m and m.group(1) in tcp:
            t += " " + tcp[m.group(1)]
        lines.append("fd %d: %s" % (fd, t))
    return lines


def fd_diff(baseline, now):
    """The fds of `now` that `baseline` (both {fd: target}) did not have, and
    those it had that are gone, as readable lines."""
    added = {fd: t for fd, t in now.items() if baseline.get(fd) != t}
    gone = {fd: t for fd, t in baseline.items() if now.get(fd) != t}
    return (["+ " + line for line in describe_fds(added)] +
            ["- " + line for line in describe_fds(gone)])


def wait_fds(pid, want, timeout=5.0, interval=0.02):
    """Polls until the process has exactly `want()` fds open (`want` is an
    int or a callable re-evaluated at every poll, for a target that moves,
    such as a baseline plus the pooled connections tokentap reports).
    Returns (reached, last count, last target)."""
    target = want if callable(want) else (lambda: want)
    deadline = time.monotonic() + timeout
    n = t = None
    for _ in range(int(timeout / interval) + 2):
        t = target()
        n = fd_count(pid)
        if n == t or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return n == t, n, t


def pooled_connections(admin_port):
    """Idle pooled upstream connections tokentap holds now, summed over its
    upstreams (GET /upstreams on its admin API): the fds a leak check must
    allow for on top of an idle baseline."""
    resp, _ = exchange(admin_port, "GET", "/upstreams", headers=[("Connection", "close")])
    if resp is None or resp.status != 200:
        raise RuntimeError("GET /upstreams: %r" % (resp and resp.status))
    return sum(u["pool"]["idle"] for u in json.loads(resp.body)["upstreams"])


# --------------------------------------------------------------------------
# HTTP client over a raw socket


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
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

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

    def _sized(self, resp, n):
        left = n
        for _ in range(1 << 24):
            if left == 0:
                resp.complete = True
                return
            if self._avail() == 0 and not self._fill():
                resp.closed = True
                return
            piece = self._emit_avail(left)
            left -= len(piece[1])
            yield piece
        raise ValueError("body: too many reads")

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
            left = size
            for _ in range(1 << 24):
                if left == 0:
                    break
                if self._avail() == 0 and not self._fill():
                    resp.closed = True
                    return
                piece = self._emit_avail(left)
                left -= len(piece[1])
                yield piece
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


# --------------------------------------------------------------------------
# events: post-hoc framing of timestamped body pieces


class Event:
    __slots__ = ("name", "data", "ts", "end")

    def __init__(self, name, data, ts, end):
        self.name = name  # SSE event name or None
        self.data = data  # str: joined data lines (SSE) or the line (NDJSON)
        self.ts = ts  # ns when the byte completing the event arrived
        self.end = end  # offset in the body just past the event

    def json(self):
        return json.loads(self.data)

    def __repr__(self):
        return "Event(%r, %r)" % (self.name, self.data[:80])


def _ts_at(pieces):
    """Returns f(offset) -> arrival ns of the piece holding byte offset-1."""
    ends = []
    total = 0
    for ts, p in pieces:
        total += len(p)
        ends.append((total, ts))

    def at(off):
        lo, hi = 0, len(ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if ends[mid][0] >= off:
                hi = mid
            else:
                lo = mid + 1
        return ends[lo][1] if ends else None

    return at


_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")


def sse_events(resp):
    """SSE events in order, per the WHATWG framing (a blank line dispatches;
    an event with no data lines is not dispatched)."""
    body = resp.body
    at = _ts_at(resp.pieces)
    events = []
    name, data = None, []
    for m in _LINE.finditer(body):
        line = m.group(1)
        if line == b"":
            if data:
                events.append(Event(name, "\n".join(data), at(m.end()), m.end()))
            name, data = None, []
            continue
        if line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value.decode("utf-8"))
        elif field == b"event":
            name = value.decode("utf-8")
    return events


def ndjson_events(resp):
    body = resp.body
    at = _ts_at(resp.pieces)
    events = []
    off = 0
    for _ in range(len(body) + 1):
        i = body.find(b"\n", off)
        if i < 0:
            break
        line = body[off:i].strip()
        if line:
            events.append(Event(None, line.decode("utf-8"), at(i + 1), i + 1))
        off = i + 1
    tail = body[off:].strip()
    if tail:
        events.append(Event(None, tail.decode("utf-8"), at(len(body)), len(body)))
    return events


def events_of(resp):
    ct = (resp.content_type() or "").lower()
    if "ndjson" in ct:
        return ndjson_events(resp)
    if "event-stream" in ct:
        return sse_events(resp)
    raise ValueError("not a streamed content type: %r" % ct)


# --------------------------------------------------------------------------
# APIs: request bodies, token-bearing events, usage (mirrors docs/metrics.md)

API_PATHS = {
    "openai-chat": "/v1/chat/completions",
    "openai-completions": "/v1/completions",
    "anthropic": "/v1/messages",
    "ollama-chat": "/api/chat",
    "ollama-generate": "/api/generate",
    "openai-responses": "/v1/responses",
}

PROMPT = "Explain, in a few words, why the sky looks blue on a clear afternoon."


def api_body(api, stream=True, include_usage=False, prompt=PROMPT, model="sim-model"):
    if api == "openai-chat":
        b = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": stream}
        if stream and include_usage:
            b["stream_options"] = {"include_usage": True}
    elif api == "openai-completions":
        b = {"model": model, "prompt": prompt, "stream": stream}
        if stream and include_usage:
            b["stream_options"] = {"include_usage": True}
    elif api == "anthropic":
        b = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": prompt}], "stream": stream}
    elif api == "ollama-chat":
        b = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        if not stream:
            b["stream"] = False  # Ollama streams by default
    elif api == "ollama-generate":
        b = {"model": model, "prompt": prompt}
        if not stream:
            b["stream"] = False
    elif api == "openai-responses":
        b = {"model": model, "input": [{"role": "user", "content": prompt}], "stream": stream}
    else:
        raise ValueError(api)
    return b


def sim_headers(ttft=None, itl=None, tokens=None, request_id=None, extra=None):
    h = []
    if ttft is not None:
        h.append(("x-sim-ttft-ms", str(ttft)))
    if itl is not None:
        h.append(("x-sim-itl-ms", str(itl)))
    if tokens is not None:
        h.append(("x-sim-tokens", str(tokens)))
    if request_id is not None:
        h.append(("x-request-id", request_id))
    h.extend(extra or [])
    return h


def _nonempty(v):
    return bool(v)


def is_token_event(api, ev):
    """Client-side mirror of the token-bearing definition in design.md."""
    if api in ("openai-chat", "openai-completions"):
        if ev.data.strip() == "[DONE]":
            return False
        try:
            obj = ev.json()
        except ValueError:
            return False
        for ch in obj.get("choices") or []:
            if api == "openai-completions" and _nonempty(ch.get("text")):
                return True
            d = ch.get("delta") or {}
            if (_nonempty(d.get("content")) or _nonempty(d.get("reasoning_content"))
                    or _nonempty(d.get("reasoning")) or _nonempty(d.get("tool_calls"))):
                return True
            if api == "openai-chat" and _nonempty(ch.get("text")):
                return True
        return False
    if api == "anthropic":
        try:
            obj = ev.json()
        except ValueError:
            return False
        kind = ev.name if ev.name not in (None, "message") else obj.get("type")
        d = obj.get("delta") or {}
        return kind == "content_block_delta" and any(_nonempty(d.get(k)) for k in ("text", "thinking", "partial_json"))
    if api in ("ollama-chat", "ollama-generate"):
        obj = ev.json()
        if api == "ollama-generate":
            return _nonempty(obj.get("response")) or _nonempty(obj.get("thinking"))
        m = obj.get("message") or {}
        return _nonempty(m.get("content")) or _nonempty(m.get("thinking"))
    if api == "openai-responses":
        # docs/metrics.md: the model-output deltas, with a non-empty "delta"
        try:
            obj = ev.json()
        except ValueError:
            return False
        kind = ev.name if ev.name not in (None, "message") else obj.get("type")
        return kind in RESPONSES_TOKEN_EVENTS and isinstance(obj.get("delta"), str) and _nonempty(obj["delta"])
    raise ValueError(api)


RESPONSES_TOKEN_EVENTS = frozenset("response.%s.delta" % k for k in (
    "output_text", "refusal", "audio.transcript", "audio", "reasoning_text", "reasoning_summary_text",
    "function_call_arguments", "custom_tool_call_input", "mcp_call_arguments", "code_interpreter_call_code",
    "shell_call_command"))


def stream_usage(api, events):
    """(input_tokens, output_tokens) as the server reported them in the stream;
    None where absent."""
    inp = out = None
    for ev in events:
        if api in ("openai-chat", "openai-completions"):
            if ev.data.strip() == "[DONE]":
                continue
            u = ev.json().get("usage")
            if u:
                inp = u.get("prompt_tokens", inp)
                out = u.get("completion_tokens", out)
        elif api == "openai-responses":
            obj = ev.json()
            if obj.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                u = (obj.get("response") or {}).get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
        elif api == "anthropic":
            obj = ev.json()
            if obj.get("type") == "message_start":
                u = (obj.get("message") or {}).get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
            elif obj.get("type") == "message_delta":
                u = obj.get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
        else:
            obj = ev.json()
            if obj.get("done"):
                inp = obj.get("prompt_eval_count", inp)
                out = obj.get("eval_count", out)
    return inp, out


def body_usage(api, obj):
    if api in ("openai-chat", "openai-completions"):
        u = obj.get("usage") or {}
        return u.get("prompt_tokens"), u.get("completion_tokens")
    if api in ("anthropic", "openai-responses"):
        u = obj.get("usage") or {}
        return u.get("input_tokens"), u.get("output_tokens")
    return obj.get("prompt_eval_count"), obj.get("eval_count")


# --------------------------------------------------------------------------
# access log


def read_access_log(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for line in data.split(b"\n"):
        line = line.strip()
        if line:
            out.append(json.loads(line))
    return out


def wait_log_entry(path, pred, timeout=5.0):
    """Polls the access log until an entry satisfies pred; returns it or None."""
    found = []

    def check():
        try:
            for e in read_access_log(path):
                if pred(e):
                    found.append(e)
                    return True
        except ValueError:
            return False  # a line being written right now
        return False

    wait_until(check, timeout, 0.02)
    return found[0] if found else None


# --------------------------------------------------------------------------
# fake upstreams


class Request:
    def __init__(self, method, path, headers, body):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default


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


class FakeUpstream:
    """A tiny threaded HTTP server on 127.0.0.1:0. `handler(sock, req, ctx)`
    writes a response; it returns True to keep the connection for another
    request. `ctx` is this object (its `stop_event` tells handlers to quit).
    With `tls` (a server-side ssl.SSLContext) it speaks HTTPS."""

    def __init__(self, handler, backlog=64, tls=None):
        self.handler = handler
        self.tls = tls
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
        deadline = time.monotonic() + 300
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(30)
            with self.lock:
                self.accepted += 1
                self.conns.append(s)
                t = threading.Thread(target=self._serve, args=(s,), daemon=True)
                self.threads.append(t)
            t.start()

    def _serve(self, s):
        state = bytearray()
        try:
            if self.tls is not None:
                raw, s = s, self.tls.wrap_socket(s, server_side=True)
                with self.lock:  # stop() shuts down the socket in use
                    self.conns[self.conns.index(raw)] = s
            for _ in range(1000):
                if self.stop_event.is_set():
                    break
                req = read_request(s, state)
                if req is None:
                    break
                with self.lock:
                    self.requests.append(req)
                if not self.handler(s, req, self):
                    break
        except OSError:
            pass
        except Exception as e:  # surfaced by tests through .errors
            self.errors.append(repr(e))
        finally:
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


def send_chunk(sock, data):
    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))


def send_sse_head(sock, extra=b""):
    sock.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" + extra + b"\r\n"
    )


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


class TestCase(unittest.TestCase):
    """Adds a few assertion helpers shared by the suites."""

    def assertJsonError(self, resp, status):
        """`status` with a JSON body {"error": {"message": "...", ...}}."""
        self.assertIsNotNone(resp, "connection closed without a response (expected %d)" % status)
        self.assertEqual(resp.status, status, "status; body=%r" % resp.body[:300])
        self.assertIn("json", (resp.content_type() or "").lower(), "error content-type")
        try:
            obj = resp.json()
        except ValueError:
            self.fail("error body is not JSON: %r" % resp.body[:300])
        self.assertIsInstance(obj, dict)
        err = obj.get("error")
        self.assertIsInstance(err, dict, "error body %r" % obj)
        self.assertIsInstance(err.get("message"), str)
        self.assertTrue(err["message"].strip(), "empty error message")
        return obj

    def assertProxyError(self, resp, status):
        """An error tokentap's proxy listener makes itself: as assertJsonError,
        plus the error "type" string of the contract."""
        obj = self.assertJsonError(resp, status)
        self.assertIsInstance(obj["error"].get("type"), str, "error.type %r" % obj)
        self.assertTrue(obj["error"]["type"], "empty error.type")
        return obj

    def assertFdsBack(self, proc, baseline, extra=None, timeout=5.0, what="after the connections closed"):
        """Fails unless `proc` gets back to the fds of `baseline` (a {fd:
        target} map taken from fd_targets when it was idle) within `timeout`
        seconds: a socket left open after its client or upstream went away
        is a leak. `extra()`, when given, is how many more fds are
        legitimately open now (idle pooled upstream connections), re-read at
        every poll. The message lists the fds that differ."""
        count = extra or (lambda: 0)
        ok, n, want = wait_fds(proc.pid, lambda: len(baseline) + count(), timeout)
        if not ok:
            self.fail("%s has %d fds open %s, expected %d (%d at the baseline + %d pooled); "
                      "differences from the baseline:\n%s"
                      % (proc.name, n, what, want, len(baseline), want - len(baseline),
                         "\n".join(fd_diff(baseline, fd_targets(proc.pid)))))
