"""``ggufdspark inspect FILE.gguf``."""

from __future__ import annotations

import click

from ggufdspark.cli._common import echo_json, hub_file, safe_text
from ggufdspark.errors import GgufdsparkError
from ggufdspark.inspect import inspect_gguf


@click.command(name="inspect")
@click.argument("path", metavar="FILE|ORG/NAME[:QUANT]", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(path, as_json):
    """Describe a GGUF file (arch, tensors, key metadata) from its header.

    A Hub reference ORG/NAME[:QUANT] is downloaded first: its model file, else its dspark- draft."""
    try:
        s = inspect_gguf(hub_file(path))
    except GgufdsparkError as e:
        if as_json:  # as 'check --json' does: a script reading stdout still gets JSON; the line goes to stderr
            echo_json({"path": path, "ok": False, "error": str(e)})
        raise
    if as_json:
        echo_json(s.to_dict())  # JSON escapes control characters itself
        return
    # every string below may come from the file: escaped, so a crafted one cannot drive the terminal
    out = lambda line: click.echo(safe_text(line, keep=""))  # noqa: E731
    out(f"{s.path}")
    out(f"  kind       {s.kind} (arch {s.arch})")
    out(f"  name       {s.name}")
    out(f"  size       {s.file_size / 1e6:.1f} MB, {s.n_tensors} tensors: "
        + ", ".join(f"{n} {t}" for t, n in s.tensor_types.items()))
    for k, v in s.details.items():
        out(f"  {k:<18} {v}")
