"""Per-hardware defaults for serving a DSpark pair, as a table with where each number comes from;
the engine's workarounds per backend; the ``Decision`` record (made by ``ggufdspark.launch.decide``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from ggufdspark.bindings import probe_devices
from ggufdspark.devices import DeviceReport
from ggufdspark.engine import EngineInfo

log = logging.getLogger(__name__)


# -ngl / -ngld value that puts every layer of a model on the GPU (llama.cpp clamps it to the model's)
OFFLOAD_ALL_LAYERS = 99


@dataclass(frozen=True)
class BackendDefaults:
    draft_n_max: int
    offload: bool  # -ngl / -ngld OFFLOAD_ALL_LAYERS
    flash_attn: str | None  # "-fa on" on GPUs
    source: str  # why this number
    # drafts cut to L tokens while more than N slots are busy (engine patch 0021,
    # --spec-draft-n-max-by-slots), with the table's draft length only. None: no cut.
    draft_cut: tuple[tuple[int, int], ...] | None = None
    # the drafter's n_ubatch (engine patch 0037, --spec-draft-ubatch): a server step's processed rows
    # go into the drafter in one decode. None: the target's -ub.
    draft_ubatch: int | None = None
    # the target's token embedding table on the GPU (-ot token_embd\.weight=CUDA0): the pinned
    # llama.cpp keeps the input layer on the CPU (src/llama-model.cpp), so every decode's get_rows runs
    # there and its rows are copied up; the DSpark drafter borrows the target's table and follows it.
    token_table_on_device: bool = False


# The draft length per backend. Overridden by a tune profile, and by --draft-n-max.
DEFAULTS: dict[str, BackendDefaults] = {
    # Measured on one H200 with the patched engine (docs/benchmarks.md), full-size LFM2.5-VL-3B-shaped
    # pair, published acceptance profile. Length 7: at one request it beat 5 in four runs (2.01-2.09x
    # against 1.80-1.90x, engine 0001-0024). The load cut, under bench --load's traffic (closed-loop
    # clients, prompts of 35-2705 tokens, 256-token answers; product-21: 0027 and 0028 joined, 2026-12-02,
    # benchmarks/results/0c1e570-product-21/): tune --load put drafting at 7 against the draft loaded
    # and paused at 1.79/1.59/1.29/1.49/1.25/0.99/0.69x against 0.96-0.99x of plain at 1-64 clients,
    # and at 4-32 clients length 5 below 7 everywhere (1.07x against 1.29x at 8); so 7, paused above
    # 16 slots. The pause needs 0021 with L = 0 (EngineInfo.draft_pause); an engine without it gets no
    # cut. Served as the table (two runs): 1.69-1.72x at 1 client, 1.28-1.70x at 8, 1.13-1.27x at 16,
    # 0.84-1.00x at 32, 0.87-0.88x at 64. Product-22's engine counts busy slots, not generating ones
    # (0030; benchmarks/results/0c1e570-product-22/load-busy.json, three runs): 0.94-1.01x at 32
    # clients against 0.91-0.94x, 0.92-0.98x at 64 against 0.92-0.96x.
    # Product-27 (0036: the injection ordered by device events; 0037: one injection decode a step,
    # --spec-draft-ubatch 2048; benchmarks/results/0c1e570-product-25/arms-cut*.json, measured on the
    # developer build where both were switches): drafts cut to 3 above 16 busy slots instead of paused,
    # with both, 1.31x of plain at 32 clients (the pause 1.03x, the cut to 3 without them 1.08x and, in
    # another run, 1.21x), 1.05x and 1.06x at 64 (two runs; the pause 0.95x), 1.11x at 16, 1.58x at 8;
    # a cut to 2 ran below 3 at 32 and 64. The time to first token at 64 clients pays for it: p50
    # 1.25x and 1.95x of plain's (drafts paused above 48 as well, 16:3,48:0: 1.01x, TTFT 1.09x).
    # Families (docs/families.md): 7 also wins for 1.2B and 2.6B at one request; 8B-A1B prefers 5.
    # The token table on the device (product-37, one H200, one request, 256-token greedy answers,
    # draft length 7, every arm's server up at once taking turns, 20 turns;
    # benchmarks/results/0c1e570-product-37/speed-ot.json): plain 401.3 -> 401.2 tok/s (1.00x),
    # drafted 920.6 -> 942.9 (2.29x -> 2.35x of its plain, 4.40 -> 4.29 ms a step), for 256 MiB of
    # VRAM (the 3B's 65536 x 2048 F16 table); product-38's drafted ids reach the verify there (engine
    # patch 0061), and its load figures have it in both arms. Metal's memory is unified (and
    # unmeasured); the CPU has no device to put it on.
    # One table for every target type. tune --load on quantized targets (product-47, one H100, 2 requests a
    # client; benchmarks/results/0c1e570-product-47-dev/tune-*.json) recommended other cuts: 3 above 4 busy
    # slots for Q4_K_M (5 above 2 too), 3 above 8 for Q8_0. Served beside this table in one interleaved run
    # (serving.py arms, 3 requests a client, 2026-12-07; 0c1e570-product-47/*-arms-cut.json), none beat it:
    # Q4_K_M table / 4:3 / 2:5,4:3 1.39/1.36/1.39x at 4 clients, 1.32/1.27/1.40x at 8, 1.11/1.39/1.22x at 16,
    # 1.18/1.02/1.16x at 32, 1.01/1.01/1.02x at 64; Q8_0 table / 8:3 1.48/1.35x, 1.40/1.29x, 1.20/1.47x,
    # 1.24/1.23x, 1.08/1.09x. Arms identical at one client ran 2.00-2.25x: differences of that size are noise.
    "cuda": BackendDefaults(7, True, "on", "CUDA: draft length 7 measured best on an H200 (docs/benchmarks.md)",
                            draft_cut=((16, 3),), draft_ubatch=2048, token_table_on_device=True),
    # 8 rows fill the verifier threadgroup on Metal (reported: M3 Ultra 1.57x-2.14x with block 8).
    "metal": BackendDefaults(8, True, "on", "Metal: 8 rows fill the verifier threadgroup"),
    # Measured here (`ggufdspark tune --acceptance published`, docs/benchmarks.md): on this 2-core
    # x86 CPU, with a 320M LFM2 target and a block-9 drafter, draft lengths 2-3 were fastest
    # (1.52-1.66x), 8-9 slower than no draft.
    "cpu": BackendDefaults(3, False, None, "CPU: draft length 3 measured at the top on a 2-core x86 CPU (docs/benchmarks.md)"),
}
OTHER_GPU = BackendDefaults(8, True, "on", "other GPU backend: Metal's value, untuned")


# The patch of ggufdspark's series that fixes the AMX crash below (docs/engine-patches.md, 0009).
AMX_BATCH_FIX = "ggml-cpu-amx-batched-mul_mat-offsets"
# The patch that gives llama-server --spec-draft-n-max-by-slots (docs/engine-patches.md, 0021).
DRAFT_CUT_BY_LOAD = "spec-draft-n-max-by-slots"  # patch 0021
# The patch that gives llama-server --spec-draft-ubatch (docs/engine-patches.md, 0037).
DRAFT_UBATCH = "spec-draft-ubatch"  # patch 0037
# Patch 0025: llama-server turns CUDA graphs off above this many slots. On one H200 with mixed-length
# prompts the engine died replaying a CUDA graph at 32 and 64 slots (5 of 8 and 3 of 4 servers), and
# never with the graphs off (0 of 10); at 8 slots the graphs are worth 1.11x (drafted, one request)
# and 1.18x (8 at once): benchmarks/results/0c1e570-0001-0024/slot-deaths.json, issue 28.
CUDA_GRAPHS_OFF = "server-CUDA-graphs-off-above"
CUDA_GRAPHS_MAX_SLOTS = 16


def has_patch(engine: EngineInfo | None, name: str) -> bool:
    """Whether ``engine`` was built with the series patch whose file name contains ``name``."""
    return engine is not None and any(name in p for p in engine.patches)


def cpu_has_amx() -> bool:
    """Whether this CPU advertises AMX (``amx_int8`` / ``amx_tile`` in ``/proc/cpuinfo``; False elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split() or "amx_tile" in line.split()
    except OSError:
        pass
    return False


def engine_workarounds(backend: str | None, parallel: int | None, engine: EngineInfo | None = None, *,
                       quantized: bool = False) -> list[str]:
    """llama-server flags that avoid known failures of the pinned engine on this backend.

    CPU with AMX and a quantized target or draft (``quantized``): the pinned ggml-cpu puts Q4_0,
    Q8_0 and K-quant weights in its AMX buffer, and llama-server then died at its warm-up decode
    (seen here, Xeon with amx_int8, LFM2 targets Q8_0 / Q4_0 / Q4_K_M, rows 64 and 256 wide, one
    slot: SIGSEGV in ``ggml_backend_amx_mul_mat`` with the patch series, SIGILL without it); F16 and
    BF16 weights never go there. ``--no-repack`` keeps them out of that buffer (issue 15).

    CPU with 2+ parallel slots: on CPUs with AMX, the pinned ggml-cpu's repacked-weight matmul
    crashed (SIGSEGV) on the first batch holding several sequences (seen here: 7 of 10 starts with a
    320M pair and a draft): batched offsets were bytes added to typed pointers and 2-D weights were
    not broadcast. Patch 0009 fixes it; an engine built with it (``engine.patches``) keeps repacking,
    any other one (an unknown ``--server``, or no ``engine`` given) gets ``--no-repack``.
    """
    if (backend or "cpu") != "cpu":
        return []
    if quantized and cpu_has_amx():
        return ["--no-repack"]
    if (parallel or 1) <= 1:
        return []
    if has_patch(engine, AMX_BATCH_FIX):
        return []
    return ["--no-repack"]


@dataclass
class Decision:
    """What a server will run with, and why (``ggufdspark.launch.decide`` makes it, final).

    ``draft_cut``: the --spec-draft-n-max-by-slots (N, L) steps the engine gets (None: no cut).
    ``draft_ubatch``: the --spec-draft-ubatch the engine gets with a draft (None: not given).
    ``token_table_device``: the buffer the target's token table is loaded into (``CUDA0``: ``-ot
    token_embd\\.weight=CUDA0``, with or without the draft; None: where llama.cpp puts it, the CPU).
    ``draft_p_min``: the --spec-draft-p-min the engine gets with a draft (a tune profile's; None:
    not given, the engine's 0).
    ``warnings``: options asked for that this engine or load cannot honour (not in ``to_dict``:
    ``serve``'s plan lists them with its own).
    """

    backend: str
    draft_enabled: bool
    draft_n_max: int | None
    offload: bool
    flash_attn: str | None
    reasons: list[str] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)
    draft_cut: list[tuple[int, int]] | None = None
    warnings: list[str] = field(default_factory=list)
    draft_ubatch: int | None = None
    token_table_device: str | None = None
    draft_p_min: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["warnings"]
        return d


def detect(engine: EngineInfo) -> DeviceReport:
    """Devices of this engine build (ctypes bindings first, ``--list-devices`` as fallback)."""
    return probe_devices(engine.lib_dir, server=engine.path)
