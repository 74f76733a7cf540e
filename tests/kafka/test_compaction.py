"""Log compaction's decisions and batch rewrite, without sockets
(``ledgerd/kafka/compaction.py``): which ledgers are cleanable and when a pass runs,
the bounded offset map, which records a pass removes, and that a rewritten batch
parses back record for record at its original offsets with a valid CRC."""

from __future__ import annotations

import os
import random

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka.compaction import (
    AbortedTxns,
    LedgerView,
    OffsetMap,
    TxnScan,
    cleanable_prefix,
    compact_batch,
    dirty_ratio,
    first_dirty,
    keyless_records,
    map_batch,
    should_clean,
)
from ledgerd.kafka.compression import Codec, recompress
from ledgerd.kafka.control_records import TxnIndex, batch_kind, control_batch
from ledgerd.kafka.records import (
    HEADER_SIZE,
    BatchError,
    BatchHeader,
    batch_with_records,
    batches_below,
    empty_run_end,
    record_spans,
)
from ledgerd.kafka.timestamps import records_of

T0 = 1_700_000_000_000
DAY = 86_400_000
Rec = tuple[bytes | None, bytes | None, int]  # key, value, timestamp delta
NONE = AbortedTxns()  # no aborted transaction


def _batch(codec: int, records: list[Rec], *, base_offset: int = 0,
           transactional: bool = False, pid: int = -1, epoch: int = -1,
           seq: int = -1) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0 if codec == 2 else codec,
                                  is_transactional=transactional, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq,
                                  batch_size=1 << 26)
    for i, (key, value, delta) in enumerate(records):
        b.append(i, timestamp=T0 + delta, key=key, value=value, headers=[("h", b"x")])
    raw = bytes(b.build())
    if codec == 2:  # kafka-python needs python-snappy to write snappy; ours writes it
        raw = recompress(raw, Codec.SNAPPY)
    return base_offset.to_bytes(8, "big") + raw[8:]


def _read(batch: bytes) -> list[tuple[int, bytes | None, bool, int]]:
    """(offset, key, is tombstone, timestamp) of each record, by our reader."""
    h = BatchHeader.parse(batch)
    body = records_of(h, memoryview(batch)[HEADER_SIZE:h.length])
    return [(h.base_offset + r.offset_delta, r.key, r.is_tombstone,
             h.base_timestamp + r.timestamp_delta)
            for r in record_spans(body, h.record_count)]


def _view(lid: int, first: int, nxt: int, *, size: int = 100, ts: int = T0,
          through: int = -1) -> LedgerView:
    return LedgerView(ledger_id=lid, first_offset=first, next_offset=nxt, size=size,
                      max_timestamp=ts, clean_through=through)


# -- which ledgers, and when ----------------------------------------------------------

def test_only_ledgers_older_than_the_compaction_lag_are_cleanable_from_the_front() -> None:
    views = [_view(1, 0, 10, ts=T0), _view(2, 10, 20, ts=T0 + 5000),
             _view(3, 20, 30, ts=T0)]
    assert cleanable_prefix(views, now_ms=T0 + 10_000, min_compaction_lag_ms=0) == 3
    # the second is too young: the third, older, waits behind it
    assert cleanable_prefix(views, now_ms=T0 + 10_000, min_compaction_lag_ms=6000) == 1
    assert cleanable_prefix(views, now_ms=T0, min_compaction_lag_ms=1) == 0


def test_the_dirty_part_starts_where_the_last_pass_covered() -> None:
    views = [_view(1, 5, 10), _view(2, 10, 20, through=15), _view(3, 20, 30)]
    assert first_dirty([]) == 0
    assert first_dirty(views[:1]) == 5  # no pass yet: the log's first offset
    assert first_dirty(views) == 15
    assert first_dirty(views, remembered=25) == 25
    # ledger 2 is half dirty (15..20 of 10..20), ledger 3 wholly
    assert dirty_ratio(views, 15) == pytest.approx((50 + 100) / 300)
    assert dirty_ratio(views, 30) == 0.0


def test_a_pass_runs_on_the_dirty_ratio_or_when_a_tombstone_is_due() -> None:
    views = [_view(1, 0, 10, ts=T0), _view(2, 10, 20, ts=T0)]
    now = T0 + 1000
    kw = {"delete_retention_ms": DAY, "now_ms": now}
    assert not should_clean([], dirty_from=0, min_dirty_ratio=0.5, tombstones_due_ms=None,
                            **kw)
    # after a restart nothing is known: one pass runs
    assert should_clean(views, dirty_from=20, min_dirty_ratio=0.5, tombstones_due_ms=None,
                        **kw)
    # half dirty: runs at 0.5, not at 0.6
    assert should_clean(views, dirty_from=10, min_dirty_ratio=0.5, tombstones_due_ms=now + 1,
                        **kw)
    assert not should_clean(views, dirty_from=10, min_dirty_ratio=0.6,
                            tombstones_due_ms=now + 1, **kw)
    # nothing dirty, no tombstone due
    assert not should_clean(views, dirty_from=20, min_dirty_ratio=0.0,
                            tombstones_due_ms=now + 1, **kw)
    # a kept tombstone is due
    assert should_clean(views, dirty_from=20, min_dirty_ratio=0.6, tombstones_due_ms=now,
                        **kw)
    # a dirty ledger older than delete.retention.ms may hold tombstones that are due
    assert should_clean(views, dirty_from=10, min_dirty_ratio=0.6, tombstones_due_ms=now + 1,
                        delete_retention_ms=500, now_ms=now)


def test_the_offset_map_holds_at_most_its_capacity_of_keys() -> None:
    omap = OffsetMap(2)
    assert omap.put(b"a", 1) and omap.put(b"b", 2)
    assert omap.put(b"a", 3)  # a known key moves on
    assert not omap.put(b"c", 4)  # a new one does not fit
    assert (omap.get(b"a"), omap.get(b"b"), omap.get(b"c"), len(omap)) == (3, 2, None, 2)
    with pytest.raises(ValueError):
        OffsetMap(0)


def test_a_full_map_says_where_its_coverage_ends() -> None:
    batch = _batch(0, [(b"a", b"1", 0), (b"b", b"2", 0), (b"c", b"3", 0)], base_offset=10)
    omap = OffsetMap(2)
    assert map_batch(omap, batch, dirty_from=0) == 12
    assert map_batch(OffsetMap(2), batch, dirty_from=11) is None  # only b and c
    assert map_batch(OffsetMap(9), batch, dirty_from=13) is None


# -- which records go ------------------------------------------------------------------

def test_superseded_records_go_and_the_latest_of_each_key_stays() -> None:
    old = _batch(0, [(b"a", b"1", 0), (b"b", b"1", 0), (b"a", b"2", 0)], base_offset=0)
    new = _batch(0, [(b"b", b"2", 0), (b"c", b"1", 0)], base_offset=3)
    omap = OffsetMap(10)
    for b in (old, new):
        assert map_batch(omap, b, dirty_from=0) is None
    got = compact_batch(old, omap, covered=5, now_ms=T0, delete_retention_ms=DAY,
                        aborted=NONE)
    assert got.removed == 2
    assert [(o, k) for o, k, _, _ in _read(got.batch)] == [(2, b"a")]
    assert compact_batch(new, omap, covered=5, now_ms=T0, delete_retention_ms=DAY,
                         aborted=NONE).batch is new  # nothing goes: the very same bytes
    # records at or past the covered offset are never touched (b at 1 stays, though
    # the map holds a later b)
    part = compact_batch(old, omap, covered=1, now_ms=T0, delete_retention_ms=DAY,
                         aborted=NONE)
    assert [(o, k) for o, k, _, _ in _read(part.batch)] == [(1, b"b"), (2, b"a")]


def test_a_tombstone_goes_once_older_than_delete_retention() -> None:
    batch = _batch(0, [(b"a", b"1", 0), (b"a", None, 100)], base_offset=0)
    omap = OffsetMap(10)
    map_batch(omap, batch, dirty_from=0)
    kept = compact_batch(batch, omap, covered=2, now_ms=T0 + 1000, delete_retention_ms=DAY,
                         aborted=NONE)
    assert [(o, t) for o, _, t, _ in _read(kept.batch)] == [(1, True)]
    assert kept.oldest_tombstone == T0 + 100  # the cleaner's next due time comes from it
    gone = compact_batch(batch, omap, covered=2, now_ms=T0 + 101 + DAY,
                         delete_retention_ms=DAY, aborted=NONE)
    assert gone.removed == 2 and _read(gone.batch) == []
    # an emptied batch stays, empty, with its offsets and CRC
    h = BatchHeader.parse(gone.batch)
    assert (h.base_offset, h.last_offset_delta, h.record_count) == (0, 1, 0)
    assert google_crc32c.value(gone.batch[21:]) == h.crc


def test_keyless_records_stay_and_transactional_ones_are_mapped_only_if_committed() -> None:
    txn = _batch(0, [(b"a", b"1", 0), (b"a", b"2", 0)], transactional=True, pid=7, epoch=0,
                 seq=0)
    omap = OffsetMap(10)
    assert map_batch(omap, txn, dirty_from=0) is None and len(omap) == 0  # not known
    aborted = AbortedTxns()
    aborted.add(7, 0, 2)
    assert map_batch(omap, txn, dirty_from=0, aborted=aborted) is None and len(omap) == 0
    assert map_batch(omap, txn, dirty_from=0, aborted=NONE) is None
    assert omap.get(b"a") == 1
    omap.put(b"a", 99)
    keyless = _batch(0, [(None, b"1", 0), (None, None, 0)])
    assert compact_batch(keyless, omap, covered=100, now_ms=T0, delete_retention_ms=0,
                         aborted=NONE).removed == 0


def test_keyless_records_are_named_by_their_index() -> None:
    a = _batch(0, [(b"k", b"v", 0), (None, b"v", 0), (b"k", b"v", 0)])
    b = _batch(1, [(None, b"v", 0)])
    batches = [(BatchHeader.parse(x), x) for x in (a, b)]
    assert keyless_records(batches) == [1, 3]
    assert keyless_records(batches[:1]) == [1]
    bad = a[:HEADER_SIZE] + b"\x7f" * 8
    with pytest.raises(BatchError):
        keyless_records([(BatchHeader.parse(bad), bad)])


# -- the rewrite, record for record ----------------------------------------------------

# values around multiples of 4096 (block and page sizes of the codecs and the bookies)
_size = st.one_of(st.integers(0, 64), st.sampled_from(
    [n * 4096 + d for n in (1, 2, 4) for d in (-13, -1, 0, 1, 7)]))
_rec = st.tuples(st.sampled_from([b"a", b"b", b"c", b"", b"k" * 300]),
                 st.one_of(st.none(), _size), st.integers(0, 10_000))


@settings(max_examples=200, deadline=None)
@given(records=st.lists(_rec, min_size=1, max_size=40), codec=st.sampled_from(list(Codec)),
       base=st.integers(0, 1 << 40), later=st.sets(st.sampled_from([b"a", b"b", b"c"])),
       covered_at=st.integers(0, 45), pid=st.integers(-1, 1 << 40))
def test_a_rewritten_batch_parses_back_record_for_record(
        records: list[tuple[bytes, int | None, int]], codec: Codec, base: int,
        later: set[bytes], covered_at: int, pid: int) -> None:
    recs: list[Rec] = [(k, None if n is None else bytes([i % 251]) * n, d)
                       for i, (k, n, d) in enumerate(records)]
    raw = _batch(codec, recs, base_offset=base, pid=pid, epoch=0 if pid >= 0 else -1,
                 seq=0 if pid >= 0 else -1)
    omap = OffsetMap(100)
    map_batch(omap, raw, dirty_from=0)
    for k in later:  # superseded by a later batch too
        omap.put(k, base + 10_000)
    covered = base + covered_at
    out = compact_batch(raw, omap, covered=covered, now_ms=T0 + 5000,
                        delete_retention_ms=1000, aborted=NONE)
    # the reference, by brute force over the records: below ``covered``, a record
    # another of its key follows (all are mapped) goes, and so does an old tombstone
    last: dict[bytes, int] = {}
    for i, (k, _, _) in enumerate(recs):
        last[k] = i
    want = []
    for i, (k, v, d) in enumerate(recs):
        o = base + i
        if o < covered and (k in later or last.get(k) != i):
            continue
        if o < covered and v is None and T0 + d < T0 + 5000 - 1000:
            continue
        want.append((o, k, v, T0 + d))
    assert out.removed == len(recs) - len(want)
    new = out.batch
    old_h, h = BatchHeader.parse(raw), BatchHeader.parse(new)
    assert h.length == len(new) and google_crc32c.value(new[21:]) == h.crc
    assert (h.base_offset, h.last_offset_delta, h.attributes, h.base_timestamp,
            h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence) == (
        old_h.base_offset, old_h.last_offset_delta, old_h.attributes, old_h.base_timestamp,
        old_h.max_timestamp, old_h.producer_id, old_h.producer_epoch, old_h.base_sequence)
    assert new[12:16] == raw[12:16]
    assert h.record_count == len(want)
    assert [(o, k, t, ts) for o, k, t, ts in _read(new)] == \
        [(o, k, v is None, ts) for o, k, v, ts in want]
    if codec is not Codec.SNAPPY:  # and a client reads it, values included
        from kafka.record.default_records import DefaultRecordBatch

        batch = DefaultRecordBatch(new)
        assert batch.validate_crc()
        assert [(r.offset, r.key, r.value, r.timestamp) for r in batch] == want


def _consumed(log: list[bytes]) -> dict[bytes, tuple[int, bytes | None]]:
    """What a consumer reading the log from the start ends with: key -> (offset, value
    is None), the last record of each key."""
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for b in log:
        h = BatchHeader.parse(b)
        body = records_of(h, memoryview(b)[HEADER_SIZE:h.length])
        for r in record_spans(body, h.record_count):
            assert r.key is not None
            seen[r.key] = (h.base_offset + r.offset_delta,
                           None if r.is_tombstone else bytes(body[r.start:r.end]))
    return seen


def test_repeated_passes_with_a_small_map_keep_every_keys_latest_record() -> None:
    """A log of batches compacted pass after pass as the cleaner does (a map of 3 keys:
    each pass covers a prefix), with tombstones kept (no retention): a consumer from
    the start ends with exactly what it read before compaction, at the same offsets,
    and the log holds no superseded record at the end."""
    seed = int(os.environ.get("COMPACTION_SEED", random.randrange(1 << 30)))
    print(f"COMPACTION_SEED={seed}")
    rng = random.Random(seed)
    log: list[bytes] = []
    offset = 0
    for _ in range(30):
        n = rng.randint(1, 6)
        recs: list[Rec] = [(bytes([97 + rng.randrange(8)]),
                            None if rng.random() < 0.15 else rng.randbytes(rng.randrange(50)),
                            0) for _ in range(n)]
        log.append(_batch(rng.choice([0, 1, 3, 4]), recs, base_offset=offset))
        offset += n
    before = _consumed(log)
    through = -1
    for _ in range(40):
        dirty_from = max(0, through)
        omap = OffsetMap(3)
        covered = offset
        for b in log:
            stop = map_batch(omap, b, dirty_from=dirty_from)
            if stop is not None:
                covered = stop
                break
        log = [compact_batch(b, omap, covered=covered, now_ms=T0,
                             delete_retention_ms=DAY, aborted=NONE).batch for b in log]
        assert _consumed(log) == before
        through = covered
        if covered == offset:
            break
    assert through == offset
    kept = sum(BatchHeader.parse(b).record_count for b in log)
    assert kept == len(before)  # one record per key: every superseded one went


# -- transactions ---------------------------------------------------------------------

def _txn(pid: int, offset: int, records: list[Rec]) -> bytes:
    return _batch(0, records, base_offset=offset, transactional=True, pid=pid, epoch=0,
                  seq=0)


def _marker(pid: int, offset: int, *, commit: bool) -> bytes:
    b = control_batch(producer_id=pid, producer_epoch=0, commit=commit, timestamp_ms=T0)
    return offset.to_bytes(8, "big") + b[8:]  # the CRC starts after the base offset


def _end(log: list[bytes]) -> int:
    return BatchHeader.parse(log[-1]).next_offset if log else 0


def _pass(log: list[bytes], capacity: int, dirty_from: int, *, cleanable: int | None = None,
          now_ms: int = T0, retention: int = DAY) -> tuple[list[bytes], int]:
    """One pass as the cleaner makes it over the first ``cleanable`` batches of ``log``
    (all: None): the transactions, the map below their stable end, the rewrite. The
    new log and the pass's covered offset."""
    part = log if cleanable is None else log[:cleanable]
    omap = OffsetMap(capacity)
    txns = TxnScan(omap, dirty_from=dirty_from)
    for b in part:
        if txns.add(b) is not None:
            break
    stable = txns.stable_end(_end(part))
    covered = stable
    for b in part:
        if txns.map_full or BatchHeader.parse(b).base_offset >= stable:
            break
        stop = map_batch(omap, b, dirty_from=txns.mapped_to, aborted=txns.aborted)
        if stop is not None:
            covered = stop
            break
    assert all(o < covered for o in omap.latest.values())
    new = [compact_batch(b, omap, covered=covered, now_ms=now_ms,
                         delete_retention_ms=retention, aborted=txns.aborted).batch
           for b in part]
    return new + log[len(part):], covered


def _index(log: list[bytes]) -> TxnIndex:
    index = TxnIndex()
    for b in log:
        h = BatchHeader.parse(b)
        index.observe(h, batch_kind(b, h))
    return index


Seen = dict[bytes, tuple[int, bytes]]  # key -> (offset, the record's bytes)


def _views(log: list[bytes]) -> tuple[Seen, Seen, TxnIndex]:
    """What a consumer from the start ends with, key -> (offset, record bytes) of its
    last record: read_committed (below the LSO, aborted transactions dropped, as the
    fetch's AbortedTransactions tell it) and read_uncommitted; and the index the
    gateway serves both from."""
    index = _index(log)
    lso = index.last_stable_offset(_end(log))
    committed: Seen = {}
    uncommitted: Seen = {}
    for b in log:
        h = BatchHeader.parse(b)
        if h.attributes & 0x20:
            continue
        dropped = h.attributes & 0x10 and any(
            pid == h.producer_id and first <= h.base_offset <= last
            for pid, first, last in index.aborted)
        body = records_of(h, memoryview(b)[HEADER_SIZE:h.length])
        for r in record_spans(body, h.record_count):
            assert r.key is not None
            seen = (h.base_offset + r.offset_delta, bytes(body[r.start:r.end]))
            uncommitted[r.key] = seen
            if h.base_offset < lso and not dropped:
                committed[r.key] = seen
    return committed, uncommitted, index


def _records(log: list[bytes]) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, is tombstone) of the records of the log's data and transactional
    batches (not the markers)."""
    return [(o, k, t) for b in log if not BatchHeader.parse(b).attributes & 0x20
            for o, k, t, _ in _read(b)]


def test_committed_transactions_are_compacted_and_aborted_ones_emptied() -> None:
    log = [_batch(0, [(b"a", b"1", 0)], base_offset=0),
           _txn(7, 1, [(b"a", b"2", 0), (b"b", b"1", 0)]), _marker(7, 3, commit=True),
           _txn(8, 4, [(b"a", b"3", 0), (b"c", b"1", 0)]), _marker(8, 6, commit=False),
           _batch(0, [(b"b", b"2", 0)], base_offset=7)]
    committed, uncommitted, index = _views(log)
    new, covered = _pass(log, 10, 0)
    assert covered == 8
    # a at 0 superseded by the committed a at 1, b at 2 by b at 7; the aborted
    # transaction's records gone; its markers as they were
    assert _records(new) == [(1, b"a", False), (7, b"b", False)]
    assert new[2] is log[2] and new[4] is log[4]
    emptied, was = BatchHeader.parse(new[3]), BatchHeader.parse(log[3])
    assert emptied.record_count == 0
    assert (emptied.base_offset, emptied.last_offset_delta, emptied.attributes,
            emptied.producer_id, emptied.producer_epoch, emptied.base_sequence) == (
        was.base_offset, was.last_offset_delta, was.attributes, was.producer_id,
        was.producer_epoch, was.base_sequence)
    assert google_crc32c.value(new[3][21:]) == emptied.crc
    after_c, after_u, after_index = _views(new)
    assert after_c == committed == {b"a": committed[b"a"], b"b": committed[b"b"]}
    assert after_u == committed  # read_uncommitted: no aborted record left
    assert uncommitted[b"c"][0] == 5 and uncommitted[b"a"][0] == 4
    assert (after_index.aborted, after_index.ongoing) == (index.aborted, index.ongoing)
    # a second pass over the compacted log changes nothing
    again, _ = _pass(new, 10, 0)
    assert all(x is y for x, y in zip(again, new, strict=True))


def test_an_unresolved_transaction_ends_the_range_below_its_first_offset() -> None:
    log = [_batch(0, [(b"a", b"1", 0)], base_offset=0),
           _batch(0, [(b"a", b"2", 0)], base_offset=1),
           _txn(7, 2, [(b"a", b"3", 0)]),
           _batch(0, [(b"a", b"4", 0), (b"b", b"1", 0)], base_offset=3),
           _marker(7, 5, commit=True)]
    # ongoing (its marker in the active ledger, not cleanable): nothing at or past 2
    # is mapped or touched, and a read_committed consumer (LSO 2) still reads a at 1
    committed, _, _ = _views(log[:4])
    assert committed[b"a"][0] == 1
    new, covered = _pass(log, 10, 0, cleanable=4)
    assert covered == 2
    assert _records(new[:2]) == [(1, b"a", False)]
    assert all(x is y for x, y in zip(new[2:], log[2:], strict=True))
    assert _views(new[:4])[0] == committed
    # once its marker is cleanable, the next pass goes on from 2
    committed, _, _ = _views(log)
    new, covered = _pass(new, 10, 2)
    assert covered == 6
    assert _records(new) == [(3, b"a", False), (4, b"b", False)]
    assert _views(new)[0] == committed


def test_interleaved_producers_each_resolved_by_their_own_marker() -> None:
    log = [_txn(7, 0, [(b"a", b"1", 0)]),
           _batch(0, [(b"b", b"1", 0)], base_offset=1),
           _txn(8, 2, [(b"a", b"2", 0), (b"b", b"2", 0)]),
           _txn(7, 4, [(b"c", b"1", 0)]),
           _marker(7, 5, commit=True),
           _batch(0, [(b"a", b"3", 0)], base_offset=6),
           _marker(8, 7, commit=False),
           _txn(9, 8, [(b"d", b"1", 0)]),  # never resolved
           _batch(0, [(b"a", b"4", 0)], base_offset=9)]
    committed, uncommitted, index = _views(log)
    assert index.last_stable_offset(10) == 8
    new, covered = _pass(log, 10, 0)
    assert covered == 8
    # a at 6 stays although a at 9 follows: 9 is past the LSO, a read_committed
    # consumer would find no a at all meanwhile
    assert _records(new) == [(1, b"b", False), (4, b"c", False), (6, b"a", False),
                             (8, b"d", False), (9, b"a", False)]
    assert BatchHeader.parse(new[2]).record_count == 0  # pid 8's, aborted
    after_c, after_u, after_index = _views(new)
    assert after_c == committed
    assert after_u == {**committed, b"a": uncommitted[b"a"], b"d": uncommitted[b"d"]}
    assert (after_index.aborted, after_index.ongoing) == (index.aborted, index.ongoing)


@pytest.mark.parametrize("commit", [True, False])
def test_a_transaction_across_ledgers_and_passes(commit: bool) -> None:
    first = [_batch(0, [(b"a", b"1", 0)], base_offset=0),
             _batch(0, [(b"a", b"2", 0)], base_offset=1),
             _txn(7, 2, [(b"a", b"3", 0), (b"b", b"1", 0)])]
    second = [_txn(7, 4, [(b"c", b"1", 0)]), _marker(7, 5, commit=commit),
              _batch(0, [(b"b", b"2", 0)], base_offset=6)]
    log = first + second
    committed, _, index = _views(log)
    # the first ledger alone is cleanable: the transaction is open there
    log, covered = _pass(log, 10, 0, cleanable=3)
    assert covered == 2 and _records(log[:2]) == [(1, b"a", False)]
    # both: the clean part (a at 1) compacted by what the dirty part holds
    log, covered = _pass(log, 10, covered)
    assert covered == 7
    if commit:
        assert _records(log) == [(2, b"a", False), (4, b"c", False), (6, b"b", False)]
    else:
        assert _records(log) == [(1, b"a", False), (6, b"b", False)]
    after_c, after_u, after_index = _views(log)
    assert after_c == after_u == committed
    assert after_index.aborted == index.aborted


def test_a_tombstone_goes_only_when_no_older_value_can_remain() -> None:
    late, tomb = T0 + 2 * DAY, (b"k", None, 0)
    kw = {"now_ms": late, "retention": DAY}
    # over a transaction still open: past covered, it stays (it may commit)
    log = [_txn(7, 0, [(b"k", b"v1", 0)]), _batch(0, [tomb], base_offset=1)]
    new, covered = _pass(log, 10, 0, **kw)
    assert covered == 0 and all(x is y for x, y in zip(new, log, strict=True))
    # over a committed value: both go
    log = [_txn(7, 0, [(b"k", b"v1", 0)]), _marker(7, 1, commit=True),
           _batch(0, [tomb], base_offset=2)]
    new, covered = _pass(log, 10, 0, **kw)
    assert covered == 3 and _records(new) == []
    # over an aborted value and an older one: all go, nothing comes back
    log = [_batch(0, [(b"k", b"v0", 0)], base_offset=0), _txn(8, 1, [(b"k", b"v1", 0)]),
           _marker(8, 2, commit=False), _batch(0, [tomb], base_offset=3)]
    new, covered = _pass(log, 10, 0, **kw)
    assert covered == 4 and _records(new) == []
    # a committed value left in the clean part by a pass, a tombstone in a later dirty
    # part: the value is superseded there, and the tombstone goes with nothing under it
    log = [_batch(0, [(b"k", b"v0", 0)], base_offset=0), _txn(7, 1, [(b"k", b"v1", 0)]),
           _marker(7, 2, commit=True)]
    log, covered = _pass(log, 10, 0, **kw)
    assert covered == 3 and _records(log) == [(1, b"k", False)]
    log.append(_batch(0, [tomb], base_offset=3))
    kept, _ = _pass(log, 10, covered)  # not due yet: it stays, the value goes
    assert _records(kept) == [(3, b"k", True)]
    log, covered = _pass(log, 10, covered, **kw)
    assert covered == 4 and _records(log) == []
    assert _views(log)[:2] == ({}, {})


def test_transactions_tracked_count_against_the_maps_capacity() -> None:
    aborts = [b for pid, at in ((7, 0), (8, 2), (9, 4))
              for b in (_txn(pid, at, [(b"x%d" % pid, b"v", 0)]),
                        _marker(pid, at + 1, commit=False))]
    data = _batch(0, [(b"a", b"1", 0), (b"b", b"1", 0), (b"c", b"1", 0)], base_offset=6)
    log = [*aborts, data]
    # 4 entries: at most 2 for transactions, so pid 9's does not fit; the scan ends
    # at its first offset, and the next pass goes on from there
    omap = OffsetMap(4)
    txns = TxnScan(omap, dirty_from=0)
    assert [txns.add(b) for b in log[:5]] == [None, None, None, None, 4]
    assert txns.stable_end(7) == 4 and omap.reserved == 2 and omap.room() == 2
    new, covered = _pass(log, 4, 0)
    assert covered == 4
    assert [BatchHeader.parse(b).record_count for b in new] == [0, 1, 0, 1, 1, 1, 3]
    # with 3 entries, pid 9's range takes 1, a and b the rest: the map is full at c
    new, covered = _pass(new, 3, 4)
    assert covered == 8
    assert [BatchHeader.parse(b).record_count for b in new] == [0, 1, 0, 1, 0, 1, 3]
    assert _pass(new, 3, 8)[1] == 9
    # an open transaction holds one entry until its marker: then its range does, or
    # (committed, or without a record) none
    omap = OffsetMap(4)
    txns = TxnScan(omap, dirty_from=0)
    txns.add(_txn(7, 0, [(b"a", b"1", 0)]))
    txns.add(_txn(8, 1, []))
    assert omap.reserved == 2
    txns.add(_marker(7, 2, commit=True))
    txns.add(_marker(8, 3, commit=False))
    assert omap.reserved == 0 and len(txns.aborted) == 0
    txns.add(_txn(9, 4, [(b"a", b"1", 0)]))
    assert txns.stable_end(100) == 4 and omap.reserved == 0 and txns.unresolved == 1


def test_the_scan_maps_data_batches_until_the_first_transactional_one() -> None:
    """A log without transactions is read once per pass (as before transactions were
    followed): the scan maps it as it reads; from the first transactional batch on the
    map is built by a second read, below the stable end."""
    data = [_batch(0, [(b"a", b"1", 0), (b"b", b"1", 0)], base_offset=0),
            _batch(0, [(b"a", b"2", 0)], base_offset=2)]
    omap = OffsetMap(10)
    txns = TxnScan(omap, dirty_from=1)  # b at 1 is dirty, a at 0 is not
    assert [txns.add(b) for b in data] == [None, None]
    assert (txns.mapped_to, txns.map_full, omap.get(b"a"), omap.get(b"b")) == (3, False, 2, 1)
    assert txns.stable_end(3) == 3
    log = [*data, _txn(7, 3, [(b"c", b"1", 0)]), _batch(0, [(b"d", b"1", 0)], base_offset=4),
           _marker(7, 5, commit=True)]
    omap = OffsetMap(10)
    txns = TxnScan(omap, dirty_from=0)
    assert all(txns.add(b) is None for b in log)
    assert txns.mapped_to == 3 and len(omap) == 2  # c and d: in the second read
    assert _pass(log, 10, 0)[1] == 6
    # full while mapping as it reads: the scan ends there, the pass covers up to it
    omap = OffsetMap(1)
    txns = TxnScan(omap, dirty_from=0)
    assert txns.add(data[0]) == 1 and txns.map_full and txns.add(log[2]) == 1
    assert txns.stable_end(6) == 1
    new, covered = _pass(log, 1, 0)
    assert covered == 1 and all(x is y for x, y in zip(new, log, strict=True))

def test_the_map_keeps_the_larger_offset_whatever_the_order() -> None:
    omap = OffsetMap(2)
    assert omap.put(b"a", 5) and omap.put(b"a", 3)
    assert omap.get(b"a") == 5
    omap.reserved = 1
    assert not omap.put(b"b", 1) and omap.put(b"a", 9) and omap.get(b"a") == 9


def _transactional_log(rng: random.Random) -> list[bytes]:
    log: list[bytes] = []
    offset = 0
    open_: set[int] = set()
    for _ in range(60):
        pid = rng.choice([-1, -1, 7, 8, 9])
        if pid in open_ and rng.random() < 0.3:
            log.append(_marker(pid, offset, commit=rng.random() < 0.6))
            open_.discard(pid)
            offset += 1
            continue
        n = rng.randint(1, 4)
        recs: list[Rec] = [(bytes([97 + rng.randrange(6)]),
                            None if rng.random() < 0.15 else rng.randbytes(rng.randrange(20)),
                            rng.randrange(1000)) for _ in range(n)]
        if pid < 0:
            log.append(_batch(rng.choice([0, 1, 3, 4]), recs, base_offset=offset))
        else:
            open_.add(pid)
            log.append(_txn(pid, offset, recs))
        offset += n
    for pid in sorted(open_):  # most end; one may stay open
        if rng.random() < 0.7:
            log.append(_marker(pid, offset, commit=rng.random() < 0.6))
            offset += 1
    return log


@pytest.mark.parametrize("retention", [DAY, 0])
def test_repeated_passes_over_transactions_keep_what_each_consumer_reads(
        retention: int) -> None:
    """Random logs of data and transactional batches of three producers (commits,
    aborts, a transaction left open), compacted pass after pass with a small map and
    a random cleanable prefix then all of it: after every pass a read_committed
    consumer ends with exactly what it did before (tombstones due may go: their key
    is then absent), a read_uncommitted one holds each of those records, the LSO and
    aborted transactions are the same; at the end nothing below covered is aborted or
    superseded."""
    seed = int(os.environ.get("COMPACTION_SEED", random.randrange(1 << 30)))
    print(f"COMPACTION_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(20):
        log = _transactional_log(rng)
        committed, _, index = _views(log)
        live = {k: v for k, v in committed.items()
                if retention == DAY or v[1] != _tombstone_of(log, v[0])}
        through = 0
        cleanable = rng.randrange(len(log) // 2, len(log))
        for i in range(40):
            log, covered = _pass(log, rng.randint(4, 8), through,
                                 cleanable=cleanable if i < 3 else None,
                                 now_ms=T0 + 2000, retention=retention)
            after_c, after_u, after_index = _views(log)
            if retention == DAY:
                assert after_c == committed
            else:
                assert {k: v for k, v in after_c.items() if k in live} == live
                assert set(after_c) - set(live) <= set(committed)
                assert all(after_c[k] == committed[k] for k in set(after_c) - set(live))
            assert all(after_u.get(k) is not None and _holds(log, v) for k, v in live.items())
            assert (after_index.aborted, after_index.ongoing) == (index.aborted,
                                                                  index.ongoing)
            if covered == through and i >= 3:
                break
            through = covered
        # the end: below covered no aborted record, one record per key at most
        below = [(o, k) for o, k, _ in _records(log) if o < covered]
        aborted = [(pid, first, last) for pid, first, last in index.aborted]
        for b in log:
            h = BatchHeader.parse(b)
            if h.base_offset < covered and h.attributes & 0x30 == 0x10 and any(
                    p == h.producer_id and f <= h.base_offset <= m for p, f, m in aborted):
                assert h.record_count == 0
        keys = [k for _, k in below]
        assert len(keys) == len(set(keys))
        assert covered == index.last_stable_offset(_end(log)) or covered == _end(log)


def _tombstone_of(log: list[bytes], offset: int) -> bytes | None:
    """The record bytes at ``offset`` if it is a tombstone (else None)."""
    for b in log:
        h = BatchHeader.parse(b)
        if h.base_offset <= offset <= h.last_offset and not h.attributes & 0x20:
            body = records_of(h, memoryview(b)[HEADER_SIZE:h.length])
            for r in record_spans(body, h.record_count):
                if h.base_offset + r.offset_delta == offset and r.is_tombstone:
                    return bytes(body[r.start:r.end])
    return None


def _holds(log: list[bytes], seen: tuple[int, bytes]) -> bool:
    for b in log:
        h = BatchHeader.parse(b)
        if h.base_offset <= seen[0] <= h.last_offset and not h.attributes & 0x20:
            body = records_of(h, memoryview(b)[HEADER_SIZE:h.length])
            return any(h.base_offset + r.offset_delta == seen[0]
                       and bytes(body[r.start:r.end]) == seen[1]
                       for r in record_spans(body, h.record_count))
    return False


def test_a_keyless_refusal_carries_record_errors_from_produce_v8() -> None:
    """KIP-467: Produce v8's partition response names each refused record (librdkafka
    then fails exactly those with INVALID_RECORD, the rest of the batch with
    _INVALID_DIFFERENT_RECORD); v7 has only the error code."""
    from ledgerd.kafka.api import RESPONSES, SUPPORTED, ApiKey, ErrorCode
    from ledgerd.kafka.gateway import _keyless_refusal
    from ledgerd.kafka.schema import Reader, decode, encode

    assert SUPPORTED[ApiKey.PRODUCE][1] >= 8
    refusal = _keyless_refusal("t", 0, [0, 10])
    why = "Compacted topic cannot accept message without key in topic partition t-0."
    entry = {"index": 0, "error_code": refusal.code, "base_offset": -1,
             "error_message": refusal.message, "record_errors": refusal.record_errors}
    body = {"responses": [{"name": "t", "partition_responses": [entry]}]}
    msg = RESPONSES[ApiKey.PRODUCE]
    got = decode(msg, 8, Reader(b"".join(encode(msg, 8, body))))
    part = got["responses"][0]["partition_responses"][0]
    assert part["error_code"] == ErrorCode.INVALID_RECORD and part["error_message"] == why
    assert [(e["batch_index"], e["batch_index_error_message"])
            for e in part["record_errors"]] == [(0, why), (10, why)]
    old = decode(msg, 7, Reader(b"".join(encode(msg, 7, body))))
    assert old["responses"][0]["partition_responses"][0]["error_code"] == 87


def test_a_topic_made_again_under_its_name_is_cleaned_from_a_fresh_state() -> None:
    """The cleaner's memory of a partition belongs to its topic id: a topic deleted and
    made again under the same name starts from nothing, or the new log's offsets below
    the old one's clean_through would count as compacted (and a tombstone there could
    go while an older value of its key stays: the deleted key back)."""
    from ledgerd.kafka.cleaner import CleanerState, state_of

    states: dict[tuple[str, int], tuple[str, CleanerState]] = {}
    old = state_of(states, ("t", 0), "id-1")
    old.clean_through = 100
    assert state_of(states, ("t", 0), "id-1") is old
    fresh = state_of(states, ("t", 0), "id-2")
    assert fresh is not old and fresh.clean_through == -1


@given(st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=8))
def test_a_run_of_emptied_batches_ends_where_its_last_batch_does(
        spec: list[tuple[int, bool]]) -> None:
    """``empty_run_end``: the next offset after the batches if compaction emptied every
    one of them (a fetch reads on from there), else None."""
    data, offset = b"", 0
    for n, emptied in spec:
        batch = _batch(0, [(b"k%d" % i, b"v", i) for i in range(n)], base_offset=offset)
        data += batch_with_records(batch, b"", 0) if emptied else batch
        offset += n
    assert empty_run_end(data) == (offset if all(e for _, e in spec) else None)
    assert empty_run_end(b"") is None


@given(st.lists(st.integers(1, 5), min_size=1, max_size=8), st.integers(0, 45))
def test_batches_below_a_high_watermark_stop_at_the_first_batch_at_or_past_it(
        sizes: list[int], end: int) -> None:
    """``batches_below``: whole batches, in order, up to the first whose base offset
    reaches ``end``."""
    batches, offset = [], 0
    for n in sizes:
        batches.append((offset, _batch(0, [(b"k", b"v", i) for i in range(n)],
                                       base_offset=offset)))
        offset += n
    kept = b"".join(b for base, b in batches if base < end)
    assert batches_below(b"".join(b for _, b in batches), end) == kept
