#!/usr/bin/env python3
"""The first request after ``ggufdspark serve`` says ready: with serve's warm-up against without it,
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

    python benchmarks/first_request.py -m T.gguf -md D.gguf [--server PATH] [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from ggufdspark.measuring import traffic  # noqa: E402
from ggufdspark.errors import EngineError  # noqa: E402
from ggufdspark.runners import lifeline  # noqa: E402
from ggufdspark.runners.client import Client  # noqa: E402
from ggufdspark.runners.server import free_port  # noqa: E402
from ggufdspark.warmup import WARMUP_TOKENS  # noqa: E402

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
        raise SystemExit(f"first_request.py: no prompt of at most {max_bytes} bytes in the traffic set")
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
            raise SystemExit(f"first_request.py: serve ({arm}) did not start: {proc.stderr.read()[-2000:]}")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
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
    a = ap.parse_args(argv)
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
                print(f"first_request: run {i + 1}/{a.runs}, {arm}", file=sys.stderr, flush=True)
                runs[arm].append(serve_once(arm, a, conv, long_conv, log_dir / f"{arm}-{i}.log"))
    except EngineError as e:
        print(f"first_request.py: {e} (logs: {log_dir})", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main())
