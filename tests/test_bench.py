"""bench: speedup arms, the lossless gate and prompt sets, against the real engine on CPU.

Runs are kept small (one item per category, 16-24 tokens, concurrency 1,2): this proves the
mechanics and the gate, not speed (timings on a tiny model are noise).
"""

from __future__ import annotations

import json
import math

import pytest

from ggufdspark.errors import BenchError, InputNotFoundError, LosslessGateError
from ggufdspark.measuring import bench as bn
from ggufdspark.measuring import prompts as pr
from ggufdspark.serve_checks import ServingOptions

# These runs prove the mechanics, not speed: one tiny request's decode time moves by 20% from run
# to run on a shared 2-core machine, so the plain-drift refusal (exit 5, test_bench_inputs.py)
# is given room here.
ANY_DRIFT = ["--max-plain-drift", "inf"]  # these tests measure no speed: any drift passes


def test_bench_small_pair_passes_lossless_gate(small_pair, ggufdspark_cli, isolated, tmp_path):
    png = tmp_path / "bench.png"
    out = tmp_path / "bench.json"
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
                       "-n", "24", "--concurrency", "1,2", "--plot", str(png), "--log-dir", str(tmp_path / "logs"),
                       *ANY_DRIFT, env=isolated)
    assert p.returncode == 0, p.stderr
    text = p.stdout
    for cat in pr.CATEGORIES.values():
        assert cat in text
    assert "lossless gate: PASS" in text
    assert "SYNTHETIC" not in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench: 100%" in p.stderr  # the progress line finished
    assert "load (lock-step micro-benchmark" in text and "not a serving measurement" in text

    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
                       "--categories", "multi_turn,chart_vqa", "-n", "16", "--concurrency", "1", "--json",
                       *ANY_DRIFT, env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    out.write_text(p.stdout)
    g = rep["gate"]
    assert g["status"] == "pass" and g["defects"] == 0
    assert g["exact"] + g["near_ties"] == g["requests"] == 1 + 3  # the multi-turn item runs 3 turns
    assert [r["turn"] for r in rep["requests"] if r["category"] == "multi_turn"] == [0, 1, 2]
    assert rep["synthetic"] is None
    assert rep["acceptance"]["passes"] > 0 and rep["acceptance"]["drafted"] > 0
    assert sum(rep["acceptance"]["histogram"]) == rep["acceptance"]["passes"]
    assert rep["overall"]["decode_speedup"] > 0 and rep["overall"]["e2e_speedup"] > 0
    assert [lp["level"] for lp in rep["load"]] == [1]
    assert rep["load_shape"].startswith("lock-step micro-benchmark")
    # same prompt tokens, greedy: every arm generated the same number of tokens
    for r in rep["requests"]:
        assert r["plain"]["tokens"] == r["spec"]["tokens"] == r["plain_again"]["tokens"]


def test_synthetic_acceptance_is_labelled_and_refused_by_the_gate(small_pair, ggufdspark_cli, isolated):
    args = ["bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
            "--categories", "general_vqa", "-n", "16", "--concurrency", "1,2", "--draft-n-max", "3", *ANY_DRIFT]
    p = ggufdspark_cli(*args, "--synthetic-rates", "0.9,0.8,0.7,0.6", env=isolated)
    assert p.returncode == 0, p.stderr
    assert "SYNTHETIC SPEED: synthetic acceptance, rates 0.9,0.8,0.7" in p.stdout
    assert "lossless gate: REFUSED" in p.stdout
    p = ggufdspark_cli(*args, "--synthetic-accept", "3.0", "--json", env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["gate"]["status"] == "refused" and "not valid" in rep["gate"]["reason"]
    assert rep["synthetic"].startswith("synthetic acceptance, mean length 3")
    assert "--spec-synth-len" in rep["settings"]["spec_command"]
    # asking for the gate explicitly is refused before anything runs
    p = ggufdspark_cli(*args, "--synthetic-accept", "3.0", "--gate", env=isolated)
    assert p.returncode == 2  # a usage error (errors.py), refused before any work
    assert "lossless gate is refused" in p.stderr and "Traceback" not in p.stderr
    p = ggufdspark_cli(*args, "--synthetic-rates", "0.5,0.9,0.1", env=isolated)
    assert p.returncode == 2 and "cannot increase" in p.stderr


# --------------------------------------------------------------------------- the gate's judgement


def test_gate_judges_divergences_with_the_plain_runs_probabilities(small_pair, start_server):
    srv = start_server(model=small_pair.target, spec_type=None)
    c = srv.client()
    prompt, _ = bn.render(c, [{"role": "user", "content": "Describe the red house by the river."}], None)
    turn = bn.Turn("it-1", "general_vqa", 0, prompt, len(prompt))
    plain = bn.request(c, prompt, 12)
    probe = c.complete(prompt, n_predict=6, n_probs=2)
    top = probe.probs[5]["top_logprobs"]
    assert top[0]["id"] == plain.tokens[5]
    runner_up = top[1]["id"]

    def spec_with(tok: int) -> bn.Outcome:
        return bn.Outcome(plain.tokens[:5] + [tok] + plain.tokens[6:], "", plain.timings, plain.wall_s)

    # the runner-up, with a threshold above the gap: a near-tie (reported, not failing)
    g = bn.run_gate(c, [turn], [plain], [spec_with(runner_up)], [plain], near_tie_gap=1.0)
    assert (g.status, g.exact, g.near_ties, g.defects) == ("pass", 0, 1, 0)
    d = g.divergences[0]
    assert d.position == 5 and d.kind == "near-tie" and d.spec_token == runner_up
    assert math.isclose(d.p_top1, math.exp(top[0]["logprob"]), rel_tol=1e-6)
    # the same token with the default threshold: the tiny target is sure of itself, so a defect
    g = bn.run_gate(c, [turn], [plain], [spec_with(runner_up)], [plain])
    assert (g.status, g.defects) == ("fail", 1)
    assert "near-tie threshold" in g.divergences[0].reason
    # a token outside the top-2 is a defect whatever the threshold
    other = next(t for t in range(50, 200) if t not in (top[0]["id"], runner_up))
    g = bn.run_gate(c, [turn], [plain], [spec_with(other)], [plain], near_tie_gap=1.0)
    assert g.defects == 1 and "not among the plain run's top-2" in g.divergences[0].reason
    # identical outputs are exact
    g = bn.run_gate(c, [turn], [plain], [plain], [plain])
    assert (g.status, g.exact) == ("pass", 1)

    # a report with a defect raises the gate error (exit code 3) naming item, position, tokens
    report = _report_with(g := bn.run_gate(c, [turn], [plain], [spec_with(other)], [plain]))
    with pytest.raises(LosslessGateError) as e:
        report.raise_for_gate()
    assert e.value.exit_code == 3
    assert "item 'it-1'" in str(e.value) and "position 5" in str(e.value) and str(other) in str(e.value)
    assert "DEFECT" in report.text() and "lossless gate: FAIL" in report.text()


def _report_with(gate: bn.GateResult) -> bn.BenchReport:
    gs = bn.GroupStats("overall", 1, 12, 12, 10.0, 12.0, 9.0, 10.0, 2.0, 2.0, 0.5)
    settings = {"target": "t.gguf", "draft": "d.gguf", "backend": "cpu", "engine": "x", "draft_n_max": 4,
                "n_predict": 12, "items": 1, "requests": 1, "prompts": "builtin"}
    return bn.BenchReport(settings, None, [], gs, {}, [], gate, {})


def test_first_difference():
    assert bn.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bn.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bn.first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early (end of sequence)
    assert bn.accept_histogram([10, 6, 2], 12) == [2, 4, 4, 2]


# --------------------------------------------------------------------------- prompt sets


def test_builtin_set_covers_the_six_categories(tmp_path):
    items = pr.builtin_prompts()
    assert {it.category for it in items} == set(pr.CATEGORIES)
    assert all(sum(it.category == c for it in items) == 4 for c in pr.CATEGORIES)
    assert all(isinstance(m["content"], str) and "{image}" not in m["content"] for it in items for m in it.messages)
    assert all(it.n_turns >= 2 for it in items if it.category == "multi_turn")
    with_images = pr.builtin_prompts(image_dir=tmp_path)
    drawn = [p for it in with_images for p in it.images]
    assert drawn and all(p.read_bytes()[:4] == b"\x89PNG" for p in drawn)
    assert len(pr.select(items, categories=["chart_vqa", "multi_turn"], limit=1)) == 2


BAD_FILES = [
    ('{"messages": [{"role": "user", "content": "hi"}]\n', ":1: not valid JSON"),
    ('{"id": "a", "category": "x"}\n', ":1: no 'messages'"),
    ('\n{"messages": []}\n', ":2: 'messages' must be a non-empty list"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}\n', "messages[0]: role 'robot' is not one of"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n',
     "the last message is a 'assistant' message"),
    ('{"messages": [{"role": "user", "content": [{"type": "image", "path": "nope.png"}]}]}\n',
     "image file not found: "),
    ('{"mesages": [{"role": "user", "content": "hi"}]}\n', "unknown key 'mesages'"),
    ('{"messages": [{"role": "user", "content": 7}]}\n', "content must be a string or a non-empty list"),
    ('{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n{"id": "a", "messages": '
     '[{"role": "user", "content": "y"}]}\n', ":2: id 'a' repeats (first at "),
    ("# only a comment\n\n", "no prompts"),
]


@pytest.mark.parametrize("text,message", BAD_FILES)
def test_bad_prompt_files_get_clear_errors(tmp_path, text, message):
    f = tmp_path / "prompts.jsonl"
    f.write_text(text)
    with pytest.raises(BenchError) as e:
        pr.load_prompts(f)
    assert message in str(e.value)
    assert str(f) in str(e.value)


def test_prompt_file_images_and_mmproj(tmp_path):
    (tmp_path / "chart.png").write_bytes(b"\x89PNG fake")
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "c1", "images": ["chart.png"], '
                 '"messages": [{"role": "user", "content": "Tallest bar?"}]}\n'
                 '{"id": "t1", "category": "text_vqa", "messages": [{"role": "system", "content": "Be brief."}, '
                 '{"role": "user", "content": "Hi"}, {"role": "user", "content": [{"type": "text", "text": "And?"}]}]}\n')
    items = pr.load_prompts(f)
    assert items[0].images == [tmp_path / "chart.png"] and items[0].category == "user"
    assert items[1].n_turns == 2
    with pytest.raises(BenchError, match=r"p.jsonl:1: item 'c1' has an image \(chart.png\) but no --mmproj"):
        pr.prompt_set(f)
    with pytest.raises(InputNotFoundError):
        pr.load_prompts(tmp_path / "missing.jsonl")


def test_bad_prompt_file_through_the_cli(small_pair, ggufdspark_cli, isolated, tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": "hello"}\n')
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--prompts", str(f),
                       env=isolated)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == (f"ggufdspark: error: {f}:2: 'messages' must be a non-empty list")
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--prompts",
                       str(tmp_path / "none.jsonl"), env=isolated)
    assert p.returncode == 4 and "prompt file not found" in p.stderr  # a missing input (2 is a usage error)


def test_image_prompts_with_the_mmproj(isolated, tmp_path):
    """The built-in set with drawn pictures through a generated LFM2-VL pair: every arm gets the
    same image prompts (each server has its own media marker) and the gate still passes."""
    from ggufdspark.convert.drafter import convert_drafter
    from ggufdspark.convert.target import convert_target
    from ggufdspark.synthetic import synth, synth_vl

    vl = synth_vl.make_vl_target(tmp_path / "tiny-lfm2-vl")
    r = convert_target(vl, output=tmp_path)
    draft = convert_drafter(synth.make_drafter(tmp_path / "tiny-lfm2-vl-DSpark", vl), r.path,
                            output=tmp_path / "dspark-tiny-lfm2-vl-F16.gguf").path
    rep = bn.run_bench(ServingOptions(model=r.path, draft=draft, mmproj=r.mmproj.path),
                       categories=["chart_vqa", "multi_turn"], limit=1, n_predict=12, concurrency=[1, 2],
                       log_dir=tmp_path / "logs")
    assert rep.settings["images"] and "pictures drawn" in rep.settings["prompts"]
    assert (tmp_path / "logs" / "images" / "chart-01.png").is_file()
    assert [r["prompt_tokens"] for r in rep.requests] == [None] * 4  # image prompts are sent whole
    assert rep.gate.status == "pass" and rep.gate.exact + rep.gate.near_ties == 4
    assert rep.acceptance["drafted"] > 0
    # prefill (image encoding included) is reported apart from decode, for both arms
    o = rep.overall
    assert o.prompt_tokens_mean and o.prompt_tokens_mean >= 64  # an image is at least 64 tokens
    assert o.plain_prefill_ms and o.plain_prefill_ms > 0 and o.spec_prefill_ms and o.spec_prefill_ms > 0
    assert "prefill (prompt and images" in rep.text()


def test_informational_reference_never_fails(small_pair, isolated, tmp_path):
    rep = bn.run_bench(ServingOptions(model=small_pair.target, draft=small_pair.draft),
                       categories=["complex_reasoning"], limit=1, n_predict=8, concurrency=[1],
                       reference_hf=small_pair.target_dir, log_dir=tmp_path / "logs")
    ref = rep.reference
    assert ref is not None and ref["runtime"].startswith("transformers")
    assert ref["exact"] + ref["differs"] == len(rep.requests) == 1
    assert rep.gate.status == "pass"
    assert "informational" in rep.text()
