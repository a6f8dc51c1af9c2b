"""The stats store under faults: a full map, a full disk, a damaged file.

Map full: the config key store.max_size caps the LMDB map far below what
the traffic needs, so commits fail with MDB_MAP_FULL once growing is no longer
allowed. Disk full: the data directory lives on a tmpfs of a few MiB that
the test mounts itself, and the test fills it with a file of its own. In
both, every request keeps getting its whole streamed answer, tokentap says
what happened in one log line (not one per commit), /stats keeps counting the
new requests from memory, and what was committed before the fault is still
there after a restart. The disk-full case then frees the space: the stats
held in memory reach the disk (a kill -9 and a restart show them all).

Damaged database at start-up: a populated data.mdb is overwritten with
garbage, overwritten with garbage everywhere but its meta pages, truncated
to half, or has its meta pages zeroed. tokentap must start anyway (no crash
loop), move the file aside to data.mdb.corrupt-<unix time> with a log line
naming both paths, start with an empty store and keep forwarding; a second
start finds nothing to move. --check-data reports such a file and leaves it
where it is.
"""

import errno
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import harness
import routing_helpers as rh

PATH = "/v1/chat/completions"
TOKENS = 5
FAULT_RE = re.compile(r"store: cannot commit stats to ")
HELD_RE = re.compile(r"kept in memory")
RESUMED_RE = re.compile(r"store: writing to .* again")
CORRUPT_RE = re.compile(r"store: (\S+/data\.mdb) is corrupt \((.*)\); moved it to (\S+/data\.mdb\.corrupt-\d+)")


def counts(port, window="all"):
    """{model: requests} from /stats."""
    resp, _ = harness.exchange(port, "GET", "/stats?window=%s" % window)
    if resp is None or resp.status != 200:
        raise AssertionError("/stats?window=%s answered %r" % (window, resp and (resp.status, resp.body[:300])))
    return {s["model"]: s["requests"] for s in resp.json()["series"]}


def wait_count(port, model, n, window="all", timeout=10.0):
    """Polls /stats until `model` shows n requests; returns what it last saw."""
    seen = [None]

    def check():
        seen[0] = counts(port, window).get(model)
        return seen[0] == n

    harness.wait_until(check, timeout, 0.05)
    return seen[0]


def stream(test, port, model):
    """One streamed chat request through the proxy; asserts that the whole
    stream arrived: status 200, proper end of the chunked body, TOKENS token
    events and the closing [DONE]."""
    body = harness.api_body("openai-chat", stream=True, model=model)
    hdrs = harness.sim_headers(ttft=1, itl=1, tokens=TOKENS)
    resp, _ = harness.exchange(port, "POST", PATH, body=body, headers=hdrs)
    test.assertIsNotNone(resp, "the proxy closed without an answer")
    test.assertEqual(resp.status, 200, resp.body[:300])
    test.assertTrue(resp.complete, "the stream was cut")
    events = harness.events_of(resp)
    test.assertEqual(sum(1 for e in events if harness.is_token_event("openai-chat", e)), TOKENS)
    test.assertEqual(events[-1].data.strip(), "[DONE]")


def log_lines(tt, rx):
    return [line for line in tt.stderr_text().split("\n") if rx.search(line)]


def wait_log(tt, rx, timeout):
    return harness.wait_until(lambda: log_lines(tt, rx), timeout, 0.05)


def fill_until_fault(test, tt, port, rounds=40):
    """Sends requests for new models (new series need new pages) until
    tokentap reports a failed commit; bounded in rounds and time."""
    for i in range(rounds):
        for j in range(4):
            stream(test, port, "fill-%d-%d" % (i, j))
        if wait_log(tt, FAULT_RE, 1.0):
            return
    test.fail("no failed commit reported after %d rounds; stderr:\n%s" % (rounds, tt.stderr_text()))


def _tmpfs_unavailable():
    """None when this process can mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "not root (euid %d): mounting a tmpfs needs CAP_SYS_ADMIN" % os.geteuid()
    d = tempfile.mkdtemp(prefix="tokentap-mnt-probe-")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tokentap-probe", d],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        if r.returncode != 0:
            return "`mount -t tmpfs` failed: %s" % r.stdout.decode("utf-8", "replace").strip()
        subprocess.run(["umount", d], timeout=10)
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return "`mount -t tmpfs` failed: %s" % e
    finally:
        os.rmdir(d)


NO_TMPFS = _tmpfs_unavailable()


class StoreFullTest(harness.TestCase):
    def setUp(self):
        self.sim = harness.start_sim(self, "--ttft-ms", "1", "--itl-ms", "1")

    def start(self, data, max_size=None):
        """tokentap from a config file (where store.max_size is set, when
        given), with the store's flags beside it; the same series labels
        with the limit and without."""
        text = "listen: 127.0.0.1:0\n" + rh.upstreams_yaml({"sim": self.sim.url})
        if max_size is not None:
            # fill_until_fault needs new series: more models than the
            # route's cap of 32 would let in
            text += "store:\n  max_size: %s\n  max_models: 1000\n" % max_size
        tt = rh.ConfTokentap(text, "--data-dir", data, "--flush-interval", "50ms", "--admin", "127.0.0.1:0",
                             header=False)
        self.addCleanup(lambda: harness._stop_and_check(tt))
        return tt, harness.admin_port(tt)

    def committed_then_fault(self, tt, port, fault):
        """K requests committed, then the fault, then M more; checks
        forwarding, the single log line and the counts from memory.
        Returns (K, M)."""
        k, m = 6, 8
        for _ in range(k):
            stream(self, tt.port, "fault-a")
        self.assertEqual(wait_count(port, "fault-a", k), k, "committed before the fault")
        fault()
        fill_until_fault(self, tt, tt.port)
        for _ in range(m):
            stream(self, tt.port, "fault-a")
        # served from memory: the database holds only the first k
        for w in ("all", "1h", "24h", "7d"):
            self.assertEqual(wait_count(port, "fault-a", k + m, window=w), k + m, "window %s" % w)
        # the fault goes on: commits every 50 ms and retries (1 s, then 2 s
        # apart) keep failing, quietly
        for _ in range(5):
            time.sleep(0.5)
            stream(self, tt.port, "fault-a")
            m += 1
        self.assertEqual(wait_count(port, "fault-a", k + m), k + m)
        faults = log_lines(tt, FAULT_RE)
        self.assertEqual(len(faults), 1, "said once, not per commit:\n%s" % "\n".join(faults))
        self.assertRegex(faults[0], HELD_RE)
        return k, m

    def test_map_full(self):
        d = tempfile.mkdtemp(prefix="tokentap-mapfull-")
        self.addCleanup(shutil.rmtree, d, True)
        data = os.path.join(d, "data")
        tt, port = self.start(data, max_size="128k")
        k, m = self.committed_then_fault(tt, port, lambda: None)
        self.assertIn("size limit of 128 KiB (store.max_size)", log_lines(tt, FAULT_RE)[0])
        self.assertIn(data, log_lines(tt, FAULT_RE)[0])
        tt.stop()
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())

        check = harness.run_cli(["--check-data", "--data-dir", data], timeout=30)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertIn("0 undecodable", check.stdout)
        # without the cap the map grows again; what was committed is there
        tt2, port2 = self.start(data)
        got = counts(port2).get("fault-a")
        self.assertIsNotNone(got, "committed stats lost")
        self.assertGreaterEqual(got, k)
        self.assertLessEqual(got, k + m)
        stream(self, tt2.port, "fault-a")
        self.assertEqual(wait_count(port2, "fault-a", got + 1), got + 1, "committing again")

    def test_disk_full(self):
        harness.require_root_feature(self, NO_TMPFS)
        mnt = tempfile.mkdtemp(prefix="tokentap-diskfull-")
        self.addCleanup(os.rmdir, mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tokentap-diskfull", mnt],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout)
        # registered before tokentap starts, so it runs after tokentap stopped
        self.addCleanup(subprocess.run, ["umount", "-l", mnt], timeout=10)
        data = os.path.join(mnt, "data")
        filler = os.path.join(mnt, "filler")
        tt, port = self.start(data)

        def fill():
            with open(filler, "wb", buffering=0) as f:
                for chunk in (1 << 20, 64 << 10, 4096, 1):
                    for _ in range(10000):
                        try:
                            f.write(b"\0" * chunk)
                        except OSError as e:
                            if e.errno != errno.ENOSPC:
                                raise
                            break
            st = os.statvfs(mnt)
            self.assertLess(st.f_bavail * st.f_frsize, 4096, "the filesystem is full")

        k, m = self.committed_then_fault(tt, port, fill)
        self.assertIn("filesystem is full", log_lines(tt, FAULT_RE)[0])

        # space comes back: what memory held is written, said once
        os.unlink(filler)
        self.assertTrue(wait_log(tt, RESUMED_RE, 30.0), "no recovery line; stderr:\n%s" % tt.stderr_text())
        stream(self, tt.port, "fault-a")
        self.assertEqual(wait_count(port, "fault-a", k + m + 1), k + m + 1)
        self.assertEqual(len(log_lines(tt, RESUMED_RE)), 1)
        tt.kill(signal.SIGKILL)
        tt2, port2 = self.start(data)
        self.assertEqual(counts(port2).get("fault-a"), k + m + 1, "held stats reached the disk")
        self.assertEqual(log_lines(tt2, FAULT_RE), [])


def corrupt_garbage(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(random.Random(1).randbytes(size))


def corrupt_garbage_pages(path):
    """Garbage over every page but the two meta pages at the start."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(2 * 4096)
        f.write(random.Random(2).randbytes(size - 2 * 4096))


def corrupt_truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def corrupt_zero_meta(path):
    with open(path, "r+b") as f:
        f.write(b"\0" * (2 * 4096))


class StoreCorruptTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="tokentap-corrupt-")
        cls.addClassCleanup(shutil.rmtree, cls.root, True)
        cls.sim = harness.start_sim(cls, "--ttft-ms", "1", "--itl-ms", "1")
        # a populated store, written once and copied for each case
        cls.template = os.path.join(cls.root, "template")
        tt = harness.Tokentap(cls.sim.url, "--data-dir", cls.template, "--flush-interval", "50ms",
                              "--admin", "127.0.0.1:0")
        try:
            port = harness.admin_port(tt)
            for i in range(40):
                body = harness.api_body("openai-chat", stream=True, model="before-%d" % (i % 20))
                resp, _ = harness.exchange(tt.port, "POST", PATH, body=body,
                                           headers=harness.sim_headers(ttft=1, itl=1, tokens=TOKENS))
                assert resp is not None and resp.status == 200
            if not harness.wait_until(lambda: sum(counts(port).values()) == 40, 10.0, 0.05):
                raise AssertionError("template not committed")
        finally:
            tt.stop()
        size = os.path.getsize(os.path.join(cls.template, "data.mdb"))
        assert size >= 8 * 4096, "template data.mdb has only %d bytes" % size

    def case_dir(self, name, corrupt):
        d = os.path.join(self.root, name)
        shutil.copytree(self.template, d)
        corrupt(os.path.join(d, "data.mdb"))
        with open(os.path.join(d, "data.mdb"), "rb") as f:
            return d, f.read()

    def start(self, d):
        tt = harness.start_tokentap(self, self.sim.url, "--data-dir", d, "--flush-interval", "50ms",
                                    "--admin", "127.0.0.1:0")
        return tt, harness.admin_port(tt)

    def check_moved_aside(self, name, corrupt):
        d, bad = self.case_dir(name, corrupt)
        before = set(os.listdir(d))
        tt, port = self.start(d)
        lines = log_lines(tt, CORRUPT_RE)
        self.assertEqual(len(lines), 1, "one line naming both paths; stderr:\n%s" % tt.stderr_text())
        m = CORRUPT_RE.search(lines[0])
        self.assertEqual(m.group(1), os.path.join(d, "data.mdb"))
        moved = m.group(3)
        self.assertEqual(os.path.dirname(moved), d)
        self.assertLessEqual(abs(int(moved.rsplit("-", 1)[1]) - time.time()), 60, "named for the time")
        with open(moved, "rb") as f:
            self.assertEqual(f.read(), bad, "the damaged file is kept as it was")
        self.assertEqual(set(os.listdir(d)) - before, {os.path.basename(moved)})

        # an empty store that works
        self.assertEqual(counts(port), {})
        for _ in range(3):
            stream(self, tt.port, "after")
        self.assertEqual(wait_count(port, "after", 3), 3)
        tt.stop()
        self.assertEqual(tt.proc.returncode, 0, tt.stderr_text())

        # and the next start finds nothing to move
        tt2, port2 = self.start(d)
        self.assertEqual(log_lines(tt2, CORRUPT_RE), [])
        self.assertEqual(counts(port2), {"after": 3})
        self.assertEqual(len([n for n in os.listdir(d) if ".corrupt-" in n]), 1)
        return m.group(2)

    def test_garbage(self):
        why = self.check_moved_aside("garbage", corrupt_garbage)
        self.assertIn("MDB_INVALID", why)

    def test_garbage_pages(self):
        self.check_moved_aside("garbage-pages", corrupt_garbage_pages)

    def test_truncated(self):
        why = self.check_moved_aside("truncated", corrupt_truncate)
        self.assertIn("truncated", why)

    def test_zeroed_meta_pages(self):
        why = self.check_moved_aside("zero-meta", corrupt_zero_meta)
        self.assertIn("MDB_INVALID", why)

    def test_check_data_reports_and_keeps_it(self):
        for name, corrupt in (("check-garbage", corrupt_garbage), ("check-truncated", corrupt_truncate)):
            d, bad = self.case_dir(name, corrupt)
            r = harness.run_cli(["--check-data", "--data-dir", d], timeout=30)
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("corrupt", r.stderr)
            self.assertIn(os.path.join(d, "data.mdb"), r.stderr)
            self.assertEqual([n for n in os.listdir(d) if ".corrupt-" in n], [])
            with open(os.path.join(d, "data.mdb"), "rb") as f:
                self.assertEqual(f.read(), bad)

    def test_sound_database_is_not_moved(self):
        d, _ = self.case_dir("sound", lambda p: None)
        tt, port = self.start(d)
        self.assertEqual(log_lines(tt, CORRUPT_RE), [])
        self.assertEqual(sum(counts(port).values()), 40)


if __name__ == "__main__":
    unittest.main()
