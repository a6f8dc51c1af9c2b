#!/usr/bin/env python3
"""admin_flood.py — does a flood of admin requests slow forwarding?

Starts tokentap-sim (ITL 10 ms, TTFT 20 ms) and tokentap in front of it
(temporary data dir, admin API on 127.0.0.1:0), then runs alternating phases
in one process lifetime: `base` (streamed requests only) and `flood` (the
same requests while a separate flooder process hammers the admin API with
GET /stats?window=24h, /metrics, /stats/curve, /upstreams, /routes and
/requests/recent in a tight loop from 2 threads). /upstreams and /routes
are answered by the worker itself, between two of its events, so they are
the part of the flood that reaches the forwarding thread. Alternating cancels slow drift of the machine; the flooder is a
separate process so that its threads do not share the measuring client's
interpreter lock.

Client-side, per request (raw socket, each body byte timestamped as it
arrives, harness.py): TTFT = first token-bearing event - request sent; ITL =
every gap between token-bearing events. Per phase: p50 and p99 of both.
The table shows each phase, then the median over phases of each kind and the
ratio flood / base.

    python3 tests/bench/admin_flood.py [--phases 6] [--requests 40] [--concurrency 2]

Binaries: TOKENTAP_BIN / TOKENTAP_SIM_BIN, else build*/ as harness.py finds
them. Only loopback; every loop bounded in count and time; every process
started here is stopped by its PID.
"""

import argparse
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import harness  # noqa: E402

# Every read endpoint: the store's (stats, curve, metrics), the recent ring,
# and the live views, which run a job on the worker's loop (control.h).
ADMIN_PATHS = ("/stats?window=24h", "/metrics", "/stats/curve", "/upstreams", "/routes", "/requests/recent")
FLOOD_MAX_S = 600  # a flooder never outlives this, whatever happens to its parent
PATH = "/v1/chat/completions"


# --------------------------------------------------------------------------
# the flooder (a child process)


def flood_main(port, threads_n):
    stop = threading.Event()
    counts = [0] * threads_n
    errors = [0] * threads_n
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def loop(k):
        deadline = time.monotonic() + FLOOD_MAX_S
        i = 0
        while not stop.is_set() and time.monotonic() < deadline and i < 10_000_000:
            path = ADMIN_PATHS[i % len(ADMIN_PATHS)]
            i += 1
            try:
                resp, _ = harness.exchange(port, "GET", path, timeout=10)
                if resp is not None and resp.status == 200:
                    counts[k] += 1
                else:
                    errors[k] += 1
            except OSError:
                errors[k] += 1

    ts = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads_n)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    stop.wait(FLOOD_MAX_S)
    for t in ts:
        t.join(15)
    print("%d %d %.3f" % (sum(counts), sum(errors), time.monotonic() - t0), flush=True)


class Flooder:
    def __init__(self, admin_port, threads_n):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--flood", str(admin_port),
                                      "--flood-threads", str(threads_n)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)

    def stop(self):
        """(admin requests answered, failed, seconds)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=10)
        try:
            ok, bad, secs = out.decode().split()
            return int(ok), int(bad), float(secs)
        except ValueError:
            raise RuntimeError("flooder said %r / %r" % (out, err[-500:]))


# --------------------------------------------------------------------------
# measuring


def one_request(port, tokens, rid):
    """(ttft ms, [itl ms]) seen by the client."""
    body = harness.api_body("openai-chat", stream=True, include_usage=True, model="bench-model")
    hdrs = harness.sim_headers(tokens=tokens, request_id=rid)
    resp, t0 = harness.exchange(port, "POST", PATH, body=body, headers=hdrs, timeout=30)
    if resp is None or resp.status != 200:
        raise RuntimeError("%s: proxy answered %r" % (rid, resp and resp.status))
    ts = [ev.ts for ev in harness.events_of(resp) if harness.is_token_event("openai-chat", ev)]
    if len(ts) != tokens:
        raise RuntimeError("%s: %d token events, expected %d" % (rid, len(ts), tokens))
    return (ts[0] - t0) / 1e6, [(b - a) / 1e6 for a, b in zip(ts, ts[1:])]


def run_phase(port, n, concurrency, tokens, tag):
    ttfts, itls, errors = [], [], []
    lock = threading.Lock()
    per = [n // concurrency + (1 if k < n % concurrency else 0) for k in range(concurrency)]

    def worker(k):
        for i in range(per[k]):
            try:
                ttft, gaps = one_request(port, tokens, "%s-%d-%d" % (tag, k, i))
            except Exception as e:  # reported by the caller
                with lock:
                    errors.append(repr(e))
                return
            with lock:
                ttfts.append(ttft)
                itls.extend(gaps)

    ts = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    if errors:
        raise RuntimeError("%s: %s" % (tag, errors[0]))
    return ttfts, itls


def pct(values, q):
    s = sorted(values)
    return s[max(1, math.ceil(q * len(s))) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", type=int, default=6, help="alternating base/flood phases (even; default 6)")
    ap.add_argument("--requests", type=int, default=40, help="streamed requests per phase (default 40)")
    ap.add_argument("--concurrency", type=int, default=2, help="client connections in flight (default 2)")
    ap.add_argument("--tokens", type=int, default=20, help="output tokens per request (default 20)")
    ap.add_argument("--flood-threads", type=int, default=2)
    ap.add_argument("--flood", type=int, metavar="ADMIN_PORT", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.flood:
        flood_main(a.flood, a.flood_threads)
        return 0
    if a.phases < 2 or a.phases % 2 or not (1 <= a.requests <= 10000) or not (1 <= a.concurrency <= 64):
        ap.error("--phases: an even number >= 2; --requests 1..10000; --concurrency 1..64")

    work = tempfile.mkdtemp(prefix="tokentap-admin-flood-")
    sim = tt = None
    try:
        sim = harness.Sim("--itl-ms", "10", "--ttft-ms", "20")
        tt = harness.Tokentap(sim.url, "--data-dir", os.path.join(work, "data"), "--admin", "127.0.0.1:0")
        admin = None
        for _ in range(200):
            m = re.search(r"admin listening on [0-9.]+:(\d+)", tt.stderr_text())
            if m:
                admin = int(m.group(1))
            if admin:
                break
            time.sleep(0.02)
        if not admin:
            raise RuntimeError("no admin port; stderr:\n" + tt.stderr_text())

        run_phase(tt.port, 10, a.concurrency, a.tokens, "warm")  # connections, histograms, LMDB pages
        time.sleep(1.5)  # one flush: /stats?window=24h has data to merge

        rows = []
        for p in range(a.phases):
            kind = "base" if p % 2 == 0 else "flood"
            fl = Flooder(admin, a.flood_threads) if kind == "flood" else None
            if fl:
                time.sleep(0.5)  # let the flood ramp up
            t0 = time.monotonic()
            try:
                ttfts, itls = run_phase(tt.port, a.requests, a.concurrency, a.tokens, "%s%d" % (kind, p))
            finally:
                flood = fl.stop() if fl else None
            secs = time.monotonic() - t0
            rows.append({"phase": p + 1, "kind": kind, "n": len(ttfts), "gaps": len(itls), "secs": secs,
                         "ttft50": pct(ttfts, 0.5), "ttft99": pct(ttfts, 0.99),
                         "itl50": pct(itls, 0.5), "itl99": pct(itls, 0.99),
                         "admin_rps": flood[0] / flood[2] if flood else 0.0,
                         "admin_err": flood[1] if flood else 0})
    finally:
        if tt:
            tt.stop()
        if sim:
            sim.stop()
        shutil.rmtree(work, ignore_errors=True)

    print("admin_flood: sim TTFT 20 ms, ITL 10 ms, %d tokens; %d requests/phase at concurrency %d; "
          "flood = %d threads looping over %s" % (a.tokens, a.requests, a.concurrency, a.flood_threads,
                                                  ", ".join(ADMIN_PATHS)))
    print("machine: %d CPUs (os.cpu_count)" % (os.cpu_count() or 0))
    print()
    hdr = "%-5s %-5s %5s %6s %10s %10s %9s %9s %11s" % ("phase", "kind", "reqs", "gaps", "ttft p50", "ttft p99",
                                                        "itl p50", "itl p99", "admin req/s")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print("%-5d %-5s %5d %6d %8.2fms %8.2fms %7.2fms %7.2fms %11.0f%s"
              % (r["phase"], r["kind"], r["n"], r["gaps"], r["ttft50"], r["ttft99"], r["itl50"], r["itl99"],
                 r["admin_rps"], " (%d failed)" % r["admin_err"] if r["admin_err"] else ""))
    print()
    print("median over phases    base       flood      flood/base")
    for key, label in (("ttft50", "ttft p50"), ("ttft99", "ttft p99"), ("itl50", "itl p50"), ("itl99", "itl p99")):
        b = statistics.median(r[key] for r in rows if r["kind"] == "base")
        f = statistics.median(r[key] for r in rows if r["kind"] == "flood")
        print("%-18s %8.2fms %9.2fms %10.3f" % (label, b, f, f / b if b else float("nan")))
    f_rps = statistics.median(r["admin_rps"] for r in rows if r["kind"] == "flood")
    print("%-18s %10s %9.0f" % ("admin req/s", "0", f_rps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
