#!/usr/bin/env bash
# The engine patch series (ggufdspark/data/patches/*.patch) is kept as commits on a git checkout of
# the pinned llama.cpp tree and re-exported from there, as ollama does for its vendored llama.cpp.
#
#   scripts/engine_patches.sh checkout DIR   pinned tree (fetched and sha256-checked by ggufdspark)
#                                            into DIR as a git repository, the series applied as
#                                            one commit per patch (git am)
#   scripts/engine_patches.sh export DIR     DIR's commits after the base, back into the series
#                                            (git format-patch: numbered, subject + message + diff)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
series=$repo/ggufdspark/data/patches
py=${PYTHON:-$repo/.venv/bin/python}
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,11p' "$0" >&2; exit 2; }
case $cmd in
checkout)
    [ ! -e "$dir" ] || { echo "engine_patches: $dir exists" >&2; exit 1; }
    tree=$("$py" -c 'from ggufdspark import engine; print(engine.fetch_source())')
    cp -a "$tree" "$dir"
    cd "$dir"
    rm -f .git  # the sdist's tree is a submodule checkout: a .git file pointing nowhere
    git init -q
    git add -A >/dev/null
    git -c user.name=ggufdspark -c user.email=ggufdspark@localhost commit -qm "pinned llama.cpp (llama-cpp-python 0.3.36 vendor tree)"
    git tag base
    for p in "$series"/*.patch; do
        [ -e "$p" ] || continue
        git -c user.name=ggufdspark -c user.email=ggufdspark@localhost am -q "$p"
    done
    git log --oneline base..HEAD
    ;;
export)
    cd "$dir"
    base=$(git rev-parse -q --verify base || git rev-list --max-parents=0 HEAD)
    rm -f "$series"/*.patch
    git format-patch -q --zero-commit --no-signature -o "$series" "$base"..HEAD
    ls "$series"
    ;;
*) sed -n '2,11p' "$0" >&2; exit 2 ;;
esac
