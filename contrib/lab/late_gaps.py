#!/usr/bin/env python3
"""late_gaps.py — scenario (h) of proxies.py taken apart: which gaps are late,
and what the proxy's threads did meanwhile.

One stream (ttft 20 ms, itl 10 ms, 6 tokens) through tokentap and HAProxy to
the TLS simulator (`tokentap-sim --tls-cert`), and direct to the plain one,
alternating per round as proxies.py does, with its keys, configurations and
process handling (imported from it). Per target and round it prints the gaps
longer than itl + 2 ms per 1,000, each late gap with its arrival time modulo
1 s (late gaps caused by something once a second, such as tokentap's store
flush, would gather at one phase), and the voluntary and involuntary context
switches and CPU ticks of each of the proxy's threads over the run. tokentap
runs with --log-level debug, so its TLS upstream connections log, as they
close, their records, reads and the reads that stopped holding part of a
record ("partial"); those lines are printed at the end.

On a loaded machine the scheduler hides a tail of a few milliseconds: run the
whole chain at a real-time priority (the bench and processes inherit it;
one stream takes a few per cent of a CPU):

  chrt -f 10 contrib/lab/late_gaps.py --build build --rounds 5 --workers 2

On a quiet machine some rounds go bad with the chain spread over both
vCPUs: the forwarding thread's kernel time up by 2-3x with the same system
calls (the sends that wake a peer cost more). `--cpus 0` runs the whole
chain on one vCPU to compare against, and each thread's CPU ticks are
printed as user+sys to show which part grew.

Targets: direct, tokentap, nostore (tokentap with --data-dir off), haproxy.
Loopback only; every wait bounded; the processes started here are stopped by
PID on exit. See docs/benchmarks.md, "late_gaps.py"; the runs behind it:
docs/dev/perf-log.md, "The (h) itl tail".
"""

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxies as P  # noqa: E402

LATE_MS = 12.0  # the scenario's itl (10 ms) + P.LATE_MS


def thread_counts(pid):
    """{tid: (name, voluntary, involuntary, (utime, stime) ticks)}"""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        base = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(base + "status") as f:
                st = dict(line.split(":", 1) for line in f if ":" in line)
            with open(base + "comm") as f:
                comm = f.read().strip()
            with open(base + "stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (comm, int(st["voluntary_ctxt_switches"]), int(st["nonvoluntary_ctxt_switches"]),
                    (int(fields[11]), int(fields[12])))
    return out


def late_gaps(log_path):
    """(all measured gaps, [(late gap ms, arrival ms modulo 1000)])"""
    gaps, late = [], []
    with open(log_path) as f:
        for line in f:
            q = json.loads(line)
            if q.get("warmup") or not q.get("ok"):
                continue
            t = q["start_ms"] + q["ttft_ms"]
            for g in q.get("itl_ms") or []:
                t += g
                gaps.append(g)
                if g > LATE_MS:
                    late.append((round(g, 2), int(t) % 1000))
    return gaps, late


def main(argv):
    ap = argparse.ArgumentParser(description="late gaps of scenario (h), per target and round")
    ap.add_argument("--build", default="build", help="build directory (default build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="per target and round (default 200)")
    ap.add_argument("--workers", type=int, choices=(1, 2), default=2)
    ap.add_argument("--targets", default="direct,tokentap,haproxy",
                    help="comma-separated from direct, tokentap, nostore, haproxy")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, requests logs)")
    ap.add_argument("--cpus", help="run the whole chain on these CPUs (e.g. 0: one vCPU, no wake-ups across vCPUs)")
    a = ap.parse_args(argv)
    names = a.targets.split(",")
    if set(names) - {"direct", "tokentap", "nostore", "haproxy"} or not 1 <= a.rounds <= 20:
        ap.error("--targets takes direct, tokentap, nostore, haproxy; --rounds 1 to 20")
    if a.cpus:
        os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
    build = os.path.abspath(a.build)
    bins = {"tokentap": os.path.join(build, "tokentap"), "sim": os.path.join(build, "contrib/sim/tokentap-sim"),
            "bench": os.path.join(build, "contrib/bench/tokentap-bench")}
    args = argparse.Namespace(workers=a.workers, fds=4096, streams=10)
    work = tempfile.mkdtemp(prefix="tokentap-late-")
    os.chmod(work, 0o755)
    debug = P.Proc.__init__

    def with_debug(self, name, pargv, *rest, **kw):
        debug(self, name, pargv + ["--log-level", "debug"] if name == "tokentap" else pargv, *rest, **kw)

    P.Proc.__init__ = with_debug
    targets = {}
    try:
        pki = P.make_pki(work)
        _, plain_port = P.start_sim(bins, work)
        _, tls_port = P.start_sim(bins, work, pki)
        up = ("upstream", pki)
        targets["direct"] = P.Target("direct", plain_port)
        if "tokentap" in names:
            targets["tokentap"] = P.start_tokentap(bins, work, tls_port, 1000, a.workers, "-h", tls=up)
        if "nostore" in names:
            targets["nostore"] = P.start_tokentap(bins, work, tls_port, 1000, a.workers, "-n", store=False, tls=up)
        if "haproxy" in names:
            targets["haproxy"] = P.start_haproxy(work, tls_port, a.workers, args.fds, "-h", tls=up)
        sc = dict(P.SCENARIOS["h"], requests=a.requests)
        per_k = collections.defaultdict(list)
        for r in range(a.rounds):
            for name in names:
                t = targets[name]
                log = os.path.join(work, "requests-%s-%d.jsonl" % (name, r))
                argv_b = P.bench_argv(bins, t.url, sc, os.path.join(work, "bench-%s-%d.json" % (name, r)), r,
                                      log_path=log)
                c0 = thread_counts(t.proc.pid) if t.proc else {}
                rc = P.run_bench(argv_b, 300, os.path.join(work, "bench.log"))
                c1 = thread_counts(t.proc.pid) if t.proc else {}
                if rc != 0:
                    raise P.Failure("tokentap-bench against %s exited %d; see %s/bench.log" % (name, rc, work))
                gaps, late = late_gaps(log)
                gaps.sort()
                k = 1000.0 * len(late) / max(1, len(gaps))
                per_k[name].append(k)
                print("round %d %-8s %4d gaps, late per 1,000 %5.1f, p99 %.2f, max %.2f ms"
                      % (r + 1, name, len(gaps), k, P.nearest_rank(gaps, 99) or 0, gaps[-1] if gaps else 0))
                print("   late (gap ms, arrival ms mod 1 s):", sorted(late, key=lambda x: x[1]))
                busy = [(c1[x][0], c1[x][1] - c0[x][1], c1[x][2] - c0[x][2], "%d+%d" % (c1[x][3][0] - c0[x][3][0], c1[x][3][1] - c0[x][3][1]))
                        for x in c1 if x in c0 and c1[x][1] != c0[x][1]]
                if busy:
                    print("   threads woken (name, voluntary, involuntary, cpu ticks user+sys):", sorted(busy))
        print("late gaps per 1,000, rounds (median):")
        for name in names:
            print("  %-8s %s (%.1f)" % (name, " ".join("%.0f" % x for x in per_k[name]),
                                        P.median(per_k[name])))
    except P.Failure as e:
        print("late_gaps: %s" % e, file=sys.stderr)
        return 1
    finally:
        P.Proc.__init__ = debug
        for p in list(P._started):
            p.stop()
        for name in ("tokentap", "nostore"):
            if name in targets:
                with open(targets[name].proc.log_path, errors="replace") as f:
                    for line in f:
                        if "TLS:" in line:
                            print("  %s: %s" % (name, line.strip()))
        if a.keep:
            print("work dir %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
