"""``ggufdspark publish -m T.gguf -md D.gguf --repo ORG/NAME [--mmproj M.gguf] ...`` (``-m`` / ``-md``
are ``--target`` / ``--draft``, as in llama-server and the other verbs)."""

from __future__ import annotations

import logging
import sys

import click

from ggufdspark.cli._common import echo_json
from ggufdspark.publish import PublishPlan, human_size, publish

ACTIONS = {"upload": "upload", "skip": "skip  "}


def print_plan(plan: PublishPlan) -> None:
    """The plan on stdout: repos, files (size, sha256, upload or skip), warnings, commands, cards."""
    if plan.dry_run:
        click.echo(f"Plan (dry run: nothing is sent to {plan.endpoint}; files are not compared with the Hub)")
    else:
        click.echo(f"Plan for {plan.endpoint}")
    for rp in plan.repos:
        state = ("not checked" if rp.exists is None else f"exists at {rp.head[:12]}" if rp.exists
                 else "new")
        click.echo(f"\n{rp.repo_id}  ({state}, {'private' if rp.private else 'public'})")
        width = max(len(f.path_in_repo) for f in rp.files)
        for f in rp.files:
            what = f"{f.role} {f.quant}" if f.quant else f.role
            note = "  (same sha256 on the Hub)" if f.action == "skip" else ""
            click.echo(f"  {ACTIONS[f.action]}  {f.path_in_repo:<{width}}  {human_size(f.size):>9}  "
                       f"sha256 {f.sha256}  {what}{note}")
        for w in rp.warnings:
            click.secho(f"  WARNING: {w}", fg="yellow")
    click.echo("\nRun:")
    for quant, lines in plan.quant_commands.items():
        if len(plan.quant_commands) > 1:
            click.echo(f"  {quant} (draft {plan.pairing[quant]}):")
        for backend, line in lines.items():
            click.echo(f"  {backend}: {line}")
    for rp in plan.repos:
        click.echo(f"\n----- {rp.repo_id}/README.md -----")
        click.echo(rp.card, nl=False)
    click.echo("-----")


@click.command(name="publish")
@click.option("-m", "--target", "target", required=True, multiple=True, type=click.Path(dir_okay=False),
              help="A target GGUF; repeat for several quants (one file each).")
@click.option("-md", "--draft", "draft", required=True, multiple=True, type=click.Path(dir_okay=False),
              help="A DSpark draft GGUF; repeat for several quants.")
@click.option("--pair", "pairs", multiple=True, metavar="TQUANT=DQUANT",
              help="The draft quant for a target quant (default: the only draft, else the same quant, "
                   "else the draft with the most bits).")
@click.option("--mmproj", type=click.Path(dir_okay=False), help="The target's vision projector GGUF.")
@click.option("--repo", required=True, metavar="ORG/NAME",
              help="Target and mmproj go to ORG/NAME-GGUF, the draft to ORG/NAME-DSpark-GGUF.")
@click.option("--draft-repo", metavar="ORG/NAME", help="Put the draft here instead.")
@click.option("--single-repo", is_flag=True, help="Put the draft in ORG/NAME-GGUF too.")
@click.option("--private", is_flag=True, help="Create new repos private.")
@click.option("--dry-run", is_flag=True, help="Print the plan and the cards; send nothing.")
@click.option("--results", multiple=True, type=click.Path(dir_okay=False),
              help="A bench or tune JSON to show in the cards (repeatable).")
@click.option("--base-model", metavar="ORG/NAME", help="Hub id of the source target (card metadata).")
@click.option("--draft-base-model", metavar="ORG/NAME", help="Hub id of the source drafter (card metadata).")
@click.option("--license", "license_", metavar="ID", help="Card license (default: the target GGUF's general.license).")
@click.option("--message", help="Commit message (default: Upload FILES (ggufdspark publish)).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the result as JSON.")
def command(target, draft, pairs, mmproj, repo, draft_repo, single_repo, private, dry_run, results, base_model,
            draft_base_model, license_, message, as_json):
    """Publish a checked GGUF pair to the Hugging Face Hub, named for llama-server -hf / -hfd.

    The token comes from huggingface_hub (HF_TOKEN or 'hf auth login'), the endpoint from
    HF_ENDPOINT. The plan is printed before anything is written; files whose sha256 already
    matches on the Hub are skipped.
    """
    pairing = {}
    for item in pairs:
        tq, sep, dq = item.partition("=")
        if not sep or not tq.strip() or not dq.strip():
            raise click.BadParameter(f"{item!r}: expected TQUANT=DQUANT, e.g. Q4_K_M=Q8_0", param_hint="--pair")
        pairing[tq.strip()] = dq.strip()
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    if not sys.stderr.isatty() or logging.getLogger().getEffectiveLevel() > logging.INFO:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # redrawn bars make a mess of logs and captured output
    result = publish(target, draft, repo=repo, mmproj=mmproj, draft_repo=draft_repo, single_repo=single_repo,
                     private=private, dry_run=dry_run, results=results, base_model=base_model,
                     draft_base_model=draft_base_model, license=license_, message=message,
                     on_plan=None if as_json else print_plan, pairs=pairing)
    if as_json:
        echo_json(result.to_dict())
        return
    if dry_run:
        click.echo("dry run: nothing was sent")
        return
    for repo_id, url in result.commits.items():
        click.echo(f"committed {repo_id}: {url}" if url else f"{repo_id}: up to date, nothing uploaded")
