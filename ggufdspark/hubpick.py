"""Which files of a Hub repo llama-server's ``-hf REPO[:QUANT]`` / ``-hfd REPO[:QUANT]`` take.

Pure functions over a repo listing (paths in the order the Hub lists them), restating the pinned
tree's rules (``common/download.cpp``: ``get_gguf_split_info``, ``find_best_model``,
``find_best_sibling``, ``get_split_files``; checked case by case in
``tests/test-model-resolution.cpp``, whose cases ``tests/test_hubref.py`` replays here):

| rule | pinned tree |
|---|---|
| the quant tag is matched case-insensitively as ``TAG`` followed by ``.`` or ``-`` anywhere in the path | ``find_best_model`` |
| no tag: ``Q4_K_M``, then ``Q8_0``, then the first model file listed | ``find_best_model`` |
| a model file's name holds none of ``SIDECAR_KEYWORDS`` | ``gguf_filename_is_model`` |
| a split model is taken by its first part; every part with its prefix and count comes along | ``get_split_files`` |
| a sidecar (``mmproj``, ``dspark-``) holds its keyword (case-sensitive) in its path, lives in the model's directory or above it (deepest first), then the one tagged exactly ``-TAG.``, then the quant bits closest to the tag's (no tag: to the model's) | ``find_best_sibling`` |
| quant bits: the first number of the tag (``Q4_K_M`` 4, ``BF16`` 16, ``MXFP4`` 4) | ``extract_quant_bits`` |
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

SIDECAR_KEYWORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
MMPROJ, DSPARK = "mmproj", "dspark-"
_SPLIT = re.compile(r"(.+)-([0-9]{5})-of-([0-9]{5})", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class SplitInfo:
    """A GGUF path read as llama.cpp reads it: the path without ``.gguf`` and the split suffix
    (``prefix``, the tag included), the tag upper-cased, and the part ``index`` of ``count``."""

    prefix: str
    tag: str
    index: int
    count: int


def split_info(path: str) -> SplitInfo | None:
    """``path`` as llama.cpp reads a GGUF name; None when it does not end in ``.gguf``."""
    if not path.endswith(".gguf"):
        return None
    prefix, index, count = path[:-5], 1, 1
    m = _SPLIT.fullmatch(prefix)
    if m:
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    t = _TAG.search(prefix)
    return SplitInfo(prefix, t.group(1).upper() if t else "", index, count)


def tag_bits(tag: str) -> int:
    """The first number in ``tag`` (``Q4_K_M`` -> 4, ``F16`` -> 16), 0 when there is none."""
    m = re.search(r"[0-9]+", tag)
    return int(m.group()) if m else 0


def file_bits(path: str) -> int:
    info = split_info(path)
    return tag_bits(info.tag) if info else 0


def is_model_file(path: str) -> bool:
    """A GGUF whose file name holds no sidecar keyword (``mmproj``, ``dspark-``, ...)."""
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(k in name for k in SIDECAR_KEYWORDS)


def _first_part(path: str) -> bool:
    info = split_info(path)
    return info is not None and not (info.count > 1 and info.index != 1)


def pick_model(files: Sequence[str], tag: str = "") -> str | None:
    """The model file ``-hf REPO[:TAG]`` takes (the first part of a split one), or None."""
    for t in ([tag] if tag else list(DEFAULT_TAGS)):
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for f in files:
            if is_model_file(f) and pattern.search(f) and _first_part(f):
                return f
    if not tag:
        return next((f for f in files if is_model_file(f) and _first_part(f)), None)
    return None


def pick_sibling(files: Sequence[str], model: str, keyword: str, tag: str = "") -> str | None:
    """The sidecar holding ``keyword`` that goes with ``model`` (a path in the repo, "" for none)."""
    tag_up = tag.upper()
    bits = tag_bits(tag_up) if tag_up else file_bits(model)
    model_dirs = model.split("/")[:-1]
    best, best_depth, best_diff, best_exact = None, 0, 0, False
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        dirs = f.split("/")[:-1]
        if len(dirs) > len(model_dirs) or model_dirs[:len(dirs)] != dirs:
            continue  # in another directory than the model's or one above it
        depth, diff = len(dirs), abs(file_bits(f) - bits)
        exact = bool(tag_up) and f"-{tag_up}." in f.upper()
        if (best is None or depth > best_depth or (depth == best_depth and exact and not best_exact)
                or (depth == best_depth and exact == best_exact and diff < best_diff)):
            best, best_depth, best_diff, best_exact = f, depth, diff, exact
    return best


def model_parts(files: Sequence[str], primary: str) -> list[str]:
    """Every part of ``primary`` (itself alone when it is not split), in listing order."""
    info = split_info(primary)
    if info is None or info.count <= 1:
        return [primary]
    return [f for f in files if (s := split_info(f)) and s.count == info.count and s.prefix == info.prefix]


def quants_present(files: Sequence[str], keyword: str | None = None) -> list[str]:
    """The quant tags of the model files (``keyword`` None) or of the sidecars holding ``keyword``,
    in listing order, each once."""
    out: list[str] = []
    for f in files:
        ok = is_model_file(f) if keyword is None else (f.endswith(".gguf") and keyword in f)
        info = split_info(f)
        if ok and info and info.tag and info.tag not in out:
            out.append(info.tag)
    return out
