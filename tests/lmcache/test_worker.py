"""kvpoold's LMCache front end driven by the real LMCache worker.

Usage (ctest label "lmcache"; run by a venv of scripts/lmcache-env.sh, so that
the worker is the installed lmcache, 0.5.6 or 0.5.5):
    python tests/lmcache/test_worker.py KVPOOLD GROUP
GROUP is "transfer" (round trips of every dtype and an MLA layout, two ranks
of one model, two workers sharing a prefix, two models that must not see each
other's chunks, commits from a connection that did not prepare), "liveness"
(a worker killed in the middle of a store, calls of an unregistered, of a
reaped and of a never registered instance) or "pickle" (the same round trips
through LMCache's pickle transport, with no segment name and with the memfd
backend; a worker that falls back to it; hostile pickles through the wire; a
malformed pickle commit on a full pool) or
"devshm" (a 1 GiB pool in a private mount namespace whose /dev/shm is a 64 MiB
tmpfs, as in a container: the capacity gate, then the pickle transport; exit
77 where the namespace cannot be created), "restart" (kvpoold stopped with
SIGTERM and SIGKILL and started again under a live worker: vLLM's worker
adapter registers again through its heartbeat and stores again) or "segment"
(the shared segment truncated under kvpoold: the same worker moves to its
pickle transport and stores again) or "warm" (kvpoold SIGKILLed, or stopped
with SIGUSR2 for a planned restart, and started again on the same socket and
address: it adopts the pool, the worker registers again through its heartbeat,
and the chunks it stored before are found and retrieved byte-exact, over
shared memory and over the pickle transport).

Every request is made by LMCache's own classes (lmc_worker.py): its
RequestClient and EngineDrivenTransferContext, through shared memory, as
vLLM's LMCacheMPConnector makes them on a CPU worker; in the restart and
segment groups, by vLLM's LMCacheMPWorkerAdapter itself.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc_worker  # noqa: E402
from lmc_worker import Scheduler, Worker, wait_for  # noqa: E402

KVPOOLD = None
CHUNK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A kvpoold with the LMCache front end on a free TCP port, in a private directory.

    prefix is a command the daemon is run by (it must exec the daemon, which keeps the pid)."""

    def __init__(self, *extra, prefix=()):
        self.dir = tempfile.mkdtemp(prefix="kvp-lmc-")
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.shm = f"lmct{os.getpid()}_{self.port}"
        # A test's own --shm-name or --shm-backend replaces the default segment name.
        own = "--shm-name" in extra or "--shm-backend" in extra
        self.args = list(prefix) + [
            KVPOOLD, "--socket", os.path.join(self.dir, "kvpool.sock"), "--l1-size", "64MiB",
            "--chunk-size", str(CHUNK), "--http", "127.0.0.1:0",
        ] + ([] if own else ["--shm-name", self.shm]) + [
            "--lmcache", self.url, "--log-level", "debug",
        ] + list(extra)
        self.env = dict(os.environ)
        self.env.pop("KVPOOL_HTTP", None)
        if "TSAN_OPTIONS" in self.env:  # a TSan build: libzmq is not instrumented (tsan.supp)
            self.env["TSAN_OPTIONS"] += " suppressions=" + os.path.join(HERE, "tsan.supp")
        self.runs = 0
        self.start()

    def start(self):
        """Starts the daemon (again: with the same arguments, and a log of its own)."""
        self.runs += 1
        self.log_path = os.path.join(self.dir, "kvpoold.log" if self.runs == 1
                                     else "kvpoold.%d.log" % self.runs)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=self.env)
        assert wait_for(lambda: "ready:" in self.text() or self.proc.poll() is not None, 60)
        assert self.proc.poll() is None, self.text()
        m = re.search(r"HTTP endpoint on [^ ]*?:(\d+)", self.text())
        self.http = int(m.group(1)) if m else None

    def restart(self, sig):
        """Stops the daemon with sig (SIGTERM: a clean exit; SIGKILL: a crash, leaving its
        segment and its lock files) and starts it again on the same address and options."""
        self.proc.send_signal(sig)
        rc = self.proc.wait(30)
        self.log.close()
        if sig == signal.SIGTERM:
            self.check_exit(rc)
        else:
            assert rc == -sig, "kvpoold exited with %d:\n%s" % (rc, self.text())
        self.start()

    def text(self):
        """The log of the daemon's current run."""
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def status(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/api/status", timeout=10) as r:
            return json.load(r)

    def gauge(self, name):
        return self.status()["gauges"][name]

    def counter(self, name):
        return self.status()["counters"][name]

    def check_exit(self, rc, allowed_errors=()):
        """A clean exit, and no ERROR in the log but those matching allowed_errors."""
        text = self.text()
        assert rc == 0, "kvpoold exited with %d:\n%s" % (rc, text)
        errors = [line for line in text.splitlines() if "ERROR" in line
                  and not any(re.search(e, line) for e in allowed_errors)]
        assert not errors, text

    def stop(self, allowed_errors=()):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        self.log.close()
        self.check_exit(rc, allowed_errors)
        shutil.rmtree(self.dir, ignore_errors=True)


def tokens(n_chunks, base=1, extra=5):
    return [base + i for i in range(n_chunks * CHUNK + extra)]


class Base(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(*self.daemon_args(), prefix=self.daemon_prefix())
        self.closers = []

    def daemon_args(self):
        return ()

    def daemon_prefix(self):
        return ()

    # Regular expressions of the ERROR lines a test expects kvpoold to log.
    allowed_errors = ()

    def tearDown(self):
        for c in reversed(self.closers):
            c()
        self.d.stop(self.allowed_errors)  # and checks that kvpoold logged no other ERROR

    def worker(self, **kw):
        w = Worker(self.d.url, **kw)
        self.closers.append(w.close)
        return w

    def adapter_worker(self, **kw):
        w = lmc_worker.AdapterWorker(self.d.url, **kw)
        self.closers.append(w.close)
        return w

    def scheduler(self):
        s = Scheduler(self.d.url)
        self.closers.append(s.close)
        return s


class Transfer(Base):
    def roundtrip(self, dtype, layout="NHD", model="m"):
        w = self.worker(model=model, dtype=dtype, layout=layout, seed=7)
        s = self.scheduler()
        self.assertEqual(w.chunk, CHUNK)
        self.assertEqual(w.experimental, [])
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        self.assertTrue(w.ping())
        toks = tokens(3)
        n = 3 * CHUNK
        self.assertTrue(w.store(toks, "r1", end=n))
        # Stored again: every chunk is cached, no slot is given, no commit is sent.
        self.assertTrue(w.store(toks, "r1", end=n))
        s.lookup(w, toks, "r1")
        self.assertEqual(s.wait("r1"), 3)
        self.assertEqual(s.query("r1"), 0)  # delivered once
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "r1", out, end=n, first_block=8))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 0, 8))
        # Nothing else of the destination was written.
        self.assertTrue(all(float(t.abs().sum()) == 0 for t in
                            (v[:8] if layout == "MLA" else v[:, :8] for v in out.values())))
        s.end_session("r1")
        # A miss: false, and commit_retrieve is still sent and answered.
        other = tokens(2, base=5000)
        self.assertFalse(w.retrieve(other, "r2", w.blank(), end=2 * CHUNK))
        st = self.d.status()
        mine = [i for i in st["instances"] if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual(len(mine), 1, st["instances"])
        self.assertEqual(mine[0]["transport"], "shm")
        self.assertEqual(mine[0]["front_end"], "lmcache")
        owner = [c for c in st["clients"]["list"] if c["id"] == mine[0]["client_id"]]
        self.assertEqual([c["front_end"] for c in owner], ["lmcache"])
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.d.http) as r:
            metrics = r.read().decode()
        self.assertIn('kvpool_instances{front_end="lmcache",transport="shm"} 1', metrics)
        # LMCache's own names, for its dashboards: chunks written and read, tokens looked up
        # and found (3 chunks of CHUNK tokens).
        for line in ("lmcache_mp_l1_write_chunks_total 3", "lmcache_mp_l1_read_chunks_total 3",
                     "lmcache_mp_lookup_requested_tokens_total %d" % (3 * CHUNK),
                     "lmcache_mp_lookup_hit_tokens_total %d" % (3 * CHUNK),
                     "lmcache_mp_l1_evicted_chunks_total 0"):
            self.assertIn("\n" + line + "\n", metrics)
        if shutil.which("promtool"):
            p = subprocess.run(["promtool", "check", "metrics"], input=metrics, text=True,
                               capture_output=True, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        with urllib.request.urlopen("http://127.0.0.1:%d/healthcheck" % self.d.http) as r:
            self.assertEqual(json.load(r), {"status": "healthy"})
        self.assertEqual(mine[0]["use_mla"], layout == "MLA")
        self.assertEqual(mine[0]["layout"],
                         ("one plane (MLA, or K and V fused)" if layout == "MLA" else "K and V")
                         + ", 2 layers, %d tokens, 128 values per token" % CHUNK)
        self.assertEqual(mine[0]["dtype"], dtype)
        w.unregister()
        self.assertEqual(self.d.status()["instances"], [])
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        log = self.d.text()
        self.assertIn("Using shm non-GPU transfer strategy", log)
        # "Why no hit?" from the log alone: every request's DEBUG line says what it came to.
        self.assertIn("LMCache prepare_store (2 payloads): 3 of 3 chunks to write (0 cached, "
                      "0 being stored, 0 without room)", log)
        self.assertIn("LMCache prepare_store (2 payloads): 0 of 3 chunks to write (3 cached", log)
        self.assertIn("LMCache lookup (2 payloads): 3 chunks hit on every rank of 1 (request r1)",
                      log)
        self.assertIn("LMCache prepare_retrieve (2 payloads): a hit: 3 chunks to read", log)
        self.assertIn("LMCache prepare_retrieve (2 payloads): a miss: 0 of 2 chunks stored", log)
        self.assertIn("LMCache commit_store (3 payloads): 3 chunks published", log)
        self.assertIn("Instance %d non-GPU context using SHM transport (shm_name="
                      "kvpool_l1_pool_%s" % (w.iid, self.d.shm), log)

    def test_float16(self):
        self.roundtrip("float16")

    def test_bfloat16(self):
        self.roundtrip("bfloat16")

    def test_float32(self):
        self.roundtrip("float32")

    def test_mla(self):
        self.roundtrip("bfloat16", layout="MLA")

    def test_two_ranks(self, layout="NHD"):
        r0 = self.worker(model="tp", world_size=2, rank=0, seed=1, layout=layout)
        r1 = self.worker(model="tp", world_size=2, rank=1, seed=2, layout=layout)
        s = self.scheduler()
        r0.register()
        r1.register()
        toks = tokens(2)
        n = 2 * CHUNK
        self.assertTrue(r0.store(toks, "a", end=n))
        # Only rank 0 has the chunks: a lookup needs every rank.
        s.lookup(r0, toks, "a")
        self.assertEqual(s.wait("a"), 0)
        self.assertTrue(r1.store(toks, "a", end=n))
        s.lookup(r0, toks, "b")
        self.assertEqual(s.wait("b"), 2)
        # Each rank reads its own chunks back, not the other's.
        for w in (r0, r1):
            out = w.blank()
            self.assertTrue(w.retrieve(toks, "b", out, end=n))
            self.assertTrue(w.blocks_equal(out, 2 * w.bic))
        self.assertFalse(r0.blocks_equal(r1.kv, 2 * r0.bic))
        s.end_session("b")
        s.end_session("a")
        self.assertEqual(self.d.gauge("objects_pinned"), 0)

    def test_two_ranks_single_plane(self):
        """One plane per layer (LMCache's use_mla): MLA, or a fused K/V format such as vLLM's
        CPU cache of a GQA model, whose ranks hold different heads. Each rank's chunks are its
        own, as in lmcache server (LMCache's MLA workers name one rank for their replicas)."""
        self.test_two_ranks(layout="MLA")

    def test_shared_prefix(self):
        a = self.worker(model="p", seed=3)
        b = self.worker(model="p", seed=4)
        s = self.scheduler()
        a.register()
        b.register()
        prefix = tokens(2, extra=0)
        ta = prefix + [900 + i for i in range(CHUNK)]
        tb = prefix + [700 + i for i in range(CHUNK)]
        self.assertTrue(a.store(ta, "x", end=3 * CHUNK))
        s.lookup(b, tb, "y")
        self.assertEqual(s.wait("y"), 2)  # the shared prefix, not the third chunk
        out = b.blank()
        self.assertTrue(b.retrieve(tb, "y", out, end=2 * CHUNK))
        self.assertTrue(a.blocks_equal(out, 2 * a.bic))  # a's bytes, read by b
        self.assertFalse(b.retrieve(tb, "y", b.blank(), end=3 * CHUNK))
        s.end_session("y")

    def test_models_isolated(self):
        a = self.worker(model="alpha", seed=5)
        b = self.worker(model="beta", seed=6)
        s = self.scheduler()
        a.register()
        b.register()
        toks = tokens(2)
        self.assertTrue(a.store(toks, "x", end=2 * CHUNK))
        s.lookup(b, toks, "y")
        self.assertEqual(s.wait("y"), 0)
        self.assertFalse(b.retrieve(toks, "y", b.blank(), end=2 * CHUNK))
        # The same tokens under another salt are another namespace too.
        s.lookup(a, toks, "z", salt="tenant2")
        self.assertEqual(s.wait("z"), 0)
        s.lookup(a, toks, "w")
        self.assertEqual(s.wait("w"), 2)
        s.end_session("w")


class ForeignCommit(Base):
    """A prepare belongs to the connection that made it (LMCache's worker commits on the
    connection it prepared on): another connection naming the same instance and key can
    neither publish an unwritten reservation nor end a retrieve's pins."""

    def test_commit_from_another_connection(self):
        x = self.worker(model="fx", seed=51)
        s = self.scheduler()
        self.assertEqual(x.register(), "EngineDrivenContextShm")
        y = lmc_worker.client(self.d.url)
        self.closers.append(lambda: lmc_worker.close_client(y))
        ctx = x.tc.engine_driven_context
        toks = tokens(2)
        key = x.key(toks, "fx", end=2 * CHUNK)
        slots, _ = ctx.prepare_store(key, x.iid)
        self.assertEqual(len(slots), 2)
        self.assertEqual(self.d.gauge("objects_reserved"), 2)
        # y commits x's reservation before x wrote it: refused, nothing becomes visible.
        self.assertIs(y.commit_store(key, x.iid, b"").result(timeout=lmc_worker.TIMEOUT),
                      False, "another connection's commit_store published the reservation")
        self.assertEqual(self.d.counter("lmcache_foreign_commits"), 1)
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 2)
        s.lookup(x, toks, "q1")
        self.assertEqual(s.wait("q1"), 0)
        self.assertIn("refused: another connection prepared it", self.d.text())
        # x writes and commits its own reservation.
        for i, t in enumerate(slots):
            t.fill_(i + 1)
        self.assertTrue(ctx.commit_store(key, x.iid, slots))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        s.lookup(x, toks, "q2")
        self.assertEqual(s.wait("q2"), 2)
        s.end_session("q2")
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        # x's retrieve pins the chunks; y's commit_retrieve of it is refused, the pins stay.
        rkey = x.key(toks, "fr", end=2 * CHUNK)
        got = ctx.prepare_retrieve(rkey, x.iid)
        self.assertEqual([float(t.float().mean()) for t in got], [1.0, 2.0])
        self.assertEqual(self.d.gauge("objects_pinned"), 2)
        self.assertIs(y.commit_retrieve(rkey, x.iid).result(timeout=lmc_worker.TIMEOUT), False,
                      "another connection's commit_retrieve ended the retrieve's pins")
        self.assertEqual(self.d.counter("lmcache_foreign_commits"), 2)
        self.assertEqual(self.d.gauge("objects_pinned"), 2)
        self.assertTrue(ctx.commit_retrieve(rkey, x.iid))
        self.assertEqual(self.d.gauge("objects_pinned"), 0)

    def test_in_band_commit_from_another_connection(self):
        """Chunks in the message from another connection cannot move x's instance off shared
        memory (which would leave x storing into slots nobody reads)."""
        import pickle
        import torch

        x = self.worker(model="fb", dtype="float32", seed=52)
        self.assertEqual(x.register(), "EngineDrivenContextShm")
        y = lmc_worker.client(self.d.url)
        self.closers.append(lambda: lmc_worker.close_client(y))
        toks = tokens(2)
        key = x.key(toks, "fb", end=2 * CHUNK)
        chunks = [torch.randn((2, 2, CHUNK, 128), dtype=torch.float32) for _ in range(2)]
        self.assertIs(y.commit_store(key, x.iid, pickle.dumps(chunks))
                      .result(timeout=lmc_worker.TIMEOUT), False,
                      "another connection's pickle commit was taken for x's")
        self.assertEqual(self.d.counter("lmcache_foreign_commits"), 1)
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % x.iid]
        self.assertEqual(mine[0]["transport"], "shm")
        self.assertNotIn("fell back", self.d.text())
        # x still stores through shared memory.
        self.assertTrue(x.store(toks, "fb2", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, %r)
    from lmc_worker import Worker
    w = Worker(%r, model="k", seed=9, instance_id=%d)
    w.register()
    w.ping()
    toks = list(range(1, 2 * w.chunk + 1))
    key = w.key(toks, "dead", end=len(toks))
    # The first half of the real worker's store: slots reserved, never committed.
    slots, idx = w.tc.engine_driven_context.prepare_store(key, w.iid)
    assert len(slots) == 2, (slots, idx)
    for t in slots:
        t.fill_(1)
    sys.stdout.write("prepared\\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


class Liveness(Base):
    def daemon_args(self):
        return ("--lmcache-reap-timeout", "1", "--lmcache-registration-grace", "2")

    def test_killed_mid_store(self):
        iid = lmc_worker.new_instance_id()
        child = subprocess.run(
            [sys.executable, "-c", KILLED % (HERE, self.d.url, iid)],
            capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(child.returncode, -signal.SIGKILL, child.stderr[-2000:])
        self.assertIn("prepared", child.stdout)
        s = self.scheduler()
        other = self.worker(model="k", seed=10)
        other.register()
        toks = list(range(1, 2 * CHUNK + 1))
        # Nothing half-written is visible.
        s.lookup(other, toks, "q")
        self.assertEqual(s.wait("q"), 0)
        self.assertFalse(other.retrieve(toks, "q", other.blank(), end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_reserved"), 2)
        # Reaped after the reap timeout: its reservations go, another worker stores the chunks.
        self.assertTrue(wait_for(lambda: "Reaped non-GPU instance %d" % iid in self.d.text(), 30))
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertTrue(other.ping())
        self.assertTrue(other.store(toks, "q2", end=2 * CHUNK))
        s.lookup(other, toks, "q3")
        self.assertEqual(s.wait("q3"), 2)
        out = other.blank()
        self.assertTrue(other.retrieve(toks, "q3", out, end=2 * CHUNK))
        self.assertTrue(other.blocks_equal(out, 2 * other.bic))
        s.end_session("q3")
        self.assertEqual(self.d.status()["counters"]["lmcache_reaped"], 1)

    def test_lookup_locks_released_by_reaping(self):
        w = self.worker(model="l", seed=11)
        s = self.scheduler()
        w.register()
        w.ping()
        toks = tokens(2)
        self.assertTrue(w.store(toks, "a", end=2 * CHUNK))
        s.lookup(w, toks, "a")
        self.assertEqual(s.wait("a"), 2)
        self.assertEqual(self.d.gauge("objects_pinned"), 2)  # the lookup's read locks
        # The worker falls silent (it never retrieves): reaping releases the locks it held.
        self.assertTrue(wait_for(lambda: self.d.gauge("objects_pinned") == 0, 30))
        self.assertIn("Reaped non-GPU instance %d" % w.iid, self.d.text())

    def test_unregistered_and_reaped_calls_answered(self):
        w = self.worker(model="u", seed=12)
        w.register()
        toks = tokens(2)
        w.unregister()
        # Every call of an unregistered instance is answered at once, negatively.
        self.assertTrue(w.store(toks, "u1", end=2 * CHUNK))  # empty slot list: nothing to do
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertFalse(w.retrieve(toks, "u1", w.blank(), end=2 * CHUNK))
        self.assertTrue(w.req.commit_store(w.key(toks, "u1"), w.iid, b"").result(timeout=10)
                        is False)
        # Counted (the store, the retrieve with its commit, the commit), and the health check
        # says so for a minute (healthy, but degraded).
        self.assertEqual(self.d.counter("unknown_instance_requests"), 4)
        with urllib.request.urlopen("http://127.0.0.1:%d/healthcheck" % self.d.http) as r:
            health = json.load(r)
        self.assertEqual((health["status"], health["degraded"]), ("healthy", True))
        self.assertIn("requests name instances this kvpoold has not registered (4 so far",
                      health["reasons"][0])
        self.assertEqual(self.d.status()["health"], health)
        # Its ping: true, as upstream (its worker let it go; nothing to register again).
        self.assertTrue(w.ping())
        self.assertTrue(w.ping())
        # An id this kvpoold never registered (a worker of a kvpoold that ran before): false
        # once, so that the worker's heartbeat registers it again, then true.
        stranger = self.worker(model="u", seed=14)
        self.assertFalse(stranger.ping())
        self.assertTrue(stranger.ping())
        self.assertEqual(self.d.counter("lmcache_unknown_pings"), 1)
        self.assertIn("LMCache ping of instance %d, which this kvpoold has not registered"
                      % stranger.iid, self.d.text())
        # Registered again, pinged, then silent: reaped.
        w2 = self.worker(model="u", seed=13)
        w2.register()
        self.assertTrue(w2.ping())
        self.assertTrue(wait_for(lambda: "Reaped non-GPU instance %d" % w2.iid in self.d.text(),
                                 30))
        self.assertFalse(w2.store(toks, "u2", end=2 * CHUNK) is None)
        self.assertFalse(w2.retrieve(toks, "u2", w2.blank(), end=2 * CHUNK))
        # Its next ping says unhealthy once, then healthy: vLLM's adapter re-registers on that
        # edge; registering again serves it again.
        self.assertFalse(w2.ping())
        self.assertTrue(w2.ping())
        w2.register()
        self.assertTrue(w2.store(toks, "u3", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)


# Seconds between the heartbeats of vLLM's worker adapter in the restart and segment tests
# (vLLM's default is 10 s; every wait there is bounded by a few of them).
HEARTBEAT = 1.0


class Restart(Base):
    """kvpoold restarted under a live worker (SIGTERM, and SIGKILL: a crash that leaves its
    segment and lock files), on the same address and options: vLLM's worker adapter, with its
    own heartbeat, registers its instance again without being restarted, and stores again.

    LMCache's worker registers again only on its heartbeat's unhealthy-to-healthy edge, and a
    restart shorter than a heartbeat fails no ping: kvpoold answers the first ping of an
    instance id it never registered false, once, and the next one true.

    A cold restart (--warm-restart off): the new kvpoold starts empty; WarmRestart keeps the
    pool."""

    def daemon_args(self):
        return ("--warm-restart", "off")

    def recover(self, sig):
        w = self.adapter_worker(model="rs", seed=21, heartbeat_interval=HEARTBEAT)
        s = self.scheduler()
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        w.start_heartbeat()
        self.assertTrue(w.store(tokens(2), "before", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        # Restarted right after a heartbeat ended, so that no ping waits across the restart: a
        # ping unanswered for a heartbeat would make the worker unhealthy by itself.
        n = w.heartbeats()
        self.assertTrue(wait_for(lambda: w.heartbeats() > n, 5 * HEARTBEAT))
        began = time.monotonic()
        self.d.restart(sig)
        took = time.monotonic() - began
        print("kvpoold restarted (%s) in %.3f s" % (signal.Signals(sig).name, took),
              file=sys.stderr)
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        # The next ping is answered false (unhealthy), the one after true, and the recover
        # callback registers the instance before the worker is healthy again.
        registered = "Registered non-GPU context for instance %d (" % w.iid
        unhealthy = []

        def recovered():
            unhealthy.append(not w.healthy())
            return registered in self.d.text() and w.healthy()

        wait_for(recovered, 4 * HEARTBEAT + 5)
        toks = tokens(3, base=3000)
        self.assertTrue(w.store(toks, "after", end=3 * CHUNK, first_block=8))
        self.assertEqual(self.d.gauge("objects_committed"), 3,
                         "the worker's store after the restart stored nothing: its instance "
                         "was not registered again\n" + self.d.text()[-3000:])
        s.lookup(w, toks, "after")
        self.assertEqual(s.wait("after"), 3)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "after", out, end=3 * CHUNK, first_block=16))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 8, 16))
        s.end_session("after")
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        log = self.d.text()
        self.assertIn("LMCache ping of instance %d, which this kvpoold has not registered"
                      % w.iid, log)
        self.assertEqual(self.d.counter("lmcache_unknown_pings"), 1)
        self.assertTrue(any(unhealthy), "the worker's heartbeat never saw a false ping")
        self.assertEqual(log.count(registered), 1)
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual([i["transport"] for i in mine], ["shm"])
        return log

    def test_sigterm(self):
        self.recover(signal.SIGTERM)

    def test_sigkill(self):
        log = self.recover(signal.SIGKILL)
        # The dead daemon's segment was taken over under the same name.
        self.assertIn("Replacing stale segment /dev/shm/kvpool_l1_pool_%s" % self.d.shm, log)


class WarmRestart(Base):
    """Warm restart under a live worker: kvpoold SIGKILLed (a crash) or stopped with SIGUSR2 (a
    planned restart), then started again on the same socket, segment name and LMCache address.
    The new kvpoold adopts the pool the old one left (its INFO line and /api/status's
    "warm_restart" name the old pid and the chunks), vLLM's worker adapter registers its
    instance again through its heartbeat (the first ping of an instance the new kvpoold never
    registered is answered false), and the chunks stored before the restart are found by the
    scheduler's lookup and retrieved byte-exact, each verified once against its checksum.

    Over shared memory, and over the pickle transport: a worker that cannot map the segment (its
    open fails, as in another container) falls back to pickle by itself (LMCache's
    create_engine_driven_context) and kvpoold follows at its first pickled commit; the pool is
    still the named segment that warm restart keeps."""

    ADOPTED = re.compile(r"Adopted the pool of kvpoold pid (\d+) \((after a crash|planned "
                         r"restart)\): (\d+) chunks, (\d+) bytes in \d+ ms")

    def restart_keeping_pool(self, w, sig):
        """Stops kvpoold with sig right after a heartbeat ended (so that no ping waits across
        the restart) and starts it again; returns the old pid."""
        n = w.heartbeats()
        self.assertTrue(wait_for(lambda: w.heartbeats() > n, 5 * HEARTBEAT))
        old = self.d.proc.pid
        began = time.monotonic()
        self.d.proc.send_signal(sig)
        rc = self.d.proc.wait(30)
        self.d.log.close()
        if sig == signal.SIGKILL:
            self.assertEqual(rc, -signal.SIGKILL, self.d.text())
        else:
            self.d.check_exit(rc)  # a planned restart is a clean exit
            left = (r"Leaving the pool \(\d+ chunks, \d+ bytes\) in /dev/shm/kvpool_l1_pool_%s "
                    r"for the next kvpoold" % re.escape(self.d.shm))
            self.assertRegex(self.d.text(), left)
        self.d.start()
        took = time.monotonic() - began
        print("kvpoold restarted (%s) in %.3f s" % (signal.Signals(sig).name, took),
              file=sys.stderr)
        return old

    def keep_pool(self, sig, pickle_worker=False):
        w = self.adapter_worker(model="wr", seed=51, heartbeat_interval=HEARTBEAT)
        s = self.scheduler()
        want = "EngineDrivenContextPickle" if pickle_worker else "EngineDrivenContextShm"
        self.assertEqual(w.register(), want)
        w.start_heartbeat()
        toks = tokens(3)
        self.assertTrue(w.store(toks, "before", end=3 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        chunk_bytes = self.d.gauge("pool_used") // 3
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual([i["transport"] for i in mine], ["pickle" if pickle_worker else "shm"])

        old = self.restart_keeping_pool(w, sig)
        log = self.d.text()
        m = self.ADOPTED.search(log)
        self.assertIsNotNone(m, "the new kvpoold adopted nothing:\n" + log[-3000:])
        self.assertEqual(int(m.group(1)), old)
        self.assertEqual(m.group(2), "after a crash" if sig == signal.SIGKILL
                         else "planned restart")
        self.assertEqual((int(m.group(3)), int(m.group(4))), (3, 3 * chunk_bytes))
        self.assertNotIn("Not adopting", log)
        warm = self.d.status()["warm_restart"]
        self.assertEqual((warm["kind"], warm["planned"], warm["previous_pid"],
                          warm["adopted_chunks"]),
                         ("adopted", sig != signal.SIGKILL, old, 3))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        self.assertEqual(self.d.gauge("warm_restart_unverified_chunks"), 3)

        # The heartbeat's first ping is answered false, the recover callback registers again.
        registered = "Registered non-GPU context for instance %d (" % w.iid
        wait_for(lambda: registered in self.d.text() and w.healthy(), 4 * HEARTBEAT + 5)
        self.assertIn(registered, self.d.text(), "the worker did not register again")
        self.assertTrue(w.healthy())
        self.assertEqual(w.transport(), want)
        self.assertIn("LMCache ping of instance %d, which this kvpoold has not registered"
                      % w.iid, self.d.text())
        if pickle_worker:
            # kvpoold learns that the worker cannot map the segment at its first pickled commit.
            self.assertTrue(w.store(tokens(1, base=7000), "new", end=CHUNK, first_block=32))

        # The chunks stored before the restart: found, and retrieved byte-exact (into other
        # blocks of the worker's cache).
        s.lookup(w, toks, "after")
        self.assertEqual(s.wait("after"), 3)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "after", out, end=3 * CHUNK, first_block=16))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 0, 16))
        s.end_session("after")
        self.assertEqual(self.d.counter("warm_restart_verified_chunks"), 3)
        self.assertEqual(self.d.counter("warm_restart_corrupt_chunks"), 0)
        self.assertEqual(self.d.gauge("warm_restart_unverified_chunks"), 0)
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual([i["transport"] for i in mine], ["pickle" if pickle_worker else "shm"])
        self.assertGreaterEqual(mine[0]["retrieved_chunks"], 3)

    def test_shm_sigkill(self):
        self.keep_pool(signal.SIGKILL)

    def test_shm_planned(self):
        self.keep_pool(signal.SIGUSR2)

    def test_pickle_sigkill(self):
        from unittest import mock

        from lmcache.v1.multiprocess.transfer_context import shm as lmc_shm

        def cannot_map(*args, **kwargs):
            raise PermissionError("this worker cannot map kvpoold's segment (test)")

        with mock.patch.object(lmc_shm.shared_memory, "SharedMemory", cannot_map):
            self.keep_pool(signal.SIGKILL, pickle_worker=True)


class SegmentLost(Base):
    """The daemon's POSIX segment truncated under it (any process of its user can): kvpoold
    moves its pool to private memory and drops every LMCache instance on shared memory, whose
    next ping is answered false; vLLM's worker adapter registers again on its heartbeat, is
    given no segment name (its pickle transport), and stores again."""

    allowed_errors = (r"The shared segment /dev/shm/\S+ shrank to 4096 of \d+ bytes under "
                      r"kvpoold",)

    def test_instance_moves_to_pickle(self):
        w = self.adapter_worker(model="sg", seed=31, heartbeat_interval=HEARTBEAT)
        s = self.scheduler()
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        w.start_heartbeat()
        self.assertTrue(w.store(tokens(2), "before", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        os.truncate("/dev/shm/kvpool_l1_pool_" + self.d.shm, 4096)
        # kvpoold notices within a second; the instance's next ping is answered false, the one
        # after true, and the worker's recover callback registers it again.
        unhealthy = []

        def recovered():
            unhealthy.append(not w.healthy())
            return w.transport() == "EngineDrivenContextPickle" and w.healthy()

        wait_for(recovered, 4 * HEARTBEAT + 5)
        # Checked before any store: a worker still writing its slots through its mapping of the
        # truncated segment would die of SIGBUS.
        self.assertEqual(w.transport(), "EngineDrivenContextPickle",
                         "the worker was not moved off the lost segment\n"
                         + self.d.text()[-3000:])
        self.assertTrue(w.healthy())
        self.assertTrue(any(unhealthy), "the worker's heartbeat never saw a false ping")
        self.assertEqual(self.d.counter("lmcache_unknown_pings"), 0)  # dropped, not unknown
        # The chunks of the lost segment are dropped twice, the second time a second after the
        # first (for those pinned then); what is stored after the loss stays
        # (server/test_store, test_clear_older). The stores below come after both passes.
        self.assertTrue(wait_for(lambda: "more chunks of the lost segment" in self.d.text(), 10))
        toks = tokens(3, base=4000)
        self.assertTrue(w.store(toks, "after", end=3 * CHUNK, first_block=8))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        s.lookup(w, toks, "after")
        self.assertEqual(s.wait("after"), 3)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "after", out, end=3 * CHUNK, first_block=16))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 8, 16))
        s.end_session("after")
        log = self.d.text()
        self.assertIn("LMCache instance %d lost its shared memory (the shared segment shrank "
                      "under kvpoold" % w.iid, log)
        self.assertRegex(log, r"Instance %d non-GPU context using pickle transport "
                              r"\(the shared segment shrank under kvpoold" % w.iid)
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual([i["transport"] for i in mine], ["pickle"])


class PickleNoName(Base):
    """No shared memory to offer (--shm-name ""): the worker moves its chunks pickled."""

    transport_reason = "SHM disabled by configuration"

    def daemon_args(self):
        return ("--shm-name", "")

    def roundtrip(self, dtype, layout="NHD"):
        w = self.worker(dtype=dtype, layout=layout, seed=11)
        s = self.scheduler()
        self.assertEqual(w.register(), "EngineDrivenContextPickle")
        toks = tokens(3)
        n = 3 * CHUNK
        self.assertTrue(w.store(toks, "r1", end=n))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        # Stored again: the worker still sends every chunk; all are cached: true, nothing new.
        self.assertTrue(w.store(toks, "r1", end=n))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        s.lookup(w, toks, "r1")
        self.assertEqual(s.wait("r1"), 3)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "r1", out, end=n, first_block=8))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 0, 8))
        self.assertTrue(all(float(t.abs().sum()) == 0 for t in
                            (v[:8] if layout == "MLA" else v[:, :8] for v in out.values())))
        s.end_session("r1")
        self.assertFalse(w.retrieve(tokens(2, base=5000), "r2", w.blank(), end=2 * CHUNK))
        st = self.d.status()
        mine = [i for i in st["instances"] if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual(len(mine), 1, st["instances"])
        self.assertEqual(mine[0]["transport"], "pickle")
        self.assertEqual(mine[0]["dtype"], dtype)
        w.unregister()
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        log = self.d.text()
        self.assertIn("Using pickle non-GPU transfer strategy", log)
        self.assertRegex(log, r"Instance %d non-GPU context using pickle transport "
                              r"\([^)]*%s" % (w.iid, re.escape(self.transport_reason)))

    def test_float16(self):
        self.roundtrip("float16")

    def test_bfloat16(self):
        self.roundtrip("bfloat16")

    def test_float32(self):
        self.roundtrip("float32")

    def test_mla(self):
        self.roundtrip("bfloat16", layout="MLA")

    def test_two_ranks(self):
        r0 = self.worker(model="tp", world_size=2, rank=0, seed=1)
        r1 = self.worker(model="tp", world_size=2, rank=1, seed=2)
        s = self.scheduler()
        self.assertEqual(r0.register(), "EngineDrivenContextPickle")
        self.assertEqual(r1.register(), "EngineDrivenContextPickle")
        toks = tokens(2)
        n = 2 * CHUNK
        self.assertTrue(r0.store(toks, "a", end=n))
        s.lookup(r0, toks, "a")
        self.assertEqual(s.wait("a"), 0)
        self.assertTrue(r1.store(toks, "a", end=n))
        s.lookup(r0, toks, "b")
        self.assertEqual(s.wait("b"), 2)
        for w in (r0, r1):
            out = w.blank()
            self.assertTrue(w.retrieve(toks, "b", out, end=n))
            self.assertTrue(w.blocks_equal(out, 2 * w.bic))
        self.assertFalse(r0.blocks_equal(r1.kv, 2 * r0.bic))
        s.end_session("b")
        s.end_session("a")

    def test_hostile_pickles(self):
        import pickle
        import torch

        w = self.worker(dtype="float16", seed=3)
        self.assertEqual(w.register(), "EngineDrivenContextPickle")
        marker = os.path.join(self.d.dir, "marker")
        toks = tokens(1)
        key = w.key(toks, "h", end=CHUNK)

        class Boom:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))

        shape = (2, 2, CHUNK, 2 * 64)
        good = pickle.dumps([torch.ones(shape, dtype=torch.float16)])
        payloads = {
            "os.system": pickle.dumps([Boom()]),
            "os.system in a list of tensors": pickle.dumps([torch.ones(shape, dtype=torch.float16),
                                                            Boom()]),
            "truncated": good[:-7],
            "wrong dtype": pickle.dumps([torch.ones(shape, dtype=torch.float32)]),
            "wrong shape": pickle.dumps([torch.ones((2, 2, CHUNK, 64), dtype=torch.float16)]),
            "two tensors for one chunk": pickle.dumps([torch.ones(shape, dtype=torch.float16)] * 2),
        }
        for name, data in payloads.items():
            ok = w.req.commit_store(key, w.iid, data).result(timeout=lmc_worker.TIMEOUT)
            self.assertFalse(ok, name)
        self.assertFalse(os.path.exists(marker))
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertIsNone(self.d.proc.poll())
        self.assertIn("pickle commit of", self.d.text())
        # The daemon serves on: the real payload is stored and read back.
        self.assertTrue(w.req.commit_store(key, w.iid, good).result(timeout=lmc_worker.TIMEOUT))
        self.assertEqual(self.d.gauge("objects_committed"), 1)
        reply = w.req.prepare_retrieve(key, w.iid).result(timeout=lmc_worker.TIMEOUT)
        self.assertTrue(reply.success)
        got = pickle.loads(reply.data)
        self.assertEqual(len(got), 1)
        self.assertEqual(got[0].dtype, torch.float16)
        self.assertTrue(torch.equal(got[0], torch.ones(shape, dtype=torch.float16)))
        w.req.commit_retrieve(key, w.iid).result(timeout=lmc_worker.TIMEOUT)
        self.assertEqual(self.d.gauge("objects_pinned"), 0)


class PickleFullPool(Base):
    """A full pool on the pickle transport: a pickle commit that does not decode is refused
    before it reserves anything, so it evicts no committed chunk."""

    def daemon_args(self):
        return ("--shm-name", "", "--l1-size", "16MiB")

    def test_refused_commit_evicts_nothing(self):
        # 256 KiB chunks: the 16 MiB pool holds about 64.
        big = dict(dtype="float16", layers=8, heads=8, head_size=64, blocks=64)
        a = self.worker(model="full", seed=41, **big)
        b = self.worker(model="full", seed=42, **big)
        s = self.scheduler()
        self.assertEqual(a.register(), "EngineDrivenContextPickle")
        self.assertEqual(b.register(), "EngineDrivenContextPickle")
        # A fills the pool with committed chunks, up to the last chunk that fits.
        stores, committed, per = [], 0, None
        while len(stores) < 32:
            g = self.d.status()["gauges"]
            n = 1 if per is None else min(8, g["pool_largest_free"] // per)
            if n == 0:
                break
            toks = tokens(n, base=1 + 1000 * len(stores), extra=0)
            first = 8 * (len(stores) % 8)
            self.assertTrue(a.store(toks, "a%d" % len(stores), end=n * CHUNK, first_block=first))
            stores.append((toks, first, n))
            committed += n
            if per is None:
                per = self.d.gauge("pool_used")
        self.assertEqual(self.d.gauge("objects_committed"), committed)  # none evicted yet
        self.assertLess(self.d.gauge("pool_largest_free"), per)  # full
        self.assertGreater(committed, 32)
        # B's commit of 8 chunks: the real worker's pickle of 8 tensors, its last 64 bytes cut.
        commit = b.req.commit_store
        b.req.commit_store = lambda key, iid, data: commit(key, iid, data[:-64])
        toks_b = tokens(8, base=90000, extra=0)
        malformed = self.d.counter("lmcache_malformed")
        self.assertFalse(b.store(toks_b, "b", end=8 * CHUNK))
        del b.req.commit_store
        self.assertEqual(self.d.counter("lmcache_malformed"), malformed + 1)
        self.assertIn("pickle commit of", self.d.text())
        self.assertEqual(self.d.gauge("objects_committed"), committed,
                         "the refused commit evicted committed chunks of another worker")
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        # Every chunk of A is still found and reads back.
        for i, (toks, first, n) in enumerate(stores):
            rid = "q%d" % i
            s.lookup(a, toks, rid)
            self.assertEqual(s.wait(rid), n, "store %d of A" % i)
            out = a.blank()
            self.assertTrue(a.retrieve(toks, rid, out, end=n * CHUNK, first_block=first))
            self.assertTrue(a.blocks_equal(out, n * a.bic, first, first))
            s.end_session(rid)
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        # The control: the whole pickle is stored, and its reservation had to evict.
        self.assertTrue(b.store(toks_b, "b2", end=8 * CHUNK))
        self.assertLessEqual(self.d.gauge("objects_committed"), committed)


class PickleMemfd(PickleNoName):
    """A memfd segment has no name for LMCache workers to open: the pickle transport."""

    transport_reason = "--shm-backend memfd"

    def daemon_args(self):
        return ("--shm-backend", "memfd")


# Runs "$0" "$@" in a private mount namespace whose /dev/shm is a 64 MiB tmpfs, as a container's
# (unshare(1) makes the namespace's mounts private; exec keeps the pid, so SIGTERM reaches it).
SMALL_DEVSHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && exec "$0" "$@"']


def small_devshm_available():
    """Whether this machine lets the test make a private /dev/shm (root or CAP_SYS_ADMIN)."""
    r = subprocess.run(SMALL_DEVSHM + ["true"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        print("skipped: cannot create a mount namespace with a 64 MiB /dev/shm: %s"
              % r.stderr.strip(), file=sys.stderr)
    return r.returncode == 0


class PickleSmallDevShm(Base):
    """A 1 GiB POSIX pool in a container's 64 MiB /dev/shm: the capacity gate turns shared
    memory off before creating anything, and the worker (outside the namespace, over loopback
    TCP) is given no segment name: the pickle transport."""

    # The segment (header page and pool) and, with warm restart on, its index: 64 bytes per
    # pool page and a header page (core/warm_index.h).
    need = (1 << 30) + 4096 + ((1 << 30) // 4096) * 64 + 4096
    transport_reason = "SHM disabled: insufficient /dev/shm capacity (need %d bytes, have %d" % (
        need, 64 << 20)

    def daemon_args(self):
        return ("--l1-size", "1GiB")  # after the default --l1-size: the last one counts

    def daemon_prefix(self):
        return SMALL_DEVSHM

    def roundtrip(self, dtype, layout="NHD"):
        # Checked in the test, not in setUp: a failure still stops the daemon (tearDown).
        self.assertIn("Insufficient /dev/shm capacity: need %d bytes, have %d bytes. Disabling "
                      "SHM transport." % (self.need, 64 << 20), self.d.text())
        shm = self.d.status()["shm"]
        self.assertEqual((shm["enabled"], shm["pool_size"], shm["dev_shm_free_bytes"]),
                         (False, 1 << 30, 64 << 20))
        PickleNoName.roundtrip(self, dtype, layout)

    def test_float16(self):
        self.roundtrip("float16")

    def test_mla(self):
        self.roundtrip("bfloat16", layout="MLA")


class PickleFallback(Base):
    """A worker offered the segment whose commit is a pickle nonetheless (it could not map it)."""

    def test_fallback(self):
        import pickle
        import torch

        w = self.worker(dtype="float32", seed=5)
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        key = w.key(tokens(2), "f", end=2 * CHUNK)
        chunks = [torch.randn((2, 2, CHUNK, 128), dtype=torch.float32) for _ in range(2)]
        for _ in range(2):
            self.assertTrue(w.req.commit_store(key, w.iid, pickle.dumps(chunks))
                            .result(timeout=lmc_worker.TIMEOUT))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        log = self.d.text()
        self.assertEqual(log.count("LMCache instance %d fell back to the pickle transport "
                                   "(could not map kvpool_l1_pool_%s" % (w.iid, self.d.shm)), 1)
        mine = [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]
        self.assertEqual(mine[0]["transport"], "pickle")
        # Its retrieves are pickled too from then on.
        reply = w.req.prepare_retrieve(key, w.iid).result(timeout=lmc_worker.TIMEOUT)
        self.assertTrue(reply.success)
        self.assertEqual(reply.context, {})
        got = pickle.loads(reply.data)
        self.assertEqual(len(got), 2)
        for a, b in zip(got, chunks):
            self.assertTrue(torch.equal(a, b))
        w.req.commit_retrieve(key, w.iid).result(timeout=lmc_worker.TIMEOUT)
        self.assertEqual(self.d.gauge("objects_pinned"), 0)


def main():
    global KVPOOLD
    KVPOOLD = sys.argv[1]
    group = sys.argv[2]
    print("lmcache %s, test group %s" % (lmc_worker.lmcache_version(), group), flush=True)
    groups = {
        "transfer": [Transfer, ForeignCommit],
        "liveness": [Liveness],
        "restart": [Restart],
        "segment": [SegmentLost],
        "warm": [WarmRestart],
        "pickle": [PickleNoName, PickleMemfd, PickleFallback, PickleFullPool],
        "devshm": [PickleSmallDevShm],
    }
    if group == "devshm" and not small_devshm_available():
        sys.exit(77)
    suite = unittest.TestSuite(
        unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in groups[group]
    )
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
