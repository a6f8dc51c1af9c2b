"""test_model_cap.py — which model names a route tracks (store.max_models):
a name is admitted only with a successful (2xx) answer from the upstream, so
requests naming junk models that the upstream refuses cannot crowd out the
real ones; a failed request naming an admitted model stays under it; a
name idle for store.model_idle gives its slot to a new one when the list is
full; and a list that fills is said once per route."""

import json
import os
import time
import unittest

import harness
import routing_helpers as rh

TOKEN = "model-cap-test-token"


def get_json(port, path):
    resp, _ = harness.exchange(port, "GET", path, None, [], timeout=5)
    return json.loads(resp.body)


def model_upstream(test, known):
    """A fake upstream answering 200 for the models in `known`, else 404."""

    def handler(sock, req, ctx):
        model = json.loads(req.body or b"{}").get("model")
        if model in known:
            body = json.dumps({"model": model, "choices": [{"message": {"content": "ok"}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
        else:
            body = b'{"error":{"message":"model not found"}}'
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
        return True

    return harness.start_fake_upstream(test, handler)


class ModelCapTest(harness.TestCase):
    def start(self, body, *args, workers=2):
        os.environ["TOKENTAP_ADMIN_TOKEN"] = TOKEN
        try:
            tt = rh.start_conf(self, body, "--workers", str(workers), "--admin", "127.0.0.1:0", "--flush-interval",
                               "100ms", *args)
        finally:
            del os.environ["TOKENTAP_ADMIN_TOKEN"]
        return tt, harness.admin_port(tt)

    def by_model(self, admin, total):
        """{model: requests} of /stats once the store counted `total`."""
        stats = harness.wait_until(
            lambda: (lambda s: s if sum(x["requests"] for x in s["series"]) >= total else None)(
                get_json(admin, "/stats?window=5m&cold=include")), 5.0, 0.1)
        self.assertIsNotNone(stats, "the store never counted %d requests" % total)
        out = {}
        for s in stats["series"]:
            out[s["model"]] = out.get(s["model"], 0) + s["requests"]
        self.assertEqual(sum(out.values()), total, stats["series"])
        return out

    def test_refused_names_do_not_take_the_cap(self):
        up = model_upstream(self, {"real", "known"})
        tt, admin = self.start(rh.upstreams_yaml({"up": up.url}) + "routes:\n  - name: main\n    upstream: up\n")
        # an admitted model's failures stay its own
        self.assertEqual(rh.send(tt.port, rh.chat(model="known")).status, 200)
        for i in range(40):  # more junk names than the cap (32), each refused by the upstream
            self.assertEqual(rh.send(tt.port, rh.chat(model="junk-%d" % i)).status, 404)
        self.assertEqual(rh.send(tt.port, rh.chat(model="real")).status, 200)
        self.assertEqual(rh.send(tt.port, rh.chat(model="real")).status, 200)
        got = self.by_model(admin, 43)
        self.assertEqual(got, {"known": 1, "other": 40, "real": 2}, got)

    def test_failed_request_of_admitted_model_stays_under_it(self):
        known = {"m"}
        up = model_upstream(self, known)
        tt, admin = self.start(rh.upstreams_yaml({"up": up.url}) + "routes:\n  - name: main\n    upstream: up\n")
        self.assertEqual(rh.send(tt.port, rh.chat(model="m")).status, 200)
        known.discard("m")  # the upstream now refuses it
        self.assertEqual(rh.send(tt.port, rh.chat(model="m")).status, 404)
        self.assertEqual(rh.send(tt.port, rh.chat(model="m")).status, 404)
        got = self.by_model(admin, 3)
        self.assertEqual(got, {"m": 3}, got)

    def test_idle_name_gives_its_slot_to_a_new_one(self):
        # One worker: the last request for b must reach the worker that
        # already holds b's series, so that only the slot's generation can
        # tell it b lost its slot (on a worker that never saw b the name is
        # looked up afresh and the check is never made).
        up = model_upstream(self, {"a", "b", "c", "d"})
        tt, admin = self.start("store:\n  max_models: 2\n  model_idle: 1s\n" + rh.upstreams_yaml({"up": up.url}) +
                               "routes:\n  - name: main\n    upstream: up\n", workers=1)
        for m in ("a", "b", "c"):  # c finds the list full of fresh names
            self.assertEqual(rh.send(tt.port, rh.chat(model=m)).status, 200)
        time.sleep(1.5)  # a and b idle past model_idle
        self.assertEqual(rh.send(tt.port, rh.chat(model="a")).status, 200)  # a is fresh again
        self.assertEqual(rh.send(tt.port, rh.chat(model="c")).status, 200)  # takes b's slot
        self.assertEqual(rh.send(tt.port, rh.chat(model="d")).status, 200)  # a and c are fresh: refused
        self.assertEqual(rh.send(tt.port, rh.chat(model="b")).status, 200)  # b lost its slot
        got = self.by_model(admin, 7)
        self.assertEqual(got, {"a": 2, "b": 1, "c": 1, "other": 3}, got)

    def test_full_list_said_once(self):
        """A name answered 2xx that finds the list full (one per adapter of a
        Multi-LoRA server overflows it) is logged once per route, naming the
        setting to raise; names the upstream refused never are."""
        up = model_upstream(self, {"a", "b", "c", "d"})
        tt, admin = self.start("store:\n  max_models: 2\n" + rh.upstreams_yaml({"up": up.url}) +
                               "routes:\n  - name: main\n    upstream: up\n")

        def full_lines():
            return [ln for ln in tt.stderr_text().split("\n") if "list full" in ln]

        for m in ("a", "b"):
            self.assertEqual(rh.send(tt.port, rh.chat(model=m)).status, 200)
        for i in range(3):  # refused by the upstream: not a name to track
            self.assertEqual(rh.send(tt.port, rh.chat(model="junk-%d" % i)).status, 404)
        self.by_model(admin, 5)
        self.assertEqual(full_lines(), [])
        for m in ("c", "d", "c"):
            self.assertEqual(rh.send(tt.port, rh.chat(model=m)).status, 200)
        got = self.by_model(admin, 8)
        self.assertEqual(got, {"a": 1, "b": 1, "other": 6}, got)
        lines = full_lines()
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("route main: model list full (store.max_models: 2)", lines[0])
        self.assertIn("raise store.max_models", lines[0])
        self.assertRegex(lines[0], r"; [cd] and further new names")


if __name__ == "__main__":
    unittest.main()
