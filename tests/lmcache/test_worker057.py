"""kvpoold's LMCache front end driven by the real LMCache 0.5.7 worker.

Usage (ctest label "lmcache"; run by the venv of scripts/lmcache-env.sh that holds
lmcache==0.5.7rc2, so that the worker is the installed lmcache):
    python tests/lmcache/test_worker057.py KVPOOLD GROUP [PYTHON_056]
GROUP is one of
  transfer  shared memory: round trips in float16, bfloat16, float32 and an MLA
            layout; negotiate_chunk_size with an alignment that divides the chunk
            size and one that does not (vLLM's adapter refuses the answer at once,
            kvpoold names --chunk-size); a hybrid model's registration (two KV cache
            groups: group_layouts) refused with a message that says so; the read
            locks of free_lookup_locks with extra_ranges; a worker offered the
            segment whose commit is a tensor envelope (it could not map it)
  envelope  no shared memory (--shm-name ""): the same round trips through the
            tensor envelope transport, two ranks, and hostile envelopes through the
            real client
  versions  a 0.5.6 worker (PYTHON_056: the python of venv-lmcache-0.5.6, run as a
            subprocess) and a 0.5.7 worker of the same model share a prefix through
            one kvpoold, in both directions, over shared memory and without it
            (pickle beside envelope)
  restart   vLLM's 0.5.7 worker adapter with its own heartbeat: kvpoold restarted
            with SIGTERM and SIGKILL between two stores (the adapter negotiates the
            chunk size by name and registers again), and the shared segment lost
            (it registers again, on the envelope transport)
  events    the 0.5.7 adapter with KV events on subscribes to the server's event
            stream: it reads enabled: false once, falls back to its own events and
            never subscribes again (counted over 5 s)

Every request is made by LMCache 0.5.7's own classes (lmc_worker057.py): its
RequestClient, its EngineDrivenTransferContext (EngineDrivenContextShm or
EngineDrivenContextInline) and vLLM's LMCacheMPWorkerAdapter.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lmc_worker  # noqa: E402
import lmc_worker057 as w057  # noqa: E402
import test_worker  # noqa: E402
from lmc_worker import TIMEOUT, wait_for  # noqa: E402
from test_worker import CHUNK, tokens  # noqa: E402

PYTHON_056 = None
# Seconds between the heartbeats of vLLM's worker adapter (vLLM's default is 10 s).
HEARTBEAT = 1.0


def instance_line(iid, rest):
    """The registry's line for an LMCache instance, named as LMCache names it."""
    return "Instance %d non-GPU context using %s" % (iid, rest)


class Base(test_worker.Base):
    """test_worker's daemon and teardown (no ERROR in the log), with 0.5.7's worker."""

    def worker(self, **kw):
        w = w057.Worker(self.d.url, **kw)
        self.closers.append(w.close)
        return w

    def adapter_worker(self, **kw):
        w = w057.AdapterWorker(self.d.url, **kw)
        self.closers.append(w.close)
        return w

    def scheduler(self):
        s = w057.Scheduler(self.d.url)
        self.closers.append(s.close)
        return s

    def mine(self, w):
        return [i for i in self.d.status()["instances"]
                if i["instance_id"] == "lmcache-%d" % w.iid]

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.d.http,
                                    timeout=10) as r:
            return r.read().decode()

    def roundtrip(self, dtype, layout, transport, registry_transport):
        w = self.worker(dtype=dtype, layout=layout, seed=7)
        s = self.scheduler()
        self.assertEqual(w.chunk, CHUNK)
        self.assertEqual(w.experimental, [])
        self.assertEqual(w.register(), transport)
        self.assertTrue(w.ping())
        toks = tokens(3)
        n = 3 * CHUNK
        self.assertTrue(w.store(toks, "r1", end=n))
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        self.assertTrue(w.store(toks, "r1", end=n))  # cached: nothing new
        self.assertEqual(self.d.gauge("objects_committed"), 3)
        s.lookup(w, toks, "r1")
        self.assertEqual(s.wait("r1"), 3)
        self.assertEqual(s.query("r1"), 0)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "r1", out, end=n, first_block=8))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 0, 8))
        self.assertTrue(all(float(t.abs().sum()) == 0 for t in
                            (v[:8] if layout == "MLA" else v[:, :8] for v in out.values())))
        s.end_session("r1")
        self.assertFalse(w.retrieve(tokens(2, base=5000), "r2", w.blank(), end=2 * CHUNK))
        mine = self.mine(w)
        self.assertEqual([(i["transport"], i["dtype"], i["use_mla"]) for i in mine],
                         [(registry_transport, dtype, layout == "MLA")])
        self.assertIn('kvpool_instances{front_end="lmcache",transport="%s"} 1'
                      % registry_transport, self.metrics())
        w.unregister()
        self.assertEqual(self.d.status()["instances"], [])
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertEqual(self.d.counter("lmcache_malformed"), 0)
        return w


class Transfer(Base):
    """Shared memory."""

    def shm_roundtrip(self, dtype, layout="NHD"):
        w = self.roundtrip(dtype, layout, "EngineDrivenContextShm", "shm")
        log = self.d.text()
        self.assertIn(instance_line(w.iid, "SHM transport (shm_name=kvpool_l1_pool_%s, "
                                    "pool_size=" % self.d.shm), log)
        self.assertIn("Using shm engine-driven transfer strategy", log)
        # Its requests came in 0.5.7's forms: by name, and three payloads.
        self.assertIn("LMCache negotiate_chunk_size (1 payload)", log)
        self.assertIn("LMCache prepare_store (3 payloads)", log)
        self.assertNotIn("LMCache get_chunk_size", log)

    def test_float16(self):
        self.shm_roundtrip("float16")

    def test_bfloat16(self):
        self.shm_roundtrip("bfloat16")

    def test_float32(self):
        self.shm_roundtrip("float32")

    def test_mla(self):
        self.shm_roundtrip("bfloat16", layout="MLA")

    def test_negotiate_chunk_size(self):
        req = lmc_worker.client(self.d.url)
        self.closers.append(lambda: lmc_worker.close_client(req))
        # Alignments that divide the chunk size: the chunk size, as `lmcache server` answers.
        for align in (1, 8, CHUNK):
            self.assertEqual(w057.negotiate(req, align), CHUNK)
        self.assertNotIn("--chunk-size", self.d.text())
        # One that does not: still the chunk size (lmcache server sends nothing and the worker
        # waits out its timeout), and kvpoold says which --chunk-size would fit.
        began = time.monotonic()
        self.assertEqual(w057.negotiate(req, 3 * CHUNK), CHUNK)
        self.assertLess(time.monotonic() - began, 5)
        self.assertIn("An LMCache worker needs a chunk size that is a multiple of %d, and "
                      "kvpoold's is %d: answered %d, which its connector refuses; start kvpoold "
                      "with --chunk-size %d" % (3 * CHUNK, CHUNK, CHUNK, 3 * CHUNK), self.d.text())
        # vLLM's 0.5.7 adapter with a 48-token block stops at once with its own message.
        from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPWorkerAdapter
        import zmq

        ctx = zmq.Context()
        began = time.monotonic()
        try:
            LMCacheMPWorkerAdapter(self.d.url, ctx, "m", 1, 0, 3 * CHUNK, mq_timeout=TIMEOUT,
                                   required_chunk_alignment=3 * CHUNK)
            self.fail("vLLM's adapter took a chunk size of %d for 48-token blocks" % CHUNK)
        except ValueError as e:
            self.assertIn("must be a multiple of %d" % (3 * CHUNK), str(e))
            # The half-made adapter's client (its constructor raised after making it) is
            # closed before its context is.
            tb = e.__traceback__
            while tb and not isinstance(tb.tb_frame.f_locals.get("self"), LMCacheMPWorkerAdapter):
                tb = tb.tb_next
            tb.tb_frame.f_locals["self"].req_client.close()
        self.assertLess(time.monotonic() - began, 10)
        ctx.term()
        self.assertEqual(self.d.counter("lmcache_malformed"), 0)

    def test_hybrid_model_refused(self):
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo

        w = self.worker(model="hybrid", seed=8)
        groups = [EngineGroupInfo(engine_group_id=0, layer_indices=[0], tokens_per_block=CHUNK),
                  EngineGroupInfo(engine_group_id=1, layer_indices=[1], tokens_per_block=CHUNK)]
        # The real worker's registration of a hybrid model: group_layouts with two groups.
        w.tc.register(w.kv, w.model, 1, w.bic, TIMEOUT, layout_hints={"kv_layout": "NHD"},
                      engine_group_infos=groups, lmcache_chunk_tokens=CHUNK)
        self.assertEqual(len(w.tc._group_states), 2)
        log = self.d.text()
        self.assertIn("LMCache instance %d (model hybrid, world size 1) refused: a hybrid model "
                      "(2 KV cache groups in group_layouts): kvpool serves one group; run vLLM "
                      "with --disable-hybrid-kv-cache-manager" % w.iid, log)
        self.assertEqual(self.d.status()["instances"], [])
        # Its grouped store (group 1's first chunk all null blocks: skipped_chunks) stores
        # nothing, and says why.
        toks = tokens(2)
        key = w.key(toks, "h", end=2 * CHUNK)
        blocks = [list(range(1, 1 + 2 * w.bic)), [0] * w.bic + list(range(10, 10 + w.bic))]
        self.assertFalse(w.tc.submit_store("h", key, w.kv, blocks, None, w.bic)
                         .result(timeout=TIMEOUT))
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertIn("LMCache prepare_store of instance %d skips 1 chunk positions in 2 KV "
                      "cache groups: kvpool serves one group" % w.iid, self.d.text())

    def test_extra_ranges(self):
        w = self.worker(model="x", seed=9)
        s = self.scheduler()
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        toks = tokens(3)
        self.assertTrue(w.store(toks, "x", end=3 * CHUNK))
        s.lookup(w, toks, "q")
        self.assertEqual(s.wait("q"), 3)
        self.assertEqual(self.d.gauge("objects_pinned"), 3)
        # vLLM's prefix cache shrank: the scheduler looks the request up again, from token 0,
        # and remembers the first lookup's range. The new lookup replaced the first one's locks.
        s.lookup(w, toks, "q", end=2 * CHUNK)
        self.assertEqual(s.wait("q"), 2)
        self.assertEqual(self.d.gauge("objects_pinned"), 2)
        # Only the abandoned range: the current lookup keeps its locks for its retrieve.
        s.free(w, toks, "q", start=0, end=0, extra_ranges=[(2 * CHUNK, 3 * CHUNK)])
        self.assertEqual(self.d.gauge("objects_pinned"), 2)
        # The key's own range and the abandoned one (a range with start >= end releases
        # nothing, as upstream): every lock goes.
        s.free(w, toks, "q", start=0, end=2 * CHUNK,
               extra_ranges=[(2 * CHUNK, 3 * CHUNK), (CHUNK, CHUNK)])
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        s.end_session("q")
        self.assertEqual(self.d.counter("lmcache_malformed"), 0)
        self.assertIn("LMCache free_lookup_locks (3 payloads)", self.d.text())

    def test_fallback_to_envelope(self):
        import torch
        from lmcache.v1.multiprocess.transfer_context.tensor_wire import (
            decode_tensors,
            encode_tensors,
        )

        w = self.worker(dtype="float32", seed=5)
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        key = w.key(tokens(2), "f", end=2 * CHUNK)
        shape = (2, 2, CHUNK, 128)
        chunks = [torch.randn(shape, dtype=torch.float32) for _ in range(2)]
        # What EngineDrivenContextInline sends when the segment could not be mapped.
        for _ in range(2):
            self.assertTrue(w.req.commit_store(key, w.iid, encode_tensors(chunks))
                            .result(timeout=TIMEOUT))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        log = self.d.text()
        self.assertEqual(log.count("LMCache instance %d fell back to the envelope transport "
                                   "(could not map kvpool_l1_pool_%s" % (w.iid, self.d.shm)), 1)
        self.assertEqual([i["transport"] for i in self.mine(w)], ["envelope"])
        reply = w.req.prepare_retrieve(key, w.iid).result(timeout=TIMEOUT)
        self.assertTrue(reply.success)
        self.assertEqual(reply.context, {})
        got = decode_tensors(reply.data, expected_shape=torch.Size(shape),
                             expected_dtype=torch.float32, expected_count=2)
        for a, b in zip(got, chunks):
            self.assertTrue(torch.equal(a, b))
        w.req.commit_retrieve(key, w.iid).result(timeout=TIMEOUT)
        self.assertEqual(self.d.gauge("objects_pinned"), 0)


class Envelope(Base):
    """No shared memory to offer (--shm-name ""): LMCache 0.5.7's tensor envelope."""

    def daemon_args(self):
        return ("--shm-name", "")

    def envelope_roundtrip(self, dtype, layout="NHD"):
        w = self.roundtrip(dtype, layout, "EngineDrivenContextInline", "envelope")
        log = self.d.text()
        self.assertIn(instance_line(w.iid, "envelope transport (SHM disabled by configuration)"),
                      log)
        self.assertIn("Using safe inline engine-driven transfer strategy", log)
        # The chunks travelled in the messages: stored and retrieved through the daemon, and
        # counted under the envelope transport, not kvpool's inline one.
        st = self.d.status()["counters"]
        self.assertEqual((st["store_chunks_envelope"], st["retrieve_chunks_envelope"]), (3, 3))
        self.assertEqual((st["store_chunks_inline"], st["retrieve_chunks_inline"]), (0, 0))
        self.assertEqual((st["store_chunks_shm"], st["retrieve_chunks_shm"]), (0, 0))

    def test_float16(self):
        self.envelope_roundtrip("float16")

    def test_bfloat16(self):
        self.envelope_roundtrip("bfloat16")

    def test_float32(self):
        self.envelope_roundtrip("float32")

    def test_mla(self):
        self.envelope_roundtrip("bfloat16", layout="MLA")

    def test_two_ranks(self):
        r0 = self.worker(model="tp", world_size=2, rank=0, seed=1)
        r1 = self.worker(model="tp", world_size=2, rank=1, seed=2)
        s = self.scheduler()
        self.assertEqual(r0.register(), "EngineDrivenContextInline")
        self.assertEqual(r1.register(), "EngineDrivenContextInline")
        toks = tokens(2)
        n = 2 * CHUNK
        self.assertTrue(r0.store(toks, "a", end=n))
        s.lookup(r0, toks, "a")
        self.assertEqual(s.wait("a"), 0)  # a lookup needs every rank
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
        self.assertEqual(self.d.gauge("objects_pinned"), 0)

    def test_hostile_envelopes(self):
        """Through the real client: every one refused, nothing stored, the daemon serving on.
        (tests/lmcache/test_replay057.py sends the same at the wire level, into a full pool.)"""
        import msgspec
        import torch
        from lmcache.v1.multiprocess.transfer_context.tensor_wire import encode_tensors

        w = self.worker(dtype="float16", seed=3)
        self.assertEqual(w.register(), "EngineDrivenContextInline")
        toks = tokens(1)
        key = w.key(toks, "h", end=CHUNK)
        shape = [2, 2, CHUNK, 128]
        good = torch.ones(shape, dtype=torch.float16)
        data = good.numpy().tobytes()

        def env(tensors, version=1, **extra):
            return msgspec.msgpack.encode(dict({"version": version, "tensors": tensors}, **extra))

        def frame(dtype="float16", shp=shape, raw=data, **extra):
            return dict({"dtype": dtype, "shape": shp, "data": raw}, **extra)

        payloads = {
            "version 2": env([frame()], version=2),
            "an unknown envelope field": env([frame()], extra=1),
            "an unknown tensor field": env([frame(stride=[1])]),
            "a grouped envelope": msgspec.msgpack.encode(
                {"version": 1, "groups": [{"chunk_indices": [0], "tensors": [frame()]}]}),
            "wrong dtype": encode_tensors([torch.ones(shape, dtype=torch.float32)]),
            "bfloat16 bytes for float16": encode_tensors([good.to(torch.bfloat16)]),
            "wrong shape": encode_tensors([torch.ones([2, 2, CHUNK, 64], dtype=torch.float16)]),
            "shape beyond the data": env([frame(shp=[2, 2, 2 * CHUNK, 128])]),
            "data shorter than the shape": env([frame(raw=data[:-2])]),
            "two tensors for one chunk": encode_tensors([good, good]),
            "no tensor": env([]),
            "truncated": encode_tensors([good])[:-9],
        }
        for name, payload in payloads.items():
            ok = w.req.commit_store(key, w.iid, payload).result(timeout=TIMEOUT)
            self.assertIs(ok, False, name)
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        self.assertEqual(self.d.gauge("objects_reserved"), 0)
        self.assertEqual(self.d.counter("lmcache_malformed"), len(payloads))
        self.assertIsNone(self.d.proc.poll())
        self.assertIn("tensor envelope commit of", self.d.text())
        # The real envelope is stored and read back.
        self.assertTrue(w.req.commit_store(key, w.iid, encode_tensors([good]))
                        .result(timeout=TIMEOUT))
        self.assertEqual(self.d.gauge("objects_committed"), 1)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "h", out, end=CHUNK))
        self.assertTrue(all(float(v[:, :w.bic].float().mean()) == 1.0 for v in out.values()))
        self.assertEqual(self.d.gauge("objects_pinned"), 0)


# A 0.5.6 worker in its own environment (PYTHON_056): registers, then stores or looks up and
# retrieves, and prints what it saw as JSON.
WORKER_056 = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, %r)
    import lmc_worker
    from lmc_worker import Scheduler, Worker
    a = json.loads(sys.argv[1])
    w = Worker(a["url"], model=a["model"], dtype=a["dtype"], seed=a["seed"])
    got = {"version": lmc_worker.lmcache_version(), "transport": w.register()}
    toks, n = a["tokens"], a["chunks"] * w.chunk
    if a["action"] == "store":
        got["stored"] = w.store(toks, a["rid"], end=n)
    else:
        s = Scheduler(a["url"])
        s.lookup(w, toks, a["rid"])
        got["hits"] = s.wait(a["rid"])
        out = w.blank()
        got["retrieved"] = w.retrieve(toks, a["rid"], out, end=n, first_block=8)
        got["equal"] = w.blocks_equal(out, a["chunks"] * w.bic, 0, 8)
        s.end_session(a["rid"])
        s.close()
    w.unregister()
    w.close()
    print(json.dumps(got))
    """
)


class VersionsBase(Base):
    """A 0.5.6 and a 0.5.7 worker of one model share their chunks through one kvpoold: the
    keys of token_ids and of token_bytes are the same, and each worker reads the chunks in
    its own transport's form. Both build their KV cache from the same seed, so each can
    compare what it reads with its own blocks."""

    def run_056(self, **args):
        args.update(url=self.d.url, model="shared", dtype="bfloat16")
        p = subprocess.run([PYTHON_056, "-c", WORKER_056 % HERE, json.dumps(args)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        got = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(got["version"], "0.5.6")
        return got

    def share(self, transport_057, transport_056, registry_transport):
        s = self.scheduler()
        # 0.5.7 stores a prefix and a suffix of its own; 0.5.6 finds the prefix and reads it.
        a = self.worker(model="shared", dtype="bfloat16", seed=61)
        self.assertEqual(a.register(), transport_057)
        prefix = tokens(2, extra=0)
        self.assertTrue(a.store(prefix + [900 + i for i in range(CHUNK)], "a", end=3 * CHUNK))
        got = self.run_056(action="retrieve", seed=61, rid="b", chunks=2,
                           tokens=prefix + [700 + i for i in range(CHUNK)])
        self.assertEqual(got, {"version": "0.5.6", "transport": transport_056, "hits": 2,
                               "retrieved": True, "equal": True})
        # 0.5.6 stores; 0.5.7 finds it and reads it.
        other = tokens(2, base=30000)
        got = self.run_056(action="store", seed=62, rid="c", chunks=2, tokens=other)
        self.assertEqual(got, {"version": "0.5.6", "transport": transport_056, "stored": True})
        self.assertEqual(self.d.gauge("objects_committed"), 5)
        d = self.worker(model="shared", dtype="bfloat16", seed=62)
        self.assertEqual(d.register(), transport_057)
        s.lookup(d, other, "d")
        self.assertEqual(s.wait("d"), 2)
        out = d.blank()
        self.assertTrue(d.retrieve(other, "d", out, end=2 * CHUNK, first_block=8))
        self.assertTrue(d.blocks_equal(out, 2 * d.bic, 0, 8))
        s.end_session("d")
        self.assertEqual(self.d.gauge("objects_pinned"), 0)
        self.assertEqual(self.d.counter("lmcache_malformed"), 0)
        self.assertEqual({i["transport"] for i in self.mine(a) + self.mine(d)},
                         {registry_transport})
        return self.d.text()


class Versions(VersionsBase):
    def test_shared_memory(self):
        log = self.share("EngineDrivenContextShm", "EngineDrivenContextShm", "shm")
        # Each registration's strategy line is the one of its version's lmcache server.
        self.assertIn("Using shm engine-driven transfer strategy", log)
        self.assertIn("Using shm non-GPU transfer strategy", log)


class VersionsInBand(VersionsBase):
    """The same without shared memory: 0.5.6 pickles, 0.5.7 sends tensor envelopes."""

    def daemon_args(self):
        return ("--shm-name", "")

    def test_pickle_and_envelope(self):
        log = self.share("EngineDrivenContextInline", "EngineDrivenContextPickle", "envelope")
        self.assertIn("Using safe inline engine-driven transfer strategy", log)
        self.assertIn("Using pickle non-GPU transfer strategy", log)
        self.assertIn("pickle transport (SHM disabled by configuration)", log)


class RestartBase(Base):
    """kvpoold restarted under vLLM's live 0.5.7 worker adapter (SIGTERM, and SIGKILL: a crash
    that leaves its segment and lock files), on the same address and options. The adapter's
    heartbeat sees the false ping, and its recovery negotiates the chunk size again by name,
    then registers again: its next store lands and is found by a lookup."""

    def recover(self, sig, transport):
        w = self.adapter_worker(model="rs", seed=21, heartbeat_interval=HEARTBEAT)
        s = self.scheduler()
        self.assertEqual(w.register(), transport)
        w.start_heartbeat()
        self.assertTrue(w.store(tokens(2), "before", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)
        n = w.heartbeats()
        self.assertTrue(wait_for(lambda: w.heartbeats() > n, 5 * HEARTBEAT))
        self.d.restart(sig)
        self.assertEqual(self.d.gauge("objects_committed"), 0)
        registered = "Registered non-GPU context for instance %d (" % w.iid
        unhealthy = []

        def recovered():
            unhealthy.append(not w.healthy())
            return registered in self.d.text() and w.healthy()

        wait_for(recovered, 4 * HEARTBEAT + 5)
        toks = tokens(3, base=3000)
        self.assertTrue(w.store(toks, "after", end=3 * CHUNK, first_block=8))
        self.assertEqual(self.d.gauge("objects_committed"), 3,
                         "the store after the restart stored nothing: the instance was not "
                         "registered again\n" + self.d.text()[-3000:])
        s.lookup(w, toks, "after")
        self.assertEqual(s.wait("after"), 3)
        out = w.blank()
        self.assertTrue(w.retrieve(toks, "after", out, end=3 * CHUNK, first_block=16))
        self.assertTrue(w.blocks_equal(out, 3 * w.bic, 8, 16))
        s.end_session("after")
        log = self.d.text()
        self.assertTrue(any(unhealthy), "the worker's heartbeat never saw a false ping")
        self.assertIn("LMCache ping of instance %d, which this kvpoold has not registered"
                      % w.iid, log)
        self.assertEqual(log.count(registered), 1)
        # 0.5.7's recovery: the chunk size by name first, then the registration.
        asked = log.find("LMCache negotiate_chunk_size (1 payload)")
        self.assertGreaterEqual(asked, 0, log[-3000:])
        self.assertLess(asked, log.find(registered))
        return log


class Restart(RestartBase):
    """A cold restart (--warm-restart off): the dead daemon's segment is replaced, the new
    kvpoold starts empty."""

    def daemon_args(self):
        return ("--warm-restart", "off")

    def test_sigterm(self):
        self.recover(signal.SIGTERM, "EngineDrivenContextShm")

    def test_sigkill(self):
        log = self.recover(signal.SIGKILL, "EngineDrivenContextShm")
        self.assertIn("Replacing stale segment /dev/shm/kvpool_l1_pool_%s" % self.d.shm, log)


class RestartEnvelope(RestartBase):
    """The same on the tensor envelope transport (--shm-name "")."""

    def daemon_args(self):
        return ("--shm-name", "")

    def test_sigkill(self):
        self.recover(signal.SIGKILL, "EngineDrivenContextInline")


class SegmentLost(Base):
    """The POSIX segment truncated under kvpoold: every instance on shared memory is dropped,
    and vLLM's 0.5.7 adapter registers again on its heartbeat and is given no segment: its
    tensor envelope transport."""

    allowed_errors = (r"The shared segment /dev/shm/\S+ shrank to 4096 of \d+ bytes under "
                      r"kvpoold",)

    def test_instance_moves_to_envelope(self):
        w = self.adapter_worker(model="sg", seed=31, heartbeat_interval=HEARTBEAT)
        s = self.scheduler()
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        w.start_heartbeat()
        self.assertTrue(w.store(tokens(2), "before", end=2 * CHUNK))
        os.truncate("/dev/shm/kvpool_l1_pool_" + self.d.shm, 4096)
        wait_for(lambda: w.transport() == "EngineDrivenContextInline" and w.healthy(),
                 4 * HEARTBEAT + 5)
        self.assertEqual(w.transport(), "EngineDrivenContextInline",
                         "the worker was not moved off the lost segment\n"
                         + self.d.text()[-3000:])
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
        self.assertIn("on its envelope transport", log)
        self.assertRegex(log, re.escape(instance_line(w.iid, "envelope transport (")) +
                         r"the shared segment shrank under kvpoold")
        self.assertEqual([i["transport"] for i in self.mine(w)], ["envelope"])


class Events(Base):
    """vLLM's 0.5.7 adapter with KV events on: its first rank subscribes to the server's KV
    event stream at its first get_kv_events(). kvpoold answers one batch with enabled false
    and ends the stream after the worker's ack, so the worker falls back to its own events and
    never subscribes again; a stream ended before the ack would make it subscribe again every
    second."""

    def test_subscribes_once(self):
        w = self.adapter_worker(model="ev", seed=41, heartbeat_interval=HEARTBEAT,
                                kv_events=True)
        self.assertEqual(w.register(), "EngineDrivenContextShm")
        a = w.adapter
        self.assertTrue(a._kv_event_subscriber)
        self.assertTrue(a._kv_event_server_source)
        self.assertEqual(a.get_kv_events(), [])
        self.assertTrue(wait_for(lambda: not a._kv_event_subscriber, 10),
                        "the worker did not give up the subscription\n" + self.d.text()[-3000:])
        self.assertFalse(a._kv_event_server_source)  # it reports its own stores now
        self.assertTrue(wait_for(lambda: not a._kv_event_receiver.is_alive(), 10))
        time.sleep(5)
        a.get_kv_events()
        self.assertEqual(self.d.counter("lmcache_kv_event_subscriptions"), 1)
        self.assertIn("kvpool_lmcache_kv_event_subscriptions_total 1", self.metrics())
        log = self.d.text()
        self.assertEqual(log.count("subscribed to KV events"), 1)
        self.assertIn("LMCache instance %d (model ev) subscribed to KV events: answered that "
                      "kvpoold records none (enabled: false)" % w.iid, log)
        self.assertIn("a stream's ack: ended", log)
        # Its ack ended the stream; its cancel after it needs nothing: nothing dropped.
        self.assertEqual(self.d.counter("lmcache_dropped"), 0)
        # The worker stores as before.
        self.assertTrue(w.store(tokens(2), "s", end=2 * CHUNK))
        self.assertEqual(self.d.gauge("objects_committed"), 2)


def main():
    global PYTHON_056
    test_worker.KVPOOLD = sys.argv[1]
    group = sys.argv[2]
    PYTHON_056 = sys.argv[3] if len(sys.argv) > 3 else None
    print("lmcache %s, test group %s" % (lmc_worker.lmcache_version(), group), flush=True)
    if not w057.packed_keys():
        sys.exit("test_worker057.py needs LMCache 0.5.7 (keys with token_bytes); this is %s"
                 % lmc_worker.lmcache_version())
    groups = {
        "transfer": [Transfer],
        "envelope": [Envelope],
        "versions": [Versions, VersionsInBand],
        "restart": [Restart, RestartEnvelope, SegmentLost],
        "events": [Events],
    }
    if group == "versions" and not (PYTHON_056 and os.access(PYTHON_056, os.X_OK)):
        sys.exit("the versions group needs the python of venv-lmcache-0.5.6 (%s): create it "
                 "with 'make lmcache-env'" % PYTHON_056)
    suite = unittest.TestSuite(
        unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in groups[group]
    )
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
