"""Issue 8: ``ggufdspark publish``, proven against a Hub served on 127.0.0.1 (tests/fakehub.py) by
the real huggingface_hub client, and against the real llama-server's ``-hf`` / ``-hfd`` downloader.

No network: every test that talks to "the Hub" talks to the fake one, whose state says what arrived.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from fakehub import FakeHub
from ggufdspark.errors import PairMismatchError, PublishError, ServerStartError
from ggufdspark.gguffile.reader import GGUFFile
from ggufdspark.hardware import DEFAULTS
from ggufdspark.publish import (human_size, license_from_gguf, llama_cpp_pick, plan_publish, publish, quant_label,
                                repo_names)

# Recognisable, and shaped like a real token (llama.cpp ignores tokens not shaped "hf_" + 34+ alnum).
TOKEN = "hf_GgufdsparkFakeTokenNeverPrintMe0123456789"
WRITE_PATHS = r"/api/repos/create|/preupload/|/commit/|lfs/objects|/_storage/"


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def front_matter(card: str) -> dict:
    m = re.match(r"^---\n(.*?)\n---\n", card, re.DOTALL)
    assert m, card[:200]
    return yaml.safe_load(m.group(1))


@pytest.fixture
def hub():
    with FakeHub(token=TOKEN) as h:
        yield h


@pytest.fixture
def hub_env(hub, tmp_path) -> dict[str, str]:
    """Environment of a CLI run against the fake Hub: its endpoint, the token, an empty HF home."""
    home = tmp_path / "hf-home"
    home.mkdir(exist_ok=True)
    return {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "HUGGING_FACE_HUB_TOKEN": ""}




def run_publish(cli, pair, env, *extra, mmproj=None, repo="org/Tiny-LFM2"):
    args = ["publish", "--target", str(pair.target), "--draft", str(pair.draft), "--repo", repo, *extra]
    if mmproj:
        args += ["--mmproj", str(mmproj)]
    return cli(*args, env=env)


def assert_clean_failure(p) -> None:
    assert p.returncode != 0, p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("ggufdspark: error:")]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr


# -------------------------------------------------------------------------------- what arrives


def test_publish_puts_pair_on_hub_with_cards(ggufdspark_cli, small_pair, mmproj, hub, hub_env):
    p = run_publish(ggufdspark_cli, small_pair, hub_env, "--base-model", "LiquidAI/LFM2.5-VL-3B",
                    "--draft-base-model", "LiquidAI/LFM2.5-VL-3B-DSpark", "--license", "other",
                    mmproj=mmproj)
    assert p.returncode == 0, p.stderr
    t_repo, d_repo = "org/Tiny-LFM2-GGUF", "org/Tiny-LFM2-DSpark-GGUF"

    # files and bytes
    tfiles, dfiles = hub.files(t_repo), hub.files(d_repo)
    assert set(tfiles) == {".gitattributes", "README.md", "Tiny-LFM2-F16.gguf", "mmproj-Tiny-LFM2-F16.gguf"}
    assert set(dfiles) == {".gitattributes", "README.md", "dspark-Tiny-LFM2-F16.gguf"}
    assert tfiles["Tiny-LFM2-F16.gguf"] == small_pair.target.read_bytes()
    assert tfiles["mmproj-Tiny-LFM2-F16.gguf"] == mmproj.read_bytes()
    assert dfiles["dspark-Tiny-LFM2-F16.gguf"] == small_pair.draft.read_bytes()
    # GGUFs went through the LFS batch API (basic transfer) and are stored as LFS objects
    head = hub.repos[t_repo].head
    assert head.files["Tiny-LFM2-F16.gguf"].lfs_oid == sha256(small_pair.target)
    assert hub.repos[d_repo].head.files["dspark-Tiny-LFM2-F16.gguf"].lfs_oid == sha256(small_pair.draft)
    assert len(hub.calls("PUT", r"/_storage/")) == 3
    # one commit per repo, with all its files and the card
    for repo in (t_repo, d_repo):
        assert [c.summary for c in hub.commits(repo)][0] == "initial commit"
        assert len(hub.commits(repo)) == 2
        assert len(hub.calls("POST", rf"/api/models/{repo}/commit/")) == 1

    # the target card
    card = tfiles["README.md"].decode()
    meta = front_matter(card)
    assert meta["base_model"] == "LiquidAI/LFM2.5-VL-3B"
    assert meta["license"] == "other"
    assert {"gguf", "llama.cpp", "speculative-decoding"} <= set(meta["tags"])
    for f in (small_pair.target, mmproj):
        assert sha256(f) in card
    assert "`dspark-Tiny-LFM2-F16.gguf` goes with `Tiny-LFM2-F16.gguf`" in card
    cuda = ("llama-server -hf org/Tiny-LFM2-GGUF:F16 -hfd org/Tiny-LFM2-DSpark-GGUF:F16 "
            f"--spec-type draft-dspark --spec-draft-n-max {DEFAULTS['cuda'].draft_n_max} --spec-draft-n-min 0 "
            "-ngld 99 -ngl 99 -fa on")
    metal = cuda.replace(f"--spec-draft-n-max {DEFAULTS['cuda'].draft_n_max}",
                         f"--spec-draft-n-max {DEFAULTS['metal'].draft_n_max}")
    assert cuda in card and metal in card
    lines = card.splitlines()  # the token table on the GPU: on the CUDA line only, quoted for a shell
    assert cuda + r" -ot 'token_embd\.weight=CUDA0'" in lines and metal in lines
    assert [ln for ln in lines if ln.startswith("On CUDA, `-ot 'token_embd") and "more than one GPU" in ln]
    # the draft card
    dcard = dfiles["README.md"].decode()
    assert front_matter(dcard)["base_model"] == "LiquidAI/LFM2.5-VL-3B-DSpark"
    assert sha256(small_pair.draft) in dcard and sha256(small_pair.target) in dcard
    assert cuda in dcard and metal in dcard

    # the plan came first, with the cards; the result after
    out = p.stdout
    assert out.index("Plan for") < out.index("----- org/Tiny-LFM2-GGUF/README.md -----") < out.index("committed")
    assert sha256(small_pair.draft) in out and card.splitlines()[-1] in out
    assert TOKEN not in out + p.stderr


def test_rerun_uploads_nothing(ggufdspark_cli, small_pair, hub, hub_env):
    first = run_publish(ggufdspark_cli, small_pair, hub_env)
    assert first.returncode == 0, first.stderr
    n_requests = len(hub.requests)
    commits = {r: len(hub.commits(r)) for r in hub.repos}

    again = run_publish(ggufdspark_cli, small_pair, hub_env)
    assert again.returncode == 0, again.stderr
    later = [f"{m} {p}" for m, p, _ in hub.requests[n_requests:]]
    assert not [r for r in later if re.search(WRITE_PATHS, r)], later
    assert {r: len(hub.commits(r)) for r in hub.repos} == commits
    assert re.findall(r"^  (upload|skip)", again.stdout, re.MULTILINE) == ["skip"] * 4
    assert "org/Tiny-LFM2-GGUF: up to date, nothing uploaded" in again.stdout
    assert "org/Tiny-LFM2-DSpark-GGUF: up to date, nothing uploaded" in again.stdout


def tune_report(pair) -> dict:
    """A real ``tune`` report (TuneResult.to_dict) as saved in a profile, with made-up speeds."""
    from ggufdspark.measuring.tune import AcceptanceProfile, Point, TuneResult, recommend

    plain = {1: Point(None, None, 1, 370.0, 373.0, None, 8, 2048), 8: Point(None, None, 8, 906.0, None, None, 64, 16384)}
    points = [Point(6, 0.0, 1, 480.0, 486.0, 4.0, 8, 2048), Point(9, 0.0, 1, 400.0, 409.0, 4.22, 8, 2048),
              Point(6, 0.0, 8, 744.0, None, 4.0, 64, 16384), Point(9, 0.0, 8, 700.0, None, 4.2, 64, 16384)]
    settings = {"backend": "cuda", "engine": "0c1e570 (/home/me/llama-server)",
                "devices": [{"name": "CUDA0", "description": "NVIDIA H200"}]}
    res = TuneResult(settings, AcceptanceProfile("published", (0.78, 0.61), "the published drafter's 4.22"),
                     plain, points, {}, recommend(plain, points))
    return {"hardware": {"key": "cuda-NVIDIA_H200-140GiB", "backend": "cuda"},
            "pair": {"target_sha256": sha256(pair.target), "draft_sha256": sha256(pair.draft)},
            "tool": "ggufdspark tune", **res.to_dict()}


def test_results_change_only_the_cards(ggufdspark_cli, small_pair, hub, hub_env, tmp_path):
    assert run_publish(ggufdspark_cli, small_pair, hub_env).returncode == 0
    puts = len(hub.calls("PUT", r"/_storage/"))
    results = tmp_path / "tune.json"
    results.write_text(json.dumps(tune_report(small_pair)))
    p = run_publish(ggufdspark_cli, small_pair, hub_env, "--results", str(results))
    assert p.returncode == 0, p.stderr
    assert len(hub.calls("PUT", r"/_storage/")) == puts  # no GGUF sent again
    assert re.findall(r"^  (upload|skip) +(\S+)", p.stdout, re.MULTILINE) == [
        ("skip", "Tiny-LFM2-F16.gguf"), ("upload", "README.md"),
        ("skip", "dspark-Tiny-LFM2-F16.gguf"), ("upload", "README.md")]
    card = hub.files("org/Tiny-LFM2-GGUF")["README.md"].decode()
    assert "## Measured\n\n### ggufdspark tune" in card
    assert "Measured on: cuda-NVIDIA_H200-140GiB, llama.cpp 0c1e570." in card and "/home/me" not in card
    assert "| draft length | p_min | parallel requests | tok/s | vs no draft | accept length |" in card
    assert "| none |  | 1 | 373 |  |  |" in card
    assert "| 6 | 0.00 | 1 | 486 | 1.30 | 4.00 |" in card
    assert "Recommended: draft length 6 measured fastest" in card
    assert len(hub.commits("org/Tiny-LFM2-GGUF")) == 3


def test_bench_report_renders(small_pair, tmp_path):
    from ggufdspark.measuring.report import GroupStats

    group = GroupStats("code", 4, 512, 512, 373.0, 486.0, 350.0, 450.0, 4.3, 4.1, 0.37)
    overall = GroupStats("all", 4, 512, 512, 373.0, 486.0, 350.0, 450.0, 4.3, 4.1, 0.37)
    report = {"pair": {"target_sha256": sha256(small_pair.target), "draft_sha256": sha256(small_pair.draft)},
              "settings": {"backend": "metal", "devices": [{"name": "MTL0", "description": "Apple M3 Ultra"}],
                           "engine": "0c1e570 (/Users/me/llama-server)"},
              "synthetic": None, "groups": [group.to_dict()], "overall": overall.to_dict(),
              "load": [{"level": 8, "plain_tps": 906.0, "spec_tps": 744.0, "ratio": 0.82}],
              "gate": {"status": "pass", "reason": ""}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    plan = plan_publish(small_pair.target, small_pair.draft, repo="org/Tiny", results=[path])
    card = plan.repos[0].card
    assert "Measured on: metal, Apple M3 Ultra, llama.cpp 0c1e570." in card
    assert "| code | 4 | 373 | 486 | 1.30 | 4.10 | 0.37 |" in card
    assert "| all | 4 | 373 | 486 | 1.30 | 4.10 | 0.37 |" in card
    assert "| 8 | 906 | 744 | 0.82 |" in card and "Lossless gate: pass." in card
    assert plan.repos[1].card.count("### ggufdspark bench") == 1


def test_results_from_another_pair_are_refused(small_pair, tmp_path):
    results = tmp_path / "bench.json"
    results.write_text(json.dumps({"pair": {"target_sha256": "0" * 64}, "arms": [{"arm": "plain", "tps": 1.0}]}))
    with pytest.raises(PublishError, match="measured on another target"):
        plan_publish(small_pair.target, small_pair.draft, repo="org/Tiny", results=[results])


# -------------------------------------------------------------------------------- refusals


def test_mismatched_pair_is_refused(ggufdspark_cli, small_pair, other_pair, hub, hub_env):
    p = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(other_pair.draft),
                       "--repo", "org/Tiny-LFM2", env=hub_env)
    assert_clean_failure(p)
    assert "does not belong with" in p.stderr
    assert hub.requests == []
    with pytest.raises(PairMismatchError):
        plan_publish(small_pair.target, other_pair.draft, repo="org/Tiny-LFM2")


def test_failed_upload_commits_nothing(ggufdspark_cli, small_pair, hub, hub_env):
    hub.fail_uploads = {sha256(small_pair.draft)}
    p = run_publish(ggufdspark_cli, small_pair, hub_env)
    assert_clean_failure(p)
    assert "upload failed" in p.stderr and "nothing was committed" in p.stderr
    assert TOKEN not in p.stdout + p.stderr
    for repo in ("org/Tiny-LFM2-GGUF", "org/Tiny-LFM2-DSpark-GGUF"):
        assert [c.summary for c in hub.commits(repo)] == ["initial commit"]
        assert set(hub.files(repo)) == {".gitattributes"}
    assert hub.calls("POST", r"/commit/") == []

    # once the store accepts it, a re-run finishes; the target object already stored is not re-sent
    hub.fail_uploads = set()
    target_puts = len(hub.calls("PUT", sha256(small_pair.target)))
    p = run_publish(ggufdspark_cli, small_pair, hub_env)
    assert p.returncode == 0, p.stderr
    assert len(hub.calls("PUT", sha256(small_pair.target))) == target_puts
    assert hub.files("org/Tiny-LFM2-DSpark-GGUF")["dspark-Tiny-LFM2-F16.gguf"] == small_pair.draft.read_bytes()


def test_no_token_is_a_clean_error(ggufdspark_cli, small_pair, hub, hub_env):
    p = run_publish(ggufdspark_cli, small_pair, {**hub_env, "HF_TOKEN": ""})
    assert_clean_failure(p)
    assert "no Hugging Face token" in p.stderr
    assert hub.requests == []


def test_wrong_token_is_a_clean_error(ggufdspark_cli, small_pair, hub, hub_env):
    bad = "hf_AnotherFakeTokenThatTheHubRejects0123456"
    p = run_publish(ggufdspark_cli, small_pair, {**hub_env, "HF_TOKEN": bad})
    assert_clean_failure(p)
    assert bad not in p.stdout + p.stderr and TOKEN not in p.stdout + p.stderr
    assert hub.repos == {}  # the Hub refused to create them


@pytest.mark.parametrize("args, message", [
    (["--repo", "org/bad name"], "not a valid repo id"),
    (["--repo", "org/tiny-mmproj-x"], "contains 'mmproj'"),
    (["--repo", "org/Tiny", "--single-repo", "--draft-repo", "org/D"], "exclude each other"),
])
def test_bad_repo_names_are_refused(ggufdspark_cli, small_pair, hub, hub_env, args, message):
    p = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(small_pair.draft),
                       *args, "--dry-run", env=hub_env)
    assert_clean_failure(p)
    assert message in p.stderr


# -------------------------------------------------------------------------------- dry run, token


def test_dry_run_sends_nothing_and_shows_everything(ggufdspark_cli, small_pair, mmproj, hub, hub_env):
    p = run_publish(ggufdspark_cli, small_pair, {**hub_env, "HF_TOKEN": ""}, "--dry-run", mmproj=mmproj)
    assert p.returncode == 0, p.stderr
    assert hub.requests == []
    out = p.stdout
    for repo in ("org/Tiny-LFM2-GGUF", "org/Tiny-LFM2-DSpark-GGUF"):
        assert f"\n{repo}  (not checked" in out
        assert f"----- {repo}/README.md -----" in out
    for f, name in ((small_pair.target, "Tiny-LFM2-F16.gguf"), (mmproj, "mmproj-Tiny-LFM2-F16.gguf"),
                    (small_pair.draft, "dspark-Tiny-LFM2-F16.gguf")):
        line = next(ln for ln in out.splitlines() if f"  {name} " in ln)
        assert sha256(f) in line and "kB" in line
    assert f"--spec-draft-n-max {DEFAULTS['cuda'].draft_n_max}" in out
    assert f"--spec-draft-n-max {DEFAULTS['metal'].draft_n_max}" in out
    assert "dry run: nothing was sent" in out


def test_token_never_appears_even_in_debug_logs(ggufdspark_cli, small_pair, hub, hub_env):
    p = ggufdspark_cli("--debug", "publish", "--target", str(small_pair.target), "--draft",
                       str(small_pair.draft), "--repo", "org/Tiny-LFM2", env=hub_env)
    assert p.returncode == 0, p.stderr
    assert "committed org/Tiny-LFM2-GGUF" in p.stdout
    assert TOKEN not in p.stdout and TOKEN not in p.stderr
    assert TOKEN[3:] not in p.stdout + p.stderr


def test_json_output(ggufdspark_cli, small_pair, hub, hub_env):
    p = run_publish(ggufdspark_cli, small_pair, hub_env, "--json", "--single-repo")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    (rp,) = data["plan"]["repos"]
    assert rp["repo_id"] == "org/Tiny-LFM2-GGUF"
    assert [f["path_in_repo"] for f in rp["files"]] == ["Tiny-LFM2-F16.gguf", "dspark-Tiny-LFM2-F16.gguf", "README.md"]
    assert data["commits"]["org/Tiny-LFM2-GGUF"].startswith(hub.url)
    assert set(hub.files("org/Tiny-LFM2-GGUF")) == {".gitattributes", "README.md", "Tiny-LFM2-F16.gguf",
                                                     "dspark-Tiny-LFM2-F16.gguf"}


# -------------------------------------------------------------------------------- library level


# huggingface_hub 2.4 hands raw bytes to httpx2 as data=, which httpx2 deprecates: not ours
HTTPX_DATA_WARNING = "ignore:Use 'content=<...>':DeprecationWarning"


@pytest.mark.filterwarnings(HTTPX_DATA_WARNING)
def test_library_publish_private_repo(small_pair, hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    seen = []
    result = publish(small_pair.target, small_pair.draft, repo="org/Priv", private=True, endpoint=hub.url,
                     token=TOKEN, on_plan=lambda plan: seen.append([f.action for rp in plan.repos for f in rp.files]))
    assert seen == [["upload"] * 4]  # the plan was handed over before the upload
    assert hub.repos["org/Priv-GGUF"].private and hub.repos["org/Priv-DSpark-GGUF"].private
    assert all(url for url in result.commits.values())


def test_quant_labels():
    def label(ft):
        return quant_label(GGUFFile(Path("x.gguf"), 3, {"general.file_type": ft}, {}))

    assert [label(ft) for ft in (0, 1, 7, 32)] == ["F32", "F16", "Q8_0", "BF16"]
    with pytest.raises(PublishError, match="unknown general.file_type 999"):
        label(999)


def test_license_is_copied_from_the_gguf():
    g = GGUFFile(Path("t.gguf"), 3, {"general.license": "other", "general.license.name": "lfm1.0",
                                     "general.license.link": "LICENSE"}, {})
    assert license_from_gguf(g) == {"license": "other", "license_name": "lfm1.0", "license_link": "LICENSE"}
    assert license_from_gguf(GGUFFile(Path("t.gguf"), 3, {}, {})) == {}


def test_repo_names():
    assert repo_names("org/M") == ("M", "org/M-GGUF", "org/M-DSpark-GGUF")
    assert repo_names("org/M-GGUF") == ("M", "org/M-GGUF", "org/M-DSpark-GGUF")
    assert repo_names("org/M", single_repo=True) == ("M", "org/M-GGUF", "org/M-GGUF")
    assert repo_names("org/M", draft_repo="me/D") == ("M", "org/M-GGUF", "me/D")


def test_names_against_llama_cpp_rules():
    """Cases from tests/test-model-resolution.cpp of the pinned tree, plus our layouts."""
    flat = ["README.md", "model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-BF16.gguf",
            "mmproj-model-Q8_0.gguf", "mtp-model-BF16.gguf", "dflash-model-BF16.gguf"]
    assert llama_cpp_pick(flat, "Q8_0") == "model-Q8_0.gguf"
    assert llama_cpp_pick(flat, "", "mmproj", model="model-Q8_0.gguf") == "mmproj-model-Q8_0.gguf"
    spark = ["README.md", "model-MXFP4.gguf", "dspark-model-BF16.gguf", "dspark-model-MXFP4.gguf"]
    assert llama_cpp_pick(spark, "BF16") is None
    assert llama_cpp_pick(spark, "BF16", "dspark-") == "dspark-model-BF16.gguf"
    ours = ["README.md", "N-F16.gguf", "mmproj-N-F16.gguf", "dspark-N-F16.gguf"]
    assert llama_cpp_pick(ours, "F16") == "N-F16.gguf"
    assert llama_cpp_pick(ours, "", "mmproj", model="N-F16.gguf") == "mmproj-N-F16.gguf"
    assert llama_cpp_pick(ours, "F16", "dspark-") == "dspark-N-F16.gguf"
    # "F16[.-]" also matches inside "BF16.": a BF16 file listed first wins -hf REPO:F16
    assert llama_cpp_pick(["N-BF16.gguf", "N-F16.gguf"], "F16") == "N-BF16.gguf"


@pytest.mark.filterwarnings(HTTPX_DATA_WARNING)
def test_plan_warns_when_llama_cpp_would_pick_another_file(small_pair, hub, monkeypatch):
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    api = HfApi(endpoint=hub.url, token=TOKEN)
    api.create_repo("org/Tiny-GGUF")
    api.create_commit("org/Tiny-GGUF", [CommitOperationAdd("Tiny-BF16.gguf", small_pair.target.read_bytes())],
                      commit_message="an older BF16 upload")
    plans = []
    publish(small_pair.target, small_pair.draft, repo="org/Tiny", endpoint=hub.url, token=TOKEN,
            on_plan=plans.append)
    (warning,) = plans[0].repos[0].warnings
    assert "-hf org/Tiny-GGUF:F16 would take Tiny-BF16.gguf as the target" in warning


# -------------------------------------------------------------------------------- the real engine


@pytest.mark.parametrize("layout", [[], ["--single-repo"]], ids=["two-repos", "single-repo"])
def test_llama_server_resolves_and_downloads_published_pair(ggufdspark_cli, small_pair, mmproj, hub, hub_env,
                                                            start_server, monkeypatch, tmp_path, layout):
    """The real llama-server (built without libcurl/OpenSSL: cpp-httplib, http only) pointed at the
    fake Hub with HF_ENDPOINT finds the published files by -hf REPO:F16 / -hfd REPO:F16 and drafts."""
    p = run_publish(ggufdspark_cli, small_pair, hub_env, *layout, mmproj=mmproj)
    assert p.returncode == 0, p.stderr
    t_repo = "org/Tiny-LFM2-GGUF"
    d_repo = t_repo if layout else "org/Tiny-LFM2-DSpark-GGUF"
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)

    def downloaded(repo: str) -> dict[str, Path]:
        snaps = cache / f"models--{repo.replace('/', '--')}" / "snapshots"
        return {f.name: f for f in snaps.glob("*/*.gguf")}

    # -hf also resolves and downloads the mmproj; this one is header-only, so the server stops there
    with pytest.raises(ServerStartError) as err:
        start_server(hf_repo=f"{t_repo}:F16", hf_draft=f"{d_repo}:F16", ctx_size=512)
    log = Path(re.search(r"log: (\S+)", str(err.value)).group(1)).read_text()
    assert re.search(r"failed to load multimodal model.*mmproj-Tiny-LFM2-F16\.gguf", log), log[-3000:]
    got = downloaded(t_repo)
    assert sha256(got["mmproj-Tiny-LFM2-F16.gguf"]) == sha256(mmproj)

    srv = start_server(hf_repo=f"{t_repo}:F16", hf_draft=f"{d_repo}:F16", ctx_size=512, draft_n_max=6,
                       extra_args=["--no-mmproj"])
    got = downloaded(t_repo) | downloaded(d_repo)
    assert sha256(got["Tiny-LFM2-F16.gguf"]) == sha256(small_pair.target)
    assert sha256(got["dspark-Tiny-LFM2-F16.gguf"]) == sha256(small_pair.draft)
    srv.wait_for_log(r"dspark-Tiny-LFM2-F16\.gguf")  # logged by the engine's logger thread: may lag /health
    log = srv.log_text()
    assert "dspark-Tiny-LFM2-F16.gguf" in log and "draft-dspark" in log
    out = srv.client().complete("The model draft target", n_predict=32)
    assert out.timings.draft_n and out.timings.draft_n > 0, out.raw.get("timings")


# -------------------------------------------------------------------------------- several quants (issue 15)


def run_quants(cli, env, targets, drafts, *extra, repo="org/Tiny-LFM2"):
    args = ["publish", "--repo", repo, *extra]
    for t in targets:
        args += ["--target", str(t)]
    for d in drafts:
        args += ["--draft", str(d)]
    return cli(*args, env=env)


def test_dry_run_json_shows_the_plan_for_several_quants(ggufdspark_cli, quant_pair, mmproj, hub, hub_env):
    targets = [quant_pair["target-Q8_0"], quant_pair["target-Q4_K_M"]]
    p = run_quants(ggufdspark_cli, {**hub_env, "HF_TOKEN": ""}, targets, [quant_pair["draft-Q8_0"]],
                   "--mmproj", str(mmproj), "--dry-run", "--json")
    assert p.returncode == 0, p.stderr
    assert hub.requests == []
    plan = json.loads(p.stdout)["plan"]
    t_repo, d_repo = plan["repos"]
    assert [f["path_in_repo"] for f in t_repo["files"]] == [
        "Tiny-LFM2-Q8_0.gguf", "Tiny-LFM2-Q4_K_M.gguf", "mmproj-Tiny-LFM2-F16.gguf", "README.md"]
    assert [f["path_in_repo"] for f in d_repo["files"]] == ["dspark-Tiny-LFM2-Q8_0.gguf", "README.md"]
    assert plan["pairing"] == {"Q8_0": "Q8_0", "Q4_K_M": "Q8_0"}
    cmds = plan["quant_commands"]
    assert cmds["Q4_K_M"]["cuda"].startswith(
        "llama-server -hf org/Tiny-LFM2-GGUF:Q4_K_M -hfd org/Tiny-LFM2-DSpark-GGUF:Q8_0 --spec-type draft-dspark")
    assert cmds["Q8_0"]["serve"] == "ggufdspark serve --hf org/Tiny-LFM2-GGUF:Q8_0 --hfd org/Tiny-LFM2-DSpark-GGUF:Q8_0"
    assert t_repo["warnings"] == [] and d_repo["warnings"] == []
    card = t_repo["card"]
    for rp in (t_repo, d_repo):  # each card lists its repo's files, with size and sha256
        for f in rp["files"][:-1]:
            line = next(ln for ln in rp["card"].splitlines() if ln.startswith(f"| `{f['path_in_repo']}` |"))
            assert f"| {human_size(f['size'])} | `{f['sha256']}` |" in line
    for f in t_repo["files"][:2]:  # the draft card names the targets its draft goes with
        assert f"(sha256 `{f['sha256']}`)" in d_repo["card"]
    assert "### Q8_0 (draft Q8_0)" in card and "### Q4_K_M (draft Q8_0)" in card
    assert cmds["Q4_K_M"]["metal"] in card and cmds["Q4_K_M"]["serve"] in card
    assert "`-hfd org/Tiny-LFM2-DSpark-GGUF` without a quant also takes `dspark-Tiny-LFM2-Q8_0.gguf`" in card


def test_short_options_name_targets_and_drafts(ggufdspark_cli, quant_pair, small_pair, hub, hub_env):
    """``-m`` / ``-md`` (llama-server's spelling) repeat and mix with ``--target`` / ``--draft``."""
    p = ggufdspark_cli("publish", "-m", str(quant_pair["target-Q8_0"]), "--target", str(small_pair.target),
                       "-md", str(quant_pair["draft-Q8_0"]), "--draft", str(small_pair.draft),
                       "--repo", "org/Tiny-LFM2", "--dry-run", "--json", env={**hub_env, "HF_TOKEN": ""})
    assert p.returncode == 0, p.stderr
    assert hub.requests == []
    t_repo, d_repo = json.loads(p.stdout)["plan"]["repos"]
    assert [f["path_in_repo"] for f in t_repo["files"]] == ["Tiny-LFM2-Q8_0.gguf", "Tiny-LFM2-F16.gguf", "README.md"]
    assert [f["path_in_repo"] for f in d_repo["files"]] == [
        "dspark-Tiny-LFM2-Q8_0.gguf", "dspark-Tiny-LFM2-F16.gguf", "README.md"]


def test_several_quants_one_commit_per_repo_and_reruns_send_only_what_changed(
        ggufdspark_cli, quant_pair, small_pair, hub, hub_env, tmp_path):
    from ggufdspark.quantize import quantize

    t_repo, d_repo = "org/Tiny-LFM2-GGUF", "org/Tiny-LFM2-DSpark-GGUF"
    targets = [quant_pair["target-Q8_0"], quant_pair["target-Q4_K_M"]]
    drafts = [quant_pair["draft-Q8_0"], small_pair.draft]
    p = run_quants(ggufdspark_cli, hub_env, targets, drafts, "--pair", "q4_k_m=Q8_0")
    assert p.returncode == 0, p.stderr
    assert set(hub.files(t_repo)) == {".gitattributes", "README.md", "Tiny-LFM2-Q8_0.gguf", "Tiny-LFM2-Q4_K_M.gguf"}
    assert set(hub.files(d_repo)) == {".gitattributes", "README.md", "dspark-Tiny-LFM2-Q8_0.gguf",
                                      "dspark-Tiny-LFM2-F16.gguf"}
    for repo in (t_repo, d_repo):
        assert len(hub.calls("POST", rf"/api/models/{repo}/commit/")) == 1
    assert hub.files(t_repo)["Tiny-LFM2-Q4_K_M.gguf"] == quant_pair["target-Q4_K_M"].read_bytes()
    card = hub.files(t_repo)["README.md"].decode()
    # Q8_0 target -> the F16 draft (the H200 table's pairing, quants.RECOMMENDED_DRAFT); Q4_K_M -> Q8_0 (--pair)
    assert "-hf org/Tiny-LFM2-GGUF:Q4_K_M -hfd org/Tiny-LFM2-DSpark-GGUF:Q8_0" in card
    assert "-hf org/Tiny-LFM2-GGUF:Q8_0 -hfd org/Tiny-LFM2-DSpark-GGUF:F16" in card
    assert "without one, llama.cpp takes `dspark-Tiny-LFM2-Q8_0.gguf`" in card

    # the same again: nothing written
    n = len(hub.requests)
    p = run_quants(ggufdspark_cli, hub_env, targets, drafts, "--pair", "Q4_K_M=Q8_0")
    assert p.returncode == 0, p.stderr
    assert not [r for r in hub.requests[n:] if re.search(WRITE_PATHS, f"{r[0]} {r[1]}")]
    assert f"{t_repo}: up to date, nothing uploaded" in p.stdout

    # one more quant: only it and the target card are sent, in one commit; the draft repo's card
    # changes too (it lists the commands per quant)
    q5 = quantize(small_pair.target, "Q5_K_M", output=tmp_path / "tiny-lfm2-Q5_K_M.gguf").path
    puts = len(hub.calls("PUT", r"/_storage/"))
    p = run_quants(ggufdspark_cli, hub_env, targets + [q5], drafts, "--pair", "Q4_K_M=Q8_0")
    assert p.returncode == 0, p.stderr
    assert re.findall(r"^  (upload|skip) +(\S+)", p.stdout, re.MULTILINE) == [
        ("skip", "Tiny-LFM2-Q8_0.gguf"), ("skip", "Tiny-LFM2-Q4_K_M.gguf"), ("upload", "Tiny-LFM2-Q5_K_M.gguf"),
        ("upload", "README.md"), ("skip", "dspark-Tiny-LFM2-Q8_0.gguf"), ("skip", "dspark-Tiny-LFM2-F16.gguf"),
        ("upload", "README.md")]
    assert len(hub.calls("PUT", r"/_storage/")) == puts + 1
    assert len(hub.calls("POST", rf"/api/models/{t_repo}/commit/")) == 2
    # Q5_K_M has no draft of its own quant: the draft with the most bits (F16)
    assert "-hf org/Tiny-LFM2-GGUF:Q5_K_M -hfd org/Tiny-LFM2-DSpark-GGUF:F16" in hub.files(t_repo)["README.md"].decode()


def test_several_quants_refusals(ggufdspark_cli, quant_pair, small_pair, other_pair, hub, hub_env):
    t8, t4, d8 = quant_pair["target-Q8_0"], quant_pair["target-Q4_K_M"], quant_pair["draft-Q8_0"]
    p = run_quants(ggufdspark_cli, hub_env, [t8, t8], [d8], "--dry-run")
    assert_clean_failure(p)
    assert "a second Q8_0 target" in p.stderr and str(t8) in p.stderr
    p = run_quants(ggufdspark_cli, hub_env, [t8, t4], [d8], "--pair", "Q6_K=Q8_0", "--dry-run")
    assert_clean_failure(p)
    assert "--pair Q6_K=Q8_0: no Q6_K target among Q8_0, Q4_K_M" in p.stderr
    p = run_quants(ggufdspark_cli, hub_env, [t8], [d8], "--pair", "Q8_0", "--dry-run")
    assert p.returncode == 2 and "TQUANT=DQUANT" in p.stderr and "Traceback" not in p.stderr
    # a draft of another model among several is refused, even when no target is paired with it
    p = run_quants(ggufdspark_cli, hub_env, [t8], [d8, other_pair.draft], "--pair", "Q8_0=Q8_0", "--dry-run")
    assert_clean_failure(p)
    assert "does not belong with" in p.stderr
    assert hub.requests == []


@pytest.mark.parametrize("tagged", [False, True], ids=["hfd-untagged", "hfd-tagged"])
def test_llama_server_resolves_each_published_quant(ggufdspark_cli, quant_pair, hub, hub_env, start_server,
                                                    monkeypatch, tmp_path, tagged):
    """``llama-server -hf ORG/NAME-GGUF:QUANT -hfd ORG/NAME-DSpark-GGUF[:Q8_0]`` (the real engine, the
    fake Hub) downloads that quant and the Q8_0 draft, and drafts with them, for two quants."""
    from ggufdspark.hardware import engine_workarounds

    p = run_quants(ggufdspark_cli, hub_env, [quant_pair["target-Q8_0"], quant_pair["target-Q4_K_M"]],
                   [quant_pair["draft-Q8_0"]])
    assert p.returncode == 0, p.stderr
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("MODEL_ENDPOINT", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    workaround = engine_workarounds("cpu", 1, quantized=True)  # --no-repack on AMX CPUs (hardware.py)
    for quant in ("Q8_0", "Q4_K_M"):
        cache = tmp_path / f"llama-cache-{quant}"
        monkeypatch.setenv("LLAMA_CACHE", str(cache))
        hfd = "org/Tiny-LFM2-DSpark-GGUF" + (":Q8_0" if tagged else "")
        srv = start_server(hf_repo=f"org/Tiny-LFM2-GGUF:{quant}", hf_draft=hfd, ctx_size=512, draft_n_max=3,
                           extra_args=workaround)
        got = {f.name: f for f in cache.glob("models--*/snapshots/*/*.gguf")}
        assert set(got) == {f"Tiny-LFM2-{quant}.gguf", "dspark-Tiny-LFM2-Q8_0.gguf"}, set(got)
        assert sha256(got[f"Tiny-LFM2-{quant}.gguf"]) == sha256(quant_pair[f"target-{quant}"])
        assert sha256(got["dspark-Tiny-LFM2-Q8_0.gguf"]) == sha256(quant_pair["draft-Q8_0"])
        out = srv.client().complete("The model draft target", n_predict=32)
        assert out.timings.draft_n and out.timings.draft_n > 0, out.raw.get("timings")
        srv.stop()


def test_default_pairing(monkeypatch):
    from ggufdspark import publish as pub

    # the H200 table's recommendation (docs/quantize.md), where the draft is among the files
    assert pub.default_pairing(["F16", "Q8_0", "Q4_K_M"], ["F16", "Q8_0"]) == \
        {"F16": "Q8_0", "Q8_0": "F16", "Q4_K_M": "Q8_0"}
    assert pub.default_pairing(["Q8_0", "Q4_K_M"], ["Q8_0"]) == {"Q8_0": "Q8_0", "Q4_K_M": "Q8_0"}
    assert pub.default_pairing(["Q4_K_M"], ["F16", "Q8_0"], {"q4_k_m": "f16"}) == {"Q4_K_M": "F16"}
    # a quant the table does not cover: the draft of its own quant, else the one with the most bits
    assert pub.default_pairing(["Q6_K", "Q5_K_M"], ["Q6_K", "Q8_0"]) == {"Q6_K": "Q6_K", "Q5_K_M": "Q8_0"}
    monkeypatch.setattr(pub.plan, "RECOMMENDED_DRAFT", {})
    assert pub.default_pairing(["Q8_0", "Q4_K_M"], ["F16", "Q8_0"]) == {"Q8_0": "Q8_0", "Q4_K_M": "F16"}
