#!/usr/bin/env python3
"""instr.py — instructions per event of tokentap's worker, by function group,
beside HAProxy's, under callgrind (docs/bench.md, "Instructions per event").

For each scenario asked for (c, g, i, j of proxies.py: the maximum event
rate, TLS to the client, TLS to the upstream, 16 events per upstream write),
the proxy is started under `valgrind --tool=callgrind --separate-threads=yes`
with proxies.py's configuration and one event loop (tokentap --workers 1 with
the store on, HAProxy nbthread 1), in front of tokentap-sim, and
tokentap-bench sends the scenario's streams through it in three runs of the
same concurrency: a warm-up of R requests (it fills the upstream pool and
TLS session caches), then, with callgrind's counters zeroed, a window of R
requests and one of 2R, each dumped (callgrind_control -d) as it ends. The
second dump minus the first is the cost of the R requests' events between
them: start-up, the bench's connections and handshakes (the same number in
both windows) cancel out. R is --events over the scenario's tokens per
request. An event is a token event the client received (ttft count + itl
count of tokentap-bench), as in proxies.py's per-event figures.

(k) and (l), one-token answers on kept and on new connections, are counted
per request (each is one event) in windows of --events / 16 requests; in (l)
each request brings its own connection, so the connections' cost is in the
difference, as it should be there.

Instructions are callgrind's Ir, the self cost of each function (never the
inclusive cost, so nothing is counted twice), summed into the groups of
GROUPS below by the function's source file and object. The event loop's
thread is the one counted: tokentap's worker (the thread whose own source
files did the forwarding), HAProxy's busiest thread; tokentap's other
threads (the store's writer, admin, main) are shown apart. The kernel's
work (system calls, TCP over loopback, nothing of it under callgrind) is not
counted, for either proxy: libc's system-call wrappers are.

Under callgrind a proxy runs some 50 times slower than the simulator, so
every upstream read brings many events: these are the costs at full rate,
not at a stream's pace. Timers that fire once a second (tokentap's stats
flush on the worker) are spread over a window that lasts tens of seconds
here, so they weigh more per event than at real rates; the longer the
window (--events), the less.

Loopback only; every run and wait is bounded; valgrind and haproxy are
installed with apt-get when missing (as proxies.py does it), unless
--no-install.

  contrib/lab/instr.py                          # c, g, i, j; a few minutes
  contrib/lab/instr.py --scenarios cg --events 65536 --json out.json
  contrib/lab/instr.py --scenarios cj --api anthropic   # Messages API events
"""

import argparse
import datetime
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import proxies as px

# Function groups, first match wins: (group, where, pattern). `where` is
# "file" (the function's source file as callgrind names it) or "object" (the
# binary or shared library it is in). A function of neither table falls into
# "other". Only the event loop's thread of the proxy is grouped.
GROUPS = (
    # measuring: framing, classifying, the timeline, histograms, series and
    # the record of each request
    ("measuring", "file", r"(^|/)src/(\w+/)?(framer|classify|keyscan|meter|timeline|hist|stats|slice|series_key|"
                          r"accesslog|recent|rxstamp|paired|workload)\.c$"),
    # TLS: OpenSSL's libraries (their records, AES-GCM, the handshakes)
    ("TLS", "object", r"/libssl\.so"),
    ("TLS", "object", r"/libcrypto\.so"),
    # forwarding: tokentap's connection, request and exchange code, the
    # parsers that find a request's and a response's ends, libevent
    ("forwarding", "file", r"(^|/)src/(\w+/)?(exchange|client|bevio|proxy|request|reqparse|respparse|reqinfo|upstream|"
                           r"router|balance|tls|worker|mirror|control)\.c$"),
    ("forwarding", "file", r"(^|/)llhttp/(llhttp|api|http)\.c$"),  # compiled in from node-llhttp's sources
    ("forwarding", "object", r"/libevent[a-z_]*-[0-9.]*\.so"),
    # libc: memcpy and the system-call wrappers (not the kernel behind them)
    ("libc", "object", r"/(libc|libm|ld-linux[^/]*)\.so"),
    # the rest of tokentap's own code (config, logging, the store's client
    # side) and of HAProxy's binary
    ("own code, other", "object", r"/(tokentap|haproxy)$"),
)
GROUP_ORDER = ("measuring", "forwarding", "TLS", "libc", "own code, other", "other")
KEYS = "cgijkl"
# the shapes the instruction counts are asked for in (tokentap-bench --api)
API_CHOICES = ("openai-chat", "openai-completions", "openai-responses", "anthropic")
PER_REQUEST = "kl"  # one-token answers: a request is one event, counted per request
BENCH_TIMEOUT_S = 600  # one bench run under callgrind
DUMP_TIMEOUT_S = 120
START_TIMEOUT_S = 120  # a proxy starting under valgrind on a loaded machine
VALGRIND = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]


def group_of(obj, fil):
    for g, where, rx in _GROUPS_RX:
        if rx.search(fil if where == "file" else obj):
            return g
    return "other"


_GROUPS_RX = [(g, w, re.compile(p)) for g, w, p in GROUPS]


# ---------------------------------------------------------------- callgrind files

def parse_callgrind(path):
    """{(object, file, function): self Ir} and the file's own total (its
    `totals:` or `summary:` line), read straight from callgrind's format:
    a cost line after `calls=` is the inclusive cost of that call and is
    skipped; every other cost line is the current function's own."""
    names = {}  # (kind, id) -> name, for the compressed "(id) name" form
    ob = fl = fn = "???"
    self_cost = {}
    total = None
    skip_next = False
    npos = 1
    with open(path, errors="replace") as f:
        for line in f:
            if not line or line[0] == "#":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) > npos:
                    k = (ob, fl, fn)
                    self_cost[k] = self_cost.get(k, 0) + int(parts[npos])
                continue
            key, _, val = line.rstrip("\n").partition("=")
            if key in ("ob", "fl", "fn", "fi", "fe", "cob", "cfi", "cfl", "cfn"):
                kind = {"fi": "fl", "fe": "fl", "cfi": "fl", "cfl": "fl", "cob": "ob", "cfn": "fn"}.get(key, key)
                m = re.match(r"\((\d+)\)(?: (.*))?$", val)
                if m:
                    if m.group(2) is not None:
                        names[(kind, m.group(1))] = m.group(2)
                    val = names.get((kind, m.group(1)), "???")
                if key == "ob":
                    ob = val
                elif key == "fl":
                    fl = val
                elif key == "fn":
                    fn = val
                continue
            if key == "calls":
                skip_next = True
                continue
            if key in ("jump", "jcnd"):
                skip_next = True
                continue
            head, _, rest = line.partition(":")
            if head == "positions":
                npos = len(rest.split())
            elif head in ("totals", "summary"):
                total = int(rest.split()[0])
    return self_cost, total


def read_dump(files):
    """{thread number: (self costs, total)} of one dump's per-thread files."""
    out = {}
    for p in files:
        m = re.search(r"-(\d+)$", p)
        out[int(m.group(1)) if m else 1] = parse_callgrind(p)
    return out


def as_proxy_user(argv):
    """argv run as the proxies run (proxies.py drops root to nobody): vgdb,
    behind callgrind_control, reaches a valgrind of another user only
    partly and then waits for good."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=%d" % px.NOBODY_UID, "--regid=%d" % px.NOBODY_GID, "--clear-groups", "--"] + argv


def dump(proc, outbase, seen):
    """Dumps (and so zeroes) callgrind's counters of proc; the new files."""
    r = subprocess.run(as_proxy_user(["callgrind_control", "-d", str(proc.pid)]), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    if r.returncode != 0:
        raise px.Failure("callgrind_control -d %d failed: %s%s" % (proc.pid, r.stdout, r.stderr))
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    new = []
    while time.monotonic() < deadline:
        new = sorted(p for p in set(glob.glob(outbase + ".*")) - seen if re.search(r"\.\d+(-\d+)?$", p))
        # a file is whole once its totals line is written; check the sizes hold
        if new and all(_complete(p) for p in new):
            break
        time.sleep(0.2)
    else:
        raise px.Failure("callgrind dump of %s did not appear under %s*" % (proc.name, outbase))
    seen.update(new)
    return new


def _complete(path):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            tail = f.read()
    except OSError:
        return False
    return (b"\ntotals:" in tail or b"\nsummary:" in tail) and tail.endswith(b"\n")


def zero(proc):
    r = subprocess.run(as_proxy_user(["callgrind_control", "-z", str(proc.pid)]), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    if r.returncode != 0:
        raise px.Failure("callgrind_control -z %d failed: %s%s" % (proc.pid, r.stdout, r.stderr))


def subtract(a, b):
    """b - a, function by function."""
    out = dict(b)
    for k, v in a.items():
        out[k] = out.get(k, 0) - v
    return out


# ---------------------------------------------------------------- one proxy, one scenario

def measure(name, key, bins, args, work, sim_ports, pki):
    """Instructions per event of one proxy in one scenario."""
    sc = px.SCENARIOS[key]
    side = sc.get("tls")
    tls = (side, pki) if side else None
    up_port = sim_ports["tls"] if side == "upstream" else sim_ports["plain"]
    d = os.path.join(work, "%s-%s" % (name, key))
    os.makedirs(d)
    os.chmod(d, 0o777)  # the proxy, as nobody, writes its callgrind files here
    outbase = os.path.join(d, "callgrind.out")
    wrap = VALGRIND + ["--callgrind-out-file=" + outbase]
    tag = "-instr-%s" % key
    if name == "tokentap":
        t = px.start_tokentap(bins, work, up_port, 10000, 1, tag, tls=tls, wrap=wrap)
    else:
        t = px.start_haproxy(work, up_port, 1, args.fds, tag, tls=tls, wrap=wrap)
    try:
        # (k), (l): a request is one event, and under callgrind a request
        # costs what 16 streamed events do: windows of events / 16 requests
        reqs = max(64, args.events // 16) if key in PER_REQUEST else max(1, -(-args.events // sc["tokens"]))
        conc = min(sc["concurrency"], reqs)
        base = dict(sc)
        base.pop("duration", None)
        base.pop("quick", None)
        base["api"] = args.api
        seen = set(glob.glob(outbase + "*"))
        dumps, events, errors = [], [], 0
        for i, n in enumerate((reqs, reqs, 2 * reqs)):
            if i == 1:
                zero(t.proc)
            jpath = os.path.join(work, "bench-%s-%s-%d.json" % (name, key, i))
            lpath = os.path.join(work, "requests-%s-%s-%d.jsonl" % (name, key, i))
            argv = px.bench_argv(bins, t.url, dict(base, requests=n, warmup=0), jpath, seed=i, concurrency=conc,
                                 log_path=lpath, ca=pki["ca"])
            try:
                rc = px.run_bench(argv, BENCH_TIMEOUT_S, os.path.join(work, "bench.log"))
            except subprocess.TimeoutExpired:
                raise px.Failure("tokentap-bench through %s under callgrind ran past %d s in (%s)"
                                 % (name, BENCH_TIMEOUT_S, key))
            t.check_alive()
            if rc != 0 or not os.path.exists(jpath):
                raise px.Failure("tokentap-bench through %s exited %d in (%s); see %s"
                                 % (name, rc, key, os.path.join(work, "bench.log")))
            s = px.summarize_bench(jpath, lpath)
            os.unlink(lpath)
            if s["errors"]:
                # the events received are still what is divided by, but the
                # windows no longer carry the same work: said beside the figure
                print("instr: (%s) %s run %d: failed requests %s" % (key, name, i, s["error_kinds"]), file=sys.stderr)
            if i >= 1:
                errors += s["errors"]
                events.append(s["events_forwarded"])
                dumps.append(read_dump(dump(t.proc, outbase, seen)))
            print("instr: (%s) %s run %d: %d requests, %d events" % (key, name, i, n, s["events_forwarded"]),
                  file=sys.stderr)
    finally:
        t.stop()
        px._started.remove(t.proc)
    n_events = events[1] - events[0]
    if n_events <= 0:
        raise px.Failure("(%s) %s: the second window did not carry more events than the first" % (key, name))
    threads = {}
    for tid in set(dumps[0]) | set(dumps[1]):
        a, ta = dumps[0].get(tid, ({}, 0))
        b, tb = dumps[1].get(tid, ({}, 0))
        threads[tid] = (subtract(a, b), (tb or 0) - (ta or 0))
    # the event loop's thread: for tokentap the one whose forwarding code
    # ran the most, for HAProxy the busiest
    def weight(tid):
        costs, total = threads[tid]
        if name == "tokentap":
            return sum(v for (ob, fl, fn), v in costs.items() if group_of(ob, fl) == "forwarding" and "/src/" in fl)
        return total
    loop = max(threads, key=weight)
    costs, total = threads[loop]
    groups = dict.fromkeys(GROUP_ORDER, 0)
    for (ob, fl, fn), v in costs.items():
        groups[group_of(ob, fl)] += v
    top = sorted(((v, fn, fl, ob) for (ob, fl, fn), v in costs.items()), reverse=True)[:args.top]
    return {
        "api": args.api, "events": n_events, "window_requests": [reqs, 2 * reqs], "concurrency": conc, "failed_requests": errors,
        "thread": loop,
        "total": total / n_events,
        "groups": {g: v / n_events for g, v in groups.items()},
        "other_threads": {str(tid): tt / n_events for tid, (_, tt) in sorted(threads.items()) if tid != loop},
        "top": [{"function": fn, "file": fl, "object": ob, "per_event": v / n_events} for v, fn, fl, ob in top],
    }


# ---------------------------------------------------------------- report

def render_scenario(key, r):
    """The table of one scenario."""
    lines = []
    tt, ha = r.get("tokentap"), r.get("haproxy")
    unit = "request" if key in PER_REQUEST else "event"
    lines.append("(%s) %s, %s: %d %ss between windows of %d and %d requests, concurrency %d"
                 % (key, px.SCENARIOS[key]["title"], tt["api"], tt["events"], unit, tt["window_requests"][0],
                    tt["window_requests"][1], tt["concurrency"]))
    lines.append("%-40s %10s %10s" % ("instructions per " + unit, "tokentap", "haproxy" if ha else ""))
    f = lambda x: "{:,.0f}".format(x)
    lines.append("%-40s %10s %10s" % ("all, the event loop's thread", f(tt["total"]), f(ha["total"]) if ha else ""))
    for g in GROUP_ORDER:
        lines.append("%-40s %10s %10s" % ("  " + g, f(tt["groups"][g]), f(ha["groups"][g]) if ha else ""))
    others = sum(tt["other_threads"].values())
    lines.append("%-40s %10s" % ("other threads (not in all)", f(others)))
    lines.append("tokentap's most costly functions (self, per %s):" % unit)
    for x in tt["top"]:
        # no source file: a library without debug information (libcrypto's assembly)
        where = x["file"] if x["file"] != "???" else x["object"]
        lines.append("  %8s  %s  %s" % (f(x["per_event"]), x["function"], os.path.basename(where)))
    for name, x in (("tokentap", tt), ("haproxy", ha)):
        if x and x["failed_requests"]:
            lines.append("%s: %d requests failed in the windows (see the bench log): approximate" %
                         (name, x["failed_requests"]))
    lines.append("")
    return "\n".join(lines)


def render_run(report):
    lines = []
    lines.append("run: %s; tokentap %s (checkout %s); %s; %s; kernel not counted (user space only)"
                 % (report["date"], report["machine"]["tokentap"], report["machine"]["source"],
                    report["machine"]["haproxy"] if report["haproxy"] else "no haproxy", report["valgrind"]))
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description="instructions per event of tokentap's worker by function group, "
                                 "beside HAProxy's, under callgrind (docs/bench.md)")
    ap.add_argument("--build", metavar="DIR", help="build directory (default build/, built first with contrib/build.sh)")
    ap.add_argument("--scenarios", default="cgij",
                    help="which of proxies.py's c, g, i, j, k, l to run (default cgij; k and l, one-token answers "
                    "on kept and new connections, count per request)")
    ap.add_argument("--events", type=int, default=32768,
                    help="token events between the two windows (default 32768: windows of 64 and 128 requests "
                    "of 512 tokens)")
    ap.add_argument("--api", default="openai-chat", choices=API_CHOICES,
                    help="the response shape tokentap-bench asks for (its --api; default openai-chat, the "
                    "simulator speaks them all)")
    ap.add_argument("--no-haproxy", action="store_true", help="tokentap only")
    ap.add_argument("--top", type=int, default=8, help="tokentap's most costly functions listed (default 8)")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (callgrind files, logs)")
    ap.add_argument("--no-install", action="store_true", help="never run apt-get; fail if valgrind or haproxy is missing")
    a = ap.parse_args(argv)
    if not a.scenarios or set(a.scenarios) - set(KEYS):
        ap.error("--scenarios takes letters from cgijkl")
    if not 512 <= a.events <= 1 << 20:
        ap.error("--events takes 512 to 1048576")
    if not 0 <= a.top <= 100:
        ap.error("--top takes 0 to 100")
    return a


def main(argv):
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, px.on_signal)
    px.READY_TIMEOUT_S = START_TIMEOUT_S
    work = None
    ok = False
    try:
        wanted = [("valgrind", "valgrind")] + ([] if args.no_haproxy else [("haproxy", "haproxy")])
        px.ensure_packages(args.no_install, wanted=wanted)
        if not shutil.which("callgrind_control"):
            raise px.Failure("callgrind_control not found (it comes with valgrind)")
        bins = px.find_binaries(args)
        args.fds = px.raise_fd_limit(4096)
        work = tempfile.mkdtemp(prefix="tokentap-instr-")
        os.chmod(work, 0o755)
        info = px.machine_info(bins)
        pki = px.make_pki(work)
        _, plain = px.start_sim(bins, work)
        _, tls = px.start_sim(bins, work, pki)
        report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "command": " ".join(["contrib/lab/instr.py"] + list(argv)), "machine": info,
                  "valgrind": px.version_of(["valgrind", "--version"]), "haproxy": not args.no_haproxy,
                  "groups": [list(g) for g in GROUPS], "scenarios": {}}
        for key in args.scenarios:
            print("instr: scenario (%s) %s" % (key, px.SCENARIOS[key]["title"]), file=sys.stderr)
            r = report["scenarios"][key] = {}
            for name in ("tokentap",) + (() if args.no_haproxy else ("haproxy",)):
                r[name] = measure(name, key, bins, args, work, {"plain": plain, "tls": tls}, pki)
            print(render_scenario(key, r))
            sys.stdout.flush()
        print(render_run(report))
        if args.json:
            px.write_report(args.json, report)
        ok = True
        return 0
    except px.Failure as e:
        print("instr: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("instr: interrupted", file=sys.stderr)
        return 130
    finally:
        px.clean_up("instr", work, ok, args.keep, "logs and callgrind files")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
