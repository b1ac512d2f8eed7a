#!/usr/bin/env bash
# The engine patch series is kept as commits on a git checkout of the pinned llama.cpp tree and
# re-exported from there, as ollama does for its vendored llama.cpp. Two series:
#   ggufdspark/data/patches/*.patch      the product's: what every `build-engine` applies
#   ggufdspark/data/patches-dev/*.patch  the developer build's, applied on top by `build-engine --dev`
#                                        (profiling, test-backend-ops perf cases, kept experiments)
# Each patch keeps its number for life (docs and tests cite it): the commit message's trailer
# "ggufdspark-patch: NNNN" names the file; a commit without one gets the next free number.
#
#   scripts/engine_patches.sh checkout DIR   pinned tree (fetched and sha256-checked by ggufdspark)
#                                            into DIR as a git repository: tag "base", branch
#                                            "product" (the product series, one commit a patch,
#                                            git am) and branch "dev" (the dev series on top), checked out
#   scripts/engine_patches.sh export DIR     base..product into patches/, product..dev into patches-dev/
#                                            (git format-patch: subject + message + diff). After
#                                            editing product, rebase dev onto it first.
#                                            PATCHES_OUT=D exports into D/patches and D/patches-dev
#                                            instead (a round trip to compare, as the tests do).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
product=$repo/ggufdspark/data/patches
dev=$repo/ggufdspark/data/patches-dev
out_product=${PATCHES_OUT:+$PATCHES_OUT/patches}; out_product=${out_product:-$product}
out_dev=${PATCHES_OUT:+$PATCHES_OUT/patches-dev}; out_dev=${out_dev:-$dev}
py=${PYTHON:-$repo/.venv/bin/python}
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { sed -n '2,19p' "$0" >&2; exit 2; }
git_() { git -c user.name=ggufdspark -c user.email=ggufdspark@localhost "$@"; }

export_range() {  # export_range RANGE SERIES_DIR
    local tmp n f
    tmp=$(mktemp -d)
    git format-patch -q -N --zero-commit --no-signature -o "$tmp" "$1"
    rm -f "$2"/*.patch
    mkdir -p "$2"
    for f in "$tmp"/*.patch; do
        [ -e "$f" ] || continue
        n=$(sed -n 's/^ggufdspark-patch: \([0-9]\{4\}\)$/\1/p' "$f" | head -n1)
        if [ -z "$n" ]; then
            n=$(ls "$product" "$dev" 2>/dev/null | sed -n 's/^\([0-9]\{4\}\)-.*/\1/p' | sort | tail -n1)
            n=$(printf %04d $((10#${n:-0} + 1)))
            echo "engine_patches: $(basename "$f") has no ggufdspark-patch trailer: numbered $n" >&2
        fi
        mv "$f" "$2/$n-$(basename "$f" | sed 's/^[0-9]*-//')"
    done
    rmdir "$tmp" 2>/dev/null || true
}

case $cmd in
checkout)
    [ ! -e "$dir" ] || { echo "engine_patches: $dir exists" >&2; exit 1; }
    tree=$("$py" -c 'from ggufdspark import engine; print(engine.fetch_source())')
    cp -a "$tree" "$dir"
    cd "$dir"
    rm -f .git  # the sdist's tree is a submodule checkout: a .git file pointing nowhere
    git init -q
    git add -A >/dev/null
    git_ commit -qm "pinned llama.cpp (llama-cpp-python 0.3.36 vendor tree)"
    git tag base
    git checkout -q -b product
    for p in "$product"/*.patch; do [ -e "$p" ] && git_ am -q "$p"; done
    git checkout -q -b dev
    for p in "$dev"/*.patch; do [ -e "$p" ] && git_ am -q "$p"; done
    git log --oneline base..dev
    ;;
export)
    cd "$dir"
    export_range base..product "$out_product"
    export_range product..dev "$out_dev"
    ls "$out_product" "$out_dev"
    ;;
*) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
