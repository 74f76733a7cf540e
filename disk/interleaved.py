"""The interleaved engine: entry logs + per-ledger index files + the ledger cache.

As BookKeeper's ``InterleavedLedgerStorage``: every add is appended to the current entry
log (entries of all ledgers interleaved) and its location written into the ledger's
index page in memory (``index.LedgerCache``), so it is readable at once. A checkpoint
writes and syncs the entry logs first, then the dirty index pages: an index never points
at bytes that are not durable.

Index pages missing from memory are never read on the event loop by adds: the location
waits aside (``LedgerCache.deferred``) and ``_page_in_loop`` reads the pages in a worker
thread; reads ask ``pages_missing`` and ``page_in`` first for the same reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from ledgerd.disk.dbindex import DB_DIR
from ledgerd.disk.entrylog import EntryLogger
from ledgerd.disk.entrystore import MetricRegistry, write_entry_logs
from ledgerd.disk.errors import StorageError
from ledgerd.disk.fdcache import FdCache
from ledgerd.disk.index import LedgerCache, LedgerIndex

__all__ = ["InterleavedStore"]


class InterleavedStore:
    """Entry logs and index files (``ledger_storage_class = "interleaved"``)."""

    kind = "interleaved"

    def __init__(self, entry_logger: EntryLogger, index_dirs: list[Path], *, page_size: int,
                 page_limit: int, fds: FdCache) -> None:
        self.entry_logger = entry_logger
        self.cache = LedgerCache(index_dirs, page_size=page_size, page_limit=page_limit,
                                 fds=fds)
        self.flush_wanted: trio.Event | None = None
        self.deferred_applied = 0  # page-in passes for adds' deferred locations
        self._deferred_done = trio.Event()  # set (and replaced) when none are left
        self._index_writing: trio.Event | None = None  # a checkpoint's index write runs

    def check_dirs(self, index_dirs: Sequence[Path]) -> None:
        if any((d / "current" / DB_DIR / "data.mdb").exists() for d in index_dirs):
            raise StorageError(
                f"ledger_storage_class = 'interleaved' but {index_dirs[0]} holds a db index "
                "(ledgers.lmdb): convert with 'ledgerd shell convertstorage --to "
                "interleaved' (bookie stopped), or set ledger_storage_class back")

    def load(self) -> None:
        self.cache.load_all()
        self.entry_logger.open()

    # -- writes and reads --------------------------------------------------------------

    def insert(self, idx: LedgerIndex, first_entry_id: int, entries: Sequence[bytes],
               entry_ids: Sequence[int] | None = None) -> None:
        """The entry log takes the run in one append; the index takes each consecutive
        run at once (a single entry takes the cheaper one-record path)."""
        ledger_id = idx.ledger_id
        if len(entries) == 1:
            location = self.entry_logger.add(ledger_id, entries[0])
            self.cache.set_location(ledger_id, first_entry_id if entry_ids is None
                                    else entry_ids[0], location)
            return
        locations = self.entry_logger.add_many(ledger_id, entries)
        if entry_ids is None:
            self.cache.set_locations(ledger_id, first_entry_id, locations)
        else:
            self.cache.set_sparse_locations(ledger_id, entry_ids, locations)

    def fetch(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True) -> bytes | None:
        location = self.cache.location(ledger_id, entry_id)
        return self.entry_logger.read(location) if location else None

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        return self.cache.location(ledger_id, entry_id) != 0

    def truncate_after(self, ledger_id: int, last_kept: int) -> None:
        self.cache.truncate_after(ledger_id, last_kept)

    def trim_before(self, ledger_id: int, first_kept: int) -> int:
        return self.cache.trim_before(ledger_id, first_kept)

    def delete(self, ledger_id: int) -> Path | None:
        return self.cache.delete(ledger_id)

    # -- checkpoint --------------------------------------------------------------------

    def register_metrics(self, registry: MetricRegistry) -> None:
        """Nothing of its own: the ledger cache's counters are the bookie's."""

    def is_flush_due(self) -> bool:
        return False

    def begin_checkpoint(self) -> None:
        pass

    async def flush(self) -> list[Path]:
        await write_entry_logs(self.entry_logger)
        # Pages are copied on the loop and written by a worker: writing them on the
        # loop held it for milliseconds a checkpoint with many busy ledgers.
        cache = self.cache
        job = cache.begin_write_out()
        self._index_writing = trio.Event()
        try:
            await trio.to_thread.run_sync(job.run)
        finally:
            cache.end_write_out(job)
            self._index_writing.set()
            self._index_writing = None
        return job.paths

    async def wait_index_written(self) -> None:
        while self._index_writing is not None:  # its pages may be in that write
            await self._index_writing.wait()

    # -- index pages -------------------------------------------------------------------

    def pages_missing(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> bool:
        return bool(self.cache.missing_pages(ledger_id, first_entry_id, last_entry_id))

    async def page_in(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> None:
        """Read the pages in a worker thread and cache them. A page a checkpoint or
        eviction wrote meanwhile is left to the synchronous path."""
        cache = self.cache
        pages = cache.missing_pages(ledger_id, first_entry_id, last_entry_id)
        idx = cache.ledgers.get(ledger_id)
        if not pages or idx is None:
            return
        seen = idx.file_writes
        data = await trio.to_thread.run_sync(cache.read_pages, idx.path, pages)
        cache.install_pages(idx, data, seen)

    def start_services(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._page_in_loop)

    async def deferred_applied_wait(self) -> None:
        cache = self.cache
        while cache.deferred and cache.defer_misses:
            await self._deferred_done.wait()

    async def _page_in_loop(self) -> None:
        """Adds whose index page is not in memory leave the location aside
        (``LedgerCache.deferred``); this task reads those pages in a worker thread and
        writes the locations into them, so no add waits for an index read on the event
        loop. A page written to its file meanwhile is read again on the loop."""
        cache = self.cache
        wanted = trio.Event()
        cache.on_deferred = wanted.set
        cache.defer_misses = True
        try:
            while True:
                await wanted.wait()
                wanted = trio.Event()
                cache.on_deferred = wanted.set
                while cache.deferred:
                    work = cache.deferred_pages()
                    seen = {lid: idx.file_writes for lid, (idx, _pages) in work.items()}

                    def read_all(work: dict[int, tuple[LedgerIndex, list[int]]] = work
                                 ) -> dict[int, dict[int, bytes]]:
                        return {lid: cache.read_pages(idx.path, pages)
                                for lid, (idx, pages) in work.items() if pages}

                    pages = await trio.to_thread.run_sync(read_all)
                    for lid, (idx, _pages) in work.items():
                        if lid in pages:
                            cache.install_pages(idx, pages[lid], seen[lid])
                        cache.apply_deferred(lid)
                    self.deferred_applied += 1
                    await trio.sleep(0)
                self._deferred_done.set()
                self._deferred_done = trio.Event()
        finally:
            cache.defer_misses = False
            cache.on_deferred = None
