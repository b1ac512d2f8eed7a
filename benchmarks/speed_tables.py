#!/usr/bin/env python3
"""Plain against drafted decode speed as the docs' tables give it, a pair generated (or given) for
each row, every server built by the harness (``benchmarks/harness.py``):

* ``family``: each LiquidAI DSpark family, one request and N at once, with the lossless check
  (issue 16's table, docs/families.md);
* ``quant``: every target x draft precision, plain and drafted, with the lossless check (issue 15's
  table, docs/quantize.md).

    python benchmarks/speed_tables.py family --dir /tmp/fam --size small --lengths 2,3   # CPU smoke test
    python benchmarks/speed_tables.py quant --dir /tmp/qs [--size medium] [--concurrency 1,2] [--json out.json]

``python benchmarks/speed_tables.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark import engine, hardware  # noqa: E402
from ggufdspark.convert.drafter import convert_drafter  # noqa: E402
from ggufdspark.convert.target import convert_target  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.families import FAMILIES, SIZES  # noqa: E402
from ggufdspark.generate import generate  # noqa: E402
from ggufdspark.gguffile.reader import read_gguf  # noqa: E402
from ggufdspark.quantize import default_output, quantize  # noqa: E402
from ggufdspark.quants import is_quantized_file, precision  # noqa: E402
from ggufdspark.synthetic import synth  # noqa: E402
from ggufdspark.synthetic.pairs import build_pair  # noqa: E402

FAMILY = """Plain vs drafted decode speed for each LiquidAI DSpark family, one request (issue 16's table).

For each family of ``--families`` (default all four: ``ggufdspark.families``), one after the other:

1. the pair on disk: ``--pair FAMILY=TARGET,DRAFT`` as given, else ``DIR/FAMILY/target-F16.gguf``
   and ``dspark-target-F16.gguf`` when both exist, else generated (``ggufdspark generate --family F
   --size S``) and converted (``convert-target``, ``convert``: what benchmarks/h200.sh's setup does);
2. the target alone, then with the draft at each of ``--lengths`` with llama.cpp's synthetic
   acceptance at the published profile (benchmarks/harness.py: 4.22 over the draft's block, rates held
   fixed across lengths), one server each with as many slots as the highest ``--concurrency`` level:
   median decode tok/s of ``--trials`` single requests, and at each level above one (default 8) the
   aggregate tok/s of that many requests at once;
3. the lossless check at ``--check-length`` (default: serve's draft length for the backend): the
   draft at real acceptance, its greedy output against the plain server's, "equal" or "differs at
   token i";
4. unless ``--keep``, the generated files are deleted (the 8B-A1B's checkpoint and F16 file are
   about 17 GB each; files given with ``--pair`` are never touched), so families are measured one
   at a time within the disk.

Prints a table; ``--json`` is rewritten after every family, so a run cut short keeps what it had.

    python benchmarks/speed_tables.py family --dir /tmp/fam --size small --lengths 2,3   # CPU smoke test
    python benchmarks/speed_tables.py family --dir W/fam --gpu --families 8b-a1b --json fam.json
"""

QUANT = """Decode speed of every target x draft precision combination, plain and with the DSpark draft,
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

    python benchmarks/speed_tables.py quant --dir /tmp/qs [--size medium] [--concurrency 1,2] [--json out.json]
    python benchmarks/speed_tables.py quant --dir W/quant -m T-F16.gguf -md D-F16.gguf --gpu --concurrency 1,8

On AMX CPUs every arm with a quantized file runs with ``--no-repack`` (``hardware.engine_workarounds``),
so a target's plain and draft arms run alike.
"""


def parse_levels(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]`` (sorted, without repeats); refuses a level below 1."""
    out = sorted({int(x) for x in text.split(",") if x.strip()})
    if not out or out[0] < 1:
        raise SystemExit(f"--concurrency {text!r}: expected numbers of parallel requests >= 1, comma-separated")
    return out


# --------------------------------------------------------------------------- family


TARGET, DRAFT = "target-F16.gguf", "dspark-target-F16.gguf"


def given_pairs(items: list[str]) -> dict[str, tuple[Path, Path]]:
    """``["vl-3b=T.gguf,D.gguf"]`` -> ``{"vl-3b": (T, D)}``."""
    out = {}
    for it in items:
        fam, _, files = it.partition("=")
        t, _, d = files.partition(",")
        if fam not in FAMILIES or not t or not d:
            raise SystemExit(f"speed_tables.py family: --pair {it!r}: expected FAMILY=TARGET,DRAFT with FAMILY one of "
                             f"{', '.join(FAMILIES)}")
        out[fam] = (Path(t), Path(d))
    return out


def make_pair(fdir: Path, fam: str, size: str, keep: bool) -> dict:
    """Generate and convert one family's pair under ``fdir`` (reused when both GGUFs exist); the
    checkpoints are removed after conversion unless ``keep``. Returns paths, sizes and times."""
    t, d = fdir / TARGET, fdir / DRAFT
    info = {"target": str(t), "draft": str(d), "generated": False}
    if t.is_file() and d.is_file():
        return info
    free = shutil.disk_usage(fdir.parent).free
    print(f"{fam}: generating the {size} pair in {fdir} ({free / 1e9:.0f} GB free)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    g = generate(fdir, family=fam, size=size, force=True)
    t1 = time.perf_counter()
    convert_target(fdir / "target", output=t, force=True)
    t2 = time.perf_counter()
    convert_drafter(fdir / "drafter", t, output=d, force=True)
    t3 = time.perf_counter()
    if not keep:  # the GGUFs are all the measurement needs
        for sub in ("target", "drafter"):
            shutil.rmtree(fdir / sub, ignore_errors=True)
    info.update(generated=True, checkpoint_bytes=g.bytes, target_bytes=t.stat().st_size, draft_bytes=d.stat().st_size,
                generate_s=round(t1 - t0, 1), convert_target_s=round(t2 - t1, 1), convert_draft_s=round(t3 - t2, 1))
    print(f"{fam}: generate {info['generate_s']} s ({g.bytes / 1e9:.1f} GB), convert-target {info['convert_target_s']} s, "
          f"convert {info['convert_draft_s']} s", file=sys.stderr, flush=True)
    return info


def remove_pair(fdir: Path) -> None:
    """What ``make_pair`` writes: the two GGUFs and the checkpoint directories."""
    for name in (TARGET, DRAFT):
        (fdir / name).unlink(missing_ok=True)
    for sub in ("target", "drafter"):
        shutil.rmtree(fdir / sub, ignore_errors=True)


def measure_family(a, server: str, fam: str, target: Path, draft: Path, logs: Path) -> dict:
    """The plain arm, one drafted arm per length, and the lossless check."""
    rates = harness.published_rates(draft)
    lengths = [n for n in a.lengths if n <= len(rates)]
    base = harness.base_settings(server, target, gpu=a.gpu, parallel=max(a.concurrency), n_predict=a.n_predict,
                              threads=a.threads)
    kw = dict(levels=a.concurrency, n_predict=a.n_predict, trials=a.trials)
    plain = harness.measure_arm("plain", base, logs, **kw, reference_tokens=0 if a.no_lossless else a.check_tokens)
    print(f"{fam}: plain {plain.tps:.1f} tok/s", file=sys.stderr, flush=True)
    res = {"family": fam, "model": FAMILIES[fam].model, "moe": FAMILIES[fam].moe, "rates": rates,
           "skipped_lengths": [n for n in a.lengths if n > len(rates)], "plain": plain.to_dict(), "drafted": {}}
    res["plain"].pop("reference", None)
    for n in lengths:
        arm = harness.measure_arm(f"n{n}", harness.drafted(base, draft, n, rates), logs, **kw)
        load_ratio = {lvl: arm.load[lvl]["tps"] / plain.load[lvl]["tps"] for lvl in arm.load}
        res["drafted"][n] = {**arm.to_dict(), "ratio": arm.tps / plain.tps, "load_ratio": load_ratio}
        under_load = "".join(f", {lvl} req {arm.load[lvl]['tps']:.1f} tok/s ({r:.2f}x)" for lvl, r in load_ratio.items())
        print(f"{fam}: n_max {n}: {arm.tps:.1f} tok/s ({arm.tps / plain.tps:.2f}x, accept length "
              f"{arm.accept_length or 0:.2f}){under_load}", file=sys.stderr, flush=True)
    if plain.reference and a.check_length <= len(rates):
        res["lossless"] = harness.lossless(f"real-n{a.check_length}", harness.drafted(base, draft, a.check_length, None),
                                        logs, plain.reference)
        res["lossless"]["draft_n_max"] = a.check_length
        print(f"{fam}: lossless at n_max {a.check_length}: {res['lossless']['verdict']}", file=sys.stderr, flush=True)
    return res


def family_table(results: list[dict], lengths: list[int], check_length: int, concurrency: list[int]) -> str:
    """One row per family: plain and each draft length at one request, then at each level above one
    (aggregate tok/s over the wall time), and the lossless verdict."""
    loads = [lvl for lvl in concurrency if lvl > 1]
    head = ("| family | target | plain tok/s | " + " | ".join(f"n_max {n} tok/s (vs plain)" for n in lengths)
            + "".join(f" | {lvl} req plain tok/s | " + " | ".join(f"{lvl} req n_max {n} (vs plain)" for n in lengths)
                      for lvl in loads)
            + f" | lossless at n_max {check_length} |")
    width = 1 + len(lengths) + len(loads) * (1 + len(lengths))
    lines = [head, "|---|---|" + "---:|" * width + "---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['family']} | {r['model'].split('/')[-1]} | failed: {r['error'].splitlines()[0][:160]} |")
            continue
        cells = [f"{r['plain']['tps']:.1f}"]
        for n in lengths:
            d = r["drafted"].get(n)
            cells.append(f"{d['tps']:.1f} ({d['ratio']:.2f}x)" if d else "-")
        for lvl in loads:
            cells.append(f"{r['plain']['load'][lvl]['tps']:.1f}")
            for n in lengths:
                d = r["drafted"].get(n)
                cells.append(f"{d['load'][lvl]['tps']:.1f} ({d['load_ratio'][lvl]:.2f}x)" if d else "-")
        kind = "MoE" if r["moe"] else "dense"
        loss = r["lossless"]["verdict"] if "lossless" in r else "-"
        lines.append(f"| {r['family']} | {r['model'].split('/')[-1]} ({kind}) | " + " | ".join(cells) + f" | {loss} |")
    return "\n".join(lines)


def family_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--dir", type=Path, required=True, help="work directory: one sub-directory per family, and the server logs")
    ap.add_argument("--families", default=",".join(FAMILIES), help="families to measure, comma-separated (default: all four)")
    ap.add_argument("--size", choices=SIZES, default="full", help="shapes of the generated pairs (small: tiny test pairs)")
    ap.add_argument("--pair", action="append", default=[],
                    help="FAMILY=TARGET,DRAFT: measure these files instead of generating (repeat; never deleted)")
    harness.add_engine_arguments(ap)
    ap.add_argument("--lengths", default="4,5,6", help="draft lengths (n_max) to measure, comma-separated")
    ap.add_argument("--check-length", type=int, default=None,
                    help="draft length of the lossless check (default: serve's default for the backend)")
    ap.add_argument("--check-tokens", type=int, default=64, help="length of the lossless check's greedy request")
    ap.add_argument("--no-lossless", action="store_true", help="skip the lossless check (one server less per family)")
    ap.add_argument("--concurrency", default="1,8",
                    help="parallel requests to measure, comma-separated (default 1,8: one request, and 8 at once "
                         "on a server with 8 slots)")
    ap.add_argument("--n-predict", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--trials", type=int, default=3, help="measured requests per arm (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for llama-server")
    ap.add_argument("--keep", action="store_true", help="keep each family's generated files after measuring")
    ap.add_argument("--json", type=Path, help="write every number here (rewritten after each family)")


def family(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The families' table (``FAMILY``), one family after the other; ``--json`` rewritten after each."""
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown or not fams:
        raise SystemExit(f"speed_tables.py family: --families {a.families!r}: expected some of {', '.join(FAMILIES)}")
    a.lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    a.concurrency = parse_levels(a.concurrency)
    if 1 not in a.concurrency:
        raise SystemExit(f"speed_tables.py family: --concurrency {','.join(map(str, a.concurrency))}: the table needs 1 "
                         f"(the one-request row)")
    a.check_length = a.check_length or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    given = given_pairs(a.pair)
    server = str(engine.find_engine(a.server).path)
    report = {"tool": "benchmarks/speed_tables.py family", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "server": server,
              "gpu": a.gpu, "size": a.size, "n_predict": a.n_predict, "trials": a.trials, "lengths": a.lengths,
              "concurrency": a.concurrency,
              "accept_len": harness.PUBLISHED_ACCEPT_LEN, "check_length": a.check_length,
              "check_tokens": None if a.no_lossless else a.check_tokens, "families": []}
    for fam in fams:
        t0 = time.perf_counter()
        fdir = a.dir / fam
        fdir.mkdir(parents=True, exist_ok=True)
        logs = a.dir / "logs" / fam
        logs.mkdir(parents=True, exist_ok=True)
        for old in logs.glob("*.log"):  # the engine appends: a crash log must hold this run's server only
            old.unlink()
        files: dict = {}
        try:
            if fam in given:
                files = {"target": str(given[fam][0]), "draft": str(given[fam][1]), "given": True}
            else:
                files = make_pair(fdir, fam, a.size, a.keep)
            res = measure_family(a, server, fam, Path(files["target"]), Path(files["draft"]), logs)
        except GgufdsparkError as e:  # one family's failure (a server that died...) does not cost the others
            res = {"family": fam, "model": FAMILIES[fam].model, "moe": FAMILIES[fam].moe, "error": str(e)}
            print(f"{fam}: FAILED: {e}", file=sys.stderr, flush=True)
        finally:  # measured or failed, the next family needs the disk
            if not (a.keep or fam in given):
                remove_pair(fdir)
        res.update(files=files, seconds=round(time.perf_counter() - t0, 1))
        report["families"].append(res)
        print(f"{fam}: done in {res['seconds']} s", file=sys.stderr, flush=True)
        if a.json:
            a.json.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nsynthetic acceptance: mean accept length {harness.PUBLISHED_ACCEPT_LEN} over each draft's block, "
          f"geometric rates truncated per length; {a.n_predict} tokens, greedy; one request: median of {a.trials}; "
          f"N requests: aggregate tok/s over the wall time, {max(a.concurrency)} slots\n")
    print(family_table(report["families"], a.lengths, a.check_length, a.concurrency))
    return 1 if any("error" in r for r in report["families"]) else 0


# --------------------------------------------------------------------------- quant


PAIR_SIZES = {"small": (synth.SMALL_TARGET, synth.SMALL_DRAFTER, "tiny-lfm2"),
         "medium": (synth.MEDIUM_TARGET, synth.MEDIUM_DRAFTER, "medium-lfm2"),
         "full": (synth.FULL_TARGET, synth.FULL_DRAFTER, "full-lfm2")}


def float_pair(a) -> tuple[Path, Path]:
    """``-m``/``-md`` as given, or the generated pair of ``--size`` under ``--dir`` (reused)."""
    if a.target or a.draft:
        if not (a.target and a.draft):
            raise SystemExit("speed_tables.py quant: give both -m/--target and -md/--draft, or neither (--size)")
        return Path(a.target), Path(a.draft)
    tspec, dspec, name = PAIR_SIZES[a.size]
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


def run_targets(a, server: str, targets: dict, drafts: dict, rates: list[float], levels: list[int], logs: Path,
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


def quant_table(rows: list[dict], levels: list[int]) -> str:
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


def quant_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap, required=False)
    ap.add_argument("--dir", type=Path, required=True, help="where the quantized files (and a generated pair) are made; reused")
    ap.add_argument("--size", choices=tuple(PAIR_SIZES), default="small",
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


def quant(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The precisions' table (``QUANT``); ``--json`` rewritten after each target."""
    a.dir.mkdir(parents=True, exist_ok=True)
    levels = parse_levels(a.concurrency)
    server = str(engine.find_engine(a.server).path)
    a.server = a.server or server
    a.draft_n_max = a.draft_n_max or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    target, draft = float_pair(a)
    rates = harness.published_rates(draft)
    if a.draft_n_max > len(rates):
        raise SystemExit(f"speed_tables.py quant: --draft-n-max {a.draft_n_max}: {draft} drafts at most {len(rates)} tokens")
    t0 = time.perf_counter()
    targets, drafts, made = quant_files(a, target, draft)
    logs = a.dir / "logs"
    logs.mkdir(exist_ok=True)
    rows: list[dict] = []
    report = {"tool": "benchmarks/speed_tables.py quant", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "server": server,
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

    run_targets(a, server, targets, drafts, rates, levels, logs, rows, save)
    print(f"\nsynthetic acceptance: {report['synthetic']}; draft length {a.draft_n_max}; {a.n_predict} tokens, "
          f"greedy; 1 req: median of {a.trials}; N req: aggregate over the wall time\n")
    print(quant_table(rows, levels))
    return 1 if any("error" in r for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"family": (FAMILY, family_arguments, family),
                                          "quant": (QUANT, quant_arguments, quant)}, argv)


if __name__ == "__main__":
    sys.exit(main())
