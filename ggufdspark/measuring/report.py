"""The bench report: per-category statistics, the plain brackets' drift, the report record, its
text and its plot."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark import timings as tm
from ggufdspark.convert.common import check_output
from ggufdspark.errors import (InvalidArgumentError, LosslessGateError, MissingDependencyError, PlainDriftError,
                               UnsafeOutputError)
from ggufdspark.measuring.gate import GateResult
from ggufdspark.measuring.measure import LOCKSTEP_LABEL, Outcome


# The two runs of the target alone, before and after the speculative arm, measure the same thing.
# When the faster of them is more than this much faster than the slower, the machine's speed moved
# during the run (another job, throttling, a stalled request) and a ratio against them measures
# that, not the draft: the report keeps the speeds but gives no speedup, and bench exits with 5.
# A run of real length on a quiet machine stays well inside it (the tiny test pair on this shared
# 2-core CPU, 31 requests of 128 tokens: 2-9% apart; one request of 16 tokens: up to 20%); a stalled
# plain arm once gave a "707.98x" speedup with its two plain runs 2880x apart (issue 17).
MAX_PLAIN_DRIFT = 0.25


# --------------------------------------------------------------------------- report


@dataclass
class GroupStats:
    """One category (or all of them): both arms' throughput and the draft's acceptance."""

    name: str
    requests: int
    plain_tokens: int
    spec_tokens: int
    plain_decode_tps: float | None
    spec_decode_tps: float | None
    plain_e2e_tps: float | None
    spec_e2e_tps: float | None
    accept_length_request_mean: float | None
    accept_length_token_weighted: float | None
    acceptance_rate: float | None
    # prefill (prompt processing, image encoding included): DSpark does not change it
    prompt_tokens_mean: float | None = None
    plain_prefill_ms: float | None = None
    spec_prefill_ms: float | None = None

    @property
    def decode_speedup(self) -> float | None:
        return ratio(self.spec_decode_tps, self.plain_decode_tps)

    @property
    def e2e_speedup(self) -> float | None:
        return ratio(self.spec_e2e_tps, self.plain_e2e_tps)

    def to_dict(self) -> dict:
        return {**asdict(self), "decode_speedup": self.decode_speedup, "e2e_speedup": self.e2e_speedup}


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either is missing (or b is 0)."""
    return a / b if a is not None and b else None


def decode_tps(outs: list[Outcome]) -> float | None:
    """The engine's decode speed over the requests, token-weighted."""
    return tm.summarize([o.timings for o in outs]).decode_tps.token_weighted


def _e2e_tps(outs: list[Outcome]) -> float | None:
    wall = sum(o.wall_s for o in outs)
    return sum(o.timings.predicted_n or 0 for o in outs) / wall if wall else None


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def group_stats(name: str, plain: list[Outcome], plain_again: list[Outcome], spec: list[Outcome]) -> GroupStats:
    """Plain throughput pools both plain runs (the bracket); tokens are counted once. Prefill is
    reported apart (mean ms per request): it includes the vision encoder and is not drafted."""
    s = tm.summarize([o.timings for o in spec])
    both = plain + plain_again
    return GroupStats(name, len(spec), sum(o.timings.predicted_n or 0 for o in plain),
                      s.predicted_n, decode_tps(both), decode_tps(spec), _e2e_tps(both), _e2e_tps(spec),
                      s.accept_length.request_mean, s.accept_length.token_weighted,
                      s.acceptance_rate.token_weighted,
                      _mean([o.timings.prompt_n for o in spec]),
                      _mean([o.timings.prompt_ms for o in both]), _mean([o.timings.prompt_ms for o in spec]))


def bracket_drift(before: float | None, after: float | None) -> float | None:
    """How far apart two runs of the target alone are: the faster one's speed over the slower
    one's, minus 1 (0.25: one ran 25% faster than the other), whichever came first; ``inf`` when
    one of them measured nothing; None when either is missing."""
    if before is None or after is None or (before <= 0 and after <= 0):
        return None
    lo, hi = sorted((before, after))
    return hi / lo - 1 if lo > 0 else math.inf


def plain_drift(before: float | None, after: float | None, *, max_drift: float = MAX_PLAIN_DRIFT) -> dict:
    """The headline bracket: the plain decode speeds of one request at a time before and after the
    speculative arm, and whether their drift (``bracket_drift``) refuses the speedup.

    Returns:
        ``{"plain_drift": drift or None, "max_plain_drift": max_drift, "headline_refused": bool}``.
    """
    d = bracket_drift(before, after)
    return {"plain_drift": d, "max_plain_drift": max_drift, "headline_refused": d is not None and d > max_drift}


def _finite(x: float | None) -> float | None:
    """JSON has no Infinity: a drift of a run that measured nothing is written as null."""
    return x if x is None or math.isfinite(x) else None


def _drift_text(d: float | None) -> str:
    if d is None:
        return "-"
    if math.isinf(d):
        return "one of them measured nothing"
    return f"{d:.1%} apart" if d < 1 else f"{d + 1:.1f}x apart"  # 0.2: 20% apart; 2879: 2880x apart


def accept_histogram(per_pos: list[int] | None, passes: int | None) -> list[int]:
    """Verify passes by accept length: entry k counts passes that emitted k+1 tokens (k drafted
    tokens accepted), from the per-position counters (``per_pos[i]``: passes accepting > i)."""
    if not per_pos or not passes:
        return []
    cum = [passes] + list(per_pos) + [0]
    return [max(0, cum[k] - cum[k + 1]) for k in range(len(per_pos) + 1)]


@dataclass
class BenchReport:
    settings: dict
    synthetic: str | None
    groups: list[GroupStats]
    overall: GroupStats
    drift: dict
    load: list[dict]
    gate: GateResult
    acceptance: dict
    reference: dict | None = None
    logs: dict = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    @property
    def headline_refused(self) -> bool:
        """The plain brackets disagreed beyond the limit: no speedup is claimed (``plain_drift``)."""
        return bool(self.drift.get("headline_refused"))

    def to_dict(self) -> dict:
        """The report as JSON data; a refused run keeps every speed but its speedups are null."""
        groups, overall = [g.to_dict() for g in self.groups], self.overall.to_dict()
        load = [dict(p) for p in self.load]
        if self.headline_refused:
            for g in groups + [overall]:
                g["decode_speedup"] = g["e2e_speedup"] = None
            for p in load:
                p["ratio"] = None
        for p in load:
            p["plain_drift"] = _finite(p.get("plain_drift"))
        drift = {**self.drift, "plain_drift": _finite(self.drift.get("plain_drift"))}
        return {"kind": "ggufdspark bench", "pair": self.pair, "settings": self.settings, "synthetic": self.synthetic,
                "plain_drift": drift["plain_drift"], "headline_refused": self.headline_refused,
                "groups": groups, "overall": overall, "drift": drift, "load": load, "load_shape": LOCKSTEP_LABEL,
                "gate": self.gate.to_dict(), "acceptance": self.acceptance, "reference": self.reference,
                "logs": self.logs, "requests": self.requests}

    def drift_refusal(self) -> str | None:
        """Why the report gives no speedup, or None when its plain brackets agree within the limit."""
        if not self.headline_refused:
            return None
        d = self.drift
        return (f"the runs of the target alone before and after the speculative arm were "
                f"{_drift_text(d.get('plain_drift'))} (limit {d.get('max_plain_drift', MAX_PLAIN_DRIFT):.0%}, "
                "--max-plain-drift): the machine was too noisy for a speedup")

    def raise_for_drift(self) -> None:
        """Raise PlainDriftError (exit code 5) when the plain brackets disagreed beyond the limit."""
        why = self.drift_refusal()
        if why:
            raise PlainDriftError(f"no speedup: {why}; the speeds measured are in the report")

    def raise_for_gate(self) -> None:
        """Raise LosslessGateError naming the first defect (item, position, tokens, probabilities)."""
        bad = [d for d in self.gate.divergences if d.kind == "defect"]
        if bad:
            more = f" (and {len(bad) - 1} more defects)" if len(bad) > 1 else ""
            raise LosslessGateError(f"lossless gate failed: {bad[0].describe()}{more}")

    def text(self) -> str:
        return format_report(self)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(r: BenchReport) -> str:
    """The text table: per category and overall, drift, the concurrency curve, the gate."""
    s = r.settings
    pmin = "" if s.get("p_min") is None else f", p_min {s['p_min']}"
    lines = [f"ggufdspark bench: {Path(s['target']).name} + {Path(s['draft']).name} "
             f"({s['backend']}, engine {s['engine']})",
             f"draft length {s['draft_n_max']}{pmin}; "
             f"n_predict {s['n_predict']}; {s['items']} items, {s['requests']} requests; prompts: {s['prompts']}"]
    if r.synthetic:
        lines.append(f"SYNTHETIC SPEED: {r.synthetic}; the output is not valid, only the speed")
    refused = r.headline_refused
    if refused:
        lines.append(f"NO SPEEDUP: {r.drift_refusal()}; speeds are as measured, ratios are withheld")
    head = (f"{'category':<18} {'req':>4} {'tokens':>7} {'plain t/s':>10} {'spec t/s':>9} {'decode':>7} "
            f"{'e2e':>6} {'accept len req/tok':>19} {'acc rate':>8}")
    lines += ["", head, "-" * len(head)]
    for g in r.groups + [r.overall]:
        if g is r.overall:
            lines.append("-" * len(head))
        al = f"{_f(g.accept_length_request_mean, '{:.2f}')}/{_f(g.accept_length_token_weighted, '{:.2f}')}"
        dec, e2e = (None, None) if refused else (g.decode_speedup, g.e2e_speedup)
        lines.append(f"{g.name:<18} {g.requests:>4} {g.spec_tokens:>7} {_f(g.plain_decode_tps):>10} "
                     f"{_f(g.spec_decode_tps):>9} {_f(dec, '{:.2f}x'):>7} "
                     f"{_f(e2e, '{:.2f}x'):>6} {al:>19} {_f(g.acceptance_rate, '{:.2f}'):>8}")
    lines += ["", "prefill (prompt and images; the draft does not change it): mean per request",
              f"{'category':<18} {'prompt tok':>10} {'plain ms':>9} {'spec ms':>8}"]
    for g in r.groups + [r.overall]:
        lines.append(f"{g.name:<18} {_f(g.prompt_tokens_mean, '{:.0f}'):>10} {_f(g.plain_prefill_ms):>9} "
                     f"{_f(g.spec_prefill_ms):>8}")
    d = r.drift
    apart = "" if d.get("plain_drift") is None else (
        f"; {_drift_text(d['plain_drift'])}, limit {d.get('max_plain_drift', MAX_PLAIN_DRIFT):.0%}")
    lines += ["", f"plain drift: {_f(d.get('before_tps'))} tok/s before, {_f(d.get('after_tps'))} after "
                  f"({_f(d.get('change'), '{:+.1%}')}{apart})"]
    a = r.acceptance
    if a.get("accept_length") is not None:
        lines.append(f"accept length (verify passes, /metrics): {a['accept_length']:.2f} over {a['passes']} passes; "
                     "per position " + " ".join(f"{x:.2f}" for x in a.get("rates") or []))
    if r.load:
        lines += ["", f"load ({LOCKSTEP_LABEL}):", f"{'parallel':>8} {'plain t/s':>10} {'spec t/s':>9} {'ratio':>6} {'accept len':>10}"]
        for p in r.load:
            lines.append(f"{p['level']:>8} {_f(p['plain_tps']):>10} {_f(p['spec_tps']):>9} "
                         f"{_f(None if refused else p['ratio'], '{:.2f}x'):>6} "
                         f"{_f(p.get('spec_accept_length'), '{:.2f}'):>10}"
                         + (f"  ratio withheld: plain runs {_drift_text(p['plain_drift'])}"
                            if p.get("ratio_withheld") else ""))
    g = r.gate
    lines.append("")
    if g.status in ("pass", "fail"):
        lines.append(f"lossless gate: {g.status.upper()}: {g.requests} requests: {g.exact} exact, "
                     f"{g.near_ties} near-tie divergences, {g.defects} defects "
                     f"(near-tie: plain top-2 gap < {g.near_tie_gap})")
        for dv in g.divergences:
            lines.append(f"  {dv.kind.upper()}: {dv.describe()}")
        if g.plain_unstable:
            lines.append(f"  note: {g.plain_unstable} requests differed between the two plain runs")
    else:
        lines.append(f"lossless gate: {g.status.upper()}: {g.reason}")
    if r.reference:
        ref = r.reference
        lines.append(f"reference ({ref['runtime']}, informational): {ref['exact']} exact, {ref['differs']} differ "
                     "from plain llama.cpp")
    return "\n".join(lines)


# Formats of matplotlib's Agg canvas that need more than matplotlib and Pillow (pgf: a LaTeX install).
_PLOT_NEEDS_MORE = {"pgf"}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib: pip install 'ggufdspark[plot]'") from None
    return plt


def plot_formats() -> list[str]:
    """File extensions (no dot) the plot can be written as: what matplotlib's Agg canvas writes."""
    _pyplot()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return sorted(set(FigureCanvasAgg.get_supported_filetypes()) - _PLOT_NEEDS_MORE)


def check_plot_path(path: str | Path, *inputs: str | Path) -> Path:
    """Refuse a plot that could not be written, before any measuring: matplotlib missing, an
    extension it cannot write, a directory that is missing or not writable, a directory at the
    path, or one of the ``inputs``.

    Raises:
        MissingDependencyError, InvalidArgumentError, UnsafeOutputError: each naming ``--plot`` and the path.
    """
    p = Path(path)
    kinds = plot_formats()
    ext = p.suffix[1:].lower()
    if ext not in kinds:
        what = f"matplotlib cannot write .{ext} files" if ext else "no file extension to choose the format by"
        raise InvalidArgumentError(f"--plot {p}: {what} (expected one of {', '.join('.' + k for k in kinds)})")
    if p.is_dir():
        raise UnsafeOutputError(f"--plot {p}: is a directory")
    try:
        check_output(p, *(i for i in inputs if i))
    except UnsafeOutputError as e:
        raise UnsafeOutputError(f"--plot {e}") from None
    return p


def plot_report(r: BenchReport, path: str | Path) -> Path:
    """Decode speedup by category, throughput ratio vs concurrency, accept-length histogram; the
    format from the extension (PNG, SVG, PDF...: ``plot_formats``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    groups = r.groups + [r.overall]
    refused = r.headline_refused  # speedups withheld: the panels stay empty
    ax[0].bar([g.name for g in groups], [0 if refused else g.decode_speedup or 0 for g in groups], color="steelblue")
    ax[0].axhline(1.0, color="gray", lw=1, ls="--")
    ax[0].set_title("decode speedup by category")
    ax[0].tick_params(axis="x", rotation=35)
    if r.load and not refused:
        ax[1].plot([p["level"] for p in r.load], [p["ratio"] or 0 for p in r.load], "o-")
        ax[1].set_xscale("log", base=2)
    ax[1].axhline(1.0, color="gray", lw=1, ls="--")
    ax[1].set_title("speculative / plain throughput vs parallel requests")
    ax[1].set_xlabel("parallel requests")
    hist = r.acceptance.get("histogram") or []
    ax[2].bar(range(1, len(hist) + 1), hist, color="darkorange")
    ax[2].set_title("accept length per verify pass")
    ax[2].set_xlabel("tokens emitted per pass")
    if r.headline_refused:
        fig.suptitle("NO SPEEDUP: the plain runs before and after disagree beyond the limit (too noisy)")
    elif r.synthetic:
        fig.suptitle("SYNTHETIC acceptance: speed only")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
