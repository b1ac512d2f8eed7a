#!/usr/bin/env bash
# The H200 measurements (one GPU, no network), one stage a question. The full-size generated pair
# (LFM2.5-VL-3B-shaped target + drafter of the published layout, F16) unless TARGET / DRAFT say
# otherwise; every server through ggufdspark.launch (benchmarks/harness.py), as `serve` starts it.
# The machine has no network: `bash benchmarks/carry.sh` here first (.carry/llama.cpp.tar.xz, the
# pinned tree), and carry .carry in each device call.
#
#   unpack    an engine packed by an earlier call (trained_gpu.sh PACK=1), from ENGINE_PACK, into the
#             engine cache: setup then builds nothing.
#   vl        generate and convert the full-size pair with its vision tower (tower, mmproj M, draft):
#             the stages after it serve that pair. A few minutes.
#   quant     the target quantized to QUANT (Q4_K_M): the stages after it serve that target.
#   setup     extract the carried pinned tree (.carry/llama.cpp.tar.xz), build the patched CUDA
#             engine with its tools (llama-bench, llama-quantize), generate and convert the pair
#             meanwhile (skipped when present). About 5 minutes.
#   speed     how much faster is one request with the draft? benchmarks/dspark_speed.py: plain
#             against draft lengths LENGTHS (5,7), TRIALS (5) requests each, synthetic acceptance at
#             the published profile; SPEED_ENVS: engine environments measured beside the default
#             (dspark_speed.py --env-variants: ';'-separated, a group's switches separated by commas or
#             spaces, e.g. "LLAMA_CONV_SNAPSHOT_ROWS=0;A=1 B=1"; an arm with
#             GGML_CUDA_GRAPH_DEBUG=N, developer 0056: its lines in graphdebug-ARM.txt, each key's
#             last eager / captured / replayed counts printed); SPEED_VARIANTS: llama-server flag sets
#             measured at the best length (';'-separated, e.g. "--spec-draft-p-min 1e-30"); INTERLEAVE=1:
#             every one-request arm's server up at once, the arms taking turns a request each (a drift
#             of the machine falls on all arms alike; variants then at every length, and on a plain
#             server too; CROSS=1: each SPEED_VARIANTS flag set under each SPEED_ENVS environment as
#             well); an arm with LLAMA_SPEC_PROFILE=1 leaves its profile lines in speed-profile.txt.
#             A few minutes.
#   slots     does the engine survive many slots under mixed-length prompts? crash_hunt.py --traffic
#             mixed: SLOTS (32) x ARMS (plain,draft) x ENVS (';'-separated engine environments, '-'
#             as it is) x RUNS (3) fresh servers, 2 x slots closed-loop requests, prompts PROMPTS
#             (200-2000) tokens, draft length N_MAX (0: serve's, with its load cut); JSON mixed-TAG.json. At most LIMIT s (420).
#   sanitize  which kernel faults? the slots load once under compute-sanitizer (memcheck), ARMS
#             (plain), in the one environment ENVS. At most LIMIT s.
#   load      plain against drafted serving: `ggufdspark bench --load` (serve's defaults: the CUDA
#             draft length and its load cut; patch 0025 turns CUDA graphs off above 16 slots),
#             closed-loop CLIENTS (1,2,4,8,16,32,64), REQUESTS_PER_CLIENT (3) each, answers of
#             ANSWERS tokens (256; "256 1024": a run each), synthetic acceptance at the published
#             profile, greedy (TEMPERATURE=0.8: sampled; LOAD_ARGS: more bench options, e.g.
#             --server-arg=-bs for the engine's backend sampling, --noise-floor for a second plain
#             server as the run's noise band); ROUNDS (1): every level that many
#             times, figures over all rounds and each round's ratio (bench --load --rounds); JSON
#             load-ANSWER.json. A few minutes a run.
#   tune      the draft length for each load: `ggufdspark tune --load` (one plain arm beside a
#             drafted arm per length of TUNE_LENGTHS (0,3,5,7; 0: the draft loaded, drafting paused),
#             closed-loop CLIENTS, REQUESTS_PER_CLIENT (2), ANSWERS tokens (256), synthetic acceptance
#             at the published profile, profile not saved); JSON tune-TAG.json. A minute an arm.
#   arms      named drafted arms side by side against one plain arm (benchmarks/load_arms.py):
#             LOAD_ARMS (';'-separated NAME=N_MAX [CUT] [KEY=VALUE ...], e.g. "table=7 16:0;generating=7 16:0
#             LLAMA_SPEC_CUT_GENERATING=1"), CLIENTS, REQUESTS_PER_CLIENT (3), ANSWERS (256), ROUNDS (1),
#             TEMPERATURE (greedy; 0.8: sampled, with "NAME=plain KEY=VALUE" arms for a switch on both),
#             NOISE_FLOOR=1 (a second plain server, plain2: the run's noise band), CONVERSATIONS=1 (each
#             client one conversation through the prompt cache); JSON arms-TAG.json;
#             the profile lines of arms with LLAMA_SPEC_PROFILE=1 (DEV=1: the decode windows too,
#             ubatches a decode) in arms-TAG-profile.txt, each line after its arm's log name.
#   table     serve's load table from every tune-*.json in OUT (benchmarks/tune_merge.py), then
#             `ggufdspark bench --load` with it against plain (JSON load-table.json): the table as
#             served. A few minutes.
#   prefill   what does the draft cost in prompt processing? benchmarks/prefill_speed.py: one
#             PREFILL_TOKENS (4096) prompt, then 8 at once, one answer token, plain against drafted
#             and the arms of PREFILL_ARMS (';'-separated --arm specs: NAME=plain|drafted KEY=VALUE
#             ... server args): the server's prompt eval tok/s; JSON prefill-TAG.json. About a minute
#             (half a minute more an arm). With LLAMA_SPEC_PROFILE=1 each server's profile lines go to
#             prefill-TAG-profile.txt (DEV=1: every context's decode phases).
#   sampling  what host sampling costs a sampled request: benchmarks/sampling_speed.py, plain and
#             drafted (N_MAX, 7) one-slot servers, each with the graph's top-k (patch 0050, as served;
#             GRAPH_TOPK=K: LLAMA_OUTPUT_TOPK=K), with patch 0032's host pass and with neither
#             (LLAMA_SAMPLER_NO_FAST_TOPK=1), TRIALS (3) seeded requests at temperature 0.8, the
#             engine's own sampling time; synthetic acceptance at the published profile; JSON
#             sampling.json. A minute or two.
#   layout    what the KV layout across slots costs scattered busy slots: benchmarks/kv_layout.py,
#             plain and drafted (serve's), llama-server's divided layout (serve's) against one shared cache,
#             LAYOUT_REQUESTS (4) requests at once on LAYOUT_SLOTS (16) slots, pinned to consecutive and
#             to scattered slots; JSON layout-TAG.json. About a minute.
#   lossless  the lossless tests of the suite on this GPU: tests/test_parallel_spec.py (greedy output
#             against the plain server's at 1, 8 and 32 slots, closed-loop mixed traffic among them)
#             and tests/test_sampling_exact.py (the sampling distribution), against this call's build;
#             LOSSLESS_TESTS: other pytest arguments; lossless.txt. A few minutes.
#   first     the first request after `serve` says ready, with its warm-up against without and plain:
#             benchmarks/first_request.py, RUNS (3) fresh servers an arm (FIRST_ARMS: more arms, e.g.
#             "warm,cold,plain,long,plain-long": an untimed long request first); first.json. A minute or two.
#   verbose   does a switch engage? one drafted server with -v in ENVS's one environment, one greedy
#             request (VERBOSE_TOKENS, 256), the log's lines matching VERBOSE_GREP counted; verbose.log.
#             Seconds.
#   bench     llama-bench on the target alone: token generation (tg128) and prompt processing at
#             the verify's sizes and 512 (PP: 1,2,4,8,10,512). About a minute.
#   topk      the engine's CUDA top-k kernels (0002's one block a row, 0051's chunks with warp shuffles):
#             benchmarks/topk_cuda.cu built with nvcc against the engine's source tree, every case
#             against a CPU reference, then one call's time at 1-64 rows of 128000 logits; JSON topk.json.
#             Seconds once the engine is built.
#   timeline  where the device sits idle: benchmarks/cupti_trace.cpp built with nvcc against CUPTI
#             (CUPTI, else .carry/cupti, /usr/local/cuda/extras/CUPTI, nvcc's toolkit) and loaded into traced
#             servers (CUDA_INJECTION64_PATH): the prefill stage's plain and drafted servers traced
#             (TIMELINE: "prefill" and/or "decode": one request at a time decoding 256 tokens, plain
#             and drafted at N_MAX (7), dspark_speed.py), each trace read by benchmarks/gpu_timeline.py
#             (bursts of device work, busy share, gaps by the streams that end and start them, the
#             longest gaps; TIMELINE_API=1 records the runtime calls too, each costing the host ~1 us,
#             and each kind of gap then says how much of it the host spent inside CUDA);
#             timeline-prefill.txt/.json, timeline-decode.txt/.json. A minute or two a part.
#   markov    patch 0065's Markov-chain op: test-backend-ops DSPARK_MARKOV, CUDA0 against the
#             CPU backend (exact ids), then its perf cases at the 3B's shapes; tbo-markov*.txt.
#             A few minutes (test-backend-ops builds once).
#   kernels   the verify's mat-muls in isolation: test-backend-ops (built in the engine's build tree)
#             MUL_MAT F16/BF16 against the CPU backend, then perf at the verify's shapes (patch
#             0014's cases) in each environment of ENVS ('-': as it is). A few minutes.
# Stages: the arguments, else STAGES (default "setup speed"). Environment: WORK (default .devwork,
# kept between calls on a warm machine), OUT (results), PYTHON, SERVER (another llama-server),
# GPU (default --gpu; empty on CPU). CPU run of the load stage (tests/test_bench_load.py):
#   TARGET=tiny-lfm2-F16.gguf DRAFT=dspark-tiny-lfm2-F16.gguf SERVER=path/to/llama-server \
#     CLIENTS=1,2 ANSWERS=16 REQUESTS_PER_CLIENT=1 OUT=out benchmarks/h200.sh load
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/h200_env.sh
LIMIT=${LIMIT:-420}
GPU=${GPU---gpu}
BIN() { echo "${SERVER:-$($py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --print-path 2>/dev/null | tail -n1)}"; }
hunt() { echo -m "$T" -md "$D" --server "$(BIN)" $GPU --n-max "${N_MAX:-0}" --prompt-tokens "${PROMPTS:-200-2000}" \
    --slots "${SLOTS:-32}" --envs="${ENVS:--}"; }
# test-backend-ops in the engine's build tree $1 (configured with the tests, built once)
tbo_build() {
    local t0=$SECONDS
    if ! { cmake -DLLAMA_BUILD_TESTS=ON "$1" > "$W/tbo.log" 2>&1 \
           && cmake --build "$1" --target test-backend-ops -j "$(nproc)" >> "$W/tbo.log" 2>&1; }; then
        echo "test-backend-ops did not build"; tail -n 15 "$W/tbo.log"; return 1
    fi
    echo "test-backend-ops built in $((SECONDS - t0)) s"
}
# the prefill stage's measurement (benchmarks/prefill_speed.py), more arguments after it
prefill_run() { $py benchmarks/prefill_speed.py $GPU -m "$T" -md "$D" --server "$(BIN)" \
    --prompt-tokens "${PREFILL_TOKENS:-4096}" --concurrency 8 "$@"; }

for stage in ${*:-${STAGES:-setup speed}}; do
if [ "$stage" != setup ] && [ "$stage" != unpack ] && [ "$stage" != vl ] && [ "$stage" != kernels ] && [ "$stage" != topk ] && [ ! -f "$D" ]; then
    echo "stage $stage: no pair at $D: run the setup stage first (in this call, or one on the same warm machine)"
    continue
fi
case $stage in
unpack)
    # an engine an earlier call packed (benchmarks/trained_gpu.sh with PACK=1), carried in ENGINE_PACK
    # (a folder of KEY.tar.xz.* pieces): into this work folder's engine cache, so setup builds nothing
    for first in "${ENGINE_PACK:-.carry/engine}"/*.tar.xz.aa; do
        [ -f "$first" ] || { echo "stage unpack: no *.tar.xz.aa under ${ENGINE_PACK:-.carry/engine}"; break; }
        mkdir -p "$W/cache/engine" && cat "${first%.aa}".* | xz -d | tar -xf - -C "$W/cache/engine" &&
            echo "unpacked $(basename "${first%.tar.xz.aa}")"
    done
    ;;
vl)
    # the full-size LFM2.5-VL-3B-shaped pair with its vision tower: the tower, its mmproj and the
    # draft, F16; later stages serve them (the load stage's images: LOAD_ARGS="--mmproj \$M
    # --image-share 0.33", where M is set here)
    if [ ! -f "$W/vl/dspark-F16.gguf" ]; then
        ( set -e
          $py -m ggufdspark generate "$W/vl" --size full --vl --force
          $py -m ggufdspark convert-target "$W/vl/target" -o "$W/vl/target-F16.gguf" --force
          $py -m ggufdspark convert "$W/vl/drafter" --target "$W/vl/target-F16.gguf" -o "$W/vl/dspark-F16.gguf" --force
        ) > "$W/vl.log" 2>&1 || { echo "stage vl failed"; tail -n 5 "$W/vl.log"; continue; }
    fi
    T=$W/vl/target-F16.gguf D=$W/vl/dspark-F16.gguf M=$W/vl/mmproj-target-F16.gguf
    echo "vl pair: $T, $D, $M"
    ;;
quant)
    # the target quantized to QUANT (Q4_K_M) by the engine's llama-quantize; later stages serve it
    q=${QUANT:-Q4_K_M}; QT=${T%.gguf}-$q.gguf
    [ -f "$QT" ] || $py -m ggufdspark quantize "$T" -t "$q" -o "$QT" --server "$(BIN)" > "$W/quant-$q.log" 2>&1 ||
        { echo "stage quant: quantize failed"; tail -n 3 "$W/quant-$q.log"; continue; }
    T=$QT; echo "target now $T"
    ;;
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
    # llama-bench and llama-quantize come with the same build: a few seconds more
    $py -m ggufdspark build-engine "${BUILD_ARGS[@]}" --with-tools --no-ui > "$OUT/build.log" 2>&1
    echo "build rc=$? in $((SECONDS - t0)) s"; tail -n 2 "$OUT/build.log"
    if [ -n "${gen:-}" ]; then wait "$gen"; echo "generate+convert rc=$? at $((SECONDS - t0)) s"; tail -n 3 "$W/gen.log"; fi
    ;;
speed)
    rm -rf "$W/speed"  # this call's servers' logs only (a warm machine keeps the last call's)
    $py benchmarks/dspark_speed.py $GPU -m "$T" -md "$D" --server "$(BIN)" --n-predict 256 --trials "${TRIALS:-5}" \
        --lengths "${LENGTHS:-5,7}" --concurrency "" ${SPEED_ENVS:+--env-variants "$SPEED_ENVS"} \
        ${SPEED_VARIANTS:+--variants "$SPEED_VARIANTS"} ${INTERLEAVE:+--interleave} ${CROSS:+--cross-variants} \
        --json "$OUT/speed.json" --log-dir "$W/speed" 2>&1 \
        | tee "$OUT/speed.txt" | tail -n 8
    # an arm with LLAMA_SPEC_PROFILE=1: its profile lines to OUT/speed-profile.txt, after its log's name
    : > "$OUT/speed-profile.txt"
    for f in "$W/speed"/*.log; do
        grep -q "spec profile\|decode profile" "$f" 2>/dev/null || continue
        { echo "== $(basename "$f")"; grep -h "spec profile\|decode profile" "$f"; } >> "$OUT/speed-profile.txt"
    done
    # printed: each profiled arm's last step profile (the file keeps every line)
    [ -s "$OUT/speed-profile.txt" ] && awk '/^== /{a=$0} /spec profile/{l[a]=$0} END{for (k in l) print k "\n" l[k]}' \
        "$OUT/speed-profile.txt" || rm -f "$OUT/speed-profile.txt"
    # developer 0056's lines (an arm with GGML_CUDA_GRAPH_DEBUG=N): each such arm's lines to
    # OUT/graphdebug-ARM.txt, and its last per-key eager / captured / replayed counts printed
    for f in "$W/speed"/*.log; do
        grep -q "cuda graph debug" "$f" 2>/dev/null || continue
        g="$OUT/graphdebug-$(basename "$f" .log).txt"
        grep -h "cuda graph debug" "$f" > "$g"
        n=$(grep -c "computes: key" "$g"); last=$(grep "computes: key" "$g" | tail -n 1 | sed 's/.*after \([0-9]*\) computes.*/\1/')
        echo "== $(basename "$g"): $(grep -c "changed: \|nodes -> " "$g") changes, $(grep -c "kept capture replays" "$g")" \
             "kept captures replayed (0059); per-key counts after ${last:-0} computes:"
        if [ "$n" -gt 0 ]; then grep "after $last computes: key" "$g" | sed 's/.*computes: //'; fi
    done
    ;;
slots)
    echo "== mixed traffic: slots ${SLOTS:-32}, arms ${ARMS:-plain,draft}, envs '${ENVS:--}', runs ${RUNS:-3}"
    timeout "$LIMIT" $py benchmarks/crash_hunt.py $(hunt) --arms "${ARMS:-plain,draft}" --runs "${RUNS:-3}" \
        --json "$OUT/mixed-${TAG:-a}.json" --log-dir "$W/hunt-${TAG:-a}"
    echo "slots rc=$?"
    ;;
sanitize)
    echo "== mixed traffic under compute-sanitizer: slots ${SLOTS:-32}, ${ARMS:-plain}"
    timeout "$LIMIT" $py benchmarks/crash_hunt.py $(hunt) --arms "${ARMS:-plain}" --runs 1 --sanitizer \
        --json "$OUT/sanitize.json" --log-dir "$W/hunt-san"
    echo "sanitize rc=$?"
    grep -h -m 40 "=========" "$W"/hunt-san/s*.log | head -n 60
    ;;
load)
    rates=$($py -c "from ggufdspark.measuring.acceptance import PROFILES; print(','.join(map(str, PROFILES['published'].rates)))")
    for ans in ${ANSWERS:-256}; do
        args=(bench --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}"
              --answer-tokens "$ans" --requests-per-client "${REQUESTS_PER_CLIENT:-3}" --synthetic-rates "$rates"
              ${TEMPERATURE:+--temperature "$TEMPERATURE"} ${ROUNDS:+--rounds "$ROUNDS"} ${LOAD_ARGS:-})
        echo "== ${args[*]}"
        $py -m ggufdspark "${args[@]}" --json "$OUT/load-$ans.json" --force --log-dir "$W/load-$ans" \
            2>&1 | tee "$OUT/load-$ans.txt" | grep -v "^bench --load: [0-9]*%" | tail -n 40
        if [ "${PIPESTATUS[0]}" -ne 0 ]; then
            echo "== bench --load failed (logs: $W/load-$ans)"
            for f in "$W/load-$ans"/*.log; do echo "-- $f"; tail -n 8 "$f"; done
        fi
    done
    ;;
tune)
    $py -m ggufdspark tune --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" \
        --answer-tokens "${ANSWERS:-256}" --requests-per-client "${REQUESTS_PER_CLIENT:-2}" --acceptance published \
        --draft-lengths "${TUNE_LENGTHS:-0,3,5,7}" --no-save --json --log-dir "$W/tune-${TAG:-a}" \
        > "$OUT/tune-${TAG:-a}.json" 2> "$W/tune-${TAG:-a}.err"
    echo "tune rc=$?"; grep -v "^tune --load: [0-9]*%" "$W/tune-${TAG:-a}.err" | tail -n 5
    $py -c "import json,sys; from ggufdspark.measuring.tuneload import TuneLoadResult as R; d=json.load(open(sys.argv[1]));
print(R(d['recommendation'], {int(n): {int(k): v for k, v in r.items()} for n, r in d['ratios'].items()}, d['traffic']).text())" \
        "$OUT/tune-${TAG:-a}.json"
    ;;
arms)
    arms=(); IFS=';' read -ra specs <<< "${LOAD_ARMS:?LOAD_ARMS: the arms to run}"
    for spec in "${specs[@]}"; do [ -n "$spec" ] && arms+=(--arm "$spec"); done
    $py benchmarks/load_arms.py -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" \
        --requests-per-client "${REQUESTS_PER_CLIENT:-3}" --answer-tokens "${ANSWERS:-256}" "${arms[@]}" \
        ${ROUNDS:+--rounds "$ROUNDS"} ${TEMPERATURE:+--temperature "$TEMPERATURE"} ${NOISE_FLOOR:+--noise-floor} \
        ${CONVERSATIONS:+--conversations} \
        --json "$OUT/arms-${TAG:-a}.json" --log-dir "$W/arms-${TAG:-a}" 2>&1 | tee "$OUT/arms-${TAG:-a}.txt" | tail -n 40
    # the engine's profile lines (arms with LLAMA_SPEC_PROFILE=1), every arm's in one file: the
    # device returns at most 8 files a call
    grep -a -H "decode window\|decode profile\|spec profile" "$W/arms-${TAG:-a}"/*.log 2>/dev/null \
        | sed "s|^$W/arms-${TAG:-a}/||" > "$OUT/arms-${TAG:-a}-profile.txt"
    [ -s "$OUT/arms-${TAG:-a}-profile.txt" ] || rm -f "$OUT/arms-${TAG:-a}-profile.txt"
    ;;
table)
    read -r n cut < <($py benchmarks/tune_merge.py "$OUT"/tune-*.json --json "$OUT/table.json")
    rates=$($py -c "from ggufdspark.measuring.acceptance import PROFILES; print(','.join(map(str, PROFILES['published'].rates)))")
    echo "== table: draft length $n, --draft-n-max-by-slots $cut"
    if [ "${n:-0}" = 0 ]; then echo "no draft length pays at the lowest level: no table to serve"; continue; fi
    $py -m ggufdspark bench --load -m "$T" -md "$D" --server "$(BIN)" --clients "${CLIENTS:-1,2,4,8,16,32,64}" \
        --answer-tokens "${ANSWERS:-256}" --requests-per-client "${REQUESTS_PER_CLIENT:-2}" --synthetic-rates "$rates" \
        --draft-n-max "$n" --draft-n-max-by-slots "$cut" --json "$OUT/load-table.json" --force --log-dir "$W/load-table" \
        2>&1 | grep -v "^bench --load: [0-9]*%" | tail -n 30
    ;;
layout)
    $py benchmarks/kv_layout.py $GPU -m "$T" -md "$D" --server "$(BIN)" --slots "${LAYOUT_SLOTS:-16}" \
        --requests "${LAYOUT_REQUESTS:-4}" --json "$OUT/layout-${TAG:-a}.json" --log-dir "$W/layout-${TAG:-a}" 2>&1 \
        | tee "$OUT/layout-${TAG:-a}.txt" | tail -n 16
    ;;
prefill)
    arms=(); IFS=';' read -ra specs <<< "${PREFILL_ARMS:-}"
    for spec in "${specs[@]}"; do [ -n "$spec" ] && arms+=(--arm "$spec"); done
    prefill_run "${arms[@]}" --json "$OUT/prefill-${TAG:-a}.json" --log-dir "$W/prefill-${TAG:-a}" 2>&1 \
        | tee "$OUT/prefill-${TAG:-a}.txt" | tail -n $((8 + ${#arms[@]} / 2))
    # each request's "graphs replanned" (patch 0033: the target's allocation planned again), per arm
    for f in "$W/prefill-${TAG:-a}"/*.log; do
        [ -e "$f" ] && echo "$(basename "$f" .log): $(grep -o 'graphs replanned = *[0-9]*' "$f" | awk '{print $4}' | tr '\n' ' ')"
    done > "$OUT/prefill-${TAG:-a}-replanned.txt"
    # with LLAMA_SPEC_PROFILE=1 (and DEV=1: every context's decode phases, printed at the end too)
    grep -H "decode profile\|spec profile" "$W/prefill-${TAG:-a}"/*.log 2>/dev/null | sed "s|$W/||" \
        > "$OUT/prefill-${TAG:-a}-profile.txt" || rm -f "$OUT/prefill-${TAG:-a}-profile.txt"
    ;;
sampling)
    $py benchmarks/sampling_speed.py $GPU -m "$T" -md "$D" --server "$(BIN)" --n-max "${N_MAX:-7}" --synthetic \
        ${GRAPH_TOPK:+--graph-topk "$GRAPH_TOPK"} \
        --trials "${TRIALS:-3}" --n-predict 256 --json "$OUT/sampling.json" --log-dir "$W/sampling" 2>&1 \
        | tee "$OUT/sampling.txt" | tail -n 10
    ;;
timeline)
    nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    # the toolkit nvcc runs from (nvcc may be a wrapper script): its TOP in a dry run
    tk=$("$nv" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
    C=""; for c in "${CUPTI:-}" .carry/cupti /usr/local/cuda/extras/CUPTI "$tk"; do [ -n "$c" ] && [ -f "$c/include/cupti.h" ] && C=$c && break; done
    if [ -z "$C" ]; then echo "stage timeline: no CUPTI (include/cupti.h) under CUPTI, .carry/cupti, /usr/local/cuda/extras/CUPTI or nvcc's toolkit ($tk)"; continue; fi
    CL=$(cd "$C" && pwd)/lib; [ -f "$CL/libcupti.so" ] || CL=$(cd "$C" && pwd)/lib64
    if ! "$nv" -std=c++17 -shared -Xcompiler -fPIC -I "$C/include" benchmarks/cupti_trace.cpp -L "$CL" -lcupti \
            -Xlinker -rpath="$CL" -o "$W/libcupti_trace.so"; then
        echo "stage timeline: the tracer did not build"; continue
    fi
    rm -rf "$W/tl" && mkdir -p "$W/tl"
    for part in ${TIMELINE:-prefill decode}; do
        if [ "$part" != prefill ] && [ "$part" != decode ]; then
            echo "stage timeline: TIMELINE part $part: expected prefill or decode"; continue
        fi
        # every server the part's script starts is traced, one file a process (its command line names it)
        (
        export CUDA_INJECTION64_PATH="$W/libcupti_trace.so" GGUFDSPARK_CUPTI_API="${TIMELINE_API:-0}" \
            GGUFDSPARK_CUPTI_OUT="$W/tl/$part-%p.csv"
        case $part in
        prefill)
            prefill_run --json "$OUT/timeline-prefill-speed.json" --log-dir "$W/tl/prefill" 2>&1 | tail -n 6 ;;
        decode)
            $py benchmarks/dspark_speed.py $GPU -m "$T" -md "$D" --server "$(BIN)" --n-predict 256 \
                --trials "${TRIALS:-3}" --lengths "${N_MAX:-7}" --concurrency "" \
                --json "$OUT/timeline-decode-speed.json" --log-dir "$W/tl/decode" 2>&1 | tail -n 6 ;;
        esac
        )
        files=("$W"/tl/"$part"-*.csv)
        if [ ! -f "${files[0]}" ]; then echo "stage timeline: $part wrote no trace (no process initialised CUDA)"; continue; fi
        $py benchmarks/gpu_timeline.py "${files[@]}" --json "$OUT/timeline-$part.json" > "$OUT/timeline-$part.txt" 2>&1
        echo "timeline $part rc=$?"; head -c 6000 "$OUT/timeline-$part.txt"
    done
    ;;
topk)
    S=$(dirname "$(dirname "$(dirname "$(BIN)")")")/src  # the engine cache: KEY/build/bin/llama-server, KEY/src
    if [ ! -f "$S/ggml/src/ggml-cuda/top-k-rows.cuh" ]; then echo "stage topk: no top-k-rows.cuh under $S: an engine without patch 0051"; continue; fi
    nv=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    "$nv" -O3 -std=c++17 -arch=sm_90 -I "$S/ggml/src/ggml-cuda" benchmarks/topk_cuda.cu -o "$W/topk_cuda" \
        && "$W/topk_cuda" --json "$OUT/topk.json" | tee "$OUT/topk.txt"
    echo "topk rc=${PIPESTATUS[0]}"
    ;;
lossless)
    # the test suite's lossless tests on this GPU, against this call's build (the tests generate their
    # own small pairs): greedy tokens against the plain server's at 1, 8 and 32 slots, and the
    # sampling check's distribution test; LOSSLESS_TESTS replaces the selection
    # shellcheck disable=SC2086  # pytest arguments
    GGUFDSPARK_SERVER="$(BIN)" $py -m pytest -q -p no:cacheprovider \
        ${LOSSLESS_TESTS:-tests/test_parallel_spec.py tests/test_sampling_exact.py} 2>&1 \
        | tee "$OUT/lossless.txt" | tail -n 15
    echo "lossless rc=${PIPESTATUS[0]}"
    ;;
first)
    # the first request after `serve` says ready: with serve's warm-up (--warmup) against without
    # (--no-warmup, serve's default) and the plain server (benchmarks/first_request.py), RUNS (3) fresh
    # servers an arm, 3 requests each of the same prompt, 64-token greedy answers; FIRST_ARMS: other
    # arms (long, plain-long: an untimed long request first)
    $py benchmarks/first_request.py -m "$T" -md "$D" --server "$(BIN)" --runs "${RUNS:-3}" \
        --arms "${FIRST_ARMS:-warm,cold,plain}" --json "$OUT/first.json" --log-dir "$W/first" 2>&1 | tee "$OUT/first.txt" | tail -n 6
    ;;
verbose)
    # does a switch engage? one drafted server (the pair on the GPU as serve places it) with -v and
    # ENVS's one environment ('-': as it is), one greedy request of VERBOSE_TOKENS (256; 0004's
    # profile prints every 128 target decodes), then its log's lines matching
    # VERBOSE_GREP (a grep -E pattern); the whole log in OUT/verbose.log
    if [ -z "${VERBOSE_GREP:-}" ]; then echo "stage verbose: VERBOSE_GREP: the log lines to find (a grep -E pattern)"; continue; fi
    env_args=(); [ "${ENVS:--}" != - ] && read -ra env_args <<< "${ENVS//,/ }"
    gpu_args=(); [ -n "$GPU" ] && gpu_args=(-ngl 99 -ngld 99 -fa on -ot 'token_embd\.weight=CUDA0')
    env "${env_args[@]}" "$(BIN)" -m "$T" -md "$D" --spec-type draft-dspark "${gpu_args[@]}" \
        --host 127.0.0.1 --port "${PORT:-18099}" -v > "$W/verbose.log" 2>&1 &
    vpid=$!
    for _ in $(seq 600); do curl -sf "http://127.0.0.1:${PORT:-18099}/health" > /dev/null && break
        kill -0 "$vpid" 2>/dev/null || break; sleep 0.5; done
    if ! kill -0 "$vpid" 2>/dev/null; then echo "stage verbose: the server ended (log $W/verbose.log)"; tail -n 5 "$W/verbose.log"; continue; fi
    curl -s "http://127.0.0.1:${PORT:-18099}/completion" -d '{"prompt": "Once upon a time", "n_predict": '"${VERBOSE_TOKENS:-256}"', "temperature": 0}' \
        | $py -c "import json,sys; d=json.load(sys.stdin); t=d['timings']; print('draft_n', t.get('draft_n'), 'accepted', t.get('draft_n_accepted'))"
    kill "$vpid"; wait "$vpid" 2>/dev/null
    cp "$W/verbose.log" "$OUT/verbose.log"
    grep -aE "$VERBOSE_GREP" "$W/verbose.log" \
        | sed -E 's/^[0-9.]+ [A-Z] //' | sort | uniq -c | sort -rn | head -n 20
    ;;
bench)
    "$(dirname "$(BIN)")/llama-bench" -m "$T" -ngl 99 -fa 1 -p "${PP:-1,2,4,8,10,512}" -n 128 -r 5 -o md 2>/dev/null \
        | tee "$OUT/llama-bench.md"
    ;;
kernels)
    B=$(dirname "$(dirname "$(BIN)")")
    tbo_build "$B" || continue
    timeout 300 "$B/bin/test-backend-ops" test -o MUL_MAT -b CUDA0 -p "type_a=(f16|bf16)" > "$OUT/tbo-test.txt" 2>&1
    echo "MUL_MAT F16/BF16 against the CPU backend: rc=$?"; grep -E "FAIL|tests passed" "$OUT/tbo-test.txt" | tail -n 4
    IFS=';' read -ra envs <<< "${ENVS:--}"
    for e in "${envs[@]}"; do
        [ "$e" = - ] && e=""
        echo "== perf at the verify's shapes, env '${e:--}'"
        # shellcheck disable=SC2086  # NAME=VALUE pairs, comma-separated
        env ${e//,/ } timeout 300 "$B/bin/test-backend-ops" perf -o MUL_MAT -b CUDA0 \
            -p "type_a=f16,type_b=f32,m=(512|2048|6144|128000),n=([1-9]|10),k=(2048|6144)," 2>&1 \
            | grep MUL_MAT | sed -E 's/MUL_MAT\(type_a=([a-z0-9]+),type_b=f32,(m=[0-9]+,n=[0-9]+,k=[0-9]+),.*: +[0-9]+ runs - +([0-9.]+ us\/run).*/\1 \2 \3/'
    done
    ;;
markov)
    # patch 0065's op: test-backend-ops DSPARK_MARKOV on CUDA0 against the CPU
    # backend (cases built so that both must draft the same ids), then its perf cases (the 3B's
    # vocabulary 128000 and rank 256, one and eight blocks of 8 positions)
    B=$(dirname "$(dirname "$(BIN)")")
    tbo_build "$B" || continue
    timeout 300 "$B/bin/test-backend-ops" test -o DSPARK_MARKOV -b CUDA0 > "$OUT/tbo-markov.txt" 2>&1
    echo "DSPARK_MARKOV against the CPU backend: rc=$?"; grep -E "DSPARK_MARKOV|FAIL|tests passed" "$OUT/tbo-markov.txt" | tail -n 8
    timeout 120 "$B/bin/test-backend-ops" perf -o DSPARK_MARKOV -b CUDA0 2>&1 | grep DSPARK_MARKOV | tee "$OUT/tbo-markov-perf.txt"
    ;;
*) echo "unknown stage $stage (unpack vl quant setup speed slots sanitize load arms tune table prefill sampling layout timeline topk lossless bench kernels markov first verbose)" ;;
esac
done
