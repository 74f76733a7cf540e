"""The journal: group commit, torn tails at every offset, corruption, rolling, fallbacks."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ledgerd.disk.errors import CorruptRecordError, DiskFullError, StorageClosedError
from ledgerd.disk.journal import Journal, JournalOptions
from ledgerd.disk.journal_format import HEADER_SIZE, RecordType, entry_body
from ledgerd.disk.journal_scan import inspect_journal, journal_file_ids, scan_journal_file


async def _write(d: Path, batches: list[list[bytes]], **opts: object) -> Path:
    j = Journal(d, JournalOptions(**opts))  # type: ignore[arg-type]
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for n, batch in enumerate(batches):
            await j.append([(RecordType.ENTRY, entry_body(1, n * 100 + i, e))
                            for i, e in enumerate(batch)])
        await j.close()
        nursery.cancel_scope.cancel()
    ids = journal_file_ids(d / "current")
    return d / "current" / f"{ids[-1]:x}.txn"


def _payloads(path: Path) -> list[bytes]:
    return [r.payload for r in scan_journal_file(path)]


async def test_concurrent_appends_all_durable_and_grouped(tmp_path: Path) -> None:
    j = Journal(tmp_path, JournalOptions())
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)

        async def writer(w: int) -> None:
            for k in range(20):
                pos = await j.append([(RecordType.ENTRY, entry_body(w, k, bytes([w]) * 100))])
                assert pos <= j.durable

        async with trio.open_nursery() as writers:
            for w in range(32):
                writers.start_soon(writer, w)
        await j.close()
        nursery.cancel_scope.cancel()
    assert j.records_written == 640
    assert j.groups_written < 640  # grouped, not one sync per record
    path = j.files()[-1]
    got = {(r.ledger_id, r.value) for r in scan_journal_file(path)}
    assert got == {(w, k) for w in range(32) for k in range(20)}


async def test_entries_threshold_flushes_without_waiting(tmp_path: Path) -> None:
    j = Journal(tmp_path, JournalOptions(max_group_wait_ms=60_000,
                                         buffered_entries_threshold=4))
    await j.open()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(j.run)
            async with trio.open_nursery() as writers:
                for i in range(4):
                    writers.start_soon(j.append, [(RecordType.FENCE, entry_body(i, 0, b""))])
            nursery.cancel_scope.cancel()


@pytest.fixture
def written(tmp_path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    payloads = [os.urandom(50 + i) for i in range(5)]
    path = trio.run(_write, tmp_path / "j", [[p] for p in payloads])
    yield path, payloads


def test_torn_tail_at_every_byte_of_the_last_record(written: tuple[Path, list[bytes]],
                                                   tmp_path: Path) -> None:
    path, payloads = written
    records = [r for r in inspect_journal(path)]
    last = [r for r in records if r.record is not None][-1]
    start, end = last.offset, last.offset + 8 + last.length
    copy = tmp_path / "copy.txn"
    for cut in range(start, end):
        shutil.copy(path, copy)
        with open(copy, "r+b") as f:
            f.truncate(cut)  # the tail never reached the disk
        assert _payloads(copy) == payloads[:-1], cut
        shutil.copy(path, copy)
        with open(copy, "r+b") as f:
            f.seek(cut)
            f.write(bytes(end - cut))  # the tail's sectors are still zero
        assert _payloads(copy) == payloads[:-1], cut


def test_flipped_byte_mid_journal_refuses_with_file_and_offset(
        written: tuple[Path, list[bytes]]) -> None:
    path, payloads = written
    first = next(r for r in inspect_journal(path) if r.record is not None)
    data = bytearray(path.read_bytes())
    data[first.offset + 20] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as info:
        list(scan_journal_file(path))
    assert info.value.path == str(path) and info.value.offset == first.offset
    assert "valid records follow" in str(info.value)
    assert _skip(path) == payloads[1:]
    items = list(inspect_journal(path))
    assert not items[0].crc_ok and items[0].problem == "crc mismatch"


def _skip(path: Path) -> list[bytes]:
    return [r.payload for r in scan_journal_file(path, skip_invalid=True)]


def test_junk_length_refuses(written: tuple[Path, list[bytes]]) -> None:
    path, _ = written
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE: HEADER_SIZE + 4] = (0x7FFFFFFF).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="junk length"):
        list(scan_journal_file(path))


def test_not_a_journal(tmp_path: Path) -> None:
    bogus = tmp_path / "x.txn"
    bogus.write_bytes(b"hello" * 1000)
    with pytest.raises(CorruptRecordError, match="bad journal header"):
        list(inspect_journal(bogus))


async def test_rolling_and_removing_old_files(tmp_path: Path) -> None:
    j = Journal(tmp_path, JournalOptions(max_size_mb=1, max_backups=1, prealloc_mb=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for i in range(40):
            await j.append([(RecordType.ENTRY, entry_body(1, i, os.urandom(100_000)))])
        await j.close()
        nursery.cancel_scope.cancel()
    files = j.files()
    assert len(files) >= 4
    total = sum(len(list(scan_journal_file(f, is_newest=f == files[-1]))) for f in files)
    assert total == 40
    removed = j.remove_old(j.durable)
    assert len(j.files()) == 2 and len(removed) == len(files) - 2


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)


async def test_full_disk_is_a_clear_error_and_loses_nothing_acknowledged(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "3m")
    try:
        j = Journal(mnt, JournalOptions(prealloc_mb=1))
        await j.open()
        acked: list[int] = []
        service_errors: list[BaseException] = []

        async def supervised(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            # The writer service ends with the failure; a supervisor would go read-only.
            try:
                await j.run(task_status=task_status)
            except DiskFullError as exc:
                service_errors.append(exc)

        async with trio.open_nursery() as nursery:
            await nursery.start(supervised)
            with pytest.raises(DiskFullError, match="no space left"):
                for i in range(100):
                    await j.append([(RecordType.ENTRY, entry_body(1, i, bytes(100_000)))])
                    acked.append(i)
            with pytest.raises(StorageClosedError):
                await j.append([(RecordType.FENCE, entry_body(1, 0, b""))])
            nursery.cancel_scope.cancel()
        await j.close()
        assert len(service_errors) == 1
        assert acked
        path = j.files()[-1]
        got = [r.value for r in scan_journal_file(path)]
        assert got[: len(acked)] == acked  # nothing acknowledged was lost
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


async def test_o_direct_refused_falls_back_to_buffered(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Filesystems that refuse O_DIRECT (EINVAL) get buffered writes + fdatasync."""
    import errno

    from ledgerd import native

    real = native.open_file

    def refusing(path: object, flags: int, mode: int = 0o644, *, direct: bool = False) -> object:
        if direct:
            raise OSError(errno.EINVAL, "O_DIRECT refused", str(path))
        return real(path, flags, mode, direct=False)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "open_file", refusing)
    path = await _write(tmp_path, [[b"a"], [b"b"]])
    assert _payloads(path) == [b"a", b"b"]


async def test_write_buffer_starts_at_its_setting_and_grows_to_the_largest_group(
        tmp_path: Path) -> None:
    j = Journal(tmp_path, JournalOptions(write_buffer_size=256 * 1024, prealloc_mb=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for i in range(5):
            await j.append([(RecordType.ENTRY, entry_body(1, i, b"x" * 100))])
        assert j.buffer_allocations == 1 and j._buf is not None
        assert j._buf.size == 256 * 1024
        await j.append([(RecordType.ENTRY, entry_body(1, 5, b"y" * 300_000))])
        assert j.buffer_allocations == 2 and j._buf.size >= 300_000
        await j.append([(RecordType.ENTRY, entry_body(1, 6, b"z" * 1000))])
        assert j.buffer_allocations == 2  # reused, never shrunk
        nursery.cancel_scope.cancel()
    await j.close()
    path = tmp_path / "current" / f"{journal_file_ids(tmp_path / 'current')[0]:x}.txn"
    assert [r.value for r in scan_journal_file(path, HEADER_SIZE)
            if r.type is RecordType.ENTRY] == list(range(7))


async def test_zeroing_ahead_runs_beside_the_groups(tmp_path: Path) -> None:
    """Groups stay on the fast path while the next prealloc step is zeroed beside them;
    none zeroes for itself (the first step is zeroed at open), and every record replays."""
    j = Journal(tmp_path, JournalOptions(prealloc_mb=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for i in range(600):  # ~8 KiB a group: about 4.7 MiB, several prealloc steps
            await j.append([(RecordType.ENTRY, entry_body(1, i, bytes(8000)))])
        nursery.cancel_scope.cancel()
    await j.close()
    assert j.background_zero_bytes >= 3 << 20
    assert j.slow_groups == 0
    got = [r.value for r in scan_journal_file(j.files()[-1])]
    assert got == list(range(600))
