"""The write-ahead journal: group commit on O_DIRECT with one fdatasync per group.

Callers ``await journal.append(records)``; the call returns once those records are
durable. The writer service (``run``) takes everything waiting as one group when

- the oldest waiting record is older than ``max_group_wait_ms``, or
- ``buffered_writes_threshold`` bytes or ``buffered_entries_threshold`` records wait, or
- ``flush_when_queue_empty`` is set (then it writes as soon as it has anything),

encodes it into one aligned buffer padded to ``alignment``, and hands it to the native
helper's syncer thread for one ``pwrite`` + one ``fdatasync``; the event loop waits on
the syncer's eventfd. That thread never takes the GIL: a Python worker thread needed
it to start and to return, and under load each group cycle waited 1-3 ms for it
around a 0.3 ms sync (bench/latency.py). While a group syncs, the next accumulates, so
under load groups grow by themselves and the hand-off is paid per group, never per
record. A group that rolls the file or must zero ahead first takes a worker thread.

Space ahead of the write position is pre-zeroed in ``prealloc_mb`` steps: overwriting
zeroed blocks syncs about twice as fast on this disk as appending or writing into
fallocate()d extents. Files roll at ``max_size_mb``. Where O_DIRECT is refused (tmpfs,
some overlays), the journal falls back to buffered writes + fdatasync and logs it once.

An I/O error fails the group's callers and every later append with StorageError (ENOSPC
as DiskFullError): the journal never acknowledges what it could not make durable.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from ledgerd import native
from ledgerd.base.logs import fields
from ledgerd.disk.errors import DiskFullError, StorageClosedError, StorageError
from ledgerd.disk.journal_format import (
    HEADER_SIZE,
    RecordType,
    encode_header,
    encode_record,
    encode_records,
)
from ledgerd.disk.journal_scan import journal_file_ids

__all__ = ["Journal", "JournalGroup", "JournalOptions", "JournalPosition"]

log = logging.getLogger(__name__)
MiB = 1 << 20
_ZERO_CHUNK = 1 * MiB


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


class JournalGroup:
    """The group commit a submission joined; ``wait()`` returns once it is durable."""

    __slots__ = ("callbacks", "done", "error", "position")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.position = JournalPosition(0, 0)
        # Called (in the trio thread) once the group is done: the server's connections
        # ask to be woken here instead of waking a task only to wait for the group.
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
        self._slow_path = False
        self.background_zero_bytes = 0
        self.slow_groups = 0  # groups that rolled the file or zeroed ahead themselves
        self._buf: native.AlignedBuffer | None = None
        self.buffer_allocations = 0
        self._syncer: native.Syncer | None = None
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
        if self._syncer is None:
            self._syncer = native.Syncer()

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
        self._wakeup.set()
        return self._group

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
            if not self._pending:
                if self._closed:
                    return
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                continue
            if self.options.flush_when_queue_empty:
                await self._wait_queue_empty()
            elif not self._threshold.is_set() and not self._closed:
                with trio.move_on_at(self._oldest + wait):
                    await self._threshold.wait()
            await self._write_group()
            if self._failed is not None:
                raise self._failed

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

    async def _write_group(self) -> None:
        records, self._pending = self._pending, []
        self._writing_bytes, self._pending_bytes = self._pending_bytes, 0
        nbytes = self._writing_bytes
        group, self._group = self._group, JournalGroup()
        self._threshold = trio.Event()
        try:
            position = await self._write_native(records, nbytes)
            if position is None and self._zeroing is not None:
                # Never zero ahead or roll under the background zeroer: let it finish
                # (its chunks are what this group needs), then try the fast path again.
                with trio.CancelScope(shield=True):
                    await self._zeroing.wait()
                position = await self._write_native(records, nbytes)
            if position is None:
                self._slow_path = True  # the zeroer stays off the file meanwhile
                self.slow_groups += 1
                try:
                    position = await trio.to_thread.run_sync(self._write_sync, records, nbytes,
                                                             abandon_on_cancel=False)
                finally:
                    self._slow_path = False
            self._writing_bytes = 0
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                err: BaseException = DiskFullError(str(self._file.path if self._file else self.dir),
                                                   str(exc))
            elif isinstance(exc, (OSError, StorageError)):
                err = StorageError(f"journal write failed: {exc}")
            else:
                err = exc
            self._failed = err
            group.error = err
            group.finish()
            # Everyone who joined after this group fails too.
            self._group.error = err
            self._group.finish()
            log.error("journal_failed", extra=fields(error=repr(exc)))
            if not isinstance(err, (OSError, StorageError)):
                raise
            return
        self._durable = position
        group.position = position
        group.finish()
        if self.on_group is not None:
            self.on_group(len(records), nbytes,
                          self.last_sync_seconds)

    async def _zero_service(self) -> None:
        """Zero the next prealloc step ahead of the write position, off the group path.

        Zeroing a whole step inside a group (the slow path) held that group, and every
        add waiting on it, for the 16 MiB write and a sync that flushed it: the 30-40 ms
        stalls of bench/latency.py's open loop, about once a second at 4.6k adds/s. Here
        a step is written in ``_ZERO_CHUNK`` pieces by a worker thread while groups go on
        below ``zeroed_until``; each piece raises ``zeroed_until`` when written, and the
        next group's fdatasync makes it durable. Groups never write at or above
        ``zeroed_until`` on the fast path, and the slow path (roll, or zeroing a group
        that outran this) waits for the zeroer, so the two never touch the same bytes.
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
                target = (f.zeroed_until // step + 1) * step
                limit = self.options.max_size_mb * MiB + step
                while (f.zeroed_until < min(target, limit) and self._file is f
                       and not self._closed):
                    pos = f.zeroed_until
                    n = min(_ZERO_CHUNK, target - pos)
                    await trio.to_thread.run_sync(f.handle.pwrite, self._zero.view[:n], pos,
                                                  abandon_on_cancel=False)
                    f.zeroed_until = pos + n
                    self.background_zero_bytes += n
            except (OSError, StorageError) as exc:
                # Not fatal: the group path zeroes for itself and reports what fails.
                log.warning("journal_zero_ahead_failed", extra=fields(error=repr(exc)))
            finally:
                self._zeroing.set()
                self._zeroing = None

    def _want_zero_ahead(self, f: _File, end: int) -> None:
        if (self._zeroing is None and f.zeroed_until > 0
                and f.zeroed_until - end < self.options.prealloc_mb * MiB // 2):
            self._zero_wanted.set()

    def _write_sync(self, records: list[tuple[int, bytes]], total: int) -> JournalPosition:
        """Worker thread: encode, pad, write, zero ahead, fdatasync. Returns the new mark.
        The slow path, for groups that roll the file or need zeroing ahead first."""
        f = self._file
        assert f is not None
        o = self.options
        size = -(-total // o.alignment) * o.alignment
        if f.offset + size > o.max_size_mb * MiB and f.offset > HEADER_SIZE:
            f.handle.close()
            f = self._file = self._new_file(f.file_id + 1)
        view = self._encode(f, records, total)
        end = f.offset + size
        if end > f.zeroed_until:
            self._zero_ahead(f, end)
        t0 = time.perf_counter()
        f.handle.pwrite(view, f.offset)
        if o.sync_data:
            f.handle.fdatasync()
        self.last_sync_seconds = time.perf_counter() - t0
        return self._written(f, end, len(records), size)

    async def _write_native(self, records: list[tuple[int, bytes]],
                            total: int) -> JournalPosition | None:
        """The fast path: encode here, then the native syncer's own thread writes and
        syncs without the GIL while the event loop waits on its eventfd. None (nothing
        written) when the group must roll the file or zero ahead: the slow path does."""
        f = self._file
        syncer = self._syncer
        assert f is not None
        if syncer is None:
            return None
        o = self.options
        size = -(-total // o.alignment) * o.alignment
        end = f.offset + size
        if (end > o.max_size_mb * MiB and f.offset > HEADER_SIZE) or end > f.zeroed_until:
            return None
        view = self._encode(f, records, total)
        syncer.submit(f.handle, view, f.offset, sync=o.sync_data)
        if self._running:
            self._want_zero_ahead(f, end)
        seconds: float | None = None
        with trio.CancelScope(shield=True):  # the write runs on; so does the wait for it
            while seconds is None:
                await trio.lowlevel.wait_readable(syncer)
                seconds = syncer.collect()
        assert seconds is not None
        self.last_sync_seconds = seconds
        return self._written(f, end, len(records), size)

    def _encode(self, f: _File, records: list[tuple[int, bytes]], total: int) -> memoryview:
        """The group's records, padded to the alignment, in the reused aligned buffer."""
        align = self.options.alignment
        size = -(-total // align) * align
        buf = self._buf
        if buf is None or buf.size < size:
            # One buffer, reused group after group (one group is written at a time).
            start = max(size, self.options.write_buffer_size, align)
            buf = self._buf = native.alloc_aligned(-(-start // align) * align, align)
            self.buffer_allocations += 1
        view = buf.view[:size]
        fid = f.file_id
        data = encode_records(fid, records)
        pos = len(data)
        view[:pos] = data
        if size - pos >= 9:
            pad = encode_record(fid, RecordType.PADDING, bytes(size - pos - 9))
            view[pos:size] = pad
        elif size > pos:
            # Fewer than 9 bytes left: zeros (the buffer is reused, so write them), which
            # read as the end of this group's block; the next group starts aligned.
            view[pos:size] = bytes(size - pos)
        return view

    def _written(self, f: _File, end: int, records: int, size: int) -> JournalPosition:
        if not self._direct and self.options.remove_from_page_cache:
            f.handle.fadvise_dontneed(0, f.offset)
        f.offset = end
        self.groups_written += 1
        self.records_written += records
        self.bytes_written += size
        return JournalPosition(f.file_id, end)

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
                await self._write_group()
            if self._syncer is not None:
                syncer, self._syncer = self._syncer, None
                syncer.close()  # idle: every group it took was collected
            if self._file is not None:
                handle = self._file.handle
                self._file = None
                await trio.to_thread.run_sync(handle.close)
