"""test_streaming.py — tokentap forwards every API's responses byte for byte,
streaming or not, on fresh, kept-alive and pipelined connections, forwards
chunked request bodies, and forwards events as they arrive rather than at the
end."""

import unittest

import harness

CASES = [
    # (api, stream, include_usage)
    ("openai-chat", True, False),
    ("openai-chat", True, True),
    ("openai-chat", False, False),
    ("openai-completions", True, False),
    ("openai-completions", True, True),
    ("openai-completions", False, False),
    ("anthropic", True, False),
    ("anthropic", False, False),
    ("ollama-chat", True, False),
    ("ollama-chat", False, False),
    ("ollama-generate", True, False),
    ("ollama-generate", False, False),
]


class StreamingTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0", "--seed", "7")
        cls.tt = harness.start_tokentap(cls, cls.sim.url)

    def _req(self, api, stream=True, include_usage=False, tokens=12, prompt=harness.PROMPT, **kw):
        body = harness.api_body(api, stream, include_usage, prompt=prompt)
        headers = harness.sim_headers(ttft=0, itl=0, tokens=tokens, **kw)
        return harness.API_PATHS[api], body, headers

    def assertSameResponse(self, direct, proxied, what):
        self.assertIsNotNone(direct, "%s: sim closed without a response" % what)
        self.assertIsNotNone(proxied, "%s: tokentap closed without a response" % what)
        self.assertEqual(proxied.status, direct.status, what)
        self.assertEqual(proxied.content_type(), direct.content_type(), what)
        self.assertTrue(direct.complete, "%s: direct body incomplete" % what)
        self.assertTrue(proxied.complete, "%s: proxied body incomplete" % what)
        self.assertEqual(proxied.body, direct.body, what)

    def test_byte_identical(self):
        for api, stream, usage in CASES:
            what = "%s stream=%s include_usage=%s" % (api, stream, usage)
            with self.subTest(what):
                path, body, headers = self._req(api, stream, usage)
                direct, _ = harness.exchange(self.sim.port, "POST", path, body, headers)
                proxied, _ = harness.exchange(self.tt.port, "POST", path, body, headers)
                self.assertEqual(direct.status, 200, "%s: sim status (test setup)" % what)
                self.assertSameResponse(direct, proxied, what)
                if stream:
                    evs = harness.events_of(proxied)
                    n_tok = sum(1 for e in evs if harness.is_token_event(api, e))
                    self.assertGreater(n_tok, 0, "%s: no token events" % what)
                    if usage:
                        inp, out = harness.stream_usage(api, evs)
                        self.assertEqual(out, 12, what)

    def test_keep_alive(self):
        plan = [
            self._req("openai-chat", True, True, tokens=5),
            self._req("anthropic", False, tokens=7),
            self._req("ollama-generate", True, tokens=9),
            self._req("openai-completions", False, tokens=3),
            self._req("openai-chat", True, False, tokens=4),
        ]
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        for i, (path, body, headers) in enumerate(plan):
            direct, _ = harness.exchange(self.sim.port, "POST", path, body, headers)
            conn.send(harness.request_bytes("POST", path, body, headers, self.tt.port))
            proxied = conn.read_response()
            self.assertSameResponse(direct, proxied, "request %d on one connection" % i)
            self.assertNotEqual((proxied.header("connection") or "").lower(), "close",
                                "tokentap closed a keep-alive connection after request %d" % i)
        self.assertFalse(conn.eof)

    def test_pipelining(self):
        first = self._req("openai-chat", True, True, tokens=6, prompt="first pipelined request")
        second = self._req("ollama-chat", True, tokens=8, prompt="second pipelined request, longer")
        third = self._req("openai-completions", False, tokens=2, prompt="third")
        directs = [harness.exchange(self.sim.port, "POST", p, b, h)[0] for p, b, h in (first, second, third)]
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        conn.send(b"".join(harness.request_bytes("POST", p, b, h, self.tt.port) for p, b, h in (first, second, third)))
        for i, direct in enumerate(directs):
            proxied = conn.read_response()
            self.assertSameResponse(direct, proxied, "pipelined response %d" % i)

    def test_chunked_request_body(self):
        for api in ("openai-chat", "ollama-generate"):
            with self.subTest(api=api):
                path, body, headers = self._req(api, True, tokens=10, prompt="chunked " * 40)
                direct, _ = harness.exchange(self.sim.port, "POST", path, body, headers)
                proxied, _ = harness.exchange(self.tt.port, "POST", path, body, headers, chunked=[1, 7, 50, 3])
                self.assertSameResponse(direct, proxied, "chunked request body (%s)" % api)

    def test_chunked_request_body_split_writes(self):
        # The chunks arrive in separate writes with pauses between them.
        path, body, headers = self._req("openai-chat", False, tokens=4, prompt="split " * 30)
        direct, _ = harness.exchange(self.sim.port, "POST", path, body, headers)
        raw = harness.request_bytes("POST", path, body, headers, self.tt.port, chunked=[10, 10, 10])
        head_end = raw.index(b"\r\n\r\n") + 4
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        conn.send(raw[:head_end])
        rest = raw[head_end:]
        for i in range(0, len(rest), 17):
            conn.send(rest[i:i + 17])
            if i < 60:
                harness.time.sleep(0.01)
        self.assertSameResponse(direct, conn.read_response(), "chunked body in pieces")

    def test_large_bodies(self):
        # A request body far larger than any socket buffer, and a large
        # non-streamed response, both pass through unchanged.
        for what, prompt, tokens, stream in (("3 MiB prompt", "lorem ipsum " * (3 << 18), 5, True),
                                             ("large response", "short", 30000, False)):
            with self.subTest(what):
                path, body, headers = self._req("openai-chat", stream, True, tokens=tokens, prompt=prompt)
                direct, _ = harness.exchange(self.sim.port, "POST", path, body, headers, timeout=30)
                proxied, _ = harness.exchange(self.tt.port, "POST", path, body, headers, timeout=30)
                self.assertEqual(direct.status, 200, "sim status (test setup)")
                self.assertSameResponse(direct, proxied, what)

    def test_events_arrive_incrementally(self):
        for api in ("openai-chat", "anthropic", "ollama-chat"):
            with self.subTest(api=api):
                body = harness.api_body(api, True)
                headers = harness.sim_headers(ttft=0, itl=50, tokens=10)
                proxied, _ = harness.exchange(self.tt.port, "POST", harness.API_PATHS[api], body, headers)
                self.assertEqual(proxied.status, 200)
                self.assertTrue(proxied.complete)
                toks = [e for e in harness.events_of(proxied) if harness.is_token_event(api, e)]
                self.assertEqual(len(toks), 10)
                spread_ms = (toks[-1].ts - toks[0].ts) / 1e6
                self.assertGreaterEqual(spread_ms, 300, "token events bunched together: spread %.1f ms" % spread_ms)
                # Each event came on its own: no two token events in one read.
                gaps = [(b.ts - a.ts) / 1e6 for a, b in zip(toks, toks[1:])]
                self.assertGreater(min(gaps), 20, "gaps %r" % gaps)


if __name__ == "__main__":
    unittest.main()
