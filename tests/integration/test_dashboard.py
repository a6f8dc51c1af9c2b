"""test_dashboard.py — the dashboard page (GET /) in headless Chromium.

tokentap-sim and tokentap (own data dir, admin API on 127.0.0.1:0) are
started and streamed traffic of two models at several concurrencies and
prompt lengths goes through the proxy. Debian's `chromium` then loads the
admin's `/` twice, each run bounded in time and stopped by its PID:

- `--dump-dom` after a virtual-time budget of 7 s (virtual time stands still
  while a fetch is pending, so the page polls exactly as it would live, about
  four times): the DOM must hold the charts drawn from live data, with the
  numbers the test reads from /stats, /stats/curve and /stats/prompt itself
  (the page writes the values it plotted into data-* attributes);
- `--screenshot`, saved as tests/artifacts/dashboard.png.

The Compare panel is also loaded at 1500x900 over Chromium's DevTools
protocol (what --dump-dom cannot say: where an element ends on screen):
with its widest rows (labels, both verdicts, the TTFT attribution) the
table ends inside the viewport, its last column on screen (screenshot:
tests/artifacts/dashboard-compare.png).

A least_request route checks the Routing panel: each upstream's share over
time as a line (data-series, data-last) and the pick reasons as /metrics
counts them (screenshot: tests/artifacts/dashboard-routing.png).

"No console errors" is checked twice: the page records window.onerror,
unhandled rejections, CSP violations and console.error into #page-errors
(its data-count must be 0), and Chromium's own console log (stderr, with
--enable-logging) must hold no console line at all, since the page logs
nothing when all is well. A second tokentap without any traffic checks that
the empty page renders without errors too.

Chromium missing is a failure with a message, not a skip: contrib/setup.sh
installs it.
"""

import base64
import concurrent.futures
import html.parser
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from test_admin import admin_get, admin_port

CHROMIUM_TIMEOUT_S = 60
VIRTUAL_TIME_MS = 7000
PATH = "/v1/chat/completions"
HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(os.path.dirname(HERE), "artifacts")


def chromium_bin():
    for name in (os.environ.get("TOKENTAP_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise AssertionError("chromium is not installed: run contrib/setup.sh (it installs Debian's chromium "
                         "package), or point TOKENTAP_CHROMIUM at a Chromium binary")


def run_chromium(test, url, *args, budget_ms=VIRTUAL_TIME_MS):
    """Runs headless Chromium once on `url` for `budget_ms` of virtual time;
    returns (stdout, stderr). Bounded: killed (its own process group, by the
    PID it was started with) after CHROMIUM_TIMEOUT_S."""
    profile = tempfile.mkdtemp(prefix="tokentap-chromium-")
    test.addCleanup(shutil.rmtree, profile, True)
    argv = [chromium_bin(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=%d" % budget_ms] + list(args) + [url]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=profile)
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group Chromium's own children share
        out, err = proc.communicate(timeout=10)
        raise AssertionError("chromium did not finish within %d s; stderr tail:\n%s"
                             % (CHROMIUM_TIMEOUT_S, err.decode("utf-8", "replace")[-3000:]))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    err = err.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise AssertionError("chromium exited with %r; stderr tail:\n%s" % (proc.returncode, err[-3000:]))
    return out.decode("utf-8", "replace"), err


class Devtools:
    """Headless Chromium on `url` with its DevTools protocol on an ephemeral
    loopback port, one page driven over a WebSocket (RFC 6455, written here:
    the tests use the standard library only). For what --dump-dom cannot
    say, such as where an element ends on the screen. Stopped (its process
    group, by the PID it was started with) at the test's cleanup."""

    def __init__(self, test, url, width, height):
        profile = tempfile.mkdtemp(prefix="tokentap-chromium-")
        test.addCleanup(shutil.rmtree, profile, True)
        argv = [chromium_bin(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                "--hide-scrollbars", "--user-data-dir=" + profile, "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0", "--window-size=%d,%d" % (width, height), url]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=profile)
        test.addCleanup(self.close)
        self.next_id = 0
        port = self._devtools_port()
        page = None
        for _ in range(100):  # the page target appears once the URL is opened
            resp, _ = harness.exchange(port, "GET", "/json/list", headers=[("Connection", "close")])
            pages = [t for t in json.loads(resp.body) if t.get("type") == "page"]
            if pages:
                page = pages[0]
                break
            time.sleep(0.05)
        if page is None:
            raise AssertionError("chromium opened no page")
        path = page["webSocketDebuggerUrl"].split(str(port), 1)[1]
        self.sock = socket.create_connection((harness.LOOPBACK, port), timeout=CHROMIUM_TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           % (path, port, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            d = self.sock.recv(1)
            if not d:
                break
            head += d
        if not head.startswith(b"HTTP/1.1 101"):
            raise AssertionError("DevTools refused the WebSocket: %r" % head[:200])
        # the target may still be on about:blank: wait for the page itself
        for _ in range(200):
            try:
                if self.evaluate("location.href === %s && document.readyState === 'complete'" % json.dumps(url)):
                    return
            except AssertionError as e:
                if "context" not in str(e):  # "Execution context was destroyed": it navigated meanwhile
                    raise
            time.sleep(0.05)
        raise AssertionError("chromium did not load %s within 10 s" % url)

    def _devtools_port(self):
        """The port from Chromium's `DevTools listening on ws://...` line."""
        deadline = time.monotonic() + CHROMIUM_TIMEOUT_S
        seen = b""
        for _ in range(10000):
            if time.monotonic() > deadline:
                break
            line = self.proc.stderr.readline()
            if not line:
                break
            seen += line
            m = re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                # drained from now on, so that a chatty Chromium never blocks on its pipe
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return int(m.group(1))
        raise AssertionError("chromium printed no DevTools address; stderr:\n%s" % seen[-3000:].decode("utf-8", "replace"))

    def _send(self, obj):
        data = json.dumps(obj).encode()
        mask = os.urandom(4)
        n = len(data)
        head = b"\x81" + (bytes([0x80 | n]) if n < 126 else b"\xfe" + struct.pack(">H", n) if n < 65536
                          else b"\xff" + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _recv_exact(self, n):
        out = b""
        while len(out) < n:
            d = self.sock.recv(n - len(out))
            if not d:
                raise AssertionError("DevTools closed the WebSocket")
            out += d
        return out

    def _recv(self):
        """One whole message (text frames and their continuations)."""
        msg = b""
        for _ in range(100000):
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            msg += self._recv_exact(n)
            if b0 & 0x80:
                return json.loads(msg)
        raise AssertionError("a DevTools message of over 100000 frames")

    def call(self, method, **params):
        """Sends one DevTools command and returns its result, skipping the
        events that come before it."""
        self.next_id += 1
        self._send({"id": self.next_id, "method": method, "params": params})
        for _ in range(100000):
            msg = self._recv()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise AssertionError("%s: %r" % (method, msg["error"]))
                return msg["result"]
        raise AssertionError("no answer to %s" % method)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (a promise is
        waited for)."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError("page script failed: %r" % r["exceptionDetails"])
        return r["result"].get("value")

    def close(self):
        sock = getattr(self, "sock", None)
        if sock:
            sock.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class Dom(html.parser.HTMLParser):
    """Elements of a dumped DOM: tag, attributes, the text inside, parent."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "source", "area", "base", "wbr"}

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.elements = []
        self._open = []
        self.feed(text)
        self.close()

    def _add(self, tag, attrs):
        e = {"tag": tag, "attrs": dict(attrs), "text": "", "parent": self._open[-1] if self._open else None}
        self.elements.append(e)
        return e

    def handle_starttag(self, tag, attrs):
        e = self._add(tag, attrs)
        if tag not in self.VOID:
            self._open.append(e)

    def handle_startendtag(self, tag, attrs):
        self._add(tag, attrs)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for e in self._open:
            e["text"] += data

    def by_id(self, id_):
        found = [e for e in self.elements if e["attrs"].get("id") == id_]
        if not found:
            raise AssertionError("no element #%s in the dumped DOM" % id_)
        return found[0]

    @staticmethod
    def _under(e, ancestor):
        p = e["parent"]
        while p is not None:
            if p is ancestor:
                return True
            p = p["parent"]
        return False

    def inside(self, root, tag=None, cls=None):
        """Elements under `root` (an id or an element), by tag and class."""
        if isinstance(root, str):
            root = self.by_id(root)
        return [e for e in self.elements if self._under(e, root) and (tag is None or e["tag"] == tag)
                and (cls is None or cls in e["attrs"].get("class", "").split())]


def console_lines(stderr):
    return [line for line in stderr.split("\n") if ":CONSOLE" in line]


def check_no_page_errors(test, dom, stderr):
    box = dom.by_id("page-errors")
    test.assertEqual(box["attrs"].get("data-count"), "0", "page errors:\n%s" % box["text"])
    test.assertEqual(box["text"].strip(), "")
    test.assertEqual(console_lines(stderr), [], "the page wrote to the console")


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError("%s is not a PNG" % path)
    return struct.unpack(">II", head[16:24])


def send_traffic(port):
    """Streamed chat requests: model dash-a at 1, 2 and 4 in flight (14 in
    all) with prompts of growing length, model dash-b one at a time (4), so
    that dash-a is the busiest series (the page's default selection)."""
    import threading

    def one(model, ttft, words, rid):
        prompt = " ".join(["word"] * words)
        body = harness.api_body("openai-chat", stream=True, include_usage=True, model=model, prompt=prompt)
        hdrs = harness.sim_headers(ttft=ttft, itl=2, tokens=6, request_id=rid)
        resp, _ = harness.exchange(port, "POST", PATH, body=body, headers=hdrs)
        if resp is None or resp.status != 200:
            errors.append("%s: %r" % (rid, resp and resp.status))

    errors = []
    n = 0
    for conc, ttft, words in ((1, 12, 3), (1, 14, 40), (2, 30, 100), (2, 33, 200), (4, 65, 400), (4, 70, 800)):
        threads = []
        for i in range(conc):
            t = threading.Thread(target=one, args=("dash-a", ttft, words, "dash-a-%d" % n))
            n += 1
            threads.append(t)
            t.start()
        for t in threads:
            t.join(30)
    for i in range(4):
        one("dash-b", 20, 10, "dash-b-%d" % i)
    if errors:
        raise AssertionError("proxy errors: %r" % errors)
    return n + 4


def stats_total(port, window="1m"):
    doc = admin_get(port, "/stats?window=%s" % window).json()
    return sum(s["requests"] for s in doc["series"]), doc


class DashboardLiveTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        chromium_bin()  # fail early, with the message, when it is missing
        cls.dir = tempfile.mkdtemp(prefix="tokentap-dash-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.sim = harness.start_sim(cls)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--data-dir", os.path.join(cls.dir, "data"),
                                        "--flush-interval", "200ms", "--admin", "127.0.0.1:0")
        cls.admin = admin_port(cls.tt)
        cls.total = send_traffic(cls.tt.port)
        ok = harness.wait_until(lambda: stats_total(cls.admin)[0] >= cls.total, 8.0, 0.1)
        if not ok:
            raise AssertionError("stats never showed %d requests: %r" % (cls.total, stats_total(cls.admin)[1]))
        cls.url = "http://127.0.0.1:%d/" % cls.admin

    def test_page_renders_live_data(self):
        out, err = run_chromium(self, self.url, "--dump-dom")
        # what the page saw; the traffic is over and flushed, so these hold still
        _, stats = stats_total(self.admin)
        curve = admin_get(self.admin, "/stats/curve?window=1h").json()
        prompt = admin_get(self.admin, "/stats/prompt?window=1h").json()
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        body = [e for e in dom.elements if e["tag"] == "body"][0]
        self.assertEqual(body["attrs"].get("data-rendered"), "1", "no poll succeeded; status: %s"
                         % dom.by_id("status")["text"])
        ticks = int(body["attrs"]["data-ticks"])
        self.assertGreaterEqual(ticks, 3, "the page polls every 2 s within a 7 s virtual budget")
        self.assertEqual(dom.by_id("status")["attrs"].get("data-state"), "ok")

        busiest = max(stats["series"], key=lambda s: s["requests"])
        self.assertEqual(busiest["model"], "dash-a")
        key = json.dumps([busiest["route"], busiest["upstream"], busiest["model"]], separators=(",", ":"))
        self.assertEqual(dom.by_id("series-select")["attrs"].get("data-selected"), key)

        # percentiles over time: one line per percentile, one point per poll
        # (and one per point of /stats/history the page opened with), the
        # latest equal to what /stats says now
        history = body["attrs"].get("data-history")
        self.assertRegex(history or "", r"^[0-9]+$", "the page loaded /stats/history")
        for metric in ("ttft", "itl", "e2e"):
            svg = dom.by_id("chart-" + metric)
            self.assertEqual(svg["attrs"].get("data-empty"), "0", metric)
            lines = {e["attrs"]["data-series"]: e for e in dom.inside("chart-" + metric, "path", "line")}
            self.assertEqual(set(lines), {"%s-p50" % metric, "%s-p90" % metric, "%s-p99" % metric})
            for q in ("p50", "p90", "p99"):
                a = lines["%s-%s" % (metric, q)]["attrs"]
                self.assertGreaterEqual(int(a["data-points"]), ticks, "%s %s: a point per poll" % (metric, q))
                self.assertLessEqual(int(a["data-points"]), ticks + int(history), "%s %s" % (metric, q))
                self.assertRegex(a["d"], r"^M[0-9.]+,[0-9.]+(L[0-9.]+,[0-9.]+)+$")
                want = busiest["metrics"][metric][q + "_ms"]
                self.assertAlmostEqual(float(a["data-last"]), want, delta=1e-9 * max(1.0, want),
                                       msg="%s %s plotted vs /stats" % (metric, q))
            legend = dom.by_id("legend-" + metric)["text"]
            self.assertIn("p50 ", legend)
            self.assertIn(" ms", legend)

        # numbers only some servers report: a chart when /stats has them, hidden when not
        for card, present in (("answer_ttft", "answer_ttft" in busiest["metrics"]),
                              ("reasoning", "reasoning" in busiest["metrics"]),
                              ("details", "cached_tokens" in busiest or "reasoning_tokens" in busiest)):
            self.assertEqual(dom.by_id("card-" + card)["attrs"].get("data-present"), "1" if present else "0", card)
            self.assertEqual("hidden" in dom.by_id("card-" + card)["attrs"], not present, card)

        # throughput: every line drawn and positive
        for chart, keys in (("chart-rps", ["requests_per_s"]),
                            ("chart-tps", ["input_tokens_per_s", "output_tokens_per_s"])):
            lines = {e["attrs"]["data-series"]: e["attrs"] for e in dom.inside(chart, "path", "line")}
            self.assertEqual(sorted(lines), sorted(keys), chart)
            for k in keys:
                self.assertGreater(float(lines[k]["data-last"]), 0, "%s %s" % (chart, k))
        self.assertIn("output tokens/s", dom.by_id("legend-tps")["text"])
        self.assertIn("input tokens/s", dom.by_id("legend-tps")["text"])

        # latency versus load: a bar per in-flight bucket, the knee where /stats/curve puts it
        cs = [s for s in curve["series"] if s["model"] == "dash-a"][0]
        bars = dom.inside("chart-curve", "rect", "curve-bar")
        self.assertEqual([int(b["attrs"]["data-inflight-low"]) for b in bars],
                         [b["inflight_low"] for b in cs["buckets"] if b["throughput_estimate_rps"] is not None])
        for b, want in zip(bars, [b for b in cs["buckets"] if b["throughput_estimate_rps"] is not None]):
            self.assertAlmostEqual(float(b["attrs"]["data-rps"]), want["throughput_estimate_rps"], delta=1e-9)
        self.assertGreaterEqual(len(bars), 2, "traffic ran at several loads")
        points = dom.inside("chart-curve", "circle", "curve-point")
        self.assertEqual(len(points), len([b for b in cs["buckets"] if b["ttft"]["count"]]))
        self.assertIsNotNone(cs["knee"], "enough requests per bucket for a knee")
        knee = dom.by_id("curve-knee")
        self.assertEqual(int(knee["attrs"]["data-inflight-low"]), cs["knee"]["inflight_low"])
        self.assertIn("knee at", dom.by_id("legend-curve")["text"])

        # ttft by prompt length: a bar per input-length bucket with its count and p50
        ps = [s for s in prompt["series"] if s["model"] == "dash-a"][0]
        pbars = dom.inside("chart-prompt", "rect", "prompt-bar")
        self.assertEqual([(int(b["attrs"]["data-low"]), int(b["attrs"]["data-count"])) for b in pbars],
                         [(b["input_tokens_low"], b["ttft"]["count"]) for b in ps["buckets"]])
        for b, want in zip(pbars, ps["buckets"]):
            self.assertAlmostEqual(float(b["attrs"]["data-p50-ms"]), want["ttft"]["p50_ms"], delta=1e-9)
        self.assertGreaterEqual(len(pbars), 3, "prompts of several lengths")

        # upstreams side by side: a column per series, the numbers of /stats
        table = dom.by_id("upstreams")
        self.assertEqual(int(table["attrs"]["data-columns"]), len(stats["series"]))
        self.assertEqual(table["attrs"].get("data-window"), "1m")
        heads = [e for e in dom.inside("upstreams", "th") if "data-model" in e["attrs"]]
        self.assertEqual(sorted(h["attrs"]["data-model"] for h in heads), ["dash-a", "dash-b"])
        order = [h["attrs"]["data-model"] for h in heads]
        by_model = {s["model"]: s for s in stats["series"]}
        for label, pick in (("TTFT p50, ms", lambda s: s["metrics"]["ttft"]["p50_ms"]),
                            ("ITL p99, ms", lambda s: s["metrics"]["itl"]["p99_ms"]),
                            ("requests", lambda s: s["requests"])):
            row = [e for e in dom.inside("upstreams", "tr") if e["attrs"].get("data-row") == label]
            self.assertEqual(len(row), 1, label)
            tds = dom.inside(row[0], "td")[1:]
            self.assertEqual(len(tds), len(order), label)
            for td, model in zip(tds, order):
                self.assertAlmostEqual(float(td["attrs"]["data-value"]), pick(by_model[model]), delta=1e-9,
                                       msg="%s of %s" % (label, model))

        # recent requests: the last 15
        self.assertEqual(dom.by_id("recent")["attrs"].get("data-rows"), str(min(15, self.total)))

    def test_screenshot(self):
        os.makedirs(ARTIFACTS, exist_ok=True)
        path = os.path.join(ARTIFACTS, "dashboard.png")
        if os.path.exists(path):
            os.unlink(path)
        _, err = run_chromium(self, self.url, "--hide-scrollbars", "--window-size=1400,1900",
                              "--screenshot=" + path)
        self.assertEqual(console_lines(err), [], "the page wrote to the console")
        self.assertTrue(os.path.exists(path), "no screenshot written")
        self.assertEqual(png_size(path), (1400, 1900))
        self.assertGreater(os.path.getsize(path), 20000, "a blank page compresses to almost nothing")


class DashboardHistoryTest(harness.TestCase):
    """Traffic a few seconds old, then the page for one poll's worth of
    virtual time (less than the 2 s poll period: one tick): the time charts
    already have the points of /stats/history, not just the one poll."""

    def test_charts_open_with_history(self):
        chromium_bin()
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--data-dir", "off", "--flush-interval", "100ms",
                                    "--admin", "127.0.0.1:0")
        port = admin_port(tt)
        for i in range(5):
            resp, _ = harness.exchange(tt.port, "POST", PATH, harness.api_body("openai-chat"),
                                       harness.sim_headers(ttft=15, itl=1, tokens=4, request_id="hist-%d" % i))
            self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: stats_total(port)[0] == 5, 5.0, 0.05))

        def enough_history():
            pts = admin_get(port, "/stats/history?step=2").json()["points"]
            return sum(1 for p in pts if p["series"]) >= 3

        self.assertTrue(harness.wait_until(enough_history, 10.0, 0.2), "no history points with the requests")
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % port, "--dump-dom", budget_ms=1000)
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        body = [e for e in dom.elements if e["tag"] == "body"][0]
        self.assertEqual(body["attrs"].get("data-ticks"), "1", "one poll within the budget")
        self.assertGreaterEqual(int(body["attrs"].get("data-history")), 3)
        for metric in ("ttft", "e2e"):
            lines = {e["attrs"]["data-series"]: e["attrs"] for e in dom.inside("chart-" + metric, "path", "line")}
            self.assertGreaterEqual(int(lines[metric + "-p50"]["data-points"]), 4,
                                    "%s: the history's points and the poll's" % metric)
        rps = {e["attrs"]["data-series"]: e["attrs"] for e in dom.inside("chart-rps", "path", "line")}
        self.assertGreaterEqual(int(rps["requests_per_s"]["data-points"]), 4)


class NewNumbersAdmin:
    """A stand-in admin API for the page: forwards every request to a real
    tokentap's admin, but adds the numbers only some servers report (answer_ttft and
    reasoning histograms, cached_tokens and reasoning_tokens counters) to
    each series of /stats and /stats/history, as the page will get them
    once tokentap records them. Loopback, port 0, stopped by the test."""

    ANSWER = {"count": 5, "mean_ms": 81.0, "p50_ms": 80.0, "p90_ms": 90.0, "p95_ms": 95.0, "p99_ms": 99.0,
              "p99_9_ms": 99.9, "max_ms": 100.0}
    REASONING = {"count": 5, "mean_ms": 41.0, "p50_ms": 40.0, "p90_ms": 45.0, "p95_ms": 47.0, "p99_ms": 49.0,
                 "p99_9_ms": 49.9, "max_ms": 50.0}

    def __init__(self, admin_port):
        import http.server

        upstream = admin_port
        enrich = self.enrich

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                resp, _ = harness.exchange(upstream, "GET", self.path)
                body = resp.body
                path = self.path.split("?")[0]
                if path in ("/stats", "/stats/history") and resp.status == 200:
                    doc = json.loads(body)
                    for d in doc.get("points", [doc]):
                        for s in d["series"]:
                            enrich(s)
                    body = json.dumps(doc).encode()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type() or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def enrich(self, s):
        s["metrics"]["answer_ttft"] = dict(self.ANSWER)
        s["metrics"]["reasoning"] = dict(self.REASONING)
        s["cached_tokens"] = 120
        s["reasoning_tokens"] = 60
        s["throughput"]["cached_tokens_per_s"] = 2.0
        s["throughput"]["reasoning_tokens_per_s"] = 1.0

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class DashboardNewNumbersTest(harness.TestCase):
    """The page with /stats answers that carry answer_ttft, reasoning,
    cached_tokens and reasoning_tokens: their charts and table rows appear,
    with the values served."""

    def test_new_numbers_are_drawn(self):
        chromium_bin()
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--data-dir", "off", "--flush-interval", "100ms",
                                    "--admin", "127.0.0.1:0")
        port = admin_port(tt)
        for i in range(3):
            resp, _ = harness.exchange(tt.port, "POST", PATH, harness.api_body("openai-chat"),
                                       harness.sim_headers(ttft=10, itl=1, tokens=4))
            self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: stats_total(port)[0] == 3, 5.0, 0.05))
        fake = NewNumbersAdmin(port)
        self.addCleanup(fake.stop)
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % fake.port, "--dump-dom", budget_ms=3000)
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        for metric, want in (("answer_ttft", NewNumbersAdmin.ANSWER), ("reasoning", NewNumbersAdmin.REASONING)):
            card = dom.by_id("card-" + metric)
            self.assertEqual(card["attrs"].get("data-present"), "1", metric)
            self.assertNotIn("hidden", card["attrs"], metric)
            lines = {e["attrs"]["data-series"]: e["attrs"] for e in dom.inside("chart-" + metric, "path", "line")}
            for q in ("p50", "p90", "p99"):
                self.assertEqual(float(lines["%s-%s" % (metric, q)]["data-last"]), want[q + "_ms"], (metric, q))
        lines = {e["attrs"]["data-series"]: e["attrs"] for e in dom.inside("chart-details", "path", "line")}
        self.assertEqual(float(lines["cached_tokens_per_s"]["data-last"]), 2.0)
        self.assertEqual(float(lines["reasoning_tokens_per_s"]["data-last"]), 1.0)
        rows = {e["attrs"]["data-row"]: e for e in dom.inside("upstreams", "tr") if "data-row" in e["attrs"]}
        for label, want in (("answer TTFT p50, ms", 80.0), ("reasoning p50, ms", 40.0),
                            ("cached prompt tokens", 120), ("reasoning tokens", 60)):
            self.assertIn(label, rows)
            self.assertEqual(float(dom.inside(rows[label], "td")[1]["attrs"]["data-value"]), want, label)


class DashboardEmptyTest(harness.TestCase):
    def test_renders_without_data(self):
        chromium_bin()
        d = tempfile.mkdtemp(prefix="tokentap-dash-empty-")
        self.addCleanup(shutil.rmtree, d, True)
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--data-dir", os.path.join(d, "data"), "--admin", "127.0.0.1:0")
        port = admin_port(tt)
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % port, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        body = [e for e in dom.elements if e["tag"] == "body"][0]
        self.assertEqual(body["attrs"].get("data-rendered"), "1")
        for chart in ("ttft", "itl", "e2e", "rps", "tps", "curve", "prompt"):
            svg = dom.by_id("chart-" + chart)
            self.assertEqual(svg["attrs"].get("data-empty"), "1", chart)
            self.assertRegex(svg["text"], r"no |waiting", chart)
            self.assertEqual(dom.inside("chart-" + chart, "path", "line"), [], chart)
        for card in ("answer_ttft", "reasoning", "details"):
            self.assertEqual(dom.by_id("card-" + card)["attrs"].get("data-present"), "0", card)
        # the seconds since start-up are history points without series: nothing drawn (checked above)
        self.assertRegex(body["attrs"].get("data-history") or "", r"^[0-9]+$")
        self.assertEqual(dom.by_id("upstreams")["attrs"].get("data-columns"), "0")
        self.assertEqual(dom.by_id("recent")["attrs"].get("data-rows"), "0")
        self.assertEqual(dom.by_id("compare")["attrs"].get("data-routes"), "0")


class DashboardCompareTest(harness.TestCase):
    """Two upstreams of one route, one slower: the Compare panel shows both,
    the slower one's verdict as /compare gives it."""

    def test_compare_panel(self):
        import routing_helpers as rh
        chromium_bin()
        fast = harness.start_sim(self, "--ttft-ms", "3", "--itl-ms", "1")
        slow = harness.start_sim(self, "--ttft-ms", "25", "--itl-ms", "4")
        d = tempfile.mkdtemp(prefix="tokentap-dash-cmp-")
        self.addCleanup(shutil.rmtree, d, True)
        body = rh.upstreams_yaml({"fast": fast.url, "slow": slow.url}, {"slow": ["labels: {runtime: sim-slow}"]}) + (
            "routes:\n  - name: chat\n    split:\n      - {upstream: fast, weight: 3}\n"
            "      - {upstream: slow, weight: 1}\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                           "--flush-interval", "200ms")
        port = admin_port(tt)
        for _ in range(80):
            self.assertEqual(rh.send(tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "6")]).status, 200)
        want = []

        def flushed():
            r = admin_get(port, "/compare?route=chat&window=1m&cold=include")
            want[:] = [r.json()]
            return sum(u["requests"] for u in want[0]["upstreams"]) == 80

        self.assertTrue(harness.wait_until(flushed, 5.0, 0.1))
        verdict = want[0]["differences"][0]["metrics"]["ttft"]["verdict"]
        self.assertEqual(verdict, "slower")
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % port, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        self.assertEqual(dom.by_id("compare")["attrs"].get("data-routes"), "1")
        rows = {e["attrs"]["data-upstream"]: e for e in dom.inside("compare", "tr") if "data-upstream" in e["attrs"]}
        self.assertEqual(set(rows), {"fast", "slow"})
        cells = [e for e in dom.inside(rows["slow"], "td") if e["attrs"].get("data-verdict")]
        self.assertEqual(cells[0]["attrs"]["data-verdict"], verdict)
        self.assertIn("runtime=sim-slow", rows["slow"]["text"])

    def test_compare_table_fits_1500_px(self):
        """The widest rows the table has: labels on each upstream, both
        verdicts with their differences, and the TTFT attribution naming the
        phase (the slow engine reports its timings, its prefill 10x
        slower)."""
        import routing_helpers as rh
        chromium_bin()
        flags = ("--batching", "--server-timing", "llamacpp", "--step-base-ms", "2")
        fast = harness.start_sim(self, "--prefill-tps", "40000", *flags)
        slow = harness.start_sim(self, "--prefill-tps", "4000", *flags)
        d = tempfile.mkdtemp(prefix="tokentap-dash-fit-")
        self.addCleanup(shutil.rmtree, d, True)
        labels = "labels: {runtime: llama.cpp-b4200, gpu: example-accelerator-80g, pool: canary-eu-west}"
        body = rh.upstreams_yaml({"fast": fast.url, "slow": slow.url}, {"fast": [labels], "slow": [labels]}) + (
            "routes:\n  - name: chat\n    split:\n      - {upstream: fast, weight: 1}\n"
            "      - {upstream: slow, weight: 1}\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                           "--flush-interval", "200ms")
        port = admin_port(tt)
        for _ in range(40):
            self.assertEqual(rh.send(tt.port, rh.chat(stream=True, prompt="word " * 400),
                                     headers=[("x-sim-tokens", "4")]).status, 200)
        doc = []

        def flushed():
            doc[:] = [admin_get(port, "/compare?route=chat&window=1m&cold=include").json()]
            return sum(u["requests"] for u in doc[0]["upstreams"]) == 40

        self.assertTrue(harness.wait_until(flushed, 5.0, 0.1))
        diff = doc[0]["differences"][0]
        self.assertEqual(diff["metrics"]["ttft"]["verdict"], "slower", diff)
        self.assertTrue(diff["ttft_attribution"]["cause"], diff["ttft_attribution"])
        self.check_compare_fits(port, 1500, 900)

    def check_compare_fits(self, port, width, height):
        """At width x height the Compare table ends inside the viewport,
        every column of it on screen (saved as
        tests/artifacts/dashboard-compare.png, the panel scrolled to)."""
        dt = Devtools(self, "http://127.0.0.1:%d/" % port, width, height)
        # polled in the page until the panel has its table (bounded: 20 s)
        got = dt.evaluate("""new Promise(function (done) {
          var n = 0, t = setInterval(function () {
            var table = document.querySelector("#compare table");
            if (table || ++n > 200) {
              clearInterval(t);
              if (!table) return done(null);
              document.getElementById("compare").scrollIntoView();
              var r = table.getBoundingClientRect(), last = table.querySelector("thead th:last-child");
              done({right: r.right, viewport: document.documentElement.clientWidth,
                    page: document.documentElement.scrollWidth,
                    last: last.getBoundingClientRect().right});
            }
          }, 100);
        })""")
        self.assertIsNotNone(got, "no Compare table within 20 s")
        os.makedirs(ARTIFACTS, exist_ok=True)
        shot = dt.call("Page.captureScreenshot", format="png")
        with open(os.path.join(ARTIFACTS, "dashboard-compare.png"), "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        self.assertEqual(got["viewport"], width, got)
        self.assertLessEqual(got["right"], got["viewport"], "the Compare table runs off the right edge: %r" % got)
        self.assertLessEqual(got["last"], got["viewport"], "its last column is cut: %r" % got)
        self.assertLessEqual(got["page"], got["viewport"], "the page scrolls sideways: %r" % got)

    def test_routing_panel_shows_shares_and_picks(self):
        """A least_request route over two upstreams: the Routing panel has
        the route's share chart with one line per upstream, the shares
        adding up to 100 %, and the pick reasons as /metrics counts them;
        the Compare panel says the assignment depended on load. Screenshot:
        tests/artifacts/dashboard-routing.png."""
        import routing_helpers as rh
        chromium_bin()
        fast = harness.start_sim(self, "--ttft-ms", "3", "--itl-ms", "1")
        slow = harness.start_sim(self, "--ttft-ms", "30", "--itl-ms", "4")
        d = tempfile.mkdtemp(prefix="tokentap-dash-route-")
        self.addCleanup(shutil.rmtree, d, True)
        body = rh.upstreams_yaml({"fast": fast.url, "slow": slow.url}) + (
            "routes:\n  - name: chat\n    balance: least_request\n    split:\n"
            "      - {upstream: fast, weight: 1}\n      - {upstream: slow, weight: 1}\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                           "--flush-interval", "200ms")
        port = admin_port(tt)
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            statuses = list(ex.map(lambda _: rh.send(tt.port, rh.chat(stream=True),
                                                     headers=[("x-sim-tokens", "4")]).status, range(80)))
        self.assertEqual(statuses.count(200), 80)
        want = {}
        text = admin_get(port, "/metrics").body.decode()
        for m in re.finditer(r'^tokentap_route_decisions_total\{route="chat",upstream="(\w+)",reason="(\w+)"\} (\d+)',
                             text, re.M):
            if int(m.group(3)):
                want[(m.group(1), m.group(2))] = int(m.group(3))
        self.assertEqual(sum(want.values()), 80, want)

        def flushed():
            r = admin_get(port, "/compare?route=chat&window=1m&cold=include")
            return sum(u["requests"] for u in r.json()["upstreams"]) == 80

        self.assertTrue(harness.wait_until(flushed, 5.0, 0.1))
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % port, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        self.assertEqual(dom.by_id("routing")["attrs"].get("data-routes"), "1")
        (fig,) = [e for e in dom.inside("routing", "figure") if e["attrs"].get("data-route") == "chat"]
        self.assertEqual(fig["attrs"]["data-balance"], "least_request")
        self.assertEqual(fig["attrs"]["data-upstreams"], "fast,slow")
        svg = dom.by_id("chart-share-0")
        self.assertEqual(svg["attrs"].get("data-empty"), "0")
        lines = {e["attrs"]["data-series"]: e for e in dom.inside("chart-share-0", "path", "line")}
        self.assertEqual(set(lines), {"fast", "slow"})
        last = {k: float(e["attrs"]["data-last"]) for k, e in lines.items()}
        self.assertAlmostEqual(sum(last.values()), 100.0, delta=0.01)
        # least_request: the fast one, free sooner, got more
        self.assertGreater(last["fast"], last["slow"])
        cells = {(tr["attrs"]["data-upstream"], td["attrs"]["data-reason"]): int(td["attrs"]["data-value"])
                 for tr in dom.inside(fig, "tr") if "data-upstream" in tr["attrs"]
                 for td in dom.inside(tr, "td") if "data-reason" in td["attrs"]}
        self.assertEqual({k: v for k, v in cells.items() if v}, want)
        notes = [e for e in dom.inside("compare", "p") if e["attrs"].get("data-assignment")]
        self.assertEqual([e["attrs"]["data-assignment"] for e in notes], ["load_dependent"])
        shot = os.path.join(ARTIFACTS, "dashboard-routing.png")
        os.makedirs(ARTIFACTS, exist_ok=True)
        run_chromium(self, "http://127.0.0.1:%d/#routing" % port, "--screenshot=" + shot,
                     "--window-size=1400,2400")
        self.assertTrue(os.path.exists(shot))

    def test_compare_panel_shows_a_mirror_route(self):
        """One target and a mirror: two upstreams to compare, on the same
        requests."""
        import routing_helpers as rh
        chromium_bin()
        primary = harness.start_sim(self, "--ttft-ms", "3", "--itl-ms", "1")
        shadow = harness.start_sim(self, "--ttft-ms", "25", "--itl-ms", "4")
        d = tempfile.mkdtemp(prefix="tokentap-dash-mir-")
        self.addCleanup(shutil.rmtree, d, True)
        body = rh.upstreams_yaml({"primary": primary.url, "shadow": shadow.url}) + (
            "routes:\n  - name: chat\n    upstream: primary\n    mirror: {upstream: shadow, percent: 100}\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0", "--data-dir", os.path.join(d, "data"),
                           "--flush-interval", "200ms")
        port = admin_port(tt)
        r = admin_get(port, "/routes")
        self.assertEqual(r.json()["routes"][0]["mirror"],
                         {"upstream": "shadow", "percent": 100, "max_in_flight": 64, "labels": {}})
        for _ in range(20):
            self.assertEqual(rh.send(tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "6")]).status, 200)

        def flushed():
            r = admin_get(port, "/compare?route=chat&window=1m&cold=include")
            return sum(u["requests"] for u in r.json()["upstreams"]) == 40

        self.assertTrue(harness.wait_until(flushed, 5.0, 0.1))
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % port, "--dump-dom")
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        self.assertEqual(dom.by_id("compare")["attrs"].get("data-routes"), "1")
        rows = {e["attrs"]["data-upstream"] for e in dom.inside("compare", "tr") if "data-upstream" in e["attrs"]}
        self.assertEqual(rows, {"primary", "shadow"})
        # the paired verdict beside the unpaired one: the shadow 22 ms slower
        # on each of the 20 same requests, called after 11 pairs at most
        paired = [e for e in dom.inside("compare", "p") if e["attrs"].get("data-paired") == "primary>shadow"]
        self.assertEqual(len(paired), 1)
        spans = {e["attrs"]["data-metric"]: e["attrs"]["data-verdict"] for e in dom.inside("compare", "span")
                 if "data-metric" in e["attrs"]}
        self.assertEqual(spans["ttft_ms"], "A faster")


if __name__ == "__main__":
    unittest.main()
