"""Tensor overrides on llama-server's command line (``-ot PATTERN=BUFFER[,...]``, common/arg.cpp
``--override-tensor``): the one that loads the target's token table onto a GPU, and whether a
user's own arguments already place that table. Several ``-ot`` flags accumulate, and the loader
takes the first override whose pattern a tensor's name matches (``std::regex_search``,
src/llama-model-loader.cpp)."""

from __future__ import annotations

import re
from collections.abc import Mapping

# The target's token embedding table (GGUF tensor name) and the pattern that names it alone
# (LFM2's token_embd_norm.weight does not match).
TOKEN_TABLE_TENSOR = "token_embd.weight"
TOKEN_TABLE_PATTERN = r"token_embd\.weight"
# llama-server's tensor override flags; the value is always the next argument (no FLAG=VALUE form)
OVERRIDE_TENSOR_FLAGS = ("-ot", "--override-tensor")
# the same overrides from the engine's environment: common/arg.cpp reads it before the command line
# and appends to the same list, so its patterns come first, with or without an -ot flag
OVERRIDE_TENSOR_ENV = "LLAMA_ARG_OVERRIDE_TENSOR"


def env_override_args(env: Mapping[str, str]) -> list[str]:
    """The tensor overrides the engine takes from its environment ``env`` (``OVERRIDE_TENSOR_ENV``),
    as the flag pair they amount to; [] where it holds none."""
    value = env.get(OVERRIDE_TENSOR_ENV)
    return ["-ot", value] if value else []


def token_table_args(buffer: str) -> list[str]:
    """The flag pair that loads the token table into ``buffer`` (a buffer type's name: ``CUDA0``)."""
    return ["-ot", f"{TOKEN_TABLE_PATTERN}={buffer}"]


def with_token_table(args: list[str], buffer: str) -> list[str]:
    """``args`` with the token table loaded into ``buffer``: joined to the last tensor override there
    (after its own patterns, which match first), else as a flag pair at the end. One ``-ot`` flag:
    the engine applies every ``-ot`` given, but warns that a repeated flag is deprecated."""
    out = list(args)
    for i in range(len(out) - 2, -1, -1):
        if (out[i].replace("_", "-") if out[i].startswith("--") else out[i]) in OVERRIDE_TENSOR_FLAGS:
            out[i + 1] = f"{out[i + 1]},{TOKEN_TABLE_PATTERN}={buffer}"
            return out
    return out + token_table_args(buffer)


def overrides_token_table(args: list[str]) -> bool:
    """Whether llama-server arguments ``args`` place the token table themselves: a tensor override
    (``OVERRIDE_TENSOR_FLAGS``, ``--override_tensor`` as the engine reads it too) with a pattern that
    finds ``TOKEN_TABLE_TENSOR``; an override of ours after it would never apply. A pattern Python's
    ``re`` cannot read counts where it mentions ``token_embd``."""
    for flag, value in zip(args, args[1:]):
        if (flag.replace("_", "-") if flag.startswith("--") else flag) not in OVERRIDE_TENSOR_FLAGS:
            continue
        for pattern in (item.partition("=")[0] for item in value.split(",")):
            try:
                if re.search(pattern, TOKEN_TABLE_TENSOR):
                    return True
            except re.error:
                if "token_embd" in pattern:
                    return True
    return False
