"""lmcache_worker057.py - kvpool-bench's LMCache 0.5.7 worker: bench/lmcache_worker.py with what
LMCache 0.5.7's worker does differently, for the 0.5.7 rows of the "lmcache" section
(bench/lmcache.c).

Every request is made by LMCache 0.5.7's own classes (RequestClientFactory,
EngineDrivenTransferContext), every copy by its own gather/scatter and tensor envelope, as vLLM's
LMCacheMPConnector does on a CPU worker in engine-driven mode. What differs from 0.5.6, and
nothing else:

- a key carries token_bytes: IPCCacheServerKey.from_token_ids packs the token ids;
- the chunk size is negotiated by name with the alignment the model needs (negotiate_chunk_size
  with the block size, through the adapter's get_lmcache_chunk_size, as the connector asks it);
- without shared memory the transport is EngineDrivenContextInline, a typed msgpack
  TensorEnvelope ("setup" answers "envelope"), not a torch pickle.

The commands are lmcache_worker.py's, plus the worker's own copy of the envelope path:

    envelope-store CHUNK NOPS     -> "ok NS BYTES LAT_US...": gather into fresh tensors +
                                     encode_tensors, what a 0.5.7 worker does before it sends
                                     a store without shared memory
    envelope-retrieve CHUNK NOPS  -> the same: decode_tensors (against the registered shape,
                                     dtype and count, as the worker checks it) + scatter, what
                                     it does after it receives a retrieve (the envelope is made
                                     untimed before)

Runs under the LMCache 0.5.7 virtual environment's python (scripts/lmcache-env.sh BUILD_DIR
0.5.7rc2).
"""

import sys
import time
from typing import Any, List, Tuple

import lmcache_worker
from lmcache_worker import BLOCK, Server


class Worker057(lmcache_worker.Worker):
    LOCAL_OPS = lmcache_worker.Worker.LOCAL_OPS + ("envelope-store", "envelope-retrieve")

    def __init__(self, footprint: int, run_id: int) -> None:
        super().__init__(footprint, run_id)
        from lmcache.integration.vllm.vllm_multi_process_adapter import get_lmcache_chunk_size
        from lmcache.v1.multiprocess.transfer_context.tensor_wire import (
            decode_tensors,
            encode_tensors,
        )

        self.m.get_lmcache_chunk_size = get_lmcache_chunk_size
        self.m.encode = encode_tensors
        self.m.decode = decode_tensors

    def chunk_size(self, req: Any, timeout: float) -> int:
        return int(self.m.get_lmcache_chunk_size(req, timeout=timeout,
                                                 required_chunk_alignment=BLOCK))

    def key(self, srv: Server, seq: int, request_id: str, worker: bool) -> Any:
        return self.m.Key.from_token_ids(
            model_name="kvpool-bench", world_size=1, worker_id=0 if worker else None,
            token_ids=self.token_ids(seq), start=0, end=self.tokens, request_id=request_id,
            num_kv_readers=1)

    def local(self, op: str, chunk: int, nops: int) -> Tuple[int, List[float]]:
        if op not in ("envelope-store", "envelope-retrieve"):
            return super().local(op, chunk, nops)
        lay = self.layout(chunk)
        g, s = self.m.gather, self.m.scatter
        hints = {"kv_layout": "NHD"}
        lat = []
        clock = time.perf_counter_ns
        total = 0
        for i in range(nops):
            slot = i % lay.nrot
            blob = b""
            if op == "envelope-retrieve":
                blob = self.m.encode([lay.staging[slot]])  # what the server would send
            t0 = clock()
            if op == "envelope-store":
                chunks = g(lay.src, lay.blocks(slot), lay.bic, layout_hints=hints)
                blob = self.m.encode(chunks)
            else:
                st = lay.staging[slot]
                chunks = self.m.decode(blob, expected_shape=st.shape, expected_dtype=st.dtype,
                                       expected_count=1)
                s(lay.dst, lay.blocks(slot), chunks, lay.bic, layout_hints=hints)
            dt = clock() - t0
            total += dt
            lat.append(dt / 1e3)
        return total, lat


if __name__ == "__main__":
    sys.exit(lmcache_worker.main(Worker057))
