"""What one LMCache peer can make kvpoold hold: replies it never reads, connections, and
messages it never finishes (docs/SECURITY.md, "LMCache's protocol").

Usage (ctest label "lmcache"; run by the python of an LMCache virtual environment of
scripts/lmcache-env.sh, whose lmcache encodes the attackers' requests and whose real worker
is the honest peer beside them):
    python tests/lmcache/test_limits.py KVPOOLD

Each case runs a real kvpoold and measures what the attack cost it from /proc (resident
memory, CPU time), bounded in time:
  - replies: a peer that asks for a 32 MiB pickle retrieve again and again and never reads
    (4 KiB receive buffer) gets its first reply queued and the rest answered negatively,
    while an honest worker keeps reading its chunks;
  - connections: 1,100 connections under a descriptor limit of 1,024: the ones beyond
    --lmcache-max-connections are closed at the handshake, kvpool's own socket and HTTP keep
    answering, the daemon does not spin, and a worker connects again once they are gone;
  - messages: peers that announce a frame larger than --lmcache-max-message and send part
    of it are disconnected at the frame's header, holding nothing.
"""

import os
import re
import resource
import socket
import struct
import subprocess
import sys
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc_worker  # noqa: E402
import test_worker  # noqa: E402
from lmc_worker import Worker, wait_for  # noqa: E402
from lmcache.v1.multiprocess.transport.zmq_impl.mq import msgspec_encode  # noqa: E402
from lmcache.v1.multiprocess.transport.zmq_impl.wire import encode_operation  # noqa: E402
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: E402

import zmq  # noqa: E402

MiB = 1 << 20
# A sanitized daemon (make test-asan, test-tsan) has shadow memory for what it touches.
SANITIZED = "ASAN_OPTIONS" in os.environ or "TSAN_OPTIONS" in os.environ
SLACK = 4 if SANITIZED else 1


def rss(pid):
    """Resident memory of process pid, in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def cpu_seconds(pid):
    """User and system CPU time process pid has used."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_request(op, *payloads, uid=1):
    """The frames of one request as LMCache's client encodes them."""
    return [msgspec_encode(uid, int), encode_operation(op)] + list(payloads)


class Limits(unittest.TestCase):
    def setUp(self):
        self.d = None
        self.closers = []

    def start(self, *extra, prefix=()):
        self.d = test_worker.Daemon(*extra, prefix=prefix)

    def tearDown(self):
        for c in reversed(self.closers):
            c()
        if self.d:
            self.d.stop()

    def counters(self):
        return self.d.status()["counters"]

    def test_unread_replies_bounded(self):
        # 4 MiB chunks (256 tokens x 4 layers x 2 x 8 heads x 128 x 2 bytes), a 256 MiB pool:
        # the reply memory is its default, a quarter of the pool: 64 MiB, 16 MiB a client.
        self.start("--l1-size", "256MiB", "--chunk-size", "256", "--shm-name", "")
        w = Worker(self.d.url, model="big", layers=4, heads=8, head_size=128, block_size=16,
                   blocks=160, seed=1)
        self.closers.append(w.close)
        self.assertEqual(w.register(), "EngineDrivenContextPickle")
        toks = list(range(1, 8 * 256 + 1))
        self.assertTrue(w.store(toks, "s", end=len(toks)))
        self.assertEqual(self.d.gauge("objects_committed"), 8)

        ctx = zmq.Context()
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        bad.setsockopt(zmq.RCVBUF, 4096)
        bad.connect(self.d.url)
        self.closers.append(ctx.term)
        self.closers.append(bad.close)
        key = msgspec_encode(w.key(toks, "x", end=len(toks)), IPCCacheServerKey)
        iid = msgspec_encode(w.iid, int)
        before = rss(self.d.proc.pid)
        served = self.counters()["lmcache_requests"]
        n = 40
        for i in range(n):
            bad.send_multipart(raw_request("prepare_retrieve", key, iid, uid=i + 1))
        # Every request has been served (answered, negatively or not).
        self.assertTrue(wait_for(lambda: self.counters()["lmcache_requests"] >= served + n, 30))
        grown = rss(self.d.proc.pid) - before
        # One 32 MiB reply (and a second one while the first was counted as sending) may be
        # queued; 40 of them would be 1.25 GiB.
        self.assertLess(grown, SLACK * 160 * MiB, "daemon grew by %d MiB" % (grown // MiB))
        refused = self.counters().get("lmcache_replies_refused")
        self.assertGreaterEqual(refused, n - 3)
        self.assertIn("answered negatively: its client has", self.d.text())
        # The honest worker is served as before, its bytes exact.
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "h", out, end=len(toks)))
        self.assertTrue(w.blocks_equal(out, 8 * w.bic))
        self.assertEqual(self.counters()["lmcache_replies_refused"], refused)

    def test_connections_bounded(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 2600:
            print("skipped: this process may open %d descriptors, the test needs 2600" % hard,
                  file=sys.stderr)
            sys.exit(77)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        # systemd's default soft limit for a service's descriptors (as the hard one too), and
        # the default --lmcache-max-connections, 128.
        self.start(prefix=("prlimit", "--nofile=1024:1024", "--"))
        cli = os.path.join(os.path.dirname(test_worker.KVPOOLD), "kvpool")
        sock = os.path.join(self.d.dir, "kvpool.sock")

        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 4096)
        self.closers.append(ctx.term)
        peers = []
        for _ in range(1100):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            # As LMCache's client: retry after a refusal, backing off to 1 s.
            s.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            s.connect(self.d.url)
            peers.append(s)
        for i, s in enumerate(peers):
            s.send_multipart(raw_request("noop", uid=i + 1))
        deadline = time.monotonic() + 20
        answered = 0
        for s in peers:
            if s.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                s.recv_multipart()
                answered += 1
        self.assertEqual(answered, 128)
        self.assertGreater(self.counters()["lmcache_connections_refused"], 0)

        # The other front ends keep their descriptors: kvpool's socket and HTTP answer.
        r = subprocess.run([cli, "--socket", sock, "status"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Pool:", r.stdout)
        self.assertRegex(r.stdout, r"\nLMCache: +%s, \d+ instances?; \d+ requests; refused: "
                                   r"(.*, )?\d+ connections" % re.escape(self.d.url))
        url = "http://127.0.0.1:%d/healthcheck" % self.d.http
        with urllib.request.urlopen(url, timeout=10) as h:
            self.assertEqual(h.status, 200)
        # No spinning: over 3 s, with the refused peers retrying, the daemon uses well under
        # one CPU.
        t0, c0 = time.monotonic(), cpu_seconds(self.d.proc.pid)
        time.sleep(3)
        share = (cpu_seconds(self.d.proc.pid) - c0) / (time.monotonic() - t0)
        self.assertLess(share, 0.5)
        self.assertNotIn("Too many open files", self.d.text())
        self.assertIn("(--lmcache-max-connections 128)", self.d.text())

        for s in peers:
            s.close()
        # Once they are gone, a worker connects, registers and stores.
        w = Worker(self.d.url, model="after", seed=2)
        self.closers.append(w.close)
        w.register()
        self.assertTrue(w.store(test_worker.tokens(2), "a", end=2 * test_worker.CHUNK))

    def test_partial_messages_bounded(self):
        self.start("--l1-size", "1GiB", "--lmcache-max-message", "64MiB")
        port = int(self.d.url.rsplit(":", 1)[1])
        before = rss(self.d.proc.pid)
        peers = [zmtp_dealer(port) for _ in range(6)]
        cut = 0
        for s in peers:
            # A first frame announcing 250 MiB, then 100 MiB of it.
            s.sendall(struct.pack(">BQ", 0x02, 250 * MiB))
            try:
                chunk = b"\0" * MiB
                for _ in range(100):
                    s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                cut += 1
        grown = rss(self.d.proc.pid) - before
        self.assertLess(grown, SLACK * 64 * MiB, "daemon grew by %d MiB" % (grown // MiB))
        # Each was disconnected at the frame's header.
        for s in peers:
            s.settimeout(10)
            try:
                self.assertEqual(s.recv(1), b"")
            except ConnectionResetError:
                pass
            s.close()
        self.assertGreaterEqual(cut, 1)
        # The daemon serves on.
        w = Worker(self.d.url, model="after", seed=3)
        self.closers.append(w.close)
        w.register()
        self.assertTrue(w.store(test_worker.tokens(1), "a", end=test_worker.CHUNK))


def zmtp_dealer(port):
    """A TCP connection past ZMTP 3.0's NULL handshake, as a DEALER: what any peer can open."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") +
              b"\0" * 32)
    got = b""
    while len(got) < 64:
        part = s.recv(64 - len(got))
        assert part, "kvpoold closed the connection during the greeting"
        got += part
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    s.sendall(bytes([0x04, len(body)]) + body)
    # The server's READY: a short command.
    head = s.recv(2)
    assert len(head) == 2 and head[0] == 0x04, head
    left = head[1]
    while left:
        part = s.recv(left)
        assert part, "kvpoold closed the connection during the handshake"
        left -= len(part)
    return s


def main():
    test_worker.KVPOOLD = sys.argv[1]
    print("lmcache %s" % lmc_worker.lmcache_version(), flush=True)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Limits)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
