"""``bench --load``: plain against drafted serving under traffic that looks real.

Arms on one engine build, one server each, started alike (``loadplan.plan_load``: the slots the
traffic needs): the target alone, then the target with the DSpark draft as ``serve`` starts it (or
several drafted arms: ``DraftArm``, ``tune --load``). The data runs one way: the plan
(``loadplan``), the arms run (``run_arms``: every request's record), the records pooled into each
level's figures (``loadreport.pool_rounds``), the report (``load_report``). The prompt
set (``traffic.traffic_items``) is rendered and tokenized once by the first server; every arm sends
the same token ids in the same seeded order at every level. By default all servers are up at once
and each level runs on every arm in turn, the order reversed at every other level (``interleave``),
so a machine that slows down for a while (a shared host, a hot GPU) weighs on all arms alike; one
server at a time is the fallback for memory that holds one. Each arm is warmed up (a short request,
then the set's longest prompt) before the levels; each level is closed-loop clients or Poisson
arrivals (``traffic.Shape``), every request streamed so the client measures its time to first
token. One JSON result per run (``loadreport.LoadReport.to_dict``): the exact command, the engine and its
patch series, the devices, the traffic shape, per arm and level the figures and the raw requests,
and drafted / plain of each figure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ggufdspark.convert.common import check_output
from ggufdspark.errors import BenchError, EngineError, InvalidArgumentError, OutputExistsError
from ggufdspark.measuring import traffic as tr
from ggufdspark.measuring.loadplan import LoadPlan, arm_text
from ggufdspark.measuring.loadreport import NOISE_ARM, LevelResult, LoadReport, pool_rounds
from ggufdspark.measuring.measure import (WARMUP_TOKENS, Progress, kept_logs, log_directory, running, server_failure,
                                          warm)
from ggufdspark.measuring.profiles import pair_record
from ggufdspark.measuring.traffic.pictures import Picture
from ggufdspark.redaction import redact_command_line, redact_engine_args
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import ServerProcess

log = logging.getLogger(__name__)


def check_json_path(path: str | Path, *inputs: str | Path | None, force: bool = False) -> Path:
    """Refuse a ``--json FILE`` that could not be written, or exists without ``force``.

    Raises:
        OutputExistsError, UnsafeOutputError: naming ``--json`` and the path.
    """
    p = Path(path)
    if p.is_dir():
        raise InvalidArgumentError(f"--json {p}: is a directory")
    if p.exists() and not force:
        raise OutputExistsError(f"--json {p}: exists (give --force to replace it)")
    check_output(p, *(i for i in inputs if i))
    return p


def write_json(path: str | Path, obj: Any) -> Path:
    """``obj`` as JSON at ``path``, written whole (a temporary file renamed into place)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def run_load(plan: LoadPlan, *, log_dir: str | Path | None = None, command: str | None = None,
             progress: Progress | None = None) -> LoadReport:
    """Run a load plan (``loadplan.plan_load``: plain and drafted arms under the same traffic; see
    the module docstring) and report it.

    Args:
        plan: what to run, every option already checked.
        log_dir: keep the servers' logs (and the drawn pictures) here; None: a temporary directory,
            removed when the run ends well.
        command: the command line to record in the result.
        progress: ``progress(done, total, what)`` after every request.

    Raises:
        BenchError: a prompt longer than the slot's context, or a server that died or failed a request.
    """
    with log_directory(log_dir, "ggufdspark-load-") as logs:
        measured = run_arms(plan, logs, progress)
        arms = {a: [pool_rounds(rs) for rs in per_level] for a, per_level in measured.runs.items()}
        return load_report(plan, measured, arms,
                           logs=kept_logs({a: str(logs / f"{a}.log") for a in plan.settings}, log_dir),
                           command=command)


@dataclass
class Measured:
    """What the arms' servers answered: the prompt set as the first server rendered it, the
    pictures drawn (``--image-share``) and, per arm and level, each round's ``LevelResult`` (its
    requests' records and figures)."""

    prompts: list[tr.Prompt]
    drawn: list[Picture]
    runs: dict[str, list[list[LevelResult]]]


def run_arms(plan: LoadPlan, logs: Path, progress: Progress | None = None) -> Measured:
    """Run every level of ``plan`` on every arm (interleaved, or one server at a time), each arm
    warmed up first; server logs go to ``logs`` (``<arm>.log``, pictures under ``images``).

    Raises:
        BenchError: a prompt longer than the slot's context, a server that died or failed a request.
    """
    shape, settings = plan.shape, plan.settings
    total = len(settings) * shape.rounds * sum(shape.n_requests(lv) for lv in shape.levels)
    done = [0]

    def tick(what: str) -> None:
        done[0] += 1
        if progress:
            progress(min(done[0], total), total, what)

    prompts: list[tr.Prompt] = []
    pictures: dict[str, tr.ImageTraffic] = {}  # per arm: its image requests (its media marker)
    drawn = tr.draw_pictures(logs / "images", shape.seed) if shape.image_share > 0 else []
    # per arm, per level: each round's result (pooled by the caller)
    runs: dict[str, list[list[LevelResult]]] = {a: [[] for _ in shape.levels] for a in settings}

    def level(arm: str, client: Client, i: int, r: int) -> None:
        lv = shape.levels[i]
        res = tr.run_level(client, prompts, lv, shape.round(r), tick=lambda w, a=arm: tick(f"{a}: {w}"),
                           pictures=pictures.get(arm))
        log.info("%s, %g %s%s: %.1f tok/s aggregate, TTFT p50 %.3f s, %d requests%s%s", arm, lv,
                 "clients" if shape.mode == "closed" else "requests/s",
                 f", round {r + 1}/{shape.rounds}" if shape.rounds > 1 else "", res.aggregate_tps,
                 res.ttft_p50_s or 0.0, res.requests,
                 f", {res.image_requests} with an image" if res.image_requests else "",
                 f"; {res.failed} FAILED (the server answered with an error)" if res.failed else "")
        runs[arm][i].append(res)

    if not plan.interleave:  # one server at a time: each arm's levels (every round), then the next arm
        for k, arm in enumerate(settings):
            log.info("arm %d/%d: %s (%s)", k + 1, len(settings), arm, logs / f"{arm}.log")
            with running(settings[arm], logs / f"{arm}.log") as c:
                if not prompts:
                    prompts = tr.render_all(c, plan.items)
                    _check_fits(prompts, plan.per_slot, shape.answer_tokens, plan.image_ctx)
                if drawn:
                    first = next(iter(pictures.values()), None)
                    pictures[arm] = (first.for_server(c.props().get("media_marker")) if first
                                     else tr.image_traffic(c, plan.items, drawn, shape.image_share))
                _warm_up(c, prompts, pictures.get(arm))
                for r in range(shape.rounds):
                    for i in _round_levels(len(shape.levels), r):
                        level(arm, c, i, r)
        return Measured(prompts, drawn, runs)
    # every server up; each level runs on every arm in turn, the order reversed level by level
    with contextlib.ExitStack() as stack:
        srvs = {}
        for k, arm in enumerate(settings):
            log.info("arm %d/%d: %s (%s)", k + 1, len(settings), arm, logs / f"{arm}.log")
            srvs[arm] = stack.enter_context(ServerProcess(settings[arm], log_path=logs / f"{arm}.log",
                                                          start_timeout=600.0))

        def on(arm: str, fn: Callable[[Client], None]) -> None:
            try:
                fn(srvs[arm].client())
            except EngineError as e:
                raise server_failure(srvs[arm], settings[arm], logs / f"{arm}.log", e) from None

        prompts = tr.render_all(srvs["plain"].client(), plan.items)
        _check_fits(prompts, plan.per_slot, shape.answer_tokens, plan.image_ctx)
        if drawn:
            first = tr.image_traffic(srvs["plain"].client(), plan.items, drawn, shape.image_share)
            for arm in settings:
                pictures[arm] = first.for_server(srvs[arm].client().props().get("media_marker"))
        for arm in settings:
            on(arm, lambda c, a=arm: _warm_up(c, prompts, pictures.get(a)))
        for r in range(shape.rounds):
            for k, i in enumerate(_round_levels(len(shape.levels), r)):
                turn = r * len(shape.levels) + k
                for arm in (list(settings) if turn % 2 == 0 else list(reversed(settings))):
                    on(arm, lambda c, a=arm, j=i, k=r: level(a, c, j, k))
    return Measured(prompts, drawn, runs)


def load_report(plan: LoadPlan, measured: Measured, arms: dict[str, list[LevelResult]], *,
                logs: dict[str, str], command: str | None = None) -> LoadReport:
    """The run's result: the plan's settings and traffic, the pooled ``arms``, the kept ``logs``."""
    shape, drafted, drawn = plan.shape, plan.drafted, measured.drawn
    sizes = [p.n_tokens for p in measured.prompts]
    temperature, answer_tokens = shape.temperature, shape.answer_tokens
    scaled = (f", each after the next {shape.prompt_scale - 1} of the set (--prompt-scale {shape.prompt_scale})"
              if shape.prompt_scale > 1 else "")
    traffic = {"shape": shape.to_dict(), "prompts": "built-in set (text-only) + data/traffic.jsonl + composed "
               f"documents (ggufdspark.measuring.traffic){scaled}", "prompt_tokens": tr.length_stats(sizes),
               "prompt_ids": [p.id for p in measured.prompts],
               "warmup": f"one {WARMUP_TOKENS}-token request, then the longest prompt ({max(sizes)} tokens, "
                         f"{WARMUP_TOKENS} tokens)" + (", then it with the largest picture" if drawn else "")
                         + " per arm, before its levels",
               "order": ("interleaved: all arms' servers up, each level on every arm in turn, the order "
                         "reversed at every other level") if plan.interleave else "sequential: one arm's server "
                         "and levels after another's",
               "rounds": (f"{shape.rounds}: every level run {shape.rounds} times (the levels up, then down, "
                          "and so on), round r with seed + r; figures over all rounds' requests, aggregate = "
                          "their output tokens / the rounds' summed wall time; round_tps: each round's aggregate")
                         if shape.rounds > 1 else "1",
               **({"images": {"share": shape.image_share, "mmproj": str(plan.opts.mmproj),
                              "pictures": [p.name for p in drawn],
                              "how": "round(share x requests) of each level's requests, chosen by a generator "
                                     "seeded with the round's seed (the same on every arm), each a picture "
                                     "before the text of its prompt, the sizes in turn; prompt_tokens of those "
                                     "requests: the engine's count, image tokens included"}}
                  if drawn else {}),
               "requests": "streamed /completion, " + (f"sampled at temperature {temperature:g} (the engine's "
                           "default chain, a seed a request)" if temperature > 0 else "greedy")
                           + f", prompt cache off, ignore_eos (every answer exactly {answer_tokens} tokens)"}
    info, decision, synthetic, opts = plan.engine, plan.decision, plan.synthetic, plan.opts
    return LoadReport(
        command=redact_command_line(command) if command else None,
        engine={"commit": info.commit, "version": info.version, "path": info.path, "patches": list(info.patches)},
        hardware={"backend": decision.backend, "devices": decision.devices},
        traffic=traffic,
        settings={"target": str(opts.model), "draft": str(opts.draft),
                  "mmproj": str(opts.mmproj) if opts.mmproj else None,
                  "draft_n_max": plan.n_max, "block_size": plan.limits.block_size,
                  "draft_n_max_source": "--draft-n-max" if opts.draft_n_max else "; ".join(decision.reasons),
                  "p_min": drafted.draft_p_min, "draft_cut": drafted.draft_n_max_by_slots, "slots": shape.slots,
                  "ctx_per_slot": plan.per_slot,
                  "synthetic": asdict(synthetic) if synthetic else None,
                  "plain_command": redact_engine_args(plan.settings["plain"].redacted()),
                  "drafted_command": redact_engine_args(drafted.redacted()),
                  **({"drafted_arms": {a.name: arm_text(a, plan.settings[a.name]) for a in plan.draft_arms}}
                     if plan.draft_arms else {}),
                  **({"noise_floor": f"{NOISE_ARM}: a second plain server, the same command as plain"}
                     if plan.noise_floor else {})},
        synthetic=synthetic.describe() if synthetic else None, arms=arms,
        logs=logs, pair=pair_record(opts.model, opts.draft))


def _round_levels(n: int, r: int) -> list[int]:
    """The level indices of round ``r``: ascending, then descending in the next round, and so on, so
    that no round starts at the quietest level right after the busiest one (a server that has just
    served the most clients is still saving their slots to its prompt cache: on the H200 the first
    request after a 64-client level once ran at half speed)."""
    return list(range(n)) if r % 2 == 0 else list(reversed(range(n)))


def _check_fits(prompts: list[tr.Prompt], per_slot: int, answer_tokens: int, image_tokens: int = 0) -> None:
    longest = max(prompts, key=lambda p: p.n_tokens)
    need = longest.n_tokens + image_tokens + answer_tokens
    if need > per_slot:
        pic = f" and a picture ({image_tokens})" if image_tokens else ""
        raise BenchError(f"prompt {longest.id!r} has {longest.n_tokens} tokens: with {answer_tokens}-token answers"
                         f"{pic} it needs a context of {need} a slot, --ctx-per-slot is {per_slot}")


def _warm_up(client: Client, prompts: list[tr.Prompt], pictures: tr.ImageTraffic | None = None) -> None:
    warm(client)
    longest = max(prompts, key=lambda p: p.n_tokens)
    client.stream_complete(longest.tokens, n_predict=WARMUP_TOKENS, ignore_eos=True)
    if pictures:  # the vision encoder's first use (and the largest picture) stays out of the levels too
        client.stream_complete(pictures.prompt(prompts.index(longest), len(pictures.pictures) - 1),
                               n_predict=WARMUP_TOKENS, ignore_eos=True)


