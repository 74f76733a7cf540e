"""The write-ahead journal: group commit on O_DIRECT with one fdatasync per group.

Callers ``await journal.append(records)``; the call returns once those records are
durable. The writer service (``run``) takes everything waiting as one group when

- the oldest waiting record is older than ``max_group_wait_ms``, or
- ``buffered_writes_threshold`` bytes or ``buffered_entries_threshold`` records wait, or
- ``flush_when_queue_empty`` is set (then it writes as soon as it has anything),

encodes it into an aligned buffer padded to ``alignment``, and hands it to one of the
native helper's syncer threads for one ``pwrite`` + one ``fdatasync``; the event loop
waits on the syncer's eventfd. That thread never takes the GIL: a Python worker thread
needed it to start and to return, and under load each group cycle waited for it
longer than the sync itself took. ``groups_in_flight`` syncers (each with its
own buffer) write and sync groups side by side; groups finish in the order they were
started, so the durable mark only moves forward, and a group whose sync succeeded
after an earlier one failed fails too. When every syncer is busy, the next group
accumulates, so under load groups grow by themselves and the hand-off is paid per
group, never per record. A group that rolls the file or must zero ahead first waits
for the groups in flight, then takes a worker thread.

``with journal.batch():`` lets a caller (the appliance, for one pass of its event loop)
make its submissions one group and start it itself at the block's end (when
no group wait is configured and a syncer is free): no task wakes to start it, and the
collector that finishes groups already waits on the syncer it will take, so the event
loop's next wake-up is the sync's end. The collector, in turn, starts what arrived
during a sync as soon as that sync ends, whatever its size, before the finished
group's callbacks run.

``after_sync`` hands the next group an action (``native.AfterSync``) that its syncer
runs right after the fdatasync succeeded, in the syncer's thread, so what it does (the
appliance sends add replies this way) waits for neither the event loop's next pass
nor the GIL. The journal does not know what the action is. Actions run only for a
group started behind no other group in flight and on the fast path; otherwise they are
withheld (``AfterSync.withhold``) and their owner does the work when the group is done.

Space ahead of the write position is kept pre-zeroed a ``prealloc_mb`` step ahead:
overwriting zeroed blocks syncs about twice as fast on this disk as appending or writing
into fallocate()d extents. The zeroing trickles, a ``_ZERO_CHUNK`` each time the groups
have used one, in small writes apart, so no sync has much zeroing to flush with it. A
group that outran it waits for its next chunk, not for the rest of its step.
Files roll at ``max_size_mb``. Where O_DIRECT is refused (tmpfs, some overlays), the
journal falls back to buffered writes + fdatasync and logs it once.

An I/O error fails the group's callers and every later append with StorageError (ENOSPC
as DiskFullError): the journal never acknowledges what it could not make durable.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from ledgerd import native
from ledgerd.base.logs import fields
from ledgerd.disk.errors import DiskFullError, StorageClosedError, StorageError
from ledgerd.disk.journal_format import (
    HEADER_SIZE,
    encode_header,
    encode_records,
    group_size,
    padding_record,
)
from ledgerd.disk.journal_scan import journal_file_ids

__all__ = ["Journal", "JournalGroup", "JournalOptions", "JournalPosition"]

log = logging.getLogger(__name__)
MiB = 1 << 20
# The zeroer takes a worker thread per ``_ZERO_CHUNK`` and writes it in ``_ZERO_PIECE``
# writes, ``_ZERO_PAUSE_S`` apart while a half step or more lies zeroed ahead: the
# journal's next fdatasync flushes the zeros written since the last one from the disk's
# cache with its own records, so a 1 MiB write at once made that sync several times
# slower. The pieces and pauses run in one native call: a thread hop per piece cost
# the event loop too much under load, and a Python loop
# of pieces in the worker took the GIL back after every pause.
_ZERO_CHUNK = 1 * MiB
_ZERO_PIECE = 128 * 1024
_ZERO_PAUSE_S = 0.0005


class _Batch:
    """``Journal.batch``'s block."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        self._journal._hold()

    def __exit__(self, *exc: object) -> None:
        self._journal._release()


@dataclass(frozen=True, slots=True, order=True)
class JournalPosition:
    """A point in the journal: everything before it is durable (a "log mark")."""

    file_id: int
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalOptions:
    max_group_wait_ms: float = 0.0
    buffered_writes_threshold: int = 512 * 1024
    buffered_entries_threshold: int = 0
    flush_when_queue_empty: bool = False
    max_size_mb: int = 2048
    prealloc_mb: int = 16
    alignment: int = 4096
    max_backups: int = 5
    reuse_files: bool = False
    sync_data: bool = True
    max_memory_bytes: int = 256 * MiB
    remove_from_page_cache: bool = True
    write_buffer_size: int = 64 * 1024  # the aligned write buffer's first size (it grows)
    groups_in_flight: int = 1  # groups written and synced at once (completed in order)


class JournalGroup:
    """The group commit a submission joined; ``wait()`` returns once it is durable."""

    __slots__ = ("after_sync", "callbacks", "done", "error", "position")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.position = JournalPosition(0, 0)
        # Actions the syncer runs once the group is durable (``Journal.after_sync``).
        self.after_sync: list[native.AfterSync] = []
        # Called (in the trio thread) once the group is done: callers ask to be woken
        # here instead of waking a task only to wait for the group.
        self.callbacks: list[Callable[[], None]] = []

    def finish(self) -> None:
        """Mark the group done (durable, or failed with ``error``) and call back."""
        self.done.set()
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()

    def call_when_done(self, callback: Callable[[], None]) -> None:
        if self.done.is_set():
            callback()
        else:
            self.callbacks.append(callback)

    @property
    def is_durable(self) -> bool:
        return self.done.is_set() and self.error is None

    def check(self) -> JournalPosition:
        """The group's end position once done; raises StorageError if it failed."""
        if self.error is not None:
            if isinstance(self.error, StorageError):
                raise self.error
            raise StorageError(f"journal write failed: {self.error}") from self.error
        return self.position

    async def wait(self) -> JournalPosition:
        await self.done.wait()
        return self.check()


class _Slot:
    """A native syncer thread and the aligned buffer its groups are encoded into."""

    __slots__ = ("buf", "syncer")

    def __init__(self, syncer: native.Syncer) -> None:
        self.syncer = syncer
        self.buf: native.AlignedBuffer | None = None


@dataclass(slots=True)
class _InFlight:
    """A group its syncer is writing: where it ends, what it holds."""

    slot: _Slot
    group: JournalGroup
    position: JournalPosition  # the durable mark once this group is done
    start: int
    records: int
    nbytes: int
    size: int


class _File:
    """The current journal file: descriptor, write offset and zeroed extent."""

    def __init__(self, path: Path, file_id: int, handle: native.NativeFile) -> None:
        self.path = path
        self.file_id = file_id
        self.handle = handle
        self.offset = HEADER_SIZE
        self.zeroed_until = 0


class Journal:
    """One journal directory (``<dir>/current``)."""

    _warned_buffered = False

    def __init__(self, directory: str | os.PathLike[str], options: JournalOptions) -> None:
        self.dir = Path(directory) / "current"
        self.options = options
        self._pending: list[tuple[int, bytes]] = []
        self._pending_bytes = 0
        self._writing_bytes = 0
        self._oldest = 0.0
        self._group = JournalGroup()
        self._wakeup = trio.Event()
        self._threshold = trio.Event()
        self._file: _File | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self._running = False
        self._run_done = trio.Event()
        self._durable = JournalPosition(0, 0)
        self._direct = True
        self._zero: native.AlignedBuffer | None = None
        # The background zeroer (``_zero_service``): asked for when the write position
        # comes within half a prealloc step of the zeroed end; set while it runs.
        self._zero_wanted = trio.Event()
        self._zeroing: trio.Event | None = None
        # Set (and replaced) each time the zeroer has written a chunk, and when it stops.
        self._zeroed_more = trio.Event()
        self._slow_path = False
        self._held = False  # inside ``batch``: submissions wake nobody
        self._batch = _Batch(self)
        self._starting = False  # the writer has taken a group and not yet started it
        self.background_zero_bytes = 0
        self.slow_groups = 0  # groups that rolled the file or zeroed ahead themselves
        self.buffer_allocations = 0
        # One slot per group that may be in flight: a native syncer thread and the
        # aligned buffer it writes from. ``_free`` is a stack (the warmest on top).
        self._slots: list[_Slot] = []
        self._free: list[_Slot] = []
        self._inflight: deque[_InFlight] = deque()
        self._slot_freed = trio.Event()  # a group in flight finished (or one failed)
        # Counters for metrics.
        self.groups_written = 0
        self.records_written = 0
        self.bytes_written = 0
        self.last_sync_seconds = 0.0
        # Called in the trio thread after each durable group: (records, bytes, sync seconds).
        self.on_group: Callable[[int, int, float], None] | None = None

    # -- state ------------------------------------------------------------------------

    @property
    def durable(self) -> JournalPosition:
        """Everything before this position is on stable storage."""
        return self._durable

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    async def settle(self) -> None:
        """Return once every group started so far is collected (its callbacks run):
        groups finish in order, so waiting for the newest is waiting for them all."""
        if self._inflight:
            await self._inflight[-1].group.done.wait()

    @property
    def is_failed(self) -> bool:
        return self._failed is not None

    def has_capacity(self, nbytes: int) -> bool:
        """False when ``nbytes`` more would exceed ``max_memory_bytes`` waiting."""
        return (self._pending_bytes + self._writing_bytes + nbytes
                <= self.options.max_memory_bytes)

    # -- opening and rolling ----------------------------------------------------------

    async def open(self) -> None:
        """Create ``current/`` and start a new journal file after any existing ones."""
        await trio.to_thread.run_sync(self._open_sync)

    def _open_sync(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        ids = journal_file_ids(self.dir)
        file_id = max([int(time.time() * 1000), *(i + 1 for i in ids)])
        self._file = self._new_file(file_id)
        # The first prealloc step is zeroed here, before the journal serves: the first
        # group would otherwise wait for it (16 MiB and a sync), and the background
        # zeroer keeps the space ahead from then on.
        self._zero_ahead(self._file, HEADER_SIZE)
        self._file.handle.fdatasync()
        self._durable = JournalPosition(file_id, HEADER_SIZE)
        while len(self._slots) < self.options.groups_in_flight:
            slot = _Slot(native.Syncer())
            self._slots.append(slot)
            self._free.append(slot)

    def _open_handle(self, path: Path) -> native.NativeFile:
        handle = self._open_untagged(path)
        native.tag_fd(handle.fd, "journal")
        return handle

    def _open_untagged(self, path: Path) -> native.NativeFile:
        flags = os.O_RDWR | os.O_CREAT
        if self._direct:
            try:
                return native.open_file(path, flags, 0o644, direct=True)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self._direct = False
                if not Journal._warned_buffered:
                    Journal._warned_buffered = True
                    log.warning("journal_o_direct_refused", extra=fields(
                        dir=self.dir, fallback="buffered writes + fdatasync"))
        return native.open_file(path, flags, 0o644, direct=False)

    def _new_file(self, file_id: int) -> _File:
        path = self.dir / f"{file_id:x}.txn"
        reused = self._reusable_file() if self.options.reuse_files else None
        if reused is not None:
            os.rename(reused, path)
        handle = self._open_handle(path)
        f = _File(path, file_id, handle)
        header = native.alloc_aligned(HEADER_SIZE)
        header.view[:] = encode_header(file_id)
        handle.pwrite(header.view, 0)
        if reused is not None:
            f.zeroed_until = 0  # old records follow; they fail the salted CRC
        handle.fdatasync()
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the new name must survive a crash too
        finally:
            os.close(dfd)
        log.info("journal_file_opened", extra=fields(
            path=path, direct=self._direct, reused=reused is not None))
        return f

    def _reusable_file(self) -> Path | None:
        cur = self._file.file_id if self._file else None
        old = [i for i in journal_file_ids(self.dir) if i != cur and i < self._durable.file_id]
        if len(old) <= self.options.max_backups:
            return None
        return self.dir / f"{old[0]:x}.txn"

    def files(self) -> list[Path]:
        return [self.dir / f"{i:x}.txn" for i in journal_file_ids(self.dir)]

    def remove_old(self, mark: JournalPosition) -> list[Path]:
        """After a checkpoint at ``mark``: delete files older than the mark beyond
        ``max_backups`` (with reuse on, they are kept for recycling instead)."""
        older = [i for i in journal_file_ids(self.dir) if i < mark.file_id]
        doomed = older[: max(0, len(older) - self.options.max_backups)]
        removed: list[Path] = []
        if self.options.reuse_files:
            return removed
        for i in doomed:
            p = self.dir / f"{i:x}.txn"
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
        return removed

    # -- appending --------------------------------------------------------------------

    async def append(self, records: Sequence[tuple[int, bytes]]) -> JournalPosition:
        """Journal ``(RecordType, body)`` pairs; returns once they are durable.

        Raises StorageError (DiskFullError on ENOSPC) if the group could not be made
        durable, StorageClosedError after close or an earlier failure. If cancelled, the
        records may still become durable; a caller that cares must replay to know.
        """
        return await self.submit(records).wait()

    def submit(self, records: Sequence[tuple[int, bytes]]) -> JournalGroup:
        """Queue records without waiting: the returned group says when they are durable.

        This is the network path's hand-off: a whole frame's records join the group in
        one call, and the caller waits once per group rather than once per entry.
        """
        if self._failed is not None:
            raise StorageClosedError(f"journal failed earlier: {self._failed}") from self._failed
        if self._closed:
            raise StorageClosedError("journal is closed")
        if not self._pending:
            self._oldest = trio.current_time()
        self._pending.extend(records)
        n = self._pending_bytes
        for _, body in records:
            n += len(body) + 9
        self._pending_bytes = n
        o = self.options
        if n >= o.buffered_writes_threshold or (
                o.buffered_entries_threshold and len(self._pending) >= o.buffered_entries_threshold):
            self._threshold.set()
        if not self._held:
            self._wakeup.set()
        return self._group

    @property
    def next_group(self) -> JournalGroup:
        """The group submissions join now (not started yet)."""
        return self._group

    def after_sync(self, action: native.AfterSync) -> JournalGroup:
        """Have ``next_group``'s syncer run ``action`` as soon as the group is durable,
        without waiting for the event loop; returns that group.

        The action runs only if the group is written by a syncer behind no other group
        in flight (so actions never overtake each other); otherwise it is withheld
        (``action.withhold()``) and its owner does the work once the group is done. The
        action may change until the group starts.
        """
        self._group.after_sync.append(action)
        return self._group

    def batch(self) -> _Batch:
        """Submissions inside the block join one group and wake nobody; at its end the
        group starts at once when the writer would start it without waiting (no group
        wait, a syncer free, the fast path), else the writer wakes. Starting it here
        saves the writer task's wake-up and the event-loop pass it costs: at light load,
        one pass per add. No task may run inside the block (it holds no lock: it only
        delays the start). The block is entered once per event-loop pass, so it is a
        plain object, not a generator (a ``contextmanager`` costs ~1 us per pass).
        """
        return self._batch

    def _hold(self) -> None:
        self._held = True

    def _release(self) -> None:
        self._held = False
        if self._pending and not self._start_ready():
            self._wakeup.set()

    def _start_ready(self) -> bool:
        """Start what is waiting as a group now, if the writer would start it without
        waiting: no group wait or queue-empty policy, a syncer free, the fast path, and
        no group the writer has taken and not yet started (this one would pass it)."""
        o = self.options
        if not (self._pending and self._running and not self._held and not self._starting
                and self._free and self._failed is None and not self._closed
                and o.max_group_wait_ms <= 0 and not o.flush_when_queue_empty
                and self._fits_fast(self._pending_bytes)):
            return False
        group, records, nbytes = self._take()
        try:
            self._start_native(group, records, nbytes)
        except BaseException as exc:  # as on the writer's path: the journal fails
            self._fail(exc, group)
            if not isinstance(exc, (OSError, StorageError)):
                raise
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer service. Runs until cancelled or closed; an I/O failure ends it
        with the error (the supervisor turns the bookie read-only)."""
        if self._file is None:
            await self.open()
        self._running = True
        self._run_done = trio.Event()
        try:
            task_status.started()
            failure: BaseException | None = None
            shield = trio.CancelScope()
            with shield:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._zero_service)
                    nursery.start_soon(self._collect_service)
                    try:
                        await self._run_loop()
                    except BaseException as exc:  # re-raised as itself, not as a group
                        failure = exc
                        # Wait out the zeroer's chunk even if our caller is cancelled
                        # meanwhile, so the failure is what the caller sees.
                        shield.shield = True
                    nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure
        finally:
            self._running = False
            await self._drain()
            if self._failed is None and not self._closed:
                # Stopped under its callers (the storage service failed or was
                # cancelled): fail the waiting group instead of leaving adds hanging.
                err = StorageClosedError("the journal stopped (the storage service ended)")
                self._failed = err
                self._group.error = err
                self._group.finish()
            self._run_done.set()

    async def _run_loop(self) -> None:
        wait = self.options.max_group_wait_ms / 1000.0
        while True:
            if self._failed is not None:
                raise self._failed
            if not self._pending:
                if self._closed:
                    while self._inflight and self._failed is None:
                        await self._slot_freed.wait()
                    if self._failed is not None:
                        raise self._failed
                    return
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            if not self._free:
                await self._slot_freed.wait()  # every syncer has a group in flight
                continue
            if self.options.flush_when_queue_empty:
                await self._wait_queue_empty()
            elif wait > 0 and not self._threshold.is_set() and not self._closed:
                with trio.move_on_at(self._oldest + wait):
                    await self._threshold.wait()
            # No wait policy, no yield since the checks above: ``batch``'s end (which starts
            # groups only under that policy) cannot have taken the records or the slot.
            if self._pending and self._free:
                await self._start_group()

    async def _wait_queue_empty(self) -> None:
        """Let every runnable appender run; return once a pass adds nothing new.

        This is ``journalFlushWhenQueueEmpty`` in a single-threaded event loop: the queue
        is empty when the tasks that were ready have all had their turn.
        """
        deadline = self._oldest + self.options.max_group_wait_ms / 1000.0
        while not self._threshold.is_set() and trio.current_time() < deadline:
            before = len(self._pending)
            await trio.sleep(0)
            if len(self._pending) == before:
                return

    async def _start_group(self) -> None:
        """Take everything waiting as one group and start writing it.

        On the fast path the group goes to a free syncer and this returns at once; the
        collector (``_collect_oldest``) finishes groups in the order they were started.
        A group that must roll the file or zero ahead waits for the groups in flight and
        for the zeroer, then is written and synced by a worker thread before returning.
        """
        group, records, nbytes = self._take()
        self._starting = True  # ``batch`` must not start a group ahead of this one
        try:
            await self._start_taken(group, records, nbytes)
        finally:
            self._starting = False

    def _take(self) -> tuple[JournalGroup, list[tuple[int, bytes]], int]:
        """Everything waiting, as the next group (and a new group for what follows)."""
        records, self._pending = self._pending, []
        nbytes, self._pending_bytes = self._pending_bytes, 0
        self._writing_bytes += nbytes
        group, self._group = self._group, JournalGroup()
        self._threshold = trio.Event()
        return group, records, nbytes

    async def _start_taken(self, group: JournalGroup, records: list[tuple[int, bytes]],
                           nbytes: int) -> None:
        try:
            while True:
                if self._fits_fast(nbytes):
                    self._start_native(group, records, nbytes)
                    return
                if self._zeroing is None:
                    break
                # Never zero ahead or roll under the background zeroer: wait for its next
                # chunk (often all this group needs), then try the fast path again.
                # Waiting for its whole run, up to a step ahead, held every add for tens
                # of milliseconds, often, under load.
                with trio.CancelScope(shield=True):
                    await self._zeroed_more.wait()
            # The slow path touches the file's end (and may close it): nothing else
            # may be writing it, so the groups in flight finish first.
            with trio.CancelScope(shield=True):
                while self._inflight and self._failed is None:
                    await self._slot_freed.wait()
            if self._failed is not None:
                self._writing_bytes -= nbytes
                group.error = self._failed
                group.finish()
                return
            self._withhold(group)  # the worker thread runs no actions
            self._slow_path = True  # the zeroer stays off the file meanwhile
            self.slow_groups += 1
            try:
                position = await trio.to_thread.run_sync(self._write_sync, records, nbytes,
                                                         abandon_on_cancel=False)
            finally:
                self._slow_path = False
                self._writing_bytes -= nbytes
        except BaseException as exc:
            self._fail(exc, group)
            if not isinstance(exc, (OSError, StorageError)):
                raise
            return
        self._durable = position
        group.position = position
        group.finish()
        if self.on_group is not None:
            self.on_group(len(records), nbytes, self.last_sync_seconds)

    @staticmethod
    def _withhold(group: JournalGroup) -> None:
        """``group``'s after-sync actions will not run from a syncer: their owners do
        the work once the group is done."""
        for action in group.after_sync:
            action.withhold()

    def _fits_fast(self, total: int) -> bool:
        """Whether a group of ``total`` bytes can take the fast path now: a syncer is
        free and the group neither rolls the file nor reaches unzeroed space."""
        f = self._file
        if f is None or not self._free:
            return False
        o = self.options
        end = f.offset + group_size(total, o.alignment)
        return not ((end > o.max_size_mb * MiB and f.offset > HEADER_SIZE)
                    or end > f.zeroed_until)

    def _start_native(self, group: JournalGroup, records: list[tuple[int, bytes]],
                      total: int) -> None:
        """The fast path (``_fits_fast`` said so): encode here, then a syncer's own
        thread writes and syncs without the GIL."""
        f = self._file
        assert f is not None
        o = self.options
        size = group_size(total, o.alignment)
        end = f.offset + size
        slot = self._free.pop()  # the slot freed last: its buffer is warm
        view = self._encode(f, records, total, slot)
        # Actions ride along only behind no other group (whose own actions they could
        # overtake); otherwise their owners do the work.
        actions: list[native.AfterSync] = group.after_sync
        if actions and self._inflight:
            self._withhold(group)
            actions = []
        slot.syncer.submit(f.handle, view, f.offset, sync=o.sync_data, after_sync=actions)
        self._inflight.append(_InFlight(slot, group, JournalPosition(f.file_id, end),
                                        f.offset, len(records), total, size))
        f.offset = end  # the next group starts here, before this one is durable
        if self._running:
            self._want_zero_ahead(f, end)

    async def _collect_service(self) -> None:
        """Finish the groups in flight, oldest first, as their syncers report.

        With nothing in flight it waits on the syncer the next group will take (the
        top of the free stack: only this task pushes onto it), so a group's start
        wakes no task: the first the event loop hears of it is its completion.
        """
        while True:
            if self._inflight:
                await self._collect_oldest()
            elif self._free:
                await trio.lowlevel.wait_readable(self._free[-1].syncer)
            else:
                await trio.sleep_forever()  # closed: no syncers left

    async def _collect_oldest(self) -> None:
        """Wait for the oldest group in flight and finish it (shielded: the write runs
        on regardless, and its callers must hear how it ended).

        Groups finish in the order they were started, so the durable mark only moves
        forward and a group is never acknowledged before one written ahead of it. A
        group whose sync succeeded after an earlier one failed fails too.
        """
        item = self._inflight[0]
        syncer = item.slot.syncer
        error: OSError | None = None
        seconds: float | None = None
        with trio.CancelScope(shield=True):
            try:
                # Often done already (the idle wait was on this syncer): no extra pass.
                seconds = syncer.collect()
                while seconds is None:
                    await trio.lowlevel.wait_readable(syncer)
                    seconds = syncer.collect()
            except OSError as exc:
                error = exc
        self._inflight.popleft()
        self._free.append(item.slot)
        self._writing_bytes -= item.nbytes
        # What arrived during this sync goes to the freed syncer before this group's
        # callers hear back (their callbacks): the next sync overlaps them, and
        # the writer task need not wake to start it.
        started = error is None and self._start_ready()
        if error is not None:
            self._fail(error, item.group)
        elif self._failed is not None:
            item.group.error = self._failed
            item.group.finish()
        else:
            assert seconds is not None
            self.last_sync_seconds = seconds
            if self._file is not None:
                self._count_written(self._file, item.start, item.records, item.size)
            self._durable = item.position
            item.group.position = item.position
            item.group.finish()
            if self.on_group is not None:
                self.on_group(item.records, item.nbytes, seconds)
        if not started or self._free:  # a writer waiting for a free syncer would find none
            self._slot_freed.set()
            self._slot_freed = trio.Event()

    def _fail(self, exc: BaseException, group: JournalGroup) -> None:
        """The journal could not make ``group`` durable: fail it, everything after it,
        and every later append (the bookie turns read-only)."""
        if self._failed is None:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                err: BaseException = DiskFullError(
                    str(self._file.path if self._file else self.dir), str(exc))
            elif isinstance(exc, (OSError, StorageError)):
                err = StorageError(f"journal write failed: {exc}")
            else:
                err = exc
            self._failed = err
            log.error("journal_failed", extra=fields(error=repr(exc)))
        group.error = self._failed
        group.finish()
        # Everyone who joined after this group fails too; the writer wakes to stop.
        self._group.error = self._failed
        self._group.finish()
        self._wakeup.set()
        self._threshold.set()
        self._slot_freed.set()
        self._slot_freed = trio.Event()

    async def _drain(self) -> None:
        """Finish every group still in flight (shielded; used when the writer stops)."""
        with trio.CancelScope(shield=True):
            while self._inflight:
                await self._collect_oldest()

    async def _zero_service(self) -> None:
        """Keep the file zeroed a prealloc step ahead of the write position, a chunk at a
        time, off the group path.

        Zeroing a whole step inside a group (the slow path) held that group, and every
        add waiting on it, for the 16 MiB write and a sync that flushed it: stalls of tens of
        milliseconds in an open loop's tail. Zeroing
        a step at once beside the groups still cost them: each fdatasync flushes from the
        disk's cache the zeros written since the last one, so the syncs during a 16 MiB
        burst took several times longer, and those bursts made most of an open loop's
        p99. So the service is asked for once a ``_ZERO_CHUNK`` (at most a
        quarter step) less than a step lies zeroed ahead, and zeroes until a step does
        again: at steady state one chunk each time the groups have used as much, written
        by a worker thread in ``_ZERO_PIECE`` writes with short pauses between them, in
        one native call (no pauses while less than half a step is left: then it catches
        up at full speed). Groups go on below ``zeroed_until`` meanwhile; each chunk
        raises it when written, and the next group's fdatasync makes it durable. Groups
        never write at or above ``zeroed_until`` on the fast path, and the slow path
        (roll, or zeroing a group that outran this) waits for the zeroer (a group that
        outran it tries the fast path again after each chunk), so the two
        never touch the same bytes.
        """
        step = self.options.prealloc_mb * MiB
        while True:
            await self._zero_wanted.wait()
            self._zero_wanted = trio.Event()
            f = self._file
            if (f is None or self._failed is not None or self._slow_path
                    or f.zeroed_until <= 0):
                continue  # the next fast group asks again
            self._zeroing = trio.Event()
            try:
                if self._zero is None:
                    self._zero = native.alloc_aligned(_ZERO_CHUNK, 4096)
                limit = self.options.max_size_mb * MiB + step
                while (f.zeroed_until < min(f.offset + step, limit) and self._file is f
                       and not self._closed):
                    pos = f.zeroed_until
                    n = min(_ZERO_CHUNK, step // 4, limit - pos)
                    # Paced while a half step or more is left; else catch up at full speed.
                    pause = _ZERO_PAUSE_S if pos - f.offset >= step // 2 else 0.0
                    await trio.to_thread.run_sync(f.handle.pwrite_paced, self._zero.view[:n],
                                                  pos, _ZERO_PIECE, pause,
                                                  abandon_on_cancel=False)
                    f.zeroed_until = pos + n
                    self.background_zero_bytes += n
                    self._note_zeroed()
            except (OSError, StorageError) as exc:
                # Not fatal: the group path zeroes for itself and reports what fails.
                log.warning("journal_zero_ahead_failed", extra=fields(error=repr(exc)))
            finally:
                self._zeroing.set()
                self._zeroing = None
                self._note_zeroed()

    def _note_zeroed(self) -> None:
        done, self._zeroed_more = self._zeroed_more, trio.Event()
        done.set()

    def _want_zero_ahead(self, f: _File, end: int) -> None:
        step = self.options.prealloc_mb * MiB
        chunk = min(_ZERO_CHUNK, step // 4)
        if (self._zeroing is None and 0 < f.zeroed_until < end + step - chunk
                and f.zeroed_until < self.options.max_size_mb * MiB + step):
            self._zero_wanted.set()

    def _write_sync(self, records: list[tuple[int, bytes]], total: int) -> JournalPosition:
        """Worker thread: encode, pad, write, zero ahead, fdatasync. Returns the new mark.
        The slow path, for groups that roll the file or need zeroing ahead first; it
        runs with no group in flight, so every slot's buffer is free."""
        f = self._file
        assert f is not None
        o = self.options
        size = group_size(total, o.alignment)
        if f.offset + size > o.max_size_mb * MiB and f.offset > HEADER_SIZE:
            f.handle.close()
            f = self._file = self._new_file(f.file_id + 1)
        view = self._encode(f, records, total, self._free[-1])
        end = f.offset + size
        if end > f.zeroed_until:
            self._zero_ahead(f, end)
        t0 = time.perf_counter()
        f.handle.pwrite(view, f.offset)
        if o.sync_data:
            f.handle.fdatasync()
        self.last_sync_seconds = time.perf_counter() - t0
        self._count_written(f, f.offset, len(records), size)
        f.offset = end
        return JournalPosition(f.file_id, end)

    def _count_written(self, f: _File, start: int, records: int, size: int) -> None:
        """A group made durable at ``start``: the counters, and (buffered fallback) the
        page cache dropped up to it."""
        if not self._direct and self.options.remove_from_page_cache:
            f.handle.fadvise_dontneed(0, start)
        self.groups_written += 1
        self.records_written += records
        self.bytes_written += size

    def _encode(self, f: _File, records: list[tuple[int, bytes]], total: int,
                slot: _Slot) -> memoryview:
        """The group's records and the PADDING record that ends it (``group_size``
        bytes, see disk/journal_format.py), in the slot's aligned buffer."""
        align = self.options.alignment
        size = group_size(total, align)
        buf = slot.buf
        if buf is None or buf.size < size:
            # One buffer per slot, reused group after group (it never shrinks).
            start = max(size, self.options.write_buffer_size, align)
            buf = slot.buf = native.alloc_aligned(-(-start // align) * align, align)
            self.buffer_allocations += 1
        view = buf.view[:size]
        fid = f.file_id
        data = encode_records(fid, records)
        pos = len(data)
        view[:pos] = data
        view[pos:size] = padding_record(fid, size - pos)
        return view

    def _zero_ahead(self, f: _File, end: int) -> None:
        step = self.options.prealloc_mb * MiB
        target = (end // step + 1) * step
        if self._zero is None:
            self._zero = native.alloc_aligned(_ZERO_CHUNK, 4096)
        pos = max(f.zeroed_until, f.offset)
        pos -= pos % 4096
        while pos < target:
            n = min(_ZERO_CHUNK, target - pos)
            f.handle.pwrite(self._zero.view[:n], pos)
            pos += n
        f.zeroed_until = target

    async def close(self) -> None:
        """Stop taking appends, write what is waiting, and close the file (shielded).

        A running writer service drains the queue and returns; without one, the last
        group is written here. Either way one writer at a time touches the file.
        """
        self._closed = True
        with trio.CancelScope(shield=True):
            self._wakeup.set()
            self._threshold.set()
            if self._running:
                await self._run_done.wait()
            elif self._pending and self._failed is None:
                await self._start_group()
                await self._drain()
            slots, self._slots, self._free = self._slots, [], []
            for slot in slots:
                slot.syncer.close()  # idle: every group it took was collected
            if self._file is not None:
                handle = self._file.handle
                self._file = None
                await trio.to_thread.run_sync(handle.close)
