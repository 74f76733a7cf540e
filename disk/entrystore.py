"""EntryStore: what ``LedgerStorage`` asks of a storage engine.

``LedgerStorage`` owns the journal, replay, the checkpoint's order and the ledgers'
state records (master key, fence, term, explicit LAC); where entry bytes live and how
they are found again is the engine's. Two engines, as BookKeeper's (``LedgerStorage``
with ``InterleavedLedgerStorage`` and ``DbLedgerStorage``):

- ``interleaved.InterleavedStore``: every add goes to the current entry log at once and
  its location into a per-ledger index file's page (``index.LedgerCache``).
- ``dbstorage.DbStore``: adds wait in a write cache and go to the entry log sorted by
  (ledger, entry) at each checkpoint; locations live in one LMDB index
  (``dbindex.DbLedgerCache``); sequential readers are served by a read-ahead cache.

Both write the same entry logs (``entrylog.EntryLogger``), so compaction and the
maintenance tools read either's logs. ``LedgerStorage`` picks one in its factory
(``storage.open_engine``); nothing else asks which one it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import trio

from ledgerd.disk.dbindex import DbLedgerCache
from ledgerd.disk.entrylog import EntryLogger
from ledgerd.disk.index import LedgerCache, LedgerIndex

__all__ = ["EntryStore", "write_entry_logs"]


class MetricRegistry(Protocol):
    """Where an engine registers its own gauges and counters (the bookie's metrics)."""

    def gauge(self, name: str, doc: str, fn: Callable[[], float]) -> None: ...

    def counter(self, name: str, doc: str, fn: Callable[[], float]) -> None: ...


class EntryStore(Protocol):
    """A storage engine: entry bytes and their locations, below ``LedgerStorage``.

    The ledger state (``LedgerIndex``: key, fence, term, LACs) lives in ``cache``, which
    ``LedgerStorage`` reads and marks dirty; the engine persists it with the locations.
    """

    kind: str  # "interleaved" or "db", as ``ledger_storage_class`` names it
    entry_logger: EntryLogger

    @property
    def cache(self) -> LedgerCache | DbLedgerCache:
        """The ledgers' state records and the entries' locations."""

    # Set by the checkpoint loop each round; the engine sets it when it wants a
    # checkpoint sooner than the interval (the db engine's write cache half full).
    flush_wanted: trio.Event | None

    def check_dirs(self, index_dirs: Sequence[Path]) -> None:
        """Raise StorageError if the directories hold the other engine's index."""

    def load(self) -> None:
        """Load the index headers and open the entry logs (a worker thread)."""

    def insert(self, idx: LedgerIndex, first_entry_id: int, entries: Sequence[bytes],
               entry_ids: Sequence[int] | None = None) -> None:
        """Store a run of entries of one ledger, readable at once: consecutive from
        ``first_entry_id``, or with ``entry_ids`` (ascending, one per entry)."""

    def fetch(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True) -> bytes | None:
        """An entry's bytes, or None if not stored here."""

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the entry is stored here, without reading its bytes."""

    def is_flush_due(self) -> bool:
        """True when the engine wants a checkpoint now rather than at the interval."""

    def begin_checkpoint(self) -> None:
        """On the loop, right after the checkpoint captured the journal's mark: set
        aside what the flush must write (everything inserted before the mark)."""

    async def flush(self) -> list[Path]:
        """Write and sync the entry logs, then write the index; returns the index
        files to sync. Raises OSError (ENOSPC: the caller says which directory)."""

    async def wait_index_written(self) -> None:
        """Return once no checkpoint is writing index pages (a delete must not race it)."""

    def truncate_after(self, ledger_id: int, last_kept: int) -> None: ...

    def trim_before(self, ledger_id: int, first_kept: int) -> int: ...

    def delete(self, ledger_id: int) -> Path | None:
        """Forget the ledger; returns its index file for the caller to unlink, if any."""

    def pages_missing(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> bool:
        """True when reading these entries would read index pages from a file."""

    async def page_in(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> None:
        """Read the index pages these entries need in a worker thread."""

    def start_services(self, nursery: trio.Nursery) -> None:
        """Start the engine's background tasks (the interleaved page-in reader)."""

    def register_metrics(self, registry: MetricRegistry) -> None:
        """Register the engine's own gauges and counters (the db engine's caches and
        index store); the ledger cache's are the bookie's, for both."""

    async def deferred_applied_wait(self) -> None:
        """Return once no add's index location waits for its page."""


async def write_entry_logs(logger: EntryLogger) -> None:
    """Hand the entry logs' buffers over on the loop, write and fsync them in a worker."""
    logs = logger.write_out()
    await trio.to_thread.run_sync(logger.sync, logs)
    logger.release(logs)
