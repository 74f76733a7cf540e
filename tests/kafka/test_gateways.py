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
from ledgerd.kafka.partitions import PartitionLog, PartitionSettings
from ledgerd.kafka.storage_errors import storage_error_code
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
        assert storage_error_code(late.error) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert old.writer is None  # it gave the partition up
        mine = new.enqueue(batches, nursery)
        await mine.done.wait()
        assert mine.error is None and mine.base_offset == 3
        await new.release()  # closed: its last entry is readable by any gateway (LAC)
        records, hw = await old.read(0, 1 << 20)
        records += (await old.read(3, 1 << 20))[0]
        assert hw == 6 and records.count(b"k2") == 2
        nursery.cancel_scope.cancel()


def _idempotent(seq: int, *, epoch: int = 0, pid: int = 7, n: int = 2,
                ) -> list[tuple[object, bytes]]:
    """One batch of ``n`` records from producer ``pid`` at ``epoch``, sequence ``seq``."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"<s%d>" % (seq + i),
                 headers=[])
    return _split(bytes(b.build()))


async def test_idempotent_producers_keep_their_order_and_a_full_queue_holds_back(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """Kafka's broker rules for idempotent producers: a retry is answered with its first
    offset (also when its first copy is still queued), a gap or an old epoch is refused
    and nothing is written, a new epoch starts at 0, an unknown producer is taken at any
    sequence; a gateway taking over reads the rules' state back from the log. And a full
    produce queue holds a request back until the appender takes its group."""
    import trio

    gap, old = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH
    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:

        async def produce(part: PartitionLog, *items: list[tuple[object, bytes]],
                          ) -> list[tuple[int, int]]:
            """Queue all at once (one group append); (error code, base offset) each."""
            queued = [part.enqueue(batches, nursery) for batches in items]  # type: ignore[arg-type]
            for q in queued:
                await q.done.wait()
                assert q.error is None
            return [(q.code, q.base_offset) for q in queued]

        a = PartitionLog(ca, "seq", 0, SETTINGS, nursery)
        assert await produce(a, _idempotent(0)) == [(0, 0)]  # sequences 0-1 at offsets 0-1
        assert await produce(a, _idempotent(3)) == [(gap, -1)]  # 2 is missing
        assert await produce(a, _idempotent(2), _idempotent(2)) == [(0, 2), (0, 2)]  # a retry
        assert await produce(a, _idempotent(0)) == [(0, 0)]  # an old retry: not written again
        assert await produce(a, _idempotent(4, epoch=1)) == [(gap, -1)]  # a new epoch: from 0
        assert await produce(a, _idempotent(0, epoch=1)) == [(0, 4)]
        assert await produce(a, _idempotent(4, epoch=0)) == [(old, -1)]
        assert await produce(a, _idempotent(100, pid=8)) == [(0, 6)]  # not known: taken
        assert a.acked_end == 8

        b = PartitionLog(cb, "seq", 0, SETTINGS, nursery)  # another gateway takes over
        await b.open_writer()
        assert await produce(b, _idempotent(0, epoch=1)) == [(0, 4)]
        assert await produce(b, _idempotent(3, epoch=1), _idempotent(2, epoch=1)) == [
            (gap, -1), (0, 8)]
        assert await produce(b, _idempotent(102, pid=8)) == [(0, 10)]
        records, offset, hw = b"", 0, await b.high_watermark()
        assert hw == 12
        while offset < hw:  # a read stops at a ledger's end
            got, _ = await b.read(offset, 1 << 20)
            records += got
            offset = _split(got)[-1][0].next_offset  # type: ignore[attr-defined]
        assert [records.count(b"<s%d>" % i) for i in (0, 1, 2, 3, 100, 101, 102, 103)] == [
            2, 2, 2, 2, 1, 1, 1, 1]  # each batch once (epochs 0 and 1 both wrote s0-s3)

        # max_append_bytes 100: the queue holds 800 bytes, or one request when empty
        small = PartitionLog(ca, "room", 0, PartitionSettings(3, 2, 2, 1 << 20, 0, 100),
                             nursery)
        big = _split(_batch(40))
        size = len(big[0][1])
        assert size > 800
        small.appending = True  # the appender held back: the queue stays full
        first = small.enqueue(big, nursery)  # type: ignore[arg-type]
        assert not await small.wait_for_room(size, trio.current_time())  # full, no time
        assert small.queued_bytes == size
        nursery.start_soon(small._append_loop)
        deadline = trio.current_time() + 30
        assert await small.wait_for_room(size, deadline)
        assert trio.current_time() < deadline  # woken when the appender took the group,
        assert small.queued_bytes == 0  # not let through by the deadline
        second = small.enqueue(big, nursery)  # type: ignore[arg-type]
        for q in (first, second):
            await q.done.wait()
        assert (first.base_offset, second.base_offset) == (0, 40)
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
    # a gave partitions up to b (the whole log: more than the tail may follow that line)
    assert "kafka_partition_moved" in a.log_path.read_text(errors="replace")
    read_exactly_once(b.bootstrap, "shared", 8, acked)
