"""Logging: stdlib logging, one line per event, ``key=value`` fields.

Call sites log an event name and fields::

    log = logging.getLogger(__name__)
    log.info("journal_rolled", extra=fields(file=path, size=n))

and the formatter renders ``ts=... level=INFO logger=ledgerd.disk.journal event=journal_rolled
file=/x/1.txn size=123``. Values with spaces or quotes are quoted, so each line parses back.
``--log-format json`` (``log_format = "json"``) writes the same record as one JSON object
a line, for log shippers. A field named like one of the line's own keys (``ts``,
``level``, ``logger``, ``event``, ``exc``) is written with a trailing underscore, so no
line carries a key twice.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LOG_FORMATS", "JsonFormatter", "KeyValueFormatter", "configure_logging", "fields",
           "format_value"]

_FIELDS_ATTR = "ledgerd_fields"
_RESERVED = frozenset({"ts", "level", "logger", "event", "exc"})
LOG_FORMATS = ("kv", "json")


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    kv: dict[str, Any] = getattr(record, _FIELDS_ATTR, {})
    if _RESERVED.isdisjoint(kv):
        return kv
    return {(f"{k}_" if k in _RESERVED else k): v for k, v in kv.items()}


def _timestamp(record: logging.LogRecord) -> str:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{ts}.{int(record.msecs):03d}Z"


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
        parts = [
            f"ts={_timestamp(record)}",
            f"level={record.levelname}",
            f"logger={record.name}",
            f"event={format_value(record.getMessage())}",
        ]
        for key, value in _fields_of(record).items():
            parts.append(f"{key}={format_value(value)}")
        if record.exc_info:
            parts.append(f"exc={format_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (values that JSON cannot hold as strings)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname,
                               "logger": record.name, "event": record.getMessage()}
        for key, value in _fields_of(record).items():
            out[key] = value if isinstance(value, (bool, int, float, type(None))) else \
                value if isinstance(value, str) else str(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


_levels_set: list[str] = []  # loggers configure_logging gave a level, reset on the next call


def configure_logging(level: str = "INFO", stream: Any = None, fmt: str = "kv", *,
                      levels: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                      log_file: str = "") -> None:
    """Send every logger to ``stream`` (stderr) at ``level``, one line per event, as
    ``key=value`` (``fmt="kv"``) or JSON (``fmt="json"``); a process's entry point calls
    it (the ledgerd library itself never does).

    ``levels`` sets single loggers' levels over ``level`` (``{"ledgerd.disk.journal":
    "DEBUG"}``: that logger and its children log DEBUG lines while the rest stay at
    ``level``). ``log_file`` also writes every line to that file (appended; reopened
    when logrotate moves it away). Raises OSError naming the file it cannot open."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    formatter = JsonFormatter() if fmt == "json" else KeyValueFormatter()
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if log_file:
        try:
            handlers.append(logging.handlers.WatchedFileHandler(log_file, encoding="utf-8"))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot open log_file {log_file}: {exc.strerror}") \
                from None
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    for name in _levels_set:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _levels_set.clear()
    # kazoo is chatty at INFO about every connection attempt.
    logging.getLogger("kazoo.client").setLevel(max(logging.getLevelName(level), logging.WARNING))
    pairs = levels.items() if isinstance(levels, Mapping) else levels
    for name, name_level in pairs:
        logging.getLogger(name).setLevel(name_level)
        _levels_set.append(name)
