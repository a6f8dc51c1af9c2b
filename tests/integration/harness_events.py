"""harness_events.py — what the integration tests make of a response body:
post-hoc SSE / NDJSON framing over the timestamped pieces HttpConn read
(each event stamped with the arrival of its last byte); per API, the request
bodies, the token-bearing classifier and the usage a server reported,
mirroring docs/metrics.md on the client side; reading tokentap's access log.
"""

import json
import os
import re

from harness_proc import wait_until


# --------------------------------------------------------------------------
# events: post-hoc framing of timestamped body pieces


class Event:
    __slots__ = ("name", "data", "ts", "end")

    def __init__(self, name, data, ts, end):
        self.name = name  # SSE event name or None
        self.data = data  # str: joined data lines (SSE) or the line (NDJSON)
        self.ts = ts  # ns when the byte completing the event arrived
        self.end = end  # offset in the body just past the event

    def json(self):
        return json.loads(self.data)

    def __repr__(self):
        return "Event(%r, %r)" % (self.name, self.data[:80])


def _ts_at(pieces):
    """Returns f(offset) -> arrival ns of the piece holding byte offset-1."""
    ends = []
    total = 0
    for ts, p in pieces:
        total += len(p)
        ends.append((total, ts))

    def at(off):
        lo, hi = 0, len(ends) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if ends[mid][0] >= off:
                hi = mid
            else:
                lo = mid + 1
        return ends[lo][1] if ends else None

    return at


_LINE = re.compile(rb"([^\r\n]*)(\r\n|\r|\n)")


def read_ends(resp):
    """{arrival ns: body offset just past the last byte of that read}. The
    pieces of one read share its stamp, which is the kernel's receive time of
    the newest segment it returned: only an event ending where its read ends
    is stamped with its own arrival; one followed in the same read by more
    bytes (segments that queued while this process was not running, merged
    by the kernel) arrived at or before its stamp."""
    ends = {}
    total = 0
    for ts, p in resp.pieces:
        total += len(p)
        ends[ts] = total
    return ends


def sse_events(resp):
    """SSE events in order, per the WHATWG framing (a blank line dispatches;
    an event with no data lines is not dispatched)."""
    body = resp.body
    at = _ts_at(resp.pieces)
    events = []
    name, data = None, []
    for m in _LINE.finditer(body):
        line = m.group(1)
        if line == b"":
            if data:
                events.append(Event(name, "\n".join(data), at(m.end()), m.end()))
            name, data = None, []
            continue
        if line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value.decode("utf-8"))
        elif field == b"event":
            name = value.decode("utf-8")
    return events


def ndjson_events(resp):
    body = resp.body
    at = _ts_at(resp.pieces)
    events = []
    off = 0
    for _ in range(len(body) + 1):
        i = body.find(b"\n", off)
        if i < 0:
            break
        line = body[off:i].strip()
        if line:
            events.append(Event(None, line.decode("utf-8"), at(i + 1), i + 1))
        off = i + 1
    tail = body[off:].strip()
    if tail:
        events.append(Event(None, tail.decode("utf-8"), at(len(body)), len(body)))
    return events


def events_of(resp):
    ct = (resp.content_type() or "").lower()
    if "ndjson" in ct:
        return ndjson_events(resp)
    if "event-stream" in ct:
        return sse_events(resp)
    raise ValueError("not a streamed content type: %r" % ct)


# --------------------------------------------------------------------------
# APIs: request bodies, token-bearing events, usage (mirrors docs/metrics.md)

API_PATHS = {
    "openai-chat": "/v1/chat/completions",
    "openai-completions": "/v1/completions",
    "anthropic": "/v1/messages",
    "ollama-chat": "/api/chat",
    "ollama-generate": "/api/generate",
    "openai-responses": "/v1/responses",
}

PROMPT = "Explain, in a few words, why the sky looks blue on a clear afternoon."


def api_body(api, stream=True, include_usage=False, prompt=PROMPT, model="sim-model"):
    if api == "openai-chat":
        b = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": stream}
        if stream and include_usage:
            b["stream_options"] = {"include_usage": True}
    elif api == "openai-completions":
        b = {"model": model, "prompt": prompt, "stream": stream}
        if stream and include_usage:
            b["stream_options"] = {"include_usage": True}
    elif api == "anthropic":
        b = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": prompt}], "stream": stream}
    elif api == "ollama-chat":
        b = {"model": model, "messages": [{"role": "user", "content": prompt}]}
        if not stream:
            b["stream"] = False  # Ollama streams by default
    elif api == "ollama-generate":
        b = {"model": model, "prompt": prompt}
        if not stream:
            b["stream"] = False
    elif api == "openai-responses":
        b = {"model": model, "input": [{"role": "user", "content": prompt}], "stream": stream}
    else:
        raise ValueError(api)
    return b


def sim_headers(ttft=None, itl=None, tokens=None, request_id=None, extra=None):
    h = []
    if ttft is not None:
        h.append(("x-sim-ttft-ms", str(ttft)))
    if itl is not None:
        h.append(("x-sim-itl-ms", str(itl)))
    if tokens is not None:
        h.append(("x-sim-tokens", str(tokens)))
    if request_id is not None:
        h.append(("x-request-id", request_id))
    h.extend(extra or [])
    return h


def _nonempty(v):
    return bool(v)


def is_token_event(api, ev):
    """Client-side mirror of the token-bearing definition in design.md."""
    if api in ("openai-chat", "openai-completions"):
        if ev.data.strip() == "[DONE]":
            return False
        try:
            obj = ev.json()
        except ValueError:
            return False
        for ch in obj.get("choices") or []:
            if api == "openai-completions" and _nonempty(ch.get("text")):
                return True
            d = ch.get("delta") or {}
            if (_nonempty(d.get("content")) or _nonempty(d.get("reasoning_content"))
                    or _nonempty(d.get("reasoning")) or _nonempty(d.get("tool_calls"))):
                return True
            if api == "openai-chat" and _nonempty(ch.get("text")):
                return True
        return False
    if api == "anthropic":
        try:
            obj = ev.json()
        except ValueError:
            return False
        kind = ev.name if ev.name not in (None, "message") else obj.get("type")
        d = obj.get("delta") or {}
        return kind == "content_block_delta" and any(_nonempty(d.get(k)) for k in ("text", "thinking", "partial_json"))
    if api in ("ollama-chat", "ollama-generate"):
        obj = ev.json()
        if api == "ollama-generate":
            return _nonempty(obj.get("response")) or _nonempty(obj.get("thinking"))
        m = obj.get("message") or {}
        return _nonempty(m.get("content")) or _nonempty(m.get("thinking"))
    if api == "openai-responses":
        # docs/metrics.md: the model-output deltas, with a non-empty "delta"
        try:
            obj = ev.json()
        except ValueError:
            return False
        kind = ev.name if ev.name not in (None, "message") else obj.get("type")
        return kind in RESPONSES_TOKEN_EVENTS and isinstance(obj.get("delta"), str) and _nonempty(obj["delta"])
    raise ValueError(api)


RESPONSES_TOKEN_EVENTS = frozenset("response.%s.delta" % k for k in (
    "output_text", "refusal", "audio.transcript", "audio", "reasoning_text", "reasoning_summary_text",
    "function_call_arguments", "custom_tool_call_input", "mcp_call_arguments", "code_interpreter_call_code",
    "shell_call_command"))


def stream_usage(api, events):
    """(input_tokens, output_tokens) as the server reported them in the stream;
    None where absent."""
    inp = out = None
    for ev in events:
        if api in ("openai-chat", "openai-completions"):
            if ev.data.strip() == "[DONE]":
                continue
            u = ev.json().get("usage")
            if u:
                inp = u.get("prompt_tokens", inp)
                out = u.get("completion_tokens", out)
        elif api == "openai-responses":
            obj = ev.json()
            if obj.get("type") in ("response.completed", "response.incomplete", "response.failed"):
                u = (obj.get("response") or {}).get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
        elif api == "anthropic":
            obj = ev.json()
            if obj.get("type") == "message_start":
                u = (obj.get("message") or {}).get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
            elif obj.get("type") == "message_delta":
                u = obj.get("usage") or {}
                inp = u.get("input_tokens", inp)
                out = u.get("output_tokens", out)
        else:
            obj = ev.json()
            if obj.get("done"):
                inp = obj.get("prompt_eval_count", inp)
                out = obj.get("eval_count", out)
    return inp, out


def body_usage(api, obj):
    if api in ("openai-chat", "openai-completions"):
        u = obj.get("usage") or {}
        return u.get("prompt_tokens"), u.get("completion_tokens")
    if api in ("anthropic", "openai-responses"):
        u = obj.get("usage") or {}
        return u.get("input_tokens"), u.get("output_tokens")
    return obj.get("prompt_eval_count"), obj.get("eval_count")


# --------------------------------------------------------------------------
# access log


def read_access_log(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    out = []
    for line in data.split(b"\n"):
        line = line.strip()
        if line:
            out.append(json.loads(line))
    return out


def wait_log_entry(path, pred, timeout=5.0):
    """Polls the access log until an entry satisfies pred; returns it or None."""
    found = []

    def check():
        try:
            for e in read_access_log(path):
                if pred(e):
                    found.append(e)
                    return True
        except ValueError:
            return False  # a line being written right now
        return False

    wait_until(check, timeout, 0.02)
    return found[0] if found else None
