#!/usr/bin/env python3
"""soak.py — a bounded soak of tokentap under mixed and hostile traffic, with
leak and accounting checks at the end.

Starts tokentap-sim, an upstream that resets some connections ("flaky":
the harness's FakeUpstream with the handler written here), and tokentap in
front of both (-c FILE with two workers, --data-dir, --admin), then drives
concurrent streams for a set time:

  - the bulk: tokentap-bench in closed loop, openai-chat and anthropic
    streams of random lengths, to the simulator;
  - about 5 % of requests from clients that abort at a random point:
    mid-stream, while waiting for the first token (the simulator holds it
    30 s), or mid-upload (once tokentap has answered 100 Continue), closing
    with a FIN or an RST; plus a few that give up inside the request head,
    which tokentap must not count as requests;
  - about 4 % of requests routed (by Host) to the flaky upstream, which
    answers some in full, closes the keep-alive connection after some full
    answers (stale pooled connections for tokentap to notice or replay on),
    and resets some mid-stream and some before answering.

The traffic runs in two phases, a warm-up and the soak proper. After each,
traffic stops and tokentap is left idle (no request in flight, no pooled
connection): the fds and RSS after the warm-up are the baseline.

Checks, each printed with its numbers:

  clients    every client saw what its scenario expects (the bench: no
             failed request)
  fds        tokentap's open fds (/proc/PID/fd) back to the baseline, and to
             what a fresh tokentap had, within a bounded wait
  rss        VmRSS at most 10 % above the baseline (25 % under ASan, whose
             allocator moves RSS by several MB on its own)
  stats      /stats?window=all, /metrics and /upstreams count exactly the
             requests the clients sent, per upstream, by status class and
             error kind (docs/admin-api.md, docs/metrics.md)
  exit       tokentap and the simulator exit 0 on SIGTERM
  sanitizer  no AddressSanitizer, LeakSanitizer or UBSan report in their
             stderr (meaningful when TOKENTAP_BIN is a -DTOKENTAP_SANITIZE=ON
             build; the output says which it was)

Exit status 0 when every check passes, 1 otherwise (each failed check named
on a FAILED line), 2 for a bad command line.

    tests/soak/soak.py                      # 20 minutes, 300 streams
    tests/soak/soak.py --short              # about 60 s, 100 streams (ctest soak_short)
    tests/soak/soak.py --duration 10m --streams 200 --access-log

Binaries come from TOKENTAP_BIN, TOKENTAP_SIM_BIN and TOKENTAP_BENCH_BIN (set
by ctest), else from build/. Only 127.0.0.1 is bound or connected to; every
loop is bounded in count and time; only processes started here are stopped,
by their PIDs.
"""

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.dont_write_bytecode = True  # nothing written into the source tree

import harness  # noqa: E402

CHAT = "/v1/chat/completions"
FLAKY_HOST = "flaky.soak"

RSS_GROWTH_MAX = 0.10  # end RSS over the baseline
# Under ASan the allocator's quarantine and caches move RSS by several MB on
# their own (measured with a fixed store ring: +10 to +18 % in the short run
# against +7 % without ASan), so there the check only catches gross growth;
# LeakSanitizer at exit and the unsanitized run do the rest.
RSS_GROWTH_MAX_SANITIZED = 0.25
RECENT_RING = 1024  # requests tokentap keeps for /requests/recent, in an array filled as they come
ABORT_SHARE = 0.05
FLAKY_SHARE = 0.04
IO_TIMEOUT_S = 30.0  # a client's socket timeout: generous, for sanitizer builds on a busy machine
QUIET_TIMEOUT_S = 30.0  # traffic stopped -> tokentap idle
FD_TIMEOUT_S = 15.0
STATS_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0
POOL_IDLE = "1s"  # so that idle pooled connections are gone soon after the traffic

# Scenario -> (upstream, status class, error kind) as tokentap records it;
# None: tokentap must not count it as a request. The flaky upstream's part
# is soak_all.py's too.
FLAKY_OUTCOMES = {
    "flaky_ok": ("flaky", "2xx", None),
    "flaky_ok_close": ("flaky", "2xx", None),
    "flaky_reset_mid": ("flaky", "2xx", "upstream_reset"),
    "flaky_reset_before": ("flaky", "5xx", "upstream_reset"),
}
SCENARIOS = {
    "abort_mid_stream": ("sim", "2xx", "client_aborted"),
    "abort_before_first_token": ("sim", "2xx", "client_aborted"),
    "abort_mid_upload": ("sim", "none", "client_aborted"),
    "abort_in_head": None,
    **FLAKY_OUTCOMES,
}
ABORT_KINDS = (("abort_mid_stream", 40), ("abort_before_first_token", 25), ("abort_mid_upload", 25),
               ("abort_in_head", 10))
FLAKY_KINDS = (("flaky_ok", 35), ("flaky_ok_close", 15), ("flaky_reset_mid", 30), ("flaky_reset_before", 20))


def log(msg):
    print("[soak %7.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


T0 = time.monotonic()


def duration(text):
    """'90', '90s', '5m', '1h' -> seconds."""
    m = re.match(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$", text.strip())
    if not m:
        raise argparse.ArgumentTypeError("not a duration: %r (e.g. 90s, 20m)" % text)
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def rss_kib(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
    return out


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path, headers=[("Connection", "close")], timeout=IO_TIMEOUT_S)
    if resp is None or resp.status != 200:
        raise RuntimeError("GET %s: %r" % (path, resp and (resp.status, resp.body[:200])))
    return json.loads(resp.body)


def get_text(port, path):
    resp, _ = harness.exchange(port, "GET", path, headers=[("Connection", "close")], timeout=IO_TIMEOUT_S)
    if resp is None or resp.status != 200:
        raise RuntimeError("GET %s: %r" % (path, resp and resp.status))
    return resp.body.decode()


def sse_event(i):
    return b'data: {"choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n' % i


def small_asan_quarantine(mb):
    """ASan keeps freed memory in a quarantine (256 MB by default) before
    reusing it, so RSS would climb all run long whatever tokentap does. A
    smaller one (`mb`) fills during the warm-up; the rest of the options
    (leak detection, abort on error) stay as the caller set them."""
    opts = os.environ.get("ASAN_OPTIONS", "")
    if "quarantine_size_mb" not in opts:
        os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=%d" % mb


def read_continue(conn):
    """The bytes up to the end of the interim response a request with
    `Expect: 100-continue` gets (bounded), for the caller to check."""
    got = b""
    for _ in range(100):
        if b"\r\n\r\n" in got:
            break
        data = conn.sock.recv(4096)
        if not data:
            break
        got += data
    return got


def flaky_problem(resp, behave, events):
    """What is wrong with the answer to a flaky-upstream request asked to
    `behave` (flaky_handler) that sent `events` (bytes), or None: a reset
    before the answer is a 502; a reset mid-stream an incomplete prefix of
    the events; otherwise the events and [DONE], whole."""
    if behave == "flaky_reset_before":
        if resp.status != 502:
            return "%s: status %d, expected 502" % (behave, resp.status)
    elif resp.status != 200:
        return "%s: status %d: %r" % (behave, resp.status, resp.body[:200])
    elif behave == "flaky_reset_mid":
        if resp.complete or not events.startswith(resp.body):
            return "%s: complete=%s, %d body bytes not a prefix of what the upstream sent" % (
                behave, resp.complete, len(resp.body))
    elif not resp.complete or resp.body != events + b"data: [DONE]\n\n":
        return "%s: complete=%s, body %r" % (behave, resp.complete, resp.body[-80:])
    return None


def wait_quiet(upstreams, pid, fail, what, timeout=QUIET_TIMEOUT_S):
    """Waits until tokentap has nothing in flight and no pooled connection
    (upstreams(): GET /upstreams' list; fail(check, msg) when it stays busy
    past `timeout` seconds), then until its fd count holds still (the admin
    connection just used closes on tokentap's side a moment later); returns
    its fds."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.2) + 1):
        ups = upstreams()
        if all(u["in_flight"] == 0 and u["queued"] == 0 and u["pool"]["idle"] == 0 for u in ups):
            break
        if time.monotonic() > deadline:
            fail("fds", "%s: tokentap still busy after %.0f s: %s"
                 % (what, timeout, [(u["name"], u["in_flight"], u["pool"]) for u in ups]))
            break
        time.sleep(0.2)
    last = None
    for _ in range(50):
        time.sleep(0.2)
        n = harness.fd_count(pid)
        if n == last:
            break
        last = n
    return harness.fd_targets(pid)


def stop_for_exit(p, timeout=STOP_TIMEOUT_S):
    """SIGTERM to a process still running and its exit awaited (up to
    `timeout` seconds): (whether it was running, its exit status, None when it
    had to be killed)."""
    was_alive = p.alive()
    if was_alive:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    rc = p.proc.poll()
    p.stop()  # SIGKILL if it is still there; joins its stderr reader
    return was_alive, rc


class Checks:
    """A run's verdicts: fail() and passed() print one line each and keep
    them in .failures and .passes."""

    def fail(self, check, msg):
        self.failures.append((check, msg))
        print("FAILED %s: %s" % (check, msg), flush=True)

    def passed(self, check, msg):
        self.passes.append((check, msg))
        print("ok     %s: %s" % (check, msg), flush=True)


class HeadCutClient:
    """A client that sends part of a request head and goes away; the class
    that mixes this in defines _conn(), _leave(conn, rng) (AbortClients
    has one) and left(kind, rid), which records the request as left by its
    client."""

    def abort_in_head(self, rng, rid):
        raw = harness.request_bytes("POST", CHAT, harness.api_body("openai-chat", True),
                                    harness.sim_headers(tokens=5, request_id=rid))
        cut = rng.randint(1, raw.index(b"\r\n\r\n") + 2)
        conn = self._conn()
        try:
            conn.send(raw[:cut])
            time.sleep(rng.uniform(0, 0.2))
            self._leave(conn, rng)
            self.left("abort_in_head", rid)
        finally:
            conn.close()


class AbortClients:
    """Clients that leave a streamed request: mid-stream, before the first
    token, mid-upload (after 100 Continue), each with a FIN or an RST
    (_leave, which HeadCutClient uses too). The class that mixes this in
    defines _conn() and left(kind, rid) (as for HeadCutClient), and may set
    EXTRA_HEADERS (sent with each request), the numbers below, and
    _answered_5xx(resp, rid, kind): whether the head that came was a 5xx
    it has counted, with nothing left to leave."""

    EXTRA_HEADERS = []
    MID_STREAM_TTFT_MS = 80  # the simulator's ttft and itl, drawn up to these
    MID_STREAM_ITL_MS = 30
    MID_STREAM_LINES = 40  # lines read before leaving, drawn up to this
    FIRST_TOKEN_MS = 30000  # abort_before_first_token: the simulator's ttft
    UPLOAD_BYTES = 150000  # abort_mid_upload: the prompt, drawn up to this

    def _answered_5xx(self, resp, rid, kind):
        return False

    @staticmethod
    def _leave(conn, rng):
        """Closes with a FIN or, half the time, an RST."""
        if rng.random() < 0.5:
            conn.abort()
        else:
            conn.close()

    @staticmethod
    def _prompt(rng, nbytes):
        words = ("soak", "stream", "token", "abort", "proxy", "upload", "reset", "leak")
        out = []
        size = 0
        for _ in range(nbytes):
            if size >= nbytes:
                break
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)[:nbytes]

    def abort_mid_stream(self, rng, rid):
        api = rng.choice(("openai-chat", "anthropic", "ollama-chat"))
        conn = self._conn()
        try:
            conn.send(harness.request_bytes(
                "POST", harness.API_PATHS[api], harness.api_body(api, True, prompt=self._prompt(rng, 200)),
                harness.sim_headers(ttft=rng.randint(0, self.MID_STREAM_TTFT_MS),
                                    itl=rng.randint(5, self.MID_STREAM_ITL_MS), tokens=100000, request_id=rid)
                + self.EXTRA_HEADERS))
            resp = conn.read_head()
            if self._answered_5xx(resp, rid, "abort_mid_stream"):
                return
            if resp is None or resp.status != 200:
                return self.tally.anomaly(rid, "mid-stream: status %r" % (resp and resp.status))
            want = rng.randint(1, self.MID_STREAM_LINES)
            lines = 0
            for _, piece in conn.body_reader(resp):
                lines += piece.count(b"\n")
                if lines >= want:
                    break
            if lines < want:
                return self.tally.anomaly(rid, "mid-stream: the stream ended after %d lines" % lines)
            self._leave(conn, rng)
            self.left("abort_mid_stream", rid)
        finally:
            conn.close()

    def abort_before_first_token(self, rng, rid):
        conn = self._conn()
        try:
            conn.send(harness.request_bytes(
                "POST", CHAT, harness.api_body("openai-chat", True, prompt=self._prompt(rng, 100)),
                harness.sim_headers(ttft=self.FIRST_TOKEN_MS, itl=10, tokens=10, request_id=rid) + self.EXTRA_HEADERS))
            resp = conn.read_head()  # the simulator sends its head at once, the first token later
            if self._answered_5xx(resp, rid, "abort_before_first_token"):
                return
            if resp is None or resp.status != 200:
                return self.tally.anomaly(rid, "before first token: status %r" % (resp and resp.status))
            time.sleep(rng.uniform(0, 0.5))
            self._leave(conn, rng)
            self.left("abort_before_first_token", rid)
        finally:
            conn.close()

    def abort_mid_upload(self, rng, rid):
        body = json.dumps(harness.api_body("openai-chat", True,
                                           prompt=self._prompt(rng, rng.randint(2000, self.UPLOAD_BYTES))),
                          separators=(",", ":")).encode()
        head = harness.request_bytes("POST", CHAT, None, [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Expect", "100-continue"),
            ("x-request-id", rid)] + self.EXTRA_HEADERS)
        conn = self._conn()
        try:
            conn.send(head)
            # 100 Continue means the head is parsed: from here on tokentap
            # counts the request whatever the client does.
            got = read_continue(conn)
            if not got.startswith(b"HTTP/1.1 100"):
                return self.tally.anomaly(rid, "mid-upload: expected 100 Continue, got %r" % got[:80])
            conn.send(body[:rng.randint(1, len(body) - 1)])
            time.sleep(rng.uniform(0, 0.2))
            self._leave(conn, rng)
            self.left("abort_mid_upload", rid)
        finally:
            conn.close()


class FlakyClients:
    """The flaky upstream's client kinds, one per behaviour; the class that
    mixes this in defines _flaky(rng, rid, behave)."""

    def flaky_ok(self, rng, rid):
        self._flaky(rng, rid, "flaky_ok")

    def flaky_ok_close(self, rng, rid):
        self._flaky(rng, rid, "flaky_ok_close")

    def flaky_reset_mid(self, rng, rid):
        self._flaky(rng, rid, "flaky_reset_mid")

    def flaky_reset_before(self, rng, rid):
        self._flaky(rng, rid, "flaky_reset_before")


# --------------------------------------------------------------------------
# the flaky upstream


def flaky_handler():
    """The flaky upstream's behaviour, a handler for harness.FakeUpstream:
    each request says what to do in `x-soak-behave` (so a request tokentap
    replays behaves the same the second time) and how many SSE events to
    send in `x-soak-events`. Returns (handler, seen), `seen` counting the
    requests received per behaviour, replays included."""
    seen = collections.Counter()
    lock = threading.Lock()

    def handler(s, req, fu):
        behave = req.header("x-soak-behave", "flaky_ok")
        n = int(req.header("x-soak-events", "5"))
        with lock:
            seen[behave] += 1
        if behave == "flaky_reset_before":
            harness.reset_socket(s)
            return False
        harness.send_sse_head(s)
        for i in range(n):
            harness.send_chunk(s, sse_event(i))
            time.sleep(0.003)
        if behave == "flaky_reset_mid":
            harness.reset_socket(s)
            return False
        harness.send_chunk(s, b"data: [DONE]\n\n")
        s.sendall(b"0\r\n\r\n")
        return behave != "flaky_ok_close"

    return handler, seen


# --------------------------------------------------------------------------
# what the clients did


class Tally:
    """Client-side bookkeeping, shared by the chaos threads: scenarios run,
    what tokentap must count for them, and anything a client did not
    expect."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = collections.Counter()  # scenario -> started
        self.done = collections.Counter()  # scenario -> finished as expected
        self.expected = {}  # request id -> (upstream, status class, error) for the access-log reconciliation
        self.anomalies = []
        self.n_anomalies = 0
        self.tokentap_finished = 0  # /upstreams requests, polled: paces the chaos

    def anomaly(self, rid, text):
        with self.lock:
            self.n_anomalies += 1
            if len(self.anomalies) < 20:
                self.anomalies.append("%s: %s" % (rid, text))

    def ok(self, scenario, rid):
        with self.lock:
            self.done[scenario] += 1
            if SCENARIOS[scenario] is not None:
                self.expected[rid] = SCENARIOS[scenario]

    def pick(self, rng):
        """The next chaos scenario, or None when the shares are met."""
        with self.lock:
            total = max(self.tokentap_finished, 1)
            aborts = sum(self.started[k] for k, _ in ABORT_KINDS)
            flaky = sum(self.started[k] for k, _ in FLAKY_KINDS)
            if aborts < ABORT_SHARE * total:
                kinds = ABORT_KINDS
            elif flaky < FLAKY_SHARE * total:
                kinds = FLAKY_KINDS
            else:
                return None
            k = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            self.started[k] += 1
            return k


class Chaos(AbortClients, FlakyClients, HeadCutClient):
    """The aborting clients and the flaky-upstream clients of one phase:
    threads that each run scenarios until the phase ends. Request ids are
    soak-PHASE-SCENARIO-N."""

    def __init__(self, port, tally, phase, seed):
        self.port = port
        self.tally = tally
        self.phase = phase
        self.seed = seed
        self.seq = 0
        self.seq_lock = threading.Lock()

    def _rid(self, scenario):
        with self.seq_lock:
            self.seq += 1
            return "soak-%s-%s-%d" % (self.phase, scenario, self.seq)

    def run(self, n_threads, until):
        threads = []
        for i in range(n_threads):
            rng = random.Random("%s-%s-%d" % (self.seed, self.phase, i))
            t = threading.Thread(target=self._worker, args=(rng, until), name="chaos-%d" % i, daemon=True)
            threads.append(t)
            t.start()
        return threads

    def _worker(self, rng, until):
        for _ in range(1000000):
            if time.monotonic() >= until:
                return
            scenario = self.tally.pick(rng)
            if scenario is None:
                time.sleep(0.02)
                continue
            rid = self._rid(scenario)
            try:
                getattr(self, scenario)(rng, rid)
            except Exception as e:  # reported as a failed client check
                self.tally.anomaly(rid, "%s: %r" % (scenario, e))

    # -- helpers

    def _conn(self):
        return harness.HttpConn(self.port, timeout=IO_TIMEOUT_S)

    def left(self, kind, rid):
        self.tally.ok(kind, rid)

    # -- clients of the flaky upstream

    def _flaky(self, rng, rid, behave):
        n = rng.randint(1, 30)
        events = b"".join(sse_event(i) for i in range(n))
        resp, _ = harness.exchange(self.port, "POST", CHAT, harness.api_body("openai-chat", True), [
            ("Host", FLAKY_HOST), ("x-soak-behave", behave), ("x-soak-events", str(n)), ("x-request-id", rid)],
            timeout=IO_TIMEOUT_S)
        if resp is None:
            return self.tally.anomaly(rid, "%s: no response" % behave)
        problem = flaky_problem(resp, behave, events)
        if problem:
            return self.tally.anomaly(rid, problem)
        self.tally.ok(behave, rid)


# --------------------------------------------------------------------------
# the run


class Soak(Checks):
    def __init__(self, args):
        self.args = args
        self.failures = []  # (check, message)
        self.passes = []  # (check, message)
        self.procs = []
        self.workdir = tempfile.mkdtemp(prefix="tokentap-soak-")
        self.tally = Tally()
        self.bench_results = []  # (phase, api, result dict)
        self.rss_samples = []
        self.stop_monitor = threading.Event()

    # -- processes

    def start(self):
        a = self.args
        self.sanitized = harness.is_sanitized()
        if self.sanitized:
            small_asan_quarantine(a.asan_quarantine_mb)
        self.sim = harness.Sim("--ttft-ms", a.ttft_ms, "--itl-ms", a.itl_ms)
        self.procs.append(self.sim)
        handler, self.flaky_seen = flaky_handler()
        # One thread per connection, as many requests on one as tokentap
        # sends, nothing kept per request or per closed connection: the soak
        # runs for minutes to hours.
        self.flaky = harness.FakeUpstream(handler, backlog=256, deadline_s=a.duration + 600, max_requests=100000,
                                          keep_requests=False, forget_closed=True)
        self.access_log = os.path.join(self.workdir, "access.log") if a.access_log else None
        cfg = os.path.join(self.workdir, "tokentap.yaml")
        with open(cfg, "w") as f:
            f.write("# written by tests/soak/soak.py\n"
                    "listen: 127.0.0.1:0\n"
                    "workers: %d\n"
                    "access_log: %s\n"
                    "store: {flush_interval: 1s}\n"
                    "timeouts: {pool_idle: %s, shutdown_grace: 5s}\n"
                    "upstreams:\n"
                    "  - name: sim\n"
                    "    url: %s\n"
                    "  - name: flaky\n"
                    "    url: %s\n"
                    "routes:\n"
                    "  - name: flaky\n"
                    "    match: {host: %s}\n"
                    "    upstream: flaky\n"
                    "    failover: false\n"
                    "  - name: main\n"
                    "    match: {path_prefix: /}\n"
                    "    upstream: sim\n"
                    "    failover: false\n"
                    % (a.workers, self.access_log or "off", POOL_IDLE, self.sim.url, self.flaky.url, FLAKY_HOST))
        self.tt = harness.Process(
            [harness.tokentap_bin(), "-c", cfg, "--data-dir", os.path.join(self.workdir, "data"),
             "--admin", "127.0.0.1:0"],
            r"listening on ([0-9.]+):(\d+)", "tokentap", cwd=self.workdir)
        self.procs.append(self.tt)
        self.port = int(self.tt.match.group(2))
        rx = re.compile(r"admin listening on 127\.0\.0\.1:(\d+)")

        def admin():
            with self.tt._lock:
                for line in self.tt.lines:
                    m = rx.search(line)
                    if m:
                        return int(m.group(1))
            return None

        self.admin = harness.wait_until(admin, 10.0, 0.02)
        if not self.admin:
            raise RuntimeError("tokentap logged no admin listening line:\n" + self.tt.stderr_text())
        log("tokentap pid %d on :%d (admin :%d, %d workers), %s; simulator :%d (ttft %d ms, itl %d ms); flaky upstream :%d; "
            "work dir %s" % (self.tt.pid, self.port, self.admin, a.workers,
                             "ASan build (%s)" % os.environ.get("ASAN_OPTIONS", "") if self.sanitized
                             else "not a sanitizer build", self.sim.port, a.ttft_ms, a.itl_ms, self.flaky.port,
                             self.workdir))

    def stop_all(self):
        self.stop_monitor.set()
        for p in reversed(self.procs):
            p.stop()
        if getattr(self, "flaky", None):
            self.flaky.stop()

    # -- a phase of traffic

    def monitor(self):
        """Every half second: tokentap's finished requests (pacing the
        chaos) and its RSS; a progress line every --progress seconds.
        Bounded by the run's length."""
        next_line = time.monotonic() + self.args.progress
        for _ in range(int((self.args.duration + 600) / 0.5)):
            if self.stop_monitor.wait(0.5):
                return
            try:
                ups = get_json(self.admin, "/upstreams")["upstreams"]
                finished = sum(u["requests"] for u in ups)
                with self.tally.lock:
                    self.tally.tokentap_finished = finished
                rss = rss_kib(self.tt.pid)
                self.rss_samples.append(rss["VmRSS"])
            except (OSError, RuntimeError, ValueError) as e:
                if self.tt.alive():
                    self.tally.anomaly("monitor", "admin API: %r" % e)
                return
            if time.monotonic() >= next_line:
                next_line += self.args.progress
                log("progress: %d requests finished, %d in flight, %d fds, VmRSS %d KiB (RssAnon %d)"
                    % (finished, sum(u["in_flight"] for u in ups), harness.fd_count(self.tt.pid), rss["VmRSS"],
                       rss["RssAnon"]))

    def bench(self, phase, api, concurrency, seconds, seed):
        out = os.path.join(self.workdir, "bench-%s-%s" % (phase, api))
        argv = [harness.bench_bin(), "--url", "http://127.0.0.1:%d" % self.port, "--api", api, "--model", "sim-model",
                "--concurrency", str(concurrency), "--duration", "%ds" % max(1, int(seconds)),
                "--input-len", "uniform:8:512", "--output-len", "uniform:8:%d" % self.args.max_tokens,
                "--sim-headers", "--timeout", "60s", "--json", out + ".json", "--no-progress",
                "--run-id", "soak.%s.%s" % (phase, api.replace("-", "_")), "--seed", str(seed)]
        with open(out + ".out", "wb") as so:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=so, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        return p, out

    def phase(self, name, seconds):
        a = self.args
        n_chaos = max(4, a.streams // 12)
        n_bench = max(2, a.streams - n_chaos)
        chat = max(1, round(n_bench * 0.7))
        log("%s: %.0f s, %d streams: bench %d openai-chat + %d anthropic, %d chaos clients"
            % (name, seconds, n_bench + n_chaos, chat, n_bench - chat, n_chaos))
        until = time.monotonic() + seconds
        benches = [self.bench(name, "openai-chat", chat, seconds, a.seed),
                   self.bench(name, "anthropic", n_bench - chat, seconds, a.seed + 1)]
        chaos = Chaos(self.port, self.tally, name, a.seed).run(n_chaos, until)
        for t in chaos:
            t.join(max(0.0, until - time.monotonic()) + IO_TIMEOUT_S + 5)
            if t.is_alive():
                self.tally.anomaly(t.name, "a chaos client did not finish in time")
        for (p, out), api in zip(benches, ("openai-chat", "anthropic")):
            try:
                p.wait(max(0.0, until - time.monotonic()) + 90)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
                self.tally.anomaly("bench-" + api, "tokentap-bench did not finish in time")
            try:
                with open(out + ".json") as f:
                    res = json.load(f)["result"]
            except (OSError, ValueError, KeyError) as e:
                with open(out + ".out", "rb") as f:
                    tail = f.read()[-2000:].decode("utf-8", "replace")
                raise RuntimeError("tokentap-bench (%s, exit %r) wrote no result: %r\n%s"
                                   % (api, p.returncode, e, tail))
            self.bench_results.append((name, api, res))
            if p.returncode != 0 or res["requests"]["failed"] or res["requests"]["cancelled"]:
                errs = {k: v for k, v in res["errors"].items() if v}
                self.tally.anomaly("bench-%s-%s" % (name, api), "exit %r, requests %r, errors %r"
                                   % (p.returncode, res["requests"], errs))
        log("%s: traffic over" % name)

    def quiet(self, what):
        """tokentap idle and its fd count still (wait_quiet); its fds."""
        return wait_quiet(lambda: get_json(self.admin, "/upstreams")["upstreams"], self.tt.pid, self.fail, what)

    # -- checks

    def check_clients(self):
        t = self.tally
        bench_n = sum(r["requests"]["started"] for _, _, r in self.bench_results)
        bench_ok = sum(r["requests"]["ok"] for _, _, r in self.bench_results)
        aborts = sum(t.done[k] for k, _ in ABORT_KINDS if SCENARIOS[k] is not None)
        total = bench_n + sum(t.done[k] for k in SCENARIOS if SCENARIOS[k] is not None)
        detail = ("bench %d requests (%d ok); aborted %d (%.1f %%: %s); flaky upstream %d (%s); "
                  "heads cut short %d" % (
                      bench_n, bench_ok, aborts, 100.0 * aborts / max(1, total),
                      ", ".join("%s %d" % (k[6:], t.done[k]) for k, _ in ABORT_KINDS if SCENARIOS[k]),
                      sum(t.done[k] for k, _ in FLAKY_KINDS),
                      ", ".join("%s %d" % (k[6:], t.done[k]) for k, _ in FLAKY_KINDS), t.done["abort_in_head"]))
        replays = sum(self.flaky_seen.values()) - sum(t.done[k] for k, _ in FLAKY_KINDS)
        detail += "; the flaky upstream saw %d requests (%+d: replays)" % (sum(self.flaky_seen.values()), replays)
        if t.n_anomalies or self.flaky.errors:
            self.fail("clients", "%d unexpected outcomes (%s); first: %s; flaky upstream errors: %s"
                      % (t.n_anomalies, detail, t.anomalies[:10], self.flaky.errors[:5]))
        else:
            self.passed("clients", detail)

    def expected_counts(self):
        """{upstream: {"requests", "status", "errors"}} the clients expect."""
        exp = {}

        def add(up, status, error, n):
            e = exp.setdefault(up, {"requests": 0, "status": collections.Counter(), "errors": collections.Counter()})
            e["requests"] += n
            e["status"][status] += n
            if error:
                e["errors"][error] += n

        for _, _, r in self.bench_results:
            add("sim", "2xx", None, r["requests"]["ok"])
        for k, want in SCENARIOS.items():
            if want is not None and self.tally.done[k]:
                add(want[0], want[1], want[2], self.tally.done[k])
        return exp

    @staticmethod
    def _norm(d):
        return {"requests": d["requests"], "status": {k: v for k, v in d["status"].items() if v},
                "errors": {k: v for k, v in d["errors"].items() if v}}

    def observed_stats(self):
        out = {}
        for s in get_json(self.admin, "/stats?window=all")["series"]:
            e = out.setdefault(s["upstream"], {"requests": 0, "status": collections.Counter(),
                                               "errors": collections.Counter()})
            e["requests"] += s["requests"]
            e["status"].update(s["status"])
            e["errors"].update(s["errors"])
        return {k: self._norm(v) for k, v in out.items()}

    def observed_metrics(self):
        out = {}
        rx = re.compile(r'^tokentap_(requests|errors)_total\{([^}]*)\} (\d+)$')
        for line in get_text(self.admin, "/metrics").split("\n"):
            m = rx.match(line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            e = out.setdefault(labels["upstream"], {"requests": 0, "status": collections.Counter(),
                                                    "errors": collections.Counter()})
            n = int(m.group(3))
            if m.group(1) == "requests":
                e["requests"] += n
                e["status"][labels["status_class"]] += n
            else:
                e["errors"][labels["kind"]] += n
        return {k: self._norm(v) for k, v in out.items()}

    def observed_upstreams(self):
        """/upstreams has requests and errors per upstream, no status."""
        return {u["name"]: {"requests": u["requests"], "errors": {k: v for k, v in u["errors"].items() if v}}
                for u in get_json(self.admin, "/upstreams")["upstreams"]}

    def check_stats(self):
        want = {k: self._norm(v) for k, v in self.expected_counts().items()}
        want_up = {k: {"requests": v["requests"], "errors": v["errors"]} for k, v in want.items()}
        got = {}
        deadline = time.monotonic() + STATS_TIMEOUT_S
        for _ in range(int(STATS_TIMEOUT_S / 0.5) + 1):
            got = {"/stats?window=all": self.observed_stats(), "/metrics": self.observed_metrics(),
                   "/upstreams": self.observed_upstreams()}
            if (got["/stats?window=all"] == want and got["/metrics"] == want
                    and {k: v for k, v in got["/upstreams"].items() if v["requests"]} == want_up):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the store sees each worker's counts once per flush interval
        bad = []
        for src, obs in got.items():
            w = want_up if src == "/upstreams" else want
            obs = {k: v for k, v in obs.items() if v["requests"]}
            if obs != w:
                bad.append("%s counts %s" % (src, json.dumps(obs, sort_keys=True)))
        line = "clients sent %s" % json.dumps(want, sort_keys=True)
        if bad:
            self.fail("stats", "%s; but %s%s" % (line, "; ".join(bad), self.reconcile()))
        else:
            self.passed("stats", "%s; /stats?window=all, /metrics and /upstreams count the same" % line)

    def reconcile(self):
        """With an access log: which of the chaos clients' requests tokentap
        logged differently from what they expect (bench requests only by
        number). A few lines, for the failure message."""
        if not self.access_log:
            return " (run with --access-log to see which requests differ)"
        try:
            entries = harness.read_access_log(self.access_log)
        except ValueError as e:
            return " (access log unreadable: %r)" % e
        seen = {}
        bench = collections.Counter()
        for e in entries:
            rid = e.get("id", "")
            up = e.get("upstream")
            st = e.get("status") or 0
            cls = "%dxx" % (st // 100) if st else "none"
            if rid.startswith("soak-"):  # a chaos client's
                seen[rid] = (up, cls, e.get("error"))
            elif rid.startswith("bench-"):
                bench[(up, cls, e.get("error"))] += 1
            else:
                bench[("other", rid, e.get("error"))] += 1
        diffs = []
        for rid, want in sorted(self.tally.expected.items()):
            got = seen.get(rid)
            if got is None:
                diffs.append("%s: not in the access log (expected %s)" % (rid, want))
            elif got != want:
                diffs.append("%s: logged %s, expected %s" % (rid, got, want))
        for rid, got in seen.items():
            if rid not in self.tally.expected:
                diffs.append("%s: logged %s, but it is not a request" % (rid, got))
        return "\naccess log: %d lines; bench and others by outcome %s; chaos requests that differ (%d): %s" % (
            len(entries), dict(bench), len(diffs), diffs[:15])

    def check_fds(self, fresh, base, end):
        if len(end) == len(base) == len(fresh):
            self.passed("fds", "fresh %d, after warm-up %d, end %d" % (len(fresh), len(base), len(end)))
            return
        if len(end) != len(base):
            self.fail("fds", "tokentap has %d fds open after the soak, %d after the warm-up (fresh: %d); "
                      "differences from the warm-up:\n  %s"
                      % (len(end), len(base), len(fresh), "\n  ".join(harness.fd_diff(base, end))))
        else:
            self.fail("fds", "tokentap had %d fds open after the warm-up and at the end, but %d fresh; "
                      "differences:\n  %s" % (len(base), len(fresh), "\n  ".join(harness.fd_diff(fresh, base))))

    def check_rss(self, fresh, base, end):
        peak = max(self.rss_samples) if self.rss_samples else end["VmRSS"]
        growth = (end["VmRSS"] - base["VmRSS"]) / base["VmRSS"]
        limit = RSS_GROWTH_MAX_SANITIZED if self.sanitized else RSS_GROWTH_MAX
        msg = ("VmRSS fresh %d KiB, after warm-up %d KiB, end %d KiB (%+.1f %%; limit +%d %%%s), peak %d KiB; "
               "RssAnon after warm-up %d, end %d KiB"
               % (fresh["VmRSS"], base["VmRSS"], end["VmRSS"], 100 * growth, round(100 * limit),
                  " under ASan" if self.sanitized else "", peak, base["RssAnon"], end["RssAnon"]))
        if growth > limit:
            self.fail("rss", msg)
        else:
            self.passed("rss", msg)

    def check_exit_and_sanitizers(self):
        reports = []
        for p in (self.tt, self.sim):
            was_alive, rc = stop_for_exit(p)
            with p._lock:
                lines = list(p.lines)
            with open(os.path.join(self.workdir, p.name + ".stderr"), "w") as f:
                f.write("\n".join(lines) + "\n")
            if not was_alive:
                self.fail("exit", "%s was gone before the end (status %r); stderr tail:\n%s"
                          % (p.name, rc, "\n".join(lines[-30:])))
            elif rc != 0:
                self.fail("exit", "%s exited with status %r on SIGTERM (None: still running after %.0f s); "
                          "stderr tail:\n%s" % (p.name, rc, STOP_TIMEOUT_S, "\n".join(lines[-30:])))
            else:
                self.passed("exit", "%s exited 0 on SIGTERM" % p.name)
            san = [i for i, line in enumerate(lines) if harness.SANITIZER_RE.search(line)]
            if san:
                reports.append("%s:\n%s" % (p.name, "\n".join(lines[san[0]:san[0] + 60])))
        for name in sorted(os.listdir(self.workdir)):
            if name.endswith(".out"):
                with open(os.path.join(self.workdir, name), "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                if harness.SANITIZER_RE.search(text):
                    reports.append("%s:\n%s" % (name, text[-4000:]))
        if reports:
            self.fail("sanitizer", "report(s):\n" + "\n".join(reports))
        elif self.sanitized:
            self.passed("sanitizer", "ASan/UBSan build: no report from tokentap, the simulator or the bench")
        else:
            self.passed("sanitizer", "not a sanitizer build, so nothing could be reported (point TOKENTAP_BIN at "
                        "a -DTOKENTAP_SANITIZE=ON build for this check)")

    # -- all of it

    def run(self):
        a = self.args
        self.start()
        fresh_fds = self.quiet("fresh")
        fresh_rss = rss_kib(self.tt.pid)
        mon = threading.Thread(target=self.monitor, name="monitor", daemon=True)
        mon.start()
        self.phase("warmup", a.warmup)
        base_fds = self.quiet("after the warm-up")
        base_rss = rss_kib(self.tt.pid)
        finished = sum(u["requests"] for u in get_json(self.admin, "/upstreams")["upstreams"])
        log("baseline: %d fds, VmRSS %d KiB, %d requests finished" % (len(base_fds), base_rss["VmRSS"], finished))
        if finished < RECENT_RING:
            log("note: the warm-up finished fewer requests than the %d tokentap keeps for /requests/recent; "
                "RSS grows while that ring fills (a longer --warmup avoids it)" % RECENT_RING)
        self.phase("main", a.duration - a.warmup)
        self.stop_monitor.set()
        mon.join(5)
        self.quiet("after the soak")
        harness.wait_fds(self.tt.pid, len(base_fds), FD_TIMEOUT_S)
        end_fds = harness.fd_targets(self.tt.pid)
        end_rss = rss_kib(self.tt.pid)
        self.check_clients()
        self.check_fds(fresh_fds, base_fds, end_fds)
        self.check_rss(fresh_rss, base_rss, end_rss)
        self.check_stats()
        self.check_exit_and_sanitizers()


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="soak.py", description="A bounded soak of tokentap with leak and accounting checks (docs/security.md).")
    p.add_argument("--short", action="store_true",
                   help="CI size: about 60 s, 100 streams")
    p.add_argument("--duration", type=duration, help="traffic time, warm-up included (default 20m; --short 48s)")
    p.add_argument("--warmup", type=duration,
                   help="warm-up before the baseline (default 400s, which fills the store's 360 s ring of "
                        "per-second stats; --short 18s, which fills the 1024 recent requests)")
    p.add_argument("--streams", type=int, help="concurrent streams (default 300; --short 100)")
    p.add_argument("--ttft-ms", type=int, default=40, help="simulator time to first token (default 40)")
    p.add_argument("--itl-ms", type=int, default=20, help="simulator inter-token latency (default 20)")
    p.add_argument("--max-tokens", type=int, help="bench output length: uniform 8..N (default 160; --short 120)")
    p.add_argument("--workers", type=int, default=2,
                   help="tokentap's event loops (default 2: several, whatever the machine's cores, so that runs "
                        "compare across machines)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                   help="tokentap writes an access log, used to say which requests a count mismatch comes from "
                        "(default: on with --short only; about 1 KB per request)")
    p.add_argument("--asan-quarantine-mb", type=int, default=16,
                   help="ASan builds: quarantine size given to ASAN_OPTIONS unless it names one (default 16)")
    p.add_argument("--progress", type=duration, help="seconds between progress lines (default 60; --short 10)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (it is always kept on failure)")
    a = p.parse_args(argv)
    short = a.short
    a.duration = a.duration if a.duration is not None else (48.0 if short else 1200.0)
    a.warmup = a.warmup if a.warmup is not None else (18.0 if short else 400.0)
    a.max_tokens = a.max_tokens if a.max_tokens is not None else (120 if short else 160)
    a.streams = a.streams if a.streams is not None else (100 if short else 300)
    a.progress = a.progress if a.progress is not None else (10.0 if short else 60.0)
    if a.access_log is None:
        a.access_log = short
    if a.warmup >= a.duration:
        p.error("--warmup (%g s) must be shorter than --duration (%g s)" % (a.warmup, a.duration))
    if not 10 <= a.streams <= 5000:
        p.error("--streams: 10 to 5000")
    return a


def run_to_verdict(run, name, keep, ordered_passes=True):
    """Runs a soak (run: .run(), .stop_all(), .fail(), .failures, .passes,
    .workdir) to its verdict, SIGTERM stopping it cleanly: prints the one
    summary line, removes the work dir when it passed (unless keep), and
    returns the exit status."""
    def on_term(signum, frame):
        raise SystemExit("%s.py: signal %d, stopping" % (name, signum))

    signal.signal(signal.SIGTERM, on_term)
    try:
        run.run()
    except Exception as e:
        run.fail("run", "%r" % e)
        import traceback
        traceback.print_exc()
    finally:
        run.stop_all()
    took = time.monotonic() - T0
    if run.failures:
        print("%s: FAILED %s in %.0f s (work dir kept: %s)"
              % (name, ", ".join(sorted({c for c, _ in run.failures})), took, run.workdir), flush=True)
        return 1
    if not keep:
        shutil.rmtree(run.workdir, ignore_errors=True)
    passes = [c for c, _ in run.passes] if ordered_passes else sorted({c for c, _ in run.passes})
    print("%s: passed (%s) in %.0f s" % (name, ", ".join(passes), took), flush=True)
    return 0


def main(argv):
    args = parse_args(argv)
    return run_to_verdict(Soak(args), "soak", args.keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
