"""Produce v0-2 (message sets of magic 0 and 1, clients before 0.11) through a real
gateway: the messages are stored as RecordBatch v2 and a current consumer reads them
back with their keys, values and timestamps (none for magic 0; the gateway's for a
LogAppendTime topic), at the offsets the produce response gave."""

from __future__ import annotations

import time

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from ledgerd.kafka.api import ApiKey
from ledgerd.kafka.compression import Codec
from ledgerd.kafka.legacy_records import LegacyMessage, legacy_message_set
from tests.kafka.conftest import KafkaCluster
from tests.kafka.test_faults import _connect, _produce, _reply, _request

BOUND_S = 60


def _consume(cluster: KafkaCluster, topic: str, n: int,
             ) -> list[tuple[int, object, object, tuple[int, int]]]:
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"legacy-{topic}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + BOUND_S
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got.append((m.offset(), m.key(), m.value(), m.timestamp()))
    c.close()
    return got


def _produce_legacy(cluster: KafkaCluster, topic: str, version: int, records: bytes) -> int:
    with _connect(cluster) as sock:
        sock.sendall(_request(ApiKey.PRODUCE, version, _produce(topic, records)))
        part = _reply(sock, ApiKey.PRODUCE, version)["responses"][0][  # type: ignore[index]
            "partition_responses"][0]
    assert part["error_code"] == 0, part
    return int(part["base_offset"])


def test_old_produce_versions_are_stored_and_read_by_a_current_consumer(
        kafka_cluster: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    for f in admin.create_topics([NewTopic("legacy", 1, 1)]).values():
        f.result(BOUND_S)
    v0 = [LegacyMessage(b"a", b"0.8 client", magic=0), LegacyMessage(None, b"no key", magic=0)]
    v1 = [LegacyMessage(b"b", b"0.10 client", 1_700_000_000_000),
          LegacyMessage(b"c", None, 1_700_000_000_001)]
    assert _produce_legacy(kafka_cluster, "legacy", 0,
                           legacy_message_set(v0, Codec.GZIP, magic=0)) == 0
    assert _produce_legacy(kafka_cluster, "legacy", 2, legacy_message_set(v1)) == 2
    got = _consume(kafka_cluster, "legacy", 4)
    assert got == [
        # magic 0 has no timestamp: -1, as Kafka's up-conversion leaves it
        (0, b"a", b"0.8 client", (TIMESTAMP_CREATE_TIME, -1)),
        (1, None, b"no key", (TIMESTAMP_CREATE_TIME, -1)),
        (2, b"b", b"0.10 client", (TIMESTAMP_CREATE_TIME, 1_700_000_000_000)),
        (3, b"c", None, (TIMESTAMP_CREATE_TIME, 1_700_000_000_001)),
    ]


def test_a_log_append_time_topic_stamps_old_produces(kafka_cluster: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topic = NewTopic("legacy-lat", 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    for f in admin.create_topics([topic]).values():
        f.result(BOUND_S)
    before = int(time.time() * 1000)
    _produce_legacy(kafka_cluster, "legacy-lat", 1, legacy_message_set(
        [LegacyMessage(b"k", b"v", magic=0)], Codec.SNAPPY, magic=0))
    ((_, key, value, (kind, ts)),) = _consume(kafka_cluster, "legacy-lat", 1)
    assert (key, value, kind) == (b"k", b"v", TIMESTAMP_LOG_APPEND_TIME)
    assert before <= ts <= int(time.time() * 1000)
