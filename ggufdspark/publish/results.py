"""The "Measured" section of a card: a ``bench``, ``bench --load`` or ``tune`` (``--load``) JSON
report (or a saved tune profile) rendered as markdown tables, with where it was measured and what it
recommends. Every report must name the pair it measured by sha256 (``pair``: ``profiles.pair_record``,
as the toolkit writes it) and be this pair's; a ``bench`` run that refused its own headline (plain
drift) is refused here too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ggufdspark.errors import InputNotFoundError, PublishError

MAX_RESULT_COLUMNS = 10


@dataclass(frozen=True)
class ResultLayout:
    """Where a report's measurements are and which of their fields the card shows."""

    tool: str
    rows_key: str
    columns: tuple[tuple[str, str], ...]  # (JSON field, column header)


# The JSON reports of this toolkit (``bench --json``: BenchReport.to_dict; ``tune --json`` and
# saved tune profiles: TuneResult.to_dict). The first layout whose rows are present wins; any other
# JSON is shown generically (its first list of objects).
RESULT_LAYOUTS = (
    ResultLayout("bench", "groups", (("name", "prompts"), ("requests", "requests"),
                                     ("plain_decode_tps", "plain tok/s"), ("spec_decode_tps", "with draft tok/s"),
                                     ("decode_speedup", "speedup"), ("accept_length_token_weighted", "accept length"),
                                     ("acceptance_rate", "acceptance rate"))),
    ResultLayout("tune", "points", (("n_max", "draft length"), ("p_min", "p_min"), ("level", "parallel requests"),
                                    ("speed", "tok/s"), ("ratio", "vs no draft"), ("accept_length", "accept length"))),
)
BENCH_LOAD_COLUMNS = (("level", "parallel requests"), ("plain_tps", "plain tok/s"), ("spec_tps", "with draft tok/s"),
                      ("ratio", "vs no draft"))
# ``bench --load`` (LoadReport.to_dict): per level, each arm's aggregate output and TTFT
LOAD_KIND, TUNE_LOAD_KIND = "ggufdspark bench --load", "ggufdspark tune --load"
LOAD_COLUMNS = (("plain_tps", "plain tok/s"), ("drafted_tps", "with draft tok/s"), ("ratio", "vs no draft"),
                ("plain_ttft", "plain TTFT p50 (s)"), ("drafted_ttft", "with draft TTFT p50 (s)"))
GENERIC_ROW_KEYS = ("rows", "results", "arms", "measurements", "runs")


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v).replace("|", "\\|")


def _is_rows(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(rows: list[dict], columns: Iterable[tuple[str, str]]) -> list[str]:
    columns = list(columns)
    out = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(_fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]


def _generic_columns(rows: list[dict]) -> list[tuple[str, str]]:
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k not in cols and (v is None or isinstance(v, (int, float, str, bool))):
                cols.append(k)
    return [(c, c) for c in cols[:MAX_RESULT_COLUMNS]]


def _measured_on(data: dict) -> str | None:
    settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
    hw = data.get("hardware")
    where = hw.get("key") if isinstance(hw, dict) else None
    # bench and tune name the backend in their settings, bench --load in its hardware
    found = settings if settings.get("backend") else hw if isinstance(hw, dict) else {}
    if not where and found.get("backend"):
        devs = [d.get("description") or d.get("name") for d in found.get("devices") or [] if isinstance(d, dict)]
        where = str(found["backend"]) + (f", {devs[0]}" if devs and devs[0] else "")
    engine = str(settings.get("engine") or "").split(" ")[0]  # "COMMIT (/local/path)": the path stays home
    if not engine and isinstance(data.get("engine"), dict):  # bench --load: {"commit", "version", "path"}
        engine = str(data["engine"].get("commit") or data["engine"].get("version") or "")
    return ", ".join(x for x in (where, f"llama.cpp {engine}" if engine else None) if x) or None


def _load_report(p: Path, target_sha: str | Iterable[str], draft_sha: str | Iterable[str]) -> dict:
    """The report at ``p`` as a dict, refused when it names another pair than ours, names no pair
    (nothing to check it against), or is a ``bench`` run that refused its own headline."""
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputNotFoundError(f"{p}: no such results file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PublishError(f"{p}: not a JSON file ({e})") from None
    if not isinstance(data, dict):
        data = {"rows": data}
    pair = data.get("pair") if isinstance(data.get("pair"), dict) else {}
    for role, mine in (("target", target_sha), ("draft", draft_sha)):
        mine = [mine] if isinstance(mine, str) else list(mine)
        theirs = pair.get(f"{role}_sha256")
        if theirs and theirs not in mine:
            ours = " or ".join(f"{m[:16]}..." for m in mine)
            raise PublishError(f"{p}: measured on another {role} (sha256 {str(theirs)[:16]}..., "
                               f"this {role} is {ours})")
    missing = [f"pair.{role}_sha256" for role in ("target", "draft") if not pair.get(f"{role}_sha256")]
    if missing:
        raise PublishError(f"{p}: names no {' and no '.join(missing)}, so nothing shows it was measured on this "
                           "pair (bench, bench --load and tune reports of this version record both: run it again)")
    if data.get("headline_refused"):
        drift = data.get("plain_drift")
        how = f" ({drift:.0%} apart)" if isinstance(drift, (int, float)) and not isinstance(drift, bool) else ""
        raise PublishError(f"{p}: this bench refused its own headline: its two runs of the target alone "
                           f"disagreed{how}, so it gives no speedup; run bench again on a quieter machine")
    return data


def _notes(data: dict, layout: ResultLayout | None) -> tuple[list[str], list[str]]:
    """The lines above the table (where, synthetic acceptance) and below it (gate, recommendation)."""
    above, below = [], []
    where = _measured_on(data)
    if where:
        above += [f"Measured on: {where}.", ""]
    acc = data.get("acceptance")
    if isinstance(data.get("synthetic"), str):  # bench: "synthetic acceptance, rates ..."
        synthetic = data["synthetic"]
    elif layout and layout.tool == "tune" and isinstance(acc, dict) and acc.get("source"):  # tune is always synthetic
        synthetic = f"synthetic acceptance: {acc['source']}"
    else:
        synthetic = None
    if synthetic:
        above += [f"{synthetic[0].upper()}{synthetic[1:]} (these rows measure speed only).", ""]
    gate = data.get("gate")
    if isinstance(gate, dict) and gate.get("status"):
        below += ["", f"Lossless gate: {gate['status']}" + (f" ({gate['reason']})" if gate.get("reason") else "") + "."]
    rec = data.get("recommendation")
    if isinstance(rec, dict) and (rec.get("why") or rec.get("draft_n_max") is not None):
        why = rec.get("why") or f"draft length {rec['draft_n_max']}"
        below += ["", f"Recommended: {why.rstrip('.')}."]
    return above, below


def render_results(path: str | Path, target_sha: str | Iterable[str], draft_sha: str | Iterable[str]) -> str:
    """A markdown section from a ``bench`` or ``tune`` JSON report (or a saved tune profile): its
    measurements as a table, where and how they were taken, and the recommendation.

    Raises:
        InputNotFoundError: the file is missing. PublishError: not JSON, no measurements, or
        measured on another pair (its ``pair.target_sha256`` / ``pair.draft_sha256`` differ).
    """
    p = Path(path)
    data = _load_report(p, target_sha, draft_sha)
    if data.get("kind") == LOAD_KIND:
        return "\n".join(_load_section(data, f"ggufdspark {LOAD_KIND.split(' ', 1)[1]}"))
    if data.get("kind") == TUNE_LOAD_KIND or isinstance((data.get("load") or {}).get("ratios") if isinstance(
            data.get("load"), dict) else None, dict):
        return "\n".join(_tune_load_section(data))
    layout = next((lay for lay in RESULT_LAYOUTS if _is_rows(data.get(lay.rows_key))), None)
    if layout is not None:
        rows, columns, title = data[layout.rows_key], layout.columns, f"ggufdspark {layout.tool}"
        if layout.tool == "bench" and isinstance(data.get("overall"), dict):
            rows = rows + [{**data["overall"], "name": "all"}]
        if layout.tool == "tune" and _is_rows(data.get("plain")):  # the target alone, for scale
            rows = [{**r, "n_max": "none"} for r in data["plain"]] + rows
    else:
        key = next((k for k in GENERIC_ROW_KEYS if _is_rows(data.get(k))), None)
        key = key or next((k for k, v in data.items() if _is_rows(v)), None)
        if key is None:
            raise PublishError(f"{p}: no measurements found (not a 'ggufdspark bench' or 'tune' report, "
                               "and no list of objects)")
        rows, title = data[key], p.stem
        columns = _generic_columns(rows)
    above, below = _notes(data, layout)
    out = [f"### {title}", ""] + above + _table(rows, columns)
    if layout and layout.tool == "bench" and _is_rows(data.get("load")):
        out += ["", "Under load:", ""] + _table(data["load"], BENCH_LOAD_COLUMNS)
    return "\n".join(out + below)


def _load_section(data: dict, title: str) -> list[str]:
    """A ``bench --load`` report: under its traffic, each level's aggregate output tok/s and TTFT
    p50 of the plain and the (first) drafted arm, and drafted / plain."""
    arms = data.get("arms") if isinstance(data.get("arms"), dict) else {}
    plain = arms.get("plain") or []
    drafted_name = next((a for a in arms if a not in ("plain", "plain2")), None)
    drafted = arms.get(drafted_name) or []
    ratios = data.get("ratios") if isinstance(data.get("ratios"), list) else []
    if not (_is_rows(plain) and _is_rows(drafted) and len(plain) == len(drafted)):
        raise PublishError(f"{title}: a bench --load report without a plain and a drafted arm level by level")
    traffic = data.get("traffic") if isinstance(data.get("traffic"), dict) else {}
    shape = traffic.get("shape") if isinstance(traffic.get("shape"), dict) else {}
    unit = "requests/s" if shape.get("mode") == "poisson" else "clients"
    rows = [{"level": p.get("level"), "plain_tps": p.get("aggregate_tps"), "drafted_tps": d.get("aggregate_tps"),
             "ratio": (ratios[i] if i < len(ratios) and isinstance(ratios[i], dict) else {}).get("aggregate_tps"),
             "plain_ttft": p.get("ttft_p50_s"), "drafted_ttft": d.get("ttft_p50_s")}
            for i, (p, d) in enumerate(zip(plain, drafted))]
    above, below = _notes(data, None)
    what = shape.get("describe")
    above += [f"Under load (bench --load: many requests at once{f', {what}' if what else ''}): aggregate output "
              "tokens/s of all requests, not one request's speed.", ""]
    return [f"### {title}", ""] + above + _table(rows, [("level", unit), *LOAD_COLUMNS]) + below


def _tune_load_section(data: dict) -> list[str]:
    """A ``tune --load`` result or saved profile: drafted / plain aggregate output by draft length
    (0: drafting paused) and clients, and the recommendation."""
    load = data.get("load") if isinstance(data.get("load"), dict) else {}
    ratios = data.get("ratios") if isinstance(data.get("ratios"), dict) else load.get("ratios")
    if not isinstance(ratios, dict) or not all(isinstance(r, dict) for r in ratios.values()):
        raise PublishError("ggufdspark tune --load: a report without its ratios by draft length")
    levels = sorted({str(lv) for r in ratios.values() for lv in r}, key=lambda x: float(x))
    rows = [{"n": "paused" if str(n) == "0" else n, **{lv: r.get(lv) for lv in levels}}
            for n, r in sorted(ratios.items(), key=lambda kv: float(kv[0]))]
    # a saved profile names its hardware; a tune --load result holds its bench --load report, which does
    above = _notes(data if _measured_on(data) else load, None)[0]
    below = _notes({"recommendation": data.get("recommendation")}, None)[1]
    traffic = data.get("traffic") if isinstance(data.get("traffic"), dict) else {}
    what = traffic.get("shape") if isinstance(traffic.get("shape"), str) else load.get("traffic")
    above += [f"Under load{f' ({what})' if isinstance(what, str) and what else ''}: aggregate output tokens/s with "
              "the draft / without it, by draft length and closed-loop clients.", ""]
    columns = [("n", "draft length"), *((lv, f"{lv} clients") for lv in levels)]
    return ["### ggufdspark tune --load", ""] + above + _table(rows, columns) + below
