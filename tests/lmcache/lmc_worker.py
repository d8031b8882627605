"""Drive LMCache's own worker classes against an LMCache multiprocess server.

Nothing here speaks the protocol by itself: every request is made by LMCache's
RequestClientFactory client and its EngineDrivenTransferContext (the classes
vLLM's LMCacheMPConnector uses on a CPU worker), so the tests exercise the real
worker and its real wire encoding. AdapterWorker goes one level up: vLLM's
own worker adapter registers, and its heartbeat registers again after a
kvpoold restart. Used by the recorder (record_frames.py), the real-worker
tests (test_worker.py) and the benchmark.

Runs inside a virtual environment with lmcache and torch
(scripts/lmcache-env.sh).
"""

import inspect
import os
import time
import uuid

import torch
import zmq

from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
    EngineDrivenTransferContext,
)
from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

TIMEOUT = 30.0

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}


def lmcache_version():
    import lmcache

    return getattr(lmcache, "__version__", "?")


def client(url):
    """A request client of the real LMCache worker, connected to url, with a ZeroMQ context of
    its own (close it with close_client()).

    vLLM passes zmq.Context.instance(), and creates a client once per process. Tests create and
    close dozens in one process; on the shared context a client created right after another was
    closed sometimes never connected (no TCP connection at all), so each gets its own context.
    """
    ctx = zmq.Context()
    c = RequestClientFactory.create(url, context=ctx)
    c._kvp_ctx = ctx
    return c


def close_client(c):
    c.close()
    c._kvp_ctx.term()


def new_instance_id():
    """An instance id as vLLM's adapter makes them (63 random bits)."""
    return uuid.uuid4().int & ((1 << 63) - 1)


class Worker:
    """One worker rank: a paged KV cache, a transfer context and its client.

    layout: "NHD" (K and V, [2, blocks, block_size, heads, head_size] per
    layer) or "MLA" ([blocks, block_size, latent] per layer).
    """

    def __init__(
        self,
        url,
        model="m",
        world_size=1,
        rank=0,
        dtype="float16",
        layers=2,
        heads=2,
        head_size=64,
        block_size=16,
        blocks=64,
        layout="NHD",
        seed=None,
        instance_id=None,
    ):
        self.url = url
        self.model = model
        self.world_size = world_size
        self.rank = rank
        self.dtype = DTYPES[dtype]
        self.block_size = block_size
        self.blocks = blocks
        self.layout = layout
        self.iid = instance_id if instance_id is not None else new_instance_id()
        self.connect()
        self.chunk = self.chunk_size()
        self.experimental = self.req.get_experimental().result(timeout=TIMEOUT)
        assert self.chunk % block_size == 0, (self.chunk, block_size)
        self.bic = self.chunk // block_size
        gen = torch.Generator().manual_seed(
            seed if seed is not None else (os.getpid() * 31 + rank)
        )
        self.kv = {}
        for i in range(layers):
            if layout == "MLA":
                shape = (blocks, block_size, heads * head_size)
            else:
                shape = (2, blocks, block_size, heads, head_size)
            t = torch.randn(shape, generator=gen, dtype=torch.float32)
            self.kv[f"layer.{i}"] = t.to(self.dtype)
        # 0.5.6 binds the instance and the client at construction; 0.5.5 takes them per call.
        self.bound = len(inspect.signature(EngineDrivenTransferContext).parameters) > 0
        self.new_transfer_context()

    def connect(self):
        """Sets self.req, the worker's request client."""
        self.req = client(self.url)

    def chunk_size(self):
        """The server's chunk size, asked as the worker's version asks (get_chunk_size)."""
        return self.req.get_chunk_size().result(timeout=TIMEOUT)

    def new_transfer_context(self):
        """Sets self.tc, the transfer context register() registers."""
        if self.bound:
            self.tc = EngineDrivenTransferContext(self.iid, self.req)
        else:
            self.tc = EngineDrivenTransferContext()

    def transport(self):
        """The class of the registered context: EngineDrivenContextShm or ...Pickle; None
        while there is none (the adapter's recover callback is registering it again, on its
        heartbeat's thread: LMCache raises RuntimeError until it is done)."""
        try:
            return type(self.tc.engine_driven_context).__name__
        except RuntimeError:
            return None

    def register(self):
        hints = None if self.layout == "MLA" else {"kv_layout": "NHD"}
        if self.bound:
            self.tc.register(
                self.kv, self.model, self.world_size, self.bic, TIMEOUT, layout_hints=hints
            )
        else:
            self.tc.register(
                self.iid, self.kv, self.model, self.world_size, self.bic, self.req, TIMEOUT,
                layout_hints=hints,
            )
        return self.transport()

    def key(self, tokens, request_id, start=0, end=None, worker=True, readers=1, salt=""):
        end = len(tokens) if end is None else end
        return IPCCacheServerKey(
            model_name=self.model,
            world_size=self.world_size,
            worker_id=self.rank if worker else None,
            token_ids=tuple(tokens),
            start=start,
            end=end,
            request_id=request_id,
            cache_salt=salt,
            num_kv_readers=readers,
        )

    def block_ids(self, nchunks, first_block=0):
        return [list(range(first_block, first_block + nchunks * self.bic))]

    def store(self, tokens, request_id, first_block=0, **kw):
        key = self.key(tokens, request_id, **kw)
        n = (key.end - key.start) // self.chunk
        args = (self.kv, self.block_ids(n, first_block), None, self.bic)
        if self.bound:
            fut = self.tc.submit_store(request_id, key, *args)
        else:
            fut = self.tc.submit_store(request_id, key, self.iid, *args)
        return fut.result(timeout=TIMEOUT)

    def retrieve(self, tokens, request_id, into, first_block=0, **kw):
        key = self.key(tokens, request_id, **kw)
        n = (key.end - key.start) // self.chunk
        args = (into, self.block_ids(n, first_block), None, self.bic)
        if self.bound:
            fut = self.tc.submit_retrieve(request_id, key, *args)
        else:
            fut = self.tc.submit_retrieve(request_id, key, self.iid, *args)
        return fut.result(timeout=TIMEOUT)

    def blank(self):
        return {k: torch.zeros_like(v) for k, v in self.kv.items()}

    def blocks_equal(self, other, nblocks, src_first=0, dst_first=0):
        """Are blocks [src_first, +nblocks) of self.kv equal to those of other?"""
        for name, t in self.kv.items():
            o = other[name]
            if self.layout == "MLA":
                a = t[src_first : src_first + nblocks]
                b = o[dst_first : dst_first + nblocks]
            else:
                a = t[:, src_first : src_first + nblocks]
                b = o[:, dst_first : dst_first + nblocks]
            if not torch.equal(a, b):
                return False
        return True

    def ping(self):
        return self.req.ping(self.iid).result(timeout=TIMEOUT)

    def unregister(self):
        if self.bound:
            fut = self.tc.unregister()
        else:
            fut = self.req.unregister_kv_cache_engine_driven_context(self.iid)
        if fut is not None:
            fut.result(timeout=TIMEOUT)

    def close(self):
        self.tc.close()
        close_client(self.req)


class AdapterWorker(Worker):
    """A Worker that is vLLM's own worker adapter underneath.

    LMCacheMPWorkerAdapter (lmcache.integration.vllm.vllm_multi_process_adapter), made with the
    arguments of vLLM's older connectors (kv world size, kv worker id, block size), which need
    no vLLM and run on a CPU, owns the instance id, the request client and the transfer context:
    register() is its register_kv_caches(), and start_heartbeat() starts its HeartbeatThread as
    its first store or retrieve does, with its recover callback (_reregister_kv_caches_callback),
    which on the heartbeat's unhealthy-to-healthy edge makes a new transfer context
    (create_transfer_context) and registers it again. store() and retrieve() go through the
    adapter's transfer context of the moment, as its submit_store_request() and
    submit_retrieve_request() do. close() is the adapter's shutdown().
    """

    def __init__(self, url, heartbeat_interval=1.0, **kw):
        self.heartbeat_interval = heartbeat_interval
        super().__init__(url, **kw)

    def connect(self):
        from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPWorkerAdapter

        self.zmq_ctx = zmq.Context()
        self.adapter = LMCacheMPWorkerAdapter(
            self.url, self.zmq_ctx, self.model, self.world_size, self.rank, self.block_size,
            mq_timeout=TIMEOUT, heartbeat_interval=self.heartbeat_interval,
        )
        self.req = self.adapter.req_client
        self.iid = self.adapter.instance_id

    @property
    def tc(self):
        return self.adapter.transfer_ctx

    def new_transfer_context(self):
        """Nothing: the adapter makes a transfer context at each registration."""

    def register(self):
        # What vLLM's layout query gives: NHD for the paged layout, nothing for MLA.
        hints = {} if self.layout == "MLA" else {"kv_layout": "NHD"}
        self.adapter.register_kv_caches(self.kv, layout_hints=hints)
        return self.transport()

    def start_heartbeat(self):
        self.adapter._ensure_heartbeat_started()

    def healthy(self):
        """The adapter's health event: cleared by a failed ping, set again after recovery."""
        return self.adapter.is_healthy

    def heartbeats(self):
        """How many heartbeat cycles (ping, then the recover callback if due) have ended."""
        hb = self.adapter._heartbeat
        return hb.total_runs if hb is not None else 0

    def close(self):
        self.adapter.shutdown()
        self.zmq_ctx.term()


class Scheduler:
    """The scheduler side of the connector: lookups, prefetch status, sessions."""

    def __init__(self, url):
        self.req = client(url)

    def lookup(self, worker, tokens, request_id, readers=1, salt="", end=None):
        key = worker.key(tokens, request_id, worker=False, readers=readers, salt=salt, end=end)
        self.req.lookup(key, worker.world_size).result(timeout=TIMEOUT)

    def wait(self, request_id, timeout=10.0):
        return self.req.wait_prefetch_status(request_id, timeout).result(timeout=timeout + TIMEOUT)

    def query(self, request_id):
        return self.req.query_prefetch_status(request_id).result(timeout=TIMEOUT)

    def free(self, worker, tokens, request_id, readers=1, start=0, end=None):
        key = worker.key(tokens, request_id, worker=False, readers=readers, start=start, end=end)
        self.req.free_lookup_locks(key, worker.world_size).result(timeout=TIMEOUT)

    def end_session(self, request_id):
        self.req.end_session(request_id).result(timeout=TIMEOUT)

    def close(self):
        close_client(self.req)


def wait_for(pred, timeout=30.0, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False
