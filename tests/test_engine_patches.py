"""Engine patches checked below the server: small programs built against the engine's own ggml.

The lossless tests (greedy output with the draft against the target alone) check the patch series
end to end; these check one patch's arithmetic directly, where a mistake could hide behind a model
that happens not to care.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "engine"


def _compiled(engine, src: Path, out: Path) -> Path:
    """``src`` compiled and linked against the engine build's ggml (headers from its source tree)."""
    lib = Path(engine.lib_dir)
    inc = lib.parent.parent / "src" / "ggml" / "include"
    if not (inc / "ggml.h").is_file():
        pytest.fail(f"{inc}: no ggml headers next to the engine build {engine.path} (rebuild it with "
                    "'ggufdspark build-engine')")
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler (c++ or g++) on PATH: the engine's build needs one too")
    p = subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(inc), str(src), "-L", str(lib), "-lggml", "-lggml-base",
                        "-lggml-cpu", f"-Wl,-rpath,{lib}", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def test_conv_snapshots_by_set_rows_equal_one_copy_a_slot(dspark_engine, tmp_path):
    """Patch 0018: the conv state after a verify's snapshots written by SET_ROWS equals the pinned
    one CPY a slot, for d_conv 2 and 3, 3-64 tokens, 1 and 3 sequences, 4 and 7 slots; and the
    comparison catches the slots in reversed order."""
    exe = _compiled(dspark_engine, HERE / "conv_snapshots.cpp", tmp_path / "conv_snapshots")
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "28 cases, 0 mismatches" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([str(exe), "--reversed"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "28 cases, 28 mismatches" in p.stdout, p.stdout + p.stderr
