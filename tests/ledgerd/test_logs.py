"""One line per event with key=value fields."""

from __future__ import annotations

import io
import logging

from ledgerd.base.logs import configure_logging, fields


def test_event_line_has_key_value_fields() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", stream=out)
    logging.getLogger("disk.journal").info(
        "journal_rolled", extra=fields(file="/j/1.txn", size=12, note="two words"))
    line = out.getvalue().strip()
    assert "\n" not in line
    assert "level=INFO" in line
    assert "logger=disk.journal" in line
    assert "event=journal_rolled" in line
    assert "file=/j/1.txn" in line
    assert "size=12" in line
    assert 'note="two words"' in line


def test_level_filters() -> None:
    out = io.StringIO()
    configure_logging("WARNING", stream=out)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert "hidden" not in out.getvalue()
    assert "event=shown" in out.getvalue()
