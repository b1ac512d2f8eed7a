"""The environment our llama-server processes start with: this process's, without the
``LLAMA_ARG_*`` variables of options ggufdspark sets on the engine's command line or leaves off on
purpose (``OWNED_ENV``), each left out said once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# The models served (target, draft, projector, from files or the Hub), every speculative option,
# and where the engine listens. llama-server reads its environment before its command line
# (common/arg.cpp), so one of these left in a user's shell would add a draft to a plain server
# (LLAMA_ARG_SPEC_DRAFT_MODEL alone does on the pinned engine), a confidence cut to a drafted one,
# or another model or projector. LLAMA_ARG_API_KEY_FILE is not among them: a key the user set
# protects the engine still.
OWNED_ENV = re.compile(r"LLAMA_ARG_(SPEC_\w+|DRAFT_\w+|\w+_DRAFT|MODEL|MODEL_URL|HF_REPO|HF_FILE|DOCKER_REPO"
                       r"|MMPROJ\w*|HOST|PORT)")
_said: set[str] = set()  # the names already warned about (once a process)


def engine_environment(own: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """This process's environment without the ``OWNED_ENV`` variables, with ``own`` on top (a
    server's own, kept whatever they name); and the names left out."""
    dropped = sorted(k for k in os.environ if OWNED_ENV.fullmatch(k) and k not in own)
    return {**{k: v for k, v in os.environ.items() if k not in dropped}, **own}, dropped


def dropped_warnings(dropped: list[str], *, again: bool = False) -> list[str]:
    """One warning for each name in ``dropped`` this process has not warned about yet, or
    (``again``: a plan's list) every one; either way they count as said, so a server started from a
    plan does not repeat them."""
    out = []
    for name in dropped:
        if again or name not in _said:
            _said.add(name)
            out.append(f"{name} in the environment is ignored: ggufdspark sets the models, the draft and the "
                       "address on llama-server's command line (engine flags go after --)")
    return out
