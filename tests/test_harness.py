"""benchmarks/harness.py, the one harness of benchmarks/, on the real engine and the small pair:
an arm's servers through ggufdspark.launch, its one-request and N-at-once figures, the lossless
check, and the scripts built on it (speed.py prefill, costs.py sampling and layout, cuda/probes.py),
and the device script benchmarks/h200.sh."""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # benchmarks/ is a checkout's package, not an installed one
    sys.path.insert(0, str(REPO))


def test_an_arm_is_measured_plain_and_drafted_and_checked_lossless(small_pair, isolated, tmp_path):
    from benchmarks import harness
    from ggufdspark.measuring.gate import NEAR_TIE_GAP

    base = harness.base_settings(None, small_pair.target, gpu=False, parallel=2, n_predict=16)
    assert base.parallel == 2 and base.draft is None and base.ctx_size == 2 * (16 + harness.CTX_MARGIN)
    kw = dict(levels=[1, 2], n_predict=16, trials=2, load_trials=2, rounds=1)
    plain = harness.measure_arm("plain", base, tmp_path, **kw, reference_tokens=16)
    assert plain.tps > 0 and len(plain.runs) == 2 and plain.e2e_s > 0 and plain.draft_n == 0
    assert len(plain.load[2]["waves"]) == 2 and plain.load[2]["tps"] > 0 and plain.load[2]["requests"] == 2
    assert len(plain.reference["tokens"]) == 16 and (tmp_path / "plain.log").is_file()

    rates = harness.published_rates(small_pair.draft)
    spec = harness.drafted(base, small_pair.draft, 3, rates)
    assert spec.draft_n_max == 3 and spec.synth_rates == rates[:3] and spec.spec_type == "draft-dspark"
    arm = harness.measure_arm("n3", spec, tmp_path, **kw)
    assert arm.tps > 0 and arm.draft_n > 0 and arm.accept_length and arm.accept_length > 1.0
    assert arm.load[2]["drafted"] > 0 and "--spec-synth-rates" in arm.cmd

    res = harness.lossless("real-n3", harness.drafted(base, small_pair.draft, 3, None), tmp_path, plain.reference)
    assert res["tokens"] == 16 and res["draft_n"] > 0, res
    if not res["equal"]:  # only a near-tie may differ (random weights)
        top2 = res["plain_top2_logprobs"]
        assert math.exp(top2[0]) - math.exp(top2[1]) < NEAR_TIE_GAP, res


def test_prefill_speed_reports_prompt_processing_plain_and_drafted(small_pair, isolated, tmp_path):
    """speed.py prefill: plain and drafted arms, and an --arm variant with an engine variable and a
    server argument (here the drafter's checkpoint copy of patch 0028 and -ctxcp 0) started with
    them; every arm's ratio is against plain; a malformed --arm is refused in one line."""
    out = tmp_path / "prefill.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speed.py"), "prefill", "-m", str(small_pair.target),
                        "-md", str(small_pair.draft), "--prompt-tokens", "96", "--concurrency", "2", "--trials", "1",
                        "--arm", "copied=drafted LLAMA_SPEC_CKPT_DFT=1 -ctxcp 0",
                        "--json", str(out), "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert [a["arm"] for a in rep["arms"]] == ["plain", f"draft-n{rep['draft_n_max']}", "copied"]
    for a in rep["arms"]:
        assert a["one"]["prompt_n"] == 96 and a["one"]["prompt_tps"] > 0, a
        assert a["at_once"]["requests"] == 2 and a["at_once"]["prompt_tokens"] == 2 * 96, a
        assert a["at_once"]["aggregate_prompt_tps"] > 0, a
        assert a["ratio"]["one"] == a["one"]["prompt_tps"] / rep["arms"][0]["one"]["prompt_tps"], a
        assert a["arm"] in p.stdout
    copied = rep["arms"][2]
    assert copied["env"] == {"LLAMA_SPEC_CKPT_DFT": "1"} and copied["cmd"].endswith("-ctxcp 0"), copied
    assert "/plain (1)" in p.stdout and rep["ratio"] == rep["arms"][1]["ratio"], p.stdout
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speed.py"), "prefill", "-m", str(small_pair.target),
                          "-md", str(small_pair.draft), "--arm", "x=neither -ctxcp 0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--arm 'x=neither -ctxcp 0': expected NAME=plain|drafted" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_serve_drafted_is_the_drafted_server_serve_starts(small_pair, isolated, ggufdspark_cli):
    """slots.py's default drafted arm (harness.serve_drafted) is serve's drafted server for the
    backend, decided with the real engine: on CUDA at 32 slots the table's draft length 7 (cut to what the
    small pair's drafter makes a step) and the 16:3 load cut
    (drafts cut to 3 above 16 busy slots; the engine has patch 0021) and the drafter's n_ubatch 2048
    (patch 0037), as `serve`'s plan for an
    H200 has them; on this CPU, serve's own
    --dry-run. Synthetic rates truncated to the length."""
    from benchmarks import harness
    from ggufdspark import launch
    from ggufdspark.devices import Device, DeviceReport
    from ggufdspark.serve import ServingOptions, plan

    rates = [0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1]
    h200 = DeviceReport(devices=[Device("CUDA0", "NVIDIA H200", "gpu", 140 << 30, 141 << 30)], backend="cuda",
                        source="bindings")
    base = harness.base_settings(None, small_pair.target, gpu=True, parallel=32)
    s = harness.serve_drafted(base, small_pair.draft, gpu=True, rates=rates)
    served = plan(ServingOptions(model=small_pair.target, draft=small_pair.draft, parallel=32, ui=False),
                  devices=h200).settings
    # the table's 7, cut to what the small pair's drafter makes a step (its block), as serve cuts it
    n = launch.draft_block(small_pair.draft)[1]
    assert n < 7 and (s.draft_n_max, s.draft_n_max_by_slots) == (served.draft_n_max, served.draft_n_max_by_slots) \
        == (n, [(16, 3)])
    assert s.draft_ubatch == served.draft_ubatch == 2048
    assert s.synth_rates == rates[:n]
    base = harness.base_settings(None, small_pair.target, gpu=False, parallel=4)
    s = harness.serve_drafted(base, small_pair.draft, gpu=False, rates=None)
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "-np", "4",
                       "--dry-run", "--json", "--no-ui")
    assert p.returncode == 0, p.stderr
    cpu = json.loads(p.stdout)["settings"]
    assert (s.draft_n_max, s.draft_n_max_by_slots, s.synth_rates) == (cpu["draft_n_max"], cpu["draft_n_max_by_slots"], None)


def test_sampling_speed_compares_the_top_k_pass_with_the_candidate_array(small_pair, isolated, tmp_path):
    """costs.py sampling (h200.sh's `sampling` stage): plain and drafted servers each on three paths,
    patch 0032's host pass and LLAMA_SAMPLER_NO_FAST_TOPK=1's (both with LLAMA_OUTPUT_TOPK=0: the host
    samples every row) and the graph's top-k of patch 0050 (--graph-topk 48: LLAMA_OUTPUT_TOPK=48),
    the engine's own host sampling time read from every arm's profile, and the seeded tokens compared
    between the paths (identical, or exit 1; that the sampler takes the graph's candidates is
    cuda/probes.py topk-switch's check, below); -m without -md is refused in one line."""
    out = tmp_path / "sampling.json"
    script = [sys.executable, str(REPO / "benchmarks" / "costs.py"), "sampling"]
    p = subprocess.run([*script, "-m", str(small_pair.target), "-md", str(small_pair.draft), "--n-max", "3",
                        "--synthetic", "--trials", "3", "--n-predict", "200", "--graph-topk", "48", "--json", str(out),
                        "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert [a["arm"] for a in rep["arms"]] == ["plain-fast", "plain-old", "plain-graph",
                                               "drafted-n3-fast", "drafted-n3-old", "drafted-n3-graph"]
    for a in rep["arms"]:
        assert a["decode_tps"] > 0 and len(a["runs"]) == 3 and len(a["tokens"]) == 3, a["arm"]
        # the engine prints its profile every 128 target decodes: 3 x 200 tokens reach it on both arms
        assert a["sample_ms"] is not None and a["sample_ms"] > 0 and a["profiled_decodes"] >= 128, a["arm"]
        want_env = ({"LLAMA_OUTPUT_TOPK": "0", "LLAMA_SAMPLER_NO_FAST_TOPK": "1"} if a["arm"].endswith("-old") else
                    {"LLAMA_OUTPUT_TOPK": "48"} if a["arm"].endswith("-graph") else {"LLAMA_OUTPUT_TOPK": "0"})
        assert a["env"] == want_env, a["arm"]
    assert rep["same_tokens"] is True and rep["arms"][3]["drafted"] > 0, rep["arms"][3]
    assert "sampling ms a decode, fast / old" in p.stdout and "drafted / plain" in p.stdout, p.stdout
    assert p.stdout.count("(graph / fast)") == 2 and "with the graph's top-k" in p.stdout, p.stdout
    bad = subprocess.run([*script, "-m", str(small_pair.target)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "give -m and -md together" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_kv_layout_measures_scattered_slots_in_both_layouts(small_pair, isolated, tmp_path):
    """costs.py layout (h200.sh's `layout` stage): plain and drafted servers in llama-server's divided
    KV layout and in serve's pooled one (the engine's own log says which), each answering the same
    requests pinned to consecutive and to scattered slots; the drafted arms draft; --requests above
    --slots is refused in one line."""
    out, logs = tmp_path / "layout.json", tmp_path / "logs"
    script = [sys.executable, str(REPO / "benchmarks" / "costs.py"), "layout", "-m", str(small_pair.target),
              "-md", str(small_pair.draft)]
    p = subprocess.run([*script, "--slots", "6", "--requests", "2", "--n-predict", "24", "--trials", "1",
                        "--json", str(out), "--log-dir", str(logs)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert [a["arm"] for a in rep["arms"]] == ["plain-divided", "drafted-divided", "plain-pooled", "drafted-pooled"]
    for a in rep["arms"]:
        assert a["consecutive"]["ids"] == [0, 1] and a["scattered"]["ids"] == [0, 3], a
        assert a["consecutive"]["aggregate_tps"] > 0 and a["scattered"]["decode_tps"] > 0, a
        pooled = a["arm"].endswith("-pooled")
        assert ("-kvu --kv-unified-per-slot" in a["cmd"]) == pooled, a["cmd"]
        log = (logs / f"{a['arm']}.log").read_text()
        assert f"kv_unified = '{'true' if pooled else 'false'}'" in log, a["arm"]
        assert ("draft acceptance = " in log) == a["arm"].startswith("drafted"), a["arm"]
    assert set(rep["pooled_vs_divided_scattered"]) == {"plain", "drafted"}
    assert "scattered slots, pooled / divided: plain" in p.stdout, p.stdout
    bad = subprocess.run([*script, "--slots", "2", "--requests", "3"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--requests 3 must be 1..--slots 2" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_device_topk_stage_builds_the_kernels_benchmark_against_the_engine(dspark_engine, engine_src, isolated,
                                                                           tmp_path):
    """benchmarks/h200.sh topk builds benchmarks/cuda/topk_cuda.cu with nvcc against the engine's own source
    tree (patch 0051's top-k-rows.cuh) and runs it: with no GPU here the program is built and its run
    fails on the device query, rc non-zero. A tree without the header is named in one line and
    nothing is built."""
    import os
    import shutil

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    assert Path(nvcc).exists(), "the topk stage needs nvcc (CUDA toolkit) on PATH to build topk_cuda.cu"
    assert (engine_src / "ggml" / "src" / "ggml-cuda" / "top-k-rows.cuh").exists(), engine_src
    work = tmp_path / "work"
    env = {**os.environ, **isolated, "SERVER": dspark_engine.path, "OUT": str(tmp_path / "out"), "WORK": str(work),
           "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "topk"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert (work / "topk_cuda").exists(), p.stdout + p.stderr
    assert "topk rc=" in p.stdout and "topk rc=0" not in p.stdout, p.stdout + p.stderr
    assert "topk_cuda: cudaGetDeviceProperties" in p.stderr, p.stderr

    # a tree without 0051's header: another SERVER whose cache folder has an empty src
    fake = tmp_path / "cache" / "key"
    (fake / "build" / "bin").mkdir(parents=True)
    (fake / "src").mkdir()
    (fake / "build" / "bin" / "llama-server").write_bytes(b"")  # the stage only reads its path
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "topk"],
                       env={**env, "SERVER": str(fake / "build" / "bin" / "llama-server"), "WORK": str(tmp_path / "w2")},
                       capture_output=True, text=True, timeout=120)
    assert f"stage topk: no top-k-rows.cuh under {fake / 'src'}" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "w2" / "topk_cuda").exists()


def test_device_mma_stage_checks_the_q4_K_kernels_arithmetic_against_the_engines_ggml(dspark_engine, engine_src,
                                                                                     isolated, tmp_path):
    """benchmarks/h200.sh mma: patch 0071's tensor-core Q4_K, Q5_K, Q6_K and Q8_0 kernels, first as their host emulation
    (benchmarks/cuda/mmvq_mma_emu.cpp, built with g++ against the engine's ggml): every shape's product
    within test-backend-ops' NMSE bound of ggml's dequantized one; for Q4_K and Q5_K each shape also with
    removed developer 0077's wide loads of the weights, and with the columns in block_q8_1_x8 too, whose outputs must be
    exactly the kernel's without them (a permutation of the mma's k), and staged through shared memory (0079:
    Q4_K and Q5_K exactly the kernel's, Q8_0's within 1e-5 of its unstaged outputs; developer 0080: Q6_K within 1e-5);
    developer 0087's wide Q4_K / Q5_K kernel at 9-64 columns and 1, 2 and 4 row tiles a block. The engine's source has 0071 (a
    product patch since product-46); a CPU build is named in one line and nothing on the GPU side is tried."""
    import os

    assert (engine_src / "ggml" / "include" / "ggml.h").exists(), engine_src
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, **isolated, "SERVER": dspark_engine.path, "OUT": str(out), "WORK": str(work),
           "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "mma"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert "mma emulation rc=0" in p.stdout, p.stdout + p.stderr
    lines = (out / "mma-emu.txt").read_text().splitlines()
    shapes = [ln for ln in lines if ln.startswith(("q4_K M=", "q5_K M=", "q6_K M=", "q8_0 M="))]
    assert len(shapes) == 696 and all(ln.endswith(" OK") for ln in shapes) and lines[-1] == "all OK", lines
    # Q8_0 as 0071 loads it and staged through shared memory (0079: 4 blocks a warp step, within 1e-5 of the
    # unstaged outputs, whose sums meet in another order); Q6_K at K 256, 768 and 2048, staged (developer 0080: by
    # 16-byte pieces from the boundary before each block, read back as shifted words, the 6-bit dots less 32 times
    # the columns' half sums, scaled in int; within 1e-5 of 0071's outputs) where its rows are a multiple of 16 bytes
    assert sum(ln.startswith("q8_0") and " staged" not in ln for ln in shapes) == 48, lines
    assert sum(ln.startswith("q8_0") and " staged: " in ln for ln in shapes) == 48, lines
    assert sum(ln.startswith("q6_K") and " staged" not in ln for ln in shapes) == 72, lines
    q6_staged = [ln for ln in shapes if ln.startswith("q6_K") and " staged: " in ln]
    assert len(q6_staged) == 24 and all(" K=2048 " in ln for ln in q6_staged), lines
    for t in ("q4_K", "q5_K"):  # each shape as 0071 loads it, with 0077's wide loads, with its x8 columns, and staged
        assert sum(ln.startswith(t) and " wide" not in ln and " staged" not in ln for ln in shapes) == 48, lines
        assert sum(ln.startswith(t) and " wide loads: " in ln for ln in shapes) == 48, lines
        assert sum(ln.startswith(t) and " wide loads, x8 columns: " in ln for ln in shapes) == 48, lines
        assert sum(ln.startswith(t) and " staged: " in ln for ln in shapes) == 48, lines
        # developer 0087's wide kernel (9-64 columns), block by block: 20 shapes at each of 1, 2 and 4 row tiles a block
        for tiles, per_step in ((1, 4), (2, 4), (4, 2)):
            wide = f" wide, {tiles} row tiles and {per_step} super-blocks a step: "
            assert sum(ln.startswith(t) and wide in ln for ln in shapes) == 20, lines
    assert sorted({int(ln.split(" N=")[1].split()[0]) for ln in shapes if " wide, " in ln}) == [9, 16, 17, 33, 64], lines
    assert not any("differs" in ln for ln in shapes)
    nmse = [float(ln.split("nmse ")[1].split()[0]) for ln in shapes]
    assert 0 < max(nmse) < 5e-4, nmse  # q8_1 activations: not exact, and within the bound
    assert "stage mma: the engine has no patch 0071" not in p.stdout, p.stdout
    assert "no libggml-cuda.so: not a CUDA build, so nothing to run on a GPU" in p.stdout, p.stdout
    assert not (out / "mma-test.txt").exists()


def _stall(sub: str, pair, *args: str, timeout: int) -> subprocess.CompletedProcess:
    """benchmarks/stall.py SUB on ``pair`` (its -m / -md) with ``args``, its output captured."""
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "stall.py"), sub, "-m", str(pair.target),
                           "-md", str(pair.draft), *args], capture_output=True, text=True, timeout=timeout)


def test_stall_first_measures_the_wait_after_a_requests_first_token(trained_pair, isolated, tmp_path):
    """stall.py first: one request at a time on each arm (after an untimed one), plain and drafted
    taking turns (answers long enough that the trained pair's 1-2 ms plain steps, which a loaded
    machine's HTTP thread may send in bursts, still leave waits over 1 ms); each request's TTFT, first wait, longest later and usual wait, the ratios, and
    with --profile the phases of each request's first generating step (one a timed request: the
    untimed request's steps left out) beside its later ones; the drafted arm's hold the draft block."""
    from ggufdspark import engine

    out = tmp_path / "first.json"
    p = _stall("first", trained_pair, "--prompt-tokens", "150-250", "--slot-ctx", "1024", "--answer", "160",
               "--rounds", "3", "--profile", "--json", str(out), "--log-dir", str(tmp_path / "logs"), timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert set(rep["rounds"]) == {"plain", "drafted"} and all(len(r) == 3 for r in rep["rounds"].values())
    for arm, rounds in rep["rounds"].items():
        for r in rounds:
            assert r["ttft_s"] > 0 and r["first_wait_s"] > 0 and r["usual_wait_s"] > 0, (arm, r)
            assert r["longest_later_s"] >= r["usual_wait_s"], (arm, r)
    assert set(rep["ratios"]) == {"ttft_s", "first_wait_s", "longest_later_s", "usual_wait_s"}
    # a prompt length drawn a round from the range, the same for both arms; the slots' context as asked
    lengths = [r["prompt_tokens"] for r in rep["rounds"]["plain"]]
    assert lengths == [r["prompt_tokens"] for r in rep["rounds"]["drafted"]] and len(set(lengths)) > 1, lengths
    assert all(150 <= n <= 250 for n in lengths), lengths
    assert "n_ctx_slot = 1024," in (tmp_path / "logs" / "plain.log").read_text(), "the plain server's slot context"
    # what the figure came from: the command, this checkout, the engine build and the device it saw
    prov = rep["provenance"]
    assert prov["command"][:2] == [str(REPO / "benchmarks" / "stall.py"), "first"], prov["command"]
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert prov["checkout"].removesuffix("+dirty") == head.stdout.strip(), prov["checkout"]
    assert prov["engine"]["patches"] == len(engine.patch_files()) and prov["engine"]["commit"] == "0c1e570", prov
    assert any(d.startswith("CPU: ") for d in prov["devices"]), prov["devices"]
    assert "drafted / plain: ttft" in p.stdout
    steps = rep["first_steps"]
    assert all(steps[arm]["first"]["count"] == 3 for arm in ("plain", "drafted")), steps
    assert steps["drafted"]["first"]["phase_means_ms"]["dft_launch"] > 0
    assert steps["plain"]["later"]["phase_means_ms"]["dft_launch"] == 0

    # an answer of one chunk has no wait to measure: one line, exit 1
    p = _stall("first", trained_pair, "--prompt-tokens", "16", "--answer", "1", "--rounds", "1",
               "--log-dir", str(tmp_path / "short"), timeout=600)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("give --answer more than 1"), p.stderr
    # a range upside down: refused in one line before any server starts
    p = _stall("first", trained_pair, "--prompt-tokens", "300-200", timeout=60)
    assert p.returncode == 2 and "'300-200': expected 0 < LO <= HI" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_device_stall_stages_run_their_scripts_with_the_device_settings(trained_pair, dspark_engine, isolated,
                                                                         tmp_path):
    """benchmarks/h200.sh stall and firstwait on CPU with the trained pair: their own command lines
    (the published profile as synthetic acceptance, PROFILE=1 as --profile, STALL_ENVS as one more
    drafted arm, FIRST_PROMPT and FIRST_CTX as first's prompt range and slot context), each JSON in
    OUT under its stage's name."""
    import os

    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(trained_pair.target), "DRAFT": str(trained_pair.draft),
           "SERVER": dspark_engine.path, "GPU": "", "OUT": str(out), "WORK": str(tmp_path / "work"),
           "PYTHON": sys.executable, "ROUNDS": "1", "PROFILE": "1", "STALL_ENVS": "LLAMA_SPEC_INJECT_LATE=1",
           "STREAMS": "1", "JOIN": "200", "FIRST_PROMPT": "80-120", "FIRST_ANSWER": "160", "FIRST_CTX": "512"}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "stall", "firstwait"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    late = "drafted LLAMA_SPEC_INJECT_LATE=1"
    for name, key in (("stall-a", "join_steps"), ("firstwait-a", "first_steps")):
        rep = json.loads((out / f"{name}.json").read_text())
        assert set(rep["rounds"]) == {"plain", "drafted", late}, (name, rep["rounds"].keys())
        assert rep["args"]["synthetic_rates"].startswith("0.7838"), rep["args"]  # the published profile
        assert rep["settings"][late]["env"]["LLAMA_SPEC_PROFILE_SLOW"] == "0" and rep[key], (name, rep[key])
    first = json.loads((out / "firstwait-a.json").read_text())["args"]
    assert first["prompt_tokens"] == [80, 120] and first["slot_ctx"] == 512, first  # FIRST_PROMPT, FIRST_CTX


def test_graph_topk_switch_check_passes_on_the_engine(dspark_engine, engine_src, isolated, tmp_path):
    """benchmarks/cuda/probes.py topk-switch checks patch 0052 (the graph's top-k only for a step whose
    sampler can use it) from the engine's own log, with LLAMA_OUTPUT_TOPK=64, with 0 and unset (on a
    CPU the engine's default is none), on a plain and a drafted server: it passes on the engine this
    suite runs, the sampler takes the graph's candidates exactly where it can (top-k 40 and 20 on both
    servers), never with 0 or unset, and the tokens are the same all three ways."""
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cuda" / "probes.py"), "topk-switch", "--server",
                        dspark_engine.path, "--work", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert "llama_set_output_topk" in (engine_src / "src" / "llama-ext.h").read_text(), engine_src
    assert p.returncode == 0 and p.stdout.rstrip().endswith("OK"), p.stdout[-3000:] + p.stderr[-2000:]
    assert p.stdout.count("candidates taken 1") == 4, p.stdout  # top-k 40 and 20, plain and drafted
    for k in ("0    ", "unset"):  # none taken with 0 and, on this CPU engine, with the variable unset
        assert f"plain    LLAMA_OUTPUT_TOPK={k} top-k 40         switches -, candidates taken 0" in p.stdout, p.stdout
    assert "Traceback" not in p.stderr


def test_result_record_wraps_a_scripts_json_for_the_results_folder(tmp_path):
    """scripts/result_record.py: the results folder's keys around the script's JSON, absolute paths cut
    to file names, token ids and logs dropped, per-request records kept as one table (columns: the
    union of the records' keys; floats to 6 decimals), the printed table kept; an existing summary is
    kept without --force, and a missing input is named in one line."""
    raw = tmp_path / "load.json"
    records = [{"index": 0, "prompt": "/work/p/long-1", "ttft_s": 0.0201234567, "decode_tps": 812.5},
               {"index": 1, "prompt": "short-2", "ttft_s": 0.019, "decode_tps": None, "cache_n": 7}]
    raw.write_text(json.dumps({"command": "bench --load -m /work/x/.devwork/full/target-F16.gguf --json /root/out/l.json",
                               "arms": {"plain": [{"level": 1, "aggregate_tps": 359.7, "records": records,
                                                   "tokens": [[1, 2, 3]], "log_tail": "srv ..."}]}}))
    (tmp_path / "load.txt").write_text("clients arm agg\n1 plain 359.7\n")
    out = tmp_path / "r" / "load-256.json"
    out.parent.mkdir()
    script = [sys.executable, str(REPO / "scripts" / "result_record.py"), str(raw), "-o", str(out), "--what", "w",
              "--command", "c", "--engine", "e", "--date", "2026-12-03", "--table", str(tmp_path / "load.txt")]
    p = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rec = json.loads(out.read_text())
    assert list(rec) == ["result", "what", "command", "date", "hardware", "engine", "pair", "acceptance", "commit",
                         "raw", "outputs"]
    data = rec["outputs"]["data"]
    assert data["command"] == "bench --load -m target-F16.gguf --json l.json", data["command"]
    assert data["arms"]["plain"] == [{"level": 1, "aggregate_tps": 359.7, "records": {
        "columns": ["index", "prompt", "ttft_s", "decode_tps", "cache_n"],
        "rows": [[0, "long-1", 0.020123, 812.5, None], [1, "short-2", 0.019, None, 7]]}}], data["arms"]
    assert rec["outputs"]["table"].endswith("1 plain 359.7\n") and rec["result"] == "load-256.json"
    before = out.read_text()
    again = subprocess.run(script, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and f"{out} exists (--force overwrites it)" in again.stderr, again.stderr
    assert out.read_text() == before
    gone = subprocess.run([*script[:2], str(tmp_path / "nope.json"), *script[3:], "--force"], capture_output=True,
                          text=True, timeout=60)
    assert gone.returncode == 1 and "nope.json" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr
    assert out.read_text() == before


def test_gpu_timeline_finds_the_idle_device_and_the_host_call_over_it(tmp_path):
    """benchmarks/cuda/probes.py timeline on a trace in benchmarks/cuda/cupti_trace.cpp's format: two bursts of
    device work 50 ms apart (bursts split at 5 ms of idle device); in the first, 2.6 ms of kernels and a copy over 3.1 ms, one 500 us gap
    between a kernel on stream 7 and one on stream 13 with the host in a stream synchronisation over
    490 us of it, so 98% of that kind of gap is spent inside CUDA; a copy's 300 us gap with no call
    over it is host work outside CUDA. The traced command line has -md: the trace is named drafted.
    Without runtime calls recorded no share is claimed. Each stream's kernels by name and time. A
    missing trace is one line and exit 2; a trace with no device records is reported and left out."""
    trace = tmp_path / "prefill-123.csv"
    trace.write_text(
        "#,/x/llama-server -m t.gguf -md d.gguf --port 0\n"
        "K,1000000,2000000,7,_Z12rms_norm_f32ILi1024EEvPKf\n"
        "K,2000000,3000000,7,void mul_mat_f<float>(int)\n"
        "R,3000000,3490000,5,cudaStreamSynchronize_v3020\n"
        "Y,3000000,3490000,7,3\n"
        "K,3500000,4000000,13,_ZN7cutlass6KernelIfEEvv\n"
        "C,4000000,4100000,7,1,4096\n"
        "R,4150000,4200000,5,cudaMemcpyAsync_v3020\n"
        "C,4400000,4500000,13,1,64\n"
        "K,54100000,55100000,7,k2\n"
        "K,55100000,55105000,7,k2\n"
        "K,55105000,55110000,7,k2\n")
    probe = tmp_path / "prefill-124.csv"
    probe.write_text("#,/x/llama-server --version\n")
    script = [sys.executable, str(REPO / "benchmarks" / "cuda" / "probes.py"), "timeline"]
    out = tmp_path / "t.json"
    p = subprocess.run([*script, str(trace), str(probe), "--min-records", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "prefill-124.csv: no device records (/x/llama-server --version)" in p.stdout, p.stdout
    (name, res), = json.loads(out.read_text()).items()
    assert name == "prefill-123 (drafted)" and res["cmdline"].endswith("--port 0")
    first, second = res["bursts"]
    assert math.isclose(first["span_ms"], 3.5) and math.isclose(first["busy_ms"], 2.7)
    assert math.isclose(first["idle_ms"], 0.8) and first["gaps"] == 2 and first["records"] == 5
    assert first["streams"] == {"7": {"kernel_ms": 2.0, "kernels": 2}, "13": {"kernel_ms": 0.5, "kernels": 1}}
    assert first["kernel_names"] == {"7": {"rms_norm_f32": {"ms": 1.0, "n": 1}, "mul_mat_f": {"ms": 1.0, "n": 1}},
                                     "13": {"cutlass": {"ms": 0.5, "n": 1}}}
    classes = first["gap_classes"]
    assert list(classes) == ["stream 7 -> stream 13", "copy HtoD 7 -> copy HtoD 13"]
    assert classes["stream 7 -> stream 13"]["n"] == 1 and math.isclose(classes["stream 7 -> stream 13"]["ms"], 0.5)
    assert math.isclose(classes["stream 7 -> stream 13"]["in_calls_ms"], 0.49)
    assert math.isclose(classes["copy HtoD 7 -> copy HtoD 13"]["ms"], 0.3)
    assert math.isclose(classes["copy HtoD 7 -> copy HtoD 13"]["in_calls_ms"], 0.05)
    gap, second_gap = first["longest_gaps"]
    assert second_gap["us"] == 300.0 and second_gap["host"] == "cudaMemcpyAsync_v3020 (50 us of it)"
    assert gap["us"] == 500.0 and gap["at_ms"] == 2.0
    assert gap["before"] == "mul_mat_f (stream 7)" and gap["after"] == "cutlass (stream 13)"
    assert gap["host"] == "cudaStreamSynchronize_v3020 (490 us of it); wait: stream sync on stream 7 (490 us of it)"
    assert second["records"] == 3 and second["gaps"] == 0 and math.isclose(second["busy_share"], 1.0)
    # each kernel's launches by how long they ran: k2's 1 ms launch apart from its two of 5 us
    assert first["kernel_bins"]["7"]["rms_norm_f32"] == {">=512 us": {"ms": 1.0, "n": 1}}
    assert second["kernel_bins"] == {"7": {"k2": {"4-8 us": {"ms": 0.01, "n": 2}, ">=512 us": {"ms": 1.0, "n": 1}}}}
    assert "0      3.50      2.70      0.80  77.1%" in p.stdout, p.stdout
    assert "stream 7 -> stream 13                     0.50 ms  x1      (500 us each; 98% in runtime calls)" in p.stdout, p.stdout
    assert "copy HtoD 7 -> copy HtoD 13               0.30 ms  x1      (300 us each; 17% in runtime calls)" in p.stdout, p.stdout
    # each stream's kernels by time, pooled over the bursts shown (k2 in the second burst)
    assert "stream 7's kernels over these bursts by time (3.01 ms, 5 launches):" in p.stdout, p.stdout
    assert "   k2                                            1.01 ms  x3       (336.7 us each, 34%)\n" \
           "      4-8 us x2 0.01 ms, >=512 us x1 1.00 ms\n" in p.stdout, p.stdout
    assert "   cutlass                                       0.50 ms  x1       (500.0 us each, 100%)" in p.stdout, p.stdout

    # the same device work without runtime calls: no share claimed
    bare = tmp_path / "bare.csv"
    bare.write_text("".join(l for l in trace.read_text().splitlines(True) if not l.startswith("R,")))
    q = subprocess.run([*script, str(bare), "--min-records", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 0, q.stderr
    assert "stream 7 -> stream 13                     0.50 ms  x1      (500 us each)\n" in q.stdout, q.stdout
    (_, res2), = json.loads(out.read_text()).items()
    assert all("in_calls_ms" not in v for v in res2["bursts"][0]["gap_classes"].values())

    bad = subprocess.run([*script, str(tmp_path / "none.csv")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == f"probes.py timeline: no trace at {tmp_path / 'none.csv'}"
    empty = subprocess.run([*script, str(probe)], capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "no trace holds device records" in empty.stderr


def test_a_drafted_arm_on_cuda_takes_serves_drafter_ubatch(dspark_engine, small_pair):
    """The benchmarks' drafted arms run the draft as ``serve`` does on that backend: with ``--gpu`` an
    engine with patch 0037 gets ``--spec-draft-ubatch 2048`` (the CUDA row's drafter n_ubatch: a
    step's processed rows in one drafter decode), as ``serve``'s own decision for that engine gives it;
    the plain arm has no draft flag, and the CPU row none either (its drafter takes the target's -ub)."""
    from benchmarks import harness
    from ggufdspark import hardware, launch
    from ggufdspark.devices import DeviceReport

    assert hardware.has_patch(dspark_engine, hardware.DRAFT_UBATCH), "the engine under test lacks patch 0037"
    serve = launch.decide(DeviceReport(backend="cuda"), dspark_engine, parallel=8)
    assert serve.draft_ubatch == hardware.DEFAULTS["cuda"].draft_ubatch == 2048

    base = harness.base_settings(dspark_engine.path, small_pair.target, gpu=True, parallel=8, ctx_per_slot=4200)
    cmd = " ".join(harness.drafted(base, small_pair.draft, 7, None).redacted())
    assert "--spec-draft-ubatch 2048" in cmd and "--spec-draft-n-max 7" in cmd, cmd
    assert "--spec-draft-ubatch" not in " ".join(base.redacted()) and "-md" not in base.redacted()

    cpu = harness.base_settings(dspark_engine.path, small_pair.target, gpu=False, parallel=8, ctx_per_slot=4200)
    assert "--spec-draft-ubatch" not in harness.drafted(cpu, small_pair.draft, 3, None).redacted()


def test_device_timeline_stage_builds_the_tracer_and_says_when_nothing_was_traced(dspark_engine, small_pair,
                                                                                  isolated, tmp_path):
    """benchmarks/h200.sh timeline builds benchmarks/cuda/cupti_trace.cpp with nvcc against CUPTI (here the
    toolkit's own, found through nvcc's dry run) into a library that exports CUDA's injection entry
    point, then runs the prefill and decode8 (8 requests at once) parts with every server traced: on
    this CPU build no process initialises CUDA, so no trace is written and the stage says so in one
    line each. A TIMELINE part it
    does not know is named in one line and nothing runs."""
    import os
    import shutil

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    assert Path(nvcc).exists(), "the timeline stage needs nvcc (CUDA toolkit with CUPTI) on PATH to build cupti_trace.cpp"
    work, out = tmp_path / "work", tmp_path / "out"
    env = {**os.environ, **isolated, "SERVER": dspark_engine.path, "OUT": str(out), "WORK": str(work),
           "PYTHON": sys.executable, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft), "GPU": "",
           "TIMELINE": "prefill decode8", "PREFILL_TOKENS": "64", "N_MAX": "3"}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "timeline"], env=env, capture_output=True,
                       text=True, timeout=600)
    lib = work / "libcupti_trace.so"
    assert lib.exists(), p.stdout + p.stderr
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    assert " T InitializeInjection" in syms, syms
    assert "stage timeline: prefill wrote no trace (no process initialised CUDA)" in p.stdout, p.stdout + p.stderr
    assert (out / "timeline-prefill-speed.json").is_file(), p.stdout  # the prefill itself ran
    # decode8: 8 requests at once on 8-slot servers, plain and drafted
    assert "stage timeline: decode8 wrote no trace (no process initialised CUDA)" in p.stdout, p.stdout + p.stderr
    d8 = json.loads((out / "timeline-decode8-speed.json").read_text())
    assert d8["provenance"]["command"][:2] == ["benchmarks/speed.py", "decode"], d8["provenance"]
    assert d8["provenance"]["command"][d8["provenance"]["command"].index("--concurrency") + 1] == "8"

    bad = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "timeline"], env={**env, "TIMELINE": "warmup"},
                         capture_output=True, text=True, timeout=600)
    assert "stage timeline: TIMELINE part warmup: expected prefill, decode or decode8" in bad.stdout, bad.stdout + bad.stderr
    assert not list((work / "tl").glob("*.csv")) and not (out / "timeline-warmup.json").exists()


def test_carry_script_packs_the_pinned_tree_for_the_device(tmp_path):
    """benchmarks/h200.sh carry writes .carry/llama.cpp.tar.xz beside the script's checkout: the pinned
    tree ggufdspark fetched, under llama.cpp/ (where the device stages extract it), its sources and the
    chat page's tools/ui, without models/ or docs/. Where the interpreter has no ggufdspark it fails
    and leaves no archive."""
    import os
    import shutil
    import tarfile

    root = tmp_path / "checkout"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(REPO / "benchmarks" / "h200.sh", root / "benchmarks" / "h200.sh")
    # xz's fastest level (tar -J reads XZ_OPT): the archive's contents are checked, not its size (3 s, not 25)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO), "XZ_OPT": "-0"}
    p = subprocess.run(["bash", str(root / "benchmarks" / "h200.sh"), "carry"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    out = root / ".carry" / "llama.cpp.tar.xz"
    assert p.stdout.startswith(".carry/llama.cpp.tar.xz: ") and out.is_file(), p.stdout
    with tarfile.open(out) as t:
        names = t.getnames()
    for want in ("llama.cpp/CMakeLists.txt", "llama.cpp/src/llama-context.cpp", "llama.cpp/tools/server/server.cpp",
                 "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu"):
        assert want in names, f"{want} not in the carried tree"
    assert any(n.startswith("llama.cpp/tools/ui/") for n in names), "tools/ui (the chat page's source) left out"
    assert not any(n.startswith(("llama.cpp/models/", "llama.cpp/docs/")) for n in names), "models/ or docs/ carried"
    assert list((root / ".carry").iterdir()) == [out], "something beside the archive left in .carry"

    out.unlink()
    isolated = tmp_path / "python-without-ggufdspark"  # the same interpreter without its site-packages
    isolated.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    isolated.chmod(0o755)
    bare = subprocess.run(["bash", str(root / "benchmarks" / "h200.sh"), "carry"], capture_output=True, text=True,
                          env={**env, "PYTHON": str(isolated), "PYTHONPATH": ""}, timeout=120)
    assert bare.returncode == 1 and not out.exists(), bare.stdout + bare.stderr
    assert bare.stderr.strip() == (f"stage carry: {isolated} cannot fetch the pinned tree through ggufdspark "
                                   "(PYTHON: an interpreter that has it)"), bare.stderr


def test_device_script_takes_every_llama_server_command_line_from_serve():
    """benchmarks/h200.sh writes no llama-server command line of its own: its benchmark scripts and
    ggufdspark's verbs build theirs through ggufdspark.launch (as `serve` does), and the one server it
    starts itself (the verbose stage) runs what `ggufdspark serve --dry-run` prints. So none of
    llama-server's model, draft, offload or slot flags is in the script, the engine's path ($(BIN))
    only ever goes to a --server option, GGUFDSPARK_SERVER or a dirname (its tools: llama-bench and
    test-backend-ops, which are not llama-server), and the verbose stage runs the dry run's argv."""
    import re

    text = (REPO / "benchmarks" / "h200.sh").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    server_flags = re.compile(r"(?<![\w-])(-ngl|-ngld|-fa|-ot|-np|-md|-kvu|-ctk|-ctv|--spec-type|--spec-draft-[\w-]+"
                              r"|--n-gpu-layers\w*|--flash-attn|--parallel|--ctx-size|--kv-unified[\w-]*)(?![\w-])")
    own = [(line, m[0]) for line in code.splitlines() if "llama-bench" not in line
           for m in server_flags.finditer(line.replace('-md "$D"', ""))]  # -md: the scripts' own option for the draft
    assert not own, f"llama-server flags written in h200.sh: {own}"
    uses = [code[max(0, m.start() - 20):m.start()] for m in re.finditer(r'"\$\(BIN\)"', code)]
    assert uses and all(re.search(r"(--server |dirname |GGUFDSPARK_SERVER=)$", u) for u in uses), uses
    assert re.search(r'line=\$\(\$py -m ggufdspark serve -m "\$T" -md "\$D" --server "\$\(BIN\)" .*--dry-run -- -v\)', code)
    assert 'eval "argv=($line)"' in code and '"${argv[@]}" > "$W/verbose.log"' in code


def test_stall_join_makes_a_prompt_meet_the_streams_plain_and_drafted(small_pair, isolated, tmp_path):
    """stall.py join: both arms started as serve starts them, a round each in turn; each round's
    join TTFT and the streams' longest wait across the join (at least the join step itself: the
    profiled join steps say how long that was), the ratios, and with --profile the join steps'
    phases (the drafted arm's hold the drafter's injection, the plain arm's none)."""
    out = tmp_path / "stall.json"
    p = _stall("join", small_pair, "--streams", "2", "--join-tokens", "400", "--answer", "1500",
               "--rounds", "2", "--profile", "--json", str(out), "--log-dir", str(tmp_path / "logs"), timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert set(rep["rounds"]) == {"plain", "drafted"} and all(len(r) == 2 for r in rep["rounds"].values())
    for arm, rounds in rep["rounds"].items():
        for r in rounds:
            assert r["ttft_s"] > 0 and r["stall_s"] > 0 and all(n >= 32 for n in r["stream_tokens"]), (arm, r)
    assert rep["settings"]["drafted"]["draft"] and not rep["settings"]["plain"]["draft"]
    assert rep["settings"]["drafted"]["env"]["LLAMA_SPEC_PROFILE_SLOW"] == "0"
    assert set(rep["ratios"]) == {"ttft_s", "stall_s"} and "drafted / plain: ttft" in p.stdout
    steps = rep["join_steps"]
    assert steps["drafted"]["phase_means_ms"]["inj_launch"] > 0 and steps["plain"]["injection_rows_mean"] == 0
    # a stream waited through the join step: the step's chunk is sent inside it, so the wait that
    # ends there and the one that starts there cover the step between them, and the longer one is at
    # least half of it (0.9 failed once on a loaded CI machine: a 42 ms step split 36 + 6 ms by a
    # send before the drafter's injection). The usual wait is a few ms: a missed join fails this
    for arm, s in steps.items():
        assert max(r["stall_s"] for r in rep["rounds"][arm]) * 1000 >= s["wall_p50_ms"] * 0.5, (arm, s, rep["rounds"][arm])

    assert all(s["count"] == 2 for s in steps.values()), steps  # one join step a round (a 400-row prompt)
    # a second run into the same logs (appended to) counts its own steps only; --drafted-envs adds a
    # drafted arm under an engine switch (here the injection launched after the target's decode)
    p = _stall("join", small_pair, "--streams", "2", "--join-tokens", "400", "--answer", "1500",
               "--rounds", "1", "--profile", "--json", str(out), "--log-dir", str(tmp_path / "logs"),
               "--drafted-envs", "LLAMA_SPEC_INJECT_LATE=1", timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    late = "drafted LLAMA_SPEC_INJECT_LATE=1"
    assert set(rep["join_steps"]) == {"plain", "drafted", late}, rep["join_steps"]
    assert all(s["count"] == 1 for s in rep["join_steps"].values())
    assert rep["settings"][late]["env"]["LLAMA_SPEC_INJECT_LATE"] == "1" and rep["settings"][late]["draft"]
    assert "LLAMA_SPEC_INJECT_LATE" not in rep["settings"]["drafted"]["env"]
    assert set(rep["ratios_by_arm"]) == {"drafted", late} and f"{late} / plain: ttft" in p.stdout
    assert (tmp_path / "logs" / "drafted-LLAMA_SPEC_INJECT_LATE=1.log").stat().st_size > 0

    # a --drafted-envs group that is not NAME=VALUE: one line naming the option and the item, exit 1,
    # no server started
    p = _stall("join", small_pair, "--drafted-envs", "LLAMA_SPEC_INJECT_LATE=1;LATE",
               "--log-dir", str(tmp_path / "bad"), timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == "stall.py join: --drafted-envs: 'LATE' is not NAME=VALUE", p.stderr
    assert not list((tmp_path / "bad").glob("*.log")), list((tmp_path / "bad").iterdir())

    # streams that end before the prompt joins measure nothing: one line, exit 1
    p = _stall("join", small_pair, "--streams", "1", "--join-tokens", "64", "--answer", "32",
               "--rounds", "1", "--log-dir", str(tmp_path / "short"), timeout=600)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("a stream ended before the joining prompt's first token: "
                                                      "give --answer more than 32"), p.stderr


def test_ncu_summary_reads_nsight_computes_details_csv(tmp_path):
    """benchmarks/cuda/probes.py ncu on a CSV in the layout of `ncu --csv --page details` (Nsight Compute cannot
    run here; h200.sh's ncu stage writes these on the GPU): ncu's own lines before the header are skipped, each
    launch ID's metrics are gathered, a kernel's launches give the median of each metric (durations in ns and us
    both read as us, thousands separators read), the three stall reasons with most cycles come out in order,
    and another kernel of the same file is its own row. A file with no launch is reported; a missing one is
    one line and exit 2, as is a set of files none of which holds a launch."""
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
            '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')

    def rows(launch, kernel, grid, duration, unit, occupancy, stalls):
        pre = f'"{launch}","77","test-backend-ops","h","{kernel}","1","7","(32, 8, 1)","{grid}","0","9.0",'
        out = [pre + f'"GPU Speed Of Light Throughput","Duration","{unit}","{duration}"',
               pre + '"GPU Speed Of Light Throughput","Memory Throughput","%","41.5"',
               pre + '"GPU Speed Of Light Throughput","DRAM Throughput","%","30.25"',
               pre + '"GPU Speed Of Light Throughput","Compute (SM) Throughput","%","12.0"',
               pre + '"Launch Statistics","Registers Per Thread","register/thread","128"',
               pre + '"Launch Statistics","Waves Per SM","","1.45"',
               pre + '"Occupancy","Theoretical Occupancy","%","25"',
               pre + f'"Occupancy","Achieved Occupancy","%","{occupancy}"',
               pre + '"Warp State Statistics","Warp Cycles Per Issued Instruction","cycle","1,234.5"']
        out += [pre + f'"Command line profiler metrics","smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio",'
                      f'"inst","{v}"' for r, v in stalls.items()]
        return "\n".join(out) + "\n"

    stalls = {"long_scoreboard": 9.5, "barrier": 2.0, "wait": 1.0, "math_pipe_throttle": 0.5}
    mma = "void mul_mat_vec_q4_K_mma<(ggml_type)12, 8, false, 1>(const void *, const void *, float *, int)"
    a = tmp_path / "q4_K-6144x2048-n8.csv"
    a.write_text("==PROF== Connected to process 77\n==PROF== Profiling \"mul_mat_vec_q4_K_mma\": 0%\n" + head
                 + rows(1, mma, "(384, 1, 1)", "12,500", "nsecond", 20.0, stalls)
                 + rows(2, mma, "(384, 1, 1)", "11.5", "usecond", 22.0, dict(stalls, long_scoreboard=8.5))
                 + rows(3, mma, "(384, 1, 1)", "13.0", "usecond", 18.0, stalls)
                 + rows(4, "_Z13quantize_q8_1PKfPvl", "(8, 1, 1)", "2.0", "usecond", 60.0, {"wait": 3.0}))
    empty = tmp_path / "q4_K-512x2048-n8.csv"
    empty.write_text("==PROF== Connected to process 78\n==PROF== Disconnected from process 78\n")
    script = [sys.executable, str(REPO / "benchmarks" / "cuda" / "probes.py"), "ncu"]
    out = tmp_path / "ncu.json"
    p = subprocess.run([*script, str(a), str(empty), "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "q4_K-512x2048-n8.csv: no kernel profiled" in p.stdout, p.stdout
    summary = json.loads(out.read_text())
    assert list(summary) == ["q4_K-6144x2048-n8"]
    mma_row, quant_row = summary["q4_K-6144x2048-n8"]
    assert mma_row["kernel"] == "mul_mat_vec_q4_K_mma" and mma_row["launches"] == 3 and mma_row["grid"] == "(384, 1, 1)"
    assert mma_row["duration_us"] == 12.5 and mma_row["achieved_occupancy_pct"] == 20.0
    assert mma_row["registers"] == 128 and mma_row["waves"] == 1.45 and mma_row["cycles_per_issue"] == 1234.5
    assert mma_row["dram_pct"] == 30.25 and mma_row["theoretical_occupancy_pct"] == 25.0
    assert list(mma_row["top_stalls"].items()) == [("long_scoreboard", 9.5), ("barrier", 2.0), ("wait", 1.0)]
    assert quant_row["kernel"] == "quantize_q8_1" and quant_row["launches"] == 1 and quant_row["duration_us"] == 2.0
    assert "mul_mat_vec_q4_K_mma" in p.stdout and "12.50 us  regs   128" in p.stdout, p.stdout
    assert "stalls: long_scoreboard 9.5, barrier 2.0, wait 1.0  (x3)" in p.stdout, p.stdout

    gone = subprocess.run([*script, str(tmp_path / "none.csv")], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and gone.stderr.strip() == f"probes.py ncu: no CSV at {tmp_path / 'none.csv'}"
    nothing = subprocess.run([*script, str(empty)], capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "no CSV holds a profiled kernel" in nothing.stderr


def test_device_script_packs_each_stages_files_with_pack_out(dspark_engine, engine_src, isolated, tmp_path):
    """benchmarks/h200.sh with PACK_OUT=1 (the device tool brings back at most 8 files a call): once a stage
    ends, its files in OUT are in OUT/results.tar and OUT holds nothing else; a second stage's files are
    appended to the same archive. Without PACK_OUT the files stay where the stage wrote them (the mma
    test above)."""
    import os
    import tarfile

    assert (engine_src / "ggml" / "include" / "ggml.h").exists(), engine_src
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, **isolated, "SERVER": dspark_engine.path, "OUT": str(out), "WORK": str(work),
           "PYTHON": sys.executable, "PACK_OUT": "1"}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "mma", "mma"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.stdout.count("mma emulation rc=0") == 2, p.stdout + p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["results.tar"]
    with tarfile.open(out / "results.tar") as tar:
        names = tar.getnames()
        emu = tar.extractfile("mma-emu.txt").read().decode()
    assert names == ["mma-emu.txt", "mma-emu.txt"], names  # one entry a stage, appended
    assert emu.rstrip().endswith("all OK"), emu[-200:]


def test_decode_speed_refuses_lengths_past_the_drafters_block(small_pair, isolated, tmp_path):
    """speed.py decode: a draft length the drafter cannot make (past its block) is refused in one line
    naming the draft file and its longest draft, before any server starts (the engine would refuse it
    at the server's start, mid-run); so is a length that is not a number."""
    from ggufdspark import launch

    longest = launch.longest_draft(small_pair.draft)
    assert longest, small_pair.draft
    for lengths, want in [(f"3,{longest + 1}", f"{small_pair.draft} drafts at most {longest} tokens"),
                          ("3,x", "--lengths '3,x': expected draft lengths")]:
        logs = tmp_path / f"logs-{lengths}"
        p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speed.py"), "decode", "-m", str(small_pair.target),
                            "-md", str(small_pair.draft), "--lengths", lengths, "--json", str(tmp_path / "speed.json"),
                            "--log-dir", str(logs)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and want in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not logs.exists() and not (tmp_path / "speed.json").exists()


def test_device_mma_stage_runs_only_the_parts_asked_for(dspark_engine, engine_src, isolated, tmp_path):
    """benchmarks/h200.sh mma with MMA_PARTS (a device call measures what is new, in its 600 s): without
    emu no emulation is built or run; a part it does not know is named in one line and the stage does
    nothing else (the next stage still runs)."""
    import os

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, **isolated, "SERVER": dspark_engine.path, "OUT": str(out), "WORK": str(work),
           "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "mma"], env={**env, "MMA_PARTS": "test perf"},
                       capture_output=True, text=True, timeout=300)
    assert "mma emulation" not in p.stdout and not (work / "mmvq_mma_emu").exists(), p.stdout + p.stderr
    assert "no libggml-cuda.so: not a CUDA build, so nothing to run on a GPU" in p.stdout, p.stdout
    assert not (out / "mma-emu.txt").exists()
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "mma", "mma"],
                       env={**env, "MMA_PARTS": "emu perfs"}, capture_output=True, text=True, timeout=300)
    assert p.stdout.count("stage mma: MMA_PARTS part 'perfs': expected emu, test or perf") == 2, p.stdout
    assert "mma emulation" not in p.stdout and "no libggml-cuda.so" not in p.stdout, p.stdout


def test_ncu_summary_reads_a_csv_nsight_compute_wrote_on_the_h100(tmp_path):
    """probes.py ncu on two files Nsight Compute 2025 wrote on the H100 (h200.sh's ncu stage, and the same with the
    MemoryWorkloadAnalysis section; `benchmarks/results/0c1e570-product-47-dev-0080-present/ncu/`). That ncu fills
    the rule columns after "Metric Value" only on its rules' rows, so a metric's row is shorter than the header: the
    reader first dropped every metric and printed nan for all of them. MemoryWorkloadAnalysis names a second "Memory
    Throughput" in byte/s: the percent of SpeedOfLight is the one read. Durations are checked against the file's own
    Duration rows, read here line by line."""
    folder = REPO / "benchmarks" / "results" / "0c1e570-product-47-dev-0080-present" / "ncu"
    stage, sections = folder / "q6_K-128000x2048-n8.csv", folder / "head-n8-rule.csv"
    lines = stage.read_text().splitlines()
    header = next(line for line in lines if line.startswith('"ID"'))
    metric = next(line for line in lines if '"Duration"' in line)
    assert len(next(csv.reader([metric]))) < len(next(csv.reader([header]))), "no longer the layout this test is about"
    assert '"Memory Throughput","byte/s"' in sections.read_text(), "no longer the layout this test is about"

    def durations(path):  # every launch's Duration in us, as the file says it
        out = []
        for row in csv.reader(path.read_text().splitlines()):
            if len(row) > 14 and row[12] == "Duration":
                assert row[13] in ("ns", "nsecond"), row
                out.append(float(row[14].replace(",", "")) / 1000)
        return out

    summary_path = tmp_path / "ncu.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cuda" / "probes.py"), "ncu", str(stage),
                        str(sections), "--json", str(summary_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    summary = json.loads(summary_path.read_text())
    assert "nan" not in p.stdout, p.stdout
    for path in (stage, sections):
        (row,) = summary[path.stem]
        assert row["kernel"] == "mul_mat_vec_q6_K_mma" and row["grid"] == "(8000, 1, 1)" and row["block"] == "(32, 4, 1)"
        expected = durations(path)
        assert row["launches"] == len(expected) >= 2
        assert abs(row["duration_us"] - statistics.median_high(expected)) < 1e-3
        assert row["registers"] == 154 and row["theoretical_occupancy_pct"] == 18.75
        assert 0 < row["dram_pct"] < row["memory_pct"] < 100, row  # percent, not byte/s
    assert list(summary[stage.stem][0]["top_stalls"]) == ["lg_throttle", "selected", "wait"]


def test_markov_q8_0_kernel_model_agrees_with_the_cpu_dot_and_catches_a_wrong_offset():
    """benchmarks/cuda/markov_q8_emu.py: developer 0082's Q8_0 Markov kernel modelled lane by lane on the host (the
    conditioning row quantized per 32-value block across four lanes, each lane's quarter of a markov_w2 row's block
    read as four 16-bit words, two dp4a, the block's lanes summed and scaled by both d): every row sum equals the
    CPU's Q8_0 dot at ranks 32-1024; the model with its word offset or its lane's quarter broken disagrees."""
    script = str(REPO / "benchmarks" / "cuda" / "markov_q8_emu.py")
    p = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("120 row sums, 0 differ from the CPU's"), p.stdout + p.stderr
    for mutation in ("word", "quarter"):
        m = subprocess.run([sys.executable, script, "--mutate", mutation], capture_output=True, text=True, timeout=120)
        assert m.returncode == 1 and ", 0 differ" not in m.stdout, (mutation, m.stdout)


def test_device_w2q8_stage_writes_the_draft_with_markov_w2_alone_in_q8_0_and_speed_measures_it(
        trained_pair, dspark_engine, isolated, tmp_path):
    """benchmarks/h200.sh w2q8 (developer 0082's draft): the engine's llama-quantize writes beside the draft a copy
    with markov_w2 in Q8_0 and every other matrix in the type it came in (F16; the norms F32), and says how the speed
    stage measures it; run again it keeps the file. The draft is the trained pair's, the engine this suite's (built --with-tools)."""
    import os

    from ggufdspark.gguffile.reader import read_gguf

    draft = tmp_path / "dspark-F16.gguf"
    draft.write_bytes(trained_pair.draft.read_bytes())
    env = {**os.environ, **isolated, "TARGET": str(trained_pair.target), "DRAFT": str(draft),
           "SERVER": dspark_engine.path, "GPU": "", "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
           "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "w2q8"], env=env, capture_output=True,
                       text=True, timeout=300)
    made = tmp_path / "dspark-F16-w2q8.gguf"
    assert p.returncode == 0 and f"SPEED_DRAFTS={made}" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    src, out = read_gguf(draft), read_gguf(made)
    assert set(out.tensors) == set(src.tensors), set(out.tensors) ^ set(src.tensors)
    for name, t in out.tensors.items():
        want = "Q8_0" if name == "markov_w2.weight" else src.tensors[name].type_name
        assert t.type_name == want, (name, t.type_name, want)
    assert src.tensors["markov_w2.weight"].type_name == "F16"
    assert out.get("dflash.block_count") == src.get("dflash.block_count") is not None, out.metadata.keys()
    stamp = made.stat().st_mtime_ns
    # the speed stage measures it beside the draft it came from (SPEED_DRAFTS: speed.py decode --other-drafts),
    # all arms interleaved; the w2q8 stage run again keeps its file
    p = subprocess.run(["bash", str(REPO / "benchmarks" / "h200.sh"), "w2q8", "speed"],
                       env={**env, "INTERLEAVE": "1", "LENGTHS": "3", "TRIALS": "2", "SPEED_DRAFTS": str(made)},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and made.stat().st_mtime_ns == stamp, p.stdout[-3000:] + p.stderr[-2000:]
    rows = json.loads((tmp_path / "out" / "speed.json").read_text())["results"]
    assert [(r.get("draft_n_max"), r.get("draft")) for r in rows] == [(None, None), (3, None), (3, str(made))], rows
    assert all(len(r["decode_tps_all"]) == 2 and r["decode_tps"] > 0 for r in rows), rows
    assert rows[2]["accept_length"] and f"dspark-n3 [draft {made.name}]" in p.stdout, p.stdout[-3000:]
    missing = subprocess.run([sys.executable, str(REPO / "benchmarks" / "speed.py"), "decode", "-m",
                              str(trained_pair.target), "-md", str(draft), "--lengths", "3", "--other-drafts",
                              str(tmp_path / "nope.gguf"), "--json", str(tmp_path / "s.json"), "--log-dir",
                              str(tmp_path / "logs")], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and f"{tmp_path / 'nope.gguf'}: no such file" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "s.json").exists()


def test_paired_turns_read_as_a_geometric_mean_and_an_exact_sign_test():
    """benchmarks/paired.py: the per-turn ratios' geometric mean, the turns won, and the two-sided sign
    test, against the binomial distribution summed here term by term."""
    from benchmarks import paired

    def two_sided(wins: int, n: int) -> float:
        pmf = [math.comb(n, i) * 0.5 ** n for i in range(n + 1)]
        return min(1.0, sum(q for q in pmf if q <= pmf[wins] + 1e-15))

    for wins, n in [(20, 24), (18, 24), (11, 24), (12, 24), (19, 30), (0, 5), (5, 5)]:
        assert math.isclose(paired.sign_test(wins, n), two_sided(wins, n), rel_tol=1e-9), (wins, n)
    assert paired.sign_test(20, 24) < 0.002 < 0.5 < paired.sign_test(12, 24) == 1.0
    arm, base = [102.0, 99.0, 104.0, 100.0], [100.0, 100.0, 100.0, 100.0]
    p = paired.paired(arm, base)
    assert p["faster"] == 2 and p["ties"] == 1 and p["turns"] == 4, p
    assert math.isclose(p["geomean"], statistics.geometric_mean([1.02, 0.99, 1.04, 1.0]), rel_tol=1e-12), p
    assert math.isclose(p["sign_p"], paired.sign_test(2, 3)), p
    assert "faster in 2 of 4 turns, 1 even" in paired.describe(p, "dspark-n7"), paired.describe(p, "dspark-n7")
    with pytest.raises(ValueError, match="2 turns against 1"):
        paired.paired([1.0, 2.0], [1.0])
