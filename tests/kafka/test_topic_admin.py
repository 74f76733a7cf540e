"""Topic administration through stock clients against a real gateway, bookies and
ZooKeeper: topic configs (created, described, altered, refused when the gateway cannot
honour them) and their effects (max.message.bytes, LogAppendTime, retention),
CreatePartitions, DeleteRecords (the low watermark moves, earlier ledgers go) and
replica assignments, through confluent-kafka's AdminClient (librdkafka: DescribeConfigs
v1, AlterConfigs, IncrementalAlterConfigs v1, CreatePartitions, DeleteRecords) and
kafka-python 3's KafkaAdminClient (the newest, flexible versions)."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.partitions import log_name
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GATEWAY_ENV, GatewayProcess, KafkaCluster, running_cluster
from tests.kafka.crash_kit import sees_only, wait_until
from tests.kafka.test_admin_clients import _reply, sasl_admin
from tests.kafka.test_faults import _request
from tests.kafka.test_security import secure_gateway  # noqa: F401 (the fixture)

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


def _until(what: str, check: Any, seen: Any = None) -> None:
    """Wait for ``check()``; if it never holds, fail naming ``what`` (and ``seen()``,
    what was seen meanwhile)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {BOUND_S} s: {what}"
                         + (f" (seen: {seen()})" if seen is not None else ""))


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
    # the default segment size is what the gateway rolls ledgers at (log_roll_bytes)
    assert got["segment.bytes"].value == GATEWAY_ENV["LEDGERD_LOG_ROLL_BYTES"]
    assert got["segment.bytes"].is_default

    lag = _refusal(admin.create_topics([NewTopic(
        "cfg-compact", 1, config={"cleanup.policy": "compact",
                                  "max.compaction.lag.ms": "0"})])["cfg-compact"])
    assert lag.code() == KafkaError.INVALID_CONFIG
    assert "max.compaction.lag.ms" in lag.str()
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

    # compaction is honoured now: APPEND and SUBTRACT edit the policy list
    both = ConfigResource("topic", "cfg-a", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("min.cleanable.dirty.ratio", "0.1",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([both])[both].result(BOUND_S)
    got = _configs(admin, "cfg-a")
    assert got["cleanup.policy"].value == "delete,compact"
    assert got["min.cleanable.dirty.ratio"].value == "0.1"
    back = ConfigResource("topic", "cfg-a", incremental_configs=[
        ConfigEntry("cleanup.policy", "compact",
                    incremental_operation=AlterConfigOpType.SUBTRACT),
        ConfigEntry("min.cleanable.dirty.ratio", None,
                    incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([back])[back].result(BOUND_S)
    assert _configs(admin, "cfg-a")["cleanup.policy"].value == "delete"
    bad = ConfigResource("topic", "cfg-a", incremental_configs=[
        ConfigEntry("segment.ms", "0",
                    incremental_operation=AlterConfigOpType.SET)])
    refused = _refusal(admin.incremental_alter_configs([bad])[bad])
    assert refused.code() == KafkaError.INVALID_CONFIG
    assert "segment.ms" in refused.str()

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


def test_retention_ms_keeps_a_ledger_whose_largest_timestamp_is_recent(
        kafka_cluster: KafkaCluster) -> None:
    """Kafka keeps a segment while its largest timestamp is recent, wherever in the
    segment that record sits (timestamps set upstream need not grow with offsets): a
    ledger with one recent record among old ones stays, and the log from it."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = _admin(kafka_cluster)
    _create(admin, "ret-c")
    now = int(time.time() * 1000)
    old = now - 2 * 86_400_000
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 5,
                         "batch.size": 40_000})
    for i in range(400):  # 4 MB over 1 MiB ledgers; record 150 in the second one
        producer.produce("ret-c", value=b"%06d" % i + b"x" * 9_994, partition=0,
                         timestamp=now if i == 150 else old)
        producer.poll(0)
    assert producer.flush(BOUND_S) == 0
    before = _ledgers(kafka_cluster, "ret-c")
    assert len(before) >= 4
    res = ConfigResource("topic", "ret-c", incremental_configs=[
        ConfigEntry("retention.ms", str(86_400_000),
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(BOUND_S)
    _until("retention dropped the first ledger",
           lambda: len(_ledgers(kafka_cluster, "ret-c")) < len(before))
    # one pass decides: the first ledger (all old) went, the one holding record 150 not
    assert _ledgers(kafka_cluster, "ret-c") == before[1:]
    low = _earliest(kafka_cluster, "ret-c")
    assert 0 < low <= 150
    assert _first_read(kafka_cluster, "ret-c", 150) == 150


def test_retention_bytes_keeps_the_newest_ledgers_that_hold_that_much(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = _admin(kafka_cluster)
    _create(admin, "ret-b")
    _fill(kafka_cluster, "ret-b", 400)  # 4 MB: three closed 1 MiB ledgers, one open
    before = _ledgers(kafka_cluster, "ret-b")
    assert len(before) >= 4
    res = ConfigResource("topic", "ret-b", incremental_configs=[
        ConfigEntry("retention.bytes", "1500000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(BOUND_S)
    # the open ledger counts as empty: the newest closed ledgers holding 1.5 MB stay
    _until("retention dropped the oldest ledgers",
           lambda: _ledgers(kafka_cluster, "ret-b") == before[-3:])
    assert _earliest(kafka_cluster, "ret-b") > 0
    res = ConfigResource("topic", "ret-b")
    assert admin.describe_configs([res])[res].result(BOUND_S)["retention.bytes"].value \
        == "1500000"


def test_dynamic_broker_configs_set_the_topics_defaults_and_are_honoured(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ConfigSource,
    )

    admin = _admin(kafka_cluster)
    _create(admin, "dyn-a")
    _create(admin, "dyn-own", config={"retention.ms": "-1"})
    _fill(kafka_cluster, "dyn-a", 250)
    _fill(kafka_cluster, "dyn-own", 250)
    before, own_before = _ledgers(kafka_cluster, "dyn-a"), _ledgers(kafka_cluster, "dyn-own")
    assert len(before) >= 3 and len(own_before) >= 3
    node = str(admin.describe_cluster().result(BOUND_S).nodes[0].id)

    def broker_configs() -> dict[str, Any]:
        res = ConfigResource("broker", node)
        return admin.describe_configs([res])[res].result(BOUND_S)  # type: ignore[no-any-return]

    def incremental(*entries: tuple[str, str | None, Any]) -> Any:
        res = ConfigResource("broker", node, incremental_configs=[
            ConfigEntry(n, v, incremental_operation=op) for n, v, op in entries])
        return admin.incremental_alter_configs([res])[res]

    try:
        incremental(("log.retention.ms", "1", AlterConfigOpType.SET),
                    ("background.threads", "9", AlterConfigOpType.SET)).result(BOUND_S)
        got = broker_configs()
        assert got["log.retention.ms"].value == "1" and not got["log.retention.ms"].is_read_only
        assert got["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert got["num.partitions"].is_read_only
        topic = _configs(admin, "dyn-a")["retention.ms"]
        assert topic.value == "1" and topic.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        # honoured: the topic without its own retention.ms loses its closed ledgers, the
        # one with its own keeps them
        _until("retention dropped every closed ledger of the topic without its own",
               lambda: _ledgers(kafka_cluster, "dyn-a") == before[-1:])
        assert _ledgers(kafka_cluster, "dyn-own") == own_before

        static = _refusal(incremental(("num.partitions", "3", AlterConfigOpType.SET)))
        assert static.code() == KafkaError.INVALID_REQUEST and "num.partitions" in static.str()
        unknown = _refusal(incremental(("no.such.config", "1", AlterConfigOpType.SET)))
        assert unknown.code() == KafkaError.INVALID_CONFIG and "no.such.config" in unknown.str()

        # a gateway that is gone: its values can be deleted through any gateway, not set
        def departed(op: int, value: str | None) -> dict[str, Any]:
            reply = _ask(kafka_cluster.gateway, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {
                "resources": [{"resource_type": 4, "resource_name": "99999", "configs": [
                    {"name": "background.threads", "config_operation": op,
                     "value": value}]}], "validate_only": False})
            return reply["responses"][0]  # type: ignore[no-any-return]

        refused = departed(0, "3")
        assert refused["error_code"] == ErrorCode.INVALID_REQUEST
        assert "only be deleted" in refused["error_message"]
        assert departed(1, None)["error_code"] == 0

        # AlterConfigs replaces the broker's whole dynamic set
        whole = ConfigResource("broker", node, set_config={
            "sasl.kerberos.min.time.before.relogin": "58000"})
        admin.alter_configs([whole])[whole].result(BOUND_S)
        got = broker_configs()
        assert got["sasl.kerberos.min.time.before.relogin"].value == "58000"
        assert got["log.retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        assert got["background.threads"].source == ConfigSource.DEFAULT_CONFIG.value
        assert _configs(admin, "dyn-a")["retention.ms"].is_default
    finally:
        incremental(("log.retention.ms", None, AlterConfigOpType.DELETE),
                    ("background.threads", None, AlterConfigOpType.DELETE),
                    ("sasl.kerberos.min.time.before.relogin", None,
                     AlterConfigOpType.DELETE)).result(BOUND_S)


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


@pytest.fixture
def two_gateways(zookeeper: ZooKeeperServer, tmp_path: Path,
                 ) -> Iterator[tuple[KafkaCluster, GatewayProcess, GatewayProcess]]:
    with fresh_chroot(zookeeper, "topic_admin_two") as zk:
        a = GatewayProcess(zk, tmp_path / "a.log")
        with running_cluster(tmp_path, zk, 4, a) as cluster:
            b = GatewayProcess(zk, tmp_path / "b.log")
            b.start()
            # until both see both, each may answer Metadata as a partition's leader
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            try:
                yield cluster, a, b
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)


def _ask(gateway: GatewayProcess, api: ApiKey, version: int,
         body: dict[str, object]) -> dict[str, Any]:
    """One request to this very gateway (a client would pick any broker)."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(_request(api, version, body))
        return _reply(sock, api, version)


def _count_at(gateway: GatewayProcess, topic: str) -> int:
    reply = _ask(gateway, ApiKey.METADATA, 1, {"topics": [{"name": topic}]})
    return len(reply["topics"][0]["partitions"])


def _big_batch(size: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    b.append(0, timestamp=1_700_000_000_000, key=None, value=b"v" * size, headers=[])
    return bytes(b.build())


def test_topic_changes_through_one_gateway_hold_on_the_other(
        two_gateways: tuple[KafkaCluster, GatewayProcess, GatewayProcess]) -> None:
    """Requests aimed at each gateway: partitions added and a config altered through
    one are seen and enforced by the other once its cached topic record is a second
    old; DeleteRecords is answered NOT_LEADER_OR_FOLLOWER by the gateway that does not
    lead the partition, and that gateway's ListOffsets (earliest) follows the low
    watermark the leader moved."""
    _, a, b = two_gateways
    created = _ask(a, ApiKey.CREATE_TOPICS, 4, {"topics": [{
        "name": "two-a", "num_partitions": 2, "replication_factor": -1, "assignments": [],
        "configs": []}], "timeout_ms": 10000, "validate_only": False})
    assert created["topics"][0]["error_code"] == 0
    assert _count_at(b, "two-a") == 2  # b has read the record now
    grown = _ask(a, ApiKey.CREATE_PARTITIONS, 3, {"topics": [{
        "name": "two-a", "count": 5, "assignments": None}], "timeout_ms": 10000,
        "validate_only": False})
    assert grown["results"][0]["error_code"] == 0
    _until("gateway b reports 5 partitions", lambda: _count_at(b, "two-a") == 5)

    def leading() -> tuple[GatewayProcess, GatewayProcess]:
        """(the leader of two-a/0, the other) as gateway a's Metadata says now: asked
        again each time, as a client does, since leadership may move under load."""
        meta = _ask(a, ApiKey.METADATA, 1, {"topics": [{"name": "two-a"}]})
        leader_id = meta["topics"][0]["partitions"][0]["leader_id"]
        ports = {n["node_id"]: n["port"] for n in meta["brokers"]}
        return (a, b) if ports[leader_id] == a.port else (b, a)

    codes: list[int] = []  # what each produce was answered (shown if one never comes)

    def produce(size: int) -> int:
        reply = _ask(leading()[0], ApiKey.PRODUCE, 7, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": "two-a", "partition_data": [
                {"index": 0, "records": _big_batch(size)}]}]})
        codes.append(int(reply["responses"][0]["partition_responses"][0]["error_code"]))
        return codes[-1]

    for _ in range(4):  # the leader has the record cached, limit-free
        assert produce(3000) == 0, codes
    altered = _ask(leading()[1], ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": 2, "resource_name": "two-a", "configs": [{
            "name": "max.message.bytes", "config_operation": 0, "value": "2000"}]}],
        "validate_only": False})
    assert altered["responses"][0]["error_code"] == 0
    _until("the leader refuses a batch over the altered limit",
           lambda: produce(3000) == ErrorCode.MESSAGE_TOO_LARGE, lambda: codes[-10:])

    def delete(at: GatewayProcess) -> dict[str, Any]:
        reply = _ask(at, ApiKey.DELETE_RECORDS, 2, {"topics": [{
            "name": "two-a", "partitions": [{"partition_index": 0, "offset": 2}]}],
            "timeout_ms": 10000})
        return reply["topics"][0]["partitions"][0]  # type: ignore[no-any-return]

    leader, other = leading()
    assert delete(other)["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert delete(leader) == {"partition_index": 0, "low_watermark": 2, "error_code": 0}

    def earliest_at(gateway: GatewayProcess) -> int:
        reply = _ask(gateway, ApiKey.LIST_OFFSETS, 1, {"replica_id": -1, "topics": [{
            "name": "two-a", "partitions": [{"partition_index": 0, "timestamp": -2}]}]})
        return int(reply["topics"][0]["partitions"][0]["offset"])

    assert earliest_at(leader) == 2
    _until("the other gateway's earliest offset follows", lambda: earliest_at(other) == 2)


def test_changing_a_topic_needs_the_admin_role(
        secure_gateway: tuple[GatewayProcess, Path],  # noqa: F811
) -> None:
    """With principals, a client may describe a topic's configs but not alter them,
    add partitions or delete records (TOPIC_AUTHORIZATION_FAILED); an admin may."""
    from confluent_kafka import KafkaError, TopicPartition
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
    )

    gw, base = secure_gateway
    alice, root = sasl_admin(gw, base, "alice"), sasl_admin(gw, base, "root")
    _create(root, "sec-cfg", 1)
    assert _configs(alice, "sec-cfg")["retention.ms"].value == "-1"
    res = ConfigResource("topic", "sec-cfg", incremental_configs=[
        ConfigEntry("retention.ms", "5000", incremental_operation=AlterConfigOpType.SET)])
    for future in (alice.incremental_alter_configs([res])[res],
                   alice.create_partitions([NewPartitions("sec-cfg", 2)])["sec-cfg"],
                   *alice.delete_records([TopicPartition("sec-cfg", 0, 0)]).values()):
        assert _refusal(future).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wait_until(lambda: "principal=alice api=INCREMENTAL_ALTER_CONFIGS roles=client "
               "needs=admin" in gw.log_text(), "the refusal logged")
    root.incremental_alter_configs([res])[res].result(BOUND_S)
    assert _configs(alice, "sec-cfg")["retention.ms"].value == "5000"


def test_a_deleted_topic_is_not_auto_created_again_by_the_deleting_clients_refresh(
        kafka_cluster: KafkaCluster) -> None:
    """A client that may auto-create topics and knows the one it deletes refreshes its
    metadata right after DeleteTopics; that refresh must not bring the topic back
    (librdkafka's test 0033 deletes its topics through such a consumer). An explicit
    CreateTopics recreates it at once."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import NewTopic

    admin = _admin(kafka_cluster)
    admin.create_topics([NewTopic("deleted-stays", 2)])["deleted-stays"].result(BOUND_S)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    assert "deleted-stays" in producer.list_topics("deleted-stays", timeout=BOUND_S).topics
    admin.delete_topics(["deleted-stays"])["deleted-stays"].result(BOUND_S)
    seen = producer.list_topics("deleted-stays", timeout=BOUND_S).topics["deleted-stays"]
    assert seen.error is not None and seen.error.code() == \
        KafkaError.UNKNOWN_TOPIC_OR_PART, seen.error
    assert "deleted-stays" not in admin.list_topics(timeout=BOUND_S).topics
    admin.create_topics([NewTopic("deleted-stays", 3)])["deleted-stays"].result(BOUND_S)
    assert len(admin.list_topics(timeout=BOUND_S).topics["deleted-stays"].partitions) == 3


def _exists(cluster: KafkaCluster, ledger_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Those of ``ledger_ids`` still on the bookies' metadata."""
    async def read() -> tuple[int, ...]:
        async with ledgerd.open_client(cluster.zk) as client:
            out = []
            for lid in ledger_ids:
                try:
                    await client.ledger_metadata(lid)
                except ledgerd.NoSuchLedgerError:
                    continue
                out.append(lid)
            return tuple(out)
    return trio.run(read)


def test_segment_ms_rolls_by_age_and_dropped_ledgers_wait_file_delete_delay(
        kafka_cluster: KafkaCluster) -> None:
    """segment.ms below an hour (Kafka Streams' repartition topics use 10 minutes):
    each append to a ledger whose first record is older rolls it; DeleteRecords then
    drops the ledgers before the low watermark from the list at once, and they are
    deleted from the bookies file.delete.delay.ms later, not before."""
    from confluent_kafka import Producer, TopicPartition

    admin = _admin(kafka_cluster)
    # segment.ms 1: each acknowledged produce's round trip ages the ledger past it
    _create(admin, "fd-a", config={"segment.ms": "1", "file.delete.delay.ms": "4000"})
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0})
    for i in range(5):
        producer.produce("fd-a", value=b"r%d" % i, partition=0)
        assert producer.flush(BOUND_S) == 0
    before = _ledgers(kafka_cluster, "fd-a")
    # rolled by age (after the append that finds the ledger old): r0-r1, r2-r3, r4
    assert len(before) >= 3
    [(_, future)] = admin.delete_records([TopicPartition("fd-a", 0, 4)]).items()
    assert future.result(BOUND_S).low_watermark == 4
    dropped_at = time.monotonic()
    after = _ledgers(kafka_cluster, "fd-a")
    gone = tuple(lid for lid in before if lid not in after)
    assert len(gone) >= 2 and _exists(kafka_cluster, gone) == gone  # dropped, kept
    assert _first_read(kafka_cluster, "fd-a", 0) == 4
    _until("dropped ledgers deleted once file.delete.delay.ms passed",
           lambda: not _exists(kafka_cluster, gone))
    assert time.monotonic() - dropped_at >= 3.5  # not before the delay (4 s)
