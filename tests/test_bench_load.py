"""``bench --load``: plain and drafted arms under closed-loop and Poisson traffic, against the real
engine on CPU with the small generated pair. Timings on a tiny model are noise: these tests prove
the mechanics and the result's internal consistency, not speed."""

from __future__ import annotations

import json
import re

import pytest


def _args(pair, *extra: str) -> list[str]:
    return ["bench", "--load", "-m", str(pair.target), "-md", str(pair.draft), *extra]


def _check_level(lv: dict, n_requests: int, answer: int) -> None:
    recs = lv["records"]
    assert lv["requests"] == len(recs) == n_requests
    assert sorted(r["index"] for r in recs) == list(range(n_requests))
    assert all(r["output_tokens"] == answer for r in recs)  # ignore_eos: every answer is exactly this long
    assert lv["output_tokens"] == sum(r["output_tokens"] for r in recs) == n_requests * answer
    assert lv["prompt_tokens"] == sum(r["prompt_tokens"] for r in recs)
    assert all(r["prompt_n"] == r["prompt_tokens"] for r in recs)  # the engine processed the whole prompt
    assert all(0 < r["ttft_s"] < r["latency_s"] for r in recs)
    assert all(r["start_s"] + r["latency_s"] <= lv["wall_s"] + 1e-6 for r in recs)
    assert lv["aggregate_tps"] == pytest.approx(lv["output_tokens"] / lv["wall_s"])
    assert lv["ttft_p50_s"] <= lv["ttft_p95_s"] <= max(r["ttft_s"] for r in recs)
    assert lv["latency_p50_s"] <= lv["latency_p95_s"] <= max(r["latency_s"] for r in recs)
    assert lv["ttft_p50_s"] < lv["latency_p50_s"]
    assert min(r["ttft_s"] for r in recs) <= lv["ttft_mean_s"] <= max(r["ttft_s"] for r in recs)
    dec = sorted(r["decode_tps"] for r in recs)
    assert dec[0] <= lv["decode_tps_median"] <= dec[-1]
    # a request's longest wait between two streamed tokens: within its time after the first token;
    # p50 / p95 over the requests
    gaps = sorted(r["longest_gap_s"] for r in recs)
    assert all(0 < r["longest_gap_s"] <= r["latency_s"] - r["ttft_s"] for r in recs), recs
    assert gaps[0] <= lv["longest_gap_p50_s"] <= lv["longest_gap_p95_s"] <= lv["longest_gap_p99_s"] <= gaps[-1]
    # where each fell: after the first token, within the answer; the level's shares of where they fell
    assert all(r["ttft_s"] < r["longest_gap_end_s"] <= r["latency_s"] + 1e-6 for r in recs), recs
    assert all(0 <= r["longest_gap_index"] < r["chunks"] - 1 for r in recs if r["longest_gap_s"] > 0.001), recs
    assert 0 <= lv["stall_first_share"] <= 1 and 0 <= lv["stall_join_share"] <= 1, lv
    _check_tails(lv)


def _check_tails(lv: dict) -> None:
    """The p99s, inter-token latency and time per output token of a level: present, ordered, and
    within what the requests allow."""
    recs = [r for r in lv["records"] if r["error"] is None]
    assert lv["ttft_p50_s"] <= lv["ttft_p95_s"] <= lv["ttft_p99_s"] <= max(r["ttft_s"] for r in recs)
    assert lv["latency_p50_s"] <= lv["latency_p95_s"] <= lv["latency_p99_s"] <= max(r["latency_s"] for r in recs)
    # ITL: every wait between two chunks pooled; a chunk holds >= 1 token, so at most tokens - 1 waits a request
    # (the tiny model's tokens often reach the client all in one chunk: then there is no wait to pool)
    assert lv["itl_gaps"] == sum(r["chunks"] - 1 for r in recs)
    assert all(1 <= r["chunks"] <= r["output_tokens"] for r in recs)
    if lv["itl_gaps"]:
        assert 0 < lv["itl_p50_s"] <= lv["itl_p95_s"] <= lv["itl_p99_s"] <= max(r["longest_gap_s"] for r in recs)
    else:
        assert lv["itl_p50_s"] is lv["itl_p95_s"] is lv["itl_p99_s"] is None
    tpot = [r["tpot_s"] for r in recs]
    assert all(t == pytest.approx((r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1))
               for t, r in zip(tpot, recs))
    assert min(tpot) <= lv["tpot_p50_s"] <= lv["tpot_p95_s"] <= lv["tpot_p99_s"] <= max(tpot)
    assert "gaps_s" not in recs[0]  # the raw waits stay out of the JSON
    # TTFT split: the engine's prompt processing (its prompt_ms) lies within the client's TTFT; the
    # wait before it is the rest
    assert all(0 < r["prompt_ms"] / 1000 <= r["ttft_s"] + 1e-3 for r in recs), recs
    assert all(r["ttft_wait_s"] == pytest.approx(r["ttft_s"] - r["prompt_ms"] / 1000) for r in recs)
    for key, values in (("prompt", [r["prompt_ms"] / 1000 for r in recs]), ("wait", [r["ttft_wait_s"] for r in recs])):
        assert min(values) <= lv[f"ttft_{key}_p50_s"] <= lv[f"ttft_{key}_p95_s"] <= max(values), (key, lv)


def test_load_closed_loop_plain_and_drafted(small_pair, ggufdspark_cli, isolated, tmp_path):
    out = tmp_path / "load.json"
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", "12", "--requests-per-client", "2",
                              "--draft-n-max", "3", "--json", str(out), "--log-dir", str(tmp_path / "logs")),
                       env=isolated)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert "bench --load: 100%" in p.stderr  # the progress line finished
    assert "ratio" in p.stdout and "closed loop: 1,2 clients" in p.stdout
    rep = json.loads(out.read_text())
    # where the stalls fell, one row a level with each arm's two shares as the JSON has them
    block = p.stdout.split("Where those waits fell")[1].split("\n\n")[0].splitlines()
    two_clients = [lv for lv in rep["arms"]["drafted"] if lv["level"] == 2][0]
    assert block[-1].split()[0] == "2" and block[-1].split()[-1] == f"{two_clients['stall_join_share']:.0%}", block
    assert rep["kind"] == "ggufdspark bench --load"
    assert rep["command"].startswith("ggufdspark bench --load -m ") and "--clients 1,2" in rep["command"]
    assert (rep["engine"]["commit"] or rep["engine"]["version"]) and isinstance(rep["engine"]["patches"], list) and rep["engine"]["patches"]
    assert rep["hardware"]["backend"] == "cpu" and rep["hardware"]["devices"]
    shape = rep["traffic"]["shape"]
    assert shape["mode"] == "closed" and shape["levels"] == [1, 2] and shape["answer_tokens"] == 12
    pt = rep["traffic"]["prompt_tokens"]
    assert pt["count"] == 66 and pt["min"] < pt["median"] < pt["max"]
    assert rep["settings"]["draft_n_max"] == 3 and "draft-dspark" in rep["settings"]["drafted_command"]
    assert "draft-dspark" not in rep["settings"]["plain_command"]
    assert rep["synthetic"] is None
    assert rep["traffic"]["order"].startswith("interleaved")
    plain, drafted = rep["arms"]["plain"], rep["arms"]["drafted"]
    for arm in (plain, drafted):
        assert [lv["level"] for lv in arm] == [1, 2]
        for lv in arm:
            _check_level(lv, int(lv["level"]) * 2, 12)
    # the same prompts in the same order on both arms, at every level
    for a, b in zip(plain, drafted):
        assert [(r["index"], r["client"], r["prompt"]) for r in a["records"]] == \
               [(r["index"], r["client"], r["prompt"]) for r in b["records"]]
    # the closed loop: client c's j-th request is order[j * clients + c]
    two = plain[1]["records"]
    assert [r["client"] for r in two] == [0, 1, 0, 1]
    # each client's request number; TTFT p50 of the requests after each client's first, and its ratio
    for arm in (plain, drafted):
        for lv in arm:
            recs = lv["records"]
            assert [r["turn"] for r in recs] == [j for j in range(2) for _ in range(int(lv["level"]))]
            later = sorted(r["ttft_s"] for r in recs if r["turn"] > 0)
            assert later and lv["ttft_p50_later_s"] == pytest.approx((later[0] + later[-1]) / 2 if len(later) == 2
                                                                     else later[0])
    assert all(r["ttft_p50_later_s"] == pytest.approx(b["ttft_p50_later_s"] / a["ttft_p50_later_s"])
               for r, a, b in zip(rep["ratios"], plain, drafted))
    assert "TTFT p50 of the requests after each client's first (the opening burst left out):" in p.stdout
    block = p.stdout.split("(the opening burst left out):")[1].splitlines()
    assert block[1].split() == ["clients", "plain", "drafted", "ratio"]
    assert [ln.split()[0] for ln in block[2:4]] == ["1", "2"], block[:4]
    assert all(r["longest_gap_p95_s"] == pytest.approx(b["longest_gap_p95_s"] / a["longest_gap_p95_s"])
               for r, a, b in zip(rep["ratios"], plain, drafted))
    block = p.stdout.split("p95 over the requests:")[1].splitlines()
    assert block[1].split() == ["clients", "plain", "drafted", "ratio"] and block[2].split()[0] == "1", block[:4]
    assert all(lv["drafted"] == 0 and lv["accept_length"] is None for lv in plain)
    assert all(lv["drafted"] > 0 and lv["passes"] > 0 and lv["accept_length"] >= 1.0 for lv in drafted)
    for r, a, b in zip(rep["ratios"], plain, drafted):
        assert r["level"] == a["level"]
        assert r["aggregate_tps"] == pytest.approx(b["aggregate_tps"] / a["aggregate_tps"])
        assert r["ttft_p50_s"] == pytest.approx(b["ttft_p50_s"] / a["ttft_p50_s"])
    # an existing --json file is not replaced without --force
    again = ggufdspark_cli(*_args(small_pair, "--clients", "1", "--json", str(out)), env=isolated)
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    assert json.loads(out.read_text()) == rep


def test_load_rounds_pool_every_round_and_keep_each_rounds_ratio(small_pair, ggufdspark_cli, isolated, tmp_path):
    """--rounds 3: every level run three times on both arms (round r with seed + r: another prompt
    order, the same on both arms), the level's figures over all rounds' requests (aggregate = their
    tokens / the rounds' summed wall time) and drafted / plain of each round's aggregate beside them."""
    out = tmp_path / "load.json"
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", "8", "--requests-per-client", "1",
                              "--draft-n-max", "3", "--rounds", "3", "--json", str(out), "--log-dir",
                              str(tmp_path / "logs")), env=isolated)
    assert p.returncode == 0, p.stderr
    assert "3 rounds a level (seeds 0-2)" in p.stdout and "agg by round" in p.stdout
    assert "opening burst" not in p.stdout
    assert "round 3/3" in p.stderr
    # the levels up, then down, then up: no round starts quiet right after the busiest level
    order = re.findall(r"plain, (\d+) clients, round (\d)/3", p.stderr)
    assert order == [("1", "1"), ("2", "1"), ("2", "2"), ("1", "2"), ("1", "3"), ("2", "3")], order
    rep = json.loads(out.read_text())
    assert rep["traffic"]["shape"]["rounds"] == 3 and rep["traffic"]["rounds"].startswith("3: ")
    plain, drafted = rep["arms"]["plain"], rep["arms"]["drafted"]
    for arm in (plain, drafted):
        assert [lv["level"] for lv in arm] == [1, 2]
        for lv in arm:
            _check_level(lv, int(lv["level"]) * 3, 8)  # three rounds of one request a client
            # every request was its client's first: no TTFT without the opening burst, no such table
            assert {r["turn"] for r in lv["records"]} == {0} and lv["ttft_p50_later_s"] is None
            assert len(lv["round_tps"]) == 3 and all(t > 0 for t in lv["round_tps"])
            # the pooled aggregate lies between the rounds' and is their tokens over their summed wall
            assert min(lv["round_tps"]) - 1e-9 <= lv["aggregate_tps"] <= max(lv["round_tps"]) + 1e-9
            walls = [lv["output_tokens"] / 3 / t for t in lv["round_tps"]]
            assert sum(walls) == pytest.approx(lv["wall_s"], rel=1e-6)
    # each round's prompts: its own seeded order, the same on both arms; the rounds differ
    for a, b in zip(plain, drafted):
        assert [r["prompt"] for r in a["records"]] == [r["prompt"] for r in b["records"]]
    two = [r["prompt"] for r in plain[1]["records"]]
    assert two[0:2] != two[2:4] or two[2:4] != two[4:6], two
    for r, a, b in zip(rep["ratios"], plain, drafted):
        assert r["aggregate_tps"] == pytest.approx(b["aggregate_tps"] / a["aggregate_tps"])
        assert r["aggregate_tps_rounds"] == pytest.approx([y / x for x, y in zip(a["round_tps"], b["round_tps"])])


def test_load_noise_floor_runs_a_second_plain_server_and_prints_its_band(small_pair, ggufdspark_cli, isolated, tmp_path):
    """--noise-floor: a second plain server (plain2, the same command) runs every level and round
    beside the two arms on the same prompts; its ratio to plain is kept per level and printed as the
    band inside which drafted / plain is no measured difference. The drafted arm's ratios stay the
    report's ratios."""
    out = tmp_path / "load.json"
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", "8", "--requests-per-client", "1",
                              "--draft-n-max", "3", "--rounds", "2", "--noise-floor", "--json", str(out),
                              "--log-dir", str(tmp_path / "logs")), env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    assert list(rep["arms"]) == ["plain", "drafted", "plain2"]
    assert rep["settings"]["noise_floor"].startswith("plain2: a second plain server")
    assert (tmp_path / "logs" / "plain2.log").is_file() and rep["logs"]["plain2"].endswith("plain2.log")
    plain, drafted, plain2 = (rep["arms"][a] for a in ("plain", "drafted", "plain2"))
    for lv in plain2:
        _check_level(lv, int(lv["level"]) * 2, 8)  # two rounds of one request a client
        assert lv["drafted"] == 0 and lv["accept_length"] is None
        assert all(r["draft_n"] is None for r in lv["records"])
    for a, b in zip(plain, plain2):  # the same prompts in the same order
        assert [r["prompt"] for r in a["records"]] == [r["prompt"] for r in b["records"]]
    floor = rep["ratios_by_arm"]["plain2"]
    for r, a, b in zip(floor, plain, plain2):
        assert r["aggregate_tps"] == pytest.approx(b["aggregate_tps"] / a["aggregate_tps"])
        assert r["aggregate_tps_rounds"] == pytest.approx([y / x for x, y in zip(a["round_tps"], b["round_tps"])])
    for r, a, b in zip(rep["ratios"], plain, drafted):  # the report's ratios are still the drafted arm's
        assert r["aggregate_tps"] == pytest.approx(b["aggregate_tps"] / a["aggregate_tps"])
    # the printed band: the lowest and highest plain2 / plain over the levels, and over single rounds
    agg = [r["aggregate_tps"] for r in floor]
    rounds = [v for r in floor for v in r["aggregate_tps_rounds"]]
    ttft = [r["ttft_p50_s"] for r in floor]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("noise floor:"))
    assert f"ran {min(agg):.2f}-{max(agg):.2f}x of the first's aggregate" in line, line
    assert f"(single rounds {min(rounds):.2f}-{max(rounds):.2f}x)" in line, line
    assert f"TTFT p50 {min(ttft):.2f}-{max(ttft):.2f}x" in line, line
    gap = [r["longest_gap_p95_s"] for r in floor if r["longest_gap_p95_s"] is not None]
    assert gap and f"longest wait p95 {min(gap):.2f}-{max(gap):.2f}x" in line, line
    assert "plain2/pl" in p.stdout


def test_load_pause_cut_one_server_at_a_time(small_pair, ggufdspark_cli, isolated, tmp_path):
    """--draft-n-max-by-slots reaches the drafted arm (0:0: the draft loaded, never a draft: engine
    patch 0021 with L = 0), and --sequential runs one server after the other."""
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", "8", "--requests-per-client", "1",
                              "--draft-n-max", "3", "--draft-n-max-by-slots", "0:0", "--sequential", "--json",
                              "--log-dir", str(tmp_path / "logs")), env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["traffic"]["order"].startswith("sequential")
    assert "--spec-draft-n-max-by-slots 0:0" in " ".join(rep["settings"]["drafted_command"]), rep["settings"]
    assert rep["settings"]["draft_cut"] == [[0, 0]]
    assert all(lv["drafted"] == 0 for lv in rep["arms"]["drafted"]), rep["arms"]["drafted"]
    assert "drafts paused: " in (tmp_path / "logs" / "drafted.log").read_text()


def test_tune_load_arms_side_by_side_with_the_paused_arm(small_pair, ggufdspark_cli, isolated, tmp_path):
    """tune --load: one run, one plain arm and a drafted arm per length, 0 the paused one (never a
    draft), all servers up and the levels interleaved (two rounds a level, --rounds 2); the ratios are
    each arm's against that plain arm, over both rounds."""
    p = ggufdspark_cli("tune", "--load", "-m", str(small_pair.target), "-md", str(small_pair.draft),
                       "--draft-lengths", "0,2", "--clients", "1,2", "--answer-tokens", "8", "--requests-per-client",
                       "1", "--rounds", "2", "--no-save", "--json", "--log-dir", str(tmp_path / "logs"), env=isolated)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    rep = res["load"]
    assert set(rep["arms"]) == {"plain", "n2", "n0"} and rep["traffic"]["order"].startswith("interleaved")
    assert rep["traffic"]["shape"]["rounds"] == 2  # --rounds: every level twice, the choice on both
    assert all(len(lv["round_tps"]) == 2 for arm in rep["arms"].values() for lv in arm)
    assert "paused" in rep["settings"]["drafted_arms"]["n0"]
    assert all(lv["drafted"] == 0 for lv in rep["arms"]["n0"]) and all(lv["drafted"] > 0 for lv in rep["arms"]["n2"])
    for n in ("0", "2"):
        want = {str(a["level"]): b["aggregate_tps"] / a["aggregate_tps"]
                for a, b in zip(rep["arms"]["plain"], rep["arms"][f"n{n}"])}
        assert set(res["ratios"][n]) == {"1", "2"}
        assert all(res["ratios"][n][k] == pytest.approx(v) for k, v in want.items())
    assert "drafts paused: " in (tmp_path / "logs" / "n0.log").read_text()
    assert res["profile"] is None  # --no-save


def test_load_sampled_requests(small_pair, ggufdspark_cli, isolated):
    """--temperature with --load: every request sampled (a seed a request, the same on both arms),
    the drafted arm still drafting; said in the traffic description; out of range refused."""
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1", "--answer-tokens", "12", "--requests-per-client", "2",
                              "--draft-n-max", "3", "--temperature", "0.8", "--json"), env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["traffic"]["shape"]["temperature"] == 0.8 and "sampled at temperature 0.8" in rep["traffic"]["requests"]
    assert "sampled at temperature 0.8" in rep["traffic"]["shape"]["describe"]
    assert all(lv["drafted"] > 0 for lv in rep["arms"]["drafted"]), rep["arms"]["drafted"]
    for lv in rep["arms"]["plain"] + rep["arms"]["drafted"]:
        _check_level(lv, 2, 12)
    bad = ggufdspark_cli(*_args(small_pair, "--clients", "1", "--temperature", "-1"), env=isolated)
    assert bad.returncode == 2 and "--temperature -1" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_load_prompt_scale_sends_prompts_twice_as_long(small_pair, ggufdspark_cli, isolated):
    """--prompt-scale 2: the same traffic with each prompt after the next one of the set, said in the
    traffic's description and shape; the set's rendered sizes about double (the JSON's
    prompt_tokens) and the requests' prompts, as the engine counted them, are those sizes."""
    runs = {}
    for scale in ("1", "2"):
        p = ggufdspark_cli(*_args(small_pair, "--clients", "1", "--answer-tokens", "4", "--requests-per-client", "2",
                                  "--draft-n-max", "3", "--prompt-scale", scale, "--json"), env=isolated)
        assert p.returncode == 0, p.stderr
        runs[scale] = json.loads(p.stdout)
    one, two = runs["1"]["traffic"], runs["2"]["traffic"]
    assert two["shape"]["prompt_scale"] == 2 and one["shape"]["prompt_scale"] == 1
    assert "prompts 2 times as long" in two["shape"]["describe"] and "times as long" not in one["shape"]["describe"]
    assert "--prompt-scale 2" in two["prompts"] and "--prompt-scale" not in one["prompts"]
    assert 1.7 <= two["prompt_tokens"]["median"] / one["prompt_tokens"]["median"] <= 2.5, (one, two)
    for lv in runs["2"]["arms"]["plain"] + runs["2"]["arms"]["drafted"]:
        _check_level(lv, 2, 4)
        assert all(r["prompt_n"] == r["prompt_tokens"] for r in lv["records"])
    first = {r["prompt"]: r["prompt_tokens"] for r in runs["1"]["arms"]["plain"][0]["records"]}
    for r in runs["2"]["arms"]["plain"][0]["records"]:  # the same prompt order, each now longer
        assert r["prompt"] in first and r["prompt_tokens"] > first[r["prompt"]], (r, first)


def test_load_inter_token_latency_plain_and_drafted(small_pair, ggufdspark_cli, isolated, tmp_path):
    """ITL (every wait between two streamed chunks, pooled over a level's requests), TPOT and the
    p99s on a real plain / drafted run: in every level of both arms, ordered, their ratios drafted /
    plain, the tails table printed."""
    out = tmp_path / "load.json"
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", "96", "--requests-per-client", "1",
                              "--draft-n-max", "3", "--json", str(out)), env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    plain, drafted = rep["arms"]["plain"], rep["arms"]["drafted"]
    for arm in (plain, drafted):
        for lv in arm:
            _check_level(lv, int(lv["level"]), 96)
            assert lv["image_requests"] == 0 and lv["failed"] == 0
    accepted = [r for lv in drafted for r in lv["records"] if r["draft_n_accepted"]]
    # chunks are counted by arrival time (events within 1 ms are one chunk): how many a drafted answer
    # takes depends on the machine's load, so only the bound is exact
    assert accepted and all(0 < r["chunks"] <= r["output_tokens"] for r in accepted), accepted
    keys = ("ttft_p99_s", "latency_p99_s", "longest_gap_p99_s", "itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_p50_s",
            "tpot_p95_s", "tpot_p99_s", "ttft_prompt_p50_s", "ttft_prompt_p95_s", "ttft_wait_p50_s", "ttft_wait_p95_s")
    for r, a, b in zip(rep["ratios"], plain, drafted):
        # a level whose answers each reached the client in one burst has no wait to pool: no ITL, no ratio
        assert all(r[k] == pytest.approx(b[k] / a[k]) if a[k] and b[k] is not None else r[k] is None
                   for k in keys), r
    block = p.stdout.split("Tails and inter-token latency")[1].splitlines()
    assert block[1].split() == ["clients", "arm", "TTFT", "p99", "lat", "p99", "gap", "p99", "ITL", "p50", "ITL",
                                "p95", "ITL", "p99", "TPOT", "p50", "TPOT", "p99"], block[:3]
    assert [ln.split()[:2] for ln in block[2:4]] == [["1", "plain"], ["1", "drafted"]] and block[4].split()[0] == "ratio"
    # the time to first token split, one row an arm and level, the figures as the JSON has them
    block = p.stdout.split("Time to first token split")[1].split("\n\n")[0].splitlines()
    assert block[1].split() == ["clients", "arm", "TTFT", "p50", "TTFT", "p95", "prompt50", "prompt95", "wait", "p50",
                                "wait", "p95"], block[:3]
    row = block[3].split()
    assert row[:2] == ["1", "drafted"] and row[-1] == f"{drafted[0]['ttft_wait_p95_s'] * 1000:.1f}ms", block
    assert "Requests: answered, with an image" not in p.stdout  # no image, no failure: no such table


def test_load_image_share_sends_the_same_image_requests_to_both_arms(vl_pair, ggufdspark_cli, isolated, tmp_path):
    """--image-share 0.5 on the VL pair with its mmproj: half of each level's requests carry a drawn
    picture (seeded: the same requests and pictures on both arms), every one answered, the engine's
    prompt count holding the image tokens; the p99s and ITL fields present and ordered."""
    out = tmp_path / "load.json"
    p = ggufdspark_cli("bench", "--load", "-m", str(vl_pair["tower"]), "-md", str(vl_pair["draft"]), "--mmproj",
                       str(vl_pair["mmproj"]), "--clients", "2", "--image-share", "0.5", "--answer-tokens", "8",
                       "--requests-per-client", "2", "--draft-n-max", "3", "--json", str(out), "--log-dir",
                       str(tmp_path / "logs"), env=isolated)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["traffic"]["shape"]["image_share"] == 0.5 and "0.5 of the requests with an image" in p.stdout
    assert rep["traffic"]["images"]["pictures"] == ["scene-256px", "chart-384px", "sign-512px"]
    assert rep["settings"]["mmproj"] == str(vl_pair["mmproj"])
    assert all("--mmproj" in rep["settings"][k] for k in ("plain_command", "drafted_command"))
    assert sorted(f.name for f in (tmp_path / "logs" / "images").iterdir()) == [
        "chart-384px.png", "scene-256px.png", "sign-512px.png"]
    (plain,), (drafted,) = rep["arms"]["plain"], rep["arms"]["drafted"]
    for lv in (plain, drafted):
        assert lv["requests"] == 4 and lv["image_requests"] == 2 and lv["failed"] == 0, lv
        recs = lv["records"]
        assert all(r["error"] is None and r["output_tokens"] == 8 for r in recs)
        assert all(r["prompt_n"] == r["prompt_tokens"] for r in recs)
        _check_tails(lv)
    # the same requests, with the same pictures, on both arms
    key = lambda r: (r["index"], r["client"], r["prompt"], r["image"])  # noqa: E731
    assert [key(r) for r in plain["records"]] == [key(r) for r in drafted["records"]]
    # an image request's prompt holds the picture's tokens on top of its text (the same prompt's
    # text-only size, where one was sent without an image)
    by_prompt = {r["prompt"]: r["prompt_tokens"] for r in plain["records"] if r["image"] is None}
    for r in plain["records"]:
        if r["image"] and r["prompt"] in by_prompt:
            assert r["prompt_tokens"] >= by_prompt[r["prompt"]] + 64, r  # 256 x 256: LFM2's minimum, 64
    assert drafted["drafted"] > 0
    assert "Requests: answered, with an image, failed" in p.stdout
    block = p.stdout.split("Requests: answered, with an image, failed")[1].splitlines()
    assert block[2].split() == ["2", "plain", "4", "2", "0"] and block[3].split() == ["2", "drafted", "4", "2", "0"]


def test_load_poisson_with_synthetic_acceptance(small_pair, ggufdspark_cli, isolated, tmp_path):
    p = ggufdspark_cli(*_args(small_pair, "--rate", "20", "--requests", "5", "--clients", "3", "--answer-tokens", "8",
                              "--draft-n-max", "3", "--synthetic-rates", "0.9,0.8,0.7,0.6", "--seed", "5", "--json"),
                       env=isolated)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    shape = rep["traffic"]["shape"]
    assert shape["mode"] == "poisson" and shape["levels"] == [20.0] and shape["max_in_flight"] == 3
    assert rep["settings"]["slots"] == 3
    assert rep["synthetic"].startswith("synthetic acceptance, rates 0.9,0.8,0.7")
    assert "--spec-synth-rates" in rep["settings"]["drafted_command"]
    for arm in ("plain", "drafted"):
        (lv,) = rep["arms"][arm]
        _check_level(lv, 5, 8)
        starts = [r["start_s"] for r in lv["records"]]
        assert starts == sorted(starts)  # sent in arrival order
        # open loop: no client sends "after its first", so no such TTFT
        assert all(r["turn"] is None for r in lv["records"]) and lv["ttft_p50_later_s"] is None
    assert rep["arms"]["drafted"][0]["accept_length"] > 1.0


BAD = [
    (["--clients", "0"], "--clients 0"),
    (["--clients", "2", "--rate", "1,2", "--requests-per-client", "2"], "--requests-per-client"),
    (["--rate", "0"], "--rate 0"),
    (["--rate", "1", "--clients", "2,4"], "--clients 2,4"),
    (["--requests", "4"], "--requests"),
    (["--answer-tokens", "0"], "--answer-tokens 0"),
    (["--requests-per-client", "0"], "--requests-per-client 0"),
    (["--concurrency", "1,2"], "--concurrency"),
    (["-n", "16"], "--n-predict"),
    (["--max-plain-drift", "1"], "--max-plain-drift"),
    (["--draft-n-max-by-slots", "8:x"], "'8:x' is not N:L"),
    (["--temperature", "-1"], "--temperature -1"),
    (["--rounds", "0"], "--rounds 0"),
    (["--image-share", "0.5"], "--image-share 0.5: image requests need the vision projector (--mmproj FILE)"),
    (["--image-share", "1.5"], "--image-share 1.5: expected a fraction of the requests in [0, 1]"),
    (["--image-share", "-0.1"], "--image-share -0.1"),
    (["--prompt-scale", "0"], "--prompt-scale 0: expected 1 (the set as it is) to 8"),
    (["--prompt-scale", "9"], "--prompt-scale 9"),
]


@pytest.mark.parametrize("extra,needle", BAD, ids=[b[1] for b in BAD])
def test_load_bad_options_are_refused_in_one_line(small_pair, ggufdspark_cli, isolated, extra, needle):
    p = ggufdspark_cli(*_args(small_pair, *extra), env=isolated)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_load_options_need_load(small_pair, ggufdspark_cli, isolated):
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--clients", "2",
                       env=isolated)
    assert p.returncode == 2 and "--clients needs --load" in p.stderr and "Traceback" not in p.stderr
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--noise-floor",
                       env=isolated)
    assert p.returncode == 2 and "--noise-floor needs --load" in p.stderr and "Traceback" not in p.stderr
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--image-share", "0.5",
                       env=isolated)
    assert p.returncode == 2 and "--image-share needs --load" in p.stderr and "Traceback" not in p.stderr
    p = ggufdspark_cli(*_args(small_pair, "--clients", "x"), env=isolated)  # click's own usage error
    assert p.returncode == 2 and "'x': expected comma-separated int values" in p.stderr and "Traceback" not in p.stderr


def test_device_script_invocation_on_the_small_pair(small_pair, isolated, dspark_engine, tmp_path):
    """benchmarks/h200.sh load's own command line (published profile, serve's defaults), run on CPU
    with the small pair in place of the full-size one; ROUNDS=2 reaches bench --load as --rounds 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
           "SERVER": dspark_engine.path, "CLIENTS": "1,2", "ANSWERS": "8", "REQUESTS_PER_CLIENT": "1",
           "ROUNDS": "2", "OUT": str(out), "WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "load"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "failed" not in p.stdout, p.stdout
    rep = json.loads((out / "load-8.json").read_text())
    assert rep["synthetic"].startswith("synthetic acceptance, rates 0.7838,0.6143")  # the published profile
    assert rep["traffic"]["shape"]["levels"] == [1, 2] and rep["traffic"]["shape"]["rounds"] == 2
    n = rep["settings"]["draft_n_max"]
    assert len(rep["settings"]["synthetic"]["rates"]) == n  # truncated to the draft length
    for arm in ("plain", "drafted"):
        for lv in rep["arms"][arm]:
            _check_level(lv, 2 * int(lv["level"]), 8)
            assert len(lv["round_tps"]) == 2


def test_device_script_unpack_keeps_an_engine_that_starts_and_removes_one_that_does_not(dspark_engine, tmp_path):
    """benchmarks/h200.sh unpack on the project's own engine, packed as pack-local and a trained PACK=1 call
    pack one (build.json and build/bin, xz, split): it lands in WORK's engine cache and its llama-server's
    version is printed; a second unpack keeps what is there; an engine whose llama-server cannot start
    (here: its file cut short) is removed, with its exit status, so that setup builds it instead."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    exe = Path(dspark_engine.path)
    key_dir = exe.parent.parent.parent
    key, pack, work = key_dir.name, tmp_path / "pack", tmp_path / "work"
    pack.mkdir()
    subprocess.run(f"tar -C '{key_dir.parent}' -cf - '{key}/build.json' '{key}/build/bin' | xz -0 -T0 "
                   f"| split -b 15M - '{pack}/{key}.tar.xz.'", shell=True, check=True, timeout=300)
    env = {**os.environ, "ENGINE_PACK": str(pack), "WORK": str(work), "OUT": str(tmp_path / "out"),
           "PYTHON": sys.executable}

    def unpack():
        return subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "unpack"], env=env, capture_output=True,
                              text=True, timeout=300)

    p = unpack()
    unpacked = work / "cache" / "engine" / key
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(rf"unpacked {key}: version: \d+", p.stdout), p.stdout
    assert (unpacked / "build" / "bin" / "llama-server").is_file() and (unpacked / "build.json").is_file()
    (unpacked / "kept").write_text("")  # a second unpack keeps the engine as it is
    p = unpack()
    assert p.returncode == 0 and f"unpacked {key}: version" in p.stdout, p.stdout + p.stderr
    assert (unpacked / "kept").is_file()
    server = unpacked / "build" / "bin" / "llama-server"  # cut short, as a broken transfer would leave it
    server.write_bytes(server.read_bytes()[:4096])
    p = unpack()
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(rf"stage unpack: {key}'s llama-server does not start here \(exit status [1-9]\d*\), removed:",
                     p.stdout), p.stdout
    assert not unpacked.exists()


def test_device_script_pack_local_without_the_pinned_tree_says_so_in_one_line(tmp_path):
    """benchmarks/h200.sh pack-local in a checkout with no .carry/llama.cpp.tar.xz (a fresh clone: it is
    ignored) names the missing tree and the stage that makes it, exits 1, and builds nothing."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    checkout = tmp_path / "checkout"
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copy(repo / "benchmarks" / "h200.sh", checkout / "benchmarks" / "h200.sh")
    p = subprocess.run(["bash", str(checkout / "benchmarks" / "h200.sh"), "pack-local"], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert ("stage pack-local: no pinned tree (.carry/llama.cpp.tar.xz: run the carry stage first)"
            in p.stderr.splitlines()), p.stderr
    assert not (checkout / ".devwork" / "cache").exists() and not list((checkout / ".carry" / "engine").iterdir())


def test_device_script_speed_stage_interleaves_and_keeps_only_its_own_logs(small_pair, dspark_engine, isolated,
                                                                           tmp_path):
    """benchmarks/h200.sh speed on CPU with the small pair: INTERLEAVE=1, CROSS=1, SPEED_ENVS and
    SPEED_VARIANTS reach speed.py decode (every arm in one interleaved run, the flag set under the
    environment too); the profiled arms' lines land in speed-profile.txt; a second call on the same
    work folder (a warm machine) leaves that call's server logs only."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    base = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
            "SERVER": dspark_engine.path, "GPU": "", "TRIALS": "2", "LENGTHS": "2", "WORK": str(tmp_path / "work"),
            "PYTHON": sys.executable}

    def speed(out: Path, **env: str) -> dict:
        p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "speed"], env={**base, "OUT": str(out), **env},
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads((out / "speed.json").read_text())

    first = speed(tmp_path / "out1", INTERLEAVE="1", CROSS="1", SPEED_ENVS="LLAMA_SPEC_PROFILE=1",
                  SPEED_VARIANTS="--spec-draft-p-min 1e-30")
    assert first["args"]["interleave"] and first["args"]["cross_variants"], first["args"]
    arms = [(r.get("draft_n_max"), r.get("env"), r.get("variant")) for r in first["results"]]
    assert arms == [(None, None, None), (None, None, "--spec-draft-p-min 1e-30"), (2, None, None),
                    (2, "LLAMA_SPEC_PROFILE=1", None), (2, None, "--spec-draft-p-min 1e-30"),
                    (2, "LLAMA_SPEC_PROFILE=1", "--spec-draft-p-min 1e-30")], arms
    assert all(len(r["trial_t0_s"]) == 2 for r in first["results"]), first["results"]
    logs = tmp_path / "work" / "speed"
    assert len(list(logs.glob("*.log"))) == 6, sorted(p.name for p in logs.glob("*.log"))
    # the profiled arms' lines (two servers with LLAMA_SPEC_PROFILE=1), each after its log's name
    profile = (tmp_path / "out1" / "speed-profile.txt").read_text().splitlines()
    names = {line.split(".log:", 1)[0] for line in profile}
    assert len(names) == 2 and all("LLAMA_SPEC_PROFILE1" in n for n in names), profile
    assert sum(".log:spec profile:" in line for line in profile) == 2, profile
    second = speed(tmp_path / "out2")
    assert not second["args"]["interleave"] and [r["arm"] for r in second["results"]] == ["plain", "dspark-n2"]
    assert sorted(p.name for p in logs.glob("*.log")) == ["dspark-n2.log", "plain.log"]
    assert not (tmp_path / "out2" / "speed-profile.txt").exists()  # no profiled arm, no file


def test_one_request_bench_writes_its_json_file_too(small_pair, ggufdspark_cli, isolated, tmp_path):
    out = tmp_path / "bench.json"
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--limit", "1",
                       "--categories", "general_vqa", "-n", "8", "--concurrency", "1", "--max-plain-drift", "inf",
                       "--json", str(out), env=isolated)
    assert p.returncode == 0, p.stderr
    assert "lossless gate: PASS" in p.stdout  # the text report still goes to stdout
    rep = json.loads(out.read_text())
    assert rep["gate"]["status"] == "pass" and rep["load_shape"].startswith("lock-step micro-benchmark")
    assert f"json: {out}" in p.stderr


def test_named_arms_side_by_side_each_with_its_engine_environment(small_pair, isolated, dspark_engine, tmp_path):
    """benchmarks/serving.py arms (h200.sh's `arms` stage): two drafted arms of the same table beside one
    plain arm, one of them with an engine variable that only its server gets. The variable is
    patch 0025's limit, which the server logs when -np exceeds it (on every backend): only that arm's
    log says so; a second plain arm ("bare=plain KEY=VALUE layout=pooled") gets it too, serves no
    draft and runs one KV cache shared by the slots, every other arm llama-server's divided one. Every
    arm's levels are complete, each has its ratios against plain, the report names the variable; a
    malformed arm is refused in one line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out, logs = tmp_path / "arms.json", tmp_path / "logs"
    env = {**os.environ, **isolated}
    script = [sys.executable, str(repo / "benchmarks" / "serving.py"), "arms", "-m", str(small_pair.target),
              "-md", str(small_pair.draft), "--server", dspark_engine.path]
    p = subprocess.run([*script, "--clients", "1,2", "--requests-per-client", "1", "--answer-tokens", "8",
                        "--arm", "table=3 1:0", "--arm", "flagged=3 1:0 LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS=1",
                        "--arm", "bare=plain LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS=1 layout=pooled", "--json", str(out), "--log-dir", str(logs)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert list(rep["arms"]) == ["plain", "table", "flagged", "bare"]
    for arm in rep["arms"].values():
        for lv in arm:
            _check_level(lv, int(lv["level"]), 8)
    assert set(rep["ratios_by_arm"]) == {"table", "flagged", "bare"}
    assert rep["settings"]["drafted_arms"] == {"table": "draft length 3, cut 1:0",
                                               "flagged": "draft length 3, cut 1:0, LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS=1",
                                               "bare": "plain, LLAMA_SERVER_CUDA_GRAPHS_MAX_SLOTS=1, "
                                                       "one KV cache shared by the slots"}
    assert "--spec-type" in rep["settings"]["drafted_command"], rep["settings"]["drafted_command"]
    text = {a: (logs / f"{a}.log").read_text() for a in rep["arms"]}
    said = {a: "more than 1: CUDA graphs off" in t for a, t in text.items()}
    assert said == {"plain": False, "table": False, "flagged": True, "bare": True}, said
    unified = {a: "kv_unified = 'true'" in t for a, t in text.items()}
    assert unified == {"plain": False, "table": False, "flagged": False, "bare": True}, unified
    drafting = {a: "draft acceptance = " in t for a, t in text.items()}
    assert drafting == {"plain": False, "table": True, "flagged": True, "bare": False}, drafting
    assert "flagged/pl" in p.stdout and "table/pl" in p.stdout and "bare/pl" in p.stdout, p.stdout
    # every level's result reaches stderr as it ends, so a run cut short still shows what it measured
    levels = re.findall(r"^arms: (plain|table|flagged|bare), ([12]) clients: [\d.]+ tok/s aggregate", p.stderr,
                        re.M)
    assert sorted(levels) == sorted((a, c) for a in ("plain", "table", "flagged", "bare") for c in ("1", "2")), \
        p.stderr[-2000:]
    bad = subprocess.run([*script, "--arm", "x=seven"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--arm 'x=seven': expected NAME=N_MAX" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    bare = subprocess.run([*script, "--arm", "y=plain"], env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--arm 'y=plain': expected" in bare.stderr, bare.stderr


def test_named_arms_with_the_noise_floor(small_pair, isolated, dspark_engine, tmp_path):
    """serving.py arms --noise-floor (h200.sh arms with NOISE_FLOOR=1): a second plain server, plain2,
    beside the named arms, on the same prompts, with its band printed after the table; an arm that
    takes its name is refused in one line before any server starts."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out, logs = tmp_path / "arms.json", tmp_path / "logs"
    env = {**os.environ, **isolated}
    script = [sys.executable, str(repo / "benchmarks" / "serving.py"), "arms", "-m", str(small_pair.target),
              "-md", str(small_pair.draft), "--server", dspark_engine.path, "--noise-floor"]
    p = subprocess.run([*script, "--clients", "1", "--requests-per-client", "2", "--answer-tokens", "8",
                        "--arm", "served=3", "--json", str(out), "--log-dir", str(logs)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert list(rep["arms"]) == ["plain", "served", "plain2"]
    assert rep["settings"]["drafted_arms"] == {"served": "draft length 3"}
    for a in ("plain", "plain2"):
        assert "draft acceptance = " not in (logs / f"{a}.log").read_text()
    assert [r["prompt"] for r in rep["arms"]["plain2"][0]["records"]] == \
           [r["prompt"] for r in rep["arms"]["plain"][0]["records"]]
    x = rep["ratios_by_arm"]["plain2"][0]["aggregate_tps"]
    assert x == pytest.approx(rep["arms"]["plain2"][0]["aggregate_tps"] / rep["arms"]["plain"][0]["aggregate_tps"])
    assert f"noise floor: a second plain server (plain2, the same command) ran {x:.2f}-{x:.2f}x" in p.stdout, p.stdout
    clash = subprocess.run([*script, "--clients", "1", "--arm", "plain2=3"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert clash.returncode == 1 and "already named 'plain2'" in clash.stderr, clash.stderr
    assert "Traceback" not in clash.stderr and len(clash.stderr.strip().splitlines()) == 1, clash.stderr


def test_device_script_arms_hold_conversations(small_pair, isolated, dspark_engine, tmp_path):
    """h200.sh arms with CONVERSATIONS=1 (serving.py arms --conversations): every arm's clients hold
    conversations through the prompt cache, the second turn reusing the first's tokens."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
           "SERVER": dspark_engine.path, "WORK": str(tmp_path / "work"), "PYTHON": sys.executable, "OUT": str(out),
           "LOAD_ARMS": "served=3", "CLIENTS": "1", "REQUESTS_PER_CLIENT": "2", "ANSWERS": "8", "CONVERSATIONS": "1"}
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "arms"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads((out / "arms-a.json").read_text())
    assert rep["traffic"]["shape"]["conversation"] is True
    for arm in ("plain", "served"):
        first, second = sorted(rep["arms"][arm][0]["records"], key=lambda r: r["turn"])
        assert second["prompt_tokens"] > first["prompt_tokens"] + 8, (arm, first, second)
        assert second["cache_n"] + second["prompt_n"] == second["prompt_tokens"], (arm, first, second)
        assert second["cache_n"] > first["prompt_tokens"] // 2, (arm, first, second)  # the conversation reused


def test_named_arms_sample_at_the_temperature_given(small_pair, isolated, dspark_engine, tmp_path):
    """serving.py arms --temperature (h200.sh arms with TEMPERATURE): every arm's requests are sampled at
    it (the report's traffic says so, and every server's log shows the sampled chain ending in a
    draw, never the greedy one), with a second plain arm carrying an engine variable beside the
    drafted arm; a temperature below 0 is refused in one line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out, logs = tmp_path / "arms.json", tmp_path / "logs"
    env = {**os.environ, **isolated, "LLAMA_ARG_LOG_VERBOSITY": "4"}  # the servers log each task's sampler chain
    script = [sys.executable, str(repo / "benchmarks" / "serving.py"), "arms", "-m", str(small_pair.target),
              "-md", str(small_pair.draft), "--server", dspark_engine.path, "--clients", "1",
              "--requests-per-client", "2", "--answer-tokens", "8"]
    p = subprocess.run([*script, "--temperature", "0.8", "--arm", "d=3", "--arm", "ptopk=plain LLAMA_OUTPUT_TOPK=64",
                        "--json", str(out), "--log-dir", str(logs)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rep = json.loads(out.read_text())
    assert rep["traffic"]["shape"]["temperature"] == 0.8 and "sampled at temperature 0.8" in rep["traffic"]["requests"]
    assert list(rep["arms"]) == ["plain", "d", "ptopk"]
    for name in rep["arms"]:
        chains = re.findall(r"sampler chain: (.*)", (logs / f"{name}.log").read_text())
        # the warm-up requests are greedy; the 2 measured requests sampled
        sampled = [c for c in chains if c.rstrip().endswith("dist")]
        assert len(sampled) == 2, (name, chains)
    bad = subprocess.run([*script, "--temperature", "-1", "--arm", "d=3"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "--temperature -1" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_device_script_arms_gathers_the_profile_lines_into_one_file(small_pair, isolated, dspark_engine, tmp_path):
    """benchmarks/h200.sh arms: the engine's profile lines of an arm run with LLAMA_SPEC_PROFILE=1
    (patch 0004's "spec profile", every 128 target decodes) end up in one file, arms-TAG-profile.txt,
    each after its arm's log name (the device returns at most 8 files a call); the plain arm, run
    without the variable, has none there. A run without a profiled arm leaves no such file."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
           "SERVER": dspark_engine.path, "CLIENTS": "1", "ANSWERS": "400", "REQUESTS_PER_CLIENT": "1",
           "OUT": str(out), "WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "LOAD_ARMS": "prof=3 LLAMA_SPEC_PROFILE=1", "TAG": "p"}
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "arms"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "arms-p.json").is_file(), p.stdout[-2000:]
    lines = (out / "arms-p-profile.txt").read_text().splitlines()
    assert lines and all(line.startswith("prof.log:") for line in lines), lines[:5]
    assert any("spec profile: 128 target decodes, ms per decode: tgt_launch" in line for line in lines), lines[:5]
    env["LOAD_ARMS"], env["TAG"], env["ANSWERS"] = "same=3", "q", "8"
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "arms"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (out / "arms-q.json").is_file() and not (out / "arms-q-profile.txt").exists()


def test_device_script_lossless_stage_runs_the_suites_lossless_tests(small_pair, dspark_engine, isolated, tmp_path):
    """benchmarks/h200.sh lossless on CPU: the selected lossless tests run against the stage's engine
    (SERVER here, the call's build on the device), their output in lossless.txt and pytest's exit
    status printed; a selection that fails says so."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    base = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
            "SERVER": dspark_engine.path, "WORK": str(tmp_path / "work"), "PYTHON": sys.executable}
    for selection, rc, said in (("tests/test_parallel_spec.py -k thirty_two", 0, "1 passed"),
                                ("tests/test_parallel_spec.py -k no_such_test", 5, "deselected")):
        out = tmp_path / f"out-{rc}"
        p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "lossless"], capture_output=True, text=True,
                           env={**base, "OUT": str(out), "LOSSLESS_TESTS": selection}, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"lossless rc={rc}" in p.stdout, p.stdout + p.stderr
        assert said in (out / "lossless.txt").read_text(), (out / "lossless.txt").read_text()


def test_load_conversations_send_each_clients_chat_with_the_prompt_cache(small_pair, ggufdspark_cli, isolated,
                                                                         tmp_path):
    """--conversations: each closed-loop client holds one conversation. Its next prompt is the
    conversation so far (prompts and answers) and the next message, sent with cache_prompt, so the
    engine reuses what the slot (or its host prompt cache) holds and processes only the rest; one that would outgrow the slot's context starts over with
    the message alone. Both arms get the same conversations; --rate refuses it."""
    out = tmp_path / "load.json"
    answer, ctx = 8, 3000
    p = ggufdspark_cli(*_args(small_pair, "--clients", "1,2", "--answer-tokens", str(answer), "--requests-per-client",
                              "4", "--draft-n-max", "3", "--conversations", "--ctx-per-slot", str(ctx), "--json",
                              str(out)), env=isolated)
    assert p.returncode == 0, p.stderr
    assert "each client one conversation" in p.stdout
    rep = json.loads(out.read_text())
    shape = rep["traffic"]["shape"]
    assert shape["conversation"] is True and shape["context"] == ctx
    continued = restarted = 0
    for arm in ("plain", "drafted"):
        for lv in rep["arms"][arm]:
            recs = sorted(lv["records"], key=lambda r: (r["client"], r["turn"]))
            assert all(r["output_tokens"] == answer for r in recs)
            for prev, r in zip(recs, recs[1:]):
                if r["client"] != prev["client"]:
                    assert r["turn"] == 0 and r["cache_n"] == 0, r  # a client's first: nothing to reuse
                    continue
                if r["prompt_tokens"] > prev["prompt_tokens"] + answer:  # the conversation went on
                    continued += 1
                    # the engine reused the conversation and processed the rest: most often the whole
                    # previous prompt, but a conversation that came back through the host prompt cache
                    # may resume at a recurrent-state checkpoint a few tokens before its end (seen in
                    # CI: 1254 of 1258 reused)
                    assert r["cache_n"] + r["prompt_n"] == r["prompt_tokens"], (prev, r)
                    assert r["cache_n"] > prev["prompt_tokens"] // 2, (prev, r)
                else:  # it would not fit the slot: a new conversation with the message alone
                    restarted += 1
                    assert r["prompt_tokens"] + answer <= ctx < prev["prompt_tokens"] + answer + r["prompt_tokens"], \
                        (prev, r)
    assert continued > 0 and restarted > 0, (continued, restarted)  # both happen with this seed and slot size
    for a, b in zip(rep["arms"]["plain"], rep["arms"]["drafted"]):  # the same conversations on both arms
        key = lambda r: (r["client"], r["turn"], r["prompt"], r["prompt_tokens"])  # noqa: E731
        assert sorted(map(key, a["records"])) == sorted(map(key, b["records"]))
    bad = ggufdspark_cli(*_args(small_pair, "--rate", "2", "--conversations"), env=isolated)
    assert bad.returncode == 2 and "--conversations is for closed-loop clients" in bad.stderr, bad.stderr
    alone = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--conversations",
                           env=isolated)
    assert alone.returncode == 2 and "--conversations needs --load" in alone.stderr, alone.stderr


def test_device_script_verbose_stage_finds_the_switchs_log_lines(small_pair, dspark_engine, isolated, tmp_path):
    """benchmarks/h200.sh verbose on CPU with the small pair: one drafted server with -v in ENVS's
    environment answers one greedy request with drafts; the log's lines matching VERBOSE_GREP are
    counted (0061's token-map line, once; the schedulers' reserves), the log is kept in OUT, and the
    server it started has ended. Without VERBOSE_GREP the stage says what it needs and starts nothing."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
           "SERVER": dspark_engine.path, "GPU": "", "WORK": str(tmp_path / "work"), "OUT": str(out),
           "PYTHON": sys.executable, "PORT": str(port), "ENVS": "LLAMA_SPEC_PROFILE=1",
           "VERBOSE_GREP": r"set_token_map|sched_reserve: reserving \.\.\."}
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "verbose"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    drafted = re.search(r"^draft_n (\d+) accepted (\d+)$", p.stdout, re.M)
    assert drafted and int(drafted[1]) > 0, p.stdout
    counts = {m[2]: int(m[1]) for m in re.finditer(r"^\s*(\d+) (\S+)", p.stdout, re.M)}
    assert counts.get("set_token_map:") == 1 and counts.get("sched_reserve:", 0) >= 2, p.stdout
    log = (out / "verbose.log").read_text()
    assert "spec profile" in log  # ENVS reached the server
    with socket.socket() as s:  # the stage's server is gone: its port is free again
        s.bind(("127.0.0.1", port))
    del env["VERBOSE_GREP"]
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "verbose"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert "stage verbose: VERBOSE_GREP: the log lines to find" in p.stdout, p.stdout + p.stderr


def test_device_script_first_stage_measures_the_first_request_after_serve_starts(small_pair, dspark_engine,
                                                                                  isolated, tmp_path):
    """benchmarks/h200.sh first (benchmarks/serving.py first) on CPU with the small pair: fresh `serve`
    processes for each arm and run; the warm arm's ready record has its warm-up's seconds, the cold
    and plain ones none; every server answered its requests (the same prompt, drafted in the drafted
    arms); the summary's first / warm ratio is the medians' own. FIRST_ARMS adds the long arm, whose
    client first sent its untimed longer prompt."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = {**os.environ, **isolated, "TARGET": str(small_pair.target), "DRAFT": str(small_pair.draft),
           "SERVER": dspark_engine.path, "GPU": "", "WORK": str(tmp_path / "work"), "OUT": str(out),
           "PYTHON": sys.executable, "RUNS": "2", "FIRST_ARMS": "warm,cold,plain,long"}
    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "first"], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads((out / "first.json").read_text())
    assert sorted(rep["runs"]) == ["cold", "long", "plain", "warm"]
    for arm, runs in rep["runs"].items():
        assert len(runs) == 2 and all(len(r["requests"]) == 3 for r in runs), (arm, runs)
        prompt_ns = {q["prompt_n"] for r in runs for q in r["requests"]}
        assert len(prompt_ns) == 1 and min(prompt_ns) > 20, (arm, runs)  # one prompt, processed whole each time
        prewarms = [r["prewarm"] for r in runs]
        if arm == "long":  # its untimed first request: a longer prompt than the timed one
            assert all(w and w["s"] > 0 and w["prompt_n"] > 2 * min(prompt_ns) for w in prewarms), (arm, prewarms)
        else:
            assert prewarms == [None, None], (arm, prewarms)
        drafted = [(q["draft_n"] or 0) > 0 for r in runs for q in r["requests"]]
        assert all(drafted) if arm != "plain" else not any(drafted), (arm, runs)
        warmups = [r["warmup_s"] for r in runs]
        assert all(isinstance(w, float) and w > 0 for w in warmups) if arm == "warm" else warmups == [None, None]
        s = rep["summary"][arm]
        assert s["first_over_warm"] == s["first_ttft_s"] / s["warm_ttft_s"], s
    assert "vs plain first" in p.stdout and len(list((tmp_path / "work" / "first").glob("*.log"))) == 8


def test_device_quant_stage_serves_the_quantized_target_and_draft(small_pair, dspark_engine, isolated, tmp_path):
    """benchmarks/h200.sh quant on CPU: QUANT and DQUANT quantize the target and the draft (beside
    them) with the engine's llama-quantize, and the stage after it (speed) serves exactly those two
    files. A draft type a DSpark draft cannot take ends the call: quantize's own reason, exit 1, and
    no later stage runs on another pair."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from ggufdspark.gguffile.reader import read_gguf

    repo = Path(__file__).resolve().parent.parent
    pair = tmp_path / "pair"
    pair.mkdir()
    target, draft = (Path(shutil.copy(p, pair)) for p in (small_pair.target, small_pair.draft))
    env = {**os.environ, **isolated, "TARGET": str(target), "DRAFT": str(draft), "SERVER": dspark_engine.path,
           "GPU": "", "TRIALS": "1", "LENGTHS": "2", "WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "QUANT": "Q8_0", "DQUANT": "Q8_0"}

    p = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "quant", "speed"], env={**env, "OUT": str(tmp_path / "ok")},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    qt, qd = pair / target.name.replace(".gguf", "-Q8_0.gguf"), pair / draft.name.replace(".gguf", "-Q8_0.gguf")
    assert f"target now {qt}" in p.stdout and f"draft now {qd}" in p.stdout, p.stdout
    for f in (qt, qd):
        assert read_gguf(f).get("general.file_type") == 7, f  # LLAMA_FTYPE_MOSTLY_Q8_0
    cmd = json.loads((tmp_path / "ok" / "speed.json").read_text())["provenance"]["command"]
    assert cmd[cmd.index("-m") + 1] == str(qt) and cmd[cmd.index("-md") + 1] == str(qd), cmd

    bad = subprocess.run(["bash", str(repo / "benchmarks" / "h200.sh"), "quant", "speed"],
                         env={**env, "DQUANT": "IQ2_XXS", "OUT": str(tmp_path / "bad")}, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "stage quant: quantizing the draft to IQ2_XXS failed" in bad.stdout, bad.stdout
    assert "IQ2_XXS" in bad.stdout.split("failed", 1)[1], bad.stdout  # quantize's own line, naming the type
    assert not (tmp_path / "bad" / "speed.json").exists()
