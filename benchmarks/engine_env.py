"""The environment an engine started by a benchmark inherits: switches of the engine patch series
(``GGML_CUDA_SMALL_SHAPES=0``, ``LLAMA_SPEC_PROFILE=1``, ...) set for one arm only."""

from __future__ import annotations

import contextlib
import os
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
