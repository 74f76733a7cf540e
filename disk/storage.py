"""LedgerStorage: the bookie's storage (journal + a storage engine + checkpoint).

The journal, replay, the checkpoint's order and the ledgers' state records (master key,
fence, term, explicit LAC, the LAC) live here; where entries are kept is the engine's
(``entrystore.EntryStore``: ``interleaved.InterleavedStore`` or ``dbstorage.DbStore``,
picked once by ``open_engine`` from ``ledger_storage_class``).

Add path, as BookKeeper's: the entries go into the engine first (so they are readable at
once), then into the journal; the call returns after the journal group holding them is
durable. Every add enters the engine the same way, as a run of one ledger's entries
(``_insert``; a single add is a run of one). Storage decides nothing: the bookie's rules (key binding,
fencing, terms, truncation) live in ``appliance.core``, and what it accepted arrives here
as plain facts (a key to bind, a term to adopt, a fence to set), journaled before the
entries they guard.

Checkpoint (every ``flush_interval_ms``, sooner if the engine asks, and at close): capture
the journal's durable mark, let the engine write and fsync its entry logs and then its
index (``EntryStore.flush``), fsync the index files, then write ``lastMark`` in
every ledger directory, then drop journal files older than the mark beyond the backups.
Everything journaled before the mark was inserted into storage before it was journaled,
so after the flush it is on disk twice over; the journal can go.

Start-up (``open``): check cookies, load index headers, replay the journal from the mark
(entries, keys, fences, explicit LACs, terms, truncates), checkpoint, then serve.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import trio

from ledgerd.base.crashpoints import crash_point
from ledgerd.base.logs import fields
from ledgerd.disk.cookie import Cookie, CookieCheck, check_cookies, stamp_cookies
from ledgerd.disk.dbstorage import DbStore
from ledgerd.disk.entrylog import EntryLogger, EntryLogMeta, read_entry_log_meta
from ledgerd.disk.entrystore import EntryStore
from ledgerd.disk.errors import DiskFullError, EntryNotFoundError, LedgerNotFoundError, StorageError
from ledgerd.disk.fdcache import FdCache, sync_dirs
from ledgerd.disk.index import LedgerIndex
from ledgerd.disk.interleaved import InterleavedStore
from ledgerd.disk.journal import Journal, JournalGroup, JournalOptions, JournalPosition
from ledgerd.disk.journal_format import HEADER_SIZE, RecordType, entry_body, ledger_body
from ledgerd.disk.journal_scan import journal_file_ids, scan_journal_file
from ledgerd.disk.lastmark import read_last_mark, write_last_mark
from ledgerd.wire.entry import entry_lac, max_entry_lac

__all__ = ["DirUsage", "LedgerStorage", "StorageOptions", "open_engine"]

log = logging.getLogger(__name__)
_INT64 = struct.Struct(">q")  # TERM and TRUNCATE journal bodies' value (journal_format.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageOptions:
    journal_dir: Path
    ledger_dirs: tuple[Path, ...]
    index_dirs: tuple[Path, ...] = ()
    journal: JournalOptions = field(default_factory=JournalOptions)
    log_size_limit: int = 1 << 30
    write_buffer_size: int = 64 * 1024
    page_size: int = 8192
    page_limit: int = -1
    flush_interval_ms: int = 10000
    skip_invalid_journal_records: bool = False
    open_file_limit: int = 20000
    preallocate_entry_logs: bool = True
    flush_entrylog_bytes: int = 1 << 20  # entry-log write-behind step (0: off)
    allow_storage_expansion: bool = False
    read_buffer_size: int = 512
    ledger_storage_class: str = "interleaved"  # or "db": one LMDB index (dbindex.py)
    # The db storage's entry caches (writecache.py): the write cache's bound (both of
    # its halves: the one filling and the one being flushed), the read-ahead cache's,
    # and how many entries a read-ahead takes.
    write_cache_max_bytes: int = 64 << 20
    read_cache_max_bytes: int = 32 << 20
    read_ahead_batch: int = 100


@dataclass(frozen=True, slots=True)
class DirUsage:
    path: Path
    total: int
    used: int
    free: int
    role: str = "ledger"  # journal, ledger or index (a directory with several: the first)
    error: str = ""  # the probe write failed: the directory is out of service

    @property
    def fraction(self) -> float:
        return self.used / self.total if self.total else 1.0


FD_HEADROOM = 1024  # descriptors left for connections, the journal and logs being written


def _fd_budget(open_file_limit: int) -> int:
    """``open_file_limit``, or what RLIMIT_NOFILE leaves after FD_HEADROOM (logged)."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or open_file_limit + FD_HEADROOM <= soft:
        return open_file_limit
    budget = max(16, soft - FD_HEADROOM)
    log.warning("open_file_limit_lowered", extra=fields(
        open_file_limit=open_file_limit, rlimit_nofile=soft, using=budget))
    return budget


def open_engine(options: StorageOptions, fds: FdCache) -> EntryStore:
    """The storage engine ``ledger_storage_class`` names ("db", or the interleaved one),
    over entry logs in the ledger directories and its index in the index directories.
    The one place that asks which engine a bookie runs."""
    entry_logger = EntryLogger(list(options.ledger_dirs),
                               log_size_limit=options.log_size_limit,
                               write_buffer_size=options.write_buffer_size,
                               readers=fds,
                               preallocate=options.preallocate_entry_logs,
                               read_buffer_size=options.read_buffer_size,
                               writeback_bytes=options.flush_entrylog_bytes)
    index_dirs = list(options.index_dirs or options.ledger_dirs)
    if options.ledger_storage_class == "db":
        return DbStore(entry_logger, index_dirs,
                       write_cache_max_bytes=options.write_cache_max_bytes,
                       read_cache_max_bytes=options.read_cache_max_bytes,
                       read_ahead_batch=options.read_ahead_batch)
    return InterleavedStore(entry_logger, index_dirs, page_size=options.page_size,
                            page_limit=options.page_limit, fds=fds)


PlainRun = tuple[LedgerIndex, int, Sequence[bytes]]
"""Consecutive entries of a ledger held here, stored as they are: (index, first id, entries)."""


class StateRun(NamedTuple):
    """A run of entries that also changes its ledger's state (``submit_runs``)."""

    ledger_id: int
    first_entry_id: int
    entries: Sequence[bytes]
    bind_key: bytes = b""
    new_term: int = 0
    truncate: bool = False
    entry_ids: Sequence[int] | None = None


class LedgerStorage:
    def __init__(self, options: StorageOptions) -> None:
        self.options = options
        self.journal = Journal(options.journal_dir, options.journal)
        # Entry logs being read and index files share ``open_file_limit`` descriptors,
        # fewer if the process may not open that many (sockets and the journal need some).
        self.open_files = FdCache(_fd_budget(options.open_file_limit))
        self.engine = open_engine(options, self.open_files)
        # The engine's entry logs and ledger cache (the ledgers' state records), which
        # the bookie, compaction and the tools read directly.
        self.entry_logger = self.engine.entry_logger
        self.cache = self.engine.cache
        self._insert_run = self.engine.insert
        self.on_checkpoint: Callable[[float], None] | None = None  # its duration, for metrics
        self._checkpoint_lock = trio.Lock()
        self._probe_lock = threading.Lock()  # usage() runs in worker threads
        self.replayed_records = 0
        self.last_checkpoint: JournalPosition | None = None
        self.checkpoints = 0
        self.closed = False
        self.opened = False  # ``open`` finished
        self._run_scope: trio.CancelScope | None = None
        self._log_metas: dict[int, EntryLogMeta] = {}
        self._fencing: dict[int, JournalGroup] = {}  # fences being journaled, by ledger
        self._unlinked_dirs: set[Path] = set()  # index dirs with unlinks not yet synced
        self.compacting = False  # a compaction's index checkpoint is running
        self.failed_dirs: frozenset[Path] = frozenset()  # out of service (disk checker)
        # A ledger directory out of space (the last checkpoint's error), and whom to tell.
        self.disk_full: DiskFullError | None = None
        # told of a checkpoint's ENOSPC/EDQUOT, with when (trio time) that checkpoint began
        self.on_disk_full: Callable[[DiskFullError, float], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def all_dirs(self) -> list[Path]:
        dirs = [self.options.journal_dir, *self.options.ledger_dirs, *self.options.index_dirs]
        out: list[Path] = []
        for d in dirs:
            if d not in out:
                out.append(d)
        return out

    async def open(self, cookie: Cookie | None = None,
                   remote_cookie: bytes | None = None) -> CookieCheck | None:
        """Check cookies, load index headers, replay the journal from the mark, checkpoint.

        With ``cookie`` (built from the configuration and the cluster's instance id) every
        directory's cookie is checked against it and ``remote_cookie`` (ZooKeeper's copy);
        a mismatch raises CookieMismatchError saying what differs and how to fix it, and
        a brand-new bookie gets its cookies stamped (and, with
        ``allow_storage_expansion``, a bookie given new empty directories). Returns the
        check, which says whether the caller must create or replace the ZooKeeper cookie. Raises CorruptRecordError (naming file and offset)
        for a corrupt journal unless skipping is configured.
        """
        check = None
        if cookie is not None:
            check = check_cookies(cookie, self.all_dirs(), remote_cookie,
                                  allow_expansion=self.options.allow_storage_expansion)
            if check.stamp:
                stamp_cookies(cookie, list(check.stamp))
        await trio.to_thread.run_sync(self._open_sync)
        await self.journal.open()
        await self.checkpoint()
        self.opened = True
        return check

    def _open_sync(self) -> None:
        for d in self.all_dirs():
            (d / "current").mkdir(parents=True, exist_ok=True)
        self.engine.check_dirs(list(self.options.index_dirs or self.options.ledger_dirs))
        self.engine.load()
        mark = read_last_mark(list(self.options.ledger_dirs))
        jdir = self.options.journal_dir / "current"
        ids = journal_file_ids(jdir)
        if mark is not None and mark[0] not in ids:
            # Checkpoints never delete the marked file, so its absence means journal
            # data after the mark is gone (as BookKeeper, refuse rather than guess).
            raise StorageError(
                f"journal file {mark[0]:x}.txn named by lastMark is missing from {jdir}; "
                "entries journaled after the last checkpoint are lost. Restore the journal "
                "directory; or, with the bookie stopped, run `ledgerd shell recover "
                "<this bookie>` to copy its ledgers from their other replicas, then "
                "`ledgerd shell bookieformat` to start it empty")
        start_id, start_off = mark if mark is not None else (0, HEADER_SIZE)
        for fid in ids:
            if fid < start_id:
                continue
            path = jdir / f"{fid:x}.txn"
            offset = start_off if fid == start_id else 0
            for rec in scan_journal_file(path, offset, alignment=self.options.journal.alignment,
                                         skip_invalid=self.options.skip_invalid_journal_records,
                                         is_newest=fid == ids[-1]):
                self._apply(rec)
                self.replayed_records += 1
        if self.replayed_records:
            log.info("journal_replayed", extra=fields(records=self.replayed_records,
                                                      from_file=f"{start_id:x}"))

    def _apply(self, rec: Any) -> None:
        t = rec.type
        if t is RecordType.ENTRY:
            idx = self.cache.get_or_create(rec.ledger_id)
            self._insert(idx, rec.value, (rec.payload,))
        elif t is RecordType.MASTER_KEY:
            idx = self.cache.get_or_create(rec.ledger_id)
            if not idx.master_key:
                idx.master_key = rec.payload
                self.cache.dirty(idx)
        elif t is RecordType.FENCE:
            idx = self.cache.get_or_create(rec.ledger_id)
            idx.fenced = True
            self.cache.dirty(idx)
        elif t is RecordType.EXPLICIT_LAC:
            idx = self.cache.get_or_create(rec.ledger_id)
            idx.explicit_lac = rec.payload[:64]
            self.cache.dirty(idx)
        elif t is RecordType.TERM:
            idx = self.cache.get_or_create(rec.ledger_id)
            idx.term = max(idx.term, rec.value)
            self.cache.dirty(idx)
        elif t is RecordType.TRUNCATE:
            self._truncate_after(rec.ledger_id, rec.value)

    def _insert(self, idx: LedgerIndex, first_entry_id: int, entries: Sequence[bytes],
                entry_ids: Sequence[int] | None = None) -> None:
        """Entries into the engine (replay's way; adds go through ``_store``, which
        does the same and journals them): a run of one ledger's entries (consecutive
        from ``first_entry_id``, or with ``entry_ids``); a single entry is a run of one.
        The ledger's LAC rises to the highest one the entries carry."""
        self._insert_run(idx, first_entry_id, entries, entry_ids)
        lac = entry_lac(entries[0]) if len(entries) == 1 else max_entry_lac(entries)
        if lac > idx.lac:
            idx.lac = lac

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The storage services: the journal writer, the periodic checkpoint, and the
        engine's own (the interleaved engine's reader of index pages adds found missing)."""
        async with trio.open_nursery() as nursery:
            self._run_scope = nursery.cancel_scope
            await nursery.start(self.journal.run)
            nursery.start_soon(self._checkpoint_loop)
            self.engine.start_services(nursery)
            task_status.started()

    async def deferred_applied_wait(self) -> None:
        """Return once no add's index location waits for its page (interleaved)."""
        await self.engine.deferred_applied_wait()

    async def _checkpoint_loop(self) -> None:
        """Checkpoint every ``flush_interval_ms``, or sooner when the engine asks (the db
        engine's write cache past a quarter of its bound). A ledger directory out of
        space (ENOSPC/EDQUOT) does not end this service: ``on_disk_full`` is told (the bookie goes read-only, naming the
        directory and the errno), the unwritten data stays in memory (and in the
        journal), and the next checkpoint tries again."""
        while True:
            wanted = self.engine.flush_wanted = trio.Event()
            if not self.engine.is_flush_due():
                with trio.move_on_after(self.options.flush_interval_ms / 1000.0):
                    await wanted.wait()
            began = trio.current_time()
            try:
                await self.checkpoint()
            except DiskFullError as exc:
                if self.disk_full is None:
                    log.error("ledger_dir_full", extra=fields(path=exc.path, error=str(exc)))
                self.disk_full = exc
                if self.on_disk_full is not None:
                    self.on_disk_full(exc, began)
                self.entry_logger.retry_writes()

    async def checkpoint(self, *, sync_index_dirs: bool = False) -> JournalPosition:
        """Flush entry logs and index, persist the mark, drop old journal files.

        The engine sets aside what it holds right after the mark is captured, then
        writes and syncs its entry logs before its index (``EntryStore.flush``); the
        index files' syncs and the mark run in a worker.
        ``sync_index_dirs`` also fsyncs the directories of index files unlinked since
        (GC does, before it deletes the entry logs those files pointed into).
        """
        async with self._checkpoint_lock:
            started = trio.current_time()
            mark = self.journal.durable
            self.engine.begin_checkpoint()
            try:
                paths = await self.engine.flush()
                if self.compacting:
                    crash_point("compaction.index_flush")
                await trio.to_thread.run_sync(self.cache.sync_paths, paths)
                if sync_index_dirs:
                    await self.sync_unlinked_dirs()
                if mark.file_id:
                    await trio.to_thread.run_sync(self._persist_mark, mark)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    where = exc.filename or ", ".join(map(str, self.options.ledger_dirs))
                    raise DiskFullError(str(where), str(exc)) from exc
                raise
            self.last_checkpoint = mark
            self.checkpoints += 1
            if self.on_checkpoint is not None:
                self.on_checkpoint(trio.current_time() - started)
            if self.disk_full is not None:
                log.warning("ledger_dir_writable_again", extra=fields(path=self.disk_full.path))
                self.disk_full = None
            return mark

    async def sync_unlinked_dirs(self) -> None:
        """fsync the directories of index files unlinked since the last call."""
        if self._unlinked_dirs:
            dirs, self._unlinked_dirs = self._unlinked_dirs, set()
            await trio.to_thread.run_sync(sync_dirs, dirs)

    def _persist_mark(self, mark: JournalPosition) -> None:
        write_last_mark(list(self.options.ledger_dirs), mark.file_id, mark.offset,
                        skip=self.failed_dirs)
        self.journal.remove_old(mark)

    async def close(self) -> None:
        """Write what the journal holds, checkpoint, close files (shielded)."""
        if self.closed:
            return
        self.closed = True
        if not self.opened:
            # ``open`` failed part way (a cookie mismatch, an unreadable directory):
            # nothing was written, so release what it opened and stop there.
            with trio.CancelScope(shield=True):
                await self.journal.close()
                if self.entry_logger._writer is not None or self.entry_logger._current:
                    self.entry_logger.abandon()
            return
        with trio.CancelScope(shield=True):
            await self.journal.close()
            async with self._checkpoint_lock:
                if self._run_scope is not None:
                    self._run_scope.cancel()  # no periodic checkpoint after this one
            try:
                await self.checkpoint()
            except DiskFullError as exc:
                # Everything is in the journal: the next start replays it.
                log.error("close_checkpoint_disk_full", extra=fields(error=str(exc)))
                self.entry_logger.abandon()
                return
            await trio.to_thread.run_sync(self.entry_logger.close)
            self.cache.close()

    # -- writes ------------------------------------------------------------------------
    #
    # Storage stores what it is given: the bookie's rules (key binding, fencing, terms,
    # truncation) are decided by ``appliance.core`` before any of these is called.

    def _state_records(self, ledger_id: int, bind_key: bytes,
                       new_term: int) -> tuple[LedgerIndex, list[tuple[int, bytes]]]:
        """The ledger's index, with ``bind_key`` bound and ``new_term`` adopted (if given),
        and the journal records of those changes."""
        idx = self.cache.get_or_create(ledger_id)
        idx.changes += 1
        records: list[tuple[int, bytes]] = []
        if bind_key and not idx.master_key:
            idx.master_key = bind_key
            self.cache.dirty(idx)
            records.append((RecordType.MASTER_KEY, ledger_body(ledger_id, bind_key)))
        if new_term > idx.term:
            idx.term = new_term
            self.cache.dirty(idx)
            records.append((RecordType.TERM, ledger_body(ledger_id, _INT64.pack(new_term))))
        return idx, records

    async def add_entries(self, ledger_id: int, first_entry_id: int, entries: Sequence[bytes],
                          *, bind_key: bytes = b"", new_term: int = 0,
                          truncate: bool = False) -> JournalPosition:
        """Store consecutive entries (a run of one, through ``submit_runs``); returns
        once they are durable.

        Raises StorageError on I/O failure. If cancelled, the entries may be durable or
        not; replay decides.
        """
        group = self.submit_entries(ledger_id, first_entry_id, entries, bind_key=bind_key,
                                    new_term=new_term, truncate=truncate)
        return await group.wait()

    def submit_entries(self, ledger_id: int, first_entry_id: int, entries: Sequence[bytes],
                       bind_key: bytes = b"", new_term: int = 0,
                       truncate: bool = False,
                       entry_ids: Sequence[int] | None = None) -> JournalGroup:
        """``submit_runs`` of one ``StateRun``, raising its StorageError (for tools and
        tests that store one run at a time)."""
        group, failed = self.submit_runs([StateRun(ledger_id, first_entry_id, entries,
                                                   bind_key, new_term, truncate, entry_ids)])
        if failed:
            raise failed[0]
        assert group is not None  # a state run always journals something
        return group

    def _store(self, idx: LedgerIndex, first_entry_id: int, entries: Sequence[bytes],
               records: list[tuple[int, bytes]],
               entry_ids: Sequence[int] | None = None) -> None:
        """``_insert`` a run of entries and add their ENTRY records to ``records``;
        raises StorageError (nothing of the run journaled) if the engine cannot take
        them. A run of one (most adds) takes the short way through."""
        self._insert_run(idx, first_entry_id, entries, entry_ids)
        lid, ENTRY = idx.ledger_id, RecordType.ENTRY
        if len(entries) == 1:
            entry = entries[0]
            lac = entry_lac(entry)
            records.append((ENTRY, entry_body(
                lid, first_entry_id if entry_ids is None else entry_ids[0], entry)))
        else:
            lac = max_entry_lac(entries)
            append = records.append
            if entry_ids is None:
                for entry in entries:
                    append((ENTRY, entry_body(lid, first_entry_id, entry)))
                    first_entry_id += 1
            else:
                for eid, entry in zip(entry_ids, entries, strict=True):
                    append((ENTRY, entry_body(lid, eid, entry)))
        if lac > idx.lac:
            idx.lac = lac

    def _store_state_run(self, run: StateRun, records: list[tuple[int, bytes]]) -> None:
        """Store a run that changes its ledger's state: ``bind_key`` binds the master
        key and ``new_term`` raises the term (both journaled before the entries); with
        ``truncate`` every entry after the last one given is dropped (the
        unbounded-ledger recovery's final no-op entry); ``entry_ids`` (ascending, one
        per entry) places entries that are not consecutive (a SPARSE add). Its records
        join ``records`` only if the whole run was stored; if it was not, the key and
        term are as they were."""
        lid, first, entries = run.ledger_id, run.first_entry_id, run.entries
        idx = self.cache.ledgers.get(lid)
        if idx is None or run.bind_key or run.new_term:
            before = self.cache.get_or_create(lid)
            key, term = before.master_key, before.term
            idx, own = self._state_records(lid, run.bind_key, run.new_term)
        else:
            own, key, term = [], idx.master_key, idx.term
        idx.changes += 1
        if entries:
            try:
                self._store(idx, first, entries, own, run.entry_ids)
            except StorageError:
                idx.master_key, idx.term = key, term  # nothing of the run is journaled
                raise
        if run.truncate and entries and run.entry_ids is None:
            last = first + len(entries) - 1
            self._truncate_after(lid, last)
            own.append((RecordType.TRUNCATE, ledger_body(lid, _INT64.pack(last))))
        records += own

    def submit_runs(self, runs: Sequence[PlainRun | StateRun]
                    ) -> tuple[JournalGroup | None, dict[int, StorageError]]:
        """Store runs of entries now (readable at once), in order, with one journal
        submission for all: the one way an add enters storage (a single add is a run of
        one). Returns the group they are durable with (None if nothing was journaled) and
        the runs that failed, by position (nothing of theirs is journaled).

        A ``PlainRun`` ``(ledger index, first entry id, entries)`` is consecutive entries
        of a ledger held here, accepted as they are (the hub's pass stores the adds of
        all its connections so); a ``StateRun`` also binds a key, adopts a term,
        truncates after itself or places sparse entries."""
        records: list[tuple[int, bytes]] = []
        failed: dict[int, StorageError] = {}
        store = self._store
        for i, run in enumerate(runs):
            try:
                if isinstance(run, StateRun):
                    self._store_state_run(run, records)
                else:
                    idx, first, entries = run
                    idx.changes += 1
                    store(idx, first, entries, records)
            except StorageError as exc:
                failed[i] = exc
        return (self.journal.submit(records) if records else None), failed

    async def fence(self, ledger_id: int, *, bind_key: bytes = b"",
                    new_term: int = 0) -> None:
        """Set the fence bit (binding ``bind_key`` and adopting ``new_term`` first, if
        given); returns once the records are durable. If cancelled, the fence is set in
        memory and may or may not be durable; a fence is idempotent, so fence again.

        A ledger already fenced durably journals nothing (BookKeeper answers a second
        fence from memory): recovery's reads all fence, and each one waiting a journal
        group cycle made recovery cost a group commit per entry. A fence still being
        journaled is waited for, so no caller returns before the fence is durable.
        """
        idx, records = self._state_records(ledger_id, bind_key, new_term)
        if idx.fenced and not records:
            pending = self._fencing.get(ledger_id)
            if pending is not None:
                await pending.wait()
            return
        if not (idx.fenced and ledger_id not in self._fencing):
            idx.fenced = True
            self.cache.dirty(idx)
            records.append((RecordType.FENCE, ledger_body(ledger_id)))
        group = self.journal.submit(records)
        self._fencing[ledger_id] = group
        try:
            await group.wait()
        finally:
            if self._fencing.get(ledger_id) is group:
                del self._fencing[ledger_id]

    def is_durably_fenced(self, ledger_id: int) -> bool:
        """True when the ledger's fence bit is set and durable (no fence journaling)."""
        idx = self.cache.ledgers.get(ledger_id)
        return idx is not None and idx.fenced and ledger_id not in self._fencing

    async def set_explicit_lac(self, ledger_id: int, lac_body: bytes, lac: int = -1) -> None:
        """Store a writer's explicit LAC (the body is returned to ReadLac as is); ``lac``
        raises the LAC this bookie reports, so long polls see an idle writer's last entry."""
        idx = self._require(ledger_id)
        idx.changes += 1
        idx.explicit_lac = lac_body[:64]
        if lac > idx.lac:
            idx.lac = lac
        self.cache.dirty(idx)
        await self.journal.append([(RecordType.EXPLICIT_LAC, ledger_body(ledger_id, lac_body))])

    async def set_term(self, ledger_id: int, term: int) -> None:
        """Adopt a higher term (a lower one changes nothing); returns once it is durable."""
        _idx, records = self._state_records(ledger_id, b"", term)
        if records:
            await self.journal.append(records)

    async def truncate(self, ledger_id: int, last_kept_entry_id: int) -> None:
        """Drop every entry after ``last_kept_entry_id`` (unbounded ledgers' no-op end)."""
        self._truncate_after(ledger_id, last_kept_entry_id)
        await self.journal.append([(RecordType.TRUNCATE, ledger_body(
            ledger_id, _INT64.pack(last_kept_entry_id)))])

    def _truncate_after(self, ledger_id: int, last_kept: int) -> None:
        self.engine.truncate_after(ledger_id, last_kept)

    async def force(self) -> JournalPosition:
        """A journal barrier: returns once everything journaled before it is durable."""
        await self.journal.append([(RecordType.PADDING, b"")])
        return self.journal.durable

    async def delete_ledger(self, ledger_id: int, *, if_changes: int | None = None) -> bool:
        """Forget a ledger (its index file goes now; entry log space at GC). With
        ``if_changes``, only if the ledger's change counter still has that value (and
        False, deleting nothing, otherwise)."""
        await self.engine.wait_index_written()  # its pages may be in that write
        idx = self.cache.get(ledger_id)
        if if_changes is not None and (idx is None or idx.changes != if_changes):
            return False
        path = self.engine.delete(ledger_id)
        if path is not None:
            # In this thread: a re-created ledger's first checkpoint must not race the
            # unlink of the old file (one syscall; GC yields between ledgers).
            path.unlink(missing_ok=True)
            self._unlinked_dirs.add(path.parent)
        await trio.sleep(0)
        return True

    def trim_ledger(self, ledger_id: int, first_kept: int) -> int:
        """Forget a ledger's entries below ``first_kept`` (retention deleted its front
        fragments); returns how many. The index change is durable at the next
        checkpoint (GC takes one before deleting any log), and until then a restart
        only brings back entries the next GC pass drops again."""
        return self.engine.trim_before(ledger_id, first_kept)

    # -- garbage collection ------------------------------------------------------------

    async def rolled_log_metas(self) -> list[EntryLogMeta]:
        """Ledgers maps of every rolled, durable entry log (cached; logs never change)."""
        out = []
        for log_id in self.entry_logger.rolled_log_ids():
            meta = self._log_metas.get(log_id)
            if meta is None:
                path = self.entry_logger.paths[log_id]
                meta = await trio.to_thread.run_sync(read_entry_log_meta, path, log_id)
                self._log_metas[log_id] = meta
            out.append(meta)
        return out

    async def remove_entry_log(self, log_id: int) -> None:
        self._log_metas.pop(log_id, None)
        path = self.entry_logger.remove_log(log_id)
        if path is not None:
            await trio.to_thread.run_sync(partial(path.unlink, missing_ok=True))
            log.info("entry_log_deleted", extra=fields(log=f"{log_id:x}", path=str(path)))

    # -- reads -------------------------------------------------------------------------

    def _require(self, ledger_id: int) -> LedgerIndex:
        idx = self.cache.get(ledger_id)
        if idx is None:
            raise LedgerNotFoundError(ledger_id)
        return idx

    def ledger(self, ledger_id: int) -> LedgerIndex | None:
        """The ledger's state as stored here (key, fence, term, LACs), or None."""
        return self.cache.ledgers.get(ledger_id)

    def ledger_exists(self, ledger_id: int) -> bool:
        return self.cache.get(ledger_id) is not None

    def list_ledgers(self) -> list[int]:
        return sorted(self.cache.ledgers)

    def is_fenced(self, ledger_id: int) -> bool:
        return self._require(ledger_id).fenced

    def master_key(self, ledger_id: int) -> bytes:
        return self._require(ledger_id).master_key

    def term(self, ledger_id: int) -> int:
        return self._require(ledger_id).term

    def last_entry_id(self, ledger_id: int) -> int:
        return self._require(ledger_id).last_entry_id

    def lac(self, ledger_id: int) -> int:
        """The highest LAC carried by any entry stored here (-1 if none).

        After a restart the index does not hold it; the last stored entry's LAC field
        stands in (a writer's LAC only grows with its entry ids).
        """
        idx = self._require(ledger_id)
        if idx.lac < 0 and idx.last_entry_id >= 0:
            entry = self.engine.fetch(ledger_id, idx.last_entry_id, read_ahead=False)
            if entry is not None:
                idx.lac = max(idx.lac, entry_lac(entry))
        return idx.lac

    def explicit_lac(self, ledger_id: int) -> bytes:
        return self._require(ledger_id).explicit_lac

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """Entry bytes (EntryNotFoundError if not stored here, LedgerNotFoundError if the
        ledger is not)."""
        self._require(ledger_id)
        data = self.engine.fetch(ledger_id, entry_id)
        if data is None:
            raise EntryNotFoundError(ledger_id, entry_id)
        return data

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Whether the entry is stored here (its bytes are not read). With interleaved
        storage a page not in memory is read from its file: ``page_in`` first."""
        return self.engine.has_entry(ledger_id, entry_id)

    def pages_missing(self, ledger_id: int, first_entry_id: int, count: int = 1,
                      stride: int = 1) -> bool:
        """True when reading these entries would read index pages from a file
        (interleaved storage): ``page_in`` reads them off the event loop first."""
        last = first_entry_id + (max(1, count) - 1) * stride
        return self.engine.pages_missing(ledger_id, first_entry_id, last)

    async def page_in(self, ledger_id: int, first_entry_id: int, count: int = 1,
                      stride: int = 1) -> None:
        """Read the index pages these entries need in a worker thread and cache them
        (interleaved storage; a no-op for db)."""
        last = first_entry_id + (max(1, count) - 1) * stride
        await self.engine.page_in(ledger_id, first_entry_id, last)

    def read_range(self, ledger_id: int, first_entry_id: int, max_count: int,
                   max_bytes: int, per_entry: int = 0, *, stride: int = 1) -> list[bytes]:
        """Entries ``first_entry_id``, ``+ stride``, ... (consecutive with stride 1) up to
        the first one not held, while each one's bytes plus ``per_entry`` fit
        ``max_bytes`` in all; at least one if the first exists."""
        out: list[bytes] = []
        total = 0
        for e in range(first_entry_id, first_entry_id + max(1, max_count) * stride, stride):
            try:
                data = self.read_entry(ledger_id, e)
            except EntryNotFoundError:
                break
            cost = len(data) + per_entry
            if out and total + cost > max_bytes:
                break
            out.append(data)
            total += cost
        if not out:
            self._require(ledger_id)
            raise EntryNotFoundError(ledger_id, first_entry_id)
        return out

    # -- disks -------------------------------------------------------------------------

    def usage(self, *, probe: bool = True) -> list[DirUsage]:
        """Disk usage of every directory, for the disk checker (a worker thread): its
        role, and (``probe``) whether a probe file can be written and synced there (a
        directory on a failing or read-only-remounted disk is taken out of service).
        Probes are one at a time: two threads probing the same file name unlinked each
        other's file, and the ENOENT took a healthy directory out of service."""
        o = self.options
        roles = {o.journal_dir: "journal"}
        for d in o.ledger_dirs:
            roles.setdefault(d, "ledger")
        for d in o.index_dirs:
            roles.setdefault(d, "index")
        out = []
        for d, role in roles.items():
            error = ""
            if probe:
                with self._probe_lock:
                    error = _probe(d / "current")
            try:
                u = shutil.disk_usage(d)
                total, free = u.total, u.free
            except OSError as exc:
                total = free = 0
                error = error or str(exc)
            out.append(DirUsage(d, total, total - free, free, role, error))
        return out

    def set_full_dirs(self, full: set[Path]) -> None:
        """The directories that are full or out of service (from the disk checker): new
        entry logs and new ledgers' index files go elsewhere, and the current entry log
        rolls away from one."""
        self.entry_logger.set_full_dirs({Path(d) / "current" for d in full})
        self.cache.full_dirs = {Path(d) for d in full}

    def set_failed_dirs(self, failed: set[Path]) -> None:
        """Directories out of service: checkpoints stop writing the mark there."""
        self.failed_dirs = frozenset(Path(d) for d in failed)


def _probe(d: Path) -> str:
    """Write, sync and remove a small file in ``d``; "" if that works, else why not."""
    path = d / ".ledgerd-probe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(path)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return ""  # full, not failing: the usage says so
        return f"{exc.strerror or exc} ({path})"
    return ""

