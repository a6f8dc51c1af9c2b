"""test_balance.py — a route's `balance` policy (weighted, least_request,
latency, prefix), outlier ejection and its probe, over real sockets: tokentap
from a YAML file in front of several simulators made slow, full or failing
(docs/routing.md).

Each simulator runs with its own --model name and the requests name no model,
so the `model` of an answer tells which simulator served it; the access log's
`pick` says why tokentap chose it.
"""

import json
import re
import threading
import time
import unittest

import harness
import routing_helpers as rh

CHAT = rh.CHAT


def start_sims(test, spec, *more):
    """{name: ttft_ms} -> {name: Sim} with --model sim-NAME."""
    return {name: harness.start_sim(test, "--ttft-ms", ttft, "--itl-ms", 0, "--tokens", 2, "--model", "sim-" + name,
                                    *more)
            for name, ttft in spec.items()}


def who(resp):
    m = rh.served_by(resp)
    return m[4:] if m and m.startswith("sim-") else m


def route_yaml(names, balance, more=(), weights=None):
    lines = ["routes:", "  - name: chat", "    balance: %s" % balance]
    lines += ["    %s" % m for m in more]
    lines.append("    split:")
    for n in names:
        lines.append("      - {upstream: %s, weight: %d}" % (n, (weights or {}).get(n, 1)))
    return "\n".join(lines) + "\n"


def burst(port, n, body, headers=None, timeout=20.0):
    """n requests at once, each on its own connection, released together;
    returns their responses in order."""
    gate = threading.Barrier(n)
    out = [None] * n

    def one(i):
        try:
            gate.wait(5)
        except threading.BrokenBarrierError:
            return
        out[i] = rh.send(port, body, headers, timeout=timeout)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return out


def prompt_of(i, size=400):
    """A prompt whose leading bytes are its own."""
    head = "prompt %d: " % i
    return (head + "lorem ipsum dolor sit amet %d " % i * 40)[:size]


class LeastRequestTest(harness.TestCase):
    """least_request: the upstream with requests in flight is passed over;
    a full one (max_concurrency) before any with a free slot never."""

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": 0, "b": 0})
        cls.tt = rh.start_conf(cls, "override_header: x-tt-upstream\n" + rh.upstreams_yaml(
            {n: s.url for n, s in cls.sims.items()}, {"a": ["max_concurrency: 2", "queue: {max: 8}"]})
            + route_yaml(["a", "b"], "least_request"))

    def test_busy_and_full_upstream_passed_over(self):
        # two slow requests pinned on a: it is full (max_concurrency 2)
        a0 = self.sims["a"].stats()["requests"]
        slow = rh.Background()
        for _ in range(2):
            slow.start(rh.send, self.tt.port, rh.chat(), harness.sim_headers(ttft=1500, itl=0, tokens=1) +
                       [("x-tt-upstream", "a")])
        self.assertTrue(harness.wait_until(lambda: self.sims["a"].stats()["requests"] >= a0 + 2, 5, 0.02))
        # the two pinned ones are logged when they end; the rest in order
        n0 = len(self.tt.wait_log_count(0))
        got = [who(rh.send(self.tt.port, rh.chat(prompt="q%d" % i))) for i in range(12)]
        self.assertEqual(got, ["b"] * 12, "a is full and busy: every request to b")
        for kind, resp in slow.join(10):
            self.assertEqual(kind, "ok")
            self.assertEqual(resp.status, 200)
        log = self.tt.wait_log_count(n0 + 14)
        picks = [e["pick"] for e in log[n0:]]
        self.assertEqual(picks.count("pinned"), 2, picks)
        self.assertEqual(picks.count("least_loaded"), len(picks) - 2, picks)

    def test_burst_spreads(self):
        out = burst(self.tt.port, 32, rh.chat(), harness.sim_headers(ttft=300, itl=0, tokens=1))
        served = [who(r) for r in out]
        self.assertNotIn(None, served)
        # a takes at most 2 at once and queues the rest: b must take most
        self.assertGreaterEqual(served.count("b"), 16, served)
        self.assertGreaterEqual(served.count("a"), 1, served)


class LatencyTest(harness.TestCase):
    """latency: once measured, the fast upstream takes the traffic; the slow
    one gets a probe only; a burst is not herded."""

    def test_fast_upstream_chosen_with_prediction(self):
        sims = start_sims(self, {"fast": 5, "slow": 250})
        tt = rh.start_conf(self, rh.upstreams_yaml({n: s.url for n, s in sims.items()})
                           + route_yaml(["fast", "slow"], "latency"), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        got = [who(rh.send(tt.port, rh.chat(prompt="x" * 200))) for _ in range(24)]
        self.assertNotIn(None, got)
        # the first of each is a probe; from the third request on it knows both
        self.assertLessEqual(got[2:].count("slow"), 1, got)
        log = tt.wait_log_count(24)
        lat = [e for e in log if e["pick"] == "latency"]
        self.assertGreaterEqual(len(lat), 18, [e["pick"] for e in log])
        self.assertIn("probe", [e["pick"] for e in log[:3]])
        for e in lat:
            self.assertEqual(e["upstream"], "fast", e)
            p = e["pick_predicted_ttft_ms"]
            self.assertGreater(p, 0)
            self.assertLess(p, 100, "fast answers in ~5 ms: the prediction is of its TTFT, not the slow one's")
        # /upstreams: the predictions against what came, per upstream
        r, _ = harness.exchange(admin, "GET", "/upstreams")
        b = {u["name"]: u["balance"] for u in r.json()["upstreams"]}
        self.assertEqual(b["fast"]["predictions"], len(lat), b)
        self.assertLess(b["fast"]["prediction_error_ms"], 50, b)
        self.assertGreater(b["slow"]["predicted_ttft_ms"], b["fast"]["predicted_ttft_ms"], b)
        self.assertEqual((b["fast"]["prefill_requests"], b["fast"]["prefill_tokens"]), (0, 0), b)

    def test_burst_not_herded(self):
        sims = start_sims(self, {"a": 0, "b": 0, "c": 0, "d": 0})
        tt = rh.start_conf(self, rh.upstreams_yaml({n: s.url for n, s in sims.items()})
                           + route_yaml(["a", "b", "c", "d"], "latency"))
        # measured first, at low load
        for i in range(16):
            self.assertEqual(rh.send(tt.port, rh.chat(prompt="warm %d" % i),
                                     harness.sim_headers(ttft=20, itl=0, tokens=1)).status, 200)
        out = burst(tt.port, 32, rh.chat(prompt="y" * 200), harness.sim_headers(ttft=400, itl=0, tokens=1))
        served = [who(r) for r in out]
        self.assertNotIn(None, served)
        counts = {n: served.count(n) for n in sims}
        self.assertLess(max(counts.values()), 20, counts)
        self.assertGreaterEqual(min(counts.values()), 2, counts)


class LatencyEngineTest(harness.TestCase):
    """latency reads the engine's own queue where it is freshly scraped,
    and routes without it when the scrape fails."""

    def test_engine_queue_of_other_clients_avoided(self):
        sims = {n: harness.start_sim(self, "--batching", "--max-batch", 1, "--step-base-ms", 5, "--tokens", 2,
                                     "--model", "sim-" + n) for n in ("a", "b")}
        extra = {n: ["metrics_url: %s/metrics" % s.url, "metrics_interval: 100ms", "engine: vllm"]
                 for n, s in sims.items()}
        tt = rh.start_conf(self, rh.upstreams_yaml({n: s.url for n, s in sims.items()}, extra)
                           + route_yaml(["a", "b"], "latency"), *rh.ONE_WORKER)
        for i in range(12):
            self.assertIsNotNone(who(rh.send(tt.port, rh.chat(prompt="warm %d" % i))))
        # another client fills a's engine queue, past tokentap
        direct = rh.Background()
        for _ in range(12):
            direct.start(rh.send, sims["a"].port, rh.chat(max_tokens=40), None, "POST", CHAT, None, None, 20.0)

        def queued():
            r, _ = harness.exchange(sims["a"].port, "GET", "/metrics")
            return r is not None and "vllm:num_requests_waiting 0" not in r.body.decode()

        self.assertTrue(harness.wait_until(queued, 5, 0.02))
        time.sleep(0.35)  # scraped since
        got = [who(rh.send(tt.port, rh.chat(prompt="q"))) for _ in range(6)]
        self.assertEqual(got, ["b"] * 6, "a's engine queues another client's work: b predicted sooner")
        for kind, resp in direct.join(30):
            self.assertEqual(kind, "ok")

    def test_failing_scrape_never_blocks(self):
        sims = start_sims(self, {"a": 5, "b": 5})
        dead = harness.free_port()
        extra = {n: ["metrics_url: http://127.0.0.1:%d/metrics" % dead, "metrics_interval: 100ms"] for n in sims}
        tt = rh.start_conf(self, rh.upstreams_yaml({n: s.url for n, s in sims.items()}, extra)
                           + route_yaml(["a", "b"], "latency"))
        t0 = time.monotonic()
        got = [who(rh.send(tt.port, rh.chat())) for _ in range(20)]
        self.assertNotIn(None, got)
        self.assertLess(time.monotonic() - t0, 10)
        log = tt.wait_log_count(20)
        for e in log:
            self.assertLess(e["ttft_ms"] or 0, 500, e)


def session_prompt(i, size=3000):
    """A long prompt of session i: its first bytes are its own, so that no
    other session shares a block with it."""
    return ("session %d says: " % i + "the quick brown fox %d jumps over the lazy dog " % i * 500)[:size]


def latency_cache_yaml(sims, extra=None):
    """Route `chat` (latency over a and b) and, by Host, `prime-a` and
    `prime-b` (latency with the other's weight at 0): a prompt sent through
    prime-X is cached on X only."""
    lines = rh.upstreams_yaml({n: s.url for n, s in sims.items()}, extra).splitlines()
    lines += ["routes:"]
    for name, w in (("prime-a", (1, 0)), ("prime-b", (0, 1))):
        lines += ["  - name: %s" % name, "    match: {host: %s}" % name, "    balance: latency", "    split:",
                  "      - {upstream: a, weight: %d}" % w[0], "      - {upstream: b, weight: %d}" % w[1]]
    lines += ["  - name: chat", "    balance: latency", "    split:", "      - {upstream: a, weight: 1}",
              "      - {upstream: b, weight: 1}"]
    return "\n".join(lines) + "\n"


class LatencyPrefixTest(harness.TestCase):
    """latency counts the prefix each upstream is expected to hold: a
    session's next turn goes where its earlier turns were cached, unless the
    load there says otherwise (docs/routing.md, latency)."""

    def test_next_turn_follows_the_cache(self):
        sims = start_sims(self, {"a": 20, "b": 20})
        tt = rh.start_conf(self, latency_cache_yaml(sims), *rh.ONE_WORKER)
        for i in range(8):  # both measured (a probe each), on prompts of their own
            self.assertIsNotNone(who(rh.send(tt.port, rh.chat(prompt="warm %d" % i))))
        home = {}
        for i in range(8):  # sessions 0-3 cached on a, 4-7 on b
            home[i] = "a" if i < 4 else "b"
            got = who(rh.send(tt.port, rh.chat(prompt=session_prompt(i)), host="prime-" + home[i]))
            self.assertEqual(got, home[i])
        n0 = len(tt.wait_log_count(16))
        for turn in range(2):
            for i in range(8):
                p = session_prompt(i) + " turn %d: and what then? " % turn
                self.assertEqual(who(rh.send(tt.port, rh.chat(prompt=p))), home[i],
                                 "session %d, turn %d: its prefix is cached on %s" % (i, turn, home[i]))
        log = tt.wait_log_count(n0 + 16)
        for e in log[n0:]:
            self.assertEqual(e["pick"], "latency", e)
            # 3000 bytes of prompt text: 46 whole blocks of 64 bytes held
            self.assertGreaterEqual(e["pick_prefix_blocks"], 40, e)

    def test_load_overrides_the_cache(self):
        sims = start_sims(self, {"a": 20, "b": 20})
        tt = rh.start_conf(self, latency_cache_yaml(sims), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        for i in range(8):
            self.assertIsNotNone(who(rh.send(tt.port, rh.chat(prompt="warm %d" % i))))
        self.assertEqual(who(rh.send(tt.port, rh.chat(prompt=session_prompt(0)), host="prime-a")), "a")
        # a busy prefilling long prompts of others: more work ahead there
        # than the session's whole prompt on b
        slow = rh.Background()
        for k in range(6):
            slow.start(rh.send, tt.port, rh.chat(prompt=session_prompt(100 + k, 8000)),
                       harness.sim_headers(ttft=1500, itl=0, tokens=1), "POST", CHAT, "prime-a")

        def held():
            r, _ = harness.exchange(admin, "GET", "/upstreams")
            b = {u["name"]: u["balance"] for u in r.json()["upstreams"]}
            return b["a"]["prefill_requests"] == 6

        self.assertTrue(harness.wait_until(held, 5, 0.02))
        got = who(rh.send(tt.port, rh.chat(prompt=session_prompt(0) + " and then?")))
        self.assertEqual(got, "b", "a holds the prefix but has 12k prompt tokens ahead: b is sooner")
        for kind, resp in slow.join(10):
            self.assertEqual((kind, resp.status), ("ok", 200))
        # b holds the prefix now too: the next turn finds it cached wherever it goes
        n0 = len(tt.wait_log_count(14))
        self.assertIsNotNone(who(rh.send(tt.port, rh.chat(prompt=session_prompt(0) + " and now?"))))
        e = tt.wait_log_count(n0 + 1)[-1]
        self.assertEqual(e["pick"], "latency", e)
        self.assertGreaterEqual(e["pick_prefix_blocks"], 40, e)


class LatencyChunkedTest(harness.TestCase):
    """latency counts a chunked body's prompt tokens from what was read
    before routing, not as 0."""

    def test_chunked_body_counts_its_tokens(self):
        sims = start_sims(self, {"a": 0, "b": 0})
        tt = rh.start_conf(self, rh.upstreams_yaml({n: s.url for n, s in sims.items()})
                           + route_yaml(["a", "b"], "latency"), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        body = rh.chat(prompt=session_prompt(7, 20000))
        size = len(json.dumps(body, separators=(",", ":")).encode())  # as the harness sends it
        chunks = [4096] * (size // 4096) + ([size % 4096] if size % 4096 else [])
        slow = rh.Background()
        slow.start(rh.send, tt.port, body, harness.sim_headers(ttft=1500, itl=0, tokens=1), "POST", CHAT, None,
                   chunks)
        seen = {}

        def held():
            r, _ = harness.exchange(admin, "GET", "/upstreams")
            seen.update({u["name"]: u["balance"] for u in r.json()["upstreams"]})
            return sum(b["prefill_requests"] for b in seen.values()) == 1

        self.assertTrue(harness.wait_until(held, 5, 0.02), seen)
        tokens = sum(b["prefill_tokens"] for b in seen.values())
        self.assertEqual(tokens, size // 4, "the whole chunked body (%d bytes) read before routing" % size)
        kind, resp = slow.join(10)[0]
        self.assertEqual((kind, resp.status), ("ok", 200))


class PrefixTest(harness.TestCase):
    """prefix: the same leading blocks go to the same upstream, in two
    tokentaps that share nothing; released when the affine one is full."""

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": 0, "b": 0, "c": 0})
        cls.body = (rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()},
                                      {n: ["max_concurrency: 1", "queue: {max: 8}"] for n in cls.sims})
                    + route_yaml(["a", "b", "c"], "prefix", ["prefix_blocks: 4"]))
        cls.tt1 = rh.start_conf(cls, cls.body)
        cls.tt2 = rh.start_conf(cls, cls.body, "--workers", "2")

    def test_same_choice_across_two_tokentaps(self):
        first = {}
        for i in range(24):
            p = prompt_of(i)
            a = who(rh.send(self.tt1.port, rh.chat(prompt=p)))
            b = who(rh.send(self.tt2.port, rh.chat(prompt=p)))
            c = who(rh.send(self.tt1.port, rh.chat(prompt=p[:256] + " and then something else entirely")))
            self.assertIsNotNone(a)
            self.assertEqual(a, b, "prompt %d: tokentap 1 chose %s, tokentap 2 %s" % (i, a, b))
            self.assertEqual(a, c, "prompt %d: the same 4 leading blocks went elsewhere" % i)
            first[i] = a
        self.assertGreaterEqual(len(set(first.values())), 2, "24 prompts keyed onto one upstream: %r" % first)
        log = self.tt2.wait_log_count(24)
        for e in log:
            if e["path"] == CHAT:
                self.assertEqual(e["pick"], "prefix", e)
                self.assertEqual(e["pick_prefix_blocks"], 4, e)

    def test_saturated_release(self):
        p = prompt_of(1000)
        home = who(rh.send(self.tt1.port, rh.chat(prompt=p)))
        self.assertIsNotNone(home)
        # the affine upstream busy with this prefix, at its max_concurrency
        slow = rh.Background()
        slow.start(rh.send, self.tt1.port, rh.chat(prompt=p), harness.sim_headers(ttft=1500, itl=0, tokens=1))
        n_home = self.sims[home].stats()["requests"]
        self.assertTrue(harness.wait_until(lambda: self.sims[home].stats()["requests"] > n_home - 1 and
                                           self.tt1.count_lines(rh.RELOAD_RE) >= 0, 5, 0.02))
        time.sleep(0.2)  # the slow one admitted: the sim has it
        n0 = len(self.tt1.wait_log_count(0))
        other = who(rh.send(self.tt1.port, rh.chat(prompt=p)))
        self.assertIsNotNone(other)
        self.assertNotEqual(other, home, "the affine upstream is full: released elsewhere")
        log = self.tt1.wait_log_count(n0 + 1)
        mine = [e for e in log[n0:] if e["upstream"] == other]
        self.assertTrue(mine and mine[-1]["pick"] == "saturated_release", log[n0:])
        kind, resp = slow.join(10)[0]
        self.assertEqual((kind, resp.status), ("ok", 200))
        # and back home once it is free
        self.assertEqual(who(rh.send(self.tt1.port, rh.chat(prompt=p))), home)


SYSTEM = ("You are the assistant of a shared deployment; every conversation opens with these "
          "instructions. " * 40)[:3000]  # 47 blocks: past the first 32 a key of leading blocks would cover


def user_turn(conv, turn):
    return "conversation %d, turn %d: tell me about item %d in some detail please" % (conv, turn, conv * 7 + turn)


def conversation(conv, turns, shape):
    """(path, body, first-turn prompt bytes) of turn `turns` of conversation
    `conv` over SYSTEM, resending the history, in one API's shape."""
    hist = []
    for t in range(turns):
        hist.append(("user", user_turn(conv, t)))
        if t < turns - 1:
            hist.append(("assistant", "answer %d to conversation %d" % (t, conv)))
    first = len(SYSTEM) + 1 + len(user_turn(conv, 0)) + 1  # each text and its separator
    if shape == "anthropic":
        msgs = [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in hist]
        return "/v1/messages", {"system": SYSTEM, "messages": msgs, "max_tokens": 4}, first
    msgs = [{"role": "system", "content": SYSTEM}] + [{"role": r, "content": c} for r, c in hist]
    if shape == "responses":
        return "/v1/responses", {"input": msgs}, first
    return CHAT, {"messages": msgs}, first


class PrefixConversationTest(harness.TestCase):
    """prefix with its default prefix_blocks keys a conversation on its system
    prompt and first user message: every turn of one conversation goes to one
    upstream, in either of two tokentaps, and conversations over one system
    prompt spread."""

    @classmethod
    def setUpClass(cls):
        cls.sims = start_sims(cls, {"a": 0, "b": 0, "c": 0, "d": 0})
        body = (rh.upstreams_yaml({n: s.url for n, s in cls.sims.items()})
                + route_yaml(["a", "b", "c", "d"], "prefix"))
        cls.tts = (rh.start_conf(cls, body), rh.start_conf(cls, body, "--workers", "2"))

    def check_shape(self, shape):
        n0 = [len(tt.wait_log_count(0)) for tt in self.tts]
        sent = [0, 0]
        home = {}
        for conv in range(12):
            for turn in range(1, 4):
                i = (conv + turn) % 2  # the turns alternate between the two tokentaps
                path, body, first = conversation(conv, turn, shape)
                resp = rh.send(self.tts[i].port, body, path=path)
                self.assertEqual(resp.status, 200, (shape, conv, turn, resp.body[:200]))
                sent[i] += 1
                e = self.tts[i].wait_log_count(n0[i] + sent[i])[-1]
                self.assertEqual(e["pick"], "prefix", e)
                self.assertEqual(e["pick_prefix_blocks"], -(-first // 64), e)
                home.setdefault(conv, e["upstream"])
                self.assertEqual(e["upstream"], home[conv],
                                 "%s: conversation %d, turn %d on tokentap %d went to %s, its turn 1 to %s"
                                 % (shape, conv, turn, i + 1, e["upstream"], home[conv]))
        self.assertGreaterEqual(len(set(home.values())), 3,
                                "%s: 12 conversations over one system prompt on %r" % (shape, home))

    def test_openai_chat(self):
        self.check_shape("chat")

    def test_anthropic_messages(self):
        self.check_shape("anthropic")

    def test_responses(self):
        self.check_shape("responses")

    def test_no_user_message_keys_leading_blocks(self):
        # a completions prompt has no first user message: its leading
        # prefix_blocks (256 by default, 16 KiB) key it, here all of it
        tt = self.tts[0]
        n0 = len(tt.wait_log_count(0))
        resp = rh.send(tt.port, {"prompt": SYSTEM}, path="/v1/completions")
        self.assertEqual(resp.status, 200)
        e = tt.wait_log_count(n0 + 1)[-1]
        self.assertEqual((e["pick"], e["pick_prefix_blocks"]), ("prefix", len(SYSTEM) // 64), e)


def failing_handler(state):
    """A fake upstream answering 500 while state["fail"], else a small chat
    answer."""

    def handler(sock, req, ctx):
        if state["fail"]:
            body = b'{"error":"boom"}'
            sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "sim-flaky",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        return True

    return handler


class EjectionTest(harness.TestCase):
    """An upstream failing N times in a row leaves every choice, is probed
    with one request once its backoff is over, and comes back."""

    def test_eject_probe_and_return(self):
        state = {"fail": True}
        flaky = harness.start_fake_upstream(self, failing_handler(state))
        good = start_sims(self, {"good": 0})["good"]
        body = rh.upstreams_yaml({"flaky": flaky.url, "good": good.url},
                                 {"flaky": ["eject: {after: 3, backoff: 400ms, max_backoff: 2s}"]}) \
            + route_yaml(["flaky", "good"], "weighted")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        admin = harness.admin_port(tt)
        statuses = [rh.send(tt.port, rh.chat()).status for _ in range(20)]
        # weighted 1:1: flaky's 1st, 3rd and 5th... answers fail, 3 of them eject it
        self.assertEqual(statuses.count(500), 3, statuses)
        self.assertEqual(statuses[6:].count(200), 14, statuses)

        def upstream(name):
            r, _ = harness.exchange(admin, "GET", "/upstreams")
            return next(u for u in r.json()["upstreams"] if u["name"] == name)

        b = upstream("flaky")["balance"]
        self.assertEqual((b["ejection"], b["ejections"]), ("ejected", 1), b)
        # still failing: its probe fails and the backoff doubles
        time.sleep(0.45)
        statuses = [rh.send(tt.port, rh.chat()).status for _ in range(6)]
        self.assertEqual(statuses.count(500), 1, statuses)
        b = upstream("flaky")["balance"]
        self.assertEqual((b["ejection"], b["ejections"]), ("ejected", 2), b)
        self.assertGreater(b["eject_left_ms"], 400, b)
        # healthy again: one probe puts it back
        state["fail"] = False
        self.assertTrue(harness.wait_until(lambda: upstream("flaky")["balance"]["ejection"] == "probe_due", 3, 0.05))
        got = [who(rh.send(tt.port, rh.chat())) for _ in range(10)]
        self.assertEqual(got.count("flaky"), 5, got)
        log = tt.wait_log_count(36)
        picks = [e["pick"] for e in log]
        self.assertEqual(picks.count("probe"), 2, picks)
        self.assertEqual(upstream("flaky")["balance"]["ejection"], "in")
        # and /metrics counts the decisions by route, upstream and reason
        r, _ = harness.exchange(admin, "GET", "/metrics")
        counts = {}
        for line in r.body.decode().splitlines():
            m = re.match(r'tokentap_route_decisions_total\{route="chat",upstream="(\w+)",reason="(\w+)"\} (\d+)$',
                         line)
            if m:
                counts[(m.group(1), m.group(2))] = int(m.group(3))
        for name in ("flaky", "good"):
            for reason in ("weighted", "probe", "least_loaded"):
                want = sum(1 for e in log if e["upstream"] == name and e["pick"] == reason)
                self.assertEqual(counts.get((name, reason)), want, (name, reason, counts))
        self.assertEqual(counts[("flaky", "probe")], 2)


class EjectionWorkersTest(harness.TestCase):
    """Every worker agrees: the streak and the ejection are the server's."""

    def test_workers_share_ejection(self):
        flaky = harness.start_fake_upstream(self, failing_handler({"fail": True}))
        good = start_sims(self, {"good": 0})["good"]
        body = rh.upstreams_yaml({"flaky": flaky.url, "good": good.url},
                                 {"flaky": ["eject: {after: 3, backoff: 30s}"]}) \
            + route_yaml(["flaky", "good"], "least_request")
        tt = rh.start_conf(self, body, "--workers", "3")
        statuses = [rh.send(tt.port, rh.chat()).status for _ in range(40)]
        # three failures in a row across the workers eject it for all of them
        self.assertEqual(statuses.count(500), 3, statuses)
        log = tt.wait_log_count(40)
        self.assertEqual(sum(1 for e in log if e["upstream"] == "flaky"), 3)


class FailoverTest(harness.TestCase):
    """A refused connection goes to the next best under the policy."""

    def test_refused_fails_over_under_each_policy(self):
        live = start_sims(self, {"live": 0})["live"]
        dead = "http://127.0.0.1:%d" % harness.free_port()
        for pol in ("least_request", "latency", "prefix"):
            body = rh.upstreams_yaml({"dead": dead, "live": live.url}, {"dead": ["eject: {after: 0}"]}) \
                + route_yaml(["dead", "live"], pol)
            tt = rh.start_conf(self, body, *rh.ONE_WORKER)
            got = [who(rh.send(tt.port, rh.chat(prompt=prompt_of(i)))) for i in range(16)]
            self.assertEqual(got, ["live"] * 16, pol)
            picks = [e["pick"] for e in tt.wait_log_count(16)]
            self.assertIn("failover", picks, pol)
            harness._stop_and_check(tt)


class ReloadTest(harness.TestCase):
    """Changing a route's policy by reload while requests run: none lost."""

    def test_policy_changes_under_load(self):
        sims = start_sims(self, {"a": 5, "b": 5, "c": 5})
        ups = rh.upstreams_yaml({n: s.url for n, s in sims.items()})
        tt = rh.start_conf(self, ups + route_yaml(["a", "b", "c"], "weighted"))
        stop = threading.Event()
        results = []

        def loop(k):
            deadline = time.monotonic() + 20
            i = 0
            while not stop.is_set() and time.monotonic() < deadline and i < 400:
                r = rh.send(tt.port, rh.chat(prompt=prompt_of(k * 1000 + i)), harness.sim_headers(ttft=20))
                results.append(r.status if r else None)
                i += 1

        threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        for pol in ("least_request", "latency", "prefix", "weighted"):
            time.sleep(0.3)
            self.assertTrue(tt.reload(ups + route_yaml(["a", "b", "c"], pol)), pol)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(25)
        self.assertGreater(len(results), 20)
        self.assertEqual(results.count(200), len(results), [s for s in results if s != 200][:5])
        log = tt.wait_log_count(len(results))
        self.assertEqual(len(log), len(results))
        seen = {e["pick"] for e in log}
        for want in ("weighted", "least_loaded", "prefix"):
            self.assertIn(want, seen)


class ConfigCheckTest(unittest.TestCase):
    """`-t` names the file and line of a bad policy setting."""

    BASE = "upstreams:\n  - name: a\n    url: http://127.0.0.1:9\n%s" \
           "routes:\n  - name: r\n    split:\n      - {upstream: a}\n%s"

    def check(self, up_extra, route_extra, needle, want):
        text = self.BASE % (up_extra, route_extra)
        res, f = rh.check_config(text)
        self.assertNotEqual(res.returncode, 0, res.stdout + res.stderr)
        probs = rh.problem_lines(res, f)
        line = rh.line_of(text, needle)
        self.assertTrue(any(n == line and want in m for n, m in probs), (line, probs, res.stderr))

    def test_bad_policy(self):
        self.check("", "    balance: fastest\n", "balance:", "expected weighted, least_request, latency or prefix")

    def test_bad_prefix_blocks(self):
        self.check("", "    prefix_blocks: 0\n", "prefix_blocks", "expected from 1 to 1024 blocks")

    def test_bad_load_factor(self):
        self.check("", "    load_factor: 1\n", "load_factor", "expected a number above 1")

    def test_bad_load_slack(self):
        self.check("", "    load_slack: 5000\n", "load_slack", "expected from 0 to 4096 requests")

    def test_bad_eject(self):
        self.check("    eject: {after: x}\n", "", "eject:", "expected a whole number")
        self.check("    eject: {backoff: 5s, max_backoff: 1s}\n", "", "eject:", "max_backoff")

    def test_good(self):
        text = self.BASE % ("    eject: {after: 0}\n", "    balance: prefix\n    prefix_blocks: 8\n"
                            "    load_factor: 1.5\n")
        res, _ = rh.check_config(text)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)


if __name__ == "__main__":
    unittest.main()
