"""The pictures of ``bench --load --image-share``: drawn once per run, and which requests carry one
(the same on every arm, from the round's seed), with each server's own media marker."""

from __future__ import annotations

from typing import TYPE_CHECKING

import random
from dataclasses import dataclass, field, replace
from pathlib import Path


from ggufdspark import images
from ggufdspark.errors import BenchError, EngineError
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring.prompts import render
from ggufdspark.runners.client import Client

if TYPE_CHECKING:  # numpy is imported where pictures are drawn, not by every verb importing this
    import numpy as np


# The pictures of --image-share: three kinds at three sizes. LFM2-VL's mtmd preprocessing gives
# 256 x 256 its minimum of 64 image tokens, 384 x 384 144 and 512 x 512 its maximum of 256, no
# tiling at or below 512 on a side (``ggufdspark.images``).
IMAGE_SIZES = (256, 384, 512)
# context a slot needs beyond the text for one picture: the 256 tokens of the largest and the
# marker tokens around them, with room to spare
IMAGE_TOKENS_MAX = 272


@dataclass
class Picture:
    """One drawn picture of the image traffic: its name (kind and size), file and base64 bytes."""

    name: str
    path: str
    b64: str = field(repr=False)


def draw_pictures(out_dir: str | Path, seed: int = 0) -> list[Picture]:
    """A scene, a chart and a sign (seeded draw specs), at the sizes of ``IMAGE_SIZES``, drawn as PNGs
    in ``out_dir``.

    Raises:
        BenchError: Pillow or matplotlib missing.
    """
    import numpy as np
    rng = np.random.default_rng(seed)
    specs = [("scene", images.random_scene(rng)[0]), ("chart", images.random_chart(rng, "bars")[0]),
             ("sign", images.random_sign(rng)[0])]
    out = []
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for (kind, draw), size in zip(specs, IMAGE_SIZES):
        name = f"{kind}-{size}px"
        try:
            path = images.render(draw, Path(out_dir) / f"{name}.png", size=size)
        except ImportError as e:
            raise BenchError(f"drawing the --image-share pictures needs Pillow and matplotlib: {e}") from None
        out.append(Picture(name, str(path), images.image_b64(path)))
    return out


@dataclass
class ImageTraffic:
    """The image requests of a run: the pictures, and per prompt of the set its text rendered with
    one picture before its first user message (``texts``, holding ``marker``, the rendering server's
    media marker). ``share`` of each level's requests carry a picture (``plan``)."""

    share: float
    pictures: list[Picture]
    texts: list[str] = field(repr=False)
    marker: str

    def for_server(self, marker: str | None) -> "ImageTraffic":
        """The same requests for another server: llama-server picks a random media marker per
        process, so the first server's is swapped for this one's."""
        if not marker or marker == self.marker:
            return self
        return replace(self, texts=[t.replace(self.marker, marker) for t in self.texts], marker=marker)

    def plan(self, n_requests: int, seed: int) -> list[int | None]:
        """For each request index of a level: the picture it carries (an index into ``pictures``), or
        None. ``round(share * n)`` requests, chosen and given pictures by a generator seeded with
        ``seed`` alone, so every arm sends the same."""
        rng = random.Random(f"image-plan-{seed}")
        chosen = sorted(rng.sample(range(n_requests), round(self.share * n_requests)))
        out: list[int | None] = [None] * n_requests
        for k, i in enumerate(chosen):
            out[i] = k % len(self.pictures)  # the sizes in turn: each as often as the others, within one
        return out

    def prompt(self, prompt_index: int, picture: int) -> dict:
        """The multimodal ``/completion`` prompt of one image request."""
        return {"prompt_string": self.texts[prompt_index], "multimodal_data": [self.pictures[picture].b64]}


def image_traffic(client: Client, items: list[pr.PromptItem], pictures: list[Picture], share: float) -> ImageTraffic:
    """Every item rendered with a picture before its first user message, on ``client`` (a server
    started with ``--mmproj``).

    Raises:
        BenchError: the server has no media marker (no ``--mmproj``), or could not render an item.
    """
    marker = client.props().get("media_marker")
    if not marker:
        raise BenchError("image requests need a server started with --mmproj: this one has no media marker")
    texts = []
    for it in items:
        msgs = [dict(m) for m in it.messages]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        c = msgs[first]["content"]
        rest = c if isinstance(c, list) else [{"type": "text", "text": c}]
        msgs[first]["content"] = [{"type": "image", "path": pictures[0].path}, *rest]
        try:
            prompt, _ = render(client, msgs, marker)
        except EngineError as e:
            raise BenchError(f"prompt {it.id!r} with an image: the server could not render it: {e}") from None
        texts.append(prompt["prompt_string"])
    return ImageTraffic(share, pictures, texts, marker)


# --------------------------------------------------------------------------- requests
