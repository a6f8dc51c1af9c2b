"""test_deadline.py — a route's first-token deadline (`ttft_deadline`,
docs/config.md): the response head held until the first token, an upstream
with no token in time cancelled and the request answered by another, the
client getting one clean stream; the deadline met, no other upstream left,
a request too large to send again; `-t` on bad values.

Upstreams: `stall` never produces a first token within a test (60 s ttft;
its head goes out at once, as a streaming server's does), `live` answers
at once, `slow` takes 400 ms to its first token, `late` 1.2 s.
"""

import json
import re
import struct
import time
import unittest

import harness
import routing_helpers as rh

DEADLINE_MS = 300
LIVE_TTFT_MS = 30
SLOW_TTFT_MS = 400
LATE_TTFT_MS = 1200
# what a loaded 2-core machine adds to a loopback exchange, at most
SLACK_MS = 500


def body(stream=True, prompt="hi", tokens=None):
    b = {"messages": [{"role": "user", "content": prompt}], "stream": stream}
    if tokens is not None:
        b["max_tokens"] = tokens
    return json.dumps(b, separators=(",", ":")).encode()


def request(port, data, rid, host=None, timeout=10.0):
    """One request on a fresh connection: (Response, ms from the send to the
    head, ms from the send to the first body byte)."""
    headers = [("x-request-id", rid)]
    if host:
        headers.append(("Host", host))
    conn = harness.HttpConn(port, timeout=timeout)
    try:
        t0 = conn.send(harness.request_bytes("POST", rh.CHAT, data, headers, port))
        resp = conn.read_response("POST")
    finally:
        conn.close()
    head_ms = (resp.head_ns - t0) / 1e6
    first_ms = (resp.pieces[0][0] - t0) / 1e6 if resp.pieces else None
    return resp, head_ms, first_ms


def _varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _fields(buf):
    """(field number, wire type, value) of one protobuf message: varints
    as ints, 64-bit fields as 8 bytes, length-delimited ones as bytes."""
    i, out = 0, []
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.append((num, wt, v))
    return out


def proto_counters(body, family):
    """{upstream: value} of counter `family` in a delimited stream of
    io.prometheus.client.MetricFamily messages (name 1, type 3, metric 4;
    a Metric's label 1 {name 1, value 2} and counter 3 {value 1})."""
    i = 0
    while i < len(body):
        n, i = _varint(body, i)
        fam, i = _fields(body[i:i + n]), i + n
        if dict((f, v) for f, _, v in fam if f == 1).get(1) != family.encode():
            continue
        got = {"type": [v for f, _, v in fam if f == 3]}
        for f, _, metric in fam:
            if f != 4:
                continue
            labels, value = {}, None
            for mf, _, mv in _fields(metric):
                if mf == 1:
                    lp = dict((lf, lv) for lf, _, lv in _fields(mv))
                    labels[lp.get(1, b"").decode()] = lp.get(2, b"").decode()
                elif mf == 3:
                    value = struct.unpack("<d", dict((cf, cv) for cf, _, cv in _fields(mv))[1])[0]
            got[labels.get("upstream")] = value
        return got
    return None


CHATTY_BYTES = 300 << 10  # more than the 256 KiB a hold keeps
CHATTY_PAUSE_S = 1.0
EMPTY_DELTA = b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n'


def chatty(sock, req, ctx):
    """An upstream that streams CHATTY_BYTES of events carrying no token,
    pauses, then one token and the end."""
    harness.send_sse_head(sock)
    sent = 0
    for _ in range(CHATTY_BYTES // len(EMPTY_DELTA) + 1):
        harness.send_chunk(sock, EMPTY_DELTA)
        sent += len(EMPTY_DELTA)
    ctx.stop_event.wait(CHATTY_PAUSE_S)
    harness.send_chunk(sock, b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
    harness.send_chunk(sock, b"data: [DONE]\n\n")
    sock.sendall(b"0\r\n\r\n")
    return True


def head_of(resp):
    """What a client reads of the head, without the headers each answer
    makes afresh."""
    return resp.status, resp.header("content-type"), resp.header("transfer-encoding"), resp.header("content-length")


class TestTtftDeadline(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stall = harness.start_sim(cls, "--ttft-ms", "60000", "--model", "stall")
        cls.live = harness.start_sim(cls, "--ttft-ms", LIVE_TTFT_MS, "--itl-ms", "5", "--tokens", "8", "--model",
                                     "live")
        cls.slow = harness.start_sim(cls, "--ttft-ms", SLOW_TTFT_MS, "--itl-ms", "5", "--tokens", "8", "--model",
                                     "slow")
        cls.late = harness.start_sim(cls, "--ttft-ms", LATE_TTFT_MS, "--itl-ms", "5", "--tokens", "8", "--model",
                                     "late")
        cls.chatty = harness.start_fake_upstream(cls, chatty)
        ups = rh.upstreams_yaml({"stall": cls.stall.url, "live": cls.live.url, "slow": cls.slow.url,
                                 "late": cls.late.url, "chatty": cls.chatty.url})
        # Smooth weighted round robin over one worker: 1000 to 1 sends the
        # first few hundred requests of a route to its first upstream.
        cls.tt = rh.start_conf(cls, "override_header: x-tt-upstream\n" + ups + """routes:
  - name: fo
    match: {host: fo.test}
    ttft_deadline: %dms
    split:
      - {upstream: stall, weight: 1000}
      - {upstream: live, weight: 1}
  - name: big
    match: {host: big.test}
    ttft_deadline: %dms
    split:
      - {upstream: late, weight: 1000}
      - {upstream: live, weight: 1}
  - name: alone
    match: {host: alone.test}
    ttft_deadline: %dms
    upstream: late
  - name: met
    match: {host: met.test}
    ttft_deadline: 3s
    upstream: slow
  - name: chatty
    match: {host: chatty.test}
    ttft_deadline: 5s
    upstream: chatty
  - name: plain
    match: {host: plain.test}
    upstream: slow
""" % (DEADLINE_MS, DEADLINE_MS, DEADLINE_MS), "--admin", "127.0.0.1:0", *rh.ONE_WORKER)
        cls.admin = harness.admin_port(cls.tt)

    def log_entry(self, rid):
        got = []

        def find():
            got[:] = [e for e in self.tt.access_log() if e.get("id") == rid]
            return bool(got)

        self.assertTrue(harness.wait_until(find, 5.0, 0.02), "no access log line for %s" % rid)
        return got[0]

    def upstreams(self):
        resp, _ = harness.exchange(self.admin, "GET", "/upstreams")
        self.assertEqual(resp.status, 200)
        return {u["name"]: u for u in resp.json()["upstreams"]}

    def wait_aborted(self, sim, want):
        ok = harness.wait_until(lambda: sim.stats()["aborted"] >= want, 5.0, 0.02)
        self.assertTrue(ok, "the simulator saw %d aborted, wanted %d" % (sim.stats()["aborted"], want))

    def assert_failed_over(self, stream):
        rid = "dl-fo-%s" % ("s" if stream else "n")
        stall0 = self.stall.stats()
        missed0 = self.upstreams()["stall"]["deadline_missed"]
        resp, head_ms, first_ms = request(self.tt.port, body(stream), rid, host="fo.test")
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertTrue(resp.complete)
        # the answer of `live` alone, byte for byte: what it sends the same
        # request directly (the simulator's ids and stamps follow its seed
        # and the request, whose x-request-id is the same)
        direct, dhead_ms, _ = request(self.live.port, body(stream), rid)
        self.assertEqual(resp.body, direct.body)
        self.assertEqual(head_of(resp), head_of(direct))
        self.assertNotIn(b"stall", resp.body)
        # within the deadline and live's own time to its first token
        self.assertGreaterEqual(head_ms, DEADLINE_MS)
        self.assertLess(first_ms, DEADLINE_MS + LIVE_TTFT_MS + SLACK_MS)
        # the stalled upstream had the request, and saw its connection
        # closed: the generation was cancelled, nothing of it finished
        self.assertEqual(self.stall.stats()["requests"] - stall0["requests"], 1)
        self.wait_aborted(self.stall, stall0["aborted"] + 1)
        self.assertEqual(self.stall.stats()["completed"], stall0["completed"])
        e = self.log_entry(rid)
        self.assertEqual(e["upstream"], "live")
        self.assertEqual(e["status"], 200)
        self.assertIsNone(e["error"])
        self.assertEqual(e["deadline_missed"], 1)
        self.assertEqual(e["deadline_failovers"], 1)
        self.assertEqual(e["pick"], "ttft_deadline")
        self.assertEqual(e["bytes_out"] > 0, True)
        ups = self.upstreams()
        self.assertEqual(ups["stall"]["deadline_missed"], missed0 + 1)
        self.assertEqual(ups["stall"]["pool"]["idle"], 0)  # closed, never pooled
        self.assertEqual(ups["stall"]["in_flight"], 0)
        return e

    def test_stalled_upstream_is_left_for_another_streamed(self):
        e = self.assert_failed_over(True)
        self.assertEqual(e["stream"], True)
        self.assertEqual(e["token_events"], 8)
        # tokentap's own ttft is the client's: from arrival, over both
        self.assertGreaterEqual(e["ttft_ms"], DEADLINE_MS)
        self.assertLess(e["upstream_ttft_ms"], LIVE_TTFT_MS + SLACK_MS)

    def test_stalled_upstream_is_left_for_another_not_streamed(self):
        e = self.assert_failed_over(False)
        self.assertEqual(e["stream"], False)

    def test_deadline_met_holds_the_head_until_the_first_token(self):
        rid = "dl-met"
        slow0 = self.slow.stats()
        resp, head_ms, first_ms = request(self.tt.port, body(True), rid, host="met.test")
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        direct, dhead_ms, dfirst_ms = request(self.slow.port, body(True), rid)
        self.assertEqual(resp.body, direct.body)
        self.assertEqual(head_of(resp), head_of(direct))
        # directly, the head comes at once and the first token 400 ms
        # later; through the route, the head comes with the first token
        self.assertLess(dhead_ms, SLOW_TTFT_MS / 2)
        self.assertGreaterEqual(dfirst_ms, SLOW_TTFT_MS)
        self.assertGreaterEqual(head_ms, SLOW_TTFT_MS)
        self.assertLess(first_ms - head_ms, 50)
        e = self.log_entry(rid)
        self.assertEqual(e["upstream"], "slow")
        self.assertEqual(e["deadline_missed"], 0)
        self.assertEqual(e["deadline_failovers"], 0)
        self.assertEqual(self.slow.stats()["requests"] - slow0["requests"], 2)  # this and the direct one
        self.assertEqual(self.slow.stats()["aborted"], slow0["aborted"])
        # tokentap's measures are the upstream's as before: its head came
        # at once, though the client got it with the first token
        self.assertLess(e["timeline_ms"]["resp_headers"], SLOW_TTFT_MS / 2)

    def test_route_without_deadline_sends_the_head_at_once(self):
        rid = "dl-plain"
        resp, head_ms, first_ms = request(self.tt.port, body(True), rid, host="plain.test")
        self.assertEqual(resp.status, 200)
        self.assertLess(head_ms, SLOW_TTFT_MS / 2)
        self.assertGreaterEqual(first_ms, SLOW_TTFT_MS)
        e = self.log_entry(rid)
        self.assertNotIn("deadline_missed", e)
        self.assertNotIn("deadline_failovers", e)

    def test_no_other_upstream_left_it_answers_late(self):
        rid = "dl-alone"
        late0 = self.late.stats()
        missed0 = self.upstreams()["late"]["deadline_missed"]
        resp, head_ms, first_ms = request(self.tt.port, body(True), rid, host="alone.test")
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self.assertIn(b'"model":"late"', resp.body)
        # the hold ends at the deadline: the head then, the tokens when
        # they come
        self.assertGreaterEqual(head_ms, DEADLINE_MS)
        self.assertLess(head_ms, LATE_TTFT_MS - 200)
        self.assertGreaterEqual(first_ms, LATE_TTFT_MS)
        e = self.log_entry(rid)
        self.assertEqual(e["upstream"], "late")
        self.assertEqual((e["deadline_missed"], e["deadline_failovers"]), (1, 0))
        self.assertEqual(self.late.stats()["requests"] - late0["requests"], 1)
        self.assertEqual(self.late.stats()["aborted"], late0["aborted"])
        self.assertEqual(self.upstreams()["late"]["deadline_missed"], missed0 + 1)

    def test_request_too_large_to_keep_is_not_sent_again(self):
        # over the 64 KiB kept for a resend: the deadline only records
        rid = "dl-big"
        late0, live0 = self.late.stats(), self.live.stats()
        resp, head_ms, first_ms = request(self.tt.port, body(True, prompt="x" * (80 << 10)), rid, host="big.test")
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self.assertIn(b'"model":"late"', resp.body)
        self.assertGreaterEqual(first_ms, LATE_TTFT_MS)
        e = self.log_entry(rid)
        self.assertEqual(e["upstream"], "late")
        self.assertEqual((e["deadline_missed"], e["deadline_failovers"]), (1, 0))
        self.assertEqual(self.late.stats()["aborted"], late0["aborted"])
        self.assertEqual(self.live.stats()["requests"], live0["requests"])

    def test_many_at_once_each_gets_one_answer(self):
        n = 8
        stall0, live0 = self.stall.stats(), self.live.stats()
        results = [None] * n

        def one(i):
            results[i] = request(self.tt.port, body(True, prompt="p%d" % i), "dl-many-%d" % i, host="fo.test")

        bg = rh.Background()
        for i in range(n):
            bg.start(one, i)
        for i, r in enumerate(bg.join(20.0)):
            self.assertEqual(r[0], "ok", (i, r))
        for i in range(n):
            resp, head_ms, first_ms = results[i]
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.complete)
            direct, _, _ = request(self.live.port, body(True, prompt="p%d" % i), "dl-many-%d" % i)
            self.assertEqual(resp.body, direct.body, i)
            e = self.log_entry("dl-many-%d" % i)
            self.assertEqual((e["upstream"], e["deadline_missed"], e["deadline_failovers"]), ("live", 1, 1))
        self.assertEqual(self.stall.stats()["requests"] - stall0["requests"], n)
        self.wait_aborted(self.stall, stall0["aborted"] + n)
        self.assertEqual(self.live.stats()["requests"] - live0["requests"], 2 * n)
        self.assertTrue(harness.wait_until(lambda: self.upstreams()["stall"]["in_flight"] == 0, 5.0, 0.05))

    def test_pinned_request_is_not_sent_elsewhere(self):
        rid = "dl-pinned"
        live0 = self.live.stats()
        headers = [("x-request-id", rid), ("Host", "big.test"), ("x-tt-upstream", "late")]
        resp, _ = harness.exchange(self.tt.port, "POST", rh.CHAT, body(True), headers)
        self.assertEqual(resp.status, 200)
        self.assertIn(b'"model":"late"', resp.body)
        e = self.log_entry(rid)
        self.assertEqual((e["upstream"], e["deadline_missed"], e["deadline_failovers"]), ("late", 1, 0))
        self.assertEqual(self.live.stats()["requests"], live0["requests"])

    def test_hold_gives_up_past_the_stream_buffer(self):
        # 300 KiB before any token: forwarded once past the 256 KiB a hold
        # keeps, well before the token, with no miss counted at 5 s
        rid = "dl-chatty"
        resp, head_ms, first_ms = request(self.tt.port, body(True), rid, host="chatty.test")
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self.assertGreater(len(resp.body), CHATTY_BYTES)
        self.assertTrue(resp.body.endswith(b"data: [DONE]\n\n"))
        self.assertLess(head_ms, CHATTY_PAUSE_S * 1000 / 2)
        e = self.log_entry(rid)
        self.assertEqual((e["deadline_missed"], e["deadline_failovers"]), (0, 0))
        self.assertEqual(e["token_events"], 1)
        self.assertGreaterEqual(e["timeline_ms"]["first_token"], CHATTY_PAUSE_S * 1000)

    def test_error_answer_is_not_held(self):
        # the stalled simulator answers an unknown path with a 404 at once:
        # nothing to wait for, forwarded as it comes, no miss
        rid = "dl-404"
        headers = [("x-request-id", rid), ("Host", "fo.test")]
        t0 = time.monotonic()
        resp, _ = harness.exchange(self.tt.port, "POST", "/v1/nothing-here", body(False), headers)
        self.assertEqual(resp.status, 404)
        self.assertLess((time.monotonic() - t0) * 1000, DEADLINE_MS)
        e = self.log_entry(rid)
        self.assertEqual((e["upstream"], e["deadline_missed"], e["deadline_failovers"]), ("stall", 0, 0))

    def test_metrics_and_routes_show_it(self):
        # one failover first, so that the counter is not 0
        self.assert_failed_over(True)
        want = self.upstreams()["stall"]["deadline_missed"]
        resp, _ = harness.exchange(self.admin, "GET", "/metrics")
        self.assertEqual(resp.status, 200)
        text = resp.body.decode()
        self.assertIn("# TYPE tokentap_upstream_deadline_missed_total counter", text)
        m = re.search(r'^tokentap_upstream_deadline_missed_total\{upstream="stall"\} (\d+)$', text, re.M)
        self.assertIsNotNone(m, text[-2000:])
        self.assertEqual(int(m.group(1)), want)
        self.assertRegex(text, r'(?m)^tokentap_upstream_deadline_missed_total\{upstream="live"\} 0$')
        proto = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"
        resp, _ = harness.exchange(self.admin, "GET", "/metrics", headers=[("Accept", proto)])
        self.assertTrue(resp.header("content-type").startswith("application/vnd.google.protobuf"))
        fam = proto_counters(resp.body, "tokentap_upstream_deadline_missed_total")
        self.assertIsNotNone(fam)
        self.assertEqual(fam["type"], [0])  # COUNTER (0 is also the default, left out)
        self.assertEqual((fam["stall"], fam["live"]), (float(want), 0.0))
        resp, _ = harness.exchange(self.admin, "GET", "/routes")
        routes = {r["name"]: r for r in resp.json()["routes"]}
        self.assertEqual(routes["fo"]["ttft_deadline_ms"], DEADLINE_MS)
        self.assertIsNone(routes["plain"]["ttft_deadline_ms"])


class TestTtftDeadlineConfig(unittest.TestCase):
    BASE = """listen: 127.0.0.1:0
upstreams:
  - name: a
    url: http://127.0.0.1:9
routes:
  - name: r
    upstream: a
    ttft_deadline: %s
"""

    def test_bad_values_are_refused(self):
        for value in ("soon", "0", "-5s", "[1]"):
            res, fname = rh.check_config(self.BASE % value)
            self.assertNotEqual(res.returncode, 0, value)
            lines = rh.problem_lines(res, fname)
            self.assertEqual(len(lines), 1, (value, res.stderr))
            self.assertEqual(lines[0][0], 8, (value, lines))
            self.assertIn("routes[0].ttft_deadline", lines[0][1])

    def test_good_value_passes(self):
        res, _ = rh.check_config(self.BASE % "2500ms")
        self.assertEqual(res.returncode, 0, res.stderr)


if __name__ == "__main__":
    unittest.main()
