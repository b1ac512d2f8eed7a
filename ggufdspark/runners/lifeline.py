"""Children that die with this process, however it dies (SIGKILL, SIGHUP, an unhandled SIGTERM).

``spawn()`` is ``subprocess.Popen`` plus a tie to this process:

* Linux: the parent-death signal. Between fork and exec the child asks the kernel
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when its parent goes, then checks that its
  parent is still the process that forked it (had the parent died before the ``prctl``, the
  child was already re-parented and no signal would ever come). The kernel sends the signal when
  the *thread* that forked the child exits, not the process, so children are forked from the main
  thread or, when called from another thread, from one long-lived spawner thread.
* Elsewhere (macOS): a watchdog. A small Python process in its own session blocks reading a
  pipe whose write end only this process holds. When this process dies, however, the pipe reads
  end-of-file and the watchdog kills the child's process group; a clean stop tells it to leave.

``MODE`` chooses between them ("auto": the parent-death signal where the platform has it).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

# "auto", "pdeathsig" (Linux only) or "watchdog"
MODE = "auto"

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return None
    # int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4, unsigned long arg5);
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def mode() -> str:
    """The mechanism ``spawn`` uses now."""
    if MODE == "auto":
        return "pdeathsig" if _PRCTL is not None else "watchdog"
    if MODE == "pdeathsig" and _PRCTL is None:
        raise RuntimeError("the parent-death signal exists only on Linux")
    return MODE


def _pdeathsig_preexec(parent: int) -> Callable[[], None]:
    prctl = _PRCTL
    assert prctl is not None
    sig = int(signal.SIGKILL)

    def preexec() -> None:  # runs in the child between fork and exec: no locks, no logging
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: do what the signal would
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _SpawnerThread:
    """One thread that lives as long as the process and forks children for other threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ggufdspark-spawner", daemon=True)
                self._thread.start()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, fut))
        return fut.result()

    def _run(self) -> None:
        while True:
            fn, fut = self._queue.get()
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)


_SPAWNER = _SpawnerThread()

_WATCHDOG = r"""
import os, signal, sys
for s in (signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
pgid = int(sys.argv[1])
try:
    said = os.read(0, 1)
except OSError:
    said = b""
if not said:  # end of file: the parent died without dismissing us
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Lifeline:
    """The tie between one child and this process. ``release()`` once the child is reaped."""

    def __init__(self, watchdog: subprocess.Popen | None = None):
        self.watchdog = watchdog

    def release(self) -> None:
        """Dismiss the watchdog (if any) without it killing anything."""
        w, self.watchdog = self.watchdog, None
        if w is None:
            return
        try:
            assert w.stdin is not None
            w.stdin.write(b"x")
            w.stdin.close()
        except OSError:
            pass
        try:
            w.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - it exits as soon as it reads
            w.kill()
            w.wait()


def spawn(args: list[str], **popen_kw: Any) -> tuple[subprocess.Popen, Lifeline]:
    """``subprocess.Popen(args, start_new_session=True, **popen_kw)``, tied to this process.

    The child leads its own process group (so a terminal's Ctrl-C reaches only this process,
    which stops it in order) and is killed with SIGKILL if this process dies first.

    Raises:
        OSError: the executable could not be started.
    """
    how = mode()
    popen_kw["start_new_session"] = True
    if how == "watchdog":
        proc = subprocess.Popen(args, **popen_kw)
        try:
            dog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(proc.pid)], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return proc, Lifeline(dog)

    def fork() -> subprocess.Popen:
        return subprocess.Popen(args, preexec_fn=_pdeathsig_preexec(os.getpid()), **popen_kw)

    if threading.current_thread() is threading.main_thread():
        return fork(), Lifeline()
    return _SPAWNER.call(fork), Lifeline()


def run(args: list[str], *, timeout: float, **popen_kw: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(args, capture_output=True, text=True, timeout=timeout)`` for a program that
    may hang: the child runs in its own process group, tied to this process, and a timeout kills the
    whole group (``subprocess.run`` kills only the child, leaving whatever it started).

    Raises:
        OSError: it could not be started.
        subprocess.TimeoutExpired: it did not finish in ``timeout`` seconds (everything it started
            has been killed and reaped).
    """
    proc, line = spawn(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, **popen_kw)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            killpg(proc.pid)
            proc.communicate()  # the pipes close once the whole group is dead
            raise
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(args, timeout) from None
    finally:
        line.release()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
