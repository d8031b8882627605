"""Exceptions raised by the kvpool binding.

Every failure of a library call raises a subclass of :class:`Error`. The exception carries the
return code of the C library (``code``, negative), the positive error number (``errno``), its
symbolic name (``name``, for example ``"EINVAL"`` or ``"KVP_EPROTO"``) and the daemon's own
message when the daemon answered (``message``, possibly empty). Nothing in the binding reports
failure by returning ``None``.

Where a Python built-in exception means the same thing, the subclass also derives from it, so
``except ValueError`` or ``except TimeoutError`` work as expected.

Names of codes come from the library (``kvp_err_name()``), and so do kvpool's own codes:
``errors.KVP_EPEER`` and its siblings are read from the loaded libkvpool.so on first use. Which
exception class a code raises is this module's policy, one table by the code's name
(``_CLASSES``); the text of a message never decides it.
"""

from __future__ import annotations

import errno as _errno
from typing import Dict, Optional, Tuple, Type

__all__ = [
    "Error",
    "LibraryError",
    "ClosedError",
    "InvalidArgument",
    "NotFound",
    "DaemonUnavailable",
    "Timeout",
    "NoSpace",
    "TooBig",
    "ProtocolError",
    "ShmUnavailable",
    "BadSlot",
    "InstanceConflict",
    "InstanceExists",
    "InstanceBusy",
    "TooManyInstances",
    "UntrustedDaemon",
    "Stale",
    "PipelinedCommitFailed",
]

# kvpool's own codes are -10001, -10002, ... (KVP_ERRNO_MAP in include/kvpool.h); all other
# codes are negative errno values. The library's kvp_err_name() is the one table of their
# names: errors.KVP_EPROTO, errors.KVP_EPEER, ... are looked up there on first use (the module
# __getattr__ below), so they need a loadable libkvpool.so, as every kvpool call does.
_KVP_FIRST_CODE = -10001
_KVP_MAX_CODES = 1000  # bounds the walk over the library's codes; the table has a handful

# (library, {name: code}) of the library the codes were read from.
_kvp_codes: Optional[Tuple[object, Dict[str, int]]] = None


def code_name(code: int) -> str:
    """Symbolic name of a (negative) return code, as the loaded library names it:
    ``"EINVAL"``, ``"KVP_ENOSHM"``, ... (``"E<n>"`` for a code it does not know, ``"OK"`` for
    ``code >= 0``). Raises :class:`LibraryError` when libkvpool.so cannot be loaded."""
    from . import _lib  # not at the top: _lib imports this module

    return _lib.err_name(code)


def kvp_codes() -> Dict[str, int]:
    """kvpool's own return codes by name, ``{"KVP_EPROTO": -10001, ...}``: the names the loaded
    library gives -10001, -10002, ... up to the first code that is not one of kvpool's."""
    global _kvp_codes
    from . import _lib

    lib = _lib.load()
    cached = _kvp_codes
    if cached is None or cached[0] is not lib:
        codes: Dict[str, int] = {}
        for i in range(_KVP_MAX_CODES):
            name = code_name(_KVP_FIRST_CODE - i)
            if not name.startswith("KVP_E"):
                break
            codes[name] = _KVP_FIRST_CODE - i
        cached = _kvp_codes = (lib, codes)
    return dict(cached[1])


def __getattr__(name: str) -> int:
    """``errors.KVP_EPROTO``, ``errors.KVP_EPEER``, ...: kvpool's codes, from the library."""
    if name.startswith("KVP_E"):
        code = kvp_codes().get(name)
        if code is not None:
            return code
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


class Error(Exception):
    """Base class of every kvpool exception.

    Attributes:
        code: the C library's return code (negative), or 0 when the error was detected by the
            binding itself without a code.
        errno: ``-code`` (a positive errno value, or 10001.. for kvpool's own codes).
        name: symbolic name of the code.
        message: the daemon's message for the failed call ("" when it did not answer).
        op: the operation that failed (for example ``"register"``).
    """

    def __init__(self, text: str, code: int = 0, message: str = "", op: str = "") -> None:
        super().__init__(text)
        self.code: int = code
        self.errno: int = -code
        self.name: str = code_name(code) if code else ""
        self.message: str = message
        self.op: str = op


class LibraryError(Error, ImportError):
    """libkvpool.so cannot be found, cannot be loaded, or has another major version.

    ``name`` is :class:`Error`'s (the code's name: ``""``), not ImportError's module name."""

    name: str


class ClosedError(Error):
    """The client, context or plan was already closed, unregistered or committed."""


class InvalidArgument(Error, ValueError):
    """-EINVAL and friends: a value was rejected (the message names the field)."""


class NotFound(Error, LookupError):
    """-ENOENT on a request: unknown or unregistered instance, reservation or pin."""


class DaemonUnavailable(Error, ConnectionError):
    """No daemon listens on the socket, or the connection to it was lost."""


class Timeout(Error, TimeoutError):
    """-ETIMEDOUT: the daemon did not answer in time, or a reservation expired."""


class NoSpace(Error):
    """-ENOSPC / -ENOMEM: no room in the daemon's pool (or an allocation failed in the library).

    Deliberately not a :class:`MemoryError`: that means this Python process is out of memory,
    which a full cache pool is not, and ``except MemoryError`` handlers (which often give up
    or free caches) must not catch it. Catch ``kvpool.NoSpace`` or ``kvpool.Error``."""


class TooBig(Error, ValueError):
    """-E2BIG / -EMFILE / -ENAMETOOLONG: a request exceeds a protocol limit."""


class ProtocolError(Error):
    """The daemon and the library disagree on the protocol (KVP_EPROTO, KVP_EVERSION)."""


class ShmUnavailable(Error):
    """The shared-memory transport was requested but is not available (KVP_ENOSHM)."""


class BadSlot(ProtocolError):
    """The daemon sent a slot outside the mapped pool (KVP_EBADSLOT)."""


class UntrustedDaemon(Error, PermissionError):
    """The socket is not safe to send KV to: the process listening there runs as a uid this
    process does not trust (KVP_EPEER: allow it with ``trust_uid`` or ``$KVPOOL_TRUST_UID``), or
    the default socket's directory belongs to another user or is writable by others (-EPERM).
    The message names the uid or the directory (docs/SECURITY.md)."""


class Stale(DaemonUnavailable):
    """-ESTALE: the object belongs to a connection to the daemon that was lost (the daemon
    exited or restarted). A plan prepared before that is refused by its commit or abort, its
    views are released and nothing was published: prepare again (the client has reconnected,
    or does at its next call). An instance whose daemon came back with another chunk size is
    stale for good: unregister it and register again."""


class PipelinedCommitFailed(Error):
    """KVP_EPIPELINED: a commit that was sent without waiting for its answer (the default on
    the shm transport, see ``sync_commit``) failed, say because its reservation expired; the
    call that got this error did nothing and may simply be repeated. The message names the
    commit and its error."""


class InstanceConflict(Error):
    """The instance id is taken by another registration: :class:`InstanceExists` or
    :class:`InstanceBusy`. The daemon's message (in the text and in ``message``) says why."""


class InstanceExists(InstanceConflict):
    """-EEXIST: the id is registered with another model_name, dtype, world_size, worker_rank,
    block_size, num_layers, hidden_dim or use_mla. The message names the field and both values,
    e.g. "instance id rank0 is registered with model_name 'llama-3-8b', not 'mistral-7b'"."""


class InstanceBusy(InstanceConflict):
    """-EBUSY: the id is registered with the same parameters by another live connection. The
    message names that connection's pid; the id is free again once that worker has closed."""


class TooManyInstances(Error):
    """-EDQUOT from ``register()``: this connection already has as many instances registered
    as the daemon's ``--max-instances-per-client`` allows (64 by default), so that no client can
    take the daemon's whole table. The message names the count and the limit. Unregister an
    instance (or close a client that holds some) and register again; a registration of an id
    this connection already holds is not refused.

    Not a :class:`TooBig` (a request larger than a protocol limit, a ``ValueError``): every
    value of the registration is valid, the connection holds too many at once."""


# The one table: which exception class each return code raises, by the code's symbolic name.
# An errno name stands for the negative errno of that name (Python's errno module gives its
# value); a KVP_E name for kvpool's own code of that name (the loaded library gives its value,
# kvp_codes()). A code that is not here raises Error itself. Only the code decides, never the
# text of a message.
_CLASSES: Dict[str, Type[Error]] = {
    "EINVAL": InvalidArgument,
    "EOVERFLOW": InvalidArgument,
    "ENOENT": NotFound,  # DaemonUnavailable when it comes from a connect (from_code)
    "ECONNREFUSED": DaemonUnavailable,
    "ECONNRESET": DaemonUnavailable,
    "EPIPE": DaemonUnavailable,
    "ENOTCONN": DaemonUnavailable,
    "ECONNABORTED": DaemonUnavailable,
    "ESHUTDOWN": DaemonUnavailable,
    "EACCES": DaemonUnavailable,  # only a connect: no permission on the socket
    "EUSERS": DaemonUnavailable,  # the daemon serves --max-clients connections already
    "ETIMEDOUT": Timeout,
    "ENOSPC": NoSpace,
    "ENOMEM": NoSpace,
    "E2BIG": TooBig,
    "EMFILE": TooBig,
    "ENAMETOOLONG": TooBig,
    "EPROTO": ProtocolError,
    "EPROTONOSUPPORT": ProtocolError,
    "EOPNOTSUPP": ShmUnavailable,
    "EEXIST": InstanceExists,
    "EBUSY": InstanceBusy,
    "EDQUOT": TooManyInstances,
    "EPERM": UntrustedDaemon,
    "ESTALE": Stale,
    "KVP_EPROTO": ProtocolError,
    "KVP_EVERSION": ProtocolError,
    "KVP_EBADSLOT": BadSlot,
    "KVP_ENOSHM": ShmUnavailable,
    "KVP_EPEER": UntrustedDaemon,
    "KVP_EPIPELINED": PipelinedCommitFailed,
}


# The errno half of _CLASSES by value.
_CLASS_BY_ERRNO: Dict[int, Type[Error]] = {
    getattr(_errno, name): cls for name, cls in _CLASSES.items()
    if not name.startswith("KVP_E") and hasattr(_errno, name)
}


def exception_class(code: int) -> Type[Error]:
    """The exception class that return code ``code`` raises (``_CLASSES``), :class:`Error` for
    a code the table does not name."""
    if code >= 0:
        return Error
    name = code_name(code)
    if name.startswith("KVP_E"):
        return _CLASSES.get(name, Error)
    return _CLASS_BY_ERRNO.get(-code, Error)


def from_code(code: int, op: str, strerror: str, message: str = "",
              connecting: bool = False) -> Error:
    """Builds the exception for return code ``code`` of operation ``op``.

    ``strerror`` is the library's description of the code and ``message`` the daemon's text
    (part of the exception's text and its ``message``; it never changes the class).
    ``connecting``: the call failed while connecting to the socket, where -ENOENT means "no
    socket" rather than "unknown instance, reservation or pin" (:class:`DaemonUnavailable`
    instead of :class:`NotFound`). The client knows: at kvp_client_open(), or when the socket
    is not there (a reconnect that found no daemon, see Client).
    """
    name = code_name(code)
    cls = exception_class(code)
    if connecting and code == -_errno.ENOENT:
        cls = DaemonUnavailable
    text = "%s: %s (%s)" % (op, strerror, name)
    if message:
        text += ": " + message
    return cls(text, code=code, message=message, op=op)
