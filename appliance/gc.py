"""The garbage collector service: ledger GC against the metadata store, then entry logs.

Every ``gc_wait_time_ms`` (or when an admin asks):
1. Ledgers this bookie holds but the metadata store no longer has are deleted here. The
   local list is taken *before* the metadata scan: a ledger's metadata exists before its
   first add, so a ledger missing from a later scan was deleted, not just created. A
   ledger is deleted only when two passes in a row find it missing, the metadata
   trusted in both; each such candidate is checked once more on its own just before
   deletion. A pass that finds the metadata untrusted, or whose scan fails, deletes
   nothing and forgets what the pass before suspected, so the two passes must be
   consecutive *and* both trusted. (One pass is not enough: a root deleted recursively,
   as kazoo's or zkCli's recursive delete does, loses its ledgers' znodes before, in no
   fixed order, the LAYOUT and INSTANCEID the guard below checks. A pass running
   meanwhile sees live ledgers gone while the metadata still looks whole; it only
   suspects them, and by the next pass the LAYOUT is gone too, so the guard stops it.)
   The suspects live in memory: a restarted bookie starts with none, so its first pass
   deletes no ledger. What the rule cannot cover: a recursive delete slower than the
   time between two passes (``gc_wait_time_ms``, or two admin triggers back to back)
   spans both (5,000 ledgers under 1 s passes: 2,243 survived). So whatever deletes a
   root deletes its LAYOUT first (``metadata.cluster.delete_root``, ``metaformat``,
   ``restore --replace``; an operator with zkCli by hand): every pass is then frozen
   before any ledger znode goes.
   Unbounded ledgers (a term above 0 here) whose metadata starts past entry 0 had front
   fragments deleted for retention: their entries below the start are dropped here.
   Nothing is deleted while the metadata cannot be trusted to list every ledger
   (``metadata_guard``): the root's LAYOUT or INSTANCEID is gone (ZooKeeper lost or
   wiped), the instance id is not the one this bookie's cookie names (a cluster
   re-initialised after a loss), or ``<root>/gcfreeze`` is set (metadata restored or
   rebuilt and not yet confirmed by an operator). The guard is checked before the scan
   and again before each deletion.
2. Entry logs: dead ones are deleted; a minor compaction (threshold
   ``minor_compaction_threshold``) or major one (``major_compaction_threshold``) runs when
   its interval has passed or an admin forced it. With the disks full, major compaction
   is suspended and minor runs only if forced (compaction needs room to copy into).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from ledgerd.base.crashpoints import crash_point
from ledgerd.base.logs import fields
from ledgerd.disk.compaction import CompactionLimits, CompactionProgress, compact_entry_logs
from ledgerd.disk.storage import LedgerStorage
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.wire.messages import AdminKind

__all__ = ["GarbageCollector", "GcOptions", "GcPass"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class GcOptions:
    wait_s: float = 600.0
    minor_interval_s: float = 3600.0
    minor_threshold: float = 0.2
    major_interval_s: float = 86400.0
    major_threshold: float = 0.8
    rate: int = 1000
    rate_bytes: int = 0
    max_outstanding: int = 100000


@dataclass
class GcPass:
    """One pass, as ``status()["gc"]`` reports it (the running one or the last)."""

    number: int = 0
    kind: str = ""  # gc, minor, major
    phase: str = "idle"  # ledgers, trimming, deleting, compacting, done
    started: float = 0.0  # wall clock
    seconds: float = 0.0
    ledgers_deleted: int = 0
    entries_trimmed: int = 0
    logs_deleted: int = 0
    logs_compacted: int = 0
    logs_to_compact: int = 0
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0
    stopped: str = ""
    error: str = ""
    progress: CompactionProgress = field(default_factory=CompactionProgress)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["progress"]
        if self.phase in ("deleting", "compacting"):
            p = self.progress
            out.update(logs_compacted=p.logs_done, logs_to_compact=p.logs_total,
                       entries_moved=p.entries_moved, bytes_moved=p.bytes_moved)
        return out


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
        self.entries_trimmed = 0
        self.bytes_reclaimed = 0
        self.seconds_total = 0.0
        self.current: GcPass | None = None
        self.last: GcPass | None = None
        self.last_minor = 0.0
        self.last_major = 0.0
        self.pass_done = trio.Event()
        self.instance_id = ""  # the cluster instance this bookie's cookie names
        self.frozen = ""  # why the last pass deleted no ledger ("" when it could)
        # Ledgers the last pass found missing from a trusted metadata scan: the next
        # pass deletes those it finds missing too (the two-pass rule, module doc).
        self.suspects: frozenset[int] = frozenset()

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

    async def gc_once(self, forced: AdminKind | None = None) -> GcPass:
        o = self.options
        threshold, kind = self._compaction_threshold(forced)
        p = GcPass(number=self.passes + 1, kind=kind, started=time.time())
        self.current, self.running = p, True
        t0 = trio.current_time()
        try:
            p.phase = "ledgers"
            p.ledgers_deleted = await self._gc_ledgers()
            p.phase = "trimming"
            p.entries_trimmed = await self._trim_ledgers()
            p.phase = "compacting"
            result = await compact_entry_logs(
                self.storage, threshold=threshold, progress=p.progress,
                limits=CompactionLimits(rate_entries=o.rate, rate_bytes=o.rate_bytes,
                                        max_outstanding=o.max_outstanding))
            p.logs_deleted, p.logs_compacted = len(result.logs_deleted), len(result.logs_compacted)
            p.logs_to_compact = p.progress.logs_total
            p.entries_moved, p.bytes_moved = result.entries_moved, result.bytes_moved
            p.bytes_reclaimed, p.stopped = result.bytes_reclaimed, result.stopped
        except Exception as exc:
            p.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            p.phase = "done"
            p.seconds = trio.current_time() - t0
            self.running, self.current, self.last = False, None, p
            self.passes += 1
            self.ledgers_deleted += p.ledgers_deleted
            self.entries_trimmed += p.entries_trimmed
            self.logs_deleted += p.logs_deleted
            self.logs_compacted += p.logs_compacted
            self.entries_moved += p.entries_moved
            self.bytes_reclaimed += p.bytes_reclaimed
            self.seconds_total += p.seconds
            self.pass_done.set()
            self.pass_done = trio.Event()
        log.info("gc_pass", extra=fields(
            kind=kind, ledgers_deleted=p.ledgers_deleted, entries_trimmed=p.entries_trimmed,
            logs_deleted=p.logs_deleted, logs_compacted=p.logs_compacted,
            entries_moved=p.entries_moved, bytes_reclaimed=p.bytes_reclaimed,
            seconds=round(p.seconds, 3), threshold=threshold, stopped=p.stopped))
        return p

    def status(self) -> dict[str, Any]:
        return {"running": self.running, "passes": self.passes, "frozen": self.frozen,
                "suspects": len(self.suspects),
                "ledgers_deleted": self.ledgers_deleted,
                "entries_trimmed": self.entries_trimmed,
                "logs_deleted": self.logs_deleted, "logs_compacted": self.logs_compacted,
                "entries_moved": self.entries_moved, "bytes_reclaimed": self.bytes_reclaimed,
                "current": self.current.to_json() if self.current else None,
                "last": self.last.to_json() if self.last else None}

    def _compaction_threshold(self, forced: AdminKind | None) -> tuple[float, str]:
        o = self.options
        now = trio.current_time()
        full = self.disk_full()
        if not full and (forced == AdminKind.MAJOR_COMPACTION or (
                o.major_interval_s > 0 and now - self.last_major >= o.major_interval_s)):
            self.last_major = self.last_minor = now
            return o.major_threshold, "major"
        if forced == AdminKind.MINOR_COMPACTION or (not full and o.minor_interval_s > 0
                                                    and now - self.last_minor >= o.minor_interval_s):
            self.last_minor = now
            return o.minor_threshold, "minor"
        return 0.0, "gc"

    async def metadata_guard(self) -> str:
        """Why ledger GC must delete nothing now, or "" when the metadata can be trusted
        to list every ledger (see the module doc)."""
        assert self.ledgers is not None
        store, root = self.ledgers.store, self.ledgers.root
        try:
            if await store.exists(f"{root}/LAYOUT") is None:
                return f"no cluster at {root} (metadata lost?)"
            raw, _ = await store.get(f"{root}/INSTANCEID")
            if self.instance_id and raw.decode("utf-8", "replace") != self.instance_id:
                return (f"{root} holds cluster instance {raw.decode('utf-8', 'replace')}, "
                        f"this bookie's data belongs to {self.instance_id}")
            frozen = await store.exists(f"{root}/gcfreeze")
        except NoNodeError:
            return f"no cluster at {root} (metadata lost?)"
        return f"{root}/gcfreeze is set" if frozen is not None else ""

    async def _gc_ledgers(self) -> int:
        """Delete the ledgers two trusted passes in a row found missing (module doc).

        The previous pass's suspects are taken out first, so a pass that returns early
        (frozen, nothing held) or raises (a failed scan) leaves none behind: the next
        pass starts the count again. If cancelled, some confirmed ledgers may be
        deleted and the rest are suspected again by the next two passes."""
        previous, self.suspects = self.suspects, frozenset()
        if self.ledgers is None:
            return 0
        local = set(self.storage.list_ledgers())
        if not local:
            return 0
        self.frozen = await self.metadata_guard()
        if self.frozen:
            log.warning("ledger_gc_frozen", extra=fields(reason=self.frozen))
            return 0
        live: set[int] = set()
        async for lid in self.ledgers.iter_ledger_ids():
            live.add(lid)
        missing = frozenset(local - live)
        confirmed = missing & previous
        # A confirmed ledger is deleted below or found to be live again: either way it
        # is no suspect of the next pass.
        self.suspects = missing - confirmed
        if self.suspects:
            log.info("ledger_gc_suspected", extra=fields(ledgers=len(self.suspects)))
        deleted = 0
        for lid in sorted(confirmed):
            idx = self.storage.ledger(lid)
            if idx is None:
                continue
            seen = idx.changes
            if await self.ledgers.exists(lid):
                continue
            self.frozen = await self.metadata_guard()
            if self.frozen:
                log.warning("ledger_gc_frozen", extra=fields(reason=self.frozen))
                self.suspects = frozenset()
                return deleted
            # A ledger re-created with this id may have written here while we asked
            # (BookKeeper's classic GC race): then it is not garbage; the next pass
            # finds its metadata.
            if not await self.storage.delete_ledger(lid, if_changes=seen):
                log.info("ledger_gc_skipped_changed", extra=fields(ledger_id=lid))
                continue
            deleted += 1
            log.info("ledger_garbage_collected", extra=fields(ledger_id=lid))
            crash_point("gc.deleting_ledgers")
        return deleted

    async def _trim_ledgers(self) -> int:
        """Drop entries below an unbounded ledger's metadata start (retention); nothing
        while the metadata cannot be trusted (``metadata_guard``: its ledger ids may be
        another cluster's)."""
        if self.ledgers is None or await self.metadata_guard():
            return 0
        trimmed = 0
        for lid in self.storage.list_ledgers():
            idx = self.storage.ledger(lid)
            if idx is None or idx.term <= 0:
                continue  # only unbounded ledgers carry terms
            try:
                md, _version = await self.ledgers.read(lid)
            except NoNodeError:
                continue  # deleted meanwhile: the next pass deletes it here
            if md.unbounded and md.start_entry > 0:
                n = self.storage.trim_ledger(lid, md.start_entry)
                if n:
                    trimmed += n
                    log.info("ledger_trimmed", extra=fields(ledger_id=lid,
                                                            first_kept=md.start_entry,
                                                            entries=n))
            await trio.sleep(0)
        return trimmed
