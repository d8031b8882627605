"""kvpool.PagedKVCache gather/scatter against a straightforward numpy reference.

The reference indexes every token with numpy (block = table[p // block_size], offset =
p % block_size) and builds the chunk row by row. Covers NHD, HND, MLA, KV-first, odd block
sizes, chunks not aligned to blocks, partial chunks, skip-first-n, raw pointers, plain
buffers without numpy, torch tensors (when torch is installed) and argument errors.
"""

import ctypes
import os
import unittest
from array import array

import kvpool

try:
    import numpy as np
except ImportError:
    np = None  # type: ignore[assignment]  # optional; the checker sees numpy's module type

needs_numpy = unittest.skipUnless(np is not None, "numpy is not installed")


def _lib_or_skip():
    try:
        kvpool.library_path()
    except kvpool.LibraryError as e:
        raise unittest.SkipTest("libkvpool.so not usable: %s" % e)


def setUpModule():
    _lib_or_skip()


def layer_shape(layout, kv_first, nb, bs, heads, hd):
    if layout == "MLA":
        return (nb, bs, heads * hd)
    if layout == "NHD":
        return (2, nb, bs, heads, hd) if kv_first else (nb, 2, bs, heads, hd)
    return (2, nb, heads, bs, hd) if kv_first else (nb, 2, heads, bs, hd)


def ref_token(arr, layout, kv_first, kv, blk, o):
    """The hidden vector of one token of one plane of one layer, flattened."""
    if layout == "MLA":
        return arr[blk, o].reshape(-1)
    if layout == "NHD":
        return (arr[kv, blk, o] if kv_first else arr[blk, kv, o]).reshape(-1)
    return (arr[kv, blk, :, o, :] if kv_first else arr[blk, kv, :, o, :]).reshape(-1)


def ref_gather(layers, layout, kv_first, bs, table, start, n, chunk_tokens, out):
    planes = 1 if layout == "MLA" else 2
    for kv in range(planes):
        for layer, arr in enumerate(layers):
            for t in range(n):
                p = start + t
                row = ref_token(arr, layout, kv_first, kv, table[p // bs], p % bs)
                if planes == 1:
                    out[layer, t] = row
                else:
                    out[kv, layer, t] = row


def ref_scatter(layers, layout, kv_first, bs, heads, hd, table, start, n, skip, chunk):
    planes = 1 if layout == "MLA" else 2
    for kv in range(planes):
        for layer, arr in enumerate(layers):
            for t in range(skip, n):
                p = start + t
                blk, o = table[p // bs], p % bs
                row = chunk[layer, t] if planes == 1 else chunk[kv, layer, t]
                if layout == "MLA":
                    arr[blk, o] = row
                elif layout == "NHD":
                    tgt = arr[kv, blk, o] if kv_first else arr[blk, kv, o]
                    tgt[...] = row.reshape(tgt.shape)
                else:
                    tgt = arr[kv, blk, :, o, :] if kv_first else arr[blk, kv, :, o, :]
                    tgt[...] = row.reshape(heads, hd)


@needs_numpy
class TestAgainstReference(unittest.TestCase):
    rng = np.random.default_rng(1234) if np is not None else None

    def check(self, layout, kv_first, layers, bs, heads, hd, dtype, chunk_tokens, start, n,
              skip, extra_blocks=2):
        ctx = "%s kv_first=%s L=%d bs=%d H=%d D=%d %s chunk=%d start=%d n=%d skip=%d" % (
            layout, kv_first, layers, bs, heads, hd, dtype, chunk_tokens, start, n, skip)
        need = -(-(start + n) // bs) if n else 1
        nb = need + extra_blocks
        shape = layer_shape(layout, kv_first, nb, bs, heads, hd)
        arrs = [self.rng.integers(0, 120, shape).astype(dtype) for _ in range(layers)]
        table = self.rng.permutation(nb)[:need].astype(np.int32)
        cache = kvpool.PagedKVCache(arrs, layout, kv_first)
        self.assertEqual(cache.chunk_shape(chunk_tokens)[-1], heads * hd)

        # Gather: rows [n, chunk_tokens) must keep their content.
        cshape = cache.chunk_shape(chunk_tokens)
        out = self.rng.integers(0, 120, cshape).astype(dtype)
        want = out.copy()
        ref_gather(arrs, layout, kv_first, bs, table, start, n, chunk_tokens, want)
        cache.gather(table, start, n, out=out, chunk_tokens=chunk_tokens)
        np.testing.assert_array_equal(out, want, err_msg=ctx)

        # Scatter a random chunk into two identical copies.
        chunk = self.rng.integers(0, 120, cshape).astype(dtype)
        mine = [a.copy() for a in arrs]
        ref = [a.copy() for a in arrs]
        kvpool.PagedKVCache(mine, layout, kv_first).scatter(
            chunk, table, start, n, skip_first_n=skip, chunk_tokens=chunk_tokens)
        ref_scatter(ref, layout, kv_first, bs, heads, hd, table, start, n, skip, chunk)
        for layer in range(layers):
            np.testing.assert_array_equal(mine[layer], ref[layer], err_msg=ctx)

    def test_nhd(self):
        self.check("NHD", False, 2, 16, 2, 8, np.float16, 16, 0, 16, 0)
        self.check("NHD", False, 3, 3, 2, 5, np.uint16, 16, 16, 16, 0)    # odd block size
        self.check("NHD", False, 2, 5, 1, 7, np.float32, 16, 32, 16, 3)   # skip
        self.check("NHD", False, 1, 16, 4, 16, np.float16, 32, 16, 32, 17)
        self.check("NHD", False, 2, 7, 3, 4, np.int8, 16, 5, 11, 0)       # partial chunk
        self.check("NHD", False, 2, 64, 2, 8, np.float64, 16, 40, 16, 0)  # inside a block

    def test_hnd(self):
        self.check("HND", False, 2, 16, 2, 8, np.float16, 16, 0, 16, 0)
        self.check("HND", False, 2, 3, 4, 64, np.uint16, 16, 16, 16, 0)
        self.check("HND", False, 3, 5, 3, 5, np.float16, 16, 32, 16, 7)
        self.check("HND", False, 2, 7, 3, 4, np.float32, 16, 5, 11, 1)

    def test_kv_first(self):
        self.check("NHD", True, 3, 5, 2, 6, np.float16, 16, 16, 16, 2)
        self.check("HND", True, 2, 16, 8, 32, np.uint8, 16, 32, 16, 0)
        self.check("HND", True, 2, 3, 2, 3, np.float32, 8, 7, 8, 8)

    def test_mla(self):
        self.check("MLA", False, 2, 16, 1, 576, np.uint16, 16, 0, 16, 0)
        self.check("MLA", False, 3, 3, 1, 9, np.float16, 16, 16, 16, 4)
        self.check("MLA", False, 2, 5, 1, 33, np.uint8, 16, 32, 13, 0)

    def test_random(self):
        for _ in range(60):
            r = self.rng.integers
            layout = ["NHD", "HND", "MLA"][r(0, 3)]
            kv_first = layout != "MLA" and bool(r(0, 2))
            chunk = int(r(1, 33))
            n = int(r(0, chunk + 1))
            self.check(layout, kv_first, int(r(1, 4)), int(r(1, 18)),
                       1 if layout == "MLA" else int(r(1, 4)), int(r(1, 12)),
                       [np.uint8, np.float16, np.float32, np.float64][r(0, 4)],
                       chunk, int(r(0, 40)), n, int(r(0, n + 1)), int(r(0, 3)))

    def test_merged_hidden_and_stacked(self):
        # NHD with heads*head_dim as one dimension, all layers in one array.
        stacked = self.rng.integers(0, 1000, (3, 6, 2, 4, 10)).astype(np.float16)
        cache = kvpool.PagedKVCache(stacked, "NHD")
        self.assertEqual((cache.num_layers, cache.num_blocks, cache.block_size, cache.hidden),
                         (3, 6, 4, 10))
        table = [5, 0, 3]
        got = cache.gather(table, 2, 8)
        self.assertEqual(got.dtype, np.float16)
        self.assertEqual(got.shape, (2, 3, 8, 10))
        np.testing.assert_array_equal(got[1, 2, 0], stacked[2, 5, 1, 2])  # token 2: block 5
        np.testing.assert_array_equal(got[0, 0, 7], stacked[0, 3, 0, 1])  # token 9: block 3

    def test_errors_leave_output_untouched(self):
        arrs = [np.zeros((4, 2, 4, 2, 4), np.float16) for _ in range(2)]
        cache = kvpool.PagedKVCache(arrs, "NHD")
        out = np.full(cache.chunk_shape(8), 3, np.float16)
        for table, start, n, msg in (([0, 4], 0, 8, "block_table[1] = 4"),
                                     ([0, -1], 0, 8, "block_table[1] = -1"),
                                     ([0], 0, 8, "block table entries"),
                                     ([0, 1, 2], 0, 9, "num_tokens 9 > chunk_tokens 8")):
            with self.assertRaises(kvpool.InvalidArgument) as cm:
                cache.gather(table, start, n, out=out, chunk_tokens=8)
            self.assertIn(msg, str(cm.exception))
            np.testing.assert_array_equal(out, 3)
        with self.assertRaises(kvpool.InvalidArgument) as cm:
            cache.gather([0, 1], 0, 8, out=np.zeros(10, np.float16), chunk_tokens=8)
        self.assertIn("needs", str(cm.exception))
        with self.assertRaises(kvpool.InvalidArgument):
            cache.scatter(out, [0, 1], 0, 4, skip_first_n=5, chunk_tokens=8)
        with self.assertRaises(kvpool.InvalidArgument):
            cache.gather([0, 1], 0, 8, out=out[:, :, ::2], chunk_tokens=4)  # not contiguous
        ro = out.copy()
        ro.flags.writeable = False
        with self.assertRaises(kvpool.InvalidArgument):
            cache.gather([0, 1], 0, 8, out=ro, chunk_tokens=8)
        with self.assertRaises(kvpool.InvalidArgument):
            cache.gather([0, 2**31], 0, 8, out=out, chunk_tokens=8)
        for a in arrs:
            np.testing.assert_array_equal(a, 0)

    def test_bad_descriptions(self):
        a = np.zeros((4, 2, 4, 2, 4), np.float16)
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([a], "XYZ")
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([a], "MLA", kv_first=True)
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([a], "MLA")  # 5 dimensions
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([np.zeros((4, 3, 4, 8), np.float16)], "NHD")  # not 2 planes
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([a, a[:2]], "NHD")
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([a[:, :, ::2]], "NHD")
        with self.assertRaises(kvpool.InvalidArgument):
            kvpool.PagedKVCache([], "NHD")

    def test_raw_pointers(self):
        arrs = [self.rng.integers(0, 100, (5, 2, 3, 2, 4)).astype(np.float32)
                for _ in range(2)]
        cache = kvpool.PagedKVCache.from_pointers([a.ctypes.data for a in arrs], arrs[0].nbytes,
                                                  "NHD", 5, 3, 2, 4, 4)
        out = np.zeros((2, 2, 8, 8), np.float32)
        cache.gather([4, 1, 2], 1, 8, out=(out.ctypes.data, out.nbytes))
        want = np.zeros_like(out)
        ref_gather(arrs, "NHD", False, 3, [4, 1, 2], 1, 8, 8, want)
        np.testing.assert_array_equal(out, want)
        with self.assertRaises(kvpool.InvalidArgument):  # layer_bytes too small
            kvpool.PagedKVCache.from_pointers([a.ctypes.data for a in arrs], 100, "NHD", 5, 3,
                                              2, 4, 4)


class TestWithoutNumpy(unittest.TestCase):
    """Plain buffers: bytearrays, array('i') block tables, raw addresses."""

    def test_round_trip_bytearrays(self):
        L, nb, bs, heads, hd, es = 2, 6, 5, 2, 3, 2
        layer_bytes = nb * 2 * bs * heads * hd * es
        src = [bytearray(os.urandom(layer_bytes)) for _ in range(L)]
        dst = [bytearray(layer_bytes) for _ in range(L)]
        keep = [(ctypes.c_char * layer_bytes).from_buffer(b) for b in src + dst]
        addrs = [ctypes.addressof(k) for k in keep]
        a = kvpool.PagedKVCache.from_pointers(addrs[:L], layer_bytes, "HND", nb, bs, heads, hd,
                                              es)
        b = kvpool.PagedKVCache.from_pointers(addrs[L:], layer_bytes, "HND", nb, bs, heads, hd,
                                              es)
        chunk = bytearray(a.chunk_bytes(16))
        self.assertEqual(len(chunk), 2 * L * 16 * heads * hd * es)
        a.gather(array("i", [3, 1, 0, 5]), 2, 16, out=chunk)
        b.scatter(bytes(chunk), [0, 1, 2, 3], 2, 16)
        back = bytearray(len(chunk))
        b.gather([0, 1, 2, 3], 2, 16, out=back)
        self.assertEqual(back, chunk)
        # A mismatching size of "out" is refused.
        with self.assertRaises(kvpool.InvalidArgument):
            a.gather([3, 1, 0, 5], 2, 16, out=bytearray(10))
        with self.assertRaises(kvpool.InvalidArgument):
            a.gather([3, 1, 0, 5], 2, 16, out=bytes(len(chunk)))  # read-only
        del keep


class TestTorch(unittest.TestCase):
    """torch CPU tensors, including bfloat16 (skipped when torch is not installed)."""

    @classmethod
    def setUpClass(cls):
        try:
            import torch
        except ImportError:
            raise unittest.SkipTest("torch is not installed")
        cls.torch = torch

    def test_bfloat16_round_trip(self):
        torch = self.torch
        layers = [torch.randn(6, 2, 4, 2, 8).to(torch.bfloat16) for _ in range(3)]
        cache = kvpool.PagedKVCache(layers, "NHD")
        table = torch.tensor([4, 0, 2], dtype=torch.int64)
        chunk = cache.gather(table, 1, 10, chunk_tokens=16)
        self.assertIsInstance(chunk, torch.Tensor)
        self.assertEqual(chunk.dtype, torch.bfloat16)
        self.assertEqual(tuple(chunk.shape), (2, 3, 16, 16))
        self.assertTrue(torch.equal(chunk[1, 2, 0], layers[2][4, 1, 1].reshape(-1)))
        fresh = [torch.zeros_like(t) for t in layers]
        kvpool.PagedKVCache(fresh, "NHD").scatter(chunk, table, 1, 10, chunk_tokens=16)
        back = kvpool.PagedKVCache(fresh, "NHD").gather(table, 1, 10, chunk_tokens=16)
        self.assertTrue(torch.equal(back[:, :, :10], chunk[:, :, :10]))


if __name__ == "__main__":
    unittest.main()
