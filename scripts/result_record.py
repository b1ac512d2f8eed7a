#!/usr/bin/env python3
"""Wrap a benchmark script's JSON (as the H200 device script writes it) into the summary that
``benchmarks/results/`` keeps: the keys its README lists, the script's own JSON under ``outputs.data``
with absolute paths cut to their file names, the bulky parts dropped (token ids ``tokens``, server
``logs`` and ``log_tail``), each list of per-request ``records`` kept as one table (``{"columns": [...],
"rows": [[...], ...]}``, floats to 6 decimals: a level's percentiles can be recomputed from it), and
the printed table (``--table``) under ``outputs.table``.

    python scripts/result_record.py RAW.json -o benchmarks/results/0c1e570-product-36/load-256.json \\
        --what "..." --command "..." --engine "..." --table RAW.txt

Refuses to overwrite an existing file without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

DROP = {"tokens", "logs", "log_tail"}
RECORDS = "records"
PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")
HARDWARE = "1x NVIDIA H200 (143771 MiB, driver 580.159.04), 16 CPU cores, CUDA build -DCMAKE_CUDA_ARCHITECTURES=90"
PAIR = "full-size generated LFM2.5-VL-3B-shaped pair (ggufdspark generate --size full), F16"
ACCEPTANCE = "synthetic acceptance at the published profile, truncated to the draft length"


def compact(value):
    """A scalar of a record as the table keeps it: floats to 6 decimals (a microsecond of a time in
    seconds), anything else as ``slim`` keeps it."""
    return round(value, 6) if isinstance(value, float) else slim(value)


def as_table(records: list):
    """A list of per-request records (dicts of scalars) as one table: the union of their keys in the
    order first seen, a row each, None where a record lacks a key. Anything else is slimmed as is."""
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return slim(records)
    columns: list[str] = []
    for r in records:
        columns += [k for k in r if k not in DROP and k not in columns]
    if any(isinstance(r.get(k), (dict, list)) for r in records for k in columns):
        return slim(records)  # nested records: not a table
    return {"columns": columns, "rows": [[compact(r.get(k)) for k in columns] for r in records]}


def slim(x):
    """``x`` without the keys in DROP, per-request records as tables, absolute paths cut to their last
    component."""
    if isinstance(x, dict):
        return {k: (as_table(v) if k == RECORDS else slim(v)) for k, v in x.items() if k not in DROP}
    if isinstance(x, list):
        return [slim(v) for v in x]
    if isinstance(x, str):
        return PATH.sub(r"\1", x)
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("raw", type=Path, help="the script's JSON")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the summary to write")
    ap.add_argument("--what", required=True, help="what it measured")
    ap.add_argument("--command", required=True, help="what ran (the device script's stage and variables)")
    ap.add_argument("--engine", required=True, help="llama.cpp commit, series, switches that differed")
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--hardware", default=HARDWARE, help="what it ran on (default: the H200 machine)")
    ap.add_argument("--pair", default=PAIR, help="the models (default: the full-size generated pair)")
    ap.add_argument("--acceptance", default=ACCEPTANCE, help="the acceptance (default: synthetic, published profile)")
    ap.add_argument("--table", type=Path, help="the script's printed output, kept as text")
    ap.add_argument("--force", action="store_true", help="overwrite an existing summary")
    a = ap.parse_args(argv)
    try:
        data = json.loads(a.raw.read_text())
    except (OSError, ValueError) as e:
        print(f"result_record.py: {a.raw}: {e}", file=sys.stderr)
        return 1
    try:
        table = a.table.read_text(errors="replace") if a.table else None
    except OSError as e:
        print(f"result_record.py: {a.table}: {e}", file=sys.stderr)
        return 1
    if a.output.exists() and not a.force:
        print(f"result_record.py: {a.output} exists (--force overwrites it)", file=sys.stderr)
        return 1
    record = {"result": a.output.name, "what": a.what, "command": a.command, "date": a.date,
              "hardware": a.hardware, "engine": a.engine, "pair": a.pair, "acceptance": a.acceptance,
              "commit": "see git log (recorded with the commit that cites it)",
              "raw": "the script's JSON, paths cut to file names, token ids and logs dropped, per-request records as tables",
              "outputs": {"data": slim(data), **({"table": slim(table)} if table is not None else {})}}
    tmp = a.output.with_name(a.output.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(a.output)
    print(f"{a.output}: {a.output.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
