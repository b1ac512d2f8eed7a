"""Element-type conversion for the output types we write (F32, F16, BF16, Q8_0), chunk by chunk.

The results are bit-identical to ggml's reference (``ggml_compute_fp32_to_bf16``,
``quantize_row_q8_0_ref``): every source value goes through float32 first, as the reference does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import numpy as np

from ggufdspark.gguffile.constants import TensorType

ROW_CHUNK_ELEMENTS = 1 << 22  # about 16 MB of float32 per step


def to_f32(raw: np.ndarray, src_dtype: str) -> np.ndarray:
    """Raw safetensors values (BF16 as uint16) to float32."""
    if src_dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if src_dtype == "F32":
        return raw
    return raw.astype(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (n & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = ((n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16)
    if nan.any():
        rounded = np.where(nan, ((n & np.uint32(0xFFFF0000)) | np.uint32(64 << 16)) >> 16, rounded).astype(np.uint16)
    return rounded


def _roundf(a: np.ndarray) -> np.ndarray:
    """C ``roundf``: half away from zero."""
    m = np.abs(a)
    fl = np.floor(m)
    return np.sign(a) * (fl + np.floor(2 * (m - fl)))


def f32_to_q8_0(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of 32: an f16 scale then 32 int8, as bytes (n_blocks, 34)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    qs = _roundf(blocks * inv).astype(np.int8)
    return np.concatenate([d.astype(np.float16).view(np.uint8), qs.view(np.uint8)], axis=1)


def encode(x32: np.ndarray, out: TensorType) -> np.ndarray:
    if out == TensorType.F32:
        return np.ascontiguousarray(x32, dtype=np.float32)
    if out == TensorType.F16:
        return x32.astype(np.float16)
    if out == TensorType.BF16:
        return f32_to_bf16(x32)
    if out == TensorType.Q8_0:
        return f32_to_q8_0(x32)
    raise ValueError(f"unsupported output type {out.name}")


@lru_cache(maxsize=None)
def lookup_table(src_dtype: str, out: TensorType) -> np.ndarray:
    """All 65536 values of a 16-bit source type, converted to ``out`` exactly as ``encode`` would.

    Indexing this table converts a 16-bit tensor an order of magnitude faster than going through
    float32 arithmetic, with identical results (each input value has one output value).
    """
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    src = every if src_dtype == "BF16" else every.view(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        return encode(to_f32(src, src_dtype), out)


LUT_OUTPUTS = (TensorType.F32, TensorType.F16, TensorType.BF16)


def convert_rows(raw: np.ndarray, src_dtype: str, out: TensorType) -> Iterator[memoryview]:
    """Convert a 2-D (or 1-D) raw array to ``out`` in row chunks, yielding output bytes."""
    if raw.ndim <= 1:
        yield memoryview(encode(to_f32(raw.reshape(-1), src_dtype), out)).cast("B")
        return
    rows, cols = raw.shape[0], int(np.prod(raw.shape[1:]))
    flat = raw.reshape(rows, cols)
    # passthrough when no conversion is needed (F16 -> F16, F32 -> F32): bytes are identical
    if (src_dtype, out) in (("F16", TensorType.F16), ("F32", TensorType.F32)):
        yield memoryview(np.ascontiguousarray(flat)).cast("B")
        return
    step = max(1, ROW_CHUNK_ELEMENTS // max(cols, 1))
    if src_dtype in ("BF16", "F16") and out in LUT_OUTPUTS:
        table = lookup_table(src_dtype, out)
        as_index = flat.view(np.uint16)
        for i in range(0, rows, step):
            yield memoryview(table[as_index[i:i + step]]).cast("B")
        return
    for i in range(0, rows, step):
        yield memoryview(encode(to_f32(flat[i:i + step], src_dtype), out)).cast("B")
