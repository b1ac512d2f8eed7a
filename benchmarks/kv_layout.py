#!/usr/bin/env python3
"""What the KV cache's layout across slots costs a step when the busy slots are scattered.

llama-server's own layout divides ``-c`` among the slots, one KV stream a slot; the pinned
engine then puts only sequences of consecutive ids in one batch (``llama_batch_allocr::split_equal``
with ``sequential``: a ubatch's streams are one contiguous range). The server picks a slot by
prompt similarity or least recent use, so under traffic the busy slots are scattered: four busy
slots 0, 4, 8, 12 are decoded as four one-row batches, each reading all the weights. One cache
shared by the slots, each capped at its share (``-kvu --kv-unified-per-slot``: "pooled") puts every
busy slot in one batch, but each row then attends over every slot's cells (the mask and the
attention grow with all the slots hold); ``serve`` keeps the divided layout and engine patch 0045
keeps the busy slots consecutive instead (the server's own slot choice; these requests are pinned).

For each layout (``divided``, ``pooled``) and arm (plain; drafted as ``serve`` runs it, at
synthetic acceptance at the published profile unless ``--real``), one server of ``--slots`` slots
answers ``--requests`` requests at once, pinned (``id_slot``) to consecutive slots (0, 1, 2, ...)
and to scattered ones (spread evenly over the slots); reported: the median request's decode tok/s
and the aggregate (answer tokens over the wall time), each placement's median over ``--trials``.

    python benchmarks/kv_layout.py -m T.gguf -md D.gguf [--gpu] [--slots 16] [--requests 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402


def placements(slots: int, requests: int) -> dict[str, list[int]]:
    """Slot ids for ``requests`` requests: consecutive from 0, and spread evenly over ``slots``."""
    step = max(slots // requests, 1)
    return {"consecutive": list(range(requests)), "scattered": [i * step for i in range(requests)]}


def one_round(client, prompts: list[list[int]], ids: list[int], n_predict: int) -> dict:
    """The requests at once, each pinned to its slot: decode tok/s of each, aggregate over the wall."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(ids)) as pool:
        outs = list(pool.map(lambda k: ms.request(client, prompts[k], n_predict, id_slot=ids[k], ignore_eos=True),
                             range(len(ids))))
    wall = time.perf_counter() - t0
    return {"decode_tps": statistics.median(o.timings.predicted_per_second for o in outs),
            "aggregate_tps": sum(len(o.tokens) for o in outs) / wall}


def measure(name: str, settings: ServerSettings, prompts: list[list[int]], a: argparse.Namespace) -> dict:
    row: dict = {"arm": name, "cmd": " ".join(settings.redacted())}
    with ms.running(settings, a.log_dir / f"{name}.log") as c:
        ms.warm(c)
        for place, ids in placements(a.slots, a.requests).items():
            one_round(c, prompts, ids, 8)  # every slot used once before the trials
            trials = [one_round(c, prompts, ids, a.n_predict) for _ in range(a.trials)]
            row[place] = {"ids": ids, "decode_tps": statistics.median(t["decode_tps"] for t in trials),
                          "aggregate_tps": statistics.median(t["aggregate_tps"] for t in trials)}
    row["scattered_vs_consecutive"] = row["scattered"]["aggregate_tps"] / row["consecutive"]["aggregate_tps"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--slots", type=int, default=16, help="the servers' slots (-np)")
    ap.add_argument("--requests", type=int, default=4, help="requests at once")
    ap.add_argument("--n-predict", type=int, default=128, help="tokens of every answer")
    ap.add_argument("--trials", type=int, default=3, help="rounds a placement (median reported)")
    ap.add_argument("--real", action="store_true", help="real acceptance instead of the published profile")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("kv_layout_logs"), help="keep the server logs here")
    a = ap.parse_args(argv)
    if not 1 <= a.requests <= a.slots or a.n_predict < 1 or a.trials < 1:
        ap.error(f"--requests {a.requests} must be 1..--slots {a.slots}; --n-predict and --trials at least 1")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    vocab = harness.n_vocab(a.server, a.target, a.log_dir, gpu=a.gpu)
    prompts = [p for p, _ in harness.workload(a.requests, vocab, (32, 32), (1, 1), seed=0)]
    info = engine.find_engine(a.server)
    if not info.kv_slot_cap:
        print(f"kv_layout.py: {info.path}: no --kv-unified-per-slot in this engine", file=sys.stderr)
        return 1
    divided = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=a.slots, n_predict=a.n_predict + 64,
                                    info=info)
    pooled = divided.pooled()
    rates = None if a.real else harness.published_rates(a.draft)
    rows = []
    for layout, base in (("divided", divided), ("pooled", pooled)):
        rows.append(measure(f"plain-{layout}", base, prompts, a))
        rows.append(measure(f"drafted-{layout}", harness.serve_drafted(base, a.draft, gpu=a.gpu, rates=rates),
                            prompts, a))
    print(f"{a.requests} requests at once on {a.slots} slots, {a.n_predict}-token greedy answers, "
          f"{'real' if a.real else 'synthetic (published profile)'} acceptance\n")
    print(f"{'arm':<18}{'placement':<13}{'slots':<16}{'agg tok/s':>10}{'dec tok/s':>10}")
    for r in rows:
        for place in ("consecutive", "scattered"):
            p = r[place]
            print(f"{r['arm']:<18}{place:<13}{','.join(map(str, p['ids'])):<16}{p['aggregate_tps']:>10.1f}"
                  f"{p['decode_tps']:>10.1f}")
        print(f"{'':<18}scattered / consecutive {r['scattered_vs_consecutive']:.2f}x")
    by = {r["arm"]: r for r in rows}
    summary = {arm: by[f"{arm}-pooled"]["scattered"]["aggregate_tps"] / by[f"{arm}-divided"]["scattered"]["aggregate_tps"]
               for arm in ("plain", "drafted")}
    print("\nscattered slots, pooled / divided: " + ", ".join(f"{k} {v:.2f}x" for k, v in summary.items()))
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "slots": a.slots, "requests": a.requests,
                                      "n_predict": a.n_predict, "trials": a.trials, "arms": rows,
                                      "pooled_vs_divided_scattered": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
