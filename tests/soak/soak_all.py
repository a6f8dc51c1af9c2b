#!/usr/bin/env python3
"""soak_all.py — the soak with every feature of tokentap on at once, and
exact accounting at the end (docs/security.md, "Soak with everything on").

What runs, all on 127.0.0.1:

  - tokentap (-c FILE, two workers, --admin) with a TLS listener: every
    client speaks TLS to it;
  - upstreams over TLS, each certificate checked against a CA made here
    with the openssl command: simulators `a` and `b` (a split with
    stickiness), `shadow` (the mirror's target), and `flaky`, a Python
    upstream that resets connections on request;
  - engine scraping of `a` and `b` (their /metrics over https, every
    second), the workload capture, the access log, the store;
  - a reload every --reload-every seconds (SIGHUP with a rewritten file)
    switching between two route sets: `main` (a:b 1:1, sticky by header,
    half mirrored) and `main-b` (a:b 1:3, sticky by the body's `user`, a
    quarter mirrored) plus `messages` (the Anthropic path to `a` alone);
  - /metrics scraped every second in both expositions (text and
    protobuf), each page checked;
  - simulator `b` stopped (SIGKILL or SIGTERM, in turn) every
    --flap-every seconds and started again on the same port
    --flap-down seconds later: the upstream that disappears and returns;
  - Python clients in threads, each on a keep-alive TLS connection:
    streams (chat and messages) and whole answers, sticky by session;
    clients that leave mid-stream, before the first token, mid-upload
    (after 100 Continue) or inside the request head, with a FIN or an RST;
    and requests to the flaky upstream that it answers, answers and
    closes, resets mid-stream or resets before answering.

A warm-up, then the soak proper; after each, traffic stops and tokentap is
left idle: the fds and RSS after the warm-up are the idle baseline. While
traffic runs, fds and RSS are sampled every 2 s.

Checks, each printed with its numbers:

  clients     every client saw an outcome its scenario allows
  accesslog   every request the clients made is in the access log once,
              with the status class and error its client's view implies;
              nothing else is (a head cut short is not a request); every
              mirrored copy names a request of a mirrored route
  counts      /stats?window=all = /metrics (text) = /metrics (protobuf)
              per (route, upstream), by status class and error kind; those
              = the access log = /upstreams per upstream (the access log
              names no route); the primaries' totals = the clients' counts
  workload    one trace line per primary request, none dropped
  reloads     every SIGHUP reloaded (a "reloaded" line each), none failed
  scrapes     every /metrics page of either format parsed; the engine
              scrapes of a and b succeeded, b's again after each return
  fds         idle: the same count after the soak as after the warm-up;
              under load: the last third's median at most the first
              third's + 10 %
  rss         idle: at most +10 % (+25 % under ASan) over the baseline;
              under load: the last third's median at most the first
              third's + the same; the short run +20 % (+30 %), its soak
              phase lying inside the store's 360 s ring fill
  exit        tokentap and the simulators exit 0 on SIGTERM
  sanitizer   no ASan/LSan/UBSan report from tokentap or any simulator
              (meaningful when the binaries are -DTOKENTAP_SANITIZE=ON)

    tests/soak/soak_all.py              # 20 minutes, 32 clients
    tests/soak/soak_all.py --short      # 2 minutes, 10 clients (ctest soak_all_short)
    tests/soak/soak_all.py --duration 10m --without workload,mirror   # features left off

Binaries from TOKENTAP_BIN and TOKENTAP_SIM_BIN (set by ctest), else
build/. Exit 0 when every check passes, 1 otherwise (FAILED lines), 2 for a
bad command line. Every loop is bounded in count and time; only processes
started here are stopped, by their PIDs.
"""

import argparse
import collections
import json
import os
import random
import re
import signal
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # nothing written into the source tree

import harness  # noqa: E402
import soak  # noqa: E402  (the flaky upstream's handler, RSS reading, durations)
from test_tls import make_pki  # noqa: E402

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
FLAKY_HOST = "flaky.soak"
PIN = "x-soak-pin"  # the override header: pins the client aborts to `a`, which never goes away
SESSION = "x-soak-session"
PROTO_ACCEPT = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"

IO_TIMEOUT_S = 30.0
QUIET_TIMEOUT_S = 40.0
FD_TIMEOUT_S = 15.0
STATS_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0
SAMPLE_EVERY_S = 2.0
# Idle RSS at the end over the idle baseline, and the under-load last-third
# median over the first third's (docs/security.md says why these): the long
# run's warm-up outlasts the store's 360 s ring of per-second slices, so
# after it RSS has nothing left to fill; the short run's soak phase lies
# inside that fill (measured: +7 % under load, +11 % idle, plain), so its
# limits leave room for it and catch only gross growth.
RSS_GROWTH_MAX = {"long": 0.10, "short": 0.20}
RSS_GROWTH_MAX_SANITIZED = {"long": 0.25, "short": 0.30}
FD_LOAD_GROWTH_MAX = 0.10
# A 5xx the route's own upstreams can cause while `b` goes away: its
# connection reset (a request sent, no answer), refused on the replay of a
# stale pooled connection, or a connect that timed out.
MAIN_5XX_KINDS = ("upstream_reset", "connect_failed", "timeout")
# tokentap's 502 for a pooled connection the server closed too long after
# the request went out for a POST to be sent again
STALE_502 = b"closed the connection before responding"
# tokentap's log line for a request answered 502 because its upstream
# connection failed before a response byte
FAILED_BEFORE = re.compile(r"502 upstream \S+ connection failed before responding request (\S+)")

# scenario -> weight in the clients' mix
MIX = (("stream", 78), ("whole", 6), ("abort_mid_stream", 3), ("abort_before_first_token", 2),
       ("abort_mid_upload", 2), ("abort_in_head", 1), ("flaky_ok", 2), ("flaky_ok_close", 2),
       ("flaky_reset_mid", 2), ("flaky_reset_before", 2))
# what tokentap must record for a scenario whose outcome the client cannot
# vary: (route kind, status class, error); None: not a request
FIXED = {
    "abort_mid_stream": ("main", "2xx", "client_aborted"),
    "abort_before_first_token": ("main", "2xx", "client_aborted"),
    "abort_mid_upload": ("main", "none", "client_aborted"),
    "abort_in_head": None,
    **soak.FLAKY_OUTCOMES,
}


def log(msg):
    print("[soak_all %7.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


T0 = time.monotonic()


# --------------------------------------------------------------------------
# the two expositions, checked


TEXT_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? '
                       r'(?:[-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|Inf|NaN))(?: -?[0-9]+)?$')
COUNTER_LINE = re.compile(r'^tokentap_(requests|errors)_total\{([^}]*)\} (\d+)$')


def check_text(body):
    """Parses a text exposition; returns its request and error counters, or
    raises ValueError naming the first bad line."""
    text = body.decode("utf-8")  # raises on anything that is not UTF-8
    if not text.endswith("\n"):
        raise ValueError("the page does not end with a newline")
    counts = []
    for n, line in enumerate(text.split("\n")[:-1]):
        if line.startswith("# HELP ") or line.startswith("# TYPE ") or line == "# EOF":
            continue
        if not TEXT_LINE.match(line):
            raise ValueError("line %d: %r" % (n + 1, line[:200]))
        m = COUNTER_LINE.match(line)
        if m:
            counts.append((m.group(1), dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2))), int(m.group(3))))
    return counts


def _varint(buf, i):
    shift = v = 0
    for _ in range(10):
        if i >= len(buf):
            raise ValueError("varint past the end")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, i
        shift += 7
    raise ValueError("varint too long")


def _fields(buf):
    """(field number, wire type, value) of one protobuf message; value is
    an int (varint, fixed) or bytes (length-delimited)."""
    out = []
    i = 0
    for _ in range(1 << 20):
        if i == len(buf):
            return out
        key, i = _varint(buf, i)
        no, wt = key >> 3, key & 7
        if no == 0:
            raise ValueError("field number 0")
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            if i + 8 > len(buf):
                raise ValueError("fixed64 past the end")
            v = buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("length-delimited field past the end")
            v = buf[i:i + n]
            i += n
        elif wt == 5:
            if i + 4 > len(buf):
                raise ValueError("fixed32 past the end")
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((no, wt, v))
    raise ValueError("too many fields")


def check_proto(body):
    """Parses a delimited MetricFamily stream (io.prometheus.client):
    every frame whole, every name, help text and label UTF-8; returns the
    request and error counters as check_text does."""
    counts = []
    i = 0
    families = 0
    for _ in range(1 << 16):
        if i == len(body):
            break
        n, i = _varint(body, i)
        if i + n > len(body):
            raise ValueError("frame %d past the end" % families)
        fam = _fields(body[i:i + n])
        i += n
        families += 1
        name = None
        metrics = []
        for no, wt, v in fam:
            if no in (1, 2) and wt == 2:
                s = v.decode("utf-8")
                if no == 1:
                    name = s
            elif no == 4 and wt == 2:
                metrics.append(v)
        if not name:
            raise ValueError("family %d has no name" % families)
        for m in metrics:
            labels = {}
            value = None
            for no, wt, v in _fields(m):
                if no == 1 and wt == 2:
                    pair = {pno: pv.decode("utf-8") for pno, pwt, pv in _fields(v) if pwt == 2}
                    labels[pair.get(1, "")] = pair.get(2, "")
                elif no == 3 and wt == 2:  # Counter {double value = 1}
                    for cno, cwt, cv in _fields(v):
                        if cno == 1 and cwt == 1:
                            value = struct.unpack("<d", cv)[0]
            if name in ("tokentap_requests_total", "tokentap_errors_total") and value is not None:
                counts.append((name[9:-6], labels, int(value)))
    else:
        raise ValueError("too many families")
    if not families:
        raise ValueError("no metric family")
    return counts


def by_series(counts):
    """[(requests|errors, labels, n)] -> {(route, upstream): {"status": {}, "errors": {}}}."""
    out = {}
    for kind, labels, n in counts:
        e = out.setdefault((labels["route"], labels["upstream"]), {"status": collections.Counter(),
                                                                   "errors": collections.Counter()})
        if kind == "requests":
            e["status"][labels["status_class"]] += n
        else:
            e["errors"][labels["kind"]] += n
    return norm(out)


def norm(d):
    out = {}
    for k, v in d.items():
        st = {c: n for c, n in v["status"].items() if n}
        er = {c: n for c, n in v["errors"].items() if n}
        if st or er:
            out["%s/%s" % k] = {"status": st, "errors": er}
    return out


# --------------------------------------------------------------------------
# the clients


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.started = collections.Counter()
        self.outcomes = collections.Counter()  # (scenario, what the client saw)
        self.expected = {}  # request id -> (route kind, status class, error or a tuple of allowed ones)
        self.anomalies = []
        self.n_anomalies = 0

    def anomaly(self, rid, text):
        with self.lock:
            self.n_anomalies += 1
            if len(self.anomalies) < 20:
                self.anomalies.append("%s: %s" % (rid, text))

    def expect(self, rid, scenario, seen, want):
        with self.lock:
            self.outcomes[(scenario, seen)] += 1
            if want is not None:
                self.expected[rid] = want


class Clients(soak.AbortClients, soak.FlakyClients, soak.HeadCutClient):
    """Client threads of one phase; request ids are sa-PHASE-T-N. The
    clients that leave are pinned to `a`; 5 s to the first token: long
    enough to leave before it, short enough that the mirrored copy is over
    soon after."""

    EXTRA_HEADERS = [(PIN, "a")]
    MID_STREAM_TTFT_MS = 40
    MID_STREAM_ITL_MS = 20
    MID_STREAM_LINES = 30
    FIRST_TOKEN_MS = 5000
    UPLOAD_BYTES = 100000

    def __init__(self, port, ca, tally, phase, seed):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=ca)
        self.tally = tally
        self.phase = phase
        self.seed = seed

    def run(self, n, until):
        threads = []
        for i in range(n):
            t = threading.Thread(target=self._worker, args=(i, until), name="client-%d" % i, daemon=True)
            threads.append(t)
            t.start()
        return threads

    def _conn(self):
        conn = harness.HttpConn(self.port, timeout=IO_TIMEOUT_S)
        try:
            conn.sock = self.ctx.wrap_socket(conn.sock, server_hostname="localhost")
        except BaseException:
            conn.close()
            raise
        return conn

    def _worker(self, i, until):
        rng = random.Random("%s-%s-%d" % (self.seed, self.phase, i))
        names = [k for k, _ in MIX]
        weights = [w for _, w in MIX]
        state = {"conn": None}
        try:
            for n in range(1000000):
                if time.monotonic() >= until:
                    return
                scenario = rng.choices(names, weights)[0]
                rid = "sa-%s-%d-%d-%s" % (self.phase, i, n, scenario)
                with self.tally.lock:
                    self.tally.started[scenario] += 1
                try:
                    if scenario in ("stream", "whole"):
                        self._normal(rng, rid, scenario, state)
                    else:
                        getattr(self, scenario)(rng, rid)
                except Exception as e:  # reported as a failed client check
                    self.tally.anomaly(rid, "%s: %r" % (scenario, e))
        finally:
            if state["conn"]:
                state["conn"].close()

    @staticmethod
    def _session(rng):
        return "s%02d" % rng.randint(0, 63)

    def _normal(self, rng, rid, scenario, state):
        """A request to the split on the kept connection: tokentap must
        record what the client saw. A complete answer: 2xx, no error. A
        stream cut short (b went away mid-answer): 2xx, upstream_reset. A
        5xx: one of MAIN_5XX_KINDS."""
        stream = scenario == "stream"
        api = rng.choice(("openai-chat", "anthropic")) if stream else "openai-chat"
        session = self._session(rng)
        body = harness.api_body(api, stream, prompt=soak.Chaos._prompt(rng, rng.randint(20, 600)))
        body["user"] = session
        hdrs = harness.sim_headers(ttft=rng.randint(5, 60), itl=rng.randint(5, 20), tokens=rng.randint(4, 60),
                                   request_id=rid) + [(SESSION, session)]
        raw = harness.request_bytes("POST", harness.API_PATHS[api], body, hdrs)
        reused = state["conn"] is not None
        conn = state["conn"] or self._conn()
        state["conn"] = None
        keep = False
        try:
            conn.send(raw)
            try:
                resp = conn.read_head()
            except (OSError, ValueError) as e:
                return self.tally.anomaly(rid, "no response head (%s connection): %r"
                                          % ("kept" if reused else "new", e))
            if resp is None:
                return self.tally.anomaly(rid, "the connection closed before a response (%s connection)"
                                          % ("kept" if reused else "new"))
            try:
                conn.read_body(resp)
            except (OSError, ValueError):
                pass  # a cut: resp.complete stays False
            data = resp.body
            if resp.status == 200:
                end = b"data: [DONE]" if api == "openai-chat" and stream else (
                    b"message_stop" if stream else b'"choices"')
                if resp.complete:
                    if end not in data:
                        return self.tally.anomaly(rid, "complete answer without its end (%r): %r"
                                                  % (end, data[-120:]))
                    self.tally.expect(rid, scenario, "ok", ("main", "2xx", None))
                    keep = (resp.header("connection") or "").lower() != "close"
                else:
                    self.tally.expect(rid, scenario, "cut", ("main", "2xx", "upstream_reset"))
            elif 500 <= resp.status < 600:
                self.tally.expect(rid, scenario, "%d" % resp.status, ("main", "5xx", MAIN_5XX_KINDS))
                keep = resp.complete and (resp.header("connection") or "").lower() != "close"
            else:
                self.tally.anomaly(rid, "status %d: %r" % (resp.status, data[:200]))
        finally:
            if keep:
                state["conn"] = conn
            else:
                conn.close()

    # -- clients that leave (pinned to `a`, so that only the client ends them)

    def _answered_5xx(self, resp, rid, scenario):
        """A 5xx before the client could leave: its pooled connection to `a`
        closed by the server as the request went out, too late to send
        again. Counted as that 5xx."""
        if resp is None or not 500 <= resp.status < 600:
            return False
        self.tally.expect(rid, scenario, "%d first" % resp.status, ("main", "5xx", MAIN_5XX_KINDS))
        return True

    def left(self, kind, rid):
        self.tally.expect(rid, kind, "left", FIXED[kind])

    # -- the flaky upstream (soak.flaky_handler behind TLS)

    def _flaky(self, rng, rid, behave):
        n = rng.randint(1, 30)
        events = b"".join(soak.sse_event(i) for i in range(n))
        conn = self._conn()
        try:
            conn.send(harness.request_bytes("POST", CHAT, harness.api_body("openai-chat", True), [
                ("Host", FLAKY_HOST), ("x-soak-behave", behave), ("x-soak-events", str(n)), ("x-request-id", rid)]))
            resp = conn.read_head()
            if resp is None:
                return self.tally.anomaly(rid, "%s: no response" % behave)
            try:
                conn.read_body(resp)
            except (OSError, ValueError):
                pass
        finally:
            conn.close()
        if behave in ("flaky_ok", "flaky_ok_close", "flaky_reset_mid") and resp.status == 502 \
                and STALE_502 in resp.body:
            # The pooled connection's close after the answer before came
            # later than a server that had not seen the request could have
            # sent it (the upstream's Python thread was slow to close on a
            # busy machine): tokentap does not send a POST twice.
            return self.tally.expect(rid, behave, "502 stale", ("flaky", "5xx", "upstream_reset"))
        problem = soak.flaky_problem(resp, behave, events)
        if problem:
            return self.tally.anomaly(rid, problem)
        self.tally.expect(rid, behave, "as asked", FIXED[behave])


# --------------------------------------------------------------------------
# the run


class SoakAll(soak.Checks):
    def __init__(self, args):
        self.args = args
        self.failures = []
        self.passes = []
        self.workdir = tempfile.mkdtemp(prefix="tokentap-soak-all-")
        self.tally = Tally()
        self.sims = {}  # name -> harness.Process (the current instance)
        self.dead_sims = []  # earlier instances of b, for the sanitizer check
        self.sim_ports = {}
        self.samples = []  # (phase, fds, VmRSS KiB) under load
        self.traffic = threading.Event()  # set while a phase's traffic runs
        self.stop = threading.Event()
        self.scrape_pause = threading.Event()
        self.scrapes = collections.Counter()  # (format, "ok"|"failed")
        self.scrape_errors = []
        self.reloads_sent = 0
        self.flaps = []  # (signal name, seconds down, b's ok scrapes before, after)
        self.variant = 0

    def off(self, feature):
        return feature in self.args.without

    def max_hash_ids(self):
        """The capture's id table, bounded so that it is full before the
        baseline: it grows with the distinct prompt blocks until its bound
        (docs/workload.md), 34 bytes an entry, and at the default 2^20 it
        would still be doubling through the soak proper (measured: +2.9 MiB
        at 65,536 hashes, 700 s in) and hide any other growth."""
        return 1024 if self.args.warmup < 360 else 16384

    # -- processes

    def start_sim(self, name, port=0):
        a = self.args
        argv = [harness.sim_bin(), "--listen", "127.0.0.1:%d" % port, "--tls-cert", self.cert, "--tls-key", self.key,
                "--ttft-ms", str(a.ttft_ms), "--itl-ms", str(a.itl_ms), "--seed", str(len(self.dead_sims))]
        env = None
        if name == "b" and self.sanitized:
            # The simulator leaves the connections open at its exit to the
            # kernel (sim.c), so LeakSanitizer reports them when b is
            # stopped mid-traffic; its other reports stay on.
            env = dict(os.environ)
            env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        last = None
        for _ in range(50):  # the port may still be held for a moment after a stop
            try:
                p = harness.Process(argv, r"^tokentap-sim listening on 127\.0\.0\.1:(\d+)$", "sim-" + name, env=env)
                break
            except RuntimeError as e:
                last = e
                time.sleep(0.2)
        else:
            raise RuntimeError("simulator %s did not start again on :%d: %s" % (name, port, last))
        self.sims[name] = p
        self.sim_ports[name] = int(p.match.group(1))
        return p

    def config(self, variant):
        """The file tokentap reads; variant 0 or 1 (the route sets)."""
        up = "    url: https://127.0.0.1:%d\n    tls: {ca_file: %s}\n"
        scrape = "    metrics_url: https://127.0.0.1:%d/metrics\n    metrics_interval: 1s\n"
        text = ("# written by tests/soak/soak_all.py (variant %d)\n"
                "listen: 127.0.0.1:0\n"
                "tls: {cert: %s, key: %s}\n"
                "workers: %d\n"
                "access_log: %s\n"
                "override_header: %s\n"
                "store: {flush_interval: 1s}\n"
                "%s"
                "timeouts: {pool_idle: 1s, shutdown_grace: 5s, connect: 2s}\n"
                "upstreams:\n" % (variant, self.cert, self.key, self.args.workers, self.access_log, PIN,
                                  "" if self.off("workload") else
                                  "workload: {path: %s, max_size: 4m, max_files: 1000, max_hash_ids: %d}\n"
                                  % (self.trace, self.max_hash_ids())))
        if self.off("scrape"):
            scrape = ""
        for name in ("a", "b"):
            text += ("  - name: %s\n" % name) + up % (self.sim_ports[name], self.ca) + (
                scrape % self.sim_ports[name] if scrape else "")
        for name in ("shadow", "flaky"):
            text += ("  - name: %s\n" % name) + up % (self.sim_ports[name], self.ca)
        text += ("routes:\n"
                 "  - name: flaky\n"
                 "    match: {host: %s}\n"
                 "    upstream: flaky\n"
                 "    failover: false\n" % FLAKY_HOST)
        if variant == 0:
            text += ("  - name: main\n"
                     "    match: {path_prefix: /}\n"
                     "    split: [{upstream: a, weight: 1}, {upstream: b, weight: 1}]\n"
                     "    sticky: {header: %s}\n"
                     "    failover: true\n"
                     "    mirror: {upstream: shadow, percent: 50, max_in_flight: 16}\n" % SESSION)
        else:
            text += ("  - name: messages\n"
                     "    match: {path_prefix: %s}\n"
                     "    upstream: a\n"
                     "    failover: true\n"
                     "  - name: main-b\n"
                     "    match: {path_prefix: /}\n"
                     "    split: [{upstream: a, weight: 1}, {upstream: b, weight: 3}]\n"
                     "    sticky: {json_field: user}\n"
                     "    failover: true\n"
                     "    mirror: {upstream: shadow, percent: 25, max_in_flight: 16}\n" % MESSAGES)
        if self.off("mirror"):
            text = "\n".join(line for line in text.split("\n") if "mirror:" not in line)
        with open(self.cfg, "w") as f:
            f.write(text)

    def start(self):
        a = self.args
        self.sanitized = harness.is_sanitized()
        if self.sanitized:
            soak.small_asan_quarantine(16)
        pki = os.path.join(self.workdir, "pki")
        os.mkdir(pki)
        self.cert, self.key = make_pki(pki)
        self.ca = os.path.join(pki, "ca.pem")
        for name in ("a", "b", "shadow"):
            self.start_sim(name)
        sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        sctx.load_cert_chain(self.cert, self.key)
        handler, self.flaky_seen = soak.flaky_handler()
        self.flaky = harness.FakeUpstream(handler, backlog=256, tls=sctx, deadline_s=a.duration + 600,
                                          max_requests=100000, keep_requests=False, forget_closed=True)
        self.sim_ports["flaky"] = self.flaky.port
        self.access_log = os.path.join(self.workdir, "access.log")
        self.trace = os.path.join(self.workdir, "workload.jsonl")
        self.cfg = os.path.join(self.workdir, "tokentap.yaml")
        self.config(0)
        self.tt = harness.Process(
            [harness.tokentap_bin(), "-c", self.cfg, "--data-dir", os.path.join(self.workdir, "data"),
             "--admin", "127.0.0.1:0"],
            r"listening on ([0-9.]+):(\d+)", "tokentap", cwd=self.workdir)
        self.port = int(self.tt.match.group(2))
        self.admin = harness.admin_port(self.tt, 10.0)
        log("tokentap pid %d on :%d (TLS; admin :%d, %d workers; without: %s), %s; simulators a :%d, b :%d, "
            "shadow :%d, flaky :%d, all TLS; work dir %s"
            % (self.tt.pid, self.port, self.admin, a.workers, ",".join(sorted(a.without)) or "nothing",
               "ASan build (%s)" % os.environ.get("ASAN_OPTIONS", "") if self.sanitized else "not a sanitizer build",
               self.sim_ports["a"], self.sim_ports["b"], self.sim_ports["shadow"], self.flaky.port, self.workdir))

    def stop_all(self):
        self.stop.set()
        self.traffic.clear()
        for p in [getattr(self, "tt", None)] + list(self.sims.values()):
            if p is not None:
                p.stop()
        if getattr(self, "flaky", None):
            self.flaky.stop()

    # -- admin

    def admin_get(self, path, accept=None):
        hdrs = [("Connection", "close")] + ([("Accept", accept)] if accept else [])
        resp, _ = harness.exchange(self.admin, "GET", path, headers=hdrs, timeout=IO_TIMEOUT_S)
        if resp is None or resp.status != 200:
            raise RuntimeError("GET %s: %r" % (path, resp and (resp.status, resp.body[:200])))
        return resp

    def get_json(self, path):
        return json.loads(self.admin_get(path).body)

    def engine_scrapes(self):
        """{(upstream, result): n} from tokentap_engine_scrapes_total."""
        out = {}
        rx = re.compile(r'^tokentap_engine_scrapes_total\{([^}]*)\} (\d+)$', re.M)
        for m in rx.finditer(self.admin_get("/metrics").body.decode()):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels.get("upstream"), labels.get("result"))] = int(m.group(2))
        return out

    # -- background threads

    def scraper(self):
        """/metrics in both formats once a second while the run lasts."""
        for _ in range(int((self.args.duration + 900))):
            if self.stop.wait(1.0):
                return
            if self.scrape_pause.is_set():
                continue
            for fmt, accept in (("text", "text/plain;version=0.0.4"), ("protobuf", PROTO_ACCEPT)):
                try:
                    resp = self.admin_get("/metrics", accept)
                    ctype = resp.header("content-type") or ""
                    if fmt == "protobuf":
                        if not ctype.startswith("application/vnd.google.protobuf"):
                            raise ValueError("content-type %r" % ctype)
                        check_proto(resp.body)
                    else:
                        if not ctype.startswith("text/plain"):
                            raise ValueError("content-type %r" % ctype)
                        check_text(resp.body)
                    self.scrapes[(fmt, "ok")] += 1
                except (OSError, ValueError, RuntimeError, UnicodeDecodeError) as e:
                    if not self.tt.alive():
                        return
                    self.scrapes[(fmt, "failed")] += 1
                    if len(self.scrape_errors) < 5:
                        self.scrape_errors.append("%s: %r" % (fmt, e))

    def sampler(self):
        for _ in range(int((self.args.duration + 900) / SAMPLE_EVERY_S)):
            if self.stop.wait(SAMPLE_EVERY_S):
                return
            if not self.traffic.is_set() or not self.tt.alive():
                continue
            try:
                rss = soak.rss_kib(self.tt.pid)
                self.samples.append((self.phase_name, harness.fd_count(self.tt.pid), rss["VmRSS"], rss["RssAnon"]))
            except OSError:
                return

    def reloader(self, until):
        """A rewritten file and SIGHUP every --reload-every s until `until`."""
        for _ in range(0 if self.off("reload") else 100000):
            if self.stop.wait(max(0.0, min(self.args.reload_every, until - time.monotonic()))) \
                    or time.monotonic() >= until:
                return
            self.variant ^= 1
            self.config(self.variant)
            before = self.count_lines(r"reloaded .*: generation")
            os.kill(self.tt.pid, signal.SIGHUP)
            self.reloads_sent += 1
            if not harness.wait_until(lambda: self.count_lines(r"reloaded .*: generation") > before, 10.0, 0.05):
                self.tally.anomaly("reload", "no 'reloaded' line 10 s after SIGHUP %d" % self.reloads_sent)

    def flapper(self, until):
        """Stops b and starts it again on the same port, in turn with SIGKILL
        and SIGTERM, every --flap-every s; b is up again when it returns."""
        a = self.args
        for k in range(0 if self.off("flap") else 100000):
            if self.stop.wait(max(0.0, min(a.flap_every, until - time.monotonic()))) \
                    or time.monotonic() + a.flap_down + 5 >= until:
                return
            sig = (signal.SIGKILL, signal.SIGTERM)[k % 2]
            old = self.sims["b"]
            os.kill(old.pid, sig)
            try:
                old.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.tally.anomaly("flap", "simulator b did not exit on %s" % sig.name)
            ok_before = self.engine_scrapes().get(("b", "ok"), 0)  # none can succeed while it is away
            old.stop()
            self.dead_sims.append((old, sig))
            t0 = time.monotonic()
            self.stop.wait(a.flap_down)
            self.start_sim("b", self.sim_ports["b"])
            self.flaps.append([sig.name, time.monotonic() - t0, ok_before, None])

    # -- a phase

    def phase(self, name, seconds):
        self.phase_name = name
        until = time.monotonic() + seconds
        log("%s: %.0f s, %d clients; reloads every %.0f s, b away every %.0f s for %.0f s"
            % (name, seconds, self.args.clients, self.args.reload_every, self.args.flap_every, self.args.flap_down))
        self.traffic.set()
        threads = Clients(self.port, self.ca, self.tally, name, self.args.seed).run(self.args.clients, until)
        bg = [threading.Thread(target=self.reloader, args=(until,), name="reloader", daemon=True),
              threading.Thread(target=self.flapper, args=(until,), name="flapper", daemon=True)]
        for t in bg:
            t.start()
        next_line = time.monotonic() + self.args.progress
        for _ in range(int(seconds / 0.5) + 10):
            left = until - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.5, left))
            if time.monotonic() >= next_line:
                next_line += self.args.progress
                with self.tally.lock:
                    n = sum(self.tally.outcomes.values())
                    anomalies = self.tally.n_anomalies
                log("progress: %d client requests, %d anomalies, %d fds, VmRSS %d KiB, %d reloads, %d flaps, "
                    "%d+%d /metrics pages" % (n, anomalies, harness.fd_count(self.tt.pid),
                                              soak.rss_kib(self.tt.pid)["VmRSS"], self.reloads_sent,
                                              len(self.flaps), self.scrapes[("text", "ok")],
                                              self.scrapes[("protobuf", "ok")]))
        for t in threads + bg:
            t.join(IO_TIMEOUT_S + STOP_TIMEOUT_S + 10)
            if t.is_alive():
                self.tally.anomaly(t.name, "did not finish in time")
        self.traffic.clear()
        log("%s: traffic over" % name)

    def quiet(self, what):
        """tokentap idle (nothing in flight, no pooled connection), the
        /metrics scraper paused; returns its fds once their count holds."""
        self.scrape_pause.set()
        return soak.wait_quiet(lambda: self.get_json("/upstreams")["upstreams"], self.tt.pid, self.fail, what,
                               QUIET_TIMEOUT_S)

    def count_lines(self, pattern):
        rx = re.compile(pattern)
        with self.tt._lock:
            return sum(1 for line in self.tt.lines if rx.search(line))

    # -- checks

    def check_clients(self):
        t = self.tally
        seen = collections.Counter()
        for (sc, what), n in t.outcomes.items():
            seen["%s:%s" % (sc, what)] += n
        detail = "%d requests: %s" % (sum(t.outcomes.values()), json.dumps(dict(sorted(seen.items()))))
        detail += "; the flaky upstream saw %d (replays included)" % sum(self.flaky_seen.values())
        if t.n_anomalies or self.flaky.errors:
            self.fail("clients", "%d unexpected outcomes (%s); first: %s; flaky upstream errors: %s"
                      % (t.n_anomalies, detail, t.anomalies[:10], self.flaky.errors[:5]))
        else:
            self.passed("clients", detail)

    @staticmethod
    def kind_of(upstream):
        """The access log names the upstream, not the route: the flaky
        route is the one to `flaky`, the rest are the split's."""
        return "flaky" if upstream == "flaky" else "main"

    def check_access_log(self):
        entries = harness.read_access_log(self.access_log)
        self.entries = entries
        primary = {}
        dup = []
        mirrors = []
        others = []
        for e in entries:
            rid = e.get("id", "")
            if e.get("mirror"):
                mirrors.append(e)
            elif rid in primary:
                dup.append(rid)
            elif rid.startswith("sa-"):
                primary[rid] = e
            else:
                others.append(e)
        self.primary = primary
        self.mirrors = mirrors
        bad = []
        # A client that leaves mid-upload may have been answered 502 first:
        # the pooled connection its request went out on was closed by the
        # server at that moment, and tokentap does not send again a request
        # whose body is still arriving (exchange.c, request_replay). tokentap
        # logs each such 502; those requests count as that 502.
        with self.tt._lock:
            failed_before = {m.group(1) for m in map(FAILED_BEFORE.search, self.tt.lines) if m}
        self.upload_502 = 0
        for rid, want in list(self.tally.expected.items()):
            e = primary.get(rid)
            if rid.endswith("abort_mid_upload") and rid in failed_before and e is not None \
                    and e.get("status") == 502 and e.get("error") == "upstream_reset":
                self.tally.expected[rid] = ("main", "5xx", "upstream_reset")
                self.upload_502 += 1
        for rid, want in sorted(self.tally.expected.items()):
            e = primary.get(rid)
            if e is None:
                bad.append("%s: not in the access log (expected %s)" % (rid, want))
                continue
            st = e.get("status") or 0
            got = (self.kind_of(e.get("upstream")), "%dxx" % (st // 100) if st else "none", e.get("error"))
            kinds = want[2] if isinstance(want[2], tuple) else (want[2],)
            if got[:2] != want[:2] or got[2] not in kinds:
                bad.append("%s: logged %s (upstream %s), expected %s" % (rid, got, e.get("upstream"), want))
            elif want[2] is not None and want[0] == "main" and e.get("upstream") not in ("a", None) \
                    and not rid.endswith(("stream", "whole")):
                bad.append("%s: pinned to a, logged upstream %s" % (rid, e.get("upstream")))
        for rid in primary:
            if rid not in self.tally.expected:
                bad.append("%s: logged (%s, %s) but it is not a request the clients count"
                           % (rid, primary[rid].get("status"), primary[rid].get("error")))
        bad += ["%s: logged twice" % r for r in dup[:5]]
        bad += ["a line with id %r" % e.get("id") for e in others[:5]]
        orphan = [m["id"] for m in mirrors if m.get("id") not in primary or m.get("upstream") != "shadow"]
        bad += ["a mirrored copy %s without its primary" % r for r in orphan[:5]]
        cuts = collections.Counter(e.get("upstream") for rid, e in primary.items()
                                   if e.get("error") and rid.endswith(("stream", "whole")))
        detail = ("%d lines: %d primaries (the clients expect %d), %d mirrored copies; errors on the split's own "
                  "requests by upstream %s; mid-upload aborts answered 502 first (their pooled connection closed by "
                  "the server): %d" % (len(entries), len(primary), len(self.tally.expected), len(mirrors), dict(cuts),
                                       self.upload_502))
        if bad:
            self.fail("accesslog", "%s; %d differ: %s" % (detail, len(bad), bad[:15]))
        else:
            self.passed("accesslog", detail)

    def log_counts(self):
        out = {}
        for e in self.entries:
            st = e.get("status") or 0
            # a request that never reached an upstream is in the series
            # (route "none", upstream "none"): one whose client left while
            # the body the route's sticky field is read from was uploading
            k = ("*", e.get("upstream") or "none")
            d = out.setdefault(k, {"status": collections.Counter(), "errors": collections.Counter()})
            d["status"]["%dxx" % (st // 100) if st else "none"] += 1
            if e.get("error"):
                d["errors"][e["error"]] += 1
        return norm(out)

    def stats_counts(self):
        out = {}
        for s in self.get_json("/stats?window=all")["series"]:
            d = out.setdefault((s["route"], s["upstream"]), {"status": collections.Counter(),
                                                             "errors": collections.Counter()})
            d["status"].update(s["status"])
            d["errors"].update(s["errors"])
        return norm(out)

    @staticmethod
    def per_upstream(counts):
        out = {}
        for k, v in counts.items():
            d = out.setdefault(("*", k.split("/", 1)[1]), {"status": collections.Counter(),
                                                          "errors": collections.Counter()})
            d["status"].update(v["status"])
            d["errors"].update(v["errors"])
        return norm(out)

    def check_counts(self):
        """Per (route, upstream): /stats = both expositions. Per upstream
        (the access log names no route): those = the access log =
        /upstreams. The primaries' totals = the clients' counts."""
        want = self.log_counts()
        got = {}
        for _ in range(int(STATS_TIMEOUT_S / 0.5) + 1):
            got = {"/stats?window=all": self.stats_counts(),
                   "/metrics text": by_series(check_text(self.admin_get("/metrics", "text/plain").body)),
                   "/metrics protobuf": by_series(check_proto(self.admin_get("/metrics", PROTO_ACCEPT).body))}
            if all(self.per_upstream(v) == want for v in got.values()) and \
                    got["/metrics text"] == got["/stats?window=all"] == got["/metrics protobuf"]:
                break
            time.sleep(0.5)  # the store sees each worker's counts once per flush interval
        self.series = got["/stats?window=all"]
        bad = ["%s counts %s" % (k, json.dumps(v, sort_keys=True)) for k, v in got.items()
               if self.per_upstream(v) != want or v != got["/stats?window=all"]]
        per_up = collections.Counter()
        per_up_err = collections.Counter()
        for k, v in want.items():
            up = k.split("/", 1)[1]
            per_up[up] += sum(v["status"].values())
            for kind, n in v["errors"].items():
                per_up_err[(up, kind)] += n
        ups = {u["name"]: u for u in self.get_json("/upstreams")["upstreams"]}
        for name in (set(per_up) - {"none"}) | {n for n, u in ups.items() if u["requests"]}:
            u = ups.get(name, {"requests": 0, "errors": {}})
            errs = {k: v for k, v in u["errors"].items() if v}
            werrs = {k: n for (up, k), n in per_up_err.items() if up == name}
            if u["requests"] != per_up[name] or errs != werrs:
                bad.append("/upstreams %s: %d requests %s, the access log %d %s"
                           % (name, u["requests"], errs, per_up[name], werrs))
        # the primaries' totals against what the clients saw
        c_status = collections.Counter()
        c_err = collections.Counter()
        c_any = 0  # 5xx of the split: one of MAIN_5XX_KINDS, the access log says which
        for rid, w in self.tally.expected.items():
            c_status[(w[0], w[1])] += 1
            if isinstance(w[2], tuple):
                c_any += 1
            elif w[2]:
                c_err[(w[0], w[2])] += 1
        t_status = collections.Counter()
        t_err = collections.Counter()
        for k, v in self.series.items():
            route, up = k.split("/", 1)
            if up == "shadow":
                continue
            for cls, n in v["status"].items():
                t_status[(self.kind_of(up), cls)] += n
            for kind, n in v["errors"].items():
                t_err[(self.kind_of(up), kind)] += n
        t_main_5xx_kinds = sum(t_err[("main", k)] for k in MAIN_5XX_KINDS) - c_err[("main", "upstream_reset")]
        other_t = {k: n for k, n in t_err.items() if k not in c_err and not (k[0] == "main" and k[1] in MAIN_5XX_KINDS)}
        mismatch = (dict(c_status) != {k: n for k, n in t_status.items() if n}
                    or any(t_err[k] != n for k, n in c_err.items() if k != ("main", "upstream_reset"))
                    or t_main_5xx_kinds != c_any or other_t)
        line = ("the clients: %s, errors %s + %d 5xx of the split; tokentap's primaries: %s, errors %s"
                % (json.dumps({"%s %s" % k: n for k, n in sorted(c_status.items())}),
                   json.dumps({"%s %s" % k: n for k, n in sorted(c_err.items())}), c_any,
                   json.dumps({"%s %s" % k: n for k, n in sorted(t_status.items())}),
                   json.dumps({"%s %s" % k: n for k, n in sorted(t_err.items())})))
        if mismatch:
            bad.append("the clients' counts differ: " + line)
        self.counts_line = line
        if bad:
            self.fail("counts", "the access log counts %s; but %s" % (json.dumps(want, sort_keys=True), "; ".join(bad)))
        else:
            self.passed("counts", "%s; /stats?window=all = /metrics (text) = /metrics (protobuf) over %d (route, "
                        "upstream) series: %s; = /upstreams = the access log per upstream"
                        % (line, len(self.series), json.dumps(self.series, sort_keys=True)))

    def check_workload(self):
        lines = 0
        names = [n for n in os.listdir(self.workdir) if n == "workload.jsonl" or n.startswith("workload.jsonl.")]
        ids = collections.Counter()
        for n in names:
            with open(os.path.join(self.workdir, n), "rb") as f:
                for raw in f:
                    lines += 1
                    try:
                        ids[json.loads(raw).get("status")] += 1
                    except ValueError:
                        ids["unparsable"] += 1
        wl = self.get_json("/workload")
        dropped = {k: v for k, v in (wl.get("dropped") or {}).items() if v}
        msg = ("%d trace lines in %d file(s) for %d primary requests; dropped %s"
               % (lines, len(names), len(self.primary), dropped or "none"))
        if lines != len(self.primary) or dropped or ids["unparsable"]:
            self.fail("workload", msg + ("; %d unparsable" % ids["unparsable"] if ids["unparsable"] else ""))
        else:
            self.passed("workload", msg)

    def check_reloads(self):
        done = self.count_lines(r"reloaded .*: generation")
        failed = self.count_lines(r"reload failed")
        msg = "%d SIGHUPs, %d reloaded, %d failed" % (self.reloads_sent, done, failed)
        if done != self.reloads_sent or failed or not self.reloads_sent:
            self.fail("reloads", msg)
        else:
            self.passed("reloads", msg)

    def check_scrapes(self):
        eng = self.engine_scrapes()
        bad = []
        if self.scrapes[("text", "failed")] or self.scrapes[("protobuf", "failed")]:
            bad.append("failed pages: %s" % self.scrape_errors)
        if not self.scrapes[("text", "ok")] or not self.scrapes[("protobuf", "ok")]:
            bad.append("no page read")
        if self.off("scrape"):
            pass
        elif not eng.get(("a", "ok")) or not eng.get(("b", "ok")):
            bad.append("no successful engine scrape of a or b")
        # after its last return b was scraped again (the run ends well after it)
        last = self.flaps[-1][2] if self.flaps else 0
        if self.flaps and not self.off("scrape") and eng.get(("b", "ok"), 0) <= last:
            bad.append("b not scraped again after it came back")
        ups = {u["name"]: u for u in self.get_json("/upstreams")["upstreams"]}
        for n in () if self.off("scrape") else ("a", "b"):
            e = ups[n].get("engine") or {}
            if not e.get("scraped") or e.get("failing"):
                bad.append("%s's engine view at the end: %s" % (n, e))
        msg = ("/metrics pages: text %d, protobuf %d (failed %d, %d); engine scrapes %s; b stopped %d times (%s)"
               % (self.scrapes[("text", "ok")], self.scrapes[("protobuf", "ok")], self.scrapes[("text", "failed")],
                  self.scrapes[("protobuf", "failed")], {"%s %s" % k: v for k, v in sorted(eng.items())},
                  len(self.flaps), ", ".join("%s %.1fs" % (f[0], f[1]) for f in self.flaps)))
        if bad:
            self.fail("scrapes", "%s; %s" % (msg, "; ".join(bad)))
        else:
            self.passed("scrapes", msg)

    @staticmethod
    def thirds(values):
        n = len(values) // 3
        return statistics.median(values[:n]), statistics.median(values[-n:])

    def ids_note(self):
        w = getattr(self, "ids_at_base", None)
        if not w:
            return ""
        kept, most = w.get("hash_ids_kept"), w.get("max_hash_ids")
        return "; the capture's id table %s at the baseline (%s of %s hashes)" % (
            "full" if kept is not None and kept == most else "NOT full (its growth counts in the rss check)",
            kept, most)

    def check_fds_rss(self, fresh, base, end, base_rss, end_rss):
        main = [(f, r) for ph, f, r, _ in self.samples if ph == "main"]
        anon = [x for ph, _, _, x in self.samples if ph == "main"]
        mode = "short" if self.args.warmup < 360 else "long"
        limit = (RSS_GROWTH_MAX_SANITIZED if self.sanitized else RSS_GROWTH_MAX)[mode]
        if len(main) < 6:
            self.fail("fds", "only %d samples under load" % len(main))
            return
        f1, f3 = self.thirds([f for f, _ in main])
        r1, r3 = self.thirds([r for _, r in main])
        msg = ("idle: fresh %d, after warm-up %d, end %d; under load (%d samples): first-third median %g, "
               "last-third median %g, max %d" % (len(fresh), len(base), len(end), len(main), f1, f3,
                                                 max(f for f, _ in main)))
        if len(base) != len(fresh):  # what the first requests open for good (the trace file)
            msg += "; opened during the warm-up and kept: %s" % "; ".join(harness.fd_diff(fresh, base)[:4])
        if len(end) != len(base) or f3 > f1 * (1 + FD_LOAD_GROWTH_MAX):
            self.fail("fds", msg + ("; differences from the warm-up:\n  %s"
                                    % "\n  ".join(harness.fd_diff(base, end)) if len(end) != len(base) else ""))
        else:
            self.passed("fds", msg)
        growth = (end_rss["VmRSS"] - base_rss["VmRSS"]) / base_rss["VmRSS"]
        msg = ("idle: after warm-up %d KiB, end %d KiB (%+.1f %%); under load: first-third median %d KiB, last-third "
               "median %d KiB (%+.1f %%), max %d KiB; limit +%d %%%s (%s run); RssAnon idle %d -> %d KiB, under load "
               "first-third median %d, last-third %d KiB"
               % (base_rss["VmRSS"], end_rss["VmRSS"], 100 * growth, r1, r3, 100 * (r3 - r1) / r1,
                  max(r for _, r in main), round(100 * limit), " under ASan" if self.sanitized else "", mode,
                  base_rss["RssAnon"], end_rss["RssAnon"], *self.thirds(anon))) + self.ids_note()
        if growth > limit or r3 > r1 * (1 + limit):
            self.fail("rss", msg)
        else:
            self.passed("rss", msg)

    def check_exit_and_sanitizers(self):
        reports = []
        procs = [self.tt] + [self.sims[n] for n in ("a", "b", "shadow")]
        for p in procs:
            was_alive, rc = soak.stop_for_exit(p, STOP_TIMEOUT_S)
            if not was_alive:
                self.fail("exit", "%s was gone before the end (status %r); stderr tail:\n%s"
                          % (p.name, rc, p.stderr_text()[-3000:]))
            elif rc != 0:
                self.fail("exit", "%s exited with status %r on SIGTERM; stderr tail:\n%s"
                          % (p.name, rc, p.stderr_text()[-3000:]))
            else:
                self.passed("exit", "%s exited 0 on SIGTERM" % p.name)
        for i, p in enumerate(procs + [d for d, _ in self.dead_sims]):
            with p._lock:
                lines = list(p.lines)
            with open(os.path.join(self.workdir, "%s-%d.stderr" % (p.name, i)), "w") as f:
                f.write("\n".join(lines) + "\n")
            san = [k for k, line in enumerate(lines) if harness.SANITIZER_RE.search(line)]
            if san:
                reports.append("%s (pid %d):\n%s" % (p.name, p.pid, "\n".join(lines[san[0]:san[0] + 60])))
        if reports:
            self.fail("sanitizer", "report(s):\n" + "\n".join(reports))
        elif self.sanitized:
            self.passed("sanitizer", "ASan/UBSan build: no report from tokentap or the %d simulator processes "
                        "(b's without leak detection)" % (3 + len(self.dead_sims)))
        else:
            self.passed("sanitizer", "not a sanitizer build, so nothing could be reported")

    def run(self):
        a = self.args
        self.start()
        self.phase_name = "fresh"
        fresh = self.quiet("fresh")
        threading.Thread(target=self.scraper, name="scraper", daemon=True).start()
        threading.Thread(target=self.sampler, name="sampler", daemon=True).start()
        self.scrape_pause.clear()
        self.phase("warmup", a.warmup)
        base = self.quiet("after the warm-up")
        base_rss = soak.rss_kib(self.tt.pid)
        self.ids_at_base = None if self.off("workload") else self.get_json("/workload")
        log("baseline: %d fds, VmRSS %d KiB%s" % (len(base), base_rss["VmRSS"], self.ids_note()))
        self.scrape_pause.clear()
        self.phase("main", a.duration - a.warmup)
        self.quiet("after the soak")
        harness.wait_fds(self.tt.pid, len(base), FD_TIMEOUT_S)
        end = harness.fd_targets(self.tt.pid)
        end_rss = soak.rss_kib(self.tt.pid)
        self.check_clients()
        self.check_access_log()
        self.check_counts()
        if not self.off("workload"):
            self.check_workload()
        if not self.off("reload"):
            self.check_reloads()
        self.check_scrapes()
        self.check_fds_rss(fresh, base, end, base_rss, end_rss)
        self.stop.set()
        self.check_exit_and_sanitizers()


def parse_args(argv):
    p = argparse.ArgumentParser(prog="soak_all.py",
                                description="The soak with every feature on (docs/security.md).")
    p.add_argument("--short", action="store_true", help="CI size: 2 minutes, 10 clients")
    p.add_argument("--duration", type=soak.duration, help="traffic time, warm-up included (default 20m; --short 120s)")
    p.add_argument("--warmup", type=soak.duration, help="warm-up before the baseline (default 400s; --short 40s)")
    p.add_argument("--clients", type=int, help="client threads (default 32; --short 10)")
    p.add_argument("--reload-every", type=soak.duration, default=30.0, help="seconds between reloads (default 30)")
    p.add_argument("--flap-every", type=soak.duration, help="seconds between stops of b (default 60; --short 25)")
    p.add_argument("--flap-down", type=soak.duration, default=3.0, help="seconds b stays away (default 3)")
    p.add_argument("--ttft-ms", type=int, default=30)
    p.add_argument("--itl-ms", type=int, default=15)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--progress", type=soak.duration, help="seconds between progress lines (default 60; --short 15)")
    p.add_argument("--without", default="", metavar="LIST",
                   help="features left off, to tell which one a leak or a miscount comes with: a comma list of "
                        "workload, mirror, scrape, reload, flap")
    p.add_argument("--keep", action="store_true", help="keep the work directory (always kept on failure)")
    a = p.parse_args(argv)
    a.without = set(x for x in a.without.split(",") if x)
    if a.without - {"workload", "mirror", "scrape", "reload", "flap"}:
        p.error("--without: unknown %s" % ", ".join(sorted(a.without - {"workload", "mirror", "scrape", "reload",
                                                                           "flap"})))
    a.duration = a.duration if a.duration is not None else (120.0 if a.short else 1200.0)
    a.warmup = a.warmup if a.warmup is not None else (40.0 if a.short else 400.0)
    a.clients = a.clients if a.clients is not None else (10 if a.short else 32)
    a.flap_every = a.flap_every if a.flap_every is not None else (25.0 if a.short else 60.0)
    a.progress = a.progress if a.progress is not None else (15.0 if a.short else 60.0)
    if a.warmup >= a.duration:
        p.error("--warmup must be shorter than --duration")
    if not 1 <= a.clients <= 500:
        p.error("--clients: 1 to 500")
    return a


def main(argv):
    args = parse_args(argv)
    return soak.run_to_verdict(SoakAll(args), "soak_all", args.keep, ordered_passes=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
