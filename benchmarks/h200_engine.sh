#!/usr/bin/env bash
# The engine issues (12: no abort under parallel load; 13: speed) measured on one H200, in as few
# device calls as the machine allows (it has no network; a CUDA build costs about 5 minutes).
#
#   stage "setup":   extract the carried pinned tree (.carry/llama.cpp.tar.xz), build the patched
#                    CUDA engine with `ggufdspark build-engine` (patches from
#                    ggufdspark/data/patches), generate and convert the full-size pair meanwhile;
#   stage "abort":   benchmarks/parallel_load.py at 8 slots, 420-500-token prompts, synthetic
#                    acceptance at the published profile: the drafted tokens sampled through the
#                    old cub::DeviceTopK path, through the patched top-k, and the greedy drafts;
#   stage "matrix":  the same load at SLOTS (8 and 32) slots, draft lengths 4, 6, 9, RUNS (3) runs
#                    each, and real acceptance (greedy output equal to the plain server's);
#   stage "arms":    the series' run-time switches (ENV_VARIANTS) against the default, one request;
#   stage "load":    plain vs drafted at 1, 8 and 32 requests under the exported environment;
#   stage "few-check": patch 0012's verify kernel through test-backend-ops (results and kernel speed);
#   stage "few":     patch 0012 in the server (GGML_CUDA_MMV_FEW=1,2,4): speed arms and step profile;
#   stage "splitk-check": patch 0013 (split-K mul_mat_f) through test-backend-ops at the verify's shapes;
#   stage "rows-check": patch 0017 (short-rows mat-vec, the Markov head) through test-backend-ops;
#   stage "splitk":  patch 0013 in the server (GGML_CUDA_MMF_SPLIT_K=2,4,8): speed arms and step profile;
#   stage "cap":     load-aware drafting (patch 0011, --spec-draft-max-slots CAP) at 8, 16, 32 requests;
#   stage "speed":   benchmarks/dspark_speed.py (plain vs draft lengths, 1/8/32 requests) with the
#                    patched engine, and the sampled-drafts layout for comparison;
#   stage "profile": LLAMA_SPEC_PROFILE=1 per-phase step accounting, plain and drafted;
#   stage "kernels": Nsight Compute's device time per kernel over a window of drafted decode steps;
#   stage "small-shapes": patch 0008's kernels (on by default) against GGML_CUDA_SMALL_SHAPES=0.
#   stage "schedule": patch 0021: n_max LONG and SHORT at 1/8/32 requests, and LONG cut by SCHEDULE;
#   stage "mmf-few-check": patch 0022 (GGML_CUDA_MMF_FEW=FEW_VARIANTS, tensor-core kernel for 2-16 columns)
#                    through test-backend-ops: results against the CPU backend, speed at the verify's shapes;
#   stage "mmf-few": patch 0022 in the server: one request at LENGTHS (5,7), variants 2 and 4 vs default;
#   stage "final":   the default engine as serve runs it: one request at LENGTHS (5,7; TRIALS 5), 8 and
#                    32 requests at once (LOAD_TRIALS 3 waves a level, medians);
#   stage "argmax":  patch 0023 (the target graph's argmax, logits rows left on the device) on and off
#                    (LLAMA_OUTPUT_ARGMAX=0): plain and n_max LENGTHS (7) at 1, 8 and 32 requests, a run each;
#   stage "profile-load": LLAMA_SPEC_PROFILE=1 with CONC (8) requests at once, plain and n_max LENGTHS (7);
#   stage "crash":   benchmarks/crash_hunt.py: RUNS fresh 8-slot servers under the families load,
#                    and, if one died, again with CUDA graphs off and blocking launches (the kernel);
#   stage "quant":   issue 15: benchmarks/quant_speed.py on the setup stage's pair, target
#                    QUANT_TARGETS (F16 Q8_0 Q4_K_M) x draft F16/Q8_0, plain vs drafted at 1 and 8
#                    requests (synthetic acceptance at the published profile), each combination's
#                    greedy output at real acceptance against the same target alone; builds
#                    llama-quantize beside the engine first if the setup build lacks it;
#   stage "families": issue 16: benchmarks/family_speed.py, each full-size family of FAMILIES
#                    (default "1.2b 2.6b vl-3b"; the 8B-A1B needs a call of its own: FAMILIES=8b-a1b)
#                    generated, converted, plain vs draft lengths LENGTHS (4,5,6) at 1 and 8 requests, the
#                    lossless check, files deleted after each family; vl-3b reuses the setup pair.
#   Each needs the setup stage done in an earlier call on the same warm machine; one device call each:
#     STAGES=setup; then STAGES=quant; then STAGES=families; then FAMILIES=8b-a1b STAGES=families
#
# Environment: WORK (work dir, default .devwork: kept between calls on a warm machine), OUT (results),
# STAGES (default: setup abort matrix speed profile small-shapes). Engine switches exported before the
# script (e.g. GGML_CUDA_MMVF_MAX_N=8) reach every server it starts.
set -uo pipefail
cd "$(dirname "$0")/.."
TARGET='' DRAFT='' source benchmarks/h200_env.sh  # always the full-size pair this script makes
STAGES=${STAGES:-setup abort matrix speed profile small-shapes}

# kernel_check VAR "TEST_VALUES" PERF_FILTER ["PERF_VALUES"]: test-backend-ops (built in the engine's own
# build tree) runs MUL_MAT against the CPU backend with VAR set to each test value (F16/BF16 weights),
# then its perf mode on PERF_FILTER's cases with VAR unset and set to each perf value
kernel_check() {
    local var=$1 tvals=$2 filter=$3 pvals=${4:-$2} BIN B t0 v
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    B=$(dirname "$(dirname "$BIN")")
    t0=$SECONDS
    if ! { cmake -DLLAMA_BUILD_TESTS=ON "$B" > "$W/tbo.log" 2>&1 && cmake --build "$B" --target test-backend-ops -j "$(nproc)" >> "$W/tbo.log" 2>&1; }; then
        echo "test-backend-ops did not build"; tail -n 15 "$W/tbo.log"; return
    fi
    echo "test-backend-ops built in $((SECONDS - t0)) s"
    for v in $tvals; do
        env "$var=$v" timeout 120 "$B/bin/test-backend-ops" test -o MUL_MAT -b CUDA0 -p "type_a=(f16|bf16)" > "$OUT/tbo-$var-$v.txt" 2>&1
        echo "test-backend-ops MUL_MAT f16/bf16 with $var=$v: rc=$?"; grep -E "FAIL|tests passed|backends passed" "$OUT/tbo-$var-$v.txt" | tail -n 4
    done
    for v in 0 $pvals; do
        echo "== perf, $var=$v"
        env "$var=$v" timeout 120 "$B/bin/test-backend-ops" perf -o MUL_MAT -b CUDA0 -p "$filter" > "$OUT/tbo-perf-$var-$v.txt" 2>&1
        grep -E "MUL_MAT" "$OUT/tbo-perf-$var-$v.txt" | sed -E 's/MUL_MAT\(type_a=([a-z0-9]+),type_b=f32,(m=[0-9]+,n=[0-9]+,k=[0-9]+),.*: +[0-9]+ runs - +([0-9.]+ us\/run).*/\1 \2 \3/'
    done
    echo "kernel check done at $((SECONDS - t0)) s"
}

for stage in $STAGES; do
# every stage but setup measures the pair setup makes: on a machine without it (a fresh one: the
# device is given back after 30 s idle) say so at once instead of building and timing out
case $stage in setup|few-check|splitk-check|rows-check|mmf-few-check) ;; *)
    if [ ! -f "$D" ]; then
        echo "stage $stage: no pair at $D: run the setup stage first (in this call, or in a call on the same warm machine)"
        continue
    fi ;;
esac
case $stage in
setup)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    if [ ! -f "$D" ]; then
        (
            set -e
            $py -m ggufdspark generate "$W/full" --size full --force
            $py -m ggufdspark convert-target "$W/full/target" -o "$T" --force
            $py -m ggufdspark convert "$W/full/drafter" --target "$T" -o "$D" --force
        ) > "$W/gen.log" 2>&1 &
        gen=$!
    fi
    t0=$SECONDS
    # llama-quantize (the quant stage) and llama-bench come with the same build: a few seconds more
    $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --with-tools --no-ui > "$OUT/build.log" 2>&1
    echo "build rc=$? in $((SECONDS - t0)) s"; tail -n 2 "$OUT/build.log"
    if [ -n "${gen:-}" ]; then wait "$gen"; echo "generate+convert rc=$? at $((SECONDS - t0)) s"; tail -n 3 "$W/gen.log"; fi
    ;;
abort)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    common=(--target "$T" --draft "$D" --server "$BIN" --gpu --prompt-tokens 420-500 --n-predict 64-256)
    # a shared 200-token system prompt with prompt caching: slots chosen by similarity, only the
    # rest of each prompt processed, batched with other slots' drafts (the original abort's setting)
    for arm in "old-topk:3:LLAMA_DSPARK_SAMPLED=1,GGML_CUDA_TOPK_CUB=1" "new-topk:2:LLAMA_DSPARK_SAMPLED=1" "greedy:2:"; do
        name=${arm%%:*}; rest=${arm#*:}; runs=${rest%%:*}; env=${rest#*:}
        echo "== 8 slots, n_max 6, synthetic 4.22, cached shared prefix, drafts: $name"
        $py benchmarks/parallel_load.py "${common[@]}" --slots 8 --n-max 6 --runs "$runs" --synthetic 4.22 \
            --shared-prefix 200 --cache-prompt \
            --env "$env" --json "$OUT/abort-$name.json" --log-dir "$W/plogs-$name" 2>&1 | tail -n 8
    done
    ;;
matrix)
    # issue 12's table: SLOTS (default "8 32") x draft lengths 4, 6, 9, RUNS (default 3) runs each with
    # synthetic acceptance at the published profile, then one run each with real acceptance (every
    # request's greedy output against the plain server's)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    common=(--target "$T" --draft "$D" --server "$BIN" --gpu --prompt-tokens 420-500 --n-predict 64-256)
    for slots in ${SLOTS:-8 32}; do
        echo "== $slots slots, n_max 4,6,9, synthetic 4.22, ${RUNS:-3} runs"
        $py benchmarks/parallel_load.py "${common[@]}" --slots "$slots" --n-max 4,6,9 --runs "${RUNS:-3}" \
            --synthetic 4.22 --json "$OUT/matrix-$slots.json" --log-dir "$W/plogs-m$slots" 2>&1 | tail -n 12
        echo "== $slots slots, n_max 4,6,9, real acceptance: greedy output vs the plain server"
        $py benchmarks/parallel_load.py "${common[@]}" --slots "$slots" --n-max 4,6,9 --runs 1 \
            --json "$OUT/lossless-$slots.json" --log-dir "$W/plogs-real$slots" 2>&1 | tail -n 8
    done
    ;;
arms)
    # issue 13: the series' run-time switches against the default, one request, side by side in one
    # run (ENV_VARIANTS: semicolon-separated NAME=VALUE[,NAME=VALUE] sets)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3 \
        --lengths ${LENGTHS:-4,5,6} --concurrency "" \
        --env-variants "${ENV_VARIANTS:-GGML_CUDA_SMALL_SHAPES=0;GGML_CUDA_SMALL_N_CUBLAS=8;GGML_CUDA_MMV_FEW=2;LLAMA_SAMPLER_NO_FAST_GREEDY=1}" \
        --json "$OUT/arms.json" --log-dir "$W/arms" 2>&1 | tee "$OUT/arms.txt" | tail -n 24
    ;;
load)
    # one request and 8 / 32 at once, plain against the drafted lengths, under the environment
    # this script runs with (export the chosen switches first)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3 \
        --lengths ${LENGTHS:-4,5,6} --concurrency 8,32 --block ${BLOCK:-9} \
        --json "$OUT/load.json" --log-dir "$W/load" 2>&1 | tee "$OUT/load.txt" | tail -n 16
    ;;
schedule)
    # patch 0021 (--spec-draft-n-max-by-slots): one draft length for every load against a length cut
    # as the load grows; plain, n_max LONG (7) and SHORT (5) at 1, 8 and 32 requests at once, then
    # LONG cut by SCHEDULE (1:5,8:4: to 5 above 1 generating slot, to 4 above 8) in every arm
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    sp=(--gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3 --concurrency 8,32
        --load-trials "${LOAD_TRIALS:-1}")
    echo "== n_max ${LONG:-7} and ${SHORT:-5} at every load"
    $py benchmarks/dspark_speed.py "${sp[@]}" --lengths "${LONG:-7},${SHORT:-5}" --load-lengths "${LONG:-7},${SHORT:-5}" \
        --json "$OUT/schedule-fixed.json" --log-dir "$W/sched-fixed" 2>&1 | tail -n 14
    echo "== n_max ${LONG:-7} cut by --spec-draft-n-max-by-slots ${SCHEDULE:-1:5,8:4}"
    $py benchmarks/dspark_speed.py "${sp[@]}" --lengths "${LONG:-7}" --load-lengths "${LONG:-7}" \
        --engine-arg=--spec-draft-n-max-by-slots --engine-arg="${SCHEDULE:-1:5,8:4}" \
        --json "$OUT/schedule-cut.json" --log-dir "$W/sched-cut" 2>&1 | tail -n 12
    ;;
speed)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    sp=(--gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3)
    echo "== patched engine"
    $py benchmarks/dspark_speed.py "${sp[@]}" --lengths ${LENGTHS:-4,5,6,9} --concurrency 8,32 \
        --json "$OUT/speed.json" --log-dir "$W/slogs" 2>&1 | tee "$OUT/speed.txt" | tail -n 16
    echo "== patched engine, target backend sampling (-bs) in every arm"
    $py benchmarks/dspark_speed.py "${sp[@]}" --engine-arg=-bs --lengths 5 --concurrency 8,32 \
        --json "$OUT/speed-bs.json" --log-dir "$W/slogs-bs" 2>&1 | tail -n 10
    echo "== drafts sampled as pinned (LLAMA_DSPARK_SAMPLED=1), and GGML_CUDA_GRAPH_OPT=1"
    LLAMA_DSPARK_SAMPLED=1 $py benchmarks/dspark_speed.py "${sp[@]}" --lengths 5 --concurrency "" \
        --json "$OUT/speed-sampled.json" --log-dir "$W/slogs-s" 2>&1 | tail -n 4
    GGML_CUDA_GRAPH_OPT=1 $py benchmarks/dspark_speed.py "${sp[@]}" --lengths 5 --concurrency "" \
        --json "$OUT/speed-graphopt.json" --log-dir "$W/slogs-g" 2>&1 | tail -n 4
    ;;
profile)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    rm -rf "$W/prof"  # logs of an earlier call would be read as this one's (it happened once)
    if ! LLAMA_SPEC_PROFILE=1 $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" \
        --n-predict 1024 --trials 1 --lengths 5 --concurrency "" \
        --json "$OUT/profile.json" --log-dir "$W/prof" > "$OUT/profile-run.txt" 2>&1; then
        echo "profile: the measurement failed:"; tail -n 3 "$OUT/profile-run.txt"
    fi
    for f in "$W"/prof/*.log; do echo "$(basename "$f"): $(grep "spec profile" "$f" | tail -n 1)"; done | tee "$OUT/profile.txt"
    ;;
small-shapes)
    # patch 0008 (on by default; GGML_CUDA_SMALL_SHAPES=0 turns it off): speed with and without in one run, and greedy output
    # with the patch's argmax doing the target's sampling on the device (-bs) against a plain server
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    sp=(--gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3 --lengths 5 --concurrency "")
    $py benchmarks/dspark_speed.py "${sp[@]}" --json "$OUT/ss-on.json" --log-dir "$W/ss-on" 2>&1 | tail -n 3
    GGML_CUDA_SMALL_SHAPES=0 $py benchmarks/dspark_speed.py "${sp[@]}" --json "$OUT/ss-off0.json" --log-dir "$W/ss-off0" 2>&1 | tail -n 3
    $py benchmarks/parallel_load.py --target "$T" --draft "$D" --server "$BIN" --gpu --prompt-tokens 420-500 \
        --n-predict 64-256 --slots 8 --n-max 5 --runs 1 --extra=-bs \
        --json "$OUT/ss-lossless.json" --log-dir "$W/ss-real" 2>&1 | tail -n 5
    ;;
cap)
    # patch 0011 (--spec-draft-max-slots CAP): aggregate throughput at 8, 16 and 32 requests with the
    # cap against plain (every arm gets the flag; the plain server ignores it), the same without the
    # cap, and greedy output with the cap at 32 slots against the plain server's
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    sp=(--gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 --trials 3 --lengths ${LENGTHS:-4} --concurrency 8,16,32)
    echo "== with --spec-draft-max-slots ${CAP:-8}"
    $py benchmarks/dspark_speed.py "${sp[@]}" --engine-arg=--spec-draft-max-slots --engine-arg=${CAP:-8} \
        --json "$OUT/cap.json" --log-dir "$W/cap" 2>&1 | tail -n 6
    echo "== 32 slots with the cap, real acceptance: greedy output vs the plain server"
    $py benchmarks/parallel_load.py --target "$T" --draft "$D" --server "$BIN" --gpu --prompt-tokens 420-500 \
        --n-predict 64-256 --slots 32 --n-max ${LENGTHS:-4} --runs 1 --extra="--spec-draft-max-slots ${CAP:-8}" \
        --json "$OUT/cap-lossless.json" --log-dir "$W/cap-real" 2>&1 | tail -n 4
    echo "== without the cap"
    $py benchmarks/dspark_speed.py "${sp[@]}" --json "$OUT/nocap.json" --log-dir "$W/nocap" 2>&1 | tail -n 6
    ;;
crash)
    # issue 13, engine 0001-0019: the intermittent "illegal memory access" in the drafter's CUDA graph with 8
    # slots (benchmarks/crash_hunt.py): RUNS (12) fresh servers under the families benchmark's load at
    # draft length LENGTHS (5); if any died, as many again with CUDA graphs off and blocking launches,
    # so that the failing kernel's own launch reports it
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    hunt=(-m "$T" -md "$D" --server "$BIN" --gpu --runs "${RUNS:-12}" --n-max "${LENGTHS:-5}")
    if ! $py benchmarks/crash_hunt.py "${hunt[@]}" --log-dir "$W/hunt" > "$OUT/crash.txt" 2>&1; then
        tail -n 40 "$OUT/crash.txt"
        echo "== again with GGML_CUDA_DISABLE_GRAPHS=1 CUDA_LAUNCH_BLOCKING=1"
        $py benchmarks/crash_hunt.py "${hunt[@]}" --locate --log-dir "$W/hunt-locate" > "$OUT/crash-locate.txt" 2>&1
        tail -n 40 "$OUT/crash-locate.txt"
    else
        tail -n 3 "$OUT/crash.txt"
    fi
    ;;
few-check)
    # patch 0012 (GGML_CUDA_MMV_FEW=R, the verify's mat-vec kernel for 2-8 columns, R rows a warp):
    # its results against the CPU backend and its speed against the default selection
    kernel_check GGML_CUDA_MMV_FEW "1 2 4" "type_a=(f16|bf16),type_b=f32,m=4096,n=[1-8],k=14336"
    ;;
splitk-check)
    # patch 0013 (GGML_CUDA_MMF_SPLIT_K=S, mul_mat_f cut along the shared dimension): results against
    # the CPU backend, and the speed at the verify's own shapes (patch 0014's perf cases)
    kernel_check GGML_CUDA_MMF_SPLIT_K "8" "type_a=f16,type_b=f32,m=(512|2048|6144|128000),n=([1-9]|10),k=(2048|6144)," "2 4 8"
    ;;
rows-check)
    # patch 0017 (GGML_CUDA_MMV_ROWS, one column of many short rows: the DSpark Markov head's bias):
    # its results against the CPU backend (plain and with the fused add), and its speed at the head's
    # own shape (128000 rows of 256) on and off
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    B=$(dirname "$(dirname "$BIN")")
    t0=$SECONDS
    if ! { cmake -DLLAMA_BUILD_TESTS=ON "$B" > "$W/tbo.log" 2>&1 && cmake --build "$B" --target test-backend-ops -j "$(nproc)" >> "$W/tbo.log" 2>&1; }; then
        echo "test-backend-ops did not build"; tail -n 15 "$W/tbo.log"
    else
        echo "test-backend-ops built in $((SECONDS - t0)) s"
        for v in 1 0; do
            for op in MUL_MAT MUL_MAT_VEC_FUSION; do
                filt=(); if [ $op = MUL_MAT ]; then filt=(-p "k=(256|96),"); fi
                GGML_CUDA_MMV_ROWS=$v timeout 120 "$B/bin/test-backend-ops" test -o $op -b CUDA0 "${filt[@]}" > "$OUT/tbo-rows$v-$op.txt" 2>&1
                echo "test-backend-ops $op GGML_CUDA_MMV_ROWS=$v: rc=$?"; grep -E "FAIL|tests passed|backends passed" "$OUT/tbo-rows$v-$op.txt" | tail -n 4
            done
            GGML_CUDA_MMV_ROWS=$v timeout 60 "$B/bin/test-backend-ops" perf -o MUL_MAT -b CUDA0 -p "m=128000,n=1,k=256" 2>&1 | grep -E "MUL_MAT" | sed "s/^/rows=$v /"
            GGML_CUDA_MMV_ROWS=$v timeout 60 "$B/bin/test-backend-ops" perf -o MUL_MAT_VEC_FUSION -b CUDA0 -p "n=128000" 2>&1 | grep -E "MUL_MAT" | sed "s/^/rows=$v /"
        done
    fi
    ;;
splitk)
    # patch 0013 in the server: the speed arms (S = 2, 4, 8 against the default) and the step profile
    ENV_VARIANTS=${ENV_VARIANTS:-GGML_CUDA_MMF_SPLIT_K=2;GGML_CUDA_MMF_SPLIT_K=4;GGML_CUDA_MMF_SPLIT_K=8} LENGTHS=${LENGTHS:-5} STAGES=arms bash "$0"
    GGML_CUDA_MMF_SPLIT_K=${SPLIT_K:-4} OUT=$OUT/splitk-profile STAGES=profile bash "$0"
    ;;
mmf-few-check)
    # patch 0022 (GGML_CUDA_MMF_FEW=V: 2-16 columns on tensor cores, weights streamed like a mat-vec):
    # results against the CPU backend for every variant, and the speed at the verify's own shapes
    # (patch 0014's perf cases) against the default selection (mul_mat_f with split-K)
    kernel_check GGML_CUDA_MMF_FEW "${FEW_VARIANTS:-2 4}" "type_a=f16,type_b=f32,m=(512|2048|6144|128000),n=([1-9]|10),k=(2048|6144)," "${FEW_VARIANTS:-2 4}"
    ;;
mmf-few)
    # patch 0022 in the server: one request at draft lengths LENGTHS with each variant against the
    # default (the plain arm does not use it: one column); under load see the load stage with
    # GGML_CUDA_MMF_FEW exported (plain at 8 and 32 slots uses it too)
    ENV_VARIANTS=${ENV_VARIANTS:-GGML_CUDA_MMF_FEW=2;GGML_CUDA_MMF_FEW=4;GGML_CUDA_MMF_FEW=2,GGML_CUDA_MMF_FEW_MIN_ROWS=4096;GGML_CUDA_MMF_FEW=4,GGML_CUDA_MMF_FEW_MIN_ROWS=4096} LENGTHS=${LENGTHS:-5,7} STAGES=arms bash "$0"
    ;;
final)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" --n-predict 256 \
        --trials "${TRIALS:-5}" --lengths "${LENGTHS:-5,7}" --load-lengths "${LOAD_LENGTHS:-7,5}" --concurrency 8,32 \
        --load-trials "${LOAD_TRIALS:-3}" --json "$OUT/final.json" --log-dir "$W/final" 2>&1 | tee "$OUT/final.txt" | tail -n 14
    ;;
argmax)
    # patch 0023: on (the default) and off, each a run of its own with its own plain arm
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    for v in 1 0; do
        echo "== LLAMA_OUTPUT_ARGMAX=$v"
        LLAMA_OUTPUT_ARGMAX=$v $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" \
            --n-predict 256 --trials 3 --lengths "${LENGTHS:-7}" --load-lengths "${LENGTHS:-7}" --concurrency 8,32 \
            --json "$OUT/argmax-$v.json" --log-dir "$W/argmax-$v" 2>&1 | tee "$OUT/argmax-$v.txt" | tail -n 9
    done
    ;;
profile-load)
    # where a step goes under load: the step profile (patch 0004) and each context's decode profile
    # (patch 0015) of servers that served CONC requests at once, plain and n_max LENGTHS
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    rm -rf "$W/profload"
    if ! LLAMA_SPEC_PROFILE=1 $py benchmarks/dspark_speed.py --gpu --target "$T" --draft "$D" --server "$BIN" \
        --n-predict 512 --trials 1 --lengths "${LENGTHS:-7}" --load-lengths "${LENGTHS:-7}" --concurrency "${CONC:-8}" \
        --json "$OUT/profile-load.json" --log-dir "$W/profload" > "$OUT/profile-load-run.txt" 2>&1; then
        echo "profile-load: the measurement failed:"; tail -n 3 "$OUT/profile-load-run.txt"
    fi
    for f in "$W"/profload/*np*.log; do
        echo "$(basename "$f"): $(grep "spec profile" "$f" | tail -n 1)"
        grep "decode profile" "$f" | awk '{k=$4; last[k]=$0} END {for (k in last) print "  " last[k]}'
    done | tee "$OUT/profile-load.txt"
    ;;
few)
    # patch 0012 in the server: the speed arms (R = 1, 2, 4 against the default) and the step profile
    ENV_VARIANTS=${ENV_VARIANTS:-GGML_CUDA_MMV_FEW=1;GGML_CUDA_MMV_FEW=2;GGML_CUDA_MMV_FEW=4} LENGTHS=${LENGTHS:-4,5,6} STAGES=arms bash "$0"
    GGML_CUDA_MMV_FEW=${FEW_R:-2} OUT=$OUT/few-profile STAGES=profile bash "$0"
    ;;
graphs)
    # does the verify run as a CUDA graph? one drafted request (n_max 5, 256 tokens) with the step
    # profile, CUDA graphs on (default) and off (GGML_CUDA_DISABLE_GRAPHS=1): if the verify's device
    # wait does not move, its steps already run kernel by kernel
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    rates=$($py -c "from ggufdspark.acceptance import geometric_rates as g; print(','.join(f'{x:.4f}' for x in g(4.22, 9)[:5]))")
    for arm in "default:" "nographs:GGML_CUDA_DISABLE_GRAPHS=1"; do
        name=${arm%%:*}; envs=${arm#*:}
        env LLAMA_SPEC_PROFILE=1 $envs "$BIN" -m "$T" -md "$D" --spec-type draft-dspark --spec-draft-n-max 5 \
            --spec-synth-rates "$rates" -ngl 99 -ngld 99 -fa on -c 4096 --host 127.0.0.1 --port 18778 \
            > "$OUT/graphs-$name.log" 2>&1 &
        srv=$!
        for _ in $(seq 240); do curl -sf 127.0.0.1:18778/health > /dev/null && break; sleep 0.5; done
        for _ in 1 2; do
            curl -s 127.0.0.1:18778/completion -d '{"prompt":"Describe speculative decoding in detail.","n_predict":256,"ignore_eos":true,"temperature":0}' \
                | $py -c "import json,sys; t=json.load(sys.stdin)['timings']; print('$name', round(t['predicted_per_second'],1), 'tok/s', t.get('draft_n'), t.get('draft_n_accepted'))"
        done
        kill "$srv"; wait "$srv"
        echo "$name: $(grep 'spec profile' "$OUT/graphs-$name.log" | tail -n 1)"
    done
    ;;
kernels)
    # Nsight Compute's per-kernel device time over a window of one draft-dspark server's decode
    # steps (CUDA graphs off so every kernel is its own launch); the CSV lists kernels in launch
    # order, so a step reads as: draft block, target verify, draft injection.
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    rates=$($py -c "from ggufdspark.acceptance import geometric_rates as g; print(','.join(f'{x:.4f}' for x in g(4.22, 9)[:5]))")
    port=18777
    GGML_CUDA_DISABLE_GRAPHS=1 ncu --clock-control none --launch-skip ${NCU_SKIP:-6000} --launch-count ${NCU_COUNT:-2500} \
        --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu.csv" \
        "$BIN" -m "$T" -md "$D" --spec-type draft-dspark --spec-draft-n-max 5 --spec-synth-rates "$rates" \
        -ngl 99 -ngld 99 -fa on -c 4096 --host 127.0.0.1 --port $port > "$W/ncu-server.log" 2>&1 &
    srv=$!
    timeout 420 $py - $port <<'PY'
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(480):  # the engine loads under the profiler: wait for health
    try:
        urllib.request.urlopen(url + "/health", timeout=2).read(); break
    except OSError:
        time.sleep(0.5)
body = json.dumps({"prompt": "Describe speculative decoding in detail.", "n_predict": 256,
                   "ignore_eos": True, "temperature": 0}).encode()
for _ in range(3):
    t = json.load(urllib.request.urlopen(urllib.request.Request(url + "/completion", body), timeout=900))["timings"]
    print("request", t["predicted_n"], "drafted", t.get("draft_n"), "accepted", t.get("draft_n_accepted"))
PY
    # stop the engine itself (ncu's child), so that ncu writes its results as the application exits
    for child in $(pgrep -P $srv); do kill "$child"; done
    wait $srv
    $py - "$OUT/ncu.csv" <<'PY'
import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("ncu profiled no kernel (see the CSV)")
head = rows[0]; rows = rows[1:]
ki, vi, ui = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6}
tot = collections.Counter(); cnt = collections.Counter()
for r in rows:
    v = float(r[vi].replace(",", "")) * scale.get(r[ui], 1.0); tot[r[ki][:70]] += v; cnt[r[ki][:70]] += 1
all_ns = sum(tot.values())
print(f"{len(rows)} kernels, {all_ns / 1e6:.2f} ms device time")
for k, v in tot.most_common(25):
    print(f"{v / 1e3:10.1f} us {100 * v / all_ns:5.1f}% {cnt[k]:6d}x  {k}")
PY
    ;;
quant)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    if [ ! -x "$(dirname "$BIN")/llama-quantize" ]; then
        t0=$SECONDS
        $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --with-tools --no-ui > "$OUT/build-tools.log" 2>&1
        echo "llama-quantize build rc=$? in $((SECONDS - t0)) s"; tail -n 2 "$OUT/build-tools.log"
    fi
    qt=${QUANT_TARGETS:-F16 Q8_0 Q4_K_M}
    # shellcheck disable=SC2086  # one --targets value per type
    $py benchmarks/quant_speed.py --gpu -m "$T" -md "$D" --server "$BIN" --dir "$W/quant" --targets $qt \
        --drafts F16 Q8_0 --concurrency 1,8 --n-predict 256 --trials 3 \
        --json "$OUT/quant-${qt// /-}.json" 2>&1 | tee "$OUT/quant-${qt// /-}.txt" | tail -n 14
    mkdir -p "$OUT/quant-logs" && cp "$W"/quant/logs/*.log "$OUT/quant-logs/" 2>/dev/null
    rm -rf "$W/quant"  # about 6 GB: the 8B-A1B family needs the disk
    ;;
families)
    BIN=$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)
    fams=${FAMILIES:-1.2b 2.6b vl-3b}
    pair=()
    if [ -f "$D" ]; then pair=(--pair "vl-3b=$T,$D"); fi  # the setup pair is the vl-3b family's full shape
    $py benchmarks/family_speed.py --gpu --server "$BIN" --dir "$W/fam" --families "${fams// /,}" ${pair[@]+"${pair[@]}"} \
        --lengths "${LENGTHS:-4,5,6}" --n-predict 256 --trials 3 \
        --json "$OUT/families-${fams// /-}.json" 2>&1 | tee "$OUT/families-${fams// /-}.txt" | tail -n 10
    ;;
esac
done
