"""GGUF facts as tables: value types, ggml tensor types, and the key / tensor names the pinned
llama.cpp reads (``src/llama-arch.cpp``, ``src/models/dflash.cpp``, ``gguf-py/gguf/constants.py``
of commit 0c1e570).

PyPI's ``gguf`` 0.19.0 predates DSpark, so these names live here rather than being imported.
"""

from __future__ import annotations

from enum import IntEnum

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
DEFAULT_ALIGNMENT = 32


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format per scalar value type
SCALAR_FORMAT: dict[ValueType, str] = {
    ValueType.UINT8: "<B", ValueType.INT8: "<b", ValueType.UINT16: "<H", ValueType.INT16: "<h",
    ValueType.UINT32: "<I", ValueType.INT32: "<i", ValueType.FLOAT32: "<f", ValueType.BOOL: "<?",
    ValueType.UINT64: "<Q", ValueType.INT64: "<q", ValueType.FLOAT64: "<d",
}


class TensorType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


# (elements per block, bytes per block)
TYPE_SIZES: dict[TensorType, tuple[int, int]] = {
    TensorType.F32: (1, 4), TensorType.F16: (1, 2), TensorType.Q4_0: (32, 18),
    TensorType.Q4_1: (32, 20), TensorType.Q5_0: (32, 22), TensorType.Q5_1: (32, 24),
    TensorType.Q8_0: (32, 34), TensorType.Q8_1: (32, 36), TensorType.Q2_K: (256, 84),
    TensorType.Q3_K: (256, 110), TensorType.Q4_K: (256, 144), TensorType.Q5_K: (256, 176),
    TensorType.Q6_K: (256, 210), TensorType.Q8_K: (256, 292), TensorType.IQ2_XXS: (256, 66),
    TensorType.IQ2_XS: (256, 74), TensorType.IQ3_XXS: (256, 98), TensorType.IQ1_S: (256, 50),
    TensorType.IQ4_NL: (32, 18), TensorType.IQ3_S: (256, 110), TensorType.IQ2_S: (256, 82),
    TensorType.IQ4_XS: (256, 136), TensorType.I8: (1, 1), TensorType.I16: (1, 2),
    TensorType.I32: (1, 4), TensorType.I64: (1, 8), TensorType.F64: (1, 8),
    TensorType.IQ1_M: (256, 56), TensorType.BF16: (1, 2), TensorType.TQ1_0: (256, 54),
    TensorType.TQ2_0: (256, 66), TensorType.MXFP4: (32, 17), TensorType.NVFP4: (64, 36),
    TensorType.Q1_0: (128, 18), TensorType.Q2_0: (64, 18),
}

# general.file_type (llama_ftype, include/llama.h of the pinned tree) -> the quant label in file names
# and in ``-hf REPO:QUANT``.
FTYPE_LABELS: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

# The output types the converters write (``--outtype``), each the tensor type of every matrix. The
# one table of them: the names, labels and file types below, and quants.TENSOR_LABELS / FLOAT_TYPES,
# are read from it.
OUTTYPE_TENSOR: dict[str, TensorType] = {"f32": TensorType.F32, "f16": TensorType.F16, "bf16": TensorType.BF16,
                                         "q8_0": TensorType.Q8_0}
OUTTYPES = tuple(OUTTYPE_TENSOR)
# the quant label of an output type (file names, -hf REPO:QUANT): its tensor type's name
OUTTYPE_LABEL = {o: t.name for o, t in OUTTYPE_TENSOR.items()}
# general.file_type (llama_ftype) for the output types we write
FILE_TYPE = {o: next(ft for ft, label in FTYPE_LABELS.items() if label == OUTTYPE_LABEL[o]) for o in OUTTYPE_TENSOR}
QUANTIZATION_VERSION = 2
# llama_expert_gating_func_type (src/llama-hparams.h): LFM2-MoE routes with a sigmoid
EXPERT_GATING_SIGMOID = 2


class Key:
    """Metadata key names. ``{arch}`` is filled with the architecture string."""

    ARCH = "general.architecture"
    NAME = "general.name"
    TYPE = "general.type"
    FILE_TYPE = "general.file_type"
    QUANT_VERSION = "general.quantization_version"
    ALIGNMENT = "general.alignment"
    SIZE_LABEL = "general.size_label"
    BASENAME = "general.basename"

    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    VOCAB_SIZE = "{arch}.vocab_size"
    HEAD_COUNT = "{arch}.attention.head_count"
    HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    KEY_LENGTH = "{arch}.attention.key_length"
    VALUE_LENGTH = "{arch}.attention.value_length"
    RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
    ROPE_FREQ_BASE = "{arch}.rope.freq_base"
    SHORTCONV_L_CACHE = "{arch}.shortconv.l_cache"
    # mixture of experts (LFM2-MoE)
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    LEADING_DENSE_BLOCK_COUNT = "{arch}.leading_dense_block_count"
    EXPERT_GATING_FUNC = "{arch}.expert_gating_func"

    # DSpark / DFlash draft
    BLOCK_SIZE = "{arch}.block_size"
    TARGET_LAYERS = "{arch}.target_layers"
    SAMPLE_FROM_ANCHOR = "{arch}.sample_from_anchor"
    HAS_CONFIDENCE_HEAD = "{arch}.has_confidence_head"

    # tokenizer
    TOK_MODEL = "tokenizer.ggml.model"
    TOK_PRE = "tokenizer.ggml.pre"
    TOK_TOKENS = "tokenizer.ggml.tokens"
    TOK_TYPES = "tokenizer.ggml.token_type"
    TOK_SCORES = "tokenizer.ggml.scores"
    TOK_MERGES = "tokenizer.ggml.merges"
    TOK_BOS = "tokenizer.ggml.bos_token_id"
    TOK_EOS = "tokenizer.ggml.eos_token_id"
    TOK_UNK = "tokenizer.ggml.unknown_token_id"
    TOK_SEP = "tokenizer.ggml.seperator_token_id"  # sic, as in llama.cpp
    TOK_PAD = "tokenizer.ggml.padding_token_id"
    TOK_MASK = "tokenizer.ggml.mask_token_id"
    TOK_ADD_BOS = "tokenizer.ggml.add_bos_token"
    TOK_ADD_EOS = "tokenizer.ggml.add_eos_token"
    TOK_ADD_SEP = "tokenizer.ggml.add_sep_token"
    CHAT_TEMPLATE = "tokenizer.chat_template"

    @staticmethod
    def of(template: str, arch: str) -> str:
        return template.format(arch=arch)


class TokenType(IntEnum):
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


ARCH_DFLASH = "dflash"
ARCH_LFM2 = "lfm2"
ARCH_LFM2MOE = "lfm2moe"
ARCH_CLIP = "clip"

# The pre-tokenizer name llama.cpp maps the LFM2 tokenizer to.
LFM2_PRE_TOKENIZER = "lfm2"

# Keys that make up "the tokenizer": identical tokenizers must agree on all of them.
TOKENIZER_IDENTITY_KEYS = (
    Key.TOK_MODEL, Key.TOK_PRE, Key.TOK_TOKENS, Key.TOK_TYPES, Key.TOK_MERGES, Key.TOK_BOS,
    Key.TOK_EOS, Key.TOK_UNK, Key.TOK_PAD, Key.TOK_SEP,
)
