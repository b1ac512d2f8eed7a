"""Arguments the benchmarks share, named as ggufdspark's own verbs name them (``-m``/``--target``,
``-md``/``--draft``, ``--server``)."""

from __future__ import annotations

import argparse


def add_pair_arguments(ap: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The pair to measure (both required unless ``required`` is false: then the benchmark makes a
    pair when none is given) and the engine that runs it."""
    ap.add_argument("-m", "--target", "--model", dest="target", required=required, help="target GGUF")
    ap.add_argument("-md", "--draft", dest="draft", required=required, help="DSpark draft GGUF")
    add_engine_arguments(ap)


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine and where it runs."""
    ap.add_argument("--server", help="llama-server (default: the build ggufdspark finds)")
    ap.add_argument("--gpu", action="store_true", help="offload both models (-ngl 99 -ngld 99), flash attention on")
