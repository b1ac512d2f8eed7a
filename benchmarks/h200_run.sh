#!/usr/bin/env bash
# How the H200 figures in docs/benchmarks.md were produced (one GPU, no network).
#   stage "setup": build the CUDA engine (+ llama-bench), generate and convert the full-size pair,
#                  and show what `serve` picks there;
#   stage "bench": run benchmarks/dspark_speed.py and llama-bench's verify-cost sweep.
# Environment: GGUFDSPARK_CACHE (work dir), GGUFDSPARK_LLAMA_SRC (an extracted pinned tree when the
# machine cannot reach PyPI), OUT (where results are copied).
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-setup}
W=${WORK:-$PWD/.devwork}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
T=$W/full/target-F16.gguf
D=$W/full/dspark-target-F16.gguf
py=${PYTHON:-python3}
BUILD_ARGS=(--cuda --with-tools --cmake-flag=-DCMAKE_CUDA_ARCHITECTURES=90)

if [ "$stage" = setup ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    (
        set -e
        $py -m ggufdspark generate "$W/full" --size full --force
        $py -m ggufdspark convert-target "$W/full/target" -o "$T" --force
        $py -m ggufdspark convert "$W/full/drafter" --target "$T" -o "$D" --force
    ) > "$W/gen.log" 2>&1 &
    gen=$!
    t0=$SECONDS
    $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" > "$OUT/build.log" 2>&1
    echo "build rc=$? in $((SECONDS - t0)) s"; tail -n 3 "$OUT/build.log"
    wait $gen; echo "generate+convert rc=$? (done at $((SECONDS - t0)) s)"; tail -n 6 "$W/gen.log" | tee "$OUT/gen.txt"
    $py -m ggufdspark doctor | tee "$OUT/doctor.txt"
    $py -m ggufdspark check "$T" "$D" | tee "$OUT/check.txt"
    $py -m ggufdspark serve -m "$T" -md "$D" --dry-run 2>&1 | tee "$OUT/serve-dry-run.txt"
    $py - "$T" "$D" <<'PY' 2>&1 | tee "$OUT/serve-request.txt"
import sys
from ggufdspark.serve import serving
with serving(sys.argv[1], sys.argv[2]) as (srv, client):
    print("command:", " ".join(srv.settings.redacted()))
    out = client.complete("Describe speculative decoding.", n_predict=128, ignore_eos=True)
    t = out.timings
    print(f"predicted {t.predicted_n}, drafted {t.draft_n}, accepted {t.draft_n_accepted}, "
          f"decode {t.decode_tps:.1f} tok/s")
    print([l for l in srv.log_text().splitlines() if "offloaded" in l or "CUDA0 model buffer" in l][:6])
PY
fi

if [ "$stage" = bench ]; then
    BIN=$(dirname "$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)")
    "$BIN/llama-bench" -m "$T" -ngl 99 -fa 1 -p 1,2,3,4,5,6,7,8,9,10 -n 64 -r 5 -o md 2>/dev/null | tee "$OUT/llama-bench-verify.md"
    $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN/llama-server" \
        --n-predict 256 --trials 3 --lengths 1,2,3,4,5,6,7,8,9 --concurrency 8,32 \
        --variants="--no-spec-draft-backend-sampling" \
        --json "$OUT/dspark_speed.json" --log-dir "$W/logs" 2>&1 | tee "$OUT/dspark_speed.txt"
fi

if [ "$stage" = profile ]; then
    BIN=$(dirname "$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)")
    $py benchmarks/profile_step.py --gpu --target "$T" --draft "$D" --server "$BIN/llama-server" \
        --lengths 6,9 --json "$OUT/profile_step.json" --log-dir "$W/plogs" 2>&1 | tee "$OUT/profile_step.txt"
fi

if [ "$stage" = tune ]; then
    BIN=$(dirname "$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)")
    $py -m ggufdspark tune -m "$T" -md "$D" --server "$BIN/llama-server" --acceptance published \
        --concurrency 1,8,32 -n 256 --requests 3 2>&1 | tee "$OUT/tune.txt"
    $py -m ggufdspark tune -m "$T" -md "$D" --show 2>&1 | tee "$OUT/tune-show.txt"
    $py -m ggufdspark serve -m "$T" -md "$D" --dry-run 2>&1 | tee "$OUT/serve-tuned.txt"
    $py -m ggufdspark serve -m "$T" -md "$D" --dry-run -np 8 2>&1 | tee -a "$OUT/serve-tuned.txt"
fi
