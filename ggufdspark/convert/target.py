"""Convert an LFM2 target (``Lfm2ForCausalLM``, ``Lfm2MoeForCausalLM`` or an
``Lfm2VlForConditionalGeneration``) from safetensors to GGUF: the language model as arch ``lfm2``
(``lfm2moe`` for LFM2-MoE) and, for LFM2-VL, the vision encoder and projector as
``mmproj-<name>-<TYPE>.gguf`` beside it (see :mod:`ggufdspark.convert.mmproj`).

Key and tensor names follow llama.cpp 0c1e570 (``conversion/lfm2.py``, ``src/llama-arch.cpp``,
``src/models/lfm2moe.cpp``).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ggufdspark.convert import tokenizer as tok
from ggufdspark.convert.common import (OUTTYPE_LABEL, TEXT_TARGET_ARCHS, VL_TARGET_ARCHS, check_output,
                                       load_config, outtype_tensor, resolve_checkpoint, text_config)
from ggufdspark.convert.drafter import ConvertResult
from ggufdspark.convert.mmproj import (checkpoint_name, default_mmproj_name, has_vision_part, plan_mmproj,
                                       resolve_output, write_mmproj)
from ggufdspark.convert.safetensors import STensor, open_checkpoint
from ggufdspark.convert.stream import TensorPlan, write_plans
from ggufdspark.errors import OutputExistsError, UnsupportedModelError
from ggufdspark.gguffile.constants import (ARCH_LFM2, ARCH_LFM2MOE, EXPERT_GATING_SIGMOID, FILE_TYPE,
                                           QUANTIZATION_VERSION, Key, TensorType, ValueType)
from ggufdspark.gguffile.writer import GGUFWriter

log = logging.getLogger(__name__)

# language-tower prefixes seen in LFM2-VL checkpoints (published and transformers 5 layouts)
TOWER_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.")
VISION_PREFIXES = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.",
                   "multi_modal_projector.")

LAYER_MAP = {
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    # LFM2-MoE: the router and its per-expert bias (experts: EXPERT_NAME below)
    "feed_forward.gate.weight": "ffn_gate_inp.weight",
    "feed_forward.expert_bias": "exp_probs_b.bias",
}
# LFM2-MoE experts, one tensor per expert in the checkpoint, stacked into one per layer in GGUF
# (n_expert, rows, cols): what llama.cpp's loader reads as {cols, rows, n_expert}
EXPERT_RE = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(\d+)\.(w[123])\.weight")
EXPERT_NAME = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}
# tensors llama.cpp keeps in F32 whatever the output type (besides 1-D ones): the short-conv kernel, the router
ALWAYS_F32 = ("shortconv.conv.weight", "ffn_gate_inp.weight")
GLOBAL_MAP = {
    "embed_tokens.weight": "token_embd.weight",
    "embedding_norm.weight": "token_embd_norm.weight",
    "lm_head.weight": "output.weight",
}


MOE_KEYS = ("num_experts", "num_experts_per_tok", "num_dense_layers", "moe_intermediate_size",
            "intermediate_size")


def _check_moe_config(path: Path, cfg: dict) -> None:
    """The MoE numbers must be whole and consistent before anything is read or written."""
    vals = {}
    for key in MOE_KEYS:
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UnsupportedModelError(f"{path}: {key} is {v!r}; expected a non-negative integer")
        vals[key] = v
    if not 1 <= vals["num_experts_per_tok"] <= vals["num_experts"]:
        raise UnsupportedModelError(f"{path}: num_experts_per_tok {vals['num_experts_per_tok']} is outside "
                                    f"1..num_experts ({vals['num_experts']})")
    if vals["num_dense_layers"] > int(cfg["num_hidden_layers"]):
        raise UnsupportedModelError(f"{path}: num_dense_layers {vals['num_dense_layers']} is more than "
                                    f"num_hidden_layers {cfg['num_hidden_layers']}")
    if cfg.get("use_expert_bias") is False:
        # llama.cpp's LFM2-MoE loader requires the expert bias (exp_probs_b)
        raise UnsupportedModelError(f"{path}: use_expert_bias is false; llama.cpp's LFM2-MoE needs the "
                                    f"router's expert bias")


@dataclass
class TargetConvertResult(ConvertResult):
    """The language tower's file (the inherited fields) and, for LFM2-VL, the mmproj written beside it."""

    mmproj: ConvertResult | None = None


def feed_forward_length(cfg: dict) -> int:
    """LFM2's effective FFN width (``block_auto_adjust_ff_dim`` shrinks it to 2/3, rounded up)."""
    ff = int(cfg.get("block_ff_dim", cfg.get("intermediate_size")))
    if cfg.get("block_auto_adjust_ff_dim"):
        ff = int(2 * ff / 3)
        if (mult := cfg.get("block_ffn_dim_multiplier")) is not None:
            ff = int(mult * ff)
        m = int(cfg.get("block_multiple_of", 256))
        ff = m * ((ff + m - 1) // m)
    return ff


def _tower_name(name: str) -> str | None:
    """Map a checkpoint name to the language model's own ``model.*`` / ``lm_head`` name, or None."""
    if name.startswith(VISION_PREFIXES):
        return None
    for p in TOWER_PREFIXES:
        if name.startswith(p):
            rest = name[len(p):]
            return rest if rest.startswith("lm_head") else "model." + rest.removeprefix("model.")
    return name


def _gguf_name(name: str) -> str | None:
    if name == "lm_head.weight":
        return GLOBAL_MAP[name]
    name = name.removeprefix("model.")
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if m:
        g = LAYER_MAP.get(m.group(2))
        return f"blk.{m.group(1)}.{g}" if g else None
    return GLOBAL_MAP.get(name)


def _layer_need(i: int, kind: str, moe_layer: bool) -> tuple[str, ...]:
    """The GGUF tensors layer ``i`` must have (``src/models/lfm2.cpp``, ``lfm2moe.cpp``)."""
    ffn = (("ffn_gate_inp.weight", "exp_probs_b.bias") + tuple(EXPERT_NAME.values()) if moe_layer
           else ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"))
    op = (("shortconv.conv.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight") if kind == "conv"
          else ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight",
                "attn_k_norm.weight"))
    return tuple(f"blk.{i}.{g}" for g in ("attn_norm.weight", "ffn_norm.weight") + ffn + op)


def _plan_experts(directory: Path, experts: dict[tuple[int, str], dict[int, STensor]], n_experts: int,
                  ttype: TensorType) -> list[TensorPlan]:
    """One stacked plan per (layer, w1/w2/w3); every expert present, all of one shape."""
    plans = []
    for (layer, w), by_id in sorted(experts.items()):
        if sorted(by_id) != list(range(n_experts)):
            missing = sorted(set(range(n_experts)) - set(by_id)) or sorted(set(by_id) - set(range(n_experts)))
            raise UnsupportedModelError(
                f"{directory}: layer {layer} has {len(by_id)} {w} experts, config.json says num_experts "
                f"{n_experts} (expert {missing[0]} {'missing' if len(by_id) < n_experts else 'unexpected'})")
        parts = tuple(by_id[e] for e in range(n_experts))
        shapes = {p.shape for p in parts}
        if len(shapes) != 1 or len(parts[0].shape) != 2:
            raise UnsupportedModelError(f"{directory}: layer {layer} {w} experts have shapes "
                                        f"{sorted(shapes)}; expected one 2-D shape")
        shape = (n_experts, *parts[0].shape)
        out_t = TensorType.F16 if ttype == TensorType.Q8_0 and shape[-1] % 32 else ttype
        plans.append(TensorPlan(f"blk.{layer}.{EXPERT_NAME[w]}", parts[0], shape, out_t, stack=parts))
    return plans


def plan_target(directory: Path, cfg: dict, ttype: TensorType, *, moe: bool = False) -> list[TensorPlan]:
    tensors = open_checkpoint(directory)
    tied = cfg.get("tie_word_embeddings", cfg.get("tie_embedding", True))
    plans = []
    unknown = []
    experts: dict[tuple[int, str], dict[int, STensor]] = {}
    for raw_name in sorted(tensors):
        t: STensor = tensors[raw_name]
        name = _tower_name(raw_name)
        if name is None:
            continue
        m = EXPERT_RE.fullmatch(name.removeprefix("model.")) if moe else None
        gname = None if m else _gguf_name(name)
        if gname is None and m is None:
            unknown.append(raw_name)
            continue
        if t.dtype not in ("BF16", "F16", "F32"):
            raise UnsupportedModelError(f"{t.file}: tensor {raw_name} is {t.dtype}; expected BF16, F16 or F32")
        if m:
            experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = t
            continue
        if gname == "output.weight" and tied:
            continue
        shape = t.shape
        out_t = ttype
        if gname.endswith("shortconv.conv.weight"):
            shape = (shape[0], shape[-1])  # (d, 1, L) -> (d, L): the conv op wants 2-D
        if gname.endswith(ALWAYS_F32) or len(shape) <= 1:
            out_t = TensorType.F32
        elif ttype == TensorType.Q8_0 and shape[-1] % 32:
            out_t = TensorType.F16
        plans.append(TensorPlan(gname, t, shape, out_t))
    if unknown:
        what = "an LFM2-MoE" if moe else "an LFM2"
        raise UnsupportedModelError(f"{directory}: unexpected tensor {unknown[0]} for {what} model "
                                    f"({len(unknown)} unknown)")
    if moe:
        plans += _plan_experts(directory, experts, int(cfg["num_experts"]), ttype)
    names = {p.gguf_name for p in plans}
    n_dense = int(cfg.get("num_dense_layers", 0)) if moe else len(cfg["layer_types"])
    need = ["token_embd.weight", "token_embd_norm.weight"] + [
        n for i, kind in enumerate(cfg["layer_types"]) for n in _layer_need(i, kind, moe and i >= n_dense)]
    missing = [n for n in need if n not in names]
    if missing:
        raise UnsupportedModelError(f"{directory}: tensor for {missing[0]} is missing ({len(missing)} missing)")
    extra = sorted(names - set(need) - {"output.weight"})
    if moe and extra:  # e.g. experts in a layer config.json says is dense
        raise UnsupportedModelError(f"{directory}: tensor {extra[0]} does not fit config.json "
                                    f"(num_dense_layers {n_dense}, {len(cfg['layer_types'])} layers)")
    return plans


def convert_target(target: str | Path, *, output: str | Path | None = None, outtype: str = "f16",
                   force: bool = False, progress: Callable[[int, int, str], None] | None = None,
                   mmproj: bool = True, mmproj_output: str | Path | None = None) -> TargetConvertResult:
    """Convert an LFM2 / LFM2-VL checkpoint to GGUF.

    Args:
        target: checkpoint directory or Hub repo id.
        output: the language tower's file or directory (default ``./<name>-<TYPE>.gguf``).
        mmproj: for an LFM2-VL checkpoint, also write the vision encoder + projector.
        mmproj_output: its file or directory (default ``mmproj-<name>-<TYPE>.gguf`` beside the tower).

    Returns:
        TargetConvertResult; ``mmproj`` is set when an mmproj was written.

    Raises:
        InputNotFoundError, CorruptFileError, UnsupportedModelError, OutputExistsError,
        UnsafeOutputError (an output is an input, or its directory is unusable). Both inputs
        are validated and both outputs checked before anything is written.
    """
    t0 = time.monotonic()
    ttype = outtype_tensor(outtype)
    directory = resolve_checkpoint(target)
    full = load_config(directory)
    archs = full.get("architectures") or []
    if not any(a in TEXT_TARGET_ARCHS | VL_TARGET_ARCHS for a in archs):
        raise UnsupportedModelError(f"{directory / 'config.json'}: architecture "
                                    f"{archs[0] if archs else full.get('model_type')!r} is not an LFM2 target "
                                    f"(expected Lfm2ForCausalLM, Lfm2MoeForCausalLM or Lfm2VlForConditionalGeneration)")
    is_vl = any(a in VL_TARGET_ARCHS for a in archs)
    cfg = text_config(full)
    moe = "Lfm2MoeForCausalLM" in archs or cfg.get("model_type") == "lfm2_moe"
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "layer_types") + (
            MOE_KEYS if moe else ()):
        if key not in cfg:
            raise UnsupportedModelError(f"{directory / 'config.json'}: LFM2{'-MoE' if moe else ''} config has no {key}")
    if moe:
        _check_moe_config(directory / "config.json", cfg)
    plans = plan_target(directory, cfg, ttype, moe=moe)
    name = checkpoint_name(target, directory)
    out = check_output(resolve_output(output, f"{name}-{OUTTYPE_LABEL[outtype]}.gguf"), directory)
    notes = []
    mplan = mout = None
    if is_vl and mmproj and not has_vision_part(directory, full):
        notes.append(f"{directory}: LFM2-VL checkpoint without a vision part (no vision_config, no vision "
                     f"tensors): wrote the language tower only, no mmproj")
    elif is_vl and mmproj:
        mplan = plan_mmproj(directory, full, outtype, name=name)
        mout = resolve_output(mmproj_output if mmproj_output is not None else out.parent,
                              default_mmproj_name(name, outtype))
        check_output(mout, directory)
        if mout.resolve() == out.resolve():
            raise OutputExistsError(f"{out}: the language tower and the mmproj cannot share one file")
        for path in (out, mout):
            if path.exists() and not force:
                raise OutputExistsError(f"{path}: already exists (use --force to overwrite)")
    elif is_vl:
        notes.append("LFM2-VL checkpoint: wrote the language tower only (no mmproj asked for); images need "
                     "the mmproj too")
    elif mmproj_output is not None:
        notes.append(f"{directory}: not an LFM2-VL checkpoint, so no mmproj was written")

    arch = ARCH_LFM2MOE if moe else ARCH_LFM2
    k = lambda template: Key.of(template, arch)  # noqa: E731
    rope = cfg.get("rope_parameters") or {}
    n_kv = int(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    # llama.cpp reads a per-layer KV head count: 0 marks the short-convolution layers (the reference
    # tests "not conv" for LFM2 and "full_attention" for LFM2-MoE; the same for real configs)
    is_attention = (lambda lt: lt == "full_attention") if moe else (lambda lt: lt != "conv")
    w = GGUFWriter(out)
    w.add_string(Key.ARCH, arch)
    w.add_string(Key.TYPE, "model")
    w.add_string(Key.NAME, name)
    w.add_uint32(k(Key.BLOCK_COUNT), cfg["num_hidden_layers"])
    w.add_uint32(k(Key.CONTEXT_LENGTH), cfg.get("max_position_embeddings", 128000))
    w.add_uint32(k(Key.EMBEDDING_LENGTH), cfg["hidden_size"])
    # LFM2-MoE: the dense lead layers' width, as written (no block_auto_adjust_ff_dim there)
    w.add_uint32(k(Key.FEED_FORWARD_LENGTH), int(cfg["intermediate_size"]) if moe else feed_forward_length(cfg))
    w.add_uint32(k(Key.HEAD_COUNT), cfg["num_attention_heads"])
    w.add_array(k(Key.HEAD_COUNT_KV), [n_kv if is_attention(lt) else 0 for lt in cfg["layer_types"]],
                ValueType.INT32)
    w.add_float32(k(Key.ROPE_FREQ_BASE), cfg.get("rope_theta", rope.get("rope_theta", 1000000.0)))
    w.add_float32(k(Key.RMS_EPS), cfg.get("norm_eps", 1e-5))
    if moe:
        w.add_uint32(k(Key.EXPERT_COUNT), int(cfg["num_experts"]))
        w.add_uint32(k(Key.EXPERT_USED_COUNT), int(cfg["num_experts_per_tok"]))
        w.add_uint32(k(Key.EXPERT_FEED_FORWARD_LENGTH), int(cfg["moe_intermediate_size"]))
        w.add_uint32(k(Key.LEADING_DENSE_BLOCK_COUNT), int(cfg["num_dense_layers"]))
        w.add_uint32(k(Key.EXPERT_GATING_FUNC), EXPERT_GATING_SIGMOID)
    w.add_uint32(Key.FILE_TYPE, FILE_TYPE[outtype])
    w.add_uint32(k(Key.VOCAB_SIZE), cfg["vocab_size"])
    w.add_uint32(k(Key.SHORTCONV_L_CACHE), cfg.get("conv_L_cache", 3))
    w.add_uint32(Key.QUANT_VERSION, QUANTIZATION_VERSION)
    for kv in tok.from_hub_dir(directory, cfg["vocab_size"]):
        w.add(kv.key, kv.value, kv.vtype, kv.item_type)
    sha = write_plans(w, plans, force=force, progress=progress)
    result = TargetConvertResult(out, sha, len(plans), out.stat().st_size, time.monotonic() - t0,
                                 OUTTYPE_LABEL[outtype], notes)
    if mplan is not None:
        result.mmproj = write_mmproj(mplan, mout, force=force, progress=progress)
    return result
