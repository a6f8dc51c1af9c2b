#!/usr/bin/env python3
"""proxies.py — tokentap against nginx and HAProxy on the same LLM streams.

One run starts tokentap-sim (the upstream), tokentap (every measurement on:
LMDB store in a temporary --data-dir, admin API on a loopback port, the
default 1 s flush), nginx and HAProxy, all on ephemeral 127.0.0.1 ports, and
drives tokentap-bench at four targets: the simulator directly, and each proxy
in front of it. Targets alternate: for every scenario, round 1 runs direct,
tokentap, nginx, haproxy, round 2 does it again, and so on, so that whatever
else the machine is doing is spread over all targets alike. Every number in
the report is the median over rounds of the per-round value, except CPU,
which is pooled (all rounds' CPU over all rounds' events).

Scenarios (the simulator's timing is set per request with its x-sim-ttft-ms
and x-sim-itl-ms headers, so one simulator serves them all):

  a  one stream at a time: concurrency 1, ttft 20 ms, itl 10 ms, 6 tokens,
     200 requests per run (after 5 warm-up)
  b  256 concurrent streams: ttft 20 ms, itl 20 ms, 128 tokens, 768
     requests per run (after 256 warm-up: the first wave, which also opens
     the connections)
  c  maximum event rate: 64 concurrent streams, ttft 0, itl 0 (the simulator
     writes as fast as it is read), 512 tokens, 5 s per run (after 64
     warm-up)
  d  memory: 5,000 concurrent streams of one token per second
  e  the store's flush: two tokentaps, one with the LMDB store (default 1 s
     flush) and one with --data-dir off, 64 streams at itl 10 ms, 512
     tokens, 20 s per run, alternating with direct; reports itl p99.9 too,
     so that a stall while the store commits would show
  f  (a) with the client side over TLS: tokentap-bench speaks https to each
     proxy, which forwards plain HTTP to the simulator; direct is the bench
     over https to a second simulator that speaks TLS itself
  g  (c) with the client side over TLS, as (f)
  h  (a) with the upstream side over TLS: the bench speaks plain HTTP to
     each proxy, which forwards over https to the TLS simulator (certificate
     verified, SNI localhost); direct is the bench to the plain simulator,
     so the added latency includes the simulator's encryption, as with any
     https upstream
  i  (c) with the upstream side over TLS, as (h)
  j  (c) with the simulator writing 16 token events per write
     (x-sim-events-per-write: 16), as a server with a stream interval or
     speculative decoding does: each read of the proxy brings many events
  k  the cost of a request: one-token answers (ttft 0), 64 clients on
     keep-alive connections, 5 s per run; reports requests/s and CPU per
     request
  l  the cost of a connection: (k) with a new connection per request
     (tokentap-bench --new-connection: Connection: close on each)

TLS (f-i): one ECDSA P-256 key and certificate (for localhost and
127.0.0.1, signed by a CA made for the run with the openssl command) for
every TLS server; TLS 1.3 with TLS_AES_128_GCM_SHA256 only, for every
handshake: the bench offers only that suite (--tls-ciphersuites), nginx and
HAProxy accept only it, and the TLS simulator accepts only it. Record size
limit 16 KiB everywhere (TLS's maximum and OpenSSL's default, so no proxy
cuts a burst of events into more records than it must): nginx ssl_buffer_size
16k, HAProxy tune.ssl.maxrecord 16384, tokentap's defaults; none waits to
fill a record (nginx: proxy_buffering off flushes each upstream read;
HAProxy: option http-no-delay). Sessions: the bench resumes across its
connections; to the upstream nginx keeps proxy_ssl_session_reuse on (its
default) with keep-alive connections, HAProxy its default server-side session
reuse with http-reuse always, tokentap its pooled connections.

What is measured, per target and scenario:

  ttft / itl p50, p99  measured at the client by tokentap-bench, which
                       frames and classifies events with tokentap's code.
                       The percentiles (nearest rank) are taken here from the
                       bench's --requests-log, whose per-request ttft and itl
                       gaps have microsecond precision: the bench's own
                       histogram percentiles (in its --json, kept in this
                       script's JSON as bench_hist) are within 1 %, which at
                       20 ms is a quarter of a millisecond, the size of what
                       is measured here. "+direct" is the median over rounds
                       for the target minus the same for direct: the latency
                       the proxy adds. Warm-up requests are left out.
  late gaps per 1,000  (a, b, f, h: each round's line and the JSON,
                       itl_late_per_k) gaps longer than the simulator's
                       itl + 2 ms: at one stream the p99 of 1,000 gaps is
                       the 10th longest, so it moves by a whole delay when
                       ten gaps are late and not at all when nine are.
  events/s             token events the client received (ttft count + itl
                       count: one per token event) over the bench's
                       measured window.
  cpu s/M events       user + system CPU of the proxy's processes only
                       (/proc/PID/stat utime + stime; nginx: master and
                       workers; tokentap and HAProxy: every thread of the
                       one process), read just before each bench run and
                       1 s after it (so tokentap's stats flush for the run
                       is counted), divided by the token events forwarded in
                       that run, warm-up requests included; summed over
                       rounds. Clock ticks are 10 ms, so scenario (a), with
                       little traffic, is coarse.
  rss per stream (d)   each proxy is started fresh, warmed with two
                       requests, and its VmRSS (/proc/PID/status; nginx: the
                       sum over worker processes) read; then N streams are
                       opened through it, and once the simulator counts all N
                       in progress plus 2 s, VmRSS is read three times and the
                       largest kept: (during - before) / N.

Each proxy is configured at its best for streaming: nginx with
proxy_buffering off, HTTP/1.1 and keep-alive to the upstream, tcp_nodelay;
HAProxy in mode http with option http-no-delay and http-reuse always. Each
forwards on the same number of event loops, 1 by default (--workers 2 for
two): tokentap --workers N (its store, admin API and signal-handling main
thread come on top), nginx worker_processes N, HAProxy nbthread N. A
tokentap built before --workers existed forwards on one loop whatever
--workers says, and the report says so. nginx and HAProxy are Debian's packages,
installed with apt-get when missing (service starts are refused during the
install through policy-rc.d), and run as foreground processes as user nobody
with their own configuration, logs and (nginx) pid file in a temporary
directory; the system services are never used. The file descriptor limit is
raised to 65,536 where allowed, else to the hard limit (scenario d needs
about 2 per stream in each process).

Everything stays on loopback, every wait is bounded, and the processes this
script started (and only those, by PID) are stopped on exit, on errors and
on Ctrl-C. Written in Python (standard library only) rather than bash
because it reads JSON, takes medians and formats tables.

  contrib/lab/proxies.py                   # full run, about 8 minutes
  contrib/lab/proxies.py --quick           # about 2 minutes
  contrib/lab/proxies.py --build build-rel --workers 2 --json out.json

See docs/benchmarks.md.
"""

import argparse
import datetime
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
SETTLE_S = 1.0  # after each bench run: tokentap's stats flush interval
LATE_MS = 2.0  # a gap this much over the simulator's itl is late (itl_late_per_k)
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOBODY_UID, NOBODY_GID = 65534, 65534
FD_LIMIT = 65536
TARGETS = ("direct", "tokentap", "nginx", "haproxy")
PROXIES = TARGETS[1:]

# Scenario definitions. requests/warmup/duration are per bench run; "quick"
# replaces some of them for --quick.
SCENARIOS = {
    "a": dict(title="one stream at a time", concurrency=1, ttft_ms=20, itl_ms=10, tokens=6,
              requests=200, warmup=5, quick=dict(requests=50)),
    "b": dict(title="256 concurrent streams", concurrency=256, ttft_ms=20, itl_ms=20, tokens=128,
              requests=768, warmup=256, quick=dict(requests=256)),
    "c": dict(title="maximum event rate", concurrency=64, ttft_ms=0, itl_ms=0, tokens=512,
              duration="5s", warmup=64, quick=dict(duration="2s")),
    "d": dict(title="memory: idle-ish streams", ttft_ms=20, itl_ms=1000, tokens=3600),
    "e": dict(title="the store's flush: tokentap with the store (1 s flush) vs --data-dir off", concurrency=64,
              ttft_ms=5, itl_ms=10, tokens=512, duration="20s", warmup=64, quick=dict(duration="8s")),
}
# f-i: (a) and (c) with TLS on one side: "client" (bench -> proxy) or
# "upstream" (proxy -> simulator).
for _k, _base, _side in (("f", "a", "client"), ("g", "c", "client"), ("h", "a", "upstream"), ("i", "c", "upstream")):
    SCENARIOS[_k] = dict(SCENARIOS[_base], tls=_side,
                         title="%s, TLS %s" % (SCENARIOS[_base]["title"],
                                               "client -> proxy (proxy -> sim plain)" if _side == "client"
                                               else "proxy -> sim (client -> proxy plain)"))
# j: (c) with the simulator writing 16 token events per write (a stream
# interval above one token, speculative decoding), so that each read of the
# proxy brings many events to frame, classify and record.
SCENARIOS["j"] = dict(SCENARIOS["c"], events_per_write=16, title="maximum event rate, 16 events per upstream write")
# k, l: what a request and a connection cost, with answers of one token.
SCENARIOS["k"] = dict(title="one-token answers, keep-alive", concurrency=64, ttft_ms=0, itl_ms=0, tokens=1,
                      duration="5s", warmup=64, quick=dict(duration="2s"))
SCENARIOS["l"] = dict(SCENARIOS["k"], new_conn=True, title="one-token answers, a new connection per request")
LATENCY_KEYS = "abcfghijkl"
REQUEST_KEYS = "kl"  # reported per request, not per event
TLS_SUITE = "TLS_AES_128_GCM_SHA256"
STORE_TARGETS = ("direct", "tokentap", "tokentap-nostore")


class Failure(Exception):
    """A step that cannot go on; the message says what and where to look."""


# ---------------------------------------------------------------- processes

_started = []  # every Proc started, in order; stopped in reverse on exit


def _stat_fields(pid):
    """Fields of /proc/PID/stat after the command name (index 0 = state),
    or None if the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2:].split()


def cpu_ticks(pid):
    """(user, system) clock ticks: utime and stime."""
    f = _stat_fields(pid)
    return (0, 0) if f is None else (int(f[11]), int(f[12]))


def start_time(pid):
    f = _stat_fields(pid)
    return None if f is None else int(f[19])


def children_of(pid):
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            f = _stat_fields(int(name))
            if f is not None and int(f[1]) == pid:
                kids.append(int(name))
    return sorted(kids)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Proc:
    """One process started by this script, its output in a log file.
    Stopping sends SIGTERM, waits (bounded), then SIGKILL; the children it
    was seen to have (nginx workers) are killed too if still there, after
    checking their start time, so that a reused PID is never touched."""

    def __init__(self, name, argv, log_path, cwd=None, unprivileged=False, wrap=()):
        # wrap: a command run in front of argv (instr.py's valgrind), after
        # the drop of privileges so that it runs as the proxy does
        argv = list(wrap) + argv
        self.name, self.argv, self.log_path = name, argv, log_path
        self.children = {}  # pid -> start time
        if unprivileged and os.geteuid() == 0:
            argv = ["setpriv", "--reuid=%d" % NOBODY_UID, "--regid=%d" % NOBODY_GID,
                    "--clear-groups", "--"] + argv
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        self.pid = self.proc.pid
        _started.append(self)

    def alive(self):
        return self.proc.poll() is None

    def log_text(self, tail=40):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-tail:])
        except OSError:
            return ""

    def wait_line(self, pattern, timeout=None):
        """The first match of pattern in the log, waiting at most timeout
        (READY_TIMEOUT_S as it is at the call: a caller may raise it)."""
        timeout = READY_TIMEOUT_S if timeout is None else timeout
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(self.log_text(tail=200))
            if m:
                return m
            if not self.alive():
                break
            time.sleep(0.05)
        raise Failure("%s did not become ready (exit status %r); log %s:\n%s"
                      % (self.name, self.proc.poll(), self.log_path, self.log_text()))

    def wait_port(self, port, timeout=None):
        timeout = READY_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                break
            try:
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise Failure("%s is not accepting on %s:%d (exit status %r); log %s:\n%s"
                      % (self.name, LOOPBACK, port, self.proc.poll(), self.log_path, self.log_text()))

    def remember_children(self):
        for kid in children_of(self.pid):
            self.children[kid] = start_time(kid)
        return sorted(self.children)

    def stop(self):
        """Safe to call twice."""
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.proc.wait(STOP_TIMEOUT_S)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                    self.proc.wait(STOP_TIMEOUT_S)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        for kid, st in self.children.items():
            if st is not None and start_time(kid) == st:
                try:
                    os.kill(kid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not self.log.closed:
            self.log.close()


def stop_all():
    while _started:
        _started.pop().stop()


def clean_up(prog, work, ok, keep, kept):
    """The end of a lab script's run: every process started stopped; the
    work directory removed after a run that went through (unless --keep),
    else its path printed with what it holds (`kept`)."""
    stop_all()
    if work:
        if ok and not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("%s: %s kept in %s" % (prog, kept, work), file=sys.stderr)


def write_report(path, report):
    """The run's report as JSON, to the file --json named."""
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


def on_signal(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


def free_port():
    """A loopback port nothing listens on (bound, then closed). nginx and
    HAProxy take a fixed port in their configuration."""
    s = socket.socket()
    s.bind((LOOPBACK, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_get_json(port, path, timeout=5.0):
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        s.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path).encode())
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise Failure("GET %s on port %d: %r" % (path, port, head[:80]))
    return json.loads(body)


# ---------------------------------------------------------------- setup

def ensure_packages(no_install, wanted=(("nginx-light", "nginx"), ("haproxy", "haproxy"))):
    """nginx and haproxy (or the (package, command) pairs in `wanted`) from
    Debian, installed when missing. Installing must not start the system
    services: when no policy-rc.d exists, one that refuses every start is put
    in place for the install and removed after."""
    have = lambda b: shutil.which(b) or os.access("/usr/sbin/" + b, os.X_OK)
    missing = [p for p, b in wanted if not have(b)]
    if not missing:
        return
    if no_install:
        raise Failure("missing %s and --no-install given" % " ".join(missing))
    if os.geteuid() != 0:
        raise Failure("%s missing and installing needs root: apt-get install %s"
                      % (" and ".join(b for p, b in wanted if p in missing), " ".join(missing)))
    if "nginx-light" in missing:
        probe = subprocess.run(["apt-cache", "show", "nginx-light"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        if probe.returncode != 0:
            missing[missing.index("nginx-light")] = "nginx"
    print("proxies: installing %s with apt-get" % " ".join(missing), file=sys.stderr)
    policy = "/usr/sbin/policy-rc.d"
    own_policy = not os.path.exists(policy)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        if own_policy:
            with open(policy, "w") as f:
                f.write("#!/bin/sh\n# tokentap contrib/lab/proxies.py: no service starts while installing\nexit 101\n")
            os.chmod(policy, 0o755)
        for argv in (["apt-get", "update", "-qq"],
                     ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing):
            r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, timeout=900)
            if r.returncode != 0:
                raise Failure("%s failed with status %d" % (" ".join(argv), r.returncode))
    finally:
        if own_policy and os.path.exists(policy):
            os.unlink(policy)


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(need, FD_LIMIT)
    if os.geteuid() == 0 and hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            pass
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else min(hard, want)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def version_of(argv):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=10)
        return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_info(bins):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    debian = ""
    if os.path.exists("/etc/debian_version"):
        with open("/etc/debian_version") as f:
            debian = f.read().strip()
    return {
        "cpu": cpu, "cpus": os.cpu_count(), "memory_gib": round(mem_kib / 1048576, 1),
        "kernel": os.uname().release, "debian": debian,
        "tokentap": version_of([bins["tokentap"], "--version"]),
        # what the checkout was at when the run started (the binaries may be older)
        "source": version_of(["git", "-C", ROOT, "describe", "--always", "--dirty"]),
        "nginx": version_of(["nginx", "-v"]),
        "haproxy": version_of(["haproxy", "-v"]),
    }


# ---------------------------------------------------------------- the four servers

def start_sim(bins, work, pki=None):
    """The simulator; with `pki`, speaking TLS (TLS_SUITE only)."""
    argv = [bins["sim"], "--listen", LOOPBACK + ":0"]
    if pki:
        argv += ["--tls-cert", pki["cert"], "--tls-key", pki["key"], "--tls-ciphersuites", TLS_SUITE]
    p = Proc("tokentap-sim", argv, os.path.join(work, "sim-tls.log" if pki else "sim.log"))
    port = int(p.wait_line(r"^tokentap-sim listening on 127\.0\.0\.1:(\d+)$").group(1))
    return p, port


def make_pki(work):
    """A CA and an ECDSA P-256 server certificate for localhost and
    127.0.0.1, made with the openssl command; files readable by the
    unprivileged proxies. {"ca", "cert", "key", "pem" (cert + key, for
    HAProxy)}."""
    d = os.path.join(work, "pki")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)

    def openssl(*a):
        r = subprocess.run(["openssl"] + list(a), cwd=d, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            raise Failure("openssl %s failed: %s" % (a[0], r.stderr.strip()))

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=proxies-ca")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "srv.pem", "-days", "2", "-extfile", "ext.cnf")
    with open(os.path.join(d, "srv.pem")) as a, open(os.path.join(d, "srv.key")) as b, \
            open(os.path.join(d, "haproxy.pem"), "w") as out:
        out.write(a.read() + b.read())
    for n in os.listdir(d):
        os.chmod(os.path.join(d, n), 0o644)
    return {"ca": os.path.join(d, "ca.pem"), "cert": os.path.join(d, "srv.pem"), "key": os.path.join(d, "srv.key"),
            "pem": os.path.join(d, "haproxy.pem")}


class Target:
    """One thing the bench is pointed at. pids() are the processes whose CPU
    counts; rss_pids() those whose VmRSS counts (nginx: its workers)."""

    def __init__(self, name, port, proc=None, workers="-", https=False):
        self.name, self.port, self.proc, self.workers = name, port, proc, workers
        # https: the certificate names 127.0.0.1 too, and is checked against it
        self.url = "%s://%s:%d" % ("https" if https else "http", LOOPBACK, port)
        self.https = https

    def pids(self):
        if self.proc is None:
            return []
        return [self.proc.pid] + self.proc.remember_children()

    def rss_pids(self):
        if self.proc is None:
            return []
        kids = self.proc.remember_children()
        return kids if kids else [self.proc.pid]

    def cpu_ticks(self):
        """(user, system) ticks of the target's processes."""
        ts = [cpu_ticks(p) for p in self.pids()]
        return (sum(u for u, _ in ts), sum(k for _, k in ts))

    def rss_kib(self):
        return sum(rss_kib(p) for p in self.rss_pids())

    def check_alive(self):
        if self.proc is not None and not self.proc.alive():
            raise Failure("%s exited with status %r during the run; log %s:\n%s"
                          % (self.name, self.proc.proc.returncode, self.proc.log_path, self.proc.log_text()))

    def stop(self):
        if self.proc is not None:
            self.proc.stop()


def private_dir(work, name):
    """A directory the unprivileged proxy may write to."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(d, NOBODY_UID, NOBODY_GID)
    return d


def tokentap_has_workers(bins):
    h = subprocess.run([bins["tokentap"], "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=10).stdout
    return "--workers" in h


def start_tokentap(bins, work, sim_port, max_connections, workers, tag, store=True, tls=None, wrap=()):
    """tls: None, ("client", pki) for a TLS listener, or ("upstream", pki)
    for an https upstream at sim_port; wrap: as Proc's."""
    d = private_dir(work, "tokentap" + tag)
    conf = os.path.join(d, "tokentap.yaml")
    side, pki = tls or (None, None)
    with open(conf, "w") as f:
        f.write(TOKENTAP_CONF.format(sim_port=sim_port, max_connections=max_connections,
                                     scheme="https://localhost" if side == "upstream" else "http://127.0.0.1"))
        if side == "upstream":
            f.write("    tls: {ca_file: %s}\n" % pki["ca"])
        if side == "client":
            f.write("tls:\n  cert: %s\n  key: %s\n" % (pki["cert"], pki["key"]))
        # more top-level YAML for an A/B of a setting (e.g. "tenant: {json_field: user}")
        f.write(os.environ.get("TOKENTAP_LAB_CONF", ""))
    argv = [bins["tokentap"], "-c", conf, "--listen", LOOPBACK + ":0",
            "--admin", LOOPBACK + ":0", "--data-dir", os.path.join(d, "data") if store else "off"]
    if tokentap_has_workers(bins):
        argv += ["--workers", str(workers)]
    else:
        workers = 1
    p = Proc("tokentap", argv, os.path.join(d, "tokentap.log"), cwd=d, unprivileged=True, wrap=wrap)
    port = int(p.wait_line(r"listening on 127\.0\.0\.1:(\d+)(?: \(tls\))?, ").group(1))
    admin = int(p.wait_line(r"admin listening on 127\.0\.0\.1:(\d+)").group(1))
    t = Target("tokentap" if store else "tokentap-nostore", port, p, "%d loop%s" % (workers, "s" if workers > 1 else ""),
               https=side == "client")
    t.admin_port = admin
    return t


def nginx_temp_paths(d):
    """Every temporary directory nginx was built with, moved into d: it
    creates them at start and may not write under /var/lib/nginx."""
    v = subprocess.run(["nginx", "-V"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=10).stdout
    out = ""
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        flag = "--http-%s-temp-path=" % kind.replace("_", "-")
        if flag in v or kind in ("client_body", "proxy"):
            out += "    %s_temp_path %s/%s;\n" % (kind, d, kind)
    return out


def start_nginx(work, sim_port, workers, fds, tag, tls=None):
    d = private_dir(work, "nginx" + tag)
    port = free_port()
    conf = os.path.join(d, "nginx.conf")
    side, pki = tls or (None, None)
    listen_tls = upstream_tls = ""
    if side == "client":
        listen_tls = NGINX_LISTEN_TLS.format(cert=pki["cert"], key=pki["key"], suite=TLS_SUITE)
    if side == "upstream":
        upstream_tls = NGINX_UPSTREAM_TLS.format(ca=pki["ca"], suite=TLS_SUITE)
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(dir=d, port=port, sim_port=sim_port, workers=workers, fds=fds,
                                  conns=fds - 100, temp_paths=nginx_temp_paths(d),
                                  ssl=" ssl" if side == "client" else "", listen_tls=listen_tls,
                                  scheme="https" if side == "upstream" else "http", upstream_tls=upstream_tls))
    argv = ["nginx", "-p", d + "/", "-c", conf, "-e", os.path.join(d, "error.log")]
    p = Proc("nginx", argv, os.path.join(d, "stderr.log"), cwd=d, unprivileged=True)
    p.wait_port(port)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(p.remember_children()) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    if len(p.remember_children()) != workers:
        raise Failure("nginx: expected %d worker processes, found %d; log %s"
                      % (workers, len(p.children), p.log_path))
    return Target("nginx", port, p, "%d worker%s" % (workers, "s" if workers > 1 else ""), https=side == "client")


def start_haproxy(work, sim_port, workers, fds, tag, tls=None, wrap=()):
    d = private_dir(work, "haproxy" + tag)
    port = free_port()
    conf = os.path.join(d, "haproxy.cfg")
    side, pki = tls or (None, None)
    with open(conf, "w") as f:
        f.write(HAPROXY_CONF.format(
            dir=d, port=port, sim_port=sim_port, workers=workers, conns=(fds - 100) // 2,
            global_tls=HAPROXY_GLOBAL_TLS.format(suite=TLS_SUITE) if side else "",
            bind_tls=" ssl crt %s" % pki["pem"] if side == "client" else "",
            server_tls=" ssl verify required ca-file %s sni str(localhost)" % pki["ca"] if side == "upstream" else ""))
    argv = ["haproxy", "-db", "-f", conf]
    p = Proc("haproxy", argv, os.path.join(d, "haproxy.log"), cwd=d, unprivileged=True, wrap=wrap)
    p.wait_port(port)
    return Target("haproxy", port, p, "%d thread%s" % (workers, "s" if workers > 1 else ""), https=side == "client")


def start_proxy(name, bins, work, sim_port, args, tag="", tls=None):
    if name == "tokentap":
        return start_tokentap(bins, work, sim_port, max(10000, 2 * args.streams + 1000), args.workers, tag, tls=tls)
    if name == "nginx":
        return start_nginx(work, sim_port, args.workers, args.fds, tag, tls=tls)
    return start_haproxy(work, sim_port, args.workers, args.fds, tag, tls=tls)


# tokentap: the upstream and the connection cap from a file; listen, admin and
# data dir from flags. Access log off, as for the peers.
TOKENTAP_CONF = """\
access_log: off
limits:
  max_connections: {max_connections}
upstreams:
  - name: sim
    url: {scheme}:{sim_port}
"""

# nginx: the one location proxies everything to the simulator without
# buffering the response, over HTTP/1.1 keep-alive connections. backlog 1024
# is what tokentap listens with. keepalive_requests high so that neither side
# closes a connection the bench keeps reusing.
NGINX_CONF = """\
daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile {fds};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections {conns};
    multi_accept on;
}}

http {{
    access_log off;
{temp_paths}    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;

    upstream sim {{
        server 127.0.0.1:{sim_port};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}

    server {{
        listen 127.0.0.1:{port}{ssl} backlog=1024;
{listen_tls}        location / {{
            proxy_pass {scheme}://sim;
{upstream_tls}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_connect_timeout 5s;
            proxy_read_timeout 300s;
            proxy_send_timeout 300s;
        }}
    }}
}}
"""

# nginx over TLS, client side (scenarios f, g): one suite, 16 KiB records
# (each upstream read is flushed: proxy_buffering off), a shared session
# cache and tickets for the bench's resumption.
NGINX_LISTEN_TLS = """\
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        ssl_conf_command Ciphersuites {suite};
        ssl_buffer_size 16k;
        ssl_session_cache shared:tls:10m;
        ssl_session_tickets on;
"""

# nginx over TLS, upstream side (h, i): verified, SNI localhost, sessions
# reused across its keep-alive upstream connections.
NGINX_UPSTREAM_TLS = """\
            proxy_ssl_protocols TLSv1.3;
            proxy_ssl_conf_command Ciphersuites {suite};
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
"""

# HAProxy over TLS (f-i): one suite both ways, records up to 16 KiB. Server
# side sessions are reused by default (no no-ssl-reuse).
HAPROXY_GLOBAL_TLS = """\
    ssl-default-bind-options ssl-min-ver TLSv1.3
    ssl-default-bind-ciphersuites {suite}
    ssl-default-server-options ssl-min-ver TLSv1.3
    ssl-default-server-ciphersuites {suite}
    tune.ssl.maxrecord 16384
"""

# HAProxy: HTTP mode; http-no-delay so that small events are sent at once
# rather than held back for more data; idle server connections shared by all
# requests (http-reuse always). Timeouts as long as tokentap's.
HAPROXY_CONF = """\
global
    # pidfile: HAProxy writes it only as a daemon; in the foreground (-db)
    # the script knows the PID anyway.
    pidfile {dir}/haproxy.pid
    nbthread {workers}
    maxconn {conns}
{global_tls}
defaults
    mode http
    option http-no-delay
    http-reuse always
    timeout connect 5s
    timeout client 300s
    timeout server 300s
    timeout http-request 30s
    timeout http-keep-alive 75s
    maxconn {conns}

frontend fe
    bind 127.0.0.1:{port}{bind_tls}
    backlog 1024
    default_backend sim

backend sim
    server sim 127.0.0.1:{sim_port}{server_tls}
"""


# ---------------------------------------------------------------- bench runs

def bench_argv(bins, url, sc, json_path, seed, concurrency=None, quick=False, log_path=None, ca=None):
    p = dict(sc)
    if quick:
        p.update(sc.get("quick", {}))
    argv = [bins["bench"], "--url", url, "--concurrency", str(concurrency or p["concurrency"]),
            "--output-len", str(p["tokens"]), "--sim-headers", "--no-progress",
            "-H", "x-sim-ttft-ms: %d" % p["ttft_ms"], "-H", "x-sim-itl-ms: %d" % p["itl_ms"],
            "--seed", str(seed), "--json", json_path]
    if p.get("events_per_write"):
        argv += ["-H", "x-sim-events-per-write: %d" % p["events_per_write"]]
    if p.get("new_conn"):
        argv.append("--new-connection")
    if p.get("api"):
        argv += ["--api", p["api"]]
    if log_path:
        argv += ["--requests-log", log_path]
    if url.startswith("https://"):
        argv += ["--ca", ca, "--tls-ciphersuites", TLS_SUITE]
    for k in ("requests", "warmup", "duration"):
        if k in p:
            argv += ["--" + k, str(p[k])]
    return argv


def run_bench(argv, timeout, log_path):
    with open(log_path, "ab") as log:
        log.write(("\n$ %s\n" % " ".join(argv)).encode())
        log.flush()
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                           timeout=timeout, start_new_session=True)
    return r.returncode


def nearest_rank(sorted_xs, p):
    """The p-th percentile, nearest rank, as tokentap reports them."""
    if not sorted_xs:
        return None
    k = max(1, -(-len(sorted_xs) * p // 100))
    return sorted_xs[int(k) - 1]


def exact_percentiles(log_path, late_after_ms=None):
    """ttft and itl p50/p99 from the requests log's per-request values
    (microsecond precision) of the measured ok requests; the bench's
    histograms round to about 1 %, a quarter of a millisecond at 20 ms,
    which is the size of what is being measured here. With `late_after_ms`,
    also the gaps longer than that per 1,000 (itl_late_per_k): at one
    stream the p99 of 1,000 gaps is the 10th longest, so it jumps by the
    whole delay when ten gaps are late and not when nine are; the count
    does not."""
    ttft, itl, truncated = [], [], 0
    with open(log_path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("warmup") or not r.get("ok"):
                continue
            if r.get("ttft_ms") is not None:
                ttft.append(r["ttft_ms"])
            gaps = r.get("itl_ms") or []
            itl.extend(gaps)
            if r.get("itl_count", 0) > len(gaps):
                truncated += 1
    ttft.sort()
    itl.sort()
    return {"ttft_p50": nearest_rank(ttft, 50), "ttft_p99": nearest_rank(ttft, 99),
            "itl_p50": nearest_rank(itl, 50), "itl_p99": nearest_rank(itl, 99), "itl_p99_9": nearest_rank(itl, 99.9),
            "itl_max": itl[-1] if itl else None,
            "itl_late_per_k": (1000.0 * sum(1 for g in itl if g > late_after_ms) / len(itl)
                               if itl and late_after_ms is not None else None),
            "ttft_samples": len(ttft), "itl_samples": len(itl), "itl_truncated_requests": truncated}


def summarize_bench(path, log_path, late_after_ms=None):
    with open(path) as f:
        res = json.load(f)["result"]
    m = res["metrics"]
    w = res.get("warmup") or {}
    wm = w.get("metrics") or {}
    events = m["ttft"]["count"] + m["itl"]["count"]
    forwarded = events + (wm.get("ttft") or {}).get("count", 0) + (wm.get("itl") or {}).get("count", 0)
    elapsed = res["throughput"]["elapsed_s"] or 0
    errs = sum(res["errors"].values()) + sum((w.get("errors") or {}).values())
    out = exact_percentiles(log_path, late_after_ms)
    out.update({
        "bench_hist": {"ttft_p50": m["ttft"]["p50_ms"], "ttft_p99": m["ttft"]["p99_ms"],
                       "itl_p50": m["itl"]["p50_ms"], "itl_p99": m["itl"]["p99_ms"]},
        "events": events, "events_forwarded": forwarded, "elapsed_s": elapsed,
        "events_per_s": events / elapsed if elapsed else None,
        "ok": res["requests"]["ok"], "errors": errs, "tls": res.get("tls"),
        "requests_per_s": res["throughput"]["requests_per_s"],
        "requests_forwarded": res["requests"]["ok"] + (w.get("requests") or {}).get("ok", 0),
        "error_kinds": {k: v for k, v in res["errors"].items() if v},
    })
    return out


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_latency_scenario(key, targets, bins, args, work):
    """Scenarios a, b, c: rounds x targets, alternating."""
    sc = SCENARIOS[key]
    rounds = args.rounds
    runs = {t.name: [] for t in targets}
    cpu = {t.name: 0 for t in targets}
    cpu_sys = {t.name: 0 for t in targets}
    timeout = 600 if not args.quick else 300
    for r in range(rounds):
        for t in targets:
            jpath = os.path.join(work, "bench-%s-%s-%d.json" % (key, t.name, r))
            lpath = os.path.join(work, "requests-%s-%s-%d.jsonl" % (key, t.name, r))
            argv = bench_argv(bins, t.url, sc, jpath, seed=r, quick=args.quick, log_path=lpath,
                              ca=getattr(args, "pki", {}).get("ca"))
            c0 = t.cpu_ticks()
            t0 = time.monotonic()
            try:
                rc = run_bench(argv, timeout, os.path.join(work, "bench.log"))
            except subprocess.TimeoutExpired:
                raise Failure("tokentap-bench against %s ran past %d s in scenario (%s)" % (t.name, timeout, key))
            wall = time.monotonic() - t0
            time.sleep(SETTLE_S)
            c1 = t.cpu_ticks()
            ticks, sys_ticks = (c1[0] - c0[0]) + (c1[1] - c0[1]), c1[1] - c0[1]
            t.check_alive()
            if rc != 0 or not os.path.exists(jpath):
                raise Failure("tokentap-bench against %s exited %d in scenario (%s); see %s"
                              % (t.name, rc, key, os.path.join(work, "bench.log")))
            s = summarize_bench(jpath, lpath, sc["itl_ms"] + LATE_MS if sc["itl_ms"] else None)
            if t.https and not (s["tls"] and s["tls"]["cipher"] == TLS_SUITE):
                raise Failure("tokentap-bench against %s negotiated %r, not %s" % (t.name, s["tls"], TLS_SUITE))
            os.unlink(lpath)  # large in (b) and (c); the percentiles are kept
            s["cpu_s"] = ticks / CLK_TCK if t.proc else None
            s["cpu_sys_s"] = sys_ticks / CLK_TCK if t.proc else None
            s["wall_s"] = round(wall, 2)
            runs[t.name].append(s)
            cpu[t.name] += ticks
            cpu_sys[t.name] += sys_ticks
            per_m = (ticks / CLK_TCK) / s["events_forwarded"] * 1e6 if t.proc and s["events_forwarded"] else None
            if key in REQUEST_KEYS:
                per_req = (ticks / CLK_TCK) / s["requests_forwarded"] * 1e6 if t.proc and s["requests_forwarded"] else None
                print("  (%s) round %d/%d %-8s ttft p50 %7.3f p99 %7.3f  %9.0f requests/s%s%s"
                      % (key, r + 1, rounds, t.name, s["ttft_p50"] or 0, s["ttft_p99"] or 0, s["requests_per_s"] or 0,
                         "  %.1f cpu us/request" % per_req if per_req is not None else "",
                         "  ERRORS %s" % s["error_kinds"] if s["errors"] else ""), file=sys.stderr)
                continue
            print("  (%s) round %d/%d %-8s ttft p50 %7.3f p99 %7.3f  itl p50 %7.3f p99 %7.3f%s  %9.0f events/s%s%s"
                  % (key, r + 1, rounds, t.name, s["ttft_p50"] or 0, s["ttft_p99"] or 0, s["itl_p50"] or 0,
                     s["itl_p99"] or 0,
                     "  late/k %5.1f" % s["itl_late_per_k"] if s["itl_late_per_k"] is not None else "",
                     s["events_per_s"] or 0,
                     "  %.3g cpu s/M ev (%.0f %% system)" % (per_m, 100.0 * sys_ticks / ticks if ticks else 0)
                     if per_m is not None else "",
                     "  ERRORS %s" % s["error_kinds"] if s["errors"] else ""), file=sys.stderr)
    out = {}
    for t in targets:
        rs = runs[t.name]
        fw = sum(x["events_forwarded"] for x in rs)
        e = {k: median([x[k] for x in rs])
             for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "itl_p99_9", "itl_max", "itl_late_per_k",
                       "events_per_s", "requests_per_s")}
        e["workers"] = t.workers
        reqs = sum(x["requests_forwarded"] for x in rs)
        e["cpu_us_per_request"] = (cpu[t.name] / CLK_TCK) / reqs * 1e6 if t.proc and reqs else None
        e["cpu_sys_us_per_request"] = (cpu_sys[t.name] / CLK_TCK) / reqs * 1e6 if t.proc and reqs else None
        e["errors"] = sum(x["errors"] for x in rs)
        e["events_forwarded"] = fw
        e["cpu_s"] = cpu[t.name] / CLK_TCK if t.proc else None
        e["cpu_s_per_m_events"] = (cpu[t.name] / CLK_TCK) / fw * 1e6 if t.proc and fw else None
        # the kernel's share: system calls, TCP and TLS offload work done on the proxy's behalf
        e["cpu_sys_s_per_m_events"] = (cpu_sys[t.name] / CLK_TCK) / fw * 1e6 if t.proc and fw else None
        e["rounds"] = rs
        out[t.name] = e
    d = out["direct"]
    for name, e in out.items():
        for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "itl_p99_9"):
            e["added_" + k] = (e[k] - d[k]) if name != "direct" and e[k] is not None and d[k] is not None else None
    p = dict(sc)
    if args.quick:
        p.update(sc.get("quick", {}))
    p.pop("quick", None)
    return {"config": dict(p, rounds=rounds), "targets": out}


def sim_in_progress(sim_port):
    s = http_get_json(sim_port, "/sim/stats")
    return s["requests"] - s["completed"] - s["aborted"]


def wait_sim_idle(sim_port, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sim_in_progress(sim_port) == 0:
            return True
        time.sleep(0.2)
    return False


def run_memory_scenario(bins, args, work, sim_port, rounds):
    """Scenario d: per proxy and round, a fresh proxy; RSS before and during
    N concurrent one-token-per-second streams."""
    sc = SCENARIOS["d"]
    n = args.streams
    runs = {p: [] for p in PROXIES}
    for r in range(rounds):
        for name in PROXIES:
            if not wait_sim_idle(sim_port):
                raise Failure("the simulator still has streams in progress 60 s after the previous (d) run")
            t = start_proxy(name, bins, work, sim_port, args, tag="-d%d" % r)
            bench = None
            try:
                # Warm: the first requests allocate what every later one reuses.
                wj = os.path.join(work, "bench-d-warm-%s-%d.json" % (name, r))
                warm = [bins["bench"], "--url", t.url, "--requests", "2", "--output-len", "4", "--sim-headers",
                        "--no-progress", "-H", "x-sim-ttft-ms: 0", "-H", "x-sim-itl-ms: 0", "--json", wj]
                if run_bench(warm, 60, os.path.join(work, "bench.log")) != 0:
                    raise Failure("warm-up requests through %s failed; see %s" % (name, os.path.join(work, "bench.log")))
                time.sleep(1.5)
                before = t.rss_kib()
                jpath = os.path.join(work, "bench-d-%s-%d.json" % (name, r))
                argv = [bins["bench"], "--url", t.url, "--concurrency", str(n), "--requests", str(n),
                        "--output-len", str(sc["tokens"]), "--sim-headers", "--no-progress",
                        "-H", "x-sim-ttft-ms: %d" % sc["ttft_ms"], "-H", "x-sim-itl-ms: %d" % sc["itl_ms"],
                        "--timeout", "120s", "--json", jpath]
                log = open(os.path.join(work, "bench.log"), "ab")
                log.write(("\n$ %s\n" % " ".join(argv)).encode())
                log.flush()
                bench = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
                log.close()
                t0 = time.monotonic()
                active = 0
                while time.monotonic() - t0 < 90:
                    active = sim_in_progress(sim_port)
                    if active >= n or bench.poll() is not None:
                        break
                    time.sleep(0.25)
                ramp_s = time.monotonic() - t0
                time.sleep(2.0)
                during = 0
                for _ in range(3):
                    during = max(during, t.rss_kib())
                    time.sleep(0.5)
                active = sim_in_progress(sim_port)
                t.check_alive()
                if bench.poll() is None:
                    bench.send_signal(signal.SIGINT)
                try:
                    bench.wait(60)
                except subprocess.TimeoutExpired:
                    bench.kill()
                    bench.wait(10)
                errs, kinds = None, {}
                if os.path.exists(jpath):
                    with open(jpath) as f:
                        res = json.load(f)["result"]
                    errs = sum(res["errors"].values())
                    kinds = {k: v for k, v in res["errors"].items() if v}
                rec = {"streams_asked": n, "streams_in_progress": active, "ramp_s": round(ramp_s, 2),
                       "rss_before_kib": before, "rss_during_kib": during,
                       "kib_per_stream": (during - before) / active if active else None,
                       "errors": errs, "error_kinds": kinds}
                runs[name].append(rec)
                print("  (d) round %d/%d %-8s %d streams in progress after %.1f s; RSS %d -> %d KiB: %.2f KiB/stream%s"
                      % (r + 1, rounds, name, active, ramp_s, before, during, rec["kib_per_stream"] or 0,
                         "  ERRORS %s" % kinds if errs else ""), file=sys.stderr)
            finally:
                if bench is not None and bench.poll() is None:
                    bench.kill()
                    bench.wait(10)
                t.stop()
                if t.proc in _started:
                    _started.remove(t.proc)
    out = {}
    for name in PROXIES:
        rs = runs[name]
        out[name] = {
            "workers": None,
            "rss_before_kib": median([x["rss_before_kib"] for x in rs]),
            "rss_during_kib": median([x["rss_during_kib"] for x in rs]),
            "kib_per_stream": median([x["kib_per_stream"] for x in rs]),
            "streams_in_progress": median([x["streams_in_progress"] for x in rs]),
            "ramp_s": median([x["ramp_s"] for x in rs]),
            "errors": sum(x["errors"] or 0 for x in rs),
            "rounds": rs,
        }
    cfg = {k: v for k, v in sc.items() if k != "quick"}
    cfg.update(streams=n, rounds=rounds)
    return {"config": cfg, "targets": out}


# ---------------------------------------------------------------- report

def fmt(x, nd=3, signed=False):
    """x with nd decimals; nd None: three significant digits (CPU per event
    spans 0.3 in (c) to 20 in (b))."""
    if x is None:
        return "-"
    if nd is None:
        return "%.3g" % x
    return ("%+.*f" if signed else "%.*f") % (nd, x)


def scenario_heading(key, sc):
    c = sc["config"]
    if key == "d":
        return ("(d) %s: %d concurrent streams, 1 token/s (itl %d ms), each proxy started fresh, %d round(s)"
                % (c["title"], c["streams"], c["itl_ms"], c["rounds"]))
    load = ("%d requests" % c["requests"]) if "requests" in c else ("%s" % c["duration"])
    epw = (", %d events per write" % c["events_per_write"]) if c.get("events_per_write") else ""
    return ("(%s) %s: concurrency %d, sim ttft %d ms, itl %d ms%s, %d tokens; %s + %d warm-up per run, %d round(s)"
            % (key, c["title"], c["concurrency"], c["ttft_ms"], c["itl_ms"], epw, c["tokens"], load, c["warmup"],
               c["rounds"]))


def render_table(report):
    lines = []
    for key in sorted(report["scenarios"]):
        sc = report["scenarios"][key]
        lines.append(scenario_heading(key, sc))
        if key == "e":
            lines.append("%-17s %8s %8s %8s %9s %9s %8s %10s %6s" % (
                "target", "itl p50", "itl p99", "+direct", "itl p99.9", "+direct", "itl max", "events/s", "errors"))
            for name in STORE_TARGETS:
                e = sc["targets"][name]
                lines.append("%-17s %8s %8s %8s %9s %9s %8s %10s %6d" % (
                    name, fmt(e["itl_p50"]), fmt(e["itl_p99"]), fmt(e["added_itl_p99"], signed=True),
                    fmt(e["itl_p99_9"]), fmt(e["added_itl_p99_9"], signed=True), fmt(e["itl_max"]),
                    fmt(e["events_per_s"], 0), e["errors"]))
        elif key == "d":
            lines.append("%-9s %-10s %9s %10s %14s %14s %14s %7s" % (
                "target", "workers", "streams", "s to open", "RSS before KiB", "RSS during KiB", "KiB per stream",
                "errors"))
            for name in PROXIES:
                e = sc["targets"][name]
                lines.append("%-9s %-10s %9s %10s %14s %14s %14s %7d" % (
                    name, report["workers"][name], fmt(e["streams_in_progress"], 0), fmt(e.get("ramp_s"), 2),
                    fmt(e["rss_before_kib"], 0), fmt(e["rss_during_kib"], 0), fmt(e["kib_per_stream"], 2),
                    e["errors"]))
        elif key in REQUEST_KEYS:
            lines.append("%-9s %-10s %8s %8s %8s %8s %11s %12s %10s %6s" % (
                "target", "workers", "ttft p50", "+direct", "ttft p99", "+direct", "requests/s", "cpu us/req",
                "of it sys", "errors"))
            for name in TARGETS:
                e = sc["targets"][name]
                lines.append("%-9s %-10s %8s %8s %8s %8s %11s %12s %10s %6d" % (
                    name, e["workers"], fmt(e["ttft_p50"]), fmt(e["added_ttft_p50"], signed=True),
                    fmt(e["ttft_p99"]), fmt(e["added_ttft_p99"], signed=True), fmt(e["requests_per_s"], 0),
                    fmt(e["cpu_us_per_request"], 1), fmt(e.get("cpu_sys_us_per_request"), 1), e["errors"]))
        else:
            lines.append("%-9s %-10s %8s %8s %8s %8s %8s %8s %8s %8s %10s %10s %10s %6s" % (
                "target", "workers", "ttft p50", "+direct", "ttft p99", "+direct",
                "itl p50", "+direct", "itl p99", "+direct", "events/s", "cpu s/M ev", "of it sys", "errors"))
            for name in TARGETS:
                e = sc["targets"][name]
                lines.append("%-9s %-10s %8s %8s %8s %8s %8s %8s %8s %8s %10s %10s %10s %6d" % (
                    name, e["workers"], fmt(e["ttft_p50"]), fmt(e["added_ttft_p50"], signed=True),
                    fmt(e["ttft_p99"]), fmt(e["added_ttft_p99"], signed=True),
                    fmt(e["itl_p50"]), fmt(e["added_itl_p50"], signed=True),
                    fmt(e["itl_p99"]), fmt(e["added_itl_p99"], signed=True),
                    fmt(e["events_per_s"], 0), fmt(e["cpu_s_per_m_events"], None),
                    fmt(e.get("cpu_sys_s_per_m_events"), None), e["errors"]))
        lines.append("")
    if set(report["scenarios"]) & set(LATENCY_KEYS):
        lines.append("latencies in ms: medians over rounds of each run's percentile; +direct = target minus direct;")
        lines.append("events/s: token events the client counted per second (median); cpu s/M ev: the proxy's user+system")
        lines.append("CPU seconds per million token events forwarded, pooled over rounds; of it sys: the system (kernel)")
        lines.append("part of that figure. (k), (l): requests/s the client completed (median) and the proxy's CPU")
        lines.append("microseconds per request forwarded, pooled; (d): s to open, from the start until the simulator")
        lines.append("had every stream in progress (median).")
    n = report["peer_workers"]
    k = report["tokentap_workers"]
    lines.append("workers: tokentap forwarded on %d event loop%s (its store, admin API and main thread come on top);"
                 % (k, "s" if k > 1 else ""))
    lines.append("nginx ran %d worker process%s (and its master), HAProxy %d thread%s."
                 % (n, "es" if n > 1 else "", n, "s" if n > 1 else ""))
    if report["checks"]:
        lines.append("")
        lines.append("targets (docs/benchmarks.md):")
        for c in report["checks"]:
            lines.append("  %-6s %s" % (c["verdict"], c["text"]))
    return "\n".join(lines)


def check_targets(report):
    """The targets (docs/benchmarks.md), judged strictly on this
    run's numbers: on a busy machine a verdict can flip between runs, so
    read it beside the per-round values."""
    checks = []
    S = report["scenarios"]

    def best(values, lower=True):
        vs = [v for v in values if v is not None]
        return (min(vs) if lower else max(vs)) if vs else None

    def judge(text, mine, other, lower=True, nd=3):
        if mine is None or other is None:
            v = "n/a"
        else:
            v = "met" if ((mine <= other) if lower else (mine >= other)) else "MISSED"
        checks.append({"verdict": v, "text": text + ": tokentap %s, best peer %s" % (fmt(mine, nd), fmt(other, nd)),
                       "tokentap": mine, "peer": other})

    def limit(text, mine, bound, nd):
        v = "n/a" if mine is None else ("met" if mine < bound else "MISSED")
        checks.append({"verdict": v, "text": text % fmt(mine, nd), "tokentap": mine, "peer": bound})

    for key in ("a", "b"):
        if key in S:
            T = S[key]["targets"]
            for m in ("ttft_p99", "itl_p99"):
                judge("(%s) added %s no worse than the better of nginx and HAProxy (ms)" % (key, m.replace("_", " ")),
                      T["tokentap"]["added_" + m], best([T["nginx"]["added_" + m], T["haproxy"]["added_" + m]]))
    if "a" in S:
        limit("(a) added ttft p50 under 0.3 ms: tokentap %s ms", S["a"]["targets"]["tokentap"]["added_ttft_p50"], 0.3, 3)
    for key in ("c", "j"):
        if key in S:
            T = S[key]["targets"]
            judge("(%s) events/s at least the better of nginx and HAProxy" % key, T["tokentap"]["events_per_s"],
                  best([T["nginx"]["events_per_s"], T["haproxy"]["events_per_s"]], lower=False), lower=False, nd=0)
    for key in ("b", "c"):
        if key in S:
            T = S[key]["targets"]
            judge("(%s) CPU s per million forwarded events at most the better of the two" % key,
                  T["tokentap"]["cpu_s_per_m_events"],
                  best([T["nginx"]["cpu_s_per_m_events"], T["haproxy"]["cpu_s_per_m_events"]]), nd=None)
    if "j" in S:
        # target 7: in plain HTTP, at least 10 % below the better peer
        T = S["j"]["targets"]
        peer = best([T["nginx"]["cpu_s_per_m_events"], T["haproxy"]["cpu_s_per_m_events"]])
        judge("(j) CPU s per million forwarded events at least 10 % below the better of the two (0.9 x)",
              T["tokentap"]["cpu_s_per_m_events"], None if peer is None else 0.9 * peer, nd=None)
    for key in REQUEST_KEYS:
        if key in S:
            T = S[key]["targets"]
            judge("(%s) requests/s at least HAProxy's" % key, T["tokentap"]["requests_per_s"],
                  T["haproxy"]["requests_per_s"], lower=False, nd=0)
            judge("(%s) CPU us per request at most HAProxy's" % key, T["tokentap"]["cpu_us_per_request"],
                  T["haproxy"]["cpu_us_per_request"], nd=1)
    if "d" in S:
        judge("(d) seconds until every stream is in progress, at most HAProxy's",
              S["d"]["targets"]["tokentap"].get("ramp_s"), S["d"]["targets"]["haproxy"].get("ramp_s"), nd=2)
        limit("(d) under 16 KiB RSS per idle stream: tokentap %s KiB", S["d"]["targets"]["tokentap"]["kib_per_stream"],
              16, 2)
    if "e" in S:
        T = S["e"]["targets"]
        on, off = T["tokentap"]["itl_p99_9"], T["tokentap-nostore"]["itl_p99_9"]
        # "does not show": within the larger of 0.5 ms and 5 % of the store-off value
        checks.append({"verdict": "n/a" if on is None or off is None else
                       ("met" if on <= off + max(0.5, 0.05 * off) else "MISSED"),
                       "text": "(e) the store's flush does not show in itl p99.9 (within 0.5 ms or 5 %%): store on %s, "
                       "store off %s ms" % (fmt(on), fmt(off)), "tokentap": on, "peer": off})
    return checks


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description="tokentap vs nginx vs HAProxy on tokentap-sim streams (docs/benchmarks.md)")
    ap.add_argument("--build", metavar="DIR", help="build directory holding tokentap, contrib/sim/tokentap-sim and "
                    "contrib/bench/tokentap-bench (default: build/, built first with contrib/build.sh)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per latency scenario (default 3, --quick 2)")
    ap.add_argument("--memory-rounds", type=int, default=None, help="rounds of scenario d (default 3, --quick 1)")
    ap.add_argument("--quick", action="store_true", help="fewer requests and rounds: about 2 minutes")
    ap.add_argument("--workers", type=int, choices=(1, 2), default=1,
                    help="event loops of every proxy: tokentap --workers, nginx worker processes, HAProxy threads "
                    "(default 1)")
    ap.add_argument("--streams", type=int, default=5000, help="concurrent streams in scenario d (default 5000)")
    ap.add_argument("--scenarios", default="abcde",
                    help="which of a-l to run (default abcde; f-i are (a) and (c) over TLS, j (c) with 16 "
                    "events per upstream write, k and l one-token answers on kept and new connections; see above)")
    ap.add_argument("--json", metavar="PATH", help="write the whole report as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (configs, logs, bench JSON)")
    ap.add_argument("--no-install", action="store_true", help="never run apt-get; fail if nginx or haproxy is missing")
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = 2 if a.quick else 3
    if a.memory_rounds is None:
        a.memory_rounds = 1 if a.quick else 3
    if not 1 <= a.rounds <= 20 or not 1 <= a.memory_rounds <= 20:
        ap.error("--rounds and --memory-rounds take 1 to 20")
    if not 1 <= a.streams <= 9000:
        ap.error("--streams takes 1 to 9000 (tokentap-bench runs at most 10,000 connections)")
    if not a.scenarios or set(a.scenarios) - set("abcdefghijkl"):
        ap.error("--scenarios takes letters from abcdefghijkl, e.g. --scenarios ab")
    return a


def find_binaries(args):
    if args.build is None:
        build = os.path.join(ROOT, "build")
        r = subprocess.run([os.path.join(ROOT, "contrib", "build.sh")], stdin=subprocess.DEVNULL, timeout=1800)
        if r.returncode != 0:
            raise Failure("contrib/build.sh failed")
    else:
        build = os.path.abspath(args.build)
    bins = {"tokentap": os.path.join(build, "tokentap"),
            "sim": os.path.join(build, "contrib", "sim", "tokentap-sim"),
            "bench": os.path.join(build, "contrib", "bench", "tokentap-bench")}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            raise Failure("%s not found; build first: contrib/build.sh (or cmake into the --build DIR)" % b)
    return bins


def main(argv):
    args = parse_args(argv)
    # SIGINT too: a shell starts background jobs with it ignored, and a
    # script stopped that way must still clean up.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    t_start = time.monotonic()
    work = None
    ok = False
    try:
        ensure_packages(args.no_install)
        bins = find_binaries(args)
        fds = args.fds = raise_fd_limit(4 * args.streams + 2000)
        if fds < 2 * args.streams + 1000 and "d" in args.scenarios:
            raise Failure("the file descriptor limit is %d; scenario d needs about %d (run as root, or lower --streams)"
                          % (fds, 2 * args.streams + 1000))
        work = tempfile.mkdtemp(prefix="tokentap-proxies-")
        os.chmod(work, 0o755)
        info = machine_info(bins)
        print("proxies: %s, %d CPUs; kernel %s; %s; %s; %s; fd limit %d; work dir %s"
              % (info["cpu"], info["cpus"], info["kernel"], info["tokentap"], info["nginx"], info["haproxy"],
                 fds, work), file=sys.stderr)

        tt_workers = args.workers if tokentap_has_workers(bins) else 1
        sim, sim_port = start_sim(bins, work)
        report = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join(["contrib/lab/proxies.py"] + list(argv)),
            "machine": info, "fd_limit": fds, "peer_workers": args.workers, "tokentap_workers": tt_workers,
            "workers": {"direct": "-", "tokentap": "%d loop%s" % (tt_workers, "s" * (tt_workers > 1)),
                        "nginx": "%d worker%s" % (args.workers, "s" * (args.workers > 1)),
                        "haproxy": "%d thread%s" % (args.workers, "s" * (args.workers > 1))},
            "scenarios": {}, "checks": [],
        }
        latency = [k for k in "abcjkl" if k in args.scenarios]
        if latency:
            targets = [Target("direct", sim_port)]
            for name in PROXIES:
                targets.append(start_proxy(name, bins, work, sim_port, args))
            print("proxies: sim :%d, tokentap :%d (admin :%d), nginx :%d, haproxy :%d"
                  % (sim_port, targets[1].port, targets[1].admin_port, targets[2].port, targets[3].port),
                  file=sys.stderr)
            for key in latency:
                print("proxies: scenario (%s) %s" % (key, SCENARIOS[key]["title"]), file=sys.stderr)
                report["scenarios"][key] = run_latency_scenario(key, targets, bins, args, work)
            for t in targets[1:]:
                t.stop()
                _started.remove(t.proc)
        for side, keys in (("client", "fg"), ("upstream", "hi")):
            keys = [k for k in keys if k in args.scenarios]
            if not keys:
                continue
            if not getattr(args, "pki", None):
                args.pki = make_pki(work)
                _, args.tls_sim_port = start_sim(bins, work, args.pki)
            tls = (side, args.pki)
            if side == "client":
                targets = [Target("direct", args.tls_sim_port, https=True)]
                up_port = sim_port
            else:
                targets = [Target("direct", sim_port)]
                up_port = args.tls_sim_port
            for name in PROXIES:
                targets.append(start_proxy(name, bins, work, up_port, args, tag="-tls-" + side, tls=tls))
            print("proxies: TLS %s side: direct %s, tokentap %s, nginx %s, haproxy %s"
                  % (side, targets[0].url, targets[1].url, targets[2].url, targets[3].url), file=sys.stderr)
            for key in keys:
                print("proxies: scenario (%s) %s" % (key, SCENARIOS[key]["title"]), file=sys.stderr)
                report["scenarios"][key] = run_latency_scenario(key, targets, bins, args, work)
            for t in targets[1:]:
                t.stop()
                _started.remove(t.proc)
        if "e" in args.scenarios:
            print("proxies: scenario (e) %s" % SCENARIOS["e"]["title"], file=sys.stderr)
            targets = [Target("direct", sim_port),
                       start_tokentap(bins, work, sim_port, 10000, tt_workers, "-store"),
                       start_tokentap(bins, work, sim_port, 10000, tt_workers, "-nostore", store=False)]
            report["scenarios"]["e"] = run_latency_scenario("e", targets, bins, args, work)
            for t in targets[1:]:
                t.stop()
                _started.remove(t.proc)
        if "d" in args.scenarios:
            print("proxies: scenario (d) %d streams" % args.streams, file=sys.stderr)
            report["scenarios"]["d"] = run_memory_scenario(bins, args, work, sim_port, args.memory_rounds)
        report["checks"] = check_targets(report)
        report["runtime_s"] = round(time.monotonic() - t_start, 1)
        print(render_table(report))
        print("\nrun: %s; %s; %d CPUs; kernel %s; %s (checkout %s); %s; %s; %.0f s"
              % (report["date"], info["cpu"], info["cpus"], info["kernel"], info["tokentap"], info["source"],
                 info["nginx"], info["haproxy"], report["runtime_s"]))
        if args.json:
            write_report(args.json, report)
        ok = True
        return 0
    except Failure as e:
        print("proxies: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("proxies: interrupted", file=sys.stderr)
        return 130
    finally:
        clean_up("proxies", work, ok, args.keep, "logs and configs")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
