"""Build the pinned engine: CMake flags per backend, the cache key, applying the patch series,
configure and compile with progress, and the build record (``build.json``) that marks a finished
build, so that it is found again and never rebuilt."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ggufdspark.engine.probe import engine_problem
from ggufdspark.engine.source import (ENV_SOURCE, PIN_COMMIT, PIN_VERSION, cache_dir, fetch_source, locked,
                                      patch_digest, patch_files, sdist_path)
from ggufdspark.errors import EngineBuildError, EngineError

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]

BACKEND_FLAGS: dict[str, list[str]] = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "metal": ["-DGGML_METAL=ON"],
}

BASE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    f"-DLLAMA_BUILD_COMMIT={PIN_COMMIT}",
]

SERVER_TARGETS = ["llama-server"]
# ``build-engine --with-tools``: built into the same cached build, beside llama-server.
TOOL_TARGETS = ("llama-quantize", "llama-bench", "llama-batched-bench")
# Part of every cache key: bump it whenever BASE_FLAGS or BACKEND_FLAGS change, so that a build
# made with the old recipe is not reused (extra flags and patches are hashed into the key anyway).
RECIPE = ""


@dataclass
class BuildSpec:
    """What to build: backend plus any extra CMake flags."""

    backend: str = "cpu"
    extra_flags: list[str] = field(default_factory=list)
    patches: bool = True
    dev: bool = False  # also the developer series (ggufdspark/data/patches-dev): build-engine --dev

    def patch_files(self) -> list[Path]:
        """The patches this build applies (none with ``patches`` off)."""
        return patch_files(dev=self.dev) if self.patches else []

    def flags(self) -> list[str]:
        if self.backend not in BACKEND_FLAGS:
            raise EngineError(f"unknown backend {self.backend!r}; expected one of {sorted(BACKEND_FLAGS)}")
        return BASE_FLAGS + BACKEND_FLAGS[self.backend] + list(self.extra_flags)

    def key(self) -> str:
        """Cache key: commit, backend, and a digest of extra flags and patches when present."""
        extras = list(self.extra_flags)
        extras += [f"patch:{patch_digest(p)}" for p in self.patch_files()]  # what they change, in order
        if self.dev:
            extras.append("series:dev")
        key = f"{PIN_COMMIT}-{self.backend}{RECIPE}"
        if extras:
            key += "-" + hashlib.sha256("\n".join(extras).encode()).hexdigest()[:10]
        return key


def build_dir(spec: BuildSpec, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "engine" / spec.key()


def built_server(spec: BuildSpec, cache: Path | None = None) -> Path | None:
    """The cached ``llama-server`` for ``spec`` if its build finished, else None."""
    d = build_dir(spec, cache)
    exe = d / "build" / "bin" / "llama-server"
    if (d / "build.json").is_file() and exe.is_file():
        return exe
    return None


def _apply_patches(tree: Path, work: Path, patches: list[Path]) -> Path:
    """Copy the tree and apply ``patches`` in order; returns the patched tree (or ``tree``)."""
    if not patches:
        return tree
    patched = work / "src"
    if patched.exists():
        shutil.rmtree(patched)
    if shutil.which("patch"):
        tool = ["patch", "-p1", "--forward", "-i"]
    elif shutil.which("git"):
        tool = ["git", "apply", "-p1"]
    else:
        raise EngineBuildError("applying ggufdspark's engine patches needs 'patch' or 'git' on PATH "
                               "(Debian/Ubuntu: apt install patch; or build-engine --no-patches)")
    shutil.copytree(tree, patched, symlinks=True)
    dotgit = patched / ".git"  # the sdist's tree is a submodule checkout: a .git file pointing nowhere
    if dotgit.is_file() or dotgit.is_symlink():
        dotgit.unlink()
    for p in patches:
        proc = subprocess.run([*tool, str(p)], cwd=patched, capture_output=True, text=True)
        if proc.returncode != 0:
            raise EngineBuildError(f"patch {p.name} does not apply to the pinned tree: "
                                   f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    return patched


@dataclass
class BuildResult:
    """A finished engine build, as ``build_engine`` left it (``build-engine --json``)."""

    path: str  # the llama-server
    backend: str
    key: str  # the cache key: <cache>/engine/<key>
    build_dir: str
    patches: list[str]  # the patch series it was built with (from its build record)
    targets: list[str]  # what was compiled: llama-server, and the tools when asked for
    built: bool  # False: a finished build was reused as it was; True: something was compiled now

    @classmethod
    def of(cls, spec: BuildSpec, exe: Path, *, built: bool, cache: Path | None = None) -> "BuildResult":
        """The result for the finished build ``exe`` of ``spec``, read from its build record."""
        d = build_dir(spec, cache)
        try:
            record = json.loads((d / "build.json").read_text())
        except (OSError, json.JSONDecodeError):
            record = {}
        if not isinstance(record, dict):
            record = {}
        patches = record.get("patches", [p.name for p in spec.patch_files()])
        return cls(path=str(exe), backend=spec.backend, key=spec.key(), build_dir=str(d), patches=list(patches),
                   targets=list(record.get("targets", SERVER_TARGETS)), built=built)

    def to_dict(self) -> dict:
        return asdict(self)


def build_engine(spec: BuildSpec | None = None, *, cache: Path | None = None, jobs: int | None = None,
                 force: bool = False, progress: Progress | None = None,
                 extra_targets: tuple[str, ...] = ()) -> BuildResult:
    """Build ``llama-server`` and the shared libraries for ``spec``, reusing a finished build.

    Returns:
        ``BuildResult``: ``path`` is the ``llama-server``; ``built`` says whether anything was
        compiled (False: a finished build, made before or meanwhile by another process, was reused).

    Raises:
        EngineBuildError: fetching, configuring or compiling failed; the message names the log.
    """
    spec = spec or BuildSpec()
    cache = cache or cache_dir()

    def done() -> Path | None:
        exe = usable_build(spec, cache)
        return exe if exe and all((exe.parent / t).is_file() for t in extra_targets) else None

    def result(exe: Path, built: bool) -> BuildResult:
        return BuildResult.of(spec, exe, built=built, cache=cache)

    if not force and (exe := done()):
        log.info("engine already built: %s", exe)
        return result(exe, False)
    if not force and extra_targets and (exe := usable_build(spec, cache)):
        # the engine is built, only tools are missing: compile those into the same build
        with locked(build_dir(spec, cache) / "build.lock", f"build of the engine in {build_dir(spec, cache)}"):
            if finished := done():
                return result(finished, False)
            return result(_build_tools(spec, cache, exe, extra_targets, jobs=jobs, progress=progress), True)
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            raise EngineBuildError(f"'{tool}' not found on PATH: install CMake and a C/C++ compiler")
    d = build_dir(spec, cache)
    with locked(d / "build.lock", f"build of the engine in {d}") as waited:
        if waited and (exe := done()):
            log.info("the other build finished: %s", exe)
            return result(exe, False)
        return result(_build(spec, cache, d, jobs=jobs, progress=progress, extra_targets=extra_targets), True)


def _build(spec: BuildSpec, cache: Path, d: Path, *, jobs: int | None, progress: Progress | None,
           extra_targets: tuple[str, ...]) -> Path:
    tree = fetch_source(cache)
    (d / "build.json").unlink(missing_ok=True)
    src = _apply_patches(tree, d, spec.patch_files()) if spec.patches else tree  # --no-patches: the pinned tree as is
    logfile = d / "build.log"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    jobs = jobs or os.cpu_count() or 2
    configure = ["cmake", "-S", str(src), "-B", str(d / "build"), *gen, *spec.flags()]
    compile_ = ["cmake", "--build", str(d / "build"), "--target", *SERVER_TARGETS, *extra_targets, "-j", str(jobs)]
    t0 = time.monotonic()
    failed = None
    with open(logfile, "w") as logf:
        for step, cmd in (("configure", configure), ("compile", compile_)):
            rc = _run_logged(cmd, logf, progress)
            if rc != 0:
                failed = (step, rc)
                break
    if failed:  # read the log only now that it is closed: everything written is on disk
        raise EngineBuildError(f"engine {failed[0]} failed (exit {failed[1]}): {_first_error(logfile)}; "
                               f"full log: {logfile}")
    exe = d / "build" / "bin" / "llama-server"
    if not exe.is_file():
        raise EngineBuildError(f"build finished but {exe} is missing; full log: {logfile}")
    record = {"commit": PIN_COMMIT, "version": PIN_VERSION, "backend": spec.backend,
              "source": os.environ.get(ENV_SOURCE) or str(sdist_path(cache)),
              "source_verified": not os.environ.get(ENV_SOURCE), "targets": SERVER_TARGETS + list(extra_targets),
              "flags": spec.flags(), "patches": [p.name for p in spec.patch_files()],
              "seconds": round(time.monotonic() - t0, 1), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (d / "build.json").write_text(json.dumps(record, indent=2))
    return exe


def _run_logged(cmd: list[str], logf, progress: Progress | None) -> int:
    """Run a build command with its output into ``logf``; ninja's [i/n] (or make's [ p%]) lines
    drive ``progress``. Returns the exit status."""
    logf.write("$ " + " ".join(cmd) + "\n")
    logf.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        logf.write(line)
        m = re.match(r"\[(\d+)/(\d+)\]", line) or re.match(r"\[\s*(\d+)%\]", line)
        if progress and m:
            if m.lastindex == 2:
                progress(int(m.group(1)), int(m.group(2)), "compile")
            else:
                progress(int(m.group(1)), 100, "compile")
    return proc.wait()


def _build_tools(spec: BuildSpec, cache: Path, exe: Path, targets: tuple[str, ...], *, jobs: int | None,
                 progress: Progress | None) -> Path:
    """Compile the missing ``targets`` into a finished build (its tree is configured and patched
    already), without touching what is built; the build record then lists them."""
    d = build_dir(spec, cache)
    missing = [t for t in targets if not (exe.parent / t).is_file()]
    cmd = ["cmake", "--build", str(d / "build"), "--target", *missing, "-j", str(jobs or os.cpu_count() or 2)]
    logfile = d / "build-tools.log"
    with open(logfile, "w") as logf:
        rc = _run_logged(cmd, logf, progress)
    if rc != 0 or not all((exe.parent / t).is_file() for t in missing):
        raise EngineBuildError(f"building {', '.join(missing)} failed (exit {rc}): {_first_error(logfile)}; "
                               f"full log: {logfile}")
    record_path = d / "build.json"
    record = json.loads(record_path.read_text())
    record["targets"] = list(dict.fromkeys([*record.get("targets", SERVER_TARGETS), *missing]))
    tmp = record_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(record_path)
    return exe


# What names the cause of a failed build, most telling first: a compiler or linker diagnostic,
# a CMake error (its message is on the next line), then any line that says error.
_ERROR_PATTERNS = [
    r"(^|[\s:])(fatal )?error:",
    r"CMake Error",
    r"undefined reference|ld returned|linker command failed",
    r"\berror\b",
]


def _first_error(logfile: Path) -> str:
    """The first line of the build log that names the cause (skipping the ``$ cmake`` lines)."""
    lines = [ln for ln in logfile.read_text(errors="replace").splitlines() if not ln.startswith("$ ")]
    for pat in _ERROR_PATTERNS:
        for i, line in enumerate(lines):
            if re.search(pat, line, re.IGNORECASE):
                text = line.strip()
                if pat == "CMake Error":
                    text += " " + next((ln.strip() for ln in lines[i + 1:] if ln.strip()), "")
                return text[:300]
    return (lines[-1].strip() if lines else "no output")[:300]


def usable_build(spec: BuildSpec, cache: Path | None = None) -> Path | None:
    """The cached ``llama-server`` for ``spec`` if its build finished and it runs, else None."""
    exe = built_server(spec, cache)
    if exe is None:
        return None
    problem = engine_problem(exe)
    if problem:
        log.warning("the cached engine %s does not run (%s): it will be rebuilt", exe, problem)
        return None
    return exe
