"""The ctypes bindings against the real engine build's shared libraries (no mocks)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ggufdspark.bindings import (
    MIB,
    BindingsLoadError,
    Device,
    infer_backend,
    parse_list_devices,
    probe_devices,
)
from ggufdspark.bindings.ggml_backend import DevType, GgmlBackend
from ggufdspark.errors import EngineError


def _list_devices(server: str) -> str:
    proc = subprocess.run([server, "--list-devices"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{server} --list-devices failed: {proc.stderr[-500:]}"
    return proc.stdout


def test_ggml_registry_through_ctypes(dspark_engine):
    ggml = GgmlBackend.load(dspark_engine.lib_dir)
    assert ggml.route_logs()
    assert ggml.load_all(dspark_engine.lib_dir)
    n = ggml.dev_count()
    assert n >= 1, f"{dspark_engine.lib_dir}: ggml registered no device"
    for i in range(n):
        dev = ggml.dev_get(i)
        assert ggml.dev_name(dev)
        assert ggml.dev_type(dev) in set(DevType)
        free, total = ggml.dev_memory(dev)
        assert 0 <= free <= total or total == 0


def test_probe_devices_finds_cpu_through_bindings(dspark_engine):
    report = probe_devices(dspark_engine.lib_dir)
    assert report.source == "bindings", report.errors
    assert report.errors == []
    cpus = [d for d in report.devices if d.type == "cpu"]
    assert cpus, f"no CPU device among {report.devices}"
    assert cpus[0].memory_total > 0
    assert report.backend == infer_backend(report.devices)
    if dspark_engine.backend:  # the build record's backend is the one its devices imply
        assert report.backend == dspark_engine.backend, (
            f"engine built for {dspark_engine.backend}, but its libraries see {report.devices}")


def test_bindings_agree_with_list_devices(dspark_engine):
    out = _list_devices(dspark_engine.path)
    listed = parse_list_devices(out)
    if not listed:
        assert "(none)" in out
    ours = [d for d in probe_devices(dspark_engine.lib_dir).devices if d.type != "cpu"]
    # --list-devices prints every non-CPU device in registry order, memory in whole MiB.
    assert [(d.name, d.description) for d in ours] == [(d.name, d.description) for d in listed]
    for mine, theirs in zip(ours, listed):
        assert mine.memory_total // MIB == theirs.memory_total // MIB
        # free memory moves between the two reads; a GPU's by little.
        assert abs(mine.memory_free - theirs.memory_free) <= max(1024 * MIB, mine.memory_total // 20)


def test_fallback_to_list_devices_when_libraries_do_not_load(dspark_engine, tmp_path):
    report = probe_devices(tmp_path, server=dspark_engine.path)
    assert report.source == "list-devices"
    assert any(e.startswith("ctypes bindings:") and "not found" in e for e in report.errors)
    assert "--list-devices does not list CPU devices" in report.errors
    expected = probe_devices(dspark_engine.lib_dir)
    assert report.backend == expected.backend
    assert [d.name for d in report.devices] == [d.name for d in expected.devices if d.type != "cpu"]


def test_nothing_loads_is_reported_not_raised(tmp_path):
    report = probe_devices(tmp_path)
    assert report.source == "none" and not report.ok
    assert report.backend is None and report.devices == []
    assert any("devices and backend unknown" in e for e in report.errors)


def test_missing_libraries_raise_a_domain_error(tmp_path):
    with pytest.raises(BindingsLoadError) as exc:
        GgmlBackend.load(tmp_path)
    assert isinstance(exc.value, EngineError) and isinstance(exc.value, OSError)
    assert str(tmp_path) in str(exc.value)


def test_parse_list_devices_format():
    # The line format of common_print_available_devices() in the pinned tree (common/arg.cpp).
    text = ("Available devices:\n"
            "  CUDA0: NVIDIA H200 (143167 MiB, 142524 MiB free)\n"
            "  RPC[10.0.0.2:50052]: RPC[10.0.0.2:50052] (24000 MiB, 23000 MiB free)\n")
    devices = parse_list_devices(text)
    assert devices == [
        Device("CUDA0", "NVIDIA H200", "gpu", 142524 * MIB, 143167 * MIB),
        Device("RPC[10.0.0.2:50052]", "RPC[10.0.0.2:50052]", "gpu", 23000 * MIB, 24000 * MIB),
    ]
    assert infer_backend(devices) == "cuda"
    assert parse_list_devices("Available devices:\n  (none)\n") == []
    with pytest.raises(ValueError):
        parse_list_devices("error: invalid argument: --list-devices\n")


def test_infer_backend_from_names():
    def dev(name, type_):
        return Device(name, "", type_, 0, 0)

    assert infer_backend([dev("CPU", "cpu")]) == "cpu"
    assert infer_backend([dev("CPU", "cpu"), dev("MTL0", "gpu")]) == "metal"
    assert infer_backend([dev("CPU", "cpu"), dev("Vulkan0", "igpu")]) == "vulkan"
    assert infer_backend([dev("BLAS", "accel"), dev("CPU", "cpu")]) == "cpu"
    assert infer_backend([dev("RPC[h:1]", "gpu"), dev("CUDA0", "gpu")]) == "cuda"


def test_llama_cpp_loads_against_the_engine_build(dspark_engine):
    from ggufdspark.bindings.llama import llama_backend_init, load_llama_cpp

    module, status = load_llama_cpp(dspark_engine.lib_dir)
    if not status.importable:
        pytest.fail("llama-cpp-python is not installed in this venv: "
                    "CMAKE_ARGS='-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF' pip install llama-cpp-python==0.3.36")
    assert status.loaded, status.error
    assert Path(status.lib_path).resolve().parent == Path(dspark_engine.lib_dir).resolve()
    assert status.version == "0.3.36"
    module = llama_backend_init(dspark_engine.lib_dir)
    assert b"CPU" in module.llama_print_system_info()
