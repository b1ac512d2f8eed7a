"""Write GGUF files in one streaming pass.

All tensor shapes and types are declared first, so offsets are known before any data is written;
then each tensor's bytes are produced (in chunks) and written straight to disk. Peak memory is one
chunk, whatever the model's size. The file is written under a temporary name beside the target and
renamed into place only when complete, so a failure leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import queue
import struct
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ggufdspark import interrupts
from ggufdspark.errors import GgufdsparkError, OutputExistsError, no_space_error
from ggufdspark.gguffile.constants import (DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, SCALAR_FORMAT,
                                           TYPE_SIZES, TensorType, ValueType)

Chunks = Iterable[bytes | memoryview]


@dataclass
class _PlannedTensor:
    name: str
    shape: tuple[int, ...]  # numpy order
    ttype: TensorType
    nbytes: int
    offset: int = 0


def tensor_nbytes(shape: tuple[int, ...], ttype: TensorType) -> int:
    block, size = TYPE_SIZES[ttype]
    n = 1
    for d in shape:
        n *= d
    if shape and shape[-1] % block:
        raise ValueError(f"row length {shape[-1]} is not a multiple of {ttype.name}'s block of {block}")
    return n // block * size


def _pack_string(s: str) -> bytes:
    raw = s.encode("utf-8", errors="surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _pack_value(vtype: ValueType, value: Any, item_type: ValueType | None) -> bytes:
    if vtype == ValueType.STRING:
        return _pack_string(value)
    if vtype == ValueType.ARRAY:
        assert item_type is not None
        out = [struct.pack("<IQ", int(item_type), len(value))]
        if item_type == ValueType.STRING:
            out.extend(_pack_string(v) for v in value)
        else:
            fmt = SCALAR_FORMAT[item_type]
            out.append(struct.pack("<" + fmt[1] * len(value), *value))
        return b"".join(out)
    return struct.pack(SCALAR_FORMAT[vtype], value)


class GGUFWriter:
    """Plan a GGUF file (metadata + tensor directory), then stream its tensor data.

    Example::

        w = GGUFWriter("out.gguf")
        w.add_string("general.architecture", "dflash")
        w.add_tensor("fc.weight", (2048, 10240), TensorType.F16)
        sha = w.write(lambda name: produce_chunks(name))
    """

    def __init__(self, path: str | os.PathLike, *, alignment: int = DEFAULT_ALIGNMENT):
        self.path = Path(path)
        self.alignment = alignment
        self._kv: dict[str, tuple[ValueType, Any, ValueType | None]] = {}
        self._tensors: list[_PlannedTensor] = []

    # -- metadata
    def add(self, key: str, value: Any, vtype: ValueType | int, item_type: ValueType | int | None = None):
        vtype = ValueType(vtype)
        item_type = ValueType(item_type) if item_type is not None else None
        if vtype == ValueType.ARRAY and item_type is None:
            raise ValueError(f"array key {key} needs an item type")
        self._kv[key] = (vtype, value, item_type)

    def add_string(self, key: str, value: str):
        self.add(key, value, ValueType.STRING)

    def add_uint32(self, key: str, value: int):
        self.add(key, int(value), ValueType.UINT32)

    def add_int32(self, key: str, value: int):
        self.add(key, int(value), ValueType.INT32)

    def add_float32(self, key: str, value: float):
        self.add(key, float(value), ValueType.FLOAT32)

    def add_bool(self, key: str, value: bool):
        self.add(key, bool(value), ValueType.BOOL)

    def add_array(self, key: str, values: list, item_type: ValueType | int):
        self.add(key, list(values), ValueType.ARRAY, item_type)

    @property
    def keys(self) -> list[str]:
        return list(self._kv)

    # -- tensors
    def add_tensor(self, name: str, shape: tuple[int, ...], ttype: TensorType):
        if any(t.name == name for t in self._tensors):
            raise ValueError(f"duplicate tensor {name}")
        self._tensors.append(_PlannedTensor(name, tuple(shape), TensorType(ttype),
                                            tensor_nbytes(tuple(shape), TensorType(ttype))))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self._tensors)

    def _header(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))]
        for key, (vtype, value, itype) in self._kv.items():
            parts += [_pack_string(key), struct.pack("<I", int(vtype)), _pack_value(vtype, value, itype)]
        offset = 0
        for t in self._tensors:
            t.offset = offset
            ne = tuple(reversed(t.shape))
            parts += [_pack_string(t.name), struct.pack("<I", len(ne)),
                      struct.pack(f"<{len(ne)}Q", *ne), struct.pack("<IQ", int(t.ttype), offset)]
            offset += self._pad(t.nbytes)
        header = b"".join(parts)
        return header + b"\0" * (self._pad(len(header)) - len(header))

    def _pad(self, n: int) -> int:
        return (n + self.alignment - 1) // self.alignment * self.alignment

    def write(self, produce: Callable[[str], Chunks], *, force: bool = False,
              progress: Callable[[int, int, str], None] | None = None) -> str:
        """Write the file. ``produce(name)`` yields each tensor's bytes in order, in chunks.

        Returns:
            The sha256 of the written file.

        Raises:
            OutputExistsError: the path exists and ``force`` is false.
            ValueError: a tensor produced a different number of bytes than declared.
        """
        if self.path.exists() and not force:
            raise OutputExistsError(f"{self.path}: already exists (use --force to overwrite)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        total = self.total_bytes
        done = 0
        tmp = None
        try:
            with interrupts.held():  # a stop signal between creating the .part and owning it: raised after
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".part", dir=self.path.parent)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; the output gets the usual permissions
            with os.fdopen(fd, "wb", buffering=0) as f, _Sink(f) as put:
                put(self._header())
                for t in self._tensors:
                    n = 0
                    for chunk in produce(t.name):
                        n += chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)
                        put(chunk)
                        if progress:
                            progress(done + n, total, t.name)
                    if n != t.nbytes:
                        raise ValueError(f"tensor {t.name}: produced {n} bytes, expected {t.nbytes}")
                    done += n
                    pad = self._pad(n) - n
                    if pad:
                        put(b"\0" * pad)
            os.replace(tmp, self.path)
        except BaseException as e:
            try:
                if tmp is not None:
                    os.unlink(tmp)
            except FileNotFoundError:
                pass
            if isinstance(e, OSError) and not isinstance(e, GgufdsparkError):
                raise no_space_error(e, self.path) from None
            raise
        return put.hexdigest()


class _Sink:
    """Hash and write buffers on a background thread while the caller produces the next ones.

    Both ``hashlib`` and file writes release the GIL on large buffers, so conversion, hashing and
    writing overlap. The queue is short, which bounds the memory held in flight.
    """

    def __init__(self, f, depth: int = 3):
        self.f = f
        self.sha = hashlib.sha256()
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="gguf-writer", daemon=True)

    def _run(self) -> None:
        while True:
            b = self.q.get()
            if b is None:
                return
            if self.error is None:
                try:
                    self.sha.update(b)
                    self.f.write(b)
                except BaseException as e:  # noqa: BLE001 - re-raised in the producer
                    self.error = e

    def __call__(self, b) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(b)

    def hexdigest(self) -> str:
        return self.sha.hexdigest()

    def __enter__(self) -> "_Sink":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


def iter_chunks(data: memoryview | bytes, size: int = 16 << 20) -> Iterator[memoryview]:
    mv = memoryview(data)
    for i in range(0, len(mv), size):
        yield mv[i:i + size]
