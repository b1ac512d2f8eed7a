"""Many slots with the draft on (issue 12): the patched engine survives staggered finishes and new
prompts batched with other slots' drafts, and every request's greedy tokens equal the plain
server's under the same load. Real engine, real generated pair, real acceptance."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
import threading
from collections import Counter

import pytest

from ggufdspark.errors import LogWaitTimeoutError
from lossless import all_at_once, assert_same_or_near_tie, closed_loop

SLOTS = 8
REQUESTS = 24  # three waves: slots finish at different times, new prompts join running drafts


def workload(vocab: int, seed: int = 7) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(16, vocab) for _ in range(rng.randint(30, 160))], rng.randint(8, 72))
            for _ in range(REQUESTS)]


def serve_all(srv, work) -> list[dict]:
    """Send ``work`` in waves of SLOTS concurrent greedy requests; every result is kept."""
    out: list[dict] = []
    for wave in range(0, len(work), SLOTS):
        out += _at_once(srv, work[wave:wave + SLOTS])
    return out




def in_turn_with_two(srv, prompts: list[list[int]]) -> list[dict]:
    """The first three prompts one after another, then a request for two completions (n_cmpl 2) of
    the fourth: 40 greedy tokens each, with the top-2 probabilities for near-tie checks."""
    c = srv.client(timeout=300)
    body = {"n_predict": 40, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
            "return_tokens": True, "n_probs": 2}
    out = [c.post_json("/completion", {**body, "prompt": p}) for p in prompts[:3]]
    two = c.post_json("/completion", {**body, "prompt": prompts[3], "n_cmpl": 2})
    assert isinstance(two, list) and len(two) == 2, f"n_cmpl 2: expected two completions, got {str(two)[:300]}"
    return out + two


def is_cuda_build(engine) -> bool:
    """Whether ``engine`` runs on CUDA: there events order the drafter's injection (0036, 0062), and a
    row's result depends on what else is in its batch (the CPU backend's does not)."""
    from ggufdspark import hardware

    return hardware.detect(engine).backend == "cuda"


def token_table_device(engine) -> str | None:
    """Where ``serve`` loads the target's token table for this engine (``launch.decide``): the first
    CUDA device on a CUDA build (one GPU), else None (llama.cpp's CPU placement)."""
    from ggufdspark import hardware

    devices = hardware.detect(engine)
    gpus = [d.name for d in devices.devices if d.type in ("gpu", "igpu", "unknown")]
    return "CUDA0" if devices.backend == "cuda" and len(gpus) == 1 else None


def plain_waves(start_server, common: dict, seed: int) -> tuple[int, list, list[dict]]:
    """The vocabulary size of ``common``'s model, a workload of ``seed`` for its server and the plain
    server's answers to it."""
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = workload(vocab, seed=seed)
    want = serve_all(plain, work)
    plain.stop()
    return vocab, work, want


def assert_waves_as_plain(spec, work, want: list[dict], said: str, what: str) -> None:
    """``work`` in waves on the drafted server ``spec``: its log says ``said``, no request fails,
    drafts are accepted and every answer is the plain server's (or departs at a near-tie); then
    ``spec`` is stopped."""
    got = serve_all(spec, work)
    assert said in spec.log_text(), f"no '{said}' in the server's log: {spec.log_text()[-2000:]}"
    errors = [g["error"] for g in got if "error" in g]
    assert not errors and spec.alive(), f"{len(errors)} requests failed, first: {errors[:1]}"
    assert sum(g["timings"].get("draft_n_accepted", 0) for g in got) > 0, "nothing drafted was accepted"
    for i, (p, s) in enumerate(zip(want, got)):
        assert_same_or_near_tie(p, s["tokens"], f"request {i}, {what}")
    spec.stop()


def one_at_a_time(start_server, pair, work, monkeypatch, env: dict[str, str | None], table: str | None = None
                  ) -> tuple[list[tuple[list[int], int, int]], str]:
    """The first six requests of `work` one after another on a one-slot drafted server (draft length
    6, the token table in `table`'s buffer where given) started with `env` (None: unset; the server
    inherits the environment): each request's (tokens, drafted, accepted), and the server's log."""
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    srv = start_server(model=pair.target, draft=pair.draft, draft_n_max=6, parallel=1, ctx_size=512,
                       token_table_device=table)
    c = srv.client(timeout=300)
    out = []
    for prompt, n in work[:6]:
        r = c.post_json("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                                        "cache_prompt": False, "return_tokens": True})
        out.append((r["tokens"], r["timings"].get("draft_n", 0), r["timings"].get("draft_n_accepted", 0)))
    log = srv.log_text()
    srv.stop()
    for k in env:
        monkeypatch.delenv(k, raising=False)
    return out, log


def test_many_slots_with_draft_are_lossless_and_never_abort(strong_conv_pair, start_server):
    """On the strong-conv pair, whose output a wrong conv state changes: with the small pair's weak
    conv layers, snapshots left behind by a moved cell (patch 0019) went unnoticed."""
    common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = workload(vocab)
    want = serve_all(plain, work)
    plain.stop()

    for n_max in (3, 6):
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=n_max, **common)
        got = serve_all(spec, work)
        assert spec.alive(), f"n_max {n_max}: the engine died under {SLOTS}-slot load:\n{spec.log_text()[-2000:]}"
        errors = [g["error"] for g in got if "error" in g]
        assert not errors, f"n_max {n_max}: {len(errors)} requests failed, first: {errors[0]}"
        drafted = sum(g["timings"].get("draft_n", 0) for g in got)
        assert drafted > 0, f"n_max {n_max}: the draft never engaged"
        spec.wait_for_log(r"stop processing", count=REQUESTS)  # the log trails the responses
        assert "invalid draft" not in spec.log_text(), f"n_max {n_max}: the engine dropped invalid drafted ids"
        for i, (p, s) in enumerate(zip(want, got)):
            assert "tokens" in p and "tokens" in s, f"request {i}: no tokens in the response"
            assert_same_or_near_tie(p, s["tokens"], f"n_max {n_max}, request {i}, greedy output with the draft")
        spec.stop()


@pytest.mark.slow
def test_repacked_weights_serve_many_sequences_at_once(pairs_root, start_server):
    """Issue 12, item 5: on CPUs with AMX the pinned engine's repacked-weight matmul crashed on the
    first batch holding several sequences (a 320M LFM2 pair, F16; 2 of 2 runs here). Patch 0009
    fixes the batched offsets; this serves 8 sequences at once with repacking on (the default), with
    and without the draft, and checks every answer against one-at-a-time greedy decoding."""
    from ggufdspark.synthetic.pairs import build_pair
    from ggufdspark.synthetic.synth import MEDIUM_DRAFTER, MEDIUM_TARGET

    pair = build_pair(pairs_root, target_spec=MEDIUM_TARGET, drafter_spec=MEDIUM_DRAFTER, name="medium-lfm2")
    rng = random.Random(3)
    work = [([rng.randrange(16, 32000) for _ in range(rng.randint(40, 90))], 6) for _ in range(SLOTS)]

    one = start_server(model=pair.target, spec_type=None, parallel=1, ctx_size=512)
    want = [one.client(timeout=300).complete(p, n_predict=n, ignore_eos=True, n_probs=2).raw for p, n in work]
    one.stop()
    for draft in (None, pair.draft):
        srv = start_server(model=pair.target, draft=draft, spec_type="draft-dspark" if draft else None,
                           draft_n_max=3 if draft else None, parallel=SLOTS, ctx_size=SLOTS * 256)
        got = serve_all(srv, work)
        assert srv.alive(), (f"the engine died serving {SLOTS} sequences at once with repacked weights "
                             f"(draft: {bool(draft)}):\n{srv.log_text()[-1500:]}")
        for i, g in enumerate(got):
            assert "error" not in g, f"request {i}: {g['error']}"
            assert_same_or_near_tie(want[i], g["tokens"], f"request {i} (draft: {bool(draft)}), batched greedy output")
        srv.stop()


def wave_then_alone(pair, start_server, *, seed: int, first: int, answer: int | None = None):
    """The settings of an 8-slot server of ``pair``, one wave of SLOTS requests (``answer``: every one
    that many tokens long, so the slots generate together to the wave's end whatever the machine's
    load; None: the workload's own lengths), one request of 100 tokens from ``first`` on to send
    alone after it, and the plain server's answers to all of them."""
    common = dict(model=pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = [(prompt, answer or n) for prompt, n in workload(vocab, seed=seed)[:SLOTS]]
    alone = ([t % vocab for t in range(first, first + 100)], 48)
    want = serve_all(plain, work + [alone])
    plain.stop()
    return common, work, alone, want


def _drafted_per_step(timings: list[dict]) -> float:
    """Drafted tokens per verify step over ``timings``: a step commits the accepted drafts and one
    more token, and each request's first token comes from its prompt."""
    steps = sum(max(t["predicted_n"] - 1 - t.get("draft_n_accepted", 0), 1) for t in timings)
    return sum(t.get("draft_n", 0) for t in timings) / steps


def test_drafts_are_cut_while_more_slots_generate(strong_conv_pair, start_server):
    """Patch 0021 (--spec-draft-n-max-by-slots 2:2): while more than 2 slots are busy, drafts are cut
    to 2 tokens (n_max 6); a request alone drafts 6 again; output stays the plain server's. The wave's
    answers are all 64 tokens: with the workload's 8-72, a loaded machine let the short ones end
    early and the rest run on with 2 busy slots or fewer, uncut (4.18 drafted a step once)."""
    common, work, alone, want = wave_then_alone(strong_conv_pair, start_server, seed=13, first=60, answer=64)
    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(2, 2)], **common)
    got = serve_all(spec, work)
    last = serve_all(spec, [alone])[0]
    spec.wait_for_log(r"drafts cut to 2 tokens: [3-8] slots busy \(--spec-draft-n-max-by-slots\)")
    spec.wait_for_log(r"drafts no longer cut: [0-2] slots busy")
    assert spec.alive(), f"the engine died:\n{spec.log_text()[-2000:]}"
    for i, (p, s) in enumerate(zip(want, got + [last])):
        assert "tokens" in s, f"request {i}: {s.get('error', 'no tokens in the response')}"
        assert_same_or_near_tie(p, s["tokens"], f"request {i}, greedy output with drafts cut under load")
    wave = _drafted_per_step([g["timings"] for g in got])
    assert wave < 4.0, f"{SLOTS} requests at once drafted {wave:.2f} tokens a step: the cut to 2 did not hold"
    assert _drafted_per_step([last["timings"]]) > 5.0, f"a request alone drafted {last['timings']}: not 6 a step"


def test_a_cut_draft_drafts_a_shorter_block(strong_conv_pair, start_server, monkeypatch):
    """Patch 0024: with drafts cut to 2 tokens (n_max 6, --spec-draft-n-max-by-slots 0:2) the drafter
    decodes blocks of 2 rows, not 6 (the step profile's rows per draft decode); with
    LLAMA_SPEC_BLOCK_FULL=1 it drafts all 6 and throws 4 away, as before. Output equal either way."""
    monkeypatch.setenv("LLAMA_SPEC_PROFILE", "1")  # prints every 128 target decodes
    common = dict(model=strong_conv_pair.target, parallel=1, ctx_size=1024)
    body = {"prompt": "a cut draft", "n_predict": 400, "temperature": 0.0, "ignore_eos": True, "return_tokens": True}
    plain = start_server(spec_type=None, **common)
    want = plain.client(timeout=300).post_json("/completion", body)["tokens"]
    plain.stop()
    rows = {}
    for full in ("0", "1"):
        monkeypatch.setenv("LLAMA_SPEC_BLOCK_FULL", full)
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(0, 2)], **common)
        got = spec.client(timeout=300).post_json("/completion", body)
        assert got["tokens"] == want, f"LLAMA_SPEC_BLOCK_FULL={full}: greedy output with cut drafts differs"
        assert got["timings"].get("draft_n", 0) > 0, f"LLAMA_SPEC_BLOCK_FULL={full}: the draft never engaged"
        line = spec.wait_for_log(r"draft block rows per draft decode \d+\.\d\s*$")[-1]
        rows[full] = float(re.search(r"per draft decode (\d+\.\d)", line)[1])
        spec.stop()
    assert rows == {"0": 2.0, "1": 6.0}, f"draft block rows per draft decode (cut to 2 of 6, full): {rows}"


def test_strong_conv_layers_one_slot_are_lossless(strong_conv_pair, start_server):
    """One slot, requests one after the other, draft lengths 3 and 6, on a pair whose conv layers move
    the output: a verify's conv-state snapshots and the rollback to them must leave greedy output
    equal to the plain server's (an engine writing the snapshot slots in reversed order fails here
    at the first token). Eight slots at once are not asserted on this pair: there the patched engine
    still differs now and then at draft length 6 (docs/engine-patches.md, "Engine defects found")."""
    common = dict(model=strong_conv_pair.target, parallel=1, ctx_size=320)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = workload(vocab)[:12]

    def one_by_one(srv) -> list[dict]:
        c = srv.client(timeout=300)
        return [c.post_json("/completion", {"prompt": p, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                                            "cache_prompt": False, "return_tokens": True, "n_probs": 2})
                for p, n in work]

    want = one_by_one(plain)
    plain.stop()
    for n_max in (3, 6):
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=n_max, **common)
        got = one_by_one(spec)
        assert sum(g["timings"].get("draft_n", 0) for g in got) > 0, f"n_max {n_max}: the draft never engaged"
        for i, (p, s) in enumerate(zip(want, got)):
            assert_same_or_near_tie(p, s["tokens"], f"strong conv, n_max {n_max}, request {i}")
        spec.stop()


def test_crash_hunt_runs_fresh_servers_and_counts_deaths(small_pair, dspark_engine, tmp_path):
    """benchmarks/slots.py families (the drafter abort an earlier engine had on the
    H200): fresh drafted servers under the families benchmark's load, one line a run and the count
    of deaths; a healthy engine, none."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, str(repo / "benchmarks" / "slots.py"), "families", "-m", str(small_pair.target),
                        "-md", str(small_pair.draft), "--server", dspark_engine.path, "--runs", "2",
                        "--slots", "4", "--n-max", "5", "--family-n-predict", "16", "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "run 0: ok" in p.stdout and "run 1: ok" in p.stdout, p.stdout
    assert "0 of 2 servers died (4 slots, n_max 5, default environment)" in p.stdout, p.stdout
    assert (tmp_path / "logs" / "run1.log").is_file()


@pytest.mark.engine
def test_benchmark_arguments_are_refused_in_one_line(small_pair, tmp_path):
    """A malformed --env (slots.py families and waves) or --load-lengths (speed.py decode) is
    refused before any server starts: exit 2, one line naming the value; a missing model file
    (speed.py decode): exit 1, one line naming it."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    for (script, command), args, said in (
            (("slots.py", "families"), ["--env", "FOO"], "--env: 'FOO' is not NAME=VALUE"),
            (("slots.py", "waves"), ["--env", "A=1,B"], "--env: 'B' is not NAME=VALUE"),
            (("speed.py", "decode"), ["--load-lengths", "5,x"], "--load-lengths '5,x': expected draft lengths"),
            (("speed.py", "decode"), ["--load-trials", "0"], "--load-trials 0: at least 1"),
            (("speed.py", "decode"), ["--cross-variants"], "--cross-variants: only with --interleave"),
            (("speed.py", "decode"), ["-m", str(tmp_path / "none.gguf")], "none.gguf: no such file")):
        p = subprocess.run([sys.executable, str(bench / script), command, *pair, *args, "--log-dir",
                            str(tmp_path / f"{script}-{command}")],
                           capture_output=True, text=True, timeout=120)
        code = 1 if "no such file" in said else 2  # a missing file is not a usage error
        assert p.returncode == code and said in p.stderr and "Traceback" not in p.stderr, (script, p.stderr)
        assert code == 2 or len(p.stderr.strip().splitlines()) == 1, p.stderr
    # an environment group's switches separated by commas or spaces (SPEED_ENVS as LOAD_ARMS writes them)
    import pytest

    if str(bench.parent) not in sys.path:  # benchmarks/ is a checkout's package (run alone, nothing added it)
        sys.path.insert(0, str(bench.parent))
    from benchmarks.harness import parse_env, split_env

    assert parse_env("A=1 B=8,C=x") == {"A": "1", "B": "8", "C": "x"}
    # an arm's words (LOAD_ARMS): a comma group sets each switch; a value keeps its own commas
    assert split_env(["7", "A=1,B=q4_K,q6_K,C=2", "16:0", "D=x"]) == (
        {"A": "1", "B": "q4_K,q6_K", "C": "2", "D": "x"}, ["7", "16:0"])
    with pytest.raises(ValueError, match="'B' is not NAME=VALUE"):
        parse_env("A=1 B")


@pytest.mark.engine
def test_speed_benchmark_reports_the_median_of_its_load_waves(small_pair, tmp_path):
    """benchmarks/speed.py decode --load-trials N: every concurrency level of every load arm is
    measured N times on the real engine, each wave kept in the JSON, the median reported. Without
    --load-lengths the load arms are the best length and the block's, as far as this drafter drafts
    (the small pair's block is shorter than the synthetic profile's 9)."""
    import statistics
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "speed.py"
    out = tmp_path / "speed.json"
    p = subprocess.run([sys.executable, str(bench), "decode", "-m", str(small_pair.target), "-md", str(small_pair.draft),
                        "--n-predict", "16", "--trials", "1", "--lengths", "3",
                        "--concurrency", "2", "--load-trials", "3", "--json", str(out), "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert "under load: median of 3 waves a level" in p.stdout, p.stdout
    load = json.loads(out.read_text())["load"]
    from ggufdspark import launch

    longest = launch.longest_draft(small_pair.draft)
    assert longest < 9, longest
    assert [r["arm"] for r in load] == ["plain-np2", "dspark-n3-np2", f"dspark-n{longest}-np2"], load
    for r in load:
        waves = r["aggregate_tps_c2_all"]
        assert len(waves) == 3 and all(w > 0 for w in waves), r
        assert r["aggregate_tps_c2"] == statistics.median(waves), r


@pytest.mark.engine
def test_speed_benchmark_interleaves_its_arms_request_by_request(small_pair, tmp_path):
    """benchmarks/speed.py decode --interleave: every one-request arm's server (plain, two lengths,
    an engine-environment variant and a server-flag variant of each and, with --cross-variants, the
    two together; the flag variant on a plain server too, its drafted rows compared with that one)
    is up at once, and the arms
    take turns: every arm's request of trial i is sent before any arm's of trial i + 1, trial i
    starting at arm i mod N; each arm's figures come from its own server's answers."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "speed.py"
    out, logs = tmp_path / "speed.json", tmp_path / "logs"
    p = subprocess.run([sys.executable, str(bench), "decode", "-m", str(small_pair.target), "-md", str(small_pair.draft),
                        "--n-predict", "200", "--trials", "3", "--lengths", "2,3", "--concurrency", "",
                        "--env-variants", "LLAMA_SPEC_PROFILE=1", "--variants", "--spec-draft-p-min 1e-30",
                        "--interleave", "--cross-variants", "--json", str(out), "--log-dir", str(logs)],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert "10 servers at once, 3 turns" in p.stderr, p.stderr
    assert "taking turns a request each" in p.stdout, p.stdout
    rows = json.loads(out.read_text())["results"]
    assert [(r.get("draft_n_max"), r.get("env"), r.get("variant")) for r in rows] == [
        (None, None, None), (None, None, "--spec-draft-p-min 1e-30"),
        (2, None, None), (2, "LLAMA_SPEC_PROFILE=1", None), (2, None, "--spec-draft-p-min 1e-30"),
        (2, "LLAMA_SPEC_PROFILE=1", "--spec-draft-p-min 1e-30"),
        (3, None, None), (3, "LLAMA_SPEC_PROFILE=1", None), (3, None, "--spec-draft-p-min 1e-30"),
        (3, "LLAMA_SPEC_PROFILE=1", "--spec-draft-p-min 1e-30")], rows
    n = len(rows)
    plain_v = next(r for r in rows if r.get("variant") and not r.get("draft_n_max"))
    for i in range(3):
        sent = [r["trial_t0_s"][i] for r in rows]
        if i + 1 < 3:
            assert max(sent) < min(r["trial_t0_s"][i + 1] for r in rows), f"trial {i} overlaps the next: {rows}"
        assert sent.index(min(sent)) == i % n, f"trial {i} did not start at arm {i % n}: {sent}"
    for r in rows:
        assert len(r["decode_tps_all"]) == 3 and all(t > 0 for t in r["decode_tps_all"]), r
        if r.get("draft_n_max"):
            assert r["accept_length"] and f"--spec-draft-n-max {r['draft_n_max']}" in r["cmd"], r
    # each turn's ratio: an arm's request against its plain server's in the same turn, the range printed
    for r in rows[1:]:
        ref = plain_v if r.get("variant") and r.get("draft_n_max") else rows[0]
        want = sorted(a / b for a, b in zip(r["decode_tps_all"], ref["decode_tps_all"]))
        assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(r["turn_ratios"], want)) and \
            len(r["turn_ratios"]) == 3, (r["arm"], r["turn_ratios"], want)
    assert "per-turn ratio" in p.stdout, p.stdout
    # every other drafted arm against its length's drafted arm, turn by turn (benchmarks/paired.py), printed
    for r in rows:
        base = next((b for b in rows if b.get("draft_n_max") == r.get("draft_n_max")
                     and not (b.get("env") or b.get("variant") or b.get("draft"))), None)
        if not r.get("draft_n_max") or r is base:
            assert "paired" not in r, r
            continue
        ratios = [a / b for a, b in zip(r["decode_tps_all"], base["decode_tps_all"])]
        assert r["paired"]["turns"] == 3 and r["paired"]["faster"] == sum(x > 1 for x in ratios), r["paired"]
        assert math.isclose(r["paired"]["geomean"], statistics.geometric_mean(ratios), rel_tol=1e-9), r["paired"]
        assert f"{r['label']}: x{r['paired']['geomean']:.3f} per turn against {base['label']}" in p.stdout, p.stdout
    table = p.stdout[p.stdout.index("arm "):]
    for r in rows:
        if r.get("variant") and r.get("draft_n_max"):
            want = f"{r['decode_tps'] / plain_v['decode_tps']:.2f}x"
            label = f"dspark-n{r['draft_n_max']} [{r['env']}] [" if r.get("env") else f"{r['arm']} ["
            assert any(line.startswith(label) and want in line for line in table.splitlines()), (want, table)
    # the environment reached its own servers only: the step profile (a line every 128 target decodes;
    # 3 x 200 tokens at these acceptances take more) is in theirs alone
    for r in rows:
        profiled = "spec profile" in (logs / f"{r['arm']}.log").read_text()
        assert profiled == (r.get("env") == "LLAMA_SPEC_PROFILE=1"), (r["arm"], profiled)


def test_crash_hunt_mixed_traffic_through_many_slots(small_pair, dspark_engine, tmp_path):
    """benchmarks/slots.py mixed (issue 28's shape, the one that killed the engine at
    32 slots on CUDA): fresh servers at 16 slots, plain and drafted, 16 closed-loop clients and 32
    prompts of different lengths (50-600 tokens) each; every request answered, every cell counted,
    the JSON names each cell."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "cells.json"
    p = subprocess.run([sys.executable, str(repo / "benchmarks" / "slots.py"), "mixed", "-m", str(small_pair.target),
                        "-md", str(small_pair.draft), "--server", dspark_engine.path, "--slots", "16",
                        "--arms", "plain,draft", "--runs", "1", "--n-max", "3", "--prompt-tokens", "50-600",
                        "--n-predict", "8-24", "--ctx-per-slot", "1024", "--json", str(out),
                        "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert [(c["slots"], c["arm"]) for c in cells] == [(16, "plain"), (16, "draft")], cells
    for c in cells:
        assert not c["died"] and c["answered"] == c["requests"] == 32, c
        assert c["output_tokens"] >= 32 * 8, c
    assert "16 slots, draft, env -, run 0: ok, answered 32/32" in p.stdout, p.stdout


def _slot_steps_while_paused(log: str) -> tuple[int, list[str]]:
    """From a verbose (-v) server log: how many slot steps decoded one token while drafts were paused
    (between ``drafts paused`` and the next ``drafts no longer cut`` / ``drafts cut to``), and the
    lines that batched a new draft there (``generate_draft``: there must be none)."""
    paused, plain_steps, drafted = False, 0, []
    for line in log.splitlines():
        if "drafts paused:" in line:
            paused = True
        elif "drafts no longer cut:" in line or "drafts cut to " in line:
            paused = False
        elif paused and "generate_draft:" in line:
            drafted.append(line)
        elif paused and "slot decode token" in line:
            plain_steps += 1
    return plain_steps, drafted


def test_drafts_pause_while_more_slots_generate(strong_conv_pair, start_server):
    """Patch 0021 with L = 0 (--spec-draft-n-max-by-slots 2:0, n_max 6): while more than 2 slots
    generate no new draft is made at all, the slots decode one token a step (checked step by step in
    the verbose log, and in the wave's drafted tokens a step, which only the steps before the pause
    starts and after it ends may add to); a request alone afterwards drafts 6 a step again; every
    output stays the plain server's. A negative L is refused at start, naming N:L."""
    import pytest

    from ggufdspark.errors import ServerStartError

    common, work, alone, want = wave_then_alone(strong_conv_pair, start_server, seed=13, first=60)
    waves = []
    for _ in range(3):  # the wave's drafted rate needs its requests to arrive together: see below
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(2, 0)],
                            extra_args=["-v"], **common)
        got = serve_all(spec, work)
        last = serve_all(spec, [alone])[0]
        spec.wait_for_log(r"drafts paused: [3-8] slots busy \(--spec-draft-n-max-by-slots\)")
        spec.wait_for_log(r"drafts no longer cut: [0-2] slots busy \(--spec-draft-n-max-by-slots\)")
        spec.wait_for_log(r"stop processing", count=SLOTS + 1)  # the log trails the responses
        assert spec.alive(), f"the engine died:\n{spec.log_text()[-2000:]}"
        for i, (p, s) in enumerate(zip(want, got + [last])):
            assert "tokens" in s, f"request {i}: {s.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, s["tokens"], f"request {i}, greedy output with drafts paused under load")
        plain_steps, drafted = _slot_steps_while_paused(spec.log_text())
        assert not drafted, f"{len(drafted)} new drafts while drafts were paused, first: {drafted[0]}"
        assert plain_steps >= 3 * 30, f"only {plain_steps} slot steps while paused: the pause hardly held"
        alone_rate = _drafted_per_step([last["timings"]])
        assert alone_rate > 5.0, f"a request alone drafted {alone_rate:.2f} tokens a step ({last['timings']}): not 6"
        spec.stop()
        # 0.34-0.67 here, 1.45 with both cores busy elsewhere, once 3.53 in a full suite run: the wave's
        # requests then reach the server staggered and the first ones draft alone before the pause
        # (every step while paused drafted nothing, checked above); 5.6 when the drafts are not paused.
        # A wave that arrived staggered runs again on a fresh server, up to three times
        waves.append(_drafted_per_step([g["timings"] for g in got]))
        if waves[-1] < 2.0:
            break
    assert waves[-1] < 2.0, f"{SLOTS} requests at once drafted {waves} tokens a step in 3 waves: the pause did not hold"

    with pytest.raises(ServerStartError) as e:
        start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(2, -1)], **common)
    assert "N:L needs" in str(e.value) and "'2:-1'" in str(e.value), f"a negative L, not refused by name: {e.value}"


def drafts_and_room(log: str) -> list[tuple[int, int]]:
    """Every non-empty draft in a ``-v`` server log, as (tokens drafted, room): the room is what the
    slot had left for a draft (of n_predict and of the context), logged as "max possible draft"
    before each draft ("generate_draft: ... #draft=N"). Slots are told apart by their id."""
    room: dict[str, int] = {}
    out: list[tuple[int, int]] = []
    for line in log.splitlines():
        if m := re.search(r"\bid +(\d+) \| task +\d+ \| max possible draft: (-?\d+)", line):
            room[m[1]] = int(m[2])
        elif m := re.search(r"\bid +(\d+) \| task +\d+ \| generate_draft: .*#draft=(\d+)", line):
            out.append((int(m[2]), room.get(m[1], -1)))
    return out


def test_device_features_draft_as_the_host_path(hidden_conf_pair, start_server, monkeypatch):
    """Patch 0026: the target's tapped layers stay on the device (written with SET_ROWS into one
    persistent tensor, read by the drafter's injection with GET_ROWS) instead of going through the
    host; LLAMA_SPEC_FEATURES_HOST=1 keeps the host path. The features are the same numbers either
    way, so the same requests must draft exactly the same: one at a time, every request's drafted and
    accepted counts and tokens are identical on both paths. With -b 128 -ub 32 a prompt of 200 or 330
    tokens reaches the target in several batches and the drafter in several injection chunks (rows
    from an offset into the tensor); a wave of 4 slots with mixed prompt lengths mixes sequences in
    one chunk. Every output stays the plain server's (or departs from it at a near-tie). The device
    path runs twice: with --spec-draft-ubatch 128 (patch 0037, as serve runs CUDA: a step's rows in one
    injection decode) and without (the drafter's n_ubatch is the target's 32: several chunks a step,
    rows from an offset). Where the rows' device has events (patch 0036: CUDA) the injection is
    ordered by them and the server says so (on CUDA only); on the CPU backend it must not (host
    synchronisation).

    The counts can tell wrong features only if the drafts depend on them. The small pair's drafter
    drafts whole blocks of "repeat the last token" whatever its hidden state: a developer build whose
    device path never wrote the features (LLAMA_SPEC_TAP=noset: the drafter read zeros) passed here
    with it. hidden_conf_pair's confidence head follows the hidden state, which follows the injected
    features; with --spec-draft-p-min 0.5 it cuts some drafts short and not others (asserted: drafts
    the slot's room left whole come both whole and cut), and noset changes every request's counts."""
    slots, n_max, p_min = 4, 6, 0.5
    common = dict(model=hidden_conf_pair.target, parallel=slots, ctx_size=slots * 512,
                  extra_args=["-b", "128", "-ub", "32", "-v"])  # -v: the engine's context and draft lines
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(29)
    seq = [([rng.randrange(16, vocab) for _ in range(n)], 40) for n in (40, 200, 90, 330)]
    wave = [([rng.randrange(16, vocab) for _ in range(n)], 40) for n in (25, 150, 60, 280)]

    def one_by_one(srv) -> list[dict]:
        c = srv.client(timeout=300)
        return [c.post_json("/completion", {"prompt": p, "n_predict": n, "temperature": 0.0, "ignore_eos": True,
                                            "cache_prompt": False, "return_tokens": True, "n_probs": 2})
                for p, n in seq]

    want = one_by_one(plain) + serve_all(plain, wave)
    plain.stop()
    monkeypatch.delenv("LLAMA_SPEC_FEATURES_HOST", raising=False)
    monkeypatch.delenv("LLAMA_SPEC_INJECT_SYNC", raising=False)
    got: dict[str, list[dict]] = {}
    for path in ("device", "chunked", "host"):
        if path == "host":
            monkeypatch.setenv("LLAMA_SPEC_FEATURES_HOST", "1")  # the server inherits the environment
        one_decode = ["--spec-draft-ubatch", "128"] if path == "device" else []
        spec = start_server(draft=hidden_conf_pair.draft, draft_n_max=n_max, draft_p_min=p_min,
                            **{**common, "extra_args": common["extra_args"] + one_decode})
        got[path] = one_by_one(spec) + serve_all(spec, wave)
        spec.wait_for_log(r"stop processing", count=len(seq) + len(wave))  # the log trails the responses
        assert spec.alive(), f"{path} path: the engine died:\n{spec.log_text()[-2000:]}"
        ubatches = [int(u) for u in re.findall(r"n_ubatch\s+= (\d+)\s*$", spec.log_text(), re.M)]
        want_ub = (32, 128 if path == "device" else 32)  # the target's context first, the drafter's last
        assert len(ubatches) >= 2 and (ubatches[0], ubatches[-1]) == want_ub, (
            f"{path} path: contexts' n_ubatch {ubatches}, expected the target's {want_ub[0]} and the drafter's {want_ub[1]}")
        on_device = re.findall(r"tapped layer inputs stay on (\S+)", spec.log_text())
        assert bool(on_device) == (path != "host"), f"{path} path, yet the engine logged: {on_device}"
        events = re.findall(r"injections ordered on (\S+) by events", spec.log_text())
        assert events == ([] if path == "host" or on_device[0].startswith("CPU") else on_device[:1]), (
            f"{path} path, rows on {on_device}: the engine logged {events} for the injections' events")
        for i, (p, s) in enumerate(zip(want, got[path])):
            assert "tokens" in s, f"{path} path, request {i}: {s.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, s["tokens"], f"{path} path, request {i}, greedy output")
        roomy = Counter(k for k, room in drafts_and_room(spec.log_text()) if room >= n_max)
        assert roomy[n_max] > 0 and sum(roomy.values()) > roomy[n_max], (
            f"{path} path: drafts with room for {n_max} tokens, by length: {dict(sorted(roomy.items()))}: "
            f"not both whole and cut by the confidence head, so the counts cannot tell wrong features")
        spec.stop()

    counts = {path: [(g["timings"].get("draft_n", 0), g["timings"].get("draft_n_accepted", 0)) for g in got[path]]
              for path in got}
    n = len(seq)
    for path in ("device", "chunked"):
        assert all(d > 0 for d, _ in counts[path]), f"{path}: the draft did not engage on every request: {counts[path]}"
        assert counts[path][:n] == counts["host"][:n], (
            f"one request at a time, (drafted, accepted) per request: {path} {counts[path][:n]}, "
            f"host {counts['host'][:n]}: the features on the device draft differently")
        for i in range(n):
            assert got[path][i]["tokens"] == got["host"][i]["tokens"], (
                f"{path}, request {i}: the paths' greedy outputs differ")


def test_drafting_resumes_after_a_pause_losslessly(strong_conv_pair, start_server):
    """A request that keeps generating through a pause drafts again once the load falls, and its
    output stays the plain server's. Two slots, n_max 6, drafts paused while more than 1 is busy
    (--spec-draft-n-max-by-slots 1:0): a long and a short request at once are paused together; when
    the short one ends the long one drafts on alone. With developer patch 0027 its drafter skipped
    the paused steps' rows, so its context is started afresh at that point (the drafter's cache takes
    positions only consecutively: a stale context would fail the draft decode); without it the
    drafter took them in. Either way: resumed drafts, accepted tokens, the plain output."""
    common = dict(model=strong_conv_pair.target, parallel=2, ctx_size=2 * 512)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(41)
    work = [([rng.randrange(16, vocab) for _ in range(120)], 200), ([rng.randrange(16, vocab) for _ in range(60)], 40)]
    want = _at_once(plain, work)
    plain.stop()
    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(1, 0)],
                        extra_args=["-v"], **common)
    got = _at_once(spec, work)
    spec.wait_for_log(r"drafts paused: 2 slots busy")
    _assert_answered_as_plain(spec, want, got, lambda i: f"request {i}, greedy output across a pause")
    log = spec.log_text().splitlines()
    paused_at = max(i for i, line in enumerate(log) if "drafts paused: 2 slots busy" in line)
    resumed = [i for i, line in enumerate(log) if "drafts no longer cut: 1 slots busy" in line and i > paused_at]
    assert resumed, "the pause never ended while the long request went on"
    drafts_after = sum("generate_draft" in line for line in log[resumed[0]:])
    assert drafts_after >= 10, f"only {drafts_after} drafts after the pause ended: drafting did not resume"
    assert got[0]["timings"].get("draft_n_accepted", 0) > 0, f"no draft accepted: {got[0]['timings']}"
    assert not any("inconsistent sequence positions" in line for line in log), "a drafter decode was refused"


@pytest.mark.slow
def test_the_load_cut_counts_a_slot_processing_its_prompt(strong_conv_pair, start_server):
    """Patch 0021 (with what was 0030): --spec-draft-n-max-by-slots counts every busy slot, a prompt
    being processed as much as a slot generating, so a long prompt that arrives while one request
    drafts pauses it (1:0, two slots) for as long as the prompt takes, although the newcomer asks for
    one token and never generates. Request A (a short prompt, a long answer) starts drafting alone; then B, a
    600-token prompt in 32-token batches (about 20 steps beside A). A's answer is long (3000 tokens,
    a few seconds on a 2-core x86) so that B's prompt lands while A generates: with 700 tokens A once
    ended in 0.6 s, before B was sent. Both outputs stay the plain server's."""
    common = dict(model=strong_conv_pair.target, parallel=2, ctx_size=2 * 4096,
                  extra_args=["-b", "32", "-ub", "32", "-v"])
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(53)
    a = ([rng.randrange(16, vocab) for _ in range(20)], 3000)
    b = ([rng.randrange(16, vocab) for _ in range(600)], 1)
    want = _at_once(plain, [a]) + _at_once(plain, [b])
    plain.stop()

    def a_then_b(srv) -> list[dict]:
        out: list[dict] = []
        first = threading.Thread(target=lambda: out.extend(_at_once(srv, [a])))
        first.start()
        srv.wait_for_log(r"generate_draft: id=", timeout=120, count=3)  # A drafts alone
        second = _at_once(srv, [b])
        first.join()
        return out + second

    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(1, 0)], **common)
    got = a_then_b(spec)
    _assert_answered_as_plain(spec, want, got, lambda i: f"request {'AB'[i]}")
    log = spec.log_text().splitlines()
    spec.stop()

    a_slot = next(m[1] for line in log if (m := re.search(r"id +(\d+) \|.*task\.n_tokens = 20$", line)))
    b_start = next(i for i, line in enumerate(log) if line.endswith("task.n_tokens = 600"))
    a_end = next(i for i, line in enumerate(log) if re.search(rf"id +{a_slot} \|.*stop processing", line))
    assert b_start < a_end, "B's prompt arrived after A's answer ended: the two never overlapped"
    paused = [i for i, line in enumerate(log) if "drafts paused: 2 slots busy" in line]
    assert paused, "a prompt processed beside a drafting slot did not pause drafts (1:0, two slots busy)"
    resumed = [i for i, line in enumerate(log) if "drafts no longer cut: 1 slots busy" in line and i > paused[0]]
    assert resumed, "drafts never resumed after the newcomer's prompt"
    during = sum("generate_draft" in line for line in log[paused[0]:resumed[0]])
    assert during == 0, f"{during} drafts made while the pause held"
    assert not any("slots generating" in line for line in log), "the busy count logged a generating one"
    before, after = (sum("generate_draft" in line for line in part) for part in (log[:paused[0]], log[resumed[0]:]))
    assert before > 0 and after > 0, f"A drafted {before} times before the pause and {after} after it"


REPLANNED = re.compile(r"graphs replanned = +(\d+)")


def test_a_drafted_targets_graphs_keep_the_reserved_plan(strong_conv_pair, start_server, monkeypatch):
    """Patch 0033: a drafted LFM2 target builds graphs of one node count at every batch size (its
    conv-state snapshots by SET_ROWS for a one-token decode too), so ggml-alloc keeps the plan the
    scheduler reserved for the worst case and never plans again, as a plain target's graphs never
    make it. Traffic that mixes prompt chunks, verifies and one-token decodes (two slots, prompts of
    5-300 tokens in 32-token batches): the server's "graphs replanned" stays 0 for every request;
    with the old snapshot path (LLAMA_CONV_SNAPSHOT_ROWS=0: one CPY a slot, so a decode of one or
    two tokens has fewer nodes) the same traffic re-plans. Outputs are the plain server's either way."""
    common = dict(model=strong_conv_pair.target, parallel=2, ctx_size=2 * 1024, extra_args=["-b", "32", "-ub", "32"])
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(61)
    waves = [[([rng.randrange(16, vocab) for _ in range(n)], k) for n, k in wave]
             for wave in ([(20, 48), (300, 8)], [(5, 24)], [(150, 16), (40, 32)])]
    want = [r for wave in waves for r in _at_once(plain, wave)]
    # the log trails the responses: one timings block a request
    plain_counts = [int(REPLANNED.search(line)[1]) for line in plain.wait_for_log(REPLANNED.pattern, count=len(want))]
    plain.stop()
    assert set(plain_counts) == {0}, f"the plain target re-planned: {plain_counts}"

    counts: dict[str, list[int]] = {}
    for path in ("rows", "cpy"):
        if path == "cpy":
            monkeypatch.setenv("LLAMA_CONV_SNAPSHOT_ROWS", "0")  # the server inherits the environment
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=4, **common)
        got = [r for wave in waves for r in _at_once(spec, wave)]
        lines = spec.wait_for_log(REPLANNED.pattern, count=len(want))
        for i, (p, r) in enumerate(zip(want, got)):
            assert "tokens" in r, f"{path}, request {i}: {r.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, r["tokens"], f"{path} snapshots, request {i}")
        assert sum(r["timings"].get("draft_n_accepted", 0) for r in got) > 0, f"{path}: nothing drafted was accepted"
        counts[path] = [int(REPLANNED.search(line)[1]) for line in lines]
        spec.stop()
    assert len(counts["rows"]) == len(want) and set(counts["rows"]) == {0}, (
        f"the drafted target re-planned its graphs: {counts['rows']}")
    assert max(counts["cpy"]) > 0, f"the old snapshot path did not re-plan: {counts['cpy']} (does the count work?)"


def test_first_token_goes_out_before_the_drafter_takes_in_the_prompt(hidden_conf_pair, start_server, monkeypatch):
    """Patch 0038: where the drafter's injection runs on the host's time (no device events: the CPU
    backend), the slots whose prompt a sub-batch finished send their first token before the drafter
    takes in that sub-batch, so the drafter's prefill is not in the client's time to first token;
    where the injection is ordered by events (0036, CUDA) the drafter stays first, and
    LLAMA_SPEC_FIRST_TOKEN_LATE=1 keeps it first everywhere. The drafter takes in the same rows in
    either order and begins each slot after it has, so the default and late runs draft exactly alike: (drafted, accepted) and tokens request by request, and no "process()
    did not run on every prefill ubatch" warning from the drafter's begin. With -b 128 prompts of 200 and 330
    tokens reach the target in several sub-batches. A request for two completions (n_cmpl 2) keeps
    the old order for its prompt (its children copy the parent's finished state, the drafter's too)
    and both completions are the plain server's. With -v the server logs each early first token
    ("sent 1 first token(s) ...") and then the drafter's sub-batch: that order is asserted too."""
    n_max, p_min = 6, 0.5
    common = dict(model=hidden_conf_pair.target, parallel=4, ctx_size=4 * 512,
                  extra_args=["-b", "128", "-ub", "32", "-v"])
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(40)
    prompts = [[rng.randrange(16, vocab) for _ in range(n)] for n in (40, 200, 330, 90)]

    def run(srv) -> list[dict]:
        return in_turn_with_two(srv, prompts)

    want = run(plain)
    plain.stop()
    got: dict[str, list[dict]] = {}
    events = r"sent (\d+) first token\(s\) before the drafter|the drafter had the sub-batch \((\d+) rows\)"
    for order in ("default", "late"):
        if order == "late":
            monkeypatch.setenv("LLAMA_SPEC_FIRST_TOKEN_LATE", "1")  # the server inherits the environment
        spec = start_server(draft=hidden_conf_pair.draft, draft_n_max=n_max, draft_p_min=p_min, **common)
        got[order] = run(spec)
        spec.wait_for_log(r"stop processing", count=len(want))  # the log trails the responses
        log = spec.log_text()
        assert spec.alive(), f"{order}: the engine died:\n{log[-2000:]}"
        assert "did not run on every prefill ubatch" not in log, (
            f"{order}: a slot began drafting before the drafter had its whole prompt:\n{log[-2000:]}")
        seen = [(m[1] is not None, m[0]) for m in re.finditer(events, log)]
        early = [i for i, (first, _) in enumerate(seen) if first]
        by_events = bool(re.search(r"injections ordered on \S+ by events", log))
        launched_early = "the drafter's injection is launched before the host waits for the target" in log
        if order == "default" and not by_events and not launched_early:
            assert len(early) == 3, f"early first tokens logged {len(early)} times, expected one per single request (3)"
            assert all(i + 1 < len(seen) and not seen[i + 1][0] for i in early), (
                f"a first token sent early was not followed by the drafter's sub-batch: {seen}")
        else:
            assert not early, (f"{order} order (injections by events: {by_events}, launched before the wait: "
                               f"{launched_early}), yet first tokens went out early: {[seen[i] for i in early]}")
        for i, (p, g) in enumerate(zip(want, got[order])):
            assert "tokens" in g, f"{order}, request {i}: {g.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, g["tokens"], f"{order}, request {i}, greedy output")
        spec.stop()

    counts = {o: [(g["timings"].get("draft_n", 0), g["timings"].get("draft_n_accepted", 0)) for g in got[o]]
              for o in got}
    assert all(d > 0 for d, _ in counts["default"]), f"the draft did not engage on every request: {counts['default']}"
    assert counts["late"] == counts["default"], (
        f"(drafted, accepted) per request: by default {counts['default']}, first token late {counts['late']}")
    assert [g["tokens"] for g in got["late"]] == [g["tokens"] for g in got["default"]], "default and late outputs differ"


def _assert_answered_as_plain(spec, want: list[dict], got: list[dict], label) -> None:
    """Every request of ``got`` answered by the live drafted server ``spec`` with the plain server's
    tokens (``want``), or departing from them at a near-tie; ``label(i)`` names request i."""
    spec.wait_for_log(r"stop processing", count=len(want))  # the log trails the responses
    assert spec.alive(), f"the engine died:\n{spec.log_text()[-2000:]}"
    for i, (p, s) in enumerate(zip(want, got)):
        assert "tokens" in s, f"{label(i)}: {s.get('error', 'no tokens in the response')}"
        assert_same_or_near_tie(p, s["tokens"], label(i))


def _at_once(srv, work) -> list[dict]:
    """``work`` sent all at once, one thread a request (greedy, n_probs 2 for the near-tie check)."""
    out = closed_loop(srv, [[(i, prompt, n)] for i, (prompt, n) in enumerate(work)])
    return [out[i] for i in range(len(work))]


CHECKPOINT = re.compile(r"created context checkpoint \d+ of \d+ \(pos_min = (-?\d+), pos_max = (-?\d+), "
                        r"n_tokens = (\d+), size = ([\d.]+) MiB\)")


def test_a_prompt_checkpoint_restores_the_drafter_without_copying_it(strong_conv_pair, start_server, monkeypatch):
    """Patch 0028: the server's prompt checkpoints (the hybrid target's recurrent state, taken near a
    prompt's end) no longer copy the drafter's K/V, which a plain KV cache ignored the "partial only"
    flag for (a 4096-token prompt: its whole cache to the host, twice). A drafter whose cache drops
    any tail keeps its cells across a restore: the slot's seq_rm trims them. So: on one slot, a
    prompt, then a second prompt that shares its first 175 tokens (the target restores the
    checkpoint taken at n - 36 and processes on from there): the drafted server's checkpoints are as
    small as the plain server's, and the second request drafts exactly as with the copy
    (LLAMA_SPEC_CKPT_DFT=1: the drafter's K/V copied and loaded back), its output the plain one."""
    common = dict(model=strong_conv_pair.target, parallel=1, ctx_size=1024,
                  extra_args=["-b", "128", "-ub", "32", "-v"])  # checkpoints at n - 36 and n - 4; -v: their lines
    rng = random.Random(53)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    first = [rng.randrange(16, vocab) for _ in range(190)]
    second = first[:175] + [rng.randrange(16, vocab) for _ in range(70)]

    def both(srv) -> list[dict]:
        c = srv.client(timeout=300)
        return [c.post_json("/completion", {"prompt": p, "n_predict": 48, "temperature": 0.0, "ignore_eos": True,
                                            "cache_prompt": True, "return_tokens": True, "n_probs": 2})
                for p in (first, second)]

    def checkpoints(srv) -> list[tuple[int, float]]:
        srv.wait_for_log(r"stop processing", count=2)  # the log trails the responses
        return [(int(m.group(3)), float(m.group(4))) for m in CHECKPOINT.finditer(srv.log_text())]

    want = both(plain)
    plain_ckpts = checkpoints(plain)
    assert "restored context checkpoint" in plain.log_text(), "the second prompt restored no checkpoint"
    plain.stop()
    assert plain_ckpts, "the plain server made no prompt checkpoint"
    got: dict[str, list[dict]] = {}
    sizes: dict[str, list[tuple[int, float]]] = {}
    monkeypatch.delenv("LLAMA_SPEC_CKPT_DFT", raising=False)
    for way in ("trimmed", "copied"):
        if way == "copied":
            monkeypatch.setenv("LLAMA_SPEC_CKPT_DFT", "1")  # the server inherits the environment
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, **common)
        got[way] = both(spec)
        sizes[way] = checkpoints(spec)
        log = spec.log_text()
        assert spec.alive(), f"{way}: the engine died:\n{log[-2000:]}"
        assert "restored context checkpoint" in log, f"{way}: the second prompt restored no checkpoint"
        assert "inconsistent sequence positions" not in log, f"{way}: a drafter decode was refused"
        for i, (p, s) in enumerate(zip(want, got[way])):
            assert "tokens" in s, f"{way}, request {i}: {s.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, s["tokens"], f"{way}, request {i}, greedy output")
        spec.stop()

    assert [n for n, _ in sizes["trimmed"]] == [n for n, _ in plain_ckpts], (sizes["trimmed"], plain_ckpts)
    for (n, mib), (_, plain_mib) in zip(sizes["trimmed"], plain_ckpts):
        assert mib <= plain_mib + 0.01, f"checkpoint at {n} tokens: {mib} MiB with the draft, {plain_mib} plain"
    assert all(mib > plain_mib + 0.01 for (_, mib), (_, plain_mib) in zip(sizes["copied"], plain_ckpts)), (
        f"LLAMA_SPEC_CKPT_DFT=1 copied no drafter state: {sizes['copied']} against plain {plain_ckpts}")
    counts = {way: [(g["timings"].get("draft_n", 0), g["timings"].get("draft_n_accepted", 0)) for g in got[way]]
              for way in got}
    assert counts["trimmed"][1][0] > 0, f"the second request never drafted: {counts['trimmed']}"
    assert counts["trimmed"] == counts["copied"], (
        f"(drafted, accepted) per request: trimmed {counts['trimmed']}, copied {counts['copied']}: the drafter's "
        "context after the restore differs")
    assert got["trimmed"][1]["tokens"] == got["copied"][1]["tokens"]


DRAFT_LINE = re.compile(r"generate_draft: id=\d+, #tokens=(\d+), #draft=(\d+), pos_next=")


def test_a_slot_near_its_answers_end_drafts_full_length_beside_busy_slots(strong_conv_pair, start_server, monkeypatch):
    """Patch 0048: while another slot is busy, a slot whose answer is about to end drafts as long as
    the others (n_max), not only the tokens its answer has left: a shorter verify ends the run of
    consecutive slots the engine batches together (split_equal). Nothing past the end is sent or
    counted accepted, and the slot's state rolls back to its last sent token: a next turn on that
    slot that reuses the cached prompt (the answer included) answers as the plain server does.
    LLAMA_SERVER_DRAFT_END_BOUND=1 keeps upstream's bound (the draft at most the tokens left - 1).
    Request A (20-token prompt, 24-token answer) on slot 0 beside B (300 tokens, 200) on slot 1;
    then C on slot 0: A's prompt, A's answer and 40 more tokens."""
    common = dict(model=strong_conv_pair.target, parallel=2, ctx_size=2 * 1024, extra_args=["-v"])
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(48)
    a_prompt, a_n = [rng.randrange(16, vocab) for _ in range(20)], 24
    b_prompt, b_n = [rng.randrange(16, vocab) for _ in range(300)], 200
    more = [rng.randrange(16, vocab) for _ in range(40)]

    def request(srv, prompt: list[int], n: int, slot: int) -> dict:
        return srv.client(timeout=300).post_json("/completion", {
            "prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True, "cache_prompt": True,
            "id_slot": slot, "return_tokens": True, "n_probs": 2})

    def a_beside_b_then_c(srv) -> list[dict]:
        out: dict[str, dict] = {}
        b = threading.Thread(target=lambda: out.update(b=request(srv, b_prompt, b_n, 1)))
        b.start()
        # A only once B holds slot 1 (else, on a loaded machine, A may run alone: nothing beside it)
        srv.wait_for_log(r"launch_slot_: id +1 \| task \d+", timeout=120)
        out["a"] = request(srv, a_prompt, a_n, 0)
        b.join()
        assert "tokens" in out["a"], out["a"].get("error", out["a"])
        out["c"] = request(srv, a_prompt + out["a"]["tokens"] + more, 16, 0)
        return [out["a"], out["b"], out["c"]]

    want = a_beside_b_then_c(plain)
    plain.stop()

    past_end: dict[str, list[int]] = {}
    got: dict[str, list[dict]] = {}
    for way in ("past end", "bounded"):
        if way == "bounded":
            monkeypatch.setenv("LLAMA_SERVER_DRAFT_END_BOUND", "1")  # the server inherits the environment
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, **common)
        got[way] = a_beside_b_then_c(spec)
        spec.wait_for_log(r"stop processing", count=3)  # the log trails the responses
        log = spec.log_text()
        assert spec.alive(), f"{way}: the engine died:\n{log[-2000:]}"
        for name, p, g in zip("ABC", want, got[way]):
            assert "tokens" in g, f"{way}, request {name}: {g.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, g["tokens"], f"{way}, request {name}, greedy output")
        a = got[way][0]
        assert len(a["tokens"]) == a_n and a["timings"]["predicted_n"] == a_n, (
            f"{way}: A sent {len(a['tokens'])} tokens (timings {a['timings']['predicted_n']}), asked {a_n}")
        assert a["timings"].get("draft_n_accepted", 0) <= a_n - 1, f"{way}: accepted past the end: {a['timings']}"
        # A's drafts (its #tokens stay below B's prompt length); tokens left after the sampled one:
        # prompt + answer - #tokens - 1, so upstream's bound is a draft of at most that - 1
        a_drafts = [(int(t), int(d)) for t, d in DRAFT_LINE.findall(log) if int(t) < len(b_prompt)
                    and int(t) <= len(a_prompt) + a_n]
        assert a_drafts, f"{way}: request A never drafted"
        past_end[way] = [d for t, d in a_drafts if d > len(a_prompt) + a_n - t - 2]
        spec.stop()

    assert not past_end["bounded"], f"LLAMA_SERVER_DRAFT_END_BOUND=1, yet A drafted past its end: {past_end['bounded']}"
    assert past_end["past end"] and max(past_end["past end"]) == 6, (
        f"beside a busy slot, A's last drafts stayed within its answer: {past_end['past end']}")


def test_drafted_ids_reach_the_verify_on_the_device(strong_conv_pair, start_server, dspark_engine, monkeypatch):
    """Patch 0061: a greedy DSpark draft without a confidence cut hands its ids to the target's
    verify through a token map on the token table's device (on a CPU build the CPU backend's memory;
    on a CUDA build the GPU, where the drafted servers load the table as ``serve`` does), and the
    host waits for the drafter only after the verify; the server says so. The verify reads the
    drafted ids from that map, so a wrong or stale row would put another token than the accepted one
    into the context and change what follows: every request of three 8-slot waves with mixed prompt
    lengths gives the plain server's tokens (or departs at a near-tie), with drafts accepted. One
    request at a time, tokens and drafted / accepted counts equal the host path's
    (LLAMA_SPEC_IDS_HOST=1). With a confidence cut (p_min above 0) a draft's length is known only
    from its ids, which then go through the host."""
    said = "drafted ids reach the target's verify on the device"
    table = token_table_device(dspark_engine)
    common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
    _, work, want = plain_waves(start_server, common, seed=61)
    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, token_table_device=table, **common)
    assert_waves_as_plain(spec, work, want, said, "drafted ids read on the device")

    device, log_device = one_at_a_time(start_server, strong_conv_pair, work, monkeypatch, {"LLAMA_SPEC_IDS_HOST": None},
                                       table)
    host, log_host = one_at_a_time(start_server, strong_conv_pair, work, monkeypatch, {"LLAMA_SPEC_IDS_HOST": "1"},
                                   table)
    assert said in log_device and said not in log_host, "LLAMA_SPEC_IDS_HOST=1 did not keep the ids on the host"
    assert sum(a for _, _, a in device) > 0, f"nothing drafted was accepted one at a time: {device}"
    for i, (d, h) in enumerate(zip(device, host)):
        assert d == h, f"request {i}: device ids (tokens, drafted, accepted) {d} != host ids {h}"

    cut = start_server(model=strong_conv_pair.target, draft=strong_conv_pair.draft, draft_n_max=6, draft_p_min=0.5,
                       parallel=1, ctx_size=512, token_table_device=table)
    r = cut.client(timeout=300).post_json("/completion", {"prompt": work[0][0], "n_predict": 16, "temperature": 0.0,
                                                            "cache_prompt": False})
    assert r["timings"].get("draft_n", 0) > 0, "p_min 0.5: nothing drafted"
    assert said not in cut.log_text(), "p_min 0.5: the drafted ids went to the device though a confidence cut reads them"


def test_thirty_two_slots_under_mixed_traffic_are_lossless(strong_conv_pair, start_server):
    """Issue 27's lossless goal at 32 slots, on the traffic a server sees: 32 clients in a closed loop,
    prompts of 10-600 tokens, answers of 4-64, so prompts join running drafts, slots finish apart
    and the busy count crosses serve's CUDA load cut (drafts of 6 cut to 3 above 16 busy slots) both
    ways. Every answer equals the plain server's under the same traffic (or first differs at a
    near-tie), and the engine lives."""
    clients, per_client = 32, 2
    rng = random.Random(32)
    common = dict(model=strong_conv_pair.target, parallel=clients, ctx_size=clients * 700)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    lengths = [round(math.exp(rng.uniform(math.log(10), math.log(600)))) for _ in range(clients * per_client)]
    work = [([rng.randrange(16, vocab) for _ in range(n)], rng.randint(4, 64)) for n in lengths]
    queues = [[(c * per_client + k, *work[c * per_client + k]) for k in range(per_client)] for c in range(clients)]
    want = closed_loop(plain, queues)
    plain.stop()

    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, draft_n_max_by_slots=[(16, 3)], **common)
    got = closed_loop(spec, queues)
    assert spec.alive(), f"the engine died under {clients}-slot mixed traffic:\n{spec.log_text()[-2000:]}"
    spec.wait_for_log(r"drafts cut to 3 tokens: \d+ slots busy")
    spec.wait_for_log(r"drafts no longer cut: \d+ slots busy")
    for rid in range(len(work)):
        p, s = want[rid], got[rid]
        assert "tokens" in p, f"request {rid}, plain: {p.get('error', 'no tokens in the response')}"
        assert "tokens" in s, f"request {rid}, drafted: {s.get('error', 'no tokens in the response')}"
        assert_same_or_near_tie(p, s["tokens"], f"request {rid} ({len(work[rid][0])}-token prompt), greedy "
                                                f"output with the draft at {clients} slots")
    drafted = sum(s["timings"].get("draft_n", 0) for s in got.values())
    accepted = sum(s["timings"].get("draft_n_accepted", 0) for s in got.values())
    assert drafted > 0 and accepted > 0, f"drafted {drafted}, accepted {accepted}: the draft never engaged"


def _stream_then_hang_up(port: int, prompt: list[int], n_predict: int, chunks: int) -> int:
    """A streamed greedy request whose client goes away after ``chunks`` token chunks (a closed chat
    tab): the connection is closed mid-answer. Returns the chunks read."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "stream": True}
    conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()[:300]
    got = 0
    while got < chunks:
        line = r.readline()
        assert line, f"the stream ended after {got} chunks, before the client hung up"
        got += line.startswith(b"data:")
    conn.close()
    return got


def test_clients_that_hang_up_mid_answer_leave_the_others_lossless(strong_conv_pair, start_server):
    """Real traffic has clients that go away: 8 streamed requests on 8 drafting slots, 4 of whose
    clients close the connection after a few tokens. The server cancels those slots between steps;
    the 4 answers that run on, and a second wave of 8 on the same slots, equal the plain server's,
    and the engine lives."""
    # A hung-up request asks for far more tokens than its client reads: the server only learns of
    # the hang-up when a write fails, so a short answer could be written out whole into the socket's
    # buffer before a slow client (a loaded CI machine) gets to close, and never be cancelled.
    hung_n = 1024
    common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * (hung_n + 256))
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(41)
    first = [([rng.randrange(16, vocab) for _ in range(rng.randint(20, 120))], 160) for _ in range(SLOTS)]
    second = [([rng.randrange(16, vocab) for _ in range(rng.randint(20, 120))], rng.randint(20, 60)) for _ in range(SLOTS)]
    want = serve_all(plain, first[SLOTS // 2:] + second)
    plain.stop()

    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, **common)
    port = int(spec.url.rsplit(":", 1)[1])
    kept: dict[int, dict] = {}
    hung: dict[int, int] = {}

    def keep(i: int) -> None:
        kept[i] = spec.client(timeout=300).post_json("/completion", {
            "prompt": first[i][0], "n_predict": first[i][1], "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "n_probs": 2})

    def hang_up(i: int) -> None:
        hung[i] = _stream_then_hang_up(port, first[i][0], hung_n, chunks=5 + 3 * i)

    all_at_once(lambda i: hang_up(i) if i < SLOTS // 2 else keep(i), range(SLOTS))
    assert sorted(hung) == list(range(SLOTS // 2)), hung
    spec.wait_for_log(r"stop processing", count=SLOTS)  # the hung-up slots were released too
    cancelled = re.findall(r"cancel task, id_task = (\d+)", spec.log_text())
    assert len(cancelled) == SLOTS // 2, f"the server cancelled tasks {cancelled}, not one a client that hung up"
    from ggufdspark.timings.live import LogWindow

    seen = LogWindow(spec.log_path, from_end=False).take()  # what serve's stats line reads of it
    assert (seen.cancelled, seen.requests) == (SLOTS // 2, SLOTS // 2), seen
    got = [kept[i] for i in range(SLOTS // 2, SLOTS)] + serve_all(spec, second)
    assert spec.alive(), f"the engine died after clients hung up:\n{spec.log_text()[-2000:]}"
    for i, (p, s) in enumerate(zip(want, got)):
        assert "tokens" in s, f"request {i}: {s.get('error', 'no tokens in the response')}"
        assert_same_or_near_tie(p, s["tokens"], f"request {i}, greedy output after other clients hung up")
    assert sum(s["timings"].get("draft_n", 0) for s in got) > 0, "the draft never engaged"


def test_greedy_answers_stay_lossless_beside_sampled_ones_in_the_batch(strong_conv_pair, start_server, monkeypatch):
    """Real traffic mixes scripts' greedy requests with chat pages' sampled ones (temperature 0.8,
    top-k 40) in one batch: with the draft on, every greedy answer equals the plain server's, with
    the host reading each sampled row (LLAMA_OUTPUT_TOPK=0, the CPU default) and with the graph's
    top 64 on for the steps a sampled slot can use it (LLAMA_OUTPUT_TOPK=64, the CUDA default:
    patches 0050-0052), while the sampled answers run their full length with drafts accepted."""
    common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = workload(vocab, seed=23)[:2 * SLOTS]
    greedy = [i for i in range(len(work)) if i % 2 == 0]
    want = serve_all(plain, [work[i] for i in greedy])
    plain.stop()

    def mixed(srv) -> list[dict]:
        client = srv.client(timeout=300)
        out: list[dict | None] = [None] * len(work)

        def one(i: int) -> None:
            prompt, n = work[i]
            body = {"prompt": prompt, "n_predict": n, "ignore_eos": True, "cache_prompt": False,
                    "return_tokens": True}
            body.update({"temperature": 0.0, "n_probs": 2} if i % 2 == 0 else
                        {"temperature": 0.8, "top_k": 40, "seed": 1000 + i})
            try:
                out[i] = client.post_json("/completion", body)
            except Exception as e:  # noqa: BLE001 - the assertion names it
                out[i] = {"error": repr(e)}

        for wave in range(0, len(work), SLOTS):
            all_at_once(one, range(wave, min(wave + SLOTS, len(work))))
        return out  # type: ignore[return-value]

    for topk in ("0", "64"):
        monkeypatch.setenv("LLAMA_OUTPUT_TOPK", topk)
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, extra_args=["-v"], **common)
        got = mixed(spec)
        assert spec.alive(), f"LLAMA_OUTPUT_TOPK={topk}: the engine died:\n{spec.log_text()[-2000:]}"
        for i, g in enumerate(got):
            assert "tokens" in g, f"LLAMA_OUTPUT_TOPK={topk}, request {i}: {g.get('error', 'no tokens')}"
            assert len(g["tokens"]) == work[i][1], f"LLAMA_OUTPUT_TOPK={topk}, request {i}: a short answer"
        for k, i in enumerate(greedy):
            assert_same_or_near_tie(want[k], got[i]["tokens"],
                                    f"LLAMA_OUTPUT_TOPK={topk}, greedy request {i} beside sampled ones")
        sampled = [got[i]["timings"] for i in range(len(work)) if i % 2]
        assert sum(t.get("draft_n_accepted", 0) for t in sampled) > 0, f"LLAMA_OUTPUT_TOPK={topk}: {sampled}"
        spec.stop()
        graph = "top-k 40 from the graph's top 64 candidates" in spec.log_text()
        assert graph == (topk == "64"), f"LLAMA_OUTPUT_TOPK={topk}: the graph's candidates taken: {graph}"


def test_answers_ending_at_a_stop_string_end_where_the_plain_servers_do(strong_conv_pair, start_server, dspark_engine):
    """Real answers end before n_predict, at a stop string (or the end-of-generation token) that a
    drafted step may accept in the middle of its tokens: the tokens after it must go nowhere. Every
    answer of 8 slots at once with a stop string from the middle of its plain answer ends at the
    same place with the same text, tokens and stop reason as the plain server's, streamed or not.

    The plain server answers each request twice (whole, then streamed), and a drafted answer must be
    one of those. They are one answer wherever the engine gives a row the same result whatever else
    is in its batch; a GPU's kernels do not, and this numerically chaotic pair then took the plain
    server itself to another answer in one of its two runs (an H200: request 3 of 8, the streamed
    run), and a drafted answer, whose rows go through the verify's batches, to a third (an H100: 1
    run in 5 with one request of 8). So on a CUDA build an answer that is neither of the plain
    server's must depart from its whole answer where the plain server's top-2 were a near-tie, and
    still end as its stop string says; at least 6 of the 8 must be one of the plain server's exactly.
    Elsewhere (the CPU backend: a row's result is its own) every answer must be one of the plain
    server's."""
    common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    work = [(p, 90) for p, _ in workload(vocab, seed=9)[:SLOTS]]
    full = serve_all(plain, work)
    c = plain.client(timeout=300)
    stops = []
    for i, r in enumerate(full):  # two characters of the answer that first occur after its first 16 tokens
        text = r["content"]
        start = len(c.detokenize(r["tokens"][:16]))
        piece = next((text[k:k + 2] for k in range(start, len(text) - 2) if text[k:k + 2].strip()
                      and "\ufffd" not in text[k:k + 2] and text.find(text[k:k + 2]) >= start), None)
        stops.append(piece)
    # an answer that repeats one token from the start has no such piece: those go without a stop
    assert sum(x is not None for x in stops) >= SLOTS // 2, stops

    def ask(srv, stream: bool, probs: int = 0) -> list[dict]:
        client = srv.client(timeout=300)
        out: list[dict | None] = [None] * len(work)

        def one(i: int) -> None:
            body = {"prompt": work[i][0], "n_predict": work[i][1], "temperature": 0.0, "cache_prompt": False,
                    "stop": [stops[i]] if stops[i] else [], "return_tokens": True, "n_probs": probs}
            if not stream:
                out[i] = client.post_json("/completion", body)
                return
            parts, tokens, final = [], [], None
            for line in client.stream_lines("/completion", body):
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    chunk = json.loads(line[5:])
                    final = chunk if chunk.get("stop") else final
                    parts.append(chunk.get("content", ""))
                    tokens += chunk.get("tokens") or [] if not chunk.get("stop") else []
            out[i] = {**(final or {}), "content": "".join(parts), "tokens": tokens}

        all_at_once(one, range(len(work)))
        return out  # type: ignore[return-value]

    def answer(r: dict) -> tuple:
        return r["content"], tuple(r["tokens"]), r["stop_type"], r["stopping_word"]

    want = {stream: ask(plain, stream, probs=0 if stream else 2) for stream in (False, True)}
    plain.stop()
    plains = [{answer(want[False][i]), answer(want[True][i])} for i in range(len(work))]
    for i in (i for i in range(len(work)) if stops[i]):  # the stop came from plain's answer: it ends one early
        assert any(a[2] == "word" and a[3] == stops[i] and len(a[1]) < work[i][1] for a in plains[i]), \
            f"request {i}: the stop {stops[i]!r} did not end a plain answer early: {plains[i]}"
    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, **common)
    batch_dependent = is_cuda_build(dspark_engine)
    for stream in (False, True):
        got = ask(spec, stream)
        exact = 0
        for i, s in enumerate(got):
            what = f"request {i} ({'streamed' if stream else 'whole'}, stop {stops[i]!r})"
            if answer(s) in plains[i]:
                exact += 1
                continue
            assert batch_dependent, f"{what}: {answer(s)} is none of the plain server's {plains[i]}"
            # not one of the plain server's: a departure at its near-tie, still ending as its stop says
            assert_same_or_near_tie(want[False][i], list(s["tokens"]), f"{what}: {answer(s)}")
            assert not stops[i] or stops[i] not in s["content"], f"{what}: the stop string is inside {answer(s)}"
            # at its limit by the server's count: before product patch 0089 a stream never listed the
            # tokens held back inside a UTF-8 character, so a streamed answer could list fewer (an
            # H100: a departed answer of 90 listed 88; the plain server's streams did the same)
            ended = (s["stop_type"] == "word" and s["stopping_word"] == stops[i]) or (
                s["stop_type"] == "limit" and s["tokens_predicted"] == work[i][1]) or s["stop_type"] == "eos"
            assert ended, f"{what}: ends as neither its stop string nor its limit says: {answer(s)}"
        assert exact >= len(work) - 2, (
            f"{'streamed' if stream else 'whole'}: only {exact} of {len(work)} answers are the plain server's")
    assert spec.alive()
    assert sum(r["timings"].get("draft_n_accepted", 0) for r in got) > 0, "no draft was accepted"


def test_multi_turn_chats_through_the_prompt_cache_stay_lossless(strong_conv_pair, start_server):
    """Chat traffic: 8 clients on 6 slots, each a conversation of 3 turns whose next prompt is the last
    prompt, its answer and a new user message, sent with cache_prompt (a chat page's default). Turns
    reuse their conversation's cached tokens in their slot or come back through the host prompt
    cache (the target's state and the drafter's, with 0028's checkpoints and 0045's slot choice);
    on the strong-conv pair a wrong conv or drafter state changes the answer.

    The oracle: over a long context this pair is numerically chaotic in places: one plain server
    gives another answer there with only its ubatch size changed (seen on CPU: a top-2 gap of 0.85
    flipped by -ub 512 against 16), and a drafted step's verify is such a batching. So each drafted
    answer must equal the plain server's under the same traffic (or depart at a near-tie) wherever
    plain's answer holds under every batching tried (the same prompts processed whole on one-slot
    servers with ubatches of 512, 16 and 3 rows); a conversation is followed up to its first turn
    where it does not."""
    clients, turns, slots = 8, 3, 6
    common = dict(model=strong_conv_pair.target, parallel=slots, ctx_size=slots * 1024)
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(61)
    opening = [[rng.randrange(16, vocab) for _ in range(rng.randint(40, 200))] for _ in range(clients)]
    said = [[[rng.randrange(16, vocab) for _ in range(rng.randint(5, 40))] for _ in range(turns)] for _ in range(clients)]

    def chat(srv) -> list[list[tuple[list[int], dict]]]:
        """Every conversation's turns: (the prompt sent, the answer)."""
        client = srv.client(timeout=300)
        out: list[list[tuple[list[int], dict]]] = [[] for _ in range(clients)]

        def talk(c: int) -> None:
            prompt = list(opening[c])
            for t in range(turns):
                try:
                    r = client.post_json("/completion", {"prompt": prompt, "n_predict": 24 + 8 * t, "temperature": 0.0,
                                                         "ignore_eos": True, "cache_prompt": True,
                                                         "return_tokens": True, "n_probs": 2})
                except Exception as e:  # noqa: BLE001 - the assertion names it
                    out[c].append((prompt, {"error": repr(e)}))
                    return
                out[c].append((prompt, r))
                prompt = prompt + r["tokens"] + said[c][t]

        all_at_once(talk, range(clients))
        return out

    want = chat(plain)
    plain.stop()
    stable = [[True] * turns for _ in range(clients)]
    for ub in (512, 16, 3):  # the same prompts processed whole, in ubatches of these sizes
        one = start_server(spec_type=None, model=strong_conv_pair.target, parallel=1, ctx_size=1024,
                           extra_args=["-b", "2048", "-ub", str(ub)])
        for c, conv in enumerate(want):
            for t, (prompt, r) in enumerate(conv):
                stable[c][t] &= one.client(timeout=300).post_json("/completion", {
                    "prompt": prompt, "n_predict": len(r["tokens"]), "temperature": 0.0, "ignore_eos": True,
                    "cache_prompt": False, "return_tokens": True})["tokens"] == r["tokens"]
        one.stop()
    spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, extra_args=["-v"], **common)  # -v: the cache's trace
    got = chat(spec)
    assert spec.alive(), f"the engine died under multi-turn chats:\n{spec.log_text()[-2000:]}"
    checked = 0
    for c in range(clients):
        for t in range(turns):
            (pp, p), (sp, s) = want[c][t], got[c][t] if t < len(got[c]) else ([], {"error": "not sent"})
            assert "tokens" in s, f"client {c}, turn {t}, drafted: {s.get('error')}"
            if not stable[c][t] or sp != pp:  # plain's own answer moves with its batching: stop here
                break
            checked += 1
            if p["tokens"] != s["tokens"]:  # a near-tie changes the rest of that conversation: stop there
                assert_same_or_near_tie(p, s["tokens"], f"client {c}, turn {t}, greedy answer with the draft")
                break
    assert checked >= clients * turns * 2 // 3, f"only {checked} turns where plain's answer is stable: {stable}"
    reused = [r["timings"].get("cache_n", 0) for conv in got for _, r in conv[1:]]
    assert all(reused), f"a later turn reused none of its conversation: {reused}"
    # the engine's logger thread may write a turn's cache lines after the answers went out: wait for one
    try:
        spec.wait_for_log(r"found better prompt", timeout=30)
    except LogWaitTimeoutError:
        pass  # the assert below says what is missing
    restored = len(re.findall(r"found better prompt", spec.log_text()))
    assert restored > 0, "no turn came back through the host prompt cache: its path was not exercised"
    assert sum(r["timings"].get("draft_n_accepted", 0) for conv in got for _, r in conv) > 0, "no draft was accepted"


def test_the_injection_launched_before_the_host_waits_gives_the_same_drafts(strong_conv_pair, hidden_conf_pair, start_server,
                                                                            monkeypatch, dspark_engine):
    """Patch 0062: where events order the drafter's injection after the target (CUDA), the server
    launches it right after the target's decode, before it waits for the target, and says so; where
    they do not (the CPU backend) the injection stays after the wait, and LLAMA_SPEC_INJECT_LATE=1
    keeps it there on any backend. The drafter must take in every sub-batch's rows exactly once
    (twice, or never, changes its drafts). On a CUDA build (the GPU's run of this suite), three
    8-slot waves with mixed prompt lengths on the early path give the plain server's tokens (or
    depart at a near-tie) with drafts accepted. On every build, one request at a time, with prompts
    over several sub-batches, a request for two completions and a drafter whose draft lengths
    follow what it took in: tokens and (drafted, accepted) counts per request are the same by
    default and with the switch, and the plain server's."""
    said = "the drafter's injection is launched before the host waits for the target"
    early_by_default = is_cuda_build(dspark_engine)  # events order the injection there
    monkeypatch.delenv("LLAMA_SPEC_INJECT_LATE", raising=False)
    if early_by_default:
        common = dict(model=strong_conv_pair.target, parallel=SLOTS, ctx_size=SLOTS * 320)
        _, work, want = plain_waves(start_server, common, seed=62)
        spec = start_server(draft=strong_conv_pair.draft, draft_n_max=6, **common)
        assert_waves_as_plain(spec, work, want, said, "injection before the wait")

    # one request at a time, prompts over several sub-batches (-b 128), a two-completion request, and
    # a drafter whose draft lengths follow the injected features (hidden_conf_pair, p_min 0.5)
    n_max, p_min = 6, 0.5
    common = dict(model=hidden_conf_pair.target, parallel=4, ctx_size=4 * 512, extra_args=["-b", "128", "-ub", "32"])
    plain = start_server(spec_type=None, **common)
    vocab = int(json.loads(plain.client().get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    rng = random.Random(62)
    prompts = [[rng.randrange(16, vocab) for _ in range(n)] for n in (40, 200, 330, 90)]
    want = in_turn_with_two(plain, prompts)
    plain.stop()
    got: dict[str, list[dict]] = {}
    for arm in ("default", "late"):
        if arm == "late":
            monkeypatch.setenv("LLAMA_SPEC_INJECT_LATE", "1")  # the server inherits the environment
        spec = start_server(draft=hidden_conf_pair.draft, draft_n_max=n_max, draft_p_min=p_min, **common)
        got[arm] = in_turn_with_two(spec, prompts)
        spec.wait_for_log(r"stop processing", count=len(want))  # the log trails the responses
        log = spec.log_text()
        assert spec.alive(), f"arm {arm!r}: the engine died:\n{log[-2000:]}"
        early = arm == "default" and early_by_default
        assert (said in log) == early, (
            f"arm {arm!r} ({'before' if early else 'after'} the wait expected), yet the log says otherwise:\n{log[-2000:]}")
        assert "did not run on every prefill ubatch" not in log, (
            f"arm {arm!r}: a slot began drafting before the drafter had its whole prompt:\n{log[-2000:]}")
        for k, (p, g) in enumerate(zip(want, got[arm])):
            assert "tokens" in g, f"arm {arm!r}, request {k}: {g.get('error', 'no tokens in the response')}"
            assert_same_or_near_tie(p, g["tokens"], f"arm {arm!r}, request {k}")
        spec.stop()
    counts = {a: [(g["timings"].get("draft_n", 0), g["timings"].get("draft_n_accepted", 0)) for g in got[a]] for a in got}
    assert all(d > 0 for d, _ in counts["default"]), f"the draft did not engage on every request: {counts['default']}"
    assert counts["default"] == counts["late"], (
        f"(drafted, accepted) per request: by default {counts['default']}, injection after the wait {counts['late']}")
    assert [g["tokens"] for g in got["default"]] == [g["tokens"] for g in got["late"]], "outputs differ"
