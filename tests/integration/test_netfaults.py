"""test_netfaults.py — real network faults, made inside a private network
namespace: an upstream address whose SYNs vanish, a path that goes dead
mid-stream, and a pooled connection whose server went away while the path
was dead. While a fault lasts no reset and no FIN reaches tokentap, so only
its own timers can tell; the tests check that they do, in bounded time,
that a cut stream never looks complete to its client, that a dead
connection is never reused, and that nothing leaks.

How it runs: ctest starts this file in the host's namespace, where no test
touches the network. Each test there re-executes itself, alone, under
`unshare --net` (a new namespace that vanishes with its last process), and
passes when that run passes. Inside, tokentap, the upstreams and the clients
all live in the namespace:

    lo: 127.0.0.1        clients -> tokentap, tokentap-sim (healthy upstream)
        10.9.0.1/32      the fake upstream of these tests; deleting the
                         address kills the path silently (below)
        10.9.0.0/24      routed to lo: 10.9.0.2 is nobody, its SYNs are
                         dropped on input (no forwarding, so no ICMP)

With 10.9.0.1 deleted, every segment either way of a connection to it is
discarded by the kernel (its source address is no longer local): both
sockets stay ESTABLISHED, writes succeed into the send buffer, nothing
arrives and nothing is reset. Putting the address back revives the path.

Where `unshare --net true` itself fails (not root, or a container that
forbids it) each test fails saying so, unless TOKENTAP_TEST_NO_ROOT=1 asks
to skip knowingly (ctest then shows a skip); everything after that must
work, and a failure inside the namespace fails the test. The host's network is never changed:
the inner run refuses to start unless it is in a namespace other than the
one it was started from, holding nothing but `lo`."""

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

import harness
import routing_helpers as rh

MODULE = "test_netfaults"
HERE = os.path.dirname(os.path.abspath(__file__))
# Set only by the re-execution below, to the inode of the namespace it left.
NETNS_ENV = "TOKENTAP_NETFAULTS_FROM_NETNS"
IN_NETNS = NETNS_ENV in os.environ

UP_ADDR = "10.9.0.1"  # the fake upstream; its path dies when the address goes
DEAD_ADDR = "10.9.0.2"  # routed, never answered: SYNs vanish
NET = "10.9.0.0/24"

TIMEOUT = 0.4  # connect and idle timeouts given to tokentap, seconds
SLACK = 0.8  # how much later than its timeout a timer may fire (ASan, a busy CI)
INNER_TIMEOUT_S = 30  # one test in the namespace, all included (ctest gives the file 120 s)
FD_WAIT_S = 4.0

CHAT = "/v1/chat/completions"

_unavailable = []


def netns_unavailable():
    """None when `unshare --net true` works here, else why not (cached)."""
    if not _unavailable:
        why = None
        try:
            res = subprocess.run(["unshare", "--net", "true"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, timeout=10)
            if res.returncode != 0:
                why = "exit status %d: %s" % (res.returncode, res.stderr.strip())
        except FileNotFoundError:
            why = "unshare(1) is not installed"
        _unavailable.append(why and ("network namespaces are not available (`unshare --net true`: %s); "
                                     "these tests need root or CAP_SYS_ADMIN" % why))
    return _unavailable[0]


def ip(*args):
    """Runs `ip ARGS` (in the test's namespace); fails the test on error."""
    try:
        res = subprocess.run(["ip"] + list(args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=5)
    except FileNotFoundError:
        raise AssertionError("ip(8) is not installed (Debian package iproute2)")
    if res.returncode != 0:
        raise AssertionError("ip %s: exit status %d: %s" % (" ".join(args), res.returncode, res.stderr.strip()))
    return res.stdout


def setUpModule():
    if not IN_NETNS:
        return
    # Never change a network this run did not create.
    ours = os.stat("/proc/self/ns/net").st_ino
    if str(ours) == os.environ[NETNS_ENV]:
        raise RuntimeError("%s is set but this is the namespace it names: refusing to touch its network" % NETNS_ENV)
    links = re.findall(r"^\d+: ([^:@]+)", ip("-o", "link", "show"), re.M)
    if links != ["lo"]:
        raise RuntimeError("not a fresh network namespace (links: %r): refusing to touch it" % links)
    ip("link", "set", "lo", "up")
    ip("addr", "add", UP_ADDR + "/32", "dev", "lo")
    ip("route", "add", NET, "dev", "lo")


def path_down():
    ip("addr", "del", UP_ADDR + "/32", "dev", "lo")


def path_up():
    ip("addr", "add", UP_ADDR + "/32", "dev", "lo")


def path_is_up():
    return UP_ADDR in ip("-o", "addr", "show", "dev", "lo")


def tcp_states(peer):
    """TCP states of this namespace's connections whose "LOCAL -> REMOTE"
    line contains `peer` (listeners left out)."""
    return [s.rsplit(" ", 1)[1] for s in harness.tcp_sockets().values() if peer in s and not s.endswith(" LISTEN")]


class PathUpstream:
    """A small threaded HTTP/1.1 server on UP_ADDR. `handler(sock, req, n)`
    answers one request that came on the n-th accepted connection (from 1)
    and returns True to keep the connection. Records (n, request id)."""

    def __init__(self, test, handler):
        self.handler = handler
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.conns = []
        self.threads = []
        self.requests = []
        self.errors = []
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((UP_ADDR, 0))
        self.lsock.listen(16)
        self.lsock.settimeout(0.05)
        self.port = self.lsock.getsockname()[1]
        self.url = "http://%s:%d" % (UP_ADDR, self.port)
        self.thread = threading.Thread(target=self._accept_loop, name="path-upstream", daemon=True)
        self.thread.start()
        test.addCleanup(self.stop)

    @property
    def connections(self):
        with self.lock:
            return len(self.conns)

    def _accept_loop(self):
        harness.accept_loop(self.lsock, self.stop_event, INNER_TIMEOUT_S, self._accepted, 10)

    def _accepted(self, s):
        with self.lock:
            self.conns.append(s)
            t = threading.Thread(target=self._serve, args=(s, len(self.conns)), daemon=True)
            self.threads.append(t)
        t.start()

    def _serve(self, s, n):
        state = bytearray()
        try:
            for _ in range(100):
                req = harness.read_request(s, state)
                if req is None or self.stop_event.is_set():
                    break
                with self.lock:
                    self.requests.append((n, req.header("x-request-id")))
                if not self.handler(s, req, n):
                    break
        except OSError:
            pass
        except Exception as e:  # surfaced by the tests through .errors
            self.errors.append(repr(e))
        finally:
            s.close()

    def shutdown_connections(self):
        """Ends every connection's serving thread; its close sends a FIN."""
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop_connections(self):
        """Forgets every connection as a restarted server would: its close
        sends a reset (lost if the path is dead) and keeps no state, so a
        later segment from the peer is answered with a reset."""
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RD)  # wakes the serving thread, which closes
            except OSError:
                pass

    def stop(self):
        self.stop_event.set()
        self.lsock.close()
        self.thread.join(2)
        self.shutdown_connections()
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(2)


def sse_event(text):
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


def answer_stream(sock, events):
    """A whole SSE stream, ended properly, on a kept-alive connection."""
    harness.send_sse_head(sock)
    for ev in events:
        harness.send_chunk(sock, ev)
    sock.sendall(b"0\r\n\r\n")
    return True


def answer_json(sock):
    body = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    return True


class NetnsTestCase(harness.TestCase):
    """A test that runs in a private network namespace. In the host's
    namespace, running the test means re-executing it there alone."""

    def run(self, result=None):
        if not IN_NETNS:
            # The test's body is replaced, for this instance only, by its
            # re-execution; setUp and the cleanups of the body never run here.
            setattr(self, self._testMethodName, self._run_in_netns)
        return super().run(result)

    def _run_in_netns(self):
        harness.require_root_feature(self, netns_unavailable())
        name = "%s.%s.%s" % (MODULE, type(self).__name__, self._testMethodName)
        env = dict(os.environ)
        env[NETNS_ENV] = str(os.stat("/proc/self/ns/net").st_ino)
        proc = subprocess.Popen(["unshare", "--net", "--", sys.executable, "-m", "unittest", "-v", name],
                                cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=INNER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=5)
            self.fail("%s did not finish within %d s in its namespace:\n%s"
                      % (name, INNER_TIMEOUT_S, out.decode("utf-8", "replace")[-8000:]))
        text = out.decode("utf-8", "replace")
        sys.stderr.write("\n  [in a private network namespace]\n  " + text.strip().replace("\n", "\n  ") + "\n")
        # Exactly this test ran, and passed; a skip in there is a failure.
        ok = proc.returncode == 0 and re.search(r"^Ran 1 test ", text, re.M) and re.search(r"^OK$", text, re.M)
        if not ok:
            self.fail("%s failed in its namespace (exit status %d):\n%s" % (name, proc.returncode, text[-8000:]))

    def start(self, upstreams):
        """tokentap, one worker (one pool), from a YAML file with the test
        timeouts and the upstreams {name: url}; requests go to the first
        unless pinned with x-tokentap-upstream. Admin API on, for the pool.
        Returns (tokentap, admin port, its fds while fresh and idle)."""
        body = ("workers: 1\n"
                "timeouts:\n  connect: %dms\n  idle: %dms\n"
                "override_header: x-tokentap-upstream\noverride_any_upstream: true\n" % (TIMEOUT * 1000, TIMEOUT * 1000)
                + rh.upstreams_yaml(upstreams) +
                "routes:\n  - name: all\n    match: {path_prefix: /}\n    upstream: %s\n" % next(iter(upstreams)))
        tt = rh.start_conf(self, body, "--admin", "127.0.0.1:0")
        admin = harness.admin_port(tt)
        return tt, admin, harness.fd_targets(tt.pid)

    def entry(self, tt, rid):
        e = harness.wait_log_entry(tt.log_path, lambda e: e.get("id") == rid)
        self.assertIsNotNone(e, "no access log line for %s: %r" % (rid, tt.access_log()))
        return e

    def fds_back(self, tt, admin, fds, what):
        self.assertFdsBack(tt, fds, extra=lambda: harness.pooled_connections(admin), timeout=FD_WAIT_S, what=what)

    def path_down(self):
        path_down()
        self.addCleanup(lambda: path_is_up() or path_up())


class SynDropTest(NetnsTestCase):
    def test_syn_drop_is_connect_timeout(self):
        """An upstream whose SYNs vanish: 504 after the connect timeout, not
        before nor much after; the half-open socket is closed; a stream on
        a healthy upstream runs on through it untouched."""
        sim = harness.start_sim(self, "--ttft-ms", "0")
        dead = "%s:%d" % (DEAD_ADDR, 9)
        tt, admin, fds = self.start({"healthy": sim.url, "dead": "http://" + dead})
        tokens, itl_ms = 60, 20
        healthy = harness.HttpConn(tt.port)
        self.addCleanup(healthy.close)
        healthy.send(harness.request_bytes("POST", CHAT, harness.api_body("openai-chat"),
                                           harness.sim_headers(itl=itl_ms, tokens=tokens, request_id="nf-healthy")))
        head = healthy.read_head()
        self.assertEqual(head.status, 200)
        reader = threading.Thread(target=healthy.read_body, args=(head,), daemon=True)
        reader.start()

        conn = harness.HttpConn(tt.port)
        self.addCleanup(conn.close)
        t0 = time.monotonic()
        t0_ns = harness.now_ns()
        conn.send(harness.request_bytes("POST", CHAT, harness.api_body("openai-chat"),
                                        [("x-tokentap-upstream", "dead"), ("x-request-id", "nf-syn")]))
        # The SYN went out and nothing came back: tokentap's socket waits in SYN-SENT.
        self.assertTrue(harness.wait_until(lambda: "SYN_SENT" in tcp_states("-> " + dead), TIMEOUT, 0.01),
                        "no connection to %s in SYN-SENT: %r" % (dead, harness.tcp_sockets()))
        resp = conn.read_response()
        elapsed = time.monotonic() - t0
        t1_ns = harness.now_ns()
        self.assertProxyError(resp, 504)
        self.assertGreaterEqual(elapsed, TIMEOUT - 0.02, "504 before the connect timeout ran out")
        self.assertLess(elapsed, TIMEOUT + SLACK, "504 took %.2f s with a %.1f s connect timeout" % (elapsed, TIMEOUT))
        e = self.entry(tt, "nf-syn")
        self.assertEqual((e["status"], e["error"], e["upstream"]), (504, "timeout", "dead"))
        conn.close()

        reader.join(10)
        self.assertFalse(reader.is_alive(), "the healthy stream hung")
        self.assertTrue(head.complete, "the healthy stream was cut")
        events = harness.sse_events(head)
        self.assertEqual(sum(harness.is_token_event("openai-chat", ev) for ev in events), tokens)
        # It kept flowing while the other connect hung: at 20 ms a token,
        # a 400 ms wait holds about 20 of them.
        during = [ts for ts, _ in head.pieces if t0_ns <= ts <= t1_ns]
        self.assertGreaterEqual(len(during), 5, "the healthy stream stalled during the connect timeout")
        e = self.entry(tt, "nf-healthy")
        self.assertEqual((e["status"], e["error"], e["token_events"]), (200, None, tokens))
        healthy.close()

        self.assertNotIn("SYN_SENT", tcp_states("-> " + dead), "the timed-out connect is still pending")
        self.fds_back(tt, admin, fds, "after a connect timeout on dropped SYNs")


class DeadPathTest(NetnsTestCase):
    def test_dead_path_mid_stream(self):
        """The path to the upstream dies after three events while the
        upstream goes on writing: the idle timeout cuts the stream, the
        client sees the cut (no final chunk, no [DONE]), the request is
        logged as a timeout, and once the path is back the next request
        goes on a new connection, never on the dead one."""
        first = [sse_event("tok%d" % i) for i in range(3)]
        whole = [sse_event("new%d" % i) for i in range(5)] + [b"data: [DONE]\n\n"]
        dead = threading.Event()
        release = threading.Event()
        self.addCleanup(release.set)
        written_after = []

        def handler(sock, req, n):
            if req.header("x-request-id") != "nf-cut":
                return answer_stream(sock, whole)
            harness.send_sse_head(sock)
            for ev in first:
                harness.send_chunk(sock, ev)
            dead.wait(5)
            # Into the dead path, until the test has looked: the writes
            # succeed, nothing arrives.
            for i in range(250):
                if release.is_set():
                    break
                harness.send_chunk(sock, sse_event("lost%d" % i))
                written_after.append(i)
                time.sleep(0.02)
            harness.send_chunk(sock, b"data: [DONE]\n\n")
            sock.sendall(b"0\r\n\r\n")
            return False

        up = PathUpstream(self, handler)
        tt, admin, fds = self.start({"up": up.url})
        conn = harness.HttpConn(tt.port)
        self.addCleanup(conn.close)
        conn.send(harness.request_bytes("POST", CHAT, harness.api_body("openai-chat"), [("x-request-id", "nf-cut")]))
        resp = conn.read_head()
        self.assertEqual(resp.status, 200)
        body = conn.body_reader(resp)
        want = b"".join(first)
        got = b""
        for ts, piece in body:
            resp.pieces.append((ts, piece))
            got += piece
            if len(got) >= len(want):
                break
        self.assertEqual(got, want)
        last_ns = resp.pieces[-1][0]
        self.path_down()
        dead.set()
        for ts, piece in body:  # until tokentap closes the client's connection
            resp.pieces.append((ts, piece))
        cut = (harness.now_ns() - last_ns) / 1e9

        self.assertTrue(resp.closed, "the client's connection was not closed")
        self.assertFalse(resp.complete, "a stream cut by a dead path was ended as if complete")
        self.assertEqual(resp.body, want, "bytes after the path died, or a made-up end")
        self.assertGreaterEqual(cut, TIMEOUT - 0.02, "cut before the idle timeout ran out")
        self.assertLess(cut, TIMEOUT + SLACK, "cut %.2f s after the last byte with a %.1f s idle timeout"
                        % (cut, TIMEOUT))
        e = self.entry(tt, "nf-cut")
        self.assertEqual((e["status"], e["error"], e["token_events"]), (200, "timeout", 3))
        self.assertTrue(written_after, "the upstream's writes into the dead path failed: the drop was not silent")
        # Neither end learned anything: the upstream's socket is still established.
        self.assertEqual(tcp_states("%s:%d -> " % (UP_ADDR, up.port)), ["ESTABLISHED"])
        release.set()
        self.assertEqual(harness.pooled_connections(admin), 0, "the dead connection went back to the pool")
        self.fds_back(tt, admin, fds, "after an idle timeout on a dead path")

        path_up()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, harness.api_body("openai-chat"),
                                   [("x-request-id", "nf-after")], timeout=5)
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.complete)
        self.assertEqual(resp.body, b"".join(whole))
        self.assertEqual(up.requests, [(1, "nf-cut"), (2, "nf-after")], "the dead connection was reused")
        e = self.entry(tt, "nf-after")
        self.assertEqual((e["status"], e["error"]), (200, None))
        self.assertEqual(up.errors, [])
        self.fds_back(tt, admin, fds, "after the path came back")


class DeadWhileIdleTest(NetnsTestCase):
    def test_pooled_connection_lost_behind_dead_path(self):
        """A pooled connection that the server forgot (a restart) while
        the path was dead: its reset never arrived, so tokentap still pools
        it. Once the path is back, reusing it meets a reset, and the
        request is sent again on a new connection: 200 at once, no timeout
        waited out."""
        up = PathUpstream(self, lambda sock, req, n: answer_json(sock))
        tt, admin, fds = self.start({"up": up.url})
        resp, _ = harness.exchange(tt.port, "POST", CHAT, harness.api_body("openai-chat", stream=False),
                                   [("x-request-id", "nf-1")], timeout=5)
        self.assertEqual(resp.status, 200)
        self.assertTrue(harness.wait_until(lambda: harness.pooled_connections(admin) == 1, 2.0),
                        "the first connection was not pooled")

        self.path_down()
        up.drop_connections()
        server_side = "%s:%d -> " % (UP_ADDR, up.port)
        self.assertTrue(harness.wait_until(lambda: not tcp_states(server_side), 2.0),
                        "the server still holds the connection: %r" % harness.tcp_sockets())
        tokentap_side = "-> %s:%d " % (UP_ADDR, up.port)
        self.assertEqual(tcp_states(tokentap_side), ["ESTABLISHED"], "the server's reset got through the dead path")
        self.assertEqual(harness.pooled_connections(admin), 1, "tokentap learned of a reset it cannot have seen")
        path_up()

        t0 = time.monotonic()
        resp, _ = harness.exchange(tt.port, "POST", CHAT, harness.api_body("openai-chat", stream=False),
                                   [("x-request-id", "nf-2")], timeout=5)
        elapsed = time.monotonic() - t0
        self.assertEqual(resp.status, 200, resp.body[:300])
        self.assertTrue(resp.complete)
        self.assertLess(elapsed, TIMEOUT, "the request waited out a timeout (%.2f s)" % elapsed)
        self.assertEqual(up.requests, [(1, "nf-1"), (2, "nf-2")])
        # It went to the pooled connection first, and was sent again.
        self.assertTrue(harness.wait_until(lambda: re.search(r"request nf-2: pooled connection .*sending again",
                                                             tt.stderr_text()), 2.0),
                        "no resend on a new connection logged:\n%s" % tt.stderr_text())
        e = self.entry(tt, "nf-2")
        self.assertEqual((e["status"], e["error"]), (200, None))
        self.assertEqual(up.errors, [])
        self.fds_back(tt, admin, fds, "after a lost pooled connection was replaced")


if __name__ == "__main__":
    unittest.main()
