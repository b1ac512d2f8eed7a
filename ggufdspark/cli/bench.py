"""``ggufdspark bench``: measured speedup of the DSpark draft, and the lossless gate."""

from __future__ import annotations

import sys

import click

from ggufdspark import launch
from ggufdspark.cli._common import (NumberRange, ProgressLine, draft_option, echo_json, given_options, mmproj_option,
                                    number_list, serving_options, target_option, traffic_shape_options)
from ggufdspark.errors import InvalidArgumentError
from ggufdspark.measuring import bench as bench_lib
from ggufdspark.measuring import loadbench, loadplan
from ggufdspark.measuring import samplingbench as sb
from ggufdspark.measuring import traffic as tr
from ggufdspark.redaction import redacted_command
from ggufdspark.serve_checks import ServingOptions


@click.command(name="bench")
@target_option(required=True, hub_aliases=True)
@draft_option(required=True, hub_aliases=True)
@mmproj_option("Vision projector: image prompts are sent as images (--load: given to every server).")
@click.option("--prompts", type=click.Path(dir_okay=False),
              help="JSON Lines prompt file (default: the built-in set).")
@click.option("--categories", callback=number_list(str), help="Only these categories (comma-separated).")
@click.option("--limit", type=click.IntRange(1), help="At most N items per category.")
@click.option("-n", "--n-predict", type=click.IntRange(1), default=bench_lib.DEFAULT_N_PREDICT, show_default=True,
              help="Tokens generated per request.")
@click.option("--draft-n-max", type=click.IntRange(*launch.DRAFT_N_MAX_RANGE),
              help="Draft length (default: tune profile, else the hardware table).")
@click.option("--draft-n-max-by-slots", "draft_cut", metavar="N:L[,N:L...]",
              help="--load: the drafted arm's load cut, as serve's (L = 0 pauses drafting; 'off': none; "
                   "default: serve's for this backend).")
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
              help="Context per parallel slot (default: serve's, 4096 or the model's trained context if "
                   "smaller; more when the prompt set's turns need 2048 + turns x n_predict).")
@click.option("--server-arg", "server_args", multiple=True,
              help="Extra llama-server argument for every arm (repeat; e.g. --server-arg=--no-repack).")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Keep server logs (and drawn images) here.")
@click.option("--load", "load", is_flag=True,
              help="Load mode: plain vs drafted serving under realistic traffic (docs/bench.md, 'Load mode').")
@click.option("--clients", callback=number_list(int),
              help="--load: closed-loop clients per level, e.g. 1,2,4,8 (default per backend); with --rate: "
                   "the most requests in flight.")
@click.option("--rate", callback=number_list(float), help="--load: Poisson arrivals, requests/s per level (e.g. 1,4).")
@click.option("--answer-tokens", type=int, default=tr.DEFAULT_ANSWER_TOKENS, show_default=True,
              help="--load: tokens per answer (256 and 1024 are the standard shapes).")
@click.option("--requests-per-client", type=int, help="--load: requests each client sends per level [default: 3].")
@click.option("--requests", type=int, help="--load --rate: requests per rate [default: 32].")
@click.option("--sequential", is_flag=True,
              help="--load: one server at a time, arm after arm (default: all arms' servers up, each level on "
                   "every arm in turn; needs memory for both).")
@click.option("--seed", type=int, default=tr.DEFAULT_SEED, show_default=True,
              help="--load: seed of the prompt order and the arrivals.")
@click.option("--rounds", type=int, default=1, show_default=True,
              help="--load: run every level this many times (round r with seed + r), figures over all rounds and "
                   "drafted / plain of each round's aggregate: the run's own spread.")
@click.option("--conversations", is_flag=True,
              help="--load: each closed-loop client one conversation, its next prompt the conversation so far and "
                   "a new message, sent with the prompt cache (chat traffic).")
@traffic_shape_options("--load:")
@click.option("--noise-floor", is_flag=True,
              help="--load: a second plain server (plain2) beside the first, the same command: plain2 / plain is "
                   "the run's own noise, printed as a band a drafted / plain ratio must leave to mean anything.")
@click.option("--sampling-check", "sampling_check", is_flag=True,
              help="Sampling check: plain and drafted token frequencies at temperature > 0, position by position "
                   "(chi-square; docs/bench.md, 'The sampling check').")
@click.option("--samples", type=int, default=sb.DEFAULT_SAMPLES, show_default=True,
              help="--sampling-check: seeded completions per arm.")
@click.option("--temperature", type=float, default=sb.DEFAULT_TEMPERATURE, show_default=True,
              help="--sampling-check: sampling temperature; --load: every request sampled at it (default there: "
                   "0, greedy).")
@click.option("--top-k", type=int, default=0, show_default=True, help="--sampling-check: top-k (0: off).")
@click.option("--alpha", type=float, default=0.01, show_default=True,
              help="--sampling-check: significance level after the Bonferroni correction over positions.")
@click.option("--sampling-prompt", default=sb.DEFAULT_PROMPT, show_default=True,
              help="--sampling-check: the prompt (raw text) every sample continues.")
@click.option("--json", "as_json", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="The report as JSON: on stdout, or written to FILE.")
@click.option("--force", is_flag=True, help="Replace an existing --json FILE.")
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Write a figure (.png, .svg, .pdf...): speedup by category, vs concurrency, accept lengths.")
@click.option("--max-plain-drift", type=float, default=bench_lib.MAX_PLAIN_DRIFT, show_default=True,
              help="How far apart the two plain runs may be (0.25: one 25% faster) before no speedup is given "
                   "(exit code 5).")
def command(**params):
    """Measure decoding with and without the draft on this machine, and check the output is lossless.

    With --load: serving under realistic traffic instead (closed-loop clients or Poisson arrivals,
    prompts of a few dozen to 2000+ tokens, streamed), plain and drafted arms in one run.

    TARGET, DRAFT and --mmproj may be Hub references ORG/NAME[:QUANT] (downloaded first)."""
    ctx = click.get_current_context()
    opts = serving_options(params, BENCH_OPTIONS, hub=True)
    as_json = params["as_json"]
    json_file = as_json if as_json not in (None, "-") else None
    if params["sampling_check"]:
        _sampling_check(ctx, opts, params, json_file)
        return
    load_temperature = given_options(ctx, ("temperature",)) if params["load"] else []
    given = [o for o in given_options(ctx, SAMPLING_OPTIONS) if o not in load_temperature]
    if given:
        raise InvalidArgumentError(f"bench: {given[0]} needs --sampling-check")
    if params["load"]:
        _load(ctx, opts, params, json_file, temperature=params["temperature"] if load_temperature else 0.0)
    else:
        _bench(ctx, opts, params, json_file)


# bench's options that are the server's (their click names): one ServingOptions, built once
BENCH_OPTIONS = ("model", "draft", "mmproj", "server", "draft_n_max", "draft_cut", "threads", "ctx_per_slot",
                 "server_args")
# the options of --sampling-check alone (--temperature is --load's too)
SAMPLING_OPTIONS = ("samples", "temperature", "top_k", "alpha", "sampling_prompt")


def _bench(ctx: click.Context, opts: ServingOptions, p: dict, json_file: str | None) -> None:
    """``bench``: refuses --load's options, runs, reports; exit 3 on a gate defect, 5 on a noisy machine."""
    given = given_options(ctx, ("clients", "rate", "answer_tokens", "requests_per_client", "requests", "seed",
                                "rounds", "noise_floor", "draft_cut", "sequential", "conversations", "image_share",
                                "prompt_scale"))
    if given:
        raise InvalidArgumentError(f"bench: {given[0]} needs --load")
    if json_file:
        loadbench.check_json_path(json_file, opts.model, opts.draft, force=p["force"])
    report = bench_lib.run_bench(
        opts, prompts=p["prompts"], categories=p["categories"], limit=p["limit"], n_predict=p["n_predict"],
        p_min=p["p_min"], concurrency=p["concurrency"], synthetic_len=p["synthetic_len"],
        synthetic_rates=p["synthetic_rates"], gate=p["gate"], near_tie_gap=p["near_tie_gap"],
        reference_hf=p["reference_hf"], log_dir=p["log_dir"], plot=p["plot"], max_plain_drift=p["max_plain_drift"],
        progress=ProgressLine("bench"))
    _emit(report, json_file, p["as_json"])
    if p["plot"]:
        click.echo(f"plot: {bench_lib.plot_report(report, p['plot'])}", err=True)
    report.raise_for_gate()  # a defect (exit 3) outranks a noisy machine (exit 5)
    report.raise_for_drift()


def _load(ctx: click.Context, opts: ServingOptions, p: dict, json_file: str | None, *, temperature: float) -> None:
    """``bench --load``: refuses the one-request benchmark's options, runs, reports."""
    given = given_options(ctx, ("prompts", "categories", "limit", "concurrency", "reference_hf", "plot",
                                "gate", "near_tie_gap", "max_plain_drift"))
    given += ["--n-predict (use --answer-tokens)"] if given_options(ctx, ("n_predict",)) else []
    if given:
        raise InvalidArgumentError(f"bench --load: {given[0]} belongs to the one-request benchmark, not to --load")
    if json_file:
        loadbench.check_json_path(json_file, opts.model, opts.draft, opts.mmproj, force=p["force"])
    plan = loadplan.plan_load(
        opts, clients=p["clients"], rate=p["rate"], answer_tokens=p["answer_tokens"],
        requests_per_client=p["requests_per_client"], requests=p["requests"], seed=p["seed"],
        interleave=not p["sequential"], temperature=temperature, rounds=p["rounds"], noise_floor=p["noise_floor"],
        conversation=p["conversations"], image_share=p["image_share"], prompt_scale=p["prompt_scale"], p_min=p["p_min"],
        synthetic_len=p["synthetic_len"], synthetic_rates=p["synthetic_rates"])
    report = loadbench.run_load(plan, log_dir=p["log_dir"], command=redacted_command("ggufdspark", sys.argv[1:]),
                                progress=ProgressLine("bench --load"))
    _emit(report, json_file, p["as_json"])


def _sampling_check(ctx: click.Context, opts: ServingOptions, p: dict, json_file: str | None) -> None:
    """``bench --sampling-check``: refuses the options of the other modes, runs, reports; exit 3 on a fail."""
    own = ("sampling_check", *SAMPLING_OPTIONS, "model", "draft", "n_predict", "draft_n_max", "clients", "seed",
           "server", "threads", "server_args", "log_dir", "as_json", "force")
    given = given_options(ctx, [n for n in ctx.params if n not in own])
    if given:
        raise InvalidArgumentError(f"bench --sampling-check: {given[0]} belongs to another bench mode")
    if p["clients"] and len(p["clients"]) != 1:
        raise InvalidArgumentError(f"bench --sampling-check: --clients takes one number (got {p['clients']})")
    n_predict = p["n_predict"] if given_options(ctx, ("n_predict",)) else sb.DEFAULT_N_PREDICT
    sb.check_options(samples=p["samples"], n_predict=n_predict, temperature=p["temperature"], top_k=p["top_k"],
                     alpha=p["alpha"])
    if json_file:
        loadbench.check_json_path(json_file, opts.model, opts.draft, force=p["force"])
    report = sb.run_sampling_check(
        opts, prompt=p["sampling_prompt"], samples=p["samples"], n_predict=n_predict, temperature=p["temperature"],
        top_k=p["top_k"], alpha=p["alpha"], seed=p["seed"], clients=(p["clients"] or [sb.DEFAULT_CLIENTS])[0],
        log_dir=p["log_dir"])
    _emit(report, json_file, p["as_json"])
    report.raise_for_status()


def _emit(report, json_file: str | None, as_json: str | None) -> None:
    """A report written to ``--json FILE`` (its path said on stderr), then as JSON on stdout
    (``--json`` alone) or as text."""
    if json_file:
        click.echo(f"json: {loadbench.write_json(json_file, report.to_dict())}", err=True)
    if as_json == "-":
        echo_json(report.to_dict())
    else:
        click.echo(report.text())
