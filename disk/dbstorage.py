"""The db engine: write cache, read-ahead cache, one LMDB index.

As BookKeeper's ``DbLedgerStorage``: an add is held in the write cache (readable at
once) and reaches the entry log only at a checkpoint, sorted by (ledger, entry), so a
ledger's entries lie together and a reader going forward reads them with few seeks.
The write cache has two halves: the one filling, and the one a checkpoint is writing
(``flushing``); past half the bound a checkpoint is asked for early, and an add that
finds the cache full is written through to the entry log. Locations go into one LMDB
index (``dbindex.DbLedgerCache``) committed once per checkpoint. A read that misses
both halves and the read-ahead cache reads the entry log, and, for a reader going
forward, the ledger's next stored entries with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from ledgerd.disk.dbindex import DbLedgerCache
from ledgerd.disk.entrylog import EntryLogger
from ledgerd.disk.entrystore import MetricRegistry, write_entry_logs
from ledgerd.disk.errors import StorageError
from ledgerd.disk.index import LedgerIndex
from ledgerd.disk.writecache import ReadAheadCache, WriteCache

__all__ = ["DbStore"]

READ_AHEAD_MAX_BYTES = 1 << 20  # one read-ahead reads at most this span of an entry log
LAST_READS_KEPT = 10_000  # ledgers whose last read entry is remembered (read-ahead)
FLUSH_YIELD_BYTES = 1 << 20  # a write-cache flush lets requests run after this many bytes
_END = (1 << 63) - 1


class DbStore:
    """Write cache, read-ahead and an LMDB index (``ledger_storage_class = "db"``)."""

    kind = "db"

    def __init__(self, entry_logger: EntryLogger, index_dirs: list[Path], *,
                 write_cache_max_bytes: int, read_cache_max_bytes: int,
                 read_ahead_batch: int) -> None:
        self.entry_logger = entry_logger
        self.cache = DbLedgerCache(index_dirs)
        self.flush_wanted: trio.Event | None = None
        self.write_cache = WriteCache()
        self.flushing: WriteCache | None = None  # the half a checkpoint is writing
        self._write_cache_half = max(1, write_cache_max_bytes // 2)
        self.read_cache = ReadAheadCache(read_cache_max_bytes)
        self.read_ahead_batch = read_ahead_batch
        self._last_reads: dict[int, int] = {}  # ledger -> the last entry read from disk
        self.write_cache_flushes = 0
        self.write_cache_flushed_bytes = 0
        self.write_through = 0  # adds that found the write cache full

    def check_dirs(self, index_dirs: Sequence[Path]) -> None:
        if any(next((d / "current").glob("*/*/*.idx"), None) is not None for d in index_dirs):
            raise StorageError(
                f"ledger_storage_class = 'db' but {index_dirs[0]} holds index files: convert "
                "with 'ledgerd shell convertstorage --to db' (bookie stopped), or set "
                "ledger_storage_class back")

    def load(self) -> None:
        self.cache.load_all()
        self.entry_logger.open()

    # -- writes ------------------------------------------------------------------------

    def insert(self, idx: LedgerIndex, first_entry_id: int, entries: Sequence[bytes],
               entry_ids: Sequence[int] | None = None) -> None:
        """Each entry into the write cache, or (the cache full) through to the entry log."""
        ledger_id = idx.ledger_id
        if len(entries) == 1:
            self._insert_one(ledger_id, first_entry_id if entry_ids is None else entry_ids[0],
                             entries[0])
            return
        ids = entry_ids if entry_ids is not None else range(
            first_entry_id, first_entry_id + len(entries))
        for eid, entry in zip(ids, entries, strict=True):
            self._insert_one(ledger_id, eid, entry)

    def _insert_one(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        """Hold the entry in the write cache; past half the cache, ask for an early
        checkpoint; a full cache writes the entry through."""
        wc = self.write_cache
        if wc.size >= self._write_cache_half:
            self.write_through += 1
            wc.discard(ledger_id, entry_id)
            location = self.entry_logger.add(ledger_id, entry)
            self.cache.set_location(ledger_id, entry_id, location)
            return
        wc.put(ledger_id, entry_id, entry if type(entry) is bytes else bytes(entry))
        self.cache.note_entry(ledger_id, entry_id)
        if wc.size >= self._write_cache_half // 2:
            wanted = self.flush_wanted
            if wanted is not None and not wanted.is_set():
                wanted.set()

    def truncate_after(self, ledger_id: int, last_kept: int) -> None:
        self.cache.truncate_after(ledger_id, last_kept)
        self.drop_cached(ledger_id, last_kept + 1)

    def trim_before(self, ledger_id: int, first_kept: int) -> int:
        self.drop_cached(ledger_id, 0, first_kept - 1)
        return self.cache.trim_before(ledger_id, first_kept)

    def delete(self, ledger_id: int) -> Path | None:
        path = self.cache.delete(ledger_id)
        self.drop_cached(ledger_id)
        return path

    def drop_cached(self, ledger_id: int, lo: int = 0, hi: int = _END) -> None:
        """Forget the ledger's entries ``lo``..``hi`` in the write and read-ahead caches."""
        self.write_cache.drop(ledger_id, lo, hi)
        if self.flushing is not None:
            self.flushing.drop(ledger_id, lo, hi)
        self.read_cache.drop(ledger_id, lo, hi)

    # -- reads -------------------------------------------------------------------------

    def fetch(self, ledger_id: int, entry_id: int, *, read_ahead: bool = True) -> bytes | None:
        """The write cache (the half filling, then the one being flushed), then the
        read-ahead cache, then the entry log, reading the ledger's next stored entries
        ahead for a reader going forward."""
        cache = self.cache
        idx = cache.ledgers.get(ledger_id)
        if idx is None or entry_id < 0 or entry_id > idx.last_entry_id \
                or entry_id < cache.trimmed.get(ledger_id, 0):
            return None
        data = self.write_cache.get(ledger_id, entry_id)
        if data is None and self.flushing is not None:
            data = self.flushing.get(ledger_id, entry_id)
        if data is not None:
            return data
        data = self.read_cache.get(ledger_id, entry_id)
        if data is not None:
            if ledger_id in self._last_reads:
                self._last_reads[ledger_id] = entry_id
            return data
        location = cache.location(ledger_id, entry_id)
        if not location:
            return None
        data = self.entry_logger.read(location)
        batch = self.read_ahead_batch
        # Read ahead only for a reader going forward (this miss follows its last read
        # of the ledger): a random reader would pay for entries it never asks for.
        last = self._last_reads
        sequential = last.pop(ledger_id, -2) == entry_id - 1
        last[ledger_id] = entry_id
        if len(last) > LAST_READS_KEPT:
            del last[next(iter(last))]
        if read_ahead and batch > 0 and sequential:
            following = cache.following(ledger_id, entry_id, batch)
            if following:
                put = self.read_cache.put
                # At most half the cache: a read-ahead must not push out its own
                # first entries before they are asked for.
                span = min(READ_AHEAD_MAX_BYTES, self.read_cache.max_bytes // 2)
                for eid, entry in self.entry_logger.read_ahead(location, following, span):
                    put(ledger_id, eid, entry)
        return data

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the entry is stored (the write caches, then the index), unread."""
        cache = self.cache
        idx = cache.ledgers.get(ledger_id)
        if idx is None or entry_id < 0 or entry_id > idx.last_entry_id \
                or entry_id < cache.trimmed.get(ledger_id, 0):
            return False
        if self.write_cache.get(ledger_id, entry_id) is not None or (
                self.flushing is not None
                and self.flushing.get(ledger_id, entry_id) is not None):
            return True
        return cache.location(ledger_id, entry_id) != 0

    def pages_missing(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> bool:
        return False  # locations are in LMDB's pages (memory-mapped)

    async def page_in(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> None:
        pass

    def start_services(self, nursery: trio.Nursery) -> None:
        pass

    async def deferred_applied_wait(self) -> None:
        pass

    # -- checkpoint --------------------------------------------------------------------

    def register_metrics(self, registry: MetricRegistry) -> None:
        """The db storage's caches and index store (BookKeeper's DbLedgerStorage
        stats: write cache size, flushes, read-ahead hits, index size)."""
        m, storage = registry, self
        db = storage.cache
        rc = storage.read_cache
        m.gauge("ledgerd_db_write_cache_bytes", "Entry bytes in the write cache (the half "
                "filling and the half being flushed).", lambda: float(
                    storage.write_cache.size
                    + (storage.flushing.size if storage.flushing is not None else 0)))
        m.gauge("ledgerd_db_write_cache_entries", "Entries in the write cache.",
                lambda: float(len(storage.write_cache)
                              + (len(storage.flushing) if storage.flushing is not None else 0)))
        m.counter("ledgerd_db_write_cache_flushes", "Write-cache flushes (one per "
                  "checkpoint with entries).", lambda: storage.write_cache_flushes)
        m.counter("ledgerd_db_write_cache_flushed_bytes", "Entry bytes flushed sorted "
                  "from the write cache to entry logs.",
                  lambda: storage.write_cache_flushed_bytes)
        m.counter("ledgerd_db_write_cache_full_adds", "Adds written straight to the entry "
                  "log because the write cache was full.", lambda: storage.write_through)
        m.counter("ledgerd_db_read_ahead_hits", "Reads served by the read-ahead cache.",
                  lambda: rc.hits)
        m.counter("ledgerd_db_read_ahead_misses", "Reads that missed the read-ahead "
                  "cache (and both write caches).", lambda: rc.misses)
        m.counter("ledgerd_db_read_ahead_entries", "Entries read ahead into the cache.",
                  lambda: rc.inserted)
        m.gauge("ledgerd_db_read_ahead_cache_bytes", "Bytes in the read-ahead cache.",
                lambda: float(rc.size))
        m.gauge("ledgerd_db_index_store_bytes", "Bytes of the index store (LMDB pages in "
                "use; LMDB reuses freed pages and runs no compactions).",
                lambda: float(db.store_bytes()))
        m.counter("ledgerd_db_index_commits", "Index store transactions (one per "
                  "checkpoint).", lambda: db.commits)
        m.counter("ledgerd_db_index_commit_seconds", "Time in index store transactions "
                  "(a worker thread).", lambda: db.commit_seconds)

    def is_flush_due(self) -> bool:
        return self.write_cache.size >= self._write_cache_half // 2

    def begin_checkpoint(self) -> None:
        """Everything journaled before the mark is in the filling half (or written
        through): swap it out before anything else can run."""
        flushing = self.write_cache
        self.write_cache = WriteCache()
        if self.flushing is not None:  # a failed flush left entries: keep order
            for lid, d in flushing.ledgers.items():
                for eid, data in d.items():
                    self.flushing.put(lid, eid, data)
        else:
            self.flushing = flushing

    async def flush(self) -> list[Path]:
        await self._flush_write_cache()
        await write_entry_logs(self.entry_logger)
        cache = self.cache
        job = cache.begin_write_out()
        paths = [cache.path] if job else []
        try:
            await trio.to_thread.run_sync(job.run)
        finally:
            cache.end_write_out(job)
        return paths

    async def wait_index_written(self) -> None:
        pass  # the commit holds its own copy of what it writes

    async def _flush_write_cache(self) -> None:
        """Write the ``flushing`` half into the entry log sorted by (ledger, entry),
        noting each location, then forget it. Requests run between 1 MiB chunks; an
        entry a truncate or delete dropped meanwhile (or its ledger, re-created) is
        skipped: each chunk takes only entries still held, by identity."""
        flushing = self.flushing
        if flushing is None:
            return
        if not flushing.count:
            self.flushing = None
            return
        cache = self.cache
        add_sorted = self.entry_logger.add_sorted
        held = flushing.ledgers
        items = [(lid, eid, data) for lid in sorted(held)
                 for eid, data in sorted(held[lid].items())]
        i, n = 0, len(items)
        while i < n:
            chunk: list[tuple[int, int, bytes]] = []
            nbytes = 0
            while i < n and nbytes < FLUSH_YIELD_BYTES:
                item = items[i]
                i += 1
                d = held.get(item[0])
                if d is not None and d.get(item[1]) is item[2]:
                    chunk.append(item)
                    nbytes += len(item[2])
            if chunk:
                locations = add_sorted(chunk)
                # Written entries stay readable in ``flushing`` (the same bytes) until
                # the end: dropping each one cost as much as writing it.
                cache.pending.update(zip([(lid, eid) for lid, eid, _data in chunk],
                                         locations, strict=True))
                self.write_cache_flushed_bytes += nbytes
            if i < n:
                await trio.sleep(0)
        self.flushing = None
        self.write_cache_flushes += 1
