"""Offline views and repairs of a bookie's ledger storage, for ``ledgerd shell``.

- ``list_entry_logs``: every entry log with its size, ledgers and live fraction
  (BookKeeper's ``listfilesondisc`` with usage). Live means the ledger's index file
  exists; trims of unbounded ledgers are not visible offline, so the figure is an
  upper bound.
- ``check_consistency``: every location in every index file must name an existing log,
  a record whose checksum holds, carrying that ledger and entry id, and (with a
  ``verify`` function: the entry format is the wire layer's, above this one) whose
  entry digest verifies.
- ``rebuild_index``: a ledger's index regenerated from the entry logs (BookKeeper's
  regenerate-interleaved-storage-index-file). The newest copy of each entry wins
  (compaction copies into newer logs; a deleted and re-created ledger's entries are in
  newer logs than the dead ones).

All read files only; ``rebuild_index`` writes one index file. The bookie must be stopped
for a rebuild (its cache would overwrite the file); the listing and the check may run
beside a live bookie, whose index files lag its memory by at most a checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ledgerd.disk.entrylog import (
    ENTRY_LOG_HEADER_SIZE,
    MAX_ENTRY,
    read_entry_log_meta,
    read_records,
)
from ledgerd.disk.errors import CorruptRecordError
from ledgerd.disk.fdcache import sync_dirs
from ledgerd.disk.index import INDEX_HEADER_SIZE, LedgerIndex, index_path, read_index_file
from ledgerd.disk.layouts import (
    ENTRY_LOG_HEADER,
    ENTRY_RECORD_PREFIX,
    crc32c,
    fast_struct,
    locations_struct,
)
from ledgerd.wire.entry import entry_ids

if TYPE_CHECKING:
    from ledgerd.disk.dbindex import DbLedgerCache

__all__ = [
    "ConsistencyReport",
    "ConversionResult",
    "EntryLogInfo",
    "Problem",
    "RebuildResult",
    "check_consistency",
    "convert_storage",
    "entry_log_paths",
    "index_paths",
    "list_entry_logs",
    "open_db_index",
    "rebuild_index",
    "stored_ledgers",
]

_REC = fast_struct(ENTRY_RECORD_PREFIX)
_LOC = locations_struct(1)
_HEAD_TO_MAP = fast_struct(ENTRY_LOG_HEADER, stop="ledgers_count")  # through the map offset


def entry_log_paths(ledger_dirs: Sequence[Path]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for d in ledger_dirs:
        for p in (Path(d) / "current").glob("*.log"):
            try:
                out[int(p.stem, 16)] = p
            except ValueError:
                continue
    return dict(sorted(out.items()))


def index_paths(index_dirs: Sequence[Path]) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for d in index_dirs:
        for p in (Path(d) / "current").glob("*/*/*.idx"):
            try:
                out[int(p.stem, 16)] = p
            except ValueError:
                continue
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class EntryLogInfo:
    log_id: int
    path: str
    size: int
    rolled: bool
    ledgers: dict[int, int]  # ledger id -> bytes
    live_bytes: int
    problem: str = ""

    @property
    def live_fraction(self) -> float:
        total = sum(self.ledgers.values())
        return self.live_bytes / total if total else 0.0


def stored_ledgers(index_dirs: Sequence[Path]) -> list[int]:
    """Every ledger the index holds (index files, or the db storage's store)."""
    ids = set(index_paths(index_dirs))
    db = open_db_index(index_dirs)
    if db is not None:
        ids |= set(db.ledgers)
        db.close()
    return sorted(ids)


def open_db_index(index_dirs: Sequence[Path]) -> DbLedgerCache | None:
    from ledgerd.disk.dbindex import DB_DIR, DbLedgerCache

    if not (Path(index_dirs[0]) / "current" / DB_DIR / "data.mdb").exists():
        return None
    db = DbLedgerCache([Path(d) for d in index_dirs])
    db.load_all()
    return db


LocationsOrError = Iterator[tuple[int, int]] | Exception


def _stored_locations(index_dirs: Sequence[Path],
                      ) -> Iterator[tuple[int, str, LocationsOrError]]:
    """(ledger, where its index is, its (entry, location) pairs or why they cannot be
    read) for every ledger of either storage's index."""
    for lid, path in index_paths(index_dirs).items():
        try:
            _idx, raw = read_index_file(path)
        except (OSError, CorruptRecordError) as exc:
            yield lid, str(path), exc
            continue
        locs = locations_struct(len(raw) // 8).unpack_from(raw)
        yield lid, str(path), ((e, loc) for e, loc in enumerate(locs) if loc)
    db = open_db_index(index_dirs)
    if db is None:
        return
    try:
        for lid in sorted(db.ledgers):
            yield lid, str(db.path), db.locations(lid)
    finally:
        db.close()


def list_entry_logs(ledger_dirs: Sequence[Path], index_dirs: Sequence[Path]) -> list[EntryLogInfo]:
    live = set(stored_ledgers(index_dirs))
    out = []
    for log_id, path in entry_log_paths(ledger_dirs).items():
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(_HEAD_TO_MAP.size)
            rolled = len(head) == _HEAD_TO_MAP.size and _HEAD_TO_MAP.unpack(head)[-1] != 0
            meta = read_entry_log_meta(path, log_id)
        except (OSError, CorruptRecordError) as exc:
            out.append(EntryLogInfo(log_id, str(path), 0, False, {}, 0, str(exc)))
            continue
        out.append(EntryLogInfo(log_id, str(path), size, rolled, meta.ledgers,
                                meta.live_bytes(live)))
    return out


@dataclass(frozen=True, slots=True)
class Problem:
    ledger_id: int
    entry_id: int
    location: str
    what: str


@dataclass
class ConsistencyReport:
    ledgers: int = 0
    entries: int = 0
    unverified_digests: int = 0  # HMAC (or unknown) digests: checksum and ids only
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# An entry's digest check: True/False when checked, None when it cannot be (HMAC).
Verify = Callable[[bytes], "bool | None"]


def check_consistency(ledger_dirs: Sequence[Path], index_dirs: Sequence[Path], *,
                      verify: Verify | None = None, digest_name: str = "digest",
                      progress: object = None) -> ConsistencyReport:
    """Check every index location; ``verify`` checks each entry's digest (None from it
    counts the entry as unverified, not wrong)."""
    logs = entry_log_paths(ledger_dirs)
    report = ConsistencyReport()
    fds: dict[int, int] = {}
    try:
        for lid, where, locations in _stored_locations(index_dirs):
            report.ledgers += 1
            if isinstance(locations, Exception):
                report.problems.append(Problem(lid, -1, where,
                                               f"unreadable index: {locations}"))
                continue
            for eid, loc in locations:
                report.entries += 1
                what = _check_location(lid, eid, loc, logs, fds, verify, digest_name, report)
                if what:
                    log_id, off = loc >> 32, loc & 0xFFFFFFFF
                    report.problems.append(Problem(lid, eid, f"{log_id:x}.log@{off}", what))
            if callable(progress):
                progress()
    finally:
        for fd in fds.values():
            os.close(fd)
    return report


def _check_location(lid: int, eid: int, loc: int, logs: dict[int, Path], fds: dict[int, int],
                    verify: Verify | None, digest_name: str, report: ConsistencyReport) -> str:
    log_id, off = loc >> 32, loc & 0xFFFFFFFF
    path = logs.get(log_id)
    if path is None:
        return "entry log missing (deleted while the index still points at it)"
    fd = fds.get(log_id)
    if fd is None:
        fd = fds[log_id] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if off < ENTRY_LOG_HEADER_SIZE:
        return "offset inside the entry log header"
    head = os.pread(fd, 8, off)
    if len(head) < 8:
        return "record past the end of the log"
    n, crc = _REC.unpack(head)
    if n == 0 or n > MAX_ENTRY:
        return f"junk record size {n}"
    data = os.pread(fd, n, off + 8)
    if len(data) < n:
        return "record runs past the end of the log"
    if crc32c(data) != crc:
        return "record checksum mismatch"
    if n < 16:
        return "record too short for entry ids"
    got = entry_ids(data)
    if got != (lid, eid):
        return f"record holds ledger {got[0]} entry {got[1]}"
    ok = verify(data) if verify is not None else None
    if ok is None:
        report.unverified_digests += 1
    elif not ok:
        return f"entry digest mismatch ({digest_name})"
    return ""


@dataclass
class RebuildResult:
    ledger_id: int
    path: Path
    entries: int
    first_entry: int
    last_entry: int
    logs_scanned: int
    kept_header: bool
    written: bool


def _scan_ledger(logs: dict[int, Path], ledger_id: int) -> Iterator[tuple[int, int]]:
    """(entry id, location) of every record of the ledger, oldest log first."""
    for log_id, path in logs.items():
        offset = ENTRY_LOG_HEADER_SIZE
        base = log_id << 32
        while offset:
            records, offset = read_records(path, offset, 4 << 20)
            for rec_off, body in records:
                lid, eid = entry_ids(body)
                if lid == ledger_id:
                    yield eid, base | rec_off


def rebuild_index(ledger_dirs: Sequence[Path], index_dirs: Sequence[Path], ledger_id: int, *,
                  master_key: bytes | None = None, dry_run: bool = False) -> RebuildResult:
    """Regenerate ``ledger_id``'s index from the entry logs.

    The old header (fence bit, key, term) is kept when it still parses; otherwise
    ``master_key`` must be given. Raises ValueError with the reason when the rebuild
    would be wrong: no entries found, or an unbounded ledger (a term above 0), whose
    TRUNCATE records dropped entries that older logs still hold.
    """
    logs = entry_log_paths(ledger_dirs)
    dirs = list(index_dirs)
    path = index_path(Path(dirs[ledger_id % len(dirs)]), ledger_id)
    old: LedgerIndex | None = None
    if path.exists():
        try:
            old, _raw = read_index_file(path)
        except (OSError, CorruptRecordError):
            old = None
    if old is not None and old.term > 0:
        raise ValueError(
            f"ledger {ledger_id} is unbounded (term {old.term}): a rebuild from the entry "
            "logs would bring back entries its terms' no-ops truncated. Re-replicate it "
            "instead (stop this bookie, then `ledgerd shell recover <this bookie> "
            f"--ledger {ledger_id}`)")
    if old is None and master_key is None:
        raise ValueError(
            f"the index header of ledger {ledger_id} is gone or unreadable, so its master "
            "key is unknown: pass --password (the ledger's password)")
    locations: dict[int, int] = {}
    for eid, loc in _scan_ledger(logs, ledger_id):
        locations[eid] = loc  # newer logs come later and win
    if not locations:
        raise ValueError(f"no entry of ledger {ledger_id} in {len(logs)} entry log(s) under "
                         f"{', '.join(map(str, ledger_dirs))}")
    last = max(locations)
    result = RebuildResult(ledger_id, path, len(locations), min(locations), last, len(logs),
                           old is not None, False)
    if dry_run:
        return result
    idx = old if old is not None else LedgerIndex(ledger_id, path, master_key=master_key or b"")
    idx.path = path
    body = bytearray(8 * (last + 1))
    for eid, loc in locations.items():
        _LOC.pack_into(body, 8 * eid, loc)
    tmp = path.with_suffix(".idx.rebuild")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(idx.header_bytes())
        assert f.tell() == INDEX_HEADER_SIZE
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_dirs([path.parent])
    result.written = True
    return result


@dataclass
class ConversionResult:
    to: str
    ledgers: int = 0
    entries: int = 0
    removed: int = 0  # index files, or the db store (1), removed after the copy was synced


def convert_storage(index_dirs: Sequence[Path], to: str, *,
                    progress: Callable[[int, int], None] | None = None) -> ConversionResult:
    """Convert a stopped bookie's index between the storages (BookKeeper's
    convert-to-db-storage and back): every ledger's state and locations are copied into
    the other form, synced, and only then is the old form removed, so an interrupted
    run leaves the old index whole (run it again). Entry logs and the journal are the
    same for both and stay as they are."""
    from ledgerd.disk.dbindex import DB_DIR, DbLedgerCache
    from ledgerd.disk.index import LedgerCache

    if to not in ("db", "interleaved"):
        raise ValueError(f"--to {to!r}: db or interleaved")
    dirs = [Path(d) for d in index_dirs]
    db_path = dirs[0] / "current" / DB_DIR
    out = ConversionResult(to)
    if to == "db":
        files = index_paths(dirs)
        target = DbLedgerCache(dirs)
        target.load_all()
        try:
            for n, (lid, path) in enumerate(sorted(files.items()), 1):
                src, body = read_index_file(path)
                idx = target.get_or_create(lid)
                idx.master_key, idx.fenced, idx.term = src.master_key, src.fenced, src.term
                idx.explicit_lac = src.explicit_lac
                target.dirty(idx)
                locs = locations_struct(len(body) // 8).unpack_from(body)
                for eid, loc in enumerate(locs):
                    if loc:
                        target.set_location(lid, eid, loc)
                        out.entries += 1
                out.ledgers += 1
                if n % 1000 == 0:
                    target.write_out()
                if progress is not None:
                    progress(n, len(files))
            target.sync_paths(target.write_out() or [target.path])
        finally:
            target.close()
        for path in files.values():
            path.unlink()
            out.removed += 1
        sync_dirs(p.parent for p in files.values())
        return out
    if not (db_path / "data.mdb").exists():
        raise ValueError(f"{db_path}: no db index to convert")
    source = DbLedgerCache(dirs)
    source.load_all()
    target_files = LedgerCache(dirs, page_size=8192, page_limit=4096)
    try:
        ledgers = sorted(source.ledgers)
        for n, lid in enumerate(ledgers, 1):
            src = source.ledgers[lid]
            idx = target_files.get_or_create(lid)
            idx.master_key, idx.fenced, idx.term = src.master_key, src.fenced, src.term
            idx.explicit_lac = src.explicit_lac
            target_files.dirty(idx)
            for eid, loc in source.locations(lid):
                target_files.set_location(lid, eid, loc)
                out.entries += 1
            target_files.sync_paths(target_files.write_out())
            out.ledgers += 1
            if progress is not None:
                progress(n, len(ledgers))
    finally:
        source.close()
    import shutil
    shutil.rmtree(db_path)
    out.removed = 1
    sync_dirs([db_path.parent])
    return out
