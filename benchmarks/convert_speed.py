#!/usr/bin/env python3
"""ggufdspark's GGUF files against llama.cpp's own tools, side by side on this machine, each arm its
own child process, median wall time and peak resident set:

* ``convert``: converting the full-size synthetic drafter, against the reference converter
  (``convert_hf_to_gguf.py``) and a plain ``cp`` (issue 3's goals);
* ``read``: reading a GGUF's header, against gguf-py's ``GGUFReader`` from the pinned tree.

    python benchmarks/convert_speed.py convert [--trials 3] [--outtype f16] [--work DIR]
    python benchmarks/convert_speed.py read FILE.gguf [--trials 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.synthetic import synth  # noqa: E402

CONVERT = """Conversion speed and memory: ggufdspark vs llama.cpp's reference converter, side by side.

Full-size synthetic drafter (the published shapes: 4 layers, hidden 2048, vocab 128000, Markov
rank 256, confidence head; 279.5M parameters, BF16 input), F16 output, on this machine. Each arm
runs as its own child process, alternating, ``--trials`` times; we report the median wall time and
the peak resident set (``ru_maxrss`` of that child, from ``os.wait4``), plus a plain ``cp`` of the
input as the I/O floor. Goals (issue 3): at most 1/3 of the reference's wall time and at most
200 MB peak RSS.

    python benchmarks/convert_speed.py convert [--trials 3] [--outtype f16] [--work DIR]
"""

READ = """Reading a GGUF's header (metadata + tensor directory): ggufdspark's reader against gguf-py's
``GGUFReader`` from the pinned llama.cpp tree, side by side on the same file.

Each arm runs in its own child process, alternating, ``--trials`` times; reported: median wall time
of the read (from process start to the metadata in hand, interpreter start-up excluded by timing
inside the child) and the child's peak resident set (``ru_maxrss`` from ``os.wait4``). This is what
``check`` and ``inspect`` do to every file they are given, Hub downloads included.

    python benchmarks/convert_speed.py read FILE.gguf [--trials 5]
"""


def full_inputs(work: Path) -> tuple[Path, Path]:
    """A full-size drafter and a target directory holding config + tokenizer (no weights needed:
    both converters read only the target's config and tokenizer)."""
    tdir, ddir = work / "target-shell", work / "drafter-full"
    if not (tdir / "config.json").is_file():
        # writing the 2.4B target's weights is not needed: make its config/tokenizer only
        spec = synth.FULL_TARGET
        tmp = work / "target-tiny-weights"
        small = synth.TargetSpec(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=256,
                                 num_hidden_layers=spec.num_hidden_layers, attention_layers=spec.attention_layers,
                                 num_attention_heads=spec.num_attention_heads,
                                 num_key_value_heads=spec.num_key_value_heads)
        synth.make_target(tmp, small)  # a valid Hub dir; weights unused by the drafter converters
        tdir.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(tmp / f, tdir / f)
        shutil.rmtree(tmp)
    if not (ddir / "config.json").is_file():
        print("generating the full-size drafter (BF16, 559 MB)...", file=sys.stderr)
        synth.make_drafter(ddir, tdir, synth.FULL_DRAFTER, dtype="BF16")
    return tdir, ddir


# A tiny launcher: ru_maxrss counts the image a child was forked from, so children are forked
# from this small interpreter rather than from the benchmark (which has numpy loaded).
LAUNCHER = r"""
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(time.perf_counter() - t0, ru.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status))
"""


def run_child(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process."""
    p = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *cmd], capture_output=True, text=True)
    wall, rss, code = p.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return float(wall), float(rss)


def convert_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trials", type=int, default=3, help="runs of each converter (medians reported)")
    ap.add_argument("--outtype", default="f16", help="output type for both converters")
    ap.add_argument("--work", type=Path, default=engine.cache_dir() / "bench" / "convert",
                    help="where the full-size inputs and the outputs go (inputs reused)")


def convert(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The conversion's arms (``CONVERT``): the table and the issue's goals printed."""
    args.work.mkdir(parents=True, exist_ok=True)
    tdir, ddir = full_inputs(args.work)
    tree = engine.fetch_source()
    out_mine, out_ref, out_cp = args.work / "mine.gguf", args.work / "ref.gguf", args.work / "copy.safetensors"
    py = sys.executable
    arms = {
        "ggufdspark convert": [py, "-m", "ggufdspark", "-q", "convert", str(ddir), "--target", str(tdir),
                               "-o", str(out_mine), "--outtype", args.outtype, "--force"],
        "llama.cpp convert_hf_to_gguf.py": [py, str(Path(__file__).resolve().parent.parent / "tests" / "oracle.py"), str(tree), "lfm2", "--",
                                            str(ddir), "--target-model-dir", str(tdir), "--outtype", args.outtype,
                                            "--outfile", str(out_ref)],
        "cp (I/O floor)": ["cp", str(ddir / "model.safetensors"), str(out_cp)],
    }
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
    for trial in range(args.trials):
        for name, cmd in arms.items():
            for f in (out_mine, out_ref, out_cp):
                f.unlink(missing_ok=True)
            results[name].append(run_child(cmd))
            print(f"trial {trial + 1}/{args.trials} {name}: {results[name][-1][0]:.2f}s "
                  f"{results[name][-1][1]:.0f} MB", file=sys.stderr)
    med = {k: (statistics.median(w for w, _ in v), max(r for _, r in v)) for k, v in results.items()}
    ref_wall = med["llama.cpp convert_hf_to_gguf.py"][0]
    size = (ddir / "model.safetensors").stat().st_size / 1e6
    print(f"\nfull-size DSpark drafter, {size:.0f} MB BF16 -> {args.outtype.upper()}, {os.cpu_count()} cores, "
          f"{args.trials} trials (median wall, max peak RSS)\n")
    print(f"{'arm':<34}{'wall s':>8}{'peak RSS MB':>13}{'wall vs reference':>19}")
    for name, (wall, rss) in med.items():
        print(f"{name:<34}{wall:>8.2f}{rss:>13.0f}{wall / ref_wall:>18.2f}x")
    mine_wall, mine_rss = med["ggufdspark convert"]
    print(f"\ngoal: wall <= 1/3 of reference ({ref_wall / 3:.2f}s): {'MET' if mine_wall <= ref_wall / 3 else 'NOT MET'}"
          f"; peak RSS <= 200 MB: {'MET' if mine_rss <= 200 else 'NOT MET'}")
    for f in (out_mine, out_ref, out_cp):
        f.unlink(missing_ok=True)
    return 0


# --------------------------------------------------------------------------- read


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


def run_reader(code: str, *args: str) -> tuple[float, int, float]:
    """(seconds inside the child, tensors seen, peak RSS in MB) of one child process."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"convert_speed.py read: a child failed (exit {os.waitstatus_to_exitcode(status)})")
    secs, tensors = out.split()
    return float(secs), int(tensors), usage.ru_maxrss / 1024


def read_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("file", type=Path, help="the GGUF file to read")
    ap.add_argument("--trials", type=int, default=5, help="reads per reader (median reported)")


def read(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The readers' arms (``READ``): the table printed."""
    if not a.file.is_file():
        raise SystemExit(f"convert_speed.py read: {a.file}: no such file")
    gguf_py = engine.llama_cpp_tree(engine.cache_dir()) / "gguf-py"
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        raise SystemExit(f"convert_speed.py read: {gguf_py}: the pinned tree's gguf-py is missing (run 'ggufdspark build-engine')")
    arms = {"ggufdspark read_gguf": (OURS, str(a.file)),
            "gguf-py GGUFReader (pinned tree)": (THEIRS, str(a.file), str(gguf_py))}
    res: dict[str, list[tuple[float, int, float]]] = {k: [] for k in arms}
    for _ in range(a.trials):
        for name, (code, *args) in arms.items():
            res[name].append(run_reader(code, *args))
    size = a.file.stat().st_size / 1e6
    print(f"{a.file.name}: {size:.1f} MB, {res[next(iter(res))][0][1]} tensors; median of {a.trials}")
    base = statistics.median(r[0] for r in res["gguf-py GGUFReader (pinned tree)"])
    print(f"{'arm':<36}{'read s':>10}{'peak RSS MB':>14}{'vs gguf-py':>12}")
    for name, rows in res.items():
        t = statistics.median(r[0] for r in rows)
        m = statistics.median(r[2] for r in rows)
        print(f"{name:<36}{t:>10.3f}{m:>14.0f}{t / base:>11.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"convert": (CONVERT, convert_arguments, convert),
                                          "read": (READ, read_arguments, read)}, argv)


if __name__ == "__main__":
    sys.exit(main())
