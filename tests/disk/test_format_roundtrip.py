"""Entry logs and index pages, round trip: every entry size (1 B to 64 KiB, many near
4096 multiples and the write buffer's end), batches and rolls at every point, and what
the writer laid down reads back record for record: through the writer, from the files
after a reopen, and through the inspection tool. The journal's own round trip is in
test_journal_format.py."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.disk.entrylog import (
    ENTRY_LOG_HEADER_SIZE,
    EntryLogger,
    inspect_entry_log,
    read_log_ledgers,
)
from ledgerd.disk.index import INDEX_HEADER_SIZE, LedgerCache, read_index_file
from ledgerd.tools.faults.payloads import payload_size

_counter = itertools.count()


def _entry(ledger: int, eid: int, size: int) -> bytes:
    """Entry bytes begin with the ledger and entry ids (the ledgers map reads them)."""
    return struct.pack(">qq", ledger, eid) + bytes([eid % 251]) * max(0, size - 16)


_sizes = st.one_of(
    st.builds(lambda k, d: max(16, k * 4096 + d - 8), st.integers(1, 16), st.integers(-16, 16)),
    st.integers(16, 64 * 1024),
)
_batches = st.lists(st.tuples(st.integers(0, 3), st.lists(_sizes, min_size=1, max_size=5)),
                    min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=_batches, limit=st.sampled_from([8 * 1024, 64 * 1024, 1 << 20]),
       buffer=st.sampled_from([4096, 16 * 1024]), sorted_adds=st.booleans())
def test_entry_logs_round_trip(tmp_path: Path, batches: list[tuple[int, list[int]]],
                               limit: int, buffer: int, sorted_adds: bool) -> None:
    d = tmp_path / f"e{next(_counter)}"
    logger = EntryLogger([d], log_size_limit=limit, write_buffer_size=buffer)
    logger.open()
    written: list[tuple[int, int, bytes]] = []  # (location, ledger, entry bytes)
    next_id = [0, 0, 0, 0]
    try:
        for ledger, sizes in batches:
            entries = []
            for size in sizes:
                entries.append(_entry(ledger, next_id[ledger], size))
                next_id[ledger] += 1
            if sorted_adds:
                locs = logger.add_sorted([(ledger, struct.unpack_from(">q", e, 8)[0], e)
                                          for e in entries])
            else:
                locs = logger.add_many(ledger, entries)
            written += [(loc, ledger, e) for loc, e in zip(locs, entries, strict=True)]
            # Readable at once, from the buffer or the writer's pending writes.
            for loc, _, e in written[-len(entries):]:
                assert logger.read(loc) == e
        logger.flush()
        for loc, _, e in written:
            assert logger.read(loc) == e
    finally:
        logger.close()
    reopened = EntryLogger([d], log_size_limit=limit, write_buffer_size=buffer)
    reopened.open()
    try:
        for loc, _, e in written:
            assert reopened.read(loc) == e
    finally:
        reopened.close()
    # The inspection tool lists every record of every file, in order, and nothing else
    # but the ledgers map a rolled log ends with.
    by_log: dict[int, list[tuple[int, int, bytes]]] = {}
    for loc, ledger, e in written:
        by_log.setdefault(loc >> 32, []).append((loc & 0xFFFFFFFF, ledger, e))
    for log_id, recs in by_log.items():
        path = d / "current" / f"{log_id:x}.log"
        lmap, problem, items = inspect_entry_log(path)
        listed = [(r.offset, r.ledger_id, r.size) for r in items if r.crc_ok]
        expected = [(off, ledger, len(e)) for off, ledger, e in recs]
        assert listed[:len(expected)] == expected
        assert recs[0][0] == ENTRY_LOG_HEADER_SIZE
        assert not problem
        if lmap is not None:  # rolled: the map counts each ledger's bytes in this log
            assert listed[len(expected):] == [(listed[-1][0], -1, listed[-1][2])]
            sizes: dict[int, int] = {}
            for _, ledger, e in recs:
                sizes[ledger] = sizes.get(ledger, 0) + len(e) + 8
            assert lmap == sizes
            both = read_log_ledgers(path)
            assert both is not None and both[1] == {
                ledger: max(struct.unpack_from(">q", e, 8)[0] for _, lg, e in recs if lg == ledger)
                for ledger in sizes}
        else:
            assert len(listed) == len(expected)


@pytest.mark.parametrize("page_size", [512, 4096])
def test_index_pages_round_trip(tmp_path: Path, page_size: int) -> None:
    """Locations set one by one, in runs and sparsely, across every page boundary and
    with a cache smaller than the ledger (so pages are evicted and read back), come
    back from the cache and from the index files after a reopen."""
    rnd = random.Random(page_size)
    per_page = page_size // 8
    cache = LedgerCache([tmp_path], page_size=page_size, page_limit=3)
    expected: dict[tuple[int, int], int] = {}
    for ledger in (1, 2, 300):
        eid = 0
        while eid < per_page * 6:
            kind = rnd.randrange(3)
            if kind == 0:
                loc = rnd.randrange(1, 1 << 62)
                cache.set_location(ledger, eid, loc)
                expected[ledger, eid] = loc
                eid += 1
            elif kind == 1:
                n = rnd.choice([1, per_page - 1, per_page, per_page + 1, rnd.randrange(1, 40)])
                locs = [rnd.randrange(1, 1 << 62) for _ in range(n)]
                cache.set_locations(ledger, eid, locs)
                expected.update({(ledger, eid + i): loc for i, loc in enumerate(locs)})
                eid += n
            else:
                ids = sorted(rnd.sample(range(eid, eid + 3 * per_page), 5))
                locs = [rnd.randrange(1, 1 << 62) for _ in ids]
                cache.set_sparse_locations(ledger, ids, locs)
                expected.update({(ledger, i): loc for i, loc in zip(ids, locs, strict=True)})
                eid = ids[-1] + 1
        for (lg, e), loc in expected.items():
            if lg == ledger:
                assert cache.location(lg, e) == loc
        cache.get_or_create(ledger).fenced = ledger == 2
        cache.dirty(cache.get_or_create(ledger))
    cache.flush()
    cache.close()
    for ledger in (1, 2, 300):
        state, raw = read_index_file(cache.ledgers[ledger].path)
        assert state.ledger_id == ledger and state.fenced == (ledger == 2)
        for (lg, e), loc in expected.items():
            if lg == ledger:
                assert struct.unpack_from(">q", raw, 8 * e)[0] == loc, (ledger, e)
        last = max(e for lg, e in expected if lg == ledger)
        assert len(raw) >= 8 * (last + 1) and INDEX_HEADER_SIZE == 1024
    again = LedgerCache([tmp_path], page_size=page_size, page_limit=2)
    again.load_all()
    for (lg, e), loc in expected.items():
        assert again.location(lg, e) == loc
    absent = [(lg, e) for lg in (1, 2, 300) for e in range(per_page * 6) if (lg, e) not in expected]
    for lg, e in absent[:200]:
        assert again.location(lg, e) == 0
    again.close()


def test_payload_sizes_cover_block_ends_and_the_whole_range() -> None:
    rnd = random.Random(1)
    sizes = [payload_size(rnd) for _ in range(20_000)]
    assert min(sizes) >= 1 and max(sizes) <= 64 * 1024
    ends = [(s + 61) % 4096 for s in sizes]
    near = sum(1 for r in ends if r >= 4096 - 16 or r <= 16)
    assert near > 8000  # about half end a journal record within 16 bytes of a boundary
    assert sum(1 for s in sizes if s < 100) > 500 and sum(1 for s in sizes if s > 32768) > 1000
