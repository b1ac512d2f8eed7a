"""Two arms measured turn by turn (``speed.py decode --interleave``: every arm's request of turn i sent
before any arm's of turn i + 1) compared the way such runs are read: the ratio of each turn's pair,
their geometric mean, how many turns the arm was faster in, and the exact two-sided sign test of that
count (how likely as many or more lopsided wins would be if neither arm were faster). The machine's
drift over a run falls on both arms of a turn alike, so a switch worth 1-2% shows here long before
the medians of two arms separate beyond their spread."""

from __future__ import annotations

import math
import statistics


def sign_test(wins: int, n: int) -> float:
    """Two-sided exact sign test: P(a split at least as lopsided as ``wins`` of ``n``) under p = 1/2."""
    if n == 0:
        return 1.0
    k = max(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(arm: list[float], base: list[float]) -> dict:
    """``arm`` against ``base``, turn by turn (rates: higher is faster; the lists in turn order)."""
    if len(arm) != len(base) or not arm:
        raise ValueError(f"paired: {len(arm)} turns against {len(base)}: an interleaved run has as many for every arm")
    ratios = [a / b for a, b in zip(arm, base)]
    ties = sum(r == 1 for r in ratios)
    wins = sum(r > 1 for r in ratios)
    n = len(ratios) - ties
    return {"geomean": statistics.geometric_mean(ratios), "faster": wins, "turns": len(ratios),
            "ties": ties, "sign_p": sign_test(wins, n)}


def describe(p: dict, base_label: str) -> str:
    """One line: ``x1.019 per turn against BASE (geometric mean), faster in 20 of 24 turns, sign test p 0.0015``."""
    ties = f", {p['ties']} even" if p["ties"] else ""
    return (f"x{p['geomean']:.3f} per turn against {base_label} (geometric mean), faster in {p['faster']} of "
            f"{p['turns']} turns{ties}, sign test p {p['sign_p']:.2g}")
