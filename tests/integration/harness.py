"""harness.py — shared machinery for tokentap's black-box integration tests.

Starts tokentap and tokentap-sim on ephemeral loopback ports, waits for their
ready lines, and always stops them again (by PID, bounded waits). Provides a
raw-socket HTTP/1.1 client that timestamps body bytes as they arrive (so that
TTFT and ITL measured by the test are not distorted by client-side buffering),
a post-hoc SSE / NDJSON framer over those timestamped bytes, a client-side
token-event classifier mirroring docs/metrics.md, and small fake upstreams
written in Python for behaviours the simulator does not have (never answering,
resetting mid-stream, irregular inter-token gaps, a full accept queue).

Invariants: only 127.0.0.1 is ever bound or connected to; every loop is
bounded in both iterations and time; every process and thread started here is
registered for cleanup the moment it exists.

Binaries come from TOKENTAP_BIN and TOKENTAP_SIM_BIN (set by ctest).
"""

# The harness lives in four modules, lowest first; this file re-exports every
# name of each, so the tests (and tests/soak, tests/bench) keep importing
# `harness` alone:
#   harness_http.py      raw-socket HTTP/1.1 client, LOOPBACK, now_ns
#   harness_proc.py      tokentap / tokentap-sim processes, /proc, fd leak checks
#   harness_events.py    SSE / NDJSON framing, API bodies, token events, access log
#   harness_upstream.py  fake upstreams and their request reader

import os
import shutil
import tempfile
import time  # noqa: F401 (tests call harness.time)
import unittest

from harness_http import *  # noqa: F401,F403
from harness_proc import *  # noqa: F401,F403
from harness_proc import _add_cleanup, _stop_and_check  # noqa: F401 (tests use them; * skips _names)
from harness_proc import fd_diff, fd_targets, wait_fds  # TestCase below
from harness_events import *  # noqa: F401,F403
from harness_events import read_access_log, wait_log_entry  # TestCase below
from harness_upstream import *  # noqa: F401,F403
from harness_npm import *  # noqa: F401,F403


def model_series(admin, model, n=1, path="/stats?window=5m&model=%s", timeout=10.0):
    """The one /stats series of `model` once it counts at least n requests
    (a series without a request count, as some views have, counts as one);
    None if none shows within the timeout. Asserting on it is the caller's."""
    last = []

    def seen():
        r, _ = exchange(admin, "GET", path % model)
        if r is None or r.status != 200:
            return False
        last[:] = [s for s in r.json()["series"] if s["model"] == model]
        return len(last) == 1 and last[0].get("requests", 1) >= n

    wait_until(seen, timeout, 0.1)
    return last[0] if last else None


class TestCase(unittest.TestCase):
    """Adds a few assertion helpers shared by the suites."""

    @classmethod
    def start_logged(cls, upstream_url, prefix, data=False, admin=False):
        """The class's tokentap in front of upstream_url, its access log
        cls.log in a fresh directory cls.dir (removed after the class), with
        `data` its store there, with `admin` also flushed every 200 ms and
        the admin API on an ephemeral port (cls.admin). Sets cls.tt."""
        cls.dir = tempfile.mkdtemp(prefix=prefix)
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.log = os.path.join(cls.dir, "access.log")
        args = ["--access-log", cls.log]
        if data or admin:
            args += ["--data-dir", os.path.join(cls.dir, "data")]
        if admin:
            args += ["--flush-interval", "200ms", "--admin", "127.0.0.1:0"]
        cls.tt = start_tokentap(cls, upstream_url, *args)
        if admin:
            cls.admin = admin_port(cls.tt)

    def log_entry(self, path, rid, timeout=5.0):
        """The access log line of request `rid` once tokentap has written it
        (polled for up to `timeout` s); fails naming the id and the log's
        last lines when none comes."""
        e = wait_log_entry(path, lambda e: e.get("id") == rid, timeout)
        if e is None:
            self.fail("no access log line with id %r within %.1f s; last lines: %r"
                      % (rid, timeout, read_access_log(path)[-3:]))
        return e

    def assertJsonError(self, resp, status):
        """`status` with a JSON body {"error": {"message": "...", ...}}."""
        self.assertIsNotNone(resp, "connection closed without a response (expected %d)" % status)
        self.assertEqual(resp.status, status, "status; body=%r" % resp.body[:300])
        self.assertIn("json", (resp.content_type() or "").lower(), "error content-type")
        try:
            obj = resp.json()
        except ValueError:
            self.fail("error body is not JSON: %r" % resp.body[:300])
        self.assertIsInstance(obj, dict)
        err = obj.get("error")
        self.assertIsInstance(err, dict, "error body %r" % obj)
        self.assertIsInstance(err.get("message"), str)
        self.assertTrue(err["message"].strip(), "empty error message")
        return obj

    def assertProxyError(self, resp, status):
        """An error tokentap's proxy listener makes itself: as assertJsonError,
        plus the error "type" string of the contract."""
        obj = self.assertJsonError(resp, status)
        self.assertIsInstance(obj["error"].get("type"), str, "error.type %r" % obj)
        self.assertTrue(obj["error"]["type"], "empty error.type")
        return obj

    def assertFdsBack(self, proc, baseline, extra=None, timeout=5.0, what="after the connections closed"):
        """Fails unless `proc` gets back to the fds of `baseline` (a {fd:
        target} map taken from fd_targets when it was idle) within `timeout`
        seconds: a socket left open after its client or upstream went away
        is a leak. `extra()`, when given, is how many more fds are
        legitimately open now (idle pooled upstream connections), re-read at
        every poll. The message lists the fds that differ."""
        count = extra or (lambda: 0)
        ok, n, want = wait_fds(proc.pid, lambda: len(baseline) + count(), timeout)
        if not ok:
            self.fail("%s has %d fds open %s, expected %d (%d at the baseline + %d pooled); "
                      "differences from the baseline:\n%s"
                      % (proc.name, n, what, want, len(baseline), want - len(baseline),
                         "\n".join(fd_diff(baseline, fd_targets(proc.pid)))))
