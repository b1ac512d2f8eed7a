"""tune's inputs fail in one clear error and leave nothing behind (issue 17, classes 11 and 12)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from ggufdspark.errors import BenchError
from ggufdspark.measuring import tune
from ggufdspark.serve_checks import ServingOptions


def _tune_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("ggufdspark-tune-*"))


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\xff\xfe not utf-8", b"[]",
                                     b'{"acceptance": []}', b'{"acceptance": {"rates": ["x"]}}',
                                     b'{"acceptance": {"rates": [1.5]}}', b'{"acceptance": {"rates": [NaN]}}'])
def test_from_bench_rejects_what_is_not_a_bench_report(tmp_path, content):
    f = tmp_path / "report.json"
    f.write_bytes(content)
    with pytest.raises(BenchError, match=str(f)):
        tune.profile_from_bench(f)


def test_from_bench_binary_is_one_cli_line(ggufdspark_cli, small_pair, isolated, tmp_path):
    f = tmp_path / "report.bin"
    f.write_bytes(bytes(range(256)) * 16)
    p = ggufdspark_cli("tune", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--from-bench", str(f),
                       env=isolated)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(f) in lines[0] and "not a 'ggufdspark bench --json' report" in lines[0], p.stderr


def test_range_message_names_the_limit_that_applies(small_pair, isolated, tmp_path):
    # the draft can draft 6; a bench report with 4 measured positions limits the sweep to 4
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"acceptance": {"rates": [0.8, 0.6, 0.4, 0.2], "passes": 10}}))
    with pytest.raises(BenchError, match=r"draft length 5 is outside 1\.\.4 \(the acceptance profile "
                                         r"'bench:bench\.json' has rates for 4 positions\)"):
        tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), from_bench=f, draft_lengths=[5],
                      save=False)
    with pytest.raises(BenchError, match=r"draft length 7 is outside 1\.\.6 \(what this draft can draft\)"):
        tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), acceptance="published",
                      draft_lengths=[7], save=False)


def test_a_run_refused_before_measuring_leaves_no_temporary_directory(small_pair, isolated):
    before = _tune_dirs()
    for kw in ({"acceptance": "published", "draft_lengths": [7]}, {"acceptance": "fast"}):
        with pytest.raises(BenchError):
            tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), save=False, **kw)
    assert _tune_dirs() == before


def test_a_run_that_fails_in_the_engine_drops_its_empty_log_directory(small_pair, isolated):
    # an engine argument llama-server refuses: the first server start fails; the log directory the
    # run made holds that engine's log, so it stays (and the error names it); none is left empty
    before = _tune_dirs()
    with pytest.raises(Exception):
        tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft, extra_args=["--no-such-flag"]),
                      acceptance="published", draft_lengths=[1], concurrency=[1], save=False)
    for d in _tune_dirs() - before:
        assert any(d.iterdir()), f"{d}: an empty log directory was left behind"
