"""test_sdk_reasoning.py — real clients on reasoning streams through tokentap:
the official `openai` npm SDK (a chat request with reasoning_effort, and a
Responses request with reasoning through its responses.stream helper) and
the official `@anthropic-ai/sdk` (a thinking request with cache tokens,
through messages.stream), against tokentap-sim's reasoning mode.

The SDKs are installed with npm into tests/artifacts/ (git-ignored, pinned
versions), as test_responses.py installs the openai one: missing node/npm
or a failed install is a failure with a message, not a skip.
sdk_reasoning.cjs runs one request and reports what the SDK yielded, its
final typed object and the raw body it read (teed from its fetch). Each
case runs once straight at the simulator and once through tokentap:

- the raw bodies are byte-identical (tokentap forwards every event
  unchanged), and the SDK's events are exactly the raw body's events;
- the SDK's typed objects carry the reasoning / thinking text (equal to the
  deltas joined), the signature, the answer, and the usage details
  (reasoning tokens, cached tokens, Anthropic's cache reads and writes);
- the think pause shows between the SDK's first token and first answer;
- tokentap's access log agrees with what the SDK saw: api, ttft (never
  later than the SDK's first token event) and answer ttft (never later than
  its first answer token, and at least the reasoning and the think pause
  after ttft), the reasoning span (the reasoning tokens' gaps, without the
  pause), reasoning and tool-call event counts, output tokens, and the
  usage details: reasoning, cached and cache-write tokens, and the prompt
  as the whole prompt for Anthropic too (input + cache reads + writes).
"""

import json
import os

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(os.path.dirname(HERE), "artifacts")
SCRIPT = os.path.join(HERE, "sdk_reasoning.cjs")
# Pinned: the versions the test was written against.
SDKS = {
    "openai": ("openai@5.23.2", os.path.join(ARTIFACTS, "npm-openai")),
    "@anthropic-ai/sdk": ("@anthropic-ai/sdk@1.15.0", os.path.join(ARTIFACTS, "npm-anthropic")),
}
ROUND_MS = 0.003  # logged values are ms with µs precision
TTFT, ITL, THINK, TOKENS = 60, 5, 80, 6
LONG_PROMPT = ("Describe, step by step and with care, how Rayleigh scattering makes a clear afternoon sky look "
               "blue while sunsets look red, and say which wavelengths matter most and why. ") * 3


def npm_install(package):
    """Installs the pinned `package` under its artifacts directory once."""
    spec, prefix = SDKS[package]
    return harness.npm_install(prefix, [spec], timeout=120)


def run_sdk(mode, package, base_url, rid, headers, body):
    return harness.run_node(SCRIPT, mode, SDKS[package][1], base_url, rid, json.dumps(headers), json.dumps(body))


def raw_events(text):
    """(event name, parsed data) of each SSE event of a raw body; [DONE] as
    the string."""
    out = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            d = "\n".join(data)
            out.append((name, d if d == "[DONE]" else json.loads(d)))
    return out


def sim_headers(**extra):
    h = {"x-sim-ttft-ms": str(TTFT), "x-sim-itl-ms": str(ITL), "x-sim-tokens": str(TOKENS),
         "x-sim-think-ms": str(THINK)}
    h.update({k: str(v) for k, v in extra.items()})
    return h


class SdkReasoningTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        for package in SDKS:
            npm_install(package)
        cls.sim = harness.start_sim(cls, "--seed", "11")
        cls.start_logged(cls.sim.url, "tokentap-sdk-reasoning-")

    def both(self, mode, package, path, rid, headers, body):
        """The SDK straight at the simulator and through tokentap; checks
        the bytes match and the SDK saw the body's events. Returns (via,
        access log entry)."""
        direct = run_sdk(mode, package, "http://127.0.0.1:%d%s" % (self.sim.port, path), rid + "-direct",
                         headers, body)
        via = run_sdk(mode, package, "http://127.0.0.1:%d%s" % (self.tt.port, path), rid, headers, body)
        self.assertTrue(direct["raw"], "the SDK read a body")
        self.assertEqual(via["raw"], direct["raw"], "every byte through tokentap as the simulator sent it")
        evs = [d for name, d in raw_events(via["raw"]) if d != "[DONE]" and name != "ping"]
        self.assertEqual(via["events"], evs, "the SDK yields each event of the body as sent")
        self.assertEqual(via["events"], direct["events"])
        e = harness.wait_log_entry(self.log, lambda e: e.get("id") == rid)
        self.assertIsNotNone(e, "no access log line for %s" % rid)
        self.assertIsNone(e["error"])
        # tokentap sees the first token event before the SDK has read it
        self.assertLessEqual(e["ttft_ms"], via["first_ms"] + ROUND_MS,
                             "tokentap ttft %.3f ms later than the SDK's %.3f ms" % (e["ttft_ms"], via["first_ms"]))
        self.assertGreaterEqual(e["ttft_ms"], TTFT)
        # the think pause, as the SDK saw it: after the reasoning tokens, itl +
        # think before the answer (the SDK may read its first token late, so
        # the bound is the pause alone)
        self.assertGreaterEqual(via["first_answer_ms"] - via["first_ms"], THINK)
        return via, e

    def check_answer_marks(self, e, via, cached, cache_writes=None):
        """tokentap's answer/reasoning numbers for the stream the SDK saw:
        the simulator sends R reasoning tokens ITL apart, pauses one gap
        plus THINK, then the answer."""
        self.assertLessEqual(e["answer_ttft_ms"], via["first_answer_ms"] + ROUND_MS,
                             "tokentap's answer ttft %.3f ms later than the SDK's first answer token %.3f ms"
                             % (e["answer_ttft_ms"], via["first_answer_ms"]))
        # Nominally the answer comes (R - 1) * ITL + ITL + THINK after the
        # first token and the span is (R - 1) * ITL; tokentap stamps events
        # as it reads them, and a loaded machine (ASan) can hand it the first
        # few in one read, so the lower bounds keep half the reasoning time.
        self.assertGreaterEqual(e["answer_ttft_ms"] - e["ttft_ms"], (self.R - 1) * ITL / 2 + THINK)
        # the span ends at the last reasoning token, before the pause: had an
        # answer token been taken for reasoning, it would hold THINK too
        self.assertGreaterEqual(e["reasoning_ms"], (self.R - 1) * ITL / 2)
        self.assertLess(e["reasoning_ms"], (self.R - 1) * ITL + THINK)
        self.assertEqual((e["reasoning_events"], e["tool_call_events"]), (self.R, 0))
        self.assertEqual((e["reasoning_tokens"], e["cached_tokens"], e["cache_write_tokens"]),
                         (self.R, cached, cache_writes))

    R = 16  # reasoning tokens of reasoning_effort / effort "low" (docs/simulator.md)

    def test_openai_chat_reasoning(self):
        body = {"model": "sim-model", "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True,
                "stream_options": {"include_usage": True}, "reasoning_effort": "low"}
        via, e = self.both("chat", "openai", "/v1", "it-sdk-chat", sim_headers(**{"x-sim-cached-tokens": 40}), body)
        deltas = [c["choices"][0]["delta"] for c in via["events"] if c["choices"]]
        reasoning = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
        answer = [d["content"] for d in deltas if d.get("content")]
        self.assertEqual((len(reasoning), len(answer)), (self.R, TOKENS))
        usage = via["events"][-1]["usage"]
        self.assertEqual(usage["completion_tokens"], self.R + TOKENS)
        self.assertEqual(usage["completion_tokens_details"], {"reasoning_tokens": self.R})
        self.assertEqual(usage["prompt_tokens_details"], {"cached_tokens": 40})
        self.assertEqual(e["api"], "openai-chat")
        self.assertEqual(e["token_events"], self.R + TOKENS)
        self.assertEqual((e["input_tokens"], e["output_tokens"]), (usage["prompt_tokens"], usage["completion_tokens"]))
        self.check_answer_marks(e, via, 40)

    def test_openai_responses_reasoning(self):
        body = {"model": "sim-model", "input": [{"role": "user", "content": LONG_PROMPT}],
                "reasoning": {"effort": "low"}}
        via, e = self.both("responses", "openai", "/v1", "it-sdk-resp", sim_headers(**{"x-sim-cached-tokens": 32}),
                           body)
        evs = via["events"]
        reasoning = "".join(ev["delta"] for ev in evs if ev["type"] == "response.reasoning_text.delta")
        text = "".join(ev["delta"] for ev in evs if ev["type"] == "response.output_text.delta")
        final = via["final"]
        self.assertEqual([o["type"] for o in final["output"]], ["reasoning", "message"])
        self.assertEqual(final["output"][0]["content"], [{"type": "reasoning_text", "text": reasoning}])
        self.assertEqual(final["output"][1]["content"][0]["text"], text, "the helper's typed Response")
        self.assertEqual(final["usage"]["output_tokens_details"], {"reasoning_tokens": self.R})
        self.assertEqual(final["usage"]["input_tokens_details"], {"cached_tokens": 32})
        self.assertEqual(final["usage"]["output_tokens"], self.R + TOKENS)
        self.assertEqual(e["api"], "openai-responses")
        self.assertEqual(e["token_events"], self.R + TOKENS)
        self.assertEqual((e["input_tokens"], e["output_tokens"]),
                         (final["usage"]["input_tokens"], final["usage"]["output_tokens"]))
        self.check_answer_marks(e, via, 32)

    def test_anthropic_thinking_with_cache(self):
        self.R = 32  # thinking enabled: the simulator's default, budget_tokens being larger
        body = {"model": "sim-model", "max_tokens": 2048, "thinking": {"type": "enabled", "budget_tokens": 1024},
                "messages": [{"role": "user", "content": LONG_PROMPT}]}
        via, e = self.both("anthropic", "@anthropic-ai/sdk", "", "it-sdk-anthropic",
                           sim_headers(**{"x-sim-cached-tokens": 64, "x-sim-cache-write-tokens": 16}), body)
        evs = via["events"]
        thinking = "".join(ev["delta"]["thinking"] for ev in evs if ev["type"] == "content_block_delta" and
                           ev["delta"]["type"] == "thinking_delta")
        text = "".join(ev["delta"]["text"] for ev in evs if ev["type"] == "content_block_delta" and
                       ev["delta"]["type"] == "text_delta")
        final = via["final"]
        self.assertEqual([c["type"] for c in final["content"]], ["thinking", "text"])
        self.assertEqual(final["content"][0]["thinking"], thinking)
        self.assertTrue(final["content"][0]["signature"], "the signature_delta reached the typed block")
        self.assertEqual(final["content"][1]["text"], text)
        self.assertEqual(final["stop_reason"], "end_turn")
        u = final["usage"]
        self.assertEqual((u["cache_read_input_tokens"], u["cache_creation_input_tokens"]), (64, 16))
        prompt = (len(LONG_PROMPT) + 3) // 4
        self.assertEqual(u["input_tokens"], prompt - 80, "Anthropic's input_tokens excludes the cache")
        self.assertEqual(u["output_tokens"], self.R + TOKENS)
        self.assertEqual(e["api"], "anthropic")
        self.assertEqual(e["token_events"], self.R + TOKENS)
        self.assertEqual(e["output_tokens"], self.R + TOKENS)
        # tokentap's prompt tokens are the whole prompt for every API:
        # Anthropic's input_tokens plus cache reads and writes
        self.assertEqual(e["input_tokens"], prompt)
        self.check_answer_marks(e, via, 64, 16)


if __name__ == "__main__":
    import unittest

    unittest.main()
