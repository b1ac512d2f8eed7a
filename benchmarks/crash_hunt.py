#!/usr/bin/env python3
"""Start servers again and again under the load that killed them, and say how often they died.

Two traffic shapes:

* ``--traffic mixed`` (default; issue 28): a fresh server for every cell of slots x arm x engine
  environment x run, ``--slots`` closed-loop clients (each sends its next request as soon as its
  answer ends) and 2 x slots requests, prompts of ``--prompt-tokens`` (a few hundred to two thousand
  tokens, a different length every request) and answers of ``--n-predict`` tokens. The pinned engine
  died on CUDA at 32 slots under this shape ("an illegal instruction was encountered" at
  ``cudaGraphLaunch``), with or without the draft, with or without the patch series. Each slot gets
  ``--ctx-per-slot`` tokens of context.
* ``--traffic families``: one server with ``--slots`` slots, single requests, then rounds of
  ``--slots`` identical requests at once (the families benchmark's shape, where a drafter abort was
  seen in an earlier engine).

Every death prints the log's error lines and the backtrace's function names. ``--sanitizer`` runs
the engine under ``compute-sanitizer`` (memcheck), which names the kernel that faulted.

    python benchmarks/crash_hunt.py -m T.gguf -md D.gguf --gpu --slots 32,64 --arms plain,draft \
        --runs 3 --envs "-;GGML_CUDA_DISABLE_GRAPHS=1" [--json out.json]

Exit status: 0 when no server died, 1 when one did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import environ, parse_env  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.errors import BenchError  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402

LOCATE_ENV = {"GGML_CUDA_DISABLE_GRAPHS": "1", "CUDA_LAUNCH_BLOCKING": "1"}
_FRAME = re.compile(r"\((_Z[^+)]+)")
_ERROR_MARKERS = (" E ", "CUDA error", "GGML_ASSERT", "GGML_ABORT", "=========", "error:", "Aborted",
                  "Segmentation fault", "terminate called")


def death_report(log: Path, lines: int = 12) -> list[str]:
    """The error lines of a dead server's log and the function names of its backtrace (mangled
    names made readable by ``c++filt`` when it is there)."""
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [x for x in text if any(m in x for m in _ERROR_MARKERS)][:lines]
    frames = [m[1] for x in text if (m := _FRAME.search(x))][:lines * 2]
    if frames and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(frames), capture_output=True, text=True).stdout
        frames = [f.split("(")[0] for f in out.splitlines()]
    return errors + [f"  at {f}" for f in frames]


@dataclass
class Run:
    """One fresh server under the mixed load."""

    slots: int
    arm: str
    env: str
    run: int
    requests: int
    answered: int = 0
    died: bool = False
    exit_code: int | None = None
    seconds: float = 0.0
    output_tokens: int = 0
    error: str = ""
    report: list[str] = field(default_factory=list)


def run_mixed(settings: ServerSettings, work, clients: int, log: Path, cell: Run) -> Run:
    """One fresh server, ``work`` through ``clients`` closed-loop clients (``harness.survive``);
    ``cell`` filled in, with the log's death report if it died."""
    r = harness.survive(settings, work, clients, log)
    cell.answered, cell.died, cell.exit_code, cell.error = r.answered, r.died, r.exit_code, r.error
    cell.seconds, cell.output_tokens = r.seconds, r.output_tokens
    if cell.died:
        cell.report = death_report(log)
    return cell


def sanitizer_wrapper(server: Path, where: Path) -> Path:
    """A script that runs ``server`` under compute-sanitizer's memcheck (the kernel that faults is
    named in the log); ServerSettings puts it first on the command line like the engine itself."""
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        raise SystemExit("--sanitizer: compute-sanitizer is not on PATH nor in /usr/local/cuda/bin")
    script = where / "llama-server-sanitized"
    script.write_text(f'#!/bin/sh\nexec "{tool}" --tool memcheck --print-limit 8 --show-backtrace device '
                      f'"{server}" "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _range(text: str, what: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise SystemExit(f"{what} {text!r}: expected LO-HI") from None
    if lo < 1 or hi < lo:
        raise SystemExit(f"{what} {text!r}: expected 1 <= LO <= HI")
    return lo, hi


def drafted_arm(base: ServerSettings, a: argparse.Namespace) -> ServerSettings:
    """The drafted server of a cell: serve's draft for the backend (``--n-max 0``: its length and
    load cut) or length ``--n-max`` without a cut; synthetic acceptance at the published profile."""
    rates = harness.published_rates(a.draft)
    if a.n_max == 0:
        return harness.serve_drafted(base, a.draft, gpu=a.gpu, rates=rates)
    return harness.drafted(base, a.draft, a.n_max, rates)


def mixed_main(a: argparse.Namespace) -> int:
    server = Path(a.server or engine.find_engine().path)
    prompt_range = _range(a.prompt_tokens, "--prompt-tokens")
    gen_range = _range(a.n_predict, "--n-predict")
    slots_list = [int(x) for x in a.slots.split(",")]
    arm_names = [x.strip() for x in a.arms.split(",") if x.strip()]
    if not slots_list or min(slots_list) < 1 or not set(arm_names) <= {"plain", "draft"} or not arm_names:
        raise SystemExit("--slots: numbers >= 1; --arms: plain and/or draft")
    envs: list[tuple[str, dict[str, str]]] = []
    for item in (a.envs or "-").split(";"):
        item = item.strip()
        try:
            envs.append((item or "-", {} if item in ("", "-") else parse_env(item)))
        except ValueError as e:
            raise SystemExit(f"--envs: {e}") from None
    vocab = harness.n_vocab(server, a.target, a.log_dir, gpu=a.gpu)
    exe = sanitizer_wrapper(server, a.log_dir) if a.sanitizer else server
    cells: list[Run] = []
    for slots in slots_list:
        base = harness.base_settings(server, a.target, gpu=a.gpu, parallel=slots, ctx_per_slot=a.ctx_per_slot)
        base = dataclasses.replace(base, server=exe)  # the engine itself, or it under compute-sanitizer
        for arm in arm_names:
            settings = base if arm == "plain" else drafted_arm(base, a)
            for label, env in envs:
                for run in range(a.runs):
                    work = harness.workload(2 * slots, vocab, prompt_range, gen_range, seed=run, log_uniform=True)
                    cell = Run(slots, arm, label, run, len(work))
                    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"s{slots}-{arm}-{label}-r{run}")
                    with environ(env):
                        run_mixed(settings, work, slots, a.log_dir / f"{tag}.log", cell)
                    cells.append(cell)
                    state = f"DIED (exit {cell.exit_code})" if cell.died else "ok"
                    print(f"{slots} slots, {arm}, env {label}, run {run}: {state}, answered "
                          f"{cell.answered}/{cell.requests}, {cell.output_tokens} tokens, {cell.seconds} s",
                          flush=True)
                    if cell.died:
                        if cell.error:
                            print(f"    {cell.error}", flush=True)
                        for line in cell.report:
                            print(f"    {line[:240]}", flush=True)
    print(f"\n{'slots':>5} {'arm':6} {'env':34} {'runs':>4} {'died':>4} {'answered':>9}")
    for key in dict.fromkeys((c.slots, c.arm, c.env) for c in cells):
        cs = [c for c in cells if (c.slots, c.arm, c.env) == key]
        print(f"{key[0]:>5} {key[1]:6} {key[2][:34]:34} {len(cs):>4} {sum(c.died for c in cs):>4} "
              f"{sum(c.answered for c in cs):>4}/{sum(c.requests for c in cs):<4}")
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "prompt_tokens": prompt_range, "n_predict": gen_range,
                                      "ctx_per_slot": a.ctx_per_slot, "n_max": a.n_max or "serve's",
                                      "cells": [asdict(c) for c in cells]}, indent=2))
    return 1 if any(c.died for c in cells) else 0


def families_main(a: argparse.Namespace) -> int:
    env = dict(a.env_parsed)
    if a.locate:
        env.update(LOCATE_ENV)
    slots = int(a.slots.split(",")[0])
    server = a.server or engine.find_engine().path
    base = harness.base_settings(server, a.target, gpu=a.gpu, parallel=slots, n_predict=a.family_n_predict)
    settings = drafted_arm(base, a)
    died = 0
    with environ(env):
        for run in range(a.runs):
            log = a.log_dir / f"run{run}.log"
            log.unlink(missing_ok=True)
            try:
                arm = harness.measure_arm(f"run{run}", settings, a.log_dir, levels=[1, slots],
                                       n_predict=a.family_n_predict, trials=3)
                print(f"run {run}: ok, 1 request {arm.tps:.1f} tok/s, {slots} at once "
                      f"{arm.load[slots]['tps']:.1f} tok/s", flush=True)
            except BenchError as e:
                died += 1
                print(f"run {run}: DIED: {e}", flush=True)
                for line in death_report(log):
                    print(f"    {line[:240]}", flush=True)
    label = ",".join(f"{k}={v}" for k, v in env.items()) or "default environment"
    print(f"\n{died} of {a.runs} servers died ({slots} slots, n_max {a.n_max}, {label})")
    return 1 if died else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--traffic", choices=("mixed", "families"), default="mixed",
                    help="mixed: fresh servers under closed-loop mixed-length prompts; families: the old rounds")
    ap.add_argument("--runs", type=int, default=3, help="fresh servers per cell, one after another")
    ap.add_argument("--slots", default="32", help="slots (-np) and clients, comma-separated (mixed: each a cell)")
    ap.add_argument("--arms", default="plain,draft", help="mixed: plain and/or draft")
    ap.add_argument("--envs", default="-", help="mixed: engine environments separated by ';' ('-': as it is), "
                                                "each NAME=VALUE,...")
    ap.add_argument("--prompt-tokens", default="200-2000", help="mixed: prompt length range LO-HI (log-uniform)")
    ap.add_argument("--n-predict", default="64-256", help="mixed: answer length range LO-HI")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="mixed: context per slot (-c is this x slots)")
    ap.add_argument("--sanitizer", action="store_true", help="mixed: run the engine under compute-sanitizer")
    ap.add_argument("--n-max", type=int, default=0,
                    help="draft length of the drafted arm (default 0: serve's for the backend, with its load cut)")
    ap.add_argument("--family-n-predict", type=int, default=256, help="families: tokens a request generates")
    ap.add_argument("--env", default="", help="families: NAME=VALUE,... for the engine")
    ap.add_argument("--locate", action="store_true",
                    help=f"families: also set {' '.join(f'{k}={v}' for k, v in LOCATE_ENV.items())}")
    ap.add_argument("--json", type=Path, default=None, help="mixed: write every cell here")
    ap.add_argument("--log-dir", type=Path, default=Path("crash_hunt_logs"), help="one server log a run")
    a = ap.parse_args()
    if a.runs < 1 or a.n_max < 0:
        ap.error("--runs and --n-max must be at least 1")
    try:
        a.env_parsed = parse_env(a.env)
    except ValueError as e:
        ap.error(f"--env: {e}")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    return mixed_main(a) if a.traffic == "mixed" else families_main(a)


if __name__ == "__main__":
    sys.exit(main())
