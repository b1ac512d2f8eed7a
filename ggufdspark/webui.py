"""The chat page: llama.cpp's web UI built from the pinned source, cached apart from the engine.

The pinned tree's own CMake build embeds prebuilt UI assets downloaded from a Hugging Face bucket
(``tools/ui/CMakeLists.txt``, ``scripts/ui-assets.cmake``): not pinned to the engine's commit, and
nothing at all without network (the engine then serves no page: ``File Not Found`` at ``/``).
Here the UI is built from the tree's own sources instead, the way that script's npm branch does it:
``npm ci`` against ``tools/ui/package-lock.json``, then ``npm run build`` with
``LLAMA_UI_OUT_DIR`` naming the output. The result lives in ``<cache>/ui/<commit>/dist``, built in
a temporary directory next to it and renamed into place once complete, under a lock like the
engine's. It is kept out of the engine's build on purpose: building it never changes the engine's
cache key and never recompiles ``llama-server``. ``serve`` hands it to the engine as
``--path DIST`` (the pinned server then serves the directory's files, ``index.html`` at ``/``).

ggufdspark's changes to the UI (``ggufdspark/data/ui-patches/*.patch``, paths relative to
``tools/ui``; ``$GGUFDSPARK_UI_PATCHES`` names another directory, empty for none) are applied to the
copy that is built, and key the cache: ``<cache>/ui/<commit>-<digest of the patches>``. They are not
part of the engine's patch series, so changing one rebuilds the page (about two minutes) and never
the engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ggufdspark import engine as eng
from ggufdspark.errors import EngineBuildError, EngineError

log = logging.getLogger(__name__)

# Where the UI's sources are in the llama.cpp tree, and the lock file that pins its dependencies.
UI_SOURCE = Path("tools") / "ui"
LOCKFILE = "package-lock.json"
# The node versions the tree's lock file can build with: vite 7's "engines" field
# (``^20.19.0 || >=22.12.0``), as (major, lowest minor) per major; majors above the last one: any.
NODE_SUPPORTED = {20: 19, 22: 12}
NODE_WANTED = "node ^20.19 or >= 22.12"
# An already-built UI directory to serve instead of the cached one (like $GGUFDSPARK_SERVER).
ENV_UI = "GGUFDSPARK_UI"
# What a completed build has (the dist directory only appears once complete: it is renamed into place).
REQUIRED = ("index.html",)
# The UI's own patch series, and the variable that names another directory ("" for none).
UI_PATCHES = Path(__file__).parent / "data" / "ui-patches"
ENV_UI_PATCHES = "GGUFDSPARK_UI_PATCHES"


class UiBuildError(EngineBuildError):
    """``npm ci`` or ``npm run build`` of the chat UI failed."""


@dataclass
class UiBuild:
    """What ``build_ui`` did: ``status`` is ``built``, ``cached`` or ``skipped`` (``reason`` says why)."""

    status: str
    path: Path | None = None
    reason: str = ""
    seconds: float | None = None


def ui_patch_files() -> list[Path]:
    """The patches applied to the UI's sources before it is built, in order (may be empty)."""
    env = os.environ.get(ENV_UI_PATCHES)
    d = UI_PATCHES if env is None else (Path(env).expanduser() if env else None)
    return sorted(d.glob("*.patch")) if d is not None and d.is_dir() else []


def ui_key() -> str:
    """The UI build's cache key: the pinned commit, plus a digest of the UI patches when there are any."""
    patches = ui_patch_files()
    if not patches:
        return eng.PIN_COMMIT
    digest = hashlib.sha256("\n".join(f"{p.name}:{eng.sha256_file(p)}" for p in patches).encode()).hexdigest()
    return f"{eng.PIN_COMMIT}-{digest[:10]}"


def ui_root(cache: Path | None = None) -> Path:
    """``<cache>/ui/<ui_key()>``: the UI's lock, log, record and ``dist``."""
    return (cache or eng.cache_dir()) / "ui" / ui_key()


def built_ui(cache: Path | None = None) -> Path | None:
    """The cached UI's ``dist`` directory when a build completed, else None."""
    dist = ui_root(cache) / "dist"
    return dist if all((dist / f).is_file() for f in REQUIRED) else None


def find_ui(cache: Path | None = None) -> Path | None:
    """The UI to serve: ``$GGUFDSPARK_UI`` when set, else the cached build (None when there is none).

    Raises:
        EngineError: ``$GGUFDSPARK_UI`` names a directory without ``index.html``.
    """
    if env := os.environ.get(ENV_UI):
        d = Path(env).expanduser()
        if not (d / "index.html").is_file():
            raise EngineError(f"{d}: ${ENV_UI} is not a built chat UI (no index.html)")
        return d
    return built_ui(cache)


def ui_for_engine(info: eng.EngineInfo, cache: Path | None = None) -> tuple[Path | None, str]:
    """The UI directory ``serve`` should pass to ``info``'s engine, and a note on where the page comes from.

    The cached UI is built for the pinned commit: another engine keeps its own page (if it has one).
    """
    if os.environ.get(ENV_UI):
        d = find_ui(cache)
        return d, f"{d} (${ENV_UI})"
    d = built_ui(cache)
    if d is None:
        return None, ("not built: 'ggufdspark build-engine' builds it where node and npm are "
                      f"({NODE_WANTED})")
    if info.commit and not _same_commit(info.commit, eng.PIN_COMMIT):
        return None, (f"the engine is commit {info.commit}, the cached UI is for {eng.PIN_COMMIT}: "
                      "the engine's own page, if it has one")
    return d, f"{d} (built from the pinned source)"


def _same_commit(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a.startswith(b) or b.startswith(a)


def node_problem() -> str | None:
    """Why the UI cannot be built here (no node / npm, or a node too old), or None."""
    node, npm = shutil.which("node"), shutil.which("npm")
    missing = [name for name, path in (("node", node), ("npm", npm)) if not path]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (the UI needs {NODE_WANTED})"
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"'node --version' failed: {e}"
    m = re.match(r"v?(\d+)\.(\d+)", out)
    if not m:
        return f"cannot read node's version from {out!r}"
    major, minor = int(m.group(1)), int(m.group(2))
    ok = minor >= NODE_SUPPORTED[major] if major in NODE_SUPPORTED else major > max(NODE_SUPPORTED)
    return None if ok else f"node {out} is too old for the pinned UI ({NODE_WANTED})"


def build_ui(cache: Path | None = None, *, force: bool = False) -> UiBuild:
    """Build the pinned tree's chat UI into the cache, unless it is there or cannot be built here.

    Returns:
        ``UiBuild``: ``cached`` (found, nothing run), ``built``, or ``skipped`` with the reason
        (no node or npm, a node too old, a tree without the UI's sources).

    Raises:
        UiBuildError: ``npm ci`` or ``npm run build`` failed (the message names the log).
        EngineBuildError: the pinned source could not be fetched.
    """
    cache = cache or eng.cache_dir()
    if not force and (d := built_ui(cache)):
        return UiBuild("cached", d)
    if problem := node_problem():
        return UiBuild("skipped", reason=problem)
    tree = eng.fetch_source(cache)
    src = tree / UI_SOURCE
    if not (src / LOCKFILE).is_file():
        return UiBuild("skipped", reason=f"the llama.cpp tree {tree} has no {UI_SOURCE / LOCKFILE}")
    root = ui_root(cache)
    with eng.locked(root / "build.lock", f"build of the chat UI in {root}") as waited:
        if waited and (d := built_ui(cache)):
            return UiBuild("cached", d, reason="built by the other process meanwhile")
        return _build(src, root)


def _build(src: Path, root: Path) -> UiBuild:
    t0 = time.monotonic()
    logfile = root / "build.log"
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        staged = work / "ui"
        shutil.copytree(src, staged, symlinks=True, ignore=shutil.ignore_patterns("node_modules", "dist", ".svelte-kit"))
        patches = _apply_ui_patches(staged)
        out = work / "dist"
        env = {**os.environ, "LLAMA_UI_OUT_DIR": str(out), "npm_config_update_notifier": "false",
               "npm_config_fund": "false", "npm_config_audit": "false"}
        with open(logfile, "w") as logf:
            for step in (["npm", "ci"], ["npm", "run", "build"]):
                log.info("chat UI: %s", " ".join(step))
                logf.write("$ " + " ".join(step) + "\n")
                logf.flush()
                rc = subprocess.run(step, cwd=staged, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL).returncode
                if rc != 0:
                    logf.close()
                    raise UiBuildError(f"chat UI: '{' '.join(step)}' failed (exit {rc}): {_last_error(logfile)}; "
                                       f"full log: {logfile}")
        missing = [f for f in REQUIRED if not (out / f).is_file()]
        if missing:
            raise UiBuildError(f"chat UI: 'npm run build' finished without {', '.join(missing)} in {out}; "
                               f"full log: {logfile}")
        dist = root / "dist"
        if dist.exists():  # --force: the old build goes away with the work directory
            dist.replace(work / "old-dist")
        out.replace(dist)
        seconds = round(time.monotonic() - t0, 1)
        record = {"commit": eng.PIN_COMMIT, "source": str(src), "seconds": seconds,
                  "patches": [p.name for p in patches],
                  "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
                  "files": sum(1 for p in dist.rglob("*") if p.is_file()),
                  "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (root / "ui.json").write_text(json.dumps(record, indent=2))
        return UiBuild("built", dist, seconds=seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # node_modules: about 700 MB


def _apply_ui_patches(staged: Path) -> list[Path]:
    """Apply ``ui_patch_files()`` to the staged copy of ``tools/ui``; returns them.

    Raises:
        UiBuildError: no ``patch`` or ``git`` to apply them with, or a patch that does not apply.
    """
    patches = ui_patch_files()
    if not patches:
        return []
    if shutil.which("patch"):
        tool = ["patch", "-p1", "--forward", "--batch", "-i"]
    elif shutil.which("git"):
        tool = ["git", "apply", "-p1"]
    else:
        raise UiBuildError("applying ggufdspark's chat UI patches needs 'patch' or 'git' on PATH")
    for p in patches:
        proc = subprocess.run([*tool, str(p)], cwd=staged, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
            raise UiBuildError(f"chat UI: patch {p} does not apply to {UI_SOURCE} of the pinned tree: {last[0]}")
        log.info("chat UI: applied %s", p.name)
    return patches


def _last_error(logfile: Path) -> str:
    """The most telling line of a failed npm step: its ``npm error`` line, else the last line."""
    lines = [ln.strip() for ln in logfile.read_text(errors="replace").splitlines() if ln.strip()]
    for pat in (r"^npm (ERR!|error) (code|network|\w+ )", r"^npm (ERR!|error)", r"error", r"Error"):
        hit = next((ln for ln in lines if re.search(pat, ln) and not ln.startswith("$ ")), None)
        if hit:
            return hit[:300]
    return (lines[-1] if lines else "no output")[:300]
