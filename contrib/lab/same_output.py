#!/usr/bin/env python3
"""same_output.py — the same traffic through two tokentap builds, their
access-log lines and /metrics compared: for a change that must not change
what tokentap writes (a refactor, a re-cut of the tree, a faster path).

  contrib/lab/same_output.py OLD_BUILD_DIR NEW_BUILD_DIR

Each build runs with its own simulator (the same seed, ports and settings
for both) and is sent the same requests, one at a time: chat streamed and
not, completions, Anthropic messages, the Responses API, Ollama chat and a
path the simulator answers 404, three times each. Values that are times
(fields ending in _ms, the timeline, ts, ids, float values) are masked;
everything else must be equal and in the same order: the keys of every log
line, counts, tokens, bytes, statuses, labels, and every /metrics line with
its value unless it is a time. Exits 0 when both agree, 1 with the first
differences otherwise. Loopback only; each process is stopped before exit.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REQUESTS = [
    ("/v1/chat/completions", {"model": "m1", "stream": True, "messages": [{"role": "user", "content": "hi"}],
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": "m2", "stream": False, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "m1", "stream": True, "prompt": "x"}),
    ("/v1/messages", {"model": "claude", "stream": True, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "m3", "stream": True, "input": "hi"}),
    ("/api/chat", {"model": "llama", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/nothing", {"model": "m1"}),
]
ROUNDS = 3
TIME_KEYS = ("ts", "id", "trace_id", "span_id")
TIME_METRIC = ("seconds", "_ms", "uptime", "start_time", "bytes", "rss", "fds", "cpu")
NUMBER = re.compile(r'(?<![\w"])-?\d+(\.\d+)?(e[-+]?\d+)?')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def run(build, ports):
    sp, tp, ap = ports
    d = tempfile.mkdtemp(prefix="tokentap-same-")
    sim = subprocess.Popen([os.path.join(build, "contrib", "sim", "tokentap-sim"), "--listen", "127.0.0.1:%d" % sp,
                            "--ttft-ms", "5", "--itl-ms", "1", "--tokens", "8", "--seed", "7"],
                           stderr=subprocess.DEVNULL)
    tt = subprocess.Popen([os.path.join(build, "tokentap"), "--upstream", "http://127.0.0.1:%d" % sp,
                           "--listen", "127.0.0.1:%d" % tp, "--admin", "127.0.0.1:%d" % ap,
                           "--access-log", os.path.join(d, "access.log"), "--data-dir", os.path.join(d, "data"),
                           "--flush-interval", "200ms"], stderr=subprocess.DEVNULL)
    try:
        if not (wait_port(sp) and wait_port(tp) and wait_port(ap)):
            raise SystemExit("same_output: %s did not start" % build)
        for path, body in REQUESTS * ROUNDS:
            req = urllib.request.Request("http://127.0.0.1:%d%s" % (tp, path), data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=10).read()
            except urllib.error.HTTPError as e:
                e.read()
        time.sleep(0.8)  # four flushes: every request in the store's totals
        metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % ap, timeout=10).read().decode()
    finally:
        for p in (tt, sim):
            p.terminate()
            p.wait(10)
    with open(os.path.join(d, "access.log")) as f:
        log = f.read().splitlines()
    return log, metrics


def mask_value(k, v):
    if isinstance(v, float) or k in TIME_KEYS or (isinstance(v, int) and not isinstance(v, bool) and "ms" in k):
        return "T"
    if isinstance(v, list):
        return ["T" if isinstance(x, float) else x for x in v]
    if isinstance(v, dict):
        return {kk: mask_value(kk, vv) for kk, vv in v.items()} if k != "timeline_ms" else \
            {kk: None if vv is None else "T" for kk, vv in v.items()}
    return v


def mask_line(line):
    return [(k, mask_value(k, v)) for k, v in json.loads(line).items()]


def mask_metrics(text):
    out = []
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if not line.startswith("#") and any(t in name for t in TIME_METRIC) and not name.endswith("_count"):
            line = NUMBER.sub("N", line.rsplit(" ", 1)[0]) + " N"
        out.append(line)
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    ports = (free_port(), free_port(), free_port())
    a_log, a_metrics = run(argv[1], ports)
    b_log, b_metrics = run(argv[2], ports)
    problems = []
    if len(a_log) != len(b_log):
        problems.append("access log: %d lines against %d" % (len(a_log), len(b_log)))
    for i, (x, y) in enumerate(zip(a_log, b_log)):
        if mask_line(x) != mask_line(y):
            problems.append("access log line %d:\n  %s\n  %s" % (i + 1, mask_line(x), mask_line(y)))
    ma, mb = mask_metrics(a_metrics), mask_metrics(b_metrics)
    if len(ma) != len(mb):
        problems.append("/metrics: %d lines against %d" % (len(ma), len(mb)))
    problems += ["/metrics:\n  %s\n  %s" % (x, y) for x, y in zip(ma, mb) if x != y]
    print("same_output: %d access-log lines, %d /metrics lines compared, times masked: %s"
          % (len(a_log), len(ma), "the same" if not problems else "%d differences" % len(problems)))
    for p in problems[:3]:
        print(p if len(p) < 1500 else p[:1500] + " ...")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
