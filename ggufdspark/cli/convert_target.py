"""``ggufdspark convert-target TARGET``: LFM2 / LFM2-VL checkpoint -> GGUF (arch lfm2)."""

from __future__ import annotations

import click

from ggufdspark.cli._common import ProgressLine
from ggufdspark.cli.convert import _report
from ggufdspark.convert.common import OUTTYPES
from ggufdspark.convert.target import convert_target


@click.command(name="convert-target")
@click.argument("target")
@click.option("-o", "--output", type=click.Path(), help="Output file or directory (default: <name>-<TYPE>.gguf).")
@click.option("--outtype", type=click.Choice(OUTTYPES), default="f16", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(target, output, outtype, force, as_json):
    """Convert an LFM2 target checkpoint (directory or Hub repo id) to GGUF."""
    r = convert_target(target, output=output, outtype=outtype, force=force, progress=ProgressLine("convert"))
    _report(r, as_json)
