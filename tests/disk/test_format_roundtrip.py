"""Entry logs and index pages, round trip: every entry size (1 B to 64 KiB, many near
4096 multiples and the write buffer's end), batches and rolls at every point, and what
the writer laid down reads back record for record: through the writer, from the files
after a reopen, and through the inspection tool. The journal's own round trip is in
test_journal_format.py."""

from __future__ import annotations

import itertools
import random
import re
import struct
from pathlib import Path

import google_crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.disk import layouts
from ledgerd.disk.entrylog import (
    ENTRY_LOG_HEADER_SIZE,
    EntryLogger,
    _header,
    inspect_entry_log,
    read_log_ledgers,
)
from ledgerd.disk.index import (
    INDEX_HEADER_SIZE,
    LedgerCache,
    LedgerIndex,
    parse_index_header,
    read_index_file,
)
from ledgerd.disk.lastmark import read_last_mark, write_last_mark
from ledgerd.tools.faults.payloads import payload_size
from ledgerd.wire import layouts as wire_layouts
from ledgerd.wire.entry import entry_ids, entry_lac

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


# -- the declarations (disk/layouts.py) against the bytes the code wrote before them ------
#
# Old data directories must still open: each layout, built by construct from its
# declaration and packed by the derived struct codec, gives exactly the bytes the
# hand-written struct code wrote (kept here, verbatim, as the reference).

def _old_entry_log_header(log_id: int, map_offset: int, count: int) -> bytes:
    head = struct.pack(">4sHHQQI", b"LDEL", 1, 0, log_id, map_offset, count)
    return head + struct.pack(">I", google_crc32c.value(head)) + bytes(1024 - 28 - 4)


def _old_index_header(lid: int, term: int, fenced: bool, key: bytes, lac: bytes) -> bytes:
    head = struct.pack(">4sHHqqB20sH64s", b"LDIX", 1, 1 if fenced else 0, lid, term,
                       len(key), key.ljust(20, b"\0"), len(lac), lac.ljust(64, b"\0"))
    return head + struct.pack(">I", google_crc32c.value(head)) + bytes(1024 - 111 - 4)


def _old_last_mark(file_id: int, offset: int) -> bytes:
    body = struct.pack(">4sQQ", b"LDLM", file_id, offset)
    return body + struct.pack(">I", google_crc32c.value(body))


def _old_ledgers_map(ledgers: dict[int, tuple[int, int]]) -> bytes:
    return struct.pack(">qq", -1, -3) + struct.pack(">I", len(ledgers)) + b"".join(
        struct.pack(">qqq", lid, n, last) for lid, (n, last) in sorted(ledgers.items()))


_u64 = st.integers(0, (1 << 64) - 1)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)


@settings(max_examples=200, deadline=None)
@given(log_id=_u64, map_offset=_u64, count=st.integers(0, (1 << 32) - 1))
def test_entry_log_header_declared_bytes_match_the_old_writer(log_id: int, map_offset: int,
                                                             count: int) -> None:
    old = _old_entry_log_header(log_id, map_offset, count)
    assert _header(log_id, map_offset, count) == old
    crc = google_crc32c.value(old[:28])
    assert layouts.ENTRY_LOG_HEADER.build(dict(
        version=1, flags=0, log_id=log_id, ledgers_map_offset=map_offset,
        ledgers_count=count, crc=crc)) == old
    parsed = layouts.ENTRY_LOG_HEADER.parse(old)
    assert (parsed.log_id, parsed.ledgers_map_offset, parsed.ledgers_count) == \
        (log_id, map_offset, count)


@settings(max_examples=200, deadline=None)
@given(lid=_i64, term=_i64, fenced=st.booleans(), key=st.binary(max_size=20),
       lac=st.binary(max_size=64))
def test_index_header_declared_bytes_match_the_old_writer(lid: int, term: int, fenced: bool,
                                                          key: bytes, lac: bytes) -> None:
    old = _old_index_header(lid, term, fenced, key, lac)
    idx = LedgerIndex(lid, Path("x.idx"), master_key=key, fenced=fenced, term=term,
                      explicit_lac=lac)
    assert idx.header_bytes() == old
    assert layouts.INDEX_HEADER.build(dict(
        version=1, state=int(fenced), ledger_id=lid, term=term, key_length=len(key),
        key=key.ljust(20, b"\0"), lac_length=len(lac), lac=lac.ljust(64, b"\0"),
        crc=google_crc32c.value(old[:111]))) == old
    back = parse_index_header(old, Path("x.idx"))
    assert (back.ledger_id, back.term, back.fenced, back.master_key, back.explicit_lac) == \
        (lid, term, fenced, key, lac)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(file_id=_u64, offset=_u64)
def test_last_mark_round_trip_and_declared_bytes(tmp_path: Path, file_id: int,
                                                 offset: int) -> None:
    d = tmp_path / f"m{next(_counter)}"
    (d / "current").mkdir(parents=True)
    write_last_mark([d], file_id, offset)
    data = (d / "current" / "lastMark").read_bytes()
    old = _old_last_mark(file_id, offset)
    assert data == old
    assert layouts.LAST_MARK.build(dict(file_id=file_id, offset=offset,
                                        crc=google_crc32c.value(old[:20]))) == old
    assert read_last_mark([d]) == (file_id, offset)
    # A torn or flipped mark is not believed.
    (d / "current" / "lastMark").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert read_last_mark([d]) is None


def test_last_mark_highest_of_several_dirs_wins(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        (d / "current").mkdir(parents=True)
    write_last_mark(dirs[:1], 5, 100)
    write_last_mark(dirs[1:], 5, 4096)
    assert read_last_mark(dirs) == (5, 4096)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledgers=st.dictionaries(st.integers(0, 1 << 40),
                               st.tuples(st.integers(0, 1 << 40), st.integers(-1, 1 << 40)),
                               min_size=1, max_size=20))
def test_ledgers_map_declared_bytes_match_the_old_writer(tmp_path: Path,
                                                         ledgers: dict[int, tuple[int, int]]
                                                         ) -> None:
    old = _old_ledgers_map(ledgers)
    head = layouts.LEDGERS_MAP_HEAD.build(dict(ledger_id=-1, version=-3, count=len(ledgers)))
    items = b"".join(layouts.LEDGERS_MAP_ITEM.build(dict(ledger_id=lid, bytes=n,
                                                         last_entry_id=last))
                     for lid, (n, last) in sorted(ledgers.items()))
    assert head + items == old
    # And the roll writes it so: a log rolled with these ledgers reads them back.
    d = tmp_path / f"r{next(_counter)}"
    logger = EntryLogger([d], log_size_limit=8192, write_buffer_size=4096)
    logger.open()
    try:
        for lid in sorted(ledgers):
            logger.add(lid, _entry(lid, 7, 40))
        logger.add(1 << 41, _entry(1 << 41, 0, 7900))  # past the limit: the log rolls
        logger.flush()
        path = logger.paths[min(logger.paths)]
    finally:
        logger.close()
    both = read_log_ledgers(path)
    assert both is not None
    assert both[0] == {lid: 48 for lid in ledgers}
    assert both[1] == {lid: 7 for lid in ledgers}


@pytest.mark.parametrize(("layout", "stop", "old"), [
    (layouts.ENTRY_LOG_HEADER, "crc", ">4sHHQQI"),
    (layouts.ENTRY_RECORD_PREFIX, None, ">II"),
    (layouts.LEDGERS_MAP_HEAD, None, ">qqI"),
    (layouts.LEDGERS_MAP_ITEM, None, ">qqq"),
    (layouts.LEDGERS_MAP_ITEM_V1, None, ">qq"),
    (layouts.INDEX_HEADER, "crc", ">4sHHqqB20sH64s"),
    (layouts.LAST_MARK, "crc", ">4sQQ"),
    (layouts.DB_LOCATION_KEY, None, ">qq"),
    (layouts.DB_LEDGER_KEY, None, ">q"),
    (layouts.DB_LOCATION, None, ">q"),
])
def test_derived_codecs_pack_as_the_old_formats(layout: object, stop: str | None,
                                                old: str) -> None:
    derived = layouts.fast_struct(layout, stop=stop)
    assert struct.calcsize(old) == derived.size
    rng = random.Random(46)
    for _ in range(50):
        fields_ = _sample(old, rng)
        assert derived.pack(*fields_) == struct.pack(old, *fields_)


def _sample(fmt: str, rng: random.Random) -> list[object]:
    out: list[object] = []
    for count, code in re.findall(r"(\d*)([a-zA-Z])", fmt[1:]):
        if code == "s":
            out.append(rng.randbytes(int(count)))
            continue
        size = struct.calcsize(">" + code)
        signed = code.islower()
        lo, hi = (-(1 << (8 * size - 1)), (1 << (8 * size - 1)) - 1) if signed \
            else (0, (1 << (8 * size)) - 1)
        out.append(rng.randint(lo, hi))
    return out


def test_locations_struct_reads_index_pages() -> None:
    locs = [0, 1 << 32 | 1024, 5 << 32 | 77, 0]
    raw = struct.pack(">4q", *locs)
    assert list(layouts.locations_struct(4).unpack(raw)) == locs
    assert layouts.INDEX_LOCATION.parse(raw[8:16]) == 1 << 32 | 1024


def test_entry_ids_and_lac_read_the_wire_entry_header() -> None:
    entry = wire_layouts.ENTRY_HEADER.build(dict(ledger_id=9, entry_id=-1 + 5, lac=3,
                                                 length=100)) + b"payload"
    assert entry_ids(entry) == (9, 4)
    assert entry_lac(entry) == 3
    assert entry_lac(entry[:23]) == -1
    assert entry_ids(b"xx" + entry, 2) == (9, 4)
