"""Convert a safetensors DSpark drafter to the GGUF draft that llama.cpp's ``draft-dspark`` loads.

The drafter borrows the target's tied embeddings and tokenizer, so the target (a GGUF or a Hub
directory) is read too: its tokenizer goes into the draft, and its shape is checked against the
drafter's. The conversion is one streaming pass: input memory-mapped, each tensor converted in
row chunks and written straight out, pages released as we go, output renamed into place at the end.

Facts (names, keys) follow llama.cpp 0c1e570: ``src/llama-arch.cpp`` and ``src/models/dflash.cpp``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ggufdspark.convert import tokenizer as tok
from ggufdspark.convert.common import (OUTTYPE_LABEL, TargetInfo, check_output, default_draft_name,
                                       describe_target, load_config, outtype_tensor, resolve_checkpoint)
from ggufdspark.convert.safetensors import STensor, open_checkpoint
from ggufdspark.convert.stream import TensorPlan, write_plans
from ggufdspark.errors import PairMismatchError, UnsupportedModelError
from ggufdspark.gguffile.constants import (ARCH_DFLASH, FILE_TYPE, QUANTIZATION_VERSION, Key, TensorType,
                                           ValueType)
from ggufdspark.gguffile.writer import GGUFWriter
from ggufdspark.quants import draft_keeps_float

log = logging.getLogger(__name__)

# Architectures llama.cpp's converter registers as DSpark drafters.
DSPARK_ARCHS = {"Lfm2DSparkDraftModel", "DSparkDraftModel", "Qwen3DSparkModel", "DSparkSpeculator",
                "LingDSparkModel"}
# DFlash drafters without the Markov head are a different model family.
DFLASH_ARCHS = {"DFlashDraftModel", "Qwen3DFlashModel"}

# checkpoint name (after dropping a "model." prefix) -> GGUF name; {i} is the layer
LAYER_MAP = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_MAP = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "markov_head.markov_w1.weight": "markov_w1.weight",
    "markov_head.markov_w2.weight": "markov_w2.weight",
    "confidence_head.proj.weight": "conf_proj.weight",
    "confidence_head.proj.bias": "conf_proj.bias",
}
# Interleaved-RoPE checkpoints: these rows are permuted per head to NeoX order.
ROPE_PERMUTED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.q_norm.weight", "self_attn.k_norm.weight")
# Present in some exports, not used by the engine (the target lends embeddings and output).
IGNORED = {"embed_tokens.weight", "lm_head.weight", "t2d"}


@dataclass
class DrafterConfig:
    """The facts of a drafter's config.json that the conversion needs, validated."""

    path: Path
    hidden: int
    n_layers: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    rope_theta: float
    context_length: int
    block_size: int
    target_layer_ids: list[int]
    num_target_layers: int | None
    mask_token_id: int | None
    markov_rank: int
    neox: bool
    sample_from_anchor: bool
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def load(cls, directory: Path) -> "DrafterConfig":
        cfg = load_config(directory)
        path = directory / "config.json"
        archs = cfg.get("architectures") or []
        if not any(a in DSPARK_ARCHS for a in archs):
            found = archs[0] if archs else f"model_type {cfg.get('model_type')!r} with no architectures"
            hint = " (a DFlash drafter without a Markov head)" if any(a in DFLASH_ARCHS for a in archs) else ""
            raise UnsupportedModelError(
                f"{path}: architecture {found}{hint} is not a DSpark drafter "
                f"(expected one of {', '.join(sorted(DSPARK_ARCHS))})")
        if (mht := cfg.get("markov_head_type", "vanilla")) != "vanilla":
            raise UnsupportedModelError(f"{path}: markov_head_type {mht!r} is not supported (expected 'vanilla')")
        if (dv := cfg.get("draft_vocab_size")) and dv != cfg.get("vocab_size"):
            raise UnsupportedModelError(
                f"{path}: draft_vocab_size {dv} differs from vocab_size {cfg.get('vocab_size')}: reduced draft "
                f"vocabularies are not supported")
        dcfg = cfg.get("dflash_config") or {}
        try:
            hidden = int(cfg["hidden_size"])
            n_head = int(cfg["num_attention_heads"])
            vals = dict(
                hidden=hidden, n_layers=int(cfg["num_hidden_layers"]), n_head=n_head,
                n_head_kv=int(cfg.get("num_key_value_heads", n_head)),
                head_dim=int(cfg.get("head_dim") or hidden // n_head),
                ffn=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]))
        except KeyError as e:
            raise UnsupportedModelError(f"{path}: drafter config has no {e.args[0]}") from None
        rope = cfg.get("rope_parameters") or {}
        layer_ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
        if not layer_ids or not all(isinstance(i, int) and i >= 0 for i in layer_ids):
            raise UnsupportedModelError(f"{path}: dflash_config.target_layer_ids is {layer_ids!r}, expected a list of layer indices")
        mask = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
        return cls(
            path=path, rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
            context_length=int(cfg.get("max_position_embeddings", 0)),
            block_size=int(dcfg.get("block_size", cfg.get("block_size", 16))),
            target_layer_ids=list(layer_ids), num_target_layers=dcfg.get("num_target_layers"),
            mask_token_id=mask, markov_rank=int(cfg.get("markov_rank", 0)),
            neox=bool(cfg.get("rope_is_neox_style", True)),
            sample_from_anchor=bool(cfg.get("sample_from_anchor", "transformer_layer_config" not in cfg
                                            and "aux_hidden_state_layer_ids" not in cfg)),
            raw=cfg, **vals)


@dataclass
class ConvertResult:
    """What a conversion wrote."""

    path: Path
    sha256: str
    n_tensors: int
    nbytes: int
    seconds: float
    outtype: str
    notes: list[str] = field(default_factory=list)


def _normalize(name: str) -> str:
    name = name.removeprefix("model.")
    if name.startswith("markov_head.") and not name.endswith(".weight"):
        name += ".weight"
    return name


def _expected_shapes(c: DrafterConfig, has_conf: bool) -> dict[str, tuple[int, ...]]:
    h, hd = c.hidden, c.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (c.n_head * hd, h), p + "self_attn.k_proj.weight": (c.n_head_kv * hd, h),
            p + "self_attn.v_proj.weight": (c.n_head_kv * hd, h), p + "self_attn.o_proj.weight": (h, c.n_head * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (c.ffn, h), p + "mlp.up_proj.weight": (c.ffn, h),
            p + "mlp.down_proj.weight": (h, c.ffn)})
    shapes.update({
        "fc.weight": (h, len(c.target_layer_ids) * h), "hidden_norm.weight": (h,), "norm.weight": (h,),
        "markov_head.markov_w1.weight": (c.vocab, c.markov_rank),
        "markov_head.markov_w2.weight": (c.vocab, c.markov_rank)})
    if has_conf:
        shapes.update({"confidence_head.proj.weight": (1, h + c.markov_rank), "confidence_head.proj.bias": (1,)})
    return shapes


def _gguf_name(name: str) -> str:
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m:
        return f"blk.{m.group(1)}.{LAYER_MAP[m.group(2)]}"
    return GLOBAL_MAP[name]


def output_type(name: str, shape: tuple[int, ...], outtype: TensorType) -> TensorType:
    """Norms and biases (1-D) stay F32; Q8_0 falls back to F16 where rows don't fill blocks of 32."""
    if len(shape) <= 1:
        return TensorType.F32
    if outtype == TensorType.Q8_0 and shape[-1] % 32:
        return TensorType.F16
    return outtype


def plan_tensors(directory: Path, c: DrafterConfig, outtype: TensorType) -> list[TensorPlan]:
    """Match the checkpoint's tensors against the config. Raises on missing, extra or misshaped."""
    tensors = open_checkpoint(directory)
    by_name: dict[str, STensor] = {}
    for raw_name, t in tensors.items():
        name = _normalize(raw_name)
        if name in IGNORED or name.endswith(".rotary_emb.inv_freq"):
            log.warning("%s: ignoring %s (the engine does not use it)", directory, raw_name)
            continue
        if name in ("d2t",):
            raise UnsupportedModelError(f"{directory}: tensor {raw_name}: reduced draft vocabularies are not supported")
        by_name[name] = t
    has_conf = any(n.startswith("confidence_head.") for n in by_name)
    expected = _expected_shapes(c, has_conf)
    missing = [n for n in expected if n not in by_name]
    if missing:
        raise UnsupportedModelError(f"{directory}: tensor {missing[0]} is missing "
                                    f"({len(missing)} missing of {len(expected)} the config implies)")
    extra = sorted(n for n in by_name if n not in expected)
    if extra:
        raise UnsupportedModelError(f"{directory}: unexpected tensor {extra[0]} "
                                    f"(not part of a {c.n_layers}-layer DSpark drafter; {len(extra)} extra)")
    plans = []
    for name in sorted(expected):
        t = by_name[name]
        if t.shape != expected[name]:
            raise UnsupportedModelError(
                f"{t.file}: tensor {t.name} has shape {list(t.shape)}, the config implies {list(expected[name])}")
        if t.dtype not in ("BF16", "F16", "F32"):
            raise UnsupportedModelError(f"{t.file}: tensor {t.name} is {t.dtype}; expected BF16, F16 or F32")
        permute = (not c.neox) and name.endswith(ROPE_PERMUTED)
        transform = (lambda x, hd=c.head_dim: _to_neox(x, hd)) if permute else None
        gname = _gguf_name(name)
        otype = output_type(name, t.shape, outtype)
        if outtype == TensorType.Q8_0 and draft_keeps_float(gname):
            otype = TensorType[t.dtype]  # the Markov head stays in the checkpoint's float type, as quantize keeps it
        plans.append(TensorPlan(gname, t, t.shape, otype, transform))
    return plans


def _to_neox(x: np.ndarray, head_dim: int) -> np.ndarray:
    """Interleaved RoPE pairs (x0,x1),(x2,x3)... per head -> NeoX halves (x0,x2,...,x1,x3,...)."""
    shape = x.shape
    return x.reshape(-1, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def check_against_target(c: DrafterConfig, target: TargetInfo) -> None:
    """Raise PairMismatchError when the target contradicts the drafter."""
    where = f"{c.path} vs {target.source}"
    if target.hidden_size != c.hidden:
        raise PairMismatchError(f"{where}: target hidden size {target.hidden_size} != drafter hidden size {c.hidden}")
    if target.vocab_size != c.vocab:
        raise PairMismatchError(f"{where}: target vocabulary {target.vocab_size} != drafter vocab_size {c.vocab}")
    bad = [i for i in c.target_layer_ids if i >= target.n_layers]
    if bad:
        raise PairMismatchError(f"{where}: drafter taps target layer {bad[0]} (target_layer_ids "
                                f"{c.target_layer_ids}) but the target has {target.n_layers} layers")
    if c.num_target_layers is not None and int(c.num_target_layers) != target.n_layers:
        raise PairMismatchError(f"{where}: drafter was trained on a {c.num_target_layers}-layer target, "
                                f"this target has {target.n_layers} layers")
    if c.mask_token_id is not None and not 0 <= int(c.mask_token_id) < target.vocab_size:
        raise PairMismatchError(f"{where}: mask_token_id {c.mask_token_id} outside the target vocabulary of {target.vocab_size}")


def _tokenizer_kv(target: TargetInfo, vocab: int) -> list[tok.KV]:
    if target.kind == "gguf":
        assert target.gguf is not None
        return tok.from_gguf(target.gguf)
    assert target.directory is not None
    return tok.from_hub_dir(target.directory, vocab)


def convert_drafter(drafter: str | Path, target: str | Path, *, output: str | Path | None = None,
                    outtype: str = "f16", force: bool = False,
                    progress: Callable[[int, int, str], None] | None = None) -> ConvertResult:
    """Convert a DSpark drafter checkpoint to a GGUF draft for ``target``.

    Args:
        drafter: checkpoint directory or Hub repo id.
        target: the target's GGUF file, Hub directory or repo id (tokenizer and shape source).
        output: output path; default ``dspark-<model>-<TYPE>.gguf`` in the current directory.
        outtype: one of f32, f16, bf16, q8_0.
        force: overwrite an existing output.

    Returns:
        ConvertResult with the path and sha256 of the file written.

    Raises:
        InputNotFoundError, CorruptFileError, UnsupportedModelError, PairMismatchError,
        OutputExistsError, UnsafeOutputError (the output is an input, or its directory is unusable).
        Nothing is left on disk when any of them is raised.
    """
    t0 = time.monotonic()
    ttype = outtype_tensor(outtype)
    directory = resolve_checkpoint(drafter)
    c = DrafterConfig.load(directory)
    info = describe_target(target)
    check_against_target(c, info)
    plans = plan_tensors(directory, c, ttype)
    out = Path(output) if output else Path.cwd() / default_draft_name(info, outtype)
    if out.is_dir():
        out = out / default_draft_name(info, outtype)
    check_output(out, directory, info.source)

    w = GGUFWriter(out)
    arch = ARCH_DFLASH
    k = lambda template: Key.of(template, arch)  # noqa: E731
    w.add_string(Key.ARCH, arch)
    w.add_string(Key.TYPE, "model")
    w.add_string(Key.NAME, f"{info.name} DSpark draft")
    w.add_uint32(k(Key.BLOCK_COUNT), c.n_layers)
    w.add_uint32(k(Key.CONTEXT_LENGTH), c.context_length)
    w.add_uint32(k(Key.EMBEDDING_LENGTH), c.hidden)
    w.add_uint32(k(Key.FEED_FORWARD_LENGTH), c.ffn)
    w.add_uint32(k(Key.HEAD_COUNT), c.n_head)
    w.add_uint32(k(Key.HEAD_COUNT_KV), c.n_head_kv)
    w.add_float32(k(Key.ROPE_FREQ_BASE), c.rope_theta)
    w.add_float32(k(Key.RMS_EPS), c.rms_eps)
    w.add_uint32(k(Key.KEY_LENGTH), c.head_dim)
    w.add_uint32(k(Key.VALUE_LENGTH), c.head_dim)
    w.add_uint32(Key.FILE_TYPE, FILE_TYPE[outtype])
    w.add_uint32(k(Key.BLOCK_SIZE), c.block_size)
    # the engine counts layers from the embedding output: tap i is hidden state i + 1
    w.add_array(k(Key.TARGET_LAYERS), [i + 1 for i in c.target_layer_ids], ValueType.INT32)
    w.add_bool(k(Key.SAMPLE_FROM_ANCHOR), c.sample_from_anchor)
    w.add_bool(k(Key.HAS_CONFIDENCE_HEAD), any(p.gguf_name == "conf_proj.weight" for p in plans))
    w.add_uint32(Key.QUANT_VERSION, QUANTIZATION_VERSION)
    for kv in _tokenizer_kv(info, c.vocab):
        w.add(kv.key, kv.value, kv.vtype, kv.item_type)
    if c.mask_token_id is not None:
        w.add_uint32(Key.TOK_MASK, int(c.mask_token_id))
    sha = write_plans(w, plans, force=force, progress=progress)
    notes = []
    if outtype == "q8_0":
        notes.append("Q8_0 drafts have run slower than F16 at the same acceptance on some GPUs: measure with 'ggufdspark bench'")
    return ConvertResult(out, sha, len(plans), out.stat().st_size, time.monotonic() - t0,
                         OUTTYPE_LABEL[outtype], notes)
