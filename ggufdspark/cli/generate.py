"""``ggufdspark generate``: synthetic checkpoints for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import click

from ggufdspark.errors import OutputExistsError
from ggufdspark.testing import synth


@click.command(name="generate")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--size", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="small: tiny test pair; full: the published shapes (2.4B target, 279.5M drafter).")
@click.option("--only", type=click.Choice(["both", "target", "drafter"]), default="both", show_default=True)
@click.option("--dtype", type=click.Choice(["BF16", "F16", "F32"]), default="BF16", show_default=True)
@click.option("--vl", is_flag=True, help="Make the target an LFM2-VL checkpoint (vision tower + projector).")
@click.option("--force", is_flag=True, help="Write into a non-empty directory.")
def command(out, size, only, dtype, vl, force):
    """Generate a random LFM2 target and/or its DSpark drafter (Hub layout) under OUT.
    Needs the 'generate' extra: pip install 'ggufdspark[generate]'."""
    synth.require_dependencies()  # before anything is written: no half-made OUT to clean up
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"{out}: directory is not empty (use --force)")
    tspec = synth.FULL_TARGET if size == "full" else synth.SMALL_TARGET
    dspec = synth.FULL_DRAFTER if size == "full" else synth.SMALL_DRAFTER
    tdir = out / "target"
    if only in ("both", "target"):
        click.echo(f"generating {'LFM2-VL ' if vl else ''}target ({size}) in {tdir}", err=True)
        if vl:
            from ggufdspark.testing import synth_vl

            vision = synth_vl.SO400M_VISION if size == "full" else synth_vl.SMALL_VISION
            synth_vl.make_vl_target(tdir, tspec, vision, dtype=dtype)
        else:
            synth.make_target(tdir, tspec, dtype=dtype)
    elif not (tdir / "config.json").is_file():
        # a drafter is made for a target: write the target it needs first
        click.echo(f"no target in {tdir}: generating one ({size}) for the drafter", err=True)
        synth.make_target(tdir, tspec, dtype=dtype)
    if only in ("both", "drafter"):
        click.echo(f"generating drafter ({size}) in {out / 'drafter'}", err=True)
        synth.make_drafter(out / "drafter", tdir, dspec, dtype=dtype)
    click.echo(out)
