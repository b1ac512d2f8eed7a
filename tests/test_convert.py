"""Issue 3: the converters, proven against the real engine and against llama.cpp's own converter."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ggufdspark.convert.drafter import convert_drafter
from ggufdspark.convert.target import convert_target
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.quants import DRAFT_KEEP_FLOAT
from ggufdspark.synthetic import synth
from lossless import drafted_greedy_equal
from oracle import compare_gguf, run_reference

PROMPTS = [
    "The model draft target",
    "Question: what is the speed of the cat? Answer:",
    "one two three four five six",
    "def f(x):\n    return",
]


# ----------------------------------------------------------------------------- engine proofs


def test_converted_pair_loads_and_drafts(small_pair, start_server):
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=6)
    out = srv.client().complete(PROMPTS[0], n_predict=48)
    assert out.timings.draft_n and out.timings.draft_n > 0, out.raw.get("timings")
    assert out.timings.predicted_n == 48
    assert srv.wait_for_log("draft acceptance"), srv.log_text()[-2000:]


def test_greedy_output_is_lossless(small_pair, start_server):
    plain = start_server(model=small_pair.target)
    spec = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=6)
    assert drafted_greedy_equal(plain.client(), spec.client(), PROMPTS, n_predict=40) > 0


# ----------------------------------------------------------------------------- the oracle


def _reference(args: list[str]) -> None:
    p = run_reference(args)
    assert p.returncode == 0, f"reference converter failed:\n{p.stderr[-3000:]}"


@pytest.fixture(scope="module")
def oracle_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    return synth.make_target(root / "target", synth.SMALL_TARGET, dtype="BF16")


DRAFTER_VARIANTS = {
    "bf16": dict(dtype="BF16"),
    "f16-input": dict(dtype="F16"),
    "f32-input": dict(dtype="F32"),
    "sharded": dict(dtype="BF16", shards=3),
    "model-prefix": dict(dtype="BF16", prefix="model."),
    "no-confidence-head": dict(dtype="BF16", spec=replace(synth.SMALL_DRAFTER, confidence_head=False)),
    "neox-rope": dict(dtype="BF16", spec=replace(synth.SMALL_DRAFTER, rope_is_neox_style=True)),
}
CASES = [(v, "f16") for v in DRAFTER_VARIANTS] + [("bf16", t) for t in ("f32", "bf16", "q8_0")]


@pytest.mark.parametrize("variant,outtype", CASES, ids=[f"{v}-{t}" for v, t in CASES])
def test_drafter_matches_reference_converter(variant, outtype, oracle_target, tmp_path):
    opts = dict(DRAFTER_VARIANTS[variant])
    spec = opts.pop("spec", synth.SMALL_DRAFTER)
    ddir = synth.make_drafter(tmp_path / "drafter", oracle_target, spec, **opts)
    mine = convert_drafter(ddir, oracle_target, output=tmp_path / "mine.gguf", outtype=outtype).path
    ref = tmp_path / "ref.gguf"
    _reference([str(ddir), "--target-model-dir", str(oracle_target), "--outtype", outtype, "--outfile", str(ref)])
    # one policy for quantized drafts (ggufdspark.quants.DRAFT_KEEP_FLOAT): the reference quantizes the
    # Markov head, we keep it in the checkpoint's float type, as 'quantize --type Q8_0' does
    kept = {t: opts.get("dtype", "BF16") for t in DRAFT_KEEP_FLOAT} if outtype == "q8_0" else None
    compare_gguf(mine, ref, kept_float=kept)


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
def test_target_matches_reference_converter(outtype, oracle_target, tmp_path):
    mine = convert_target(oracle_target, output=tmp_path / "mine.gguf", outtype=outtype).path
    ref = tmp_path / "ref.gguf"
    _reference([str(oracle_target), "--outtype", outtype, "--outfile", str(ref)])
    compare_gguf(mine, ref)


def test_tokenizer_from_gguf_target_is_bit_identical(oracle_target, tmp_path):
    """TARGET given as a GGUF: the draft's tokenizer keys are the target GGUF's, bytes and types."""
    tgguf = convert_target(oracle_target, output=tmp_path / "t.gguf").path
    ddir = synth.make_drafter(tmp_path / "drafter", oracle_target)
    from_gguf = convert_drafter(ddir, tgguf, output=tmp_path / "a.gguf").path
    from_dir = convert_drafter(ddir, oracle_target, output=tmp_path / "b.gguf").path
    t, a, b = read_gguf(tgguf), read_gguf(from_gguf), read_gguf(from_dir)
    tok_keys = [k for k in t.metadata if k.startswith("tokenizer.")]
    assert len(tok_keys) >= 8
    for k in tok_keys:
        assert a.metadata[k] == t.metadata[k] and a.value_types[k] == t.value_types[k], k
        assert b.metadata[k] == t.metadata[k] and b.value_types[k] == t.value_types[k], k


def test_interleaved_rope_is_permuted_to_neox(oracle_target, tmp_path):
    """Independent of the oracle: q rows of head h move from interleaved pairs to NeoX halves."""
    inter = synth.make_drafter(tmp_path / "i", oracle_target, dtype="F32")
    cfg = json.loads((inter / "config.json").read_text())
    neox_dir = tmp_path / "n"
    shutil.copytree(inter, neox_dir)
    cfg["rope_is_neox_style"] = True
    (neox_dir / "config.json").write_text(json.dumps(cfg))
    a = read_gguf(convert_drafter(inter, oracle_target, output=tmp_path / "i.gguf", outtype="f32").path)
    b = read_gguf(convert_drafter(neox_dir, oracle_target, output=tmp_path / "n.gguf", outtype="f32").path)
    hd = cfg["head_dim"]
    q_inter, q_kept = a.tensor_array("blk.0.attn_q.weight"), b.tensor_array("blk.0.attn_q.weight")
    head0 = q_kept[:hd]
    expected = np.concatenate([head0[0::2], head0[1::2]])
    assert np.array_equal(q_inter[:hd], expected)
    assert not np.array_equal(q_inter, q_kept)
    n_inter, n_kept = a.tensor_array("blk.0.attn_k_norm.weight"), b.tensor_array("blk.0.attn_k_norm.weight")
    assert np.array_equal(n_inter, np.concatenate([n_kept[0::2], n_kept[1::2]]))
    assert np.array_equal(a.tensor_array("blk.0.attn_v.weight"), b.tensor_array("blk.0.attn_v.weight"))


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def bad_setup(small_pair, tmp_path):
    """A fresh copy of the small drafter to break, an output dir to watch, and a runner."""
    ddir = tmp_path / "drafter"
    shutil.copytree(small_pair.drafter_dir, ddir)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    return ddir, out_dir


def _run_bad(ggufdspark_cli, ddir, target, out_dir, *extra, expect: str):
    out = out_dir / "draft.gguf"
    p = ggufdspark_cli("convert", str(ddir), "--target", str(target), "-o", str(out), *extra)
    assert p.returncode != 0, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr, p.stderr
    assert err and err[-1].startswith("ggufdspark: error:"), p.stderr
    assert expect in err[-1], f"expected {expect!r} in {err[-1]!r}"
    assert list(out_dir.iterdir()) == [], f"left behind: {list(out_dir.iterdir())}"
    return err[-1]


def _edit_config(ddir: Path, **changes):
    cfg = json.loads((ddir / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (ddir / "config.json").write_text(json.dumps(cfg))


def _rewrite_header(path: Path, mutate) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    mutate(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_missing_drafter_path(ggufdspark_cli, small_pair, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    _run_bad(ggufdspark_cli, tmp_path / "nope", small_pair.target, out_dir, expect="nope")


def test_missing_target_path(ggufdspark_cli, bad_setup, tmp_path):
    ddir, out_dir = bad_setup
    _run_bad(ggufdspark_cli, ddir, tmp_path / "no-target.gguf", out_dir, expect="no-target.gguf")


def test_drafter_path_is_a_file(ggufdspark_cli, small_pair, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    _run_bad(ggufdspark_cli, small_pair.target, small_pair.target, out_dir, expect="expected a checkpoint directory")


def test_not_a_dspark_config(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    _edit_config(ddir, architectures=["Qwen3ForCausalLM"])
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="architecture Qwen3ForCausalLM is not a DSpark drafter")


def test_unsupported_markov_head(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    _edit_config(ddir, markov_head_type="gated")
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="markov_head_type 'gated'")


def test_missing_tensor(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    _edit_config(ddir, num_hidden_layers=3, layer_types=["full_attention"] * 3)
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="layers.2.")


def test_extra_tensor(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    _edit_config(ddir, num_hidden_layers=1, layer_types=["full_attention"])
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="unexpected tensor layers.1.")


def test_misshaped_tensor(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    _edit_config(ddir, markov_rank=32)
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="confidence_head.proj.weight has shape [1, 80], the config implies [1, 96]")


def test_truncated_safetensors(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    f = ddir / "model.safetensors"
    f.write_bytes(f.read_bytes()[:2000])
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="runs past the end of the file")


def test_invalid_header_json(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    f = ddir / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:12] = b"{{{{"
    f.write_bytes(bytes(raw))
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="invalid header JSON")


def test_data_offsets_outside_file(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup

    def mutate(h):
        name = next(k for k in h if k != "__metadata__")
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [b + 10**9, e + 10**9]

    _rewrite_header(ddir / "model.safetensors", mutate)
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="outside the data section")


def test_dtype_size_disagreement(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup

    def mutate(h):
        h["fc.weight"]["dtype"] = "F32"

    _rewrite_header(ddir / "model.safetensors", mutate)
    _run_bad(ggufdspark_cli, ddir, small_pair.target, out_dir, expect="tensor fc.weight:")


def test_target_hidden_size_mismatch(ggufdspark_cli, bad_setup, other_pair):
    ddir, out_dir = bad_setup
    _run_bad(ggufdspark_cli, ddir, other_pair.target, out_dir, expect="target hidden size 96 != drafter hidden size 64")


def test_target_vocab_mismatch(ggufdspark_cli, bad_setup, tmp_path):
    ddir, out_dir = bad_setup
    t = synth.make_target(tmp_path / "t2", replace(synth.SMALL_TARGET, vocab_size=1100))
    _run_bad(ggufdspark_cli, ddir, t, out_dir, expect="target vocabulary 1100 != drafter vocab_size 1024")


def test_target_layer_ids_beyond_target(ggufdspark_cli, bad_setup, small_pair):
    ddir, out_dir = bad_setup
    cfg = json.loads((ddir / "config.json").read_text())
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 7]
    cfg["dflash_config"].pop("num_target_layers")
    (ddir / "config.json").write_text(json.dumps(cfg))
    _run_bad(ggufdspark_cli, ddir, small_pair.target_dir, out_dir, expect="taps target layer 7")


def test_target_without_tokenizer(ggufdspark_cli, bad_setup, small_pair, tmp_path):
    ddir, out_dir = bad_setup
    t = tmp_path / "target-no-tok"
    shutil.copytree(small_pair.target_dir, t)
    (t / "tokenizer.json").unlink()
    _run_bad(ggufdspark_cli, ddir, t, out_dir, expect="has no tokenizer")


def test_refuses_to_overwrite_without_force(ggufdspark_cli, small_pair, tmp_path):
    out = tmp_path / "draft.gguf"
    out.write_bytes(b"precious")
    p = ggufdspark_cli("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o", str(out))
    assert p.returncode != 0 and "already exists" in p.stderr and "Traceback" not in p.stderr
    assert out.read_bytes() == b"precious"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["draft.gguf"]
    p = ggufdspark_cli("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o", str(out), "--force")
    assert p.returncode == 0, p.stderr
    assert read_gguf(out).arch == "dflash"
    assert "sha256" in p.stdout


def test_default_output_name_follows_hub_sidecar_rule(ggufdspark_cli, small_pair, tmp_path):
    p = ggufdspark_cli("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target_dir),
                       "-o", str(tmp_path), "--outtype", "bf16")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "dspark-tiny-lfm2-BF16.gguf").is_file()


def test_convert_target_of_vl_checkpoint_without_vision_writes_tower_only(small_pair, tmp_path):
    """An Lfm2Vl checkpoint: the language tower is written and the note says so."""
    vl = tmp_path / "vl"
    shutil.copytree(small_pair.target_dir, vl)
    cfg = json.loads((vl / "config.json").read_text())
    text_cfg = dict(cfg, architectures=["Lfm2ForCausalLM"])
    (vl / "config.json").write_text(json.dumps({"architectures": ["Lfm2VlForConditionalGeneration"],
                                                "model_type": "lfm2_vl", "text_config": text_cfg}))
    from ggufdspark.convert.safetensors import read_header, write_safetensors

    tensors, _ = read_header(vl / "model.safetensors")
    raw = (vl / "model.safetensors").read_bytes()
    items = [(n.replace("model.", "model.language_model.", 1), t.dtype, t.shape, raw[t.begin:t.end])
             for n, t in tensors.items()]
    write_safetensors(vl / "model.safetensors", items)
    r = convert_target(vl, output=tmp_path / "vl.gguf")
    plain = convert_target(small_pair.target_dir, output=tmp_path / "plain.gguf")
    assert any("mmproj" in n for n in r.notes)
    a, b = read_gguf(r.path), read_gguf(plain.path)
    assert set(a.tensors) == set(b.tensors)
    for n in a.tensors:
        assert np.array_equal(a.tensor_bytes(n), b.tensor_bytes(n)), n


def test_generate_then_convert_with_the_cli(ggufdspark_cli, tmp_path):
    """The user path: generate a (VL) pair, convert target + mmproj and draft, check the pair."""
    out = tmp_path / "gen"
    p = ggufdspark_cli("generate", str(out), "--vl")
    assert p.returncode == 0, p.stderr
    again = ggufdspark_cli("generate", str(out))
    assert again.returncode != 0 and "not empty" in again.stderr and "Traceback" not in again.stderr
    p = ggufdspark_cli("convert-target", str(out / "target"), "-o", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    t = tmp_path / "target-F16.gguf"
    assert t.is_file() and (tmp_path / "mmproj-target-F16.gguf").is_file()
    p = ggufdspark_cli("convert", str(out / "drafter"), "--target", str(t), "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    d = tmp_path / "dspark-target-F16.gguf"
    p = ggufdspark_cli("check", str(t), str(d), "--mmproj", str(tmp_path / "mmproj-target-F16.gguf"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pair OK" in p.stdout
