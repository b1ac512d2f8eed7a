"""``ggufdspark bench``: measured speedup of the DSpark draft, and the lossless gate."""

from __future__ import annotations

import click

from ggufdspark import bench as bench_lib
from ggufdspark.cli._common import NumberRange, ProgressLine, draft_option, echo_json, target_option


def number_list(kind: type):
    """A click callback turning ``"1,8,32"`` into a list of ``kind``."""

    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return [kind(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}: expected comma-separated {kind.__name__} values") from None

    return parse


@click.command(name="bench")
@target_option(required=True)
@draft_option(required=True)
@click.option("--mmproj", type=click.Path(dir_okay=False),
              help="Vision projector: image prompts are sent as images.")
@click.option("--prompts", type=click.Path(dir_okay=False),
              help="JSON Lines prompt file (default: the built-in set).")
@click.option("--categories", callback=number_list(str), help="Only these categories (comma-separated).")
@click.option("--limit", type=click.IntRange(1), help="At most N items per category.")
@click.option("-n", "--n-predict", type=click.IntRange(1), default=bench_lib.DEFAULT_N_PREDICT, show_default=True,
              help="Tokens generated per request.")
@click.option("--draft-n-max", type=click.IntRange(1, 64),
              help="Draft length (default: tune profile, else the hardware table).")
@click.option("--p-min", type=NumberRange(0, 1),
              help="Confidence threshold for truncating drafts (engine default 0).")
@click.option("--concurrency", callback=number_list(int),
              help="Parallel-request levels, e.g. 1,8,32 (default per backend).")
@click.option("--synthetic-accept", "synthetic_len", type=float, help="Synthetic mean accept length L (speed only).")
@click.option("--synthetic-rates", callback=number_list(float),
              help="Synthetic per-position rates P0,P1,... (speed only).")
@click.option("--gate/--no-gate", default=None,
              help="Run the lossless gate (default: on unless acceptance is synthetic).")
@click.option("--near-tie-gap", type=NumberRange(0, 1), default=bench_lib.NEAR_TIE_GAP, show_default=True,
              help="Top-2 probability gap below which a divergence is a near-tie.")
@click.option("--reference-hf", "--informational-reference", "reference_hf", type=click.Path(file_okay=False),
              help="Target's HF checkpoint: also run it with transformers on CPU (report only).")
@click.option("--server", type=click.Path(), help="llama-server to use.")
@click.option("-t", "--threads", type=int, help="CPU threads for llama-server.")
@click.option("--ctx-per-slot", type=click.IntRange(256),
              help="Context per parallel slot (default 2048 + turns x n_predict).")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra llama-server argument for every arm (repeat; e.g. --server-arg=--no-repack).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep server logs (and drawn images) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a figure (.png, .svg, .pdf...): speedup by category, vs concurrency, accept lengths.")
@click.option("--max-plain-drift", type=float, default=bench_lib.MAX_PLAIN_DRIFT, show_default=True,
              help="How far apart the two plain runs may be (0.25: one 25% faster) before no speedup is given "
                   "(exit code 5).")
def command(model, draft, mmproj, prompts, categories, limit, n_predict, draft_n_max, p_min, concurrency,
            synthetic_len, synthetic_rates, gate, near_tie_gap, reference_hf, server, threads, ctx_per_slot,
            server_args, log_dir, as_json, plot, max_plain_drift):
    """Measure decoding with and without the draft on this machine, and check the output is lossless."""
    report = bench_lib.run_bench(
        model, draft, mmproj=mmproj, prompts=prompts, categories=categories, limit=limit, n_predict=n_predict,
        draft_n_max=draft_n_max, p_min=p_min, concurrency=concurrency, synthetic_len=synthetic_len,
        synthetic_rates=synthetic_rates, gate=gate, near_tie_gap=near_tie_gap, reference_hf=reference_hf,
        server=server, threads=threads, ctx_per_slot=ctx_per_slot, server_args=list(server_args),
        log_dir=log_dir, plot=plot, max_plain_drift=max_plain_drift, progress=ProgressLine("bench"))
    if as_json:
        echo_json(report.to_dict())
    else:
        click.echo(report.text())
    if plot:
        click.echo(f"plot: {bench_lib.plot_report(report, plot)}", err=True)
    report.raise_for_gate()  # a defect (exit 3) outranks a noisy machine (exit 5)
    report.raise_for_drift()
