"""Domain exceptions.

The library raises these; the CLI (``ggufdspark.cli``) turns every one of them into a single
line on stderr and a non-zero exit code. Each also subclasses the built-in it resembles, so
scripts can catch ``FileNotFoundError`` or ``ValueError`` without importing this module.
Messages name the file and the value found (and expected, where there is one).

Exit codes (``exit_code``): 1 by default; 2 a usage error (click's own code, also for arguments
and outputs refused before any work); 3 the lossless gate failed; 4 an input file missing or
unreadable, or a Hub reference naming nothing there (``HubNotFoundError``); 5 a bench whose two
plain runs disagreed too much to give a speedup (the machine's speed moved during the run:
``PlainDriftError``); 130 interrupted; 143 / 129 stopped by SIGTERM / SIGHUP while writing
(``ggufdspark.interrupts``); 141 the reader of the output went away (a broken pipe).

Usage errors (exit 2) are decided here and nowhere else: an option value the library refuses is an
``InvalidArgumentError`` (or a subclass that also names the verb's own error, such as
``BenchOptionError``, so ``except BenchError`` still catches it); an output refused is
``OutputExistsError`` or ``UnsafeOutputError``. The CLI returns ``exit_code`` as it is
(``ggufdspark.cli.LazyGroup.invoke``); click's own option errors exit 2 as well.
"""

from __future__ import annotations

import errno
import os
import shutil


class GgufdsparkError(Exception):
    """Base class of every error a user can cause. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class InputNotFoundError(GgufdsparkError, FileNotFoundError):
    """A path given by the user does not exist or cannot be read."""

    exit_code = 4  # not 2: that is a usage error (click's convention)


class OutputExistsError(GgufdsparkError, FileExistsError):
    """An output file exists and ``--force`` was not given."""

    exit_code = 2


class UnsafeOutputError(GgufdsparkError, OSError):
    """An output path cannot be used safely: a symbolic link, one of the inputs, a missing directory."""

    exit_code = 2


class InvalidArgumentError(GgufdsparkError, ValueError):
    """An argument is out of range or malformed (a port, a host, a draft length...)."""

    exit_code = 2


class MissingDependencyError(GgufdsparkError, ImportError):
    """An optional package a command needs is not installed (the message names the pip extra)."""


class CorruptFileError(GgufdsparkError, ValueError):
    """A file is not what it claims to be (truncated, bad header, wrong magic...)."""


class UnsupportedModelError(GgufdsparkError, ValueError):
    """A checkpoint or GGUF is readable but not of a kind this toolkit handles."""


class PairMismatchError(GgufdsparkError, ValueError):
    """A draft and a target do not belong together."""


class EngineError(GgufdsparkError, RuntimeError):
    """llama-server is missing, unusable, failed to build, or failed to start."""


class EngineBuildError(EngineError):
    """Building the pinned engine failed."""


class ServerStartError(EngineError):
    """llama-server exited or never became healthy."""


class LogWaitTimeoutError(EngineError, TimeoutError):
    """An expected line did not reach the llama-server log in time (or the server exited first)."""


class PortInUseError(EngineError, OSError):
    """The requested port is already bound."""


class RequestFailedError(EngineError):
    """llama-server answered a request with an error (an HTTP error status, or an error event in a
    stream) and, as far as the client can tell, goes on serving; a broken connection is not this."""


class ContextSizeError(RequestFailedError, ValueError):
    """llama-server refused a request longer than its slot's context (HTTP 400,
    ``exceed_context_size_error``); the server goes on serving. ``n_prompt`` / ``n_ctx``: the
    request's tokens and the slot's context, when the engine's message gives them."""

    def __init__(self, message: str, n_prompt: int | None = None, n_ctx: int | None = None):
        super().__init__(message)
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class TimingsParseError(GgufdsparkError, ValueError):
    """Input to the timings parser could not be read."""


class BenchError(GgufdsparkError, RuntimeError):
    """A benchmark could not run (bad prompt file, server failure...)."""


class PlainDriftError(BenchError):
    """The target alone measured too differently before and after the speculative arm (a busy or
    throttling machine, a stalled run): the bench report is kept, but it claims no speedup."""

    exit_code = 5


class BenchOptionError(InvalidArgumentError, BenchError):
    """A bench or tune option value refused before any work (a usage error: exit 2)."""


class LosslessGateError(GgufdsparkError, AssertionError):
    """Greedy output with the draft differed from output without it (a defect, not a near-tie), or
    sampled output with the draft had other token frequencies (``bench --sampling-check``)."""

    exit_code = 3


class PublishError(GgufdsparkError, RuntimeError):
    """Publishing to the Hub failed or was refused."""


class HubError(GgufdsparkError, OSError):
    """A Hub reference (``ORG/NAME[:QUANT]``) could not be resolved or downloaded."""


class HubNotFoundError(HubError, FileNotFoundError):
    """No such repo, no file for the quant asked for, or offline and not in the cache."""

    exit_code = 4  # an input that is not there, like InputNotFoundError


class HubAccessError(HubError, PermissionError):
    """A gated or private repo that the token in use (or no token) cannot read."""


class HubConnectionError(HubError, ConnectionError):
    """The Hub could not be reached (and the cache could not stand in), or a download broke off."""


class PublishOptionError(InvalidArgumentError, PublishError):
    """A publish option refused before anything is read from or sent to the Hub (a usage error: exit 2)."""


class DiskFullError(GgufdsparkError, OSError):
    """Writing an output failed for want of space: the disk or a quota is full, or a file-size limit
    (``ulimit -f``) was reached. The message names the file and the space left; nothing partial is
    left behind by the writer that raises it."""


# errno values that mean "no room for this output" (EFBIG: the file-size limit, ulimit -f)
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def no_space_error(e: OSError, path: str | os.PathLike) -> OSError:
    """``e`` as a ``DiskFullError`` naming ``path`` and the free space of its file system when it
    means "no room" (``NO_SPACE_ERRNOS``); any other error comes back unchanged."""
    if e.errno not in NO_SPACE_ERRNOS:
        return e
    where = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{shutil.disk_usage(where).free / 1e9:.2f} GB free on {where}"
    except OSError:
        free = f"the free space on {where} is unknown"
    limit = "; the file-size limit (ulimit -f) may be what stopped it" if e.errno == errno.EFBIG else ""
    return DiskFullError(f"{path}: {e.strerror or 'no space'} ({free}{limit}); nothing was kept")
