"""test_engine_metrics.py — issue #17 item 3: the engines' own /metrics,
scraped per upstream (docs/metrics.md "The engine's view").

- Config: `metrics_url`, `metrics_interval` and `engine` on an upstream entry
  are checked by `tokentap -t` with FILE:LINE messages.
"""

import unittest

import harness
import routing_helpers as rh

BASE = """\
listen: 127.0.0.1:0
admin: {listen: "off"}
store: {dir: "off"}
upstreams:
  - name: a
    url: http://127.0.0.1:9
"""


class ConfigTest(harness.TestCase):
    def problems(self, extra):
        text = BASE + extra
        res, name = rh.check_config(text)
        return text, res, rh.problem_lines(res, name)

    def test_good_keys(self):
        for extra in ("    metrics_url: http://127.0.0.1:9/metrics\n",
                      "    metrics_url: http://[::1]:9/metrics\n    metrics_interval: 250ms\n    engine: vllm\n",
                      "    metrics_url: http://localhost:9/m?x=1\n    engine: auto\n",
                      "    metrics_url: http://127.0.0.1:9/metrics\n    engine: sglang\n",
                      "    metrics_url: http://127.0.0.1:9/metrics\n    engine: llamacpp\n"):
            with self.subTest(extra=extra):
                _, res, probs = self.problems(extra)
                self.assertEqual(res.returncode, 0, res.stderr)
                self.assertEqual(probs, [])

    def test_bad_keys(self):
        cases = [
            ("    metrics_url: ftp://127.0.0.1:9/metrics\n", "metrics_url", "upstreams[0].metrics_url"),
            ("    metrics_url: https://127.0.0.1:9/metrics\n", "metrics_url", "http://"),
            ("    metrics_url: http://127.0.0.1:99999/metrics\n", "metrics_url", "port"),
            ("    metrics_url: http:///metrics\n", "metrics_url", "host"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 5 parsecs\n",
             "metrics_interval", "upstreams[0].metrics_interval"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 10ms\n",
             "metrics_interval", "100ms"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    metrics_interval: 2h\n",
             "metrics_interval", "5m"),
            ("    metrics_url: http://127.0.0.1:9/metrics\n    engine: tgi\n", "engine",
             "auto, vllm, sglang or llamacpp"),
            ("    metrics_interval: 5s\n", "metrics_interval", "needs metrics_url"),
            ("    engine: vllm\n", "engine", "needs metrics_url"),
        ]
        for extra, key, sub in cases:
            with self.subTest(extra=extra):
                text, res, probs = self.problems(extra)
                self.assertEqual(res.returncode, 1, res.stderr)
                self.assertEqual(len(probs), 1, res.stderr)
                self.assertEqual(probs[0][0], rh.line_of(text, key + ":"), res.stderr)
                self.assertIn(sub, probs[0][1])


if __name__ == "__main__":
    unittest.main()
