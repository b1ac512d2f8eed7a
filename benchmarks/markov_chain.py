#!/usr/bin/env python3
"""How much of ``markov_w2`` a DSpark draft's greedy Markov chain needs, on the trained pair that ships
here (``ggufdspark/data/trained``), in torch.

Position i of a greedy block drafts argmax(head_i + w2 . w1[prev]): every position reads all of
``markov_w2`` (65.5 MB at LFM2.5-VL-3B's vocabulary 128000 and rank 256; 214 us a block on an H100,
engine patch 0065). Two ways to read less, measured here on real (trained) weights, which the
generated benchmark pairs do not have:

* the chain restricted to the head's top K logits (K rows of ``markov_w2`` a position): the accept
  length it gives against the exact chain's, replaying speculative steps on the target's own greedy
  continuations of held-out prompts (as ``ggufdspark.trained.recipe.simulate`` counts them);
* an exact restriction: the head's top K scored exactly, and a Cauchy-Schwarz bound
  (``head[v] + |scale| |w2[v]| |w1[prev]|``) proving no other row can win. How often the proof holds,
  and the share of rows whose own bound reaches the best score (what a kernel that skips by that
  bound would still read).

    python benchmarks/markov_chain.py [--prompts N] [--k 16,64,256,1024] [--json out.json]

Prints a table; ``--json`` writes the numbers. CPU is enough (a few minutes for the default prompts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from ggufdspark.errors import InvalidArgumentError  # noqa: E402
from ggufdspark.trained import shipped  # noqa: E402

MARGIN = 1e-3  # relative slack on each bound, for the rounding of a computed dot product


def load_pair():
    """The shipped pair in torch: (target, drafter, tapped layer inputs, tokenizer)."""
    from tokenizers import Tokenizer

    from ggufdspark.trained import checkpoints

    if not shipped.available():
        raise InvalidArgumentError(f"{shipped.DATA}: this checkout has no trained pair")
    model, _ = checkpoints.load_hf_target(shipped.DATA / "target")
    drafter, dcfg = checkpoints.load_drafter(shipped.DATA / "drafter", model.model.embed_tokens.weight)
    layers = [t + 1 for t in dcfg["dflash_config"]["target_layer_ids"]]
    return model, drafter, layers, Tokenizer.from_file(str(shipped.DATA / "target" / "tokenizer.json"))


def chain(drafter, head, prev, n_draft: int, k: int | None, stats: dict | None = None) -> list[int]:
    """The greedy chain of one block: ``head`` [n_draft, vocab] logits, ``prev`` the anchor id. With ``k``
    the argmax is taken over the head's top k only. ``stats`` (exact chain only) gathers, for each
    position and each K in ``stats["ks"]``, whether the exact winner is in the head's top K and whether
    the bound proves it, and the share of rows whose own bound reaches the winning score."""
    import torch

    w2_norm = stats["w2_norm"] if stats is not None else None
    out = []
    for i in range(n_draft):
        bias, w1p = drafter.markov_bias(prev[None])
        col = head[i] + bias[0].float()
        if k is None:
            best = col.argmax()
        else:
            cand = torch.topk(head[i], k).indices
            best = cand[col[cand].argmax()]
        if stats is not None:
            reach = float(w1p[0].float().norm()) * (1 + MARGIN)
            order = torch.argsort(head[i], descending=True)
            score = float(col[best])
            stats["read"].append(float((head[i] + w2_norm * reach >= score).float().mean()))
            rank = int((order == best).nonzero()[0])
            for kk in stats["ks"]:
                kth = float(head[i][order[kk - 1]]) if kk < order.numel() else float("-inf")
                stats["in_top"][kk] += rank < kk
                stats["proved"][kk] += score > kth + float(w2_norm.max()) * reach + MARGIN
            stats["positions"] += 1
        out.append(int(best))
        prev = best
    return out


def measure(prompts: list[str], ks: list[int], n_draft: int = 7, answer: int = 128) -> dict:
    import torch

    from ggufdspark.trained.nets import Taps
    from ggufdspark.trained.recipe import greedy

    model, drafter, layers, tok = load_pair()
    w2 = drafter.markov_head.markov_w2.weight.detach().float()
    vocab, rank = w2.shape
    ks = [k for k in ks if 0 < k <= vocab]
    stats = {"ks": ks, "w2_norm": w2.norm(dim=1), "read": [], "positions": 0,
             "in_top": {k: 0 for k in ks}, "proved": {k: 0 for k in ks}}
    arms: dict[str, list[int]] = {"exact": [0, 0], **{f"top-{k}": [0, 0] for k in ks}}  # accepted, steps
    for text in prompts:
        ids = tok.encode(text).ids[-256:]
        seq = greedy(model, torch.tensor([ids]), answer)[0]
        taps = Taps(model, layers)
        with torch.no_grad():
            feats = taps(model, seq[None])[0].float()
        taps.close()
        with torch.no_grad():
            for name in arms:
                k = None if name == "exact" else int(name[4:])
                a = len(ids) - 1
                while a + n_draft + 1 < seq.shape[0]:
                    head = drafter.blocks(feats[None], seq[None], torch.tensor([[a]]), n_draft)[0][0, 0].float()
                    d = chain(drafter, head, seq[a], n_draft, k, stats if k is None else None)
                    m = 0
                    while m < n_draft and d[m] == int(seq[a + 1 + m]):
                        m += 1
                    arms[name][0] += m
                    arms[name][1] += 1
                    a += m + 1
    n = stats["positions"]
    read = sorted(stats["read"])
    return {
        "pair": "the trained pair (ggufdspark/data/trained)", "vocab": vocab, "rank": rank,
        "draft_length": n_draft, "prompts": len(prompts), "answer_tokens": answer,
        "w2_row_norm": {"max": round(float(stats["w2_norm"].max()), 4),
                        "median": round(float(stats["w2_norm"].median()), 4)},
        "accept_length": {name: round(1 + acc / steps, 4) for name, (acc, steps) in arms.items()},
        "steps": {name: steps for name, (_, steps) in arms.items()},
        "exact_chain_positions": n,
        "winner_in_head_top_k": {str(k): round(stats["in_top"][k] / n, 4) for k in ks},
        "proved_exact_by_bound": {str(k): round(stats["proved"][k] / n, 4) for k in ks},
        "rows_read_by_bound": {"mean": round(statistics.mean(read), 4), "median": round(read[len(read) // 2], 4),
                               "p90": round(read[int(0.9 * (len(read) - 1))], 4)},
    }


def table(r: dict) -> str:
    lines = [f"{r['pair']}: vocabulary {r['vocab']}, rank {r['rank']}, draft length {r['draft_length']}, "
             f"{r['prompts']} prompts x {r['answer_tokens']} greedy tokens",
             "| chain | accept length | steps | exact winner in the head's top K | proved exact by the bound |",
             "|---|---:|---:|---:|---:|",
             f"| exact | {r['accept_length']['exact']:.4f} | {r['steps']['exact']} | - | - |"]
    for k, p in r["winner_in_head_top_k"].items():
        lines.append(f"| top-{k} | {r['accept_length'][f'top-{k}']:.4f} | {r['steps'][f'top-{k}']} | {p:.4f} | "
                     f"{r['proved_exact_by_bound'][k]:.4f} |")
    b = r["rows_read_by_bound"]
    lines.append(f"rows a per-row bound leaves to read: mean {b['mean']:.4f}, median {b['median']:.4f}, p90 {b['p90']:.4f} "
                 f"(of {r['exact_chain_positions']} positions)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=0, help="held-out prompts to use (0: all that ship)")
    ap.add_argument("--k", default="16,64,256,1024", help="comma-separated K of the restricted chain")
    ap.add_argument("--answer-tokens", type=int, default=128, help="greedy tokens the target continues each prompt")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    a = ap.parse_args(argv)
    try:
        ks = [int(x) for x in a.k.split(",") if x.strip()]
    except ValueError:
        print(f"markov_chain.py: --k {a.k}: expected comma-separated integers", file=sys.stderr)
        return 2
    prompts = shipped.prompts() + json.loads((shipped.DATA / "more-prompts.json").read_text())
    if a.prompts:
        prompts = prompts[:a.prompts]
    try:
        r = measure(prompts, ks, answer=a.answer_tokens)
    except InvalidArgumentError as e:
        print(f"markov_chain.py: {e}", file=sys.stderr)
        return 1
    print(table(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
