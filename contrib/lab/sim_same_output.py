#!/usr/bin/env python3
"""sim_same_output.py — the same requests to two tokentap-sim binaries, the
raw responses compared: for a change to the simulator that must not change
a byte it sends (a refactor, a split of its files).

  contrib/lab/sim_same_output.py OLD_SIM NEW_SIM [--quick]

Both simulators run side by side in each of five configurations (fixed
timing; --prefix-cache --tool-calls --events-per-write 3; reasoning hidden
with think time and cache counts; --batching with --server-timing vllm and
llamacpp), each sent the same requests, one per connection, the response
read raw until the simulator closes: every API streamed and not (chat,
completions, Responses, Anthropic messages, Ollama chat and generate,
llama.cpp, TGI, Gemini JSON, JSON array and SSE on Google AI and Vertex AI
paths, Bedrock Converse and InvokeModel), each with 14 x-sim-* header
variants (reasoning shown or hidden, tool calls forced or forbidden, cache
counts, 0 and 1 tokens, a Bedrock exception, think time, a request id),
then embeddings, rerank, the model list, health, errors of each family,
/sim/stats and /metrics. Fixed-timing answers must be equal byte for byte;
the batching ones with the scheduler's timing values masked, and the
lengths they change (content-length, chunk sizes, bytes_sent). --quick:
the fixed-timing configuration and three variants only. Exits 0 when all
agree, 1 with the first differences. Loopback only; each simulator is
stopped before exit.
"""

import json
import re
import socket
import subprocess
import sys
import time

BATCH = ["--batching", "--step-base-ms", "1", "--step-per-seq-ms", "0", "--prefill-tps", "1000000"]
CONFIGS = {
    "fixed": ["--seed", "7", "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "5"],
    "cache": ["--seed", "3", "--ttft-ms", "1", "--itl-ms", "0", "--tokens", "4", "--prefix-cache",
              "--tool-calls", "--events-per-write", "3"],
    "reason": ["--seed", "1", "--ttft-ms", "0", "--itl-ms", "0", "--reasoning-tokens", "3",
               "--reasoning-hidden", "--think-ms", "1", "--cached-tokens", "2", "--cache-write-tokens", "1"],
    "vllm": ["--seed", "7", "--tokens", "4", "--server-timing", "vllm"] + BATCH,
    "llamacpp": ["--seed", "7", "--tokens", "4", "--server-timing", "llamacpp"] + BATCH,
}
TIMED = {"vllm", "llamacpp"}

MSG = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hello there"}]}]


def bodies():
    """(name, method, path, body or raw bytes) of every generation shape."""
    out = []
    for s in (False, True):
        t = "s" if s else "b"
        out += [
            ("chat-" + t, "/v1/chat/completions", {"model": "m1", "messages": MSG, "stream": s}),
            ("chat-usage-" + t, "/v1/chat/completions",
             {"model": "m1", "messages": MSG, "stream": s, "stream_options": {"include_usage": True},
              "max_tokens": 3}),
            ("chat-tools-" + t, "/v1/chat/completions",
             {"model": "m1", "messages": MSG, "stream": s, "tools": [{"type": "function", "function": {"name": "get_w"}}],
              "reasoning_effort": "low", "stream_options": {"include_usage": True}}),
            ("compl-" + t, "/v1/completions", {"model": "m2", "prompt": "once upon", "stream": s, "max_tokens": 4,
                                              "stream_options": {"include_usage": True}}),
            ("resp-" + t, "/v1/responses", {"model": "r", "input": "hi there", "stream": s}),
            ("resp-reason-" + t, "/v1/responses",
             {"model": "r", "input": [{"role": "user", "content": "q"}], "instructions": "x", "stream": s,
              "reasoning": {"effort": "low", "summary": "auto"}, "max_output_tokens": 6}),
            ("resp-raw-" + t, "/responses", {"model": "r", "input": "q", "stream": s, "reasoning": {}}),
            ("resp-tools-" + t, "/v1/responses",
             {"model": "r", "input": "q", "stream": s, "tools": [{"type": "function", "name": "f"}]}),
            ("msg-" + t, "/v1/messages", {"model": "c", "max_tokens": 5, "system": "sys", "messages": MSG, "stream": s}),
            ("msg-think-" + t, "/v1/messages",
             {"model": "c", "max_tokens": 50, "messages": MSG, "stream": s,
              "thinking": {"type": "enabled", "budget_tokens": 6}}),
            ("msg-tools-" + t, "/v1/messages",
             {"model": "c", "max_tokens": 50, "messages": MSG, "stream": s, "tools": [{"name": "lookup"}],
              "tool_choice": {"type": "tool", "name": "lookup"}}),
            ("ollama-chat-" + t, "/api/chat", {"model": "o", "messages": MSG, "stream": s}),
            ("ollama-chat-think-" + t, "/api/chat",
             {"model": "o", "messages": MSG, "stream": s, "think": "high", "options": {"num_predict": 3}}),
            ("ollama-chat-tools-" + t, "/api/chat",
             {"model": "o", "messages": MSG, "stream": s, "tools": [{"type": "function", "function": {"name": "t"}}]}),
            ("ollama-gen-" + t, "/api/generate", {"model": "o", "prompt": "p", "system": "s", "stream": s, "think": True}),
            ("llamacpp-" + t, "/completion", {"prompt": "abc", "n_predict": 4, "stream": s}),
            ("bedrock-conv-think-" + t, "/model/anthropic.claude%3A1/converse" + ("-stream" if s else ""),
             {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "system": [{"text": "s"}],
              "inferenceConfig": {"maxTokens": 7},
              "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 4}}}),
            ("bedrock-conv-" + t, "/model/amazon.nova/converse" + ("-stream" if s else ""),
             {"messages": [{"role": "user", "content": [{"text": "hi"}]}]}),
            ("bedrock-inv-" + t, "/model/anthropic.claude/invoke" + ("-with-response-stream" if s else ""),
             {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": MSG}),
            ("bedrock-inv-think-" + t, "/model/anthropic.claude/invoke" + ("-with-response-stream" if s else ""),
             {"max_tokens": 50, "messages": MSG, "thinking": {"type": "enabled", "budget_tokens": 3}}),
        ]
    for path, name in (("/generate", "tgi"), ("/generate_stream", "tgi-stream")):
        out.append((name, path, {"inputs": "hello", "parameters": {"max_new_tokens": 4}}))
        out.append((name + "-details", path, {"inputs": "hello", "parameters": {"details": True}}))
    for m, name in ((":generateContent", "gemini-json"), (":streamGenerateContent", "gemini-array"),
                    (":streamGenerateContent?alt=sse", "gemini-sse")):
        for prefix, pn in (("/v1beta/models/gemini-2.5-flash", ""),
                           ("/v1/projects/p1/locations/us-central1/publishers/google/models/gemini-pro", "-vertex")):
            out.append((name + pn, prefix + m,
                        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                         "systemInstruction": {"parts": [{"text": "s"}]},
                         "generationConfig": {"maxOutputTokens": 5}}))
        out.append((name + "-think", "/v1beta/models/g" + m,
                    {"contents": [{"parts": [{"text": "hi"}]}],
                     "generationConfig": {"thinkingConfig": {"thinkingBudget": 4, "includeThoughts": True}}}))
        out.append((name + "-think-hidden", "/v1beta/models/g" + m,
                    {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"thinkingConfig": {}}}))
        out.append((name + "-tools", "/v1beta/models/g" + m,
                    {"contents": [{"parts": [{"text": "hi"}]}],
                     "tools": [{"functionDeclarations": [{"name": "weather"}]}]}))
    return [(n, "POST", p, b) for n, p, b in out]


VARIANTS = [
    ("plain", []),
    ("rid", [("x-request-id", "req-42")]),
    ("r3", [("x-sim-reasoning-tokens", "3")]),
    ("r3h", [("x-sim-reasoning-tokens", "3"), ("x-sim-reasoning-hidden", "1")]),
    ("r3v", [("x-sim-reasoning-tokens", "3"), ("x-sim-reasoning-hidden", "0")]),
    ("tool", [("x-sim-tool-call", "1")]),
    ("notool", [("x-sim-tool-call", "0")]),
    ("r2tool", [("x-sim-reasoning-tokens", "2"), ("x-sim-tool-call", "1")]),
    ("cache", [("x-sim-cached-tokens", "2"), ("x-sim-cache-write-tokens", "1")]),
    ("t0", [("x-sim-tokens", "0")]),
    ("t1", [("x-sim-tokens", "1")]),
    ("t1r", [("x-sim-tokens", "1"), ("x-sim-reasoning-tokens", "1")]),
    ("exc", [("x-sim-exception", "ThrottlingException")]),
    ("think", [("x-sim-think-ms", "1")]),
]

OTHERS = [
    ("models", "GET", "/v1/models", None, []),
    ("health", "GET", "/health", None, []),
    ("models-post", "POST", "/v1/models", {}, []),
    ("nosuch", "GET", "/v2/nothing", None, []),
    ("get-chat", "GET", "/v1/chat/completions", None, []),
    ("get-msg", "GET", "/v1/messages", None, []),
    ("get-ollama", "GET", "/api/chat", None, []),
    ("get-gemini", "GET", "/v1beta/models/g:generateContent", None, []),
    ("get-bedrock", "GET", "/model/x/converse", None, []),
    ("get-embed", "GET", "/v1/embeddings", None, []),
    ("badjson-chat", "POST", "/v1/chat/completions", b"{not json", []),
    ("badjson-msg", "POST", "/v1/messages", b"{not json", []),
    ("badjson-ollama", "POST", "/api/chat", b"[1]", []),
    ("badjson-gemini", "POST", "/v1beta/models/g:generateContent", b"{", []),
    ("badlimit", "POST", "/v1/chat/completions", {"max_tokens": -1}, []),
    ("badlimit-gemini", "POST", "/v1beta/models/g:generateContent", {"generationConfig": {"maxOutputTokens": "x"}}, []),
    ("badheader", "POST", "/v1/messages", {}, [("x-sim-tokens", "abc")]),
    ("bigheader", "POST", "/api/generate", {}, [("x-sim-tokens", "99999999999999")]),
    ("gemini-badmethod", "POST", "/v1beta/models/g:countTokens", {}, []),
    ("embed", "POST", "/v1/embeddings", {"input": ["a", "bb"], "model": "e"}, []),
    ("embed-b64", "POST", "/v1/embeddings", {"input": "hello", "encoding_format": "base64", "dimensions": 4}, []),
    ("embed-ids", "POST", "/v1/embeddings", {"input": [1, 2, 3]}, [("x-request-id", "e1")]),
    ("embed-bad", "POST", "/v1/embeddings", {"input": []}, []),
    ("embed-badjson", "POST", "/v1/embeddings", b"zz", []),
    ("rerank", "POST", "/v1/rerank", {"query": "q", "documents": ["a", "b", "c"], "model": "rr"}, []),
    ("rerank2", "POST", "/rerank", {"query": "q", "texts": ["a", "b"]}, []),
]

TIMING_RE = re.compile(
    rb'("(?:time_to_first_token_ms|generation_time_ms|queue_time_ms|mean_itl_ms|prompt_ms|predicted_ms|'
    rb'total_duration|load_duration|prompt_eval_duration|eval_duration)":)[0-9.]+'
    rb'|(x-(?:total-time|queue-time|inference-time|time-per-token): )[0-9]+')


def masked(raw):
    """Masks the timing values, and the lengths they change: the
    content-length, the chunk sizes, /sim/stats' bytes_sent."""
    raw = TIMING_RE.sub(lambda mm: (mm.group(1) or mm.group(2)) + b"T", raw)
    raw = re.sub(rb"content-length: \d+", b"content-length: N", raw)
    raw = re.sub(rb"(?m)^[0-9a-f]+\r$", b"N\r", raw)
    return re.sub(rb'"bytes_sent":\d+', b'"bytes_sent":N', raw)


def request(port, method, path, body, headers):
    if body is None:
        data = b""
    elif isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body, sort_keys=True).encode()
    head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" % (method, path)
    for k, v in headers:
        head += "%s: %s\r\n" % (k, v)
    if method == "POST":
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(data)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        got = []
        while True:
            b = s.recv(65536)
            if not b:
                return b"".join(got)
            got.append(b)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(sim, args):
    port = free_port()
    p = subprocess.Popen([sim, "--listen", "127.0.0.1:%d" % port] + args, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return p, port
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.05)
    p.kill()
    p.wait()
    sys.exit("sim_same_output: %s %s did not start" % (sim, " ".join(args)))


def requests(cname, quick):
    variants = VARIANTS[:1] + [v for v in VARIANTS if v[0] in ("r3", "tool")] if quick else VARIANTS
    reqs = [(bn + "." + vn, meth, path, body, hs) for bn, meth, path, body in bodies() for vn, hs in variants]
    reqs += OTHERS
    # /sim/stats counts what was sent before it; a probe connection of
    # start() is counted alike on both sides
    reqs.append(("stats", "GET", "/sim/stats", None, []))
    if cname not in TIMED:
        reqs.append(("metrics", "GET", "/metrics", None, []))
    return reqs


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    quick = "--quick" in sys.argv[1:]
    if len(args) != 2:
        sys.exit(__doc__.strip().split("\n\n")[1])
    old_sim, new_sim = args
    total = exact = diffs = 0
    for cname, cargs in CONFIGS.items():
        if quick and cname != "fixed":
            continue
        old, oport = start(old_sim, cargs)
        new, nport = start(new_sim, cargs)
        try:
            for name, meth, path, body, hs in requests(cname, quick):
                a = request(oport, meth, path, body, hs)
                b = request(nport, meth, path, body, hs)
                if cname in TIMED:
                    a, b = masked(a), masked(b)
                else:
                    exact += 1
                total += 1
                if a != b:
                    diffs += 1
                    if diffs <= 5:
                        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
                        print("%s %s %s: differ at byte %d\n  old: %r\n  new: %r"
                              % (cname, name, path, i, a[max(0, i - 60):i + 60], b[max(0, i - 60):i + 60]))
        finally:
            for p in (old, new):
                p.terminate()
                p.wait(10)
    if diffs:
        print("sim_same_output: %d of %d responses differ" % (diffs, total))
        return 1
    print("sim_same_output: %d responses compared, %d byte for byte, %d with timing masked: the same"
          % (total, exact, total - exact))
    return 0


if __name__ == "__main__":
    sys.exit(main())
