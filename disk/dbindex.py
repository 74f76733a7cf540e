"""The ``db`` ledger storage's index: every ledger's state and entry locations in one
embedded key-value store, as BookKeeper's DbLedgerStorage keeps them in RocksDB.

Per-ledger index files cost a file (create, open, header, page reads and fsync) per
ledger touched; at 10,000+ actively written ledgers that dominates (issue #26: every add
missed the page cache, checkpoints wrote and synced thousands of files, creating 10,000
files stalled requests for seconds). Here one LMDB environment holds everything:

    <first index dir>/current/ledgers.lmdb/
      meta: ledger id (8 B, big-endian) -> the index-file header's first 115 bytes
            (key, fence, term, explicit LAC, CRC; see ``index.py``; the rest of its
            1024 bytes is padding). Written when that state changes, not per add.
      loc:  ledger id (8 B) + entry id (8 B), big-endian -> location (8 B)

A ledger's last entry is its last ``loc`` key (one seek, when the ledger is first used
after a start), as BookKeeper's ``getLastEntry``: adds change no meta record, so a
checkpoint writes the new locations and the few changed headers, nothing per ledger
touched. (Stores written before this keep 8 more bytes in each meta record, ignored.)

Big-endian keys sort by (ledger, entry), so a ledger's entries are one key range:
deleting a ledger, truncating or trimming it is one range walk, and a checkpoint writes
the locations added since the last one as a single sorted transaction. LMDB was chosen
over RocksDB (``rocksdict``) for this step: no compaction threads, no write-ahead log of
its own to tune (ledgerd's journal already is the write-ahead log), crash-safe
copy-on-write commits, and a maintained binding with wheels (``lmdb``).

The same rules as the index files: locations and headers are as durable as the last
checkpoint (the commit does not sync; ``sync_paths`` syncs); the journal covers the rest
on replay. A checkpoint's transaction runs in a worker thread: ``begin_write_out`` (event
loop) moves what changed into a ``Commit`` and starts a new generation, ``Commit.run``
(a thread) writes it, ``end_write_out`` (the loop) retires it. Lookups meanwhile see the
new generation, then the commit in flight, then the store. ``DbLedgerCache`` has ``LedgerCache``'s interface, so the
storage, GC, compaction and replay code is the same for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgerd.disk.errors import CorruptRecordError, StorageError
from ledgerd.disk.index import INDEX_HEADER_SIZE, LedgerIndex, parse_index_header
from ledgerd.disk.layouts import DB_LEDGER_KEY, DB_LOCATION, DB_LOCATION_KEY, fast_struct

__all__ = ["DB_DIR", "Commit", "DbLedgerCache"]

DB_DIR = "ledgers.lmdb"
MAP_SIZE = 1 << 40  # address space reserved, not disk: LMDB grows its file as it fills
_KEY = fast_struct(DB_LOCATION_KEY)
_LID = fast_struct(DB_LEDGER_KEY)
_LOC = fast_struct(DB_LOCATION)
_END = (1 << 63) - 1
HEAD_BYTES = 115  # the index header's fields and CRC; the rest of its 1024 bytes is padding
OLD_META_SIZE = HEAD_BYTES + 8  # with a last entry id, as the first version wrote
# LMDB allows one environment per file per process: a storage opened again in the same
# process (a restart in tests, after the old object was abandoned as a crash would) uses
# the open one. Committed transactions are what a crashed process leaves in the page
# cache too. path -> [env, meta db, loc db, users]
_OPEN: dict[str, list[Any]] = {}


class LazyLedgers:
    """Ledger id -> LedgerIndex, built on first use from the raw ``meta`` records read at
    start-up: opening a bookie with a million ledgers reads the store once and makes
    objects only for the ledgers then touched. The dict operations the storage uses."""

    def __init__(self, path: Path, last_entry: Callable[[int], int]) -> None:
        self.path = path
        self.raw: dict[int, bytes] = {}  # not yet built
        self.built: dict[int, LedgerIndex] = {}
        self._last_entry = last_entry

    def _build(self, lid: int) -> LedgerIndex | None:
        value = self.raw.pop(lid, None)
        if value is None:
            return None
        if len(value) not in (HEAD_BYTES, OLD_META_SIZE):
            raise CorruptRecordError(str(self.path), lid,
                                     f"ledger meta record of {len(value)} bytes")
        idx = parse_index_header(value[:HEAD_BYTES].ljust(INDEX_HEADER_SIZE, b"\0"),
                                 self.path)
        idx.last_entry_id = self._last_entry(lid)
        self.built[lid] = idx
        return idx

    def get(self, lid: int, default: LedgerIndex | None = None) -> LedgerIndex | None:
        idx = self.built.get(lid)
        if idx is None:
            idx = self._build(lid)
        return default if idx is None else idx

    def __getitem__(self, lid: int) -> LedgerIndex:
        idx = self.get(lid)
        if idx is None:
            raise KeyError(lid)
        return idx

    def __setitem__(self, lid: int, idx: LedgerIndex) -> None:
        self.raw.pop(lid, None)
        self.built[lid] = idx

    def __contains__(self, lid: object) -> bool:
        return lid in self.built or lid in self.raw

    def __iter__(self) -> Iterator[int]:
        yield from list(self.built)
        yield from list(self.raw)

    def __len__(self) -> int:
        return len(self.built) + len(self.raw)

    def pop(self, lid: int, default: LedgerIndex | None = None) -> LedgerIndex | None:
        idx = self.get(lid)
        self.built.pop(lid, None)
        return default if idx is None else idx

    def values(self) -> list[LedgerIndex]:
        """Every ledger (builds them all: for tools, not the write path)."""
        for lid in list(self.raw):
            self._build(lid)
        return list(self.built.values())

    def touched(self) -> Iterator[LedgerIndex]:
        """The ledgers built so far (only these can have changed)."""
        return iter(list(self.built.values()))


def _dropped(ranges: dict[int, list[tuple[int, int]]], ledger_id: int, entry_id: int) -> bool:
    return any(lo <= entry_id <= hi for lo, hi in ranges.get(ledger_id, ()))


@dataclass
class Commit:
    """One checkpoint's index changes: range deletes, dropped meta, new locations,
    changed headers. Built on the event loop, written by ``run`` in a worker thread."""

    env: Any
    meta_db: Any
    loc_db: Any
    path: Path
    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)
    pending: dict[tuple[int, int], int] = field(default_factory=dict)
    metas: dict[int, bytes] = field(default_factory=dict)
    done: bool = False
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.ranges or self.gone or self.pending or self.metas)

    def location(self, ledger_id: int, entry_id: int) -> int | None:
        """The location this commit holds (None: ask the store; 0: dropped here)."""
        loc = self.pending.get((ledger_id, entry_id))
        if loc is not None:
            return loc
        if self.ranges and _dropped(self.ranges, ledger_id, entry_id):
            return 0
        return None

    def absorb(self, later: Commit) -> None:
        """Add a later generation's changes after this (unwritten) commit's."""
        for lid, spans in later.ranges.items():
            for key in [k for k in self.pending if k[0] == lid
                        and any(lo <= k[1] <= hi for lo, hi in spans)]:
                del self.pending[key]
            self.ranges.setdefault(lid, []).extend(spans)
        for lid in later.gone:
            self.metas.pop(lid, None)
        self.gone |= later.gone
        self.pending.update(later.pending)
        self.metas.update(later.metas)

    def run(self) -> None:
        """Write it as one transaction, committed unsynced (any thread)."""
        import lmdb

        if not self:
            self.done = True
            return
        started = time.perf_counter()
        try:
            with self.env.begin(write=True) as txn:
                for lid, spans in self.ranges.items():
                    for lo, hi in spans:
                        cursor = txn.cursor(db=self.loc_db)
                        if cursor.set_range(_KEY.pack(lid, lo)):
                            while True:
                                k = cursor.key()  # (empty past the last record)
                                if len(k) != _KEY.size:
                                    break
                                got_lid, eid = _KEY.unpack(k)
                                if got_lid != lid or eid > hi or not cursor.delete():
                                    break
                for lid in self.gone:
                    txn.delete(_LID.pack(lid), db=self.meta_db)
                if self.pending:
                    pack, loc = _KEY.pack, _LOC.pack
                    cursor = txn.cursor(db=self.loc_db)
                    cursor.putmulti([(pack(lid, eid), loc(location)) for (lid, eid), location
                                     in sorted(self.pending.items())])
                put = txn.put
                for lid, value in sorted(self.metas.items()):
                    put(_LID.pack(lid), value, db=self.meta_db)
        except lmdb.MapFullError as exc:
            raise OSError(28, f"ledger index store full: {exc}", str(self.path)) from exc
        except lmdb.Error as exc:
            raise OSError(5, f"ledger index store: {exc}", str(self.path)) from exc
        self.seconds = time.perf_counter() - started
        self.done = True


class DbLedgerCache:
    """``LedgerCache`` over LMDB; see the module docstring."""

    def __init__(self, index_dirs: list[Path]) -> None:
        self.index_dirs = [Path(d) for d in index_dirs]
        self.path = self.index_dirs[0] / "current" / DB_DIR
        self.env: Any = None  # opened by load_all, after the cookie check
        self.meta: Any = None
        self.loc: Any = None
        self._key = ""
        self.closed = False
        self.ledgers = LazyLedgers(self.path, self._stored_last_entry)
        self.trimmed: dict[int, int] = {}
        self.full_dirs: set[Path] = set()
        # This generation's changes (written by the next checkpoint):
        self.pending: dict[tuple[int, int], int] = {}  # new locations
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # ledger -> (first, last) to delete
        self.gone: set[int] = set()  # ledgers whose meta goes
        self.touched: set[int] = set()  # ledgers whose meta (header) must be written
        self.committing: Commit | None = None  # the checkpoint's, being written (or failed)
        self.hits = 0
        self.misses = 0
        self.commits = 0
        self.commit_seconds = 0.0

    # -- the LedgerCache interface -------------------------------------------------------

    def _open_env(self) -> None:
        import lmdb

        self.path.mkdir(parents=True, exist_ok=True)
        key = str(self.path.resolve())
        shared = _OPEN.get(key)
        if shared is None:
            try:
                # sync=False: a commit writes; ``sync_paths`` (the checkpoint) makes it
                # durable
                env = lmdb.open(key, map_size=MAP_SIZE, max_dbs=2, sync=False,
                                metasync=True, readahead=False, subdir=True)
            except lmdb.Error as exc:
                raise StorageError(f"{self.path}: cannot open the ledger index store: "
                                   f"{exc}") from exc
            shared = _OPEN[key] = [env, env.open_db(b"meta"), env.open_db(b"loc"), 0]
        shared[3] += 1
        self._key = key
        self.env, self.meta, self.loc = shared[0], shared[1], shared[2]

    def load_all(self) -> None:
        """Open the store (start-up, after the cookie check) and read every ledger's
        state (one sequential read of ``meta``)."""
        if self.env is None:
            self._open_env()
        with self.env.begin(db=self.meta) as txn:
            raw = self.ledgers.raw
            unpack = _LID.unpack
            for key, value in txn.cursor():
                raw[unpack(key)[0]] = value

    def _stored_last_entry(self, ledger_id: int) -> int:
        """The ledger's highest entry id in the store (-1 if none): one seek."""
        with self.env.begin(db=self.loc) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_KEY.pack(ledger_id + 1, 0)):
                if not cursor.prev():
                    return -1
            elif not cursor.last():
                return -1
            lid, eid = _KEY.unpack(cursor.key())
            return eid if lid == ledger_id else -1

    def get(self, ledger_id: int) -> LedgerIndex | None:
        return self.ledgers.get(ledger_id)

    def get_or_create(self, ledger_id: int) -> LedgerIndex:
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            idx = self.ledgers[ledger_id] = LedgerIndex(ledger_id, self.path)
            self.touched.add(ledger_id)
        return idx

    def dirty(self, idx: LedgerIndex) -> None:
        """The ledger's header (key, fence, term, explicit LAC) changed."""
        idx.header_dirty = True
        self.touched.add(idx.ledger_id)

    def set_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        self.pending[(ledger_id, entry_id)] = location
        if entry_id > idx.last_entry_id:
            idx.last_entry_id = entry_id

    def set_locations(self, ledger_id: int, first_entry_id: int, locations: list[int]) -> None:
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        pending = self.pending
        for i, loc in enumerate(locations):
            pending[(ledger_id, first_entry_id + i)] = loc
        last = first_entry_id + len(locations) - 1
        if last > idx.last_entry_id:
            idx.last_entry_id = last

    def note_entry(self, ledger_id: int, entry_id: int) -> LedgerIndex:
        """An entry held in the write cache: the ledger's last entry moves."""
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        if entry_id > idx.last_entry_id:
            idx.last_entry_id = entry_id
        return idx

    def location(self, ledger_id: int, entry_id: int) -> int:
        idx = self.ledgers.get(ledger_id)
        if idx is None or entry_id < 0 or entry_id > idx.last_entry_id:
            return 0
        if entry_id < self.trimmed.get(ledger_id, 0):
            return 0
        loc = self.pending.get((ledger_id, entry_id))
        if loc is not None:
            self.hits += 1
            return loc
        if self.ranges and _dropped(self.ranges, ledger_id, entry_id):
            return 0
        job = self.committing
        if job is not None and not job.done:
            held = job.location(ledger_id, entry_id)
            if held is not None:
                self.hits += 1
                return held
        self.misses += 1
        with self.env.begin(db=self.loc) as txn:
            raw = txn.get(_KEY.pack(ledger_id, entry_id))
        return 0 if raw is None else int(_LOC.unpack(raw)[0])

    def following(self, ledger_id: int, entry_id: int, count: int) -> list[tuple[int, int]]:
        """Up to ``count`` (entry, location) of the ledger's stored entries after
        ``entry_id``, in order, stopping at the first one this generation or the commit
        in flight changed (read-ahead reads only what the store says)."""
        out: list[tuple[int, int]] = []
        job = self.committing if self.committing is not None and \
            not self.committing.done else None
        with self.env.begin(db=self.loc) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_KEY.pack(ledger_id, entry_id + 1)):
                return out
            unpack, unloc = _KEY.unpack, _LOC.unpack
            for k, v in cursor:
                lid, eid = unpack(k)
                if lid != ledger_id or len(out) >= count:
                    break
                if (ledger_id, eid) in self.pending or (
                        self.ranges and _dropped(self.ranges, ledger_id, eid)) or (
                        job is not None and job.location(ledger_id, eid) is not None):
                    break
                out.append((eid, unloc(v)[0]))
        return out

    def truncate_after(self, ledger_id: int, last_kept: int) -> None:
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            return
        for key in [k for k in self.pending if k[0] == ledger_id and k[1] > last_kept]:
            del self.pending[key]
        self.ranges.setdefault(ledger_id, []).append((last_kept + 1, _END))
        idx.last_entry_id = min(idx.last_entry_id, last_kept)

    def trim_before(self, ledger_id: int, first_kept: int) -> int:
        idx = self.ledgers.get(ledger_id)
        if idx is None or first_kept <= self.trimmed.get(ledger_id, 0):
            return 0
        start = self.trimmed.get(ledger_id, 0)
        self.trimmed[ledger_id] = first_kept
        dropped = 0
        for key in [k for k in self.pending if k[0] == ledger_id and k[1] < first_kept]:
            del self.pending[key]
            dropped += 1
        with self.env.begin(db=self.loc) as txn:
            cursor = txn.cursor()
            if cursor.set_range(_KEY.pack(ledger_id, start)):
                for raw in cursor.iternext(values=False):
                    lid, eid = _KEY.unpack(raw)
                    if lid != ledger_id or eid >= first_kept:
                        break
                    dropped += 1
        self.ranges.setdefault(ledger_id, []).append((0, first_kept - 1))
        return dropped

    def begin_write_out(self) -> Commit:
        """Event loop: move this generation's changes into a Commit (a failed one not
        yet written absorbs them) and start the next generation."""
        job = Commit(self.env, self.meta, self.loc, self.path, self.ranges, self.gone,
                     self.pending)
        built = self.ledgers.built
        for lid in self.touched:
            idx = built.get(lid)
            if idx is not None:
                job.metas[lid] = idx.header_bytes()[:HEAD_BYTES]
                idx.header_dirty = False
                idx.header_written = True
        old = self.committing
        if old is not None and not old.done:
            old.absorb(job)
            job = old
        self.committing = job
        self.pending, self.ranges, self.gone, self.touched = {}, {}, set(), set()
        return job

    def end_write_out(self, job: Commit) -> None:
        """Event loop, after ``job.run``: lookups go to the store again. A job that
        failed stays, and the next ``begin_write_out`` adds to it."""
        if job.done and self.committing is job:
            self.committing = None
            if job.seconds:
                self.commits += 1
                self.commit_seconds += job.seconds

    def write_out(self) -> list[Path]:
        """Begin, run and end a commit in this thread (tools; the storage runs the
        commit in a worker). Returns what ``sync_paths`` must sync."""
        job = self.begin_write_out()
        if not job:
            job.done = True
            self.end_write_out(job)
            return []
        job.run()
        self.end_write_out(job)
        return [self.path]

    def locations(self, ledger_id: int) -> Iterator[tuple[int, int]]:
        """(entry, location) of every stored entry of the ledger, in order (the store as
        of the last write_out)."""
        with self.env.begin(db=self.loc) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_KEY.pack(ledger_id, 0)):
                return
            for k, v in cursor:
                lid, eid = _KEY.unpack(k)
                if lid != ledger_id:
                    return
                yield eid, _LOC.unpack(v)[0]

    def sync_paths(self, paths: list[Path]) -> None:
        """Make the committed transactions durable (any thread)."""
        if paths:
            self.env.sync(True)

    def store_bytes(self) -> int:
        """Bytes the store's pages take (for metrics)."""
        if self.env is None or self.closed:
            return 0
        info = self.env.info()
        stat = self.env.stat()
        return int((info["last_pgno"] + 1) * stat["psize"])

    def delete(self, ledger_id: int) -> Path | None:
        """Forget a ledger: its meta and its whole key range go at the next write_out
        (one range walk). Nothing to unlink."""
        if self.ledgers.pop(ledger_id, None) is None:
            return None
        self.trimmed.pop(ledger_id, None)
        self.touched.discard(ledger_id)
        for key in [k for k in self.pending if k[0] == ledger_id]:
            del self.pending[key]
        self.ranges.setdefault(ledger_id, []).append((0, _END))
        self.gone.add(ledger_id)
        return None

    def close(self) -> None:
        if self.closed or self.env is None:
            return
        self.closed = True
        shared = _OPEN[self._key]
        shared[3] -= 1
        if shared[3] == 0:
            del _OPEN[self._key]
            self.env.close()
