"""``serve``'s supervision: run the planned llama-server, restart it when it dies or hangs (within a
crash budget that a quiet spell resets), print a line of what finished every few seconds, and stop
on Ctrl-C, SIGTERM or SIGHUP, ending only the processes it started."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Callable

from ggufdspark import warmup
from ggufdspark.errors import EngineError, PortInUseError, ServerStartError
from ggufdspark.runners.deaths import engine_error_line, exit_cause
from ggufdspark.runners.server import ServerProcess
from ggufdspark.runners.watchdog import HealthWatch, note_in_log
from ggufdspark.serve import ServePlan
from ggufdspark.timings.live import IntervalStats, LogWindow, stats_line

log = logging.getLogger(__name__)

class _Stop(Exception):
    pass


# Signals that stop ``supervise``: Ctrl-C, kill / systemd / timeout, and a closed terminal or SSH link.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# The health watchdog: /health is answered by llama-server's HTTP threads, not its decode loop
# (tools/server/server-context.cpp get_health), but every connection holds one of those threads
# while its request runs, and the pool is n_parallel + 4 threads (or --threads-http) plus at most
# 1024 more (server-http.cpp): with more connections waiting than that, /health queues behind them.
# So silence alone is no hang: an engine whose /health answered nothing for this long while its log
# did not grow either (no request started or finished) is hung and is restarted (``HealthWatch``).
HEALTH_TIMEOUT_S = 60.0
# A crash counts toward ``max_restarts`` until the engine has then served this long without one;
# after that the count starts again: a crash loop ends serve, a crash a week does not (systemd
# counts starts within StartLimitIntervalSec; Kubernetes resets its crash-loop back-off after ten
# minutes of running). A restart that never becomes ready never resets it, however long it takes.
RESTART_WINDOW_S = 600.0
# serve's throughput and acceptance line (``supervise``'s ``stats_every``): vLLM's servers log theirs
# every 5-10 s by default
STATS_EVERY_S = 10.0


def supervise(p: ServePlan, *, log_path: str | Path, start_timeout: float = 300.0, max_restarts: int = 5,
              backoff: tuple[float, ...] = (1, 2, 4, 8, 16), health_timeout: float | None = HEALTH_TIMEOUT_S,
              restart_window: float | None = RESTART_WINDOW_S,
              on_event: Callable[[str], None] = lambda msg: None,
              on_ready: Callable[[str], None] = lambda url: None,
              on_record: Callable[[dict], None] = lambda rec: None, stats_every: float | None = None) -> int:
    """Run the server until SIGINT, SIGTERM or SIGHUP; restart it (bounded backoff) when it crashes
    or hangs.

    A hang: ``/health`` answered nothing for ``health_timeout`` seconds (None or 0: never checked)
    and the engine's log did not grow meanwhile (``HealthWatch``: a busy engine's HTTP pool may
    queue ``/health`` behind its requests, but its log moves as they start and finish). An answer of
    any status counts (503 while a model loads is an answer). The cause of every restart (the exit
    code or signal, or the hang) goes to ``on_event`` and into the engine's log.

    A restart that fails (the port taken meanwhile, the engine dying while it loads or on its
    warm-up) counts as one more crash and is retried after the next pause. More than
    ``max_restarts`` crashes end it; the count starts again once an engine has served
    ``restart_window`` seconds after its last crash (None or 0: never; ``RESTART_WINDOW_S``).

    ``on_event`` gets each supervision event as a line; ``on_record`` the same event as a dict
    (``event``: ``ready`` / ``restart`` / ``restarts_reset`` / ``stats`` / ``stopping`` /
    ``gave_up`` / ``failed``, ``restarts`` so far, ``url``, ``pid`` (the engine's, in ``ready``),
    ``cause`` and ``engine_error``: the engine's own last error line, such as a CUDA error or a
    failed GGML_ASSERT, where its log has one). The last record is always ``stopping`` (a clean
    stop), ``gave_up`` (too many crashes) or ``failed`` (the first start failed, or anything else
    ended it; ``cause`` says what). ``on_ready`` gets the server's base URL once, when the first
    start is healthy (not again after a restart).

    A second such signal while stopping kills the engine at once instead of waiting for it.

    Where ``p.warmup`` is on, before each ready event the server is warmed up (``warmup.warm_up``):
    one greedy request through the drafted path, with a prompt of ``p.warmup.prompt_tokens`` tokens
    (0: a short one), so the first user's request does not pay the drafted path's one-time work. Its
    seconds and prompt size are the ready record's ``warmup_s`` and ``warmup_prompt_tokens`` (None:
    not warmed); it is not traffic for the stats; a failed one is
    said and served through; an engine that dies on it was never ready: on the first start that is a
    failed start (``ServerStartError``), after a restart one more crash.

    Every ``stats_every`` seconds (None or 0: never) in which a request finished or ran, what
    finished goes to ``on_event`` as a line (``timings.live.stats_line``: requests, tokens, the
    requests' decode speed, drafted and accepted tokens, accept length) and to ``on_record`` as
    ``event`` ``stats``, read from the engine's log (``timings.live.LogWindow``), as vLLM and
    SGLang servers log their throughput and acceptance.

    Returns:
        0 after a clean stop.

    Raises:
        ServerStartError / PortInUseError: the first start failed.
        EngineError: it crashed, hung or failed to restart more than ``max_restarts`` times in a row.
    """
    srv = ServerProcess(p.settings, log_path=log_path, start_timeout=start_timeout)
    stopping = False
    killed: list[int] = []

    def _on_signal(signum, frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise _Stop()
        # already stopping: no exception (it would cut the stop short), no printing (not re-entrant)
        killed.append(signum)
        srv.kill()

    old = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    crashes = 0  # counted toward max_restarts: since an engine last served restart_window seconds
    ended = False  # the final record was sent
    window = LogWindow(log_path) if stats_every else None
    next_stats = time.monotonic() + (stats_every or 0)
    try:
        srv.start()
        try:
            took = warmup.warmed(srv, p.warmup, window, on_event)
        except warmup.WarmUpDeath as e:  # never ready: a failed start, as a death while loading is
            note_in_log(log_path, f"llama-server {e}")
            raise ServerStartError(f"llama-server {e}; log: {log_path}") from None
        on_event(f"ready: {srv.url} (log: {log_path}), llama-server pid {srv.proc.pid}{warmup.note(took)}")
        on_record({"event": "ready", "url": srv.url, "pid": srv.proc.pid, "log": str(log_path), "restarts": 0,
                   **warmup.record(took)})
        on_ready(srv.url)
        watch = HealthWatch(srv, health_timeout)
        up_since = time.monotonic()
        while True:
            time.sleep(0.5)
            cause = watch.hung() if srv.alive() else exit_cause(srv.proc.returncode)
            if cause is None:
                if crashes and restart_window and time.monotonic() - up_since >= restart_window:
                    crashes = 0
                    on_event(f"llama-server served {restart_window:g}s since its last crash: the restart count "
                             "starts again")
                    on_record({"event": "restarts_reset", "restarts": 0, "after_s": restart_window})
                if window and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + stats_every
                    _say_stats(window.take(), on_event, on_record)
                continue
            srv.stop(timeout=5)  # a hung engine may ignore SIGTERM: killed after 5 s
            said = engine_error_line(srv.run_log_text())  # the CUDA error, the failed assert
            while True:  # restart until one is ready, within the budget
                crashes += 1
                why = f"{cause}: {said}" if said else cause
                note_in_log(log_path, f"llama-server {why}")
                rec = {"restarts": crashes - 1, "cause": f"llama-server {cause}", "engine_error": said,
                       "log": str(log_path)}
                if crashes > max_restarts:
                    ended = True
                    on_record({"event": "gave_up", **rec})
                    raise EngineError(f"llama-server failed {crashes} time(s) (last: it {why}); giving up; "
                                      f"log: {log_path}")
                wait = backoff[min(crashes - 1, len(backoff) - 1)]
                on_event(f"llama-server {why}; restart {crashes}/{max_restarts} in {wait:g}s")
                on_record({"event": "restart", **rec, "restarts": crashes, "in_s": wait})
                time.sleep(wait)
                if window:  # what the dead engine finished, then none of its requests runs
                    _say_stats(window.restart(), on_event, on_record)
                try:
                    took = _start_again(srv, p, window, on_event)
                    break
                except _StartFailed as e:
                    cause, said = e.cause, e.said
            watch = HealthWatch(srv, health_timeout)
            up_since = time.monotonic()
            on_event(f"ready again: {srv.url} (restart {crashes} of at most {max_restarts}), llama-server pid "
                     f"{srv.proc.pid}{warmup.note(took)}")
            on_record({"event": "ready", "url": srv.url, "pid": srv.proc.pid, "log": str(log_path),
                       "restarts": crashes, **warmup.record(took)})
    except _Stop:
        if window:
            _say_stats(window.take(), on_event, on_record)  # what finished since the last line
        on_event("stopping")
        on_record({"event": "stopping", "restarts": crashes})
        return 0
    except Exception as e:
        if not ended:  # the first start failed, or something unforeseen: the stream still ends with why
            on_record({"event": "failed", "cause": next(iter(str(e).splitlines()), type(e).__name__),
                       "engine_error": engine_error_line(srv.run_log_text()), "restarts": crashes,
                       "log": str(log_path)})
        raise
    finally:
        stopping = True
        try:
            srv.stop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        if killed:
            on_event(f"{signal.Signals(killed[0]).name} while stopping: llama-server killed")


class _StartFailed(Exception):
    """A restart that did not become ready: ``cause`` as a restart's (after ``llama-server``), and
    the engine's own error line where its log has one."""

    def __init__(self, cause: str, said: str | None):
        super().__init__(cause)
        self.cause, self.said = cause, said


def _start_again(srv: ServerProcess, p: ServePlan, window: LogWindow | None,
                 on_event: Callable[[str], None]) -> tuple[float, int] | None:
    """Start the engine again and warm it up as the first start was; the warm-up's seconds and
    prompt tokens (None: not warmed).

    Raises:
        _StartFailed: the port was taken meanwhile, the engine could not be run, died while loading,
            was not healthy within the start timeout, or died on its warm-up.
    """
    try:
        srv.start()
        return warmup.warmed(srv, p.warmup, window, on_event)
    except PortInUseError as e:
        cause, said = f"could not start again: {e}", None
    except ServerStartError as e:
        first = next(iter(str(e).splitlines()), "")
        cause, said = first.removeprefix("llama-server "), engine_error_line(srv.run_log_text())
    except EngineError as e:  # the executable gone or not runnable
        cause, said = f"could not start again: {e}", None
    except warmup.WarmUpDeath:
        cause = f"{exit_cause(srv.proc.returncode)} on the warm-up request"
        said = engine_error_line(srv.run_log_text())
    srv.stop(timeout=5)
    raise _StartFailed(cause, said)


def _say_stats(st: IntervalStats, on_event: Callable[[str], None], on_record: Callable[[dict], None]) -> None:
    if st.active:
        on_event(stats_line(st))
        on_record({"event": "stats", **st.to_dict()})
