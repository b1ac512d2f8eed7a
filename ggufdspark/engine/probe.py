"""Probe a ``llama-server``: does it run, which version and commit, which speculative types
(``draft-dspark`` above all), and what its build record says (backend, patch series)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark.engine.source import ENV_SERVER, PIN_COMMIT
from ggufdspark.errors import EngineError
from ggufdspark.runners import lifeline

log = logging.getLogger(__name__)

# Seconds an engine gets to answer --version / --help; a hung one is killed with all it started.
PROBE_TIMEOUT = 60.0


def engine_problem(exe: Path) -> str | None:
    """Why ``exe`` does not run (``--version`` fails or hangs), or None when it does."""
    try:
        r = lifeline.run([str(exe), "--version"], timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"'--version' did not answer within {PROBE_TIMEOUT:g} s"
    except OSError as e:
        return e.strerror or str(e)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"'--version' exited with code {r.returncode}: {last[0][:200]}"
    return None


# What --help says of --spec-draft-n-max-by-slots in an engine that pauses drafting at L = 0.
DRAFT_PAUSE_HELP = "L = 0: no draft"


@dataclass
class EngineInfo:
    """What we learned about one ``llama-server`` executable."""

    path: str
    source: str  # "explicit", "env", "cache", "path"
    version: str | None = None
    commit: str | None = None
    dspark: bool = False
    spec_types: list[str] = field(default_factory=list)
    lib_dir: str | None = None
    backend: str | None = None  # from the cache record when known
    patches: list[str] = field(default_factory=list)  # the patch series it was built with (cache record)
    # --spec-draft-n-max-by-slots takes L = 0, no new drafts above N busy slots (engine patch 0021
    # since the series that keeps the tapped layers on the device, 0026); older builds refuse it
    draft_pause: bool = False
    # --kv-unified-per-slot: each slot of a unified KV cache capped (upstream, in the pinned tree)
    kv_slot_cap: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def probe_engine(path: Path, source: str) -> EngineInfo:
    """Read ``--version`` and ``--help`` of ``path``."""
    if not path.exists():
        raise EngineError(f"{path}: llama-server not found (source: {source})")
    if not os.access(path, os.X_OK) or path.is_dir():
        raise EngineError(f"{path}: not an executable file (source: {source})")
    info = EngineInfo(path=str(path), source=source)
    try:
        ver = lifeline.run([str(path), "--version"], timeout=PROBE_TIMEOUT)
        hlp = lifeline.run([str(path), "--help"], timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise EngineError(f"{path}: cannot run it: '{e.cmd[-1]}' did not answer within {PROBE_TIMEOUT:g} s "
                          f"(stopped, with everything it started)") from None
    except OSError as e:
        raise EngineError(f"{path}: cannot run it: {e}") from None
    m = re.search(r"version:\s*(\S+)\s*\((?:build\s+\S+,\s*commit\s+)?(\w+)\)", ver.stdout + ver.stderr)
    if m:
        info.version, info.commit = m.group(1), m.group(2)
    text = hlp.stdout + hlp.stderr
    m = re.search(r"--spec-type\s+\[?([^\n]+)", text)
    if m:
        info.spec_types = re.findall(r"[a-z][a-z0-9-]+", m.group(1).split("]")[0].split("  ")[0])
    info.dspark = "draft-dspark" in text
    info.draft_pause = DRAFT_PAUSE_HELP in " ".join(text.split())
    info.kv_slot_cap = "--kv-unified-per-slot" in text
    info.lib_dir = str(path.parent)
    record = path.parent.parent.parent / "build.json"
    if record.is_file():
        try:
            rec = json.loads(record.read_text())
            info.backend = rec.get("backend")
            info.patches = [str(p) for p in rec.get("patches") or []]
        except (json.JSONDecodeError, AttributeError):
            pass
    return info


def require_dspark(info: EngineInfo) -> EngineInfo:
    """Refuse an engine that cannot run DSpark drafts.

    Raises:
        EngineError: ``--spec-type draft-dspark`` is not in the engine's help.
    """
    if not info.dspark:
        raise EngineError(
            f"{info.path}: this llama-server (version {info.version or '?'}, commit {info.commit or '?'}) "
            f"has no '--spec-type draft-dspark'; build the pinned engine with 'ggufdspark build-engine' "
            f"or point --server/{ENV_SERVER} at a build of llama.cpp {PIN_COMMIT} or newer")
    return info
