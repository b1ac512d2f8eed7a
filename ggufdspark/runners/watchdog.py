"""The health watchdog of ``serve``'s supervision: an engine whose ``/health`` answers nothing for
a while, and whose log does not grow meanwhile, is hung (``ggufdspark.supervise.supervise`` restarts it
like a dead one)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ggufdspark import logfiles
from ggufdspark.runners.server import ServerProcess

log = logging.getLogger(__name__)


class HealthWatch:
    """Polls ``/health`` every few seconds; ``hung()`` names the hang once nothing answered for
    ``timeout`` seconds and the engine's log has not grown for as long.

    The log is the engine's sign of progress: it writes lines as each request starts and ends. A
    silent ``/health`` alone proves nothing: llama-server answers it from the same HTTP thread pool
    that every open connection holds while its request runs (``n_parallel + 4`` threads, or
    ``--threads-http``, plus at most 1024 more), so past that many waiting connections a working
    engine queues the poll behind them (issue 64, row 5: a restart there dropped a thousand
    requests in flight). A stopped or deadlocked engine, or one stuck in a GPU kernel, answers
    nothing and writes nothing."""

    def __init__(self, srv: ServerProcess, timeout: float | None):
        self.srv, self.timeout = srv, timeout or 0
        self.every = min(5.0, self.timeout / 4) if self.timeout else 0
        self.last_answer = self.next_poll = self.last_growth = time.monotonic()
        self.log_size = self._log_size()
        self._busy_said = False

    def _log_size(self) -> int:
        try:
            return os.stat(self.srv.log_path).st_size
        except OSError:
            return -1

    def hung(self) -> str | None:
        now = time.monotonic()
        if not self.timeout or now < self.next_poll:
            return None
        answered = self.srv.health(timeout=max(1.0, self.every)) is not None
        now = time.monotonic()
        self.next_poll = now + self.every
        size = self._log_size()
        if size != self.log_size:
            self.log_size, self.last_growth = size, now
        if answered:
            self.last_answer, self._busy_said = now, False
            return None
        silent = now - self.last_answer
        if silent < self.timeout:
            return None
        if now - self.last_growth < self.timeout:
            if not self._busy_said:
                self._busy_said = True
                log.info("llama-server has not answered /health for %.0fs but its log grows: busy, not hung "
                         "(its HTTP threads all hold connections)", silent)
            return None
        return (f"stopped answering /health for {silent:.0f}s and wrote nothing to its log for "
                f"{now - self.last_growth:.0f}s "
                f"(hung: the health timeout is {self.timeout:g}s)")


def note_in_log(log_path: str | Path, line: str) -> None:
    """Append ``ggufdspark: LINE`` to the engine's log, so the log says why a restart happened."""
    try:
        fd = logfiles.open_log(log_path)
    except OSError as e:
        log.debug("could not note the restart in %s: %s", log_path, e)
        return
    try:
        os.write(fd, f"ggufdspark: {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n".encode())
    finally:
        os.close(fd)
