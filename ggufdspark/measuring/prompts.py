"""Prompt sets for ``bench`` and ``tune``: the built-in set and user JSON Lines files.

The built-in set (``data/prompts.jsonl``) was written for this project, four items in each of the
six MMSpec categories. An item that needs a picture carries a ``draw`` spec instead of an image
file: with an ``--mmproj`` the picture is drawn (Pillow) and sent as an image; without one, the
``{image}`` placeholder in its first message becomes a text description of the same picture, so the
set is text-only where no vision projector is given.

A user file is JSON Lines, one item per line (blank lines and lines starting with ``#`` skipped)::

    {"id": "q1", "category": "chart_vqa", "messages": [{"role": "user", "content": "..."}]}
    {"messages": [{"role": "user", "content": [{"type": "image", "path": "chart.png"},
                                              {"type": "text", "text": "Which bar is tallest?"}]}]}
    {"images": ["photo.jpg"], "messages": [{"role": "user", "content": "Describe it."}]}

Image paths are relative to the file. Every user message is one turn; turns run one after the other,
and a user message not followed by an assistant message gets the model's own reply as history.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggufdspark import images
from ggufdspark.errors import BenchError, InputNotFoundError

if TYPE_CHECKING:
    from ggufdspark.runners.client import Client

log = logging.getLogger(__name__)

# The six MMSpec categories: key -> display name.
CATEGORIES: dict[str, str] = {
    "general_vqa": "General VQA",
    "text_vqa": "Text VQA",
    "captioning": "Image captioning",
    "chart_vqa": "Chart VQA",
    "complex_reasoning": "Complex reasoning",
    "multi_turn": "Multi-turn",
}
ROLES = ("system", "user", "assistant")
ITEM_KEYS = ("id", "category", "messages", "images")
IMAGE_PLACEHOLDER = "{image}"


@dataclass
class PromptItem:
    """One benchmark item: a conversation whose user messages are run turn by turn.

    ``messages`` are OpenAI-style; content is a string or a list of parts ``{"type": "text",
    "text": ...}`` / ``{"type": "image", "path": ...}`` (paths resolved).
    """

    id: str
    category: str
    messages: list[dict]
    source: str = "builtin"

    @property
    def n_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "user")

    @property
    def images(self) -> list[Path]:
        return [Path(p["path"]) for m in self.messages if isinstance(m["content"], list)
                for p in m["content"] if p.get("type") == "image"]


# --------------------------------------------------------------------------- built-in set


def _where(x: float, y: float) -> str:
    col = "left" if x < 0.36 else "right" if x > 0.64 else "center"
    row = "top" if y < 0.36 else "bottom" if y > 0.64 else "middle"
    return "center" if (row, col) == ("middle", "center") else f"{row} {col}"


def describe(draw: dict) -> str:
    """The text stand-in for a drawn picture (what a text-only run sees instead of pixels)."""
    kind = draw["kind"]
    if kind == "scene":
        objs = "; ".join(f"a {o['color']} {o['shape']} at the {_where(o['x'], o['y'])}" for o in draw["objects"])
        return f"[Image: a drawing on a {draw['background']} background: {objs}.]"
    if kind == "sign":
        lines = " / ".join(f"'{ln}'" for ln in draw["lines"])
        return f"[Image: a {draw['background']} sign with {draw['color']} lettering that reads {lines}.]"
    if kind == "bars":
        bars = ", ".join(f"{lab} = {v}" for lab, v in zip(draw["labels"], draw["values"]))
        return f"[Image: a bar chart titled '{draw['title']}' ({draw['unit']}): {bars}.]"
    raise ValueError(f"unknown draw kind {kind!r}")


def draw_image(draw: dict, path: Path, size: int = 448) -> Path:
    """Render a ``draw`` spec to a PNG at ``path`` (``ggufdspark.images``; needs Pillow)."""
    try:
        return images.render(draw, path, size=size)
    except ImportError as e:
        raise BenchError(f"drawing the built-in images needs Pillow and matplotlib: {e}") from None


def builtin_prompts(*, image_dir: str | Path | None = None) -> list[PromptItem]:
    """The built-in set. With ``image_dir`` pictures are drawn there and sent as images; without
    it every ``{image}`` placeholder becomes the picture's text description."""
    text = resources.files("ggufdspark").joinpath("data/prompts.jsonl").read_text(encoding="utf-8")
    items = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        rec = json.loads(raw)
        draw = rec.get("draw")
        messages = []
        for m in rec["messages"]:
            content = m["content"]
            if draw and IMAGE_PLACEHOLDER in content:
                rest = content.replace(IMAGE_PLACEHOLDER, "").strip()
                if image_dir is not None:
                    png = draw_image(draw, Path(image_dir) / f"{rec['id']}.png")
                    content = [{"type": "image", "path": str(png)}, {"type": "text", "text": rest}]
                else:
                    content = f"{describe(draw)}\n{rest}"
            messages.append({"role": m["role"], "content": content})
        items.append(PromptItem(rec["id"], rec["category"], messages, "builtin"))
    return items


# --------------------------------------------------------------------------- user files


def _fail(where: str, msg: str) -> BenchError:
    return BenchError(f"{where}: {msg}")


def _image_part(part: Any, where: str, base: Path) -> dict:
    if part.get("type") == "image":
        ref = part.get("path")
    else:  # image_url
        url = part.get("image_url")
        ref = url.get("url") if isinstance(url, dict) else url
    if not isinstance(ref, str) or not ref:
        raise _fail(where, f"image part {json.dumps(part)[:80]} has no path")
    if ref.startswith(("http://", "https://", "data:")):
        raise _fail(where, f"image {ref[:40]!r}: only local image files are supported")
    p = Path(ref) if Path(ref).is_absolute() else base / ref
    if not p.is_file():
        raise _fail(where, f"image file not found: {p}")
    return {"type": "image", "path": str(p)}


def _content(content: Any, where: str, base: Path) -> str | list[dict]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _fail(where, f"content must be a string or a non-empty list of parts, found "
                           f"{type(content).__name__}")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("image", "image_url"):
            parts.append(_image_part(part, where, base))
        else:
            raise _fail(where, f"content part {json.dumps(part)[:80]} is not "
                               "{\"type\": \"text\", \"text\": ...} or {\"type\": \"image\", \"path\": ...}")
    return parts


def _item(rec: Any, where: str, base: Path, default_id: str) -> PromptItem:
    if not isinstance(rec, dict):
        raise _fail(where, f"expected a JSON object, found {type(rec).__name__}")
    unknown = sorted(set(rec) - set(ITEM_KEYS))
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r} (expected {', '.join(ITEM_KEYS)})")
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _fail(where, "'messages' must be a non-empty list" if "messages" in rec else "no 'messages'")
    messages = []
    for i, m in enumerate(msgs):
        w = f"{where}: messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise BenchError(f"{w}: role {role!r} is not one of {', '.join(ROLES)}")
        if "content" not in m:
            raise BenchError(f"{w}: no 'content'")
        messages.append({"role": m["role"], "content": _content(m["content"], w, base)})
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise _fail(where, "no user message")
    if messages[-1]["role"] != "user":
        raise _fail(where, f"the last message is a {messages[-1]['role']!r} message; it must be the "
                           "user turn to answer")
    images = rec.get("images") or []
    if not isinstance(images, list):
        raise _fail(where, "'images' must be a list of image paths")
    if images:
        first = messages[users[0]]
        text = first["content"] if isinstance(first["content"], list) else [{"type": "text", "text": first["content"]}]
        first["content"] = [_image_part({"type": "image", "path": p}, where, base) for p in images] + text
    item_id = rec.get("id", default_id)
    category = rec.get("category", "user")
    if not isinstance(item_id, (str, int)) or not isinstance(category, str):
        raise _fail(where, "'id' and 'category' must be strings")
    return PromptItem(str(item_id), category, messages, where)


def load_prompts(path: str | Path) -> list[PromptItem]:
    """Read a JSON Lines prompt file.

    Raises:
        InputNotFoundError: the file does not exist.
        BenchError: a line is not JSON, not an item, or names a missing image (the message gives
            the file, the line and what was found); the file has no items; an id repeats.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"{p}: prompt file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BenchError(f"{p}: not UTF-8 text (byte {e.start})") from None
    items: list[PromptItem] = []
    seen: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{p}:{no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise _fail(where, f"not valid JSON: {e.msg} (column {e.colno})") from None
        item = _item(rec, where, p.parent, f"{p.stem}-{no}")
        if item.id in seen:
            raise _fail(where, f"id {item.id!r} repeats (first at {seen[item.id]})")
        seen[item.id] = where
        items.append(item)
    if not items:
        raise BenchError(f"{p}: no prompts (expected one JSON object per line with 'messages')")
    return items


def select(items: list[PromptItem], *, categories: list[str] | None = None,
           limit: int | None = None) -> list[PromptItem]:
    """Keep the named categories, then at most ``limit`` items of each category (file order).

    Raises:
        BenchError: a category is not present in the set.
    """
    if categories:
        present = sorted({it.category for it in items})
        missing = [c for c in categories if c not in present]
        if missing:
            raise BenchError(f"category {missing[0]!r} is not in the prompt set (it has: {', '.join(present)})")
        items = [it for it in items if it.category in categories]
    if limit is not None:
        counts: dict[str, int] = {}
        kept = []
        for it in items:
            counts[it.category] = counts.get(it.category, 0) + 1
            if counts[it.category] <= limit:
                kept.append(it)
        items = kept
    return items


@dataclass
class PromptSet:
    """Items plus where they came from (for the report)."""

    items: list[PromptItem]
    source: str
    images: bool = False


def prompt_set(path: str | Path | None = None, *, mmproj: str | Path | None = None,
               image_dir: str | Path | None = None, categories: list[str] | None = None,
               limit: int | None = None) -> PromptSet:
    """The items a run uses: a user file, or the built-in set (with drawn images when an mmproj is
    given, text-only otherwise).

    Raises:
        BenchError: the file is bad, or it has images and no ``mmproj`` was given.
    """
    if path:
        items = select(load_prompts(path), categories=categories, limit=limit)
        with_images = [it for it in items if it.images]
        if with_images and not mmproj:
            it = with_images[0]
            raise BenchError(f"{it.source}: item {it.id!r} has an image ({it.images[0].name}) but no --mmproj "
                             "was given: add --mmproj, or remove the images from the file")
        return PromptSet(items, str(path), bool(with_images))
    if mmproj and image_dir is None:
        raise ValueError("image_dir is needed to draw the built-in images")
    items = select(builtin_prompts(image_dir=image_dir if mmproj else None), categories=categories, limit=limit)
    if mmproj:
        return PromptSet(items, "builtin, pictures drawn and sent as images", True)
    return PromptSet(items, "builtin, text-only (no --mmproj: pictures described in text)", False)


def render(client: Client, messages: list[dict], media_marker: str | None) -> tuple[Any, int | None]:
    """Prompt for ``/completion`` and its token count: token ids for text-only conversations
    (chat template, then ``/tokenize`` with BOS, as the chat endpoint does), or a multimodal prompt
    object (``prompt_string`` with media markers + base64 images) that every arm receives alike."""
    pictures: list[str] = []
    flat = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            text = ""
            for p in c:
                if p["type"] == "image":
                    if not media_marker:
                        raise BenchError("an image prompt needs a server started with --mmproj")
                    pictures.append(images.image_b64(p["path"]))
                    text += media_marker + "\n"
                else:
                    text += p["text"]
            c = text
        flat.append({"role": m["role"], "content": c})
    rendered = client.apply_template(flat)
    if pictures:
        return {"prompt_string": rendered, "multimodal_data": pictures}, None
    toks = client.tokenize(rendered, add_special=True)
    return toks, len(toks)
