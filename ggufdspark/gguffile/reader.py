"""Read GGUF headers (metadata and tensor directory) without loading tensor data.

The file is memory-mapped and only the header pages are touched, so reading a multi-GB model's
metadata costs milliseconds and almost no memory. Tensor bytes are available on demand as
read-only numpy views (``GGUFFile.tensor_bytes``).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggufdspark.errors import CorruptFileError, InputNotFoundError
from ggufdspark.gguffile.constants import (DEFAULT_ALIGNMENT, GGUF_MAGIC, SCALAR_FORMAT, TYPE_SIZES,
                                           Key, TensorType, ValueType)

if TYPE_CHECKING:  # numpy is imported where tensor data is read: a header read needs none
    import numpy as np

# Arrays of arrays are legal GGUF but no real model nests them; llama.cpp's own reader refuses any.
MAX_ARRAY_DEPTH = 4
# The most items one metadata array, and all of a header's arrays together, may hold. The largest
# real arrays are tokenizers' (a few hundred thousand tokens or merges); a count the file can hold
# is no proof of sense: 12 M empty strings (8 bytes each, a 96 MB header) took 9 s and 218 MB to
# read into a list before anything was said.
MAX_ARRAY_ITEMS = 4 << 20
MAX_HEADER_ITEMS = 8 << 20
_INTEGER_TYPES = frozenset({ValueType.UINT8, ValueType.INT8, ValueType.UINT16, ValueType.INT16, ValueType.UINT32,
                            ValueType.INT32, ValueType.UINT64, ValueType.INT64})


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: for messages that quote a value from a file
    (repr escapes control characters and undecodable bytes)."""
    if isinstance(value, list) and len(value) > 8:
        text = repr(value[:8])[:-1] + f", ... ({len(value)} items)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _kind(value: Any) -> str:
    """How a decoded metadata value reads in a message: 'string', 'integer array', 'float'..."""
    if isinstance(value, list):
        kinds = {_kind(v) for v in value}
        return "empty array" if not kinds else f"{kinds.pop()} array" if len(kinds) == 1 else "mixed array"
    return {bool: "boolean", int: "integer", float: "float", str: "string"}.get(type(value), type(value).__name__)


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (outermost first), i.e. GGUF ne reversed
    type: int
    offset: int  # absolute offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return TensorType(self.type).name
        except ValueError:
            return f"type{self.type}"

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass
class GGUFFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, tuple[int, int | None]]  # key -> (type, array item type)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    data_offset: int = 0
    file_size: int = 0

    @property
    def arch(self) -> str | None:
        return self.get_str(Key.ARCH)

    def get(self, template: str, default: Any = None) -> Any:
        """Metadata value; ``{arch}`` in the key is filled with this file's architecture."""
        return self.metadata.get(template.format(arch=self.arch), default)

    # -- typed accessors: a key of the wrong type or shape is one CorruptFileError naming the file,
    # the key and the value, never an IndexError or TypeError three calls later
    def _wrong(self, key: str, value: Any, expected: str) -> CorruptFileError:
        return CorruptFileError(f"{self.path}: {key} is {_kind(value)} {shown(value)}, expected {expected}")

    def get_int(self, template: str, default: int | None = None) -> int | None:
        """An integer value (``{arch}`` filled in), or ``default`` when the key is absent.

        Raises:
            CorruptFileError: the key holds anything but an integer (a string, a float, an array...).
        """
        key = template.format(arch=self.metadata.get(Key.ARCH))
        value = self.metadata.get(key)
        if value is None:
            return default
        if type(value) is not int:
            raise self._wrong(key, value, "an integer")
        return value

    def get_int_list(self, template: str) -> list[int] | None:
        """An array of integers, or None when absent. Raises CorruptFileError on any other type."""
        key = template.format(arch=self.metadata.get(Key.ARCH))
        value = self.metadata.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(type(v) is not int for v in value):
            raise self._wrong(key, value, "an integer array")
        return value

    def get_str(self, template: str) -> str | None:
        """A string value, or None when absent. Raises CorruptFileError on any other type."""
        key = template if template == Key.ARCH else template.format(arch=self.metadata.get(Key.ARCH))
        value = self.metadata.get(key)
        if value is not None and not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def get_str_list(self, template: str) -> list[str] | None:
        """An array of strings, or None when absent. Raises CorruptFileError on any other type."""
        key = template.format(arch=self.metadata.get(Key.ARCH))
        value = self.metadata.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
            raise self._wrong(key, value, "a string array")
        return value

    def tensor_shape(self, name: str, ndim: int) -> tuple[int, ...] | None:
        """A tensor's shape (numpy order), or None when the tensor is absent.

        Raises:
            CorruptFileError: the tensor has another number of dimensions than ``ndim``.
        """
        t = self.tensors.get(name)
        if t is None:
            return None
        if len(t.shape) != ndim:
            raise CorruptFileError(f"{self.path}: tensor {name} has shape {list(t.shape)}, expected {ndim} dimensions")
        return t.shape

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor as a read-only uint8 view (memory-mapped)."""
        import numpy as np

        t = self.tensors[name]
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))

    def tensor_array(self, name: str) -> np.ndarray:
        """Unquantized tensors (F32/F16/BF16-as-uint16/I*) as typed numpy arrays in numpy shape."""
        import numpy as np

        t = self.tensors[name]
        dtype = {TensorType.F32: np.float32, TensorType.F16: np.float16, TensorType.BF16: np.uint16,
                 TensorType.I8: np.int8, TensorType.I16: np.int16, TensorType.I32: np.int32,
                 TensorType.I64: np.int64, TensorType.F64: np.float64}.get(TensorType(t.type))
        if dtype is None:
            raise ValueError(f"{self.path}: tensor {name} is {t.type_name}, not a plain array type")
        return self.tensor_bytes(name).view(dtype).reshape(t.shape)


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path
        self.items = 0  # array items read so far (MAX_HEADER_ITEMS)

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise CorruptFileError(
                f"{self.path}: truncated GGUF header: {what} at byte {self.pos} needs {n} bytes, "
                f"file has {len(self.buf)}")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v[0] if len(v) == 1 else v

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        if n > 1 << 30:
            raise CorruptFileError(f"{self.path}: {what} at byte {self.pos - 8} claims a {n}-byte string")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="surrogateescape")


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> tuple[Any, int | None]:
    try:
        vt = ValueType(vtype)
    except ValueError:
        raise CorruptFileError(f"{cur.path}: key {key!r} has unknown value type {vtype}") from None
    if vt == ValueType.STRING:
        return cur.string(f"value of {key!r}"), None
    if vt == ValueType.ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise CorruptFileError(f"{cur.path}: key {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
        itype = cur.unpack("<I", f"array type of {key!r}")
        count = cur.unpack("<Q", f"array length of {key!r}")
        try:
            it = ValueType(itype)
        except ValueError:
            raise CorruptFileError(f"{cur.path}: array {key!r} has unknown item type {itype}") from None
        # every item takes at least this many bytes: a count the rest of the file cannot hold is
        # refused before a list of that length is built (a 40-byte file must not allocate gigabytes)
        least = {ValueType.STRING: 8, ValueType.ARRAY: 12}.get(it) or struct.calcsize(SCALAR_FORMAT[it])
        left = len(cur.buf) - cur.pos
        cur.items += count
        if count > MAX_ARRAY_ITEMS:
            raise CorruptFileError(f"{cur.path}: array {key!r} claims {count} {it.name} items, more than any model's "
                                   f"metadata holds (at most {MAX_ARRAY_ITEMS} an array)")
        if cur.items > MAX_HEADER_ITEMS:
            raise CorruptFileError(f"{cur.path}: array {key!r} brings the header's array items to {cur.items}, more "
                                   f"than any model's metadata holds (at most {MAX_HEADER_ITEMS})")
        if count * least > left:
            raise CorruptFileError(f"{cur.path}: truncated or corrupt GGUF header: array {key!r} claims "
                                   f"{count} {it.name} items, the {left} bytes left hold at most {left // least}")
        if it == ValueType.STRING:
            return [cur.string(f"item of {key!r}") for _ in range(count)], itype
        if it == ValueType.ARRAY:
            return [_read_value(cur, ValueType.ARRAY, key, depth + 1)[0] for _ in range(count)], itype
        fmt = SCALAR_FORMAT[it]
        size = struct.calcsize(fmt)
        cur.need(size * count, f"array {key!r}")
        values = list(struct.unpack_from(f"{fmt[0]}{count}{fmt[1:]}", cur.buf, cur.pos))
        cur.pos += size * count
        return values, itype
    return cur.unpack(SCALAR_FORMAT[vt], f"value of {key!r}"), None


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse a GGUF file's header.

    Raises:
        InputNotFoundError: the path does not exist or is not a readable file.
        CorruptFileError: not a GGUF file, or its header is truncated or inconsistent.
    """
    path = Path(path)
    if not path.exists():
        raise InputNotFoundError(f"{path}: no such file")
    if not path.is_file():
        raise InputNotFoundError(f"{path}: not a regular file")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputNotFoundError(f"{path}: cannot open: {e.strerror}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise CorruptFileError(f"{path}: not a GGUF file ({size} bytes, too short for a header)")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, memoryview(mm), size)
    finally:
        try:
            mm.close()
        except BufferError:
            pass


def _parse(path: Path, buf: memoryview, size: int) -> GGUFFile:
    cur = _Cursor(buf, path)
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise CorruptFileError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    if version not in (2, 3):
        raise CorruptFileError(f"{path}: unsupported GGUF version {version} (expected 3)")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    # a key takes at least 12 bytes (length, type), a tensor entry at least 24 (name length, dims,
    # type, offset): counts the file cannot hold are refused before any loop runs
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise CorruptFileError(f"{path}: implausible header ({n_tensors} tensors, {n_kv} keys)")
    if n_kv * 12 + n_tensors * 24 > size - cur.pos:
        raise CorruptFileError(f"{path}: truncated or corrupt GGUF header: {n_kv} keys and {n_tensors} "
                               f"tensors cannot fit in a {size}-byte file")
    meta: dict[str, Any] = {}
    vtypes: dict[str, tuple[int, int | None]] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        if key in meta:
            raise CorruptFileError(f"{path}: key {key!r} appears twice")
        vtype = cur.unpack("<I", f"value type of {key!r}")
        value, itype = _read_value(cur, vtype, key)
        meta[key] = value
        vtypes[key] = (vtype, itype)
    raw_tensors = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        if name in seen:
            raise CorruptFileError(f"{path}: tensor {name!r} appears twice")
        seen.add(name)
        n_dims = cur.unpack("<I", f"dims of {name}")
        if n_dims > 8:
            raise CorruptFileError(f"{path}: tensor {name} claims {n_dims} dimensions")
        ne = [cur.unpack("<Q", f"shape of {name}") for _ in range(n_dims)]
        ttype = cur.unpack("<I", f"type of {name}")
        off = cur.unpack("<Q", f"offset of {name}")
        raw_tensors.append((name, ne, ttype, off))
    align = meta.get(Key.ALIGNMENT, DEFAULT_ALIGNMENT)
    # llama.cpp requires a power of two; 0 would divide by zero, a string would not compute at all
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise CorruptFileError(f"{path}: {Key.ALIGNMENT} is {_kind(align)} {shown(align)}, "
                               "expected a power-of-two integer")
    data_offset = (cur.pos + align - 1) // align * align
    tensors: dict[str, TensorInfo] = {}
    for name, ne, ttype, off in raw_tensors:
        try:
            block, tsize = TYPE_SIZES[TensorType(ttype)]
        except (ValueError, KeyError):
            raise CorruptFileError(f"{path}: tensor {name} has unknown ggml type {ttype}") from None
        n = 1
        for d in ne:
            n *= d
        nbytes = n // block * tsize
        start = data_offset + off
        if start + nbytes > size:
            raise CorruptFileError(
                f"{path}: tensor {name} data ends at byte {start + nbytes}, past the end of the file "
                f"({size} bytes): truncated?")
        tensors[name] = TensorInfo(name, tuple(reversed(ne)), ttype, start, nbytes)
    return GGUFFile(path=path, version=version, metadata=meta, value_types=vtypes, tensors=tensors,
                    data_offset=data_offset, file_size=size)
