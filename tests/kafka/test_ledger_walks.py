"""Walks over a partition's ledger list while compaction swaps a ledger (written by a
fresh-eyes review of 54a6479, which found these two walks still passing over one; both
failed there): ListOffsets' max timestamp and a new writer's producer state read the
list again instead."""
from __future__ import annotations

from types import SimpleNamespace

import trio

from ledgerd.errors import NoSuchLedgerError
from tests.kafka.test_compaction import _batch
from tests.kafka.test_topic_configs import _swapping_listing, _walking_part


def test_max_timestamp_walks_again_when_compaction_swaps_a_ledger() -> None:
    """ListOffsets MAX_TIMESTAMP (-3): ledger 1 (offsets 0..9, the largest timestamp)
    is swapped for 3 (same offsets) and deleted while the walk runs. The answer must
    be the record in 3, not ledger 2's smaller maximum."""
    part = _walking_part(_swapping_listing((1, 2), (3, 2)), {})
    latest = {3: (0, 999), 2: (10, 500)}  # ledger -> (offset, timestamp) of its max

    async def start_offset() -> int:
        return 0

    async def below_start(ledgers: list[int], i: int, start: int) -> bool:
        return False

    async def latest_in(lid: int, start: int, best: tuple[int, int] | None,
                        ) -> tuple[int, int]:
        if lid not in latest:
            raise NoSuchLedgerError(lid)
        mine = latest[lid]
        return mine if best is None or mine[1] > best[1] else best

    part.start_offset = start_offset
    part._below_start = below_start
    part._latest_in = latest_in
    assert trio.run(part.offset_of_max_timestamp) == (999, 0)


def test_producer_state_walks_again_when_compaction_swaps_the_last_ledger() -> None:
    """A new writer (its ledger 9) rebuilds producer state; ledger 2, holding the
    producer's latest batch (seq 5..9 at offsets 10..14), is swapped for 3 and deleted
    meanwhile. Skipping it leaves seq 0..4 as the last known: the producer's retry of
    seq 5 (lost ack) is then not seen as a duplicate and is written again."""
    b1 = _batch(0, [(b"k", b"v", i) for i in range(5)], base_offset=0, pid=7, epoch=0,
                seq=0)
    b2 = _batch(0, [(b"k", b"v", i) for i in range(5)], base_offset=10, pid=7, epoch=0,
                seq=5)
    entries = {1: [b1], 3: [b2]}
    part = _walking_part(_swapping_listing((1, 2, 9), (1, 3, 9)), {})

    async def last_entry(lid: int, **_: object) -> int:
        if lid not in entries:
            raise NoSuchLedgerError(lid)
        return len(entries[lid]) - 1

    async def first_entry(lid: int) -> int:
        return 0

    async def handle(lid: int) -> SimpleNamespace:
        if lid not in entries:
            raise NoSuchLedgerError(lid)

        async def read_batch(lo: int, hi: int) -> list[SimpleNamespace]:
            return [SimpleNamespace(payload=p, entry_id=i)
                    for i, p in enumerate(entries[lid]) if lo <= i <= hi]
        return SimpleNamespace(read_batch=read_batch)

    part._last_entry = last_entry
    part._first_entry = first_entry
    part._handle = handle
    trio.run(part._rebuild_producers, 9)
    assert part.producers.duplicate((7, 0, 5, 9)) == 10
