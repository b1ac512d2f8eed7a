"""Engine patches checked below the server: small programs built against the engine's own ggml.

The lossless tests (greedy output with the draft against the target alone) check the patch series
end to end; these check one patch's arithmetic directly, where a mistake could hide behind a model
that happens not to care.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "engine"


def _compiled(engine, src: Path, out: Path, *, llama: bool = False) -> Path:
    """``src`` compiled and linked against the engine build's ggml, and its libllama with ``llama``
    (headers from its source tree)."""
    lib = Path(engine.lib_dir)
    tree = lib.parent.parent / "src"
    incs = [tree / "ggml" / "include"] + ([tree / "include", tree / "src"] if llama else [])
    for inc, header in zip(incs, ("ggml.h", "llama.h")):
        if not (inc / header).is_file():
            pytest.fail(f"{inc}: no {header} next to the engine build {engine.path} (rebuild it with "
                        "'ggufdspark build-engine')")
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.fail("no C++ compiler (c++ or g++) on PATH: the engine's build needs one too")
    libs = (["-lllama"] if llama else []) + ["-lggml", "-lggml-base", "-lggml-cpu"]
    p = subprocess.run([cxx, "-std=c++17", "-O1", *(f"-I{i}" for i in incs), str(src), "-L", str(lib), *libs,
                        f"-Wl,-rpath,{lib}", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def test_conv_snapshots_by_set_rows_equal_one_copy_a_slot(dspark_engine, tmp_path):
    """Patches 0018 and 0033: the conv state after snapshots written by SET_ROWS equals the pinned
    one CPY a slot, for d_conv 2 and 3, 1-64 tokens (0033 takes that path for one and two tokens too),
    1 and 3 sequences, 4 and 7 slots; so does developer 0084's one SET_ROWS of d_conv-value rows a
    layer; and the comparison catches the slots in reversed order (where there is more than one)."""
    exe = _compiled(dspark_engine, HERE / "conv_snapshots.cpp", tmp_path / "conv_snapshots")
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "48 cases, 0 mismatches" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([str(exe), "--reversed"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "40 cases, 40 mismatches" in p.stdout, p.stdout + p.stderr
    # developer 0084's form (LLAMA_CONV_SNAPSHOT_ONE=1): one SET_ROWS of d_conv-value rows, read from a
    # view of bx whose rows overlap
    p = subprocess.run([str(exe), "--one"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "48 cases, 0 mismatches" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([str(exe), "--one", "--reversed"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "40 cases, 40 mismatches" in p.stdout, p.stdout + p.stderr


def test_rollback_after_a_later_ubatch_moved_the_sequence(dspark_engine, strong_conv_pair, tmp_path):
    """Patch 0019: one decode verifies 7 tokens of a sequence and then, in a second ubatch, 4 tokens
    of two others, which moves the verified sequence's cell (the program reads the cell from the
    context's recurrent memory before and after: the case must still move it, or it tests nothing);
    rolled back by 4 afterwards, its next logits equal those of a context that never saw the
    rejected tokens (with the snapshots left behind, as pinned, they differed by 37.4 against a
    largest logit of 27.7)."""
    exe = _compiled(dspark_engine, HERE / "rollback_displaced.cpp", tmp_path / "rollback_displaced", llama=True)
    p = subprocess.run([str(exe), str(strong_conv_pair.target)], capture_output=True, text=True, timeout=300)
    moved = re.search(r"cell of sequence 0: (-?\d+) -> (-?\d+)", p.stdout)
    m = re.search(r"max \|diff\| ([0-9.]+) of max \|logit\| ([0-9.]+), argmax (\d+) vs (\d+)", p.stdout)
    assert p.returncode == 0 and moved and m, p.stdout[-1000:] + p.stderr[-2000:]
    before, after = int(moved[1]), int(moved[2])
    assert before >= 0 and after >= 0 and before != after, f"the verified sequence's cell did not move ({before} -> {after})"
    diff, mag = float(m[1]), float(m[2])
    assert diff <= 1e-3 * mag and m[3] == m[4], f"after the rollback: max |diff| {diff} of max |logit| {mag}"


def test_split_takes_runs_of_slots_in_id_order_and_ends_before_a_shorter_one(dspark_engine, strong_conv_pair,
                                                                              tmp_path):
    """Patch 0046: without a unified KV cache one decode laid out as llama-server lays out a step
    (generating slots first, prompts after) splits into few ubatches. Seven 8-row verifies beside a
    prompt's 4-token tail go in one ubatch of 56 rows and the tail in one of 4 (upstream's split: each
    verify alone, then the tail); verifies of slots 0, 1, 3, 4 beside slot 2's 40 prompt tokens,
    listed last, go with 8 of its rows in one ubatch of 40, its other 32 after (upstream's: 24, 16,
    32). The ubatch sizes come from the graph's "result_norm" (every row an output); every sequence's
    last logits equal its own decode alone, either way."""
    import os

    exe = _compiled(dspark_engine, HERE / "split_runs.cpp", tmp_path / "split_runs", llama=True)

    def run(**env: str) -> dict[str, list[int]]:
        p = subprocess.run([str(exe), str(strong_conv_pair.target)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-2000:]
        diffs = re.findall(r"^(\w+): max \|diff\| ([0-9.]+) of max \|logit\| ([0-9.]+)$", p.stdout, re.M)
        assert [case for case, _, _ in diffs] == ["tail", "middle"], p.stdout
        for case, d, m in diffs:
            assert float(d) <= 1e-3 * float(m), f"{case}: max |diff| {d} of max |logit| {m} against each alone"
        return {case: [int(x) for x in sizes.split()]
                for case, sizes in re.findall(r"^(\w+):((?: \d+)+)$", p.stdout, re.M)}

    assert run() == {"tail": [56, 4], "middle": [40, 32]}
    assert run(LLAMA_SPLIT_EQUAL_BATCH_ORDER="1") == {"tail": [8] * 7 + [4], "middle": [24, 16, 32]}


def test_mmf_few_index_logic_emulated_for_the_layout_of_patch_0022():
    """Patch 0022's CUDA kernel cannot run here; its index logic (fragment mapping, k permutation,
    tails, column tiles, the k phases' sum) is replayed lane by lane by scripts/mmf_few_emulate.py.
    The (row tiles, k phases) layout the patch launches must be among those emulated."""
    repo = Path(__file__).resolve().parent.parent
    patch = next((repo / "ggufdspark" / "data" / "patches").glob("0022-*.patch"), None)
    if patch is None:
        pytest.fail("ggufdspark/data/patches has no 0022-*.patch (the few-column tensor-core kernel)")
    launched = {(int(rt), int(kp)) for rt, kp in re.findall(r"mul_mat_f_few_cuda<bf16, (\d+), (\d+)>", patch.read_text())}
    assert len(launched) == 1, launched
    p = subprocess.run([sys.executable,
                        str(repo / "scripts" / "mmf_few_emulate.py")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the emulated kernel equals the plain product" in p.stdout
    emulated = {(int(rt), int(kp)) for rt, kp in re.findall(r"RT (\d+) KP (\d+)", p.stdout)}
    assert launched <= emulated, f"variants launched but not emulated: {sorted(launched - emulated)}"
    assert re.search(r"columns 1[0-6]", p.stdout), "no case with two column tiles (9-16 columns) emulated"


def test_output_argmax_ids_and_rows_left_on_the_device(dspark_engine, strong_conv_pair, tmp_path):
    """Patch 0023: after prompts whose outputs all sit in the first of several ubatches, after a single
    sequence's verify (its rows stay on the device) and after a batch interleaving three sequences
    (rows reordered by the split), every output row's argmax taken in
    the graph is the first maximum of the row an LLAMA_OUTPUT_ARGMAX=0 context copies to the host,
    and the row fetched on request (one at a time, or all at once) is that row bit for bit. With the
    argmax off in the context under test too, every id is missing, so the check can fail."""
    exe = _compiled(dspark_engine, HERE / "output_argmax.cpp", tmp_path / "output_argmax", llama=True)
    line = re.compile(r"(\d+) rows, (\d+) argmax mismatches, (\d+) logits mismatches, (\d+) reference ids")
    p = subprocess.run([str(exe), str(strong_conv_pair.target)], capture_output=True, text=True, timeout=300)
    m = line.search(p.stdout)
    assert p.returncode == 0 and m, p.stdout[-1000:] + p.stderr[-2000:]
    rows, bad_argmax, bad_logits, ref_ids = map(int, m.groups())
    assert rows == 2 + 7 + 12 and (bad_argmax, bad_logits, ref_ids) == (0, 0, 0), p.stdout
    p = subprocess.run([str(exe), str(strong_conv_pair.target), "0"], capture_output=True, text=True, timeout=300)
    m = line.search(p.stdout)
    assert p.returncode == 0 and m, p.stdout[-1000:] + p.stderr[-2000:]
    assert int(m[2]) == rows and int(m[3]) == 0, p.stdout


def test_layers_kept_on_the_device_have_no_host_rows(dspark_engine, strong_conv_pair, tmp_path):
    """Patch 0034: a context whose tapped layer inputs stay on the device (a DSpark target's, 0026)
    keeps no host rows for them, where it used to keep a pinned n_layers x n_embd x n_batch buffer
    that nothing wrote: llama_get_embeddings_layer_inp gives NULL; taps through the host give the
    layer's rows, and again, equal, once the device path is turned off."""
    exe = _compiled(dspark_engine, HERE / "layer_inp_host.cpp", tmp_path / "layer_inp_host", llama=True)
    p = subprocess.run([str(exe), str(strong_conv_pair.target)], capture_output=True, text=True, timeout=300)
    m = re.search(r"host (\d) device (\d) again (\d) differing (\d+) nonzero (\d+)", p.stdout)
    assert p.returncode == 0 and m, p.stdout[-1000:] + p.stderr[-2000:]
    host, device, again, differing, nonzero = map(int, m.groups())
    assert host == 1 and nonzero > 0, f"the host path gave no rows: {p.stdout}"
    assert device == 0, f"a context with its taps on the device still hands out host rows: {p.stdout}"
    assert again == 1 and differing == 0, f"the host rows after the device path differ: {p.stdout}"


def test_output_argmax_server_falls_back_to_rows_where_ids_cannot_answer(strong_conv_pair, start_server, monkeypatch):
    """Patch 0023 in llama-server: greedy requests with a positive logit bias (which can lift a token
    over the graph's argmax), with a negative bias on the token the graph picks, and with n_probs
    (which reads the rows) answer exactly as a server with LLAMA_OUTPUT_ARGMAX=0, 4 slots at once;
    and the positive bias does change the output, so ignoring it would fail here."""
    import json
    import threading

    def serve(env: str) -> list[dict]:
        monkeypatch.setenv("LLAMA_OUTPUT_ARGMAX", env)
        srv = start_server(model=strong_conv_pair.target, spec_type=None, parallel=4, ctx_size=4 * 256)
        client = srv.client(timeout=300)
        out: list[dict | None] = [None] * len(bodies)

        def one(i: int) -> None:
            out[i] = client.post_json("/completion", bodies[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if alone is not None:  # the same request alone: every step's batch the same shape on both servers
            out.append(client.post_json("/completion", alone))
        srv.stop()
        return out  # type: ignore[return-value]

    alone = None
    base = {"n_predict": 24, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
    prompts = [[40 + 7 * i + k for k in range(30 + 5 * i)] for i in range(4)]
    bodies = [dict(base, prompt=p) for p in prompts]
    plain = serve("0")
    favoured = [t for t in range(20, 60) if t not in plain[0]["tokens"]][:3]
    bodies = [dict(base, prompt=prompts[0], logit_bias=[[t, 8.0] for t in favoured]),
              dict(base, prompt=prompts[1], logit_bias=[[plain[1]["tokens"][0], -3.0]]),
              dict(base, prompt=prompts[2], n_probs=3),
              dict(base, prompt=prompts[3])]
    alone = bodies[2]
    want, got = serve("0"), serve("1")
    for i, (w, g) in enumerate(zip(want[:4], got[:4])):
        assert g["tokens"] == w["tokens"], f"request {i} ({json.dumps(bodies[i])[:120]}): argmax on vs off"
    assert want[0]["tokens"] != plain[0]["tokens"], "a +8 bias on 3 tokens did not change the output: the case tests nothing"
    # n_probs reads the rows: with 4 requests joining the batch as their threads arrive, the same ids
    # in the same order (a row computed in a batch of another shape can differ in the third decimal
    # on CPU, seen: -3.1074 against -3.111); the same request alone, whose batches are the same on
    # both servers, the same log-probabilities to 4 decimals
    ids = lambda r: [[p["id"] for p in c["top_logprobs"]] for c in r["completion_probabilities"]]
    probs = lambda r: [[(p["id"], round(p["logprob"], 4)) for p in c["top_logprobs"]] for c in r["completion_probabilities"]]
    assert ids(got[2]) == ids(want[2]), "n_probs with the argmax on differ from the rows copied after each decode"
    assert probs(got[4]) == probs(want[4]), "n_probs alone with the argmax on differ from the rows copied after each decode"


def test_server_turns_cuda_graphs_off_above_16_slots(small_pair, start_server, monkeypatch):
    """Patch 0025: llama-server sets GGML_CUDA_DISABLE_GRAPHS=1 (and says so in its log) when -np is
    above LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS (default 16), where CUDA graph replays killed the engine
    on an H200; not at 16 slots, not with the limit moved, not when the variable is set already.
    (The CPU backend ignores the variable: what is tested here is the server's decision.)"""
    said = "CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS=1"

    def log_of(parallel: int, **env: str) -> str:
        for k in ("LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS", "GGML_CUDA_DISABLE_GRAPHS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        srv = start_server(model=small_pair.target, spec_type=None, parallel=parallel, ctx_size=parallel * 256)
        srv.client().complete([40, 41, 42], n_predict=2)  # the server has logged its start by now
        text = srv.log_text()
        srv.stop()
        return text

    above = log_of(17)
    assert f"17 slots, more than 16: {said}" in above, above[-2000:]
    assert said not in log_of(16)
    assert said not in log_of(17, LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS="32")
    assert f"17 slots, more than 8: {said}" in log_of(17, LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS="8")
    assert said not in log_of(17, LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS="-1")
    assert said not in log_of(17, GGML_CUDA_DISABLE_GRAPHS="1")


def test_slow_step_lines_say_what_a_step_a_prompt_joins_spends(small_pair, start_server, tmp_path):
    """Patch 0072: with LLAMA_SPEC_PROFILE_SLOW=0 the server prints a line for every step: its batch
    (prompt rows, generating slots and their rows, drafted tokens) and the step profile's phases.
    One slot generates while a prompt joins on the other: that step is a "join" whose rows the
    target decodes and the drafter takes in, and ``stall.py steps`` reads the lines back. A
    threshold no step reaches prints none; a plain server's steps have no drafter phases."""
    import threading

    from ggufdspark.timings.steps import parse_steps, summarize_steps

    prompt = [40 + i % 50 for i in range(300)]
    srv = start_server(model=small_pair.target, draft=small_pair.draft, parallel=2, ctx_size=2 * 4096,
                       env={"LLAMA_SPEC_PROFILE_SLOW": "0"})
    client = srv.client(timeout=300)
    long = threading.Thread(target=client.complete, args=([40, 41, 42],), kwargs={"n_predict": 3000, "ignore_eos": True})
    long.start()
    try:
        srv.wait_for_log(r"spec slow step: .* 0 prompt rows, 1 generating slots", timeout=60)
        joined = client.complete(prompt, n_predict=4)
    finally:
        long.join()
    assert len(joined.tokens) == 4
    # the engine's logger thread may write a step's line after the answers went out: every step that
    # either request took part in is logged before the second release
    srv.wait_for_log(r"stop processing", count=2)
    lines = srv.wait_for_log(r"spec slow step: .* other host -?[\d.]+$", count=3)
    steps = parse_steps(srv.log_text())
    assert len(steps) >= len(lines) > 0, lines[:3]
    # the joining prompt's rows, in the steps it shared with the generating slot (the server keeps
    # its last few rows for a step of their own: a checkpoint of the recurrent state before them)
    joins = [s for s in steps if s.kind == "join"]
    assert sum(s.prompt_rows for s in joins) == len(prompt), [(s.kind, s.prompt_rows) for s in steps if s.prompt_rows]
    for s in joins:
        assert s.generating_slots == 1 and s.target_rows == s.prompt_rows + s.generating_rows, s
        assert s.injection_rows >= s.prompt_rows, s  # the drafter takes in the joining prompt's rows
        assert s.wall_ms >= max(s.phases_ms[p] for p in s.phases_ms if p != "other_host"), s
    gen = [s for s in steps if s.kind == "generate"]
    assert any(s.drafted > 0 and s.draft_rows > 0 for s in gen), gen[:3]
    assert all(s.drafted == s.generating_rows - s.generating_slots for s in gen)
    sums = summarize_steps(steps)
    assert set(sums) >= {"join", "generate"}
    assert math.isclose(sum(v.wall_share for v in sums.values()), 1.0), sums
    assert sums["join"].generating_slots_mean == 1 and sums["generate"].drafted_mean > 0, sums
    srv.stop()

    out = tmp_path / "steps.json"
    p = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "stall.py"), "steps",
                        str(srv.log_path), "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert re.search(r"^join\s+\d+", p.stdout, re.M) and re.search(r"^generate\s+\d+", p.stdout, re.M), p.stdout
    import json
    assert json.loads(out.read_text())["summary"]["join"]["count"] == len([s for s in steps if s.kind == "join"])

    quiet = start_server(model=small_pair.target, draft=small_pair.draft, env={"LLAMA_SPEC_PROFILE_SLOW": "600000"})
    quiet.client().complete([40, 41, 42], n_predict=16)
    # the line of the step that ended the request would come after its release: read the log once
    # the server has exited, when nothing more can reach it
    quiet.stop()
    assert "spec slow step" not in quiet.log_text()

    plain = start_server(model=small_pair.target, spec_type=None, env={"LLAMA_SPEC_PROFILE_SLOW": "0"})
    plain.client().complete([40, 41, 42], n_predict=8)
    plain_steps = parse_steps("\n".join(plain.wait_for_log(r"spec slow step: .* other host -?[\d.]+$", count=8)))
    assert plain_steps and all(s.injection_rows == 0 and s.draft_rows == 0 and s.drafted == 0 for s in plain_steps)


def _one_slot_greedy(srv, prompts: list[list[int]], n_predict: int) -> tuple[list[tuple[list[int], int, int]], str]:
    """``prompts`` one after another on the drafted server ``srv``, greedy: each answer's (tokens,
    drafted, accepted), then the server's log; ``srv`` is stopped."""
    client = srv.client(timeout=300)
    got = []
    for p in prompts:
        r = client.post_json("/completion", {"prompt": p, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
                                             "cache_prompt": False, "return_tokens": True})
        got.append((r["tokens"], r["timings"].get("draft_n", 0), r["timings"].get("draft_n_accepted", 0)))
    srv.wait_for_log(r"stop processing", count=len(prompts))  # the log trails the responses
    log = srv.log_text()
    srv.stop()
    return got, log


def test_greedy_draft_without_a_confidence_cut_leaves_the_head_out(small_pair, start_server):
    """Patch 0058: with p_min 0 the drafter's greedy graph leaves the confidence head out (its log
    says so); with p_min above 0 the head stays, and at a threshold no confidence falls below
    (1e-30) it cuts nothing: the same drafts, so the same drafted / accepted counts and the same
    text as without the head, request by request."""
    said = "the draft graph leaves the confidence head out"
    prompts = [[40 + 5 * i + k for k in range(12 + 3 * i)] for i in range(4)]

    def serve(p_min: float | None) -> tuple[list[tuple[list[int], int, int]], str]:
        srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=5, draft_p_min=p_min)
        return _one_slot_greedy(srv, prompts, 40)

    without, log0 = serve(None)
    kept, log_kept = serve(1e-30)
    assert said in log0, f"p_min 0: no '{said}' in the server's log: {log0[-2000:]}"
    assert said not in log_kept, "p_min 1e-30: the head was left out though a confidence cut reads it"
    assert sum(n for _, n, _ in without) > 0, f"nothing was drafted: the case tests nothing: {without}"
    assert sum(a for _, _, a in without) > 0, f"nothing drafted was accepted: the case tests nothing: {without}"
    for i, (w, k) in enumerate(zip(without, kept)):
        assert w == k, f"request {i}: without the head (tokens, drafted, accepted) {w} != with it {k}"


def test_drafter_schedulers_and_one_op_markov_chain_draft_as_their_switches_off(small_pair, start_server, monkeypatch):
    """Patches 0064 and 0065 are on by default: the drafter's graphs with and without outputs keep a
    scheduler each (0064) and a one-block greedy chain is one op (0065, where the device that holds
    markov_w2 runs it: 0083); the `-v` log says both. With
    their switches off (LLAMA_GRAPH_SCHEDS=1, LLAMA_DSPARK_MARKOV_FUSED=0) the log says neither, and
    one slot answers four greedy requests with the same tokens, drafted and accepted counts, request
    by request. (0061's kept input events, formerly 0063, have no switch and no events on the CPU.)"""
    said = ("outputs keep a scheduler of their own", "the greedy Markov chain is one op")
    switches = {"LLAMA_GRAPH_SCHEDS": "1", "LLAMA_DSPARK_MARKOV_FUSED": "0"}
    prompts = [[60 + 7 * i + k for k in range(10 + 5 * i)] for i in range(4)]

    def serve(off: bool) -> tuple[list[tuple[list[int], int, int]], str]:
        for k, v in switches.items():
            if off:
                monkeypatch.setenv(k, v)
            else:
                monkeypatch.delenv(k, raising=False)
        srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=5,
                           extra_args=["-v"])  # -v: the engine's context and graph lines
        return _one_slot_greedy(srv, prompts, 48)

    on, log_on = serve(False)
    off, log_off = serve(True)
    for line in said:
        assert line in log_on, f"by default: no '{line}' in the server's log: {log_on[-2000:]}"
        assert line not in log_off, f"switched off ({switches}), yet the log says '{line}'"
    # 0083: the op is built where the device holding markov_w2 runs it, and the line says so (the CPU does)
    chain = next(ln for ln in log_on.splitlines() if "the greedy Markov chain is one op" in ln)
    assert "w2's device runs the op yes" in chain, chain
    assert sum(a for _, _, a in on) > 0, f"nothing drafted was accepted: the case tests nothing: {on}"
    for i, (a, b) in enumerate(zip(on, off)):
        assert a == b, f"request {i}: by default (tokens, drafted, accepted) {a} != switched off {b}"


def _plain_or_drafted(start_server, pair, draft):
    """A server of ``pair``'s target alone (``draft`` None) or with ``draft`` at draft length 5."""
    if draft is None:
        return start_server(model=pair.target, spec_type=None)
    return start_server(model=pair.target, draft=draft, draft_n_max=5)


def test_server_keeps_the_probabilities_of_tokens_held_back_inside_a_character(small_pair, start_server):
    """Patch 0066: a token that ends inside a UTF-8 character waits for the one that completes it;
    its probabilities used to be dropped (a completion with n_probs had fewer entries than tokens,
    none for a run of such tokens), so a lossless check could not tell a near-tie from a defect there.
    Every token here is the lead byte 0xD5 (forced by a logit bias; each one waits for a continuation
    that never comes): one entry a token with empty text, each with its own top-2, plain and drafted
    (verified tokens take the same path; their top-2 is patch 0067's)."""
    from ggufdspark.gguffile.reader import read_gguf

    vocab = read_gguf(small_pair.target).get_str_list("tokenizer.ggml.tokens")
    lead = vocab.index("\u00d5")  # the generated pair's GPT-2 byte-level vocabulary: byte 0xD5 is U+00D5
    body = {"prompt": [40 + k for k in range(20)], "n_predict": 12, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "n_probs": 2, "logit_bias": [[lead, 1000.0]]}
    for draft in (None, small_pair.draft):
        srv = _plain_or_drafted(start_server, small_pair, draft)
        r = srv.client(timeout=300).post_json("/completion", body)
        srv.stop()
        what = "drafted" if draft else "plain"
        assert r["tokens"] == [lead] * 12, f"{what}: the bias did not hold: {r['tokens']}"
        probs = r.get("completion_probabilities", [])  # the pinned server leaves the key out when it has none
        assert len(probs) == 12, f"{what}: {len(probs)} probability entries for 12 tokens"
        bad = [e for e in probs if not (e["id"] == lead and e["token"] == "" and len(e["top_logprobs"]) == 2)]
        assert not bad, f"{what}: {bad}"


def test_a_stream_lists_the_tokens_held_back_inside_a_character(small_pair, start_server):
    """Patch 0089: a streamed answer used to list only the token that completes a UTF-8 character,
    never those held back before it (a run of lead bytes: none at all). Now each goes out at once in
    a chunk with empty text and its own token, with its probabilities under n_probs; the chunk whose
    token completes a character carries the text. A run of the lead byte 0xD5 (forced by a logit
    bias) streams all its tokens, plain and drafted; so does an answer of U+0540 (0xD5 0x80: the lead
    byte by the bias, its completion by a grammar), whose streamed text is the non-streamed answer's."""
    from ggufdspark.gguffile.reader import read_gguf

    vocab = read_gguf(small_pair.target).get_str_list("tokenizer.ggml.tokens")
    lead = vocab.index("\u00d5")  # the GPT-2 byte-level vocabulary: byte 0xD5 is U+00D5
    prompt = [40 + k for k in range(20)]
    for draft in (None, small_pair.draft):
        what = "drafted" if draft else "plain"
        srv = _plain_or_drafted(start_server, small_pair, draft)
        client = srv.client(timeout=300)
        # every token a lead byte that never completes: the pinned stream listed none of them
        body = {"n_probs": 2, "logit_bias": [[lead, 1000.0]], "ignore_eos": True}
        got = client.stream_complete(prompt, n_predict=12, **body)
        assert got.tokens == [lead] * 12, f"{what}: streamed tokens {got.tokens}"
        assert got.raw["tokens_predicted"] == 12, got.raw
        # a grammar of U+0540 (0xD5 0x80) and the bias: a lead byte, then a token the grammar lets
        # complete it, and so on; each character's text goes out with its completing token
        body = {"logit_bias": [[lead, 1000.0]], "grammar": 'root ::= "\u0540"+', "ignore_eos": True}
        whole = client.complete(prompt, n_predict=10, **body)
        streamed = client.stream_complete(prompt, n_predict=10, **body)
        srv.stop()
        assert whole.tokens.count(lead) >= 2 and set(whole.text) == {"\u0540"}, (what, whole.tokens, whole.text)
        assert streamed.tokens == whole.tokens, f"{what}: streamed {streamed.tokens} against {whole.tokens}"
        # the text as before: the same, but for the bytes of a character the answer ends inside
        # (a stream never sends them; the whole answer shows them as U+FFFD)
        rest = whole.text[len(streamed.text):]
        assert whole.text.startswith(streamed.text) and set(rest) <= {"\ufffd"}, (what, streamed.text, whole.text)


def _entries_side_by_side(plain: list[dict], drafted: list[dict]):
    """The same prompts' completions on a plain and a drafted server: each pair of probability
    entries, token by token, as (where, plain's, drafted's), once the answers are checked equal and
    both list an entry a token."""
    for i, (p, d) in enumerate(zip(plain, drafted)):
        assert p["tokens"] == d["tokens"], f"prompt {i}: the drafted answer differs from the plain one"
        pp, dp = p.get("completion_probabilities", []), d.get("completion_probabilities", [])
        assert len(pp) == len(dp) == len(p["tokens"]), f"prompt {i}: {len(pp)} / {len(dp)} entries"
        for j, (a, b) in enumerate(zip(pp, dp)):
            yield f"prompt {i}, token {j}", a, b


def test_a_drafted_servers_verified_tokens_carry_their_probabilities(small_pair, start_server):
    """Patch 0067: with n_probs, a token a speculative step verified gets its candidates from its own
    row of the verify, as a token of a step without a draft does (the pinned server left them out:
    no candidates, its own probability 1). Greedy, the same prompts on a plain and a drafted server:
    the same tokens, an entry a token on both, every drafted entry with its 3 candidates, the token
    its row's best, and each candidate's log-probability within 0.02 of the plain server's (the
    batch's arithmetic differs) for the candidates both list; and a chat completion's `logprobs`
    (the OpenAI API) on the drafted server: an entry a token, each with its top 2."""
    prompts = [[40 + 5 * i + k for k in range(12 + 3 * i)] for i in range(3)]
    body = {"n_predict": 40, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True, "n_probs": 3}

    def run(draft) -> list[dict]:
        srv = _plain_or_drafted(start_server, small_pair, draft)
        client = srv.client(timeout=300)
        out = [client.post_json("/completion", {**body, "prompt": p}) for p in prompts]
        if draft:  # the OpenAI API's logprobs take the same entries
            chat = client.post_json("/v1/chat/completions", {
                "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 30,
                "temperature": 0.0, "logprobs": True, "top_logprobs": 2})
            content = chat["choices"][0]["logprobs"]["content"]
            assert chat["timings"].get("draft_n_accepted", 0) > 0, f"chat: nothing accepted: {chat['timings']}"
            assert len(content) == chat["usage"]["completion_tokens"], content
            assert all(len(e["top_logprobs"]) == 2 for e in content), content
        srv.stop()
        return out

    plain, drafted = run(None), run(small_pair.draft)
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in drafted)
    assert accepted > 0, "no drafted token was accepted: the case tests nothing"
    for where, a, b in _entries_side_by_side(plain, drafted):
        assert len(b["top_logprobs"]) == 3, f"{where}: drafted candidates {b['top_logprobs']}"
        assert b["top_logprobs"][0]["id"] == b["id"], f"{where}: the greedy token is not its row's best: {b}"
        assert abs(a["logprob"] - b["logprob"]) < 0.02, f"{where}: token logprob {a['logprob']} plain, {b['logprob']} drafted"
        theirs = {c["id"]: c["logprob"] for c in a["top_logprobs"]}
        shared = [(theirs[c["id"]], c["logprob"]) for c in b["top_logprobs"] if c["id"] in theirs]
        assert len(shared) >= 2 and all(abs(x - y) < 0.02 for x, y in shared), \
            f"{where}: plain {a['top_logprobs']}, drafted {b['top_logprobs']}"


def test_a_drafted_servers_verified_tokens_carry_their_probabilities_after_sampling(small_pair, start_server):
    """Patch 0068: with n_probs and post_sampling_probs, a token a speculative step verified gets its
    row's candidates after the sampler chain, kept as the acceptance sampled the row (the sampler
    holds only the last row's afterwards: before, verified tokens listed none). Greedy, the same
    prompts on a plain and a drafted server: the same tokens, and per token the same candidates
    with probabilities within 0.02 (the batch's arithmetic differs). Sampled (temperature 0.7, top-k
    4, seeded) on the drafted server with drafts accepted: every token lists candidates, at most
    4, in falling probability, none zero, the token itself among them with the probability its
    entry gives, together at most 1."""
    prompts = [[40 + 5 * i + k for k in range(12 + 3 * i)] for i in range(3)]
    body = {"n_predict": 40, "ignore_eos": True, "cache_prompt": False, "return_tokens": True,
            "n_probs": 4, "post_sampling_probs": True}
    greedy = {**body, "temperature": 0.0}

    def run(draft) -> tuple[list[dict], list[dict]]:
        srv = _plain_or_drafted(start_server, small_pair, draft)
        client = srv.client(timeout=300)
        out = [client.post_json("/completion", {**greedy, "prompt": p}) for p in prompts]
        sampled = [client.post_json("/completion", {**body, "prompt": p, "temperature": 0.7, "top_k": 4,
                                                    "seed": 7 + i}) for i, p in enumerate(prompts)] if draft else []
        srv.stop()
        return out, sampled

    (plain, _), (drafted, sampled) = run(None), run(small_pair.draft)
    for what, rs in (("greedy", drafted), ("sampled", sampled)):
        assert sum(r["timings"].get("draft_n_accepted", 0) for r in rs) > 0, f"{what}: nothing accepted: the case tests nothing"
    for where, a, b in _entries_side_by_side(plain, drafted):
        where = f"greedy {where}"
        assert b["top_probs"], f"{where}: the drafted entry lists no candidates: {b}"
        assert [c["id"] for c in a["top_probs"]] == [c["id"] for c in b["top_probs"]], f"{where}: plain {a}, drafted {b}"
        assert abs(a["prob"] - b["prob"]) < 0.02 and all(
            abs(x["prob"] - y["prob"]) < 0.02 for x, y in zip(a["top_probs"], b["top_probs"])), \
            f"{where}: plain {a}, drafted {b}"
    for i, r in enumerate(sampled):
        entries = r.get("completion_probabilities", [])
        assert len(entries) == len(r["tokens"]), f"sampled prompt {i}: {len(entries)} entries for {len(r['tokens'])} tokens"
        for j, e in enumerate(entries):
            where = f"sampled prompt {i}, token {j}"
            ps = [c["prob"] for c in e["top_probs"]]
            assert 1 <= len(ps) <= 4 and all(p > 0 for p in ps) and ps == sorted(ps, reverse=True), f"{where}: {e}"
            assert sum(ps) <= 1.0 + 1e-4, f"{where}: the candidates' probabilities add to {sum(ps)}"
            mine = [c["prob"] for c in e["top_probs"] if c["id"] == e["id"]]
            assert mine and abs(mine[0] - e["prob"]) < 1e-6, f"{where}: the token is not among its candidates as listed: {e}"


def test_one_generating_slot_steps_without_the_hand_over_to_the_queue_worker(small_pair, start_server):
    """Patch 0088: with one slot generating and nothing else busy, the server runs a step's draft,
    decode and drafter update without handing its task queue to the worker thread (upstream's
    yield_to_queue, whose `-v` line "yielding to queue" marks each hand-over); its prompt's decode
    and two generating slots keep the hand-over, and LLAMA_SERVER_YIELD=1 hands over around every
    work as upstream does. The answers are the same either way, and the server answers /metrics
    while a slot generates."""
    import threading

    prompt = [50 + i % 40 for i in range(24)]
    body = {"prompt": prompt, "n_predict": 64, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True}

    def run(env: dict | None, both: bool) -> tuple[int, list[list[int]], int]:
        srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=5, parallel=2,
                           extra_args=["-v", "--metrics"], env=env or {})
        client = srv.client(timeout=300)
        out: list = [None, None]

        def one(i: int) -> None:
            out[i] = client.post_json("/completion", body)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2 if both else 1)]
        for t in threads:
            t.start()
        metrics = client.get_text("/metrics")  # answered while the slot works (or after: either way once)
        for t in threads:
            t.join()
        srv.wait_for_log(r"stop processing", count=len(threads))  # the log trails the responses
        log = srv.log_text()
        srv.stop()
        # a step gives at most 1 + the draft length (5) tokens to a slot
        steps = -(-max(r["timings"]["predicted_n"] for r in out if r) // 6)
        assert "llamacpp:" in metrics, metrics[:300]
        return len(re.findall(r": yielding to queue$", log, re.M)), [r["tokens"] for r in out if r], steps

    alone, tokens_alone, steps = run(None, both=False)
    forced, tokens_forced, _ = run({"LLAMA_SERVER_YIELD": "1"}, both=False)
    two, tokens_two, _ = run(None, both=True)
    # the prompt's two steps (its last rows go alone, after a checkpoint) hand over around the target's
    # decode and the drafter's take-in; the generating steps do not
    assert alone <= 4, f"one slot generating handed over {alone} times (its prompt's steps only expected)"
    assert forced >= steps, f"LLAMA_SERVER_YIELD=1: {forced} hand-overs for at least {steps} steps"
    assert two >= steps, f"two slots generating: {two} hand-overs for at least {steps} steps"
    assert tokens_alone == tokens_forced and tokens_two == tokens_alone * 2, (tokens_alone, tokens_forced, tokens_two)
