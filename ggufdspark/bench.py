"""``bench``: how much faster decoding is with the DSpark draft on this machine, and whether the
greedy output is still exactly the target's (the lossless gate).

Arms run on one engine build, one server each, bracketed ``plain / speculative / plain`` so drift
shows: the target alone, the target with the draft, the target alone again. Each item of the prompt
set is rendered with the server's chat template and tokenized once (``/tokenize`` of the first
plain server); every arm receives the same token ids. Multi-turn items run turn by turn: a user turn
with no assistant message after it in the set gets the first plain run's reply as history, so all
arms see identical prompts. Decoding is greedy.

The gate compares each request's speculative output with the plain output of the same engine,
token by token. At the first differing position it asks the plain server for the top-2
probabilities (``n_probs``): a *near-tie* (gap ``p1 - p2`` below ``near_tie_gap``, and the
speculative token is the plain run's runner-up) is reported and counted; anything else is a
*defect* and fails the run (``LosslessGateError``, exit 3).

Note on the pinned engine: its ``/completion`` schema has the per-request ``speculative.*`` fields
compiled out (``tools/server/server-schema.cpp``, ``#if 0``), so the draft length is a server flag
and every draft length needs its own server start (``tune`` does that).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import json
import logging
import math
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ggufdspark import engine as eng
from ggufdspark import hardware, profiles
from ggufdspark import prompts as pr
from ggufdspark import timings as tm
from ggufdspark.check import check_pair
from ggufdspark.images import image_b64
from ggufdspark.errors import BenchError, EngineError, InputNotFoundError, LosslessGateError
from ggufdspark.gguffile.constants import Key
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.runners.server import Client, ServerProcess, ServerSettings

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]

# A divergence is a near-tie when, at the first differing position, the plain run's top-1 and
# top-2 probabilities differ by less than this and the speculative token is the plain runner-up.
# Batched verification changes the reduction order of the target's matmuls; on F16/BF16 that moves
# logits by O(1e-2), which flips the argmax only when the two leaders are this close (a logit gap
# of about 0.2 at p ~ 0.5). Larger gaps cannot come from rounding: they are defects.
NEAR_TIE_GAP = 0.05

# Concurrency levels measured by default, per backend (the 1, 8, 32 where a GPU can take it).
CONCURRENCY_DEFAULTS: dict[str, tuple[int, ...]] = {"cuda": (1, 8, 32), "metal": (1, 4, 8), "cpu": (1, 4)}
OTHER_CONCURRENCY = (1, 8)
DEFAULT_N_PREDICT = 128
ROUNDS = 2  # requests each thread sends at one concurrency level
WARMUP_TOKENS = 8


# --------------------------------------------------------------------------- the draft's limits


@dataclass(frozen=True)
class DraftLimits:
    block_size: int
    max_n: int  # longest draft the engine accepts for this draft
    confidence_head: bool


def draft_limits(draft: str | Path) -> DraftLimits:
    """The trained block size and the longest draft llama.cpp will make with it.

    An anchor-first DSpark draft yields ``block_size`` tokens, otherwise ``block_size - 1``
    (``common/speculative.cpp``, ``n_draft_max``); longer requests are clamped by the engine.
    """
    g = read_gguf(draft)
    bs = g.get(Key.BLOCK_SIZE)
    if not bs:
        raise BenchError(f"{draft}: no dflash.block_size key: not a DSpark draft (run 'ggufdspark check')")
    anchor = g.get(Key.SAMPLE_FROM_ANCHOR)
    conf = g.get(Key.HAS_CONFIDENCE_HEAD)
    return DraftLimits(int(bs), int(bs) if anchor in (None, True) else int(bs) - 1, conf in (None, True))


# --------------------------------------------------------------------------- synthetic acceptance


@dataclass
class Synthetic:
    """llama.cpp's benchmarking acceptance: draft tokens are accepted at random, so only the speed
    means anything. ``rates`` are unconditional per-position probabilities (P[at least i+1 drafted
    tokens accepted]), non-increasing; ``length`` is a mean accept length, bonus token included."""

    length: float | None = None
    rates: list[float] | None = None

    def describe(self) -> str:
        if self.rates:
            return (f"synthetic acceptance, rates {','.join(f'{r:.4g}' for r in self.rates)} "
                    f"(mean length {1 + sum(self.rates):.2f})")
        return f"synthetic acceptance, mean length {self.length:g} (--spec-synth-len)"


def check_rates(rates: list[float], n_max: int, *, what: str = "--synthetic-rates") -> list[float]:
    """Validate per-position rates for a draft length: truncated to ``n_max`` values (the
    per-position acceptance stays fixed; llama.cpp wants exactly ``n_max`` values).

    Raises:
        BenchError: too few values, a value outside [0, 1], or an increase.
    """
    for i, r in enumerate(rates):
        if not (0.0 <= r <= 1.0) or math.isnan(r):
            raise BenchError(f"{what}: value {i} is {r}, expected a probability in [0, 1]")
        if i and r > rates[i - 1]:
            raise BenchError(f"{what}: value {i} ({r}) is larger than value {i - 1} ({rates[i - 1]}); "
                             "rates are P(at least i+1 accepted) and cannot increase")
    if len(rates) < n_max:
        raise BenchError(f"{what}: {len(rates)} values for draft length {n_max}; give at least {n_max}")
    return list(rates[:n_max])


# --------------------------------------------------------------------------- servers


def base_settings(engine: eng.EngineInfo, target: str | Path, *, decision: hardware.Decision,
                  mmproj: str | Path | None = None, parallel: int = 1, ctx_per_slot: int = 4096,
                  threads: int | None = None, extra_args: list[str] | None = None) -> ServerSettings:
    """The target-only server the arms share (offload and flash attention as ``serve`` decides);
    ``extra_args`` go to every arm's llama-server unchanged."""
    return ServerSettings(
        server=engine.path, model=target, mmproj=mmproj, spec_type=None, draft_n_min=None,
        n_gpu_layers=99 if decision.offload else None, flash_attn=decision.flash_attn,
        ctx_size=parallel * ctx_per_slot, parallel=parallel, threads=threads,
        extra_args=hardware.engine_workarounds(decision.backend, parallel) + list(extra_args or []))


def arm_settings(base: ServerSettings, draft: str | Path | None, *, n_max: int | None = None,
                 p_min: float | None = None, synthetic: Synthetic | None = None) -> ServerSettings:
    """``base`` with the DSpark draft (or without, for ``draft=None``)."""
    if draft is None:
        return dataclasses.replace(base, draft=None, spec_type=None, extra_args=list(base.extra_args))
    syn = synthetic or Synthetic()
    return dataclasses.replace(
        base, draft=draft, spec_type="draft-dspark", draft_n_max=n_max, draft_n_min=0, draft_p_min=p_min,
        n_gpu_layers_draft=99 if base.n_gpu_layers else None, synth_len=syn.length,
        synth_rates=syn.rates, extra_args=list(base.extra_args))


# Seen on this project's x86 build machine (AMX-capable Xeon, pinned engine, CPU backend): with two
# or more parallel requests llama-server dies with SIGSEGV inside ggml-cpu's AMX matmul
# (ggml_backend_amx_mul_mat, weights repacked at load). On a 320M-parameter pair with the DSpark
# draft about 2 starts in 3 crash on the first parallel batch; the target alone crashes more rarely;
# never with --no-repack, never with one request at a time.
SEGV_HINT = ("on CPUs with AMX the pinned engine's repacked-weight kernels have crashed under parallel "
             "batches; retry with --server-arg=--no-repack")


# How long a server whose request failed may take to exit before it counts as still running: a
# crashing engine that holds gigabytes can take seconds to go (core dump, unmapping the weights).
EXIT_WAIT_S = 30.0


@contextlib.contextmanager
def running(settings: ServerSettings, log_path: Path, start_timeout: float = 600.0,
            exit_wait: float = EXIT_WAIT_S) -> Iterator[Client]:
    """A started server's client; the server is stopped on exit, whatever happens.

    When a request fails (``EngineError``), the server process is waited on (up to ``exit_wait``
    seconds, or until ``/health`` answers) to tell a crash from a failed request.

    Raises:
        BenchError: the server died while in use (exit code or signal, log path), or a request
            failed while it kept running (the engine's error); never a bare ``EngineError``.
    """
    with ServerProcess(settings, log_path=log_path, start_timeout=start_timeout) as srv:
        try:
            yield srv.client()
        except EngineError as e:
            rc = await_exit(srv, exit_wait)
            if rc is None:
                raise BenchError(f"a request failed and llama-server kept running (log: {log_path}): {e}") from None
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            hint = f"; {SEGV_HINT}" if rc == -11 and settings.n_gpu_layers is None else ""
            raise BenchError(f"llama-server died during the measurement ({how}; log: {log_path}): {e}{hint}") from None


def await_exit(srv: ServerProcess, timeout: float) -> int | None:
    """Wait for the server to exit: its exit code (negative: the signal), or None when it answers
    ``/health`` or is still running after ``timeout`` seconds."""
    assert srv.proc is not None
    log.debug("a request failed: waiting up to %gs for llama-server (pid %d) to exit or answer /health",
              timeout, srv.proc.pid)
    deadline = time.monotonic() + timeout
    probe = srv.client(timeout=1.0)
    while True:
        try:
            return srv.proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            pass
        try:
            probe.health()
            return None  # alive and serving: the request failed on its own
        except EngineError:
            pass
        if time.monotonic() > deadline:
            return None


# --------------------------------------------------------------------------- requests


@dataclass
class Outcome:
    """One finished request: generated token ids, text, the engine's timings, wall time."""

    tokens: list[int]
    text: str
    timings: tm.RequestTimings
    wall_s: float


def request(client: Client, prompt: Any, n_predict: int, **extra: Any) -> Outcome:
    """One greedy ``/completion`` (prompt cache off), timed from send to full answer."""
    t0 = time.perf_counter()
    out = client.complete(prompt, n_predict=n_predict, **extra)
    wall = time.perf_counter() - t0
    return Outcome(list(out.tokens or []), out.text, out.timings, wall)


@dataclass
class LoadPoint:
    """Aggregate throughput with ``level`` requests in flight."""

    level: int
    requests: int
    tokens: int
    wall_s: float
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    decode_tps: float | None = None  # the engine's own decode speed, token-weighted

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def accept_length(self) -> float | None:
        return 1.0 + self.accepted / self.passes if self.passes else None

    def to_dict(self) -> dict:
        return {**asdict(self), "tps": self.tps, "accept_length": self.accept_length}


def measure_load(client: Client, prompts: list[Any], level: int, n_predict: int, *, rounds: int = ROUNDS,
                 progress: Callable[[str], None] | None = None, **extra: Any) -> LoadPoint:
    """``level`` threads, each sending ``rounds`` requests back to back (prompts cycled); tokens
    generated by all of them over the wall time from the first send to the last answer."""
    if not prompts:
        raise BenchError("no prompts to measure")
    jobs = [prompts[i % len(prompts)] for i in range(level * rounds)]
    lock = threading.Lock()
    outs: list[Outcome] = []

    def worker(k: int) -> None:
        for j in range(k, len(jobs), level):
            o = request(client, jobs[j], n_predict, **extra)
            with lock:
                outs.append(o)
            if progress:
                progress(f"{level} parallel")

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=level) as ex:
        for f in [ex.submit(worker, k) for k in range(level)]:
            f.result()
    wall = time.perf_counter() - t0
    s = tm.summarize([o.timings for o in outs])
    return LoadPoint(level, len(outs), s.predicted_n, wall, s.draft_n, s.draft_n_accepted, s.passes,
                     s.decode_tps.token_weighted)


# --------------------------------------------------------------------------- rendering


def render(client: Client, messages: list[dict], media_marker: str | None) -> tuple[Any, int | None]:
    """Prompt for ``/completion`` and its token count: token ids for text-only conversations
    (chat template, then ``/tokenize`` with BOS, as the chat endpoint does), or a multimodal prompt
    object (``prompt_string`` with media markers + base64 images) that every arm receives alike."""
    images: list[str] = []
    flat = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            text = ""
            for p in c:
                if p["type"] == "image":
                    if not media_marker:
                        raise BenchError("an image prompt needs a server started with --mmproj")
                    images.append(image_b64(p["path"]))
                    text += media_marker + "\n"
                else:
                    text += p["text"]
            c = text
        flat.append({"role": m["role"], "content": c})
    rendered = client.apply_template(flat)
    if images:
        return {"prompt_string": rendered, "multimodal_data": images}, None
    toks = client.tokenize(rendered, add_special=True)
    return toks, len(toks)


@dataclass
class Turn:
    """One request of the run: an item's user turn, rendered once, sent to every arm."""

    item: str
    category: str
    turn: int
    prompt: Any = field(repr=False)
    n_prompt: int | None


def run_first_arm(client: Client, items: list[pr.PromptItem], n_predict: int, media_marker: str | None,
                  tick: Callable[[str], None]) -> tuple[list[Turn], list[Outcome]]:
    """Run the items turn by turn on the first (plain) server, fixing every turn's prompt."""
    turns: list[Turn] = []
    outs: list[Outcome] = []
    for it in items:
        history: list[dict] = []
        k = 0
        msgs = it.messages
        for i, m in enumerate(msgs):
            history.append(m)
            if m["role"] != "user":
                continue
            prompt, n_prompt = render(client, history, media_marker)
            o = request(client, prompt, n_predict)
            turns.append(Turn(it.id, it.category, k, prompt, n_prompt))
            outs.append(o)
            tick(f"{it.id} turn {k + 1}")
            k += 1
            nxt = msgs[i + 1] if i + 1 < len(msgs) else None
            if nxt is not None and nxt["role"] != "assistant":
                history.append({"role": "assistant", "content": o.text})
    return turns, outs


# --------------------------------------------------------------------------- the gate


@dataclass
class Divergence:
    """Where a speculative output first left the plain one, and how that was judged."""

    item: str
    category: str
    turn: int
    position: int
    plain_token: int | None
    spec_token: int | None
    plain_piece: str | None
    spec_piece: str | None
    p_top1: float | None
    p_top2: float | None
    top2_token: int | None
    kind: str  # "near-tie" | "defect"
    reason: str

    @property
    def gap(self) -> float | None:
        return None if self.p_top1 is None or self.p_top2 is None else self.p_top1 - self.p_top2

    def describe(self) -> str:
        probs = (f"plain top-2 p={self.p_top1:.4f} / {self.p_top2:.4f} (gap {self.gap:.4f})"
                 if self.gap is not None else "no plain probabilities")
        return (f"item {self.item!r} turn {self.turn + 1}, position {self.position}: plain "
                f"{self.plain_token} {self.plain_piece!r}, speculative {self.spec_token} {self.spec_piece!r}; "
                f"{probs}: {self.kind} ({self.reason})")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (a length difference counts)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(turn: Turn, plain: list[int], spec: list[int], top: list[dict] | None, *,
             near_tie_gap: float = NEAR_TIE_GAP) -> Divergence | None:
    """Judge one request. ``top``: the plain run's ``top_logprobs`` at the first differing position
    (``[{"id", "token", "logprob"}, ...]``, best first). None when the outputs are identical."""
    i = first_difference(plain, spec)
    if i is None:
        return None
    pt = plain[i] if i < len(plain) else None
    st = spec[i] if i < len(spec) else None
    p1 = p2 = t2 = None
    pieces = {}
    if top:
        pieces = {c.get("id"): c.get("token") for c in top}
        p1 = math.exp(top[0]["logprob"])
        if len(top) > 1:
            p2, t2 = math.exp(top[1]["logprob"]), top[1].get("id")
    d = Divergence(turn.item, turn.category, turn.turn, i, pt, st, pieces.get(pt), pieces.get(st), p1, p2, t2,
                   "defect", "")
    if p1 is None or p2 is None:
        d.reason = "the plain run's top-2 probabilities at this position are unavailable"
    elif d.gap >= near_tie_gap:
        d.reason = f"gap {d.gap:.4f} >= near-tie threshold {near_tie_gap}"
    elif st is not None and st != t2 and st != top[0].get("id"):
        d.reason = "the speculative token is not among the plain run's top-2"
    else:
        d.kind, d.reason = "near-tie", f"gap {d.gap:.4f} < {near_tie_gap}"
    return d


@dataclass
class GateResult:
    """``status``: pass, fail, refused (synthetic acceptance) or off (--no-gate)."""

    status: str
    reason: str = ""
    requests: int = 0
    exact: int = 0
    near_ties: int = 0
    defects: int = 0
    near_tie_gap: float = NEAR_TIE_GAP
    divergences: list[Divergence] = field(default_factory=list)
    plain_unstable: int = 0  # requests whose two plain runs differed (engine nondeterminism)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["divergences"] = [{**asdict(x), "gap": x.gap} for x in self.divergences]
        return d


def run_gate(client: Client, turns: list[Turn], plain: list[Outcome], spec: list[Outcome],
             plain_again: list[Outcome], *, near_tie_gap: float = NEAR_TIE_GAP) -> GateResult:
    """Compare speculative and plain outputs; probe the plain server at each first difference."""
    g = GateResult("pass", requests=len(turns), near_tie_gap=near_tie_gap)
    for t, p, s, p2 in zip(turns, plain, spec, plain_again):
        if p.tokens != p2.tokens:
            g.plain_unstable += 1
        i = first_difference(p.tokens, s.tokens)
        if i is None:
            g.exact += 1
            continue
        probe = client.complete(t.prompt, n_predict=i + 1, n_probs=2)
        probs = probe.probs or []
        top = probs[i].get("top_logprobs") if i < len(probs) else None
        d = classify(t, p.tokens, s.tokens, top, near_tie_gap=near_tie_gap)
        assert d is not None
        g.divergences.append(d)
        if d.kind == "near-tie":
            g.near_ties += 1
        else:
            g.defects += 1
    if g.defects:
        g.status = "fail"
    return g


# --------------------------------------------------------------------------- informational reference


def reference_run(hf_dir: str | Path, turns: list[Turn], plain: list[Outcome], n_predict: int) -> dict:
    """Greedy outputs of the target's HF checkpoint under transformers on CPU (float32), compared
    with the plain llama.cpp outputs. Informational only: two runtimes round differently, so
    near-ties may break differently; nothing here fails the run."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise BenchError(f"--reference-hf needs torch and transformers ({e.name} is missing)") from None
    p = Path(hf_dir)
    if not (p / "config.json").is_file():
        raise InputNotFoundError(f"{p}: no config.json: not a Hugging Face checkpoint directory")
    model = AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    rows = []
    for t, o in zip(turns, plain):
        if not isinstance(t.prompt, list):
            rows.append({"item": t.item, "turn": t.turn, "status": "skipped (image prompt)"})
            continue
        with torch.no_grad():
            ids = torch.tensor([t.prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_predict,
                                 do_sample=False, pad_token_id=next(iter(eos_ids), 0))
        ref = [int(x) for x in out[0, len(t.prompt):]]
        while ref and ref[-1] in eos_ids:
            ref.pop()
        mine = [x for x in o.tokens]
        while mine and mine[-1] in eos_ids:
            mine.pop()
        i = first_difference(ref, mine)
        rows.append({"item": t.item, "turn": t.turn, "status": "exact" if i is None else "differs",
                     "position": i, "reference_tokens": len(ref)})
    exact = sum(r["status"] == "exact" for r in rows)
    differs = sum(r["status"] == "differs" for r in rows)
    return {"runtime": f"transformers {__import__('transformers').__version__} CPU float32", "checkpoint": str(p),
            "exact": exact, "differs": differs, "rows": rows,
            "note": "informational: differences between runtimes never fail the run"}


# --------------------------------------------------------------------------- report


@dataclass
class GroupStats:
    """One category (or all of them): both arms' throughput and the draft's acceptance."""

    name: str
    requests: int
    plain_tokens: int
    spec_tokens: int
    plain_decode_tps: float | None
    spec_decode_tps: float | None
    plain_e2e_tps: float | None
    spec_e2e_tps: float | None
    accept_length_request_mean: float | None
    accept_length_token_weighted: float | None
    acceptance_rate: float | None
    # prefill (prompt processing, image encoding included): DSpark does not change it
    prompt_tokens_mean: float | None = None
    plain_prefill_ms: float | None = None
    spec_prefill_ms: float | None = None

    @property
    def decode_speedup(self) -> float | None:
        return _div(self.spec_decode_tps, self.plain_decode_tps)

    @property
    def e2e_speedup(self) -> float | None:
        return _div(self.spec_e2e_tps, self.plain_e2e_tps)

    def to_dict(self) -> dict:
        return {**asdict(self), "decode_speedup": self.decode_speedup, "e2e_speedup": self.e2e_speedup}


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _decode_tps(outs: list[Outcome]) -> float | None:
    return tm.summarize([o.timings for o in outs]).decode_tps.token_weighted


def _e2e_tps(outs: list[Outcome]) -> float | None:
    wall = sum(o.wall_s for o in outs)
    return sum(o.timings.predicted_n or 0 for o in outs) / wall if wall else None


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def group_stats(name: str, plain: list[Outcome], plain_again: list[Outcome], spec: list[Outcome]) -> GroupStats:
    """Plain throughput pools both plain runs (the bracket); tokens are counted once. Prefill is
    reported apart (mean ms per request): it includes the vision encoder and is not drafted."""
    s = tm.summarize([o.timings for o in spec])
    both = plain + plain_again
    return GroupStats(name, len(spec), sum(o.timings.predicted_n or 0 for o in plain),
                      s.predicted_n, _decode_tps(both), _decode_tps(spec), _e2e_tps(both), _e2e_tps(spec),
                      s.accept_length.request_mean, s.accept_length.token_weighted,
                      s.acceptance_rate.token_weighted,
                      _mean([o.timings.prompt_n for o in spec]),
                      _mean([o.timings.prompt_ms for o in both]), _mean([o.timings.prompt_ms for o in spec]))


def accept_histogram(per_pos: list[int] | None, passes: int | None) -> list[int]:
    """Verify passes by accept length: entry k counts passes that emitted k+1 tokens (k drafted
    tokens accepted), from the per-position counters (``per_pos[i]``: passes accepting > i)."""
    if not per_pos or not passes:
        return []
    cum = [passes] + list(per_pos) + [0]
    return [max(0, cum[k] - cum[k + 1]) for k in range(len(per_pos) + 1)]


@dataclass
class BenchReport:
    settings: dict
    synthetic: str | None
    groups: list[GroupStats]
    overall: GroupStats
    drift: dict
    load: list[dict]
    gate: GateResult
    acceptance: dict
    reference: dict | None = None
    logs: dict = field(default_factory=dict)
    requests: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"settings": self.settings, "synthetic": self.synthetic,
                "groups": [g.to_dict() for g in self.groups], "overall": self.overall.to_dict(),
                "drift": self.drift, "load": self.load, "gate": self.gate.to_dict(),
                "acceptance": self.acceptance, "reference": self.reference, "logs": self.logs,
                "requests": self.requests}

    def raise_for_gate(self) -> None:
        """Raise LosslessGateError naming the first defect (item, position, tokens, probabilities)."""
        bad = [d for d in self.gate.divergences if d.kind == "defect"]
        if bad:
            more = f" (and {len(bad) - 1} more defects)" if len(bad) > 1 else ""
            raise LosslessGateError(f"lossless gate failed: {bad[0].describe()}{more}")

    def text(self) -> str:
        return format_report(self)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_report(r: BenchReport) -> str:
    """The text table: per category and overall, drift, the concurrency curve, the gate."""
    s = r.settings
    pmin = "" if s.get("p_min") is None else f", p_min {s['p_min']}"
    lines = [f"ggufdspark bench: {Path(s['target']).name} + {Path(s['draft']).name} "
             f"({s['backend']}, engine {s['engine']})",
             f"draft length {s['draft_n_max']}{pmin}; "
             f"n_predict {s['n_predict']}; {s['items']} items, {s['requests']} requests; prompts: {s['prompts']}"]
    if r.synthetic:
        lines.append(f"SYNTHETIC SPEED: {r.synthetic}; the output is not valid, only the speed")
    head = (f"{'category':<18} {'req':>4} {'tokens':>7} {'plain t/s':>10} {'spec t/s':>9} {'decode':>7} "
            f"{'e2e':>6} {'accept len req/tok':>19} {'acc rate':>8}")
    lines += ["", head, "-" * len(head)]
    for g in r.groups + [r.overall]:
        if g is r.overall:
            lines.append("-" * len(head))
        al = f"{_f(g.accept_length_request_mean, '{:.2f}')}/{_f(g.accept_length_token_weighted, '{:.2f}')}"
        lines.append(f"{g.name:<18} {g.requests:>4} {g.spec_tokens:>7} {_f(g.plain_decode_tps):>10} "
                     f"{_f(g.spec_decode_tps):>9} {_f(g.decode_speedup, '{:.2f}x'):>7} "
                     f"{_f(g.e2e_speedup, '{:.2f}x'):>6} {al:>19} {_f(g.acceptance_rate, '{:.2f}'):>8}")
    lines += ["", "prefill (prompt and images; the draft does not change it): mean per request",
              f"{'category':<18} {'prompt tok':>10} {'plain ms':>9} {'spec ms':>8}"]
    for g in r.groups + [r.overall]:
        lines.append(f"{g.name:<18} {_f(g.prompt_tokens_mean, '{:.0f}'):>10} {_f(g.plain_prefill_ms):>9} "
                     f"{_f(g.spec_prefill_ms):>8}")
    d = r.drift
    lines += ["", f"plain drift: {_f(d.get('before_tps'))} tok/s before, {_f(d.get('after_tps'))} after "
                  f"({_f(d.get('change'), '{:+.1%}')})"]
    a = r.acceptance
    if a.get("accept_length") is not None:
        lines.append(f"accept length (verify passes, /metrics): {a['accept_length']:.2f} over {a['passes']} passes; "
                     "per position " + " ".join(f"{x:.2f}" for x in a.get("rates") or []))
    if r.load:
        lines += ["", f"{'parallel':>8} {'plain t/s':>10} {'spec t/s':>9} {'ratio':>6} {'accept len':>10}"]
        for p in r.load:
            lines.append(f"{p['level']:>8} {_f(p['plain_tps']):>10} {_f(p['spec_tps']):>9} "
                         f"{_f(p['ratio'], '{:.2f}x'):>6} {_f(p.get('spec_accept_length'), '{:.2f}'):>10}")
    g = r.gate
    lines.append("")
    if g.status in ("pass", "fail"):
        lines.append(f"lossless gate: {g.status.upper()}: {g.requests} requests: {g.exact} exact, "
                     f"{g.near_ties} near-tie divergences, {g.defects} defects "
                     f"(near-tie: plain top-2 gap < {g.near_tie_gap})")
        for dv in g.divergences:
            lines.append(f"  {dv.kind.upper()}: {dv.describe()}")
        if g.plain_unstable:
            lines.append(f"  note: {g.plain_unstable} requests differed between the two plain runs")
    else:
        lines.append(f"lossless gate: {g.status.upper()}: {g.reason}")
    if r.reference:
        ref = r.reference
        lines.append(f"reference ({ref['runtime']}, informational): {ref['exact']} exact, {ref['differs']} differ "
                     "from plain llama.cpp")
    return "\n".join(lines)


def plot_report(r: BenchReport, path: str | Path) -> Path:
    """PNG: decode speedup by category, throughput ratio vs concurrency, accept-length histogram."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("--plot needs matplotlib: pip install 'ggufdspark[plot]'") from None
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    groups = r.groups + [r.overall]
    ax[0].bar([g.name for g in groups], [g.decode_speedup or 0 for g in groups], color="steelblue")
    ax[0].axhline(1.0, color="gray", lw=1, ls="--")
    ax[0].set_title("decode speedup by category")
    ax[0].tick_params(axis="x", rotation=35)
    if r.load:
        ax[1].plot([p["level"] for p in r.load], [p["ratio"] or 0 for p in r.load], "o-")
        ax[1].set_xscale("log", base=2)
    ax[1].axhline(1.0, color="gray", lw=1, ls="--")
    ax[1].set_title("speculative / plain throughput vs parallel requests")
    ax[1].set_xlabel("parallel requests")
    hist = r.acceptance.get("histogram") or []
    ax[2].bar(range(1, len(hist) + 1), hist, color="darkorange")
    ax[2].set_title("accept length per verify pass")
    ax[2].set_xlabel("tokens emitted per pass")
    if r.synthetic:
        fig.suptitle("SYNTHETIC acceptance: speed only")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# --------------------------------------------------------------------------- the run


def _levels(concurrency: list[int] | None, backend: str) -> list[int]:
    lv = sorted(set(concurrency or CONCURRENCY_DEFAULTS.get(backend, OTHER_CONCURRENCY)))
    if lv and lv[0] < 1:
        raise BenchError(f"--concurrency: {lv[0]} is not a number of parallel requests (>= 1)")
    return lv


def prepare(target: str | Path, draft: str | Path, *, mmproj: str | Path | None = None,
            server: str | Path | None = None) -> tuple[eng.EngineInfo, Any, hardware.Decision, DraftLimits]:
    """Check inputs, the pair and the engine; detect devices. Shared by bench and tune.

    Raises:
        InputNotFoundError, CorruptFileError, PairMismatchError, EngineError.
    """
    for label, p in (("target", target), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    check_pair(target, draft, mmproj).raise_for_failures()
    info = eng.find_engine(server)
    eng.require_dspark(info)
    devices = hardware.detect(info)
    prof = profiles.load_profile(devices, target, draft)
    decision = hardware.decide(devices, profile=prof)
    return info, devices, decision, draft_limits(draft)


@dataclass
class Arms:
    """Raw results of the three arms (plain, speculative, plain again) over the same turns."""

    turns: list[Turn]
    plain: list[Outcome]
    spec: list[Outcome]
    plain_again: list[Outcome]
    load_plain: dict[int, LoadPoint]
    load_spec: dict[int, LoadPoint]
    load_plain_again: dict[int, LoadPoint]
    spec_counters: tm.RequestTimings  # /metrics delta over the speculative arm's one-at-a-time pass
    gate: GateResult


def _synthetic(synthetic_len: float | None, synthetic_rates: list[float] | None, gate: bool | None,
               n_max: int) -> Synthetic | None:
    """Validate the synthetic-acceptance options (refusing the gate with them)."""
    if synthetic_len is None and not synthetic_rates:
        return None
    if synthetic_len is not None and synthetic_rates:
        raise BenchError("--synthetic-accept and --synthetic-rates are mutually exclusive")
    syn = Synthetic(synthetic_len, list(synthetic_rates) if synthetic_rates else None)
    if gate:
        raise BenchError(f"the lossless gate is refused with {syn.describe()}: the engine accepts draft tokens "
                         "at random in that mode, so the output is not valid; drop --gate, or drop the "
                         "synthetic flags to check the output")
    if syn.rates:
        syn.rates = check_rates(syn.rates, n_max)
    if syn.length is not None and not 1.0 <= syn.length <= n_max + 1:
        raise BenchError(f"--synthetic-accept {syn.length}: expected a mean length in [1, {n_max + 1}] "
                         f"for draft length {n_max}")
    return syn


def measure_arms(plain_settings: ServerSettings, spec_settings: ServerSettings, items: list[pr.PromptItem], *,
                 n_predict: int, levels: list[int], logs: Path, gate: str, near_tie_gap: float = NEAR_TIE_GAP,
                 media: bool = False, progress: Progress | None = None) -> Arms:
    """Run plain / speculative / plain over the items, then the gate on the last plain server.

    ``gate``: "run", or the status to record without running it ("refused: why", "off: why").
    """
    n_turns = sum(it.n_turns for it in items)
    total = 3 * (n_turns + sum(lv * ROUNDS for lv in levels))
    done = [0]

    def tick(what: str) -> None:
        done[0] += 1
        if progress:
            progress(min(done[0], total), total, what)

    def sequential(client: Client, turns: list[Turn], label: str) -> list[Outcome]:
        outs = []
        for t in turns:
            outs.append(request(client, t.prompt, n_predict))
            tick(f"{label}: {t.item} turn {t.turn + 1}")
        return outs

    def load_curve(client: Client, turns: list[Turn], label: str) -> dict[int, LoadPoint]:
        prompts_ = [t.prompt for t in turns]
        return {lv: measure_load(client, prompts_, lv, n_predict, progress=lambda w: tick(f"{label}: {w}"))
                for lv in levels}

    log.info("arm 1/3: target alone (%s)", logs / "plain-1.log")
    with running(plain_settings, logs / "plain-1.log") as c:
        marker = _media_marker(c) if media else None
        _warm(c)
        turns, plain1 = run_first_arm(c, items, n_predict, marker, lambda w: tick(f"plain: {w}"))
        load1 = load_curve(c, turns, "plain")
    log.info("arm 2/3: target + draft, n_max %s (%s)", spec_settings.draft_n_max, logs / "spec.log")
    with running(spec_settings, logs / "spec.log") as c:
        here = _for_server(turns, marker, _media_marker(c) if media else None)
        _warm(c)
        m0 = c.metrics()
        spec = sequential(c, here, "spec")
        counters = tm.metrics_delta(m0, c.metrics())
        load_s = load_curve(c, here, "spec")
    log.info("arm 3/3: target alone again (%s)", logs / "plain-2.log")
    with running(plain_settings, logs / "plain-2.log") as c:
        here = _for_server(turns, marker, _media_marker(c) if media else None)
        _warm(c)
        plain2 = sequential(c, here, "plain again")
        load2 = load_curve(c, here, "plain again")
        if gate == "run":
            g = run_gate(c, here, plain1, spec, plain2, near_tie_gap=near_tie_gap)
        else:
            status, _, why = gate.partition(": ")
            g = GateResult(status, why, requests=len(turns), near_tie_gap=near_tie_gap)
    return Arms(turns, plain1, spec, plain2, load1, load_s, load2, counters, g)


def _media_marker(client: Client) -> str | None:
    return json.loads(client.get_text("/props")).get("media_marker")


def _for_server(turns: list[Turn], old: str | None, new: str | None) -> list[Turn]:
    """The turns with image prompts re-addressed to another server: llama-server picks a random
    media marker per process (``LLAMA_MEDIA_MARKER`` unset), so the marker rendered into the
    first server's prompt text is swapped for this server's. Text and images are unchanged."""
    if not old or not new or old == new:
        return turns
    out = []
    for t in turns:
        p = t.prompt
        if isinstance(p, dict):
            p = {**p, "prompt_string": p["prompt_string"].replace(old, new)}
        out.append(dataclasses.replace(t, prompt=p))
    return out


def summarize_arms(a: Arms) -> tuple[list[GroupStats], GroupStats, dict, list[dict], dict]:
    """Per-category and overall stats, plain drift, the concurrency curve, acceptance figures."""
    groups = []
    for cat in dict.fromkeys(t.category for t in a.turns):
        idx = [i for i, t in enumerate(a.turns) if t.category == cat]
        groups.append(group_stats(pr.CATEGORIES.get(cat, cat), [a.plain[i] for i in idx],
                                  [a.plain_again[i] for i in idx], [a.spec[i] for i in idx]))
    overall = group_stats("overall", a.plain, a.plain_again, a.spec)
    before, after = _decode_tps(a.plain), _decode_tps(a.plain_again)
    drift = {"before_tps": before, "after_tps": after, "change": after / before - 1 if before and after else None}
    load = []
    for lv, sp in a.load_spec.items():
        p1, p2 = a.load_plain[lv], a.load_plain_again[lv]
        pt = (p1.tokens + p2.tokens) / ((p1.wall_s + p2.wall_s) or 1)
        load.append({"level": lv, "plain_tps": pt, "spec_tps": sp.tps, "ratio": _div(sp.tps, pt),
                     "plain_before_tps": p1.tps, "plain_after_tps": p2.tps,
                     "spec_accept_length": sp.accept_length, "requests": sp.requests})
    d = a.spec_counters
    acceptance = {"accept_length": d.accept_length, "passes": d.passes, "drafted": d.draft_n,
                  "accepted": d.draft_n_accepted, "rates": d.accept_rate_per_pos, "per_position": d.accepted_per_pos,
                  "histogram": accept_histogram(d.accepted_per_pos, d.passes),
                  "source": "/metrics counters of the speculative arm, one request at a time"}
    return groups, overall, drift, load, acceptance


def run_bench(target: str | Path, draft: str | Path, *, mmproj: str | Path | None = None,
              prompts: str | Path | None = None, categories: list[str] | None = None, limit: int | None = None,
              n_predict: int = DEFAULT_N_PREDICT, draft_n_max: int | None = None, p_min: float | None = None,
              concurrency: list[int] | None = None, synthetic_len: float | None = None,
              synthetic_rates: list[float] | None = None, gate: bool | None = None,
              near_tie_gap: float = NEAR_TIE_GAP, reference_hf: str | Path | None = None,
              server: str | Path | None = None, threads: int | None = None, ctx_per_slot: int | None = None,
              server_args: list[str] | None = None, log_dir: str | Path | None = None,
              progress: Progress | None = None) -> BenchReport:
    """Measure plain vs speculative decoding and run the lossless gate.

    Args:
        gate: None runs the gate unless acceptance is synthetic; True insists (refused with
            synthetic acceptance); False skips it.
        concurrency: parallel-request levels for the throughput curve (default per backend).
        server_args: extra llama-server arguments for every arm.

    Returns:
        A BenchReport; call ``raise_for_gate()`` to turn defects into an error.

    Raises:
        BenchError: bad options or prompt file, the gate requested with synthetic acceptance, or
            a server that died during the run.
        InputNotFoundError, PairMismatchError, EngineError: files, pair or engine unusable.
    """
    if n_predict < 1:
        raise BenchError(f"--n-predict {n_predict}: expected at least 1")
    if gate and (synthetic_len is not None or synthetic_rates):
        _synthetic(synthetic_len, synthetic_rates, gate, 1)  # refuse before anything is loaded
    info, devices, decision, limits = prepare(target, draft, mmproj=mmproj, server=server)
    n_max = draft_n_max or decision.draft_n_max or limits.max_n
    if n_max > limits.max_n:
        raise BenchError(f"draft length {n_max} exceeds what {Path(draft).name} can draft ({limits.max_n}, "
                         f"block size {limits.block_size})")
    if p_min and not limits.confidence_head:
        raise BenchError(f"{draft}: has no confidence head, so --p-min must be 0 (got {p_min})")
    synthetic = _synthetic(synthetic_len, synthetic_rates, gate, n_max)
    levels = _levels(concurrency, decision.backend)
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="ggufdspark-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    pset = pr.prompt_set(prompts, mmproj=mmproj, image_dir=logs / "images", categories=categories, limit=limit)
    per_slot = ctx_per_slot or 2048 + n_predict * max(it.n_turns for it in pset.items)
    base = base_settings(info, target, decision=decision, mmproj=mmproj, parallel=max(levels),
                         ctx_per_slot=per_slot, threads=threads, extra_args=server_args)
    spec_settings = arm_settings(base, draft, n_max=n_max, p_min=p_min, synthetic=synthetic)
    plain_settings = arm_settings(base, None)
    gate_mode = ("refused: " + f"{synthetic.describe()}: the output is not valid in that mode" if synthetic
                 else "off: --no-gate given" if gate is False else "run")
    arms = measure_arms(plain_settings, spec_settings, pset.items, n_predict=n_predict, levels=levels, logs=logs,
                        gate=gate_mode, near_tie_gap=near_tie_gap, media=bool(mmproj), progress=progress)
    reference = reference_run(reference_hf, arms.turns, arms.plain, n_predict) if reference_hf else None
    groups, overall, drift, load, acceptance = summarize_arms(arms)
    settings = {"target": str(target), "draft": str(draft), "mmproj": str(mmproj) if mmproj else None,
                "engine": f"{info.commit or info.version} ({info.path})", "backend": decision.backend,
                "devices": decision.devices, "draft_n_max": n_max, "block_size": limits.block_size,
                "draft_n_max_source": "--draft-n-max" if draft_n_max else "; ".join(decision.reasons),
                "p_min": p_min, "n_predict": n_predict, "concurrency": levels, "items": len(pset.items),
                "requests": len(arms.turns), "prompts": pset.source, "images": pset.images,
                "synthetic": asdict(synthetic) if synthetic else None, "greedy": True,
                "spec_command": spec_settings.redacted(), "plain_command": plain_settings.redacted()}
    rows = [{"item": t.item, "category": t.category, "turn": t.turn, "prompt_tokens": t.n_prompt,
             "plain": _row(p1), "spec": _row(s), "plain_again": _row(p2)}
            for t, p1, s, p2 in zip(arms.turns, arms.plain, arms.spec, arms.plain_again)]
    return BenchReport(settings, synthetic.describe() if synthetic else None, groups, overall, drift, load,
                       arms.gate, acceptance, reference,
                       {k: str(logs / f"{k}.log") for k in ("plain-1", "spec", "plain-2")}, rows)


def _row(o: Outcome) -> dict:
    t = o.timings
    return {"tokens": len(o.tokens), "decode_tps": t.decode_tps, "wall_s": o.wall_s, "draft_n": t.draft_n,
            "draft_n_accepted": t.draft_n_accepted, "accept_length": t.accept_length}


def _warm(client: Client) -> None:
    """One short request: first-use allocations and kernel selection stay out of the measurements."""
    try:
        client.complete(client.tokenize("Warm up the engine.", add_special=True), n_predict=WARMUP_TOKENS)
    except EngineError as e:
        raise BenchError(f"the warm-up request failed: {e}") from None
