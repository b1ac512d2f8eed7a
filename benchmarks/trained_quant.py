"""Real acceptance of the trained pair for every target x draft precision, one request at a time.

    python benchmarks/trained_quant.py [--out DIR] [--draft 8] [--answer 96] [--json out.json]

The shipped trained pair (``generate --trained``) converted to F16, quantized by the engine's own
llama-quantize (``ggufdspark quantize``: Q8_0 and Q4_K_M targets, a Q8_0 draft whose Markov head
stays float), then served greedily on the eight held-out prompts: accept length (1 + accepted /
verify passes, passes from ``/metrics``), acceptance rate, and whether every answer equals the same
target's answer without the draft. Hidden 256 fills whole K-quant super-blocks, so the Q4_K_M
target runs the engine's real K-quant kernels. The quantized target answers differently from the F16
one (it is another model); the draft is checked against its own target.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggufdspark import timings as tm  # noqa: E402
from ggufdspark.engine import find_engine  # noqa: E402
from ggufdspark.quantize import quantize  # noqa: E402
from ggufdspark.runners.client import Client  # noqa: E402
from ggufdspark.runners.server import ServerProcess, ServerSettings  # noqa: E402
from ggufdspark.synthetic.pairs import build_trained_pair  # noqa: E402
from ggufdspark.trained import shipped  # noqa: E402


def arm(server: str, target: Path, draft: Path | None, prompts: list[str], n_draft: int, answer: int) -> dict:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/trained-quant"), help="where the converted and quantized files go (reused)")
    ap.add_argument("--draft", type=int, default=8, help="draft length (--spec-draft-n-max)")
    ap.add_argument("--answer", type=int, default=96, help="tokens each answer has")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
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
        plain = arm(server, t, None, prompts, args.draft, args.answer)["answers"]
        for dqn, d in drafts.items():
            r = arm(server, t, d, prompts, args.draft, args.answer)
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


if __name__ == "__main__":
    sys.exit(main())
