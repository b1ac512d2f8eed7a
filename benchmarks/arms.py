"""What quant_speed.py and family_speed.py share: an arm is one llama-server start (the pinned server
ignores per-request draft settings), warmed up, then one request at a time (median of the trials,
the engine's decode tok/s) and N requests at once (aggregate tok/s over the wall time,
``ggufdspark.measure.measure_load``); and the lossless check, a drafted server with real acceptance
against the plain server's greedy tokens.

The synthetic acceptance is the published drafter's profile: mean accept length 4.22 spread over the
draft's longest draft (its block size for an anchor-first draft: 9 for the published shape) as
llama.cpp's geometric rates, truncated for a shorter draft, never rescaled per length (as
dspark_speed.py does).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark import engine, launch
from ggufdspark import measure as ms
from ggufdspark.acceptance import geometric_rates
from ggufdspark.gate import first_difference, top_logprobs_by_position
from ggufdspark.runners.server import ServerSettings

PROMPT = ("Describe in detail how speculative decoding works with a small draft model and a large "
          "target model, what acceptance length means, and why the output is unchanged.")
PUBLISHED_ACCEPT_LEN = 4.22  # the published VL-3B drafter, request mean (shared/DESIGN.md)
CTX_MARGIN = 256  # per slot, beyond the generated tokens: the prompt and a draft block
TRIAL_SEED = 1  # the server seeds a request's synthetic acceptance draws from its seed


def published_rates(draft: str | Path, accept_len: float = PUBLISHED_ACCEPT_LEN) -> list[float]:
    """Per-position rates at ``accept_len`` over the draft's longest draft (``draft_limits``)."""
    return geometric_rates(accept_len, ms.draft_limits(draft).max_n)


def base_settings(server: str | Path, target: str | Path, *, gpu: bool, parallel: int, n_predict: int,
                  threads: int | None = None, quantized: bool = False) -> ServerSettings:
    """The plain server every arm of one target shares, through ``ggufdspark.launch`` as ``serve``
    builds its own: the table's CUDA row under ``gpu`` (everything offloaded, flash attention on),
    the CPU row otherwise, the engine's workarounds for this build, ``n_predict + CTX_MARGIN``
    tokens a slot. ``quantized``: a quantized draft will be added (it counts for the workarounds)."""
    info = engine.find_engine(server)
    decision = launch.table_decision("cuda" if gpu else "cpu")
    ctx = launch.context(parallel, model=target, ctx_per_slot=n_predict + CTX_MARGIN)
    return launch.server_settings(decision, info, model=target, ctx=ctx, parallel=parallel, threads=threads,
                                  metrics=False, quantized=quantized or None)


def drafted(base: ServerSettings, draft: str | Path, n_max: int, rates: list[float] | None) -> ServerSettings:
    """``base`` with the draft at length ``n_max``: synthetic acceptance at ``rates`` (truncated to
    ``n_max``), or real acceptance for ``rates=None``."""
    syn = ms.Synthetic(rates=list(rates[:n_max])) if rates else None
    return ms.arm_settings(base, draft, n_max=n_max, synthetic=syn)


@dataclass
class Arm:
    """One server's numbers. ``tps``: median decode tok/s of single requests; ``load``: level ->
    ``LoadPoint.to_dict()`` (``tps`` there is the aggregate over the wall time)."""

    name: str
    cmd: str
    tps: float | None = None
    runs: list[float] = field(default_factory=list)
    accept_length: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0
    load: dict[int, dict] = field(default_factory=dict)
    reference: dict | None = None  # greedy tokens (and top-2 probabilities) for the lossless check

    def to_dict(self) -> dict:
        return asdict(self)


def measure_arm(name: str, settings: ServerSettings, log_dir: Path, *, levels: list[int], n_predict: int,
                trials: int, reference_tokens: int = 0) -> Arm:
    """Start the server, warm up, measure every level; with ``reference_tokens`` also keep a greedy
    answer of that length with its top-2 probabilities (the plain side of the lossless check)."""
    arm = Arm(name, " ".join(settings.redacted()))
    with ms.running(settings, log_dir / f"{name}.log") as c:
        prompt = c.tokenize(PROMPT)
        ms.warm(c)
        if 1 in levels:
            # trial i seeds the synthetic acceptance draws with TRIAL_SEED + i: the same luck in every arm
            outs = [ms.request(c, prompt, n_predict, ignore_eos=True, seed=TRIAL_SEED + i) for i in range(trials)]
            arm.runs = [o.timings.decode_tps for o in outs]
            arm.tps = statistics.median(arm.runs)
            lengths = [o.timings.accept_length for o in outs if o.timings.accept_length]
            arm.accept_length = statistics.median(lengths) if lengths else None
            arm.draft_n = sum(o.timings.draft_n or 0 for o in outs)
            arm.draft_n_accepted = sum(o.timings.draft_n_accepted or 0 for o in outs)
        for n in (x for x in levels if x > 1):
            arm.load[n] = ms.measure_load(c, [prompt], n, n_predict, ignore_eos=True).to_dict()
        if reference_tokens:
            ref = c.complete(prompt, n_predict=reference_tokens, n_probs=2, ignore_eos=True)
            toks = list(ref.tokens or [])
            by_pos = top_logprobs_by_position(toks, ref.probs or [])
            arm.reference = {"tokens": toks,
                             "top2": [[t.get("logprob") for t in by_pos.get(i, [])[:2]] for i in range(len(toks))]}
    return arm


def lossless(name: str, settings: ServerSettings, log_dir: Path, reference: dict) -> dict:
    """Greedy output of a drafted server with real acceptance against ``reference`` (the same
    target's plain answer, from ``measure_arm``): ``equal``, or where it first differs, with the
    plain run's top-2 log-probabilities there (a small gap points to a near-tie, not a defect)."""
    ref = reference["tokens"]
    with ms.running(settings, log_dir / f"{name}.log") as c:
        out = c.complete(c.tokenize(PROMPT), n_predict=len(ref), ignore_eos=True)
    mine = list(out.tokens or [])
    i = first_difference(ref, mine)
    res = {"tokens": len(ref), "equal": i is None, "differs_at": i, "draft_n": out.timings.draft_n or 0,
           "draft_n_accepted": out.timings.draft_n_accepted or 0, "cmd": " ".join(settings.redacted())}
    if i is None:
        res["verdict"] = f"equal ({len(ref)} tokens)"
    else:
        top2 = reference["top2"][i] if i < len(reference["top2"]) else []
        res["plain_top2_logprobs"] = top2
        gap = f", plain top-2 logprobs {top2[0]:.3f} / {top2[1]:.3f}" if len(top2) == 2 else ""
        res["verdict"] = f"differs at token {i}{gap}"
    return res


def levels(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]`` (sorted, without repeats); refuses a level below 1."""
    out = sorted({int(x) for x in text.split(",") if x.strip()})
    if not out or out[0] < 1:
        raise SystemExit(f"--concurrency {text!r}: expected numbers of parallel requests >= 1, comma-separated")
    return out
