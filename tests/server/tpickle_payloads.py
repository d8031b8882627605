"""Real LMCache pickle-transport payloads, made by the real torch.

What an LMCache worker in pickle mode sends with commit_store is ``pickle.dumps(chunks)``:
a list of contiguous CPU tensors, one per chunk (lmcache/v1/multiprocess/transfer_context/
pickle.py). This module makes such lists with a byte pattern the C side can check, and
writes them with the protocol a worker uses (4 on CPython 3.8-3.13, 5 on 3.14).

    python tpickle_payloads.py --fuzz-corpus DATADIR CORPUSDIR
                                          writes fuzz/corpus/tpickle/ seeds: each committed
                                          payload behind the registration fuzz_tpickle.c reads
    python tpickle_payloads.py OUTDIR     writes the committed unit-test payloads
                                          (tests/server/data/tpickle/*.pkl) and the hostile
                                          ones (OUTDIR/hostile/*.pkl)

Hostile payloads are only ever written, never loaded: each would run a command, or build
something other than the registered tensors, in the process that unpickles it.

The file name says what a payload holds: DTYPE_D0xD1x..._nCOUNT_pPROTO.pkl.
"""

import builtins
import collections
import os
import pickle
import subprocess
import sys

import torch

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


def pattern(k, nbytes):
    """Byte j of tensor k (the same formula as tpickle_pattern() in the C tests)."""
    return bytes(((k * 37 + j * 11 + 5) & 0xFF) for j in range(nbytes))


def make_chunks(dtype_name, shape, count):
    """count tensors of shape/dtype whose raw bytes follow pattern()."""
    dtype = DTYPES[dtype_name]
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    out = []
    for k in range(count):
        raw = bytearray(pattern(k, numel * itemsize))
        # frombuffer shares raw; clone() gives each chunk its own storage, as a worker's
        # torch.empty(...) per chunk does.
        t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone()
        out.append(t)
    return out


def name(dtype_name, shape, count, proto):
    return "%s_%s_n%d_p%d.pkl" % (dtype_name, "x".join(map(str, shape)), count, proto)


# The committed set: every dtype, both layouts ([2, L, T, H] and MLA [L, T, H]), both
# protocols; one shape with dimensions above 255 (2-byte integers) and a single chunk (APPEND
# rather than MARK ... APPENDS).
COMMITTED = []
for _dt in DTYPES:
    for _proto in (4, 5):
        COMMITTED.append((_dt, (2, 2, 4, 8), 3, _proto))
        COMMITTED.append((_dt, (2, 4, 8), 2, _proto))
COMMITTED.append(("float16", (2, 1, 300, 2), 1, 4))
COMMITTED.append(("float8_e5m2", (1, 2, 260), 1, 5))


class Reduce:
    """An object that pickles as REDUCE(fn, args): how every hostile payload is spelled."""

    def __init__(self, fn, args):
        self.fn = fn
        self.args = args

    def __reduce__(self):
        return (self.fn, self.args)


def legacy_blob(storage):
    """The bytes torch's storage reduction carries (_load_from_bytes's argument)."""
    fn, args = storage.__reduce__()
    assert fn is torch.storage._load_from_bytes
    return args[0]


def typed_storage(t):
    return torch.storage.TypedStorage(
        wrap_storage=t.untyped_storage(), dtype=t.dtype, _internal=True)


def fake_tensor(blob, offset, shape, stride, requires_grad=False, hooks=None):
    """REDUCE(_rebuild_tensor_v2, (REDUCE(_load_from_bytes, (blob,)), ...)), any values."""
    storage = Reduce(torch.storage._load_from_bytes, (blob,))
    return Reduce(torch._utils._rebuild_tensor_v2,
                  (storage, offset, tuple(shape), tuple(stride), requires_grad,
                   hooks if hooks is not None else collections.OrderedDict()))


def hostile_payloads(marker):
    """name -> bytes. The float16 [2, 2, 4, 8] registration is what each is decoded against."""
    shape = (2, 2, 4, 8)
    good = make_chunks("float16", shape, 2)
    blob = legacy_blob(typed_storage(good[0]))
    cmd = "touch " + marker
    out = {}
    # The classic reductions: the command would run inside pickle.loads.
    out["os_system"] = pickle.dumps([Reduce(os.system, (cmd,))], protocol=4)
    out["subprocess"] = pickle.dumps(
        [Reduce(subprocess.check_call, (["touch", marker],))], protocol=4)
    out["builtins_eval"] = pickle.dumps(
        [Reduce(builtins.eval, ("__import__('os').system(%r)" % cmd,))], protocol=4)
    out["eval_in_tensor"] = pickle.dumps(
        [good[0], Reduce(builtins.eval, ("__import__('os').system(%r)" % cmd,))], protocol=4)
    # A storage blob whose inner pickle is something else: another class, or a command.
    out["blob_other_global"] = pickle.dumps(
        [fake_tensor(blob.replace(b"ctorch\nHalfStorage\n", b"cos\nsystem\n"), 0, shape,
                     good[0].stride())], protocol=4)
    inner = pickle.dumps(Reduce(os.system, (cmd,)), protocol=2)
    out["blob_os_system"] = pickle.dumps(
        [fake_tensor(blob[:137] + inner, 0, shape, good[0].stride())], protocol=4)
    # A tensor claiming more elements than its bytes: a bigger shape over the same storage,
    # and a storage whose element count exceeds its data.
    out["shape_too_big"] = pickle.dumps(
        [fake_tensor(blob, 0, (2, 2, 4, 16), (128, 64, 16, 1))], protocol=4)
    numel = 2 * 2 * 4 * 8
    data_at = len(blob) - numel * 2 - 8
    assert blob[data_at - 2:data_at] == b"a." and blob.count(b"K%cN" % numel) == 1
    more = (blob[:data_at].replace(b"K%cN" % numel, b"K%cN" % (numel + 1))
            + (numel + 1).to_bytes(8, "little") + blob[data_at + 8:])
    out["numel_too_big"] = pickle.dumps([fake_tensor(more, 0, shape, good[0].stride())],
                                        protocol=4)
    # Wrong dtype (a float32 or float8 tensor for a float16 registration).
    out["wrong_dtype"] = pickle.dumps(make_chunks("float32", shape, 1), protocol=4)
    out["wrong_dtype_v3"] = pickle.dumps(make_chunks("float8_e4m3fn", shape, 1), protocol=4)
    # Not what a worker's torch.empty chunk looks like.
    out["non_contiguous"] = pickle.dumps(
        [good[0].reshape(2, 2, 8, 4).clone().transpose(2, 3)], protocol=4)
    out["storage_offset"] = pickle.dumps(
        [fake_tensor(blob, 5, shape, good[0].stride())], protocol=4)
    out["requires_grad"] = pickle.dumps(
        [good[0].float().half().requires_grad_()], protocol=4)
    out["hooks"] = pickle.dumps(
        [fake_tensor(blob, 0, shape, good[0].stride(),
                     hooks=collections.OrderedDict([(1, 2)]))], protocol=4)
    out["parameter"] = pickle.dumps([torch.nn.Parameter(good[0], requires_grad=False)],
                                    protocol=4)
    out["view_of_bigger"] = pickle.dumps([torch.cat(good).view(2, *shape)[1]], protocol=4)
    # Not a flat list of tensors.
    out["nested_list"] = pickle.dumps([[good[0]]], protocol=4)
    out["tuple"] = pickle.dumps((good[0],), protocol=4)
    out["dict"] = pickle.dumps({0: good[0]}, protocol=4)
    out["same_tensor_twice"] = pickle.dumps([good[0], good[0]], protocol=4)
    out["protocol2"] = pickle.dumps(good, protocol=2)
    out["bare_tensor"] = pickle.dumps(good[0], protocol=4)
    return out


def fuzz_corpus(datadir, corpusdir):
    """Seeds for fuzz/fuzz_tpickle.c: dtype index, rank - 1, u16 dimensions, max tensors."""
    os.makedirs(corpusdir, exist_ok=True)
    names = list(DTYPES)
    for dt, shape, count, proto in COMMITTED:
        fname = name(dt, shape, count, proto)
        with open(os.path.join(datadir, fname), "rb") as f:
            payload = f.read()
        head = bytes([names.index(dt), len(shape) - 1])
        head += b"".join(d.to_bytes(2, "little") for d in shape) + bytes([count])
        with open(os.path.join(corpusdir, "seed-" + fname[:-4]), "wb") as f:
            f.write(head + payload)
    hostile = os.path.join(datadir, "hostile")
    for fname in sorted(os.listdir(hostile)):
        with open(os.path.join(hostile, fname), "rb") as f:
            payload = f.read()
        head = bytes([0, 3]) + b"".join(d.to_bytes(2, "little") for d in (2, 2, 4, 8)) + b"\x04"
        with open(os.path.join(corpusdir, "seed-hostile-" + fname[:-4]), "wb") as f:
            f.write(head + payload)


def main():
    if sys.argv[1] == "--fuzz-corpus":
        fuzz_corpus(sys.argv[2], sys.argv[3])
        return
    outdir = sys.argv[1]
    os.makedirs(os.path.join(outdir, "hostile"), exist_ok=True)
    for dt, shape, count, proto in COMMITTED:
        data = pickle.dumps(make_chunks(dt, shape, count), protocol=proto)
        with open(os.path.join(outdir, name(dt, shape, count, proto)), "wb") as f:
            f.write(data)
    for hname, data in hostile_payloads("/tmp/kvpool-tpickle-marker").items():
        with open(os.path.join(outdir, "hostile", hname + ".pkl"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
