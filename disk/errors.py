"""Errors of the disk package: one root, leaves that say what and where."""

from __future__ import annotations

from ledgerd.base.errors import LedgerdError

__all__ = [
    "CookieMismatchError",
    "CorruptRecordError",
    "DiskFullError",
    "EntryNotFoundError",
    "LedgerNotFoundError",
    "StorageClosedError",
    "StorageError",
]


class StorageError(LedgerdError):
    """Root of every storage failure."""


class CorruptRecordError(StorageError):
    """A persisted record failed its checks where a torn tail cannot explain it."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"corrupt record in {path} at offset {offset}: {reason}")


class CookieMismatchError(StorageError):
    """A directory's cookie disagrees with the configuration or the cluster."""


class DiskFullError(StorageError):
    """A write failed for lack of space; nothing acknowledged was lost."""

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        super().__init__(f"no space left writing {path}: {detail}")


class StorageClosedError(StorageError):
    """The storage (or journal) was closed or has failed; it takes no more writes."""


class LedgerNotFoundError(StorageError):
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} is not stored here")


class EntryNotFoundError(StorageError):
    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        super().__init__(f"entry {entry_id} of ledger {ledger_id} is not stored here")
