#!/usr/bin/env python3
"""routing.py — how tokentap's balancing policies place LLM requests, against
nginx's and HAProxy's, on a fleet of four batching simulators.

Each run starts four tokentap-sim replicas in their continuous-batching
model with a bounded prefix cache (--batching --prefix-cache
--prefix-cache-tokens), one target in front of them, and tokentap-bench at a
fixed open-loop rate near what the fleet can serve; then it stops them all,
so that no run inherits another's caches, queues or learned state. Targets
alternate within a round (round 1 runs every target once, round 2 again, in
the same order, with the next seed), so whatever else the machine does is
spread over all of them; every figure is the median over rounds of the
per-round value, and the per-round values are printed and kept in --json.

Targets (a target tokentap refuses is skipped, with its -t message):

  tokentap-weighted        balance: weighted (smooth weighted round robin,
                           the default; run without the key where tokentap
                           does not know it yet)
  tokentap-least_request   balance: least_request
  tokentap-latency         balance: latency
  tokentap-prefix          balance: prefix
  nginx-least_conn         upstream { least_conn; }
  nginx-hash               upstream { hash $http_x_session_id consistent; }
  haproxy-leastconn        balance leastconn
  haproxy-random2          balance random(2)
  haproxy-hdr              balance hdr(x-session-id), hash-type consistent,
                           hash-balance-factor 150

Scenarios (SCENARIOS below has the numbers):

  p  shared-prefix multi-turn chat on four equal replicas: tokentap-bench
     --sessions, every turn resending the history, more system prompts than
     one replica's cache holds, the session in x-session-id
  h  unique prompts, one replica at a third of the others' speed (its
     prefill, step base and per-sequence cost all three times slower);
     the session-hash targets are left out (there is no session)
  b  (p) with bursty arrivals: gamma, burstiness 0.25
  f  the fleet: three tokentaps with balance: prefix and no shared state,
     the bench's connections spread at random over them by an HAProxy in
     TCP mode (balance random), so one session's turns reach different
     instances; beside one tokentap-prefix alone. Skipped while tokentap
     refuses balance: prefix.

Reported per target, from the bench's requests log (warm-up left out):

  ttft p50, p99       ms, nearest rank
  goodput             requests per second of the measured window whose ttft
                      and tpot both meet the scenario's SLO (DistServe's
                      measure, a rate: a target that serves fewer requests
                      in time has less, whatever its share)
  out tok/s           output tokens per second of the measured window
  hit ratio           prompt tokens the replicas' usage said were read from
                      their prefix cache over all prompt tokens
  errors              failed requests, warm-up included
  share               requests each replica answered (its /sim/stats),
                      warm-up included
  ceiling             goodput were every measured request in time: the
                      measured requests over the window (no target can
                      have more)
  cold, floor         per round, of the chat workload: the measured first
                      turns over a system prompt no earlier request sent
                      (cold on every replica, whatever the placement), and
                      the ttft p99 that no placement gets under because of
                      them (their whole prompts at the replica's prefill
                      rate; 0 when too few of them to bound it)

and the targets checked where the policies exist: (p) prefix's hit
ratio at least twice weighted's and its ttft p99 at most half the best
peer's; (h) latency's goodput at least 1.2 x the best peer's and its ttft
p99 at most 0.7 x weighted's; (b) every tokentap policy's ttft p99 no worse
than least_request's; (f) the fleet's hit ratio within 10 % of one
tokentap's.

nginx and HAProxy are Debian's packages (installed with apt-get when
missing, as proxies.py does) run in the foreground as user nobody with their
own configuration in a temporary directory; everything stays on loopback,
every wait is bounded, and only the processes this script started are
stopped, by PID. The helpers are proxies.py's.

  contrib/lab/routing.py                       # full: 3 rounds, 30 s runs
  contrib/lab/routing.py --quick               # 1 round, 8 s runs
  contrib/lab/routing.py --quick --rounds 3 --scenarios ph --json out.json
  contrib/lab/routing.py --targets tokentap-weighted,nginx-least_conn --scenarios p
  contrib/lab/routing.py --rate 8 --scenarios b   # a reduced offered load, for a loaded machine

See docs/bench.md ("Routing benchmark").
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxies as px  # noqa: E402  (the process, setup and percentile helpers)

LOOPBACK = px.LOOPBACK
SESSION_HEADER = "x-session-id"

# One replica at full speed: the batching model's defaults but for a batch
# of 16 and a 32k-token KV budget and prefix cache (a small GPU's), so that
# a few long system prompts already overflow one replica's cache.
REPLICA = dict(prefill_tps=8000.0, step_base_ms=8.0, step_per_seq_ms=0.5, max_batch=16, kv_tokens=32768,
               cache_tokens=32768)

# The chat workload of (p), (b), (f): 48 system prompts of 2,048 tokens
# (96k tokens, three replicas' caches: spread over all four replicas most
# are evicted before they come back, a quarter of them fits one), user
# turns of 64-192 tokens, answers of 64; 3 sessions per request/s of rate,
# so a session's next turn comes about 3 s after its previous one. With 24
# prompts a round robin kept a 0.54 hit ratio, which no policy could double.
CHAT = dict(system_prompts=48, system_len=2048, input_len="uniform:64:192", output_len=64, turns=10)

SCENARIOS = {
    "p": dict(title="shared-prefix multi-turn chat, four equal replicas", speeds=(1, 1, 1, 1), workload="chat",
              rate=20.0, duration=30, warmup_s=5, slo_ttft_ms=1000.0, slo_tpot_ms=50.0),
    "h": dict(title="unique prompts, one replica at a third of the others' speed", speeds=(1, 1, 1, 1 / 3.0),
              workload="unique", input_len="uniform:512:1536", output_len=64, rate=11.0, duration=30,
              warmup_s=5, slo_ttft_ms=1000.0, slo_tpot_ms=50.0),
}
SCENARIOS["b"] = dict(SCENARIOS["p"], title="(p) with bursty arrivals (gamma, burstiness 0.25)", burstiness=0.25)
SCENARIOS["f"] = dict(SCENARIOS["p"], title="the fleet: three tokentaps with balance: prefix, clients spread at random")
QUICK = dict(duration=8, warmup_s=2)

TOKENTAP_POLICIES = ("weighted", "least_request", "latency", "prefix")
NGINX_BALANCE = {"least_conn": "least_conn;", "hash": "hash $http_x_session_id consistent;"}
HAPROXY_BALANCE = {"leastconn": "balance leastconn", "random2": "balance random(2)",
                   "hdr": "balance hdr(x-session-id)\n    hash-type consistent\n    hash-balance-factor 150"}
TARGETS = (["tokentap-" + p for p in TOKENTAP_POLICIES] + ["nginx-" + k for k in NGINX_BALANCE]
           + ["haproxy-" + k for k in HAPROXY_BALANCE])
SESSION_HASH_TARGETS = ("nginx-hash", "haproxy-hdr")
FLEET = "tokentap-prefix-fleet3"


# ---------------------------------------------------------------- replicas

def replica_argv(bins, speed):
    """A replica at `speed` times the full one's: prefill that much faster,
    steps that much shorter."""
    r = REPLICA
    return [bins["sim"], "--listen", LOOPBACK + ":0", "--batching", "--prefix-cache",
            "--prefix-cache-tokens", str(r["cache_tokens"]), "--kv-tokens", str(r["kv_tokens"]),
            "--max-batch", str(r["max_batch"]), "--prefill-tps", "%g" % (r["prefill_tps"] * speed),
            "--step-base-ms", "%g" % (r["step_base_ms"] / speed),
            "--step-per-seq-ms", "%g" % (r["step_per_seq_ms"] / speed)]


def start_replicas(bins, work, speeds, tag):
    out = []
    for i, speed in enumerate(speeds):
        p = px.Proc("sim-%d" % i, replica_argv(bins, speed), os.path.join(work, "%s-sim%d.log" % (tag, i)))
        port = int(p.wait_line(r"^tokentap-sim listening on 127\.0\.0\.1:(\d+)$").group(1))
        out.append((p, port))
    return out


# ---------------------------------------------------------------- targets

def tokentap_conf(ports, policy, with_key=True):
    s = "access_log: off\nupstreams:\n"
    for i, port in enumerate(ports):
        s += "  - name: r%d\n    url: http://127.0.0.1:%d\n" % (i, port)
    s += "routes:\n  - name: chat\n    split:\n"
    for i in range(len(ports)):
        s += "      - {upstream: r%d}\n" % i
    if with_key:
        s += "    balance: %s\n" % policy
    return s


def tokentap_check(bins, work, policy):
    """How tokentap takes `balance: policy`: (True, with_key, "") when
    accepted; (False, _, its -t message) when refused. weighted is the
    default, so a tokentap that does not know the key runs it without."""
    d = px.private_dir(work, "check-" + policy)
    msg = ""
    for with_key in (True, False) if policy == "weighted" else (True,):
        conf = os.path.join(d, "tokentap.yaml")
        with open(conf, "w") as f:
            f.write(tokentap_conf([1, 2, 3, 4], policy, with_key))
        r = subprocess.run([bins["tokentap"], "-t", "-c", conf], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        if r.returncode == 0:
            return True, with_key, "" if with_key else "tokentap does not know balance:; ran without it (%s)" % (
                msg.strip().splitlines() or ["-"])[0]
        msg = r.stdout
    return False, True, " ".join(msg.split())[:300]


def start_tokentap(bins, work, ports, policy, with_key, tag):
    d = px.private_dir(work, "tokentap-" + tag)
    conf = os.path.join(d, "tokentap.yaml")
    with open(conf, "w") as f:
        f.write(tokentap_conf(ports, policy, with_key))
    argv = [bins["tokentap"], "-c", conf, "--listen", LOOPBACK + ":0", "--data-dir", "off", "--workers", "1"]
    p = px.Proc("tokentap", argv, os.path.join(d, "tokentap.log"), cwd=d, unprivileged=True)
    port = int(p.wait_line(r"listening on 127\.0\.0\.1:(\d+)(?: \(tls\))?, ").group(1))
    return px.Target("tokentap-" + policy, port, p)


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    access_log off;
{temp_paths}    tcp_nodelay on;
    keepalive_requests 1000000;
    upstream fleet {{
        {balance}
{servers}        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=1024;
        location / {{
            proxy_pass http://fleet;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            client_body_buffer_size 1m;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""

HAPROXY_CONF = """\
global
    maxconn 4096
    nbthread 1
defaults
    mode {mode}
    {http_opts}
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend fe
    bind 127.0.0.1:{port}
    default_backend fleet
backend fleet
    {balance}
{servers}"""


def start_nginx(work, ports, key, tag):
    d = px.private_dir(work, "nginx-" + tag)
    port = px.free_port()
    conf = os.path.join(d, "nginx.conf")
    servers = "".join("        server 127.0.0.1:%d;\n" % p for p in ports)
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(dir=d, port=port, balance=NGINX_BALANCE[key], servers=servers,
                                  temp_paths=px.nginx_temp_paths(d)))
    p = px.Proc("nginx", ["nginx", "-p", d + "/", "-c", conf, "-e", os.path.join(d, "error.log")],
                os.path.join(d, "stderr.log"), cwd=d, unprivileged=True)
    p.wait_port(port)
    p.remember_children()
    return px.Target("nginx-" + key, port, p)


def start_haproxy(work, ports, balance, tag, name, mode="http"):
    d = px.private_dir(work, "haproxy-" + tag)
    port = px.free_port()
    conf = os.path.join(d, "haproxy.cfg")
    servers = "".join("    server r%d 127.0.0.1:%d\n" % (i, p) for i, p in enumerate(ports))
    with open(conf, "w") as f:
        f.write(HAPROXY_CONF.format(port=port, mode=mode, balance=balance, servers=servers,
                                    http_opts="option http-no-delay\n    http-reuse always\n    "
                                    "timeout http-keep-alive 75s" if mode == "http" else "#"))
    p = px.Proc("haproxy", ["haproxy", "-db", "-f", conf], os.path.join(d, "haproxy.log"), cwd=d,
                unprivileged=True)
    p.wait_port(port)
    return px.Target(name, port, p)


def start_target(name, bins, work, ports, tag, checks):
    """The processes of one target, the one to point the bench at last."""
    if name == FLEET:
        taps = [start_tokentap(bins, work, ports, "prefix", True, "%s-%d" % (tag, i)) for i in range(3)]
        spread = start_haproxy(work, [t.port for t in taps], "balance random", tag + "-spread", FLEET, mode="tcp")
        return taps + [spread]
    if name.startswith("tokentap-"):
        policy = name[len("tokentap-"):]
        return [start_tokentap(bins, work, ports, policy, checks[policy][1], tag)]
    if name.startswith("nginx-"):
        return [start_nginx(work, ports, name[len("nginx-"):], tag)]
    return [start_haproxy(work, ports, HAPROXY_BALANCE[name[len("haproxy-"):]], tag, name)]


# ---------------------------------------------------------------- one run

def bench_argv(bins, sc, url, seed, json_path, log_path):
    rate = sc["rate"]
    argv = [bins["bench"], "--url", url, "--rate", "%g" % rate, "--duration", "%ds" % sc["duration"],
            "--warmup", str(int(rate * sc["warmup_s"])), "--max-inflight", "512", "--timeout", "60s",
            "--sim-headers", "--no-progress", "--seed", str(seed), "--json", json_path, "--requests-log", log_path]
    if sc.get("burstiness"):
        argv += ["--arrivals", "gamma", "--burstiness", "%g" % sc["burstiness"]]
    if sc["workload"] == "chat":
        argv += ["--sessions", str(max(4, int(3 * rate))), "--turns", str(CHAT["turns"]),
                 "--system-prompts", str(CHAT["system_prompts"]), "--system-len", str(CHAT["system_len"]),
                 "--input-len", CHAT["input_len"], "--output-len", str(CHAT["output_len"]),
                 "--session-header", SESSION_HEADER]
    else:
        argv += ["--input-len", sc["input_len"], "--output-len", str(sc["output_len"])]
    return argv


def cold_floor(rows, n, prefill_tps):
    """A floor under every placement's ttft p99, from the workload alone.
    A first turn over a system prompt that no request started before it
    carried (warm-up included) is cold on every replica: it prefills its
    whole prompt, at best input / prefill_tps. When more of them than the
    p99 leaves above it are measured, the p99 is at least the right one of
    their prefill times. Returns (cold requests measured, floor in ms; 0
    when there are too few to bound it)."""
    seen, cold = set(), []
    for r in sorted(rows, key=lambda r: r.get("start_ms") or 0):
        k = r.get("system_prompt")
        if k is None:
            continue
        if k not in seen and r.get("turn") == 0 and not r.get("warmup") and r.get("ok") and r.get("input_tokens"):
            cold.append(1000.0 * r["input_tokens"] / prefill_tps)
        seen.add(k)
    above = n - int(max(1, -(-n * 99 // 100))) + 1  # requests at or above the p99's rank
    cold.sort(reverse=True)
    return len(cold), (cold[above - 1] if n and len(cold) >= above else 0.0)


def summarize(sc, json_path, log_path):
    with open(json_path) as f:
        res = json.load(f)["result"]
    ttft, good, prompt, cached, n, rows = [], 0, 0, 0, 0, []
    with open(log_path) as f:
        for line in f:
            r = json.loads(line)
            rows.append(r)
            if r.get("warmup") or not r.get("ok"):
                continue
            n += 1
            if r.get("ttft_ms") is not None:
                ttft.append(r["ttft_ms"])
            tpot = r.get("tpot_ms")
            if (r.get("ttft_ms") is not None and r["ttft_ms"] <= sc["slo_ttft_ms"]
                    and (tpot is None or tpot <= sc["slo_tpot_ms"])):
                good += 1
            if r.get("input_tokens") is not None and r.get("cached_tokens") is not None:
                prompt += r["input_tokens"]
                cached += r["cached_tokens"]
    ttft.sort()
    elapsed = res["throughput"]["elapsed_s"] or 0
    w = res.get("warmup") or {}
    ncold, floor = cold_floor(rows, n, REPLICA["prefill_tps"] * max(sc["speeds"]))
    sent = sum(1 for r in rows if not r.get("warmup"))
    return {
        "cold": ncold, "ttft_p99_floor": floor, "goodput_ceiling": sent / elapsed if elapsed else None,
        "ok": n, "ttft_p50": px.nearest_rank(ttft, 50), "ttft_p99": px.nearest_rank(ttft, 99),
        "goodput": good / elapsed if elapsed else None, "slo_met": good / n if n else None,
        "out_tok_s": res["throughput"]["output_tokens_per_s"], "req_s": res["throughput"]["requests_per_s"],
        "hit_ratio": cached / prompt if prompt else None, "elapsed_s": elapsed,
        "errors": sum(res["errors"].values()) + sum((w.get("errors") or {}).values()),
        "error_kinds": {k: v for k, v in res["errors"].items() if v},
    }


def one_run(key, name, rnd, seed, bins, args, work, checks):
    sc = dict(SCENARIOS[key])
    if args.quick:
        sc.update(QUICK)
    if args.duration:
        sc["duration"] = args.duration
        sc["warmup_s"] = min(sc["warmup_s"], max(1, args.duration // 4))
    tag = "%s-r%d-%s" % (key, rnd, name)
    reps = start_replicas(bins, work, sc["speeds"], tag)
    procs = []
    try:
        procs = start_target(name, bins, work, [p for _, p in reps], tag, checks)
        front = procs[-1]
        js, log = os.path.join(work, tag + ".json"), os.path.join(work, tag + ".jsonl")
        rc = px.run_bench(bench_argv(bins, sc, front.url, seed, js, log), sc["duration"] + 120,
                          os.path.join(work, tag + "-bench.log"))
        for t in procs:
            t.check_alive()
        if rc not in (0,) or not os.path.exists(js):
            raise px.Failure("tokentap-bench exited %d against %s; see %s" % (rc, name,
                                                                             os.path.join(work, tag + "-bench.log")))
        out = summarize(sc, js, log)
        out["share"] = [px.http_get_json(port, "/sim/stats")["requests"] for _, port in reps]
        return out
    finally:
        for t in procs:
            t.stop()
            if t.proc in px._started:
                px._started.remove(t.proc)
        for p, _ in reps:
            p.stop()
            if p in px._started:
                px._started.remove(p)


# ---------------------------------------------------------------- report

METRICS = ("ttft_p50", "ttft_p99", "goodput", "out_tok_s", "hit_ratio", "errors", "ttft_p99_floor",
           "goodput_ceiling")


def aggregate(runs):
    agg = {m: px.median([r[m] for r in runs]) for m in METRICS}
    agg["errors"] = sum(r["errors"] for r in runs)
    agg["share"] = [sum(r["share"][i] for r in runs) for i in range(len(runs[0]["share"]))] if runs else []
    return agg


def fmt(x, nd=1):
    return "-" if x is None else ("%.*f" % (nd, x))


def render(report):
    lines = []
    for key, scr in report["scenarios"].items():
        sc = SCENARIOS[key]
        lines.append("\n(%s) %s; %g req/s%s, SLO ttft <= %g ms, tpot <= %g ms" % (
            key, sc["title"], sc["rate"], ", gamma %g" % sc["burstiness"] if sc.get("burstiness") else "",
            sc["slo_ttft_ms"], sc["slo_tpot_ms"]))
        lines.append("%-24s %9s %9s %9s %10s %6s %6s  %s" % ("target", "ttft p50", "ttft p99", "goodput",
                                                             "out tok/s", "hit", "errors", "share (requests)"))
        for name, t in scr["targets"].items():
            a = t["median"]
            lines.append("%-24s %9s %9s %9s %10s %6s %6d  %s" % (
                name, fmt(a["ttft_p50"]), fmt(a["ttft_p99"]), fmt(a["goodput"], 2), fmt(a["out_tok_s"], 0),
                fmt(a["hit_ratio"], 3), a["errors"], "/".join(str(x) for x in a["share"])))
        for name, t in scr["targets"].items():
            per = "; ".join("r%d p99 %s good %s hit %s" % (i + 1, fmt(r["ttft_p99"]), fmt(r["goodput"], 2),
                                                            fmt(r["hit_ratio"], 3)) for i, r in enumerate(t["rounds"]))
            lines.append("  %-22s %s" % (name, per))
        rounds = next(iter(scr["targets"].values()), {}).get("rounds", [])
        if any(r.get("cold") for r in rounds):
            lines.append("  cold first turns (a system prompt no earlier request sent) per round: %s; the ttft p99 "
                         "no placement gets under: %s ms" % ("/".join(str(r["cold"]) for r in rounds),
                                                              "/".join(fmt(r["ttft_p99_floor"]) for r in rounds)))
        for name, why in scr.get("skipped", {}).items():
            lines.append("  %-22s skipped: %s" % (name, why))
    lines.append("\nchecks:")
    for c in report["checks"]:
        lines.append("  %s" % c)
    return "\n".join(lines)


def check_targets(report):
    out = []
    S = report["scenarios"]

    def med(key, name, m):
        t = S.get(key, {}).get("targets", {}).get(name)
        return None if t is None else t["median"][m]

    def peers(key, m, best):
        xs = [t["median"][m] for n, t in S.get(key, {}).get("targets", {}).items()
              if not n.startswith("tokentap") and t["median"][m] is not None]
        return (min(xs) if best == "min" else max(xs)) if xs else None

    def say(what, ok):
        out.append("%s: %s" % (what, "n/a (not measured: a target or scenario missing)" if ok is None
                               else "met" if ok else "MISSED"))

    a, b = med("p", "tokentap-prefix", "hit_ratio"), med("p", "tokentap-weighted", "hit_ratio")
    say("(p) prefix hit ratio >= 2 x weighted's (%s vs %s)" % (fmt(a, 3), fmt(b, 3)),
        None if a is None or b is None else a >= 2 * b)
    a, b = med("p", "tokentap-prefix", "ttft_p99"), peers("p", "ttft_p99", "min")
    fl = med("p", "tokentap-prefix", "ttft_p99_floor")
    say("(p) prefix ttft p99 <= 0.5 x best peer's (%s vs %s ms; no placement below %s ms: cold first turns)"
        % (fmt(a), fmt(b), fmt(fl)), None if a is None or b is None else a <= 0.5 * b)
    a, b = med("h", "tokentap-latency", "goodput"), peers("h", "goodput", "max")
    cl = med("h", "tokentap-latency", "goodput_ceiling")
    say("(h) latency goodput >= 1.2 x best peer's (%s vs %s req/s; at most %s: every measured request in time)"
        % (fmt(a, 2), fmt(b, 2), fmt(cl, 2)), None if a is None or b is None else a >= 1.2 * b)
    a, b = med("h", "tokentap-latency", "ttft_p99"), med("h", "tokentap-weighted", "ttft_p99")
    say("(h) latency ttft p99 <= 0.7 x weighted's (%s vs %s ms)" % (fmt(a), fmt(b)),
        None if a is None or b is None else a <= 0.7 * b)
    lr = med("b", "tokentap-least_request", "ttft_p99")
    for pol in ("weighted", "latency", "prefix"):
        a = med("b", "tokentap-" + pol, "ttft_p99")
        say("(b) %s ttft p99 <= least_request's (%s vs %s ms)" % (pol, fmt(a), fmt(lr)),
            None if a is None or lr is None else a <= lr)
    a, b = med("f", FLEET, "hit_ratio"), med("f", "tokentap-prefix", "hit_ratio")
    say("(f) fleet hit ratio within 10 %% of one tokentap's (%s vs %s)" % (fmt(a, 3), fmt(b, 3)),
        None if a is None or b is None else a >= 0.9 * b)
    return out


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description="tokentap's balancing policies vs nginx and HAProxy on four batching "
                                 "simulators (docs/bench.md, \"Routing benchmark\")")
    ap.add_argument("--build", metavar="DIR", help="build directory holding tokentap, contrib/sim/tokentap-sim and "
                    "contrib/bench/tokentap-bench (default: build/, built first with contrib/build.sh)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, --quick 1)")
    ap.add_argument("--quick", action="store_true", help="8 s runs, 1 round")
    ap.add_argument("--duration", type=int, default=None, help="seconds per run, 2 to 600 (overrides the scenario's)")
    ap.add_argument("--rate", type=float, default=None, help="offered requests/s, 0.5 to 200 (overrides every "
                    "scenario's: for a machine that cannot serve the full load; (p), (b), (f) keep 3 sessions per "
                    "request/s)")
    ap.add_argument("--scenarios", default="phbf", help="which of p, h, b, f (default phbf)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, from: %s" % ", ".join(TARGETS))
    ap.add_argument("--json", metavar="PATH", help="write the whole report as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (configs, logs, bench output)")
    ap.add_argument("--no-install", action="store_true",
                    help="never run apt-get; targets of a missing nginx or haproxy are skipped")
    a = ap.parse_args(argv)
    if a.rounds is None:
        a.rounds = 1 if a.quick else 3
    if not 1 <= a.rounds <= 20:
        ap.error("--rounds takes 1 to 20")
    if a.duration is not None and not 2 <= a.duration <= 600:
        ap.error("--duration takes 2 to 600 seconds")
    if a.rate is not None and not 0.5 <= a.rate <= 200:
        ap.error("--rate takes 0.5 to 200 requests/s")
    if not a.scenarios or set(a.scenarios) - set("phbf"):
        ap.error("--scenarios takes letters from phbf, e.g. --scenarios ph")
    a.target_list = [t for t in a.targets.split(",") if t]
    bad = [t for t in a.target_list if t not in TARGETS]
    if bad or not a.target_list:
        ap.error("--targets: unknown %s; known: %s" % (", ".join(bad) or "(none given)", ", ".join(TARGETS)))
    return a


def main(argv):
    args = parse_args(argv)
    if args.rate is not None:
        for sc in SCENARIOS.values():
            sc["rate"] = args.rate
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, px.on_signal)
    t_start = time.monotonic()
    work, ok = None, False
    try:
        have = lambda b: shutil.which(b) or os.access("/usr/sbin/" + b, os.X_OK)
        wanted_peers = {t.split("-")[0] for t in args.target_list if not t.startswith("tokentap")}
        if not args.no_install and wanted_peers:
            px.ensure_packages(False)
        bins = px.find_binaries(args)
        work = tempfile.mkdtemp(prefix="tokentap-routing-")
        os.chmod(work, 0o755)
        info = px.machine_info(bins)
        print("routing: %s, %d CPUs; %s; %s; %s; work dir %s" % (info["cpu"], info["cpus"], info["tokentap"],
                                                                 info["nginx"], info["haproxy"], work),
              file=sys.stderr)
        skipped = {}
        checks = {}
        for pol in TOKENTAP_POLICIES:
            checks[pol] = tokentap_check(bins, work, pol)
            if not checks[pol][0] and "tokentap-" + pol in args.target_list:
                skipped["tokentap-" + pol] = "tokentap -t refuses balance: %s: %s" % (pol, checks[pol][2])
            elif checks[pol][2]:
                print("routing: tokentap-%s: %s" % (pol, checks[pol][2]), file=sys.stderr)
        for name in args.target_list:
            prog = name.split("-")[0]
            if prog in ("nginx", "haproxy") and not have(prog):
                skipped[name] = "%s is not installed" % prog
        for name, why in skipped.items():
            print("routing: skipping %s: %s" % (name, why), file=sys.stderr)
        report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "command": " ".join(["contrib/lab/routing.py"] + list(argv)), "machine": info,
                  "replica": REPLICA, "chat": CHAT, "scenarios": {}, "skipped": skipped}
        for key in args.scenarios:
            if key == "f":
                names = [n for n in ("tokentap-prefix", FLEET) if checks["prefix"][0]]
                why = {} if names else {FLEET: "needs balance: prefix, which tokentap -t refuses"}
            else:
                names = [n for n in args.target_list if n not in skipped
                         and not (key == "h" and n in SESSION_HASH_TARGETS)]
                why = {n: "no session in unique prompts" for n in args.target_list
                       if key == "h" and n in SESSION_HASH_TARGETS and n not in skipped}
            scr = {"targets": {n: {"rounds": []} for n in names}, "skipped": why}
            print("routing: scenario (%s) %s: %s" % (key, SCENARIOS[key]["title"], ", ".join(names) or "nothing"),
                  file=sys.stderr)
            for rnd in range(args.rounds):
                for name in names:
                    r = one_run(key, name, rnd, 1000 + rnd, bins, args, work, checks)
                    scr["targets"][name]["rounds"].append(r)
                    print("routing: (%s) round %d %-24s ttft p50 %s p99 %s ms, goodput %s/s, hit %s, errors %d"
                          % (key, rnd + 1, name, fmt(r["ttft_p50"]), fmt(r["ttft_p99"]), fmt(r["goodput"], 2),
                             fmt(r["hit_ratio"], 3), r["errors"]), file=sys.stderr)
            for name in names:
                scr["targets"][name]["median"] = aggregate(scr["targets"][name]["rounds"])
            report["scenarios"][key] = scr
        report["checks"] = check_targets(report)
        report["runtime_s"] = round(time.monotonic() - t_start, 1)
        print(render(report))
        print("\nrun: %s; %s; %d CPUs; %s (checkout %s); %s; %s; %d round(s); %.0f s"
              % (report["date"], info["cpu"], info["cpus"], info["tokentap"], info["source"], info["nginx"],
                 info["haproxy"], args.rounds, report["runtime_s"]))
        if args.json:
            px.write_report(args.json, report)
        ok = True
        return 0
    except px.Failure as e:
        print("routing: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("routing: interrupted", file=sys.stderr)
        return 130
    finally:
        px.clean_up("routing", work, ok, args.keep, "logs and configs")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
