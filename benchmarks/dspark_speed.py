#!/usr/bin/env python3
"""DSpark decode speed vs the plain target, side by side in one run, on whatever engine you give.

Arms (each its own llama-server start: the pinned server ignores per-request speculative.n_max):

* plain target, concurrency 1;
* target + DSpark draft with llama.cpp's synthetic acceptance at draft lengths ``--lengths``,
  concurrency 1. The per-position acceptance is held fixed across lengths: the rates are the
  geometric profile whose mean accept length is ``--accept-len`` (4.22: the published drafter)
  at ``--block`` (9), truncated for shorter drafts, never rescaled per length;
* optional engine-flag variants at the best length (``--variants``);
* optional engine environment variants at every length (``--env-variants``: switches of the
  engine patch series such as ``GGML_CUDA_MMVF_MAX_N=8``, measured against the default in the same
  run);
* aggregate throughput at ``--concurrency`` levels for plain, the best length and the block size.

Prints a table (tok/s and ratios vs plain) and writes the raw numbers as JSON (``--json``).
Used for the H200 figures in docs/benchmarks.md; runs on CPU with the small pair as a smoke test:

    python benchmarks/dspark_speed.py --target T.gguf --draft D.gguf [--gpu] [--server PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks.cli_args import add_pair_arguments  # noqa: E402
from benchmarks.engine_env import environ, parse_env  # noqa: E402
from ggufdspark import engine, launch  # noqa: E402
from ggufdspark import measure as ms  # noqa: E402
from ggufdspark.runners.server import ServerProcess  # noqa: E402
from ggufdspark.acceptance import geometric_rates  # noqa: E402  (llama.cpp's own construction)

PROMPT = ("Describe in detail how speculative decoding works with a small draft model and a large "
          "target model, what acceptance length means, and why the output is unchanged.")


def one_request(client, tokens, n_predict, seed=None):
    t0 = time.perf_counter()
    extra = {} if seed is None else {"seed": seed}
    out = client.complete(tokens, n_predict=n_predict, ignore_eos=True, **extra)
    return out, time.perf_counter() - t0


def run_arm(name, settings, args, *, concurrency=(1,), log_dir: Path):
    """Start one server, warm up, measure; returns a dict of results."""
    res = {"arm": name, "cmd": " ".join(settings.redacted())}
    srv = ServerProcess(settings, log_path=log_dir / f"{name}.log", start_timeout=600)
    with srv:
        c = srv.client()
        tokens = c.tokenize(PROMPT)
        one_request(c, tokens, 32)  # warm-up (graphs, caches)
        if 1 in concurrency:
            tps, wall, acc = [], [], []
            for trial in range(args.trials):
                # the same synthetic acceptance draws in every arm: the server seeds them from the request
                out, w = one_request(c, tokens, args.n_predict, seed=args.seed + trial)
                tps.append(out.timings.decode_tps)
                wall.append(w)
                acc.append(out.timings.accept_length)
            res["decode_tps"] = statistics.median(tps)
            res["decode_tps_all"] = tps
            res["e2e_s"] = statistics.median(wall)
            res["accept_length"] = statistics.median([a for a in acc if a] or [0]) or None
        for n in (x for x in concurrency if x > 1):
            agg = []
            for _ in range(args.load_trials):
                outs = []

                def worker():
                    outs.append(one_request(c, tokens, args.n_predict)[0])

                threads = [threading.Thread(target=worker) for _ in range(n)]
                t0 = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                agg.append(sum(o.timings.predicted_n or 0 for o in outs) / wall)
            res[f"aggregate_tps_c{n}"] = statistics.median(agg)
            res[f"aggregate_tps_c{n}_all"] = agg
    return res


def parse_env_variants(text: str) -> list[dict[str, str]]:
    """``"A=1;A=1,B=8"`` -> ``[{"A": "1"}, {"A": "1", "B": "8"}]``."""
    out = []
    for group in (g.strip() for g in text.split(";")):
        if not group:
            continue
        try:
            out.append(parse_env(group))
        except ValueError as e:
            raise SystemExit(f"dspark_speed: --env-variants: {e}") from None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--n-predict", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--trials", type=int, default=3, help="measured requests per arm (medians reported)")
    ap.add_argument("--load-trials", type=int, default=1,
                    help="waves of requests per concurrency level and arm (the median aggregate is reported)")
    ap.add_argument("--accept-len", type=float, default=4.22,
                    help="mean accept length of the synthetic acceptance held fixed")
    ap.add_argument("--block", type=int, default=9, help="block size the synthetic rates are spread over")
    ap.add_argument("--lengths", default="1,2,3,4,5,6,7,8,9", help="draft lengths (n_max) to measure, comma-separated")
    ap.add_argument("--concurrency", default="8,32", help="parallel-request levels, comma-separated")
    ap.add_argument("--load-lengths", default="",
                    help="draft lengths measured at the --concurrency levels, comma-separated (default: the best "
                         "length at one request and --block)")
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="extra llama-server argument for every arm, plain included (repeat; e.g. --engine-arg=-bs)")
    ap.add_argument("--variants", default="", help="semicolon-separated extra llama-server flag sets to try at the best length")
    ap.add_argument("--env-variants", default="",
                    help="semicolon-separated NAME=VALUE[,NAME=VALUE] engine environments, each measured "
                         "at every draft length beside the default (e.g. 'GGML_CUDA_MMVF_MAX_N=8;GGML_CUDA_SMALL_SHAPES=1')")
    ap.add_argument("--seed", type=int, default=1,
                    help="trial i's request seed is SEED+i, so every arm draws the same synthetic acceptance")
    ap.add_argument("--json", type=Path, default=Path("dspark_speed.json"), help="write the raw numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("dspark_speed_logs"), help="keep the server logs here")
    args = ap.parse_args()
    if args.trials < 1 or args.load_trials < 1:
        ap.error(f"--trials {args.trials} / --load-trials {args.load_trials}: at least 1")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    info = engine.find_engine(args.server)
    server = info.path
    # the table's row for the backend, through the seam serve uses (ggufdspark.launch)
    decision = launch.table_decision("cuda" if args.gpu else "cpu")
    rates = geometric_rates(args.accept_len, args.block)
    env_variants = parse_env_variants(args.env_variants)
    conc = [int(x) for x in args.concurrency.split(",") if x]
    try:
        load_lengths = [int(x) for x in args.load_lengths.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--load-lengths {args.load_lengths!r}: expected draft lengths, comma-separated")
    max_np = max(conc + [1])

    def settings(draft_n: int | None, extra: list[str] | None = None, parallel: int = 1):
        ctx = launch.context(parallel, model=args.target, ctx_per_slot=args.n_predict + 256)
        s = launch.server_settings(decision, info, model=args.target, ctx=ctx, parallel=parallel, metrics=False,
                                   extra_args=list(args.engine_arg) + list(extra or []))
        if draft_n:  # the draft at this length, synthetic acceptance added as bench and tune add it
            s = ms.arm_settings(s, args.draft, n_max=draft_n, synthetic=ms.Synthetic(rates=rates[:draft_n]))
        return s

    results = []
    plain = run_arm("plain", settings(None), args, log_dir=args.log_dir)
    results.append(plain)
    print(f"plain: {plain['decode_tps']:.1f} tok/s", file=sys.stderr)
    for n in [int(x) for x in args.lengths.split(",")]:
        r = run_arm(f"dspark-n{n}", settings(n), args, log_dir=args.log_dir)
        r["draft_n_max"] = n
        results.append(r)
        print(f"n_max {n}: {r['decode_tps']:.1f} tok/s (accept length {r['accept_length']})", file=sys.stderr)
        for env in env_variants:
            label = ",".join(f"{k}={v}" for k, v in env.items())
            with environ(env):
                r = run_arm(f"dspark-n{n}-" + label.replace("=", "").replace(",", "-"), settings(n), args,
                            log_dir=args.log_dir)
            r["draft_n_max"], r["env"] = n, label
            results.append(r)
            print(f"n_max {n} [{label}]: {r['decode_tps']:.1f} tok/s (accept length {r['accept_length']})",
                  file=sys.stderr)
    spec = [r for r in results if "draft_n_max" in r and not r.get("env")]
    best = max(spec, key=lambda r: r["decode_tps"])
    for i, v in enumerate(x for x in args.variants.split(";") if x.strip()):
        r = run_arm(f"dspark-n{best['draft_n_max']}-variant{i}", settings(best["draft_n_max"], v.split()), args,
                    log_dir=args.log_dir)
        r["variant"] = v
        r["draft_n_max"] = best["draft_n_max"]
        results.append(r)
        print(f"variant {v!r}: {r['decode_tps']:.1f} tok/s", file=sys.stderr)
    load = []
    if conc:
        load_lengths = load_lengths or list(dict.fromkeys([best["draft_n_max"], args.block]))
        for name, n in [("plain", None)] + [(f"dspark-n{k}", k) for k in load_lengths]:
            r = run_arm(f"{name}-np{max_np}", settings(n, parallel=max_np), args, concurrency=conc,
                        log_dir=args.log_dir)
            r["draft_n_max"] = n
            load.append(r)
            print(f"{name} under load: " + ", ".join(f"c{c} {r[f'aggregate_tps_c{c}']:.1f}" for c in conc), file=sys.stderr)

    base = plain["decode_tps"]
    print(f"\nsynthetic acceptance: mean length {args.accept_len} at block {args.block}, per-position rates "
          f"[{', '.join(f'{x:.3f}' for x in rates)}] truncated per length; {args.n_predict} tokens, greedy, "
          f"median of {args.trials}\n")
    print(f"{'arm':<58}{'decode tok/s':>14}{'vs plain':>10}{'accept len':>12}{'ms/step':>9}")
    for r in results:
        al = f"{r['accept_length']:.2f}" if r.get("accept_length") else "-"
        # a step makes accept-length tokens: its time, free of how lucky the acceptance draws were
        step = f"{1000 * r['accept_length'] / r['decode_tps']:.2f}" if r.get("accept_length") else "-"
        label = r["arm"] + (f" [{r['variant']}]" if r.get("variant") else "")
        if r.get("env"):
            label = f"dspark-n{r['draft_n_max']} [{r['env']}]"
        print(f"{label:<58}{r['decode_tps']:>14.1f}{r['decode_tps'] / base:>9.2f}x{al:>12}{step:>9}")
    if load:
        if args.load_trials > 1:
            print(f"\nunder load: median of {args.load_trials} waves a level")
        print(f"\n{'aggregate under load':<34}" + "".join(f"{'c' + str(c) + ' tok/s':>14}{'vs plain':>10}" for c in conc))
        for r in load:
            row = f"{r['arm']:<34}"
            for c in conc:
                v = r[f"aggregate_tps_c{c}"]
                row += f"{v:>14.1f}{v / load[0][f'aggregate_tps_c{c}']:>9.2f}x"
            print(row)
    args.json.write_text(json.dumps({"rates": rates, "results": results, "load": load,
                                     "server": server, "args": vars(args)}, indent=2, default=str))


if __name__ == "__main__":
    main()
