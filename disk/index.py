"""Index files and the ledger cache.

One file per ledger, ``<index_dir>/current/<hh>/<hh>/<hex id>.idx`` (hh: bits 8-15 and
0-7 of the id)::

    a 1024-byte header (INDEX_HEADER in ``disk/layouts.py``: magic, version, the fence
    bit, ledger id, term, master key, explicit LAC, CRC32C), then entry e's location
    (INDEX_LOCATION: log_id << 32 | offset of its record) at 1024 + 8 * e; 0 = absent.

The header's fence bit and key are only as durable as the last checkpoint; the journal's
FENCE and MASTER_KEY records cover the gap (replay re-applies them).

The ledger cache keeps index pages (``page_size`` bytes, ``page_size / 8`` entries each)
in memory, loads them on a miss, writes dirty pages at checkpoint, and evicts clean pages
least-recently-used beyond ``page_limit``; a dirty page picked for eviction is written
first (and its file synced at the next checkpoint). A checkpoint takes the dirty pages
and headers on the event loop and a worker thread writes them
(``begin_write_out``/``IndexWrite.run``/``end_write_out``); until they are written those
pages stay in memory, a page changed meanwhile is copied first, and only that write
writes those ledgers' headers.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ledgerd.base.crashpoints import crash_point
from ledgerd.base.logs import fields
from ledgerd.disk.errors import CorruptRecordError
from ledgerd.disk.fdcache import FdCache
from ledgerd.disk.layouts import (
    CRC,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_MAGIC,
    crc32c,
    fast_struct,
    locations_struct,
)

__all__ = ["INDEX_HEADER_SIZE", "IndexWrite", "LedgerCache", "LedgerIndex", "index_path",
           "parse_index_header", "read_index_file"]

log = logging.getLogger(__name__)
_MAGIC = INDEX_MAGIC
_HEAD = fast_struct(INDEX_HEADER, stop="crc")  # the fields the CRC covers
assert _HEAD.size == 111
FENCED = 1
_LOC = locations_struct(1)
_locs = functools.lru_cache(maxsize=1024)(locations_struct)


def index_path(index_dir: Path, ledger_id: int) -> Path:
    return (index_dir / "current" / f"{(ledger_id >> 8) & 0xFF:02x}" / f"{ledger_id & 0xFF:02x}"
            / f"{ledger_id:x}.idx")


@dataclass(slots=True)
class LedgerIndex:
    """One ledger's state as the bookie keeps it."""

    ledger_id: int
    path: Path
    master_key: bytes = b""
    fenced: bool = False
    term: int = 0
    explicit_lac: bytes = b""
    last_entry_id: int = -1
    lac: int = -1
    header_dirty: bool = True
    # Bumped by every add, fence, term or LAC change: GC deletes a ledger only if this
    # did not move while it asked the metadata store (a re-created ledger's first writes
    # may arrive meanwhile).
    changes: int = 0
    pages: dict[int, bytearray] = field(default_factory=dict)
    dirty_pages: set[int] = field(default_factory=set)
    needs_sync: bool = False
    # The page the last write went to (appends hit it again and again); it is dropped
    # when that page is evicted.
    hot_page_no: int = -1
    hot_page: bytearray | None = None
    header_written: bool = False  # this process wrote the header (or loaded it from disk)
    file_writes: int = 0  # pages written to its file (a page read off the loop checks it)
    file_exists: bool = False  # its index file was found or created

    def header_bytes(self) -> bytes:
        head = _HEAD.pack(_MAGIC, 1, FENCED if self.fenced else 0, self.ledger_id, self.term,
                          len(self.master_key), self.master_key.ljust(20, b"\0"),
                          len(self.explicit_lac), self.explicit_lac.ljust(64, b"\0"))
        return head + CRC.pack(crc32c(head)) + bytes(
            INDEX_HEADER_SIZE - _HEAD.size - 4)


def parse_index_header(data: bytes, path: Path) -> LedgerIndex:
    """A ledger's state from an index header (an index file's, or the db index's)."""
    if len(data) < INDEX_HEADER_SIZE:
        raise CorruptRecordError(str(path), 0, "index file shorter than its header")
    magic, version, state, lid, term, klen, key, llen, lac = _HEAD.unpack_from(data, 0)
    (crc,) = CRC.unpack_from(data, _HEAD.size)
    if magic != _MAGIC or version != 1 or crc != crc32c(data[: _HEAD.size]):
        raise CorruptRecordError(str(path), 0, "bad index header (magic, version or checksum)")
    return LedgerIndex(lid, path, key[:klen], bool(state & FENCED), term, lac[:llen],
                       header_dirty=False, header_written=True)


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(INDEX_HEADER_SIZE)


def read_index_file(path: Path) -> tuple[LedgerIndex, bytes]:
    """Parse an index file: its header state and raw location bytes."""
    data = path.read_bytes()
    return parse_index_header(data, path), data[INDEX_HEADER_SIZE:]


@dataclass(slots=True)
class IndexWrite:
    """A checkpoint's index writes (``LedgerCache.begin_write_out``): the dirty pages and
    headers taken on the event loop (a page changed before the write ends is copied
    first, so what is written is what was taken); ``run`` writes them in any thread.

    Per file: (its ledger, header or None, [(offset, page)], the pages' numbers, whether
    the header had been written before). ``run`` opens each file by path: a descriptor
    per dirty ledger held across the write would pass the process's file limit with
    many ledgers. Its ledgers may not be deleted until ``end_write_out`` (the path could
    name a re-created ledger's file by then): ``LedgerCache.delete`` refuses."""

    files: list[tuple[LedgerIndex, bytes | None, list[tuple[int, bytearray]], list[int],
                      bool]] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    # (ledger, page) of every page taken (kept in memory until the write ends), and of
    # those whose object the cache still holds (copied before a change: ``_own``).
    pinned: set[tuple[int, int]] = field(default_factory=set)
    shared: set[tuple[int, int]] = field(default_factory=set)
    ledgers: set[int] = field(default_factory=set)  # whose headers only this write writes
    done: bool = False

    def run(self) -> None:
        """Write every page and header taken (any thread). Raises OSError naming the file."""
        for idx, header, pages, _, _ in self.files:
            try:
                fd = os.open(idx.path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = str(idx.path)
                raise
            try:
                if header is not None:
                    os.pwrite(fd, header, 0)
                for offset, data in pages:
                    os.pwrite(fd, data, offset)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = str(idx.path)
                raise
            finally:
                os.close(fd)
        self.done = True


DEFAULT_CACHE_CAP = 4 << 30
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
MAX_DEFERRED = 100_000  # locations waiting for their pages; past it, adds read the page


def default_page_limit(page_size: int) -> int:
    """Index pages a bookie keeps by default: a third of the host's memory, at most
    4 GiB, as BookKeeper sizes its page cache from a third of direct memory. A cap, not
    an allocation: pages are read in as ledgers are touched. Below it every actively
    written ledger's last page stays cached; a fixed small cache misses on every add once
    more ledgers are written round-robin than it holds pages."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        memory = 3 * (64 << 20)
    return max(16, min(memory // 3, DEFAULT_CACHE_CAP) // page_size)


class LedgerCache:
    def __init__(self, index_dirs: list[Path], *, page_size: int, page_limit: int,
                 fds: FdCache | None = None) -> None:
        self.fds = fds if fds is not None else FdCache(4096)
        self.index_dirs = [Path(d) for d in index_dirs]
        self.page_size = page_size
        self.per_page = page_size // 8
        self.page_limit = page_limit if page_limit > 0 else default_page_limit(page_size)
        self.ledgers: dict[int, LedgerIndex] = {}
        # Ledgers trimmed from the front: ledger id -> first entry kept (in memory; the
        # ledger GC sets it from the metadata's start entry on every pass).
        self.trimmed: dict[int, int] = {}
        self.full_dirs: set[Path] = set()  # index dirs new ledgers skip
        self._lru: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.paged_in = 0  # pages read by a worker thread for a read
        # Adds whose page is not in memory (its file has it): with ``defer_misses`` set
        # (the storage runs a page-in task), the location waits here and the page is
        # read off the event loop; lookups see it here; ``write_out`` applies every one
        # before writing pages (so a checkpoint's mark never passes an unindexed entry).
        self.defer_misses = False
        self.deferred: dict[int, dict[int, int]] = {}  # ledger -> entry -> location
        self.deferred_count = 0
        self.on_deferred: Callable[[], None] | None = None
        # The checkpoint's write in flight (``begin_write_out``): its pages stay in
        # memory (an evicted page read back before its write landed would be stale), and
        # its ledgers' headers are written by it alone (an older header must not land
        # after a newer header written by an eviction).
        self._writing: IndexWrite | None = None

    def _dir_for(self, ledger_id: int) -> Path:
        """Where a new ledger's index file goes: by id, unless that directory is full or
        out of service (start-up finds index files in any directory)."""
        d = self.index_dirs[ledger_id % len(self.index_dirs)]
        if d in self.full_dirs:
            d = next((x for x in self.index_dirs if x not in self.full_dirs), d)
        return d

    def load_all(self) -> None:
        """Read every index file's header (start-up).

        A file whose header was never written (shorter than a header, or a header of
        zeros) is a crash between creating the file and writing its header: the files
        are made on the event loop and written by the checkpoint's worker. No
        checkpoint completed with it (a checkpoint writes and fsyncs the header before
        it moves the journal mark), so everything of that ledger is in the journal
        after the mark and replay rebuilds it: the file is removed, with a log line.
        A header that was written and fails its checks still refuses start-up."""
        for d in self.index_dirs:
            for path in sorted((d / "current").glob("*/*/*.idx")):
                head = _read_head(path)
                if len(head) < INDEX_HEADER_SIZE or not any(head):
                    log.warning("index_file_without_header", extra=fields(
                        path=path, bytes=path.stat().st_size,
                        action="removed; journal replay rebuilds the ledger's index"))
                    path.unlink()
                    continue
                idx, body = read_index_file(path)
                idx.file_exists = True
                for e in range(len(body) // 8 - 1, -1, -1):
                    if body[8 * e: 8 * e + 8] != bytes(8):
                        idx.last_entry_id = e
                        break
                self.ledgers[idx.ledger_id] = idx

    def get(self, ledger_id: int) -> LedgerIndex | None:
        return self.ledgers.get(ledger_id)

    @property
    def cached_pages(self) -> int:
        """Index pages held in memory (at most ``page_limit``, but for those pinned by
        a checkpoint's write in flight)."""
        return len(self._lru)

    def dirty(self, idx: LedgerIndex) -> None:
        """The ledger's header (key, fence, term, explicit LAC) changed."""
        idx.header_dirty = True

    def get_or_create(self, ledger_id: int) -> LedgerIndex:
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            idx = LedgerIndex(ledger_id, index_path(self._dir_for(ledger_id), ledger_id))
            self.ledgers[ledger_id] = idx
        return idx

    def _page(self, idx: LedgerIndex, page_no: int, create: bool) -> bytearray | None:
        page = idx.pages.get(page_no)
        key = (idx.ledger_id, page_no)
        if page is not None:
            self.hits += 1
            self._lru.move_to_end(key)
            return page
        self.misses += 1
        data = b""
        fd = self._fd(idx, create=False)
        if fd is not None:
            data = os.pread(fd, self.page_size, INDEX_HEADER_SIZE + page_no * self.page_size)
        if not data and not create:
            return None
        page = bytearray(data.ljust(self.page_size, b"\0"))
        idx.pages[page_no] = page
        self._lru[key] = None
        self._evict()
        return page

    def _evict(self) -> None:
        pinned = self._writing.pinned if self._writing is not None else None
        kept: list[tuple[int, int]] = []
        # Never the last one used (the page just read or made, which its caller is about
        # to use): with the pages being written pinned, it could be the only candidate.
        while len(self._lru) + len(kept) > self.page_limit and len(self._lru) > 1:
            key, _ = self._lru.popitem(last=False)
            if pinned is not None and key in pinned:
                kept.append(key)  # being written: it stays
                continue
            lid, page_no = key
            idx = self.ledgers.get(lid)
            if idx is None:
                continue
            if page_no in idx.dirty_pages:
                self._write_pages(idx, [page_no])
                idx.needs_sync = True
            idx.pages.pop(page_no, None)
            if idx.hot_page_no == page_no:
                idx.hot_page_no, idx.hot_page = -1, None
        for key in reversed(kept):  # back where they were, the least recently used
            self._lru[key] = None
            self._lru.move_to_end(key, last=False)

    def set_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        page_no, slot = divmod(entry_id, self.per_page)
        if self._defer(idx, page_no, entry_id, location):
            return
        _LOC.pack_into(self._hot_page(idx, page_no), slot * 8, location)
        if entry_id > idx.last_entry_id:
            idx.last_entry_id = entry_id

    def _page_nowait(self, idx: LedgerIndex, page_no: int) -> bytearray | None:
        """The page if memory or the OS page cache holds it (one ``preadv2`` with
        RWF_NOWAIT, a few microseconds); None if reading it would wait for the disk.
        Reading a cached page on the event loop is cheaper than handing every miss to a
        thread; only reads that would block go to the worker thread."""
        page = idx.pages.get(page_no)
        if page is not None:
            return page
        fd = self._fd(idx, create=False)
        if fd is None:
            return self._page(idx, page_no, create=True)  # no file: an empty page
        buf = bytearray(self.page_size)
        offset = INDEX_HEADER_SIZE + page_no * self.page_size
        try:
            n = os.preadv(fd, [buf], offset, _NOWAIT)
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                return None
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no RWF_NOWAIT here
                return self._page(idx, page_no, create=True)
            raise
        if 0 < n < self.page_size:  # part of it cached: the rest (rare) as before
            rest = os.pread(fd, self.page_size - n, offset + n)
            buf[n: n + len(rest)] = rest
        self.misses += 1
        idx.pages[page_no] = buf
        self._lru[(idx.ledger_id, page_no)] = None
        self._evict()
        return buf

    def _defer(self, idx: LedgerIndex, page_no: int, entry_id: int, location: int) -> bool:
        """Keep the location aside when its page would be read from the disk now."""
        if (not self.defer_misses or page_no == idx.hot_page_no or page_no in idx.pages
                or not idx.header_written or self.deferred_count >= MAX_DEFERRED
                or self._page_nowait(idx, page_no) is not None):
            return False
        d = self.deferred.get(idx.ledger_id)
        if d is None:
            d = self.deferred[idx.ledger_id] = {}
        if entry_id not in d:
            self.deferred_count += 1
        d[entry_id] = location
        if entry_id > idx.last_entry_id:
            idx.last_entry_id = entry_id
        if self.on_deferred is not None:
            self.on_deferred()
        return True

    def deferred_pages(self) -> dict[int, tuple[LedgerIndex, list[int]]]:
        """Ledger -> (its index, the pages its deferred locations need, not in memory)."""
        out = {}
        per = self.per_page
        for lid, d in self.deferred.items():
            idx = self.ledgers.get(lid)
            if idx is None:
                continue
            pages = sorted({e // per for e in d} - idx.pages.keys())
            out[lid] = (idx, pages)
        return out

    def apply_deferred(self, ledger_id: int | None = None) -> int:
        """Write deferred locations into their pages (reading a page from the file if it
        is still not in memory); all ledgers', or one's. Returns how many."""
        lids = list(self.deferred) if ledger_id is None else [ledger_id]
        n = 0
        per = self.per_page
        for lid in lids:
            d = self.deferred.pop(lid, None)
            idx = self.ledgers.get(lid)
            if not d:
                continue
            self.deferred_count -= len(d)
            if idx is None:
                continue
            for eid, loc in sorted(d.items()):
                page_no, slot = divmod(eid, per)
                _LOC.pack_into(self._hot_page(idx, page_no), slot * 8, loc)
                n += 1
        return n

    def _drop_deferred(self, ledger_id: int, lo: int, hi: int) -> None:
        d = self.deferred.get(ledger_id)
        if not d:
            return
        gone = [e for e in d if lo <= e <= hi]
        for e in gone:
            del d[e]
        self.deferred_count -= len(gone)
        if not d:
            del self.deferred[ledger_id]

    def _hot_page(self, idx: LedgerIndex, page_no: int) -> bytearray:
        """The page to write into (the ledger's hot page when it is that one), dirty."""
        hot = idx.hot_page
        if page_no == idx.hot_page_no and hot is not None:
            self.hits += 1
            return hot
        page = self._page(idx, page_no, create=True)
        assert page is not None
        if self._writing is not None:
            page = self._own(idx, page_no, page)
        idx.hot_page, idx.hot_page_no = page, page_no
        idx.dirty_pages.add(page_no)
        return page

    def _own(self, idx: LedgerIndex, page_no: int, page: bytearray) -> bytearray:
        """The page to change in place: a copy if the write-out in flight still shares
        this one (it writes the object it took, unchanged)."""
        job = self._writing
        key = (idx.ledger_id, page_no)
        if job is not None and key in job.shared:
            job.shared.discard(key)
            page = idx.pages[page_no] = bytearray(page)
        return page

    def set_locations(self, ledger_id: int, first_entry_id: int, locations: list[int]) -> None:
        """``set_location`` for consecutive entries: one pack per page they span."""
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        n = len(locations)
        if self.defer_misses and idx.header_written:
            first_page, last_page = divmod(first_entry_id, self.per_page)[0], \
                (first_entry_id + n - 1) // self.per_page
            if any(p != idx.hot_page_no and self._page_nowait(idx, p) is None
                   for p in range(first_page, last_page + 1)):
                for i, loc in enumerate(locations):
                    self.set_location(ledger_id, first_entry_id + i, loc)
                return
        i = 0
        per_page = self.per_page
        while i < n:
            page_no, slot = divmod(first_entry_id + i, per_page)
            take = min(n - i, per_page - slot)
            _locs(take).pack_into(self._hot_page(idx, page_no), slot * 8,
                                  *locations[i: i + take])
            i += take
        last = first_entry_id + n - 1
        if last > idx.last_entry_id:
            idx.last_entry_id = last

    def set_sparse_locations(self, ledger_id: int, entry_ids: Sequence[int],
                             locations: Sequence[int]) -> None:
        """``set_location`` for ascending ids with gaps (a SPARSE add's: with E3/Qw2 a
        bookie stores runs of two): one page lookup per page they span, where a
        ``set_locations`` per run cost a call, a lookup and a pack per two entries."""
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        per_page = self.per_page
        if self.defer_misses and idx.header_written and any(
                p != idx.hot_page_no and self._page_nowait(idx, p) is None
                for p in range(entry_ids[0] // per_page, entry_ids[-1] // per_page + 1)):
            for eid, loc in zip(entry_ids, locations, strict=True):
                self.set_location(ledger_id, eid, loc)
            return
        pack_into = _LOC.pack_into
        page_no = -1
        page = bytearray()
        for eid, loc in zip(entry_ids, locations, strict=True):
            p, slot = divmod(eid, per_page)
            if p != page_no:
                page, page_no = self._hot_page(idx, p), p
            pack_into(page, slot * 8, loc)
        if entry_ids[-1] > idx.last_entry_id:
            idx.last_entry_id = entry_ids[-1]

    def location(self, ledger_id: int, entry_id: int) -> int:
        """The entry's location, 0 if absent."""
        idx = self.ledgers.get(ledger_id)
        if idx is None or entry_id < 0 or entry_id > idx.last_entry_id:
            return 0
        if self.deferred:
            d = self.deferred.get(ledger_id)
            if d is not None and entry_id in d:
                return d[entry_id]
        page_no, slot = divmod(entry_id, self.per_page)
        page = self._page(idx, page_no, create=False)
        if page is None:
            return 0
        return int(_LOC.unpack_from(page, slot * 8)[0])

    def truncate_after(self, ledger_id: int, last_kept: int) -> None:
        """Forget every entry after ``last_kept`` (unbounded-ledger truncation)."""
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            return
        self._drop_deferred(ledger_id, last_kept + 1, 1 << 62)
        for e in range(last_kept + 1, idx.last_entry_id + 1):
            page_no, slot = divmod(e, self.per_page)
            page = self._page(idx, page_no, create=True)
            assert page is not None
            page = self._own(idx, page_no, page)
            if idx.hot_page_no == page_no:
                idx.hot_page = page
            _LOC.pack_into(page, slot * 8, 0)
            idx.dirty_pages.add(page_no)
        idx.last_entry_id = min(idx.last_entry_id, last_kept)

    def trim_before(self, ledger_id: int, first_kept: int) -> int:
        """Forget every entry below ``first_kept`` (an unbounded ledger's fragments
        deleted for retention); returns how many were forgotten. Their entry-log space
        goes when compaction finds the logs holding them dead."""
        idx = self.ledgers.get(ledger_id)
        if idx is None or first_kept <= self.trimmed.get(ledger_id, 0):
            return 0
        self.trimmed[ledger_id] = first_kept
        self.apply_deferred(ledger_id)  # (counted below with the rest)
        dropped = 0
        upto = min(first_kept, idx.last_entry_id + 1)
        zero = bytes(self.page_size)
        for page_no in range(0, (upto + self.per_page - 1) // self.per_page):
            page = self._page(idx, page_no, create=False)
            if page is None:
                continue
            lo = page_no * self.per_page
            hi = min(lo + self.per_page, upto)
            span = page[: (hi - lo) * 8]
            if span == zero[: len(span)]:
                continue
            dropped += sum(1 for i in range(hi - lo) if span[8 * i: 8 * i + 8] != zero[:8])
            page = self._own(idx, page_no, page)
            if idx.hot_page_no == page_no:
                idx.hot_page = page
            page[: (hi - lo) * 8] = zero[: (hi - lo) * 8]
            idx.dirty_pages.add(page_no)
        return dropped

    def _fd(self, idx: LedgerIndex, *, create: bool) -> int | None:
        """The index file's descriptor (kept in the shared LRU of open files); None if
        the file does not exist and ``create`` is false."""
        key = ("idx", idx.ledger_id)
        fd = self.fds.peek(key)
        if fd is not None:
            return self.fds.get(key, lambda: fd)

        def opener() -> int:
            if create:
                idx.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(idx.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            else:
                fd = os.open(idx.path, os.O_RDWR | os.O_CLOEXEC)
            idx.file_exists = True
            return fd
        try:
            return self.fds.get(key, opener)
        except FileNotFoundError:
            if create:
                raise
            return None

    # -- page misses off the event loop (reads) ------------------------------------------

    def missing_pages(self, ledger_id: int, first: int, last: int) -> list[int]:
        """Pages holding entries ``first``..``last`` of the ledger that neither memory
        nor the OS page cache holds (those it does hold are cached on the way)."""
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            return []
        last = min(last, idx.last_entry_id)
        if first < 0 or last < first:
            return []
        per = self.per_page
        return [p for p in range(first // per, last // per + 1)
                if self._page_nowait(idx, p) is None]

    def read_pages(self, path: Path, page_nos: list[int]) -> dict[int, bytes]:
        """Any thread: the pages as the index file holds them now (its own descriptor;
        the shared ones may be closed by the event loop meanwhile). Absent: left out."""
        out: dict[int, bytes] = {}
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return out
        try:
            for p in page_nos:
                data = os.pread(fd, self.page_size, INDEX_HEADER_SIZE + p * self.page_size)
                if data:
                    out[p] = data
        finally:
            os.close(fd)
        return out

    def install_pages(self, idx: LedgerIndex, pages: dict[int, bytes], writes_seen: int) -> int:
        """Event loop, after ``read_pages``: cache the pages still missing, unless a page
        was written to the ledger's file since (``idx.file_writes`` moved: the read may
        be older than the file) or the ledger was deleted. Returns how many were cached."""
        if writes_seen != idx.file_writes or self.ledgers.get(idx.ledger_id) is not idx:
            return 0
        n = 0
        for page_no, data in pages.items():
            if page_no in idx.pages:
                continue
            idx.pages[page_no] = bytearray(data.ljust(self.page_size, b"\0"))
            self._lru[(idx.ledger_id, page_no)] = None
            n += 1
        self.paged_in += n
        self._evict()
        return n

    def _write_pages(self, idx: LedgerIndex, page_nos: list[int]) -> None:
        idx.file_writes += 1
        fd = self._fd(idx, create=True)
        assert fd is not None
        if ((idx.header_dirty or not idx.header_written)
                and not (self._writing and idx.ledger_id in self._writing.ledgers)):
            os.pwrite(fd, idx.header_bytes(), 0)
            idx.header_dirty = False
            idx.header_written = True
        for p in page_nos:
            os.pwrite(fd, idx.pages[p], INDEX_HEADER_SIZE + p * self.page_size)
            idx.dirty_pages.discard(p)
            if idx.hot_page_no == p:  # the next write must mark it dirty again
                idx.hot_page_no, idx.hot_page = -1, None

    def flush(self) -> None:
        """Write every dirty page and header, then fsync those files (checkpoint step 2)."""
        self.sync_paths(self.write_out())

    def write_out(self) -> list[Path]:
        """Write dirty pages and headers in this thread (tools; the storage runs
        ``begin_write_out``'s job in a worker); returns the files to fsync."""
        job = self.begin_write_out()
        try:
            job.run()
        finally:
            self.end_write_out(job)
        return job.paths

    def begin_write_out(self) -> IndexWrite:
        """Event loop: take every dirty page and header into a job (deferred locations
        go into their pages first, so a checkpoint's mark never passes an unindexed
        entry) and mark them clean: pages changed from here on are copied first and are
        dirty again for the next checkpoint. Creates the files that do not exist yet.
        One job at a time."""
        if self._writing is not None:
            raise RuntimeError("an index write-out is already in flight")
        if self.deferred:
            self.apply_deferred()
        job = IndexWrite()
        self._writing = job
        page_size = self.page_size
        try:
            for idx in list(self.ledgers.values()):
                if not (idx.dirty_pages or idx.header_dirty or idx.needs_sync):
                    continue
                if not idx.file_exists:  # created here, once per ledger
                    self._fd(idx, create=True)
                    idx.file_exists = True
                    crash_point("index.created")  # the file made, its header not yet
                header = (idx.header_bytes() if idx.header_dirty or not idx.header_written
                          else None)
                page_nos = sorted(idx.dirty_pages)
                # The page objects themselves: copied only if changed before the write
                # ends (``_own``); copying them all here would hold the loop for most of
                # a busy checkpoint's write-out.
                pages = [(INDEX_HEADER_SIZE + p * page_size, idx.pages[p]) for p in page_nos]
                job.files.append((idx, header, pages, page_nos, idx.header_written))
                job.paths.append(idx.path)
                lid = idx.ledger_id
                keys = [(lid, p) for p in page_nos]
                job.pinned.update(keys)
                job.shared.update(keys)
                job.ledgers.add(lid)
                idx.file_writes += 1
                idx.dirty_pages.clear()
                if idx.hot_page_no in page_nos:  # the next write must mark it dirty again
                    idx.hot_page_no, idx.hot_page = -1, None
                idx.header_dirty = False
                idx.header_written = True
                idx.needs_sync = False
        except OSError as exc:
            if exc.filename is None:
                exc.filename = str(idx.path)
            self.end_write_out(job)
            raise
        return job

    def end_write_out(self, job: IndexWrite) -> None:
        """Event loop, after ``job.run`` (or without it): release its pages. A job that
        did not finish leaves its pages and headers dirty and its files to be synced,
        so the next checkpoint writes them again."""
        if self._writing is job:
            self._writing = None
        if job.done:
            return
        for idx, header, _, page_nos, header_was_written in job.files:
            if self.ledgers.get(idx.ledger_id) is not idx:
                continue  # deleted meanwhile
            idx.dirty_pages.update(page_nos)
            if header is not None:
                idx.header_dirty = True
                idx.header_written = header_was_written
            idx.needs_sync = True

    def close(self) -> None:
        """Nothing beyond the shared descriptor cache (its owner closes it)."""

    @staticmethod
    def sync_paths(paths: list[Path]) -> None:
        """fsync each file (any thread); a file deleted meanwhile is skipped."""
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def delete(self, ledger_id: int) -> Path | None:
        """Forget a ledger; returns its index file for the caller to unlink (or None).
        Not while a write-out holding its pages is in flight (``begin_write_out``)."""
        if self._writing is not None and ledger_id in self._writing.ledgers:
            raise RuntimeError(f"ledger {ledger_id}'s index is being written: delete it "
                               "after end_write_out")
        self._drop_deferred(ledger_id, 0, 1 << 62)
        idx = self.ledgers.pop(ledger_id, None)
        self.trimmed.pop(ledger_id, None)
        self.fds.close(("idx", ledger_id))
        if idx is None:
            return None
        for p in list(idx.pages):
            self._lru.pop((ledger_id, p), None)
        return idx.path
