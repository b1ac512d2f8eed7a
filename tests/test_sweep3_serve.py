"""Issue 64 (reliability and security, third sweep), the rows about ``serve`` and its supervision: a
one-repo pair whose draft is not in the cache served without a word (row 2), a busy engine killed as
hung (5), a crash count never reset (6), a restart that finds its port taken and a JSON stream
without a final event (7), the engine's API key and API prefix variables (10), and a start error
that quotes the line after the cause (18, serve's half). Real engine, real processes; only the Hub
is faked (tests/fakehub.py).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fakehub import FakeHub
from test_reliability import _alive, _engine_of, _env, _one_line, _wait_gone

REPO = Path(__file__).resolve().parent.parent


class ServeRun:
    """``ggufdspark serve ARGS`` as a real subprocess, its stderr and stdout going to files that
    the test polls (a pipe read line by line would block a test that must see nothing happen)."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str], name: str = "serve"):
        self.err_path, self.out_path = tmp_path / f"{name}.err", tmp_path / f"{name}.out"
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "ggufdspark", "serve", *args], cwd=REPO, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        self.pids: list[int] = []  # every engine pid serve reported

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def records(self) -> list[dict]:
        return [json.loads(ln) for ln in self.out_path.read_text().splitlines() if ln.strip()]

    def wait_for(self, pattern: str, timeout: float = 120, count: int = 1) -> re.Match:
        """The ``count``-th line of stderr matching ``pattern``, once serve printed it."""
        rx = re.compile(pattern, re.MULTILINE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(rx.finditer(self.err()))
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None:
                found = list(rx.finditer(self.err()))
                if len(found) >= count:
                    return found[count - 1]
                pytest.fail(f"serve exited ({self.proc.returncode}) before printing {pattern!r} x{count}:\n"
                            f"{self.err()[-4000:]}")
            time.sleep(0.05)
        pytest.fail(f"serve printed no {pattern!r} x{count} within {timeout:g} s:\n{self.err()[-4000:]}")

    def ready(self, count: int = 1) -> tuple[str, int]:
        """The URL and the engine pid of the ``count``-th ready line (``ready`` or ``ready again``):
        its one llama-server child, checked against the pid serve reports (issue 64 row 6 asked for
        it; ``test_crashes_count...`` requires it)."""
        m = self.wait_for(r"^ready(?: again)?: (http://\S+) .*$", count=count)
        pid = _engine_of(self.proc.pid)
        self.pids.append(pid)
        said = re.search(r"llama-server pid (\d+)", m.group(0))
        assert not said or int(said.group(1)) == pid, f"serve reported another engine pid: {m.group(0)}"
        return m.group(1), pid

    def finish(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"serve did not end within {timeout:g} s:\n{self.err()[-3000:]}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.pids:  # only the engines this serve started
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _error_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    """The one ``ggufdspark: error:`` line of a failed run (a start error is followed by the
    engine's last log lines), holding every needle."""
    assert p.returncode not in (0, None), p.stdout
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("ggufdspark: error:")]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], p.stderr
    return lines[0]


def _serve_env(tmp_path: Path, dspark_engine, **extra: str) -> dict[str, str]:
    env = _env(XDG_STATE_HOME=str(tmp_path / "state"), GGUFDSPARK_SERVER=str(dspark_engine.path),
               GGUFDSPARK_CACHE=str(tmp_path / "cache"), **extra)
    for k in ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE", "LLAMA_ARG_API_PREFIX", "GGUFDSPARK_API_KEY"):
        if k not in extra:
            env.pop(k, None)
    return env


def _pair_args(pair) -> list[str]:
    return ["-m", str(pair.target), "-md", str(pair.draft), "--port", "0", "--no-ui", "--no-profile",
            "--draft-n-max", "3"]


# ----------------------------------------------------------------------------- row 2: the missing draft


def test_serve_m_alone_gives_the_true_reason_for_no_draft(ggufdspark_cli, small_pair, isolated):
    """``serve -m T.gguf`` without -md said "because --no-draft given", which was never given."""
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "--dry-run", env=isolated)
    assert p.returncode == 0, p.stderr
    assert "draft: off" in p.stderr and "because --no-draft given" not in p.stderr, p.stderr
    assert "because no draft: -md not given" in p.stderr, p.stderr
    assert " -md " not in p.stdout
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "--no-draft", "--dry-run", env=isolated)
    assert p.returncode == 0 and "because --no-draft given" in p.stderr, p.stderr


T_REPO = "org/Tiny-LFM2-GGUF"


def test_one_repo_pair_whose_draft_is_not_cached_says_so(ggufdspark_cli, small_pair, isolated, tmp_path,
                                                           monkeypatch):
    """A one-repo pair (``publish --single-repo``: the target repo holds the dspark- draft) whose
    target alone is in the cache: offline, or with the Hub unreachable, it was served without the
    draft, no warning, "because --no-draft given". Now a WARNING names the missing dspark- draft and
    the repo, and the reason is the true one. Served without the draft all the same (as llama-server
    -hf serves a repo without one)."""
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "MODEL_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with FakeHub(token="hf_sweep3servetoken0000") as hub:
        env = {**isolated, "HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_sweep3servetoken0000",
               "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HUGGING_FACE_HUB_TOKEN": ""}
        p = ggufdspark_cli("publish", "--repo", "org/Tiny-LFM2", "--single-repo", "--target", str(small_pair.target),
                           "--draft", str(small_pair.draft), env=env)
        assert p.returncode == 0, p.stderr
        files = set(hub.files(T_REPO))
        (draft_name,) = [f for f in files if f.startswith("dspark-")]
        (target_name,) = [f for f in files if f.endswith(".gguf") and f != draft_name]
        tag = re.search(r"-(F16|Q8_0)\.gguf$", target_name).group(1)
        ref = f"{T_REPO}:{tag}"
        # online, the draft is found beside the target (and downloaded)
        p = ggufdspark_cli("serve", "-hf", ref, "--dry-run", env=env)
        assert p.returncode == 0, p.stderr
        assert f"-md " in p.stdout and draft_name in p.stdout, p.stdout
        # a fresh cache that holds the target only (--no-draft downloads no draft)
        env["HF_HOME"] = str(tmp_path / "hf-home-2")
        p = ggufdspark_cli("serve", "-hf", ref, "--no-draft", "--dry-run", env=env)
        assert p.returncode == 0, p.stderr
        cached = [f.name for f in (tmp_path / "hf-home-2").rglob("*.gguf")]
        assert target_name in cached and draft_name not in cached, cached
    for how, extra in (("offline", {"HF_HUB_OFFLINE": "1"}), ("unreachable", {})):
        p = ggufdspark_cli("serve", "-hf", ref, "--dry-run", env={**env, **extra})
        assert p.returncode == 0, (how, p.stderr)
        assert "--no-draft given" not in p.stderr, (how, p.stderr)
        assert re.search(rf"because no draft: -md not given and {T_REPO} has no dspark- file in the Hugging Face "
                         r"cache", p.stderr), (how, p.stderr)
        warning = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING: ") and "dspark-" in ln]
        assert len(warning) == 1, (how, p.stderr)
        assert ref in warning[0] and "WITHOUT a draft" in warning[0] and "-md" in warning[0], warning
        assert " -md " not in p.stdout, p.stdout


# ----------------------------------------------------------------------------- row 5: busy is not hung


# llama-server's HTTP pool: --threads-http fixed threads plus at most 1024 more on demand
# (tools/server/server-http.cpp); every open connection holds one while it runs
HTTP_THREADS = 2
HTTP_POOL = HTTP_THREADS + 1024


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _held_connections(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that each hold one of the engine's HTTP threads: a request whose headers
    never end keeps its thread reading until the engine's read timeout (600 s)."""
    held = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: never complete
            held.append(s)
    except BaseException:
        for s in held:
            s.close()
        raise
    return held


def _health_answers(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, TimeoutError):
        return False


class _LongStream:
    """A streaming completion that runs until closed, its chunks read (and dropped) in a thread so
    that the engine never waits on its socket: the engine busy, its log moving."""

    def __init__(self, url: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", _port_of(url), timeout=60)
        body = {"prompt": "The model", "n_predict": 60000, "ignore_eos": True, "stream": True,
                "cache_prompt": False}
        self.conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status
        self.chunks = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while self.resp.readline():
                self.chunks += 1
        except (OSError, ValueError, http.client.HTTPException):
            pass

    def close(self) -> None:
        """Cut the connection (the engine cancels the request), then let the reader end."""
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.thread.join(10)
        self.conn.close()


@pytest.mark.slow
def test_a_busy_engine_whose_http_pool_is_full_is_not_restarted(small_pair, dspark_engine, tmp_path):
    """Every HTTP thread of the engine busy (held connections, one long generation), so /health
    queues and answers nothing for longer than the health timeout, while the engine works and its
    log moves: before the fix the watchdog restarted it (the issue: 1093 of 1100 requests in flight
    dropped). Now it is left alone; once the pool frees, it answers again, same process."""
    timeout = 8  # polls every 2 s; the engine logs a generating slot's progress every 3 s
    log = tmp_path / "engine.log"
    s = ServeRun(tmp_path, *_pair_args(small_pair), "--ctx-per-slot", "65536", "--health-timeout", str(timeout),
                 "--log", str(log), "--", "--threads-http", str(HTTP_THREADS), env=_serve_env(tmp_path, dspark_engine))
    held: list[socket.socket] = []
    stream = None
    try:
        url, pid = s.ready()
        stream = _LongStream(url)  # one thread, generating until closed
        held = _held_connections(_port_of(url), HTTP_POOL - 1)  # every other thread
        t0 = time.monotonic()
        assert not _health_answers(url, timeout=2), "the HTTP pool is not full: /health still answers"
        size = log.stat().st_size
        # the old watchdog restarted the engine once /health was silent for the timeout (8 s, polled
        # every 2 s): give it twice that, watching that the engine works all along
        while time.monotonic() - t0 < 2 * timeout + 4:
            assert "stopped answering /health" not in s.err() and "restart" not in s.err(), s.err()[-3000:]
            assert s.proc.poll() is None and _alive(pid)
            time.sleep(0.25)
        assert log.stat().st_size > size and stream.chunks > 0, "the engine did not work while its pool was full"
        assert not _health_answers(url, timeout=1), "the pool freed during the test: it proves nothing"
        for h in held:
            h.close()
        held = []
        stream.close()
        stream = None
        deadline = time.monotonic() + 60
        while not _health_answers(url, timeout=2):
            assert time.monotonic() < deadline, "the engine never answered /health again"
        assert _alive(pid) and "stopped answering" not in s.err() and "ready again" not in s.err(), s.err()[-3000:]
        assert s.stop() == 0, s.err()[-3000:]
    finally:
        for h in held:
            h.close()
        if stream:
            stream.close()
        s.cleanup()


# ----------------------------------------------------------------------------- row 6: a crash loop


@pytest.mark.slow
def test_crashes_count_toward_the_limit_only_within_the_restart_window(small_pair, dspark_engine, tmp_path):
    """With --max-restarts 1, the second crash ended serve however far apart the two were. Now an
    engine that served --restart-window seconds after a crash starts the count again; two crashes
    within the window still end it (a crash loop)."""
    s = ServeRun(tmp_path, *_pair_args(small_pair), "--max-restarts", "1", "--restart-window", "3", "--json",
                 env=_serve_env(tmp_path, dspark_engine))
    try:
        _, pid = s.ready()
        assert f"llama-server pid {pid}" in s.err()  # the pid to signal, reported
        os.kill(pid, signal.SIGKILL)
        line = s.wait_for(r"^llama-server was killed by SIGKILL.*$").group(0)
        assert "restart 1/1" in line, line
        _, pid = s.ready(count=2)
        s.wait_for(r"^llama-server served 3s since its last crash: the restart count starts again$")
        os.kill(pid, signal.SIGKILL)
        line = s.wait_for(r"^llama-server was killed by SIGKILL.*$", count=2).group(0)
        assert "restart 1/1" in line, line  # counted from 0 again: before, this crash ended serve
        _, pid = s.ready(count=3)
        os.kill(pid, signal.SIGKILL)  # within 3 s of the restart: the loop ends serve
        assert s.finish() == 1
        err = s.err()
        assert "llama-server failed 2 time(s) (last: it was killed by SIGKILL (signal 9)); giving up" in err, err
        assert "Traceback" not in err
        events = [r["event"] for r in s.records()]
        assert events == ["ready", "restart", "ready", "restarts_reset", "restart", "ready", "gave_up"], events
        assert [r["pid"] for r in s.records() if r["event"] == "ready"] == s.pids
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- row 7: restarts, --json


def _plan(pair, dspark_engine, **kw):
    from ggufdspark.serve import ServingOptions, plan

    return plan(ServingOptions(model=pair.target, draft=pair.draft, port=0, server=dspark_engine.path, draft_n_max=3,
                               ui=False, use_profile=False, **kw))


@pytest.mark.parametrize("max_restarts", [5, 1])
def test_a_restart_that_finds_its_port_taken_is_retried(small_pair, dspark_engine, tmp_path, isolated,
                                                        max_restarts):
    """The engine killed; while serve waits to restart it, its port is taken (here by this test, from
    the restart event, so the order is certain): that ended serve with rc 1 ("use --port 0") with the
    restarts unused, and no final event. Now it counts as one more crash and is retried; with the
    budget spent, a ``gave_up`` event names the port."""
    from ggufdspark.errors import EngineError
    from ggufdspark.supervise import supervise

    p = _plan(small_pair, dspark_engine)
    records: list[dict] = []
    holder: list[socket.socket] = []

    def on_record(rec: dict) -> None:
        records.append(rec)
        if rec["event"] == "ready" and rec["restarts"] == 0:
            os.kill(_engine_of(os.getpid()), signal.SIGKILL)
        elif rec["event"] == "restart" and rec["restarts"] == 1:  # the engine is gone: take its port
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p.settings.port))
            s.listen()
            holder.append(s)
        elif rec["event"] == "restart" and rec["restarts"] == 2:
            holder.pop().close()
        elif rec["event"] == "ready":
            os.kill(os.getpid(), signal.SIGINT)  # stops supervise, as Ctrl-C does

    try:
        if max_restarts == 1:
            with pytest.raises(EngineError, match=r"failed 2 time\(s\) \(last: it could not start again: port \d+ "
                                                  r"on 127\.0\.0\.1 is already in use"):
                supervise(p, log_path=tmp_path / "serve.log", max_restarts=1, backoff=(0.2,), on_record=on_record)
        else:
            assert supervise(p, log_path=tmp_path / "serve.log", max_restarts=5, backoff=(0.2,),
                             on_record=on_record) == 0
    finally:
        for s in holder:
            s.close()
        for r in records:  # the engines this test started, should an assertion have cut it short
            if r.get("pid") and _alive(r["pid"]):
                os.kill(r["pid"], signal.SIGKILL)
    events = [r["event"] for r in records]
    port_cause = f"llama-server could not start again: port {p.settings.port} on 127.0.0.1 is already in use"
    if max_restarts == 1:
        assert events == ["ready", "restart", "gave_up"], records
        assert records[-1]["cause"].startswith(port_cause), records[-1]
    else:
        assert events == ["ready", "restart", "restart", "ready", "stopping"], records
        assert records[1]["cause"] == "llama-server was killed by SIGKILL (signal 9)", records[1]
        assert records[2]["cause"].startswith(port_cause), records[2]
        assert records[3]["restarts"] == 2 and records[3]["url"] == records[0]["url"]
        assert _wait_gone(records[3]["pid"], 10)


def test_json_stream_ends_with_why_when_the_first_start_fails(ggufdspark_cli, small_pair, isolated, tmp_path):
    """A failed first start printed the error on stderr and nothing on stdout: a reader of --json
    waited for an event that never came. Now the last JSON line is ``failed`` with the cause; also
    for an error before anything started."""
    bad = _wrong_shape(small_pair.target, tmp_path / "wrong-shape-F16.gguf")
    p = ggufdspark_cli("serve", "-m", str(bad), "--port", "0", "--no-ui", "--json", "--start-timeout", "60",
                       env={**isolated, "XDG_STATE_HOME": str(tmp_path / "state")}, timeout=120)
    line = _error_line(p, "during start")
    recs = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert recs and recs[-1]["event"] == "failed", p.stdout
    assert "during start" in recs[-1]["cause"] and recs[-1]["cause"] in line, (recs[-1], line)
    assert recs[-1]["log"] and Path(recs[-1]["log"]).is_file()

    p = ggufdspark_cli("serve", "-m", str(tmp_path / "nothing.gguf"), "--json", env=isolated)
    line = _error_line(p, "nothing.gguf")
    recs = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [r["event"] for r in recs] == ["failed"] and "nothing.gguf" in recs[0]["cause"], p.stdout


def test_json_stream_ends_with_gave_up_after_the_last_restart(small_pair, dspark_engine, tmp_path):
    s = ServeRun(tmp_path, *_pair_args(small_pair), "--max-restarts", "0", "--json",
                 env=_serve_env(tmp_path, dspark_engine))
    try:
        _, pid = s.ready()
        os.kill(pid, signal.SIGKILL)
        assert s.finish() == 1
        recs = s.records()
        assert [r["event"] for r in recs] == ["ready", "gave_up"], recs
        assert recs[-1]["cause"] == "llama-server was killed by SIGKILL (signal 9)"
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- row 10: engine environment


KEY = "sk-sweep3-env-key"


def _status(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("how", ["LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE"])
def test_an_api_key_in_the_environment_is_followed(small_pair, dspark_engine, tmp_path, how):
    """llama-server reads LLAMA_API_KEY (and LLAMA_ARG_API_KEY_FILE) itself: the engine required a key
    that serve's warm-up (and bench's and tune's requests) never sent, 401 on each. Now the key joins
    serve's private key file: the warm-up passes, the engine still refuses requests without it, and
    the key shows nowhere (output, log, command line)."""
    if how == "LLAMA_API_KEY":
        extra = {"LLAMA_API_KEY": KEY}
    else:
        (tmp_path / "keys").write_text(f"# the user's key file\n{KEY}\n")
        extra = {"LLAMA_ARG_API_KEY_FILE": str(tmp_path / "keys")}
    log = tmp_path / "engine.log"
    s = ServeRun(tmp_path, *_pair_args(small_pair), "--warmup", "--log", str(log),
                 env=_serve_env(tmp_path, dspark_engine, **extra))
    try:
        url, pid = s.ready()
        err = s.err()
        assert "warm-up request failed" not in err and "warmed up in" in err, err[-3000:]
        assert _status(url) == 401 and _status(url, KEY) == 200
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert "--api-key-file" in cmdline and KEY not in cmdline, cmdline
        assert how not in environ.split("\0")[0] and f"{how}=" not in environ
        assert s.stop() == 0
        assert KEY not in s.err() + s.out_path.read_text() + log.read_text(errors="replace")
    finally:
        s.cleanup()


def test_bench_and_tune_servers_follow_the_environments_key(small_pair, dspark_engine, tmp_path, monkeypatch):
    """bench and tune ask their engines through ``ServerProcess.client()``: with LLAMA_API_KEY set,
    every one of their requests got 401."""
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    monkeypatch.setenv("LLAMA_API_KEY", KEY)
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, draft=small_pair.draft,
                              draft_n_max=3, ctx_size=512)
    with ServerProcess(settings, log_path=tmp_path / "bench.log", start_timeout=60) as srv:
        assert srv.client().complete("The model", n_predict=4).timings.predicted_n == 4
        assert _status(srv.url) == 401
    assert KEY not in " ".join(settings.redacted()) and KEY not in json.dumps(settings.redacted_dict())


def test_an_api_prefix_is_refused_or_left_out(ggufdspark_cli, small_pair, dspark_engine, isolated, tmp_path):
    """--api-prefix moves /health: after -- it was passed on and a working engine was killed at the
    start timeout; LLAMA_ARG_API_PREFIX in the environment did the same. Now the flag is refused
    like the others serve owns, and the variable is left out of the engine's environment with a
    warning."""
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--port", "0",
                       "--", "--api-prefix", "/v9", env=isolated, timeout=60)
    assert p.returncode == 2, p.stderr
    _one_line(p, "'--api-prefix' after --", "/health")
    s = ServeRun(tmp_path, *_pair_args(small_pair), "--start-timeout", "30",
                 env=_serve_env(tmp_path, dspark_engine, LLAMA_ARG_API_PREFIX="/v9"))
    try:
        url, pid = s.ready()
        assert re.search(r"^WARNING: LLAMA_ARG_API_PREFIX in the environment is ignored", s.err(), re.M), s.err()
        assert _health_answers(url, 5) and _status(url) == 200
        assert "LLAMA_ARG_API_PREFIX=" not in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        assert s.stop() == 0
    finally:
        s.cleanup()


# ----------------------------------------------------------------------------- row 18: the start error


def _wrong_shape(src: Path, dst: Path) -> Path:
    """The model ``src`` with its first attention K tensor of the wrong shape (data zero), which the
    engine's loader refuses (``check_tensor_dims``); every header reader takes it."""
    from ggufdspark.gguffile.constants import TensorType
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.gguffile.writer import GGUFWriter, tensor_nbytes

    g = read_gguf(src)
    name = next(n for n in g.tensors if n.endswith(".attn_k.weight"))
    rows, cols = g.tensors[name].shape
    shapes = {name: (rows + 16, cols)}
    w = GGUFWriter(dst)
    for key, value in g.metadata.items():
        w.add(key, value, *g.value_types[key])
    for n, t in g.tensors.items():
        w.add_tensor(n, shapes.get(n, t.shape), TensorType(t.type))
    w.write(lambda n: [b"\0" * tensor_nbytes(shapes[n], TensorType(g.tensors[n].type))] if n in shapes
            else [bytes(g.tensor_bytes(n))], force=True)
    return dst


def test_start_error_quotes_the_loaders_first_error(small_pair, dspark_engine, tmp_path, ggufdspark_cli, isolated):
    """A draft with a tensor of the wrong shape: the start error quoted "failed to load draft model",
    while the cause (``check_tensor_dims: ... wrong shape``) was only in the log. The runner's error
    and serve's (``--force``: ``check`` may refuse the draft first) quote the loader's line."""
    from ggufdspark.errors import ServerStartError
    from ggufdspark.runners.server import ServerProcess, ServerSettings

    bad = _wrong_shape(small_pair.draft, tmp_path / "dspark-wrong-shape-F16.gguf")
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, draft=bad, draft_n_max=3,
                              ctx_size=512)
    with pytest.raises(ServerStartError) as e:
        ServerProcess(settings, log_path=tmp_path / "start.log", start_timeout=60).start()
    first = str(e.value).splitlines()[0]
    assert re.search(r"during start \(the draft model failed to load: check_tensor_dims: tensor "
                     r"'blk\.\d+\.attn_k\.weight' has wrong shape; expected \d+, \d+, got \d+, \d+", first), first
    p = ggufdspark_cli("serve", "-m", str(small_pair.target), "-md", str(bad), "--force", "--port", "0", "--no-ui",
                       env={**isolated, "XDG_STATE_HOME": str(tmp_path / "state")}, timeout=120)
    line = _error_line(p, "check_tensor_dims", "wrong shape")
    assert "the draft model failed to load" in line, line
