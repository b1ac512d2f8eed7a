#!/usr/bin/env bash
# The trained pair on a GPU device machine (no network; carry .carry, made by benchmarks/carry.sh):
# the product CUDA build, the shipped pair converted to F16, then benchmarks/trained_acceptance.py:
# real acceptance at 1, 8, 32 and 64 clients and around a pause (16 slots, drafting paused above 8
# busy), with 0027's default and with LLAMA_SPEC_PAUSE_INJECT=1, every block replayed on the torch
# checkpoints (torch on the GPU). Results: OUT/acceptance.json, OUT/acceptance-inject.json, OUT/*.txt.
#   export OUT=$OUT; bash benchmarks/trained_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/h200_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PAIR=${PAIR:-ggufdspark/data/trained}
T=$W/trained-F16.gguf D=$W/dspark-trained-F16.gguf
( $py -m ggufdspark convert-target "$PAIR/target" -o "$T" --force &&
  $py -m ggufdspark convert "$PAIR/drafter" --target "$T" -o "$D" --force ) > "$W/convert.log" 2>&1 &
conv=$!
t0=$SECONDS
$py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --no-ui > "$OUT/build.txt" 2>&1
echo "build rc=$? in $((SECONDS - t0)) s"
wait $conv; echo "convert rc=$?"
BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --no-ui --print-path)
A=(benchmarks/trained_acceptance.py -m "$T" -md "$D" --pair "$PAIR" --server "$BIN" --gpu --draft "${DRAFT_N:-8}"
   --answer "${ANSWER:-128}" --log-dir "$W/acc")
timeout "${LEVELS_TIMEOUT:-240}" $py "${A[@]}" --levels "${LEVELS:-1,8,32,64}" --requests-per-client "${RPC:-1}" --pause 16:8 --json "$OUT/acceptance.json" \
    2>&1 | grep -v -i "warn\|causal_conv\|detach" | tee "$OUT/acceptance.txt"
timeout 120 $py "${A[@]}" --levels "" --pause 16:8 --env LLAMA_SPEC_PAUSE_INJECT=1 --json "$OUT/acceptance-inject.json" \
    2>&1 | grep -v -i "warn\|causal_conv\|detach" | tee "$OUT/acceptance-inject.txt"
