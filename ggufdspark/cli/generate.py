"""``ggufdspark generate``: synthetic checkpoints for tests and benchmarks."""

from __future__ import annotations

import click

from ggufdspark.cli._common import echo_json
from ggufdspark.families import DEFAULT_FAMILY, FAMILIES, SIZES
from ggufdspark.generate import DTYPES, ONLY, generate, generate_trained
from ggufdspark.interrupts import stop_signals_interrupt


@click.command(name="generate")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--family", type=click.Choice(list(FAMILIES)), default=DEFAULT_FAMILY, show_default=True,
              help="Which published pair to imitate: LFM2.5-1.2B-Instruct, LFM2.5-2.6B, LFM2.5-8B-A1B (MoE) "
                   "or LFM2.5-VL-3B (its language tower; --vl adds the vision part).")
@click.option("--size", type=click.Choice(list(SIZES)), default="small", show_default=True,
              help="small: a tiny test pair of the family's layout; full: the family's published shapes "
                   "(see docs/families.md; vl-3b: 2.4B target, 279.5M drafter; 8b-a1b: 8.3B target).")
@click.option("--only", type=click.Choice(list(ONLY)), default="both", show_default=True,
              help="What to write; a drafter alone still needs OUT/target (made first when missing).")
@click.option("--dtype", type=click.Choice(list(DTYPES)), default="BF16", show_default=True,
              help="Type of the safetensors weights written.")
@click.option("--vl", is_flag=True, help="Make the target an LFM2-VL checkpoint (vision tower + projector); "
                                         "--family vl-3b only.")
@click.option("--trained", is_flag=True,
              help="Write the trained pair that ships with ggufdspark instead of random weights: a small LFM2 "
                   "target trained on the Python standard library and its DSpark drafter, which really predicts "
                   "(docs/trained.md; --family, --size, --only, --dtype and --vl do not apply).")
@click.option("--force", is_flag=True, help="Write into a non-empty directory.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON: family, directories, files, sizes.")
def command(out, family, size, only, dtype, vl, trained, force, as_json):
    """Generate a random LFM2 / LFM2-MoE target and/or its DSpark drafter (Hub layout) under OUT,
    or (--trained) write the trained pair. Random pairs need the 'generate' extra:
    pip install 'ggufdspark[generate]'."""
    if trained:
        ctx = click.get_current_context()
        given = [f"--{name.replace('_', '-')}" for name in ("family", "size", "only", "dtype", "vl")
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"--trained writes the shipped pair as it is: {', '.join(given)} do not apply")
    with stop_signals_interrupt():  # SIGTERM / SIGHUP: what this run wrote removed, as on Ctrl-C
        if trained:
            r = generate_trained(out, force=force, on_step=lambda msg: click.echo(msg, err=True))
        else:
            r = generate(out, family=family, size=size, only=only, dtype=dtype, vl=vl, force=force,
                         on_step=lambda msg: click.echo(msg, err=True))
    if as_json:
        echo_json(r.to_dict())
    else:
        click.echo(r.out)
