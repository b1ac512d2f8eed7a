"""What a verb that starts llama-server is given: the options record (``ServingOptions``), built
once by the command line (``cli/serve``, ``cli/bench``, ``cli/tune``) or a script and passed down to
every layer, and the checks ``serve`` makes of it before planning: engine arguments after ``--`` that
serve sets itself, and a load cut longer than the draft (which part of a tune profile applies is
``launch.decide``'s to say). Part of ``ggufdspark.serve`` (which re-exports the checks)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ggufdspark.errors import BenchOptionError, InvalidArgumentError


@dataclass(frozen=True)
class ServingOptions:
    """The options of the llama-server a verb starts, as given. ``launch.decide`` turns them (with
    the devices, the engine build and a tune profile) into the decision, and ``launch`` into the
    command line; ``serve.plan`` takes them whole, and so do ``bench``, ``bench --load``,
    ``bench --sampling-check``, ``tune`` and ``tune --load`` (through ``measure.prepare`` and
    ``measure.base_settings``), so every verb reads the same names the same way.

    The pair: ``model`` (the target), ``draft``, ``mmproj``: GGUF files (``serve`` also takes Hub
    references ``ORG/NAME[:QUANT]`` there, or as ``hf`` / ``hfd``, llama-server's spellings).
    The engine: ``server`` (None: the one ``build-engine`` made). The draft: ``draft_n_max`` (None:
    the tune profile's, else the hardware table's), ``draft_n_max_by_slots`` (the load cut as given:
    ``N:L,...`` or ``off``; None: the backend's), ``no_draft``, ``use_profile`` (False: a tune
    profile is ignored), ``force`` (serve a pair that fails ``check``). The server: ``ctx_size`` (the
    whole ``-c``) or ``ctx_per_slot``, ``parallel`` slots, ``threads``, ``extra_args`` (more
    llama-server arguments: ``serve``'s after ``--``, ``bench``'s and ``tune``'s ``--server-arg``),
    ``host``, ``port``, ``api_key``; ``serve``'s own: ``ui`` (the chat page), ``warm`` and
    ``warmup_tokens`` (the warm-up before each ready: ``warmup.decide``).
    """

    model: str | Path | None = None
    draft: str | Path | None = None
    mmproj: str | Path | None = None
    hf: str | None = None
    hfd: str | None = None
    server: str | Path | None = None
    draft_n_max: int | None = None
    draft_n_max_by_slots: str | None = None
    no_draft: bool = False
    use_profile: bool = True
    force: bool = False
    ctx_size: int | None = None
    ctx_per_slot: int | None = None
    parallel: int | None = 1
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    ui: bool = True
    warm: bool | None = None
    warmup_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.extra_args, str):
            raise InvalidArgumentError(f"extra_args {self.extra_args!r}: expected a list of arguments, not one string")
        object.__setattr__(self, "extra_args", tuple(self.extra_args or ()))  # a list given: a tuple, as frozen

    def check_measured(self, verb: str, *also: str) -> None:
        """Refuse what no measured server takes: ``serve``'s own options (``SERVE_ONLY``: every arm
        listens on loopback, its slots come from the levels, drafted or not by the arm), and the
        fields ``also`` names (``tune`` measures draft lengths itself), when set to anything but
        their default.

        Raises:
            BenchOptionError: the first such field, its value (not an API key's) and the verb.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (f.name in SERVE_ONLY or f.name in also) and value != f.default:
                shown = "<api-key>" if f.name == "api_key" else repr(value)  # a key is never printed
                raise BenchOptionError(f"{verb}: {f.name}={shown} is not an option of a measured server")


# ServingOptions fields that only ``serve`` takes (ServingOptions.check_measured)
SERVE_ONLY = ("hf", "hfd", "no_draft", "force", "ctx_size", "parallel", "host", "port", "api_key", "ui", "warm",
              "warmup_tokens")


# llama-server flags that serve sets itself, by the serve option that owns them (spellings from the
# pinned tree's common/arg.cpp). Given again after --, the engine's last-one-wins parsing would run
# something else than what serve checked, planned and polls (another port: a healthy engine killed
# after the whole start timeout). --api-key is not here: keys given after -- join serve's own in
# the private key file (ServerSettings.api_keys). --path is not either: it replaces the chat UI.
OWNED_ENGINE_FLAGS: dict[str, tuple[str, ...]] = {
    "--host": ("--host",),
    "--port": ("--port",),
    "-m": ("-m", "--model", "-mu", "--model-url"),
    "-md": ("-md", "--model-draft", "--spec-draft-model"),
    "--mmproj": ("-mm", "--mmproj"),
    "--hf": ("-hf", "-hfr", "--hf-repo"),
    "--hfd": ("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
    "-c": ("-c", "--ctx-size"),
    "-np": ("-np", "--parallel"),
    "--draft-n-max": ("--spec-draft-n-max",),
    "--draft-n-max-by-slots": ("--spec-draft-n-max-by-slots",),
}


# llama-server flags that serve cannot run with, none of its options standing for them, and why.
# --api-prefix moves every route, /health included: serve's health poll, warm-up and chat URL miss
# them all, and a working engine was killed at the start timeout (its environment variable,
# LLAMA_ARG_API_PREFIX, is left out of the engine's environment: runners/engine_env.py).
UNSUPPORTED_ENGINE_FLAGS: dict[str, str] = {
    "--api-prefix": "it moves /health and every route away from where serve polls and sends its requests",
}


def check_extra_args(extra_args: list[str]) -> None:
    """Refuse engine arguments (given after ``--``) that serve sets itself (``OWNED_ENGINE_FLAGS``)
    or cannot run with (``UNSUPPORTED_ENGINE_FLAGS``).

    Raises:
        InvalidArgumentError: the first such flag, with the serve option to use instead, or why not.
    """
    for a in extra_args:
        flag = a.split("=", 1)[0]
        owner = next((o for o, flags in OWNED_ENGINE_FLAGS.items() if flag in flags), None)
        if owner:
            raise InvalidArgumentError(f"{a!r} after --: serve sets {flag} itself; use serve's own {owner} option")
        if flag in UNSUPPORTED_ENGINE_FLAGS:
            raise InvalidArgumentError(f"{a!r} after --: serve does not run llama-server with {flag}: "
                                       f"{UNSUPPORTED_ENGINE_FLAGS[flag]}")


def check_server_args(server_args: list[str]) -> None:
    """Refuse ``bench`` / ``tune``'s ``--server-arg`` values that no measured server can run with
    (``UNSUPPORTED_ENGINE_FLAGS``: ``--api-prefix`` moves ``/health`` and every route from where the
    arms are polled and asked).

    Raises:
        BenchOptionError: the first such value, and why.
    """
    for a in server_args:
        flag = a.split("=", 1)[0]
        if flag in UNSUPPORTED_ENGINE_FLAGS:
            raise BenchOptionError(f"--server-arg {a!r}: measured servers do not run with {flag}: "
                                   f"{UNSUPPORTED_ENGINE_FLAGS[flag]}")


def check_draft_cut(cut: list[tuple[int, int]] | None, n_max: int | None, text: str | None) -> None:
    """Refuse a --draft-n-max-by-slots step longer than the draft length it would cut (``0:60`` with
    n_max 6 cuts nothing: a mistake, not a setting).

    Raises:
        InvalidArgumentError: the first such step, and the draft length serve runs with.
    """
    for n, length in cut or []:
        if n_max is not None and length > n_max:
            raise InvalidArgumentError(f"--draft-n-max-by-slots {text}: {n}:{length} cuts drafts to {length} tokens, "
                                       f"longer than the draft length {n_max} serve runs with (it would cut nothing)")
