"""The DSpark drafter in torch, written from what llama.cpp runs (``src/models/dflash.cpp``'s draft
graph and ``common/speculative.cpp``'s ``process`` / ``draft``), in the published checkpoint's names.

The contract, as the engine runs it (sample-from-anchor DSpark):

* **Context.** For every committed position ``p`` the target's hidden states at the tapped layers
  (``dflash.target_layers`` = ``target_layer_ids`` + 1: the *input* of layer id + 1, i.e. the output
  of layer id) are concatenated, projected by ``fc`` and normalised by ``hidden_norm``: ``g_p``. Each
  drafter layer stores ``K = rope(k_norm(k_proj(g_p)), p)`` and ``V = v_proj(g_p)`` in its cache (no
  ``input_layernorm`` on this path).
* **Block.** With ``n`` committed positions and the last sampled token ``id_last`` (not yet run by
  the target), the drafter runs ``[id_last, MASK, ..., MASK]`` at positions ``n .. n+B-1``, through
  the target's own token embeddings. Attention is not causal: every block position sees the whole
  context and the whole block. Qwen3-style layers (``input_layernorm``, q/k per-head RMS norms,
  RoPE, ``o_proj``, ``post_attention_layernorm``, SwiGLU), the final ``norm``, the target's output
  matrix (LFM2 ties it to the embeddings): slot ``i`` predicts the token at ``n + i + 1``.
* **Markov head.** Slot ``i``'s logits get ``markov_w2 @ markov_w1[prev_i]``, ``prev_0 = id_last``
  and ``prev_i`` the argmax of slot ``i - 1``'s biased logits (the engine chains greedily in the
  graph). Training feeds the true previous token instead (teacher forcing).
* **Confidence head.** ``sigmoid(proj . [norm(h_i); markov_w1[prev_i]] + b)``: the engine stops a
  draft at the first slot under ``--spec-draft-p-min``.

RoPE: the published drafters say ``rope_is_neox_style: false``, so this module rotates interleaved
pairs (x0, x1), (x2, x3), ...; ``convert`` permutes q/k rows into llama.cpp's NeoX order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterShape:
    hidden: int
    n_layers: int
    n_head: int
    n_head_kv: int
    head_dim: int
    ffn: int
    vocab: int
    n_taps: int
    markov_rank: int
    block_size: int
    mask_token_id: int
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6

    @classmethod
    def from_config(cls, cfg: dict) -> "DrafterShape":
        d = cfg["dflash_config"]
        return cls(hidden=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                   n_head_kv=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], ffn=cfg["intermediate_size"],
                   vocab=cfg["vocab_size"], n_taps=len(d["target_layer_ids"]), markov_rank=cfg["markov_rank"],
                   block_size=cfg["block_size"], mask_token_id=d["mask_token_id"], rope_theta=cfg["rope_theta"],
                   eps=cfg["rms_norm_eps"])


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate (x0, x1), (x2, x3), ... of the last dim by ``pos * theta^(-2j/d)``.

    x: [N, H, T, D]; pos: [N, T] (absolute positions).
    """
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.to(torch.float32)[:, None, :, None] * inv  # [N, 1, T, D/2]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden, s.n_head * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.n_head_kv * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.n_head_kv * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.n_head * s.head_dim, s.hidden, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.eps)
        self.k_norm = RMSNorm(s.head_dim, s.eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], n, self.s.head_dim).transpose(1, 2)  # [N, H, T, D]

    def context_kv(self, g: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V the engine injects for the committed positions (``g``: [N, T, hidden])."""
        s = self.s
        k = rope_interleaved(self.k_norm(self._heads(self.k_proj(g), s.n_head_kv)), pos, s.rope_theta)
        return k, self._heads(self.v_proj(g), s.n_head_kv)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, ctx: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        s = self.s
        q = rope_interleaved(self.q_norm(self._heads(self.q_proj(x), s.n_head)), pos, s.rope_theta)
        k = rope_interleaved(self.k_norm(self._heads(self.k_proj(x), s.n_head_kv)), pos, s.rope_theta)
        v = self._heads(self.v_proj(x), s.n_head_kv)
        k = torch.cat((ctx[0], k), dim=2)
        v = torch.cat((ctx[1], v), dim=2)
        rep = s.n_head // s.n_head_kv  # query head h reads kv head h // rep, as llama.cpp does
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(s.head_dim))
        return self.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class MLP(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.ffn, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.ffn, bias=False)
        self.down_proj = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = RMSNorm(s.hidden, s.eps)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.eps)

    def forward(self, x, pos, ctx, mask):
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Markov(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.markov_w1 = nn.Embedding(s.vocab, s.markov_rank)
        self.markov_w2 = nn.Embedding(s.vocab, s.markov_rank)


class Confidence(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.proj = nn.Linear(s.hidden + s.markov_rank, 1)


class DSparkDrafter(nn.Module):
    """The drafter; ``embed`` is the target's (tied) embedding matrix, [vocab, hidden], not trained here.

    ``state_dict()`` names are the published checkpoint's (``layers.N.self_attn.q_proj.weight``,
    ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, ``markov_head.markov_w1.weight``, ...).
    """

    def __init__(self, s: DrafterShape, embed: torch.Tensor):
        super().__init__()
        self.s = s
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.n_layers))
        self.fc = nn.Linear(s.n_taps * s.hidden, s.hidden, bias=False)
        self.hidden_norm = RMSNorm(s.hidden, s.eps)
        self.norm = RMSNorm(s.hidden, s.eps)
        self.markov_head = Markov(s)
        self.confidence_head = Confidence(s)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name == "confidence_head.proj.bias":
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)

    def context(self, taps: torch.Tensor) -> torch.Tensor:
        """``g``: fc + hidden_norm of the concatenated tapped hidden states, [N, T, hidden]."""
        return self.hidden_norm(self.fc(taps))

    def blocks(self, taps: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, n_block: int | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run K blocks per sequence at once, each seeing only the context before its anchor.

        taps [N, T, n_taps*hidden], tokens [N, T], anchors [N, K] (positions; the block of anchor a
        holds positions a .. a+B-1 and its context is 0 .. a-1). Returns the base logits [N, K, B, V],
        the normed hidden states [N, K, B, hidden] and the block positions [N, K, B].
        """
        s = self.s
        B = n_block or s.block_size
        N, T = tokens.shape
        K = anchors.shape[1]
        dev = tokens.device
        pos_blk = anchors[..., None] + torch.arange(B, device=dev)  # [N, K, B]
        ids = torch.full((N, K, B), s.mask_token_id, dtype=torch.long, device=dev)
        ids[..., 0] = tokens.gather(1, anchors)
        x = F.embedding(ids.view(N, K * B), self.embed).to(taps.dtype)
        pos_ctx = torch.arange(T, device=dev).expand(N, T)
        ctx_ok = pos_ctx[:, None, :] < anchors[:, :, None]  # [N, K, T]
        ctx_ok = ctx_ok[:, :, None, :].expand(N, K, B, T).reshape(N, K * B, T)
        blk = torch.arange(K, device=dev).repeat_interleave(B)
        blk_ok = (blk[:, None] == blk[None, :]).expand(N, K * B, K * B)
        mask = torch.cat((ctx_ok, blk_ok), dim=-1)[:, None]  # [N, 1, K*B, T+K*B]
        g = self.context(taps)
        pos_q = pos_blk.view(N, K * B)
        for layer in self.layers:
            ctx = layer.self_attn.context_kv(g, pos_ctx)
            x = layer(x, pos_q, ctx, mask)
        h = self.norm(x)
        logits = h @ self.embed.to(h.dtype).t()
        return logits.view(N, K, B, -1), h.view(N, K, B, -1), pos_blk

    def markov_bias(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w2 @ w1[prev], w1[prev]) for any shape of ``prev``."""
        w1p = self.markov_head.markov_w1(prev)
        return w1p @ self.markov_head.markov_w2.weight.t(), w1p

    def confidence(self, h: torch.Tensor, w1p: torch.Tensor) -> torch.Tensor:
        """Confidence logits (before the sigmoid)."""
        return self.confidence_head.proj(torch.cat((h, w1p.to(h.dtype)), dim=-1)).squeeze(-1)

    @torch.no_grad()
    def draft(self, taps: torch.Tensor, tokens: torch.Tensor, anchor: int, n_draft: int
              ) -> tuple[list[int], list[float]]:
        """What the engine drafts greedily for one sequence: the anchor is ``tokens[anchor]`` at
        position ``anchor``, the context ``taps[:anchor]``. Returns the ids and their confidences."""
        logits, h, _ = self.blocks(taps[None], tokens[None], torch.tensor([[anchor]], device=tokens.device), n_draft)
        logits, h = logits[0, 0].float(), h[0, 0]
        prev = tokens[anchor]
        ids, conf = [], []
        for i in range(n_draft):
            bias, w1p = self.markov_bias(prev[None])
            col = logits[i] + bias[0].float()
            conf.append(float(torch.sigmoid(self.confidence(h[i][None], w1p)[0].float())))
            prev = col.argmax()
            ids.append(int(prev))
        return ids, conf

    def loss(self, taps: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, decay: float = 6.0
             ) -> tuple[torch.Tensor, dict]:
        """Block cross-entropy (slot i weighted exp(-i/decay)) with teacher-forced Markov inputs, plus
        the confidence head's BCE against "the slot's argmax is right" (its inputs detached)."""
        logits, h, pos_blk = self.blocks(taps, tokens, anchors)
        N, K, B, V = logits.shape
        prev = tokens.gather(1, pos_blk.view(N, -1)).view(N, K, B)  # slot 0: the anchor; slot i: token a+i
        labels = tokens.gather(1, (pos_blk + 1).view(N, -1)).view(N, K, B)
        bias, w1p = self.markov_bias(prev)
        full = logits.float() + bias.float()
        ce = F.cross_entropy(full.view(-1, V), labels.view(-1), reduction="none").view(N, K, B)
        w = torch.exp(-torch.arange(B, device=ce.device, dtype=torch.float32) / decay)
        lm = (ce * w).sum(-1).mean() / w.sum()
        right = (full.argmax(-1) == labels).float()
        c = self.confidence(h.detach(), w1p.detach())
        bce = F.binary_cross_entropy_with_logits(c.float(), right)
        return lm + 0.1 * bce, {"ce": float(ce.mean()), "bce": float(bce), "acc": right.mean(0).mean(0).tolist()}


class Taps:
    """The inputs of some decoder layers of a transformers LFM2 model, by forward pre-hooks: exactly
    what llama.cpp's ``t_layer_inp[il]`` holds (GGUF ``dflash.target_layers``, i.e. id + 1)."""

    def __init__(self, model: nn.Module, layer_inputs: list[int]):
        self.layer_inputs = list(layer_inputs)
        self.seen: dict[int, torch.Tensor] = {}
        layers = model.model.layers
        self.handles = [layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True)
                        for i in self.layer_inputs]

    def _hook(self, i: int):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self.seen[i] = x
        return hook

    def __call__(self, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """[N, T, n_taps*hidden] for ``tokens`` [N, T] (the decoder alone: no logits computed)."""
        self.seen.clear()
        model.model(input_ids=tokens, use_cache=False)
        return torch.cat([self.seen[i] for i in self.layer_inputs], dim=-1)

    def close(self) -> None:
        for h in self.handles:
            h.remove()
