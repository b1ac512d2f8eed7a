"""Quant types: the labels users and the Hub see, llama.cpp's file types, and what a DSpark draft can take.

Facts, kept in tables (read from the pinned tree, llama.cpp 0c1e570):

* ``general.file_type`` holds a ``llama_ftype`` (``include/llama.h``); its label (``Q4_K_M``) is the
  quant in file names and in ``llama-server -hf REPO:QUANT``.
* ``tools/quantize/quantize.cpp`` lists the types ``llama-quantize`` writes (``QUANT_TYPES`` here keeps
  the ones meant for dense models like LFM2; the ternary, MoE-only and 1-2 bit experimental types
  are left out).
* A DSpark draft (``src/models/dflash.cpp``) is loaded like any model, but ``llama-imatrix`` cannot
  compute an importance matrix for it (it runs a model on its own; a draft runs only beside its
  target, reading the target's hidden states): so a draft takes only the types that need none and
  keep 4 bits or more (``DRAFT_TYPES``). Its Markov head (``markov_w1``, read by ``get_rows`` into
  an argmax chain that picks every drafted token, and ``markov_w2``) stays in the float type it
  came in (``DRAFT_KEEP_FLOAT``); 1-D tensors (every norm, ``conf_proj``: one row, 1-D for ggml, and
  its bias) are never quantized by ``llama-quantize`` anyway. ``fc`` and the attention and FFN
  matrices are plain mat-muls and are quantized like a target's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ggufdspark.gguffile.constants import (FTYPE_LABELS, OUTTYPE_LABEL, OUTTYPE_TENSOR, TYPE_SIZES, Key,
                                           TensorType)
from ggufdspark.gguffile.reader import GGUFFile

log = logging.getLogger(__name__)

# Used when a file has no general.file_type: the type of most of its matrices, among the output types.
TENSOR_LABELS = {t: OUTTYPE_LABEL[o] for o, t in OUTTYPE_TENSOR.items()}
# The unquantized output types (one weight per block), by their --outtype name.
FLOAT_TYPES = {t: o for o, t in OUTTYPE_TENSOR.items() if TYPE_SIZES[t][0] == 1}


@dataclass(frozen=True)
class QuantType:
    name: str  # as llama-quantize and the Hub spell it
    bits: float  # about, per weight (llama-quantize's help), for the tables
    imatrix: bool = False  # llama-quantize refuses it without --imatrix


# What ``ggufdspark quantize --type`` offers (tools/quantize/quantize.cpp of the pinned tree).
QUANT_TYPES: dict[str, QuantType] = {q.name: q for q in (
    QuantType("F32", 32), QuantType("F16", 16), QuantType("BF16", 16), QuantType("Q8_0", 8.5),
    QuantType("Q6_K", 6.56), QuantType("Q5_K_M", 5.7), QuantType("Q5_K_S", 5.5), QuantType("Q5_1", 6),
    QuantType("Q5_0", 5.5), QuantType("Q4_K_M", 4.9), QuantType("Q4_K_S", 4.6), QuantType("Q4_1", 5),
    QuantType("Q4_0", 4.5), QuantType("IQ4_NL", 4.5), QuantType("IQ4_XS", 4.25), QuantType("Q3_K_L", 4.3),
    QuantType("Q3_K_M", 3.9), QuantType("Q3_K_S", 3.5), QuantType("IQ3_M", 3.66), QuantType("IQ3_S", 3.44),
    QuantType("IQ3_XS", 3.3), QuantType("IQ3_XXS", 3.06), QuantType("Q2_K", 3.0),
    QuantType("Q2_K_S", 2.96, imatrix=True), QuantType("IQ2_M", 2.7, imatrix=True),
    QuantType("IQ2_S", 2.5, imatrix=True), QuantType("IQ2_XS", 2.31, imatrix=True),
    QuantType("IQ2_XXS", 2.06, imatrix=True), QuantType("IQ1_M", 1.75, imatrix=True),
    QuantType("IQ1_S", 1.56, imatrix=True),
)}
# Types a DSpark draft can take (see the module docstring for why the others are refused).
DRAFT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S",
               "Q4_1", "Q4_0")
# The draft precision that measured best with each target precision (target quant -> draft quant),
# for ``publish``'s default pairing and ``check``'s note: docs/quantize.md, from an H200 table in
# docs/benchmarks.md (one run, engine patches 0001-0016, 2026-12-01: the draft with the higher ratio at
# both 1 and 8 requests; where they split, the smaller file). A target quant not listed gets the draft
# of its own quant, else the one with the most bits.
RECOMMENDED_DRAFT: dict[str, str] = {"F16": "Q8_0", "Q8_0": "F16", "Q4_K_M": "Q8_0"}
# Draft tensors that keep the input's float type whatever --type says (regexes for --tensor-type).
# One policy for every quantized draft: 'quantize --type Q8_0' and 'convert --outtype q8_0' both
# apply it (``draft_keeps_float``), so two drafts of one label are the same kind of file.
DRAFT_KEEP_FLOAT = ("markov_w1.weight", "markov_w2.weight")


def draft_keeps_float(tensor_name: str) -> bool:
    """Whether a quantized DSpark draft keeps this tensor (its GGUF name) in the float type it came in."""
    return tensor_name in DRAFT_KEEP_FLOAT


def ftype_label(ft: object) -> str | None:
    """The quant label of a ``general.file_type`` value; None unless it is a known ``llama_ftype``."""
    if isinstance(ft, int) and not isinstance(ft, bool):
        return FTYPE_LABELS.get(ft)
    return None


def matrix_label(g: GGUFFile) -> str | None:
    """The label of the type most of ``g``'s matrices are in (``TENSOR_LABELS``: F32, F16, BF16,
    Q8_0), by element count; None when no matrix is in one of them."""
    counts: dict[str, int] = {}
    for t in g.tensors.values():
        if len(t.shape) >= 2 and t.type in TENSOR_LABELS:
            label = TENSOR_LABELS[t.type]
            counts[label] = counts.get(label, 0) + t.n_elements
    return max(counts, key=counts.get) if counts else None


def precision(g: GGUFFile) -> str:
    """The quant label of a GGUF (``F16``, ``Q4_K_M``...), from ``general.file_type``, else from the
    type of most of its matrices; ``?`` when neither says."""
    ft = g.metadata.get(Key.FILE_TYPE)
    if isinstance(ft, int) and not isinstance(ft, bool):
        return ftype_label(ft) or f"file_type {ft}"
    # none, or not an integer (a damaged header: check reports what matters; this is only a label)
    return matrix_label(g) or "?"


def float_type(g: GGUFFile) -> str | None:
    """``f32``/``f16``/``bf16`` when every matrix of ``g`` is in a float type (a file llama-quantize can
    start from without requantizing), else None."""
    types = {t.type for t in g.tensors.values() if len(t.shape) >= 2}
    if not types or not types <= set(FLOAT_TYPES):
        return None
    label = precision(g)
    return label.lower() if label.lower() in FLOAT_TYPES.values() else FLOAT_TYPES[TensorType(min(types))]


def is_quantized_file(path) -> bool:
    """Whether the GGUF at ``path`` is in a quantized type (its label is not F32, F16 or BF16).
    An unreadable file counts as not quantized (the caller reports it elsewhere)."""
    from ggufdspark.errors import GgufdsparkError
    from ggufdspark.gguffile.reader import read_gguf

    try:
        return precision(read_gguf(path)) not in ("F32", "F16", "BF16", "?")
    except (GgufdsparkError, OSError):
        return False


def is_quantized_tag(ref: str | None) -> bool:
    """Whether a Hub reference ``REPO:QUANT`` names a quantized type (no tag: llama.cpp picks Q4_K_M)."""
    if not ref:
        return False
    tag = ref.rpartition(":")[2].upper() if ":" in ref else "Q4_K_M"
    return tag not in ("F32", "F16", "BF16")
