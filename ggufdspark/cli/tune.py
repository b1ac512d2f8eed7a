"""``ggufdspark tune``: the fastest draft length on this machine, written to a profile serve reads."""

from __future__ import annotations

import click

from ggufdspark.cli._common import (NumberRange, ProgressLine, draft_option, echo_json, from_hub, number_list,
                                    target_option)
from ggufdspark.errors import InvalidArgumentError
from ggufdspark.measuring import bench as bench_lib
from ggufdspark.measuring import tune as tune_lib


@click.command(name="tune")
@target_option(required=True, hub_aliases=True)
@draft_option(required=True, hub_aliases=True)
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(model, draft, show, acceptance, rates, from_bench, draft_lengths, p_mins, concurrency, n_predict,
            requests, trials, server, threads, server_args, log_dir, min_gain, no_save, load, clients, answer_tokens,
            requests_per_client, sequential, rounds, as_json):
    """Sweep the draft length (and p_min) and parallel load on this machine; write a serve profile.

    TARGET and DRAFT may be Hub references ORG/NAME[:QUANT] (downloaded first); the profile is the
    downloaded files', so serve finds it for the same references."""
    model, draft, _ = from_hub(model, draft)
    if show:
        prof = tune_lib.show_profile(model, draft, server=server)
        if as_json:
            echo_json(prof)
        elif "load" in prof and "settings" not in prof:  # written by tune --load
            from ggufdspark.measuring import tuneload

            click.echo(tuneload.format_profile(prof))
        else:
            click.echo(tune_lib.format_tune(prof))
        return
    if load:
        _tune_load(model, draft, acceptance=acceptance, rates=rates, draft_lengths=draft_lengths, clients=clients,
                   answer_tokens=answer_tokens, requests_per_client=requests_per_client, server=server,
                   threads=threads, server_args=list(server_args), log_dir=log_dir, min_gain=min_gain,
                   save=not no_save, interleave=not sequential, rounds=rounds, as_json=as_json, others=[n for n, v in (
                       ("--from-bench", from_bench), ("--p-min", p_mins), ("--concurrency", concurrency)) if v])
        return
    for name, v in (("--clients", clients), ("--requests-per-client", requests_per_client), ("--sequential", sequential),
                    ("--rounds", rounds != 1)):
        if v:
            raise InvalidArgumentError(f"tune: {name} needs --load")
    result = tune_lib.run_tune(
        model, draft, rates=rates, acceptance=acceptance, from_bench=from_bench, draft_lengths=draft_lengths,
        p_mins=p_mins, concurrency=concurrency, n_predict=n_predict, requests=requests, trials=trials,
        server=server, threads=threads, server_args=list(server_args), log_dir=log_dir, save=not no_save,
        min_gain=min_gain, progress=ProgressLine("tune"))
    if as_json:
        echo_json(result.to_dict())
    else:
        click.echo(result.text())
    if not result.recommendation["draft_enabled"]:
        click.secho(f"tune: drafting turned OFF for this pair on this machine: {result.recommendation['why']}",
                    fg="yellow", err=True)


def _tune_load(model, draft, *, acceptance, rates, others, as_json, **kw) -> None:
    """``tune --load``: one bench --load run, a drafted arm per draft length (``ggufdspark.measuring.tuneload``)."""
    from ggufdspark.measuring import tuneload

    if others:
        raise InvalidArgumentError(f"tune --load: {others[0]} belongs to the lock-step sweep, not to --load")
    if not rates and acceptance != "measure":
        if acceptance not in tune_lib.PROFILES:
            raise InvalidArgumentError(f"unknown acceptance profile {acceptance!r} (expected measure or "
                                       f"{', '.join(tune_lib.PROFILES)})")
        rates = list(tune_lib.PROFILES[acceptance].rates)
    result = tuneload.run_tune_load(model, draft, synthetic_rates=rates, progress=ProgressLine("tune --load"), **kw)
    echo_json(result.to_dict()) if as_json else click.echo(result.text())
