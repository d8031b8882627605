"""A registered instance: lookups, stores and retrieves, typed views, paged caches.

Keyed calls turn token ids into a ``kvp_tokens`` (:class:`_Key`), validate the token range in
Python (so that the message is precise), then call the C library through the client, which
serialises calls. On the shm transport, plan views point into the pool; on the inline
transport they point into staging buffers that commit_store() sends, so that the two-phase API
is the same on both transports.

After a daemon restart the library reconnects and registers the instance again at its next call
(include/kvpool.h): the same Context goes on, but its transport may change (shm on the new
daemon's segment, or inline if that cannot be mapped), so the transport attributes are read
back from the library after every call and each plan remembers the transport it was made on.
"""

from __future__ import annotations

import ctypes
import logging
import warnings
import weakref
from array import array
from contextlib import ExitStack
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal, NamedTuple,
                    Optional, Set, Tuple, Type, Union, overload)

from . import _lib
from ._buffers import (NUMPY_DTYPES, address_of, is_tensor, new_chunk, np, numpy_missing,
                       torch_dtype)
from .errors import ClosedError, Error, InvalidArgument, ShmUnavailable
from ._types import BlockTable, Buffer, NewChunk, ReadMemory, Salt, TokenIds, WriteMemory
from .plans import RetrievePlan, StorePlan, _PlanBase

if TYPE_CHECKING:
    import numpy
    import torch

    from .client import Client
    from .paged import PagedKVCache

__all__ = ["Context", "StoreResult"]

log = logging.getLogger("kvpool")

_TRANSPORT_NAMES = {_lib.KVP_TRANSPORT_SHM: "shm", _lib.KVP_TRANSPORT_INLINE: "inline"}

# Chunks fetched per request when the binding allocates the destination itself (retrieve with
# out=None, inline prepare_retrieve): bounded so that a long miss does not allocate the whole
# range up front.
_BATCH_BYTES = 64 << 20

# Inline staging buffers kept for reuse by a context. Fresh memory is slow to touch the first
# time (page faults), so plans on the inline transport recycle their staging buffers.
_STAGING_KEEP_BYTES = 256 << 20


class StoreResult(NamedTuple):
    """Outcome of :meth:`Context.store` with ``details=True``: full chunks in the range, newly
    stored, already cached, being stored by another worker, not stored for lack of pool space."""

    nchunks: int
    stored: int
    cached: int
    busy: int
    no_space: int


def text(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def instance_id_text(instance_id: Union[str, int]) -> str:
    """The wire form of an instance id: a str as is, an int (a worker's pid, say) as str(int).
    Raises TypeError for anything else (bool included: True is no worker's id)."""
    if isinstance(instance_id, str):
        return instance_id
    if isinstance(instance_id, int) and not isinstance(instance_id, bool):
        return str(instance_id)
    raise TypeError("instance_id must be a str or an int, not %s" % type(instance_id).__name__)


def as_uint(value: int, name: str, limit: int = 0xFFFFFFFF) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("%s must be an int, not %s" % (name, type(value).__name__))
    if value < 0 or value > limit:
        raise InvalidArgument("%s must be in [0, %d], not %d" % (name, limit, value))
    return value


def _token_array(token_ids: TokenIds) -> Tuple[object, int, int]:
    """Returns (keepalive, address, count) for token ids as contiguous uint32."""
    if np is not None and isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1 or token_ids.dtype.kind not in "iu":
            raise InvalidArgument("token_ids must be a 1-D integer array")
        if token_ids.size and (int(token_ids.min()) < 0 or int(token_ids.max()) > 0xFFFFFFFF):
            raise InvalidArgument("token ids must be in [0, 2**32)")
        u32 = np.ascontiguousarray(token_ids, dtype=np.uint32)
        return u32, u32.ctypes.data, u32.size
    if hasattr(token_ids, "tolist") and not isinstance(token_ids, (array, list, tuple)):
        token_ids = token_ids.tolist()  # torch tensors and the like
    a: array[int]
    if isinstance(token_ids, array) and token_ids.typecode in "IL" and token_ids.itemsize == 4:
        a = token_ids
    else:
        try:
            a = array("I", token_ids)
        except (OverflowError, TypeError) as e:
            raise InvalidArgument("token_ids must be ints in [0, 2**32): %s" % e) from None
        if a.itemsize != 4:  # pragma: no cover - every Linux ABI has a 4-byte unsigned int
            raise InvalidArgument("platform has no 32-bit array typecode")
    addr = a.buffer_info()[0] if len(a) else 0
    return a, addr, len(a)


class _Key:
    """A kvp_tokens built from token ids and an optional salt; keeps the memory alive."""

    def __init__(self, token_ids: TokenIds, salt: Salt) -> None:
        self._ids, addr, self.count = _token_array(token_ids)
        if isinstance(salt, str):
            salt = salt.encode("utf-8")
        if salt is not None and not isinstance(salt, (bytes, bytearray)):
            raise InvalidArgument("salt must be bytes or str")
        self._salt = bytes(salt) if salt else b""
        self.c = _lib.kvp_tokens()
        self.c.ids = ctypes.cast(ctypes.c_void_p(addr), ctypes.POINTER(ctypes.c_uint32))
        self.c.count = self.count
        self.c.salt_len = len(self._salt)
        self.c.salt = ctypes.cast(ctypes.c_char_p(self._salt), ctypes.c_void_p) \
            if self._salt else None


class Context:
    """A registered instance. Created by :meth:`Client.register`.

    Attributes:
        transport: "shm" or "inline", the transport actually used (after a daemon restart,
            the one the new registration got).
        reason: why inline is used ("" on shm).
        chunk_size: tokens per chunk (the daemon's ``--chunk-size``).
        chunk_shape: ``(2, num_layers, chunk_size, hidden_dim)`` or, for MLA,
            ``(num_layers, chunk_size, hidden_dim)``.
        chunk_bytes: bytes of one chunk.
        dtype: dtype name; dtype_size: bytes per element.
        shm_name: the pool segment's name with the posix backend, else "".
        shm_backend: how the pool is shared on shm: "posix" (a named segment in /dev/shm) or
            "memfd" (an anonymous segment the daemon handed over the socket, no name); "" inline.
        existing: True when this client had already registered the id (same parameters).
        instance_id: as given to :meth:`Client.register` (a str, or an int, which the daemon
        knows as ``str(instance_id)``).
        model_name, world_size, worker_rank, num_layers, hidden_dim, block_size, use_mla: as
        registered.

    Keyed calls take ``token_ids`` (a sequence of ints, an ``array('I')``, a numpy or torch
    integer array) from the sequence's first token, and an optional keyword ``salt`` (bytes or
    str) that isolates tenants. Only full chunks count: chunk ``i`` is tokens
    ``[i*chunk_size, (i+1)*chunk_size)``. ``start`` must be a multiple of ``chunk_size``.

    Usable as a context manager (unregisters on exit); :meth:`unregister` is idempotent.
    """

    def __init__(self, client: Client, inst: Optional[int], info: _lib.kvp_instance_info,
                 instance_id: Union[str, int], model_name: str, world_size: int,
                 worker_rank: int, num_layers: int, hidden_dim: int, block_size: int,
                 use_mla: bool) -> None:
        self.client = client
        self._lib = client._lib
        self._inst: Optional[int] = inst
        self._plans: Set[Union[StorePlan, RetrievePlan]] = set()
        self._view_plan: Dict[int, Union[StorePlan, RetrievePlan]] = {}
        self._staging_free: List[bytearray] = []
        self.instance_id = instance_id
        self.model_name = model_name
        self.world_size = world_size
        self.worker_rank = worker_rank
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.block_size = block_size
        self.use_mla = use_mla
        # The library's kvp_instance_info of this instance (not a copy): valid while it lives.
        self._info = info
        self.chunk_size = int(info.chunk_tokens)
        self.chunk_shape = tuple(int(x) for x in info.shape[:info.ndim])
        self.chunk_bytes = int(info.chunk_bytes)
        self.dtype = text(info.dtype)
        self.dtype_size = int(info.dtype_size)
        self.transport = ""  # "shm" or "inline" once _load_info() has run
        self._load_info()

    def _load_info(self) -> None:
        """Reads the registration's transport from the library, which registers the instance
        again after a daemon restart (the chunk layout never changes). Caller holds the client
        lock and the instance is alive."""
        info = self._info
        before = self.transport
        self.transport = _TRANSPORT_NAMES.get(info.transport, "inline")
        self.reason = text(info.reason)
        self.shm_name = text(info.shm_name)
        # A posix segment always has a name; a memfd one never has.
        if self.transport != "shm":
            self.shm_backend = ""
        else:
            self.shm_backend = "posix" if self.shm_name else "memfd"
        self.existing = bool(info.existing)
        if before and before != self.transport:
            log.warning("Instance %s now using %s transport after reconnecting to kvpoold%s",
                        self.instance_id, self.transport,
                        " (%s)" % self.reason if self.reason else "")

    def __repr__(self) -> str:
        return "<kvpool.Context %s %s chunk=%d tokens %s%s>" % (
            self.instance_id, self.transport, self.chunk_size, self.chunk_shape,
            "" if self._inst else " unregistered")

    # -- plumbing ------------------------------------------------------------------------------

    def _handle(self, op: str) -> int:
        if self._inst is None:
            raise ClosedError("%s: context %s is unregistered" % (op, self.instance_id), op=op)
        return self._inst

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> int:
        with self.client._lock:
            inst = self._handle(op)
            try:
                return self.client._call(op, fn, inst, *args)
            finally:
                if self._inst is not None and self.client._h is not None:
                    self._load_info()

    def _check_typed(self, obj: object, what: str) -> None:
        """A numpy array or a torch tensor handed in as a chunk must be one: the chunk's shape
        and the context's dtype (numpy's stand-in for bfloat16 and float8, ``uint16`` /
        ``uint8``, as :meth:`as_numpy` makes), or the unsigned integer of the element's size
        (the raw bits). A byte count that happens to match is not enough: a float32 array of
        half as many elements, or the layers and the hidden size swapped, would be stored as
        garbage. Raises :class:`kvpool.InvalidArgument` (a ValueError). Untyped buffers
        (bytes, bytearray, memoryview, ``(address, nbytes)``) are checked by size only."""
        if np is not None and isinstance(obj, np.ndarray):
            shape, dtype = tuple(obj.shape), obj.dtype.name
        elif is_tensor(obj):
            shape, dtype = tuple(obj.shape), str(obj.dtype)[len("torch."):]
        else:
            return
        allowed = (self.dtype, NUMPY_DTYPES.get(self.dtype, self.dtype),
                   "uint%d" % (8 * self.dtype_size))
        if dtype not in allowed:
            raise InvalidArgument("%s: dtype %s, the context's is %s (or %s for the raw bits)"
                                  % (what, dtype, self.dtype, allowed[2]))
        if shape != self.chunk_shape:
            raise InvalidArgument("%s: shape %s, a chunk is %s"
                                  % (what, shape, self.chunk_shape))

    def _range(self, key: _Key, start: int, end: Optional[int]) -> Tuple[int, int, int]:
        """Returns (start, end, nchunks) with end rounded down to a chunk boundary. The rule
        is the library's (kvp_chunk_count, shared with the daemon): a bad range raises its
        error (InvalidArgument, or TooBig beyond 4096 chunks) with its message."""
        as_uint(start, "start")
        if end is None:
            end = key.count
        as_uint(end, "end")
        nchunks = self._call("range", self.client._lib.kvp_chunk_count, start, end, key.count)
        return start, start + nchunks * self.chunk_size, nchunks

    def _check_plan(self, plan: object, cls: Type[_PlanBase], op: str) -> None:
        if not isinstance(plan, cls):
            raise InvalidArgument("%s needs a %s" % (op, cls.__name__))
        if plan._ctx is not self:
            raise InvalidArgument("%s: plan belongs to another context" % op)
        if plan._done:
            raise ClosedError("%s: plan was already committed or aborted" % op, op=op)

    def _pool_view(self, slot: _lib.kvp_slot,
                   readonly: bool) -> Tuple[ctypes.Array[ctypes.c_ubyte], memoryview]:
        """A memoryview over a pool slot, tracked by the client (see module doc)."""
        arr = (ctypes.c_ubyte * slot.length).from_address(slot.data)
        self.client._pool_arrays.add(arr)
        mv = memoryview(arr).cast("B")
        return arr, (mv.toreadonly() if readonly else mv)

    def _remember_views(self, plan: Union[StorePlan, RetrievePlan]) -> None:
        for v in plan._views:
            self._view_plan[id(v)] = plan

    def _forget_views(self, views: List[memoryview]) -> None:
        for v in views:
            self._view_plan.pop(id(v), None)

    def _finish(self, plan: Union[StorePlan, RetrievePlan], readonly_derived: bool) -> None:
        plan._done = True
        plan._release_views(readonly_derived)
        self._plans.discard(plan)

    def _take_staging(self) -> bytearray:
        """A chunk-sized staging buffer (contents undefined). Caller holds the client lock."""
        if self._staging_free:
            return self._staging_free.pop()
        return bytearray(self.chunk_bytes)

    def _return_staging(self, bufs: Iterable[bytearray]) -> None:
        """Keeps staging buffers for reuse, up to _STAGING_KEEP_BYTES. Caller holds the lock."""
        keep = max(1, _STAGING_KEEP_BYTES // max(1, self.chunk_bytes))
        for b in bufs:
            if len(self._staging_free) >= keep:
                break
            self._staging_free.append(b)

    def _abandon_plans(self) -> None:
        """Ends every open plan (best effort; errors are ignored): frees the library's slot
        arrays and releases the views. Called before unregister and close."""
        for plan in list(self._plans):
            try:
                if isinstance(plan, StorePlan):
                    self.abort_store(plan)
                else:
                    self.commit_retrieve(plan)
            except Error:
                self._finish(plan, True)

    def _mark_closed(self) -> None:
        self._inst = None
        self._plans.clear()
        self._view_plan.clear()
        self._staging_free = []

    def _unregister_now(self, handle_alive: bool) -> None:
        inst, self._inst = self._inst, None
        if inst is not None and handle_alive:
            try:
                self._lib.kvp_unregister(inst)
            except Exception:  # noqa: BLE001 - best effort during close
                pass
        self._mark_closed()

    # -- lookup, one-call store and retrieve ---------------------------------------------------

    def lookup(self, token_ids: TokenIds, *, salt: Salt = None) -> int:
        """Number of leading full chunks of the sequence that are cached."""
        key = _Key(token_ids, salt)
        return self._call("lookup", self._lib.kvp_lookup, ctypes.byref(key.c))

    @overload
    def store(self, token_ids: TokenIds, chunks: Iterable[ReadMemory], start: int = ..., *,
              salt: Salt = ..., details: Literal[False] = ...) -> int: ...

    @overload
    def store(self, token_ids: TokenIds, chunks: Iterable[ReadMemory], start: int = ..., *,
              salt: Salt = ..., details: Literal[True]) -> StoreResult: ...

    @overload
    def store(self, token_ids: TokenIds, chunks: Iterable[ReadMemory], start: int = ..., *,
              salt: Salt = ..., details: bool) -> Union[int, StoreResult]: ...

    def store(self, token_ids: TokenIds, chunks: Iterable[ReadMemory], start: int = 0, *,
              salt: Salt = None, details: bool = False) -> Union[int, StoreResult]:
        """Stores ``chunks`` as the chunks of the sequence starting at token ``start``.

        ``chunks``: one buffer per chunk (buffer-protocol objects, numpy arrays, torch CPU
        tensors or ``(address, nbytes)`` tuples), each exactly ``chunk_bytes`` bytes and
        C-contiguous, covering tokens ``[start, start + len(chunks) * chunk_size)``, which
        must lie inside ``token_ids``. An array or a tensor must have ``chunk_shape`` and the
        context's dtype (or the unsigned integer of its size), else
        :class:`kvpool.InvalidArgument`. Cached chunks are skipped.

        Returns the number of chunks newly stored, or a :data:`StoreResult` when ``details``.
        Same call on both transports (shm: one copy into the pool).
        """
        key = _Key(token_ids, salt)
        chunks = list(chunks)
        start, _, _ = self._range(key, start, start)
        end = start + len(chunks) * self.chunk_size
        if end > key.count:
            raise InvalidArgument("%d chunk(s) from token %d need %d tokens, the sequence has %d"
                                  % (len(chunks), start, end, key.count))
        res = _lib.kvp_store_result()
        if chunks:
            with ExitStack() as stack:
                ptrs = (ctypes.c_void_p * len(chunks))()
                for i, ch in enumerate(chunks):
                    self._check_typed(ch, "chunk %d" % i)
                    addr, n = stack.enter_context(address_of(ch, False, "chunk %d" % i))
                    if n != self.chunk_bytes:
                        raise InvalidArgument("chunk %d has %d bytes, chunk_bytes is %d"
                                              % (i, n, self.chunk_bytes))
                    ptrs[i] = addr
                self._call("store", self._lib.kvp_store, ctypes.byref(key.c), start, end, ptrs,
                           ctypes.byref(res))
        if details:
            return StoreResult(res.nchunks, res.stored, res.cached, res.busy, res.no_space)
        return int(res.stored)

    @overload
    def retrieve(self, token_ids: TokenIds, start: int = ..., end: Optional[int] = ...,
                 out: None = ..., *, salt: Salt = ...,
                 as_numpy: Optional[bool] = ...) -> List[NewChunk]: ...

    @overload
    def retrieve(self, token_ids: TokenIds, start: int, end: Optional[int],
                 out: Iterable[WriteMemory], *, salt: Salt = ...,
                 as_numpy: Optional[bool] = ...) -> int: ...

    @overload
    def retrieve(self, token_ids: TokenIds, start: int = ..., end: Optional[int] = ..., *,
                 out: Iterable[WriteMemory], salt: Salt = ...,
                 as_numpy: Optional[bool] = ...) -> int: ...

    def retrieve(self, token_ids: TokenIds, start: int = 0, end: Optional[int] = None,
                 out: Optional[Iterable[WriteMemory]] = None, *, salt: Salt = None,
                 as_numpy: Optional[bool] = None) -> Union[int, List[NewChunk]]:
        """Retrieves the leading run of cached chunks of tokens ``[start, end)``.

        ``end`` defaults to the end of the sequence (rounded down to a full chunk).

        With ``out`` (one writable, C-contiguous buffer of ``chunk_bytes`` per chunk of the
        range; when ``end`` is None the range is limited to ``len(out)`` chunks): fills
        ``out[0..n)`` and returns ``n``, the number of leading chunks retrieved.

        Without ``out``: returns a list of ``n`` new chunk buffers, numpy arrays of shape
        ``chunk_shape`` (dtype as :meth:`as_numpy`) when numpy is installed and ``as_numpy``
        is not False, else bytearrays.
        """
        key = _Key(token_ids, salt)
        if out is not None:
            out = list(out)
            if end is None:
                end = min(key.count, start + len(out) * self.chunk_size)
            start, end, nchunks = self._range(key, start, end)
            if len(out) < nchunks:
                raise InvalidArgument("out has %d buffer(s), the range has %d chunk(s)"
                                      % (len(out), nchunks))
            return self._retrieve_into(key, start, end, out[:nchunks])
        start, end, nchunks = self._range(key, start, end)
        numpy_out = np is not None if as_numpy is None else as_numpy
        result: List[NewChunk] = []

        def new() -> NewChunk:
            return new_chunk(self.chunk_bytes, self.chunk_shape, self.dtype, numpy_out)

        self._retrieve_batches(key, start, nchunks, new, result.append)
        return result

    def _retrieve_into(self, key: _Key, start: int, end: int,
                       out: List[WriteMemory]) -> int:
        if not out:
            return 0
        with ExitStack() as stack:
            ptrs = (ctypes.c_void_p * len(out))()
            for i, buf in enumerate(out):
                self._check_typed(buf, "out[%d]" % i)
                addr, n = stack.enter_context(address_of(buf, True, "out[%d]" % i))
                if n != self.chunk_bytes:
                    raise InvalidArgument("out[%d] has %d bytes, chunk_bytes is %d"
                                          % (i, n, self.chunk_bytes))
                ptrs[i] = addr
            n = self._call("retrieve", self._lib.kvp_retrieve, ctypes.byref(key.c), start, end,
                           ptrs)
        return n

    def _retrieve_batches(self, key: _Key, start: int, nchunks: int, new: Callable[[], Any],
                          emit: Callable[[Any], object]) -> List[Any]:
        """Retrieves in batches of bounded size into buffers from new(), passing each retrieved
        buffer to emit() in order; stops at the first missing chunk. Returns the buffers that
        were allocated but not filled."""
        batch = max(1, _BATCH_BYTES // max(1, self.chunk_bytes))
        done = 0
        while done < nchunks:
            n = min(batch, nchunks - done)
            bufs = [new() for _ in range(n)]
            s = start + done * self.chunk_size
            got = self._retrieve_into(key, s, s + n * self.chunk_size, bufs)
            for b in bufs[:got]:
                emit(b)
            done += got
            if got < n:
                return bufs[got:]
        return []

    # -- two-phase store -----------------------------------------------------------------------

    def prepare_store(self, token_ids: TokenIds, start: int = 0, end: Optional[int] = None, *,
                      salt: Salt = None) -> StorePlan:
        """Reserves pool space for the chunks of ``[start, end)`` that are not cached yet.

        Returns a :class:`StorePlan`, which unpacks as ``(views, chunk_indices)``: write
        ``chunk_bytes`` into each view (views point straight into the pool on shm, into
        staging buffers on inline), then :meth:`commit_store` or :meth:`abort_store`.
        The views are released by the commit or abort and must not be used afterwards.
        """
        key = _Key(token_ids, salt)
        start, end, _ = self._range(key, start, end)
        cplan = _lib.kvp_store_plan()
        with self.client._lock:
            self._call("prepare_store", self._lib.kvp_prepare_store, ctypes.byref(key.c), start,
                       end, ctypes.byref(cplan))
            # The transport of this prepare (_call read it back): it decides the commit too.
            shm = self.transport == "shm"
            views: List[memoryview] = []
            indices: List[int] = []
            arrays: List[ctypes.Array[ctypes.c_ubyte]] = []
            staging: List[bytearray] = []
            try:
                for i in range(cplan.nslots):
                    slot = cplan.slots[i]
                    indices.append(int(slot.chunk_index))
                    if shm:
                        arr, mv = self._pool_view(slot, readonly=False)
                        arrays.append(arr)
                    else:
                        buf = self._take_staging()
                        staging.append(buf)
                        mv = memoryview(buf)
                    views.append(mv)
            except BaseException:
                self._lib.kvp_abort_store(self._inst, ctypes.byref(cplan))
                self._return_staging(staging)
                raise
            plan = StorePlan(views, indices)
            plan._init_plan(self, cplan, int(cplan.nchunks))
            plan._views, plan._arrays, plan._staging = list(views), arrays, staging
            plan._shm = shm
            plan.cached, plan.busy, plan.no_space = int(cplan.cached), int(cplan.busy), \
                int(cplan.no_space)
            self._plans.add(plan)
            self._remember_views(plan)
        return plan

    def commit_store(self, plan: StorePlan) -> int:
        """Publishes a prepared store (after every view was written). Returns the number of
        chunks committed. On shm the commit is pipelined unless the client was opened with
        ``sync_commit=True``: it returns once sent (the count is the plan's), and if the daemon
        then fails it (the reservation expired), the client's next call raises
        :class:`kvpool.PipelinedCommitFailed` without doing anything. With ``sync_commit=True``
        it raises :class:`kvpool.Timeout` itself if the reservation expired. It raises
        :class:`kvpool.Stale` if the plan was prepared before the connection to the daemon was
        lost (a restart); nothing was published then. The plan's views are released, whatever
        the outcome."""
        self._check_plan(plan, StorePlan, "commit_store")
        with self.client._lock:
            staging, plan._staging = plan._staging, []
            self._finish(plan, readonly_derived=True)
            if plan._shm or not plan[1]:
                return self._call("commit_store", self._lib.kvp_commit_store,
                                  ctypes.byref(plan._c))
            ptrs = (ctypes.c_void_p * max(1, plan.nchunks))()
            try:
                with ExitStack() as stack:
                    for idx, buf in zip(plan[1], staging):
                        ptrs[idx] = stack.enter_context(address_of(buf, False))[0]
                    n = self._call("commit_store", self._lib.kvp_store_inline,
                                   ctypes.byref(plan._c), ptrs)
                return n
            finally:
                self._return_staging(staging)

    def abort_store(self, plan: StorePlan) -> None:
        """Drops a prepared store: nothing becomes visible. Releases the plan's views."""
        self._check_plan(plan, StorePlan, "abort_store")
        with self.client._lock:
            staging, plan._staging = plan._staging, []
            self._finish(plan, readonly_derived=True)
            self._return_staging(staging)
            self._call("abort_store", self._lib.kvp_abort_store, ctypes.byref(plan._c))

    # -- two-phase retrieve --------------------------------------------------------------------

    def prepare_retrieve(self, token_ids: TokenIds, start: int = 0, end: Optional[int] = None,
                         *, salt: Salt = None) -> RetrievePlan:
        """Pins the leading run of cached chunks of ``[start, end)`` and returns a
        :class:`RetrievePlan`: a list of read-only views, view ``i`` = chunk ``i`` of the
        range. On shm the views are the pool itself (pinned: not evicted meanwhile); on
        inline the chunks are fetched into staging buffers. Copy out, then
        :meth:`commit_retrieve`; the views are released by it and must not be used afterwards.
        """
        key = _Key(token_ids, salt)
        start, end, nchunks = self._range(key, start, end)
        cplan: Optional[_lib.kvp_retrieve_plan]
        views: List[memoryview]
        arrays: List[ctypes.Array[ctypes.c_ubyte]]
        staging: List[bytearray]
        with self.client._lock:
            cplan = None
            if self.transport == "shm":
                cplan = _lib.kvp_retrieve_plan()
                try:
                    self._call("prepare_retrieve", self._lib.kvp_prepare_retrieve,
                               ctypes.byref(key.c), start, end, ctypes.byref(cplan))
                except ShmUnavailable:
                    # This call reconnected to a restarted daemon whose segment this process
                    # cannot map: the instance is on inline now, fetch the chunks that way.
                    if self.transport == "shm":
                        raise
                    cplan = None
            if cplan is not None:
                views, arrays = [], []
                try:
                    for i in range(cplan.nslots):
                        arr, mv = self._pool_view(cplan.slots[i], readonly=True)
                        arrays.append(arr)
                        views.append(mv)
                except BaseException:
                    self._lib.kvp_commit_retrieve(self._inst, ctypes.byref(cplan))
                    raise
                staging = []
            else:
                cplan, arrays, staging, views = None, [], [], []

                def keep(buf: bytearray) -> None:
                    staging.append(buf)
                    views.append(memoryview(buf).toreadonly())

                unused = self._retrieve_batches(key, start, nchunks, self._take_staging, keep)
                self._return_staging(unused)
            plan = RetrievePlan(views)
            plan._init_plan(self, cplan, nchunks)
            plan._views, plan._arrays, plan._staging = list(views), arrays, staging
            self._plans.add(plan)
            self._remember_views(plan)
        return plan

    def commit_retrieve(self, plan: RetrievePlan) -> int:
        """Releases a prepared retrieve (unpins its chunks). Returns the number of chunks
        released. The plan's views are released and must not be used afterwards."""
        self._check_plan(plan, RetrievePlan, "commit_retrieve")
        with self.client._lock:
            n = len(plan)
            staging, plan._staging = plan._staging, []
            self._finish(plan, readonly_derived=False)
            self._return_staging(staging)
            if plan._c is not None:
                self._call("commit_retrieve", self._lib.kvp_commit_retrieve,
                           ctypes.byref(plan._c))
            return n

    # -- typed views ---------------------------------------------------------------------------

    def as_numpy(self, view: Buffer) -> numpy.ndarray:
        """A numpy array of shape ``chunk_shape`` over a chunk buffer (a plan's view, a
        retrieved chunk, any buffer of ``chunk_bytes``). No copy.

        The numpy dtype is the registered one; bfloat16 becomes uint16 and the float8 types
        uint8 (raw bits), since numpy has no such types. An array over a store plan's view is
        made read-only at commit; like the view, it must not be used after the commit.
        """
        if np is None:
            raise numpy_missing("as_numpy()")
        # Any: numpy's stubs list fewer buffer types than the buffer protocol takes.
        buf: Any = view
        arr = np.frombuffer(buf, dtype=NUMPY_DTYPES[self.dtype])
        if arr.nbytes != self.chunk_bytes:
            raise InvalidArgument("buffer has %d bytes, chunk_bytes is %d"
                                  % (arr.nbytes, self.chunk_bytes))
        arr = arr.reshape(self.chunk_shape)
        plan = self._view_plan.get(id(view))
        if plan is not None:
            plan._derived.append(weakref.ref(arr))
        return arr

    def as_torch(self, view: Buffer) -> torch.Tensor:
        """A torch CPU tensor of shape ``chunk_shape`` and the registered dtype (bfloat16 and
        float8 included) over a chunk buffer. No copy. Must not be used after the plan's commit.
        Requires torch."""
        torch_dt = torch_dtype(self.dtype)
        import torch

        with warnings.catch_warnings():
            # Read-only retrieve views: torch warns that it cannot mark the tensor read-only.
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(view, dtype=torch_dt)
        if t.numel() * t.element_size() != self.chunk_bytes:
            raise InvalidArgument("buffer has %d bytes, chunk_bytes is %d"
                                  % (t.numel() * t.element_size(), self.chunk_bytes))
        return t.view(self.chunk_shape)

    # -- paged KV caches -----------------------------------------------------------------------

    def _check_cache(self, cache: object) -> None:
        from .paged import PagedKVCache

        if not isinstance(cache, PagedKVCache):
            raise InvalidArgument("cache must be a kvpool.PagedKVCache")
        problems = []
        if cache.num_layers != self.num_layers:
            problems.append("num_layers %d != %d" % (cache.num_layers, self.num_layers))
        if cache.hidden != self.hidden_dim:
            problems.append("heads*head_dim %d != hidden_dim %d"
                            % (cache.hidden, self.hidden_dim))
        if cache.elem_size != self.dtype_size:
            problems.append("element size %d != %d (%s)"
                            % (cache.elem_size, self.dtype_size, self.dtype))
        if (cache.layout == "MLA") != self.use_mla:
            problems.append("layout %s but use_mla=%s" % (cache.layout, self.use_mla))
        if problems:
            raise InvalidArgument("paged cache does not match the registration: "
                                  + ", ".join(problems))

    def store_paged(self, token_ids: TokenIds, cache: PagedKVCache, block_table: BlockTable,
                    start: int = 0, end: Optional[int] = None, *, salt: Salt = None) -> int:
        """Stores the chunks of ``[start, end)`` straight from a paged KV cache.

        ``cache``: a :class:`kvpool.PagedKVCache` matching the registration (layers, hidden
        size, element size, MLA). ``block_table``: the sequence's block ids (list, numpy or
        torch integer array); entry ``i`` holds tokens ``[i*block_size, (i+1)*block_size)``.
        Only chunks that are not cached are gathered: on shm directly into the pool (one copy).
        Returns the number of chunks newly stored.
        """
        from .paged import block_table_array

        self._check_cache(cache)
        table = block_table_array(block_table)
        c = self.chunk_size
        plan = self.prepare_store(token_ids, start, end, salt=salt)
        try:
            for view, idx in zip(plan[0], plan[1]):
                cache.gather(table, start + idx * c, c, out=view, chunk_tokens=c)
        except BaseException:
            self.abort_store(plan)
            raise
        return self.commit_store(plan)

    def retrieve_paged(self, token_ids: TokenIds, cache: PagedKVCache, block_table: BlockTable,
                       start: int = 0, end: Optional[int] = None, skip_first_n: int = 0, *,
                       salt: Salt = None) -> int:
        """Retrieves the leading cached chunks of ``[start, end)`` straight into a paged KV
        cache (on shm from the pinned pool slots, one copy).

        ``skip_first_n``: tokens from ``start`` that are not written (already present in the
        cache). Block table entries must cover the tokens written. Returns the number of
        leading chunks retrieved: tokens ``[start, start + n*chunk_size)`` are then present.
        """
        from .paged import block_table_array

        self._check_cache(cache)
        as_uint(skip_first_n, "skip_first_n")
        table = block_table_array(block_table)
        c = self.chunk_size
        plan = self.prepare_retrieve(token_ids, start, end, salt=salt)
        try:
            for i, view in enumerate(plan):
                skip = min(c, max(0, skip_first_n - i * c))
                if skip < c:
                    cache.scatter(view, table, start + i * c, c, skip_first_n=skip,
                                  chunk_tokens=c)
            n = len(plan)
        finally:
            if not plan.done:
                self.commit_retrieve(plan)
        return n

    # -- lifetime ------------------------------------------------------------------------------

    def unregister(self) -> None:
        """Unregisters the instance: open plans are aborted (their views released), the daemon
        drops its reservations and pins. Idempotent; later calls on the context raise
        :class:`kvpool.ClosedError`."""
        with self.client._lock:
            if self._inst is None:
                return
            self._abandon_plans()
            inst, self._inst = self._inst, None
            self._mark_closed()
            self.client._contexts.discard(self)
            if self.client._h is None:
                return
            rc = self._lib.kvp_unregister(inst)
            if rc < 0:
                raise self.client._error(rc, "unregister")

    @property
    def registered(self) -> bool:
        """False once unregistered or once the client was closed."""
        return self._inst is not None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()
