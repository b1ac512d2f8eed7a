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
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from ggufdspark.errors import InputNotFoundError, TimingsParseError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Facts: the figures, their formulas, and where pass counts come from
# ---------------------------------------------------------------------------------------------

# name -> (formula, meaning). Each has a per-request value (a RequestTimings property) and a
# request-mean and token-weighted aggregate (Summary).
METRICS: dict[str, tuple[str, str]] = {
    "acceptance_rate": ("A / G", "share of drafted tokens the target accepted"),
    "accept_length": ("1 + A / V", "tokens per target verify pass, bonus token included "
                                   "(llama.cpp 'mean len', vLLM 'mean acceptance length')"),
    "mat": ("A / V", "MMSpec's mean accepted tokens: accept length minus the bonus token"),
    "tokens_per_pass": ("N / V", "generated tokens per verify pass (SGLang 'spec_accept_length'); "
                                 "also counts tokens made outside verify passes"),
    "decode_tps": ("1000 N / predicted_ms", "decode speed, tokens per second"),
    "prompt_tps": ("1000 P / prompt_ms", "prompt processing speed, tokens per second"),
    "e2e_ms": ("prompt_ms + predicted_ms", "end-to-end time of the request on the server "
                                            "(SGLang: e2e_latency, queueing included)"),
}
# Symbols: A accepted drafted tokens (draft_n_accepted), G drafted tokens (draft_n),
# V target verify passes (passes), N generated tokens (predicted_n), P prompt tokens (prompt_n).

# passes_source -> how the number of target verify passes was obtained.
PASSES_SOURCES: dict[str, str] = {
    "metrics": "exact: difference of spec_decode_num_drafts_total between two /metrics scrapes",
    "log": "exact: the only integer V with 1 + A/V printing as the log's 'mean len'",
    "log-approx": "several integers fit the log's 2-decimal 'mean len'; the one nearest the estimate",
    "reported": "exact: the engine's own count (SGLang spec_verify_ct)",
    "estimated": "N - A - 1: each verify pass emits its accepted tokens plus one of the target's, "
                 "and the first token comes from the prompt pass; off by the plain (draft-less) "
                 "decode steps and by tokens a stop cut off",
}

FORMATS = ("auto", "json", "jsonl", "sse", "log", "metrics", "sglang")

# llama-server /metrics counters (tools/server/server-task.cpp, to_metrics), prefix "llamacpp:".
METRICS_PREFIX = "llamacpp:"
_COUNTERS = {
    "draft_n": "spec_decode_num_draft_tokens_total",
    "draft_n_accepted": "spec_decode_num_accepted_tokens_total",
    "passes": "spec_decode_num_drafts_total",
    "prompt_n": "prompt_tokens_total",
    "cache_n": "prompt_tokens_cached_total",
    "prompt_s": "prompt_seconds_total",
    "predicted_n": "tokens_predicted_total",
    "predicted_s": "tokens_predicted_seconds_total",
}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"

# SGLang meta_info names (python/sglang/srt/managers/tokenizer_manager.py; they moved between
# versions, so every spelling seen there is listed, first found wins).
_SGLANG_ACCEPTED = ("spec_accept_token_num", "spec_accepted_drafts", "spec_num_correct_drafts",
                    "spec_accepted_tokens")
_SGLANG_DRAFTED = ("spec_draft_token_num", "spec_proposed_drafts", "spec_num_proposed_drafts")

# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass
class RequestTimings:
    """Timings of one request (or one metrics interval). Fields the engine did not send are None.

    ``draft_n`` / ``draft_n_accepted`` are None when nothing was drafted (llama-server omits them
    then). ``passes`` is the number of target verify passes and ``passes_source`` says how it was
    obtained (a key of ``PASSES_SOURCES``). ``reported_*`` keep the engine's own rounded figures
    (log ``draft acceptance`` / ``mean len``, SGLang ``spec_accept_rate`` / ``spec_accept_length``).
    """

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    prompt_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    cache_n: int | None = None
    passes: int | None = None
    passes_source: str | None = None  # a key of PASSES_SOURCES
    source: str = "response"  # "response", "stream", "log", "metrics"
    engine: str = "llama.cpp"  # or "sglang"
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None  # "completion", "v1-completion", "chat", "log", "metrics-delta", ...
    where: str | None = None  # "file:line" (or "file[i]") the record was read from
    task_id: int | None = None
    slot_id: int | None = None
    e2e_ms: float | None = None
    accepted_per_pos: list[int] | None = None  # verify passes accepting >= i+1 drafted tokens
    accept_rate_per_pos: list[float] | None = None  # the same, per verify pass
    reported_acceptance_rate: float | None = None
    reported_accept_length: float | None = None

    @property
    def drafted(self) -> bool:
        """Whether the request speculated (drafted tokens, or verify passes where only those are known)."""
        return bool(self.draft_n) or bool(self.passes)

    @property
    def passes_estimated(self) -> bool:
        return self.passes_source == "estimated"

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted."""
        if not self.draft_n or self.draft_n_accepted is None:
            return None
        return self.draft_n_accepted / self.draft_n

    @property
    def accept_length(self) -> float | None:
        """1 + accepted / passes: tokens per target verify pass, bonus token included."""
        if not self.passes or self.draft_n_accepted is None:
            return None
        return 1.0 + self.draft_n_accepted / self.passes

    @property
    def mat(self) -> float | None:
        """MMSpec's mean accepted tokens: accept length minus the bonus token."""
        al = self.accept_length
        return None if al is None else al - 1.0

    @property
    def tokens_per_pass(self) -> float | None:
        """predicted_n / passes (SGLang's accept-length convention)."""
        if not self.passes or self.predicted_n is None:
            return None
        return self.predicted_n / self.passes

    @property
    def decode_tps(self) -> float | None:
        """Generated tokens per second of decode time; None for a single token (llama.cpp times
        decoding from the first token, which the prompt pass produced)."""
        if self.predicted_n is not None and self.predicted_n < 2:
            return None
        if self.predicted_n and self.predicted_ms:
            return 1000.0 * self.predicted_n / self.predicted_ms
        return self.predicted_per_second

    @property
    def prompt_tps(self) -> float | None:
        if self.prompt_n and self.prompt_ms:
            return 1000.0 * self.prompt_n / self.prompt_ms
        return self.prompt_per_second

    @property
    def end_to_end_ms(self) -> float | None:
        if self.e2e_ms is not None:
            return self.e2e_ms
        if self.prompt_ms is not None and self.predicted_ms is not None:
            return self.prompt_ms + self.predicted_ms
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, accept_length=self.accept_length, mat=self.mat,
                 tokens_per_pass=self.tokens_per_pass, decode_tps=self.decode_tps,
                 prompt_tps=self.prompt_tps, end_to_end_ms=self.end_to_end_ms)
        return d


@dataclass
class Skipped:
    """A record ``lenient`` parsing left out, and why."""

    where: str
    reason: str


class Records(list):
    """The records ``parse`` read (a list of RequestTimings) plus what it detected and skipped."""

    def __init__(self, items: Iterable[RequestTimings] = (), *, format: str = "", name: str = "",
                 skipped: list[Skipped] | None = None):
        super().__init__(items)
        self.format = format
        self.name = name
        self.skipped: list[Skipped] = skipped or []


# ---------------------------------------------------------------------------------------------
# Responses (llama-server and SGLang JSON objects)
# ---------------------------------------------------------------------------------------------

_INT_FIELDS = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted", "cache_n")
_FLOAT_FIELDS = ("prompt_ms", "predicted_ms", "predicted_per_second", "prompt_per_second")


def _number(value: Any, cast: type, key: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimingsParseError(f"{where}: '{key}' is {json.dumps(value)[:40]}, expected a number")
    if cast is int:
        if isinstance(value, float) and not value.is_integer():
            raise TimingsParseError(f"{where}: '{key}' is {value}, expected a whole number")
        return int(value)
    return float(value)


def estimate_passes(predicted_n: int | None, accepted: int | None) -> int | None:
    """``predicted_n - accepted - 1`` (at least 1): the ``estimated`` pass count, see PASSES_SOURCES."""
    if predicted_n is None or accepted is None:
        return None
    return max(1, predicted_n - accepted - 1)


def _with_estimate(r: RequestTimings) -> RequestTimings:
    if r.drafted and r.passes is None:
        r.passes = estimate_passes(r.predicted_n, r.draft_n_accepted)
        r.passes_source = "estimated" if r.passes is not None else None
    return r


def parse_timings_object(t: dict, *, where: str = "response") -> RequestTimings:
    """A llama-server ``timings`` object to RequestTimings (passes estimated when it drafted).

    Raises:
        TimingsParseError: not an object, or a known field is not a number.
    """
    if not isinstance(t, dict):
        raise TimingsParseError(f"{where}: 'timings' is a {type(t).__name__}, expected an object")
    r = RequestTimings(where=where)
    for k, v in t.items():
        if k in _INT_FIELDS:
            setattr(r, k, _number(v, int, k, where))
        elif k in _FLOAT_FIELDS:
            setattr(r, k, _number(v, float, k, where))
        else:
            r.extra[k] = v
    if r.prompt_ms is not None and r.predicted_ms is not None:
        r.e2e_ms = r.prompt_ms + r.predicted_ms
    return _with_estimate(r)


def _llama_kind(obj: dict) -> str:
    kind = {"chat.completion": "chat", "chat.completion.chunk": "chat",
            "text_completion": "v1-completion"}.get(obj.get("object"))
    if kind:
        return kind
    return "completion" if "content" in obj or "stop" in obj else "other"


def parse_response(obj: dict, *, where: str = "response") -> RequestTimings:
    """Timings of one llama-server JSON response (/completion, /v1/completions, /v1/chat/completions).

    Raises:
        TimingsParseError: the response carries no ``timings`` object (an error response says so).
    """
    if isinstance(obj, dict) and "error" in obj and "timings" not in obj:
        raise TimingsParseError(f"{where}: the server answered with an error: {_error_text(obj)}")
    if not isinstance(obj, dict) or "timings" not in obj:
        keys = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise TimingsParseError(f"{where}: no 'timings' object in the response (found: {keys})")
    r = parse_timings_object(obj["timings"], where=where)
    r.kind = _llama_kind(obj)
    return r


def parse_sglang_response(obj: dict, *, where: str = "response") -> RequestTimings:
    """Timings of one SGLang native response (``/generate``: ``text`` + ``meta_info``).

    ``spec_verify_ct`` gives exact passes (``reported``); accepted and drafted counts are read
    under any of their spellings, else derived from ``spec_accept_histogram`` (verify passes by
    number of accepted drafts) or from ``spec_accept_rate``. See docs/timings.md for the fields.

    Raises:
        TimingsParseError: no ``meta_info`` object, or a field is not a number.
    """
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        raise TimingsParseError(f"{where}: no 'meta_info' object (an SGLang response) found")

    def num(key: str, cast: type = int) -> Any:
        v = meta.get(key)
        return None if v is None else _number(v, cast, key, where)

    def first(keys: tuple[str, ...]) -> int | None:
        for k in keys:
            if meta.get(k) is not None:
                return num(k)
        return None

    r = RequestTimings(source="response", engine="sglang", kind="sglang-generate", where=where,
                       prompt_n=num("prompt_tokens"), predicted_n=num("completion_tokens"),
                       cache_n=num("cached_tokens"))
    if (lat := num("e2e_latency", float)) is not None:
        r.e2e_ms = 1000.0 * lat
    r.predicted_per_second = num("decode_throughput", float)
    r.reported_accept_length = num("spec_accept_length", float)
    r.reported_acceptance_rate = num("spec_accept_rate", float)
    verify = num("spec_verify_ct")
    accepted, drafted = first(_SGLANG_ACCEPTED), first(_SGLANG_DRAFTED)
    hist = meta.get("spec_accept_histogram")
    if isinstance(hist, list) and hist:
        counts = [_number(c, int, "spec_accept_histogram", where) for c in hist]
        if accepted is None:
            accepted = sum(i * c for i, c in enumerate(counts))
        r.accepted_per_pos = [sum(counts[i + 1:]) for i in range(len(counts) - 1)]
        if verify is not None and sum(counts) != verify:
            log.warning("%s: spec_accept_histogram counts %d passes, spec_verify_ct says %d",
                        where, sum(counts), verify)
    if accepted is None and drafted and r.reported_acceptance_rate is not None:
        accepted = round(r.reported_acceptance_rate * drafted)
    if verify:
        r.passes, r.passes_source = verify, "reported"
        r.draft_n, r.draft_n_accepted = drafted, accepted
        if r.accepted_per_pos is not None:
            r.accept_rate_per_pos = [c / verify for c in r.accepted_per_pos]
    r.extra = {k: v for k, v in meta.items() if not isinstance(v, (list, dict)) or k == "finish_reason"}
    return r


def _error_text(obj: dict) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        return f"{err.get('message', err)} (code {err.get('code', '?')})"
    return str(err)[:200]


def _records_from_value(value: Any, where: str, engine: str) -> Iterator[RequestTimings]:
    """Records of one JSON value: a response, a bare timings object, or a list of those."""
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from _records_from_value(v, f"{where}[{i}]", engine)
        return
    if not isinstance(value, dict):
        raise TimingsParseError(f"{where}: a JSON {type(value).__name__}, expected a response object")
    if "error" in value and "timings" not in value and "meta_info" not in value:
        raise TimingsParseError(f"{where}: the server answered with an error: {_error_text(value)}")
    if engine == "sglang" or (engine == "any" and "meta_info" in value):
        yield parse_sglang_response(value, where=where)
    elif "timings" in value:
        yield parse_response(value, where=where)
    elif "predicted_n" in value or "prompt_n" in value:  # a bare timings object
        yield parse_timings_object(value, where=where)
    else:
        keys = ", ".join(list(value)[:8])
        raise TimingsParseError(f"{where}: no 'timings' (llama-server) or 'meta_info' (SGLang) in "
                                f"this response (found: {keys})")


# ---------------------------------------------------------------------------------------------
# Text helpers: lines with byte offsets, JSON errors that name the place
# ---------------------------------------------------------------------------------------------


@dataclass
class _Line:
    no: int  # 1-based
    byte: int  # offset of the line's first byte
    text: str
    ended: bool  # a newline follows (False: the input stops inside this line)


def _lines(text: str) -> Iterator[_Line]:
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
    """A message naming the line, column and byte where ``json.loads(doc)`` failed. ``doc`` is a
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


def _parse_json(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped],
                source: str = "response") -> list[RequestTimings]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise _json_error(e, name, text) from None
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        where = f"{name}[{i}]" if isinstance(value, list) else name
        try:
            out.extend(_records_from_value(item, where, engine))
        except TimingsParseError as e:
            if not lenient:
                raise
            skipped.append(Skipped(where, str(e)))
    return out


def _parse_jsonl(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped]) -> list[RequestTimings]:
    out = []
    for ln in _lines(text):
        body = ln.text.strip()
        if not body:
            continue
        where = f"{name}:{ln.no}"
        try:
            try:
                value = json.loads(ln.text)
            except json.JSONDecodeError as e:
                raise _json_error(e, name, ln.text, ln) from None
            out.extend(_records_from_value(value, where, engine))
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


def _parse_sse(text: str, name: str, engine: str, lenient: bool, skipped: list[Skipped]) -> list[RequestTimings]:
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
            (rec,) = _records_from_value(cur.final, where, "sglang" if cur.sglang else "llama.cpp")
            rec.source, rec.kind = "stream", (rec.kind if cur.sglang else cur.kind)
            out.append(rec)
        except TimingsParseError as e:
            if not lenient:
                raise
            skipped.append(Skipped(where, str(e)))
        cur = None

    for ln in _lines(text):
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
            obj = json.loads(payload)
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
            fail(ln, f"{name}: line {ln.no}: the server answered with an error: {_error_text(obj)}")
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
                cur.kind = _llama_kind(obj)
            if obj.get("stop") is True:  # /completion: the final chunk, no [DONE] follows
                finish()
    finish()
    return out


# ---------------------------------------------------------------------------------------------
# llama-server logs
# ---------------------------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|inf|nan)"
# tools/server/server-context.cpp print_timings(): SLT_INF lines "slot print_timing: id %2d |
# task %d | ...". The draft line has two spellings: this engine's "mean len = L" and other
# builds' "mean acceptance length = L, acceptance rate per position = (r0, r1, ...)".
_LOG_SLOT = re.compile(r"\bid\s+(?P<slot>\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|\s*(?P<msg>.*)$")
_LOG_LINES = {
    "prompt": re.compile(rf"^prompt eval time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*tokens\s*"
                         rf"\(\s*{_NUM}\s*ms per token,\s*(?P<tps>{_NUM})\s*tokens per second\)"),
    "eval": re.compile(rf"^eval time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*(?:tokens|runs)\s*"
                       rf"\(\s*{_NUM}\s*ms per token,\s*(?P<tps>{_NUM})\s*tokens per second\)"),
    "total": re.compile(rf"^total time\s*=\s*(?P<ms>{_NUM})\s*ms\s*/\s*(?P<n>\d+)\s*tokens"),
    "draft": re.compile(rf"^draft acceptance\s*=\s*(?P<rate>{_NUM})\s*\(\s*(?P<acc>\d+)\s*accepted\s*/\s*"
                        rf"(?P<gen>\d+)\s*generated\s*\)\s*,\s*(?:mean len|mean acceptance length)\s*=\s*"
                        rf"(?P<len>{_NUM})(?:\s*,\s*acceptance rate per position\s*=\s*\((?P<pos>[^)]*)\))?"),
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


def _passes_from_log(r: RequestTimings, mean_len: float) -> None:
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


def _parse_log(text: str, name: str, lenient: bool, skipped: list[Skipped], *,
               allow_plain: bool = False) -> list[RequestTimings]:
    """Per-request records from a llama-server log (one per slot/task timing block, in order)."""
    recs: list[RequestTimings] = []
    open_: dict[tuple[int, int], RequestTimings] = {}
    bad: set[int] = set()
    n_spec = 0
    for ln in _lines(text):
        m = _LOG_SLOT.search(ln.text)
        if not m:
            continue
        msg = m.group("msg").strip()
        what = next((k for kw, k in _LOG_KEYWORDS.items() if msg.startswith(kw)), None)
        if what is None:
            continue
        key = (int(m.group("slot")), int(m.group("task")))
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
            rec.reported_acceptance_rate, rec.reported_accept_length = float(g["rate"]), float(g["len"])
            if g.get("pos"):
                rec.accept_rate_per_pos = _floats(g["pos"], where)
            _passes_from_log(rec, rec.reported_accept_length)
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


# ---------------------------------------------------------------------------------------------
# /metrics (Prometheus text)
# ---------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass
class MetricsScrape:
    """One ``/metrics`` scrape: sample values by (name, labels)."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    name: str = "metrics"
    line: int = 1  # of its first sample

    @property
    def where(self) -> str:
        return f"{self.name}:{self.line}"

    def get(self, name: str, **labels: str) -> float | None:
        return self.values.get((METRICS_PREFIX + name, tuple(sorted(labels.items()))))

    def per_pos(self) -> list[float]:
        pos = {}
        for (n, labels), v in self.values.items():
            if n == METRICS_PREFIX + _PER_POS:
                lab = dict(labels)
                if lab.get("position", "").isdigit():
                    pos[int(lab["position"])] = v
        return [pos.get(i, 0.0) for i in range(max(pos) + 1)] if pos else []


def parse_metrics(text: str, *, name: str = "metrics") -> list[MetricsScrape]:
    """Scrapes in ``/metrics`` text; several concatenated scrapes split where a sample repeats.

    Raises:
        TimingsParseError: a line is not a Prometheus sample, or there are no llama-server
            speculative counters.
    """
    scrapes: list[MetricsScrape] = []
    cur: dict = {}
    start = 0
    for ln in _lines(text):
        s = ln.text.strip()
        if not s or s.startswith("#"):
            continue
        m = _SAMPLE.match(s)
        if not m:
            raise TimingsParseError(f"{name}: line {ln.no} (byte {ln.byte}): not a Prometheus sample "
                                    f"line: {s[:60]!r}")
        try:
            value = float(m.group("value"))
        except ValueError:
            raise TimingsParseError(f"{name}: line {ln.no} (byte {ln.byte}): value "
                                    f"{m.group('value')!r} is not a number") from None
        key = (m.group("name"), tuple(sorted(_LABEL.findall(m.group("labels") or ""))))
        if key in cur:
            scrapes.append(MetricsScrape(cur, name, start))
            cur = {}
        if not cur:
            start = ln.no
        cur[key] = value
    if cur:
        scrapes.append(MetricsScrape(cur, name, start))
    if not scrapes or any(s.get(_COUNTERS["passes"]) is None for s in scrapes):
        raise TimingsParseError(f"{name}: no '{METRICS_PREFIX}{_COUNTERS['passes']}' counter: not "
                                "llama-server /metrics output (start it with --metrics), or a build "
                                "without speculative counters")
    return scrapes


def _scrape(x: str | MetricsScrape, name: str) -> MetricsScrape:
    if isinstance(x, MetricsScrape):
        return x
    scrapes = parse_metrics(x, name=name)
    if len(scrapes) != 1:
        raise TimingsParseError(f"{name}: {len(scrapes)} scrapes in the text, expected one")
    return scrapes[0]


def _metrics_record(values: dict[str, float], per_pos: list[float], where: str, kind: str) -> RequestTimings:
    r = RequestTimings(source="metrics", kind=kind, where=where,
                       prompt_n=round(values["prompt_n"]), cache_n=round(values["cache_n"]),
                       prompt_ms=1000.0 * values["prompt_s"], predicted_n=round(values["predicted_n"]),
                       predicted_ms=1000.0 * values["predicted_s"])
    if round(values["draft_n"]) > 0:
        r.draft_n, r.draft_n_accepted = round(values["draft_n"]), round(values["draft_n_accepted"])
        r.passes, r.passes_source = round(values["passes"]), "metrics"
        r.accepted_per_pos = [round(p) for p in per_pos] or None
        if r.accepted_per_pos and r.passes:
            r.accept_rate_per_pos = [p / r.passes for p in r.accepted_per_pos]
    return r


def _counter_values(s: MetricsScrape) -> dict[str, float]:
    return {k: (s.get(name) or 0.0) for k, name in _COUNTERS.items()}


def metrics_totals(scrape: str | MetricsScrape, *, name: str = "metrics") -> RequestTimings:
    """Everything since the server started, from one scrape (``kind="metrics-total"``)."""
    s = _scrape(scrape, name)
    return _metrics_record(_counter_values(s), s.per_pos(), s.where, "metrics-total")


def metrics_delta(before: str | MetricsScrape, after: str | MetricsScrape, *,
                  name: str = "metrics") -> RequestTimings:
    """What happened between two ``/metrics`` scrapes: with one request in flight, that request's
    exact drafted, accepted, verify-pass and per-position counts (``passes_source="metrics"``).

    The counters grow when a request finishes, so scrape before sending and after the answer.

    Raises:
        TimingsParseError: a scrape is not llama-server metrics, or a counter went down (the
            server restarted between the scrapes).
    """
    b, a = _scrape(before, f"{name} (before)"), _scrape(after, f"{name} (after)")
    vb, va = _counter_values(b), _counter_values(a)
    for k, name_ in _COUNTERS.items():
        if va[k] < vb[k]:
            raise TimingsParseError(f"{name}: counter {METRICS_PREFIX}{name_} went down from {vb[k]:g} "
                                    f"to {va[k]:g}: the server restarted between the scrapes")
    pb, pa = b.per_pos(), a.per_pos()
    pb += [0.0] * (len(pa) - len(pb))
    delta = {k: va[k] - vb[k] for k in _COUNTERS}
    where = f"{b.name}:{b.line}..{a.line}" if a.name == b.name else f"{b.where}..{a.where}"
    return _metrics_record(delta, [x - y for x, y in zip(pa, pb)], where, "metrics-delta")


def _parse_metrics_records(text: str, name: str) -> list[RequestTimings]:
    scrapes = parse_metrics(text, name=name)
    if len(scrapes) == 1:
        return [metrics_totals(scrapes[0], name=name)]
    out = []
    for b, a in zip(scrapes, scrapes[1:]):
        r = metrics_delta(b, a, name=name)
        if r.predicted_n or r.prompt_n or r.draft_n:  # an interval where nothing ran is no request
            out.append(r)
    return out


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def detect_format(text: str) -> str:
    """``json``, ``jsonl``, ``sse``, ``log`` or ``metrics``, from the content.

    Raises:
        TimingsParseError: none of them (the message quotes the first line).
    """
    first = next((ln for ln in _lines(text) if ln.text.strip()), None)
    if first is None:
        raise TimingsParseError("empty input")
    head = first.text.strip()
    if head.startswith(("data:", "event:")):
        return "sse"
    if head.startswith("#") or head.startswith(METRICS_PREFIX):
        for ln in _lines(text[:20_000]):
            s = ln.text.strip()
            if s.startswith(("# HELP", "# TYPE")) or (s.startswith(METRICS_PREFIX) and _SAMPLE.match(s)):
                return "metrics"
    if head.startswith(("{", "[")):
        try:
            json.loads(text)
            return "json"
        except json.JSONDecodeError:
            pass
        try:
            json.loads(head)
            return "jsonl"
        except json.JSONDecodeError:
            return "json"  # a document cut short or broken: the JSON reader says where
    if _LOG_SLOT.search(text[:2_000_000]) or "print_timing" in text or "llama_server" in text[:100_000]:
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
        recs = _parse_json(text, name, engine, lenient, skipped)
    elif fmt == "jsonl":
        recs = _parse_jsonl(text, name, engine, lenient, skipped)
    elif fmt == "sse":
        recs = _parse_sse(text, name, engine, lenient, skipped)
    elif fmt == "log":
        recs = _parse_log(text, name, lenient, skipped, allow_plain=allow_plain)
    else:
        recs = _parse_metrics_records(text, name)
    if not recs:
        why = f" ({len(skipped)} unreadable, skipped; first: {skipped[0].reason})" if skipped else ""
        raise TimingsParseError(f"{name}: no timings records found{why}")
    for s in skipped:
        log.debug("skipped %s: %s", s.where, s.reason)
    return Records(recs, format=fmt if format != "sglang" else "sglang", name=name, skipped=skipped)


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
            _passes_from_log(new, x.reported_accept_length)
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
