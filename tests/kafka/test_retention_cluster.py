"""Retention on a real cluster. Partitions nobody uses: after a gateway restart, a
partition no client produces to or fetches from still gets its retention and its
compaction (as a Kafka broker's retention and cleaner cover every log it leads), every
``retention_check_interval_ms``, and the ledgers retention dropped are deleted once
``file.delete.delay.ms`` is over, by that same round. The log's end: retention past
every record never lets a new writer start the offsets again at 0."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.errors import NoSuchLedgerError
from ledgerd.kafka.partitions import log_name
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, KafkaCluster, running_cluster
from tests.kafka.crash_kit import wait_until
from tests.kafka.test_compaction_cluster import _alter, _consume, _create, _metric, _produce

BOUND_S = 60  # every wait below is bounded; reaching it fails the test
TOPIC = "idle-retention"


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[KafkaCluster]:
    base = tmp_path_factory.mktemp("kafka-retention")
    with fresh_chroot(zookeeper, "kafka-retention") as zk:
        gateway = GatewayProcess(zk, base / "gateway.log",
                                 env={"LEDGERD_RETENTION_CHECK_INTERVAL_MS": "1000",
                                      "LEDGERD_COMPACTION_BACKOFF_MS": "200"})
        with running_cluster(base, zk, 3, gateway) as c:
            yield c


def _log_record(zk: str, topic: str = TOPIC) -> Any:
    async def get() -> Any:
        async with ledgerd.open_client(zk) as client:
            record, _ = await client.logs.store.get(log_name(topic, 0))
            return record
    return trio.run(get)


def _deleted(zk: str, ledgers: list[int]) -> list[int]:
    async def check() -> list[int]:
        gone = []
        async with ledgerd.open_client(zk) as client:
            for lid in ledgers:
                try:
                    await client.ledger_metadata(lid)
                except NoSuchLedgerError:
                    gone.append(lid)
        return gone
    return trio.run(check)


def test_retention_reaches_a_partition_nobody_uses_after_a_restart(
        cluster: KafkaCluster) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, config={"file.delete.delay.ms": "2000"})]
                        )[TOPIC].result(BOUND_S)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(48):  # 4.8 MB: ledgers roll every MiB (the tests' log_roll_bytes)
        producer.produce(TOPIC, value=b"%06d" % i + bytes(100_000 - 6), partition=0)
        producer.poll(0)
    assert producer.flush(BOUND_S) == 0
    cluster.gateway.restart()  # nothing of the partition is in use on the new one
    before = list(_log_record(cluster.zk).ledgers)
    assert len(before) >= 3, before
    resource = ConfigResource("topic", TOPIC, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(BOUND_S)

    # the closed ledgers are dropped (the last, open one stays), then deleted once due
    after = wait_until(
        lambda: (r := _log_record(cluster.zk)).ledgers == tuple(before[-1:]) and r,
        "retention drops the closed ledgers")
    assert sorted(lid for lid, _ in after.deferred) == sorted(before[:-1])
    wait_until(lambda: not _log_record(cluster.zk).deferred,
               "the dropped ledgers are deleted once file.delete.delay.ms is over")
    assert _deleted(cluster.zk, before[:-1]) == before[:-1]
    assert _deleted(cluster.zk, before[-1:]) == []
    assert "kafka_retention_deferred" not in cluster.gateway.log_text()


def test_compaction_reaches_a_partition_nobody_uses_after_a_restart(
        cluster: KafkaCluster) -> None:
    topic = "idle-compacted"
    _create(cluster.bootstrap, topic, {"cleanup.policy": "compact",
                                       "min.cleanable.dirty.ratio": "0.01",
                                       "min.compaction.lag.ms": "3600000"})
    # 10 keys x 12 rounds of 20 kB over several ledgers (1 MiB each), then filler so
    # that all of it is in closed ledgers
    rounds: list[tuple[bytes | None, bytes | None]] = [
        (b"k%d" % k, b"%d:%d:" % (k, r) + bytes(20_000)) for r in range(12) for k in range(10)]
    filler: list[tuple[bytes | None, bytes | None]] = [
        (b"filler", b"f%d:" % i + bytes(20_000)) for i in range(60)]
    acked = _produce(cluster.bootstrap, topic, rounds + filler)
    assert all(err is None for _, _, err in acked), acked
    latest = {key: off for key, off, _ in acked}
    before = _log_record(cluster.zk, topic).ledgers
    cluster.gateway.restart()  # nothing of the partition is in use on the new one
    _alter(cluster.bootstrap, topic, {"min.compaction.lag.ms": "0"})
    wait_until(lambda: _metric(cluster.gateway, "ledgerd_kafka_compaction_records_removed") > 0,
               "a compaction pass over the unused partition")
    assert _log_record(cluster.zk, topic).ledgers != before  # replacements listed
    got = _consume(cluster.bootstrap, topic)
    keys = [k for _, k, _ in got if k != b"filler"]
    assert sorted(keys) == sorted(b"k%d" % k for k in range(10))  # one value each
    for offset, key, value in got:
        assert offset == latest[key] or key == b"filler", (offset, key)
        assert key == b"filler" or value.startswith(b"%d:11:" % int(key[1:]))


def _ten_one_at_a_time(bootstrap: str, topic: str) -> tuple[Any, list[int]]:
    """Produce before-0..9 to partition 0 one at a time (with segment.ms=1 each append
    rolls the ledger after it, so the last ledger is empty); returns the idempotent
    producer and the offsets acknowledged (-1 for a failure), which its later
    deliveries append to."""
    from confluent_kafka import Producer

    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": BOUND_S * 1000})
    for i in range(10):
        producer.produce(topic, value=b"before-%d" % i, partition=0,
                         on_delivery=lambda err, msg: offsets.append(
                             -1 if err else msg.offset()))
        assert producer.flush(BOUND_S) == 0
    assert offsets == list(range(10))
    return producer, offsets


def test_retention_past_every_record_keeps_the_offsets_going(cluster: KafkaCluster) -> None:
    """segment.ms=1 rolls the ledger right after each append, so the last ledger is
    empty; retention.ms then finds every closed ledger past it. The ledger with the last
    batch stays listed (found by an outside audit: all were dropped, and after a kill -9
    the next writer, finding no batch, gave the next record offset 0 again)."""
    from confluent_kafka import Consumer, TopicPartition

    topic = "retention-end"
    _create(cluster.bootstrap, topic, {"segment.ms": "1", "retention.ms": "3600000"})
    producer, offsets = _ten_one_at_a_time(cluster.bootstrap, topic)
    before = len(_log_record(cluster.zk, topic).ledgers)
    _alter(cluster.bootstrap, topic, {"retention.ms": "1"})
    wait_until(lambda: len(_log_record(cluster.zk, topic).ledgers) < before,
               "retention drops the ledgers before the last batch")
    cluster.gateway.stop(signal.SIGKILL)
    cluster.gateway.start()  # a new writer, which finds the log's end in what is listed
    producer.produce(topic, value=b"after", partition=0,
                     on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
    assert producer.flush(BOUND_S) == 0
    assert offsets[-1] == 10, offsets
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "re",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), BOUND_S)
        # the ledger of offset 9 kept (it may hold 8 too: a ledger rolls once its first
        # record is a millisecond old); nothing renumbered
        assert 0 < low <= 9 and high == 11, (low, high)
        # the drop recorded the end of the batches it took: the first one kept
        assert _log_record(cluster.zk, topic).mark == low
        consumer.assign([TopicPartition(topic, 0, low)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + BOUND_S
        while len(got) < 11 - low and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append((m.offset(), m.value()))
        assert got == [(o, b"before-%d" % o) for o in range(low, 10)] + [(10, b"after")]
    finally:
        consumer.close()


def test_the_log_mark_keeps_the_end_when_every_batch_is_dropped(
        cluster: KafkaCluster) -> None:
    """The second guard. Should a drop ever take every ledger that holds a batch (the
    first guard, keeping the last one listed, is bypassed here: the log is truncated
    directly, with the mark retention's drop records), the log's mark still holds the
    end: after a kill -9 the next writer goes on at 10, and the watermarks say so."""
    from confluent_kafka import Consumer, TopicPartition

    from ledgerd.kafka.partitions import PartitionLog
    from ledgerd.kafka.retention import dropped_end
    from tests.kafka.test_gateways import SETTINGS

    topic = "mark-end"
    _create(cluster.bootstrap, topic, {"segment.ms": "1"})
    producer, offsets = _ten_one_at_a_time(cluster.bootstrap, topic)

    async def drop_every_batch() -> int:
        async with ledgerd.open_client(cluster.zk) as client:
            part = PartitionLog(client, topic, 0, SETTINGS)
            ledgers = await part.ledgers()
            # the writer's ledger, rolled to right after the last append, holds nothing
            assert await part.holds_batch(ledgers[-1]) is not True
            mark = await dropped_end(part, ledgers[:-1])
            await client.logs.truncate(part.name, ledgers[-1], mark=mark)
            return mark

    assert trio.run(drop_every_batch) == 10
    cluster.gateway.stop(signal.SIGKILL)
    cluster.gateway.start()  # a new writer: no batch listed, only the mark
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "mark",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), BOUND_S) == (10, 10)
        producer.produce(topic, value=b"after", partition=0,
                         on_delivery=lambda err, msg: offsets.append(
                             -1 if err else msg.offset()))
        assert producer.flush(BOUND_S) == 0
        assert offsets[-1] == 10, offsets
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), BOUND_S) == (10, 11)
        consumer.assign([TopicPartition(topic, 0, 10)])
        deadline = time.monotonic() + BOUND_S
        got = None
        while got is None and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got = (m.offset(), m.value())
        assert got == (10, b"after")
    finally:
        consumer.close()
