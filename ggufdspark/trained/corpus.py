"""The training text: the ``.py`` files of a Python standard library, split by file into training and
held-out sets, and the byte-level BPE tokenizer trained on the training set.

Any machine with Python has this text, so the recipe needs no download. The split is by a hash of
each file's path relative to the library (about one file in twenty held out), so it is the same on
every machine with the same Python version; the shipped pair's corpus came from CPython 3.11.
"""

from __future__ import annotations

import hashlib
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

# where the held-out files are: sha1(relative path) mod HOLDOUT_MOD == 0 (evaluation), in DISTILL
# (the prompts of the drafter's training data: text the target never trained on, as a user's prompt is)
HOLDOUT_MOD = 20
DISTILL = (1, 2, 3)
# files larger than this are mostly data tables (unicodedata-like), not code to learn from
MAX_FILE_BYTES = 400_000
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "lib2to3", "pydoc_data", "encodings"}


@dataclass
class Source:
    rel: str
    text: str

    @property
    def bucket(self) -> int:
        return int(hashlib.sha1(self.rel.encode()).hexdigest(), 16) % HOLDOUT_MOD

    @property
    def held_out(self) -> bool:
        return self.bucket == 0

    @property
    def distill(self) -> bool:
        return self.bucket in DISTILL


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def python_sources(root: Path | None = None, limit_bytes: int | None = None) -> list[Source]:
    """Every ``.py`` file under ``root`` (default: this Python's standard library), sorted by path,
    without third-party and generated folders; ``limit_bytes`` keeps the first files up to that size."""
    root = Path(root) if root else stdlib_root()
    out, total = [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if set(rel.split("/")[:-1]) & SKIP_DIRS:
            continue
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if len(data) > MAX_FILE_BYTES:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(Source(rel, text))
        total += len(data)
        if limit_bytes and total >= limit_bytes:
            break
    return out


def split(sources: list[Source]) -> tuple[list[Source], list[Source], list[Source]]:
    """(the target's training files, the distillation prompts' files, the held-out files)."""
    train = [s for s in sources if not s.held_out and not s.distill]
    distill = [s for s in sources if s.distill]
    held = [s for s in sources if s.held_out]
    return train, distill, held


def train_tokenizer(out: Path, texts: list[str], vocab_size: int) -> dict[str, int]:
    """An LFM2-style byte-level BPE (``ggufdspark.synthetic.tokenizer``'s pre-tokenizer, special
    tokens and chat template) trained on ``texts``; written to ``out`` in Hub layout."""
    from ggufdspark.synthetic.tokenizer import make_tokenizer

    return make_tokenizer(out, vocab_size, corpus=texts)


def encode(tokenizer_dir: Path, sources: list[Source]) -> np.ndarray:
    """All files as one stream of token ids (uint16), each file opened by ``<|startoftext|>``."""
    from tokenizers import Tokenizer

    from ggufdspark.synthetic.tokenizer import BOS

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    tok.no_padding()
    bos = tok.token_to_id(BOS)
    ids: list[int] = []
    texts = [s.text for s in sources]
    for i in range(0, len(texts), 256):
        for enc in tok.encode_batch(texts[i:i + 256], add_special_tokens=False):
            ids.append(bos)
            ids.extend(enc.ids)
    arr = np.asarray(ids, dtype=np.uint16 if tok.get_vocab_size() <= 65535 else np.uint32)
    return arr


def build(out: Path, vocab_size: int = 8192, limit_bytes: int | None = None, root: Path | None = None) -> dict:
    """Tokenizer (``out/tokenizer``), ``out/train.npy`` and ``out/heldout.npy``; returns the facts."""
    out = Path(out)
    sources = python_sources(root, limit_bytes)
    train, distill, held = split(sources)
    log.info("corpus: %d files (%d for distillation prompts, %d held out), %.1f MB", len(sources), len(distill),
             len(held), sum(len(s.text) for s in sources) / 1e6)
    train_tokenizer(out / "tokenizer", [s.text for s in train], vocab_size)
    tr, di, ho = (encode(out / "tokenizer", x) for x in (train, distill, held))
    np.save(out / "train.npy", tr)
    np.save(out / "distill.npy", di)
    np.save(out / "heldout.npy", ho)
    import sys

    facts = {"python": sys.version.split()[0], "root": str(root or stdlib_root()), "files": len(sources),
             "heldout_files": len(held), "bytes": sum(len(s.text.encode()) for s in sources),
             "distill_files": len(distill), "train_tokens": int(tr.size), "distill_tokens": int(di.size),
             "heldout_tokens": int(ho.size), "vocab_size": vocab_size,
             "heldout_names": [s.rel for s in held]}
    import json

    (out / "corpus.json").write_text(json.dumps(facts, indent=1))
    return facts
