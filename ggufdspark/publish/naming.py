"""How a published pair is named so that llama.cpp's ``-hf REPO:QUANT`` / ``-hfd REPO:QUANT`` find it:
the repo ids, the file names, and which file of a repo listing llama.cpp would take."""

from __future__ import annotations

import logging
import re

from ggufdspark.errors import PublishError, PublishOptionError
from ggufdspark.gguffile.constants import Key
from ggufdspark.gguffile.reader import GGUFFile, shown
from ggufdspark.quants import FTYPE_LABELS, TENSOR_LABELS, ftype_label, matrix_label

log = logging.getLogger(__name__)

# How llama.cpp's Hub resolution (common/download.cpp of the pinned tree) names files: the draft
# sidecar is found by "dspark-", the vision projector by "mmproj", and a file whose name holds any
# of these keywords is never taken as the model itself.
FILE_NAME = {"target": "{name}-{quant}.gguf", "mmproj": "mmproj-{name}-{quant}.gguf",
             "draft": "dspark-{name}-{quant}.gguf"}
SIDECAR_KEYWORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
# llama.cpp's is_valid_repo_id (common/hf-cache.cpp): [A-Za-z0-9_] runs joined by single . - or /,
# exactly one /. The Hub also caps a repo name at 96 characters.
REPO_ID_RE = re.compile(r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*/[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*")
MAX_REPO_NAME = 96

TARGET_SUFFIX, DRAFT_SUFFIX = "-GGUF", "-DSpark-GGUF"


def quant_label(g: GGUFFile) -> str:
    """The quant label of a GGUF (``F16``, ``BF16``, ``Q8_0``...) for its file name, from
    ``general.file_type``, else from the type of most of its matrices (``quants.precision``'s
    rules, with no guess where they give none).

    Raises:
        PublishError: ``general.file_type`` is not a known ``llama_ftype``, or the file has none and
            no F32/F16/BF16/Q8_0 matrices.
    """
    ft = g.metadata.get(Key.FILE_TYPE)
    if ft is not None:
        label = ftype_label(ft)
        if label is None:
            raise PublishError(f"{g.path}: unknown general.file_type {shown(ft)} (known: {sorted(FTYPE_LABELS)})")
        return label
    label = matrix_label(g)
    if label is None:
        raise PublishError(f"{g.path}: no general.file_type and no {'/'.join(TENSOR_LABELS.values())} matrices: "
                           "cannot name the file for -hf REPO:QUANT")
    log.info("%s: no general.file_type, named %s after its matrices", g.path.name, label)
    return label


def valid_repo_id(r: str) -> bool:
    """Whether ``r`` is a repo id llama.cpp and the Hub both take (``ORG/NAME``)."""
    return bool(REPO_ID_RE.fullmatch(r)) and len(r.split("/")[1]) <= MAX_REPO_NAME


def repo_names(repo: str, draft_repo: str | None = None, single_repo: bool = False) -> tuple[str, str, str]:
    """``(model name, target repo, draft repo)`` for ``--repo ORG/NAME``.

    ``ORG/NAME`` gives ``ORG/NAME-GGUF`` and ``ORG/NAME-DSpark-GGUF`` (a trailing ``-GGUF`` on NAME
    is not doubled); ``single_repo`` puts the draft in the target repo.

    Raises:
        PublishError: both ``draft_repo`` and ``single_repo``, an invalid repo id, or a name that
            llama.cpp would take for a sidecar.
    """
    if single_repo and draft_repo:
        raise PublishOptionError("--single-repo and --draft-repo exclude each other")
    org, _, name = repo.partition("/")
    if name.upper().endswith(TARGET_SUFFIX):
        name = name[:-len(TARGET_SUFFIX)]
    target_repo = f"{org}/{name}{TARGET_SUFFIX}"
    draft_repo = target_repo if single_repo else (draft_repo or f"{org}/{name}{DRAFT_SUFFIX}")
    for r in (repo, target_repo, draft_repo):
        if not valid_repo_id(r):
            raise PublishOptionError(f"{r!r} is not a valid repo id (ORG/NAME of letters, digits and _, joined "
                               f"by single '.' or '-', name at most {MAX_REPO_NAME} characters)")
    bad = [k for k in SIDECAR_KEYWORDS if k in name]
    if bad:
        raise PublishOptionError(f"model name {name!r} contains {bad[0]!r}: llama.cpp would take "
                           f"{name}-QUANT.gguf for a sidecar, never for the model; choose another --repo")
    return name, target_repo, draft_repo


def _split_tag(path: str) -> tuple[str, int, int]:
    """(tag, shard index, shard count) of a GGUF file name, as llama.cpp reads it."""
    stem = path[:-5] if path.endswith(".gguf") else path
    index = count = 1
    m = re.fullmatch(r"(.+)-(\d{5})-of-(\d{5})", stem, re.IGNORECASE)
    if m:
        stem, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    m = re.search(r"[-.]([A-Za-z0-9_]+)$", stem)
    return (m.group(1).upper() if m else ""), index, count


def file_tag(path: str) -> str:
    """The quant tag llama.cpp reads from a GGUF file name (``dspark-tiny-Q8_0.gguf`` -> ``Q8_0``)."""
    return _split_tag(path)[0]


def tag_bits(tag: str) -> int:
    """The quant bits llama.cpp reads from a tag: its first number (``Q4_K_M`` -> 4, ``F16`` -> 16)."""
    m = re.search(r"\d+", tag)
    return int(m.group()) if m else 0


def llama_cpp_pick(files: list[str], tag: str = "", keyword: str | None = None, *, model: str = "") -> str | None:
    """Which file of a flat repo listing llama.cpp's ``-hf REPO:TAG`` takes: the model (``keyword``
    None), or the sidecar whose name holds ``keyword`` ("mmproj", "dspark-"), ranked by an exact
    ``-TAG.`` first, then by the quant bits closest to the tag's (no tag: to ``model``'s).

    Restates find_best_model / find_best_sibling of common/download.cpp (pinned tree) for the plan's
    warnings; the tests hold it against the real llama-server. Ties go to the first file listed.
    """
    if keyword is None:
        pattern = re.compile(re.escape(tag) + r"[.-]", re.IGNORECASE)
        for f in files:
            name = f.rsplit("/", 1)[-1]
            if (f.endswith(".gguf") and not any(k in name for k in SIDECAR_KEYWORDS)
                    and pattern.search(f) and _split_tag(f)[1] == 1):
                return f
        return None
    bits = tag_bits(tag) if tag else tag_bits(_split_tag(model)[0])
    best, best_key = None, None
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        exact = bool(tag) and f"-{tag.upper()}." in f.upper()
        key = (not exact, abs(tag_bits(_split_tag(f)[0]) - bits))
        if best_key is None or key < best_key:
            best, best_key = f, key
    return best
