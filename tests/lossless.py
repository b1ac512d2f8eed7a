"""The lossless check shared by the tests: greedy output with the draft equals output without it."""

from __future__ import annotations

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
