"""llama-cpp-python's ``llama_cpp`` module, pointed at an engine's own ``libllama``.

``llama-cpp-python==0.3.36`` installed without compiling (``CMAKE_ARGS="-DLLAMA_BUILD=OFF
-DLLAVA_BUILD=OFF"``) ships no library; it loads ``libllama`` from ``$LLAMA_CPP_LIB_PATH`` when
the module is first imported. Pointing that at the engine's ``build/bin`` makes the Python
bindings and ``llama-server`` run the same build, so the ctypes signatures match the library.

The library is read once per process: after the first import, ``llama_cpp`` stays bound to the
``libllama`` it loaded, and ``load_llama_cpp`` reports a different directory as a mismatch
instead of pretending.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from ggufdspark.bindings._loader import (
    ENV_LIB_PATH,
    BindingsLoadError,
    library_path,
    load_chain,
    resolve_lib_dir,
)

log = logging.getLogger(__name__)

MODULE = "llama_cpp"
# llama-cpp-python reads the multimodal library's directory from this one.
ENV_MTMD_PATH = "MTMD_CPP_LIB"


@dataclass
class LlamaCppStatus:
    """Whether llama-cpp-python is usable against one engine build.

    ``importable``: the package is installed. ``loaded``: its ``libllama`` is the one in
    ``lib_dir``. ``lib_path``: the library it actually loaded. ``error``: why not, when not.
    """

    importable: bool = False
    loaded: bool = False
    version: str | None = None
    lib_dir: str | None = None
    lib_path: str | None = None
    gpu_offload: bool | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def installed_version() -> str | None:
    """Version of the installed llama-cpp-python distribution (no import), or None."""
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def _loaded_lib_path(module: ModuleType) -> str | None:
    lib = getattr(getattr(module, "llama_cpp", None), "_lib", None)
    return getattr(lib, "_name", None)


def _same_dir(lib_path: str | None, lib_dir: Path) -> bool:
    return bool(lib_path) and os.path.realpath(Path(lib_path).parent) == os.path.realpath(lib_dir)


def _import(lib_dir: Path) -> ModuleType:
    """Import ``llama_cpp`` with the environment pointing at ``lib_dir`` (first import only)."""
    if MODULE not in sys.modules:
        previous = os.environ.get(ENV_LIB_PATH)
        if previous and os.path.realpath(previous) != os.path.realpath(lib_dir):
            log.debug("%s=%s overridden by %s", ENV_LIB_PATH, previous, lib_dir)
        os.environ[ENV_LIB_PATH] = str(lib_dir)
        os.environ.setdefault(ENV_MTMD_PATH, str(lib_dir))
        # Our loader first: libggml-base/libggml by full path, globally, before libllama wants them.
        load_chain(("ggml-base", "ggml"), lib_dir)
    return importlib.import_module(MODULE)


def load_llama_cpp(lib_dir: str | os.PathLike | None = None) -> tuple[ModuleType | None, LlamaCppStatus]:
    """Import ``llama_cpp`` bound to ``lib_dir``'s ``libllama`` (default ``$LLAMA_CPP_LIB_PATH``).

    Never raises: what went wrong is in the returned status.

    Returns:
        ``(module, status)``; ``module`` is None unless ``status.loaded``.
    """
    status = LlamaCppStatus(version=installed_version())
    status.importable = status.version is not None
    if not status.importable:
        status.error = "llama-cpp-python is not installed (pip install 'ggufdspark[bindings]')"
        return None, status
    try:
        d = resolve_lib_dir(lib_dir)
        status.lib_dir = str(d)
        library_path("llama", d)
        module = _import(d)
    except (BindingsLoadError, OSError, RuntimeError, ImportError) as e:
        status.error = f"llama_cpp did not load: {e}"
        return None, status
    status.version = getattr(module, "__version__", status.version)
    status.lib_path = _loaded_lib_path(module)
    if not _same_dir(status.lib_path, d):
        status.error = f"llama_cpp in this process already loaded {status.lib_path}, not the library in {d}"
        return None, status
    status.loaded = True
    status.gpu_offload = bool(module.llama_supports_gpu_offload())
    return module, status


def llama_backend_init(lib_dir: str | os.PathLike | None = None) -> ModuleType:
    """Load ``llama_cpp`` against ``lib_dir`` and call ``llama_backend_init()`` (idempotent).

    Returns:
        The ``llama_cpp`` module, ready for model loading.

    Raises:
        BindingsLoadError: the bindings could not be loaded against this build.
    """
    module, status = load_llama_cpp(lib_dir)
    if module is None:
        raise BindingsLoadError(status.error or "llama_cpp did not load")
    module.llama_backend_init()
    return module
