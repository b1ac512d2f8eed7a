"""Does the engine draft what the checkpoint drafts? The served pair against the torch reference.

For a greedy request the engine's answer is the target's greedy text, and each verify step starts a
block at the last accepted token (the anchor) and accepts the longest prefix of the draft that the
target agrees with. Given the answer, ``ggufdspark.trained.nets.DSparkDrafter.draft`` computes the
block the checkpoint drafts at every one of those anchors, so the accepted count of each step follows
from the torch model alone. The engine logs its own count per step (``accepted A/N draft tokens`` at
``-v``); equal counts at a step mean the engine drafted the same tokens as the checkpoint up to and
including the first one the target refused (or the whole block). This checks ``convert``'s GGUF and
the engine's draft graph (taps, context injection, positions, attention, Markov chain) against the
checkpoint itself, not against another converter. A block where the two differ is classified as a
near-tie when the torch drafter's top-2 at the first differing slot are within ``tie_margin``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ACCEPTED_RE = re.compile(r"accepted (\d+)/(\d+) draft tokens")


@dataclass
class Block:
    anchor: int  # position of the anchor token
    n_draft: int
    engine: int  # accepted, as the engine logged it
    torch: int  # accepted, as the checkpoint drafts it
    torch_ids: list[int] = field(default_factory=list)
    near_tie: bool = False

    @property
    def same(self) -> bool:
        return self.engine == self.torch


@dataclass
class Request:
    prompt_tokens: int
    answer: list[int]
    blocks: list[Block]

    @property
    def agree(self) -> int:
        return sum(b.same for b in self.blocks)


def engine_steps(log_text: str) -> list[tuple[int, int]]:
    """(accepted, drafted) for each verify step in a ``-v`` engine log, in order."""
    return [(int(a), int(n)) for a, n in ACCEPTED_RE.findall(log_text)]


def compare(model, drafter, prompt: list[int], answer: list[int], steps: list[tuple[int, int]],
            layer_inputs: list[int], tie_margin: float = 0.05) -> Request:
    """Replay the engine's steps (``steps``: its accepted/drafted counts for this request) on the
    torch pair; ``answer``: the engine's generated ids."""
    import torch

    from ggufdspark.trained.nets import Taps

    dev = next(drafter.parameters()).device
    tokens = torch.tensor(prompt + answer, dtype=torch.long, device=dev)
    taps = Taps(model, layer_inputs)
    with torch.no_grad():
        feats = taps(model, tokens[None])[0].float()
    taps.close()
    a, blocks = len(prompt), []
    for accepted, n_draft in steps:
        if a + 1 >= tokens.shape[0]:
            break
        ids, _ = drafter.draft(feats, tokens, a, n_draft)
        m = 0
        while m < n_draft and a + 1 + m < tokens.shape[0] and ids[m] == int(tokens[a + 1 + m]):
            m += 1
        b = Block(a, n_draft, accepted, m, ids)
        if not b.same:
            b.near_tie = _near_tie(drafter, feats, tokens, a, n_draft, min(accepted, m), tie_margin)
        blocks.append(b)
        a += accepted + 1  # the engine's path: its accepted tokens and the target's own next one
    return Request(len(prompt), answer, blocks)


def _near_tie(drafter, feats, tokens, anchor: int, n_draft: int, slot: int, margin: float) -> bool:
    """Whether the torch drafter's top-2 at ``slot`` are within ``margin`` (probability)."""
    import torch

    logits, _, _ = drafter.blocks(feats[None], tokens[None], torch.tensor([[anchor]], device=tokens.device), n_draft)
    prev = tokens[anchor + slot]  # teacher-forced: the slots before agree with the answer
    bias, _ = drafter.markov_bias(prev[None])
    p = torch.softmax(logits[0, 0, slot].float() + bias[0].float(), -1)
    top = torch.topk(p, 2).values
    return float(top[0] - top[1]) < margin
