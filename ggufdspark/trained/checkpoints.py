"""The trained pair's checkpoints in torch: the target as a transformers ``Lfm2ForCausalLM``, the
drafter as ``ggufdspark.trained.nets.DSparkDrafter``, and BF16 safetensors written in the Hub's
layout (sharded under 16 MB a file, so a device call can bring them back)."""

from __future__ import annotations

import json
from pathlib import Path


def hf_target(cfg: dict):
    """A transformers ``Lfm2ForCausalLM`` for ``cfg`` (the RoPE base set where transformers 5 reads it)."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    c = Lfm2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    c.rope_parameters = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    c._attn_implementation = "sdpa"
    return Lfm2ForCausalLM(c)


def load_hf_target(directory: Path):
    """The trained target from its Hub-layout directory, float32, eval mode."""
    import torch

    cfg = json.loads((Path(directory) / "config.json").read_text())
    model = hf_target(cfg)
    state = load_weights(directory)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(torch.float32).eval(), cfg


def load_drafter(directory: Path, embed):
    """The drafter from its Hub-layout directory (``embed``: the target's embedding matrix)."""
    from safetensors.torch import load_file

    from ggufdspark.trained.nets import DrafterShape, DSparkDrafter

    cfg = json.loads((Path(directory) / "config.json").read_text())
    d = DSparkDrafter(DrafterShape.from_config(cfg), embed)
    d.load_state_dict({k: v.float() for k, v in load_file(str(Path(directory) / "model.safetensors")).items()})
    return d.eval(), cfg


def save(state: dict, path: Path, skip: tuple[str, ...] = ()) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in state.items() if k not in skip},
              str(path), metadata={"format": "pt"})


def save_sharded(state: dict, out: Path, skip: tuple[str, ...] = (), max_bytes: int = 12 << 20) -> None:
    """BF16 safetensors in shards of at most ``max_bytes`` (the Hub's ``model-0000K-of-0000N`` layout
    with its index), so no file is over what a device call brings back (16 MB)."""
    import torch
    from safetensors.torch import save_file

    items = [(k, v.detach().to(torch.bfloat16).contiguous().cpu()) for k, v in state.items() if k not in skip]
    shards, cur, size = [], [], 0
    for k, v in items:
        nb = v.numel() * 2
        if cur and size + nb > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((k, v))
        size += nb
    shards.append(cur)
    if len(shards) == 1:
        save_file(dict(shards[0]), str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(dict(shard), str(out / name), metadata={"format": "pt"})
        for k, v in shard:
            weight_map[k] = name
            total += v.numel() * 2
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def load_weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    directory = Path(directory)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        state = {}
        for name in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(str(directory / name)))
        return state
    return load_file(str(directory / "model.safetensors"))


