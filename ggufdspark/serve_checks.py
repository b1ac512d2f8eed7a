"""Checks ``serve`` makes of what it is given before planning: engine arguments after ``--`` that
serve sets itself, and a load cut longer than the draft (which part of a tune profile applies is
``launch.decide``'s to say). Part of ``ggufdspark.serve`` (which re-exports them)."""

from __future__ import annotations

from ggufdspark.errors import InvalidArgumentError


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
    from ggufdspark.errors import BenchOptionError

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
