"""A topic's compression.type: produced batches recompressed as Kafka's broker does
(``ledgerd/kafka/compression.py``), record for record."""

from __future__ import annotations

import socket

import google_crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka.api import ApiKey
from ledgerd.kafka.compression import Codec, recompress
from ledgerd.kafka.records import HEADER_SIZE, BatchHeader, split_batches
from ledgerd.kafka.timestamps import records_of
from tests.kafka.conftest import KafkaCluster
from tests.kafka.test_faults import _reply, _request

BOUND_S = 60

_record = st.tuples(st.one_of(st.none(), st.binary(max_size=40)),
                    st.one_of(st.none(), st.binary(max_size=300)),
                    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)),
                             max_size=3),
                    st.integers(0, 10_000))


def _batch(codec: int, records: list[tuple[bytes | None, bytes | None,
                                          list[tuple[str, bytes]], int]],
           *, transactional: bool, pid: int, epoch: int, seq: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0 if codec == 2 else codec,
                                  is_transactional=transactional, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq,
                                  batch_size=1 << 24)
    for i, (key, value, headers, delta) in enumerate(records):
        b.append(i, timestamp=1_700_000_000_000 + delta, key=key, value=value,
                 headers=headers)
    raw = b.build()
    # kafka-python needs python-snappy to write snappy; ours writes it instead
    return recompress(bytes(raw), Codec.SNAPPY) if codec == 2 else bytes(raw)


def _records(batch: bytes) -> bytes:
    h = BatchHeader.parse(batch)
    return bytes(records_of(h, memoryview(batch)[HEADER_SIZE:h.length]))


@settings(max_examples=150, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=20),
       source=st.sampled_from(list(Codec)), target=st.sampled_from(list(Codec)),
       transactional=st.booleans(), pid=st.integers(0, 1 << 40),
       epoch=st.integers(0, 32000), seq=st.integers(0, 1 << 30),
       base_offset=st.integers(0, 1 << 40))
def test_any_batch_survives_recompression_record_for_record(
        records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]],
        source: Codec, target: Codec, transactional: bool, pid: int, epoch: int, seq: int,
        base_offset: int) -> None:
    raw = _batch(source, records, transactional=transactional, pid=pid, epoch=epoch,
                 seq=seq)
    raw = base_offset.to_bytes(8, "big") + raw[8:]
    new = recompress(raw, target)
    old_h, new_h = BatchHeader.parse(raw), BatchHeader.parse(new)
    assert new_h.attributes & 7 == target
    assert new_h.length == len(new)
    # every header field but the codec bits, the length and the CRC is the producer's
    assert old_h.attributes & ~7 == new_h.attributes & ~7
    assert (new_h.base_offset, new_h.last_offset_delta, new_h.base_timestamp,
            new_h.max_timestamp, new_h.producer_id, new_h.producer_epoch,
            new_h.base_sequence, new_h.record_count) == (
        old_h.base_offset, old_h.last_offset_delta, old_h.base_timestamp,
        old_h.max_timestamp, old_h.producer_id, old_h.producer_epoch,
        old_h.base_sequence, old_h.record_count)
    assert new[12:16] == raw[12:16]  # the partition leader epoch
    assert google_crc32c.value(new[21:]) == new_h.crc
    assert _records(new) == _records(raw)  # byte for byte
    # the gateway's own produce check takes it
    assert split_batches(new, max_batch_bytes=1 << 26, transactional=transactional)
    if target is not Codec.SNAPPY:  # and a client reads it record for record
        from kafka.record.default_records import DefaultRecordBatch

        got = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
               for r in DefaultRecordBatch(new)]
        assert got == [(base_offset + i, 1_700_000_000_000 + delta, key, value,
                        [tuple(h) for h in headers])
                       for i, (key, value, headers, delta) in enumerate(records)]


def test_a_batch_already_in_the_topic_codec_is_kept_as_is() -> None:
    raw = _batch(3, [(b"k", b"v" * 100, [], 0)], transactional=False, pid=-1, epoch=-1,
                 seq=-1)
    assert recompress(raw, Codec.LZ4) is raw


def _fetch_codecs(cluster: KafkaCluster, topic: str) -> list[int]:
    """The codec of each batch the gateway returns for ``topic`` partition 0."""
    host, port = cluster.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=BOUND_S) as sock:
        sock.sendall(_request(ApiKey.FETCH, 4, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}))
        reply = _reply(sock, ApiKey.FETCH, 4)
    part = reply["responses"][0]["partitions"][0]  # type: ignore[index]
    data, codecs = part["records"], []
    while data:
        h = BatchHeader.parse(data)
        codecs.append(h.attributes & 7)
        data = data[h.length:]
    return codecs


@pytest.mark.parametrize("codec", ["lz4", "gzip", "snappy", "zstd", "uncompressed"])
def test_a_consumer_reads_records_produced_uncompressed_to_a_compressed_topic(
        kafka_cluster: KafkaCluster, codec: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"recompress-{codec}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"compression.type": codec})])[
        topic].result(BOUND_S)
    source = "gzip" if codec == "uncompressed" else "none"
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap,
                         "compression.type": source, "linger.ms": 50})
    sent = [(b"k%d" % i, b"value %d " % i * 20) for i in range(200)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value, headers=[("n", key)])
    assert producer.flush(BOUND_S) == 0
    assert set(_fetch_codecs(kafka_cluster, topic)) == {Codec[codec.upper()]}
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        got = []
        for msg in iter(lambda: consumer.poll(BOUND_S), None):
            assert not msg.error(), msg.error()
            got.append((msg.offset(), msg.key(), msg.value(), msg.headers()))
            if len(got) == len(sent):
                break
    finally:
        consumer.close()
    assert got == [(i, k, v, [("n", k)]) for i, (k, v) in enumerate(sent)]
