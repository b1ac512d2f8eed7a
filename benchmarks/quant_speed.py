#!/usr/bin/env python3
"""Decode speed of every target x draft precision combination, plain and with the DSpark draft,
side by side in one run (issue 15's table, at small scale on CPU; the H200 table is separate).

For each target precision (``--targets``, default F16 Q8_0 Q4_K_M) the target alone is measured,
then with each draft precision (``--drafts``, default F16 Q8_0), one request at a time, with
llama.cpp's synthetic acceptance held at the published profile (mean accept length 4.22 at
block 9, geometric per-position rates, truncated to ``--draft-n-max``): the speed only, the text
is not valid in that mode. Quantized files are made with ``ggufdspark quantize`` (the engine's
llama-quantize) from a generated pair (``--size small|medium``) unless they exist.

    python benchmarks/quant_speed.py --dir /tmp/qs [--size medium] [--json out.json]

Prints tok/s (median of ``--trials`` requests after a warm-up) and the ratio to the same
target alone; the raw numbers go to ``--json``. On AMX CPUs every arm with a quantized file runs
with ``--no-repack`` (see ``hardware.engine_workarounds``), so a target's plain and draft arms
run alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ggufdspark import engine, hardware
from ggufdspark.quantize import quantize
from ggufdspark.quants import is_quantized_file
from ggufdspark.runners.server import ServerProcess, ServerSettings
from ggufdspark.synthetic import synth
from ggufdspark.synthetic.pairs import build_pair
from ggufdspark.tune import geometric_rates

PROMPT = ("Describe in detail how speculative decoding works with a small draft model and a large "
          "target model, what acceptance length means, and why the output is unchanged.")
PUBLISHED_ACCEPT_LEN, PUBLISHED_BLOCK = 4.22, 9


def files(root: Path, size: str, targets: list[str], drafts: list[str]) -> tuple[dict, dict]:
    if size == "medium":
        pair = build_pair(root, target_spec=synth.MEDIUM_TARGET, drafter_spec=synth.MEDIUM_DRAFTER, name="medium-lfm2")
    else:
        pair = build_pair(root)
    t, d = {"F16": pair.target}, {"F16": pair.draft}
    for q in targets:
        if q not in t:
            out = pair.target.with_name(pair.target.name.replace("-F16.gguf", f"-{q}.gguf"))
            t[q] = out if out.exists() else quantize(pair.target, q, output=out).path
    for q in drafts:
        if q not in d:
            out = pair.draft.with_name(pair.draft.name.replace("-F16.gguf", f"-{q}.gguf"))
            d[q] = out if out.exists() else quantize(pair.draft, q, output=out).path
    return {q: t[q] for q in targets}, {q: d[q] for q in drafts}


def measure(settings: ServerSettings, log: Path, n_predict: int, trials: int) -> dict:
    with ServerProcess(settings, log_path=log, start_timeout=300) as srv:
        c = srv.client()
        c.complete(PROMPT, n_predict=16, ignore_eos=True)  # warm-up
        speeds, drafted, accepted = [], 0, 0
        for _ in range(trials):
            out = c.complete(PROMPT, n_predict=n_predict, ignore_eos=True)
            speeds.append(out.timings.predicted_per_second)
            drafted += out.timings.draft_n or 0
            accepted += out.timings.draft_n_accepted or 0
    return {"tps": statistics.median(speeds), "runs": speeds, "draft_n": drafted, "draft_n_accepted": accepted}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="Where the pair and its quants are made (reused).")
    ap.add_argument("--size", choices=("small", "medium"), default="small", help="shapes of the generated pair.")
    ap.add_argument("--targets", nargs="+", default=["F16", "Q8_0", "Q4_K_M"], help="Target types to measure.")
    ap.add_argument("--drafts", nargs="+", default=["F16", "Q8_0"], help="Draft types to measure.")
    ap.add_argument("--draft-n-max", type=int, default=hardware.DEFAULTS["cpu"].draft_n_max,
                    help="Draft length (default: serve's CPU default).")
    ap.add_argument("--n-predict", type=int, default=128, help="Tokens generated per request.")
    ap.add_argument("--trials", type=int, default=5, help="Measured requests per arm (median reported).")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for llama-server.")
    ap.add_argument("--server", help="llama-server (default: the cached engine)")
    ap.add_argument("--json", type=Path, help="Write the raw numbers here.")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    server = engine.find_engine(a.server).path
    targets, drafts = files(a.dir, a.size, a.targets, a.drafts)
    rates = geometric_rates(PUBLISHED_ACCEPT_LEN, PUBLISHED_BLOCK - 1)[:a.draft_n_max]
    rows = []
    for tq, tpath in targets.items():
        quantized = is_quantized_file(tpath) or any(is_quantized_file(p) for p in drafts.values())
        extra = hardware.engine_workarounds("cpu", 1, quantized=quantized)
        base = dict(server=server, model=tpath, ctx_size=a.n_predict + 512, threads=a.threads, extra_args=extra)
        plain = measure(ServerSettings(**base, spec_type=None, draft_n_min=None), a.dir / f"plain-{tq}.log",
                        a.n_predict, a.trials)
        rows.append({"target": tq, "draft": None, **plain, "ratio": 1.0})
        print(f"target {tq:7s} draft -      {plain['tps']:8.1f} tok/s  1.00x", flush=True)
        for dq, dpath in drafts.items():
            spec = measure(ServerSettings(**base, draft=dpath, draft_n_max=a.draft_n_max, synth_rates=rates),
                           a.dir / f"spec-{tq}-{dq}.log", a.n_predict, a.trials)
            ratio = spec["tps"] / plain["tps"]
            rows.append({"target": tq, "draft": dq, **spec, "ratio": ratio})
            print(f"target {tq:7s} draft {dq:6s} {spec['tps']:8.1f} tok/s  {ratio:.2f}x", flush=True)
    report = {"tool": "benchmarks/quant_speed.py", "size": a.size, "draft_n_max": a.draft_n_max,
              "synthetic": f"synthetic acceptance, mean accept length {PUBLISHED_ACCEPT_LEN} at block "
                           f"{PUBLISHED_BLOCK}, rates {[round(r, 4) for r in rates]}",
              "extra_args_when_quantized": hardware.engine_workarounds("cpu", 1, quantized=True),
              "n_predict": a.n_predict, "trials": a.trials, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "rows": rows}
    print("\n| target | draft | tok/s | vs target alone |\n|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['target']} | {r['draft'] or '-'} | {r['tps']:.1f} | {r['ratio']:.2f} |")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
