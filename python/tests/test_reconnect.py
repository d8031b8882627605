"""A Python worker outlives daemon restarts.

The real kvpoold is stopped (SIGTERM) or killed (SIGKILL) and started again on the same socket
under a Client with a context on each transport. The library reconnects at the next call and
registers the contexts again, so the same Client and Context objects go on: stores and
retrieves (one-call and two-phase) after the restart are byte-exact. While the daemon is down,
calls raise DaemonUnavailable naming the socket, and the first call after it is back works.
A plan prepared before the restart raises Stale at its commit, and nothing of it is published.
"""

import errno
import os
import random
import unittest

import kvpool
from tests.daemon import Daemon, require_kvpoold

LAYERS, HIDDEN = 2, 8


def setUpModule():
    require_kvpoold()


def random_tokens(n):
    return [random.randrange(1 << 32) for _ in range(n)]


class ReconnectTest(unittest.TestCase):

    def setUp(self):
        self.daemon = Daemon(shm=True).start()
        self.client = self.daemon.client(timeout=5.0)
        self.shm = self.register("py-rc-shm", "auto")
        self.inline = self.register("py-rc-inline", "inline")
        self.assertEqual(self.shm.transport, "shm")
        self.assertEqual(self.inline.transport, "inline")

    def tearDown(self):
        self.client.close()
        self.daemon.cleanup()

    def register(self, iid, transport):
        return self.client.register(iid, model_name="test-model", world_size=1, worker_rank=0,
                                    num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16",
                                    transport=transport)

    def restart(self, how):
        if how == "SIGTERM":
            self.assertEqual(self.daemon.stop(), 0)
        else:
            self.daemon.kill()
        self.daemon.start()

    def roundtrip(self, ctx, n=3):
        """Stores n new chunks through ctx, both ways, and checks every byte coming back."""
        toks = random_tokens(n * ctx.chunk_size)
        data = [os.urandom(ctx.chunk_bytes) for _ in range(n)]
        self.assertEqual(ctx.store(toks, data), n)
        self.assertEqual([bytes(b) for b in ctx.retrieve(toks, as_numpy=False)], data)
        # Two-phase: on shm the views are the new daemon's pool.
        toks = random_tokens(n * ctx.chunk_size)
        data = [os.urandom(ctx.chunk_bytes) for _ in range(n)]
        plan = ctx.prepare_store(toks)
        for view, idx in zip(*plan):
            view[:] = data[idx]
        self.assertEqual(ctx.commit_store(plan), n)
        with ctx.prepare_retrieve(toks) as rplan:
            self.assertEqual([bytes(v) for v in rplan], data)
        return toks

    def survives(self, how):
        old = self.roundtrip(self.shm)
        self.roundtrip(self.inline)
        self.restart(how)
        # The same objects go on. After SIGTERM the new daemon's pool does not have the old
        # chunks; after SIGKILL it adopted the dead one's pool (warm restart, on by default).
        self.assertEqual(self.shm.lookup(old), 3 if how == "SIGKILL" else 0)
        self.roundtrip(self.shm)
        self.roundtrip(self.inline)
        self.assertEqual(self.shm.transport, "shm")
        self.assertEqual(self.shm.shm_name, self.daemon.shm_name)
        self.assertEqual(self.inline.transport, "inline")
        self.assertEqual(self.client.stats()["instances"], 2)

    def test_survives_sigterm(self):
        self.survives("SIGTERM")

    def test_survives_sigkill(self):
        self.survives("SIGKILL")

    def test_calls_while_daemon_down(self):
        self.assertEqual(self.daemon.stop(), 0)
        toks = random_tokens(2 * self.shm.chunk_size)
        for call in (lambda: self.shm.lookup(toks), self.client.ping,
                     lambda: self.inline.store(toks, [bytes(self.inline.chunk_bytes)] * 2)):
            with self.assertRaises(kvpool.DaemonUnavailable) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.ENOENT)
            self.assertIn(self.daemon.socket, str(cm.exception))
        self.daemon.start()
        self.assertEqual(self.shm.lookup(toks), 0)
        self.roundtrip(self.shm)
        self.roundtrip(self.inline)

    def test_stale_plans(self):
        toks_shm = random_tokens(2 * self.shm.chunk_size)
        toks_inl = random_tokens(2 * self.inline.chunk_size)
        held = self.roundtrip(self.shm, 2)
        plan_shm = self.shm.prepare_store(toks_shm)
        for view in plan_shm.views:
            view[:] = b"\x5a" * len(view)
        plan_inl = self.inline.prepare_store(toks_inl)
        for view in plan_inl.views:
            view[:] = b"\x5a" * len(view)
        pinned = self.shm.prepare_retrieve(held)
        self.assertEqual(len(pinned), 2)

        self.restart("SIGTERM")
        with self.assertRaises(kvpool.Stale) as cm:
            self.shm.commit_store(plan_shm)
        self.assertEqual(cm.exception.errno, errno.ESTALE)
        self.assertIsInstance(cm.exception, ConnectionError)
        self.assertTrue(plan_shm.done)
        with self.assertRaises(kvpool.Stale):
            self.inline.commit_store(plan_inl)
        with self.assertRaises(kvpool.Stale):
            self.shm.commit_retrieve(pinned)
        # Nothing of the stale plans was published; the contexts work on the new daemon.
        self.assertEqual(self.shm.lookup(toks_shm), 0)
        self.assertEqual(self.inline.lookup(toks_inl), 0)
        self.roundtrip(self.shm)
        self.roundtrip(self.inline)
        self.assertEqual(self.client.stats()["objects_reserved"], 0)


if __name__ == "__main__":
    unittest.main()
