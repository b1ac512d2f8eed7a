"""``ggufdspark tune``: the fastest draft length on this machine, written to a profile serve reads."""

from __future__ import annotations

import click

from ggufdspark.cli._common import (NumberRange, ProgressLine, draft_option, echo_json, mmproj_option, number_list,
                                    serving_options, target_option, traffic_shape_options)
from ggufdspark.errors import InvalidArgumentError
from ggufdspark.measuring import bench as bench_lib
from ggufdspark.measuring import tune as tune_lib
from ggufdspark.serve_checks import ServingOptions


@click.command(name="tune")
@target_option(required=True, hub_aliases=True)
@draft_option(required=True, hub_aliases=True)
@mmproj_option("With --load: vision projector, given to every arm's server (for --image-share).")
@click.option("--show", is_flag=True, help="Print the stored profile of this pair on this machine and exit.")
@click.option("--acceptance", default="measure", show_default=True,
              help="Acceptance profile to hold fixed: 'measure' (this pair, built-in prompts) or "
                   + ", ".join(tune_lib.PROFILES) + ".")
@click.option("--rates", callback=number_list(float),
              help="Per-position acceptance rates P0,P1,... (overrides --acceptance).")
@click.option("--from-bench", type=click.Path(dir_okay=False), help="Take measured rates from a 'bench --json' report.")
@click.option("--draft-lengths", callback=number_list(int),
              help="Draft lengths to try (default 1..block size; with --load 0 is drafting paused, tried by default "
                   "where the engine can pause).")
@click.option("--p-min", "p_mins", callback=number_list(float), help="Confidence thresholds to try (default 0).")
@click.option("--concurrency", callback=number_list(int),
              help="Parallel-request levels, e.g. 1,8,32 (default per backend).")
@click.option("-n", "--n-predict", type=click.IntRange(1), default=bench_lib.DEFAULT_N_PREDICT, show_default=True,
              help="Tokens generated per request.")
@click.option("--requests", type=click.IntRange(1), default=4, show_default=True,
              help="Requests per point at 1 parallel request.")
@click.option("--trials", type=click.IntRange(1), default=1, show_default=True,
              help="Measure each point this many times and keep the median (busy machines).")
@click.option("--server", type=click.Path(), help="llama-server to use.")
@click.option("-t", "--threads", type=int, help="CPU threads for llama-server.")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra llama-server argument for every arm (repeat; e.g. --server-arg=--no-repack).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep server logs here.")
@click.option("--min-gain", type=NumberRange(0), default=tune_lib.MIN_GAIN, show_default=True,
              help="Drafting is turned on only if at least this many times faster than the target alone.")
@click.option("--no-save", is_flag=True, help="Measure and print, but do not write the profile.")
@click.option("--load", is_flag=True,
              help="Measure each draft length with bench --load's traffic (closed-loop clients, real prompt "
                   "lengths) and keep a length per load (a load cut) in the profile.")
@click.option("--clients", callback=number_list(int), help="With --load: closed-loop client levels, e.g. 1,4,8.")
@click.option("--answer-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="With --load: tokens each answer generates.")
@click.option("--requests-per-client", type=click.IntRange(1), help="With --load: requests each client sends (3).")
@click.option("--sequential", is_flag=True,
              help="With --load: one server at a time (default: every arm's server up, levels interleaved).")
@click.option("--rounds", type=click.IntRange(1), default=1, show_default=True,
              help="With --load: run every level this many times; each length chosen on the ratios over all rounds.")
@traffic_shape_options("With --load:")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(**params):
    """Sweep the draft length (and p_min) and parallel load on this machine; write a serve profile.

    TARGET, DRAFT and --mmproj may be Hub references ORG/NAME[:QUANT] (downloaded first); the profile
    is the downloaded files', so serve finds it for the same references."""
    p = params
    if not p["load"] and not p["show"]:  # before a Hub reference is downloaded
        for name, v in (("--clients", p["clients"]), ("--requests-per-client", p["requests_per_client"]),
                        ("--sequential", p["sequential"]), ("--rounds", p["rounds"] != 1),
                        ("--prompt-scale", p["prompt_scale"] != 1), ("--mmproj", p["mmproj"]),
                        ("--image-share", p["image_share"] != 0)):
            if v:
                raise InvalidArgumentError(f"tune: {name} needs --load")
    opts = serving_options(params, TUNE_OPTIONS, hub=True)
    if p["show"]:
        prof = tune_lib.show_profile(opts)
        if p["as_json"]:
            echo_json(prof)
        elif "load" in prof and "settings" not in prof:  # written by tune --load
            from ggufdspark.measuring import tuneload

            click.echo(tuneload.format_profile(prof))
        else:
            click.echo(tune_lib.format_tune(prof))
        return
    if p["load"]:
        _tune_load(opts, p)
        return
    result = tune_lib.run_tune(
        opts, rates=p["rates"], acceptance=p["acceptance"], from_bench=p["from_bench"],
        draft_lengths=p["draft_lengths"], p_mins=p["p_mins"], concurrency=p["concurrency"], n_predict=p["n_predict"],
        requests=p["requests"], trials=p["trials"], log_dir=p["log_dir"], save=not p["no_save"],
        min_gain=p["min_gain"], progress=ProgressLine("tune"))
    if p["as_json"]:
        echo_json(result.to_dict())
    else:
        click.echo(result.text())
    if not result.recommendation["draft_enabled"]:
        click.secho(f"tune: drafting turned OFF for this pair on this machine: {result.recommendation['why']}",
                    fg="yellow", err=True)


# tune's options that are the server's (their click names): one ServingOptions, built once
TUNE_OPTIONS = ("model", "draft", "mmproj", "server", "threads", "server_args")


def _tune_load(opts: ServingOptions, p: dict) -> None:
    """``tune --load``: one bench --load run, a drafted arm per draft length (``ggufdspark.measuring.tuneload``)."""
    from ggufdspark.measuring import tuneload

    others = [n for n, v in (("--from-bench", p["from_bench"]), ("--p-min", p["p_mins"]),
                             ("--concurrency", p["concurrency"])) if v]
    if others:
        raise InvalidArgumentError(f"tune --load: {others[0]} belongs to the lock-step sweep, not to --load")
    rates, acceptance = p["rates"], p["acceptance"]
    if not rates and acceptance != "measure":
        if acceptance not in tune_lib.PROFILES:
            raise InvalidArgumentError(f"unknown acceptance profile {acceptance!r} (expected measure or "
                                       f"{', '.join(tune_lib.PROFILES)})")
        rates = list(tune_lib.PROFILES[acceptance].rates)
    result = tuneload.run_tune_load(
        opts, draft_lengths=p["draft_lengths"], clients=p["clients"], answer_tokens=p["answer_tokens"],
        requests_per_client=p["requests_per_client"], synthetic_rates=rates, log_dir=p["log_dir"],
        save=not p["no_save"], min_gain=p["min_gain"], interleave=not p["sequential"], rounds=p["rounds"],
        prompt_scale=p["prompt_scale"], image_share=p["image_share"], progress=ProgressLine("tune --load"))
    echo_json(result.to_dict()) if p["as_json"] else click.echo(result.text())
