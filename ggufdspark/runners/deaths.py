"""Why a llama-server process failed, in words: the reason of a failed start (``explain_failure``),
how a process ended (``exit_cause``), and the engine's own last error line (``engine_error_line``)."""

from __future__ import annotations

import re
import signal


# Log lines that explain a failed start, most specific first.
_FAILURE_PATTERNS = [
    (r"couldn't bind|address already in use|bind\(\) failed", "port already in use"),
    (r"failed to load draft model", "the draft model failed to load"),
    (r"failed to create.*speculative|speculative.*fail|draft.*(mismatch|incompatible)", "the speculative (draft) context failed"),
    (r"unknown model architecture: '([^']+)'", "unknown model architecture"),
    # -hf / -hfd: the download fails first and the load failure that follows says nothing useful
    (r"HTTPS is not supported", "the Hub download failed: this engine was built without TLS "
                                "(download the files and pass -m/-md, or build llama.cpp with OpenSSL)"),
    (r"failed to (download|resolve commit|fetch)|could not resolve host|download failed",
     "the Hub download failed"),
    (r"failed to load model|error loading model", "the model failed to load"),
    (r"invalid argument|unknown argument|error: (.+)", "bad arguments"),
]


def exit_cause(code: int | None) -> str:
    """How a process ended, for a message: ``exited with code 1``, or ``was killed by SIGSEGV
    (signal 11)`` for a negative ``Popen.returncode`` (the engine crashed, or something killed it)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by {name} (signal {-code})"
    return f"exited with code {code}"


# The engine's own words for why it died, last match wins: ggml's CUDA_CHECK, GGML_ASSERT and
# GGML_ABORT lines, a C++ exception's terminate, what a shell prints for a fatal signal. Nothing
# broader: a start logs benign "failed to ..." lines that would name the wrong cause.
_DEATH_LINE = re.compile(r"CUDA error: .+|GGML_ASSERT\(.+|GGML_ABORT.*|terminate called .+|"
                         r"Segmentation fault.*|Aborted.*|Illegal instruction.*")


def engine_error_line(log_text: str) -> str | None:
    """The last line of ``log_text`` (one run's log) that says why the engine died, without its
    timestamp (``CUDA error: an illegal instruction was encountered``), or None."""
    found = None
    for ln in log_text.splitlines():
        m = _DEATH_LINE.search(ln)
        if m:
            found = m.group(0).strip()[:200]
    return found


# The model loader's own reason (src/llama.cpp, llama_model_load: "error loading model: check_tensor_dims:
# tensor 'blk.0.attn_k.weight' has wrong shape; ..."); the lines after it only repeat "failed to load
# (draft) model", so a failed load is explained by the first of these.
_LOAD_ERROR = re.compile(r"error loading model: (.+)")
_LOAD_FAILURES = ("the draft model failed to load", "the speculative (draft) context failed",
                  "the model failed to load")


def explain_failure(log_text: str) -> str:
    """Why a start failed, in words, and the log line that says it: for a model that failed to load,
    the loader's first error (the wrong tensor shape, the unknown key), not the lines that follow it."""
    for pat, why in _FAILURE_PATTERNS:
        m = re.search(pat, log_text, re.IGNORECASE)
        if m:
            line = next((ln for ln in log_text.splitlines() if re.search(pat, ln, re.IGNORECASE)), "")
            load = _LOAD_ERROR.search(log_text) if why in _LOAD_FAILURES else None
            if load:
                return f"{why}: {' '.join(load.group(1).split())[:200]}"
            return f"{why}: {line.strip()[:200]}"
    return "see the log"
