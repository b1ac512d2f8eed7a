#!/usr/bin/env python3
"""The trained pair (``ggufdspark/data/trained``, ``generate --trained``) served: real acceptance where
the generated pairs have only the synthetic one.

* ``acceptance``: at one slot and under load, and around a pause, every block replayed on the torch
  checkpoints (``h200.sh trained`` runs it on the GPU);
* ``quant``: every target x draft precision, one request at a time, lossless against the same target.

    python benchmarks/trained.py acceptance -m T.gguf -md D.gguf --pair ggufdspark/data/trained --json out.json
    python benchmarks/trained.py quant [--out DIR] [--json out.json]

``python benchmarks/trained.py COMMAND --help`` says the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from benchmarks import harness  # noqa: E402
from ggufdspark import launch, timings as tm  # noqa: E402
from ggufdspark.engine import find_engine  # noqa: E402
from ggufdspark.quantize import quantize  # noqa: E402
from ggufdspark.runners.client import Client  # noqa: E402
from ggufdspark.runners.server import ServerProcess, ServerSettings  # noqa: E402
from ggufdspark.synthetic.pairs import build_trained_pair  # noqa: E402
from ggufdspark.trained import fidelity, shipped  # noqa: E402

ACCEPTANCE = """Real acceptance of the trained pair as served, at one slot and under load, and around a pause.

    python benchmarks/trained.py acceptance -m T.gguf -md D.gguf --pair ggufdspark/data/trained \
        --levels 1,8,32,64 --json out.json [--pause 16:8] [--server llama-server] [--gpu]

Each level starts one server with that many slots (the draft length fixed, no load cut, so that the
levels draft the same blocks), runs that many closed-loop clients over held-out prompts (greedy), and
reports per request and in total: drafted, accepted, acceptance rate, accepted per drafted step. The
engine runs at ``-v``: each request's steps (anchor, accepted count) are replayed on the torch
checkpoints (``ggufdspark.trained.fidelity``), so every level also says how many of its blocks are
exactly what the checkpoint drafts there.

``--pause S:N``: S requests at once on S slots with drafting paused while more than N slots are busy
(``--spec-draft-n-max-by-slots N:0``, engine patches 0021/0027), their answers of staggered lengths so
that slots free up one by one and drafting resumes for the rest. The steps right after a resume are
compared with the checkpoint's blocks at the same anchors: a drafter that missed the rows the target
processed while it was paused drafts worse there than the checkpoint (which always sees everything).
"""

QUANT = """Real acceptance of the trained pair for every target x draft precision, one request at a time.

    python benchmarks/trained.py quant [--out DIR] [--draft 8] [--answer 96] [--json out.json]

The shipped trained pair (``generate --trained``) converted to F16, quantized by the engine's own
llama-quantize (``ggufdspark quantize``: Q8_0 and Q4_K_M targets, a Q8_0 draft whose Markov head
stays float), then served greedily on the eight held-out prompts: accept length (1 + accepted /
verify passes, passes from ``/metrics``), acceptance rate, and whether every answer equals the same
target's answer without the draft. Hidden 256 fills whole K-quant super-blocks, so the Q4_K_M
target runs the engine's real K-quant kernels. The quantized target answers differently from the F16
one (it is another model); the draft is checked against its own target.
"""


def prompts(pair: Path, n: int) -> list[str]:
    """``n`` held-out prompts: the shipped eight, then windows of the held-out corpus if given."""
    base = json.loads((pair / "prompts.json").read_text())
    extra = pair / "more-prompts.json"
    more = json.loads(extra.read_text()) if extra.is_file() else []
    out = (base + more) or base
    return [out[i % len(out)] for i in range(n)]


def run_level(args, clients: int, texts: list[str], ref, *, cut: str | None = None,
              lengths: list[int] | None = None, label: str = "") -> dict:
    # the server as serve starts it on this backend (offload, token table, drafter n_ubatch), at this
    # level's fixed draft length and cut
    base = harness.base_settings(args.server, args.m, gpu=args.gpu, parallel=clients, ctx_per_slot=args.slot_ctx,
                                 extra_args=["-v"])
    cuts = [tuple(int(x) for x in cut.split(":"))] if cut else None
    settings = dataclasses.replace(launch.with_draft(base, args.md, args.draft, cut=cuts),
                                   env=dict(e.split("=", 1) for e in args.env))
    log_path = Path(args.log_dir) / f"level-{label or clients}.log"
    results: list[dict] = []
    lock = threading.Lock()
    with ServerProcess(settings, log_path=log_path, start_timeout=300) as srv:
        c = Client(srv.url)
        ids = [c.tokenize(t) for t in texts]
        t0 = time.monotonic()

        def client(k: int):
            mine = range(k, len(ids), clients)
            for i in mine:
                n = lengths[i] if lengths else args.answer
                out = Client(srv.url).complete(ids[i], n_predict=n)
                with lock:
                    results.append({"i": i, "prompt": ids[i], "tokens": out.tokens, "draft_n": out.timings.draft_n or 0,
                                    "accepted": out.timings.draft_n_accepted or 0})

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        srv.wait_for_log(r"draft acceptance = ", count=sum(1 for r in results if r["draft_n"]), timeout=30)
        tasks = fidelity.engine_steps(srv.run_log_text())
    drafted = sum(r["draft_n"] for r in results)
    accepted = sum(r["accepted"] for r in results)
    out = {"clients": clients, "requests": len(results), "cut": cut, "drafted": drafted, "accepted": accepted,
           "acceptance_rate": round(accepted / drafted, 4) if drafted else None, "wall_s": round(wall, 2),
           "per_request_rate": [round(r["accepted"] / r["draft_n"], 4) if r["draft_n"] else None
                                for r in sorted(results, key=lambda r: r["i"])]}
    steps_all = []
    for r in results:
        try:
            steps = fidelity.steps_of(tasks, r["prompt"], r["tokens"])
        except LookupError:
            continue
        r["steps"] = steps
        steps_all += steps
    if steps_all:
        out["steps"] = len(steps_all)
        out["accepted_per_step"] = round(statistics.mean(s.accepted for s in steps_all), 4)
        out["accept_length"] = round(1 + out["accepted_per_step"], 4)
    if ref is not None:
        model, drafter, layers = ref
        blocks = []
        for r in results:
            if "steps" in r:
                blocks += fidelity.compare(model, drafter, r["prompt"], r["tokens"], r["steps"], layers).blocks
        same = sum(b.same for b in blocks)
        ties = sum(b.near_tie for b in blocks if not b.same)
        out["reference"] = {"blocks": len(blocks), "same": same, "near_ties": ties,
                            "engine_accepted": sum(b.engine for b in blocks),
                            "checkpoint_accepted": sum(b.torch for b in blocks)}
        if cut:
            out["after_pause"] = around_pause(results, blocks)
    return out


def around_pause(results: list[dict], blocks) -> dict:
    """Steps k = 0, 1, 2... after each resume: engine's and checkpoint's accepted counts."""
    by_anchor = {}
    for b in blocks:
        by_anchor.setdefault(b.anchor, []).append(b)
    rows: dict[int, list[tuple[int, int]]] = {}
    resumes = 0
    for r in results:
        steps = r.get("steps") or []
        k = None
        for j, s in enumerate(steps):
            first = j == 0 and s.anchor > len(r["prompt"])
            if first or s.after_pause:
                k = 0
                resumes += 1
            elif k is not None:
                k += 1
            if k is not None and k < 6:
                b = next((b for b in by_anchor.get(s.anchor, []) if b.engine == s.accepted), None)
                if b is not None:
                    rows.setdefault(k, []).append((b.engine, b.torch))
    return {"resumes": resumes, "by_step": {str(k): {"n": len(v), "engine": round(statistics.mean(e for e, _ in v), 3),
                                                     "checkpoint": round(statistics.mean(t for _, t in v), 3)}
                                            for k, v in sorted(rows.items())}}


def acceptance_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-m", required=True, help="the target GGUF")
    ap.add_argument("-md", required=True, help="the draft GGUF")
    ap.add_argument("--pair", type=Path, required=True, help="the trained pair's Hub-layout folder (target/, drafter/)")
    ap.add_argument("--server", default=None, help="llama-server (default: the engine ggufdspark finds)")
    ap.add_argument("--levels", default="1,8", help="client counts, comma-separated (each on as many slots)")
    ap.add_argument("--requests-per-client", type=int, default=2, help="requests each client sends (at least 8 a level)")
    ap.add_argument("--draft", type=int, default=8, help="draft length (--spec-draft-n-max)")
    ap.add_argument("--answer", type=int, default=128, help="tokens each answer has")
    ap.add_argument("--slot-ctx", type=int, default=512, help="context tokens a slot gets")
    ap.add_argument("--pause", default=None, help="S:N: S requests on S slots, drafting paused above N busy")
    ap.add_argument("--env", action="append", default=[], help="K=V for the engine (an engine switch)")
    ap.add_argument("--no-reference", action="store_true", help="do not replay the steps on the torch checkpoints")
    ap.add_argument("--gpu", action="store_true", help="the CUDA row of serve's table (everything offloaded, flash attention, the token table on CUDA0)")
    ap.add_argument("--log-dir", default="/tmp/trained-acceptance", help="where the engines' -v logs go")
    ap.add_argument("--json", default=None, help="write the whole report here")


def acceptance(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The levels and the pause (``ACCEPTANCE``), a JSON line each; the report in ``--json``."""
    if args.server is None:
        args.server = find_engine().path
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    ref = None
    if not args.no_reference:
        import torch

        from ggufdspark.trained.checkpoints import load_drafter, load_hf_target

        model, _ = load_hf_target(args.pair / "target")
        drafter, dcfg = load_drafter(args.pair / "drafter", model.model.embed_tokens.weight)
        if torch.cuda.is_available():
            model, drafter = model.cuda(), drafter.cuda()
        ref = (model, drafter, [t + 1 for t in dcfg["dflash_config"]["target_layer_ids"]])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    report = {"command": sys.argv, "commit": commit, "engine": str(args.server),
              "hardware": f"{platform.machine()}, {os.cpu_count()} cores" + (", GPU" if args.gpu else ""),
              "env": args.env, "draft": args.draft, "answer": args.answer, "levels": []}
    for level in [int(x) for x in args.levels.split(",") if x]:
        texts = prompts(args.pair, max(8, level * args.requests_per_client))
        r = run_level(args, level, texts, ref)
        report["levels"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "per_request_rate"}), flush=True)
    if args.pause:
        s, n = (int(x) for x in args.pause.split(":"))
        texts = prompts(args.pair, s)
        lengths = [48 + (args.answer * 2 * i) // s for i in range(s)]  # staggered: slots free one by one
        r = run_level(args, s, texts, ref, cut=f"{n}:0", lengths=lengths, label=f"pause-{s}-{n}")
        report["pause"] = r
        print(json.dumps({k: v for k, v in r.items() if k != "per_request_rate"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


# --------------------------------------------------------------------------- quant


def quant_arm(server: str, target: Path, draft: Path | None, prompts: list[str], n_draft: int, answer: int) -> dict:
    s = ServerSettings(server=server, model=target, draft=draft, draft_n_max=n_draft if draft else None,
                       spec_type="draft-dspark" if draft else None, ctx_size=4096, parallel=1)
    with ServerProcess(s) as srv:
        c = Client(srv.url)
        answers, acc, drafted, passes = [], 0, 0, 0
        for p in prompts:
            ids = c.tokenize(p)
            before = c.metrics()
            out = c.complete(ids, n_predict=answer)
            answers.append(out.tokens)
            if draft:
                passes += tm.metrics_delta(before, c.metrics()).passes
                acc += out.timings.draft_n_accepted or 0
                drafted += out.timings.draft_n or 0
    r = {"answers": answers}
    if draft:
        r.update(accepted=acc, drafted=drafted, passes=passes, accept_length=round(1 + acc / passes, 3),
                 acceptance_rate=round(acc / drafted, 4))
    return r


def quant_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=Path("/tmp/trained-quant"), help="where the converted and quantized files go (reused)")
    ap.add_argument("--draft", type=int, default=8, help="draft length (--spec-draft-n-max)")
    ap.add_argument("--answer", type=int, default=96, help="tokens each answer has")
    ap.add_argument("--json", default=None, help="write the rows here")


def quant(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The precisions (``QUANT``), a JSON line each; the rows in ``--json``."""
    server = find_engine().path
    pair = build_trained_pair(args.out)
    targets = {"F16": pair.target}
    drafts = {"F16": pair.draft}
    for q in ("Q8_0", "Q4_K_M"):
        path = args.out / f"trained-lfm2-{q}.gguf"
        if not path.exists():
            quantize(pair.target, qtype=q, output=path)
        targets[q] = path
    dq = args.out / "dspark-trained-lfm2-Q8_0.gguf"
    if not dq.exists():
        quantize(pair.draft, qtype="Q8_0", output=dq)
    drafts["Q8_0"] = dq
    prompts = shipped.prompts()
    rows = []
    for tq, t in targets.items():
        plain = quant_arm(server, t, None, prompts, args.draft, args.answer)["answers"]
        for dqn, d in drafts.items():
            r = quant_arm(server, t, d, prompts, args.draft, args.answer)
            row = {"target": tq, "draft": dqn, "accept_length": r["accept_length"],
                   "acceptance_rate": r["acceptance_rate"], "accepted": r["accepted"], "drafted": r["drafted"],
                   "passes": r["passes"], "lossless": r["answers"] == plain,
                   "different_answers": len({tuple(a) for a in plain})}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": sys.argv, "draft": args.draft, "answer": args.answer,
                                               "rows": rows}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"acceptance": (ACCEPTANCE, acceptance_arguments, acceptance),
                                          "quant": (QUANT, quant_arguments, quant)}, argv)


if __name__ == "__main__":
    sys.exit(main())
