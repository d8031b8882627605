"""The connection to kvpoold.

:class:`Client` owns one connection (a ``kvp_client``) and, on the shm transport, the C
library's mapping of the daemon's pool, which lives until the client is closed. Registered
instances are :class:`kvpool.Context` objects (context.py); prepared transfers are plans
(plans.py).

Pool memory safety. A pool view is a ``memoryview`` of a ctypes array placed over the slot.
Releasing the view at commit makes it unusable, but objects derived from it (slices, numpy
arrays, torch tensors) keep their own pointer. The client therefore tracks those ctypes arrays
weakly: anything derived from a view keeps its array alive, and :meth:`Client.close` does not
unmap the pool while any is alive (the instances are unregistered at once; the unmapping waits
for the last derived object to go). Reading such an object after its commit returns stale
bytes, never unmapped memory.

Threads. A Client may be used from several threads; its calls are serialised by ``_lock`` (an
RLock taken around every library call, so close() cannot race a transfer). Use one Client per
thread for parallel transfers: ctypes releases the GIL during library calls.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import logging
import os
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Union

from . import _lib
from ._buffers import dtype_name
from ._types import DTypeLike
from .context import Context, as_uint, instance_id_text, text
from .errors import ClosedError, Error, InvalidArgument, from_code

__all__ = ["Client", "DEFAULT_TIMEOUT"]

log = logging.getLogger("kvpool")
log.addHandler(logging.NullHandler())  # the application decides where records go

DEFAULT_TIMEOUT = 30.0
"""Seconds a request may take before it fails with :class:`kvpool.Timeout`."""

_TRANSPORTS: Dict[str, int] = {"auto": _lib.KVP_TRANSPORT_AUTO,
                               "shm": _lib.KVP_TRANSPORT_SHM,
                               "inline": _lib.KVP_TRANSPORT_INLINE}


class _WeakTracker:
    """Weak references to objects that cannot be hashed (ctypes arrays)."""

    def __init__(self) -> None:
        self._refs: Dict[int, weakref.ReferenceType[Any]] = {}
        self._lock = threading.Lock()

    def add(self, obj: object) -> None:
        key = id(obj)

        def gone(_ref: object, key: int = key) -> None:
            with self._lock:
                self._refs.pop(key, None)

        with self._lock:
            self._refs[key] = weakref.ref(obj, gone)

    def alive(self) -> List[Any]:
        """The tracked objects that still exist."""
        with self._lock:
            refs = list(self._refs.values())
        return [o for o in (r() for r in refs) if o is not None]


class _DeferredClose:
    """Closes a kvp_client once every tracked pool array has been collected."""

    def __init__(self, lib: ctypes.CDLL, handle: int, arrays: List[Any]) -> None:
        self._lib = lib
        self._handle: Optional[int] = handle
        self._lock = threading.Lock()
        self._left = len(arrays)
        for a in arrays:
            weakref.finalize(a, self._one_gone)

    def _one_gone(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left or self._handle is None:
                return
            handle, self._handle = self._handle, None
        self._lib.kvp_client_close(handle)


class Client:
    """A connection to kvpoold.

    ``socket_path``: the daemon's Unix socket; None means ``$KVPOOL_SOCKET``, else the C
    library's default (``$XDG_RUNTIME_DIR/kvpool/kvpool.sock`` or
    ``/tmp/kvpool-<uid>/kvpool.sock``).
    ``timeout``: seconds per request. ``trust_uid``: a uid the daemon may run as besides this
    process's own and root (the library checks the daemon's credentials; ``$KVPOOL_TRUST_UID``
    adds more). ``sync_commit``: wait for the daemon's answer to every commit instead of
    pipelining it (the default on the shm transport: a transfer then costs one round trip, and a
    failed commit is reported by the next call as :class:`kvpool.PipelinedCommitFailed`; see
    ``KVP_OPT_SYNC_COMMIT`` in kvpool.h).

    Raises :class:`kvpool.DaemonUnavailable` when no daemon answers, :class:`kvpool.Timeout`,
    :class:`kvpool.ProtocolError` for an incompatible daemon, :class:`kvpool.UntrustedDaemon`
    for a daemon of an untrusted uid or an unsafe socket directory,
    :class:`kvpool.LibraryError` when libkvpool.so cannot be loaded.

    Usable as a context manager; :meth:`close` is idempotent.
    """

    def __init__(self, socket_path: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT,
                 trust_uid: Optional[int] = None, sync_commit: bool = False) -> None:
        self._h: Optional[int] = None
        self._lib = _lib.load()
        if timeout is None or timeout <= 0:
            raise InvalidArgument("timeout must be a positive number of seconds")
        ms = max(1, min(int(timeout * 1000), 0xFFFFFFFF))
        path = socket_path.encode("utf-8") if socket_path else None
        if trust_uid is not None and not 0 <= int(trust_uid) <= 0xFFFFFFFF:
            raise InvalidArgument("trust_uid must be a uid (0..4294967295)")
        opts = _lib.kvp_opts(path, ms, int(trust_uid or 0),
                             _lib.KVP_OPT_SYNC_COMMIT if sync_commit else 0)
        handle = ctypes.c_void_p()
        rc = self._lib.kvp_client_open(ctypes.byref(opts), ctypes.byref(handle))
        if rc < 0:
            where = socket_path or "the default socket"
            message = text(self._lib.kvp_last_error(None))
            raise from_code(
                rc, "connect to %s" % where, _lib.strerror(rc), message, connecting=True
            )
        self._h = handle.value
        # The socket the library connects (and reconnects) to, resolved the same way.
        if socket_path:
            self._socket = socket_path
        else:
            from . import default_socket_path  # the package imports this module first
            self._socket = default_socket_path()
        self._lock = threading.RLock()
        self._contexts: Set[Context] = set()
        self._pool_arrays = _WeakTracker()
        self.socket_path = socket_path
        self.timeout = timeout

    # -- plumbing ------------------------------------------------------------------------------

    def _error(self, rc: int, op: str) -> Error:
        msg = text(self._lib.kvp_last_error(self._h)) if self._h else ""
        # -ENOENT is the daemon's "unknown instance, reservation or pin", or a reconnect's "no
        # socket there" (the library reconnects at the start of a call after a lost
        # connection). The socket's absence tells them apart; the message is not read.
        connecting = rc == -errno.ENOENT and not os.path.exists(self._socket)
        return from_code(rc, op, _lib.strerror(rc), msg, connecting=connecting)

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> int:
        """Calls a library function taking the client lock; raises on a negative return."""
        with self._lock:
            if self._h is None:
                raise ClosedError("%s: client is closed" % op, op=op)
            rc = fn(*args)
            if isinstance(rc, int) and rc < 0:
                raise self._error(rc, op)
            return rc

    # -- public API ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has been called."""
        return self._h is None

    def ping(self) -> None:
        """One round trip to the daemon. Raises on failure."""
        self._call("ping", self._lib.kvp_ping, self._h)

    def stats(self) -> Dict[str, int]:
        """The daemon's counters and gauges as a dict name -> int."""
        cap = 128
        buf = (_lib.kvp_stat * cap)()
        n = self._call("stats", self._lib.kvp_stats, self._h, buf, cap)
        return {text(s.name): int(s.value) for s in buf[:min(n, cap)]}

    def register(self, instance_id: Union[str, int], *, model_name: str, world_size: int,
                 worker_rank: int, num_layers: int, hidden_dim: int, dtype: DTypeLike,
                 block_size: int = 16, use_mla: bool = False,
                 transport: str = "auto") -> Context:
        """Registers a KV layout and returns its :class:`Context`.

        Every argument but ``instance_id`` is keyword-only, so that two integers of the layout
        (``num_layers`` and ``hidden_dim``, ``world_size`` and ``worker_rank``) cannot be
        swapped without a trace: ``client.register("rank0", model_name="llama-3-8b",
        world_size=2, worker_rank=0, num_layers=32, hidden_dim=1024, dtype="bfloat16")``.

        ``instance_id``: a str, or an int (LMCache's workers use their pid), sent as
        ``str(instance_id)``; any other type raises :class:`TypeError`.
        ``dtype``: "float16", "bfloat16", "float32", "float64", "int8", "uint8",
        "float8_e4m3fn" or "float8_e5m2" (numpy and torch dtypes are accepted too).
        ``transport``: "auto" (shared memory when the daemon offers it and this process can
        map it, else inline), "shm" (fail with :class:`kvpool.ShmUnavailable` otherwise) or
        "inline".

        An instance id names one registration of one connection. Registering it again on this
        client with the same parameters returns that registration (``ctx.existing`` is True)
        and logs a warning. Raises :class:`kvpool.InstanceExists` if the id is registered with
        another model, world size, rank or layout (the message names the field), and
        :class:`kvpool.InstanceBusy` if another live connection holds it (the message names its
        pid). Raises :class:`kvpool.TooManyInstances` when this client already has the
        daemon's ``--max-instances-per-client`` instances registered, and
        :class:`kvpool.InvalidArgument` with the daemon's message naming the field for a
        rejected layout.
        """
        if transport not in _TRANSPORTS:
            raise InvalidArgument("transport must be 'auto', 'shm' or 'inline', not %r"
                                  % (transport,))
        dtype_str = dtype_name(dtype)
        for name, val in (("world_size", world_size), ("worker_rank", worker_rank),
                          ("num_layers", num_layers), ("hidden_dim", hidden_dim),
                          ("block_size", block_size)):
            as_uint(val, name)
        wire_id = instance_id_text(instance_id)
        if not isinstance(model_name, str):
            raise InvalidArgument("model_name must be a str")
        opts = _lib.kvp_register_opts(
            instance_id=wire_id.encode("utf-8"), model_name=model_name.encode("utf-8"),
            world_size=world_size, worker_rank=worker_rank, block_size=block_size,
            num_layers=num_layers, hidden_dim=hidden_dim, dtype=dtype_str.encode("utf-8"),
            use_mla=1 if use_mla else 0, transport=_TRANSPORTS[transport])
        inst = ctypes.c_void_p()
        with self._lock:
            self._call("register %s" % wire_id, self._lib.kvp_register, self._h,
                       ctypes.byref(opts), ctypes.byref(inst))
            info = self._lib.kvp_instance_get_info(inst).contents
            ctx = Context(self, inst.value, info, instance_id, model_name, world_size,
                          worker_rank, num_layers, hidden_dim, block_size, bool(use_mla))
            self._contexts.add(ctx)
        if ctx.existing:
            log.warning("Instance %s was already registered: using the existing registration",
                        instance_id)
        if ctx.transport == "shm":
            # The daemon's wording: a memfd segment has no name, the backend is named instead.
            if ctx.shm_backend == "posix":
                where = "shm_name=%s" % ctx.shm_name
            else:
                where = "backend=%s" % ctx.shm_backend
            log.info("Instance %s using SHM transport (%s, chunk_bytes=%d)", instance_id, where,
                     ctx.chunk_bytes)
        elif transport == "inline":
            log.info("Instance %s using inline transport (%s)", instance_id, ctx.reason)
        else:
            log.warning("Instance %s using inline transport: shared memory unavailable (%s)",
                        instance_id, ctx.reason)
        return ctx

    def close(self) -> None:
        """Closes the connection. The daemon drops this client's reservations, pins and
        instances; contexts and plans of this client become unusable. Idempotent.

        If objects derived from pool views (slices, numpy arrays, tensors) are still alive,
        the instances are unregistered now and the pool stays mapped until they are gone.
        """
        with self._lock:
            if self._h is None:
                return
            for ctx in list(self._contexts):
                ctx._abandon_plans()
            if self._pool_arrays.alive():
                gc.collect()
            live = self._pool_arrays.alive()
            handle, self._h = self._h, None
            contexts, self._contexts = self._contexts, set()
            if live:
                for ctx in contexts:
                    ctx._unregister_now(handle_alive=True)
                log.warning("kvpool client closed with %d pool view(s) still referenced; "
                            "the pool stays mapped until they are released", len(live))
                _DeferredClose(self._lib, handle, live)
            else:
                for ctx in contexts:
                    ctx._mark_closed()
                self._lib.kvp_client_close(handle)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return "<kvpool.Client %s%s>" % (self.socket_path or "(default socket)",
                                         " closed" if self.closed else "")
