"""One line per event with key=value fields."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from ledgerd.base.logs import configure_logging, fields


def test_event_line_has_key_value_fields() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", stream=out)
    logging.getLogger("ledgerd.disk.journal").info(
        "journal_rolled", extra=fields(file="/j/1.txn", size=12, note="two words"))
    line = out.getvalue().strip()
    assert "\n" not in line
    assert "level=INFO" in line
    assert "logger=ledgerd.disk.journal" in line
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


def test_json_lines_carry_the_same_record() -> None:
    import json

    out = io.StringIO()
    configure_logging("INFO", stream=out, fmt="json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("ledgerd.disk.journal").exception(
            "journal_failed", extra=fields(path=Path("/j/1.txn"), size=12, ok=True))
    line = out.getvalue().strip()
    assert "\n" not in line
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "ledgerd.disk.journal"
    assert record["event"] == "journal_failed"
    assert record["path"] == "/j/1.txn" and record["size"] == 12 and record["ok"] is True
    assert "ValueError: boom" in record["exc"]
    with pytest.raises(ValueError, match="log format"):
        configure_logging("INFO", stream=out, fmt="xml")


def test_a_field_named_like_a_line_key_is_not_written_twice() -> None:
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    logging.getLogger("ledgerd.metadata.zookeeper").info(
        "zookeeper_session", extra=fields(event="lost", level=3))
    line = out.getvalue().strip()
    keys = [part.split("=", 1)[0] for part in line.split(" ")]
    assert len(keys) == len(set(keys)), line
    assert "event=zookeeper_session" in line and "event_=lost" in line


def test_an_application_without_logging_sees_no_kazoo_lines(tmp_path: Path) -> None:
    """A script that uses the client against a ZooKeeper that is not there gets the
    client's one error, and kazoo's warnings stay off its stderr."""
    import subprocess
    import sys

    from ledgerd.tools.zkserver import find_free_port

    port = find_free_port()
    script = (
        "import ledgerd\n"
        "try:\n"
        f"    ledgerd.SyncClient('127.0.0.1:{port}', zk_timeout_ms=1500)\n"
        "except ledgerd.LedgerdError as exc:\n"
        "    print('error:', type(exc).__name__)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.stdout.startswith("error:"), done.stdout + done.stderr
    assert done.stderr == "", done.stderr


def test_single_loggers_get_their_own_level_and_a_log_file(tmp_path: Path) -> None:
    """log_levels / log_file (issue #48 item 14): one logger at DEBUG while the rest
    stay at INFO, and every line in the file too; a later call resets those levels."""
    out = io.StringIO()
    path = tmp_path / "bookie.log"
    configure_logging("INFO", stream=out, levels={"ledgerd.disk.journal": "DEBUG"},
                      log_file=str(path))
    try:
        logging.getLogger("ledgerd.disk.journal.group").debug("journal_detail")
        logging.getLogger("ledgerd.disk.index").debug("index_detail")
        logging.getLogger("ledgerd.disk.index").info("index_flushed")
        for text in (out.getvalue(), path.read_text()):
            assert "event=journal_detail" in text and "event=index_flushed" in text
            assert "index_detail" not in text
        path.rename(tmp_path / "bookie.log.1")  # logrotate moves it: the next line reopens
        logging.getLogger("ledgerd.disk.index").warning("after_rotation")
        assert "event=after_rotation" in path.read_text()
    finally:
        configure_logging("INFO", stream=io.StringIO())
    assert logging.getLogger("ledgerd.disk.journal").level == logging.NOTSET
    with pytest.raises(OSError, match="cannot open log_file"):
        configure_logging("INFO", stream=out, log_file=str(tmp_path / "no" / "such.log"))
