"""Prepared two-phase transfers.

A plan is created by :meth:`Context.prepare_store` or :meth:`Context.prepare_retrieve` and
ended by exactly one commit or abort, which releases its views: using a released view raises
``ValueError``. numpy arrays made with :meth:`Context.as_numpy` over a store plan's views are
made read-only when the plan ends, so they cannot scribble over published chunks.
"""

from __future__ import annotations

import ctypes
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, List, Optional, Tuple, Type

if TYPE_CHECKING:
    from .context import Context

    _StorePlanBase = Tuple[List[memoryview], List[int]]
    _RetrievePlanBase = List[memoryview]
else:
    # Not the typing generics at run time: subclassing List[...] would add typing.Generic to
    # the plans' bases.
    _StorePlanBase = tuple
    _RetrievePlanBase = list

__all__ = ["StorePlan", "RetrievePlan"]


class _PlanBase:
    """State shared by store and retrieve plans."""

    nchunks: int
    _ctx: Context
    _c: Any  # the library's kvp_store_plan or kvp_retrieve_plan (None: inline retrieve)
    _views: List[memoryview]
    _arrays: List[ctypes.Array[ctypes.c_ubyte]]
    _staging: List[bytearray]
    _derived: List[weakref.ReferenceType[Any]]
    _done: bool

    def _init_plan(self, ctx: Context, cplan: Any, nchunks: int) -> None:
        self._ctx = ctx
        self._c = cplan
        self.nchunks = nchunks
        self._views = []        # memoryviews handed out, released when the plan ends
        self._arrays = []       # ctypes arrays over pool slots (shm)
        self._staging = []      # staging buffers (inline)
        self._derived = []      # weak references to numpy arrays made by ctx.as_numpy()
        self._done = False

    def _release_views(self, readonly_derived: bool) -> None:
        for v in self._views:
            try:
                v.release()
            except BufferError:
                pass  # an export is still active; the pool stays mapped (kvpool/client.py)
        if readonly_derived:
            for ref in self._derived:
                a = ref()
                if a is not None:
                    a.flags.writeable = False
        self._ctx._forget_views(self._views)
        self._views = []
        self._arrays = []
        self._derived = []

    @property
    def done(self) -> bool:
        """True once the plan was committed or aborted."""
        return self._done


class StorePlan(_PlanBase, _StorePlanBase):
    """A prepared store: unpacks as ``(views, chunk_indices)``.

    ``views[i]`` is a writable memoryview of ``chunk_bytes`` bytes for chunk
    ``chunk_indices[i]`` of the request range (0 = the chunk at token ``start``). Write every
    view, then :meth:`Context.commit_store`; or :meth:`Context.abort_store`. As a context
    manager it commits on normal exit and aborts on an exception.

    Attributes: ``nchunks`` (full chunks in the range), ``cached``, ``busy``, ``no_space``
    (chunks not reserved, by reason), ``views``, ``chunk_indices``.
    """

    cached: int
    busy: int
    no_space: int
    _shm: bool  # prepared on the shm transport: views into the pool, committed by commit_store

    def __new__(cls, views: List[memoryview], indices: List[int]) -> StorePlan:
        return tuple.__new__(cls, (views, indices))

    @property
    def views(self) -> List[memoryview]:
        """One writable view per reserved chunk."""
        return self[0]

    @property
    def chunk_indices(self) -> List[int]:
        """The chunk of the range (0 = the chunk at ``start``) each view is for."""
        return self[1]

    def __enter__(self) -> StorePlan:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self._done:
            return
        if exc_type is None:
            self._ctx.commit_store(self)
        else:
            self._ctx.abort_store(self)

    # tuple's equality and hashing would look at the views; plans are identities.
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return "<kvpool.StorePlan %d slot(s) of %d chunk(s)%s>" % (
            len(self[1]), self.nchunks, " done" if self._done else "")


class RetrievePlan(_PlanBase, _RetrievePlanBase):
    """A prepared retrieve: a list of read-only memoryviews, one per leading cached chunk of
    the range (view ``i`` is chunk ``i``). Copy them out, then
    :meth:`Context.commit_retrieve` (which the context-manager form does on exit).

    Attribute ``nchunks``: full chunks in the requested range.
    """

    def __enter__(self) -> RetrievePlan:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self._ctx.commit_retrieve(self)

    def __repr__(self) -> str:
        return "<kvpool.RetrievePlan %d of %d chunk(s)%s>" % (
            len(self), self.nchunks, " done" if self._done else "")

    # list's equality and hashing would compare views; plans are identities. (Plans live in
    # sets, so they must be hashable; typeshed declares list unhashable, hence the ignore.)
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__  # type: ignore[assignment]
