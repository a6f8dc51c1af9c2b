"""The admin listener's own limits: at most ADMIN_MAX_CONNECTIONS (64)
connections at once, a new one past the cap closed at once, so that a flood
of the admin port cannot take the descriptors forwarding needs; and a real
per-request deadline: a request must arrive whole within
ADMIN_REQUEST_DEADLINE_S (10 s) of the connection opening or of the previous
answer on it, however it trickles, while a keep-alive connection that sends
each request promptly is served for longer than that."""

import socket
import threading
import time
import unittest

import harness

CAP = 64
OVER = 16
DEADLINE_S = 10.0


def healthz(port):
    """Status of GET /healthz on a new connection, or None when it got none."""
    try:
        resp, _ = harness.exchange(port, "GET", "/healthz", headers=[("Connection", "close")], timeout=2.0)
    except OSError:
        return None
    return resp.status if resp is not None else None


def proxied_ok(port):
    """Whether a GET through the proxy gets the simulator's 200."""
    resp, _ = harness.exchange(port, "GET", "/v1/models", headers=[("Connection", "close")], timeout=2.0)
    return resp is not None and resp.status == 200


def closed_within(sock, timeout):
    """Whether the peer closed `sock` (EOF or reset) within `timeout` s."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class AdminConnectionCapTest(harness.TestCase):
    def test_cap(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--workers", "1", "--admin", harness.LOOPBACK + ":0")
        aport = harness.admin_port(tt)
        self.assertEqual(healthz(aport), 200)
        self.assertTrue(proxied_ok(tt.port))  # its pooled upstream connection is in the baseline
        time.sleep(0.2)
        base = harness.fd_count(tt.pid)
        idle, over = [], []
        try:
            for _ in range(CAP):
                idle.append(socket.create_connection((harness.LOOPBACK, aport), timeout=2.0))
            time.sleep(0.3)
            for _ in range(OVER):
                over.append(socket.create_connection((harness.LOOPBACK, aport), timeout=2.0))
            # past the cap: closed at once, not kept
            until = time.monotonic() + 2.0
            shut = sum(1 for s in over if closed_within(s, max(0.01, until - time.monotonic())))
            self.assertEqual(shut, OVER, "connections past the cap left open")
            self.assertEqual(healthz(aport), None, "served past the cap")
            n = harness.fd_count(tt.pid)
            self.assertLessEqual(n, base + CAP + 2, "%d fds open with %d admin connections" % (n, CAP + OVER))
            # forwarding goes on meanwhile
            self.assertTrue(proxied_ok(tt.port))
            for s in idle[: CAP // 2]:
                s.close()
            self.assertTrue(harness.wait_until(lambda: healthz(aport) == 200, 3.0, 0.05),
                            "not served again below the cap; stderr:\n%s" % tt.stderr_text())
        finally:
            for s in idle + over:
                s.close()
        self.assertIn("admin: connection cap of %d reached" % CAP, tt.stderr_text())
        self.assertTrue(harness.wait_until(lambda: harness.fd_count(tt.pid) <= base, 3.0, 0.05),
                        "%d fds open after the connections closed, %d before" % (harness.fd_count(tt.pid), base))


class AdminDeadlineTest(harness.TestCase):
    def test_trickled_request_cut_at_deadline(self):
        sim = harness.start_sim(self)
        tt = harness.start_tokentap(self, sim.url, "--workers", "1", "--admin", harness.LOOPBACK + ":0")
        aport = harness.admin_port(tt)
        kept = {}

        def keepalive():
            # one request every 4 s on one connection, for longer than the
            # deadline: each arrives promptly, so each is answered
            conn = harness.HttpConn(aport, timeout=3.0)
            statuses = []
            try:
                for i in range(4):
                    if i:
                        time.sleep(4.0)
                    conn.send(harness.request_bytes("GET", "/healthz"))
                    statuses.append(conn.read_response(method="GET").status)
            except OSError as e:
                statuses.append(repr(e))
            finally:
                conn.close()
            kept["statuses"] = statuses

        t = threading.Thread(target=keepalive, daemon=True)
        t.start()
        sock = socket.create_connection((harness.LOOPBACK, aport), timeout=2.0)
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"a" * 200
        start = time.monotonic()
        cut = None
        try:
            for i in range(int((DEADLINE_S + 4.0) / 0.2)):
                try:
                    sock.sendall(head[i % len(head) : i % len(head) + 1])
                except (BrokenPipeError, ConnectionResetError):
                    cut = time.monotonic() - start
                    break
                if closed_within(sock, 0.2):
                    cut = time.monotonic() - start
                    break
        finally:
            sock.close()
        self.assertIsNotNone(cut, "a request trickled for %.0f s was never cut" % (DEADLINE_S + 4.0))
        self.assertGreaterEqual(cut, DEADLINE_S - 0.5)
        self.assertLessEqual(cut, DEADLINE_S + 1.5, "cut after %.1f s" % cut)
        t.join(20)
        self.assertEqual(kept.get("statuses"), [200] * 4)
        self.assertEqual(healthz(aport), 200)


if __name__ == "__main__":
    unittest.main()
