"""``ggufdspark convert-target TARGET``: LFM2 / LFM2-VL checkpoint -> GGUF (arch lfm2), plus the
mmproj (vision encoder + projector) for LFM2-VL."""

from __future__ import annotations

import click

from ggufdspark.cli._common import ProgressLine, echo_json
from ggufdspark.cli.convert import outtype_option, report
from ggufdspark.convert.target import convert_target
from ggufdspark.interrupts import stop_signals_interrupt


@click.command(name="convert-target")
@click.argument("target")
@click.option("-o", "--output", type=click.Path(), help="Output file or directory (default: <name>-<TYPE>.gguf).")
@outtype_option()
@click.option("--mmproj/--no-mmproj", default=True, show_default=True,
              help="For LFM2-VL: also write the vision encoder + projector.")
@click.option("--mmproj-output", type=click.Path(),
              help="mmproj file or directory (default: mmproj-<name>-<TYPE>.gguf beside the language model).")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(target, output, outtype, mmproj, mmproj_output, force, as_json):
    """Convert an LFM2 / LFM2-VL target checkpoint (directory or Hub repo id) to GGUF."""
    with stop_signals_interrupt():  # SIGTERM / SIGHUP: the half-written .part removed, as on Ctrl-C
        r = convert_target(target, output=output, outtype=outtype, force=force,
                           progress=ProgressLine("convert", unit="B"), mmproj=mmproj, mmproj_output=mmproj_output)
    if as_json:
        m = r.mmproj
        echo_json({"path": str(r.path), "sha256": r.sha256, "tensors": r.n_tensors, "bytes": r.nbytes,
                   "seconds": round(r.seconds, 3), "outtype": r.outtype, "notes": r.notes,
                   "mmproj": None if m is None else {"path": str(m.path), "sha256": m.sha256, "tensors": m.n_tensors,
                                                     "bytes": m.nbytes, "seconds": round(m.seconds, 3)}})
        return
    report(r, False)
    if r.mmproj is not None:
        report(r.mmproj, False)
