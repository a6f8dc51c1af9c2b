"""test_realtime.py — OpenAI-Realtime-style sessions end to end over real
sockets: the npm `ws` client opens /v1/realtime through tokentap to the
simulator (contrib/sim/sim_realtime.c), which answers each response.create
with deltas at its --ttft-ms / --itl-ms (or the handshake's x-sim-*
overrides). For each response tokentap's access log has a line of its own
(api realtime) whose tokens are the simulator's usage, whose token events
are the deltas the client read and whose TTFT is within a few ms of the
client's own. The simulator's handshake, pings, close and its answer to a
second response.create are checked byte-level with a raw socket.
`tokentap-bench --api realtime` (contrib/bench/bench_realtime.c) drives
three sessions through tokentap; its counts and TTFT agree with the log.
The official `openai` npm SDK's OpenAIRealtimeWS, which only speaks wss://,
runs two responses through tokentap's TLS listener."""

import base64
import json
import os
import socket
import struct
import subprocess
import tempfile
import time

import harness
from harness_npm import NodeScript
from test_websocket import accept_key, frame, read_frame, read_until_close

RT = NodeScript("ws-client", ["ws@8.18.0"], "realtime_client.cjs")
# The official SDK's realtime client; it needs the `ws` package beside it.
SDK = NodeScript("npm-openai-realtime", ["openai@5.23.2", "ws@8.18.0"], "realtime_sdk.cjs")
TTFT_MS, ITL_MS, TOKENS = 60, 8, 7


def assert_ttft_inside(test, entry, client_ms):
    """tokentap's TTFT of a response runs from the response.create it
    forwarded to the first delta it forwarded: never shorter than the sim's
    TTFT_MS, never longer than the client's own clock, which starts before
    and stops after it (1 ms for rounding). A one-sided bound: how much
    longer the client's is depends on the client's loop and TLS, not on
    tokentap."""
    test.assertGreaterEqual(entry["ttft_ms"], TTFT_MS - 1, entry)
    test.assertLessEqual(entry["ttft_ms"], client_ms + 1, (entry["ttft_ms"], client_ms))


def raw_session(port, extra=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(("GET /v1/realtime?model=rt-sim HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\n" % key).encode() + extra + b"\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        d = s.recv(1)
        if not d:
            break
        head += d
    return s, key, head


class SimRealtimeTest(harness.TestCase):
    """The simulator's realtime endpoint on its own."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS)

    def test_handshake_ping_events_close(self):
        s, key, head = raw_session(self.sim.port, b"x-sim-tokens: 3\r\nx-sim-ttft-ms: 20\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 101 "), head)
        self.assertIn(("sec-websocket-accept: %s\r\n" % accept_key(key)).encode(), head)
        buf, m = bytearray(), b"\x01\x02\x03\x04"
        op, p = read_frame(s, buf)
        self.assertEqual((op, json.loads(p)["type"]), (1, "session.created"))
        self.assertEqual(json.loads(p)["session"]["model"], "rt-sim")
        s.sendall(frame(9, b"are you there", m))
        self.assertEqual(read_frame(s, buf), (10, b"are you there"))
        create = frame(1, json.dumps({"type": "response.create"}).encode(), m)
        t0 = time.monotonic()
        s.sendall(create + create)  # the second while the first runs: the API's error event
        types, first = [], None
        while not types or types[-1] != "response.done":
            op, p = read_frame(s, buf)
            ev = json.loads(p)
            types.append(ev["type"])
            if ev["type"] == "response.output_text.delta" and first is None:
                first = time.monotonic()
            if ev["type"] == "error":
                self.assertEqual(ev["error"]["code"], "conversation_already_has_active_response")
            if ev["type"] == "response.done":
                done = ev["response"]
        self.assertEqual(types, ["response.created", "response.output_item.added", "response.content_part.added",
                                 "error"] + ["response.output_text.delta"] * 3 +
                         ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.done"])
        self.assertGreaterEqual((first - t0) * 1e3, 20 - 1)
        self.assertEqual((done["status"], done["usage"]["output_tokens"]), ("completed", 3))
        self.assertEqual(done["usage"]["total_tokens"], done["usage"]["input_tokens"] + 3)
        s.sendall(frame(8, struct.pack(">H", 1000) + b"bye", m))
        rest = read_until_close(s)
        s.close()
        self.assertEqual(rest, b"\x88\x02\x03\xe8")  # the code echoed, then EOF

    def test_sim_stats_count_sessions(self):
        def stats_settled(want_aborted):
            for _ in range(100):
                st = self.sim.stats()
                if st["aborted"] == want_aborted and st["requests"] == st["completed"] + st["aborted"]:
                    return st
                time.sleep(0.02)
            self.fail(st)
        st0 = stats_settled(self.sim.stats()["aborted"])
        s, _, _ = raw_session(self.sim.port)
        buf, m = bytearray(), b"\x05\x06\x07\x08"
        read_frame(s, buf)
        s.sendall(frame(1, b'{"type":"response.create"}', m))
        read_frame(s, buf)  # response.created: the response runs
        s.close()  # gone mid-response: aborted
        st1 = stats_settled(st0["aborted"] + 1)
        self.assertEqual(st1["requests"], st0["requests"] + 1)  # /sim/stats is not counted
        s, _, _ = raw_session(self.sim.port)
        read_frame(s, bytearray())
        s.sendall(frame(8, struct.pack(">H", 1000), m))
        read_until_close(s)
        s.close()
        st2 = stats_settled(st1["aborted"])  # a session closed between responses: completed
        self.assertEqual(st2["completed"], st1["completed"] + 1)

    def test_unmasked_frame_1002(self):
        s, _, head = raw_session(self.sim.port)
        buf = bytearray()
        read_frame(s, buf)  # session.created
        s.sendall(frame(1, b'{"type":"response.create"}'))
        op, p = read_frame(s, buf)
        self.assertEqual((op, struct.unpack(">H", p[:2])[0]), (8, 1002))
        s.close()

    def test_plain_get_not_taken(self):
        # without Upgrade the path is an ordinary (unknown) HTTP route
        s = socket.create_connection(("127.0.0.1", self.sim.port), timeout=5)
        s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = read_until_close(s)
        s.close()
        self.assertFalse(got.startswith(b"HTTP/1.1 101"), got[:80])


class RealtimeThroughTokentapTest(harness.TestCase):
    """npm `ws` client -> tokentap -> simulator: two responses measured;
    tokentap-bench --api realtime through the same."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS)
        cls.start_logged(cls.sim.url, "tokentap-realtime-")

    def test_npm_ws_two_responses(self):
        RT.install()
        r = RT("ws://127.0.0.1:%d/v1/realtime?model=rt-sim" % self.tt.port,
               json.dumps({"x-request-id": "it-rt-sim"}), 2)
        self.assertEqual((r.get("code"), r.get("reason")), (1000, ""), r)  # the code echoed, no reason
        self.assertEqual(r["session"]["model"], "rt-sim")
        self.assertEqual(len(r["responses"]), 2)
        for i, c in enumerate(r["responses"], 1):
            self.assertEqual((c["status"], c["deltas"], c["usage"]["output_tokens"]), ("completed", TOKENS, TOKENS))
            e = self.log_entry(self.log, "it-rt-sim/%d" % i)
            self.assertEqual((e["api"], e["method"], e["status"], e["error"]), ("realtime", "WS", 200, None))
            self.assertEqual(e["ttft_from"], "response.create")
            self.assertEqual(e["output_tokens"], c["usage"]["output_tokens"])
            self.assertEqual(e["input_tokens"], c["usage"]["input_tokens"])
            self.assertEqual(e["token_events"], c["deltas"])
            assert_ttft_inside(self, e, c["ttft_ms"])
            # the sim paces deltas to a fixed beat (a late first one is
            # caught up), so tpot is compared with the client's, not --itl-ms
            client_tpot = sum(c["gaps_ms"]) / len(c["gaps_ms"])
            self.assertLess(abs(e["tpot_ms"] - client_tpot), 2, (e["tpot_ms"], client_tpot))
        sess = self.log_entry(self.log, "it-rt-sim")
        self.assertEqual((sess["api"], sess["status"], sess["error"]), ("realtime", 101, None))
        self.assertNotIn("ttft_from", sess)  # a realtime response's key alone

    def test_bench_realtime_sessions(self):
        # tokentap-bench --api realtime: 3 sessions, 12 responses; its
        # figures and tokentap's records of the same responses agree
        js = os.path.join(self.dir, "bench.json")
        p = subprocess.run([harness.bench_bin(), "--url", "http://127.0.0.1:%d" % self.tt.port, "--api", "realtime",
                            "--concurrency", "3", "--requests", "12", "--output-len", "5", "--input-len", "20",
                            "--seed", "3", "--json", js, "--no-progress"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(js) as f:
            d = json.load(f)
        res = d["result"]
        self.assertEqual((res["requests"]["ok"], res["requests"]["failed"]), (12, 0), res)
        self.assertEqual((res["output_tokens"], res["output_tokens_from_usage"]), (60, 12))
        self.assertEqual(res["metrics"]["itl"]["count"], 12 * 4)
        self.assertGreaterEqual(res["metrics"]["ttft"]["p50_ms"], TTFT_MS - 1)
        self.assertGreaterEqual(res["metrics"]["itl"]["p50_ms"], ITL_MS * 0.9)
        run = d["config"]["run_id"]
        ttfts = []
        for sess in range(3):
            for n in range(1, 5):
                e = self.log_entry(self.log, "bench-%s-%d/%d" % (run, sess, n))
                self.assertEqual((e["api"], e["output_tokens"], e["token_events"], e["error"]),
                                 ("realtime", 5, 5, None))
                ttfts.append(e["ttft_ms"])
        ttfts.sort()
        # the bench's clock runs from its send to its read, around tokentap's
        self.assertGreaterEqual(ttfts[len(ttfts) // 2], TTFT_MS - 1)
        self.assertLessEqual(ttfts[len(ttfts) // 2], res["metrics"]["ttft"]["p50_ms"] + 1,
                             (ttfts, res["metrics"]["ttft"]))


class RealtimeSdkTest(harness.TestCase):
    """The official `openai` SDK's OpenAIRealtimeWS. It always connects
    wss:// (buildRealtimeURL sets the scheme), so tokentap listens with TLS
    here, a certificate made for the test, in front of the plain simulator."""

    @classmethod
    def setUpClass(cls):
        from test_tls import make_pki
        cls.dir = tempfile.mkdtemp(prefix="tokentap-rt-sdk-")
        harness._add_cleanup(cls, lambda: __import__("shutil").rmtree(cls.dir, True))
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")
        cls.log = os.path.join(cls.dir, "access.log")
        cls.sim = harness.start_sim(cls, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--access-log", cls.log, "--tls-cert", cls.cert,
                                        "--tls-key", cls.key)

    def test_openai_sdk_realtime_over_wss(self):
        SDK.install()
        # the test's CA for the SDK's node alone: the suite's own
        # NODE_EXTRA_CA_CERTS (the registry's CA, for later npm installs) stays
        r = SDK("https://127.0.0.1:%d/v1" % self.tt.port, "rt-sdk", "it-rt-sdk", 2,
                env={"NODE_EXTRA_CA_CERTS": self.ca})
        self.assertTrue(r["url"].startswith("wss://127.0.0.1:%d/v1/realtime?model=rt-sdk" % self.tt.port), r["url"])
        self.assertEqual((r["code"], r["session"]["model"], len(r["responses"])), (1000, "rt-sdk", 2), r)
        for i, c in enumerate(r["responses"], 1):
            self.assertEqual((c["status"], c["deltas"], c["usage"]["output_tokens"]), ("completed", TOKENS, TOKENS))
            e = self.log_entry(self.log, "it-rt-sdk/%d" % i)
            self.assertEqual((e["api"], e["status"], e["error"], e["ttft_from"]),
                             ("realtime", 200, None, "response.create"))
            self.assertEqual((e["output_tokens"], e["token_events"]), (TOKENS, TOKENS))
            assert_ttft_inside(self, e, c["ttft_ms"])


if __name__ == "__main__":
    harness.unittest.main()
