"""The seam: ``serve``, ``bench`` and ``tune`` run the engine ``launch`` decides, nothing else.

A tune profile's every setting (its ``p_min`` included) goes into ``launch.decide``, so the
drafted arm ``bench`` measures is, flag for flag, the server ``serve`` starts for the same pair,
machine and profile. The bench run is real (the built engine, three servers); only its recorded
command line is compared.
"""

from __future__ import annotations

import json

from ggufdspark import hardware, launch
from ggufdspark.engine import find_engine
from ggufdspark.measuring import measure, profiles
from ggufdspark.serve_checks import ServingOptions


def _save_profile(pair, **rec) -> str:
    """A tune profile for ``pair`` on this machine, written where ``serve`` and ``bench`` look."""
    devices = hardware.detect(find_engine())
    rec = {"draft_enabled": True, "max_concurrency_for_draft": 1, "why": "test", **rec}
    return str(profiles.save_profile(devices, pair.target, pair.draft, {"recommendation": rec}))


def _any_port(argv: list[str]) -> list[str]:
    """``argv`` with the port's value left out: bench records the free port its server got, serve
    ``--port 0`` asks for one."""
    i = argv.index("--port")
    return argv[:i + 1] + argv[i + 2:]


def test_bench_drafted_arm_runs_the_engine_serve_runs_with_a_p_min_profile(small_pair, ggufdspark_cli, isolated):
    path = _save_profile(small_pair, draft_n_max=2, p_min=0.5)
    pair = ["-m", str(small_pair.target), "-md", str(small_pair.draft)]
    s = ggufdspark_cli("serve", *pair, "--port", "0", "-np", "1", "--no-ui", "--dry-run", "--json", env=isolated)
    assert s.returncode == 0, s.stderr
    plan = json.loads(s.stdout)
    assert plan["argv"][plan["argv"].index("--spec-draft-p-min") + 1] == "0.5", plan["argv"]
    assert any("p_min 0.5" in r and path in r for r in plan["decision"]["reasons"]), plan["decision"]["reasons"]

    b = ggufdspark_cli("bench", *pair, "--limit", "1", "--categories", "general_vqa", "-n", "8", "--concurrency", "1",
                       "--max-plain-drift", "inf", "--json", env=isolated)
    assert b.returncode == 0, b.stderr
    rep = json.loads(b.stdout)
    assert _any_port(rep["settings"]["spec_command"]) == _any_port(plan["argv"])
    assert rep["settings"]["p_min"] == 0.5
    assert rep["gate"]["status"] == "pass", rep["gate"]  # p_min shortens drafts, never changes the output


def test_the_decision_carries_the_profiles_p_min_or_says_why_not(small_pair, isolated):
    """``launch.decide`` alone: the profile's p_min with its length, dropped (a warning) with
    another ``--draft-n-max``, absent without the draft; bench's and tune's bases carry it."""
    path = _save_profile(small_pair, draft_n_max=2, p_min=0.25)
    info, devices, decision, _ = measure.prepare(ServingOptions(model=small_pair.target, draft=small_pair.draft),
                                                 concurrency=[1])
    assert decision.draft_p_min == 0.25 and any(path in r and "p_min 0.25" in r for r in decision.reasons)
    base = measure.base_settings(info, ServingOptions(model=small_pair.target, draft=small_pair.draft),
                                 decision=decision)
    assert base.draft_p_min == 0.25 and measure.arm_settings(base, small_pair.draft).draft_p_min == 0.25
    assert measure.arm_settings(base, small_pair.draft, p_min=0.0).draft_p_min == 0.0  # bench --p-min 0
    assert measure.arm_settings(base, None).draft_p_min is None
    prof = profiles.load_profile(devices, small_pair.target, small_pair.draft)
    other = launch.decide(devices, info, profile=prof, draft_n_max=3)
    assert other.draft_p_min is None
    assert any("p_min 0.25" in w and "--draft-n-max 3" in w for w in other.warnings), other.warnings
    assert launch.decide(devices, info, profile=prof, no_draft=True).draft_p_min is None


def test_a_profile_with_a_p_min_outside_0_to_1_is_ignored_naming_it(small_pair, isolated, caplog):
    path = _save_profile(small_pair, draft_n_max=2, p_min=2)
    devices = hardware.detect(find_engine())
    assert profiles.load_profile(devices, small_pair.target, small_pair.draft) is None
    assert any(path in r.getMessage() and "recommendation.p_min is 2, expected a number 0..1" in r.getMessage()
               for r in caplog.records), caplog.text
