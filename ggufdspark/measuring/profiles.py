"""Tune profiles: measurements and a recommendation, keyed by hardware and by pair.

A profile lives at ``<cache>/profiles/<hardware-key>/<pair-key>.json``. The hardware key names the
backend, the first device's name and its memory; the pair key is built from the sha256 of the
target and the draft (hashes are cached by path, size and mtime, so a multi-GB file is read once).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import time
from pathlib import Path

from ggufdspark.devices import DeviceReport
from ggufdspark.engine import cache_dir, sha256_file
from ggufdspark.errors import InvalidArgumentError
from ggufdspark.launch import parse_draft_cut

log = logging.getLogger(__name__)


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, cached in ``<cache>/hashes.json`` by (path, size, mtime)."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    store = cache_dir() / "hashes.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        known = {}
    if not isinstance(known, dict):  # a damaged cache is rebuilt, never a crash
        known = {}
    if key in known:
        return known[key]
    known[key] = sha256_file(p)
    store.parent.mkdir(parents=True, exist_ok=True)
    _write_whole(store, json.dumps(known))
    return known[key]


def _write_whole(path: Path, text: str) -> None:
    """``text`` at ``path``, renamed into place from a temporary file of its own (a random name
    created exclusively, so that saves running at once in threads or processes never rename each
    other's file away); the last rename wins, every reader sees one whole file. The file is created
    with the usual permissions (0666 less the umask), as ``write_text`` would."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def pair_record(target: str | Path, draft: str | Path) -> dict:
    """The pair a measurement was taken on, as every report and profile records it (``pair``): the
    paths, and the sha256 of each file, which ``publish --results`` checks against the pair it
    publishes (a path says nothing once the file is renamed or replaced)."""
    return {"target": str(target), "draft": str(draft), "target_sha256": file_sha256(target),
            "draft_sha256": file_sha256(draft)}


def hardware_key(report: DeviceReport) -> str:
    gpus = [d for d in report.devices if d.type in ("gpu", "igpu", "unknown")]
    dev = gpus[0] if gpus else (report.devices[0] if report.devices else None)
    name = dev.description or dev.name if dev else "unknown"
    mem = f"{round(dev.memory_total / 2**30)}GiB" if dev and dev.memory_total else "0GiB"
    raw = f"{report.backend or 'cpu'}-{name}-{mem}"
    return re.sub(r"[^\w.-]+", "_", raw).strip("_")


def pair_key(target: str | Path, draft: str | Path) -> str:
    return f"{file_sha256(target)[:16]}-{file_sha256(draft)[:16]}"


def profile_path(report: DeviceReport, target: str | Path, draft: str | Path) -> Path:
    return cache_dir() / "profiles" / hardware_key(report) / f"{pair_key(target, draft)}.json"


def load_profile(report: DeviceReport, target: str | Path, draft: str | Path) -> dict | None:
    if not (cache_dir() / "profiles" / hardware_key(report)).is_dir():
        return None  # nothing tuned on this machine: don't hash multi-GB files to find that out
    p = profile_path(report, target, draft)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        log.warning("%s: unreadable tune profile, ignored (%s)", p, e)
        return None
    problem = profile_problem(data)
    if problem:
        log.warning("%s: not a tune profile (%s), ignored; run 'ggufdspark tune' again to replace it", p, problem)
        return None
    data["path"] = str(p)
    return data


# What serve reads from a profile's "recommendation": key -> (accepted types, check, expected)
_RECOMMENDATION: dict[str, tuple[tuple[type, ...], object, str]] = {
    "draft_enabled": ((bool,), lambda v: True, "true or false"),
    "draft_n_max": ((int,), lambda v: 1 <= v <= 64, "an integer 1..64"),
    "max_concurrency_for_draft": ((int,), lambda v: v >= 0, "an integer >= 0"),
    # tune's confidence threshold, measured with draft_n_max (launch.decide applies it with that length)
    "p_min": ((int, float), lambda v: 0 <= v <= 1, "a number 0..1"),
    "why": ((str,), lambda v: True, "a string"),
    # tune --load: drafts cut to L while more than N slots are busy (engine patch 0021)
    "load_cut": ((list,), lambda v: all(isinstance(x, list) and len(x) == 2 and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in x) for x in v), "a list of [N, L] pairs"),
}


def profile_problem(data: object) -> str | None:
    """Why ``data`` is not a usable profile (wrong shape or values), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, expected an object"
    rec = data.get("recommendation")
    if rec is None:
        return None
    if not isinstance(rec, dict):
        return f"recommendation is a JSON {type(rec).__name__}, expected an object"
    for key, (types, ok, expected) in _RECOMMENDATION.items():
        v = rec.get(key)
        if v is None:
            continue
        if not isinstance(v, types) or (bool not in types and isinstance(v, bool)) or not ok(v):
            return f"recommendation.{key} is {v!r}, expected {expected}"
    return _load_cut_problem(rec)


def _load_cut_problem(rec: dict) -> str | None:
    """Why the recommendation's ``load_cut`` (already a list of [N, L] pairs) is not a cut serve can
    pass on, or None: the rules of ``--draft-n-max-by-slots`` (``launch.parse_draft_cut``: N
    ascending from 0, L 0..64; ``serve_checks.check_draft_cut``: L no longer than the draft length
    it cuts), so that a hand-edited profile fails here, naming itself, not at the engine's start."""
    cut = rec.get("load_cut")
    if not cut:
        return None
    try:
        steps = parse_draft_cut(",".join(f"{n}:{k}" for n, k in cut))
    except InvalidArgumentError as e:
        return f"recommendation.load_cut is {cut!r}: {str(e).split(': ', 1)[-1]}"
    n_max = rec.get("draft_n_max")
    for n, k in steps:
        if n_max is not None and k > n_max:
            return (f"recommendation.load_cut is {cut!r}: {n}:{k} cuts drafts to {k} tokens, longer than the "
                    f"profile's draft length {n_max}")
    return None


def save_profile(report: DeviceReport, target: str | Path, draft: str | Path, data: dict) -> Path:
    p = profile_path(report, target, draft)
    p.parent.mkdir(parents=True, exist_ok=True)
    record = {"hardware": {"key": hardware_key(report), "backend": report.backend,
                           "devices": [d.__dict__ for d in report.devices]},
              "pair": pair_record(target, draft),
              "written_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **data}
    _write_whole(p, json.dumps(record, indent=2))
    return p
