#!/usr/bin/env bash
# The trained pair on a GPU device machine (no network; carry .carry, made by benchmarks/carry.sh):
# the product CUDA build, the shipped pair converted to F16, then benchmarks/trained_acceptance.py:
# real acceptance at 1, 8, 32 and 64 clients, and around a pause (16 slots, drafting paused above 8
# busy) with 0069's kept rows (the default), with none kept (LLAMA_SPEC_PAUSE_KEEP=0, 0027 alone)
# and with every row taken in while paused (LLAMA_SPEC_PAUSE_INJECT=1); every block replayed on the
# torch checkpoints (torch on the GPU); PAUSE_ARMS: the pause's other arms (engine switches; both by
# default). Results: OUT/acceptance*.json, OUT/*.txt. PACK=1 also packs
# the built engine into OUT/engine/ (xz, 15 MB pieces) for a later call to carry.
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
$py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --with-tools --no-ui > "$OUT/build.txt" 2>&1
echo "build rc=$? in $((SECONDS - t0)) s"
wait $conv; echo "convert rc=$?"
BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --no-ui --print-path)
if [ -n "${PACK:-}" ]; then  # the engine for a later call: its cache folder less sources and objects
    key=$(basename "$(dirname "$(dirname "$(dirname "$BIN")")")")
    mkdir -p "$OUT/engine"
    ( tar -C "$W/cache/engine" -cf - "$key/build.json" "$key/build/bin" | xz -T16 -3 |
        split -b 15M - "$OUT/engine/$key.tar.xz." ) && ls -la "$OUT/engine"
fi
A=(benchmarks/trained_acceptance.py -m "$T" -md "$D" --pair "$PAIR" --server "$BIN" --gpu --draft "${DRAFT_N:-8}"
   --answer "${ANSWER:-128}" --log-dir "$W/acc")
quiet() { grep -v -i "warn\|causal_conv\|detach"; }
timeout "${LEVELS_TIMEOUT:-240}" $py "${A[@]}" --levels "${LEVELS:-1,8,32,64}" --requests-per-client "${RPC:-1}" \
    --pause 16:8 --json "$OUT/acceptance.json" 2>&1 | quiet | tee "$OUT/acceptance.txt"
for arm in ${PAUSE_ARMS-LLAMA_SPEC_PAUSE_KEEP=0 LLAMA_SPEC_PAUSE_INJECT=1}; do
    name=$(echo "${arm%%=*}" | tr 'A-Z_' 'a-z-')
    timeout "${ARM_TIMEOUT:-100}" $py "${A[@]}" --levels "" --pause 16:8 --env "$arm" --json "$OUT/acceptance-$name.json" \
        2>&1 | quiet | tee "$OUT/acceptance-$name.txt"
done
