#!/usr/bin/env python3
"""Many slots with the draft on: does the engine survive, and is every answer the plain one?

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

    python benchmarks/parallel_load.py --target T.gguf --draft D.gguf --slots 8 --n-max 4,6,9 \
        --runs 3 [--synthetic 4.22] [--gpu] [--server PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark.measuring.gate import NEAR_TIE_GAP, first_difference  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import environ, parse_env  # noqa: E402
from ggufdspark.measuring.acceptance import geometric_rates  # noqa: E402

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


def run_arm(name: str, settings: ServerSettings, work, slots: int, run: int, log_dir: Path,
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


def compare(res: RunResult, plain: list, spec: list, gap: float) -> None:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
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
    ap.add_argument("--log-dir", type=Path, default=Path("parallel_load_logs"), help="keep the server logs here")
    a = ap.parse_args()

    a.log_dir.mkdir(parents=True, exist_ok=True)
    lo, hi = (int(x) for x in a.prompt_tokens.split("-"))
    glo, ghi = (int(x) for x in a.n_predict.split("-"))
    n_req = a.requests or 2 * a.slots
    try:
        env = parse_env(a.env)
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
            r, plain_outs = run_arm("plain", base, work, a.slots, run,
                                    a.log_dir, n_probs=2, cache_prompt=a.cache_prompt)
            results.append(r)
        for n in (int(x) for x in a.n_max.split(",")):
            rates = geometric_rates(a.synthetic, 9) if a.synthetic is not None else None
            s = harness.with_args(harness.drafted(base, a.draft, n, rates), a.extra.split())
            with environ(env):  # the engine inherits it
                r, outs = run_arm(f"n{n}", s, work, a.slots, run, a.log_dir, cache_prompt=a.cache_prompt)
            if plain_outs is not None:
                compare(r, plain_outs, outs, NEAR_TIE_GAP)
            results.append(r)
            print(_line(r), flush=True)
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


def _line(r: RunResult) -> str:
    state = "DIED" if r.died else "ok"
    extra = f", equal {r.equal}/{r.requests}, near-ties {r.near_ties}, defects {len(r.defects)}" \
        if r.equal is not None else ""
    return (f"{r.arm} run {r.run}: {state}, answered {r.answered}/{r.requests}, invalid drafts "
            f"{r.invalid_drafts}, drafted {r.drafted}, accepted {r.accepted}, {r.seconds} s{extra}"
            + (f"\n   {r.error}" if r.error else "") + "".join(f"\n   | {t}" for t in r.tail if r.died))


if __name__ == "__main__":
    sys.exit(main())
