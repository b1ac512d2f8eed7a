"""``tune --load``: the draft length for each load, measured with ``bench --load``'s traffic.

One ``bench --load`` run (``loadplan.plan_load``, ``loadbench.run_load``) with a drafted arm per draft length beside one
plain arm, under the same closed-loop clients and prompts; length 0 is the draft loaded with
drafting paused at every load (``--spec-draft-n-max-by-slots 0:0``): what "no draft" costs a server
that keeps its drafter for the quiet moments. Each client level then gets the length whose
aggregate output tok/s beat plain's by the most, or no draft where none beat it by ``min_gain``;
where 0 was measured, a level pauses unless a length beats the paused arm by ``min_gain`` (both
arms carry the drafter: the choice the engine makes step by step). The profile
``serve`` reads keeps:

* ``draft_n_max``: the winner at the lowest level;
* ``load_cut``: ``[[N, L], ...]``, drafts cut to L while more than N slots are busy, where a
  higher level's winner is shorter, L = 0 where drafting pauses (``--spec-draft-n-max-by-slots``,
  engine patch 0021);
* ``max_concurrency_for_draft``: without a paused arm, the last level that still paid (the highest
  measured when all did): serve runs without the draft on a server with more slots than that, as
  for a plain ``tune``; None with a paused arm, whose pause step does that job while load is high
  and leaves the draft to the quiet moments.

Ratios are within one run (every arm beside the same plain arm), so a noisy machine moves all alike.
With ``image_share`` (and ``opts.mmproj``, given to every arm's server) that share of the requests
carry a drawn picture, as in ``bench --load --image-share``; the traffic record and the profile say so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from ggufdspark import engine as eng
from ggufdspark import hardware
from ggufdspark.errors import BenchOptionError
from ggufdspark.measuring import loadbench, loadplan, profiles
from ggufdspark.measuring import traffic as tr
from ggufdspark.measuring.measure import Progress, draft_limits
from ggufdspark.measuring.tune import MIN_GAIN
from ggufdspark.serve_checks import ServingOptions

log = logging.getLogger(__name__)

# The most servers tune --load keeps up at once to interleave its arms (plain and three drafted:
# four 64-slot servers of the 3B pair hold about 50 GiB); with more arms they run one at a time.
MAX_INTERLEAVED_ARMS = 4


def recommend_load(ratios: dict[int, dict[int, float]], *, min_gain: float = MIN_GAIN) -> dict:
    """The serving recommendation from ``{draft length: {clients: drafted / plain aggregate}}``;
    length 0, where present, is the paused arm (the draft loaded, no drafts).

    Returns:
        ``{"draft_enabled", "draft_n_max", "load_cut", "max_concurrency_for_draft", "per_level",
        "why"}``; ``per_level`` is ``[{"clients", "best_n_max" (0: paused, None: no draft), "ratio"}]``.
    """
    levels = sorted({lv for by_level in ratios.values() for lv in by_level})
    paused = ratios.get(0)
    per_level = []
    for lv in levels:
        cands = [(r[lv], n) for n, r in ratios.items() if n > 0 and lv in r]
        ratio, n = max(cands, key=lambda c: (c[0], -c[1])) if cands else (0.0, None)
        if paused is not None and lv in paused:  # both carry the drafter: drafting must beat pausing
            drafts = bool(n) and ratio >= paused[lv] * min_gain
            per_level.append({"clients": lv, "best_n_max": n if drafts else 0,
                              "ratio": round(ratio if drafts else paused[lv], 3)})
        else:
            per_level.append({"clients": lv, "best_n_max": n if ratio >= min_gain else None, "ratio": round(ratio, 3)})
    first = per_level[0]["best_n_max"] if per_level else None
    if first and per_level[0]["ratio"] < min_gain:  # the drafter is worth loading only if it pays when quiet
        first = None
    if not first:
        return {"draft_enabled": False, "draft_n_max": None, "load_cut": None, "max_concurrency_for_draft": 0,
                "per_level": per_level,
                "why": f"no draft length beat the plain server by {min_gain:g}x at {levels[0] if levels else '-'} "
                       "client(s)"}
    cut: list[list[int]] = []
    cap = None
    current = first
    for prev, p in zip(per_level, per_level[1:]):
        if p["best_n_max"] is None:
            cap = prev["clients"]
            break
        if p["best_n_max"] < current:
            current = p["best_n_max"]
            cut.append([prev["clients"], current])
    if cap is None and paused is None:  # as tune: drafting was measured up to the highest level, not beyond it
        cap = levels[-1]
    why = f"draft length {first} at {levels[0]} client(s) ({per_level[0]['ratio']:.2f}x)"
    if cut:
        why += "; " + ", ".join(f"{length} above {n} busy slots" if length else
                                f"paused above {n} busy slots" for n, length in cut)
    if cap is None:
        why += f"; measured up to {levels[-1]} client(s), the pause (if any) holds beyond"
    else:
        why += (f"; no draft pays above {cap} client(s)" if cap < levels[-1]
                else f"; measured up to {cap} client(s)")
    return {"draft_enabled": True, "draft_n_max": first, "load_cut": cut or None, "max_concurrency_for_draft": cap,
            "per_level": per_level, "why": why}


@dataclass
class TuneLoadResult:
    """What ``tune --load`` measured and recommends (``to_dict`` is the JSON printed)."""

    recommendation: dict
    ratios: dict[int, dict[int, float]]
    traffic: dict
    profile_path: str | None = None
    reports: list[dict] = field(default_factory=list, repr=False)
    pair: dict | None = None  # profiles.pair_record: what publish --results checks

    def to_dict(self) -> dict:
        return {"kind": "ggufdspark tune --load", "pair": self.pair, "recommendation": self.recommendation,
                "ratios": {str(n): {str(k): v for k, v in r.items()} for n, r in self.ratios.items()},
                "traffic": self.traffic, "profile": self.profile_path,
                "load": self.reports[0] if self.reports else None}

    def text(self) -> str:
        levels = sorted({lv for r in self.ratios.values() for lv in r})
        head = "length " + "".join(f"{lv:>10}" for lv in levels)
        rows = [f"{n if n else 'paused':>6} " + "".join(f"{r.get(lv, float('nan')):>9.2f}x" for lv in levels)
                for n, r in sorted(self.ratios.items())]
        rec = self.recommendation
        lines = [f"tune --load: aggregate output tok/s, drafted / plain, by clients ({self.traffic.get('shape', '')})",
                 head, *rows, "", f"recommendation: {rec['why']}"]
        if self.profile_path:
            lines.append(f"profile: {self.profile_path} (serve reads it)")
        return "\n".join(lines)


def run_tune_load(opts: ServingOptions, *, draft_lengths: list[int] | None = None, clients: list[int] | None = None,
                  answer_tokens: int = tr.DEFAULT_ANSWER_TOKENS, requests_per_client: int | None = None,
                  synthetic_rates: list[float] | None = None, log_dir: str | Path | None = None, save: bool = True,
                  min_gain: float = MIN_GAIN, interleave: bool = True, rounds: int = 1, prompt_scale: int = 1,
                  image_share: float = 0.0, progress: Progress | None = None) -> TuneLoadResult:
    """One ``bench --load`` run with an arm per draft length (0: paused); recommend a length per
    load; save the profile. Default lengths: 1..the draft's longest, and 0 where the engine can pause.
    ``rounds``: every level that many times (``loadplan.plan_load``), the choice made on the ratios
    over all rounds; ``prompt_scale``: every prompt that many times as long (the traffic a
    profile is tuned for: long documents, say); ``image_share``: that fraction of the requests carry
    a drawn picture (``loadplan.plan_load``; needs ``opts.mmproj``, which every arm's server gets).
    ``opts``: the pair, the engine and the server's options as ``run_load`` takes them, less the
    draft length and its load cut, which this measures (refused when given).

    Raises:
        BenchOptionError: a draft length the draft cannot make, or 0 with an engine that cannot pause.
        InvalidArgumentError: bad traffic options (``image_share`` outside [0, 1], or above 0 without
            ``opts.mmproj``), before anything is loaded.
        BenchError, InputNotFoundError, PairMismatchError, EngineError: as ``loadplan.plan_load`` and
            ``loadbench.run_load``.
    """
    target, draft = opts.model, opts.draft
    opts.check_measured("tune --load", "draft_n_max", "draft_n_max_by_slots")
    # the traffic options refused before the draft is read (plan_load checks them again, with the backend)
    loadplan.load_shape(clients=clients, rate=None, answer_tokens=answer_tokens,
                        requests_per_client=requests_per_client, requests=None, seed=tr.DEFAULT_SEED, backend="cpu",
                        rounds=rounds, image_share=image_share, mmproj=opts.mmproj, prompt_scale=prompt_scale)
    limits = draft_limits(draft)
    engine = eng.find_engine(opts.server)
    can_pause = engine.draft_pause
    lengths = sorted(set(draft_lengths if draft_lengths else [*([0] if can_pause else []),
                                                              *range(1, limits.max_n + 1)]))
    bad = [n for n in lengths if not 0 <= n <= limits.max_n]
    if bad:
        raise BenchOptionError(f"--draft-lengths: {bad[0]} is not a length {Path(draft).name} can draft "
                               f"(1..{limits.max_n}, or 0: paused)")
    if 0 in lengths and not can_pause:
        raise BenchOptionError("--draft-lengths 0: this llama-server cannot pause drafting (engine patch 0021 "
                               "before L = 0; ggufdspark build-engine)")
    drafting = [n for n in lengths if n > 0]
    if not drafting:
        raise BenchOptionError("--draft-lengths: give at least one length above 0 (0 is the paused arm)")
    arms = {n: loadplan.DraftArm(f"n{n}", n) for n in drafting}
    if 0 in lengths:
        arms[0] = loadplan.paused_arm(max(drafting))
    log.info("tune --load: draft lengths %s beside one plain arm", ",".join(map(str, lengths)))
    if interleave and len(arms) + 1 > MAX_INTERLEAVED_ARMS:
        log.warning("tune --load: %d arms are more servers than it keeps up at once (%d): one server at a time",
                    len(arms) + 1, MAX_INTERLEAVED_ARMS)
        interleave = False
    plan = loadplan.plan_load(replace(opts, draft_n_max=max(drafting)), clients=clients, answer_tokens=answer_tokens,
                              requests_per_client=requests_per_client,
                              synthetic_rates=list(synthetic_rates) if synthetic_rates else None,
                              draft_arms=list(arms.values()), interleave=interleave, rounds=rounds,
                              prompt_scale=prompt_scale, image_share=image_share)
    rep = loadbench.run_load(plan, log_dir=log_dir, progress=progress)
    ratios = {n: {int(r["level"]): r["aggregate_tps"] or 0.0 for r in rep.ratios_of(arm.name)}
              for n, arm in arms.items()}
    traffic = rep.traffic
    share = plan.shape.image_share  # the shape's text says it too ("0.5 of the requests with an image")
    rec = recommend_load(ratios, min_gain=min_gain)
    result = TuneLoadResult(rec, ratios, {**traffic, "shape": _shape_text(traffic), "image_share": share},
                            reports=[rep.to_dict()], pair=rep.pair)
    if save:
        devices = hardware.detect(engine)  # the pair and engine were checked by run_load
        with_images = f", {share:g} of the requests with an image" if share else ""
        data = {"recommendation": {**rec, "measured_with": f"tune --load (bench --load traffic{with_images})"},
                "load": {"ratios": result.to_dict()["ratios"], "traffic": _shape_text(traffic), "image_share": share}}
        result.profile_path = str(profiles.save_profile(devices, target, draft, data))
    return result


def format_profile(prof: dict) -> str:
    """A stored ``tune --load`` profile as text (``tune --show``)."""
    load = prof.get("load") or {}
    ratios = {int(n): {int(k): v for k, v in r.items()} for n, r in (load.get("ratios") or {}).items()}
    text = TuneLoadResult(prof.get("recommendation") or {"why": "-"}, ratios, {"shape": load.get("traffic", "")},
                          profile_path=prof.get("path")).text()
    return text.replace("recommendation:", "RECOMMENDATION:", 1)


def _shape_text(traffic: dict) -> str:
    return str((traffic.get("shape") or {}).get("describe", ""))
