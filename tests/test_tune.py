"""tune: acceptance profiles, the recommendation, and the profile serve reads (real engine, CPU)."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ggufdspark.errors import BenchError, EngineError
from ggufdspark.measuring import bench as bn
from ggufdspark.measuring import tune
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import ServerSettings
from ggufdspark.serve_checks import ServingOptions


def test_published_profile_is_the_documented_derivation():
    prof = tune.PROFILES["published"]
    assert len(prof.rates) == 9
    assert math.isclose(prof.mean_length, 4.22, abs_tol=1e-3)
    derived = tune.geometric_rates(4.22, 9)
    assert all(math.isclose(a, b, abs_tol=6e-5) for a, b in zip(prof.rates, derived))
    assert all(a >= b for a, b in zip(prof.rates, prof.rates[1:]))
    # truncation holds the per-position rates fixed: a shorter draft loses its tail, nothing is rescaled
    assert prof.truncated(6) == list(prof.rates[:6])
    assert math.isclose(tune.expected_accept_length(prof.truncated(6)), 3.78, abs_tol=0.01)
    assert math.isclose(tune.expected_accept_length(prof.truncated(1)), 1.78, abs_tol=0.01)
    with pytest.raises(BenchError, match="outside"):
        tune.geometric_rates(11.0, 9)


def _pt(n, level, speed):
    return tune.Point(n, 0.0 if n else None, level, speed, speed if level == 1 else None, None, 4, 100)


def test_recommend_turns_drafting_off_where_it_loses():
    plain = {1: _pt(None, 1, 100.0), 8: _pt(None, 8, 500.0), 32: _pt(None, 32, 800.0)}
    points = [_pt(4, 1, 130.0), _pt(6, 1, 125.0), _pt(4, 8, 520.0), _pt(6, 8, 480.0), _pt(4, 32, 600.0),
              _pt(6, 32, 610.0)]
    rec = tune.recommend(plain, points)
    assert rec["draft_enabled"] and rec["draft_n_max"] == 4 and math.isclose(rec["speedup"], 1.3)
    assert rec["max_concurrency_for_draft"] == 8
    assert "above 8 parallel requests serve without the draft" in rec["why"]
    assert [r["draft_pays"] for r in rec["by_concurrency"]] == [True, True, False]

    slow = [_pt(4, 1, 90.0), _pt(6, 1, 95.0), _pt(4, 8, 400.0), _pt(6, 8, 420.0), _pt(4, 32, 500.0), _pt(6, 32, 510.0)]
    rec = tune.recommend(plain, slow)
    assert not rec["draft_enabled"] and rec["max_concurrency_for_draft"] == 0
    assert rec["why"].startswith("drafting measured slower than the target alone")
    assert "(6)" in rec["why"] and "0.95x" in rec["why"]


def test_tune_writes_a_profile_that_serve_uses(small_pair, ggufdspark_cli, isolated):
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    common = [*pair, "--draft-lengths", "1,3", "-n", "16", "--concurrency", "1,2", "--requests", "2"]

    # measured acceptance of this pair; --min-gain 0 makes the winner deterministic on a noisy CPU
    p = ggufdspark_cli("tune", *common, "--min-gain", "0", "--json", env=isolated)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["acceptance"]["name"] == "measured" and res["acceptance"]["rates"]
    assert {(pt["n_max"], pt["level"]) for pt in res["points"]} == {(1, 1), (1, 2), (3, 1), (3, 2)}
    assert all(pt["tokens"] > 0 and pt["speed"] > 0 for pt in res["points"])
    rec = res["recommendation"]
    assert rec["draft_enabled"] and rec["draft_n_max"] in (1, 3)
    assert [r["parallel"] for r in rec["by_concurrency"]] == [1, 2]
    n = rec["draft_n_max"]

    s = ggufdspark_cli("serve", *pair, "--dry-run", env=isolated)
    assert s.returncode == 0, s.stderr
    assert f"--spec-draft-n-max {n}" in s.stdout and " -md " in s.stdout
    assert f"draft length {n} measured fastest" in s.stderr

    # drafting was measured up to 2 parallel requests; serving more slots than that runs without it
    assert rec["max_concurrency_for_draft"] == 2
    s = ggufdspark_cli("serve", *pair, "--dry-run", "-np", "4", env=isolated)
    assert s.returncode == 0, s.stderr
    assert " -md " not in s.stdout and "stops paying above 2" in s.stderr

    show = ggufdspark_cli("tune", *pair, "--show", env=isolated)
    assert show.returncode == 0, show.stderr
    assert f"RECOMMENDATION: draft length {n}" in show.stdout and "profile: " in show.stdout
    assert "load: lock-step micro-benchmark" in show.stdout and "bench --load" in show.stdout

    # an impossible bar: the tuner turns drafting off, says so plainly, and serve follows
    p = ggufdspark_cli("tune", *common, "--rates", "0.9,0.8,0.7", "--min-gain", "1000", env=isolated)
    assert p.returncode == 0, p.stderr
    assert "DRAFTING TURNED OFF" in p.stdout and "drafting turned OFF" in p.stderr
    assert "acceptance profile: given" in p.stdout
    s = ggufdspark_cli("serve", *pair, "--dry-run", env=isolated)
    assert s.returncode == 0, s.stderr
    assert " -md " not in s.stdout and "--spec-type" not in s.stdout
    assert "drafting turned off (drafting measured slower" in s.stderr


def test_tune_refuses_bad_inputs(small_pair, isolated, tmp_path):
    with pytest.raises(BenchError, match="draft length 7 is outside 1..6"):
        tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), acceptance="published",
                      draft_lengths=[7], save=False)
    with pytest.raises(BenchError, match="unknown acceptance profile 'fast'"):
        tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), acceptance="fast", save=False)
    syn = tmp_path / "syn.json"
    syn.write_text(json.dumps({"synthetic": "synthetic acceptance, mean length 3", "acceptance": {"rates": [0.5]}}))
    with pytest.raises(BenchError, match="synthetic acceptance"):
        tune.profile_from_bench(syn)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(BenchError, match="not a 'ggufdspark bench --json' report"):
        tune.profile_from_bench(bad)
    with pytest.raises(BenchError, match="cannot increase"):
        tune.profile_from_rates([0.5, 0.6])


def _children() -> set[int]:
    """Pids of this process's children, every thread's: processes this test process started."""
    lists = list(Path("/proc/self/task").glob("*/children"))
    if not lists:
        pytest.fail("/proc/self/task/*/children is missing (a kernel without CONFIG_PROC_CHILDREN): "
                    "these tests learn the pid of the engine tune started from it")
    pids: set[int] = set()
    for f in lists:
        try:
            pids.update(int(p) for p in f.read_text().split())
        except OSError:  # a thread that ended meanwhile
            pass
    return pids


def _new_engine(before: set[int], engine: str) -> int:
    """The one llama-server child started since ``before`` (by the code under test)."""
    new = [p for p in _children() - before if os.path.realpath(f"/proc/{p}/exe") == os.path.realpath(engine)]
    assert len(new) == 1, f"expected one new llama-server child, found {new}"
    return new[0]


def test_engine_dying_under_load_counts_as_not_paying(small_pair, isolated, dspark_engine, start_server):
    """The real server is killed after its one-request measurement, during the parallel one (as the
    pinned engine does by itself under load on some machines): tune keeps the one-request point,
    records the failure, and the recommendation keeps drafting to one request at a time. Only that
    server dies: a decoy llama-server with a draft, started before, is still serving afterwards."""
    decoy = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=2, ctx_size=512)
    before = _children()
    assert decoy.proc.pid in before
    kills = []

    def progress(done, total, what):
        if what == "draft length 2, 1 parallel":
            pid = _new_engine(before, dspark_engine.path)  # the engine tune started for this arm
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)

    res = tune.run_tune(ServingOptions(model=small_pair.target, draft=small_pair.draft), acceptance="published",
                        draft_lengths=[2], concurrency=[1, 2], n_predict=16, requests=1, save=False, progress=progress,
                        min_gain=0.0)
    assert len(kills) == 1 and kills[0] != decoy.proc.pid
    failures = res.settings["engine_failures"]
    assert len(failures) == 1 and failures[0]["draft_n_max"] == 2 and failures[0]["parallel"] == 2
    assert "llama-server died during the measurement (it was killed by SIGKILL (signal 9)" in failures[0]["error"]
    assert any(p.n_max == 2 and p.level == 1 for p in res.points)
    assert not any(p.n_max == 2 and p.level == 2 for p in res.points)
    assert res.recommendation["max_concurrency_for_draft"] == 1
    assert "crashed" in res.recommendation["why"]
    # the decoy: same engine, same user, a draft loaded, never touched
    assert decoy.alive() and decoy.client().health()["status"] == "ok"
    assert decoy.client().complete("The model draft target", n_predict=4).timings.predicted_n == 4


def test_a_server_that_dies_slowly_is_seen_dead(small_pair, dspark_engine, tmp_path):
    """A request fails while the engine is still alive; it dies a second later (a crashing engine that
    holds gigabytes takes that long): bench sees a death, not a failed request of a live server."""
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, spec_type=None, ctx_size=512)
    before = _children()
    killer = None
    with pytest.raises(BenchError, match=r"llama-server died during the measurement \(it was killed by SIGKILL \(signal 9\); log: .*slow\.log\)"):
        with bn.running(settings, tmp_path / "slow.log") as c:
            pid = _new_engine(before, dspark_engine.path)
            os.kill(pid, signal.SIGSTOP)  # alive, answering nothing
            try:
                Client(c.url, timeout=0.5).complete("The model draft target", n_predict=4)
            except EngineError:  # timed out while the engine is alive: it dies 1 s from now
                killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
                killer.start()
                raise
    assert killer is not None
    killer.join()


def test_a_failed_request_of_a_live_server_is_a_bench_error(small_pair, dspark_engine, tmp_path):
    """The engine refuses a request (HTTP 400) and keeps serving: a BenchError saying so, at once,
    not a bare EngineError (tune catches BenchError and records it)."""
    settings = ServerSettings(server=dspark_engine.path, model=small_pair.target, spec_type=None, ctx_size=256)
    t0 = time.monotonic()
    with pytest.raises(BenchError, match=r"a request failed and llama-server kept running \(log: .*live\.log\): "
                                         r".*HTTP 400: .*exceeds the available context size"):
        with bn.running(settings, tmp_path / "live.log") as c:
            t0 = time.monotonic()
            c.complete(list(range(5, 600)), n_predict=4)
    assert time.monotonic() - t0 < bn.EXIT_WAIT_S / 2  # /health answered: no waiting for an exit


def test_load_recommendation_keeps_a_length_per_load():
    """tuneload.recommend_load: the best length at each client level (no draft under min_gain), the
    lowest level's as the length, shorter winners as a load cut, the last paying level as the limit."""
    from ggufdspark.measuring.tuneload import recommend_load

    ratios = {3: {1: 1.6, 4: 1.2, 8: 0.9}, 5: {1: 1.9, 4: 1.1, 8: 0.95}, 2: {1: 1.4, 4: 1.25, 8: 1.05}}
    rec = recommend_load(ratios, min_gain=1.02)
    assert rec["draft_enabled"] and rec["draft_n_max"] == 5
    assert rec["load_cut"] == [[1, 2]] and rec["max_concurrency_for_draft"] == 8
    assert [p["best_n_max"] for p in rec["per_level"]] == [5, 2, 2]
    rec = recommend_load(ratios, min_gain=1.1)  # at 8 clients nothing pays by 10%
    assert rec["draft_n_max"] == 5 and rec["load_cut"] == [[1, 2]] and rec["max_concurrency_for_draft"] == 4
    assert "no draft pays above 4 client(s)" in rec["why"]
    rec = recommend_load({3: {1: 0.8, 4: 0.7}}, min_gain=1.02)
    assert not rec["draft_enabled"] and rec["max_concurrency_for_draft"] == 0


def test_load_recommendation_pauses_where_the_paused_arm_wins():
    """With the paused arm measured (length 0: the draft loaded, no drafts), each level drafts only
    where a length beats pausing by min_gain, else pauses; pauses become cut steps with L = 0 and no
    slot limit (the pause does its job); at the quietest level drafting must still beat plain.
    The numbers are the H200 tune --load run of benchmarks/results/0c1e570-product-19/tune.json."""
    from ggufdspark.measuring.tuneload import recommend_load

    h200 = {0: {1: 0.87, 2: 0.87, 4: 0.90, 8: 0.86, 16: 0.78, 32: 0.85, 64: 0.79},
            7: {1: 1.44, 2: 1.28, 4: 1.01, 8: 1.06, 16: 0.95, 32: 0.85, 64: 0.62}}
    rec = recommend_load(h200, min_gain=1.02)
    assert rec["draft_enabled"] and rec["draft_n_max"] == 7 and rec["load_cut"] == [[16, 0]], rec
    assert rec["max_concurrency_for_draft"] is None and "paused above 16 busy slots" in rec["why"]
    assert [p["best_n_max"] for p in rec["per_level"]] == [7, 7, 7, 7, 7, 0, 0]
    rec = recommend_load({**h200, 5: {1: 1.3, 2: 1.2, 4: 1.1, 8: 1.12, 16: 1.0, 32: 0.8, 64: 0.6}}, min_gain=1.02)
    assert rec["load_cut"] == [[2, 5], [16, 0]], rec  # 5 beats 7 from 4 clients, then the pause
    rec = recommend_load({0: {1: 0.9, 8: 0.8}, 7: {1: 0.95, 8: 0.7}}, min_gain=1.02)
    assert not rec["draft_enabled"] and rec["load_cut"] is None, rec  # beats pausing, not plain, when quiet


def test_tune_load_writes_a_profile_that_serve_uses(small_pair, ggufdspark_cli, isolated):
    """tune --load on the real engine: one bench --load run per draft length (plain beside drafted),
    the ratios per client level, the recommendation saved; serve takes its length, its load cut
    where the engine can cut (patch 0021) and -np leaves room for it, and its slot limit."""
    from ggufdspark.measuring.tuneload import recommend_load

    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    p = ggufdspark_cli("tune", *pair, "--load", "--draft-lengths", "1,3", "--clients", "1,2", "--answer-tokens", "16",
                       "--requests-per-client", "2", "--min-gain", "0", "--json", env=isolated)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert set(res["ratios"]) == {"1", "3"} and all(set(r) == {"1", "2"} for r in res["ratios"].values())
    assert all(v > 0 for r in res["ratios"].values() for v in r.values())
    ratios = {int(n): {int(k): v for k, v in r.items()} for n, r in res["ratios"].items()}
    rec = res["recommendation"]
    assert rec == recommend_load(ratios, min_gain=0) and rec["draft_enabled"] and res["profile"]
    n = rec["draft_n_max"]
    s = ggufdspark_cli("serve", *pair, "--dry-run", "-np", "2", "--json", env=isolated)
    assert s.returncode == 0, s.stderr
    d = json.loads(s.stdout)["decision"]
    assert d["draft_enabled"] and d["draft_n_max"] == n, d
    assert d["draft_cut"] == ([list(x) for x in rec["load_cut"]] if rec["load_cut"] else None), (d, rec)
    s = ggufdspark_cli("serve", *pair, "--dry-run", "-np", "4", env=isolated)  # beyond what was measured
    assert s.returncode == 0 and " -md " not in s.stdout and "stops paying above 2" in s.stderr, s.stderr
    show = ggufdspark_cli("tune", *pair, "--show", env=isolated)
    assert show.returncode == 0 and f"RECOMMENDATION: draft length {n} at 1 client(s)" in show.stdout, show.stderr
    long = ggufdspark_cli("tune", *pair, "--load", "--draft-lengths", "1", "--clients", "1", "--answer-tokens", "4",
                          "--requests-per-client", "1", "--prompt-scale", "2", "--no-save", "--json", env=isolated)
    assert long.returncode == 0, long.stderr[-3000:]
    traffic = json.loads(long.stdout)["traffic"]
    assert "prompts 2 times as long" in traffic["shape"] and traffic["prompt_tokens"]["median"] > 1.7 * json.loads(
        p.stdout)["traffic"]["prompt_tokens"]["median"], traffic
    for args, said in ((["--clients", "1,2"], "tune: --clients needs --load"),
                       (["--rounds", "2"], "tune: --rounds needs --load"),
                       (["--prompt-scale", "2"], "tune: --prompt-scale needs --load"),
                       (["--load", "--prompt-scale", "0"], "--prompt-scale 0: expected 1"),
                       (["--load", "--concurrency", "1,2"], "tune --load: --concurrency belongs to the lock-step"),
                       (["--load", "--draft-lengths", "99"], "--draft-lengths: 99 is not a length"),
                       (["--load", "--draft-lengths", "0"], "give at least one length above 0")):
        p = ggufdspark_cli("tune", *pair, *args, env=isolated)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_serve_applies_a_tune_load_cut(small_pair, ggufdspark_cli, isolated, dspark_engine):
    """A tune --load profile with a load cut (written by profiles.save_profile, as tune does):
    serve passes it as --spec-draft-n-max-by-slots with its length and says where it comes from;
    --draft-n-max drops it with the profile's length; a cut that cannot engage at -np 1 is silent."""
    from ggufdspark.measuring import profiles
    from ggufdspark.bindings import probe_devices

    devices = probe_devices(dspark_engine.lib_dir, server=dspark_engine.path)
    rec = {"draft_enabled": True, "draft_n_max": 3, "load_cut": [[2, 1]], "max_concurrency_for_draft": 8,
           "why": "test", "measured_with": "tune --load (bench --load traffic)"}
    profiles.save_profile(devices, small_pair.target, small_pair.draft, {"recommendation": rec})
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run"]
    s = ggufdspark_cli("serve", *pair, "-np", "8", env=isolated)
    assert s.returncode == 0, s.stderr
    assert "--spec-draft-n-max 3" in s.stdout and "--spec-draft-n-max-by-slots 2:1" in s.stdout, s.stdout
    assert "drafts cut by load (tune --load): to 1 above 2 busy slots" in s.stderr
    s = ggufdspark_cli("serve", *pair, "-np", "8", "--draft-n-max", "2", env=isolated)
    assert "--spec-draft-n-max 2" in s.stdout and "--spec-draft-n-max-by-slots" not in s.stdout, s.stdout
    s = ggufdspark_cli("serve", *pair, "-np", "1", env=isolated)
    assert "--spec-draft-n-max-by-slots" not in s.stdout and "WARNING" not in s.stderr, s.stderr


def test_tune_load_with_image_share_measures_image_traffic(vl_pair, ggufdspark_cli, isolated):
    """tune --load --mmproj M --image-share 0.5 on the VL pair: every arm's server (plain, paused,
    drafted) gets the projector and answers the same requests, half of them with a drawn picture;
    the JSON's traffic and the stored profile (tune --show) say the lengths were measured so."""
    pair = ["-m", str(vl_pair["tower"]), "-md", str(vl_pair["draft"])]
    p = ggufdspark_cli("tune", *pair, "--load", "--mmproj", str(vl_pair["mmproj"]), "--image-share", "0.5",
                       "--draft-lengths", "0,2", "--clients", "2", "--answer-tokens", "8", "--requests-per-client", "2",
                       "--min-gain", "0", "--json", env=isolated)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    traffic = res["traffic"]
    assert traffic["image_share"] == 0.5 and "0.5 of the requests with an image" in traffic["shape"], traffic
    assert traffic["images"]["mmproj"] == str(vl_pair["mmproj"]) and len(traffic["images"]["pictures"]) == 3
    rep = res["load"]
    assert rep["settings"]["mmproj"] == str(vl_pair["mmproj"])
    assert all("--mmproj" in rep["settings"][k] for k in ("plain_command", "drafted_command"))
    assert set(rep["arms"]) == {"plain", "n2", "n0"} and set(res["ratios"]) == {"0", "2"}, rep["arms"].keys()
    key = lambda r: (r["index"], r["client"], r["prompt"], r["image"])  # noqa: E731
    for arm, levels in rep["arms"].items():
        (lv,) = levels
        assert lv["requests"] == 4 and lv["image_requests"] == 2 and lv["failed"] == 0, (arm, lv)
        assert all(r["error"] is None and r["output_tokens"] == 8 for r in lv["records"]), arm
        # the same requests, with the same pictures, on every arm
        assert [key(r) for r in lv["records"]] == [key(r) for r in rep["arms"]["plain"][0]["records"]], arm
    assert res["profile"]
    show = ggufdspark_cli("tune", *pair, "--show", "--json", env=isolated)
    assert show.returncode == 0, show.stderr
    prof = json.loads(show.stdout)
    assert prof["load"]["image_share"] == 0.5 and "0.5 of the requests with an image" in prof["load"]["traffic"]
    assert "0.5 of the requests with an image" in prof["recommendation"]["measured_with"]
    show = ggufdspark_cli("tune", *pair, "--show", env=isolated)
    assert show.returncode == 0 and "0.5 of the requests with an image" in show.stdout, show.stdout


def test_tune_image_options_need_load_and_mmproj(small_pair, mmproj, ggufdspark_cli, isolated):
    """--mmproj and --image-share belong to tune --load; --image-share there needs --mmproj: one line
    on stderr each, exit 2, nothing started."""
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    for args, said in ((["--image-share", "0.5"], "tune: --image-share needs --load"),
                       (["--mmproj", str(mmproj)], "tune: --mmproj needs --load"),
                       (["--load", "--image-share", "0.5"],
                        "--image-share 0.5: image requests need the vision projector (--mmproj FILE)"),
                       (["--load", "--mmproj", str(mmproj), "--image-share", "1.5"],
                        "--image-share 1.5: expected a fraction of the requests in [0, 1]")):
        p = ggufdspark_cli("tune", *pair, *args, env=isolated)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and said in lines[0], (args, p.stderr)
        assert "Traceback" not in p.stderr and p.stdout == "", (args, p.stdout)
