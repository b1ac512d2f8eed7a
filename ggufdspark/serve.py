"""``serve``: check the pair, choose settings for the hardware, run llama-server supervised.

Library API for scripts and tests::

    from ggufdspark.serve import serving
    with serving("target.gguf", "draft.gguf") as (srv, client):
        out = client.complete("Hello", n_predict=32)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ggufdspark import engine as eng
from ggufdspark import hardware, profiles
from ggufdspark.check import check_pair
from ggufdspark.errors import EngineError, InputNotFoundError
from ggufdspark.runners.server import LOOPBACK, Client, ServerProcess, ServerSettings

log = logging.getLogger(__name__)


@dataclass
class ServePlan:
    """Everything decided before llama-server starts."""

    settings: ServerSettings
    decision: hardware.Decision
    engine: eng.EngineInfo
    warnings: list[str] = field(default_factory=list)
    check: dict | None = None


def plan(model: str | Path | None = None, draft: str | Path | None = None, *, mmproj: str | Path | None = None,
         hf: str | None = None, hfd: str | None = None, host: str = "127.0.0.1", port: int = 8080,
         api_key: str | None = None, draft_n_max: int | None = None, no_draft: bool = False,
         force: bool = False, server: str | Path | None = None, ctx_size: int | None = 4096,
         parallel: int | None = 1, extra_args: list[str] | None = None,
         use_profile: bool = True) -> ServePlan:
    """Check the pair and decide the llama-server command line (nothing is started).

    Raises:
        InputNotFoundError, CorruptFileError: a file is missing or not GGUF.
        PairMismatchError: the pair fails ``check`` and ``force`` is false.
        EngineError: no engine, or one without draft-dspark (when a draft is used).
    """
    if not model and not hf:
        raise InputNotFoundError("no target: give -m TARGET.gguf or --hf REPO:QUANT")
    for label, p in (("target", model), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    info = eng.find_engine(server)
    warnings: list[str] = []
    report = None
    checked_draft = None if no_draft else draft
    if model and (checked_draft or mmproj):
        rep = check_pair(model, checked_draft, mmproj)
        report = rep.to_dict()
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
                               parallel=parallel)
    if (hf or hfd) and not (model and draft):
        warnings.append("Hub form: the pair is checked by llama-server at load, not by 'check' beforehand "
                        "(download it and run 'ggufdspark check' to see every reason a pair fails)")
    if host not in LOOPBACK and not api_key:
        warnings.append(f"binding {host} without --api-key: anyone who can reach this machine can use the server")
    settings = ServerSettings(
        server=info.path, model=model, draft=draft if decision.draft_enabled else None, mmproj=mmproj,
        hf_repo=hf, hf_draft=hfd if decision.draft_enabled else None, host=host, port=port, api_key=api_key,
        spec_type="draft-dspark" if decision.draft_enabled else None,
        draft_n_max=decision.draft_n_max if decision.draft_enabled else None,
        draft_n_min=0 if decision.draft_enabled else None,
        n_gpu_layers=99 if decision.offload else None,
        n_gpu_layers_draft=99 if decision.offload and decision.draft_enabled else None,
        flash_attn=decision.flash_attn, ctx_size=ctx_size, parallel=parallel,
        extra_args=hardware.engine_workarounds(decision.backend, parallel) + list(extra_args or []))
    return ServePlan(settings, decision, info, warnings, report)


@contextlib.contextmanager
def serving(model: str | Path, draft: str | Path | None = None, **kw) -> Iterator[tuple[ServerProcess, Client]]:
    """Start a checked, hardware-tuned server on a free loopback port; stop it on exit."""
    kw.setdefault("port", 0)
    log_path = kw.pop("log_path", None)
    p = plan(model, draft, **kw)
    srv = ServerProcess(p.settings, log_path=log_path)
    with srv:
        yield srv, srv.client()


class _Stop(Exception):
    pass


def supervise(p: ServePlan, *, log_path: str | Path, start_timeout: float = 300.0, max_restarts: int = 5,
              backoff: tuple[float, ...] = (1, 2, 4, 8, 16),
              on_event: Callable[[str], None] = lambda msg: None) -> int:
    """Run the server until SIGINT/SIGTERM; restart it (bounded backoff) when it crashes.

    Returns:
        0 after a clean stop.

    Raises:
        ServerStartError / PortInUseError: the first start failed.
        EngineError: it crashed more than ``max_restarts`` times.
    """
    def _raise(signum, frame):
        raise _Stop()

    old = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGINT)}
    srv = ServerProcess(p.settings, log_path=log_path, start_timeout=start_timeout)
    crashes = 0
    try:
        srv.start()
        on_event(f"ready: {srv.url} (log: {log_path})")
        while True:
            time.sleep(0.5)
            if srv.alive():
                continue
            crashes += 1
            code = srv.proc.returncode if srv.proc else None
            if crashes > max_restarts:
                raise EngineError(f"llama-server crashed {crashes} times (last exit code {code}); giving up; "
                                  f"log: {log_path}")
            wait = backoff[min(crashes - 1, len(backoff) - 1)]
            on_event(f"llama-server exited unexpectedly (code {code}); restart {crashes}/{max_restarts} in {wait:g}s")
            time.sleep(wait)
            srv.start()
            on_event(f"ready again: {srv.url}")
    except _Stop:
        on_event("stopping")
        return 0
    finally:
        srv.stop()
        for s, h in old.items():
            signal.signal(s, h)
