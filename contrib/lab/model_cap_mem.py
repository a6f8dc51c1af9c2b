#!/usr/bin/env python3
"""model_cap_mem.py — what a model series costs tokentap, to size
store.max_models (docs/storage.md, "The model cap").

For each N asked for (default 1, 32, 256, 1024), one tokentap (--workers
of them, default 1, the store on, store.max_models N, flushed every 200 ms) in front of
tokentap-sim, and N distinct model names (as a Multi-LoRA server's
adapters are named in `model`), each sent R streamed chat requests
(default 2, 16 tokens each, no pauses, a connection each, so that every
worker sees most models). Once /stats shows the N series and
two flushes more have passed, it reads the worker process's VmRSS and
VmHWM (/proc) and the blocks the LMDB directory holds, and prints them with
the cost per model over the first N (RSS and store bytes per series).

Loopback only, every wait bounded; run by hand:

  contrib/lab/model_cap_mem.py                       # 1, 32, 256, 1024
  contrib/lab/model_cap_mem.py --models 32,4096 --json out.json
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("model_cap_mem: timed out waiting for %s" % what)


def get(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def proc_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def dir_bytes(path):
    """Bytes the files under `path` hold on disk (allocated blocks: the LMDB
    map is sparse)."""
    n = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            n += os.stat(os.path.join(dirpath, f)).st_blocks * 512
    return n


def run_one(build, n, per_model, tokens, workers):
    work = tempfile.mkdtemp(prefix="tt-capmem-")
    procs = []
    try:
        sim_port, tt_port, admin_port = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen([os.path.join(build, "contrib", "sim", "tokentap-sim"), "--listen",
                                       "127.0.0.1:%d" % sim_port, "--ttft-ms", "0", "--itl-ms", "0"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cfg = os.path.join(work, "tt.yaml")
        with open(cfg, "w") as f:
            f.write("store:\n  max_models: %d\nupstreams:\n  - name: sim\n    url: http://127.0.0.1:%d\n"
                    % (n, sim_port))
        tt = subprocess.Popen([os.path.join(build, "tokentap"), "-c", cfg, "-l", "127.0.0.1:%d" % tt_port, "--admin", "127.0.0.1:%d" % admin_port,
                               "--data-dir", os.path.join(work, "data"), "--workers", str(workers),
                               "--flush-interval", "200ms"],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "tt.err"), "w"))
        procs.append(tt)
        wait_until(lambda: get(admin_port, "/healthz")[0] == 200, 10, "tokentap's admin API")
        rss_idle = proc_kib(tt.pid, "VmRSS")
        for i in range(n):
            body = json.dumps({"model": "base+lora-%05d" % i, "stream": True, "max_tokens": tokens,
                               "messages": [{"role": "user", "content": "adapter %d" % i}]})
            for _ in range(per_model):
                # a connection each: the kernel spreads them over the workers
                conn = http.client.HTTPConnection("127.0.0.1", tt_port, timeout=10)
                conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                conn.close()
                if r.status != 200:
                    raise SystemExit("model_cap_mem: status %d" % r.status)

        def all_series():
            st, b = get(admin_port, "/stats?window=all")
            return st == 200 and len(json.loads(b)["series"]) >= n

        wait_until(all_series, 60, "%d series in /stats" % n)
        time.sleep(0.5)  # two more flushes and their commits
        return {"models": n, "workers": workers, "requests": n * per_model, "rss_idle_kib": rss_idle,
                "rss_kib": proc_kib(tt.pid, "VmRSS"), "hwm_kib": proc_kib(tt.pid, "VmHWM"),
                "store_bytes": dir_bytes(os.path.join(work, "data"))}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default build/)")
    ap.add_argument("--models", default="1,32,256,1024", help="the Ns, comma-separated")
    ap.add_argument("--requests", type=int, default=2, help="requests per model (default 2)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per answer (default 16)")
    ap.add_argument("--workers", type=int, default=1, help="tokentap's event loops (default 1)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    a = ap.parse_args()
    rows = [run_one(a.build, int(n), a.requests, a.tokens, a.workers) for n in a.models.split(",")]
    base = rows[0]
    print("%8s %10s %10s %10s %12s %14s %14s" % ("models", "rss_kib", "hwm_kib", "idle_kib", "store_kib",
                                                 "rss_B/model", "store_B/model"))
    for r in rows:
        d = r["models"] - base["models"]
        r["rss_per_model_b"] = (r["rss_kib"] - base["rss_kib"]) * 1024 / d if d else None
        r["store_per_model_b"] = (r["store_bytes"] - base["store_bytes"]) / d if d else None
        print("%8d %10d %10d %10d %12d %14s %14s" % (
            r["models"], r["rss_kib"], r["hwm_kib"], r["rss_idle_kib"], r["store_bytes"] // 1024,
            "-" if d == 0 else "%.0f" % r["rss_per_model_b"], "-" if d == 0 else "%.0f" % r["store_per_model_b"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
