"""``ggufdspark doctor``: report the engine, its DSpark support, devices and bindings."""

from __future__ import annotations

import click

from ggufdspark.cli._common import echo_json, echo_warning
from ggufdspark.doctor import DoctorReport, doctor
from ggufdspark.errors import EngineError


@click.command(name="doctor")
@click.option("--server", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="llama-server to examine (default: $GGUFDSPARK_SERVER, the cached build, PATH).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def command(server, as_json):
    """Check the engine the other verbs would use: DSpark support, devices, python bindings.

    Exits 1 with one line on stderr when there is no usable engine; --json still prints the
    report (with "ok": false) on stdout first.
    """
    report = doctor(server)
    if as_json:
        echo_json(report.to_dict())
    elif report.engine is not None:
        click.echo("\n".join(render(report)))
        for w in report.warnings:
            echo_warning(w, err=False)  # part of the report: on stdout, before its status line
        click.echo("status:       " + ("ok" if report.ok else "UNUSABLE"))
    if not report.ok:
        raise EngineError(report.problems[0] if report.problems else "engine unusable")


def render(report: DoctorReport) -> list[str]:
    """The report as aligned text lines (engine found), up to its warnings and status line."""
    info = report.engine
    assert info is not None
    rows = [
        ("engine", f"{info.path} (from {info.source})"),
        ("version", f"{info.version or '?'} (commit {info.commit or '?'}; pinned {report.pinned_commit})"),
        ("draft-dspark", "yes" if info.dspark else "NO"),
        ("spec types", ", ".join(info.spec_types) or "?"),
        ("backend", report.backend or "unknown"),
        ("patches", f"{len(info.patches)} ({', '.join(p[:4] for p in info.patches)}; docs/engine-patches.md)"
                    if info.patches else "none (the pinned tree as is, or not a ggufdspark build)"),
    ]
    rows.append(("chat UI", report.ui_note if report.ui else f"none: {report.ui_note}"))
    rows.append(("hub", report.hub))
    rows += _device_rows(report)
    rows.append(("bindings", _bindings_text(report)))
    rows.append(("cache", report.cache_dir))
    return [f"{k + ':' if k else '':<14}{v}" for k, v in rows]


def _device_rows(report: DoctorReport) -> list[tuple[str, str]]:
    dev = report.devices
    if dev is None or dev.source == "none":
        return [("devices", "unknown")]
    rows = [("devices", f"{len(dev.devices)} (from {dev.source})")]
    for d in dev.devices:
        rows.append(("", f"{d.name} [{d.type}] {d.description}, "
                         f"{_gib(d.memory_free)} free of {_gib(d.memory_total)}"))
    rows += [("", f"note: {e}") for e in dev.errors]
    return rows


def _bindings_text(report: DoctorReport) -> str:
    b = report.bindings
    if b is None:
        return "not checked"
    if b.loaded:
        return f"llama-cpp-python {b.version}, loaded {b.lib_path}"
    if not b.importable:
        return "llama-cpp-python not installed"
    return f"llama-cpp-python {b.version}, NOT loaded against this build"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
