"""Commits on the shared-memory transport are pipelined (sent without waiting).

Against the real kvpoold with --reserve-timeout 1: a store plan left past its reservation's
expiry is committed. With the default client the commit returns at once, counting the plan's
chunks, and the client's next call raises PipelinedCommitFailed naming the commit and ETIMEDOUT,
having done nothing; the call after it works. With sync_commit=True the commit itself raises
Timeout. Either way nothing of the expired plan is visible. Back-to-back stores and retrieves on
one context read back byte-exact: each commit is applied before the next request.
"""

import os
import random
import time
import unittest

import kvpool
from tests.daemon import Daemon, require_kvpoold

LAYERS, HIDDEN = 2, 8


def setUpModule():
    require_kvpoold()


def random_tokens(n):
    return [random.randrange(1 << 32) for _ in range(n)]


class PipelineTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(shm=True, extra=["--reserve-timeout", "1"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def context(self, client, iid):
        ctx = client.register(iid, model_name="test-model", world_size=1, worker_rank=0,
                              num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16",
                              transport="shm")
        self.assertEqual(ctx.transport, "shm")
        return ctx

    def expired_plan(self, ctx):
        toks = random_tokens(2 * ctx.chunk_size)
        plan = ctx.prepare_store(toks)
        views, _ = plan
        self.assertEqual(len(views), 2)
        for v in views:
            v[:] = os.urandom(ctx.chunk_bytes)
        time.sleep(2.5)  # past --reserve-timeout 1 and the expiry thread's next round
        return toks, plan

    def test_pipelined_failure_reported_by_next_call(self):
        with self.daemon.client(timeout=5.0) as c:
            ctx = self.context(c, "py-pipe-default")
            toks, plan = self.expired_plan(ctx)
            self.assertEqual(ctx.commit_store(plan), 2)
            with self.assertRaises(kvpool.PipelinedCommitFailed) as cm:
                ctx.lookup(toks)
            self.assertIn("COMMIT_STORE", str(cm.exception))
            self.assertIn("ETIMEDOUT", str(cm.exception))
            self.assertEqual(ctx.lookup(toks), 0)

    def test_sync_commit_raises_itself(self):
        with self.daemon.client(timeout=5.0, sync_commit=True) as c:
            ctx = self.context(c, "py-pipe-sync")
            toks, plan = self.expired_plan(ctx)
            with self.assertRaises(kvpool.Timeout):
                ctx.commit_store(plan)
            self.assertEqual(ctx.lookup(toks), 0)

    def test_back_to_back(self):
        with self.daemon.client(timeout=5.0) as c:
            ctx = self.context(c, "py-pipe-b2b")
            for _ in range(20):
                toks = random_tokens(ctx.chunk_size)
                data = os.urandom(ctx.chunk_bytes)
                self.assertEqual(ctx.store(toks, [data]), 1)
                out = bytearray(ctx.chunk_bytes)
                self.assertEqual(ctx.retrieve(toks, out=[out]), 1)
                self.assertEqual(bytes(out), data)


if __name__ == "__main__":
    unittest.main()
