"""Issue 31 (reliability, second sweep), the rows about our own engine processes: loopback requests
never through a proxy (row 1), engine flags serve owns refused after -- (3), a live server's log kept
by pruning (11), the engine's crash named by its signal (13), a tune profile applied whole (7), the
health watchdog of supervision, and the "also seen" items (a draft cut longer than the draft, a bare
command name in GGUFDSPARK_SERVER, inspect --json on a corrupt file). Real engine, real processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from test_reliability import Serve, _alive, _engine_of, _env, _one_line, _wait_gone


def _dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- row 1: proxies


@pytest.mark.parametrize("no_proxy", [None, "localhost"], ids=["proxy", "proxy-no_proxy-localhost"])
def test_loopback_engine_is_reached_without_the_proxy(small_pair, dspark_engine, tmp_path, monkeypatch, no_proxy):
    """A proxy set for the user's other traffic (here a dead one) must not carry the health poll
    and requests to our own child on 127.0.0.1: before the fix the start timed out and the working
    engine was killed."""
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    proxy = f"http://127.0.0.1:{_dead_port()}"
    for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(k, proxy)
    for k in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(k, raising=False)
        if no_proxy:
            monkeypatch.setenv(k, no_proxy)
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, draft=small_pair.draft,
                              draft_n_max=3, ctx_size=512)
    with ServerProcess(settings, log_path=tmp_path / "proxy.log", start_timeout=60) as srv:
        out = srv.client().complete("The model", n_predict=4)
        assert out.timings.predicted_n == 4


def test_serve_with_a_proxy_set_comes_up(small_pair, dspark_engine, tmp_path):
    """The whole verb, as the user runs it, with http_proxy pointing nowhere."""
    proxy = f"http://127.0.0.1:{_dead_port()}"
    s = Serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0", "--start-timeout", "60",
              env=_env(http_proxy=proxy, HTTP_PROXY=proxy, no_proxy="localhost",
                       XDG_STATE_HOME=str(tmp_path / "state"), GGUFDSPARK_SERVER=str(dspark_engine.path)))
    try:
        s.ready()
        s.proc.send_signal(signal.SIGINT)
        rc, err = s.finish()
        assert rc == 0, err
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- row 3: owned flags


@pytest.mark.parametrize("extra,owner", [
    (["--port", "8099"], "--port"), (["--host=0.0.0.0"], "--host"), (["-m", "other.gguf"], "-m"),
    (["--model-draft", "d.gguf"], "-md"), (["-c", "99"], "-c"), (["-np", "4"], "-np"),
    (["--spec-draft-n-max", "9"], "--draft-n-max"), (["-hf", "org/x"], "--hf")],
    ids=lambda v: v[0] if isinstance(v, list) else v)
def test_serve_refuses_engine_flags_it_owns(ggufdspark_cli, small_pair, isolated, extra, owner):
    t0 = time.monotonic()
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0",
                       "--", *extra, env=isolated, timeout=60)
    assert p.returncode == 2, p.stderr
    line = _one_line(p, "after --", f"use serve's own {owner} option")
    assert extra[0].split("=")[0] in line
    assert "ready" not in p.stderr and time.monotonic() - t0 < 30  # refused before anything started


def test_engine_flags_serve_merges_or_yields_to_stay_allowed(ggufdspark_cli, small_pair, isolated):
    """Intended, not owned: keys after -- join serve's key file; --path replaces the chat UI."""
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run", "--",
                       "--api-key", "sk-after-dashes", "--path", "/srv/ui", "--seed", "7", env=isolated)
    assert p.returncode == 0, p.stderr
    assert "--api-key-file '<api-key-file>'" in p.stdout and "sk-after-dashes" not in p.stdout + p.stderr
    assert p.stdout.strip().endswith("--path /srv/ui --seed 7")


# ----------------------------------------------------------------------------- row 11: log pruning


def test_pruning_never_deletes_a_running_engines_log(small_pair, dspark_engine, tmp_path, monkeypatch):
    from ggufdspark import logfiles
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log = logfiles.new_log("serve")
    old = logfiles.new_log("serve")  # a stale log of a finished run: pruned as before
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, spec_type=None, ctx_size=512)
    srv = ServerProcess(settings, log_path=log, start_timeout=60)
    with srv:
        month_ago = time.time() - 30 * 86400
        for p in (log, old):
            os.utime(p, (month_ago, month_ago))  # idle for a month, and beyond every count
        logfiles.prune(logfiles.logs_dir(), keep=0)
        assert log.exists(), "the log of a running server was pruned"
        assert not old.exists()
        logfiles.new_log("bench")  # the pruning every new log does
        assert log.exists() and srv.alive()
    logfiles.prune(logfiles.logs_dir(), keep=0)
    assert not log.exists()  # once the engine is gone, its log is pruned like any other


# ----------------------------------------------------------------------------- row 13: crash cause


def test_engine_crash_at_start_is_named_by_its_signal(small_pair, dspark_engine, tmp_path):
    """-t 99999 made the pinned engine die of SIGSEGV: the message said 'exited with code -11'."""
    from ggufdspark.errors import ServerStartError
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, spec_type=None, threads=99999)
    with pytest.raises(ServerStartError, match=r"llama-server was killed by SIGSEGV \(signal 11\) during start"):
        ServerProcess(settings, log_path=tmp_path / "t.log", start_timeout=60).start()


# ----------------------------------------------------------------------------- supervision


@pytest.mark.slow
def test_supervision_restarts_a_hung_engine_and_names_every_cause(small_pair, dspark_engine, tmp_path):
    """A stopped engine answers nothing: restarted after the health timeout, the cause printed and
    written into its log; then a crash by signal is named as such."""
    log = tmp_path / "serve.log"
    s = Serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0", "--log", str(log),
              "--health-timeout", "3", env=_env(XDG_STATE_HOME=str(tmp_path / "state"),
                                                GGUFDSPARK_SERVER=str(dspark_engine.path)))
    hung = 0
    try:
        s.ready()
        hung = s.engine
        os.kill(hung, signal.SIGSTOP)  # alive, listening, answering nothing
        line = s.wait_for("llama-server stopped answering /health", timeout=60)
        assert "health timeout is 3s" in line and "restart 1/5" in line, line
        s.wait_for("ready again", timeout=120)
        assert _wait_gone(hung, 10), "the hung engine was not ended"
        second = _engine_of(s.proc.pid)
        assert second != hung and _alive(second)
        os.kill(second, signal.SIGSEGV)
        line = s.wait_for("llama-server was killed by SIGSEGV (signal 11)", timeout=30)
        assert "restart 2/5" in line, line
        s.wait_for("ready again", timeout=120)
        text = log.read_text(errors="replace")
        assert "ggufdspark: " in text and "stopped answering /health" in text and "SIGSEGV" in text
        s.proc.send_signal(signal.SIGINT)
        rc, err = s.finish()
        assert rc == 0 and "Traceback" not in err, err
    finally:
        if hung and _alive(hung):
            os.kill(hung, signal.SIGKILL)
        s.cleanup()


def test_supervision_gives_up_naming_the_last_cause(small_pair, dspark_engine, tmp_path):
    s = Serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0", "--max-restarts", "0",
              env=_env(XDG_STATE_HOME=str(tmp_path / "state"), GGUFDSPARK_SERVER=str(dspark_engine.path)))
    try:
        s.ready()
        os.kill(s.engine, signal.SIGKILL)
        rc, err = s.finish(timeout=60)
        assert rc == 1 and "Traceback" not in err, err
        assert "llama-server failed 1 time(s) (last: it was killed by SIGKILL (signal 9)); giving up" in err
    finally:
        s.cleanup()


def test_health_timeout_zero_turns_the_watchdog_off(small_pair, dspark_engine, tmp_path):
    s = Serve("-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0", "--health-timeout", "0",
              env=_env(XDG_STATE_HOME=str(tmp_path / "state"), GGUFDSPARK_SERVER=str(dspark_engine.path)))
    try:
        s.ready()
        os.kill(s.engine, signal.SIGSTOP)
        time.sleep(4)  # what is tested is that nothing happens: the watchdog would have acted by now at 3 s
        assert _alive(s.engine)
        os.kill(s.engine, signal.SIGCONT)
        s.proc.send_signal(signal.SIGINT)
        rc, err = s.finish()
        assert rc == 0 and "stopped answering" not in err, err
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- row 7: tune profile


def _profile(pair, **rec) -> Path:
    from ggufdspark import hardware
    from ggufdspark.measuring import profiles
    from ggufdspark.engine import find_engine

    return profiles.save_profile(hardware.detect(find_engine()), pair.target, pair.draft,
                                 {"recommendation": {"draft_enabled": True, "max_concurrency_for_draft": 1, **rec}})


def test_serve_applies_the_profiles_p_min_or_says_why_not(ggufdspark_cli, small_pair, isolated):
    path = _profile(small_pair, draft_n_max=2, p_min=0.5)
    args = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run")
    p = ggufdspark_cli(*args, "--json", env=isolated)
    assert p.returncode == 0, p.stderr
    plan = json.loads(p.stdout)
    assert plan["settings"]["draft_n_max"] == 2 and plan["settings"]["draft_p_min"] == 0.5
    assert "--spec-draft-p-min 0.5" in plan["command"]
    assert any("p_min 0.5" in r and str(path) in r for r in plan["decision"]["reasons"]), plan["decision"]
    p = ggufdspark_cli(*args, "--draft-n-max", "3", env=isolated)
    assert p.returncode == 0, p.stderr
    assert "--spec-draft-p-min" not in p.stdout and "--spec-draft-n-max 3" in p.stdout
    assert any(ln.startswith("WARNING: ") and "p_min 0.5" in ln and "--draft-n-max 3" in ln
               for ln in p.stderr.splitlines()), p.stderr


# ----------------------------------------------------------------------------- also seen


def test_draft_cut_longer_than_the_draft_is_refused(ggufdspark_cli, small_pair, isolated):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "-np", "4",
                       "--draft-n-max", "6", "--draft-n-max-by-slots", "0:60", "--dry-run", env=isolated)
    assert p.returncode == 2
    _one_line(p, "--draft-n-max-by-slots 0:60", "longer than the draft length 6")
    ok = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "-np", "4",
                        "--draft-n-max", "6", "--draft-n-max-by-slots", "0:4", "--dry-run", env=isolated)
    assert ok.returncode == 0 and "--spec-draft-n-max-by-slots 0:4" in ok.stdout, ok.stderr


def test_a_bare_command_name_in_the_server_variable_is_looked_up_on_path(dspark_engine, monkeypatch):
    from ggufdspark.engine import find_engine

    monkeypatch.setenv("GGUFDSPARK_SERVER", "llama-server")
    monkeypatch.setenv("PATH", str(Path(dspark_engine.path).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.chdir(Path(dspark_engine.path).parent.parent)  # no ./llama-server here
    info = find_engine()
    assert Path(info.path) == Path(dspark_engine.path) and info.dspark


def test_inspect_json_on_a_corrupt_file_prints_json(ggufdspark_cli, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    p = ggufdspark_cli("inspect", "--json", str(bad))
    assert p.returncode != 0
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and doc["path"] == str(bad) and str(bad) in doc["error"]
    _one_line(p, str(bad))
