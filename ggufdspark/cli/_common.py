"""Small helpers shared by the CLI verbs: progress display, JSON output, the options that name a
pair the same way in every verb, and option parsers (``number_list``)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import weakref
from typing import Any, Iterable

import click

from ggufdspark.serve_checks import ServingOptions

_OPEN: "weakref.WeakSet[ProgressLine]" = weakref.WeakSet()


def close_progress() -> None:
    """End every open bar, so that a message printed next starts on a line of its own."""
    for bar in list(_OPEN):
        bar.close()


class ProgressLine:
    """A ``progress(done, total, what)`` callback: one mechanism for every long job of the CLI.

    On a terminal, a tqdm bar on stderr with rate and time left, ``what`` after it; log records are
    routed through tqdm while a bar is open, so they never glue onto it. Elsewhere (CI logs, pipes)
    one plain line every 10% with the same rate and time left. ``unit`` names what ``done`` counts
    (``B`` gives KB/MB/GB).
    """

    def __init__(self, label: str, unit: str = ""):
        self.label = label
        self.unit = unit
        self._tty = sys.stderr.isatty()
        self._bar = None
        self._redirect = None
        self._t0: float | None = None
        self._last_pct = -10

    def __call__(self, done: int, total: int, what: str = "") -> None:
        if self._tty:
            self._draw(done, total, what)
        else:
            self._line(done, total, what)

    def _draw(self, done: int, total: int, what: str) -> None:
        if self._bar is None:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            _OPEN.add(self)
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
            scale = self.unit == "B"
            try:
                cols = os.get_terminal_size(sys.stderr.fileno()).columns
            except (OSError, ValueError):
                cols = 0
            width = {"dynamic_ncols": True} if cols > 0 else {"ncols": 100}  # a pty that reports no size
            self._bar = tqdm(total=total or None, desc=self.label, unit=self.unit or "step",
                             unit_scale=scale, unit_divisor=1024 if scale else 1000, file=sys.stderr,
                             mininterval=0.2, leave=True, **width)
        if total and self._bar.total != total:
            self._bar.total = total
        self._bar.n = done
        self._bar.set_postfix_str(safe_text(what)[:50], refresh=False)
        self._bar.refresh()
        if total and done >= total:
            self.close()

    def _line(self, done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if self._t0 is None:
            self._t0 = now
        pct = int(100 * done / total) if total else 100
        if not (pct >= self._last_pct + 10 or (done >= total and self._last_pct < 100)):
            return
        self._last_pct = pct
        elapsed = now - self._t0
        extra = ""
        if 0 < done < total and elapsed > 0:
            left = elapsed * (total - done) / done
            extra = f" ({_rate(done / elapsed, self.unit)}, {_clock(left)} left)"
        elif done >= total and elapsed > 0:
            extra = f" ({_clock(elapsed)})"
        click.echo(f"{self.label}: {pct}% {safe_text(what)}{extra}".rstrip(), err=True)

    def close(self) -> None:
        """End the bar (a job that stops early calls this; a finished one closes itself)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        _OPEN.discard(self)


def _rate(per_s: float, unit: str) -> str:
    if unit == "B":
        for u in ("B", "KB", "MB", "GB"):
            if per_s < 1024 or u == "GB":
                return f"{per_s:.1f} {u}/s"
            per_s /= 1024
    return f"{per_s:.2f} {unit or 'step'}/s"


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


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


# How a warning reads in every verb, whether logged (``ggufdspark.cli.MarkedFormatter``) or printed.
WARNING = "WARNING: "


def given_options(ctx: click.Context, names) -> list[str]:
    """Of the parameters ``names``, those the user put on the command line, as their flags
    (``top_k`` -> ``--top-k``): what a mode refuses when it belongs to another."""
    return [f"--{n.replace('_', '-')}" for n in names if ctx.get_parameter_source(n).name == "COMMANDLINE"]


def echo_warning(text: str, *, err: bool = True) -> None:
    """Print ``WARNING: text`` (yellow on a terminal), on stderr unless ``err`` is false."""
    click.secho(WARNING + text, fg="yellow", err=err)


def echo_json(obj: Any) -> None:
    """Print ``obj`` as JSON that every parser reads: NaN and infinities (which ``json.dumps`` would
    write as the non-JSON words ``NaN`` / ``Infinity``) become null."""
    click.echo(json.dumps(finite_json(obj), indent=2, default=str, allow_nan=False))


def finite_json(obj: Any) -> Any:
    """``obj`` with every float that is not finite replaced by None (in dicts, lists and tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


class NumberRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN: NaN compares false with every bound, so click's
    own range lets ``--p-min nan`` through (a usage error, exit 2, like any value out of range)."""

    def convert(self, value, param, ctx):
        v = super().convert(value, param, ctx)
        if math.isnan(v):
            self.fail(f"{value!r} is not a number", param, ctx)
        return v


def target_option(*, required: bool = False, hub_aliases: bool = False):
    """``-m`` / ``--model`` / ``--target``: the target GGUF, named the same way by every verb that
    takes a pair (its value is the ``model`` parameter); a Hub reference ``ORG/NAME[:QUANT]`` too
    (``ggufdspark.hubref``). ``hub_aliases`` adds llama-server's ``-hf`` / ``--hf-repo``."""
    names = ("-m", "--model", "--target") + (("-hf", "--hf-repo") if hub_aliases else ())
    return click.option(*names, "model", required=required, type=click.Path(dir_okay=False),
                        help="Target GGUF, or from the Hub: ORG/NAME[:QUANT].")


def draft_option(*, required: bool = False, hub_aliases: bool = False):
    """``-md`` / ``--draft``: the DSpark draft GGUF of the pair (its value is the ``draft`` parameter),
    or a Hub reference. ``hub_aliases`` adds llama-server's ``-hfd`` / ``--hf-repo-draft``."""
    names = ("-md", "--draft") + (("-hfd", "--hf-repo-draft") if hub_aliases else ())
    return click.option(*names, "draft", required=required, type=click.Path(dir_okay=False),
                        help="DSpark draft GGUF, or from the Hub: ORG/NAME[:QUANT] (its dspark-*.gguf).")


def mmproj_option(help_text: str):
    """``--mmproj``: a vision projector GGUF, or a Hub reference ``ORG/NAME[:QUANT]`` (its mmproj*.gguf)."""
    return click.option("--mmproj", type=click.Path(dir_okay=False), help=help_text + " A file or ORG/NAME[:QUANT].")


def traffic_shape_options(prefix: str):
    """``--image-share`` and ``--prompt-scale``: the shape of ``bench --load``'s traffic, which
    ``tune --load`` takes as it is (``prefix`` starts each help text: which mode they belong to)."""
    def decorate(f):
        f = click.option("--prompt-scale", type=int, default=1, show_default=True,
                         help=f"{prefix} every prompt this many times as long (its text after the next N-1 prompts' "
                              "of the set), the rest of the traffic the same: 2 for 'prompts twice as long'.")(f)
        return click.option("--image-share", type=float, default=0.0, show_default=True,
                             help=f"{prefix} this fraction (0-1) of the requests carry a drawn picture (three sizes), "
                                  "the same requests on every arm; needs --mmproj.")(f)
    return decorate


def from_hub(target, draft=None, mmproj=None, *, find_mmproj: bool = False, find_draft: bool = False):
    """``(target, draft, mmproj)`` with every Hub reference among them resolved to a downloaded file
    (``hubref.resolve_pair``); files pass through unchanged. Nothing is imported without a reference."""
    from ggufdspark import hubref

    hubref.refuse_missing_paths(target, draft, mmproj)  # a mistyped local path says so, never reaches the Hub
    if not any(hubref.is_ref(v) for v in (target, draft, mmproj)):
        return target, draft, mmproj
    p = hubref.resolve_pair(target, draft, mmproj, find_mmproj=find_mmproj, find_draft=find_draft)
    return p.target, p.draft, p.mmproj


# click parameters whose ServingOptions field is spelled otherwise (the rest share their names)
SERVING_FIELDS = {"draft_cut": "draft_n_max_by_slots", "extra": "extra_args", "server_args": "extra_args",
                  "warmup": "warm"}


def serving_options(params: dict, names: Iterable[str], *, hub: bool = False, **fixed: Any) -> ServingOptions:
    """A verb's serving options as one record, built once: each click parameter in ``names`` taken
    out of ``params`` (``SERVING_FIELDS`` names the fields spelled otherwise), then ``fixed``. With
    ``hub``, TARGET, DRAFT and --mmproj given as Hub references are downloaded first (``from_hub``;
    ``serve`` resolves its own in ``serve.plan``)."""
    values = {SERVING_FIELDS.get(n, n): params.pop(n) for n in names}
    if hub:
        values["model"], values["draft"], values["mmproj"] = from_hub(values.get("model"), values.get("draft"),
                                                                       values.get("mmproj"))
    return ServingOptions(**values, **fixed)


def hub_file(value: str) -> str:
    """``value``, or the downloaded file a Hub reference names: its model file, else its ``dspark-``
    draft (``hubref.resolve`` with role ``any``)."""
    from ggufdspark import hubref

    hubref.refuse_missing_paths(value)
    return str(hubref.resolve(value, "any").path) if hubref.is_ref(value) else value


def number_list(kind: type):
    """A click callback turning ``"1,8,32"`` into a list of ``kind``."""

    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return [kind(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected comma-separated {kind.__name__} values") from None

    return parse
