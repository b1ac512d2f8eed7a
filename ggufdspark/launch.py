"""The one seam from a serving decision to llama-server's command line.

``serve``, ``bench``, ``tune``, ``publish``'s model card and the scripts in ``benchmarks/`` all go
through here, so a user who runs ``bench`` to decide whether to ``serve`` measures the server
``serve`` would start:

1. ``decide`` turns the devices, the engine build (its patches), a tune profile (its draft length,
   load cut and ``p_min``) and the user's options into the final ``hardware.Decision``, once;
   nothing changes it afterwards.
2. ``context`` sizes ``-c`` so that every slot gets a usable context (llama-server divides ``-c``
   among the ``-np`` slots).
3. ``server_settings`` builds the ``ServerSettings`` of that decision, every flag of it; ``serve``
   adds only what is no engine setting (the chat UI's ``--path``). ``without_draft`` gives the
   same server without the draft (bench's and tune's plain arm) and ``with_draft`` one with
   another draft length (what ``serve --draft-n-max N`` would run). Synthetic acceptance flags,
   and a ``p_min`` asked for by ``bench --p-min`` or swept by ``tune``, are added by ``measure`` alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark import decide_notes, hardware
from ggufdspark.devices import DeviceReport
from ggufdspark.engine import EngineInfo
from ggufdspark.errors import InvalidArgumentError
from ggufdspark.gguffile.constants import Key
from ggufdspark.gguffile.reader import GGUFFile, read_gguf
from ggufdspark.quants import is_quantized_file, is_quantized_tag
from ggufdspark.runners.server import ServerSettings
from ggufdspark.runners.tensor_overrides import env_override_args, overrides_token_table

log = logging.getLogger(__name__)

# Accepted draft lengths, shared by the CLI's option types and the Python API.
DRAFT_N_MAX_RANGE = (1, 64)


# --------------------------------------------------------------------------- the decision


def parse_draft_cut(text: str) -> list[tuple[int, int]]:
    """``"2:5,8:3,16:0"`` -> ``[(2, 5), (8, 3), (16, 0)]``: with more than N slots busy (processing a
    prompt or generating: engine patch 0021), drafts of at most L tokens, L = 0 no new drafts
    (``--spec-draft-n-max-by-slots``, engine patch 0021).

    Raises:
        InvalidArgumentError: not N:L pairs of integers, N not ascending from 0, or L outside
            0..the longest draft length.
    """
    steps: list[tuple[int, int]] = []
    for item in (x.strip() for x in text.split(",")):
        n, sep, length = item.partition(":")
        try:
            step = (int(n), int(length)) if sep else None
        except ValueError:
            step = None
        if step is None or step[0] < 0 or (steps and step[0] <= steps[-1][0]) \
                or not 0 <= step[1] <= DRAFT_N_MAX_RANGE[1]:
            raise InvalidArgumentError(f"draft_n_max_by_slots {text!r}: {item!r} is not N:L (N >= 0 ascending, "
                                       f"L 0..{DRAFT_N_MAX_RANGE[1]}, 0: no draft)")
        steps.append(step)
    return steps


def _cut_text(cut: list[tuple[int, int]]) -> str:
    return ", ".join(f"to {k} above {n} busy slots" if k else f"paused above {n} busy slots"
                     for n, k in cut)


def decide(devices: DeviceReport, engine: EngineInfo | None, *, profile: dict | None = None,
           draft_n_max: int | None = None, no_draft: bool = False, parallel: int | None = 1,
           draft_cut: str | None = None, precision_note: str | None = None,
           measuring: bool = False, draft_max: int | None = None,
           no_draft_why: str = "--no-draft given") -> hardware.Decision:
    """The final serving decision: table default < tune profile < explicit arguments, then what
    this ``engine`` build can do (its patches: ``hardware.has_patch``).

    Args:
        devices: what the engine sees (``hardware.detect``); its ``backend`` picks the table row.
        engine: the build; None (a model card's line, for any llama-server) means no patch known.
        profile: a tune profile (``profiles.load_profile``): its draft length with its load cut
            and its ``p_min`` (``--spec-draft-p-min``, applied with that length only), or drafting
            off (everywhere, or above ``max_concurrency_for_draft`` parallel requests).
        draft_cut: ``--draft-n-max-by-slots`` as given (``N:L,...`` or ``off``); None: the table's
            cut for this backend, which goes with the table's draft length only.
        precision_note: the check report's note on the draft's precision (said on CUDA).
        measuring: for bench and tune, which need their drafted arm: a tune profile that turns
            drafting off here is said in the reasons, not followed.
        draft_max: the longest draft this drafter makes (its block: ``draft_block``); a
            table or profile length above it is cut to it (said in the reasons), a ``draft_n_max``
            given is not (the engine clamps it).
        no_draft_why: the reason said for ``no_draft`` (``serve`` says why there is no draft
            file when the user never gave ``--no-draft``).

    Returns:
        The ``hardware.Decision``; ``warnings`` holds what was asked for and cannot be done here.

    Raises:
        InvalidArgumentError: a malformed ``draft_cut``.
    """
    cut_off = (draft_cut or "").strip().lower() == "off"
    given_cut = parse_draft_cut(draft_cut) if draft_cut and not cut_off else None
    cut_source = "--draft-n-max-by-slots"
    backend = devices.backend or "cpu"
    base = hardware.DEFAULTS.get(backend, hardware.OTHER_GPU)
    d = hardware.Decision(backend, True, base.draft_n_max, base.offload, base.flash_attn,
                          [f"default for {base.source}"], [asdict(x) for x in devices.devices])
    table_length = True  # the table's load cut was measured with the table's length only
    if devices.errors:
        d.reasons.append("device detection: " + "; ".join(devices.errors))
    best = (profile or {}).get("recommendation") or {}
    if profile:
        if best.get("draft_enabled") is False:
            d.draft_enabled = measuring
            d.reasons.append(f"tune profile {profile.get('path', '')}: drafting turned off "
                             f"({best.get('why', 'it measured slower than no draft')})"
                             + ("; measured with the draft all the same" if measuring else ""))
        elif best.get("draft_n_max"):
            d.draft_n_max, table_length = int(best["draft_n_max"]), False
            d.reasons.append(f"tune profile {profile.get('path', '')}: draft length {d.draft_n_max} measured fastest")
            if best.get("load_cut") and not given_cut and draft_n_max is None:  # tune --load's, with its length
                given_cut, draft_cut, cut_source = [tuple(x) for x in best["load_cut"]], "tune profile", "tune --load"
    cap = best.get("max_concurrency_for_draft") if best.get("draft_enabled") is not False else None
    if d.draft_enabled and cap is not None and parallel is not None and parallel > int(cap):
        # what tune measured is drafting at every load against none
        d.draft_enabled = measuring
        d.reasons.append(f"tune profile: drafting stops paying above {cap} parallel request(s) on this "
                         f"machine and {parallel} slots were asked for; "
                         + ("measured with the draft all the same" if measuring else "serving without the draft"))
    if draft_n_max is None and draft_max and d.draft_n_max and d.draft_n_max > draft_max:
        d.reasons.append(f"the draft makes at most {draft_max} tokens a step (its block): draft length {draft_max} "
                         f"instead of {d.draft_n_max}")
        d.draft_n_max = draft_max  # the table's load cut still applies: it bounds drafts by load
    if draft_n_max is not None:
        d.draft_n_max, d.draft_enabled, table_length = draft_n_max, True, False
        d.reasons.append(f"--draft-n-max {draft_n_max} given")
    if no_draft:
        d.draft_enabled = False
        d.reasons.append(no_draft_why)
    if d.backend == "cuda" and d.draft_enabled and precision_note:
        d.reasons.append(f"draft precision: {precision_note}")
    if d.draft_enabled and profile and best.get("draft_enabled") is not False:
        d.draft_p_min = decide_notes.profile_p_min(d, best, profile.get("path", ""), draft_n_max)
    if d.draft_enabled and not cut_off:
        d.draft_cut = _load_cut(d, engine, given_cut, draft_cut, list(base.draft_cut or ()) if table_length else None,
                                parallel or 1, source=cut_source)
    if d.draft_enabled and base.draft_ubatch and hardware.has_patch(engine, hardware.DRAFT_UBATCH):
        d.draft_ubatch = base.draft_ubatch
        d.reasons.append(f"default for {d.backend}: the drafter takes up to {base.draft_ubatch} processed rows a step "
                         f"in one decode (--spec-draft-ubatch {base.draft_ubatch}, engine patch 0037)")
    if base.token_table_on_device and d.offload:
        decide_notes.token_table(d, devices)
    if d.backend == "cuda" and (parallel or 1) > hardware.CUDA_GRAPHS_MAX_SLOTS:
        decide_notes.cuda_graphs_note(d, engine, parallel or 1)
    return d


def draft_block(draft: str | Path | GGUFFile) -> tuple[int, int] | None:
    """The drafter's trained block size and the longest draft llama.cpp makes with it, from its GGUF
    (a path, or the file already read; an anchor-first DSpark draft yields ``block_size`` tokens,
    otherwise ``block_size - 1``: ``common/speculative.cpp``, ``n_draft_max``; longer requests are
    clamped by the engine), or None without a ``dflash.block_size`` key."""
    g = draft if isinstance(draft, GGUFFile) else read_gguf(draft)
    bs = g.get(Key.BLOCK_SIZE)
    if not bs:
        return None
    return int(bs), int(bs) if g.get(Key.SAMPLE_FROM_ANCHOR) in (None, True) else int(bs) - 1


def longest_draft(draft: str | Path | None) -> int | None:
    """``decide``'s ``draft_max`` for a draft file: the longest draft it makes (``draft_block``), or
    None without a file or a block."""
    block = draft_block(draft) if draft else None
    return block[1] if block else None


def _load_cut(d: hardware.Decision, engine: EngineInfo | None, given: list[tuple[int, int]] | None,
              text: str | None, table: list[tuple[int, int]] | None, parallel: int, *,
              source: str = "--draft-n-max-by-slots") -> list[tuple[int, int]] | None:
    """The --spec-draft-n-max-by-slots steps to run with: the ones given, else the table's when
    they can engage; reasons and warnings go to ``d``. A pause step (L = 0) needs an engine whose
    0021 takes it (``EngineInfo.draft_pause``); with any other it is dropped, said as a warning."""
    has_patch = hardware.has_patch(engine, hardware.DRAFT_CUT_BY_LOAD)
    can_pause = bool(engine and engine.draft_pause)
    if not given:
        steps = [st for st in table or () if st[1] or can_pause]
        if has_patch and table and len(steps) < len(table) and table[0][0] < parallel:
            where = engine.path if engine else "this llama-server"
            d.warnings.append(f"the {d.backend} default pauses drafts under load ({_cut_text(table)}), but {where} "
                              "cannot pause (its patch 0021 predates L = 0: ggufdspark build-engine), so drafts go on "
                              "at every load")
        table = steps
        if not (table and table[0][0] < parallel and has_patch):
            return None
        d.reasons.append(f"default for {d.backend}: drafts cut by load {_cut_text(table)} "
                         "(--draft-n-max-by-slots off keeps every draft at n_max)")
        return table
    what = f"--draft-n-max-by-slots {text}" if source == "--draft-n-max-by-slots" else f"the {source} load cut"
    if not has_patch:
        where = engine.path if engine else "this llama-server"
        d.warnings.append(f"{what}: {where} cannot cut drafts by load "
                          f"(engine patch 0021); every draft stays at n_max {d.draft_n_max}")
        return None
    if not can_pause and any(length == 0 for _, length in given):
        where = engine.path if engine else "this llama-server"
        d.warnings.append(f"{what}: {where} cannot pause drafting (L = 0; its patch 0021 predates it: "
                          "ggufdspark build-engine), so drafts go on above those loads")
        given = [st for st in given if st[1]]
        if not given:
            return None
    if given[0][0] >= parallel:
        if source == "--draft-n-max-by-slots":  # a profile's cut that cannot engage at this -np is no mistake
            d.warnings.append(f"{what}: never more than {parallel} slots are busy (-np), so no draft is ever cut")
        return None
    d.reasons.append(f"drafts cut by load ({source}): {_cut_text(given)}")
    return given


# --------------------------------------------------------------------------- the context


# Tokens of context each slot gets by default: a long chat turn or a few-page document, at a KV
# cost that even 32 slots of the 3B target on one GPU carry.
CTX_PER_SLOT = 4096
# Below this many tokens a slot, a given -c earns a warning: a first chat prompt does not fit.
MIN_CTX_PER_SLOT = 1024
# llama.cpp pads -c, and each slot's share, up to a multiple of 256 (src/llama-context.cpp).
CTX_PAD = 256


def _pad(n: int) -> int:
    return (n + CTX_PAD - 1) // CTX_PAD * CTX_PAD


@dataclass(frozen=True)
class Context:
    """The context llama-server gets (``total``: its ``-c``) and what each of its ``parallel``
    slots holds (``per_slot``: the engine's ``n_ctx_slot``; None where unknown: ``-c 0`` for a
    model only the Hub has). ``trained``: the model's ``<arch>.context_length`` (None: unread).
    ``warnings`` are not in ``to_dict`` (``serve``'s plan lists them with its own)."""

    total: int | None
    per_slot: int | None
    parallel: int
    trained: int | None
    why: str
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["warnings"]
        return d


def trained_context(model: str | Path | None) -> int | None:
    """The target's trained context (GGUF ``<arch>.context_length``), or None without a file or key."""
    if not model:
        return None
    return read_gguf(model).get_int(Key.CONTEXT_LENGTH) or None


def slot_context(total: int, parallel: int, trained: int | None, *, unified: bool = False,
                 cap: int | None = None) -> int | None:
    """What each slot holds with ``-c total -np parallel``, as the pinned engine computes it:
    ``-c 0`` gives each slot the trained context (``common/fit.cpp`` sizes ``-c`` to it times the
    slots, less where free memory is short); otherwise ``-c`` and its share per slot are padded to
    256 (with a unified KV cache, ``-kvu``, a slot may fill the whole ``-c``, or ``cap`` tokens with
    ``--kv-unified-per-slot cap``); capped by the trained context (``server_context::n_ctx_slot``)."""
    if total == 0:
        return trained
    per = _pad(total) if unified or cap else _pad(_pad(total) // max(parallel, 1))
    if cap:
        per = min(per, cap)
    return min(per, trained) if trained else per


# llama-server flags for one KV cache shared by every slot (common/arg.cpp)
UNIFIED_KV_FLAGS = ("-kvu", "--kv-unified")
# the flag that caps each slot of a unified KV cache (the pinned engine's common/arg.cpp)
KV_SLOT_CAP_FLAG = "--kv-unified-per-slot"


def context(parallel: int | None, *, model: str | Path | None = None, ctx_size: int | None = None,
            ctx_per_slot: int | None = None, extra_args: list[str] | None = None) -> Context:
    """Size ``-c`` for ``parallel`` slots.

    By default each slot gets ``CTX_PER_SLOT`` tokens, or the model's trained context where that
    is smaller (``-c`` = that x slots). ``ctx_per_slot`` asks for another share; ``ctx_size`` is
    the user's total, which llama-server divides among the slots (warned about below
    ``MIN_CTX_PER_SLOT`` a slot) unless ``extra_args`` ask for a unified KV cache (``-kvu``),
    where any slot may fill it.

    Raises:
        InvalidArgumentError: both given, or a value below 0 (``ctx_per_slot`` below 1).
    """
    n = parallel or 1
    if ctx_size is not None and ctx_per_slot is not None:
        raise InvalidArgumentError(f"ctx_size {ctx_size} and ctx_per_slot {ctx_per_slot}: give one of them")
    for name, value, lo in (("ctx_size", ctx_size, 0), ("ctx_per_slot", ctx_per_slot, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < lo):
            raise InvalidArgumentError(f"{name} {value!r}: expected an integer >= {lo}")
    trained = trained_context(model)
    unified = any(a in UNIFIED_KV_FLAGS for a in extra_args or ())
    warnings: list[str] = []
    if ctx_size is not None:
        per = slot_context(ctx_size, n, trained, unified=unified)
        if ctx_size == 0:
            why = "-c 0 (given): the model's trained context a slot, -c sized by llama-server to fit free memory"
        else:
            shared = "shared by the slots (-kvu)" if unified else f"divided among {n} slot(s)"
            why = f"-c {ctx_size} (given), {shared}"
        if per is not None and per < MIN_CTX_PER_SLOT:
            warnings.append(f"-c {ctx_size} is llama-server's whole context, divided among the {n} slots (-np): "
                            f"{per} tokens a slot, and a longer prompt is refused; --ctx-per-slot "
                            f"{CTX_PER_SLOT} gives each slot {CTX_PER_SLOT}")
        return Context(ctx_size, per, n, trained, why, tuple(warnings))
    if ctx_per_slot is not None:
        per, why = ctx_per_slot, f"{ctx_per_slot} tokens a slot (given)"
        if trained and per > trained:
            warnings.append(f"--ctx-per-slot {ctx_per_slot} is more than the model was trained for ({trained}); "
                            f"each slot gets {trained}")
            per, why = trained, f"the model's trained context, {trained} tokens a slot (below --ctx-per-slot)"
    elif trained and trained < CTX_PER_SLOT:
        per, why = trained, f"the model's trained context, {trained} tokens a slot (below the default {CTX_PER_SLOT})"
    else:
        per, why = CTX_PER_SLOT, f"{CTX_PER_SLOT} tokens a slot (default)"
    if unified:
        why += "; one KV cache shared by the slots (-kvu): a slot may hold up to all of -c"
    return Context(per * n, slot_context(per * n, n, trained, unified=unified), n, trained, why, tuple(warnings))


# --------------------------------------------------------------------------- the settings


def server_settings(decision: hardware.Decision, engine: EngineInfo | None, *, server: str | Path | None = None,
                    model: str | Path | None = None, draft: str | Path | None = None,
                    mmproj: str | Path | None = None, hf: str | None = None, hfd: str | None = None,
                    host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                    ctx: Context | None = None, parallel: int | None = 1, threads: int | None = None,
                    metrics: bool = True, extra_args: list[str] | None = None,
                    quantized: bool | None = None) -> ServerSettings:
    """The llama-server of ``decision``: the draft (``draft`` / ``hfd``) when it drafts, offload,
    flash attention, the load cut, the context ``ctx`` (None: no ``-c``), the engine's workarounds
    for this backend (``hardware.engine_workarounds``), then ``extra_args``, then the token table's
    override (``decision.token_table_device``), left off where ``extra_args`` or the environment's
    ``LLAMA_ARG_OVERRIDE_TENSOR`` override that tensor themselves (the loader takes the first
    override that matches; the environment's come first).

    ``server`` defaults to ``engine.path``. ``quantized`` (for the workarounds) defaults to whether
    a file or Hub tag served is quantized; True where a quantized file joins later (a benchmark's
    drafted arms).
    """
    drafting = decision.draft_enabled and bool(draft or hfd)
    if quantized is None:
        quantized = (any(p and is_quantized_file(p) for p in (model, draft if drafting else None))
                     or any(r and is_quantized_tag(r) for r in (hf, hfd if drafting else None)))
    s = ServerSettings(
        server=server or (engine.path if engine else "llama-server"), model=model, mmproj=mmproj, hf_repo=hf,
        host=host, port=port, api_key=api_key, spec_type=None, draft_n_min=None,
        n_gpu_layers=hardware.OFFLOAD_ALL_LAYERS if decision.offload else None, flash_attn=decision.flash_attn,
        token_table_device=None if overrides_token_table(list(extra_args or []) + env_override_args(os.environ))
        else decision.token_table_device,
        ctx_size=ctx.total if ctx else None, parallel=parallel, threads=threads, metrics=metrics,
        draft_ubatch=decision.draft_ubatch,  # on the command line only with a draft
        extra_args=hardware.engine_workarounds(decision.backend, parallel, engine, quantized=quantized)
        + list(extra_args or []))
    if not drafting:
        return s
    return with_draft(s, draft, decision.draft_n_max, hf_draft=hfd, cut=decision.draft_cut,
                      p_min=decision.draft_p_min)


def with_draft(settings: ServerSettings, draft: str | Path | None, n_max: int | None, *,
               hf_draft: str | None = None, cut: list[tuple[int, int]] | None = None,
               ubatch: int | None = None, p_min: float | None = None) -> ServerSettings:
    """``settings`` with the DSpark draft at length ``n_max`` (and the load ``cut``, if any): the
    draft flags as ``serve`` writes them (``--spec-type draft-dspark``, ``--spec-draft-n-min 0``,
    ``-ngld`` when the target is offloaded, ``--spec-draft-ubatch`` and ``--spec-draft-p-min`` as
    ``ubatch`` and ``p_min`` or ``settings`` give them)."""
    return dataclasses.replace(
        settings, draft=draft, hf_draft=hf_draft, spec_type="draft-dspark", draft_n_max=n_max, draft_n_min=0,
        draft_n_max_by_slots=list(cut) if cut else None,
        draft_ubatch=ubatch if ubatch is not None else settings.draft_ubatch,
        draft_p_min=p_min if p_min is not None else settings.draft_p_min,
        n_gpu_layers_draft=hardware.OFFLOAD_ALL_LAYERS if settings.n_gpu_layers is not None else None,
        extra_args=list(settings.extra_args))


def without_draft(settings: ServerSettings) -> ServerSettings:
    """The same server without the draft (every draft flag cleared, the rest unchanged: offload,
    the token table's place and ``extra_args`` are the hardware's, not the draft's)."""
    return dataclasses.replace(
        settings, draft=None, hf_draft=None, spec_type=None, draft_n_max=None, draft_n_min=None, draft_p_min=None,
        draft_n_max_by_slots=None, n_gpu_layers_draft=None, synth_len=None, synth_rates=None,
        extra_args=list(settings.extra_args))


def table_decision(backend: str, engine: EngineInfo | None = None) -> hardware.Decision:
    """The decision for a backend of ``hardware.DEFAULTS`` on no particular machine (a model card's
    line, benchmarks run with ``--gpu``); with ``engine``, what that build adds as ``serve`` would
    (the drafter's n_ubatch where it has patch 0037, the load cut where it has 0021), no tune profile."""
    return decide(DeviceReport(backend=backend), engine, parallel=None)
