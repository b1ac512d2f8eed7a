"""Typed ctypes declarations for ggml's backend device registry (``ggml-backend.h``).

Only what the toolkit needs to list devices: load the dynamic backends, count and fetch devices,
and read each one's name, description, type and memory. The C prototype of each function is in
the comment above its declaration; they match the pinned engine (llama.cpp 0c1e570), and have
been stable across llama.cpp releases since the device registry appeared.
"""

from __future__ import annotations

import ctypes
import logging
import os
from enum import IntEnum
from pathlib import Path

from ggufdspark.bindings._loader import BindingsLoadError, load_ggml

log = logging.getLogger(__name__)
# Where ggml's own messages go once ``GgmlBackend.route_logs`` ran (default: ggml's stderr).
ggml_log = logging.getLogger("ggufdspark.ggml")

# typedef struct ggml_backend_device * ggml_backend_dev_t;
ggml_backend_dev_t = ctypes.c_void_p

# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
ggml_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

# enum ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the
# previous message). ggml's INFO is start-up chatter ("ggml_cuda_init: found 1 CUDA devices"):
# it goes to DEBUG so a CLI at INFO stays quiet.
GGML_LOG_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING,
                   4: logging.ERROR}
_last_level = [logging.DEBUG]


@ggml_log_callback
def _route_log(level: int, text: bytes | None, user_data) -> None:
    """ggml log callback: one Python log record per non-empty chunk of text."""
    lvl = _last_level[0] if level == 5 else GGML_LOG_LEVELS.get(level, logging.DEBUG)
    _last_level[0] = lvl
    msg = text.decode("utf-8", errors="replace").rstrip() if text else ""
    if msg:
        ggml_log.log(lvl, "%s", msg)


class DevType(IntEnum):
    """``enum ggml_backend_dev_type`` (values in declaration order, from 0)."""

    CPU = 0    # CPU device using system memory
    GPU = 1    # GPU device using dedicated memory
    IGPU = 2   # integrated GPU using host memory
    ACCEL = 3  # accelerator used together with the CPU backend (BLAS, AMX)
    META = 4   # wrapper over several devices (tensor parallelism)


def _declare(lib: ctypes.CDLL, name: str, argtypes: list, restype, *, optional: bool = False):
    """Set the signature of ``lib.name``; None when ``optional`` and the symbol is absent.

    Raises:
        BindingsLoadError: a required symbol is missing (a ggml too old or not ggml at all).
    """
    try:
        fn = getattr(lib, name)
    except AttributeError:
        if optional:
            return None
        raise BindingsLoadError(f"{lib._name}: symbol {name} not found") from None
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


class GgmlBackend:
    """The device-registry functions of one loaded ``libggml``.

    Args:
        lib: a handle from ``_loader.load_ggml``.
    """

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        # void ggml_log_set(ggml_log_callback log_callback, void * user_data);
        self._log_set = _declare(lib, "ggml_log_set", [ggml_log_callback, ctypes.c_void_p], None,
                                 optional=True)
        # void ggml_backend_load_all(void);
        self._load_all = _declare(lib, "ggml_backend_load_all", [], None, optional=True)
        # void ggml_backend_load_all_from_path(const char * dir_path);
        self._load_all_from_path = _declare(
            lib, "ggml_backend_load_all_from_path", [ctypes.c_char_p], None, optional=True)
        # size_t ggml_backend_dev_count(void);
        self._dev_count = _declare(lib, "ggml_backend_dev_count", [], ctypes.c_size_t)
        # ggml_backend_dev_t ggml_backend_dev_get(size_t index);
        self._dev_get = _declare(lib, "ggml_backend_dev_get", [ctypes.c_size_t], ggml_backend_dev_t)
        # const char * ggml_backend_dev_name(ggml_backend_dev_t device);
        self._dev_name = _declare(lib, "ggml_backend_dev_name", [ggml_backend_dev_t], ctypes.c_char_p)
        # const char * ggml_backend_dev_description(ggml_backend_dev_t device);
        self._dev_description = _declare(
            lib, "ggml_backend_dev_description", [ggml_backend_dev_t], ctypes.c_char_p)
        # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
        self._dev_type = _declare(lib, "ggml_backend_dev_type", [ggml_backend_dev_t], ctypes.c_int)
        # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
        self._dev_memory = _declare(
            lib, "ggml_backend_dev_memory",
            [ggml_backend_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None)

    @classmethod
    def load(cls, lib_dir: str | os.PathLike | None = None) -> "GgmlBackend":
        """Load ``libggml`` from ``lib_dir`` (or ``$LLAMA_CPP_LIB_PATH``) and declare its functions.

        Raises:
            BindingsLoadError: the libraries are missing, unloadable or lack the registry.
        """
        return cls(load_ggml(lib_dir))

    def route_logs(self) -> bool:
        """Send ggml's log messages to the ``ggufdspark.ggml`` logger instead of stderr.

        Process-wide; loading llama-cpp-python later installs its own callback instead.
        Returns False when this ggml has no ``ggml_log_set``.
        """
        if self._log_set is None:
            return False
        self._log_set(_route_log, None)
        return True

    def load_all(self, lib_dir: str | os.PathLike | None = None) -> bool:
        """Register dynamically loadable backends (``GGML_BACKEND_DL`` builds).

        Searches ``lib_dir`` when the library can, else the default places (the executable's
        directory and the current directory). Backends linked into ``libggml`` are registered
        without it. Returns False when this ggml has neither entry point.
        """
        if self._load_all_from_path is not None and lib_dir is not None:
            self._load_all_from_path(os.fsencode(Path(lib_dir)))
            return True
        if self._load_all is not None:
            self._load_all()
            return True
        return False

    def dev_count(self) -> int:
        return int(self._dev_count())

    def dev_get(self, index: int) -> int:
        """Opaque device handle (an address) of device ``index``; valid for the process."""
        dev = self._dev_get(index)
        if not dev:
            raise BindingsLoadError(f"ggml_backend_dev_get({index}) returned NULL")
        return dev

    def dev_name(self, dev: int) -> str:
        return _text(self._dev_name(dev))

    def dev_description(self, dev: int) -> str:
        return _text(self._dev_description(dev))

    def dev_type(self, dev: int) -> int:
        """Raw ``enum ggml_backend_dev_type`` value (see ``DevType``)."""
        return int(self._dev_type(dev))

    def dev_memory(self, dev: int) -> tuple[int, int]:
        """``(free, total)`` bytes as the backend reports them."""
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self._dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        return int(free.value), int(total.value)


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", errors="replace") if raw else ""
