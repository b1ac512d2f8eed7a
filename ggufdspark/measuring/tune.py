"""``tune``: the draft length (and confidence threshold) that decodes fastest on this machine, and
the load above which drafting stops paying; written to a profile ``serve`` reads.

The sweep holds an acceptance profile fixed: per-position rates ``r_i`` (P[at least i+1 drafted
tokens accepted in a verify pass]) fed to llama.cpp's benchmarking acceptance
(``--spec-synth-rates``), truncated to each draft length, never rescaled, so a shorter draft gives
up exactly the tokens its missing positions would have won. Only the cost of drafting and verifying
changes from one length to the next, and that is what this machine decides.

One server start per configuration: the pinned engine compiles the per-request ``speculative.*``
fields out (``tools/server/server-schema.cpp``, ``#if 0``; sent anyway, they are ignored), so the
draft length is a server flag. Arms are bracketed plain / every draft configuration / plain.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ggufdspark import hardware
from ggufdspark.errors import BenchError, BenchOptionError, InputNotFoundError
from ggufdspark.measuring import measure as ms
from ggufdspark.measuring import profiles
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring.acceptance import (  # noqa: F401  (public here too: tune's own vocabulary)
    PROFILES,
    AcceptanceProfile,
    expected_accept_length,
    geometric_rates,
    measure_profile,
    profile_from_bench,
    profile_from_rates,
)
from ggufdspark.redaction import redact_engine_args
from ggufdspark.serve_checks import ServingOptions

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- recommendation

# Drafting must beat the target alone by this factor to be recommended: below it, the difference
# is within run-to-run noise and drafting still costs memory and a second model.
MIN_GAIN = 1.02


@dataclass
class Point:
    """One configuration at one load: ``n_max`` None is the target alone."""

    n_max: int | None
    p_min: float | None
    level: int
    tps: float  # aggregate wall-clock tokens/s
    decode_tps: float | None  # the engine's decode speed (what the 1-request ratio uses)
    accept_length: float | None
    requests: int
    tokens: int
    trials: list[float] = field(default_factory=list)  # speeds of every trial (the median is kept)

    @property
    def speed(self) -> float:
        """The figure compared between arms: decode speed at one request, aggregate under load."""
        return (self.decode_tps or self.tps) if self.level == 1 else self.tps


@dataclass
class TuneResult:
    settings: dict
    acceptance: AcceptanceProfile
    plain: dict[int, Point]
    points: list[Point]
    drift: dict
    recommendation: dict
    profile_path: str | None = None
    logs: str | None = None
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    def to_dict(self) -> dict:
        # no "pair" key without one: a saved profile merges this dict over its own pair record
        return {"kind": "ggufdspark tune", **({"pair": self.pair} if self.pair else {}), "settings": self.settings,
                "acceptance": self.acceptance.to_dict(),
                "plain": [asdict(p) | {"speed": p.speed} for p in self.plain.values()],
                "points": [asdict(p) | {"speed": p.speed, "ratio": _ratio(p, self.plain)} for p in self.points],
                "drift": self.drift, "recommendation": self.recommendation, "profile_path": self.profile_path,
                "logs": self.logs}

    def text(self) -> str:
        return format_tune(self.to_dict())


def _ratio(p: Point, plain: dict[int, Point]) -> float | None:
    base = plain.get(p.level)
    return p.speed / base.speed if base and base.speed else None


def recommend(plain: dict[int, Point], points: list[Point], *, min_gain: float = MIN_GAIN) -> dict:
    """Pick the configuration for serve from measured points.

    The draft length is the fastest at one request; drafting is turned off when even that is not
    ``min_gain`` times the target alone. ``max_concurrency_for_draft`` is the largest measured
    number of parallel requests up to which the chosen configuration keeps winning.
    """
    levels = sorted(plain)
    by_level: dict[int, list[Point]] = {lv: [p for p in points if p.level == lv] for lv in levels}
    if 1 not in by_level or not by_level[1]:
        raise BenchError("the sweep has no one-request measurements")
    best = max(by_level[1], key=lambda p: p.speed)
    r1 = _ratio(best, plain) or 0.0
    rows = []
    max_c = 0
    still = True
    for lv in levels:
        cands = by_level[lv]
        top = max(cands, key=lambda p: p.speed) if cands else None
        chosen = next((p for p in cands if p.n_max == best.n_max and p.p_min == best.p_min), None)
        rc = _ratio(chosen, plain) if chosen else None
        pays = rc is not None and rc >= min_gain
        still = still and pays
        if still:
            max_c = lv
        rows.append({"parallel": lv, "plain_tps": plain[lv].speed, "chosen_tps": chosen.speed if chosen else None,
                     "chosen_ratio": rc, "best_n_max": top.n_max if top else None,
                     "best_ratio": _ratio(top, plain) if top else None, "draft_pays": pays})
    rec = {"draft_enabled": r1 >= min_gain, "draft_n_max": best.n_max, "p_min": best.p_min,
           "speedup": r1, "max_concurrency_for_draft": max_c, "by_concurrency": rows, "min_gain": min_gain}
    p1 = plain[1].speed
    if not rec["draft_enabled"]:
        rec["max_concurrency_for_draft"] = 0
        rec["why"] = (f"drafting measured slower than the target alone on this machine: the best draft length "
                      f"({best.n_max}) decoded {best.speed:.1f} tok/s vs {p1:.1f} without a draft at one request "
                      f"({r1:.2f}x, needs >= {min_gain:.2f}x)")
        return rec
    why = (f"draft length {best.n_max} measured fastest: {best.speed:.1f} vs {p1:.1f} tok/s without a draft at "
           f"one request ({r1:.2f}x)")
    lost = next((r for r in rows if not r["draft_pays"]), None)
    if lost:
        why += (f"; with {lost['parallel']} parallel requests it ran at {lost['chosen_ratio'] or 0:.2f}x of plain "
                f"throughput, so above {_requests(max_c)} serve without the draft")
    elif levels[-1] > 1:
        why += f"; it still paid at {levels[-1]} parallel requests"
    rec["why"] = why
    return rec


def sweep_prompts(client: Any) -> list[list[int]]:
    """The sweep's prompts: the first turn of one built-in item per single-turn category, rendered
    with the server's chat template and tokenized (text-only)."""
    items = pr.select([it for it in pr.builtin_prompts() if it.category != "multi_turn"], limit=1)
    out = []
    for it in items:
        first_user = next(i for i, m in enumerate(it.messages) if m["role"] == "user")
        out.append(pr.render(client, it.messages[: first_user + 1], None)[0])
    return out


def measure_points(client: Any, prompts: list[Any], levels: list[int], n_predict: int, *,
                   n_max: int | None = None, p_min: float | None = None, requests: int = 4,
                   rounds: int = ms.ROUNDS, trials: int = 1, on_level: Any = None,
                   out: dict[int, Point] | None = None) -> dict[int, Point]:
    """One configuration at every load: ``requests`` sequential requests at level 1, ``rounds``
    per thread above; every request generates exactly ``n_predict`` tokens (``ignore_eos``).
    With ``trials`` > 1 each level is measured that many times and the median trial is kept (the
    others stay in ``Point.trials``): a busy machine slows single trials, not the median.
    Points are added to ``out`` (when given) as each level finishes, so a caller keeps them if the
    server dies at a higher level."""
    out = {} if out is None else out
    for lv in levels:
        got = []
        for _ in range(max(1, trials)):
            lp = ms.measure_load(client, prompts, lv, n_predict, rounds=requests if lv == 1 else rounds,
                                 ignore_eos=True)
            got.append(Point(n_max, p_min, lv, lp.tps, lp.decode_tps, lp.accept_length, lp.requests, lp.tokens))
        got.sort(key=lambda p: p.speed)
        mid = got[len(got) // 2]
        mid.trials = [p.speed for p in got]
        out[lv] = mid
        if on_level:
            on_level(lv)
    return out


def _requests(n: int) -> str:
    return "1 request at a time" if n == 1 else f"{n} parallel requests"


def _parse_lengths(values: list[int] | None, max_n: int, why: str = "what this draft can draft") -> list[int]:
    ns = sorted(set(values or range(1, max_n + 1)))
    bad = [n for n in ns if not 1 <= n <= max_n]
    if bad:
        raise BenchOptionError(f"draft length {bad[0]} is outside 1..{max_n} ({why})")
    return ns


def _length_limit(limits: ms.DraftLimits, profile: "AcceptanceProfile | None") -> tuple[int, str]:
    """The longest draft a sweep can measure, and what sets it (the draft, or the profile's rates)."""
    if profile is not None and len(profile.rates) < limits.max_n:
        return len(profile.rates), f"the acceptance profile {profile.name!r} has rates for {len(profile.rates)} positions"
    return limits.max_n, "what this draft can draft"


def run_tune(opts: ServingOptions, *, rates: list[float] | None = None, acceptance: str = "measure",
             from_bench: str | Path | None = None, draft_lengths: list[int] | None = None,
             p_mins: list[float] | None = None, concurrency: list[int] | None = None,
             n_predict: int = ms.DEFAULT_N_PREDICT, requests: int = 4, rounds: int = ms.ROUNDS, trials: int = 1,
             log_dir: str | Path | None = None, save: bool = True, min_gain: float = MIN_GAIN,
             progress: ms.Progress | None = None) -> TuneResult:
    """Sweep draft length x p_min x parallel requests under a fixed acceptance profile; recommend.

    Args:
        opts: the pair (``model``, ``draft``: files), the engine and the server's options
            (``threads``, ``ctx_per_slot``, ``extra_args`` for every arm); the draft length and
            its load cut are what tune measures, so ``draft_n_max`` and ``draft_n_max_by_slots`` are refused,
            as are ``serve``'s own options (``ServingOptions.check_measured``).
        rates: per-position acceptance to hold fixed (wins over ``acceptance``/``from_bench``).
        acceptance: ``measure`` (real draft on built-in prompts, this pair) or a name in PROFILES.
        from_bench: a ``bench --json`` report to take measured rates from.
        save: write the profile serve reads (keyed by hardware and pair).

    Raises:
        BenchError, InputNotFoundError, PairMismatchError, EngineError.
    """
    target, draft = opts.model, opts.draft
    opts.check_measured("tune", "draft_n_max", "draft_n_max_by_slots")
    ms.check_threads(opts.threads)
    ms.check_p_min(p_mins)
    info, devices, decision, limits = ms.prepare(opts, concurrency=concurrency)
    if p_mins and any(p > 0 for p in p_mins) and not limits.confidence_head:
        raise BenchOptionError(f"{draft}: has no confidence head, so p_min must be 0 (got {max(p_mins)})")
    levels = ms.concurrency_levels(concurrency, decision.backend)
    if 1 not in levels:
        levels = [1] + levels
    p_list = sorted(set(p_mins or [0.0]))
    profile = None
    if rates:
        profile = profile_from_rates(rates)
    elif from_bench:
        profile = profile_from_bench(from_bench)
    elif acceptance != "measure":
        if acceptance not in PROFILES:
            raise BenchOptionError(f"unknown acceptance profile {acceptance!r} (expected measure or "
                             f"{', '.join(PROFILES)})")
        profile = PROFILES[acceptance]
    lengths = _parse_lengths(draft_lengths, *_length_limit(limits, profile))
    # serve's server at the highest level; every length is measured as 'serve --draft-n-max N' runs it
    base = ms.base_settings(info, opts, decision=decision, parallel=max(levels))
    plain_settings = ms.arm_settings(base, None)
    configs = [(n, p) for n in lengths for p in p_list]
    total = (len(configs) + 2) * len(levels) + (1 if profile is None else 0)
    done = [0]

    def step(what: str) -> None:
        done[0] += 1
        if progress:
            progress(min(done[0], total), total, what)

    def measure(client: Any, n: int | None, p: float | None, label: str,
                out: dict[int, Point] | None = None) -> dict[int, Point]:
        return measure_points(client, prompts, levels, n_predict, n_max=n, p_min=p, requests=requests,
                              rounds=rounds, trials=trials, on_level=lambda lv: step(f"{label}, {lv} parallel"),
                              out=out)

    # a temporary log directory is gone again if the run fails before writing to it
    with ms.log_directory(log_dir, "ggufdspark-tune-") as logs:
        with ms.running(plain_settings, logs / "plain-1.log") as c:
            prompts = sweep_prompts(c)
            ms.warm(c)
            plain1 = measure(c, None, None, "plain")
        if profile is None:
            log.info("measuring this pair's acceptance at draft length %d", limits.max_n)
            with ms.running(ms.arm_settings(base, draft, n_max=limits.max_n, p_min=0.0), logs / "measure.log") as c:
                ms.warm(c)
                profile = measure_profile(c, prompts, n_predict, limits.max_n)
            step("acceptance measured")
            lengths = _parse_lengths(draft_lengths, *_length_limit(limits, profile))
            configs = [(n, p) for n in lengths for p in p_list]
        points: list[Point] = []
        failures: list[dict] = []
        for n, p in configs:
            syn = ms.Synthetic(rates=profile.truncated(n))
            name = f"spec-n{n}-p{p:g}"
            got: dict[int, Point] = {}
            try:
                with ms.running(ms.arm_settings(base, draft, n_max=n, p_min=p, synthetic=syn), logs / f"{name}.log") as c:
                    ms.warm(c)
                    measure(c, n, p, f"draft length {n}" + (f", p_min {p:g}" if p else ""), out=got)
            except BenchError as e:
                if 1 not in got:
                    raise
                # the engine died under parallel load with the draft: that level (and above) counts as
                # "drafting does not pay" for this configuration; the sweep goes on
                failed_at = min(lv for lv in levels if lv not in got)
                failures.append({"draft_n_max": n, "p_min": p, "parallel": failed_at, "error": str(e)})
                log.warning("draft length %d: llama-server died at %d parallel requests; counted as not paying (%s)",
                            n, failed_at, e)
            points += got.values()
        with ms.running(plain_settings, logs / "plain-2.log") as c:
            ms.warm(c)
            plain2 = measure(c, None, None, "plain again")
        plain = {lv: _pool(plain1[lv], plain2[lv]) for lv in levels}
        drift = {lv: {"before": plain1[lv].speed, "after": plain2[lv].speed,
                      "change": plain2[lv].speed / plain1[lv].speed - 1 if plain1[lv].speed else None} for lv in levels}
        rec = recommend(plain, points, min_gain=min_gain)
        if failures:
            rec["why"] += ("; llama-server crashed with the draft under parallel load (" + ", ".join(
                f"draft length {f['draft_n_max']} at {f['parallel']} parallel" for f in failures) + "): see engine_failures")
        settings = {"target": str(target), "draft": str(draft), "engine": f"{info.commit or info.version} ({info.path})",
                    "backend": decision.backend, "devices": decision.devices, "block_size": limits.block_size,
                    "draft_lengths": lengths, "p_min": p_list, "concurrency": levels, "n_predict": n_predict,
                    "requests_at_1": requests, "rounds": rounds, "trials": trials, "prompts": len(prompts),
                    "offload": decision.offload, "flash_attn": decision.flash_attn,
                    "server_args": redact_engine_args(list(opts.extra_args)),
                    "note": "synthetic acceptance with the profile's rates truncated per draft length; ignore_eos",
                    "engine_failures": failures}
        result = TuneResult(settings, profile, plain, points, drift, rec, logs=str(logs) if log_dir else None,
                            pair=profiles.pair_record(target, draft))
        if save:
            data = result.to_dict()
            data.pop("profile_path", None)
            result.profile_path = str(profiles.save_profile(devices, target, draft, {"tool": "ggufdspark tune", **data}))
        return result


def _pool(a: Point, b: Point) -> Point:
    """Both plain runs as one: tokens over time, and the mean of the two decode speeds."""
    wall = a.tokens / a.tps + b.tokens / b.tps if a.tps and b.tps else 0
    dec = [x for x in (a.decode_tps, b.decode_tps) if x]
    return Point(None, None, a.level, (a.tokens + b.tokens) / wall if wall else 0.0,
                 sum(dec) / len(dec) if dec else None, None, a.requests + b.requests, a.tokens + b.tokens,
                 a.trials + b.trials)


# --------------------------------------------------------------------------- show


def show_profile(opts: ServingOptions) -> dict:
    """The stored profile of the pair of ``opts`` (``model``, ``draft``) on this machine (the
    devices of ``opts.server``).

    Raises:
        InputNotFoundError: a file is missing, or there is no profile yet.
    """
    from ggufdspark import engine as eng

    target, draft = opts.model, opts.draft
    for label, p in (("target", target), ("draft", draft)):
        if not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    devices = hardware.detect(eng.find_engine(opts.server))
    prof = profiles.load_profile(devices, target, draft)
    if prof is None:
        raise InputNotFoundError(f"no tune profile for this pair on this machine "
                                 f"({profiles.profile_path(devices, target, draft)}): run 'ggufdspark tune' first")
    return prof


def format_tune(d: dict) -> str:
    """Text of a tune result or a stored profile (same layout)."""
    s, acc, rec = d["settings"], d["acceptance"], d["recommendation"]
    levels = s["concurrency"]
    rates = " ".join(f"{r:.3f}" for r in acc["rates"])
    lines = [f"ggufdspark tune: {Path(s['target']).name} + {Path(s['draft']).name} "
             f"({s['backend']}, engine {s['engine']})",
             f"acceptance profile: {acc['name']}: {acc['source']}",
             f"  rates {rates} (mean length {acc['mean_length']:.2f}); truncated per draft length "
             "(expect: 1 + sum of the kept rates; accept: realized); speeds are synthetic-acceptance speeds",
             f"n_predict {s['n_predict']}; {s['requests_at_1']} requests at 1, {s['rounds']} per thread under "
             f"load; median of {s.get('trials', 1)} trials; 1 request: decode tok/s; more: aggregate tok/s",
             f"  load: {ms.LOCKSTEP_LABEL}", ""]

    def cell(p: dict | None, ratio: float | None) -> str:
        return f" {p['speed']:>12.1f} {ratio or 0:>5.2f}" if p else f" {'-':>12} {'-':>5}"

    head = (f"{'draft len':>9} {'p_min':>5} {'expect':>6} {'accept':>6}"
            + "".join(f" {f'{lv} par t/s':>12} {'x':>5}" for lv in levels))
    lines += [head, "-" * len(head)]
    plain = {p["level"]: p for p in d["plain"]}
    lines.append(f"{'none':>9} {'-':>5} {'-':>6} {'-':>6}" + "".join(cell(plain.get(lv), 1.0) for lv in levels))
    rows: dict[tuple, dict] = {}
    for p in d["points"]:
        rows.setdefault((p["n_max"], p["p_min"]), {})[p["level"]] = p
    for (n, pm), by in rows.items():
        al = by.get(1, {}).get("accept_length")
        al_text = "-" if al is None else f"{al:.2f}"
        expect = expected_accept_length(acc["rates"][:n])
        lines.append(f"{n:>9} {pm:>5g} {expect:>6.2f} {al_text:>6}"
                     + "".join(cell(by.get(lv), by[lv]["ratio"] if lv in by else None) for lv in levels))
    lines.append("")
    if rec["draft_enabled"]:
        pm = f", p_min {rec['p_min']:g}" if rec.get("p_min") else ""
        lines.append(f"RECOMMENDATION: draft length {rec['draft_n_max']}{pm}; drafting pays up to "
                     f"{_requests(rec['max_concurrency_for_draft'])}")
    else:
        lines.append("DRAFTING TURNED OFF: serve will run the target alone on this machine")
    lines.append(f"  because {rec['why']}")
    if d.get("profile_path") or d.get("path"):
        lines.append(f"profile: {d.get('profile_path') or d.get('path')}")
    return "\n".join(lines)


__all__ = ["PROFILES", "MIN_GAIN", "AcceptanceProfile", "geometric_rates", "expected_accept_length",
           "profile_from_rates", "profile_from_bench", "measure_profile", "recommend", "run_tune",
           "sweep_prompts", "measure_points", "show_profile", "format_tune", "TuneResult", "Point"]
