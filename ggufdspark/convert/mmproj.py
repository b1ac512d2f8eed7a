"""Convert the vision side of an LFM2-VL checkpoint (SigLIP2 NaFlex encoder + LFM2-VL projector)
to the ``mmproj`` GGUF that llama.cpp's mtmd loads with ``--mmproj``.

Key and tensor names follow llama.cpp 0c1e570: ``gguf-py/gguf/constants.py`` (``Keys.Clip*``,
``MODEL_TENSOR.V_*``), ``tools/mtmd/clip.cpp`` (what the loader reads for ``PROJECTOR_TYPE_LFM2``)
and ``tools/mtmd/models/siglip.cpp`` (the graph). Output types per tensor follow the reference
converter (``conversion/base.py`` ``MmprojModel`` / ``prepare_tensors``, ``conversion/lfm2.py``
``LFM2VLModel``), so that the two produce identical files from the same input.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ggufdspark.convert.common import (OUTTYPE_LABEL, VL_TARGET_ARCHS, check_output, load_config, load_json_object,
                                       outtype_tensor, resolve_checkpoint, text_config)
from ggufdspark.convert.drafter import ConvertResult
from ggufdspark.convert.safetensors import STensor, open_checkpoint
from ggufdspark.convert.stream import TensorPlan, write_plans
from ggufdspark.errors import OutputExistsError, UnsupportedModelError
from ggufdspark.gguffile.constants import (ARCH_CLIP, FILE_TYPE, QUANTIZATION_VERSION, Key, TensorType,
                                           ValueType)
from ggufdspark.gguffile.mmproj import ClipKey
from ggufdspark.gguffile.writer import GGUFWriter

log = logging.getLogger(__name__)


PROJECTOR_LFM2 = "lfm2"
GGUF_TYPE_MMPROJ = "mmproj"
# The LFM2 path of mtmd sizes images dynamically (64..256 tokens, clip.cpp); image_size is nominal.
# llama.cpp's converter writes 256 (LFM2VLModel.__init__), the side of the 16 x 16 position grid.
LFM2_IMAGE_SIZE = 256

# transformers' Siglip2VisionConfig defaults: the reference reads the config through AutoConfig,
# which fills these in when config.json leaves them out.
SIGLIP2_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                    "num_attention_heads": 12, "num_channels": 3, "num_patches": 256, "patch_size": 16,
                    "layer_norm_eps": 1e-6}

# checkpoint name (after normalize_name) -> GGUF name
VISION_GLOBAL_MAP = {
    "vision_tower.embeddings.patch_embedding": "v.patch_embd",
    "vision_tower.embeddings.position_embedding": "v.position_embd",
    "vision_tower.post_layernorm": "v.post_ln",
    "multi_modal_projector.layer_norm": "mm.input_norm",
    "multi_modal_projector.linear_1": "mm.1",
    "multi_modal_projector.linear_2": "mm.2",
}
VISION_LAYER_MAP = {  # vision_tower.encoder.layers.{i}.<key> -> v.blk.{i}.<value>
    "layer_norm1": "ln1",
    "layer_norm2": "ln2",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_out",
    "mlp.fc1": "ffn_up",
    "mlp.fc2": "ffn_down",
}
# SigLIP's attention-pooling head: LFM2-VL reads the last hidden state, the engine has no use for it
IGNORED_VISION = ("vision_tower.head.",)


def normalize_name(name: str) -> str | None:
    """A vision/projector tensor name in one canonical form, or None for language-model tensors.

    Accepts both tower layouts: published LFM2-VL (``model.vision_tower.vision_model.*``) and
    transformers 5 (``model.vision_tower.*``), with or without the leading ``model.``.
    """
    for p in ("model.vision_tower.", "model.multi_modal_projector."):
        if name.startswith(p):
            name = name[len("model."):]
            break
    if name.startswith("vision_tower.vision_model."):
        name = "vision_tower." + name[len("vision_tower.vision_model."):]
    if name.startswith(("vision_tower.", "multi_modal_projector.")):
        return name
    return None


def has_vision_part(directory: Path, full_cfg: dict) -> bool:
    """Whether an LFM2-VL checkpoint carries a vision encoder at all (config or tensors); language-only
    exports of a VL model have neither."""
    return isinstance(full_cfg.get("vision_config"), dict) or any(
        normalize_name(n) is not None for n in open_checkpoint(directory))


def gguf_name(name: str) -> str | None:
    """GGUF name of a normalized vision/projector tensor name, or None if unknown."""
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base in VISION_GLOBAL_MAP:
        return f"{VISION_GLOBAL_MAP[base]}.{suffix}"
    m = re.fullmatch(r"vision_tower\.encoder\.layers\.(\d+)\.(.+)", base)
    if m and m.group(2) in VISION_LAYER_MAP:
        return f"v.blk.{m.group(1)}.{VISION_LAYER_MAP[m.group(2)]}.{suffix}"
    return None


def output_type(gname: str, shape: tuple[int, ...], ttype: TensorType) -> TensorType:
    """The reference converter's choice of type for one mmproj tensor."""
    if gname == "v.patch_embd.weight":  # MmprojModel.tensor_force_quant
        return TensorType.F16 if ttype == TensorType.F16 else TensorType.F32
    if len(shape) <= 1 or gname.endswith("_norm.weight"):
        return TensorType.F32
    if gname == "v.position_embd.weight" or not gname.endswith(".weight"):
        return TensorType.F32
    if ttype == TensorType.Q8_0 and shape[-1] % 32:
        return TensorType.F16  # the reference falls back to F16 when rows do not fill Q8_0 blocks
    return ttype


def default_mmproj_name(name: str, outtype: str) -> str:
    """``mmproj-<name>-<TYPE>.gguf``: llama.cpp's Hub resolution takes files starting with ``mmproj``."""
    return f"mmproj-{name}-{OUTTYPE_LABEL[outtype]}.gguf"


def checkpoint_name(spec: str | Path, directory: Path) -> str:
    """The model's name for output file names: the repo name for a Hub id, else the directory name."""
    s = str(spec)
    if not Path(s).expanduser().exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", s):
        return s.split("/")[-1]
    return re.sub(r"[^\w.-]+", "-", directory.resolve().name).strip("-") or "model"


@dataclass
class MmprojPlan:
    """Everything decided before an mmproj is written: its tensors and its metadata."""

    directory: Path
    name: str
    outtype: str
    tensors: list[TensorPlan]
    keys: list[tuple[str, Any, ValueType, ValueType | None]] = field(default_factory=list)
    projection_dim: int = 0


def _processor_config(directory: Path) -> tuple[dict, list[Path]]:
    """preprocessor_config.json, then processor_config.json's image_processor on top (as the
    reference does). Returns the merged dict and the files read."""
    merged: dict = {}
    read = []
    for fname, sub in (("preprocessor_config.json", "media_proc_cfg"), ("processor_config.json", "image_processor")):
        path = directory / fname
        if not path.is_file():
            continue
        cfg = load_json_object(path)
        if isinstance(cfg.get(sub), dict):
            cfg = {**cfg, **cfg[sub]}
        merged.update(cfg)
        read.append(path)
    return merged, read


def _vision_block_count(n_layers: int, feature_layer: int, path: Path) -> int:
    # HF convention: hidden_states[-1] is the last layer's output, so -1 keeps all layers and -k
    # drops k - 1 (the reference's formula); a non-negative index k keeps k layers.
    n = n_layers + feature_layer + 1 if feature_layer < 0 else feature_layer
    if not 1 <= n <= n_layers:
        raise UnsupportedModelError(f"{path}: vision_feature_layer {feature_layer} selects {n} of "
                                    f"{n_layers} vision layers")
    return n


def plan_mmproj(directory: Path, full_cfg: dict, outtype: str, *, name: str | None = None) -> MmprojPlan:
    """Validate an LFM2-VL checkpoint's vision side and plan its mmproj (nothing is written).

    Raises:
        UnsupportedModelError: not LFM2-VL, missing config or tensors, shapes that disagree.
        CorruptFileError: unreadable JSON or safetensors.
    """
    ttype = outtype_tensor(outtype)
    cfg_path = directory / "config.json"
    archs = full_cfg.get("architectures") or []
    if not any(a in VL_TARGET_ARCHS for a in archs):
        raise UnsupportedModelError(f"{cfg_path}: architecture {archs[0] if archs else None!r} has no LFM2-VL "
                                    f"vision part (expected Lfm2VlForConditionalGeneration)")
    vraw = full_cfg.get("vision_config")
    if not isinstance(vraw, dict):
        raise UnsupportedModelError(f"{cfg_path}: no vision_config")
    vcfg = {**SIGLIP2_DEFAULTS, **vraw}
    tcfg = text_config(full_cfg)
    n_embd_text = tcfg.get("hidden_size")
    if not n_embd_text:
        raise UnsupportedModelError(f"{cfg_path}: text_config has no hidden_size")
    proc, proc_files = _processor_config(directory)
    for key in ("image_mean", "image_std"):
        v = proc.get(key)
        if not (isinstance(v, list) and len(v) >= 3 and all(isinstance(x, (int, float)) for x in v)):
            where = ", ".join(p.name for p in proc_files) or "no preprocessor_config.json or processor_config.json"
            raise UnsupportedModelError(f"{directory}: {key} is {v!r} ({where}); expected 3 numbers")
    h, p, c = int(vcfg["hidden_size"]), int(vcfg["patch_size"]), int(vcfg["num_channels"])
    n_layers = int(vcfg["num_hidden_layers"])
    factor = int(full_cfg.get("downsample_factor", 2))

    tensors = open_checkpoint(directory)
    plans: list[TensorPlan] = []
    unknown = []
    for raw_name in sorted(tensors):
        norm = normalize_name(raw_name)
        if norm is None:
            continue
        if norm.startswith(IGNORED_VISION):
            log.info("%s: skipping %s (SigLIP pooling head, unused by LFM2-VL)", directory, raw_name)
            continue
        gname = gguf_name(norm)
        if gname is None:
            unknown.append(raw_name)
            continue
        t: STensor = tensors[raw_name]
        if t.dtype not in ("BF16", "F16", "F32"):
            raise UnsupportedModelError(f"{t.file}: tensor {raw_name} is {t.dtype}; expected BF16, F16 or F32")
        shape, transform = t.shape, None
        if gname == "v.patch_embd.weight" and len(shape) == 2:
            # NaFlex keeps a Linear over (patch_h, patch_w, channel) pixels; clip.cpp wants the
            # conv kernel layout (out, channel, patch_h, patch_w)
            if shape[1] != c * p * p:
                raise UnsupportedModelError(f"{t.file}: {raw_name} takes {shape[1]} inputs, expected "
                                            f"{c} channels x {p} x {p} = {c * p * p}")
            shape = (shape[0], c, p, p)
            transform = _nhwc_to_nchw(shape[0], p, c)
        plans.append(TensorPlan(gname, t, shape, output_type(gname, shape, ttype), transform))
    if unknown:
        raise UnsupportedModelError(f"{directory}: unexpected vision tensor {unknown[0]} for LFM2-VL "
                                    f"({len(unknown)} unknown)")
    by_name = {pl.gguf_name: pl for pl in plans}
    need = ["v.patch_embd.weight", "v.position_embd.weight", "mm.1.weight", "mm.1.bias", "mm.2.weight",
            "mm.2.bias"] + [f"v.blk.{i}.{g}.{s}" for i in range(n_layers) for g in VISION_LAYER_MAP.values()
                            for s in ("weight", "bias")]
    missing = [n for n in need if n not in by_name]
    if missing:
        raise UnsupportedModelError(f"{directory}: vision tensor for {missing[0]} is missing ({len(missing)} missing)")
    width = by_name["mm.2.weight"].shape[0]
    if width != n_embd_text:
        raise UnsupportedModelError(f"{directory}: projector output width {width} != text hidden size {n_embd_text}")
    merged = by_name["mm.1.weight"].shape[1]
    if merged != h * factor * factor:
        raise UnsupportedModelError(f"{directory}: projector takes {merged} inputs, expected vision hidden {h} x "
                                    f"downsample_factor {factor}^2 = {h * factor * factor}")
    n_pos = by_name["v.position_embd.weight"].shape[0]
    if int(round(n_pos ** 0.5)) ** 2 != n_pos:
        raise UnsupportedModelError(f"{directory}: {n_pos} position embeddings do not form a square grid")

    u32, f32, b, s = ValueType.UINT32, ValueType.FLOAT32, ValueType.BOOL, ValueType.STRING
    keys = [
        (ClipKey.HAS_VISION_ENCODER, True, b, None),
        (ClipKey.PROJECTION_DIM, int(n_embd_text), u32, None),
        (ClipKey.IMAGE_SIZE, LFM2_IMAGE_SIZE, u32, None),
        (ClipKey.PATCH_SIZE, p, u32, None),
        (ClipKey.EMBEDDING_LENGTH, h, u32, None),
        (ClipKey.FEED_FORWARD_LENGTH, int(vcfg["intermediate_size"]), u32, None),
        (ClipKey.BLOCK_COUNT, _vision_block_count(n_layers, int(full_cfg.get("vision_feature_layer", -1)), cfg_path),
         u32, None),
        (ClipKey.HEAD_COUNT, int(vcfg["num_attention_heads"]), u32, None),
        (ClipKey.IMAGE_MEAN, [float(x) for x in proc["image_mean"]], ValueType.ARRAY, f32),
        (ClipKey.IMAGE_STD, [float(x) for x in proc["image_std"]], ValueType.ARRAY, f32),
        (ClipKey.PROJECTOR_TYPE, PROJECTOR_LFM2, s, None),
        (ClipKey.LAYERNORM_EPS, float(vcfg["layer_norm_eps"]), f32, None),
        (ClipKey.SCALE_FACTOR, factor, u32, None),
        (ClipKey.USE_GELU, True, b, None),
    ]
    return MmprojPlan(directory, name or directory.name, outtype, plans, keys, int(n_embd_text))


def _nhwc_to_nchw(rows: int, p: int, c: int) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: x.reshape(rows, p, p, c).transpose(0, 3, 1, 2)


def write_mmproj(plan: MmprojPlan, out: Path, *, force: bool = False,
                 progress: Callable[[int, int, str], None] | None = None) -> ConvertResult:
    """Write a planned mmproj to ``out``.

    Raises:
        OutputExistsError: ``out`` exists and ``force`` is false.
    """
    t0 = time.monotonic()
    w = GGUFWriter(out)
    w.add_string(Key.ARCH, ARCH_CLIP)
    w.add_string(Key.TYPE, GGUF_TYPE_MMPROJ)
    w.add_string(Key.NAME, plan.name)
    w.add_uint32(Key.FILE_TYPE, FILE_TYPE[plan.outtype])
    for key, value, vtype, itype in plan.keys:
        w.add(key, value, vtype, itype)
    w.add_uint32(Key.QUANT_VERSION, QUANTIZATION_VERSION)
    sha = write_plans(w, plan.tensors, force=force, progress=progress)
    return ConvertResult(out, sha, len(plan.tensors), out.stat().st_size, time.monotonic() - t0,
                         OUTTYPE_LABEL[plan.outtype])


def resolve_output(output: str | Path | None, default_name: str) -> Path:
    """``output`` as given, ``output/default_name`` for a directory, or ``./default_name``."""
    if output is None:
        return Path.cwd() / default_name
    out = Path(output)
    return out / default_name if out.is_dir() else out


def convert_mmproj(target: str | Path, *, output: str | Path | None = None, outtype: str = "f16",
                   force: bool = False, progress: Callable[[int, int, str], None] | None = None) -> ConvertResult:
    """Convert an LFM2-VL checkpoint's vision encoder and projector to an mmproj GGUF.

    Args:
        target: checkpoint directory or Hub repo id.
        output: file or directory (default ``./mmproj-<name>-<TYPE>.gguf``).
        outtype: f32, f16, bf16 or q8_0 (norms, biases and position embeddings stay F32; the patch
            embedding is F16 in an f16 file and F32 otherwise, as llama.cpp's converter writes them).

    Raises:
        InputNotFoundError, CorruptFileError, UnsupportedModelError, OutputExistsError,
        UnsafeOutputError (the output is an input, or its directory is unusable).
    """
    directory = resolve_checkpoint(target)
    name = checkpoint_name(target, directory)
    plan = plan_mmproj(directory, load_config(directory), outtype, name=name)
    out = check_output(resolve_output(output, default_mmproj_name(name, outtype)), directory)
    if out.exists() and not force:
        raise OutputExistsError(f"{out}: already exists (use --force to overwrite)")
    return write_mmproj(plan, out, force=force, progress=progress)
