# Sourced by benchmarks/h200.sh (the H200 device script), from the checkout's root: the work
# directory and results folder, the environment every stage's Python needs, the full-size pair's
# paths (TARGET / DRAFT replace them), the CUDA build's arguments, and the carried pinned tree
# (.carry/llama.cpp.tar.xz) extracted once where there is one.
W=${WORK:-$PWD/.devwork}
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GGUFDSPARK_CACHE=$W/cache
py=${PYTHON:-python3}
T=${TARGET:-$W/full/target-F16.gguf}
D=${DRAFT:-$W/full/dspark-target-F16.gguf}
BUILD_ARGS=(--cuda --cmake-flag=-DCMAKE_CUDA_ARCHITECTURES=90)
[ -n "${DEV:-}" ] && BUILD_ARGS+=(--dev)  # DEV=1: the developer build (product + ggufdspark/data/patches-dev)
if [ ! -f "$W/src/llama.cpp/CMakeLists.txt" ] && [ -f .carry/llama.cpp.tar.xz ]; then
    mkdir -p "$W/src" && tar -xJf .carry/llama.cpp.tar.xz -C "$W/src"
fi
export GGUFDSPARK_LLAMA_SRC=$W/src/llama.cpp
