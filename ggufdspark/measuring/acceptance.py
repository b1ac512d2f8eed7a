"""Acceptance profiles: per-position acceptance rates ``r_i`` (P[at least i+1 drafted tokens
accepted in a verify pass]) that ``tune`` and the benchmarks hold fixed while draft lengths change:
llama.cpp's geometric construction from a mean accept length, rates given by hand, read from a
``bench`` report, or measured from a real drafter on this machine."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ggufdspark import timings as tm
from ggufdspark.errors import BenchError, BenchOptionError, InputNotFoundError
from ggufdspark.measuring import measure as ms

log = logging.getLogger(__name__)


def geometric_rates(mean_length: float, n: int) -> list[float]:
    """Rates ``r_i = p**(i+1)`` (the same conditional acceptance p at every position) whose
    expected accept length ``1 + sum(r)`` over ``n`` positions is ``mean_length``; p by bisection.
    This is how llama.cpp resolves ``--spec-synth-len`` (``common_speculative_synth_rates_resolve``).
    """
    if not 1.0 <= mean_length <= n + 1:
        raise BenchOptionError(f"mean accept length {mean_length} is outside [1, {n + 1}] for {n} positions")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        if sum(p ** (i + 1) for i in range(n)) < mean_length - 1.0:
            lo = p
        else:
            hi = p
    return [p ** (i + 1) for i in range(n)]


def expected_accept_length(rates: list[float]) -> float:
    """Tokens per verify pass, bonus token included: 1 + sum of the unconditional rates."""
    return 1.0 + sum(rates)


@dataclass(frozen=True)
class AcceptanceProfile:
    name: str
    rates: tuple[float, ...]
    source: str

    @property
    def mean_length(self) -> float:
        return expected_accept_length(list(self.rates))

    def truncated(self, n: int) -> list[float]:
        """The first ``n`` rates: per-position acceptance held fixed for a shorter draft."""
        return list(self.rates[:n])

    def to_dict(self) -> dict:
        return {"name": self.name, "rates": list(self.rates), "mean_length": self.mean_length, "source": self.source}


# The published drafter (LFM2.5-VL-3B-DSpark) reports mean accept length 4.22 at block size 9
# (request mean, SGLang, MMSpec test split; ../shared/DESIGN.md) and no per-position figures. With
# the mean alone, the rates below assume the same conditional acceptance p at each of the 9 drafted
# positions (an anchor-first DSpark draft of block 9 drafts 9 tokens): 1 + sum_{i=1..9} p**i = 4.22
# gives p = 0.78376, r_i = p**i (rounded to 4 places; 1 + sum = 4.2200). That is exactly the vector
# llama.cpp derives from --spec-synth-len 4.22 at n_max 9, i.e. the acceptance of the H200 rows in
# DESIGN.md at n_max 9. Truncated to n positions it gives 1 + sum_{i<=n} r_i:
#   n:    1     2     3     4     5     6     7     8     9
#   len: 1.78  2.40  2.88  3.26  3.55  3.78  3.97  4.11  4.22
# Real per-position rates (from `bench` of the real pair) replace this assumption.
PROFILES: dict[str, AcceptanceProfile] = {
    "published": AcceptanceProfile(
        "published",
        (0.7838, 0.6143, 0.4814, 0.3773, 0.2957, 0.2318, 0.1817, 0.1424, 0.1116),
        "LFM2.5-VL-3B-DSpark: mean accept length 4.22 at block 9, geometric per-position rates"),
}



def profile_from_rates(rates: list[float], *, name: str = "given") -> AcceptanceProfile:
    """A profile from ``--rates`` (validated: probabilities, non-increasing)."""
    ms.check_rates(rates, 1, what="--rates")
    return AcceptanceProfile(name, tuple(rates), "per-position rates given on the command line")


def profile_from_bench(path: str | Path) -> AcceptanceProfile:
    """Per-position rates measured by ``ggufdspark bench --json`` (the speculative arm's counters).

    Raises:
        InputNotFoundError: no such file.
        BenchError: not a bench report, a synthetic one, or one without per-position counts.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"{p}: bench report not found")
    try:
        data = json.loads(p.read_text())
        acc = data["acceptance"]
        if not isinstance(acc, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):  # binary or non-UTF-8 bytes, bad JSON, wrong shape
        raise BenchError(f"{p}: not a 'ggufdspark bench --json' report (no 'acceptance' object)") from None
    if data.get("synthetic"):
        raise BenchError(f"{p}: the bench ran with synthetic acceptance ({data['synthetic']}); its rates are the "
                         "ones it was given, not this pair's; bench without --synthetic-* first")
    rates = acc.get("rates")
    if not rates:
        raise BenchError(f"{p}: no per-position acceptance in the report (nothing was drafted)")
    try:
        rates = [float(r) for r in rates]
        if not all(0.0 <= r <= 1.0 for r in rates):  # NaN fails too
            raise ValueError
    except (TypeError, ValueError):
        raise BenchError(f"{p}: acceptance.rates is not a list of probabilities: {str(rates)[:80]}") from None
    return AcceptanceProfile(f"bench:{p.name}", tuple(rates),
                             f"measured by bench at draft length {len(rates)} ({acc.get('passes')} verify passes)")


def measure_profile(client: Any, prompts: list[Any], n_predict: int, n_max: int) -> AcceptanceProfile:
    """Per-position rates of the real draft on ``prompts`` (greedy, one request at a time), from
    the server's ``/metrics`` counters."""
    m0 = client.metrics()
    for p in prompts:
        ms.request(client, p, n_predict)
    d = tm.metrics_delta(m0, client.metrics())
    if not d.accept_rate_per_pos:
        raise BenchError("measuring acceptance: nothing was drafted (check the draft and the server log)")
    rates = [min(1.0, r) for r in d.accept_rate_per_pos][:n_max]
    for i in range(1, len(rates)):  # cumulative counts never increase; guard rounding anyway
        rates[i] = min(rates[i], rates[i - 1])
    return AcceptanceProfile("measured", tuple(rates),
                             f"measured on this pair: built-in prompts, greedy, draft length {n_max}, "
                             f"{d.passes} verify passes, mean accept length {d.accept_length:.2f}")


# --------------------------------------------------------------------------- the sweep
