"""Shared pytest fixtures. Each block belongs to one area; add yours in a block of its own."""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------
# doctor / bindings fixtures (tests/test_doctor.py, tests/test_bindings.py)
#
# These tests run against the real built engine and its real shared libraries. When the engine
# is absent they FAIL with what is missing (they never skip): build it with
# `ggufdspark build-engine`, or point GGUFDSPARK_SERVER at a shared-library llama-server build.
# ---------------------------------------------------------------------------------------------

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# A stand-in for "another llama.cpp": answers --version and --help like llama-server does, but
# its --spec-type list has no draft-dspark, and it knows no other flag (--list-devices included).
NON_DSPARK_SERVER = """#!/bin/sh
case "$1" in
  --version)
    echo "version: 4242 (deadbee)" >&2
    echo "built with cc for x86_64-linux-gnu" >&2
    exit 0 ;;
  --help|-h)
    echo "----- common params -----"
    echo "  --spec-type none,draft-simple,draft-eagle3,ngram-simple"
    echo "                          comma-separated list of types of speculative decoding to use"
    exit 0 ;;
  *)
    echo "error: invalid argument: $1" >&2
    exit 1 ;;
esac
"""


@pytest.fixture(scope="session")
def dspark_engine():
    """The engine ``find_engine()`` resolves to, checked to be a DSpark shared-library build."""
    from ggufdspark.bindings._loader import lib_filename
    from ggufdspark.engine import find_engine
    from ggufdspark.errors import EngineError

    try:
        info = find_engine()
    except EngineError as e:
        pytest.fail(f"no llama.cpp engine to test against ({e})")
    if not info.dspark:
        pytest.fail(f"{info.path} has no --spec-type draft-dspark: build the pinned engine "
                    "with 'ggufdspark build-engine'")
    lib_dir = Path(info.lib_dir or "")
    missing = [lib_filename(b) for b in ("ggml-base", "ggml", "llama")
               if not (lib_dir / lib_filename(b)).is_file()]
    if missing:
        pytest.fail(f"{lib_dir}: missing shared libraries {missing}: the engine must be built "
                    "with -DBUILD_SHARED_LIBS=ON ('ggufdspark build-engine' does)")
    return info


@pytest.fixture
def non_dspark_server(tmp_path) -> Path:
    """Path of an executable ``llama-server`` script without draft-dspark, in its own dir."""
    d = tmp_path / "other-engine"
    d.mkdir()
    exe = d / "llama-server"
    exe.write_text(NON_DSPARK_SERVER)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


@pytest.fixture
def ggufdspark_cli() -> Callable[..., subprocess.CompletedProcess]:
    """Run ``ggufdspark ARGS...`` in a fresh interpreter of this venv; returns the process.

    A subprocess, not CliRunner: what users see (exit code, stderr, no traceback) and fresh
    process-wide state (llama_cpp binds its libllama once per process).
    """

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH")) if p)
        return subprocess.run([sys.executable, "-m", "ggufdspark", *args], cwd=REPO_ROOT,
                              env=full_env, capture_output=True, text=True, timeout=timeout)

    return run

# ------------------------------------------------------------------ end doctor / bindings block
