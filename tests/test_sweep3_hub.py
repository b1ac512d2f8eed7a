"""Issue 64, rows 1, 3, 4, 16 and 17: Hub references against a hostile or odd Hub.

The Hub is tests/fakehub.py on 127.0.0.1, made to serve what a hostile mirror (``HF_ENDPOINT``)
would: file names that are absolute paths or climb out with ``..``, a commit id that is a path, a
newline in a file name, 20 000 quant tags. The CLI runs in a fresh interpreter (what a user sees);
the files read are the small generated pair's real GGUFs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fakehub import FakeHub, StoredFile

REPO = Path(__file__).resolve().parent.parent
TOKEN = "hf_Sweep3HubFakeTokenNeverPrintMe0123456789"
EVIL = "org/Evil-GGUF"
GOOD = "org/Tiny-LFM2-GGUF"
NAME = "Tiny-LFM2-Q8_0.gguf"


@pytest.fixture
def hub():
    with FakeHub(token=TOKEN) as h:
        yield h


@pytest.fixture
def hub_env(hub, isolated, tmp_path, monkeypatch) -> dict[str, str]:
    """A run against the fake Hub: its endpoint, the token, an empty HF home, the built engine."""
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "MODEL_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    return {**isolated, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HUGGING_FACE_HUB_TOKEN": ""}


def cli(env: dict, *args: str, cwd: Path = REPO, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """``ggufdspark ARGS`` in a fresh interpreter, from ``cwd`` (``prefix``: a command to run it under)."""
    full = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    return subprocess.run([*(prefix or []), sys.executable, "-m", "ggufdspark", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def put_repo(hub: FakeHub, repo: str, files: dict[str, bytes | Path], oid: str | None = None):
    """A repo on the fake Hub listing exactly ``files`` (any names: the fake Hub's commit API would
    refuse the hostile ones, a hostile mirror just lists them), at commit ``oid`` if given."""
    r = hub.create_repo(repo)
    for name, data in files.items():
        data = Path(data).read_bytes() if isinstance(data, Path) else data
        r.head.files[name] = StoredFile(name, len(data), data=data)
    if oid is not None:
        r.head.oid = oid
    return r


def cache_dir(env: dict, repo: str) -> Path:
    return Path(env["HF_HOME"]) / "hub" / ("models--" + repo.replace("/", "--"))


def one_error_line(p: subprocess.CompletedProcess, *secrets: str) -> str:
    """The single ``ggufdspark: error:`` line of a failed run (no traceback, no secret anywhere)."""
    assert p.returncode != 0, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("ggufdspark: error:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for s in (TOKEN, TOKEN[3:], *secrets):
        assert s not in p.stdout + p.stderr, (s, p.stdout + p.stderr)
    return lines[0]


# ----------------------------------------------------------------------------- row 1: paths from the Hub


def test_absolute_file_name_in_a_listing_is_refused(hub, hub_env, small_pair, tmp_path):
    """A listing naming ``/abs/dir/X-Q8_0.gguf`` made ``inspect`` read that local file (pathlib's
    ``snapshot / "/abs"`` is ``/abs``); now the listing is refused before any path is built."""
    planted = tmp_path / "elsewhere" / NAME
    planted.parent.mkdir()
    shutil.copy(small_pair.target, planted)
    put_repo(hub, EVIL, {str(planted): b"GGUF"})
    p = cli(hub_env, "inspect", f"{EVIL}:Q8_0", "--json")
    line = one_error_line(p)
    assert f"{EVIL}: the Hub at {hub.url} listed '{planted}'" in line and "an absolute path" in line, line
    assert json.loads(p.stdout)["ok"] is False, p.stdout
    assert not (cache_dir(hub_env, EVIL) / "refs").exists()  # no refs/main recorded for it


def test_dotdot_file_name_in_a_listing_is_refused(hub, hub_env, small_pair):
    """``..`` names climbed out of a snapshot folder that existed (an earlier download); ``check``
    took the file they named as the target. Now refused, and nothing is read."""
    r = put_repo(hub, EVIL, {f"../../../../elsewhere/{NAME}": b"GGUF"})
    snap = cache_dir(hub_env, EVIL) / "snapshots" / r.head.oid
    snap.mkdir(parents=True)
    planted = Path(hub_env["HF_HOME"]) / "elsewhere" / NAME
    planted.parent.mkdir()
    shutil.copy(small_pair.target, planted)
    assert (snap / f"../../../../elsewhere/{NAME}").is_file()  # the path the listing names, as built
    p = cli(hub_env, "check", "-m", f"{EVIL}:Q8_0", "-md", str(small_pair.draft))
    line = one_error_line(p)
    assert f"listed '../../../../elsewhere/{NAME}'" in line and "a '..' segment" in line, line
    assert "pair OK" not in p.stdout


@pytest.mark.parametrize("name, reason", [
    ("a\\..\\" + NAME, "a backslash"),
    ("dir//" + NAME, "an empty segment"),
    ("./" + NAME, "a '.' segment"),
    ("dir/", "an empty segment"),
    ("", "an empty name"),
    ("C:" + NAME, "a drive"),
])
def test_other_unsafe_names_are_refused(hub, hub_env, monkeypatch, name, reason):
    """Every other name that is not a plain relative path: the repo's listing refused, one line."""
    from ggufdspark import hubref
    from ggufdspark.errors import HubError

    for k, v in hub_env.items():
        monkeypatch.setenv(k, v)
    put_repo(hub, EVIL, {name: b"GGUF", NAME: b"GGUF"})
    with pytest.raises(HubError) as e:
        hubref.resolve(f"{EVIL}:Q8_0", "any")
    assert reason in str(e.value) and "\n" not in str(e.value), e.value
    assert not hub.calls("GET", r"/resolve/"), hub.requests  # nothing was downloaded


def test_commit_id_that_is_a_path_is_refused_online(hub, hub_env, small_pair):
    """A commit id ``../../planted`` was joined onto ``snapshots/`` (the file there used) and
    written to ``refs/main``; now anything but 40 hex digits is refused and nothing is written."""
    put_repo(hub, EVIL, {NAME: b"GGUF"}, oid="../../planted")
    (cache_dir(hub_env, EVIL) / "snapshots").mkdir(parents=True)  # an earlier download made it
    planted = Path(hub_env["HF_HOME"]) / "hub" / "planted" / NAME
    planted.parent.mkdir(parents=True)
    shutil.copy(small_pair.target, planted)
    p = cli(hub_env, "inspect", f"{EVIL}:Q8_0")
    line = one_error_line(p)
    assert "gave '../../planted' as the commit of main" in line and "not a commit id (40 hex digits)" in line, line
    assert not (cache_dir(hub_env, EVIL) / "refs" / "main").exists()


@pytest.mark.parametrize("mode", ["offline", "unreachable"])
@pytest.mark.parametrize("form", ["relative", "absolute"])
def test_planted_refs_main_is_refused_from_the_cache(hub_env, small_pair, tmp_path, mode, form):
    """``refs/main`` holding a path (planted, or written by an earlier hostile listing) made every
    offline run (and every run that fell back to the cache) read that folder as the snapshot."""
    planted = (Path(hub_env["HF_HOME"]) / "hub" / "planted") if form == "relative" else tmp_path / "planted"
    planted.mkdir(parents=True)
    shutil.copy(small_pair.target, planted / NAME)
    ref = cache_dir(hub_env, EVIL) / "refs" / "main"
    ref.parent.mkdir(parents=True)
    (cache_dir(hub_env, EVIL) / "snapshots").mkdir()
    value = "../../planted" if form == "relative" else str(planted)
    ref.write_text(value)
    assert (cache_dir(hub_env, EVIL) / "snapshots" / value / NAME).is_file()  # what the old code read
    env = {**hub_env, "HF_HUB_OFFLINE": "1"} if mode == "offline" else {**hub_env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    p = cli(env, "check", "-m", f"{EVIL}:Q8_0", "-md", str(small_pair.draft))
    line = one_error_line(p)
    assert f"{ref} holds '{value}', not a commit id (40 hex digits)" in line, line
    assert "pair OK" not in p.stdout


# ----------------------------------------------------------------------------- row 3: a read-only cache


def readonly_prefix(folder: Path) -> list[str]:
    """A command prefix that runs the rest with ``folder`` bind-mounted read-only over itself, in a
    mount namespace of its own (``unshare --map-root-user --mount``).

    Why this way: the tests run as root, and root writes through ``chmod a-w`` (CAP_DAC_OVERRIDE),
    so a mode bit proves nothing; ``chattr +i`` needs an ext-like file system and leaves a file
    nobody else can delete if the test dies. A read-only mount is what a shared cluster cache is,
    gives the same ``EROFS`` (Read-only file system) as there, works for root and for a user alike,
    and vanishes with the process. The prefix is checked to really refuse a write first."""
    script = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"'
    prefix = ["unshare", "--map-root-user", "--mount", "sh", "-c", script, str(folder)]
    probe = subprocess.run([*prefix, "sh", "-c", f'touch "{folder}/probe"'], capture_output=True, text=True)
    if probe.returncode == 0 or "Read-only file system" not in probe.stderr:
        pytest.fail(f"cannot make {folder} read-only with {' '.join(prefix[:3])} (rc {probe.returncode}: "
                    f"{probe.stderr.strip()}): this test needs user and mount namespaces (unshare)")
    return prefix


def test_readonly_cache_with_the_hub_reachable(hub, hub_env, small_pair):
    """A pre-filled cache on a read-only file system, the Hub reachable: the files there are used.
    Writing ``refs/main`` failed with ``Read-only file system`` and every reference failed; now it
    is written only when it changes, and a failed write is a warning."""
    put_repo(hub, GOOD, {NAME: small_pair.target, f"dspark-{NAME}": small_pair.draft})
    p = cli(hub_env, "check", "-hf", f"{GOOD}:Q8_0")  # fills the cache (target and its dspark- draft)
    assert p.returncode == 0 and "pair OK" in p.stdout, p.stderr
    cache = Path(hub_env["HF_HOME"]) / "hub"
    ro = readonly_prefix(cache)
    p = cli(hub_env, "check", "-hf", f"{GOOD}:Q8_0", prefix=ro)
    assert p.returncode == 0 and "pair OK" in p.stdout, p.stderr
    assert "WARNING" not in p.stderr, p.stderr  # refs/main already says this commit: nothing to write
    # refs/main missing (a cache filled by downloads at a commit): it cannot be recorded, the files still serve
    (cache_dir(hub_env, GOOD) / "refs" / "main").unlink()
    p = cli(hub_env, "inspect", f"{GOOD}:Q8_0", prefix=ro)
    assert p.returncode == 0 and "kind" in p.stdout, p.stderr
    assert "WARNING: cannot record" in p.stderr and "Read-only file system" in p.stderr, p.stderr
    assert not list(cache_dir(hub_env, GOOD).rglob("*.tmp"))


# ----------------------------------------------------------------------------- row 4: a mistyped path


@pytest.mark.parametrize("verb", ["inspect", "check", "serve"])
def test_a_mistyped_local_path_is_not_sent_to_the_hub(hub, hub_env, small_pair, tmp_path, verb):
    """``-m models/llm-q8`` (``.gguf`` forgotten) went to the Hub as repo ``models/llm-q8`` with the
    user's token, and the error never said "no such file". ``models/`` is a local folder, so it is
    a path: nothing is sent, and the line names the file, why it is not a Hub repo, and the .gguf."""
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    shutil.copy(small_pair.target, work / "models" / "llm-q8.gguf")
    args = {"inspect": ["inspect", "models/llm-q8"],
            "check": ["check", "-m", "models/llm-q8", "-md", str(small_pair.draft)],
            "serve": ["serve", "-m", "models/llm-q8", "-md", str(small_pair.draft), "--dry-run"]}[verb]
    p = cli(hub_env, *args, cwd=work)
    line = one_error_line(p)
    assert p.returncode == 4, p.stderr
    assert "models/llm-q8: no such file" in line and "models/ is a local folder" in line \
        and "not read as a Hub repo" in line and "did you mean models/llm-q8.gguf?" in line, line
    assert hub.requests == [], hub.requests  # no request, so no token, reached the Hub


def test_convert_takes_a_mistyped_checkpoint_path_as_a_path(hub, hub_env, small_pair, tmp_path):
    """``convert`` reads a checkpoint directory or a Hub repo id: the same rule, nothing sent."""
    work = tmp_path / "work"
    (work / "ckpts").mkdir(parents=True)
    p = cli(hub_env, "convert", "ckpts/drafter", "--target", str(small_pair.target), cwd=work)
    line = one_error_line(p)
    assert "ckpts/drafter: no such file or directory (ckpts/ is a local folder, so it is not read as a Hub repo)" \
        in line, line
    assert hub.requests == [], hub.requests


def test_a_reference_that_is_neither_says_both(hub, hub_env, tmp_path):
    """``ORG/NAME`` whose ORG is no local folder is a Hub reference; when the Hub has no such repo
    the line says there is no local file of that name either."""
    work = tmp_path / "work"
    work.mkdir()
    p = cli(hub_env, "inspect", "models/llm-q8", cwd=work)
    line = one_error_line(p)
    assert p.returncode == 4, p.stderr
    assert f"models/llm-q8: no such model repo on {hub.url}, and no local file models/llm-q8" in line, line


# ----------------------------------------------------------------------------- row 16: userinfo in HF_ENDPOINT

SECRET = "S3cretMirrorPassw0rd"


def with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://mirror-user:{SECRET}@")


def test_doctor_strips_userinfo_from_the_endpoint(hub_env, hub):
    env = {**hub_env, "HF_ENDPOINT": with_userinfo(hub.url)}
    p = cli(env, "doctor")
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("hub:")]
    assert f"from {hub.url};" in line, line
    assert SECRET not in p.stdout + p.stderr and "mirror-user" not in p.stdout + p.stderr
    p = cli(env, "doctor", "--json")
    assert f"from {hub.url};" in json.loads(p.stdout)["hub"], p.stdout
    assert SECRET not in p.stdout + p.stderr and "mirror-user" not in p.stdout + p.stderr


@pytest.mark.parametrize("case", ["no such repo", "unreachable", "debug log"])
def test_hub_errors_strip_userinfo(hub_env, hub, case):
    env = {**hub_env, "HF_ENDPOINT": with_userinfo(hub.url)}
    if case == "unreachable":
        env["HF_ENDPOINT"] = with_userinfo("http://127.0.0.1:9")
    args = ["--debug"] if case == "debug log" else []
    p = cli(env, *args, "inspect", "org/Nope-GGUF:Q8_0")
    assert p.returncode != 0
    assert SECRET not in p.stdout + p.stderr and "mirror-user" not in p.stdout + p.stderr, p.stderr
    if case != "debug log":  # --debug shows the traceback by design
        line = one_error_line(p)
        assert ("http://127.0.0.1:9" if case == "unreachable" else hub.url) in line, line


def test_publish_plan_and_json_strip_userinfo(hub_env, small_pair):
    with FakeHub(token=None) as open_hub:  # a mirror that takes the credentials in its URL
        env = {**hub_env, "HF_ENDPOINT": with_userinfo(open_hub.url)}
        base = ["publish", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--repo", "org/Tiny-LFM2"]
        for extra in (["--dry-run"], ["--dry-run", "--json"], [], ["--json"]):
            p = cli(env, *base, *extra)
            assert p.returncode == 0, p.stderr
            assert SECRET not in p.stdout + p.stderr and "mirror-user" not in p.stdout + p.stderr, (extra, p.stdout)
            if "--json" in extra:
                assert json.loads(p.stdout)["plan"]["endpoint"] == open_hub.url
            else:
                assert f" {open_hub.url}" in p.stdout.splitlines()[0], p.stdout[:300]
        assert open_hub.files("org/Tiny-LFM2-GGUF")  # the publish did reach the mirror


# ----------------------------------------------------------------------------- row 17: Hub text in messages


def test_a_newline_in_a_file_name_cannot_forge_a_line(hub, hub_env):
    forged = "x\nggufdspark: error: forged by the Hub.gguf"
    put_repo(hub, EVIL, {forged: b"GGUF"})
    p = cli(hub_env, "inspect", f"{EVIL}:Q4_K_M")
    line = one_error_line(p)  # exactly one error line
    assert "forged by the Hub" in line and "\\n" in line, line


@pytest.mark.parametrize("listing", ["20000 quants", "long names"])
def test_hub_listings_in_messages_are_bounded(hub, hub_env, listing):
    if listing == "20000 quants":
        names = {f"m-Q{i}_K.gguf": b"" for i in range(20000)}
    else:  # no quant tag: the names themselves are listed
        names = {f"{c * 5000}.gguf": b"" for c in "abcdefghijkl"}
    put_repo(hub, EVIL, names)
    p = cli(hub_env, "inspect", f"{EVIL}:Q4_K_M")
    line = one_error_line(p)
    assert len(line) < 2000, len(line)
    if listing == "20000 quants":
        listed, _, more = line.partition("quants there: ")[2].rpartition(", ")
        assert more == "and 19980 more" and len(listed.split(", ")) == 20, line[:600]
    else:
        assert "GGUF files there: " in line and "and 4 more" in line, line[:600]
