"""Keep credentials out of logs and error texts.

Backends call :func:`register_secret` with every credential they hold (explicit keys, tokens, and
credentials resolved from the environment). From then on :func:`scrub` removes them from any text,
and a log-record factory installed on first registration scrubs every log record — including the
DEBUG records of SDKs such as botocore, which print request headers (``X-Amz-Security-Token``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rlm.storage.options import REDACTED

__all__ = ["register_secret", "scrub"]

_SECRETS: set[str] = set()
_LOCK = threading.Lock()
_INSTALLED = False
_MIN_LEN = 4  # never "redact" trivially short strings (they would mangle unrelated text)


def register_secret(value: str | None) -> None:
    """Remember ``value`` as a secret to scrub from logs and error messages from now on."""
    global _INSTALLED
    if not value or len(value) < _MIN_LEN:
        return
    with _LOCK:
        _SECRETS.add(value)
        if not _INSTALLED:
            _install_record_factory()
            _INSTALLED = True


def scrub(text: str) -> str:
    """Return ``text`` with every registered secret replaced by ``***``."""
    for secret in _SECRETS.copy():
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _install_record_factory() -> None:
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _SECRETS:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: leave it to logging's own error handling
                return record
            cleaned = scrub(message)
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return record

    logging.setLogRecordFactory(factory)
