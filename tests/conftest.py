"""Shared pytest fixtures. Each block belongs to one area; add yours in a block of its own."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# what every process the suite starts inherits (set when pytest loads this file, before any test)
# ---------------------------------------------------------------------------------------------

# One compute thread per llama-server (the engine's -t, read from its environment: ggufdspark leaves
# LLAMA_ARG_THREADS to the engine, and the draft's and the batch's threads follow it). The tiny
# generated models gain nothing from a second thread, and the engine's OpenMP workers spin at every
# barrier: two-thread servers side by side (a plain and a drafted arm, two xdist workers, another job
# on the machine) wait on each other's cores. A value already in the environment wins.
os.environ.setdefault("LLAMA_ARG_THREADS", "1")

# Tests stop their children with SIGINT and SIGHUP and expect the defaults there (Ctrl-C, a closed
# terminal). A suite started where those are ignored (nohup; a background job of a script without job
# control ignores SIGINT) would hand its children the ignored disposition, which exec keeps, and
# ggufdspark leaves an inherited ignored signal ignored, as nohup asks. A handler is reset to the
# default at exec: swap an inherited SIG_IGN for a handler that does nothing, so pytest still
# ignores the signal and its children start as they would from a terminal.
for _sig in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, lambda signum, frame: None)

# ---------------------------------------------------------------------------------------------
# doctor / bindings fixtures (tests/test_doctor.py, tests/test_bindings.py)
#
# These tests run against the real built engine and its real shared libraries. When the engine
# is absent they FAIL with what is missing (they never skip): build it with
# `ggufdspark build-engine`, or point GGUFDSPARK_SERVER at a shared-library llama-server build.
# ---------------------------------------------------------------------------------------------

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


@pytest.fixture(scope="session")
def engine_src(dspark_engine) -> Path:
    """The patched source tree the engine under test was built from (the engine cache keeps it
    beside the build: KEY/build/bin/llama-server, KEY/src): what tells a developer build's patches."""
    src = Path(dspark_engine.path).resolve().parent.parent.parent / "src"
    assert src.is_dir(), f"the engine cache has no source tree beside its build: {src}"
    return src


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


# ---------------------------------------------------------------------------------------------
# model pairs and servers (convert / check / serve / timings / bench tests)
#
# Pairs are generated by ggufdspark.synthetic.synth and converted by our own converters, once per
# session. Servers are real llama-server processes of the built engine, always stopped.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pairs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pairs")


@pytest.fixture(scope="session")
def small_pair(pairs_root):
    """The small generated target + DSpark draft, converted to F16 GGUF."""
    from ggufdspark.synthetic.pairs import build_pair

    return build_pair(pairs_root)


@pytest.fixture(scope="session")
def trained_pair(pairs_root):
    """The trained pair that ships here (``generate --trained``), converted to F16 GGUF: a drafter
    that really predicts, and a target slow enough on this CPU for a step to take over a millisecond."""
    from ggufdspark.synthetic.pairs import build_trained_pair
    from ggufdspark.trained import shipped

    if not shipped.available():
        pytest.fail(f"{shipped.DATA}: the trained pair is missing from this checkout")
    return build_trained_pair(pairs_root)


@pytest.fixture(scope="session")
def vl_pair(pairs_root):
    """The small generated VL target (its language tower and its real mmproj) and its DSpark draft,
    F16: ``{"dir", "drafter_dir", "tower", "mmproj", "draft"}``."""
    from ggufdspark.convert.drafter import convert_drafter
    from ggufdspark.convert.target import convert_target
    from ggufdspark.synthetic import synth, synth_vl

    root = pairs_root / "vl-pair"
    target_dir = synth_vl.make_vl_target(root / "tiny-lfm2-vl", layout="published")
    drafter_dir = synth.make_drafter(root / "tiny-lfm2-vl-DSpark", target_dir)
    out = root / "gguf"
    out.mkdir()
    r = convert_target(target_dir, output=out)
    draft = convert_drafter(drafter_dir, r.path, output=out / "dspark-tiny-lfm2-vl-F16.gguf").path
    return {"dir": target_dir, "drafter_dir": drafter_dir, "tower": r.path, "mmproj": r.mmproj.path, "draft": draft}


@pytest.fixture(scope="session")
def strong_conv_pair(pairs_root):
    """The small pair with conv layers as strong as the rest (``TargetSpec.conv_std``): a wrong
    conv state after a verify changes its output, which the small pair's weak conv layers hide."""
    from dataclasses import replace

    from ggufdspark.synthetic import synth
    from ggufdspark.synthetic.pairs import build_pair

    return build_pair(pairs_root, target_spec=replace(synth.SMALL_TARGET, conv_std=(1.0, 1.0)), name="strong-conv-lfm2")


@pytest.fixture(scope="session")
def hidden_conf_pair(pairs_root):
    """The strong-conv target with a drafter whose draft lengths follow its hidden state, so that
    wrong target features (injected into its context) show in what a client sees. The small
    drafter's Markov head still picks the tokens (repeat the last one: some get accepted), but its
    confidence head is centred on 0.5 with logits about N(0, 1) (``DrafterSpec.confidence_bias`` 0,
    ``confidence_std`` 0.1), and its attention picks a few context positions (``qk_norm_gain`` 2.5)
    instead of averaging the features away. Served with ``--spec-draft-p-min 0.5`` (the engine's
    default, 0, never reads the confidence), drafts stop wherever the confidence falls below 0.5."""
    from dataclasses import replace

    from ggufdspark.synthetic import synth
    from ggufdspark.synthetic.pairs import build_pair

    return build_pair(pairs_root, target_spec=replace(synth.SMALL_TARGET, conv_std=(1.0, 1.0)),
                      drafter_spec=replace(synth.SMALL_DRAFTER, confidence_bias=0.0, confidence_std=0.1,
                                           qk_norm_gain=2.5),
                      name="hidden-conf-lfm2")


@pytest.fixture(scope="session")
def other_pair(pairs_root):
    """A pair made for a different target (hidden 96, vocabulary 1100)."""
    from ggufdspark.synthetic.pairs import build_other_pair

    return build_other_pair(pairs_root)


@pytest.fixture
def start_server(dspark_engine, tmp_path):
    """Start real llama-server processes; every one is stopped at the end of the test."""
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    started = []

    def start(**kw) -> "ServerProcess":
        settings = ServerSettings(server=dspark_engine.path, **kw)
        srv = ServerProcess(settings, log_path=tmp_path / f"server-{len(started)}.log", start_timeout=120)
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()

@pytest.fixture(scope="session")
def mmproj(small_pair, pairs_root) -> Path:
    """A header-valid vision projector for the small target (projects to its hidden size, 64)."""
    path = pairs_root / "mmproj-tiny-lfm2-F16.gguf"
    from ggufdspark.gguffile.constants import TensorType
    from ggufdspark.gguffile.writer import GGUFWriter

    if not path.exists():
        w = GGUFWriter(path)
        w.add_string("general.architecture", "clip")
        w.add_uint32("general.file_type", 1)
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.projector_type", "lfm2")
        w.add_uint32("clip.vision.projection_dim", 64)
        w.add_tensor("mm.2.weight", (64, 96), TensorType.F16)
        w.write(lambda name: [bytes(64 * 96 * 2)])
    return path


# ------------------------------------------------------------------ end pairs / servers block


@pytest.fixture
def isolated(dspark_engine, tmp_path, monkeypatch):
    """Env for CLI runs and library calls: the built engine, a private cache (no stray profiles)."""
    env = {"GGUFDSPARK_CACHE": str(tmp_path / "cache"), "GGUFDSPARK_SERVER": dspark_engine.path}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


# ---------------------------------------------------------------------------------------------
# quantized pairs (tests/test_quantize.py, tests/test_publish_quants.py)
#
# The small pair quantized by the engine's own llama-quantize (`build-engine --with-tools`), once
# per session. Without llama-quantize beside the engine these tests FAIL saying how to build it.
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def quant_pair(small_pair, pairs_root, dspark_engine) -> dict[str, Path]:
    """``{"target-Q8_0": path, "target-Q4_K_M": path, "draft-Q8_0": path}`` next to the F16 pair."""
    from ggufdspark.errors import EngineError
    from ggufdspark.quantize import find_quantize, quantize

    try:
        find_quantize(dspark_engine.path)
    except EngineError as e:
        pytest.fail(str(e))
    d = pairs_root / "quant"
    d.mkdir(exist_ok=True)
    out = {}
    for role, src, qtype in (("target", small_pair.target, "Q8_0"), ("target", small_pair.target, "Q4_K_M"),
                             ("draft", small_pair.draft, "Q8_0")):
        path = d / (src.name.replace("-F16.gguf", f"-{qtype}.gguf"))
        if not path.exists():
            quantize(src, qtype, output=path, server=dspark_engine.path)
        out[f"{role}-{qtype}"] = path
    return out

# ------------------------------------------------------------------ end quantized pairs block


# ---------------------------------------------------------------------------------------------
# markers: a test that reaches the built engine through the fixtures (dspark_engine, and every
# fixture built on it: start_server, isolated, engine_src, quant_pair) is marked ``engine`` here;
# one whose CLI run or script finds the engine itself (serve, check --mmproj, a benchmark script)
# carries ``@pytest.mark.engine`` (the "not engine" tests pass with GGUFDSPARK_SERVER=/nonexistent).
# ``slow``: the tests that take longest on a 2-core CPU (seconds of waiting or of real work).
# ``make test-fast`` runs neither (converters, readers, parsers, the fake Hub); ``make test`` runs all.
# ---------------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "dspark_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)
