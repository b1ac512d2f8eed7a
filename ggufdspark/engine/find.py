"""Find the engine to use: an explicit path, ``$GGUFDSPARK_SERVER``, the cached build (GPU
backends first), then ``llama-server`` on ``PATH``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ggufdspark.engine.build import BuildSpec, built_server
from ggufdspark.engine.probe import EngineInfo, probe_engine
from ggufdspark.engine.source import ENV_SERVER, cache_dir
from ggufdspark.errors import EngineError


def _cached_candidates(cache: Path) -> list[Path]:
    """Finished builds of the pinned commit, GPU backends first (a user who built one wants it)."""
    order = {"cuda": 0, "metal": 1, "cpu": 2}
    found = []
    for backend in order:
        exe = built_server(BuildSpec(backend=backend), cache)
        if exe:
            found.append(exe)
    root = cache / "engine"
    if root.is_dir():
        for d in sorted(root.iterdir()):
            exe = d / "build" / "bin" / "llama-server"
            if (d / "build.json").is_file() and exe.is_file() and exe not in found:
                found.append(exe)
    return found


def _on_path(name: str | os.PathLike) -> Path:
    """``name`` as a path; a bare command name (no directory part, not a file here) looked up on
    ``PATH`` the way a shell would (``GGUFDSPARK_SERVER=llama-server``)."""
    text = os.fspath(name)
    if os.sep not in text and not os.path.exists(text) and (found := shutil.which(text)):
        return Path(found)
    return Path(text)


def find_engine(server: str | os.PathLike | None = None, *, cache: Path | None = None) -> EngineInfo:
    """Locate and probe an engine. See the module docstring for the lookup order.

    Raises:
        EngineError: nothing found, or the path given does not exist / is not executable.
    """
    cache = cache or cache_dir()
    if server:
        return probe_engine(_on_path(server), "explicit")
    if env := os.environ.get(ENV_SERVER):
        return probe_engine(_on_path(env), "env")
    cands = _cached_candidates(cache)
    if cands:
        return probe_engine(cands[0], "cache")
    if which := shutil.which("llama-server"):
        return probe_engine(Path(which), "path")
    raise EngineError("no llama-server found: run 'ggufdspark build-engine' (or pass --server PATH, "
                      f"or set {ENV_SERVER})")
