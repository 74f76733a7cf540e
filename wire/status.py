"""Status codes and the one table between a status and the client's exception.

The numbers mirror BookKeeper's v2 protocol codes (``BookieProtocol.java``): 0 for OK,
1 and 2 for the "definite absence" answers that recovery counts, 100+ for failures.
INVALID_TERM is ledgerd's addition for unbounded ledgers.

The server maps a storage exception to a status with :func:`status_for_error`; the
client turns a status back into an exception with :func:`error_for_status`. Both use
the single table ``STATUS_ERRORS``.
"""

from __future__ import annotations

import enum

from ledgerd.wire.errors import WireError

__all__ = [
    "STATUS_ERRORS",
    "BadRequestError",
    "BookieError",
    "BookieIOError",
    "FencedError",
    "InvalidTermError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "ReadOnlyError",
    "Status",
    "TlsRequiredError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnknownLedgerStateError",
    "VersionRejectedError",
    "error_for_status",
    "status_for_error",
]


class Status(enum.IntEnum):
    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    BAD_REQUEST = 100
    IO_ERROR = 101
    UNAUTHORIZED = 102
    UNSUPPORTED_VERSION = 103
    FENCED = 104
    READ_ONLY = 105
    TOO_MANY_REQUESTS = 106
    UNKNOWN_LEDGER_STATE = 107
    INVALID_TERM = 108
    TLS_REQUIRED = 109


class BookieError(WireError):
    """A bookie answered a request with a non-OK status (a valid answer, not a protocol
    error: neither side broke the protocol)."""

    status: Status = Status.BAD_REQUEST

    def __init__(self, message: str = "", *, ledger_id: int | None = None,
                 entry_id: int | None = None) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        where = ""
        if ledger_id is not None:
            where = f" (ledger {ledger_id}" + (f" entry {entry_id})" if entry_id is not None else ")")
        super().__init__((message or self.status.name.lower().replace("_", " ")) + where)


class NoSuchLedgerError(BookieError):
    status = Status.NO_SUCH_LEDGER


class NoSuchEntryError(BookieError):
    status = Status.NO_SUCH_ENTRY


class BadRequestError(BookieError):
    status = Status.BAD_REQUEST


class BookieIOError(BookieError):
    status = Status.IO_ERROR


class UnauthorizedError(BookieError):
    """The master key does not match the ledger's (wrong password) or admin access denied."""

    status = Status.UNAUTHORIZED


class VersionRejectedError(BookieError):
    status = Status.UNSUPPORTED_VERSION


class FencedError(BookieError):
    """The ledger is fenced on this bookie: a recovery has started, plain adds are refused."""

    status = Status.FENCED


class ReadOnlyError(BookieError):
    status = Status.READ_ONLY


class TooManyRequestsError(BookieError):
    status = Status.TOO_MANY_REQUESTS


class UnknownLedgerStateError(BookieError):
    status = Status.UNKNOWN_LEDGER_STATE


class InvalidTermError(BookieError):
    """The request's term is lower than the term the bookie holds for the ledger."""

    status = Status.INVALID_TERM


class TlsRequiredError(BookieError):
    """The bookie serves TLS connections only (``tls_required``): this one did not start
    TLS (the client has no ``tls_trust_path``)."""

    status = Status.TLS_REQUIRED


STATUS_ERRORS: dict[Status, type[BookieError]] = {
    cls.status: cls
    for cls in (
        NoSuchLedgerError, NoSuchEntryError, BadRequestError, BookieIOError, UnauthorizedError,
        VersionRejectedError, FencedError, ReadOnlyError, TooManyRequestsError,
        UnknownLedgerStateError, InvalidTermError, TlsRequiredError,
    )
}
assert set(STATUS_ERRORS) == set(Status) - {Status.OK}


def error_for_status(status: int, *, ledger_id: int | None = None,
                     entry_id: int | None = None, message: str = "") -> BookieError:
    """The exception a client raises for a non-OK ``status`` (unknown codes: BAD_REQUEST)."""
    try:
        cls = STATUS_ERRORS[Status(status)]
    except (ValueError, KeyError):
        return BadRequestError(f"unknown status {status}", ledger_id=ledger_id, entry_id=entry_id)
    return cls(message, ledger_id=ledger_id, entry_id=entry_id)


def status_for_error(exc: BaseException) -> Status:
    """The status a server answers with for ``exc`` (the table in reverse)."""
    if isinstance(exc, BookieError):
        return exc.status
    return Status.IO_ERROR if isinstance(exc, OSError) else Status.BAD_REQUEST
