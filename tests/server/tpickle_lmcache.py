"""kvpoold's pickle-transport codec (src/server/lmc/torch_pickle.c) against the real torch.

Run by ctest (label lmcache) with the python of an LMCache virtual environment
(scripts/lmcache-env.sh; KVP_LMCACHE_VENV_DIR in CMake):

    python tpickle_lmcache.py TPICKLE_TOOL

1. Payloads made now by this torch, through LMCache's own worker class where it can be driven
   without a server (EngineDrivenContextPickle.commit_store, with a request client that keeps the
   bytes), decode in C to exactly the tensors' bytes: every dtype LMCache registers, [2, L, T, H]
   and MLA [L, T, H] chunks, protocols 4 and 5, single chunks, more than 1000 chunks (several
   APPENDS batches), chunks above 64 KiB (data outside frames).
2. Hostile payloads are refused, and nothing they name ever runs: the marker file their command
   would create never appears, while unpickling one of them in a child process does create it
   (so the payloads are live).
3. The C encoder's output, loaded by pickle.loads and by LMCache's worker
   (EngineDrivenContextPickle.prepare_retrieve), gives tensors equal in dtype, shape and bytes to
   the chunks it was given: contiguous, storage offset 0, no grad, on the CPU.
"""

import os
import pickle
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpickle_payloads as tp  # noqa: E402

TOOL = sys.argv[1]
failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def raw(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def run_tool(*args):
    p = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


class KeepingClient:
    """A request client for EngineDrivenContextPickle: keeps what it sends, answers retrieves."""

    class Done:
        def __init__(self, value):
            self.value = value

        def result(self, timeout=None):
            return self.value

    def __init__(self, retrieve_data=b""):
        self.sent = None
        self.retrieve_data = retrieve_data

    def commit_store(self, key, instance_id, data):
        self.sent = data
        return self.Done(True)

    def prepare_retrieve(self, key, instance_id):
        from lmcache.v1.multiprocess.custom_types import PrepareRetrieveResponse
        return self.Done(PrepareRetrieveResponse(success=True, data=self.retrieve_data,
                                                 context={}))

    def commit_retrieve(self, key, instance_id):
        return self.Done(True)


def worker_context(client):
    try:
        from lmcache.v1.multiprocess.transfer_context.pickle import EngineDrivenContextPickle
    except ImportError as e:  # the virtual environment always has it; say so if not
        print("lmcache not importable:", e, file=sys.stderr)
        sys.exit(1)
    return EngineDrivenContextPickle(None, client, 1.0)


def worker_bytes(chunks):
    """What LMCache's worker sends with commit_store for these chunks."""
    client = KeepingClient()
    check(worker_context(client).commit_store(None, 0, chunks), "commit_store returned false")
    check(client.sent == pickle.dumps(chunks), "worker bytes differ from pickle.dumps")
    return client.sent


def decode_case(tmp, label, data, dtype, shape, chunks):
    src = os.path.join(tmp, "in.pkl")
    dst = os.path.join(tmp, "out.bin")
    with open(src, "wb") as f:
        f.write(data)
    rc, out, err = run_tool("decode", src, dst, dtype, len(chunks), len(chunks), *shape)
    check(rc == 0 and out == "ok %d" % len(chunks),
          "%s: decode rc %d %s %s" % (label, rc, out, err))
    if rc == 0:
        with open(dst, "rb") as f:
            got = f.read()
        check(got == b"".join(raw(c) for c in chunks), "%s: decoded bytes differ" % label)


def part_decode(tmp):
    shapes = [(2, 3, 5, 8), (3, 5, 8), (2, 1, 16, 64)]
    for dt in tp.DTYPES:
        for shape in shapes:
            for proto in (4, 5):
                for count in (1, 3):
                    chunks = tp.make_chunks(dt, shape, count)
                    data = pickle.dumps(chunks, protocol=proto)
                    decode_case(tmp, "%s %s p%d n%d" % (dt, shape, proto, count), data, dt,
                                shape, chunks)
        # The worker's own bytes (its default protocol).
        chunks = tp.make_chunks(dt, (2, 2, 16, 8), 2)
        decode_case(tmp, "%s via worker" % dt, worker_bytes(chunks), dt, (2, 2, 16, 8), chunks)
    # Chunks from torch.empty, filled in place, as the worker's gather makes them.
    chunks = [torch.empty((2, 4, 16, 32), dtype=torch.bfloat16).copy_(c)
              for c in tp.make_chunks("bfloat16", (2, 4, 16, 32), 2)]
    decode_case(tmp, "empty+copy_", worker_bytes(chunks), "bfloat16", (2, 4, 16, 32), chunks)
    # More than one APPENDS batch (pickle batches 1000 items), with a single APPEND after it.
    for count in (1001, 2500):
        chunks = tp.make_chunks("float16", (2, 1, 1, 2), count)
        decode_case(tmp, "%d chunks" % count, worker_bytes(chunks), "float16", (2, 1, 1, 2),
                    chunks)
    # Chunks above 64 KiB: their bytes sit outside pickle frames.
    for proto in (4, 5):
        chunks = tp.make_chunks("float16", (2, 2, 64, 1024), 3)
        decode_case(tmp, "512 KiB chunks p%d" % proto, pickle.dumps(chunks, protocol=proto),
                    "float16", (2, 2, 64, 1024), chunks)


def part_hostile(tmp):
    marker = os.path.join(tmp, "executed")
    src = os.path.join(tmp, "hostile.pkl")
    dst = os.path.join(tmp, "out.bin")
    payloads = tp.hostile_payloads(marker)
    for proto in (4, 5):
        # The classic reductions again with protocol 5 and with a blob inside a real tensor.
        payloads["os_system_p%d" % proto] = pickle.dumps(
            [tp.Reduce(os.system, ("touch " + marker,))], protocol=proto)
    for name, data in sorted(payloads.items()):
        with open(src, "wb") as f:
            f.write(data)
        rc, out, err = run_tool("decode", src, dst, "float16", 0, 4, 2, 2, 4, 8)
        check(rc == 1 and out.startswith("refused: "), "%s: rc %d %s %s" % (name, rc, out, err))
        # Truncated and padded variants are refused as well.
        for variant in (data[: len(data) // 2], data + b"."):
            with open(src, "wb") as f:
                f.write(variant)
            rc, out, err = run_tool("decode", src, dst, "float16", 0, 4, 2, 2, 4, 8)
            check(rc == 1, "%s variant: rc %d %s" % (name, rc, out))
    check(not os.path.exists(marker), "a hostile payload ran: %s exists" % marker)

    # The payloads are live: the real unpickler runs them (in a child, with its own marker).
    live = os.path.join(tmp, "live")
    child = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=pickle.dumps([tp.Reduce(os.system, ("touch " + live,))], protocol=4),
        capture_output=True, timeout=120)
    check(child.returncode == 0 and os.path.exists(live), "the control payload did not run")
    check(not os.path.exists(marker), "marker appeared")


def part_encode(tmp):
    src = os.path.join(tmp, "chunks.bin")
    dst = os.path.join(tmp, "reply.pkl")
    shapes = [(2, 3, 5, 8), (3, 5, 8), (2, 1, 300, 2), (1, 70000)]
    gen = torch.Generator().manual_seed(7)
    for dt, dtype in tp.DTYPES.items():
        for shape in shapes:
            for count in (0, 1, 3):
                itemsize = torch.empty((), dtype=dtype).element_size()
                numel = 1
                for d in shape:
                    numel *= d
                blob = torch.randint(0, 256, (count * numel * itemsize,), dtype=torch.uint8,
                                     generator=gen).numpy().tobytes()
                with open(src, "wb") as f:
                    f.write(blob)
                label = "encode %s %s n%d" % (dt, shape, count)
                rc, out, err = run_tool("encode", src, dst, dt, count, *shape)
                check(rc == 0, "%s: rc %d %s" % (label, rc, err))
                if rc != 0:
                    continue
                with open(dst, "rb") as f:
                    data = f.read()
                loaded = pickle.loads(data)
                via_worker = worker_context(KeepingClient(data)).prepare_retrieve(None, 0)
                for got, how in ((loaded, "pickle.loads"), (via_worker, "worker")):
                    check(isinstance(got, list) and len(got) == count,
                          "%s %s: %r" % (label, how, type(got)))
                    for i, t in enumerate(got):
                        chunk = blob[i * numel * itemsize:(i + 1) * numel * itemsize]
                        ok = (type(t) is torch.Tensor and t.dtype == dtype
                              and tuple(t.shape) == shape and t.is_contiguous()
                              and t.storage_offset() == 0 and not t.requires_grad
                              and t.device.type == "cpu"
                              and t.untyped_storage().nbytes() == len(chunk)
                              and raw(t) == chunk)
                        check(ok, "%s %s: tensor %d differs" % (label, how, i))


def note_float8_roundtrip():
    """Whether this torch loads its own float8 pickles (torch 2.13.0 does not: its legacy loader
    reads UntypedStorage.dtype, which does not exist). kvpoold's encoder avoids the path."""
    t = torch.zeros((2, 2), dtype=torch.float8_e4m3fn)
    try:
        pickle.loads(pickle.dumps([t]))
        print("note: torch %s loads its own float8 pickles" % torch.__version__)
    except AttributeError as e:
        print("note: torch %s cannot load its own float8 pickles (%s)" % (torch.__version__, e))


def main():
    note_float8_roundtrip()
    with tempfile.TemporaryDirectory(prefix="kvp-tpickle-") as tmp:
        part_decode(tmp)
        part_hostile(tmp)
        part_encode(tmp)
    print("torch %s: %d checks, %d failed" % (torch.__version__, checks, len(failures)))
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
