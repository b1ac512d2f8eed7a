"""``ggufdspark quantize IN.gguf --type TYPE [-o OUT.gguf] [--imatrix FILE] [--force]``."""

from __future__ import annotations

import click

from ggufdspark.cli._common import ProgressLine, echo_json, hub_file
from ggufdspark.quantize import quantize
from ggufdspark.interrupts import stop_signals_interrupt


@click.command(name="quantize")
@click.argument("source", metavar="SOURCE", type=click.Path(dir_okay=False))
@click.option("--type", "-t", "qtype", required=True, metavar="TYPE",
              help="Q4_K_M, Q5_K_M, Q6_K, Q8_0, ... (a DSpark draft: 4 bits or more, no importance matrix).")
@click.option("-o", "--output", type=click.Path(), help="Output file or directory (default: NAME-TYPE.gguf, "
              "dspark-NAME-TYPE.gguf for a draft, beside the input; here for a Hub reference).")
@click.option("--imatrix", type=click.Path(dir_okay=False), help="Importance matrix for a target (llama-imatrix).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--server", type=click.Path(dir_okay=False), help="Use the llama-quantize beside this llama-server.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(source, qtype, output, imatrix, force, server, as_json):
    """Quantize a float GGUF target or DSpark draft with the pinned engine's llama-quantize.

    A draft's Markov head stays in its float type; norms and the confidence head are never
    quantized. The output is renamed into place only once complete and checked. SOURCE may be a
    Hub reference ORG/NAME[:QUANT] (downloaded first; the output then goes to this directory).
    """
    local = hub_file(source)
    if local != source and output is None:
        output = "."  # never into the Hugging Face cache's snapshot
    source = local
    with stop_signals_interrupt():  # SIGTERM / SIGHUP: llama-quantize stopped, the .partial removed
        r = quantize(source, qtype, output=output, imatrix=imatrix, force=force, server=server,
                     progress=ProgressLine("quantize"))
    if as_json:
        echo_json(r.to_dict())
        return
    kept = f"; kept {', '.join(f'{t} {ty}' for t, ty in r.kept_float.items())}" if r.kept_float else ""
    click.echo(f"wrote {r.path} ({r.kind} {r.source_type} -> {r.type}, {r.nbytes / 1e6:.1f} MB, "
               f"{r.seconds:.1f}s{kept})")
    click.echo(f"sha256 {r.sha256}")
