"""Entry logs: interleaved entries of all ledgers, in ``<ledger_dir>/current/<hex id>.log``.

Layout (declared in ``disk/layouts.py``: ENTRY_LOG_HEADER, ENTRY_RECORD_PREFIX,
LEDGERS_MAP_HEAD and LEDGERS_MAP_ITEM): a 1024-byte header (magic, version, log id, the
ledgers map's offset and count, CRC32C), then records (size, CRC32C of the entry, the
entry bytes, which begin with the ledger and entry ids), then, once the log rolls, the
ledgers map: one record saying how many bytes, and up to which entry, each ledger has in
this log.

An entry's location is ``log_id << 32 | offset of its record``. Writes go to a buffer of
``write_buffer_size`` bytes; entries still in the buffer are readable. ``flush()`` writes
the buffer and fdatasyncs every log written since the last flush (the checkpoint's first
step). A log rolls when the next record would pass ``log_size_limit``; the next log goes
to the least-full writable ledger directory.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ledgerd import native
from ledgerd.disk.errors import CorruptRecordError, DiskFullError, StorageError
from ledgerd.disk.fdcache import FdCache
from ledgerd.disk.layouts import (
    CRC,
    ENTRY_LOG_HEADER,
    ENTRY_LOG_HEADER_SIZE,
    ENTRY_LOG_MAGIC,
    ENTRY_RECORD_PREFIX,
    LEDGERS_MAP_HEAD,
    LEDGERS_MAP_ITEM,
    LEDGERS_MAP_ITEM_V1,
    crc32c,
    fast_struct,
)
from ledgerd.wire.entry import entry_ids

__all__ = ["ENTRY_LOG_HEADER_SIZE", "EntryLogMeta", "EntryLogger", "LogRecordInfo",
           "inspect_entry_log", "read_entry_log_meta", "read_ledgers_map", "read_log_ledgers",
           "read_records"]

DISK_FULL_RETRY_S = 1.0
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

_MAGIC = ENTRY_LOG_MAGIC
_HEAD = fast_struct(ENTRY_LOG_HEADER, stop="crc")  # the fields the CRC covers
_REC = fast_struct(ENTRY_RECORD_PREFIX)
_MAP_HEAD = fast_struct(LEDGERS_MAP_HEAD)
_MAP_ITEM = fast_struct(LEDGERS_MAP_ITEM_V1)
_MAP_ITEM_V2 = fast_struct(LEDGERS_MAP_ITEM)
_MAP_VERSION = -3  # with each ledger's last entry id; -2 (the first version) had none
MAX_ENTRY = 64 * 1024 * 1024
_READ_CHUNK = 4 << 20  # a scan for a ledgers map reads this much at a time


def _header(log_id: int, map_offset: int = 0, count: int = 0) -> bytes:
    head = _HEAD.pack(_MAGIC, 1, 0, log_id, map_offset, count)
    return head + CRC.pack(crc32c(head)) + bytes(
        ENTRY_LOG_HEADER_SIZE - _HEAD.size - 4)


def _parse_header(data: bytes, path: str) -> tuple[int, int, int]:
    if len(data) < _HEAD.size + 4:
        raise CorruptRecordError(path, 0, "file too short for an entry log header")
    magic, version, _flags, log_id, map_offset, count = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptRecordError(path, 0, f"bad magic {magic!r} (not a ledgerd entry log)")
    (crc,) = CRC.unpack_from(data, _HEAD.size)
    if crc != crc32c(data[: _HEAD.size]) or version != 1:
        raise CorruptRecordError(path, 0, "entry log header checksum or version mismatch")
    return log_id, map_offset, count


@dataclass
class _Log:
    log_id: int
    path: Path
    fd: int
    size: int  # bytes handed to the writer (header + records); the buffer starts here
    buffer: bytearray
    ledgers: dict[int, int]  # ledger id -> bytes, for the ledgers map
    last_entries: dict[int, int] = field(default_factory=dict)  # ledger id -> last entry
    synced: int = 0  # bytes known to be on stable storage
    written: int = 0  # bytes the writer thread has written (contiguous from 0)
    # Segments handed to the writer and not yet written: (offset, bytes). Guarded by
    # the logger's lock; entries in them are read from memory.
    pending: deque[tuple[int, bytearray]] = field(default_factory=deque)
    rolled: bool = False  # the ledgers map is queued; the header patch follows it
    header_written: bool = False
    written_back: int = 0  # write-behind: bytes whose write-out the writer has started


class _Writer:
    """One thread that writes full entry-log buffers, so the event loop only copies.

    Buffered appends to the page cache cost the kernel about as much per byte as the
    copy itself, and at 100+ MB/s that was a fifth of the event loop's time. Segments
    are written in the order handed over; ``wait_written`` blocks (in a worker thread,
    never the event loop) until a log has reached a size.
    """

    def __init__(self, lock: threading.Lock, writeback_bytes: int = 0) -> None:
        self.lock = lock
        self.writeback_bytes = writeback_bytes
        self.cond = threading.Condition(lock)
        self.queue: queue.SimpleQueue[tuple[_Log, int, bytearray] | Callable[[], None] | None] \
            = queue.SimpleQueue()
        self.error: BaseException | None = None
        # Set while a write waits for space (ENOSPC/EDQUOT): the segment stays queued and
        # is retried every DISK_FULL_RETRY_S or on ``retry()``; nothing is dropped.
        self.full: DiskFullError | None = None
        self.full_attempts = 0  # writes that met ENOSPC (so a waiter can tell a fresh one)
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="entrylog-writer", daemon=True)
        self.thread.start()

    def submit(self, log: _Log, offset: int, data: bytearray) -> None:
        self.queue.put((log, offset, data))

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the writer thread after what is queued (errors are dropped:
        preallocation is an optimisation, and the roll creates the log itself)."""
        self.queue.put(fn)

    def _run(self) -> None:
        item: tuple[_Log, int, bytearray] | Callable[[], None] | None = None
        while True:
            if item is None:
                item = self.queue.get()
                if item is None:
                    return
            if callable(item):
                try:
                    item()
                except Exception:
                    pass
                item = None
                continue
            log, offset, data = item
            try:
                if self.error is None:
                    native.pwrite_fd(log.fd, data, offset, log.path)
            except OSError as exc:
                if exc.errno in _NO_SPACE:
                    with self.cond:
                        self.full = DiskFullError(str(log.path), str(exc))
                        self.full_attempts += 1
                        self.cond.notify_all()
                        self.cond.wait(DISK_FULL_RETRY_S)
                        if self._stopping:
                            return  # what was not written is in the journal
                    continue  # the same segment again
                self.error = StorageError(f"writing {log.path} at {offset}: {exc}")
            with self.cond:
                self.full = None
                if log.pending and log.pending[0][0] == offset:
                    log.pending.popleft()
                if offset == 0:
                    log.header_written = True
                else:
                    log.written = max(log.written, offset + len(data))
                self.cond.notify_all()
            if self.writeback_bytes and log.written - log.written_back >= self.writeback_bytes:
                self._write_behind(log)
            item = None

    def _write_behind(self, log: _Log) -> None:
        """Start the write-out of what was written since the last call, without waiting
        (``flush_entrylog_bytes``): the checkpoint's fdatasync then finds little dirty
        data, instead of seconds' worth that it flushed in one burst, queueing the
        journal's own syncs behind it on a shared disk. Not a durability step: the
        checkpoint still fdatasyncs. A failure here is left to that fdatasync."""
        start, end = log.written_back, log.written
        log.written_back = end
        try:
            native.sync_file_range_fd(log.fd, start, end - start,
                                      native.SYNC_FILE_RANGE_WRITE, log.path)
        except OSError:
            pass

    def wait_written(self, log: _Log, size: int) -> None:
        """Block until ``log`` reached ``size``; raises the writer's error, or
        DiskFullError while it waits for space (the data stays queued)."""
        def pending() -> bool:
            return log.written < size or (log.rolled and not log.header_written)

        with self.cond:
            if self.full is not None and pending():
                # The last attempt met a full disk: have the writer try again now and
                # judge by that attempt, not by a failure from before space came back.
                seen = self.full_attempts
                self.cond.notify_all()
                while pending() and self.error is None and self.full is not None \
                        and self.full_attempts == seen and not self._stopping:
                    self.cond.wait()
            while pending() and self.error is None and self.full is None:
                self.cond.wait()
            full = self.full
        if self.error is not None:
            raise self.error
        if full is not None and (log.written < size or (log.rolled and not log.header_written)):
            raise full

    def retry(self) -> None:
        """Retry a write that waits for space now."""
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self.queue.put(None)
        self.thread.join()


class EntryLogger:
    def __init__(self, ledger_dirs: list[Path], *, log_size_limit: int,
                 write_buffer_size: int, readers: FdCache | None = None,
                 preallocate: bool = True, read_buffer_size: int = 512,
                 writeback_bytes: int = 0) -> None:
        self.preallocate = preallocate
        self.writeback_bytes = writeback_bytes
        # One pread takes the record header and this many bytes: an entry that fits
        # costs one system call instead of two (readBufferSizeBytes).
        self.read_buffer_size = max(8, read_buffer_size)
        self.short_reads = 0  # reads the first pread covered
        # The next log, created ahead by the writer thread (under the lock).
        self._next: _Log | None = None
        self._pending_next: int | None = None  # the id the writer thread was asked to make
        self.preallocated = 0  # rolls that found their next log ready
        self.dirs = [Path(d) / "current" for d in ledger_dirs]
        self.limit = log_size_limit
        self.buffer_size = write_buffer_size
        self.paths: dict[int, Path] = {}
        self._readers = readers if readers is not None else FdCache(4096)
        self._current: _Log | None = None
        self._unsynced: list[_Log] = []
        self.full_dirs: set[Path] = set()
        self._roll_requested = False
        self._lock = threading.Lock()
        self._writer: _Writer | None = None

    def open(self) -> None:
        self._writer = _Writer(self._lock, self.writeback_bytes)
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
            for p in d.glob("*.log"):
                try:
                    self.paths[int(p.stem, 16)] = p
                except ValueError:
                    continue
        last = max(self.paths, default=0)
        for d in self.dirs:
            try:
                last = max(last, int((d / "lastId").read_text().strip() or "0", 16))
            except (OSError, ValueError):
                pass
        self._current = self._create(last + 1)
        self._prepare_next()

    def _prepare_next(self) -> None:
        """With preallocation on, have the writer thread create the log after the
        current one (file, header, lastId), so a roll does not pay for it."""
        cur, writer = self._current, self._writer
        if not self.preallocate or cur is None or writer is None:
            return
        log_id = cur.log_id + 1
        with self._lock:
            self._pending_next = log_id

        def make() -> None:
            with self._lock:
                if self._pending_next != log_id:
                    return  # the roll came first and took another id
            log = self._create_file(log_id, exclusive=True)
            with self._lock:
                if self._pending_next == log_id:
                    self._next, self._pending_next = log, None
                    return
            # Given up on while being made: nobody else uses this id (the roll skipped
            # it), so the file can go.
            os.close(log.fd)
            log.path.unlink(missing_ok=True)
        writer.call(make)

    def _next_log(self, log_id: int) -> _Log:
        """The log to roll to: the preallocated one when ready; else a new one, made
        here, with an id past any the writer thread may still be making."""
        with self._lock:
            nxt, self._next = self._next, None
            pending, self._pending_next = self._pending_next, None
        if nxt is not None and nxt.log_id == log_id and nxt.path.parent not in self.full_dirs:
            self.paths[log_id] = nxt.path
            self.preallocated += 1
            return nxt
        if nxt is not None:  # in a directory now full: drop it
            os.close(nxt.fd)
            nxt.path.unlink(missing_ok=True)
        if pending is not None and pending >= log_id:
            log_id = pending + 1
        return self._create(log_id)

    def _pick_dir(self) -> Path:
        writable = [d for d in self.dirs if d not in self.full_dirs] or self.dirs
        return max(writable, key=_free_bytes)

    def set_full_dirs(self, full: set[Path]) -> None:
        """Directories new logs must skip; if the current log is in one and another
        has room, the next add rolls to a new log there."""
        self.full_dirs = set(full)
        cur = self._current
        self._roll_requested = bool(
            cur is not None and cur.path.parent in full
            and any(d not in full for d in self.dirs))

    def _create(self, log_id: int) -> _Log:
        log = self._create_file(log_id)
        self.paths[log_id] = log.path
        return log

    def _create_file(self, log_id: int, *, exclusive: bool = False) -> _Log:
        d = self._pick_dir()
        path = d / f"{log_id:x}.log"
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
        try:
            fd = os.open(path, flags, 0o644)
            native.tag_fd(fd, "entrylog")
            native.pwrite_fd(fd, _header(log_id), 0, path)
            (d / "lastId").write_text(f"{log_id:x}\n")
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                raise DiskFullError(str(path), str(exc)) from exc
            raise
        return _Log(log_id, path, fd, ENTRY_LOG_HEADER_SIZE, bytearray(), defaultdict(int),
                    written=ENTRY_LOG_HEADER_SIZE)

    @property
    def current_log_id(self) -> int:
        assert self._current is not None
        return self._current.log_id

    def add(self, ledger_id: int, entry: bytes) -> int:
        """Append an entry; returns its location. Raises StorageError on I/O failure."""
        return self.add_many(ledger_id, (entry,))[0]

    def add_many(self, ledger_id: int, entries: Sequence[bytes]) -> list[int]:
        """Append a frame's entries; their locations, in order. A batch that would pass
        ``log_size_limit`` goes entry by entry so the log rolls between them."""
        log = self._current
        assert log is not None
        total = 0
        for e in entries:
            n = len(e)
            if n > MAX_ENTRY:
                raise StorageError(f"entry of {n} bytes exceeds the {MAX_ENTRY}-byte maximum")
            total += n + 8
        offset = log.size + len(log.buffer)
        if self._roll_requested and offset > ENTRY_LOG_HEADER_SIZE:
            self._roll_requested = False
            log = self._roll()
            offset = log.size
        if offset + total > self.limit and (offset > ENTRY_LOG_HEADER_SIZE
                                            or len(entries) > 1):
            if len(entries) > 1:
                return [loc for e in entries for loc in self.add_many(ledger_id, (e,))]
            log = self._roll()
            offset = log.size
        buf = log.buffer
        locations: list[int] = []
        base = log.log_id << 32
        pack, crc = _REC.pack, crc32c
        for e in entries:
            buf += pack(len(e), crc(e))
            buf += e
            locations.append(base | offset)
            offset += 8 + len(e)
        log.ledgers[ledger_id] += total
        last = entries[-1]
        if len(last) >= 16:
            eid = entry_ids(last)[1]
            if eid > log.last_entries.get(ledger_id, -1):
                log.last_entries[ledger_id] = eid
        if len(buf) >= self.buffer_size:
            self._write_buffer(log)
        return locations

    def add_sorted(self, items: Sequence[tuple[int, int, bytes]]) -> list[int]:
        """Append (ledger, entry id, bytes) records of many ledgers in the order given
        (the db storage's sorted flush); their locations, in order. One loop for all
        of them: a flush of 100,000 ledgers with an entry each made as many calls of
        ``add_many``, and those calls were most of its time."""
        log = self._current
        assert log is not None
        if self._roll_requested and log.size + len(log.buffer) > ENTRY_LOG_HEADER_SIZE:
            self._roll_requested = False
            log = self._roll()
        out: list[int] = []
        append = out.append
        pack, crc = _REC.pack, crc32c
        limit, bufsize = self.limit, self.buffer_size
        buf = log.buffer
        offset = log.size + len(buf)
        base = log.log_id << 32
        ledgers, lasts = log.ledgers, log.last_entries
        for lid, eid, e in items:
            n = len(e)
            if n > MAX_ENTRY:
                raise StorageError(f"entry of {n} bytes exceeds the {MAX_ENTRY}-byte maximum")
            if offset + n + 8 > limit and offset > ENTRY_LOG_HEADER_SIZE:
                log = self._roll()
                buf, offset, base = log.buffer, log.size, log.log_id << 32
                ledgers, lasts = log.ledgers, log.last_entries
            buf += pack(n, crc(e))
            buf += e
            append(base | offset)
            offset += 8 + n
            ledgers[lid] += n + 8
            if eid > lasts.get(lid, -1):
                lasts[lid] = eid
            if len(buf) >= bufsize:
                self._write_buffer(log)
                buf = log.buffer
        return out

    def _write_buffer(self, log: _Log) -> None:
        """Hand the buffer to the writer thread (it stays readable until written)."""
        writer = self._writer
        assert writer is not None
        if writer.error is not None:
            raise StorageError(f"entry log writer failed: {writer.error}")
        if log.buffer:
            data, log.buffer = log.buffer, bytearray()
            offset = log.size
            with self._lock:
                log.pending.append((offset, data))
            log.size += len(data)
            writer.submit(log, offset, data)

    def _roll(self) -> _Log:
        old = self._current
        assert old is not None
        lasts = old.last_entries
        body = _MAP_HEAD.pack(-1, _MAP_VERSION, len(old.ledgers)) + b"".join(
            _MAP_ITEM_V2.pack(lid, nbytes, lasts.get(lid, -1))
            for lid, nbytes in sorted(old.ledgers.items()))
        map_offset = old.size + len(old.buffer)
        old.buffer += _REC.pack(len(body), crc32c(body)) + body
        self._write_buffer(old)
        # The header patch goes through the writer too, after every record.
        assert self._writer is not None
        old.rolled = True
        self._writer.submit(old, 0, bytearray(_header(old.log_id, map_offset, len(old.ledgers))))
        self._unsynced.append(old)
        self._current = self._next_log(old.log_id + 1)
        self._prepare_next()
        return self._current

    def read(self, location: int) -> bytes:
        """The entry bytes at ``location``; raises CorruptRecordError if they fail checks."""
        log_id, offset = location >> 32, location & 0xFFFFFFFF
        cur = self._current
        if cur is not None and log_id == cur.log_id and offset >= cur.size:
            start = offset - cur.size
            n, crc = _REC.unpack_from(cur.buffer, start)
            return bytes(cur.buffer[start + 8: start + 8 + n])
        log = cur if cur is not None and log_id == cur.log_id else next(
            (u for u in self._unsynced if u.log_id == log_id), None)
        if log is not None and log.pending:
            with self._lock:
                for seg_start, seg in log.pending:
                    if seg_start <= offset < seg_start + len(seg):
                        start = offset - seg_start
                        n, crc = _REC.unpack_from(seg, start)
                        return bytes(seg[start + 8: start + 8 + n])
        fd = self._reader(log_id)
        path = str(self.paths[log_id])
        head = os.pread(fd, self.read_buffer_size, offset)
        if len(head) < 8:
            raise CorruptRecordError(path, offset, "entry record header past end of log")
        n, crc = _REC.unpack_from(head)
        if n > MAX_ENTRY:
            raise CorruptRecordError(path, offset, f"junk entry size {n}")
        if 8 + n <= len(head):
            self.short_reads += 1
            data = head[8: 8 + n]
        else:
            data = os.pread(fd, n, offset + 8)
        if len(data) < n or crc32c(data) != crc:
            raise CorruptRecordError(path, offset, "entry checksum mismatch")
        return data

    def read_ahead(self, location: int, following: Sequence[tuple[int, int]],
                   max_bytes: int) -> Iterator[tuple[int, bytes]]:
        """Entries after the one at ``location`` with one read: ``following`` is
        (entry id, location) in order; those in the same log, each past the one before
        (from ``location`` on), and within ``max_bytes`` of the first are read as one
        span (what the writer thread has not written yet is left out). Yields (entry
        id, bytes) while they check; stops at the first that does not (a read-ahead is
        a guess, never an error)."""
        log_id, offset = location >> 32, location & 0xFFFFFFFF
        limit: int | None = None
        for log in (self._current, *self._unsynced):
            if log is not None and log.log_id == log_id:
                limit = log.written
        wanted: list[tuple[int, int]] = []
        last = offset
        for eid, loc in following:
            off = loc & 0xFFFFFFFF
            # In the log's order only: an entry added again (a recovery's re-add, after
            # its successors were written) lies further on, or in another log.
            if loc >> 32 != log_id or off <= last:
                break
            last = off
            if wanted and off - wanted[0][1] > max_bytes:
                break
            wanted.append((eid, off))
        if not wanted:
            return
        start = wanted[0][1]
        length = wanted[-1][1] - start + self.read_buffer_size
        if limit is not None:
            length = min(length, limit - start)
        if length <= 8:
            return
        try:
            fd = self._reader(log_id)
            buf = os.pread(fd, length, start)
        except (OSError, StorageError):
            return
        view = memoryview(buf)
        for eid, off in wanted:
            rel = off - start
            if rel + 8 > len(buf):
                return
            n, crc = _REC.unpack_from(buf, rel)
            if n > MAX_ENTRY:
                return
            if rel + 8 + n <= len(buf):
                data = bytes(view[rel + 8: rel + 8 + n])
            elif eid == wanted[-1][0] and (limit is None or off + 8 + n <= limit):
                try:  # the last one is longer than the read buffer
                    data = os.pread(fd, n, off + 8)
                except OSError:
                    return
            else:
                return
            if crc32c(data) != crc:
                return
            yield eid, data

    def _reader(self, log_id: int) -> int:
        cur = self._current
        if cur is not None and log_id == cur.log_id:
            return cur.fd
        for log in self._unsynced:
            if log.log_id == log_id:
                return log.fd
        path = self.paths.get(log_id)
        if path is None:
            raise StorageError(f"entry log {log_id:x} is missing")
        return self._readers.get(("log", log_id),
                                 lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def flush(self) -> None:
        """Write the buffer and fdatasync every log written since the last flush."""
        logs = self.write_out()
        self.sync(logs)
        self.release(logs)

    def write_out(self) -> list[tuple[_Log, int]]:
        """Checkpoint step 1, in the owner's thread: write the buffer to the file.

        Returns what ``sync`` must make durable. Adds may go on while ``sync`` runs in a
        worker thread; ``release`` (owner's thread again) records the result.
        """
        cur = self._current
        assert cur is not None
        self._write_buffer(cur)
        return [(log, log.size) for log in [*self._unsynced, cur] if log.size > log.synced]

    def sync(self, logs: list[tuple[_Log, int]]) -> None:
        """Wait for the writer to reach each size, then fdatasync (a worker thread)."""
        assert self._writer is not None
        for log, size in logs:
            self._writer.wait_written(log, size)
            try:
                native.fdatasync_fd(log.fd, log.path)
            except OSError as exc:
                raise StorageError(f"syncing {log.path}: {exc}") from exc

    def release(self, logs: list[tuple[_Log, int]]) -> None:
        """After ``sync``: note what is durable; close rolled logs that are fully synced."""
        for log, size in logs:
            log.synced = max(log.synced, size)
        keep = []
        for log in self._unsynced:
            if log.synced >= log.size:
                os.close(log.fd)
            else:
                keep.append(log)
        self._unsynced = keep

    def rolled_log_ids(self) -> list[int]:
        """Logs that will not be written again and are durable (GC candidates)."""
        cur = self._current
        busy = {log.log_id for log in self._unsynced}
        if cur is not None:
            busy.add(cur.log_id)
        return sorted(i for i in self.paths if i not in busy and (cur is None or i < cur.log_id))

    def disk_bytes(self) -> int:
        """Bytes the entry logs take on disk (for metrics)."""
        total = 0
        for path in list(self.paths.values()):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def remove_log(self, log_id: int) -> Path | None:
        """Forget a rolled log; returns its path for the caller to unlink."""
        self._readers.close(("log", log_id))
        return self.paths.pop(log_id, None)

    def retry_writes(self) -> None:
        """A write waiting for space: try it now (it also retries by itself)."""
        if self._writer is not None:
            self._writer.retry()

    def abandon(self) -> None:
        """Close without writing what is buffered (the disk is full; the journal holds
        it all and the next start replays it)."""
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        for log in [*self._unsynced, *([self._current] if self._current else [])]:
            os.close(log.fd)
        self._unsynced = []
        self._current = None
        self._drop_next()
        self._readers.close_all()

    def close(self) -> None:
        if self._current is not None:
            self.flush()
            os.close(self._current.fd)
            self._current = None
        if self._writer is not None:
            self._writer.stop()
            self._writer = None
        self._drop_next()
        self._readers.close_all()

    def _drop_next(self) -> None:
        """The preallocated log goes (the writer has stopped, so nothing makes another)."""
        with self._lock:
            nxt, self._next = self._next, None
            self._pending_next = None
        if nxt is not None:
            os.close(nxt.fd)
            nxt.path.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class LogRecordInfo:
    offset: int
    size: int
    ledger_id: int
    entry_id: int
    crc_ok: bool
    problem: str = ""


def read_ledgers_map(path: Path) -> dict[int, int] | None:
    """The ledgers map of a rolled log (ledger id -> bytes), None if it never rolled."""
    both = read_log_ledgers(path)
    return None if both is None else both[0]


def read_log_ledgers(path: Path) -> tuple[dict[int, int], dict[int, int]] | None:
    """A rolled log's ledgers map: (ledger id -> bytes, ledger id -> last entry id in
    this log; empty for a first-version map); None if the log never rolled."""
    with open(path, "rb") as f:
        head = f.read(ENTRY_LOG_HEADER_SIZE)
        _log_id, map_offset, _count = _parse_header(head, str(path))
        if not map_offset:
            return None
        f.seek(map_offset)
        rec = f.read(8)
        if len(rec) < 8:
            raise CorruptRecordError(str(path), map_offset, "ledgers map past end of log")
        n, crc = _REC.unpack(rec)
        body = f.read(n)
    if len(body) < n or crc32c(body) != crc or n < _MAP_HEAD.size:
        raise CorruptRecordError(str(path), map_offset, "ledgers map checksum mismatch")
    _lid, version, count = _MAP_HEAD.unpack_from(body, 0)
    item = _MAP_ITEM_V2 if version == _MAP_VERSION else _MAP_ITEM
    if version not in (-2, -3):
        raise CorruptRecordError(str(path), map_offset, f"unknown ledgers map version {version}")
    start = _MAP_HEAD.size
    if start + item.size * count > n:
        raise CorruptRecordError(str(path), map_offset, f"ledgers map count {count} too big")
    items = [item.unpack_from(body, start + item.size * i) for i in range(count)]
    sizes = {it[0]: it[1] for it in items}
    lasts = {it[0]: it[2] for it in items} if version == _MAP_VERSION else {}
    return sizes, lasts


def inspect_entry_log(path: Path) -> tuple[dict[int, int] | None, str,
                                           Iterator[LogRecordInfo]]:
    """For tools: the ledgers map (None if the log never rolled, or if it cannot be
    read), what is wrong with the map ("" if nothing), and every record up to where the
    file ends or breaks. A truncated log still lists its intact records, as
    ``readjournal`` does for a torn journal."""
    data = path.read_bytes()
    _log_id, map_offset, _count = _parse_header(data, str(path))
    ledgers: dict[int, int] | None = None
    map_problem = ""
    if map_offset:
        try:
            ledgers = read_ledgers_map(path)
        except CorruptRecordError as exc:
            map_problem = f"{exc.reason} (offset {map_offset}; the file has {len(data)} bytes)"

    def records() -> Iterator[LogRecordInfo]:
        pos = ENTRY_LOG_HEADER_SIZE
        while pos + 8 <= len(data):
            n, crc = _REC.unpack_from(data, pos)
            if n == 0:
                return
            if pos + 8 + n > len(data):
                yield LogRecordInfo(pos, n, -1, -1, False, "truncated: record runs past the end")
                return
            body = data[pos + 8: pos + 8 + n]
            lid, eid = entry_ids(body) if n >= 16 else (-1, -1)
            ok = crc32c(body) == crc
            yield LogRecordInfo(pos, n, lid, eid, ok, "" if ok else "crc mismatch")
            pos += 8 + n

    return ledgers, map_problem, records()


def _free_bytes(d: Path) -> int:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return -1


@dataclass(frozen=True, slots=True)
class EntryLogMeta:
    log_id: int
    ledgers: dict[int, int]  # ledger id -> bytes (records included)
    # ledger id -> its last entry id in this log (absent: unknown, as in old maps)
    last_entries: dict[int, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.ledgers.values())

    def is_live(self, ledger_id: int, live: Container[int],
                trimmed: Mapping[int, int] | None = None) -> bool:
        """The ledger has entries here still wanted: it exists, and (if trimmed from
        the front to ``trimmed[ledger_id]``) its last entry here is at or past that."""
        if ledger_id not in live:
            return False
        first = trimmed.get(ledger_id, 0) if trimmed else 0
        return first <= 0 or self.last_entries.get(ledger_id, first) >= first

    def live_bytes(self, live: Container[int], trimmed: Mapping[int, int] | None = None) -> int:
        return sum(n for lid, n in self.ledgers.items() if self.is_live(lid, live, trimmed))

    def usage(self, live: Container[int], trimmed: Mapping[int, int] | None = None) -> float:
        total = self.total_bytes
        return self.live_bytes(live, trimmed) / total if total else 0.0


def read_records(path: Path, offset: int, max_bytes: int) -> tuple[list[tuple[int, bytes]], int]:
    """Records from ``offset``: ``[(record offset, entry bytes)]`` and the offset to go on
    from (0 at the end of the log). Reads about ``max_bytes``; the ledgers map is skipped."""
    out: list[tuple[int, bytes]] = []
    pos = offset
    with open(path, "rb", buffering=1 << 20) as f:
        f.seek(offset)
        while pos - offset < max_bytes:
            head = f.read(8)
            if len(head) < 8:
                return out, 0
            n, _crc = _REC.unpack(head)
            if n == 0 or n > MAX_ENTRY:
                return out, 0
            body = f.read(n)
            if len(body) < n:
                return out, 0
            if n >= 16 and entry_ids(body)[0] >= 0:
                out.append((pos, body))
            pos += 8 + n
    return out, pos


def read_entry_log_meta(path: Path, log_id: int) -> EntryLogMeta:
    """The log's ledgers map, from its header or, if it never rolled, by scanning it."""
    both = read_log_ledgers(path)
    if both is not None:
        return EntryLogMeta(log_id, *both)
    counts: dict[int, int] = defaultdict(int)
    lasts: dict[int, int] = {}
    offset = ENTRY_LOG_HEADER_SIZE
    while offset:
        records, offset = read_records(path, offset, _READ_CHUNK)
        for _off, body in records:
            lid, eid = entry_ids(body)
            counts[lid] += len(body) + 8
            if eid > lasts.get(lid, -1):
                lasts[lid] = eid
    return EntryLogMeta(log_id, dict(counts), lasts)
