"""The trained pair that ships with the package (``ggufdspark/data/trained``), written out in Hub
layout: ``OUT/target`` (an ``Lfm2ForCausalLM`` trained on the Python standard library's sources) and
``OUT/drafter`` (its DSpark drafter, trained on the target's own greedy continuations).

``recipe.json`` beside them says how they were made (corpus, shapes, steps, losses, the machine,
accept length per position); ``ggufdspark.trained.recipe`` makes them again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ggufdspark.errors import InvalidArgumentError, OutputExistsError

DATA = Path(__file__).resolve().parent.parent / "data" / "trained"
PARTS = ("target", "drafter")
# held-out prompts of the recipe's corpus (standard-library files it never trained on), for the demo,
# the tests and the docs: each gives its own answer
PROMPTS = DATA / "prompts.json"


def available() -> bool:
    return all((DATA / p / "config.json").is_file() for p in PARTS)


def recipe() -> dict:
    """What ``recipe.json`` says about the shipped pair (corpus, shapes, losses, acceptance)."""
    return json.loads((DATA / "recipe.json").read_text())


def prompts() -> list[str]:
    return json.loads(PROMPTS.read_text())


def describe() -> str:
    """One line: what the shipped pair is."""
    r = recipe()
    t, d, e = r["target"], r["drafter"], r["eval"]
    return (f"the trained pair: an LFM2 target of {t['parameters'] / 1e6:.1f}M parameters trained on the "
            f"Python {r['corpus']['python']} standard library's .py files, its DSpark drafter of "
            f"{d['parameters'] / 1e6:.1f}M trained on the target's own greedy continuations "
            f"(accept length {e['accept_length']:.2f} at draft length {e['draft_length']} on held-out files, in torch)")


def write(out: str | Path, *, force: bool = False) -> list[Path]:
    """Copy the shipped pair to ``out/target`` and ``out/drafter``; returns the files written.

    Raises:
        InvalidArgumentError: this installation has no shipped pair.
        OutputExistsError: ``out`` is a non-empty directory and ``force`` is false.
    """
    if not available():
        raise InvalidArgumentError(f"{DATA}: this installation has no trained pair (ggufdspark/data/trained)")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"{out}: directory is not empty (use --force)")
    written = []
    for part in PARTS:
        dest = out / part
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted((DATA / part).iterdir()):
            if f.is_file():
                tmp = dest / f".{f.name}.partial"
                shutil.copyfile(f, tmp)
                tmp.replace(dest / f.name)
                written.append(dest / f.name)
    shutil.copyfile(DATA / "recipe.json", out / "recipe.json")
    written.append(out / "recipe.json")
    return written
