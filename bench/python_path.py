#!/usr/bin/python3
"""python_path.py - kvpool-bench's Python worker path: ctx.store() / ctx.retrieve() on numpy
arrays over the shm transport, for comparison with the C path.

It moves the same bytes the same way as the C bench's workers: chunk i of a command reads from
(store) or writes to (retrieve) slot i % (footprint / chunk) of two pre-faulted rotating numpy
buffers of --footprint bytes, so no copy is cache-hot; every store uses a fresh key and must
store its chunk, every retrieve must return it; --verify (the warm-up) compares every retrieved
byte with what was stored. A chunk is a numpy array of the instance's chunk shape (bfloat16 is
raw uint16 in numpy), a view into the rotating buffer.

Two modes:

  python_path.py --socket PATH [--sizes 4M,16M] [--reps 5] [--bytes 256M]
      runs on its own and prints one JSON document: per chunk size and operation, the GB/s
      (1e9 bytes per second) of every repetition and their median.

  python_path.py --socket PATH --serve
      what kvpool-bench runs (bench/python.c), so that its C and Python repetitions interleave.
      Reads one command per line on stdin and answers one line on stdout:
          setup CHUNK                        -> "ok shm" (registers for CHUNK-byte chunks)
          store|retrieve CHUNK NOPS SEQ VERIFY -> "ok NS BYTES LAT_US..." (NS: wall time of
                                                the NOPS operations, LAT_US: one per op)
      The first line it prints is "ready PYTHON_VERSION NUMPY_VERSION LIBRARY"; any failure is
      one line "error MESSAGE", after which it exits.

Run with the interpreter that has numpy (Debian: /usr/bin/python3 with python3-numpy); the
binding comes from PYTHONPATH (the checkout's python/) and libkvpool from KVPOOL_LIB, which
kvpool-bench sets to the library it is linked with.
"""

import argparse
import json
import sys
import time
from typing import Any, Dict, List, Tuple

PY_WORKER = 0x7079  # token 2 of every key: never a C worker's index (0..15)


def pick_layout(nbytes: int, tokens: int) -> Tuple[int, int, str]:
    """[2, layers, tokens, hidden] of bfloat16 (else uint8) with chunks of exactly nbytes,
    preferring 32 layers: the C bench's choice (kvpb_pick_layout)."""
    for dtype, size in (("bfloat16", 2), ("uint8", 1)):
        layers = 32
        while layers >= 1:
            unit = 2 * layers * tokens * size
            if nbytes % unit == 0:
                return layers, nbytes // unit, dtype
            layers //= 2
    raise ValueError("no KV layout has %d-byte chunks of %d tokens" % (nbytes, tokens))


def parse_size(text: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().replace("IB", "").replace("B", "")
    unit = t[-1] if t and t[-1] in "KMG" else ""
    return int(float(t[:len(t) - len(unit)]) * units[unit])


class PythonPath:
    """One client, the rotating buffers, and the instance of the current chunk size."""

    def __init__(self, socket: str, footprint: int, run_id: int) -> None:
        import numpy as np
        import kvpool

        self.np = np
        self.kvpool = kvpool
        self.footprint = footprint
        self.client = kvpool.Client(socket, timeout=60.0)
        self.chunk_tokens = int(self.client.stats()["chunk_tokens"])
        # Distinct bytes everywhere (a misplaced chunk is caught), written piecewise so that no
        # second footprint-sized array is needed; both buffers pre-faulted.
        self.src = np.empty(footprint, dtype=np.uint8)
        self.dst = np.empty(footprint, dtype=np.uint8)
        words = self.src.view(np.uint64)
        step = 1 << 21
        for s in range(0, len(words), step):
            n = min(step, len(words) - s)
            words[s:s + n] = (np.arange(s, s + n, dtype=np.uint64)
                              * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(run_id)
        self.dst.fill(0x5A)
        self.tokens = np.arange(self.chunk_tokens, dtype=np.uint32)
        self.tokens[2] = PY_WORKER
        self.tokens[3] = run_id & 0xFFFFFFFF
        self.ctx: Any = None
        self.chunk = 0
        self.src_views: List[Any] = []
        self.dst_views: List[Any] = []

    def setup(self, chunk: int) -> str:
        if self.ctx is not None:
            self.ctx.unregister()
            self.ctx = None
        layers, hidden, dtype = pick_layout(chunk, self.chunk_tokens)
        self.ctx = self.client.register("bench-python-%d" % chunk, model_name="kvpool-bench",
                                        world_size=1, worker_rank=0, num_layers=layers,
                                        hidden_dim=hidden, dtype=dtype, block_size=16,
                                        transport="shm")
        if self.ctx.chunk_bytes != chunk:
            raise RuntimeError("instance has %d-byte chunks, not %d" % (self.ctx.chunk_bytes,
                                                                        chunk))
        np = self.np
        elem = np.uint16 if self.ctx.dtype_size == 2 else np.uint8
        shape = tuple(self.ctx.chunk_shape)
        nrot = max(1, self.footprint // chunk)
        self.src_views = [self.src[k * chunk:(k + 1) * chunk].view(elem).reshape(shape)
                          for k in range(nrot)]
        self.dst_views = [self.dst[k * chunk:(k + 1) * chunk].view(elem).reshape(shape)
                          for k in range(nrot)]
        self.chunk = chunk
        return str(self.ctx.transport)

    def run(self, op: str, chunk: int, nops: int, seq_base: int,
            verify: bool) -> Tuple[int, int, List[float]]:
        """Runs nops stores or retrieves; returns (wall ns, bytes, latencies in us)."""
        if chunk != self.chunk:
            raise RuntimeError("no instance for %d-byte chunks (setup first)" % chunk)
        ctx, tok, nrot = self.ctx, self.tokens, len(self.src_views)
        lat = []
        clock = time.perf_counter_ns
        start = clock()
        for i in range(nops):
            seq = seq_base + i
            tok[0] = seq & 0xFFFFFFFF
            tok[1] = seq >> 32
            slot = i % nrot
            t0 = clock()
            if op == "store":
                n = ctx.store(tok, [self.src_views[slot]])
            else:
                n = ctx.retrieve(tok, 0, None, out=[self.dst_views[slot]])
            lat.append((clock() - t0) / 1e3)
            if n != 1:
                raise RuntimeError("%s of key %d moved %d chunks, not 1" % (op, seq, n))
            if verify and op == "retrieve" and not self.np.array_equal(self.dst_views[slot],
                                                                       self.src_views[slot]):
                raise RuntimeError("key %d: retrieved bytes differ from the stored ones" % seq)
        return clock() - start, nops * chunk, lat


def serve(p: PythonPath) -> None:
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if f[0] == "setup" and len(f) == 2:
            print("ok", p.setup(int(f[1])), flush=True)
        elif f[0] in ("store", "retrieve") and len(f) == 5:
            ns, nbytes, lat = p.run(f[0], int(f[1]), int(f[2]), int(f[3]), f[4] != "0")
            print("ok %d %d %s" % (ns, nbytes, " ".join("%.2f" % x for x in lat)), flush=True)
        else:
            raise RuntimeError("unknown command %r" % line.strip())


def standalone(p: PythonPath, sizes: List[int], reps: int, nbytes: int) -> Dict[str, Any]:
    results = []
    seq = 1
    for chunk in sizes:
        p.setup(chunk)
        nops = max(1, nbytes // chunk)
        rates: Dict[str, List[float]] = {"store": [], "retrieve": []}
        for rep in range(reps + 1):
            for op in ("store", "retrieve"):
                ns, moved, _ = p.run(op, chunk, nops, seq, rep == 0)
                if rep > 0:
                    rates[op].append(moved / ns)
            seq += nops
        for op, v in rates.items():
            results.append({"op": op, "chunk_bytes": chunk, "ops_per_rep": nops,
                            "gb_per_s": v, "median_gb_per_s": sorted(v)[len(v) // 2]})
    return {"python": sys.version.split()[0], "numpy": p.np.__version__,
            "library": p.kvpool.library_path(), "transport": "shm", "results": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the daemon's Unix socket")
    ap.add_argument("--serve", action="store_true", help="commands on stdin (kvpool-bench)")
    ap.add_argument("--footprint", default="256M", help="bytes of each rotating buffer")
    ap.add_argument("--run-id", type=int, default=0, help="part of every key")
    ap.add_argument("--sizes", default="4M,16M", help="chunk sizes (standalone)")
    ap.add_argument("--reps", type=int, default=5, help="measured repetitions (standalone)")
    ap.add_argument("--bytes", default="256M", help="bytes per repetition (standalone)")
    a = ap.parse_args()
    try:
        p = PythonPath(a.socket, parse_size(a.footprint), a.run_id)
        if a.serve:
            print("ready %s %s %s" % (sys.version.split()[0], p.np.__version__,
                                      p.kvpool.library_path()), flush=True)
            serve(p)
        else:
            doc = standalone(p, [parse_size(s) for s in a.sizes.split(",")], a.reps,
                             parse_size(a.bytes))
            print(json.dumps(doc, indent=1))
    except Exception as e:  # one line for the bench, which prints it and stops
        print("error %s: %s" % (type(e).__name__, " ".join(str(e).split())), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
