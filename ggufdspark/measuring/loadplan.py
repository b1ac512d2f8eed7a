"""``bench --load``'s plan: everything decided before the first server starts.

``plan_load`` checks the traffic options (``load_shape``), the pair and the engine, decides as
``serve`` would at the slots the traffic needs (``measure.prepare``: ``launch.decide``, the load cut
included), and builds every arm's server from one base (``measure.base_settings`` /
``arm_settings``): the target alone, then the target with the DSpark draft as ``serve`` starts it
(or several drafted arms: ``DraftArm``, ``tune --load``), and with ``noise_floor`` a second plain
server. ``loadbench`` runs the plan; nothing in it is decided again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from pathlib import Path

from ggufdspark import engine as eng
from ggufdspark import hardware, launch
from ggufdspark.errors import BenchError, InvalidArgumentError
from ggufdspark.measuring import prompts as pr
from ggufdspark.measuring import traffic as tr
from ggufdspark.measuring.loadreport import NOISE_ARM
from ggufdspark.measuring.measure import DraftLimits, Synthetic, arm_settings, base_settings, check_rates, prepare
from ggufdspark.runners.server import ServerSettings
from ggufdspark.serve_checks import ServingOptions


@dataclass(frozen=True)
class DraftArm:
    """One drafted arm of a load run: its name, draft length (None: serve's, with serve's load cut)
    and load cut (``[(N, L), ...]``; None: none, or serve's with ``n_max`` None). ``tune --load``
    runs several (``n7``, ``n5``, ..., ``n0``: the draft loaded and drafting paused at every load);
    ``env``: engine environment variables of this arm's server (``benchmarks/serving.py arms``: the same
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
# --prompt-scale: the set's longest prompt (2705 tokens) 8 times over still fits a 32k-token slot
MAX_PROMPT_SCALE = 8


def load_shape(*, clients: list[int] | None, rate: list[float] | None, answer_tokens: int,
               requests_per_client: int | None, requests: int | None, seed: int, backend: str,
               temperature: float = 0.0, rounds: int = 1, conversation: bool = False,
               image_share: float = 0.0, mmproj: str | Path | None = None, prompt_scale: int = 1) -> tr.Shape:
    """The traffic asked for, validated.

    Raises:
        InvalidArgumentError: a level below 1 client or above ``MAX_CLIENTS``, a rate <= 0, both
            ``clients`` and ``rate`` as levels, an option of the other mode, counts below 1,
            answers longer than ``MAX_ANSWER_TOKENS``, or an image share outside [0, 1], above 0
            without ``mmproj`` or with ``conversation``, a prompt scale outside 1..``MAX_PROMPT_SCALE``.
    """
    if not 1 <= prompt_scale <= MAX_PROMPT_SCALE:
        raise InvalidArgumentError(f"--prompt-scale {prompt_scale}: expected 1 (the set as it is) to "
                                   f"{MAX_PROMPT_SCALE}")
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
                        image_share=image_share, prompt_scale=prompt_scale)
    if requests is not None:
        raise InvalidArgumentError("--requests is for --rate; closed-loop clients take --requests-per-client")
    levels = sorted(set(clients or tr.CLIENTS_DEFAULTS.get(backend, tr.OTHER_CLIENTS)))
    if levels[0] < 1:
        raise InvalidArgumentError(f"--clients {levels[0]}: expected at least 1 client")
    per = tr.DEFAULT_REQUESTS_PER_CLIENT if requests_per_client is None else requests_per_client
    if per < 1:
        raise InvalidArgumentError(f"--requests-per-client {per}: expected at least 1")
    return tr.Shape("closed", tuple(levels), answer_tokens, requests_per_client=per, seed=seed,
                    temperature=temperature, rounds=rounds, conversation=conversation, image_share=image_share,
                    prompt_scale=prompt_scale)


def synthetic_acceptance(synthetic_len: float | None, synthetic_rates: list[float] | None,
                         n_max: int) -> Synthetic | None:
    """The synthetic acceptance asked for at draft length ``n_max`` (None: real acceptance).

    Raises:
        InvalidArgumentError: both given, or a mean length outside [1, n_max + 1].
        BenchOptionError: bad rates (``measure.check_rates``).
    """
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


@dataclass(frozen=True)
class LoadPlan:
    """A load run decided: the traffic, the engine and the decision ``serve`` would make, the prompt
    set, each slot's context and every arm's server (``settings``, plain first; ``drafted``: the
    first drafted arm's, which the report names)."""

    opts: ServingOptions  # the pair, the engine and the server's options, as given
    shape: tr.Shape
    engine: eng.EngineInfo
    decision: hardware.Decision
    limits: DraftLimits
    n_max: int  # the drafted arm's draft length
    synthetic: Synthetic | None
    items: list[pr.PromptItem]
    per_slot: int  # context a slot
    image_ctx: int  # context one picture takes (0: no pictures)
    settings: dict[str, ServerSettings]
    drafted: ServerSettings
    draft_arms: list[DraftArm] | None = None  # several drafted arms (tune --load), None: serve's one
    noise_floor: bool = False
    interleave: bool = True


def plan_load(opts: ServingOptions, *, clients: list[int] | None = None, rate: list[float] | None = None,
              answer_tokens: int = tr.DEFAULT_ANSWER_TOKENS, requests_per_client: int | None = None,
              requests: int | None = None, seed: int = tr.DEFAULT_SEED, p_min: float | None = None,
              synthetic_len: float | None = None, synthetic_rates: list[float] | None = None,
              draft_arms: list[DraftArm] | None = None, interleave: bool = True, temperature: float = 0.0,
              rounds: int = 1, noise_floor: bool = False, conversation: bool = False,
              image_share: float = 0.0, prompt_scale: int = 1) -> LoadPlan:
    """Decide a load run: plain and drafted arms under the same traffic (``loadbench.run_load``
    runs it); nothing is started.

    Args:
        opts: the pair (``model``, ``draft``, ``mmproj``: files; the vision projector goes to every
            server), the engine and the server's options: ``draft_n_max``; ``draft_n_max_by_slots``,
            the drafted arm's load cut (``N:L,...``, L = 0 pauses drafting; ``off``; None: serve's
            for this backend and slot count); ``ctx_per_slot`` (default: an upper bound of the
            longest prompt, plus the answer); ``threads``; ``extra_args`` for every server.
            ``serve``'s own options are refused (``ServingOptions.check_measured``).
        clients: closed-loop levels (default per backend); with ``rate``, one number: the most
            requests in flight (default: the requests, at most 64).
        rate: Poisson arrival rates (requests/s), each a level; instead of closed-loop clients.
        requests_per_client: closed loop (default 3); ``requests``: per rate (default 32).
        draft_arms: several drafted arms instead of the one ``serve`` would start, each beside the
            same plain arm (``tune --load``); ``opts.draft_n_max`` and its load cut then do
            not apply.
        temperature: 0 greedy; above, every request sampled at it (the engine's default chain), each
            with its own seed, the same on every arm.
        interleave: every arm's server up at once, each level run on every arm in turn (the order
            reversed at every other level), so a machine that slows down for a while slows all arms
            alike; False: one server at a time (arms one after another), for memory that holds one.
        p_min: the drafted arms' confidence threshold (``--spec-draft-p-min``; None: the decision's).
        synthetic_len, synthetic_rates: synthetic acceptance (speed only): a mean accept length, or
            per-position rates (truncated to each arm's draft length).
        rounds: every level this many times (the levels up, then down, and so on; round r with seed
            + r: another prompt order), the figures over all rounds (``loadreport.pool_rounds``) and
            drafted / plain of each round's aggregate beside them, the run's own spread.
        noise_floor: a second plain server (arm ``plain2``, the same command as ``plain``) beside
            the others: plain2 / plain is the run's own noise, the band a drafted / plain ratio must
            leave to mean anything.
        conversation: closed loop: each client one conversation, its next prompt the conversation so
            far and a new message, sent with cache_prompt (chat traffic: the server reuses what it
            holds); the slots get serve's context (4096 tokens) unless ``ctx_per_slot`` says otherwise.
        image_share: this fraction of each level's requests carry a drawn picture (three kinds and
            sizes, ``traffic.draw_pictures``) before their text; the same requests on every arm
            (seeded); needs ``mmproj``.
        prompt_scale: every prompt this many times as long (``traffic.scaled_items``: its text
            preceded by the next ``prompt_scale - 1`` prompts' of the set), the rest of the traffic
            the same.

    Raises:
        InvalidArgumentError: bad traffic options (before anything is loaded).
        BenchError: a draft length the draft cannot make, a load cut the engine does not take,
            ``p_min`` for a draft without a confidence head, bad synthetic rates, one of ``serve``'s
            own options (``ServingOptions.check_measured``).
        InputNotFoundError, PairMismatchError, EngineError: files, pair or engine unusable.
    """
    opts.check_measured("bench --load")
    draft, mmproj, draft_n_max, draft_cut = opts.draft, opts.mmproj, opts.draft_n_max, opts.draft_n_max_by_slots
    # the options are checked before anything loads; the default levels need the backend, known after
    shape = load_shape(clients=clients, rate=rate, answer_tokens=answer_tokens, requests_per_client=requests_per_client,
                       requests=requests, seed=seed, backend="cpu", temperature=temperature, rounds=rounds,
                       conversation=conversation, image_share=image_share, mmproj=mmproj, prompt_scale=prompt_scale)
    devices = None
    if not clients and not rate:  # the default levels are the backend's
        devices = hardware.detect(eng.find_engine(opts.server))
        shape = load_shape(clients=None, rate=None, answer_tokens=answer_tokens,
                           requests_per_client=requests_per_client, requests=None, seed=seed,
                           backend=devices.backend or "cpu", temperature=temperature, rounds=rounds,
                           conversation=conversation, image_share=image_share, mmproj=mmproj, prompt_scale=prompt_scale)
    # the decision serve would make at -np shape.slots (launch.decide: the load cut included)
    given_cut = launch.parse_draft_cut(draft_cut) if draft_cut and draft_cut.strip().lower() != "off" else None
    info, devices, decision, limits = prepare(opts, concurrency=[shape.slots], devices=devices)
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
    synthetic = synthetic_acceptance(synthetic_len, synthetic_rates, n_max)
    items = tr.scaled_items(tr.traffic_items(), shape.prompt_scale)
    per_slot = opts.ctx_per_slot or tr.max_prompt_bytes(items) + answer_tokens + 16
    image_ctx = tr.IMAGE_TOKENS_MAX if image_share > 0 else 0  # context one picture takes
    if not opts.ctx_per_slot:
        per_slot += image_ctx
    if conversation:  # turns pile up in a slot: serve's context, where a conversation starts over
        per_slot = opts.ctx_per_slot or max(per_slot, launch.CTX_PER_SLOT)
        shape = dataclasses.replace(shape, context=per_slot)
    base = base_settings(info, dataclasses.replace(opts, ctx_per_slot=per_slot), decision=decision,
                         parallel=shape.slots)
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
                         synthetic=synthetic_acceptance(synthetic_len, synthetic_rates, arm.n_max or n_max))
        settings[arm.name] = _arm_server(arm, s)
        drafted = drafted or settings[arm.name]
    if noise_floor:
        settings[NOISE_ARM] = arm_settings(base, None)
    return LoadPlan(opts, shape, info, decision, limits, n_max, synthetic, items, per_slot, image_ctx, settings,
                    drafted or settings["plain"], draft_arms, noise_floor, interleave)


def _arm_server(arm: DraftArm, s: ServerSettings) -> ServerSettings:
    """``s`` with ``arm``'s engine variables and KV layout."""
    return replace(s.pooled() if arm.layout == "pooled" else s, env=dict(arm.env))


def arm_text(arm: DraftArm, s: ServerSettings) -> str:
    """One line on what a drafted arm of several runs (the report's ``drafted_arms``)."""
    env = "".join(f", {k}={v}" for k, v in sorted(s.env.items()))
    if arm.layout == "pooled":
        env += ", one KV cache shared by the slots"
    if not arm.drafted:
        return "plain" + env
    cut = s.draft_n_max_by_slots
    if cut == [(0, 0)]:
        return "the draft loaded, drafting paused at every load (--spec-draft-n-max-by-slots 0:0)"
    return f"draft length {s.draft_n_max}" + (f", cut {','.join(f'{n}:{k}' for n, k in cut)}" if cut else "") + env
