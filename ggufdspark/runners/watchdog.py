"""The health watchdog of ``serve``'s supervision: an engine whose ``/health`` answers nothing for
a while is hung (``ggufdspark.serve.supervise`` restarts it like a dead one)."""

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
    ``timeout`` seconds."""

    def __init__(self, srv: ServerProcess, timeout: float | None):
        self.srv, self.timeout = srv, timeout or 0
        self.every = min(5.0, self.timeout / 4) if self.timeout else 0
        self.last_answer = self.next_poll = time.monotonic()

    def hung(self) -> str | None:
        now = time.monotonic()
        if not self.timeout or now < self.next_poll:
            return None
        answered = self.srv.health(timeout=max(1.0, self.every)) is not None
        now = time.monotonic()
        self.next_poll = now + self.every
        if answered:
            self.last_answer = now
            return None
        silent = now - self.last_answer
        if silent < self.timeout:
            return None
        return f"stopped answering /health for {silent:.0f}s (hung: the health timeout is {self.timeout:g}s)"


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
