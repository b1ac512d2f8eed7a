"""The notes ``launch.decide`` adds to a decision beyond the hardware table: a tune profile's
confidence threshold, the target's token table on the GPU, and CUDA graphs above the slots they
survive. Each sets its part of the ``hardware.Decision`` and says why in its reasons or warnings."""

from __future__ import annotations

import re

from ggufdspark import hardware
from ggufdspark.devices import DeviceReport
from ggufdspark.engine import EngineInfo
from ggufdspark.runners.tensor_overrides import TOKEN_TABLE_PATTERN

def profile_p_min(d: hardware.Decision, best: dict, where: str, draft_n_max: int | None) -> float | None:
    """The confidence threshold (``--spec-draft-p-min``) a tune profile recommends, where the draft
    runs at the length it was measured with (tune measures length and p_min together); a reason
    said for it, or a warning naming the threshold dropped and why. None where the profile has none
    (0 is the engine's default; a value outside (0, 1] is not applied)."""
    p_min = best.get("p_min")
    if not isinstance(p_min, (int, float)) or isinstance(p_min, bool) or not 0 < p_min <= 1:
        return None
    if draft_n_max is not None and draft_n_max != best.get("draft_n_max"):
        d.warnings.append(f"tune profile {where}: its p_min {p_min:g} was measured with draft length "
                          f"{best.get('draft_n_max')}, not with --draft-n-max {draft_n_max}; running with the "
                          "engine's p_min 0")
        return None
    d.reasons.append(f"tune profile {where}: p_min {p_min:g} measured with draft length {d.draft_n_max}")
    return float(p_min)


# llama.cpp names a CUDA device and its buffer type alike, GGML_CUDA_NAME + index (ggml-cuda.cu)
CUDA_BUFFER = re.compile(r"CUDA\d+")


def token_table(d: hardware.Decision, devices: DeviceReport) -> None:
    """The target's token table on the first CUDA device (``CUDA0`` where none is named), a reason
    said either way: with more than one GPU it stays on the CPU, because llama.cpp turns pipeline
    parallelism off whenever any tensor override is given (src/llama-context.cpp)."""
    gpus = [x for x in devices.devices if x.type in ("gpu", "igpu", "unknown")]
    if len(gpus) > 1:
        d.reasons.append(f"{len(gpus)} GPUs: the token table stays on the CPU (llama.cpp turns pipeline "
                         "parallelism off whenever a tensor override such as -ot is given)")
        return
    d.token_table_device = next((x.name for x in gpus if CUDA_BUFFER.fullmatch(x.name)), "CUDA0")
    d.reasons.append(f"default for {d.backend}: the token table on the GPU (-ot {TOKEN_TABLE_PATTERN}="
                     f"{d.token_table_device}; llama.cpp keeps it on the CPU): on an H200 at one request the "
                     "drafted server 2.35x of plain instead of 2.29x (4.29 against 4.40 ms a step), plain "
                     "unchanged, for 256 MiB of VRAM with a 3B (0c1e570-product-37/speed-ot.json); the drafted "
                     "ids reach the verify there (engine patch 0061)")


def cuda_graphs_note(d: hardware.Decision, engine: EngineInfo | None, parallel: int) -> None:
    """Above ``hardware.CUDA_GRAPHS_MAX_SLOTS`` slots on CUDA: a build with patch 0025 turns the
    graphs off itself (said in the reasons); any other may die replaying them (a warning)."""
    limit = hardware.CUDA_GRAPHS_MAX_SLOTS
    if hardware.has_patch(engine, hardware.CUDA_GRAPHS_OFF):
        d.reasons.append(f"engine patch 0025: CUDA graphs off at {parallel} slots (above {limit}; replaying them "
                         "killed the engine at 32 and 64 slots on an H200; at 8 slots they are worth about 1.1x)")
    else:
        where = engine.path if engine else "this llama-server"
        d.warnings.append(f"-np {parallel} on CUDA: {where} lacks engine patch 0025, and such engines died at 32 "
                          "and 64 slots replaying CUDA graphs; run it with GGML_CUDA_DISABLE_GRAPHS=1")
