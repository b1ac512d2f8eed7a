"""``ggufdspark build-engine``: fetch, verify and build the pinned llama.cpp (cached)."""

from __future__ import annotations

import os

import click

from ggufdspark import engine
from ggufdspark.cli._common import ProgressLine


@click.command(name="build-engine")
@click.option("--cuda", "backend", flag_value="cuda", help="Build with the CUDA backend.")
@click.option("--metal", "backend", flag_value="metal", help="Build with the Metal backend.")
@click.option("--cpu", "backend", flag_value="cpu", help="CPU only (the default).")
@click.option("--cmake-flag", "extra", multiple=True, metavar="-DNAME=VALUE", help="Extra CMake flag (part of the cache key).")
@click.option("-j", "--jobs", type=int, default=None, help="Parallel compile jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even if a finished build is cached.")
@click.option("--no-patches", is_flag=True, help="Build the pinned tree without the project's patch series.")
@click.option("--print-path", is_flag=True, help="Print only the llama-server path on stdout.")
@click.option("--with-tools", is_flag=True, help="Also build llama-bench and llama-batched-bench (profiling).")
def command(backend, extra, jobs, force, no_patches, print_path, with_tools):
    """Fetch llama-cpp-python==0.3.36's vendored llama.cpp (sha256-checked) and build llama-server.

    The backend defaults to $GGML_CUDA / $GGML_METAL when set to 1/ON, else CPU.
    """
    if backend is None:
        on = lambda v: os.environ.get(v, "").upper() in ("1", "ON", "TRUE", "YES")  # noqa: E731
        backend = "cuda" if on("GGML_CUDA") else "metal" if on("GGML_METAL") else "cpu"
    spec = engine.BuildSpec(backend=backend, extra_flags=list(extra), patches=not no_patches)
    cached = engine.built_server(spec)
    if cached and with_tools and not (cached.parent / "llama-bench").is_file():
        cached = None  # build the extra tools into the same cached build
    if cached and not force:
        if not print_path:
            click.echo(f"engine already built ({spec.key()}): {cached}", err=True)
        click.echo(cached)
        return
    click.echo(f"building llama.cpp {engine.PIN_COMMIT} ({backend}) into {engine.build_dir(spec)}", err=True)
    exe = engine.build_engine(spec, jobs=jobs, force=force, progress=ProgressLine("build"),
                              extra_targets=("llama-bench", "llama-batched-bench") if with_tools else ())
    click.echo(exe)
