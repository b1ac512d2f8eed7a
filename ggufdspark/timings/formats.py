"""Reading timing records out of containers and engine output: JSON documents, JSON Lines,
server-sent events, llama-server logs and /metrics scrapes. Part of ``ggufdspark.timings``."""


from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Iterator

from ggufdspark.errors import TimingsParseError

from ggufdspark.timings.records import (  # noqa: F401
    RequestTimings,
    Skipped,
    error_text,
    llama_kind,
    records_from_value,
    estimate_passes,
    json_loads,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Text helpers: lines with byte offsets, JSON errors that name the place
# ---------------------------------------------------------------------------------------------


@dataclass
class _Line:
    no: int  # 1-based
    byte: int  # offset of the line's first byte
    text: str
    ended: bool  # a newline follows (False: the input stops inside this line)


def numbered_lines(text: str) -> Iterator[_Line]:
    byte = 0
    parts = text.split("\n")
    for i, part in enumerate(parts):
        ended = i < len(parts) - 1
        if not ended and part == "":
            return
        yield _Line(i + 1, byte, part.rstrip("\r"), ended)
        byte += len(part.encode("utf-8")) + 1


def _json_error(e: json.JSONDecodeError, name: str, doc: str, line: _Line | None = None,
                offset: int = 0) -> TimingsParseError:
    """A message naming the line, column and byte where ``json_loads(doc)`` failed. ``doc`` is a
    whole document (``line`` None) or starts at character ``offset`` of ``line``."""
    # an unterminated string runs to the end of the document: cut short as well
    cut = e.pos >= len(doc.rstrip()) or e.msg.startswith("Unterminated string")
    if line is None:
        lineno, col, byte = e.lineno, e.colno, len(doc[:e.pos].encode("utf-8"))
    else:
        pos = offset + e.pos
        lineno, col, byte = line.no, pos + 1, line.byte + len(line.text[:pos].encode("utf-8"))
    hint = ": the input ends before the JSON does (truncated?)" if cut else ""
    return TimingsParseError(f"{name}: line {lineno}, column {col} (byte {byte}): invalid JSON, {e.msg}{hint}")


# ---------------------------------------------------------------------------------------------
# Containers: one JSON document, JSON Lines, server-sent events
# ---------------------------------------------------------------------------------------------


def parse_json(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped],
                source: str = "response") -> list[RequestTimings]:
    try:
        value = json_loads(text)
    except json.JSONDecodeError as e:
        raise _json_error(e, name, text) from None
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        where = f"{name}[{i}]" if isinstance(value, list) else name
        try:
            out.extend(records_from_value(item, where, engine))
        except TimingsParseError as e:
            if not lenient:
                raise
            skipped.append(Skipped(where, str(e)))
    return out


def parse_jsonl(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped]) -> list[RequestTimings]:
    out = []
    for ln in numbered_lines(text):
        body = ln.text.strip()
        if not body:
            continue
        where = f"{name}:{ln.no}"
        try:
            try:
                value = json_loads(ln.text)
            except json.JSONDecodeError as e:
                raise _json_error(e, name, ln.text, ln) from None
            out.extend(records_from_value(value, where, engine))
        except TimingsParseError as e:
            if not lenient:
                raise
            skipped.append(Skipped(where, str(e)))
    return out


@dataclass
class _Stream:
    """One streamed request being read: the latest timings (llama) or meta_info (SGLang) seen."""

    first: _Line
    last: _Line
    final: dict | None = None
    kind: str = "completion"
    sglang: bool = False
    damage: str | None = None  # the first unreadable line (lenient mode)


def parse_sse(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped]) -> list[RequestTimings]:
    """Streamed responses, one after another. A request ends at ``[DONE]``, at a llama-server
    ``/completion`` chunk with ``"stop": true``, or at the end of the input; its record comes
    from the last chunk that carried ``timings`` (or ``meta_info``). In lenient mode a request
    with an unreadable line is skipped whole: its last timings may be missing or stale."""
    out: list[RequestTimings] = []
    cur: _Stream | None = None

    def fail(ln: _Line, msg: str) -> None:
        nonlocal cur
        if not lenient:
            raise TimingsParseError(msg)
        if cur is None:
            cur = _Stream(first=ln, last=ln)
        cur.last = ln
        cur.damage = cur.damage or msg

    def finish() -> None:
        nonlocal cur
        if cur is None:
            return
        where = f"{name}:{cur.first.no}"
        try:
            if cur.damage:
                raise TimingsParseError(cur.damage)
            if cur.final is None:
                raise TimingsParseError(
                    f"{name}: lines {cur.first.no}-{cur.last.no}: the streamed request has no chunk with "
                    f"{'meta_info' if cur.sglang else 'timings'} (the last chunk carries them: cut short?)")
            (rec,) = records_from_value(cur.final, where, "sglang" if cur.sglang else "llama.cpp")
            rec.source, rec.kind = "stream", (rec.kind if cur.sglang else cur.kind)
            out.append(rec)
        except TimingsParseError as e:
            if not lenient:
                raise
            skipped.append(Skipped(where, str(e)))
        cur = None

    for ln in numbered_lines(text):
        s = ln.text
        if not s.strip() or s.startswith(":") or s.startswith(("event:", "id:", "retry:")):
            continue
        if not s.startswith("data:"):
            fail(ln, f"{name}: line {ln.no} (byte {ln.byte}): not a server-sent-events line: {s[:60]!r}")
            continue
        payload = s[5:].lstrip(" ")
        if payload.strip() == "[DONE]":
            finish()
            continue
        try:
            obj = json_loads(payload)
        except json.JSONDecodeError as e:
            if ln.ended:
                fail(ln, str(_json_error(e, name, payload, ln, len(s) - len(payload))))
            else:
                fail(ln, f"{name}: line {ln.no} (byte {ln.byte}): the stream is cut mid-line: the input "
                         f"ends inside this data line ({e.msg})")
            continue
        if not isinstance(obj, dict):
            fail(ln, f"{name}: line {ln.no} (byte {ln.byte}): a data line holding a JSON "
                     f"{type(obj).__name__}, expected an object")
            continue
        if "error" in obj and "timings" not in obj:
            fail(ln, f"{name}: line {ln.no}: the server answered with an error: {error_text(obj)}")
            continue
        if cur is None:
            cur = _Stream(first=ln, last=ln)
        cur.last = ln
        if engine == "sglang" or (engine == "any" and "meta_info" in obj):
            cur.sglang, cur.final = True, obj
        else:
            if "timings" in obj:
                cur.final = obj
            if obj.get("object") or "content" in obj:
                cur.kind = llama_kind(obj)
            if obj.get("stop") is True:  # /completion: the final chunk, no [DONE] follows
                finish()
    finish()
    return out


# ---------------------------------------------------------------------------------------------
# llama-server logs
# ---------------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|inf|nan)"
# llama-server's per-request timing block (print_timings), in every layout it has printed since
# DSpark support; tests/fixtures/timings/layouts/ holds a sample of each:
#
# | layout (sample) | lines |
# |---|---|
# | per-line, the pinned tree (per-line-pinned.log) | every line prefixed "slot print_timing: id N | task T | "
#   (tools/server/server-context.cpp: one SLT_INF per line); "draft acceptance = R (A accepted /
#   G generated), mean len = L" |
# | per-line, builds with per-position rates (per-line-positions.log) | "..., mean acceptance length = L,
#   acceptance rate per position = (r0, r1, ...)" |
# | released builds (released.log) | the three timing lines in one SLT_INF that starts with "\n": a bare
#   prefix line, then the lines without prefix; "draft acceptance rate = R (A accepted / G generated)",
#   no mean length |
# | older builds (prefix-line-first.log) | the draft line too after a bare prefix line of its own |
#
# A bare timing line belongs to the slot and task of the prefix line just before it.
LOG_SLOT = re.compile(r"\bid\s+(?P<slot>\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*(?P<msg>.*)$")
_LOG_LINES = {
    "prompt": re.compile(rf"^prompt eval time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*tokens\s*"
                         rf"\(\s*{_NUM}\s*ms per token,\s*(?P<tps>{_NUM})\s*tokens per second\)"),
    "eval": re.compile(rf"^eval time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*(?:tokens|runs)\s*"
                       rf"\(\s*{_NUM}\s*ms per token,\s*(?P<tps>{_NUM})\s*tokens per second\)"),
    "total": re.compile(rf"^total time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*tokens"),
    "draft": re.compile(rf"^draft acceptance(?: rate)?\s*=\s*(?P<rate>{_NUM})\s*\(\s*(?P<acc>\d+)\s*accepted\s*/\s*"
                        rf"(?P<gen>\d+)\s*generated\s*\)(?:\s*,\s*(?:mean len|mean acceptance length)\s*=\s*"
                        rf"(?P<len>{_NUM})(?:\s*,\s*acceptance rate per position\s*=\s*\((?P<pos>[^)]*)\))?)?\s*$"),
    "per_pos": re.compile(r"^acc per pos\s*=\s*\((?P<pos>[^)]*)\)"),
}
# A line that says one of these but matches none of the patterns above is malformed.
_LOG_KEYWORDS = {"prompt eval time": "prompt", "eval time": "eval", "total time": "total",
                 "draft acceptance": "draft", "acc per pos": "per_pos"}
_SPEC_LINE_EXAMPLE = "draft acceptance = R (A accepted / G generated), mean len = L"


def passes_from_mean_len(accepted: int, mean_len: float, drafted: int, *, decimals: int = 2) -> list[int]:
    """Every pass count V (1 <= V <= drafted) for which ``1 + accepted / V`` prints as ``mean_len``.

    The log prints ``mean len`` with ``decimals`` decimals; when one integer fits, the pass
    count is exact. No information when nothing was accepted (every V prints 1.00): [].
    """
    if accepted <= 0 or drafted <= 0 or not math.isfinite(mean_len):
        return []
    half = 0.5 * 10 ** -decimals
    hi_ratio, lo_ratio = mean_len - 1 + half, mean_len - 1 - half
    if hi_ratio <= 0:
        return []
    lo = max(1, math.floor(accepted / hi_ratio))
    hi = drafted if lo_ratio <= 0 else min(drafted, math.ceil(accepted / lo_ratio))
    want = f"{mean_len:.{decimals}f}"
    return [v for v in range(lo, hi + 1) if f"{1.0 + accepted / v:.{decimals}f}" == want]


def passes_from_log(r: RequestTimings, mean_len: float) -> None:
    est = estimate_passes(r.predicted_n, r.draft_n_accepted)
    cands = passes_from_mean_len(r.draft_n_accepted or 0, mean_len, r.draft_n or 0)
    if len(cands) == 1:
        r.passes, r.passes_source = cands[0], "log"
    elif cands:
        target = est if est is not None else cands[len(cands) // 2]
        r.passes, r.passes_source = min(cands, key=lambda v: abs(v - target)), "log-approx"
    else:
        r.passes, r.passes_source = est, ("estimated" if est is not None else None)


def _floats(text: str, where: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TimingsParseError(f"{where}: per-position rates '({text[:60]})' are not numbers") from None


def parse_log(text: str, name: str, lenient: bool, skipped: list[Skipped], *,
               allow_plain: bool = False) -> list[RequestTimings]:
    """Per-request records from a llama-server log (one per slot/task timing block, in order)."""
    recs: list[RequestTimings] = []
    open_: dict[tuple[int, int], RequestTimings] = {}
    bad: set[int] = set()
    n_spec = 0
    block: tuple[int, int] | None = None  # the slot and task a bare timing line belongs to
    for ln in numbered_lines(text):
        m = LOG_SLOT.search(ln.text)
        msg = (m.group("msg") if m else ln.text).strip()
        what = next((k for kw, k in _LOG_KEYWORDS.items() if msg.startswith(kw)), None)
        if m:
            key = (int(m.group("slot")), int(m.group("task")))
            block = key if (what or not msg) else None
        elif what and block is not None:
            key = block  # the one-call and prefix-first layouts: no prefix on this line
        else:
            block = None if msg else block
            continue
        if what is None:
            continue
        where = f"{name}:{ln.no}"
        mm = _LOG_LINES[what].match(msg)
        rec = open_.get(key)
        if mm is None:
            err = f"{name}: line {ln.no} (byte {ln.byte}): unreadable '{what}' timing line: {msg[:90]!r}"
            if not lenient:
                raise TimingsParseError(err)
            skipped.append(Skipped(where, err))
            if what == "prompt" or rec is None:  # the block this line starts or belongs to
                rec = open_[key] = RequestTimings(source="log", where=where, slot_id=key[0], task_id=key[1])
                recs.append(rec)
            bad.add(id(rec))
            continue
        if what == "prompt" or rec is None or (what == "eval" and rec.predicted_n is not None):
            rec = RequestTimings(source="log", kind="log", where=where, slot_id=key[0], task_id=key[1])
            open_[key] = rec
            recs.append(rec)
        g = mm.groupdict()
        if what == "prompt":
            rec.prompt_ms, rec.prompt_n, rec.prompt_per_second = float(g["ms"]), int(g["n"]), float(g["tps"])
        elif what == "eval":
            rec.predicted_ms, rec.predicted_n = float(g["ms"]), int(g["n"])
            rec.predicted_per_second = float(g["tps"])
        elif what == "total":
            rec.e2e_ms = float(g["ms"])
        elif what == "draft":
            n_spec += 1
            rec.draft_n, rec.draft_n_accepted = int(g["gen"]), int(g["acc"])
            rec.reported_acceptance_rate = float(g["rate"])
            if g.get("pos"):
                rec.accept_rate_per_pos = _floats(g["pos"], where)
            if g.get("len") is not None:
                rec.reported_accept_length = float(g["len"])
                passes_from_log(rec, rec.reported_accept_length)
            else:  # the released builds print no mean length: verify passes estimated from the counts
                est = estimate_passes(rec.predicted_n, rec.draft_n_accepted)
                rec.passes, rec.passes_source = est, ("estimated" if est is not None else None)
        elif what == "per_pos" and g["pos"].strip():
            rec.accept_rate_per_pos = _floats(g["pos"], where)
    if not recs:
        raise TimingsParseError(f"{name}: no llama-server per-request timing lines "
                                "('slot print_timing: id N | task N | prompt eval time = ...') found")
    if n_spec == 0 and not allow_plain:
        raise TimingsParseError(f"{name}: {len(recs)} request(s) in the log but no speculative line "
                                f"('{_SPEC_LINE_EXAMPLE}'): the server ran without a draft, or nothing "
                                "was drafted")
    if bad:
        recs = [r for r in recs if id(r) not in bad]
    return recs
