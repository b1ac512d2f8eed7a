"""The lossless checks shared by the tests: greedy output with the draft equals output without it, or
leaves it only at a near-tie; and the closed-loop clients that load a server for them."""

from __future__ import annotations

import math
import threading

from ggufdspark.measuring.gate import top_logprobs_by_position
from ggufdspark.runners.client import Client


def drafted_greedy_equal(plain: Client, spec: Client, prompts: list[str], *, n_predict: int,
                         tokenize: bool = True, label: str = "") -> int:
    """Complete every prompt on both servers (greedy) and assert the same tokens, and no drafting
    on the plain one; returns how many tokens the draft proposed (callers assert it engaged).
    ``tokenize``: send the plain server's token ids rather than the text, so both see one input."""
    drafted = 0
    for prompt in prompts:
        sent = plain.tokenize(prompt) if tokenize else prompt
        a = plain.complete(sent, n_predict=n_predict)
        b = spec.complete(sent, n_predict=n_predict)
        assert a.tokens == b.tokens, f"{label}prompt {prompt!r}: plain {a.tokens} vs draft {b.tokens}"
        assert a.timings.draft_n is None
        drafted += b.timings.draft_n or 0
    return drafted


def assert_same_or_near_tie(plain: dict, tokens: list[int], what: str) -> None:
    """``tokens`` equal the plain run's, or first differ where the plain run's top-2 were a near-tie."""
    if plain["tokens"] == tokens:
        return
    k = next((j for j, (a, b) in enumerate(zip(plain["tokens"], tokens)) if a != b), None)
    assert k is not None, f"{what}: output length differs ({len(plain['tokens'])} vs {len(tokens)} tokens)"
    top = top_logprobs_by_position(plain["tokens"], plain["completion_probabilities"]).get(k)
    assert top, f"{what}: differs from the plain output at token {k}, a token the server sent no probabilities for"
    gap = math.exp(top[0]["logprob"]) - math.exp(top[1]["logprob"])
    assert gap < 0.05, f"{what}: differs from the plain output at token {k} (plain top-2 gap {gap:.4f}: not a near-tie)"


def all_at_once(fn, args) -> None:
    """``fn(arg)`` for every ``arg`` of ``args``, each in a thread of its own, all started before any
    is waited for."""
    threads = [threading.Thread(target=fn, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def closed_loop(srv, queues: list[list[tuple[int, object, int]]]) -> dict[int, dict]:
    """One client a queue, each sending its next request as soon as its previous answer ended (how a
    server's clients load it, not a lock-step wave): greedy, the top-2 probabilities kept for a
    near-tie check; every answer (or its error) by request id. A prompt is token ids, or a multimodal
    prompt (``prompt_string`` and ``multimodal_data``)."""
    client = srv.client(timeout=600)
    out: dict[int, dict] = {}

    def run(queue) -> None:
        for rid, prompt, n in queue:
            try:
                out[rid] = client.post_json("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0.0,
                                                            "ignore_eos": True, "cache_prompt": False,
                                                            "return_tokens": True, "n_probs": 2})
            except Exception as e:  # noqa: BLE001 - the assertion names it
                out[rid] = {"error": repr(e)}

    all_at_once(run, queues)
    return out
