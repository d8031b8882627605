"""kvpoold's TensorEnvelope codec (src/server/lmc/envelope.c) against the real LMCache 0.5.7.

Run by ctest (label lmcache) with the python of the LMCache 0.5.7 virtual environment
(scripts/lmcache-env.sh; KVP_LMCACHE_VENV_DIR in CMake):

    python envelope_lmcache.py ENVELOPE_TOOL

1. Envelopes made now by LMCache's own code (tensor_wire.encode_tensors, and the worker's
   EngineDrivenContextInline.commit_store with a request client that keeps the bytes) decode in
   C to exactly the tensors' bytes: every dtype kvpool registers, [2, L, T, H] and MLA [L, T, H]
   chunks, 0 to more than 1000 chunks, chunks of more than 64 KiB.
2. The C encoder writes byte for byte what encode_tensors() writes for the same chunks, and
   LMCache's decode_tensors() and the worker's EngineDrivenContextInline.prepare_retrieve load it
   into tensors equal in dtype, shape and bytes.
3. Envelopes LMCache's decoder refuses (another version, an unknown field, a grouped envelope,
   another dtype or shape, a wrong byte count, a tensor too many) are refused by the C decoder
   too; and one LMCache accepts that kvpool refuses on purpose (a field twice) is named.
"""

import os
import subprocess
import sys
import tempfile

import msgspec
import torch

from lmcache.v1.distributed.api import MemoryLayoutDesc
from lmcache.v1.multiprocess.transfer_context import tensor_wire
from lmcache.v1.multiprocess.transfer_context.base import EngineDrivenContextMetadata
from lmcache.v1.multiprocess.transfer_context.inline import EngineDrivenContextInline

TOOL = sys.argv[1]
failures = []
checks = 0

# kvpool's dtype table (src/common/layout.c), as torch names them.
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


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


def random_chunks(dtype, shape, count, gen):
    numel = 1
    for d in shape:
        numel *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    blob = torch.randint(0, 256, (count * numel * itemsize,), dtype=torch.uint8, generator=gen)
    return [blob[i * numel * itemsize:(i + 1) * numel * itemsize].view(dtype).view(shape)
            for i in range(count)]


class KeepingClient:
    """A request client for EngineDrivenContextInline: keeps what it sends, answers retrieves."""

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


def inline_context(client, dtype, shape):
    meta = EngineDrivenContextMetadata(
        layout_desc=MemoryLayoutDesc(shapes=[torch.Size(shape)], dtypes=[dtype]),
        block_size=16, use_mla=len(shape) == 3)
    return EngineDrivenContextInline(meta, client, 10.0)


def decode_in_c(tmp, data, dt, shape, lo, hi):
    src, dst = os.path.join(tmp, "in"), os.path.join(tmp, "out")
    with open(src, "wb") as f:
        f.write(data)
    rc, out, err = run_tool("decode", src, dst, dt, lo, hi, *shape)
    got = None
    if rc == 0:
        with open(dst, "rb") as f:
            got = f.read()
    return rc, out, err, got


SHAPES = [(2, 3, 5, 8), (3, 5, 8), (2, 1, 300, 2), (1, 70000)]


def part_decode(tmp):
    gen = torch.Generator().manual_seed(5)
    for dt, dtype in DTYPES.items():
        for shape in SHAPES:
            for count in (0, 1, 3):
                chunks = random_chunks(dtype, shape, count, gen)
                label = "decode %s %s n%d" % (dt, shape, count)
                data = tensor_wire.encode_tensors(chunks)
                rc, out, err, got = decode_in_c(tmp, data, dt, shape, count, count)
                check(rc == 0 and out == "ok %d" % count, "%s: rc %d %s %s" % (label, rc, out,
                                                                               err))
                check(got == b"".join(raw(t) for t in chunks), label + ": bytes differ")
    # Through the worker's own inline context, and many chunks in one envelope.
    for dt, shape, count in (("bfloat16", (2, 2, 16, 64), 4), ("float16", (2, 16, 8), 1200)):
        dtype = DTYPES[dt]
        chunks = random_chunks(dtype, shape, count, gen)
        client = KeepingClient()
        ok = inline_context(client, dtype, shape).commit_store(None, 0, chunks)
        check(ok and client.sent is not None, "worker commit_store sent nothing")
        rc, out, err, got = decode_in_c(tmp, client.sent, dt, shape, count, count)
        check(rc == 0 and got == b"".join(raw(t) for t in chunks),
              "worker envelope %s %s n%d: rc %d %s %s" % (dt, shape, count, rc, out, err))


def part_encode(tmp):
    gen = torch.Generator().manual_seed(9)
    src, dst = os.path.join(tmp, "chunks"), os.path.join(tmp, "env")
    for dt, dtype in DTYPES.items():
        for shape in SHAPES:
            for count in (0, 1, 3):
                chunks = random_chunks(dtype, shape, count, gen)
                with open(src, "wb") as f:
                    f.write(b"".join(raw(t) for t in chunks))
                label = "encode %s %s n%d" % (dt, shape, count)
                rc, out, err = run_tool("encode", src, dst, dt, count, *shape)
                check(rc == 0, "%s: rc %d %s" % (label, rc, err))
                if rc != 0:
                    continue
                with open(dst, "rb") as f:
                    data = f.read()
                check(data == tensor_wire.encode_tensors(chunks),
                      label + ": not encode_tensors()'s bytes")
                loaded = tensor_wire.decode_tensors(data, expected_shape=torch.Size(shape),
                                                    expected_dtype=dtype, expected_count=count)
                via_worker = (inline_context(KeepingClient(data), dtype, shape)
                              .prepare_retrieve(None, 0, count) if count else [])
                for got, how in ((loaded, "decode_tensors"), (via_worker, "worker")):
                    check(isinstance(got, list) and len(got) == count,
                          "%s %s: %r" % (label, how, type(got)))
                    for i, t in enumerate(got):
                        ok = (t.dtype == dtype and tuple(t.shape) == shape
                              and t.device.type == "cpu" and raw(t) == raw(chunks[i]))
                        check(ok, "%s %s: tensor %d differs" % (label, how, i))


def hostile(shape, dtype, count):
    """Envelopes that are wrong in one way each, made with msgspec as a worker would."""
    good = random_chunks(dtype, shape, count, torch.Generator().manual_seed(3))
    frames = [{"dtype": str(dtype).removeprefix("torch."), "shape": list(shape),
               "data": raw(t)} for t in good]

    def env(**top):
        d = {"version": 1, "tensors": frames}
        d.update(top)
        return msgspec.msgpack.encode(d)

    other = torch.float32 if dtype != torch.float32 else torch.float16
    yield "version 2", env(version=2)
    yield "version true", env(version=True)
    yield "unknown top field", env(extra=None)
    yield "grouped envelope", tensor_wire.encode_grouped_tensors([(list(range(count)), good)])
    yield "unknown tensor field", env(tensors=[dict(f, stride=[1]) for f in frames])
    yield "another dtype", tensor_wire.encode_tensors([t.to(other) for t in good])
    yield "another shape", tensor_wire.encode_tensors([t.reshape(-1) for t in good])
    yield "declared shape beyond the data", env(
        tensors=[dict(f, shape=[d * 2 for d in shape]) for f in frames])
    yield "data one byte short", env(tensors=[dict(f, data=f["data"][:-1]) for f in frames])
    yield "a tensor too many", tensor_wire.encode_tensors(good + good[:1])
    yield "rank 17", env(tensors=[dict(f, shape=[1] * 17) for f in frames])
    yield "negative dimension", env(tensors=[dict(f, shape=[-1] + list(shape[1:]))
                                             for f in frames])
    yield "trailing byte", tensor_wire.encode_tensors(good) + b"\xc0"


def part_hostile(tmp):
    shape, dt, count = (2, 2, 4, 8), "float16", 2
    dtype = DTYPES[dt]
    for what, data in hostile(shape, dtype, count):
        try:
            tensor_wire.decode_tensors(data, expected_shape=torch.Size(shape),
                                       expected_dtype=dtype, expected_count=count)
            lmcache_refuses = False
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
            lmcache_refuses = True
        check(lmcache_refuses, "LMCache accepts the hostile envelope: " + what)
        rc, out, err, _ = decode_in_c(tmp, data, dt, shape, count, count)
        check(rc == 1 and out.startswith("refused: "),
              "%s: rc %d %r %r" % (what, rc, out, err))
        print("refused as LMCache does: %s (%s)" % (what, out[len("refused: "):]))
    # A field twice: msgspec keeps the last one, kvpoold refuses the envelope.
    good = tensor_wire.encode_tensors(random_chunks(dtype, shape, count,
                                                    torch.Generator().manual_seed(4)))
    twice = b"\x83\xa7version\x01" + good[1:]
    rc, out, _, _ = decode_in_c(tmp, twice, dt, shape, count, count)
    check(rc == 1 and "more than two fields" in out, "a field twice: %r" % out)


def main():
    with tempfile.TemporaryDirectory(prefix="kvp-envelope-") as tmp:
        part_decode(tmp)
        part_encode(tmp)
        part_hostile(tmp)
    import lmcache
    print("lmcache %s, torch %s: %d checks, %d failed" % (lmcache.__version__, torch.__version__,
                                                          checks, len(failures)))
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
