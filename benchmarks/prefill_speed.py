#!/usr/bin/env python3
"""Prompt processing with the DSpark draft against without: what the draft costs before the first token.

Two arms, one server each with ``--concurrency`` slots, built by the harness (``benchmarks/harness.py``:
``ggufdspark.launch`` as ``serve`` builds its servers): the target alone, and the target with the
draft at ``--draft-n-max`` (default: serve's length for the backend) at real acceptance. Every
request asks for one token (``n_predict`` 1), so its time is the prompt's: the engine's ``prompt
eval time`` (timings ``prompt_per_second``). Prompts are ``--prompt-tokens`` random token ids (the
same ids in both arms; the prompt cache off, so every trial processes the whole prompt):

* one prompt at a time: median prompt tok/s of ``--trials`` requests;
* ``--concurrency`` different prompts at once (``ggufdspark.measuring.measure.measure_load``): the median
  of the requests' own prompt tok/s, and the aggregate (prompt tokens of all of them over the
  wall time from the first send to the last answer).

``--arm NAME=BASE [KEY=VALUE ...] [server args ...]`` adds a variant of the plain or drafted arm
(BASE ``plain`` or ``drafted``) with engine environment variables (upper-case KEY) and more
llama-server arguments, to split where a drafted prefill's time goes, e.g.
``--arm "paused=drafted --spec-draft-n-max-by-slots 0:0"`` or ``--arm "ckpt=drafted LLAMA_SPEC_CKPT_DFT=1"``.
Every arm's ratio is against ``plain``.

    python benchmarks/prefill_speed.py -m T.gguf -md D.gguf [--gpu] [--prompt-tokens 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import split_env  # noqa: E402
from ggufdspark import hardware  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402


def parse_arm(spec: str) -> tuple[str, str, dict[str, str], list[str]]:
    """``NAME=BASE [KEY=VALUE ...] [args ...]`` -> (name, base, environment, server args)."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    if not sep or not name or not words or words[0] not in ("plain", "drafted"):
        raise ValueError(f"--arm {spec!r}: expected NAME=plain|drafted [KEY=VALUE ...] [server args ...]")
    env, args = split_env(words[1:])
    return name, words[0], env, args


def measure(name: str, settings: ServerSettings, prompts: list[list[int]], a: argparse.Namespace) -> dict:
    """One arm: single prompts, then ``a.concurrency`` at once (``ms.measure_load``, one round)."""
    res: dict = {"arm": name, "cmd": " ".join(settings.redacted()), "env": dict(settings.env)}
    with ms.running(settings, a.log_dir / f"{name}.log") as c:
        ms.warm(c)
        ms.request(c, prompts[0], 1)  # the first long prompt allocates the compute buffers
        one = [ms.request(c, prompts[0], 1).timings for _ in range(a.trials)]
        res["one"] = {"prompt_tps": statistics.median(t.prompt_per_second for t in one),
                      "prompt_tps_all": [t.prompt_per_second for t in one], "prompt_n": one[0].prompt_n}
        outs: list[ms.Outcome] = []
        point = ms.measure_load(c, prompts, a.concurrency, 1, rounds=1, outcomes=outs)
        tokens = sum(o.timings.prompt_n or 0 for o in outs)
        res["at_once"] = {"requests": point.requests, "prompt_tokens": tokens, "wall_s": point.wall_s,
                          "aggregate_prompt_tps": tokens / point.wall_s if point.wall_s else None,
                          "prompt_tps_median": statistics.median(o.timings.prompt_per_second for o in outs)}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="tokens of every prompt")
    ap.add_argument("--concurrency", type=int, default=8, help="prompts sent at once (and the servers' slots)")
    ap.add_argument("--trials", type=int, default=3, help="single-prompt requests per arm (median reported)")
    ap.add_argument("--draft-n-max", type=int, default=None,
                    help="the drafted arm's length (default: serve's for the backend, CUDA with --gpu)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=BASE [KEY=VALUE ...] [ARGS ...]",
                    help="one more arm: the plain or drafted arm with engine environment variables and "
                         "llama-server arguments (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("prefill_speed_logs"), help="keep the server logs here")
    a = ap.parse_args(argv)
    try:
        variants = [parse_arm(spec) for spec in a.arm]
    except ValueError as e:
        ap.error(str(e))
    if a.prompt_tokens < 1 or a.concurrency < 1 or a.trials < 1:
        ap.error(f"--prompt-tokens {a.prompt_tokens} / --concurrency {a.concurrency} / --trials {a.trials}: "
                 "at least 1")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    n_max = a.draft_n_max or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    vocab = harness.n_vocab(a.server, a.target, a.log_dir, gpu=a.gpu)
    work = harness.workload(a.concurrency, vocab, (a.prompt_tokens, a.prompt_tokens), (1, 1), seed=0)
    prompts = [p for p, _ in work]
    base = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=a.concurrency,
                                 ctx_per_slot=a.prompt_tokens + harness.CTX_MARGIN)
    drafted = harness.drafted(base, a.draft, n_max, None)
    rows = [measure("plain", base, prompts, a), measure(f"draft-n{n_max}", drafted, prompts, a)]
    for name, kind, env, args in variants:
        arm = dataclasses.replace(harness.with_args(base if kind == "plain" else drafted, args), env=env)
        rows.append(measure(name, arm, prompts, a))
    plain = rows[0]
    width = max(12, *(len(r["arm"]) + 2 for r in rows))
    print(f"prompt processing, {a.prompt_tokens}-token prompts, one answer token; drafted arm n_max {n_max}\n")
    print(f"{'arm':<{width}}{'1 prompt tok/s':>16}{f'{a.concurrency} at once: agg tok/s':>26}{'per request':>13}"
          f"{'/plain (1)':>12}{'/plain (all)':>14}")
    for r in rows:
        r["ratio"] = {"one": r["one"]["prompt_tps"] / plain["one"]["prompt_tps"],
                      "at_once": r["at_once"]["aggregate_prompt_tps"] / plain["at_once"]["aggregate_prompt_tps"]}
        print(f"{r['arm']:<{width}}{r['one']['prompt_tps']:>16.1f}{r['at_once']['aggregate_prompt_tps']:>26.1f}"
              f"{r['at_once']['prompt_tps_median']:>13.1f}{r['ratio']['one']:>11.2f}x{r['ratio']['at_once']:>13.2f}x")
    ratio = rows[1]["ratio"]
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "prompt_tokens": a.prompt_tokens,
                                      "concurrency": a.concurrency, "trials": a.trials, "draft_n_max": n_max,
                                      "arms": rows, "ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
