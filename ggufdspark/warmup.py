"""``serve``'s warm-up: before ``serve`` says a drafted server is ready, one greedy request through
the drafted path, so that its one-time work is not the first user's (``docs/serve.md``, step 8).
On CUDA by default, through prompt processing at a real prompt's size; elsewhere off by default,
and a short prompt when asked for."""

from __future__ import annotations

import subprocess
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from ggufdspark.errors import EngineError
from ggufdspark.measuring import traffic
from ggufdspark.runners.client import Client
from ggufdspark.runners.deaths import engine_error_line, exit_cause
from ggufdspark.runners.server import ServerProcess, ServerSettings
from ggufdspark.timings.live import LogWindow

# Before it says ready, a drafted server answers one greedy request, so that the first user's
# request does not pay the drafted path's one-time work (the target's reserve that the drafter's
# taps leave pending, the drafter's first graphs and buffers, on CUDA its graphs' captures and the
# kernels loaded at their first launch), as vLLM and SGLang capture their CUDA graphs before they
# serve. What it measured (benchmarks/serving.py first, docs/serve.md): on an H100 (product-42) every
# server's first request after a start was 8-9x slower to its first token than its later ones, plain
# too (210 ms cold, 22 ms warm); a short warm-up took 28 ms of that, an untimed 2705-token request
# about 60% (first TTFT 72 ms), for 0.3-0.4 s more at the start. On the CPU the first request
# measured no slower without a warm-up, and a long prompt there costs seconds: off by default.
WARMUP_TOKENS = 16  # the warm-up's answer (end of text ignored, so every step runs)
WARMUP_PROMPT = "Warm up the engine."  # the short prompt (``prompt_tokens`` 0)
# backend -> the warm-up's prompt size where it is on by default (capped to a slot's context)
DEFAULT_PROMPT_TOKENS = {"cuda": 2048}
# llama-server arguments after which there is nothing to warm: the user turned warm-up off, or the
# server answers no completions
_NO_WARMUP_ARGS = ("--no-warmup", "--embedding", "--embeddings", "--reranking", "--rerank")
_WARMUP_LOG_WAIT_S = 5.0
# How long the warm-up request may take before it counts as hung (a fixed 300 s before): a minute for
# the short prompt, plus the prompt at a slow CPU's prompt rate (the 3B target on 2 cores of an x86
# CPU processes prompts at about 40 tokens/s; half that allows for a slower machine or model), so
# that a 2048-token warm-up gets about 2.7 minutes and a hung engine is given up on, said, and served
# through (or found dead) in time. ``decide``'s ``timeout`` overrides it.
WARMUP_BASE_TIMEOUT_S = 60.0
WARMUP_SLOW_PROMPT_TPS = 20.0
# after a failed warm-up request, how long the engine has to exit before it counts as alive (an
# engine that aborts closes its socket a moment before the process ends)
_WARMUP_EXIT_WAIT_S = 5.0


@dataclass(frozen=True)
class WarmUp:
    """Whether ``serve`` warms the server up before it says ready, with a prompt of how many tokens
    (0: ``WARMUP_PROMPT``, a few), and why."""

    on: bool
    prompt_tokens: int
    why: str
    timeout_s: float = WARMUP_BASE_TIMEOUT_S  # the request's limit (``default_timeout``)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """serve's ``warm-up:`` line."""
        if not self.on:
            return f"off ({self.why})"
        size = f"a {self.prompt_tokens}-token prompt" if self.prompt_tokens else "a short prompt"
        return f"on, {size} and {WARMUP_TOKENS} answer tokens ({self.why})"


def default_timeout(prompt_tokens: int) -> float:
    """The warm-up request's limit for a prompt of ``prompt_tokens`` (0: the short prompt)."""
    return WARMUP_BASE_TIMEOUT_S + max(prompt_tokens, 0) / WARMUP_SLOW_PROMPT_TPS


def decide(backend: str, settings: ServerSettings, on: bool | None = None,
           prompt_tokens: int | None = None, timeout: float | None = None) -> WarmUp:
    """The warm-up for a server of ``settings`` on ``backend``: ``on`` / ``prompt_tokens`` as given
    (``--warmup`` / ``--warmup-tokens``), else on where ``DEFAULT_PROMPT_TOKENS`` lists the backend,
    with that prompt size. Never for a server without a draft or with an argument of
    ``_NO_WARMUP_ARGS`` after ``--``. ``timeout``: the request's limit in seconds (default:
    ``default_timeout`` of the prompt size)."""
    size = DEFAULT_PROMPT_TOKENS.get(backend, 0) if prompt_tokens is None else prompt_tokens
    w = _decide(backend, settings, on, size)
    return replace(w, timeout_s=float(timeout) if timeout is not None else default_timeout(size))


def _decide(backend: str, settings: ServerSettings, on: bool | None, size: int) -> WarmUp:
    if not (settings.draft or settings.hf_draft):
        return WarmUp(False, size, "no draft")
    given = next((a for a in settings.extra_args if a.split("=", 1)[0] in _NO_WARMUP_ARGS), None)
    if given:
        return WarmUp(False, size, f"'{given}' given to llama-server")
    if on is not None:
        return WarmUp(on, size, "--warmup" if on else "--no-warmup")
    if backend in DEFAULT_PROMPT_TOKENS:
        return WarmUp(True, size, f"default for {backend}: a GPU's first request pays its first launches")
    if backend == "cpu":
        return WarmUp(False, size, "default for cpu: the first request measured no slower without it")
    return WarmUp(False, size, f"default for {backend}: not measured there; --warmup turns it on")


class WarmUpDeath(Exception):
    """The engine died on the warm-up request: it never was ready. The message says how (its exit
    and its own last error line)."""


def slot_context(client: Client) -> int | None:
    """A slot's context in tokens, as the server's ``/props`` gives it (None: not said)."""
    try:
        n = client.props().get("default_generation_settings", {}).get("n_ctx")
    except (EngineError, ValueError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def _long_text() -> str:
    """The warm-up's long prompt text: the load benchmark's prompt set, one prompt after another."""
    parts = []
    for it in traffic.traffic_items():
        parts += [m["content"] for m in it.messages if isinstance(m.get("content"), str)]
    return "\n\n".join(parts)


def prompt_ids(client: Client, prompt_tokens: int) -> list[int]:
    """The warm-up's prompt: ``WARMUP_PROMPT`` for ``prompt_tokens`` 0, else the first
    ``prompt_tokens`` tokens of ``_long_text``, fewer where a slot holds fewer (room left for the
    answer), never fewer than the short prompt's."""
    short = client.tokenize(WARMUP_PROMPT, add_special=True)
    if prompt_tokens <= 0:
        return short
    slot = slot_context(client)
    n = min(prompt_tokens, slot - WARMUP_TOKENS - 1) if slot else prompt_tokens
    if n <= len(short):
        return short
    text = _long_text()
    size = n * 8  # characters: enough for n tokens at any usual tokenizer's rate; more where not
    while True:
        ids = client.tokenize((text * (size // len(text) + 1))[:size], add_special=True)
        if len(ids) >= n:
            return ids[:n]
        size *= 2


def warm_up(srv: ServerProcess, prompt_tokens: int = 0, timeout: float | None = None) -> tuple[float, int]:
    """One greedy ``WARMUP_TOKENS``-token request through the drafted path with a prompt of
    ``prompt_ids`` (prompt cache off, the end-of-text token ignored so every step runs); returns its
    seconds and its prompt's tokens.

    Raises:
        EngineError: the request failed (an HTTP error, no answer within ``timeout`` seconds;
            default: ``default_timeout`` of ``prompt_tokens``).
    """
    t0 = time.monotonic()
    client = srv.client(timeout=default_timeout(prompt_tokens) if timeout is None else timeout)
    ids = prompt_ids(client, prompt_tokens)
    client.complete(ids, n_predict=WARMUP_TOKENS, ignore_eos=True)
    return time.monotonic() - t0, len(ids)


def warmed(srv: ServerProcess, w: WarmUp, window: LogWindow | None,
           on_event: Callable[[str], None]) -> tuple[float, int] | None:
    """``warm_up`` where ``w.on``; its seconds and prompt tokens (None: not warmed). A failed
    warm-up of an engine that still runs is said and served through; an engine that died on it
    raises ``WarmUpDeath`` (it was never ready). The warm-up's request is not traffic: the stats
    window moves past it."""
    if not w.on:
        return None
    try:
        took = warm_up(srv, w.prompt_tokens, w.timeout_s)
    except EngineError as e:
        assert srv.proc is not None
        try:
            rc = srv.proc.wait(_WARMUP_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            on_event(f"warm-up request failed ({e}); serving without it")
            return None
        said = engine_error_line(srv.run_log_text())
        raise WarmUpDeath(f"{exit_cause(rc)} on the warm-up request" + (f": {said}" if said else "")) from None
    if window:
        # the engine logs the request's timings and release after its answer went out: wait for them
        # (a few seconds at most), so that no stats line counts the warm-up
        deadline = time.monotonic() + _WARMUP_LOG_WAIT_S
        while window.take().requests == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    return took


def note(took: tuple[float, int] | None) -> str:
    """The ready line's tail: how long the warm-up took and its prompt's size, or nothing."""
    return f", warmed up in {took[0]:.2f} s ({took[1]} prompt tokens)" if took is not None else ""


def record(took: tuple[float, int] | None) -> dict:
    """The ready record's warm-up keys: ``warmup_s`` and ``warmup_prompt_tokens`` (None: not warmed)."""
    return {"warmup_s": took[0] if took else None, "warmup_prompt_tokens": took[1] if took else None}
