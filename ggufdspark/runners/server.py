"""Drive ``llama-server``: typed settings become flags, start waits for health while watching the
child, stop is terminate / wait / kill; ``client()`` gives an HTTP client for it
(``ggufdspark.runners.client``: text plus parsed timings).

    with ServerProcess(ServerSettings(server=exe, model=t, draft=d)) as srv:
        out = srv.client().complete("Hello", n_predict=32)
        print(out.text, out.timings.accept_length)
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ggufdspark import logfiles
from ggufdspark.errors import EngineError, InvalidArgumentError, LogWaitTimeoutError, PortInUseError, ServerStartError
from ggufdspark.runners import lifeline
from ggufdspark.runners.keyfile import KEY_FILE_PLACEHOLDER, remove_key_file, split_key_args, write_key_file
from ggufdspark.runners.deaths import exit_cause, explain_failure  # noqa: F401 (also public here)
from ggufdspark.runners.client import Client, urlopen_direct
from ggufdspark.runners.engine_env import dropped_warnings, engine_environment, env_api_keys
from ggufdspark.runners.tensor_overrides import env_override_args, overrides_token_table, with_token_table

log = logging.getLogger(__name__)

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


@dataclass
class ServerSettings:
    """Everything that becomes a llama-server flag. None means: leave the engine's default."""

    server: str | Path
    model: str | Path | None = None
    draft: str | Path | None = None
    mmproj: str | Path | None = None
    hf_repo: str | None = None
    hf_draft: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    spec_type: str | None = "draft-dspark"
    draft_n_max: int | None = None
    draft_n_min: int | None = 0
    draft_p_min: float | None = None
    # new drafts pause while more slots than this generate (engine patch 0011; None: no limit)
    # drafts cut to L tokens while more than N slots are busy, as (N, L) pairs (engine patch 0021)
    draft_n_max_by_slots: list[tuple[int, int]] | None = None
    # the draft context's n_ubatch (engine patch 0037, --spec-draft-ubatch; None: the target's), given
    # only with a draft: a DSpark drafter takes a step's processed rows in chunks of this many
    draft_ubatch: int | None = None
    n_gpu_layers: int | str | None = None
    n_gpu_layers_draft: int | str | None = None
    flash_attn: str | None = None
    # the buffer the target's token table is loaded into (-ot token_embd\.weight=CUDA0, after
    # extra_args; left off where extra_args override that tensor themselves: overrides_token_table)
    token_table_device: str | None = None
    ctx_size: int | None = 4096
    parallel: int | None = 1
    # one KV cache shared by the slots, each capped at this many tokens (-kvu --kv-unified-per-slot N;
    # None: llama-server's layout, -c divided among the slots, as serve runs it): a benchmark's arm
    kv_per_slot: int | None = None
    threads: int | None = None
    metrics: bool = True
    # a directory of static files served at / (the chat UI's dist: ggufdspark.webui)
    public_path: str | Path | None = None
    synth_len: float | None = None
    synth_rates: list[float] | None = None
    extra_args: list[str] = field(default_factory=list)
    # environment variables the engine gets on top of this process's (not flags: an engine switch,
    # e.g. a patch's, for one arm of a comparison); never a secret (they show in reports)
    env: dict[str, str] = field(default_factory=dict)

    def pooled(self) -> "ServerSettings":
        """These settings with the slots in one KV cache, each capped at its share of ``ctx_size``
        (``kv_per_slot``); unchanged without a context size and a slot count."""
        if not (self.ctx_size and self.parallel):
            return self
        return dataclasses.replace(self, kv_per_slot=self.ctx_size // self.parallel)

    def api_keys(self) -> list[str]:
        """The API keys: ``api_key``, any ``--api-key K`` / ``--api-key=K`` in ``extra_args``
        (comma-separated lists, as llama-server reads them), and those of this process's
        environment that the engine would read itself (``LLAMA_API_KEY``, ``LLAMA_ARG_API_KEY_FILE``:
        ``engine_env.env_api_keys``; the engine gets them through its key file instead, so that our
        own requests, which send ``api_keys()[0]``, are let in).

        Raises:
            InvalidArgumentError: a key the engine's key file cannot carry (a line break, a leading '#').
        """
        keys = ([k for k in (self.api_key or "").split(",") if k] + split_key_args(self.extra_args)[1]
                + env_api_keys())
        for k in keys:
            if any(c in k for c in "\r\n\0") or k.startswith("#"):
                raise InvalidArgumentError("the API key contains a line break, a NUL or starts with '#'; "
                                           "llama-server's key file cannot hold it")
        return list(dict.fromkeys(keys))

    def args(self, *, key_file: str | Path | None = None, network: bool = True) -> list[str]:
        """The llama-server command line.

        The API key is never on it (every local user can read a command line): when there is one,
        the engine reads it from ``--api-key-file KEY_FILE``, which ``ServerProcess`` writes; without
        ``key_file`` the flag's value is the placeholder ``KEY_FILE_PLACEHOLDER``. ``network=False``
        leaves out ``--host`` and ``--port`` (a line for a model card, run wherever the reader likes).
        """
        a: list[str] = [str(self.server)]
        if self.model:
            a += ["-m", str(self.model)]
        if self.hf_repo:
            a += ["-hf", self.hf_repo]
        use_draft = bool(self.draft or self.hf_draft) and self.spec_type not in (None, "none")
        if use_draft:
            if self.draft:
                a += ["-md", str(self.draft)]
            if self.hf_draft:
                a += ["-hfd", self.hf_draft]
            a += ["--spec-type", str(self.spec_type)]
            if self.draft_n_max is not None:
                a += ["--spec-draft-n-max", str(self.draft_n_max)]
            if self.draft_n_min is not None:
                a += ["--spec-draft-n-min", str(self.draft_n_min)]
            if self.draft_p_min is not None:
                a += ["--spec-draft-p-min", str(self.draft_p_min)]
            if self.draft_n_max_by_slots:
                a += ["--spec-draft-n-max-by-slots", ",".join(f"{n}:{k}" for n, k in self.draft_n_max_by_slots)]
            if self.draft_ubatch is not None:
                a += ["--spec-draft-ubatch", str(self.draft_ubatch)]
            if self.n_gpu_layers_draft is not None:
                a += ["-ngld", str(self.n_gpu_layers_draft)]
            if self.synth_len is not None:
                a += ["--spec-synth-len", str(self.synth_len)]
            if self.synth_rates:
                a += ["--spec-synth-rates", ",".join(f"{r:g}" for r in self.synth_rates)]
        if self.mmproj:
            a += ["--mmproj", str(self.mmproj)]
        if self.n_gpu_layers is not None:
            a += ["-ngl", str(self.n_gpu_layers)]
        if self.flash_attn is not None:
            a += ["-fa", self.flash_attn]
        if self.ctx_size is not None:
            a += ["-c", str(self.ctx_size)]
        if self.parallel is not None:
            a += ["-np", str(self.parallel)]
        if self.kv_per_slot is not None:
            a += ["-kvu", "--kv-unified-per-slot", str(self.kv_per_slot)]
        if self.threads is not None:
            a += ["-t", str(self.threads)]
        if self.metrics:
            a += ["--metrics"]
        if self.public_path is not None:
            a += ["--path", str(self.public_path)]
        if self.api_keys():
            a += ["--api-key-file", str(key_file or KEY_FILE_PLACEHOLDER)]
        if network:
            a += ["--host", self.host, "--port", str(self.port)]
        a += split_key_args(self.extra_args)[0]
        if self.token_table_device and not overrides_token_table(self.extra_args + self.env_overrides()):
            a = with_token_table(a, self.token_table_device)  # after extra_args': the first match wins
        return a

    def env_overrides(self) -> list[str]:
        """The tensor overrides the engine will take from its environment (``engine_env``), as a
        flag pair: they apply before any on the command line."""
        return env_override_args(self.engine_env()[0])

    def engine_env(self) -> tuple[dict[str, str], list[str]]:
        """The engine's environment and the variables left out of it (``engine_env.OWNED_ENV``):
        this process's, with ``env`` on top."""
        return engine_environment(self.env)

    def pick_port(self) -> int:
        """Replace port 0 by a free port on this host (loopback for wildcard hosts)."""
        if self.port == 0:
            self.port = free_port("127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host)
        return self.port

    def redacted(self) -> list[str]:
        """The command line for printing and logs (it never holds the key; see ``args``)."""
        return self.args()

    def redacted_dict(self) -> dict:
        """The settings as JSON-ready data, redacted as ``redacted()`` is: no key, only
        ``api_key_file`` (``KEY_FILE_PLACEHOLDER`` when the engine will read one, else None), and
        ``extra_args`` without ``--api-key`` and its value."""
        d = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        del d["api_key"]
        d["api_key_file"] = KEY_FILE_PLACEHOLDER if self.api_keys() else None
        d["extra_args"] = split_key_args(self.extra_args)[0]
        return d


_PORT_TRIES = 3  # starts on a freshly picked port before a lost race is an error
_FOREIGN_HEALTH_S = 5.0  # /health answering this long without our log's 'listening on': taken as ours


class ServerProcess:
    """One llama-server process. Use as a context manager; ``stop()`` is always safe to call."""

    def __init__(self, settings: ServerSettings, *, log_path: str | Path | None = None,
                 start_timeout: float = 300.0, keep_log: bool | None = None):
        """
        Args:
            log_path: the engine's log, appended to (never through a symlink). Default: a new
                private file in the state directory (``ggufdspark.logfiles``).
            keep_log: keep the log after a clean stop. Default: kept when ``log_path`` was given;
                a default log is deleted on leaving the ``with`` block unless the engine failed.
        """
        self.settings = settings
        self.start_timeout = start_timeout
        self._own_log = log_path is None
        self.log_path = logfiles.new_log("llama-server") if log_path is None else Path(log_path)
        self.keep_log = (not self._own_log) if keep_log is None else keep_log
        self.proc: subprocess.Popen | None = None
        self._lifeline: lifeline.Lifeline | None = None
        self._log_start = 0  # where this start's lines begin in an appended log
        self._failed = False

    @property
    def url(self) -> str:
        host = self.settings.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.settings.port}"

    def start(self) -> "ServerProcess":
        """Start and wait until ``/health`` says ready.

        Raises:
            PortInUseError: the port is taken.
            ServerStartError: the engine exited during start (reason and last log lines included),
                or was not healthy within ``start_timeout``.
        """
        s = self.settings
        picked = s.port == 0
        if self.proc is not None:
            self.stop()  # a restart: reap the last one and dismiss its lifeline
        if not picked and port_in_use(s.host, s.port):
            raise PortInUseError(f"port {s.port} on {s.host} is already in use (use --port 0 to pick a free one)")
        tries = 1
        while True:
            if picked:
                s.port = 0
                s.pick_port()
            try:
                return self._start_once()
            except ServerStartError as e:
                # A picked port is free when picked, not when bound: another process (a second
                # server started at the same moment) may bind it first. Pick again.
                if not (picked and tries < _PORT_TRIES and "port already in use" in str(e)):
                    raise
                log.info("port %d was taken before llama-server bound it; picking another", s.port)
                self._failed = False
                tries += 1

    def _start_once(self) -> "ServerProcess":
        s = self.settings
        keys = s.api_keys()
        log.debug("starting: %s", " ".join(s.redacted()))
        fd = logfiles.open_log(self.log_path)
        key_dir = write_key_file(keys) if keys else None
        try:
            self._log_start = os.fstat(fd).st_size
            args = s.args(key_file=key_dir / "api-key" if key_dir else None)
            env, dropped = s.engine_env()
            for w in dropped_warnings(dropped):
                log.warning("%s", w)
            try:
                self.proc, self._lifeline = lifeline.spawn(args, stdout=fd, stderr=subprocess.STDOUT,
                                                           stdin=subprocess.DEVNULL, env=env)
            except OSError as e:
                raise EngineError(f"{s.server}: cannot start llama-server: {e.strerror}") from None
            finally:
                os.close(fd)
            try:
                self._wait_healthy()
            except BaseException:
                self._failed = True
                self.stop()
                raise
        finally:
            if key_dir:  # read by the engine while parsing its arguments, long before /health
                remove_key_file(key_dir)
        return self

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        log_elsewhere = self._log_elsewhere()
        healthy_since = None
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                text = self.run_log_text()
                tail = "\n".join(text.splitlines()[-15:])
                raise ServerStartError(
                    f"llama-server {exit_cause(rc)} during start ({explain_failure(text)}); "
                    f"log: {self.log_path}\n--- last log lines ---\n{tail}")
            if self.health() == 200:
                healthy_since = healthy_since or time.monotonic()
                # ours once its log says so; a build that logs otherwise, once it has outlived the
                # second or so in which a server that lost the port exits
                if log_elsewhere or self._bound_here() or time.monotonic() - healthy_since > _FOREIGN_HEALTH_S:
                    return
            else:
                healthy_since = None
            time.sleep(0.1)
        raise ServerStartError(f"llama-server was not healthy after {self.start_timeout:.0f}s; log: {self.log_path}")

    def _log_elsewhere(self) -> bool:
        """The engine's log does not reach ``log_path`` (``--log-disable``, ``--log-file``): a start is
        then taken on ``/health`` alone."""
        args = self.settings.args()
        return (any(a in ("--log-disable", "--log-file") or a.startswith("--log-file=") for a in args)
                or bool(os.environ.get("LLAMA_ARG_LOG_FILE")))

    def _bound_here(self) -> bool:
        """Whether this process, not another that holds the same port, answered ``/health``: its log
        says it listens on the port."""
        return re.search(rf"listening on \S+:{self.settings.port}\b", self.run_log_text()) is not None

    def run_log_text(self) -> str:
        """The log from where this start began (a log given by the user may hold earlier runs)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, timeout: float = 10.0, *, count: int = 1) -> list[str]:
        """The log lines matching ``pattern`` (a regex), once at least ``count`` of them are there.

        llama.cpp's logger writes from its own thread, so the lines about a request (timings,
        ``draft acceptance``) can reach the log after the HTTP response: after a request, read the
        log through this, never ``log_text()`` alone. The last line may still be half written:
        a pattern that must see a whole line should match up to its end.

        Raises:
            LogWaitTimeoutError: fewer than ``count`` matching lines after ``timeout`` seconds, or
                the server exited without writing them (the message names pattern, count, log).
        """
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            exited = self.proc is not None and self.proc.poll() is not None  # before reading: then final
            lines = [ln for ln in self.log_text().splitlines() if rx.search(ln)]
            if len(lines) >= count:
                return lines
            if exited or time.monotonic() > deadline:
                why = (f"llama-server exited (code {self.proc.returncode}) without writing more" if exited
                       else f"waited {timeout:g}s")
                raise LogWaitTimeoutError(f"{self.log_path}: {len(lines)} line(s) matching {pattern!r}, "
                                          f"expected at least {count}; {why}")
            time.sleep(0.05)

    def health(self, timeout: float = 2.0) -> int | None:
        """The HTTP status ``/health`` answers with (200 ready, 503 while the model loads), or None
        when nothing answers within ``timeout`` seconds (not listening, hung, or gone)."""
        try:
            with urlopen_direct(self.url + "/health", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            e.close()
            return e.code
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """Terminate, wait, then kill (the whole process group). Returns the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                p.terminate()
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                p.wait(5)
        elif p.returncode != 0:
            self._failed = True  # it ended on its own, not by our hand: keep its log
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None
        return p.returncode

    def kill(self) -> None:
        """SIGKILL the engine's process group now (safe from a signal handler; ``stop`` reaps it)."""
        p = self.proc
        if p is not None and p.returncode is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def client(self, timeout: float = 600.0) -> "Client":
        keys = self.settings.api_keys()
        return Client(self.url, api_key=keys[0] if keys else None, timeout=timeout)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_log and not self.keep_log and not self._failed:
            self.log_path.unlink(missing_ok=True)
