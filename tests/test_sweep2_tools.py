"""Issue 31 (reliability, second sweep), the rows about the offline verbs and the Hub: publish
against a Hub that never answers (row 4), every llama-server log layout (5), tune's p_min and JSON
always valid (6), llama-quantize's cause line (9), a full disk (10), exit code 2 for every usage
error, one table walked (12), one float policy for quantized drafts (15)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fakehub import FakeHub
from test_reliability import REPO, _env, _one_line

LAYOUTS = Path(__file__).resolve().parent / "fixtures" / "timings" / "layouts"
TOKEN = "hf_sweep2_token"


# ----------------------------------------------------------------------------- row 12: exit codes


def _usage_table(pair, tmp_path) -> list[tuple[str, list[str], str]]:
    """(what, argv, text the one line must hold): every option value refused before any work."""
    t, d = str(pair.target), str(pair.draft)
    pub = ["publish", "--target", t, "--draft", d, "--dry-run"]
    bench = ["bench", "-m", t, "-md", d]
    tune = ["tune", "-m", t, "-md", d, "--no-save"]
    return [
        ("bench --concurrency 0", [*bench, "--concurrency", "0"], "--concurrency: 0"),
        ("bench --synthetic-accept with --synthetic-rates", [*bench, "--synthetic-accept", "2",
                                                             "--synthetic-rates", "0.5,0.4"], "mutually exclusive"),
        ("bench --synthetic-accept 99", [*bench, "--synthetic-accept", "99"], "--synthetic-accept 99"),
        ("bench --synthetic-rates rising", [*bench, "--synthetic-rates", "0.2,0.9,0.9"], "cannot increase"),
        ("bench --synthetic-rates 2", [*bench, "--synthetic-rates", "2,1,1"], "value 0 is 2.0"),
        ("bench -t 99999", [*bench, "-t", "99999"], "--threads 99999"),
        ("bench -t 0", [*bench, "-t", "0"], "--threads 0"),
        ("bench -t -7", [*bench, "-t", "-7"], "--threads -7"),
        ("bench --draft-n-max beyond the block", [*bench, "--draft-n-max", "60"], "exceeds what"),
        ("tune --draft-lengths 0", [*tune, "--draft-lengths", "0"], "draft length 0"),
        ("tune --draft-lengths 99", [*tune, "--draft-lengths", "99"], "draft length 99"),
        ("tune --rates 2,1", [*tune, "--rates", "2,1"], "value 0 is 2.0"),
        ("tune --p-min 2", [*tune, "--p-min", "2"], "--p-min 2.0"),
        ("tune --p-min -1", [*tune, "--p-min", "-1"], "--p-min -1.0"),
        ("tune --p-min nan", [*tune, "--p-min", "nan"], "--p-min nan"),
        ("tune -t 99999", [*tune, "-t", "99999"], "--threads 99999"),
        ("tune --acceptance unknown", [*tune, "--acceptance", "someday"], "unknown acceptance profile"),
        ("publish --repo notarepo", [*pub, "--repo", "notarepo"], "not a valid repo id"),
        ("publish --single-repo --draft-repo", [*pub, "--repo", "org/Tiny", "--single-repo", "--draft-repo",
                                                "org/Other"], "exclude each other"),
        ("publish --base-model bad", [*pub, "--repo", "org/Tiny", "--base-model", "no spaces allowed"],
         "base model 'no spaces allowed'"),
        ("publish --pair unknown quant", [*pub, "--repo", "org/Tiny", "--pair", "Q4_K_M=F16"], "--pair Q4_K_M=F16"),
        ("serve -- --port", ["serve", "-m", t, "-md", d, "--", "--port", "9"], "after --"),
        ("bench --p-min nan", [*bench, "--p-min", "nan"], "'nan' is not a number"),
        ("bench --near-tie-gap nan", [*bench, "--near-tie-gap", "nan"], "'nan' is not a number"),
        ("tune --min-gain nan", [*tune, "--min-gain", "nan"], "'nan' is not a number"),
        ("serve --health-timeout nan", ["serve", "-m", t, "-md", d, "--health-timeout", "nan"], "'nan' is not a number"),
        ("serve --start-timeout 0", ["serve", "-m", t, "-md", d, "--start-timeout", "0"], "--start-timeout"),
        ("serve --max-restarts -1", ["serve", "-m", t, "-md", d, "--max-restarts", "-1"], "--max-restarts"),
        ("serve --draft-n-max-by-slots longer than n_max", ["serve", "-m", t, "-md", d, "-np", "4", "--draft-n-max",
                                                            "3", "--draft-n-max-by-slots", "0:9", "--dry-run"],
         "longer than the draft length 3"),
    ]


@pytest.mark.slow
def test_every_usage_error_exits_2(ggufdspark_cli, small_pair, isolated, tmp_path):
    """The table of row 12 (and the new checks of rows 3, 6, 13): each refused before any work with
    one line and exit code 2, as errors.py documents. Before the fix most exited 1."""
    wrong = []
    for what, argv, text in _usage_table(small_pair, tmp_path):
        t0 = time.monotonic()
        p = ggufdspark_cli(*argv, env=isolated, timeout=120)
        lines = p.stderr.strip().splitlines()
        if p.returncode != 2 or "Traceback" in p.stderr or not lines or text not in lines[-1]:
            wrong.append(f"{what}: exit {p.returncode}: {p.stderr.strip()[-300:]}")
        assert time.monotonic() - t0 < 60, f"{what}: took {time.monotonic() - t0:.0f}s (did work first?)"
    assert not wrong, "\n".join(wrong)


def test_option_errors_are_invalid_arguments_and_keep_their_verb():
    """One place maps usage errors to 2: InvalidArgumentError (errors.py); the verbs' option errors
    subclass it and their own error, so `except BenchError` in scripts still catches them."""
    from ggufdspark.errors import (BenchError, BenchOptionError, InvalidArgumentError, PublishError,
                                   PublishOptionError)

    for cls, verb in ((BenchOptionError, BenchError), (PublishOptionError, PublishError)):
        e = cls("x")
        assert isinstance(e, InvalidArgumentError) and isinstance(e, verb) and isinstance(e, ValueError)
        assert e.exit_code == 2
    assert BenchError("x").exit_code == 1 and PublishError("x").exit_code == 1


# ----------------------------------------------------------------------------- row 6: JSON


def test_json_output_is_always_valid(capsys):
    from ggufdspark.cli._common import echo_json

    echo_json({"speedup": float("nan"), "points": [{"tps": float("inf")}, 1.5], "ok": True})
    out = capsys.readouterr().out

    def refuse(word):
        raise AssertionError(f"not JSON: {word}")

    doc = json.loads(out, parse_constant=refuse)
    assert doc == {"speedup": None, "points": [{"tps": None}, 1.5], "ok": True}


# ----------------------------------------------------------------------------- row 5: log layouts


LAYOUT_CASES = {  # file: (task, predicted_n, drafted, accepted, mean length printed or None, passes source)
    "per-line-pinned.log": (1, 64, 180, 31, 2.00, "log"),
    "per-line-positions.log": (42, 353, 388, 257, 3.65, "log"),
    "released.log": (3, 64, 42, 24, None, "estimated"),
    "prefix-line-first.log": (0, 64, 42, 24, None, "estimated"),
}


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
def test_every_llama_server_log_layout_is_read(name, ggufdspark_cli):
    from ggufdspark import timings as tm

    task, n, drafted, accepted, mean_len, source = LAYOUT_CASES[name]
    (r,) = tm.read(LAYOUTS / name)
    assert (r.task_id, r.predicted_n, r.draft_n, r.draft_n_accepted) == (task, n, drafted, accepted)
    assert r.prompt_n == 14 or name == "per-line-positions.log"
    assert r.reported_acceptance_rate == pytest.approx(accepted / drafted, abs=5e-6)
    assert r.reported_accept_length == mean_len and r.passes_source == source and r.passes
    assert r.e2e_ms is not None
    p = ggufdspark_cli("timings", "--json", str(LAYOUTS / name))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["records"][0]["draft_n_accepted"] == accepted


def test_a_bare_timing_line_needs_its_prefix_line():
    """Lines that look like timings but follow no slot prefix are not a request (another tool's)."""
    from ggufdspark import timings as tm
    from ggufdspark.errors import TimingsParseError

    text = (LAYOUTS / "prefix-line-first.log").read_text().replace("slot print_timing: id  0 | task 0 | \n", "")
    with pytest.raises(TimingsParseError, match="no llama-server per-request timing lines|cannot tell what this is"):
        tm.parse(text)
    with pytest.raises(TimingsParseError, match="no llama-server per-request timing lines"):
        tm.parse(text, format="log")


# ----------------------------------------------------------------------------- row 4: a silent Hub


@pytest.fixture
def silent_hub(tmp_path):
    with FakeHub(token=TOKEN) as h:
        home = tmp_path / "hf-home"
        home.mkdir()
        yield h, {"HF_ENDPOINT": h.url, "HF_TOKEN": TOKEN, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1",
                  "HF_HUB_DISABLE_TELEMETRY": "1", "HUGGING_FACE_HUB_TOKEN": "", "GGUFDSPARK_HUB_TIMEOUT": "2"}


@pytest.mark.parametrize("hang,stage", [(r".", "reading the Hub failed"),
                                        # huggingface_hub retries a timed-out upload, with pauses: about 35 s
                                        pytest.param(r"^POST /[^ ]+\.git/info/lfs/objects/batch$", "upload failed",
                                                     marks=pytest.mark.slow),
                                        (r"^POST /api/models/[^ ]+/commit/", "commit failed")],
                         ids=["every-request", "at-the-upload", "at-the-commit"])
def test_publish_to_a_hub_that_never_answers_ends(ggufdspark_cli, small_pair, silent_hub, hang, stage):
    hub, env = silent_hub
    hub.hang = hang
    t0 = time.monotonic()
    p = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(small_pair.draft),
                       "--repo", "org/Tiny-LFM2", env=env, timeout=120)
    assert time.monotonic() - t0 < 90
    assert p.returncode == 1
    line = _one_line(p, stage, "no answer from", hub.url, "within 2s", "GGUFDSPARK_HUB_TIMEOUT")
    assert hub.hung, "the fake Hub left no request hanging: the test tested nothing"
    if stage == "upload failed":  # huggingface_hub retries an upload that timed out; the others it does not
        assert len(hub.hung) > 1, hub.hung
    if stage != "reading the Hub failed":
        assert "nothing was committed" in line
        assert not [f for r in hub.repos for f in hub.files(r) if f.endswith(".gguf")]


def test_a_bad_hub_timeout_is_a_usage_error(ggufdspark_cli, small_pair, silent_hub):
    _, env = silent_hub
    p = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(small_pair.draft),
                       "--repo", "org/Tiny-LFM2", env={**env, "GGUFDSPARK_HUB_TIMEOUT": "soon"})
    assert p.returncode == 2
    _one_line(p, "GGUFDSPARK_HUB_TIMEOUT", "'soon'")


# ----------------------------------------------------------------------------- row 9: quantize cause


def test_quantize_failure_quotes_the_cause(small_pair, dspark_engine, tmp_path):
    from ggufdspark.errors import EngineError
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.quantize import find_quantize, quantize

    find_quantize(dspark_engine.path)  # fails with how to build it when absent
    src = tmp_path / "nan-F16.gguf"
    shutil.copy(small_pair.target, src)
    t = read_gguf(src).tensors["blk.0.ffn_up.weight"]
    with open(src, "r+b") as f:
        f.seek(t.offset)
        f.write(np.full(64, np.nan, dtype=np.float16).tobytes())
    with pytest.raises(EngineError) as e:
        quantize(src, "Q8_0", output=tmp_path / "out.gguf", server=dspark_engine.path)
    msg = str(e.value)
    assert "at tensor blk.0.ffn_up.weight" in msg and "found nan value" in msg, msg
    assert "has invalid data" in msg and "failed to quantize model from" not in msg
    assert not list(tmp_path.glob("*out.gguf*"))


# ----------------------------------------------------------------------------- row 10: disk full


def _limited(argv: list[str], kib: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``ggufdspark ARGV`` with the file-size limit at ``kib`` KiB (what a full disk does to a write)."""
    cmd = f"ulimit -f {kib}; exec \"$@\""
    return subprocess.run(["bash", "-c", cmd, "bash", sys.executable, "-m", "ggufdspark", *argv], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_full_disk_names_the_file_and_leaves_nothing(small_pair, dspark_engine, tmp_path):
    env = _env(GGUFDSPARK_CACHE=str(tmp_path / "cache"), GGUFDSPARK_SERVER=str(dspark_engine.path))
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        ("convert", ["convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o",
                     str(out / "d.gguf")], out / "d.gguf"),
        ("convert-target", ["convert-target", str(small_pair.target_dir), "-o", str(out / "t.gguf")], out / "t.gguf"),
        ("quantize", ["quantize", str(small_pair.target), "--type", "Q8_0", "-o", str(out / "q.gguf")],
         out / "q.gguf"),
    ]
    for what, argv, target in cases:
        p = _limited(argv, 64, env)
        assert p.returncode != 0, f"{what}: {p.stdout}"
        line = _one_line(p, str(target), "GB free on", str(out))
        assert "File too large" in line, f"{what}: {line}"
        assert not list(out.iterdir()), f"{what} left {list(out.iterdir())}"
    gen = tmp_path / "gen"
    p = _limited(["generate", str(gen)], 64, env)
    assert p.returncode != 0
    _one_line(p, str(gen), "GB free on")
    assert not gen.exists(), "generate left a partial tree"
    again = subprocess.run([sys.executable, "-m", "ggufdspark", "generate", str(gen)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr  # the re-run is not blocked


# ----------------------------------------------------------------------------- row 15: float policy


def test_convert_and_quantize_keep_the_same_markov_head(small_pair, dspark_engine, tmp_path, ggufdspark_cli):
    """Both ways to a Q8_0 draft keep the Markov head in the float type it came in; check says so."""
    from ggufdspark.check import check_pair
    from ggufdspark.convert.drafter import convert_drafter
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.quantize import quantize
    from ggufdspark.quants import DRAFT_KEEP_FLOAT
    from ggufdspark.synthetic import synth

    ddir = synth.make_drafter(tmp_path / "drafter-f16", small_pair.target_dir, dtype="F16")
    converted = convert_drafter(ddir, small_pair.target, output=tmp_path / "dspark-conv-Q8_0.gguf",
                                outtype="q8_0").path
    quantized = quantize(small_pair.draft, "Q8_0", output=tmp_path / "dspark-quant-Q8_0.gguf",
                         server=dspark_engine.path).path
    for path in (converted, quantized):
        g = read_gguf(path)
        assert {g.tensors[t].type_name for t in DRAFT_KEEP_FLOAT} == {"F16"}, path
        assert g.tensors["blk.0.attn_q.weight"].type_name == "Q8_0"
        rep = check_pair(small_pair.target, path)
        assert rep.ok and rep.markov_head == "F16" and "draft Q8_0 (Markov head F16)" in rep.pair_label()
    p = ggufdspark_cli("check", str(small_pair.target), str(converted))
    assert p.returncode == 0 and "Markov head F16" in p.stdout, p.stdout


# ----------------------------------------------------------------------------- row 8: a later quant


def test_a_quant_published_later_keeps_the_first_on_the_card_and_warns(ggufdspark_cli, small_pair, pairs_root,
                                                                      silent_hub):
    """F16 first, BF16 later: the card lists both, and publish warns that -hf REPO:F16 now takes the
    BF16 file (the tag F16 matches 'BF16.'). Before the fix the card held only the new file."""
    from ggufdspark.synthetic.pairs import build_pair

    hub, env = silent_hub
    bf16 = build_pair(pairs_root, outtype="bf16")
    first = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(small_pair.draft),
                           "--repo", "org/Tiny-LFM2", env=env)
    assert first.returncode == 0, first.stderr
    second = ggufdspark_cli("publish", "--target", str(bf16.target), "--draft", str(bf16.draft),
                            "--repo", "org/Tiny-LFM2", env=env)
    assert second.returncode == 0, second.stderr
    card = hub.files("org/Tiny-LFM2-GGUF")["README.md"].decode()
    assert "Tiny-LFM2-F16.gguf" in card and "Tiny-LFM2-BF16.gguf" in card, card
    assert "Published earlier and still in this repo" in card
    draft_card = hub.files("org/Tiny-LFM2-DSpark-GGUF")["README.md"].decode()
    assert "dspark-Tiny-LFM2-F16.gguf" in draft_card and "dspark-Tiny-LFM2-BF16.gguf" in draft_card
    warned = [ln for ln in second.stderr.splitlines() if ln.startswith("WARNING: ")]
    assert any("Tiny-LFM2-F16.gguf (published earlier)" in ln and "-hf org/Tiny-LFM2-GGUF:F16" in ln
               and "Tiny-LFM2-BF16.gguf" in ln for ln in warned), second.stderr
