"""Issue 30: Hub references resolved as the pinned llama-server resolves them, downloaded through
huggingface_hub from the fake Hub on 127.0.0.1 (tests/fakehub.py), then checked and served.

The picking rules are replayed on the cases of the pinned tree's tests/test-model-resolution.cpp
(every reordering of each listing, as that test does); the rest runs the real CLI against a pair
published by ``ggufdspark publish`` and the real engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakehub import FakeHub
from ggufdspark import hubpick
from ggufdspark.hubref import HubRef, is_ref, parse_ref

REPO = Path(__file__).resolve().parent.parent
TOKEN = "hf_GgufdsparkFakeTokenNeverPrintMe0123456789"
T_REPO, D_REPO = "org/Tiny-LFM2-GGUF", "org/Tiny-LFM2-DSpark-GGUF"

# ----------------------------------------------------------------------------- llama.cpp's picking rules

FLAT = ["README.md", "model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-BF16.gguf",
        "mmproj-model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf", "mtp-model-Q8_0.gguf",
        "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]
SUBDIR = ["mmproj-model-f16.gguf", "model-mtp-BF16.gguf", "model-mtp-Q8_0.gguf",
          "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
          "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf", "Q8_0/model-Q8_0-00001-of-00002.gguf",
          "Q8_0/model-Q8_0-00002-of-00002.gguf"]
HOLE = ["model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf",
        "mtp-model-Q8_0.gguf", "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]
UNSLOTH = ["model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", "model-MTP-BF16.gguf"]
QUAD = ["model-Q8_0.gguf", "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf", "eagle3-model-Q8_0.gguf",
        "dspark-model-Q8_0.gguf"]
SPARK = ["README.md", "model-MXFP4.gguf", "dspark-model-BF16.gguf", "dspark-model-MXFP4.gguf"]

# (name, files, tag, order-dependent, primary, parts, mmproj, dflash, dspark): plan_cases of the pinned
# test (its mtp and eagle3 columns left out: serve asks for no such sidecar; ``...``: a case that asks
# for no sidecar there)
CASES = [
    ("flat exact tag", FLAT, "Q8_0", False, "model-Q8_0.gguf", ["model-Q8_0.gguf"], "mmproj-model-Q8_0.gguf",
     "dflash-model-Q8_0.gguf", None),
    ("flat default", FLAT, "", False, "model-Q4_K_M.gguf", ["model-Q4_K_M.gguf"], ..., ..., ...),
    ("unsloth fallback", UNSLOTH, "", True, "model-UD-Q8_K_XL.gguf", ["model-UD-Q8_K_XL.gguf"], "mmproj-BF16.gguf",
     None, None),
    ("subdir shards", SUBDIR, "Q3_K_M", False, "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf",
     SUBDIR[3:6], "mmproj-model-f16.gguf", None, None),
    ("hole tag sidecar", HOLE, "Q4_0", False, None, [], None, "dflash-model-Q8_0.gguf", None),
    ("hole default anchor", HOLE, "", False, "model-Q4_K_M.gguf", ["model-Q4_K_M.gguf"], None,
     "dflash-model-Q8_0.gguf", None),
    ("unsloth suffix mtp", UNSLOTH, "Q8_K_XL", False, "model-UD-Q8_K_XL.gguf", ["model-UD-Q8_K_XL.gguf"],
     "mmproj-BF16.gguf", None, None),
    ("quad exact tag", QUAD, "Q8_0", False, "model-Q8_0.gguf", ["model-Q8_0.gguf"], None, "dflash-model-Q8_0.gguf",
     "dspark-model-Q8_0.gguf"),
    ("spark default anchor", SPARK, "", False, "model-MXFP4.gguf", ["model-MXFP4.gguf"], None, None,
     "dspark-model-MXFP4.gguf"),
    ("spark tag sidecar", SPARK, "BF16", False, None, [], None, None, "dspark-model-BF16.gguf"),
]


def _orders(files: list[str], order_dependent: bool):
    """The reorderings the pinned test replays: every rotation, every odd one reversed."""
    for rot in range(1 if order_dependent else len(files)):
        f = files[rot:] + files[:rot]
        yield f[::-1] if rot % 2 == 1 else f


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_picks_as_the_pinned_llama_server(case):
    name, files, tag, order_dependent, primary, parts, mmproj, dflash, dspark = case
    for listing in _orders(files, order_dependent):
        got = hubpick.pick_model(listing, tag)
        assert got == primary, (name, listing)
        assert sorted(hubpick.model_parts(listing, got) if got else []) == sorted(parts), (name, listing)
        anchor = got or ""
        if mmproj is ...:
            continue
        if got:  # llama.cpp looks for the mmproj only beside a model it found, with no tag
            assert hubpick.pick_sibling(listing, anchor, hubpick.MMPROJ) == mmproj, (name, listing)
        assert hubpick.pick_sibling(listing, anchor, "dflash-", tag) == dflash, (name, listing)
        assert hubpick.pick_sibling(listing, anchor, hubpick.DSPARK, tag) == dspark, (name, listing)


def test_tags_are_case_insensitive_and_quants_are_listed():
    files = ["Tiny-LFM2-F16.gguf", "Tiny-LFM2-Q8_0.gguf", "mmproj-Tiny-LFM2-F16.gguf", "dspark-Tiny-LFM2-F16.gguf"]
    assert hubpick.pick_model(files, "q8_0") == "Tiny-LFM2-Q8_0.gguf"
    assert hubpick.pick_model(files, "Q4_K_M") is None
    assert hubpick.quants_present(files) == ["F16", "Q8_0"]
    assert hubpick.quants_present(files, hubpick.DSPARK) == ["F16"]
    # a draft repo: no model at all, the sidecar found from the root; no tag: the fewest bits
    drafts = ["dspark-X-F16.gguf", "dspark-X-Q8_0.gguf"]
    assert hubpick.pick_model(drafts, "") is None
    assert hubpick.pick_sibling(drafts, "", hubpick.DSPARK, "f16") == "dspark-X-F16.gguf"
    assert hubpick.pick_sibling(drafts, "", hubpick.DSPARK, "") == "dspark-X-Q8_0.gguf"


def test_what_is_a_reference(tmp_path, monkeypatch):
    assert parse_ref("org/Tiny-LFM2-GGUF:q8_0") == HubRef("org/Tiny-LFM2-GGUF", "q8_0")
    assert str(parse_ref("org/x.y-z")) == "org/x.y-z"
    monkeypatch.chdir(tmp_path)
    assert is_ref("org/Tiny-LFM2-GGUF:Q8_0") and is_ref("org/name")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "local").write_bytes(b"")
    assert not is_ref("org/local")  # an existing file is a file
    assert not is_ref("org/name")  # a path in a local folder (issue 64 row 4), even when missing
    assert not is_ref("models/tiny.gguf") and not is_ref("tiny") and not is_ref("a/b/c") and not is_ref("org/-x")


# ----------------------------------------------------------------------------- against the fake Hub


@pytest.fixture
def hub():
    with FakeHub(token=TOKEN) as h:
        yield h


@pytest.fixture
def hub_env(hub, isolated, tmp_path, monkeypatch) -> dict[str, str]:
    """A CLI run against the fake Hub: its endpoint, the token, an empty HF home, the built engine."""
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "MODEL_ENDPOINT"):  # the cache follows HF_HOME below
        monkeypatch.delenv(var, raising=False)
    return {**isolated, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HUGGING_FACE_HUB_TOKEN": ""}


@pytest.fixture
def published(ggufdspark_cli, small_pair, quant_pair, hub, hub_env) -> dict[str, Path]:
    """The pair published by ``ggufdspark publish``: Q8_0 and F16 targets in org/Tiny-LFM2-GGUF, the
    Q8_0 draft in org/Tiny-LFM2-DSpark-GGUF."""
    p = ggufdspark_cli("publish", "--repo", "org/Tiny-LFM2", "--target", str(quant_pair["target-Q8_0"]),
                       "--target", str(small_pair.target), "--draft", str(quant_pair["draft-Q8_0"]), env=hub_env)
    assert p.returncode == 0, p.stderr
    assert set(hub.files(T_REPO)) >= {"Tiny-LFM2-Q8_0.gguf", "Tiny-LFM2-F16.gguf"}
    assert "dspark-Tiny-LFM2-Q8_0.gguf" in hub.files(D_REPO)
    hub.requests.clear()
    return {"target": quant_pair["target-Q8_0"], "draft": quant_pair["draft-Q8_0"], "target-F16": small_pair.target}


def sha256(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def snapshot(env: dict, repo: str) -> Path:
    (d,) = (Path(env["HF_HOME"]) / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir()
    return d


def assert_one_line_error(p, *, code: int | None = None) -> str:
    assert p.returncode != 0, p.stdout
    if code is not None:
        assert p.returncode == code, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("ggufdspark: error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert TOKEN not in p.stdout + p.stderr and TOKEN[3:] not in p.stdout + p.stderr
    return lines[0]


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if m := re.search(pattern, text, re.MULTILINE):
            return m
        if proc.poll() is not None:
            pytest.fail(f"serve exited ({proc.returncode}) before printing {pattern!r}:\n{text[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"serve printed no {pattern!r} within {timeout:g} s:\n{path.read_text(errors='replace')[-3000:]}")


def serve_and_ask(env: dict, tmp_path: Path, name: str, *refs: str) -> tuple[str, dict]:
    """Run ``ggufdspark serve REFS...`` until ready, send one request, stop it with SIGINT; returns
    what serve printed and the response's timings."""
    from ggufdspark.runners.client import Client

    out = tmp_path / f"{name}.out"
    cmd = [sys.executable, "-m", "ggufdspark", "serve", *refs, "--port", "0", "--no-ui", "--no-profile",
           "--draft-n-max", "3", "-c", "512", "--log", str(tmp_path / f"{name}.log")]
    with open(out, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env, "PYTHONPATH": str(REPO)}, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        url = _wait_for_line(out, r"^ready: (http://\S+)", proc, 240).group(1)
        timings = Client(url).complete("The model draft target", n_predict=32).raw["timings"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = out.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert TOKEN not in text
    return text, timings


def test_serve_from_the_hub_then_from_the_cache_offline(published, hub, hub_env, tmp_path):
    """``serve -hf ORG/NAME-GGUF:Q8_0 -hfd ORG/NAME-DSpark-GGUF:Q8_0`` downloads the published pair
    through huggingface_hub, checks it and hands the engine local paths; the draft engages. Then,
    with the Hub stopped and HF_HUB_OFFLINE=1, the same line serves from the cache."""
    text, timings = serve_and_ask(hub_env, tmp_path, "online", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:q8_0")
    assert timings.get("draft_n", 0) > 0, timings
    t_snap, d_snap = snapshot(hub_env, T_REPO), snapshot(hub_env, D_REPO)
    assert sha256(t_snap / "Tiny-LFM2-Q8_0.gguf") == sha256(published["target"])
    assert sha256(d_snap / "dspark-Tiny-LFM2-Q8_0.gguf") == sha256(published["draft"])
    # the engine got local files, never -hf, and never asked the Hub anything itself (llama.cpp asks /refs)
    cmd_line = next(ln for ln in text.splitlines() if "llama-server" in ln and " -m " in ln)
    assert f"-m {t_snap / 'Tiny-LFM2-Q8_0.gguf'}" in cmd_line and f"-md {d_snap / 'dspark-Tiny-LFM2-Q8_0.gguf'}" \
        in cmd_line and " -hf" not in cmd_line, cmd_line
    assert not hub.calls("GET", r"/refs$") and hub.calls("GET", r"/resolve/.*Tiny-LFM2-Q8_0\.gguf$")

    hub.stop()
    offline = {**hub_env, "HF_HUB_OFFLINE": "1"}
    text, timings = serve_and_ask(offline, tmp_path, "offline", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0")
    assert timings.get("draft_n", 0) > 0, timings
    assert f"-m {t_snap / 'Tiny-LFM2-Q8_0.gguf'}" in text


def test_unreachable_hub_falls_back_to_the_cache(ggufdspark_cli, published, hub, hub_env):
    p = ggufdspark_cli("check", f"{T_REPO}:Q8_0", f"{D_REPO}:Q8_0", env=hub_env)
    assert p.returncode == 0 and "pair OK" in p.stdout, p.stderr
    hub.stop()
    p = ggufdspark_cli("serve", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0", "--dry-run", env=hub_env)
    assert p.returncode == 0, p.stderr
    assert re.search(r"WARNING: cannot reach the Hub at http://127\.0\.0\.1:\d+ .*using org/Tiny-LFM2-GGUF as cached",
                     p.stderr), p.stderr
    assert "Tiny-LFM2-Q8_0.gguf" in p.stdout and " -hf " not in p.stdout


@pytest.mark.parametrize("verb", ["check", "serve"])
def test_hub_failures_are_one_line(ggufdspark_cli, published, hub, hub_env, tmp_path, verb):
    def run(*refs, env=hub_env):
        args = ["check", *refs] if verb == "check" else ["serve", "-hf", refs[0], "-hfd", refs[1], "--dry-run"]
        return ggufdspark_cli(*args, env=env)

    good_d = f"{D_REPO}:Q8_0"
    homes = iter(range(100))
    fresh = lambda **kw: {**hub_env, "HF_HOME": str(tmp_path / f"home-{next(homes)}"), **kw}  # noqa: E731
    line = assert_one_line_error(run("org/Nope-GGUF:Q8_0", good_d), code=4)
    assert re.search(r"org/Nope-GGUF: no such model repo on http://127\.0\.0\.1:\d+", line), line
    line = assert_one_line_error(run(f"{T_REPO}:Q4_K_M", good_d), code=4)
    assert line.endswith(f"{T_REPO}:Q4_K_M: no model file tagged Q4_K_M in {T_REPO}; quants there: F16, Q8_0"), line
    line = assert_one_line_error(run(f"{T_REPO}:Q8_0", "org/Nope:Q8_0"), code=4)
    assert "org/Nope: no such model repo" in line, line
    # gated: without a token, how to log in; with another token, where to ask for access
    hub.repos[T_REPO].gated = True
    line = assert_one_line_error(run(f"{T_REPO}:Q8_0", good_d, env=(env := fresh(HF_TOKEN=""))))
    assert f"{T_REPO} is gated: log in with 'hf auth login' or set HF_TOKEN" in line, line
    other = "hf_AnotherFakeTokenWithoutAccess0123456789"
    assert not list((Path(env["HF_HOME"]) / "hub").glob("models--org--Tiny-LFM2-GGUF/snapshots/*/*"))
    p = run(f"{T_REPO}:Q8_0", good_d, env=fresh(HF_TOKEN=other))
    line = assert_one_line_error(p)
    assert "has no access to it: ask for access at" in line and other not in p.stderr, line
    hub.repos[T_REPO].gated = False
    # offline and not cached; the Hub not reachable and nothing cached
    line = assert_one_line_error(run(f"{T_REPO}:Q8_0", good_d, env=fresh(HF_HUB_OFFLINE="1")), code=4)
    assert "not in the Hugging Face cache" in line and "HF_HUB_OFFLINE is set" in line, line
    line = assert_one_line_error(run(f"{T_REPO}:Q8_0", good_d, env=fresh(HF_ENDPOINT="http://127.0.0.1:9")))
    assert f"{T_REPO}: cannot download: the Hub at http://127.0.0.1:9 cannot be reached" in line \
        and "not in the Hugging Face cache" in line, line
    assert TOKEN not in json.dumps(hub.requests)


def test_a_broken_download_resumes_and_a_failed_one_leaves_nothing(ggufdspark_cli, published, hub, hub_env):
    name = "Tiny-LFM2-Q8_0.gguf"
    repo_dir = Path(hub_env["HF_HOME"]) / "hub" / "models--org--Tiny-LFM2-GGUF"
    # the connection drops halfway and then the Hub refuses: one line, and no part of the file anywhere
    hub.cut_downloads[name], hub.refuse_downloads = 1, {name}
    p = ggufdspark_cli("check", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0", env=hub_env)
    line = assert_one_line_error(p)
    assert f"{T_REPO}: downloading {name} failed (HTTP 503" in line and "nothing of it was kept" in line, line
    assert not list(repo_dir.glob(f"snapshots/*/{name}")), "a half-downloaded file reached the snapshot"
    assert not list(repo_dir.glob("blobs/*")), list(repo_dir.glob("blobs/*"))
    # the connection drops halfway once: huggingface_hub retries in the same run and completes (a file
    # this small arrives in one read of its 10 MB chunks, so the retry starts over instead of a Range)
    hub.cut_downloads[name], hub.refuse_downloads = 1, set()
    hub.requests.clear()
    p = ggufdspark_cli("check", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0", env=hub_env)
    assert p.returncode == 0 and "pair OK" in p.stdout, p.stderr
    gets = [s for m, path, s in hub.requests if m == "GET" and path.endswith("/" + name)]
    assert gets == [-200, 200], gets
    assert sha256(snapshot(hub_env, T_REPO) / name) == sha256(published["target"])


def test_every_verb_takes_references(ggufdspark_cli, published, hub, hub_env, tmp_path):
    p = ggufdspark_cli("inspect", f"{D_REPO}:Q8_0", "--json", env=hub_env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kind"] == "dspark-draft"
    p = ggufdspark_cli("--debug", "check", "--json", "-m", f"{T_REPO}:Q8_0", "-md", f"{D_REPO}", env=hub_env)
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stderr
    assert TOKEN not in p.stdout + p.stderr and TOKEN[3:] not in p.stdout + p.stderr
    out = tmp_path / "q"
    out.mkdir()
    p = subprocess.run([sys.executable, "-m", "ggufdspark", "quantize", f"{T_REPO}:f16", "--type", "Q4_0"],
                       cwd=out, env={**os.environ, **hub_env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (out / "Tiny-LFM2-Q4_0.gguf").is_file()  # here, not in the Hugging Face cache
    assert not list(snapshot(hub_env, T_REPO).glob("*Q4_0*"))
    # tune reads the profile of the downloaded files (none yet: the message names its path, not a missing file)
    p = ggufdspark_cli("tune", "--show", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0", env=hub_env)
    line = assert_one_line_error(p, code=4)
    assert "no tune profile for this pair on this machine" in line, line
    # bench measures the downloaded pair
    p = ggufdspark_cli("bench", "-hf", f"{T_REPO}:Q8_0", "-hfd", f"{D_REPO}:Q8_0", "--limit", "1", "--categories",
                       "general_vqa", "-n", "16", "--concurrency", "1", "--no-gate", "--json", env=hub_env)
    assert p.returncode in (0, 5), p.stderr  # 5: a busy machine's plain runs drifted (no speedup claimed)
    report = json.loads(p.stdout)
    assert Path(report["settings"]["target"]).parent == snapshot(hub_env, T_REPO), report["settings"]
    # the target given twice is a usage error, before any download
    hub.requests.clear()
    p = ggufdspark_cli("serve", "-m", str(published["target"]), "-hf", f"{T_REPO}:Q8_0", "--dry-run", env=hub_env)
    line = assert_one_line_error(p, code=2)
    assert "the target given twice" in line and not hub.requests, line


def test_one_repo_pair_and_its_mmproj(ggufdspark_cli, quant_pair, mmproj, hub, hub_env, tmp_path):
    """A target repo that also holds the draft (--single-repo) and an mmproj: -hf alone brings both,
    picked as llama-server picks them, and check reads all three."""
    mm = mmproj
    p = ggufdspark_cli("publish", "--repo", "org/Tiny-LFM2", "--single-repo", "--target",
                       str(quant_pair["target-Q8_0"]), "--draft", str(quant_pair["draft-Q8_0"]), "--mmproj", str(mm),
                       env=hub_env)
    assert p.returncode == 0, p.stderr
    p = ggufdspark_cli("check", "--json", "-hf", f"{T_REPO}:Q8_0", env=hub_env)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["ok"], report
    snap = snapshot(hub_env, T_REPO)
    assert {Path(report["draft"]).name, Path(report["mmproj"]).name} == {"dspark-Tiny-LFM2-Q8_0.gguf",
                                                                          "mmproj-Tiny-LFM2-F16.gguf"}
    assert sha256(snap / "mmproj-Tiny-LFM2-F16.gguf") == sha256(mm)


def test_doctor_says_how_hub_references_are_downloaded(ggufdspark_cli, hub_env):
    p = ggufdspark_cli("doctor", env=hub_env)
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("hub:")]
    assert "through huggingface_hub" in line and f"into {hub_env['HF_HOME']}/hub from {hub_env['HF_ENDPOINT']}" \
        in line and "a token is set" in line and "without TLS (LLAMA_OPENSSL=OFF)" in line, line
    assert TOKEN not in p.stdout + p.stderr
    p = ggufdspark_cli("doctor", "--json", env={**hub_env, "HF_TOKEN": "", "HF_HUB_OFFLINE": "1"})
    hub_text = json.loads(p.stdout)["hub"]
    assert "no token (gated repos: 'hf auth login' or HF_TOKEN)" in hub_text and "the cache only" in hub_text
