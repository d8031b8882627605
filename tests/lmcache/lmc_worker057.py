"""LMCache 0.5.7's worker, through lmc_worker.py's classes.

What differs from 0.5.6 on the worker's side, and nothing else: a key carries
token_bytes (IPCCacheServerKey.from_token_ids packs them), the chunk size is
negotiated by name with the alignment the model needs (the adapter's own
get_lmcache_chunk_size(..., required_chunk_alignment=block size), as vLLM's
LMCacheMPConnector asks it), the transport without shared memory is
EngineDrivenContextInline (a tensor envelope), and vLLM's worker adapter takes
required_chunk_alignment, with which its heartbeat's recovery negotiates the
chunk size again before it registers again.

Every request is made by LMCache 0.5.7's own classes; runs inside
build/venv-lmcache-0.5.7rc2 (scripts/lmcache-env.sh).
"""

import lmc_worker
from lmc_worker import TIMEOUT


def packed_keys():
    """Whether the installed LMCache's keys carry token_bytes (0.5.7 and later)."""
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    return "token_bytes" in getattr(IPCCacheServerKey, "__dataclass_fields__", {})


def make_key(model, world_size, worker_id, tokens, request_id, start=0, end=None, readers=1,
             salt=""):
    from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

    return IPCCacheServerKey.from_token_ids(
        model_name=model, world_size=world_size, worker_id=worker_id, token_ids=tokens,
        start=start, end=len(tokens) if end is None else end, request_id=request_id,
        cache_salt=salt, num_kv_readers=readers)


def negotiate(req, alignment):
    """The chunk size as vLLM's 0.5.7 connector asks it: negotiate_chunk_size by name."""
    from lmcache.integration.vllm.vllm_multi_process_adapter import get_lmcache_chunk_size

    return get_lmcache_chunk_size(req, timeout=TIMEOUT, required_chunk_alignment=alignment)


class Worker(lmc_worker.Worker):
    """A 0.5.7 worker rank: lmc_worker.Worker with 0.5.7's keys and chunk size question."""

    def chunk_size(self):
        return negotiate(self.req, self.block_size)

    def key(self, tokens, request_id, start=0, end=None, worker=True, readers=1, salt=""):
        return make_key(self.model, self.world_size, self.rank if worker else None, tokens,
                        request_id, start, end, readers, salt)


class AdapterWorker(lmc_worker.AdapterWorker):
    """vLLM's worker adapter of 0.5.7, made as its connector makes it: with the alignment the
    model needs, so that it negotiates the chunk size by name, at start and after a recovery.
    kv_events: enable_kv_events, with which the adapter subscribes to the server's KV event
    stream (its first rank, at its first get_kv_events())."""

    def __init__(self, url, kv_events=False, **kw):
        self.kv_events = kv_events
        super().__init__(url, **kw)

    def connect(self):
        from lmcache.integration.vllm.vllm_multi_process_adapter import LMCacheMPWorkerAdapter
        import zmq

        self.zmq_ctx = zmq.Context()
        self.adapter = LMCacheMPWorkerAdapter(
            self.url, self.zmq_ctx, self.model, self.world_size, self.rank, self.block_size,
            mq_timeout=TIMEOUT, heartbeat_interval=self.heartbeat_interval,
            enable_kv_events=self.kv_events, required_chunk_alignment=self.block_size,
        )
        self.req = self.adapter.req_client
        self.iid = self.adapter.instance_id

    def chunk_size(self):
        return self.adapter.lmcache_tokens_per_chunk

    def key(self, tokens, request_id, start=0, end=None, worker=True, readers=1, salt=""):
        return make_key(self.model, self.world_size, self.rank if worker else None, tokens,
                        request_id, start, end, readers, salt)


class Scheduler(lmc_worker.Scheduler):
    """The scheduler side, with 0.5.7's free_lookup_locks and its extra_ranges."""

    def free(self, worker, tokens, request_id, readers=1, start=0, end=None, extra_ranges=()):
        key = worker.key(tokens, request_id, worker=False, readers=readers, start=start, end=end)
        self.req.free_lookup_locks(key, worker.world_size, tuple(extra_ranges)).result(
            timeout=TIMEOUT)
