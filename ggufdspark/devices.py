"""The device model: what ggml backend devices an engine build sees, the backend they imply, and
the parser of ``llama-server --list-devices`` (the fallback when the engine's libraries cannot be
loaded: ``ggufdspark.bindings.probe_devices``). Plain data and text; nothing here loads a library.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Literal

from ggufdspark.runners import lifeline

DeviceType = Literal["cpu", "gpu", "igpu", "accel", "meta", "unknown"]
Source = Literal["bindings", "list-devices", "none"]

MIB = 1024 * 1024

# Device-name prefix -> (backend, device type). The names are those ggml's backends give their
# devices in the pinned tree: GGML_CUDA_NAME ("CUDA", "ROCm" for HIP, "MUSA") + index,
# GGML_METAL_NAME "MTL" + index (older trees: "Metal"), GGML_VK_NAME "Vulkan" + index,
# "SYCL" + index, "GPUOpenCL", "CANN" + index, "RPC[host:port]", "BLAS". Longest prefixes first.
NAME_PREFIXES: tuple[tuple[str, str, DeviceType], ...] = (
    ("GPUOpenCL", "opencl", "gpu"),
    ("OpenCL", "opencl", "gpu"),
    ("Vulkan", "vulkan", "gpu"),
    ("WebGPU", "webgpu", "gpu"),
    ("Metal", "metal", "gpu"),
    ("CUDA", "cuda", "gpu"),
    ("ROCm", "hip", "gpu"),
    ("MUSA", "musa", "gpu"),
    ("SYCL", "sycl", "gpu"),
    ("CANN", "cann", "gpu"),
    ("MTL", "metal", "gpu"),
    ("RPC", "rpc", "gpu"),
    ("BLAS", "blas", "accel"),
    ("AMX", "amx", "accel"),
)

# One device line of `llama-server --list-devices` (common/arg.cpp,
# common_print_available_devices): "  <name>: <description> (<total> MiB, <free> MiB free)".
# An RPC device name holds a colon ("RPC[host:port]"), hence the lazy name up to ": ".
LIST_DEVICES_LINE = re.compile(
    r"^\s+(?P<name>\S+?):\s+(?P<description>.*?)\s+\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")


@dataclass
class Device:
    """One ggml backend device.

    ``type`` is ggml's device type (``unknown`` when only ``--list-devices`` saw it);
    memory is in bytes (from ``--list-devices``: whole MiB).
    """

    name: str
    description: str
    type: DeviceType
    memory_free: int
    memory_total: int


@dataclass
class DeviceReport:
    """The devices an engine build sees on this machine and the backend they imply.

    ``backend``: ``cuda``, ``metal``, ``vulkan``, ... for the first GPU-like device, ``cpu``
    when there is none, None when nothing could be learned. ``source``: where the list came
    from. ``errors``: what could not be loaded or learned, one sentence each.
    """

    devices: list[Device] = field(default_factory=list)
    backend: str | None = None
    source: Source = "none"
    errors: list[str] = field(default_factory=list)
    lib_dir: str | None = None

    @property
    def ok(self) -> bool:
        """True when a device list was obtained at all."""
        return self.source != "none"

    def to_dict(self) -> dict:
        return asdict(self)


def classify_name(name: str) -> tuple[str, DeviceType] | None:
    """``(backend, type)`` that a device name implies, or None for an unknown prefix."""
    for prefix, backend, dev_type in NAME_PREFIXES:
        if name.startswith(prefix):
            return backend, dev_type
    return None


def infer_backend(devices: list[Device]) -> str:
    """The backend a build offloads to: the first local GPU-like device's, else ``cpu``.

    RPC devices count only when no local GPU is present.
    """
    gpus = [d for d in devices if d.type in ("gpu", "igpu", "unknown")]
    named = [(classify_name(d.name), d) for d in gpus]
    local = [c[0] for c, d in named if c and c[0] != "rpc"]
    if local:
        return local[0]
    if any(c and c[0] == "rpc" for c, _ in named):
        return "rpc"
    for d in gpus:  # a backend this table does not know: take the name's letters
        if d.type != "unknown" and (m := re.match(r"[A-Za-z]+", d.name)):
            return m.group(0).lower()
    return "cpu"


# --------------------------------------------------------------------------- --list-devices


def parse_list_devices(text: str) -> list[Device]:
    """Devices in the stdout of ``llama-server --list-devices`` (an empty list for ``(none)``).

    Types come from the name (``classify_name``), ``unknown`` when it says nothing.

    Raises:
        ValueError: the text has no ``Available devices:`` header.
    """
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Available devices:")
    except StopIteration:
        raise ValueError("no 'Available devices:' line in the output") from None
    devices = []
    for line in lines[start + 1:]:
        m = LIST_DEVICES_LINE.match(line)
        if not m:
            continue
        known = classify_name(m["name"])
        devices.append(Device(name=m["name"], description=m["description"],
                              type=known[1] if known else "unknown",
                              memory_free=int(m["free"]) * MIB, memory_total=int(m["total"]) * MIB))
    return devices


def run_list_devices(server: str | os.PathLike, timeout: float = 120) -> str:
    """stdout of ``<server> --list-devices``.

    Raises:
        OSError, subprocess.SubprocessError: it could not run, or it failed.
    """
    proc = lifeline.run([str(server), "--list-devices"], timeout=timeout)  # a hung one: killed, group and all
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise subprocess.SubprocessError(f"exit {proc.returncode}: {tail[0]}")
    return proc.stdout


def devices_from_list(server: str | os.PathLike) -> tuple[list[Device], list[str]]:
    """Devices from ``--list-devices`` and the notes on what that output cannot tell."""
    devices = parse_list_devices(run_list_devices(server))
    notes = ["--list-devices does not list CPU devices",
             "memory from --list-devices is rounded to MiB"]
    if devices:
        notes.append("device types guessed from names (--list-devices does not print them)")
    return devices, notes
