"""Issue 15: ``ggufdspark quantize`` with the engine's own llama-quantize, ``check`` on mixed
precisions, and the lossless gate on quantized targets, against the real engine on CPU.

The small pair's rows are 64 wide, so K-quant matrices fall back to 32-block types inside
llama-quantize (its own rule): the files are still Q4_K_M files as llama.cpp names them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ggufdspark import hardware
from ggufdspark.convert.drafter import convert_drafter
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.quantize import find_quantize
from ggufdspark.quants import DRAFT_TYPES, precision
from ggufdspark.serve import serving
from ggufdspark.synthetic import synth
from lossless import drafted_greedy_equal

PROMPTS = ["The model draft target", "One two three four five six", "Once upon a time in a small house by the river"]


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".partial"))


def assert_one_line_failure(p, *needles: str, code: int | None = None) -> None:
    assert p.returncode != 0, p.stdout
    if code is not None:
        assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ggufdspark: error:"), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def work(small_pair, tmp_path) -> dict[str, Path]:
    """Copies of the F16 pair in a directory of their own (so default names land there)."""
    t, d = tmp_path / small_pair.target.name, tmp_path / small_pair.draft.name
    shutil.copy2(small_pair.target, t)
    shutil.copy2(small_pair.draft, d)
    return {"dir": tmp_path, "target": t, "draft": d}


# ------------------------------------------------------------------------------------ quantize


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"])
def test_quantize_target_default_name_and_type(ggufdspark_cli, isolated, work, qtype):
    before = work["target"].read_bytes()
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", qtype.lower())
    assert p.returncode == 0, p.stderr
    out = work["dir"] / f"tiny-lfm2-{qtype}.gguf"  # tiny-lfm2-F16.gguf -> tiny-lfm2-Q4_K_M.gguf
    assert f"wrote {out}" in p.stdout and f"target F16 -> {qtype}" in p.stdout
    assert "quantize: 100%" in p.stderr  # progress, per tensor
    g = read_gguf(out)
    assert precision(g) == qtype and g.arch == "lfm2"
    assert all(t.type_name == "F32" for t in g.tensors.values() if len(t.shape) == 1)  # norms untouched
    assert work["target"].read_bytes() == before
    assert out.stat().st_mode & 0o777 != 0o600  # an ordinary file, not mkstemp's private one
    assert leftovers(work["dir"]) == []


def test_quantize_draft_keeps_markov_head_float(ggufdspark_cli, isolated, work):
    p = ggufdspark_cli("quantize", str(work["draft"]), "--type", "Q8_0", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    out = work["dir"] / "dspark-tiny-lfm2-Q8_0.gguf"
    assert r["path"] == str(out) and r["kind"] == "draft" and r["type"] == "Q8_0"
    assert r["kept_float"] == {"markov_w1.weight": "F16", "markov_w2.weight": "F16"}
    g = read_gguf(out)
    types = {n: t.type_name for n, t in g.tensors.items()}
    assert types["fc.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["markov_w1.weight"] == types["markov_w2.weight"] == "F16"
    assert types["conf_proj.weight"] == "F16" and types["conf_proj.bias"] == "F32"
    assert types["output_norm.weight"] == types["enc.output_norm.weight"] == "F32"
    # the draft's own keys survive (block size, taps, mask token, confidence head)
    src = read_gguf(work["draft"])
    for k in ("dflash.block_size", "dflash.target_layers", "tokenizer.ggml.mask_token_id",
              "dflash.has_confidence_head"):
        assert g.metadata[k] == src.metadata[k], k


def test_markov_head_stays_float_where_llama_quantize_alone_would_quantize_it(small_pair, isolated, tmp_path,
                                                                              dspark_engine):
    """The small drafter's Markov rank (16) is too narrow for any quant block, so llama-quantize
    keeps it F16 by itself; a rank-32 drafter shows the override at work."""
    from ggufdspark.quantize import quantize

    ddir = tmp_path / "rank32-DSpark"
    synth.make_drafter(ddir, small_pair.target_dir, replace(synth.SMALL_DRAFTER, markov_rank=32))
    draft = convert_drafter(ddir, small_pair.target, output=tmp_path / "dspark-rank32-F16.gguf").path
    plain = tmp_path / "plain-Q8_0.gguf"
    exe = find_quantize(dspark_engine.path)
    subprocess.run([str(exe), str(draft), str(plain), "Q8_0"], check=True, capture_output=True)
    assert read_gguf(plain).tensors["markov_w1.weight"].type_name == "Q8_0"  # what we prevent
    r = quantize(draft, "Q8_0")
    g = read_gguf(r.path)
    assert g.tensors["markov_w1.weight"].type_name == g.tensors["markov_w2.weight"].type_name == "F16"
    assert g.tensors["fc.weight"].type_name == "Q8_0"


def test_force_overwrites_and_without_it_nothing_is_touched(ggufdspark_cli, isolated, work):
    out = work["dir"] / "mine.gguf"
    out.write_bytes(b"precious")
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q8_0", "-o", str(out))
    assert_one_line_failure(p, str(out), "already exists", "--force", code=2)
    assert out.read_bytes() == b"precious" and leftovers(work["dir"]) == []
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q8_0", "-o", str(out), "--force")
    assert p.returncode == 0, p.stderr
    assert precision(read_gguf(out)) == "Q8_0"


# ------------------------------------------------------------------------------------ bad input


def test_missing_input(ggufdspark_cli, isolated, tmp_path):
    missing = tmp_path / "nothere-F16.gguf"
    p = ggufdspark_cli("quantize", str(missing), "--type", "Q8_0")
    assert_one_line_failure(p, str(missing), code=4)
    assert not [f for f in tmp_path.iterdir() if f.suffix in (".gguf", ".partial")]


@pytest.mark.parametrize("bad", ["Q4_K_Z", "q9", "COPY"])
def test_unknown_type(ggufdspark_cli, isolated, work, bad):
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", bad)
    assert_one_line_failure(p, f"--type {bad}", "Q4_K_M", code=2)
    assert sorted(f.name for f in work["dir"].glob("*.gguf")) == ["dspark-tiny-lfm2-F16.gguf", "tiny-lfm2-F16.gguf"]


@pytest.mark.parametrize("qtype", ["Q3_K_M", "Q2_K", "IQ2_XS", "IQ4_XS"])
def test_draft_refuses_types_it_cannot_take(ggufdspark_cli, isolated, work, qtype):
    assert qtype not in DRAFT_TYPES
    p = ggufdspark_cli("quantize", str(work["draft"]), "--type", qtype)
    assert_one_line_failure(p, f"--type {qtype}", str(work["draft"]), "DSpark draft", "Q8_0", code=2)
    assert not list(work["dir"].glob(f"*{qtype}*")) and leftovers(work["dir"]) == []


def test_draft_refuses_an_imatrix_and_targets_pass_it_through(ggufdspark_cli, isolated, work):
    bogus = work["dir"] / "junk.imatrix"
    bogus.write_bytes(b"this is no importance matrix" * 20)
    p = ggufdspark_cli("quantize", str(work["draft"]), "--type", "Q8_0", "--imatrix", str(bogus))
    assert_one_line_failure(p, "--imatrix", "DSpark draft", code=2)
    # a target takes it, hands it to llama-quantize, which refuses this one: its reason, one line,
    # and no partial output left behind
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q4_K_M", "--imatrix", str(bogus))
    assert_one_line_failure(p, str(work["target"]), "llama-quantize to Q4_K_M failed")
    assert not (work["dir"] / "tiny-lfm2-Q4_K_M.gguf").exists() and leftovers(work["dir"]) == []


def test_refuses_quantized_input_output_onto_input_and_non_models(ggufdspark_cli, isolated, work, quant_pair,
                                                                  small_pair):
    q = quant_pair["target-Q8_0"]
    p = ggufdspark_cli("quantize", str(q), "--type", "Q4_K_M", "-o", str(work["dir"] / "x.gguf"))
    assert_one_line_failure(p, str(q), "already quantized (Q8_0)")
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q8_0", "-o", str(work["target"]), "--force")
    assert_one_line_failure(p, str(work["target"]), "one of the inputs", code=2)
    assert work["target"].read_bytes() == small_pair.target.read_bytes()
    junk = work["dir"] / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 30)
    p = ggufdspark_cli("quantize", str(junk), "--type", "Q8_0")
    assert_one_line_failure(p, str(junk), "not a GGUF file")
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q8_0", "-o", str(work["dir"] / "no" / "x.gguf"))
    assert_one_line_failure(p, "does not exist", code=2)
    assert leftovers(work["dir"]) == []


def test_without_llama_quantize_beside_the_engine(ggufdspark_cli, work, tmp_path, dspark_engine):
    lonely = tmp_path / "engine"
    lonely.mkdir()
    exe = lonely / "llama-server"
    exe.symlink_to(dspark_engine.path)
    p = ggufdspark_cli("quantize", str(work["target"]), "--type", "Q8_0", "--server", str(exe),
                       env={"GGUFDSPARK_CACHE": str(tmp_path / "cache")})
    assert_one_line_failure(p, "llama-quantize", "build-engine --with-tools")
    assert not (work["dir"] / "tiny-lfm2-Q8_0.gguf").exists()


# ------------------------------------------------------------------------------------ check


def test_check_accepts_mixed_precisions_and_names_them(ggufdspark_cli, quant_pair, small_pair):
    for target, draft, label in ((quant_pair["target-Q4_K_M"], quant_pair["draft-Q8_0"], "target Q4_K_M, draft Q8_0 (Markov head F16)"),
                                 (quant_pair["target-Q8_0"], small_pair.draft, "target Q8_0, draft F16 (Markov head F16)"),
                                 (small_pair.target, quant_pair["draft-Q8_0"], "target F16, draft Q8_0 (Markov head F16)")):
        p = ggufdspark_cli("check", str(target), str(draft))
        assert p.returncode == 0, p.stdout + p.stderr
        assert p.stdout.strip().splitlines()[-1] == f"pair OK ({label})"
    p = ggufdspark_cli("check", str(quant_pair["target-Q4_K_M"]), str(quant_pair["draft-Q8_0"]), "--json")
    assert json.loads(p.stdout)["precisions"] == {"target": "Q4_K_M", "draft": "Q8_0"}
    assert json.loads(p.stdout)["recommended_draft"] is None
    assert json.loads(p.stdout)["markov_head"] == "F16"
    # a draft other than the one the H200 table recommends for the target's precision: still OK, and said
    p = ggufdspark_cli("check", str(quant_pair["target-Q4_K_M"]), str(small_pair.draft))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-2:] == [
        "pair OK (target Q4_K_M, draft F16 (Markov head F16))",
        "note: with a Q4_K_M target a Q8_0 draft measured faster than F16 on an H200 (docs/quantize.md)"]
    p = ggufdspark_cli("check", str(quant_pair["target-Q4_K_M"]), str(small_pair.draft), "--json")
    assert json.loads(p.stdout)["recommended_draft"] == "Q8_0"


# ------------------------------------------------------------------------------------ lossless


@pytest.mark.parametrize("tq", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("dq", ["Q8_0", "F16"])
def test_quantized_target_is_lossless_with_the_draft(isolated, quant_pair, small_pair, tq, dq):
    """``serve`` with the draft engaged gives, greedy, the same tokens as the same quantized target
    served alone."""
    target = quant_pair[f"target-{tq}"]
    draft = quant_pair["draft-Q8_0"] if dq == "Q8_0" else small_pair.draft
    with serving(target, draft, no_draft=True) as (_, plain), serving(target, draft) as (srv, spec):
        if hardware.cpu_has_amx():  # the engine's AMX kernels crash on quantized weights (hardware.py)
            assert "--no-repack" in srv.settings.args()
        drafted = drafted_greedy_equal(plain, spec, PROMPTS, n_predict=32, tokenize=False)
        assert drafted > 0  # the draft was engaged


def test_serve_adds_no_repack_only_for_quantized_files_on_amx(isolated, quant_pair, small_pair):
    from ggufdspark.serve import ServingOptions, plan

    amx = hardware.cpu_has_amx()
    for target, draft, quantized in ((small_pair.target, small_pair.draft, False),
                                     (quant_pair["target-Q4_K_M"], small_pair.draft, True),
                                     (small_pair.target, quant_pair["draft-Q8_0"], True)):
        args = plan(ServingOptions(model=target, draft=draft)).settings.args()
        assert ("--no-repack" in args) == (quantized and amx), (target.name, draft.name)


def test_bench_gate_passes_on_a_quantized_pair(ggufdspark_cli, isolated, quant_pair):
    """``bench`` runs a Q4_K_M target with a Q8_0 draft (every arm alike: ``--no-repack`` on AMX CPUs)
    and its lossless gate passes."""
    p = ggufdspark_cli("bench", "-m", str(quant_pair["target-Q4_K_M"]), "-md", str(quant_pair["draft-Q8_0"]),
                       "--limit", "1", "--categories", "multi_turn,chart_vqa", "-n", "16", "--concurrency", "1",
                       "--json", "--max-plain-drift", "inf", env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["gate"]["status"] == "pass" and rep["gate"]["defects"] == 0
    assert rep["acceptance"]["drafted"] > 0
