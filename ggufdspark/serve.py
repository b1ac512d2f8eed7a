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
from ggufdspark import hardware, hubref, launch, profiles, warmup, webui
from ggufdspark.check import check_pair
from ggufdspark.devices import DeviceReport
from ggufdspark.errors import EngineError, InputNotFoundError, InvalidArgumentError, PortInUseError, ServerStartError
from ggufdspark.runners.client import Client
from ggufdspark.runners.deaths import engine_error_line, exit_cause
from ggufdspark.runners.engine_env import dropped_warnings
from ggufdspark.runners.server import LOOPBACK, ServerProcess, ServerSettings
from ggufdspark.runners.watchdog import HealthWatch, note_in_log
from ggufdspark.serve_checks import OWNED_ENGINE_FLAGS, check_draft_cut, check_extra_args  # noqa: F401
from ggufdspark.timings.live import IntervalStats, LogWindow, stats_line

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


def plan(model: str | Path | None = None, draft: str | Path | None = None, *, mmproj: str | Path | None = None,
         hf: str | None = None, hfd: str | None = None, host: str = "127.0.0.1", port: int = 8080,
         api_key: str | None = None, draft_n_max: int | None = None, no_draft: bool = False,
         force: bool = False, server: str | Path | None = None, ctx_size: int | None = None,
         ctx_per_slot: int | None = None, parallel: int | None = 1, extra_args: list[str] | None = None,
         use_profile: bool = True, ui: bool = True, draft_n_max_by_slots: str | None = None,
         devices: DeviceReport | None = None, warm: bool | None = None,
         warmup_tokens: int | None = None) -> ServePlan:
    """Check the pair and decide the llama-server command line (nothing is started).

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
    if not (model or hf):
        raise InputNotFoundError("no target: give -m TARGET.gguf or -hf ORG/NAME[:QUANT]")
    check_host(host)
    check_extra_args(list(extra_args or []))
    _check_range("port", port, *PORT_RANGE)
    _check_range("draft_n_max", draft_n_max, *DRAFT_N_MAX_RANGE)
    _check_range("ctx_size", ctx_size, 0, None)
    _check_range("ctx_per_slot", ctx_per_slot, 1, None)
    _check_range("parallel", parallel, 1, None)
    _check_range("warmup_tokens", warmup_tokens, 0, None)
    if ctx_size is not None and ctx_per_slot is not None:
        raise InvalidArgumentError(f"ctx_size {ctx_size} and ctx_per_slot {ctx_per_slot}: give one of them")
    if draft_n_max_by_slots and draft_n_max_by_slots.strip().lower() != "off":
        parse_draft_cut(draft_n_max_by_slots)  # refused before any file is read
    # Hub references become local files first (downloaded now, so the start timeout never includes it)
    model, draft, mmproj, no_draft_why, no_draft_warning = _local_files(model, draft, mmproj, hf, hfd, no_draft,
                                                                        extra_args)
    hf = hfd = None  # the engine gets local paths (-m/-md/--mmproj), never -hf: its build has no TLS
    for label, p in (("target", model), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    info = eng.find_engine(server)
    warnings: list[str] = [no_draft_warning] if no_draft_warning else []
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
    devices = devices or hardware.detect(info)
    prof = profiles.load_profile(devices, model, draft) if (use_profile and model and draft) else None
    decision = launch.decide(devices, info, profile=prof, draft_n_max=draft_n_max,
                             no_draft=no_draft or not use_draft, no_draft_why=no_draft_why, parallel=parallel,
                             draft_cut=draft_n_max_by_slots, precision_note=precision_note,
                             draft_max=launch.longest_draft(draft if use_draft else None))
    warnings += decision.warnings
    if decision.draft_enabled and draft_n_max_by_slots and draft_n_max_by_slots.strip().lower() != "off":
        check_draft_cut(parse_draft_cut(draft_n_max_by_slots), decision.draft_n_max, draft_n_max_by_slots)
    ctx = launch.context(parallel, model=model, ctx_size=ctx_size, ctx_per_slot=ctx_per_slot, extra_args=extra_args)
    warnings += ctx.warnings
    settings = launch.server_settings(decision, info, model=model, draft=draft, mmproj=mmproj, hf=hf, hfd=hfd,
                                      host=host, port=port, api_key=api_key, ctx=ctx, parallel=parallel,
                                      extra_args=extra_args)
    ui_dir, ui_note = _chat_ui(info, ui, list(extra_args or []))
    settings.public_path = ui_dir
    if host not in LOOPBACK and not settings.api_keys():
        warnings.append(f"binding {host} without --api-key: anyone who can reach this machine can use the server")
    warnings += dropped_warnings(settings.engine_env()[1], again=True)
    warm_up = warmup.decide(decision.backend, settings, warm, warmup_tokens)
    return ServePlan(settings, decision, info, ctx, warnings, report, ui_dir, ui_note, warm_up)


# llama-server flags that turn off its own search for the mmproj beside a -hf model (given after --)
_NO_MMPROJ_FLAGS = ("--no-mmproj", "--no-mmproj-auto")


def _local_files(model, draft, mmproj, hf, hfd, no_draft: bool, extra_args: list[str] | None):
    """(target, draft, mmproj) as local paths: Hub references (``-hf``/``-hfd``, or ``-m``/``-md``
    given as ``ORG/NAME[:QUANT]``) resolved and downloaded through ``hubref``, before anything else,
    so that ``check`` reads the files and the engine's start timeout never includes a download."""
    for label, a, b in (("target", model, hf), ("draft", draft, hfd)):
        if a and b:
            raise InvalidArgumentError(f"the {label} given twice: {a} and {b} (give one of the two)")
    model, draft = model or hf, draft or hfd
    no_mm = any(a.split("=", 1)[0] in _NO_MMPROJ_FLAGS for a in (extra_args or []))
    pair = hubref.resolve_pair(model, draft, mmproj, find_mmproj=not no_mm, find_draft=not no_draft)
    return (pair.target, pair.draft, pair.mmproj, *_why_no_draft(pair, no_draft))


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
# (tools/server/server-context.cpp get_health), but every connection holds one of those threads
# while its request runs, and the pool is n_parallel + 4 threads (or --threads-http) plus at most
# 1024 more (server-http.cpp): with more connections waiting than that, /health queues behind them.
# So silence alone is no hang: an engine whose /health answered nothing for this long while its log
# did not grow either (no request started or finished) is hung and is restarted (``HealthWatch``).
HEALTH_TIMEOUT_S = 60.0
# A crash counts toward ``max_restarts`` until the engine has then served this long without one;
# after that the count starts again: a crash loop ends serve, a crash a week does not (systemd
# counts starts within StartLimitIntervalSec; Kubernetes resets its crash-loop back-off after ten
# minutes of running). A restart that never becomes ready never resets it, however long it takes.
RESTART_WINDOW_S = 600.0
# serve's throughput and acceptance line (``supervise``'s ``stats_every``): vLLM's servers log theirs
# every 5-10 s by default
STATS_EVERY_S = 10.0


def supervise(p: ServePlan, *, log_path: str | Path, start_timeout: float = 300.0, max_restarts: int = 5,
              backoff: tuple[float, ...] = (1, 2, 4, 8, 16), health_timeout: float | None = HEALTH_TIMEOUT_S,
              restart_window: float | None = RESTART_WINDOW_S,
              on_event: Callable[[str], None] = lambda msg: None,
              on_ready: Callable[[str], None] = lambda url: None,
              on_record: Callable[[dict], None] = lambda rec: None, stats_every: float | None = None) -> int:
    """Run the server until SIGINT, SIGTERM or SIGHUP; restart it (bounded backoff) when it crashes
    or hangs.

    A hang: ``/health`` answered nothing for ``health_timeout`` seconds (None or 0: never checked)
    and the engine's log did not grow meanwhile (``HealthWatch``: a busy engine's HTTP pool may
    queue ``/health`` behind its requests, but its log moves as they start and finish). An answer of
    any status counts (503 while a model loads is an answer). The cause of every restart (the exit
    code or signal, or the hang) goes to ``on_event`` and into the engine's log.

    A restart that fails (the port taken meanwhile, the engine dying while it loads or on its
    warm-up) counts as one more crash and is retried after the next pause. More than
    ``max_restarts`` crashes end it; the count starts again once an engine has served
    ``restart_window`` seconds after its last crash (None or 0: never; ``RESTART_WINDOW_S``).

    ``on_event`` gets each supervision event as a line; ``on_record`` the same event as a dict
    (``event``: ``ready`` / ``restart`` / ``restarts_reset`` / ``stats`` / ``stopping`` /
    ``gave_up`` / ``failed``, ``restarts`` so far, ``url``, ``pid`` (the engine's, in ``ready``),
    ``cause`` and ``engine_error``: the engine's own last error line, such as a CUDA error or a
    failed GGML_ASSERT, where its log has one). The last record is always ``stopping`` (a clean
    stop), ``gave_up`` (too many crashes) or ``failed`` (the first start failed, or anything else
    ended it; ``cause`` says what). ``on_ready`` gets the server's base URL once, when the first
    start is healthy (not again after a restart).

    A second such signal while stopping kills the engine at once instead of waiting for it.

    Where ``p.warmup`` is on, before each ready event the server is warmed up (``warmup.warm_up``):
    one greedy request through the drafted path, with a prompt of ``p.warmup.prompt_tokens`` tokens
    (0: a short one), so the first user's request does not pay the drafted path's one-time work. Its
    seconds and prompt size are the ready record's ``warmup_s`` and ``warmup_prompt_tokens`` (None:
    not warmed); it is not traffic for the stats; a failed one is
    said and served through; an engine that dies on it was never ready: on the first start that is a
    failed start (``ServerStartError``), after a restart one more crash.

    Every ``stats_every`` seconds (None or 0: never) in which a request finished or ran, what
    finished goes to ``on_event`` as a line (``timings.live.stats_line``: requests, tokens, the
    requests' decode speed, drafted and accepted tokens, accept length) and to ``on_record`` as
    ``event`` ``stats``, read from the engine's log (``timings.live.LogWindow``), as vLLM and
    SGLang servers log their throughput and acceptance.

    Returns:
        0 after a clean stop.

    Raises:
        ServerStartError / PortInUseError: the first start failed.
        EngineError: it crashed, hung or failed to restart more than ``max_restarts`` times in a row.
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
    crashes = 0  # counted toward max_restarts: since an engine last served restart_window seconds
    ended = False  # the final record was sent
    window = LogWindow(log_path) if stats_every else None
    next_stats = time.monotonic() + (stats_every or 0)
    try:
        srv.start()
        try:
            took = warmup.warmed(srv, p.warmup, window, on_event)
        except warmup.WarmUpDeath as e:  # never ready: a failed start, as a death while loading is
            note_in_log(log_path, f"llama-server {e}")
            raise ServerStartError(f"llama-server {e}; log: {log_path}") from None
        on_event(f"ready: {srv.url} (log: {log_path}), llama-server pid {srv.proc.pid}{warmup.note(took)}")
        on_record({"event": "ready", "url": srv.url, "pid": srv.proc.pid, "log": str(log_path), "restarts": 0,
                   **warmup.record(took)})
        on_ready(srv.url)
        watch = HealthWatch(srv, health_timeout)
        up_since = time.monotonic()
        while True:
            time.sleep(0.5)
            cause = watch.hung() if srv.alive() else exit_cause(srv.proc.returncode)
            if cause is None:
                if crashes and restart_window and time.monotonic() - up_since >= restart_window:
                    crashes = 0
                    on_event(f"llama-server served {restart_window:g}s since its last crash: the restart count "
                             "starts again")
                    on_record({"event": "restarts_reset", "restarts": 0, "after_s": restart_window})
                if window and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + stats_every
                    _say_stats(window.take(), on_event, on_record)
                continue
            srv.stop(timeout=5)  # a hung engine may ignore SIGTERM: killed after 5 s
            said = engine_error_line(srv.run_log_text())  # the CUDA error, the failed assert
            while True:  # restart until one is ready, within the budget
                crashes += 1
                why = f"{cause}: {said}" if said else cause
                note_in_log(log_path, f"llama-server {why}")
                rec = {"restarts": crashes - 1, "cause": f"llama-server {cause}", "engine_error": said,
                       "log": str(log_path)}
                if crashes > max_restarts:
                    ended = True
                    on_record({"event": "gave_up", **rec})
                    raise EngineError(f"llama-server failed {crashes} time(s) (last: it {why}); giving up; "
                                      f"log: {log_path}")
                wait = backoff[min(crashes - 1, len(backoff) - 1)]
                on_event(f"llama-server {why}; restart {crashes}/{max_restarts} in {wait:g}s")
                on_record({"event": "restart", **rec, "restarts": crashes, "in_s": wait})
                time.sleep(wait)
                if window:  # what the dead engine finished, then none of its requests runs
                    _say_stats(window.restart(), on_event, on_record)
                try:
                    took = _start_again(srv, p, window, on_event)
                    break
                except _StartFailed as e:
                    cause, said = e.cause, e.said
            watch = HealthWatch(srv, health_timeout)
            up_since = time.monotonic()
            on_event(f"ready again: {srv.url} (restart {crashes} of at most {max_restarts}), llama-server pid "
                     f"{srv.proc.pid}{warmup.note(took)}")
            on_record({"event": "ready", "url": srv.url, "pid": srv.proc.pid, "log": str(log_path),
                       "restarts": crashes, **warmup.record(took)})
    except _Stop:
        if window:
            _say_stats(window.take(), on_event, on_record)  # what finished since the last line
        on_event("stopping")
        on_record({"event": "stopping", "restarts": crashes})
        return 0
    except Exception as e:
        if not ended:  # the first start failed, or something unforeseen: the stream still ends with why
            on_record({"event": "failed", "cause": next(iter(str(e).splitlines()), type(e).__name__),
                       "engine_error": engine_error_line(srv.run_log_text()), "restarts": crashes,
                       "log": str(log_path)})
        raise
    finally:
        stopping = True
        try:
            srv.stop()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        if killed:
            on_event(f"{signal.Signals(killed[0]).name} while stopping: llama-server killed")


class _StartFailed(Exception):
    """A restart that did not become ready: ``cause`` as a restart's (after ``llama-server``), and
    the engine's own error line where its log has one."""

    def __init__(self, cause: str, said: str | None):
        super().__init__(cause)
        self.cause, self.said = cause, said


def _start_again(srv: ServerProcess, p: ServePlan, window: LogWindow | None,
                 on_event: Callable[[str], None]) -> tuple[float, int] | None:
    """Start the engine again and warm it up as the first start was; the warm-up's seconds and
    prompt tokens (None: not warmed).

    Raises:
        _StartFailed: the port was taken meanwhile, the engine could not be run, died while loading,
            was not healthy within the start timeout, or died on its warm-up.
    """
    try:
        srv.start()
        return warmup.warmed(srv, p.warmup, window, on_event)
    except PortInUseError as e:
        cause, said = f"could not start again: {e}", None
    except ServerStartError as e:
        first = next(iter(str(e).splitlines()), "")
        cause, said = first.removeprefix("llama-server "), engine_error_line(srv.run_log_text())
    except EngineError as e:  # the executable gone or not runnable
        cause, said = f"could not start again: {e}", None
    except warmup.WarmUpDeath:
        cause = f"{exit_cause(srv.proc.returncode)} on the warm-up request"
        said = engine_error_line(srv.run_log_text())
    srv.stop(timeout=5)
    raise _StartFailed(cause, said)


def _say_stats(st: IntervalStats, on_event: Callable[[str], None], on_record: Callable[[dict], None]) -> None:
    if st.active:
        on_event(stats_line(st))
        on_record({"event": "stats", **st.to_dict()})
