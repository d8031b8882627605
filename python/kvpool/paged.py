"""Gather and scatter between an engine's paged KV cache and kvpool's chunk layout.

Thin wrappers over ``kvp_paged_gather()`` / ``kvp_paged_scatter()`` (include/kvpool_paged.h):
the copies run in C at close to memcpy speed, with the GIL released.

Per-layer layouts (C-contiguous numpy arrays or torch CPU tensors, one per layer, or one array
with a leading layer dimension):

======  =========================================  ==============================================
layout  per-layer shape                            with ``kv_first=True``
======  =========================================  ==============================================
NHD     ``[num_blocks, 2, block_size, heads, D]``  ``[2, num_blocks, block_size, heads, D]``
HND     ``[num_blocks, 2, heads, block_size, D]``  ``[2, num_blocks, heads, block_size, D]``
MLA     ``[num_blocks, block_size, latent]``       (not applicable)
======  =========================================  ==============================================

NHD also accepts ``heads * D`` merged into one last dimension. A chunk is
``[2, num_layers, chunk_tokens, heads * D]`` (MLA: ``[num_layers, chunk_tokens, latent]``).
"""

from __future__ import annotations

import ctypes
import errno
from array import array
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _lib
from ._buffers import NUMPY_DTYPES, address_of, is_tensor, np
from ._types import BlockTable, PagedLayers, ReadMemory, WriteMemory
from .errors import InvalidArgument, from_code

__all__ = ["PagedKVCache", "gather", "scatter", "block_table_array"]

_LAYOUTS: Dict[str, int] = {"NHD": _lib.KVP_PAGED_NHD, "HND": _lib.KVP_PAGED_HND,
                            "MLA": _lib.KVP_PAGED_MLA}
_ELEM_NUMPY: Dict[int, str] = {1: "uint8", 2: "uint16", 4: "float32", 8: "float64"}


def block_table_array(block_table: BlockTable) -> Any:
    """Returns the block table as contiguous int32 memory (a numpy array, a torch tensor or an
    ``array('i')``) without copying when it already is one. Raises InvalidArgument for values
    that do not fit int32."""
    if isinstance(block_table, array) and block_table.typecode == "i":
        return block_table
    if np is not None and isinstance(block_table, np.ndarray):
        if block_table.ndim != 1 or block_table.dtype.kind not in "iu":
            raise InvalidArgument("block_table must be a 1-D integer array")
        if block_table.dtype == np.int32 and block_table.flags.c_contiguous:
            return block_table
        if block_table.size and (int(block_table.min()) < -2**31
                                 or int(block_table.max()) >= 2**31):
            raise InvalidArgument("block ids must fit in int32")
        return np.ascontiguousarray(block_table, dtype=np.int32)
    if is_tensor(block_table):
        import torch
        if block_table.dim() != 1:
            raise InvalidArgument("block_table must be a 1-D tensor")
        if block_table.dtype != torch.int32 or block_table.device.type != "cpu" \
                or not block_table.is_contiguous():
            block_table = block_table.to(device="cpu", dtype=torch.int32).contiguous()
        return block_table
    try:
        return array("i", block_table)
    except (OverflowError, TypeError) as e:
        raise InvalidArgument("block_table must be ints that fit int32: %s" % e) from None


def _elem_size(obj: Any) -> int:
    if is_tensor(obj):
        return obj.element_size()
    return obj.itemsize


class PagedKVCache:
    """Description of a paged KV cache: ``num_layers`` buffers of one layout.

    ``PagedKVCache(layers, layout="NHD", kv_first=False)`` infers the geometry from numpy
    arrays or torch CPU tensors (all of the same shape and element size, C-contiguous): a list
    with one array per layer, or a single array whose first dimension is the layer.
    :meth:`from_pointers` describes raw memory instead.

    The object keeps references to the arrays; the memory must stay allocated while it is used.

    Attributes: ``layout`` ("NHD", "HND", "MLA"), ``kv_first``, ``num_layers``, ``num_blocks``,
    ``block_size``, ``heads``, ``head_dim``, ``hidden`` (heads * head_dim), ``elem_size``,
    ``layer_bytes``.
    """

    def __init__(self, layers: PagedLayers, layout: str = "NHD", kv_first: bool = False) -> None:
        layout = self._check_layout(layout, kv_first)
        per_layer_ndim = 3 if layout == "MLA" else None
        if (np is not None and isinstance(layers, np.ndarray)) or is_tensor(layers):
            nd = layers.ndim if not is_tensor(layers) else layers.dim()
            if nd < 4 or (per_layer_ndim and nd != per_layer_ndim + 1):
                raise InvalidArgument("a single array of all layers needs a leading layer "
                                      "dimension (got %d dimensions)" % nd)
            layers = [layers[i] for i in range(layers.shape[0])]
        layer_list: List[Any] = list(layers)
        if not layer_list:
            raise InvalidArgument("layers is empty")
        shape = tuple(layer_list[0].shape)
        esize = _elem_size(layer_list[0])
        for i, t in enumerate(layer_list):
            if tuple(t.shape) != shape or _elem_size(t) != esize:
                raise InvalidArgument("layer %d has shape %s / element size %d, layer 0 has %s"
                                      " / %d" % (i, tuple(t.shape), _elem_size(t), shape, esize))
        geo = self._geometry(shape, layout, kv_first)
        ptrs: List[int] = []
        nbytes = 0
        for i, t in enumerate(layer_list):
            with address_of(t, True, "layer %d" % i) as (addr, n):
                ptrs.append(addr)
                nbytes = n
        self._init(ptrs, nbytes, layout, kv_first, *geo, esize)
        self._keep: Optional[List[Any]] = layer_list
        self.dtype: Any = getattr(layer_list[0], "dtype", None)

    @classmethod
    def from_pointers(cls, pointers: Sequence[int], layer_bytes: int, layout: str,
                      num_blocks: int, block_size: int, heads: int, head_dim: int,
                      elem_size: int, kv_first: bool = False) -> PagedKVCache:
        """Describes raw memory: ``pointers`` (one address per layer, each with
        ``layer_bytes`` addressable bytes). The caller keeps the memory alive."""
        self = cls.__new__(cls)
        layout = cls._check_layout(layout, kv_first)
        self._init([int(p) for p in pointers], int(layer_bytes), layout, kv_first,
                   num_blocks, block_size, heads, head_dim, elem_size)
        self._keep = None
        self.dtype = None
        return self

    @staticmethod
    def _check_layout(layout: str, kv_first: bool) -> str:
        layout = str(layout).upper()
        if layout not in _LAYOUTS:
            raise InvalidArgument("layout must be 'NHD', 'HND' or 'MLA', not %r" % (layout,))
        if layout == "MLA" and kv_first:
            raise InvalidArgument("kv_first does not apply to the MLA layout")
        return layout

    @staticmethod
    def _geometry(shape: Tuple[int, ...], layout: str,
                  kv_first: bool) -> Tuple[int, int, int, int]:
        """(num_blocks, block_size, heads, head_dim) from a per-layer shape."""
        def bad() -> InvalidArgument:
            return InvalidArgument("per-layer shape %s does not match layout %s%s"
                                   % (shape, layout, " (kv_first)" if kv_first else ""))
        if layout == "MLA":
            if len(shape) != 3:
                raise bad()
            return shape[0], shape[1], 1, shape[2]
        if len(shape) not in (4, 5):
            raise bad()
        if kv_first:
            two, nb = shape[0], shape[1]
        else:
            nb, two = shape[0], shape[1]
        if two != 2:
            raise bad()
        if layout == "NHD":
            if len(shape) == 4:
                return nb, shape[2], 1, shape[3]
            return nb, shape[2], shape[3], shape[4]
        if len(shape) != 5:
            raise bad()
        return nb, shape[3], shape[2], shape[4]

    def _init(self, ptrs: List[int], layer_bytes: int, layout: str, kv_first: bool,
              num_blocks: int, block_size: int, heads: int, head_dim: int,
              elem_size: int) -> None:
        self.layout = layout
        self.kv_first = bool(kv_first)
        self.num_layers = len(ptrs)
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.heads = int(heads)
        self.head_dim = int(head_dim)
        self.hidden = self.heads * self.head_dim
        self.elem_size = int(elem_size)
        self.layer_bytes = int(layer_bytes)
        self._ptrs = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        self._c = _lib.kvp_paged_cache(
            layout=_LAYOUTS[layout], flags=_lib.KVP_PAGED_KV_FIRST if kv_first else 0,
            num_layers=self.num_layers, num_blocks=self.num_blocks, block_size=self.block_size,
            heads=self.heads, head_dim=self.head_dim, elem_size=self.elem_size,
            layer_bytes=self.layer_bytes, layers=self._ptrs)
        self._lib = _lib.load()
        self.chunk_bytes(1)  # validates the description

    def __repr__(self) -> str:
        return ("<kvpool.PagedKVCache %s%s layers=%d blocks=%d block_size=%d heads=%d "
                "head_dim=%d elem=%d>" % (self.layout, " kv_first" if self.kv_first else "",
                                          self.num_layers, self.num_blocks, self.block_size,
                                          self.heads, self.head_dim, self.elem_size))

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of a chunk of ``chunk_tokens`` tokens for this cache."""
        out = ctypes.c_uint64()
        rc = self._lib.kvp_paged_chunk_bytes(ctypes.byref(self._c), chunk_tokens,
                                             ctypes.byref(out))
        if rc < 0:
            raise from_code(rc, "paged cache", _lib.strerror(rc),
                            "invalid description %r or chunk_tokens %d" % (self, chunk_tokens))
        return int(out.value)

    def chunk_shape(self, chunk_tokens: int) -> Tuple[int, ...]:
        """Shape of a chunk of ``chunk_tokens`` tokens."""
        if self.layout == "MLA":
            return (self.num_layers, chunk_tokens, self.hidden)
        return (2, self.num_layers, chunk_tokens, self.hidden)

    def _diagnose(self, table: Any, token_start: int, num_tokens: int, skip: int, nbytes: int,
                  chunk_tokens: int) -> str:
        """Why the C call said -EINVAL, in words (only computed on failure)."""
        if num_tokens > chunk_tokens:
            return "num_tokens %d > chunk_tokens %d" % (num_tokens, chunk_tokens)
        if skip > num_tokens:
            return "skip_first_n %d > num_tokens %d" % (skip, num_tokens)
        need = self.chunk_bytes(chunk_tokens)
        if nbytes < need:
            return "chunk buffer has %d bytes, needs %d" % (nbytes, need)
        first, last = token_start + skip, token_start + num_tokens - 1
        lo, hi = first // self.block_size, last // self.block_size
        if hi >= len(table):
            return ("tokens up to %d need %d block table entries, the table has %d"
                    % (last, hi + 1, len(table)))
        for i in range(lo, hi + 1):
            b = int(table[i])
            if b < 0 or b >= self.num_blocks:
                return "block_table[%d] = %d is not in [0, %d)" % (i, b, self.num_blocks)
        return "invalid arguments"

    def _run(self, op: str, chunk: ReadMemory, block_table: BlockTable, token_start: int,
             num_tokens: int, skip: int, chunk_tokens: Optional[int], write: bool) -> None:
        if chunk_tokens is None:
            chunk_tokens = num_tokens
        for name, v in (("token_start", token_start), ("num_tokens", num_tokens),
                        ("skip_first_n", skip), ("chunk_tokens", chunk_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v > 0xFFFFFFFF:
                raise InvalidArgument("%s: %s must be an int in [0, 2**32)" % (op, name))
        table = block_table_array(block_table)
        with address_of(table, False, "block_table") as (taddr, tbytes), \
                address_of(chunk, write, "chunk") as (caddr, cbytes):
            tptr = ctypes.cast(ctypes.c_void_p(taddr), ctypes.POINTER(ctypes.c_int32))
            if write:
                rc = self._lib.kvp_paged_gather(ctypes.byref(self._c), tptr, tbytes // 4,
                                                token_start, num_tokens, caddr, cbytes,
                                                chunk_tokens)
            else:
                rc = self._lib.kvp_paged_scatter(ctypes.byref(self._c), tptr, tbytes // 4,
                                                 token_start, num_tokens, skip, caddr, cbytes,
                                                 chunk_tokens)
            if rc < 0:
                why = ""
                if rc == -errno.EINVAL:
                    why = self._diagnose(table, token_start, num_tokens, skip, cbytes,
                                         chunk_tokens)
                raise from_code(rc, op, _lib.strerror(rc), why)

    def gather(self, block_table: BlockTable, token_start: int, num_tokens: int,
               out: Optional[WriteMemory] = None,
               chunk_tokens: Optional[int] = None) -> WriteMemory:
        """Copies the sequence's tokens ``[token_start, token_start + num_tokens)`` of every
        layer into rows ``[0, num_tokens)`` of a chunk of ``chunk_tokens`` tokens (default
        ``num_tokens``).

        ``out``: writable chunk memory (buffer, numpy array, torch tensor, pool view, or an
        ``(address, nbytes)`` tuple); None allocates a numpy array of :meth:`chunk_shape`
        (with the cache's dtype when known) or, without numpy, a bytearray.
        Returns ``out``. Raises InvalidArgument (nothing written) for a bad block id, a table
        too short for the range, or a chunk too small.
        """
        if chunk_tokens is None:
            chunk_tokens = num_tokens
        if out is None:
            out = self._new_chunk(chunk_tokens)
        self._run("gather", out, block_table, token_start, num_tokens, 0, chunk_tokens, True)
        return out

    def scatter(self, chunk: ReadMemory, block_table: BlockTable, token_start: int,
                num_tokens: int, skip_first_n: int = 0,
                chunk_tokens: Optional[int] = None) -> None:
        """Copies rows ``[skip_first_n, num_tokens)`` of a chunk of ``chunk_tokens`` tokens
        (default ``num_tokens``) back to the sequence's tokens ``[token_start + skip_first_n,
        token_start + num_tokens)`` of every layer. Only block table entries covering the
        copied tokens are read. Raises InvalidArgument (nothing written) on a bad argument."""
        self._run("scatter", chunk, block_table, token_start, num_tokens, skip_first_n,
                  chunk_tokens, False)

    def _new_chunk(self, chunk_tokens: int) -> WriteMemory:
        nbytes = self.chunk_bytes(chunk_tokens)
        shape = self.chunk_shape(chunk_tokens)
        if self._keep and is_tensor(self._keep[0]):
            import torch

            return torch.empty(shape, dtype=self._keep[0].dtype)
        if np is None:
            return bytearray(nbytes)
        if isinstance(self.dtype, np.dtype):
            return np.empty(shape, dtype=self.dtype)
        return np.empty(shape, dtype=_ELEM_NUMPY[self.elem_size])


def gather(cache: PagedKVCache, block_table: BlockTable, token_start: int, num_tokens: int,
           out: Optional[WriteMemory] = None, chunk_tokens: Optional[int] = None) -> WriteMemory:
    """Same as :meth:`PagedKVCache.gather`."""
    return cache.gather(block_table, token_start, num_tokens, out, chunk_tokens)


def scatter(cache: PagedKVCache, chunk: ReadMemory, block_table: BlockTable, token_start: int,
            num_tokens: int, skip_first_n: int = 0, chunk_tokens: Optional[int] = None) -> None:
    """Same as :meth:`PagedKVCache.scatter`."""
    cache.scatter(chunk, block_table, token_start, num_tokens, skip_first_n, chunk_tokens)


# Re-exported for callers that build chunk buffers themselves.
CHUNK_NUMPY_DTYPES: Dict[str, str] = NUMPY_DTYPES
