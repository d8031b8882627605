"""lmcache_worker.py - kvpool-bench's LMCache worker: the real LMCache 0.5.6 worker classes
(RequestClientFactory, EngineDrivenTransferContext, gather_paged_kv_to_cpu,
scatter_cpu_to_paged_kv) driven against LMCache multiprocess servers, for the "lmcache"
section (bench/lmcache.c).

Nothing here speaks the protocol itself: every request is made by LMCache's own client, every
copy by LMCache's own gather/scatter, exactly as vLLM's LMCacheMPConnector does on a CPU worker
in engine-driven mode. The servers are `lmcache server` and kvpoold --lmcache; the bench starts
them and names them here ("connect").

One worker process with one paged KV cache per chunk size (a source the stores gather from, a
destination the retrieves scatter into, bfloat16, [2, blocks, 16, heads, head_size] per layer,
32 layers where the chunk size allows), so every server sees the same worker and the same bytes.
Chunk i of a command uses the blocks of slot i % (footprint / chunk) of the caches, so no copy
is cache-hot. Every store uses fresh token ids (from SEQ) and must store its chunk; every
retrieve must find it (after a lookup by the scheduler client, untimed, as vLLM does before
it schedules a retrieve); VERIFY (the warm-up) compares every retrieved byte.

Runs under the LMCache virtual environment's python (scripts/lmcache-env.sh). Reads one
command per line on stdin, answers one line on stdout:

    connect NAME URL                  -> "ok CHUNK_TOKENS" (waits up to 60 s for the server)
    setup NAME CHUNK                  -> "ok shm|pickle|envelope" (registers a fresh instance
                                         on NAME for CHUNK-byte chunks; the transport LMCache
                                         chose: envelope is 0.5.7's, lmcache_worker057.py),
                                         "ok shm-refused|pickle-refused" when a probe chunk
                                         could not be stored and retrieved
    store NAME CHUNK NOPS SEQ VERIFY  -> "ok NS BYTES LAT_US..." (NS: wall time of the NOPS
    retrieve NAME CHUNK NOPS SEQ VERIFY  timed operations; LAT_US: one per operation)
    gather CHUNK NOPS                 -> the same: the worker's own copy, paged -> contiguous
    scatter CHUNK NOPS                   (and back), into pre-faulted tensors, no server
    copy CHUNK NOPS                   -> the same: torch copy_ of contiguous chunk tensors
    pickle-store CHUNK NOPS           -> the same: gather into fresh tensors + pickle.dumps,
                                         what a pickle-mode worker does before it sends
    pickle-retrieve CHUNK NOPS        -> the same: pickle.loads + scatter, what it does after
                                         it receives (the blob is made untimed before)
    rtt NAME chunk-size|ping COUNT    -> "ok NS 0 LAT_US..." (get_chunk_size, ping(iid))
    clear NAME                        -> "ok" (LMCache's clear(force=False), from the scheduler's
                                         client: frees every stored chunk)
    close NAME                        -> "ok" (unregisters, closes the client)

The first line it prints is "ready PYTHON LMCACHE TORCH"; any failure is one line
"error MESSAGE", after which it exits.
"""

import os
import pickle
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

TIMEOUT = 60.0
BLOCK = 16  # tokens per paged block, vLLM's default
LAYERS = 32


def pick_layout(nbytes: int, tokens: int) -> Tuple[int, int]:
    """(layers, hidden) of a bfloat16 [2, layers, tokens, hidden] chunk of exactly nbytes,
    preferring 32 layers (kvpool-bench's choice, kvpb_pick_layout)."""
    layers = LAYERS
    while layers >= 1:
        unit = 2 * layers * tokens * 2
        if nbytes % unit == 0 and nbytes // unit >= 1:
            return layers, nbytes // unit
        layers //= 2
    raise ValueError("no bfloat16 KV layout has %d-byte chunks of %d tokens" % (nbytes, tokens))


def heads_of(hidden: int) -> Tuple[int, int]:
    """(heads, head_size) with head_size 128 where possible, as most models have."""
    for hs in (128, 64, 32, 16, 8, 4, 2, 1):
        if hidden % hs == 0:
            return hidden // hs, hs
    return hidden, 1


class Layout:
    """The paged KV caches of one chunk size, shared by every server."""

    def __init__(self, torch: Any, chunk: int, tokens: int, footprint: int, seed: int) -> None:
        self.torch = torch
        self.chunk = chunk
        self.layers, self.hidden = pick_layout(chunk, tokens)
        heads, hs = heads_of(self.hidden)
        self.bic = tokens // BLOCK
        self.nrot = max(2, footprint // chunk)
        blocks = self.nrot * self.bic
        gen = torch.Generator().manual_seed(seed)
        shape = (2, blocks, BLOCK, heads, hs)
        # Random bytes (a misplaced chunk is caught); both caches pre-faulted.
        self.src = {}
        self.dst = {}
        for i in range(self.layers):
            t = torch.empty(shape, dtype=torch.bfloat16)
            t.view(torch.int16).random_(-32768, 32767, generator=gen)
            self.src["layers.%d.attn" % i] = t
            self.dst["layers.%d.attn" % i] = torch.full(shape, 0.5, dtype=torch.bfloat16)
        # Contiguous chunk tensors for the worker's own copies (the limits).
        cshape = (2, self.layers, tokens, self.hidden)
        self.staging = [torch.zeros(cshape, dtype=torch.bfloat16) for _ in range(self.nrot)]

    def blocks(self, slot: int) -> List[int]:
        return list(range(slot * self.bic, (slot + 1) * self.bic))

    def same(self, slot: int) -> bool:
        b = slice(slot * self.bic, (slot + 1) * self.bic)
        # Bitwise: random bfloat16 bits include NaNs, which never compare equal.
        i16 = self.torch.int16
        return all(bool((self.src[k][:, b].view(i16) == self.dst[k][:, b].view(i16)).all())
                   for k in self.src)

    def spoil(self, slot: int) -> None:
        b = slice(slot * self.bic, (slot + 1) * self.bic)
        for t in self.dst.values():
            t[:, b].fill_(0.5)


class Server:
    """One server: the worker's request client, a scheduler's client, the current instance."""

    def __init__(self, w: "Worker", name: str, url: str) -> None:
        self.w = w
        self.name = name
        self.url = url
        deadline = time.monotonic() + TIMEOUT
        while True:
            self.req = w.client(url)
            try:
                self.tokens = w.chunk_size(self.req, 2.0)
                break
            except Exception:
                self.req.close()
                if time.monotonic() > deadline:
                    raise RuntimeError("%s at %s did not answer get_chunk_size" % (name, url))
                time.sleep(0.2)
        exp = self.req.get_experimental().result(timeout=TIMEOUT)
        if not isinstance(exp, list):
            raise RuntimeError("%s: get_experimental answered %r" % (name, exp))
        self.sched = w.client(url)  # the scheduler's client (lookups), as in vLLM
        self.tc: Any = None
        self.iid = 0
        self.layout: Optional[Layout] = None

    def setup(self, layout: Layout) -> str:
        self.unregister()
        m = self.w.m
        self.iid = uuid.uuid4().int & ((1 << 63) - 1)
        self.tc = m.EngineDrivenTransferContext(self.iid, self.req)
        self.tc.register(layout.src, "kvpool-bench", 1, layout.bic, TIMEOUT,
                         layout_hints={"kv_layout": "NHD"})
        self.layout = layout
        kind = type(self.tc.engine_driven_context).__name__
        # EngineDrivenContextShm, ...Pickle (up to 0.5.6), ...Inline (the tensor envelope, 0.5.7).
        for suffix, name in (("Shm", "shm"), ("Pickle", "pickle"), ("Inline", "envelope")):
            if kind.endswith(suffix):
                return name
        return kind

    def unregister(self) -> None:
        if self.tc is not None:
            self.tc.unregister().result(timeout=TIMEOUT)
            self.tc.close()
            self.tc = None

    def close(self) -> None:
        self.unregister()
        self.req.close()
        self.sched.close()


class Worker:
    # The worker's own copies of the same bytes ("local" commands).
    LOCAL_OPS = ("gather", "scatter", "copy", "pickle-store", "pickle-retrieve")

    def __init__(self, footprint: int, run_id: int) -> None:
        import torch
        import zmq
        import lmcache
        from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
        from lmcache.v1.multiprocess.transfer_context import base as tc_base
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
            EngineDrivenTransferContext,
        )
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        torch.set_num_threads(1)  # one worker thread, as the C bench's workers
        self.torch = torch
        self.zmq = zmq
        self.lmcache = lmcache

        class M:
            pass

        self.m = M()
        self.m.Key = IPCCacheServerKey
        self.m.EngineDrivenTransferContext = EngineDrivenTransferContext
        self.m.gather = tc_base.gather_paged_kv_to_cpu
        self.m.scatter = tc_base.scatter_cpu_to_paged_kv
        self.m.factory = RequestClientFactory
        self.footprint = footprint
        self.run_id = run_id & 0x3FFFFFFF
        self.servers: Dict[str, Server] = {}
        self.layouts: Dict[int, Layout] = {}
        self.tokens = 0
        self.probes = 0

    def chunk_size(self, req: Any, timeout: float) -> int:
        """The server's chunk size, asked as this release's worker asks it."""
        return int(req.get_chunk_size().result(timeout=timeout))

    def client(self, url: str) -> Any:
        return self.m.factory.create(url, context=self.zmq.Context.instance())

    def layout(self, chunk: int) -> Layout:
        if chunk not in self.layouts:
            # One size at a time: the caches of the previous size are freed first.
            self.layouts.clear()
            self.layouts[chunk] = Layout(self.torch, chunk, self.tokens, self.footprint,
                                         self.run_id ^ chunk)
        return self.layouts[chunk]

    def token_ids(self, seq: int) -> Tuple[int, ...]:
        """A chunk of token ids unique to (run, seq): LMCache hashes them into the key."""
        head = (seq & 0x3FFFFFFF, seq >> 30, self.run_id, 7)
        return head + tuple(range(8, 8 + self.tokens - len(head)))

    def key(self, srv: Server, seq: int, request_id: str, worker: bool) -> Any:
        return self.m.Key(model_name="kvpool-bench", world_size=1,
                          worker_id=0 if worker else None, token_ids=self.token_ids(seq),
                          start=0, end=self.tokens, request_id=request_id, num_kv_readers=1)

    # ---- commands

    def connect(self, name: str, url: str) -> str:
        srv = Server(self, name, url)
        if self.tokens and srv.tokens != self.tokens:
            raise RuntimeError("%s has %d-token chunks, the other server %d"
                               % (name, srv.tokens, self.tokens))
        self.tokens = srv.tokens
        self.servers[name] = srv
        return str(srv.tokens)

    def setup(self, name: str, chunk: int) -> str:
        """Registers, then stores and retrieves one probe chunk: a server that takes the
        registration but not the transport (a pickle commit refused) answers "...-refused"."""
        srv = self.servers[name]
        kind = srv.setup(self.layout(chunk))
        self.probes += 1
        seq = (1 << 40) + self.probes
        try:
            self.transfer("store", name, chunk, 1, seq, False)
            self.transfer("retrieve", name, chunk, 1, seq, True)
        except Exception as e:  # refused, or no answer within the timeout
            sys.stderr.write("probe of %s failed: %s\n" % (name, e))
            return kind + "-refused"
        return kind

    def transfer(self, op: str, name: str, chunk: int, nops: int, seq: int,
                 verify: bool) -> Tuple[int, List[float]]:
        srv = self.servers[name]
        lay = srv.layout
        if lay is None or lay.chunk != chunk or srv.tc is None:
            raise RuntimeError("%s: no instance for %d-byte chunks (setup first)" % (name, chunk))
        lat = []
        clock = time.perf_counter_ns
        bic = lay.bic
        if op == "store":
            start = clock()
            for i in range(nops):
                key = self.key(srv, seq + i, "s%d" % (seq + i), True)
                t0 = clock()
                ok = srv.tc.submit_store(key.request_id, key, lay.src, [lay.blocks(i % lay.nrot)],
                                         None, bic).result(timeout=TIMEOUT)
                lat.append((clock() - t0) / 1e3)
                if ok is not True:
                    raise RuntimeError("%s: store of key %d answered %r" % (name, seq + i, ok))
            return clock() - start, lat
        # Retrieve: the scheduler looks every chunk up first (untimed), as vLLM does before it
        # schedules the load; LMCache's server reads only what a lookup locked.
        for i in range(nops):
            rid = "r%d" % (seq + i)
            srv.sched.lookup(self.key(srv, seq + i, rid, False), 1).result(timeout=TIMEOUT)
            hits = srv.sched.wait_prefetch_status(rid, TIMEOUT).result(timeout=TIMEOUT + 5)
            if hits != 1:
                raise RuntimeError("%s: lookup of key %d found %r chunks, not 1"
                                   % (name, seq + i, hits))
            if verify:
                lay.spoil(i % lay.nrot)
        start = clock()
        for i in range(nops):
            key = self.key(srv, seq + i, "r%d" % (seq + i), True)
            t0 = clock()
            ok = srv.tc.submit_retrieve(key.request_id, key, lay.dst, [lay.blocks(i % lay.nrot)],
                                        None, bic).result(timeout=TIMEOUT)
            lat.append((clock() - t0) / 1e3)
            if ok is not True:
                raise RuntimeError("%s: retrieve of key %d answered %r" % (name, seq + i, ok))
            if verify and not lay.same(i % lay.nrot):
                raise RuntimeError("%s: key %d: retrieved bytes differ from the stored ones"
                                   % (name, seq + i))
        ns = clock() - start
        for i in range(nops):
            srv.sched.end_session("r%d" % (seq + i)).result(timeout=TIMEOUT)
        return ns, lat

    def local(self, op: str, chunk: int, nops: int) -> Tuple[int, List[float]]:
        """The worker's own copies of the same bytes, no server."""
        lay = self.layout(chunk)
        g, s = self.m.gather, self.m.scatter
        hints = {"kv_layout": "NHD"}
        lat = []
        clock = time.perf_counter_ns
        total = 0
        for i in range(nops):
            slot = i % lay.nrot
            blob = b""
            if op == "pickle-retrieve":
                blob = pickle.dumps([lay.staging[slot]])  # what the server would send
            t0 = clock()
            if op == "gather":
                g(lay.src, lay.blocks(slot), lay.bic, layout_hints=hints,
                  out=[lay.staging[slot]])
            elif op == "scatter":
                s(lay.dst, lay.blocks(slot), [lay.staging[slot]], lay.bic, layout_hints=hints)
            elif op == "copy":
                lay.staging[slot].copy_(lay.staging[(slot + lay.nrot // 2) % lay.nrot])
            elif op == "pickle-store":
                chunks = g(lay.src, lay.blocks(slot), lay.bic, layout_hints=hints)
                blob = pickle.dumps(chunks)
            elif op == "pickle-retrieve":
                chunks = pickle.loads(blob)
                s(lay.dst, lay.blocks(slot), chunks, lay.bic, layout_hints=hints)
            else:
                raise RuntimeError("unknown local operation %r" % op)
            dt = clock() - t0
            total += dt
            lat.append(dt / 1e3)
        return total, lat

    def rtt(self, name: str, what: str, count: int) -> Tuple[int, List[float]]:
        srv = self.servers[name]
        lat = []
        clock = time.perf_counter_ns
        start = clock()
        for _ in range(count):
            t0 = clock()
            if what == "chunk-size":
                v = srv.req.get_chunk_size().result(timeout=TIMEOUT)
                ok = v == srv.tokens
            elif what == "ping":
                ok = srv.req.ping(srv.iid or None).result(timeout=TIMEOUT) is True
            else:
                raise RuntimeError("unknown round trip %r" % what)
            lat.append((clock() - t0) / 1e3)
            if not ok:
                raise RuntimeError("%s: %s answered wrongly" % (name, what))
        return clock() - start, lat


def answer(ns: int, nbytes: int, lat: List[float]) -> str:
    return "ok %d %d %s" % (ns, nbytes, " ".join("%.2f" % x for x in lat))


def serve(w: Worker) -> None:
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        cmd = f[0]
        if cmd == "connect" and len(f) == 3:
            print("ok", w.connect(f[1], f[2]), flush=True)
        elif cmd == "setup" and len(f) == 3:
            print("ok", w.setup(f[1], int(f[2])), flush=True)
        elif cmd in ("store", "retrieve") and len(f) == 6:
            chunk, nops = int(f[2]), int(f[3])
            ns, lat = w.transfer(cmd, f[1], chunk, nops, int(f[4]), f[5] != "0")
            print(answer(ns, chunk * nops, lat), flush=True)
        elif cmd in w.LOCAL_OPS and len(f) == 3:
            chunk, nops = int(f[1]), int(f[2])
            ns, lat = w.local(cmd, chunk, nops)
            print(answer(ns, chunk * nops, lat), flush=True)
        elif cmd == "rtt" and len(f) == 4:
            ns, lat = w.rtt(f[1], f[2], int(f[3]))
            print(answer(ns, 0, lat), flush=True)
        elif cmd == "clear" and len(f) == 2:
            w.servers[f[1]].sched.clear(False).result(timeout=TIMEOUT)
            print("ok", flush=True)
        elif cmd == "close" and len(f) == 2:
            w.servers.pop(f[1]).close()
            print("ok", flush=True)
        else:
            raise RuntimeError("unknown command %r" % line.strip())


def main(cls: Any = None) -> int:
    """Serves the bench with a Worker of class cls (Worker: this release's)."""
    footprint = int(os.environ.get("KVPB_FOOTPRINT", str(256 << 20)))
    run_id = int(os.environ.get("KVPB_RUN_ID", "0"))
    try:
        w = (cls or Worker)(footprint, run_id)
        print("ready %s %s %s" % (sys.version.split()[0],
                                  getattr(w.lmcache, "__version__", "?"),
                                  w.torch.__version__), flush=True)
        serve(w)
        for srv in list(w.servers.values()):
            srv.close()
    except Exception as e:  # one line for the bench, which prints it and stops
        import traceback

        traceback.print_exc()
        print("error %s: %s" % (type(e).__name__, " ".join(str(e).split())), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
