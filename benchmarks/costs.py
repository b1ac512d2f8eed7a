#!/usr/bin/env python3
"""What an engine mechanism costs a request, measured on servers built by the harness
(``benchmarks/harness.py``), the mechanism switched per arm:

* ``sampling``: host sampling of a sampled request on the graph's top-k (patch 0050), patch 0032's
  pass and neither, the tokens compared (``h200.sh sampling``);
* ``layout``: the KV cache's layout across slots (llama-server's divided one against one shared
  cache) when the busy slots are scattered (``h200.sh layout``);
* ``step``: where a speculative step's time goes (target, drafter), from the engine's own
  accounting at log verbosity 4.

    python benchmarks/costs.py sampling [-m T.gguf -md D.gguf] [--gpu] [--json out.json]
    python benchmarks/costs.py layout -m T.gguf -md D.gguf [--gpu] [--slots 16] [--requests 4] [--json out.json]
    python benchmarks/costs.py step -m T.gguf -md D.gguf [--gpu] [--lengths 6,9]

``python benchmarks/costs.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from ggufdspark import engine  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.measuring.acceptance import geometric_rates  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402

SAMPLING = """What host sampling costs a sampled request: the graph's top-k (patch 0050), patch 0032's pass, neither.

A sampled request (temperature > 0, the server's default chain: top-k 40, top-p 0.95, min-p 0.05,
temperature, a seeded draw) samples each position on the host from its logits row. Before patch
0032 that built an n_vocab-entry candidate array (128000 entries for LFM2) and partially sorted it
for every position, on a plain server and at every verified position of a drafted one; with 0032
the top-k comes from one scan of the row and the rest of the chain runs on those k candidates
(``LLAMA_SAMPLER_NO_FAST_TOPK=1`` restores the old path). Same seeds on both paths, so the tokens
must be identical: the script checks that too. Besides the decode speed (noisy on a small machine)
it reads the engine's own account of the host sampling time, ``tgt_sample`` in ms per target decode
of patch 0004's step profile (``LLAMA_SPEC_PROFILE=1``, on in every arm).

Since patch 0050 the engine's graph takes each row's top 64 on CUDA (``LLAMA_OUTPUT_TOPK=K`` sets K
on any backend) and the chain's top-k reads those candidates instead of the row, which then never
leaves the device: that is the ``graph`` path, the engine as served on CUDA (``--graph-topk K``: with
``LLAMA_OUTPUT_TOPK=K``; elsewhere the engine's default takes none, so give it there). The ``fast``
and ``old`` paths run with ``LLAMA_OUTPUT_TOPK=0``, so the host samples every row; the tokens must be
the same on all three.

Arms: plain and drafted (real acceptance, or ``--synthetic``: the published profile), each on the
three paths, one server each; ``--trials`` seeded requests of ``--n-predict`` tokens at ``--temperature``, median decode
tok/s. Without ``-m``/``-md`` it generates a small pair with the published vocabulary size
(``--vocab``, 128000: the host work scales with it, the model's own compute here is small), so that
the sampling cost stands out on a CPU:

    python benchmarks/costs.py sampling --json out.json          # generated pair, CPU
    python benchmarks/costs.py sampling -m T.gguf -md D.gguf --gpu
"""

STEP = """Where a speculative step's time goes, from the engine's own accounting.

For each configuration, one llama-server runs ``--trials`` greedy requests of ``--n-predict``
tokens with llama.cpp's synthetic acceptance (the published profile, mean length 4.22 at block 9,
truncated per length) and log verbosity 4, then stops. At stop the engine prints its speculative
statistics: time spent in ``begin`` (feeding the accepted tokens and the target's tapped hidden
states to the drafter), ``draft`` (the drafter's block forward, the Markov chain, sampling) and
``accept``, with call counts. The request timings give the total decode time, so per verify step:

    step     = decode time / steps            (steps = draft calls)
    drafter  = (begin + draft + accept) / steps
    target   = step - drafter                 (the verify batch, plus server work between)

Also a plain run (the plain decode step), so every part can be put in plain-step units.

    python benchmarks/costs.py step --target T.gguf --draft D.gguf [--gpu] [--server PATH]
"""

LAYOUT = """What the KV cache's layout across slots costs a step when the busy slots are scattered.

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

    python benchmarks/costs.py layout -m T.gguf -md D.gguf [--gpu] [--slots 16] [--requests 4] [--json out.json]
"""


NO_GRAPH = {"LLAMA_OUTPUT_TOPK": "0"}
OFF = {**NO_GRAPH, "LLAMA_SAMPLER_NO_FAST_TOPK": "1"}
PROFILE = {"LLAMA_SPEC_PROFILE": "1"}
SAMPLE_MS = re.compile(r"spec profile: (\d+) target decodes, ms per decode: .*?tgt_sample ([\d.]+)")


def generated_pair(root: Path, vocab: int) -> tuple[Path, Path]:
    """A small LFM2 pair (the test pair's layers) with a ``vocab``-token vocabulary, converted."""
    from ggufdspark.synthetic import synth
    from ggufdspark.synthetic.pairs import build_pair

    pair = build_pair(root, target_spec=replace(synth.SMALL_TARGET, vocab_size=vocab), name=f"vocab{vocab}-lfm2")
    return Path(pair.target), Path(pair.draft)


def run_arm(name: str, settings: ServerSettings, env: dict[str, str], log_dir: Path, *, trials: int,
            n_predict: int, temperature: float) -> dict:
    """``settings``' server with ``env`` and the step profile on: ``trials`` seeded requests."""
    log = log_dir / f"{name}.log"
    with ms.running(replace(settings, env={**settings.env, **PROFILE, **env}), log) as c:
        prompt = c.tokenize(harness.PROMPT)
        ms.warm(c)
        outs = [c.complete(prompt, n_predict=n_predict, temperature=temperature, seed=harness.TRIAL_SEED + i,
                           ignore_eos=True) for i in range(trials)]
    tps = [o.timings.decode_tps for o in outs]
    prof = SAMPLE_MS.findall(log.read_text(errors="replace"))  # every 128 decodes, running means
    return {"arm": name, "env": env, "decode_tps": statistics.median(tps), "runs": tps,
            "sample_ms": float(prof[-1][1]) if prof else None, "profiled_decodes": int(prof[-1][0]) if prof else 0,
            "tokens": [list(o.tokens or []) for o in outs],
            "drafted": sum(o.timings.draft_n or 0 for o in outs),
            "accepted": sum(o.timings.draft_n_accepted or 0 for o in outs)}


def ms_against(a: dict, b: dict) -> str:
    """``a``'s host sampling ms a decode against ``b``'s, with their ratio."""
    if not (a["sample_ms"] and b["sample_ms"]):
        return "no profile in the log"
    return f"{a['sample_ms']:.3f} / {b['sample_ms']:.3f} ({a['sample_ms'] / b['sample_ms']:.2f}x)"


def sampling_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-m", "--target", "--model", dest="target", type=Path, help="target GGUF (default: generated)")
    ap.add_argument("-md", "--draft", dest="draft", type=Path, help="DSpark draft GGUF (with -m)")
    ap.add_argument("--vocab", type=int, default=128000, help="vocabulary of the generated pair (default 128000)")
    ap.add_argument("--server", help="llama-server (default: the build ggufdspark finds)")
    ap.add_argument("--gpu", action="store_true", help="offload everything (CUDA/Metal)")
    ap.add_argument("--n-max", type=int, default=7, help="the drafted arm's draft length (default 7)")
    ap.add_argument("--synthetic", action="store_true",
                    help="the drafted arm at llama.cpp's synthetic acceptance, the published profile (default: real)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    ap.add_argument("--trials", type=int, default=3, help="seeded requests an arm (default 3)")
    ap.add_argument("--n-predict", type=int, default=128, help="tokens a request (default 128)")
    ap.add_argument("--graph-topk", type=int, default=0,
                    help="the graph path with LLAMA_OUTPUT_TOPK=K (default: the engine's own: 64 on CUDA, none elsewhere)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--log-dir", type=Path, help="keep the server logs here")


def sampling(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The sampling paths' arms (``SAMPLING``); exit 1 when the paths sampled different tokens."""
    if (a.target is None) != (a.draft is None):
        print("costs.py sampling: give -m and -md together, or neither (a generated pair)", file=sys.stderr)
        return 2
    work = None if a.target and a.log_dir else Path(tempfile.mkdtemp(prefix="ggufdspark-sampling-"))
    log_dir = a.log_dir or work
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        target, draft = (a.target, a.draft) if a.target else generated_pair(work / "pair", a.vocab)
        base = harness.base_settings(a.server, target, gpu=a.gpu, parallel=1, n_predict=a.n_predict)
        rates = harness.published_rates(draft) if a.synthetic else None
        arms = {"plain": base, f"drafted-n{a.n_max}": harness.drafted(base, draft, a.n_max, rates)}
        paths = [("fast", NO_GRAPH), ("old", OFF), ("graph", {"LLAMA_OUTPUT_TOPK": str(a.graph_topk)} if a.graph_topk else {})]
        results = []
        for name, settings in arms.items():
            for path, env in paths:
                results.append(run_arm(f"{name}-{path}", settings, env, log_dir, trials=a.trials,
                                       n_predict=a.n_predict, temperature=a.temperature))
                print(f"{results[-1]['arm']:<22} {results[-1]['decode_tps']:8.1f} tok/s", file=sys.stderr, flush=True)
    except GgufdsparkError as e:
        print(f"costs.py sampling: {e}", file=sys.stderr)
        return 1
    print(f"\nsampled decode, temperature {a.temperature}, the server's default chain (top-k 40), "
          f"{a.trials} seeded requests of {a.n_predict} tokens, median\n")
    print(f"{'arm':<16} {'fast tok/s':>10} {'old tok/s':>10} {'fast/old':>9}  {'sampling ms a decode, fast / old':>33}"
          f"  same tokens  drafted/accepted")
    same_all = True
    n_paths = len(paths)
    by_arm = [results[i:i + n_paths] for i in range(0, len(results), n_paths)]
    for fast, old, g in by_arm:
        same = fast["tokens"] == old["tokens"] and (fast["drafted"], fast["accepted"]) == (old["drafted"], old["accepted"])
        same_all &= same
        name = fast["arm"].removesuffix("-fast")
        ms_text = ms_against(fast, old)
        print(f"{name:<16} {fast['decode_tps']:>10.1f} {old['decode_tps']:>10.1f} "
              f"{fast['decode_tps'] / old['decode_tps']:>8.2f}x  {ms_text:>33}  {'yes' if same else 'NO':<11}  "
              f"{fast['drafted']}/{fast['accepted']}")
        # the graph's top-k: against the fast path
        same_g = g["tokens"] == fast["tokens"] and (g["drafted"], g["accepted"]) == (fast["drafted"], fast["accepted"])
        same_all &= same_g
        g_ms = ms_against(g, fast)
        print(f"{'  graph top-k':<16} {g['decode_tps']:>10.1f} {fast['decode_tps']:>10.1f} "
              f"{g['decode_tps'] / fast['decode_tps']:>8.2f}x  {g_ms:>33}  {'yes' if same_g else 'NO':<11}  "
              f"{g['drafted']}/{g['accepted']}   (graph / fast)")
    plain, drafted = by_arm[0], by_arm[1]
    print(f"\ndrafted / plain: {drafted[0]['decode_tps'] / plain[0]['decode_tps']:.2f}x with the fast path, "
          f"{drafted[1]['decode_tps'] / plain[1]['decode_tps']:.2f}x without, "
          f"{drafted[2]['decode_tps'] / plain[2]['decode_tps']:.2f}x with the graph's top-k")
    if a.json:
        a.json.write_text(json.dumps({"command": sys.argv, "temperature": a.temperature, "trials": a.trials,
                                      "n_predict": a.n_predict, "n_max": a.n_max, "arms": results,
                                      "same_tokens": same_all, "provenance": provenance(a.server)}, indent=1))
    if not same_all:
        print("costs.py sampling: the paths sampled different tokens", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------- layout


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


def layout_arm(name: str, settings: ServerSettings, prompts: list[list[int]], a: argparse.Namespace) -> dict:
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


def layout_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--slots", type=int, default=16, help="the servers' slots (-np)")
    ap.add_argument("--requests", type=int, default=4, help="requests at once")
    ap.add_argument("--n-predict", type=int, default=128, help="tokens of every answer")
    ap.add_argument("--trials", type=int, default=3, help="rounds a placement (median reported)")
    ap.add_argument("--real", action="store_true", help="real acceptance instead of the published profile")
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("layout_logs"), help="keep the server logs here")


def layout(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The layouts' arms (``LAYOUT``); the table printed, the numbers in ``--json``."""
    if not 1 <= a.requests <= a.slots or a.n_predict < 1 or a.trials < 1:
        ap.error(f"--requests {a.requests} must be 1..--slots {a.slots}; --n-predict and --trials at least 1")
    a.log_dir.mkdir(parents=True, exist_ok=True)
    vocab = harness.n_vocab(a.server, a.target, a.log_dir, gpu=a.gpu)
    prompts = [p for p, _ in harness.workload(a.requests, vocab, (32, 32), (1, 1), seed=0)]
    info = engine.find_engine(a.server)
    if not info.kv_slot_cap:
        print(f"costs.py layout: {info.path}: no --kv-unified-per-slot in this engine", file=sys.stderr)
        return 1
    divided = harness.base_settings(a.server, a.target, gpu=a.gpu, parallel=a.slots, n_predict=a.n_predict + 64,
                                    info=info)
    pooled = divided.pooled()
    rates = None if a.real else harness.published_rates(a.draft)
    rows = []
    for layout, base in (("divided", divided), ("pooled", pooled)):
        rows.append(layout_arm(f"plain-{layout}", base, prompts, a))
        rows.append(layout_arm(f"drafted-{layout}", harness.serve_drafted(base, a.draft, gpu=a.gpu, rates=rates),
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
                                      "pooled_vs_divided_scattered": summary, "provenance": provenance(a.server)},
                                     indent=2))
    return 0


# --------------------------------------------------------------------------- step


STATS = re.compile(r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+).*?"
                   r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")
EVAL = re.compile(r"\|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def step_profile(name: str, settings: ServerSettings, args, env: dict[str, str], log_dir: Path) -> dict:
    """One server (``measure.running``), ``--trials`` requests after a warm-up one; the engine's
    totals are read from its log once it has stopped (the speculative statistics come at exit)."""
    log = log_dir / f"{name}.log"
    log.unlink(missing_ok=True)  # the engine appends: an earlier run's lines would count
    with harness.environ(env), ms.running(settings, log) as c:
        toks = c.tokenize(harness.PROMPT)
        for _ in range(args.trials + 1):  # the first is a warm-up; all count in the engine's totals
            c.complete(toks, n_predict=args.n_predict, ignore_eos=True)
    text = log.read_text(errors="replace")
    evals = [(float(t), int(n)) for t, n in EVAL.findall(text)]
    r = {"config": name, "env": env, "eval_ms": sum(t for t, _ in evals), "tokens": sum(n for _, n in evals)}
    r["ms_per_token"] = r["eval_ms"] / r["tokens"]
    found = list(STATS.finditer(text))  # printed cumulatively; the last line covers every request
    m = found[-1] if found else None
    if m:
        nb, ng, na = (int(x) for x in m.group(2, 3, 4))
        tb, tg, ta = (float(x) for x in m.group(5, 6, 7))
        steps = ng
        r.update(steps=steps, tokens_per_step=r["tokens"] / steps, step_ms=r["eval_ms"] / steps,
                 begin_ms=tb / steps, draft_ms=tg / steps, accept_ms=ta / steps)
        r["target_ms"] = r["step_ms"] - r["begin_ms"] - r["draft_ms"] - r["accept_ms"]
    return r


def step_arguments(ap: argparse.ArgumentParser) -> None:
    harness.add_pair_arguments(ap)
    ap.add_argument("--n-predict", type=int, default=256, help="tokens generated per request")
    ap.add_argument("--trials", type=int, default=3, help="measured requests per configuration (after one warm-up)")
    ap.add_argument("--lengths", default="6,9", help="draft lengths to profile, comma-separated")
    ap.add_argument("--json", type=Path, default=Path("step.json"), help="write the raw numbers here")
    ap.add_argument("--log-dir", type=Path, default=Path("step_logs"), help="keep the server logs here")


def step(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The step profiles (``STEP``): the table printed, the numbers in ``--json``."""
    args.log_dir.mkdir(parents=True, exist_ok=True)
    rates = geometric_rates(4.22, 9)

    def settings(n: int | None, zero: bool = False) -> ServerSettings:
        # through the seam serve uses (harness.base_settings: launch); synthetic acceptance as bench adds it
        s = harness.base_settings(args.server, args.target, gpu=args.gpu, parallel=1, n_predict=args.n_predict,
                                  extra_args=["-lv", "4"])
        return harness.drafted(s, args.draft, n, [0.0] * n if zero else rates) if n else s

    configs = [("plain", settings(None), {})]
    for n in (int(x) for x in args.lengths.split(",")):
        configs.append((f"n{n}", settings(n), {}))
        configs.append((f"n{n}-graph-opt", settings(n), {"GGML_CUDA_GRAPH_OPT": "1"}))
    configs.append((f"n{max(int(x) for x in args.lengths.split(','))}-nothing-accepted",
                    settings(max(int(x) for x in args.lengths.split(",")), zero=True), {}))
    results = []
    for name, s, env in configs:
        r = step_profile(name, s, args, env, args.log_dir)
        results.append(r)
        print(f"{name}: {r['ms_per_token']:.3f} ms/token", file=sys.stderr)
    plain = results[0]["ms_per_token"]
    print(f"\nplain decode step: {plain:.3f} ms ({1000 / plain:.1f} tok/s); synthetic acceptance 4.22 at block 9\n")
    print(f"{'config':<26}{'tok/s':>8}{'vs plain':>9}{'tok/step':>9}{'step ms':>9}{'target ms':>10}"
          f"{'draft ms':>9}{'begin ms':>9}{'accept ms':>10}{'drafter %':>10}{'step/plain':>11}")
    for r in results[1:]:
        if "steps" not in r:
            print(f"{r['config']:<26} (no speculative statistics in the log)")
            continue
        dr = r["begin_ms"] + r["draft_ms"] + r["accept_ms"]
        print(f"{r['config']:<26}{1000 / r['ms_per_token']:>8.1f}{plain / r['ms_per_token']:>8.2f}x"
              f"{r['tokens_per_step']:>9.2f}{r['step_ms']:>9.3f}{r['target_ms']:>10.3f}{r['draft_ms']:>9.3f}"
              f"{r['begin_ms']:>9.3f}{r['accept_ms']:>10.3f}{100 * dr / r['step_ms']:>9.0f}%{r['step_ms'] / plain:>11.2f}")
    args.json.write_text(json.dumps({"plain_ms": plain, "results": results}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"sampling": (SAMPLING, sampling_arguments, sampling),
                                          "layout": (LAYOUT, layout_arguments, layout),
                                          "step": (STEP, step_arguments, step)}, argv)


if __name__ == "__main__":
    sys.exit(main())
