"""Fetch errors as librdkafka (confluent-kafka) reads them: a partition with an error
comes with an empty record set, never a null one (librdkafka cannot parse
MessageSetSize -1, so it never saw the error and re-fetched for ever). A consumer
positioned past the end, or before the start of a log whose first ledgers were
truncated away, sees OFFSET_OUT_OF_RANGE and ``auto.offset.reset`` runs, earliest and
latest alike; one whose topic was deleted sees UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.kafka.partitions import log_name
from tests.kafka.conftest import KafkaCluster

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


class _Logs(logging.Handler):
    """librdkafka's log lines (the client's ``logger``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def rdkafka_logs() -> Iterator[tuple[logging.Logger, _Logs]]:
    logger = logging.getLogger(f"rdkafka-{time.monotonic_ns()}")
    logger.setLevel(logging.DEBUG)
    handler = _Logs()
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)


def _produce(cluster: KafkaCluster, topic: str, n: int, size: int = 16) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20})
    for i in range(n):
        producer.produce(topic, value=b"%08d" % i + bytes(max(0, size - 8)), partition=0)
    assert producer.flush(BOUND_S) == 0


def _consumer(cluster: KafkaCluster, reset: str, logger: logging.Logger,
              **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"fe-{reset}",
                     "enable.auto.commit": False, "auto.offset.reset": reset,
                     "fetch.wait.max.ms": 100, "logger": logger, **extra})


def _first_message(consumer: Any, *, keep_producing: tuple[KafkaCluster, str] | None = None,
                   ) -> Any:
    """The first message the consumer reads (with ``keep_producing``, one more message
    is produced every half second until then: a "latest" reset must see them)."""
    deadline = time.monotonic() + BOUND_S
    last = 0.0
    while time.monotonic() < deadline:
        if keep_producing is not None and time.monotonic() - last > 0.5:
            _produce(*keep_producing, 1)
            last = time.monotonic()
        m = consumer.poll(0.2)
        if m is not None and not m.error():
            return m
    raise AssertionError("no message within the bound: auto.offset.reset never ran")


def _watermarks(cluster: KafkaCluster, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "fe-marks"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=BOUND_S)
        return int(low), int(high)
    finally:
        c.close()


def _no_parse_failure(handler: _Logs) -> None:
    bad = [line for line in handler.lines if "parse failure" in line.lower()
           or "MessageSetSize" in line]
    assert not bad, bad[:3]


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_consumer_past_the_end_is_reset(kafka_cluster: KafkaCluster, reset: str,
                                          rdkafka_logs: tuple[logging.Logger, _Logs],
                                          ) -> None:
    from confluent_kafka import TopicPartition

    topic = f"fe-end-{reset}"
    _produce(kafka_cluster, topic, 10)
    consumer = _consumer(kafka_cluster, reset, rdkafka_logs[0])
    try:
        consumer.assign([TopicPartition(topic, 0, 1000)])  # 990 past the end
        if reset == "earliest":
            assert _first_message(consumer).offset() == 0
        else:  # from the end on: the first message read is a new one
            assert _first_message(consumer, keep_producing=(kafka_cluster, topic)).offset() \
                >= 10
    finally:
        consumer.close()
    _no_parse_failure(rdkafka_logs[1])


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_consumer_before_the_start_of_a_truncated_log_is_reset(
        kafka_cluster: KafkaCluster, reset: str,
        rdkafka_logs: tuple[logging.Logger, _Logs]) -> None:
    """The module's gateway rolls ledgers every MiB: 3 MiB make three ledgers or more,
    and the first is truncated away (retention), so offset 0 is before the start."""
    from confluent_kafka import TopicPartition

    topic = f"fe-start-{reset}"
    _produce(kafka_cluster, topic, 3072, size=1024)

    async def truncate() -> None:
        async with ledgerd.open_client(kafka_cluster.zk) as client:
            ledgers = await client.logs.ledgers(log_name(topic, 0))
            assert len(ledgers) >= 3, ledgers
            await client.logs.truncate(log_name(topic, 0), ledgers[1])

    trio.run(truncate)
    start, end = _watermarks(kafka_cluster, topic)
    assert 0 < start < end == 3072
    consumer = _consumer(kafka_cluster, reset, rdkafka_logs[0])
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        if reset == "earliest":
            assert _first_message(consumer).offset() == start
        else:
            assert _first_message(consumer, keep_producing=(kafka_cluster, topic)).offset() \
                >= end
    finally:
        consumer.close()
    _no_parse_failure(rdkafka_logs[1])


def test_a_consumer_of_a_deleted_topic_sees_unknown_topic(
        kafka_cluster: KafkaCluster, rdkafka_logs: tuple[logging.Logger, _Logs]) -> None:
    """librdkafka handles UNKNOWN_TOPIC_OR_PARTITION itself (it refreshes the topic's
    metadata and stops fetching a partition no longer there; a subscriber hears of it
    at its next periodic metadata refresh), so what proves the error was read is its
    fetch debug line and the topic seen gone at once, not after five minutes."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = "fe-gone"
    _produce(kafka_cluster, topic, 5)
    # (librdkafka believes a topic missing from metadata gone only after this long)
    consumer = _consumer(kafka_cluster, "earliest", rdkafka_logs[0], debug="fetch,topic",
                         **{"topic.metadata.propagation.max.ms": 1000})
    lines = rdkafka_logs[1].lines

    def seen(*words: str) -> bool:
        return any(all(w in line for w in words) for line in lines)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert _first_message(consumer).offset() == 0
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        admin.delete_topics([topic])[topic].result(BOUND_S)
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and not (
                seen(topic, "Fetch failed", "UNKNOWN_TOPIC_OR_PART")
                and seen(topic, "partition count changed from 1 to 0")):
            consumer.poll(0.2)
        assert seen(topic, "Fetch failed", "UNKNOWN_TOPIC_OR_PART")
        assert seen(topic, "partition count changed from 1 to 0")
    finally:
        consumer.close()
    _no_parse_failure(rdkafka_logs[1])
