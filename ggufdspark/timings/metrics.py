"""llama-server's ``/metrics`` (Prometheus text): scrapes, counter totals, and the difference of two
scrapes as one record (the speculative counters of what ran between them)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ggufdspark.errors import TimingsParseError
from ggufdspark.timings.formats import numbered_lines
from ggufdspark.timings.records import COUNTERS, METRICS_PREFIX, PER_POS, RequestTimings

# ---------------------------------------------------------------------------------------------
# /metrics (Prometheus text)
# ---------------------------------------------------------------------------------------------

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


@dataclass
class MetricsScrape:
    """One ``/metrics`` scrape: sample values by (name, labels)."""

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    name: str = "metrics"
    line: int = 1  # of its first sample

    @property
    def where(self) -> str:
        return f"{self.name}:{self.line}"

    def get(self, name: str, **labels: str) -> float | None:
        return self.values.get((METRICS_PREFIX + name, tuple(sorted(labels.items()))))

    def per_pos(self) -> list[float]:
        pos = {}
        for (n, labels), v in self.values.items():
            if n == METRICS_PREFIX + PER_POS:
                lab = dict(labels)
                if lab.get("position", "").isdigit():
                    pos[int(lab["position"])] = v
        return [pos.get(i, 0.0) for i in range(max(pos) + 1)] if pos else []


def parse_metrics(text: str, *, name: str = "metrics") -> list[MetricsScrape]:
    """Scrapes in ``/metrics`` text; several concatenated scrapes split where a sample repeats.

    Raises:
        TimingsParseError: a line is not a Prometheus sample, or there are no llama-server
            speculative counters.
    """
    scrapes: list[MetricsScrape] = []
    cur: dict = {}
    start = 0
    for ln in numbered_lines(text):
        s = ln.text.strip()
        if not s or s.startswith("#"):
            continue
        m = SAMPLE.match(s)
        if not m:
            raise TimingsParseError(f"{name}: line {ln.no} (byte {ln.byte}): not a Prometheus sample "
                                    f"line: {s[:60]!r}")
        try:
            value = float(m.group("value"))
        except ValueError:
            raise TimingsParseError(f"{name}: line {ln.no} (byte {ln.byte}): value "
                                    f"{m.group('value')!r} is not a number") from None
        key = (m.group("name"), tuple(sorted(_LABEL.findall(m.group("labels") or ""))))
        if key in cur:
            scrapes.append(MetricsScrape(cur, name, start))
            cur = {}
        if not cur:
            start = ln.no
        cur[key] = value
    if cur:
        scrapes.append(MetricsScrape(cur, name, start))
    if not scrapes or any(s.get(COUNTERS["passes"]) is None for s in scrapes):
        raise TimingsParseError(f"{name}: no '{METRICS_PREFIX}{COUNTERS['passes']}' counter: not "
                                "llama-server /metrics output (start it with --metrics), or a build "
                                "without speculative counters")
    return scrapes


def _scrape(x: str | MetricsScrape, name: str) -> MetricsScrape:
    if isinstance(x, MetricsScrape):
        return x
    scrapes = parse_metrics(x, name=name)
    if len(scrapes) != 1:
        raise TimingsParseError(f"{name}: {len(scrapes)} scrapes in the text, expected one")
    return scrapes[0]


def _metrics_record(values: dict[str, float], per_pos: list[float], where: str, kind: str) -> RequestTimings:
    r = RequestTimings(source="metrics", kind=kind, where=where,
                       prompt_n=round(values["prompt_n"]), cache_n=round(values["cache_n"]),
                       prompt_ms=1000.0 * values["prompt_s"], predicted_n=round(values["predicted_n"]),
                       predicted_ms=1000.0 * values["predicted_s"])
    if round(values["draft_n"]) > 0:
        r.draft_n, r.draft_n_accepted = round(values["draft_n"]), round(values["draft_n_accepted"])
        r.passes, r.passes_source = round(values["passes"]), "metrics"
        r.accepted_per_pos = [round(p) for p in per_pos] or None
        if r.accepted_per_pos and r.passes:
            r.accept_rate_per_pos = [p / r.passes for p in r.accepted_per_pos]
    return r


def _counter_values(s: MetricsScrape) -> dict[str, float]:
    return {k: (s.get(name) or 0.0) for k, name in COUNTERS.items()}


def metrics_totals(scrape: str | MetricsScrape, *, name: str = "metrics") -> RequestTimings:
    """Everything since the server started, from one scrape (``kind="metrics-total"``)."""
    s = _scrape(scrape, name)
    return _metrics_record(_counter_values(s), s.per_pos(), s.where, "metrics-total")


def metrics_delta(before: str | MetricsScrape, after: str | MetricsScrape, *,
                  name: str = "metrics") -> RequestTimings:
    """What happened between two ``/metrics`` scrapes: with one request in flight, that request's
    exact drafted, accepted, verify-pass and per-position counts (``passes_source="metrics"``).

    The counters grow when a request finishes, so scrape before sending and after the answer.

    Raises:
        TimingsParseError: a scrape is not llama-server metrics, or a counter went down (the
            server restarted between the scrapes).
    """
    b, a = _scrape(before, f"{name} (before)"), _scrape(after, f"{name} (after)")
    vb, va = _counter_values(b), _counter_values(a)
    for k, name_ in COUNTERS.items():
        if va[k] < vb[k]:
            raise TimingsParseError(f"{name}: counter {METRICS_PREFIX}{name_} went down from {vb[k]:g} "
                                    f"to {va[k]:g}: the server restarted between the scrapes")
    pb, pa = b.per_pos(), a.per_pos()
    pb += [0.0] * (len(pa) - len(pb))
    delta = {k: va[k] - vb[k] for k in COUNTERS}
    where = f"{b.name}:{b.line}..{a.line}" if a.name == b.name else f"{b.where}..{a.where}"
    return _metrics_record(delta, [x - y for x, y in zip(pa, pb)], where, "metrics-delta")


def parse_metrics_records(text: str, name: str) -> list[RequestTimings]:
    scrapes = parse_metrics(text, name=name)
    if len(scrapes) == 1:
        return [metrics_totals(scrapes[0], name=name)]
    out = []
    for b, a in zip(scrapes, scrapes[1:]):
        r = metrics_delta(b, a, name=name)
        if r.predicted_n or r.prompt_n or r.draft_n:  # an interval where nothing ran is no request
            out.append(r)
    return out


