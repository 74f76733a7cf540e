"""A fetch response stays within the client's ``fetch.max.bytes``: only its first
records may be larger (KIP-74: a batch larger than the limits still makes progress),
and after them a partition whose next batch does not fit gets nothing this time.

librdkafka sizes its receive buffer from ``fetch.max.bytes`` (``receive.message.max.bytes``
must be at least 512 bytes more); a response over it is a protocol error that closes
the connection, so a consumer of several partitions of near-1 MB batches never got a
message (librdkafka's test 0082 in full mode)."""

from __future__ import annotations

import time

from tests.kafka.conftest import KafkaCluster

BOUND_S = 60  # every wait below is bounded; reaching it fails the test
PARTITIONS = 3
PER_PARTITION = 3
SIZE = 700 * 1024  # one record per batch: two batches are more than fetch.max.bytes


def test_a_fetch_of_several_partitions_stays_within_fetch_max_bytes(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"fetch-limits-{time.monotonic_ns()}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(BOUND_S)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0})
    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, value=b"%d.%d:" % (p, i) + bytes(SIZE), partition=p)
            producer.poll(0)
    assert producer.flush(BOUND_S) == 0

    errors: list[str] = []
    consumer = Consumer({
        "bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic,
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "max.partition.fetch.bytes": 20_000_000, "fetch.max.bytes": 1_000_000,
        "receive.message.max.bytes": 1_000_512,
        "error_cb": lambda err: errors.append(str(err))})
    try:
        consumer.subscribe([topic])
        got: set[bytes] = set()
        deadline = time.monotonic() + BOUND_S
        while len(got) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            got.add(m.value().split(b":", 1)[0])
        assert got == {b"%d.%d" % (p, i) for p in range(PARTITIONS)
                       for i in range(PER_PARTITION)}, f"client errors: {errors[:3]}"
        assert not [e for e in errors if "receive.message.max.bytes" in e], errors[:3]
    finally:
        consumer.close()
