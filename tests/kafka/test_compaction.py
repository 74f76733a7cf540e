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
    LedgerView,
    OffsetMap,
    TxnKeys,
    cleanable_prefix,
    compact_batch,
    dirty_ratio,
    first_dirty,
    keyless_records,
    map_batch,
    should_clean,
)
from ledgerd.kafka.compression import Codec, recompress
from ledgerd.kafka.records import HEADER_SIZE, BatchError, BatchHeader, record_spans
from ledgerd.kafka.timestamps import records_of

T0 = 1_700_000_000_000
DAY = 86_400_000
Rec = tuple[bytes | None, bytes | None, int]  # key, value, timestamp delta


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
    got = compact_batch(old, omap, covered=5, now_ms=T0, delete_retention_ms=DAY)
    assert got.removed == 2
    assert [(o, k) for o, k, _, _ in _read(got.batch)] == [(2, b"a")]
    assert compact_batch(new, omap, covered=5, now_ms=T0, delete_retention_ms=DAY).batch \
        is new  # nothing goes: the very same bytes
    # records at or past the covered offset are never touched (b at 1 stays, though
    # the map holds a later b)
    part = compact_batch(old, omap, covered=1, now_ms=T0, delete_retention_ms=DAY)
    assert [(o, k) for o, k, _, _ in _read(part.batch)] == [(1, b"b"), (2, b"a")]


def test_a_tombstone_goes_once_older_than_delete_retention() -> None:
    batch = _batch(0, [(b"a", b"1", 0), (b"a", None, 100)], base_offset=0)
    omap = OffsetMap(10)
    map_batch(omap, batch, dirty_from=0)
    kept = compact_batch(batch, omap, covered=2, now_ms=T0 + 1000, delete_retention_ms=DAY)
    assert [(o, t) for o, _, t, _ in _read(kept.batch)] == [(1, True)]
    assert kept.oldest_tombstone == T0 + 100  # the cleaner's next due time comes from it
    gone = compact_batch(batch, omap, covered=2, now_ms=T0 + 101 + DAY,
                         delete_retention_ms=DAY)
    assert gone.removed == 2 and _read(gone.batch) == []
    # an emptied batch stays, empty, with its offsets and CRC
    h = BatchHeader.parse(gone.batch)
    assert (h.base_offset, h.last_offset_delta, h.record_count) == (0, 1, 0)
    assert google_crc32c.value(gone.batch[21:]) == h.crc


def test_transactional_and_keyless_records_are_left_alone() -> None:
    txn = _batch(0, [(b"a", b"1", 0), (b"a", b"2", 0)], transactional=True, pid=7, epoch=0,
                 seq=0)
    omap = OffsetMap(10)
    assert map_batch(omap, txn, dirty_from=0) is None and len(omap) == 0
    omap.put(b"a", 99)
    assert compact_batch(txn, omap, covered=100, now_ms=T0, delete_retention_ms=0).batch \
        is txn
    keyless = _batch(0, [(None, b"1", 0), (None, None, 0)])
    assert compact_batch(keyless, omap, covered=100, now_ms=T0,
                         delete_retention_ms=0).removed == 0


def test_a_tombstone_over_a_transactional_records_key_stays() -> None:
    """Transactional records are never compacted: a tombstone for a key one of them
    holds below it stays, or that record would be the key's value again."""
    v1 = _batch(0, [(b"k", b"v1", 0), (b"j", b"j1", 0)], base_offset=0)
    v2 = _batch(0, [(b"k", b"v2", 0)], base_offset=2, transactional=True, pid=7, epoch=0,
                seq=0)
    dead = _batch(0, [(b"k", None, 0), (b"j", None, 0)], base_offset=3)
    omap = OffsetMap(10)
    for b in (v1, v2, dead):
        map_batch(omap, b, dirty_from=0)
    late = T0 + 2 * DAY
    keys = TxnKeys()
    out = [compact_batch(b, omap, covered=5, now_ms=late, delete_retention_ms=DAY,
                         txn_keys=keys) for b in (v1, v2, dead)]
    assert _read(out[0].batch) == []  # v1 and j1 superseded by the tombstones
    assert out[1].batch is v2
    # k's tombstone stays (v2 is below it), j's goes
    assert [(o, k, t) for o, k, t, _ in _read(out[2].batch)] == [(3, b"k", True)]
    # without the transactional record met first, both tombstones go
    alone = compact_batch(dead, omap, covered=5, now_ms=late, delete_retention_ms=DAY,
                          txn_keys=TxnKeys())
    assert _read(alone.batch) == []
    # past TXN_KEYS_MAX keys, every tombstone stays
    assert TxnKeys(overflow=True).guards(b"anything")


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
                        delete_retention_ms=1000)
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
                             delete_retention_ms=DAY).batch for b in log]
        assert _consumed(log) == before
        through = covered
        if covered == offset:
            break
    assert through == offset
    kept = sum(BatchHeader.parse(b).record_count for b in log)
    assert kept == len(before)  # one record per key: every superseded one went


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
