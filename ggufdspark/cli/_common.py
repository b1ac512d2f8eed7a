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


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))
