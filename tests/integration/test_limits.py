"""The connection cap: past limits.max_connections, a new client gets 503
with a JSON message and is closed, while the streams already running go on
untouched; once connections close, new ones are served again."""

import socket
import threading
import unittest

import harness
import routing_helpers as rh


class ConnectionCapTest(harness.TestCase):
    def test_cap(self):
        sim = harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "20")
        tt = rh.start_conf(self, rh.upstreams_yaml({"sim": sim.url}) + "limits: {max_connections: 3}\n")
        direct, _ = harness.exchange(sim.port, "POST", rh.CHAT, body=rh.chat(stream=True),
                                     headers=[("x-sim-tokens", "40")])
        got = {}

        def stream():
            got["resp"] = rh.send(tt.port, rh.chat(stream=True), headers=[("x-sim-tokens", "40")])

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        idle = [socket.create_connection((harness.LOOPBACK, tt.port)) for _ in range(2)]
        self.assertTrue(harness.wait_until(lambda: harness.accepted_connections(tt.pid, tt.port) >= 3, 5.0),
                        "tokentap did not take the three connections")
        data = harness.answer_on_connect(tt.port)
        self.assertTrue(data.startswith(b"HTTP/1.1 503 "), data[:80])
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertIn(b"too many connections", body)
        self.assertIn(b"content-length: %d" % len(body), head)
        t.join(10)
        self.assertEqual(got["resp"].status, 200)
        self.assertEqual(got["resp"].body, direct.body, "the running stream was not disturbed")
        for s in idle:
            s.close()
        # the count comes down as tokentap sees them close: served again
        self.assertTrue(harness.wait_until(lambda: rh.send(tt.port, rh.chat()).status == 200, 5.0, 0.05),
                        "not served again below the cap")
        self.assertTrue(harness.wait_until(lambda: "connection cap of 3 reached" in tt.stderr_text(), 2.0))


if __name__ == "__main__":
    unittest.main()
