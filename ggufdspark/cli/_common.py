"""Small helpers shared by the CLI verbs: progress display and JSON output."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click


class ProgressLine:
    """A ``progress(done, total, what)`` callback that redraws one stderr line.

    Redraws at most ~5 times a second; on a non-terminal (CI logs) prints a line every 10%.
    """

    def __init__(self, label: str, unit: str = ""):
        self.label = label
        self.unit = unit
        self._last = 0.0
        self._last_pct = -10
        self._tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int, what: str = "") -> None:
        pct = int(100 * done / total) if total else 100
        now = time.monotonic()
        if self._tty:
            if now - self._last < 0.2 and done < total:
                return
            self._last = now
            sys.stderr.write(f"\r{self.label}: {pct:3d}% {what[:50]:<50}")
            if done >= total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        elif pct >= self._last_pct + 10 or (done >= total and self._last_pct < 100):
            self._last_pct = pct
            click.echo(f"{self.label}: {pct}% {what}", err=True)


# Bidirectional-text controls: they reorder what a terminal shows without being visible themselves.
_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def safe_text(text: str, keep: str = "\n\t") -> str:
    """``text`` with control characters (C0, DEL, C1: terminal escapes, bells, carriage returns)
    and bidi overrides written as ``\\xNN`` / ``\\uNNNN``, for printing strings that come from files
    (a GGUF's ``general.name``, an engine's log) to a terminal. Characters in ``keep`` stay."""
    out = []
    for c in str(text):
        o = ord(c)
        # lone surrogates (undecodable bytes in a file's strings) cannot be encoded for output at all
        if c in keep or not (o < 0x20 or 0x7f <= o < 0xa0 or c in _BIDI or 0xd800 <= o < 0xe000):
            out.append(c)
        else:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
    return "".join(out)


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))
