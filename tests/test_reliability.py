"""Issue 17: reliability and security of every verb, against real processes and the real engine.

Engines must die with their parent however it dies; stopping survives a second Ctrl-C; logs and
API keys stay private; an output never overwrites an input; engine builds name the real error
and wait for each other; OS and argument errors are one line, never a traceback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- process helpers


def _state(pid: int) -> str | None:
    """The process state letter, or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids += [int(k) for k in task.read_text().split()]
        except OSError:
            pass
    return kids


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _engine_of(pid: int, timeout: float = 30) -> int:
    """The llama-server child of ``pid`` (waiting for it to appear)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = [k for k in _children(pid) if _cmdline(k)[:1] and _cmdline(k)[0].endswith("llama-server")]
        if kids:
            assert len(kids) == 1, kids
            return kids[0]
        time.sleep(0.05)
    raise AssertionError(f"no llama-server child of pid {pid} after {timeout}s")


def _wait_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _kill_if_alive(*pids: int) -> None:
    """Clean-up after a failed assertion: only processes this test started (or its children)."""
    for pid in pids:
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`ggufdspark serve ...` as a real subprocess, its stderr read line by line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "ggufdspark", "serve", *args], cwd=REPO,
                                     env=env or _env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.engine = 0

    def wait_for(self, prefix: str, timeout: float = 120) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line.rstrip("\n")
        raise AssertionError(f"serve never printed {prefix!r}:\n" + "\n".join(self.lines))

    def ready(self) -> "Serve":
        self.wait_for("ready")
        self.engine = _engine_of(self.proc.pid)
        return self

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Exit code and the rest of stderr."""
        _, err = self.proc.communicate(timeout=timeout)
        self.lines += err.splitlines()
        return self.proc.returncode, "\n".join(self.lines)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _kill_if_alive(self.engine)


def _one_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode != 0, p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines, "no message"
    for n in needles:
        assert n in lines[-1], p.stderr
    return lines[-1]


@pytest.fixture
def state_home(tmp_path, monkeypatch) -> Path:
    """A private $XDG_STATE_HOME (logs land in <it>/ggufdspark/logs)."""
    d = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(d))
    return d


@pytest.fixture
def serve_cli(small_pair, dspark_engine, state_home):
    started: list[Serve] = []

    def start(*args: str, pair=True) -> Serve:
        base = ["-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0"] if pair else []
        s = Serve(*base, *args, env=_env(XDG_STATE_HOME=str(state_home)))
        started.append(s)
        return s

    yield start
    for s in started:
        s.cleanup()


SCRIPT = """
import sys, threading
from ggufdspark.serve import serving
if {mode!r} != "auto":
    from ggufdspark.runners import lifeline
    lifeline.MODE = {mode!r}
holder = {{}}
def run():
    holder["cm"] = serving({target!r}, {draft!r})
    holder["srv"], holder["client"] = holder["cm"].__enter__()
if {in_thread!r}:
    t = threading.Thread(target=run)
    t.start()
    t.join()  # the thread that started the engine is gone from here on
else:
    run()
srv = holder["srv"]
assert holder["client"].health()["status"] == "ok"
print("ready", srv.proc.pid, flush=True)
sys.stdin.read()  # until the test kills us
"""


def _script(pair, *, mode: str = "auto", in_thread: bool = False) -> subprocess.Popen:
    code = SCRIPT.format(mode=mode, target=str(pair.target), draft=str(pair.draft), in_thread=in_thread)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=_env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("ready"):
        p.kill()
        raise AssertionError(f"script did not start a server: {line!r}\n{p.stderr.read()}")
    return p


# ----------------------------------------------------------------------------- 1: orphans


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL], ids=["SIGHUP", "SIGKILL"])
def test_serve_engine_dies_with_serve(serve_cli, sig):
    s = serve_cli().ready()
    try:
        s.proc.send_signal(sig)
        assert _wait_gone(s.engine), f"llama-server {s.engine} outlived serve after {sig.name}"
        rc, err = s.finish()
        if sig == signal.SIGHUP:  # handled like SIGTERM: a clean stop
            assert rc == 0 and "Traceback" not in err, err
            assert "stopping" in err
    finally:
        s.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("how", ["main-thread", "worker-thread", "watchdog"])
def test_serving_engine_dies_with_its_script(small_pair, dspark_engine, sig, how):
    """A script inside serving() killed as timeout/systemd/CI would: no engine left behind.

    worker-thread: the engine was started from a thread that has exited since (the parent-death
    signal follows the forking thread); watchdog: the mechanism used where there is no prctl.
    """
    p = _script(small_pair, mode="watchdog" if how == "watchdog" else "auto", in_thread=how == "worker-thread")
    engine = _engine_of(p.pid)
    dogs = [k for k in _children(p.pid) if k != engine]
    try:
        assert len(dogs) == (1 if how == "watchdog" else 0), dogs
        if how == "worker-thread":  # still serving after its starting thread ended
            assert _alive(engine)
        p.send_signal(sig)
        p.wait(30)
        assert _wait_gone(engine), f"llama-server {engine} outlived its script after {sig.name}"
        assert all(_wait_gone(d, 10) for d in dogs), "watchdog left behind"
    finally:
        _kill_if_alive(p.pid, engine, *dogs)
        p.communicate()


def test_spawn_from_a_thread_survives_the_thread():
    """lifeline.spawn from a short-lived thread: the child outlives that thread, not this process."""
    from ggufdspark.runners import lifeline

    out = {}
    t = threading.Thread(target=lambda: out.setdefault("p", lifeline.spawn(["sleep", "60"])))
    t.start()
    t.join()
    proc, line = out["p"]
    try:
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(0.5)  # bounded: a child killed on the thread's exit would be reaped by now
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        line.release()


# ----------------------------------------------------------------------------- 2: second Ctrl-C


def test_second_interrupt_kills_a_hung_engine(serve_cli):
    s = serve_cli().ready()
    try:
        os.kill(s.engine, signal.SIGSTOP)  # a hung engine: SIGTERM alone will not end it
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        s.wait_for("stopping", timeout=10)
        s.proc.send_signal(signal.SIGINT)
        rc, err = s.finish(timeout=12)  # well before the 15 s terminate timeout
        assert time.monotonic() - t0 < 12
        assert "Traceback" not in err and "_Stop" not in err, err
        assert rc == 0, err
        assert "SIGINT while stopping: llama-server killed" in err
        assert _wait_gone(s.engine, 10)
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- 3 + 12: logs


def test_serve_log_is_private_and_unpredictable(serve_cli, state_home):
    s = serve_cli().ready()
    try:
        log_line = next(ln for ln in s.lines if ln.startswith("log: "))
        path = Path(log_line[5:])
        logs = state_home / "ggufdspark" / "logs"
        assert path.parent == logs, path
        assert stat.S_IMODE(logs.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert "llama-server" in path.read_text() or path.stat().st_size > 0
        assert not path.name.startswith("ggufdspark-serve-") and len(path.stem.split("-")[-1]) >= 6
        s.proc.send_signal(signal.SIGTERM)
        rc, err = s.finish()
        assert rc == 0, err
        assert path.is_file()  # serve keeps its log
    finally:
        s.cleanup()


def test_new_logs_never_share_a_name(state_home):
    from ggufdspark import logfiles

    names = {logfiles.new_log("serve") for _ in range(20)}  # all within the same second
    assert len(names) == 20


def test_log_through_planted_symlink_is_refused(serve_cli, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "serve.log"
    link.symlink_to(victim)
    s = serve_cli("--log", str(link))
    rc, err = s.finish(timeout=60)
    assert rc != 0
    assert err.strip().splitlines()[-1] == (f"ggufdspark: error: {link}: is a symbolic link; refusing to write "
                                            f"the log through it (give the real path)"), err
    assert "Traceback" not in err
    assert victim.read_text() == "precious\n"


def test_serving_leaves_no_temporary_log(small_pair, dspark_engine, state_home, tmp_path, monkeypatch):
    import tempfile

    from ggufdspark.errors import ServerStartError
    from ggufdspark.serve import serving

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with serving(small_pair.target, small_pair.draft) as (srv, client):
        assert client.health()["status"] == "ok"
        log = srv.log_path
        assert log.parent == state_home / "ggufdspark" / "logs" and log.is_file()
    assert not log.exists(), "a clean run's log is deleted"
    assert list(tmp.iterdir()) == []
    # a failed start keeps its log (the error names it), in the private directory
    with pytest.raises(ServerStartError) as e:
        with serving(small_pair.target, small_pair.draft, extra_args=["--no-such-flag"]):
            pass
    kept = [p for p in (state_home / "ggufdspark" / "logs").iterdir()]
    assert len(kept) == 1 and str(kept[0]) in str(e.value)
    assert list(tmp.iterdir()) == []


def test_log_of_a_failed_start_is_this_runs_only(small_pair, dspark_engine, tmp_path):
    """An appended --log holding an earlier run's error: the new failure explains itself."""
    from ggufdspark.errors import ServerStartError
    from ggufdspark.serve import serving

    log = tmp_path / "shared.log"
    log.write_text("error: unknown model architecture: 'from-an-earlier-run'\n")
    with pytest.raises(ServerStartError) as e:
        with serving(small_pair.target, small_pair.draft, extra_args=["--no-such-flag"], log_path=log):
            pass
    assert "from-an-earlier-run" not in str(e.value) and "no-such-flag" in str(e.value)


# ----------------------------------------------------------------------------- 5: API key


def _get(port: int, path: str, key: str | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_api_key_never_on_a_command_line(serve_cli):
    s = serve_cli("--api-key", "sk-first-secret", "--", "--api-key=sk-second-secret").ready()
    try:
        port = int(re.search(r"127\.0\.0\.1:(\d+)", next(ln for ln in s.lines if ln.startswith("ready"))).group(1))
        cmd = _cmdline(s.engine)
        assert not any("secret" in a for a in cmd), cmd
        key_file = Path(cmd[cmd.index("--api-key-file") + 1])
        assert not key_file.exists() and not key_file.parent.exists(), "the key file outlived the start"
        assert _get(port, "/v1/models") == 401
        assert _get(port, "/v1/models", "sk-wrong") == 401
        assert _get(port, "/v1/models", "sk-first-secret") == 200
        assert _get(port, "/v1/models", "sk-second-secret") == 200
        s.proc.send_signal(signal.SIGTERM)
        rc, err = s.finish()
        assert rc == 0
        assert "secret" not in err, err
        log = Path(next(ln for ln in s.lines if ln.startswith("log: "))[5:])
        assert "secret" not in log.read_text()
    finally:
        s.cleanup()


@pytest.mark.engine
def test_dry_run_masks_a_key_given_to_the_engine(ggufdspark_cli, small_pair):
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                       "--", "--api-key", "sk-extra-secret", "--seed", "7")
    assert p.returncode == 0, p.stderr
    assert "sk-extra-secret" not in p.stdout + p.stderr
    assert "--api-key-file '<api-key-file>'" in p.stdout and p.stdout.strip().endswith("--seed 7")


def test_key_file_holds_the_keys_privately():
    from ggufdspark.runners.keyfile import remove_key_file, write_key_file

    d = write_key_file(["a", "b"])
    try:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "api-key").stat().st_mode) == 0o600
        assert (d / "api-key").read_text() == "a\nb\n"
    finally:
        remove_key_file(d)
    assert not d.exists()


# ----------------------------------------------------------------------------- 6: output = input


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_converters_refuse_to_overwrite_an_input(ggufdspark_cli, small_pair):
    weights = next(small_pair.target_dir.glob("*.safetensors"))
    config = small_pair.target_dir / "config.json"
    before = {p: _sha(p) for p in (weights, config, small_pair.target)}
    cases = [
        ("convert-target", str(small_pair.target_dir), "-o", str(weights), "--force"),
        ("convert-target", str(small_pair.target_dir), "-o", str(config), "--force"),
        # the same file through another spelling of its path
        ("convert-target", str(small_pair.target_dir), "-o",
         str(small_pair.target_dir / ".." / small_pair.target_dir.name / weights.name), "--force"),
        ("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o",
         str(small_pair.target), "--force"),
        ("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o",
         str(next(small_pair.drafter_dir.glob("*.safetensors"))), "--force"),
    ]
    for args in cases:
        p = ggufdspark_cli(*args)
        assert p.returncode != 0, args
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "is one of the inputs" in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert {p: _sha(p) for p in before} == before


def test_converter_refuses_a_hard_link_to_an_input(small_pair, tmp_path):
    from ggufdspark.convert.target import convert_target
    from ggufdspark.errors import UnsafeOutputError

    weights = next(small_pair.target_dir.glob("*.safetensors"))
    link = tmp_path / "model.gguf"
    os.link(weights, link)
    with pytest.raises(UnsafeOutputError, match="is one of the inputs"):
        convert_target(small_pair.target_dir, output=link, force=True)


# ----------------------------------------------------------------------------- 10: one-line errors


@pytest.mark.engine
def test_os_and_argument_errors_are_one_line(ggufdspark_cli, small_pair, tmp_path, state_home):
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    env = {"XDG_STATE_HOME": str(state_home)}
    _one_line(ggufdspark_cli("serve", *pair, "--port", "70000", "--dry-run"), "70000")
    _one_line(ggufdspark_cli("serve", *pair, "--port", "-1", "--dry-run"), "-1")
    _one_line(ggufdspark_cli("serve", *pair, "--host", "bad..host", "--dry-run"), "bad..host")
    _one_line(ggufdspark_cli("serve", *pair, "--log", "/missing/x.log", env=env), "/missing/x.log")
    _one_line(ggufdspark_cli("generate", "/dev/null"), "/dev/null")
    # "unwritable" as root: a directory that cannot exist because its parent is a file
    _one_line(ggufdspark_cli("generate", str(a_file / "out")), str(a_file))
    _one_line(ggufdspark_cli("convert-target", str(small_pair.target_dir), "-o", str(a_file / "t.gguf")),
              str(a_file))
    _one_line(ggufdspark_cli("convert", str(small_pair.drafter_dir), "--target", str(small_pair.target),
                             "-o", str(tmp_path / "missing" / "d.gguf")), "does not exist")
    _one_line(ggufdspark_cli("timings", str(a_file / "x.json")), str(a_file))
    _one_line(ggufdspark_cli("timings", str(tmp_path)), str(tmp_path))
    assert not list(tmp_path.glob("**/*.part")), "half-written output left behind"


# ----------------------------------------------------------------------------- 14: serving() validates


def test_serving_validates_like_the_cli(small_pair, dspark_engine, other_pair, caplog):
    from ggufdspark.errors import InvalidArgumentError, ServerStartError
    from ggufdspark.serve import serving

    for kw, needle in (({"draft_n_max": 0}, "draft_n_max 0"), ({"draft_n_max": 65}, "draft_n_max 65"),
                       ({"port": 70000}, "port 70000"), ({"port": -1}, "port -1"),
                       ({"host": "bad..host"}, "bad..host"), ({"parallel": 0}, "parallel 0")):
        with pytest.raises(InvalidArgumentError, match=needle.replace(".", r"\.")):
            with serving(small_pair.target, small_pair.draft, **kw):
                pass
    caplog.set_level(logging.WARNING)
    try:
        with serving(small_pair.target, other_pair.draft, force=True):
            pass
    except ServerStartError:
        pass  # the engine may refuse the mismatched draft; the warning came first either way
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("FAILED check" in m and "hidden size" in m for m in warned), warned


# ----------------------------------------------------------------------------- 7 + 16: engine builds

TINY_CMAKE = """
cmake_minimum_required(VERSION 3.14)
project(tiny C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.c)
"""

TINY_SERVER = """
#include <stdio.h>
int main(void) { printf("version: 1 (0c1e570)\\n"); return 0; }
"""


def _tiny_tree(root: Path, *, broken: bool = False) -> Path:
    """A real CMake project standing in for the llama.cpp tree ($GGUFDSPARK_LLAMA_SRC)."""
    root.mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(TINY_CMAKE)
    body = TINY_SERVER if not broken else TINY_SERVER.replace("return 0;", "return undeclared_thing;")
    # pad the log: the real first error must not hide behind an unflushed buffer
    pad = "".join(f"static int pad_{i} = {i};\n" for i in range(400)) if broken else ""
    (root / "server.c").write_text(pad + body)
    return root


def _build_env(tmp_path: Path, tree: Path) -> dict[str, str]:
    return {"GGUFDSPARK_CACHE": str(tmp_path / "cache"), "GGUFDSPARK_LLAMA_SRC": str(tree)}


def test_build_error_names_the_compiler_error(ggufdspark_cli, tmp_path):
    tree = _tiny_tree(tmp_path / "tree", broken=True)
    p = ggufdspark_cli("build-engine", "--no-patches", "-j", "1", env=_build_env(tmp_path, tree))
    line = _one_line(p, "engine compile failed")
    assert "undeclared_thing" in line and "error" in line, p.stderr
    assert not line.split("failed (exit", 1)[1].split(": ", 1)[1].startswith("$ cmake"), line


def test_second_build_waits_for_the_first(ggufdspark_cli, tmp_path, monkeypatch):
    from ggufdspark import engine

    tree = _tiny_tree(tmp_path / "tree")
    env = _build_env(tmp_path, tree)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = engine.BuildSpec(patches=False)
    d = engine.build_dir(spec)
    cmd = [sys.executable, "-m", "ggufdspark", "build-engine", "--no-patches", "-j", "1"]
    with engine.locked(d / "build.lock", "test"):  # another build holds the lock
        p = subprocess.Popen(cmd, cwd=REPO, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            first = p.stderr.readline() + p.stderr.readline()
            deadline = time.monotonic() + 60
            while "waiting for another build" not in first and time.monotonic() < deadline:
                line = p.stderr.readline()
                if not line:
                    break
                first += line
            assert "waiting for another build" in first, first
            assert not (d / "build.log").exists(), "built while another build held the lock"
        except BaseException:
            p.kill()
            raise
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert Path(out.strip()) == d / "build" / "bin" / "llama-server"
    # two at once: both succeed, one builds, the other reuses it
    procs = [subprocess.Popen(cmd, cwd=REPO, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [q.communicate(timeout=300) for q in procs]
    assert [q.returncode for q in procs] == [0, 0], outs


def test_broken_cached_engine_is_rebuilt(ggufdspark_cli, tmp_path, monkeypatch):
    from ggufdspark import engine

    tree = _tiny_tree(tmp_path / "tree")
    env = _build_env(tmp_path, tree)
    monkeypatch.setenv("GGUFDSPARK_CACHE", env["GGUFDSPARK_CACHE"])
    d = engine.build_dir(engine.BuildSpec(patches=False))
    exe = d / "build" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"\x7fELF truncated")
    exe.chmod(0o755)
    (d / "build.json").write_text("{}")
    p = ggufdspark_cli("build-engine", "--no-patches", "--print-path", "-j", "1", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(exe)
    assert "does not run" in p.stderr
    assert subprocess.run([str(exe), "--version"], capture_output=True).returncode == 0


def test_build_engine_json_says_built_then_reused(ggufdspark_cli, tmp_path, monkeypatch):
    """build-engine --json (issue 14): one JSON object on stdout; a real build, then the same build reused."""
    from ggufdspark import engine

    env = _build_env(tmp_path, _tiny_tree(tmp_path / "tree"))
    monkeypatch.setenv("GGUFDSPARK_CACHE", env["GGUFDSPARK_CACHE"])
    spec = engine.BuildSpec(patches=False)
    args = ("build-engine", "--no-patches", "--no-ui", "-j", "1", "--json")
    first, again = (ggufdspark_cli(*args, env={**env, "GGML_CUDA": "", "GGML_METAL": ""}) for _ in range(2))
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    built, reused = json.loads(first.stdout), json.loads(again.stdout)
    exe = engine.build_dir(spec) / "build" / "bin" / "llama-server"
    assert built == {"path": str(exe), "backend": "cpu", "key": spec.key(), "build_dir": str(engine.build_dir(spec)),
                     "patches": [], "targets": ["llama-server"], "built": True,
                     "ui": {"status": "skipped", "path": None, "reason": "--no-ui", "seconds": None}}
    assert reused == {**built, "built": False}
    assert "UI: skipped (--no-ui)" in again.stderr
    p = ggufdspark_cli(*args, "--print-path", env=env)
    assert p.returncode == 2 and "--print-path and --json" in p.stderr and p.stdout == ""


def test_build_engine_json_reuses_the_cached_engine(ggufdspark_cli, dspark_engine):
    """The engine the tests run on, reported as it is: its patch series, nothing rebuilt."""
    from ggufdspark import engine

    cached = engine.built_server(engine.BuildSpec())
    assert cached is not None and str(cached) == dspark_engine.path, (
        f"the engine under test ({dspark_engine.path}) is not the default CPU build of this checkout "
        f"({engine.build_dir(engine.BuildSpec())}): run 'ggufdspark build-engine'")
    p = ggufdspark_cli("build-engine", "--json", "--no-ui", env={"GGML_CUDA": "", "GGML_METAL": ""})
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["built"] is False and r["path"] == dspark_engine.path and r["backend"] == "cpu"
    assert r["key"] == engine.BuildSpec().key() and r["patches"] == [f.name for f in engine.patch_files()]
    assert "llama-server" in r["targets"] and "engine already built" in p.stderr


def test_build_engine_argument_errors(ggufdspark_cli, tmp_path):
    env = {"GGUFDSPARK_CACHE": str(tmp_path / "cache")}
    _one_line(ggufdspark_cli("build-engine", "--cuda", "--metal", env=env), "--cuda and --metal")
    _one_line(ggufdspark_cli("build-engine", "-j", "-3", env=env), "-3")
    assert not (tmp_path / "cache" / "engine").exists()


# ----------------------------------------------------------------------------- 16: messages, docs


def test_docs_state_the_cpu_default_serve_uses():
    from ggufdspark.hardware import DEFAULTS

    row = next(ln for ln in (REPO / "docs" / "serve.md").read_text().splitlines() if ln.strip().startswith("| CPU |"))
    assert row.split("|")[2].strip() == str(DEFAULTS["cpu"].draft_n_max), row


def test_docs_say_where_logs_go_and_how_keys_are_passed():
    text = (REPO / "README.md").read_text() + (REPO / "docs" / "serve.md").read_text()
    assert "~/.local/state/ggufdspark/logs" in text
    assert "--api-key-file" in text


def test_hub_download_failure_is_not_called_a_load_failure(ggufdspark_cli, state_home):
    p = ggufdspark_cli("serve", "--hf", "nobody/nothing-GGUF:F16", "--no-draft", "--port", "0",
                       "--start-timeout", "120", env={"XDG_STATE_HOME": str(state_home)})
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("ggufdspark: error:"))
    assert "the model failed to load" not in line, p.stderr
    assert "download" in line.lower(), p.stderr


# ----------------------------------------------------------------------------- 11: saved profiles


@pytest.mark.parametrize("content", ["[]", '{"recommendation": []}', '{"recommendation": {"draft_n_max": "9"}}',
                                     '{"recommendation": {"draft_n_max": 0}}', '"text"', "\xff\xfe"])
def test_a_damaged_tune_profile_is_ignored(ggufdspark_cli, small_pair, isolated, content, caplog):
    from ggufdspark import hardware
    from ggufdspark.measuring import profiles
    from ggufdspark.engine import find_engine
    from ggufdspark.serve import ServingOptions, plan

    path = profiles.profile_path(hardware.detect(find_engine()), small_pair.target, small_pair.draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("latin-1"))
    caplog.set_level(logging.WARNING)
    p = plan(ServingOptions(model=small_pair.target, draft=small_pair.draft))
    assert p.decision.draft_n_max == 3 and p.decision.draft_enabled  # the table default
    assert any(str(path) in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    cli = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run",
                         env=isolated)
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr
    assert "--spec-draft-n-max 3" in cli.stdout
    # the warning reads as one on the terminal (issue 14: warnings marked as warnings)
    assert any(ln.startswith("WARNING: ") and "ignored" in ln for ln in cli.stderr.splitlines()), cli.stderr


def test_a_damaged_hash_cache_is_rebuilt(small_pair, isolated):
    from ggufdspark.measuring import profiles
    from ggufdspark.engine import cache_dir

    (cache_dir()).mkdir(parents=True, exist_ok=True)
    (cache_dir() / "hashes.json").write_text("[]")
    assert profiles.file_sha256(small_pair.draft) == _sha(small_pair.draft)


# ----------------------------------------------------------------------------- 13: terminal escapes

HOSTILE_NAME = "Tiny\x1b]0;pwned\x07\x1b[2J\x1b[31mred\u202eevil\r"


def _renamed(src: Path, dst: Path, name: str) -> Path:
    from ggufdspark.gguffile.constants import TensorType
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.gguffile.writer import GGUFWriter

    g = read_gguf(src)
    w = GGUFWriter(dst)
    for k, v in g.metadata.items():
        vt, it = g.value_types[k]
        w.add(k, name if k == "general.name" else v, vt, it)
    for n, t in g.tensors.items():
        w.add_tensor(n, t.shape, TensorType(t.type))
    w.write(lambda n: [g.tensor_bytes(n).tobytes()])
    return dst


def test_strings_from_files_cannot_drive_the_terminal(ggufdspark_cli, small_pair, tmp_path):
    f = _renamed(small_pair.target, tmp_path / "t.gguf", HOSTILE_NAME)
    p = ggufdspark_cli("inspect", str(f))
    assert p.returncode == 0, p.stderr
    for bad in ("\x1b", "\x07", "\u202e", "\r"):
        assert bad not in p.stdout, repr(p.stdout)
    assert "Tiny\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\u202eevil\\x0d" in p.stdout
    j = ggufdspark_cli("inspect", str(f), "--json")
    assert "\x1b" not in j.stdout and json.loads(j.stdout)["name"] == HOSTILE_NAME


def test_error_messages_are_escaped(ggufdspark_cli, tmp_path):
    bad = tmp_path / "x\x1b[2J.gguf"
    bad.write_bytes(b"not a gguf at all" * 4)
    p = ggufdspark_cli("inspect", str(bad))
    assert p.returncode != 0 and "\x1b" not in p.stderr and "x\\x1b[2J.gguf" in p.stderr, repr(p.stderr)


# ----------------------------------------------------------------------------- 15: publish


class _ReflectingHub:
    """A misbehaving Hub endpoint: every request is redirected to a URL holding the caller's token,
    which then fails with the token in a header and in the body."""

    def __init__(self):
        import http.server

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                tok = self.headers.get("Authorization", "").split(" ", 1)[-1]
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                if "/reflected/" not in self.path:
                    self.send_response(302)
                    self.send_header("Location", f"/reflected/{tok}?token={tok}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"error": f"token {tok} rejected"}).encode()
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Error-Message", f"token {tok} rejected")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_HEAD = do_PUT = _any

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_publish_debug_never_prints_a_reflected_token(ggufdspark_cli, small_pair, tmp_path):
    token = "hf_ReflectedTokenMustNeverBePrinted0123456789"
    with _ReflectingHub() as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": token, "HF_HOME": str(tmp_path / "hf"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HUGGING_FACE_HUB_TOKEN": ""}
        p = ggufdspark_cli("--debug", "publish", "--target", str(small_pair.target), "--draft",
                           str(small_pair.draft), "--repo", "org/Tiny-LFM2", env=env, timeout=120)
    assert p.returncode != 0
    assert "rejected" in p.stderr  # the endpoint's answer did reach the output, masked
    assert token not in p.stdout + p.stderr and token[3:] not in p.stdout + p.stderr


@pytest.mark.parametrize("value", ["org/x\n# injected heading", "org/x) [click](http://evil", "not-a-repo-id",
                                   "org/x\nlicense: mit"])
def test_publish_base_model_must_be_a_repo_id(ggufdspark_cli, small_pair, value):
    for opt in ("--base-model", "--draft-base-model"):
        p = ggufdspark_cli("publish", "--target", str(small_pair.target), "--draft", str(small_pair.draft),
                           "--repo", "org/Tiny-LFM2", "--dry-run", opt, value)
        _one_line(p, "not a valid repo id")
        assert "injected" not in p.stdout
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


# ----------------------------------------------------------------------------- 12: hung engines

HANGING_SERVER = """#!/bin/sh
# answers nothing: starts a child that holds our output open, writes its pid, and waits forever
sleep 600 &
echo $! > "$(dirname "$0")/child-$1.pid"
wait
"""


def test_a_hung_engine_probe_leaves_nothing_behind(tmp_path, monkeypatch):
    from ggufdspark import engine
    from ggufdspark.errors import EngineError

    d = tmp_path / "hung"
    d.mkdir()
    exe = d / "llama-server"
    exe.write_text(HANGING_SERVER)
    exe.chmod(0o755)
    monkeypatch.setattr(engine.probe, "PROBE_TIMEOUT", 2.0)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not answer within 2 s"):
        engine.probe_engine(exe, "explicit")
    assert time.monotonic() - t0 < 30
    child = int((d / "child---version.pid").read_text())
    try:
        assert _wait_gone(child, 10), f"the hung engine's child {child} was left running"
    finally:
        _kill_if_alive(child)


# ----------------------------------------------------------------------------- 8: impossible timings


GOOD_TIMINGS = ('"prompt_n": 5, "prompt_ms": 10.0, "predicted_n": 64, "predicted_ms": 100.0, '
                '"draft_n": 10, "draft_n_accepted": 5')
# case -> (the timings object's fields as JSON text, what the one-line error says)
IMPOSSIBLE = {
    "accepted > drafted": (GOOD_TIMINGS.replace('"draft_n_accepted": 5', '"draft_n_accepted": 50'),
                           "50 drafted tokens accepted of 10 drafted"),
    "negative count": (GOOD_TIMINGS.replace('"draft_n": 10', '"draft_n": -3'),
                       "'draft_n' is -3"),
    "negative time": (GOOD_TIMINGS.replace("100.0", "-1.5"), "'predicted_ms' is -1.5"),
    "NaN": (GOOD_TIMINGS.replace("100.0", "NaN"), "'predicted_ms' is nan"),
    "Infinity": (GOOD_TIMINGS.replace("10.0", "Infinity"), "'prompt_ms' is inf"),
    "400 digits": (GOOD_TIMINGS.replace('"draft_n": 10', '"draft_n": 1' + "0" * 400), "'draft_n' is 1000000"),
    "400 digits as time": (GOOD_TIMINGS.replace("100.0", "1" + "0" * 400), "401-digit number"),
}


def _line(timings: str) -> str:
    return '{"content": "x", "stop": true, "timings": {' + timings + "}}"


@pytest.mark.parametrize("case", list(IMPOSSIBLE), ids=list(IMPOSSIBLE))
def test_impossible_timings_are_errors(ggufdspark_cli, tmp_path, case):
    bad, needle = IMPOSSIBLE[case]
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join([_line(GOOD_TIMINGS), _line(bad), _line(GOOD_TIMINGS)]) + "\n")
    assert json.loads(_line(GOOD_TIMINGS))["timings"]["draft_n"] == 10
    p = ggufdspark_cli("timings", str(f))
    line = _one_line(p, needle)
    assert f"{f}:2" in line, line
    lenient = ggufdspark_cli("timings", str(f), "--lenient", "--json")
    assert lenient.returncode == 0, lenient.stderr
    out = json.loads(lenient.stdout, parse_constant=lambda c: pytest.fail(f"--json wrote {c}"))
    assert len(out["records"]) == 2 and len(out["skipped"]) == 1 and needle in out["skipped"][0]["reason"]
    assert all(r["acceptance_rate"] == 0.5 for r in out["records"])
    assert "skipped 1" in lenient.stderr


def test_deeply_nested_json_is_one_line(ggufdspark_cli, tmp_path):
    f = tmp_path / "deep.json"
    f.write_text("[" * 200_000 + "]" * 200_000)
    _one_line(ggufdspark_cli("timings", str(f)), str(f), "nested too deeply")
    g = tmp_path / "deep.jsonl"
    g.write_text(_line(GOOD_TIMINGS) + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    _one_line(ggufdspark_cli("timings", str(g)), "nested too deeply")
