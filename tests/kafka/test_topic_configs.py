"""Topic configs, topic records, retention decisions and LogAppendTime stamping,
without sockets: which configs are accepted and which refused (naming them), the
incremental operations, the DescribeConfigs entries through the codec at every
version, the record's JSON, which ledgers retention and DeleteRecords drop."""

from __future__ import annotations

import struct
from typing import Any

import google_crc32c
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from ledgerd.kafka.api import REQUESTS, RESPONSES, SUPPORTED, ApiKey, ErrorCode
from ledgerd.kafka.records import BatchHeader, split_batches, with_log_append_time
from ledgerd.kafka.retention import Segment, keep_from, last_holding, ledgers_before, retention_cut
from ledgerd.kafka.schema import Reader, decode, encode
from ledgerd.kafka.topic_configs import (
    ConfigRefusedError,
    OpType,
    TopicPolicy,
    altered,
    checked,
    incrementally_altered,
    topic_entries,
)
from ledgerd.metadata.errors import CorruptMetadataError
from ledgerd.metadata.kafka_topics import TopicRecord

LIMIT = 1 << 20


def _refused(name: str, value: str | None) -> ConfigRefusedError:
    with pytest.raises(ConfigRefusedError) as info:
        checked(name, value, max_batch_bytes=LIMIT)
    return info.value


def test_configs_the_gateway_cannot_honour_are_refused_naming_them() -> None:
    # max.compaction.lag.ms is honoured (the ledger rolls by it: TopicPolicy.rolling)
    # as low as Kafka's 1 ms (rolls by age wait while the list is full: ledgerlog)
    assert checked("max.compaction.lag.ms", "100", max_batch_bytes=LIMIT) == "100"
    assert checked("segment.ms", "500", max_batch_bytes=LIMIT) == "500"
    lag = _refused("max.compaction.lag.ms", "0")
    assert lag.code == ErrorCode.INVALID_CONFIG and "max.compaction.lag.ms" in lag.message
    assert _refused("segment.ms", "0").code == ErrorCode.INVALID_CONFIG
    # file.delete.delay.ms is honoured (Logs.reap); a negative delay is not a delay
    assert checked("file.delete.delay.ms", "10000", max_batch_bytes=LIMIT) == "10000"
    assert _refused("file.delete.delay.ms", "-1").code == ErrorCode.INVALID_CONFIG
    assert _refused("cleanup.policy", "compact,compact").code == ErrorCode.INVALID_CONFIG
    assert _refused("cleanup.policy", "shred").code == ErrorCode.INVALID_CONFIG
    assert _refused("min.cleanable.dirty.ratio", "1.5").code == ErrorCode.INVALID_CONFIG
    assert _refused("min.compaction.lag.ms", "-1").code == ErrorCode.INVALID_CONFIG
    brotli = _refused("compression.type", "brotli")
    assert brotli.code == ErrorCode.INVALID_CONFIG and "compression.type" in brotli.message
    unknown = _refused("dummy.doesntexist", "x")
    assert unknown.code == ErrorCode.INVALID_CONFIG and "dummy.doesntexist" in unknown.message
    assert _refused("retention.ms", "soon").code == ErrorCode.INVALID_CONFIG
    assert _refused("retention.ms", "-2").code == ErrorCode.INVALID_CONFIG
    assert _refused("message.timestamp.type", "Now").code == ErrorCode.INVALID_CONFIG
    too_big = _refused("max.message.bytes", str(LIMIT + 1))
    assert "max_batch_bytes" in too_big.message
    assert _refused("retention.ms", None).code == ErrorCode.INVALID_CONFIG


def test_honoured_configs_are_normalised() -> None:
    assert checked("retention.ms", " 1000 ", max_batch_bytes=LIMIT) == "1000"
    assert checked("cleanup.policy", "delete", max_batch_bytes=LIMIT) == "delete"
    # compaction is honoured (compaction.py, cleaner.py), alone or with retention
    for policy in ("compact", "compact,delete", " delete , compact"):
        assert checked("cleanup.policy", policy, max_batch_bytes=LIMIT) == \
            policy.replace(" ", "")
    assert checked("min.cleanable.dirty.ratio", "0.1", max_batch_bytes=LIMIT) == "0.1"
    assert checked("max.compaction.lag.ms", str(2**63 - 1), max_batch_bytes=LIMIT) == \
        str(2**63 - 1)


def test_topic_policy_reads_compaction_configs() -> None:
    both = TopicPolicy.of({"cleanup.policy": "compact,delete", "retention.ms": "5",
                           "delete.retention.ms": "7", "min.compaction.lag.ms": "9",
                           "min.cleanable.dirty.ratio": "0.25"}, max_batch_bytes=LIMIT)
    assert both.compact and both.delete and both.has_retention
    assert (both.delete_retention_ms, both.min_compaction_lag_ms,
            both.min_cleanable_dirty_ratio) == (7, 9, 0.25)
    # a compact-only topic keeps its records whatever retention.ms says, as Kafka's
    only = TopicPolicy.of({"cleanup.policy": "compact", "retention.ms": "5"},
                          max_batch_bytes=LIMIT)
    assert only.compact and not only.delete and not only.has_retention
    assert not TopicPolicy.of({}, max_batch_bytes=LIMIT).compact
    # every codec Kafka names is honoured: the gateway recompresses (compression.py)
    for codec in ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"):
        assert checked("compression.type", f" {codec}", max_batch_bytes=LIMIT) == codec
    assert checked("message.format.version", "0.10.0.0", max_batch_bytes=LIMIT) == "0.10.0.0"
    assert checked("message.timestamp.type", "LogAppendTime",
                   max_batch_bytes=LIMIT) == "LogAppendTime"
    # Segment sizes are accepted (librdkafka's tests create topics with them), in range.
    assert checked("segment.bytes", "10000000", max_batch_bytes=LIMIT) == "10000000"
    assert checked("segment.ms", "3600000", max_batch_bytes=LIMIT) == "3600000"
    assert checked("segment.ms", "60000", max_batch_bytes=LIMIT) == "60000"
    assert _refused("segment.bytes", "1048575").code == ErrorCode.INVALID_CONFIG
    assert _refused("segment.bytes", "0").code == ErrorCode.INVALID_CONFIG


def test_alter_replaces_the_set_and_refuses_duplicates() -> None:
    assert altered([("retention.ms", "5"), ("retention.bytes", "9")],
                   max_batch_bytes=LIMIT) == {"retention.ms": "5", "retention.bytes": "9"}
    with pytest.raises(ConfigRefusedError) as info:
        altered([("retention.ms", "5"), ("retention.ms", "6")], max_batch_bytes=LIMIT)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    # AlterConfigs as Kafka before 3.2: the last value wins (each one checked)
    assert altered([("retention.ms", "5"), ("retention.ms", "6")], max_batch_bytes=LIMIT,
                   last_wins=True) == {"retention.ms": "6"}
    with pytest.raises(ConfigRefusedError):
        altered([("retention.ms", "x"), ("retention.ms", "6")], max_batch_bytes=LIMIT,
                last_wins=True)
    # an unknown name is what is reported, before a value not honoured
    with pytest.raises(ConfigRefusedError) as info:
        altered([("max.compaction.lag.ms", "5"), ("dummy.doesntexist", "1")],
                max_batch_bytes=LIMIT)
    assert info.value.code == ErrorCode.INVALID_CONFIG


def test_incremental_set_delete_append_subtract() -> None:
    current = {"retention.ms": "5", "retention.bytes": "9"}
    out = incrementally_altered(current, [("retention.ms", OpType.SET, "7"),
                                          ("retention.bytes", OpType.DELETE, None)],
                                max_batch_bytes=LIMIT)
    assert out == {"retention.ms": "7"}
    assert current == {"retention.ms": "5", "retention.bytes": "9"}  # not changed in place
    # APPEND and SUBTRACT on the list config cleanup.policy (its default is delete)
    both = incrementally_altered({}, [("cleanup.policy", OpType.APPEND, "compact")],
                                 max_batch_bytes=LIMIT)
    assert both == {"cleanup.policy": "delete,compact"}
    assert incrementally_altered(both, [("cleanup.policy", OpType.SUBTRACT, "delete")],
                                 max_batch_bytes=LIMIT) == {"cleanup.policy": "compact"}
    with pytest.raises(ConfigRefusedError) as info:
        incrementally_altered({}, [("cleanup.policy", OpType.APPEND, "shred")],
                              max_batch_bytes=LIMIT)
    assert info.value.code == ErrorCode.INVALID_CONFIG
    # SUBTRACT empties the list: back to the default
    assert incrementally_altered({"cleanup.policy": "delete"},
                                 [("cleanup.policy", OpType.SUBTRACT, "delete")],
                                 max_batch_bytes=LIMIT) == {}
    with pytest.raises(ConfigRefusedError) as info:
        incrementally_altered({}, [("retention.ms", OpType.APPEND, "1")],
                              max_batch_bytes=LIMIT)
    assert info.value.code == ErrorCode.INVALID_CONFIG


def test_policy_follows_the_configs() -> None:
    policy = TopicPolicy.of({"retention.bytes": "100", "max.message.bytes": "2000",
                             "message.timestamp.type": "LogAppendTime"},
                            max_batch_bytes=LIMIT)
    assert policy == TopicPolicy(retention_ms=-1, retention_bytes=100,
                                 max_message_bytes=2000, log_append_time=True)
    assert policy.has_retention
    assert not TopicPolicy.of({}, max_batch_bytes=LIMIT).has_retention


@pytest.mark.parametrize("version", range(SUPPORTED[ApiKey.DESCRIBE_CONFIGS][1] + 1))
def test_describe_configs_entries_encode_at_every_version(version: int) -> None:
    entries = topic_entries(version, {"retention.ms": "1000"}, None, max_batch_bytes=LIMIT,
                            include_synonyms=True, include_docs=True)
    names = [e["name"] for e in entries]
    assert "retention.ms" in names and "cleanup.policy" in names
    body = {"results": [{"error_code": 0, "error_message": None, "resource_type": 2,
                         "resource_name": "t", "configs": entries}]}
    msg = RESPONSES[ApiKey.DESCRIBE_CONFIGS]
    got = decode(msg, version, Reader(b"".join(encode(msg, version, body))))
    by_name = {c["name"]: c for c in got["results"][0]["configs"]}
    assert by_name["retention.ms"]["value"] == "1000"
    assert by_name["max.message.bytes"]["value"] == str(LIMIT)
    if version >= 1:
        assert by_name["retention.ms"]["config_source"] == 1  # DYNAMIC_TOPIC_CONFIG
        assert by_name["cleanup.policy"]["config_source"] == 5  # DEFAULT_CONFIG
    else:
        assert by_name["cleanup.policy"]["is_default"]
        assert not by_name["retention.ms"]["is_default"]
    # only the keys asked for (unknown ones left out, as Kafka does)
    only = topic_entries(version, {}, ["retention.bytes", "nope"], max_batch_bytes=LIMIT)
    assert [e["name"] for e in only] == ["retention.bytes"]
    req = REQUESTS[ApiKey.DESCRIBE_CONFIGS]
    raw = b"".join(encode(req, version, {"resources": [
        {"resource_type": 2, "resource_name": "t", "configuration_keys": None}]}))
    assert decode(req, version, Reader(raw))["resources"][0]["configuration_keys"] is None


def test_topic_record_round_trips_and_reads_the_old_form() -> None:
    record = TopicRecord(partitions=3, configs={"retention.ms": "5"}, log_start={1: 40},
                         replicas=((1, 2), (2, 1), (1,)))
    assert TopicRecord.from_json(record.to_json(), "/t") == record
    assert TopicRecord.from_json(b'{"format": 1, "partitions": 2}', "/t") == \
        TopicRecord(partitions=2)
    assert record.with_start(1, 30) is record  # a low watermark never moves back
    assert record.with_start(1, 50).start_of(1) == 50
    with pytest.raises(CorruptMetadataError):
        TopicRecord.from_json(b'{"partitions": 0}', "/t")
    with pytest.raises(CorruptMetadataError):
        TopicRecord.from_json(b'{"partitions": 1, "log_start": {"0": -1}}', "/t")


def test_retention_drops_old_and_excess_ledgers_never_the_active_one() -> None:
    closed = [Segment(size=100, max_timestamp=1000), Segment(size=100, max_timestamp=2000),
              Segment(size=100, max_timestamp=3000)]
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=-1, retention_bytes=-1) == 0
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=2500,
                         retention_bytes=-1) == 2  # 1000 and 2000 < 2500
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=0,
                         retention_bytes=-1) == 3
    # 350 bytes in all: dropping one leaves 250 >= 200, a second 150 < 200
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=-1,
                         retention_bytes=200) == 1
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=-1,
                         retention_bytes=0) == 3
    # exactly at the limit: dropping one leaves 250, still >= 250
    assert retention_cut(closed, 50, now_ms=5000, retention_ms=-1,
                         retention_bytes=250) == 1


def test_delete_records_drops_only_ledgers_wholly_before_the_offset() -> None:
    assert ledgers_before([0, 100, 200], 150) == 1  # ledger 1 holds 100..199
    assert ledgers_before([0, 100, 200], 200) == 2
    assert ledgers_before([0, 100, 200], 99) == 0
    assert ledgers_before([0, 100, 200], 10_000) == 2  # never the last
    assert ledgers_before([0, None, 100, 200], 100) == 2  # the empty one goes too
    assert ledgers_before([0, None], 100) == 0
    assert ledgers_before([], 5) == 0


def _batch(timestamp: int) -> bytes:
    """A one-record RecordBatch v2 with CreateTime ``timestamp``."""
    # attributes 0, timestamp and offset deltas 0, key null (zigzag -1), value "x"
    # (zigzag 1), no headers; the record's length first (zigzag varint)
    record = bytes([0, 0, 0, 1, 2]) + b"x" + bytes([0])
    body = bytes([len(record) * 2]) + record
    tail = struct.pack(">hiqqqhii", 0, 0, timestamp, timestamp, -1, -1, -1, 1) + body
    head = struct.pack(">qiib", 0, len(tail) + 9, 0, 2)
    return head + struct.pack(">I", google_crc32c.value(tail)) + tail


def test_log_append_time_stamps_the_batch_and_keeps_its_crc_valid() -> None:
    raw = _batch(1234)
    (h, _), = split_batches(raw, max_batch_bytes=LIMIT)
    assert h.max_timestamp == 1234 and not h.attributes & 0x08
    stamped = with_log_append_time(raw, 99_000)
    (h2, _), = split_batches(stamped, max_batch_bytes=LIMIT)  # CRC checked here
    assert h2.attributes & 0x08 and h2.max_timestamp == 99_000
    assert h2.base_timestamp == 1234 and BatchHeader.parse(stamped).record_count == 1
    with pytest.raises(Exception) as info:
        split_batches(stamped, max_batch_bytes=20, limit_name="the topic's max.message.bytes")
    assert "max.message.bytes" in str(info.value)


def test_a_partitions_ledger_rolls_by_segment_bytes_and_age() -> None:
    """Kafka's LogConfig.maxSegmentMs: segment.ms, or on a compacted topic the lower of
    it and max.compaction.lag.ms; segment.bytes, else the gateway's log_roll_bytes."""
    assert TopicPolicy.of({}, max_batch_bytes=LIMIT).rolling(1 << 20) == (1 << 20, 604_800.0)
    assert TopicPolicy.of({"segment.bytes": "5000000", "segment.ms": "7200000",
                           "max.compaction.lag.ms": "3600000"},
                          max_batch_bytes=LIMIT).rolling(1 << 20) == (5000000, 7200.0)
    assert TopicPolicy.of({"cleanup.policy": "compact", "segment.ms": "7200000",
                           "max.compaction.lag.ms": "3600000"},
                          max_batch_bytes=LIMIT).rolling(1 << 20) == (1 << 20, 3600.0)


@given(st.lists(st.one_of(st.none(), st.integers(0, 50)), max_size=12), st.integers(0, 600))
def test_delete_records_needs_the_first_offsets_only_up_to_one_past_the_offset(
        steps: list[int | None], offset: int) -> None:
    """``retention.drop_before`` reads the ledgers' first offsets in log order and stops
    at the first one past the offset: the cut is the one the whole list gives."""
    firsts: list[int | None] = []
    at = 0
    for s in steps:  # non-decreasing first offsets, None for an empty ledger
        firsts.append(None if s is None else at + s)
        at += s or 0
    read = next((i + 1 for i, f in enumerate(firsts) if f is not None and f > offset),
                len(firsts))
    assert ledgers_before(firsts[:read], offset) == ledgers_before(firsts, offset)


def test_a_drop_keeps_the_last_ledger_known_to_hold_a_batch() -> None:
    """``retention.keep_from``: True holds an acknowledged batch, False holds none, None
    not known (an open ledger: another writer's, one a roll is closing, this writer's
    with nothing acknowledged yet)."""
    assert keep_from([True, None]) == 0  # a roll's new ledger after the last batch
    assert keep_from([True, True, None]) == 1
    assert keep_from([None, None]) == 0  # the review's race: the holder not yet closed
    assert keep_from([True, None, None]) == 0
    assert keep_from([False, False]) == 2  # no batch anywhere: no end to keep
    assert keep_from([False, None]) == 0
    assert keep_from([False, True, False]) == 1


@given(st.lists(st.sampled_from([True, False, None]), max_size=10), st.data())
def test_whatever_an_unknown_ledger_holds_a_drop_leaves_the_logs_end(
        holding: list[bool | None], data: st.DataObject) -> None:
    truth = [h if h is not None else data.draw(st.booleans()) for h in holding]
    cut = keep_from(holding)
    assert 0 <= cut <= len(holding)
    if any(truth):
        assert any(truth[cut:])  # the last batch is still listed: offsets go on


def test_last_holding_reads_back_to_the_first_holder_and_a_gone_ledger_is_unknown(
        ) -> None:
    from ledgerd.errors import NoSuchLedgerError

    class Part:
        def __init__(self, states: dict[int, bool | type[Exception] | None]) -> None:
            self.states, self.asked = states, []  # type: ignore[var-annotated]

        async def holds_batch(self, lid: int) -> bool | None:
            self.asked.append(lid)
            got = self.states[lid]
            if got is NoSuchLedgerError:
                raise NoSuchLedgerError(lid)
            return got  # type: ignore[return-value]

    part = Part({1: True, 2: True, 3: None, 4: None})
    assert trio.run(last_holding, part, [1, 2, 3, 4]) == 1
    assert part.asked == [4, 3, 2]  # not the first: it stops at the holder
    gone = Part({1: False, 2: NoSuchLedgerError, 3: False})  # swapped by compaction
    assert trio.run(last_holding, gone, [1, 2, 3]) == 0


def _walking_part(listing: Any, ends: dict[int, int | None]) -> Any:
    """A PartitionLog with no client whose reads are fakes: ``listing()`` gives the
    ledger list and mark; ledger ``lid`` is closed, gone if not in ``ends``, holding
    batches up to next offset ``ends[lid]`` (None: no batch)."""
    from types import SimpleNamespace

    from ledgerd.errors import NoSuchLedgerError
    from ledgerd.kafka.partitions import PartitionLog, PartitionSettings

    async def made() -> PartitionLog:  # (it reads trio's clock)
        return PartitionLog(SimpleNamespace(), "t", 0,  # type: ignore[arg-type]
                            PartitionSettings(3, 2, 2, 1 << 20, 1 << 20, 1 << 20),
                            None)  # type: ignore[arg-type]

    async def handle(lid: int) -> SimpleNamespace:
        if lid not in ends:
            raise NoSuchLedgerError(lid)
        return SimpleNamespace(is_closed=True,
                               last_add_confirmed=-1 if ends[lid] is None else 5,
                               metadata=SimpleNamespace(custom_metadata={}))

    async def header(lid: int, _entry: int) -> SimpleNamespace:
        return SimpleNamespace(next_offset=ends[lid])

    part = trio.run(made)
    part._listing = listing
    part._handle = handle
    part._header = header
    return part


def test_a_new_writer_reads_the_end_again_when_compaction_swaps_a_ledger_meanwhile(
        ) -> None:
    """``PartitionLog._closed_end`` walks the listed ledgers from the last: one gone and
    no longer listed (compaction swapped it for its replacement and deleted it, with
    file.delete.delay.ms 0) means the list changed, and the walk starts again from the
    list as it is now, never from an earlier ledger's end (found by review: offsets
    would have been given out twice)."""
    lists = iter([(1, 2), (1, 3)])  # 2 is swapped for 3 (same entries) after the first read
    ends: dict[int, int | None] = {1: 10, 3: 20}  # next offset after each one's last batch

    async def listing() -> tuple[tuple[int, ...], int]:
        return next(lists), 0

    part = _walking_part(listing, ends)
    assert trio.run(part._closed_end, None) == 20


@pytest.mark.parametrize(("ends", "mark", "expected"), [
    ({1: 10, 2: None}, 0, 10),  # the last batch listed
    ({1: None, 2: None}, 10, 10),  # no batch listed: the mark the drop recorded
    ({1: 20, 2: None}, 10, 20),  # batches after the mark
    ({}, 7, 7),  # nothing listed at all
])
def test_a_new_writers_end_is_never_below_the_log_mark(
        ends: dict[int, int | None], mark: int, expected: int) -> None:
    """``_closed_end`` takes the larger of the last listed batch's end and the log's
    mark (what retention recorded of the batches it dropped)."""
    async def listing() -> tuple[tuple[int, ...], int]:
        return tuple(ends), mark

    part = _walking_part(listing, ends)
    assert trio.run(part._closed_end, None) == expected


def _swapping_listing(before: tuple[int, ...], after: tuple[int, ...]) -> Any:
    """A fake ``_listing``: ``before`` on the first read, ``after`` from then on (a
    ledger of ``before`` swapped by compaction and deleted in between)."""
    reads = iter([before])

    async def listing() -> tuple[tuple[int, ...], int]:
        return next(reads, after), 0
    return listing


def test_the_log_start_is_read_again_when_compaction_swaps_its_first_ledger() -> None:
    """A walk from the first listed ledger that finds it gone and no longer listed
    (swapped for a replacement with the same offsets) starts again from the list as it
    is now, instead of taking the next ledger's first offset as the log start (found by
    an outside audit: a consumer from offset 0 of a compacted topic was told
    OFFSET_OUT_OF_RANGE)."""
    from ledgerd.errors import NoSuchLedgerError

    part = _walking_part(_swapping_listing((1, 2), (3, 2)), {})
    firsts = {3: 0, 2: 10}

    async def first_offset(lid: int) -> int | None:
        if lid not in firsts:
            raise NoSuchLedgerError(lid)
        return firsts[lid]

    part._first_offset = first_offset
    assert trio.run(part.start_offset) == 0


def test_a_followers_high_watermark_is_read_again_when_compaction_swaps_the_last_ledger(
        ) -> None:
    """The same for a follower's high watermark (``_end_before``): never an earlier
    ledger's end, which would move it back."""
    from ledgerd.errors import NoSuchLedgerError

    part = _walking_part(_swapping_listing((1, 2), (1, 3)), {1: 10, 3: 20})

    async def last_entry(lid: int) -> int:
        if lid not in (1, 3):
            raise NoSuchLedgerError(lid)
        return 5

    async def first_entry(lid: int) -> int:
        return 0

    part._last_entry = last_entry
    part._first_entry = first_entry
    assert trio.run(part._end_before, None) == 20
