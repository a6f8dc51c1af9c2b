"""test_sim_batching.py — tokentap-sim's continuous-batching model
(--batching, docs/simulator.md "Batching model"): ttft and itl follow the
step formulas, a full batch makes requests queue, batching raises
throughput sub-linearly, a long prefill stalls running streams unless it is
chunked, a stalled reader neither holds up the batch nor grows memory, and
the output text stays a pure function of the seed and the request.

Parameters are small and round so that the expected times are easy to read:
step = 10 ms + 2 ms per sequence, prefill 10,000 tokens/s (0.1 ms a token).
Timestamps are the kernel's receive times (HttpConn kernel_ts), so a busy
test process does not shift them; but a read that returns several events
(segments that queued while this process was not running are merged under
the newest one's stamp) stamps the earlier ones late, so gaps are measured
between exactly stamped events only (harness.read_ends, Result.exact).
"""

import threading
import time
import unittest

import harness

API = "openai-chat"
PATH = harness.API_PATHS[API]
BASE_MS = 10.0
PER_SEQ_MS = 2.0
PREFILL_TPS = 10000.0
MODEL = ["--batching", "--step-base-ms", "10", "--step-per-seq-ms", "2",
         "--prefill-tps", "10000"]


def step_ms(batch, prefill_tokens=0):
    return BASE_MS + PER_SEQ_MS * batch + prefill_tokens * 1000.0 / PREFILL_TPS


def body(tokens, prompt_bytes=400, stream=True, tag=""):
    """A chat request of exactly prompt_bytes / 4 prompt tokens."""
    b = harness.api_body(API, stream=stream, prompt=(tag + "x" * prompt_bytes)[:prompt_bytes])
    b["max_tokens"] = tokens
    return b


class Result:
    def __init__(self):
        self.sent_ns = None
        self.resp = None
        self.token_ts = []
        self.exact = []  # per token event: stamped with its own arrival
        self.stamps = []  # every read's stamp, in order
        self.text = ""
        self.error = None

    @property
    def ttft_ms(self):
        return (self.token_ts[0] - self.sent_ns) / 1e6

    @property
    def e2e_ms(self):
        return (self.token_ts[-1] - self.sent_ns) / 1e6

    @property
    def gaps_ms(self):
        """Gaps between consecutive token events both stamped exactly."""
        return [gap for gap, _ in self.gaps_at()]

    def gaps_at(self):
        """(gap ms, arrival ns of its end) for each gap between consecutive
        token events both stamped exactly."""
        ts, ex = self.token_ts, self.exact
        return [((ts[i + 1] - ts[i]) / 1e6, ts[i + 1]) for i in range(len(ts) - 1) if ex[i] and ex[i + 1]]

    def arrived_after(self, j):
        """The earliest token event j can have arrived: its stamp when exact,
        else just after the previous read's stamp."""
        if self.exact[j]:
            return self.token_ts[j]
        before = [t for t in self.stamps if t < self.token_ts[j]]
        return before[-1] if before else self.sent_ns

    def gap_bounds_ms(self, i):
        """(least, most) the gap between token events i and i + 1 can have
        been: an event not stamped exactly arrived after the previous read's
        stamp and at or before its own."""
        return ((self.arrived_after(i + 1) - self.token_ts[i]) / 1e6,
                (self.token_ts[i + 1] - self.arrived_after(i)) / 1e6)

    def ttft_bounds_ms(self):
        return ((self.arrived_after(0) - self.sent_ns) / 1e6, self.ttft_ms)

    def mean_gap_ms(self):
        """The mean gap from the first to the last exactly stamped token event
        (None with fewer than two)."""
        idx = [i for i, x in enumerate(self.exact) if x]
        if len(idx) < 2:
            return None
        return (self.token_ts[idx[-1]] - self.token_ts[idx[0]]) / 1e6 / (idx[-1] - idx[0])


def assert_near(test, bounds, want, delta, what):
    """`want` within `delta` of the interval `bounds` the client measured."""
    lo, hi = bounds
    test.assertTrue(lo - delta <= want <= hi + delta,
                    "%s: measured %.2f..%.2f ms, model %.2f ms (within %.1f)" % (what, lo, hi, want, delta))


def finish(res, conn):
    """Reads the response on conn into res (in the calling thread)."""
    try:
        res.resp = conn.read_response()
        evs = [e for e in harness.events_of(res.resp) if harness.is_token_event(API, e)]
        ends = harness.read_ends(res.resp)
        res.token_ts = [e.ts for e in evs]
        res.exact = [ends.get(e.ts) == e.end for e in evs]
        res.stamps = sorted(ends)
        res.text = "".join(e.json()["choices"][0]["delta"].get("content", "") for e in evs)
    except Exception as exc:  # reported by the test thread
        res.error = exc
    finally:
        conn.close()


def start(port, b, headers=None):
    """Connects, sends, and reads in a thread; returns (Result, thread)."""
    res = Result()
    conn = harness.HttpConn(port, kernel_ts=True)
    res.sent_ns = conn.send(harness.request_bytes("POST", PATH, b, headers or []))
    t = threading.Thread(target=finish, args=(res, conn), daemon=True)
    t.start()
    return res, t


def wait_all(test, pairs):
    for res, t in pairs:
        t.join(harness.IO_TIMEOUT_S * 2)
        test.assertFalse(t.is_alive(), "a response did not finish")
        test.assertIsNone(res.error, "reading a response failed: %r" % res.error)
        test.assertEqual(res.resp.status, 200)
        test.assertTrue(res.resp.complete)
    return [res for res, _ in pairs]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


class SimBatchingTest(harness.TestCase):
    def test_1_single_request_timing(self):
        sim = harness.start_sim(self, *MODEL)
        # 400 bytes: 100 prompt tokens, 10 ms of prefill.
        res = wait_all(self, [start(sim.port, body(20))])[0]
        self.assertEqual(len(res.token_ts), 20)
        want_ttft = step_ms(1, 100)  # prefill + one step at batch 1 = 22 ms
        assert_near(self, res.ttft_bounds_ms(), want_ttft, 4.0, "ttft")
        itl = median(res.gaps_ms)
        self.assertAlmostEqual(itl, step_ms(1), delta=1.5,
                               msg="itl p50 %.2f ms, model %.2f ms; gaps %r"
                               % (itl, step_ms(1), res.gaps_ms))
        # Mean gap too: the steps run back to back, no drift accumulates.
        mean = res.mean_gap_ms()
        self.assertIsNotNone(mean, "fewer than two token events stamped exactly")
        self.assertAlmostEqual(mean, step_ms(1), delta=1.0)
        st = sim.stats()["batch"]
        self.assertEqual((st["running"], st["queued"], st["kv_used"]), (0, 0, 0))
        self.assertEqual(st["generated"], 20)
        self.assertEqual(st["prefilled"], 100)

    def test_2_full_batch_queues(self):
        # A cold start holds the first request for 100 ms, so all eight
        # arrive before the first step and the batch fills in FIFO order.
        sim = harness.start_sim(self, *MODEL, "--max-batch", "4", "--cold-start-ms", "100")
        pairs = [start(sim.port, body(15, tag="r%d " % i)) for i in range(8)]
        res = wait_all(self, pairs)
        for r in res:
            self.assertEqual(len(r.token_ts), 15)
        first, last = res[:4], res[4:]
        # Absolute times (ms after the first request was sent): the eight
        # sends are spread over a few ms, the model's events are not.
        t0 = res[0].sent_ns

        def at(ns):
            return (ns - t0) / 1e6

        # (earliest, latest) each first and last token can have arrived
        first_tok = [(at(r.arrived_after(0)), at(r.token_ts[0])) for r in res]
        last_tok = [(at(r.arrived_after(14)), at(r.token_ts[-1])) for r in res]
        detail = "first tokens at %r, last at %r (ms)" % ([round(hi, 1) for _, hi in first_tok],
                                                        [round(hi, 1) for _, hi in last_tok])
        # The first four share the first step: cold start + 4 prefills + step(4).
        for x in first_tok[:4]:
            assert_near(self, x, 100 + step_ms(4, 400), 5.0, detail)
        # The last four wait in the queue: they are admitted only when the
        # first four finish, so their ttft is about the first four's e2e plus
        # the step that prefills them.
        done = (max(lo for lo, _ in last_tok[:4]), max(hi for _, hi in last_tok[:4]))
        for r, x in zip(last, first_tok[4:]):
            self.assertGreater(x[1], done[0], detail)
            assert_near(self, (x[0] - done[1], x[1] - done[0]), step_ms(4, 400), 5.0, detail)
            self.assertGreater(r.ttft_ms, min((f.arrived_after(14) - f.sent_ns) / 1e6 for f in first), detail)
        st = sim.stats()["batch"]
        self.assertEqual(st["cold_starts"], 1)
        self.assertEqual(st["admitted"], 8)

    def test_3_throughput_rises_sublinearly(self):
        sim = harness.start_sim(self, *MODEL)
        tokens = 40

        def throughput(n):
            pairs = [start(sim.port, body(tokens, tag="c%d-%d " % (n, i))) for i in range(n)]
            res = wait_all(self, pairs)
            t0 = min(r.sent_ns for r in res)
            t1 = max(r.token_ts[-1] for r in res)
            return n * tokens / ((t1 - t0) / 1e9)

        one = throughput(1)
        eight = throughput(8)
        # Model: 1 / 12 ms = 83 tokens/s alone; 8 / 26 ms = 308 tokens/s.
        self.assertGreater(eight, 1.5 * one, "1: %.0f tokens/s, 8: %.0f tokens/s" % (one, eight))
        self.assertLess(eight, 8 * one, "1: %.0f tokens/s, 8: %.0f tokens/s" % (one, eight))
        self.assertAlmostEqual(one, 1000.0 * tokens / (step_ms(1, 100) + (tokens - 1) * step_ms(1)),
                               delta=0.1 * one)

    def _stall(self, *extra):
        """Stream A runs alone; 150 ms in, B arrives with a 2,000-token
        prompt (200 ms of prefill). Returns (the bounds of A's gaps while B
        was being prefilled, as (least, most) ms, A, B)."""
        sim = harness.start_sim(self, *MODEL, *extra)
        a = start(sim.port, body(60, tag="A "))
        time.sleep(0.15)
        b = start(sim.port, body(5, prompt_bytes=8000, tag="B "))
        ra, rb = wait_all(self, [a, b])
        self.assertEqual(len(ra.token_ts), 60)
        # Only the gaps while B was being prefilled matter.
        gaps = [ra.gap_bounds_ms(i) for i in range(59) if ra.token_ts[i + 1] > rb.sent_ns]
        return gaps, ra, rb

    def test_4a_prefill_stalls_decode(self):
        gaps, ra, rb = self._stall()
        # The step that admits B takes the decode of A and B plus B's whole
        # prefill: A's next token waits about 200 ms longer than usual.
        want = step_ms(2, 2000)
        lo, hi = max(gaps, key=lambda g: g[1])
        self.assertTrue(lo - 6.0 <= want <= hi + 6.0,
                        "A's longest gap %.1f..%.1f ms, model %.1f ms" % (lo, hi, want))
        assert_near(self, rb.ttft_bounds_ms(), want, step_ms(1) + 6.0, "B's ttft")

    def test_4b_chunked_prefill_bounds_the_stall(self):
        gaps, ra, rb = self._stall("--chunked-prefill", "100")
        # 100 prefill tokens a step: 10 ms; A's gap stays one step plus
        # one chunk, and B's prefill spreads over 20 steps.
        bound = step_ms(2, 100)
        worst = max(lo for lo, _ in gaps)  # no gap surely longer
        self.assertLess(worst, bound + 4.0, "A's longest gap at least %.1f ms, bound %.1f ms" % (worst, bound))
        self.assertGreater(rb.ttft_ms, 19 * step_ms(1, 100) - 5.0, "B's ttft %.1f ms" % rb.ttft_ms)

    def test_5_same_seed_same_text(self):
        texts = []
        for seed in ("7", "7", "8"):
            sim = harness.start_sim(self, *MODEL, "--seed", seed, "--step-base-ms", "1")
            # Alone, then inside a busy batch: the text must not change.
            alone = wait_all(self, [start(sim.port, body(30, tag="same "))])[0]
            pairs = [start(sim.port, body(30, tag="same " if i == 2 else "other%d " % i)) for i in range(5)]
            busy = wait_all(self, pairs)[2]
            self.assertEqual(alone.text, busy.text)
            self.assertEqual(alone.resp.body, busy.resp.body)
            texts.append(alone.text)
        self.assertEqual(texts[0], texts[1])
        self.assertNotEqual(texts[0], texts[2])

    def test_6_fixed_timing_headers_bypass_the_batch(self):
        sim = harness.start_sim(self, *MODEL, "--max-batch", "1")
        # The batch is busy for ~500 ms with one long stream...
        busy = start(sim.port, body(40, tag="busy "))
        time.sleep(0.05)
        # ...yet a request asking for fixed timing gets exactly that.
        fixed = start(sim.port, body(10, tag="fixed "), harness.sim_headers(ttft=30, itl=5))
        rb, rf = wait_all(self, [busy, fixed])
        assert_near(self, rf.ttft_bounds_ms(), 30, 3.0, "ttft")
        mean = rf.mean_gap_ms()
        self.assertIsNotNone(mean, "fewer than two token events stamped exactly")
        self.assertAlmostEqual(mean, 5, delta=1.0)
        self.assertEqual(len(rb.token_ts), 40)

    def test_7_non_streaming_and_usage(self):
        sim = harness.start_sim(self, *MODEL)
        conn = harness.HttpConn(sim.port)
        self.addCleanup(conn.close)
        t0 = conn.send(harness.request_bytes("POST", PATH, body(10, stream=False)))
        resp = conn.read_response()
        took = (resp.pieces[-1][0] - t0) / 1e6
        self.assertEqual(resp.status, 200)
        obj = resp.json()
        self.assertEqual(obj["usage"], {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110})
        want = step_ms(1, 100) + 9 * step_ms(1)
        self.assertAlmostEqual(took, want, delta=8.0)

    def test_8_stalled_reader_is_dropped_not_waited_for(self):
        # 0.1 ms steps: the socket buffers (a few MB on loopback) and the
        # 64 KiB output buffer fill within about a second, then 300 more
        # tokens pile up unsent and the reader is dropped.
        sim = harness.start_sim(self, *MODEL, "--step-base-ms", "0.1", "--step-per-seq-ms", "0",
                                "--backlog-tokens", "300", "--kv-tokens", "2000000")
        stuck = harness.HttpConn(sim.port, rcvbuf=4096)
        self.addCleanup(stuck.close)
        stuck.send(harness.request_bytes("POST", PATH, body(1000000, tag="stuck ")))
        # Meanwhile another stream in the same batch runs at full speed.
        time.sleep(0.3)
        other = wait_all(self, [start(sim.port, body(200, tag="other "))])[0]
        # every gap, merged reads included: at 0.1 ms a step few reads
        # hold one event, and a merged read only shortens gaps
        raw = [(b - a) / 1e6 for a, b in zip(other.token_ts, other.token_ts[1:])]
        self.assertLess(median(raw), 1.0)
        self.assertTrue(harness.wait_until(lambda: sim.stats()["batch"]["dropped"] == 1, timeout=10.0),
                        "the stalled reader was not dropped: %r" % sim.stats())
        st = sim.stats()
        self.assertEqual(st["aborted"], 1)
        self.assertEqual((st["batch"]["running"], st["batch"]["kv_used"]), (0, 0))
        self.assertTrue(stuck.wait_closed(timeout=10.0))


if __name__ == "__main__":
    unittest.main()
