"""docs/protocol.md is generated from the layouts and must not drift."""

from __future__ import annotations

from pathlib import Path

from ledgerd.wire.docs import render_protocol_doc
from ledgerd.wire.status import (
    STATUS_ERRORS,
    BookieError,
    Status,
    error_for_status,
    status_for_error,
)


def test_protocol_doc_matches_declarations() -> None:
    doc = Path(__file__).parents[2] / "docs" / "protocol.md"
    assert doc.read_text() == render_protocol_doc(), "run: python -m ledgerd.wire.docs > docs/protocol.md"


def test_status_table_round_trips() -> None:
    for status in Status:
        if status is Status.OK:
            continue
        exc = error_for_status(status, ledger_id=3, entry_id=4)
        assert isinstance(exc, STATUS_ERRORS[status])
        assert isinstance(exc, BookieError)
        assert status_for_error(exc) is status
        assert "ledger 3 entry 4" in str(exc)
    assert status_for_error(OSError(5, "EIO")) is Status.IO_ERROR
    assert error_for_status(4242).status is Status.BAD_REQUEST
