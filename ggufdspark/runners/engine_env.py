"""The environment our llama-server processes start with: this process's, without the
``LLAMA_ARG_*`` variables of options ggufdspark sets on the engine's command line or leaves off on
purpose (``OWNED_ENV``), each left out said once, and without the API key variables, whose keys
ggufdspark follows instead (``env_api_keys``: they join the engine's private key file, so our own
requests carry one)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from ggufdspark.errors import InvalidArgumentError

# The models served (target, draft, projector, from files or the Hub), every speculative option,
# and where the engine listens. llama-server reads its environment before its command line
# (common/arg.cpp), so one of these left in a user's shell would add a draft to a plain server
# (LLAMA_ARG_SPEC_DRAFT_MODEL alone does on the pinned engine), a confidence cut to a drafted one,
# or another model or projector. LLAMA_ARG_API_PREFIX moves every route, /health included, away
# from where ggufdspark polls and asks (a working engine was killed at the start timeout); serve
# refuses --api-prefix after -- alike.
OWNED_ENV = re.compile(r"LLAMA_ARG_(SPEC_\w+|DRAFT_\w+|\w+_DRAFT|MODEL|MODEL_URL|HF_REPO|HF_FILE|DOCKER_REPO"
                       r"|MMPROJ\w*|HOST|PORT|API_PREFIX)")
# The engine's API key variables (common/arg.cpp: --api-key reads LLAMA_API_KEY, --api-key-file
# LLAMA_ARG_API_KEY_FILE; both add to the keys of the command line). Left in, they protect the
# engine with a key ggufdspark's own requests (bench, tune, serve's warm-up) do not send: 401 on
# every one. Followed instead: their keys join the private key file (``env_api_keys``), so the
# engine stays protected and our client has a key.
KEY_ENV = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")
_said: set[str] = set()  # the names already warned about (once a process)


def engine_environment(own: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """This process's environment without the ``OWNED_ENV`` variables, with ``own`` on top (a
    server's own, kept whatever they name); and the names left out. The ``KEY_ENV`` variables are
    left out too, unsaid: their keys are followed (``env_api_keys``), not ignored."""
    dropped = sorted(k for k in os.environ if OWNED_ENV.fullmatch(k) and k not in own)
    return {**{k: v for k, v in os.environ.items() if k not in dropped and k not in KEY_ENV}, **own}, dropped


def env_api_keys() -> list[str]:
    """The API keys the engine would take from this process's environment: ``LLAMA_API_KEY`` (a
    comma-separated list) and the lines of the file ``LLAMA_ARG_API_KEY_FILE`` names (blank lines and
    '#' comments skipped), as llama-server reads them.

    Raises:
        InvalidArgumentError: ``LLAMA_ARG_API_KEY_FILE`` names a file that cannot be read (the engine
            would refuse to start).
    """
    keys = [k for k in os.environ.get("LLAMA_API_KEY", "").split(",") if k]
    path = os.environ.get("LLAMA_ARG_API_KEY_FILE")
    if path:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError as e:
            raise InvalidArgumentError(f"LLAMA_ARG_API_KEY_FILE {path}: cannot read it "
                                       f"({e.strerror or e})") from None
        keys += [ln.rstrip("\r") for ln in text.split("\n") if ln.rstrip("\r") and not ln.startswith("#")]
    return keys


def dropped_warnings(dropped: list[str], *, again: bool = False) -> list[str]:
    """One warning for each name in ``dropped`` this process has not warned about yet, or
    (``again``: a plan's list) every one; either way they count as said, so a server started from a
    plan does not repeat them."""
    out = []
    for name in dropped:
        if again or name not in _said:
            _said.add(name)
            out.append(f"{name} in the environment is ignored: ggufdspark sets the models, the draft and the "
                       "address (host, port, API prefix) on llama-server's command line (engine flags go after --)")
    return out
