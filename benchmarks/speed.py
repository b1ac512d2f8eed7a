#!/usr/bin/env python3
"""One server's speed with the DSpark draft against without, arm against arm, every server built by
the harness (``benchmarks/harness.py``: ``ggufdspark.launch``, as ``serve`` builds its own):

* ``decode``: decode tok/s at one request (and N at once), plain against draft lengths, engine
  environments and llama-server flag variants (``h200.sh speed``);
* ``prefill``: prompt processing, what the draft costs before the first token (``h200.sh prefill``).

    python benchmarks/speed.py decode -m T.gguf -md D.gguf [--gpu] [--server PATH] [--json out.json]
    python benchmarks/speed.py prefill -m T.gguf -md D.gguf [--gpu] [--prompt-tokens 4096] [--json out.json]

``python benchmarks/speed.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness, paired  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from ggufdspark import engine, hardware, launch  # noqa: E402
from ggufdspark.errors import InputNotFoundError  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.measuring.acceptance import geometric_rates  # noqa: E402  (llama.cpp's own construction)
from ggufdspark.runners.server import ServerSettings  # noqa: E402

DECODE = """DSpark decode speed vs the plain target, side by side in one run, on whatever engine you give.

Arms (each its own llama-server start: the pinned server ignores per-request speculative.n_max):

* plain target, concurrency 1;
* target + DSpark draft with llama.cpp's synthetic acceptance at draft lengths ``--lengths``,
  concurrency 1. The per-position acceptance is held fixed across lengths: the rates are the
  geometric profile whose mean accept length is ``--accept-len`` (4.22: the published drafter)
  at ``--block`` (9), truncated for shorter drafts, never rescaled per length;
* optional engine-flag variants at the best length (``--variants``);
* optional other draft files of the same target at every length (``--other-drafts``: the draft in
  another precision, or with ``markov_w2`` in Q8_0), on servers of their own beside ``--draft``'s;
* optional engine environment variants at every length (``--env-variants``: switches of the
  engine patch series such as ``GGML_CUDA_MMF_FEW=4``, measured against the default in the same
  run);
* aggregate throughput at ``--concurrency`` levels for plain, the best length and the block size.

With ``--interleave`` the one-request arms' servers all run at once and take turns, one request
each per trial (``harness.measure_interleaved``): a machine that drifts during the run (the H200's
one-request ratio moved 2.22-2.33x between calls of one build, and arms measured later ran slower)
moves every arm alike. ``--variants`` are then measured at every length, as ``--env-variants`` are,
and on a plain server of their own too (a flag such as ``-ot token_embd.weight=CPU`` changes the
plain server as well: its ratio is against that plain arm; with ``--gpu`` every arm has the token
table on the GPU, as ``serve`` runs it on CUDA, and that flag puts it back where llama.cpp keeps it).

Prints a table (tok/s and ratios vs plain) and writes the raw numbers as JSON (``--json``).
Used for the H200 figures in docs/benchmarks.md; runs on CPU with the small pair as a smoke test:

    python benchmarks/speed.py decode --target T.gguf --draft D.gguf [--gpu] [--server PATH]
"""

PREFILL = """Prompt processing with the DSpark draft against without: what the draft costs before the first token.

Two arms, one server each with ``--concurrency`` slots, built by the harness (``ggufdspark.launch`` as
``serve`` builds its servers): the target alone, and the target with the
draft at ``--draft-n-max`` (default: serve's length for the backend) at real acceptance. Every
request asks for one token (``n_predict`` 1), so its time is the prompt's: the engine's ``prompt
eval time`` (timings ``prompt_per_second``). Prompts are ``--prompt-tokens`` random token ids (the
same ids in both arms; the prompt cache off, so every trial processes the whole prompt):

* one prompt at a time: median prompt tok/s of ``--trials`` requests;
* ``--concurrency`` different prompts at once (``ggufdspark.measuring.measure.measure_load``): the median
  of the requests' own prompt tok/s, and the aggregate (prompt tokens of all of them over the
  wall time from the first send to the last answer).

``--arm NAME=BASE [KEY=VALUE ...] [server args ...]`` adds a variant of the plain or drafted arm
(BASE ``plain`` or ``drafted``) with engine environment variables (upper-case KEY) and more
llama-server arguments, to split where a drafted prefill's time goes, e.g.
``--arm "paused=drafted --spec-draft-n-max-by-slots 0:0"`` or ``--arm "ckpt=drafted LLAMA_SPEC_CKPT_DFT=1"``.
Every arm's ratio is against ``plain``.

    python benchmarks/speed.py prefill -m T.gguf -md D.gguf [--gpu] [--prompt-tokens 4096] [--json out.json]
"""


def run_arm(name: str, settings, args, *, concurrency=(1,), log_dir: Path, env: dict[str, str] | None = None) -> dict:
    """One server measured by the harness (``harness.measure_arm``), as this script's rows: decode
    tok/s of single requests at level 1, ``aggregate_tps_cN`` (median of ``--load-trials`` waves of
    N requests at once) at each other level."""
    arm = harness.measure_arm(name, settings, log_dir, levels=list(concurrency), n_predict=args.n_predict,
                              trials=args.trials, load_trials=args.load_trials, rounds=1, seed=args.seed, env=env)
    return arm_row(arm, concurrency)


def arm_row(arm: harness.Arm, concurrency=(1,)) -> dict:
    """A harness arm as this script's row."""
    res = {"arm": arm.name, "cmd": arm.cmd}
    if 1 in concurrency:
        res.update(decode_tps=arm.tps, decode_tps_all=arm.runs, e2e_s=arm.e2e_s, accept_length=arm.accept_length)
        if arm.trial_t0_s:
            res["trial_t0_s"] = arm.trial_t0_s
    for n, point in arm.load.items():
        res[f"aggregate_tps_c{n}"] = point["tps"]
        res[f"aggregate_tps_c{n}_all"] = point["waves"]
    return res


def parse_env_variants(text: str, option: str = "speed.py decode: --env-variants") -> list[dict[str, str]]:
    """``"A=1;A=1,B=8"`` -> ``[{"A": "1"}, {"A": "1", "B": "8"}]``; a malformed group ends the
    script with one line naming ``option``."""
    out = []
    for group in (g.strip() for g in text.split(";")):
        if not group:
            continue
        try:
            out.append(harness.parse_env(group))
        except ValueError as e:
            raise SystemExit(f"{option}: {e}") from None
    return out


def decode_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
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
    ap.add_argument("--other-drafts", default="",
                    help="comma-separated other draft files of the same target (another precision of the draft, "
                         "markov_w2 in Q8_0, ...), each measured at every length beside --draft")
    ap.add_argument("--interleave", action="store_true",
                    help="run the one-request arms' servers at once, taking turns request by request")
    ap.add_argument("--cross-variants", action="store_true",
                    help="with --interleave: also every --variants flag set under every --env-variants environment")
    ap.add_argument("--env-variants", default="",
                    help="semicolon-separated NAME=VALUE[,NAME=VALUE] engine environments, each measured "
                         "at every draft length beside the default (e.g. 'GGML_CUDA_MMF_FEW=4;LLAMA_OUTPUT_ARGMAX=0')")
    ap.add_argument("--seed", type=int, default=1,
                    help="trial i's request seed is SEED+i, so every arm draws the same synthetic acceptance")
    ap.add_argument("--json", type=Path, default=Path("speed.json"), help="write the raw numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("speed_logs"), help="keep the server logs here")


def decode(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The decode arms (``DECODE``); the table printed, the numbers in ``--json``."""
    if args.trials < 1 or args.load_trials < 1:
        ap.error(f"--trials {args.trials} / --load-trials {args.load_trials}: at least 1")
    server = engine.find_engine(args.server).path
    rates = geometric_rates(args.accept_len, args.block)
    env_variants = parse_env_variants(args.env_variants)
    conc = [int(x) for x in args.concurrency.split(",") if x]
    try:
        load_lengths = [int(x) for x in args.load_lengths.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--load-lengths {args.load_lengths!r}: expected draft lengths, comma-separated")
    if args.cross_variants and not args.interleave:
        ap.error("--cross-variants: only with --interleave")
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        ap.error(f"--lengths {args.lengths!r}: expected draft lengths of at least 1, comma-separated")
    # the engine refuses a draft length past the drafter's longest draft (its block) at the server's
    # start: say so here, before any server, with the file and its block (a missing file said first: the
    # target here, the draft by the reader)
    if not Path(args.target).is_file():
        raise InputNotFoundError(f"{args.target}: no such file")
    longest = launch.longest_draft(args.draft)
    too_long = [n for n in lengths + load_lengths if longest is not None and n > longest]
    if too_long:
        ap.error(f"--lengths / --load-lengths {max(too_long)}: {args.draft} drafts at most {longest} tokens "
                 f"(its block size); measure lengths 1-{longest}")
    others = [d.strip() for d in args.other_drafts.split(",") if d.strip()]
    for d in others:
        if not Path(d).is_file():
            raise InputNotFoundError(f"{d}: no such file (--other-drafts)")
        longest_other = launch.longest_draft(d)
        if longest_other is not None and max(lengths) > longest_other:
            ap.error(f"--lengths {max(lengths)}: {d} drafts at most {longest_other} tokens (its block size)")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    max_np = max(conc + [1])

    def settings(draft_n: int | None, extra: list[str] | None = None, parallel: int = 1, draft: str | None = None):
        # the table's row for the backend, through the seam serve uses (harness.base_settings: launch)
        s = harness.base_settings(server, args.target, gpu=args.gpu, parallel=parallel, n_predict=args.n_predict,
                                  extra_args=list(args.engine_arg) + list(extra or []))
        return harness.drafted(s, draft or args.draft, draft_n, rates) if draft_n else s

    results = []
    variants = [v for v in args.variants.split(";") if v.strip()]
    if args.interleave:
        results = interleaved(args, settings, env_variants, variants, lengths, others)
        plain = results[0]
    else:
        plain = run_arm("plain", settings(None), args, log_dir=args.log_dir)
        results.append(plain)
        print(f"plain: {plain['decode_tps']:.1f} tok/s", file=sys.stderr)
    for n in [] if args.interleave else lengths:
        r = run_arm(f"dspark-n{n}", settings(n), args, log_dir=args.log_dir)
        r["draft_n_max"] = n
        results.append(r)
        print(f"n_max {n}: {r['decode_tps']:.1f} tok/s (accept length {r['accept_length']})", file=sys.stderr)
        for env in env_variants:
            label = env_label(env)
            r = run_arm(f"dspark-n{n}-{arm_suffix(label)}", settings(n), args,
                        log_dir=args.log_dir, env=env)
            r["draft_n_max"], r["env"] = n, label
            results.append(r)
            print(f"n_max {n} [{label}]: {r['decode_tps']:.1f} tok/s (accept length {r['accept_length']})",
                  file=sys.stderr)
    for j, d in enumerate([] if args.interleave else others):
        for n in lengths:
            r = run_arm(f"dspark-n{n}-draft{j}", settings(n, draft=d), args, log_dir=args.log_dir)
            r["draft_n_max"], r["draft"] = n, d
            results.append(r)
            print(f"n_max {n} [draft {d}]: {r['decode_tps']:.1f} tok/s (accept length {r['accept_length']})",
                  file=sys.stderr)
    spec = [r for r in results if "draft_n_max" in r and not r.get("env") and not r.get("variant") and not r.get("draft")]
    best = max(spec, key=lambda r: r["decode_tps"])
    for i, v in enumerate([] if args.interleave else variants):
        r = run_arm(f"dspark-n{best['draft_n_max']}-variant{i}", settings(best["draft_n_max"], v.split()), args,
                    log_dir=args.log_dir)
        r["variant"] = v
        r["draft_n_max"] = best["draft_n_max"]
        results.append(r)
        print(f"variant {v!r}: {r['decode_tps']:.1f} tok/s", file=sys.stderr)
    load = []
    if conc:
        # the block's length as far as this drafter drafts (a shorter drafter's block: its longest draft)
        longest = longest or args.block
        load_lengths = load_lengths or list(dict.fromkeys([best["draft_n_max"], min(args.block, longest)]))
        for name, n in [("plain", None)] + [(f"dspark-n{k}", k) for k in load_lengths]:
            r = run_arm(f"{name}-np{max_np}", settings(n, parallel=max_np), args, concurrency=conc,
                        log_dir=args.log_dir)
            r["draft_n_max"] = n
            load.append(r)
            print(f"{name} under load: " + ", ".join(f"c{c} {r[f'aggregate_tps_c{c}']:.1f}" for c in conc), file=sys.stderr)

    print(f"\nsynthetic acceptance: mean length {args.accept_len} at block {args.block}, per-position rates "
          f"[{', '.join(f'{x:.3f}' for x in rates)}] truncated per length; {args.n_predict} tokens, greedy, "
          f"median of {args.trials}" + (", the arms' servers running at once and taking turns a request each"
                                        if args.interleave else "") + "\n")
    # a server-flag variant with a plain arm of its own (--interleave) is compared with that arm
    plain_of = {r["variant"]: r for r in results if r.get("plain")}
    if plain_of:
        print("a variant's rows are against the plain server with the same flags (its own plain row: against plain)\n")
    # interleaved: each turn's ratio (this arm's request against its plain server's in the same turn)
    turns = " per-turn ratio" if args.interleave else ""
    print(f"{'arm':<58}{'decode tok/s':>14}{'vs plain':>10}{'accept len':>12}{'ms/step':>9}{turns}")
    for r in results:
        ref_row = plain_of.get(r.get("variant"), plain) if not r.get("plain") else plain
        ref = ref_row["decode_tps"]
        al = f"{r['accept_length']:.2f}" if r.get("accept_length") else "-"
        # a step makes accept-length tokens: its time, free of how lucky the acceptance draws were
        step = f"{1000 * r['accept_length'] / r['decode_tps']:.2f}" if r.get("accept_length") else "-"
        label = r["arm"] + (f" [{r['variant']}]" if r.get("variant") else "")
        if r.get("env"):
            label = f"dspark-n{r['draft_n_max']} [{r['env']}]" + (f" [{r['variant']}]" if r.get("variant") else "")
        if r.get("draft"):
            label = f"dspark-n{r['draft_n_max']} [draft {Path(r['draft']).name}]" + (f" [{r['env']}]" if r.get("env") else "")
        spread = ""
        if args.interleave and r is not ref_row:
            per = sorted(a / b for a, b in zip(r["decode_tps_all"], ref_row["decode_tps_all"]))
            r["turn_ratios"] = per
            spread = f"  {per[0]:.2f}-{per[-1]:.2f}x"
        print(f"{label:<58}{r['decode_tps']:>14.1f}{r['decode_tps'] / ref:>9.2f}x{al:>12}{step:>9}{spread}")
        r["label"] = label
    # interleaved: each engine environment, flag variant or other draft against its length's drafted arm, turn by turn
    base_of = {r["draft_n_max"]: r for r in results if r.get("draft_n_max") and not (r.get("env") or r.get("variant") or r.get("draft"))}
    for r in results if args.interleave else []:
        base = base_of.get(r.get("draft_n_max"))
        if base is not None and r is not base:
            r["paired"] = paired.paired(r["decode_tps_all"], base["decode_tps_all"])
            print(f"{r['label']}: {paired.describe(r['paired'], base['label'])}")
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
    args.json.write_text(json.dumps({"rates": rates, "results": results, "load": load, "server": server,
                                     "args": vars(args), "provenance": provenance(args.server)}, indent=2, default=str))
    return 0


def env_label(env: dict[str, str]) -> str:
    """``{"A": "1", "B": "8"}`` -> ``"A=1,B=8"``; :func:`arm_suffix` makes it a file name part."""
    return ",".join(f"{k}={v}" for k, v in env.items())


def arm_suffix(label: str) -> str:
    return label.replace("=", "").replace(",", "-")


def interleaved(args, settings, env_variants: list[dict[str, str]], variants: list[str],
                lengths: list[int], others: list[str] = ()) -> list[dict]:
    """Every one-request arm (plain, each length, each length under each environment and server-flag
    variant, each length with each of the ``others`` draft files, under each environment too with
    ``--cross-variants``) on its own server, all started together and measured in turns."""
    specs = [harness.ArmSpec("plain", settings(None))]
    meta: list[dict] = [{}]
    for i, v in enumerate(variants):
        specs.append(harness.ArmSpec(f"plain-variant{i}", settings(None, v.split())))
        meta.append({"variant": v, "plain": True})
    # (environment, flag variant index) a length is measured under, in the table's order
    combos: list[tuple[dict[str, str], int | None]] = [({}, None)] + [(e, None) for e in env_variants]
    for i in range(len(variants)):
        combos += [({}, i)] + ([(e, i) for e in env_variants] if args.cross_variants else [])
    for n in lengths:
        for env, i in combos:
            name = f"dspark-n{n}"
            if env or i is not None or any(s.name == name for s in specs):
                name += f"-{len(specs)}" + (f"-variant{i}" if i is not None else "") + \
                    (f"-{arm_suffix(env_label(env))}" if env else "")
            specs.append(harness.ArmSpec(name, settings(n, variants[i].split() if i is not None else None), env))
            meta.append({"draft_n_max": n, **({"env": env_label(env)} if env else {}),
                         **({"variant": variants[i]} if i is not None else {})})
        for j, d in enumerate(others):
            for env in [{}] + (env_variants if args.cross_variants else []):
                name = f"dspark-n{n}-{len(specs)}-draft{j}" + (f"-{arm_suffix(env_label(env))}" if env else "")
                specs.append(harness.ArmSpec(name, settings(n, draft=d), env))
                meta.append({"draft_n_max": n, "draft": d, **({"env": env_label(env)} if env else {})})
    print(f"{len(specs)} servers at once, {args.trials} turns", file=sys.stderr)
    rows = []
    for arm, m in zip(harness.measure_interleaved(specs, args.log_dir, n_predict=args.n_predict, trials=args.trials,
                                                  seed=args.seed), meta):
        rows.append({**arm_row(arm), **m})
        print(f"{arm.name}: {arm.tps:.1f} tok/s" + (f" (accept length {arm.accept_length})" if m else ""),
              file=sys.stderr)
    return rows


# --------------------------------------------------------------------------- prefill


REPLANNED = re.compile(r"graphs replanned = *(\d+)")


def parse_arm(spec: str) -> tuple[str, str, dict[str, str], list[str]]:
    """``NAME=BASE [KEY=VALUE ...] [args ...]`` -> (name, base, environment, server args)."""
    name, sep, rest = spec.partition("=")
    words = shlex.split(rest)
    if not sep or not name or not words or words[0] not in ("plain", "drafted"):
        raise ValueError(f"--arm {spec!r}: expected NAME=plain|drafted [KEY=VALUE ...] [server args ...]")
    env, args = harness.split_env(words[1:])
    return name, words[0], env, args


def measure(name: str, settings: ServerSettings, prompts: list[list[int]], a: argparse.Namespace) -> dict:
    """One arm: single prompts, then ``a.concurrency`` at once (``ms.measure_load``, one round)."""
    res: dict = {"arm": name, "cmd": " ".join(settings.redacted()), "env": dict(settings.env)}
    with ms.running(settings, a.log_dir / f"{name}.log") as c:
        ms.warm(c)
        ms.request(c, prompts[0], 1)  # the first long prompt allocates the compute buffers
        one = [ms.request(c, prompts[0], 1).timings for _ in range(a.trials)]
        res["one"] = {"prompt_tps": statistics.median(t.prompt_per_second for t in one),
                      "prompt_tps_all": [t.prompt_per_second for t in one], "prompt_n": one[0].prompt_n}
        outs: list[ms.Outcome] = []
        point = ms.measure_load(c, prompts, a.concurrency, 1, rounds=1, outcomes=outs)
        tokens = sum(o.timings.prompt_n or 0 for o in outs)
        res["at_once"] = {"requests": point.requests, "prompt_tokens": tokens, "wall_s": point.wall_s,
                          "aggregate_prompt_tps": tokens / point.wall_s if point.wall_s else None,
                          "prompt_tps_median": statistics.median(o.timings.prompt_per_second for o in outs)}
    # each request's "graphs replanned" (patch 0033: the target's allocation planned again), cumulative
    res["replanned"] = [int(n) for n in REPLANNED.findall((a.log_dir / f"{name}.log").read_text(errors="replace"))]
    return res


def prefill_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="tokens of every prompt")
    ap.add_argument("--concurrency", type=int, default=8, help="prompts sent at once (and the servers' slots)")
    ap.add_argument("--trials", type=int, default=3, help="single-prompt requests per arm (median reported)")
    ap.add_argument("--draft-n-max", type=int, default=None,
                    help="the drafted arm's length (default: serve's for the backend, CUDA with --gpu)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=BASE [KEY=VALUE ...] [ARGS ...]",
                    help="one more arm: the plain or drafted arm with engine environment variables and "
                         "llama-server arguments (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("prefill_logs"), help="keep the server logs here")


def prefill(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The prefill arms (``PREFILL``); the table printed, the numbers in ``--json``."""
    try:
        variants = [parse_arm(spec) for spec in a.arm]
    except ValueError as e:
        ap.error(str(e))
    if a.prompt_tokens < 1 or a.concurrency < 1 or a.trials < 1:
        ap.error(f"--prompt-tokens {a.prompt_tokens} / --concurrency {a.concurrency} / --trials {a.trials}: "
                 "at least 1")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    n_max = a.draft_n_max or hardware.DEFAULTS["cuda" if a.gpu else "cpu"].draft_n_max
    vocab = harness.n_vocab(a.server, a.target, a.log_dir, gpu=a.gpu)
    work = harness.workload(a.concurrency, vocab, (a.prompt_tokens, a.prompt_tokens), (1, 1), seed=0)
    prompts = [p for p, _ in work]
    base = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=a.concurrency,
                                 ctx_per_slot=a.prompt_tokens + harness.CTX_MARGIN)
    drafted = harness.drafted(base, a.draft, n_max, None)
    rows = [measure("plain", base, prompts, a), measure(f"draft-n{n_max}", drafted, prompts, a)]
    for name, kind, env, args in variants:
        arm = dataclasses.replace(harness.with_args(base if kind == "plain" else drafted, args), env=env)
        rows.append(measure(name, arm, prompts, a))
    plain = rows[0]
    width = max(12, *(len(r["arm"]) + 2 for r in rows))
    print(f"prompt processing, {a.prompt_tokens}-token prompts, one answer token; drafted arm n_max {n_max}\n")
    print(f"{'arm':<{width}}{'1 prompt tok/s':>16}{f'{a.concurrency} at once: agg tok/s':>26}{'per request':>13}"
          f"{'/plain (1)':>12}{'/plain (all)':>14}")
    for r in rows:
        r["ratio"] = {"one": r["one"]["prompt_tps"] / plain["one"]["prompt_tps"],
                      "at_once": r["at_once"]["aggregate_prompt_tps"] / plain["at_once"]["aggregate_prompt_tps"]}
        print(f"{r['arm']:<{width}}{r['one']['prompt_tps']:>16.1f}{r['at_once']['aggregate_prompt_tps']:>26.1f}"
              f"{r['at_once']['prompt_tps_median']:>13.1f}{r['ratio']['one']:>11.2f}x{r['ratio']['at_once']:>13.2f}x")
    ratio = rows[1]["ratio"]
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "prompt_tokens": a.prompt_tokens,
                                      "concurrency": a.concurrency, "trials": a.trials, "draft_n_max": n_max,
                                      "arms": rows, "ratio": ratio, "provenance": provenance(a.server)}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"decode": (DECODE, decode_arguments, decode),
                                          "prefill": (PREFILL, prefill_arguments, prefill)}, argv)


if __name__ == "__main__":
    sys.exit(main())
