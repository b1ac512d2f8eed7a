"""SIGTERM and SIGHUP handled like Ctrl-C while a verb writes files or follows a log.

Python turns SIGINT into ``KeyboardInterrupt``, so every writer's cleanup (``except BaseException``
or ``finally``: unlink the ``.X.part`` / ``.X.partial`` file, remove what ``generate`` made) runs
on Ctrl-C. SIGTERM (``timeout``, systemd, a CI cancel) and SIGHUP (a closed terminal or SSH link)
kill the process by default with no cleanup at all, leaving half-written hidden files behind.
Inside ``stop_signals_interrupt()`` those two raise ``Terminated``, a ``KeyboardInterrupt``, at
the point the main thread has reached, so the same cleanup runs; the CLI then exits ``128 +
signal number`` (143, 129), as a shell reports a process that signal ended.

A signal that was ignored when the process started stays ignored (``nohup`` ignores SIGHUP on
purpose), as Python itself leaves an inherited ignored SIGINT alone.

Where an exception raised at an arbitrary point would be lost or would orphan something, the code
holds the signal (``held()``): starting a child (an exception inside ``fork``'s hooks is printed
and dropped; one after the fork but before ``Popen`` returns leaves a child that nobody stops,
writing on). The signal is then raised when the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from typing import Iterator

# kill / systemd / timeout, and a closed terminal or SSH link
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived inside ``stop_signals_interrupt()``. A ``KeyboardInterrupt``, so
    code that cleans up after Ctrl-C cleans up after it too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """What a shell shows for a process this signal ended: 128 + its number."""
        return 128 + self.signum


@dataclass
class _State:
    signum: int | None = None  # the stop signal that came
    delivered: bool = False  # raised as Terminated (it may since have been swallowed)
    held: int = 0  # depth of held() sections


_state: _State | None = None  # set while a stop_signals_interrupt() block runs


def _on_signal(signum, frame):
    st = _state
    if st is None or st.signum is not None:
        # one came already: a second one (a closed terminal can send SIGHUP twice, from the kernel
        # and from the shell) must not cut the cleanup the first one started
        return
    st.signum = signum
    if st.held:
        return  # raised when the held section ends
    st.delivered = True
    raise Terminated(signum)


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``Terminated`` in the main thread; the previous
    handlers come back when it ends.

    Only the first such signal raises; later ones are dropped, so that they cannot cut its
    cleanup short. Should the first be lost all the same (raised inside a finalizer, which Python
    reports and drops), it is raised when the block ends. Outside the main thread (where Python
    cannot set handlers) this does nothing.
    """
    global _state
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer, st = _state, _State()
    old = {}
    _state = st
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is signal.SIG_IGN:
            continue  # ignored by whoever started us (nohup): left ignored
        old[s] = signal.signal(s, _on_signal)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _state = outer
    if st.signum is not None:  # the block ended without it: it was swallowed on the way
        raise Terminated(st.signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A section a stop signal must not cut (say, starting a child and taking its handle): one
    that comes meanwhile is raised when the section ends. Does nothing outside
    ``stop_signals_interrupt()``."""
    st = _state
    if st is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    st.held += 1
    try:
        yield
    finally:
        st.held -= 1
    if not st.held and st.signum is not None and not st.delivered:
        st.delivered = True
        raise Terminated(st.signum)
