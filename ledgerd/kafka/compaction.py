"""Log compaction's decisions (``cleanup.policy=compact``), without I/O.

Kafka's log cleaner keeps at least the latest record of each key of a compacted
partition and never changes an offset. The gateway compacts a partition's *closed*
ledgers (never the active, last one), as Kafka never cleans the active segment; the
cleaner (``cleaner.py``) does the I/O, this module decides:

- *Cleanable*: the leading closed ledgers whose newest record (their last batch's max
  timestamp) is at least ``min.compaction.lag.ms`` old (``cleanable_prefix``). Offsets
  at or past the first ledger that is not are never touched.
- *Dirty*: what no pass has compacted yet: from ``first_dirty`` (the largest
  ``clean_through`` a previous pass wrote into the custom metadata of the ledgers it
  replaced; the log's first offset if none) to the end of the cleanable ledgers. A pass
  runs once the dirty bytes are at least ``min.cleanable.dirty.ratio`` of the
  cleanable bytes, or when a tombstone it kept before has become due
  (``should_clean``).
- *The offset map* (``OffsetMap``): key -> latest offset over the dirty part, keys
  held as 16-byte BLAKE2b digests (Kafka: MD5) and bounded in entries (the gateway's
  ``compaction_map_bytes`` / 24, as Kafka's ``log.cleaner.dedupe.buffer.size``). When
  it is full the pass covers only the offsets mapped so far (``covered``): a later
  pass goes on from there.
- *Which records go* (``compact_batch``): a keyed record of a data batch at offset
  ``o < covered`` whose key the map holds at a later offset; and a tombstone (null
  value) that is its key's latest once its timestamp is older than
  ``delete.retention.ms``. Why this is safe: after a pass that covered ``C``, no record
  below ``C`` is superseded by another below ``C`` (the clean part was deduplicated by
  earlier passes, the map removes what the dirty part supersedes), so a tombstone
  whose key the map does not hold is its key's latest below ``C`` and no older value of
  that key is left for it to hide.
- Transactional and control batches are left as they are and their records are not
  put into the map: a transactional record may belong to an aborted transaction, so it
  supersedes nothing (compaction keeps more than the minimum there, never less).

A batch keeps its baseOffset, lastOffsetDelta, timestamps, producer id, epoch and base
sequence, attributes and codec; its kept records are byte for byte what they were
(their offset deltas unchanged) and the records section is compressed again with the
batch's codec; recordCount, batchLength and the CRC are new. A batch left with no
record stays as an *empty batch* (recordCount 0), as Kafka's cleaner keeps a
producer's last batch: each ledger keeps its entry count and each entry its base
offset, so the offset index (``partitions.py``: first batch per ledger, binary search
over entries) is unchanged, and a consumer asking for an offset inside a removed range
is served the batch that held it and moves on to the next kept record (clients skip
to lastOffset + 1, KAFKA-5443).

Keyless records cannot be compacted: a compacted topic refuses them at produce
(``keyless_records``, INVALID_RECORD with KIP-467 record errors).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ledgerd.kafka.compression import Codec, compress
from ledgerd.kafka.records import (
    CONTROL,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    TRANSACTIONAL,
    BatchError,
    BatchHeader,
    batch_with_records,
    record_spans,
)
from ledgerd.kafka.timestamps import RecordsError, records_of

__all__ = [
    "CLEAN_THROUGH_KEY",
    "COMPACTED_LOG_KEY",
    "ENTRY_BYTES",
    "Compacted",
    "LedgerView",
    "OffsetMap",
    "TxnKeys",
    "cleanable_prefix",
    "compact_batch",
    "dirty_ratio",
    "first_dirty",
    "keyless_records",
    "map_batch",
    "should_clean",
]

CLEAN_THROUGH_KEY = "ledgerd.kafka.clean-through"  # a replacement ledger's pass covered
COMPACTED_LOG_KEY = "ledgerd.kafka.compacted-for"  # the log a replacement was written for
# an offset map entry as this map holds it in memory: a 16-byte digest as a bytes
# object and an int in a dict (measured with tracemalloc: about 123 bytes a key;
# Kafka's SkimpyOffsetMap packs one in 24)
ENTRY_BYTES = 128
TXN_KEYS_MAX = 10_000  # transactional keys a pass tracks before it keeps every tombstone


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerView:
    """A closed ledger of a compacted log, as the cleaner sees it."""

    ledger_id: int
    first_offset: int  # of its first batch
    next_offset: int  # after its last batch
    size: int  # bytes
    max_timestamp: int  # of its last batch (ms)
    clean_through: int = -1  # the offset a pass that wrote it covered (-1: none did)


def cleanable_prefix(closed: Sequence[LedgerView], *, now_ms: int,
                     min_compaction_lag_ms: int) -> int:
    """How many leading closed ledgers may be compacted: each newest record at least
    ``min_compaction_lag_ms`` old (the first that is not ends the run)."""
    n = 0
    while n < len(closed) and closed[n].max_timestamp <= now_ms - min_compaction_lag_ms:
        n += 1
    return n


def first_dirty(ledgers: Sequence[LedgerView], remembered: int = -1) -> int:
    """The first offset no pass has compacted yet: the largest ``clean_through`` of the
    ledgers or ``remembered`` (what this gateway's last pass covered), else the log's
    first offset."""
    start = ledgers[0].first_offset if ledgers else 0
    return max([start, remembered] + [lv.clean_through for lv in ledgers])


def dirty_ratio(cleanable: Sequence[LedgerView], dirty_from: int) -> float:
    """The share of the cleanable ledgers' bytes at or after ``dirty_from`` (a ledger
    that holds it counts in proportion of its offsets)."""
    total = sum(lv.size for lv in cleanable)
    if not total:
        return 0.0
    dirty = 0.0
    for lv in cleanable:
        if lv.first_offset >= dirty_from:
            dirty += lv.size
        elif lv.next_offset > dirty_from:
            span = max(1, lv.next_offset - lv.first_offset)
            dirty += lv.size * (lv.next_offset - dirty_from) / span
    return dirty / total


def should_clean(cleanable: Sequence[LedgerView], *, dirty_from: int,
                 min_dirty_ratio: float, delete_retention_ms: int,
                 tombstones_due_ms: int | None, now_ms: int) -> bool:
    """A pass runs when: the dirty share reached ``min_dirty_ratio`` (with a dirty byte);
    a tombstone an earlier pass kept is due (``tombstones_due_ms``; None: not known, as
    after a restart, which runs one pass); or a dirty ledger's newest record is older
    than ``delete_retention_ms`` (a tombstone in it may be due), so that tombstones go
    whatever the ratio."""
    if not cleanable:
        return False
    if tombstones_due_ms is None or tombstones_due_ms <= now_ms:
        return True
    ratio = dirty_ratio(cleanable, dirty_from)
    if ratio > 0 and ratio >= min_dirty_ratio:
        return True
    return any(lv.next_offset > dirty_from and lv.max_timestamp < now_ms - delete_retention_ms
               for lv in cleanable)


class OffsetMap:
    """Key -> its latest offset seen, at most ``capacity`` keys (module docstring)."""

    __slots__ = ("capacity", "latest")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an offset map needs room for a key, got {capacity}")
        self.capacity = capacity
        self.latest: dict[bytes, int] = {}

    @staticmethod
    def digest(key: bytes) -> bytes:
        return hashlib.blake2b(key, digest_size=16).digest()

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as ``key``'s latest; False (nothing changed) if the key is
        new and the map is full."""
        d = self.digest(key)
        if d not in self.latest and len(self.latest) >= self.capacity:
            return False
        self.latest[d] = offset
        return True

    def get(self, key: bytes) -> int | None:
        return self.latest.get(self.digest(key))

    def __len__(self) -> int:
        return len(self.latest)


def _is_data(h: BatchHeader) -> bool:
    return not h.attributes & (CONTROL | TRANSACTIONAL)


class TxnKeys:
    """The keys of the transactional records a pass has met so far, in log order (as
    16-byte digests). Transactional batches are never compacted, so their records stay
    and supersede nothing: a tombstone over a key one of them holds, further down the
    log, must stay too, or that record (committed, or aborted and shown to
    read_uncommitted consumers) would become its key's value again. Past
    ``TXN_KEYS_MAX`` keys the pass keeps every tombstone."""

    __slots__ = ("digests", "overflow")

    def __init__(self, digests: frozenset[bytes] = frozenset(), overflow: bool = False,
                 ) -> None:
        self.digests = set(digests)
        self.overflow = overflow

    def snapshot(self) -> TxnKeys:
        return TxnKeys(frozenset(self.digests), self.overflow)

    def add(self, batch: bytes, h: BatchHeader) -> None:
        if self.overflow or not h.record_count:
            return
        for r in record_spans(_records(batch, h), h.record_count):
            if r.key is not None:
                self.digests.add(OffsetMap.digest(r.key))
        if len(self.digests) > TXN_KEYS_MAX:
            self.overflow, self.digests = True, set()

    def guards(self, key: bytes) -> bool:
        return self.overflow or OffsetMap.digest(key) in self.digests


def _records(batch: bytes, h: BatchHeader) -> bytes | memoryview:
    try:
        return records_of(h, memoryview(batch)[HEADER_SIZE:h.length])
    except RecordsError as exc:
        raise BatchError(2, f"batch at offset {h.base_offset}: {exc}") from None


def map_batch(omap: OffsetMap, batch: bytes, *, dirty_from: int) -> int | None:
    """Put the keyed records of a data batch at or after ``dirty_from`` into the map.
    Returns None if all fit, else the offset of the first record that did not (the
    map covers the offsets below it). Raises BatchError for records that do not parse."""
    h = BatchHeader.parse(batch)
    if not _is_data(h) or h.next_offset <= dirty_from or not h.record_count:
        return None
    for r in record_spans(_records(batch, h), h.record_count):
        offset = h.base_offset + r.offset_delta
        if offset >= dirty_from and r.key is not None and not omap.put(r.key, offset):
            return offset
    return None


@dataclass(frozen=True, slots=True)
class Compacted:
    """One batch after compaction: its bytes (the same object if nothing went), the
    records removed, and the earliest timestamp among the tombstones it keeps (-1:
    none), from which the cleaner knows when a pass is due again."""

    batch: bytes
    removed: int
    oldest_tombstone: int = -1


def compact_batch(batch: bytes, omap: OffsetMap, *, covered: int, now_ms: int,
                  delete_retention_ms: int, txn_keys: TxnKeys | None = None) -> Compacted:
    """``batch`` without the records compaction removes (module docstring): superseded
    by a later offset of the same key in ``omap``, or tombstones older than
    ``delete_retention_ms`` that are their key's latest and hold no key a
    transactional record before them holds (``txn_keys``: those met so far in log
    order; ``compact_batch`` adds a transactional batch's); only records below
    ``covered``. Control and transactional batches come back as they are. Raises
    BatchError for records that do not parse."""
    h = BatchHeader.parse(batch)
    if txn_keys is not None and h.attributes & TRANSACTIONAL and not h.attributes & CONTROL:
        txn_keys.add(batch, h)
    if not _is_data(h) or not h.record_count or h.base_offset >= covered:
        return Compacted(batch, 0)
    body = _records(batch, h)
    spans = record_spans(body, h.record_count)
    kept = []
    oldest = -1
    for r in spans:
        offset = h.base_offset + r.offset_delta
        if offset >= covered or r.key is None:
            kept.append(r)
            continue
        latest = omap.get(r.key)
        if latest is not None and latest > offset:
            continue
        if r.is_tombstone:
            ts = h.max_timestamp if h.attributes & LOG_APPEND_TIME \
                else h.base_timestamp + r.timestamp_delta
            if ts < now_ms - delete_retention_ms and not (
                    txn_keys is not None and txn_keys.guards(r.key)):
                continue
            oldest = ts if oldest < 0 else min(oldest, ts)
        kept.append(r)
    if len(kept) == len(spans):
        return Compacted(batch, 0, oldest)
    records = b"".join(bytes(body[r.start:r.end]) for r in kept)
    codec = Codec(h.attributes & 7)
    new = batch_with_records(batch, compress(codec, records), len(kept))
    return Compacted(new, len(spans) - len(kept), oldest)


def keyless_records(batches: Sequence[tuple[BatchHeader, bytes]]) -> list[int]:
    """The indexes (counted over the request's records, in order) of the records with a
    null key: a compacted topic refuses them (Kafka's LogValidator). Raises BatchError
    (CORRUPT_MESSAGE) for records that do not parse."""
    out: list[int] = []
    at = 0
    for h, raw in batches:
        for i, r in enumerate(record_spans(_records(raw, h), h.record_count)):
            if r.key is None:
                out.append(at + i)
        at += h.record_count
    return out
