"""Timing records: the figures and their formulas, one request's record, and reading one JSON
response (llama-server or SGLang). Part of ``ggufdspark.timings``."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator

from ggufdspark.errors import TimingsParseError

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
COUNTERS = {
    "draft_n": "spec_decode_num_draft_tokens_total",
    "draft_n_accepted": "spec_decode_num_accepted_tokens_total",
    "passes": "spec_decode_num_drafts_total",
    "prompt_n": "prompt_tokens_total",
    "cache_n": "prompt_tokens_cached_total",
    "prompt_s": "prompt_seconds_total",
    "predicted_n": "tokens_predicted_total",
    "predicted_s": "tokens_predicted_seconds_total",
}
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"

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

def json_loads(text: str) -> Any:
    """``json.loads`` for untrusted input: nesting too deep for the parser and integers too long to
    convert fail as JSONDecodeError, like any other broken JSON (the caller names the place)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # Python's limit on integer digits
        raise json.JSONDecodeError(str(e).split(";")[0], text, 0) from None


# The largest count taken at face value: beyond it float arithmetic (rates, lengths) is inexact.
MAX_COUNT = 2**53
_COUNT_FIELDS = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted", "cache_n", "passes")
_AMOUNT_FIELDS = ("prompt_ms", "predicted_ms", "predicted_per_second", "prompt_per_second", "e2e_ms",
                  "reported_acceptance_rate", "reported_accept_length")


def record_problem(r: RequestTimings) -> str | None:
    """Why ``r`` cannot be a real request's timings, or None.

    Counts are whole numbers 0..MAX_COUNT, times and speeds finite and not negative, and no more
    drafted tokens are accepted than were drafted.
    """
    for k in _COUNT_FIELDS:
        v = getattr(r, k)
        if v is not None and not (0 <= v <= MAX_COUNT):
            return f"'{k}' is {str(v)[:40]}, expected a count 0..{MAX_COUNT}"
    for k in _AMOUNT_FIELDS:
        v = getattr(r, k)
        if v is not None and not (math.isfinite(v) and v >= 0):
            return f"'{k}' is {v}, expected a finite number >= 0"
    for i, v in enumerate(r.accepted_per_pos or []):
        if not (0 <= v <= MAX_COUNT):
            return f"accepted_per_pos[{i}] is {str(v)[:40]}, expected a count 0..{MAX_COUNT}"
    if r.draft_n is not None and r.draft_n_accepted is not None and r.draft_n_accepted > r.draft_n:
        return f"{r.draft_n_accepted} drafted tokens accepted of {r.draft_n} drafted: impossible"
    return None


_INT_FIELDS = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted", "cache_n")
_FLOAT_FIELDS = ("prompt_ms", "predicted_ms", "predicted_per_second", "prompt_per_second")


def _number(value: Any, cast: type, key: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TimingsParseError(f"{where}: '{key}' is {json.dumps(value)[:40]}, expected a number")
    if isinstance(value, float) and not math.isfinite(value):  # NaN / Infinity, which JSON lacks
        raise TimingsParseError(f"{where}: '{key}' is {value}, expected a finite number")
    if cast is int:
        if isinstance(value, float) and not value.is_integer():
            raise TimingsParseError(f"{where}: '{key}' is {value}, expected a whole number")
        return int(value)
    try:
        return float(value)
    except OverflowError:
        raise TimingsParseError(f"{where}: '{key}' is a {len(str(value))}-digit number, too large") from None


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


def llama_kind(obj: dict) -> str:
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
        raise TimingsParseError(f"{where}: the server answered with an error: {error_text(obj)}")
    if not isinstance(obj, dict) or "timings" not in obj:
        keys = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise TimingsParseError(f"{where}: no 'timings' object in the response (found: {keys})")
    r = parse_timings_object(obj["timings"], where=where)
    r.kind = llama_kind(obj)
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


def error_text(obj: dict) -> str:
    err = obj.get("error")
    if isinstance(err, dict):
        return f"{err.get('message', err)} (code {err.get('code', '?')})"
    return str(err)[:200]


def records_from_value(value: Any, where: str, engine: str) -> Iterator[RequestTimings]:
    """Records of one JSON value: a response, a bare timings object, or a list of those."""
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from records_from_value(v, f"{where}[{i}]", engine)
        return
    if not isinstance(value, dict):
        raise TimingsParseError(f"{where}: a JSON {type(value).__name__}, expected a response object")
    if "error" in value and "timings" not in value and "meta_info" not in value:
        raise TimingsParseError(f"{where}: the server answered with an error: {error_text(value)}")
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


