"""Ready-made GGUF pairs for tests, the demo and benchmarks: generate, then convert with our own
converters. Generation is deterministic, so a pair made twice is byte-identical."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ggufdspark.convert.drafter import convert_drafter
from ggufdspark.convert.target import convert_target
from ggufdspark.synthetic import synth


@dataclass
class Pair:
    target_dir: Path
    drafter_dir: Path
    target: Path  # target GGUF
    draft: Path  # draft GGUF


def build_pair(root: str | Path, *, target_spec: synth.TargetSpec = synth.SMALL_TARGET,
               drafter_spec: synth.DrafterSpec = synth.SMALL_DRAFTER, dtype: str = "BF16",
               outtype: str = "f16", name: str = "tiny-lfm2") -> Pair:
    """Generate a target + drafter under ``root`` and convert both (reusing finished files)."""
    root = Path(root)
    tdir, ddir = root / name, root / f"{name}-DSpark"
    target = root / f"{name}-{outtype.upper()}.gguf"
    draft = root / f"dspark-{name}-{outtype.upper()}.gguf"
    if not (tdir / "config.json").is_file():
        synth.make_target(tdir, target_spec, dtype=dtype)
    if not (ddir / "config.json").is_file():
        synth.make_drafter(ddir, tdir, drafter_spec, dtype=dtype)
    if not target.is_file():
        convert_target(tdir, output=target, outtype=outtype)
    if not draft.is_file():
        convert_drafter(ddir, target, output=draft, outtype=outtype)
    return Pair(tdir, ddir, target, draft)


def build_other_pair(root: str | Path) -> Pair:
    """A pair for a *different* target (other hidden size, other vocabulary): its draft must be
    refused next to the small target."""
    spec = replace(synth.SMALL_TARGET, hidden_size=96, vocab_size=1100, intermediate_size=256)
    return build_pair(root, target_spec=spec, name="other-lfm2")


def build_trained_pair(root: str | Path, *, outtype: str = "f16", name: str = "trained-lfm2") -> Pair:
    """The trained pair that ships with the package (``ggufdspark.trained.shipped``), converted: a
    drafter that really predicts its target (reusing finished files)."""
    from ggufdspark.trained import shipped

    root = Path(root)
    tdir, ddir = root / name / "target", root / name / "drafter"
    target = root / f"{name}-{outtype.upper()}.gguf"
    draft = root / f"dspark-{name}-{outtype.upper()}.gguf"
    if not (ddir / "config.json").is_file():
        shipped.write(root / name, force=True)
    if not target.is_file():
        convert_target(tdir, output=target, outtype=outtype)
    if not draft.is_file():
        convert_drafter(ddir, target, output=draft, outtype=outtype)
    return Pair(tdir, ddir, target, draft)
