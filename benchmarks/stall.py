#!/usr/bin/env python3
"""The stall a streaming request waits through when another request's prompt joins the batch:

* ``join``: a few streams generate while one long prompt joins, plain against drafted (each as
  ``serve`` runs it), round after round, the two servers taking turns; each round's longest wait of
  the streams across the join, the joining request's time to first token, and the streams' usual
  wait outside it;
* ``first``: the wait after a request's first token, alone on the server, plain against drafted:
  the longest wait of every request ``bench --load`` sent at one client;
* ``steps``: where a server's steps went, from the engine's slow-step lines (patch 0072,
  ``LLAMA_SPEC_PROFILE_SLOW=MS``): steps a prompt joined against the others, phase by phase.

    python benchmarks/stall.py join -m T.gguf -md D.gguf [--gpu] [--rounds 6] [--profile] [--json out.json]
    python benchmarks/stall.py first -m T.gguf -md D.gguf [--gpu] [--rounds 8] [--profile] [--json out.json]
    python benchmarks/stall.py steps server.log [more.log ...] [--top 5] [--json out.json]

``bench --load`` reports the same stall as a percentile of each request's longest wait, which
depends on which prompt met which answer; ``join`` makes that meeting happen every round.
``python benchmarks/stall.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from benchmarks.speed import parse_env_variants  # noqa: E402
from ggufdspark.errors import BenchError  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.runners.client import CHUNK_JOIN_S  # noqa: E402
from ggufdspark.timings import steps as tsteps  # noqa: E402

JOIN_DOC = """A prompt joining generating streams, plain against drafted.

Both servers (``--streams`` + 1 slots, as ``serve`` starts them on this backend; the drafted one at
serve's draft length and cut, real acceptance unless ``--synthetic-rates``) run at once and take
turns, one round each in turn. A round: ``--streams`` greedy streams start (random-token prompts of
32 tokens, ``--answer`` tokens each); once every stream has sent ``--warm`` tokens, one request
with a ``--join-tokens`` prompt joins (4 answer tokens); when it has answered, the streams are
closed. Per round: the joining request's time to first token, the longest wait of any stream that
began before the join's first token and ended after it was sent, and the median of the streams'
other waits. The table gives each arm's median over rounds and drafted / plain. With ``--profile``
both servers run with ``LLAMA_SPEC_PROFILE_SLOW=0`` (patch 0072) and the join steps' phases
follow (their synchronisations slow both servers: compare arms and phases, not with an unprofiled
run).
"""


def join_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--streams", type=int, default=3, help="generating streams a round")
    ap.add_argument("--join-tokens", type=int, default=2000, help="the joining prompt's tokens")
    ap.add_argument("--answer", type=int, default=2048, help="each stream's answer tokens (it is closed after the join)")
    ap.add_argument("--warm", type=int, default=32, help="tokens every stream has sent before the prompt joins")
    ap.add_argument("--rounds", type=int, default=6, help="rounds an arm")
    arm_arguments(ap)


def arm_arguments(ap: argparse.ArgumentParser) -> None:
    """The options ``join`` and ``first`` share: acceptance, profile, extra drafted arms, output."""
    ap.add_argument("--synthetic-rates", help="per-position acceptance rates (comma-separated) for the draft; "
                    "default: real acceptance")
    ap.add_argument("--profile", action="store_true",
                    help="LLAMA_SPEC_PROFILE_SLOW=0 on every server; the measured steps' phases")
    ap.add_argument("--drafted-envs", default="",
                    help="semicolon-separated NAME=VALUE[,NAME=VALUE] engine environments, each one more drafted "
                         "arm beside plain (e.g. 'LLAMA_SPEC_INJECT_LATE=1')")
    ap.add_argument("--seed", type=int, default=0, help="the random-token prompts' seed")
    ap.add_argument("--log-dir", type=Path, help="keep the server logs here (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")


def make_arms(a: argparse.Namespace, *, parallel: int, slot_ctx: int) -> dict:
    """plain, drafted (as ``serve`` runs them on this backend) and a drafted arm per ``--drafted-envs``
    environment; with ``--profile`` every one prints each step (patch 0072)."""
    rates = [float(x) for x in a.synthetic_rates.split(",")] if a.synthetic_rates else None
    base = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=parallel, ctx_per_slot=slot_ctx)
    drafted = harness.serve_drafted(base, a.draft, gpu=a.gpu, rates=rates)
    arms = {"plain": base, "drafted": drafted}
    for env in parse_env_variants(a.drafted_envs, f"stall.py {a.command}: --drafted-envs"):
        arms["drafted " + ",".join(f"{k}={v}" for k, v in env.items())] = replace(drafted, env={**drafted.env, **env})
    if a.profile:
        arms = {k: replace(s, env={**s.env, "LLAMA_SPEC_PROFILE_SLOW": "0"}) for k, s in arms.items()}
    return arms


def prepare(a: argparse.Namespace, *, parallel: int, slot_ctx: int, name: str):
    """The arms (``make_arms``), the log folder, the target's vocabulary size, each arm's log and
    where this run starts in it (a log is appended to)."""
    arms = make_arms(a, parallel=parallel, slot_ctx=slot_ctx)
    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix=f"stall-{name}-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    n_vocab = harness.n_vocab(a.server, a.target, log_dir, gpu=a.gpu)
    logs = {k: log_dir / f"{k.replace(' ', '-').replace(',', '-')}.log" for k in arms}
    return arms, log_dir, n_vocab, logs, {k: f.stat().st_size if f.exists() else 0 for k, f in logs.items()}


def new_steps(log: Path, start: int) -> list:
    """The slow-step lines (patch 0072) the log gained after byte ``start``."""
    with open(log, "rb") as f:
        f.seek(start)
        return tsteps.parse_steps(f.read().decode(errors="replace"))


def ratios_by_arm(summary: dict[str, dict[str, float]], metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Every arm's medians over plain's, printed a line an arm."""
    out = {k: {m: summary[k][m] / summary["plain"][m] for m in metrics if summary["plain"][m]}
           for k in summary if k != "plain"}
    for k, r in out.items():
        print(f"{k} / plain: " + ", ".join(f"{m[:-2]} {v:.2f}x" for m, v in r.items()))
    return out


def write_report(a: argparse.Namespace, arms: dict, **parts) -> None:
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "args": {k: str(v) if isinstance(v, Path) else v
                                                                     for k, v in vars(a).items()},
                                      "settings": {k: s.redacted_dict() for k, s in arms.items()},
                                      "provenance": provenance(a.server), **parts}, indent=2))


class _Stream:
    """One streamed greedy request; ``times`` are the perf_counter times of the chunks carrying
    tokens; ``stop`` closes it."""

    def __init__(self, client, prompt: list[int], n_predict: int):
        self.times: list[float] = []
        self.sent = time.perf_counter()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, prompt, n_predict), daemon=True)
        self._thread.start()

    def _run(self, client, prompt, n_predict) -> None:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
                "ignore_eos": True}
        try:
            for line in client.stream_lines("/completion", body):
                if not line.startswith("data:"):
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    self.error = str(chunk["error"])
                    return
                if chunk.get("tokens") or chunk.get("content"):
                    self.times.append(time.perf_counter())
                if chunk.get("stop") or self._stop.is_set():
                    return
        except Exception as e:  # noqa: BLE001 - a failed stream is reported with the round
            self.error = str(e)

    def wait_tokens(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.times) < n and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(self.times) >= n

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def one_round(client, rng: random.Random, n_vocab: int, a: argparse.Namespace) -> dict:
    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, n_vocab - 1) for _ in range(n)]

    streams = [_Stream(client, tokens(32), a.answer) for _ in range(a.streams)]
    try:
        for s in streams:
            if not s.wait_tokens(a.warm, 600):
                raise BenchError(f"a stream sent {len(s.times)} tokens of {a.warm} ({s.error or 'ended early'})")
        join = _Stream(client, tokens(a.join_tokens), 4)
        join.wait_tokens(4, 600)
        join.stop()
        if join.error or not join.times:
            raise BenchError(f"the joining request failed: {join.error or 'no token'}")
    finally:
        for s in streams:
            s.stop()
    first = join.times[0]
    if any(not s.times or s.times[-1] <= first for s in streams):
        raise BenchError(f"a stream ended before the joining prompt's first token: give --answer more than {a.answer}")
    across, usual = [], []
    for s in streams:
        # a step's tokens reach the client as events within a millisecond: one chunk, and the wait
        # before the next chunk runs from its last event (as bench --load counts them)
        for t0, t1 in zip(s.times, s.times[1:]):
            if t1 - t0 > CHUNK_JOIN_S:
                (across if t0 < first and t1 > join.sent else usual).append(t1 - t0)
    return {"ttft_s": first - join.sent, "stall_s": max(across) if across else 0.0,
            "usual_wait_s": statistics.median(usual) if usual else None, "stream_tokens": [len(s.times) for s in streams]}


def join(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    arms, log_dir, n_vocab, logs, log_start = prepare(a, parallel=a.streams + 1,
                                                      slot_ctx=a.join_tokens + a.answer + 64, name="join")
    rng = random.Random(a.seed)
    rounds: dict[str, list[dict]] = {k: [] for k in arms}
    with ExitStack() as stack:
        clients = {k: stack.enter_context(ms.running(s, logs[k])) for k, s in arms.items()}
        for r in range(a.rounds):
            for k, c in clients.items():
                got = one_round(c, rng, n_vocab, a)
                rounds[k].append(got)
                print(f"round {r + 1}/{a.rounds} {k:<8} join TTFT {1000 * got['ttft_s']:7.1f} ms, streams' longest "
                      f"wait across it {1000 * got['stall_s']:7.1f} ms, usual wait "
                      f"{1000 * (got['usual_wait_s'] or 0):5.1f} ms", flush=True)
    summary = {k: {m: statistics.median(x[m] for x in rs) for m in ("ttft_s", "stall_s")} for k, rs in rounds.items()}
    print(f"\n{a.streams} streams, a {a.join_tokens}-token prompt joining, {a.rounds} rounds an arm (medians; "
          f"logs: {log_dir})")
    width = max(10, *(len(k) + 2 for k in arms))
    print(f"{'arm':<{width}}{'stall ms':>10}{'join TTFT ms':>14}")
    for k, s in summary.items():
        print(f"{k:<{width}}{1000 * s['stall_s']:>10.1f}{1000 * s['ttft_s']:>14.1f}")
    by_arm = ratios_by_arm(summary, ("ttft_s", "stall_s"))
    ratios = by_arm["drafted"]
    phases = {}
    if a.profile:
        for k in arms:
            joined = [s for s in new_steps(logs[k], log_start[k])
                      if s.kind == "join" and s.prompt_rows >= a.join_tokens // 2]
            sums = tsteps.summarize_steps(joined).get("join")
            if sums:
                phases[k] = asdict(sums)
                print(f"{k} join steps ({sums.count}): wall p50 {sums.wall_p50_ms:.1f} ms; "
                      + ", ".join(f"{p} {v:.2f}" for p, v in sums.phase_means_ms.items()))
    write_report(a, arms, rounds=rounds, summary=summary, ratios=ratios, ratios_by_arm=by_arm, join_steps=phases)
    return 0


FIRST_DOC = """The wait after a request's first token, plain against drafted, each request alone on its
server.

Both servers (``--slots`` slots, as ``serve`` starts them on this backend; the drafted one at serve's
draft length and cut, real acceptance unless ``--synthetic-rates``) run at once and take turns, one
request each in turn: a greedy stream of ``--answer`` tokens after a random-token prompt of
``--prompt-tokens`` (no prompt cache; ``LO-HI``: a length drawn a round), after one untimed request
an arm (a fresh server's first requests pay for its warm-up). Each slot's context holds just the
longest prompt and its answer unless ``--slot-ctx``: with more, the cells a graph attends to (padded
to 256) take another shape with a prompt of another length, as in ``bench --load``'s servers (4096
a slot). Per request: its time to first token, its first wait (first
token to the next chunk), its longest later wait and the median of its later waits; the table gives
each arm's medians over rounds and drafted / plain. With ``--profile`` (``LLAMA_SPEC_PROFILE_SLOW=0``,
patch 0072) the phases of each request's first generating step follow beside those of its later
ones (the profile's synchronisations slow both servers: compare arms and steps).
"""


def first_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--prompt-tokens", type=token_range, default=(800, 800), metavar="N|LO-HI",
                    help="each request's prompt tokens: N, or drawn from LO-HI a round (both arms the same)")
    ap.add_argument("--answer", type=int, default=64, help="each request's answer tokens")
    ap.add_argument("--slot-ctx", type=int, default=0,
                    help="each slot's context (0: the longest prompt + answer + 64, so the cells a graph attends "
                         "to keep one shape; bench --load's servers have 4096 a slot)")
    ap.add_argument("--slots", type=int, default=1, help="the servers' slots (-np; bench --load's: 64)")
    ap.add_argument("--rounds", type=int, default=8, help="requests an arm")
    arm_arguments(ap)


def token_range(text: str) -> tuple[int, int]:
    """``N`` or ``LO-HI`` (tokens) as (lo, hi)."""
    lo, _, hi = text.partition("-")
    try:
        r = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected N or LO-HI tokens") from None
    if not 0 < r[0] <= r[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < LO <= HI")
    return r


def first_wait(client, prompt: list[int], n_predict: int) -> dict:
    s = _Stream(client, prompt, n_predict)
    s.wait_tokens(n_predict, 600)
    s.stop()
    waits = [t1 - t0 for t0, t1 in zip(s.times, s.times[1:]) if t1 - t0 > CHUNK_JOIN_S]
    if s.error or len(waits) < 2:
        raise BenchError(f"a request sent {len(s.times)} token events, {len(waits)} of them more than "
                         f"{1000 * CHUNK_JOIN_S:g} ms after the one before ({s.error or 'too few waits to measure'}): "
                         f"give --answer more than {n_predict}")
    return {"ttft_s": s.times[0] - s.sent, "first_wait_s": waits[0], "longest_later_s": max(waits[1:]),
            "usual_wait_s": statistics.median(waits[1:]), "chunks": len(s.times)}


def first_steps(steps: list, skip: int = 0) -> tuple[list, list]:
    """A server's generating steps split into each request's first one (after a prompt step) and the
    rest, the first ``skip`` requests' steps left out (one request at a time)."""
    firsts, later, after_prompt, requests = [], [], False, 0
    for s in steps:
        if s.kind == "generate":
            requests += after_prompt
            if requests > skip:
                (firsts if after_prompt else later).append(s)
        after_prompt = s.prompt_rows > 0
    return firsts, later


def first(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    lo, hi = a.prompt_tokens
    arms, log_dir, n_vocab, logs, log_start = prepare(a, parallel=a.slots, slot_ctx=a.slot_ctx or hi + a.answer + 64,
                                                      name="first")
    rng = random.Random(a.seed)
    rounds: dict[str, list[dict]] = {k: [] for k in arms}
    with ExitStack() as stack:
        clients = {k: stack.enter_context(ms.running(s, logs[k])) for k, s in arms.items()}
        warm = [rng.randrange(100, n_vocab - 1) for _ in range(rng.randint(lo, hi))]
        for c in clients.values():
            first_wait(c, warm, a.answer)
        for r in range(a.rounds):
            prompt = [rng.randrange(100, n_vocab - 1) for _ in range(rng.randint(lo, hi))]
            for k, c in clients.items():
                got = first_wait(c, prompt, a.answer) | {"prompt_tokens": len(prompt)}
                rounds[k].append(got)
                print(f"round {r + 1}/{a.rounds} {k:<8} TTFT {1000 * got['ttft_s']:7.1f} ms, first wait "
                      f"{1000 * got['first_wait_s']:6.1f} ms, longest later {1000 * got['longest_later_s']:6.1f} ms, "
                      f"usual {1000 * got['usual_wait_s']:5.1f} ms", flush=True)
    metrics = ("ttft_s", "first_wait_s", "longest_later_s", "usual_wait_s")
    summary = {k: {m: statistics.median(x[m] for x in rs) for m in metrics} for k, rs in rounds.items()}
    print(f"\none request at a time, {lo if lo == hi else f'{lo}-{hi}'}-token prompts, {a.answer}-token answers, {a.rounds} rounds an "
          f"arm, {a.slots}-slot servers (medians; logs: {log_dir})")
    width = max(10, *(len(k) + 2 for k in arms))
    print(f"{'arm':<{width}}{'TTFT ms':>10}{'first wait':>12}{'longest later':>15}{'usual':>8}")
    for k, s in summary.items():
        print(f"{k:<{width}}{1000 * s['ttft_s']:>10.1f}{1000 * s['first_wait_s']:>12.1f}"
              f"{1000 * s['longest_later_s']:>15.1f}{1000 * s['usual_wait_s']:>8.1f}")
    by_arm = ratios_by_arm(summary, metrics)
    phases = {}
    if a.profile:
        for k in arms:
            firsts, later = first_steps(new_steps(logs[k], log_start[k]), skip=1)  # the untimed one
            phases[k] = {}
            for name, group in (("first", firsts), ("later", later)):
                if group:
                    sums = tsteps.summarize_steps(group)["generate"]
                    phases[k][name] = asdict(sums)
                    print(f"{k} {name} generating steps ({sums.count}): wall p50 {sums.wall_p50_ms:.2f} ms; "
                          + ", ".join(f"{p} {v:.2f}" for p, v in sums.phase_means_ms.items()))
    write_report(a, arms, rounds=rounds, summary=summary, ratios=by_arm["drafted"], ratios_by_arm=by_arm,
                 first_steps=phases)
    return 0


STEPS_DOC = """Where a server's steps went: the engine's slow-step lines (patch 0072; start the server with
``LLAMA_SPEC_PROFILE_SLOW=MS``, 0 for every step) read from its logs. Steps are grouped by kind:
``join`` (prompt rows beside generating slots: what a streaming request waits through when a prompt
joins), ``prompt`` (prompt rows only) and ``generate``. For each kind: the count, the wall time's
p50 / p95 / max, the mean prompt rows, injection rows and target decodes, and each phase's mean
(target launch / wait / sample, injection launch / wait, draft block launch / wait / read, other
host). The profile synchronises each phase: compare phases and kinds, not the wall time with an
unprofiled server's.

    python benchmarks/stall.py steps server.log [more.log ...] [--top 5] [--json out.json]
"""


def steps_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("logs", nargs="+", type=Path, help="llama-server logs holding 'spec slow step' lines")
    ap.add_argument("--top", type=int, default=5, help="also print the N longest steps")
    ap.add_argument("--json", type=Path, help="write the summary and every step here")


def steps(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    found = []
    for path in a.logs:
        try:
            found += tsteps.parse_steps(path.read_text(errors="replace"))
        except OSError as e:
            ap.error(f"{path}: {e.strerror}")
    if not found:
        print(f"steps: no 'spec slow step' lines in {', '.join(map(str, a.logs))} "
              "(the engine needs patch 0072 and LLAMA_SPEC_PROFILE_SLOW set)", file=sys.stderr)
        return 1
    sums = tsteps.summarize_steps(found)
    print(f"{len(found)} steps; ms, means per step except the wall time and its share; gap: the host's time "
          "before a step")
    head = (f"{'kind':<10}{'steps':>6}{'share':>7}{'wall p50':>9}{'p95':>8}{'max':>8}{'gap':>7}{'slots':>6}"
            f"{'drafted':>8}{'prompt':>8}{'inj rows':>9}{'tgt dec':>8}")
    print(head + "".join(f"{p:>11}" for p in tsteps.PHASES))
    for kind, s in sums.items():
        print(f"{kind:<10}{s.count:>6}{s.wall_share:>7.0%}{s.wall_p50_ms:>9.2f}{s.wall_p95_ms:>8.2f}{s.wall_max_ms:>8.2f}"
              f"{s.since_last_mean_ms:>7.2f}{s.generating_slots_mean:>6.1f}{s.drafted_mean:>8.1f}"
              f"{s.prompt_rows_mean:>8.0f}{s.injection_rows_mean:>9.0f}{s.target_decodes_mean:>8.2f}"
              + "".join(f"{s.phase_means_ms[p]:>11.3f}" for p in tsteps.PHASES))
    for s in sorted(found, key=lambda s: -s.wall_ms)[:a.top]:
        parts = ", ".join(f"{p} {v:.2f}" for p, v in s.phases_ms.items())
        print(f"  {s.wall_ms:.2f} ms ({s.kind}: {s.prompt_rows} prompt rows, {s.generating_slots} generating slots, "
              f"{s.injection_rows} injected rows): {parts}")
    if a.json:
        a.json.write_text(json.dumps({"logs": [str(p) for p in a.logs],
                                      "summary": {k: asdict(v) for k, v in sums.items()},
                                      "steps": [asdict(s) | {"kind": s.kind} for s in found]}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"join": (JOIN_DOC, join_arguments, join),
                                          "first": (FIRST_DOC, first_arguments, first),
                                          "steps": (STEPS_DOC, steps_arguments, steps)}, argv)


if __name__ == "__main__":
    sys.exit(main())
