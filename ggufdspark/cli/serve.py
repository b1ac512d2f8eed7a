"""``ggufdspark serve``: llama-server with the DSpark draft, checked and tuned to the hardware."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import threading
import webbrowser
from typing import Callable, Iterator

import click

from ggufdspark import launch, logfiles
from ggufdspark import serve as serve_lib
from ggufdspark import supervise as supervise_lib
from ggufdspark.cli._common import (NumberRange, draft_option, echo_json, echo_warning, finite_json,
                                    serving_options, target_option)
from ggufdspark.errors import GgufdsparkError, InvalidArgumentError


@click.command(name="serve", context_settings={"ignore_unknown_options": False})
@target_option()
@draft_option()
@click.option("--mmproj", type=click.Path(dir_okay=False), help="Vision projector GGUF (image requests).")
@click.option("-hf", "--hf-repo", "--hf", "hf", metavar="ORG/NAME[:QUANT]",
              help="Target from the Hub (downloaded first, then checked); -m takes the same form.")
@click.option("-hfd", "--hf-repo-draft", "--hfd", "hfd", metavar="ORG/NAME[:QUANT]",
              help="Draft from the Hub (its dspark-*.gguf); -md takes the same form.")
@click.option("--host", default="127.0.0.1", show_default=True, callback=lambda ctx, param, v: _host(v),
              help="Address to listen on (another than loopback wants --api-key: it warns without one).")
@click.option("--port", type=click.IntRange(*serve_lib.PORT_RANGE), default=8080, show_default=True,
              help="0 picks a free port.")
@click.option("--api-key", envvar="GGUFDSPARK_API_KEY",
              help="Require this key (or $GGUFDSPARK_API_KEY); the engine reads it from a private file.")
@click.option("--draft-n-max", type=click.IntRange(*launch.DRAFT_N_MAX_RANGE), help="Override the draft length.")
@click.option("--draft-n-max-by-slots", metavar="N:L[,N:L...]",
              help="Cut drafts to L tokens while more than N slots are busy (a prompt or generating), L = 0: no drafts, e.g. 2:5,8:3,16:0 "
                   "(engine patch 0021; default: measured per backend, on CUDA with its default length; 'off': "
                   "no cut).")
@click.option("--no-draft", is_flag=True, help="Serve the target alone.")
@click.option("--force", is_flag=True, help="Serve even if 'check' fails (loudly).")
@click.option("--server", type=click.Path(), help="llama-server to use.")
@click.option("-c", "--ctx-size", type=click.IntRange(0),
              help="llama-server's whole context (-c), which it divides among the -np slots (0: the model's "
                   "trained context a slot, as memory allows). Default: --ctx-per-slot x -np.")
@click.option("--ctx-per-slot", type=click.IntRange(1),
              help=f"Context of each slot in tokens (default {launch.CTX_PER_SLOT}, or the model's trained "
                   "context if smaller); -c is this x -np.")
@click.option("-np", "--parallel", type=click.IntRange(1), default=1, show_default=True,
              help="Requests served at once (llama-server's slots, -np).")
@click.option("--log", "log_file", type=click.Path(dir_okay=False),
              help="llama-server log file, appended to (default: a new file in ~/.local/state/ggufdspark/logs).")
@click.option("--start-timeout", type=NumberRange(0, min_open=True), default=300, show_default=True,
              help="Seconds llama-server has to become healthy before serve gives up.")
@click.option("--max-restarts", type=click.IntRange(0), default=5, show_default=True,
              help="Restarts after crashes (with a growing pause) before serve gives up; the count starts again "
                   "once llama-server has served --restart-window seconds.")
@click.option("--restart-window", type=NumberRange(0), default=supervise_lib.RESTART_WINDOW_S, show_default=True,
              help="Seconds llama-server must serve after a crash before the restart count starts again (a crash "
                   "loop ends serve, a crash a week does not; 0: never, every crash counts).")
@click.option("--health-timeout", type=NumberRange(0), default=supervise_lib.HEALTH_TIMEOUT_S, show_default=True,
              help="Restart llama-server when /health answers nothing for this many seconds and its log does not "
                   "grow either (hung; a busy engine's log moves; 0: never).")
@click.option("--stats-interval", type=NumberRange(0), default=supervise_lib.STATS_EVERY_S, show_default=True,
              help="Every this many seconds with traffic, a line of what finished: requests, tokens, decode "
                   "speed, drafted and accepted tokens, accept length (0: none).")
@click.option("--warmup/--no-warmup", default=None,
              help="Before saying ready, send a drafted server one request, so the drafted path's one-time work "
                   "(first kernel launches, CUDA graph captures, first buffers) is not the first user's. Default: on "
                   "for CUDA, off elsewhere (on the CPU the first request measured no slower without it); "
                   "'-- --no-warmup' also turns off the engine's own.")
@click.option("--warmup-tokens", type=click.IntRange(0), default=None,
              help="The warm-up request's prompt size in tokens, capped to a slot's context (default: 2048 on "
                   "CUDA, where prompt processing at a real prompt's size measured most of the first request's "
                   "cost away; a short prompt elsewhere; 0: the short prompt).")
@click.option("--no-profile", is_flag=True, help="Ignore a tune profile.")
@click.option("--dry-run", is_flag=True, help="Print the llama-server command line and exit.")
@click.option("--json", "as_json", is_flag=True,
              help="With --dry-run: print the plan (command line, settings and why) as JSON; when serving: "
                   "each supervision event (ready, restart with its cause, stats, stopping) as a JSON line on stdout, "
                   "the last always stopping, gave_up or failed (with its cause).")
@click.option("--no-ui", is_flag=True, help="Do not serve the chat page (the API only).")
@click.option("--open", "open_page", is_flag=True, help="Open the chat page in the default browser once the server is up.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def command(**params):
    """Serve TARGET with its DSpark draft. Arguments after -- go to llama-server unchanged.

    The chat page (built by 'ggufdspark build-engine' when node and npm are there) is at
    http://HOST:PORT/; its URL is printed once the server is up.
    """
    opts = serving_options(params, SERVE_OPTIONS, use_profile=not params.pop("no_profile"),
                           ui=not params.pop("no_ui"))
    dry_run, as_json, open_page = params["dry_run"], params["as_json"], params["open_page"]
    with _final_event(as_json and not dry_run) as record:
        if opts.ctx_size is not None and opts.ctx_per_slot is not None:
            raise click.UsageError("-c/--ctx-size and --ctx-per-slot: give one "
                                   "(-c is the whole context, divided among the slots)")
        if not opts.ui and open_page:
            raise click.UsageError("--open and --no-ui: there is no chat page to open without the UI")
        p = serve_lib.plan(opts)
        keyed = bool(p.settings.api_keys())
        if keyed and p.ui and open_page:
            raise click.UsageError(f"--open with an API key: {KEY_BLOCKS_PAGE}")
        for w in p.warnings:
            echo_warning(w)
        d = p.decision
        click.echo(f"backend: {d.backend}; draft: "
                   + (f"on, n_max {d.draft_n_max}" if d.draft_enabled else "off")
                   + f"; offload: {'yes' if d.offload else 'no'}", err=True)
        for r in d.reasons:
            click.echo(f"  because {r}", err=True)
        c = p.context
        slot = f"{c.per_slot} tokens a slot" if c.per_slot else "the model's trained context, divided among the slots"
        click.echo(f"context: {slot} x {c.parallel} slot(s) (-c {c.total}): {c.why}", err=True)
        click.echo(f"warm-up: {p.warmup.describe()}", err=True)
        if dry_run:
            echo_json(p.to_dict()) if as_json else click.echo(shlex.join(p.settings.redacted()))
            return
        log_file = params["log_file"]
        log_path = logfiles.check_log_path(log_file) if log_file else logfiles.new_log("serve")
        p.settings.pick_port()  # so the command printed below names the port actually used
        click.echo(shlex.join(p.settings.redacted()), err=True)
        click.echo(f"log: {log_path}", err=True)
        click.echo(f"chat UI: {p.ui_note}", err=True)
        hint = (KEY_BLOCKS_PAGE if p.ui else KEY_HINT) if keyed else ""

        def ready(url: str) -> None:
            page = url + "/"
            _say(f"chat: {page}" + (f" ({hint})" if hint else ""))
            if open_page:  # in a thread: a console browser (lynx, w3m) would hold up the supervision
                threading.Thread(target=_open, args=(page,), daemon=True, name="open-browser").start()

        supervise_lib.supervise(p, log_path=log_path, start_timeout=params["start_timeout"],
                                max_restarts=params["max_restarts"], restart_window=params["restart_window"],
                                health_timeout=params["health_timeout"], on_event=_say, on_ready=ready,
                                on_record=record, stats_every=params["stats_interval"])


# serve's options that are the server's (their click names): one ServingOptions, built here
SERVE_OPTIONS = ("model", "draft", "mmproj", "hf", "hfd", "host", "port", "api_key", "draft_n_max",
                 "draft_n_max_by_slots", "no_draft", "force", "server", "ctx_size", "ctx_per_slot", "parallel", "extra",
                 "warmup", "warmup_tokens")


# Printed with the chat URL when the server requires a key (the key itself never is). The pinned
# llama-server exempts from the key only "/" and the files of an embedded UI; the files of a --path
# UI (its JS bundle included) need the key, which a browser does not send for them (docs/webui.md).
KEY_HINT = "an API key is required: enter it in the page's settings"
KEY_BLOCKS_PAGE = ("with an API key this engine also asks the key for the page's own files (only / is exempt), "
                   "so the chat page cannot load in a browser; serve without --api-key on 127.0.0.1 to use it")


def _open(page: str) -> None:
    try:
        opened, why = webbrowser.open(page), "no browser found (set $BROWSER)"
    except Exception as e:  # a broken $BROWSER entry must not stop the server
        opened, why = False, str(e)
    if not opened:
        _say(f"--open: could not open a browser ({why}); open {page} yourself")


def _host(value: str) -> str:
    try:
        return serve_lib.check_host(value)
    except InvalidArgumentError as e:
        raise click.BadParameter(str(e)) from None


# serve --json: the events that end the stream (supervise sends one however it ends)
FINAL_EVENTS = ("stopping", "gave_up", "failed")


@contextlib.contextmanager
def _final_event(on: bool) -> Iterator[Callable[[dict], None]]:
    """serve --json's event stream (``on``), which always ends with a final event: supervise sends
    one however it ends; an error before it started (a missing file, a refused option, no engine) is
    sent here as ``{"event": "failed", "cause": ...}``, so a reader waiting on the stream learns why.
    Yields the ``on_record`` to give supervise (nothing is printed when not ``on``)."""
    sent: list[dict] = []

    def record(rec: dict) -> None:
        if on:
            _json_line(rec)
            sent.append(rec)

    try:
        yield record
    except (GgufdsparkError, click.ClickException) as e:
        if on and not any(r.get("event") in FINAL_EVENTS for r in sent):
            text = e.format_message() if isinstance(e, click.ClickException) else str(e)
            _json_line({"event": "failed", "cause": next(iter(text.splitlines()), type(e).__name__),
                        "engine_error": None, "restarts": 0, "log": None})
        raise


def _json_line(rec: dict) -> None:
    """A supervision event as one JSON line on stdout (``serve --json``), flushed for a reader."""
    try:
        click.echo(json.dumps(finite_json(rec), default=str))
        sys.stdout.flush()
    except OSError:
        pass


def _say(msg: str) -> None:
    """Print a supervision event; a terminal that went away (SIGHUP) must not stop the stopping."""
    try:
        click.echo(msg, err=True)
    except OSError:
        pass
