"""``inspect``: what a GGUF file is, from its header alone (fast on multi-GB files)."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ggufdspark.gguffile.constants import ARCH_CLIP, ARCH_DFLASH, TOKENIZER_IDENTITY_KEYS, Key
from ggufdspark.gguffile.reader import GGUFFile, read_gguf

DSPARK_TENSORS = ("markov_w1.weight", "markov_w2.weight")
# the types the tokenizer keys must have (the others are integer ids, named ``*_id``)
TOKENIZER_STR_LISTS = (Key.TOK_TOKENS, Key.TOK_MERGES)
TOKENIZER_INT_LISTS = (Key.TOK_TYPES,)
TOKENIZER_STRINGS = (Key.TOK_MODEL, Key.TOK_PRE)
# draft tensors whose shapes ``check`` and the engine read: anything but a matrix is a corrupt file
DRAFT_MATRICES = ("fc.weight", *DSPARK_TENSORS)


@dataclass
class GGUFSummary:
    path: str
    file_size: int
    arch: str | None
    kind: str  # "dspark-draft", "dflash-draft", "target", "mmproj", "other"
    name: str | None
    n_tensors: int
    tensor_types: dict[str, int]
    file_type: int | None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def classify(g: GGUFFile) -> str:
    if g.arch == ARCH_DFLASH:
        return "dspark-draft" if all(t in g.tensors for t in DSPARK_TENSORS) else "dflash-draft"
    if g.arch == ARCH_CLIP:
        return "mmproj"
    if g.get(Key.EMBEDDING_LENGTH) is not None and Key.TOK_TOKENS in g.metadata:
        return "target"
    return "other"


def tokenizer_value(g: GGUFFile, key: str) -> Any:
    """One tokenizer key, type-checked. Raises CorruptFileError naming file, key and value."""
    if key in TOKENIZER_STR_LISTS:
        return g.get_str_list(key)
    if key in TOKENIZER_INT_LISTS:
        return g.get_int_list(key)
    if key in TOKENIZER_STRINGS:
        return g.get_str(key)
    return g.get_int(key) if key.endswith("_id") else g.metadata.get(key)


def vocab_size(g: GGUFFile) -> int | None:
    """The vocabulary size: ``{arch}.vocab_size``, else the token list, else the embedding rows.

    Raises:
        CorruptFileError: one of those has the wrong type or shape.
    """
    if (v := g.get_int(Key.VOCAB_SIZE)) is not None:
        return v
    if (toks := g.get_str_list(Key.TOK_TOKENS)) is not None:
        return len(toks)
    if (shape := g.tensor_shape("token_embd.weight", 2)) is not None:
        return shape[0]
    return None


def summarize_gguf(g: GGUFFile) -> GGUFSummary:
    kind = classify(g)
    types = Counter(t.type_name for t in g.tensors.values())
    d: dict[str, Any] = {}
    for key in TOKENIZER_IDENTITY_KEYS:  # a malformed tokenizer is reported here, not by the engine
        tokenizer_value(g, key)
    if kind in ("dspark-draft", "dflash-draft"):
        for name in DRAFT_MATRICES:
            g.tensor_shape(name, 2)
        d.update(
            block_size=g.get_int(Key.BLOCK_SIZE), target_layers=g.get_int_list(Key.TARGET_LAYERS),
            target_layer_ids=[i - 1 for i in (g.get_int_list(Key.TARGET_LAYERS) or [])],
            mask_token_id=g.get_int(Key.TOK_MASK), layers=g.get_int(Key.BLOCK_COUNT),
            hidden_size=g.get_int(Key.EMBEDDING_LENGTH), vocab_size=vocab_size(g),
            markov_head=all(t in g.tensors for t in DSPARK_TENSORS),
            markov_rank=(g.tensor_shape("markov_w1.weight", 2) or (None, None))[1],
            confidence_head=bool(g.get(Key.HAS_CONFIDENCE_HEAD)) and "conf_proj.weight" in g.tensors,
            sample_from_anchor=g.get(Key.SAMPLE_FROM_ANCHOR), tokenizer_pre=g.metadata.get(Key.TOK_PRE))
    elif kind == "target":
        kv = g.get(Key.HEAD_COUNT_KV)
        d.update(layers=g.get_int(Key.BLOCK_COUNT), hidden_size=g.get_int(Key.EMBEDDING_LENGTH),
                 vocab_size=vocab_size(g), context_length=g.get_int(Key.CONTEXT_LENGTH),
                 attention_layers=sum(1 for x in kv if x) if isinstance(kv, list) else None,
                 tokenizer_pre=g.metadata.get(Key.TOK_PRE),
                 chat_template=Key.CHAT_TEMPLATE in g.metadata)
        if (n_exp := g.get_int(Key.EXPERT_COUNT)) is not None:  # LFM2-MoE
            d.update(experts=n_exp, experts_used=g.get_int(Key.EXPERT_USED_COUNT),
                     dense_lead_layers=g.get_int(Key.LEADING_DENSE_BLOCK_COUNT))
    elif kind == "mmproj":
        d.update(projector_type=g.metadata.get("clip.projector_type"),
                 projection_dim=g.metadata.get("clip.vision.projection_dim"),
                 vision_layers=g.metadata.get("clip.vision.block_count"))
    return GGUFSummary(str(g.path), g.file_size, g.arch, kind, g.metadata.get(Key.NAME), len(g.tensors),
                       dict(sorted(types.items())), g.metadata.get(Key.FILE_TYPE), d)


def inspect_gguf(path: str | Path) -> GGUFSummary:
    """Summarize a GGUF file. Raises InputNotFoundError / CorruptFileError."""
    return summarize_gguf(read_gguf(path))
