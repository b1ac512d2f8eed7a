"""Hub references: ``ORG/NAME[:QUANT]`` wherever a GGUF is taken, resolved through huggingface_hub.

    from ggufdspark.hubref import resolve_pair
    pair = resolve_pair("org/Tiny-LFM2-GGUF:Q8_0", "org/Tiny-LFM2-DSpark-GGUF:Q8_0")
    pair.target, pair.draft, pair.mmproj        # local paths in the Hugging Face cache

The files are picked as the pinned llama-server's ``-hf`` / ``-hfd`` pick them
(``ggufdspark.hubpick``) and downloaded with ``hf_hub_download`` into huggingface_hub's own cache,
shared with every other Hugging Face tool: ``HF_HOME`` / ``HF_HUB_CACHE`` say where, ``HF_ENDPOINT``
which Hub, ``HF_TOKEN`` or ``hf auth login`` who asks (gated and private repos), and
``HF_HUB_OFFLINE=1`` keeps everything to the cache. A download whose connection breaks resumes from
where it stopped (huggingface_hub retries with a ``Range`` request) and a file appears in the cache's
snapshot only once complete and of the listed size; one that fails for good leaves nothing behind
(huggingface_hub 2.x deletes its process-unique ``.incomplete`` file), so nothing half-downloaded is
ever handed on. When the Hub cannot be reached, a repo already in the cache is used from there
(with a warning), as huggingface_hub does for single files.

A value is a reference when it names no existing file, does not end in ``.gguf``, reads
``ORG/NAME[:QUANT]`` (llama.cpp's repo-id rule: letters, digits and ``_`` joined by single ``.``/``-``)
and its ``ORG`` is not a folder of the working directory. That last rule keeps a mistyped local path
(``-m models/llm-q8``, ``.gguf`` forgotten, beside a ``models/`` folder) from going to the Hub with
the user's token: it is a path, and a missing one is an error that says why it was not read as a
repo (and names ``models/llm-q8.gguf`` when that exists). A path that starts with ``/``, ``.`` or
``~``, holds more than one ``/`` or ends in ``.gguf`` never reads as a reference anyway. A Hub
repo whose org is also a folder here is reached from another working directory. A reference the
Hub does not know is reported as both: no such repo, and no local file of that name.

What the Hub (or a mirror named by ``HF_ENDPOINT``) answers goes through ``ggufdspark.hubtext``
before any path is built from it: a commit that is not 40 hex digits, or a listed name that is not a
plain relative path, refuses the whole listing (a ``refs/main`` in the cache likewise); text quoted
in a message is kept to one bounded line.

A read-only cache (a shared one on a cluster) serves what it holds: ``refs/main`` is written only
when it changes, and a write that fails is a warning, not an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ggufdspark import hubpick
from ggufdspark.hubtext import COMMIT_RE, check_names, listed, say_error, shown, strip_userinfo
from ggufdspark.errors import (HubAccessError, HubConnectionError, HubError, HubNotFoundError, InputNotFoundError,
                               InvalidArgumentError)

log = logging.getLogger(__name__)

_NAME = r"[A-Za-z0-9_]+(?:[.-][A-Za-z0-9_]+)*"
REF_RE = re.compile(rf"(?P<repo>{_NAME}/{_NAME})(?::(?P<tag>[^:/\s]+))?")
ROLES = ("target", "draft", "mmproj", "any")


@dataclass(frozen=True)
class HubRef:
    """``repo`` and the quant ``tag`` ("" when none was given)."""

    repo: str
    tag: str = ""

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}" if self.tag else self.repo


def _local_org(s: str) -> str | None:
    """The ``ORG`` of ``ORG/NAME[:QUANT]`` when it is a folder of the working directory."""
    org = s.split("/", 1)[0]
    return org if "/" in s and os.path.isdir(org) else None


def is_ref(value: object) -> bool:
    """Whether ``value`` is a Hub reference rather than a file (see the module docstring)."""
    if value is None or isinstance(value, Path):
        return False
    s = str(value)
    return (not s.lower().endswith(".gguf") and not os.path.exists(s) and bool(REF_RE.fullmatch(s))
            and _local_org(s) is None)


def refuse_missing_paths(*values: object) -> None:
    """Raise for the first value that reads ``ORG/NAME[:QUANT]`` but is a local path (its ``ORG``
    is a folder here) naming nothing: the message gives both readings, nothing goes to the Hub.

    Raises:
        InputNotFoundError: such a value.
    """
    for v in values:
        if v is None or isinstance(v, Path):
            continue
        s = str(v)
        org = _local_org(s)
        if org is None or os.path.exists(s) or s.lower().endswith(".gguf") or not REF_RE.fullmatch(s):
            continue
        hint = f"; did you mean {s}.gguf?" if os.path.isfile(s + ".gguf") else ""
        raise InputNotFoundError(f"{s}: no such file ({org}/ is a local folder, so it is not read as a Hub repo)"
                                 f"{hint}")


def parse_ref(text: str) -> HubRef:
    """``"ORG/NAME:Q8_0"`` -> ``HubRef("ORG/NAME", "Q8_0")``.

    Raises:
        InvalidArgumentError: not ``ORG/NAME[:QUANT]``.
    """
    m = REF_RE.fullmatch(str(text).strip())
    if not m:
        raise InvalidArgumentError(f"{text!r}: not a Hub reference ORG/NAME[:QUANT] (nor an existing file)")
    return HubRef(m.group("repo"), m.group("tag") or "")


@dataclass
class Listing:
    """A repo's files at one commit, from the Hub or (``cached``) from the local cache alone."""

    repo: str
    commit: str
    files: list[str]
    cached: bool = False
    snapshot: Path | None = None  # the cache's snapshot directory (cached listings)
    sizes: dict[str, int] = field(default_factory=dict)  # bytes per path, where the Hub said


@dataclass
class Resolved:
    """What a reference resolved to: ``path`` (the first part of a split model), every part, and
    the sidecars found beside a target (``mmproj``, ``dspark``: the draft of a one-repo pair)."""

    ref: HubRef
    role: str
    commit: str
    repo_path: str
    path: Path
    parts: list[Path] = field(default_factory=list)
    mmproj: Path | None = None
    dspark: Path | None = None
    from_cache: bool = False

    def to_dict(self) -> dict:
        """JSON-ready: the reference, the repo file taken, the commit and the local paths."""
        return {"ref": str(self.ref), "role": self.role, "commit": self.commit, "file": self.repo_path,
                "path": str(self.path), "parts": [str(p) for p in self.parts],
                "mmproj": str(self.mmproj) if self.mmproj else None,
                "dspark": str(self.dspark) if self.dspark else None, "from_cache": self.from_cache}


@dataclass
class LocalPair:
    """``resolve_pair``'s answer: local paths (unchanged where a file was given) and what each
    reference resolved to, by role."""

    target: str | Path | None
    draft: str | Path | None = None
    mmproj: str | Path | None = None
    resolved: dict[str, Resolved] = field(default_factory=dict)


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is, where its cache is, and whether to stay offline: huggingface_hub's own
    settings, read from the environment at call time (its ``constants`` keep what the environment
    said when it was first imported, which a script or a test may have changed since)."""

    endpoint: str
    cache: Path
    offline: bool

    @property
    def shown(self) -> str:
        """The endpoint as it is shown: without the ``user:password@`` a mirror's URL may carry."""
        return strip_userinfo(self.endpoint)

    @classmethod
    def now(cls) -> "HubSettings":
        from huggingface_hub import constants

        env = os.environ
        endpoint = (env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        if env.get("HF_HUB_CACHE"):
            cache = Path(env["HF_HUB_CACHE"])
        elif env.get("HF_HOME"):
            cache = Path(env["HF_HOME"]) / "hub"
        else:
            cache = Path(constants.HF_HUB_CACHE)
        flag = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE")
        offline = flag.strip().upper() in ("1", "ON", "YES", "TRUE") if flag is not None else constants.HF_HUB_OFFLINE
        return cls(endpoint, cache.expanduser(), offline)


_hub = HubSettings.now


def _cache_dir(repo: str) -> Path:
    return _hub().cache / ("models--" + repo.replace("/", "--"))


def _cached_listing(repo: str) -> Listing | None:
    """The cache's snapshot of ``repo``'s main branch, or None when it was never downloaded.

    Raises:
        HubError: ``refs/main`` holds something else than a commit id (a path would make any
            folder the snapshot), or the snapshot a name that is not a plain relative path.
    """
    d = _cache_dir(repo)
    ref = d / "refs" / "main"
    try:
        with open(ref, encoding="utf-8", errors="replace") as f:
            commit = f.read(256).strip()
    except OSError:
        return None
    if not COMMIT_RE.fullmatch(commit):
        raise HubError(f"{repo}: {ref} holds '{shown(commit)}', not a commit id (40 hex digits): delete it "
                       "and run again with the Hub reachable")
    snap = d / "snapshots" / commit
    if not snap.is_dir():
        return None
    files = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    check_names(repo, files, f"the cache's snapshot {snap}")
    return Listing(repo, commit, files, cached=True, snapshot=snap)


def _remember_main(lst: Listing) -> None:
    """Record the commit the files came from as the cache's ``refs/main`` (as snapshot_download does
    after downloading by commit), so that an offline run finds them. Best effort: written only when
    it changes, and a cache that cannot be written (a read-only shared one) costs a warning only,
    since the files were found there all the same."""
    ref = _cache_dir(lst.repo) / "refs" / "main"
    try:
        if ref.read_text().strip() == lst.commit:
            return
    except OSError:
        pass
    tmp = ref.with_name(f".main.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(lst.commit)
        tmp.replace(ref)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.warning("cannot record %s's commit %s as %s (%s): the files are used all the same; an offline run "
                    "finds them once it is recorded", lst.repo, lst.commit[:12], ref, e.strerror or e)


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _failure(e: Exception, repo: str, token: str | None, local: str | None = None) -> HubError | None:
    """The one-line error for a Hub client failure; None for one that is not the Hub's (a network error).
    ``local``: the value as given, when it could also have been a local file (a repo not found says
    there is neither)."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    endpoint = _hub().shown
    login = "log in with 'hf auth login' or set HF_TOKEN"
    if isinstance(e, GatedRepoError):
        if token:
            return HubAccessError(f"{repo} is gated and the token in use has no access to it: "
                                  f"ask for access at {endpoint}/{repo}")
        return HubAccessError(f"{repo} is gated: {login} (with an account that has access: {endpoint}/{repo})")
    if isinstance(e, RepositoryNotFoundError):
        private = "" if token else f"; if it is private, {login}"
        neither = f", and no local file {local}" if local else ""
        return HubNotFoundError(f"{repo}: no such model repo on {endpoint}{neither}{private}")
    if isinstance(e, HfHubHTTPError):
        return HubError(f"{repo}: the Hub at {endpoint} refused: {say_error(e, token)}")
    return None


def _listing(ref: HubRef, token: str | None) -> Listing:
    """``ref``'s repo at the head of main: from the Hub, else (offline, or the Hub unreachable) from
    the cache. Whatever the Hub says is checked before a path is built from it (module docstring)."""
    hub = _hub()
    if hub.offline:
        cached = _cached_listing(ref.repo)
        if cached is None:
            raise HubNotFoundError(f"{ref.repo}: not in the Hugging Face cache ({hub.cache}) and "
                                   "HF_HUB_OFFLINE is set: run once without it to download")
        return cached
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=hub.endpoint, token=token)
    try:
        sha = api.model_info(ref.repo).sha
        if not COMMIT_RE.fullmatch(str(sha)):  # before it goes into a URL, let alone a path
            raise HubError(f"{ref.repo}: the Hub at {hub.shown} gave '{shown(sha)}' as the commit of main, "
                           "not a commit id (40 hex digits): refusing it")
        entries = [e for e in api.list_repo_tree(ref.repo, recursive=True, revision=sha)
                   if isinstance(e, RepoFile)]
    except HubError:
        raise
    except Exception as e:  # the Hub client's errors, and what the network does
        err = _failure(e, ref.repo, token, local=str(ref))
        if err is not None:
            raise err from None
        cached = _cached_listing(ref.repo)
        reason = say_error(e, token)
        if cached is None:
            raise HubConnectionError(f"{ref.repo}: cannot download: the Hub at {hub.shown} cannot be reached "
                                     f"({reason}) and the repo is not in the Hugging Face cache ({hub.cache})"
                                     ) from None
        log.warning("cannot reach the Hub at %s (%s): using %s as cached (commit %s)", hub.shown, reason,
                    ref.repo, cached.commit[:12])
        return cached
    files = [e.path for e in entries]
    check_names(ref.repo, files, f"the Hub at {hub.shown}")
    return Listing(ref.repo, sha, files, sizes={e.path: e.size for e in entries})


def _no_match(ref: HubRef, lst: Listing, what: str, keyword: str | None) -> HubNotFoundError:
    ggufs = [f for f in lst.files if f.endswith(".gguf")]
    where = " (the cached files only)" if lst.cached else ""
    if not ggufs:
        return HubNotFoundError(f"{ref.repo}{where}: no GGUF files")
    quants = hubpick.quants_present(lst.files, keyword)
    have = f"quants there: {listed(quants)}" if quants else f"GGUF files there: {listed(ggufs, 8)}"
    tag = f" tagged {ref.tag}" if ref.tag else ""
    return HubNotFoundError(f"{ref}: no {what}{tag} in {ref.repo}{where}; {have}")


def _pick(ref: HubRef, lst: Listing, role: str) -> str:
    """The repo path ``role`` takes from the listing, as llama-server would."""
    primary = hubpick.pick_model(lst.files, ref.tag)
    if role == "mmproj":
        chosen = hubpick.pick_sibling(lst.files, primary or "", hubpick.MMPROJ, ref.tag)
        if chosen is None:
            raise _no_match(ref, lst, "mmproj file", hubpick.MMPROJ)
        return chosen
    if role in ("draft", "any") and (role == "draft" or primary is None):
        sidecar = hubpick.pick_sibling(lst.files, primary or "", hubpick.DSPARK, ref.tag)
        if sidecar is not None:
            if ref.tag and f"-{ref.tag.upper()}." not in sidecar.upper():
                log.warning("%s: no dspark- draft tagged %s: taking %s, the closest quant (as llama-server -hfd "
                            "does)", ref, ref.tag, shown(sidecar))
            return sidecar
    if primary is None:
        raise _no_match(ref, lst, "DSpark draft (dspark-*.gguf) or model file" if role == "draft"
                        else "model file", hubpick.DSPARK if role == "draft" else None)
    if not ref.tag:
        log.info("%s: no quant given: taking %s (llama-server's default: Q4_K_M, Q8_0, else the first)", ref,
                 shown(primary))
    return primary


def _fetch(lst: Listing, path: str, token: str | None) -> Path:
    """The local file of ``path`` (a name of ``lst``): the snapshot's when there, else downloaded.
    ``lst``'s commit and names were checked when it was made (``_listing``, ``_cached_listing``), so
    the shortcut below only ever looks inside the repo's own snapshot folder."""
    if lst.cached:
        return lst.snapshot / path
    from huggingface_hub import hf_hub_download

    hub = _hub()
    done = _cache_dir(lst.repo) / "snapshots" / lst.commit / path
    if done.is_file():  # complete: huggingface_hub links a file into its snapshot only then
        return done
    size = lst.sizes.get(path)
    log.info("downloading %s from %s%s", path, lst.repo, f" ({size / 1e6:.1f} MB)" if size else "")
    try:
        return Path(hf_hub_download(lst.repo, path, revision=lst.commit, token=token, endpoint=hub.endpoint,
                                    cache_dir=hub.cache))
    except Exception as e:
        err = _failure(e, lst.repo, token)
        if isinstance(err, (HubAccessError, HubNotFoundError)):
            raise err from None
        kind = HubError if err is not None else HubConnectionError  # the Hub refused / the network failed
        raise kind(f"{lst.repo}: downloading {path} failed ({say_error(e, token)}); nothing of it was kept: "
                   "run again to download it") from None


def resolve(ref: str | HubRef, role: str = "target", *, find_mmproj: bool = False,
            find_draft: bool = False) -> Resolved:
    """Resolve one reference for ``role`` and download what it names (nothing when it is cached).

    ``target``: the model file (every part of a split one), plus the ``mmproj`` sidecar
    (``find_mmproj``) and the ``dspark-`` sidecar of a one-repo pair (``find_draft``) when the repo
    has them. ``draft``: the ``dspark-`` sidecar, else a model file. ``mmproj``: the mmproj sidecar.
    ``any``: a model file, else a ``dspark-`` sidecar (``inspect``, ``quantize``).

    Raises:
        HubNotFoundError: no such repo, no file for the quant (the message lists those present),
            offline and not cached.
        HubAccessError: a gated repo without a token that has access (the message says how to log in).
        HubConnectionError: the Hub cannot be reached and the repo is not cached, or a download broke off.
        HubError: any other refusal of the Hub.
    """
    if role not in ROLES:
        raise InvalidArgumentError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    ref = ref if isinstance(ref, HubRef) else parse_ref(ref)
    token = _token()
    from ggufdspark.publish.masking import masked_in_logs

    with masked_in_logs(token) if token else contextlib.nullcontext():
        lst = _listing(ref, token)
        chosen = _pick(ref, lst, role)
        parts = hubpick.model_parts(lst.files, chosen) if hubpick.is_model_file(chosen) else [chosen]
        local = [_fetch(lst, p, token) for p in parts]
        out = Resolved(ref, role, lst.commit, chosen, local[parts.index(chosen)], local, from_cache=lst.cached)
        if role == "target" and find_mmproj:
            mm = hubpick.pick_sibling(lst.files, chosen, hubpick.MMPROJ)
            out.mmproj = _fetch(lst, mm, token) if mm else None
        if role == "target" and find_draft:
            ds = hubpick.pick_sibling(lst.files, chosen, hubpick.DSPARK, ref.tag)
            out.dspark = _fetch(lst, ds, token) if ds else None
        if not lst.cached:
            _remember_main(lst)
    log.info("%s -> %s%s", ref, out.path, " (cache)" if lst.cached else "")
    return out


def resolve_pair(target: str | Path | None, draft: str | Path | None = None, mmproj: str | Path | None = None, *,
                 find_mmproj: bool = False, find_draft: bool = False) -> LocalPair:
    """Local paths for a pair whose members may be Hub references; files are returned as given.

    A target reference also brings its repo's mmproj (``find_mmproj``, when ``mmproj`` is None) and
    its repo's ``dspark-`` draft (``find_draft``, when ``draft`` is None), as llama-server's ``-hf``
    does with ``--spec-type draft-dspark``.

    Raises:
        InputNotFoundError: a value that is a local path naming nothing (``refuse_missing_paths``).
        HubError (and subclasses): see ``resolve``.
    """
    refuse_missing_paths(target, draft, mmproj)
    out = LocalPair(target, draft, mmproj)
    if is_ref(target):
        r = resolve(target, "target", find_mmproj=find_mmproj and mmproj is None,
                    find_draft=find_draft and draft is None)
        out.target, out.resolved["target"] = r.path, r
        if r.mmproj is not None:
            out.mmproj = r.mmproj
        if r.dspark is not None:
            out.draft = r.dspark
    if is_ref(draft):
        r = resolve(draft, "draft")
        out.draft, out.resolved["draft"] = r.path, r
    if is_ref(mmproj):
        r = resolve(mmproj, "mmproj")
        out.mmproj, out.resolved["mmproj"] = r.path, r
    return out
