"""Read (validated, memory-mapped) and write safetensors files without torch.

Format: 8-byte little-endian header length N, N bytes of JSON ``{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}``, then the data section. Offsets are relative
to the data section. Everything a corrupt file can get wrong is checked before any tensor is read,
and each error names the file and the value that disagrees.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ggufdspark.errors import CorruptFileError, InputNotFoundError, no_space_error

# safetensors dtype -> (itemsize, numpy dtype used to view the raw bytes)
DTYPES: dict[str, tuple[int, np.dtype]] = {
    "F64": (8, np.dtype("<f8")), "F32": (4, np.dtype("<f4")), "F16": (2, np.dtype("<f2")),
    "BF16": (2, np.dtype("<u2")), "I64": (8, np.dtype("<i8")), "I32": (4, np.dtype("<i4")),
    "I16": (2, np.dtype("<i2")), "I8": (1, np.dtype("i1")), "U8": (1, np.dtype("u1")),
    "BOOL": (1, np.dtype("?")),
}


@dataclass
class STensor:
    """One tensor's directory entry in a safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset in ``file``
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[dict[str, STensor], dict]:
    """Parse and validate a safetensors header. Returns (tensors, __metadata__).

    Raises:
        InputNotFoundError: missing or unreadable file.
        CorruptFileError: header length past the end of the file, invalid JSON, offsets outside the
            data section or overlapping, unknown dtype, or byte size that disagrees with dtype * shape.
    """
    path = Path(path)
    if not path.is_file():
        raise InputNotFoundError(f"{path}: no such file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CorruptFileError(f"{path}: not a safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise CorruptFileError(
                    f"{path}: header length {n} runs past the end of the file ({size} bytes): truncated or not safetensors")
            raw = f.read(n)
    except OSError as e:
        raise InputNotFoundError(f"{path}: cannot read: {e.strerror}") from None
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: invalid header JSON ({e})") from None
    if not isinstance(header, dict):
        raise CorruptFileError(f"{path}: header is a JSON {type(header).__name__}, expected an object")
    meta = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, STensor] = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype, shape, (b, e) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CorruptFileError(f"{path}: tensor {name}: malformed header entry {entry!r}") from None
        if dtype not in DTYPES:
            raise CorruptFileError(f"{path}: tensor {name}: unknown dtype {dtype!r}")
        if not (0 <= b <= e <= data_len):
            raise CorruptFileError(
                f"{path}: tensor {name}: data offsets [{b}, {e}] outside the data section of {data_len} bytes")
        t = STensor(name, dtype, shape, path, data_start + b, data_start + e)
        expected = t.n_elements * DTYPES[dtype][0]
        if t.nbytes != expected:
            raise CorruptFileError(
                f"{path}: tensor {name}: {t.nbytes} bytes for {dtype} {list(shape)}, expected {expected}")
        tensors[name] = t
        spans.append((b, e, name))
    spans.sort()
    for (b1, e1, n1), (b2, e2, n2) in zip(spans, spans[1:]):
        if b2 < e1:
            raise CorruptFileError(f"{path}: tensors {n1} and {n2} overlap in the data section")
    return tensors, meta


def open_checkpoint(directory: Path) -> dict[str, STensor]:
    """All tensors of a checkpoint directory: ``model.safetensors`` or a sharded index.

    Raises:
        InputNotFoundError: no safetensors file, or a shard named by the index is missing.
        CorruptFileError: any shard is corrupt, or the index is not valid JSON / disagrees with shards.
    """
    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CorruptFileError(f"{index}: not a valid safetensors index ({e})") from None
        tensors: dict[str, STensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = directory / shard
            if not shard_path.is_file():
                raise InputNotFoundError(f"{shard_path}: shard named by {index.name} is missing")
            part, _ = read_header(shard_path)
            tensors.update(part)
        missing = sorted(set(weight_map) - set(tensors))
        if missing:
            raise CorruptFileError(f"{index}: tensor {missing[0]} is listed but not in its shard "
                                   f"({len(missing)} missing)")
        return tensors
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise InputNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json")
    tensors = {}
    for f in files:
        part, _ = read_header(f)
        tensors.update(part)
    return tensors


class MappedFiles:
    """Memory maps of checkpoint files, opened once and released (page cache too) as we go."""

    def __init__(self):
        self._maps: dict[Path, mmap.mmap] = {}

    def view(self, t: STensor) -> memoryview:
        mm = self._maps.get(t.file)
        if mm is None:
            with open(t.file, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[t.file] = mm
        return memoryview(mm)[t.begin:t.end]

    def release(self, t: STensor) -> None:
        """Drop the pages of ``t`` from this process's resident set (keeps peak RSS bounded)."""
        mm = self._maps.get(t.file)
        if mm is None or not hasattr(mm, "madvise"):
            return
        page = mmap.PAGESIZE
        start = t.begin // page * page
        length = t.end - start
        try:
            mm.madvise(mmap.MADV_DONTNEED, start, length)
        except (OSError, ValueError, AttributeError):
            pass

    def close(self):
        for mm in self._maps.values():
            try:
                mm.close()
            except BufferError:
                pass
        self._maps.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def array(view: memoryview, t: STensor) -> np.ndarray:
    """A numpy view of a tensor's raw data (BF16 as uint16)."""
    return np.frombuffer(view, dtype=DTYPES[t.dtype][1]).reshape(t.shape)


# --------------------------------------------------------------------------- writing


def write_safetensors(path: Path, tensors: Iterable[tuple[str, str, tuple[int, ...], Iterator[bytes] | bytes]],
                      metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file. ``tensors`` yields (name, dtype, shape, data or chunk iterator).

    Shapes and dtypes must be known up front (the header comes first); data may be streamed.
    """
    items = list(tensors)
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in items:
        n = DTYPES[dtype][0]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".part")
    try:
        _write_parts(tmp, raw, items, header, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise no_space_error(e, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _write_parts(tmp: Path, raw: bytes, items: list, header: dict, path: Path) -> None:
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dtype, shape, data in items:
            want = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            got = 0
            for chunk in ([data] if isinstance(data, (bytes, bytearray, memoryview)) else data):
                f.write(chunk)
                got += len(memoryview(chunk).cast("B"))
            if got != want:
                raise ValueError(f"{path}: tensor {name} produced {got} bytes, expected {want}")
