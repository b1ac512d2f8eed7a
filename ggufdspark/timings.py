"""Speculative-decoding timings: one parser for what llama-server (and SGLang) report.

Conventions (documented in docs/timings.md):

* acceptance rate = accepted / drafted;
* accept length = tokens emitted per target verify pass, bonus token included
  (= predicted_n / passes); MMSpec's MAT = accept length - 1;
* target passes: exact from the server log line or ``/metrics`` counters, else estimated as
  ``predicted_n - draft_n_accepted`` (every pass emits exactly one token the target produced
  itself, plus the drafted tokens it accepted), labelled ``estimated``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ggufdspark.errors import TimingsParseError


@dataclass
class RequestTimings:
    """Timings of one request. Fields the engine did not send are None."""

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
    passes_source: str | None = None  # "log", "metrics", "estimated"
    source: str = "response"
    engine: str = "llama.cpp"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float | None:
        if not self.draft_n:
            return None
        return (self.draft_n_accepted or 0) / self.draft_n

    @property
    def accept_length(self) -> float | None:
        """Tokens per target pass, bonus token included."""
        passes = self.passes
        if passes is None and self.predicted_n is not None and self.draft_n is not None:
            passes = self.predicted_n - (self.draft_n_accepted or 0)
        if not passes or self.predicted_n is None:
            return None
        return self.predicted_n / passes

    @property
    def mat(self) -> float | None:
        """MMSpec's mean accepted tokens: accept length minus the bonus token."""
        al = self.accept_length
        return None if al is None else al - 1

    @property
    def decode_tps(self) -> float | None:
        if self.predicted_per_second is not None:
            return self.predicted_per_second
        if self.predicted_n and self.predicted_ms:
            return 1000.0 * self.predicted_n / self.predicted_ms
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, accept_length=self.accept_length, mat=self.mat,
                 decode_tps=self.decode_tps)
        return d


_INT_FIELDS = ("prompt_n", "predicted_n", "draft_n", "draft_n_accepted", "cache_n")
_FLOAT_FIELDS = ("prompt_ms", "predicted_ms", "predicted_per_second", "prompt_per_second")


def parse_timings_object(t: dict, *, where: str = "response") -> RequestTimings:
    """A llama-server ``timings`` object to RequestTimings."""
    if not isinstance(t, dict):
        raise TimingsParseError(f"{where}: 'timings' is a {type(t).__name__}, expected an object")
    r = RequestTimings()
    for k, v in t.items():
        if k in _INT_FIELDS:
            setattr(r, k, int(v))
        elif k in _FLOAT_FIELDS:
            setattr(r, k, float(v))
        else:
            r.extra[k] = v
    if r.draft_n is not None and r.predicted_n is not None:
        r.passes = r.predicted_n - (r.draft_n_accepted or 0)
        r.passes_source = "estimated"
    return r


def parse_response(obj: dict, *, where: str = "response") -> RequestTimings:
    """Timings of one llama-server JSON response (/completion, /v1/completions, /v1/chat/completions).

    Raises:
        TimingsParseError: the response carries no ``timings`` object.
    """
    if not isinstance(obj, dict) or "timings" not in obj:
        raise TimingsParseError(f"{where}: no 'timings' object in the response")
    return parse_timings_object(obj["timings"], where=where)
