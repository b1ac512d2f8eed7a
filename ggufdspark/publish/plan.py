"""The upload plan, from local files alone: check every target with its draft, name and hash the
files, pair the quants, write the cards; and, given a repo listing, warn where llama.cpp would take
another file than ours."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ggufdspark.check import PairReport, check_pair
from ggufdspark.errors import PublishError, PublishOptionError
from ggufdspark.gguffile.reader import GGUFFile, read_gguf
from ggufdspark.hubtext import strip_userinfo
from ggufdspark.measuring.profiles import file_sha256
from ggufdspark.publish.cards import (Pair, human_size, license_from_gguf, llama_server_command, render_card,
                                      serve_command)
from ggufdspark.publish.naming import (FILE_NAME, SIDECAR_KEYWORDS, file_tag, llama_cpp_pick, quant_label, repo_names,
                                       tag_bits, valid_repo_id)
from ggufdspark.publish.records import PlannedFile, PublishPlan, RepoPlan
from ggufdspark.publish.results import render_results
from ggufdspark.quants import QUANT_TYPES, RECOMMENDED_DRAFT

log = logging.getLogger(__name__)

Paths = str | Path | Sequence[str | Path]


def _card_file(card: str) -> PlannedFile:
    data = card.encode()
    return PlannedFile("card", "README.md", len(data), hashlib.sha256(data).hexdigest())


def _as_list(x: Paths | None) -> list[Path]:
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
            raise PublishOptionError(f"--pair {tq}={dq}: no {tq} target among {', '.join(target_quants)}")
        if dq not in draft_quants:
            raise PublishOptionError(f"--pair {tq}={dq}: no {dq} draft among {', '.join(draft_quants)}")
    bits = lambda q: QUANT_TYPES[q].bits if q in QUANT_TYPES else tag_bits(q)  # noqa: E731
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


def _planned_files(name: str, roles: Iterable[tuple[str, list[Path]]]
                   ) -> tuple[dict[str, list[PlannedFile]], dict[str, GGUFFile]]:
    """Each file named and hashed, by role; and each file's header, by its path in the repo."""
    ggufs: dict[str, GGUFFile] = {}
    by_role: dict[str, list[PlannedFile]] = {"target": [], "draft": [], "mmproj": []}
    for role, paths in roles:
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
    return by_role, ggufs


def _checked(by_role: dict[str, list[PlannedFile]], pairing: dict[str, str]) -> dict[str, PairReport]:
    """``check`` of every target with its draft (and the mmproj), by target quant; raises on a failure."""
    mm = by_role["mmproj"][0] if by_role["mmproj"] else None
    reports: dict[str, PairReport] = {}
    for t in by_role["target"]:
        d = next(f for f in by_role["draft"] if f.quant == pairing[t.quant])
        reports[t.quant] = check_pair(t.local, d.local, mm.local if mm else None)
        reports[t.quant].raise_for_failures()
    for d in by_role["draft"]:  # a draft paired with no target still has to belong to this model
        if d.quant not in pairing.values():
            check_pair(by_role["target"][0].local, d.local).raise_for_failures()
    return reports


def plan_publish(target: Paths, draft: Paths, *,
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
        if value is not None and not valid_repo_id(value):
            raise PublishOptionError(f"{what} {value!r} is not a valid repo id (ORG/NAME of letters, digits and _, "
                               f"joined by single '.' or '-')")
    targets, drafts = _as_list(target), _as_list(draft)
    if not targets or not drafts:
        raise PublishOptionError("give at least one --target and one --draft")
    by_role, ggufs = _planned_files(name, (("target", targets), ("mmproj", _as_list(mmproj)), ("draft", drafts)))
    tq = [f.quant for f in by_role["target"]]
    pairing = default_pairing(tq, [f.quant for f in by_role["draft"]], pairs)
    reports = _checked(by_role, pairing)
    results_md = [render_results(r, [f.sha256 for f in by_role["target"]], [f.sha256 for f in by_role["draft"]])
                  for r in results]
    first_t, first_d = by_role["target"][0], by_role["draft"][0]
    t_license = {"license": license} if license else license_from_gguf(ggufs[first_t.path_in_repo])
    d_license = {"license": license} if license else (license_from_gguf(ggufs[first_d.path_in_repo]) or t_license)
    mm = by_role["mmproj"][0] if by_role["mmproj"] else None
    pair = Pair(name, target_repo, draft_repo, by_role["target"], by_role["draft"], mm, pairing, ggufs, reports,
                {"target": t_license, "draft": d_license}, base_model, draft_base_model, results_md)
    repos = []
    for repo_id in dict.fromkeys([target_repo, draft_repo]):
        mine = [f for f in pair.files() if pair.repo_of(f) == repo_id]
        card = render_card(pair, repo_id)
        repos.append(RepoPlan(repo_id, private, mine + [_card_file(card)], card))
    quant_commands = {q: {**{b: llama_server_command(pair.ref("target", q), pair.ref("draft", q), b)
                             for b in ("cuda", "metal")},
                          "serve": serve_command(pair.ref("target", q), pair.ref("draft", q))} for q in tq}
    commands = {b: quant_commands[tq[0]][b] for b in ("cuda", "metal")}
    # the endpoint as shown (plan, JSON): a mirror's URL may carry credentials
    shown = strip_userinfo(endpoint or hf_constants.ENDPOINT)
    return PublishPlan(repos, commands, dry_run=True, endpoint=shown, pairing=pairing, quant_commands=quant_commands)


def resolution_warnings(plan: PublishPlan, listing: dict[str, list[str]]) -> None:
    """Add a warning to a repo of ``plan`` wherever llama.cpp's -hf / -hfd REPO:QUANT would take another
    file than ours, given each repo's file ``listing`` (repo id -> paths, in the Hub's order)."""
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
    for rp in plan.repos:  # files published earlier: a new one may take their tag (F16 matches "BF16.")
        for path, got, flag in _earlier_picks(rp, listing.get(rp.repo_id, [])):
            w = (f"{path} (published earlier) would no longer be what llama.cpp's {flag} loads: it would take "
                 f"{got or 'nothing'} (the new file matches that tag first); rename or remove one of them")
            if w not in rp.warnings:
                rp.warnings.append(w)


def _earlier_picks(rp: RepoPlan, files: list[str]) -> list[tuple[str, str | None, str]]:
    """(file already in the repo, what its tag resolves to now, the flag) for each earlier GGUF."""
    ours = {f.path_in_repo for f in rp.files}
    out = []
    for path in files:
        name = path.rsplit("/", 1)[-1]
        if not path.endswith(".gguf") or path in ours or not (tag := file_tag(path)):
            continue
        if name.startswith("dspark-"):
            out.append((path, llama_cpp_pick(files, tag, "dspark-"), f"-hfd {rp.repo_id}:{tag}"))
        elif not any(k in name for k in SIDECAR_KEYWORDS):
            out.append((path, llama_cpp_pick(files, tag), f"-hf {rp.repo_id}:{tag}"))
    return [(p, got, flag) for p, got, flag in out if got != p]


def add_earlier_files(rp: RepoPlan, remote: Mapping[str, tuple[int, str | None]]) -> None:
    """Make ``rp``'s card also list the GGUF files the repo already holds and this publish keeps
    (``remote``: path -> size, LFS sha256), so a second quant published later does not drop the
    first one from the card; the card's planned file follows the new text."""
    ours = {f.path_in_repo for f in rp.files}
    earlier = sorted(p for p in remote if p.endswith(".gguf") and p not in ours)
    if not earlier:
        return
    rows = ["", "Published earlier and still in this repo:", "", "| File | Type | Size | sha256 |", "|---|---|---:|---|"]
    for p in earlier:
        size, sha = remote[p]
        rows.append(f"| `{p}` | {file_tag(p) or '?'} | {human_size(size)} | `{sha or 'n/a'}` |")
    head, sep, rest = rp.card.partition("\n## Files\n")
    at = rest.find("\n## ")
    body = rest + "\n".join(rows) + "\n" if at < 0 else rest[:at] + "\n".join(rows) + "\n" + rest[at:]
    rp.card = head + sep + body if sep else rp.card + "\n".join(rows) + "\n"
    rp.files = [f for f in rp.files if f.role != "card"] + [_card_file(rp.card)]
