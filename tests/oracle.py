"""Run llama.cpp's own reference converter (pinned tree) as the oracle for our converter.

The reference converter recognises a BPE pre-tokenizer by hashing a sample tokenization, so a
tokenizer generated here is unknown to it. The oracle is told the pre-tokenizer name ("lfm2", what
the real LFM2 tokenizer maps to) by replacing that one lookup; nothing else is changed. It runs in
a child process, with the pinned tree's own ``gguf-py`` first on ``sys.path``.

Usage (script): ``python tests/oracle.py TREE PRE -- convert_hf_to_gguf args...``
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ggufdspark import engine
from ggufdspark.gguffile.reader import read_gguf


def compare_gguf(mine: Path, ref: Path, *, general: tuple[str, ...] = (), kept_float: dict[str, str] | None = None) -> None:
    """Assert two GGUF files equal key for key (value and type) and tensor for tensor (name, shape,
    type, bytes). ``general.*`` naming keys are cosmetic and left out, except the architecture, file
    type and quantization version, and those named in ``general``. ``kept_float`` maps tensors our
    policy keeps in float where the reference quantizes them (a draft's Markov head) to the type
    they must have in ``mine``; their bytes are not compared."""
    kept_float = kept_float or {}
    a, b = read_gguf(mine), read_gguf(ref)
    kept = ("general.architecture", "general.file_type", "general.quantization_version", *general)

    def keys(g):
        return {k for k in g.metadata if not k.startswith("general.") or k in kept}

    assert keys(a) == keys(b), f"keys only mine {keys(a) - keys(b)}, only reference {keys(b) - keys(a)}"
    for k in sorted(keys(a)):
        assert a.value_types[k] == b.value_types[k], f"{k}: type {a.value_types[k]} vs {b.value_types[k]}"
        assert a.metadata[k] == b.metadata[k], f"{k}: {str(a.metadata[k])[:80]} vs {str(b.metadata[k])[:80]}"
    assert set(a.tensors) == set(b.tensors), \
        f"only mine {set(a.tensors) - set(b.tensors)}, only ref {set(b.tensors) - set(a.tensors)}"
    for n in sorted(a.tensors):
        ta, tb = a.tensors[n], b.tensors[n]
        if n in kept_float:
            assert (ta.shape, ta.type_name) == (tb.shape, kept_float[n]), f"{n}: {ta.type_name}, not {kept_float[n]}"
            continue
        assert (ta.shape, ta.type_name) == (tb.shape, tb.type_name), \
            f"{n}: {ta.shape} {ta.type_name} vs {tb.shape} {tb.type_name}"
        assert np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)), f"{n}: bytes differ"


def run_reference(args: list[str], *, pre: str = "lfm2", tree: Path | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess:
    """Run ``convert_hf_to_gguf.py args`` from the pinned tree with the pre-tokenizer forced."""
    tree = tree or engine.llama_cpp_tree()
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"{tree}: pinned llama.cpp tree not found; run 'ggufdspark build-engine'")
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    cmd = [sys.executable, str(Path(__file__).resolve()), str(tree), pre, "--", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _main(argv: list[str]) -> None:
    tree, pre, sep, *rest = argv
    assert sep == "--"
    sys.path.insert(0, str(Path(tree) / "gguf-py"))
    sys.path.insert(0, tree)
    import conversion.base as base  # noqa: E402  (from the pinned tree)

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    import convert_hf_to_gguf  # noqa: E402

    sys.argv = ["convert_hf_to_gguf.py", *rest]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    _main(sys.argv[1:])
