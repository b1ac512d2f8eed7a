"""Keep the Hub token out of every log line while ``publish`` talks to the Hub."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


class MaskSecret(logging.Filter):
    """Replaces a secret by ``***`` in every record a handler emits (message, args, traceback)."""

    def __init__(self, secret: str):
        super().__init__()
        # a token's body alone is as good as the token ("hf_" is only its prefix)
        self.secrets = [secret] + ([secret[3:]] if secret.startswith("hf_") and len(secret) > 11 else [])

    def mask(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        for s in self.secrets:
            text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the logging module's business
            return True
        if any(s in msg for s in self.secrets):
            record.msg, record.args = self.mask(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask(record.exc_text)
        return True


@contextlib.contextmanager
def masked_in_logs(secret: str) -> Iterator[None]:
    """Mask ``secret`` in everything logged while the block runs, by any logger (the Hub client and
    its HTTP library log URLs and headers at debug level)."""
    f = MaskSecret(secret)
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = {h for lg in loggers for h in lg.handlers} | ({logging.lastResort} if logging.lastResort else set())
    for h in handlers:
        h.addFilter(f)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(f)
