#!/usr/bin/env bash
# The GPU measurements (one H200 or H100, no network), one stage a question, each a benchmark script's
# subcommand run with the device's settings. The full-size generated pair (LFM2.5-VL-3B-shaped target +
# drafter of the published layout, F16) unless TARGET / DRAFT say otherwise; every llama-server as
# `ggufdspark serve` starts it (the scripts through benchmarks/harness.py; `verbose` from `serve --dry-run`).
# The machine has no network: `bash benchmarks/h200.sh carry` here first, and carry .carry in each call.
#
# Here, before a session:  carry (.carry/llama.cpp.tar.xz: the pinned tree, less models/ docs/ media/
#   benches/ .github/); train-unpack (a `train` call's files, PAIR_FILES, put together as a pair in PAIR_DEST);
#   pack-local (the CUDA engine built on this machine, DEV=1 for the developer series, at the device's paths and
#   PORTABLE, with test-backend-ops, packed into .carry/engine for `unpack`: a cold call then skips its ~5 min
#   build; needs nvcc 13 and cuBLAS here: CUDACXX, CUDAToolkit_ROOT, and libcuda.so.1 in its lib64/stubs where no
#   driver is: scripts/cuda_toolkit_pypi.sh makes both from PyPI; the device's repo root must be this one's). The pack is ~44 MB: with the checkout's ~39 MB it passes
#   the device's 64 MiB, so such a call moves ggufdspark/data/trained and benchmarks/results out of the checkout
#   while it runs (no stage but trained reads them).
# On the device (OUT: results, WORK: .devwork, kept on a warm machine; PYTHON; SERVER: another llama-server;
# GPU: --gpu, empty on CPU; DEV=1: the developer build; TAG: a run's name, default a):
#   setup     build the patched CUDA engine (with llama-bench, llama-quantize) and generate the pair. ~5 min
#   unpack    an engine an earlier call packed (trained PACK=1) or pack-local packed, from ENGINE_PACK, into the
#             engine cache (kept where it is already there); one whose llama-server does not start here is removed,
#             so that setup builds it (a packed engine finds cuBLAS through LD_LIBRARY_PATH: nvcc's toolkit)
#   vl        the pair with its vision tower (sets M, the mmproj: LOAD_ARGS="--mmproj \$M --image-share 0.33")
#   w2q8      the F16 draft with markov_w2 alone in Q8_0 (developer 0082), beside it as *-w2q8.gguf, for SPEED_DRAFTS
#   quant     the target quantized to QUANT (Q4_K_M), the draft to DQUANT where set (Q8_0); the stages after it serve
#             them (a failed quantization ends the call)
#   speed     speed.py decode: plain against LENGTHS (5,7), TRIALS (5); SPEED_ENVS (engine environments,
#             ';'-separated), SPEED_VARIANTS (llama-server flag sets), SPEED_DRAFTS (other draft files of the
#             target, ','-separated, each at every length), INTERLEAVE=1, CROSS=1; profiled
#             arms' lines in speed-profile.txt, GGML_CUDA_GRAPH_DEBUG arms' in graphdebug-ARM.txt
#   slots     slots.py mixed: SLOTS (32) x ARMS (plain,draft) x ENVS ('-': as it is) x RUNS (3), PROMPTS
#             (200-2000) tokens, N_MAX (0: serve's); mixed-TAG.json; at most LIMIT s (420)
#   sanitize  the slots load once under compute-sanitizer, ARMS (plain); sanitize.json
#   load      `ggufdspark bench --load`: CLIENTS (1,2,4,8,16,32,64), REQUESTS_PER_CLIENT (3), ANSWERS
#             (256; "256 1024": a run each), TEMPERATURE, ROUNDS, LOAD_ARGS; load-ANSWER.json
#   tune      `ggufdspark tune --load`: TUNE_LENGTHS (0,3,5,7), CLIENTS, REQUESTS_PER_CLIENT (2); tune-TAG.json
#   table     serving.py table over OUT/tune-*.json, then bench --load with that table; load-table.json
#   arms      serving.py arms: LOAD_ARMS ("NAME=N_MAX [CUT] [KEY=VALUE ...];..."), CLIENTS, ANSWERS,
#             ROUNDS, TEMPERATURE, NOISE_FLOOR=1, CONVERSATIONS=1, PROMPT_SCALE; arms-TAG.json, arms-TAG-profile.txt;
#             an arm with LLAMA_SPEC_PROFILE_SLOW=MS: its steps by kind (stall.py steps), steps-TAG-LOG.json
#   stall     stall.py join: STREAMS (3) generating, a JOIN-token (2000) prompt joins, ROUNDS (6), PROFILE=1 (patch
#             0072's join-step phases), STALL_ENVS (';'-separated: a drafted arm under each); stall-TAG.json
#   firstwait stall.py first: one request at a time, FIRST_PROMPT (800; LO-HI) tokens, FIRST_ANSWER (64), FIRST_CTX (a slot's), ROUNDS (8), SLOTS (1),
#             PROFILE=1 (the first generating step's phases), STALL_ENVS; firstwait-TAG.json
#   prefill   speed.py prefill: PREFILL_TOKENS (4096), 8 at once, PREFILL_ARMS; prefill-TAG.json
#   sampling  costs.py sampling: N_MAX (7), TRIALS (3), GRAPH_TOPK; sampling.json
#   layout    costs.py layout: LAYOUT_SLOTS (16), LAYOUT_REQUESTS (4); layout-TAG.json
#   first     serving.py first: RUNS (3) fresh servers an arm, FIRST_ARMS (warm,cold,plain); first.json
#   lossless  the suite's lossless tests against this build (LOSSLESS_TESTS: other pytest arguments)
#   verbose   one drafted server as serve runs it, with -v in ENVS's one environment, one greedy request
#             of VERBOSE_TOKENS (256); the log lines matching VERBOSE_GREP counted; verbose.log
#   bench     llama-bench on the target: tg128 and prompt processing at PP (1,2,4,8,10,512)
#   kernels   test-backend-ops MUL_MAT against the CPU, then perf at the verify's shapes for KERNEL_TYPES (f16;
#             e.g. q4_K,q6_K,q8_0: perf only) in each of ENVS (';'-separated NAME=VALUE); kernels-TAG.txt
#   ncu       Nsight Compute over test-backend-ops perf, one MUL_MAT case a run (NCU_CASES: TYPE:ROWS:K:COLUMNS, space-separated, e.g.
#             q4_K:6144:2048:8), NCU_KERNELS (mul_mat), in each of ENVS: duration, occupancy, throughput, stalls; ncu-TAG.txt, the CSVs in ncu-TAG/
#   markov    test-backend-ops DSPARK_MARKOV (patch 0065) against the CPU, then its perf cases, in each of MARKOV_ENVS
#             (';'-separated: '-;GGML_CUDA_DSPARK_MARKOV_ALTERNATE=0' times 0081 against 0065's upward scan)
#   topk      cuda/topk_cuda.cu built against the engine's tree: checks, then times; topk.json
#   mma       patches 0071, 0079 and developer 0080 (MMVQ's Q4_K / Q5_K / Q6_K / Q8_0 tensor-core kernels, staged or not): cuda/mmvq_mma_emu.cpp
#             (their host emulation) against the engine's ggml, then on a CUDA build test-backend-ops MUL_MAT in each of
#             MMA_TEST_ENVS ('-;GGML_CUDA_MMVQ_MMA=1;GGML_CUDA_MMVQ_MMA=1,GGML_CUDA_MMVQ_MMA_STAGED=0': the shape rule, every
#             shape staged where it can be, every shape on 0071's kernels), and perf in each of MMA_ENVS
#             ('GGML_CUDA_MMVQ_MMA=0;GGML_CUDA_MMVQ_MMA=1;GGML_CUDA_MMVQ_MMA=4': MMVQ, every kernel, 4 warps);
#             MMA_PARTS: only these of emu test perf (default all); MMA_PERF_TYPES (q4_K,q5_K,q6_K,q8_0) and MMA_PERF_N
#             (a regex of columns, e.g. '1|2|8') narrow perf
#             developer 0087's wide Q4_K / Q5_K kernel (9-64 columns) is measured the same way, with GGML_CUDA_MMVQ_MMA_WIDE=64 in them
#   timeline  cuda/cupti_trace.cpp traces the TIMELINE parts ("prefill decode"; decode8: 8 requests at once), read by cuda/probes.py
#             timeline (TIMELINE_API=1: runtime calls too; CUPTI: where CUPTI is; TIMELINE_KERNELS (25): the kernels shown a
#             stream, each with its launches by duration); timeline-PART.json
#   trained   the shipped trained pair: trained.py acceptance at LEVELS (1,8,32,64) and around a pause,
#             with PAUSE_ARMS' switches; PACK=1 packs the engine into OUT/engine for a later unpack
#   train     the trained pair's `train` step (WORK/tw/corpus carried), its files back in OUT
# PORTABLE=1: the engine built with GGML_NATIVE=OFF (AVX2, no AVX-512: what pack-local builds, to run on any x86-64
#   host; its own cache key, so a call that unpacks one must say PORTABLE=1 too).
# PACK_OUT=1: each stage's files go into OUT/results.tar once it ends (the device tool returns at most 8 files).
# Stages: the arguments, else STAGES ("setup speed"). CPU run of a stage (tests/test_bench_load.py):
#   TARGET=tiny-lfm2-F16.gguf DRAFT=dspark-tiny-lfm2-F16.gguf SERVER=path/to/llama-server GPU= \
#     CLIENTS=1,2 ANSWERS=16 REQUESTS_PER_CLIENT=1 OUT=out benchmarks/h200.sh load
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
nvcc_path() { command -v nvcc || echo /usr/local/cuda/bin/nvcc; }
cuda_root() { dirname "$(dirname "$(readlink -f "$(nvcc_path)")")"; }  # the toolkit nvcc belongs to
# test-backend-ops in the engine's build tree $1 (configured with the tests, built once; its log in W)
tbo_build() { if [ ! -f "$1/CMakeCache.txt" ] && [ -x "$1/bin/test-backend-ops" ]; then return 0; fi  # a packed engine's
    cmake -DLLAMA_BUILD_TESTS=ON "$1" > "$W/tbo.log" 2>&1 && cmake --build "$1" --target test-backend-ops \
    -j "$(nproc)" >> "$W/tbo.log" 2>&1 || { echo "test-backend-ops did not build"; tail -n 15 "$W/tbo.log"; return 1; }; }
case "${1:-}" in
carry)  # the tree ggufdspark fetched and checks (as build-engine uses it), where the device has no network
    tree=$("$py" -c 'from ggufdspark import engine; print(engine.fetch_source())' 2>/dev/null) ||
        { echo "stage carry: $py cannot fetch the pinned tree through ggufdspark (PYTHON: an interpreter that has it)" >&2; exit 1; }
    [ -f "$tree/CMakeLists.txt" ] || { echo "stage carry: $tree: no CMakeLists.txt (not the pinned tree)" >&2; exit 1; }
    mkdir -p .carry && name=$(basename "$tree") && trap 'rm -f .carry/llama.cpp.tar.xz.tmp' EXIT
    tar -C "$(dirname "$tree")" --transform="s,^$name,llama.cpp," -cJf .carry/llama.cpp.tar.xz.tmp \
        --exclude="$name/"{models,docs,media,benches,.github,.git} "$name" || exit 1
    mv .carry/llama.cpp.tar.xz.tmp .carry/llama.cpp.tar.xz
    echo ".carry/llama.cpp.tar.xz: $(du -h .carry/llama.cpp.tar.xz | cut -f1) (the pinned tree from $tree)"; exit 0 ;;
pack-local)  # the engine built here for a device call: the device's paths (repo root, .devwork), its flags, PORTABLE
    W=$PWD/.devwork; mkdir -p "$W/src" .carry/engine
    [ -f "$W/src/llama.cpp/CMakeLists.txt" ] || tar -xJf .carry/llama.cpp.tar.xz -C "$W/src" ||
        { echo "stage pack-local: no pinned tree (.carry/llama.cpp.tar.xz: run the carry stage first)" >&2; exit 1; }
    export GGUFDSPARK_CACHE=$W/cache GGUFDSPARK_LLAMA_SRC=$W/src/llama.cpp
    # the link resolves cuBLAS and the driver (libcuda.so.1: the toolkit's stub where no driver is) through the loader path,
    # and build-engine's check of the built llama-server starts it with them
    tk=${CUDAToolkit_ROOT:-$(cuda_root)}
    export LD_LIBRARY_PATH=$tk/lib64:$tk/lib64/stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # with ccache on PATH (ggml's GGML_CCACHE takes it), paths hashed relative to .devwork: a series that changes
    # one file recompiles that file, not the ~40 min of a whole CUDA build on two cores
    export CCACHE_BASEDIR=$W
    args=(--cuda --cmake-flag=-DCMAKE_CUDA_ARCHITECTURES=90 --cmake-flag=-DGGML_NATIVE=OFF --no-ui ${DEV:+--dev})
    "$py" -m ggufdspark build-engine "${args[@]}" --with-tools || exit 1
    exe=$("$py" -m ggufdspark build-engine "${args[@]}" --print-path 2>/dev/null | tail -n1) && B=$(dirname "$(dirname "$exe")")
    key=$(basename "$(dirname "$B")")
    tbo_build "$B" >&2 || exit 1
    rm -f .carry/engine/"$key".tar.xz.*
    tar -C "$W/cache/engine" -cf - "$key/build.json" "$key/build/bin" "$key/src/ggml/include" \
        "$key/src/ggml/src/ggml-cuda/mmvq.cu" | xz -T0 -6 | split -b 15M - ".carry/engine/$key.tar.xz." || exit 1
    echo "packed $key: $(du -ch .carry/engine/"$key".tar.xz.* | tail -n1 | cut -f1) in .carry/engine" \
         "(carry .carry/engine with PORTABLE=1 ${DEV:+DEV=1 }and the unpack stage first)"; exit 0 ;;
train-unpack)  # configs, tokenizer and recipe from pair-small.tar.gz, the target's shards, the drafter
    src=${PAIR_FILES:?PAIR_FILES: the files a train call brought back} dest=${PAIR_DEST:?PAIR_DEST: where the pair goes}
    mkdir -p "$dest" && tar -C "$dest" -xzf "$src/pair-small.tar.gz" && cp "$src"/model*.safetensors "$dest/target/" &&
        cp "$src/drafter.safetensors" "$dest/drafter/model.safetensors" && ls -la "$dest"/*; exit ;;
esac
W=${WORK:-$PWD/.devwork} OUT=${OUT:-${WORK:-$PWD/.devwork}/out}
mkdir -p "$W" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GGUFDSPARK_CACHE=$W/cache
T=${TARGET:-$W/full/target-F16.gguf} D=${DRAFT:-$W/full/dspark-target-F16.gguf} TAG=${TAG:-a}
BUILD_ARGS=(--cuda --cmake-flag=-DCMAKE_CUDA_ARCHITECTURES=90 --no-ui)
[ -n "${PORTABLE:-}" ] && BUILD_ARGS+=(--cmake-flag=-DGGML_NATIVE=OFF)  # after the architecture: the key hashes the order
[ -n "${DEV:-}" ] && BUILD_ARGS+=(--dev)  # the developer build (product + ggufdspark/data/patches-dev)
if [ ! -f "$W/src/llama.cpp/CMakeLists.txt" ] && [ -f .carry/llama.cpp.tar.xz ]; then
    mkdir -p "$W/src" && tar -xJf .carry/llama.cpp.tar.xz -C "$W/src"
fi
export GGUFDSPARK_LLAMA_SRC=$W/src/llama.cpp
LIMIT=${LIMIT:-420} GPU=${GPU---gpu}
BIN() { echo "${SERVER:-$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)}"; }
build() { local t0=$SECONDS; $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --with-tools > "$OUT/build.log" 2>&1
    echo "build rc=$? in $((SECONDS - t0)) s"; tail -n 2 "$OUT/build.log"; }
gpu_name() { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"; }
# a benchmark script's run: NAME (OUT/NAME.json, the text in TXT (OUT)/NAME.txt, logs in W/NAME, this
# call's only), the lines of its output shown, then its command line
run() { local name=$1 lines=$2; shift 2; rm -rf "${W:?}/$name"
    "$@" --json "$OUT/$name.json" --log-dir "$W/$name" 2>&1 | tee "${TXT:-$OUT}/$name.txt" \
        | grep -av -E "^(bench|tune) --load: [0-9]+%" | tail -n "$lines"
    return "${PIPESTATUS[0]}"; }
# the pair, the engine and where it runs, as every benchmark script names them, in P
pair() { P=(-m "$T" -md "$D" --server "$(BIN)" ${GPU:+"$GPU"}); }
# the engine's profile lines (arms with LLAMA_SPEC_PROFILE=1) of every log in $1, each after its log's name, into $2
profile() { grep -a -H -E "${3:-decode window|decode profile|spec profile|server yield}" "$1"/*.log 2>/dev/null | sed "s|^$1/||" > "$2"
    [ -s "$2" ] || rm -f "$2"; }
# ';'-separated arm specs ($1) as --arm options, in ARMS_ARGS
arm_args() { ARMS_ARGS=(); local specs s; IFS=';' read -ra specs <<< "$1"
    for s in "${specs[@]}"; do [ -n "$s" ] && ARMS_ARGS+=(--arm "$s"); done; }
rates() { $py -c "from ggufdspark.measuring.acceptance import PROFILES; print(','.join(map(str, PROFILES['published'].rates)))"; }
# env_words SPEC: one environment as the stages take it ('A=1,B=2' sets both; '-' or empty: none) into ENV_WORDS, for env
env_words() { ENV_WORDS=(); if [ "${1:--}" != - ]; then read -ra ENV_WORDS <<< "${1//,/ }"; fi; }
# test-backend-ops perf of MUL_MAT at the verify's shapes: build dir $1, types $2 (f16 or q4_K,q8_0,...),
# $3 ';'-separated environments, each one NAME=VALUE (its value may hold commas), '-' as built
# verify_perf BUILD TYPES ENVS [N]: test-backend-ops perf of MUL_MAT at the verify's shapes, N a regex of columns
# (an environment's variables separated by commas: 'A=1,B=2' sets both, as ENVS and SPEED_ENVS take them)
verify_perf() { local e envs; IFS=';' read -ra envs <<< "$3"
    for e in "${envs[@]}"; do
        echo "== perf at the verify's shapes, types $2, env '${e:--}'"; env_words "$e"
        env "${ENV_WORDS[@]}" timeout 300 "$1/bin/test-backend-ops" perf -o MUL_MAT -b CUDA0 \
            -p "type_a=(${2//,/|}),type_b=f32,m=(512|2048|6144|128000),n=(${4:-[1-9]|10|16|32|64}),k=(2048|6144)," 2>&1 \
            | grep MUL_MAT | sed -E 's/MUL_MAT\(type_a=([A-Za-z0-9_]+),type_b=f32,(m=[0-9]+,n=[0-9]+,k=[0-9]+),.*: +[0-9]+ runs - +([0-9.]+ us\/run).*/\1 \2 \3/'
    done; }
mixed() { pair; P=(benchmarks/slots.py mixed "${P[@]}" --n-max "${N_MAX:-0}" --prompt-tokens "${PROMPTS:-200-2000}"
    --slots "${SLOTS:-32}" --envs="${ENVS:--}"); }

# PACK_OUT=1: after each stage its files in OUT go into OUT/results.tar (the device tool brings back at most 8
# files a call; a call cut off keeps what its finished stages packed)
pack_out() { [ -n "${PACK_OUT:-}" ] || return 0
    local files; mapfile -t files < <(cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name results.tar -printf '%P\n')
    [ ${#files[@]} -gt 0 ] && tar -C "$OUT" -rf "$OUT/results.tar" "${files[@]}" && (cd "$OUT" && rm -rf -- "${files[@]}"); }
stages=("$@"); [ $# -gt 0 ] || read -ra stages <<< "${STAGES:-setup speed}"
trap pack_out EXIT  # the last stage's files, also where a stage ends the call (exit)
for stage in "${stages[@]}"; do
pack_out  # the stage before's files (here, not after esac: a stage that gives up ends with continue)
case $stage in setup|unpack|vl|kernels|topk|mma|ncu|markov|trained|train) ;; *)
    if [ ! -f "$D" ]; then
        echo "stage $stage: no pair at $D: run the setup stage first (in this call, or one on the same warm machine)"
        continue
    fi ;;
esac
case $stage in
unpack)
    # cuBLAS and the CUDA runtime from nvcc's toolkit (a packed engine's run paths name the machine that built it)
    tk=$(cuda_root)
    export LD_LIBRARY_PATH=$tk/lib64:$tk/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    for first in "${ENGINE_PACK:-.carry/engine}"/*.tar.xz.aa; do
        [ -f "$first" ] || { echo "stage unpack: no *.tar.xz.aa under ${ENGINE_PACK:-.carry/engine}"; break; }
        key=$(basename "${first%.tar.xz.aa}") e=$W/cache/engine/$key
        if [ ! -f "$e/build.json" ]; then
            mkdir -p "$W/cache/engine" && cat "${first%.aa}".* | xz -d | tar -xf - -C "$W/cache/engine" || continue
        fi
        # an engine that cannot start here (a library not found, another CPU) is removed: setup then builds it
        out=$(timeout 60 "$e/build/bin/llama-server" --version 2>&1); rc=$?
        missing=$(ldd "$e/build/bin/libggml-cuda.so" 2>/dev/null | grep "not found")
        if [ $rc = 0 ] && [ -z "$missing" ]; then
            echo "unpacked $key: $(echo "$out" | grep -m1 -i "version")"
        else
            echo "stage unpack: $key's llama-server does not start here (exit status $rc), removed:"
            echo "$out" | tail -n 3; [ -z "$missing" ] || echo "$missing"; rm -rf "${e:?}"
        fi
    done ;;
vl)
    if [ ! -f "$W/vl/dspark-F16.gguf" ]; then
        ( set -e; $py -m ggufdspark generate "$W/vl" --size full --vl --force
          $py -m ggufdspark convert-target "$W/vl/target" -o "$W/vl/target-F16.gguf" --force
          $py -m ggufdspark convert "$W/vl/drafter" --target "$W/vl/target-F16.gguf" -o "$W/vl/dspark-F16.gguf" --force
        ) > "$W/vl.log" 2>&1 || { echo "stage vl failed"; tail -n 5 "$W/vl.log"; continue; }
    fi
    T=$W/vl/target-F16.gguf D=$W/vl/dspark-F16.gguf M=$W/vl/mmproj-target-F16.gguf; echo "vl pair: $T, $D, $M" ;;
quant)
    q=${QUANT:-Q4_K_M}; QT=${T%.gguf}-$q.gguf
    # a pair that cannot be quantized ends the call: the stages after it would measure another pair
    [ -f "$QT" ] || $py -m ggufdspark quantize "$T" -t "$q" -o "$QT" --server "$(BIN)" > "$W/quant-$q.log" 2>&1 ||
        { echo "stage quant: quantizing the target to $q failed"; tail -n 3 "$W/quant-$q.log"; exit 1; }
    T=$QT; echo "target now $T"
    if [ -n "${DQUANT:-}" ]; then  # the draft quantized too (its Markov head kept in float by quantize)
        QD=${D%.gguf}-$DQUANT.gguf
        [ -f "$QD" ] || $py -m ggufdspark quantize "$D" -t "$DQUANT" -o "$QD" --server "$(BIN)" > "$W/quant-d$DQUANT.log" 2>&1 ||
            { echo "stage quant: quantizing the draft to $DQUANT failed"; tail -n 3 "$W/quant-d$DQUANT.log"; exit 1; }
        D=$QD; echo "draft now $D"
    fi ;;
w2q8)
    # the draft with markov_w2 alone in Q8_0, every other tensor as it came (llama-quantize's first matching
    # override wins), beside the draft: ${D%.gguf}-w2q8.gguf (developer 0082 drafts its chain in one op;
    # `ggufdspark quantize` keeps both Markov matrices in float). The speed stage measures it with SPEED_DRAFTS=THAT
    QD=${D%.gguf}-w2q8.gguf
    [ -f "$QD" ] || "$(dirname "$(BIN)")/llama-quantize" --tensor-type '^markov_w2\.weight$=q8_0' --tensor-type '.*=f16' \
        "$D" "$QD" Q8_0 > "$W/quant-w2q8.log" 2>&1 ||
        { echo "stage w2q8: llama-quantize failed"; tail -n 3 "$W/quant-w2q8.log"; rm -f "$QD"; continue; }
    echo "draft with markov_w2 in Q8_0: $QD (the speed stage measures it with SPEED_DRAFTS=$QD)" ;;
setup)
    gpu_name
    if [ ! -f "$D" ]; then
        ( set -e; $py -m ggufdspark generate "$W/full" --size full --force
          $py -m ggufdspark convert-target "$W/full/target" -o "$T" --force
          $py -m ggufdspark convert "$W/full/drafter" --target "$T" -o "$D" --force ) > "$W/gen.log" 2>&1 &
        gen=$!
    fi
    build
    if [ -n "${gen:-}" ]; then wait "$gen"; echo "generate+convert rc=$?"; tail -n 3 "$W/gen.log"; fi ;;
speed)
    pair; run speed 8 $py benchmarks/speed.py decode "${P[@]}" --n-predict 256 --trials "${TRIALS:-5}" --lengths "${LENGTHS:-5,7}" \
        --concurrency "" ${SPEED_ENVS:+--env-variants "$SPEED_ENVS"} ${SPEED_VARIANTS:+--variants "$SPEED_VARIANTS"} \
        ${SPEED_DRAFTS:+--other-drafts "$SPEED_DRAFTS"} \
        ${INTERLEAVE:+--interleave} ${CROSS:+--cross-variants}
    profile "$W/speed" "$OUT/speed-profile.txt" "spec profile|decode profile|server yield"
    # developer 0056 (an arm with GGML_CUDA_GRAPH_DEBUG=N): its lines, and its last per-key counts printed
    for f in "$W/speed"/*.log; do
        g="$OUT/graphdebug-$(basename "$f" .log).txt"; grep -h "cuda graph debug" "$f" > "$g" 2>/dev/null || { rm -f "$g"; continue; }
        last=$(grep "computes: key" "$g" | tail -n 1 | sed 's/.*after \([0-9]*\) computes.*/\1/')
        echo "== $(basename "$g"): $(grep -c "changed: \|nodes -> " "$g") changes, $(grep -c "kept capture replays" "$g")" \
             "kept captures replayed (0059); per-key counts after ${last:-0} computes:"
        grep "after ${last:--} computes: key" "$g" | sed 's/.*computes: //'
    done ;;
slots)
    echo "== mixed traffic: slots ${SLOTS:-32}, arms ${ARMS:-plain,draft}, envs '${ENVS:--}', runs ${RUNS:-3}"
    mixed; TXT=$W run "mixed-$TAG" 200 timeout "$LIMIT" $py "${P[@]}" --arms "${ARMS:-plain,draft}" --runs "${RUNS:-3}"
    echo "slots rc=$?" ;;
sanitize)
    mixed; TXT=$W run sanitize 200 timeout "$LIMIT" $py "${P[@]}" --arms "${ARMS:-plain}" --runs 1 --sanitizer
    echo "sanitize rc=$?"; grep -h -m 40 "=========" "$W"/sanitize/s*.log | head -n 60 ;;
load)
    read -ra load_args <<< "${LOAD_ARGS:-}"
    for ans in ${ANSWERS:-256}; do
        args=(bench --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" --answer-tokens "$ans"
              --requests-per-client "${REQUESTS_PER_CLIENT:-3}" --synthetic-rates "$(rates)"
              ${TEMPERATURE:+--temperature "$TEMPERATURE"} ${ROUNDS:+--rounds "$ROUNDS"} "${load_args[@]}")
        echo "== ${args[*]}"
        run "load-$ans" 40 $py -m ggufdspark "${args[@]}" --force ||
            { echo "== bench --load failed (logs: $W/load-$ans)"; for f in "$W/load-$ans"/*.log; do echo "-- $f"; tail -n 8 "$f"; done; }
    done ;;
tune)
    $py -m ggufdspark tune --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" \
        --answer-tokens "${ANSWERS:-256}" --requests-per-client "${REQUESTS_PER_CLIENT:-2}" --acceptance published \
        --draft-lengths "${TUNE_LENGTHS:-0,3,5,7}" --no-save --json --log-dir "$W/tune-$TAG" \
        > "$OUT/tune-$TAG.json" 2> "$W/tune-$TAG.err"
    echo "tune rc=$?"; grep -v "^tune --load: [0-9]*%" "$W/tune-$TAG.err" | tail -n 5
    $py -c "import json,sys; from ggufdspark.measuring.tuneload import TuneLoadResult as R; d=json.load(open(sys.argv[1]));
print(R(d['recommendation'], {int(n): {int(k): v for k, v in r.items()} for n, r in d['ratios'].items()}, d['traffic']).text())" \
        "$OUT/tune-$TAG.json" ;;
table)
    read -r n cut < <($py benchmarks/serving.py table "$OUT"/tune-*.json --json "$OUT/table.json")
    echo "== table: draft length $n, --draft-n-max-by-slots $cut"
    if [ "${n:-0}" = 0 ]; then echo "no draft length pays at the lowest level: no table to serve"; continue; fi
    TXT=$W run load-table 30 $py -m ggufdspark bench --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" \
        --answer-tokens "${ANSWERS:-256}" --requests-per-client "${REQUESTS_PER_CLIENT:-2}" --synthetic-rates "$(rates)" \
        --draft-n-max "$n" --draft-n-max-by-slots "$cut" --force ;;
arms)
    arm_args "${LOAD_ARMS:?LOAD_ARMS: the arms to run}"
    run "arms-$TAG" 40 $py benchmarks/serving.py arms -m "$T" -md "$D" --server "$(BIN)" "${ARMS_ARGS[@]}" \
        --clients "${CLIENTS:-1,2,4,8,16,32,64}" --requests-per-client "${REQUESTS_PER_CLIENT:-3}" --answer-tokens "${ANSWERS:-256}" \
        ${ROUNDS:+--rounds "$ROUNDS"} ${TEMPERATURE:+--temperature "$TEMPERATURE"} ${NOISE_FLOOR:+--noise-floor} \
        ${CONVERSATIONS:+--conversations} ${PROMPT_SCALE:+--prompt-scale "$PROMPT_SCALE"}
    profile "$W/arms-$TAG" "$OUT/arms-$TAG-profile.txt"
    for f in "$W/arms-$TAG"/*.log; do  # arms with LLAMA_SPEC_PROFILE_SLOW=MS (patch 0072): their steps
        grep -q "spec slow step" "$f" 2>/dev/null || continue
        echo "== slow steps: $(basename "$f")"; $py benchmarks/stall.py steps "$f" --json "$OUT/steps-$TAG-$(basename "$f" .log).json"
    done ;;
stall)
    # a long prompt joining generating streams, plain against drafted (synthetic acceptance at the
    # published profile), the join steps' phases with PROFILE=1
    pair; run "stall-$TAG" 20 $py benchmarks/stall.py join "${P[@]}" --streams "${STREAMS:-3}" --join-tokens "${JOIN:-2000}" \
        --rounds "${ROUNDS:-6}" --synthetic-rates "$(rates)" ${PROFILE:+--profile} ${STALL_ENVS:+--drafted-envs "$STALL_ENVS"} ;;
firstwait)
    # the wait after a request's first token, alone on the server (bench --load's longest at one client)
    pair; run "firstwait-$TAG" 20 $py benchmarks/stall.py first "${P[@]}" --prompt-tokens "${FIRST_PROMPT:-800}" \
        --answer "${FIRST_ANSWER:-64}" --rounds "${ROUNDS:-8}" --slots "${SLOTS:-1}" --slot-ctx "${FIRST_CTX:-0}" --synthetic-rates "$(rates)" \
        ${PROFILE:+--profile} ${STALL_ENVS:+--drafted-envs "$STALL_ENVS"} ;;
layout)
    pair; run "layout-$TAG" 16 $py benchmarks/costs.py layout "${P[@]}" --slots "${LAYOUT_SLOTS:-16}" --requests "${LAYOUT_REQUESTS:-4}" ;;
prefill)
    arm_args "${PREFILL_ARMS:-}"; pair
    run "prefill-$TAG" $((8 + ${#ARMS_ARGS[@]} / 2)) $py benchmarks/speed.py prefill "${P[@]}" \
        --prompt-tokens "${PREFILL_TOKENS:-4096}" --concurrency 8 "${ARMS_ARGS[@]}"
    profile "$W/prefill-$TAG" "$OUT/prefill-$TAG-profile.txt" ;;
sampling)
    pair; run sampling 10 $py benchmarks/costs.py sampling "${P[@]}" --n-max "${N_MAX:-7}" --synthetic --trials "${TRIALS:-3}" \
        --n-predict 256 ${GRAPH_TOPK:+--graph-topk "$GRAPH_TOPK"} ;;
first)
    run first 6 $py benchmarks/serving.py first -m "$T" -md "$D" --server "$(BIN)" --runs "${RUNS:-3}" \
        --arms "${FIRST_ARMS:-warm,cold,plain}" ;;
timeline)
    nv=$(nvcc_path)
    # the toolkit nvcc runs from (nvcc may be a wrapper script): its TOP in a dry run
    tk=$("$nv" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
    C=""; for c in "${CUPTI:-}" .carry/cupti /usr/local/cuda/extras/CUPTI "$tk"; do [ -n "$c" ] && [ -f "$c/include/cupti.h" ] && C=$c && break; done
    if [ -z "$C" ]; then echo "stage timeline: no CUPTI (include/cupti.h) under CUPTI, .carry/cupti, /usr/local/cuda/extras/CUPTI or nvcc's toolkit ($tk)"; continue; fi
    CL=$(cd "$C" && pwd)/lib; [ -f "$CL/libcupti.so" ] || CL=$(cd "$C" && pwd)/lib64
    "$nv" -std=c++17 -shared -Xcompiler -fPIC -I "$C/include" benchmarks/cuda/cupti_trace.cpp -L "$CL" -lcupti \
        -Xlinker -rpath="$CL" -o "$W/libcupti_trace.so" || { echo "stage timeline: the tracer did not build"; continue; }
    rm -rf "$W/tl" && mkdir -p "$W/tl"; pair
    for part in ${TIMELINE:-prefill decode}; do
        case $part in
        prefill) cmd=(benchmarks/speed.py prefill --prompt-tokens "${PREFILL_TOKENS:-4096}" --concurrency 8) ;;
        decode) cmd=(benchmarks/speed.py decode --n-predict 256 --trials "${TRIALS:-3}" --lengths "${N_MAX:-7}" --concurrency "") ;;
        decode8) cmd=(benchmarks/speed.py decode --n-predict 256 --trials 1 --lengths "${N_MAX:-7}" --concurrency 8 --load-lengths "${N_MAX:-7}") ;;
        *) echo "stage timeline: TIMELINE part $part: expected prefill, decode or decode8"; continue ;;
        esac
        # every server the part starts is traced, one file a process (its command line names it)
        CUDA_INJECTION64_PATH="$W/libcupti_trace.so" GGUFDSPARK_CUPTI_API="${TIMELINE_API:-0}" \
            GGUFDSPARK_CUPTI_OUT="$W/tl/$part-%p.csv" TXT=$W run "timeline-$part-speed" 6 $py "${cmd[@]}" "${P[@]}"
        files=("$W"/tl/"$part"-*.csv)
        if [ ! -f "${files[0]}" ]; then echo "stage timeline: $part wrote no trace (no process initialised CUDA)"; continue; fi
        $py benchmarks/cuda/probes.py timeline "${files[@]}" --kernels "${TIMELINE_KERNELS:-25}" --json "$OUT/timeline-$part.json" \
            > "$OUT/timeline-$part.txt" 2>&1
        echo "timeline $part rc=$?"; head -c 9000 "$OUT/timeline-$part.txt"
    done ;;
topk)
    S=$(dirname "$(dirname "$(dirname "$(BIN)")")")/src  # the engine cache: KEY/build/bin/llama-server, KEY/src
    if [ ! -f "$S/ggml/src/ggml-cuda/top-k-rows.cuh" ]; then echo "stage topk: no top-k-rows.cuh under $S: an engine without patch 0051"; continue; fi
    "$(nvcc_path)" -O3 -std=c++17 -arch=sm_90 -I "$S/ggml/src/ggml-cuda" benchmarks/cuda/topk_cuda.cu -o "$W/topk_cuda" \
        && "$W/topk_cuda" --json "$OUT/topk.json" | tee "$OUT/topk.txt"
    echo "topk rc=${PIPESTATUS[0]}" ;;
mma)
    # patches 0071, 0079 and developer 0080 (MMVQ's Q4_K / Q5_K / Q6_K / Q8_0 tensor-core kernels, staged where 0079 stages them): their
    # host emulation against the engine's ggml, then on a CUDA build test-backend-ops MUL_MAT q4_K, q5_K, q6_K and q8_0
    # against the CPU in each of MMA_TEST_ENVS (default: the shape rule as it is; GGML_CUDA_MMVQ_MMA=1, every product of
    # 2-8 columns on the kernels, staged where it can be; and =1 with GGML_CUDA_MMVQ_MMA_STAGED=0, 0071's kernels
    # everywhere), and perf beside MMVQ in each of MMA_ENVS. MMA_PARTS picks the parts (default all: emu test perf), so
    # that a call measures what is new; MMA_PERF_TYPES and MMA_PERF_N (a regex of columns) narrow perf
    parts=" ${MMA_PARTS:-emu test perf} "
    for part in $parts; do case $part in emu|test|perf) ;; *)
        echo "stage mma: MMA_PARTS part '$part': expected emu, test or perf"; continue 2 ;; esac; done
    has() { [[ $parts == *" $1 "* ]]; }
    S=$(dirname "$(dirname "$(dirname "$(BIN)")")")/src L=$(dirname "$(BIN)")
    if [ ! -f "$S/ggml/include/ggml.h" ]; then echo "stage mma: no ggml.h under $S (the engine cache: KEY/src)"; continue; fi
    if has emu; then
        g++ -O2 -std=c++17 -I "$S/ggml/include" benchmarks/cuda/mmvq_mma_emu.cpp -L "$L" -lggml-base -lggml \
            -Wl,-rpath,"$L" -o "$W/mmvq_mma_emu" && "$W/mmvq_mma_emu" > "$OUT/mma-emu.txt"
        echo "mma emulation rc=$?"; tail -n 1 "$OUT/mma-emu.txt"
    fi
    if ! grep -q "GGML_CUDA_MMVQ_MMA" "$S/ggml/src/ggml-cuda/mmvq.cu" 2>/dev/null; then
        echo "stage mma: the engine has no patch 0071 (product-46 and later have it)"; continue; fi
    if ! compgen -G "$L/libggml-cuda.so*" > /dev/null; then
        echo "stage mma: $L has no libggml-cuda.so: not a CUDA build, so nothing to run on a GPU"; continue; fi
    B=$(dirname "$L"); tbo_build "$B" || continue
    if has test; then
        IFS=';' read -ra test_envs <<< "${MMA_TEST_ENVS:--;GGML_CUDA_MMVQ_MMA=1;GGML_CUDA_MMVQ_MMA=1,GGML_CUDA_MMVQ_MMA_STAGED=0}"
        for e in "${test_envs[@]}"; do
            env_words "$e"; tag=${e//[^A-Za-z0-9=]/_}
            env "${ENV_WORDS[@]}" timeout 300 "$B/bin/test-backend-ops" test -o MUL_MAT -b CUDA0 -p "type_a=(q4_K|q5_K|q6_K|q8_0)" \
                > "$W/mma-test-$tag.txt" 2>&1
            echo "MUL_MAT q4_K, q5_K, q6_K, q8_0 against the CPU with ${e/#-/the defaults}: rc=$?" | tee -a "$OUT/mma-tests.txt"
            grep -E "FAIL|tests passed" "$W/mma-test-$tag.txt" | tail -n 4 | tee -a "$OUT/mma-tests.txt"
        done
    fi
    if has perf; then
        verify_perf "$B" "${MMA_PERF_TYPES:-q4_K,q5_K,q6_K,q8_0}" "${MMA_ENVS:-GGML_CUDA_MMVQ_MMA=0;GGML_CUDA_MMVQ_MMA=1;GGML_CUDA_MMVQ_MMA=4}" \
            "${MMA_PERF_N:-}" | tee "$OUT/kernels-mma.txt"
    fi ;;
lossless)
    # shellcheck disable=SC2086  # pytest arguments
    GGUFDSPARK_SERVER="$(BIN)" $py -m pytest -q -p no:cacheprovider \
        ${LOSSLESS_TESTS:-tests/test_parallel_spec.py tests/test_sampling_exact.py tests/test_vision.py::test_image_requests_beside_text_ones_on_busy_slots_are_lossless} 2>&1 | tee "$OUT/lossless.txt" | tail -n 15
    echo "lossless rc=${PIPESTATUS[0]}" ;;
verbose)
    if [ -z "${VERBOSE_GREP:-}" ]; then echo "stage verbose: VERBOSE_GREP: the log lines to find (a grep -E pattern)"; continue; fi
    # the drafted server serve would start here, its command line from serve itself, with -v
    line=$($py -m ggufdspark serve -m "$T" -md "$D" --server "$(BIN)" --port "${PORT:-18099}" --no-ui --dry-run -- -v) ||
        { echo "stage verbose: serve --dry-run failed"; continue; }
    argv=(); eval "argv=($line)"; env_words "${ENVS:--}"
    env "${ENV_WORDS[@]}" "${argv[@]}" > "$W/verbose.log" 2>&1 &
    vpid=$!
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:${PORT:-18099}/health" > /dev/null && break
        kill -0 "$vpid" 2>/dev/null || break; sleep 0.5; done
    if ! kill -0 "$vpid" 2>/dev/null; then echo "stage verbose: the server ended (log $W/verbose.log)"; tail -n 5 "$W/verbose.log"; continue; fi
    curl -s "http://127.0.0.1:${PORT:-18099}/completion" -d '{"prompt": "Once upon a time", "n_predict": '"${VERBOSE_TOKENS:-256}"', "temperature": 0}' \
        | $py -c "import json,sys; t=json.load(sys.stdin)['timings']; print('draft_n', t.get('draft_n'), 'accepted', t.get('draft_n_accepted'))"
    kill "$vpid"; wait "$vpid" 2>/dev/null
    cp "$W/verbose.log" "$OUT/verbose.log"
    grep -aE "$VERBOSE_GREP" "$W/verbose.log" | sed -E 's/^[0-9.]+ [A-Z] //' | sort | uniq -c | sort -rn | head -n 20 ;;
bench)
    "$(dirname "$(BIN)")/llama-bench" -m "$T" -ngl 99 -fa 1 -p "${PP:-1,2,4,8,10,512}" -n 128 -r 5 -o md 2>/dev/null \
        | tee "$OUT/llama-bench.md" ;;
kernels)
    B=$(dirname "$(dirname "$(BIN)")"); tbo_build "$B" || continue
    types=${KERNEL_TYPES:-f16}
    if [ "$types" = f16 ]; then
        timeout 300 "$B/bin/test-backend-ops" test -o MUL_MAT -b CUDA0 -p "type_a=(f16|bf16)" > "$OUT/tbo-test.txt" 2>&1
        echo "MUL_MAT F16/BF16 against the CPU backend: rc=$?"; grep -E "FAIL|tests passed" "$OUT/tbo-test.txt" | tail -n 4
    fi
    verify_perf "$B" "$types" "${ENVS:--}" | tee "$OUT/kernels-$TAG.txt" ;;
ncu)
    # Nsight Compute on test-backend-ops perf, one case a run (NCU_CASES: TYPE:ROWS:K:COLUMNS ...), the kernels
    # matching NCU_KERNELS (mul_mat) after NCU_SKIP (4) launches, NCU_COUNT (3) of them, in each of ENVS; their
    # launch, occupancy, throughput and stall reasons by benchmarks/cuda/probes.py ncu: ncu-TAG.txt / .json
    B=$(dirname "$(dirname "$(BIN)")"); tbo_build "$B" || continue
    nc=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    if [ ! -x "$nc" ]; then echo "stage ncu: no ncu (Nsight Compute) on PATH or in /usr/local/cuda/bin"; continue; fi
    rm -rf "$W/ncu" && mkdir -p "$W/ncu"; IFS=';' read -ra envs <<< "${ENVS:--}"
    for e in "${envs[@]}"; do [ "$e" = - ] && e=""
        for c in ${NCU_CASES:-q4_K:6144:2048:1 q4_K:6144:2048:8 q4_K:2048:6144:8 q4_K:2048:2048:8 q4_K:512:2048:8 q6_K:6144:2048:8 q6_K:128000:2048:1 q6_K:128000:2048:8}; do
            IFS=: read -r ty m k n <<< "$c"; f="$W/ncu/$ty-${m}x$k-n$n${e:+-${e//=/_}}.csv"
            ev=(); [ -n "$e" ] && read -ra ev <<< "${e//,/ }"
            env "${ev[@]}" timeout 180 "$nc" --clock-control none --kernel-name "regex:${NCU_KERNELS:-mul_mat}" \
                --launch-skip "${NCU_SKIP:-4}" --launch-count "${NCU_COUNT:-3}" --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
                --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" --csv --page details \
                --log-file "$f" "$B/bin/test-backend-ops" perf -o MUL_MAT -b CUDA0 -p "type_a=$ty,type_b=f32,m=$m,n=$n,k=$k," \
                > "$f.out" 2>&1
            echo "ncu env '${e:--}' $c: rc=$?"
        done
    done
    mkdir -p "$OUT/ncu-$TAG" && cp "$W"/ncu/*.csv "$OUT/ncu-$TAG/" 2>/dev/null  # ncu's own files back too (~60-100 KB a case)
    $py benchmarks/cuda/probes.py ncu "$W"/ncu/*.csv --json "$OUT/ncu-$TAG.json" > "$OUT/ncu-$TAG.txt" 2>&1
    echo "probes.py ncu rc=$?"; cat "$OUT/ncu-$TAG.txt" ;;
markov)
    # the cases are built so that the CPU and CUDA must draft the same ids; perf at the 3B's vocabulary and rank
    # (MARKOV_ENVS: ';'-separated engine environments, each its own test and perf pass, e.g.
    # "-;GGML_CUDA_DSPARK_MARKOV_ALTERNATE=0"; files tagged by the environment after the first)
    # first developer 0082's Q8_0 kernel modelled lane by lane on the host against the CPU's dot
    $py benchmarks/cuda/markov_q8_emu.py > "$OUT/markov-q8-emu.txt" 2>&1; echo "Q8_0 Markov kernel model rc=$?"
    B=$(dirname "$(dirname "$(BIN)")"); tbo_build "$B" || continue
    IFS=';' read -ra markov_envs <<< "${MARKOV_ENVS:--}"
    for e in "${markov_envs[@]}"; do
        env_words "$e"; tag=${e//[^A-Za-z0-9=]/_}; [ "$e" = "${markov_envs[0]}" ] && tag= || tag=-$tag
        env "${ENV_WORDS[@]}" timeout 300 "$B/bin/test-backend-ops" test -o DSPARK_MARKOV -b CUDA0 > "$OUT/tbo-markov$tag.txt" 2>&1
        echo "DSPARK_MARKOV against the CPU backend with ${e/#-/the defaults}: rc=$?"
        grep -E "DSPARK_MARKOV|FAIL|tests passed" "$OUT/tbo-markov$tag.txt" | tail -n 8
        echo "== perf with ${e/#-/the defaults}" | tee -a "$OUT/tbo-markov-perf.txt"
        env "${ENV_WORDS[@]}" timeout 120 "$B/bin/test-backend-ops" perf -o DSPARK_MARKOV -b CUDA0 2>&1 | grep DSPARK_MARKOV \
            | tee -a "$OUT/tbo-markov-perf.txt"
    done ;;
trained)
    # real acceptance at LEVELS clients, and around a pause (16 slots, drafting paused above 8 busy) with
    # 0069's kept rows (the default) and with each of PAUSE_ARMS' switches; every block replayed on torch
    gpu_name; PAIR=${PAIR:-ggufdspark/data/trained} T=$W/trained-F16.gguf D=$W/dspark-trained-F16.gguf
    ( $py -m ggufdspark convert-target "$PAIR/target" -o "$T" --force &&
      $py -m ggufdspark convert "$PAIR/drafter" --target "$T" -o "$D" --force ) > "$W/convert.log" 2>&1 &
    conv=$!; build; wait $conv; echo "convert rc=$?"
    if [ -n "${PACK:-}" ]; then  # the engine for a later call's unpack: its cache folder less sources and objects
        key=$(basename "$(dirname "$(dirname "$(dirname "$(BIN)")")")"); mkdir -p "$OUT/engine"
        tar -C "$W/cache/engine" -cf - "$key/build.json" "$key/build/bin" | xz -T16 -3 | split -b 15M - "$OUT/engine/$key.tar.xz."
    fi
    A=("$py" benchmarks/trained.py acceptance -m "$T" -md "$D" --pair "$PAIR" --server "$(BIN)" --gpu
       --draft "${DRAFT_N:-8}" --answer "${ANSWER:-128}" --log-dir "$W/acc" --pause 16:8)
    timeout "${LEVELS_TIMEOUT:-240}" "${A[@]}" --levels "${LEVELS:-1,8,32,64}" --requests-per-client "${RPC:-1}" \
        --json "$OUT/acceptance.json" 2>&1 | grep -v -i "warn\|causal_conv\|detach" | tee "$OUT/acceptance.txt"
    for arm in ${PAUSE_ARMS-LLAMA_SPEC_PAUSE_KEEP=0 LLAMA_SPEC_PAUSE_INJECT=1}; do
        name=$(echo "${arm%%=*}" | tr 'A-Z_' 'a-z-')
        timeout "${ARM_TIMEOUT:-100}" "${A[@]}" --levels "" --env "$arm" --json "$OUT/acceptance-$name.json" \
            2>&1 | grep -v -i "warn\|causal_conv\|detach" | tee "$OUT/acceptance-$name.txt"
    done ;;
train)
    # ggufdspark.trained.recipe's train step on the corpus made here (`python -m ggufdspark.trained.recipe corpus
    # .devwork/tw`), the pair back in files under the 16 MB a file: the target's shards, the drafter, the rest
    gpu_name; tw=$W/tw
    timeout "${TRAIN_TIMEOUT:-560}" $py -m ggufdspark.trained.recipe train "$tw" --size "${SIZE:-gpu}" > "$OUT/train.log" 2>&1
    echo "train rc=$?"; grep -v -i "warning\|losses.append\|detach()" "$OUT/train.log" | tail -n 40
    cp "$tw"/pair/target/model*.safetensors "$OUT/"; cp "$tw/pair/drafter/model.safetensors" "$OUT/drafter.safetensors"
    tar -C "$tw/pair" --exclude='*.safetensors' -czf "$OUT/pair-small.tar.gz" . && ls -la "$OUT" ;;
*) echo "unknown stage $stage (carry pack-local train-unpack; unpack vl quant w2q8 setup speed slots sanitize load tune table arms prefill sampling layout first firstwait stall lossless verbose bench kernels markov ncu topk mma timeline trained train)" ;;
esac
done
