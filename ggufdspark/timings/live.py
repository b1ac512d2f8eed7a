"""A running llama-server's speculative figures as they happen, read from its log as it grows.

    window = LogWindow("llama-server.log")     # from the log's end: what happens from now on
    ...
    stats = window.take()                      # what finished since the last take
    if stats.active:
        print(stats_line(stats))

The log's per-request timing block (``parse_log``) is written when a request ends, followed by the
slot's ``release`` line; a window reads complete lines only and takes in the blocks up to the last
release, so a block being written is taken at the next call. ``launch_slot_`` / ``release`` lines
give the requests running. Reading the log, unlike scraping ``/metrics``, changes nothing in the
server (each ``/metrics`` scrape restarts the window its throughput gauges average over, which a
user's own Prometheus would then read)."""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ggufdspark.errors import TimingsParseError
from ggufdspark.timings.formats import parse_log
from ggufdspark.timings.records import RequestTimings

log = logging.getLogger(__name__)

_LAUNCH = re.compile(r"launch_slot_: id +(\d+) \| task (-?\d+) \|")
_RELEASE = re.compile(r"release: id +(\d+) \| task (-?\d+) \| stop processing")
_CANCEL = re.compile(r"cancel task, id_task = \d+")  # a client that went away (no timing block follows)
# a new engine's first line (tools/server/server.cpp: SRV_INF "initializing ...", prefixed
# "srv  <function>: "; load_model's "initializing, n_slots = ..." is a later line of the same start)
_BANNER = re.compile(r"^.*\bsrv +\w+: initializing \.\.\.[ \t]*$", re.M)
_MAX_READ = 1 << 24  # bytes read a take: a log that grew more is caught up over several takes
MAX_LINE = 1 << 24  # a longer line is skipped (the engine's lines are short; its prompts are not logged whole)
_TAIL = 64  # bytes compared to tell a log that was cut and rewritten past the old end
GONE_AFTER = 2  # takes in a row without the log before it is gone


@dataclass
class IntervalStats:
    """What a server finished between two takes (``LogWindow.take``)."""

    seconds: float
    requests: int  # finished, with a timing block
    running: int  # launched and not released at the take
    prompt_n: int
    predicted_n: int
    draft_n: int
    draft_n_accepted: int
    passes: int  # verify passes of the requests that drafted (exact from the log's mean length)
    decode_tps: float | None  # the finished requests' own decode speed, mean over requests
    cancelled: int = 0  # requests whose client went away before the answer ended

    @property
    def active(self) -> bool:
        return bool(self.requests or self.running or self.cancelled)

    @property
    def acceptance_rate(self) -> float | None:
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def accept_length(self) -> float | None:
        """Tokens a verify pass, the bonus token included (llama.cpp's ``mean len``)."""
        return 1.0 + self.draft_n_accepted / self.passes if self.passes else None

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "requests": self.requests, "running": self.running,
                "prompt_n": self.prompt_n, "predicted_n": self.predicted_n, "draft_n": self.draft_n,
                "draft_n_accepted": self.draft_n_accepted, "passes": self.passes,
                "acceptance_rate": self.acceptance_rate, "accept_length": self.accept_length,
                "decode_tps": self.decode_tps, "cancelled": self.cancelled}


class LogWindow:
    """Follows a llama-server log from where it stood when made (``from_end``) or from its start.

    The log is reopened by name at each take, as ``tail -F`` does, so what happens to the file is
    seen: a log truncated in place (logrotate's ``copytruncate``) or replaced by another file is read
    from its start again; a new engine's first line (``srv ...: initializing ...``: ``serve`` restarting
    a crashed engine, or another engine started on the same log) means none of the old engine's
    requests runs any more. A log missing at ``GONE_AFTER`` takes in a row is ``gone`` (deleted or
    moved away; one miss is allowed for a rotation that renames it and creates it anew). A line
    longer than ``MAX_LINE`` bytes (no engine writes one) is skipped, with a warning, instead of
    holding up the lines after it.
    """

    def __init__(self, path: str | os.PathLike, *, from_end: bool = True):
        self.path = Path(path)
        self.offset = 0
        self.inode: tuple[int, int] | None = None  # (device, inode) of the file read last
        self.tail = b""  # the bytes just before ``offset``: if they moved, the log was cut and rewritten
        self.skipping = False  # inside an over-long line: dropped up to its end
        self.missing = 0  # takes in a row that found no file at the path
        self.pending = ""  # complete lines after the last release, taken in with a later one
        self.running: set[tuple[int, int]] = set()
        self.since = time.monotonic()
        if from_end:
            try:
                with open(self.path, "rb") as f:
                    st = os.fstat(f.fileno())
                    self.offset, self.inode = st.st_size, (st.st_dev, st.st_ino)
                    f.seek(max(0, self.offset - _TAIL))
                    self.tail = f.read(self.offset - max(0, self.offset - _TAIL))
            except FileNotFoundError:
                pass  # the engine creates it

    @property
    def gone(self) -> bool:
        """The log has been missing at ``GONE_AFTER`` takes in a row."""
        return self.missing >= GONE_AFTER

    def restart(self) -> IntervalStats:
        """The engine died and is started again on the same log: what the old one finished (its log
        read to the end); none of its requests runs any more."""
        st = self.take()
        self._new_engine()
        return st

    def _new_engine(self) -> None:
        self.running.clear()
        self.pending = ""

    def _start_over(self, why: str) -> None:
        log.debug("%s: %s: reading it from its start", self.path, why)
        self.offset, self.tail, self.skipping = 0, b"", False
        self._new_engine()

    def _read(self) -> str:
        """The complete lines appended since the last read."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            self.missing += 1
            if self.missing == GONE_AFTER:  # said by the caller (``gone``), which decides what follows
                log.debug("%s: the log is gone (deleted or moved away)", self.path)
            return ""
        with f:
            self.missing = 0
            st = os.fstat(f.fileno())
            inode = (st.st_dev, st.st_ino)
            if self.inode is not None and inode != self.inode:
                self._start_over("replaced by another file")
            elif st.st_size < self.offset:
                self._start_over("truncated")
            elif self.tail:
                f.seek(self.offset - len(self.tail))
                if f.read(len(self.tail)) != self.tail:  # cut, then written past where it was
                    self._start_over("truncated and rewritten")
            self.inode = inode
            f.seek(self.offset)
            data = f.read(min(st.st_size - self.offset, _MAX_READ))
        start = 0
        if self.skipping:  # the rest of an over-long line
            nl = data.find(b"\n")
            start = len(data) if nl < 0 else nl + 1
            self.skipping = nl < 0
        end = max(start, data.rfind(b"\n") + 1)
        text = data[start:end]  # the complete lines
        if len(data) - end >= MAX_LINE:  # no line end in MAX_LINE bytes: that line is skipped
            log.warning("%s: a line of more than %d MiB at byte %d: skipped", self.path, MAX_LINE >> 20,
                        self.offset + end)
            self.skipping, end = True, len(data)
        self.tail = (self.tail + data[:end])[-_TAIL:]
        self.offset += end
        return text.decode("utf-8", errors="replace")

    def take(self) -> IntervalStats:
        """What finished since the last take (or since the window was made)."""
        text = self._read()
        cancelled = len(_CANCEL.findall(text))
        records: list[RequestTimings] = []
        cuts = [m.start() for m in _BANNER.finditer(text)]
        for i, (a, b) in enumerate(zip([0] + cuts, cuts + [len(text)])):
            if i:  # a new engine's first line: the old one's unreleased requests never end
                self._new_engine()
            piece = text[a:b]
            for line in piece.splitlines():
                if m := _LAUNCH.search(line):
                    self.running.add((int(m[1]), int(m[2])))
                elif m := _RELEASE.search(line):
                    self.running.discard((int(m[1]), int(m[2])))
            piece = self.pending + piece
            cut = _last_release_end(piece)
            records += _records(piece[:cut], str(self.path))
            self.pending = piece[cut:]
        now = time.monotonic()
        seconds, self.since = now - self.since, now
        return interval_stats(records, seconds, len(self.running), cancelled)


def _last_release_end(text: str) -> int:
    """Where the line of the last ``release`` ends (0: no release in ``text``)."""
    last = None
    for last in _RELEASE.finditer(text):
        pass
    if last is None:
        return 0
    nl = text.find("\n", last.end())
    return len(text) if nl < 0 else nl + 1


def _records(text: str, name: str) -> list[RequestTimings]:
    if not text:
        return []
    try:
        return parse_log(text, name, True, [], allow_plain=True)
    except TimingsParseError:  # releases without timing blocks (a cancelled request)
        return []


def interval_stats(records: list[RequestTimings], seconds: float, running: int, cancelled: int = 0) -> IntervalStats:
    drafted = [r for r in records if r.drafted]
    speeds = [r.decode_tps for r in records if r.decode_tps]
    return IntervalStats(
        seconds=seconds, requests=len(records), running=running,
        prompt_n=sum(r.prompt_n or 0 for r in records), predicted_n=sum(r.predicted_n or 0 for r in records),
        draft_n=sum(r.draft_n or 0 for r in drafted), draft_n_accepted=sum(r.draft_n_accepted or 0 for r in drafted),
        passes=sum(r.passes or 0 for r in drafted),
        decode_tps=sum(speeds) / len(speeds) if speeds else None, cancelled=cancelled)


def stats_line(s: IntervalStats) -> str:
    """One line for a terminal, e.g. ``last 5.1 s: 200 requests done, 4 running; 17472 tokens
    generated (1049.9 tok/s a request), 5400 prompt tokens; draft 8536 of 26207 accepted (32.6%),
    accept length 1.98``."""
    secs = f"{s.seconds:.1f}" if s.seconds < 10 else f"{s.seconds:.0f}"
    head = (f"last {secs} s: {s.requests} request{'s' if s.requests != 1 else ''} done, {s.running} running"
            + (f", {s.cancelled} cancelled" if s.cancelled else ""))
    if not s.requests:
        return head
    speed = f" ({s.decode_tps:.1f} tok/s a request)" if s.decode_tps else ""
    out = f"{head}; {s.predicted_n} tokens generated{speed}, {s.prompt_n} prompt tokens"
    if s.draft_n:
        out += f"; draft {s.draft_n_accepted} of {s.draft_n} accepted ({100 * s.acceptance_rate:.1f}%)"
        if s.accept_length:
            out += f", accept length {s.accept_length:.2f}"
    elif s.requests:
        out += "; nothing drafted"
    return out
