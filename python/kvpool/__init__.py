"""kvpool: Python binding of the kvpool KV-cache daemon's client library.

Pure Python over ``libkvpool.so`` through ctypes; numpy and torch are used when installed.
See docs/python.md for the guide. Quick start::

    import kvpool
    with kvpool.Client() as client:
        ctx = client.register("rank0", model_name="my-model", world_size=1,
                              worker_rank=0, num_layers=32, hidden_dim=1024, dtype="bfloat16")
        n = ctx.lookup(token_ids)
        ctx.store(token_ids, chunks)                 # one buffer per chunk
        got = ctx.retrieve(token_ids)                # list of the leading cached chunks

Paged KV caches: :class:`PagedKVCache` with :meth:`Context.store_paged` and
:meth:`Context.retrieve_paged`, or the standalone :func:`gather` / :func:`scatter`.
"""

from typing import Tuple

from . import _lib
from .client import DEFAULT_TIMEOUT, Client
from .context import Context, StoreResult
from .plans import RetrievePlan, StorePlan
from .errors import (BadSlot, ClosedError, DaemonUnavailable, Error, InstanceBusy,
                     InstanceConflict, InstanceExists, InvalidArgument, LibraryError, NoSpace,
                     NotFound, PipelinedCommitFailed, ProtocolError, ShmUnavailable, Stale,
                     Timeout, TooBig, TooManyInstances, UntrustedDaemon)
from .paged import PagedKVCache, gather, scatter

__all__ = [
    "Client", "Context", "StorePlan", "RetrievePlan", "StoreResult", "DEFAULT_TIMEOUT",
    "PagedKVCache", "gather", "scatter",
    "Error", "LibraryError", "ClosedError", "InvalidArgument", "NotFound", "DaemonUnavailable",
    "Timeout", "NoSpace", "TooBig", "ProtocolError", "ShmUnavailable", "BadSlot",
    "InstanceConflict", "InstanceExists", "InstanceBusy", "TooManyInstances", "UntrustedDaemon",
    "Stale", "PipelinedCommitFailed",
    "library_path", "library_version", "default_socket_path", "__version__",
]

__version__ = "1.0.0"
"""Version of this binding; it works with libkvpool of the same major version."""


def library_path() -> str:
    """Path (or soname) of the libkvpool.so in use. Raises LibraryError if none is found."""
    return _lib.library_path()


def library_version() -> Tuple[int, int, int]:
    """Version of the loaded libkvpool as a (major, minor, patch) tuple."""
    v = int(_lib.load().kvp_version())
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def default_socket_path() -> str:
    """The socket a Client without socket_path uses: $KVPOOL_SOCKET, else the library's
    default ($XDG_RUNTIME_DIR/kvpool/kvpool.sock or /tmp/kvpool-<uid>/kvpool.sock)."""
    import ctypes
    import os

    env = os.environ.get("KVPOOL_SOCKET")
    if env:
        return env
    buf = ctypes.create_string_buffer(4096)
    rc = _lib.load().kvp_default_socket_path(buf, len(buf))
    if rc < 0:
        from .errors import from_code
        raise from_code(rc, "default_socket_path", _lib.strerror(rc))
    return bytes(buf.value).decode("utf-8", "replace")
