"""``serve --warmup``: before ``serve`` says a drafted server is ready, one short greedy request
through the drafted path, so that its one-time work is not the first user's (``docs/serve.md``,
step 8)."""

from __future__ import annotations

import subprocess
import time
from typing import Callable

from ggufdspark.errors import EngineError
from ggufdspark.runners.deaths import engine_error_line, exit_cause
from ggufdspark.runners.server import ServerProcess, ServerSettings
from ggufdspark.timings.live import LogWindow

# Before it says ready, a drafted server answers one short greedy request, so that the first
# user's request does not pay the drafted path's one-time work (the target's reserve that
# the drafter's taps leave pending, the drafter's first graphs and buffers, on CUDA its graphs'
# captures), as vLLM and SGLang capture their CUDA graphs before they serve. Off by default: on the
# CPU the first request after a start measured no slower without it (benchmarks/first_request.py,
# docs/serve.md), and on an H100 (benchmarks/h200.sh first) every server's first request, plain too,
# was 7-9x slower to its first token than its later ones, the warm-up taking 7 ms of that
WARMUP_TOKENS = 16
WARMUP_PROMPT = "Warm up the engine."
# llama-server arguments after which there is nothing to warm: the user turned warm-up off, or the
# server answers no completions
_NO_WARMUP_ARGS = ("--no-warmup", "--embedding", "--embeddings", "--reranking", "--rerank")
_WARMUP_LOG_WAIT_S = 5.0
# after a failed warm-up request, how long the engine has to exit before it counts as alive (an
# engine that aborts closes its socket a moment before the process ends)
_WARMUP_EXIT_WAIT_S = 5.0


class WarmUpDeath(Exception):
    """The engine died on the warm-up request: it never was ready. The message says how (its exit
    and its own last error line)."""


def wants_warm_up(settings: ServerSettings) -> bool:
    """Whether ``supervise`` warms this server up: a draft is loaded and no argument says otherwise."""
    drafted = bool(settings.draft or settings.hf_draft)
    return drafted and not any(a.split("=", 1)[0] in _NO_WARMUP_ARGS for a in settings.extra_args)


def warm_up(srv: ServerProcess, timeout: float = 300.0) -> float:
    """One greedy ``WARMUP_TOKENS``-token request through the drafted path (prompt cache off, the
    end-of-text token ignored so every step runs); returns its seconds.

    Raises:
        EngineError: the request failed (an HTTP error, no answer within ``timeout``).
    """
    t0 = time.monotonic()
    client = srv.client(timeout=timeout)
    client.complete(client.tokenize(WARMUP_PROMPT, add_special=True), n_predict=WARMUP_TOKENS, ignore_eos=True)
    return time.monotonic() - t0


def warmed(srv: ServerProcess, settings: ServerSettings, window: LogWindow | None,
           on_event: Callable[[str], None], warm: bool) -> float | None:
    """``warm_up`` where ``wants_warm_up``; its seconds (None: not warmed). A failed warm-up of an
    engine that still runs is said and served through; an engine that died on it raises
    ``WarmUpDeath`` (it was never ready). The warm-up's request is not traffic: the stats window
    moves past it."""
    if not (warm and wants_warm_up(settings)):
        return None
    try:
        took = warm_up(srv)
    except EngineError as e:
        assert srv.proc is not None
        try:
            rc = srv.proc.wait(_WARMUP_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            on_event(f"warm-up request failed ({e}); serving without it")
            return None
        said = engine_error_line(srv.run_log_text())
        raise WarmUpDeath(f"{exit_cause(rc)} on the warm-up request" + (f": {said}" if said else "")) from None
    if window and took is not None:
        # the engine logs the request's timings and release after its answer went out: wait for them
        # (a few seconds at most), so that no stats line counts the warm-up
        deadline = time.monotonic() + _WARMUP_LOG_WAIT_S
        while window.take().requests == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    return took


def note(took: float | None) -> str:
    """The ready line's tail: how long the warm-up took, or nothing."""
    return f", warmed up in {took:.2f} s" if took is not None else ""
