"""bench checks every option before the first arm, refuses a speedup its plain brackets do not
support, and leaves no empty temporary directory (issue 17, classes 9 and 12)."""

from __future__ import annotations

import dataclasses
import os
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ggufdspark.errors import BenchOptionError, PlainDriftError
from ggufdspark.measuring import bench as bn
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring import report as rp
from ggufdspark.measuring.measure import log_directory
from ggufdspark.serve_checks import ServingOptions

REPO = Path(__file__).resolve().parent.parent


def _refused_early(p: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """One error line naming the option and the value, the exit code, no traceback."""
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr  # nothing else: no progress line, no arm started
    for n in needles:
        assert n in lines[0], p.stderr
    assert p.stdout == ""
    return lines[0]


@pytest.fixture
def bench_cli(small_pair, ggufdspark_cli, isolated, tmp_path):
    """``ggufdspark bench`` on the small pair with a private TMPDIR and a --log-dir not yet made;
    after a refusal, both must still be empty / absent (no server ever wrote a log)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    logs = tmp_path / "logs"

    def run(*args: str) -> subprocess.CompletedProcess:
        return ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
                              "-n", "8", "--concurrency", "1", *args, env={**isolated, "TMPDIR": str(tmp)})

    def nothing_left() -> None:
        assert list(tmp.iterdir()) == [], "a temporary directory was left behind"
        assert not logs.exists(), "the log directory was made: the run went past its checks"

    run.nothing_left = nothing_left
    run.logs = logs
    return run


# ----------------------------------------------------------------------------- --plot


def test_plot_in_a_missing_directory_is_refused_before_any_arm(bench_cli, tmp_path):
    png = tmp_path / "missing" / "bench.png"
    _refused_early(bench_cli("--plot", str(png), "--log-dir", str(bench_cli.logs)), 2, "--plot", str(png),
                   "does not exist")
    bench_cli.nothing_left()


def test_plot_under_a_file_is_refused_before_any_arm(bench_cli, tmp_path):
    # "not writable" as root: the directory cannot exist because its parent is a file
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    _refused_early(bench_cli("--plot", str(a_file / "bench.png")), 2, "--plot", str(a_file / "bench.png"),
                   "is not a directory")
    bench_cli.nothing_left()


@pytest.mark.parametrize("name,why", [("bench.bmp", "matplotlib cannot write .bmp files"),
                                      ("bench", "no file extension")])
def test_plot_format_matplotlib_cannot_write_is_refused_before_any_arm(bench_cli, tmp_path, name, why):
    line = _refused_early(bench_cli("--plot", str(tmp_path / name), "--log-dir", str(bench_cli.logs)), 2,
                          "--plot", str(tmp_path / name), why)
    assert ".png" in line and ".svg" in line and ".pdf" in line  # what would work
    bench_cli.nothing_left()


def test_plot_formats_are_what_matplotlib_writes():
    kinds = rp.plot_formats()
    assert {"png", "svg", "pdf"} <= set(kinds)
    assert "pgf" not in kinds  # needs LaTeX: it would fail after the run


# ----------------------------------------------------------------------------- --reference-hf


def test_reference_hf_missing_directory_is_refused_before_any_arm(bench_cli, tmp_path):
    d = tmp_path / "no-such-checkpoint"
    _refused_early(bench_cli("--reference-hf", str(d), "--log-dir", str(bench_cli.logs)), 4, "--reference-hf",
                   str(d), "no such directory")
    bench_cli.nothing_left()


def test_reference_hf_without_config_is_refused_before_any_arm(bench_cli, tmp_path):
    d = tmp_path / "not-a-checkpoint"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    _refused_early(bench_cli("--reference-hf", str(d)), 4, "--reference-hf", str(d), "no config.json")
    bench_cli.nothing_left()


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_reference_hf_without_torch_stack_is_refused_before_any_arm(small_pair, isolated, tmp_path, module):
    # an interpreter in which the module cannot be imported (sys.modules[name] = None makes every
    # import of it fail, as it does when the package is absent)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1", "-n", "8",
            "--reference-hf", str(small_pair.target_dir), "--log-dir", str(tmp_path / "logs")]
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['ggufdspark'] + {args!r}; "
            "from ggufdspark.cli import main; main()")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, **isolated, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)})
    _refused_early(p, 1, "--reference-hf", str(small_pair.target_dir), module, "cannot be imported")
    assert list(tmp.iterdir()) == [] and not (tmp_path / "logs").exists()


# ----------------------------------------------------------------------------- --max-plain-drift


def test_negative_drift_limit_is_refused_before_any_arm(bench_cli):
    _refused_early(bench_cli("--max-plain-drift", "-0.5"), 2, "--max-plain-drift", "-0.5")
    bench_cli.nothing_left()


# ----------------------------------------------------------------------------- temporary directory


def test_a_run_refused_after_its_directory_was_made_leaves_none(bench_cli, tmp_path):
    # the prompt file is read once the log directory exists (drawn images go there): refused, the
    # empty temporary directory goes again
    f = tmp_path / "bad.jsonl"
    f.write_text('{"messages": "hello"}\n')
    _refused_early(bench_cli("--prompts", str(f)), 1, str(f))
    bench_cli.nothing_left()


def test_log_directory_removes_only_an_empty_directory_it_made(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError):
        with log_directory(None, "ggufdspark-x-") as d:
            assert d.parent == tmp_path and d.name.startswith("ggufdspark-x-")
            raise RuntimeError("refused")
    assert not d.exists()
    with pytest.raises(RuntimeError):  # holding a log: kept, the error names it
        with log_directory(None, "ggufdspark-x-") as d:
            (d / "plain-1.log").write_text("engine output")
            raise RuntimeError("the engine died")
    assert (d / "plain-1.log").is_file()
    mine = tmp_path / "mine"
    with pytest.raises(RuntimeError):  # the user's own directory is never removed
        with log_directory(mine, "ggufdspark-x-") as d:
            raise RuntimeError("refused")
    assert mine.is_dir()
    with log_directory(None, "ggufdspark-y-") as d:  # a run that succeeds removes its temporary directory
        (d / "plain-1.log").write_text("engine output")
    assert not d.exists()
    with log_directory(mine, "ggufdspark-y-") as d:  # and keeps the user's (issue 64)
        (d / "plain-1.log").write_text("engine output")
    assert (mine / "plain-1.log").is_file()


# ----------------------------------------------------------------------------- plain drift


def test_bracket_drift_is_symmetric_and_the_limit_inclusive():
    assert rp.bracket_drift(100.0, 125.0) == pytest.approx(0.25)
    assert rp.bracket_drift(125.0, 100.0) == pytest.approx(0.25)  # a slower second run counts the same
    assert not rp.plain_drift(100.0, 125.0)["headline_refused"]
    assert rp.plain_drift(100.0, 125.5)["headline_refused"]
    assert rp.plain_drift(125.5, 100.0)["headline_refused"]
    assert rp.bracket_drift(None, 100.0) is None and not rp.plain_drift(None, 100.0)["headline_refused"]
    assert rp.bracket_drift(0.0, 100.0) == float("inf") and rp.plain_drift(0.0, 100.0)["headline_refused"]


@pytest.fixture(scope="module")
def measured_arms(small_pair, dspark_engine, tmp_path_factory):
    """One real plain / speculative / plain run of the small pair (one item, one request at a time)."""
    from ggufdspark.measuring.measure import arm_settings, base_settings, prepare

    opts = ServingOptions(model=small_pair.target, draft=small_pair.draft, server=dspark_engine.path)
    info, _, decision, _ = prepare(opts)
    base = base_settings(info, ServingOptions(model=small_pair.target, ctx_per_slot=1024), decision=decision,
                         parallel=1)
    items = pr.select(pr.builtin_prompts(), categories=["general_vqa"], limit=1)
    return bn.measure_arms(arm_settings(base, None), arm_settings(base, small_pair.draft, n_max=3), items,
                           n_predict=16, levels=[1], logs=tmp_path_factory.mktemp("arms"), gate="run")


def _report(arms: bn.Arms, **kw) -> bn.BenchReport:
    groups, overall, drift, load, acceptance = bn.summarize_arms(arms, **kw)
    settings = {"target": "t.gguf", "draft": "d.gguf", "backend": "cpu", "engine": "x", "draft_n_max": 3,
                "n_predict": 16, "items": 1, "requests": len(arms.turns), "prompts": "builtin"}
    return bn.BenchReport(settings, None, groups, overall, drift, load, arms.gate, acceptance)


def _stalled(arms: bn.Arms, factor: float) -> bn.Arms:
    """The same run with the second plain arm ``factor`` times slower (a stalled machine)."""
    def slow(o: bn.Outcome) -> bn.Outcome:
        t = dataclasses.replace(o.timings, predicted_ms=o.timings.predicted_ms * factor)
        return dataclasses.replace(o, timings=t, wall_s=o.wall_s * factor)

    load = {lv: dataclasses.replace(p, wall_s=p.wall_s * factor) for lv, p in arms.load_plain_again.items()}
    return dataclasses.replace(arms, plain_again=[slow(o) for o in arms.plain_again], load_plain_again=load)


def test_a_stalled_plain_bracket_gives_no_speedup(measured_arms):
    # the run: one plain arm ~2880x slower than the other gave "707.98x"
    r = _report(_stalled(measured_arms, 2880.0))
    # exactly the drift of the real run's two plain speeds with the second 2880x slower: a fixed
    # bound on it would also depend on how far apart the real run's own two plain runs were
    real = _report(measured_arms).drift
    assert r.drift["before_tps"] == pytest.approx(real["before_tps"])
    assert r.drift["after_tps"] == pytest.approx(real["after_tps"] / 2880.0)
    assert r.drift["plain_drift"] == pytest.approx(real["before_tps"] / (real["after_tps"] / 2880.0) - 1)
    assert r.headline_refused and r.drift["plain_drift"] > r.drift["max_plain_drift"]
    text = r.text()
    assert "NO SPEEDUP" in text and "too noisy" in text
    overall = next(ln for ln in text.splitlines() if ln.startswith("overall "))
    assert "x " not in overall.split("t/s")[-1] and " - " in overall  # ratio columns withheld
    data = r.to_dict()
    json.dumps(data, allow_nan=False)  # valid JSON
    assert data["headline_refused"] is True and data["plain_drift"] == pytest.approx(r.drift["plain_drift"])
    assert data["overall"]["decode_speedup"] is None and data["overall"]["e2e_speedup"] is None
    assert all(g["decode_speedup"] is None for g in data["groups"])
    assert data["overall"]["plain_decode_tps"] > 0 and data["overall"]["spec_decode_tps"] > 0  # speeds kept
    assert all(p["ratio"] is None and p["ratio_withheld"] for p in data["load"])
    r.raise_for_gate()  # the gate itself passed: a noisy machine is not a defect
    with pytest.raises(PlainDriftError, match=r"no speedup: the runs of the target alone .* were [0-9.]+x apart "
                                              r"\(limit 25%") as e:
        r.raise_for_drift()
    assert e.value.exit_code == 5


def test_brackets_within_the_limit_keep_the_speedup(measured_arms):
    r = _report(measured_arms, max_plain_drift=1e9)
    assert not r.headline_refused
    data = r.to_dict()
    assert data["headline_refused"] is False and data["plain_drift"] is not None
    assert data["overall"]["decode_speedup"] > 0 and "NO SPEEDUP" not in r.text()
    r.raise_for_drift()
    # the same real run judged by a limit it exceeds: refused (the limit is the caller's)
    tight = _report(measured_arms, max_plain_drift=r.drift["plain_drift"] / 2)
    assert tight.headline_refused == (r.drift["plain_drift"] > 0)


def test_too_noisy_a_run_exits_5_with_the_report(bench_cli, tmp_path):
    # a limit of 0: any difference between the two real plain runs refuses the headline. Once in a
    # while (CI, 2026-12-05) the two runs' pooled engine timings came out equal and nothing was refused,
    # as the limit says: such a run must show a drift of exactly 0, and the run is made again
    for _ in range(3):
        p = bench_cli("--max-plain-drift", "0", "--json", "--plot", str(tmp_path / "bench.svg"))
        if p.returncode != 0:
            break
        tie = json.loads(p.stdout)
        assert tie["plain_drift"] == 0 and tie["headline_refused"] is False, (tie["plain_drift"], p.stderr)
        (tmp_path / "bench.svg").unlink()
    assert p.returncode == 5, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("ggufdspark: error: no speedup: the runs of the target alone")
    rep = json.loads(p.stdout)  # the report is still printed, whole
    assert rep["headline_refused"] is True and rep["plain_drift"] > 0
    assert rep["overall"]["decode_speedup"] is None and rep["gate"]["status"] == "pass"
    assert (tmp_path / "bench.svg").read_text().lstrip().startswith("<?xml")


# ----------------------------------------------------------------------------- one options record


def test_every_measuring_verb_refuses_serves_own_options_by_name_first(tmp_path):
    """bench, bench --load, bench --sampling-check, tune and tune --load take the ServingOptions that
    serve takes; what only serve does (a port, an API key, no draft, a whole -c, slots of its own, a
    Hub repo) is refused by name before anything is read (the files here do not exist), and so are
    the draft length and load cut that tune measures itself."""
    from ggufdspark.measuring import loadplan, samplingbench, tune, tuneload

    missing = ServingOptions(model=tmp_path / "no-target.gguf", draft=tmp_path / "no-draft.gguf")
    runs = {"bench": bn.run_bench, "bench --load": loadplan.plan_load,
            "bench --sampling-check": samplingbench.run_sampling_check, "tune": tune.run_tune,
            "tune --load": tuneload.run_tune_load}
    for field, value in (("port", 9000), ("api_key", "secret"), ("no_draft", True), ("ctx_size", 8192),
                         ("parallel", 4), ("hf", "org/name:Q8_0")):
        for verb, run in runs.items():
            with pytest.raises(BenchOptionError, match=rf"^{re.escape(verb)}: {field}="):
                run(dataclasses.replace(missing, **{field: value}))
    with pytest.raises(BenchOptionError) as e:
        bn.run_bench(dataclasses.replace(missing, api_key="secret"))
    assert "secret" not in str(e.value)  # a key is named, never printed
    for verb in ("tune", "tune --load"):
        for field, value in (("draft_n_max", 3), ("draft_n_max_by_slots", "2:3")):
            with pytest.raises(BenchOptionError, match=rf"^{re.escape(verb)}: {field}="):
                runs[verb](dataclasses.replace(missing, **{field: value}))
