"""The end-to-end job in one command (``make demo``): write the trained pair that ships with the
package (a small LFM2 target trained on the Python standard library and its DSpark drafter, which
really predicts it), convert both to GGUF, check the pair, serve it with the draft, send a held-out
prompt, and print the answer and the acceptance timings. Files are kept under ``<cache>/demo`` and
reused on the next run."""

from __future__ import annotations

import logging
import sys

from ggufdspark import engine
from ggufdspark import timings as tm
from ggufdspark.check import check_pair
from ggufdspark.errors import GgufdsparkError
from ggufdspark.serve import serving
from ggufdspark.synthetic.pairs import build_trained_pair
from ggufdspark.trained import shipped


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    root = engine.cache_dir() / "demo"
    try:
        print(f"1. writing and converting {shipped.describe()}, under {root}")
        pair = build_trained_pair(root)
        print(f"   target {pair.target}\n   draft  {pair.draft}")
        report = check_pair(pair.target, pair.draft)
        print(f"2. check: {'pair OK' if report.ok else 'REFUSED'} ({len(report.checks)} checks)")
        report.raise_for_failures()
        with serving(pair.target, pair.draft) as (srv, client):
            print(f"3. serving: {' '.join(srv.settings.redacted())}")
            if srv.settings.public_path:
                page = client.get_text("/")  # an HTTP error raises: the page is part of the demo
                print(f"   chat page {srv.url}/ ({len(page)} bytes of index.html from {srv.settings.public_path})")
            else:
                print("   chat page: none (build-engine builds it where node >= 20.19 and npm are; docs/webui.md)")
            prompt = shipped.prompts()[1]  # code from a standard-library file neither model trained on
            before = client.metrics()
            out = client.complete(prompt, n_predict=96)
            # /metrics counters before and after (one request in flight) give exact verify passes
            exact = tm.metrics_delta(before, client.metrics())
            t = out.timings
            t.passes, t.passes_source = exact.passes, exact.passes_source
            print("4. request: a held-out prompt (the end of it), then the answer, drafted and verified")
            print("   " + "\n   ".join(prompt.rstrip("\n").splitlines()[-4:]))
            print("   ---")
            print("   " + "\n   ".join(out.text.splitlines()[:8]))
            print("5. acceptance timings")
            print(f"   predicted tokens   {t.predicted_n}")
            print(f"   drafted / accepted {t.draft_n} / {t.draft_n_accepted}")
            rate = f"{t.acceptance_rate:.3f}" if t.acceptance_rate is not None else "n/a"
            al = f"{t.accept_length:.2f}" if t.accept_length is not None else "n/a"
            print(f"   acceptance rate    {rate}")
            print(f"   verify passes      {t.passes} (from {t.passes_source})")
            print(f"   accept length      {al} (tokens a verify pass gives, bonus token included: "
                  f"1 + accepted/passes; MAT {t.mat:.2f})")
            print(f"   decode speed       {t.decode_tps:.1f} tok/s")
            # the engine's logger thread may write the request's line after the response
            lines = srv.wait_for_log(r"draft acceptance = .*mean len = *\d+\.\d\d")
            print(f"   engine log         {lines[-1].split('|')[-1].strip()}")
    except GgufdsparkError as e:
        print(f"ggufdspark: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
