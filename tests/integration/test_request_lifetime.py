"""A request's lifetime on its client connection: pipelined requests wait in
the client's input while the one before runs, and the next begins inside the
call that finished the one before (the upstream's read callback, or the
client's write callback when a paused stream resumes). The code that runs
after such a call tells whether its request is still the running one by the
request's number on the connection, not by its address: the next request is
allocated at once, and malloc hands it the block just freed (29 of 30 in
the first test, measured on a plain build). No path was found where the
old address comparison misbehaved from outside (see the commit that made
the change); these tests pin that every pipelined request gets its own
answer, in order, once, and is logged once."""

import json
import time
import unittest

import harness

CHAT = "/v1/chat/completions"


def echo_answer(sock, req, ctx):
    """Answers with the request's id and body, so that a crossed exchange
    shows; `x-size` asks for that many bytes of padding."""
    pad = int(req.header("x-size", "0"))
    body = json.dumps({"id": req.header("x-request-id"), "body": req.body.decode(), "pad": "x" * pad}).encode()
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                 % (len(body), body))
    return True


class PipelinedTest(harness.TestCase):
    def setUp(self):
        self.up = harness.start_fake_upstream(self, echo_answer)
        self.log = harness.temp_path(self)
        # one worker: every request runs on the same loop (and allocator arena)
        self.tt = harness.start_tokentap(self, self.up.url, "--access-log", self.log, "--workers", "1")

    def request(self, i, size=0):
        body = {"messages": [{"role": "user", "content": "request %d " % i + "y" * (i * 37 % 500)}]}
        return harness.request_bytes("POST", CHAT, body, [("x-request-id", "pl-%d" % i), ("x-size", str(size))],
                                     self.tt.port), json.dumps(body, separators=(",", ":"))

    def check_answers(self, conn, sent):
        for i, body in enumerate(sent):
            resp = conn.read_response()
            self.assertIsNotNone(resp, "no answer to pipelined request %d" % i)
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:300]))
            self.assertTrue(resp.complete)
            got = resp.json()
            self.assertEqual((got["id"], got["body"]), ("pl-%d" % i, body), "answer %d is another request's" % i)
        with self.up.lock:
            ids = [r.header("x-request-id") for r in self.up.requests]
        self.assertEqual(ids, ["pl-%d" % i for i in range(len(sent))], "the upstream saw them out of order or twice")
        for i in range(len(sent)):
            e = harness.wait_log_entry(self.log, lambda e, i=i: e.get("id") == "pl-%d" % i)
            self.assertIsNotNone(e, "request %d not logged" % i)
            self.assertEqual((e["status"], e["error"]), (200, None))
        self.assertEqual(len(harness.read_access_log(self.log)), len(sent), "a request was logged twice")

    def test_next_request_begins_in_the_upstream_read_callback(self):
        """30 requests in one write: each response ends in the upstream's
        read callback, which finishes the request and begins the next."""
        n = 30
        reqs = [self.request(i) for i in range(n)]
        conn = harness.HttpConn(self.tt.port)
        self.addCleanup(conn.close)
        conn.send(b"".join(r for r, _ in reqs))
        self.check_answers(conn, [b for _, b in reqs])
        self.assertEqual(self.up.accepted, 1, "the pooled connection was not reused")

    def test_next_request_begins_when_a_paused_response_resumes(self):
        """The first answer is far larger than the stream buffer and the
        client does not read for a while: reading the upstream pauses, the
        client's write callback resumes it (and would end the response there
        with bytes that arrived meanwhile), and the second request, pipelined
        behind, begins when the first ends."""
        first, body0 = self.request(0, size=4 << 20)
        second, body1 = self.request(1)
        conn = harness.HttpConn(self.tt.port, rcvbuf=16384)
        self.addCleanup(conn.close)
        conn.send(first + second)
        time.sleep(0.3)  # tokentap's output to this client fills up
        self.check_answers(conn, [body0, body1])


# what differs between two runs of one request: its times, its id, the
# connection's log id, the keys derived from the clock
VARYING = {"id", "ts", "time", "conn", "timeline_ms", "itl_ms", "decode_tps", "trace_id", "span_id"}


def comparable(e):
    return {k: v for k, v in e.items() if k not in VARYING and not k.endswith("_ms")}


class KeptConnectionTest(harness.TestCase):
    """A connection's next request is made in the memory of the one before
    (request_recycle): each request of a kept connection is logged exactly
    as the same request on a connection of its own, with nothing of the
    request before it (its model, id, tenant, trace, usage, route)."""

    def setUp(self):
        self.sim = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--seed", "7")
        self.log = harness.temp_path(self)
        self.tt = harness.start_tokentap(self, self.sim.url, "--access-log", self.log, "--workers", "1")

    def plan(self):
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        return [
            ("openai-chat", dict(stream=True, include_usage=True, model="model-a"), 5,
             [("traceparent", tp), ("x-tenant", "t1")]),
            ("anthropic", dict(stream=False, model="model-b"), 7, []),
            ("openai-completions", dict(stream=True, include_usage=False, model="m"), 3, []),
            ("openai-chat", dict(stream=False, model="model-c" + "x" * 100), 1, [("traceparent", tp)]),
            ("ollama-generate", dict(stream=True), 9, []),
            ("openai-chat", dict(stream=True, include_usage=True), 2, []),
        ]

    def send(self, conn, i, tag, api, kw, tokens, extra):
        rid = "%s-%d" % (tag, i)
        headers = harness.sim_headers(ttft=0, itl=0, tokens=tokens, request_id=rid, extra=extra)
        raw = harness.request_bytes("POST", harness.API_PATHS[api], harness.api_body(api, **kw), headers,
                                    self.tt.port)
        conn.send(raw)
        resp = conn.read_response()
        self.assertIsNotNone(resp, "request %s: no answer" % rid)
        self.assertEqual(resp.status, 200, "request %s: %r" % (rid, resp.body[:300]))
        return rid

    def test_each_request_logged_as_on_its_own_connection(self):
        plan = self.plan()
        kept = harness.HttpConn(self.tt.port)
        self.addCleanup(kept.close)
        on_kept = [self.send(kept, i, "kept", *p) for i, p in enumerate(plan)]
        alone = []
        for i, p in enumerate(plan):
            conn = harness.HttpConn(self.tt.port)
            try:
                alone.append(self.send(conn, i, "solo", *p))  # an id of the same length
            finally:
                conn.close()
        for i, (a, b) in enumerate(zip(on_kept, alone)):
            ea, eb = self.log_entry(self.log, a), self.log_entry(self.log, b)
            self.assertEqual(comparable(ea), comparable(eb), "request %d on the kept connection" % i)
            self.assertEqual("trace_id" in ea, "trace_id" in eb, "request %d: a trace of another request" % i)


if __name__ == "__main__":
    unittest.main()
