"""``ggufdspark inspect FILE.gguf``."""

from __future__ import annotations

import click

from ggufdspark.cli._common import echo_json
from ggufdspark.inspect import inspect_gguf


@click.command(name="inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(path, as_json):
    """Describe a GGUF file (arch, tensors, key metadata) from its header."""
    s = inspect_gguf(path)
    if as_json:
        echo_json(s.to_dict())
        return
    click.echo(f"{s.path}")
    click.echo(f"  kind       {s.kind} (arch {s.arch})")
    click.echo(f"  name       {s.name}")
    click.echo(f"  size       {s.file_size / 1e6:.1f} MB, {s.n_tensors} tensors: "
               + ", ".join(f"{n} {t}" for t, n in s.tensor_types.items()))
    for k, v in s.details.items():
        click.echo(f"  {k:<18} {v}")
