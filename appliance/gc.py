"""The garbage collector service: ledger GC against the metadata store, then entry logs.

Every ``gc_wait_time_ms`` (or when an admin asks):
1. Ledgers this bookie holds but the metadata store no longer has are deleted here. The
   local list is taken *before* the metadata scan: a ledger's metadata exists before its
   first add, so a ledger missing from a later scan was deleted, not just created. Each
   candidate is checked once more on its own before deletion; a failed scan deletes
   nothing.
2. Entry logs: dead ones are deleted; a minor compaction (threshold
   ``minor_compaction_threshold``) or major one (``major_compaction_threshold``) runs when
   its interval has passed or an admin forced it. With the disks full, major compaction
   is suspended and minor runs only if forced (compaction needs room to copy into).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from disk.compaction import compact_entry_logs
from disk.storage import LedgerStorage
from ledgerd.base.logs import fields
from metadata.ledgers import LedgerManager
from wire.messages import AdminKind

__all__ = ["GarbageCollector", "GcOptions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GcOptions:
    wait_s: float = 600.0
    minor_interval_s: float = 3600.0
    minor_threshold: float = 0.2
    major_interval_s: float = 86400.0
    major_threshold: float = 0.8
    rate: int = 1000


class GarbageCollector:
    def __init__(self, storage: LedgerStorage, ledgers: LedgerManager | None,
                 options: GcOptions, *, disk_full: Callable[[], bool] = lambda: False) -> None:
        self.storage = storage
        self.ledgers = ledgers
        self.options = options
        self.disk_full = disk_full
        self._wake = trio.Event()
        self._forced: AdminKind | None = None
        self.running = False
        self.passes = 0
        self.ledgers_deleted = 0
        self.logs_deleted = 0
        self.logs_compacted = 0
        self.entries_moved = 0
        self.last_minor = 0.0
        self.last_major = 0.0
        self.pass_done = trio.Event()

    def trigger(self, kind: AdminKind) -> bool:
        """Ask for a pass now (``kind`` forces that compaction); False if one is running."""
        if self._forced is None or kind > self._forced:
            self._forced = kind
        self._wake.set()
        return not self.running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        now = trio.current_time()
        self.last_minor = self.last_major = now
        task_status.started()
        while True:
            with trio.move_on_after(self.options.wait_s):
                await self._wake.wait()
            self._wake = trio.Event()
            forced, self._forced = self._forced, None
            await self.gc_once(forced)

    async def gc_once(self, forced: AdminKind | None = None) -> None:
        self.running = True
        try:
            deleted = await self._gc_ledgers()
            threshold = self._compaction_threshold(forced)
            result = await compact_entry_logs(self.storage, threshold=threshold,
                                              rate=self.options.rate)
        finally:
            self.running = False
        self.passes += 1
        self.ledgers_deleted += deleted
        self.logs_deleted += len(result.logs_deleted)
        self.logs_compacted += len(result.logs_compacted)
        self.entries_moved += result.entries_moved
        log.info("gc_pass", extra=fields(
            ledgers_deleted=deleted, logs_deleted=len(result.logs_deleted),
            logs_compacted=len(result.logs_compacted), entries_moved=result.entries_moved,
            threshold=threshold))
        self.pass_done.set()
        self.pass_done = trio.Event()

    def _compaction_threshold(self, forced: AdminKind | None) -> float:
        o = self.options
        now = trio.current_time()
        full = self.disk_full()
        if not full and (forced == AdminKind.MAJOR_COMPACTION or (
                o.major_interval_s > 0 and now - self.last_major >= o.major_interval_s)):
            self.last_major = self.last_minor = now
            return o.major_threshold
        if forced == AdminKind.MINOR_COMPACTION or (not full and o.minor_interval_s > 0
                                                    and now - self.last_minor >= o.minor_interval_s):
            self.last_minor = now
            return o.minor_threshold
        return 0.0

    async def _gc_ledgers(self) -> int:
        if self.ledgers is None:
            return 0
        local = set(self.storage.list_ledgers())
        if not local:
            return 0
        live: set[int] = set()
        async for lid in self.ledgers.iter_ledger_ids():
            live.add(lid)
        deleted = 0
        for lid in sorted(local - live):
            if await self.ledgers.exists(lid):
                continue
            await self.storage.delete_ledger(lid)
            deleted += 1
            log.info("ledger_garbage_collected", extra=fields(ledger_id=lid))
        return deleted
