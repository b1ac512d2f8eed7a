"""Generate synthetic LFM2-VL checkpoints (``Lfm2VlForConditionalGeneration``): an LFM2 language
tower from :mod:`ggufdspark.synthetic.synth` plus a SigLIP2 NaFlex vision encoder and the LFM2-VL
projector, with random weights (numpy, seeded, streamed to disk).

The checkpoint copies the published LFM2-VL layout, not what the installed transformers would save,
because llama.cpp's reference converter relies on each of these details:

* the vision tower under ``model.vision_tower.vision_model.`` (transformers 5 saves
  ``model.vision_tower.`` instead; ``layout="transformers"`` writes that form, which our converter
  also accepts);
* ``text_config.architectures`` names ``Lfm2ForCausalLM`` (the reference picks the language model's
  converter from it);
* a ``preprocessor_config.json`` with the image mean/std, patch size and downsample factor;
* no SigLIP pooling head (``vision_use_head: false``; LFM2-VL reads the last hidden state);
* patch size 16 and a 16 x 16 position grid (the reference reshapes the patch embedding as 16 x 16);
* three or more encoder layers (see ``VisionSpec.num_hidden_layers``).

The tokenizer is synth's (it has ``<image>``, ``<|image_start|>`` and ``<|image_end|>``), so a
drafter from ``synth.make_drafter(target_dir=<vl dir>)`` pairs with the language tower.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ggufdspark.convert.safetensors import read_header, write_safetensors
from ggufdspark.synthetic import synth
from ggufdspark.synthetic.tokenizer import added_ids

LAYOUTS = ("published", "transformers")
# where each layout keeps the vision encoder's tensors
VISION_PREFIX = {"published": "model.vision_tower.vision_model.", "transformers": "model.vision_tower."}
PROJECTOR_PREFIX = "model.multi_modal_projector."
TEXT_PREFIX = "model.language_model."
IMAGE_TOKEN = "<image>"


@dataclass
class VisionSpec:
    """A SigLIP2 NaFlex vision encoder and the LFM2-VL projector."""

    hidden_size: int = 32
    intermediate_size: int = 64
    # at least 3: the reference maps projector tensors through its per-block name table, built for
    # block_count blocks, so ``linear_2`` is only recognised when the encoder has 3 or more layers
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    patch_size: int = 16
    num_patches: int = 256  # a 16 x 16 grid of learned positions
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    projector_hidden_size: int = 64
    downsample_factor: int = 2
    vision_feature_layer: int = -1
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)


SMALL_VISION = VisionSpec()
# SigLIP2 so400m NaFlex (hidden 1152, 27 layers, 16 heads, FFN 4304): the encoder family LFM2-VL uses
# (reported); 2560 is transformers' default projector width for Lfm2VlConfig.
SO400M_VISION = VisionSpec(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                           projector_hidden_size=2560)


def vision_config(spec: VisionSpec) -> dict:
    return {
        "model_type": "siglip2_vision_model", "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size, "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads, "num_channels": spec.num_channels,
        "num_patches": spec.num_patches, "patch_size": spec.patch_size, "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": spec.layer_norm_eps, "attention_dropout": 0.0, "vision_use_head": False,
    }


def preprocessor_config(spec: VisionSpec) -> dict:
    """``preprocessor_config.json`` in the shape of the published LFM2-VL image processor's."""
    return {
        "image_processor_type": "Lfm2VlImageProcessor", "processor_class": "Lfm2VlProcessor",
        "image_mean": list(spec.image_mean), "image_std": list(spec.image_std),
        "encoder_patch_size": spec.patch_size, "downsample_factor": spec.downsample_factor,
        "do_image_splitting": True, "min_tiles": 2, "max_tiles": 10, "use_thumbnail": True,
        "min_image_tokens": 64, "max_image_tokens": 256, "tile_size": 512, "max_pixels_tolerance": 2.0,
        "do_resize": True, "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_pad": True,
    }


def _vision_items(spec: VisionSpec, text_hidden: int, layout: str, dtype: str,
                  w: "synth.Weights") -> list[tuple]:
    """(name, dtype, shape, data) for the vision encoder and the projector."""
    h, ff, s = spec.hidden_size, spec.intermediate_size, spec.downsample_factor
    v = VISION_PREFIX[layout]
    patch_in = spec.num_channels * spec.patch_size * spec.patch_size
    small = 0.02

    def linear(name, rows, cols, std):
        return [(name + ".weight", dtype, (rows, cols), w.normal((rows, cols), std)),
                (name + ".bias", dtype, (rows,), w.normal((rows,), small))]

    def norm(name, n):
        return [(name + ".weight", dtype, (n,), w.around_one((n,))),
                (name + ".bias", dtype, (n,), w.normal((n,), small))]

    # NaFlex keeps the patch embedding as a Linear over (patch_h, patch_w, channel) pixels
    items = linear(v + "embeddings.patch_embedding", h, patch_in, 1 / np.sqrt(patch_in))
    items.append((v + "embeddings.position_embedding.weight", dtype, (spec.num_patches, h),
                  w.normal((spec.num_patches, h), 0.1)))
    for i in range(spec.num_hidden_layers):
        p = f"{v}encoder.layers.{i}."
        items += norm(p + "layer_norm1", h)
        for proj in ("q_proj", "k_proj", "v_proj"):
            items += linear(p + "self_attn." + proj, h, h, 1 / np.sqrt(h))
        items += linear(p + "self_attn.out_proj", h, h, 0.5 / np.sqrt(h))
        items += norm(p + "layer_norm2", h)
        items += linear(p + "mlp.fc1", ff, h, 1 / np.sqrt(h))
        items += linear(p + "mlp.fc2", h, ff, 0.5 / np.sqrt(ff))
    items += norm(v + "post_layernorm", h)
    merged = h * s * s
    ph = spec.projector_hidden_size
    items += norm(PROJECTOR_PREFIX + "layer_norm", merged)
    items += linear(PROJECTOR_PREFIX + "linear_1", ph, merged, 1 / np.sqrt(merged))
    items += linear(PROJECTOR_PREFIX + "linear_2", text_hidden, ph, 1 / np.sqrt(ph))
    return items


def _copy_chunks(path: Path, begin: int, end: int, chunk: int = 16 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        f.seek(begin)
        left = end - begin
        while left > 0:
            b = f.read(min(chunk, left))
            if not b:
                raise OSError(f"{path}: ended {left} bytes early")
            left -= len(b)
            yield b


def make_vl_target(out: Path, text: synth.TargetSpec = synth.SMALL_TARGET, vision: VisionSpec = SMALL_VISION, *,
                   layout: str = "published", dtype: str = "BF16", seed: int = 1,
                   tokenizer_from: Path | None = None) -> Path:
    """Write an ``Lfm2VlForConditionalGeneration`` checkpoint to ``out``.

    The language tower is ``synth.make_target``'s (same seed, same weights), renamed to
    ``model.language_model.*``; the vision tensors follow ``layout`` ("published" or "transformers").

    Returns:
        ``out``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
    out = Path(out)
    synth.make_target(out, text, dtype=dtype, seed=seed, tokenizer_from=tokenizer_from)
    tcfg = json.loads((out / "config.json").read_text())
    ids = added_ids(out / "tokenizer.json")
    text_cfg = {**tcfg, "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2"}
    config = {
        "architectures": ["Lfm2VlForConditionalGeneration"], "model_type": "lfm2_vl",
        "text_config": text_cfg, "vision_config": vision_config(vision),
        "downsample_factor": vision.downsample_factor, "image_token_id": ids[IMAGE_TOKEN],
        "projector_hidden_act": "gelu", "projector_hidden_size": vision.projector_hidden_size,
        "projector_bias": True, "projector_use_layernorm": True,
        "vision_feature_layer": vision.vision_feature_layer, "tie_word_embeddings": True,
        "torch_dtype": tcfg["torch_dtype"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(vision), indent=2))

    # rename the tower's tensors in a new file (data streamed across), then add the vision tensors
    src = out / "model.safetensors"
    tensors, _ = read_header(src)
    items = [(TEXT_PREFIX + name.removeprefix("model."), t.dtype, t.shape, _copy_chunks(src, t.begin, t.end))
             for name, t in sorted(tensors.items(), key=lambda kv: kv[1].begin)]
    items += _vision_items(vision, tcfg["hidden_size"], layout, dtype, synth.Weights(dtype, seed + 1000))
    tmp = out / "model.vl.safetensors.part"
    write_safetensors(tmp, items)
    os.replace(tmp, src)
    return out


def make_vl_pair(root: Path, *, text: synth.TargetSpec = synth.SMALL_TARGET, vision: VisionSpec = SMALL_VISION,
                 drafter: synth.DrafterSpec = synth.SMALL_DRAFTER, layout: str = "published",
                 dtype: str = "BF16") -> tuple[Path, Path]:
    """A VL target and a DSpark drafter for its language tower under ``root/vl-target`` and
    ``root/vl-drafter``; returns both dirs."""
    t = make_vl_target(Path(root) / "vl-target", text, vision, layout=layout, dtype=dtype)
    d = synth.make_drafter(Path(root) / "vl-drafter", t, drafter, dtype=dtype)
    return t, d


__all__ = ["VisionSpec", "SMALL_VISION", "SO400M_VISION", "LAYOUTS", "make_vl_target", "make_vl_pair",
           "vision_config", "preprocessor_config"]
