"""Addresses and sizes of the memory objects the binding accepts, and dtype tables.

Accepted objects: anything with the buffer protocol (``bytes``, ``bytearray``, ``memoryview``,
``array.array``, ``mmap``, numpy arrays), torch CPU tensors, and raw ``(address, nbytes)``
tuples. Memory must be C-contiguous; writable where the library writes into it.

numpy and torch are optional: numpy is imported when installed, torch is never imported by the
binding (a tensor is recognised only when the caller's program has imported torch).
"""

from __future__ import annotations

import ctypes
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

from ._types import DTypeLike, NewChunk, ReadMemory
from .errors import InvalidArgument

if TYPE_CHECKING:
    import torch
    from typing_extensions import TypeGuard

try:  # optional
    import numpy as np
except ImportError:  # pragma: no cover - exercised when numpy is absent
    # The checker sees numpy's module type; callers test `np is not None` first.
    np = None  # type: ignore[assignment]


def numpy_missing(what: str) -> InvalidArgument:
    """The error for a call that needs numpy in an interpreter that has none."""
    return InvalidArgument(
        "%s needs numpy, which is not installed in this interpreter (%s): install it there "
        "(python3 -m pip install numpy; for Debian's /usr/bin/python3: apt-get install "
        "python3-numpy), or use bytes, bytearray or memoryview buffers" % (what, sys.executable))


# kvpool dtype name -> numpy dtype name. numpy has no bfloat16 or float8: raw integer views.
NUMPY_DTYPES: Dict[str, str] = {
    "float16": "float16",
    "bfloat16": "uint16",
    "float32": "float32",
    "float64": "float64",
    "int8": "int8",
    "uint8": "uint8",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
}

DTYPE_SIZES: Dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def torch_module() -> Optional[ModuleType]:
    """The torch module if the program has imported it, else None."""
    return sys.modules.get("torch")


def is_tensor(obj: object) -> TypeGuard[torch.Tensor]:
    torch = torch_module()
    return torch is not None and isinstance(obj, torch.Tensor)


def torch_dtype(name: str) -> Any:
    """The torch dtype for a kvpool dtype name (requires torch)."""
    torch = torch_module()
    if torch is None:
        import torch as imported  # an explicit request for a tensor view: import it
        torch = imported
    dt = getattr(torch, name, None)
    if dt is None:
        raise InvalidArgument("this torch has no dtype %s" % name)
    return dt


def dtype_name(dtype: DTypeLike) -> str:
    """Normalises a dtype given as a kvpool name, a numpy dtype or a torch dtype to a name."""
    if isinstance(dtype, str):
        return dtype
    s = str(dtype)
    if s.startswith("torch."):
        return s[len("torch."):]
    if np is not None:
        try:
            return np.dtype(dtype).name
        except TypeError:
            pass
    raise InvalidArgument("dtype must be a name such as 'float16', not %r" % (dtype,))


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None

_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1


@contextmanager
def address_of(obj: ReadMemory, writable: bool,
               what: str = "buffer") -> Iterator[Tuple[int, int]]:
    """Yields (address, nbytes) of obj's memory, holding a buffer export while in use.

    Raises InvalidArgument for objects that are not contiguous, not writable when they must
    be, live on another device, or do not expose memory.
    """
    if isinstance(obj, tuple):
        if len(obj) != 2 or not all(isinstance(v, int) for v in obj) or obj[0] <= 0 or obj[1] < 0:
            raise InvalidArgument("%s: raw memory must be an (address, nbytes) tuple" % what)
        yield (obj[0], obj[1])
        return
    if np is not None and isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgument("%s: numpy array must be C-contiguous" % what)
        if writable and not obj.flags.writeable:
            raise InvalidArgument("%s: numpy array is read-only" % what)
        yield (obj.ctypes.data, obj.nbytes)
        return
    if is_tensor(obj):
        if obj.device.type != "cpu":
            raise InvalidArgument("%s: tensor must be on the CPU, not %s" % (what, obj.device))
        if not obj.is_contiguous():
            raise InvalidArgument("%s: tensor must be contiguous" % what)
        yield (obj.data_ptr(), obj.numel() * obj.element_size())
        return
    view = _PyBuffer()
    flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
    try:
        _get_buffer(obj, ctypes.byref(view), flags)
    except (BufferError, TypeError, ValueError) as e:
        raise InvalidArgument("%s: %s does not expose %scontiguous memory: %s"
                              % (what, type(obj).__name__, "writable " if writable else "", e)
                              ) from None
    try:
        # A zero-length buffer may have a NULL address; callers check sizes before use.
        yield (view.buf or 0, view.len)
    finally:
        _release_buffer(ctypes.byref(view))


def new_chunk(nbytes: int, shape: Tuple[int, ...], dtype: str, as_numpy: bool) -> NewChunk:
    """A new uninitialised chunk buffer: a numpy array of the chunk's shape, or a bytearray."""
    if as_numpy:
        if np is None:
            raise numpy_missing("as_numpy=True")
        return np.empty(shape, dtype=NUMPY_DTYPES[dtype])
    return bytearray(nbytes)
