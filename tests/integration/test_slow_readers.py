"""test_slow_readers.py — clients reading a fast stream at 1 KiB/s, one and
2,000 at once, over plain TCP and TLS: tokentap stops reading each upstream,
its memory per stream stays within the bound docs/security.md states
(STREAM_BOUND_KIB, "Memory per slow reader"), every stream keeps moving and
is byte-exact, and every fd is given back once the clients leave.

The simulator produces tokens as fast as they are read (itl 0); the clients
read 1 KiB a second. Memory is tokentap's RssAnon (heap and stacks, not the
binary's pages nor the store's mapped file). Backpressure is also observed
directly: the receive queue of every tokentap-to-simulator connection
(/proc/net/tcp) holds bytes tokentap has stopped reading.

Kernel memory is kept modest on purpose, since loopback TCP would otherwise
buffer megabytes per stream: the clients use a small receive buffer and an
Internet-sized segment (TCP_MAXSEG 536, so tokentap's send buffer to them
autotunes to tens of KiB, not 4 MiB), and each of the 2,000 streams is
about 480 KiB long: enough to fill the client's socket and tokentap's
STREAM_BUFFER, with the rest waiting in tokentap's receive queue from the
simulator. The test prints what it saw: RSS per stream, the kernel's TCP
memory (/proc/net/sockstat) and the machine's MemAvailable before and during
(about 1.5 GB at the peak for 2,000 streams).

Under AddressSanitizer the numbers are the allocator's as much as
tokentap's: freed memory sits in a quarantine that RSS counts (the test
gives tokentap a 1 MB one unless ASAN_OPTIONS names one), every allocation
is padded, and large ones (a 128 KiB buffer chain) are mapped a page at a
time with a header page. So under ASan the many-stream tests allow
ASAN_ALLOCATOR_FACTOR times the bound (measured: 435 to 467 KiB a stream
against 384 plain, 508 against 576 over TLS) and run ASAN_STREAMS streams,
since the sanitizer build is several times slower and its job is to find
memory errors with many streams in flight (the normal build proves the
2,000); the single-stream tests assert ASAN_ONE_STREAM_KIB of growth at
most, against the ~23 MiB an unbounded proxy takes in, next to the unread
bytes in tokentap's receive queue.
"""

import hashlib
import os
import resource
import shutil
import socket
import ssl
import tempfile
import time
import unittest

import harness
import test_tls

CHAT = "/v1/chat/completions"
RATE = 1024  # bytes a second each client reads
TICK_S = 0.25  # how often the clients take their allowance
RCVBUF = 4096  # the clients' SO_RCVBUF (the kernel doubles it)
MSS = 536  # the clients' TCP_MAXSEG: IPv4's default segment

# docs/security.md, "Memory per slow reader": one streaming exchange whose
# client reads slower than its upstream writes costs tokentap at most this
# much: STREAM_BUFFER (256 KiB) + the upstream read that crosses it (64 KiB)
# + the output's last, partly filled chain and the connections' own state
# (64 KiB over plain TCP; 256 KiB over TLS, which adds OpenSSL's state).
STREAM_BOUND_KIB = {False: 384, True: 576}

# One stream: ~23 MiB, which an unbounded proxy would take in at once.
ONE_TOKENS = 100000
ONE_READ_S = 5.0
# Many streams: ~480 KiB each (see above), read for MANY_READ_S.
N_STREAMS = 2000
N_TLS_STREAMS = 1000  # TLS: half as many, see the module docstring
ASAN = harness.is_sanitized()
ASAN_STREAMS = {False: 500, True: 250}
ASAN_ALLOCATOR_FACTOR = 1.5
# One stream under ASan: its allocator's steps are megabytes, so only this
# much growth is asserted (an unbounded proxy takes the whole ~23 MiB in);
# the unread bytes in tokentap's receive queue show the backpressure itself.
ASAN_ONE_STREAM_KIB = 8192
MANY_TOKENS = 2050
MANY_READ_S = 10.0
# Under ASan the simulator takes longer to fill 2,000 streams: reading goes on
# (up to MANY_FILL_MAX_S) until tokentap's RSS has stopped growing.
MANY_FILL_MAX_S = 60.0

ASAN_QUARANTINE_MB = 1
# One stream is measured against the bound plus this: the allocator grows the
# heap in steps larger than one stream's bound, which 2,000 streams average
# out. An unbounded proxy would grow by the whole ~23 MiB stream.
ONE_STREAM_ALLOWANCE_KIB = 1024


def status_kib(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError("no %s for pid %d" % (field, pid))


def rss_anon_kib(pid):
    return status_kib(pid, "RssAnon")


def meminfo_kib(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError("no %s in /proc/meminfo" % field)


def tcp_mem_kib():
    """The kernel's TCP buffer memory, all sockets (/proc/net/sockstat counts
    pages)."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                w = line.split()
                return int(w[w.index("mem") + 1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    raise RuntimeError("no TCP line in /proc/net/sockstat")


def unread_upstream_queues(sim_port):
    """Receive-queue bytes of every established connection to the simulator's
    port, as seen from the connecting side (tokentap's upstream sockets)."""
    out = []
    with open("/proc/net/tcp") as f:
        lines = f.read().split("\n")[1:]
    for line in lines:
        w = line.split()
        if len(w) < 5 or w[3] != "01":
            continue
        if int(w[2].split(":")[1], 16) != sim_port:
            continue
        out.append(int(w[4].split(":")[1], 16))
    return out


def raise_fd_limit(want):
    """Children inherit it: tokentap needs two fds a stream, the simulator one,
    this process one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, OSError) as e:
        raise AssertionError("the test needs %d file descriptors; RLIMIT_NOFILE is %d/%d and cannot be raised: %s"
                             % (want, soft, hard, e))


def body_of(raw):
    """The bytes after the response head (None while the head is incomplete)."""
    i = raw.find(b"\r\n\r\n")
    return raw[i + 4:] if i >= 0 else None


def read_to_last_chunk(sock):
    """A whole chunked response from a blocking socket: up to its last chunk,
    or what came before the peer closed."""
    raw = bytearray()
    for _ in range(1 << 20):
        if raw.endswith(b"\r\n0\r\n\r\n"):
            break
        b = sock.recv(1 << 16)
        if not b:
            break
        raw += b
    return bytes(raw)


class Reader:
    """One client connection reading at most what it is allowed, never
    blocking: the raw response so far (head included) and how it ended."""

    __slots__ = ("sock", "data", "eof", "error")

    def __init__(self, sock):
        self.sock = sock
        self.data = bytearray()
        self.eof = False
        self.error = None

    def read(self, want):
        for _ in range(64):
            if want <= 0 or self.eof:
                return
            try:
                b = self.sock.recv(min(want, 16384))
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (OSError, ssl.SSLError) as e:
                self.error = repr(e)
                self.eof = True
                return
            if not b:
                self.eof = True
                return
            self.data += b
            want -= len(b)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def pace(readers, seconds, sample):
    """Lets every reader take RATE bytes a second for `seconds`, calling
    sample() after each tick."""
    start = time.monotonic()
    base = [len(r.data) for r in readers]
    for tick in range(int(seconds / TICK_S) + 2):
        el = time.monotonic() - start
        if el >= seconds:
            break
        allowance = int(RATE * el)
        for r, b in zip(readers, base):
            r.read(b + allowance - len(r.data))
        sample()
        left = start + (tick + 1) * TICK_S - time.monotonic()
        if left > 0:
            time.sleep(left)


class SlowReadersTest(harness.TestCase):
    @classmethod
    def setUpClass(cls):
        raise_fd_limit(2 * N_STREAMS + 1024)
        opts = os.environ.get("ASAN_OPTIONS", "")
        if "quarantine_size_mb" not in opts:
            # only this process's children read it; see the module docstring
            os.environ["ASAN_OPTIONS"] = (opts + ":" if opts else "") + "quarantine_size_mb=%d" % ASAN_QUARANTINE_MB
        cls.dir = tempfile.mkdtemp(prefix="tokentap-slow-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = test_tls.make_pki(cls.dir)
        cls.ca = os.path.join(cls.dir, "ca.pem")
        cls.sim = harness.start_sim(cls, "--ttft-ms", "0", "--itl-ms", "0")

    # ---- helpers

    def request(self, tokens, port):
        return harness.request_bytes("POST", CHAT, harness.api_body("openai-chat", True),
                                     harness.sim_headers(ttft=0, itl=0, tokens=tokens), port)

    def direct_body(self, tokens):
        """The raw (chunked) response body as the simulator sends it."""
        s = socket.create_connection((harness.LOOPBACK, self.sim.port), timeout=30)
        try:
            s.sendall(self.request(tokens, self.sim.port))
            raw = read_to_last_chunk(s)
        finally:
            s.close()
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 "), raw[:100])
        self.assertTrue(raw.endswith(b"\r\n0\r\n\r\n"), "direct stream incomplete")
        return bytes(body_of(bytes(raw)))

    def start_tokentap(self, tls):
        args = ["--admin", "127.0.0.1:0"]
        if tls:
            args += ["--tls-cert", self.cert, "--tls-key", self.key]
        tt = harness.start_tokentap(self, self.sim.url, *args)
        tt.admin = harness.admin_port(tt)
        tt.tls = tls
        tt.ctx = ssl.create_default_context(cafile=self.ca) if tls else None
        return tt

    def connect(self, tt):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, MSS)
            s.settimeout(30)
            s.connect((harness.LOOPBACK, tt.port))
            if tt.tls:
                s = tt.ctx.wrap_socket(s, server_hostname="localhost")
        except BaseException:
            s.close()
            raise
        return s

    def warm_up(self, tt, tokens):
        """A few whole streams, so the baseline includes what the first ones
        allocate for good."""
        for _ in range(4):
            s = self.connect(tt)
            try:
                s.sendall(self.request(tokens, tt.port))
                got = read_to_last_chunk(s)
            finally:
                s.close()
            self.assertTrue(got.endswith(b"\r\n0\r\n\r\n"), "warm-up stream incomplete")
        time.sleep(0.3)

    def baseline(self, tt):
        return {"rss": rss_anon_kib(tt.pid), "fds": harness.fd_targets(tt.pid),
                "pooled": harness.pooled_connections(tt.admin)}

    def pooled(self, tt):
        """Idle pooled upstream connections; a worker busy closing thousands
        of connections may not answer the admin API within its 2 s."""
        for _ in range(10):
            try:
                return harness.pooled_connections(tt.admin)
            except RuntimeError:
                time.sleep(0.5)
        return harness.pooled_connections(tt.admin)

    def assert_fds_back(self, tt, base, sim_fds):
        self.assertFdsBack(tt, base["fds"], timeout=30.0, extra=lambda: self.pooled(tt) - base["pooled"])
        # and the simulator has closed its side, before anything stops it
        ok, n, _ = harness.wait_fds(self.sim.pid, lambda: sim_fds + self.pooled(tt), 30.0, 0.1)
        self.assertTrue(ok, "the simulator still has %d fds open" % n)

    # ---- one slow reader

    def one_slow_reader(self, tls):
        tt = self.start_tokentap(tls)
        direct = self.direct_body(ONE_TOKENS)
        self.assertGreater(len(direct), 20 << 20, "test premise: a stream of over 20 MiB")
        self.warm_up(tt, 2000)
        base = self.baseline(tt)
        sim_fds = harness.fd_count(self.sim.pid) - base["pooled"]

        r = Reader(self.connect(tt))
        self.addCleanup(r.close)
        r.sock.sendall(self.request(ONE_TOKENS, tt.port))
        r.sock.setblocking(False)
        samples = []
        pace([r], ONE_READ_S, lambda: samples.append(rss_anon_kib(tt.pid)))
        queued = unread_upstream_queues(self.sim.port)
        peak = max(samples)
        late = peak - samples[len(samples) // 2]
        print("\n[slow_readers] one %s reader: %d bytes in %.0f s; tokentap RssAnon +%d KiB (late +%d KiB); "
              "unread from the simulator %s" % ("TLS" if tls else "plain", len(r.data), ONE_READ_S,
                                                peak - base["rss"], late, queued))

        self.assertFalse(r.eof, "stream ended while being read slowly: %r" % r.error)
        got = body_of(bytes(r.data))
        self.assertIsNotNone(got, "no response head in %d bytes" % len(r.data))
        self.assertTrue(r.data.startswith(b"HTTP/1.1 200 "), r.data[:100])
        self.assertGreater(len(r.data), RATE * ONE_READ_S / 2, "the slow reader barely moved")
        self.assertTrue(direct.startswith(got), "what arrived is not the start of the direct stream")
        # (the others are idle pooled connections from the warm-up)
        self.assertEqual(sum(q > 0 for q in queued), 1,
                         "tokentap kept reading the simulator while its client read 1 KiB/s: %r" % queued)
        bound = ASAN_ONE_STREAM_KIB if ASAN else STREAM_BOUND_KIB[tls] + ONE_STREAM_ALLOWANCE_KIB
        self.assertLessEqual(peak - base["rss"], bound,
                             "RSS grew by %d KiB for one slow reader; the bound is %d KiB" % (peak - base["rss"], bound))

        # the rest at full speed: the whole stream, intact
        r.sock.settimeout(30)
        h = hashlib.sha256(got)
        n = len(got)
        tail = got[-8:]
        for _ in range(1 << 20):
            b = r.sock.recv(1 << 16)
            if not b:
                break
            h.update(b)
            n += len(b)
            tail = (tail + b)[-8:]
            if tail.endswith(b"\r\n0\r\n\r\n"):
                break
        self.assertEqual(n, len(direct), "stream length through tokentap")
        self.assertEqual(h.hexdigest(), hashlib.sha256(direct).hexdigest(), "stream differs from the direct one")
        r.close()
        self.assert_fds_back(tt, base, sim_fds)

    def test_one_slow_reader_plain(self):
        self.one_slow_reader(False)

    def test_one_slow_reader_tls(self):
        self.one_slow_reader(True)

    # ---- many slow readers

    def many_slow_readers(self, tls, n):
        tt = self.start_tokentap(tls)
        direct = self.direct_body(MANY_TOKENS)
        self.warm_up(tt, MANY_TOKENS)
        base = self.baseline(tt)
        sim_fds = harness.fd_count(self.sim.pid) - base["pooled"]
        avail0, tcp0 = meminfo_kib("MemAvailable"), tcp_mem_kib()
        t0 = time.monotonic()
        req = self.request(MANY_TOKENS, tt.port)
        readers = []
        try:
            for _ in range(n):
                r = Reader(self.connect(tt))
                readers.append(r)
                r.sock.sendall(req)
                r.sock.setblocking(False)
            t_open = time.monotonic() - t0
            samples = []

            def sample():
                samples.append((rss_anon_kib(tt.pid), meminfo_kib("MemAvailable"), tcp_mem_kib()))

            for _ in range(int(MANY_FILL_MAX_S / (MANY_READ_S / 2))):
                pace(readers, MANY_READ_S / 2, sample)
                if len(samples) > 20 and samples[-1][0] - samples[-10][0] < samples[-1][0] // 100:
                    break  # tokentap's RSS has stopped growing
            half = [len(r.data) for r in readers]
            pace(readers, MANY_READ_S / 2, sample)
            queued = unread_upstream_queues(self.sim.port)
            peak = max(s[0] for s in samples)
            per = (peak - base["rss"]) / n
            print("\n[slow_readers] %d %s readers: opened in %.1f s, read for %.1f s; tokentap RssAnon %d -> %d KiB (%.0f KiB a stream),"
                  " simulator VmRSS %d KiB; kernel TCP memory %d -> %d KiB; MemAvailable %d -> %d KiB (-%d MiB);"
                  " %d of %d upstream connections with unread bytes (least %d)"
                  % (n, "TLS" if tls else "plain", t_open, time.monotonic() - t0 - t_open, base["rss"], peak, per, self.sim.rss_kib(), tcp0,
                     max(s[2] for s in samples), avail0, min(s[1] for s in samples),
                     (avail0 - min(s[1] for s in samples)) // 1024, sum(q > 0 for q in queued), len(queued), min(queued)))

            ended = [i for i, r in enumerate(readers) if r.eof]
            self.assertEqual(ended, [], "streams that ended while read slowly (first: %r)"
                             % (readers[ended[0]].error if ended else None))
            bad = [i for i, r in enumerate(readers)
                   if not r.data.startswith(b"HTTP/1.1 200 ") or body_of(bytes(r.data)) is None
                   or not direct.startswith(body_of(bytes(r.data)))]
            self.assertEqual(bad[:10], [], "%d streams are not the start of the direct stream" % len(bad))
            # every stream moved in the second half (a starved one would not)
            slow = [i for i, r in enumerate(readers) if len(r.data) - half[i] < RATE * MANY_READ_S / 8]
            self.assertEqual(slow[:10], [], "%d streams barely moved in the last %.0f s"
                             % (len(slow), MANY_READ_S / 2))
            bound = STREAM_BOUND_KIB[tls] * (ASAN_ALLOCATOR_FACTOR if ASAN else 1)
            self.assertLessEqual(per, bound, "tokentap RSS grew by %.0f KiB a stream over %d streams; the bound is %d KiB"
                                 % (per, n, bound))
        finally:
            for r in readers:
                r.close()
        self.assert_fds_back(tt, base, sim_fds)

    def test_many_slow_readers_plain(self):
        self.many_slow_readers(False, ASAN_STREAMS[False] if ASAN else N_STREAMS)

    def test_many_slow_readers_tls(self):
        self.many_slow_readers(True, ASAN_STREAMS[True] if ASAN else N_TLS_STREAMS)


if __name__ == "__main__":
    unittest.main()
