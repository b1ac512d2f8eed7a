"""What a vision projector (mmproj) GGUF holds, as llama.cpp's mtmd reads it: its metadata keys,
the tensor that fixes the width of the embeddings it hands to the language model, and that width.
Shared by the mmproj converter (which writes them) and ``check`` (which reads them)."""

from __future__ import annotations

from ggufdspark.gguffile.reader import GGUFFile


class ClipKey:
    """mmproj metadata keys (gguf-py ``Keys.Clip`` / ``Keys.ClipVision``)."""

    PROJECTOR_TYPE = "clip.projector_type"
    HAS_VISION_ENCODER = "clip.has_vision_encoder"
    USE_GELU = "clip.use_gelu"
    PROJECTION_DIM = "clip.vision.projection_dim"
    IMAGE_SIZE = "clip.vision.image_size"
    PATCH_SIZE = "clip.vision.patch_size"
    EMBEDDING_LENGTH = "clip.vision.embedding_length"
    FEED_FORWARD_LENGTH = "clip.vision.feed_forward_length"
    BLOCK_COUNT = "clip.vision.block_count"
    HEAD_COUNT = "clip.vision.attention.head_count"
    LAYERNORM_EPS = "clip.vision.attention.layer_norm_epsilon"
    IMAGE_MEAN = "clip.vision.image_mean"
    IMAGE_STD = "clip.vision.image_std"
    SCALE_FACTOR = "clip.vision.projector.scale_factor"


# projector type -> the tensor whose rows are the width of the embeddings handed to the language
# model (tools/mtmd/clip.cpp, clip_n_mmproj_embd: mm_2_w->ne[1] for these types)
PROJECTOR_OUTPUT_TENSOR = {"lfm2": "mm.2.weight", "kimivl": "mm.2.weight", "kimik25": "mm.2.weight",
                           "mlp": "mm.2.weight"}


def projector_width(m: GGUFFile) -> tuple[int | None, int | None, str | None]:
    """The width of the embeddings an mmproj hands to the language model, two ways.

    Returns:
        (rows of the projector's last tensor, or None where the type is not in
        ``PROJECTOR_OUTPUT_TENSOR``; ``clip.vision.projection_dim``; that tensor's name). mtmd takes
        the width from the tensor, so the tensor decides when both are known.
    """
    tname = PROJECTOR_OUTPUT_TENSOR.get(m.get_str(ClipKey.PROJECTOR_TYPE))
    shape = m.tensor_shape(tname, 2) if tname else None
    rows = shape[0] if shape is not None else None
    return rows, m.get_int(ClipKey.PROJECTION_DIM), tname
