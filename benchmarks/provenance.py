"""What a benchmark's result file records beside its numbers, so that a figure in
``benchmarks/results/`` can be traced: the command line, this checkout's commit, the engine (its
llama.cpp commit, build folder and patch series) and the devices that engine saw here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ggufdspark import engine, hardware
from ggufdspark.errors import GgufdsparkError

REPO = Path(__file__).resolve().parent.parent


def checkout_commit() -> str | None:
    """This checkout's commit (``git rev-parse --short HEAD``), ``+dirty`` when tracked files
    differ from it; None outside a git checkout."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def provenance(server: str | Path | None) -> dict:
    """``{"command", "checkout", "engine": {"path", "build", "commit", "patches"}, "devices"}``;
    ``devices`` as ``"NAME: DESCRIPTION"`` (``CUDA0: NVIDIA H100 80GB HBM3``), empty when the
    engine's devices could not be listed."""
    info = engine.find_engine(server)
    try:
        report = hardware.detect(info)
        devices = [f"{d.name}: {d.description}" for d in report.devices]
    except GgufdsparkError:
        devices = []
    path = Path(info.path)
    return {"command": sys.argv, "checkout": checkout_commit(),
            "engine": {"path": str(path), "build": path.parents[2].name if len(path.parents) > 2 else None,
                       "commit": info.commit, "patches": len(info.patches)},
            "devices": devices}
