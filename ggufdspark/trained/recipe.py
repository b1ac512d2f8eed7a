"""Train the small LFM2 target and its DSpark drafter; write both in the published Hub layout.

    python -m ggufdspark.trained.recipe corpus WORK            # tokenizer + token streams (CPU, a minute)
    python -m ggufdspark.trained.recipe train WORK --size gpu  # target, distillation, drafter (GPU: ~8 min)
    python -m ggufdspark.trained.recipe train WORK --size cpu  # a smaller pair on a 2-core CPU (hours)

Steps (each writes under WORK and logs its losses):

1. **target**: ``Lfm2ForCausalLM`` (transformers) of the size's shape on random windows of the
   training stream, AdamW, cosine schedule, bf16 autocast on a GPU.
2. **distill**: the target's own greedy continuations of prompts cut from the training stream
   (prompt lengths 32-320, ``gen`` new tokens): what the drafter must predict when serving greedily.
3. **drafter**: ``ggufdspark.trained.nets.DSparkDrafter`` on those sequences, K anchors a sequence
   placed in the generated part, the block objective of ``nets.DSparkDrafter.loss``; the target's
   taps come from forward pre-hooks on the frozen target.
4. **eval**: accept length per position on held-out prompts, simulated greedily in torch (draft
   length ``eval_draft``), and a few greedy continuations to read.
5. **export**: ``WORK/pair/target`` and ``WORK/pair/drafter`` (BF16 safetensors, config, tokenizer)
   plus ``WORK/pair/recipe.json`` (shapes, steps, losses, timings, acceptance).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ggufdspark.trained.checkpoints import hf_target, load_drafter, load_hf_target, save, save_sharded

log = logging.getLogger("ggufdspark.trained")


@dataclass
class Size:
    """One recipe size: the target's and drafter's shapes and the training budget."""

    hidden: int = 256
    layers: int = 8
    attention_layers: tuple[int, ...] = (2, 5, 7)
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 768
    seq: int = 512
    target_steps: int = 1500
    target_batch: int = 64
    target_lr: float = 3e-3
    target_seconds: float = 200.0  # a cap: training stops there even before target_steps
    gen_batches: int = 48
    gen_batch: int = 1024
    # distillation stops at this time cap too: the drafter must see every sequence only a few times,
    # or it learns them by heart (its first trained pair reached 77% per slot on its own data and 38%
    # on fresh continuations: 4096 sequences, 23 passes)
    distill_seconds: float = 150.0
    gen: int = 192
    d_layers: int = 2
    d_heads: int = 4
    d_kv_heads: int = 2
    d_head_dim: int = 64
    d_ffn: int = 768
    taps: tuple[int, ...] = (1, 3, 5, 6)
    block_size: int = 9
    markov_rank: int = 32
    drafter_steps: int = 6000
    drafter_batch: int = 32
    anchors: int = 16
    drafter_lr: float = 2e-3
    drafter_seconds: float = 210.0
    eval_prompts: int = 32
    eval_draft: int = 8


SIZES = {
    "gpu": Size(),
    # the CPU size: a quarter of the work per step, fewer steps; hours on 2 cores
    "cpu": replace(Size(), hidden=192, layers=6, attention_layers=(2, 4), heads=3, kv_heads=1, ffn=512, seq=256,
                   target_steps=4000, target_batch=16, target_seconds=3 * 3600.0, gen_batches=8, gen_batch=256,
                   gen=128, distill_seconds=1800.0, d_ffn=512, d_heads=3, d_kv_heads=1, taps=(1, 3, 4), drafter_steps=3000,
                   drafter_batch=8, anchors=8, drafter_seconds=2 * 3600.0, eval_prompts=16),
    # a few minutes on a CPU: a pair that predicts a little, to check the engine against the reference
    "mini": replace(Size(), hidden=128, layers=4, attention_layers=(1, 3), heads=2, kv_heads=1, ffn=384, seq=160,
                    target_steps=500, target_batch=16, target_lr=3e-3, target_seconds=200.0, gen_batches=4,
                    gen_batch=32, gen=64, d_layers=1, d_heads=2, d_kv_heads=1, d_head_dim=64, d_ffn=256, taps=(0, 2),
                    markov_rank=16, drafter_steps=300, drafter_batch=16, anchors=8, drafter_seconds=150.0,
                    eval_prompts=4, eval_draft=6),
    # a smoke size for tests: seconds on a CPU, predicts nothing
    "smoke": replace(Size(), hidden=64, layers=4, attention_layers=(1, 3), heads=2, kv_heads=1, ffn=128, seq=64,
                     target_steps=4, target_batch=2, gen_batches=1, gen_batch=4, gen=24, d_layers=1, d_heads=2,
                     d_kv_heads=1, d_head_dim=32, d_ffn=128, taps=(0, 2), block_size=5, markov_rank=8,
                     drafter_steps=4, drafter_batch=2, anchors=2, eval_prompts=2, eval_draft=4),
}


def _device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def target_config(size: Size, ids: dict[str, int], vocab: int) -> dict:
    """The target's config.json: the layout ``generate`` writes for every LFM2 target."""
    from ggufdspark.shapes import TargetSpec
    from ggufdspark.synthetic.synth import target_config as synth_config

    spec = TargetSpec(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.ffn,
                      num_hidden_layers=size.layers, attention_layers=size.attention_layers,
                      num_attention_heads=size.heads, num_key_value_heads=size.kv_heads,
                      max_position_embeddings=32768)
    return synth_config(spec, ids, "BF16")


def drafter_config(size: Size, tcfg: dict, mask_id: int) -> dict:
    from ggufdspark.shapes import DrafterSpec
    from ggufdspark.synthetic.synth import drafter_config as synth_config

    spec = DrafterSpec(num_hidden_layers=size.d_layers, num_attention_heads=size.d_heads,
                       num_key_value_heads=size.d_kv_heads, head_dim=size.d_head_dim, intermediate_size=size.d_ffn,
                       target_layer_ids=size.taps, block_size=size.block_size, markov_rank=size.markov_rank)
    return synth_config(tcfg, spec, mask_id)


def _windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    starts = rng.integers(0, stream.size - length - 1, size=n)
    return np.stack([stream[s:s + length] for s in starts]).astype(np.int64)


def _cosine(step: int, total: int, warmup: int, elapsed: float = 0.0, budget: float = float("inf")) -> float:
    """Linear warm-up, then cosine down to a tenth, over whichever runs out first: the steps or the
    time budget (so a slower machine still ends its schedule where the budget cuts it)."""
    if step < warmup:
        return (step + 1) / warmup
    done = max((step - warmup) / max(1, total - warmup), elapsed / budget)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done)))


def train_target(work: Path, size: Size, facts: dict) -> dict:
    import torch

    dev = _device()
    tok_dir = work / "corpus" / "tokenizer"
    from ggufdspark.synthetic.tokenizer import added_ids

    ids = added_ids(tok_dir / "tokenizer.json")
    vocab = facts["vocab_size"]
    cfg = target_config(size, ids, vocab)
    torch.manual_seed(0)
    model = hf_target(cfg).to(dev)
    train = np.load(work / "corpus" / "train.npy")
    held = np.load(work / "corpus" / "heldout.npy")
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW(model.parameters(), lr=size.target_lr, betas=(0.9, 0.95), weight_decay=0.1)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    t0, losses, step = time.time(), [], 0
    model.train()
    for step in range(size.target_steps):
        for gparam in opt.param_groups:
            gparam["lr"] = size.target_lr * _cosine(step, size.target_steps, min(200, size.target_steps // 10 + 1),
                                                    time.time() - t0, size.target_seconds)
        x = torch.from_numpy(_windows(train, size.target_batch, size.seq + 1, rng)).to(dev)
        with amp:
            out = model(input_ids=x[:, :-1], labels=x[:, :-1].clone(), use_cache=False)
        # transformers shifts labels itself: labels == input_ids
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        if step % 100 == 0 or step == size.target_steps - 1:
            log.info("target step %d/%d loss %.3f (%.0f s)", step, size.target_steps, np.mean(losses[-50:]),
                     time.time() - t0)
        if time.time() - t0 > size.target_seconds:
            log.info("target: time cap reached at step %d", step)
            break
    model.eval()
    with torch.no_grad(), amp:
        hx = torch.from_numpy(_windows(held, min(64, size.target_batch * 4), size.seq + 1,
                                       np.random.default_rng(1))).to(dev)
        held_loss = float(model(input_ids=hx[:, :-1], labels=hx[:, :-1].clone(), use_cache=False).loss)
    log.info("target: held-out loss %.3f", held_loss)
    out = work / "pair" / "target"
    out.mkdir(parents=True, exist_ok=True)
    save_sharded(model.state_dict(), out, skip=("lm_head.weight",))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tok_dir / f, out / f)
    return {"steps": step + 1, "seconds": round(time.time() - t0, 1), "train_loss": round(float(np.mean(losses[-50:])), 4),
            "heldout_loss": round(held_loss, 4), "tokens_seen": (step + 1) * size.target_batch * size.seq,
            "parameters": sum(p.numel() for n, p in model.named_parameters() if n != "lm_head.weight")}


def greedy(model, prompts, n_new: int):
    """Greedy continuations, [N, P + n_new] (``prompts``: [N, P]), exactly ``n_new`` tokens each:
    transformers' ``generate`` with its cache, or (where that fails) the whole sequence run again for
    each token."""
    import torch

    with torch.no_grad():
        try:
            return model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                  max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=0, use_cache=True)
        except Exception as e:  # an API change of transformers: the slow way still gives the same tokens
            log.warning("generate() failed (%s): greedy without a cache", str(e).splitlines()[0][:200])
        seq = prompts
        for _ in range(n_new):
            logits = model(input_ids=seq, use_cache=False).logits[:, -1]
            seq = torch.cat((seq, logits.argmax(-1, keepdim=True)), dim=1)
    return seq


def distill(work: Path, size: Size, model) -> list[tuple[int, "object"]]:
    """Batches of (prompt length, [N, P + gen] token ids): the target's own greedy continuations."""
    import torch

    dev = _device()
    # prompts from files the target never trained on (as users' prompts are), half of them, and from
    # its training files: a target recites what it memorised, and the drafter must follow both
    streams = [np.load(work / "corpus" / "distill.npy"), np.load(work / "corpus" / "train.npy")]
    rng = np.random.default_rng(2)
    lengths = [p for p in (32, 64, 128, 192, 256, 320) if p + size.gen <= size.seq] or [size.seq // 2]
    out, t0 = [], time.time()
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    for b in range(size.gen_batches):
        p = lengths[b % len(lengths)]
        prompts = torch.from_numpy(_windows(streams[b % 2], size.gen_batch, p, rng)).to(dev)
        with amp:
            seq = greedy(model, prompts, size.gen)
        out.append((p, seq))
        log.info("distill batch %d/%d (prompt %d) %.0f s", b + 1, size.gen_batches, p, time.time() - t0)
        if time.time() - t0 > size.distill_seconds:
            log.info("distill: time cap reached after %d batches", b + 1)
            break
    return out


def train_drafter(work: Path, size: Size, model, tcfg: dict, data) -> tuple[object, dict]:
    import torch

    from ggufdspark.synthetic.tokenizer import MASK_TOKEN, added_ids
    from ggufdspark.trained.nets import DrafterShape, DSparkDrafter, Taps

    dev = _device()
    mask_id = added_ids(work / "corpus" / "tokenizer" / "tokenizer.json")[MASK_TOKEN]
    dcfg = drafter_config(size, tcfg, mask_id)
    embed = model.model.embed_tokens.weight.detach()
    torch.manual_seed(1)
    drafter = DSparkDrafter(DrafterShape.from_config(dcfg), embed).to(dev)
    taps = Taps(model, [t + 1 for t in size.taps])
    opt = torch.optim.AdamW(drafter.parameters(), lr=size.drafter_lr, betas=(0.9, 0.95), weight_decay=0.01)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    rng = np.random.default_rng(3)
    t0, hist, step = time.time(), [], 0
    B = size.block_size
    for step in range(size.drafter_steps):
        for gparam in opt.param_groups:
            gparam["lr"] = size.drafter_lr * _cosine(step, size.drafter_steps, min(100, size.drafter_steps // 10 + 1),
                                                     time.time() - t0, size.drafter_seconds)
        p, seqs = data[int(rng.integers(len(data)))]
        rows = torch.from_numpy(rng.choice(seqs.shape[0], size=min(size.drafter_batch, seqs.shape[0]),
                                           replace=False)).to(seqs.device)
        tokens = seqs[rows]
        T = tokens.shape[1]
        anchors = torch.from_numpy(np.sort(rng.integers(p, T - B, size=(tokens.shape[0], size.anchors)), axis=1)).to(dev)
        with torch.no_grad(), amp:
            feats = taps(model, tokens)
        with amp:
            loss, info = drafter.loss(feats, tokens, anchors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        hist.append((float(loss), info["ce"], info["acc"]))
        if step % 100 == 0 or step == size.drafter_steps - 1:
            acc = np.mean([h[2] for h in hist[-50:]], axis=0)
            log.info("drafter step %d/%d loss %.3f ce %.3f slot acc %s (%.0f s)", step, size.drafter_steps,
                     np.mean([h[0] for h in hist[-50:]]), np.mean([h[1] for h in hist[-50:]]),
                     " ".join(f"{a:.2f}" for a in acc), time.time() - t0)
        if time.time() - t0 > size.drafter_seconds:
            log.info("drafter: time cap reached at step %d", step)
            break
    taps.close()
    out = work / "pair" / "drafter"
    out.mkdir(parents=True, exist_ok=True)
    save(drafter.state_dict(), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(dcfg, indent=2))
    acc = np.mean([h[2] for h in hist[-50:]], axis=0)
    return drafter.eval(), {"steps": step + 1, "seconds": round(time.time() - t0, 1),
                            "loss": round(float(np.mean([h[0] for h in hist[-50:]])), 4),
                            "ce": round(float(np.mean([h[1] for h in hist[-50:]])), 4),
                            "slot_accuracy_teacher_forced": [round(float(a), 4) for a in acc],
                            "parameters": sum(p.numel() for p in drafter.parameters())}


def simulate(model, drafter, tokens, prompt_len: int, n_draft: int, layer_inputs: list[int]) -> list[int]:
    """Greedy speculative decoding of ``tokens`` (a prompt and the target's own greedy continuation),
    in torch: the accepted count of every draft, as the engine would count them."""
    import torch

    from ggufdspark.trained.nets import Taps

    taps = Taps(model, layer_inputs)
    with torch.no_grad():
        feats = taps(model, tokens[None])[0]
    taps.close()
    T, a, counts = tokens.shape[0], prompt_len, []
    while a + n_draft < T:
        ids, _ = drafter.draft(feats, tokens, a, n_draft)
        m = 0
        while m < n_draft and ids[m] == int(tokens[a + 1 + m]):
            m += 1
        counts.append(m)
        a += m + 1
    return counts


def evaluate(work: Path, size: Size, model, drafter, split: str = "heldout", n_prompts: int | None = None) -> dict:
    """Accept length per position on prompts of ``split`` (``heldout``: files neither model saw)."""
    import torch

    dev = _device()
    held = np.load(work / "corpus" / f"{split}.npy")
    rng = np.random.default_rng(4)
    p = min(128, size.seq // 2)
    prompts = torch.from_numpy(_windows(held, n_prompts or size.eval_prompts, p, rng)).to(dev)
    model, drafter = model.float(), drafter.float()
    seqs = greedy(model, prompts, min(128, size.seq - p))
    counts: list[int] = []
    for s in seqs:
        counts += simulate(model, drafter, s, p, size.eval_draft, [t + 1 for t in size.taps])
    counts_a = np.asarray(counts)
    per_pos = [float((counts_a > i).mean()) for i in range(size.eval_draft)]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(work / "corpus" / "tokenizer" / "tokenizer.json"))
    samples = [{"prompt": tok.decode(s[:p].tolist()[-60:]), "answer": tok.decode(s[p:p + 60].tolist())}
               for s in seqs[:3]]
    different = len({tuple(s[p:].tolist()) for s in seqs})
    return {"heldout_prompts": len(seqs), "prompt_tokens": p, "draft_length": size.eval_draft,
            "accept_length": round(1 + float(counts_a.mean()), 3), "drafts": len(counts),
            "accepted_at_position": [round(x, 4) for x in per_pos], "different_answers": different,
            "samples": samples}


def held_out_prompts(work: Path, n: int = 8, length: int = 96) -> list[str]:
    """``n`` prompts from the held-out files (neither model trained on them), spread over the stream,
    each ``length`` tokens starting at a line's start and ending with a whole line: the shipped
    ``prompts.json`` the demo, the tests and the docs send."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(work) / "corpus" / "tokenizer" / "tokenizer.json"))
    held = np.load(Path(work) / "corpus" / "heldout.npy")
    out = []
    for i in range(n):
        pos = (i * held.size) // n + 1000
        while not tok.decode([int(held[pos])]).endswith("\n"):
            pos += 1
        text = tok.decode([int(t) for t in held[pos + 1:pos + 1 + length]])
        out.append(text[:text.rfind("\n") + 1] if "\n" in text else text)
    return out


def run_corpus(work: Path, vocab: int, limit_bytes: int | None) -> dict:
    from ggufdspark.trained import corpus

    return corpus.build(Path(work) / "corpus", vocab_size=vocab, limit_bytes=limit_bytes)


def run_train(work: Path, size_name: str, **overrides) -> dict:
    import torch

    work = Path(work)
    size = replace(SIZES[size_name], **overrides)
    facts = json.loads((work / "corpus" / "corpus.json").read_text())
    t0 = time.time()
    random.seed(0)
    torch.manual_seed(0)
    dev = _device()
    log.info("device %s (%s), torch %s", dev, torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
             torch.__version__)
    tgt = train_target(work, size, facts)
    model, tcfg = load_hf_target(work / "pair" / "target")  # as shipped: BF16 weights, run in float32
    model = model.to(dev)
    data = distill(work, size, model)
    drafter, dft = train_drafter(work, size, model, tcfg, data)
    drafter, _ = load_drafter(work / "pair" / "drafter", model.model.embed_tokens.weight.detach())
    ev = evaluate(work, size, model, drafter.to(dev))
    ev["other_splits"] = {sp: {k: v for k, v in evaluate(work, size, model, drafter, sp, 8).items() if k != "samples"}
                          for sp in ("train", "distill")}
    import transformers

    report = {"size": size_name, "shape": asdict(size), "device": torch.cuda.get_device_name() if dev.type == "cuda"
              else "cpu", "torch": torch.__version__, "transformers": transformers.__version__,
              "corpus": {k: v for k, v in facts.items() if k != "heldout_names"}, "target": tgt,
              "distill": {"sequences": sum(int(s.shape[0]) for _, s in data), "new_tokens": size.gen},
              "drafter": dft, "eval": ev, "seconds": round(time.time() - t0, 1)}
    (work / "pair" / "recipe.json").write_text(json.dumps(report, indent=1))
    log.info("done in %.0f s: accept length %.2f (draft %d), per position %s", report["seconds"],
             ev["accept_length"], size.eval_draft, ev["accepted_at_position"])
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ggufdspark.trained.recipe", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="tokenizer and token streams from the standard library's .py files")
    c.add_argument("work", type=Path, help="the work folder (WORK/corpus is written)")
    c.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary size")
    c.add_argument("--limit-mb", type=float, default=None, help="use only the first files up to this size")
    pr = sub.add_parser("prompts", help="WORK/pair/prompts.json: eight held-out prompts")
    pr.add_argument("work", type=Path, help="the work folder (its corpus and pair/)")
    t = sub.add_parser("train", help="target, distillation, drafter, evaluation, export")
    t.add_argument("work", type=Path, help="the work folder (WORK/corpus read, WORK/pair written)")
    t.add_argument("--size", choices=sorted(SIZES), default="gpu", help="gpu: minutes on an H100; cpu: hours on 2 cores; "
                   "mini: minutes on a CPU, predicts a little; smoke: seconds, predicts nothing")
    t.add_argument("--target-minutes", type=float, default=None, help="cap the target's training (default: the size's)")
    t.add_argument("--drafter-minutes", type=float, default=None, help="cap the drafter's training (default: the size's)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.cmd == "prompts":
        prompts = held_out_prompts(args.work)
        (args.work / "pair" / "prompts.json").write_text(json.dumps(prompts, indent=1))
        print(json.dumps(prompts, indent=1))
    elif args.cmd == "corpus":
        facts = run_corpus(args.work, args.vocab, int(args.limit_mb * 1e6) if args.limit_mb else None)
        print(json.dumps({k: v for k, v in facts.items() if k != "heldout_names"}))
    else:
        over = {k: v * 60 for k, v in (("target_seconds", args.target_minutes),
                                           ("drafter_seconds", args.drafter_minutes)) if v is not None}
        report = run_train(args.work, args.size, **over)
        print(json.dumps({k: report[k] for k in ("target", "drafter", "eval", "seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
