"""``ggufdspark check TARGET.gguf DRAFT.gguf [--mmproj M.gguf]``."""

from __future__ import annotations

import sys

import click

from ggufdspark.check import check_pair
from ggufdspark.cli._common import echo_json, safe_text
from ggufdspark.errors import GgufdsparkError


@click.command(name="check")
@click.argument("target", type=click.Path(dir_okay=False))
@click.argument("draft", type=click.Path(dir_okay=False), required=False)
@click.option("--mmproj", type=click.Path(dir_okay=False), help="Also check a vision projector against the target.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(target, draft, mmproj, as_json):
    """Check that DRAFT (and/or --mmproj) belongs with TARGET. Exit 0 only when every check passes."""
    if draft is None and mmproj is None:
        raise click.UsageError("give a DRAFT, --mmproj, or both")
    try:
        report = check_pair(target, draft, mmproj)
    except GgufdsparkError as e:
        if as_json:  # a script reading stdout still gets JSON; the error line goes to stderr as usual
            echo_json({"target": target, "draft": draft, "mmproj": mmproj, "ok": False, "error": str(e),
                       "checks": []})
        raise
    if as_json:
        echo_json(report.to_dict())
    else:
        for c in report.checks:
            click.echo(safe_text(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}", keep=""))
        n_bad = len(report.failures())
        click.echo(f"pair OK ({report.pair_label()})" if report.ok
                   else f"pair REFUSED: {n_bad} check(s) failed ({report.pair_label()})")
    sys.exit(0 if report.ok else 1)
