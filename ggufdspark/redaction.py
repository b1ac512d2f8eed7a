"""Secrets kept out of the command lines a result records: ``bench --load``'s ``command``, ``tune``'s
``server_args``. Result files are meant to be shared (``publish --results`` puts them on a public
card), and an engine argument given through ``--server-arg`` can be an API key.

The engine's own command lines are redacted by ``ServerSettings.redacted`` (the key goes to a
private file); these helpers cover what the user typed."""

from __future__ import annotations

import shlex

REDACTED = "<redacted>"
# llama-server flags whose value is a secret (spellings from the pinned tree's common/arg.cpp)
SECRET_FLAGS = ("--api-key", "-hft", "--hf-token")
# the ggufdspark options whose value is one engine argument
ENGINE_ARG_OPTIONS = ("--server-arg",)


def redact_engine_args(args: list[str]) -> list[str]:
    """Engine arguments with the value of every secret flag (``--api-key K``, ``--api-key=K``,
    ``--hf-token T``...) replaced by ``REDACTED``."""
    out: list[str] = []
    secret_next = False
    for a in args:
        flag, eq, _ = a.partition("=")
        if secret_next:
            out.append(REDACTED)
            secret_next = False
        elif flag in SECRET_FLAGS and eq:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(a)
            secret_next = a in SECRET_FLAGS
    return out


def redact_argv(argv: list[str]) -> list[str]:
    """A ggufdspark command line (``sys.argv[1:]``) with its secrets redacted: the values of the
    secret flags among its engine arguments (every ``--server-arg`` value, in order, spelled
    ``--server-arg X`` or ``--server-arg=X``: ``--server-arg=--api-key --server-arg=K`` gives the
    engine ``--api-key K``), and of its own (``serve --api-key K``)."""
    out = list(argv)
    slots: list[tuple[int, str]] = []  # (index in argv, the text before the engine argument)
    i = 0
    while i < len(argv):
        a = argv[i]
        opt, eq, _ = a.partition("=")
        if opt in ENGINE_ARG_OPTIONS and eq:
            slots.append((i, opt + "="))
        elif a in ENGINE_ARG_OPTIONS and i + 1 < len(argv):
            slots.append((i + 1, ""))
            i += 1
        i += 1
    values = [argv[j][len(prefix):] for j, prefix in slots]
    for (j, prefix), value in zip(slots, redact_engine_args(values)):
        out[j] = prefix + value
    taken = {j for j, _ in slots}
    own = [j for j in range(len(argv)) if j not in taken]
    for j, value in zip(own, redact_engine_args([argv[j] for j in own])):
        out[j] = value
    return out


def redacted_command(program: str, argv: list[str]) -> str:
    """``program`` and ``argv`` as one shell-quoted line, secrets redacted (``redact_argv``)."""
    return shlex.join([program, *redact_argv(argv)])


def redact_command_line(line: str) -> str:
    """A recorded command line (one shell-quoted string) with its secrets redacted as
    ``redact_argv`` does; a line shlex cannot split is cut at its first secret flag."""
    try:
        return shlex.join(redact_argv(shlex.split(line)))
    except ValueError:
        cut = min((k for k in (line.find(f) for f in SECRET_FLAGS) if k >= 0), default=-1)
        return line if cut < 0 else line[:cut] + REDACTED
