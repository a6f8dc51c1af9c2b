"""test_sim_modes.py — the simulator's reasoning mode, prompt-cache usage and
tool-call streams (docs/simulator.md, "Reasoning, caching, tool calls"),
checked straight against tokentap-sim over loopback, no proxy between:

- per API (OpenAI chat, Responses raw and summary, Anthropic, Ollama chat and
  generate) the exact order and shape of the events, the counts (reasoning
  and answer token events), the ids tying items together, and the usage
  fields each API reports (reasoning tokens, cached tokens, Anthropic's
  input_tokens without the cached ones);
- the request fields that turn reasoning on or off (reasoning_effort,
  reasoning, thinking, think) and how they rank against the flag and the
  header;
- the thinking pause in the arrival times (loose bounds: a shared 2-core
  machine);
- tool calls: arguments whose pieces join into one JSON object, the finish
  and stop reasons, tool_choice "none";
- in the batching model, cached prompt tokens need no prefill: ttft shrinks;
- non-streamed bodies carry the reasoning, the call and the usage.
"""

import json
import subprocess

import harness

PROMPT = "Explain, in a few words, why the sky looks blue on a clear afternoon."  # 70 bytes: 18 tokens
P = 18
TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
TOOLS_FLAT = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]  # Responses
TOOLS_ANTHROPIC = [{"name": "get_weather", "input_schema": {"type": "object"}}]


def hdr(reasoning=None, think=None, tokens=None, cached=None, writes=None, tool=None, ttft=0, itl=0):
    h = harness.sim_headers(ttft=ttft, itl=itl, tokens=tokens)
    for name, v in (("x-sim-reasoning-tokens", reasoning), ("x-sim-think-ms", think), ("x-sim-cached-tokens", cached),
                    ("x-sim-cache-write-tokens", writes), ("x-sim-tool-call", tool)):
        if v is not None:
            h.append((name, str(v)))
    return h


class SimModesTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "3")

    def stream(self, api, headers, port=None, **extra):
        body = harness.api_body(api, stream=True, include_usage=api == "openai-chat")
        body.update(extra)
        resp, _ = harness.exchange(port or self.sim.port, "POST", harness.API_PATHS[api], body, headers)
        self.assertEqual(resp.status, 200, resp.body[:300])
        return harness.events_of(resp)

    def block(self, api, headers, **extra):
        body = harness.api_body(api, stream=False)
        body.update(extra)
        resp, _ = harness.exchange(self.sim.port, "POST", harness.API_PATHS[api], body, headers)
        self.assertEqual(resp.status, 200, resp.body[:300])
        return resp.json()

    # ---- OpenAI chat ----

    def test_chat_reasoning_stream(self):
        evs = [e.json() if e.data != "[DONE]" else "[DONE]" for e in self.stream("openai-chat", hdr(4, tokens=3))]
        self.assertEqual(evs[-1], "[DONE]")
        deltas = [e["choices"][0]["delta"] for e in evs[:-2]]
        self.assertEqual(deltas[0], {"role": "assistant", "content": ""})
        self.assertEqual([list(d) for d in deltas[1:5]], [["reasoning_content"]] * 4)
        self.assertEqual([list(d) for d in deltas[5:8]], [["content"]] * 3)
        self.assertEqual(deltas[8], {})
        self.assertEqual(evs[8]["choices"][0]["finish_reason"], "stop")
        self.assertFalse(deltas[1]["reasoning_content"].startswith(" "), "first reasoning word: no space")
        self.assertFalse(deltas[5]["content"].startswith(" "), "first answer word: no space")
        usage = evs[-2]["usage"]
        self.assertEqual(usage, {"prompt_tokens": P, "completion_tokens": 7, "total_tokens": P + 7,
                                 "completion_tokens_details": {"reasoning_tokens": 4}})

    def test_chat_reasoning_effort_and_cache(self):
        for effort, n in (("low", 16), ("medium", 32), ("high", 64), ("none", 0)):
            with self.subTest(effort=effort):
                evs = [e.json() for e in self.stream("openai-chat", hdr(tokens=2, cached=10), reasoning_effort=effort)
                       if e.data != "[DONE]"]
                kinds = [list(e["choices"][0]["delta"]) for e in evs if e["choices"]]
                self.assertEqual(kinds.count(["reasoning_content"]), n)
                usage = evs[-1]["usage"]
                self.assertEqual(usage["prompt_tokens_details"], {"cached_tokens": 10})
                self.assertEqual(usage["completion_tokens"], n + 2)
                self.assertEqual(usage.get("completion_tokens_details"),
                                 {"reasoning_tokens": n} if n else None)
        # cached tokens never exceed the prompt
        evs = [e.json() for e in self.stream("openai-chat", hdr(tokens=1, cached=1000)) if e.data != "[DONE]"]
        self.assertEqual(evs[-1]["usage"]["prompt_tokens_details"], {"cached_tokens": P})

    def test_chat_tool_call(self):
        evs = [e.json() for e in self.stream("openai-chat", hdr(tokens=4), tools=TOOLS_CHAT) if e.data != "[DONE]"]
        calls = [e["choices"][0]["delta"]["tool_calls"] for e in evs if e["choices"] and
                 "tool_calls" in e["choices"][0]["delta"]]
        self.assertEqual(len(calls), 4)
        first = calls[0][0]
        self.assertEqual((first["index"], first["type"], first["function"]["name"]), (0, "function", "get_weather"))
        self.assertTrue(first["id"].startswith("call_"))
        self.assertEqual([list(c[0]) for c in calls[1:]], [["index", "function"]] * 3)
        args = json.loads("".join(c[0]["function"]["arguments"] for c in calls))
        self.assertEqual(list(args), ["input"])
        self.assertTrue(args["input"], args)
        self.assertEqual(evs[-2]["choices"][0]["finish_reason"], "tool_calls")
        # tool_choice "none": text; x-sim-tool-call: 1 without tools: a call to sim_tool
        evs = [e.json() for e in self.stream("openai-chat", hdr(tokens=2), tools=TOOLS_CHAT, tool_choice="none")
               if e.data != "[DONE]"]
        self.assertNotIn("tool_calls", json.dumps(evs))
        evs = [e.json() for e in self.stream("openai-chat", hdr(tokens=2, tool=1)) if e.data != "[DONE]"]
        self.assertEqual(evs[1]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "sim_tool")

    def test_chat_block(self):
        obj = self.block("openai-chat", hdr(3, tokens=2, cached=4), tools=TOOLS_CHAT)
        msg = obj["choices"][0]["message"]
        self.assertIsNone(msg["content"])
        self.assertTrue(msg["reasoning_content"])
        self.assertEqual(msg["tool_calls"][0]["function"]["name"], "get_weather")
        json.loads(msg["tool_calls"][0]["function"]["arguments"])
        self.assertEqual(obj["choices"][0]["finish_reason"], "tool_calls")
        self.assertEqual(obj["usage"]["completion_tokens_details"], {"reasoning_tokens": 3})
        self.assertEqual(obj["usage"]["prompt_tokens_details"], {"cached_tokens": 4})

    # ---- Responses ----

    def test_responses_reasoning_stream(self):
        evs = self.stream("openai-responses", hdr(3, tokens=2, cached=5))
        self.assertEqual([e.name for e in evs], [e.json()["type"] for e in evs])
        evs = [e.json() for e in evs]
        self.assertEqual([e["type"] for e in evs], [
            "response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added"] + ["response.reasoning_text.delta"] * 3 + [
            "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
            "response.output_item.added", "response.content_part.added"] + ["response.output_text.delta"] * 2 + [
            "response.output_text.done", "response.content_part.done", "response.output_item.done",
            "response.completed"])
        self.assertEqual([e["sequence_number"] for e in evs], list(range(len(evs))))
        rs, msg = evs[2]["item"], evs[10]["item"]
        self.assertEqual((rs["type"], evs[2]["output_index"]), ("reasoning", 0))
        self.assertEqual((msg["type"], evs[10]["output_index"]), ("message", 1))
        self.assertTrue(rs["id"].startswith("rs_") and msg["id"].startswith("msg_"))
        self.assertEqual(evs[3]["part"], {"type": "reasoning_text", "text": ""})
        for e in evs[4:7]:
            self.assertEqual((e["item_id"], e["output_index"], e["content_index"]), (rs["id"], 0, 0))
        for e in evs[12:14]:
            self.assertEqual((e["item_id"], e["output_index"]), (msg["id"], 1))
        reasoning = "".join(e["delta"] for e in evs[4:7])
        self.assertEqual(evs[7]["text"], reasoning)
        self.assertEqual(evs[9]["item"]["content"], [{"type": "reasoning_text", "text": reasoning}])
        done = evs[-1]["response"]
        self.assertEqual([o["type"] for o in done["output"]], ["reasoning", "message"])
        self.assertEqual(done["usage"], {"input_tokens": P, "input_tokens_details": {"cached_tokens": 5},
                                         "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 3},
                                         "total_tokens": P + 5})

    def test_responses_summary_and_effort(self):
        evs = [e.json() for e in self.stream("openai-responses", hdr(tokens=1),
                                               reasoning={"effort": "low", "summary": "auto"})]
        types = [e["type"] for e in evs]
        self.assertEqual(types.count("response.reasoning_summary_text.delta"), 16)
        self.assertNotIn("response.reasoning_text.delta", types)
        i = types.index("response.reasoning_summary_part.added")
        self.assertEqual(evs[i]["part"], {"type": "summary_text", "text": ""})
        self.assertEqual(evs[i]["summary_index"], 0)
        self.assertLess(types.index("response.reasoning_summary_part.done"), types.index("response.output_text.delta"))
        item = evs[types.index("response.output_item.done")]["item"]
        self.assertEqual(item["summary"][0]["type"], "summary_text")
        self.assertEqual(evs[-1]["response"]["usage"]["output_tokens_details"], {"reasoning_tokens": 16})
        # no reasoning field: none
        types = [e.json()["type"] for e in self.stream("openai-responses", hdr(tokens=1))]
        self.assertNotIn("response.reasoning_text.delta", types)

    def test_responses_tool_call(self):
        evs = [e.json() for e in self.stream("openai-responses", hdr(tokens=3), tools=TOOLS_FLAT)]
        self.assertEqual([e["type"] for e in evs], [
            "response.created", "response.in_progress", "response.output_item.added"] +
            ["response.function_call_arguments.delta"] * 3 +
            ["response.function_call_arguments.done", "response.output_item.done", "response.completed"])
        item = evs[2]["item"]
        self.assertEqual((item["type"], item["name"], item["arguments"], item["status"]),
                         ("function_call", "get_weather", "", "in_progress"))
        self.assertTrue(item["id"].startswith("fc_") and item["call_id"].startswith("call_"))
        args = "".join(e["delta"] for e in evs[3:6])
        json.loads(args)
        self.assertEqual(evs[6]["arguments"], args)
        self.assertEqual(evs[7]["item"]["arguments"], args)
        self.assertEqual(evs[-1]["response"]["output"][0]["arguments"], args)

    # ---- Anthropic ----

    def test_anthropic_thinking_cache_stream(self):
        evs = self.stream("anthropic", hdr(tokens=2, cached=10, writes=5), thinking={"type": "enabled",
                                                                                    "budget_tokens": 4})
        self.assertEqual([e.name for e in evs], [e.json()["type"] for e in evs])
        evs = [e.json() for e in evs]
        kinds = [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
                 for e in evs]
        self.assertEqual(kinds, [
            ("message_start", None, None), ("content_block_start", 0, "thinking"), ("ping", None, None)] +
            [("content_block_delta", 0, "thinking_delta")] * 4 + [
            ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
            ("content_block_start", 1, "text")] + [("content_block_delta", 1, "text_delta")] * 2 + [
            ("content_block_stop", 1, None), ("message_delta", None, None), ("message_stop", None, None)])
        self.assertTrue(evs[7]["delta"]["signature"])
        self.assertEqual(evs[0]["message"]["usage"], {"input_tokens": P - 15, "cache_creation_input_tokens": 5,
                                                      "cache_read_input_tokens": 10, "output_tokens": 1})
        self.assertEqual(evs[-2]["usage"], {"input_tokens": P - 15, "cache_creation_input_tokens": 5,
                                            "cache_read_input_tokens": 10, "output_tokens": 6,
                                            "output_tokens_details": {"thinking_tokens": 4}})
        self.assertEqual(evs[-2]["delta"]["stop_reason"], "end_turn")
        # disabled thinking, and none asked: no thinking block
        for extra in ({"thinking": {"type": "disabled"}}, {}):
            evs = [e.json() for e in self.stream("anthropic", hdr(tokens=1), **extra)]
            self.assertNotIn("thinking", json.dumps(evs))
            self.assertEqual(evs[-2]["usage"], {"output_tokens": 1}, "no cache: usage as before")

    def test_anthropic_tool_use(self):
        evs = [e.json() for e in self.stream("anthropic", hdr(tokens=3), tools=TOOLS_ANTHROPIC)]
        start = evs[1]["content_block"]
        self.assertEqual((start["type"], start["name"], start["input"]), ("tool_use", "get_weather", {}))
        self.assertTrue(start["id"].startswith("toolu_"))
        parts = [e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta"]
        self.assertEqual(len(parts), 3)
        json.loads("".join(parts))
        self.assertEqual(evs[-2]["delta"]["stop_reason"], "tool_use")
        obj = self.block("anthropic", hdr(2, tokens=2), tools=TOOLS_ANTHROPIC)
        self.assertEqual([c["type"] for c in obj["content"]], ["thinking", "tool_use"])
        self.assertIsInstance(obj["content"][1]["input"], dict)
        self.assertTrue(obj["content"][0]["signature"])

    # ---- Ollama ----

    def test_ollama_thinking(self):
        for api, key in (("ollama-chat", "message"), ("ollama-generate", None)):
            with self.subTest(api=api):
                evs = [e.json() for e in self.stream(api, hdr(tokens=2), think=True)]
                body = [e[key] if key else e for e in evs[:-1]]
                self.assertEqual([bool(b.get("thinking")) for b in body], [True] * 32 + [False] * 2)
                text = "content" if key else "response"
                self.assertEqual([b[text] for b in body[:32]], [""] * 32)
                self.assertTrue(evs[-1]["done"])
                self.assertEqual(evs[-1]["eval_count"], 34)
                evs = [e.json() for e in self.stream(api, hdr(tokens=2), think=False)]
                self.assertNotIn("thinking", json.dumps(evs))

    def test_ollama_tool_call(self):
        evs = [e.json() for e in self.stream("ollama-chat", hdr(tokens=3), tools=TOOLS_CHAT)]
        self.assertEqual(len(evs), 2, "one line with the whole call, then the final line")
        call = evs[0]["message"]["tool_calls"][0]
        self.assertEqual(call["function"]["name"], "get_weather")
        self.assertIsInstance(call["function"]["arguments"], dict)
        self.assertEqual((evs[1]["done"], evs[1]["done_reason"], evs[1]["eval_count"]), (True, "stop", 3))

    def test_hidden_reasoning(self):
        """x-sim-reasoning-hidden: 1 — the reasoning tokens take their time
        and count in usage, but no event carries them (OpenAI's hosted
        models); the answer is the first token event."""
        h = hdr(5, tokens=2, ttft=10, itl=30) + [("x-sim-reasoning-hidden", "1")]
        t0 = harness.now_ns()
        evs = self.stream("openai-chat", h)
        chunks = [e.json() for e in evs if e.data != "[DONE]"]
        self.assertNotIn("reasoning_content", json.dumps(chunks))
        first = [e for e, c in zip(evs, chunks) if c["choices"] and c["choices"][0]["delta"].get("content")][0]
        self.assertGreaterEqual((first.ts - t0) / 1e6, 10 + 5 * 30 - 5.0, "five silent reasoning beats first")
        self.assertEqual(chunks[-1]["usage"]["completion_tokens_details"], {"reasoning_tokens": 5})
        evs = [e.json() for e in self.stream("openai-responses", h)]
        types = [e["type"] for e in evs]
        self.assertNotIn("response.reasoning_text.delta", types)
        self.assertEqual(evs[2]["output_index"], 0, "the message is the first item")
        self.assertEqual([o["type"] for o in evs[-1]["response"]["output"]], ["message"])
        self.assertEqual(evs[-1]["response"]["usage"]["output_tokens_details"], {"reasoning_tokens": 5})
        evs = [e.json() for e in self.stream("anthropic", h)]
        self.assertNotIn("thinking_delta", json.dumps(evs))
        self.assertEqual(evs[1]["index"], 0)
        self.assertEqual(evs[-2]["usage"]["output_tokens"], 7)
        obj = self.block("openai-chat", h)
        self.assertNotIn("reasoning_content", obj["choices"][0]["message"])
        self.assertEqual(obj["usage"]["completion_tokens_details"], {"reasoning_tokens": 5})

    # ---- flags, headers, timing ----

    def test_completions_have_no_reasoning(self):
        evs = self.stream("openai-completions", hdr(5, tokens=2))
        self.assertEqual(len(evs), 4, "2 tokens, finish, [DONE]")

    def test_bad_headers(self):
        for name, value in (("x-sim-reasoning-tokens", "x"), ("x-sim-think-ms", "-1"), ("x-sim-tool-call", "2"),
                            ("x-sim-reasoning-hidden", "2"),
                            ("x-sim-cached-tokens", "1.5"), ("x-sim-think-ms", "86400001")):
            with self.subTest(header=name, value=value):
                resp, _ = harness.exchange(self.sim.port, "POST", "/v1/chat/completions",
                                           harness.api_body("openai-chat"), [(name, value)])
                self.assertJsonError(resp, 400)

    def test_think_pause_in_timing(self):
        """Reasoning tokens at the itl beat, then itl + think before the
        first answer token; a hidden think (no reasoning tokens) delays the
        first token itself. Loose bounds: timers on a shared machine."""
        evs = self.stream("anthropic", hdr(3, think=300, tokens=2, ttft=20, itl=20))
        ts = {}
        for e in evs:
            d = e.json().get("delta", {})
            ts.setdefault(d.get("type"), []).append(e.ts)
        gap_ms = (ts["text_delta"][0] - ts["thinking_delta"][-1]) / 1e6
        # due itl + think after the last reasoning token was due; that one
        # may leave up to one itl late (the beat is drift-free), so >= think
        self.assertGreaterEqual(gap_ms, 295.0)
        self.assertLess(gap_ms, 700.0)
        self.assertLess((ts["thinking_delta"][-1] - ts["thinking_delta"][0]) / 1e6, 250.0)
        self.assertLess((ts["text_delta"][1] - ts["text_delta"][0]) / 1e6, 250.0)
        t0 = harness.now_ns()
        evs = self.stream("openai-chat", hdr(0, think=300, tokens=1, ttft=10, itl=10))
        self.assertGreaterEqual((evs[0].ts - t0) / 1e6, 305.0, "hidden thinking delays the first token")


class SimModeFlagsTest(harness.TestCase):
    """The flags: reasoning for every request, a request turning it off,
    cached tokens reported, tool calls forced."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--reasoning-tokens", "5", "--cached-tokens", "7", "--tool-calls")

    def test_flags(self):
        resp, _ = harness.exchange(self.sim.port, "POST", "/v1/chat/completions",
                                   harness.api_body("openai-chat", include_usage=True), hdr(tokens=2))
        evs = [e.json() for e in harness.events_of(resp) if e.data != "[DONE]"]
        deltas = [e["choices"][0]["delta"] for e in evs if e["choices"]]
        self.assertEqual(sum("reasoning_content" in d for d in deltas), 5)
        self.assertEqual(deltas[6]["tool_calls"][0]["function"]["name"], "sim_tool")
        self.assertEqual(evs[-1]["usage"]["prompt_tokens_details"], {"cached_tokens": 7})
        body = harness.api_body("anthropic")
        body["thinking"] = {"type": "disabled"}
        resp, _ = harness.exchange(self.sim.port, "POST", "/v1/messages", body, hdr(tokens=1, tool=0))
        evs = [e.json() for e in harness.events_of(resp)]
        self.assertNotIn("thinking", json.dumps(evs), "the request's off beats the flag")
        self.assertNotIn("tool_use", json.dumps(evs), "x-sim-tool-call: 0 beats the flag")
        self.assertEqual(evs[0]["message"]["usage"]["cache_read_input_tokens"], 7)


class SimPrefixCacheTest(harness.TestCase):
    """--prefix-cache: prompts remembered in 16-token (64-byte) blocks; the
    leading blocks a prompt shares with earlier ones are cached; a header
    still wins."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--prefix-cache")

    def usage(self, api, prompt, headers=()):
        body = harness.api_body(api, stream=False, prompt=prompt)
        resp, _ = harness.exchange(self.sim.port, "POST", harness.API_PATHS[api], body,
                                   [("x-sim-tokens", "1")] + list(headers))
        self.assertEqual(resp.status, 200)
        return resp.json()["usage"]

    def test_shared_prefixes(self):
        a = "".join("%04d abcdefghijklmnopqrstuvwxyz " % i for i in range(64))[:2000]  # 500 tokens
        self.assertEqual(self.usage("openai-chat", a)["prompt_tokens_details"], {"cached_tokens": 0}, "cold")
        u = self.usage("openai-chat", a)
        self.assertEqual((u["prompt_tokens"], u["prompt_tokens_details"]), (500, {"cached_tokens": 496}),
                         "31 whole blocks of 16 tokens")
        u = self.usage("openai-chat", a[:1000] + "x" * 1000)
        self.assertEqual(u["prompt_tokens_details"], {"cached_tokens": 240}, "15 whole blocks shared")
        u = self.usage("anthropic", a)
        self.assertEqual((u["input_tokens"], u["cache_read_input_tokens"], u["cache_creation_input_tokens"]),
                         (4, 496, 0), "the same prompt text through another API")
        u = self.usage("anthropic", "y" * 400)
        self.assertEqual((u["input_tokens"], u["cache_read_input_tokens"], u["cache_creation_input_tokens"]),
                         (4, 0, 96), "six new blocks written")
        u = self.usage("openai-chat", a, [("x-sim-cached-tokens", "7")])
        self.assertEqual(u["prompt_tokens_details"], {"cached_tokens": 7}, "the header wins")
        st = harness.sim_stats(self.sim.port)["prefix_cache"]
        self.assertEqual((st["lookups"], st["cached_tokens"]), (5, 0 + 496 + 240 + 496 + 0))


class SimCachePrefillTest(harness.TestCase):
    """--batching: cached prompt tokens are not prefilled, so ttft shrinks
    by their prefill time (1,000 tokens/s here: 400 cached = 400 ms)."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--batching", "--prefill-tps", "1000")

    def test_cached_prefix_shortens_ttft(self):
        body = harness.api_body("openai-chat", prompt="x" * 2000)  # 500 prompt tokens
        ttft = {}
        for cached in (0, 400):
            t0 = harness.now_ns()
            resp, _ = harness.exchange(self.sim.port, "POST", "/v1/chat/completions", body,
                                       [("x-sim-tokens", "2"), ("x-sim-cached-tokens", str(cached))])
            ttft[cached] = (harness.events_of(resp)[0].ts - t0) / 1e6
        self.assertGreaterEqual(ttft[0], 490.0)
        self.assertLess(ttft[400], ttft[0] - 300.0, ttft)


class SimBoundedCacheTest(harness.TestCase):
    """--batching --prefix-cache --prefix-cache-tokens: a prompt the cache
    remembers is prefilled only past its cached blocks, so it answers
    sooner the second time; once other prompts have filled the cache's
    1,024 tokens (64 blocks) it has been evicted, least recently used
    first, and is slow again. Prefill 2,000 tokens/s: a 500-token prompt
    takes 250 ms, 4 uncached tokens 2 ms."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--batching", "--prefill-tps", "2000", "--prefix-cache",
                                    "--prefix-cache-tokens", "1024")

    def send(self, prompt):
        body = harness.api_body("openai-chat", include_usage=True, prompt=prompt)
        t0 = harness.now_ns()
        resp, _ = harness.exchange(self.sim.port, "POST", "/v1/chat/completions", body, [("x-sim-tokens", "2")])
        self.assertEqual(resp.status, 200)
        evs = harness.events_of(resp)
        usage = [e.json()["usage"] for e in evs if e.data != "[DONE]" and e.json().get("usage")]
        return (evs[0].ts - t0) / 1e6, usage[-1]["prompt_tokens_details"]["cached_tokens"]

    def test_hit_then_evicted(self):
        def prompt(tag):  # 500 tokens (31 whole blocks), no block shared with another tag
            return "".join("%s %04d lorem ipsum dolor sit amet " % (tag, i) for i in range(80))[:2000]

        a = prompt("alpha")
        cold, c0 = self.send(a)
        warm, c1 = self.send(a)
        self.assertEqual((c0, c1), (0, 496))
        self.assertGreaterEqual(cold, 245.0)
        self.assertLess(warm, cold / 3, (cold, warm))
        # Two more prompts: 93 blocks for 64 places; a's tail (used least
        # recently: a prompt's blocks are touched last to first) goes first,
        # its first two blocks stay.
        self.send(prompt("bravo"))
        self.send(prompt("charlie"))
        _, c2 = self.send(a)
        self.assertEqual(c2, 32, "a's head outlived its tail")
        for tag in ("delta", "echo", "foxtrot"):
            self.send(prompt(tag))
        again, c3 = self.send(a)
        self.assertEqual(c3, 0, "evicted")
        self.assertGreaterEqual(again, 245.0, "prefilled in full again")
        st = harness.sim_stats(self.sim.port)["prefix_cache"]
        self.assertEqual((st["capacity_tokens"], st["resident_tokens"]), (1024, 1024))
        self.assertGreater(st["evicted_blocks"], 0)


if __name__ == "__main__":
    import unittest

    unittest.main()


class SimEventsPerWriteTest(harness.TestCase):
    """--events-per-write / x-sim-events-per-write: token events leave in
    groups of N, each group in one write (one read here: one arrival stamp),
    the last group with the closing events; at itl 0 every event still
    arrives. The flag sets the default, the header wins."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls)
        cls.sim4 = harness.start_sim(cls, "--events-per-write", "4")

    def token_stamps(self, port, headers):
        resp, _ = harness.exchange(port, "POST", "/v1/chat/completions",
                                   harness.api_body("openai-chat", include_usage=True), headers)
        self.assertEqual(resp.status, 200, resp.body[:300])
        evs = harness.events_of(resp)
        self.assertEqual(evs[-1].data, "[DONE]")
        return evs, [e.ts for e in evs if harness.is_token_event("openai-chat", e)]

    def reads(self, stamps):
        """Where one read's token events end (token counts 1..n-1): a
        group written at once always arrives in one read, but a client
        that falls behind (a loaded machine) may get several in one."""
        return [i for i in range(1, len(stamps)) if stamps[i] != stamps[i - 1]]

    def test_groups_at_the_beat(self):
        # 10 tokens 25 ms apart, 4 per write: writes at 75, 175 and 225 ms,
        # the last two tokens with the closing events
        evs, stamps = self.token_stamps(self.sim.port, harness.sim_headers(
            ttft=0, itl=25, tokens=10, extra=[("x-sim-events-per-write", "4")]))
        self.assertEqual(len(stamps), 10)
        self.assertLessEqual(set(self.reads(stamps)), {4, 8}, "a group is never split")
        self.assertEqual(evs[-1].ts, stamps[-1], "the closing events leave with the last group")
        if 4 in self.reads(stamps):
            # stamps are the kernel's receive times: exact whenever the
            # writes came in separate reads
            self.assertGreater((stamps[4] - stamps[3]) / 1e6, 75.0, "four beats between the first two writes")
        # the flag: the same from the second simulator without the header
        _, stamps = self.token_stamps(self.sim4.port, harness.sim_headers(ttft=0, itl=25, tokens=10))
        self.assertLessEqual(set(self.reads(stamps)), {4, 8})
        # one per write by default: events arrive apart, not in fours
        _, stamps = self.token_stamps(self.sim.port, harness.sim_headers(ttft=0, itl=40, tokens=8))
        self.assertTrue(set(self.reads(stamps)) - {4}, self.reads(stamps))

    def test_max_rate_all_arrive(self):
        for n in ("16", "1000"):
            with self.subTest(events_per_write=n):
                evs, stamps = self.token_stamps(self.sim.port, harness.sim_headers(
                    ttft=0, itl=0, tokens=300, extra=[("x-sim-events-per-write", n)]))
                self.assertEqual(len(stamps), 300)
                self.assertEqual(harness.stream_usage("openai-chat", evs)[1], 300)

    def test_bad_values(self):
        for value in ("0", "4097", "x", "-1"):
            with self.subTest(value=value):
                resp, _ = harness.exchange(self.sim.port, "POST", "/v1/chat/completions",
                                           harness.api_body("openai-chat"), [("x-sim-events-per-write", value)])
                self.assertJsonError(resp, 400)
        r = subprocess.run([harness.sim_bin(), "--events-per-write", "0"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=10)
        self.assertEqual(r.returncode, 2, r.stderr)
