"""Topic administration through stock clients against a real gateway, bookies and
ZooKeeper: topic configs (created, described, altered, refused when the gateway cannot
honour them) and their effects (max.message.bytes, LogAppendTime, retention),
CreatePartitions, DeleteRecords (the low watermark moves, earlier ledgers go) and
replica assignments, through confluent-kafka's AdminClient (librdkafka: DescribeConfigs
v1, AlterConfigs, IncrementalAlterConfigs v1, CreatePartitions, DeleteRecords) and
kafka-python 3's KafkaAdminClient (the newest, flexible versions)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.kafka.partitions import log_name
from tests.kafka.conftest import KafkaCluster

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


def _admin(cluster: KafkaCluster) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _create(admin: Any, topic: str, partitions: int = 1, **kw: Any) -> None:
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, num_partitions=partitions, **kw)])[topic] \
        .result(BOUND_S)


def _refusal(future: Any) -> Any:
    """The KafkaError a refused admin future carries."""
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException) as info:
        future.result(BOUND_S)
    return info.value.args[0]


def _configs(admin: Any, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource("topic", topic)
    return admin.describe_configs([res])[res].result(BOUND_S)  # type: ignore[no-any-return]


def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {BOUND_S} s: {what}")


def _fill(cluster: KafkaCluster, topic: str, n: int, size: int = 10_000) -> None:
    """``n`` records of ``size`` bytes into partition 0, a few per batch (so that
    ledgers of 1 MiB hold many batches)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5,
                         "batch.size": 4 * size})
    for i in range(n):
        producer.produce(topic, value=b"%06d" % i + b"x" * (size - 6), partition=0)
        producer.poll(0)
    assert producer.flush(BOUND_S) == 0


def _ledgers(cluster: KafkaCluster, topic: str) -> tuple[int, ...]:
    async def read() -> tuple[int, ...]:
        async with ledgerd.open_client(cluster.zk) as client:
            return await client.logs.ledgers(log_name(topic, 0))
    return trio.run(read)


def _earliest(cluster: KafkaCluster, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused"})
    try:
        low, _high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=BOUND_S,
                                             cached=False)
        return int(low)
    finally:
        c.close()


def _first_read(cluster: KafkaCluster, topic: str, offset: int) -> int:
    """The offset of the first record a consumer assigned at ``offset`` reads
    (auto.offset.reset earliest)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-reader",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                return int(msg.offset())
        raise AssertionError(f"nothing read from {topic} at {offset}")
    finally:
        c.close()


def test_topic_configs_are_kept_described_altered_and_refused_when_not_honoured(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    admin = _admin(kafka_cluster)
    _create(admin, "cfg-a", 2, config={"retention.ms": "600000", "max.message.bytes": "5000"})
    got = _configs(admin, "cfg-a")
    assert got["retention.ms"].value == "600000" and not got["retention.ms"].is_default
    assert got["max.message.bytes"].value == "5000"
    assert got["cleanup.policy"].value == "delete" and got["cleanup.policy"].is_default

    compact = _refusal(admin.create_topics([NewTopic(
        "cfg-compact", 1, config={"cleanup.policy": "compact"})])["cfg-compact"])
    assert compact.code() == KafkaError.POLICY_VIOLATION
    assert "cleanup.policy" in compact.str()
    unknown = _refusal(admin.create_topics([NewTopic(
        "cfg-unknown", 1, config={"dummy.doesntexist": "1"})])["cfg-unknown"])
    assert unknown.code() == KafkaError.INVALID_CONFIG and "dummy.doesntexist" in unknown.str()
    admin.create_topics([NewTopic("cfg-validate", 1, config={"retention.ms": "1"})],
                        validate_only=True)["cfg-validate"].result(BOUND_S)
    topics = admin.list_topics(timeout=BOUND_S).topics
    assert not {"cfg-compact", "cfg-unknown", "cfg-validate"} & set(topics)

    res = ConfigResource("topic", "cfg-a", incremental_configs=[
        ConfigEntry("retention.bytes", "123456",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([res])[res].result(BOUND_S)
    got = _configs(admin, "cfg-a")
    assert got["retention.bytes"].value == "123456"
    assert got["retention.ms"].value == "-1" and got["retention.ms"].is_default
    assert got["max.message.bytes"].value == "5000"

    bad = ConfigResource("topic", "cfg-a", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.APPEND)])
    refused = _refusal(admin.incremental_alter_configs([bad])[bad])
    assert refused.code() == KafkaError.POLICY_VIOLATION and "compact" in refused.str()
    assert _configs(admin, "cfg-a")["cleanup.policy"].value == "delete"

    # AlterConfigs replaces the whole set
    whole = ConfigResource("topic", "cfg-a", set_config={"message.timestamp.type":
                                                         "LogAppendTime"})
    admin.alter_configs([whole])[whole].result(BOUND_S)
    got = _configs(admin, "cfg-a")
    assert got["message.timestamp.type"].value == "LogAppendTime"
    assert got["retention.bytes"].is_default and got["max.message.bytes"].is_default

    node = admin.describe_cluster().result(BOUND_S).nodes[0].id
    broker = ConfigResource("broker", str(node))
    settings = admin.describe_configs([broker])[broker].result(BOUND_S)
    assert settings["num.partitions"].is_read_only
    assert int(settings["message.max.bytes"].value) > 0


def test_max_message_bytes_and_log_append_time_are_honoured(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, Producer

    admin = _admin(kafka_cluster)
    _create(admin, "cfg-small", config={"max.message.bytes": "2000"})
    _create(admin, "cfg-lat", config={"message.timestamp.type": "LogAppendTime"})
    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0,
                         "retries": 0})
    producer.produce("cfg-small", value=b"x" * 5000, partition=0,
                     on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(BOUND_S)
    producer.produce("cfg-small", value=b"y" * 100, partition=0,
                     on_delivery=lambda err, msg: outcomes.append(err))
    before = int(time.time() * 1000)
    producer.produce("cfg-lat", value=b"stamped", partition=0, timestamp=1000)
    assert producer.flush(BOUND_S) == 0
    assert outcomes[0] is not None and outcomes[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert outcomes[1] is None

    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap,
                         "group.id": "cfg-lat-reader", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["cfg-lat"])
        deadline = time.monotonic() + BOUND_S
        msg = None
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                msg = None
        assert msg is not None and msg.value() == b"stamped"
        kind, stamp = msg.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        assert before - 5000 <= stamp <= int(time.time() * 1000) + 5000
    finally:
        consumer.close()


def test_create_partitions_grows_a_topic_and_refuses_shrinking(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import NewPartitions

    admin = _admin(kafka_cluster)
    _create(admin, "cp-a", 2)
    admin.create_partitions([NewPartitions("cp-a", 4)])["cp-a"].result(BOUND_S)
    assert len(admin.list_topics("cp-a", timeout=BOUND_S).topics["cp-a"].partitions) == 4
    delivered: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    producer.produce("cp-a", value=b"in the new one", partition=3,
                     on_delivery=lambda err, msg: delivered.append((err, msg.partition())))
    assert producer.flush(BOUND_S) == 0
    assert delivered == [(None, 3)]
    shrink = _refusal(admin.create_partitions([NewPartitions("cp-a", 3)])["cp-a"])
    assert shrink.code() == KafkaError.INVALID_PARTITIONS
    assert "4" in shrink.str() and "3" in shrink.str()
    missing = _refusal(admin.create_partitions([NewPartitions("cp-none", 3)])["cp-none"])
    assert missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    admin.create_partitions([NewPartitions("cp-a", 6)], validate_only=True)["cp-a"] \
        .result(BOUND_S)
    assert len(admin.list_topics("cp-a", timeout=BOUND_S).topics["cp-a"].partitions) == 4


def test_replica_assignments_naming_live_gateways_are_accepted(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    admin = _admin(kafka_cluster)
    node = admin.describe_cluster().result(BOUND_S).nodes[0].id
    admin.create_topics([NewTopic("ra-a", 3, replica_assignment=[[node], [node], [node]])]
                        )["ra-a"].result(BOUND_S)
    assert len(admin.list_topics("ra-a", timeout=BOUND_S).topics["ra-a"].partitions) == 3
    bad = _refusal(admin.create_topics([NewTopic("ra-b", 1, replica_assignment=[[node + 1]])]
                                       )["ra-b"])
    assert bad.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT and str(node + 1) in bad.str()


def test_delete_records_moves_the_low_watermark_and_drops_earlier_ledgers(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import TopicPartition

    admin = _admin(kafka_cluster)
    _create(admin, "dr-a")
    _fill(kafka_cluster, "dr-a", 300)  # 3 MB over 1 MiB ledgers: several ledgers
    before = _ledgers(kafka_cluster, "dr-a")
    assert len(before) >= 3
    done = admin.delete_records([TopicPartition("dr-a", 0, 250)])
    [(_, future)] = done.items()
    assert future.result(BOUND_S).low_watermark == 250
    assert _earliest(kafka_cluster, "dr-a") == 250
    assert _first_read(kafka_cluster, "dr-a", 0) == 250  # reset to the new earliest
    assert _first_read(kafka_cluster, "dr-a", 260) == 260
    after = _ledgers(kafka_cluster, "dr-a")
    assert len(after) < len(before) and after[-1] == before[-1]
    # a low watermark never moves back
    [(_, future)] = admin.delete_records([TopicPartition("dr-a", 0, 10)]).items()
    assert future.result(BOUND_S).low_watermark == 250


def test_retention_ms_drops_old_ledgers(kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = _admin(kafka_cluster)
    _create(admin, "ret-a")
    _fill(kafka_cluster, "ret-a", 250)
    before = _ledgers(kafka_cluster, "ret-a")
    assert len(before) >= 3 and _earliest(kafka_cluster, "ret-a") == 0
    res = ConfigResource("topic", "ret-a", incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(BOUND_S)
    _until("retention dropped every closed ledger",
           lambda: _ledgers(kafka_cluster, "ret-a") == before[-1:])
    low = _earliest(kafka_cluster, "ret-a")
    assert 0 < low < 250
    assert _first_read(kafka_cluster, "ret-a", 0) == low


def test_kafka_python_admin_uses_the_newest_versions(kafka_cluster: KafkaCluster) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.structs import TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    try:
        admin.create_topics([KpNewTopic("kp-cfg", 1, 1, topic_configs={"retention.ms": "9000"})])
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC,
                                                           "kp-cfg")])
        assert described["topic"]["kp-cfg"]["retention.ms"]["value"] == "9000"
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp-cfg",
                                            configs={"retention.bytes": "77777"})])
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC,
                                                           "kp-cfg")])
        assert described["topic"]["kp-cfg"]["retention.bytes"]["value"] == "77777"
        # (kafka-python sends IncrementalAlterConfigs SET: the other config stays)
        assert described["topic"]["kp-cfg"]["retention.ms"]["value"] == "9000"
        _fill(kafka_cluster, "kp-cfg", 5, size=100)
        deleted = admin.delete_records({TopicPartition("kp-cfg", 0): 3})
        assert deleted[TopicPartition("kp-cfg", 0)]["low_watermark"] == 3
        assert _earliest(kafka_cluster, "kp-cfg") == 3
        admin.create_partitions({"kp-cfg": NewPartitions(3)})
        _until("kp-cfg has 3 partitions", lambda: len(
            _admin(kafka_cluster).list_topics("kp-cfg", timeout=BOUND_S)
            .topics["kp-cfg"].partitions) == 3)
    finally:
        admin.close()
