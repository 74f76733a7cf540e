"""A partition's reads and walks over its ledger list, driven by fakes: walks read
the list again when compaction swapped a ledger (the first two, written by a
fresh-eyes review of 54a6479, failed there), a read stops below the high watermark,
and the log start of a log with no batch seen is its mark."""
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


def test_a_read_never_returns_a_batch_at_or_past_the_high_watermark() -> None:
    """The ledgers may hold batches past the high watermark (the writer's LAC runs
    ahead of what its producers were told; a follower's LAC moves on after its high
    watermark was read): a consumer handed one fetches next past the high watermark
    and is told OFFSET_OUT_OF_RANGE (found by an outside audit). A read stops below it."""
    part = _walking_part(_swapping_listing((1,), (1,)), {})
    b0 = _batch(0, [(b"k", b"v", i) for i in range(3)], base_offset=0)
    b3 = _batch(0, [(b"k", b"v", i) for i in range(3)], base_offset=3)

    async def read_once(offset: int, max_bytes: int, min_one: bool) -> tuple[bytes, int]:
        return b0 + b3, 3  # b3 is in the ledger, past the high watermark read first

    part._read_once = read_once
    assert trio.run(part.read, 0, 1 << 20) == (b0, 3)


def test_the_log_start_of_a_log_with_no_batch_seen_is_its_mark_not_a_later_end() -> None:
    """A walk that sees no batch (an open ledger whose LAC has not moved yet) answers
    the log start from what it saw, not from a high watermark read after it, which may
    count batches that landed meanwhile (found by an outside audit: a gateway not
    leading the partition answered ListOffsets earliest 206 for a log starting at 0)."""
    part = _walking_part(_swapping_listing((1,), (1,)), {})

    async def first_offset(lid: int) -> None:
        return None

    async def high_watermark() -> int:
        return 206

    part._first_offset = first_offset
    part.high_watermark = high_watermark
    assert trio.run(part.start_offset) == 0
