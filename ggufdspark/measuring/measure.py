"""The measurement machinery shared by ``bench`` and ``tune``: the draft's limits, synthetic
acceptance, server settings per arm, running an arm's server, requests, load at a concurrency
level, warm-up, the default levels and prompt rendering."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import logging
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ggufdspark import engine as eng
from ggufdspark import hardware, launch
from ggufdspark import timings as tm
from ggufdspark.check import check_pair
from ggufdspark.errors import BenchError, BenchOptionError, EngineError, InputNotFoundError
from ggufdspark.gguffile.constants import Key
from ggufdspark.gguffile.reader import read_gguf
from ggufdspark.measuring import profiles
from ggufdspark.measuring import prompts as pr
from ggufdspark.runners.client import Client
from ggufdspark.runners.server import ServerProcess, ServerSettings, exit_cause
from ggufdspark.serve_checks import ServingOptions, check_server_args

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]

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
    block = launch.draft_block(g)
    if block is None:
        raise BenchError(f"{draft}: no dflash.block_size key: not a DSpark draft (run 'ggufdspark check')")
    return DraftLimits(block[0], block[1], g.get(Key.HAS_CONFIDENCE_HEAD) in (None, True))


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
            raise BenchOptionError(f"{what}: value {i} is {r}, expected a probability in [0, 1]")
        if i and r > rates[i - 1]:
            raise BenchOptionError(f"{what}: value {i} ({r}) is larger than value {i - 1} ({rates[i - 1]}); "
                             "rates are P(at least i+1 accepted) and cannot increase")
    if len(rates) < n_max:
        raise BenchOptionError(f"{what}: {len(rates)} values for draft length {n_max}; give at least {n_max}")
    return list(rates[:n_max])


# --------------------------------------------------------------------------- servers


def base_settings(engine: eng.EngineInfo, opts: ServingOptions, *, decision: hardware.Decision,
                  parallel: int = 1) -> ServerSettings:
    """The server ``serve`` would start for ``decision`` at ``-np parallel`` (``launch.server_settings``):
    with ``opts.draft`` when the decision drafts, ``opts.mmproj``, offload, flash attention, the load
    cut, the engine's workarounds, each slot's context as ``serve`` sizes it (``opts.ctx_per_slot``:
    another share), ``opts.threads``, then ``opts.extra_args``. Every arm derives from it
    (``arm_settings``), so all of them run alike. Raises BenchOptionError for a flag in
    ``extra_args`` no measured server runs with (``--api-prefix``)."""
    extra = list(opts.extra_args)
    check_server_args(extra)
    ctx = launch.context(parallel, model=opts.model, ctx_per_slot=opts.ctx_per_slot, extra_args=extra)
    return launch.server_settings(decision, engine, model=opts.model, draft=opts.draft, mmproj=opts.mmproj,
                                  ctx=ctx, parallel=parallel, threads=opts.threads, extra_args=extra)


def arm_settings(base: ServerSettings, draft: str | Path | None, *, n_max: int | None = None,
                 p_min: float | None = None, synthetic: Synthetic | None = None,
                 cut: list[tuple[int, int]] | None = None) -> ServerSettings:
    """One arm of ``base`` (from ``base_settings``): ``draft=None`` is the same server without the
    draft; ``n_max=None`` keeps the decision's draft as ``serve`` runs it (its length, load cut,
    and the tune profile's p_min where the decision took it); another ``n_max`` is what ``serve
    --draft-n-max N`` would run (no load cut, unless ``cut`` gives one: ``--draft-n-max N
    --draft-n-max-by-slots ...``; no p_min: a profile's goes with its own length only). A ``p_min``
    given (``bench --p-min``, ``tune``'s sweep) replaces the decision's; it and synthetic acceptance
    (speed studies only) are added here, never by ``serve``.

    Raises:
        ValueError: ``n_max=None`` for a ``base`` that serves no draft.
    """
    if draft is None:
        return launch.without_draft(base)
    if n_max is None:
        if base.spec_type is None or base.draft is None:
            raise ValueError("arm_settings: the base serves no draft; give n_max")
        s = launch.with_draft(base, draft, base.draft_n_max, cut=base.draft_n_max_by_slots, p_min=p_min)
    else:
        s = dataclasses.replace(launch.with_draft(base, draft, n_max, cut=cut), draft_p_min=p_min)
    syn = synthetic or Synthetic()
    return dataclasses.replace(s, synth_len=syn.length, synth_rates=syn.rates)


# Seen on this project's x86 build machine (AMX-capable Xeon, pinned engine, CPU backend): with two
# or more parallel requests llama-server dies with SIGSEGV inside ggml-cpu's AMX matmul
# (ggml_backend_amx_mul_mat, weights repacked at load). On a 320M-parameter pair with the DSpark
# draft about 2 starts in 3 crash on the first parallel batch; the target alone crashes more rarely;
# never with --no-repack, never with one request at a time.
SEGV_HINT = ("on CPUs with AMX the pinned engine's repacked-weight kernels have crashed under parallel "
             "batches; retry with --server-arg=--no-repack")


@contextlib.contextmanager
def log_directory(log_dir: str | Path | None, prefix: str) -> Iterator[Path]:
    """Where a run's server logs go: ``log_dir`` (created if missing, kept), else a fresh temporary
    directory named ``<prefix>...``, removed when the run ends well (its logs were not asked for:
    reports then name none, ``kept_logs``). A run that fails keeps the temporary directory where it
    holds logs (errors name them) and removes it where it is still empty (refused before anything
    was written). Shared by bench and tune."""
    made = not log_dir
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=prefix))
    logs.mkdir(parents=True, exist_ok=True)
    try:
        yield logs
    except BaseException:
        if made and logs.is_dir() and not any(logs.iterdir()):
            logs.rmdir()
        raise
    if made:
        shutil.rmtree(logs, ignore_errors=True)


def kept_logs(logs: dict[str, str], log_dir: str | Path | None) -> dict[str, str]:
    """A report's ``logs`` (arm -> path): as given with ``log_dir``, else none (``log_directory``
    removes its temporary directory when the run ends well)."""
    return logs if log_dir else {}


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
            raise server_failure(srv, settings, log_path, e, exit_wait) from None


def server_failure(srv: ServerProcess, settings: ServerSettings, log_path: Path, error: EngineError,
                   exit_wait: float = EXIT_WAIT_S) -> BenchError:
    """What a failed request to ``srv`` means: the server died (its exit code or signal, the log), or
    it kept running and the request failed (the engine's error). Waits up to ``exit_wait`` s to tell."""
    rc = await_exit(srv, exit_wait)
    if rc is None:
        return BenchError(f"a request failed and llama-server kept running (log: {log_path}): {error}")
    how = exit_cause(rc)
    hint = f"; {SEGV_HINT}" if rc == -11 and settings.n_gpu_layers is None else ""
    return BenchError(f"llama-server died during the measurement (it {how}; log: {log_path}): {error}{hint}")


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


# What measure_load measures, said wherever its figures are shown: not serving traffic.
LOCKSTEP_LABEL = ("lock-step micro-benchmark: the set's short prompts, a few requests a thread started at "
                  "once; not a serving measurement (bench --load is)")


def measure_load(client: Client, prompts: list[Any], level: int, n_predict: int, *, rounds: int = ROUNDS,
                 progress: Callable[[str], None] | None = None, outcomes: list[Outcome] | None = None,
                 **extra: Any) -> LoadPoint:
    """A lock-step micro-benchmark (``LOCKSTEP_LABEL``), kept for ``bench``'s quick curve and ``tune``:
    ``level`` threads, each sending ``rounds`` requests back to back (prompts cycled); tokens
    generated by all of them over the wall time from the first send to the last answer. For
    serving figures use ``ggufdspark.measuring.loadbench`` (``bench --load``). ``outcomes``: a list every
    finished request's ``Outcome`` is appended to, for a caller that needs more than the aggregate
    (the prompt timings of ``benchmarks/speed.py prefill``)."""
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
    if outcomes is not None:
        outcomes.extend(outs)
    s = tm.summarize([o.timings for o in outs])
    return LoadPoint(level, len(outs), s.predicted_n, wall, s.draft_n, s.draft_n_accepted, s.passes,
                     s.decode_tps.token_weighted)


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
            prompt, n_prompt = pr.render(client, history, media_marker)
            o = request(client, prompt, n_predict)
            turns.append(Turn(it.id, it.category, k, prompt, n_prompt))
            outs.append(o)
            tick(f"{it.id} turn {k + 1}")
            k += 1
            nxt = msgs[i + 1] if i + 1 < len(msgs) else None
            if nxt is not None and nxt["role"] != "assistant":
                history.append({"role": "assistant", "content": o.text})
    return turns, outs


# --------------------------------------------------------------------------- levels, warm-up, inputs


# -t / --threads for llama-server: at least 1, at most 4 threads per logical CPU and never more than
# ggml's GGML_MAX_N_THREADS (512, ggml/include/ggml.h of the pinned tree). Above the CPU count the
# threads only take turns (os.cpu_count() already counts SMT siblings), yet a few per CPU are
# harmless and some users oversubscribe on purpose; 99999 threads made the pinned engine die of
# SIGSEGV at start, and 0 or a negative value is no thread count at all.
THREADS_PER_CPU = 4
GGML_MAX_N_THREADS = 512


def thread_limit() -> int:
    """The largest ``threads`` accepted on this machine (see ``check_threads``)."""
    return min(GGML_MAX_N_THREADS, THREADS_PER_CPU * (os.cpu_count() or 1))


def check_threads(threads: int | None) -> None:
    """Refuse a llama-server thread count outside ``1..thread_limit()`` (None: the engine's default):
    BenchOptionError with the value and the range this machine allows."""
    if threads is None:
        return
    hi = thread_limit()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= hi:
        raise BenchOptionError(f"--threads {threads!r}: expected 1..{hi} ({THREADS_PER_CPU} per CPU on this "
                               f"machine's {os.cpu_count() or 1}, at most ggml's {GGML_MAX_N_THREADS})")


def check_p_min(values: list[float] | float | None, what: str = "--p-min") -> None:
    """Refuse a confidence threshold outside [0, 1] (NaN included), as ``bench --p-min`` does:
    BenchOptionError with the first bad value."""
    for v in values if isinstance(values, list) else ([] if values is None else [values]):
        if not 0.0 <= v <= 1.0:  # false for NaN too
            raise BenchOptionError(f"{what} {v}: expected a confidence threshold in [0, 1]")


def concurrency_levels(concurrency: list[int] | None, backend: str) -> list[int]:
    """The parallel-request levels to measure: the given ones, or the backend's defaults; sorted.

    Raises:
        BenchError: a level below 1.
    """
    lv = sorted(set(concurrency or CONCURRENCY_DEFAULTS.get(backend, OTHER_CONCURRENCY)))
    if lv and lv[0] < 1:
        raise BenchOptionError(f"--concurrency: {lv[0]} is not a number of parallel requests (>= 1)")
    return lv


def prepare(opts: ServingOptions, *, concurrency: list[int] | None = None,
            devices: Any = None) -> tuple[eng.EngineInfo, Any, hardware.Decision, DraftLimits]:
    """Check the files of ``opts``, the pair and the engine; detect devices; decide as ``serve``
    would at the highest concurrency level (``launch.decide``: the tune profile unless
    ``opts.use_profile`` is false, ``opts.draft_n_max``, ``opts.draft_n_max_by_slots``, the
    engine's patches). A tune profile that turned drafting off is said, not followed: a measurement
    needs its drafted arm (``launch.decide(measuring=True)``). ``devices``: decide for this
    ``DeviceReport`` instead of detecting the engine's (as ``serve.plan``'s). Shared by bench and tune.

    Raises:
        InputNotFoundError, CorruptFileError, PairMismatchError, EngineError, BenchError.
    """
    target, draft, mmproj = opts.model, opts.draft, opts.mmproj
    for label, p in (("target", target), ("draft", draft), ("mmproj", mmproj)):
        if p and not Path(p).is_file():
            raise InputNotFoundError(f"{p}: {label} file not found")
    check_pair(target, draft, mmproj).raise_for_failures()
    info = eng.find_engine(opts.server)
    eng.require_dspark(info)
    devices = devices or hardware.detect(info)
    prof = profiles.load_profile(devices, target, draft) if opts.use_profile else None
    parallel = max(concurrency_levels(concurrency, devices.backend or "cpu"))
    limits = draft_limits(draft)
    decision = launch.decide(devices, info, profile=prof, draft_n_max=opts.draft_n_max, parallel=parallel,
                             draft_cut=opts.draft_n_max_by_slots, measuring=True, draft_max=limits.max_n)
    return info, devices, decision, limits


def warm(client: Client) -> None:
    """One short request: first-use allocations and kernel selection stay out of the measurements."""
    try:
        client.complete(client.tokenize("Warm up the engine.", add_special=True), n_predict=WARMUP_TOKENS)
    except EngineError as e:
        raise BenchError(f"the warm-up request failed: {e}") from None
