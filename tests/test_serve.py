"""Issue 4: inspect, check and serve against real files and the real engine."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ggufdspark.check import check_pair
from ggufdspark.serve import ServingOptions, plan, serving

REPO = Path(__file__).resolve().parent.parent


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st.rsplit(")", 1)[1].split()[0] != "Z"


def _complete(port: int, prompt: str = "The model", n: int = 16) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                 data=json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_serve(*args: str) -> tuple[subprocess.Popen, list[str]]:
    """Run `ggufdspark serve ...` and wait until it reports ready; returns (process, stderr lines)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "ggufdspark", "serve", *args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 120
    assert p.stderr is not None
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("ready"):
            return p, lines
    p.kill()
    raise AssertionError("serve did not become ready:\n" + "\n".join(lines))


# ----------------------------------------------------------------------------- inspect / check


def test_inspect_draft_and_target(ggufdspark_cli, small_pair):
    p = ggufdspark_cli("inspect", str(small_pair.draft), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["kind"] == "dspark-draft" and d["arch"] == "dflash"
    assert d["details"]["block_size"] == 6 and d["details"]["target_layer_ids"] == [1, 3, 4]
    assert d["details"]["markov_head"] and d["details"]["confidence_head"]
    assert d["details"]["mask_token_id"] == 17
    t = json.loads(ggufdspark_cli("inspect", str(small_pair.target), "--json").stdout)
    assert t["kind"] == "target" and t["details"]["layers"] == 6 and t["details"]["hidden_size"] == 64
    assert t["details"]["vocab_size"] == 1024 and t["details"]["attention_layers"] == 2
    text = ggufdspark_cli("inspect", str(small_pair.draft)).stdout
    assert "dspark-draft" in text and "block_size" in text


def test_check_passes_own_pair(ggufdspark_cli, small_pair):
    p = ggufdspark_cli("check", str(small_pair.target), str(small_pair.draft), "--json")
    assert p.returncode == 0, p.stdout
    report = json.loads(p.stdout)
    assert report["ok"] and len(report["checks"]) >= 7
    assert all(c["ok"] for c in report["checks"])


def test_check_refuses_draft_of_another_target(ggufdspark_cli, small_pair, other_pair):
    p = ggufdspark_cli("check", str(small_pair.target), str(other_pair.draft))
    assert p.returncode == 1
    assert "FAIL  hidden size: target 64, draft 96" in p.stdout
    assert "FAIL  tokenizers identical" in p.stdout
    assert "FAIL  vocabulary size: target 1024, draft 1100" in p.stdout
    assert "pair REFUSED" in p.stdout


def test_check_refuses_a_target_as_draft(small_pair):
    report = check_pair(small_pair.target, small_pair.target)
    assert not report.ok
    assert report.failures()[0].name == "draft is a DSpark draft"


def test_check_refuses_changed_tokenizer(small_pair, tmp_path):
    """Same shapes, one token renamed: the tokenizers check names the token."""
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.gguffile.writer import GGUFWriter

    g = read_gguf(small_pair.draft)
    w = GGUFWriter(tmp_path / "d.gguf")
    for k, v in g.metadata.items():
        vt, it = g.value_types[k]
        if k == "tokenizer.ggml.tokens":
            v = list(v)
            v[300] = "changed"
        w.add(k, v, vt, it)
    for name, t in g.tensors.items():
        from ggufdspark.gguffile.constants import TensorType

        w.add_tensor(name, t.shape, TensorType(t.type))
    w.write(lambda name: [g.tensor_bytes(name).tobytes()])
    report = check_pair(small_pair.target, tmp_path / "d.gguf")
    bad = report.failures()
    assert [c.name for c in bad] == ["tokenizers identical"]
    assert "tokens[300]" in bad[0].detail and "'changed'" in bad[0].detail


@pytest.mark.parametrize("verb", ["inspect", "check"])
def test_corrupt_and_missing_files(ggufdspark_cli, small_pair, tmp_path, verb):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all, just text" * 10)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(small_pair.draft.read_bytes()[:5000])
    for bad, expect in ((tmp_path / "missing.gguf", "no such file"), (junk, "not a GGUF file"),
                        (trunc, "truncated")):
        args = [str(bad)] if verb == "inspect" else [str(small_pair.target), str(bad)]
        p = ggufdspark_cli(verb, *args)
        assert p.returncode != 0
        assert "Traceback" not in p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and str(bad) in lines[0] and expect in lines[0], p.stderr


# ----------------------------------------------------------------------------- serve


def test_serve_api_drafts(small_pair, dspark_engine):
    with serving(small_pair.target, small_pair.draft) as (srv, client):
        assert srv.settings.host == "127.0.0.1"
        assert "--spec-type" in srv.settings.args()
        out = client.complete("The model draft target", n_predict=32)
        assert out.timings.draft_n and out.timings.draft_n > 0
        chat = client.chat([{"role": "user", "content": "Say one two three"}], max_tokens=16)
        assert chat.timings.predicted_n == 16
    assert not srv.alive()


def test_serve_no_draft_serves_target_alone(small_pair, dspark_engine):
    with serving(small_pair.target, small_pair.draft, no_draft=True) as (srv, client):
        assert "-md" not in srv.settings.args() and "--spec-type" not in srv.settings.args()
        out = client.complete("The model draft target", n_predict=16)
        assert out.timings.draft_n is None and out.timings.predicted_n == 16


def test_the_users_llama_arg_environment_adds_no_draft_nor_model(small_pair, dspark_engine, monkeypatch, caplog,
                                                                  tmp_path):
    """llama-server reads LLAMA_ARG_* variables before its command line: a user's shell that names a
    draft (LLAMA_ARG_SPEC_DRAFT_MODEL alone makes the pinned engine draft) or a projector would change
    what serve serves and what bench measures as plain. Our engines start without the variables of
    options ggufdspark owns, with one warning each; others (LLAMA_ARG_THREADS) pass through. Through
    the CLI too: `serve --no-draft` with them set serves undrafted and says which it ignored."""
    monkeypatch.setenv("LLAMA_ARG_SPEC_DRAFT_MODEL", str(small_pair.draft))
    monkeypatch.setenv("LLAMA_ARG_SPEC_TYPE", "draft-dspark")
    monkeypatch.setenv("LLAMA_ARG_MMPROJ", "/nonexistent/mmproj.gguf")  # the engine would fail to start
    monkeypatch.setenv("LLAMA_ARG_THREADS", "1")
    with caplog.at_level("WARNING"):  # the plan's warnings (ggufdspark.serve), not repeated at the start
        with serving(small_pair.target, small_pair.draft, no_draft=True) as (srv, client):
            env, dropped = srv.settings.engine_env()
            assert dropped == ["LLAMA_ARG_MMPROJ", "LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_SPEC_TYPE"], dropped
            assert env["LLAMA_ARG_THREADS"] == "1" and not [k for k in env if k in dropped], env
            out = client.complete("The model draft target", n_predict=16)
            assert out.timings.draft_n is None and out.timings.predicted_n == 16, out.timings
    said = [r.getMessage() for r in caplog.records if "in the environment is ignored" in r.getMessage()]
    assert sorted(m.split()[0] for m in said) == dropped, said
    # a user's key file is followed, not ignored: its keys join the engine's private key file, so the
    # engine stays protected and our own requests carry a key (issue 64 row 10; tests/test_sweep3_serve.py)
    keys = tmp_path / "keys"
    keys.write_text("# mine\nsk-from-the-file\n")
    monkeypatch.setenv("LLAMA_ARG_API_KEY_FILE", str(keys))
    env, dropped_now = srv.settings.engine_env()
    assert "LLAMA_ARG_API_KEY_FILE" not in env and "LLAMA_ARG_API_KEY_FILE" not in dropped_now
    assert srv.settings.api_keys() == ["sk-from-the-file"]
    monkeypatch.delenv("LLAMA_ARG_API_KEY_FILE")
    # an arm's own environment (settings.env) is kept, whatever it names
    kept = dataclasses.replace(srv.settings, env={"LLAMA_ARG_SPEC_TYPE": "none"}).engine_env()
    assert kept[0]["LLAMA_ARG_SPEC_TYPE"] == "none" and "LLAMA_ARG_SPEC_TYPE" not in kept[1], kept[1]
    # the plan says so before anything starts (serve --dry-run --json: its warnings)
    dry = plan(ServingOptions(model=small_pair.target, draft=small_pair.draft, no_draft=True,
                              server=dspark_engine.path))
    assert [w.split()[0] for w in dry.warnings if "in the environment is ignored" in w] == dropped, dry.warnings
    port = _free_port()
    p, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--no-draft",
                            "--server", dspark_engine.path, "--port", str(port))
    try:
        out = _complete(port)
        assert "draft_n" not in out["timings"] or not out["timings"]["draft_n"], out["timings"]
        warned = [ln for ln in lines if "in the environment is ignored" in ln]
        assert [ln.removeprefix("WARNING: ").split()[0] for ln in warned] == dropped, lines
    finally:
        p.terminate()
        p.wait(timeout=60)


@pytest.mark.engine
def test_serve_refuses_mismatched_pair(ggufdspark_cli, small_pair, other_pair):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(other_pair.draft), "--dry-run")
    assert p.returncode != 0
    assert "hidden size: target 64, draft 96" in p.stderr and "Traceback" not in p.stderr
    forced = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(other_pair.draft), "--dry-run", "--force")
    assert forced.returncode == 0 and "FAILED check" in forced.stderr


@pytest.mark.engine
def test_serve_dry_run_prints_command_for_this_hardware(ggufdspark_cli, small_pair):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                       "--api-key", "sk-secret-123", "--", "--seed", "7")
    assert p.returncode == 0, p.stderr
    cmd = p.stdout.strip()
    assert "--spec-type draft-dspark" in cmd and "--spec-draft-n-min 0" in cmd
    assert "--spec-draft-n-max 3" in cmd  # the CPU default (see hardware.DEFAULTS)
    assert "--host 127.0.0.1" in cmd and cmd.endswith("--seed 7")
    assert "sk-secret-123" not in p.stdout + p.stderr and "--api-key-file '<api-key-file>'" in cmd
    assert "backend: cpu" in p.stderr
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                       "--draft-n-max", "7")
    assert "--spec-draft-n-max 7" in p.stdout


@pytest.mark.engine
def test_serve_dry_run_json_is_the_plan_with_keys_redacted(ggufdspark_cli, small_pair):
    """--dry-run --json: one JSON object on stdout, the same command line as the text form, the
    settings and the reasons; no key anywhere, only the key file's placeholder (issue 14)."""
    args = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run", "--api-key",
            "sk-secret-123")
    extra = ("--", "--seed", "7", "--api-key", "sk-extra-456")
    p = ggufdspark_cli(*args, "--json", *extra)
    assert p.returncode == 0, p.stderr
    plan_ = json.loads(p.stdout)
    assert "sk-secret-123" not in p.stdout + p.stderr and "sk-extra-456" not in p.stdout + p.stderr
    assert plan_["command"] == ggufdspark_cli(*args, *extra).stdout.strip()
    assert plan_["argv"][0] == plan_["engine"]["path"] and plan_["argv"][-2:] == ["--seed", "7"]
    s = plan_["settings"]
    assert "api_key" not in s and s["api_key_file"] == "<api-key-file>" and s["extra_args"][-2:] == ["--seed", "7"]
    assert s["model"] == str(small_pair.target) and s["draft"] == str(small_pair.draft) and s["host"] == "127.0.0.1"
    d = plan_["decision"]
    assert d["backend"] == "cpu" and d["draft_enabled"] and d["draft_n_max"] == 3 == s["draft_n_max"]
    assert d["reasons"] and all(isinstance(r, str) for r in d["reasons"])
    assert d["token_table_device"] is None and s["token_table_device"] is None and "-ot" not in plan_["argv"]
    assert plan_["engine"]["dspark"] is True and plan_["check"]["ok"] is True and plan_["warnings"] == []


@pytest.mark.engine
def test_a_pair_is_named_the_same_way_in_every_verb(ggufdspark_cli, small_pair):
    """-m/-md, with --target/--draft as aliases (issue 14): the same command either way."""
    t, d = str(small_pair.target), str(small_pair.draft)
    short = ggufdspark_cli("serve", "-m", t, "-md", d, "--dry-run")
    long_ = ggufdspark_cli("serve", "--target", t, "--draft", d, "--dry-run")
    assert short.returncode == 0 and long_.returncode == 0, short.stderr + long_.stderr
    assert short.stdout == long_.stdout and f"-m {t}" in short.stdout
    for verb in ("bench", "tune"):
        h = ggufdspark_cli(verb, "--help")
        # llama-server's -hf / -hfd spellings name the same options (issue 30)
        assert "-m, -hf, --model, --target, --hf-repo" in h.stdout and "-md, -hfd, --draft, --hf-repo-draft" \
            in h.stdout, h.stdout


@pytest.mark.engine
def test_serve_cuts_drafts_by_load(ggufdspark_cli, small_pair):
    """--draft-n-max-by-slots N:L,... reaches the engine (patch 0021) when more than the first N slots
    are served; a schedule that never engages is said and dropped; a malformed one is refused in one
    line naming it."""
    base = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run")
    p = ggufdspark_cli(*base, "-np", "8", "--draft-n-max-by-slots", "2:2,4:1")
    assert p.returncode == 0, p.stderr
    assert "--spec-draft-n-max-by-slots 2:2,4:1" in p.stdout and "-np 8" in p.stdout
    assert "drafts cut by load (--draft-n-max-by-slots): to 2 above 2 busy slots, to 1 above 4" in p.stderr
    p = ggufdspark_cli(*base, "-np", "2", "--draft-n-max-by-slots", "2:2")
    assert p.returncode == 0 and "--spec-draft-n-max-by-slots" not in p.stdout, p.stdout
    assert "never more than 2 slots are busy (-np), so no draft is ever cut" in p.stderr
    for bad in ("2:-1", "4:2,2:1", "2", "a:b", "2:65"):
        p = ggufdspark_cli(*base, "-np", "8", "--draft-n-max-by-slots", bad)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode == 2 and len(lines) == 1 and repr(bad) in lines[0], (bad, p.stderr)


@pytest.mark.engine
def test_serve_has_no_slot_limit_option(ggufdspark_cli, small_pair):
    """--draft-max-slots (engine patch 0011, pausing new drafts under load, since removed from the
    series) measured 0.88-0.90x of plain on an H200: serve does not offer it, nor puts
    --spec-draft-max-slots on a command line."""
    base = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run")
    p = ggufdspark_cli(*base, "-np", "8")
    assert p.returncode == 0 and "--spec-draft-max-slots" not in p.stdout, p.stdout + p.stderr
    p = ggufdspark_cli(*base, "-np", "8", "--draft-max-slots", "2")
    assert p.returncode == 2 and "No such option '--draft-max-slots'" in p.stderr, p.stderr


def test_the_cuda_load_cut_goes_with_the_table_length_only():
    """CUDA's table cuts drafts to 3 above 16 busy slots (measured with its length 7), on an
    engine with patch 0021; a tune profile's length or --draft-n-max replaces the cut too; CPU
    has none."""
    from ggufdspark import launch
    from ggufdspark.devices import DeviceReport
    from ggufdspark.engine import EngineInfo

    engine = EngineInfo(path="llama-server", source="explicit", draft_pause=True,
                        patches=["0021-spec-draft-n-max-by-slots.patch"])
    cuda = DeviceReport(backend="cuda", source="none")
    d = launch.decide(cuda, engine, parallel=32)
    assert d.draft_n_max == 7 and d.draft_cut == [(16, 3)], d
    prof = {"path": "p.json", "recommendation": {"draft_enabled": True, "draft_n_max": 4}}
    assert launch.decide(cuda, engine, profile=prof, parallel=32).draft_cut is None
    assert launch.decide(cuda, engine, draft_n_max=6, parallel=32).draft_cut is None
    assert launch.decide(DeviceReport(backend="cpu", source="none"), engine, parallel=32).draft_cut is None


@pytest.mark.engine
def test_serve_draft_cut_off_and_malformed(ggufdspark_cli, small_pair):
    """--draft-n-max-by-slots off: no cut on the command line; the --json plan's decision names the cut
    applied (none, or the one given); a malformed value: one line, exit 2."""
    base = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run", "-np", "8")
    p = ggufdspark_cli(*base, "--draft-n-max-by-slots", "off")
    assert p.returncode == 0 and "--spec-draft-n-max-by-slots" not in p.stdout, p.stdout + p.stderr
    for cut, applied in (("off", None), ("2:2", [[2, 2]])):
        p = ggufdspark_cli(*base, "--draft-n-max-by-slots", cut, "--json")
        assert p.returncode == 0 and json.loads(p.stdout)["decision"]["draft_cut"] == applied, (cut, p.stdout)
    p = ggufdspark_cli(*base, "--draft-n-max-by-slots", "8:x")
    assert p.returncode == 2 and "'8:x' is not N:L" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.engine
def test_serve_warns_on_open_host_without_key(ggufdspark_cli, small_pair):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                       "--host", "0.0.0.0")
    assert p.returncode == 0
    assert "WARNING: binding 0.0.0.0 without --api-key" in p.stderr


def test_serve_restarts_after_kill_and_stops_cleanly(small_pair, dspark_engine, tmp_path):
    port = _free_port()
    proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                               "--log", str(tmp_path / "s.log"))
    try:
        assert _complete(port)["timings"]["draft_n"] > 0
        kids = _children(proc.pid)
        assert len(kids) == 1, kids
        os.kill(kids[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        restarted = False
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line.rstrip())
            if line.startswith("ready again"):
                restarted = True
                break
        assert restarted, "\n".join(lines)
        assert any("restart 1/" in ln for ln in lines)
        assert _complete(port)["timings"]["predicted_n"] == 16
        new_kids = _children(proc.pid)
        assert len(new_kids) == 1 and new_kids != kids
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    assert rc == 0
    time.sleep(0.2)
    assert not any(_alive(k) for k in new_kids + kids), "llama-server left behind"


def test_serve_json_events_name_each_restart_its_cause_and_count(small_pair, dspark_engine, tmp_path):
    """serve --json while serving: every supervision event is one JSON line on stdout with the
    restart count; a killed engine gives a restart record naming the signal, written into the
    engine's log too, then ready again with restarts 1; SIGTERM ends with a stopping record."""
    port = _free_port()
    log = tmp_path / "s.log"
    proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                               "--log", str(log), "--json")
    records = []
    try:
        assert proc.stdout is not None
        records.append(json.loads(proc.stdout.readline()))
        assert records[0]["event"] == "ready" and records[0]["restarts"] == 0, records
        kids = _children(proc.pid)
        os.kill(kids[0], signal.SIGKILL)
        while len(records) < 3:  # restart, then ready again
            line = proc.stdout.readline()
            assert line, f"serve ended early: {records}"
            records.append(json.loads(line))
        assert _complete(port)["timings"]["predicted_n"] == 16
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    records += [json.loads(x) for x in out.splitlines() if x.strip()]
    restart, again, stop = records[1], records[2], records[-1]
    assert restart["event"] == "restart" and restart["restarts"] == 1, records
    assert restart["cause"] == "llama-server was killed by SIGKILL (signal 9)" and restart["engine_error"] is None
    assert again["event"] == "ready" and again["restarts"] == 1 and again["url"] == records[0]["url"]
    assert stop == {"event": "stopping", "restarts": 1}, records
    assert "llama-server was killed by SIGKILL (signal 9)" in log.read_text()
    assert any("ready again" in ln and "(restart 1 of at most 5)" in ln for ln in err.splitlines()), err


def test_serve_says_what_finished_every_interval_and_nothing_while_idle(small_pair, dspark_engine, tmp_path):
    """serve --stats-interval: every interval in which requests finished or ran, one line on stderr and
    (--json) one stats record, read from the engine's log; summed over the records, the requests,
    tokens, drafted and accepted tokens are the responses' own; an idle server says nothing, and
    --stats-interval 0 none at all."""
    port = _free_port()
    proc, _ = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port), "-np", "2",
                           "--log", str(tmp_path / "s.log"), "--json", "--stats-interval", "0.5")
    records, stats = [], []
    try:
        assert proc.stdout is not None
        records.append(json.loads(proc.stdout.readline()))
        answers = [_complete(port, f"The model {i}", n=24 + 8 * i) for i in range(3)]
        while sum(r["requests"] for r in stats) < 3:
            line = proc.stdout.readline()
            assert line, f"serve ended early: {records}"
            records.append(json.loads(line))
            if records[-1]["event"] == "stats":
                stats.append(records[-1])
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    rest = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert [r["event"] for r in rest] == ["stopping"], rest  # idle since: no line, no record
    timings = [a["timings"] for a in answers]
    for key in ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted"):
        assert sum(r[key] for r in stats) == sum(t.get(key, 0) for t in timings), (key, stats, timings)
    assert all(r["requests"] or r["running"] for r in stats), stats
    drafted = [r for r in stats if r["draft_n"]]
    assert drafted and all(r["passes"] > 0 and r["accept_length"] == 1 + r["draft_n_accepted"] / r["passes"]
                           for r in drafted), stats
    said = [ln for ln in err.splitlines() if ln.startswith("last ") and " s: " in ln]
    assert len(said) == len(stats), err
    done = [r for r in stats if r["requests"]]
    assert any(f"draft {r['draft_n_accepted']} of {r['draft_n']} accepted" in ln for r in done for ln in said), err

    port = _free_port()
    proc, _ = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                           "--log", str(tmp_path / "s0.log"), "--json", "--stats-interval", "0")
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "ready"
        assert _complete(port)["timings"]["predicted_n"] == 16
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert [json.loads(x)["event"] for x in out.splitlines() if x.strip()] == ["stopping"], out
    assert not any(ln.startswith("last ") for ln in err.splitlines()), err


def test_serve_stats_drop_the_requests_of_a_dead_engine(small_pair, dspark_engine, tmp_path):
    """An engine killed with a request running: after the restart no stats record counts that request
    as running, and a request on the new engine is counted once, as done."""
    port = _free_port()
    proc, _ = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                           "--log", str(tmp_path / "s.log"), "--json", "--stats-interval", "0.5")
    records: list[dict] = []

    def next_record() -> dict:
        line = proc.stdout.readline()
        assert line, f"serve ended early: {records}"
        records.append(json.loads(line))
        return records[-1]

    long = threading.Thread(target=lambda: _swallow(lambda: _complete(port, "A long answer", n=100000)), daemon=True)
    try:
        assert proc.stdout is not None and next_record()["event"] == "ready"
        for _ in range(2):  # the long request gets a task id the new engine's first one will not have
            _complete(port)
        long.start()
        while not (records[-1]["event"] == "stats" and records[-1]["running"] == 1):
            next_record()
        os.kill(_children(proc.pid)[0], signal.SIGKILL)
        while not (records[-1]["event"] == "ready" and records[-1]["restarts"] == 1):
            next_record()
        after = len(records)
        assert _complete(port)["timings"]["predicted_n"] == 16
        while sum(r.get("requests", 0) for r in records[after:] if r["event"] == "stats") < 1:
            next_record()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    records += [json.loads(x) for x in out.splitlines() if x.strip()]
    later = [r for r in records[after:] if r["event"] == "stats"]
    assert sum(r["requests"] for r in later) == 1 and all(r["running"] <= 1 for r in later), later
    assert later[-1]["running"] == 0, later


def _swallow(fn) -> None:
    """Run ``fn``; its failure (a connection the killed engine dropped) is the point, not an error."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        pass


def test_the_engine_error_line_names_a_cuda_death():
    """engine_error_line: the engine's own last error line, as the H200 engine wrote it when it died
    at 32 slots (issue 28), not the benign 'failed to' lines of its start."""
    from ggufdspark.runners.deaths import engine_error_line

    log = "\n".join([
        "0.00.479.488 E llama_init_from_model: failed to initialize the context: dflash requires ctx_other to be "
        "set (this warning is normal during memory fitting)",
        "0.02.500.000 I slot update_slots: id 3 | task 40 | prompt processing progress, n_tokens = 512",
        "/work/src/ggml/src/ggml-cuda/ggml-cuda.cu:111: CUDA error",
        "0.02.506.774 E CUDA error: an illegal instruction was encountered",
        "0.02.506.784 E   current device: 0, in function ggml_backend_cuda_synchronize at ggml-cuda.cu:2568",
        "0.02.506.786 E   cudaStreamSynchronize(cuda_ctx->stream())",
    ])
    assert engine_error_line(log) == "CUDA error: an illegal instruction was encountered"
    assert engine_error_line("src/llama.cpp:88: GGML_ASSERT(n_tokens > 0) failed") == "GGML_ASSERT(n_tokens > 0) failed"
    assert engine_error_line(log.splitlines()[0] + "\nall is well") is None


@pytest.mark.engine
def test_serve_port_in_use(ggufdspark_cli, small_pair):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in p.stderr.strip().splitlines()[-1]


def test_serve_port_zero_picks_a_free_port(small_pair, dspark_engine):
    p = plan(ServingOptions(model=small_pair.target, draft=small_pair.draft, port=0))
    assert p.settings.port == 0
    with serving(small_pair.target, small_pair.draft) as (srv, client):
        assert srv.settings.port > 0
        assert client.health()["status"] == "ok"


def test_a_picked_port_another_server_binds_first_is_picked_again(small_pair, start_server, tmp_path, monkeypatch):
    """The race a free port has between picking and binding (a CI run of 3 workers lost it once):
    another llama-server takes the port first. /health on that port answers 200, but from the other
    server; the start must not take it for its own, and picks another port."""
    from ggufdspark.runners import server as server_mod
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    other = start_server(model=small_pair.target, spec_type=None)
    taken = other.settings.port
    picks = iter([taken])
    real = server_mod.free_port
    monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
    settings = ServerSettings(server=other.settings.server, model=small_pair.target, spec_type=None, port=0)
    with ServerProcess(settings, log_path=tmp_path / "second.log", start_timeout=120) as srv:
        assert srv.settings.port not in (0, taken)
        log = srv.log_text()
        assert "couldn't bind HTTP server socket" in log and f"port: {taken}" in log, log[-2000:]
        assert f"listening on http://127.0.0.1:{srv.settings.port}" in log
        assert len(srv.client().complete([40, 41, 42], n_predict=2).tokens) == 2
    assert other.health() == 200  # the first server was left alone


@pytest.mark.engine
def test_serve_missing_and_non_gguf_files(ggufdspark_cli, small_pair, tmp_path):
    junk = tmp_path / "draft.gguf"
    junk.write_text("hello")
    for args, expect in ((["-m", str(tmp_path / "t.gguf"), "-md", str(small_pair.draft)], "target file not found"),
                         (["-m", str(small_pair.target), "-md", str(junk)], "not a GGUF file")):
        p = ggufdspark_cli("serve", *args, "--dry-run")
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert expect in p.stderr.strip().splitlines()[-1], p.stderr


def test_serve_refuses_engine_without_dspark(ggufdspark_cli, small_pair, non_dspark_server):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                       "--server", str(non_dspark_server))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "has no '--spec-type draft-dspark'" in p.stderr


def test_serve_reports_engine_start_failure(small_pair, dspark_engine, tmp_path):
    """An engine that exits during start: reason and last log lines, non-zero exit."""
    from ggufdspark.errors import ServerStartError

    with pytest.raises(ServerStartError) as e:
        with serving(small_pair.target, small_pair.draft, extra_args=["--no-such-flag"],
                     log_path=tmp_path / "fail.log"):
            pass
    assert "exited with code" in str(e.value) and "no-such-flag" in str(e.value)


def test_serve_warm_up_that_kills_the_engine_is_a_failed_start(small_pair, dspark_engine, ggufdspark_cli, tmp_path):
    """A drafted path that kills the engine at its first request (here a draft tapping the target's
    last layer, which the pinned LFM2 graph does not expose: ``check`` refuses it, ``--force`` serves
    it anyway) is caught by ``serve --warmup`` before anyone is told it is ready: one line on stderr
    with how the engine died and its own error line, a non-zero exit, no ready line, no engine left
    running. Without the warm-up the same server says ready (the first user's request kills it)."""
    from dataclasses import replace

    from ggufdspark.convert.drafter import convert_drafter
    from ggufdspark.synthetic import synth

    last = synth.SMALL_TARGET.num_hidden_layers - 1
    spec = replace(synth.SMALL_DRAFTER, target_layer_ids=(1, 3, last))
    ddir = synth.make_drafter(tmp_path / "drafter", small_pair.target_dir, spec)
    draft = convert_drafter(ddir, small_pair.target, output=tmp_path / "last.gguf").path
    log = tmp_path / "dies.log"
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(draft), "--force", "--warmup",
                       "--port", str(_free_port()), "--log", str(log), "--json", timeout=240)
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    said = p.stderr.strip().splitlines()[-1]
    assert said.startswith("ggufdspark: error: llama-server ") and "on the warm-up request" in said, p.stderr
    assert "layer input tensor is null" in said and str(log) in said, said
    assert not any(ln.startswith("ready") for ln in p.stderr.splitlines()), p.stderr
    assert not any(json.loads(ln).get("event") == "ready" for ln in p.stdout.splitlines() if ln.strip()), p.stdout
    assert "on the warm-up request" in log.read_text()  # the log says why it ended, too
    # without --warmup the same server comes up: the warm-up is what caught it
    proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(draft), "--force",
                               "--port", str(_free_port()), "--log", str(tmp_path / "cold.log"))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert lines[-1].startswith("ready"), lines


_PROMPT_EVAL = re.compile(r"prompt eval time = +[0-9.]+ ms / +(\d+) tokens")


def test_serve_warms_the_drafted_path_up_before_it_says_ready(small_pair, dspark_engine, tmp_path):
    """serve --warmup: a drafted server answers one greedy request (16 tokens, drafted) before
    serve's ready line and record, which give the warm-up's seconds and prompt size (on the CPU by
    default a short prompt); that request is not traffic for the stats. By default on the CPU (off),
    with --no-warmup, with `-- --no-warmup` (llama-server's own switch, which wins over --warmup) and
    without a draft there is none: the engine's log has no finished request until a client sends
    one. Serve's `warm-up:` line says which and why."""
    released = re.compile(r"release: id +\d+ \| task -?\d+ \| stop processing")
    port = _free_port()
    log = tmp_path / "w.log"
    proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                               "--log", str(log), "--json", "--stats-interval", "0.5", "--warmup")
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        text = log.read_text()
        assert len(released.findall(text)) == 1, text[-2000:]  # the warm-up, before ready
        assert ready["event"] == "ready" and isinstance(ready["warmup_s"], float) and ready["warmup_s"] > 0, ready
        # the short prompt: the engine processed exactly what the record says
        assert [int(n) for n in _PROMPT_EVAL.findall(text)] == [ready["warmup_prompt_tokens"]], text[-2000:]
        assert 1 < ready["warmup_prompt_tokens"] < 16, ready
        assert f"warmed up in {ready['warmup_s']:.2f} s ({ready['warmup_prompt_tokens']} prompt tokens)" \
            in lines[-1], lines[-1]
        assert "warm-up: on, a short prompt and 16 answer tokens (--warmup)" in lines, lines
        # the warm-up went through the draft: its timings carry drafted tokens
        assert re.search(r"draft acceptance = [0-9.]+ \( *\d+ accepted / +[1-9]\d* generated\)", text), text[-2000:]
        answer = _complete(port, n=24)
        stats = []
        while sum(r["requests"] for r in stats) < 1:
            rec = json.loads(proc.stdout.readline())
            if rec["event"] == "stats":
                stats.append(rec)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert sum(r["requests"] for r in stats) == 1  # the client's request only
    assert sum(r["predicted_n"] for r in stats) == answer["timings"]["predicted_n"] == 24, stats

    # a server that wants a key: the warm-up sends it (the key itself is printed nowhere)
    port = _free_port()
    proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", str(port),
                               "--log", str(tmp_path / "k.log"), "--json", "--warmup", "--api-key", "warm-key-123")
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert isinstance(ready["warmup_s"], float), (ready, lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert "warm-key-123" not in "\n".join(lines) + out + err + (tmp_path / "k.log").read_text()

    draft = ("-md", str(small_pair.draft))
    cases = (draft, (*draft, "--no-warmup"), (*draft, "--warmup", "--", "--no-warmup"), ("--no-draft", "--warmup"))
    for i, args in enumerate(cases):
        port = _free_port()
        log = tmp_path / f"cold-{i}.log"
        proc, lines = _start_serve("-m", str(small_pair.target), "--port", str(port), "--log", str(log), "--json",
                                   *args)
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            assert ready["warmup_s"] is None and "warmed up" not in lines[-1], (args, ready, lines[-1])
            assert ready["warmup_prompt_tokens"] is None, ready
            assert not released.findall(log.read_text()), args
            why = ("default for cpu: the first request measured no slower without it", "--no-warmup",
                   "'--no-warmup' given to llama-server", "no draft")[i]
            assert f"warm-up: off ({why})" in lines, (args, lines)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def test_serve_warms_up_through_a_real_prompt_size_capped_to_a_slot(small_pair, dspark_engine, tmp_path):
    """--warmup-tokens N: the warm-up's prompt is N tokens of the load benchmark's prompt set (on CUDA
    2048 by default), which the engine processes before serve says ready; where a slot holds fewer,
    as many as leave room for the 16-token answer (a server that wants a key answers /props to it).
    The record and the ready line say the size."""
    cases = ((512, 100, 100, None), (256, 500, 256 - 16 - 1, None), (256, 500, 256 - 16 - 1, "warm-key-789"))
    for i, (ctx, asked, want, key) in enumerate(cases):
        log = tmp_path / f"long-{i}.log"
        proc, lines = _start_serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port",
                                   str(_free_port()), "--log", str(log), "--json", "--ctx-per-slot", str(ctx),
                                   "--warmup", "--warmup-tokens", str(asked), *(("--api-key", key) if key else ()))
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            props = urllib.request.Request(ready["url"] + "/props",
                                           headers={"Authorization": f"Bearer {key}"} if key else {})
            with urllib.request.urlopen(props, timeout=30) as r:
                assert json.loads(r.read())["default_generation_settings"]["n_ctx"] == ctx  # what the cap reads
            assert ready["warmup_prompt_tokens"] == want, (ready, lines)
            assert [int(n) for n in _PROMPT_EVAL.findall(log.read_text())] == [want], log.read_text()[-2000:]
            assert f"({want} prompt tokens)" in lines[-1], lines[-1]
            assert f"warm-up: on, a {asked}-token prompt and 16 answer tokens (--warmup)" in lines, lines
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def test_serve_warms_up_by_default_on_cuda_only(small_pair, dspark_engine, ggufdspark_cli):
    """The warm-up's default follows the backend: on CUDA on, with a 2048-token prompt (the H100's
    first request lost about 60% of its extra time to one such request); on the CPU off, and on a
    backend where nothing measured it (Metal) off too. The plan
    (serve --dry-run --json) carries it; no draft or llama-server's own `--no-warmup` turn it off
    whatever the backend, --warmup-tokens sets the size."""
    from ggufdspark.devices import DeviceReport

    t, d = str(small_pair.target), str(small_pair.draft)
    cuda, cpu = DeviceReport(backend="cuda", source="none"), DeviceReport(backend="cpu", source="none")
    w = plan(ServingOptions(model=t, draft=d), devices=cuda).warmup
    assert (w.on, w.prompt_tokens) == (True, 2048) and w.why.startswith("default for cuda"), w
    assert plan(ServingOptions(model=t, draft=d, warmup_tokens=300), devices=cuda).warmup.prompt_tokens == 300
    assert plan(ServingOptions(model=t, draft=d, warm=False), devices=cuda).warmup.on is False
    assert plan(ServingOptions(model=t, draft=d, extra_args=["--no-warmup"]), devices=cuda).warmup.on is False
    assert plan(ServingOptions(model=t, draft=d, no_draft=True), devices=cuda).warmup.on is False
    w = plan(ServingOptions(model=t, draft=d), devices=cpu).warmup
    assert (w.on, w.prompt_tokens) == (False, 0) and w.why.startswith("default for cpu"), w
    # a backend nothing measured says so, and is off like the CPU
    w = plan(ServingOptions(model=t, draft=d), devices=DeviceReport(backend="metal", source="none")).warmup
    assert (w.on, w.prompt_tokens) == (False, 0) and w.why == "default for metal: not measured there; --warmup " \
        "turns it on", w
    p = ggufdspark_cli("serve", "-m", t, "-md", d, "--dry-run", "--json", "--warmup", "--warmup-tokens", "64")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["warmup"] == {"on": True, "prompt_tokens": 64, "why": "--warmup", "timeout_s": 60 + 64 / 20}
    assert "warm-up: on, a 64-token prompt and 16 answer tokens (--warmup)" in p.stderr, p.stderr
    bad = ggufdspark_cli("serve", "-m", t, "-md", d, "--dry-run", "--warmup-tokens", "-1")
    assert bad.returncode != 0 and "--warmup-tokens" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
