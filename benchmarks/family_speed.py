#!/usr/bin/env python3
"""Plain vs drafted decode speed for each LiquidAI DSpark family, one request (issue 16's table).

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

    python benchmarks/family_speed.py --dir /tmp/fam --size small --lengths 2,3   # CPU smoke test
    python benchmarks/family_speed.py --dir W/fam --gpu --families 8b-a1b --json fam.json
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
from benchmarks.cli_args import add_engine_arguments  # noqa: E402
from ggufdspark import engine, hardware  # noqa: E402
from ggufdspark.convert.drafter import convert_drafter  # noqa: E402
from ggufdspark.convert.target import convert_target  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.families import FAMILIES, SIZES  # noqa: E402
from ggufdspark.generate import generate  # noqa: E402

TARGET, DRAFT = "target-F16.gguf", "dspark-target-F16.gguf"


def given_pairs(items: list[str]) -> dict[str, tuple[Path, Path]]:
    """``["vl-3b=T.gguf,D.gguf"]`` -> ``{"vl-3b": (T, D)}``."""
    out = {}
    for it in items:
        fam, _, files = it.partition("=")
        t, _, d = files.partition(",")
        if fam not in FAMILIES or not t or not d:
            raise SystemExit(f"family_speed: --pair {it!r}: expected FAMILY=TARGET,DRAFT with FAMILY one of "
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


def table(results: list[dict], lengths: list[int], check_length: int, concurrency: list[int]) -> str:
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="work directory: one sub-directory per family, and the server logs")
    ap.add_argument("--families", default=",".join(FAMILIES), help="families to measure, comma-separated (default: all four)")
    ap.add_argument("--size", choices=SIZES, default="full", help="shapes of the generated pairs (small: tiny test pairs)")
    ap.add_argument("--pair", action="append", default=[],
                    help="FAMILY=TARGET,DRAFT: measure these files instead of generating (repeat; never deleted)")
    add_engine_arguments(ap)
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
    a = ap.parse_args(argv)
    fams = [f.strip() for f in a.families.split(",") if f.strip()]
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown or not fams:
        raise SystemExit(f"family_speed: --families {a.families!r}: expected some of {', '.join(FAMILIES)}")
    a.lengths = [int(x) for x in a.lengths.split(",") if x.strip()]
    a.concurrency = harness.levels(a.concurrency)
    if 1 not in a.concurrency:
        raise SystemExit(f"family_speed: --concurrency {','.join(map(str, a.concurrency))}: the table needs 1 "
                         f"(the one-request row)")
    a.check_length = a.check_length or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    given = given_pairs(a.pair)
    server = str(engine.find_engine(a.server).path)
    report = {"tool": "benchmarks/family_speed.py", "when": time.strftime("%Y-%m-%dT%H:%M:%S"), "server": server,
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
    print(table(report["families"], a.lengths, a.check_length, a.concurrency))
    return 1 if any("error" in r for r in report["families"]) else 0


if __name__ == "__main__":
    sys.exit(main())
