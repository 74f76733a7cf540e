"""A partition taken over from a writer that died, in one process with real bookies
(``PartitionLog`` driven directly, each "gateway" its own client): the leader's high
watermark and next offset follow the dead writer's last acknowledged batch, not the
LAC its bookies hold (one entry short: the LAC rides on the next add); a follower never
keeps a view of the ledger from before its recovery; a writer that may no longer lead,
or that another took the log over from, writes nothing and answers no stale sequence
error; a reset forgets the producers' sequences, which come back from the log."""

from __future__ import annotations

from collections.abc import Callable

import trio

import ledgerd
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.partitions import PartitionLog, PartitionSettings
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies
from tests.kafka.test_gateways import _idempotent, _split
from tests.kafka.test_protocol import _batch

SETTINGS = PartitionSettings(3, 2, 2, 1 << 20, 1 << 20, 1 << 20)


async def _leads() -> bool:
    return True


async def test_the_leader_and_followers_report_a_dead_writers_end_not_its_lac(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 3)
    # the dead writer never writes its LAC explicitly: the bookies' LAC stays one short
    async with ledgerd.open_client(zk_chroot, explicit_lac_interval_ms=0) as ca, \
            ledgerd.open_client(zk_chroot) as cb, ledgerd.open_client(zk_chroot) as cc, \
            trio.open_nursery() as nursery:
        dead = PartitionLog(ca, "t", 0, SETTINGS, nursery)
        for _ in range(3):
            item = dead.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
            await item.done.wait()
            assert item.error is None
        assert dead.acked_end == 6  # then its gateway dies: the ledger stays OPEN
        follower = PartitionLog(cc, "t", 0, SETTINGS, nursery)
        # before anyone recovered the ledger, a follower's lower bound (the LAC)
        assert await follower.high_watermark() == 4
        leader = PartitionLog(cb, "t", 0, SETTINGS, nursery, authority=_leads)
        assert await leader.high_watermark() == 6  # the tail recovered first
        follower._remote_end = None  # (its 50 ms memory of the last answer)
        # the follower's handle was opened before the recovery: it is re-read, not
        # asked for the bookies' LAC (still one short after a recovery)
        assert await follower.high_watermark() == 6
        records, hw = await follower.read(4, 1 << 20)
        assert hw == 6 and _split(records)[-1][0].next_offset == 6  # type: ignore[attr-defined]
        item = leader.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.error is None and item.base_offset == 6
        nursery.cancel_scope.cancel()


async def test_a_new_writer_after_a_reader_cached_the_dead_writers_ledger(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """The issue's one-gateway reproduction, in one process: the partition is read (its
    high watermark asked, which opened the dead writer's ledger without recovery)
    before its first write; the writer's first offset used to come from that handle."""
    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot, explicit_lac_interval_ms=0) as ca, \
            ledgerd.open_client(zk_chroot) as cb, trio.open_nursery() as nursery:
        dead = PartitionLog(ca, "t", 0, SETTINGS, nursery)
        for _ in range(3):
            item = dead.enqueue(_split(_batch(1)), nursery)  # type: ignore[arg-type]
            await item.done.wait()
        fresh = PartitionLog(cb, "t", 0, SETTINGS, nursery)  # no authority: reads first
        assert await fresh.high_watermark() == 2  # a follower's lower bound
        item = fresh.enqueue(_split(_batch(1)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.error is None and item.base_offset == 3  # not 2, given twice
        assert await fresh.high_watermark() == 4
        nursery.cancel_scope.cancel()


async def test_a_writer_that_may_not_lead_or_was_taken_over_answers_no_stale_sequence(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:
        allowed = True

        async def authority() -> bool:
            return allowed

        async def produce(part: PartitionLog, batches: list[tuple[object, bytes]],
                          ) -> tuple[int, int]:
            """(error code, base offset)."""
            q = part.enqueue(batches, nursery)  # type: ignore[arg-type]
            await q.done.wait()
            code = storage_error_code(q.error) if q.error is not None else q.code
            return code, q.base_offset

        a = PartitionLog(ca, "t", 0, SETTINGS, nursery, authority=authority)
        assert await produce(a, _idempotent(0)) == (0, 0)
        allowed = False  # its lease lapsed and could not be confirmed
        assert await produce(a, _idempotent(2)) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
        allowed = True
        b = PartitionLog(cb, "t", 0, SETTINGS, nursery)  # another gateway takes over
        await b.open_writer()
        assert await produce(b, _idempotent(2)) == (0, 2)
        # a's producer state says 0-1 were last: 4 looks like a gap, but a has not
        # touched the bookies to learn it was fenced; it must not answer
        # OUT_OF_ORDER_SEQUENCE_NUMBER (fatal to librdkafka) from that state
        assert await produce(a, _idempotent(4)) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
        assert a.writer is None and not a.producers
        await b.release()
        # a leads again: its state comes back from the log, where b wrote 2-3
        assert await produce(a, _idempotent(4)) == (0, 4)
        assert await produce(a, _idempotent(2)) == (0, 2)  # b's batch, retried: not again
        generation = a.generation
        await a.reset("session lost")  # drops the writer and the producers at once
        assert a.writer is None and not a.producers and a.generation > generation
        assert await produce(a, _idempotent(6)) == (0, 6)
        assert await a.high_watermark() == 8
        nursery.cancel_scope.cancel()


async def test_a_log_of_ledgers_without_headers_then_with_them_reads_as_one(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """Older data: a partition log whose first ledger was written before headers (its
    batches from entry 0), then a ledger this gateway adds (entry 0 its log header, the
    topic in it; batches from entry 1). Every reader maps the same offsets: reads,
    locate, the start, timestamps, MAX_TIMESTAMP, epochs."""
    from ledgerd.kafka.records import BatchHeader, with_base_offset
    from ledgerd.metadata.kafka_topics import TopicOrigin, TopicRecord, topic_origin
    from ledgerd.metadata.logheader import decode_log_header, first_log_entry

    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:
        old = await ca.logs.open_writer("kafka.mixed.0", 3, 2, 2, header=False)
        await old.append_many([with_base_offset(_batch(3), 0, old.epoch),
                               with_base_offset(_batch(3), 3, old.epoch)])
        await old.close()
        record = TopicRecord(partitions=1, topic_id="ab" * 16)
        new = PartitionLog(ca, "mixed", 0, SETTINGS, nursery)

        async def origin() -> bytes:
            return topic_origin("mixed", 0, record)
        new.origin = origin
        for _ in range(2):
            item = new.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
            await item.done.wait()
            assert item.error is None
        assert new.acked_end == 10
        first, second = await ca.logs.ledgers("kafka.mixed.0")
        md = await ca.ledger_metadata(second)
        assert first_log_entry(md.custom_metadata) == 1
        assert first_log_entry((await ca.ledger_metadata(first)).custom_metadata) == 0
        assert new.writer is not None and new.writer.ledger_id == second
        rh = new.writer.handle  # (open: a reader's LAC lags the writer's)
        header = decode_log_header((await rh.read_batch(0, 0))[0].payload)
        assert header is not None and header.writers == 2
        assert TopicOrigin.from_extra(header.extra) == TopicOrigin(topic="mixed", partition=0,
                                                                   record=record)
        assert BatchHeader.parse((await rh.read_batch(1, 1))[0].payload).base_offset == 6
        await new.release()  # closed: another gateway reads it to its end
        reader = PartitionLog(cb, "mixed", 0, SETTINGS, nursery)
        assert await reader.high_watermark() == 10 and await reader.start_offset() == 0
        assert [await reader.locate(o) for o in (0, 4, 6, 9)] == [
            (first, 0), (first, 1), (second, 1), (second, 2)]
        offsets = []
        at = 0
        while at < 10:
            raw, _ = await reader.read(at, 1 << 20)
            batches = _split(raw)
            offsets += [h.base_offset for h, _ in batches]  # type: ignore[attr-defined]
            at = batches[-1][0].next_offset  # type: ignore[attr-defined]
        assert offsets == [0, 3, 6, 8]
        assert await reader.offset_for_time(1_700_000_000_001) == (1_700_000_000_001, 1)
        assert await reader.offset_of_max_timestamp() == (1_700_000_000_002, 2)
        assert [o for _, o in await reader.epoch_starts()] == [0, 6]
        assert (await reader.ledger_summary(second))[1] == 1_700_000_000_001
        nursery.cancel_scope.cancel()


async def test_a_gateway_told_not_to_write_headers_writes_batches_from_entry_0(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    """``gateway_log_headers = false`` (a rolling upgrade from gateways that cannot read
    headers): the partition's new ledger has no header, its first batch is entry 0, as
    an older gateway reads it."""
    from dataclasses import replace

    from ledgerd.kafka.records import BatchHeader
    from ledgerd.metadata.logheader import first_log_entry

    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as client, trio.open_nursery() as nursery:
        part = PartitionLog(client, "old", 0, replace(SETTINGS, log_headers=False), nursery)
        item = part.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.error is None and part.writer is not None
        lid = part.writer.ledger_id
        assert first_log_entry((await client.ledger_metadata(lid)).custom_metadata) == 0
        first = (await part.writer.handle.read_batch(0, 0))[0].payload
        assert BatchHeader.parse(first).base_offset == 0
        await part.release()
        nursery.cancel_scope.cancel()
