"""test_embeddings.py — the one-answer APIs (embeddings, rerank) through
tokentap: each its own API kind, with the server's usage, the inputs of the
batch counted from the request body, the time per input and the input
tokens per second (docs/metrics.md).

- The simulator's /v1/embeddings with a string and with an array of 5
  inputs, and its /v1/rerank with documents: inputs 1 / 5 / 3, usage as the
  simulator's answer says, per_input_ms = e2e_ms / inputs, input_tps =
  input tokens over e2e, the per_input histogram in /stats and /metrics.
- An embeddings answer with an error status: counted as a 4xx, no usage.
- A body whose `input` is a number: forwarded byte for byte to a fake
  upstream (tokentap never refuses what the upstream may accept), inputs
  null, not 0.
- A real client: the official `openai` npm SDK's client.embeddings.create
  through tokentap (installed as test_responses.py does)."""

import json
import os
import subprocess

import harness
import test_responses

PATH = "/v1/embeddings"
HERE = os.path.dirname(os.path.abspath(__file__))
SDK_SCRIPT = os.path.join(HERE, "embeddings_sdk.cjs")
ROUND_MS = 0.003  # logged values are ms with µs precision


class SimEmbeddingsTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = harness.start_sim(cls, "--seed", "3")
        cls.start_logged(cls.sim.url, "tokentap-embed-", admin=True)

    def post(self, path, body, rid, itl=4):
        resp, _ = harness.exchange(self.tt.port, "POST", path, body, harness.sim_headers(itl=itl, request_id=rid))
        return resp, self.log_entry(self.log, rid)

    def check_batch(self, e, api, inputs, tokens, itl=4):
        self.assertEqual(e["api"], api)
        self.assertIsNone(e["error"])
        self.assertEqual(e["status"], 200)
        self.assertEqual(e["inputs"], inputs)
        self.assertEqual(e["input_tokens"], tokens)
        self.assertIsNone(e["output_tokens"])
        self.assertEqual(e["token_events"], 0)
        self.assertIsNone(e["ttft_ms"])
        self.assertAlmostEqual(e["per_input_ms"], e["e2e_ms"] / inputs, delta=ROUND_MS)
        self.assertAlmostEqual(e["input_tps"], tokens / (e["e2e_ms"] / 1e3), delta=tokens / e["e2e_ms"] * 1e3 * 1e-3)
        # the simulator waits 4 ms per input before it answers
        self.assertGreaterEqual(e["e2e_ms"], itl * inputs)

    def test_string_input(self):
        resp, e = self.post(PATH, {"model": "emb-one", "input": "hello embeddings"}, "it-emb-one")
        self.assertEqual(resp.status, 200)
        ans = resp.json()
        self.assertEqual(len(ans["data"]), 1)
        self.assertEqual(ans["usage"], {"prompt_tokens": 4, "total_tokens": 4})
        self.check_batch(e, "embeddings", 1, 4)

    def test_array_of_five(self):
        inputs = ["a", "bb", "a longer sentence to embed", [1, 2, 3, 4, 5, 6], "x" * 40]
        resp, e = self.post(PATH, {"model": "emb-five", "input": inputs}, "it-emb-five")
        self.assertEqual(resp.status, 200)
        ans = resp.json()
        self.assertEqual([d["index"] for d in ans["data"]], list(range(5)))
        self.assertEqual(ans["usage"]["prompt_tokens"], 1 + 1 + 7 + 6 + 10)
        self.check_batch(e, "embeddings", 5, ans["usage"]["prompt_tokens"])
        self.check_stats("emb-five", e)

    def test_answer_past_the_body_bound(self):
        """An answer larger than the 1 MiB tokentap keeps of a body: its
        usage, after the vectors, is still read (from the tail)."""
        inputs = ["input number %d" % i for i in range(40)]
        resp, e = self.post(PATH, {"model": "emb-big", "input": inputs, "dimensions": 4096}, "it-emb-big", itl=0)
        self.assertEqual(resp.status, 200)
        self.assertGreater(len(resp.body), 1 << 20)
        ans = resp.json()
        self.assertEqual(len(ans["data"]), 40)
        self.assertEqual(e["inputs"], 40)
        self.assertEqual(e["input_tokens"], ans["usage"]["prompt_tokens"])
        self.assertGreater(e["bytes_out"], len(resp.body), "the whole answer forwarded")

    def test_token_array_is_one_input(self):
        resp, e = self.post(PATH, {"model": "emb-tok", "input": [5, 6, 7]}, "it-emb-tok")
        self.assertEqual(resp.status, 200)
        self.check_batch(e, "embeddings", 1, 3)

    def test_rerank(self):
        body = {"model": "rr", "query": "what is blue", "documents": ["the sky", {"text": "the sea"}, "a leaf"]}
        resp, e = self.post("/v1/rerank", body, "it-rerank")
        self.assertEqual(resp.status, 200)
        ans = resp.json()
        self.assertEqual(len(ans["results"]), 3)
        # vLLM's rerank reports usage.total_tokens only: read as the input
        self.assertEqual(ans["usage"], {"total_tokens": 3 * 3 + 2 + 2 + 2})
        self.check_batch(e, "rerank", 3, ans["usage"]["total_tokens"])

    def test_error_answer_counted(self):
        # a model is admitted to the series by a successful answer first
        # (an error alone counts under "other": docs/storage.md, the model cap)
        ok, _ = self.post(PATH, {"model": "emb-bad", "input": "fine"}, "it-emb-bad-ok")
        self.assertEqual(ok.status, 200)
        resp, e = self.post(PATH, {"model": "emb-bad", "input": ["a", 5]}, "it-emb-bad")
        self.assertEqual(resp.status, 400)
        self.assertEqual(e["api"], "embeddings")
        self.assertEqual(e["status"], 400)
        self.assertEqual(e["inputs"], 2)
        self.assertIsNone(e["input_tokens"])
        self.assertIsNone(e["per_input_ms"])
        self.assertIsNone(e["input_tps"])
        s = self.series("emb-bad", 2)
        self.assertEqual((s["status"]["2xx"], s["status"]["4xx"]), (1, 1), s)
        self.assertEqual(s["input_tokens"], 1)
        self.assertEqual(s["metrics"]["per_input"]["count"], 1, "the error has no inputs' time")

    def series(self, model, n=1):
        s = harness.model_series(self.admin, model, n)
        self.assertIsNotNone(s, "no /stats series for model %s" % model)
        return s

    def check_stats(self, model, e):
        s = self.series(model)
        self.assertEqual(s["input_tokens"], e["input_tokens"])
        h = s["metrics"]["per_input"]
        self.assertEqual(h["count"], 1, h)
        self.assertAlmostEqual(h["p50_ms"], e["per_input_ms"], delta=max(0.05 * e["per_input_ms"], 0.05), msg=h)
        r, _ = harness.exchange(self.admin, "GET", "/metrics")
        text = r.body.decode()
        line = [ln for ln in text.splitlines() if ln.startswith("tokentap_per_input_seconds_count") and
                'model="%s"' % model in ln]
        self.assertEqual(len(line), 1, "no per_input family for %s" % model)
        self.assertEqual(float(line[0].split()[-1]), 1.0)


class ForwardedAsIsTest(harness.TestCase):
    """What the upstream may accept is forwarded whatever tokentap makes of it."""

    @classmethod
    def setUpClass(cls):
        def handler(sock, req, ctx):
            body = b'{"object":"list","data":[],"model":"m","usage":{"prompt_tokens":7,"total_tokens":7}}'
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            return True

        cls.up = harness.start_fake_upstream(cls, handler)
        cls.start_logged(cls.up.url, "tokentap-embed-fwd-")

    def test_number_input(self):
        for i, raw in enumerate((b'{"model":"m","input":42}', b'{"model":"m","input":null}',
                                 b'{"model":"m","input":{"a":[1,2]}}')):
            with self.subTest(body=raw):
                rid = "it-emb-num-%d" % i
                resp, _ = harness.exchange(self.tt.port, "POST", PATH, raw, [("x-request-id", rid)])
                self.assertEqual(resp.status, 200)
                self.assertEqual(self.up.requests[-1].body, raw, "body forwarded byte for byte")
                e = self.log_entry(self.log, rid)
                self.assertEqual(e["api"], "embeddings")
                self.assertIsNone(e["inputs"], "inputs absent, not 0")
                self.assertIsNone(e["per_input_ms"])
                self.assertEqual(e["input_tokens"], 7)
                self.assertIsNone(e["input_tps"], "no rate without the inputs")

    def test_other_paths(self):
        """/v1/score counts text_2, /classify input, TEI's /embed inputs
        and TEI's /rerank its texts."""
        cases = (("/v1/score", b'{"text_1":"q","text_2":["a","b","c","d"]}', "score", 4),
                 ("/classify", b'{"input":["x","y"]}', "classify", 2),
                 ("/embed", b'{"inputs":"one"}', "tei-embed", 1),
                 ("/rerank", b'{"query":"q","texts":["a","b","c"]}', "rerank", 3))
        for path, raw, api, n in cases:
            with self.subTest(path=path):
                rid = "it-emb-path-" + api
                resp, _ = harness.exchange(self.tt.port, "POST", path, raw, [("x-request-id", rid)])
                self.assertEqual(resp.status, 200)
                e = self.log_entry(self.log, rid)
                self.assertEqual((e["api"], e["inputs"]), (api, n))
                # TEI's /embed answers a bare array: no usage is read from it
                self.assertEqual(e["input_tokens"], None if api == "tei-embed" else 7)


class OpenAISdkEmbeddingsTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        test_responses.npm_install_sdk()
        cls.sim = harness.start_sim(cls, "--seed", "5")
        cls.start_logged(cls.sim.url, "tokentap-embed-sdk-")

    def test_sdk_embeddings_create(self):
        rid = "it-emb-sdk"
        p = subprocess.run(["node", SDK_SCRIPT, test_responses.SDK_DIR, "http://127.0.0.1:%d/v1" % self.tt.port,
                            rid, "3"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        res = json.loads(p.stdout)
        self.assertEqual(len(res["data"]), 3)
        self.assertTrue(all(len(d["embedding"]) == 8 and all(-1 <= v < 1 for v in d["embedding"])
                            for d in res["data"]), res)
        e = self.log_entry(self.log, rid)
        self.assertEqual(e["api"], "embeddings")
        self.assertEqual(e["inputs"], 3)
        self.assertEqual(e["input_tokens"], res["usage"]["prompt_tokens"])
        self.assertAlmostEqual(e["per_input_ms"], e["e2e_ms"] / 3, delta=ROUND_MS)
        self.assertGreaterEqual(e["e2e_ms"], 9.0)


if __name__ == "__main__":
    harness.unittest.main()
