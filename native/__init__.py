"""Native I/O helper: aligned buffers, O_DIRECT, pwrite(v), fdatasync, fallocate, fadvise.

The C side lives in ``native/_build.py`` and is compiled by cffi at install time into
``ledgerd.native._native``. A host without a C compiler still installs ledgerd (the
client never imports this package); importing it there raises ``NativeHelperMissing``,
an ImportError whose message says what to install. Every call releases the GIL while the kernel works, so a journal
fdatasync in a worker thread never stalls the trio thread. Failures raise ``OSError``
carrying errno and the path of the file involved; nothing here retries or hides an error.

This is the only module in ledgerd that touches these syscalls (STYLE rule 5).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class NativeHelperMissing(ImportError):
    """The compiled helper is absent: ledgerd was installed without a C compiler."""


try:
    from ledgerd.native._native import ffi, lib
except ModuleNotFoundError as e:
    if e.name != "ledgerd.native._native":
        raise
    raise NativeHelperMissing(
        "ledgerd's native I/O helper was not built (no C compiler when ledgerd was "
        "installed): the client works without it, a bookie needs it; install gcc and "
        "python3-dev, then reinstall ledgerd", name=e.name) from None

__all__ = [
    "FALLOC_FL_KEEP_SIZE",
    "SYNC_FILE_RANGE_WAIT_AFTER",
    "SYNC_FILE_RANGE_WAIT_BEFORE",
    "SYNC_FILE_RANGE_WRITE",
    "AfterSync",
    "AlignedBuffer",
    "NativeFile",
    "NativeHelperMissing",
    "SendAfterSync",
    "Syncer",
    "alloc_aligned",
    "fdatasync_fd",
    "logical_block_size",
    "open_file",
    "pwrite_fd",
    "resume_sends",
    "stop_sends",
    "sync_file_range_fd",
    "tag_fd",
]

SYNC_FILE_RANGE_WAIT_BEFORE: int = lib.LDN_SYNC_FILE_RANGE_WAIT_BEFORE
SYNC_FILE_RANGE_WRITE: int = lib.LDN_SYNC_FILE_RANGE_WRITE
SYNC_FILE_RANGE_WAIT_AFTER: int = lib.LDN_SYNC_FILE_RANGE_WAIT_AFTER
FALLOC_FL_KEEP_SIZE: int = lib.LDN_FALLOC_FL_KEEP_SIZE
IOV_MAX: int = lib.LDN_IOV_MAX
SEND_MAX_FD: int = lib.LDN_SEND_MAX_FD

BytesLike = bytes | bytearray | memoryview


def _raise(rc: int, path: str | os.PathLike[str], op: str) -> None:
    err = -rc
    raise OSError(err, f"{op}: {os.strerror(err)}", os.fspath(path))


class AlignedBuffer:
    """A zero-filled block of memory aligned for O_DIRECT, freed when collected.

    ``view`` is a writable memoryview over the whole block; slices of it keep the
    alignment of their start offset, so ``buf.view[:4096]`` is a valid O_DIRECT source.
    """

    __slots__ = ("_cdata", "alignment", "size", "view")

    def __init__(self, size: int, alignment: int = 4096) -> None:
        if size < 0:
            raise ValueError(f"buffer size must be >= 0, got {size}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        ptr = lib.ldn_alloc_aligned(size, alignment)
        if ptr == ffi.NULL:
            raise MemoryError(f"could not allocate {size} bytes aligned to {alignment}")
        self._cdata = ffi.gc(ptr, lib.ldn_free, size=size)
        self.size = size
        self.alignment = alignment
        self.view = memoryview(ffi.buffer(self._cdata, size))

    def __len__(self) -> int:
        return self.size

    def address(self) -> int:
        """The buffer's start address, for alignment checks in tests."""
        return int(ffi.cast("uintptr_t", self._cdata))


def alloc_aligned(size: int, alignment: int = 4096) -> AlignedBuffer:
    """Allocate a zeroed buffer of ``size`` bytes aligned to ``alignment``."""
    return AlignedBuffer(size, alignment)


def _cbuf(data: BytesLike, *, writable: bool = False) -> Any:
    return ffi.from_buffer("char[]", data, require_writable=writable)


class NativeFile:
    """A file descriptor opened through the helper, with positioned I/O only.

    There is no file position: every read and write names its offset, which is what a
    journal with a pre-zeroed tail and concurrent readers needs.
    """

    __slots__ = ("direct", "fd", "path")

    def __init__(self, path: str | os.PathLike[str], fd: int, direct: bool) -> None:
        self.path = os.fspath(path)
        self.fd = fd
        self.direct = direct

    def __repr__(self) -> str:
        return f"NativeFile(path={self.path!r}, fd={self.fd}, direct={self.direct})"

    def __enter__(self) -> NativeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.fd < 0:
            raise ValueError(f"file {self.path!r} is closed")

    def pwrite(self, data: BytesLike, offset: int) -> int:
        """Write all of ``data`` at ``offset``; with O_DIRECT both must be block aligned."""
        self._check_open()
        rc = lib.ldn_pwrite(self.fd, _cbuf(data), len(data), offset)
        if rc < 0:
            _raise(rc, self.path, f"pwrite({len(data)} bytes at {offset})")
        return int(rc)

    def pwrite_paced(self, data: BytesLike, offset: int, piece: int, pause_s: float) -> int:
        """``pwrite`` in ``piece``-byte writes, ``pause_s`` apart, in one native call."""
        self._check_open()
        rc = lib.ldn_pwrite_paced(self.fd, _cbuf(data), len(data), offset, piece,
                                  int(pause_s * 1e9))
        if rc < 0:
            _raise(rc, self.path, f"pwrite({len(data)} bytes at {offset})")
        return int(rc)

    def pwritev(self, parts: Sequence[BytesLike], offset: int) -> int:
        """Write several buffers back to back starting at ``offset`` in one syscall."""
        self._check_open()
        if len(parts) > IOV_MAX:
            raise ValueError(f"pwritev takes at most {IOV_MAX} buffers, got {len(parts)}")
        iov = ffi.new("struct ldn_iovec[]", len(parts))
        keep = []
        for i, part in enumerate(parts):
            cb = _cbuf(part)
            keep.append(cb)
            iov[i].base = cb
            iov[i].len = len(part)
        rc = lib.ldn_pwritev(self.fd, iov, len(parts), offset)
        if rc < 0:
            _raise(rc, self.path, f"pwritev({len(parts)} buffers at {offset})")
        return int(rc)

    def pread_into(self, buf: BytesLike, offset: int) -> int:
        """Fill ``buf`` from ``offset``; returns the bytes read (short only at end of file)."""
        self._check_open()
        rc = lib.ldn_pread(self.fd, _cbuf(buf, writable=True), len(buf), offset)
        if rc < 0:
            _raise(rc, self.path, f"pread({len(buf)} bytes at {offset})")
        return int(rc)

    def pread(self, length: int, offset: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` (buffered files only)."""
        buf = bytearray(length)
        n = self.pread_into(buf, offset)
        return bytes(buf[:n])

    def fdatasync(self) -> None:
        """Flush the file's data (and the metadata needed to read it) to stable storage."""
        self._check_open()
        rc = lib.ldn_fdatasync(self.fd)
        if rc < 0:
            _raise(rc, self.path, "fdatasync")

    def fallocate(self, offset: int, length: int, *, keep_size: bool = False) -> None:
        """Reserve blocks for ``[offset, offset + length)``."""
        self._check_open()
        mode = FALLOC_FL_KEEP_SIZE if keep_size else 0
        rc = lib.ldn_fallocate(self.fd, mode, offset, length)
        if rc < 0:
            _raise(rc, self.path, f"fallocate({offset}, {length})")

    def fadvise_dontneed(self, offset: int, length: int) -> None:
        """Tell the kernel the range will not be read again (drop it from the page cache)."""
        self._check_open()
        rc = lib.ldn_fadvise_dontneed(self.fd, offset, length)
        if rc < 0:
            _raise(rc, self.path, f"posix_fadvise(DONTNEED, {offset}, {length})")

    def sync_file_range(self, offset: int, length: int, flags: int) -> None:
        """Start or wait for write-out of a range; not a durability barrier on its own."""
        self._check_open()
        rc = lib.ldn_sync_file_range(self.fd, offset, length, flags)
        if rc < 0:
            _raise(rc, self.path, f"sync_file_range({offset}, {length}, {flags})")

    def logical_block_size(self) -> int:
        """Logical block size of the device under this file (the O_DIRECT unit)."""
        self._check_open()
        return _fd_logical_block_size(self.fd, self.path)

    def close(self) -> None:
        if self.fd < 0:
            return
        fd, self.fd = self.fd, -1
        rc = lib.ldn_close(fd)
        if rc < 0:
            _raise(rc, self.path, "close")


def pwrite_fd(fd: int, data: BytesLike, offset: int, path: str | os.PathLike[str]) -> int:
    """``NativeFile.pwrite`` for a descriptor opened elsewhere (the entry logs)."""
    rc = lib.ldn_pwrite(fd, _cbuf(data), len(data), offset)
    if rc < 0:
        _raise(rc, path, f"pwrite({len(data)} bytes at {offset})")
    return int(rc)


def sync_file_range_fd(fd: int, offset: int, length: int, flags: int,
                       path: str | os.PathLike[str]) -> None:
    """``NativeFile.sync_file_range`` for a descriptor opened elsewhere (the entry logs'
    write-behind)."""
    rc = lib.ldn_sync_file_range(fd, offset, length, flags)
    if rc < 0:
        _raise(rc, path, f"sync_file_range({offset}, {length}, {flags})")


def fdatasync_fd(fd: int, path: str | os.PathLike[str]) -> None:
    rc = lib.ldn_fdatasync(fd)
    if rc < 0:
        _raise(rc, path, "fdatasync")


def tag_fd(fd: int, target: str) -> None:
    """Mark what ``fd`` holds ("journal", "entrylog") for injected faults
    (``native.faults``); the helper's ``close`` clears it, a new tag replaces it."""
    from ledgerd.native.faults import TAGS
    lib.ldn_fd_tag(fd, TAGS[target])


def open_file(
    path: str | os.PathLike[str], flags: int, mode: int = 0o644, *, direct: bool = False
) -> NativeFile:
    """Open ``path`` with ``os.O_*`` ``flags`` (plus O_DIRECT when ``direct``)."""
    rc = lib.ldn_open(os.fsencode(path), flags, mode, 1 if direct else 0)
    if rc < 0:
        _raise(rc, path, "open(O_DIRECT)" if direct else "open")
    return NativeFile(path, int(rc), direct)


class AfterSync(abc.ABC):
    """An action a syncer runs right after its job is durable, in its own thread
    (without the GIL), before the job is reported done.

    Whoever hands a syncer a job (the journal) passes these along without knowing what
    they do. One that will not run from a syncer (its job went another way, or behind
    another job still in flight) is ``withhold``-en: its owner then does the work itself,
    and the action keeps later ones of its kind from overtaking it. The only kind the
    native syncer runs is ``SendAfterSync``.
    """

    __slots__ = ()

    @abc.abstractmethod
    def withhold(self) -> None:
        """This action will not run from a syncer: its owner does the work."""


class SendAfterSync(AfterSync):
    """Bytes a syncer sends to a socket right after its job is durable.

    ``data`` must not change from the submit to the collect; ``sent`` is then how many
    of its bytes the socket took (0 if the job failed). A send that does not take
    everything stops the descriptor for every syncer: later jobs send it nothing until
    ``resume_sends(fd)``, so bytes never overtake the ones left over. The socket must
    stay open (its descriptor unreused) until the job is collected. Withheld, it stops
    its descriptor for every syncer (``stop_sends``): the owner sends the bytes, then
    ``resume_sends``.
    """

    __slots__ = ("data", "fd", "sent")

    def __init__(self, fd: int, data: bytearray) -> None:
        if not 0 <= fd < SEND_MAX_FD:
            raise ValueError(f"descriptor {fd} is beyond the syncer's send table")
        self.fd = fd
        self.data = data
        self.sent = 0

    @staticmethod
    def fits(fd: int) -> bool:
        """Whether a syncer can send to descriptor ``fd`` (its send table's range)."""
        return 0 <= fd < SEND_MAX_FD

    def withhold(self) -> None:
        stop_sends(self.fd)


def stop_sends(fd: int) -> None:
    """Syncers send nothing to ``fd`` until ``resume_sends(fd)``: for replies that
    will go some other way, which later ones must not overtake."""
    lib.ldn_send_stop(fd)


def resume_sends(fd: int) -> None:
    """Let syncers send to ``fd`` again (after a short send stopped it, or before the
    descriptor is closed and may be reused)."""
    lib.ldn_send_resume(fd)


class Syncer:
    """A thread of the helper's own that writes and fdatasyncs one buffer at a time
    without ever taking the GIL; ``fileno()`` becomes readable when the job is done.

    The journal's group commit: ``submit`` a group, wait until ``fileno()`` is readable
    (``trio.lowlevel.wait_readable``), ``collect`` the outcome. The buffer must stay
    alive and unchanged until collected (the object keeps a reference to it).
    """

    __slots__ = ("_buf", "_s", "_sends", "path")

    def __init__(self) -> None:
        s = lib.ldn_syncer_new()
        if s == ffi.NULL:
            raise OSError("could not start the native syncer thread")
        self._s = s
        self._buf: Any = None
        self._sends: Any = None
        self.path = ""

    def fileno(self) -> int:
        if self._s is None:
            raise ValueError("syncer is closed")
        return int(lib.ldn_syncer_fd(self._s))

    def submit(self, handle: NativeFile, data: BytesLike, offset: int, *, sync: bool,
               after_sync: Sequence[AfterSync] = ()) -> None:
        """Start writing ``data`` at ``offset`` of ``handle`` (then fdatasync if ``sync``);
        once that succeeded, run each of ``after_sync`` (``SendAfterSync``: send its bytes
        to its socket). Neither the data nor the actions may change until collected."""
        if self._s is None:
            raise ValueError("syncer is closed")
        handle._check_open()
        buf = _cbuf(data)
        sends: Sequence[Any] = after_sync
        if sends and any(type(item) is not SendAfterSync for item in sends):
            # A kind this syncer cannot run is withheld: its owner does the work.
            for item in sends:
                if type(item) is not SendAfterSync:
                    item.withhold()
            sends = [item for item in sends if type(item) is SendAfterSync]
        n = len(sends)
        if n:
            keep = [_cbuf(item.data) for item in sends]
            fds = ffi.new("int[]", [item.fd for item in sends])
            bufs = ffi.new("void *[]", keep)
            lens = ffi.new("size_t[]", [len(item.data) for item in sends])
            sent = ffi.new("long long[]", n)
            rc = lib.ldn_syncer_submit(self._s, handle.fd, buf, len(data), offset,
                                       1 if sync else 0, n, fds, bufs, lens, sent)
            self._sends = (sends, sent, keep, fds, bufs, lens)
        else:
            rc = lib.ldn_syncer_submit(self._s, handle.fd, buf, len(data), offset,
                                       1 if sync else 0, 0, ffi.NULL, ffi.NULL, ffi.NULL,
                                       ffi.NULL)
        if rc < 0:
            self._sends = None
            raise RuntimeError("syncer is busy: collect the previous job first")
        self._buf = (buf, data)
        self.path = handle.path

    def collect(self) -> float | None:
        """The finished job's write + sync seconds; None while it runs. Raises OSError
        (errno and path) if it failed (then nothing was sent). Each of the job's sends
        has its ``sent`` set."""
        if self._s is None:
            raise ValueError("syncer is closed")
        nanos = ffi.new("long long *")
        rc = lib.ldn_syncer_collect(self._s, nanos)
        if rc == 1:
            return None
        self._buf = None
        if self._sends is not None:
            sends, sent = self._sends[0], self._sends[1]
            self._sends = None
            for i, item in enumerate(sends):
                item.sent = int(sent[i])
        if rc < 0:
            _raise(rc, self.path, "journal write + fdatasync")
        return int(nanos[0]) / 1e9

    def close(self) -> None:
        """Stop the thread (a job in flight finishes first)."""
        if self._s is not None:
            s, self._s = self._s, None
            lib.ldn_syncer_free(s)
            self._buf = None
            self._sends = None


def _sysfs_block_size(major: int, minor: int) -> int | None:
    base = Path(f"/sys/dev/block/{major}:{minor}")
    # A partition keeps its queue settings in the parent device's directory.
    for candidate in (base / "queue" / "logical_block_size",
                      base / ".." / "queue" / "logical_block_size"):
        try:
            return int(candidate.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def _fd_logical_block_size(fd: int, path: str) -> int:
    major = ffi.new("unsigned int *")
    minor = ffi.new("unsigned int *")
    is_blk = ffi.new("int *")
    rc = lib.ldn_fstat_dev(fd, major, minor, is_blk)
    if rc < 0:
        _raise(rc, path, "fstat")
    if is_blk[0]:
        size = lib.ldn_block_device_logical_size(fd)
        if size < 0:
            _raise(size, path, "ioctl(BLKSSZGET)")
        return int(size)
    size_or_none = _sysfs_block_size(int(major[0]), int(minor[0]))
    # Filesystems with no block device behind them (tmpfs, overlay) have no sysfs
    # queue; 512 bytes is the smallest unit O_DIRECT ever accepts there.
    return size_or_none if size_or_none is not None else 512


def logical_block_size(path: str | os.PathLike[str]) -> int:
    """Logical block size of the device holding ``path`` (a file, directory or device)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _fd_logical_block_size(fd, os.fspath(path))
    finally:
        os.close(fd)
