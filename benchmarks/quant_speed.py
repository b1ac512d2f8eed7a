#!/usr/bin/env python3
"""Decode speed of every target x draft precision combination, plain and with the DSpark draft,
side by side in one run, at one request and N parallel requests (issue 15's table).

For each target precision (``--targets``, default F16 Q8_0 Q4_K_M) the target alone is measured,
then with each draft precision (``--drafts``, default F16 Q8_0), with llama.cpp's synthetic
acceptance held at the published profile (mean accept length 4.22 over the draft's block,
geometric per-position rates, truncated to ``--draft-n-max``): the speed only, the text is not
valid in that mode. Every arm is one server with ``-np`` = the highest ``--concurrency`` level,
measured at each level: one request (median decode tok/s of ``--trials``) and N at once
(aggregate tok/s over the wall time). The plain and drafted arms of a target run with the same
settings.

The lossless check (on unless ``--no-lossless``): per combination, one more server with the draft
at real acceptance; its greedy output (``--check-tokens``) against the same target's plain output,
reported as "equal" or "differs at token i" with the plain run's top-2 log-probabilities there.

The pair: ``-m``/``-md`` (an F16 pair on disk), else one generated under ``--dir`` (``--size
small|medium|full``). Quantized files are made in ``--dir`` with ``ggufdspark quantize`` (the
engine's llama-quantize, beside ``--server``) unless they exist.

    python benchmarks/quant_speed.py --dir /tmp/qs [--size medium] [--concurrency 1,2] [--json out.json]
    python benchmarks/quant_speed.py --dir W/quant -m T-F16.gguf -md D-F16.gguf --gpu --concurrency 1,8

On AMX CPUs every arm with a quantized file runs with ``--no-repack`` (``hardware.engine_workarounds``),
so a target's plain and draft arms run alike.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from ggufdspark import engine, hardware  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.quantize import default_output, quantize  # noqa: E402
from ggufdspark.gguffile.reader import read_gguf  # noqa: E402
from ggufdspark.quants import is_quantized_file, precision  # noqa: E402
from ggufdspark.synthetic import synth  # noqa: E402
from ggufdspark.synthetic.pairs import build_pair  # noqa: E402

SIZES = {"small": (synth.SMALL_TARGET, synth.SMALL_DRAFTER, "tiny-lfm2"),
         "medium": (synth.MEDIUM_TARGET, synth.MEDIUM_DRAFTER, "medium-lfm2"),
         "full": (synth.FULL_TARGET, synth.FULL_DRAFTER, "full-lfm2")}


def float_pair(a) -> tuple[Path, Path]:
    """``-m``/``-md`` as given, or the generated pair of ``--size`` under ``--dir`` (reused)."""
    if a.target or a.draft:
        if not (a.target and a.draft):
            raise SystemExit("quant_speed: give both -m/--target and -md/--draft, or neither (--size)")
        return Path(a.target), Path(a.draft)
    tspec, dspec, name = SIZES[a.size]
    pair = build_pair(a.dir, target_spec=tspec, drafter_spec=dspec, name=name)
    return pair.target, pair.draft


def quant_files(a, target: Path, draft: Path) -> tuple[dict, dict, list[dict]]:
    """type -> file for targets and drafts; the float source stands for its own type. Each made
    file is listed with its size and quantize time."""
    made = []

    def one(src: Path, q: str, kind: str) -> Path:
        if precision(read_gguf(src)) == q:
            return src
        out = a.dir / default_output(src, q, kind).name
        if not out.exists():
            r = quantize(src, q, output=out, server=a.server)
            made.append({"path": str(out), "bytes": r.nbytes, "seconds": round(r.seconds, 1)})
            print(f"quantized {src.name} -> {out.name} in {r.seconds:.1f} s", file=sys.stderr, flush=True)
        return out

    return ({q: one(target, q, "target") for q in a.targets}, {q: one(draft, q, "draft") for q in a.drafts},
            made)


def run(a, server: str, targets: dict, drafts: dict, rates: list[float], levels: list[int], logs: Path,
        rows: list[dict], on_target) -> None:
    """Every target's arms into ``rows``; ``on_target()`` after each target (the JSON so far)."""
    top = max(levels)
    for tq, tpath in targets.items():
        quantized = is_quantized_file(tpath) or any(is_quantized_file(p) for p in drafts.values())
        base = harness.base_settings(server, tpath, gpu=a.gpu, parallel=top, n_predict=a.n_predict,
                                  threads=a.threads, quantized=quantized)
        kw = dict(levels=levels, n_predict=a.n_predict, trials=a.trials)
        try:
            plain = harness.measure_arm(f"plain-{tq}", base, logs, **kw,
                                     reference_tokens=0 if a.no_lossless else a.check_tokens)
        except GgufdsparkError as e:  # a server that died costs this target's row, not the run
            rows.append(failed(tq, None, e))
            continue
        pd = plain.to_dict()
        rows.append({"target": tq, "draft": None, **pd, "ratio": {n: 1.0 for n in levels}})
        print(f"target {tq:7s} draft -      {describe(pd, levels)}", file=sys.stderr, flush=True)
        for dq, dpath in drafts.items():
            try:
                spec = harness.measure_arm(f"spec-{tq}-{dq}", harness.drafted(base, dpath, a.draft_n_max, rates), logs,
                                        **kw).to_dict()
                row = {"target": tq, "draft": dq, **spec,
                       "ratio": {n: speed(spec, n) / speed(pd, n) if speed(pd, n) else None for n in levels}}
                if plain.reference:
                    row["lossless"] = harness.lossless(f"real-{tq}-{dq}",
                                                    harness.drafted(base, dpath, a.draft_n_max, None), logs,
                                                    plain.reference)
            except GgufdsparkError as e:
                rows.append(failed(tq, dq, e))
                continue
            rows.append(row)
            tail = f"  lossless: {row['lossless']['verdict']}" if "lossless" in row else ""
            print(f"target {tq:7s} draft {dq:6s} {describe(spec, levels)}{tail}", file=sys.stderr, flush=True)
        for r in rows:
            r.pop("reference", None)  # kept in the plain arm only while its drafts are checked
        on_target()


def failed(target: str, draft: str | None, e: Exception) -> dict:
    print(f"target {target:7s} draft {draft or '-':6s} FAILED: {e}", file=sys.stderr, flush=True)
    return {"target": target, "draft": draft, "error": str(e)}


def speed(arm: dict, n: int) -> float | None:
    """An arm's tok/s at level ``n``: median decode speed of single requests, else the aggregate."""
    return arm["tps"] if n == 1 else arm["load"][n]["tps"]


def describe(arm: dict, levels: list[int]) -> str:
    return "  ".join(f"{n} req {speed(arm, n):8.1f} tok/s" for n in levels)


def table(rows: list[dict], levels: list[int]) -> str:
    head = "| target | draft | " + " | ".join(f"{n} req tok/s | vs plain" for n in levels) + " | lossless (real acceptance) |"
    lines = [head, "|---|---|" + "---:|---:|" * len(levels) + "---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['target']} | {r['draft'] or '-'} | failed: {r['error'].splitlines()[0][:160]} |")
            continue
        cells = " | ".join(f"{speed(r, n):.1f} | {r['ratio'][n]:.2f}" for n in levels)
        loss = r["lossless"]["verdict"] if "lossless" in r else "-"
        lines.append(f"| {r['target']} | {r['draft'] or '-'} | {cells} | {loss} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap, required=False)
    ap.add_argument("--dir", type=Path, required=True, help="where the quantized files (and a generated pair) are made; reused")
    ap.add_argument("--size", choices=tuple(SIZES), default="small",
                    help="shapes of the pair generated when -m/-md are not given (full: the VL-3B tower's, 2.4B)")
    ap.add_argument("--targets", nargs="+", default=["F16", "Q8_0", "Q4_K_M"], help="target types to measure")
    ap.add_argument("--drafts", nargs="+", default=["F16", "Q8_0"], help="draft types to measure")
    ap.add_argument("--draft-n-max", type=int, default=None,
                    help="draft length (default: serve's default for the backend, CUDA with --gpu, else CPU)")
    ap.add_argument("--concurrency", default="1", help="parallel-request levels, comma-separated (e.g. 1,8)")
    ap.add_argument("--n-predict", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--trials", type=int, default=5, help="measured single requests per arm (median reported)")
    ap.add_argument("--check-tokens", type=int, default=64, help="length of the lossless check's greedy request")
    ap.add_argument("--no-lossless", action="store_true", help="skip the lossless check (one server less per combination)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for llama-server")
    ap.add_argument("--json", type=Path, help="write every number, command line and file here (rewritten after each target)")
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    levels = harness.levels(a.concurrency)
    server = str(engine.find_engine(a.server).path)
    a.server = a.server or server
    a.draft_n_max = a.draft_n_max or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    target, draft = float_pair(a)
    rates = harness.published_rates(draft)
    if a.draft_n_max > len(rates):
        raise SystemExit(f"quant_speed: --draft-n-max {a.draft_n_max}: {draft} drafts at most {len(rates)} tokens")
    t0 = time.perf_counter()
    targets, drafts, made = quant_files(a, target, draft)
    logs = a.dir / "logs"
    logs.mkdir(exist_ok=True)
    rows: list[dict] = []
    report = {"tool": "benchmarks/quant_speed.py", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "server": server,
              "gpu": a.gpu, "target": str(target), "draft": str(draft), "size": None if a.target else a.size,
              "files": {"targets": {q: str(p) for q, p in targets.items()},
                        "drafts": {q: str(p) for q, p in drafts.items()}, "made": made},
              "draft_n_max": a.draft_n_max, "levels": levels, "n_predict": a.n_predict, "trials": a.trials,
              "synthetic": f"mean accept length {harness.PUBLISHED_ACCEPT_LEN} over {len(rates)} positions, "
                           f"rates {[round(r, 4) for r in rates[:a.draft_n_max]]}",
              "check_tokens": None if a.no_lossless else a.check_tokens,
              "seconds": None, "rows": rows}

    def save() -> None:  # after every target: a run cut short keeps what it measured
        report["seconds"] = round(time.perf_counter() - t0, 1)
        if a.json:
            a.json.write_text(json.dumps(report, indent=2, default=str))

    run(a, server, targets, drafts, rates, levels, logs, rows, save)
    print(f"\nsynthetic acceptance: {report['synthetic']}; draft length {a.draft_n_max}; {a.n_predict} tokens, "
          f"greedy; 1 req: median of {a.trials}; N req: aggregate over the wall time\n")
    print(table(rows, levels))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
