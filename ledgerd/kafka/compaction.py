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
- *Transactions* (``TxnScan``): the pass first reads the dirty part to follow its
  transactions, as the partition's ``TxnIndex`` does (``control_records.py``): a
  producer's first transactional data batch opens its transaction, its COMMIT or
  ABORT control batch (an unreadable one counts as ABORT) ends it. The aborted ones
  that hold a record are kept as (producer id, first offset, marker offset)
  (``AbortedTxns``). The *stable end* is the first offset of the earliest transaction
  not resolved within the cleanable ledgers (ongoing, or its marker in the active
  ledger): as Kafka's cleaner cleans only below the first unstable offset, nothing at
  or past it is mapped or touched; a later pass handles it.
- *The offset map* (``OffsetMap``): key -> latest offset (the larger one, whatever
  order they come in) of the *values* below the stable end: the records of data
  batches and of committed transactions (the transactional ones in no aborted
  range), in offset order (``map_batch``); never a record of an aborted transaction.
  Until its first transactional batch the scan maps data batches as it reads them; the
  rest of the dirty part below the stable end is read again to map it. Keys are held as 16-byte BLAKE2b digests (Kafka: MD5); the map is
  bounded in entries (the gateway's ``compaction_map_bytes`` / ``ENTRY_BYTES``, as
  Kafka's ``log.cleaner.dedupe.buffer.size``), and the transactions tracked count
  against it (``reserved``: one per open transaction while the scan runs, one per
  aborted range kept; at most half of it, so that keys always fit: a transaction
  opening past that is not followed and ends the stable end at its first offset,
  while the scan follows those already open to their markers, so a pass always gets
  past the first transaction of its dirty part once that one is resolved). When it
  is full the map covers only the offsets mapped so far.
- *Covered*: the pass's range end, the lesser of the stable end and where the map
  filled; every map entry is below it, and every transaction with a record below it
  was seen resolved.
- *Which records go* (``compact_batch``), only below ``covered``: every record of a
  transactional data batch of an aborted transaction (``AbortedTxns``); and of a data
  batch or a transactional one of a committed transaction, a keyed record whose key the
  map holds at a later offset, and a tombstone (null value) that is its key's latest
  once its timestamp is older than ``delete.retention.ms``. Control batches (the
  transaction markers) stay as they are.

Why this is safe. Call a *value* a record of a data batch or of a committed
transaction (an aborted one is no value: read_committed consumers drop it). After a
pass that covered ``C`` (written as ``clean-through``, where the next dirty part
starts), the log below ``C`` holds (I1) no value superseded by a later value of its
key below ``C``, (I2) no record of an aborted transaction and (I3) only records of
data batches and of transactions the pass saw resolved. By induction: the clean part
(below the previous pass's ``C``) holds them; in the dirty part below ``C`` every
transaction was resolved (``covered`` stops before the first unresolved one), its
aborted ones are emptied and the map holds every value of ``[dirty_from, C)``, so a
value superseded there, or in the clean part by one there, goes. A transactional batch
of the clean part is therefore one of a committed transaction (or one of an aborted
one already emptied), and is compacted like a data batch. Hence a tombstone below
``C`` that is its key's latest (the map holds no later value) has no older value of
its key below it (I1), aborted or not (I2): removing it shows no old value to either
kind of consumer. (The cleaner before this one left transactional batches as they
were, in the clean part too, and guarded tombstones over their keys instead (its
``TxnKeys``); its ledgers carry ``clean-through`` under ``LEGACY_CLEAN_THROUGH_KEY``,
which is not read: the first pass over such a log takes it all as dirty, and I1-I3
hold from then on.)

Consumers: offsets, batch headers (producer id, attributes) and control batches never
change, so the partition's ``TxnIndex``, rebuilt from headers, gives the same LSO and
aborted-transaction list; a read_committed consumer reads each key's latest committed
value (only values supersede, only below every open transaction) and a read_uncommitted
one at least that (records of aborted transactions go, which it would have shown).

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

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ledgerd.kafka.compression import Codec, compress
from ledgerd.kafka.control_records import ControlType, batch_kind
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
    "LEGACY_CLEAN_THROUGH_KEY",
    "AbortedTxns",
    "Compacted",
    "LedgerView",
    "OffsetMap",
    "TxnScan",
    "cleanable_prefix",
    "compact_batch",
    "dirty_ratio",
    "first_dirty",
    "keyless_records",
    "map_batch",
    "should_clean",
]

# a replacement ledger's pass covered (with transactions resolved: module docstring)
CLEAN_THROUGH_KEY = "ledgerd.kafka.clean-through-txn"
LEGACY_CLEAN_THROUGH_KEY = "ledgerd.kafka.clean-through"  # written by the cleaner before
COMPACTED_LOG_KEY = "ledgerd.kafka.compacted-for"  # the log a replacement was written for
# an offset map entry as this map holds it in memory: a 16-byte digest as a bytes
# object and an int in a dict (measured with tracemalloc: about 123 bytes a key;
# Kafka's SkimpyOffsetMap packs one in 24)
ENTRY_BYTES = 128


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
    """Key -> its latest offset seen, at most ``capacity`` entries: its keys and what is
    ``reserved`` (module docstring)."""

    __slots__ = ("capacity", "latest", "reserved")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an offset map needs room for a key, got {capacity}")
        self.capacity = capacity
        self.latest: dict[bytes, int] = {}
        self.reserved = 0  # entries counted for the transactions a pass tracks

    @staticmethod
    def digest(key: bytes) -> bytes:
        return hashlib.blake2b(key, digest_size=16).digest()

    def room(self) -> int:
        return self.capacity - len(self.latest) - self.reserved

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``offset`` as ``key``'s latest (unless it holds a later one); False
        (nothing changed) if the key is new and the map is full."""
        return self.put_digest(self.digest(key), offset)

    def put_digest(self, d: bytes, offset: int) -> bool:
        known = self.latest.get(d)
        if known is None:
            if self.room() < 1:
                return False
            self.latest[d] = offset
        elif offset > known:
            self.latest[d] = offset
        return True

    def get(self, key: bytes) -> int | None:
        return self.latest.get(self.digest(key))

    def __len__(self) -> int:
        return len(self.latest)


def _records(batch: bytes, h: BatchHeader) -> bytes | memoryview:
    try:
        return records_of(h, memoryview(batch)[HEADER_SIZE:h.length])
    except RecordsError as exc:
        raise BatchError(2, f"batch at offset {h.base_offset}: {exc}") from None


def map_batch(omap: OffsetMap, batch: bytes, *, dirty_from: int,
              aborted: AbortedTxns | None = None) -> int | None:
    """Put the keyed records at or after ``dirty_from`` of a data batch, or of a
    transactional one in no ``aborted`` transaction (committed: the caller maps only
    below the stable end; None: none is), into the map. Returns None if all fit, else
    the offset of the first record that did not (the map covers the offsets below
    it). Raises BatchError for records that do not parse."""
    h = BatchHeader.parse(batch)
    if h.attributes & CONTROL or h.next_offset <= dirty_from or not h.record_count:
        return None
    if h.attributes & TRANSACTIONAL and (
            aborted is None or aborted.holds(h.producer_id, h.base_offset)):
        return None
    for r in record_spans(_records(batch, h), h.record_count):
        offset = h.base_offset + r.offset_delta
        if offset >= dirty_from and r.key is not None and not omap.put(r.key, offset):
            return offset
    return None


class AbortedTxns:
    """The aborted transactions a scan saw resolved, with a record in the dirty part:
    per producer id, (first offset, marker offset), in offset order."""

    __slots__ = ("ranges",)

    def __init__(self) -> None:
        self.ranges: dict[int, list[tuple[int, int]]] = {}

    def add(self, pid: int, first: int, marker: int) -> None:
        self.ranges.setdefault(pid, []).append((first, marker))

    def holds(self, pid: int, offset: int) -> bool:
        """True if ``offset`` (of a batch of ``pid``) lies in an aborted transaction."""
        ranges = self.ranges.get(pid)
        if not ranges:
            return False
        i = bisect.bisect_right(ranges, (offset, NO_OFFSET)) - 1
        return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]

    def __len__(self) -> int:
        return sum(len(r) for r in self.ranges.values())


NO_OFFSET = 2**63 - 1


@dataclass(slots=True)
class _Open:
    first: int  # of the transaction's first batch the scan saw
    records: bool = False  # a batch of it held a record (else nothing to remove)


class TxnScan:
    """The transactions of a pass's dirty part (module docstring): ``add`` each batch
    in offset order until it returns an offset (the scan may end there), then
    ``stable_end(end)`` and ``aborted``; then, unless ``map_full``, the batches from
    ``mapped_to`` to the stable end go through ``map_batch``. What it tracks is
    counted in ``omap.reserved`` (at most half the map's capacity); ``stable_end``
    releases what open transactions held."""

    __slots__ = ("aborted", "dirty_from", "eager", "limit", "map_full", "mapped_to", "omap",
                 "open", "stopped", "unresolved")

    def __init__(self, omap: OffsetMap, *, dirty_from: int) -> None:
        self.omap = omap
        self.dirty_from = dirty_from
        self.limit = max(1, omap.capacity // 2)
        self.open: dict[int, _Open] = {}  # producer id -> its open transaction
        self.aborted = AbortedTxns()
        self.stopped: int | None = None
        self.unresolved = 0  # transactions still open at the end (``stable_end``)
        # until the first transactional batch, data batches go into the map as they are
        # read: the map is built up to ``mapped_to`` (full there if ``map_full``), and
        # a log without transactions is read once, as before transactions were followed
        self.eager = True
        self.mapped_to = dirty_from
        self.map_full = False

    def add(self, batch: bytes) -> int | None:
        """Account for one batch. Returns None, or an offset once there is nothing
        more to learn: the map filled there while no transaction was seen yet
        (``map_full``), or a transaction opening there did not fit (``limit``, or the
        map's room), so the stable end is at most that, and none of those opened
        before is still open. Past such a transaction no new one is followed, only the
        open ones to their markers. Raises BatchError for records that do not
        parse."""
        h = BatchHeader.parse(batch)
        if h.next_offset <= self.dirty_from:
            return None
        if self.eager:  # no transaction so far: data batches are mapped at once
            if not h.attributes & TRANSACTIONAL:
                stop = map_batch(self.omap, batch, dirty_from=self.dirty_from)
                if stop is None:
                    self.mapped_to = h.next_offset
                    return None
                self.eager, self.map_full, self.stopped = False, True, stop
                return stop
            self.eager = False
            self.mapped_to = max(self.mapped_to, h.base_offset)
        if not h.attributes & TRANSACTIONAL:
            return self._done()
        pid = h.producer_id
        if h.attributes & CONTROL:
            txn = self.open.pop(pid, None)
            if txn is None:
                return self._done()  # begun before the dirty part, or not followed
            if batch_kind(batch, h) is ControlType.COMMIT or not txn.records:
                self.omap.reserved -= 1
            else:  # its entry now holds the range
                self.aborted.add(pid, txn.first, h.base_offset)
            return self._done()
        txn = self.open.get(pid)
        if txn is None:
            if self.stopped is not None:
                return self._done()
            if self.omap.reserved >= self.limit or self.omap.room() < 1:
                self.stopped = h.base_offset
                return self._done()
            txn = self.open[pid] = _Open(h.base_offset)
            self.omap.reserved += 1
        txn.records = txn.records or h.record_count > 0
        return None

    def _done(self) -> int | None:
        return self.stopped if self.stopped is not None and not self.open else None

    def stable_end(self, end: int) -> int:
        """Where the map may reach: ``end`` (the cleanable ledgers'), or where the scan
        ended, and not past the first offset of an open transaction. Call it once,
        after the last ``add``: it releases the entries open transactions held."""
        stop = end if self.stopped is None else min(end, self.stopped)
        stable = min([stop, *(t.first for t in self.open.values())])
        self.omap.reserved -= len(self.open)
        self.unresolved = len(self.open)
        self.open.clear()
        return stable


@dataclass(frozen=True, slots=True)
class Compacted:
    """One batch after compaction: its bytes (the same object if nothing went), the
    records removed, and the earliest timestamp among the tombstones it keeps (-1:
    none), from which the cleaner knows when a pass is due again."""

    batch: bytes
    removed: int
    oldest_tombstone: int = -1


def compact_batch(batch: bytes, omap: OffsetMap, *, covered: int, now_ms: int,
                  delete_retention_ms: int, aborted: AbortedTxns) -> Compacted:
    """``batch`` without the records compaction removes (module docstring), only
    records below ``covered``: all of a transactional batch in one of the ``aborted``
    transactions; else those superseded by a later offset of the same key in
    ``omap``, and tombstones older than ``delete_retention_ms`` that are their key's
    latest. A transactional batch below ``covered`` and in no aborted transaction is
    one of a committed transaction (the scan resolved every transaction below it).
    Control batches come back as they are. Raises BatchError for records that do not
    parse."""
    h = BatchHeader.parse(batch)
    if h.attributes & CONTROL or not h.record_count or h.base_offset >= covered:
        return Compacted(batch, 0)
    body = _records(batch, h)
    spans = record_spans(body, h.record_count)
    dropped = bool(h.attributes & TRANSACTIONAL) and aborted.holds(h.producer_id,
                                                                  h.base_offset)
    kept = []
    oldest = -1
    for r in spans:
        offset = h.base_offset + r.offset_delta
        if offset >= covered:
            kept.append(r)
            continue
        if dropped:
            continue
        if r.key is None:
            kept.append(r)
            continue
        latest = omap.get(r.key)
        if latest is not None and latest > offset:
            continue
        if r.is_tombstone:
            ts = h.max_timestamp if h.attributes & LOG_APPEND_TIME \
                else h.base_timestamp + r.timestamp_delta
            if ts < now_ms - delete_retention_ms:
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
