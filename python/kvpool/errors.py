"""Exceptions raised by the kvpool binding.

Every failure of a library call raises a subclass of :class:`Error`. The exception carries the
return code of the C library (``code``, negative), the positive error number (``errno``), its
symbolic name (``name``, for example ``"EINVAL"`` or ``"KVP_EPROTO"``) and the daemon's own
message when the daemon answered (``message``, possibly empty). Nothing in the binding reports
failure by returning ``None``.

Where a Python built-in exception means the same thing, the subclass also derives from it, so
``except ValueError`` or ``except TimeoutError`` work as expected.
"""

import errno as _errno

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
    "UntrustedDaemon",
]

# kvpool's own codes (KVP_ERRNO_MAP in kvpool.h); all other codes are negative errno values.
KVP_EPROTO = -10001
KVP_EVERSION = -10002
KVP_EBADSLOT = -10003
KVP_ENOSHM = -10004
KVP_EPEER = -10005

_KVP_NAMES = {
    KVP_EPROTO: "KVP_EPROTO",
    KVP_EVERSION: "KVP_EVERSION",
    KVP_EBADSLOT: "KVP_EBADSLOT",
    KVP_ENOSHM: "KVP_ENOSHM",
    KVP_EPEER: "KVP_EPEER",
}


def code_name(code):
    """Symbolic name of a (negative) return code: ``"EINVAL"``, ``"KVP_ENOSHM"``, ..."""
    if code in _KVP_NAMES:
        return _KVP_NAMES[code]
    return _errno.errorcode.get(-code, "E%d" % -code)


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

    def __init__(self, text, code=0, message="", op=""):
        super().__init__(text)
        self.code = code
        self.errno = -code
        self.name = code_name(code) if code else ""
        self.message = message
        self.op = op


class LibraryError(Error, ImportError):
    """libkvpool.so cannot be found, cannot be loaded, or has another major version."""


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


class NoSpace(Error, MemoryError):
    """-ENOSPC / -ENOMEM: no room in the pool or in this process."""


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


_BY_CODE = {
    -_errno.EINVAL: InvalidArgument,
    -_errno.EOVERFLOW: InvalidArgument,
    -_errno.ENOENT: NotFound,
    -_errno.ECONNREFUSED: DaemonUnavailable,
    -_errno.ECONNRESET: DaemonUnavailable,
    -_errno.EPIPE: DaemonUnavailable,
    -_errno.ENOTCONN: DaemonUnavailable,
    -_errno.ECONNABORTED: DaemonUnavailable,
    -_errno.ESHUTDOWN: DaemonUnavailable,
    -_errno.ETIMEDOUT: Timeout,
    -_errno.ENOSPC: NoSpace,
    -_errno.ENOMEM: NoSpace,
    -_errno.E2BIG: TooBig,
    -_errno.EMFILE: TooBig,
    -_errno.ENAMETOOLONG: TooBig,
    -_errno.EPROTO: ProtocolError,
    -_errno.EPROTONOSUPPORT: ProtocolError,
    -_errno.EOPNOTSUPP: ShmUnavailable,
    -_errno.EEXIST: InstanceExists,
    -_errno.EBUSY: InstanceBusy,
    KVP_EPROTO: ProtocolError,
    KVP_EVERSION: ProtocolError,
    KVP_EBADSLOT: BadSlot,
    KVP_ENOSHM: ShmUnavailable,
    KVP_EPEER: UntrustedDaemon,
    -_errno.EPERM: UntrustedDaemon,
}


def from_code(code, op, strerror, message="", connecting=False):
    """Builds the exception for return code ``code`` of operation ``op``.

    ``strerror`` is the library's description of the code and ``message`` the daemon's text.
    While connecting, -ENOENT means "no socket" rather than "unknown instance".
    """
    cls = _BY_CODE.get(code, Error)
    if connecting and code in (-_errno.ENOENT, -_errno.EACCES):
        cls = DaemonUnavailable
    text = "%s: %s (%s)" % (op, strerror, code_name(code))
    if message:
        text += ": " + message
    return cls(text, code=code, message=message, op=op)
