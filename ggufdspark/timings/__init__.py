"""Speculative-decoding timings: one parser for what llama-server (and SGLang) report.

    records = parse(Path("responses.jsonl"))       # or a log, an SSE capture, /metrics text
    print(summarize(records).accept_length.token_weighted)

Inputs (auto-detected; ``format=`` forces one): llama-server JSON responses (``/completion``,
``/v1/completions``, ``/v1/chat/completions``), a JSON array or JSON Lines of them, streamed
responses (SSE ``data:`` lines), llama-server logs (the per-request ``print_timing`` lines),
``/metrics`` text (one scrape: cumulative totals; several scrapes: their differences), and SGLang
native responses (``meta_info``). ``metrics_delta`` turns two scrapes taken around one request
into that request's exact figures; ``join`` gives response records the exact pass counts of a
log or of metric deltas.

Conventions (the ``METRICS`` table below; docs/timings.md explains each):

* acceptance rate = accepted / drafted;
* accept length = 1 + accepted / passes: tokens per target verify pass, bonus token included
  (llama.cpp's ``mean len``); MMSpec's MAT = accept length - 1;
* tokens per pass = generated / passes (SGLang's ``spec_accept_length`` convention);
* passes (target verify passes): exact from the ``/metrics`` counters, the log's ``mean len``
  or SGLang's ``spec_verify_ct``; otherwise estimated as ``predicted_n - draft_n_accepted - 1``
  and labelled ``estimated``;
* aggregates come both as a request mean and token-weighted (pooled sums).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any, Iterable

from ggufdspark.errors import InputNotFoundError, TimingsParseError

from ggufdspark.timings.records import (  # noqa: F401
    FORMATS,
    METRICS,
    METRICS_PREFIX,
    PASSES_SOURCES,
    Records,
    RequestTimings,
    Skipped,
    estimate_passes,
    json_loads,
    parse_response,
    parse_sglang_response,
    parse_timings_object,
    record_problem,
)
from ggufdspark.timings.formats import (  # noqa: F401
    LOG_SLOT,
    numbered_lines,
    parse_json,
    parse_jsonl,
    parse_log,
    parse_sse,
    passes_from_log,
    passes_from_mean_len,
)
from ggufdspark.timings.metrics import (  # noqa: F401
    MetricsScrape,
    SAMPLE,
    metrics_delta,
    metrics_totals,
    parse_metrics,
    parse_metrics_records,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def detect_format(text: str) -> str:
    """``json``, ``jsonl``, ``sse``, ``log`` or ``metrics``, from the content.

    Raises:
        TimingsParseError: none of them (the message quotes the first line).
    """
    first = next((ln for ln in numbered_lines(text) if ln.text.strip()), None)
    if first is None:
        raise TimingsParseError("empty input")
    head = first.text.strip()
    if head.startswith(("data:", "event:")):
        return "sse"
    if head.startswith("#") or head.startswith(METRICS_PREFIX):
        for ln in numbered_lines(text[:20_000]):
            s = ln.text.strip()
            if s.startswith(("# HELP", "# TYPE")) or (s.startswith(METRICS_PREFIX) and SAMPLE.match(s)):
                return "metrics"
    if head.startswith(("{", "[")):
        try:
            json_loads(text)
            return "json"
        except json.JSONDecodeError:
            pass
        try:
            json_loads(head)
            return "jsonl"
        except json.JSONDecodeError:
            return "json"  # a document cut short or broken: the JSON reader says where
    if LOG_SLOT.search(text[:2_000_000]) or "print_timing" in text or "llama_server" in text[:100_000]:
        return "log"
    raise TimingsParseError(f"line {first.no}: cannot tell what this is (not JSON, JSON Lines, "
                            f"server-sent events, a llama-server log or /metrics text): {head[:60]!r}")


def _read_text(source: Any, name: str | None, lenient: bool) -> tuple[str, str]:
    if isinstance(source, os.PathLike):
        path = Path(source)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InputNotFoundError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise InputNotFoundError(f"{path}: is a directory, expected a file") from None
        except OSError as e:  # permission denied, I/O error...
            raise InputNotFoundError(f"{path}: cannot read: {e.strerror or e}") from None
        name = name or str(path)
    elif isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    elif isinstance(source, str):
        return source, name or "<input>"
    elif hasattr(source, "read"):
        data = source.read()
        if isinstance(data, str):
            return data, name or getattr(source, "name", "<input>")
        name = name or getattr(source, "name", None)
    else:
        raise TypeError(f"parse() takes text, bytes, a path or a file, not {type(source).__name__}")
    name = name or "<input>"
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8"), name
    except UnicodeDecodeError as e:
        if lenient:
            return data.decode("utf-8", errors="replace"), name
        raise TimingsParseError(f"{name}: byte {e.start}: not UTF-8 text (0x{data[e.start]:02x}): "
                                "binary or garbage input") from None


def parse(source: str | bytes | os.PathLike | IO, *, format: str = "auto", lenient: bool = False,
          name: str | None = None, allow_plain: bool = False) -> Records:
    """Read timings records from any supported input.

    Args:
        source: the content (``str`` or ``bytes``), a path (``pathlib.Path``), or a file object.
            A ``str`` is always content, never a file name.
        format: one of ``FORMATS``; ``auto`` detects it. ``sglang`` reads JSON, JSON Lines or
            SSE whose objects must be SGLang responses.
        lenient: skip unreadable records instead of failing; ``Records.skipped`` lists them.
        name: what error messages call the input (default: the path, else ``<input>``).
        allow_plain: accept a log without any speculative line (its records have no draft data).

    Returns:
        Records (a list of RequestTimings) with ``format``, ``name`` and ``skipped``.

    Raises:
        TimingsParseError: the input cannot be read; the message names the line or byte.
        InputNotFoundError: ``source`` is a path that does not exist.
    """
    if format not in FORMATS:
        raise TimingsParseError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    text, name = _read_text(source, name, lenient)
    try:
        fmt = detect_format(text) if format in ("auto", "sglang") else format
    except TimingsParseError as e:
        raise TimingsParseError(f"{name}: {e}") from None
    engine = "sglang" if format == "sglang" else "any"
    if format == "sglang" and fmt not in ("json", "jsonl", "sse"):
        raise TimingsParseError(f"{name}: --format sglang reads JSON, JSON Lines or SSE; this looks like {fmt}")
    skipped: list[Skipped] = []
    if fmt == "json":
        recs = parse_json(text, name, engine, lenient, skipped)
    elif fmt == "jsonl":
        recs = parse_jsonl(text, name, engine, lenient, skipped)
    elif fmt == "sse":
        recs = parse_sse(text, name, engine, lenient, skipped)
    elif fmt == "log":
        recs = parse_log(text, name, lenient, skipped, allow_plain=allow_plain)
    else:
        recs = parse_metrics_records(text, name)
    recs = _possible(recs, lenient, skipped)
    if not recs:
        why = f" ({len(skipped)} unreadable, skipped; first: {skipped[0].reason})" if skipped else ""
        raise TimingsParseError(f"{name}: no timings records found{why}")
    for s in skipped:
        log.debug("skipped %s: %s", s.where, s.reason)
    return Records(recs, format=fmt if format != "sglang" else "sglang", name=name, skipped=skipped)


def _possible(recs: list[RequestTimings], lenient: bool, skipped: list[Skipped]) -> list[RequestTimings]:
    """The records that can be real (``record_problem``), whatever format they came from; an
    impossible one is an error, or skipped (and counted) when ``lenient``."""
    out = []
    for r in recs:
        problem = record_problem(r)
        if problem is None:
            out.append(r)
        elif lenient:
            skipped.append(Skipped(r.where or "?", problem))
        else:
            raise TimingsParseError(f"{r.where or 'record'}: {problem}")
    return out


def read(path: str | os.PathLike, **kw: Any) -> Records:
    """``parse(Path(path), **kw)``: read a file (a path given as a string)."""
    return parse(Path(path), **kw)


_JOIN_KEYS = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted")


def _same_request(r: RequestTimings, x: RequestTimings) -> bool:
    return all(getattr(r, k) is None or getattr(x, k) is None or getattr(r, k) == getattr(x, k)
               for k in _JOIN_KEYS) and (r.draft_n is None) == (x.draft_n is None)


def join(records: list[RequestTimings], exact: list[RequestTimings]) -> list[RequestTimings]:
    """Give response records the pass counts of the matching log (or metrics-delta) records.

    Matched in order: the log names requests by task id, and responses come in the same order.
    ``records`` may be a subset (say, only the non-streamed responses): each one takes the next
    record of ``exact`` that agrees on prompt_n, predicted_n, draft_n and draft_n_accepted.

    Returns:
        New records: ``passes``/``passes_source`` from ``exact`` where it has them exactly, and
        the log's task id, slot id, reported figures and per-position rates.

    Raises:
        TimingsParseError: a record has no matching request left in ``exact`` (both named).
    """
    out, j = [], 0
    for r in records:
        k = next((i for i in range(j, len(exact)) if _same_request(r, exact[i])), None)
        if k is None:
            near = exact[j] if j < len(exact) else None
            got = ", ".join(f"{f}={getattr(r, f)}" for f in _JOIN_KEYS)
            why = (f"the next one, {near.where}, has " + ", ".join(f"{f}={getattr(near, f)}" for f in _JOIN_KEYS)
                   if near else "none are left")
            raise TimingsParseError(f"{r.where} ({got}) matches no request of the log or metrics in "
                                    f"order: {why}")
        x, j = exact[k], k + 1
        new = replace(r, extra=dict(r.extra))
        if x.passes is not None and x.passes_source in ("log", "metrics", "reported"):
            new.passes, new.passes_source = x.passes, x.passes_source
        elif x.passes_source == "log-approx" and x.reported_accept_length is not None:
            passes_from_log(new, x.reported_accept_length)
        for f in ("task_id", "slot_id", "reported_acceptance_rate", "reported_accept_length",
                  "accepted_per_pos", "accept_rate_per_pos"):
            if getattr(new, f) is None:
                setattr(new, f, getattr(x, f))
        out.append(new)
    return out


# ---------------------------------------------------------------------------------------------
# Aggregates
# ---------------------------------------------------------------------------------------------


@dataclass
class Mean:
    """One figure over several requests: the plain mean of per-request values, and the pooled
    (token-weighted) value computed from summed counts. ``n``: requests that had the figure."""

    request_mean: float | None
    token_weighted: float | None
    n: int


@dataclass
class Summary:
    """Aggregates of a set of records (``summarize``). Sums cover all records; the draft sums
    cover records that drafted."""

    n_requests: int
    n_drafted: int
    prompt_n: int
    predicted_n: int
    draft_n: int
    draft_n_accepted: int
    passes: int
    passes_sources: dict[str, int]
    acceptance_rate: Mean
    accept_length: Mean
    mat: Mean
    tokens_per_pass: Mean
    decode_tps: Mean
    prompt_tps: Mean
    e2e_ms: Mean  # token_weighted: None (a time has no token weighting)
    e2e_ms_total: float | None
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(values: list[float | None]) -> tuple[float | None, int]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return (sum(vals) / len(vals) if vals else None), len(vals)


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return scale * num / den if den else None


def summarize(records: Iterable[RequestTimings]) -> Summary:
    """Aggregate records: counts, pass sources, and each METRICS figure as request mean and
    token-weighted (pooled) value. Token-weighted acceptance rate = sum A / sum G; accept length =
    1 + sum A / sum V; tokens per pass = sum N / sum V; speeds = 1000 sum N / sum predicted_ms.
    """
    recs = list(records)
    drafted = [r for r in recs if r.drafted]
    with_passes = [r for r in drafted if r.passes and r.draft_n_accepted is not None]
    with_tpp = [r for r in drafted if r.passes and r.predicted_n is not None]
    sources: dict[str, int] = {}
    for r in drafted:
        sources[r.passes_source or "unknown"] = sources.get(r.passes_source or "unknown", 0) + 1

    def m(values: list[float | None], weighted: float | None) -> Mean:
        mean, n = _mean(values)
        return Mean(mean, weighted, n)

    sum_a = sum(r.draft_n_accepted or 0 for r in drafted)
    sum_g = sum(r.draft_n or 0 for r in drafted)
    sum_av = sum(r.draft_n_accepted for r in with_passes)
    sum_v = sum(r.passes for r in with_passes)
    timed = [r for r in recs if r.predicted_n and r.predicted_ms]
    ptimed = [r for r in recs if r.prompt_n and r.prompt_ms]
    e2e = [r.end_to_end_ms for r in recs if r.end_to_end_ms is not None]
    return Summary(
        n_requests=len(recs), n_drafted=len(drafted),
        prompt_n=sum(r.prompt_n or 0 for r in recs), predicted_n=sum(r.predicted_n or 0 for r in recs),
        draft_n=sum_g, draft_n_accepted=sum_a, passes=sum(r.passes or 0 for r in drafted),
        passes_sources=sources,
        acceptance_rate=m([r.acceptance_rate for r in drafted], _ratio(sum_a, sum_g)),
        accept_length=m([r.accept_length for r in with_passes], 1.0 + sum_av / sum_v if sum_v else None),
        mat=m([r.mat for r in with_passes], _ratio(sum_av, sum_v)),
        tokens_per_pass=m([r.tokens_per_pass for r in with_tpp],
                          _ratio(sum(r.predicted_n for r in with_tpp), sum(r.passes for r in with_tpp))),
        decode_tps=m([r.decode_tps for r in recs],
                     _ratio(sum(r.predicted_n for r in timed), sum(r.predicted_ms for r in timed), 1000.0)),
        prompt_tps=m([r.prompt_tps for r in recs],
                     _ratio(sum(r.prompt_n for r in ptimed), sum(r.prompt_ms for r in ptimed), 1000.0)),
        e2e_ms=m(e2e, None), e2e_ms_total=sum(e2e) if e2e else None,
        skipped=len(getattr(records, "skipped", []) or []),
    )


__all__ = [
    "METRICS", "PASSES_SOURCES", "FORMATS", "RequestTimings", "Records", "Skipped", "Summary", "Mean",
    "MetricsScrape", "parse", "read", "detect_format", "parse_response", "parse_timings_object",
    "parse_sglang_response", "parse_metrics", "metrics_delta", "metrics_totals", "join",
    "passes_from_mean_len", "estimate_passes", "summarize",
]
