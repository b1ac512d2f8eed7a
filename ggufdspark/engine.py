"""The pinned llama.cpp engine: fetch, verify, build, cache, find, probe.

The engine is the llama.cpp tree vendored in the ``llama-cpp-python==0.3.36`` source
distribution (llama.cpp commit 0c1e570), fetched from the package index by pinned version and
checked against its sha256. Builds land in ``<cache>/engine/<key>/build`` where the key names
the commit, the backend and a digest of any extra CMake flags and patches, so a finished build
is found again by a fresh clone and never rebuilt.

Lookup order for an engine (``find_engine``): an explicit path, ``$GGUFDSPARK_SERVER``, the
cached build, then ``llama-server`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from ggufdspark.errors import EngineBuildError, EngineError
from ggufdspark.runners import lifeline

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]

# Facts about the pinned engine (see ../shared/DESIGN.md).
PIN_PACKAGE = "llama-cpp-python"
PIN_VERSION = "0.3.36"
PIN_SDIST = "llama_cpp_python-0.3.36.tar.gz"
PIN_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PIN_COMMIT = "0c1e570"

ENV_SERVER = "GGUFDSPARK_SERVER"
ENV_CACHE = "GGUFDSPARK_CACHE"
# An already-extracted copy of the pinned llama.cpp tree, for machines without the package index
# (e.g. an offline GPU box). It is not sha256-checked: the build record says so.
ENV_SOURCE = "GGUFDSPARK_LLAMA_SRC"

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
# Seconds an engine gets to answer --version / --help; a hung one is killed with all it started.
PROBE_TIMEOUT = 60.0
# Part of every cache key: bump it whenever BASE_FLAGS or BACKEND_FLAGS change, so that a build
# made with the old recipe is not reused (extra flags and patches are hashed into the key anyway).
RECIPE = ""


def cache_dir() -> Path:
    """The toolkit's cache root: ``$GGUFDSPARK_CACHE`` or ``~/.cache/ggufdspark``."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ggufdspark"


def patches_dir() -> Path:
    """The patch series applied to the pinned tree at build time (may be empty)."""
    return Path(__file__).parent / "data" / "patches"


def patch_files() -> list[Path]:
    d = patches_dir()
    return sorted(d.glob("*.patch")) if d.is_dir() else []


def sha256_file(path: str | Path) -> str:
    """sha256 of a file, read in 4 MB chunks (multi-GB models stay out of memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def locked(path: Path, what: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block.

    When another process holds it, says so (naming ``what`` and that process) and waits.
    Yields whether it had to wait (the other process may have done the work meanwhile).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            log.warning("waiting for another %s (pid %s) to finish ...", what, holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
            waited = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield waited
    finally:
        os.close(fd)  # releases the lock


# --------------------------------------------------------------------------- source


def source_root(cache: Path | None = None) -> Path:
    """Where the extracted sdist lives (the llama.cpp tree is ``vendor/llama.cpp`` below it)."""
    return (cache or cache_dir()) / "src" / PIN_SDIST.removesuffix(".tar.gz")


def llama_cpp_tree(cache: Path | None = None) -> Path:
    return source_root(cache) / "vendor" / "llama.cpp"


def sdist_path(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "src" / PIN_SDIST


def fetch_source(cache: Path | None = None) -> Path:
    """Download (if needed), verify and extract the pinned sdist. Returns the llama.cpp tree.

    Raises:
        EngineBuildError: the download failed or the archive's sha256 is not the pinned one.
    """
    cache = cache or cache_dir()
    if os.environ.get(ENV_SOURCE):
        return _fetch_source(cache)
    with locked(cache / "src" / "fetch.lock", f"download of {PIN_SDIST}"):
        return _fetch_source(cache)


def _fetch_source(cache: Path) -> Path:
    if env := os.environ.get(ENV_SOURCE):
        tree = Path(env)
        if not (tree / "CMakeLists.txt").is_file():
            raise EngineBuildError(f"{tree}: ${ENV_SOURCE} is not a llama.cpp source tree (no CMakeLists.txt)")
        log.warning("using the unverified llama.cpp tree in $%s: %s", ENV_SOURCE, tree)
        return tree
    tree = llama_cpp_tree(cache)
    tarball = sdist_path(cache)
    if tree.is_dir() and (tree / "CMakeLists.txt").is_file() and tarball.is_file():
        return tree
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if not tarball.is_file():
        log.info("downloading %s==%s (source distribution, 76 MB)", PIN_PACKAGE, PIN_VERSION)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"{PIN_PACKAGE}=={PIN_VERSION}", "-d", str(tarball.parent)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not tarball.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise EngineBuildError(f"could not download {PIN_PACKAGE}=={PIN_VERSION}: {tail[0]}")
    digest = sha256_file(tarball)
    if digest != PIN_SHA256:
        bad = tarball.with_suffix(".bad")
        tarball.replace(bad)
        raise EngineBuildError(
            f"{tarball}: sha256 {digest} is not the pinned {PIN_SHA256} (moved aside to {bad})")
    log.info("extracting %s", tarball.name)
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        with tarfile.open(tarball) as tf:
            tf.extractall(tmp, filter="data")
        extracted = Path(tmp) / source_root(cache).name
        if source_root(cache).exists():
            shutil.rmtree(source_root(cache))
        extracted.replace(source_root(cache))
    return tree


# --------------------------------------------------------------------------- build


@dataclass
class BuildSpec:
    """What to build: backend plus any extra CMake flags."""

    backend: str = "cpu"
    extra_flags: list[str] = field(default_factory=list)
    patches: bool = True

    def flags(self) -> list[str]:
        if self.backend not in BACKEND_FLAGS:
            raise EngineError(f"unknown backend {self.backend!r}; expected one of {sorted(BACKEND_FLAGS)}")
        return BASE_FLAGS + BACKEND_FLAGS[self.backend] + list(self.extra_flags)

    def key(self) -> str:
        """Cache key: commit, backend, and a digest of extra flags and patches when present."""
        extras = list(self.extra_flags)
        if self.patches:
            extras += [f"patch:{p.name}:{sha256_file(p)}" for p in patch_files()]
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


def _apply_patches(tree: Path, work: Path) -> Path:
    """Copy the tree and apply the patch series; returns the patched tree (or ``tree``)."""
    patches = patch_files()
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


def build_engine(spec: BuildSpec | None = None, *, cache: Path | None = None, jobs: int | None = None,
                 force: bool = False, progress: Progress | None = None,
                 extra_targets: tuple[str, ...] = ()) -> Path:
    """Build ``llama-server`` and the shared libraries for ``spec``, reusing a finished build.

    Returns:
        Path of the built ``llama-server``.

    Raises:
        EngineBuildError: fetching, configuring or compiling failed; the message names the log.
    """
    spec = spec or BuildSpec()
    cache = cache or cache_dir()

    def done() -> Path | None:
        exe = usable_build(spec, cache)
        return exe if exe and all((exe.parent / t).is_file() for t in extra_targets) else None

    if not force and (exe := done()):
        log.info("engine already built: %s", exe)
        return exe
    if not force and extra_targets and (exe := usable_build(spec, cache)):
        # the engine is built, only tools are missing: compile those into the same build
        with locked(build_dir(spec, cache) / "build.lock", f"build of the engine in {build_dir(spec, cache)}"):
            return done() or _build_tools(spec, cache, exe, extra_targets, jobs=jobs, progress=progress)
    for tool in ("cmake", "c++"):
        if not shutil.which(tool):
            raise EngineBuildError(f"'{tool}' not found on PATH: install CMake and a C/C++ compiler")
    d = build_dir(spec, cache)
    with locked(d / "build.lock", f"build of the engine in {d}") as waited:
        if waited and (exe := done()):
            log.info("the other build finished: %s", exe)
            return exe
        return _build(spec, cache, d, jobs=jobs, progress=progress, extra_targets=extra_targets)


def _build(spec: BuildSpec, cache: Path, d: Path, *, jobs: int | None, progress: Progress | None,
           extra_targets: tuple[str, ...]) -> Path:
    tree = fetch_source(cache)
    (d / "build.json").unlink(missing_ok=True)
    src = _apply_patches(tree, d) if spec.patches else tree  # --no-patches: the pinned tree as is
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
              "flags": spec.flags(), "patches": [p.name for p in patch_files()] if spec.patches else [],
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


def engine_problem(exe: Path) -> str | None:
    """Why ``exe`` does not run (``--version`` fails or hangs), or None when it does."""
    try:
        r = lifeline.run([str(exe), "--version"], timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"'--version' did not answer within {PROBE_TIMEOUT:g} s"
    except OSError as e:
        return e.strerror or str(e)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"'--version' exited with code {r.returncode}: {last[0][:200]}"
    return None


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


# --------------------------------------------------------------------------- find + probe


@dataclass
class EngineInfo:
    """What we learned about one ``llama-server`` executable."""

    path: str
    source: str  # "explicit", "env", "cache", "path"
    version: str | None = None
    commit: str | None = None
    dspark: bool = False
    spec_types: list[str] = field(default_factory=list)
    lib_dir: str | None = None
    backend: str | None = None  # from the cache record when known
    patches: list[str] = field(default_factory=list)  # the patch series it was built with (cache record)

    def to_dict(self) -> dict:
        return asdict(self)


def _cached_candidates(cache: Path) -> list[Path]:
    """Finished builds of the pinned commit, GPU backends first (a user who built one wants it)."""
    order = {"cuda": 0, "metal": 1, "cpu": 2}
    found = []
    for backend in order:
        exe = built_server(BuildSpec(backend=backend), cache)
        if exe:
            found.append(exe)
    root = cache / "engine"
    if root.is_dir():
        for d in sorted(root.iterdir()):
            exe = d / "build" / "bin" / "llama-server"
            if (d / "build.json").is_file() and exe.is_file() and exe not in found:
                found.append(exe)
    return found


def find_engine(server: str | os.PathLike | None = None, *, cache: Path | None = None) -> EngineInfo:
    """Locate and probe an engine. See the module docstring for the lookup order.

    Raises:
        EngineError: nothing found, or the path given does not exist / is not executable.
    """
    cache = cache or cache_dir()
    if server:
        return probe_engine(Path(server), "explicit")
    if env := os.environ.get(ENV_SERVER):
        return probe_engine(Path(env), "env")
    cands = _cached_candidates(cache)
    if cands:
        return probe_engine(cands[0], "cache")
    if which := shutil.which("llama-server"):
        return probe_engine(Path(which), "path")
    raise EngineError("no llama-server found: run 'ggufdspark build-engine' (or pass --server PATH, "
                      f"or set {ENV_SERVER})")


def probe_engine(path: Path, source: str) -> EngineInfo:
    """Read ``--version`` and ``--help`` of ``path``."""
    if not path.exists():
        raise EngineError(f"{path}: llama-server not found (source: {source})")
    if not os.access(path, os.X_OK) or path.is_dir():
        raise EngineError(f"{path}: not an executable file (source: {source})")
    info = EngineInfo(path=str(path), source=source)
    try:
        ver = lifeline.run([str(path), "--version"], timeout=PROBE_TIMEOUT)
        hlp = lifeline.run([str(path), "--help"], timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise EngineError(f"{path}: cannot run it: '{e.cmd[-1]}' did not answer within {PROBE_TIMEOUT:g} s "
                          f"(stopped, with everything it started)") from None
    except OSError as e:
        raise EngineError(f"{path}: cannot run it: {e}") from None
    m = re.search(r"version:\s*(\S+)\s*\((?:build\s+\S+,\s*commit\s+)?(\w+)\)", ver.stdout + ver.stderr)
    if m:
        info.version, info.commit = m.group(1), m.group(2)
    text = hlp.stdout + hlp.stderr
    m = re.search(r"--spec-type\s+\[?([^\n]+)", text)
    if m:
        info.spec_types = re.findall(r"[a-z][a-z0-9-]+", m.group(1).split("]")[0].split("  ")[0])
    info.dspark = "draft-dspark" in text
    info.lib_dir = str(path.parent)
    record = path.parent.parent.parent / "build.json"
    if record.is_file():
        try:
            rec = json.loads(record.read_text())
            info.backend = rec.get("backend")
            info.patches = [str(p) for p in rec.get("patches") or []]
        except (json.JSONDecodeError, AttributeError):
            pass
    return info


def require_dspark(info: EngineInfo) -> EngineInfo:
    """Refuse an engine that cannot run DSpark drafts.

    Raises:
        EngineError: ``--spec-type draft-dspark`` is not in the engine's help.
    """
    if not info.dspark:
        raise EngineError(
            f"{info.path}: this llama-server (version {info.version or '?'}, commit {info.commit or '?'}) "
            f"has no '--spec-type draft-dspark'; build the pinned engine with 'ggufdspark build-engine' "
            f"or point --server/{ENV_SERVER} at a build of llama.cpp {PIN_COMMIT} or newer")
    return info
