"""The figures of ``bench --load``: one streamed request's record (the client's clock and the
engine's timings), a level's figures over its requests (aggregate throughput, per-request decode
speed, time to first token, latency, the longest wait between two tokens, inter-token latency and
time per output token; percentiles interpolate linearly between ranks, numpy's default), several
rounds pooled, and drafted / plain of each figure. ``ggufdspark.measuring.traffic`` makes the requests;
``docs/bench.md`` defines every figure."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass
class RequestRecord:
    """One streamed request under load: the client's clock (seconds; ``start_s`` from the level's
    start) and the engine's timings (None where the engine sent none)."""

    index: int
    client: int
    prompt: str
    prompt_tokens: int
    start_s: float
    ttft_s: float
    latency_s: float
    output_tokens: int
    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    passes: int | None = None
    turn: int | None = None  # closed loop: the client's request number (0: its first); None: open loop
    longest_gap_s: float | None = None  # the longest wait between two streamed chunks after the first token
    cache_n: int | None = None  # prompt tokens the engine reused from what it held (a conversation's)
    chunks: int | None = None  # streamed chunks carrying tokens (runners.client.CHUNK_JOIN_S joins a step's)
    image: str | None = None  # the picture the request carried (bench --load --image-share), None: text only
    error: str | None = None  # the server answered with an error: a failed request, in no figure
    # the wait before each chunk after the first (inter-token latencies, pooled per level); kept in
    # memory for the level's percentiles, left out of the JSON (a few hundred numbers a request)
    gaps_s: list[float] | None = field(default=None, repr=False)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (tokens - 1), vLLM's TPOT."""
        after = self.latency_s - self.ttft_s
        return after / (self.output_tokens - 1) if self.output_tokens > 1 and after > 0 else None

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time after the first: what a user sees streaming."""
        after = self.latency_s - self.ttft_s
        return (self.output_tokens - 1) / after if self.output_tokens > 1 and after > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["gaps_s"]
        return {**d, "decode_tps": self.decode_tps, "tpot_s": self.tpot_s}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


@dataclass
class LevelResult:
    """One arm at one level: the figures ``bench --load`` reports (docs/bench.md defines them)
    and the requests they come from."""

    level: float
    requests: int
    wall_s: float
    output_tokens: int
    prompt_tokens: int
    aggregate_tps: float
    decode_tps_median: float | None
    engine_decode_tps_median: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_mean_s: float | None
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_mean_s: float | None
    drafted: int
    accepted: int
    passes: int
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    round_tps: list[float] = field(default_factory=list)  # aggregate tok/s of each round (several rounds)
    # closed loop: TTFT p50 of the requests that were not their client's first, which all arrive
    # at once at the level's start (the opening burst); None in an open loop or with one request a client
    ttft_p50_later_s: float | None = None
    # p50 / p95 over requests of each one's longest wait between two tokens: the stalls a user sees
    # (a prompt joining the batch, a slot's save) that a median decode speed averages away
    longest_gap_p50_s: float | None = None
    longest_gap_p95_s: float | None = None
    longest_gap_p99_s: float | None = None
    ttft_p99_s: float | None = None
    latency_p99_s: float | None = None
    # inter-token latency (vLLM's ITL): every wait between two chunks carrying tokens, pooled over
    # the level's requests; a drafted step's tokens are one chunk, so compare with tpot too
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    itl_gaps: int = 0  # the waits pooled
    # time per output token after the first, per request (vLLM's TPOT), percentiles over requests
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    image_requests: int = 0  # requests that carried an image (--image-share), failed ones included
    failed: int = 0  # requests the server answered with an error; ``requests`` counts the answered ones

    @property
    def accept_length(self) -> float | None:
        """Tokens per target verify pass, bonus included (1 + accepted / passes); None undrafted."""
        return 1.0 + self.accepted / self.passes if self.passes else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["records"] = [r.to_dict() for r in self.records]
        return {**d, "accept_length": self.accept_length}


def summarize_level(level: float, records: list[RequestRecord], wall_s: float) -> LevelResult:
    """The level's figures from its requests and the wall time from its first send to its last answer.
    Failed requests (``error``) are counted and kept in ``records``, and left out of every figure."""
    every = records
    records = [r for r in records if r.error is None]
    ttft = [r.ttft_s for r in records]
    lat = [r.latency_s for r in records]
    out = sum(r.output_tokens for r in records)
    drafted = [r for r in records if r.draft_n]
    gaps = [r.longest_gap_s for r in records]
    itl = [g for r in records for g in r.gaps_s or []]
    tpot = [r.tpot_s for r in records]
    return LevelResult(
        level, len(records), wall_s, out, sum(r.prompt_tokens for r in records), out / wall_s if wall_s else 0.0,
        percentile([r.decode_tps for r in records], 50), percentile([r.predicted_per_second for r in records], 50),
        percentile(ttft, 50), percentile(ttft, 95), statistics.fmean(ttft) if ttft else None,
        percentile(lat, 50), percentile(lat, 95), statistics.fmean(lat) if lat else None,
        sum(r.draft_n or 0 for r in drafted), sum(r.draft_n_accepted or 0 for r in drafted),
        sum(r.passes or 0 for r in drafted), sorted(every, key=lambda r: r.index),
        ttft_p50_later_s=percentile([r.ttft_s for r in records if r.turn], 50),
        longest_gap_p50_s=percentile(gaps, 50), longest_gap_p95_s=percentile(gaps, 95),
        longest_gap_p99_s=percentile(gaps, 99), ttft_p99_s=percentile(ttft, 99), latency_p99_s=percentile(lat, 99),
        itl_p50_s=percentile(itl, 50), itl_p95_s=percentile(itl, 95), itl_p99_s=percentile(itl, 99),
        itl_gaps=len(itl), tpot_p50_s=percentile(tpot, 50), tpot_p95_s=percentile(tpot, 95),
        tpot_p99_s=percentile(tpot, 99), image_requests=sum(1 for r in every if r.image),
        failed=len(every) - len(records))


def pool_rounds(rounds: list[LevelResult]) -> LevelResult:
    """One level's rounds as one result: every round's requests (indices numbered on across rounds),
    aggregate = all output tokens / the rounds' summed wall time, percentiles over all requests; each
    round's aggregate kept in ``round_tps``. One round is returned as it is."""
    if len(rounds) == 1:
        return rounds[0]
    records: list[RequestRecord] = []
    for r in rounds:
        base = len(records)
        records += [replace(rec, index=base + rec.index) for rec in r.records]
    pooled = summarize_level(rounds[0].level, records, sum(r.wall_s for r in rounds))
    pooled.round_tps = [r.aggregate_tps for r in rounds]
    return pooled


def ratios(plain: LevelResult, drafted: LevelResult) -> dict[str, Any]:
    """drafted / plain of each figure (None where either is missing or zero)."""
    keys = ("aggregate_tps", "decode_tps_median", "engine_decode_tps_median", "ttft_p50_s", "ttft_p95_s",
            "ttft_mean_s", "latency_p50_s", "latency_p95_s", "latency_mean_s", "ttft_p50_later_s",
            "longest_gap_p50_s", "longest_gap_p95_s", "longest_gap_p99_s", "ttft_p99_s", "latency_p99_s",
            "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_p50_s", "tpot_p95_s", "tpot_p99_s")
    out: dict[str, Any] = {"level": plain.level}
    for k in keys:
        a, b = getattr(plain, k), getattr(drafted, k)
        out[k] = b / a if a and b is not None else None
    if len(plain.round_tps) > 1 and len(plain.round_tps) == len(drafted.round_tps):
        out["aggregate_tps_rounds"] = [b / a if a else None for a, b in zip(plain.round_tps, drafted.round_tps)]
    return out
