"""``publish``: put a checked target / DSpark draft pair (and an optional mmproj) on the Hugging Face
Hub, named so that ``llama-server -hf ORG/NAME-GGUF:F16 -hfd ORG/NAME-DSpark-GGUF:F16`` finds it,
with a model card per repo that says what the files are and how to run them.

    publish("t.gguf", "d.gguf", repo="org/Name", dry_run=True).plan     # nothing is sent
    publish("t.gguf", "d.gguf", repo="org/Name", on_plan=show).commits  # repo -> commit URL

Every Hub call goes through ``huggingface_hub`` (endpoint from ``HF_ENDPOINT``, token from its
usual sources: ``HF_TOKEN``, the saved login). Order of work: check the pair, hash the files, read
what the Hub already holds (read-only), hand the plan to ``on_plan``, then create the repos,
upload every new LFS object of every repo, and only then make one commit per repo. A failed upload
therefore commits nothing anywhere; files whose sha256 already matches on the Hub are not sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ggufdspark import __version__, hardware
from ggufdspark.check import PairReport, check_pair
from ggufdspark.engine import PIN_COMMIT
from ggufdspark.errors import GgufdsparkError, InputNotFoundError, PublishError
from ggufdspark.gguffile.constants import Key, TensorType
from ggufdspark.gguffile.reader import GGUFFile, read_gguf, shown
from ggufdspark.inspect import summarize_gguf
from ggufdspark.profiles import file_sha256
from ggufdspark.quants import FTYPE_LABELS, QUANT_TYPES, RECOMMENDED_DRAFT, TENSOR_LABELS

log = logging.getLogger(__name__)

# The quant labels (general.file_type -> Q4_K_M) are facts of ggufdspark.quants.

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
CARD_TAGS = ["gguf", "llama.cpp", "speculative-decoding", "dspark"]
MAX_RESULT_COLUMNS = 10


@dataclass(frozen=True)
class ResultLayout:
    """Where a report's measurements are and which of their fields the card shows."""

    tool: str
    rows_key: str
    columns: tuple[tuple[str, str], ...]  # (JSON field, column header)


# The JSON reports of this toolkit (``bench --json``: BenchReport.to_dict; ``tune --json`` and
# saved tune profiles: TuneResult.to_dict). The first layout whose rows are present wins; any other
# JSON is shown generically (its first list of objects).
RESULT_LAYOUTS = (
    ResultLayout("bench", "groups", (("name", "prompts"), ("requests", "requests"),
                                     ("plain_decode_tps", "plain tok/s"), ("spec_decode_tps", "with draft tok/s"),
                                     ("decode_speedup", "speedup"), ("accept_length_token_weighted", "accept length"),
                                     ("acceptance_rate", "acceptance rate"))),
    ResultLayout("tune", "points", (("n_max", "draft length"), ("p_min", "p_min"), ("level", "parallel requests"),
                                    ("speed", "tok/s"), ("ratio", "vs no draft"), ("accept_length", "accept length"))),
)
BENCH_LOAD_COLUMNS = (("level", "parallel requests"), ("plain_tps", "plain tok/s"), ("spec_tps", "with draft tok/s"),
                      ("ratio", "vs no draft"))
GENERIC_ROW_KEYS = ("rows", "results", "arms", "measurements", "runs")


@dataclass
class PlannedFile:
    role: str  # "target", "mmproj", "draft" or "card"
    path_in_repo: str
    size: int
    sha256: str
    local: str | None = None  # None for the card (built in memory)
    quant: str | None = None
    action: str = "upload"  # "upload", "skip" (same sha256 on the Hub)


@dataclass
class RepoPlan:
    repo_id: str
    private: bool
    files: list[PlannedFile]
    card: str
    exists: bool | None = None  # None: the Hub was not asked (dry run)
    head: str | None = None  # commit the upload builds on
    warnings: list[str] = field(default_factory=list)

    @property
    def to_upload(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action == "upload"]


@dataclass
class PublishPlan:
    repos: list[RepoPlan]
    commands: dict[str, str]  # backend -> llama-server command line, for the first target
    dry_run: bool
    endpoint: str
    pairing: dict[str, str] = field(default_factory=dict)  # target quant -> draft quant
    # target quant -> {"cuda": llama-server line, "metal": ..., "serve": ggufdspark serve line}
    quant_commands: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PublishResult:
    plan: PublishPlan
    commits: dict[str, str | None] = field(default_factory=dict)  # repo -> commit URL, None: up to date

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "commits": self.commits}


# --------------------------------------------------------------------------------------- naming


def quant_label(g: GGUFFile) -> str:
    """The quant label of a GGUF (``F16``, ``BF16``, ``Q8_0``...), from ``general.file_type``."""
    ft = g.metadata.get(Key.FILE_TYPE)
    if ft is not None:
        if isinstance(ft, int) and not isinstance(ft, bool) and ft in FTYPE_LABELS:
            return FTYPE_LABELS[ft]
        raise PublishError(f"{g.path}: unknown general.file_type {shown(ft)} (known: {sorted(FTYPE_LABELS)})")
    counts: dict[str, int] = {}
    for t in g.tensors.values():
        if len(t.shape) >= 2 and t.type in TENSOR_LABELS:
            label = TENSOR_LABELS[TensorType(t.type)]
            counts[label] = counts.get(label, 0) + t.n_elements
    if not counts:
        raise PublishError(f"{g.path}: no general.file_type and no F32/F16/BF16/Q8_0 matrices: "
                           "cannot name the file for -hf REPO:QUANT")
    label = max(counts, key=counts.get)
    log.info("%s: no general.file_type, named %s after its matrices", g.path.name, label)
    return label


def _valid_repo_id(r: str) -> bool:
    return bool(REPO_ID_RE.fullmatch(r)) and len(r.split("/")[1]) <= MAX_REPO_NAME


def repo_names(repo: str, draft_repo: str | None = None, single_repo: bool = False) -> tuple[str, str, str]:
    """``(model name, target repo, draft repo)`` for ``--repo ORG/NAME``.

    ``ORG/NAME`` gives ``ORG/NAME-GGUF`` and ``ORG/NAME-DSpark-GGUF`` (a trailing ``-GGUF`` on NAME
    is not doubled); ``single_repo`` puts the draft in the target repo.
    """
    if single_repo and draft_repo:
        raise PublishError("--single-repo and --draft-repo exclude each other")
    org, _, name = repo.partition("/")
    if name.upper().endswith(TARGET_SUFFIX):
        name = name[:-len(TARGET_SUFFIX)]
    target_repo = f"{org}/{name}{TARGET_SUFFIX}"
    draft_repo = target_repo if single_repo else (draft_repo or f"{org}/{name}{DRAFT_SUFFIX}")
    for r in (repo, target_repo, draft_repo):
        if not _valid_repo_id(r):
            raise PublishError(f"{r!r} is not a valid repo id (ORG/NAME of letters, digits and _, joined "
                               f"by single '.' or '-', name at most {MAX_REPO_NAME} characters)")
    bad = [k for k in SIDECAR_KEYWORDS if k in name]
    if bad:
        raise PublishError(f"model name {name!r} contains {bad[0]!r}: llama.cpp would take "
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


def _bits(tag: str) -> int:
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
    bits = _bits(tag) if tag else _bits(_split_tag(model)[0])
    best, best_key = None, None
    for f in files:
        if not f.endswith(".gguf") or keyword not in f:
            continue
        exact = bool(tag) and f"-{tag.upper()}." in f.upper()
        key = (not exact, abs(_bits(_split_tag(f)[0]) - bits))
        if best_key is None or key < best_key:
            best, best_key = f, key
    return best


# ----------------------------------------------------------------------------------------- cards


def human_size(n: int) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _hub_link(repo_id: str) -> str:
    return f"[{repo_id}](https://huggingface.co/{repo_id})"


def _describe(role: str, g: GGUFFile) -> str:
    d = summarize_gguf(g).details
    if role == "target":
        moe = (f", {d['experts']} experts ({d.get('experts_used')} active)" if d.get("experts") else "")
        return (f"target model: {g.arch}, {d.get('layers')} layers, hidden {d.get('hidden_size')}, "
                f"vocabulary {d.get('vocab_size')}{moe}")
    if role == "draft":
        extra = ", confidence head" if d.get("confidence_head") else ""
        return (f"DSpark draft: {d.get('layers')} layers, block size {d.get('block_size')}, reads target "
                f"layers {d.get('target_layer_ids')}, Markov rank {d.get('markov_rank')}{extra}")
    return (f"vision projector (mmproj): {d.get('projector_type')}, projects to "
            f"{d.get('projection_dim')}")


def llama_server_command(target_ref: str, draft_ref: str, backend: str) -> str:
    """The llama-server line for a backend of ``hardware.DEFAULTS`` (draft length, offload, -fa)."""
    d = hardware.DEFAULTS[backend]
    parts = ["llama-server", "-hf", target_ref, "-hfd", draft_ref, "--spec-type", "draft-dspark",
             "--spec-draft-n-max", str(d.draft_n_max)]
    if d.offload:
        parts += ["-ngl", "99", "-ngld", "99"]
    if d.flash_attn:
        parts += ["-fa", d.flash_attn]
    return " ".join(parts)


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v).replace("|", "\\|")


def _is_rows(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(rows: list[dict], columns: Iterable[tuple[str, str]]) -> list[str]:
    columns = list(columns)
    out = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(_fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]


def _generic_columns(rows: list[dict]) -> list[tuple[str, str]]:
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in cols and (v is None or isinstance(v, (int, float, str, bool))):
                cols.append(k)
    return [(c, c) for c in cols[:MAX_RESULT_COLUMNS]]


def _measured_on(data: dict) -> str | None:
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    hw = data.get("hardware")
    where = hw.get("key") if isinstance(hw, dict) else None
    if not where and settings.get("backend"):
        devs = [d.get("description") or d.get("name") for d in settings.get("devices") or [] if isinstance(d, dict)]
        where = settings["backend"] + (f", {devs[0]}" if devs and devs[0] else "")
    engine = str(settings.get("engine") or "").split(" ")[0]  # "COMMIT (/local/path)": the path stays home
    return ", ".join(x for x in (where, f"llama.cpp {engine}" if engine else None) if x) or None


def render_results(path: str | Path, target_sha: str | Iterable[str], draft_sha: str | Iterable[str]) -> str:
    """A markdown section from a ``bench`` or ``tune`` JSON report (or a saved tune profile): its
    measurements as a table, where and how they were taken, and the recommendation.

    Raises:
        InputNotFoundError: the file is missing. PublishError: not JSON, no measurements, or
        measured on another pair (its ``pair.target_sha256`` / ``pair.draft_sha256`` differ).
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputNotFoundError(f"{p}: no such results file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PublishError(f"{p}: not a JSON file ({e})") from None
    if not isinstance(data, dict):
        data = {"rows": data}
    pair = data.get("pair") if isinstance(data.get("pair"), dict) else {}
    for role, mine in (("target", target_sha), ("draft", draft_sha)):
        mine = [mine] if isinstance(mine, str) else list(mine)
        theirs = pair.get(f"{role}_sha256")
        if theirs and theirs not in mine:
            ours = " or ".join(f"{m[:16]}..." for m in mine)
            raise PublishError(f"{p}: measured on another {role} (sha256 {theirs[:16]}..., "
                               f"this {role} is {ours})")
    layout = next((lay for lay in RESULT_LAYOUTS if _is_rows(data.get(lay.rows_key))), None)
    if layout is not None:
        rows, columns, title = data[layout.rows_key], layout.columns, f"ggufdspark {layout.tool}"
        if layout.tool == "bench" and isinstance(data.get("overall"), dict):
            rows = rows + [{**data["overall"], "name": "all"}]
        if layout.tool == "tune" and _is_rows(data.get("plain")):  # the target alone, for scale
            rows = [{**r, "n_max": "none"} for r in data["plain"]] + rows
    else:
        key = next((k for k in GENERIC_ROW_KEYS if _is_rows(data.get(k))), None)
        key = key or next((k for k, v in data.items() if _is_rows(v)), None)
        if key is None:
            raise PublishError(f"{p}: no measurements found (not a 'ggufdspark bench' or 'tune' report, "
                               "and no list of objects)")
        rows, title = data[key], p.stem
        columns = _generic_columns(rows)
    out = [f"### {title}", ""]
    where = _measured_on(data)
    if where:
        out += [f"Measured on: {where}.", ""]
    acc = data.get("acceptance")
    if isinstance(data.get("synthetic"), str):  # bench: "synthetic acceptance, rates ..."
        synthetic = data["synthetic"]
    elif layout and layout.tool == "tune" and isinstance(acc, dict) and acc.get("source"):  # tune is always synthetic
        synthetic = f"synthetic acceptance: {acc['source']}"
    else:
        synthetic = None
    if synthetic:
        out += [f"{synthetic[0].upper()}{synthetic[1:]} (these rows measure speed only).", ""]
    out += _table(rows, columns)
    if layout and layout.tool == "bench" and _is_rows(data.get("load")):
        out += ["", "Under load:", ""] + _table(data["load"], BENCH_LOAD_COLUMNS)
    gate = data.get("gate")
    if isinstance(gate, dict) and gate.get("status"):
        out += ["", f"Lossless gate: {gate['status']}" + (f" ({gate['reason']})" if gate.get("reason") else "") + "."]
    rec = data.get("recommendation")
    if isinstance(rec, dict) and (rec.get("why") or rec.get("draft_n_max") is not None):
        why = rec.get("why") or f"draft length {rec['draft_n_max']}"
        out += ["", f"Recommended: {why.rstrip('.')}."]
    return "\n".join(out)


@dataclass
class _Pair:
    """What the cards and the plan are made from: one or several target quants (one file each), one
    or several drafts, an optional mmproj, and which draft goes with which target quant."""

    name: str
    target_repo: str
    draft_repo: str
    targets: list[PlannedFile]
    drafts: list[PlannedFile]
    mmproj: PlannedFile | None
    pairing: dict[str, str]  # target quant -> draft quant
    ggufs: dict[str, GGUFFile]  # path_in_repo -> header
    reports: dict[str, PairReport]  # target quant -> check of that target with its draft (and mmproj)
    licenses: dict[str, dict[str, str]]  # "target" / "draft" card -> license, license_name, license_link
    base_model: str | None
    draft_base_model: str | None
    results_md: list[str]

    @property
    def single(self) -> bool:
        return self.target_repo == self.draft_repo

    def files(self) -> list[PlannedFile]:
        return self.targets + ([self.mmproj] if self.mmproj else []) + self.drafts

    def target(self, quant: str) -> PlannedFile:
        return next(f for f in self.targets if f.quant == quant)

    def draft_for(self, quant: str) -> PlannedFile:
        return next(f for f in self.drafts if f.quant == self.pairing[quant])

    def ref(self, role: str, quant: str | None = None) -> str:
        """``REPO:QUANT`` for -hf (role "target") or -hfd (role "draft") of target quant ``quant``."""
        quant = quant or self.targets[0].quant
        if role == "draft":
            return f"{self.draft_repo}:{self.pairing[quant]}"
        return f"{self.target_repo}:{quant}"


def _front_matter(pair: _Pair, *, draft_card: bool) -> str:
    from huggingface_hub import ModelCardData

    base = pair.draft_base_model if draft_card else pair.base_model
    data = ModelCardData(
        base_model=base, base_model_relation="quantized" if base else None,
        pipeline_tag=None if draft_card else ("image-text-to-text" if pair.mmproj else "text-generation"),
        tags=CARD_TAGS + (["draft-model"] if draft_card or pair.single else []),
        **pair.licenses["draft" if draft_card else "target"])
    return f"---\n{data.to_yaml()}\n---\n"


def _files_table(pair: _Pair, files: Iterable[PlannedFile]) -> list[str]:
    out = ["| File | What it is | Type | Size | sha256 |", "|---|---|---|---:|---|"]
    for f in files:
        out.append(f"| `{f.path_in_repo}` | {_describe(f.role, pair.ggufs[f.path_in_repo])} | {f.quant} | "
                   f"{human_size(f.size)} | `{f.sha256}` |")
    return out


def serve_command(target_ref: str, draft_ref: str) -> str:
    """The ``ggufdspark serve`` line for a Hub pair (it picks the draft length for the hardware)."""
    return f"ggufdspark serve --hf {target_ref} --hfd {draft_ref}"


def _untagged_draft(pair: _Pair) -> str | None:
    """What ``-hfd DRAFT_REPO`` without a quant takes (two-repo layout): llama.cpp ranks the draft
    repo's ``dspark-`` files by quant bits closest to 0, i.e. the smallest draft."""
    if pair.single:
        return None
    return llama_cpp_pick([f.path_in_repo for f in pair.drafts], "", "dspark-", model="")


def render_card(pair: _Pair, repo_id: str) -> str:
    """The README.md of one repo of the pair (target repo, draft repo, or the single repo)."""
    is_target_repo = repo_id == pair.target_repo
    mine = [f for f in pair.files() if (pair.draft_repo if f.role == "draft" else pair.target_repo) == repo_id]
    source = pair.base_model if is_target_repo else pair.draft_base_model
    of = f" of {_hub_link(source)}" if source else ""
    quants = [t.quant for t in pair.targets]
    several = len(quants) > 1
    out = [_front_matter(pair, draft_card=not is_target_repo)]
    if pair.single:
        out += [f"# {pair.name} GGUF, with its DSpark draft", "",
                f"GGUF files{of} for llama.cpp, with a DSpark speculative-decoding draft: the draft "
                "proposes a block of tokens and the target checks them all in one pass."]
    elif is_target_repo:
        out += [f"# {pair.name} GGUF", "",
                f"GGUF files{of} for llama.cpp. A DSpark speculative-decoding draft for this model is in "
                f"{_hub_link(pair.draft_repo)}."]
    else:
        out += [f"# {pair.name} DSpark draft GGUF", "",
                f"A DSpark speculative-decoding draft{of} for llama.cpp, for the target model in "
                f"{_hub_link(pair.target_repo)}: the draft proposes a block of tokens and the target "
                "checks them all in one pass."]
    out += ["", "## Files", ""] + _files_table(pair, mine)

    first = pair.reports[quants[0]]
    dd = summarize_gguf(pair.ggufs[pair.draft_for(quants[0]).path_in_repo]).details
    out += ["", "## Pairing", "", "| Target | Draft | Checks |", "|---|---|---|"]
    for q in quants:
        t, d, checks = pair.target(q), pair.draft_for(q), pair.reports[q].checks
        out.append(f"| `{pair.target_repo}` `{t.path_in_repo}` | `{pair.draft_repo}` `{d.path_in_repo}` | "
                   f"{sum(c.ok for c in checks)}/{len(checks)} passed |")
    out.append("")
    for q in quants:
        t, d = pair.target(q), pair.draft_for(q)
        out.append(f"`{d.path_in_repo}` goes with `{t.path_in_repo}` (sha256 `{t.sha256}`).")
    out += ["", f"A draft goes with this model and no other: it reads the hidden states of target layers "
            f"{dd.get('target_layer_ids')} and uses the target's token embeddings at run time. "
            "`ggufdspark check` passed before upload"
            + (f" (shown for {first.pair_label()}; every pair above passed the same checks):" if several else ":"), ""]
    out += [f"- {c.name}: {c.detail}" for c in first.checks]

    out += ["", "## Run with llama-server", "",
            f"Needs a llama.cpp with `--spec-type draft-dspark` (commit {PIN_COMMIT} or later). "
            "`-hf REPO:QUANT` downloads that target" + (" and its mmproj" if pair.mmproj else "")
            + "; `-hfd REPO:QUANT` downloads the draft named below.", ""]
    for q in quants:
        d = pair.draft_for(q)
        if several:
            out += [f"### {q} (draft {d.quant})", ""]
        for backend, label in (("cuda", "CUDA"), ("metal", "Metal")):
            n = hardware.DEFAULTS[backend].draft_n_max
            out += [f"{label} (draft length {n}):", "", "```sh",
                    llama_server_command(pair.ref("target", q), pair.ref("draft", q), backend), "```", ""]
        out += ["With ggufdspark (checks the pair, picks the draft length for your hardware):", "", "```sh",
                serve_command(pair.ref("target", q), pair.ref("draft", q)), "```", "",
                f"Without the draft: `llama-server -hf {pair.ref('target', q)}`.", ""]
    untagged = _untagged_draft(pair)
    if untagged and len(pair.drafts) > 1:
        out += [f"Give the draft's quant with `-hfd`: without one, llama.cpp takes `{untagged}` "
                "(the fewest bits) whatever the target's quant.", ""]
    elif untagged:
        out += [f"`-hfd {pair.draft_repo}` without a quant also takes `{untagged}`, the only draft.", ""]
    if pair.mmproj:
        out += ["For text only, add `--no-mmproj`.", ""]
    out += ["Speculative decoding pays off at low concurrency; under many parallel requests or on "
            "slow per-step backends it can lose. Measure on your machine (`ggufdspark bench`, "
            "`ggufdspark tune`) and serve without `-hfd` where it does."]
    if pair.results_md:
        out += ["", "## Measured", "", "\n\n".join(pair.results_md)]
    out += ["", f"Published with ggufdspark {__version__}.", ""]
    return "\n".join(out).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------ plan


def license_from_gguf(g: GGUFFile) -> dict[str, str]:
    """Card license fields from ``general.license`` (+ ``.name``, ``.link``), which llama.cpp's
    converter copies from the source model's card; empty when the GGUF has none."""
    known = {"license": g.metadata.get("general.license"), "license_name": g.metadata.get("general.license.name"),
             "license_link": g.metadata.get("general.license.link")}
    return {k: str(v) for k, v in known.items() if v} if known["license"] else {}


def _card_file(card: str) -> PlannedFile:
    data = card.encode()
    return PlannedFile("card", "README.md", len(data), hashlib.sha256(data).hexdigest())


def _as_list(x: str | Path | Sequence[str | Path] | None) -> list[Path]:
    if x is None:
        return []
    if isinstance(x, (str, Path)):
        return [Path(x)]
    return [Path(p) for p in x]


def default_pairing(target_quants: Sequence[str], draft_quants: Sequence[str],
                    pairs: Mapping[str, str] | None = None) -> dict[str, str]:
    """Which draft goes with each target quant: ``pairs`` (target quant -> draft quant) where given;
    else the only draft; else the measured recommendation (``quants.RECOMMENDED_DRAFT``) when that
    draft is among them; else the draft of the same quant; else the draft with the most bits (drafts
    stay F16/BF16 unless measured otherwise: docs/quantize.md).

    Raises:
        PublishError: ``pairs`` names a quant that is not among the files.
    """
    pairs = {k.upper(): v.upper() for k, v in (pairs or {}).items()}
    for tq, dq in pairs.items():
        if tq not in target_quants:
            raise PublishError(f"--pair {tq}={dq}: no {tq} target among {', '.join(target_quants)}")
        if dq not in draft_quants:
            raise PublishError(f"--pair {tq}={dq}: no {dq} draft among {', '.join(draft_quants)}")
    bits = lambda q: QUANT_TYPES[q].bits if q in QUANT_TYPES else _bits(q)  # noqa: E731
    best = max(draft_quants, key=bits)

    def pick(tq: str) -> str:
        if tq in pairs:
            return pairs[tq]
        if len(draft_quants) == 1:
            return draft_quants[0]
        if RECOMMENDED_DRAFT.get(tq) in draft_quants:
            return RECOMMENDED_DRAFT[tq]
        return tq if tq in draft_quants else best

    return {tq: pick(tq) for tq in target_quants}


def plan_publish(target: str | Path | Sequence[str | Path], draft: str | Path | Sequence[str | Path], *,
                 repo: str, mmproj: str | Path | None = None, draft_repo: str | None = None,
                 single_repo: bool = False, private: bool = False, results: Iterable[str | Path] = (),
                 base_model: str | None = None, draft_base_model: str | None = None, license: str | None = None,
                 endpoint: str | None = None, pairs: Mapping[str, str] | None = None) -> PublishPlan:
    """Check the pairs, name and hash the files, write the cards. Reads local files only.

    ``target`` and ``draft`` are one file or several (one per quant: ``NAME-Q4_K_M.gguf``,
    ``NAME-Q8_0.gguf``...); ``pairs`` says which draft quant goes with which target quant (see
    ``default_pairing``).

    Raises:
        InputNotFoundError / CorruptFileError: a file is missing or not GGUF.
        PairMismatchError: a target and its draft (or the mmproj) fail ``check``.
        PublishError: a bad repo id or name, an unknown or repeated quant, unusable results.
    """
    from huggingface_hub import constants as hf_constants

    name, target_repo, draft_repo = repo_names(repo, draft_repo, single_repo)
    for what, value in (("base model", base_model), ("draft base model", draft_base_model)):
        # it lands in the card's YAML front matter and in markdown links: a repo id and nothing else
        if value is not None and not _valid_repo_id(value):
            raise PublishError(f"{what} {value!r} is not a valid repo id (ORG/NAME of letters, digits and _, "
                               f"joined by single '.' or '-')")
    targets, drafts = _as_list(target), _as_list(draft)
    if not targets or not drafts:
        raise PublishError("give at least one --target and one --draft")
    ggufs: dict[str, GGUFFile] = {}
    by_role: dict[str, list[PlannedFile]] = {"target": [], "draft": [], "mmproj": []}
    locals_: dict[str, Path] = {}
    for role, paths in (("target", targets), ("mmproj", _as_list(mmproj)), ("draft", drafts)):
        for p in paths:
            g = read_gguf(p)
            quant = quant_label(g)
            same = next((f for f in by_role[role] if f.quant == quant), None)
            if same is not None:
                raise PublishError(f"{p}: a second {quant} {role} (the first is {same.local}): one file per quant")
            log.info("hashing %s", p)
            f = PlannedFile(role, FILE_NAME[role].format(name=name, quant=quant), p.stat().st_size,
                            file_sha256(p), local=str(p), quant=quant)
            by_role[role].append(f)
            ggufs[f.path_in_repo] = g
            locals_[f.path_in_repo] = p
    tq = [f.quant for f in by_role["target"]]
    pairing = default_pairing(tq, [f.quant for f in by_role["draft"]], pairs)
    mm = by_role["mmproj"][0] if by_role["mmproj"] else None
    reports: dict[str, PairReport] = {}
    for t in by_role["target"]:
        d = next(f for f in by_role["draft"] if f.quant == pairing[t.quant])
        reports[t.quant] = check_pair(t.local, d.local, mm.local if mm else None)
        reports[t.quant].raise_for_failures()
    for d in by_role["draft"]:  # a draft paired with no target still has to belong to this model
        if d.quant not in pairing.values():
            check_pair(by_role["target"][0].local, d.local).raise_for_failures()
    results_md = [render_results(r, [f.sha256 for f in by_role["target"]], [f.sha256 for f in by_role["draft"]])
                  for r in results]
    first_t, first_d = by_role["target"][0], by_role["draft"][0]
    t_license = {"license": license} if license else license_from_gguf(ggufs[first_t.path_in_repo])
    d_license = {"license": license} if license else (license_from_gguf(ggufs[first_d.path_in_repo]) or t_license)
    pair = _Pair(name, target_repo, draft_repo, by_role["target"], by_role["draft"], mm, pairing, ggufs, reports,
                 {"target": t_license, "draft": d_license}, base_model, draft_base_model, results_md)
    repos = []
    for repo_id in dict.fromkeys([target_repo, draft_repo]):
        mine = [f for f in pair.files() if (draft_repo if f.role == "draft" else target_repo) == repo_id]
        card = render_card(pair, repo_id)
        repos.append(RepoPlan(repo_id, private, mine + [_card_file(card)], card))
    quant_commands = {q: {**{b: llama_server_command(pair.ref("target", q), pair.ref("draft", q), b)
                             for b in ("cuda", "metal")},
                          "serve": serve_command(pair.ref("target", q), pair.ref("draft", q))} for q in tq}
    commands = {b: quant_commands[tq[0]][b] for b in ("cuda", "metal")}
    return PublishPlan(repos, commands, dry_run=True, endpoint=endpoint or hf_constants.ENDPOINT,
                       pairing=pairing, quant_commands=quant_commands)


def _resolution_warnings(plan: PublishPlan, listing: dict[str, list[str]]) -> None:
    """Warn where llama.cpp would take another file than ours for -hf / -hfd REPO:QUANT."""
    where = {f.path_in_repo: rp for rp in plan.repos for f in rp.files if f.role != "card"}
    files = [f for rp in plan.repos for f in rp.files if f.role != "card"]
    targets = [f for f in files if f.role == "target"]
    mm = next((f for f in files if f.role == "mmproj"), None)
    picks = []
    for t in targets:
        t_repo = where[t.path_in_repo].repo_id
        picks.append((t, llama_cpp_pick(listing[t_repo], t.quant), f"-hf {t_repo}:{t.quant}"))
        if mm is not None:
            picks.append((mm, llama_cpp_pick(listing[t_repo], "", "mmproj", model=t.path_in_repo),
                          f"-hf {t_repo}:{t.quant}"))
        dq = plan.pairing.get(t.quant)
        d = next((f for f in files if f.role == "draft" and f.quant == dq), None)
        if d is not None:
            d_repo = where[d.path_in_repo].repo_id
            picks.append((d, llama_cpp_pick(listing[d_repo], dq, "dspark-"), f"-hfd {d_repo}:{dq}"))
    for f, got, flag in picks:
        rp = where[f.path_in_repo]
        w = (f"llama.cpp's {flag} would take {got or 'nothing'} as the {f.role}, not {f.path_in_repo} "
             "(another file in the repo matches first)")
        if got != f.path_in_repo and w not in rp.warnings:
            rp.warnings.append(w)


# --------------------------------------------------------------------------------------- the Hub


def _describe_error(e: BaseException, token: str | None) -> str:
    """One line from a Hub client exception and its causes (at most two), the token masked."""
    seen, parts = set(), []
    while e is not None and len(parts) < 2:
        status = getattr(getattr(e, "response", None), "status_code", None)
        server = getattr(e, "server_message", None)
        if status and server:
            line = f"HTTP {status}: {server.splitlines()[0]}"
        else:
            line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        line = line.rstrip(".")
        if line not in seen:
            seen.add(line)
            parts.append(line)
        if status:  # the HTTP error says it all; its causes repeat it
            break
        e = e.__cause__ or e.__context__
    text = ": ".join(parts)
    if token:
        text = text.replace(token, "***")
    return text[:400]


def _git_blob_id(path: str | Path) -> str:
    """git's blob id (sha1 of "blob SIZE\\0" + content), streamed."""
    p = Path(path)
    h = hashlib.sha1(b"blob %d\0" % p.stat().st_size)
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _remote_state(api, rp: RepoPlan) -> list[str]:
    """Fill ``exists``, ``head`` and each file's action from the Hub; returns the repo's file list."""
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils.sha import git_hash

    try:
        info = api.repo_info(rp.repo_id)
    except RepositoryNotFoundError:
        rp.exists = False
        return []
    rp.exists, rp.head = True, info.sha
    if rp.private and not info.private:
        rp.warnings.append(f"{rp.repo_id} exists and is public: --private does not change that")
    remote = {e.path: e for e in api.list_repo_tree(rp.repo_id, recursive=True, revision=info.sha)
              if isinstance(e, RepoFile)}
    for f in rp.files:
        e = remote.get(f.path_in_repo)
        if e is None or e.size != f.size:
            continue
        if e.lfs is not None:
            same = e.lfs.sha256 == f.sha256
        else:  # a regular git file: compare git blob ids
            same = e.blob_id == (git_hash(rp.card.encode()) if f.local is None else _git_blob_id(f.local))
        f.action = "skip" if same else "upload"
    return list(remote)


def _operations(rp: RepoPlan) -> list:
    from huggingface_hub import CommitOperationAdd

    ops = []
    for f in rp.to_upload:
        op = CommitOperationAdd(f.path_in_repo, f.local if f.local else rp.card.encode())
        op.upload_info.sha256 = bytes.fromhex(f.sha256)  # already hashed: not read twice
        ops.append(op)
    return ops


def _verify(api, rp: RepoPlan, commit: str) -> None:
    from huggingface_hub.hf_api import RepoFile

    remote = {e.path: e for e in api.list_repo_tree(rp.repo_id, recursive=True, revision=commit)
              if isinstance(e, RepoFile)}
    for f in rp.files:
        e = remote.get(f.path_in_repo)
        ok = e is not None and e.size == f.size and (e.lfs is None or e.lfs.sha256 == f.sha256)
        if not ok:
            found = f"{e.size} bytes" if e else "no file"
            raise PublishError(f"{rp.repo_id}: {f.path_in_repo} did not arrive intact (the Hub has {found}; "
                               f"expected {f.size} bytes, sha256 {f.sha256[:16]}...)")


def publish(target: str | Path | Sequence[str | Path], draft: str | Path | Sequence[str | Path], *, repo: str,
            mmproj: str | Path | None = None, draft_repo: str | None = None, single_repo: bool = False,
            private: bool = False, dry_run: bool = False, results: Iterable[str | Path] = (),
            base_model: str | None = None, draft_base_model: str | None = None, license: str | None = None,
            message: str | None = None, endpoint: str | None = None, token: str | None = None,
            on_plan: Callable[[PublishPlan], None] | None = None,
            pairs: Mapping[str, str] | None = None) -> PublishResult:
    """Publish a GGUF pair: ``ORG/NAME-GGUF`` (target, mmproj) and ``ORG/NAME-DSpark-GGUF`` (draft).

    Args:
        target, draft, mmproj: the GGUF files (target and draft: one, or several of different quants);
            each target must pass ``check`` with its draft.
        pairs: target quant -> draft quant (default: ``default_pairing``).
        repo: ``ORG/NAME``; ``draft_repo`` overrides the draft's repo, ``single_repo`` puts
            everything in ``ORG/NAME-GGUF``.
        dry_run: plan only; the Hub is not contacted and no token is needed.
        results: ``bench`` / ``tune`` JSON files rendered into the cards.
        base_model, draft_base_model: Hub ids of the source checkpoints (card metadata).
        license: card license; default: the target GGUF's ``general.license``.
        endpoint, token: default to huggingface_hub's (``HF_ENDPOINT``, ``HF_TOKEN``, saved login).
        on_plan: called with the plan after the Hub was read and before anything is written.

    Returns:
        PublishResult: the plan (each file marked upload / skip) and each repo's commit URL
        (None where the repo was already up to date).

    Raises:
        PairMismatchError: the pair fails ``check``.
        PublishError: no token, a Hub error (nothing is committed to a repo whose upload failed),
            or a file that did not arrive intact.
    """
    plan = plan_publish(target, draft, repo=repo, mmproj=mmproj, draft_repo=draft_repo,
                        single_repo=single_repo, private=private, results=results, base_model=base_model,
                        draft_base_model=draft_base_model, license=license, endpoint=endpoint, pairs=pairs)
    result = PublishResult(plan)
    local = {rp.repo_id: [f.path_in_repo for f in rp.files] for rp in plan.repos}
    if dry_run:
        _resolution_warnings(plan, local)
        if on_plan:
            on_plan(plan)
        return result

    from huggingface_hub import HfApi, get_token

    plan.dry_run = False
    token = token or get_token()
    if not token:
        raise PublishError("no Hugging Face token: run 'hf auth login' or set HF_TOKEN")
    with _masked_in_logs(token):  # a misbehaving endpoint may reflect it into a URL or header
        _publish(HfApi(endpoint=plan.endpoint, token=token), plan, result, local, message, token, on_plan)
    return result


class _MaskSecret(logging.Filter):
    """Replaces a secret by ``***`` in every record a handler emits (message, args, traceback)."""

    def __init__(self, secret: str):
        super().__init__()
        # a token's body alone is as good as the token ("hf_" is only its prefix)
        self.secrets = [secret] + ([secret[3:]] if secret.startswith("hf_") and len(secret) > 11 else [])

    def _mask(self, text: str) -> str:
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the logging module's business
            return True
        if any(s in msg for s in self.secrets):
            record.msg, record.args = self._mask(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._mask(record.exc_text)
        return True


@contextlib.contextmanager
def _masked_in_logs(secret: str) -> Iterator[None]:
    """Mask ``secret`` in everything logged while the block runs, by any logger (the Hub client and
    its HTTP library log URLs and headers at debug level)."""
    f = _MaskSecret(secret)
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = {h for lg in loggers for h in lg.handlers} | ({logging.lastResort} if logging.lastResort else set())
    for h in handlers:
        h.addFilter(f)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(f)


def _publish(api, plan: PublishPlan, result: PublishResult, local: dict[str, list[str]], message: str | None,
             token: str, on_plan: Callable[[PublishPlan], None] | None) -> None:
    current = plan.repos[0].repo_id
    try:
        remote = {}
        for rp in plan.repos:
            current = rp.repo_id
            remote[rp.repo_id] = _remote_state(api, rp)
    except Exception as e:  # the Hub client's errors (HTTP, connection), as one line
        raise PublishError(f"{current}: reading the Hub failed: {_describe_error(e, token)}") from None
    # what llama.cpp will list after the upload: the repo's files, then ours where new
    _resolution_warnings(plan, {r: remote[r] + [p for p in local[r] if p not in remote[r]] for r in local})
    for w in (w for rp in plan.repos for w in rp.warnings):
        log.warning("%s", w)
    if on_plan:
        on_plan(plan)
    _upload(api, plan, result, message, token)
    for rp in plan.repos:
        result.commits.setdefault(rp.repo_id, None)


def _upload(api, plan: PublishPlan, result: PublishResult, message: str | None, token: str) -> None:
    """Create the repos, upload every new object of every repo, then one commit per repo."""
    work = [(rp, _operations(rp)) for rp in plan.repos if rp.to_upload]
    stage, current = "creating the repo", ""
    try:
        for rp, _ in work:
            current = rp.repo_id
            if not rp.exists:
                log.info("creating %s (%s)", rp.repo_id, "private" if rp.private else "public")
                api.create_repo(rp.repo_id, private=rp.private, exist_ok=True)
                rp.head = api.repo_info(rp.repo_id).sha
        # every object of every repo before any commit: a failed upload leaves all repos as they were
        stage = "upload"
        for rp, ops in work:
            current = rp.repo_id
            log.info("uploading %s to %s", ", ".join(f.path_in_repo for f in rp.to_upload), rp.repo_id)
            api.preupload_lfs_files(rp.repo_id, additions=ops)
        stage = "commit"
        for rp, ops in work:
            current = rp.repo_id
            summary = message or f"Upload {', '.join(f.path_in_repo for f in rp.to_upload)} (ggufdspark publish)"
            info = api.create_commit(rp.repo_id, ops, commit_message=summary, parent_commit=rp.head)
            result.commits[rp.repo_id] = info.commit_url
            log.info("committed %s", info.commit_url)
            _verify(api, rp, info.oid)
    except GgufdsparkError:
        raise
    except Exception as e:  # the Hub client's errors (HTTP, connection, validation), as one line
        done = list(result.commits)
        also = (f"; {', '.join(done)} was committed, re-run to finish (files already there are skipped)"
                if done else "; nothing was committed")
        raise PublishError(f"{current}: {stage} failed: {_describe_error(e, token)}{also}") from None
