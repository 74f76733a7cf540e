"""The ``db`` ledger storage's index: every ledger's state and entry locations in one
embedded key-value store, as BookKeeper's DbLedgerStorage keeps them in RocksDB.

Per-ledger index files cost a file (create, open, header, page reads and fsync) per
ledger touched; at 10,000+ actively written ledgers that dominates (issue #26: every add
missed the page cache, checkpoints wrote and synced thousands of files, creating 10,000
files stalled requests for seconds). Here one LMDB environment holds everything:

    <first index dir>/current/ledgers.lmdb/
      meta: ledger id (8 B, big-endian) -> the index-file header's first 115 bytes
            (key, fence, term, explicit LAC, CRC; see ``index.py``; the rest of its
            1024 bytes is padding) + last entry id (8 B)
      loc:  ledger id (8 B) + entry id (8 B), big-endian -> location (8 B)

Big-endian keys sort by (ledger, entry), so a ledger's entries are one key range:
deleting a ledger, truncating or trimming it is one range walk, and a checkpoint writes
the locations added since the last one as a single sorted transaction. LMDB was chosen
over RocksDB (``rocksdict``) for this step: no compaction threads, no write-ahead log of
its own to tune (ledgerd's journal already is the write-ahead log), crash-safe
copy-on-write commits, and a maintained binding with wheels (``lmdb``); the choice is
measured in ``bench/ledgers_scale.py``.

The same rules as the index files: locations and headers are as durable as the last
checkpoint (``write_out`` commits without syncing; ``sync_paths`` syncs); the journal
covers the rest on replay. ``DbLedgerCache`` has ``LedgerCache``'s interface, so the
storage, GC, compaction and replay code is the same for both.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ledgerd.disk.errors import CorruptRecordError, StorageError
from ledgerd.disk.index import INDEX_HEADER_SIZE, LedgerIndex, parse_index_header

__all__ = ["DB_DIR", "DbLedgerCache"]

DB_DIR = "ledgers.lmdb"
MAP_SIZE = 1 << 40  # address space reserved, not disk: LMDB grows its file as it fills
_KEY = struct.Struct(">qq")
_LID = struct.Struct(">q")
_LOC = struct.Struct(">q")
_END = (1 << 63) - 1
HEAD_BYTES = 115  # the index header's fields and CRC; the rest of its 1024 bytes is padding
META_SIZE = HEAD_BYTES + 8
# LMDB allows one environment per file per process: a storage opened again in the same
# process (a restart in tests, after the old object was abandoned as a crash would) uses
# the open one. Committed transactions are what a crashed process leaves in the page
# cache too. path -> [env, meta db, loc db, users]
_OPEN: dict[str, list[Any]] = {}


class LazyLedgers:
    """Ledger id -> LedgerIndex, built on first use from the raw ``meta`` records read at
    start-up: opening a bookie with a million ledgers reads the store once and makes
    objects only for the ledgers then touched. The dict operations the storage uses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.raw: dict[int, bytes] = {}  # not yet built
        self.built: dict[int, LedgerIndex] = {}

    def _build(self, lid: int) -> LedgerIndex | None:
        value = self.raw.pop(lid, None)
        if value is None:
            return None
        if len(value) != META_SIZE:
            raise CorruptRecordError(str(self.path), lid,
                                     f"ledger meta record of {len(value)} bytes")
        idx = parse_index_header(value[:HEAD_BYTES].ljust(INDEX_HEADER_SIZE, b"\0"),
                                 self.path)
        idx.last_entry_id = _LOC.unpack_from(value, HEAD_BYTES)[0]
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
        self.ledgers = LazyLedgers(self.path)
        self.trimmed: dict[int, int] = {}
        self.full_dirs: set[Path] = set()
        self.pending: dict[tuple[int, int], int] = {}  # locations since the last write_out
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # ledger -> (first, last) to delete
        self.gone: set[int] = set()  # ledgers whose meta goes at the next write_out
        self.touched: set[int] = set()  # ledgers whose meta (last entry) must be written
        self.hits = 0
        self.misses = 0

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

    def get(self, ledger_id: int) -> LedgerIndex | None:
        return self.ledgers.get(ledger_id)

    def get_or_create(self, ledger_id: int) -> LedgerIndex:
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            idx = self.ledgers[ledger_id] = LedgerIndex(ledger_id, self.path)
            self.gone.discard(ledger_id)
            self.touched.add(ledger_id)
        return idx

    def set_location(self, ledger_id: int, entry_id: int, location: int) -> None:
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        self.pending[(ledger_id, entry_id)] = location
        if entry_id > idx.last_entry_id:
            idx.last_entry_id = entry_id
        self.touched.add(ledger_id)

    def set_locations(self, ledger_id: int, first_entry_id: int, locations: list[int]) -> None:
        idx = self.ledgers.get(ledger_id) or self.get_or_create(ledger_id)
        pending = self.pending
        for i, loc in enumerate(locations):
            pending[(ledger_id, first_entry_id + i)] = loc
        last = first_entry_id + len(locations) - 1
        if last > idx.last_entry_id:
            idx.last_entry_id = last
        self.touched.add(ledger_id)

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
        if self._dropped(ledger_id, entry_id):
            return 0
        self.misses += 1
        with self.env.begin(db=self.loc) as txn:
            raw = txn.get(_KEY.pack(ledger_id, entry_id))
        return 0 if raw is None else int(_LOC.unpack(raw)[0])

    def _dropped(self, ledger_id: int, entry_id: int) -> bool:
        return any(lo <= entry_id <= hi for lo, hi in self.ranges.get(ledger_id, ()))

    def truncate_after(self, ledger_id: int, last_kept: int) -> None:
        idx = self.ledgers.get(ledger_id)
        if idx is None:
            return
        for key in [k for k in self.pending if k[0] == ledger_id and k[1] > last_kept]:
            del self.pending[key]
        self.ranges.setdefault(ledger_id, []).append((last_kept + 1, _END))
        idx.last_entry_id = min(idx.last_entry_id, last_kept)
        self.touched.add(ledger_id)

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

    def write_out(self) -> list[Path]:
        """One transaction: range deletes, the new locations (sorted), the changed
        ledgers' meta. Committed unsynced; returns what ``sync_paths`` must sync."""
        if not (self.pending or self.ranges or self.gone or self.touched
                or any(i.header_dirty for i in self.ledgers.touched())):
            return []
        import lmdb

        try:
            with self.env.begin(write=True) as txn:
                for lid, lo, hi in ((lid, lo, hi) for lid, spans in self.ranges.items()
                                    for lo, hi in spans):
                    cursor = txn.cursor(db=self.loc)
                    if cursor.set_range(_KEY.pack(lid, lo)):
                        while True:
                            k = cursor.key()  # (empty past the last record)
                            if len(k) != _KEY.size:
                                break
                            got_lid, eid = _KEY.unpack(k)
                            if got_lid != lid or eid > hi or not cursor.delete():
                                break
                for lid in self.gone:
                    txn.delete(_LID.pack(lid), db=self.meta)
                if self.pending:
                    cursor = txn.cursor(db=self.loc)
                    cursor.putmulti(sorted((_KEY.pack(lid, eid), _LOC.pack(loc))
                                           for (lid, eid), loc in self.pending.items()))
                for idx in self.ledgers.touched():
                    if idx.header_dirty or idx.ledger_id in self.touched:
                        txn.put(_LID.pack(idx.ledger_id),
                                idx.header_bytes()[:HEAD_BYTES]
                                + _LOC.pack(idx.last_entry_id), db=self.meta)
                        idx.header_dirty = False
                        idx.header_written = True
        except lmdb.MapFullError as exc:
            raise OSError(28, f"ledger index store full: {exc}", str(self.path)) from exc
        except lmdb.Error as exc:
            raise OSError(5, f"ledger index store: {exc}", str(self.path)) from exc
        self.pending.clear()
        self.ranges.clear()
        self.gone.clear()
        self.touched.clear()
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
