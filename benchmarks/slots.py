#!/usr/bin/env python3
"""Many slots: does the engine survive them, and is every drafted answer the plain one? Fresh servers
again and again under the load that killed them (issues 12 and 28), counting deaths:

* ``mixed`` (issue 28; ``h200.sh slots`` and ``sanitize``): a fresh server for every cell of slots x
  arm x engine environment x run, closed-loop clients under mixed-length prompts;
* ``families``: one server, single requests, then rounds of identical requests at once (the families
  benchmark's shape, where a drafter abort was seen in an earlier engine);
* ``waves`` (issue 12's reproducer): waves of requests of different lengths on many slots, with the
  greedy output checked against a plain server's at real acceptance.

    python benchmarks/slots.py mixed -m T.gguf -md D.gguf --gpu --slots 32,64 --arms plain,draft \
        --runs 3 --envs "-;GGML_CUDA_DISABLE_GRAPHS=1" [--json out.json]
    python benchmarks/slots.py waves -m T.gguf -md D.gguf --slots 8 --n-max 4,6,9 --runs 3 [--json out.json]

Every death prints the log's error lines (mixed and families: the backtrace's function names too).
Exit status: 0 when no server died (and, for waves, no answer differed), 1 otherwise.
``python benchmarks/slots.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.errors import BenchError  # noqa: E402
from ggufdspark.measuring.acceptance import geometric_rates  # noqa: E402
from ggufdspark.measuring.gate import NEAR_TIE_GAP, first_difference  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402

MIXED = """A fresh server for every cell of slots x arm x engine environment x run, ``--slots`` closed-loop
clients (each sends its next request as soon as its answer ends) and 2 x slots requests, prompts of
``--prompt-tokens`` (a few hundred to two thousand tokens, a different length every request) and
answers of ``--n-predict`` tokens (issue 28). The pinned engine died on CUDA at 32 slots under this
shape ("an illegal instruction was encountered" at ``cudaGraphLaunch``), with or without the draft,
with or without the patch series. Each slot gets ``--ctx-per-slot`` tokens of context.
``--sanitizer`` runs the engine under ``compute-sanitizer`` (memcheck), which names the kernel that
faulted.
"""

FAMILIES = """One server with ``--slots`` slots, single requests, then rounds of ``--slots`` identical requests
at once, ``--runs`` times (the families benchmark's shape, where a drafter abort was seen in an
earlier engine); ``--locate`` runs the engine with CUDA graphs off and blocking launches, so that a
fault is reported where it happens.
"""

WAVES = """Many slots with the draft on: does the engine survive, and is every answer the plain one?

Issue 12's reproducer. One llama-server with ``--slots`` parallel slots and the DSpark draft
serves ``--requests`` requests in waves of ``--slots``; prompts and generation lengths differ per
request (``--prompt-tokens``, ``--n-predict`` ranges), so slots finish at different times and new
prompts are batched together with other slots' drafts, the situation in which the pinned engine
aborted (``get_sub_batch: failed to add token <garbage id>``) on CUDA.

For each draft length and run it reports whether the server died (and the engine's own last
lines), how many ``invalid draft token`` warnings the patched engine logged (drafts it cut short
instead of aborting), and, with real acceptance (no ``--synthetic``), whether every request's
greedy tokens equal a plain server's (same slots, same prompts); a difference is classified as a
near-tie or a defect by the plain run's top-2 probabilities at the first differing position.

    python benchmarks/slots.py waves --target T.gguf --draft D.gguf --slots 8 --n-max 4,6,9 \
        --runs 3 [--synthetic 4.22] [--gpu] [--server PATH] [--json out.json]
"""


LOCATE_ENV = {"GGML_CUDA_DISABLE_GRAPHS": "1", "CUDA_LAUNCH_BLOCKING": "1"}
_FRAME = re.compile(r"\((_Z[^+)]+)")
_ERROR_MARKERS = (" E ", "CUDA error", "GGML_ASSERT", "GGML_ABORT", "=========", "error:", "Aborted",
                  "Segmentation fault", "terminate called")


def add_common(ap: argparse.ArgumentParser, *, slots: str) -> None:
    """The pair, the engine, and what ``mixed`` and ``families`` share."""
    harness.add_pair_arguments(ap)
    ap.add_argument("--runs", type=int, default=3, help="fresh servers per cell, one after another")
    ap.add_argument("--slots", default="32", help=slots)
    ap.add_argument("--n-max", type=int, default=0,
                    help="draft length of the drafted arm (default 0: serve's for the backend, with its load cut)")
    ap.add_argument("--log-dir", type=Path, default=Path("slots_logs"), help="one server log a run")


def mixed_arguments(ap: argparse.ArgumentParser) -> None:
    add_common(ap, slots="slots (-np) and clients, comma-separated, each a cell")
    ap.add_argument("--arms", default="plain,draft", help="plain and/or draft")
    ap.add_argument("--envs", default="-", help="engine environments separated by ';' ('-': as it is), "
                                                "each NAME=VALUE,...")
    ap.add_argument("--prompt-tokens", default="200-2000", help="prompt length range LO-HI (log-uniform)")
    ap.add_argument("--n-predict", default="64-256", help="answer length range LO-HI")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="context per slot (-c is this x slots)")
    ap.add_argument("--sanitizer", action="store_true", help="run the engine under compute-sanitizer")
    ap.add_argument("--json", type=Path, default=None, help="write every cell here")


def families_arguments(ap: argparse.ArgumentParser) -> None:
    add_common(ap, slots="slots (-np) and requests at once")
    ap.add_argument("--family-n-predict", type=int, default=256, help="tokens a request generates")
    ap.add_argument("--env", default="", help="NAME=VALUE,... for the engine")
    ap.add_argument("--locate", action="store_true",
                    help=f"also set {' '.join(f'{k}={v}' for k, v in LOCATE_ENV.items())}")


def start(a: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """``mixed``'s and ``families``' checks, and their log folder."""
    if a.runs < 1 or a.n_max < 0:
        ap.error("--runs must be at least 1 and --n-max at least 0")
    a.log_dir.mkdir(parents=True, exist_ok=True)


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


def mixed(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The mixed traffic's cells (``MIXED``); exit 1 when a server died."""
    start(a, ap)
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
            envs.append((item or "-", {} if item in ("", "-") else harness.parse_env(item)))
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
                    with harness.environ(env):
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


def families(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The families' rounds (``FAMILIES``); exit 1 when a server died."""
    start(a, ap)
    try:
        env = harness.parse_env(a.env)
    except ValueError as e:
        ap.error(f"--env: {e}")
    if a.locate:
        env.update(LOCATE_ENV)
    slots = int(a.slots.split(",")[0])
    server = a.server or engine.find_engine().path
    base = harness.base_settings(server, a.target, gpu=a.gpu, parallel=slots, n_predict=a.family_n_predict)
    settings = drafted_arm(base, a)
    died = 0
    with harness.environ(env):
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


# --------------------------------------------------------------------------- waves


INVALID_MARKERS = ("invalid draft token", "invalid drafted token")
ABORT_MARKERS = ("get_sub_batch", "GGML_ABORT", "GGML_ASSERT", "Aborted", "Segmentation fault")


@dataclass
class RunResult:
    arm: str
    run: int
    answered: int = 0
    requests: int = 0
    died: bool = False
    error: str = ""
    invalid_drafts: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    equal: int | None = None
    near_ties: int | None = None
    defects: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


def wave_arm(name: str, settings: ServerSettings, work, slots: int, run: int, log_dir: Path,
            n_probs: int = 0, cache_prompt: bool = False) -> tuple[RunResult, list]:
    """One fresh server, ``work`` in waves of ``slots`` (``harness.survive``), and what its log
    says: the drafts the patched engine cut short, the lines of an abort."""
    log = log_dir / f"{name}-run{run}.log"
    r = harness.survive(settings, work, slots, log, waves=True, n_probs=n_probs, cache_prompt=cache_prompt)
    res = RunResult(arm=name, run=run, requests=r.requests, answered=r.answered, died=r.died, error=r.error,
                    drafted=r.drafted, accepted=r.accepted, seconds=r.seconds)
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    res.invalid_drafts = sum(any(m in ln for m in INVALID_MARKERS) for ln in lines)
    res.tail = [ln for ln in lines if any(m in ln for m in ABORT_MARKERS + INVALID_MARKERS)][-6:]
    return res, r.outs


def compare_waves(res: RunResult, plain: list, spec: list, gap: float) -> None:
    res.equal, res.near_ties = 0, 0
    for i, (p, s) in enumerate(zip(plain, spec)):
        if not (p and s and "tokens" in p and "tokens" in s):
            continue
        k = first_difference(p["tokens"], s["tokens"])
        if k is None:
            res.equal += 1
            continue
        probs = (p.get("completion_probabilities") or [])
        top = probs[k].get("top_logprobs") if k < len(probs) else None
        if top and len(top) >= 2 and math.exp(top[0]["logprob"]) - math.exp(top[1]["logprob"]) < gap:
            res.near_ties += 1
        else:
            res.defects.append(f"request {i}: first difference at token {k}")


def waves_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--slots", type=int, default=8, help="parallel slots (llama-server -np) and concurrent requests")
    ap.add_argument("--requests", type=int, default=0, help="default: 2 waves of --slots")
    ap.add_argument("--n-max", default="4,6,9", help="draft lengths of the drafted arms, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="rounds of every arm, each with its own workload seed")
    ap.add_argument("--prompt-tokens", default="420-500", help="prompt length range LO-HI in tokens")
    ap.add_argument("--n-predict", default="64-256", help="generated tokens range LO-HI per request")
    ap.add_argument("--synthetic", type=float, default=None,
                    help="llama.cpp's synthetic acceptance at this mean length (block 9, held fixed)")
    ap.add_argument("--ctx-per-slot", type=int, default=1024, help="context per slot (-c is this times --slots)")
    ap.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    ap.add_argument("--cache-prompt", action="store_true", help="let the server reuse cached prompt prefixes")
    ap.add_argument("--extra", default="", help="extra llama-server flags for the drafted arms")
    ap.add_argument("--env", default="", help="NAME=VALUE,... for the drafted arms' engine")
    ap.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("waves_logs"), help="keep the server logs here")


def waves(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Waves of requests on many slots (``WAVES``); exit 1 when a server died or an answer differed."""
    a.log_dir.mkdir(parents=True, exist_ok=True)
    lo, hi = (int(x) for x in a.prompt_tokens.split("-"))
    glo, ghi = (int(x) for x in a.n_predict.split("-"))
    n_req = a.requests or 2 * a.slots
    try:
        env = harness.parse_env(a.env)
    except ValueError as e:
        ap.error(f"--env: {e}")
    vocab = harness.n_vocab(a.server, a.target, a.log_dir, gpu=a.gpu)
    # every server through the seam serve uses (harness.base_settings: ggufdspark.launch)
    base = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=a.slots, ctx_per_slot=a.ctx_per_slot)
    results: list[RunResult] = []
    for run in range(a.runs):
        work = harness.workload(n_req, vocab, (lo, hi), (glo, ghi), seed=run, shared_prefix=a.shared_prefix)
        plain_outs = None
        if a.synthetic is None:
            r, plain_outs = wave_arm("plain", base, work, a.slots, run,
                                    a.log_dir, n_probs=2, cache_prompt=a.cache_prompt)
            results.append(r)
        for n in (int(x) for x in a.n_max.split(",")):
            rates = geometric_rates(a.synthetic, 9) if a.synthetic is not None else None
            s = harness.with_args(harness.drafted(base, a.draft, n, rates), a.extra.split())
            with harness.environ(env):  # the engine inherits it
                r, outs = wave_arm(f"n{n}", s, work, a.slots, run, a.log_dir, cache_prompt=a.cache_prompt)
            if plain_outs is not None:
                compare_waves(r, plain_outs, outs, NEAR_TIE_GAP)
            results.append(r)
            print(wave_line(r), flush=True)
    print()
    print(f"{'arm':6} {'runs':>4} {'died':>4} {'answered':>9} {'invalid':>7} {'acc rate':>8} "
          f"{'equal':>6} {'near-tie':>8} {'defects':>7}")
    for arm in dict.fromkeys(r.arm for r in results):
        rs = [r for r in results if r.arm == arm]
        acc = sum(r.accepted for r in rs)
        drafted = sum(r.drafted for r in rs)
        eq = [r.equal for r in rs if r.equal is not None]
        print(f"{arm:6} {len(rs):>4} {sum(r.died for r in rs):>4} "
              f"{sum(r.answered for r in rs):>4}/{sum(r.requests for r in rs):<4} "
              f"{sum(r.invalid_drafts for r in rs):>7} "
              f"{'-' if not drafted else f'{acc / drafted:.2f}':>8} "
              f"{sum(eq) if eq else '-':>6} {sum(r.near_ties or 0 for r in rs) if eq else '-':>8} "
              f"{sum(len(r.defects) for r in rs) if eq else '-':>7}")
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.died or r.defects for r in results) else 0


def wave_line(r: RunResult) -> str:
    state = "DIED" if r.died else "ok"
    extra = f", equal {r.equal}/{r.requests}, near-ties {r.near_ties}, defects {len(r.defects)}" \
        if r.equal is not None else ""
    return (f"{r.arm} run {r.run}: {state}, answered {r.answered}/{r.requests}, invalid drafts "
            f"{r.invalid_drafts}, drafted {r.drafted}, accepted {r.accepted}, {r.seconds} s{extra}"
            + (f"\n   {r.error}" if r.error else "") + "".join(f"\n   | {t}" for t in r.tail if r.died))


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"mixed": (MIXED, mixed_arguments, mixed),
                                          "families": (FAMILIES, families_arguments, families),
                                          "waves": (WAVES, waves_arguments, waves)}, argv)


if __name__ == "__main__":
    sys.exit(main())
