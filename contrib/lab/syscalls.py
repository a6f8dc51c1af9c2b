#!/usr/bin/env python3
"""System calls per request of tokentap and HAProxy in proxies.py's (k) and
(l): one-token answers on kept and on new connections (docs/benchmarks.md).

Each proxy (one event loop) runs in front of tokentap-sim; after a warm-up,
`strace -c -f` attaches to it for one window of R requests from
tokentap-bench and is stopped after it: every system call of every thread
of the proxy in that window, divided by R. strace slows each call down, so
the figures are counts, not times. Loopback only; every run and wait is
bounded; each process started is stopped by PID on exit.

  contrib/lab/syscalls.py --build build               # (k) and (l), 4,096 requests
  contrib/lab/syscalls.py --build build --scenarios l --requests 2048 --json out.json
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxies as px  # noqa: E402

BENCH_TIMEOUT_S = 300
STRACE_READY_S = 10


def parse_strace_c(text):
    """{syscall: calls} from strace -c's table."""
    calls = {}
    for line in text.splitlines():
        m = re.match(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m and m.group(2) != "total":
            calls[m.group(2)] = calls.get(m.group(2), 0) + int(m.group(1))
    return calls


def window(bins, t, sc, n, work, tag):
    out = os.path.join(work, "strace-%s.txt" % tag)
    st = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(t.proc.proc.pid)], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # strace says "Process N attached" on stderr once it holds the threads
        deadline = time.monotonic() + STRACE_READY_S
        seen = b""
        os.set_blocking(st.stderr.fileno(), False)
        while b"attached" not in seen and time.monotonic() < deadline and st.poll() is None:
            seen += st.stderr.read() or b""
            time.sleep(0.05)
        if b"attached" not in seen:
            raise px.Failure("strace did not attach to %s: %s" % (t.proc.proc.pid, seen.decode(errors="replace")))
        jpath = os.path.join(work, "bench-%s.json" % tag)
        argv = px.bench_argv(bins, t.url, dict(sc, requests=n, warmup=0), jpath, seed=1)
        rc = px.run_bench(argv, BENCH_TIMEOUT_S, os.path.join(work, "bench.log"))
        if rc != 0:
            raise px.Failure("tokentap-bench exited %d (%s); see %s" % (rc, tag, os.path.join(work, "bench.log")))
        with open(jpath) as f:
            errors = sum(json.load(f)["result"]["errors"].values())
    finally:
        st.send_signal(signal.SIGINT)
        try:
            st.wait(timeout=30)
        except subprocess.TimeoutExpired:
            st.kill()
            st.wait(timeout=10)
    with open(out) as f:
        return parse_strace_c(f.read()), errors


def main(argv):
    ap = argparse.ArgumentParser(description="system calls per request, tokentap beside HAProxy, under strace -c")
    ap.add_argument("--build", metavar="DIR", required=True, help="build directory holding tokentap, the sim, the bench")
    ap.add_argument("--scenarios", default="kl", help="of k, l (default kl)")
    ap.add_argument("--requests", type=int, default=4096, help="requests in the counted window (default 4096)")
    ap.add_argument("--no-haproxy", action="store_true", help="tokentap only")
    ap.add_argument("--json", metavar="PATH", help="write the counts as JSON")
    args = ap.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, px.on_signal)
    if not shutil.which("strace"):
        raise SystemExit("syscalls.py: strace is missing (apt-get install strace)")
    if not args.no_haproxy:
        px.ensure_packages(False, wanted=[("haproxy", "haproxy")])
    build = os.path.abspath(args.build)
    bins = {"tokentap": os.path.join(build, "tokentap"),
            "sim": os.path.join(build, "contrib", "sim", "tokentap-sim"),
            "bench": os.path.join(build, "contrib", "bench", "tokentap-bench")}
    work = tempfile.mkdtemp(prefix="tokentap-syscalls-")
    os.chmod(work, 0o755)
    report = {"requests": args.requests, "scenarios": {}}
    try:
        _, sim_port = px.start_sim(bins, work)
        for key in args.scenarios:
            sc = dict(px.SCENARIOS[key])
            sc.pop("duration", None)
            sc.pop("quick", None)
            for name in ("tokentap",) + (() if args.no_haproxy else ("haproxy",)):
                tag = "%s-%s" % (name, key)
                if name == "tokentap":
                    t = px.start_tokentap(bins, work, sim_port, 10000, 1, "-sc-" + key)
                else:
                    t = px.start_haproxy(work, sim_port, 1, 4096, "-sc-" + key)
                try:
                    w = px.bench_argv(bins, t.url, dict(sc, requests=256, warmup=0),
                                      os.path.join(work, "warm-%s.json" % tag), seed=0)
                    px.run_bench(w, BENCH_TIMEOUT_S, os.path.join(work, "bench.log"))
                    calls, errors = window(bins, t, sc, args.requests, work, tag)
                finally:
                    t.stop()
                    px._started.remove(t.proc)
                per = {k: v / args.requests for k, v in sorted(calls.items(), key=lambda kv: -kv[1])}
                report["scenarios"].setdefault(key, {})[name] = {"per_request": per,
                                                                 "all": sum(per.values()), "failed": errors}
    finally:
        px.stop_all()
    for key, r in report["scenarios"].items():
        print("(%s) %s: system calls per request, %d requests" % (key, px.SCENARIOS[key]["title"], args.requests))
        names = sorted({s for x in r.values() for s in x["per_request"]},
                       key=lambda s: -max(x["per_request"].get(s, 0) for x in r.values()))
        print("  %-18s %s" % ("", " ".join("%10s" % n for n in r)))
        for s in names + ["all"]:
            vals = [x["all"] if s == "all" else x["per_request"].get(s, 0) for x in r.values()]
            if s == "all" or max(vals) >= 0.005:
                print("  %-18s %s" % (s, " ".join("%10.2f" % v for v in vals)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
