#!/usr/bin/env python3
"""Serving as ``serve`` runs it, beyond what ``ggufdspark bench --load`` and ``tune --load`` answer:

* ``arms``: named drafted arms (each its draft length, load cut and engine variables) against one
  plain server under ``bench --load``'s traffic (``h200.sh arms``);
* ``table``: several ``tune --load --json`` results merged into one load table, its recommendation
  as ``DRAFT_N_MAX CUT`` (``h200.sh table`` serves it);
* ``first``: the first request after ``ggufdspark serve`` says ready, with serve's warm-up against
  without and the plain server's (``h200.sh first``).

    python benchmarks/serving.py arms -m T.gguf -md D.gguf --clients 16,32 --arm "table=7 16:0" [--json out.json]
    python benchmarks/serving.py table tune-a.json tune-b.json [--json merged.json]
    python benchmarks/serving.py first -m T.gguf -md D.gguf [--runs 3] [--json out.json]

``python benchmarks/serving.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark import launch  # noqa: E402
from ggufdspark.errors import EngineError, GgufdsparkError  # noqa: E402
from ggufdspark.measuring import loadbench, loadplan, traffic  # noqa: E402
from ggufdspark.measuring.acceptance import PROFILES  # noqa: E402
from ggufdspark.measuring.tune import MIN_GAIN  # noqa: E402
from ggufdspark.measuring.tuneload import recommend_load  # noqa: E402
from ggufdspark.runners import lifeline  # noqa: E402
from ggufdspark.runners.client import Client  # noqa: E402
from ggufdspark.runners.server import free_port  # noqa: E402
from ggufdspark.serve_checks import ServingOptions  # noqa: E402
from ggufdspark.warmup import WARMUP_TOKENS  # noqa: E402

ARMS_DOC = """Several drafted servers against one plain server under ``bench --load``'s traffic, side by side.

``ggufdspark bench --load`` measures the server ``serve`` would start against plain; ``tune --load``
one arm per draft length. This runs named drafted arms of your choosing in the same interleaved
run (all servers up, each level on every arm in turn), each with its draft length, load cut and
engine environment variables, so that an engine switch is measured against the same table without
it, under the same traffic and the same plain arm:

    python benchmarks/serving.py arms -m T.gguf -md D.gguf --clients 16,32,64 \\
        --arm "table=7 16:0" --arm "generating=7 16:0 LLAMA_SPEC_CUT_GENERATING=1" --json out.json

An arm is ``NAME=N_MAX [CUT] [KEY=VALUE ...] [layout=pooled]``: CUT as ``--draft-n-max-by-slots``
takes it (``16:0``, ``8:5,16:0``), KEY=VALUE an environment variable of that arm's server only,
``layout=pooled`` one KV cache shared by the slots, each capped at its share (``-kvu
--kv-unified-per-slot``), instead of llama-server's own layout (``-c`` divided among the slots),
which ``serve`` runs; or ``NAME=plain KEY=VALUE ... [layout=pooled]``: another plain server, with
those variables or that layout (what would act on both servers, measured on both). Every ratio is
against the plain arm. Synthetic
acceptance at the published profile unless ``--real``. The servers are ``serve``'s for the backend
the engine reports (everything offloaded on CUDA).
"""

TABLE_DOC = """Merge ``tune --load --json`` results into one load table and print the recommendation as
``DRAFT_N_MAX CUT`` (``CUT``: ``N:L,...`` for ``--draft-n-max-by-slots``, or ``off``), what the
device script's ``table`` stage serves with. Each run's ratios are drafted / plain within that run;
a length measured in several runs keeps the last run's.

    python benchmarks/serving.py table tune-a.json tune-b.json [--min-gain 1.02] [--json merged.json]
"""

FIRST_DOC = """The first request after ``ggufdspark serve`` says ready: with serve's warm-up against without it,
and the plain server's.

Every run starts fresh servers exactly as a user does (``python -m ggufdspark serve ... --json``, a
free port on 127.0.0.1, no chat page, each with its own log), one an arm, the arms taking turns run
by run:

* ``warm``: serve with the draft and ``--warmup`` (serve's default on CUDA: a 2048-token prompt; on
  other backends a short one);
* ``cold``: the same with ``--no-warmup`` (serve's default on the CPU; the engine's own empty run of
  the target stays);
* ``plain``: ``--no-draft``;
* ``long`` and ``plain-long``: ``cold`` and ``plain`` whose client first sends one untimed request
  of a longer prompt (the traffic set's longest conversation of at most ``--prewarm-max-prompt-bytes``,
  16 tokens): what a warm-up through prompt processing at a real prompt's size takes away of the
  first request's cost (on a GPU, kernels loaded at their first launch), the question behind
  serve's CUDA default; for a plain server too. Not in the default arms.

Each fresh server answers ``--requests`` greedy requests one after the other, all the same prompt
(streamed, prompt cache off, so each processes the whole prompt: a conversation of the load
benchmark's traffic set, the first of at most ``--max-prompt-bytes``): the first is the request a
user meets after a start, the rest its warm reference. Prints per arm the medians over runs of the
start (to serve's ready record), the first request's time to first token and end-to-end time, the
warm requests' TTFT, the first / warm TTFT ratio, and each arm's first TTFT against plain's. On a
GPU serve offloads as it does for that backend (no flags here).

    python benchmarks/serving.py first -m T.gguf -md D.gguf [--server PATH] [--runs 3] [--json out.json]
"""


def parse_load_arm(spec: str) -> loadplan.DraftArm:
    """``NAME=N_MAX [CUT] [KEY=VALUE ...]`` -> a drafted arm; ``NAME=plain KEY=VALUE ...`` -> a plain one."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    layout = "pooled" if "layout=pooled" in words else None
    words = [w for w in words if w != "layout=pooled"]
    bad = (f"--arm {spec!r}: expected NAME=N_MAX [N:L,...] [KEY=VALUE ...] [layout=pooled] or "
           f"NAME=plain KEY=VALUE ... [layout=pooled]")
    if sep and name and name != "plain" and words[:1] == ["plain"]:
        env, rest_words = harness.split_env(words[1:])
        if rest_words or not (env or layout):
            raise ValueError(bad)
        return loadplan.DraftArm(name, None, None, env, drafted=False, layout=layout)
    if not sep or not name or name == "plain" or not words or not words[0].isdigit() or int(words[0]) < 1:
        raise ValueError(bad)
    env, rest_words = harness.split_env(words[1:])
    if len(rest_words) > 1:
        raise ValueError(bad)
    try:
        cut = launch.parse_draft_cut(rest_words[0]) if rest_words else None
    except Exception as e:  # noqa: BLE001 - one line, whatever the parser said
        raise ValueError(f"{bad}: {e}") from None
    return loadplan.DraftArm(name, int(words[0]), cut, env, layout=layout)


def arms_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-m", "--target", "--model", dest="target", required=True, help="target GGUF")
    ap.add_argument("-md", "--draft", dest="draft", required=True, help="DSpark draft GGUF")
    ap.add_argument("--server", help="llama-server (default: the build ggufdspark finds)")
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=N_MAX [CUT] [KEY=VALUE ...]",
                    help="a drafted arm, or NAME=plain KEY=VALUE ... another plain one (repeatable)")
    ap.add_argument("--clients", default="1,8,32", help="closed-loop client counts (default 1,8,32)")
    ap.add_argument("--requests-per-client", type=int, default=2,
                    help="requests each client sends, one after another (default 2)")
    ap.add_argument("--answer-tokens", type=int, default=256, help="tokens of every answer (default 256)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="every level this many times (bench --load --rounds: figures over all rounds, each round's "
                         "ratio kept)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 greedy (default); above, every request sampled at it with its own seed (bench --load "
                         "--temperature), e.g. with NAME=plain LLAMA_OUTPUT_TOPK=64 beside a drafted arm with it")
    ap.add_argument("--noise-floor", action="store_true",
                    help="a second plain server (plain2, the same command as plain) beside the arms: the run's own "
                         "noise band (bench --load --noise-floor)")
    ap.add_argument("--prompt-scale", type=int, default=1,
                    help="every prompt this many times as long (bench --load --prompt-scale: 2 for prompts twice as long)")
    ap.add_argument("--conversations", action="store_true",
                    help="each client one conversation through the prompt cache (bench --load --conversations)")
    ap.add_argument("--real", action="store_true", help="real acceptance instead of the published profile")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the server logs here")


def arms(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The named arms beside plain (``ARMS_DOC``); the report printed, its JSON in ``--json``."""
    # each level's result on stderr as it ends: a run cut short by a time limit still shows what it measured
    logging.basicConfig(level=logging.INFO, format="arms: %(message)s", stream=sys.stderr)
    try:
        named = [parse_load_arm(spec) for spec in a.arm]
        clients = [int(c) for c in a.clients.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if len({arm.name for arm in named}) != len(named):
        ap.error("--arm: every arm needs its own name")
    rates = None if a.real else list(PROFILES["published"].rates)
    try:
        opts = ServingOptions(model=a.target, draft=a.draft, server=a.server)
        plan = loadplan.plan_load(opts, clients=clients, requests_per_client=a.requests_per_client,
                                  answer_tokens=a.answer_tokens, synthetic_rates=rates, draft_arms=named,
                                  rounds=a.rounds, temperature=a.temperature, noise_floor=a.noise_floor,
                                  conversation=a.conversations, prompt_scale=a.prompt_scale)
        report = loadbench.run_load(plan, log_dir=a.log_dir, command=" ".join(
            ["serving.py", *sys.argv[1:]]))
    except GgufdsparkError as e:
        print(f"serving.py arms: {e}", file=sys.stderr)
        return 1
    print(report.text())
    if a.json:
        a.json.write_text(json.dumps(report.to_dict(), indent=1))
    return 0


# --------------------------------------------------------------------------- table


def merge_tunes(paths: list[str]) -> dict[int, dict[int, float]]:
    ratios: dict[int, dict[int, float]] = {}
    for p in paths:
        for n, by_level in json.loads(Path(p).read_text())["ratios"].items():
            ratios[int(n)] = {int(k): float(v) for k, v in by_level.items()}
    return ratios


def table_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("results", nargs="+", help="tune --load --json outputs")
    ap.add_argument("--min-gain", type=float, default=MIN_GAIN,
                    help="a length must beat plain (or the paused arm) by this much (default: tune's)")
    ap.add_argument("--json", help="write the merged ratios and recommendation here")


def table(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """Merge the tune results (``TABLE_DOC``): the recommendation on stdout as ``DRAFT_N_MAX CUT``."""
    ratios = merge_tunes(a.results)
    rec = recommend_load(ratios, min_gain=a.min_gain)
    if a.json:
        Path(a.json).write_text(json.dumps({"ratios": ratios, "recommendation": rec, "from": a.results}, indent=2))
    print(rec["why"], file=sys.stderr)
    cut = ",".join(f"{n}:{k}" for n, k in rec["load_cut"] or []) or "off"
    print(rec["draft_n_max"] or 0, cut)
    return 0


# --------------------------------------------------------------------------- first


REPO = Path(__file__).resolve().parent.parent
ARMS = {"warm": ["--warmup"], "cold": ["--no-warmup"], "plain": ["--no-draft"],
        "long": ["--no-warmup"], "plain-long": ["--no-draft"]}
DEFAULT_ARMS = ("warm", "cold", "plain")
PREWARMED = ("long", "plain-long")  # the client sends one untimed long request first
PREWARM_TOKENS = WARMUP_TOKENS  # as serve's own warm-up answers


def _size(messages: list[dict]) -> int:
    return sum(len(str(m["content"]).encode()) for m in messages)


def _conversations(max_bytes: int) -> list[list[dict]]:
    """The traffic set's conversations of at most ``max_bytes`` of text, in the set's fixed order."""
    items = [it.messages for it in traffic.traffic_items() if _size(it.messages) <= max_bytes]
    if not items:
        raise SystemExit(f"serving.py first: no prompt of at most {max_bytes} bytes in the traffic set")
    return items


def prompt(max_bytes: int) -> list[dict]:
    """The traffic set's first conversation of at most ``max_bytes`` of text, the longest such among
    its first ten (the set's order is fixed, so every arm and run sends the same one)."""
    return max(_conversations(max_bytes)[:10], key=_size)


def longest(max_bytes: int) -> list[dict]:
    """The traffic set's longest conversation of at most ``max_bytes`` of text (the long arms'
    untimed first prompt)."""
    return max(_conversations(max_bytes), key=_size)


def serve_once(arm: str, a: argparse.Namespace, conv: list[dict], long_conv: list[dict], log: Path) -> dict:
    """One fresh ``serve`` of ``arm``: its ready record, then the requests, then a clean stop."""
    port = free_port("127.0.0.1")
    cmd = [sys.executable, "-m", "ggufdspark", "serve", "-m", a.target, "--port", str(port), "--log", str(log),
           "--json", "--no-ui", "--stats-interval", "0", *(["--server", a.server] if a.server else []),
           *([] if arm == "plain" else ["-md", a.draft]), *ARMS[arm]]
    t0 = time.monotonic()
    # tied to this process (ggufdspark.runners.lifeline): a benchmark killed midway leaves no server
    proc, tie = lifeline.spawn(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # serve's first JSON record: ready (or nothing if it failed)
        if not line:
            raise SystemExit(f"serving.py first: serve ({arm}) did not start: {proc.stderr.read()[-2000:]}")
        ready = json.loads(line)
        started = time.monotonic() - t0
        client = Client(ready["url"], timeout=600)
        out = []
        prewarm = None
        if arm in PREWARMED:
            t1 = time.monotonic()
            r = client.stream_complete(client.apply_template(long_conv), n_predict=PREWARM_TOKENS, ignore_eos=True)
            prewarm = {"s": time.monotonic() - t1, "prompt_n": r.timings.prompt_n}
        text = client.apply_template(conv)
        for _ in range(a.requests):
            r = client.stream_complete(text, n_predict=a.answer_tokens, ignore_eos=True)
            out.append({"ttft_s": r.ttft_s, "e2e_s": r.e2e_s, "prompt_n": r.timings.prompt_n,
                        "draft_n": r.timings.draft_n})
        return {"arm": arm, "start_s": started, "warmup_s": ready.get("warmup_s"), "prewarm": prewarm,
                "requests": out}
    finally:
        proc.send_signal(signal.SIGTERM)  # serve stops its engine, then itself
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            lifeline.killpg(proc.pid)
            proc.communicate()
        tie.release()


def summary(runs: list[dict]) -> dict:
    """Medians over runs: the first request's TTFT and end-to-end time, the warm requests' TTFT."""
    first = [r["requests"][0] for r in runs]
    warm = [q["ttft_s"] for r in runs for q in r["requests"][1:]]
    s = {"first_ttft_s": statistics.median(q["ttft_s"] for q in first),
         "first_e2e_s": statistics.median(q["e2e_s"] for q in first),
         "warm_ttft_s": statistics.median(warm) if warm else None,
         "start_s": statistics.median(r["start_s"] for r in runs)}
    s["first_over_warm"] = s["first_ttft_s"] / s["warm_ttft_s"] if s["warm_ttft_s"] else None
    return s


def first_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--runs", type=int, default=3, help="fresh servers an arm (default 3)")
    ap.add_argument("--requests", type=int, default=3, help="requests a fresh server answers, the same prompt "
                    "(default 3: the first and two warm ones)")
    ap.add_argument("--answer-tokens", type=int, default=64, help="greedy tokens a request (default 64)")
    ap.add_argument("--max-prompt-bytes", type=int, default=4000,
                    help="the prompt: a conversation of the traffic set of at most this much text (default 4000)")
    ap.add_argument("--prewarm-max-prompt-bytes", type=int, default=12000,
                    help="the long arms' untimed first prompt: the traffic set's longest conversation of at most "
                         "this much text (default 12000)")
    ap.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                    help=f"which arms, from {','.join(ARMS)} (default {','.join(DEFAULT_ARMS)})")
    ap.add_argument("--json", type=Path, help="write the runs and the summary here")
    ap.add_argument("--log-dir", type=Path, help="the servers' logs (default: a temporary folder)")


def first(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The first request's arms (``FIRST_DOC``); the summary printed, every run in ``--json``."""
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ARMS for x in arms) or a.runs < 1 or a.requests < 1:
        ap.error(f"--arms from {','.join(ARMS)}, --runs and --requests at least 1")
    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix="first-request-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    conv = prompt(a.max_prompt_bytes)
    long_conv = longest(a.prewarm_max_prompt_bytes)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    try:
        for i in range(a.runs):
            for arm in arms:  # the arms take turns: a drift of the machine falls on all alike
                print(f"first: run {i + 1}/{a.runs}, {arm}", file=sys.stderr, flush=True)
                runs[arm].append(serve_once(arm, a, conv, long_conv, log_dir / f"{arm}-{i}.log"))
    except EngineError as e:
        print(f"serving.py first: {e} (logs: {log_dir})", file=sys.stderr)
        return 1
    sums = {arm: summary(rs) for arm, rs in runs.items()}
    base = sums.get("plain", {}).get("first_ttft_s")
    print(f"first request after serve's ready: {a.runs} fresh server(s) an arm, {a.requests} request(s) each, "
          f"{a.answer_tokens}-token greedy answers, medians over runs (logs: {log_dir})")
    print(f"{'arm':<11}{'start s':>9}{'first TTFT ms':>15}{'warm TTFT ms':>14}{'first/warm':>12}{'first e2e ms':>14}"
          f"{'vs plain first':>16}")
    for arm, s in sums.items():
        warm = f"{1000 * s['warm_ttft_s']:.1f}" if s["warm_ttft_s"] else "-"
        fw = f"{s['first_over_warm']:.2f}x" if s["first_over_warm"] else "-"
        vs = f"{s['first_ttft_s'] / base:.2f}x" if base else "-"
        print(f"{arm:<11}{s['start_s']:>9.1f}{1000 * s['first_ttft_s']:>15.1f}{warm:>14}{fw:>12}"
              f"{1000 * s['first_e2e_s']:>14.1f}{vs:>16}")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
                                      "runs": runs, "summary": sums}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"arms": (ARMS_DOC, arms_arguments, arms),
                                          "table": (TABLE_DOC, table_arguments, table),
                                          "first": (FIRST_DOC, first_arguments, first)}, argv)


if __name__ == "__main__":
    sys.exit(main())
