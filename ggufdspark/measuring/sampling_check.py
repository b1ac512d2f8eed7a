"""The sampling check: speculative sampling must leave the target's distribution as it is.

The lossless gate (``ggufdspark.measuring.gate``) compares greedy outputs token by token; at temperature > 0
there is no single right output, only a distribution. Here two arms (the target alone, the target
with the draft) each sample many completions of one prompt, every request with its own seed, and
at every position the two arms' token frequencies are compared by a chi-square test of homogeneity:

* the categories at position ``p`` are the tokens sampled there, plus ``END`` for a completion
  that stopped before it (a length difference counts as a difference);
* a token whose expected count is under ``min_expected`` (5) in either arm goes to an ``OTHER``
  bin; an ``OTHER`` bin still under it takes the smallest kept token, until it reaches the limit
  or one bin is left; ``dof`` = bins - 1 (two arms);
* positions with a single bin say nothing (``dof`` 0, p = 1) and are not counted in the correction;
* Bonferroni over the tested positions: the run passes when every ``p * m >= alpha``.

The two arms must use different seeds: with equal seeds the engine's verify step draws one random
number per committed token, as plain decoding does, so a drafted request reproduces the plain one
token for token and the test would compare a sample with itself.

The chi-square survival function is computed here (no stats library is a dependency): the
regularized upper incomplete gamma function, by its power series below ``a + 1`` and by a
continued fraction above.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

END = "END"      # the completion stopped before this position
OTHER = "OTHER"  # pooled rare tokens
MIN_EXPECTED = 5.0
ALPHA = 0.01

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 10_000


# --------------------------------------------------------------------------- chi-square tail


def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma function Q(a, x) = Γ(a, x) / Γ(a), a > 0, x >= 0.

    Raises:
        ValueError: a <= 0 or x < 0.
    """
    if a <= 0 or x < 0:
        raise ValueError(f"gamma_q: needs a > 0 and x >= 0 (got a={a}, x={x})")
    if x == 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # P(a, x) = x^a e^-x / Γ(a + 1) * sum_n x^n / ((a+1)...(a+n))
        term = total = 1.0 / a
        for n in range(1, _MAX_ITER):
            term *= x / (a + n)
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Q(a, x) = e^-x x^a / Γ(a) * 1 / (x + 1 - a - 1(1-a) / (x + 3 - a - 2(2-a) / (x + 5 - a - ...)))
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return min(1.0, math.exp(log_front) * h)


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with ``dof`` degrees of freedom (``dof`` >= 1)."""
    if dof < 1:
        raise ValueError(f"chi2_sf: dof must be >= 1 (got {dof})")
    return 1.0 if x <= 0 else gamma_q(dof / 2.0, x / 2.0)


# --------------------------------------------------------------------------- one position


def token_at(seq: Sequence[int], position: int) -> int | str:
    return seq[position] if position < len(seq) else END


@dataclass
class PositionTest:
    """The homogeneity test at one position. ``bins``: ``[label, count_a, count_b]`` rows, most
    frequent first (label: a token id, ``END`` or ``OTHER``)."""

    position: int
    statistic: float
    dof: int
    p_value: float
    p_adjusted: float = 1.0
    bins: list[list] = field(default_factory=list)

    @property
    def tested(self) -> bool:
        return self.dof > 0


def pool(counts_a: Counter, counts_b: Counter, *, min_expected: float = MIN_EXPECTED) -> list[list]:
    """The bins of one position: tokens whose expected count is at least ``min_expected`` in both
    arms, the rest pooled into ``OTHER`` (grown by the smallest kept token while it is short)."""
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    n = n_a + n_b
    if n == 0:
        return []
    least = min(n_a, n_b) / n  # the smaller arm's share: its expected count is the lower one

    def total(label) -> int:
        return counts_a.get(label, 0) + counts_b.get(label, 0)

    labels = sorted(set(counts_a) | set(counts_b), key=lambda t: (-total(t), str(t)))
    kept = [t for t in labels if total(t) * least >= min_expected]
    rare = [t for t in labels if total(t) * least < min_expected]
    other = [sum(counts_a.get(t, 0) for t in rare), sum(counts_b.get(t, 0) for t in rare)]
    while rare and sum(other) * least < min_expected and kept:
        t = kept.pop()
        other[0] += counts_a.get(t, 0)
        other[1] += counts_b.get(t, 0)
    bins = [[t, counts_a.get(t, 0), counts_b.get(t, 0)] for t in kept]
    if sum(other):
        bins.append([OTHER, *other])
    return bins


def homogeneity(bins: list[list]) -> tuple[float, int]:
    """Pearson's chi-square statistic of a 2 x k table (``[label, count_a, count_b]`` rows) and its
    degrees of freedom, k - 1 (0 for fewer than two bins or an empty arm)."""
    n_a = sum(b[1] for b in bins)
    n_b = sum(b[2] for b in bins)
    n = n_a + n_b
    if len(bins) < 2 or n_a == 0 or n_b == 0:
        return 0.0, 0
    stat = 0.0
    for _, a, b in bins:
        row = a + b
        for observed, arm in ((a, n_a), (b, n_b)):
            expected = row * arm / n
            stat += (observed - expected) ** 2 / expected
    return stat, len(bins) - 1


def compare_position(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], position: int, *,
                     min_expected: float = MIN_EXPECTED) -> PositionTest:
    """The homogeneity test of the two arms' tokens at ``position``."""
    bins = pool(Counter(token_at(s, position) for s in a), Counter(token_at(s, position) for s in b),
                min_expected=min_expected)
    stat, dof = homogeneity(bins)
    return PositionTest(position, stat, dof, chi2_sf(stat, dof) if dof else 1.0, bins=bins)


# --------------------------------------------------------------------------- all positions


@dataclass
class SamplingCheck:
    """The check over every position. ``status``: pass or fail at ``alpha`` after the Bonferroni
    correction over the ``tested`` positions, or inconclusive when none could be tested (a single
    token everywhere shows nothing); ``worst``: the tested position of smallest p-value."""

    status: str
    alpha: float
    samples_a: int
    samples_b: int
    positions: list[PositionTest]
    tested: int
    worst: int | None
    min_expected: float = MIN_EXPECTED
    labels: tuple[str, str] = ("plain", "drafted")
    reason: str = ""

    @property
    def worst_test(self) -> PositionTest | None:
        return None if self.worst is None else self.positions[self.worst]

    @property
    def min_p_adjusted(self) -> float:
        return min((t.p_adjusted for t in self.positions if t.tested), default=1.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["min_p_adjusted"] = self.min_p_adjusted
        return d

    def describe(self) -> str:
        a, b = self.labels
        head = (f"sampling check: {self.status} at alpha {self.alpha:g} ({self.samples_a} {a} / {self.samples_b} {b} "
                f"samples, {self.tested} of {len(self.positions)} positions tested, Bonferroni)")
        if self.reason:
            head += f": {self.reason}"
        w = self.worst_test
        if w is None:
            return head
        top = ", ".join(f"{lab}: {x}/{y}" for lab, x, y in w.bins[:4])
        return (f"{head}\n  worst position {w.position}: chi2 {w.statistic:.2f}, dof {w.dof}, p {w.p_value:.3g} "
                f"(adjusted {w.p_adjusted:.3g}); {a}/{b} counts {top}")


def check_samples(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], *, alpha: float = ALPHA,
                  positions: int | None = None, min_expected: float = MIN_EXPECTED,
                  labels: tuple[str, str] = ("plain", "drafted")) -> SamplingCheck:
    """Compare two sets of sampled completions (token id lists, one prompt) position by position.

    Args:
        positions: how many leading positions to test (default: the longest completion).

    Raises:
        ValueError: an empty arm, or alpha outside (0, 1).
    """
    if not a or not b:
        raise ValueError(f"check_samples: both arms need samples ({len(a)} and {len(b)} given)")
    if not 0 < alpha < 1:
        raise ValueError(f"check_samples: alpha must be in (0, 1) (got {alpha})")
    n_pos = positions if positions is not None else max(len(s) for s in (*a, *b))
    tests = [compare_position(a, b, p, min_expected=min_expected) for p in range(n_pos)]
    tested = [t for t in tests if t.tested]
    for t in tested:
        t.p_adjusted = min(1.0, t.p_value * len(tested))
    worst = min(tested, key=lambda t: t.p_value).position if tested else None
    res = SamplingCheck("pass", alpha, len(a), len(b), tests, len(tested), worst, min_expected, labels)
    if not tested:
        res.status, res.reason = "inconclusive", "no position had two bins to compare (raise the temperature or the samples)"
    elif res.min_p_adjusted < alpha:
        res.status = "fail"
        res.reason = f"position {worst}'s token frequencies differ (adjusted p {res.min_p_adjusted:.3g} < {alpha:g})"
    return res


def spread(seqs: Iterable[Sequence[int]], position: int) -> list[tuple[int | str, float]]:
    """The token frequencies at ``position``, most frequent first (to see how peaked a setting is)."""
    c = Counter(token_at(s, position) for s in seqs)
    n = sum(c.values())
    return [(t, k / n) for t, k in c.most_common()]
