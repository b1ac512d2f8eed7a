"""``ggufdspark check [TARGET.gguf] [DRAFT.gguf] [-m TARGET.gguf] [-md DRAFT.gguf] [--mmproj M.gguf]``."""

from __future__ import annotations

import sys

import click

from ggufdspark.check import check_pair
from ggufdspark.cli._common import draft_option, echo_json, from_hub, mmproj_option, safe_text, target_option
from ggufdspark.errors import GgufdsparkError


@click.command(name="check")
@click.argument("paths", nargs=-1, metavar="[TARGET] [DRAFT]", type=click.Path(dir_okay=False))
@target_option(hub_aliases=True)
@draft_option(hub_aliases=True)
@mmproj_option("Also check a vision projector against the target.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(paths, model, draft, mmproj, as_json):
    """Check that DRAFT (and/or --mmproj) belongs with TARGET. Exit 0 only when every check passes.

    The files are named as serve, bench and tune name them (-m/--target, -md/--draft), or by
    position: TARGET then DRAFT, filling whichever of the two the options did not give. Each may be
    a Hub reference ORG/NAME[:QUANT] (-hf/-hfd as in llama-server): it is downloaded first, and a
    target's repo also gives the mmproj and the dspark- draft it holds, as serve would take them.
    """
    target, draft = pair_from(paths, model, draft)
    if target is None:
        raise click.UsageError("give a TARGET (or -m/--target)")
    target, draft, mmproj = from_hub(target, draft, mmproj, find_mmproj=True, find_draft=True)
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
        if report.ok and (note := report.draft_precision_note()):
            click.echo(f"note: {note}")
    sys.exit(0 if report.ok else 1)


def pair_from(paths: tuple[str, ...], target: str | None, draft: str | None) -> tuple[str | None, str | None]:
    """(target, draft) from the options, then the positional PATHS in order for the roles left open.

    Raises:
        click.UsageError: more positional files than open roles (the extra ones are named).
    """
    open_roles = [role for role, given in (("target", target), ("draft", draft)) if given is None]
    if len(paths) > len(open_roles):
        raise click.UsageError(f"unexpected file(s) {', '.join(paths[len(open_roles):])}: "
                               f"the target and the draft are already given")
    roles = {"target": target, "draft": draft, **dict(zip(open_roles, paths))}
    return roles["target"], roles["draft"]
