"""routing_helpers.py — shared machinery for the configuration and routing
suites (test_config.py, test_routes.py), on top of harness.py.

tokentap started from a YAML file (`-c`) in a temporary directory of its
own, with the settings every test needs prepended (an ephemeral loopback
listener, the admin API and the stats store off, an access log in that
directory); rewriting that file and sending SIGHUP / SIGTERM; running
`tokentap -t -c` on a file; counting each simulator's requests; sending many
small requests in a bounded loop.

Same rules as harness.py: loopback only, every loop bounded in count and
time, every process stopped again by its PID (registered for cleanup the
moment it exists).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import harness

LOOPBACK = harness.LOOPBACK
CHAT = "/v1/chat/completions"

RELOAD_RE = re.compile(r"reloaded .*generation (\d+)")
RELOAD_FAILED_RE = re.compile(r"reload failed")


def write_file(path, text):
    """Writes `text` (str) whole, then renames it into place, so that a
    reload never reads half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def check_config(text, name="tokentap.yaml", extra_args=(), timeout=10.0):
    """Writes `text` into a fresh directory and runs `tokentap -t -c FILE`
    there (FILE relative, as the messages print it). Returns
    (CompletedProcess, FILE)."""
    d = tempfile.mkdtemp(prefix="tokentap-cfg-")
    try:
        write_file(os.path.join(d, name), text)
        res = subprocess.run(
            [harness.tokentap_bin(), "-t", "-c", name] + list(extra_args),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            timeout=timeout, text=True, start_new_session=True, cwd=d)
        return res, name
    finally:
        shutil.rmtree(d, ignore_errors=True)


def problem_lines(res, fname):
    """The `FILE:LINE: message` lines of a run's output, as (line, message)."""
    rx = re.compile(r"^%s:(\d+): (.*)$" % re.escape(fname))
    out = []
    for text in (res.stderr, res.stdout):
        for line in text.splitlines():
            m = rx.match(line.strip())
            if m:
                out.append((int(m.group(1)), m.group(2)))
    return out


def line_of(text, needle, nth=1):
    """1-based line number of the nth line of `text` containing `needle`."""
    seen = 0
    for i, line in enumerate(text.split("\n"), 1):
        if needle in line:
            seen += 1
            if seen == nth:
                return i
    raise ValueError("%r not found (%d) in config text" % (needle, nth))


def upstreams_yaml(sims, extra=None):
    """`upstreams:` for a {name: url} mapping (insertion order); `extra`
    maps a name to more YAML lines for that entry (indented by the caller's
    convention: 4 spaces)."""
    lines = ["upstreams:"]
    for name, url in sims.items():
        lines.append("  - name: %s" % name)
        lines.append("    url: %s" % url)
        for more in (extra or {}).get(name, []):
            lines.append("    " + more)
    return "\n".join(lines) + "\n"


class ConfTokentap(harness.Process):
    """tokentap -c FILE, the file in a temporary directory that is also its
    working directory. `body` is the YAML after the common header."""

    HEADER = (
        "# written by routing_helpers.py\n"
        "listen: 127.0.0.1:0\n"
        "admin: {listen: \"off\"}\n"
        "store: {dir: \"off\"}\n"
        "access_log: %s\n"
    )

    def __init__(self, body, *args, access_log=True, header=True, rlimit_nofile=None):
        self.workdir = tempfile.mkdtemp(prefix="tokentap-rt-")
        self.path = os.path.join(self.workdir, "tokentap.yaml")
        self.log_path = os.path.join(self.workdir, "access.log") if access_log else None
        self.header = header
        self.body = body
        write_file(self.path, self._text(body))
        harness.start_in_workdir(self, [harness.tokentap_bin(), "-c", self.path] + [str(a) for a in args],
                                 rlimit_nofile=rlimit_nofile)

    def _text(self, body):
        if not self.header:
            return body
        header = self.HEADER % (self.log_path or "off")
        if re.search(r"(?m)^listeners:", body):  # listen and listeners do not go together
            header = header.replace("listen: 127.0.0.1:0\n", "")
        # A key given twice is an error: the body's own block replaces the
        # header's line (its store, for one, then has the default dir).
        for key in ("admin", "store", "access_log"):
            if re.search(r"(?m)^%s:" % key, body):
                header = re.sub(r"(?m)^%s:.*\n" % key, "", header)
        return header + body

    def count_lines(self, rx):
        with self._lock:
            return sum(1 for line in self.lines if rx.search(line))

    def reload(self, body, expect_ok=True, timeout=5.0):
        """Rewrites the file with `body` (after the common header), sends
        SIGHUP and waits until tokentap reports the outcome. Returns True
        when the reload was reported as expected."""
        ok0 = self.count_lines(RELOAD_RE)
        bad0 = self.count_lines(RELOAD_FAILED_RE)
        write_file(self.path, self._text(body))
        self.body = body
        os.kill(self.pid, signal.SIGHUP)
        rx = RELOAD_RE if expect_ok else RELOAD_FAILED_RE
        base = ok0 if expect_ok else bad0
        return harness.wait_until(lambda: self.count_lines(rx) > base, timeout, 0.02)

    def signal(self, sig):
        os.kill(self.pid, sig)

    def access_log(self):
        return harness.read_access_log(self.log_path)

    def wait_log_count(self, n, timeout=5.0):
        """Waits until the access log holds at least n complete lines."""
        got = []

        def check():
            try:
                got[:] = self.access_log()
            except ValueError:
                return False
            return len(got) >= n

        harness.wait_until(check, timeout, 0.02)
        return got


# Tests whose premise is one sequence of choices (smooth weighted round robin
# over separate connections, exact mirror percentages, one pool) pass
# ONE_WORKER: each worker keeps its own sequence (docs/config.md, workers);
# test_workers.py checks what holds across workers.
ONE_WORKER = ("--workers", "1")


def start_conf(test, body, *args, access_log=True, rlimit_nofile=None):
    tt = ConfTokentap(body, *args, access_log=access_log, rlimit_nofile=rlimit_nofile)
    harness._add_cleanup(test, lambda: harness._stop_and_check(tt))
    return tt


def start_split(test, urls, weights, extra=None, route_opts=()):
    """tokentap with one route, `chat`, splitting between the upstreams
    `urls` ({name: url}; `extra` as upstreams_yaml's) by `weights` ({name:
    weight}; `route_opts`: more YAML lines of the route), its store in a
    fresh directory flushed every 200 ms, the admin API on an ephemeral
    port, one worker (the split sequence is per worker). Returns (tokentap,
    admin port)."""
    datadir = tempfile.mkdtemp(prefix="tokentap-split-")
    test.addCleanup(shutil.rmtree, datadir, True)
    body = upstreams_yaml(urls, extra) + "routes:\n  - name: chat\n" + "".join(
        "    %s\n" % line for line in route_opts) + "    split:\n" + "".join(
        "      - {upstream: %s, weight: %d}\n" % (name, w) for name, w in weights.items())
    tt = start_conf(test, body, "--admin", "127.0.0.1:0", "--data-dir", datadir, "--flush-interval", "200ms",
                    *ONE_WORKER)
    return tt, harness.admin_port(tt)


def compare_flushed(test, admin, n, timeout=8.0):
    """GET /compare of the route `chat` once its upstreams have n requests
    between them (the store flushed): the document."""
    doc = []

    def flushed():
        r, _ = harness.exchange(admin, "GET", "/compare?route=chat&window=5m&cold=include")
        if r is None or r.status != 200:
            return False
        doc[:] = [r.json()]
        return sum(u["requests"] for u in doc[0]["upstreams"]) >= n

    test.assertTrue(harness.wait_until(flushed, timeout, 0.1), "compare shows every request")
    return doc[0]


def sim_requests(sims):
    """{name: requests seen} for a {name: Sim} mapping."""
    return {name: s.stats()["requests"] for name, s in sims.items()}


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


def chat(model=None, stream=False, prompt="hi", **extra):
    """A chat body; without `model` the simulator answers with its own
    --model name, which tells which simulator served the request."""
    b = {"messages": [{"role": "user", "content": prompt}], "stream": stream}
    if model is not None:
        b["model"] = model
    b.update(extra)
    return b


def served_by(resp):
    """The simulator's model name in a non-streamed chat answer (its
    --model when the request named none)."""
    if resp is None or resp.status != 200:
        return None
    try:
        return resp.json().get("model")
    except ValueError:
        return None


def send(port, body=None, headers=None, method="POST", path=CHAT, host=None, chunked=None, timeout=10.0):
    """One request on a fresh connection; returns the Response (or None)."""
    hdrs = list(headers or [])
    if host is not None:
        hdrs.insert(0, ("Host", host))
    resp, _ = harness.exchange(port, method, path, body, hdrs, timeout=timeout, chunked=chunked)
    return resp


class KeepAlive:
    """Several requests over one client connection (fewer connects in long
    loops). Falls back to a new connection when the server closed."""

    def __init__(self, port, timeout=10.0):
        self.port = port
        self.timeout = timeout
        self.conn = None

    def request(self, method, path, body=None, headers=None):
        for attempt in range(2):
            if self.conn is None:
                self.conn = harness.HttpConn(self.port, timeout=self.timeout)
            try:
                self.conn.send(harness.request_bytes(method, path, body, headers, self.port))
                resp = self.conn.read_response(method)
            except (BrokenPipeError, ConnectionResetError):
                resp = None
            if resp is not None:
                if (resp.header("connection") or "").lower() == "close" or resp.closed:
                    self.close()
                return resp
            self.close()
            if attempt:
                return None
        return None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Background:
    """Runs fn(*args) in daemon threads; join() collects the results in
    start order, bounded in time."""

    def __init__(self):
        self.threads = []
        self.results = []

    def start(self, fn, *args):
        idx = len(self.results)
        self.results.append(None)

        def run():
            try:
                self.results[idx] = ("ok", fn(*args))
            except Exception as e:
                self.results[idx] = ("error", repr(e))

        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()
        return idx

    def join(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [r if r is not None else ("error", "did not finish in time") for r in self.results]


def connect_outcome(port, timeout=2.0):
    """What a new client sees now: 'refused' (connect fails), 'closed'
    (accepted but closed, or reset, without any response byte to a
    request), or 'answered' with the status."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect((LOOPBACK, port))
        except (ConnectionRefusedError, socket.timeout, OSError):
            return "refused"
        try:
            s.sendall(harness.request_bytes("POST", CHAT, chat(), harness.sim_headers(ttft=0, itl=0, tokens=1),
                                            port))
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            return "closed"
        except socket.timeout:
            return "hung"
        if not data:
            return "closed"
        return "answered: %r" % data[:40]
    finally:
        s.close()

