"""Issue 7: the vision side of LFM2-VL: a generated VL checkpoint, the mmproj converter (proven
against llama.cpp's own converter), ``check --mmproj``, and image prompts through the real engine
with the DSpark draft on (including the lossless gate)."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from ggufdspark.check import check_pair
from ggufdspark.convert.mmproj import convert_mmproj
from ggufdspark.convert.target import convert_target
from ggufdspark.errors import OutputExistsError, PairMismatchError, UnsupportedModelError
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.runners.server import ServerSettings
from ggufdspark.serve import ServingOptions, plan
from ggufdspark import images
from ggufdspark.runners.client import image_data_uri
from ggufdspark.synthetic import synth, synth_vl
from lossless import assert_same_or_near_tie, closed_loop
from oracle import compare_gguf, run_reference

OUTTYPES = ["f32", "f16", "bf16", "q8_0"]
TEXT_PROMPTS = ["Question: {img} what is shown here? Answer: the", "The model draft target {img} one two three",
                "{img}\nDescribe the chart in one sentence:"]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def vl(vl_pair, tmp_path_factory):
    """The small VL pair (conftest's ``vl_pair``: the published tower layout, its drafter, our F16
    conversions) and the same target in the transformers layout (``tf``)."""
    tf = synth_vl.make_vl_target(tmp_path_factory.mktemp("vl") / "tiny-lfm2-vl-tf5", layout="transformers")
    return {**vl_pair, "pub": vl_pair["dir"], "tf": tf}


@pytest.fixture(scope="module")
def other_mmproj(tmp_path_factory) -> Path:
    """An mmproj made for a different model (text hidden size 96)."""
    root = tmp_path_factory.mktemp("other-vl")
    spec = replace(synth.SMALL_TARGET, hidden_size=96, vocab_size=1100)
    d = synth_vl.make_vl_target(root / "other-lfm2-vl", spec)
    return convert_mmproj(d, output=root).path


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> list[images.ImageItem]:
    return images.random_items(tmp_path_factory.mktemp("pictures"), n_per_category=1, seed=7, size=256)


def _reference(args: list[str]) -> None:
    p = run_reference(args)
    assert p.returncode == 0, f"reference converter failed:\n{p.stderr[-3000:]}"


def _safetensors_names(directory: Path) -> list[str]:
    raw = (directory / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]


# ----------------------------------------------------------------------------- the generated checkpoint


@pytest.mark.parametrize("layout", synth_vl.LAYOUTS)
def test_generated_checkpoint_looks_published_and_loads_in_transformers(vl, layout):
    d = vl["pub" if layout == "published" else "tf"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["Lfm2VlForConditionalGeneration"]
    assert cfg["text_config"]["architectures"] == ["Lfm2ForCausalLM"]
    assert cfg["vision_config"]["vision_use_head"] is False
    pre = json.loads((d / "preprocessor_config.json").read_text())
    assert pre["image_mean"] and pre["image_std"] and pre["encoder_patch_size"] == 16 and pre["downsample_factor"] == 2
    names = _safetensors_names(d)
    vision = [n for n in names if n.startswith("model.vision_tower.")]
    assert vision and all(n.startswith(synth_vl.VISION_PREFIX[layout]) for n in vision)
    assert not any("head" in n for n in vision)
    assert any(n.startswith("model.language_model.") for n in names)
    assert not any(n.startswith("lm_head") for n in names)  # tied embeddings, as published

    from transformers import Lfm2VlForConditionalGeneration

    model, info = Lfm2VlForConditionalGeneration.from_pretrained(d, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert model.config.vision_config.hidden_size == synth_vl.SMALL_VISION.hidden_size


def test_drafter_generated_for_the_vl_dir_pairs_with_its_tower(vl):
    cfg = json.loads((vl["drafter_dir"] / "config.json").read_text())
    tcfg = json.loads((vl["pub"] / "config.json").read_text())["text_config"]
    assert cfg["hidden_size"] == tcfg["hidden_size"]
    assert cfg["dflash_config"]["num_target_layers"] == tcfg["num_hidden_layers"]
    assert cfg["vocab_size"] == tcfg["vocab_size"]
    report = check_pair(vl["tower"], vl["draft"], vl["mmproj"])
    assert report.ok, [c for c in report.checks if not c.ok]


# ----------------------------------------------------------------------------- the oracle


@pytest.fixture(scope="module")
def reference_mmproj(vl, tmp_path_factory):
    """llama.cpp's converter on the published layout, one file per outtype (made on first use)."""
    out = tmp_path_factory.mktemp("ref-mmproj")
    made: dict[str, Path] = {}

    def get(outtype: str) -> Path:
        if outtype not in made:
            path = out / f"ref-{outtype}.gguf"
            _reference([str(vl["pub"]), "--mmproj", "--outtype", outtype, "--outfile", str(path)])
            made[outtype] = path
        return made[outtype]

    return get


@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("layout", synth_vl.LAYOUTS)
def test_mmproj_matches_reference_converter(vl, reference_mmproj, layout, outtype, tmp_path):
    """Same weights in either layout: our mmproj equals the reference's from the published layout."""
    mine = convert_mmproj(vl["pub" if layout == "published" else "tf"], output=tmp_path, outtype=outtype).path
    compare_gguf(mine, reference_mmproj(outtype), general=("general.type",))
    g = read_gguf(mine)
    assert g.arch == "clip" and g.metadata["clip.projector_type"] == "lfm2"
    assert g.metadata["clip.vision.projection_dim"] == 64


def test_reference_converter_rejects_the_transformers_layout(vl, tmp_path):
    """Why both layouts matter: the pinned reference only knows the published one."""
    p = run_reference([str(vl["tf"]), "--mmproj", "--outtype", "f16", "--outfile", str(tmp_path / "x.gguf")])
    assert p.returncode != 0 and "Can not map tensor" in p.stderr, p.stderr[-1000:]


@pytest.fixture(scope="module")
def reference_tower(vl, tmp_path_factory) -> Path:
    ref = tmp_path_factory.mktemp("ref-tower") / "ref.gguf"
    _reference([str(vl["pub"]), "--outtype", "f16", "--outfile", str(ref)])
    return ref


@pytest.mark.parametrize("layout", synth_vl.LAYOUTS)
def test_language_tower_of_vl_matches_reference_converter(vl, reference_tower, layout, tmp_path):
    mine = convert_target(vl["pub" if layout == "published" else "tf"], output=tmp_path / "mine.gguf",
                          mmproj=False).path
    compare_gguf(mine, reference_tower, general=("general.type",))


# ----------------------------------------------------------------------------- convert-target, both files


def test_convert_target_cli_writes_tower_and_mmproj(ggufdspark_cli, vl, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    p = ggufdspark_cli("convert-target", str(vl["pub"]), "-o", str(out), "--json")
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert sorted(f.name for f in out.iterdir()) == ["mmproj-tiny-lfm2-vl-F16.gguf", "tiny-lfm2-vl-F16.gguf"]
    assert Path(res["mmproj"]["path"]).name.startswith("mmproj")  # llama.cpp's Hub rule for projectors
    assert hashlib.sha256(Path(res["mmproj"]["path"]).read_bytes()).hexdigest() == res["mmproj"]["sha256"]
    assert read_gguf(res["path"]).arch == "lfm2" and read_gguf(res["mmproj"]["path"]).arch == "clip"

    q8 = ggufdspark_cli("convert-target", str(vl["tf"]), "-o", str(out), "--outtype", "q8_0")
    assert q8.returncode == 0, q8.stderr
    assert (out / "mmproj-tiny-lfm2-vl-tf5-Q8_0.gguf").is_file() and (out / "tiny-lfm2-vl-tf5-Q8_0.gguf").is_file()

    tower_only = tmp_path / "tower-only"
    tower_only.mkdir()
    p = ggufdspark_cli("convert-target", str(vl["pub"]), "-o", str(tower_only), "--no-mmproj")
    assert p.returncode == 0 and [f.name for f in tower_only.iterdir()] == ["tiny-lfm2-vl-F16.gguf"]
    assert "tower only" in p.stderr


def test_convert_target_checks_both_outputs_before_writing(vl, tmp_path):
    (tmp_path / "mmproj-tiny-lfm2-vl-F16.gguf").write_bytes(b"keep")
    with pytest.raises(OutputExistsError, match="mmproj-tiny-lfm2-vl-F16.gguf"):
        convert_target(vl["pub"], output=tmp_path)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["mmproj-tiny-lfm2-vl-F16.gguf"]
    r = convert_target(vl["pub"], output=tmp_path / "t.gguf", mmproj_output=tmp_path / "m.gguf", force=True)
    assert r.path.name == "t.gguf" and r.mmproj.path.name == "m.gguf"


@pytest.mark.parametrize("damage,expect", [
    ("no-preprocessor", "image_mean"),
    ("drop-tensor", "v.blk.1.attn_q.weight is missing"),
    ("text-only", "has no LFM2-VL vision part"),
])
def test_mmproj_refuses_bad_input(vl, tmp_path, damage, expect):
    import shutil

    d = tmp_path / "vl"
    shutil.copytree(vl["pub"], d)
    if damage == "no-preprocessor":
        (d / "preprocessor_config.json").unlink()
    elif damage == "drop-tensor":
        from ggufdspark.convert.safetensors import read_header, write_safetensors

        src = d / "model.safetensors"
        tensors, _ = read_header(src)
        raw = src.read_bytes()
        keep = [(n, t.dtype, t.shape, raw[t.begin:t.end]) for n, t in tensors.items()
                if n != "model.vision_tower.vision_model.encoder.layers.1.self_attn.q_proj.weight"]
        write_safetensors(src, keep)
    else:
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg["text_config"]}))
    with pytest.raises(UnsupportedModelError, match=expect):
        convert_mmproj(d, output=tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


# ----------------------------------------------------------------------------- check


@pytest.mark.engine
def test_check_refuses_mmproj_of_another_model(ggufdspark_cli, vl, other_mmproj):
    ok = ggufdspark_cli("check", str(vl["tower"]), str(vl["draft"]), "--mmproj", str(vl["mmproj"]))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASS  projector output width: mmproj projects to 64 (mm.2.weight rows), target hidden size 64" in ok.stdout
    assert "PASS  image token in target tokenizer: found '<image>'" in ok.stdout

    bad = ggufdspark_cli("check", str(vl["tower"]), "--mmproj", str(other_mmproj))
    assert bad.returncode == 1
    assert "FAIL  projector output width: mmproj projects to 96 (mm.2.weight rows), target hidden size 64" in bad.stdout
    with pytest.raises(PairMismatchError, match="projector output width"):
        check_pair(vl["tower"], mmproj=other_mmproj).raise_for_failures()

    # serve checks the same before starting anything
    p = ggufdspark_cli("serve", "-m", str(vl["tower"]), "-md", str(vl["draft"]), "--mmproj", str(other_mmproj),
                       "--dry-run")
    assert p.returncode != 0 and "projector output width" in p.stderr and "Traceback" not in p.stderr
    p = ggufdspark_cli("serve", "-m", str(vl["tower"]), "-md", str(vl["draft"]), "--mmproj", str(vl["mmproj"]),
                       "--dry-run")
    assert p.returncode == 0 and f"--mmproj {vl['mmproj']}" in p.stdout


# ----------------------------------------------------------------------------- the engine


def _start_planned(start_server, model, draft=None, mmproj=None, **kw):
    """Start a server with the settings ``serve`` would choose (check included), via the fixture."""
    p = plan(ServingOptions(model=model, draft=draft, mmproj=mmproj, port=0, use_profile=False, **kw))
    s = p.settings
    return start_server(**{f.name: getattr(s, f.name) for f in fields(ServerSettings) if f.name != "server"})


def test_serve_mmproj_answers_image_chat_with_draft_timings(vl, pictures, start_server):
    srv = _start_planned(start_server, vl["tower"], vl["draft"], vl["mmproj"], draft_n_max=6)
    assert "--mmproj" in srv.settings.args() and "--spec-type" in srv.settings.args()
    c = srv.client()
    chart = next(p for p in pictures if p.category == "chart_vqa")
    # a local file (sent as a data URI by the client) and an explicit data URI
    for part in ({"type": "image", "path": str(chart.path)},
                 {"type": "image_url", "image_url": {"url": image_data_uri(chart.path)}}):
        out = c.chat([{"role": "user", "content": [part, {"type": "text", "text": chart.question}]}], max_tokens=32)
        t = out.timings
        assert t.draft_n and t.draft_n > 0, out.raw.get("timings")
        assert t.predicted_n == 32 and t.prompt_ms is not None and t.predicted_ms is not None
    # image tokens count as prompt tokens: 256 x 256 pixels = 64 tokens of 32 x 32 (the LFM2 minimum)
    plain = c.chat([{"role": "user", "content": chart.question}], max_tokens=4)
    out = c.chat([{"role": "user", "content": [{"type": "image", "path": str(chart.path)},
                                               {"type": "text", "text": chart.question}]}], max_tokens=4,
                 cache_prompt=False)
    assert out.timings.prompt_n - plain.timings.prompt_n >= 64
    # two images in one turn, then a follow-up turn over the cached image prefix, then streamed
    two = [{"role": "user", "content": [{"type": "image", "path": str(p.path)} for p in pictures[:2]]
            + [{"type": "text", "text": "Compare the two pictures."}]}]
    first = c.chat(two, max_tokens=24)
    assert first.timings.prompt_n >= 128 and first.timings.draft_n, first.raw.get("timings")
    follow = two + [{"role": "assistant", "content": first.text},
                    {"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                                 {"type": "image", "path": str(pictures[2].path)}]}]
    second = c.chat(follow, max_tokens=24)
    assert second.timings.cache_n and second.timings.draft_n, second.raw.get("timings")
    chunks = [ln for ln in c.stream_lines("/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_uri(
            pictures[3].path)}}, {"type": "text", "text": pictures[3].question}]}],
        "max_tokens": 24, "temperature": 0}) if ln.startswith("data: {")]
    assert json.loads(chunks[-1][len("data: "):])["timings"]["draft_n"] > 0
    # 7 requests; the engine's logger thread may lag them: wait for the last one's closing line
    srv.wait_for_log(r"stop processing", count=7)
    assert srv.wait_for_log("draft acceptance"), srv.log_text()[-2000:]
    assert "non-consecutive" not in srv.log_text() and "failed to process speculative" not in srv.log_text()


def test_hub_form_downloads_mmproj_and_serves_images(ggufdspark_cli, vl, pictures, start_server, monkeypatch,
                                                     tmp_path):
    """Published to a Hub on 127.0.0.1 (tests/fakehub.py), the pair is found by ``-hf`` / ``-hfd``
    alone: serve downloads the mmproj with the target (as llama-server's -hf would find it), checks
    the three files, and the engine answers image turns with the draft."""
    from fakehub import FakeHub

    token = "hf_vision_test_token"
    with FakeHub(token=token) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf-home"),
               "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        p = ggufdspark_cli("publish", "--target", str(vl["tower"]), "--draft", str(vl["draft"]), "--mmproj",
                           str(vl["mmproj"]), "--repo", "org/Tiny-LFM2-VL", "--single-repo", env=env)
        assert p.returncode == 0, p.stderr
        repo = "org/Tiny-LFM2-VL-GGUF"
        assert any(name.startswith("mmproj") for name in hub.files(repo)), list(hub.files(repo))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        srv = _start_planned(start_server, None, hf=f"{repo}:F16", hfd=f"{repo}:F16", draft_n_max=6, ctx_size=1024)
    args = srv.settings.args()
    assert "-hf" not in args and args[args.index("--mmproj") + 1].startswith(str(tmp_path / "hf-home"))
    assert srv.wait_for_log("loaded multimodal model")  # logged by the engine's logger thread: may lag /health
    pic = pictures[0]
    out = srv.client().chat([{"role": "user", "content": [{"type": "image", "path": str(pic.path)},
                                                          {"type": "text", "text": pic.question}]}], max_tokens=24)
    assert out.timings.draft_n and out.timings.draft_n > 0, out.raw.get("timings")


def _media_prompt(client, text: str, picture: Path) -> dict:
    marker = json.loads(client.get_text("/props"))["media_marker"]  # random per process in this build
    return {"prompt_string": text.replace("{img}", marker), "multimodal_data": [images.image_b64(picture)]}


def test_lossless_gate_holds_with_images(vl, pictures, start_server):
    plain = _start_planned(start_server, vl["tower"], None, vl["mmproj"])
    spec = _start_planned(start_server, vl["tower"], vl["draft"], vl["mmproj"], draft_n_max=6)
    pc, sc = plain.client(), spec.client()
    drafted = 0
    first_token = {}
    for pic in pictures:
        for text in TEXT_PROMPTS:
            a = pc.complete(_media_prompt(pc, text, pic.path), n_predict=32, n_probs=5)
            b = sc.complete(_media_prompt(sc, text, pic.path), n_predict=32, n_probs=5)
            assert a.tokens == b.tokens, f"{pic.id} {text!r}: plain {a.tokens} vs draft {b.tokens}"
            assert a.timings.draft_n is None
            drafted += b.timings.draft_n or 0
            # the first token comes from the prefill: its distribution shows the image embeddings
            # are the same with and without the draft
            assert a.probs[0]["top_logprobs"] == b.probs[0]["top_logprobs"]
            first_token[(pic.id, text)] = a.probs[0]["top_logprobs"]
        # chat endpoint too (text compared: it returns no token ids)
        msgs = [{"role": "user", "content": [{"type": "image", "path": str(pic.path)},
                                             {"type": "text", "text": pic.question}]}]
        assert pc.chat(msgs, max_tokens=24).text == sc.chat(msgs, max_tokens=24).text
    assert drafted > 0
    # and the image reaches the model: different pictures, different distributions
    for text in TEXT_PROMPTS:
        dists = [json.dumps(first_token[(p.id, text)]) for p in pictures]
        assert len(set(dists)) > 1, text


def test_image_requests_beside_text_ones_on_busy_slots_are_lossless(vl, pictures, start_server):
    """Issue 65's image traffic on the engine's batching: 4 clients in a closed loop on 4 slots, one
    request in two with a picture (its image tokens prefilled while the other slots draft), the rest
    text. Both servers answer every request; each drafted answer is the plain server's under the same
    traffic, or first leaves it where the plain server's top-2 were a near-tie; drafts are accepted."""
    clients, per_client = 4, 3
    plain = _start_planned(start_server, vl["tower"], None, vl["mmproj"], parallel=clients)
    spec = _start_planned(start_server, vl["tower"], vl["draft"], vl["mmproj"], draft_n_max=6, parallel=clients)
    answers = {}
    for name, srv in (("plain", plain), ("drafted", spec)):
        c = srv.client()
        queues: list[list[tuple[int, object, int]]] = [[] for _ in range(clients)]
        for rid in range(clients * per_client):
            text = TEXT_PROMPTS[rid % len(TEXT_PROMPTS)]
            prompt = (_media_prompt(c, text, pictures[rid % len(pictures)].path) if rid % 2 == 0
                      else c.tokenize(text.replace("{img}", "a picture"), add_special=True))
            queues[rid % clients].append((rid, prompt, 24 + 8 * (rid % 3)))
        answers[name] = closed_loop(srv, queues)
        errors = {rid: a["error"] for rid, a in answers[name].items() if "error" in a}
        assert not errors and srv.alive(), f"{name}: failed requests {errors}"
    drafted = answers["drafted"]
    assert sum(a["timings"].get("draft_n_accepted", 0) for a in drafted.values()) > 0, "nothing drafted was accepted"
    # the picture reached the model: an image request's prompt holds its tokens on top of the text's
    assert min(a["timings"]["prompt_n"] for rid, a in drafted.items() if rid % 2 == 0) >= 64
    for rid, want in sorted(answers["plain"].items()):
        assert_same_or_near_tie(want, drafted[rid]["tokens"], f"request {rid} (image: {rid % 2 == 0})")


# ----------------------------------------------------------------------------- generated images


def test_images_are_deterministic_and_answerable(tmp_path):
    a = images.random_items(tmp_path / "a", n_per_category=2, seed=3)
    b = images.random_items(tmp_path / "b", n_per_category=2, seed=3)
    assert [x.draw for x in a] == [x.draw for x in b]
    assert [x.path.read_bytes() for x in a] == [x.path.read_bytes() for x in b]
    assert {x.category for x in a} == set(images.CATEGORIES)
    from PIL import Image

    for it in a:
        with Image.open(it.path) as im:
            assert im.size == (images.DEFAULT_SIZE, images.DEFAULT_SIZE) and im.mode == "RGB"
        assert it.description.startswith("[Image: ")
        json.dumps(it.to_dict())
        if it.draw["kind"] in images.CHART_KINDS and "highest" in it.question:
            assert it.answer == it.draw["labels"][int(np.argmax(it.draw["values"]))]
        if it.category == "general_vqa" and it.question == "How many shapes are in the image?":
            assert it.answer == str(len(it.draw["objects"]))
    assert all(x.answer is None for x in a if x.category == "captioning")


@pytest.mark.parametrize("kind", list(images.CHART_KINDS) + ["sign", "scene"])
def test_every_draw_kind_renders(kind, tmp_path):
    rng = np.random.default_rng(0)
    draw = (images.random_chart(rng, kind)[0] if kind in images.CHART_KINDS else
            images.random_sign(rng)[0] if kind == "sign" else images.random_scene(rng)[0])
    p = images.render(draw, tmp_path / f"{kind}.png", size=(320, 240))
    assert p.read_bytes() == images.png_bytes(draw, size=(320, 240))
    from PIL import Image

    with Image.open(p) as im:
        assert im.size == (320, 240)
        assert len(np.unique(np.asarray(im).reshape(-1, 3), axis=0)) > 1  # something was drawn
    with pytest.raises(ValueError, match="unknown draw kind"):
        images.render({"kind": "video"}, tmp_path / "x.png")


def test_charts_are_drawn_without_a_working_matplotlib(tmp_path, monkeypatch):
    """A matplotlib that does not import (missing, or a broken build: a GPU host's raised SystemError
    from its font module) leaves charts to Pillow: every chart kind still renders a PNG of the size
    asked for, with more than a blank page on it, and its bars / points at the values' heights."""
    import builtins

    real_import = builtins.__import__

    def broken(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise SystemError("returned NULL without setting an exception")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", broken)
    for kind in images.CHART_KINDS:
        draw = {"kind": kind, "title": "t", "labels": ["a", "b", "c"], "values": [1, 4, 2], "unit": "u"}
        path = images.render(draw, tmp_path / f"{kind}.png", size=256)
        from PIL import Image

        img = Image.open(path).convert("RGB")
        assert img.size == (256, 256)
        colours = np.unique(np.asarray(img.resize((64, 64))).reshape(-1, 3), axis=0)
        assert len(colours) > 3, f"{kind}: nothing drawn"
    bars = Image.open(tmp_path / "bars.png").convert("RGB")
    column = [bars.getpixel((int(256 * (0.1 + 0.85 * (i + 0.5) / 3)), 200)) for i in range(3)]
    assert all(c != (255, 255, 255) for c in column), "a bar is missing at the bottom of the chart"
