"""TLS on both sides, over real sockets, with certificates this test makes
with the openssl command: a client through tokentap's TLS listener; a
plain-HTTP tokentap whose upstream is https (another tokentap terminating
TLS in front of the simulator); a certificate that does not verify and a
name that does not match (502, nothing sent); garbage instead of a TLS
handshake; a slow reader through TLS; and a reload that picks up a renewed
certificate."""

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import harness
import routing_helpers as rh

BODY = rh.chat(stream=True, stream_options={"include_usage": True})


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(d, cn="localhost", name="srv", alt=(), ip=True):
    """A CA (made once per directory) and a server certificate for `cn`
    (and the DNS names in `alt`) and, with `ip`, 127.0.0.1, signed by it."""
    if not os.path.exists(os.path.join(d, "ca.pem")):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days",
                "2", "-subj", "/CN=tokentap-test-ca", cwd=d)
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("subjectAltName=%s%s\n" % (",".join("DNS:" + n for n in (cn,) + tuple(alt)), ",IP:127.0.0.1" if ip else ""))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj",
            "/CN=" + cn, cwd=d)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            name + ".pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")


def tls_conn(port, cafile, timeout=10.0):
    conn = harness.HttpConn(port, timeout=timeout)
    ctx = ssl.create_default_context(cafile=cafile)
    conn.sock = ctx.wrap_socket(conn.sock, server_hostname="localhost")
    return conn


def tls_exchange(port, cafile, body=BODY, headers=None):
    conn = tls_conn(port, cafile)
    try:
        conn.send(harness.request_bytes("POST", rh.CHAT, body, headers, port))
        return conn.read_response("POST")
    finally:
        conn.close()


def start_sni_server(test, cert, key):
    """An HTTPS upstream (Python's ssl) that records the SNI name of each
    handshake in `.names` and answers each request with a small JSON body."""
    names = []
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sslobj, name, c: names.append(name)

    def answer(sock, req, fu):
        body = b'{"ok":true}'
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
        return False

    srv = harness.start_fake_upstream(test, answer, tls=ctx)
    srv.names = names
    return srv


class TlsTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-tls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")

    def setUp(self):
        self.sim = harness.start_sim(self, "--ttft-ms", "5", "--itl-ms", "2")

    def terminator(self):
        """tokentap with a TLS listener in front of the simulator."""
        return rh.start_conf(self, rh.upstreams_yaml({"sim": self.sim.url}) + "tls:\n  cert: %s\n  key: %s\n" % (
            self.cert, self.key))

    def test_client_through_tls_listener_is_byte_exact(self):
        tt = self.terminator()
        direct, _ = harness.exchange(self.sim.port, "POST", rh.CHAT, body=BODY)
        via = tls_exchange(tt.port, self.ca)
        self.assertEqual(via.status, 200)
        self.assertEqual(via.body, direct.body)
        self.assertIn(b"data: [DONE]", via.body)
        (entry,) = tt.wait_log_count(1)
        self.assertEqual(entry["status"], 200)
        self.assertIsNotNone(entry["ttft_ms"])

    def test_https_upstream_verified_and_byte_exact(self):
        term = self.terminator()
        front = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                              "    tls: {ca_file: %s}\n" % (term.port, self.ca), "--admin", "127.0.0.1:0",
                              *rh.ONE_WORKER)
        direct, _ = harness.exchange(self.sim.port, "POST", rh.CHAT, body=BODY)
        for _ in range(3):  # the second and third reuse the pooled TLS connection
            via, _ = harness.exchange(front.port, "POST", rh.CHAT, body=BODY)
            self.assertEqual(via.status, 200)
            self.assertEqual(via.body, direct.body)
        entries = front.wait_log_count(3)
        self.assertTrue(all(e["upstream"] == "secure" and e["error"] is None for e in entries))
        r, _ = harness.exchange(harness.admin_port(front), "GET", "/upstreams")
        (up,) = r.json()["upstreams"]
        self.assertEqual((up["pool"]["opened"], up["pool"]["reused"]), (1, 2), up["pool"])

    def assert_tls_refused(self, front, reason):
        before = self.sim.stats()["requests"]
        resp, _ = harness.exchange(front.port, "POST", rh.CHAT, body=BODY)
        self.assertEqual(resp.status, 502)
        err = resp.json()["error"]
        self.assertEqual(err["type"], "upstream_tls")
        self.assertIn(reason, err["message"])
        self.assertEqual(self.sim.stats()["requests"], before, "nothing went past the failed handshake")
        self.assertTrue(harness.wait_until(lambda: reason in front.stderr_text(), 2.0), "the reason is logged")

    def test_unverifiable_certificate_is_refused(self):
        term = self.terminator()
        # no ca_file: the system store does not know this test's CA
        front = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n" % term.port)
        self.assert_tls_refused(front, "unable to get local issuer certificate")

    def test_wrong_name_is_refused(self):
        term = self.terminator()
        front = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                              "    tls: {ca_file: %s, server_name: other.example}\n" % (term.port, self.ca))
        self.assert_tls_refused(front, "hostname mismatch")

    def test_garbage_instead_of_tls(self):
        tt = self.terminator()
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b"\x16\x03\x01\xff\xff" + b"A" * 200):
            s = socket.create_connection((harness.LOOPBACK, tt.port), timeout=3)
            t0 = time.monotonic()
            s.sendall(junk)
            data, closed = b"", False
            try:
                for _ in range(100):  # an alert may come first; then the close
                    chunk = s.recv(4096)
                    if not chunk:
                        closed = True
                        break
                    data += chunk
            except ConnectionResetError:
                closed = True
            except socket.timeout:
                pass
            took = time.monotonic() - t0
            s.close()
            self.assertTrue(closed and took < 1.0, "%r: connection %s after %.2f s" % (
                junk[:8], "closed" if closed else "still open", took))
            self.assertNotIn(b"HTTP/1.1", data)
        resp = tls_exchange(tt.port, self.ca)
        self.assertEqual(resp.status, 200, "still serving after the junk")

    def test_tls_1_1_client_is_refused(self):
        tt = self.terminator()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(self.ca)
        with __import__("warnings").catch_warnings():
            __import__("warnings").simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client may offer 1.1; the server must not take it
        s = socket.create_connection((harness.LOOPBACK, tt.port), timeout=3)
        try:
            with self.assertRaises(ssl.SSLError) as cm:
                ctx.wrap_socket(s, server_hostname="localhost")
        finally:
            s.close()
        self.assertIn("PROTOCOL_VERSION", str(cm.exception).upper().replace(" ", "_"), cm.exception)
        self.assertEqual(tls_exchange(tt.port, self.ca).status, 200, "a TLS 1.2+ client still gets through")

    def test_sni_from_url_host_and_server_name(self):
        d = tempfile.mkdtemp(prefix="tokentap-tls-sni-", dir=self.dir)
        shutil.copy(self.ca, os.path.join(d, "ca.pem"))
        shutil.copy(os.path.join(self.dir, "ca.key"), os.path.join(d, "ca.key"))
        cert, key = make_pki(d, name="sni", alt=("sni.test",))
        srv = start_sni_server(self, cert, key)
        for server_name, want in ((None, "localhost"), ("sni.test", "sni.test")):
            with self.subTest(server_name=server_name):
                tls = "{ca_file: %s%s}" % (self.ca, ", server_name: " + server_name if server_name else "")
                front = rh.start_conf(self, "upstreams:\n  - name: sni\n    url: https://localhost:%d\n"
                                      "    tls: %s\n" % (srv.port, tls))
                n0 = len(srv.names)
                resp, _ = harness.exchange(front.port, "POST", rh.CHAT, body=rh.chat())
                self.assertEqual(resp.status, 200, resp.body[:300])
                self.assertEqual(resp.body, b'{"ok":true}')
                self.assertEqual(srv.names[n0:], [want])
                front.stop()

    def test_no_sni_for_an_ip_literal(self):
        # RFC 6066: server_name carries host names only; an upstream named by
        # its IP address gets no SNI, and its certificate is still checked
        # against that address (the test certificate names IP:127.0.0.1)
        d = tempfile.mkdtemp(prefix="tokentap-tls-ip-", dir=self.dir)
        shutil.copy(self.ca, os.path.join(d, "ca.pem"))
        shutil.copy(os.path.join(self.dir, "ca.key"), os.path.join(d, "ca.key"))
        cert, key = make_pki(d, name="ip")
        srv = start_sni_server(self, cert, key)
        for host, want in (("127.0.0.1", None), ("localhost", "localhost")):
            with self.subTest(host=host):
                front = rh.start_conf(self, "upstreams:\n  - name: ip\n    url: https://%s:%d\n"
                                      "    tls: {ca_file: %s}\n" % (host, srv.port, self.ca))
                n0 = len(srv.names)
                resp, _ = harness.exchange(front.port, "POST", rh.CHAT, body=rh.chat())
                self.assertEqual(resp.status, 200, resp.body[:300])
                self.assertEqual(srv.names[n0:], [want])
                front.stop()
        # a certificate that does not name the address is refused
        cert, key = make_pki(d, name="dnsonly", ip=False)
        srv = start_sni_server(self, cert, key)
        front = rh.start_conf(self, "upstreams:\n  - name: ip\n    url: https://127.0.0.1:%d\n"
                              "    tls: {ca_file: %s}\n" % (srv.port, self.ca))
        self.assert_tls_refused(front, "certificate verify failed")

    def test_tls_on_both_sides_is_byte_exact(self):
        """TLS client -> tokentap's TLS listener -> https upstream (another
        tokentap terminating TLS in front of the simulator)."""
        term = self.terminator()
        front = rh.start_conf(self, "upstreams:\n  - name: secure\n    url: https://localhost:%d\n"
                              "    tls: {ca_file: %s}\ntls: {cert: %s, key: %s}\n"
                              % (term.port, self.ca, self.cert, self.key))
        direct, _ = harness.exchange(self.sim.port, "POST", rh.CHAT, body=BODY,
                                     headers=[("x-sim-tokens", "40")])
        for _ in range(2):
            via = tls_exchange(front.port, self.ca, headers=[("x-sim-tokens", "40")])
            self.assertEqual(via.status, 200)
            self.assertTrue(via.complete)
            self.assertEqual(via.body, direct.body)
        self.assertEqual([e["token_events"] for e in front.wait_log_count(2)], [40, 40])

    def test_slow_reader_through_tls_is_bounded(self):
        tt = self.terminator()
        conn = tls_conn(tt.port, self.ca, timeout=20)
        try:
            conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(stream=True),
                                            [("x-sim-tokens", "150000"), ("x-sim-itl-ms", "0")], tt.port))
            time.sleep(0.5)
            rss0 = tt.rss_kib()
            time.sleep(2.0)  # not reading: without backpressure tokentap would buffer tens of MB
            grown = tt.rss_kib() - rss0
            self.assertLess(grown, 16 * 1024, "RSS grew %d KiB while the client did not read" % grown)
            resp = conn.read_response("POST")
            self.assertEqual(resp.status, 200)
            self.assertTrue(resp.body.endswith(b"data: [DONE]\n\n"))
        finally:
            conn.close()

    @unittest.skipIf(harness.is_sanitized(), "RSS per connection says nothing under ASan (redzones, its quarantine "
                     "of freed memory); the plain build's run of this test is the check")
    def test_idle_tls_connections_stay_small(self):
        """Keep-alive TLS connections waiting for their next request hold no
        record buffers: OpenSSL's two (about 17 KiB each) are let go between
        reads and writes, so an idle TLS client costs about what a plain one
        does. Measured over many connections, as RSS."""
        n = 200
        tt = self.terminator()
        tls_exchange(tt.port, self.ca)  # the first handshake's one-off allocations
        conns = []
        try:
            rss0 = tt.rss_kib()
            for _ in range(n):
                conn = tls_conn(tt.port, self.ca)
                conns.append(conn)
                conn.send(harness.request_bytes("POST", rh.CHAT, rh.chat(), None, tt.port))
                self.assertEqual(conn.read_response("POST").status, 200)
            per = (tt.rss_kib() - rss0) / n
            self.assertLess(per, 24, "%.1f KiB of RSS per idle TLS connection" % per)
        finally:
            for c in conns:
                c.close()

    def test_plain_and_tls_listeners_side_by_side(self):
        body = rh.upstreams_yaml({"sim": self.sim.url}) + (
            "listeners:\n  - address: 127.0.0.1:0\n  - address: 127.0.0.1:0\n"
            "    tls: {cert: %s, key: %s}\n" % (self.cert, self.key))
        tt = rh.start_conf(self, body)
        line = [l for l in tt.stderr_text().split("\n") if "listening on" in l][0]
        ports = [int(p) for p in __import__("re").findall(r"127\.0\.0\.1:(\d+)", line)]
        self.assertEqual(len(ports), 2, line)
        self.assertIn("(tls)", line)
        plain, _ = harness.exchange(ports[0], "POST", rh.CHAT, body=BODY)
        secure = tls_exchange(ports[1], self.ca)
        self.assertEqual(plain.status, 200)
        self.assertEqual(secure.body, plain.body)

    def test_reload_with_a_bad_ca_file_keeps_the_running_config(self):
        term = self.terminator()
        d = tempfile.mkdtemp(prefix="tokentap-tls-ca-", dir=self.dir)
        ca = shutil.copy(self.ca, os.path.join(d, "ca.pem"))
        conf = ("upstreams:\n  - name: secure\n    url: https://localhost:%d\n    tls: {ca_file: %s}\n"
                % (term.port, ca))
        front = rh.start_conf(self, conf)
        self.assertEqual(harness.exchange(front.port, "POST", rh.CHAT, body=BODY)[0].status, 200)
        with open(ca, "w") as f:
            f.write("not a certificate\n")
        # the same upstream (name and url) is kept; its CA file no longer loads
        self.assertTrue(front.reload(conf, expect_ok=False), front.stderr_text())
        self.assertIn("ca_file", front.stderr_text())
        self.assertEqual(front.count_lines(rh.RELOAD_RE), 0, front.stderr_text())
        self.assertEqual(harness.exchange(front.port, "POST", rh.CHAT, body=BODY)[0].status, 200)

    def test_reload_picks_up_a_renewed_certificate(self):
        d = tempfile.mkdtemp(prefix="tokentap-tls-renew-", dir=self.dir)
        shutil.copy(self.ca, os.path.join(d, "ca.pem"))
        shutil.copy(os.path.join(self.dir, "ca.key"), os.path.join(d, "ca.key"))
        cert, key = make_pki(d, name="live")
        body = rh.upstreams_yaml({"sim": self.sim.url}) + "tls:\n  cert: %s\n  key: %s\n" % (cert, key)
        tt = rh.start_conf(self, body)

        def serial():
            conn = tls_conn(tt.port, self.ca)
            try:
                return conn.sock.getpeercert()["serialNumber"]
            finally:
                conn.close()

        first = serial()
        make_pki(d, name="live")  # a new certificate in the same files
        self.assertTrue(tt.reload(body))
        self.assertNotEqual(serial(), first)
        self.assertEqual(tls_exchange(tt.port, self.ca).status, 200)


if __name__ == "__main__":
    unittest.main()
