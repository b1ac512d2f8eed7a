#!/usr/bin/env python3
"""Engine patch 0052: a step takes the graph's top K only when a busy slot's sampler can use it.

Since patch 0050 the target's graph can take each output row's K largest logits (K 64 where the
logits are computed on a CUDA device, none elsewhere; ``LLAMA_OUTPUT_TOPK=K`` sets it, 0: none),
and a sampled chain whose top-k comes first reads those K candidates instead of the row. Patch 0052
turns that top-k on only for a step where some busy slot's sampler can take its candidates from it
(``common_sampler_graph_topk``: a top-k below K first, no positive logit bias) and off otherwise.
This check sends one request at a time to a plain and a drafted server (``-v``: the engine logs
"the graph's top-K on|off" when it switches and "top-k k from the graph's top K candidates" when a
sampler takes them), each with ``LLAMA_OUTPUT_TOPK=K``, with 0 and without the variable (these CPU
servers: none):

    greedy, top-k 40, greedy, no top-k (top_k 0), top-k 100, a positive logit bias, top-k K, top-k 20

and requires, with K: the top-k on after each request whose sampler can take it (top-k
40 and 20) and taken there, off after every other, never taken there; with 0: no switch and no
candidates taken, and the same unset; and every request's tokens the same all three ways (seeded
draws).

A CPU build is enough (the switch is host logic; the CUDA kernels are ``topk_cuda.cu``'s)::

    python benchmarks/graph_topk_switch.py --server "$(ggufdspark build-engine --print-path)"
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, sampling_speed  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402

SWITCH = re.compile(r"the graph's top-(\d+) (on|off)")
TAKEN = re.compile(r"from the graph's top \d+ candidates")


def requests(k: int) -> list[tuple[str, dict, bool]]:
    """(what, request options, whether its sampler takes the graph's top ``k``), in order."""
    sampled = {"temperature": 0.8}
    return [("greedy", {"temperature": 0.0}, False),
            ("top-k 40", {**sampled, "seed": 5}, True),
            ("greedy", {"temperature": 0.0}, False),
            ("no top-k", {**sampled, "seed": 5, "top_k": 0}, False),
            ("top-k 100", {**sampled, "seed": 5, "top_k": 100}, False),
            ("positive bias", {**sampled, "seed": 5, "logit_bias": [[100, 0.5]]}, False),
            (f"top-k {k} (= K)", {**sampled, "seed": 7, "top_k": k}, False),
            ("top-k 20", {**sampled, "seed": 9, "top_k": 20}, True)]


def run_arm(settings, k: int | None, log: Path, n_predict: int) -> tuple[list[list[int]], list[str]]:
    """Each request's tokens and the server log written while it ran."""
    env = {key: v for key, v in settings.env.items() if key != "LLAMA_OUTPUT_TOPK"}
    if k is not None:
        env["LLAMA_OUTPUT_TOPK"] = str(k)
    outs, marks = [], []
    with ms.running(replace(settings, env=env), log) as c:
        prompt = c.tokenize(harness.PROMPT)
        marks.append(len(log.read_text(errors="replace")))
        for _, opts, _ in requests(k or 64):
            outs.append(c.complete(prompt, n_predict=n_predict, **opts).tokens)
            marks.append(len(log.read_text(errors="replace")))
    text = log.read_text(errors="replace")
    return outs, [text[a:b] for a, b in zip(marks, marks[1:])]


def check(name: str, k: int | None, parts: list[str]) -> list[str]:
    """What went wrong in one arm's log (nothing: []), each request's switches printed."""
    if k and not any(SWITCH.search(p) for p in parts):
        return [f"{name}: the engine never switched the graph's top-{k} on or off: a build without "
                f"patches 0050 and 0052"]
    problems = []
    on = True  # the context's default until the server first sets it
    for (what, _, takes), part in zip(requests(k or 64), parts):
        switches = SWITCH.findall(part)
        taken = len(TAKEN.findall(part))
        on = switches[-1][1] == "on" if switches else on
        shown = "unset" if k is None else k
        print(f"{name:8} LLAMA_OUTPUT_TOPK={shown:<5} {what:16} switches {switches or '-'}, candidates taken {taken}")
        if not k and (switches or taken):
            problems.append(f"{name}, LLAMA_OUTPUT_TOPK={shown}, {what}: switched {switches} / took candidates {taken}")
        elif k and (on != takes or (taken > 0) != takes):
            problems.append(f"{name}, {what}: top-k {'on' if on else 'off'} after it and candidates taken {taken}; "
                            f"expected {'on and taken' if takes else 'off and none'}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="llama-server (build-engine --print-path)")
    ap.add_argument("--k", type=int, default=64, help="LLAMA_OUTPUT_TOPK (64)")
    ap.add_argument("--n-predict", type=int, default=24, help="tokens a request (24)")
    ap.add_argument("--vocab", type=int, default=32000, help="the generated pair's vocabulary (32000)")
    ap.add_argument("--work", type=Path, help="where the pair and logs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    os.environ.pop("LLAMA_OUTPUT_TOPK", None)  # the unset arm must not inherit it from here

    with tempfile.TemporaryDirectory(prefix="graph-topk-") as tmp:
        work = args.work or Path(tmp)
        target, draft = sampling_speed.generated_pair(work / "pair", args.vocab)
        base = harness.with_args(harness.base_settings(args.server, target, gpu=False, parallel=2,
                                                       n_predict=args.n_predict), ["-v"])
        problems: list[str] = []
        for name, settings in {"plain": base, "drafted": harness.drafted(base, draft, 4, None)}.items():
            tokens = {}
            for k in (args.k, 0, None):
                log = work / f"{name}-{'unset' if k is None else k}.log"
                log.unlink(missing_ok=True)
                tokens[k], parts = run_arm(settings, k, log, args.n_predict)
                problems += check(name, k, parts)
            if not tokens[args.k] == tokens[0] == tokens[None]:
                problems.append(f"{name}: the tokens differ with LLAMA_OUTPUT_TOPK={args.k}, 0 and unset")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
