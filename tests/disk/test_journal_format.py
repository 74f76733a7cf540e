"""The journal's format, round trip: what the writer lays down the scanner reads back,
record for record, for every record size and every position relative to the block
boundary, every group size, and journals written before the padding rule."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.disk.errors import CorruptRecordError
from ledgerd.disk.journal import Journal, JournalOptions
from ledgerd.disk.journal_format import (
    HEADER_SIZE,
    PREFIX,
    PREFIX_SIZE,
    RECORD_PREFIX,
    RecordType,
    encode_group,
    encode_header,
    encode_records,
    entry_body,
    group_size,
    padding_record,
)
from ledgerd.disk.journal_scan import ScanKind, inspect_journal, scan_journal_file

FILE_ID = 0x1234
Group = list[tuple[int, bytes]]


def _entry(n: int, size: int) -> tuple[int, bytes]:
    return RecordType.ENTRY, entry_body(1, n, bytes([n % 251]) * size)


def _legacy_group(file_id: int, records: Group, alignment: int) -> bytes:
    """A group as writers before the padding rule laid it down: a PADDING record when 9
    or more bytes were left before the aligned end, else zeros (the gap replay tripped
    over). Kept here to prove journals already on disk still replay whole."""
    data = encode_records(file_id, records)
    size = -(-len(data) // alignment) * alignment
    left = size - len(data)
    if left >= PREFIX_SIZE:
        return data + padding_record(file_id, left)
    return data + bytes(left)


def _file(path: Path, groups: list[bytes], tail: int) -> Path:
    path.write_bytes(encode_header(FILE_ID) + b"".join(groups) + bytes(tail))
    return path


def _scanned(path: Path, alignment: int) -> list[tuple[int, int, bytes]]:
    return [(r.ledger_id, r.value, r.payload)
            for r in scan_journal_file(path, alignment=alignment)]


def _expected(groups: list[Group]) -> list[tuple[int, int, bytes]]:
    return [(1, int.from_bytes(body[8:16], "big"), body[16:])
            for g in groups for _, body in g]


# Sizes an entry's record takes, many of them near a block's end: every residue of
# 4096 within 16 bytes of a boundary, plus the rest of 1 B to 64 KiB.
def _near_block(k: int, d: int) -> int:
    return max(0, k * 4096 + d - PREFIX_SIZE - 16)


_body_sizes = st.one_of(
    st.builds(_near_block, st.integers(1, 16), st.integers(-16, 16)),
    st.integers(0, 64 * 1024),
    st.integers(0, 64),
)


def test_group_size_always_leaves_room_for_a_padding_record() -> None:
    for alignment in (512, 4096, 65536):
        for total in range(1, 3 * alignment):
            size = group_size(total, alignment)
            assert size % alignment == 0 and size >= total
            assert size - total == 0 or size - total >= PREFIX_SIZE, (alignment, total)
            assert size - total < alignment + PREFIX_SIZE


def test_the_struct_prefix_is_the_construct_declaration() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        length, crc, rtype = rnd.randrange(1 << 32), rnd.randrange(1 << 32), rnd.randrange(256)
        packed = PREFIX.pack(length, crc, rtype)
        assert packed == RECORD_PREFIX.build({"length": length, "crc": crc, "type": rtype})
        parsed = RECORD_PREFIX.parse(packed)
        assert (parsed.length, parsed.crc, parsed.type) == PREFIX.unpack(packed)


@pytest.mark.parametrize("alignment", [512, 4096])
def test_every_record_end_relative_to_the_block_boundary(tmp_path: Path, alignment: int) -> None:
    """One group per residue: the group's records end ``r`` bytes past a boundary for
    every r in 0..alignment-1, then the file's pre-zeroed tail."""
    groups: list[Group] = []
    for r in range(alignment):
        body = r - PREFIX_SIZE - 16
        while body < 0:
            body += alignment
        groups.append([_entry(r, body)])
    path = _file(tmp_path / "j.txn", [encode_group(FILE_ID, g, alignment) for g in groups],
                 tail=alignment)
    assert _scanned(path, alignment) == _expected(groups)
    kinds = [i.kind for i in inspect_journal(path, alignment=alignment)]
    assert ScanKind.GAP not in kinds and ScanKind.INVALID not in kinds
    assert kinds[-1] is ScanKind.END


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.lists(_body_sizes, min_size=1, max_size=6), min_size=1, max_size=12),
       alignment=st.sampled_from([512, 4096, 8192]), tail=st.sampled_from([0, 1, 4096]),
       legacy=st.booleans())
def test_groups_round_trip(tmp_path: Path, groups: list[list[int]], alignment: int,
                           tail: int, legacy: bool) -> None:
    """Any groups, as this writer or a writer before the padding rule laid them down,
    read back record for record, whether the file ends at the last group or a
    pre-zeroed tail follows."""
    recs = [[_entry(i * 10 + j, size) for j, size in enumerate(g)] for i, g in enumerate(groups)]
    encode = _legacy_group if legacy else encode_group
    blobs = [encode(FILE_ID, g, alignment) for g in recs]
    for blob in blobs:
        assert len(blob) % alignment == 0
    path = _file(tmp_path / "j.txn", blobs, tail)
    assert _scanned(path, alignment) == _expected(recs)


def test_a_legacy_journal_with_zero_gaps_replays_whole(tmp_path: Path) -> None:
    """Issue 45's journal: 50 entries each 8 bytes short of the boundary (and 1 byte
    short), written as the old writer did; replay read 2 of them before the fix."""
    for gap in (1, 8):
        recs = [[_entry(n, 4096 - gap - PREFIX_SIZE - 16)] for n in range(50)]
        path = _file(tmp_path / f"g{gap}.txn",
                     [_legacy_group(FILE_ID, g, 4096) for g in recs], tail=8192)
        assert _scanned(path, 4096) == _expected(recs)
        items = list(inspect_journal(path))
        assert sum(1 for i in items if i.kind is ScanKind.GAP) == 50
        assert all(i.length == gap for i in items if i.kind is ScanKind.GAP)
        assert items[-1].kind is ScanKind.END and items[-1].offset == HEADER_SIZE + 50 * 4096


def test_a_zero_length_inside_a_sector_with_records_after_is_corruption(tmp_path: Path) -> None:
    """Zeros where no writer leaves any (9 or more bytes before the sector's end) are
    not the end of data: with valid groups after them, replay refuses."""
    recs = [[_entry(2 * n, 100), _entry(2 * n + 1, 100)] for n in range(3)]
    blobs = [encode_group(FILE_ID, g, 4096) for g in recs]
    data = bytearray(encode_header(FILE_ID) + b"".join(blobs) + bytes(4096))
    second = HEADER_SIZE + PREFIX_SIZE + 16 + 100
    data[second: second + 9] = bytes(9)  # the first group's second prefix, zeroed
    path = tmp_path / "j.txn"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="zero length inside a sector"):
        list(scan_journal_file(path))


async def _write_groups(d: Path, groups: list[Group], alignment: int) -> Path:
    j = Journal(d, JournalOptions(alignment=alignment, prealloc_mb=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for g in groups:
            await j.append(g)  # one group each: the writer is idle between them
        await j.close()
        nursery.cancel_scope.cancel()
    return j.files()[-1]


@pytest.mark.parametrize("alignment", [512, 4096])
def test_the_journal_writer_leaves_no_gap(tmp_path: Path, alignment: int) -> None:
    """The real writer, group by group, with groups ending 0-16 bytes before a boundary
    and random sizes up to 64 KiB: every byte is a record (no gap), and all come back."""
    rnd = random.Random(alignment)
    groups: list[Group] = []
    n = 0
    for d in range(17):
        for k in (1, 2, 5):
            groups.append([_entry(n, k * alignment - d - PREFIX_SIZE - 16)])
            n += 1
    for _ in range(40):
        groups.append([_entry(n + j, rnd.choice([rnd.randrange(64 * 1024), rnd.randrange(64)]))
                       for j in range(rnd.randrange(1, 5))])
        n += 5
    path = trio.run(_write_groups, tmp_path / "j", groups, alignment)
    assert _scanned(path, alignment) == _expected(groups)
    items = list(inspect_journal(path, alignment=alignment))
    assert [i.kind for i in items if i.kind is not ScanKind.RECORD] == [ScanKind.END]
    paddings = [i for i in items if i.type == RecordType.PADDING]
    assert paddings and all(i.crc_ok for i in paddings)


def test_a_newest_file_whose_header_was_never_written_holds_no_record(tmp_path: Path) -> None:
    """kill -9 while the journal made its next file: created (0 bytes, or zeroed), or a
    recycled file renamed to it with the old file's header still in place. Nothing was
    acknowledged in it (records follow the header's fdatasync), so replay finds no
    record there; in any file but the newest the same is corruption."""
    empty = tmp_path / "1a.txn"
    empty.write_bytes(b"")
    zeroed = tmp_path / "1b.txn"
    zeroed.write_bytes(bytes(HEADER_SIZE * 4))
    recycled = tmp_path / "1c.txn"
    recycled.write_bytes(encode_header(0x07) + bytes(HEADER_SIZE))
    for path in (empty, zeroed, recycled):
        assert list(scan_journal_file(path, is_newest=True)) == [], path
    for path in (empty, zeroed):
        with pytest.raises(CorruptRecordError):
            list(scan_journal_file(path, is_newest=False))
