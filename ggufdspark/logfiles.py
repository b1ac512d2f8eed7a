"""Where llama-server logs go, and how they are opened.

Logs the toolkit names itself live in the user's state directory,
``$XDG_STATE_HOME/ggufdspark/logs`` (default ``~/.local/state/ggufdspark/logs``), created mode
0700. Each log gets an unpredictable name, created exclusively with mode 0600 (``mkstemp``: no
symlink followed, no name shared by two runs). Logs older than ``MAX_AGE_DAYS`` and all but the
newest ``KEEP`` are pruned whenever a new one is made, except the log of an engine that is still
running: ``open_log`` takes a shared ``flock`` on the descriptor the engine writes through, which
lasts as long as the engine (it inherits the descriptor), and pruning skips every log it cannot lock
exclusively. So the log path a long-running, idle ``serve`` printed keeps existing.

A log path given by the user is opened for appending, created 0600 if missing, and refused when
it is a symbolic link (one planted in a shared directory could point anywhere).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import tempfile
import time
from pathlib import Path

from ggufdspark.errors import UnsafeOutputError

log = logging.getLogger(__name__)

ENV_STATE = "XDG_STATE_HOME"
KEEP = 100
MAX_AGE_DAYS = 14


def state_dir() -> Path:
    """``$XDG_STATE_HOME/ggufdspark`` or ``~/.local/state/ggufdspark`` (not created here)."""
    base = os.environ.get(ENV_STATE) or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "ggufdspark"


def logs_dir() -> Path:
    """The private log directory, created 0700 if missing.

    Raises:
        UnsafeOutputError: it exists but is not a directory of this user, or cannot be created.
    """
    d = state_dir() / "logs"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise UnsafeOutputError(f"{d}: cannot create the log directory: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise UnsafeOutputError(f"{d}: the log directory is not a directory owned by this user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(d, 0o700)
    return d


def new_log(kind: str) -> Path:
    """Create an empty, private, uniquely named log ``<kind>-<date>-<time>-<random>.log``."""
    d = logs_dir()
    prune(d)
    fd, name = tempfile.mkstemp(prefix=f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".log", dir=d)
    os.close(fd)
    return Path(name)


def open_log(path: str | Path) -> int:
    """Open ``path`` for appending (created 0600 if missing) without following a symlink there.

    Returns:
        A file descriptor (close-on-exec; the caller closes it).

    Raises:
        UnsafeOutputError: ``path`` is a symbolic link, or cannot be opened (the reason is named).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafeOutputError(f"{path}: is a symbolic link; refusing to write the log through it "
                                    f"(give the real path)") from None
        raise UnsafeOutputError(f"{path}: cannot write the log: {e.strerror}") from None
    # O_NONBLOCK only kept a FIFO without a reader from blocking the open
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    try:  # "in use": held by whoever shares this descriptor (the engine), see ``prune``
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks, or a pruner holding it this instant: logging goes on
    if stat.S_ISDIR(os.fstat(fd).st_mode):  # pragma: no cover - O_WRONLY on a directory fails first
        os.close(fd)
        raise UnsafeOutputError(f"{path}: is a directory, not a log file")
    return fd


def check_log_path(path: str | Path) -> Path:
    """Validate a user-given log path now (creating it), so a bad one fails before anything starts."""
    os.close(open_log(path))
    return Path(path)


def prune(d: Path, *, keep: int = KEEP, max_age_days: float = MAX_AGE_DAYS) -> None:
    """Delete logs older than ``max_age_days`` and all but the newest ``keep`` in ``d``."""
    try:
        logs = sorted(((p.stat().st_mtime, p) for p in d.glob("*.log") if p.is_file()), reverse=True)
    except OSError:
        return
    cutoff = time.time() - max_age_days * 86400
    for i, (mtime, p) in enumerate(logs):
        if i >= keep or mtime < cutoff:
            _unlink_unless_in_use(p)


def _unlink_unless_in_use(p: Path) -> None:
    """Delete the log ``p`` unless a running engine writes to it (it holds the lock ``open_log`` took)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        log.debug("could not prune %s: %s", p, e)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.debug("not pruning %s: a running engine writes to it", p)
            return
        except OSError:
            pass  # no locks on this file system: pruned by age and count alone
        p.unlink()
    except OSError as e:
        log.debug("could not prune %s: %s", p, e)
    finally:
        os.close(fd)
