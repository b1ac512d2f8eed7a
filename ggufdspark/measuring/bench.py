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

import dataclasses
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from ggufdspark import engine as eng
from ggufdspark import launch
from ggufdspark import timings as tm
from ggufdspark.errors import BenchOptionError, InvalidArgumentError
from ggufdspark.hardware import Decision
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring.gate import (NEAR_TIE_GAP, GateResult, check_reference, first_difference, reference_run,
                                       run_gate)
from ggufdspark.measuring.measure import (DEFAULT_N_PREDICT, EXIT_WAIT_S, ROUNDS, LoadPoint, Outcome, Progress,
                                          Synthetic, Turn, arm_settings, base_settings, check_p_min, check_rates,
                                          check_threads, concurrency_levels, kept_logs, log_directory, measure_load,
                                          prepare, request, run_first_arm, running, warm)
from ggufdspark.measuring.profiles import pair_record
from ggufdspark.measuring.prompts import render
from ggufdspark.measuring.report import (MAX_PLAIN_DRIFT, BenchReport, GroupStats, accept_histogram, bracket_drift,
                                         check_plot_path, decode_tps, format_report, group_stats, plain_drift,
                                         plot_report, ratio)
from ggufdspark.redaction import redact_engine_args
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import ServerSettings
from ggufdspark.serve_checks import ServingOptions

# The verb's own names, and the public names of measure, gate and report that callers have long
# imported from here (the CLI, tests, benchmarks); new code imports those from their modules.
__all__ = ["Arms", "measure_arms", "summarize_arms", "bench_arms", "run_bench",
           "DEFAULT_N_PREDICT", "EXIT_WAIT_S", "NEAR_TIE_GAP", "Outcome", "Turn", "render", "request", "running",
           "GateResult", "first_difference", "run_gate", "BenchReport", "GroupStats", "accept_histogram",
           "format_report", "plot_report", "MAX_PLAIN_DRIFT"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the run


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
        raise BenchOptionError("--synthetic-accept and --synthetic-rates are mutually exclusive")
    syn = Synthetic(synthetic_len, list(synthetic_rates) if synthetic_rates else None)
    if gate:
        raise BenchOptionError(f"the lossless gate is refused with {syn.describe()}: the engine accepts draft tokens "
                         "at random in that mode, so the output is not valid; drop --gate, or drop the "
                         "synthetic flags to check the output")
    if syn.rates:
        syn.rates = check_rates(syn.rates, n_max)
    if syn.length is not None and not 1.0 <= syn.length <= n_max + 1:
        raise BenchOptionError(f"--synthetic-accept {syn.length}: expected a mean length in [1, {n_max + 1}] "
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
        warm(c)
        turns, plain1 = run_first_arm(c, items, n_predict, marker, lambda w: tick(f"plain: {w}"))
        load1 = load_curve(c, turns, "plain")
    log.info("arm 2/3: target + draft, n_max %s (%s)", spec_settings.draft_n_max, logs / "spec.log")
    with running(spec_settings, logs / "spec.log") as c:
        here = _for_server(turns, marker, _media_marker(c) if media else None)
        warm(c)
        m0 = c.metrics()
        spec = sequential(c, here, "spec")
        counters = tm.metrics_delta(m0, c.metrics())
        load_s = load_curve(c, here, "spec")
    log.info("arm 3/3: target alone again (%s)", logs / "plain-2.log")
    with running(plain_settings, logs / "plain-2.log") as c:
        here = _for_server(turns, marker, _media_marker(c) if media else None)
        warm(c)
        plain2 = sequential(c, here, "plain again")
        load2 = load_curve(c, here, "plain again")
        if gate == "run":
            g = run_gate(c, here, plain1, spec, plain2, near_tie_gap=near_tie_gap)
        else:
            status, _, why = gate.partition(": ")
            g = GateResult(status, why, requests=len(turns), near_tie_gap=near_tie_gap)
    return Arms(turns, plain1, spec, plain2, load1, load_s, load2, counters, g)


def _media_marker(client: Client) -> str | None:
    return client.props().get("media_marker")


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


def summarize_arms(a: Arms, *, max_plain_drift: float = MAX_PLAIN_DRIFT
                   ) -> tuple[list[GroupStats], GroupStats, dict, list[dict], dict]:
    """Per-category and overall stats, plain drift, the concurrency curve, acceptance figures.

    Beyond ``max_plain_drift`` apart, the plain runs of one request at a time refuse the report's
    speedups (``headline_refused``); those of one concurrency level withhold that level's ratio
    (a few requests' wall time is noisier than the engine's decode timings)."""
    groups = []
    for cat in dict.fromkeys(t.category for t in a.turns):
        idx = [i for i, t in enumerate(a.turns) if t.category == cat]
        groups.append(group_stats(pr.CATEGORIES.get(cat, cat), [a.plain[i] for i in idx],
                                  [a.plain_again[i] for i in idx], [a.spec[i] for i in idx]))
    overall = group_stats("overall", a.plain, a.plain_again, a.spec)
    before, after = decode_tps(a.plain), decode_tps(a.plain_again)
    drift = {"before_tps": before, "after_tps": after, "change": after / before - 1 if before and after else None,
             **plain_drift(before, after, max_drift=max_plain_drift)}
    load = []
    for lv, sp in a.load_spec.items():
        p1, p2 = a.load_plain[lv], a.load_plain_again[lv]
        pt = (p1.tokens + p2.tokens) / ((p1.wall_s + p2.wall_s) or 1)
        d = bracket_drift(p1.tps, p2.tps)
        withheld = d is not None and d > max_plain_drift
        load.append({"level": lv, "plain_tps": pt, "spec_tps": sp.tps, "ratio": None if withheld else ratio(sp.tps, pt),
                     "plain_before_tps": p1.tps, "plain_after_tps": p2.tps, "plain_drift": d,
                     "ratio_withheld": withheld, "spec_accept_length": sp.accept_length, "requests": sp.requests})
    d = a.spec_counters
    acceptance = {"accept_length": d.accept_length, "passes": d.passes, "drafted": d.draft_n,
                  "accepted": d.draft_n_accepted, "rates": d.accept_rate_per_pos, "per_position": d.accepted_per_pos,
                  "histogram": accept_histogram(d.accepted_per_pos, d.passes),
                  "source": "/metrics counters of the speculative arm, one request at a time"}
    return groups, overall, drift, load, acceptance


def bench_arms(engine: eng.EngineInfo, decision: Decision, opts: ServingOptions, *, parallel: int = 1,
               p_min: float | None = None,
               synthetic: Synthetic | None = None) -> tuple[ServerSettings, ServerSettings]:
    """The plain and the drafted server of a bench run. The drafted one is what ``serve`` starts for
    ``decision`` and ``opts`` at ``-np parallel`` (``measure.base_settings``: draft length, load cut,
    a tune profile's p_min, context, workarounds), with ``p_min`` instead where given, plus synthetic
    acceptance; the plain one is the same without the draft."""
    base = base_settings(engine, opts, decision=decision, parallel=parallel)
    return arm_settings(base, None), arm_settings(base, opts.draft, p_min=p_min, synthetic=synthetic)


def run_bench(opts: ServingOptions, *, prompts: str | Path | None = None, categories: list[str] | None = None,
              limit: int | None = None, n_predict: int = DEFAULT_N_PREDICT, p_min: float | None = None,
              concurrency: list[int] | None = None, synthetic_len: float | None = None,
              synthetic_rates: list[float] | None = None, gate: bool | None = None,
              near_tie_gap: float = NEAR_TIE_GAP, reference_hf: str | Path | None = None,
              log_dir: str | Path | None = None, plot: str | Path | None = None,
              max_plain_drift: float = MAX_PLAIN_DRIFT, progress: Progress | None = None) -> BenchReport:
    """Measure plain vs speculative decoding of the server ``opts`` describe; run the lossless gate.

    Every option is checked before the first server starts, so no run is lost to a late error.

    Args:
        opts: the pair (``model``, ``draft``, ``mmproj``: files), the engine and the server's
            options (``draft_n_max``, ``draft_n_max_by_slots``, ``threads``, ``ctx_per_slot``,
            ``extra_args`` for every arm); ``serve``'s own options are refused
            (``ServingOptions.check_measured``).
        gate: None runs the gate unless acceptance is synthetic; True insists (refused with
            synthetic acceptance); False skips it.
        concurrency: parallel-request levels for the throughput curve (default per backend).
        plot: where the caller will write ``plot_report(report, plot)``: checked up front
            (matplotlib, format, directory), not written here.
        max_plain_drift: how far apart the two plain runs may be (``bracket_drift``) before the
            report refuses to give a speedup.

    Returns:
        A BenchReport; call ``raise_for_gate()`` to turn defects into an error, then
        ``raise_for_drift()`` for a run too noisy to give a speedup.

    Raises:
        BenchError: bad options or prompt file, the gate requested with synthetic acceptance, or
            a server that died during the run.
        InvalidArgumentError, UnsafeOutputError, MissingDependencyError: a ``--plot`` that could
            not be written; ``max_plain_drift`` negative.
        InputNotFoundError, PairMismatchError, EngineError: files (``reference_hf`` included),
            pair or engine unusable.
    """
    target, draft, mmproj = opts.model, opts.draft, opts.mmproj
    opts.check_measured("bench")
    if n_predict < 1:
        raise BenchOptionError(f"--n-predict {n_predict}: expected at least 1")
    check_threads(opts.threads)
    check_p_min(p_min)
    if not max_plain_drift >= 0:  # NaN too
        raise InvalidArgumentError(f"--max-plain-drift {max_plain_drift}: expected a fraction >= 0 (0.25: 25%)")
    if plot:
        check_plot_path(plot, target, draft, mmproj, prompts)
    if reference_hf:
        check_reference(reference_hf)
    if gate and (synthetic_len is not None or synthetic_rates):
        _synthetic(synthetic_len, synthetic_rates, gate, 1)  # refuse before anything is loaded
    info, devices, decision, limits = prepare(opts, concurrency=concurrency)
    n_max = decision.draft_n_max or limits.max_n
    if n_max > limits.max_n:
        raise BenchOptionError(f"draft length {n_max} exceeds what {Path(draft).name} can draft ({limits.max_n}, "
                         f"block size {limits.block_size})")
    if p_min and not limits.confidence_head:
        raise BenchOptionError(f"{draft}: has no confidence head, so --p-min must be 0 (got {p_min})")
    synthetic = _synthetic(synthetic_len, synthetic_rates, gate, n_max)
    levels = concurrency_levels(concurrency, decision.backend)
    # a temporary log directory is gone again if the run fails before writing to it
    with log_directory(log_dir, "ggufdspark-bench-") as logs:
        pset = pr.prompt_set(prompts, mmproj=mmproj, image_dir=logs / "images", categories=categories, limit=limit)
        # serve's context a slot, unless the prompt set's turns need more
        needed = 2048 + n_predict * max(it.n_turns for it in pset.items)
        per_slot = opts.ctx_per_slot or (needed if needed > launch.CTX_PER_SLOT else None)
        plain_settings, spec_settings = bench_arms(info, decision, dataclasses.replace(opts, ctx_per_slot=per_slot),
                                                   parallel=max(levels), p_min=p_min, synthetic=synthetic)
        gate_mode = ("refused: " + f"{synthetic.describe()}: the output is not valid in that mode" if synthetic
                     else "off: --no-gate given" if gate is False else "run")
        arms = measure_arms(plain_settings, spec_settings, pset.items, n_predict=n_predict, levels=levels, logs=logs,
                            gate=gate_mode, near_tie_gap=near_tie_gap, media=bool(mmproj), progress=progress)
        reference = reference_run(reference_hf, arms.turns, arms.plain, n_predict) if reference_hf else None
        groups, overall, drift, load, acceptance = summarize_arms(arms, max_plain_drift=max_plain_drift)
        settings = {"target": str(target), "draft": str(draft), "mmproj": str(mmproj) if mmproj else None,
                    "engine": f"{info.commit or info.version} ({info.path})", "backend": decision.backend,
                    "devices": decision.devices, "draft_n_max": n_max, "block_size": limits.block_size,
                    "draft_n_max_source": "--draft-n-max" if opts.draft_n_max else "; ".join(decision.reasons),
                    "draft_cut": spec_settings.draft_n_max_by_slots, "ctx_size": spec_settings.ctx_size,
                    "ctx_per_slot": launch.slot_context(
                        spec_settings.ctx_size, max(levels), launch.trained_context(target),
                        unified=any(a in launch.UNIFIED_KV_FLAGS for a in opts.extra_args)),
                    "p_min": spec_settings.draft_p_min, "n_predict": n_predict, "concurrency": levels, "items": len(pset.items),
                    "requests": len(arms.turns), "prompts": pset.source, "images": pset.images,
                    "synthetic": asdict(synthetic) if synthetic else None, "greedy": True,
                    "spec_command": redact_engine_args(spec_settings.redacted()),
                    "plain_command": redact_engine_args(plain_settings.redacted())}
        rows = [{"item": t.item, "category": t.category, "turn": t.turn, "prompt_tokens": t.n_prompt,
                 "plain": _row(p1), "spec": _row(s), "plain_again": _row(p2)}
                for t, p1, s, p2 in zip(arms.turns, arms.plain, arms.spec, arms.plain_again)]
        return BenchReport(settings, synthetic.describe() if synthetic else None, groups, overall, drift, load,
                           arms.gate, acceptance, reference,
                           kept_logs({k: str(logs / f"{k}.log") for k in ("plain-1", "spec", "plain-2")}, log_dir), rows,
                           pair=pair_record(target, draft))


def _row(o: Outcome) -> dict:
    t = o.timings
    return {"tokens": len(o.tokens), "decode_tps": t.decode_tps, "wall_s": o.wall_s, "draft_n": t.draft_n,
            "draft_n_accepted": t.draft_n_accepted, "accept_length": t.accept_length}
