"""``ggufdspark convert DRAFTER --target TARGET``: safetensors DSpark drafter -> GGUF draft."""

from __future__ import annotations

import click

from ggufdspark.cli._common import ProgressLine, echo_json
from ggufdspark.convert.common import OUTTYPES
from ggufdspark.convert.drafter import convert_drafter
from ggufdspark.interrupts import stop_signals_interrupt



def outtype_option():
    """``--outtype``: the GGUF's tensor type, the same choice for the draft and the target."""
    return click.option("--outtype", type=click.Choice(OUTTYPES), default="f16", show_default=True,
                        help="Type of the weight tensors written (norms and biases stay F32; q8_0 falls back to "
                             "F16 for rows not a multiple of 32).")


@click.command(name="convert")
@click.argument("drafter")
@click.option("--target", "-t", required=True, help="The target: its GGUF, Hub directory or repo id (tokenizer and shape).")
@click.option("-o", "--output", type=click.Path(), help="Output file or directory (default: dspark-<model>-<TYPE>.gguf).")
@outtype_option()
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(drafter, target, output, outtype, force, as_json):
    """Convert the safetensors DSpark DRAFTER (directory or Hub repo id) to a GGUF draft."""
    with stop_signals_interrupt():  # SIGTERM / SIGHUP: the half-written .part removed, as on Ctrl-C
        r = convert_drafter(drafter, target, output=output, outtype=outtype, force=force,
                            progress=ProgressLine("convert", unit="B"))
    report(r, as_json)


def report(r, as_json: bool) -> None:
    if as_json:
        echo_json({"path": str(r.path), "sha256": r.sha256, "tensors": r.n_tensors, "bytes": r.nbytes,
                   "seconds": round(r.seconds, 3), "outtype": r.outtype, "notes": r.notes})
        return
    for note in r.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {r.path} ({r.n_tensors} tensors, {r.nbytes / 1e6:.1f} MB, {r.outtype}, {r.seconds:.1f}s)")
    click.echo(f"sha256 {r.sha256}")
