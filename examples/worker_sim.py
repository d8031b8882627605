#!/usr/bin/env python3
"""Simulates two inference workers sharing a prompt's KV cache through kvpool.

Worker A "prefills" a prompt: it writes KV for every prompt token into its paged KV cache
(blocks of block_size tokens, scattered over the cache by a block table), then stores the
prompt's full chunks in kvpool straight from the paged cache. Worker B, a fresh process-like
worker with an empty cache and a different block table, looks the prompt up, retrieves the
cached chunks straight into its own pages and checks that its KV equals worker A's, token by
token. Tokens past the last full chunk would be recomputed by B.

Usage:
    examples/worker_sim.py [--socket PATH]              # a running kvpoold
    examples/worker_sim.py --spawn-daemon build/bin/kvpoold
Options: --layout NHD|HND|MLA, --transport auto|shm|inline, --prompt-tokens N, --layers N,
--daemon-log (show the spawned daemon's log).
Runs on any Python 3.8+. The paged caches are numpy arrays when the interpreter has numpy, else
memoryviews over bytearrays (with a one-line note saying so). Exit status 0 on success, 1 on a
mismatch, 2 when it cannot run (no daemon on the socket, no shared memory with --transport shm,
no libkvpool.so, a daemon that does not start): one line on stderr says why.
"""

import argparse
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import kvpool  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None  # type: ignore[assignment]  # optional; the checker sees numpy's module type


class Worker:
    """A worker's CPU paged KV cache with a trivial block allocator. The cache is one numpy
    array per layer, or without numpy a memoryview of the same shape over a bytearray."""

    def __init__(self, args, num_blocks, seed):
        self.args = args
        self.rng = random.Random(seed)
        a = args
        if a.layout == "MLA":
            shape = (num_blocks, a.block_size, a.heads * a.head_dim)
        elif a.layout == "NHD":
            shape = (num_blocks, 2, a.block_size, a.heads, a.head_dim)
        else:
            shape = (num_blocks, 2, a.heads, a.block_size, a.head_dim)
        # bfloat16 has no numpy type: the cache holds raw 16-bit words.
        if np is not None:
            self.np_rng = np.random.default_rng(seed)
            self.layers = [np.zeros(shape, np.uint16) for _ in range(a.layers)]
        else:
            self.raw = [bytearray(2 * math.prod(shape)) for _ in range(a.layers)]
            self.layers = [memoryview(b).cast("H", shape) for b in self.raw]
        self.block_bytes = 2 * math.prod(shape[1:])
        self.cache = kvpool.PagedKVCache(self.layers, a.layout)
        self.free = list(range(num_blocks))
        self.rng.shuffle(self.free)

    def allocate(self, ntokens):
        """A block table for a sequence of ntokens tokens."""
        n = -(-ntokens // self.args.block_size)
        table, self.free = self.free[:n], self.free[n:]
        return np.array(table, dtype=np.int32) if np is not None else array("i", table)

    def prefill(self, table, ntokens):
        """Stands in for the model: writes pseudo-random KV for every prompt token."""
        bs = self.args.block_size
        if np is None:
            # Whole blocks of random words; the rows past ntokens are never compared.
            for raw in self.raw:
                for blk in table:
                    off = blk * self.block_bytes
                    word = self.rng.getrandbits(8 * self.block_bytes)
                    raw[off:off + self.block_bytes] = word.to_bytes(self.block_bytes, "little")
            return
        for layer in self.layers:
            for i, blk in enumerate(table):
                n = min(bs, ntokens - i * bs)
                if self.args.layout == "NHD":      # [blocks, 2, block_size, heads, dim]
                    view = layer[blk, :, :n]
                elif self.args.layout == "HND":    # [blocks, 2, heads, block_size, dim]
                    view = layer[blk, :, :, :n]
                else:                              # [blocks, block_size, latent]
                    view = layer[blk, :n]
                view[...] = self.np_rng.integers(0, 1 << 16, view.shape)

    def register(self, client, name):
        a = self.args
        return client.register(name, model_name="worker-sim-model", world_size=1, worker_rank=0,
                               num_layers=a.layers, hidden_dim=a.heads * a.head_dim,
                               dtype="bfloat16", block_size=a.block_size,
                               use_mla=a.layout == "MLA", transport=a.transport)


def spawn_daemon(binary, show_log):
    tmp = tempfile.mkdtemp(prefix="kvpool-sim-")
    sock = os.path.join(tmp, "s.sock")
    out = None if show_log else subprocess.DEVNULL
    proc = subprocess.Popen([binary, "--socket", sock, "--l1-size", "64MiB", "--chunk-size",
                             "16", "--shm-name", "kvpool_l1_pool_sim_%d" % os.getpid(),
                             "--http", "off"],
                            stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 10
    while True:
        try:
            with kvpool.Client(sock, timeout=1.0) as c:
                c.ping()
            return proc, sock, tmp
        except kvpool.DaemonUnavailable:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                shutil.rmtree(tmp, ignore_errors=True)
                raise CannotRun("%s did not start (run it with --daemon-log to see why)"
                                % binary)
            time.sleep(0.05)


class CannotRun(Exception):
    """The simulation cannot run here; the message says why in one line."""


# What to try next, for the errors a user of this example meets first.
HINTS = (
    (kvpool.DaemonUnavailable, "start kvpoold, or pass --socket PATH or --spawn-daemon KVPOOLD"),
    (kvpool.ShmUnavailable, "the daemon offers no shared memory here: try --transport auto"),
    (kvpool.LibraryError, "build the project, or point $KVPOOL_LIB at libkvpool.so"),
)


def one_line(e):
    """The exception as one line, with a hint where there is one."""
    text = " ".join(str(e).split())
    for cls, hint in HINTS:
        if isinstance(e, cls):
            return "%s (%s)" % (text, hint)
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="kvpoold socket (default: the library's default)")
    p.add_argument("--spawn-daemon", metavar="KVPOOLD", help="start a private kvpoold")
    p.add_argument("--daemon-log", action="store_true", help="show the spawned daemon's log")
    p.add_argument("--layout", default="NHD", choices=["NHD", "HND", "MLA"])
    p.add_argument("--transport", default="auto", choices=["auto", "shm", "inline"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=0,
                   help="default: 3 chunks and a half")
    args = p.parse_args()
    if np is None:
        print("worker_sim: numpy is not installed in %s: using bytearray buffers (numpy arrays "
              "would be used if it were)" % sys.executable)
    if args.layout == "MLA":
        args.heads = 1
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    proc = tmp = None
    sock = args.socket
    try:
        if args.spawn_daemon:
            proc, sock, tmp = spawn_daemon(args.spawn_daemon, args.daemon_log)
        return simulate(args, sock)
    except (kvpool.Error, CannotRun) as e:
        print("worker_sim: %s" % one_line(e), file=sys.stderr)
        return 2
    except OSError as e:  # the daemon binary cannot be started
        print("worker_sim: cannot start %s: %s" % (args.spawn_daemon, e.strerror or e),
              file=sys.stderr)
        return 2
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
            shutil.rmtree(tmp, ignore_errors=True)


def simulate(args, sock):
    # Worker A: prefill and store.
    with kvpool.Client(sock) as client_a:
        a = Worker(args, num_blocks=256, seed=1)
        ctx_a = a.register(client_a, "sim-worker-a-%d" % os.getpid())
        chunk = ctx_a.chunk_size
        ntok = args.prompt_tokens or chunk * 3 + chunk // 2
        rng = random.Random(7)
        prompt = array("I", (rng.randrange(50000) for _ in range(ntok)))
        prompt[0] = os.getpid()  # a new prompt every run: nothing cached yet
        table_a = a.allocate(ntok)
        a.prefill(table_a, ntok)
        t0 = time.perf_counter()
        stored = ctx_a.store_paged(prompt, a.cache, table_a)
        dt = time.perf_counter() - t0
        print("worker A: %d prompt tokens, stored %d chunk(s) of %d tokens (%d bytes each) "
              "over %s in %.2f ms" % (ntok, stored, chunk, ctx_a.chunk_bytes, ctx_a.transport,
                                      dt * 1e3))

        # Worker B: fresh cache, other block table; reuse what A stored.
        with kvpool.Client(sock) as client_b:
            b = Worker(args, num_blocks=300, seed=2)
            ctx_b = b.register(client_b, "sim-worker-b-%d" % os.getpid())
            hits = ctx_b.lookup(prompt)
            table_b = b.allocate(ntok)
            t0 = time.perf_counter()
            got = ctx_b.retrieve_paged(prompt, b.cache, table_b)
            dt = time.perf_counter() - t0
            reused = got * chunk
            print("worker B: lookup %d chunk(s), retrieved %d into its own pages in %.2f ms; "
                  "%d token(s) reused, %d to recompute" % (hits, got, dt * 1e3, reused,
                                                           ntok - reused))

            expected = ntok // chunk
            ok = stored == expected and got == expected
            if reused:
                ka = a.cache.gather(table_a, 0, reused)
                kb = b.cache.gather(table_b, 0, reused)
                ok = ok and (np.array_equal(ka, kb) if np is not None else ka == kb)
    print("worker_sim: %s" % ("OK: worker B's KV equals worker A's" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
