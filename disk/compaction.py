"""Entry-log garbage collection and compaction.

A rolled entry log holds entries of many ledgers. Its *ledgers map* (written at roll, or
rebuilt by scanning a log that never rolled) says how many bytes each ledger has in it.
A ledger is live while its index exists here: the appliance's ledger GC deletes the index
of every ledger that the metadata store no longer has, so this module needs no metadata.

- A log whose ledgers are all gone is deleted.
- A log whose live fraction is under the threshold is compacted, crash-safely as
  BookKeeper's ``EntryLogCompactor``: live entries (those the index still points at in
  this log) are re-appended to the current log, a checkpoint makes the copies durable,
  the index is pointed at the copies, a second checkpoint makes the index durable, and
  only then is the old log deleted. A crash at any point leaves at worst orphan copies.
"""

from __future__ import annotations

import logging
import struct
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from disk.entrylog import ENTRY_LOG_HEADER_SIZE, MAX_ENTRY, read_ledgers_map
from ledgerd.base.logs import fields

if TYPE_CHECKING:
    from disk.storage import LedgerStorage

__all__ = ["CompactionResult", "EntryLogMeta", "compact_entry_logs", "read_entry_log_meta",
           "read_records"]

log = logging.getLogger(__name__)
_REC = struct.Struct(">II")
_IDS = struct.Struct(">qq")
_READ_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class EntryLogMeta:
    log_id: int
    ledgers: dict[int, int]  # ledger id -> bytes (records included)

    @property
    def total_bytes(self) -> int:
        return sum(self.ledgers.values())

    def live_bytes(self, live: Container[int]) -> int:
        return sum(n for lid, n in self.ledgers.items() if lid in live)

    def usage(self, live: Container[int]) -> float:
        total = self.total_bytes
        return self.live_bytes(live) / total if total else 0.0


@dataclass
class CompactionResult:
    logs_deleted: list[int] = field(default_factory=list)
    logs_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_reclaimed: int = 0


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
            if n >= 16 and _IDS.unpack_from(body, 0)[0] >= 0:
                out.append((pos, body))
            pos += 8 + n
    return out, pos


def read_entry_log_meta(path: Path, log_id: int) -> EntryLogMeta:
    """The log's ledgers map, from its header or, if it never rolled, by scanning it."""
    ledgers = read_ledgers_map(path)
    if ledgers is not None:
        return EntryLogMeta(log_id, ledgers)
    counts: dict[int, int] = defaultdict(int)
    offset = ENTRY_LOG_HEADER_SIZE
    while offset:
        records, offset = read_records(path, offset, _READ_CHUNK)
        for _off, body in records:
            counts[_IDS.unpack_from(body, 0)[0]] += len(body) + 8
    return EntryLogMeta(log_id, dict(counts))


async def compact_entry_logs(storage: LedgerStorage, *, threshold: float,
                             rate: int = 0, max_logs: int = 0) -> CompactionResult:
    """Delete dead rolled logs; compact those whose live fraction is below ``threshold``
    (0 deletes only), lowest usage first, at most ``rate`` entries/s (0: unthrottled)."""
    result = CompactionResult()
    logger = storage.entry_logger
    metas = await storage.rolled_log_metas()
    live = storage.cache.ledgers
    for meta in metas:
        if meta.live_bytes(live) == 0:
            await storage.remove_entry_log(meta.log_id)
            result.logs_deleted.append(meta.log_id)
            result.bytes_reclaimed += meta.total_bytes
    candidates = sorted((m for m in metas if m.log_id not in result.logs_deleted
                         and m.usage(live) < threshold), key=lambda m: m.usage(live))
    for meta in candidates[: max_logs or None]:
        moved = await _copy_live_entries(storage, meta, rate)
        await storage.checkpoint()  # the copies are durable
        cache = storage.cache
        for lid, eid, old, new in moved:
            if cache.get(lid) is not None and cache.location(lid, eid) == old:
                cache.set_location(lid, eid, new)
        await storage.checkpoint()  # the index points at them durably
        await storage.remove_entry_log(meta.log_id)
        result.logs_compacted.append(meta.log_id)
        result.entries_moved += len(moved)
        result.bytes_reclaimed += meta.total_bytes - meta.live_bytes(storage.cache.ledgers)
        log.info("entry_log_compacted", extra=fields(
            log=f"{meta.log_id:x}", moved=len(moved), current=f"{logger.current_log_id:x}"))
    return result


async def _copy_live_entries(storage: LedgerStorage, meta: EntryLogMeta,
                             rate: int) -> list[tuple[int, int, int, int]]:
    path = storage.entry_logger.paths[meta.log_id]
    base = meta.log_id << 32
    moved: list[tuple[int, int, int, int]] = []
    offset = ENTRY_LOG_HEADER_SIZE
    chunk = 1 << 20
    while offset:
        records, offset = await trio.to_thread.run_sync(read_records, path, offset, chunk)
        copied = 0
        cache = storage.cache
        for rec_off, body in records:
            lid, eid = _IDS.unpack_from(body, 0)
            old = base | rec_off
            if cache.get(lid) is None or cache.location(lid, eid) != old:
                continue
            new = storage.entry_logger.add(lid, body)
            moved.append((lid, eid, old, new))
            copied += 1
        if rate > 0 and copied:
            await trio.sleep(copied / rate)
        else:
            await trio.sleep(0)
    return moved
