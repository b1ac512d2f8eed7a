"""The pinned llama.cpp source: its facts (package, version, sha256, commit), the cache it lives
in, and fetching it (download, verify, extract). Also the small tools the other engine modules
share: the cache root, the patch series, a file's sha256 and an exclusive lock."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterator

from ggufdspark.errors import EngineBuildError

log = logging.getLogger(__name__)

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


def cache_dir() -> Path:
    """The toolkit's cache root: ``$GGUFDSPARK_CACHE`` or ``~/.cache/ggufdspark``."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ggufdspark"


def patches_dir() -> Path:
    """The patch series applied to the pinned tree at build time (may be empty)."""
    return Path(__file__).parent.parent / "data" / "patches"


def dev_patches_dir() -> Path:
    """The developer series (profiling, perf cases, kept experiments), applied after the product's
    by ``build-engine --dev``; a user's engine never has it."""
    return Path(__file__).parent.parent / "data" / "patches-dev"


def patch_files(dev: bool = False) -> list[Path]:
    """The series a build applies, in order: the product's, then with ``dev`` the developer's."""
    dirs = [patches_dir()] + ([dev_patches_dir()] if dev else [])
    return [p for d in dirs if d.is_dir() for p in sorted(d.glob("*.patch"))]


def sha256_file(path: str | Path) -> str:
    """sha256 of a file, read in 4 MB chunks (multi-GB models stay out of memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def patch_digest(path: str | Path) -> str:
    """sha256 of what a patch changes: its diffs (from the first ``diff --git`` line on), without the
    message above them or the version trailer below, so that editing a patch's description (its
    header, its ``Upstream:`` line) or renaming it does not invalidate a cached build."""
    lines = Path(path).read_bytes().splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith(b"diff --git ")), len(lines))
    body = lines[start:]
    if len(body) >= 2 and body[-2].rstrip(b"\n") == b"-- ":  # git format-patch's "-- \n<version>" trailer
        body = body[:-2]
    return hashlib.sha256(b"".join(body)).hexdigest()


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
