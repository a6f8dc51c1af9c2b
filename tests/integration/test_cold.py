"""test_cold.py — which requests are labelled cold, over real sockets.

A request is cold when it runs on a freshly opened upstream connection and
the upstream has served nothing yet in this tokentap, has been idle for
longer than store.cold_after_idle, or failed its last connect
(docs/storage.md, "Cold requests"). Each request's label is read back from
/requests/recent by its x-request-id.

With one worker: the first request is cold, an immediate reuse warm, the
first after an idle spell longer than cold_after_idle (and the pool's idle
timeout, so the connection is a fresh one) cold again, the next warm; after
the upstream was unreachable (one 502) and came back, cold. With two
workers, the label is the upstream's, not a worker's: of several requests,
each on a new client connection (and so on either worker, each with its own
upstream connections), only the first is cold.
"""

import time
import unittest

import harness
import routing_helpers as rh

COLD_AFTER_MS = 400
POOL_IDLE_MS = 200


class ColdTest(harness.TestCase):
    def start(self, sim_url, workers):
        body = ("workers: %d\n"
                "timeouts:\n  pool_idle: %dms\n"
                "store:\n  cold_after_idle: %dms\n" % (workers, POOL_IDLE_MS, COLD_AFTER_MS)
                + rh.upstreams_yaml({"u": sim_url}) +
                "routes:\n  - name: all\n    match: {path_prefix: /}\n    upstream: u\n")
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0")
        return tt, harness.admin_port(tt)

    def send(self, tt, rid, expect=200):
        body = harness.api_body("openai-chat", stream=True, model="cold-model")
        hdrs = harness.sim_headers(ttft=2, itl=1, tokens=3, request_id=rid)
        resp, _ = harness.exchange(tt.port, "POST", "/v1/chat/completions", body=body, headers=hdrs)
        self.assertIsNotNone(resp, rid)
        self.assertEqual(resp.status, expect, rid)

    def labels(self, admin, ids):
        """{id: cold} for `ids`, once all are in the recent ring."""
        got = {}

        def check():
            resp, _ = harness.exchange(admin, "GET", "/requests/recent?n=100")
            got.clear()
            for e in resp.json()["requests"]:
                if e["id"] in ids:
                    got[e["id"]] = e["cold"]
            return len(got) == len(ids)

        self.assertTrue(harness.wait_until(check, 5.0, 0.05), "recent requests: %r of %r" % (got, ids))
        return got

    def test_one_worker(self):
        port = harness.free_port()
        sim = harness.start_sim(self, "--listen", "127.0.0.1:%d" % port)
        tt, admin = self.start(sim.url, 1)
        self.send(tt, "first")
        self.send(tt, "reused")
        time.sleep((max(COLD_AFTER_MS, POOL_IDLE_MS) + 300) / 1000.0)
        self.send(tt, "after-idle")
        self.send(tt, "after-idle-next")
        # let the pool close its idle connection first: the simulator is
        # stopped with no client connection open (an open one is reported
        # by LeakSanitizer in the ASan build)
        time.sleep((POOL_IDLE_MS + 300) / 1000.0)
        sim.stop()
        self.send(tt, "unreachable", expect=502)
        harness.start_sim(self, "--listen", "127.0.0.1:%d" % port)
        self.send(tt, "back")
        self.send(tt, "back-next")
        want = {"first": True, "reused": False, "after-idle": True, "after-idle-next": False, "back": True,
                "back-next": False}
        self.assertEqual(self.labels(admin, list(want)), want)
        tt.stop()  # before the second simulator, started after it, is stopped

    def test_label_is_the_upstreams_not_a_workers(self):
        sim = harness.start_sim(self)
        tt, admin = self.start(sim.url, 2)
        ids = ["conn-%d" % i for i in range(8)]
        for rid in ids:
            self.send(tt, rid)  # a new client connection each
        got = self.labels(admin, ids)
        self.assertEqual(got, {rid: rid == "conn-0" for rid in ids})


if __name__ == "__main__":
    unittest.main()
