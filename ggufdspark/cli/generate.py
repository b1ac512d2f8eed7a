"""``ggufdspark generate``: synthetic checkpoints for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import click

from ggufdspark.errors import InvalidArgumentError, OutputExistsError
from ggufdspark.families import DEFAULT_FAMILY, FAMILIES
from ggufdspark.synthetic import synth


@click.command(name="generate")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--family", type=click.Choice(list(FAMILIES)), default=DEFAULT_FAMILY, show_default=True,
              help="Which published pair to imitate: LFM2.5-1.2B-Instruct, LFM2.5-2.6B, LFM2.5-8B-A1B (MoE) "
                   "or LFM2.5-VL-3B (its language tower; --vl adds the vision part).")
@click.option("--size", type=click.Choice(["small", "full"]), default="small", show_default=True,
              help="small: a tiny test pair of the family's layout; full: the family's published shapes "
                   "(see docs/families.md; vl-3b: 2.4B target, 279.5M drafter; 8b-a1b: 8.3B target).")
@click.option("--only", type=click.Choice(["both", "target", "drafter"]), default="both", show_default=True,
              help="What to write; a drafter alone still needs OUT/target (made first when missing).")
@click.option("--dtype", type=click.Choice(["BF16", "F16", "F32"]), default="BF16", show_default=True,
              help="Type of the safetensors weights written.")
@click.option("--vl", is_flag=True, help="Make the target an LFM2-VL checkpoint (vision tower + projector); "
                                         "--family vl-3b only.")
@click.option("--force", is_flag=True, help="Write into a non-empty directory.")
def command(out, family, size, only, dtype, vl, force):
    """Generate a random LFM2 / LFM2-MoE target and/or its DSpark drafter (Hub layout) under OUT.
    Needs the 'generate' extra: pip install 'ggufdspark[generate]'."""
    fam = FAMILIES[family]
    if vl and not fam.vl:
        raise InvalidArgumentError(f"--vl: the {family} family ({fam.model}) is a text model; "
                                   f"only --family vl-3b has a vision part")
    synth.require_dependencies()  # before anything is written: no half-made OUT to clean up
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not force:
        raise OutputExistsError(f"{out}: directory is not empty (use --force)")
    tspec, dspec = fam.targets[size], fam.drafters[size]
    what = f"{fam.title}-shaped{' LFM2-VL' if vl else ''}{' LFM2-MoE' if fam.moe else ''}"
    tdir = out / "target"
    if only in ("both", "target"):
        click.echo(f"generating {what} target ({size}) in {tdir}", err=True)
        if vl:
            from ggufdspark.synthetic import synth_vl

            vision = synth_vl.SO400M_VISION if size == "full" else synth_vl.SMALL_VISION
            synth_vl.make_vl_target(tdir, tspec, vision, dtype=dtype)
        else:
            synth.make_target(tdir, tspec, dtype=dtype)
    elif not (tdir / "config.json").is_file():
        # a drafter is made for a target: write the target it needs first
        click.echo(f"no target in {tdir}: generating one ({fam.title}, {size}) for the drafter", err=True)
        synth.make_target(tdir, tspec, dtype=dtype)
    if only in ("both", "drafter"):
        click.echo(f"generating {fam.title} drafter ({size}) in {out / 'drafter'}", err=True)
        synth.make_drafter(out / "drafter", tdir, dspec, dtype=dtype)
    click.echo(out)
