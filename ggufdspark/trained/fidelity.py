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

DRAFT_RE = re.compile(r"task (\d+) \| generate_draft: id=(\d+), #tokens=\d+, #draft=\d+, pos_next=(\d+)")
ACCEPTED_RE = re.compile(r"task (\d+) \| accepted (\d+)/(\d+) draft tokens, new n_tokens = (\d+)")


@dataclass
class Step:
    """One verify step of a request, as the engine's ``-v`` log tells it."""

    anchor: int  # position of the anchor (the last sampled token) in the request's tokens
    anchor_id: int
    accepted: int
    n_draft: int
    after_pause: bool = False  # the slot decoded without drafting since its previous drafted step


@dataclass
class Block:
    anchor: int  # position of the anchor token
    n_draft: int
    engine: int  # accepted, as the engine logged it
    torch: int  # accepted, as the checkpoint drafts it
    torch_ids: list[int] = field(default_factory=list)
    near_tie: bool = False
    after_pause: bool = False

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


def engine_steps(log_text: str) -> dict[int, list[Step]]:
    """Every task's drafted steps in a ``-v`` engine log, in order: the anchor's position and id
    (``generate_draft``) and the accepted count (``accepted A/N draft tokens``)."""
    events = sorted([(m.start(), "d", m) for m in DRAFT_RE.finditer(log_text)] +
                    [(m.start(), "a", m) for m in ACCEPTED_RE.finditer(log_text)], key=lambda e: e[0])
    pending: dict[int, tuple[int, int]] = {}
    out: dict[int, list[Step]] = {}
    last_end: dict[int, int] = {}
    for _, kind, m in events:
        task = int(m.group(1))
        if kind == "d":
            pending[task] = (int(m.group(3)), int(m.group(2)))
            continue
        if task not in pending:
            continue
        pos, anchor_id = pending.pop(task)
        accepted, n_draft, n_tokens = int(m.group(2)), int(m.group(3)), int(m.group(4))
        paused = task in last_end and pos > last_end[task]
        out.setdefault(task, []).append(Step(pos, anchor_id, accepted, n_draft, paused))
        last_end[task] = n_tokens
    return out


def steps_of(tasks: dict[int, list[Step]], prompt: list[int], answer: list[int]) -> list[Step]:
    """The steps of the task that served this request: the one whose anchors are this request's
    tokens at their positions (requests are told apart by their tokens, not by the log's task ids)."""
    tokens = prompt + answer
    for steps in tasks.values():
        if steps and steps[0].anchor >= len(prompt) and all(
                s.anchor < len(tokens) and tokens[s.anchor] == s.anchor_id for s in steps):
            return steps
    raise LookupError(f"no task in the log drafted for the request of {len(prompt)} prompt tokens")


def compare(model, drafter, prompt: list[int], answer: list[int], steps: list[Step],
            layer_inputs: list[int], tie_margin: float = 0.05) -> Request:
    """Replay the engine's steps for one request on the torch pair: at each step's anchor, the
    block the checkpoint drafts and how much of it the answer (the target's greedy text) accepts."""
    import torch

    from ggufdspark.trained.nets import Taps

    dev = next(drafter.parameters()).device
    tokens = torch.tensor(prompt + answer, dtype=torch.long, device=dev)
    taps = Taps(model, layer_inputs)
    with torch.no_grad():
        feats = taps(model, tokens[None])[0].float()
    taps.close()
    blocks = []
    for st in steps:
        a = st.anchor
        if a + 1 >= tokens.shape[0]:
            break
        ids, _ = drafter.draft(feats, tokens, a, st.n_draft)
        m = 0
        while m < st.n_draft and a + 1 + m < tokens.shape[0] and ids[m] == int(tokens[a + 1 + m]):
            m += 1
        b = Block(a, st.n_draft, st.accepted, m, ids, after_pause=st.after_pause)
        if not b.same:
            b.near_tie = _near_tie(drafter, feats, tokens, a, st.n_draft, min(st.accepted, m), tie_margin)
        blocks.append(b)
    return Request(len(prompt), answer, blocks)


def _near_tie(drafter, feats, tokens, anchor: int, n_draft: int, slot: int, margin: float) -> bool:
    """Whether the torch drafter's top-2 at ``slot`` are within ``margin`` (probability)."""
    import torch

    with torch.no_grad():
        return _top2_close(drafter, feats, tokens, anchor, n_draft, slot, margin)


def _top2_close(drafter, feats, tokens, anchor: int, n_draft: int, slot: int, margin: float) -> bool:
    import torch

    logits, _, _ = drafter.blocks(feats[None], tokens[None], torch.tensor([[anchor]], device=tokens.device), n_draft)
    prev = tokens[anchor + slot]  # teacher-forced: the slots before agree with the answer
    bias, _ = drafter.markov_bias(prev[None])
    p = torch.softmax(logits[0, 0, slot].float() + bias[0].float(), -1)
    top = torch.topk(p.detach(), 2).values
    return float(top[0] - top[1]) < margin
