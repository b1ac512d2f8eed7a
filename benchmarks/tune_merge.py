"""Merge ``tune --load --json`` results into one load table and print the recommendation as
``DRAFT_N_MAX CUT`` (``CUT``: ``N:L,...`` for ``--draft-n-max-by-slots``, or ``off``), what the
device script's ``table`` stage serves with. Each run's ratios are drafted / plain within that run;
a length measured in several runs keeps the last run's.

    python benchmarks/tune_merge.py tune-a.json tune-b.json [--min-gain 1.02] [--json merged.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggufdspark.measuring.tune import MIN_GAIN  # noqa: E402
from ggufdspark.measuring.tuneload import recommend_load  # noqa: E402


def merge(paths: list[str]) -> dict[int, dict[int, float]]:
    ratios: dict[int, dict[int, float]] = {}
    for p in paths:
        for n, by_level in json.loads(Path(p).read_text())["ratios"].items():
            ratios[int(n)] = {int(k): float(v) for k, v in by_level.items()}
    return ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="tune --load --json outputs")
    ap.add_argument("--min-gain", type=float, default=MIN_GAIN,
                    help="a length must beat plain (or the paused arm) by this much (default: tune's)")
    ap.add_argument("--json", help="write the merged ratios and recommendation here")
    a = ap.parse_args(argv)
    ratios = merge(a.results)
    rec = recommend_load(ratios, min_gain=a.min_gain)
    if a.json:
        Path(a.json).write_text(json.dumps({"ratios": ratios, "recommendation": rec, "from": a.results}, indent=2))
    print(rec["why"], file=sys.stderr)
    cut = ",".join(f"{n}:{k}" for n, k in rec["load_cut"] or []) or "off"
    print(rec["draft_n_max"] or 0, cut)
    return 0


if __name__ == "__main__":
    sys.exit(main())
