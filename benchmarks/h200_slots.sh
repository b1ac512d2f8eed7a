#!/usr/bin/env bash
# Issue 28 on one H200: does the engine die at 32 / 64 slots under mixed-length prompts, which
# kernel faults, and what keeps it alive. One device call each (the build stays on a warm machine).
#
#   stage "setup":    benchmarks/h200_engine.sh's setup (carried pinned tree, patched CUDA build,
#                     full-size generated pair);
#   stage "mixed":    benchmarks/crash_hunt.py --traffic mixed: SLOTS (32) x ARMS (plain,draft) x
#                     ENVS (';'-separated engine environments, '-' = as it is) x RUNS (3) fresh
#                     servers, 2 x slots closed-loop requests each, prompts PROMPTS (200-2000) tokens;
#   stage "sanitize": the same load once under compute-sanitizer (memcheck names the faulting kernel);
#                     ENVS there: the one environment to run it in.
# Environment: WORK (default .devwork), OUT, STAGES (default: setup mixed), LIMIT (seconds a stage may
# take, default 420), N_MAX (7).
set -uo pipefail
cd "$(dirname "$0")/.."
TARGET='' DRAFT='' source benchmarks/h200_env.sh
STAGES=${STAGES:-setup mixed}
LIMIT=${LIMIT:-420}
BIN() { $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1; }
common() { echo -m "$T" -md "$D" --server "$(BIN)" --gpu --n-max "${N_MAX:-7}" --prompt-tokens "${PROMPTS:-200-2000}"; }
for stage in $STAGES; do
case $stage in
setup)
    WORK=$W OUT=$OUT STAGES=setup bash benchmarks/h200_engine.sh ;;
mixed)
    echo "== mixed traffic: slots ${SLOTS:-32}, arms ${ARMS:-plain,draft}, envs '${ENVS:--}', runs ${RUNS:-3}"
    timeout "$LIMIT" $py benchmarks/crash_hunt.py $(common) --slots "${SLOTS:-32}" --arms "${ARMS:-plain,draft}" \
        --envs="${ENVS:--}" --runs "${RUNS:-3}" --json "$OUT/mixed-${TAG:-a}.json" --log-dir "$W/hunt-${TAG:-a}"
    echo "mixed rc=$?"
    echo "-- patch 0025's log of nodes that changed under a repeated graph uid (count, line):"
    grep -h "repeated with changed node" "$W/hunt-${TAG:-a}"/*.log | sed -E 's/^[0-9.]+ W //; s/uid [0-9]+/uid N/' \
        | sort | uniq -c | sort -rn | head -n 12 ;;
sanitize)
    echo "== mixed traffic under compute-sanitizer: slots ${SLOTS:-32}, ${ARMS:-plain}"
    timeout "$LIMIT" $py benchmarks/crash_hunt.py $(common) --slots "${SLOTS:-32}" --arms "${ARMS:-plain}" --runs 1 \
        --envs="${ENVS:--}" --sanitizer --json "$OUT/sanitize.json" --log-dir "$W/hunt-san"
    echo "sanitize rc=$?"
    grep -h -m 40 "=========" "$W"/hunt-san/s*.log | head -n 60 ;;
*) echo "unknown stage $stage" ;;
esac
done
