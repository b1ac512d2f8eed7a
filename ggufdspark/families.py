"""The four LiquidAI DSpark pairs (issue 16): each target's shape, its drafter's, and how to tell
which family a GGUF belongs to, so ``check`` can say "this draft was made for another model".

Where each number comes from (``FACTS`` below says the same per family):

* **1.2b** ``LiquidAI/LFM2.5-1.2B-Instruct``: published model card (16 layers, 10 conv + 6 GQA,
  vocabulary 65,536) and the LFM2-1.2B config layout it keeps (hidden 2048, attention at layers
  2, 5, 8, 10, 12, 14, 32 heads / 8 KV heads, ``block_ff_dim`` 12288 auto-adjusted to 8192).
* **2.6b** ``LiquidAI/LFM2.5-2.6B``: the LFM2-2.6B config layout (hidden 2048, 30 layers, attention
  at 2, 5, 9, 13, 17, 21, 24, 27, FFN 10752 without auto-adjust); the drafter's taps
  ``[2, 9, 17, 21, 27]`` and mask id 125017 are the published drafter's (shared/DESIGN.md).
  The vocabulary (128,000) is ASSUMED: the LFM2.5 tokenizer of the 8B-A1B and VL-3B (a mask id of
  125017 needs more than LFM2's 65,536).
* **8b-a1b** ``LiquidAI/LFM2.5-8B-A1B``: published card (24 layers, 18 conv + 6 GQA, vocabulary
  128,000, 32 experts, 4 active, 8.3B total / 1.5B active) and transformers' ``Lfm2MoeConfig``
  (hidden 2048, FFN 7168 in the 2 dense lead layers, experts 1792 wide). The attention layer
  positions (2, 6, 10, 14, 18, 21) are ASSUMED (LFM2-8B-A1B's layout as remembered, not checked).
* **vl-3b** ``LiquidAI/LFM2.5-VL-3B``: the language tower this toolkit was built around
  (shared/DESIGN.md: hidden 2048, 30 layers, vocabulary 128,000) and its published 279.5M drafter.

Drafters: hidden size and vocabulary are always the target's (the drafter borrows the target's
embeddings). Only the VL-3B drafter's shape and the 2.6B taps are published; the 1.2B and 8B-A1B
drafters are ASSUMED to have the same layout (4 layers, block 9, Markov rank 256) with five taps at
the same relative depths as the published ones. The block size is whatever the drafter's
``config.json`` says (``block_size``); the converter and every later step read it from there.

The small sizes are test shapes, one per family, different from each other in the way the full
ones differ (layer count, taps, MoE or dense) so a drafter of one never passes for another's. No
drafter taps its target's last layer: the pinned engine's LFM2 graph cannot (see ``check``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ggufdspark.shapes import FULL_DRAFTER, FULL_TARGET, SMALL_DRAFTER, SMALL_TARGET, DrafterSpec, TargetSpec

SIZES = ("small", "full")


@dataclass(frozen=True)
class Family:
    """One published target / DSpark drafter pair."""

    name: str  # the ``--family`` value
    model: str  # the target's Hub name (LiquidAI/...)
    drafter_repo: str
    vl: bool  # the target is a vision-language model (an mmproj comes with it)
    targets: dict[str, TargetSpec]  # size -> shape
    drafters: dict[str, DrafterSpec]
    assumed: str  # what in the full shape is not published

    @property
    def moe(self) -> bool:
        return self.targets["full"].moe

    @property
    def title(self) -> str:
        return self.model.split("/")[-1]


_FULL_1_2B = TargetSpec(vocab_size=65536, hidden_size=2048, intermediate_size=8192, ff_auto_adjust=True,
                        num_hidden_layers=16, attention_layers=(2, 5, 8, 10, 12, 14), num_attention_heads=32,
                        num_key_value_heads=8)
_FULL_2_6B = TargetSpec(vocab_size=128000, hidden_size=2048, intermediate_size=10752, num_hidden_layers=30,
                        attention_layers=(2, 5, 9, 13, 17, 21, 24, 27), num_attention_heads=32, num_key_value_heads=8)
_FULL_8B_A1B = TargetSpec(vocab_size=128000, hidden_size=2048, intermediate_size=7168, num_hidden_layers=24,
                          attention_layers=(2, 6, 10, 14, 18, 21), num_attention_heads=32, num_key_value_heads=8,
                          num_experts=32, num_experts_per_tok=4, num_dense_layers=2, moe_intermediate_size=1792)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("1.2b", "LiquidAI/LFM2.5-1.2B-Instruct", "LiquidAI/LFM2.5-1.2B-Instruct-DSpark", False,
           {"small": TargetSpec(hidden_size=64, intermediate_size=256, ff_auto_adjust=True, num_hidden_layers=8,
                                attention_layers=(2, 5, 7)),
            "full": _FULL_1_2B},
           {"small": replace(SMALL_DRAFTER, target_layer_ids=(1, 4, 6), block_size=5),
            "full": replace(FULL_DRAFTER, target_layer_ids=(1, 5, 9, 11, 14))},
           "drafter taps and layout (the VL-3B drafter's, scaled to 16 layers); drafter repo name"),
    Family("2.6b", "LiquidAI/LFM2.5-2.6B", "LiquidAI/LFM2.5-2.6B-DSpark", False,
           {"small": TargetSpec(hidden_size=64, intermediate_size=192, num_hidden_layers=10,
                                attention_layers=(2, 5, 8)),
            "full": _FULL_2_6B},
           {"small": replace(SMALL_DRAFTER, target_layer_ids=(2, 5, 7, 8), block_size=7),
            "full": FULL_DRAFTER},
           "vocabulary 128000 (the LFM2.5 tokenizer); drafter layout beyond its taps; drafter repo name"),
    Family("8b-a1b", "LiquidAI/LFM2.5-8B-A1B", "LiquidAI/LFM2.5-8B-A1B-DSpark", False,
           {"small": TargetSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=6, attention_layers=(2, 4),
                                num_experts=4, num_experts_per_tok=2, num_dense_layers=2, moe_intermediate_size=64),
            "full": _FULL_8B_A1B},
           {"small": replace(SMALL_DRAFTER, target_layer_ids=(0, 2, 4)),
            "full": replace(FULL_DRAFTER, target_layer_ids=(2, 7, 14, 17, 22))},
           "attention layer positions; drafter taps and layout; drafter repo name"),
    Family("vl-3b", "LiquidAI/LFM2.5-VL-3B", "LiquidAI/LFM2.5-VL-3B-DSpark", True,
           {"small": SMALL_TARGET, "full": FULL_TARGET},
           {"small": SMALL_DRAFTER, "full": FULL_DRAFTER},
           "the tower's attention positions and FFN width (shared/DESIGN.md's generated shape)"),
)}
DEFAULT_FAMILY = "vl-3b"


def family(name: str) -> Family:
    """The family called ``name`` (``1.2b``, ``2.6b``, ``8b-a1b``, ``vl-3b``). Raises KeyError."""
    return FAMILIES[name]


# --------------------------------------------------------------------------- recognising a GGUF


@dataclass(frozen=True)
class TargetShape:
    """What tells target families apart, as read from a target GGUF's header."""

    arch: str | None
    hidden: int | None
    layers: int | None
    vocab: int | None

    @property
    def moe(self) -> bool:
        return self.arch == "lfm2moe"

    def describe(self) -> str:
        kind = "MoE" if self.moe else "dense"
        return f"{kind} {self.arch}, {self.layers} layers, hidden {self.hidden}, vocabulary {self.vocab}"


def target_shape(spec: TargetSpec) -> TargetShape:
    return TargetShape("lfm2moe" if spec.moe else "lfm2", spec.hidden_size, spec.num_hidden_layers,
                       spec.vocab_size)


def identify_target(shape: TargetShape) -> list[tuple[Family, str]]:
    """The (family, size) whose target has this arch, hidden size, layer count and vocabulary;
    several where those agree (2.6B and VL-3B). Attention positions are not compared: some are
    assumed (8B-A1B), and a wrong guess must not refuse a real pair."""
    out = []
    for f in FAMILIES.values():
        for size, spec in f.targets.items():
            s = target_shape(spec)
            if (s.arch, s.hidden, s.layers, s.vocab) == (shape.arch, shape.hidden, shape.layers, shape.vocab):
                out.append((f, size))
    return out


def identify_draft(hidden: int | None, taps: list[int], vocab: int | None) -> list[tuple[Family, str]]:
    """The (family, size) whose drafter has this hidden size, vocabulary and tapped layers
    (``taps`` are target_layer_ids, 0-based). Several where drafters share a shape (2.6B, VL-3B)."""
    out = []
    for f in FAMILIES.values():
        for size, d in f.drafters.items():
            t = f.targets[size]
            if (t.hidden_size, t.vocab_size, list(d.target_layer_ids)) == (hidden, vocab, list(taps)):
                out.append((f, size))
    return out


def names(found: list[tuple[Family, str]]) -> str:
    """``LFM2.5-1.2B-Instruct (small)`` or ``LFM2.5-2.6B / LFM2.5-VL-3B (full)``."""
    titles = list(dict.fromkeys(f.title for f, _ in found))
    sizes = list(dict.fromkeys(s for _, s in found))
    return " / ".join(titles) + f" ({', '.join(sizes)})"


def differences(expected: TargetShape, actual: TargetShape) -> list[str]:
    """What differs between the target a drafter was made for and the one it meets."""
    out = []
    if expected.moe != actual.moe:
        out.append(f"{'MoE' if expected.moe else 'dense'} target expected, this one is "
                   f"{'MoE' if actual.moe else 'dense'} ({actual.arch})")
    if expected.layers != actual.layers:
        out.append(f"{expected.layers} target layers expected, this one has {actual.layers}")
    if expected.hidden != actual.hidden:
        out.append(f"hidden size {expected.hidden} expected, this one has {actual.hidden}")
    if expected.vocab != actual.vocab:
        out.append(f"vocabulary {expected.vocab} expected, this one has {actual.vocab}")
    return out


__all__ = ["Family", "FAMILIES", "DEFAULT_FAMILY", "SIZES", "family", "TargetShape", "target_shape",
           "identify_target", "identify_draft", "names", "differences"]
