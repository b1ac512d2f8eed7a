"""The figures and the result of ``bench --load`` (``loadbench.run_load``).

The figures: one streamed request's record (the client's clock and the engine's timings), a level's
figures over its requests (aggregate throughput, per-request decode speed, time to first token,
latency, the longest wait between two tokens, inter-token latency and time per output token;
percentiles interpolate linearly between ranks, numpy's default), several rounds pooled, and
drafted / plain of each figure (``level_ratios``). ``ggufdspark.measuring.traffic`` makes the
requests; ``docs/bench.md`` defines every figure.

The result: every arm's figures level by level, drafted / plain of each, the JSON it writes
(``LoadReport.to_dict``) and the table it prints (``LoadReport.text``), with ``--noise-floor``'s band
(a second plain server against the first).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
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
    # when the longest gap ended (seconds from this request's send) and its place among the
    # request's gaps (0: the wait after the first chunk): what a stall coincided with
    longest_gap_end_s: float | None = None
    longest_gap_index: int | None = None
    # the wait before each chunk after the first (inter-token latencies, pooled per level); kept in
    # memory for the level's percentiles, left out of the JSON (a few hundred numbers a request)
    gaps_s: list[float] | None = field(default=None, repr=False)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (tokens - 1), vLLM's TPOT."""
        after = self.latency_s - self.ttft_s
        return after / (self.output_tokens - 1) if self.output_tokens > 1 and after > 0 else None

    @property
    def ttft_wait_s(self) -> float | None:
        """TTFT less the engine's prompt processing (``prompt_ms``: from the slot starting the prompt to
        its first token): the wait before the prompt started (the queue, the step in flight, HTTP)."""
        return self.ttft_s - self.prompt_ms / 1000.0 if self.prompt_ms is not None else None

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time after the first: what a user sees streaming."""
        after = self.latency_s - self.ttft_s
        return (self.output_tokens - 1) / after if self.output_tokens > 1 and after > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["gaps_s"]
        return {**d, "decode_tps": self.decode_tps, "tpot_s": self.tpot_s, "ttft_wait_s": self.ttft_wait_s}


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
    # where the longest gaps fell (requests with one): the share that was the request's first gap
    # after its first token (its own start: the drafter taking its prompt in, a graph for a new
    # shape), and the share during which another request's prompt was being processed (from its
    # send to its first token): what to look at first when drafted stalls are longer than plain's
    stall_first_share: float | None = None
    stall_join_share: float | None = None
    # time to first token split: the engine's prompt processing (prompt_ms) and the wait before it
    # (TTFT - prompt_ms), percentiles over the requests whose timings name prompt_ms
    ttft_prompt_p50_s: float | None = None
    ttft_prompt_p95_s: float | None = None
    ttft_wait_p50_s: float | None = None
    ttft_wait_p95_s: float | None = None
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


def stall_shares(records: list[RequestRecord]) -> tuple[float | None, float | None]:
    """Of the requests whose longest gap is known: the share where it was their first gap, and the
    share where another request's prompt was in flight (sent, no first token yet) during it."""
    known = [r for r in records if r.longest_gap_s is not None and r.longest_gap_end_s is not None]
    if not known:
        return None, None
    first = sum(1 for r in known if r.longest_gap_index == 0)
    joined = 0
    for r in known:
        end = r.start_s + r.longest_gap_end_s
        begin = end - r.longest_gap_s
        if any(o is not r and o.start_s < end and o.start_s + o.ttft_s > begin for o in records):
            joined += 1
    return first / len(known), joined / len(known)


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
    stall_first, stall_join = stall_shares(records)
    prompt_s = [r.prompt_ms / 1000.0 for r in records if r.prompt_ms is not None]
    wait = [r.ttft_wait_s for r in records]
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
        tpot_p99_s=percentile(tpot, 99), stall_first_share=stall_first, stall_join_share=stall_join,
        ttft_prompt_p50_s=percentile(prompt_s, 50), ttft_prompt_p95_s=percentile(prompt_s, 95),
        ttft_wait_p50_s=percentile(wait, 50), ttft_wait_p95_s=percentile(wait, 95),
        image_requests=sum(1 for r in every if r.image),
        failed=len(every) - len(records))


def pool_rounds(rounds: list[LevelResult]) -> LevelResult:
    """One level's rounds as one result: every round's requests (indices numbered on across rounds),
    aggregate = all output tokens / the rounds' summed wall time, percentiles over all requests; each
    round's aggregate kept in ``round_tps``. One round is returned as it is."""
    if len(rounds) == 1:
        return rounds[0]
    records: list[RequestRecord] = []
    offset = 0.0  # each round's clock runs from zero to its wall time: pooled, they follow one another
    for r in rounds:
        base = len(records)
        records += [replace(rec, index=base + rec.index, start_s=rec.start_s + offset) for rec in r.records]
        offset += r.wall_s
    pooled = summarize_level(rounds[0].level, records, sum(r.wall_s for r in rounds))
    pooled.round_tps = [r.aggregate_tps for r in rounds]
    return pooled


def level_ratios(plain: LevelResult, drafted: LevelResult) -> dict[str, Any]:
    """drafted / plain of each figure (None where either is missing or zero)."""
    keys = ("aggregate_tps", "decode_tps_median", "engine_decode_tps_median", "ttft_p50_s", "ttft_p95_s",
            "ttft_mean_s", "latency_p50_s", "latency_p95_s", "latency_mean_s", "ttft_p50_later_s",
            "longest_gap_p50_s", "longest_gap_p95_s", "longest_gap_p99_s", "ttft_p99_s", "latency_p99_s",
            "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_p50_s", "tpot_p95_s", "tpot_p99_s",
            "ttft_prompt_p50_s", "ttft_prompt_p95_s", "ttft_wait_p50_s", "ttft_wait_p95_s")
    out: dict[str, Any] = {"level": plain.level}
    for k in keys:
        a, b = getattr(plain, k), getattr(drafted, k)
        out[k] = b / a if a and b is not None else None
    if len(plain.round_tps) > 1 and len(plain.round_tps) == len(drafted.round_tps):
        out["aggregate_tps_rounds"] = [b / a if a else None for a, b in zip(plain.round_tps, drafted.round_tps)]
    return out


NOISE_ARM = "plain2"  # --noise-floor's second plain server


@dataclass
class LoadReport:
    """The result of one ``bench --load`` run (``to_dict`` is the JSON written)."""

    command: str | None
    engine: dict
    hardware: dict
    traffic: dict
    settings: dict
    synthetic: str | None
    arms: dict[str, list[LevelResult]]
    logs: dict[str, str] = field(default_factory=dict)
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    @property
    def drafted_arms(self) -> list[str]:
        return [a for a in self.arms if a != "plain"]

    def ratios_of(self, arm: str) -> list[dict]:
        """``arm`` / plain of each figure, level by level."""
        return [level_ratios(p, d) for p, d in zip(self.arms["plain"], self.arms[arm])]

    @property
    def ratios(self) -> list[dict]:
        return self.ratios_of(self.drafted_arms[0])

    def to_dict(self) -> dict:
        out = {"kind": "ggufdspark bench --load", "command": self.command, "pair": self.pair, "engine": self.engine,
               "hardware": self.hardware, "traffic": self.traffic, "settings": self.settings,
               "synthetic": self.synthetic, "ratios": self.ratios,
               "arms": {a: [lv.to_dict() for lv in levels] for a, levels in self.arms.items()}, "logs": self.logs}
        if len(self.drafted_arms) > 1:
            out["ratios_by_arm"] = {a: self.ratios_of(a) for a in self.drafted_arms}
        return out

    def noise_floor_text(self) -> str:
        """One line: how far the second plain server (``--noise-floor``) ran from the first, the band
        inside which drafted / plain says nothing."""
        rs = self.ratios_of(NOISE_ARM)
        agg = [r["aggregate_tps"] for r in rs if r.get("aggregate_tps") is not None]
        rounds = [v for r in rs for v in r.get("aggregate_tps_rounds") or [] if v is not None]
        ttft = [r["ttft_p50_s"] for r in rs if r.get("ttft_p50_s") is not None]
        gap = [r["longest_gap_p95_s"] for r in rs if r.get("longest_gap_p95_s") is not None]

        def band(v: list[float]) -> str:
            return f"{min(v):.2f}-{max(v):.2f}x" if v else "-"

        return (f"noise floor: a second plain server ({NOISE_ARM}, the same command) ran {band(agg)} of the first's "
                f"aggregate over the levels" + (f" (single rounds {band(rounds)})" if rounds else "")
                + f", TTFT p50 {band(ttft)}" + (f", longest wait p95 {band(gap)}" if gap else "")
                + "; a drafted / plain ratio inside that band is no measured difference")

    def level_block(self, title: str, key: str, ratios: dict[str, list[dict]]) -> list[str]:
        """One figure (``key``, in seconds) of every arm level by level, and drafted / plain."""
        arms = ["plain", *self.drafted_arms]
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        head = f"{unit:>7} " + " ".join(f"{a:>9}" for a in arms) + " " + " ".join(
            f"{(a + '/pl') if len(arms) > 2 else 'ratio':>9}" for a in arms[1:])
        out = [title, head]
        for i, p in enumerate(self.arms["plain"]):
            out.append(f"{p.level:>7g} " + " ".join(_ms(getattr(self.arms[a][i], key)) for a in arms) + " "
                       + " ".join(_x(ratios[a][i].get(key), 9) for a in arms[1:]))
        return out

    def stall_block(self) -> list[str]:
        """Where each arm's longest waits fell, level by level: the share of requests whose longest wait
        was their first after the first token, and the share during which another prompt was in flight."""
        arms = ["plain", *self.drafted_arms]
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        out = ["Where those waits fell (share of requests): 'first' its first wait after the first token, "
               "'joined' while another request's prompt was in flight:",
               f"{unit:>7} " + " ".join(f"{a + ' first':>14} {a + ' joined':>15}" for a in arms)]

        def pct(v: float | None, w: int) -> str:
            return f"{v:>{w}.0%}" if v is not None else f"{'-':>{w}}"
        for i, p in enumerate(self.arms["plain"]):
            out.append(f"{p.level:>7g} " + " ".join(
                f"{pct(self.arms[a][i].stall_first_share, 14)} {pct(self.arms[a][i].stall_join_share, 15)}"
                for a in arms))
        return out

    TAILS = (("TTFT p99", "ttft_p99_s"), ("lat p99", "latency_p99_s"), ("gap p99", "longest_gap_p99_s"),
             ("ITL p50", "itl_p50_s"), ("ITL p95", "itl_p95_s"), ("ITL p99", "itl_p99_s"), ("TPOT p50", "tpot_p50_s"),
             ("TPOT p99", "tpot_p99_s"))
    TTFT_SPLIT = (("TTFT p50", "ttft_p50_s"), ("TTFT p95", "ttft_p95_s"), ("prompt50", "ttft_prompt_p50_s"),
                  ("prompt95", "ttft_prompt_p95_s"), ("wait p50", "ttft_wait_p50_s"), ("wait p95", "ttft_wait_p95_s"))

    def columns_block(self, title: str, columns: tuple[tuple[str, str], ...], ratios: dict[str, list[dict]]) -> list[str]:
        """Several figures (``columns``: heading, key in seconds) per arm and level, and drafted / plain."""
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        out = [title, f"{unit:>7} {'arm':>8} " + " ".join(f"{t:>9}" for t, _ in columns)]
        several = len(self.drafted_arms) > 1
        for i, p in enumerate(self.arms["plain"]):
            for a in ["plain", *self.drafted_arms]:
                lv = self.arms[a][i]
                out.append(f"{lv.level:>7g} {a:>8} " + " ".join(_ms(getattr(lv, k), 1) for _, k in columns))
                if a != "plain":
                    out.append(f"{'':>7} {a + '/pl' if several else 'ratio':>8} "
                               + " ".join(_x(ratios[a][i].get(k), 9) for _, k in columns))
        return out

    def requests_block(self) -> list[str]:
        """Per level and arm: requests answered, those with an image (--image-share), those failed."""
        unit = "clients" if self.traffic["shape"]["mode"] == "closed" else "req/s"
        out = ["Requests: answered, with an image, failed (the server answered with an error):",
               f"{unit:>7} {'arm':>8} {'answered':>9} {'image':>6} {'failed':>7}"]
        for i, p in enumerate(self.arms["plain"]):
            for a in self.arms:
                lv = self.arms[a][i]
                out.append(f"{lv.level:>7g} {a:>8} {lv.requests:>9} {lv.image_requests:>6} {lv.failed:>7}")
        return out

    def text(self) -> str:
        """The report as a table: per level, each arm's figures and drafted / plain."""
        t, s = self.traffic, self.settings
        pl = t["prompt_tokens"]
        lines = [f"ggufdspark bench --load: {Path(s['target']).name} + {Path(s['draft']).name} "
                 f"({self.hardware['backend']}, engine {self.engine['commit'] or self.engine['version']}, "
                 f"{len(self.engine['patches'])} patches)",
                 f"traffic: {t['shape']['describe']}",
                 f"prompts: {pl['count']} ({t['prompts']}), {pl['min']}-{pl['max']} tokens, median {pl['median']:g}",
                 f"drafted arm: draft length {s['draft_n_max']}" + (f", SYNTHETIC SPEED: {self.synthetic}"
                                                                    if self.synthetic else ", real acceptance"),
                 *(f"  {a}: {d}" for a, d in (s.get("drafted_arms") or {}).items()),
                 ""]
        unit = "clients" if t["shape"]["mode"] == "closed" else "req/s"
        head = (f"{unit:>7} {'arm':>8} {'reqs':>5} {'agg tok/s':>10} {'dec tok/s':>10} {'TTFT p50':>9} "
                f"{'TTFT p95':>9} {'lat p50':>8} {'lat p95':>8} {'accept':>7}")
        lines += [head, "-" * len(head)]

        def row(lv: LevelResult, arm: str) -> str:
            return (f"{lv.level:>7g} {arm:>8} {lv.requests:>5} {lv.aggregate_tps:>10.1f} {_f(lv.decode_tps_median, 10, 1)} "
                    f"{_ms(lv.ttft_p50_s)} {_ms(lv.ttft_p95_s)} {_s(lv.latency_p50_s)} {_s(lv.latency_p95_s)} "
                    f"{_f(lv.accept_length, 7, 2)}")

        several = len(self.drafted_arms) > 1
        ratios = {a: self.ratios_of(a) for a in self.drafted_arms}
        for i, p in enumerate(self.arms["plain"]):
            lines.append(row(p, "plain"))
            for a in self.drafted_arms:
                r = ratios[a][i]
                spread = [v for v in r.get("aggregate_tps_rounds") or [] if v is not None]
                lines += [row(self.arms[a][i], a),
                          f"{'':>7} {'ratio' if not several else a + '/pl':>8} {'':>5} {_x(r['aggregate_tps'], 10)} "
                          f"{_x(r['decode_tps_median'], 10)} {_x(r['ttft_p50_s'], 9)} {_x(r['ttft_p95_s'], 9)} "
                          f"{_x(r['latency_p50_s'], 8)} {_x(r['latency_p95_s'], 8)}"
                          + (f"   agg by round {min(spread):.2f}-{max(spread):.2f}x" if spread else "")]
        if t["shape"]["mode"] == "closed" and any(lv.ttft_p50_later_s is not None for lv in self.arms["plain"]):
            # every client sends its first request at the level's start: those prompts are processed
            # together (the opening burst), the later ones join running answers
            lines += ["", *self.level_block("TTFT p50 of the requests after each client's first (the opening "
                                            "burst left out):", "ttft_p50_later_s", ratios)]
        if any(lv.longest_gap_p95_s is not None for lv in self.arms["plain"]):
            lines += ["", *self.level_block("A request's longest wait between two tokens (a stall: a prompt joining "
                                            "the batch), p95 over the requests:", "longest_gap_p95_s", ratios)]
            if any(lv.stall_first_share is not None for lv in self.arms["plain"]):
                lines += ["", *self.stall_block()]
        if any(lv.itl_p50_s is not None or lv.ttft_p99_s is not None for lv in self.arms["plain"]):
            lines += ["", *self.columns_block(
                "Tails and inter-token latency (ITL: every wait between two streamed chunks, a drafted step's tokens "
                "one chunk, pooled over the requests; TPOT: (latency - TTFT) / (tokens - 1) per request):",
                self.TAILS, ratios)]
        if any(lv.ttft_prompt_p50_s is not None for lv in self.arms["plain"]):
            lines += ["", *self.columns_block(
                "Time to first token split: the engine's prompt processing (prompt50 / prompt95: its prompt_ms, "
                "from the slot starting the prompt to its first token) and the wait before it (TTFT - prompt_ms):",
                self.TTFT_SPLIT, ratios)]
        if any(lv.image_requests or lv.failed for a in self.arms.values() for lv in a):
            lines += ["", *self.requests_block()]
        if s.get("noise_floor"):
            lines += ["", self.noise_floor_text()]
        lines += ["", "agg = output tokens / wall time of the level; dec = median over requests of (tokens - 1) / "
                      "(latency - TTFT); TTFT and latency measured by the client (streamed); ratio = drafted / plain"
                  + ("; several rounds: every figure over all rounds' requests, 'agg by round' the lowest and "
                     "highest drafted / plain of one round's aggregate" if t["shape"].get("rounds", 1) > 1 else "")]
        return "\n".join(lines)


def _f(v: float | None, w: int, d: int) -> str:
    return f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"


def _x(v: float | None, w: int) -> str:
    return f"{v:>{w - 1}.2f}x" if v is not None else f"{'-':>{w}}"


def _ms(v: float | None, d: int = 0) -> str:
    return f"{v * 1000:>7.{d}f}ms" if v is not None else f"{'-':>9}"


def _s(v: float | None) -> str:
    return f"{v:>7.2f}s" if v is not None else f"{'-':>8}"
