"""Several gateways on one cluster: partitions and groups are shared out by rendezvous
hashing; a gateway that takes a partition over fences the previous writer, whose
clients are told NOT_LEADER_OR_FOLLOWER and retry at the new leader; nothing
acknowledged is lost or written twice when a gateway joins and when one is killed."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import ledgerd
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.gateway import _storage_error
from ledgerd.kafka.partitions import PartitionLog, PartitionSettings
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot, start_bookies
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.producer_proc import produce_through_faults, read_exactly_once
from tests.kafka.test_protocol import _batch

SETTINGS = PartitionSettings(3, 2, 2, 1 << 20, 1 << 20, 1 << 20)


async def test_a_new_writer_fences_the_old_one_and_continues_its_offsets(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    import trio

    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:
        old = PartitionLog(ca, "t", 0, SETTINGS, nursery)
        batches = [(h, raw) for h, raw in _split(_batch(3))]
        first = old.enqueue(batches, nursery)
        await first.done.wait()
        assert first.error is None and first.base_offset == 0
        new = PartitionLog(cb, "t", 0, SETTINGS, nursery)  # another gateway takes over
        await new.open_writer()
        assert new.next_offset == 3  # continues after what the old one acknowledged
        late = old.enqueue(batches, nursery)
        await late.done.wait()
        assert late.error is not None
        assert _storage_error(late.error) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert old.writer is None  # it gave the partition up
        mine = new.enqueue(batches, nursery)
        await mine.done.wait()
        assert mine.error is None and mine.base_offset == 3
        await new.release()  # closed: its last entry is readable by any gateway (LAC)
        records, hw = await old.read(0, 1 << 20)
        records += (await old.read(3, 1 << 20))[0]
        assert hw == 6 and records.count(b"k2") == 2
        nursery.cancel_scope.cancel()


def _split(raw: bytes) -> list[tuple[object, bytes]]:
    from ledgerd.kafka.records import split_batches
    return split_batches(raw, max_batch_bytes=1 << 20)  # type: ignore[return-value]


@pytest.fixture
def two_gateway_cluster(zookeeper: ZooKeeperServer, tmp_path: Path):  # type: ignore[no-untyped-def]
    with fresh_chroot(zookeeper, "two_gateways") as zk:
        env = {"LEDGERD_ZK_TIMEOUT_MS": "4000"}
        a = GatewayProcess(zk, tmp_path / "a.log", env=env)
        with running_cluster(tmp_path, zk, 4, a) as cluster:
            b = GatewayProcess(zk, tmp_path / "b.log", env=env)
            try:
                yield cluster, a, b
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)


def test_a_gateway_joining_then_one_killed_during_produce(two_gateway_cluster) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient, NewTopic

    _, a, b = two_gateway_cluster
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    admin.create_topics([NewTopic("shared", num_partitions=8)])["shared"].result(60)

    def faults(n: int) -> None:
        if n == 300 and not b.running:
            b.start()  # takes over about half of the partitions
        if n == 1500 and a.running:
            a.stop(signal.SIGKILL)  # then b writes them all

    acked = produce_through_faults(f"{a.bootstrap},{b.bootstrap}", "shared", 3000, faults)
    assert "kafka_partition_moved" in a.log_text()  # a gave partitions up to b
    read_exactly_once(b.bootstrap, "shared", 8, acked)
