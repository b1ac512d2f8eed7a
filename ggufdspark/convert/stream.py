"""The one streaming writer both converters use: plans in, GGUF out, bounded memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ggufdspark.convert import quant
from ggufdspark.convert.safetensors import MappedFiles, STensor, array
from ggufdspark.gguffile.constants import TensorType
from ggufdspark.gguffile.writer import GGUFWriter


@dataclass
class TensorPlan:
    """One output tensor: where it comes from, its output shape and type, an optional transform
    (applied to the float32 values, for the few tensors whose layout changes).

    ``stack``: when set, the output is these source tensors stacked along a new first axis (an
    MoE layer's experts, ``src`` being the first of them); each is converted as it is read.
    """

    gguf_name: str
    src: STensor
    shape: tuple[int, ...]
    ttype: TensorType
    transform: Callable[[np.ndarray], np.ndarray] | None = None
    stack: tuple[STensor, ...] = ()


def write_plans(w: GGUFWriter, plans: list[TensorPlan], *, force: bool,
                progress: Callable[[int, int, str], None] | None) -> str:
    """Declare ``plans`` on ``w`` and write the file; returns its sha256."""
    for p in plans:
        w.add_tensor(p.gguf_name, p.shape, p.ttype)
    by_name = {p.gguf_name: p for p in plans}
    with MappedFiles() as files:
        def produce(name: str) -> Iterator[memoryview]:
            p = by_name[name]
            if p.stack:
                # row-wise conversion of each part, one after the other, equals converting the stack
                for part in p.stack:
                    yield from quant.convert_rows(array(files.view(part), part), part.dtype, p.ttype)
                    files.release(part)
                return
            raw = array(files.view(p.src), p.src).reshape(p.shape)
            if p.transform is not None:
                yield from quant.convert_rows(p.transform(quant.to_f32(raw, p.src.dtype)), "F32", p.ttype)
            else:
                yield from quant.convert_rows(raw, p.src.dtype, p.ttype)
            del raw
            files.release(p.src)

        return w.write(produce, force=force, progress=progress)
