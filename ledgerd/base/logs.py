"""Logging: stdlib logging, one line per event, ``key=value`` fields.

Call sites log an event name and fields::

    log = logging.getLogger(__name__)
    log.info("journal_rolled", extra=fields(file=path, size=n))

and the formatter renders ``ts=... level=INFO logger=disk.journal event=journal_rolled
file=/x/1.txn size=123``. Values with spaces or quotes are quoted, so each line parses back.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["KeyValueFormatter", "configure_logging", "fields", "format_value"]

_FIELDS_ATTR = "ledgerd_fields"


def fields(**kv: Any) -> dict[str, Any]:
    """Wrap key/value pairs for ``extra=`` so the formatter prints them."""
    return {_FIELDS_ATTR: kv}


def format_value(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


class KeyValueFormatter(logging.Formatter):
    """Formats a record as one ``key=value`` line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname}",
            f"logger={record.name}",
            f"event={format_value(record.getMessage())}",
        ]
        for key, value in getattr(record, _FIELDS_ATTR, {}).items():
            parts.append(f"{key}={format_value(value)}")
        if record.exc_info:
            parts.append(f"exc={format_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure_logging(level: str = "INFO", stream: Any = None) -> None:
    """Send every ledgerd logger to ``stream`` (stderr) at ``level``, one line per event."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # kazoo is chatty at INFO about every connection attempt.
    logging.getLogger("kazoo.client").setLevel(max(logging.getLevelName(level), logging.WARNING))
