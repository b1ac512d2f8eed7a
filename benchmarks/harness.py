"""The one harness of ``benchmarks/``: every script measures an arm through it, on the product's
own measurement code.

* An arm's server: ``base_settings`` builds the plain server through ``ggufdspark.launch`` (as
  ``serve`` builds its own; no flag is written here) and ``drafted`` adds the draft as ``bench``
  and ``tune`` add it (``ggufdspark.measuring.measure.arm_settings``, synthetic acceptance included).
* Speed: ``measure_arm`` starts the server (``measure.running``), warms it up (``measure.warm``),
  then measures one request at a time (median decode tok/s of the trials, each trial seeded so
  every arm draws the same synthetic acceptance) and N requests at once (aggregate tok/s over the
  wall time, ``measure.measure_load``), a level's waves kept. Serving traffic is
  ``ggufdspark bench --load`` (``ggufdspark.measuring.loadbench``), which ``benchmarks/h200.sh load`` runs.
* The lossless check: ``lossless`` compares a drafted server's greedy tokens at real acceptance
  with the plain server's (``ggufdspark.measuring.gate.first_difference``; top-2 log-probabilities at the
  first difference tell a near-tie from a defect).
* Survival under many slots: ``survive`` starts a fresh server and sends a workload through
  ``clients`` closed-loop clients or in waves (``send_all``), counting answers, and whether and
  how the server died (``slots.py``).
* The scripts' shared pieces: the pair and engine arguments (``add_pair_arguments``) and an arm's
  engine environment (``environ``, ``parse_env``, ``split_env``: switches of the engine patch series
  such as ``GGML_CUDA_MMF_FEW=4`` or ``LLAMA_SPEC_PROFILE=1``, set for one arm only).

The synthetic acceptance is the published drafter's profile: mean accept length 4.22 spread over
the draft's longest draft (its block size for an anchor-first draft: 9 for the published shape) as
llama.cpp's geometric rates, truncated for a shorter draft, never rescaled per length.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ggufdspark import engine, launch
from ggufdspark.devices import DeviceReport
from ggufdspark.errors import EngineError, GgufdsparkError
from ggufdspark.measuring import measure as ms
from ggufdspark.measuring.acceptance import geometric_rates
from ggufdspark.measuring.gate import first_difference, top_logprobs_by_position
from ggufdspark.runners.server import ServerProcess, ServerSettings

PROMPT = ("Describe in detail how speculative decoding works with a small draft model and a large "
          "target model, what acceptance length means, and why the output is unchanged.")
PUBLISHED_ACCEPT_LEN = 4.22  # the published VL-3B drafter, request mean (shared/DESIGN.md)
CTX_MARGIN = 256  # per slot, beyond the generated tokens: the prompt and a draft block
TRIAL_SEED = 1  # the server seeds a request's synthetic acceptance draws from its seed


# --------------------------------------------------------------------------- arguments and environment


def add_pair_arguments(ap: argparse.ArgumentParser, *, required: bool = True) -> None:
    """The pair to measure, named as ggufdspark's own verbs name it (``-m``/``--target``,
    ``-md``/``--draft``; both required unless ``required`` is false: then the benchmark makes a pair
    when none is given), and the engine that runs it (``add_engine_arguments``)."""
    ap.add_argument("-m", "--target", "--model", dest="target", required=required, help="target GGUF")
    ap.add_argument("-md", "--draft", dest="draft", required=required, help="DSpark draft GGUF")
    add_engine_arguments(ap)


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine and where it runs."""
    ap.add_argument("--server", help="llama-server (default: the build ggufdspark finds)")
    ap.add_argument("--gpu", action="store_true", help="offload both models (-ngl 99 -ngld 99), flash attention on")


def run_commands(doc: str, commands: dict[str, tuple[str, Callable, Callable]], argv: list[str] | None = None) -> int:
    """A script of several measurements, one subcommand each: ``commands`` maps a name to (its
    description, a function adding its arguments to a parser, a function running it on the parsed
    arguments and its parser, returning the exit status). A GgufdsparkError (a missing file, a server
    that died) is one line on stderr and exit 1."""
    raw = argparse.RawDescriptionHelpFormatter
    ap = argparse.ArgumentParser(description=doc, formatter_class=raw)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (text, add, run) in commands.items():
        p = sub.add_parser(name, description=text, help=text.strip().splitlines()[0], formatter_class=raw)
        add(p)
        p.set_defaults(run=run, parser=p)
    a = ap.parse_args(argv)
    run, parser = a.run, a.parser
    del a.run, a.parser  # the rest is what a result's JSON records
    try:
        return run(a, parser)
    except GgufdsparkError as e:
        print(f"{Path(sys.argv[0]).name} {a.command}: {e}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` while the block runs (an engine started inside inherits it); the previous values
    (or their absence) come back after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_env(text: str) -> dict[str, str]:
    """``"A=1,B=8"`` or ``"A=1 B=8"`` -> ``{"A": "1", "B": "8"}``: items separated by commas or
    spaces, as the device script's arm specs write them (``LOAD_ARMS``), empty items skipped. A
    space-separated group once went in whole as one variable's value (``A`` = ``"1 B=8"``), so the
    second switch was silently not set; no switch of the series takes a value with a space.

    Raises:
        ValueError: an item is not NAME=VALUE (the message names it).
    """
    pairs = [kv for kv in re.split(r"[,\s]+", text) if kv]
    bad = [kv for kv in pairs if "=" not in kv]
    if bad:
        raise ValueError(f"{bad[0]!r} is not NAME=VALUE")
    return dict(kv.split("=", 1) for kv in pairs)


ENV_WORD = re.compile(r"[A-Z][A-Z0-9_]*=")


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """An arm spec's words: the ``KEY=VALUE`` ones (upper-case KEY: an engine environment variable)
    as a dict, and the others in their order. A word may join several switches by commas, as the
    device script's environment groups do (``A=1,B=2``); a comma piece that is not ``KEY=`` belongs
    to the value before it (``GGML_CUDA_MMVQ_MMA_STAGED=q4_K,q6_K``). Such a group once set ``A`` to
    ``"1,B=2"``, so ``B`` was silently not set."""
    env: dict[str, str] = {}
    for w in words:
        if not ENV_WORD.match(w):
            continue
        key = ""
        for piece in w.split(","):
            if ENV_WORD.match(piece):
                key, value = piece.split("=", 1)
                env[key] = value
            else:
                env[key] += "," + piece
    return env, [w for w in words if not ENV_WORD.match(w)]


# --------------------------------------------------------------------------- servers


def published_rates(draft: str | Path, accept_len: float = PUBLISHED_ACCEPT_LEN) -> list[float]:
    """Per-position rates at ``accept_len`` over the draft's longest draft (``draft_limits``)."""
    return geometric_rates(accept_len, ms.draft_limits(draft).max_n)


def base_settings(server: str | Path | None, target: str | Path, *, gpu: bool, parallel: int, n_predict: int = 0,
                  ctx_per_slot: int | None = None, threads: int | None = None, quantized: bool = False,
                  extra_args: list[str] | None = None, info: engine.EngineInfo | None = None) -> ServerSettings:
    """The plain server every arm of one target shares, through ``ggufdspark.launch`` as ``serve``
    builds its own: the table's CUDA row under ``gpu`` (everything offloaded, flash attention on, the
    token table on CUDA0, a buffer a CPU-only engine refuses), the CPU row otherwise, the engine's
    workarounds for this build, ``ctx_per_slot`` tokens a slot (default ``n_predict + CTX_MARGIN``),
    then ``extra_args``. ``quantized``: a quantized draft
    will be added (it counts for the workarounds). ``info``: the engine at ``server``, already probed."""
    info = info or engine.find_engine(server)
    # with the engine: the drafted arms get serve's drafter n_ubatch on CUDA (patch 0037; without it a
    # prompt went into the drafter in 512-row decodes, which serve never runs)
    decision = launch.table_decision("cuda" if gpu else "cpu", info)
    ctx = launch.context(parallel, model=target, ctx_per_slot=ctx_per_slot or n_predict + CTX_MARGIN,
                         extra_args=extra_args)
    return launch.server_settings(decision, info, model=target, ctx=ctx, parallel=parallel, threads=threads,
                                  metrics=False, quantized=quantized or None, extra_args=extra_args)


def drafted(base: ServerSettings, draft: str | Path, n_max: int, rates: list[float] | None) -> ServerSettings:
    """``base`` with the draft at length ``n_max``: synthetic acceptance at ``rates`` (truncated to
    ``n_max``), or real acceptance for ``rates=None``."""
    syn = ms.Synthetic(rates=list(rates[:n_max])) if rates else None
    return ms.arm_settings(base, draft, n_max=n_max, synthetic=syn)


def serve_drafted(base: ServerSettings, draft: str | Path, *, gpu: bool, rates: list[float] | None) -> ServerSettings:
    """``base`` with the draft as ``serve`` runs it on this backend with ``base``'s engine and slots
    (``launch.decide``: the table's length, its load cut where the engine has patch 0021, and its
    drafter n_ubatch where it has 0037),
    synthetic acceptance at ``rates`` truncated to that length (or real acceptance for None)."""
    devices = DeviceReport(backend="cuda" if gpu else "cpu")
    # a table length beyond the drafter's block is cut to it, as serve does
    decision = launch.decide(devices, engine.find_engine(base.server), parallel=base.parallel, measuring=True,
                             draft_max=launch.longest_draft(draft))
    n_max = decision.draft_n_max or 1
    with_serves_draft = launch.with_draft(base, draft, n_max, cut=decision.draft_cut, ubatch=decision.draft_ubatch,
                                          p_min=decision.draft_p_min)
    syn = ms.Synthetic(rates=list(rates[:n_max])) if rates else None
    return ms.arm_settings(with_serves_draft, draft, synthetic=syn)  # n_max None: that draft as serve runs it


def with_args(settings: ServerSettings, extra: list[str]) -> ServerSettings:
    """``settings`` with more llama-server arguments at the end (a variant of one arm)."""
    return dataclasses.replace(settings, extra_args=list(settings.extra_args) + list(extra))


def n_vocab(server: str | Path | None, target: str | Path, log_dir: Path, *, gpu: bool = False) -> int:
    """The target's vocabulary size, as the engine reports it (a short-lived plain server)."""
    probe = base_settings(server, target, gpu=gpu, parallel=1, ctx_per_slot=512)
    with ms.running(probe, log_dir / "probe.log") as c:
        meta = json.loads(c.get_text("/v1/models"))["data"][0].get("meta", {})
    return int(meta["n_vocab"])


# --------------------------------------------------------------------------- speed


@dataclass
class Arm:
    """One server's numbers. ``tps``: median decode tok/s of single requests (``runs``: each
    trial's), ``e2e_s``: their median wall time; ``load``: level -> ``LoadPoint.to_dict()`` of the
    level's median wave (``tps`` there is the aggregate over the wall time; ``waves``: every
    wave's aggregate)."""

    name: str
    cmd: str
    tps: float | None = None
    runs: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    accept_length: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0
    load: dict[int, dict] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    reference: dict | None = None  # greedy tokens (and top-2 probabilities) for the lossless check
    trial_t0_s: list[float] = field(default_factory=list)  # interleaved runs: when each request was sent

    def to_dict(self) -> dict:
        return asdict(self)


def measure_arm(name: str, settings: ServerSettings, log_dir: Path, *, levels: list[int], n_predict: int,
                trials: int, reference_tokens: int = 0, load_trials: int = 1, rounds: int = ms.ROUNDS,
                seed: int = TRIAL_SEED, env: dict[str, str] | None = None) -> Arm:
    """Start the server (its engine under ``env``), warm up, measure every level: ``trials``
    single requests at level 1 (trial i seeded ``seed + i``), ``load_trials`` waves of ``level``
    threads sending ``rounds`` requests each at every other level. With ``reference_tokens`` also
    keep a greedy answer of that length with its top-2 probabilities (the plain side of the
    lossless check)."""
    arm = Arm(name, " ".join(settings.redacted()), env=dict(env or {}))
    with environ(arm.env), ms.running(settings, log_dir / f"{name}.log") as c:
        prompt = c.tokenize(PROMPT)
        ms.warm(c)
        if 1 in levels:
            _single_requests(arm, [ms.request(c, prompt, n_predict, ignore_eos=True, seed=seed + i)
                                   for i in range(trials)])
        for n in (x for x in levels if x > 1):
            waves = [ms.measure_load(c, [prompt], n, n_predict, rounds=rounds, ignore_eos=True).to_dict()
                     for _ in range(load_trials)]
            agg = [w["tps"] for w in waves]
            mid = min(waves, key=lambda w: abs(w["tps"] - statistics.median(agg)))
            arm.load[n] = {**mid, "tps": statistics.median(agg), "waves": agg}
        if reference_tokens:
            ref = c.complete(prompt, n_predict=reference_tokens, n_probs=2, ignore_eos=True)
            toks = list(ref.tokens or [])
            by_pos = top_logprobs_by_position(toks, ref.probs or [])
            arm.reference = {"tokens": toks,
                             "top2": [[t.get("logprob") for t in by_pos.get(i, [])[:2]] for i in range(len(toks))]}
    return arm


def _single_requests(arm: Arm, outs: list[ms.Outcome]) -> None:
    """``arm``'s one-request figures from its trials' outcomes (medians, drafted / accepted sums)."""
    arm.runs = [o.timings.decode_tps for o in outs]
    arm.tps = statistics.median(arm.runs)
    arm.e2e_s = statistics.median(o.wall_s for o in outs)
    lengths = [o.timings.accept_length for o in outs if o.timings.accept_length]
    arm.accept_length = statistics.median(lengths) if lengths else None
    arm.draft_n = sum(o.timings.draft_n or 0 for o in outs)
    arm.draft_n_accepted = sum(o.timings.draft_n_accepted or 0 for o in outs)


@dataclass
class ArmSpec:
    """One server of an interleaved measurement: its name, settings and engine environment."""

    name: str
    settings: ServerSettings
    env: dict[str, str] = field(default_factory=dict)


def measure_interleaved(specs: list[ArmSpec], log_dir: Path, *, n_predict: int, trials: int,
                        seed: int = TRIAL_SEED) -> list[Arm]:
    """One request at a time on every arm's server, all started at once, the arms taking turns:
    trial i sends one request (seeded ``seed + i``) to each server in turn, starting at arm i mod N,
    so a drift of the machine during the run (a GPU's clocks, another tenant) falls on every arm
    alike instead of on the arms measured last. Each arm's ``trial_t0_s``: when its requests were
    sent, seconds from the first trial's start."""
    arms = [Arm(s.name, " ".join(s.settings.redacted()), env=dict(s.env)) for s in specs]
    outs: list[list[ms.Outcome]] = [[] for _ in specs]
    sent: list[list[float]] = [[] for _ in specs]
    with contextlib.ExitStack() as stack:
        servers = []
        for s in specs:
            log = log_dir / f"{s.name}.log"
            with environ(s.env):  # the engine's environment is taken at its start
                srv = stack.enter_context(ServerProcess(s.settings, log_path=log, start_timeout=600))
            servers.append((srv, srv.client(), log))
        prompt = servers[0][1].tokenize(PROMPT)
        for srv, c, log in servers:
            ms.warm(c)
        t_start = time.perf_counter()
        for i in range(trials):
            for k in range(len(specs)):
                j = (i + k) % len(specs)
                srv, c, log = servers[j]
                sent[j].append(round(time.perf_counter() - t_start, 4))
                try:
                    outs[j].append(ms.request(c, prompt, n_predict, ignore_eos=True, seed=seed + i))
                except EngineError as e:
                    raise ms.server_failure(srv, specs[j].settings, log, e) from None
    for arm, o, t in zip(arms, outs, sent):
        _single_requests(arm, o)
        arm.trial_t0_s = t
    return arms


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


# --------------------------------------------------------------------------- survival under many slots


def workload(n: int, vocab: int, prompt_range: tuple[int, int], gen_range: tuple[int, int], seed: int, *,
             log_uniform: bool = False, shared_prefix: int = 0) -> list[tuple[list[int], int]]:
    """``n`` (prompt token ids, n_predict) pairs, deterministic for ``seed``: random ids clear of
    the special tokens at the start of the vocabulary, prompt lengths uniform over
    ``prompt_range`` or, with ``log_uniform``, as many short prompts as long ones per doubling;
    the first ``shared_prefix`` tokens are the same in every prompt (a system prompt)."""
    rng = random.Random(seed)
    lo_id = min(16, vocab // 4)
    prefix = [rng.randrange(lo_id, vocab) for _ in range(shared_prefix)]
    lo, hi = prompt_range
    out = []
    for _ in range(n):
        if log_uniform:
            plen = int(round(lo * (hi / lo) ** rng.random())) if hi > lo else lo
        else:
            plen = rng.randint(lo, hi)
        plen = max(plen - len(prefix), 1)
        out.append((prefix + [rng.randrange(lo_id, vocab) for _ in range(plen)], rng.randint(*gen_range)))
    return out


def send_all(srv: ServerProcess, work: list[tuple[list[int], int]], clients: int, *, waves: bool = False,
             n_probs: int = 0, cache_prompt: bool = False) -> list[dict | None]:
    """Send ``work`` (prompt ids, n_predict) greedily: ``clients`` closed-loop clients (each sends
    the next request as soon as its answer is back), or with ``waves`` groups of ``clients``
    requests at once, each group after the last has ended. Stops when the server died. Returns
    one response (``{"error": ...}`` for a failed request, None for one never sent) a request,
    in ``work``'s order."""
    client = srv.client(timeout=900)
    out: list[dict | None] = [None] * len(work)
    lock = threading.Lock()
    todo = list(range(len(work)))

    def one(i: int) -> None:
        prompt, n_predict = work[i]
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
                "cache_prompt": cache_prompt, "return_tokens": True}
        if n_probs:
            body["n_probs"] = n_probs
        try:
            out[i] = client.post_json("/completion", body)
        except Exception as e:  # noqa: BLE001 - a dead server shows up here as any transport error
            out[i] = {"error": f"{type(e).__name__}: {e}"}

    def loop() -> None:
        while True:
            with lock:
                if not todo or not srv.alive():
                    return
                i = todo.pop(0)
            one(i)

    groups = [list(range(k, min(k + clients, len(work)))) for k in range(0, len(work), clients)] if waves else [[]]
    for group in groups:
        threads = [threading.Thread(target=one, args=(i,)) for i in group] if waves else \
            [threading.Thread(target=loop) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not srv.alive():
            break
    return out


@dataclass
class Survival:
    """One fresh server under a workload: answers, tokens, and whether (and how) it died."""

    requests: int
    answered: int = 0
    died: bool = False
    exit_code: int | None = None
    error: str = ""
    seconds: float = 0.0
    output_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    outs: list[dict | None] = field(default_factory=list, repr=False)


def survive(settings: ServerSettings, work: list[tuple[list[int], int]], clients: int, log: Path, *,
            waves: bool = False, n_probs: int = 0, cache_prompt: bool = False) -> Survival:
    """A fresh server (its log at ``log``, an earlier one removed) under ``work`` (``send_all``);
    it died if it exited, failed to start, or left a request unanswered."""
    log.unlink(missing_ok=True)  # the engine appends: an earlier call's log would be read as this one's
    res = Survival(len(work))
    t0 = time.monotonic()
    try:
        with ServerProcess(settings, log_path=log, start_timeout=900) as srv:
            res.outs = send_all(srv, work, clients, waves=waves, n_probs=n_probs, cache_prompt=cache_prompt)
            if not srv.alive():
                res.died = True
                res.exit_code = srv.proc.poll() if srv.proc else None
    except GgufdsparkError as e:
        res.died, res.error = True, str(e).splitlines()[0][:240]
    res.seconds = round(time.monotonic() - t0, 1)
    for o in res.outs:
        if o and "error" not in o and "content" in o:
            t = o.get("timings") or {}
            res.answered += 1
            res.output_tokens += int(t.get("predicted_n", 0) or 0)
            res.drafted += int(t.get("draft_n", 0) or 0)
            res.accepted += int(t.get("draft_n_accepted", 0) or 0)
        elif o and not res.error:
            res.error = str(o.get("error"))[:240]
    res.died = res.died or res.answered < res.requests
    return res
