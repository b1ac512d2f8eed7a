"""``doctor``: is this machine ready to run DSpark drafts, and with what?

Finds the engine the other verbs would use (``engine.find_engine``), checks that it has
``--spec-type draft-dspark``, lists the devices its own libraries see (``bindings.probe_devices``)
and checks that llama-cpp-python loads against the same build. Nothing here raises for a broken
setup: the report says what is wrong, and ``ok`` is False when the engine is unusable.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark import webui
from ggufdspark.bindings import DeviceReport, probe_devices
from ggufdspark.bindings.llama import LlamaCppStatus, load_llama_cpp
from ggufdspark.engine import PIN_COMMIT, EngineInfo, cache_dir, find_engine, require_dspark
from ggufdspark.errors import EngineError

log = logging.getLogger(__name__)


@dataclass
class DoctorReport:
    """Everything ``doctor`` learned.

    ``ok``: an engine was found and it runs DSpark drafts. ``problems``: why not (each one
    line). ``warnings``: things that work but deserve a look (another commit than the pin, a
    build whose backend sees no device, bindings that did not load).
    """

    ok: bool = False
    engine: EngineInfo | None = None
    backend: str | None = None
    devices: DeviceReport | None = None
    bindings: LlamaCppStatus | None = None
    cache_dir: str = ""
    pinned_commit: str = PIN_COMMIT
    ui: str | None = None  # the chat UI serve would pass as --path (None: no chat page from ggufdspark)
    ui_note: str = ""  # where the page at / comes from
    hub: str = ""  # how Hub references (-hf / ORG/NAME[:QUANT]) are downloaded, and where to
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def doctor(server: str | os.PathLike | None = None, *, cache: Path | None = None) -> DoctorReport:
    """Examine the engine ``find_engine(server)`` resolves to, its devices and bindings.

    Args:
        server: an explicit ``llama-server``; default: ``$GGUFDSPARK_SERVER``, the cached
            build, then ``PATH`` (see ``ggufdspark.engine``).
        cache: the cache root; default ``cache_dir()``.

    Returns:
        A ``DoctorReport``; ``ok`` is False when no engine was found or it lacks DSpark.
    """
    report = DoctorReport(cache_dir=str(cache or cache_dir()))
    try:
        info = find_engine(server, cache=cache)
    except EngineError as e:
        report.problems.append(str(e))
        return report
    report.engine = info
    try:
        require_dspark(info)
    except EngineError as e:
        report.problems.append(str(e))
    report.devices = probe_devices(info.lib_dir, server=info.path)
    report.bindings = load_llama_cpp(info.lib_dir)[1]
    report.backend = report.devices.backend or info.backend
    report.warnings = _warnings(report)
    try:
        ui, report.ui_note = webui.ui_for_engine(info, cache)
        report.ui = str(ui) if ui else None
    except EngineError as e:  # a $GGUFDSPARK_UI that is no UI
        report.ui_note = str(e)
        report.warnings.append(str(e))
    report.hub = hub_note()
    report.ok = not report.problems
    log.debug("doctor: ok=%s, %d problems, %d warnings", report.ok, len(report.problems),
              len(report.warnings))
    return report


def hub_note() -> str:
    """How ``-hf`` / ``ORG/NAME[:QUANT]`` references are served: downloaded by ggufdspark through
    huggingface_hub (its version, cache, endpoint, whether a token and offline mode are set; never
    the token itself), because the engine is built without TLS and never gets ``-hf`` itself."""
    try:
        import huggingface_hub
        from huggingface_hub import get_token

        from ggufdspark.hubref import HubSettings
    except ImportError as e:
        return f"huggingface_hub not importable ({e}): Hub references cannot be downloaded"
    s = HubSettings.now()
    token = "a token is set" if get_token() else "no token (gated repos: 'hf auth login' or HF_TOKEN)"
    return (f"downloaded by ggufdspark through huggingface_hub {huggingface_hub.__version__} into {s.cache} "
            f"from {s.shown}; {token}{'; HF_HUB_OFFLINE: the cache only' if s.offline else ''}. "
            "The engine gets local files, never -hf: it is built without TLS (LLAMA_OPENSSL=OFF)")


def _warnings(report: DoctorReport) -> list[str]:
    """What works but may surprise: each check reads fields already in ``report``."""
    info, devices, bindings = report.engine, report.devices, report.bindings
    assert info is not None and devices is not None and bindings is not None
    out = []
    if not info.commit or info.commit == "unknown":  # built outside git, no LLAMA_BUILD_COMMIT
        out.append(f"engine reports no commit; cannot tell whether it is the pinned {PIN_COMMIT}")
    elif not _same_commit(info.commit, PIN_COMMIT):
        out.append(f"engine commit {info.commit} is not the pinned {PIN_COMMIT}; "
                   f"results may differ from the documented ones")
    if devices.source == "none":
        out.append("could not list devices: " + "; ".join(devices.errors))
    elif info.backend and devices.backend and info.backend != devices.backend:
        out.append(f"engine built for {info.backend} but its libraries found no {info.backend} "
                   f"device (backend in use: {devices.backend})")
    if not bindings.loaded:
        out.append(f"python bindings unavailable: {bindings.error}")
    return out


def _same_commit(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a.startswith(b) or b.startswith(a)
