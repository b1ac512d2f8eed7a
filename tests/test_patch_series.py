"""The engine patch series as shipped: the product series a user's engine gets, the developer
series ``build-engine --dev`` adds, and their round trip through ``scripts/engine_patches.sh``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ggufdspark import engine

REPO = Path(__file__).resolve().parent.parent
REMOVED = ("0010", "0011", "0012", "0016", "0044", "0075", "0076", "0077")  # measured no gain or superseded (docs/engine-patches-history.md)
N_PRODUCT = 49  # patches in the product series
# patches folded into the earlier patch they reworked (product-44): the old number is an alias
FOLDED = {"0030": "0021", "0041": "0040", "0051": "0002", "0052": "0050", "0063": "0061", "0068": "0067"}
DEV = ("0014", "0015", "0029", "0031", "0035", "0039", "0042", "0043", "0047", "0049", "0054", "0055", "0056", "0057", "0059", "0060", "0070", "0073", "0074", "0078", "0080", "0082", "0084", "0085", "0086", "0087")
# switches that turned a correctness fix off or picked a variant that measured slower
FOOT_GUNS = ("LLAMA_RS_SNAPSHOTS_MOVE", "GGML_CUDA_MMF_FEW_MIN_ROWS", "GGML_CUDA_MMV_FEW",
             "GGML_CUDA_SMALL_N_CUBLAS", "LLAMA_GRAPH_REUSE_KEPT", "spec-draft-max-slots", "GGML_CUDA_TOPK_SHFL")


def _number(p: Path) -> str:
    return p.name[:4]


def test_the_product_series_has_only_kept_patches():
    product = engine.patch_files()
    numbers = [_number(p) for p in product]
    assert numbers == sorted(numbers) and len(numbers) == N_PRODUCT, numbers
    assert not set(numbers) & set(REMOVED + DEV + tuple(FOLDED)), numbers
    for p in product:
        text = p.read_text()
        trailer = re.search(r"^ggufdspark-patch: (\d{4})$", text, re.M)
        assert trailer and trailer[1] == _number(p), f"{p.name}: trailer {trailer and trailer[1]}"
        added = "\n".join(line for line in text.splitlines() if line.startswith("+"))
        for gun in FOOT_GUNS:
            assert gun not in added, f"{p.name} adds {gun}"
        assert not re.search(r"session \d", text, re.I), f"{p.name} dates itself by work period"
    # 0022 launches one layout only: the ones that measured slower are gone
    mmf = next(p for p in product if _number(p) == "0022").read_text()
    assert len(set(re.findall(r"mul_mat_f_few_cuda<bf16, (\d+), (\d+)>", mmf))) == 1


def test_the_dev_series_goes_after_the_product_series_in_its_own_build():
    product, with_dev = engine.patch_files(), engine.patch_files(dev=True)
    assert with_dev[:len(product)] == product
    assert [_number(p) for p in with_dev[len(product):]] == list(DEV)
    assert engine.BuildSpec(dev=True).key() != engine.BuildSpec().key()
    assert engine.BuildSpec(patches=False, dev=True).patch_files() == []


def test_build_engine_refuses_dev_without_patches(ggufdspark_cli):
    p = ggufdspark_cli("build-engine", "--dev", "--no-patches")
    assert p.returncode == 2 and "--dev and --no-patches" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_series_round_trip_through_the_git_checkout(tmp_path):
    """checkout applies both series with git am (so each applies on top of the ones before it);
    export writes them back byte for byte."""
    if shutil.which("git") is None:
        pytest.fail("git is not on PATH: scripts/engine_patches.sh needs it")
    script = REPO / "scripts" / "engine_patches.sh"
    env = {**os.environ, "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(script), "checkout", str(tmp_path / "tree")], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(p.stdout.strip().splitlines()) == N_PRODUCT + len(DEV), p.stdout
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(script), "export", str(tmp_path / "tree")], capture_output=True, text=True,
                       env={**env, "PATCHES_OUT": str(out)}, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for series, got in ((engine.patches_dir(), out / "patches"), (engine.dev_patches_dir(), out / "patches-dev")):
        want = {q.name: q.read_bytes() for q in series.glob("*.patch")}
        have = {q.name: q.read_bytes() for q in got.glob("*.patch")}
        assert sorted(have) == sorted(want), (sorted(have), sorted(want))
        for name in want:
            assert have[name] == want[name], f"{name}: exported differently from the shipped file"


def test_the_docs_count_and_table_the_series_as_shipped():
    """README and docs/engine-patches.md say how many patches the product series holds, and the
    latter's table has a row for each patch of both series; a patch added or moved without them
    fails here."""
    product = [_number(p) for p in engine.patch_files()]
    for doc in ("README.md", "docs/engine-patches.md"):
        text = (REPO / doc).read_text()
        counts = re.findall(r"`ggufdspark/data/patches/`,? (\d+) patches", text)
        assert counts and set(counts) == {str(len(product))}, f"{doc}: product series counted as {counts}"
    table = (REPO / "docs" / "engine-patches.md").read_text().split("## The patches at a glance", 1)[1]
    table = table.split("\n## ", 1)[0]
    rows = re.findall(r"^\| (dev )?(\d{4}) \|", table, re.M)
    assert [n for dev, n in rows if not dev] == product, rows
    assert sorted(n for dev, n in rows if dev) == sorted(DEV), rows


def test_the_cache_key_follows_what_a_patch_changes_not_its_description(tmp_path, monkeypatch):
    """A build is keyed on the patches' diffs in order: a patch's message (its header, an
    `Upstream:` line) or file name edited keeps the cached build; a changed line of a diff, or the
    series reordered, gives another key."""
    from ggufdspark.engine import build, source

    series = [p.read_text() for p in engine.patch_files()[:3]]
    d = tmp_path / "patches"

    def key_of(texts, names=None):
        if d.exists():
            for p in d.iterdir():
                p.unlink()
        d.mkdir(exist_ok=True)
        for i, text in enumerate(texts):
            (d / (names[i] if names else f"{i + 1:04d}-p.patch")).write_text(text)
        return engine.BuildSpec().key()

    monkeypatch.setattr(source, "patches_dir", lambda: d)
    monkeypatch.setattr(build, "patch_files", source.patch_files)
    base = key_of(series)
    header = series[0].replace("Subject: [PATCH] ", "Subject: [PATCH] reworded: ", 1) + ""
    header = header.replace("\n---\n", "\nUpstream: none.\n---\n", 1)
    assert header != series[0]
    assert key_of([header, *series[1:]]) == base
    assert key_of(series, names=["0001-a.patch", "0002-b.patch", "0003-c.patch"]) == base
    i = series[1].index("\n+", series[1].index("diff --git"))
    body = series[1][:i] + "\n+// one more line" + series[1][i:]
    assert key_of([series[0], body, series[2]]) != base
    assert key_of([series[1], series[0], series[2]]) != base


def test_a_folded_patch_carries_its_aliases_text_and_the_docs_resolve_the_old_number():
    """A patch folded into the one it reworked keeps its description there ("Folded in from patch
    NNNN"), and docs/engine-patches.md says where the old number went, so a result file or doc citing
    it still resolves."""
    doc = " ".join((REPO / "docs" / "engine-patches.md").read_text().split())
    by_number = {_number(p): p.read_text() for p in engine.patch_files()}
    for old, new in FOLDED.items():
        assert f"Folded in from patch {old} " in by_number[new], f"{new} does not carry {old}'s message"
        assert re.search(rf"^ggufdspark-patch: {new}$", by_number[new], re.M), new
        assert f"{old} into {new}" in doc, f"docs/engine-patches.md does not say {old} went into {new}"
        assert f"#### Folded in: what was {old} " in doc, f"docs/engine-patches.md lost {old}'s section"
