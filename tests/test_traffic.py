"""The load benchmark's traffic: the Poisson schedule, the prompt order, percentiles (pure), and
the prompt set's length spread on the generated pair's real tokenizer (a real llama-server)."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from ggufdspark.errors import BenchError
from ggufdspark.measuring import traffic as tr
from ggufdspark.measuring.loadreport import percentile


def test_poisson_schedule_is_seeded_and_has_the_asked_rate():
    a = tr.poisson_schedule(4.0, 2000, seed=7)
    assert a == tr.poisson_schedule(4.0, 2000, seed=7)  # reproducible
    assert a != tr.poisson_schedule(4.0, 2000, seed=8)  # and the seed matters
    assert a[0] == 0.0 and all(b > c for b, c in zip(a[1:], a))  # first at once, then strictly later
    gaps = [b - c for b, c in zip(a[1:], a)]
    # 1999 exponential gaps of mean 0.25 s: the sample mean's standard error is 0.25/sqrt(1999) = 0.0056
    assert statistics.fmean(gaps) == pytest.approx(0.25, abs=0.02)
    assert (len(a) - 1) / a[-1] == pytest.approx(4.0, rel=0.08)
    # exponential, not evenly spaced: the gaps' spread is about their mean
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.15)
    with pytest.raises(BenchError, match="--rate 0"):
        tr.poisson_schedule(0, 3, seed=0)


def test_prompt_order_is_seeded_and_uses_every_prompt_before_repeating():
    o = tr.prompt_order(10, 25, seed=3)
    assert o == tr.prompt_order(10, 25, seed=3) and o != tr.prompt_order(10, 25, seed=4)
    assert sorted(o[:10]) == list(range(10)) and sorted(o[10:20]) == list(range(10))
    assert len(o) == 25


def test_percentile_matches_linear_interpolation():
    v = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(v, 50) == 3.0
    assert percentile(v, 95) == pytest.approx(4.8)
    assert percentile(v, 0) == 1.0 and percentile(v, 100) == 5.0
    assert percentile([None, 2.0], 50) == 2.0 and percentile([], 50) is None


def test_stall_shares_say_where_the_longest_gaps_fell_and_rounds_keep_their_clocks_apart():
    from ggufdspark.measuring.loadreport import RequestRecord, pool_rounds, summarize_level

    def rec(i, start, ttft, latency, gap, gap_end, gap_index):
        return RequestRecord(i, i, f"p{i}", 100, start, ttft, latency, 32, longest_gap_s=gap,
                             longest_gap_end_s=gap_end, longest_gap_index=gap_index)

    # 0: its longest gap (1.0-1.2 s of the level) while 1's prompt was in flight (sent at 1.1, first
    # token at 1.3); 1: its first gap, nothing else in flight; 2: a later gap, nothing in flight
    records = [rec(0, 0.0, 0.1, 3.0, 0.2, 1.2, 5), rec(1, 1.1, 0.2, 2.0, 0.1, 0.4, 0), rec(2, 2.0, 0.1, 3.0, 0.3, 2.0, 7)]
    lv = summarize_level(1, records, 5.0)
    assert lv.stall_first_share == pytest.approx(1 / 3) and lv.stall_join_share == pytest.approx(1 / 3)
    # two rounds on their own clocks: pooled, round 2's prompt does not fall in round 1's gap
    r2 = summarize_level(1, [rec(0, 1.1, 0.2, 2.0, 0.1, 0.4, 0)], 2.0)
    r1 = summarize_level(1, [rec(0, 0.0, 0.1, 3.0, 0.2, 1.2, 5)], 3.0)
    pooled = pool_rounds([r1, r2])
    assert pooled.stall_join_share == 0 and pooled.stall_first_share == 0.5
    assert pooled.records[1].start_s > pooled.records[0].start_s + pooled.records[0].latency_s
    assert summarize_level(1, [rec(0, 0.0, 0.1, 3.0, None, None, None)], 3.0).stall_join_share is None


def test_closed_loop_shape_counts_requests():
    s = tr.Shape("closed", (2, 4), 16, requests_per_client=3)
    assert [s.n_requests(lv) for lv in s.levels] == [6, 12] and s.slots == 4
    p = tr.Shape("poisson", (1.0, 2.0), 16, requests=10, max_in_flight=4)
    assert p.n_requests(2.0) == 10 and p.slots == 4
    assert "Poisson arrivals at 1,2 requests/s" in p.describe()


# The set's content, pinned: docs/bench.md states its token lengths, so a change to the composed
# documents or to data/traffic.jsonl must come with a new measurement there (and a new digest here).
TRAFFIC_DIGEST = "bb9348ec528e367479cd01f612bcb6ee0733df477b9abe639aa527d9c583ddea"


def test_prompt_set_is_deterministic():
    import hashlib
    import json

    items = tr.traffic_items()
    digest = hashlib.sha256(json.dumps([(i.id, i.messages) for i in items]).encode()).hexdigest()
    assert digest == TRAFFIC_DIGEST
    cats = [i.category for i in items]
    assert cats.count("code") == 5 and cats.count("question") == 8 and cats.count("chat") == 4
    assert sum(c.startswith("document:") for c in cats) == 25


def test_prompt_set_length_spread_on_the_real_tokenizer(small_pair, start_server):
    """The spread docs/bench.md states: a few dozen tokens to 2000+, median several hundred."""
    items = tr.traffic_items()
    assert len({it.id for it in items}) == len(items) == 66
    srv = start_server(model=small_pair.target, ctx_size=8192)
    prompts = tr.render_all(srv.client(), items)
    sizes = [p.n_tokens for p in prompts]
    st = tr.length_stats(sizes)
    print("prompt tokens:", {k: round(v) for k, v in st.items()})
    assert 20 <= st["min"] <= 80
    assert 300 <= st["median"] <= 800
    assert 2000 <= st["max"] <= 4000
    assert st["max"] + 1024 < tr.max_prompt_bytes(items) + 1024 + 16  # the context bound holds
    assert all(p.n_tokens <= tr.max_prompt_bytes([it]) for p, it in zip(prompts, items))
    kinds = {p.category.split(":")[0] for p in prompts if p.n_tokens > 1000}
    assert kinds == {"document"}, kinds


def test_scaled_prompt_set_is_twice_as_long_on_the_real_tokenizer(small_pair, start_server):
    """--prompt-scale 2 (the goals' "prompts twice as long"): each item's last user message is the next
    item's text, then its own; ids, categories and order kept; on the real tokenizer every prompt
    grows and the set's median about doubles; the context bound still holds."""
    items = tr.traffic_items()
    assert tr.scaled_items(items, 1) == items
    two = tr.scaled_items(items, 2)
    assert [(i.id, i.category) for i in two] == [(i.id, i.category) for i in items]
    for i, (a, b) in enumerate(zip(items, two)):
        last = [m for m in b.messages if m["role"] == "user"][-1]["content"]
        assert last.endswith([m for m in a.messages if m["role"] == "user"][-1]["content"]), a.id
        nxt = items[(i + 1) % len(items)]
        assert last.startswith([m for m in nxt.messages if m["role"] == "user"][0]["content"]), a.id
    assert items[0].messages != two[0].messages and tr.traffic_items()[0].messages == items[0].messages  # a copy
    srv = start_server(model=small_pair.target, ctx_size=16384)
    base = [p.n_tokens for p in tr.render_all(srv.client(), items)]
    scaled = [p.n_tokens for p in tr.render_all(srv.client(), two)]
    assert all(s > b for s, b in zip(scaled, base))
    ratio = tr.length_stats(scaled)["median"] / tr.length_stats(base)["median"]
    assert 1.7 <= ratio <= 2.5, ratio
    assert all(n <= tr.max_prompt_bytes([it]) for n, it in zip(scaled, two))


def test_streamed_completion_matches_the_plain_one_and_times_the_first_token(small_pair, start_server):
    srv = start_server(model=small_pair.target, ctx_size=4096)
    c = srv.client()
    toks = c.tokenize("Describe the weather in three sentences.", add_special=True)
    full = c.complete(toks, n_predict=24, ignore_eos=True)
    s = c.stream_complete(toks, n_predict=24, ignore_eos=True)
    assert s.tokens == full.tokens and len(s.tokens) == 24  # greedy: the same tokens, streamed one by one
    assert s.text == full.text
    assert 0 < s.ttft_s < s.e2e_s
    assert s.timings.predicted_n == 24 and s.timings.prompt_n == len(toks) and s.timings.source == "response"


def test_a_prompt_joining_the_batch_is_the_running_answers_longest_wait(small_pair, start_server):
    """stream_complete's longest_gap_s is the stall a user sees: a 1500-token prompt sent while
    another answer streams is processed in a step or a few, which that answer's next token waits
    for, so its longest wait between two tokens holds a good part of the prompt's processing time."""
    import threading

    srv = start_server(model=small_pair.target, parallel=2, ctx_size=8192)
    c = srv.client(timeout=300)
    toks = c.tokenize("Tell a long story.", add_special=True)
    out = {}
    a = threading.Thread(target=lambda: out.setdefault("a", c.stream_complete(toks, n_predict=1500, ignore_eos=True)))
    a.start()
    deadline = time.monotonic() + 60
    while not any(s.get("is_processing") and s.get("next_token", [{}])[0].get("n_decoded", 0) >= 5
                  for s in json.loads(c.get_text("/slots"))):  # the answer streams
        assert time.monotonic() < deadline, c.get_text("/slots")[:500]
    vocab = int(json.loads(c.get_text("/v1/models"))["data"][0]["meta"]["n_vocab"])
    long_prompt = [toks[0]] + [(17 * i) % (vocab - 100) + 100 for i in range(1500)]
    b = c.complete(long_prompt, n_predict=1, ignore_eos=True)
    a.join()
    s = out["a"]
    assert b.timings.prompt_n == len(long_prompt), b.timings
    assert s.longest_gap_s is not None and s.longest_gap_s <= s.e2e_s - s.ttft_s
    # the prompt may be split over a few steps (checkpoints): a good part of its time, and far more
    # than the answer's mean wait between tokens
    mean_wait = (s.e2e_s - s.ttft_s) / 1500
    assert s.longest_gap_s >= max(0.25 * b.timings.prompt_ms / 1000, 10 * mean_wait), \
        (s.longest_gap_s, b.timings.prompt_ms, mean_wait)
    # where it fell: one of the answer's waits (its place among them), ending after its first token and
    # by its last (on a loaded machine another stall can outlast the prompt's, so not tied to b's time)
    assert s.gaps_s[s.longest_gap_index] == s.longest_gap_s == max(s.gaps_s)
    assert s.ttft_s < s.longest_gap_end_s <= s.e2e_s


def test_a_server_dying_during_a_streamed_request_is_an_engine_error(small_pair, start_server):
    import threading

    from ggufdspark.errors import EngineError, RequestFailedError

    srv = start_server(model=small_pair.target, ctx_size=4096)
    c = srv.client()
    toks = c.tokenize("Count to a very large number.", add_special=True)
    failure: list[BaseException] = []

    def long_request() -> None:
        try:
            c.stream_complete(toks, n_predict=200000, ignore_eos=True)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            failure.append(e)

    t = threading.Thread(target=long_request)
    t.start()
    srv.wait_for_log(r"processing task", timeout=60)  # the request reached a slot
    srv.kill()
    t.join(timeout=60)
    assert not t.is_alive()
    assert failure and isinstance(failure[0], EngineError), failure
    # a broken stream ends bench --load's run; only an error the server answered counts as a failed request
    assert not isinstance(failure[0], RequestFailedError), failure
    assert "/completion" in str(failure[0])
