"""What the client raises: one root, ``LedgerdError``, and leaves named for what happened.

Bookie statuses arrive as ``wire.status.BookieError`` subclasses (UnauthorizedError,
NoSuchLedgerError, ...); metadata failures as ``metadata.errors.MetadataError``. The
classes here are the client's own decisions: the handle is dead because the ledger was
fenced or closed under it, a read found no replica that could serve it, and so on.
"""

from __future__ import annotations

from ledgerd.machines.placement import NotEnoughBookiesError

__all__ = [
    "BadPasswordError",
    "ClientClosedError",
    "EntryUnavailableError",
    "LedgerClosedError",
    "LedgerFencedError",
    "LedgerHandleError",
    "LedgerRecoveryError",
    "LedgerdError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ReadBeyondLacError",
    "single_exception",
]


class LedgerdError(Exception):
    """Root of the client's own errors."""


class LedgerHandleError(LedgerdError):
    """A write handle failed; every pending and later append fails with it."""

    def __init__(self, ledger_id: int, reason: str) -> None:
        super().__init__(f"ledger {ledger_id}: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason


class LedgerFencedError(LedgerHandleError):
    """Another client fenced the ledger (it is being recovered): this writer is done."""


class LedgerClosedError(LedgerHandleError):
    """The ledger is CLOSED (by another client, or by this one with a different end)."""


class BadPasswordError(LedgerdError):
    """The password does not match the one the ledger was created with."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"ledger {ledger_id}: wrong password (UNAUTHORIZED)")
        self.ledger_id = ledger_id


class NoSuchLedgerError(LedgerdError):
    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"ledger {ledger_id} does not exist")
        self.ledger_id = ledger_id


class EntryUnavailableError(LedgerdError):
    """No replica of an entry could serve it (each failure is listed)."""

    def __init__(self, ledger_id: int, entry_id: int, failures: list[str]) -> None:
        super().__init__(f"ledger {ledger_id} entry {entry_id}: no replica could serve it "
                         f"({'; '.join(failures) or 'no replicas'})")
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.failures = failures


class ReadBeyondLacError(LedgerdError):
    """A read asked for entries past the last confirmed one."""

    def __init__(self, ledger_id: int, last: int, lac: int) -> None:
        super().__init__(f"ledger {ledger_id}: cannot read up to entry {last}, the last "
                         f"confirmed entry is {lac}")
        self.ledger_id = ledger_id


class LedgerRecoveryError(LedgerdError):
    """Recovery could not finish (it can be retried; the ledger stays IN_RECOVERY)."""

    def __init__(self, ledger_id: int, reason: str) -> None:
        super().__init__(f"ledger {ledger_id}: recovery failed: {reason}")
        self.ledger_id = ledger_id
        self.reason = reason


class ClientClosedError(LedgerdError):
    """The client was closed; nothing more can be sent."""


def single_exception(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (what a trio
    nursery wraps an application's own error in), or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
