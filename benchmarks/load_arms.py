#!/usr/bin/env python3
"""Several drafted servers against one plain server under ``bench --load``'s traffic, side by side.

``ggufdspark bench --load`` measures the server ``serve`` would start against plain; ``tune --load``
one arm per draft length. This runs named drafted arms of your choosing in the same interleaved
run (all servers up, each level on every arm in turn), each with its draft length, load cut and
engine environment variables, so that an engine switch is measured against the same table without
it, under the same traffic and the same plain arm:

    python benchmarks/load_arms.py -m T.gguf -md D.gguf --clients 16,32,64 \\
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

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks.engine_env import split_env  # noqa: E402
from ggufdspark import launch  # noqa: E402
from ggufdspark.measuring import loadbench, loadplan  # noqa: E402
from ggufdspark.measuring.acceptance import PROFILES  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.serve_checks import ServingOptions  # noqa: E402


def parse_arm(spec: str) -> loadplan.DraftArm:
    """``NAME=N_MAX [CUT] [KEY=VALUE ...]`` -> a drafted arm; ``NAME=plain KEY=VALUE ...`` -> a plain one."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    layout = "pooled" if "layout=pooled" in words else None
    words = [w for w in words if w != "layout=pooled"]
    bad = (f"--arm {spec!r}: expected NAME=N_MAX [N:L,...] [KEY=VALUE ...] [layout=pooled] or "
           f"NAME=plain KEY=VALUE ... [layout=pooled]")
    if sep and name and name != "plain" and words[:1] == ["plain"]:
        env, rest_words = split_env(words[1:])
        if rest_words or not (env or layout):
            raise ValueError(bad)
        return loadplan.DraftArm(name, None, None, env, drafted=False, layout=layout)
    if not sep or not name or name == "plain" or not words or not words[0].isdigit() or int(words[0]) < 1:
        raise ValueError(bad)
    env, rest_words = split_env(words[1:])
    if len(rest_words) > 1:
        raise ValueError(bad)
    try:
        cut = launch.parse_draft_cut(rest_words[0]) if rest_words else None
    except Exception as e:  # noqa: BLE001 - one line, whatever the parser said
        raise ValueError(f"{bad}: {e}") from None
    return loadplan.DraftArm(name, int(words[0]), cut, env, layout=layout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--conversations", action="store_true",
                    help="each client one conversation through the prompt cache (bench --load --conversations)")
    ap.add_argument("--real", action="store_true", help="real acceptance instead of the published profile")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--log-dir", type=Path, default=None, help="keep the server logs here")
    a = ap.parse_args(argv)
    # each level's result on stderr as it ends: a run cut short by a time limit still shows what it measured
    logging.basicConfig(level=logging.INFO, format="load_arms: %(message)s", stream=sys.stderr)
    try:
        arms = [parse_arm(spec) for spec in a.arm]
        clients = [int(c) for c in a.clients.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if len({arm.name for arm in arms}) != len(arms):
        ap.error("--arm: every arm needs its own name")
    rates = None if a.real else list(PROFILES["published"].rates)
    try:
        opts = ServingOptions(model=a.target, draft=a.draft, server=a.server)
        plan = loadplan.plan_load(opts, clients=clients, requests_per_client=a.requests_per_client,
                                  answer_tokens=a.answer_tokens, synthetic_rates=rates, draft_arms=arms,
                                  rounds=a.rounds, temperature=a.temperature, noise_floor=a.noise_floor,
                                  conversation=a.conversations)
        report = loadbench.run_load(plan, log_dir=a.log_dir, command=" ".join(
            ["load_arms.py", *(argv if argv is not None else sys.argv[1:])]))
    except GgufdsparkError as e:
        print(f"load_arms.py: {e}", file=sys.stderr)
        return 1
    print(report.text())
    if a.json:
        a.json.write_text(json.dumps(report.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
