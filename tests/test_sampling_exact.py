"""Speculative sampling keeps the target's distribution (issue 27, item 4): at temperature > 0 the
drafted server's per-position token frequencies agree with the plain server's within a chi-square
bound (``ggufdspark.measuring.sampling_check``); a deliberate change of one position's frequencies, or a small
logit bias on the server, is detected. Real engine, real generated pair, real acceptance."""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter

import pytest

from ggufdspark.measuring.sampling_check import (END, OTHER, check_samples, chi2_sf, gamma_q, homogeneity, pool, spread,
                                                 compare_position)
from ggufdspark.measuring.samplingbench import run_sampling_check, sample_arm
from ggufdspark.serve_checks import ServingOptions

# --------------------------------------------------------------------------- the statistics


@pytest.mark.parametrize("x, dof, want", [
    (3.841458820694124, 1, 0.05), (6.634896601021214, 1, 0.01), (18.307038053275146, 10, 0.05),
    (23.209251158954356, 10, 0.01), (2.705543454095404, 1, 0.10), (124.34211340400407, 100, 0.05),
    (0.0, 3, 1.0)])
def test_chi2_sf_at_known_critical_values(x, dof, want):
    assert chi2_sf(x, dof) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_chi2_sf_against_closed_forms():
    """dof 1: erfc(sqrt(x/2)); even dof 2m: exp(-x/2) * sum_{j<m} (x/2)^j / j! (both branches of
    the incomplete gamma function, far into the tail)."""
    for x in (1e-4, 0.3, 1.0, 2.9, 5.0, 17.0, 60.0, 300.0):
        assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-10, abs=1e-300)
        for m in (1, 2, 5, 20, 60):
            h = x / 2
            want = math.exp(-h) * sum(h ** j / math.factorial(j) for j in range(m))
            assert chi2_sf(x, 2 * m) == pytest.approx(want, rel=1e-9, abs=1e-300), (x, 2 * m)


def test_chi2_sf_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError):
        chi2_sf(1.0, 0)
    with pytest.raises(ValueError):
        gamma_q(0.0, 1.0)


def test_a_two_by_two_table():
    stat, dof = homogeneity([[1, 30, 50], [2, 70, 50]])
    assert dof == 1 and stat == pytest.approx(2 * (10 ** 2 / 40 + 10 ** 2 / 60))


def test_rare_tokens_are_pooled_until_every_bin_expects_five():
    a = Counter({7: 60, 8: 30, 9: 4, 10: 3, 11: 3})
    b = Counter({7: 58, 8: 33, 9: 5, 10: 2, 11: 2})
    bins = pool(a, b)
    assert [x[0] for x in bins] == [7, 8, OTHER] and bins[-1][1:] == [10, 9]
    n_a, n_b = sum(a.values()), sum(b.values())
    for _, x, y in bins:
        assert (x + y) * min(n_a, n_b) / (n_a + n_b) >= 5
    # an OTHER bin still short takes the smallest kept token
    bins = pool(Counter({1: 90, 2: 8, 3: 2}), Counter({1: 88, 2: 9, 3: 3}))
    assert [x[0] for x in bins] == [1, OTHER] and bins[-1][1:] == [10, 12]


def test_a_shorter_completion_counts_as_its_own_category():
    t = compare_position([[1, 2]] * 50 + [[1]] * 50, [[1, 2]] * 100, 1)
    assert [b[0] for b in t.bins] == [2, END] and t.dof == 1 and t.p_value < 1e-6


def _draw(rng: random.Random, probs: list[dict[int, float]], n: int) -> list[list[int]]:
    return [[rng.choices(list(p), weights=list(p.values()))[0] for p in probs] for _ in range(n)]


def test_equal_distributions_pass_and_one_changed_position_fails():
    rng = random.Random(1)
    probs = [{1: 0.5, 2: 0.3, 3: 0.15, 4: 0.05}, {5: 0.7, 6: 0.2, 7: 0.1}, {8: 0.4, 9: 0.4, 10: 0.2}]
    ok = check_samples(_draw(rng, probs, 600), _draw(rng, probs, 600))
    assert ok.status == "pass" and ok.tested == 3, ok.describe()
    bent = [dict(p) for p in probs]
    bent[1] = {5: 0.6, 6: 0.3, 7: 0.1}
    bad = check_samples(_draw(rng, probs, 600), _draw(rng, bent, 600))
    assert bad.status == "fail" and bad.worst == 1, bad.describe()
    assert bad.positions[1].p_adjusted == pytest.approx(min(1.0, 3 * bad.positions[1].p_value))


def test_a_single_token_everywhere_is_inconclusive():
    res = check_samples([[3, 3]] * 40, [[3, 3]] * 40)
    assert res.tested == 0 and res.status == "inconclusive" and "no position" in res.reason


def test_false_alarms_stay_near_alpha():
    """Under the null the Bonferroni-corrected check fails at most about alpha of the time."""
    rng = random.Random(2)
    probs = [{1: 0.45, 2: 0.3, 3: 0.2, 4: 0.05}] * 4
    fails = sum(check_samples(_draw(rng, probs, 200), _draw(rng, probs, 200), alpha=0.05).status == "fail"
                for _ in range(200))
    assert fails <= 22, f"{fails} of 200 null runs failed at alpha 0.05"


# --------------------------------------------------------------------------- the real engine

PROMPT = "The"
SAMPLES = 500     # a side
N_PREDICT = 6
# The small pair's random target is very peaked (top-1 about 18 nats above the runner-up at this
# prompt): temperature 8 over the 8 best tokens leaves the top token at about 65% at position 0
# and 15-35% at position 5, several others at 5-15% each, and the draft still accepted (~30%).
TEMPERATURE = 8.0
TOP_K = 8
PERTURBED = 2     # the position the data-side negative control changes
SHIFT = 0.5       # the fraction of its most common token moved to the runner-up
BIAS = -4.0       # logit bias of the server-side negative control (-0.5 nats after temperature 8)


def _shift(seqs: list[list[int]], position: int, fraction: float, rng: random.Random) -> list[list[int]]:
    """``seqs`` with ``fraction`` of the most common token at ``position`` replaced by the second
    most common one there (every other position untouched)."""
    (top, _), (second, _) = Counter(s[position] for s in seqs).most_common(2)
    out = [list(s) for s in seqs]
    for s in out:
        if s[position] == top and rng.random() < fraction:
            s[position] = second
    return out


def test_speculative_sampling_keeps_the_distribution(small_pair, isolated, start_server, tmp_path):
    t0 = time.monotonic()
    rep = run_sampling_check(ServingOptions(model=small_pair.target, draft=small_pair.draft), prompt=PROMPT,
                             samples=SAMPLES, n_predict=N_PREDICT, temperature=TEMPERATURE, top_k=TOP_K, alpha=0.01,
                             clients=4, log_dir=tmp_path / "logs")
    plain, drafted = rep.arms["plain"].tokens, rep.arms["drafted"].tokens
    d = rep.arms["drafted"]
    print(f"\n{rep.text()}\n  drafted {d.draft_n}, accepted {d.draft_n_accepted}")
    # the drafted arm really drafted, and drafts were accepted: speculative sampling was exercised
    assert d.draft_n > SAMPLES and d.draft_n_accepted > SAMPLES // 2, rep.text()
    assert rep.arms["plain"].draft_n == 0
    # the setting is not degenerate: at every position several tokens carry real probability
    for p in range(N_PREDICT):
        freqs = spread(plain, p)
        assert freqs[0][1] < 0.9 and sum(f >= 0.03 for _, f in freqs) >= 3, (p, freqs[:6])
        assert rep.check.positions[p].dof >= 3, rep.check.positions[p]
    assert rep.check.tested == N_PREDICT and rep.status == "pass", rep.text()

    # negative control 1: one position's frequencies changed in the data (half of its most
    # common token moved to the runner-up, about 15% of the mass there); the check must fail there
    bent = check_samples(plain, _shift(drafted, PERTURBED, SHIFT, random.Random(3)), alpha=0.01)
    print(f"  data shifted at {PERTURBED}: {bent.describe()}")
    assert bent.status == "fail" and bent.worst == PERTURBED, bent.describe()
    others = [t.p_value for t in bent.positions if t.position != PERTURBED]
    assert min(others) * bent.tested >= 0.01, "the shift moved other positions too"

    # negative control 2: the drafted server with a small logit bias against the plain arm's most
    # frequent token at position 0 (a real change of the distribution, through the same verify path)
    top0 = spread(plain, 0)[0][0]
    srv = start_server(model=small_pair.target, draft=small_pair.draft, draft_n_max=rep.settings["draft_n_max"],
                       parallel=4, ctx_size=4 * 512)
    biased = sample_arm(srv.client(timeout=300), PROMPT, list(range(50_000, 50_000 + SAMPLES)), n_predict=N_PREDICT,
                        temperature=TEMPERATURE, top_k=TOP_K, extra={"logit_bias": [[top0, BIAS]]})
    res = check_samples(plain, biased.tokens, alpha=0.01)
    print(f"  logit bias {BIAS} on token {top0}: {res.describe()}; accepted {biased.draft_n_accepted}/{biased.draft_n}")
    assert biased.draft_n_accepted > 0
    assert res.status == "fail", res.describe()
    print(f"  run time {time.monotonic() - t0:.1f} s")


def test_a_backend_sampled_verify_keeps_the_distribution(small_pair, start_server, tmp_path):
    """Issue 27 item 4, the engine's backend sampling (``-bs``): the drafted server samples each
    verify row inside the target's graph (the whole chain: top-k, temperature, then the draw; only
    token ids leave the device) and its per-position frequencies agree with a plain server's that
    samples on the host. The drafted server's log must show the backend chain choosing the verify's
    tokens, and drafts must be accepted."""
    common = dict(model=small_pair.target, parallel=4, ctx_size=4 * 512)
    plain = start_server(**common)
    seeds = list(range(SAMPLES))
    want = sample_arm(plain.client(timeout=300), PROMPT, seeds, n_predict=N_PREDICT, temperature=TEMPERATURE,
                      top_k=TOP_K)
    plain.stop()
    spec = start_server(draft=small_pair.draft, draft_n_max=3, extra_args=["-bs", "-v"], **common)
    got = sample_arm(spec.client(timeout=300), PROMPT, [s + 100_000 for s in seeds], n_predict=N_PREDICT,
                     temperature=TEMPERATURE, top_k=TOP_K)
    assert got.draft_n > SAMPLES and got.draft_n_accepted > SAMPLES // 4, (got.draft_n, got.draft_n_accepted)
    spec.stop()
    log = spec.log_text()
    on_backend = log.count("Backend sampler selected token")
    assert on_backend >= SAMPLES * N_PREDICT // 2, f"only {on_backend} tokens sampled by the backend chain"
    res = check_samples(want.tokens, got.tokens, alpha=0.01)
    print(f"\n  -bs drafted against host-sampled plain: {res.describe()}; accepted {got.draft_n_accepted}/"
          f"{got.draft_n}; {on_backend} tokens chosen on the backend")
    assert res.tested == N_PREDICT and res.status == "pass", res.describe()


def test_the_top_k_pass_samples_what_the_candidate_array_sampled(small_pair, start_server, monkeypatch):
    """Patch 0032: a chain whose first real sampler is a top-k (the logit bias aside) takes its k
    candidates from one pass over the logits row instead of an n_vocab candidate array and its
    partial sort. Same candidates in the same order, so every seeded draw must give the same token:
    a top-k 40 chain with top-p 0.95 and min-p 0.05 after it (the temperature before them here, as
    the small pair's rows are too peaked for them otherwise) and a top-k 8 chain with a logit bias
    lifting one token into the candidates, each on a plain and a drafted
    one-slot server (one request at a time: the same batches on both), with the pass and with
    LLAMA_SAMPLER_NO_FAST_TOPK=1 (both LLAMA_OUTPUT_TOPK=0: the host reads every row), and with patch
    0050's graph top 64 (LLAMA_OUTPUT_TOPK=64, on by default on CUDA only): the top-k 40 chain takes
    the graph's candidates, the biased chain (a positive bias) reads its row, and the tokens are the
    array's again. The verbose log shows which path each server took."""
    common = dict(model=small_pair.target, parallel=1, ctx_size=1024, extra_args=["-v"])
    seeds = list(range(7, 19))
    chains = {"default": dict(temperature=TEMPERATURE, top_k=40, extra={
                  "top_p": 0.95, "min_p": 0.05, "samplers": ["top_k", "temperature", "top_p", "min_p"]}),
              "top-k 8, biased": dict(temperature=TEMPERATURE, top_k=8, extra={"logit_bias": [[300, 30.0]]})}
    got: dict[tuple[str, str, str], object] = {}
    for path in ("pass", "array", "graph"):
        # the server inherits the environment
        monkeypatch.setenv("LLAMA_OUTPUT_TOPK", "64" if path == "graph" else "0")
        if path == "array":
            monkeypatch.setenv("LLAMA_SAMPLER_NO_FAST_TOPK", "1")
        else:
            monkeypatch.delenv("LLAMA_SAMPLER_NO_FAST_TOPK", raising=False)
        for arm in ("plain", "drafted"):
            srv = start_server(**common) if arm == "plain" else start_server(draft=small_pair.draft, draft_n_max=4,
                                                                              **common)
            for name, chain in chains.items():
                got[path, arm, name] = sample_arm(srv.client(timeout=300), PROMPT, seeds, n_predict=24,
                                                  concurrency=1, **chain)
            srv.stop()
            said = re.findall(r"top-k (\d+) from one pass over each logits row", srv.log_text())
            graph = set(re.findall(r"top-k (\d+) from the graph's top 64 candidates", srv.log_text()))
            if path == "graph":  # the biased chain reads its row by the pass
                assert graph == {"40"} and "8" in said, f"{arm}: graph candidates {graph}, one pass {sorted(set(said))}"
                continue
            assert not graph, f"{arm}: the graph's candidates were taken with LLAMA_OUTPUT_TOPK=0"
            if path == "pass":
                # (a drafted server's drafter has a sampler of its own, which may take the pass too)
                assert {"40", "8"} <= set(said), f"{arm}: the pass was not taken for both chains: {sorted(set(said))}"
            else:
                assert not said, f"{arm}: the pass was taken with LLAMA_SAMPLER_NO_FAST_TOPK=1"
    for arm in ("plain", "drafted"):
        for name in chains:
            a, b, g = got["pass", arm, name], got["array", arm, name], got["graph", arm, name]
            assert a.tokens == b.tokens, f"{arm}, {name}: seeded tokens differ between the pass and the array"
            assert g.tokens == b.tokens, f"{arm}, {name}: seeded tokens differ between the graph's top-k and the array"
            assert (a.draft_n, a.draft_n_accepted) == (b.draft_n, b.draft_n_accepted) == (g.draft_n, g.draft_n_accepted), \
                (arm, name)
            assert len({tuple(t) for t in a.tokens}) > len(seeds) // 2, f"{arm}, {name}: the seeds hardly differ"
    drafted = got["pass", "drafted", "default"]
    assert drafted.draft_n > 0 and drafted.draft_n_accepted > 0, (drafted.draft_n, drafted.draft_n_accepted)
    biased = [t for seq in got["pass", "plain", "top-k 8, biased"].tokens for t in seq]
    assert 300 in biased, "the biased token never came up: the bias did not reach the candidates"


def test_bench_sampling_check_command(small_pair, isolated, ggufdspark_cli, tmp_path):
    """``ggufdspark bench --sampling-check``: both arms on the real engine, the JSON report, exit 0."""
    import json

    p = ggufdspark_cli("bench", "--sampling-check", "-m", str(small_pair.target), "-md", str(small_pair.draft),
                       "--samples", "200", "-n", "4", "--temperature", str(TEMPERATURE), "--top-k", str(TOP_K),
                       "--sampling-prompt", PROMPT, "--log-dir", str(tmp_path / "logs"), "--json", env=isolated)
    assert p.returncode == 0, p.stderr[-2000:] + p.stdout[-2000:]
    rep = json.loads(p.stdout)
    assert rep["kind"] == "ggufdspark bench --sampling-check" and rep["status"] == "pass", rep["check"]
    assert rep["arms"]["drafted"]["draft_n_accepted"] > 0 and rep["arms"]["plain"]["samples"] == 200
    assert rep["check"]["tested"] == 4 and len(rep["check"]["positions"]) == 4
    assert (tmp_path / "logs" / "drafted.log").is_file()


@pytest.mark.parametrize("args, said", [
    (["--sampling-check", "--temperature", "0"], "--temperature 0: must be > 0"),
    (["--sampling-check", "--samples", "5"], "--samples 5: at least 20"),
    (["--sampling-check", "--alpha", "1.5"], "--alpha 1.5: must be in (0, 1)"),
    (["--sampling-check", "--plot", "x.png"], "bench --sampling-check: --plot belongs to another bench mode"),
    (["--sampling-check", "--clients", "2,4"], "--clients takes one number"),
    (["--samples", "100"], "bench: --samples needs --sampling-check"),
])
def test_bench_sampling_check_refuses_bad_options(small_pair, isolated, ggufdspark_cli, args, said):
    p = ggufdspark_cli("bench", "-m", str(small_pair.target), "-md", str(small_pair.draft), *args, env=isolated)
    assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
