"""Type aliases of the binding's signatures.

The binding accepts memory in many shapes (see _buffers.py), most of which have no common type
before Python 3.12's ``collections.abc.Buffer``. For type checkers the aliases below spell the
accepted types out; numpy and torch are imported only while type checking, so importing this
module imports neither. At run time every alias is ``typing.Any``: nothing introspects them,
and an alias naming numpy must not fail in an interpreter without numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Tuple, Union

if TYPE_CHECKING:
    import numpy
    import numpy.typing
    import torch
    from _typeshed import ReadableBuffer, WriteableBuffer

    # An object with the buffer protocol (bytes, bytearray, memoryview, array, mmap, numpy).
    Buffer = Union[ReadableBuffer, numpy.ndarray]
    # Memory the library reads: a buffer-protocol object, a numpy array, a torch CPU tensor or
    # a raw (address, nbytes) tuple.
    ReadMemory = Union[ReadableBuffer, numpy.ndarray, torch.Tensor, Tuple[int, int]]
    # Memory the library writes into: the same, writable.
    WriteMemory = Union[WriteableBuffer, numpy.ndarray, torch.Tensor, Tuple[int, int]]
    # A chunk the binding allocated: a numpy array of the chunk's shape, or a bytearray
    # without numpy.
    NewChunk = Union[numpy.ndarray, bytearray]
    # Token ids from the sequence's first token: ints, an array('I'), numpy or torch integers.
    TokenIds = Union[Iterable[int], numpy.ndarray, torch.Tensor]
    # A block table: ints, an array('i'), numpy or torch integers.
    BlockTable = Union[Iterable[int], numpy.ndarray, torch.Tensor]
    # A kvpool dtype name ("bfloat16", ...) or a numpy or torch dtype.
    DTypeLike = Union[str, numpy.typing.DTypeLike, torch.dtype]
    # The layers of a paged cache: one array per layer, or one array with a leading layer
    # dimension (numpy arrays, torch CPU tensors or shaped memoryviews).
    PagedLayers = Union[Iterable[Any], numpy.ndarray, torch.Tensor]
    # A tenant salt.
    Salt = Union[bytes, bytearray, str, None]
else:
    Buffer = ReadMemory = WriteMemory = NewChunk = TokenIds = BlockTable = DTypeLike = Any
    PagedLayers = Salt = Any

__all__ = ["Buffer", "ReadMemory", "WriteMemory", "NewChunk", "TokenIds", "BlockTable", "DTypeLike",
           "PagedLayers", "Salt"]
