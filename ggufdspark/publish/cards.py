"""The model card (``README.md``) of each published repo: front matter, the files, the pairing and
its checks, the command lines per backend, and the measurements."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Iterable

from ggufdspark import __version__, hardware, launch
from ggufdspark.check import PairReport
from ggufdspark.engine import PIN_COMMIT
from ggufdspark.gguffile.reader import GGUFFile
from ggufdspark.inspect import summarize_gguf
from ggufdspark.publish.naming import llama_cpp_pick
from ggufdspark.publish.records import PlannedFile
from ggufdspark.runners.tensor_overrides import TOKEN_TABLE_PATTERN

CARD_TAGS = ["gguf", "llama.cpp", "speculative-decoding", "dspark"]


@dataclass
class Pair:
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

    def repo_of(self, f: PlannedFile) -> str:
        """The repo a file goes to: the draft repo for drafts, the target repo for the rest."""
        return self.draft_repo if f.role == "draft" else self.target_repo

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


def human_size(n: int) -> str:
    """``n`` bytes as ``1.2 GB`` / ``3.4 MB`` / ``5.6 kB`` / ``78 B`` (powers of 1000, as the Hub shows them)."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def llama_server_command(target_ref: str, draft_ref: str, backend: str) -> str:
    """The llama-server line for a backend of ``hardware.DEFAULTS`` (draft length, offload, -fa, the
    token table on one CUDA GPU), as ``ggufdspark.launch`` builds it for any llama-server (no patch
    known: no load cut), without ``-c``, ``-np``, ``--metrics`` or the network flags, which are the
    reader's to choose; quoted for a shell (the token table's pattern holds a backslash)."""
    settings = launch.server_settings(launch.table_decision(backend), None, hf=target_ref, hfd=draft_ref,
                                      ctx=None, parallel=None, metrics=False)
    return shlex.join(settings.args(network=False))


def serve_command(target_ref: str, draft_ref: str) -> str:
    """The ``ggufdspark serve`` line for a Hub pair (it picks the draft length for the hardware)."""
    return f"ggufdspark serve --hf {target_ref} --hfd {draft_ref}"


def license_from_gguf(g: GGUFFile) -> dict[str, str]:
    """Card license fields from ``general.license`` (+ ``.name``, ``.link``), which llama.cpp's
    converter copies from the source model's card; empty when the GGUF has none."""
    known = {"license": g.metadata.get("general.license"), "license_name": g.metadata.get("general.license.name"),
             "license_link": g.metadata.get("general.license.link")}
    return {k: str(v) for k, v in known.items() if v} if known["license"] else {}


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


def _front_matter(pair: Pair, *, draft_card: bool) -> str:
    from huggingface_hub import ModelCardData

    base = pair.draft_base_model if draft_card else pair.base_model
    data = ModelCardData(
        base_model=base, base_model_relation="quantized" if base else None,
        pipeline_tag=None if draft_card else ("image-text-to-text" if pair.mmproj else "text-generation"),
        tags=CARD_TAGS + (["draft-model"] if draft_card or pair.single else []),
        **pair.licenses["draft" if draft_card else "target"])
    return f"---\n{data.to_yaml()}\n---\n"


def _files_table(pair: Pair, files: Iterable[PlannedFile]) -> list[str]:
    out = ["| File | What it is | Type | Size | sha256 |", "|---|---|---|---:|---|"]
    for f in files:
        out.append(f"| `{f.path_in_repo}` | {_describe(f.role, pair.ggufs[f.path_in_repo])} | {f.quant} | "
                   f"{human_size(f.size)} | `{f.sha256}` |")
    return out


def _untagged_draft(pair: Pair) -> str | None:
    """What ``-hfd DRAFT_REPO`` without a quant takes (two-repo layout): llama.cpp ranks the draft
    repo's ``dspark-`` files by quant bits closest to 0, i.e. the smallest draft."""
    if pair.single:
        return None
    return llama_cpp_pick([f.path_in_repo for f in pair.drafts], "", "dspark-", model="")


def _intro(pair: Pair, is_target_repo: bool) -> list[str]:
    source = pair.base_model if is_target_repo else pair.draft_base_model
    of = f" of {_hub_link(source)}" if source else ""
    if pair.single:
        return [f"# {pair.name} GGUF, with its DSpark draft", "",
                f"GGUF files{of} for llama.cpp, with a DSpark speculative-decoding draft: the draft "
                "proposes a block of tokens and the target checks them all in one pass."]
    if is_target_repo:
        return [f"# {pair.name} GGUF", "",
                f"GGUF files{of} for llama.cpp. A DSpark speculative-decoding draft for this model is in "
                f"{_hub_link(pair.draft_repo)}."]
    return [f"# {pair.name} DSpark draft GGUF", "",
            f"A DSpark speculative-decoding draft{of} for llama.cpp, for the target model in "
            f"{_hub_link(pair.target_repo)}: the draft proposes a block of tokens and the target "
            "checks them all in one pass."]


def _pairing_section(pair: Pair) -> list[str]:
    quants = [t.quant for t in pair.targets]
    first = pair.reports[quants[0]]
    dd = summarize_gguf(pair.ggufs[pair.draft_for(quants[0]).path_in_repo]).details
    out = ["", "## Pairing", "", "| Target | Draft | Checks |", "|---|---|---|"]
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
            + (f" (shown for {first.pair_label()}; every pair above passed the same checks):"
               if len(quants) > 1 else ":"), ""]
    return out + [f"- {c.name}: {c.detail}" for c in first.checks]


def _run_section(pair: Pair) -> list[str]:
    quants = [t.quant for t in pair.targets]
    out = ["", "## Run with llama-server", "",
           f"Needs a llama.cpp with `--spec-type draft-dspark` (commit {PIN_COMMIT} or later). "
           "`-hf REPO:QUANT` downloads that target" + (" and its mmproj" if pair.mmproj else "")
           + "; `-hfd REPO:QUANT` downloads the draft named below.", ""]
    for q in quants:
        d = pair.draft_for(q)
        if len(quants) > 1:
            out += [f"### {q} (draft {d.quant})", ""]
        for backend, label in (("cuda", "CUDA"), ("metal", "Metal")):
            n = hardware.DEFAULTS[backend].draft_n_max
            out += [f"{label} (draft length {n}):", "", "```sh",
                    llama_server_command(pair.ref("target", q), pair.ref("draft", q), backend), "```", ""]
        out += ["With ggufdspark (checks the pair, picks the draft length for your hardware):", "", "```sh",
                serve_command(pair.ref("target", q), pair.ref("draft", q)), "```", "",
                f"Without the draft: `llama-server -hf {pair.ref('target', q)}`.", ""]
    table = launch.table_decision("cuda").token_table_device
    if table:
        out += [f"On CUDA, `-ot '{TOKEN_TABLE_PATTERN}={table}'` loads the token table onto the GPU, where "
                "llama.cpp would keep it on the CPU (a faster drafted step); leave it out with more than one "
                "GPU, where any tensor override turns llama.cpp's pipeline parallelism off.", ""]
    untagged = _untagged_draft(pair)
    if untagged and len(pair.drafts) > 1:
        out += [f"Give the draft's quant with `-hfd`: without one, llama.cpp takes `{untagged}` "
                "(the fewest bits) whatever the target's quant.", ""]
    elif untagged:
        out += [f"`-hfd {pair.draft_repo}` without a quant also takes `{untagged}`, the only draft.", ""]
    if pair.mmproj:
        out += ["For text only, add `--no-mmproj`.", ""]
    return out + ["Speculative decoding pays off at low concurrency; under many parallel requests or on "
                  "slow per-step backends it can lose. Measure on your machine (`ggufdspark bench`, "
                  "`ggufdspark tune`) and serve without `-hfd` where it does."]


def render_card(pair: Pair, repo_id: str) -> str:
    """The README.md of one repo of the pair (target repo, draft repo, or the single repo)."""
    is_target_repo = repo_id == pair.target_repo
    mine = [f for f in pair.files() if pair.repo_of(f) == repo_id]
    out = [_front_matter(pair, draft_card=not is_target_repo)] + _intro(pair, is_target_repo)
    out += ["", "## Files", ""] + _files_table(pair, mine)
    out += _pairing_section(pair) + _run_section(pair)
    if pair.results_md:
        out += ["", "## Measured", "", "\n\n".join(pair.results_md)]
    out += ["", f"Published with ggufdspark {__version__}.", ""]
    return "\n".join(out).rstrip("\n") + "\n"
