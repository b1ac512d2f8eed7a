"""Find and load an engine's shared libraries (bottom layer of the bindings).

A shared-library build of llama.cpp puts ``libggml-base``, ``libggml``, the backend libraries
(``libggml-cpu``, ``libggml-cuda``, ...) and ``libllama`` next to ``llama-server`` in
``build/bin``. The libraries are loaded dependencies first and with ``RTLD_GLOBAL``, so that a
library loaded later (ours or llama-cpp-python's) resolves its ``NEEDED`` entries to the same
copies instead of whatever the system loader would find on its own.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from pathlib import Path

from ggufdspark.errors import EngineError

log = logging.getLogger(__name__)

# llama-cpp-python reads this at import time; we honour it too when no lib dir is given.
ENV_LIB_PATH = "LLAMA_CPP_LIB_PATH"

# Load order: each library after the ones it links against.
GGML_LIBS = ("ggml-base", "ggml")
LLAMA_LIBS = (*GGML_LIBS, "llama")

# One CDLL per file: ctypes keeps argtypes/restype on the CDLL object, and dlopen is refcounted.
_handles: dict[str, ctypes.CDLL] = {}


class BindingsLoadError(EngineError, OSError):
    """A shared library of the engine is missing or cannot be loaded."""


def lib_filename(base: str) -> str:
    """File name of library ``base`` (``"ggml"`` -> ``libggml.so`` on Linux)."""
    if sys.platform == "win32":
        return f"{base}.dll"
    if sys.platform == "darwin":
        return f"lib{base}.dylib"
    return f"lib{base}.so"


def resolve_lib_dir(lib_dir: str | os.PathLike | None = None) -> Path:
    """The directory to load from: ``lib_dir``, else ``$LLAMA_CPP_LIB_PATH``.

    Raises:
        BindingsLoadError: neither is given, or the directory does not exist.
    """
    chosen = lib_dir or os.environ.get(ENV_LIB_PATH)
    if not chosen:
        raise BindingsLoadError(f"no library directory given and ${ENV_LIB_PATH} is not set")
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise BindingsLoadError(f"{path}: library directory not found")
    return path


def library_path(base: str, lib_dir: Path) -> Path:
    """Path of library ``base`` in ``lib_dir``; on macOS either ``.dylib`` or ``.so``.

    Raises:
        BindingsLoadError: the file is not there.
    """
    names = [lib_filename(base)]
    if sys.platform == "darwin":
        names.append(f"lib{base}.so")
    for name in names:
        if (lib_dir / name).is_file():
            return lib_dir / name
    raise BindingsLoadError(f"{lib_dir}: {names[0]} not found (is this a shared-library build?)")


def load_library(base: str, lib_dir: Path) -> ctypes.CDLL:
    """Load one library of ``lib_dir`` with ``RTLD_GLOBAL`` (cached per file).

    Raises:
        BindingsLoadError: missing file, or the dynamic loader refused it.
    """
    path = library_path(base, lib_dir)
    key = os.path.realpath(path)
    if key in _handles:
        return _handles[key]
    try:
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise BindingsLoadError(f"{path}: cannot load: {e}") from None
    log.debug("loaded %s", path)
    _handles[key] = handle
    return handle


def load_chain(bases: tuple[str, ...], lib_dir: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load ``bases`` in order from the resolved lib dir; returns the last one's handle.

    Raises:
        BindingsLoadError: see ``resolve_lib_dir`` and ``load_library``.
    """
    d = resolve_lib_dir(lib_dir)
    handle = None
    for base in bases:
        handle = load_library(base, d)
    assert handle is not None
    return handle


def load_ggml(lib_dir: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load ``libggml-base`` then ``libggml``; returns the ``libggml`` handle.

    ``libggml`` holds the backend registry and links ``libggml-base`` (device accessors), so
    symbols of both resolve through this one handle.
    """
    return load_chain(GGML_LIBS, lib_dir)
