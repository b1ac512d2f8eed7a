#!/usr/bin/env python3
"""What host sampling costs a sampled request: the graph's top-k (patch 0050), patch 0032's pass, neither.

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

    python benchmarks/sampling_speed.py --json out.json          # generated pair, CPU
    python benchmarks/sampling_speed.py -m T.gguf -md D.gguf --gpu
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from ggufdspark.measuring import measure as ms  # noqa: E402
from ggufdspark.errors import GgufdsparkError  # noqa: E402
from ggufdspark.runners.server import ServerSettings  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    a = ap.parse_args(argv)
    if (a.target is None) != (a.draft is None):
        print("sampling_speed.py: give -m and -md together, or neither (a generated pair)", file=sys.stderr)
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
        print(f"sampling_speed.py: {e}", file=sys.stderr)
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
                                      "same_tokens": same_all}, indent=1))
    if not same_all:
        print("sampling_speed.py: the paths sampled different tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
