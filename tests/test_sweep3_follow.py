"""Issue 64 rows 8, 9 and 11, and issue 63's follower that outlived its test.

* Row 8: ``timings --follow`` (and serve's stats line, the same ``LogWindow``) kept a request of a
  dead engine, or of a log cut by logrotate's ``copytruncate``, "running" for ever, and polled a
  deleted log silently for ever.
* Row 9: one log line over 16 MiB stopped all counting for good.
* Row 11: SIGTERM / SIGHUP during ``convert``, ``convert-target``, ``quantize`` and ``generate`` left
  hidden half-written files (and ``generate``'s re-run refused the non-empty directory).
* Issue 63: a follower started with SIGINT ignored (a background job of a script, ``nohup``) could
  only be ended by SIGKILL.

Everything here reads real engine logs (the captured ``tests/fixtures/timings/draft.log``, or a
llama-server of the built engine) and runs the verbs as real processes.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ggufdspark import timings as tm
from ggufdspark.timings.live import LogWindow

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "timings"
DRAFT_LOG = FIXTURES / "draft.log"  # captured from the engine: start banner, then requests
MAX_LINE = 1 << 24  # 16 MiB: what a take reads at most, and the longest line counted


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _end(p: subprocess.Popen, *, wait: float = 10.0) -> None:
    """Stop a child whatever the signal dispositions it inherited: SIGINT, then SIGTERM, then SIGKILL."""
    for stop in (lambda: p.send_signal(signal.SIGINT), p.terminate, p.kill):
        if p.poll() is not None:
            return
        stop()
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            pass
    p.wait()


def _follower(log: Path, *, every: float = 0.2, preexec_fn=None) -> subprocess.Popen:
    """``ggufdspark timings --follow LOG --json``, returned once its window is open."""
    p = subprocess.Popen([sys.executable, "-m", "ggufdspark", "timings", "--follow", str(log), "--every", str(every),
                          "--json"], cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec_fn)
    assert p.stderr is not None
    first = p.stderr.readline()
    if not first.startswith("following "):
        _end(p)
        pytest.fail(f"timings --follow did not start: {first}{p.stderr.read()}")
    return p


def _launch_line_end(data: bytes, task: int) -> int:
    """Where the engine's ``launch_slot_`` line of ``task`` ends in ``data``."""
    at = data.index(f"launch_slot_: id  0 | task {task} |".encode())
    return data.index(b"\n", at) + 1


def _tasks(data: bytes) -> list[int]:
    return [r.task_id for r in tm.parse(data.decode(), format="log", allow_plain=True)]


# ------------------------------------------------------------------------------------- row 8


def test_a_new_engine_on_the_log_ends_the_old_engines_running_requests(tmp_path):
    """The engine dies mid-request (its launch line is the last it wrote) and a new engine starts on
    the same log (``serve`` restarting it, or a user's own restart): once the new engine's start
    line is read, the dead request no longer counts as running, and the new engine's requests are
    counted as usual."""
    data = DRAFT_LOG.read_bytes()
    last = _tasks(data)[-1]
    old = data[:_launch_line_end(data, last)]  # the old engine, killed while running its last request
    new = data[:data.index(f"launch_slot_: id  0 | task {last} |".encode())]  # one that never reaches it
    new = new[:new.rfind(b"\n") + 1]
    log = tmp_path / "server.log"
    log.write_bytes(old)
    window = LogWindow(log, from_end=False)
    assert window.take().running == 1
    with open(log, "ab") as f:
        f.write(new)
    st = window.take()
    assert st.requests == len(_tasks(new)) and st.running == 0, st
    assert window.take().running == 0


def test_a_truncated_log_ends_the_running_requests_and_is_read_anew(tmp_path):
    """logrotate's ``copytruncate`` empties the log in place while the engine goes on appending.
    Whether the next read finds it shorter than before, or already grown past where it was
    (the old reader then went on from the old offset, in the middle of other lines), it is read
    from its start and what ran before the cut no longer counts as running."""
    data = DRAFT_LOG.read_bytes()
    tasks = _tasks(data)
    head = data[:_launch_line_end(data, tasks[1])]  # the second request launched, not released
    after = data[data.index(f"release: id  0 | task {tasks[1]} |".encode()):]
    after = after[after.index(b"\n") + 1:]  # what the engine writes after that request's release
    assert len(after) > len(head)
    log = tmp_path / "server.log"

    log.write_bytes(head)
    window = LogWindow(log, from_end=False)
    assert window.take().running == 1
    log.write_bytes(b"")  # cut: shorter than before at the next read
    assert window.take().running == 0

    log.write_bytes(head)
    window = LogWindow(log, from_end=False)
    assert window.take().running == 1
    log.write_bytes(after)  # cut and grown past the old end before the next read
    st = window.take()
    assert st.running == 0, st
    assert st.requests == len(_tasks(after)) > 0, st


def test_follow_ends_with_one_line_when_the_log_is_deleted(tmp_path):
    """A follower whose log is deleted (the test that started the engine cleaned up, a user removed
    old logs) says so in one line and exits 4 instead of polling the missing path for ever."""
    log = tmp_path / "server.log"
    shutil.copy(DRAFT_LOG, log)
    p = _follower(log)
    try:
        log.unlink()
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("timings --follow went on polling a deleted log")
    finally:
        _end(p)
    assert p.returncode == 4, (p.returncode, err)
    assert err.strip().splitlines() == [f"ggufdspark: error: {log}: the log is gone (deleted or moved away); "
                                        "stopped following"], err
    assert out == ""


def test_follow_after_a_real_engine_restart_counts_no_dead_request(small_pair, start_server):
    """A real llama-server killed mid-request and started again on the same log: the follower's line
    that reports the new engine's request says 0 running (the old code said 1 running for ever,
    and printed "0 requests done, 1 running" every interval while idle)."""
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=4, parallel=1, ctx_size=4096)
    p = _follower(srv.log_path)
    try:
        c = srv.client(timeout=120)
        c.complete("First", n_predict=8)  # so the killed request's task id is not the new engine's first
        long = threading.Thread(target=_swallow, args=(c.complete, "Run long", 4000), daemon=True)
        long.start()
        launch = srv.wait_for_log(r"launch_slot_: id +\d+ \| task \d+", timeout=60, count=2)[-1]
        srv.kill()  # killed mid-request: no timing block, no release
        srv.proc.wait(30)
        text = srv.log_text()
        assert "stop processing" not in text[text.index(launch):], "the long request ended before the kill"
        srv.start()  # a new engine on the same log
        srv.client(timeout=120).complete("After the restart", n_predict=12)
        srv.wait_for_log("stop processing", count=2)  # the first request's and this one's
        killed = re.search(r"\| task (\d+)", launch)[1]
        assert killed not in re.findall(r"launch_slot_: id +\d+ \| task (\d+)", srv.run_log_text()), \
            "the new engine reused the killed request's task id: its release would hide the defect"
        lines = []
        while sum(x["requests"] for x in lines) < 2:
            line = p.stdout.readline()
            assert line, f"timings --follow ended early: {lines}, {p.stderr.read()}"
            lines.append(json.loads(line))
        assert lines[-1]["running"] == 0, lines
    finally:
        _end(p)


def _swallow(fn, *args) -> None:
    try:
        fn(args[0], n_predict=args[1])
    except Exception:  # the engine is killed under this request, on purpose
        pass


# ------------------------------------------------------------------------------------- row 9


def test_a_line_over_16_mib_is_skipped_and_counting_goes_on(tmp_path, caplog):
    """A single line longer than the window reads at once (16 MiB) held the read offset in place
    for good: nothing after it was ever counted. It is skipped with a warning naming the log, and
    the requests before and after it are all counted, once."""
    data = DRAFT_LOG.read_bytes()
    whole = len(_tasks(data))
    log = tmp_path / "server.log"
    log.write_bytes(data + b"x" * (MAX_LINE + 5) + b"\n" + data + b"y" * (2 * MAX_LINE) + b"\n" + data)
    window = LogWindow(log, from_end=False)
    total = 0
    with caplog.at_level(logging.WARNING, logger="ggufdspark.timings.live"):
        for _ in range(12):  # each take reads at most 16 MiB
            total += window.take().requests
    assert total == 3 * whole, total
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 2 and all(m.startswith(f"{log}: a line of more than 16 MiB at byte ") for m in skipped)

    # the same while the long line is still being written: nothing is counted twice or lost
    log.write_bytes(data)
    window = LogWindow(log, from_end=False)
    assert window.take().requests == whole
    with open(log, "ab") as f:
        f.write(b"z" * (MAX_LINE + 1))
    assert window.take().requests == 0
    with open(log, "ab") as f:
        f.write(b"z" * 1000 + b"\n" + data)
    assert sum(window.take().requests for _ in range(3)) == whole


# ------------------------------------------------------------------------ issue 63: the follower


def test_follow_stopped_by_sigint_sigterm_and_sighup(tmp_path):
    """Ctrl-C, SIGTERM and SIGHUP all end a follower cleanly: exit 0, no traceback."""
    log = tmp_path / "server.log"
    shutil.copy(DRAFT_LOG, log)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        p = _follower(log)
        try:
            p.send_signal(sig)
            out, err = p.communicate(timeout=30)
        finally:
            _end(p)
        assert p.returncode == 0 and "Traceback" not in err, (sig, p.returncode, err)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_follow_with_sigint_ignored_ends_on_sigterm_and_sighup(tmp_path, sig):
    """A follower that inherited SIGINT ignored (a background job of a script without job control,
    ``nohup``: issue 63 found 12 of them left polling deleted logs) keeps it ignored, as POSIX
    programs do, and ends on SIGTERM or SIGHUP with exit 0."""
    log = tmp_path / "server.log"
    shutil.copy(DRAFT_LOG, log)
    p = _follower(log, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        status = Path(f"/proc/{p.pid}/status").read_text()
        ignored = int(next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGINT - 1)), "the follower did not inherit SIGINT ignored"
        p.send_signal(sig)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timings --follow with SIGINT ignored did not end on {sig.name}")
    finally:
        _end(p)
    assert p.returncode == 0 and "Traceback" not in err, (p.returncode, err)


# ------------------------------------------------------------------------------------ row 11

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), spelled out for Pythons before 3.10


def _stalled_stderr() -> tuple[int, int]:
    """A pipe already full: the first line a child writes to it blocks until it is read, as a
    terminal paused with Ctrl-S (or an SSH link that stopped) holds a writer. Returns (read end,
    write end)."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"." * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    return r, w


def _drain(fd: int, p: subprocess.Popen, timeout: float = 120) -> str:
    """Read ``fd`` until ``p`` has exited and nothing more comes (the filler dots dropped)."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
        elif p.poll() is not None:
            break
    return b"".join(chunks).decode(errors="replace").lstrip(".")


def _wait_for(what, p: subprocess.Popen, timeout: float = 120):
    """Poll ``what()`` until it returns something true, while ``p`` runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := what():
            return found
        if p.poll() is not None:
            return None
        time.sleep(0.005)
    return None


def _wait_stopped(pid: int, timeout: float = 30) -> None:
    """Wait until ``pid`` is really stopped (state ``T``): SIGSTOP takes effect asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rindex(")") + 2] in "Tt":
            return
        time.sleep(0.001)
    pytest.fail(f"process {pid} did not stop within {timeout}s")


def _partials(d: Path) -> list[str]:
    return sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.name.startswith(".") or ".part" in f.name)


def _signal_mid_write(argv: list[str], out_dir: Path, sig: int, env: dict[str, str]) -> tuple[int, str]:
    """Run ``ggufdspark ARGV`` with a stalled stderr, wait for its hidden partial output in
    ``out_dir`` (the verb is then held mid-write by its next progress line), send ``sig``.
    Returns (exit code, stderr)."""
    r, w = _stalled_stderr()
    try:
        # PYTHONFAULTHANDLER: a SIGABRT makes the child print every thread's stack (a hang's diagnosis)
        p = subprocess.Popen([sys.executable, "-m", "ggufdspark", *argv], cwd=REPO, env={**env, "PYTHONFAULTHANDLER": "1"},
                             stdout=subprocess.DEVNULL, stderr=w, stdin=subprocess.DEVNULL)
        os.close(w)
        try:
            if not _wait_for(lambda: _partials(out_dir), p):
                pytest.fail(f"{argv[0]}: no partial output appeared in {out_dir} (exit {p.poll()}): {_drain(r, p)}")
            p.send_signal(sig)
            err = _drain(r, p)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGABRT)
                pytest.fail(f"{argv[0]} still ran 180 s after {signal.Signals(sig).name}; its stderr: {err[-1500:]!r}; "
                            f"its threads at SIGABRT: {_drain(r, p, timeout=30)[-6000:]}")
        finally:
            _end(p)
    finally:
        os.close(r)
    return p.returncode, err


def _assert_stopped(what: str, rc: int, err: str, sig: int) -> None:
    assert rc == 128 + sig, (what, rc, err)
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"ggufdspark: stopped by {signal.Signals(sig).name}", (what, err)


SIGNALS = pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])


@SIGNALS
def test_convert_and_convert_target_stopped_mid_write_leave_nothing(small_pair, tmp_path, sig):
    """``convert`` and ``convert-target`` stopped by SIGTERM / SIGHUP while writing: exit 128 + the
    signal, one line, and no hidden ``.NAME.XXXX.part`` (nor any output) left in the directory."""
    out = tmp_path / "out"
    out.mkdir()
    for argv in (["convert", str(small_pair.drafter_dir), "--target", str(small_pair.target), "-o", str(out / "d.gguf")],
                 ["convert-target", str(small_pair.target_dir), "-o", str(out / "t.gguf")]):
        rc, err = _signal_mid_write(argv, out, sig, _env())
        assert sorted(os.listdir(out)) == [], f"{argv[0]} left {sorted(os.listdir(out))}"
        _assert_stopped(argv[0], rc, err, sig)


@SIGNALS
def test_quantize_stopped_mid_write_leaves_nothing(small_pair, dspark_engine, tmp_path, sig):
    """``quantize`` stopped by SIGTERM / SIGHUP while llama-quantize writes: llama-quantize ended,
    no hidden ``.NAME.XXXX.partial`` left, no output."""
    out = tmp_path / "out"
    out.mkdir()
    env = _env(GGUFDSPARK_CACHE=str(tmp_path / "cache"), GGUFDSPARK_SERVER=str(dspark_engine.path))
    rc, err = _signal_mid_write(["quantize", str(small_pair.target), "--type", "Q8_0", "-o", str(out / "q.gguf")],
                                out, sig, env)
    assert sorted(os.listdir(out)) == [], f"quantize left {sorted(os.listdir(out))} (exit {rc}): {err}"
    _assert_stopped("quantize", rc, err, sig)


@SIGNALS
def test_generate_stopped_mid_write_leaves_nothing_and_reruns(tmp_path, sig):
    """``generate`` stopped by SIGTERM / SIGHUP while writing a checkpoint leaves no directory
    behind, and the same command run again works (it refused "directory is not empty").

    The full-size target takes many seconds to write: the process is frozen (SIGSTOP) once its
    ``model*.safetensors.part`` exists, so it is known to be mid-write when the signal comes."""
    gen = tmp_path / "gen"
    env = _env()
    p = subprocess.Popen([sys.executable, "-m", "ggufdspark", "generate", str(gen), "--size", "full", "--only", "target"],
                         cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        caught = False
        while not caught and p.poll() is None:
            if not _wait_for(lambda: list(gen.glob("target/*.safetensors.part")), p):
                break
            p.send_signal(signal.SIGSTOP)
            _wait_stopped(p.pid)
            caught = bool(list(gen.glob("target/*.safetensors.part")))  # frozen mid-write: it stays so
            if not caught:
                p.send_signal(signal.SIGCONT)
        if not caught:
            pytest.fail(f"generate was never caught mid-write: exit {p.poll()}")
        p.send_signal(sig)
        p.send_signal(signal.SIGCONT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
        _end(p)
    left = sorted(str(f.relative_to(gen)) for f in gen.rglob("*")) if gen.exists() else None
    again = subprocess.run([sys.executable, "-m", "ggufdspark", "generate", str(gen)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert left is None, f"generate left {gen} with {left}; the re-run said: {again.stderr.strip()}"
    assert again.returncode == 0, again.stderr
    _assert_stopped("generate", p.returncode, err, sig)
    assert (gen / "target" / "model.safetensors").is_file() and (gen / "drafter" / "model.safetensors").is_file()
