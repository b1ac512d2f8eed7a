"""Generate synthetic checkpoints: LFM2 targets and DSpark drafters, small or full-size.

No model can be downloaded where this project is built and tested, so tests and benchmarks make
their own, shaped like the published ones:

* a target in Hub layout (``config.json`` of ``Lfm2ForCausalLM``, ``model.safetensors``, a real
  byte-level BPE ``tokenizer.json`` trained here with the LFM2 pre-tokenizer, a ChatML chat template
  in ``tokenizer_config.json``: see ``ggufdspark.synthetic.tokenizer``);
* a drafter with the published config layout (``Lfm2DSparkDraftModel``, ``model_type: qwen3``,
  ``dflash_config``, Markov and confidence heads, interleaved RoPE) and tensor names without a
  ``model.`` prefix.

Weights are random (numpy, seeded) and written by streaming, so the full-size drafter (279.5M
parameters) and target (about 2.4B) never sit in memory whole. The small drafter's Markov head is
built so that it tends to predict "repeat the previous token", which random targets often do; that
makes some drafted tokens get accepted, so acceptance figures are not all zero.
"""

from __future__ import annotations

import importlib
import json
import shutil
from dataclasses import asdict, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np

from ggufdspark.convert.safetensors import write_safetensors
from ggufdspark.errors import MissingDependencyError
from ggufdspark.shapes import (FULL_DRAFTER, FULL_TARGET, MEDIUM_DRAFTER, MEDIUM_TARGET, SMALL_DRAFTER, SMALL_TARGET,
                               DrafterSpec, TargetSpec)
from ggufdspark.synthetic.tokenizer import BOS, EOS, MASK_TOKEN, PAD, added_ids, make_tokenizer

# Packages generating needs beyond the core install, and the pip extra that brings them
# (pyproject.toml, [project.optional-dependencies]).
OPTIONAL_DEPENDENCIES: dict[str, str] = {"tokenizers": "generate"}


def require_dependencies() -> None:
    """Check, before anything is written, that the optional packages generating needs import.

    Raises:
        MissingDependencyError: one does not (the message names it and the install command).
    """
    for module, extra in OPTIONAL_DEPENDENCIES.items():
        try:
            importlib.import_module(module)
        except ImportError as e:
            why = (str(e).splitlines() or ["cannot be imported"])[0]
            raise MissingDependencyError(f"generating checkpoints needs the Python package {module!r} ({why}): "
                                         f"pip install 'ggufdspark[{extra}]'") from None


# --------------------------------------------------------------------------- specs

# the shapes live in ggufdspark.shapes (check reads them without numpy); re-exported here

# --------------------------------------------------------------------------- weights


class Weights:
    """Seeded random tensors in a given safetensors dtype, produced in bounded chunks."""

    CHUNK = 1 << 22  # elements

    def __init__(self, dtype: str, seed: int):
        self.dtype = dtype
        self.rng = np.random.default_rng(seed)

    def _encode(self, x: np.ndarray) -> bytes:
        if self.dtype == "F32":
            return x.astype("<f4").tobytes()
        if self.dtype == "F16":
            return x.astype("<f2").tobytes()
        # BF16, round to nearest even
        u = x.astype("<f4").view("<u4")
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()

    def normal(self, shape: tuple[int, ...], std: float) -> Iterator[bytes]:
        n = int(np.prod(shape))
        for i in range(0, n, self.CHUNK):
            m = min(self.CHUNK, n - i)
            yield self._encode(self.rng.standard_normal(m, dtype=np.float32) * np.float32(std))

    def around_one(self, shape: tuple[int, ...], spread: float = 0.1, scale: float = 1.0) -> bytes:
        """Norm weights: 1 + N(0, spread), times ``scale`` (1: the values unchanged, bit for bit)."""
        n = int(np.prod(shape))
        x = 1.0 + self.rng.standard_normal(n, dtype=np.float32) * np.float32(spread)
        return self._encode(x * np.float32(scale))

    def fixed(self, x: np.ndarray) -> bytes:
        return self._encode(x.astype(np.float32).reshape(-1))


def _shard(items: list, n_shards: int) -> list[list]:
    if n_shards <= 1:
        return [items]
    sizes = [int(np.prod(s)) for _, _, s, _ in items]
    total = sum(sizes)
    shards: list[list] = [[] for _ in range(n_shards)]
    acc = 0
    for item, size in zip(items, sizes):
        shards[min(n_shards - 1, acc * n_shards // max(total, 1))].append(item)
        acc += size
    return [s for s in shards if s]


def _write_weights(out: Path, items: list, n_shards: int) -> None:
    """items: (name, dtype, shape, data-or-chunks). Writes model.safetensors or a sharded index."""
    groups = _shard(items, n_shards)
    if len(groups) == 1:
        write_safetensors(out / "model.safetensors", groups[0])
        return
    weight_map = {}
    total = 0
    for i, group in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(out / fname, group)
        for name, dtype, shape, _ in group:
            weight_map[name] = fname
            total += int(np.prod(shape)) * {"F32": 4, "F16": 2, "BF16": 2}[dtype]
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def target_config(spec: TargetSpec, ids: dict[str, int], dtype: str = "BF16") -> dict:
    """The config.json of an ``Lfm2ForCausalLM`` (``Lfm2MoeForCausalLM`` for an MoE spec) of ``spec``'s
    shape; ``ids``: the tokenizer's special token ids."""
    h, kv, nh = spec.hidden_size, spec.num_key_value_heads, spec.num_attention_heads
    config = {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "vocab_size": spec.vocab_size,
        "hidden_size": h, "intermediate_size": spec.intermediate_size, "block_ff_dim": spec.intermediate_size,
        "block_auto_adjust_ff_dim": False, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
        "block_dim": h, "num_hidden_layers": spec.num_hidden_layers, "num_attention_heads": nh,
        "num_key_value_heads": kv, "layer_types": spec.layer_types(), "conv_L_cache": spec.conv_L_cache,
        "conv_bias": False, "max_position_embeddings": spec.max_position_embeddings, "norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta, "tie_word_embeddings": True, "tie_embedding": True,
        "bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD],
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype], "use_cache": True,
    }
    if spec.ff_auto_adjust:
        if spec.intermediate_size % 256:
            raise ValueError(f"ff_auto_adjust needs intermediate_size a multiple of 256, not {spec.intermediate_size}")
        config["block_ff_dim"] = config["intermediate_size"] = spec.intermediate_size * 3 // 2
        config["block_auto_adjust_ff_dim"] = True
    if spec.moe:
        # the published LFM2-MoE config (transformers' Lfm2MoeConfig) has no block_* keys
        for key in [k for k in config if k.startswith("block_")]:
            del config[key]
        config.update({
            "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe",
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.num_experts_per_tok,
            "num_dense_layers": spec.num_dense_layers, "moe_intermediate_size": spec.moe_intermediate_size,
            "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        })
    return config


def make_target(out: Path, spec: TargetSpec = SMALL_TARGET, *, dtype: str = "BF16", seed: int = 1,
                tokenizer_from: Path | None = None) -> Path:
    """Write an ``Lfm2ForCausalLM`` checkpoint (config, weights, tokenizer) to ``out``; an
    ``Lfm2MoeForCausalLM`` one when ``spec.num_experts`` > 0."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_from:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(Path(tokenizer_from) / f, out / f)
        ids = {t: i for t, i in added_ids(out / "tokenizer.json").items()}
    else:
        ids = make_tokenizer(out, min(spec.vocab_size, 1024))
    config = target_config(spec, ids, dtype)
    h, kv, nh = spec.hidden_size, spec.num_key_value_heads, spec.num_attention_heads
    hd = h // nh
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}, indent=2))
    w = Weights(dtype, seed)
    items = [("model.embed_tokens.weight", dtype, (spec.vocab_size, h), w.normal((spec.vocab_size, h), 1.0))]
    for i, kind in enumerate(spec.layer_types()):
        p = f"model.layers.{i}."
        if kind == "conv":
            kernel_std, proj = spec.conv_std
            items += [(p + "conv.conv.weight", dtype, (h, 1, spec.conv_L_cache),
                       w.normal((h, 1, spec.conv_L_cache), kernel_std)),
                      (p + "conv.in_proj.weight", dtype, (3 * h, h), w.normal((3 * h, h), proj / np.sqrt(h))),
                      (p + "conv.out_proj.weight", dtype, (h, h), w.normal((h, h), proj / np.sqrt(h)))]
        else:
            items += [(p + "self_attn.q_proj.weight", dtype, (h, h), w.normal((h, h), 1 / np.sqrt(h))),
                      (p + "self_attn.k_proj.weight", dtype, (kv * hd, h), w.normal((kv * hd, h), 1 / np.sqrt(h))),
                      (p + "self_attn.v_proj.weight", dtype, (kv * hd, h), w.normal((kv * hd, h), 1 / np.sqrt(h))),
                      (p + "self_attn.out_proj.weight", dtype, (h, h), w.normal((h, h), 0.5 / np.sqrt(h))),
                      (p + "self_attn.q_layernorm.weight", dtype, (hd,), w.around_one((hd,))),
                      (p + "self_attn.k_layernorm.weight", dtype, (hd,), w.around_one((hd,)))]
        if spec.moe and i >= spec.num_dense_layers:
            items += _expert_items(p, spec, dtype, w)
        else:
            ff = spec.intermediate_size
            items += [(p + "feed_forward.w1.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                      (p + "feed_forward.w3.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                      (p + "feed_forward.w2.weight", dtype, (h, ff), w.normal((h, ff), 0.5 / np.sqrt(ff)))]
        items += [(p + "operator_norm.weight", dtype, (h,), w.around_one((h,))),
                  (p + "ffn_norm.weight", dtype, (h,), w.around_one((h,)))]
    items.append(("model.embedding_norm.weight", dtype, (h,), w.around_one((h,))))
    _write_weights(out, items, 1)
    return out


def _expert_items(p: str, spec: TargetSpec, dtype: str, w: Weights) -> list[tuple]:
    """One LFM2-MoE block's router, expert bias and experts, in the published per-expert layout
    (``feed_forward.experts.E.w1/w3/w2``; transformers 5 fuses them only when loading)."""
    h, ff, n = spec.hidden_size, spec.moe_intermediate_size, spec.num_experts
    items = [(p + "feed_forward.gate.weight", dtype, (n, h), w.normal((n, h), 1 / np.sqrt(h))),
             # a float32 buffer in transformers' Lfm2MoeSparseMoeBlock, saved as such whatever the dtype
             (p + "feed_forward.expert_bias", "F32", (n,), Weights("F32", int(w.rng.integers(1 << 30))).normal((n,), 0.1))]
    for e in range(n):
        q = f"{p}feed_forward.experts.{e}."
        items += [(q + "w1.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                  (q + "w3.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                  (q + "w2.weight", dtype, (h, ff), w.normal((h, ff), 0.5 / np.sqrt(ff)))]
    return items


def drafter_config(target_config: dict, spec: DrafterSpec, mask_token_id: int) -> dict:
    """The drafter's config.json, in the published LFM2 DSpark layout."""
    h = target_config["hidden_size"]
    return {
        "architectures": ["Lfm2DSparkDraftModel"], "model_type": "qwen3",
        "hidden_size": h, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta, "max_position_embeddings": target_config["max_position_embeddings"],
        "vocab_size": target_config["vocab_size"], "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * spec.num_hidden_layers,
        "block_size": spec.block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(spec.target_layer_ids),
                          "num_target_layers": target_config["num_hidden_layers"]},
        "markov_rank": spec.markov_rank, "markov_head_type": spec.markov_head_type,
        "enable_confidence_head": spec.confidence_head, "rope_is_neox_style": spec.rope_is_neox_style,
        "torch_dtype": "bfloat16",
    }


def make_drafter(out: Path, target_dir: Path, spec: DrafterSpec = SMALL_DRAFTER, *, dtype: str = "BF16",
                 seed: int = 2, shards: int = 1, prefix: str = "") -> Path:
    """Write a DSpark drafter checkpoint for the target in ``target_dir``.

    ``prefix`` ("" or "model.") and ``shards`` reproduce the input variants seen in the wild.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    tcfg = tcfg.get("text_config", tcfg) if "hidden_size" not in tcfg else tcfg
    ids = added_ids(Path(target_dir) / "tokenizer.json")
    mask_id = ids.get(MASK_TOKEN, tcfg["vocab_size"] - 1)
    cfg = drafter_config(tcfg, spec, mask_id)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    h, nh, kv, hd = cfg["hidden_size"], spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    ff, vocab, r = spec.intermediate_size, cfg["vocab_size"], spec.markov_rank
    w = Weights(dtype, seed)
    items = []
    for i in range(spec.num_hidden_layers):
        p = f"{prefix}layers.{i}."
        items += [(p + "self_attn.q_proj.weight", dtype, (nh * hd, h), w.normal((nh * hd, h), 1 / np.sqrt(h))),
                  (p + "self_attn.k_proj.weight", dtype, (kv * hd, h), w.normal((kv * hd, h), 1 / np.sqrt(h))),
                  (p + "self_attn.v_proj.weight", dtype, (kv * hd, h), w.normal((kv * hd, h), 1 / np.sqrt(h))),
                  (p + "self_attn.o_proj.weight", dtype, (h, nh * hd), w.normal((h, nh * hd), 0.5 / np.sqrt(h))),
                  (p + "self_attn.q_norm.weight", dtype, (hd,), w.around_one((hd,), scale=spec.qk_norm_gain)),
                  (p + "self_attn.k_norm.weight", dtype, (hd,), w.around_one((hd,), scale=spec.qk_norm_gain)),
                  (p + "input_layernorm.weight", dtype, (h,), w.around_one((h,))),
                  (p + "post_attention_layernorm.weight", dtype, (h,), w.around_one((h,))),
                  (p + "mlp.gate_proj.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                  (p + "mlp.up_proj.weight", dtype, (ff, h), w.normal((ff, h), 1 / np.sqrt(h))),
                  (p + "mlp.down_proj.weight", dtype, (h, ff), w.normal((h, ff), 0.5 / np.sqrt(ff)))]
    n_taps = len(spec.target_layer_ids)
    items += [(prefix + "fc.weight", dtype, (h, n_taps * h), w.normal((h, n_taps * h), 1 / np.sqrt(n_taps * h))),
              (prefix + "hidden_norm.weight", dtype, (h,), w.around_one((h,))),
              (prefix + "norm.weight", dtype, (h,), w.around_one((h,)))]
    if spec.repeat_bias:
        # unit rows scaled so that w2 . w1[prev] peaks at v == prev: "repeat the last token"
        rng = np.random.default_rng(seed + 100)
        m = rng.standard_normal((vocab, r)).astype(np.float32)
        m *= np.float32(np.sqrt(24.0)) / np.linalg.norm(m, axis=1, keepdims=True)
        items += [(prefix + "markov_head.markov_w1.weight", dtype, (vocab, r), w.fixed(m)),
                  (prefix + "markov_head.markov_w2.weight", dtype, (vocab, r), w.fixed(m))]
    else:
        items += [(prefix + "markov_head.markov_w1.weight", dtype, (vocab, r), w.normal((vocab, r), 0.05)),
                  (prefix + "markov_head.markov_w2.weight", dtype, (vocab, r), w.normal((vocab, r), 0.05))]
    if spec.confidence_head:
        # the defaults (bias 4, std 0.01) are confident: keep drafting the whole block
        bias = np.array([spec.confidence_bias], dtype=np.float32)
        items += [(prefix + "confidence_head.proj.weight", dtype, (1, h + r), w.normal((1, h + r), spec.confidence_std)),
                  (prefix + "confidence_head.proj.bias", dtype, (1,), w.fixed(bias))]
    _write_weights(out, items, shards)
    return out


def make_pair(root: Path, *, target: TargetSpec = SMALL_TARGET, drafter: DrafterSpec = SMALL_DRAFTER,
              dtype: str = "BF16") -> tuple[Path, Path]:
    """A target and its drafter under ``root/target`` and ``root/drafter``; returns both dirs."""
    t = make_target(Path(root) / "target", target, dtype=dtype)
    d = make_drafter(Path(root) / "drafter", t, drafter, dtype=dtype)
    return t, d


def spec_dict(spec) -> dict:
    return asdict(spec)


__all__ = ["TargetSpec", "DrafterSpec", "SMALL_TARGET", "SMALL_DRAFTER", "MEDIUM_TARGET", "MEDIUM_DRAFTER",
           "FULL_TARGET", "FULL_DRAFTER",
           "make_tokenizer", "make_target", "make_drafter", "make_pair", "drafter_config", "replace", "field"]
