"""The partition's in-memory time index (``TimeBlocks``) against a brute-force
reference: ListOffsets by time (the first record in offset order at or after the log
start that reaches the target) and MAX_TIMESTAMP (the first record at or after the log
start with the largest timestamp), over random ledgers of batches whose timestamps go
back and forth, entries crossing 64-entry blocks, LogAppendTime batches and log starts
inside ledgers. Then what it reads: one scan per ledger however many lookups come at
once, closed ledgers skipped by their largest timestamp, a log start inside a ledger
read as one block, not the ledger. Fake ledger handles, the real ``PartitionLog``."""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

import pytest
import trio

from ledgerd.kafka.partitions import PartitionLog
from ledgerd.kafka.records import BatchHeader
from tests.kafka.test_timestamps import _batch

BASE = 1_700_000_000_000


@dataclass
class _Entry:
    entry_id: int
    payload: bytes


class _Handle:
    def __init__(self, entries: list[bytes], closed: bool) -> None:
        self.entries = entries  # by entry id; a log header first, or not
        self.is_closed = closed
        self.last_add_confirmed = len(entries) - 1
        self.read_entries = 0

    async def read_batch(self, first: int, last: int) -> list[_Entry]:
        last = min(last, len(self.entries) - 1)
        self.read_entries += max(0, last - first + 1)
        await trio.lowlevel.checkpoint()  # others run meanwhile
        return [_Entry(i, self.entries[i]) for i in range(first, last + 1)]


def _log(ledgers: list[tuple[int, list[bytes]]], start: int = 0) -> PartitionLog:
    p = PartitionLog.__new__(PartitionLog)
    p.time_blocks, p.time_locks, p.ledger_max = OrderedDict(), {}, {}
    handles = {lid: _Handle([b"header"] * first + payloads, lid < len(ledgers) - 1)
               for lid, (first, payloads) in enumerate(ledgers)}
    firsts = {lid: first for lid, (first, _) in enumerate(ledgers)}
    p.floor = start

    async def ledgers_() -> list[int]:
        return list(handles)

    async def last_entry(lid: int, refresh: bool = True) -> int:
        return len(handles[lid].entries) - 1

    async def first_entry(lid: int) -> int:
        return firsts[lid]

    async def handle(lid: int) -> _Handle:
        return handles[lid]

    async def first_offset(lid: int) -> int | None:
        h = handles[lid]
        return None if len(h.entries) <= firsts[lid] else \
            BatchHeader.parse(h.entries[firsts[lid]]).base_offset

    async def start_offset() -> int:
        return p.floor

    async def listing() -> tuple[tuple[int, ...], int]:
        return tuple(await ledgers_()), 0  # the ledgers and the log's mark, one read

    for name, fn in (("_ledgers", ledgers_), ("_listing", listing),
                     ("_last_entry", last_entry),
                     ("_first_entry", first_entry), ("_handle", handle),
                     ("_first_offset", first_offset), ("start_offset", start_offset)):
        setattr(p, name, fn)
    p.test_handles = handles  # type: ignore[attr-defined]
    return p


def _random_log(rng: random.Random, nledgers: int, per_ledger: int,
                ) -> tuple[list[tuple[int, list[bytes]]], list[tuple[int, int]]]:
    """Ledgers of batches of 1-3 records (10% LogAppendTime), and every record's
    (offset, timestamp) as a consumer reads it."""
    ledgers, records, off = [], [], 0
    for _ in range(nledgers):
        payloads = []
        for _ in range(rng.randrange(0, per_ledger + 1)):
            stamps = [BASE + rng.randrange(0, 50) * 10 for _ in range(rng.randrange(1, 4))]
            lat = rng.random() < 0.1
            payloads.append(_batch(0, stamps, base_offset=off, log_append_time=lat))
            records += [(off + i, max(stamps) if lat else ts) for i, ts in enumerate(stamps)]
            off += len(stamps)
        ledgers.append((rng.choice([0, 1]), payloads))
    return ledgers, records


def _first_at(records: list[tuple[int, int]], target: int, start: int) -> tuple[int, int] | None:
    return next(((ts, o) for o, ts in records if o >= start and ts >= target), None)


def _latest(records: list[tuple[int, int]], start: int) -> tuple[int, int] | None:
    best = None
    for o, ts in records:
        if o >= start and (best is None or ts > best[0]):
            best = (ts, o)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_lookups_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    ledgers, records = _random_log(rng, rng.randrange(1, 5), rng.choice([3, 70, 200]))
    end = records[-1][0] + 1 if records else 0
    starts = sorted({0, end, rng.randrange(0, end + 1), rng.randrange(0, end + 1)})
    targets = [BASE - 1, BASE + 600] + [BASE + rng.randrange(0, 50) * 10 + d
                                        for d in (-5, 0, 5) for _ in range(5)]

    async def main() -> None:
        p = _log(ledgers)
        for start in starts:
            p.floor = start
            for target in targets:
                assert await p.offset_for_time(target) == _first_at(records, target, start)
            assert await p.offset_of_max_timestamp() == _latest(records, start)

    trio.run(main)


def test_one_scan_however_many_lookups_and_closed_ledgers_skipped() -> None:
    rng = random.Random(7)
    ledgers, records = _random_log(rng, 3, 300)

    async def main() -> None:
        p = _log(ledgers)
        handles = p.test_handles  # type: ignore[attr-defined]
        total = sum(len(h.entries) for h in handles.values())
        late = max(ts for _, ts in records) + 1  # later than everything: all is read
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(p.offset_for_time, late)
        assert sum(h.read_entries for h in handles.values()) <= total  # one scan each
        before = {lid: h.read_entries for lid, h in handles.items()}
        assert await p.offset_for_time(late) is None
        assert await p.offset_of_max_timestamp() == _latest(records, 0)
        # the closed ledgers are skipped by their largest timestamp or read one block
        for lid in list(handles)[:-1]:
            assert handles[lid].read_entries - before[lid] <= 2 * 64

    trio.run(main)


def test_a_log_start_inside_a_ledger_reads_a_block_not_the_ledger() -> None:
    rng = random.Random(11)
    ledgers, records = _random_log(rng, 1, 600)
    start = records[-10][0]

    async def main() -> None:
        p = _log(ledgers, start)
        (h,) = p.test_handles.values()  # type: ignore[attr-defined]
        assert await p.offset_of_max_timestamp() == _latest(records, start)
        read = h.read_entries
        for target in (BASE - 1, BASE + 250):
            assert await p.offset_for_time(target) == _first_at(records, target, start)
        assert await p.offset_of_max_timestamp() == _latest(records, start)
        assert h.read_entries - read <= 4 * 64

    trio.run(main)
