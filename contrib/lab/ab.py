#!/usr/bin/env python3
"""ab.py — two tokentap builds side by side in one run, in any of
proxies.py's latency scenarios, rounds alternating, optionally with HAProxy
in the same rounds as a yardstick: a change is judged on rounds that shared
the machine's mood. It is proxies.py's machinery (the same simulator, bench
runs, proxy configurations and CPU accounting from /proc), pointed at an old
and a new binary instead of at the peers.

  contrib/lab/ab.py [--build DIR] [--rounds N] [--scenarios c] [--haproxy] OLD_TOKENTAP

Scenarios f-i put TLS on one side as proxies.py does (the same run-made CA
and certificate, the same suite): f, g client -> proxy, h, i proxy ->
simulator; each side gets its own pair of tokentaps (and HAProxy).

--build DIR (default build/) holds the new tokentap, the simulator and
tokentap-bench; OLD_TOKENTAP is the binary to compare it with (say, a copy
of build/tokentap taken before the change). Each tokentap runs with one
loop and the store on, access log off. Prints each round on stderr and a
table of medians over rounds; compare medians, not single rounds.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile

import proxies as px


def parse_args(argv):
    ap = argparse.ArgumentParser(description="an old and a new tokentap build, alternating (docs/benchmarks.md)")
    ap.add_argument("old", metavar="OLD_TOKENTAP", help="the tokentap binary to compare the --build one with")
    ap.add_argument("--build", metavar="DIR", default=os.path.join(px.ROOT, "build"),
                    help="build directory of the new tokentap, the simulator and tokentap-bench (default build/)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per scenario (default 5)")
    ap.add_argument("--scenarios", default="c", help="which of proxies.py's a, b, c, f, g, h, i, j to run (default c)")
    ap.add_argument("--haproxy", action="store_true", help="HAProxy in the same rounds, as a yardstick")
    a = ap.parse_args(argv)
    if not 1 <= a.rounds <= 20:
        ap.error("--rounds takes 1 to 20")
    if not a.scenarios or set(a.scenarios) - set("abcfghij"):
        ap.error("--scenarios takes letters from abcfghij")
    if not os.access(a.old, os.X_OK):
        ap.error("%s is not an executable" % a.old)
    if a.haproxy and not (shutil.which("haproxy") or os.access("/usr/sbin/haproxy", os.X_OK)):
        ap.error("--haproxy needs Debian's haproxy package")
    a.quick = False  # what run_latency_scenario reads besides rounds
    return a


def run_one(key, targets, bins, args, work):
    print("ab: scenario (%s) %s" % (key, px.SCENARIOS[key]["title"]), file=sys.stderr)
    sc = px.run_latency_scenario(key, targets, bins, args, work)
    print(px.scenario_heading(key, sc))
    print("%-8s %8s %8s %8s %10s %10s" % ("target", "ttft p50", "ttft p99", "itl p99", "events/s", "cpu s/M ev"))
    for t in targets:
        e = sc["targets"][t.name]
        print("%-8s %8s %8s %8s %10s %10s" % (t.name, px.fmt(e["ttft_p50"]), px.fmt(e["ttft_p99"]),
                                              px.fmt(e["itl_p99"]), px.fmt(e["events_per_s"], 0),
                                              px.fmt(e["cpu_s_per_m_events"], None)))
    print()
    sys.stdout.flush()


def main(argv):
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, px.on_signal)
    work = None
    try:
        bins = px.find_binaries(args)
        old_bins = dict(bins, tokentap=os.path.abspath(args.old))
        fds = px.raise_fd_limit(4000)
        work = tempfile.mkdtemp(prefix="tokentap-ab-")
        os.chmod(work, 0o755)
        sim, sim_port = px.start_sim(bins, work)
        for side in (None, "client", "upstream"):
            keys = [k for k in args.scenarios if px.SCENARIOS[k].get("tls") == side]
            if not keys:
                continue
            tls, up_port, direct = None, sim_port, px.Target("direct", sim_port)
            if side:
                if not getattr(args, "pki", None):
                    args.pki = px.make_pki(work)
                    _, args.tls_sim_port = px.start_sim(bins, work, args.pki)
                tls = (side, args.pki)
                if side == "client":
                    direct = px.Target("direct", args.tls_sim_port, https=True)
                else:
                    up_port = args.tls_sim_port
            targets = [direct]
            for name, b in (("old", old_bins), ("new", bins)):
                t = px.start_tokentap(b, work, up_port, 10000, 1, "-%s-%s" % (name, side), tls=tls)
                t.name = name
                targets.append(t)
            if args.haproxy:
                targets.append(px.start_haproxy(work, up_port, 1, fds, "-%s" % side, tls=tls))
            for key in keys:
                run_one(key, targets, bins, args, work)
            for t in targets[1:]:
                t.stop()
                px._started.remove(t.proc)
        return 0
    except px.Failure as e:
        print("ab: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ab: interrupted", file=sys.stderr)
        return 130
    finally:
        px.stop_all()
        if work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
