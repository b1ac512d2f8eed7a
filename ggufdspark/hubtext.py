"""What the Hub says, made safe to use and to show: file names that may be joined onto the cache's
folders (``unsafe_name``, ``check_names``), commit ids (``COMMIT_RE``), and text quoted in messages
(``shown``: one line, bounded; ``listed``: the first few of many; ``strip_userinfo``: no credentials
of an ``HF_ENDPOINT`` mirror). A hostile Hub or mirror serves what it likes; ``ggufdspark.hubref``
passes everything it is told through here before a path is built or a line printed: a listing with
one unsafe name is refused whole (the Hub's commit API refuses such names, so a listing holding one
did not come from a Hub that behaves, and nothing else in it is trusted either)."""

from __future__ import annotations

import re

from ggufdspark.errors import HubError

COMMIT_RE = re.compile(r"[0-9a-f]{40}")  # huggingface_hub's REGEX_COMMIT_HASH
MAX_LISTED = 20  # quants (or file names: 8) a message lists before "and K more"

# the userinfo of a URL: after "scheme://", everything up to the last "@" before the host ends
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def strip_userinfo(text: object) -> str:
    """``text`` with the ``user:password@`` part of every URL in it removed.

    A mirror named by ``HF_ENDPOINT`` may carry its credentials in its URL; wherever an endpoint is
    shown (``doctor``, Hub errors, ``publish``'s plan and JSON, the CLI's log and error lines) it
    goes through this first. ``text`` may be a URL or a message quoting URLs."""
    return _USERINFO.sub(r"\1", str(text))


def shown(text: object, limit: int = 120) -> str:
    """Text from the Hub (a file name, a commit id, a server's message) as a message shows it: control
    characters escaped (``\\n``), so it stays on one line, and at most ``limit`` characters."""
    out = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[:limit] + "..."


def listed(items: list[str], n: int = MAX_LISTED) -> str:
    """The first ``n`` of ``items`` (each ``shown``), then how many more."""
    more = f", and {len(items) - n} more" if len(items) > n else ""
    return ", ".join(shown(i, 60) for i in items[:n]) + more


def unsafe_name(name: str) -> str | None:
    """Why a repo file name cannot be joined onto a snapshot folder, or None for a plain relative
    path (what huggingface_hub's ``_validate_relative_filename`` refuses, and a little more)."""
    if not name:
        return "an empty name"
    if name.startswith("/"):
        return "an absolute path"
    if "\\" in name:
        return "a backslash"
    if re.match(r"[A-Za-z]:", name):
        return "a drive"
    if any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in name):
        return "a control character"
    segments = name.split("/")
    if ".." in segments:
        return "a '..' segment"
    if "." in segments:
        return "a '.' segment"
    if "" in segments:
        return "an empty segment"
    return None


def check_names(repo: str, files: list[str], source: str) -> None:
    """Refuse a listing holding a name that is not a plain relative path (``source`` says who listed it)."""
    for f in files:
        reason = unsafe_name(f)
        if reason:
            raise HubError(f"{repo}: {source} listed '{shown(f)}' ({reason}), which is no file of a repo: "
                           "refusing its listing")


def say_error(e: BaseException, token: str | None) -> str:
    """One line from a Hub client exception: the server's message or the first line, token masked."""
    server = getattr(e, "server_message", None)
    status = getattr(getattr(e, "response", None), "status_code", None)
    text = f"HTTP {status}: {server.splitlines()[0]}" if status and server else \
        next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    text = strip_userinfo(text)  # huggingface_hub's messages quote the URL asked
    if token:
        from ggufdspark.publish.masking import MaskSecret

        text = MaskSecret(token).mask(text)  # the token, and its body without "hf_"
    return shown(text, 300)
