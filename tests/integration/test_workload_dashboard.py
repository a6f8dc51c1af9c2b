"""test_workload_dashboard.py — the dashboard's workload panel (#workload)
in headless Chromium, against GET /workload.

tokentap-sim behind a capturing tokentap gets test_dashboard's traffic (model
dash-a at 1, 2 and 4 in flight, dash-b one at a time). Chromium then dumps
the page's DOM (virtual time, as test_dashboard.py): the panel's figures
(each row's data-value) are /workload's numbers, its bars are /workload's
histograms and arrival series bucket for bucket, the selector lists the
routes and models /workload breaks down; opened with #workload=model:dash-b
it draws that model's summary. A tokentap without a capture shows the panel
saying capture is off. No page error in any run. A screenshot of the
whole page goes to tests/artifacts/dashboard-workload.png.
"""

import os
import shutil
import tempfile

import harness
from test_admin import admin_get, admin_port
from test_dashboard import ARTIFACTS, Dom, check_no_page_errors, chromium_bin, run_chromium, send_traffic

BUDGET_MS = 3000  # one poll of /workload, at the page's start


def rows(dom):
    return {e["attrs"]["data-key"]: e["attrs"]["data-value"] for e in dom.inside("workload-figures", "tr")}


def bars(dom, svg_id, *attrs):
    return [tuple(int(e["attrs"][a]) for a in attrs) for e in dom.inside(svg_id, "rect", "wl-bar")]


class WorkloadPanel(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        chromium_bin()
        cls.dir = tempfile.mkdtemp(prefix="tokentap-wl-dash-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.sim = harness.start_sim(cls)
        cls.tt = harness.start_tokentap(cls, cls.sim.url, "--data-dir", "off", "--admin", "127.0.0.1:0",
                                        "--workload", os.path.join(cls.dir, "trace.jsonl"),
                                        "--workload-block-tokens", 16)
        cls.admin = admin_port(cls.tt)
        cls.total = send_traffic(cls.tt.port)
        if not harness.wait_until(lambda: admin_get(cls.admin, "/workload").json()["records"] >= cls.total, 10):
            raise AssertionError("/workload never counted %d records" % cls.total)
        cls.doc = admin_get(cls.admin, "/workload").json()

    def check_selection(self, dom, s):
        """The panel against one selection's summary `s`."""
        r = rows(dom)
        self.assertEqual(int(r["records"]), s["records"])
        for key in ("arrival_rate", "interarrival_cv", "prefix_sharing_ratio", "stream_share"):
            self.assertAlmostEqual(float(r[key]), s[key], places=9, msg=key)
        self.assertEqual(int(r["input_p50"]), s["input_length"]["p50"])
        self.assertEqual(int(r["output_p50"]), s["output_length"]["p50"])
        self.assertEqual(int(r["concurrency_p50"]), s["concurrency"]["p50"])
        for svg, key in (("wl-chart-input", "input_length"), ("wl-chart-output", "output_length"),
                         ("wl-chart-concurrency", "concurrency")):
            self.assertEqual(bars(dom, svg, "data-le", "data-count"),
                             [(b["le"], b["count"]) for b in s[key]["histogram"]], svg)
        self.assertEqual([c for _, c in bars(dom, "wl-chart-arrivals", "data-slot", "data-count")],
                         s["arrivals"]["counts"])
        self.assertEqual(sum(s["arrivals"]["counts"]), s["records"])

    def test_panel_draws_the_summary(self):
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % self.admin, "--dump-dom", budget_ms=BUDGET_MS)
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        sec = dom.by_id("workload")
        self.assertEqual(sec["attrs"]["data-capturing"], "1")
        self.assertEqual(sec["attrs"]["data-records"], str(self.total))
        self.assertNotIn("hidden", dom.by_id("workload-body")["attrs"])
        self.assertIn("hidden", dom.by_id("workload-off")["attrs"])
        self.check_selection(dom, self.doc)
        # the traffic had 1, 2 and 4 in flight: the panel shows more than one bucket
        self.assertGreater(len(self.doc["concurrency"]["histogram"]), 1)
        opts = [e["attrs"]["value"] for e in dom.inside("workload-select", "option")]
        self.assertEqual(opts, [""] + ["route:" + e["route"] for e in self.doc["by_route"]] +
                         ["model:" + e["model"] for e in self.doc["by_model"]])
        self.assertEqual(sorted(opts), sorted(["", "route:default", "model:dash-a", "model:dash-b"]))

    def test_one_model_selected(self):
        out, err = run_chromium(self, "http://127.0.0.1:%d/#workload=model:dash-b" % self.admin, "--dump-dom",
                                budget_ms=BUDGET_MS)
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        sec = dom.by_id("workload")
        self.assertEqual(sec["attrs"]["data-selected"], "model:dash-b")
        b = [e for e in self.doc["by_model"] if e["model"] == "dash-b"][0]
        self.assertEqual(b["records"], 4)
        self.check_selection(dom, b)
        self.assertEqual(b["concurrency"]["max"], 1)  # dash-b went one at a time

    def test_screenshot(self):
        # the whole page, tall enough to reach the panel at its end
        os.makedirs(ARTIFACTS, exist_ok=True)
        path = os.path.join(ARTIFACTS, "dashboard-workload.png")
        if os.path.exists(path):
            os.unlink(path)
        run_chromium(self, "http://127.0.0.1:%d/" % self.admin, "--hide-scrollbars", "--window-size=1400,3200",
                     "--screenshot=" + path, budget_ms=BUDGET_MS)
        self.assertGreater(os.path.getsize(path), 10000)


class WorkloadPanelOff(harness.TestCase):
    def test_capture_off_is_said(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--data-dir", "off", "--admin", "127.0.0.1:0")
        out, err = run_chromium(self, "http://127.0.0.1:%d/" % admin_port(tt), "--dump-dom", budget_ms=BUDGET_MS)
        dom = Dom(out)
        check_no_page_errors(self, dom, err)
        self.assertEqual(dom.by_id("workload")["attrs"]["data-capturing"], "0")
        off = dom.by_id("workload-off")
        self.assertNotIn("hidden", off["attrs"])
        self.assertIn("Workload capture is off", off["text"])
        self.assertIn("hidden", dom.by_id("workload-body")["attrs"])
        self.assertEqual(dom.inside("workload-figures", "tr"), [])


if __name__ == "__main__":
    import unittest
    unittest.main()
