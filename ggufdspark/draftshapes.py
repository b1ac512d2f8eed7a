"""What llama.cpp's DSpark draft loader requires of a draft's hyperparameters and tensors, so that
``check`` refuses what the engine would refuse at start (issue 64, row 18): attention heads that
exist and group evenly, a Markov head of some rank, every tensor of the shape the hyperparameters
imply and of a type a matrix multiplication takes.

The facts follow the pinned tree: ``src/llama-model.cpp`` (``load_hparams``: head_count_kv defaults
to head_count, key_length and value_length to n_embd / head_count) and ``src/models/dflash.cpp``
(``load_arch_tensors``: the shapes below, ``create_tensor`` refusing any other with "wrong shape").
Shapes here are in numpy order (GGUF's ``ne`` reversed), as ``GGUFFile`` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggufdspark.errors import CorruptFileError
from ggufdspark.gguffile.constants import Key, TensorType
from ggufdspark.gguffile.reader import GGUFFile, shown

# ggml types no matrix multiplication takes as weights: an integer fc.weight loads, then fails
INTEGER_TYPES = frozenset({TensorType.I8, TensorType.I16, TensorType.I32, TensorType.I64, TensorType.F64})
# keys of draft variants whose tensors this table does not describe (DSV4 stages, DFlash2 selectors):
# their shapes are left to the engine
OTHER_LAYOUT_KEYS = ("{arch}.hyper_connection.count", "{arch}.selector.rank")
OTHER_LAYOUT_TENSORS = ("selector_hidden.weight", "d2t")


@dataclass(frozen=True)
class DraftHparams:
    """A draft's shape as the engine reads it; per-layer lists where GGUF allows arrays."""

    n_embd: int
    n_layer: int
    n_ff: list[int]
    n_head: list[int]
    n_head_kv: list[int]
    head_k: int
    head_v: int


def _per_layer(d: GGUFFile, template: str, n_layer: int, default: list[int] | None) -> list[int] | None:
    """A key the engine reads with ``get_key_or_arr``: one integer for every layer, or an array
    of one a layer; ``default`` when absent.

    Raises:
        CorruptFileError: neither an integer nor an integer array of ``n_layer`` items.
    """
    key = Key.of(template, d.arch or "")
    v = d.metadata.get(key)
    if v is None:
        return default
    if type(v) is int:
        return [v] * n_layer
    if isinstance(v, list) and len(v) == n_layer and all(type(x) is int for x in v):
        return list(v)
    raise CorruptFileError(f"{d.path}: {key} is {shown(v)}, expected an integer or {n_layer} integers (one a layer)")


def draft_hparams(d: GGUFFile) -> DraftHparams | None:
    """The draft's hyperparameters, or None where the file lacks what the table needs (the other
    checks say what is missing) or is a variant the table does not describe."""
    if any(d.get(k) is not None for k in OTHER_LAYOUT_KEYS) or any(t in d.tensors for t in OTHER_LAYOUT_TENSORS):
        return None
    n_embd, n_layer = d.get_int(Key.EMBEDDING_LENGTH), d.get_int(Key.BLOCK_COUNT)
    if not n_embd or not n_layer or n_embd < 0 or n_layer < 0:
        return None
    n_head = _per_layer(d, Key.HEAD_COUNT, n_layer, [0] * n_layer)
    n_head_kv = _per_layer(d, Key.HEAD_COUNT_KV, n_layer, n_head)
    n_ff = _per_layer(d, Key.FEED_FORWARD_LENGTH, n_layer, [0] * n_layer)
    assert n_head is not None and n_head_kv is not None and n_ff is not None
    first = n_head[0]
    default = n_embd // first if first > 0 else 0
    head_k = d.get_int(Key.KEY_LENGTH, default)
    head_v = d.get_int(Key.VALUE_LENGTH, default)
    return DraftHparams(n_embd, n_layer, n_ff, n_head, n_head_kv, head_k or 0, head_v or 0)


def attention_problem(hp: DraftHparams) -> str | None:
    """Why these attention hyperparameters cannot run (naming the value), or None."""
    for il in range(hp.n_layer):
        where = f" (layer {il})" if len(set(hp.n_head)) > 1 or len(set(hp.n_head_kv)) > 1 else ""
        h, kv = hp.n_head[il], hp.n_head_kv[il]
        if h <= 0:
            return f"attention.head_count {h}{where}: expected at least 1"
        if kv <= 0:
            return f"attention.head_count_kv {kv}{where}: expected at least 1"
        if h % kv:
            return f"attention.head_count {h} is not a multiple of attention.head_count_kv {kv}{where}"
    if hp.head_k <= 0 or hp.head_v <= 0:
        return f"attention.key_length {hp.head_k}, value_length {hp.head_v}: expected at least 1"
    return None


def describe_attention(hp: DraftHparams) -> str:
    heads = f"{hp.n_head[0]}" if len(set(hp.n_head)) == 1 else f"{hp.n_head}"
    kv = f"{hp.n_head_kv[0]}" if len(set(hp.n_head_kv)) == 1 else f"{hp.n_head_kv}"
    return f"{heads} heads, {kv} KV heads, key length {hp.head_k}, value length {hp.head_v}"


def markov_rank(d: GGUFFile) -> int | None:
    """The Markov head's rank (``markov_w1.weight``'s columns; the engine reads it from there), or
    None without a Markov head."""
    shape = d.tensor_shape("markov_w1.weight", 2)
    return shape[1] if shape is not None else None


Expected = dict[str, tuple[tuple[int, ...], bool]]  # tensor name -> (shape, required)


def expected_tensors(hp: DraftHparams, *, n_vocab: int, n_taps: int, rank: int | None) -> Expected:
    """name -> (shape, required) of every tensor the engine creates for this draft."""
    h = hp.n_embd
    out: Expected = {
        "fc.weight": ((h, n_taps * h), True),
        "enc.output_norm.weight": ((h,), True),
        "output_norm.weight": ((h,), True),
    }
    if rank is not None:
        out.update({"markov_w1.weight": ((n_vocab, rank), True), "markov_w2.weight": ((n_vocab, rank), True),
                    "conf_proj.weight": ((1, h + rank), False), "conf_proj.bias": ((1,), False)})
    for il in range(hp.n_layer):
        p, q = f"blk.{il}.", hp.n_head[il] * hp.head_k
        k, v, ff = hp.n_head_kv[il] * hp.head_k, hp.n_head_kv[il] * hp.head_v, hp.n_ff[il]
        out.update({
            p + "attn_norm.weight": ((h,), True), p + "attn_q.weight": ((q, h), True),
            p + "attn_k.weight": ((k, h), True), p + "attn_v.weight": ((v, h), False),
            p + "attn_output.weight": ((h, q), True),  # the engine's: n_embd_head_k * n_head wide
            p + "attn_q_norm.weight": ((hp.head_k,), True), p + "attn_k_norm.weight": ((hp.head_k,), True),
            p + "ffn_norm.weight": ((h,), True), p + "ffn_gate.weight": ((ff, h), True),
            p + "ffn_up.weight": ((ff, h), True), p + "ffn_down.weight": ((h, ff), True),
        })
    return out


def same_shape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Shapes equal as ggml compares them: ``ne`` padded with 1s to four dimensions (llama-quantize
    writes a ``[1, n]`` row as ``[n]``; the engine takes either)."""
    def ne(s: tuple[int, ...]) -> list[int]:
        return list(reversed(s)) + [1] * (4 - len(s))
    return len(a) <= 4 and len(b) <= 4 and ne(a) == ne(b)


def shape_problem(d: GGUFFile, expected: Expected) -> tuple[str | None, int]:
    """(the first tensor missing or of another shape than ``expected``, and how many are), or (None, 0)."""
    bad: list[str] = []
    for name, (shape, required) in expected.items():
        t = d.tensors.get(name)
        if t is None:
            if required:
                bad.append(f"tensor {name} is missing")
        elif not same_shape(t.shape, shape):
            bad.append(f"tensor {name} is {list(t.shape)}, the hyperparameters imply {list(shape)}")
    return (bad[0], len(bad)) if bad else (None, 0)


def type_problem(d: GGUFFile) -> str | None:
    """The first tensor of a type no matrix multiplication takes (an integer type), or None."""
    for name, t in d.tensors.items():
        if t.type in INTEGER_TYPES:
            return f"tensor {name} is {t.type_name}: weights must be a float or quantized type"
    return None
