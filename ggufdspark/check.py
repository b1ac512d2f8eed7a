"""``check``: every reason a target / DSpark draft pair (and an optional mmproj) can fail, each
reported pass/fail with the values seen, before anyone waits for an engine to start."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ggufdspark import draftshapes, families
from ggufdspark.gguffile.mmproj import ClipKey, projector_width
from ggufdspark.errors import PairMismatchError
from ggufdspark.gguffile.constants import TOKENIZER_IDENTITY_KEYS, Key
from ggufdspark.gguffile.reader import GGUFFile, read_gguf
from ggufdspark.inspect import DSPARK_TENSORS, classify, tokenizer_value, vocab_size
from ggufdspark.quants import DRAFT_KEEP_FLOAT, RECOMMENDED_DRAFT, precision

MAX_BLOCK_SIZE = 64
# target archs whose graph (pinned llama.cpp) has no tappable hidden state after the last layer
LAST_LAYER_NOT_TAPPABLE = ("lfm2", "lfm2moe")
IMAGE_TOKENS = ("<image>", "<|image|>", "<|image_pad|>")


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass
class PairReport:
    target: str
    draft: str | None
    mmproj: str | None
    checks: list[CheckResult] = field(default_factory=list)
    # role -> quant label ("target": "Q4_K_M", "draft": "Q8_0"): any mix is accepted
    precisions: dict[str, str] = field(default_factory=dict)
    # the draft's Markov head type(s) ("F16"; "F16/Q8_0" when its two matrices differ), None without one
    markov_head: str | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.ok]

    def raise_for_failures(self) -> None:
        """Raise PairMismatchError naming every failed check (one line)."""
        bad = self.failures()
        if bad:
            reasons = "; ".join(f"{c.name}: {c.detail}" for c in bad)
            raise PairMismatchError(f"{self.draft or self.mmproj} does not belong with {self.target}: {reasons}")

    def pair_label(self) -> str:
        """``target Q4_K_M, draft Q8_0 (Markov head F16)`` (and the mmproj's), the precisions this
        report saw: two drafts of one label can differ in their Markov head (``quants.DRAFT_KEEP_FLOAT``)."""
        return ", ".join(f"{role} {label}" + (f" (Markov head {self.markov_head})" if role == "draft"
                                               and self.markov_head else "")
                         for role, label in self.precisions.items())

    def recommended_draft(self) -> str | None:
        """The draft precision measured best with this target's precision (``RECOMMENDED_DRAFT``: the
        pairing docs/quantize.md states, from an H200 table in docs/benchmarks.md) when it differs
        from this pair's draft; else None."""
        best = RECOMMENDED_DRAFT.get(self.precisions.get("target", ""))
        have = self.precisions.get("draft")
        return best if best and have and have != best else None

    def draft_precision_note(self) -> str | None:
        """``with a Q4_K_M target a Q8_0 draft measured faster than F16 on an H200 (docs/quantize.md)``
        when ``recommended_draft`` names one; else None."""
        best = self.recommended_draft()
        if best is None:
            return None
        return (f"with a {self.precisions['target']} target a {best} draft measured faster than "
                f"{self.precisions['draft']} on an H200 (docs/quantize.md)")

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "draft": self.draft, "mmproj": self.mmproj, "ok": self.ok,
                "precisions": self.precisions, "markov_head": self.markov_head, "recommended_draft": self.recommended_draft(),
                "checks": [asdict(c) for c in self.checks]}


def markov_head_type(g: GGUFFile) -> str | None:
    """The type of a draft's Markov head (``F16``; ``F16/Q8_0`` when its matrices differ), None
    when the file has none (``quants.DRAFT_KEEP_FLOAT`` names its tensors)."""
    types = [g.tensors[t].type_name for t in DRAFT_KEEP_FLOAT if t in g.tensors]
    return "/".join(dict.fromkeys(types)) or None


def _tokenizer_difference(t: GGUFFile, d: GGUFFile) -> str | None:
    for key in TOKENIZER_IDENTITY_KEYS:
        a, b = tokenizer_value(t, key), tokenizer_value(d, key)
        if a == b:
            continue
        short = key.removeprefix("tokenizer.ggml.")
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return f"{short}: target has {len(a)}, draft has {len(b)}"
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            return f"{short}[{i}]: target {a[i]!r}, draft {b[i]!r}"
        return f"{short}: target {a!r}, draft {b!r}"
    return None


def _target_shape(t: GGUFFile) -> families.TargetShape:
    return families.TargetShape(t.arch, t.get_int(Key.EMBEDDING_LENGTH), t.get_int(Key.BLOCK_COUNT), vocab_size(t))


def check_family(t: GGUFFile, d: GGUFFile) -> CheckResult | None:
    """Which published pair the draft was made for, against the target it meets (issue 16).

    None when the draft's shape is none of the published families' (nothing to say beyond the
    value checks). Fails, naming what differs, when the target is not the one the draft was made for.
    """
    taps = [x - 1 for x in (d.get_int_list(Key.TARGET_LAYERS) or [])]
    made_for = families.identify_draft(d.get_int(Key.EMBEDDING_LENGTH), taps, vocab_size(d))
    if not made_for:
        return None
    actual = _target_shape(t)
    found = families.identify_target(actual)
    if any(x in made_for for x in found):
        return CheckResult("same model family", True, f"draft and target: {families.names(found)}")
    expected = [families.target_shape(f.targets[size]) for f, size in made_for]
    diffs = families.differences(expected[0], actual)
    what = f"target is {families.names(found)}" if found else f"target ({actual.describe()}) is none of them"
    return CheckResult("same model family", False,
                       f"draft was made for {families.names(made_for)}, {what}: " + "; ".join(diffs))


def check_gguf_pair(t: GGUFFile, d: GGUFFile) -> list[CheckResult]:
    out: list[CheckResult] = []
    kind = classify(d)
    out.append(CheckResult("draft is a DSpark draft", kind == "dspark-draft",
                           f"arch {d.arch!r}, kind {kind}" + ("" if kind == "dspark-draft" else
                           f" (needs arch 'dflash' with {' and '.join(DSPARK_TENSORS)})")))
    tkind = classify(t)
    out.append(CheckResult("target is a text target", tkind == "target",
                           f"arch {t.arch!r}, kind {tkind}"))
    if tkind == "target" and kind == "dspark-draft" and (fam := check_family(t, d)) is not None:
        out.append(fam)
    diff = _tokenizer_difference(t, d)
    n_tok = len(t.get_str_list(Key.TOK_TOKENS) or [])
    out.append(CheckResult("tokenizers identical", diff is None,
                           diff or f"{n_tok} tokens, pre {t.get_str(Key.TOK_PRE)!r}, same merges and special ids"))
    th, dh = t.get_int(Key.EMBEDDING_LENGTH), d.get_int(Key.EMBEDDING_LENGTH)
    out.append(CheckResult("hidden size", th is not None and th == dh, f"target {th}, draft {dh}"))
    tv, dv = vocab_size(t), vocab_size(d)
    if (markov := d.tensor_shape("markov_w1.weight", 2)) is not None:
        mv = markov[0]
        dv = dv if dv == mv else f"{dv} (tokenizer) / {mv} (markov head)"
    out.append(CheckResult("vocabulary size", tv is not None and tv == dv, f"target {tv}, draft {dv}"))
    n_layers = t.get_int(Key.BLOCK_COUNT)
    taps = d.get_int_list(Key.TARGET_LAYERS) or []
    # the engine's convention: tap value i reads the hidden state after layer i - 1 (1..n_layers)
    bad = [x for x in taps if not (n_layers and 1 <= x <= n_layers)]
    detail = (f"draft taps layers {[x - 1 for x in taps]} of a {n_layers}-layer target"
              + (f"; missing: {[x - 1 for x in bad]}" if bad else "") if taps else "draft names no target layers")
    if taps and not bad and t.arch in LAST_LAYER_NOT_TAPPABLE and n_layers in taps:
        # src/models/lfm2.cpp (LFM2 and LFM2-MoE) records the input of layers 0..n-1 only: the hidden
        # state after the last layer is never exposed, and llama-server aborts at the first request
        # ("layer input tensor is null"); checked with the pinned engine
        bad = [n_layers]
        detail += (f"; layer {n_layers - 1} is the target's last: llama.cpp's {t.arch} graph exposes no "
                   f"hidden state after it (llama-server aborts at the first request)")
    out.append(CheckResult("tapped target layers exist", bool(taps) and not bad, detail))
    if (fc := d.tensor_shape("fc.weight", 2)) is not None and th and taps:
        width = fc[1]
        out.append(CheckResult("fc input width", width == len(taps) * th,
                               f"fc takes {width}, {len(taps)} taps x hidden {th} = {len(taps) * th}"))
    if kind == "dspark-draft":
        out += check_draft_shapes(d, vocab_size(d), len(taps))
    bs = d.get_int(Key.BLOCK_SIZE)
    out.append(CheckResult("block size sane", isinstance(bs, int) and 2 <= bs <= MAX_BLOCK_SIZE,
                           f"block_size {bs} (expected 2..{MAX_BLOCK_SIZE})"))
    mask = d.get_int(Key.TOK_MASK)
    if mask is not None:
        out.append(CheckResult("mask token in vocabulary", tv is not None and 0 <= mask < tv,
                               f"mask_token_id {mask}, vocabulary {tv}"))
    return out


def check_draft_shapes(d: GGUFFile, n_vocab: int | None, n_taps: int) -> list[CheckResult]:
    """The draft's attention heads, Markov head and tensors as llama.cpp's loader needs them
    (``draftshapes``): each failure names the value the engine would refuse at start."""
    hp = draftshapes.draft_hparams(d)
    if hp is None:
        return []
    out = []
    attention = draftshapes.attention_problem(hp)
    out.append(CheckResult("draft attention heads", attention is None, attention or draftshapes.describe_attention(hp)))
    rank = draftshapes.markov_rank(d)
    if rank is not None:
        out.append(CheckResult("draft Markov head rank", rank > 0,
                               f"rank {rank}" + ("" if rank > 0 else " (markov_w1.weight has no columns): expected at "
                                                 "least 1")))
    if attention is None and n_vocab and n_taps and (rank is None or rank > 0):
        expected = draftshapes.expected_tensors(hp, n_vocab=n_vocab, n_taps=n_taps, rank=rank)
        problem, n_bad = draftshapes.shape_problem(d, expected)
        out.append(CheckResult("draft tensor shapes", problem is None,
                               (problem + (f" (and {n_bad - 1} more)" if n_bad > 1 else "")) if problem else
                               f"{len(expected)} tensors as {hp.n_layer} layers, hidden {hp.n_embd} and "
                               f"{n_taps} taps imply"))
    types = draftshapes.type_problem(d)
    out.append(CheckResult("draft tensor types", types is None, types or "float or quantized weights"))
    return out


def check_mmproj(t: GGUFFile, m: GGUFFile) -> list[CheckResult]:
    ptype = m.get_str(ClipKey.PROJECTOR_TYPE)
    out = [CheckResult("mmproj is a vision projector", classify(m) == "mmproj" and
                       bool(m.metadata.get(ClipKey.HAS_VISION_ENCODER)),
                       f"arch {m.arch!r}, projector {ptype!r}")]
    rows, meta, tname = projector_width(m)
    width = rows if rows is not None else meta
    th = t.get_int(Key.EMBEDDING_LENGTH)
    detail = f"mmproj projects to {width} ({f'{tname} rows' if rows is not None else ClipKey.PROJECTION_DIM}), " \
             f"target hidden size {th}"
    consistent = rows is None or meta is None or rows == meta
    if not consistent:
        detail += f"; the file contradicts itself: {ClipKey.PROJECTION_DIM} says {meta}"
    out.append(CheckResult("projector output width", width is not None and width == th and consistent, detail))
    tokens = t.get_str_list(Key.TOK_TOKENS) or []
    found = [tok for tok in IMAGE_TOKENS if tok in tokens]
    out.append(CheckResult("image token in target tokenizer", bool(found),
                           f"found {found[0]!r}" if found else f"none of {list(IMAGE_TOKENS)} in the vocabulary"))
    return out


def check_pair(target: str | Path, draft: str | Path | None = None, mmproj: str | Path | None = None) -> PairReport:
    """Check a target GGUF against a draft GGUF and/or an mmproj GGUF (headers only).

    Precisions may differ freely (a Q4_K_M target with a Q8_0 or F16 draft): the report records
    which it saw (``PairReport.precisions``).

    Raises:
        InputNotFoundError / CorruptFileError for unreadable files; a mismatch is not raised but
        reported (see ``PairReport.raise_for_failures``).
    """
    t = read_gguf(target)
    report = PairReport(str(target), str(draft) if draft else None, str(mmproj) if mmproj else None)
    report.precisions["target"] = precision(t)
    if draft is not None:
        d = read_gguf(draft)
        report.precisions["draft"] = precision(d)
        report.markov_head = markov_head_type(d)
        report.checks += check_gguf_pair(t, d)
    if mmproj is not None:
        m = read_gguf(mmproj)
        report.precisions["mmproj"] = precision(m)
        report.checks += check_mmproj(t, m)
    return report
