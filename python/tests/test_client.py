"""Round trips through a real kvpoold on both transports, views, errors and cleanup.

Three configurations run the same round-trip tests:
  - shm:           daemon with a segment, transport "auto" (must pick shm);
  - inline forced: same daemon, transport "inline";
  - inline daemon: daemon started with --shm-name "" (auto must fall back to inline).
"""

import errno
import gc
import logging
import os
import random
import subprocess
import sys
import threading
import time
import unittest
from typing import Tuple

import kvpool
from kvpool import context as kvcontext
from tests.daemon import Daemon, require_kvpoold

try:
    import numpy as np
except ImportError:
    np = None  # type: ignore[assignment]  # optional; the checker sees numpy's module type

needs_numpy = unittest.skipUnless(np is not None, "numpy is not installed")

LAYERS, HIDDEN = 2, 8


def setUpModule():
    require_kvpoold()


def random_tokens(n):
    return [random.randrange(1 << 32) for _ in range(n)]


class _DaemonPerClass(unittest.TestCase):
    """One kvpoold for the whole class, stopped cleanly (exit 0) at its end."""

    shm = True            # start the daemon with a segment
    extra: Tuple[str, ...] = ()  # more daemon options
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(shm=cls.shm, extra=cls.extra).start()

    @classmethod
    def tearDownClass(cls):
        if cls.daemon:
            rc = cls.daemon.stop()
            log = cls.daemon.log()
            cls.daemon.cleanup()
            if rc != 0:
                raise AssertionError("kvpoold exited with %s:\n%s" % (rc, log))


class _Base(_DaemonPerClass):
    transport = "auto"    # what the worker asks for
    expect = "shm"        # transport it must get

    def setUp(self):
        self.client = self.daemon.client()
        self.ctx = self.register()

    def tearDown(self):
        self.client.close()

    def register(self, dtype="bfloat16", **kw):
        iid = "py-%s-%d" % (self.id().rsplit(".", 1)[-1], random.randrange(1 << 30))
        args = dict(world_size=1, worker_rank=0, num_layers=LAYERS, hidden_dim=HIDDEN,
                    dtype=dtype, transport=self.transport)
        args.update(kw)
        return self.client.register(iid, model_name="test-model", **args)

    def chunks(self, n, ctx=None):
        ctx = ctx or self.ctx
        return [os.urandom(ctx.chunk_bytes) for _ in range(n)]


class _RoundTrips(_Base):
    """Tests every transport configuration runs."""

    def test_registration(self):
        ctx = self.ctx
        self.assertEqual(ctx.transport, self.expect)
        self.assertEqual(ctx.chunk_size, 16)
        self.assertEqual(ctx.chunk_shape, (2, LAYERS, 16, HIDDEN))
        self.assertEqual(ctx.chunk_bytes, 2 * LAYERS * 16 * HIDDEN * 2)
        self.assertEqual(ctx.dtype, "bfloat16")
        self.assertFalse(ctx.existing)
        if self.expect == "inline":
            self.assertTrue(ctx.reason)
        mla = self.register(use_mla=True, dtype="float32")
        self.assertEqual(mla.chunk_shape, (LAYERS, 16, HIDDEN))
        self.assertEqual(mla.chunk_bytes, LAYERS * 16 * HIDDEN * 4)

    def test_registration_log(self):
        with self.assertLogs("kvpool", logging.INFO) as cm:
            ctx = self.register()
        text = "\n".join(cm.output)
        self.assertIn(ctx.instance_id, text)
        if self.expect == "shm":
            self.assertIn("SHM transport", text)
            if ctx.shm_backend == "memfd":
                self.assertIn("(backend=memfd, chunk_bytes=%d)" % ctx.chunk_bytes, text)
                self.assertNotIn("shm_name=", text)
            else:
                self.assertIn("(shm_name=%s, chunk_bytes=%d)" % (ctx.shm_name, ctx.chunk_bytes),
                              text)
        else:
            self.assertIn("inline transport", text)
            self.assertIn(ctx.reason, text)
        if self.transport == "auto" and self.expect == "inline":
            self.assertTrue(any(r.startswith("WARNING") for r in cm.output), cm.output)

    def test_store_retrieve_bytes(self):
        toks = random_tokens(16 * 3 + 5)
        data = self.chunks(3)
        self.assertEqual(self.ctx.lookup(toks), 0)
        self.assertEqual(self.ctx.store(toks, data), 3)
        self.assertEqual(self.ctx.lookup(toks), 3)
        out = [bytearray(self.ctx.chunk_bytes) for _ in range(3)]
        self.assertEqual(self.ctx.retrieve(toks, out=out), 3)
        self.assertEqual([bytes(b) for b in out], data)
        got = self.ctx.retrieve(toks, as_numpy=False)
        self.assertEqual([bytes(b) for b in got], data)
        self.assertTrue(all(isinstance(b, bytearray) for b in got))

    def test_store_skips_cached(self):
        toks = random_tokens(32)
        data = self.chunks(2)
        self.assertEqual(self.ctx.store(toks, data[:1]), 1)
        res = self.ctx.store(toks, data, details=True)
        self.assertEqual(res, kvpool.StoreResult(nchunks=2, stored=1, cached=1, busy=0,
                                                 no_space=0))
        # The cached chunk keeps its first content.
        self.assertEqual([bytes(b) for b in self.ctx.retrieve(toks, as_numpy=False)], data)

    def test_partial_and_offset(self):
        toks = random_tokens(64)
        data = self.chunks(4)
        self.assertEqual(self.ctx.store(toks, data[1:3], start=16), 2)
        self.assertEqual(self.ctx.lookup(toks), 0)  # chunk 0 missing: no leading chunk
        self.assertEqual(self.ctx.retrieve(toks, as_numpy=False), [])
        got = self.ctx.retrieve(toks, start=16, as_numpy=False)
        self.assertEqual([bytes(b) for b in got], data[1:3])
        self.assertEqual(self.ctx.store(toks, data[:1]), 1)
        self.assertEqual(self.ctx.lookup(toks), 3)
        out = [bytearray(self.ctx.chunk_bytes) for _ in range(2)]
        self.assertEqual(self.ctx.retrieve(toks, start=32, out=out), 1)  # limited by out
        self.assertEqual(bytes(out[0]), data[2])

    def test_salt_isolates(self):
        toks = random_tokens(32)
        self.assertEqual(self.ctx.store(toks, self.chunks(2), salt=b"tenant-a"), 2)
        self.assertEqual(self.ctx.lookup(toks, salt=b"tenant-a"), 2)
        self.assertEqual(self.ctx.lookup(toks, salt="tenant-b"), 0)
        self.assertEqual(self.ctx.lookup(toks), 0)

    def test_token_forms(self):
        toks = random_tokens(32)
        self.assertEqual(self.ctx.store(toks, self.chunks(2)), 2)
        from array import array
        self.assertEqual(self.ctx.lookup(tuple(toks)), 2)
        self.assertEqual(self.ctx.lookup(array("I", toks)), 2)
        if np is not None:
            self.assertEqual(self.ctx.lookup(np.array(toks, dtype=np.int64)), 2)
            self.assertEqual(self.ctx.lookup(np.array(toks, dtype=np.uint32)), 2)

    def test_two_phase_store(self):
        toks = random_tokens(48)
        data = self.chunks(3)
        self.assertEqual(self.ctx.store(toks, data[1:2], start=16), 1)
        plan = self.ctx.prepare_store(toks)
        views, idx = plan
        self.assertEqual(idx, [0, 2])
        self.assertEqual((plan.nchunks, plan.cached, plan.busy, plan.no_space), (3, 1, 0, 0))
        for v, i in zip(views, idx):
            self.assertFalse(v.readonly)
            self.assertEqual(v.nbytes, self.ctx.chunk_bytes)
            v[:] = data[i]
        self.assertEqual(self.ctx.lookup(toks), 0)  # reserved chunks are invisible
        self.assertEqual(self.ctx.commit_store(plan), 2)
        self.assertTrue(plan.done)
        self.assertEqual([bytes(b) for b in self.ctx.retrieve(toks, as_numpy=False)], data)
        with self.assertRaises(ValueError):
            views[0][0] = 1  # released at commit
        with self.assertRaises(kvpool.ClosedError):
            self.ctx.commit_store(plan)

    def test_two_phase_abort_and_context_manager(self):
        toks = random_tokens(32)
        plan = self.ctx.prepare_store(toks)
        self.ctx.abort_store(plan)
        self.assertEqual(self.ctx.lookup(toks), 0)
        with self.assertRaises(RuntimeError):
            with self.ctx.prepare_store(toks) as (views, _):
                views[0][:] = b"x" * len(views[0])
                raise RuntimeError("worker failed while writing")
        self.assertEqual(self.ctx.lookup(toks), 0)
        data = self.chunks(2)
        with self.ctx.prepare_store(toks) as (views, idx):
            for v, i in zip(views, idx):
                v[:] = data[i]
        self.assertEqual(self.ctx.lookup(toks), 2)

    def test_two_phase_retrieve(self):
        toks = random_tokens(64)
        data = self.chunks(3)
        self.ctx.store(toks, data)
        plan = self.ctx.prepare_retrieve(toks)
        self.assertEqual(plan.nchunks, 4)
        self.assertEqual(len(plan), 3)
        self.assertTrue(all(v.readonly for v in plan))
        self.assertEqual([bytes(v) for v in plan], data)
        first = plan[0]
        self.assertEqual(self.ctx.commit_retrieve(plan), 3)
        with self.assertRaises(ValueError):
            bytes(first)
        with self.ctx.prepare_retrieve(toks, start=16, end=48) as plan2:
            self.assertEqual([bytes(v) for v in plan2], data[1:3])
        self.assertTrue(plan2.done)

    def test_batched_retrieve(self):
        # Force small batches so that retrieve(out=None) and inline prepare_retrieve loop.
        saved = kvcontext._BATCH_BYTES
        kvcontext._BATCH_BYTES = 2 * self.ctx.chunk_bytes
        try:
            toks = random_tokens(16 * 7)
            data = self.chunks(5)
            self.ctx.store(toks, data)
            self.assertEqual([bytes(b) for b in self.ctx.retrieve(toks, as_numpy=False)], data)
            with self.ctx.prepare_retrieve(toks) as plan:
                self.assertEqual([bytes(v) for v in plan], data)
        finally:
            kvcontext._BATCH_BYTES = saved

    @needs_numpy
    def test_arrays_of_another_dtype_or_shape(self):
        # The byte count matches in every case; only the chunk's shape and the context's dtype
        # (bfloat16: uint16 in numpy) make a chunk.
        toks = random_tokens(16)
        shape = self.ctx.chunk_shape  # (2, LAYERS, 16, HIDDEN)
        good = np.arange(int(np.prod(shape)), dtype=np.uint16).reshape(shape)
        swapped = good.reshape(shape[0], shape[3], shape[2], shape[1])
        cases = [(good.astype(np.float16), "dtype float16"), (good.astype(np.int16), "dtype int16"),
                 (good.view(np.float32).reshape(-1), "dtype float32"),
                 (good.reshape(-1), "shape"), (swapped, "shape"), (good.view(np.uint8), "dtype")]
        for arr, word in cases:
            self.assertEqual(arr.nbytes, self.ctx.chunk_bytes)
            with self.assertRaises(kvpool.InvalidArgument) as cm:
                self.ctx.store(toks, [arr])
            self.assertIsInstance(cm.exception, ValueError)
            self.assertIn(word, str(cm.exception))
            with self.assertRaises(kvpool.InvalidArgument):
                self.ctx.retrieve(toks, out=[arr.copy()])
        self.assertEqual(self.ctx.lookup(toks), 0)
        self.assertEqual(self.ctx.store(toks, [good]), 1)
        # Untyped buffers are raw bytes, checked by size.
        self.assertEqual(self.ctx.store(toks, [memoryview(good).cast("B")]), 0)

    @needs_numpy
    def test_numpy(self):
        toks = random_tokens(32)
        arrs = [np.random.randint(0, 1 << 16, self.ctx.chunk_shape).astype(np.uint16)
                for _ in range(2)]
        self.assertEqual(self.ctx.store(toks, arrs), 2)
        got = self.ctx.retrieve(toks)
        self.assertEqual(len(got), 2)
        for g, a in zip(got, arrs):
            self.assertEqual(g.dtype, np.uint16)  # bfloat16: raw bits
            self.assertEqual(g.shape, self.ctx.chunk_shape)
            np.testing.assert_array_equal(g, a)
        out = [np.zeros(self.ctx.chunk_shape, np.uint16) for _ in range(2)]
        self.assertEqual(self.ctx.retrieve(toks, out=out), 2)
        np.testing.assert_array_equal(out[1], arrs[1])
        with self.ctx.prepare_retrieve(toks) as plan:
            view = self.ctx.as_numpy(plan[1])
            self.assertEqual(view.shape, self.ctx.chunk_shape)
            np.testing.assert_array_equal(view, arrs[1])
            del view

        f32 = self.register(dtype="float32")
        toks = random_tokens(16)
        with f32.prepare_store(toks) as (views, _):
            a = f32.as_numpy(views[0])
            self.assertEqual(a.dtype, np.float32)
            a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
            del a
        back = f32.retrieve(toks)[0]
        self.assertEqual(back.dtype, np.float32)
        np.testing.assert_array_equal(back.reshape(-1), np.arange(back.size, dtype=np.float32))
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.store(toks, [np.zeros(3, np.uint16)])
        with self.assertRaises(kvpool.InvalidArgument):  # not C-contiguous
            self.ctx.store(toks, [np.zeros(self.ctx.chunk_shape, np.uint16).T])

    @needs_numpy
    def test_numpy_view_read_only_after_commit(self):
        toks = random_tokens(16)
        with self.ctx.prepare_store(toks) as (views, _):
            a = self.ctx.as_numpy(views[0])
            a[...] = 7
        with self.assertRaises(ValueError):
            a[0, 0, 0, 0] = 1  # made read-only: cannot scribble over the published chunk
        np.testing.assert_array_equal(self.ctx.retrieve(toks)[0], 7)

    def test_errors(self):
        with self.assertRaises(kvpool.InvalidArgument) as cm:
            self.register(dtype="float13")
        self.assertEqual(cm.exception.errno, 22)
        self.assertEqual(cm.exception.name, "EINVAL")
        self.assertIn("dtype", str(cm.exception))
        with self.assertRaises(kvpool.InvalidArgument) as cm:
            self.register(num_layers=0)
        self.assertIn("num_layers", cm.exception.message)
        with self.assertRaises(kvpool.InvalidArgument):
            self.register(world_size=2, worker_rank=2)
        with self.assertRaises(kvpool.InvalidArgument):
            self.register(transport="carrier-pigeon")
        toks = random_tokens(40)
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.lookup([-1])
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.prepare_store(toks, start=5)
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.retrieve(toks, end=41)
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.store(toks, self.chunks(3))  # 48 tokens needed, 40 given
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.store(toks, [b"short"])
        with self.assertRaises(kvpool.InvalidArgument):
            self.ctx.retrieve(toks, out=[b"x" * self.ctx.chunk_bytes] * 2)  # read-only out
        # Every error is also a kvpool.Error and a ValueError.
        with self.assertRaises(ValueError):
            self.ctx.prepare_store(toks, start=5)

    def test_unregistered_instance(self):
        # A second context of the same id shares the daemon's registration.
        iid = "py-shared-%d" % random.randrange(1 << 30)
        a = self.client.register(iid, model_name="m", world_size=1, worker_rank=0,
                                 num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16",
                                 transport=self.transport)
        with self.assertLogs("kvpool", logging.WARNING):
            b = self.client.register(iid, model_name="m", world_size=1, worker_rank=0,
                                     num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16",
                                     transport=self.transport)
        self.assertTrue(b.existing)
        a.unregister()
        a.unregister()  # idempotent
        with self.assertRaises(kvpool.ClosedError):
            a.lookup([1] * 16)
        with self.assertRaises(kvpool.NotFound) as cm:
            b.lookup([1] * 16)  # the daemon no longer knows the handle
        self.assertEqual(cm.exception.name, "ENOENT")
        self.assertIsInstance(cm.exception, kvpool.Error)

    def test_context_manager_cleanup(self):
        toks = random_tokens(32)
        before = self.daemon.stats()
        with self.daemon.client() as c:
            with c.register("py-cm-%d" % random.randrange(1 << 30), model_name="m",
                            world_size=1, worker_rank=0, num_layers=LAYERS, hidden_dim=HIDDEN,
                            dtype="float16", transport=self.transport) as ctx:
                ctx.store(toks, [os.urandom(ctx.chunk_bytes)])
                self.assertEqual(self.daemon.stats()["instances"], before["instances"] + 1)
            self.assertFalse(ctx.registered)
            with self.assertRaises(kvpool.ClosedError):
                ctx.lookup(toks)
            ctx2 = c.register("py-cm2-%d" % random.randrange(1 << 30), model_name="m",
                              world_size=1, worker_rank=0, num_layers=LAYERS, hidden_dim=HIDDEN,
                              dtype="float16", transport=self.transport)
            plan = ctx2.prepare_store(random_tokens(32))  # left open on purpose
            self.assertEqual(len(plan[1]), 2)
            self.assertEqual(self.daemon.stats()["objects_reserved"],
                             before["objects_reserved"] + 2)
        self.assertTrue(c.closed)
        c.close()  # idempotent
        # The daemon releases a closed connection in that connection's thread, just after the
        # close: wait for it rather than race it.
        for _ in range(100):
            after = self.daemon.stats()
            if (after["instances"] == before["instances"]
                    and after["objects_reserved"] == before["objects_reserved"]):
                break
            threading.Event().wait(0.05)
        self.assertEqual(after["instances"], before["instances"])
        self.assertEqual(after["objects_reserved"], before["objects_reserved"])
        self.assertTrue(plan.done)
        with self.assertRaises(kvpool.ClosedError):
            ctx2.lookup(toks)
        with self.assertRaises(kvpool.ClosedError):
            c.ping()

    def test_threads(self):
        # One client shared by threads: calls are serialised, results stay correct.
        errors = []

        def work():
            try:
                for _ in range(5):
                    toks = random_tokens(32)
                    data = self.chunks(2)
                    self.ctx.store(toks, data)
                    got = self.ctx.retrieve(toks, as_numpy=False)
                    if [bytes(b) for b in got] != data:
                        errors.append("mismatch")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])


class TestShm(_RoundTrips):
    shm, transport, expect = True, "auto", "shm"

    def test_pool_views_outlive_close_safely(self):
        """Objects derived from pool views keep the pool mapped after close."""
        toks = random_tokens(16)
        data = self.chunks(1)
        self.ctx.store(toks, data)
        c = self.daemon.client()
        ctx = c.register("py-outlive-%d" % random.randrange(1 << 30), model_name="test-model",
                         world_size=1, worker_rank=0, num_layers=LAYERS, hidden_dim=HIDDEN,
                         dtype="bfloat16")
        ctx.store(toks, data)
        plan = ctx.prepare_retrieve(toks)
        view = plan[0]
        derived = view[0:64]  # a slice shares the memory but not the release
        self.assertEqual(bytes(derived), data[0][:64])
        conns = self.daemon.stats()["connections"]
        with self.assertLogs("kvpool", logging.WARNING):
            c.close()
        with self.assertRaises(ValueError):
            bytes(view)
        self.assertEqual(len(bytes(derived)), 64)  # still mapped: no fault
        self.assertEqual(self.daemon.stats()["instances"], 1)  # unregistered at once
        del derived, view, plan
        gc.collect()
        for _ in range(400):  # the deferred close runs when the last derived object goes
            if self.daemon.stats()["connections"] < conns:
                break
            threading.Event().wait(0.05)
        self.assertLess(self.daemon.stats()["connections"], conns)

    def test_backend(self):
        self.assertEqual(self.ctx.shm_backend, "posix")
        self.assertTrue(self.ctx.shm_name.startswith("kvpool_l1_pool_pytest_"))

    def test_shm_store_writes_pool_directly(self):
        toks = random_tokens(16)
        plan = self.ctx.prepare_store(toks)
        self.assertEqual(len(plan.views), 1)
        self.assertFalse(plan._staging)  # no staging buffer: the view is the pool
        self.ctx.abort_store(plan)


class TestShmMemfd(_RoundTrips):
    """The pool as a memfd segment handed over the socket: no name, the backend is named."""

    shm, transport, expect = True, "auto", "shm"
    extra = ("--shm-backend", "memfd")

    def test_backend(self):
        self.assertEqual(self.ctx.shm_backend, "memfd")
        self.assertEqual(self.ctx.shm_name, "")


class TestInlineForced(_RoundTrips):
    shm, transport, expect = True, "inline", "inline"

    def test_reason(self):
        self.assertEqual(self.ctx.reason, "requested by worker")


class TestInlineDaemon(_RoundTrips):
    shm, transport, expect = False, "auto", "inline"

    def test_shm_requested(self):
        with self.assertRaises(kvpool.ShmUnavailable) as cm:
            self.register(transport="shm")
        self.assertEqual(cm.exception.name, "KVP_ENOSHM")


class TestIdentity(_DaemonPerClass):
    """Instance ids: int or str, one registration per id and connection, clear conflicts."""

    def register(self, client, iid, model="llama-3-8b", num_layers=LAYERS, hidden_dim=HIDDEN):
        return client.register(iid, model_name=model, world_size=1, worker_rank=0,
                               num_layers=num_layers, hidden_dim=hidden_dim, dtype="float16")

    def test_int_instance_id(self):
        iid = 1000000 + random.randrange(1 << 30)  # like a worker's pid
        with self.daemon.client() as c:
            ctx = self.register(c, iid)
            self.assertEqual(ctx.instance_id, iid)
            self.assertFalse(ctx.existing)
            toks = random_tokens(16)
            data = os.urandom(ctx.chunk_bytes)
            self.assertEqual(ctx.store(toks, [data]), 1)
            self.assertEqual(bytes(ctx.retrieve(toks)[0]), data)
            # On the wire it is str(iid): the same id as a str is the same registration.
            with self.assertLogs("kvpool", logging.WARNING):
                again = self.register(c, str(iid))
            self.assertTrue(again.existing)
            self.assertEqual(again.lookup(toks), 1)
        self.assertIn("Instance %d non-GPU context" % iid, self.daemon.log())

    def test_instance_id_other_types(self):
        before = self.daemon.stats()["instances"]
        with self.daemon.client() as c:
            for bad in (True, 1.5, b"rank0", None, ["rank0"]):
                with self.assertRaises(TypeError) as cm:
                    self.register(c, bad)
                self.assertIn("instance_id must be a str or an int", str(cm.exception))
            self.assertEqual(self.daemon.stats()["instances"], before)
            c.ping()

    def test_other_model_refused(self):
        iid = "py-rank0-%d" % random.randrange(1 << 30)
        toks = random_tokens(32)
        with self.daemon.client() as a, self.daemon.client() as b:
            llama = self.register(a, iid)
            data = [os.urandom(llama.chunk_bytes) for _ in range(2)]
            self.assertEqual(llama.store(toks, data), 2)
            with self.assertRaises(kvpool.InstanceExists) as cm:
                self.register(b, iid, model="mistral-7b", num_layers=4, hidden_dim=16)
            e = cm.exception
            want = "instance id %s is registered with model_name 'llama-3-8b', not 'mistral-7b'" \
                % iid
            self.assertEqual(e.message, want)
            self.assertIn(want, str(e))
            self.assertEqual(e.name, "EEXIST")
            self.assertIsInstance(e, kvpool.InstanceConflict)
            self.assertIsInstance(e, kvpool.Error)
            with self.assertRaises(kvpool.InstanceExists) as cm:
                self.register(b, iid, hidden_dim=2 * HIDDEN)
            self.assertIn("hidden_dim %d, not %d" % (HIDDEN, 2 * HIDDEN), str(cm.exception))
            # The first registration is untouched.
            self.assertEqual(llama.lookup(toks), 2)
            self.assertEqual([bytes(x) for x in llama.retrieve(toks)], data)

    def test_busy_then_free(self):
        iid = "py-busy-%d" % random.randrange(1 << 30)
        with self.daemon.client() as b:
            with self.daemon.client() as a:
                self.register(a, iid)
                with self.assertRaises(kvpool.InstanceBusy) as cm:
                    self.register(b, iid)
                e = cm.exception
                self.assertEqual(e.name, "EBUSY")
                self.assertIsInstance(e, kvpool.InstanceConflict)
                self.assertIn("instance id %s in use by another connection, pid %d"
                              % (iid, os.getpid()), str(e))
            # a closed: the id is free.
            deadline = time.monotonic() + 5
            while True:
                try:
                    ctx = self.register(b, iid)
                    break
                except kvpool.InstanceBusy:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            self.assertFalse(ctx.existing)


class TestInstanceLimit(_DaemonPerClass):
    """--max-instances-per-client: one connection beyond it gets TooManyInstances (EDQUOT)."""

    extra = ("--max-instances-per-client", "2")

    def register(self, client, iid):
        return client.register(iid, model_name="m", world_size=1, worker_rank=0,
                               num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16")

    def test_limit_per_connection(self):
        base = "py-limit-%d-" % random.randrange(1 << 30)
        with self.daemon.client() as a, self.daemon.client() as b:
            first = self.register(a, base + "0")
            self.register(a, base + "1")
            with self.assertRaises(kvpool.TooManyInstances) as cm:
                self.register(a, base + "2")
            e = cm.exception
            self.assertEqual(e.name, "EDQUOT")
            self.assertEqual(e.errno, errno.EDQUOT)
            self.assertTrue(e.op.startswith("register "), e.op)
            self.assertIsInstance(e, kvpool.Error)
            self.assertNotIsInstance(e, ValueError)
            self.assertIn("--max-instances-per-client (2)", e.message)
            self.assertIn(e.message, str(e))
            # An id this connection holds already is returned, not refused.
            with self.assertLogs("kvpool", logging.WARNING):
                self.assertTrue(self.register(a, base + "1").existing)
            # The limit is per connection: another one registers the refused id.
            self.assertFalse(self.register(b, base + "2").existing)
            # Unregistering makes room again.
            first.unregister()
            self.assertFalse(self.register(a, base + "3").existing)


class TestDaemonGone(unittest.TestCase):
    def test_no_daemon(self):
        d = Daemon()
        try:
            with self.assertRaises(kvpool.DaemonUnavailable) as cm:
                kvpool.Client(d.socket, timeout=2.0)
            self.assertIsInstance(cm.exception, ConnectionError)
        finally:
            d.cleanup()

    def test_max_clients(self):
        # A daemon that serves --max-clients connections already refuses the next one: the
        # daemon is there but unavailable to this process, like a refused connect.
        with Daemon(extra=["--max-clients", "1"]) as d:
            first = None
            for _ in range(200):  # the start-up check's connection may not have left yet
                try:
                    first = d.client(timeout=5.0)
                    break
                except kvpool.DaemonUnavailable:
                    time.sleep(0.05)
            self.assertIsNotNone(first)
            with self.assertRaises(kvpool.DaemonUnavailable) as cm:
                d.client(timeout=5.0)
            self.assertEqual(cm.exception.errno, errno.EUSERS)
            self.assertIsInstance(cm.exception, ConnectionError)
            self.assertIn("--max-clients", str(cm.exception))
            first.ping()
            first.close()

    def test_daemon_stops(self):
        for transport in ("auto", "inline"):
            with Daemon() as d:
                c = d.client(timeout=5.0)
                ctx = c.register("py-gone", model_name="m", world_size=1, worker_rank=0,
                                 num_layers=LAYERS, hidden_dim=HIDDEN, dtype="float16",
                                 transport=transport)
                toks = random_tokens(16)
                ctx.store(toks, [os.urandom(ctx.chunk_bytes)])
                self.assertEqual(d.stop(), 0)
                with self.assertRaises(kvpool.DaemonUnavailable) as cm:
                    ctx.lookup(toks)
                self.assertLess(cm.exception.code, 0)
                with self.assertRaises(kvpool.Error):
                    ctx.retrieve(toks, as_numpy=False)
                c.close()


class TestExampleErrors(unittest.TestCase):
    """examples/worker_sim.py ends an expected failure with one line and exit status 2."""

    WORKER_SIM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                              "examples", "worker_sim.py")

    def run_sim(self, *args):
        p = subprocess.run([sys.executable, self.WORKER_SIM] + list(args), capture_output=True,
                           text=True, timeout=120)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertTrue(p.stderr.startswith("worker_sim: "), p.stderr)
        return p.stderr

    def test_no_daemon(self):
        d = Daemon()
        try:
            err = self.run_sim("--socket", d.socket)
            self.assertIn(d.socket, err)
            self.assertIn("--spawn-daemon", err)
        finally:
            d.cleanup()

    def test_no_shm(self):
        with Daemon(shm=False) as d:
            err = self.run_sim("--socket", d.socket, "--transport", "shm")
            self.assertIn("KVP_ENOSHM", err)
            self.assertIn("--transport auto", err)

    def test_daemon_binary_missing(self):
        err = self.run_sim("--spawn-daemon", "/nonexistent/kvpoold")
        self.assertIn("cannot start /nonexistent/kvpoold", err)


@needs_numpy
class TestPagedRoundTrip(unittest.TestCase):
    """store_paged / retrieve_paged through the daemon, both transports and all layouts."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(chunk_size=16).start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def _cache(self, layout, kv_first, nb, bs, heads, hd, layers, rng):
        if layout == "MLA":
            shape = (nb, bs, heads * hd)
        elif layout == "NHD":
            shape = (2, nb, bs, heads, hd) if kv_first else (nb, 2, bs, heads, hd)
        else:
            shape = (2, nb, heads, bs, hd) if kv_first else (nb, 2, heads, bs, hd)
        arrs = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(layers)]
        return arrs, kvpool.PagedKVCache(arrs, layout, kv_first)

    def test_round_trip(self):
        rng = np.random.default_rng(1)
        with self.daemon.client() as c:
            for transport in ("auto", "inline"):
                for layout, kv_first, bs in (("NHD", False, 16), ("NHD", True, 5),
                                             ("HND", False, 3), ("HND", True, 16),
                                             ("MLA", False, 7)):
                    heads, hd, layers = (1, 12, 3) if layout == "MLA" else (2, 4, 3)
                    ntok = 16 * 4 + 9
                    nblk = -(-ntok // bs)
                    src, src_cache = self._cache(layout, kv_first, nblk + 3, bs, heads, hd,
                                                 layers, rng)
                    dst, dst_cache = self._cache(layout, kv_first, nblk + 5, bs, heads, hd,
                                                 layers, rng)
                    src_table = rng.permutation(nblk + 3)[:nblk].astype(np.int32)
                    dst_table = list(rng.permutation(nblk + 5)[:nblk])
                    ctx = c.register("py-paged-%s-%s-%s-%d" % (transport, layout, kv_first, bs),
                                     model_name="m", world_size=1, worker_rank=0,
                                     num_layers=layers, hidden_dim=heads * hd, dtype="bfloat16",
                                     block_size=bs, use_mla=layout == "MLA",
                                     transport=transport)
                    toks = random_tokens(ntok)
                    self.assertEqual(ctx.store_paged(toks, src_cache, src_table), 4)
                    self.assertEqual(ctx.store_paged(toks, src_cache, src_table), 0)  # cached
                    before = [d.copy() for d in dst]
                    skip = 5
                    self.assertEqual(ctx.retrieve_paged(toks, dst_cache, dst_table,
                                                        skip_first_n=skip), 4)
                    # Gathering the copied tokens from both caches must agree.
                    a = src_cache.gather(src_table, skip, 64 - skip)
                    b = dst_cache.gather(dst_table, skip, 64 - skip)
                    np.testing.assert_array_equal(a, b, err_msg="%s %s %s %s" % (
                        transport, layout, kv_first, bs))
                    # Skipped tokens were not written.
                    b0 = dst_cache.gather(dst_table, 0, skip)
                    old = kvpool.PagedKVCache(before, layout, kv_first).gather(
                        dst_table, 0, skip)
                    np.testing.assert_array_equal(b0, old)
                    # A mismatching cache is refused before anything moves.
                    with self.assertRaises(kvpool.InvalidArgument):
                        ctx.store_paged(toks, kvpool.PagedKVCache(src[:2], layout, kv_first),
                                        src_table)
                    ctx.unregister()


# The shared tests run only through the configurations above.
del _RoundTrips


if __name__ == "__main__":
    unittest.main()
