"""test_realtime_audio.py — audio turns of an OpenAI-Realtime-style session
through tokentap, over real sockets: the npm `ws` client
(realtime_audio_client.cjs) streams input_audio_buffer.append messages to
the simulator's realtime endpoint (contrib/sim/sim_realtime.c) and ends
each turn either itself (input_audio_buffer.commit, then response.create
GAP_MS later) or by going quiet under server VAD (the simulator sends
input_audio_buffer.speech_stopped and .committed and creates the response
itself). Each response's TTFT in tokentap's access log starts where the
user's turn ended — the commit, or speech_stopped — not at the
response.create or the committed event, within a few ms of the client's own
clock (whose start is its send of the commit, or its read of
speech_stopped), and the line's ttft_from says which; the audio and
transcript deltas are its token events, the usage response.done's. A turn
spoken over a running response cancels it (incomplete) and the next one is
timed from its own speech_stopped; with interrupt_response off, a turn that
ends while a response runs is timed from its speech_stopped, the wait for
the running one included. And the same session with the simulator behind
TLS (an https upstream: the tunnel runs over tokentap's TLS client
connection), byte for byte against the same session held with the
simulator directly, also at over a MiB of audio."""

import base64
import json
import os
import socket
import ssl
import shutil
import tempfile
import time

import harness
import routing_helpers as rh
from harness_npm import NodeScript
from test_tls import make_pki
from harness_events import read_access_log
from test_websocket import frame, read_frame

AUDIO = NodeScript("ws-client", ["ws@8.18.0"], "realtime_audio_client.cjs")
TTFT_MS, ITL_MS, TOKENS = 40, 5, 6
CHUNKS = 5  # appends per turn
AUDIO_CHUNK = 2400  # PCM16 bytes the sim sends per output token


def ttft_near_client(test, entry, client_ms, slack_ms=5, client_first=False):
    """tokentap's TTFT and the client's from the same start event: equal but
    for where each one reads (slack_ms either way on a shared machine).
    client_first: the start is the client's own send, which tokentap reads
    after it, and the end tokentap reads before the client: tokentap's is
    never longer (1 ms for rounding)."""
    test.assertLessEqual(abs(entry["ttft_ms"] - client_ms), slack_ms, (entry["ttft_ms"], client_ms))
    if client_first:
        test.assertLessEqual(entry["ttft_ms"], client_ms + 1, (entry["ttft_ms"], client_ms))


# The simulator's TTFT clock under server VAD starts when it queues
# speech_stopped, tokentap's when it reads it: tokentap's may be shorter
# by that delivery's lag.
VAD_LAG_MS = 5


class RealtimeAudioTest(harness.TestCase):
    """npm `ws` client -> tokentap -> simulator, audio in and out."""

    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS)
        cls.start_logged(cls.sim.url, "tokentap-rt-audio-")

    def run_client(self, rid, mode, turns, gap_ms, headers=None):
        AUDIO.install()
        r = AUDIO("ws://127.0.0.1:%d/v1/realtime?model=rt-audio" % self.tt.port,
                  json.dumps(dict(headers or {}, **{"x-request-id": rid})), mode, turns, CHUNKS, gap_ms)
        self.assertEqual(r.get("code"), 1000, r)
        self.assertEqual(len(r["responses"]), turns, r)
        return r["responses"]

    def check_deltas(self, e, c):
        self.assertEqual((c["audio_deltas"], c["transcript_deltas"]), (TOKENS, TOKENS), c)
        self.assertEqual(c["audio_bytes"], TOKENS * AUDIO_CHUNK)
        self.assertEqual(e["token_events"], c["audio_deltas"] + c["transcript_deltas"])
        self.assertEqual((e["output_tokens"], e["input_tokens"]),
                         (c["usage"]["output_tokens"], c["usage"]["input_tokens"]))
        self.assertEqual(c["usage"]["output_token_details"], {"audio_tokens": TOKENS, "text_tokens": TOKENS})
        self.assertGreater(c["usage"]["input_token_details"]["audio_tokens"], 0)

    def test_manual_commit_starts_the_ttft(self):
        gap = 80  # between the committed event and the response.create
        for i, c in enumerate(self.run_client("it-rta-manual", "manual", 2, gap), 1):
            e = self.log_entry(self.log, "it-rta-manual/%d" % i)
            self.assertEqual((e["api"], e["status"], e["error"], c["status"]), ("realtime", 200, None, "completed"))
            self.assertEqual(e["ttft_from"], "input_audio_buffer.commit")
            self.check_deltas(e, c)
            # the commit, not the response.create: the gap is in it
            self.assertGreaterEqual(e["ttft_ms"], gap + TTFT_MS - 1, e)
            ttft_near_client(self, e, c["first"] - c["commit_sent"], client_first=True)
            # longer than the client's clock from its response.create by
            # the gap at least (its timer fires late, never early)
            self.assertGreaterEqual(e["ttft_ms"], c["first"] - c["create_sent"] + gap - 5, e)

    def test_server_vad_speech_stopped_starts_the_ttft(self):
        silence = 60  # the VAD's silence_duration_ms
        for i, c in enumerate(self.run_client("it-rta-vad", "vad", 2, silence), 1):
            e = self.log_entry(self.log, "it-rta-vad/%d" % i)
            self.assertEqual((e["api"], e["status"], e["error"], c["status"]), ("realtime", 200, None, "completed"))
            self.assertEqual(e["ttft_from"], "input_audio_buffer.speech_stopped")
            self.check_deltas(e, c)
            self.assertGreaterEqual(e["ttft_ms"], TTFT_MS - VAD_LAG_MS, e)
            ttft_near_client(self, e, c["first"] - c["speech_stopped"])
            self.assertLessEqual(c["speech_stopped"], c["committed"])

    def test_barge_in_cancels_and_the_next_turn_is_timed_from_its_end(self):
        r = self.run_client("it-rta-barge", "barge", 2, 60)
        first, second = r
        self.assertEqual((first["status"], second["status"]), ("cancelled", "completed"))
        e1 = self.log_entry(self.log, "it-rta-barge/1")
        self.assertEqual((e1["error"], e1["ttft_from"]), ("response_incomplete", "input_audio_buffer.speech_stopped"))
        self.assertEqual(e1["token_events"], first["audio_deltas"] + first["transcript_deltas"])
        e2 = self.log_entry(self.log, "it-rta-barge/2")
        self.assertEqual((e2["error"], e2["ttft_from"]), (None, "input_audio_buffer.speech_stopped"))
        self.check_deltas(e2, second)
        ttft_near_client(self, e2, second["first"] - second["speech_stopped"])

    def test_turn_ended_during_a_response_times_the_next_from_its_end(self):
        # interrupt_response false: the second turn ends (speech_stopped)
        # while the first response still runs; its response waits for
        # that one, and the wait is in its TTFT
        itl = 30
        first, second = self.run_client("it-rta-queue", "queue", 2, 20, {"x-sim-itl-ms": str(itl)})
        self.assertEqual((first["status"], second["status"]), ("completed", "completed"))
        self.assertLess(second["speech_stopped"], first["first"] + (TOKENS - 1) * itl)  # during the first
        e1 = self.log_entry(self.log, "it-rta-queue/1")
        self.assertEqual((e1["error"], e1["token_events"]), (None, 2 * TOKENS))
        e2 = self.log_entry(self.log, "it-rta-queue/2")
        self.assertEqual((e2["error"], e2["ttft_from"]), (None, "input_audio_buffer.speech_stopped"))
        self.check_deltas(e2, second)
        ttft_near_client(self, e2, second["first"] - second["speech_stopped"])
        self.assertGreater(e2["ttft_ms"], TTFT_MS + itl)

    def raw(self, rid):
        """A session through tokentap on a raw socket, past session.created:
        (socket, its read buffer)."""
        s = socket.create_connection(("127.0.0.1", self.tt.port), timeout=5)
        self.addCleanup(s.close)
        s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  b"x-request-id: %s\r\n\r\n" % rid.encode())
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            d = s.recv(4096)
            if not d:
                self.fail(bytes(buf))
            buf.extend(d)
        del buf[:buf.index(b"\r\n\r\n") + 4]
        self.assertEqual(json.loads(read_frame(s, buf)[1])["type"], "session.created")
        return s, buf

    def until(self, s, buf, t):
        while True:
            ev = json.loads(read_frame(s, buf)[1])
            if ev["type"] == t:
                return ev

    def test_text_response_create_starts_the_ttft(self):
        # a text turn: no audio, the response.create is the start
        s, buf = self.raw("it-rta-text")
        s.sendall(frame(1, b'{"type":"response.create"}', b"\x01\x02\x03\x04"))
        self.until(s, buf, "response.done")
        e = self.log_entry(self.log, "it-rta-text/1")
        self.assertEqual((e["ttft_from"], e["token_events"], e["output_tokens"]), ("response.create", TOKENS, TOKENS))

    def test_the_last_commit_before_the_response_starts_it(self):
        # two audio turns committed before one response.create: the turn
        # the response answers ended at the second commit
        s, buf = self.raw("it-rta-twocommits")
        m = b"\x01\x02\x03\x04"
        append = frame(1, json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(b"\x01" * 960).decode()}).encode(), m)
        commit = frame(1, b'{"type":"input_audio_buffer.commit"}', m)
        s.sendall(append + commit)
        self.until(s, buf, "input_audio_buffer.committed")
        time.sleep(0.1)  # the stimulus: the second turn comes 100 ms later
        t2 = time.monotonic()
        s.sendall(append + commit)
        self.until(s, buf, "input_audio_buffer.committed")
        s.sendall(frame(1, b'{"type":"response.create"}', m))
        self.until(s, buf, "response.output_text.delta")
        client_ms = (time.monotonic() - t2) * 1e3
        self.until(s, buf, "response.done")
        e = self.log_entry(self.log, "it-rta-twocommits/1")
        self.assertEqual((e["ttft_from"], e["error"]), ("input_audio_buffer.commit", None))
        self.assertGreaterEqual(e["ttft_ms"], TTFT_MS - 1)
        self.assertLessEqual(e["ttft_ms"], client_ms + 1, (e["ttft_ms"], client_ms))

    def test_refused_commit_is_no_start(self):
        # a commit of an empty buffer gets an error: the response the
        # client then asks for starts at its response.create, and is /1
        s, buf = self.raw("it-rta-refused")
        m = b"\x01\x02\x03\x04"
        s.sendall(frame(1, b'{"type":"input_audio_buffer.commit"}', m))
        self.assertEqual(self.until(s, buf, "error")["error"]["code"], "input_audio_buffer_commit_empty")
        s.sendall(frame(1, b'{"type":"response.create"}', m))
        self.until(s, buf, "response.done")
        s.sendall(frame(8, b"\x03\xe8", m))
        e = self.log_entry(self.log, "it-rta-refused/1")
        self.assertEqual((e["ttft_from"], e["error"], e["token_events"]), ("response.create", None, TOKENS))
        sess = self.log_entry(self.log, "it-rta-refused")
        self.assertEqual(sess["status"], 101)
        # the session's line comes after its responses': no second one
        self.assertNotIn("it-rta-refused/2", [x.get("id") for x in read_access_log(self.log)])


def tls_session(port, ctx, rid, extra=""):
    """A raw session with the simulator's TLS listener (or plain, ctx None):
    a VAD turn and a text turn (`extra`: more handshake header lines);
    returns every byte after the 101."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    s = ctx.wrap_socket(raw, server_hostname="localhost") if ctx else raw
    m = b"\x0a\x0b\x0c\x0d"
    try:
        s.sendall(("GET /v1/realtime?model=rt-tls HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
                   "dGhlIHNhbXBsZSBub25jZQ==\r\nx-request-id: %s\r\n%s\r\n" % (rid, extra)).encode())
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            d = s.recv(4096)
            if not d:
                raise EOFError(bytes(buf))
            buf.extend(d)
        del buf[:buf.index(b"\r\n\r\n") + 4]
        got = []

        def until(t):
            while True:
                op, p = read_frame(s, buf)
                got.append(frame(op, p))
                if json.loads(p)["type"] == t:
                    return

        until("session.created")
        s.sendall(frame(1, json.dumps({"type": "session.update", "session": {
            "output_modalities": ["audio"],
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 30}}}}}).encode(), m))
        until("session.updated")
        chunk = base64.b64encode(b"\x05" * 960).decode()
        s.sendall(b"".join(frame(1, json.dumps({"type": "input_audio_buffer.append", "audio": chunk}).encode(), m)
                           for _ in range(CHUNKS)))
        until("response.done")
        s.sendall(frame(1, b'{"type":"response.create","response":{"output_modalities":["text"]}}', m))
        until("response.done")
        s.sendall(frame(8, b"\x03\xe8", m))
        op, p = read_frame(s, buf)
        got.append(frame(op, p))
        return b"".join(got)
    finally:
        s.close()


class RealtimeTlsUpstreamTest(harness.TestCase):
    """A realtime session to an https upstream: the simulator's own TLS
    listener (--tls-cert, --tls-key), tokentap's upstream `https://` with
    the test CA."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-rt-tls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")
        cls.sim = harness.start_sim(cls, "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS, "--tokens", TOKENS,
                                    "--tls-cert", cls.cert, "--tls-key", cls.key)
        cls.tt = rh.start_conf(cls, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                               "    tls: {ca_file: %s}\n" % (cls.sim.port, cls.ca))
        cls.log = cls.tt.log_path

    def test_session_byte_exact_and_measured(self):
        ctx = ssl.create_default_context(cafile=self.ca)
        direct = tls_session(self.sim.port, ctx, "it-rt-tls-direct")
        through = tls_session(self.tt.port, None, "it-rt-tls")
        self.assertEqual(through, direct)  # the simulator's bytes are a function of the session
        self.assertIn(b"response.output_audio.delta", through)
        vad = self.log_entry(self.log, "it-rt-tls/1")
        self.assertEqual((vad["api"], vad["upstream"], vad["error"], vad["ttft_from"]),
                         ("realtime", "secure", None, "input_audio_buffer.speech_stopped"))
        self.assertEqual((vad["token_events"], vad["output_tokens"]), (2 * TOKENS, 2 * TOKENS))
        self.assertGreaterEqual(vad["ttft_ms"], TTFT_MS - VAD_LAG_MS)
        text = self.log_entry(self.log, "it-rt-tls/2")
        self.assertEqual((text["ttft_from"], text["token_events"], text["output_tokens"]),
                         ("response.create", TOKENS, TOKENS))
        sess = self.log_entry(self.log, "it-rt-tls")
        self.assertEqual((sess["status"], sess["error"], sess["upstream"]), (101, None, "secure"))

    def test_megabytes_byte_exact(self):
        # 500 tokens at itl 0: over a MiB of audio deltas, more than the
        # tunnel buffers for one side (backpressure), over TLS records
        n = 500
        extra = "x-sim-tokens: %d\r\nx-sim-itl-ms: 0\r\n" % n
        direct = tls_session(self.sim.port, ssl.create_default_context(cafile=self.ca), "it-rt-tls-big-d", extra)
        through = tls_session(self.tt.port, None, "it-rt-tls-big", extra)
        self.assertGreater(len(through), 1 << 20)
        self.assertEqual(through, direct)
        vad = self.log_entry(self.log, "it-rt-tls-big/1")
        self.assertEqual((vad["error"], vad["token_events"], vad["output_tokens"]), (None, 2 * n, 2 * n))
        self.assertEqual(self.log_entry(self.log, "it-rt-tls-big/2")["token_events"], n)


if __name__ == "__main__":
    harness.unittest.main()
