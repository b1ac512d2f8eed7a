"""The "Measured" section of a card: a ``bench`` or ``tune`` JSON report (or a saved tune profile)
rendered as markdown tables, with where it was measured and what it recommends."""

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
    if not where and settings.get("backend"):
        devs = [d.get("description") or d.get("name") for d in settings.get("devices") or [] if isinstance(d, dict)]
        where = settings["backend"] + (f", {devs[0]}" if devs and devs[0] else "")
    engine = str(settings.get("engine") or "").split(" ")[0]  # "COMMIT (/local/path)": the path stays home
    return ", ".join(x for x in (where, f"llama.cpp {engine}" if engine else None) if x) or None


def _load_report(p: Path, target_sha: str | Iterable[str], draft_sha: str | Iterable[str]) -> dict:
    """The report at ``p`` as a dict, refused when it names another pair than ours."""
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
            raise PublishError(f"{p}: measured on another {role} (sha256 {theirs[:16]}..., "
                               f"this {role} is {ours})")
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
