#!/usr/bin/env bash
# The pinned llama.cpp tree for the H200 device machine, which has no network: written here as
# .carry/llama.cpp.tar.xz (ignored by git; name .carry in the device call's carry list), which
# benchmarks/h200_env.sh extracts there once. The tree ggufdspark fetches and checks (the sdist's
# vendor/llama.cpp, as build-engine uses it), less what no build reads: models/, docs/, media/,
# benches/, .github/ (tools/ui stays: the server's build takes its chat page from there). A fresh
# checkout has no .carry: run this once before the first device call of a session.
#
#   bash benchmarks/carry.sh        (PYTHON: the interpreter with ggufdspark, default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
tree=$("$py" -c 'from ggufdspark import engine; print(engine.fetch_source())' 2>/dev/null) ||
    { echo "carry.sh: $py cannot fetch the pinned tree through ggufdspark (PYTHON: an interpreter that has it)" >&2; exit 1; }
[ -f "$tree/CMakeLists.txt" ] || { echo "carry.sh: $tree: no CMakeLists.txt (not the pinned tree)" >&2; exit 1; }
mkdir -p .carry
out=.carry/llama.cpp.tar.xz
tmp=$out.tmp
trap 'rm -f "$tmp"' EXIT
name=$(basename "$tree")
tar -C "$(dirname "$tree")" --exclude="$name/models" --exclude="$name/docs" --exclude="$name/media" \
    --exclude="$name/benches" --exclude="$name/.github" --exclude="$name/.git" \
    --transform="s,^$name,llama.cpp," -cJf "$tmp" "$name"
mv "$tmp" "$out"
trap - EXIT
echo "$out: $(du -h "$out" | cut -f1) (the pinned tree from $tree)"
