"""``ggufdspark timings``: read speculative-decoding timings, print a table, JSON or CSV."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path

import click

from ggufdspark import timings as tm
from ggufdspark.cli._common import NumberRange, echo_json, finite_json
from ggufdspark.errors import InputNotFoundError
from ggufdspark.interrupts import stop_signals_interrupt
from ggufdspark.timings.live import LogWindow, stats_line

# (header, RequestTimings attribute, format): the table's columns, left to right
TABLE_COLUMNS: list[tuple[str, str, str]] = [
    ("prompt", "prompt_n", "d"),
    ("gen", "predicted_n", "d"),
    ("drafted", "draft_n", "d"),
    ("accepted", "draft_n_accepted", "d"),
    ("rate", "acceptance_rate", ".3f"),
    ("AL", "accept_length", ".2f"),
    ("MAT", "mat", ".2f"),
    ("tok/pass", "tokens_per_pass", ".2f"),
    ("prompt t/s", "prompt_tps", ".1f"),
    ("decode t/s", "decode_tps", ".1f"),
    ("e2e ms", "end_to_end_ms", ".1f"),
]

# RequestTimings.to_dict() keys written by --csv, in order
CSV_COLUMNS = ["where", "engine", "source", "kind", "task_id", "prompt_n", "prompt_ms", "predicted_n",
               "predicted_ms", "draft_n", "draft_n_accepted", "passes", "passes_source",
               "acceptance_rate", "accept_length", "mat", "tokens_per_pass", "prompt_tps", "decode_tps",
               "end_to_end_ms", "reported_acceptance_rate", "reported_accept_length"]

# (label, Summary attribute, format)
SUMMARY_ROWS: list[tuple[str, str, str]] = [
    ("acceptance rate (A/G)", "acceptance_rate", ".3f"),
    ("accept length (1 + A/V)", "accept_length", ".2f"),
    ("MAT (A/V)", "mat", ".2f"),
    ("tokens per pass (N/V)", "tokens_per_pass", ".2f"),
    ("decode tok/s", "decode_tps", ".1f"),
    ("prompt tok/s", "prompt_tps", ".1f"),
]


@click.command(name="timings")
@click.argument("file", required=False, metavar="[FILE|-]")
@click.option("--json", "as_json", is_flag=True, help="Print records and summary as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print one CSV row per request.")
@click.option("--format", "fmt", type=click.Choice(tm.FORMATS), default="auto", show_default=True,
              help="Force the input kind instead of detecting it.")
@click.option("--log", "log_file", default=None, metavar="LOG",
              help="The server log (or /metrics scrapes) of the same run: exact verify passes for "
                   "the responses in FILE, matched in order.")
@click.option("--lenient", is_flag=True, help="Skip unreadable records and report how many.")
@click.option("--follow", is_flag=True,
              help="FILE is a running llama-server's log: every --every seconds in which requests finished "
                   "or ran, one line of what finished (--json: one JSON line), until interrupted.")
@click.option("--every", type=NumberRange(0, min_open=True), default=10.0, show_default=True,
              help="With --follow: seconds between lines.")
def command(file, as_json, as_csv, fmt, log_file, lenient, follow, every):
    """Read speculative-decoding timings from llama-server responses (JSON, JSON Lines, SSE),
    logs, /metrics text or SGLang responses, and report acceptance rate, accept length (bonus
    token included), MAT, tokens per pass, speeds and end-to-end time, per request and as
    request-mean and token-weighted aggregates. FILE '-' (the default when stdin is not a
    terminal) reads stdin.
    """
    if as_json and as_csv:
        raise click.UsageError("--json and --csv exclude each other")
    if follow:
        _follow(file, every, as_json=as_json, refused=[n for n, v in (("--csv", as_csv), ("--log", log_file),
                                                                      ("--format", fmt != "auto")) if v])
        return
    if file is None:
        if sys.stdin is None or sys.stdin.isatty():  # nothing piped in: reading would wait silently
            raise click.UsageError("no FILE given and stdin is a terminal: give a FILE, or pipe the "
                                   "input in (FILE '-' reads stdin)")
        file = "-"
    if file == "-":
        records = tm.parse(sys.stdin.buffer.read(), format=fmt, lenient=lenient, name="<stdin>")
    else:
        records = tm.parse(Path(file), format=fmt, lenient=lenient)
    skipped = records.skipped
    if log_file:
        log_records = tm.parse(Path(log_file), lenient=lenient, allow_plain=True)
        if log_records.format not in ("log", "metrics"):
            raise click.UsageError(f"--log wants a llama-server log or /metrics scrapes; {log_file} "
                                   f"looks like {log_records.format}")
        skipped = skipped + log_records.skipped
        records = tm.Records(tm.join(records, log_records), format=records.format, name=records.name,
                             skipped=skipped)
    summary = tm.summarize(records)
    if as_json:
        echo_json({"input": records.name, "format": records.format,
                   "records": [r.to_dict() for r in records], "summary": summary.to_dict(),
                   "skipped": [{"where": s.where, "reason": s.reason} for s in skipped],
                   "formulas": {k: f for k, (f, _) in tm.METRICS.items()}})
    elif as_csv:
        click.echo(render_csv(records), nl=False)
    else:
        click.echo("\n".join(render_table(records, summary)))
    if skipped:
        click.echo(f"ggufdspark: skipped {len(skipped)} unreadable record(s); first: {skipped[0].reason}",
                   err=True)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _label(r: tm.RequestTimings) -> str:
    where = r.where or "?"
    label = Path(where.split(":")[0]).name + (where[len(where.split(":")[0]):] if ":" in where else "")
    if r.task_id is not None:
        label += f" (task {r.task_id})"
    return label


def _passes(r: tm.RequestTimings) -> str:
    if r.passes is None:
        return "-"
    return f"~{r.passes} est" if r.passes_estimated else f"{r.passes} {r.passes_source}"


def render_table(records: list[tm.RequestTimings], summary: tm.Summary) -> list[str]:
    """Per-request rows, then the aggregates (request mean and token-weighted)."""
    heads = ["#", "request", "kind"] + [h for h, _, _ in TABLE_COLUMNS[:5]] + ["passes"] + \
            [h for h, _, _ in TABLE_COLUMNS[5:]]
    rows = []
    for i, r in enumerate(records, 1):
        cells = [_fmt(getattr(r, a), f) for _, a, f in TABLE_COLUMNS]
        rows.append([str(i), _label(r), r.kind or r.source] + cells[:5] + [_passes(r)] + cells[5:])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)]
    left = {1, 2}

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(heads)] + [line(row) for row in rows]
    s = summary
    sources = ", ".join(f"{n} {src}" for src, n in sorted(s.passes_sources.items()))
    out += ["", f"{s.n_requests} request(s), {s.n_drafted} drafted"
                + (f"; passes: {sources}" if sources else "")
                + (f"; {s.skipped} skipped" if s.skipped else "")]
    out.append(f"{'':<26}{'request-mean':>14}{'token-weighted':>16}")
    for label, attr, spec in SUMMARY_ROWS:
        m: tm.Mean = getattr(s, attr)
        out.append(f"{label:<26}{_fmt(m.request_mean, spec):>14}{_fmt(m.token_weighted, spec):>16}")
    total = f"   (total {s.e2e_ms_total:.1f})" if s.e2e_ms_total is not None else ""
    out.append(f"{'end-to-end ms':<26}{_fmt(s.e2e_ms.request_mean, '.1f'):>14}{total}")
    out.append("AL = 1 + accepted/passes (bonus token included); MAT = AL - 1; ~ est: passes estimated "
               "as N - A - 1 (exact ones come from a log, /metrics or SGLang)")
    return out


def render_csv(records: list[tm.RequestTimings]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: ("" if v is None else v) for k, v in r.to_dict().items()})
    return buf.getvalue()


def _follow(file: str | None, every: float, *, as_json: bool, refused: list[str]) -> None:
    """``timings --follow LOG``: what a running llama-server finishes, an interval a line."""
    if refused:
        raise click.UsageError(f"--follow reads a llama-server log as it grows; {', '.join(refused)} "
                               + ("does" if len(refused) == 1 else "do") + " not apply to it")
    if not file or file == "-":
        raise click.UsageError("--follow needs the log's path as FILE (llama-server --log-file PATH, or its "
                               "stderr redirected to a file)")
    if not Path(file).is_file():
        raise InputNotFoundError(f"{file}: log not found")
    window = LogWindow(file)
    # ended by Ctrl-C, kill (SIGTERM) or a closed terminal (SIGHUP) alike, from the moment it says it
    # follows: a follower left behind by a script or a test run would otherwise poll on for ever
    try:
        with stop_signals_interrupt():
            click.echo(f"following {file}: a line every {every:g} s in which requests finished or ran "
                       "(Ctrl-C ends)", err=True)
            while True:
                time.sleep(every)
                st = window.take()
                if st.active:
                    click.echo(json.dumps(finite_json(st.to_dict())) if as_json else stats_line(st))
                    sys.stdout.flush()
                if window.gone:
                    raise InputNotFoundError(f"{file}: the log is gone (deleted or moved away); "
                                             "stopped following")
    except KeyboardInterrupt:  # Ctrl-C, or interrupts.Terminated
        pass
