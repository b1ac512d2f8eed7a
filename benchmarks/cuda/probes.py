#!/usr/bin/env python3
"""The CUDA probes' Python side; the probes themselves are beside this file (``topk_cuda.cu``: the
engine's top-k kernels outside ggml, ``cupti_trace.cpp``: a device timeline of any CUDA process),
built and run by ``benchmarks/h200.sh topk`` and ``timeline``:

* ``timeline``: where a traced process's device sat idle, from ``cupti_trace.cpp``'s CSV;
* ``topk-switch``: engine patch 0052's switch of the graph's top-k (host logic: a CPU build is
  enough), checked from the engine's own log;
* ``ncu``: what each profiled kernel launch spent, from Nsight Compute's CSV (``h200.sh ncu``).

    python benchmarks/cuda/probes.py timeline plain=trace-plain.csv drafted=trace-drafted.csv [--json out.json]
    python benchmarks/cuda/probes.py topk-switch --server "$(ggufdspark build-engine --print-path)"
    python benchmarks/cuda/probes.py ncu ncu-1.csv ncu-2.csv [--json out.json]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from benchmarks import costs, harness  # noqa: E402
from ggufdspark.measuring import measure  # noqa: E402

TIMELINE = """Where a CUDA process's device sat idle: reads the CSV that ``benchmarks/cuda/cupti_trace.cpp`` writes
(kernels, copies, memsets, synchronisations and runtime API calls with their start and end) and splits
it into bursts of device work, separated by at least ``--split-ms`` of idle device. For each burst it
prints the span, the time some kernel, copy or memset ran (the union over streams), the idle rest and
its gaps of at least ``--gap-us``, each stream's kernel time, the host's longest runtime calls, and
the longest gaps with the work on either side and the host call that covered most of it. With the
runtime calls recorded (``GGUFDSPARK_CUPTI_API=1``) each kind of gap also says how much of it the host
spent inside a runtime call or synchronisation: the rest is host work outside CUDA.

    python benchmarks/cuda/probes.py timeline plain=trace-plain.csv drafted=trace-drafted.csv [--json out.json]

A burst is what a request (or a prompt) cost the device when nothing else ran: the prefill stage of
``benchmarks/h200.sh`` sends one prompt at a time, then several at once.
"""

TOPK_SWITCH = """Engine patch 0052: a step takes the graph's top K only when a busy slot's sampler can use it.

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

A CPU build is enough (the switch is host logic; the CUDA kernels are ``topk_cuda.cu``'s, beside this file)::

    python benchmarks/cuda/probes.py topk-switch --server "$(ggufdspark build-engine --print-path)"
"""


NCU = """What each kernel launch that Nsight Compute profiled spent: reads the CSV of ``ncu --csv --page details``
(one row a metric: ``ID``, ``Kernel Name``, ``Block Size``, ``Grid Size``, ``Section Name``, ``Metric Name``,
``Metric Unit``, ``Metric Value``; the lines before its header, ncu's own, are skipped) with the SpeedOfLight,
Occupancy, LaunchStats and WarpStateStats sections and the ``smsp__average_warps_issue_stalled_*`` metrics,
as ``benchmarks/h200.sh ncu`` asks for them. For each file (one test-backend-ops case, named by the file)
and kernel, the median over its launches of: the duration,
registers a thread, the waves a launch takes, theoretical and achieved occupancy, memory, DRAM and SM
throughput, warp cycles per issued instruction, and the three stall reasons with most cycles.

    python benchmarks/cuda/probes.py ncu ncu-1.csv ncu-2.csv [--json out.json]
"""

NCU_METRICS = {"Duration": "duration_us", "Registers Per Thread": "registers", "Waves Per SM": "waves",
               "Theoretical Occupancy": "theoretical_occupancy_pct", "Achieved Occupancy": "achieved_occupancy_pct",
               "Memory Throughput": "memory_pct", "DRAM Throughput": "dram_pct",
               "Compute (SM) Throughput": "sm_pct", "Warp Cycles Per Issued Instruction": "cycles_per_issue"}
NCU_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
# the columns of an ncu details CSV that read_ncu takes
NCU_COLUMNS = ("ID", "Kernel Name", "Block Size", "Grid Size", "Metric Name", "Metric Unit", "Metric Value")
NCU_TIME = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}

SYNC_TYPES = {1: "event sync", 2: "stream wait event", 3: "stream sync", 4: "context sync"}


def short_name(name: str) -> str:
    """A kernel's identifier without its template arguments and parameters (mangled or not)."""
    m = re.match(r"_ZN?(\d+)", name)
    if m:
        n = int(m.group(1))
        return name[m.end():m.end() + n]
    name = re.sub(r"^void\s+", "", name)
    return re.split(r"[<(]", name, maxsplit=1)[0] or name


def read_trace(path: Path) -> tuple[list[tuple], list[tuple], str]:
    """Device records (start, end, stream, what), host runtime calls (start, end, thread, name) and
    the traced process's command line."""
    dev, host, cmdline = [], [], ""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("#,"):
                cmdline = line[2:].strip()
                continue
            parts = line.rstrip("\n").split(",", 4)
            if len(parts) < 5:
                continue
            kind, start, end, ident, rest = parts
            try:
                s, e, i = int(start), int(end), int(ident)
            except ValueError:
                continue
            if e < s:
                continue
            if kind == "K":
                dev.append((s, e, i, short_name(rest)))
            elif kind == "C":
                ck = rest.split(",")[0]
                dev.append((s, e, i, {"1": "copy HtoD", "2": "copy DtoH", "8": "copy DtoD"}.get(ck, f"copy {ck}")))
            elif kind == "S":
                dev.append((s, e, i, "memset"))
            elif kind == "Y":
                host.append((s, e, i, "wait: " + SYNC_TYPES.get(int(rest or 0), "sync") + f" on stream {i}"))
            elif kind == "R":
                host.append((s, e, i, rest))
    dev.sort()
    host.sort()
    return dev, host, cmdline


def gap_class(before: tuple, after: tuple) -> str:
    """A gap by what ends and what starts it: stream -> stream, copies and memsets named."""
    def side(r: tuple) -> str:
        return f"{r[3]} {r[2]}" if r[3].startswith(("copy", "memset")) else f"stream {r[2]}"
    return f"{side(before)} -> {side(after)}"


def bursts(dev: list[tuple], split_ns: int) -> list[list[tuple]]:
    """Runs of device records with less than split_ns of idle device between them."""
    out: list[list[tuple]] = []
    cur: list[tuple] = []
    end = None
    for r in dev:
        if end is not None and r[0] - end >= split_ns:
            out.append(cur)
            cur = []
        cur.append(r)
        end = r[1] if len(cur) == 1 else max(end, r[1])
    if cur:
        out.append(cur)
    return out


def merged(intervals: list[tuple]) -> list[list[int]]:
    """The union of (start, end, ...) intervals sorted by start, as disjoint [start, end] pairs."""
    out: list[list[int]] = []
    for s, e, *_ in intervals:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(union: list[list[int]], starts: list[int], gs: int, ge: int) -> int:
    """How much of [gs, ge] the disjoint intervals ``union`` (their starts in ``starts``) cover."""
    i = max(0, bisect.bisect_right(starts, gs) - 1)
    n = 0
    while i < len(union) and union[i][0] < ge:
        n += max(0, min(union[i][1], ge) - max(union[i][0], gs))
        i += 1
    return n


# a launch's duration class: powers of two in microseconds
BIN_EDGES_US = (4, 8, 16, 32, 64, 128, 256, 512)


def duration_bin(ns: int) -> str:
    """The class of a launch that ran ``ns`` nanoseconds: "<4 us", "4-8 us", ..., ">=512 us"."""
    lo = 0
    for edge in BIN_EDGES_US:
        if ns < edge * 1000:
            return f"<{edge} us" if lo == 0 else f"{lo}-{edge} us"
        lo = edge
    return f">={lo} us"


def bin_order(kv: tuple) -> int:
    """Sort key of a (duration class, value) pair: the classes from short to long."""
    b = kv[0]
    return 0 if b.startswith("<") else 99 if b.startswith(">") else int(b.split("-")[0])


def bin_totals(by_name: dict[str, dict[str, list]]) -> dict[str, list]:
    """{kernel: {duration class: [time, launches]}} -> {kernel: [time, launches]}."""
    return {n: [sum(v[0] for v in bd.values()), sum(v[1] for v in bd.values())] for n, bd in by_name.items()}


def analyse(recs: list[tuple], host: list[tuple], gap_ns: int, top: int) -> dict:
    t0 = recs[0][0]
    t1 = max(r[1] for r in recs)
    busy = 0
    gaps = []  # (length, start, record before, record after)
    cur_s, cur_e, last = recs[0][0], recs[0][1], recs[0]
    for r in recs[1:]:
        if r[0] > cur_e:
            busy += cur_e - cur_s
            if r[0] - cur_e >= gap_ns:
                gaps.append((r[0] - cur_e, cur_e, last, r))
            cur_s, cur_e = r[0], r[1]
        if r[1] >= cur_e:
            cur_e, last = r[1], r
    busy += cur_e - cur_s

    streams: dict[int, list] = defaultdict(lambda: [0, 0])
    # each kernel's launches by how long they ran (one name covers products of every shape: the output
    # head's launch is the long one among a layer's short ones); a name's totals are its classes' sums
    bins: dict[int, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0, 0])))
    for s, e, st, what in recs:
        if not what.startswith(("copy", "memset")):
            for c in (streams[st], bins[st][what][duration_bin(e - s)]):
                c[0] += e - s
                c[1] += 1
    names = {st: bin_totals(d) for st, d in bins.items()}

    in_span = [h for h in host if h[1] >= t0 and h[0] <= t1]
    calls: dict[str, list] = defaultdict(lambda: [0, 0])
    for s, e, _, name in in_span:
        calls[name][0] += min(e, t1) - max(s, t0)
        calls[name][1] += 1

    def covering(gs: int, ge: int) -> str:
        """The runtime call over most of the gap, and the synchronisation (what the host waited on)."""
        best = {False: ("", 0), True: ("", 0)}
        for s, e, _, name in in_span:
            if s > ge:
                break
            ov = min(e, ge) - max(s, gs)
            wait = name.startswith("wait: ")
            if ov > best[wait][1]:
                best[wait] = (f"{name} ({ov / 1e3:.0f} us of it)", ov)
        return "; ".join(b for b, _ in (best[False], best[True]) if b) or "no runtime call"

    # with runtime calls recorded, the host's time inside CUDA (calls and waits) over each gap
    api = any(not name.startswith("wait: ") for *_, name in in_span)
    union = merged(in_span) if api else []
    starts = [u[0] for u in union]
    classes: dict[str, list] = defaultdict(lambda: [0, 0, 0])
    for length, gs, before, after in gaps:
        c = classes[gap_class(before, after)]
        c[0] += length
        c[1] += 1
        if api:
            c[2] += covered(union, starts, gs, gs + length)
    gaps.sort(reverse=True)
    return {
        "span_ms": (t1 - t0) / 1e6,
        "busy_ms": busy / 1e6,
        "idle_ms": (t1 - t0 - busy) / 1e6,
        "busy_share": busy / max(1, t1 - t0),
        "records": len(recs),
        "gaps": len(gaps),
        "gaps_ms": sum(g[0] for g in gaps) / 1e6,
        "streams": {str(k): {"kernel_ms": v[0] / 1e6, "kernels": v[1]} for k, v in sorted(streams.items())},
        "kernel_names": {str(k): {n: {"ms": v[0] / 1e6, "n": v[1]} for n, v in sorted(d.items(), key=lambda kv: -kv[1][0])}
                         for k, d in sorted(names.items())},
        "kernel_bins": {str(k): {n: {b: {"ms": v[0] / 1e6, "n": v[1]} for b, v in sorted(bd.items(), key=bin_order)}
                                 for n, bd in sorted(d.items())}
                        for k, d in sorted(bins.items())},
        "gap_classes": {k: {"ms": v[0] / 1e6, "n": v[1], **({"in_calls_ms": v[2] / 1e6} if api else {})}
                        for k, v in sorted(classes.items(), key=lambda kv: -kv[1][0])},
        "host_calls": [
            {"call": k, "ms": v[0] / 1e6, "n": v[1]}
            for k, v in sorted(calls.items(), key=lambda kv: -kv[1][0])[:8]
        ],
        "longest_gaps": [
            {
                "at_ms": (g[1] - t0) / 1e6,
                "us": g[0] / 1e3,
                "before": f"{g[2][3]} (stream {g[2][2]})",
                "after": f"{g[3][3]} (stream {g[3][2]})",
                "host": covering(g[1], g[1] + g[0]),
            }
            for g in gaps[:top]
        ],
    }


def timeline_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("traces", nargs="+", help="NAME=trace.csv, or a path (named by its stem and whether the "
                    "traced command line has -md)")
    ap.add_argument("--split-ms", type=float, default=5.0,
                    help="idle device that ends a burst (5: one request's prompt or answer a burst when requests come one by one)")
    ap.add_argument("--gap-us", type=float, default=20.0, help="the shortest gap counted (20)")
    ap.add_argument("--min-records", type=int, default=200, help="bursts with fewer records are not shown (200)")
    ap.add_argument("--top", type=int, default=6, help="the longest gaps shown a burst (6)")
    ap.add_argument("--kernels", type=int, default=12, help="the kernels shown a stream, by their time (12)")
    ap.add_argument("--json", help="write the figures here too")


def timeline(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The traces' bursts and gaps (``TIMELINE``); exit 2 when no trace holds device records."""
    result = {}
    for spec in a.traces:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        path = Path(path)
        if not path.is_file():
            print(f"probes.py timeline: no trace at {path}", file=sys.stderr)
            return 2
        dev, host, cmdline = read_trace(path)
        # unnamed: the traced server's kind, from its command line
        name = name or f"{path.stem} ({'drafted' if ' -md ' in f' {cmdline} ' else 'plain'})"
        if not dev:
            # a process that initialised CUDA and ran nothing (a capability probe)
            print(f"\n== {path.name}: no device records ({cmdline or 'no command line'})")
            continue
        shown = [
            analyse(b, host, int(a.gap_us * 1e3), a.top)
            for b in bursts(dev, int(a.split_ms * 1e6))
            if len(b) >= a.min_records
        ]
        result[name] = {"cmdline": cmdline, "bursts": shown}
        print(f"\n== {name} ({path.name}): {len(dev)} device records, {len(shown)} bursts of >= {a.min_records}")
        print(f"{'#':>3} {'span ms':>9} {'busy ms':>9} {'idle ms':>9} {'busy':>6} {'gaps':>6}  kernel ms by stream")
        for i, b in enumerate(shown):
            st = ", ".join(f"{k}: {v['kernel_ms']:.2f} ({v['kernels']})" for k, v in b["streams"].items())
            print(f"{i:>3} {b['span_ms']:>9.2f} {b['busy_ms']:>9.2f} {b['idle_ms']:>9.2f} "
                  f"{b['busy_share'] * 100:>5.1f}% {b['gaps']:>6}  {st}")
        classes: dict[str, list] = defaultdict(lambda: [0.0, 0, None])
        for b in shown:
            for k, v in b["gap_classes"].items():
                classes[k][0] += v["ms"]
                classes[k][1] += v["n"]
                if "in_calls_ms" in v:
                    classes[k][2] = (classes[k][2] or 0.0) + v["in_calls_ms"]
        if shown:
            print(f"gaps >= {a.gap_us:g} us over these bursts, by what ends and starts them:")
            for k, (ms, n, calls) in sorted(classes.items(), key=lambda kv: -kv[1][0])[:10]:
                inside = "" if calls is None else f"; {calls / ms * 100:.0f}% in runtime calls"
                print(f"   {k:<36} {ms:9.2f} ms  x{n:<6} ({ms * 1e3 / n:.0f} us each{inside})")
        kbins: dict[str, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0])))
        for b in shown:
            for st, d in b["kernel_bins"].items():
                for n, bd in d.items():
                    for c, v in bd.items():
                        kbins[st][n][c][0] += v["ms"]
                        kbins[st][n][c][1] += v["n"]
        for st in kbins:
            d = bin_totals(kbins[st])
            total = sum(v[0] for v in d.values())
            print(f"stream {st}'s kernels over these bursts by time ({total:.2f} ms, {sum(v[1] for v in d.values())} launches):")
            for n, (ms, k) in sorted(d.items(), key=lambda kv: -kv[1][0])[:a.kernels]:
                print(f"   {n:<40} {ms:9.2f} ms  x{k:<7} ({ms * 1e3 / k:.1f} us each, {ms / total * 100:.0f}%)")
                classes = sorted(kbins[st][n].items(), key=bin_order)
                if len(classes) > 1:  # launches of several lengths: how many of each, and their time
                    print("      " + ", ".join(f"{c} x{v[1]} {v[0]:.2f} ms" for c, v in classes))
        for i, b in enumerate(shown):
            print(f"-- burst {i}: host calls " + "; ".join(f"{c['call']} {c['ms']:.2f} ms x{c['n']}" for c in b["host_calls"][:5]))
            for g in b["longest_gaps"]:
                print(f"   gap {g['us']:8.1f} us at {g['at_ms']:8.2f} ms: {g['before']} -> {g['after']}; host: {g['host']}")
    if not result:
        print("probes.py timeline: no trace holds device records", file=sys.stderr)
        return 2
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


# --------------------------------------------------------------------------- topk-switch


SWITCH = re.compile(r"the graph's top-(\d+) (on|off)")
TAKEN = re.compile(r"from the graph's top \d+ candidates")


def switch_requests(k: int) -> list[tuple[str, dict, bool]]:
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


def switch_arm(settings, k: int | None, log: Path, n_predict: int) -> tuple[list[list[int]], list[str]]:
    """Each request's tokens and the server log written while it ran."""
    env = {key: v for key, v in settings.env.items() if key != "LLAMA_OUTPUT_TOPK"}
    if k is not None:
        env["LLAMA_OUTPUT_TOPK"] = str(k)
    outs, marks = [], []
    with measure.running(replace(settings, env=env), log) as c:
        prompt = c.tokenize(harness.PROMPT)
        marks.append(len(log.read_text(errors="replace")))
        for _, opts, _ in switch_requests(k or 64):
            outs.append(c.complete(prompt, n_predict=n_predict, **opts).tokens)
            marks.append(len(log.read_text(errors="replace")))
    text = log.read_text(errors="replace")
    return outs, [text[a:b] for a, b in zip(marks, marks[1:])]


def check_switch(name: str, k: int | None, parts: list[str]) -> list[str]:
    """What went wrong in one arm's log (nothing: []), each request's switches printed."""
    if k and not any(SWITCH.search(p) for p in parts):
        return [f"{name}: the engine never switched the graph's top-{k} on or off: a build without "
                f"patches 0050 and 0052"]
    problems = []
    on = True  # the context's default until the server first sets it
    for (what, _, takes), part in zip(switch_requests(k or 64), parts):
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


def topk_switch_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--server", required=True, help="llama-server (build-engine --print-path)")
    ap.add_argument("--k", type=int, default=64, help="LLAMA_OUTPUT_TOPK (64)")
    ap.add_argument("--n-predict", type=int, default=24, help="tokens a request (24)")
    ap.add_argument("--vocab", type=int, default=32000, help="the generated pair's vocabulary (32000)")
    ap.add_argument("--work", type=Path, help="where the pair and logs go (default: a temporary folder)")


def topk_switch(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """The switch's check (``TOPK_SWITCH``): OK, or each problem on stderr and exit 1."""
    os.environ.pop("LLAMA_OUTPUT_TOPK", None)  # the unset arm must not inherit it from here

    with tempfile.TemporaryDirectory(prefix="graph-topk-") as tmp:
        work = args.work or Path(tmp)
        target, draft = costs.generated_pair(work / "pair", args.vocab)
        base = harness.with_args(harness.base_settings(args.server, target, gpu=False, parallel=2,
                                                       n_predict=args.n_predict), ["-v"])
        problems: list[str] = []
        for name, settings in {"plain": base, "drafted": harness.drafted(base, draft, 4, None)}.items():
            tokens = {}
            for k in (args.k, 0, None):
                log = work / f"{name}-{'unset' if k is None else k}.log"
                log.unlink(missing_ok=True)
                tokens[k], parts = switch_arm(settings, k, log, args.n_predict)
                problems += check_switch(name, k, parts)
            if not tokens[args.k] == tokens[0] == tokens[None]:
                problems.append(f"{name}: the tokens differ with LLAMA_OUTPUT_TOPK={args.k}, 0 and unset")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def read_ncu(path: Path) -> dict:
    """One ncu details CSV: each launch ID's kernel, block, grid and metrics (``NCU_METRICS``' names,
    times in us, stall reasons under ``stalls``)."""
    head, launches, width = None, {}, 0
    for row in csv.reader(path.read_text(errors="replace").splitlines()):
        if head is None:
            if "Kernel Name" in row and "Metric Value" in row:
                head = {name: i for i, name in enumerate(row)}
                width = 1 + max(head[k] for k in NCU_COLUMNS)
            continue
        # Nsight Compute 2025 fills the rule columns after "Metric Value" only on its rules' rows: a metric's
        # row is shorter than the header, and only the columns read here must be there
        if len(row) < width:
            continue
        launch = launches.setdefault(row[head["ID"]], {
            "kernel": short_name(row[head["Kernel Name"]]), "block": row[head["Block Size"]],
            "grid": row[head["Grid Size"]], "stalls": {}})
        name, unit = row[head["Metric Name"]], row[head["Metric Unit"]]
        try:
            value = float(row[head["Metric Value"]].replace(",", ""))
        except ValueError:
            continue
        if NCU_METRICS.get(name, "").endswith("_pct") and unit != "%":
            continue  # a percent metric named again in another unit (MemoryWorkloadAnalysis's "Memory Throughput", byte/s)
        if name in NCU_METRICS:
            launch[NCU_METRICS[name]] = value * NCU_TIME.get(unit, 1.0) if name == "Duration" else value
        elif m := NCU_STALL.fullmatch(name):
            launch["stalls"][m.group(1)] = value
    return launches


def ncu_rows(launches: dict) -> list[dict]:
    """A row a kernel (name, block, grid): the median over its launches of each metric, and the three
    stall reasons with the highest median."""
    by_kernel = defaultdict(list)
    for launch in launches.values():
        by_kernel[(launch["kernel"], launch["block"], launch["grid"])].append(launch)
    rows = []
    for (kernel, block, grid), ls in by_kernel.items():
        row = {"kernel": kernel, "block": block, "grid": grid, "launches": len(ls)}
        for key in NCU_METRICS.values():
            values = [launch[key] for launch in ls if key in launch]
            if values:
                row[key] = round(statistics.median_high(values), 3)
        stalls = defaultdict(list)
        for launch in ls:
            for reason, value in launch["stalls"].items():
                stalls[reason].append(value)
        top = sorted(((statistics.median_high(v), r) for r, v in stalls.items()), reverse=True)[:3]
        row["top_stalls"] = {r: round(v, 2) for v, r in top}
        rows.append(row)
    return rows


def ncu_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("csvs", nargs="+", type=Path, help="ncu --csv --page details output, one file a case")
    ap.add_argument("--json", type=Path, help="also write the summary here")


def ncu(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    summary = {}
    for path in a.csvs:
        if not path.is_file():
            ap.exit(2, f"probes.py ncu: no CSV at {path}\n")
        case, launches = path.stem, read_ncu(path)
        if not launches:
            print(f"{path.name}: no kernel profiled")
            continue
        rows = summary[case] = ncu_rows(launches)
        print(f"== {case}")
        for r in rows:
            stalls = ", ".join(f"{k} {v}" for k, v in r["top_stalls"].items()) or "-"
            print(f"  {r['kernel'][:34]:34s} grid {r['grid']:>14s} block {r['block']:>12s}  "
                  f"{r.get('duration_us', float('nan')):8.2f} us  regs {r.get('registers', 0):5.0f}  "
                  f"waves {r.get('waves', float('nan')):5.2f}  occupancy {r.get('achieved_occupancy_pct', float('nan')):5.1f}"
                  f"/{r.get('theoretical_occupancy_pct', float('nan')):5.1f}%  mem {r.get('memory_pct', float('nan')):5.1f}%"
                  f"  dram {r.get('dram_pct', float('nan')):5.1f}%  sm {r.get('sm_pct', float('nan')):5.1f}%"
                  f"  cycles/issue {r.get('cycles_per_issue', float('nan')):6.2f}  stalls: {stalls}  (x{r['launches']})")
    if not summary:
        ap.exit(2, "probes.py ncu: no CSV holds a profiled kernel\n")
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return harness.run_commands(__doc__, {"timeline": (TIMELINE, timeline_arguments, timeline),
                                          "topk-switch": (TOPK_SWITCH, topk_switch_arguments, topk_switch),
                                          "ncu": (NCU, ncu_arguments, ncu)}, argv)


if __name__ == "__main__":
    sys.exit(main())
