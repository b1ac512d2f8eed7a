"""The Hub side of ``publish``: read what the repos hold, create them, upload every new object of
every repo, then one commit per repo, and read the result back. Every call goes through
``huggingface_hub`` (endpoint from ``HF_ENDPOINT``, token from its usual sources: ``HF_TOKEN``, the
saved login)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

from ggufdspark.errors import GgufdsparkError, InvalidArgumentError, PublishError
from ggufdspark.hubtext import strip_userinfo
from ggufdspark.publish.masking import masked_in_logs
from ggufdspark.publish.plan import Paths, add_earlier_files, plan_publish, resolution_warnings
from ggufdspark.publish.records import PublishPlan, PublishResult, RepoPlan

log = logging.getLogger(__name__)

# huggingface_hub's shared HTTP client has no timeout, and its API calls pass timeout=None: a Hub
# that accepts the connection and never answers hangs publish for ever. Every request publish makes
# gets at most this many seconds to connect and between two reads or writes (not for a whole
# upload: a large file streams as long as it keeps moving); huggingface_hub still retries where it
# retries (uploads: http_backoff on timeouts). $GGUFDSPARK_HUB_TIMEOUT sets another value.
HUB_TIMEOUT_S = 60.0
ENV_HUB_TIMEOUT = "GGUFDSPARK_HUB_TIMEOUT"


def hub_timeout() -> float:
    """``$GGUFDSPARK_HUB_TIMEOUT`` (seconds, > 0) or ``HUB_TIMEOUT_S``.

    Raises:
        InvalidArgumentError: the variable is set to something else than a positive number.
    """
    text = os.environ.get(ENV_HUB_TIMEOUT, "").strip()
    if not text:
        return HUB_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise InvalidArgumentError(f"${ENV_HUB_TIMEOUT} {text!r}: expected a number of seconds > 0")
    return value


@contextlib.contextmanager
def bounded_timeouts(seconds: float):
    """Within the block, every request of huggingface_hub's shared client has ``seconds`` to connect
    and per read or write, whatever timeout (None) the call passed; huggingface_hub's own default
    client comes back afterwards."""
    import httpx2
    from huggingface_hub import set_client_factory
    from huggingface_hub.utils._http import default_client_factory

    class Bounded(httpx2.HTTPTransport):
        def handle_request(self, request):
            given = request.extensions.get("timeout") or {}
            request.extensions = {**request.extensions, "timeout": {
                k: seconds if given.get(k) is None else min(given[k], seconds)
                for k in ("connect", "read", "write", "pool")}}
            return super().handle_request(request)

    def factory():
        base = default_client_factory()  # its event hooks (headers, offline mode) are kept
        hooks = base.event_hooks
        base.close()
        return httpx2.Client(event_hooks=hooks, follow_redirects=True, timeout=seconds, transport=Bounded())

    set_client_factory(factory)
    try:
        yield
    finally:
        set_client_factory(default_client_factory)


def publish(target: Paths, draft: Paths, *, repo: str,
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
        resolution_warnings(plan, local)
        if on_plan:
            on_plan(plan)
        return result

    from huggingface_hub import HfApi, get_token

    plan.dry_run = False
    token = token or get_token()
    if not token:
        raise PublishError("no Hugging Face token: run 'hf auth login' or set HF_TOKEN")
    # the token masked: a misbehaving endpoint may reflect it into a URL or header
    with masked_in_logs(token), bounded_timeouts(hub_timeout()):
        # the endpoint as given (plan.endpoint is the one shown, its credentials stripped)
        _publish(HfApi(endpoint=endpoint, token=token), plan, result, local, message, token, on_plan)
    return result


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
    # what llama.cpp will list after the upload: the repo's files and ours, in path order as the Hub lists them
    resolution_warnings(plan, {r: sorted(set(remote[r]) | set(local[r])) for r in local})
    for w in (w for rp in plan.repos for w in rp.warnings):
        log.warning("%s", w)
    if on_plan:
        on_plan(plan)
    _upload(api, plan, result, message, token)
    for rp in plan.repos:
        result.commits.setdefault(rp.repo_id, None)


def _describe_error(e: BaseException, token: str | None) -> str:
    """One line from a Hub client exception and its causes (at most two), the token masked."""
    seen, parts = set(), []
    if (slow := _timed_out(e)) is not None:
        text = strip_userinfo(slow)
        return (text.replace(token, "***") if token else text)[:400]
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
    text = strip_userinfo(": ".join(parts))  # the client's messages quote the URL, credentials and all
    if token:
        text = text.replace(token, "***")
    return text[:400]


def _timed_out(e: BaseException | None) -> str | None:
    """``no answer from URL within Ns (read timeout)`` when ``e`` or one of its causes is a timeout."""
    import httpx2

    while e is not None:
        if isinstance(e, (httpx2.TimeoutException, TimeoutError)):
            try:
                url = str(e.request.url) if isinstance(e, httpx2.TimeoutException) else None
            except RuntimeError:  # no request attached
                url = None
            kind = type(e).__name__
            return (f"no answer from {url or 'the Hub endpoint'} within {hub_timeout():g}s ({kind}; "
                    f"${ENV_HUB_TIMEOUT} sets the limit)")
        e = e.__cause__ or e.__context__
    return None


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
    add_earlier_files(rp, {p: (e.size, e.lfs.sha256 if e.lfs else None) for p, e in remote.items()})
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


def _commit_order(work: list) -> list:
    """The repos to commit, those holding a target last: a target repo's card names the draft repo in
    its serve line (``-hfd``), so it is committed only once the draft is there; an interrupt (Ctrl-C)
    or a failure between the commits then leaves a draft nobody points at yet, never a card
    pointing at a repo without its draft."""
    return sorted(work, key=lambda w: any(f.role == "target" for f in w[0].files))


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
        for rp, ops in _commit_order(work):
            current = rp.repo_id
            summary = message or f"Upload {', '.join(f.path_in_repo for f in rp.to_upload)} (ggufdspark publish)"
            info = api.create_commit(rp.repo_id, ops, commit_message=summary, parent_commit=rp.head)
            result.commits[rp.repo_id] = strip_userinfo(info.commit_url)
            log.info("committed %s", result.commits[rp.repo_id])
            _verify(api, rp, info.oid)
    except GgufdsparkError:
        raise
    except KeyboardInterrupt:
        if stage == "commit":
            done = list(result.commits)
            log.warning("interrupted while committing to %s: %s; re-run to finish (files already there are "
                        "skipped)", current, f"{', '.join(done)} was committed" if done else "nothing was committed")
        raise
    except Exception as e:  # the Hub client's errors (HTTP, connection, validation), as one line
        done = list(result.commits)
        also = (f"; {', '.join(done)} was committed, re-run to finish (files already there are skipped)"
                if done else "; nothing was committed")
        raise PublishError(f"{current}: {stage} failed: {_describe_error(e, token)}{also}") from None
