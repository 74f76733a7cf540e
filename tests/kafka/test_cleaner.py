"""The cleaner (``ledgerd/kafka/cleaner.py``) in one process with real bookies and
ZooKeeper, ``PartitionLog`` driven directly, each "gateway" its own client: a pass
replaces the ledgers that lose records and another gateway that read the old ledgers
(its remembered positions and handles now point at deleted ledgers) serves the
compacted log at the same offsets; the writer writes on, and its producer state
survives a batch compaction emptied."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import trio

import ledgerd
from ledgerd.kafka.cleaner import CleanerState, clean
from ledgerd.kafka.partitions import PartitionLog, PartitionSettings
from ledgerd.kafka.records import HEADER_SIZE, BatchHeader, record_spans
from ledgerd.kafka.timestamps import records_of
from ledgerd.kafka.topic_configs import TopicPolicy
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies
from tests.kafka.test_compaction import _batch
from tests.kafka.test_gateways import _split

# ledgers roll every ~2 KB: 6 rounds of 5 keys spread over many of them
SETTINGS = PartitionSettings(3, 2, 2, 2000, 0, 1 << 20, read_ahead_bytes=0)
POLICY = TopicPolicy(compact=True, delete=False, min_cleanable_dirty_ratio=0.0)


def _batches(data: bytes) -> list[tuple[BatchHeader, bytes]]:
    """The batches of a fetch's records, empty ones included (a produce would refuse
    those; compaction leaves them)."""
    out = []
    at = 0
    while at < len(data):
        h = BatchHeader.parse(data, at)
        out.append((h, data[at:at + h.length]))
        at += h.length
    return out


def _offsets(h: BatchHeader, raw: bytes) -> list[int]:
    body = records_of(h, memoryview(raw)[HEADER_SIZE:h.length])
    return [h.base_offset + r.offset_delta for r in record_spans(body, h.record_count)]


async def _read_all(part: PartitionLog, end: int) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record from offset 0, fetch after fetch."""
    out: list[tuple[int, bytes, bytes | None]] = []
    at = 0
    while at < end:
        data, _ = await part.read(at, 300)
        for h, raw in _batches(data):
            body = records_of(h, memoryview(raw)[HEADER_SIZE:h.length])
            for r in record_spans(body, h.record_count):
                value = None if r.is_tombstone else bytes(body[r.start:r.end])
                assert r.key is not None
                out.append((h.base_offset + r.offset_delta, r.key, value))
            at = h.next_offset
    return out


async def test_a_pass_replaces_ledgers_and_another_gateways_stale_reads_follow(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 3)
    with trio.fail_after(120):
        async with ledgerd.open_client(zk_chroot) as ca, \
                ledgerd.open_client(zk_chroot) as cb, trio.open_nursery() as nursery:
            leader = PartitionLog(ca, "t", 0, SETTINGS, nursery)
            latest: dict[bytes, int] = {}
            # producer 7 writes key 0's batches in rounds 0-5; a plain write of key 0
            # then supersedes its last one, so compaction empties every batch of it
            writes = [(k, r) for r in range(6) for k in range(5)] + [(0, 6)] + \
                [(k, 7 + r) for r in range(3) for k in range(1, 5)]
            for k, r in writes:
                pid = 7 if k == 0 and r < 6 else -1
                raw = _batch(0, [(b"k%d" % k, b"v%d" % r + b"x" * 200, 0)],
                             pid=pid, epoch=0 if pid >= 0 else -1,
                             seq=r if pid >= 0 else -1)
                item = leader.enqueue(_split(raw), nursery)  # type: ignore[arg-type]
                await item.done.wait()
                assert item.error is None and not item.code
                latest[b"k%d" % k] = item.base_offset
            end = leader.acked_end
            assert end == len(writes) and len(await leader.ledgers()) > 5
            follower = PartitionLog(cb, "t", 0, SETTINGS, nursery)
            while await follower.high_watermark() < end:  # the writer's LAC reaches it
                follower._remote_end = None
                await trio.sleep(0.05)
            before = await _read_all(follower, end)  # its caches: the old ledgers
            assert len(before) == len(writes)
            old = set(await leader.ledgers())
            result = await clean(ca, leader, POLICY, CleanerState(),
                                 now_ms=int(time.time() * 1000), map_entries=100,
                                 max_pass_s=60)
            assert result is not None and result.ledgers_replaced > 0
            assert result.records_removed > 0 and result.bytes_after < result.bytes_before
            now = set(await leader.ledgers())
            assert old - now and now - old  # some replaced, the last one never
            assert (await leader.ledgers())[-1] in old
            # the old ledgers' deletion waits file.delete.delay.ms (60 s by default) on
            # the log's record; until then they are there, then reap deletes them
            record, _ = await ca.logs.store.get(leader.name)
            due = max(at for _, at in record.deferred)
            assert {lid for lid, _ in record.deferred} == old - now
            assert due - time.time() * 1000 > 50_000 and leader.deferred_due_ms <= due
            for lid in old - now:
                assert (await ca.ledger_metadata(lid)).is_closed
            assert await ca.logs.reap(leader.name, now_ms=due - 60_000) == []
            assert sorted(await ca.logs.reap(leader.name, now_ms=due)) == sorted(old - now)
            for lid in old - now:  # the old ledgers are deleted
                try:
                    await ca.ledger_metadata(lid)
                    raise AssertionError(f"ledger {lid} still there")
                except ledgerd.NoSuchLedgerError:
                    pass
            # a position it remembers in a replaced ledger whose handle it no longer
            # holds (evicted): opening that ledger fails, the list is read again
            at = min(o for o, (lid, _) in follower.positions.items() if lid in old - now)
            for h in follower.handles.values():
                await h.close()
            follower.handles.clear()
            data, _ = await follower.read(at, 1 << 20)
            assert _batches(data)[0][0].base_offset == at  # from the replacement:
            got = [o for h, raw in _batches(data) for o in _offsets(h, raw)]
            assert set(got) <= set(latest.values())  # only the records kept
            # the follower, whose positions and handles name deleted ledgers, reads the
            # compacted log: each key's latest value at its offset, nothing lost
            after = await _read_all(follower, end)
            assert len(after) < len(before)
            seen = {k: o for o, k, _ in after}
            assert seen == latest
            # a fetch at an offset whose record went starts at the batch that held it
            data, _ = await follower.read(0, 1 << 20)
            first = _batches(data)[0][0]
            assert first.base_offset == 0
            # the writer writes on; producer 7's next sequence (6) is accepted after a
            # takeover that read its emptied batches back (their lastOffsetDelta, not
            # their record count 0, gives its last sequence: 5)
            fresh = PartitionLog(cb, "t", 0, SETTINGS, nursery)
            raw = _batch(0, [(b"k0", b"after", 0)], pid=7, epoch=0, seq=6)
            item = fresh.enqueue(_split(raw), nursery)  # type: ignore[arg-type]
            await item.done.wait()
            assert item.error is None and not item.code and item.base_offset == end
            nursery.cancel_scope.cancel()


async def test_a_failure_after_the_swap_keeps_the_listed_replacements(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With file.delete.delay.ms=0 the old ledgers are deleted right after the swap:
    a failure there (or a cancellation) must not make the pass's cleanup delete the
    replacements, which the log now lists and which hold the partition's records."""
    import dataclasses

    await start_bookies(bookie_factory, zk_chroot, 3)
    with trio.fail_after(120):
        async with ledgerd.open_client(zk_chroot) as ca, trio.open_nursery() as nursery:
            leader = PartitionLog(ca, "t", 0, SETTINGS, nursery)
            latest: dict[bytes, int] = {}
            for r in range(6):
                for k in range(5):
                    raw = _batch(0, [(b"k%d" % k, b"v%d" % r + b"x" * 200, 0)])
                    item = leader.enqueue(_split(raw), nursery)  # type: ignore[arg-type]
                    await item.done.wait()
                    assert item.error is None and not item.code
                    latest[b"k%d" % k] = item.base_offset
            end = leader.acked_end
            old = set(await leader.ledgers())
            real_delete = ca.delete_ledger

            async def failing(lid: int) -> None:
                if lid in old:
                    raise ledgerd.LedgerdError(f"bookies unreachable deleting {lid}")
                await real_delete(lid)
            monkeypatch.setattr(ca, "delete_ledger", failing)
            with pytest.raises(ledgerd.LedgerdError, match="bookies unreachable"):
                await clean(ca, leader, dataclasses.replace(POLICY, file_delete_delay_ms=0),
                            CleanerState(), now_ms=int(time.time() * 1000),
                            map_entries=100, max_pass_s=60)
            monkeypatch.setattr(ca, "delete_ledger", real_delete)
            now = await leader.ledgers()
            assert set(now) - old  # swapped: replacements listed
            for lid in now:  # every listed ledger is there
                assert (await ca.ledger_metadata(lid)).is_closed or lid == now[-1]
            await leader.forget_unlisted()
            seen = {k: o for o, k, _ in await _read_all(leader, end)}
            assert seen == latest
            nursery.cancel_scope.cancel()
