"""The environment an engine started by a benchmark inherits: switches of the engine patch series
(``GGML_CUDA_MMF_FEW=4``, ``LLAMA_SPEC_PROFILE=1``, ...) set for one arm only."""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` while the block runs; the previous values (or their absence) come back after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_env(text: str) -> dict[str, str]:
    """``"A=1,B=8"`` or ``"A=1 B=8"`` -> ``{"A": "1", "B": "8"}``: items separated by commas or
    spaces, as the device script's arm specs write them (``LOAD_ARMS``), empty items skipped. A
    space-separated group once went in whole as one variable's value (``A`` = ``"1 B=8"``), so the
    second switch was silently not set; no switch of the series takes a value with a space.

    Raises:
        ValueError: an item is not NAME=VALUE (the message names it).
    """
    pairs = [kv for kv in re.split(r"[,\s]+", text) if kv]
    bad = [kv for kv in pairs if "=" not in kv]
    if bad:
        raise ValueError(f"{bad[0]!r} is not NAME=VALUE")
    return dict(kv.split("=", 1) for kv in pairs)


ENV_WORD = re.compile(r"[A-Z][A-Z0-9_]*=")


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """An arm spec's words: the ``KEY=VALUE`` ones (upper-case KEY: an engine environment variable)
    as a dict, and the others in their order."""
    env = dict(w.split("=", 1) for w in words if ENV_WORD.match(w))
    return env, [w for w in words if not ENV_WORD.match(w)]
