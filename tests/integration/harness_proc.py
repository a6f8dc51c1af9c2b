"""harness_proc.py — the processes of the integration tests: tokentap and
tokentap-sim started on ephemeral loopback ports, waited for until their
ready lines, and always stopped again (by PID, bounded waits), a test failing
when one exits uncleanly or a sanitizer reported anything; the command line
run to completion (run_cli); /proc readers for process state, CPU time and
open file descriptors (the leak checks); polling (wait_until).

Invariants: every process started here is registered for cleanup the moment
it exists; only processes started here are signalled; every loop is bounded
in both iterations and time.

Binaries come from TOKENTAP_BIN, TOKENTAP_SIM_BIN and TOKENTAP_BENCH_BIN
(set by ctest), else from build/.
"""

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from harness_http import LOOPBACK, HttpConn, exchange

READY_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 3.0


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

    def __init__(self, argv, ready_re, name, cwd=None, stdout_path=None, env=None, rlimit_nofile=None,
                 expect_exit=()):
        """rlimit_nofile: (soft, hard) descriptor limits the child starts
        with, set between fork and exec; None: this process's own.
        expect_exit: exit statuses (Popen's returncode: -N for signal N)
        the test means this process to end with, besides a clean exit on
        SIGTERM; any other ending fails the test at its cleanup."""
        self.argv = list(argv)
        self.name = name
        self.cwd = cwd
        self.expected_exits = set(expect_exit)
        self.forced = False
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

    def expect_exit(self, *statuses):
        """Says that the test means this process to end with one of
        `statuses` (returncode values: 1 for exit(1), -9 for SIGKILL), so
        that the cleanup does not fail it for that."""
        self.expected_exits.update(statuses)

    def kill(self, sig=signal.SIGKILL, timeout=5.0):
        """Sends `sig` on purpose (a crash test) and waits up to `timeout`
        s for the process to end; dying of it is then expected. Returns
        the exit status."""
        self.expect_exit(-sig)
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        return self.proc.wait(timeout)

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
                self.forced = True
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
        start_in_workdir(self, [tokentap_bin(), "--upstream", upstream, "--listen", LOOPBACK + ":0"] + args,
                         stdout_path=stdout_path, rlimit_nofile=rlimit_nofile)


def start_in_workdir(proc, argv, **kwargs):
    """Starts `proc`, a Process (a subclass's instance in its __init__)
    with `proc.workdir` already made, as tokentap running `argv` in that
    directory (removed when it does not start; Process's keyword arguments
    in kwargs); fails unless it listens on the loopback; sets proc.port."""
    try:
        Process.__init__(proc, argv, r"listening on ([0-9.]+):(\d+)", "tokentap", cwd=proc.workdir, **kwargs)
    except BaseException:
        shutil.rmtree(proc.workdir, ignore_errors=True)
        raise
    if proc.match.group(1) != LOOPBACK:
        proc.stop()
        raise RuntimeError("tokentap listens on %s, expected %s" % (proc.match.group(1), LOOPBACK))
    proc.port = int(proc.match.group(2))


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


def _status_text(rc):
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return "killed by %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    return "exit status %d" % rc


def _stop_and_check(tt):
    """Stops a process and fails the test (from its cleanup) when it did not
    exit cleanly on SIGTERM, when it had ended before with a status the test
    did not declare (Process.expect_exit, Process.kill: a crash, an abort, a
    failed CHECK() mid-test), or when a sanitizer reported anything."""
    was_alive = tt.alive()
    tt.stop()
    rc = tt.proc.returncode
    with tt._lock:
        lines = list(tt.lines)
    san = [i for i, line in enumerate(lines) if SANITIZER_RE.search(line)]
    if san:
        raise AssertionError("%s sanitizer report (exit status %r):\n%s"
                             % (tt.name, rc, "\n".join(lines[san[0]:san[0] + 60])))
    clean = (0, -signal.SIGTERM)
    if was_alive and rc not in clean:
        raise AssertionError("%s (pid %d) %s on SIGTERM at the test's end (-9: it had to be killed); "
                             "stderr tail:\n%s" % (tt.name, tt.pid, _status_text(rc), "\n".join(lines[-30:])))
    expected = getattr(tt, "expected_exits", set())
    if not was_alive and rc not in clean and rc not in expected:
        how = "did not stop on SIGTERM and was killed" if getattr(tt, "forced", False) else "ended during the test"
        raise AssertionError("%s (pid %d) %s: %s, which the test did not expect (Process.expect_exit / "
                             "Process.kill declare it); stderr tail:\n%s"
                             % (tt.name, tt.pid, how, _status_text(rc), "\n".join(lines[-30:])))


NO_ROOT_ENV = "TOKENTAP_TEST_NO_ROOT"


def require_root_feature(test, why_not):
    """For a test that needs what only root has (a network namespace, a
    tmpfs mount): returns when `why_not` is None; else fails the test
    saying why, unless TOKENTAP_TEST_NO_ROOT=1 (or the older
    TOKENTAP_TEST_NO_MOUNT=1) asks to skip it knowingly, which run_suite.py
    then reports to ctest as a skip."""
    if why_not is None:
        return
    if os.environ.get(NO_ROOT_ENV) == "1" or os.environ.get("TOKENTAP_TEST_NO_MOUNT") == "1":
        test.skipTest("%s; %s=1 asked to skip" % (why_not, NO_ROOT_ENV))
    test.fail("%s. Run as root, or set %s=1 to skip this test knowingly" % (why_not, NO_ROOT_ENV))


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


def accepted_connections(pid, port):
    """How many connections to loopback `port` the process `pid` has
    accepted and holds (its fds whose TCP socket has that local port and is
    established): what a test waits for instead of sleeping until a server
    has taken its clients."""
    tcp = tcp_sockets()
    n = 0
    for t in fd_targets(pid).values():
        m = re.match(r"^socket:\[(\d+)\]$", t)
        if m and tcp.get(m.group(1), "").startswith("%s:%d -> " % (LOOPBACK, port)) and \
                tcp[m.group(1)].endswith(" ESTABLISHED"):
            n += 1
    return n


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
