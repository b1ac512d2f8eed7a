"""The pinned llama.cpp engine: fetch, verify, build, cache, find, probe.

The engine is the llama.cpp tree vendored in the ``llama-cpp-python==0.3.36`` source
distribution (llama.cpp commit 0c1e570), fetched from the package index by pinned version and
checked against its sha256. Builds land in ``<cache>/engine/<key>/build`` where the key names
the commit, the backend and a digest of any extra CMake flags and patches, so a finished build
is found again by a fresh clone and never rebuilt.

Lookup order for an engine (``find_engine``): an explicit path, ``$GGUFDSPARK_SERVER``, the
cached build, then ``llama-server`` on ``PATH``.

The package's modules, one concern each: ``source`` (pins, cache, fetching), ``build``
(flags, cache key, patches, compiling), ``probe`` (what an executable is), ``find`` (the
lookup above) and ``switches`` (the environment variables the patch series reads, checked against
docs/engine-patches.md). Every public name but ``switches``' is importable from ``ggufdspark.engine``
itself.
"""

from ggufdspark.engine.build import (BACKEND_FLAGS, BASE_FLAGS, RECIPE, SERVER_TARGETS, TOOL_TARGETS, BuildResult,
                                     BuildSpec, Progress, build_dir, build_engine, built_server, usable_build)
from ggufdspark.engine.find import find_engine
from ggufdspark.engine.probe import PROBE_TIMEOUT, EngineInfo, engine_problem, probe_engine, require_dspark
from ggufdspark.engine.source import (ENV_CACHE, ENV_SERVER, ENV_SOURCE, PIN_COMMIT, PIN_PACKAGE, PIN_SDIST, PIN_SHA256,
                                      PIN_VERSION, cache_dir, fetch_source, llama_cpp_tree, locked, patch_files,
                                      patches_dir, dev_patches_dir, sdist_path, sha256_file, source_root)

__all__ = [
    "BACKEND_FLAGS", "BASE_FLAGS", "RECIPE", "SERVER_TARGETS", "TOOL_TARGETS", "BuildResult", "BuildSpec", "Progress", "build_dir",
    "build_engine", "built_server", "usable_build", "find_engine", "PROBE_TIMEOUT", "EngineInfo", "engine_problem",
    "probe_engine", "require_dspark", "ENV_CACHE", "ENV_SERVER", "ENV_SOURCE", "PIN_COMMIT", "PIN_PACKAGE",
    "PIN_SDIST", "PIN_SHA256", "PIN_VERSION", "cache_dir", "fetch_source", "llama_cpp_tree", "locked",
    "dev_patches_dir", "patch_files", "patches_dir", "sdist_path", "sha256_file", "source_root",
]
