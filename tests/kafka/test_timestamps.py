"""ListOffsets by timestamp at record granularity (issue 47, item 5; librdkafka test
0054): the first record whose timestamp is at or after the target, inside a batch too
(compressed or not), with that record's offset and timestamp. Pure tests over batches
built by kafka-python's builder, then a stock client (confluent-kafka's
``offsets_for_times``) against a real gateway, over batches of ten records each."""

from __future__ import annotations

import time

import pytest

from ledgerd.kafka.records import BatchHeader
from ledgerd.kafka.timestamps import (
    MAX_RECORDS_BYTES,
    RecordsError,
    _snappy_block,
    first_at_or_after,
    latest_record,
    record_times,
)
from tests.kafka.conftest import KafkaCluster

BOUND_S = 60
BASE_MS = 1_700_000_000_000


def _batch(codec: int, stamps: list[int], *, base_offset: int = 0,
           log_append_time: bool = False) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i, ts in enumerate(stamps):
        b.append(i, timestamp=ts, key=b"k%d" % i if i % 2 else None,
                 value=b"v%d" % i * (i + 1), headers=[("h", b"x")] if i % 3 else [])
    raw = bytearray(b.build())
    raw[:8] = base_offset.to_bytes(8, "big", signed=True)
    if log_append_time:
        raw[22] |= 0x08  # attributes (i16 at 21): bit 3; the CRC is not checked here
    return bytes(raw)


@pytest.mark.parametrize("codec", [0, 1, 3, 4], ids=["none", "gzip", "lz4", "zstd"])
def test_the_first_record_at_or_after_a_time_is_found_inside_a_batch(codec: int) -> None:
    # out of order on purpose: Kafka names the first record in offset order that
    # reaches the target, not the one with the nearest timestamp
    stamps = [BASE_MS, BASE_MS + 10, BASE_MS + 30, BASE_MS + 20, BASE_MS + 40]
    batch = _batch(codec, stamps, base_offset=100)
    assert list(record_times(batch)) == [(100 + i, ts) for i, ts in enumerate(stamps)]
    assert first_at_or_after(batch, BASE_MS - 5) == (100, BASE_MS)
    assert first_at_or_after(batch, BASE_MS + 10) == (101, BASE_MS + 10)
    assert first_at_or_after(batch, BASE_MS + 15) == (102, BASE_MS + 30)
    assert first_at_or_after(batch, BASE_MS + 35) == (104, BASE_MS + 40)


def test_a_log_append_time_batch_answers_its_first_record_and_max_timestamp() -> None:
    batch = _batch(0, [BASE_MS, BASE_MS + 10, BASE_MS + 20], base_offset=7,
                   log_append_time=True)
    assert first_at_or_after(batch, BASE_MS + 15) == (7, BatchHeader.parse(batch).max_timestamp)


def test_records_that_do_not_parse_fall_back_to_the_batch_and_say_why() -> None:
    batch = bytearray(_batch(0, [BASE_MS, BASE_MS + 10, BASE_MS + 20], base_offset=3))
    batch[61] = 0x7E  # the first record's length (zigzag varint): 63, more than remain
    with pytest.raises(RecordsError, match="record 0 claims"):
        list(record_times(bytes(batch)))
    assert first_at_or_after(bytes(batch), BASE_MS + 15) == (3, BASE_MS + 20)
    gz = bytearray(_batch(1, [BASE_MS, BASE_MS + 10]))
    gz[70:80] = bytes(10)  # a corrupt gzip stream
    with pytest.raises(RecordsError):
        list(record_times(bytes(gz)))


def test_snappy_blocks_decode_literals_and_overlapping_copies() -> None:
    # preamble 11; literal "abc" (tag (3-1)<<2); copy-2 of 8 bytes from 3 back (a run)
    block = bytes([11, (3 - 1) << 2]) + b"abc" + bytes([((8 - 1) << 2) | 2, 3, 0])
    assert _snappy_block(block) == b"abcabcabcab"
    with pytest.raises(RecordsError, match=r"snappy: .*offset 9"):  # 9 back of 1 byte
        _snappy_block(bytes([4, 0]) + b"a" + bytes([((3 - 1) << 2) | 2, 9, 0]))
    huge = bytearray()
    n = MAX_RECORDS_BYTES + 1
    while True:  # the preamble claims more than the bound: refused before decoding
        huge.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    with pytest.raises(RecordsError, match="over"):
        _snappy_block(bytes(huge))


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_offsets_for_times_names_the_record_inside_a_batch(
        kafka_cluster: KafkaCluster, compression: str) -> None:
    """Batches of ten records, 10 ms apart: a time between records 4 and 5 of the
    second batch names record 5 (offset 15) with its own timestamp; the gateway used
    to answer the batch's first record (offset 10) with the batch's max timestamp."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"ts-{compression}"
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap,
                         "compression.type": compression, "linger.ms": 1000,
                         "batch.num.messages": 10})
    base = int(time.time() * 1000)
    stamps = [base + 10 * i for i in range(30)]
    for batch in range(3):  # one batch each: the flush ends the linger
        for i in range(batch * 10, batch * 10 + 10):
            producer.produce(topic, value=b"r%d" % i, timestamp=stamps[i])
        assert producer.flush(BOUND_S) == 0
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic})
    try:
        for target, offset, ts in ((stamps[14] + 3, 15, stamps[15]),
                                   (stamps[17], 17, stamps[17]),
                                   (stamps[0] - 1000, 0, stamps[0]),
                                   (stamps[29] + 1, -1, None)):
            got = consumer.offsets_for_times([TopicPartition(topic, 0, target)], BOUND_S)[0]
            assert got.offset == offset, (target, got)
            if ts is not None:  # librdkafka keeps the answer's timestamp out of sight;
                # reading that record shows it was the one with the time named
                consumer.assign([TopicPartition(topic, 0, offset)])
                msg = consumer.poll(BOUND_S)
                assert msg is not None and not msg.error()
                assert (msg.offset(), msg.timestamp()[1]) == (offset, ts)
    finally:
        consumer.close()


def test_the_log_start_bounds_the_record_named_and_the_latest_one() -> None:
    stamps = [BASE_MS + 50, BASE_MS + 10, BASE_MS + 30, BASE_MS + 50, BASE_MS + 20]
    batch = _batch(0, stamps, base_offset=100)
    assert first_at_or_after(batch, BASE_MS + 25, 101) == (102, BASE_MS + 30)
    assert first_at_or_after(batch, BASE_MS + 40, 104) is None  # only 103 and 100 reach it
    assert first_at_or_after(batch, BASE_MS + 60) is None
    assert first_at_or_after(batch, BASE_MS, 105) is None  # all below the log start
    assert latest_record(batch) == (100, BASE_MS + 50)  # the first of the largest
    assert latest_record(batch, 101) == (103, BASE_MS + 50)
    assert latest_record(batch, 104) == (104, BASE_MS + 20)
    assert latest_record(batch, 105) is None


def test_offsets_for_times_follows_offsets_not_clocks_and_the_log_start(
        kafka_cluster: KafkaCluster) -> None:
    """Timestamps that go back and forth (producers' clocks, CreateTime set upstream),
    one record a batch over more than two of the index's 64-entry blocks: every target
    names the first record, in offset order at or after the log start, that reaches
    it, as Kafka does; so does MAX_TIMESTAMP, once DeleteRecords moved the log start
    past the largest one. The gateway used to binary-search as if timestamps grew
    (a later offset, or none) and to answer below the log start."""
    import random

    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic = "ts-unordered"
    rng = random.Random(47)
    base = int(time.time() * 1000) - 3_600_000
    stamps = [base + rng.randrange(0, 1000) * 10 for _ in range(150)]
    stamps[3] = base + 20_000  # the largest, below the log start set later
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0})
    for i, ts in enumerate(stamps):  # one batch each
        producer.produce(topic, value=b"r%d" % i, timestamp=ts)
        assert producer.flush(BOUND_S) == 0
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic})
    targets = sorted({rng.choice(stamps) + d for d in (-5, 0, 5) for _ in range(12)}
                     | {base - 1, max(stamps) + 1})

    def expected(target: int, start: int) -> int:
        return next((o for o in range(start, len(stamps)) if stamps[o] >= target), -1)

    def check(start: int) -> None:
        got = [consumer.offsets_for_times([TopicPartition(topic, 0, t)], BOUND_S)[0].offset
               for t in targets]  # (one a call: librdkafka keeps one per partition)
        assert got == [expected(t, start) for t in targets]

    def latest() -> int:
        tp = TopicPartition(topic, 0)
        return admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(BOUND_S).offset

    try:
        check(0)
        assert latest() == 3
        tp = TopicPartition(topic, 0, 10)
        assert admin.delete_records([tp])[tp].result(BOUND_S).low_watermark == 10
        check(10)
        top = max(stamps[10:])
        assert latest() == stamps.index(top, 10)
    finally:
        consumer.close()
