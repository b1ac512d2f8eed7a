"""The lossless gate: each speculative output against the plain output of the same engine, token by
token; a difference at a near-tie is counted, anything else is a defect. Also the informational
comparison with the target's Hugging Face checkpoint under transformers."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark.errors import InputNotFoundError, MissingDependencyError
from ggufdspark.measuring.measure import Outcome, Turn
from ggufdspark.runners.client import Client


# A divergence is a near-tie when, at the first differing position, the plain run's top-1 and
# top-2 probabilities differ by less than this and the speculative token is the plain runner-up.
# Batched verification changes the reduction order of the target's matmuls; on F16/BF16 that moves
# logits by O(1e-2), which flips the argmax only when the two leaders are this close (a logit gap
# of about 0.2 at p ~ 0.5). Larger gaps cannot come from rounding: they are defects.
NEAR_TIE_GAP = 0.05


# --------------------------------------------------------------------------- the gate


@dataclass
class Divergence:
    """Where a speculative output first left the plain one, and how that was judged."""

    item: str
    category: str
    turn: int
    position: int
    plain_token: int | None
    spec_token: int | None
    plain_piece: str | None
    spec_piece: str | None
    p_top1: float | None
    p_top2: float | None
    top2_token: int | None
    kind: str  # "near-tie" | "defect"
    reason: str

    @property
    def gap(self) -> float | None:
        return None if self.p_top1 is None or self.p_top2 is None else self.p_top1 - self.p_top2

    def describe(self) -> str:
        probs = (f"plain top-2 p={self.p_top1:.4f} / {self.p_top2:.4f} (gap {self.gap:.4f})"
                 if self.gap is not None else "no plain probabilities")
        return (f"item {self.item!r} turn {self.turn + 1}, position {self.position}: plain "
                f"{self.plain_token} {self.plain_piece!r}, speculative {self.spec_token} {self.spec_piece!r}; "
                f"{probs}: {self.kind} ({self.reason})")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(turn: Turn, plain: list[int], spec: list[int], top: list[dict] | None, *,
             near_tie_gap: float = NEAR_TIE_GAP) -> Divergence | None:
    """Judge one request. ``top``: the plain run's ``top_logprobs`` at the first differing position
    (``[{"id", "token", "logprob"}, ...]``, best first). None when the outputs are identical."""
    i = first_difference(plain, spec)
    if i is None:
        return None
    pt = plain[i] if i < len(plain) else None
    st = spec[i] if i < len(spec) else None
    p1 = p2 = t2 = None
    pieces = {}
    if top:
        pieces = {c.get("id"): c.get("token") for c in top}
        p1 = math.exp(top[0]["logprob"])
        if len(top) > 1:
            p2, t2 = math.exp(top[1]["logprob"]), top[1].get("id")
    d = Divergence(turn.item, turn.category, turn.turn, i, pt, st, pieces.get(pt), pieces.get(st), p1, p2, t2,
                   "defect", "")
    if p1 is None or p2 is None:
        d.reason = "the plain run's top-2 probabilities at this position are unavailable"
    elif d.gap >= near_tie_gap:
        d.reason = f"gap {d.gap:.4f} >= near-tie threshold {near_tie_gap}"
    elif st is not None and st != t2 and st != top[0].get("id"):
        d.reason = "the speculative token is not among the plain run's top-2"
    else:
        d.kind, d.reason = "near-tie", f"gap {d.gap:.4f} < {near_tie_gap}"
    return d


@dataclass
class GateResult:
    """``status``: pass, fail, refused (synthetic acceptance) or off (--no-gate)."""

    status: str
    reason: str = ""
    requests: int = 0
    exact: int = 0
    near_ties: int = 0
    defects: int = 0
    near_tie_gap: float = NEAR_TIE_GAP
    divergences: list[Divergence] = field(default_factory=list)
    plain_unstable: int = 0  # requests whose two plain runs differed (engine nondeterminism)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["divergences"] = [{**asdict(x), "gap": x.gap} for x in self.divergences]
        return d


def top_logprobs_by_position(tokens: list[int], probs: list[dict]) -> dict[int, list[dict]]:
    """The ``top_logprobs`` of a completion by token position. llama-server lists probabilities per
    piece of text it sends, and a token that ends inside a UTF-8 character waits for the next one:
    that piece's entry is its last token's (its ``id``), and the held-back tokens have none. Entries
    are matched to positions from the end, so an entry goes to the last token of its piece."""
    if len(probs) == len(tokens):
        return {i: e.get("top_logprobs") or [] for i, e in enumerate(probs)}
    out: dict[int, list[dict]] = {}
    t = len(tokens) - 1
    for e in reversed(probs):
        while t >= 0 and tokens[t] != e.get("id"):
            t -= 1
        if t < 0:
            break
        out[t] = e.get("top_logprobs") or []
        t -= 1
    return out


def _probs_at(probe, i: int) -> list[dict] | None:
    """The ``top_logprobs`` of the probe's token ``i`` (its last: the probe asks for ``i + 1``), or
    None when the server sent none for it."""
    return top_logprobs_by_position(list(probe.tokens or []), probe.probs or []).get(i)


def run_gate(client: Client, turns: list[Turn], plain: list[Outcome], spec: list[Outcome],
             plain_again: list[Outcome], *, near_tie_gap: float = NEAR_TIE_GAP) -> GateResult:
    """Compare speculative and plain outputs; probe the plain server at each first difference."""
    g = GateResult("pass", requests=len(turns), near_tie_gap=near_tie_gap)
    for t, p, s, p2 in zip(turns, plain, spec, plain_again):
        if p.tokens != p2.tokens:
            g.plain_unstable += 1
        i = first_difference(p.tokens, s.tokens)
        if i is None:
            g.exact += 1
            continue
        probe = client.complete(t.prompt, n_predict=i + 1, n_probs=2)
        top = _probs_at(probe, i)
        d = classify(t, p.tokens, s.tokens, top, near_tie_gap=near_tie_gap)
        assert d is not None
        g.divergences.append(d)
        if d.kind == "near-tie":
            g.near_ties += 1
        else:
            g.defects += 1
    if g.defects:
        g.status = "fail"
    return g


# --------------------------------------------------------------------------- informational reference


def check_reference(hf_dir: str | Path) -> Path:
    """What the reference run needs, checked before any measuring: a checkpoint directory with a
    ``config.json``, and torch and transformers importable. Returns the directory.

    Raises:
        InputNotFoundError: no such directory, or no config.json in it.
        MissingDependencyError: torch or transformers cannot be imported (the message names which).
    """
    p = Path(hf_dir)
    if not p.is_dir():
        what = "not a directory" if p.exists() else "no such directory"
        raise InputNotFoundError(f"--reference-hf {p}: {what} (expected the target's Hugging Face checkpoint)")
    if not (p / "config.json").is_file():
        raise InputNotFoundError(f"--reference-hf {p}: no config.json: not a Hugging Face checkpoint directory")
    for module in ("torch", "transformers"):
        try:
            __import__(module)
        except (ImportError, OSError) as e:  # absent, or installed but broken (a missing shared library)
            raise MissingDependencyError(f"--reference-hf {p}: needs torch and transformers, and {module} cannot be "
                                         f"imported ({e}): pip install torch transformers") from None
    return p


def reference_run(hf_dir: str | Path, turns: list[Turn], plain: list[Outcome], n_predict: int) -> dict:
    """Greedy outputs of the target's HF checkpoint under transformers on CPU (float32), compared
    with the plain llama.cpp outputs. Informational only: two runtimes round differently, so
    near-ties may break differently; nothing here fails the run.

    Raises:
        InputNotFoundError, MissingDependencyError: see ``check_reference`` (bench calls it first).
    """
    p = check_reference(hf_dir)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    rows = []
    for t, o in zip(turns, plain):
        if not isinstance(t.prompt, list):
            rows.append({"item": t.item, "turn": t.turn, "status": "skipped (image prompt)"})
            continue
        with torch.no_grad():
            ids = torch.tensor([t.prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_predict,
                                 do_sample=False, pad_token_id=next(iter(eos_ids), 0))
        ref = [int(x) for x in out[0, len(t.prompt):]]
        while ref and ref[-1] in eos_ids:
            ref.pop()
        mine = [x for x in o.tokens]
        while mine and mine[-1] in eos_ids:
            mine.pop()
        i = first_difference(ref, mine)
        rows.append({"item": t.item, "turn": t.turn, "status": "exact" if i is None else "differs",
                     "position": i, "reference_tokens": len(ref)})
    exact = sum(r["status"] == "exact" for r in rows)
    differs = sum(r["status"] == "differs" for r in rows)
    return {"runtime": f"transformers {__import__('transformers').__version__} CPU float32", "checkpoint": str(p),
            "exact": exact, "differs": differs, "rows": rows,
            "note": "informational: differences between runtimes never fail the run"}
