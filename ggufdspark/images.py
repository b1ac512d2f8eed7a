"""Images for vision tests and benchmarks, drawn here so that no dataset needs downloading.

Every picture comes from a small JSON-serialisable *draw spec*, so a benchmark can store the spec
with its results, redraw the same picture later, or send its text description to a text-only arm:

* ``{"kind": "bars" | "line" | "pie", "title", "labels", "values", "unit"}``: charts drawn with
  matplotlib (axes, ticks, value labels), for chart VQA;
* ``{"kind": "sign", "background", "color", "lines"}``: rendered text, for text VQA / OCR;
* ``{"kind": "scene", "background", "objects": [{"shape", "color", "x", "y", "size"}]}``: simple
  shapes (circle, square, rectangle, triangle; x/y/size as fractions of the side), for general VQA
  and captioning.

These are the spec kinds of ``ggufdspark/data/prompts.jsonl`` ("bars", "sign", "scene"); "line" and
"pie" are extra. ``random_items`` makes a seeded set with questions and ground-truth answers.

Drawing is deterministic: the same spec, size and library versions give the same PNG bytes
(matplotlib renders to a buffer and Pillow writes the PNG, so no timestamps get in).

Image size decides how many tokens an image costs: LFM2-VL (llama.cpp's mtmd) scales each image,
keeping its aspect ratio, to between 64 and 256 tokens of 32 x 32 pixels; 448 x 448 gives 196
tokens, 512 x 512 the maximum 256. Images above about twice 512 x 512 pixels are cut into 512-pixel
tiles plus a thumbnail, so keep benchmark images at or below 512 on a side unless tiling is the point.

Needs Pillow (charts also matplotlib); both are imported only when drawing.
"""

from __future__ import annotations

import base64
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where pictures are drawn, not by every verb importing this
    import numpy as np


CATEGORIES = ("general_vqa", "text_vqa", "chart_vqa", "captioning")
CHART_KINDS = ("bars", "line", "pie")
SHAPES = ("circle", "square", "rectangle", "triangle")
DEFAULT_SIZE = 448  # 196 LFM2-VL image tokens, no tiling

# colours with plain English names, so that questions about them have one answer
_COLORS = ("red", "blue", "green", "yellow", "orange", "purple", "black", "gray")
_BACKGROUNDS = ("white", "lightyellow", "lightblue", "beige", "lavender")
_CHART_SUBJECTS = (
    ("Quarterly revenue", ["Q1", "Q2", "Q3", "Q4"], "million USD", (5, 40)),
    ("Daily visitors", ["Mon", "Tue", "Wed", "Thu", "Fri"], "visitors", (100, 600)),
    ("Battery life", ["Phone A", "Phone B", "Phone C"], "hours", (5, 30)),
    ("Monthly rainfall", ["Jan", "Feb", "Mar", "Apr", "May"], "mm", (20, 120)),
    ("Students per club", ["Chess", "Music", "Robotics", "Drama"], "students", (5, 40)),
    ("Energy use", ["Fridge", "Heater", "Oven", "Lights"], "kWh", (100, 1000)),
)
_SIGNS = (
    ("CITY LIBRARY", "Open {d1}-{d2} {h1}:00-{h2}:00", "What are the opening hours?", "{h1}:00-{h2}:00"),
    ("PLATFORM {n}", "Express to {place}", "Which platform does the express leave from?", "{n}"),
    ("SALE", "All shoes {p}% off", "How large is the discount?", "{p}%"),
    ("ROOM {n}{n2}", "Meeting at {h1}:30", "When is the meeting?", "{h1}:30"),
    ("PARKING", "Max {h3} hours", "How long may one park here?", "{h3} hours"),
)
_PLACES = ("Riverside", "Northgate", "Lakeview", "Hillcrest", "Old Town")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat")


@dataclass
class ImageItem:
    """One generated picture with a question about it.

    ``answer`` is the ground truth where the question has one (None for open-ended ones, such as
    captions); ``description`` says the same in words, for an arm without vision.
    """

    id: str
    category: str
    path: Path
    draw: dict
    question: str
    answer: str | None
    description: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


# --------------------------------------------------------------------------- drawing


def render(draw: dict, path: str | Path, *, size: int | tuple[int, int] = DEFAULT_SIZE) -> Path:
    """Draw a spec to a PNG at ``path`` (parent directories are created).

    Args:
        draw: a draw spec (see the module docstring).
        size: side in pixels, or (width, height).

    Raises:
        ValueError: unknown kind or shape.
        ImportError: Pillow (or, for charts, matplotlib) is not installed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _draw(draw, size).save(path, format="PNG")
    return path


def png_bytes(draw: dict, *, size: int | tuple[int, int] = DEFAULT_SIZE) -> bytes:
    """A spec drawn to PNG bytes in memory (nothing written)."""
    buf = io.BytesIO()
    _draw(draw, size).save(buf, format="PNG")
    return buf.getvalue()


def _draw(draw: dict, size: int | tuple[int, int]):
    w, h = (size, size) if isinstance(size, int) else size
    kind = draw.get("kind")
    if kind in CHART_KINDS:
        return _chart(draw, w, h)
    if kind == "sign":
        return _sign(draw, w, h)
    if kind == "scene":
        return _scene(draw, w, h)
    raise ValueError(f"unknown draw kind {kind!r}; expected one of {CHART_KINDS + ('sign', 'scene')}")


def _matplotlib():
    """matplotlib's Agg canvas and Figure, or None where it is missing or does not import (a broken
    build raises more than ImportError: SystemError from its font module was seen on a GPU host)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except Exception:  # noqa: BLE001 - any failure to import means: draw without it
        return None
    return FigureCanvasAgg, Figure


def _chart(draw: dict, w: int, h: int):
    mpl = _matplotlib()
    if mpl is None:
        return _chart_plain(draw, w, h)
    FigureCanvasAgg, Figure = mpl
    from PIL import Image

    dpi = 100
    fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)  # no pyplot: no global state, no GUI backend
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels, values = list(draw["labels"]), list(draw["values"])
    kind = draw["kind"]
    if kind == "bars":
        bars = ax.bar(labels, values, color="steelblue")
        ax.bar_label(bars, labels=[f"{v:g}" for v in values], fontsize=8)
        ax.set_ylabel(draw.get("unit", ""))
    elif kind == "line":
        ax.plot(labels, values, marker="o", color="darkred")
        for x, y in zip(labels, values):
            ax.annotate(f"{y:g}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_ylabel(draw.get("unit", ""))
        ax.grid(True, alpha=0.3)
    else:  # pie
        ax.pie(values, labels=labels, autopct="%1.0f%%", startangle=90, counterclock=False,
               textprops={"fontsize": 8})
        ax.axis("equal")
    ax.set_title(draw.get("title", ""), fontsize=10)
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    canvas.draw()
    return Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")


def _chart_plain(draw: dict, w: int, h: int):
    """The chart drawn with Pillow alone (no matplotlib): the same title, labels and values."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    font = _font(max(8, h // 32))
    labels, values = [str(x) for x in draw["labels"]], [float(v) for v in draw["values"]]
    d.text((w / 2 - font.getlength(draw.get("title", "")) / 2, 4), draw.get("title", ""), fill="black", font=font)
    left, right, top, bottom = 0.1 * w, 0.95 * w, 0.12 * h, 0.85 * h
    kind, n, top_v = draw["kind"], max(len(values), 1), max(max(values, default=1.0), 1e-9)
    if kind == "pie":
        total, start = sum(values) or 1.0, -90.0
        box = (w / 2 - 0.3 * h, top, w / 2 + 0.3 * h, top + 0.6 * h)
        for i, (label, v) in enumerate(zip(labels, values)):
            end = start + 360.0 * v / total
            d.pieslice(box, start, end, fill=_COLORS[i % len(_COLORS)], outline="white")
            start = end
            d.text((left, bottom - 14 * (len(labels) - i)), f"{label} {100 * v / total:.0f}%", fill="black", font=font)
        return img
    d.line((left, bottom, right, bottom), fill="black")
    slot = (right - left) / n
    points = []
    for i, (label, v) in enumerate(zip(labels, values)):
        x, y = left + slot * (i + 0.5), bottom - (bottom - top) * v / top_v
        if kind == "bars":
            d.rectangle((x - 0.35 * slot, y, x + 0.35 * slot, bottom), fill="steelblue")
        points.append((x, y))
        d.text((x - font.getlength(f"{v:g}") / 2, y - 14), f"{v:g}", fill="black", font=font)
        d.text((x - font.getlength(label) / 2, bottom + 4), label, fill="black", font=font)
    if kind == "line" and len(points) > 1:
        d.line(points, fill="darkred", width=2)
    return img


def _font(px: int):
    from PIL import ImageFont

    try:
        from matplotlib import font_manager

        return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), px)
    except Exception:  # noqa: BLE001 - no (working) matplotlib: Pillow's own font
        return ImageFont.load_default(size=px)


def _sign(draw: dict, w: int, h: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), draw.get("background", "white"))
    d = ImageDraw.Draw(img)
    lines = [str(x) for x in draw["lines"]]
    # the largest font at which every line fits 85% of the width and all lines 80% of the height
    px = max(8, int(0.8 * h / (1.4 * max(len(lines), 1))))
    while px > 8 and max(_font(px).getlength(ln) for ln in lines) > 0.85 * w:
        px -= 1
    font = _font(px)
    step = 1.4 * px
    top = (h - step * len(lines)) / 2
    for i, line in enumerate(lines):
        x = (w - font.getlength(line)) / 2
        d.text((x, top + i * step), line, fill=draw.get("color", "black"), font=font)
    return img


def _scene(draw: dict, w: int, h: int):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, h), draw.get("background", "white"))
    d = ImageDraw.Draw(img)
    side = min(w, h)
    for o in draw["objects"]:
        cx, cy, r = o["x"] * w, o["y"] * h, o["size"] * side / 2
        shape, color = o["shape"], o["color"]
        if shape == "circle":
            d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=color)
        elif shape == "square":
            d.rectangle((cx - r, cy - r, cx + r, cy + r), fill=color)
        elif shape == "rectangle":
            d.rectangle((cx - 1.4 * r, cy - 0.7 * r, cx + 1.4 * r, cy + 0.7 * r), fill=color)
        elif shape == "triangle":
            d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
        else:
            raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    return img


def describe(draw: dict) -> str:
    """The picture in words, for prompts sent to a model without vision."""
    kind = draw.get("kind")
    if kind in CHART_KINDS:
        pairs = ", ".join(f"{lab} = {v:g}" for lab, v in zip(draw["labels"], draw["values"]))
        what = {"bars": "a bar chart", "line": "a line chart", "pie": "a pie chart"}[kind]
        return f"[Image: {what} titled '{draw.get('title', '')}' ({draw.get('unit', '')}): {pairs}.]"
    if kind == "sign":
        lines = " / ".join(f"'{ln}'" for ln in draw["lines"])
        return f"[Image: a {draw.get('background', 'white')} sign with {draw.get('color', 'black')} lettering " \
               f"that reads {lines}.]"
    if kind == "scene":
        objs = "; ".join(f"a {o['color']} {o['shape']} at ({o['x']:.2f}, {o['y']:.2f})" for o in draw["objects"])
        return f"[Image: on a {draw.get('background', 'white')} background, {objs} (x right, y down, 0..1).]"
    raise ValueError(f"unknown draw kind {kind!r}")


# --------------------------------------------------------------------------- random specs with questions


def random_chart(rng: np.random.Generator, kind: str | None = None) -> tuple[dict, str, str]:
    """A chart spec, a question about it and its answer."""
    import numpy as np
    title, labels, unit, (lo, hi) = _CHART_SUBJECTS[int(rng.integers(len(_CHART_SUBJECTS)))]
    kind = kind or CHART_KINDS[int(rng.integers(len(CHART_KINDS)))]
    # distinct values, so "which is highest" has one answer
    values = [int(v) for v in rng.choice(np.arange(lo, hi + 1), size=len(labels), replace=False)]
    draw = {"kind": kind, "title": title, "labels": list(labels), "values": values, "unit": unit}
    best = labels[int(np.argmax(values))]
    if kind == "pie":
        return draw, "Which category has the largest share?", best
    if rng.random() < 0.5:
        return draw, f"Which {'bar' if kind == 'bars' else 'point'} has the highest value?", best
    i = int(rng.integers(len(labels)))
    return draw, f"What is the value for {labels[i]}?", f"{values[i]}"


def random_sign(rng: np.random.Generator) -> tuple[dict, str, str]:
    """A sign spec (rendered text), a question about it and its answer."""
    head, body, question, answer = _SIGNS[int(rng.integers(len(_SIGNS)))]
    h1 = int(rng.integers(7, 12))
    d1, d2 = sorted(rng.choice(len(_DAYS), size=2, replace=False))
    fill = {"d1": _DAYS[d1], "d2": _DAYS[d2], "h1": h1, "h2": h1 + int(rng.integers(6, 10)),
            "h3": int(rng.integers(1, 5)), "n": int(rng.integers(1, 10)), "n2": int(rng.integers(0, 10)),
            "p": int(rng.choice([10, 20, 25, 30, 40, 50])), "place": _PLACES[int(rng.integers(len(_PLACES)))]}
    bg, fg = [("navy", "white"), ("black", "yellow"), ("white", "black"), ("darkgreen", "white")][
        int(rng.integers(4))]
    draw = {"kind": "sign", "background": bg, "color": fg,
            "lines": [head.format(**fill), body.format(**fill)]}
    return draw, question, answer.format(**fill)


def random_scene(rng: np.random.Generator, n_objects: int | None = None) -> tuple[dict, str, str]:
    """A scene spec (shapes that do not overlap), a question about it and its answer."""
    import numpy as np
    n = n_objects or int(rng.integers(2, 6))
    objects: list[dict] = []
    tries = 0
    while len(objects) < n and tries < 500:
        tries += 1
        o = {"shape": SHAPES[int(rng.integers(len(SHAPES)))], "color": _COLORS[int(rng.integers(len(_COLORS)))],
             "x": round(float(rng.uniform(0.15, 0.85)), 3), "y": round(float(rng.uniform(0.15, 0.85)), 3),
             "size": round(float(rng.uniform(0.12, 0.22)), 3)}
        if all(np.hypot(o["x"] - p["x"], o["y"] - p["y"]) > (o["size"] + p["size"]) * 0.75 for p in objects):
            objects.append(o)
    draw = {"kind": "scene", "background": _BACKGROUNDS[int(rng.integers(len(_BACKGROUNDS)))], "objects": objects}
    if rng.random() < 0.5:
        return draw, "How many shapes are in the image?", str(len(objects))
    color = objects[int(rng.integers(len(objects)))]["color"]
    count = sum(o["color"] == color for o in objects)
    return draw, f"How many {color} shapes are there?", str(count)


def random_items(out_dir: str | Path, *, n_per_category: int = 2, seed: int = 0,
                 categories: tuple[str, ...] = CATEGORIES,
                 size: int | tuple[int, int] = DEFAULT_SIZE) -> list[ImageItem]:
    """Draw a seeded set of pictures with questions, ``n_per_category`` for each category, as
    ``out_dir/<id>.png``. The same arguments give the same specs, questions and PNG bytes.

    Categories: ``chart_vqa`` (charts), ``text_vqa`` (signs), ``general_vqa`` (scenes, counting
    questions), ``captioning`` (scenes or charts, open-ended: no answer).
    """
    import numpy as np
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown image categories {unknown}; expected some of {CATEGORIES}")
    rng = np.random.default_rng(seed)
    items = []
    for cat in categories:
        for i in range(n_per_category):
            if cat == "chart_vqa":
                draw, q, a = random_chart(rng)
            elif cat == "text_vqa":
                draw, q, a = random_sign(rng)
            elif cat == "general_vqa":
                draw, q, a = random_scene(rng)
            else:
                draw = (random_scene(rng) if i % 2 == 0 else random_chart(rng))[0]
                q, a = "Write a one-sentence caption for this image.", None
            item_id = f"{cat}-{i + 1:02d}"
            path = render(draw, Path(out_dir) / f"{item_id}.png", size=size)
            items.append(ImageItem(item_id, cat, path, draw, q, a, describe(draw)))
    return items


# --------------------------------------------------------------------------- sending


def image_b64(path: str | Path) -> str:
    """Base64 of an image file: the form of ``multimodal_data`` entries on ``/completion``."""
    return base64.b64encode(Path(path).read_bytes()).decode()


__all__ = ["CATEGORIES", "CHART_KINDS", "SHAPES", "DEFAULT_SIZE", "ImageItem", "render", "describe",
           "random_chart", "random_sign", "random_scene", "random_items", "image_b64", "png_bytes"]
