"""test_workers.py — several event loops (--workers N, one thread each,
sharing the listening port through SO_REUSEPORT): connections spread over
them, and what an operator sets for the whole server holds across them —
max_concurrency and the queue of an upstream, the connection cap, the split
ratio over many requests, the in-flight count of /upstreams, /stats counting
every worker's requests, a reload reaching every worker and SIGTERM draining
them all."""

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import unittest

import harness
import routing_helpers as rh

WORKERS = 2
TOKEN = "workers-test-token"


def worker_threads(pid):
    """{tid: on-CPU ns} of tokentap's worker threads (named tt-worker-N)."""
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                name = f.read().strip()
            if not name.startswith("tt-worker-"):
                continue
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                out[name] = int(f.read().split()[0])
        except FileNotFoundError:
            continue
    return out


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path, None, [], timeout=5)
    return json.loads(resp.body)


class WorkersTest(harness.TestCase):
    def start(self, body, *args):
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            tt = rh.start_conf(self, body, "--workers", str(WORKERS), "--admin", "127.0.0.1:0", *args)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        return tt, harness.admin_port(tt)

    def test_connections_spread_and_stats_count_them_all(self):
        sim = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "3")
        d = tempfile.mkdtemp(prefix="tokentap-workers-")
        self.addCleanup(shutil.rmtree, d, True)
        tt, admin = self.start(rh.upstreams_yaml({"sim": sim.url}), "--data-dir", os.path.join(d, "data"),
                               "--flush-interval", "100ms")
        self.assertTrue(any("%d worker(s)" % WORKERS in l for l in tt.lines), tt.lines[-3:])
        # The workers name their threads once they run, which may be after
        # the ready line on a loaded machine: wait for every name.
        names = ["tt-worker-%d" % i for i in range(WORKERS)]
        before = harness.wait_until(lambda: (lambda w: w if sorted(w) == names else None)(worker_threads(tt.pid)),
                                    5.0, 0.01)
        self.assertEqual(sorted(before or worker_threads(tt.pid)), names)
        n = 200
        for i in range(n):  # each on a connection of its own
            resp = rh.send(tt.port, rh.chat(stream=True))
            self.assertEqual(resp.status, 200, "request %d: %r" % (i, resp.body[:200]))
        after = worker_threads(tt.pid)
        used = {k: after[k] - before[k] for k in after}
        total = sum(used.values())
        for name, ns in used.items():
            # the kernel hashes connections over the workers' sockets
            self.assertGreater(ns, total * 0.1, "worker %s did almost nothing: %r" % (name, used))
        stats = harness.wait_until(
            lambda: (lambda s: s if s["series"] and s["series"][0]["requests"] >= n else None)(
                get_json(admin, "/stats?window=5m&cold=include")), 5.0, 0.1)
        self.assertIsNotNone(stats, "the store never counted %d requests" % n)
        self.assertEqual(sum(s["requests"] for s in stats["series"]), n)
        ups = get_json(admin, "/upstreams")["upstreams"]
        self.assertEqual(ups[0]["requests"], n, ups)
        self.assertEqual(ups[0]["in_flight"], 0, ups)

    def test_admission_and_queue_are_the_servers(self):
        sim = harness.start_sim(self, "--ttft-ms", "50", "--itl-ms", "20")
        tt, admin = self.start(rh.upstreams_yaml({"sim": sim.url}, {"sim": [
            "max_concurrency: 2", "queue: {max: 3, timeout: 10s}"]}))
        results = [None] * 6
        peak = {"sim": 0, "in_flight": 0, "queued": 0}

        def stream(i):
            results[i] = rh.send(tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "15")])

        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        for _ in range(2000):
            if time.monotonic() > deadline or not any(t.is_alive() for t in threads):
                break
            st = sim.stats()
            peak["sim"] = max(peak["sim"], st["requests"] - st["completed"] - st["aborted"])
            u = get_json(admin, "/upstreams")["upstreams"][0]
            peak["in_flight"] = max(peak["in_flight"], u["in_flight"])
            peak["queued"] = max(peak["queued"], u["queued"])
            time.sleep(0.01)
        for t in threads:
            t.join(20)
        statuses = sorted(r.status for r in results)
        # 2 run, 3 wait, the sixth finds the queue full: across both workers
        self.assertEqual(statuses, [200] * 5 + [503], statuses)
        self.assertLessEqual(peak["sim"], 2, peak)
        self.assertEqual(peak["in_flight"], 2, peak)
        self.assertEqual(peak["queued"], 3, peak)

    def test_connection_cap_is_the_whole_process(self):
        sim = harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "5")
        tt, _ = self.start(rh.upstreams_yaml({"sim": sim.url}) + "limits: {max_connections: 4}\n")
        idle = [socket.create_connection((harness.LOOPBACK, tt.port)) for _ in range(4)]
        try:
            self.assertTrue(harness.wait_until(lambda: harness.accepted_connections(tt.pid, tt.port) >= 4, 5.0),
                            "tokentap did not take the four connections")
            data = harness.answer_on_connect(tt.port)
            self.assertTrue(data.startswith(b"HTTP/1.1 503 "), data[:80])
        finally:
            for s in idle:
                s.close()
        # the count comes down again: a new connection is served
        ok = harness.wait_until(lambda: rh.send(tt.port, rh.chat()).status == 200, 5.0, 0.1)
        self.assertTrue(ok)

    def test_split_holds_across_workers(self):
        a = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "1", "--model", "a")
        b = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "1", "--model", "b")
        tt, _ = self.start(rh.upstreams_yaml({"a": a.url, "b": b.url}) + (
            "routes:\n  - name: main\n    split:\n"
            "      - {upstream: a, weight: 3}\n      - {upstream: b, weight: 1}\n"))
        n = 200
        for i in range(n):
            self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        got_a, got_b = a.stats()["requests"], b.stats()["requests"]
        self.assertEqual(got_a + got_b, n)
        # each worker keeps its own smooth sequence: within a request or so
        # per worker of 3:1
        self.assertLessEqual(abs(got_a - n * 3 // 4), 2 * WORKERS, (got_a, got_b))

    def test_model_cap_is_per_route_across_workers(self):
        # store.max_models caps the named models of a route for the whole
        # process: each worker, and each upstream of the route, draws from
        # one budget; the rest count as "other".
        sim = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "1")
        tt, admin = self.start("store:\n  max_models: 3\n" + rh.upstreams_yaml({"a": sim.url, "b": sim.url}) + (
            "routes:\n  - name: main\n    split:\n"
            "      - {upstream: a, weight: 1}\n      - {upstream: b, weight: 1}\n"), "--flush-interval", "100ms")
        n, models = 60, ["m%d" % i for i in range(10)]
        for i in range(n):  # each on a connection of its own, so on either worker
            self.assertEqual(rh.send(tt.port, rh.chat(model=models[i % len(models)])).status, 200)
        stats = harness.wait_until(
            lambda: (lambda s: s if sum(x["requests"] for x in s["series"]) >= n else None)(
                get_json(admin, "/stats?window=5m")), 5.0, 0.1)
        self.assertIsNotNone(stats, "the store never counted %d requests" % n)
        self.assertEqual(sum(s["requests"] for s in stats["series"]), n)
        self.assertEqual({s["route"] for s in stats["series"]}, {"main"})
        named = {s["model"] for s in stats["series"]} - {"other"}
        self.assertEqual(named, {"m0", "m1", "m2"}, stats["series"])
        other = sum(s["requests"] for s in stats["series"] if s["model"] == "other")
        self.assertEqual(other, n * 7 // 10)

    def test_reload_and_drain_reach_every_worker(self):
        a = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "1", "--model", "a")
        b = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "30", "--tokens", "20", "--model", "b")
        ups = rh.upstreams_yaml({"a": a.url, "b": b.url})
        tt, _ = self.start(ups + "routes:\n  - name: main\n    upstream: a\n")
        self.assertTrue(tt.reload(ups + "routes:\n  - name: main\n    upstream: b\n"))
        before = b.stats()["requests"]
        for _ in range(40):  # new connections, over both workers
            self.assertEqual(rh.send(tt.port, rh.chat()).status, 200)
        self.assertEqual(b.stats()["requests"] - before, 40)
        # SIGTERM while streams run on (very likely) both workers: each finishes
        results = [None] * 4

        def stream(i):
            results[i] = rh.send(tt.port, rh.chat(stream=True), timeout=15)

        threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        harness.wait_until(lambda: b.stats()["requests"] - before >= 44, 5.0, 0.01)
        tt.signal(signal.SIGTERM)
        for t in threads:
            t.join(15)
        for i, r in enumerate(results):
            self.assertIsNotNone(r, "stream %d got no answer" % i)
            self.assertEqual(r.status, 200)
            self.assertTrue(r.complete, "stream %d was cut by the drain" % i)
        self.assertEqual(tt.proc.wait(10), 0)


if __name__ == "__main__":
    unittest.main()
