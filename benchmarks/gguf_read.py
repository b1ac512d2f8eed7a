#!/usr/bin/env python3
"""Reading a GGUF's header (metadata + tensor directory): ggufdspark's reader against gguf-py's
``GGUFReader`` from the pinned llama.cpp tree, side by side on the same file.

Each arm runs in its own child process, alternating, ``--trials`` times; reported: median wall time
of the read (from process start to the metadata in hand, interpreter start-up excluded by timing
inside the child) and the child's peak resident set (``ru_maxrss`` from ``os.wait4``). This is what
``check`` and ``inspect`` do to every file they are given, Hub downloads included.

    python benchmarks/gguf_read.py FILE.gguf [--trials 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from ggufdspark import engine  # noqa: E402

OURS = """
import sys, time
t0 = time.perf_counter()
from ggufdspark.gguffile.reader import read_gguf
g = read_gguf(sys.argv[1])
print(f"{time.perf_counter() - t0:.4f} {len(g.tensors)}")
"""

THEIRS = """
import sys, time
sys.path.insert(0, sys.argv[2])
t0 = time.perf_counter()
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
print(f"{time.perf_counter() - t0:.4f} {len(r.tensors)}")
"""


def run(code: str, *args: str) -> tuple[float, int, float]:
    """(seconds inside the child, tensors seen, peak RSS in MB) of one child process."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"gguf_read: a child failed (exit {os.waitstatus_to_exitcode(status)})")
    secs, tensors = out.split()
    return float(secs), int(tensors), usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", type=Path, help="the GGUF file to read")
    ap.add_argument("--trials", type=int, default=5, help="reads per reader (median reported)")
    a = ap.parse_args()
    if not a.file.is_file():
        raise SystemExit(f"gguf_read: {a.file}: no such file")
    gguf_py = engine.llama_cpp_tree(engine.cache_dir()) / "gguf-py"
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        raise SystemExit(f"gguf_read: {gguf_py}: the pinned tree's gguf-py is missing (run 'ggufdspark build-engine')")
    arms = {"ggufdspark read_gguf": (OURS, str(a.file)),
            "gguf-py GGUFReader (pinned tree)": (THEIRS, str(a.file), str(gguf_py))}
    res: dict[str, list[tuple[float, int, float]]] = {k: [] for k in arms}
    for _ in range(a.trials):
        for name, (code, *args) in arms.items():
            res[name].append(run(code, *args))
    size = a.file.stat().st_size / 1e6
    print(f"{a.file.name}: {size:.1f} MB, {res[next(iter(res))][0][1]} tensors; median of {a.trials}")
    base = statistics.median(r[0] for r in res["gguf-py GGUFReader (pinned tree)"])
    print(f"{'arm':<36}{'read s':>10}{'peak RSS MB':>14}{'vs gguf-py':>12}")
    for name, rows in res.items():
        t = statistics.median(r[0] for r in rows)
        m = statistics.median(r[2] for r in rows)
        print(f"{name:<36}{t:>10.3f}{m:>14.0f}{t / base:>11.2f}x")


if __name__ == "__main__":
    main()
