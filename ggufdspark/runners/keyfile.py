"""The API keys a llama-server takes: never on its command line (``ps`` shows that to every user),
always through a private file (``--api-key-file``) that exists only while the engine reads it."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

KEY_FILE_PLACEHOLDER = "<api-key-file>"


def split_key_args(extra: list[str]) -> tuple[list[str], list[str]]:
    """``extra`` without ``--api-key K`` / ``--api-key=K``, and the keys those held."""
    rest: list[str] = []
    keys: list[str] = []
    it = iter(extra)
    for a in it:
        if a == "--api-key":
            keys += [k for k in next(it, "").split(",") if k]
        elif a.startswith("--api-key="):
            keys += [k for k in a.split("=", 1)[1].split(",") if k]
        else:
            rest.append(a)
    return rest, keys


def write_key_file(keys: list[str]) -> Path:
    """A private directory (0700, unpredictable name) holding ``api-key`` (0600), one key a line."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(tempfile.mkdtemp(prefix="ggufdspark-key-", dir=base if base and os.path.isdir(base) else None))
    try:
        fd = os.open(d / "api-key", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(k + "\n" for k in keys))
    except BaseException:
        remove_key_file(d)
        raise
    return d


def remove_key_file(d: Path) -> None:
    (d / "api-key").unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError as e:  # pragma: no cover - nothing else is ever written there
        log.warning("could not remove the API key directory %s: %s", d, e)
