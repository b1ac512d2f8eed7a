#!/usr/bin/env python3
"""Where a speculative step's time goes, from the engine's own accounting.

For each configuration, one llama-server runs ``--trials`` greedy requests of ``--n-predict``
tokens with llama.cpp's synthetic acceptance (the published profile, mean length 4.22 at block 9,
truncated per length) and log verbosity 4, then stops. At stop the engine prints its speculative
statistics: time spent in ``begin`` (feeding the accepted tokens and the target's tapped hidden
states to the drafter), ``draft`` (the drafter's block forward, the Markov chain, sampling) and
``accept``, with call counts. The request timings give the total decode time, so per verify step:

    step     = decode time / steps            (steps = draft calls)
    drafter  = (begin + draft + accept) / steps
    target   = step - drafter                 (the verify batch, plus server work between)

Also a plain run (the plain decode step), so every part can be put in plain-step units.

    python benchmarks/profile_step.py --target T.gguf --draft D.gguf [--gpu] [--server PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import environ  # noqa: E402
from ggufdspark.measuring.acceptance import geometric_rates  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402

STATS = re.compile(r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?"
                   r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
EVAL = re.compile(r"\|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def profile(name: str, settings: ServerSettings, args, env: dict[str, str], log_dir: Path) -> dict:
    """One server (``measure.running``), ``--trials`` requests after a warm-up one; the engine's
    totals are read from its log once it has stopped (the speculative statistics come at exit)."""
    log = log_dir / f"{name}.log"
    log.unlink(missing_ok=True)  # the engine appends: an earlier run's lines would count
    with environ(env), ms.running(settings, log) as c:
        toks = c.tokenize(harness.PROMPT)
        for _ in range(args.trials + 1):  # the first is a warm-up; all count in the engine's totals
            c.complete(toks, n_predict=args.n_predict, ignore_eos=True)
    text = log.read_text(errors="replace")
    evals = [(float(t), int(n)) for t, n in EVAL.findall(text)]
    r = {"config": name, "env": env, "eval_ms": sum(t for t, _ in evals), "tokens": sum(n for _, n in evals)}
    r["ms_per_token"] = r["eval_ms"] / r["tokens"]
    found = list(STATS.finditer(text))  # printed cumulatively; the last line covers every request
    m = found[-1] if found else None
    if m:
        nb, ng, na = (int(x) for x in m.group(2, 3, 4))
        tb, tg, ta = (float(x) for x in m.group(5, 6, 7))
        steps = ng
        r.update(steps=steps, tokens_per_step=r["tokens"] / steps, step_ms=r["eval_ms"] / steps,
                 begin_ms=tb / steps, draft_ms=tg / steps, accept_ms=ta / steps)
        r["target_ms"] = r["step_ms"] - r["begin_ms"] - r["draft_ms"] - r["accept_ms"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--n-predict", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--trials", type=int, default=3, help="measured requests per configuration (after one warm-up)")
    ap.add_argument("--lengths", default="6,9", help="draft lengths to profile, comma-separated")
    ap.add_argument("--json", type=Path, default=Path("profile_step.json"), help="write the raw numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("profile_step_logs"), help="keep the server logs here")
    args = ap.parse_args()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    rates = geometric_rates(4.22, 9)

    def settings(n: int | None, zero: bool = False) -> ServerSettings:
        # through the seam serve uses (harness.base_settings: launch); synthetic acceptance as bench adds it
        s = harness.base_settings(args.server, args.target, gpu=args.gpu, parallel=1, n_predict=args.n_predict,
                                  extra_args=["-lv", "4"])
        return harness.drafted(s, args.draft, n, [0.0] * n if zero else rates) if n else s

    configs = [("plain", settings(None), {})]
    for n in (int(x) for x in args.lengths.split(",")):
        configs.append((f"n{n}", settings(n), {}))
        configs.append((f"n{n}-graph-opt", settings(n), {"GGML_CUDA_GRAPH_OPT": "1"}))
    configs.append((f"n{max(int(x) for x in args.lengths.split(','))}-nothing-accepted",
                    settings(max(int(x) for x in args.lengths.split(",")), zero=True), {}))
    results = []
    for name, s, env in configs:
        r = profile(name, s, args, env, args.log_dir)
        results.append(r)
        print(f"{name}: {r['ms_per_token']:.3f} ms/token", file=sys.stderr)
    plain = results[0]["ms_per_token"]
    print(f"\nplain decode step: {plain:.3f} ms ({1000 / plain:.1f} tok/s); synthetic acceptance 4.22 at block 9\n")
    print(f"{'config':<26}{'tok/s':>8}{'vs plain':>9}{'tok/step':>9}{'step ms':>9}{'target ms':>10}"
          f"{'draft ms':>9}{'begin ms':>9}{'accept ms':>10}{'drafter %':>10}{'step/plain':>11}")
    for r in results[1:]:
        if "steps" not in r:
            print(f"{r['config']:<26} (no speculative statistics in the log)")
            continue
        dr = r["begin_ms"] + r["draft_ms"] + r["accept_ms"]
        print(f"{r['config']:<26}{1000 / r['ms_per_token']:>8.1f}{plain / r['ms_per_token']:>8.2f}x"
              f"{r['tokens_per_step']:>9.2f}{r['step_ms']:>9.3f}{r['target_ms']:>10.3f}{r['draft_ms']:>9.3f}"
              f"{r['begin_ms']:>9.3f}{r['accept_ms']:>10.3f}{100 * dr / r['step_ms']:>9.0f}%{r['step_ms'] / plain:>11.2f}")
    args.json.write_text(json.dumps({"plain_ms": plain, "results": results}, indent=2))


if __name__ == "__main__":
    main()
