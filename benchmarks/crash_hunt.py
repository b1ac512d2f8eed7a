#!/usr/bin/env python3
"""Start a drafted server again and again under the load that killed it, and say how often it died.

Engine patches 0001-0019 (issue 13) aborted on the H200 with "an illegal memory access" in about 3 of
13 runs of the families benchmark's VL-3B arm, never in the parallel load benchmark: one server with
``--slots`` slots, three single requests, then rounds of ``--slots`` identical requests at once
(synthetic acceptance at the published profile, as ``family_speed.py`` measures). This repeats that
``--runs`` times, each with a fresh server, and prints one line a run; for every death it prints the
log's error lines and the backtrace's function names (a CUDA error is reported where the host next
synchronizes: rerun with ``--locate`` to set ``GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1``,
so the failing kernel's own launch reports it).

    python benchmarks/crash_hunt.py -m T.gguf -md D.gguf --gpu [--runs 12] [--n-max 5] [--env A=1,B=2]

Exit status: 0 when no server died, 1 when one did.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import arms  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import environ, parse_env  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.errors import BenchError  # noqa: E402

LOCATE_ENV = {"GGML_CUDA_DISABLE_GRAPHS": "1", "CUDA_LAUNCH_BLOCKING": "1"}
_FRAME = re.compile(r"\((_Z[^+)]+)")


def death_report(log: Path, lines: int = 12) -> list[str]:
    """The error lines of a dead server's log and the function names of its backtrace (mangled
    names made readable by ``c++filt`` when it is there)."""
    text = log.read_text(errors="replace").splitlines()
    errors = [x for x in text if " E " in x or "CUDA error" in x or "GGML_ASSERT" in x][:lines]
    frames = [m[1] for x in text if (m := _FRAME.search(x))][:lines * 2]
    if frames and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(frames), capture_output=True, text=True).stdout
        frames = [f.split("(")[0] for f in out.splitlines()]
    return errors + [f"  at {f}" for f in frames]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--runs", type=int, default=12, help="fresh servers, one after another")
    ap.add_argument("--slots", type=int, default=8, help="slots, and identical requests sent at once")
    ap.add_argument("--n-max", type=int, default=5, help="draft length")
    ap.add_argument("--n-predict", type=int, default=256, help="tokens a request generates")
    ap.add_argument("--env", default="", help="NAME=VALUE,... for the engine")
    ap.add_argument("--locate", action="store_true", help=f"also set {' '.join(f'{k}={v}' for k, v in LOCATE_ENV.items())}")
    ap.add_argument("--log-dir", type=Path, default=Path("crash_hunt_logs"), help="one server log a run")
    a = ap.parse_args()
    if a.runs < 1 or a.slots < 1 or a.n_max < 1:
        ap.error("--runs, --slots and --n-max must be at least 1")
    try:
        env = parse_env(a.env)
    except ValueError as e:
        ap.error(f"--env: {e}")
    if a.locate:
        env.update(LOCATE_ENV)
    a.log_dir.mkdir(parents=True, exist_ok=True)
    server = a.server or engine.find_engine().path
    base = arms.base_settings(server, a.target, gpu=a.gpu, parallel=a.slots, n_predict=a.n_predict)
    settings = arms.drafted(base, a.draft, a.n_max, arms.published_rates(a.draft))
    died = 0
    with environ(env):
        for run in range(a.runs):
            log = a.log_dir / f"run{run}.log"
            log.unlink(missing_ok=True)  # a log of an earlier call would be read as this one's
            try:
                arm = arms.measure_arm(f"run{run}", settings, a.log_dir, levels=[1, a.slots], n_predict=a.n_predict,
                                       trials=3)
                print(f"run {run}: ok, 1 request {arm.tps:.1f} tok/s, {a.slots} at once "
                      f"{arm.load[a.slots]['tps']:.1f} tok/s", flush=True)
            except BenchError as e:
                died += 1
                print(f"run {run}: DIED: {e}", flush=True)
                for line in death_report(log):
                    print(f"    {line[:240]}", flush=True)
    label = ",".join(f"{k}={v}" for k, v in env.items()) or "default environment"
    print(f"\n{died} of {a.runs} servers died ({a.slots} slots, n_max {a.n_max}, {label})")
    return 1 if died else 0


if __name__ == "__main__":
    sys.exit(main())
