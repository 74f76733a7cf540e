"""Retention's check of which ledger holds the log's last batch
(``retention.last_holding``) and its compare-and-set (``Logs.truncate``) are not one
step: a writer's roll (segment.ms) closes the old ledger in between. Found by review:
the old ledger, open at the check, counted as empty, every ledger holding a batch was
dropped, and the next writer gave offset 0 again; an open ledger now counts as not
known, so the drop keeps it."""
from __future__ import annotations

from collections.abc import Callable

import trio

import ledgerd
from ledgerd.kafka import retention
from ledgerd.kafka.partitions import PartitionLog
from ledgerd.tools.bookieprocess import BookieProcess
from tests.cluster import start_bookies
from tests.kafka.test_gateways import SETTINGS, _split
from tests.kafka.test_protocol import _batch


async def test_roll_close_between_check_and_truncate(
        bookie_factory: Callable[..., BookieProcess], zk_chroot: str) -> None:
    await start_bookies(bookie_factory, zk_chroot, 3)
    async with ledgerd.open_client(zk_chroot) as ca, ledgerd.open_client(zk_chroot) as cb, \
            trio.open_nursery() as nursery:
        part = PartitionLog(ca, "t", 0, SETTINGS, nursery)
        item = part.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.error is None and item.base_offset == 0
        await part.writer.roll()  # segment.ms right after the append: [L1(A), L2]
        item = part.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.error is None and item.base_offset == 2
        # L2 holds B (the writer's LAC): L1, past retention, goes
        assert await retention.drop_front(ca, part, 5, "test") == 1
        l2 = part.writer.handle
        assert (await part.ledgers()) == (l2.ledger_id,)
        # the writer rolls again (segment.ms); its close of L2 is slow (a ZK write)
        gate = trio.Event()
        orig_close = l2.close

        async def slow_close() -> None:
            await gate.wait()
            await orig_close()
        l2.close = slow_close  # type: ignore[method-assign]
        nursery.start_soon(part.writer.roll)
        while len(await part.ledgers()) < 2:
            await trio.sleep(0.01)
        # retention's check sees L2 OPEN (counts as empty); the close lands just after
        orig_holds = part.holds_batch

        async def holds(lid: int) -> bool | None:
            got = await orig_holds(lid)
            if lid == l2.ledger_id:
                gate.set()
                while not (await ca.ledger_metadata(lid)).is_closed:
                    await trio.sleep(0.01)
            return got
        part.holds_batch = holds  # type: ignore[method-assign]
        dropped = await retention.drop_front(ca, part, 5, "test")
        assert dropped == 0, dropped
        # the gateway dies; the next writer elsewhere
        fresh = PartitionLog(cb, "t", 0, SETTINGS, nursery)
        item = fresh.enqueue(_split(_batch(2)), nursery)  # type: ignore[arg-type]
        await item.done.wait()
        assert item.base_offset == 4, item.base_offset
        nursery.cancel_scope.cancel()
