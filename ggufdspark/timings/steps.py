"""The engine's slow-step lines (patch 0072, ``LLAMA_SPEC_PROFILE_SLOW=MS``): one server step each,
its batch and where its time went.

    steps = parse_steps(Path("server.log").read_text())
    for kind, s in summarize_steps(steps).items():
        print(kind, s.count, s.wall_p95_ms, s.phase_means_ms)

A step is one ``update_slots`` pass that decoded a batch. Its kind: ``join`` (prompt rows beside
generating slots: the step a streaming request waits through when a prompt joins), ``prompt``
(prompt rows only) or ``generate`` (generating slots only).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

PHASES = ("tgt_launch", "tgt_wait", "tgt_sample", "inj_launch", "inj_wait", "dft_launch", "dft_wait",
          "dft_read", "other_host")

_NUM = r"(-?[\d.]+)"
_LINE = re.compile(
    rf"spec slow step: {_NUM} ms, {_NUM} ms after the last: (\d+) prompt rows, (\d+) generating slots with "
    rf"(\d+) rows \((\d+) drafted\); target (\d+) decodes \((\d+) with outputs\) of (\d+) rows launch {_NUM} "
    rf"wait {_NUM} sample {_NUM}; injection (\d+) decodes of (\d+) rows launch {_NUM} wait {_NUM}; "
    rf"draft block (\d+) decodes of (\d+) rows launch {_NUM} wait {_NUM} read {_NUM}; other host {_NUM}")


@dataclass(frozen=True)
class Step:
    wall_ms: float
    since_last_ms: float  # the server loop's time between the previous step's end and this one's start
    prompt_rows: int
    generating_slots: int
    generating_rows: int
    drafted: int
    target_decodes: int
    target_rows: int
    injection_rows: int
    draft_rows: int
    phases_ms: dict[str, float] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        if self.prompt_rows and self.generating_slots:
            return "join"
        return "prompt" if self.prompt_rows else "generate"


def parse_steps(text: str) -> list[Step]:
    """Every slow-step line in ``text`` (a server log), in order; other lines are skipped."""
    out = []
    for m in _LINE.finditer(text):
        g = m.groups()
        f = [float(x) for x in g]
        phases = dict(zip(PHASES, (f[9], f[10], f[11], f[14], f[15], f[18], f[19], f[20], f[21])))
        out.append(Step(wall_ms=f[0], since_last_ms=f[1], prompt_rows=int(g[2]), generating_slots=int(g[3]),
                        generating_rows=int(g[4]), drafted=int(g[5]), target_decodes=int(g[6]),
                        target_rows=int(g[8]), injection_rows=int(g[13]), draft_rows=int(g[17]), phases_ms=phases))
    return out


@dataclass(frozen=True)
class StepSummary:
    count: int
    wall_p50_ms: float
    wall_p95_ms: float
    wall_max_ms: float
    wall_share: float  # this kind's part of every step's wall time together
    since_last_mean_ms: float  # the server loop's host time before each such step
    generating_slots_mean: float
    drafted_mean: float
    prompt_rows_mean: float
    injection_rows_mean: float
    target_decodes_mean: float
    phase_means_ms: dict[str, float]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize_steps(steps: list[Step]) -> dict[str, StepSummary]:
    """Per kind (``join``, ``prompt``, ``generate``; only those present): the count, the wall time's
    p50 / p95 / max and its share of all the steps' wall time, and each phase's mean."""
    out = {}
    total = sum(s.wall_ms for s in steps) or 1.0
    for kind in ("join", "prompt", "generate"):
        group = [s for s in steps if s.kind == kind]
        if not group:
            continue
        walls = [s.wall_ms for s in group]
        out[kind] = StepSummary(
            count=len(group), wall_p50_ms=_pct(walls, 0.5), wall_p95_ms=_pct(walls, 0.95), wall_max_ms=max(walls),
            wall_share=sum(walls) / total, since_last_mean_ms=statistics.fmean(s.since_last_ms for s in group),
            generating_slots_mean=statistics.fmean(s.generating_slots for s in group),
            drafted_mean=statistics.fmean(s.drafted for s in group),
            prompt_rows_mean=statistics.fmean(s.prompt_rows for s in group),
            injection_rows_mean=statistics.fmean(s.injection_rows for s in group),
            target_decodes_mean=statistics.fmean(s.target_decodes for s in group),
            phase_means_ms={p: statistics.fmean(s.phases_ms[p] for s in group) for p in PHASES})
    return out
