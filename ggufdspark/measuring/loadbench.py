"""``bench --load``: plain against drafted serving under traffic that looks real.

Arms on one engine build, one server each, started alike (``measure.base_settings`` /
``arm_settings``, the slots the traffic needs): the target alone, then the target with the DSpark
draft as ``serve`` starts it (or several drafted arms: ``DraftArm``, ``tune --load``). The prompt
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
import dataclasses
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ggufdspark import engine as eng
from ggufdspark import hardware, launch
from ggufdspark.convert.common import check_output
from ggufdspark.errors import BenchError, EngineError, InvalidArgumentError, OutputExistsError
from ggufdspark.measuring import traffic as tr
from ggufdspark.measuring.loadreport import NOISE_ARM, LoadReport
from ggufdspark.measuring.measure import (WARMUP_TOKENS, Progress, Synthetic, arm_settings, base_settings, check_rates,
                                          kept_logs, log_directory, prepare, running, server_failure, warm)
from ggufdspark.measuring.profiles import pair_record
from ggufdspark.redaction import redact_command_line, redact_engine_args
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import ServerProcess, ServerSettings

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DraftArm:
    """One drafted arm of a load run: its name, draft length (None: serve's, with serve's load cut)
    and load cut (``[(N, L), ...]``; None: none, or serve's with ``n_max`` None). ``tune --load``
    runs several (``n7``, ``n5``, ..., ``n0``: the draft loaded and drafting paused at every load);
    ``env``: engine environment variables of this arm's server (``benchmarks/load_arms.py``: the same
    table with and without an engine switch, side by side)."""

    name: str
    n_max: int | None = None
    cut: list[tuple[int, int]] | None = None
    env: dict[str, str] = field(default_factory=dict)
    drafted: bool = True  # False: another plain server (an engine switch both servers would get)
    # "pooled": one KV cache shared by the slots, each capped at its share (-kvu --kv-unified-per-slot),
    # instead of llama-server's own layout, -c divided among the slots, which serve runs
    layout: str | None = None


def paused_arm(n_max: int) -> DraftArm:
    """The draft loaded, no draft made at any load (``--spec-draft-n-max-by-slots 0:0``): what a
    pause costs the server, the tune table's "no draft" entry."""
    return DraftArm("n0", n_max, [(0, 0)])


# The most slots one engine runs: llama.cpp keeps one sequence a slot in a bitset of LLAMA_MAX_SEQ
# (256, src/llama-cparams.h); 100000 clients made the engine abort at start with a backtrace.
MAX_CLIENTS = 256
# The longest answer a request asks for: 32768 tokens, beyond any standard shape (256, 1024) and the
# trained context of the models served here; 10^8 ran about 14 minutes an arm before anything failed.
MAX_ANSWER_TOKENS = 32768


def load_shape(*, clients: list[int] | None, rate: list[float] | None, answer_tokens: int,
               requests_per_client: int | None, requests: int | None, seed: int, backend: str,
               temperature: float = 0.0, rounds: int = 1, conversation: bool = False,
               image_share: float = 0.0, mmproj: str | Path | None = None) -> tr.Shape:
    """The traffic asked for, validated.

    Raises:
        InvalidArgumentError: a level below 1 client or above ``MAX_CLIENTS``, a rate <= 0, both
            ``clients`` and ``rate`` as levels, an option of the other mode, counts below 1,
            answers longer than ``MAX_ANSWER_TOKENS``, or an image share outside [0, 1], above 0
            without ``mmproj`` or with ``conversation``.
    """
    if not 0 <= image_share <= 1:  # false for NaN too
        raise InvalidArgumentError(f"--image-share {image_share:g}: expected a fraction of the requests in [0, 1]")
    if image_share > 0 and not mmproj:
        raise InvalidArgumentError(f"--image-share {image_share:g}: image requests need the vision projector "
                                   "(--mmproj FILE)")
    if image_share > 0 and conversation:
        raise InvalidArgumentError("--image-share is for single requests, not --conversations")
    if not 1 <= answer_tokens <= MAX_ANSWER_TOKENS:
        raise InvalidArgumentError(f"--answer-tokens {answer_tokens}: expected 1..{MAX_ANSWER_TOKENS}")
    if clients and max(clients) > MAX_CLIENTS:
        raise InvalidArgumentError(f"--clients {max(clients)}: at most {MAX_CLIENTS} (one llama-server runs at most "
                                   f"{MAX_CLIENTS} slots: LLAMA_MAX_SEQ)")
    if not 0 <= temperature <= 100:
        raise InvalidArgumentError(f"--temperature {temperature:g}: expected 0 (greedy) to 100")
    if rounds < 1:
        raise InvalidArgumentError(f"--rounds {rounds}: expected at least 1")
    if rate:
        bad = [r for r in rate if not r > 0 or r == float("inf")]
        if bad:
            raise InvalidArgumentError(f"--rate {bad[0]}: expected requests per second > 0")
        if requests_per_client is not None:
            raise InvalidArgumentError("--requests-per-client is for closed-loop clients; with --rate give --requests")
        if conversation:
            raise InvalidArgumentError("--conversations is for closed-loop clients (each client one conversation), "
                                       "not --rate")
        if clients and len(clients) > 1:
            raise InvalidArgumentError(f"--clients {','.join(map(str, clients))}: with --rate it is one number "
                                       "(the most requests in flight), not levels")
        n = requests or tr.DEFAULT_RATE_REQUESTS
        if n < 1:
            raise InvalidArgumentError(f"--requests {n}: expected at least 1")
        cap = clients[0] if clients else None
        if cap is not None and cap < 1:
            raise InvalidArgumentError(f"--clients {cap}: expected at least 1 request in flight")
        return tr.Shape("poisson", tuple(sorted(set(rate))), answer_tokens, requests=n, temperature=temperature,
                        max_in_flight=cap if cap is not None else min(n, 64), seed=seed, rounds=rounds,
                        image_share=image_share)
    if requests is not None:
        raise InvalidArgumentError("--requests is for --rate; closed-loop clients take --requests-per-client")
    levels = sorted(set(clients or tr.CLIENTS_DEFAULTS.get(backend, tr.OTHER_CLIENTS)))
    if levels[0] < 1:
        raise InvalidArgumentError(f"--clients {levels[0]}: expected at least 1 client")
    per = tr.DEFAULT_REQUESTS_PER_CLIENT if requests_per_client is None else requests_per_client
    if per < 1:
        raise InvalidArgumentError(f"--requests-per-client {per}: expected at least 1")
    return tr.Shape("closed", tuple(levels), answer_tokens, requests_per_client=per, seed=seed,
                    temperature=temperature, rounds=rounds, conversation=conversation, image_share=image_share)


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


def _synthetic(synthetic_len: float | None, synthetic_rates: list[float] | None, n_max: int) -> Synthetic | None:
    if synthetic_len is None and not synthetic_rates:
        return None
    if synthetic_len is not None and synthetic_rates:
        raise InvalidArgumentError("--synthetic-accept and --synthetic-rates are mutually exclusive")
    if synthetic_rates:
        return Synthetic(rates=check_rates(list(synthetic_rates), n_max))
    if not 1.0 <= synthetic_len <= n_max + 1:
        raise InvalidArgumentError(f"--synthetic-accept {synthetic_len}: expected a mean length in [1, {n_max + 1}] "
                                   f"for draft length {n_max}")
    return Synthetic(length=synthetic_len)


def run_load(target: str | Path, draft: str | Path, *, clients: list[int] | None = None,
             rate: list[float] | None = None, answer_tokens: int = tr.DEFAULT_ANSWER_TOKENS,
             requests_per_client: int | None = None, requests: int | None = None, seed: int = tr.DEFAULT_SEED,
             draft_n_max: int | None = None, p_min: float | None = None, synthetic_len: float | None = None,
             synthetic_rates: list[float] | None = None, server: str | Path | None = None,
             threads: int | None = None, ctx_per_slot: int | None = None, server_args: list[str] | None = None,
             log_dir: str | Path | None = None, command: str | None = None, draft_cut: str | None = None,
             draft_arms: list[DraftArm] | None = None, interleave: bool = True, temperature: float = 0.0,
             rounds: int = 1, noise_floor: bool = False, conversation: bool = False,
             mmproj: str | Path | None = None, image_share: float = 0.0,
             progress: Progress | None = None) -> LoadReport:
    """Plain and drafted arms under the same traffic; see the module docstring.

    Args:
        clients: closed-loop levels (default per backend); with ``rate``, one number: the most
            requests in flight (default: the requests, at most 64).
        rate: Poisson arrival rates (requests/s), each a level; instead of closed-loop clients.
        requests_per_client: closed loop (default 3); ``requests``: per rate (default 32).
        ctx_per_slot: context per slot (default: an upper bound of the longest prompt, plus the answer).
        command: the command line to record in the result.
        draft_cut: ``--draft-n-max-by-slots`` for the drafted arm (``N:L,...``, L = 0 pauses drafting;
            ``off``; None: serve's for this backend and slot count).
        draft_arms: several drafted arms instead of the one ``serve`` would start, each beside the
            same plain arm (``tune --load``); ``draft_n_max`` and ``draft_cut`` then do not apply.
        temperature: 0 greedy; above, every request sampled at it (the engine's default chain), each
            with its own seed, the same on every arm.
        interleave: every arm's server up at once, each level run on every arm in turn (the order
            reversed at every other level), so a machine that slows down for a while slows all arms
            alike; False: one server at a time (arms one after another), for memory that holds one.
        rounds: every level this many times (the levels up, then down, and so on; round r with seed
            + r: another prompt order), the figures over all rounds (``traffic.pool_rounds``) and
            drafted / plain of each round's aggregate beside them, the run's own spread.
        noise_floor: a second plain server (arm ``plain2``, the same command as ``plain``) beside
            the others: plain2 / plain is the run's own noise, the band a drafted / plain ratio must
            leave to mean anything.
        conversation: closed loop: each client one conversation, its next prompt the conversation so
            far and a new message, sent with cache_prompt (chat traffic: the server reuses what it
            holds); the slots get serve's context (4096 tokens) unless ``ctx_per_slot`` says otherwise.
        mmproj: the vision projector, given to every server.
        image_share: this fraction of each level's requests carry a drawn picture (three kinds and
            sizes, ``traffic.draw_pictures``) before their text; the same requests on every arm
            (seeded); needs ``mmproj``.

    Raises:
        InvalidArgumentError: bad traffic options (before anything is loaded).
        BenchError: a draft length the draft cannot make, bad synthetic rates, a prompt longer
            than the slot's context, or a server that died or failed a request.
        InputNotFoundError, PairMismatchError, EngineError: files, pair or engine unusable.
    """
    # the options are checked before anything loads; the default levels need the backend, known after
    shape = load_shape(clients=clients, rate=rate, answer_tokens=answer_tokens, requests_per_client=requests_per_client,
                       requests=requests, seed=seed, backend="cpu", temperature=temperature, rounds=rounds,
                       conversation=conversation, image_share=image_share, mmproj=mmproj)
    devices = None
    if not clients and not rate:  # the default levels are the backend's
        devices = hardware.detect(eng.find_engine(server))
        shape = load_shape(clients=None, rate=None, answer_tokens=answer_tokens,
                           requests_per_client=requests_per_client, requests=None, seed=seed,
                           backend=devices.backend or "cpu", temperature=temperature, rounds=rounds,
                           conversation=conversation, image_share=image_share, mmproj=mmproj)
    # the decision serve would make at -np shape.slots (launch.decide: the load cut included)
    given_cut = launch.parse_draft_cut(draft_cut) if draft_cut and draft_cut.strip().lower() != "off" else None
    info, devices, decision, limits = prepare(target, draft, mmproj=mmproj, server=server, concurrency=[shape.slots],
                                              draft_n_max=draft_n_max, draft_cut=draft_cut, devices=devices)
    n_max = draft_n_max or decision.draft_n_max or limits.max_n
    for arm in draft_arms or [DraftArm("drafted", n_max)]:
        if arm.drafted and (arm.n_max or n_max) > limits.max_n:
            raise BenchError(f"draft length {arm.n_max or n_max} exceeds what {Path(draft).name} can draft "
                             f"({limits.max_n}, block size {limits.block_size})")
    if given_cut and not decision.draft_cut and not draft_arms:
        raise BenchError(f"--draft-n-max-by-slots {draft_cut}: " + ("; ".join(decision.warnings)
                                                                    or "the engine does not take it"))
    if p_min and not limits.confidence_head:
        raise BenchError(f"{draft}: has no confidence head, so --p-min must be 0 (got {p_min})")
    if noise_floor and any(a.name in ("plain", NOISE_ARM) for a in draft_arms or []):
        raise InvalidArgumentError(f"noise floor: an arm is already named {NOISE_ARM!r} or 'plain'")
    synthetic = _synthetic(synthetic_len, synthetic_rates, n_max)
    items = tr.traffic_items()
    per_slot = ctx_per_slot or tr.max_prompt_bytes(items) + answer_tokens + 16
    image_ctx = tr.IMAGE_TOKENS_MAX if image_share > 0 else 0  # context one picture takes
    if not ctx_per_slot:
        per_slot += image_ctx
    if conversation:  # turns pile up in a slot: serve's context, where a conversation starts over
        per_slot = ctx_per_slot or max(per_slot, launch.CTX_PER_SLOT)
        shape = dataclasses.replace(shape, context=per_slot)
    with log_directory(log_dir, "ggufdspark-load-") as logs:
        base = base_settings(info, target, decision=decision, mmproj=mmproj, parallel=shape.slots,
                             ctx_per_slot=per_slot, threads=threads, extra_args=server_args, draft=draft)
        # the drafted arm is the server `serve` would start (its length and load cut, launch.decide
        # gave the base both), unless --draft-n-max asked for another length; several arms: each its own
        settings = {"plain": arm_settings(base, None)}
        drafted = None  # the first drafted arm's settings, which the report names
        for arm in draft_arms or [DraftArm("drafted")]:
            if not arm.drafted:
                settings[arm.name] = _arm_server(arm, arm_settings(base, None))
                continue
            serves = arm.n_max is None and base.draft is not None
            s = arm_settings(base, draft, n_max=None if serves else arm.n_max or n_max, p_min=p_min,
                             cut=arm.cut if draft_arms else given_cut,
                             synthetic=_synthetic(synthetic_len, synthetic_rates, arm.n_max or n_max))
            settings[arm.name] = _arm_server(arm, s)
            drafted = drafted or settings[arm.name]
        drafted = drafted or settings["plain"]
        if noise_floor:
            settings[NOISE_ARM] = arm_settings(base, None)
        total = len(settings) * shape.rounds * sum(shape.n_requests(lv) for lv in shape.levels)
        done = [0]

        def tick(what: str) -> None:
            done[0] += 1
            if progress:
                progress(min(done[0], total), total, what)

        prompts: list[tr.Prompt] = []
        pictures: dict[str, tr.ImageTraffic] = {}  # per arm: its image requests (its media marker)
        drawn = tr.draw_pictures(logs / "images", seed) if image_share > 0 else []
        # per arm, per level: each round's result (pooled below)
        runs: dict[str, list[list[tr.LevelResult]]] = {a: [[] for _ in shape.levels] for a in settings}

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

        if not interleave:  # one server at a time: each arm's levels (every round), then the next arm
            for k, arm in enumerate(settings):
                log.info("arm %d/%d: %s (%s)", k + 1, len(settings), arm, logs / f"{arm}.log")
                with running(settings[arm], logs / f"{arm}.log") as c:
                    if not prompts:
                        prompts = tr.render_all(c, items)
                        _check_fits(prompts, per_slot, answer_tokens, image_ctx)
                    if drawn:
                        first = next(iter(pictures.values()), None)
                        pictures[arm] = (first.for_server(c.props().get("media_marker")) if first
                                         else tr.image_traffic(c, items, drawn, image_share))
                    _warm_up(c, prompts, pictures.get(arm))
                    for r in range(shape.rounds):
                        for i in _round_levels(len(shape.levels), r):
                            level(arm, c, i, r)
        else:  # every server up; each level runs on every arm in turn, the order reversed level by level
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

                prompts = tr.render_all(srvs["plain"].client(), items)
                _check_fits(prompts, per_slot, answer_tokens, image_ctx)
                if drawn:
                    first = tr.image_traffic(srvs["plain"].client(), items, drawn, image_share)
                    for arm in settings:
                        pictures[arm] = first.for_server(srvs[arm].client().props().get("media_marker"))
                for arm in settings:
                    on(arm, lambda c, a=arm: _warm_up(c, prompts, pictures.get(a)))
                for r in range(shape.rounds):
                    for k, i in enumerate(_round_levels(len(shape.levels), r)):
                        turn = r * len(shape.levels) + k
                        for arm in (list(settings) if turn % 2 == 0 else list(reversed(settings))):
                            on(arm, lambda c, a=arm, j=i, k=r: level(a, c, j, k))
        arms = {a: [tr.pool_rounds(rs) for rs in per_level] for a, per_level in runs.items()}
        sizes = [p.n_tokens for p in prompts]
        traffic = {"shape": shape.to_dict(), "prompts": "built-in set (text-only) + data/traffic.jsonl + composed "
                   "documents (ggufdspark.measuring.traffic)", "prompt_tokens": tr.length_stats(sizes),
                   "prompt_ids": [p.id for p in prompts],
                   "warmup": f"one {WARMUP_TOKENS}-token request, then the longest prompt ({max(sizes)} tokens, "
                             f"{WARMUP_TOKENS} tokens)" + (", then it with the largest picture" if drawn else "")
                             + " per arm, before its levels",
                   "order": ("interleaved: all arms' servers up, each level on every arm in turn, the order "
                             "reversed at every other level") if interleave else "sequential: one arm's server "
                             "and levels after another's",
                   "rounds": (f"{shape.rounds}: every level run {shape.rounds} times (the levels up, then down, "
                              "and so on), round r with seed + r; figures over all rounds' requests, aggregate = "
                              "their output tokens / the rounds' summed wall time; round_tps: each round's aggregate")
                             if shape.rounds > 1 else "1",
                   **({"images": {"share": image_share, "mmproj": str(mmproj),
                                  "pictures": [p.name for p in drawn],
                                  "how": "round(share x requests) of each level's requests, chosen by a generator "
                                         "seeded with the round's seed (the same on every arm), each a picture "
                                         "before the text of its prompt, the sizes in turn; prompt_tokens of those "
                                         "requests: the engine's count, image tokens included"}}
                      if drawn else {}),
                   "requests": "streamed /completion, " + (f"sampled at temperature {temperature:g} (the engine's "
                               "default chain, a seed a request)" if temperature > 0 else "greedy")
                               + f", prompt cache off, ignore_eos (every answer exactly {answer_tokens} tokens)"}
        return LoadReport(
            command=redact_command_line(command) if command else None,
            engine={"commit": info.commit, "version": info.version, "path": info.path, "patches": list(info.patches)},
            hardware={"backend": decision.backend, "devices": decision.devices},
            traffic=traffic,
            settings={"target": str(target), "draft": str(draft), "mmproj": str(mmproj) if mmproj else None,
                      "draft_n_max": n_max, "block_size": limits.block_size,
                      "draft_n_max_source": "--draft-n-max" if draft_n_max else "; ".join(decision.reasons),
                      "p_min": drafted.draft_p_min, "draft_cut": drafted.draft_n_max_by_slots, "slots": shape.slots,
                      "ctx_per_slot": per_slot,
                      "synthetic": asdict(synthetic) if synthetic else None,
                      "plain_command": redact_engine_args(settings["plain"].redacted()),
                      "drafted_command": redact_engine_args(drafted.redacted()),
                      **({"drafted_arms": {a.name: _arm_text(a, settings[a.name]) for a in draft_arms}}
                         if draft_arms else {}),
                      **({"noise_floor": f"{NOISE_ARM}: a second plain server, the same command as plain"}
                         if noise_floor else {})},
            synthetic=synthetic.describe() if synthetic else None, arms=arms,
            logs=kept_logs({a: str(logs / f"{a}.log") for a in settings}, log_dir), pair=pair_record(target, draft))


def _round_levels(n: int, r: int) -> list[int]:
    """The level indices of round ``r``: ascending, then descending in the next round, and so on, so
    that no round starts at the quietest level right after the busiest one (a server that has just
    served the most clients is still saving their slots to its prompt cache: on the H200 the first
    request after a 64-client level once ran at half speed)."""
    return list(range(n)) if r % 2 == 0 else list(reversed(range(n)))


def _arm_server(arm: DraftArm, s: ServerSettings) -> ServerSettings:
    """``s`` with ``arm``'s engine variables and KV layout."""
    return replace(s.pooled() if arm.layout == "pooled" else s, env=dict(arm.env))


def _arm_text(arm: DraftArm, s) -> str:
    env = "".join(f", {k}={v}" for k, v in sorted(s.env.items()))
    if arm.layout == "pooled":
        env += ", one KV cache shared by the slots"
    if not arm.drafted:
        return "plain" + env
    cut = s.draft_n_max_by_slots
    if cut == [(0, 0)]:
        return "the draft loaded, drafting paused at every load (--spec-draft-n-max-by-slots 0:0)"
    return f"draft length {s.draft_n_max}" + (f", cut {','.join(f'{n}:{k}' for n, k in cut)}" if cut else "") + env


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


