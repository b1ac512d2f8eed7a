#!/usr/bin/env bash
# The trained pair on a GPU device machine (no network): ggufdspark.trained.recipe's `train` step on
# the corpus made here (`python -m ggufdspark.trained.recipe corpus .devwork/tw`, carried as
# .devwork/tw/corpus), the pair brought back in files under the 16 MB a call returns:
#   OUT/model-0000K-of-0000N.safetensors   the target's shards
#   OUT/drafter.safetensors                the drafter
#   OUT/pair-small.tar.gz                  configs, tokenizer, recipe.json
#   OUT/train.log, OUT/gpu.txt
# Unpack here with benchmarks/train_pair.sh unpack FILES_AT DEST.
set -uo pipefail
cd "$(dirname "$0")/.."
W=${WORK:-.devwork/tw}
if [ "${1:-}" = unpack ]; then
    src=$2 dest=$3
    mkdir -p "$dest" && tar -C "$dest" -xzf "$src/pair-small.tar.gz" &&
        cp "$src"/model-*.safetensors "$dest/target/" 2>/dev/null; cp "$src/drafter.safetensors" "$dest/drafter/model.safetensors"
    [ -f "$src/model.safetensors" ] && cp "$src/model.safetensors" "$dest/target/"
    ls -la "$dest"/*; exit 0
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TRAIN_TIMEOUT:-560}" python3 -m ggufdspark.trained.recipe train "$W" --size "${SIZE:-gpu}" > "$OUT/train.log" 2>&1
echo "train rc=$?"
grep -v -i "warning\|losses.append\|detach()" "$OUT/train.log" | tail -n 40
cp "$W"/pair/target/model*.safetensors "$OUT/" 2>/dev/null
cp "$W/pair/drafter/model.safetensors" "$OUT/drafter.safetensors" 2>/dev/null
tar -C "$W/pair" --exclude='*.safetensors' -czf "$OUT/pair-small.tar.gz" . 2>/dev/null
ls -la "$OUT"
