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
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ggufdspark import engine as eng
from ggufdspark import hardware, profiles, webui
from ggufdspark.check import check_pair
from ggufdspark.errors import EngineError, InputNotFoundError, InvalidArgumentError
from ggufdspark.quants import is_quantized_file, is_quantized_tag
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import LOOPBACK, ServerProcess, ServerSettings, exit_cause
from ggufdspark.runners.watchdog import HealthWatch, note_in_log
from ggufdspark.serve_checks import OWNED_ENGINE_FLAGS, check_draft_cut, check_extra_args, profile_p_min  # noqa: F401

log = logging.getLogger(__name__)


@dataclass
class ServePlan:
    """Everything decided before llama-server starts."""

    settings: ServerSettings
    decision: hardware.Decision
    engine: eng.EngineInfo
    warnings: list[str] = field(default_factory=list)
    check: dict | None = None
    ui: Path | None = None  # the chat UI directory passed as --path (None: none passed)
    ui_note: str = ""  # where the page at / comes from, for printing

    def to_dict(self) -> dict:
        """The plan as JSON-ready data: the command line (as a list and as one shell line), the
        settings, the decision and its reasons, the engine, the check report, the chat UI and the
        warnings. API keys are redacted exactly as on the printed command line (``--api-key-file
        <api-key-file>``; see ``ServerSettings.redacted_dict``)."""
        argv = self.settings.redacted()
        return {"command": shlex.join(argv), "argv": argv, "settings": self.settings.redacted_dict(),
                "decision": self.decision.to_dict(), "engine": self.engine.to_dict(), "check": self.check,
                "ui": str(self.ui) if self.ui else None, "ui_note": self.ui_note, "warnings": list(self.warnings)}


# Accepted ranges, shared by the CLI's option types and the Python API.
PORT_RANGE = (0, 65535)  # 0: pick a free port
DRAFT_N_MAX_RANGE = (1, 64)
# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens, 253 characters at most
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _check_range(name: str, value: int | None, lo: int, hi: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        expected = f"{lo}..{hi}" if hi is not None else f"an integer >= {lo}"
        raise InvalidArgumentError(f"{name} {value!r}: expected {expected}")


def parse_draft_cut(text: str) -> list[tuple[int, int]]:
    """``"2:5,8:3"`` -> ``[(2, 5), (8, 3)]``: with more than N slots generating, drafts of at most L
    tokens (``--spec-draft-n-max-by-slots``, engine patch 0021).

    Raises:
        InvalidArgumentError: not N:L pairs of integers, N not ascending from 0, or L outside the
            draft length range.
    """
    steps: list[tuple[int, int]] = []
    for item in (x.strip() for x in text.split(",")):
        n, sep, length = item.partition(":")
        try:
            step = (int(n), int(length)) if sep else None
        except ValueError:
            step = None
        if step is None or step[0] < 0 or (steps and step[0] <= steps[-1][0]) \
                or not DRAFT_N_MAX_RANGE[0] <= step[1] <= DRAFT_N_MAX_RANGE[1]:
            raise InvalidArgumentError(f"draft_n_max_by_slots {text!r}: {item!r} is not N:L (N >= 0 ascending, "
                                       f"L {DRAFT_N_MAX_RANGE[0]}..{DRAFT_N_MAX_RANGE[1]})")
        steps.append(step)
    return steps


def _cut_text(cut: list[tuple[int, int]]) -> str:
    return ", ".join(f"to {k} above {n} generating slots" for n, k in cut)


def _applied_draft_cut(given: list[tuple[int, int]] | None, text: str | None, off: bool, decision: hardware.Decision,
                       info: eng.EngineInfo, parallel: int | None, warnings: list[str]) -> list[tuple[int, int]] | None:
    """The --spec-draft-n-max-by-slots steps serve runs with: the ones given (``text``, parsed into
    ``given``; ``off``: none), else the table's for this backend when it can engage; reasons and
    warnings go to ``decision`` and ``warnings``."""
    if off or not decision.draft_enabled:
        return None
    has_patch = hardware.has_patch(info, hardware.DRAFT_CUT_BY_LOAD)
    if not given:
        table = decision.draft_cut  # measured with the table's draft length only (hardware.decide)
        if not (table and table[0][0] < (parallel or 1) and has_patch):
            return None
        decision.reasons.append(f"default for {decision.backend}: drafts cut by load {_cut_text(table)} "
                                "(--draft-n-max-by-slots off keeps every draft at n_max)")
        return list(table)
    if not has_patch:
        warnings.append(f"--draft-n-max-by-slots {text}: {info.path} cannot cut drafts by load "
                        f"(engine patch 0021); every draft stays at n_max {decision.draft_n_max}")
        return None
    if given[0][0] >= (parallel or 1):
        warnings.append(f"--draft-n-max-by-slots {text}: never more than {parallel or 1} slots "
                        f"generate (-np), so no draft is ever cut")
        return None
    decision.reasons.append(f"drafts cut by load (--draft-n-max-by-slots): {_cut_text(given)}")
    return given


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


def plan(model: str | Path | None = None, draft: str | Path | None = None, *, mmproj: str | Path | None = None,
         hf: str | None = None, hfd: str | None = None, host: str = "127.0.0.1", port: int = 8080,
         api_key: str | None = None, draft_n_max: int | None = None, no_draft: bool = False,
         force: bool = False, server: str | Path | None = None, ctx_size: int | None = 4096,
         parallel: int | None = 1, extra_args: list[str] | None = None,
         use_profile: bool = True, draft_max_slots: int | None = None, ui: bool = True,
         draft_n_max_by_slots: str | None = None) -> ServePlan:
    """Check the pair and decide the llama-server command line (nothing is started).

    With ``ui`` (the default) the chat UI built by ``build-engine`` (``ggufdspark.webui``) is served
    at ``/`` through ``--path``, unless ``extra_args`` already say ``--path`` or ``--no-ui``.

    Raises:
        InputNotFoundError, CorruptFileError: a file is missing or not GGUF.
        PairMismatchError: the pair fails ``check`` and ``force`` is false.
        EngineError: no engine, or one without draft-dspark (when a draft is used).
    """
    if not model and not hf:
        raise InputNotFoundError("no target: give -m TARGET.gguf or --hf REPO:QUANT")
    check_host(host)
    check_extra_args(list(extra_args or []))
    _check_range("port", port, *PORT_RANGE)
    _check_range("draft_n_max", draft_n_max, *DRAFT_N_MAX_RANGE)
    _check_range("ctx_size", ctx_size, 0, None)
    _check_range("parallel", parallel, 1, None)
    _check_range("draft_max_slots", draft_max_slots, 0, None)
    cut_off = (draft_n_max_by_slots or "").strip().lower() == "off"
    draft_cut = parse_draft_cut(draft_n_max_by_slots) if draft_n_max_by_slots and not cut_off else None
    for label, p in (("target", model), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    info = eng.find_engine(server)
    warnings: list[str] = []
    report = None
    precision_note = None
    checked_draft = None if no_draft else draft
    if model and (checked_draft or mmproj):
        rep = check_pair(model, checked_draft, mmproj)
        report = rep.to_dict()
        precision_note = rep.draft_precision_note()
        if not rep.ok:
            if not force:
                rep.raise_for_failures()
            warnings.append("--force: serving a pair that FAILED check: "
                            + "; ".join(f"{c.name}: {c.detail}" for c in rep.failures()))
    use_draft = bool(draft or hfd) and not no_draft
    if use_draft:
        eng.require_dspark(info)
    devices = hardware.detect(info)
    prof = profiles.load_profile(devices, model, draft) if (use_profile and model and draft) else None
    decision = hardware.decide(devices, profile=prof, draft_n_max=draft_n_max, no_draft=no_draft or not use_draft,
                               parallel=parallel, load_aware=hardware.has_patch(info, hardware.LOAD_AWARE_DRAFTING),
                               draft_max_slots=draft_max_slots)
    if decision.backend == "cuda" and decision.draft_enabled and precision_note:
        decision.reasons.append(f"draft precision: {precision_note}")
    if draft_max_slots and not hardware.has_patch(info, hardware.LOAD_AWARE_DRAFTING):
        warnings.append(f"--draft-max-slots {draft_max_slots}: {info.path} has no load-aware drafting "
                        f"(engine patch 0011); drafting stays on at every load")
    decision.draft_cut = _applied_draft_cut(draft_cut, draft_n_max_by_slots, cut_off, decision, info, parallel,
                                            warnings)
    check_draft_cut(decision.draft_cut if draft_cut else None, decision.draft_n_max, draft_n_max_by_slots)
    if (hf or hfd) and not (model and draft):
        warnings.append("Hub form: the pair is checked by llama-server at load, not by 'check' beforehand "
                        "(download it and run 'ggufdspark check' to see every reason a pair fails)")
    settings = ServerSettings(
        server=info.path, model=model, draft=draft if decision.draft_enabled else None, mmproj=mmproj,
        hf_repo=hf, hf_draft=hfd if decision.draft_enabled else None, host=host, port=port, api_key=api_key,
        spec_type="draft-dspark" if decision.draft_enabled else None,
        draft_n_max=decision.draft_n_max if decision.draft_enabled else None,
        draft_n_min=0 if decision.draft_enabled else None,
        draft_p_min=profile_p_min(prof, decision, draft_n_max, warnings),
        draft_max_slots=decision.draft_max_slots if decision.draft_enabled else None,
        draft_n_max_by_slots=decision.draft_cut,
        n_gpu_layers=hardware.OFFLOAD_ALL_LAYERS if decision.offload else None,
        n_gpu_layers_draft=hardware.OFFLOAD_ALL_LAYERS if decision.offload and decision.draft_enabled else None,
        flash_attn=decision.flash_attn, ctx_size=ctx_size, parallel=parallel,
        extra_args=hardware.engine_workarounds(decision.backend, parallel, info, quantized=_quantized(
            model, draft if decision.draft_enabled else None, hf, hfd if decision.draft_enabled else None))
        + list(extra_args or []))
    ui_dir, ui_note = _chat_ui(info, ui, list(extra_args or []))
    settings.public_path = ui_dir
    if host not in LOOPBACK and not settings.api_keys():
        warnings.append(f"binding {host} without --api-key: anyone who can reach this machine can use the server")
    return ServePlan(settings, decision, info, warnings, report, ui_dir, ui_note)


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


def _quantized(model, draft, hf, hfd) -> bool:
    """Whether a file (or Hub tag) served is quantized (see ``hardware.engine_workarounds``)."""
    return (any(p and is_quantized_file(p) for p in (model, draft))
            or any(is_quantized_tag(r) for r in (hf, hfd) if r))


@contextlib.contextmanager
def serving(model: str | Path, draft: str | Path | None = None, **kw) -> Iterator[tuple[ServerProcess, Client]]:
    """Start a checked, hardware-tuned server on a free loopback port; stop it on exit.

    Takes ``plan``'s keywords (validated as the CLI validates them) plus ``log_path`` and
    ``keep_log`` (see ``ServerProcess``). What the CLI would print as a WARNING (``force=True``
    serving a pair that FAILED check, an open host without a key) is logged as a warning.

    Yields:
        (ServerProcess, Client); the server dies with this process however it ends.
    """
    kw.setdefault("port", 0)
    log_path = kw.pop("log_path", None)
    keep_log = kw.pop("keep_log", None)
    p = plan(model, draft, **kw)
    for w in p.warnings:
        log.warning("%s", w)
    srv = ServerProcess(p.settings, log_path=log_path, keep_log=keep_log)
    with srv:
        yield srv, srv.client()


class _Stop(Exception):
    pass


# Signals that stop ``supervise``: Ctrl-C, kill / systemd / timeout, and a closed terminal or SSH link.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# The health watchdog: /health is answered by llama-server's HTTP threads, not its decode loop
# (tools/server/server-context.cpp get_health), and the pool has n_parallel + 4 threads plus up to
# 1024 more on demand (server-http.cpp), so a busy engine still answers; one that answers nothing
# for this long is hung and is restarted.
HEALTH_TIMEOUT_S = 60.0


def supervise(p: ServePlan, *, log_path: str | Path, start_timeout: float = 300.0, max_restarts: int = 5,
              backoff: tuple[float, ...] = (1, 2, 4, 8, 16), health_timeout: float | None = HEALTH_TIMEOUT_S,
              on_event: Callable[[str], None] = lambda msg: None,
              on_ready: Callable[[str], None] = lambda url: None) -> int:
    """Run the server until SIGINT, SIGTERM or SIGHUP; restart it (bounded backoff) when it crashes
    or hangs.

    A hang: ``/health`` answered nothing for ``health_timeout`` seconds (None or 0: never checked).
    An answer of any status counts (503 while a model loads is an answer), so only an engine that
    stopped responding at all is restarted. The cause of every restart (the exit code or signal,
    or the hang) goes to ``on_event`` and into the engine's log.

    ``on_event`` gets each supervision event as a line; ``on_ready`` gets the server's base URL
    once, when the first start is healthy (not again after a restart).

    A second such signal while stopping kills the engine at once instead of waiting for it.

    Returns:
        0 after a clean stop.

    Raises:
        ServerStartError / PortInUseError: the first start failed.
        EngineError: it crashed or hung more than ``max_restarts`` times.
    """
    srv = ServerProcess(p.settings, log_path=log_path, start_timeout=start_timeout)
    stopping = False
    killed: list[int] = []

    def _on_signal(signum, frame):
        nonlocal stopping
        if not stopping:
            stopping = True
            raise _Stop()
        # already stopping: no exception (it would cut the stop short), no printing (not re-entrant)
        killed.append(signum)
        srv.kill()

    old = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS}
    crashes = 0
    try:
        srv.start()
        on_event(f"ready: {srv.url} (log: {log_path})")
        on_ready(srv.url)
        watch = HealthWatch(srv, health_timeout)
        while True:
            time.sleep(0.5)
            cause = watch.hung() if srv.alive() else exit_cause(srv.proc.returncode)
            if cause is None:
                continue
            srv.stop(timeout=5)  # a hung engine may ignore SIGTERM: killed after 5 s
            crashes += 1
            note_in_log(log_path, f"llama-server {cause}")
            if crashes > max_restarts:
                raise EngineError(f"llama-server failed {crashes} time(s) (last: it {cause}); giving up; "
                                  f"log: {log_path}")
            wait = backoff[min(crashes - 1, len(backoff) - 1)]
            on_event(f"llama-server {cause}; restart {crashes}/{max_restarts} in {wait:g}s")
            time.sleep(wait)
            srv.start()
            watch = HealthWatch(srv, health_timeout)
            on_event(f"ready again: {srv.url}")
    except _Stop:
        on_event("stopping")
        return 0
    finally:
        stopping = True
        try:
            srv.stop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        if killed:
            on_event(f"{signal.Signals(killed[0]).name} while stopping: llama-server killed")
