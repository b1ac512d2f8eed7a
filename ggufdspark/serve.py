"""``serve``: check the pair, choose settings for the hardware, run llama-server supervised.

Library API for scripts and tests::

    from ggufdspark.serve import serving
    with serving("target.gguf", "draft.gguf") as (srv, client):
        out = client.complete("Hello", n_predict=32)
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ggufdspark import engine as eng
from ggufdspark import hardware, hubref, launch, warmup, webui
from ggufdspark.check import check_pair
from ggufdspark.devices import DeviceReport
from ggufdspark.errors import InputNotFoundError, InvalidArgumentError
from ggufdspark.measuring import profiles
from ggufdspark.runners.client import Client
from ggufdspark.runners.engine_env import dropped_warnings
from ggufdspark.runners.server import LOOPBACK, ServerProcess, ServerSettings
from ggufdspark.serve_checks import (OWNED_ENGINE_FLAGS, ServingOptions, check_draft_cut,  # noqa: F401
                                     check_extra_args)

log = logging.getLogger(__name__)


@dataclass
class ServePlan:
    """Everything decided before llama-server starts."""

    settings: ServerSettings
    decision: hardware.Decision
    engine: eng.EngineInfo
    context: launch.Context
    warnings: list[str] = field(default_factory=list)
    check: dict | None = None
    ui: Path | None = None  # the chat UI directory passed as --path (None: none passed)
    ui_note: str = ""  # where the page at / comes from, for printing
    warmup: warmup.WarmUp = warmup.WarmUp(False, 0, "not decided")  # the warm-up before each ready (``supervise``)

    def to_dict(self) -> dict:
        """The plan as JSON-ready data: the command line (as a list and as one shell line), the
        settings, the decision and its reasons, the context (``-c``, and what each slot holds),
        the engine, the check report, the chat UI and the warnings. API keys are redacted exactly
        as on the printed command line (``--api-key-file <api-key-file>``; see
        ``ServerSettings.redacted_dict``)."""
        argv = self.settings.redacted()
        return {"command": shlex.join(argv), "argv": argv, "settings": self.settings.redacted_dict(),
                "decision": self.decision.to_dict(), "context": self.context.to_dict(),
                "engine": self.engine.to_dict(), "check": self.check,
                "ui": str(self.ui) if self.ui else None, "ui_note": self.ui_note, "warmup": self.warmup.to_dict(),
                "warnings": list(self.warnings)}


# Accepted ranges, shared by the CLI's option types and the Python API.
PORT_RANGE = (0, 65535)  # 0: pick a free port
DRAFT_N_MAX_RANGE = launch.DRAFT_N_MAX_RANGE
parse_draft_cut = launch.parse_draft_cut  # where callers have long found it
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, 253 characters at most
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _check_range(name: str, value: int | None, lo: int, hi: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        expected = f"{lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        raise InvalidArgumentError(f"{name} {value!r}: expected {expected}")


def check_host(host: str) -> str:
    """``host`` if it is an IP address or a host name that resolves.

    Raises:
        InvalidArgumentError: malformed or unresolvable (the value is named).
    """
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not isinstance(host, str) or not _HOST_NAME.fullmatch(host):
        raise InvalidArgumentError(f"host {host!r}: not an IP address or a host name")
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise InvalidArgumentError(f"host {host!r}: cannot resolve it ({getattr(e, 'strerror', None) or e})") from None
    return host


def plan(opts: ServingOptions, *, devices: DeviceReport | None = None) -> ServePlan:
    """Check the pair and decide the llama-server command line of ``opts`` (nothing is started).

    The decision and the settings come from ``ggufdspark.launch`` (as ``bench`` and ``tune``
    get theirs). Each of the ``parallel`` slots gets ``launch.CTX_PER_SLOT`` tokens of context
    (fewer where the model was trained for fewer) unless ``ctx_per_slot`` says otherwise;
    ``ctx_size`` is llama-server's whole ``-c``, which it divides among the slots.

    With ``ui`` (the default) the chat UI built by ``build-engine`` (``ggufdspark.webui``) is served
    at ``/`` through ``--path``, unless ``extra_args`` already say ``--path`` or ``--no-ui``.
    ``devices``: decide for these devices instead of detecting the engine's (tests, dry runs for
    another machine). ``warm`` / ``warmup_tokens``: the warm-up before each ready (``warmup.decide``:
    by default on CUDA, a 2048-token prompt).

    ``model``, ``draft`` and ``mmproj`` may be Hub references ``ORG/NAME[:QUANT]`` (so may ``hf``
    and ``hfd``, llama-server's spellings): they are resolved and downloaded first (``hubref``), a
    target's repo also giving its mmproj (unless ``mmproj`` or ``--no-mmproj`` is given) and, with no
    draft given, its ``dspark-`` draft; then everything goes on as with local files.

    Raises:
        InputNotFoundError, CorruptFileError: a file is missing or not GGUF.
        HubError: a Hub reference could not be resolved or downloaded (``hubref.resolve``).
        PairMismatchError: the pair fails ``check`` and ``force`` is false.
        EngineError: no engine, or one without draft-dspark (when a draft is used).
        InvalidArgumentError: a value out of range, or both ``ctx_size`` and ``ctx_per_slot``.
    """
    if not (opts.model or opts.hf):
        raise InputNotFoundError("no target: give -m TARGET.gguf or -hf ORG/NAME[:QUANT]")
    check_host(opts.host)
    check_extra_args(list(opts.extra_args))
    _check_range("port", opts.port, *PORT_RANGE)
    _check_range("draft_n_max", opts.draft_n_max, *DRAFT_N_MAX_RANGE)
    _check_range("ctx_size", opts.ctx_size, 0, None)
    _check_range("ctx_per_slot", opts.ctx_per_slot, 1, None)
    _check_range("parallel", opts.parallel, 1, None)
    _check_range("warmup_tokens", opts.warmup_tokens, 0, None)
    if opts.ctx_size is not None and opts.ctx_per_slot is not None:
        raise InvalidArgumentError(f"ctx_size {opts.ctx_size} and ctx_per_slot {opts.ctx_per_slot}: give one of them")
    cut_text = opts.draft_n_max_by_slots
    cut_given = bool(cut_text) and cut_text.strip().lower() != "off"
    if cut_given:
        parse_draft_cut(cut_text)  # refused before any file is read
    # Hub references become local files first (downloaded now, so the start timeout never includes it)
    model, draft, mmproj, no_draft_why, no_draft_warning = _local_files(opts)
    for label, p in (("target", model), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    info = eng.find_engine(opts.server)
    warnings: list[str] = [no_draft_warning] if no_draft_warning else []
    report = None
    precision_note = None
    checked_draft = None if opts.no_draft else draft
    if model and (checked_draft or mmproj):
        rep = check_pair(model, checked_draft, mmproj)
        report = rep.to_dict()
        precision_note = rep.draft_precision_note()
        if not rep.ok:
            if not opts.force:
                rep.raise_for_failures()
            warnings.append("--force: serving a pair that FAILED check: "
                            + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures()))
    use_draft = bool(draft) and not opts.no_draft
    if use_draft:
        eng.require_dspark(info)
    devices = devices or hardware.detect(info)
    prof = profiles.load_profile(devices, model, draft) if (opts.use_profile and model and draft) else None
    decision = launch.decide(devices, info, profile=prof, draft_n_max=opts.draft_n_max,
                             no_draft=opts.no_draft or not use_draft, no_draft_why=no_draft_why, parallel=opts.parallel,
                             draft_cut=cut_text, precision_note=precision_note,
                             draft_max=launch.longest_draft(draft if use_draft else None))
    warnings += decision.warnings
    if decision.draft_enabled and cut_given:
        check_draft_cut(parse_draft_cut(cut_text), decision.draft_n_max, cut_text)
    ctx = launch.context(opts.parallel, model=model, ctx_size=opts.ctx_size, ctx_per_slot=opts.ctx_per_slot,
                         extra_args=list(opts.extra_args))
    warnings += ctx.warnings
    # the engine gets local paths (-m/-md/--mmproj), never -hf: its build has no TLS
    settings = launch.server_settings(decision, info, model=model, draft=draft, mmproj=mmproj, host=opts.host,
                                      port=opts.port, api_key=opts.api_key, ctx=ctx, parallel=opts.parallel,
                                      threads=opts.threads, extra_args=list(opts.extra_args))
    ui_dir, ui_note = _chat_ui(info, opts.ui, list(opts.extra_args))
    settings.public_path = ui_dir
    if opts.host not in LOOPBACK and not settings.api_keys():
        warnings.append(f"binding {opts.host} without --api-key: anyone who can reach this machine can use the server")
    warnings += dropped_warnings(settings.engine_env()[1], again=True)
    warm_up = warmup.decide(decision.backend, settings, opts.warm, opts.warmup_tokens)
    return ServePlan(settings, decision, info, ctx, warnings, report, ui_dir, ui_note, warm_up)


# llama-server flags that turn off its own search for the mmproj beside a -hf model (given after --)
_NO_MMPROJ_FLAGS = ("--no-mmproj", "--no-mmproj-auto")


def _local_files(opts: ServingOptions):
    """(target, draft, mmproj) of ``opts`` as local paths: Hub references (``-hf``/``-hfd``, or
    ``-m``/``-md`` given as ``ORG/NAME[:QUANT]``) resolved and downloaded through ``hubref``, before
    anything else, so that ``check`` reads the files and the engine's start timeout never includes a
    download; then why there is no draft, and a warning where the user may have expected one."""
    for label, a, b in (("target", opts.model, opts.hf), ("draft", opts.draft, opts.hfd)):
        if a and b:
            raise InvalidArgumentError(f"the {label} given twice: {a} and {b} (give one of the two)")
    no_mm = any(a.split("=", 1)[0] in _NO_MMPROJ_FLAGS for a in opts.extra_args)
    pair = hubref.resolve_pair(opts.model or opts.hf, opts.draft or opts.hfd, opts.mmproj, find_mmproj=not no_mm,
                               find_draft=not opts.no_draft)
    return (pair.target, pair.draft, pair.mmproj, *_why_no_draft(pair, opts.no_draft))


def _why_no_draft(pair: hubref.LocalPair, no_draft: bool) -> tuple[str, str | None]:
    """Why the target is served without a draft (the decision's reason), and a warning where the
    user may well have expected one: a one-repo pair (``-hf ORG/NAME:QUANT`` alone) whose ``dspark-``
    draft is not in the Hugging Face cache while the Hub was not asked (``HF_HUB_OFFLINE``, or the Hub
    unreachable), so nothing says whether the repo has one. Served without it all the same, as
    llama-server's ``-hf`` serves a repo without a draft; ``-md`` or ``--no-draft`` say what is meant."""
    if no_draft:
        return "--no-draft given", None
    if pair.draft:
        return "", None  # there is a draft: not said
    target = pair.resolved.get("target")
    if target is None:
        return "no draft: -md not given", None
    repo = target.ref.repo
    if not target.from_cache:
        return f"no draft: -md not given and {repo} has no dspark- file", None
    why = (f"no draft: -md not given and {repo} has no dspark- file in the Hugging Face cache (offline, or the "
           "Hub unreachable: only the cached files were seen)")
    return why, (f"{target.ref}: no dspark-*.gguf draft of {repo} in the Hugging Face cache ({target.path.parent}) "
                 "and the Hub was not asked (HF_HUB_OFFLINE=1, or unreachable): serving the target WITHOUT a "
                 "draft; run once with the Hub reachable to download it, give -md DRAFT.gguf, or --no-draft")


# llama-server flags that decide the page at / themselves (given after --)
_UI_FLAGS = ("--path", "--no-ui", "--no-webui")


def _chat_ui(info: eng.EngineInfo, wanted: bool, extra_args: list[str]) -> tuple[Path | None, str]:
    """The UI directory to pass as ``--path`` (or None) and a note on where the page at / comes from."""
    given = next((a for a in extra_args if a.split("=", 1)[0] in _UI_FLAGS), None)
    if given:
        return None, f"as the engine's own '{given}' (given after --) decides"
    if not wanted:
        return None, "none (--no-ui)"
    return webui.ui_for_engine(info)


@contextlib.contextmanager
def serving(model: str | Path, draft: str | Path | None = None, **kw) -> Iterator[tuple[ServerProcess, Client]]:
    """Start a checked, hardware-tuned server on a free loopback port; stop it on exit.

    Takes the ``ServingOptions`` fields as keywords (validated as the CLI validates them; ``port``
    0 unless given), ``plan``'s ``devices``, and ``log_path`` and ``keep_log`` (see
    ``ServerProcess``). What the CLI would print as a WARNING (``force=True`` serving a pair that
    FAILED check, an open host without a key) is logged as a warning.

    Yields:
        (ServerProcess, Client); the server dies with this process however it ends.
    """
    kw.setdefault("port", 0)
    log_path = kw.pop("log_path", None)
    keep_log = kw.pop("keep_log", None)
    devices = kw.pop("devices", None)
    p = plan(ServingOptions(model=model, draft=draft, **kw), devices=devices)
    for w in p.warnings:
        log.warning("%s", w)
    srv = ServerProcess(p.settings, log_path=log_path, keep_log=keep_log)
    with srv:
        yield srv, srv.client()
