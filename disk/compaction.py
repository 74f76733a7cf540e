"""Entry-log garbage collection and compaction.

A rolled entry log holds entries of many ledgers. Its *ledgers map* (written at roll, or
rebuilt by scanning a log that never rolled) says how many bytes each ledger has in it.
A ledger is live while its index exists here: the appliance's ledger GC deletes the index
of every ledger that the metadata store no longer has, so this module needs no metadata.
An unbounded ledger trimmed from the front (``LedgerCache.trim_before``) is dead in every
log whose last entry of it lies below its first kept entry (the map records each
ledger's last entry id per log); a log that straddles the trim point counts it live.

- A log whose ledgers are all gone is deleted.
- A log whose live fraction is under the threshold is compacted, crash-safely as
  BookKeeper's ``EntryLogCompactor``: live entries (those the index still points at in
  this log) are re-appended to the current log, a checkpoint makes the copies durable,
  the index is pointed at the copies, a second checkpoint makes the index durable, and
  only then is the old log deleted. A crash at any point leaves at worst orphan copies.
  Copies go in batches of ``max_outstanding`` (each made durable and indexed before the
  next), at most ``rate_entries`` entries and ``rate_bytes`` bytes per second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import trio

from ledgerd.base.crashpoints import crash_point
from ledgerd.base.logs import fields
from ledgerd.disk.dbindex import DbLedgerCache
from ledgerd.disk.entrylog import (
    ENTRY_LOG_HEADER_SIZE,
    EntryLogger,
    EntryLogMeta,
    read_entry_log_meta,
    read_records,
)
from ledgerd.disk.errors import DiskFullError
from ledgerd.disk.index import LedgerCache
from ledgerd.wire.entry import entry_ids

__all__ = ["CompactedStorage", "CompactionLimits", "CompactionProgress", "CompactionResult",
           "EntryLogMeta", "compact_entry_logs", "read_entry_log_meta", "read_records"]

log = logging.getLogger(__name__)


class CompactedStorage(Protocol):
    """What compaction needs of the storage it compacts (``storage.LedgerStorage``):
    its entry logs, its index, checkpoints, and the removal of a log."""

    entry_logger: EntryLogger
    compacting: bool  # set while compaction's index checkpoint runs (a crash point)

    @property
    def cache(self) -> LedgerCache | DbLedgerCache: ...

    async def rolled_log_metas(self) -> list[EntryLogMeta]: ...

    async def checkpoint(self, *, sync_index_dirs: bool = False) -> object: ...

    async def sync_unlinked_dirs(self) -> None: ...

    async def remove_entry_log(self, log_id: int) -> None: ...


@dataclass
class CompactionResult:
    logs_deleted: list[int] = field(default_factory=list)
    logs_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0
    stopped: str = ""  # why the pass stopped early ("" if it did not)


@dataclass
class CompactionProgress:
    """What a running pass is doing, for status and ``ledgerd shell gc --wait``."""

    phase: str = "idle"  # idle, deleting, compacting
    logs_total: int = 0
    logs_done: int = 0
    current_log: int = -1
    entries_moved: int = 0
    bytes_moved: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionLimits:
    rate_entries: int = 0          # entries re-appended per second (0: unthrottled)
    rate_bytes: int = 0            # bytes re-appended per second (0: unthrottled)
    max_outstanding: int = 100000  # copies before they are flushed and indexed
    max_logs: int = 0              # logs compacted per pass (0: all candidates)


async def compact_entry_logs(storage: CompactedStorage, *, threshold: float,
                             rate: int = 0, max_logs: int = 0,
                             limits: CompactionLimits | None = None,
                             progress: CompactionProgress | None = None) -> CompactionResult:
    """Delete dead rolled logs; compact those whose live fraction is below ``threshold``
    (0 deletes only), lowest usage first, within ``limits`` (``rate``/``max_logs`` are
    shorthands for its entry rate and log count).

    The crash-safe order (docs/storage-format.md): a checkpoint makes every index change
    that killed entries durable before any log is unlinked; copies are made durable
    (checkpoint) before the index points at them, and the index is durable (second
    checkpoint) before the old log goes. A crash anywhere leaves at worst orphan copies,
    which the next compaction of their log drops as dead.
    """
    limits = limits or CompactionLimits(rate_entries=rate, max_logs=max_logs)
    progress = progress if progress is not None else CompactionProgress()
    result = CompactionResult()
    logger = storage.entry_logger
    metas = await storage.rolled_log_metas()
    live, trimmed = storage.cache.ledgers, storage.cache.trimmed
    dead = [m for m in metas if m.live_bytes(live, trimmed) == 0]
    if dead:
        progress.phase = "deleting"
        # Index files unlinked and entries trimmed since the last checkpoint must be
        # durably gone before the logs they pointed into are.
        try:
            await storage.checkpoint(sync_index_dirs=True)
        except DiskFullError as exc:
            # Deleting dead logs is how a full disk gets room back. The unlinks only
            # need their directories synced; a trim needs the index written, so logs
            # of trimmed ledgers wait for room.
            await storage.sync_unlinked_dirs()
            dead = [m for m in dead if not any(lid in live for lid in m.ledgers)]
            result.stopped = f"ledger directory full: {exc}"
        crash_point("gc.deleting_logs")
        for meta in dead:
            await storage.remove_entry_log(meta.log_id)
            result.logs_deleted.append(meta.log_id)
            result.bytes_reclaimed += meta.total_bytes
    gone = set(result.logs_deleted)
    candidates = sorted((m for m in metas if m.log_id not in gone
                         and m.usage(live, trimmed) < threshold),
                        key=lambda m: m.usage(live, trimmed))[: limits.max_logs or None]
    progress.phase, progress.logs_total, progress.logs_done = "compacting", len(candidates), 0
    try:
        for meta in candidates:
            progress.current_log = meta.log_id
            if result.stopped:
                break
            try:
                moved, nbytes = await _compact_one(storage, meta, limits, progress)
            except DiskFullError as exc:
                # The copies made so far are orphans in the current log (the old log
                # still has every entry and the index still points there); the next
                # pass compacts again once there is room.
                result.stopped = f"ledger directory full: {exc}"
                log.warning("compaction_stopped_disk_full", extra=fields(
                    log=f"{meta.log_id:x}", error=str(exc)))
                break
            result.logs_compacted.append(meta.log_id)
            result.entries_moved += moved
            result.bytes_moved += nbytes
            result.bytes_reclaimed += meta.total_bytes - nbytes
            progress.logs_done += 1
            log.info("entry_log_compacted", extra=fields(
                log=f"{meta.log_id:x}", moved=moved, bytes=nbytes,
                current=f"{logger.current_log_id:x}"))
    finally:
        progress.phase, progress.current_log = "idle", -1
    return result


async def _compact_one(storage: CompactedStorage, meta: EntryLogMeta, limits: CompactionLimits,
                       progress: CompactionProgress) -> tuple[int, int]:
    """Copy one log's live entries (in batches of ``max_outstanding``: copies made
    durable, then indexed), make the index durable, then unlink the log."""
    path = storage.entry_logger.paths[meta.log_id]
    base = meta.log_id << 32
    batch: list[tuple[int, int, int, int]] = []
    moved = nbytes = 0
    offset = ENTRY_LOG_HEADER_SIZE
    chunk = 1 << 20
    pace = _Pace(limits)
    while offset:
        records, offset = await trio.to_thread.run_sync(read_records, path, offset, chunk)
        cache = storage.cache
        for rec_off, body in records:
            lid, eid = entry_ids(body)
            old = base | rec_off
            if cache.get(lid) is None or cache.location(lid, eid) != old:
                continue
            new = storage.entry_logger.add(lid, body)
            batch.append((lid, eid, old, new))
            moved += 1
            nbytes += len(body) + 8
            progress.entries_moved += 1
            progress.bytes_moved += len(body) + 8
            await pace.copied(len(body) + 8)
            if len(batch) >= limits.max_outstanding:
                await _index_copies(storage, batch)
                batch = []
        if moved:
            crash_point("compaction.copying")
        await trio.sleep(0)
    await _index_copies(storage, batch)
    storage.compacting = True
    try:
        await storage.checkpoint()  # the index points at the copies durably
    finally:
        storage.compacting = False
    crash_point("compaction.deleting")
    await storage.remove_entry_log(meta.log_id)
    return moved, nbytes


async def _index_copies(storage: CompactedStorage, batch: list[tuple[int, int, int, int]]) -> None:
    """Make copies durable, then point the index at those still current."""
    if not batch:
        return
    await storage.checkpoint()  # the copies are durable
    crash_point("compaction.copied")
    cache = storage.cache
    for lid, eid, old, new in batch:
        if cache.get(lid) is not None and cache.location(lid, eid) == old:
            cache.set_location(lid, eid, new)


class _Pace:
    """Holds compaction to its entry and byte rates, sleeping in short steps."""

    def __init__(self, limits: CompactionLimits) -> None:
        self.entries_per_s = limits.rate_entries
        self.bytes_per_s = limits.rate_bytes
        self.start = trio.current_time()
        self.entries = 0
        self.bytes = 0

    async def copied(self, nbytes: int) -> None:
        self.entries += 1
        self.bytes += nbytes
        due = 0.0
        if self.entries_per_s:
            due = self.entries / self.entries_per_s
        if self.bytes_per_s:
            due = max(due, self.bytes / self.bytes_per_s)
        wait = self.start + due - trio.current_time()
        if wait > 0.005:
            await trio.sleep(wait)
