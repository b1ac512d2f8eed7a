"""Bindings to an engine's own shared libraries, and what they tell about the machine.

Layers, bottom up (the shape of llama-cpp-python's ``llama_cpp`` package):

- ``_loader``: find and load ``libggml-base`` / ``libggml`` / ``libllama`` from an engine's
  ``build/bin`` (or ``$LLAMA_CPP_LIB_PATH``), dependencies first, globally.
- ``ggml_backend``: typed ctypes declarations of ggml's device registry.
- ``llama``: llama-cpp-python's ``llama_cpp`` module bound to the same ``libllama``.
- this module: the typed API, ``probe_devices``; the device model it fills and the
  ``--list-devices`` parser are ``ggufdspark.devices`` (re-exported here).

``probe_devices`` asks the libraries first. When they cannot be loaded (a static build, another
platform's files) it runs ``llama-server --list-devices`` instead, which prints only non-CPU
devices, without their type, and memory in MiB; what that leaves unknown goes to ``errors``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from ggufdspark.bindings._loader import ENV_LIB_PATH, BindingsLoadError, resolve_lib_dir
from ggufdspark.bindings.ggml_backend import DevType, GgmlBackend
from ggufdspark.devices import (MIB, NAME_PREFIXES, Device, DeviceReport, DeviceType, classify_name,
                                devices_from_list, infer_backend, parse_list_devices, run_list_devices)
from ggufdspark.errors import GgufdsparkError

log = logging.getLogger(__name__)

# the device model and the --list-devices parser live in ggufdspark.devices; re-exported here
__all__ = ["Device", "DeviceReport", "probe_devices", "infer_backend", "parse_list_devices",
           "BindingsLoadError", "MIB", "NAME_PREFIXES", "classify_name", "devices_from_list", "run_list_devices"]

DEV_TYPE_NAMES: dict[int, DeviceType] = {
    DevType.CPU: "cpu", DevType.GPU: "gpu", DevType.IGPU: "igpu",
    DevType.ACCEL: "accel", DevType.META: "meta",
}


# --------------------------------------------------------------------------- bindings


def devices_from_bindings(lib_dir: str | os.PathLike | None = None) -> list[Device]:
    """Every registered device, read through the ctypes bindings of ``lib_dir``.

    Raises:
        BindingsLoadError: the libraries cannot be loaded or lack the registry.
    """
    d = resolve_lib_dir(lib_dir)
    ggml = GgmlBackend.load(d)
    ggml.route_logs()  # before the registry starts: backends log as they initialise
    ggml.load_all(d)
    devices = []
    for i in range(ggml.dev_count()):
        dev = ggml.dev_get(i)
        free, total = ggml.dev_memory(dev)
        devices.append(Device(name=ggml.dev_name(dev), description=ggml.dev_description(dev),
                              type=DEV_TYPE_NAMES.get(ggml.dev_type(dev), "unknown"),
                              memory_free=free, memory_total=total))
    log.debug("bindings: %d devices in %s", len(devices), d)
    return devices


# --------------------------------------------------------------------------- API


def probe_devices(lib_dir: str | os.PathLike | None = None, *,
                  server: str | os.PathLike | None = None) -> DeviceReport:
    """The devices and backend of an engine build; never raises.

    Args:
        lib_dir: the build's library directory (``build/bin``); default ``$LLAMA_CPP_LIB_PATH``.
        server: the ``llama-server`` for the fallback; default ``<lib_dir>/llama-server``.

    Returns:
        A ``DeviceReport``; ``source`` says which way worked (``none``: neither), ``errors``
        what failed or stayed unknown.
    """
    report = DeviceReport(lib_dir=str(lib_dir) if lib_dir else os.environ.get(ENV_LIB_PATH))
    try:
        report.devices = devices_from_bindings(lib_dir)
        report.source = "bindings"
    except (GgufdsparkError, OSError) as e:
        report.errors.append(f"ctypes bindings: {e}")
        _fallback(report, server)
    if report.source != "none":
        report.backend = infer_backend(report.devices)
    else:
        report.errors.append("devices and backend unknown: neither the libraries nor "
                             "llama-server --list-devices answered")
    return report


def _fallback(report: DeviceReport, server: str | os.PathLike | None) -> None:
    """Fill ``report`` from ``llama-server --list-devices`` (the server given, or the lib dir's)."""
    if server:
        exe = Path(server)
    elif report.lib_dir:
        exe = Path(report.lib_dir) / "llama-server"
    else:
        report.errors.append("llama-server --list-devices: no llama-server given")
        return
    try:
        report.devices, notes = devices_from_list(exe)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        report.errors.append(f"{exe} --list-devices: {e}")
        return
    report.source = "list-devices"
    report.errors.extend(notes)
