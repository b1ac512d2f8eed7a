"""``ggufdspark build-engine``: fetch, verify and build the pinned llama.cpp (cached)."""

from __future__ import annotations

import os
from dataclasses import asdict

import click

from ggufdspark import engine, webui
from ggufdspark.cli._common import ProgressLine, echo_json


@click.command(name="build-engine")
@click.option("--cuda", is_flag=True, help="Build with the CUDA backend.")
@click.option("--metal", is_flag=True, help="Build with the Metal backend.")
@click.option("--cpu", is_flag=True, help="CPU only (the default).")
@click.option("--cmake-flag", "extra", multiple=True, metavar="-DNAME=VALUE", help="Extra CMake flag (part of the cache key).")
@click.option("-j", "--jobs", type=click.IntRange(1), default=None, help="Parallel compile jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even if a finished build is cached (the chat UI too).")
@click.option("--no-patches", is_flag=True, help="Build the pinned tree without the project's patch series.")
@click.option("--dev", is_flag=True,
              help="Also apply the developer series (profiling, perf cases; ggufdspark/data/patches-dev): a separate build.")
@click.option("--print-path", is_flag=True, help="Print only the llama-server path on stdout.")
@click.option("--with-tools", is_flag=True, help="Also build llama-quantize (for quantize), llama-bench and llama-batched-bench.")
@click.option("--no-ui", is_flag=True, help="Do not build the chat UI (serve then has no chat page).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON: path, backend, cache key, patches, built or reused, the chat UI.")
def command(cuda, metal, cpu, extra, jobs, force, no_patches, dev, print_path, with_tools, no_ui, as_json):
    """Fetch llama-cpp-python==0.3.36's vendored llama.cpp (sha256-checked) and build llama-server.

    The backend defaults to $GGML_CUDA / $GGML_METAL when set to 1/ON, else CPU. A second build of
    the same engine waits for the first; a cached build that does not run is rebuilt.

    Then the chat UI, from the same tree's sources with npm (when node and npm are there), cached
    apart from the engine in <cache>/ui/<commit>; one line says whether it was built, found or skipped.
    """
    if print_path and as_json:
        raise click.UsageError("--print-path and --json: choose one (the JSON has the path)")
    chosen = [name for name, on in (("cuda", cuda), ("metal", metal), ("cpu", cpu)) if on]
    if len(chosen) > 1:
        raise click.UsageError(f"choose one backend: {' and '.join('--' + b for b in chosen)} were given")
    backend = chosen[0] if chosen else None
    if backend is None:
        on = lambda v: os.environ.get(v, "").upper() in ("1", "ON", "TRUE", "YES")  # noqa: E731
        backend = "cuda" if on("GGML_CUDA") else "metal" if on("GGML_METAL") else "cpu"
    if dev and no_patches:
        raise click.UsageError("--dev and --no-patches: the developer series goes on top of the product's")
    spec = engine.BuildSpec(backend=backend, extra_flags=list(extra), patches=not no_patches, dev=dev)
    tools = engine.TOOL_TARGETS if with_tools else ()
    cached = engine.usable_build(spec) if not force else None
    if cached and not all((cached.parent / t).is_file() for t in tools):
        cached = None  # build the extra tools into the same cached build
    if cached:
        if not print_path:
            click.echo(f"engine already built ({spec.key()}): {cached}", err=True)
        if print_path:  # a script asking where the engine is: nothing else to do
            click.echo(cached)
            return
        result = engine.BuildResult.of(spec, cached, built=False)
    else:
        click.echo(f"building llama.cpp {engine.PIN_COMMIT} ({backend}) into {engine.build_dir(spec)}", err=True)
        # nothing usable is cached, or only the tools are missing (then only they are compiled)
        result = engine.build_engine(spec, jobs=jobs, force=force, progress=ProgressLine("build"), extra_targets=tools)
    ui = webui.UiBuild("skipped", reason=NO_UI) if no_ui else webui.build_ui(force=force)
    click.echo(_ui_line(ui), err=True)
    if as_json:
        echo_json({**result.to_dict(), "ui": asdict(ui)})
    else:
        click.echo(result.path)


# why the chat UI was skipped when --no-ui said so
NO_UI = "--no-ui"


def _ui_line(r: webui.UiBuild) -> str:
    """The one line that says what happened to the chat UI."""
    if r.status == "built":
        return f"UI: built from the pinned source in {r.seconds:g} s: {r.path}"
    if r.status == "cached":
        return f"UI: already built: {r.path}"
    if r.reason == NO_UI:
        return "UI: skipped (--no-ui): serve will have no chat page"
    return f"UI: skipped: {r.reason}; serve will have no chat page"
