"""``ggufdspark doctor`` against the real engine, and against engines it must refuse."""

from __future__ import annotations

import json
from pathlib import Path

from ggufdspark.doctor import doctor
from ggufdspark.engine import PIN_COMMIT, cache_dir


def _one_error_line(proc) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ggufdspark: error: ")
    return lines[0]


def test_doctor_json_reports_dspark_and_a_cpu_device(dspark_engine, ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--json", "--server", dspark_engine.path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["problems"] == []
    eng = report["engine"]
    assert eng["path"] == dspark_engine.path and eng["source"] == "explicit"
    assert eng["dspark"] is True and "draft-dspark" in eng["spec_types"]
    assert eng["commit"] and eng["commit"].startswith(PIN_COMMIT)
    dev = report["devices"]
    assert dev["source"] == "bindings" and dev["errors"] == []
    assert any(d["type"] == "cpu" and d["memory_total"] > 0 for d in dev["devices"])
    assert report["backend"] == dev["backend"]
    b = report["bindings"]
    assert b["importable"] and b["loaded"], b["error"]
    assert Path(b["lib_path"]).resolve().parent == Path(dspark_engine.lib_dir).resolve()
    assert report["cache_dir"] == str(cache_dir())


def test_doctor_default_lookup_finds_the_same_engine(dspark_engine, ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"]["path"] == dspark_engine.path


def test_doctor_names_the_patch_series_of_the_engine(dspark_engine, ggufdspark_cli):
    """The engine built here carries the package's patch series, and doctor says so (from build.json)."""
    from ggufdspark.engine import patch_files

    series = [p.name for p in patch_files()]
    assert series, "the package ships no engine patches"
    proc = ggufdspark_cli("doctor", "--json", "--server", dspark_engine.path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"]["patches"] == series
    text = ggufdspark_cli("doctor", "--server", dspark_engine.path).stdout
    assert f"patches:      {len(series)} (" in text


def test_doctor_text(dspark_engine, ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--server", dspark_engine.path)
    assert proc.returncode == 0, proc.stderr
    assert "draft-dspark: yes" in proc.stdout
    assert "(from bindings)" in proc.stdout
    assert proc.stdout.rstrip().endswith("status:       ok")


def test_engine_without_dspark_is_refused(non_dspark_server, ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--server", str(non_dspark_server))
    line = _one_error_line(proc)
    assert str(non_dspark_server) in line and "draft-dspark" in line
    assert "draft-dspark: NO" in proc.stdout

    proc = ggufdspark_cli("doctor", "--json", "--server", str(non_dspark_server))
    _one_error_line(proc)
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["engine"]["dspark"] is False
    assert report["engine"]["version"] == "4242" and report["engine"]["commit"] == "deadbee"
    assert "draft-dspark" in report["problems"][0]


def test_engine_from_environment_is_refused_too(non_dspark_server, ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--json", env={"GGUFDSPARK_SERVER": str(non_dspark_server)})
    _one_error_line(proc)
    assert json.loads(proc.stdout)["engine"]["source"] == "env"


def test_nonexistent_server_is_one_line(ggufdspark_cli):
    proc = ggufdspark_cli("doctor", "--server", "/nonexistent")
    line = _one_error_line(proc)
    assert "/nonexistent" in line and "not found" in line
    assert proc.stdout == ""


def test_doctor_never_raises_for_a_broken_engine(non_dspark_server):
    report = doctor(non_dspark_server)
    assert report.ok is False
    assert report.devices is not None and report.devices.source == "none"
    assert any("could not list devices" in w for w in report.warnings)
    assert report.bindings is not None and not report.bindings.loaded
    assert any("python bindings unavailable" in w for w in report.warnings)


def test_doctor_text_marks_warnings_as_the_rest_of_the_cli_does(non_dspark_server, ggufdspark_cli):
    """Each warning is a 'WARNING: ' line (issue 14), as logged warnings and serve's are."""
    proc = ggufdspark_cli("doctor", "--server", str(non_dspark_server))
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("WARNING: could not list devices") for ln in lines), proc.stdout
    assert any(ln.startswith("WARNING: python bindings unavailable") for ln in lines), proc.stdout
    assert not any(ln.lower().startswith("warning:") and not ln.startswith("WARNING: ") for ln in lines), proc.stdout
