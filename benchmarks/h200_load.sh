#!/usr/bin/env bash
# Issue 27's serving measurement on one H200 (no network): `ggufdspark bench --load` on the full-size
# generated pair (LFM2.5-VL-3B-shaped target + drafter of the published layout, F16), plain against
# drafted (serve's defaults: the CUDA draft length and its load cut), closed-loop clients at CLIENTS
# (1,2,4,8,16,32,64), REQUESTS_PER_CLIENT (3) requests each, answers of ANSWERS tokens (256; "256 1024"
# for both shapes, one run each), synthetic acceptance at the published profile (ggufdspark/acceptance.py,
# PROFILES["published"], truncated by bench to the draft length). One JSON per run in $OUT.
#
#   stage "setup": extract the carried pinned tree (.carry/llama.cpp.tar.xz), build the patched CUDA
#                  engine, generate and convert the full-size pair meanwhile (skipped when present);
#   stage "load":  the runs. If one fails (a server died), it is run again once with CUDA graphs off
#                  (GGML_CUDA_DISABLE_GRAPHS=1, issue 27's workaround at 32 slots), into load-ANSWER-nographs.json.
# Default STAGES="setup load": about 5 minutes of build, then a few minutes a run.
# CPU equivalent, the same command line on another pair and engine (tests/test_bench_load.py runs it on
# the test suite's small pair):
#   STAGES=load TARGET=tiny-lfm2-F16.gguf DRAFT=dspark-tiny-lfm2-F16.gguf SERVER=path/to/llama-server \
#     CLIENTS=1,2 ANSWERS=16 REQUESTS_PER_CLIENT=1 OUT=out benchmarks/h200_load.sh
# Environment: WORK (work dir, default .devwork), OUT (results), STAGES, CLIENTS, ANSWERS, REQUESTS_PER_CLIENT;
# TARGET, DRAFT, SERVER: another pair / engine than setup's (setup is then not needed).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/h200_env.sh
RATES=$($py -c "from ggufdspark.acceptance import PROFILES; print(','.join(map(str, PROFILES['published'].rates)))")

for stage in ${STAGES:-setup load}; do
case $stage in
setup)  # the carried tree, the patched CUDA build and the full-size pair, as h200_engine.sh makes them
    WORK=$W OUT=$OUT STAGES=setup bash benchmarks/h200_engine.sh
    ;;
load)
    if [ ! -f "$D" ]; then echo "stage load: no pair at $D: run the setup stage first"; continue; fi
    BIN=${SERVER:-$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)}
    for ans in ${ANSWERS:-256}; do
        args=(bench --load -m "$T" -md "$D" --server "$BIN" --clients "${CLIENTS:-1,2,4,8,16,32,64}"
              --answer-tokens "$ans" --requests-per-client "${REQUESTS_PER_CLIENT:-3}" --synthetic-rates "$RATES")
        echo "== ${args[*]}"
        $py -m ggufdspark "${args[@]}" --json "$OUT/load-$ans.json" --force --log-dir "$W/load-$ans" \
            2>&1 | tee "$OUT/load-$ans.txt" | grep -v "^bench --load: [0-9]*%" | tail -n 40
        if [ "${PIPESTATUS[0]}" -ne 0 ]; then
            for f in "$W/load-$ans"/*.log; do echo "-- $f"; tail -n 8 "$f"; done
            echo "== failed (logs: $W/load-$ans); again with CUDA graphs off"
            GGML_CUDA_DISABLE_GRAPHS=1 $py -m ggufdspark "${args[@]}" --json "$OUT/load-$ans-nographs.json" --force \
                --log-dir "$W/load-$ans-nographs" 2>&1 | tee "$OUT/load-$ans-nographs.txt" | grep -v "^bench --load: [0-9]*%" \
                | tail -n 40
        fi
    done
    ;;
*) echo "unknown stage $stage" ;;
esac
done
