"""Traffic for ``bench --load``: a prompt set with a realistic length spread, request schedules
(clients in a closed loop, or Poisson arrivals), and streamed requests timed on the client; the
per-level figures they give are ``ggufdspark.measuring.loadreport``'s.

The prompt set (``traffic_items``) is the built-in set (text-only: pictures described in text; a
multi-turn item is one request holding its whole conversation) plus longer items: multi-paragraph
questions and code to review (``data/traffic.jsonl``, written for this project) and documents to
summarize (``traffic.documents``, composed with a fixed seed). Measured on the generated pairs'
LFM2-style tokenizer (LFM2's pre-tokenizer, a byte-level BPE trained here; the small and the
full-size pair share it), rendered with the chat template, BOS included: 66 prompts of 35-2705
tokens, median 441 (``docs/bench.md`` has the distribution; ``tests/test_traffic.py`` checks its
min, median and max).

Schedules. Closed loop: N clients, each sending its next request as soon as its previous answer
ended, R requests each; client c's j-th request takes prompt ``order[j * N + c]`` (cycled), so the
first wave is the first N prompts of the seeded order and every arm sends the same prompts in the
same order. Open loop: arrivals at seeded exponential gaps (mean 1/rate), the i-th arrival taking
``order[i]``; at most ``max_in_flight`` requests are in flight (later arrivals wait for a free
client, as vLLM's ``--max-concurrency`` does). Conversations (closed loop, ``Shape.conversation``):
each client's next prompt is its conversation so far and the next prompt of the order (its BOS
dropped), sent with ``cache_prompt``; one that would outgrow the slot's context starts over.

Images (``Shape.image_share``, ``ImageTraffic``): a seeded share of each level's requests carry one
of a few drawn pictures of different sizes before their text, chosen by request index, so every arm
sends the same requests; those go as multimodal prompts (the server's media marker and the picture).
A request the server answers with an error is recorded as failed and the level goes on.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import math
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Callable

from ggufdspark.errors import BenchError, EngineError, RequestFailedError
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring.loadreport import LevelResult, RequestRecord, percentile, summarize_level
from ggufdspark.measuring.prompts import render
from ggufdspark.measuring.traffic import documents
from ggufdspark.measuring.traffic.pictures import (  # noqa: F401 - the pictures, read through here by bench --load
    IMAGE_TOKENS_MAX,
    ImageTraffic,
    draw_pictures,
    image_traffic,
)
from ggufdspark.runners.client import Client

log = logging.getLogger(__name__)

DEFAULT_ANSWER_TOKENS = 256
DEFAULT_REQUESTS_PER_CLIENT = 3
DEFAULT_RATE_REQUESTS = 32
DEFAULT_SEED = 0
# Clients measured by default, per backend.
CLIENTS_DEFAULTS: dict[str, tuple[int, ...]] = {"cuda": (1, 2, 4, 8, 16, 32), "metal": (1, 2, 4, 8), "cpu": (1, 2)}
OTHER_CLIENTS = (1, 2, 4, 8)

Tick = Callable[[str], None]


# --------------------------------------------------------------------------- the prompt set


def traffic_items() -> list[pr.PromptItem]:
    """The load benchmark's prompts, in a fixed order: the built-in set (text-only), then the
    questions and code of ``data/traffic.jsonl``, then the composed documents."""
    items = []
    for it in pr.builtin_prompts(image_dir=None):
        # one request per item: a multi-turn item's whole conversation (its user turns in a row)
        items.append(pr.PromptItem(it.id, it.category, it.messages, "builtin"))
    text = resources.files("ggufdspark").joinpath("data/traffic.jsonl").read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.strip():
            rec = json.loads(line)
            items.append(pr.PromptItem(rec["id"], rec["category"], rec["messages"], "traffic"))
    for d in documents.documents():
        items.append(pr.PromptItem(d.id, f"document:{d.kind}", [{"role": "user", "content": d.text}], "traffic"))
    return items


def scaled_items(items: list[pr.PromptItem], scale: int) -> list[pr.PromptItem]:
    """``items`` with prompts ``scale`` times as long (the same traffic with longer prompts): item
    i's last user message is preceded by the text of the next ``scale - 1`` items of the set (their
    messages' contents, cycling, in order; neighbours are of a kind and of similar length), so that
    each prompt grows by about its own length each time and no two prompts share a prefix."""
    if scale <= 1:
        return list(items)
    out = []
    for i, it in enumerate(items):
        extra = ["\n\n".join(str(m["content"]) for m in items[(i + k) % len(items)].messages if m["role"] == "user")
                 for k in range(1, scale)]
        msgs = [dict(m) for m in it.messages]
        last = max(j for j, m in enumerate(msgs) if m["role"] == "user")
        msgs[last]["content"] = "\n\n".join([*extra, str(msgs[last]["content"])])
        out.append(pr.PromptItem(it.id, it.category, msgs, it.source))
    return out


def max_prompt_bytes(items: list[pr.PromptItem]) -> int:
    """An upper bound of any item's rendered token count, before a server can tokenize: its
    UTF-8 bytes plus the chat template's few tokens per message (a byte-level BPE token covers at
    least one byte)."""
    return max(sum(len(str(m["content"]).encode()) + 16 for m in it.messages) + 16 for it in items)


@dataclass
class Prompt:
    """One prompt of the set, rendered and tokenized once (every arm sends these token ids)."""

    id: str
    category: str
    tokens: list[int] = field(repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def length_stats(values: list[float]) -> dict:
    """min, p25, median, p75, p95, max and mean of prompt lengths (or any sizes)."""
    if not values:
        return {}
    return {"count": len(values), "min": min(values), "p25": percentile(values, 25), "median": percentile(values, 50),
            "p75": percentile(values, 75), "p95": percentile(values, 95), "max": max(values),
            "mean": statistics.fmean(values)}


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Shape:
    """The traffic of a run: closed-loop clients or Poisson rates (the levels), answer length,
    requests per level, the seed of the prompt order and of the arrivals."""

    mode: str  # "closed" or "poisson"
    levels: tuple[float, ...]  # clients (closed) or requests/s (poisson)
    answer_tokens: int = DEFAULT_ANSWER_TOKENS
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT  # closed loop
    requests: int = DEFAULT_RATE_REQUESTS  # per rate (poisson)
    max_in_flight: int | None = None  # poisson: at most this many at once (None: no limit)
    seed: int = DEFAULT_SEED
    temperature: float = 0.0  # 0: greedy; above, each request sampled with its own seed (seed, index)
    rounds: int = 1  # every level run this many times, round r with seed + r; the figures pool the rounds
    # closed loop: each client one conversation, its next prompt the conversation so far and a new
    # message, sent with cache_prompt (a chat page's traffic); a conversation that would outgrow
    # ``context`` tokens (a slot's) starts over with the new message alone
    conversation: bool = False
    context: int = 0
    image_share: float = 0.0  # this share of a level's requests carry an image (ImageTraffic)
    prompt_scale: int = 1  # each prompt this many times as long (``scaled_items``)

    def n_requests(self, level: float) -> int:
        return int(level) * self.requests_per_client if self.mode == "closed" else self.requests

    @property
    def slots(self) -> int:
        """Parallel slots the server needs: the most clients, or the in-flight limit."""
        if self.mode == "closed":
            return int(max(self.levels))
        return self.max_in_flight or self.requests

    def describe(self) -> str:
        ans = f"{self.answer_tokens}-token answers" + (f" sampled at temperature {self.temperature:g}"
                                                       if self.temperature > 0 else "")
        if self.image_share > 0:
            ans += f", {self.image_share:g} of the requests with an image"
        if self.prompt_scale > 1:
            ans += f", prompts {self.prompt_scale} times as long (each after the next {self.prompt_scale - 1} of the set)"
        if self.mode == "closed":
            lv = ",".join(str(int(v)) for v in self.levels)
            talk = (", each client one conversation (its next prompt: the conversation so far and a new message, "
                    "sent with the prompt cache)" if self.conversation else "")
            return (f"closed loop: {lv} clients, {self.requests_per_client} requests each (each sent when the "
                    f"client's previous answer ended){talk}, {ans}, {self._seeds()}")
        lv = ",".join(f"{v:g}" for v in self.levels)
        cap = f", at most {self.max_in_flight} in flight" if self.max_in_flight else ""
        return (f"open loop: Poisson arrivals at {lv} requests/s, {self.requests} requests a rate{cap}, {ans}, "
                f"{self._seeds()}")

    def _seeds(self) -> str:
        if self.rounds == 1:
            return f"seed {self.seed}"
        return f"{self.rounds} rounds a level (seeds {self.seed}-{self.seed + self.rounds - 1}), figures over all rounds"

    def round(self, r: int) -> "Shape":
        """Round ``r``'s traffic: the same shape with seed + r (another prompt order, other arrivals)."""
        return replace(self, seed=self.seed + r, rounds=1)

    def to_dict(self) -> dict:
        return {**asdict(self), "levels": list(self.levels), "describe": self.describe()}


def prompt_order(n_prompts: int, n_requests: int, seed: int) -> list[int]:
    """Indices into the prompt set for ``n_requests`` requests: seeded shuffles of the whole set,
    one after another (every prompt once before any repeats)."""
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < n_requests:
        idx = list(range(n_prompts))
        rng.shuffle(idx)
        out += idx
    return out[:n_requests]


def poisson_schedule(rate: float, n: int, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of ``n`` requests of a Poisson process with ``rate``
    requests per second: the first at 0, then exponential gaps of mean ``1/rate`` (seeded)."""
    if not rate > 0 or math.isinf(rate):
        raise BenchError(f"--rate {rate}: expected requests per second > 0")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def send(client: Client, p: Prompt, answer_tokens: int, *, index: int, who: int, t0: float,
         temperature: float = 0.0, seed: int | None = None, turn: int | None = None,
         tokens: list[int] | None = None, media: tuple[str, dict] | None = None) -> tuple[RequestRecord, list[int]]:
    """One streamed request of exactly ``answer_tokens`` tokens (``ignore_eos``), timed: greedy, or
    sampled at ``temperature`` with ``seed`` (the engine's default chain: top-k 40, top-p 0.95,
    min-p 0.05); ``turn``: the closed-loop client's request number. ``tokens``: a conversation's
    prompt (ending with ``p``'s message), sent with cache_prompt; None: ``p`` alone, without it.
    ``media``: the picture's name and the multimodal prompt sent instead (its prompt tokens are the
    engine's count, image tokens included). Returns the record and the answer's tokens."""
    start = time.perf_counter() - t0
    extra = {"seed": seed} if temperature > 0 and seed is not None else {}
    if tokens is not None:
        extra["cache_prompt"] = True
    sent = media[1] if media else p.tokens if tokens is None else tokens
    out = client.stream_complete(sent, n_predict=answer_tokens, ignore_eos=True, temperature=temperature, **extra)
    t = out.timings
    n_prompt = (t.prompt_n or 0) if media else len(sent)
    return RequestRecord(index, who, p.id, n_prompt, start, out.ttft_s, out.e2e_s, t.predicted_n or len(out.tokens),
                         t.prompt_n, t.prompt_ms, t.predicted_per_second, t.draft_n, t.draft_n_accepted, t.passes,
                         turn, out.longest_gap_s, t.cache_n, out.chunks, media[0] if media else None,
                         longest_gap_end_s=out.longest_gap_end_s, longest_gap_index=out.longest_gap_index,
                         gaps_s=out.gaps_s), out.tokens


def run_closed(client: Client, prompts: list[Prompt], clients: int, shape: Shape, *, tick: Tick | None = None,
               pictures: ImageTraffic | None = None) -> LevelResult:
    """``clients`` threads in a closed loop, ``shape.requests_per_client`` requests each.

    Raises:
        EngineError: a request broke (the first; the other clients stop after their current
            request). One the server answered with an error is recorded as failed instead.
    """
    n = clients * shape.requests_per_client
    order = prompt_order(len(prompts), n, shape.seed)
    media = _media(pictures, shape, n, order)
    records: list[RequestRecord] = []
    lock = threading.Lock()
    failed = threading.Event()

    def worker(c: int) -> None:
        history: list[int] = []  # a conversation so far: its prompts and answers
        for j in range(shape.requests_per_client):
            if failed.is_set():
                return
            i = j * clients + c
            p = prompts[order[i]]
            tokens = None
            if shape.conversation:  # the new message after the conversation (its BOS dropped)
                tokens = history + p.tokens[1:] if history else list(p.tokens)
                if shape.context and len(tokens) + shape.answer_tokens > shape.context:
                    tokens = list(p.tokens)  # the slot is full: a new conversation
            answer = _send_recorded(client, p, shape, i, c, t0, records, lock, failed, turn=j, tokens=tokens,
                                    media=media[i])
            history = (tokens or []) + answer
            if tick:
                tick(f"{clients} clients")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=clients) as ex:
        futures = [ex.submit(worker, c) for c in range(clients)]
    wall = time.perf_counter() - t0
    for f in futures:
        f.result()
    return summarize_level(clients, records, wall)


def _media(pictures: ImageTraffic | None, shape: Shape, n: int, order: list[int]) -> list[tuple[str, dict] | None]:
    """Per request index: the picture's name and the multimodal prompt it sends, or None (text)."""
    if pictures is None or shape.image_share <= 0:
        return [None] * n
    return [None if k is None else (pictures.pictures[k].name, pictures.prompt(order[i], k))
            for i, k in enumerate(pictures.plan(n, shape.seed))]


def _send_recorded(client: Client, prompt: Prompt, shape: Shape, index: int, who: int, t0: float,
                   records: list[RequestRecord], lock: threading.Lock, failed: threading.Event,
                   turn: int | None = None, tokens: list[int] | None = None,
                   media: tuple[str, dict] | None = None) -> list[int]:
    """One request of a schedule: its record appended under ``lock``, its answer's tokens returned.
    A request the server answered with an error is recorded as failed (``error``; no tokens); any
    other failure sets ``failed`` (no later request is sent) and is raised."""
    start = time.perf_counter() - t0
    try:
        r, answer = send(client, prompt, shape.answer_tokens, index=index, who=who, t0=t0,
                         temperature=shape.temperature, seed=shape.seed * 1_000_003 + index, turn=turn, tokens=tokens,
                         media=media)
    except RequestFailedError as e:
        log.warning("request %d (prompt %s%s) failed: %s", index, prompt.id, f", image {media[0]}" if media else "", e)
        took = time.perf_counter() - t0 - start
        r, answer = RequestRecord(index, who, prompt.id, 0 if media else len(tokens or prompt.tokens), start, took,
                                  took, 0, turn=turn, image=media[0] if media else None, error=str(e)), []
    except BaseException:
        failed.set()
        raise
    with lock:
        records.append(r)
    return answer


def run_poisson(client: Client, prompts: list[Prompt], rate: float, shape: Shape, *, tick: Tick | None = None,
                pictures: ImageTraffic | None = None) -> LevelResult:
    """``shape.requests`` requests arriving at ``rate`` per second (seeded), at most
    ``shape.max_in_flight`` at once; wall time from the first arrival to the last answer.

    Raises:
        EngineError: a request failed (no later arrival is sent).
    """
    n = shape.requests
    order = prompt_order(len(prompts), n, shape.seed)
    arrivals = poisson_schedule(rate, n, shape.seed)
    media = _media(pictures, shape, n, order)
    records: list[RequestRecord] = []
    lock = threading.Lock()
    failed = threading.Event()

    def one(i: int) -> None:
        if failed.is_set():
            return
        _send_recorded(client, prompts[order[i]], shape, i, i, t0, records, lock, failed, media=media[i])
        if tick:
            tick(f"{rate:g} requests/s")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=shape.max_in_flight or n) as ex:
        futures = []
        for i, at in enumerate(arrivals):
            wait = at - (time.perf_counter() - t0)
            if wait > 0 and failed.wait(wait):
                break
            futures.append(ex.submit(one, i))
    wall = time.perf_counter() - t0
    for f in futures:
        f.result()
    return summarize_level(rate, records, wall)


def run_level(client: Client, prompts: list[Prompt], level: float, shape: Shape, *, tick: Tick | None = None,
              pictures: ImageTraffic | None = None) -> LevelResult:
    """One level of ``shape`` on a started server; ``pictures``: this server's image requests."""
    if shape.mode == "closed":
        return run_closed(client, prompts, int(level), shape, tick=tick, pictures=pictures)
    return run_poisson(client, prompts, level, shape, tick=tick, pictures=pictures)


def render_all(client: Client, items: list[pr.PromptItem]) -> list[Prompt]:
    """Every item rendered with the server's chat template and tokenized (BOS included).

    Raises:
        BenchError: the server could not render or tokenize an item (its id named).
    """
    out = []
    for it in items:
        try:
            toks, _ = render(client, it.messages, None)
        except EngineError as e:
            raise BenchError(f"prompt {it.id!r}: the server could not render it: {e}") from None
        out.append(Prompt(it.id, it.category, list(toks)))
    return out


