"""Loading of libkvpool.so and the ctypes declarations of its API.

The library is looked up, in order, at:

1. ``$KVPOOL_LIB``: a path to the shared object, or a directory holding ``libkvpool.so``;
2. the build tree of a source checkout, next to ``python/``: ``<repo>/build/lib/libkvpool.so``
   (the normal build), then the other ``<repo>/build*/lib/libkvpool.so`` by name, skipping
   sanitizer builds (``make test`` creates ``build-asan/``, ``build-tsan/`` and ``build-fuzz/``):
   a library built with ASan or TSan cannot be loaded into an uninstrumented interpreter;
3. the installed prefix: the dynamic loader's search path (``libkvpool.so.1``, then
   ``libkvpool.so``), then ``<sys.prefix>/lib``.

A library whose major version differs from :data:`SUPPORTED_MAJOR` is refused with
:class:`kvpool.LibraryError`: its structures may not match the declarations below.

The structures mirror ``include/kvpool.h`` and ``include/kvpool_paged.h`` field for field;
ctypes applies the platform's C alignment rules, so the layouts match the C compiler's.
"""

from __future__ import annotations

import ctypes
import glob
import mmap
import os
import sys
import threading
from typing import Dict, Iterator, List, Optional, Tuple

from .errors import LibraryError

SUPPORTED_MAJOR = 1

c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_int = ctypes.c_int
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_size_t = ctypes.c_size_t

KVP_TRANSPORT_AUTO = 0
KVP_TRANSPORT_SHM = 1
KVP_TRANSPORT_INLINE = 2

KVP_PAGED_NHD = 0
KVP_PAGED_HND = 1
KVP_PAGED_MLA = 2
KVP_PAGED_KV_FIRST = 0x1


KVP_OPT_SYNC_COMMIT = 0x1  # kvp_opts.flags: wait for every commit's answer (kvpool.h)


class kvp_opts(ctypes.Structure):
    _fields_ = [("socket_path", c_char_p), ("timeout_ms", c_u32), ("trust_uid", c_u32),
                ("flags", c_u32), ("reserved_", c_u32 * 7)]


class kvp_stat(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 48), ("value", c_u64)]


class kvp_register_opts(ctypes.Structure):
    _fields_ = [
        ("instance_id", c_char_p),
        ("model_name", c_char_p),
        ("world_size", c_u32),
        ("worker_rank", c_u32),
        ("block_size", c_u32),
        ("num_layers", c_u32),
        ("hidden_dim", c_u32),
        ("dtype", c_char_p),
        ("use_mla", c_u32),
        ("transport", c_u32),
        ("reserved_", c_u32 * 8),
    ]


class kvp_instance_info(ctypes.Structure):
    _fields_ = [
        ("transport", c_u32),
        ("chunk_tokens", c_u32),
        ("ndim", c_u32),
        ("shape", c_u32 * 4),
        ("chunk_bytes", c_u64),
        ("dtype_size", c_u32),
        ("existing", c_u32),
        ("dtype", ctypes.c_char * 24),
        ("shm_name", ctypes.c_char * 128),
        ("reason", ctypes.c_char * 256),
    ]


class kvp_tokens(ctypes.Structure):
    _fields_ = [
        ("ids", ctypes.POINTER(c_u32)),
        ("count", c_u32),
        ("salt_len", c_u32),
        ("salt", c_void_p),
    ]


class kvp_slot(ctypes.Structure):
    _fields_ = [
        ("chunk_index", c_u32),
        ("reserved_", c_u32),
        ("offset", c_u64),
        ("length", c_u64),
        ("data", c_void_p),
    ]


class kvp_store_plan(ctypes.Structure):
    _fields_ = [
        ("reservation", c_u64),
        ("nchunks", c_u32),
        ("cached", c_u32),
        ("busy", c_u32),
        ("no_space", c_u32),
        ("nslots", c_u32),
        ("slots", ctypes.POINTER(kvp_slot)),
    ]


class kvp_retrieve_plan(ctypes.Structure):
    _fields_ = [
        ("pin", c_u64),
        ("nchunks", c_u32),
        ("nslots", c_u32),
        ("slots", ctypes.POINTER(kvp_slot)),
    ]


class kvp_store_result(ctypes.Structure):
    _fields_ = [
        ("nchunks", c_u32),
        ("stored", c_u32),
        ("cached", c_u32),
        ("busy", c_u32),
        ("no_space", c_u32),
    ]


class kvp_paged_cache(ctypes.Structure):
    _fields_ = [
        ("layout", c_u32),
        ("flags", c_u32),
        ("num_layers", c_u32),
        ("num_blocks", c_u32),
        ("block_size", c_u32),
        ("heads", c_u32),
        ("head_dim", c_u32),
        ("elem_size", c_u32),
        ("layer_bytes", c_u64),
        ("layers", ctypes.POINTER(c_void_p)),
    ]


_P = ctypes.POINTER

# name: (restype, argtypes). Every function of kvpool.h and kvpool_paged.h.
_PROTOTYPES: Dict[str, Tuple[Optional[type], List[type]]] = {
    "kvp_version": (c_u32, []),
    "kvp_strerror": (c_char_p, [c_int]),
    "kvp_err_name": (c_char_p, [c_int]),
    "kvp_default_socket_path": (c_int, [ctypes.c_char_p, c_size_t]),
    "kvp_client_open": (c_int, [_P(kvp_opts), _P(c_void_p)]),
    "kvp_client_close": (None, [c_void_p]),
    "kvp_last_error": (c_char_p, [c_void_p]),
    "kvp_ping": (c_int, [c_void_p]),
    "kvp_stats": (c_int, [c_void_p, _P(kvp_stat), c_size_t]),
    "kvp_register": (c_int, [c_void_p, _P(kvp_register_opts), _P(c_void_p)]),
    "kvp_unregister": (c_int, [c_void_p]),
    "kvp_instance_get_info": (_P(kvp_instance_info), [c_void_p]),
    "kvp_lookup": (c_int, [c_void_p, _P(kvp_tokens)]),
    "kvp_chunk_count": (c_int, [c_void_p, c_u32, c_u32, c_u32]),
    "kvp_prepare_store": (c_int, [c_void_p, _P(kvp_tokens), c_u32, c_u32, _P(kvp_store_plan)]),
    "kvp_commit_store": (c_int, [c_void_p, _P(kvp_store_plan)]),
    "kvp_abort_store": (c_int, [c_void_p, _P(kvp_store_plan)]),
    "kvp_store_inline": (c_int, [c_void_p, _P(kvp_store_plan), _P(c_void_p)]),
    "kvp_prepare_retrieve": (c_int, [c_void_p, _P(kvp_tokens), c_u32, c_u32,
                                     _P(kvp_retrieve_plan)]),
    "kvp_commit_retrieve": (c_int, [c_void_p, _P(kvp_retrieve_plan)]),
    "kvp_store": (c_int, [c_void_p, _P(kvp_tokens), c_u32, c_u32, _P(c_void_p),
                          _P(kvp_store_result)]),
    "kvp_retrieve": (c_int, [c_void_p, _P(kvp_tokens), c_u32, c_u32, _P(c_void_p)]),
    "kvp_paged_chunk_bytes": (c_int, [_P(kvp_paged_cache), c_u32, _P(c_u64)]),
    "kvp_paged_gather": (c_int, [_P(kvp_paged_cache), _P(ctypes.c_int32), c_u32, c_u32, c_u32,
                                 c_void_p, c_u64, c_u32]),
    "kvp_paged_scatter": (c_int, [_P(kvp_paged_cache), _P(ctypes.c_int32), c_u32, c_u32, c_u32,
                                  c_u32, c_void_p, c_u64, c_u32]),
}

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_path: Optional[str] = None


def _candidates() -> Iterator[Tuple[str, str]]:
    """Yields (description, path-or-soname) in search order."""
    env = os.environ.get("KVPOOL_LIB")
    if env:
        if os.path.isdir(env):
            env = os.path.join(env, "libkvpool.so")
        yield ("$KVPOOL_LIB", env)
        return
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    normal = os.path.join(repo, "build", "lib", "libkvpool.so")
    others = sorted(glob.glob(os.path.join(repo, "build?*", "lib", "libkvpool.so")))
    for build in [normal] + others:
        yield ("build tree", build)
    for soname in ("libkvpool.so.%d" % SUPPORTED_MAJOR, "libkvpool.so"):
        yield ("loader path", soname)
    for libdir in ("lib", "lib64"):
        yield ("prefix", os.path.join(sys.prefix, libdir, "libkvpool.so"))


# Options of a sanitizer build in a build directory's CMakeCache.txt, and the symbols every
# ASan- or TSan-instrumented object references (gcc and clang alike, whatever the build flags).
_SANITIZER_OPTIONS = ("KVP_ASAN:BOOL=ON", "KVP_TSAN:BOOL=ON", "KVP_FUZZ:BOOL=ON")
_SANITIZER_SYMBOLS = (b"__asan_init", b"__tsan_init")


def _sanitizer_build(path: str) -> Optional[str]:
    """Why the library at path (in <build>/lib/) is a sanitizer build, or None."""
    cache = os.path.join(os.path.dirname(os.path.dirname(path)), "CMakeCache.txt")
    try:
        with open(cache, "r", errors="replace") as f:
            for line in f:
                if line.strip() in _SANITIZER_OPTIONS:
                    return "sanitizer build, %s in %s" % (line.strip(), cache)
    except OSError:
        pass
    try:
        with open(path, "rb") as lib, mmap.mmap(lib.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for sym in _SANITIZER_SYMBOLS:
                if m.find(sym) >= 0:
                    return "sanitizer build, references %s" % sym.decode()
    except (OSError, ValueError):
        pass
    return None


def _declare(lib: ctypes.CDLL, path: str) -> None:
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise LibraryError("%s does not export %s: not a kvpool %d.x client library"
                               % (path, name, SUPPORTED_MAJOR)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def load() -> ctypes.CDLL:
    """Returns the loaded library (a ``ctypes.CDLL``), loading it on first use.

    Raises :class:`kvpool.LibraryError` when no usable library is found; the message lists
    every place that was tried.
    """
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        tried: List[str] = []
        for where, cand in _candidates():
            if os.sep in cand and not os.path.exists(cand):
                tried.append("%s: %s (missing)" % (where, cand))
                continue
            skip = _sanitizer_build(cand) if where == "build tree" else None
            if skip:
                tried.append("%s: %s (skipped: %s)" % (where, cand, skip))
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append("%s: %s (%s)" % (where, cand, e))
                continue
            if not hasattr(lib, "kvp_version"):
                raise LibraryError("%s is not a kvpool client library (no kvp_version)" % cand)
            lib.kvp_version.restype = c_u32
            lib.kvp_version.argtypes = []
            v = lib.kvp_version()
            major = v >> 16
            if major != SUPPORTED_MAJOR:
                raise LibraryError(
                    "%s is libkvpool %d.%d.%d, but this binding needs major version %d; "
                    "point KVPOOL_LIB at a matching library"
                    % (cand, major, (v >> 8) & 0xFF, v & 0xFF, SUPPORTED_MAJOR))
            _declare(lib, cand)
            _lib, _path = lib, cand
            return lib
        raise LibraryError("libkvpool.so not found; set KVPOOL_LIB. Tried: " + "; ".join(tried))


def library_path() -> str:
    """Path (or soname) of the loaded library, loading it if needed."""
    load()
    assert _path is not None  # load() sets both or raises
    return _path


def strerror(code: int) -> str:
    """The library's description of a return code."""
    s = load().kvp_strerror(code)
    return s.decode("utf-8", "replace") if s else "error %d" % code


def err_name(code: int) -> str:
    """The library's symbolic name of a return code: ``"KVP_EPROTO"`` for kvpool's own
    codes, ``"EINVAL"`` for errno values, ``"OK"`` for ``code >= 0``, ``"E<n>"`` for a code it
    does not know."""
    s = load().kvp_err_name(code)
    return s.decode("utf-8", "replace") if s else "E%d" % -code
