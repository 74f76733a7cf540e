"""The journal: group commit, torn tails at every offset, corruption, rolling, fallbacks."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd import native
from ledgerd.disk.errors import (
    CorruptRecordError,
    DiskFullError,
    StorageClosedError,
    StorageError,
)
from ledgerd.disk.journal import Journal, JournalGroup, JournalOptions, JournalPosition
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


async def _writer(j: Journal, failure: type[BaseException], errors: list[BaseException],
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The writer service, whose failure ends it (a supervisor would go read-only):
    recorded in ``errors`` instead of failing the test's nursery."""
    try:
        await j.run(task_status=task_status)
    except failure as exc:
        errors.append(exc)


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

        async with trio.open_nursery() as nursery:
            await nursery.start(_writer, j, DiskFullError, service_errors)
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
        # One append at a time: every group reuses the slot (and buffer) freed last.
        assert j.buffer_allocations == 1
        assert max(s.buf.size for s in j._slots if s.buf is not None) == 256 * 1024
        await j.append([(RecordType.ENTRY, entry_body(1, 5, b"y" * 300_000))])
        assert j.buffer_allocations == 2
        assert max(s.buf.size for s in j._slots if s.buf is not None) >= 300_000
        await j.append([(RecordType.ENTRY, entry_body(1, 6, b"z" * 1000))])
        assert j.buffer_allocations == 2  # reused, never shrunk
        nursery.cancel_scope.cancel()
    await j.close()
    path = tmp_path / "current" / f"{journal_file_ids(tmp_path / 'current')[0]:x}.txn"
    assert [r.value for r in scan_journal_file(path, HEADER_SIZE)
            if r.type is RecordType.ENTRY] == list(range(7))


async def test_zeroing_trickles_a_chunk_at_a_time_in_small_writes(tmp_path: Path) -> None:
    """The zeroer keeps about one step zeroed ahead, topping it up a chunk at a time as
    the groups use it (never a step at once), and writes each chunk in paced pieces:
    each journal fdatasync flushes the zeros written since the last one."""
    step, chunk = 4 << 20, 1 << 20
    j = Journal(tmp_path, JournalOptions(prealloc_mb=4))
    await j.open()
    writes: list[tuple[int, int, float]] = []  # the zeroer's: (bytes, piece, pause)
    f = j._file
    assert f is not None

    class Spy:  # the file's handle, noting the zeroer's writes
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def pwrite_paced(self, data: Any, offset: int, piece: int, pause: float) -> int:
            writes.append((len(data), piece, pause))
            return int(self.handle.pwrite_paced(data, offset, piece, pause))

    f.handle = Spy(f.handle)  # type: ignore[assignment]
    ahead: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for i in range(800):  # ~8 KiB a group: about 6.3 MiB, past a step and a half
            await j.append([(RecordType.ENTRY, entry_body(1, i, bytes(8000)))])
            while j._zeroing is not None:
                await j._zeroing.wait()
            ahead.append(f.zeroed_until - f.offset)
        nursery.cancel_scope.cancel()
    await j.close()
    assert j.slow_groups == 0
    assert max(ahead) <= step + chunk  # a whole step at once would reach 1.5 steps
    assert min(ahead[10:]) >= step - chunk - 8192
    assert writes and {w[:2] for w in writes} == {(chunk, 128 * 1024)}
    assert all(pause > 0 for _, _, pause in writes)  # it kept up: always paced
    assert sum(w[0] for w in writes) == j.background_zero_bytes >= 6 << 20
    got = [r.value for r in scan_journal_file(j.files()[-1])]
    assert got == list(range(800))


async def test_a_group_that_outran_the_zeroer_waits_for_one_chunk_not_its_run(
        tmp_path: Path) -> None:
    """A group reaching past the zeroed space waits for the zeroer's next chunk, not for
    the whole step it is zeroing: that wait held every add 20-90 ms twice a second at
    120k adds/s. The zeroer's writes are gated here, a chunk at a time."""
    j = Journal(tmp_path, JournalOptions(prealloc_mb=4))
    await j.open()
    f = j._file
    assert f is not None
    gates = [threading.Event() for _ in range(8)]
    order: list[str] = []

    class Gated:  # the file's handle; the zeroer's n-th write waits for gates[n]
        def __init__(self, handle: Any) -> None:
            self.handle = handle
            self.writes = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def pwrite_paced(self, data: Any, offset: int, piece: int, pause: float) -> int:
            n, self.writes = self.writes, self.writes + 1
            gates[n].wait(10)
            rc = int(self.handle.pwrite_paced(data, offset, piece, pause))
            order.append(f"chunk {n}")
            return rc

    gated = Gated(f.handle)
    f.handle = gated  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        i = 0
        while j._zeroing is None:  # ~8 KiB groups until the zeroer starts (gated)
            await j.append([(RecordType.ENTRY, entry_body(1, i, bytes(8000)))])
            i += 1
        ahead = f.zeroed_until - f.offset
        # One group reaching half a chunk past the zeroed space.
        records = [(int(RecordType.ENTRY), entry_body(1, i + k, bytes(8000)))
                   for k in range((ahead + (1 << 19)) // 8000)]
        with j.batch():
            group = j.submit(records)
        await trio.testing.wait_all_tasks_blocked()
        assert not group.done.is_set()  # it waits for the zeroer
        gates[0].set()  # the zeroer's next chunk lands; its second is held
        await group.wait()
        order.append("group")
        for gate in gates:
            gate.set()
        while j._zeroing is not None:
            await j._zeroing.wait()
        nursery.cancel_scope.cancel()
    await j.close()
    assert order[:2] == ["chunk 0", "group"]
    assert j.slow_groups == 0
    got = [r.value for r in scan_journal_file(j.files()[-1])]
    assert got == list(range(i + len(records)))


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


def _entry(ledger: int, entry: int, size: int = 100) -> list[tuple[int, bytes]]:
    return [(RecordType.ENTRY, entry_body(ledger, entry, b"e" * size))]


def _pass(j: Journal, *records: list[tuple[int, bytes]]) -> JournalGroup:
    """What the connection hub does in one pass: submit inside ``batch``."""
    with j.batch():
        groups = [j.submit(r) for r in records]
    return groups[-1]


async def test_release_starts_the_held_group_and_groups_complete_in_order(
        tmp_path: Path) -> None:
    """What is submitted inside ``batch`` is one group, started by its end itself; with
    two syncers a second group starts while the first syncs, and they finish in order."""
    j = Journal(tmp_path, JournalOptions(groups_in_flight=2))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        with j.batch():
            first = j.submit(_entry(1, 0))
            assert j.submit(_entry(2, 0)) is first
            assert not j._inflight  # nothing starts while held
        assert len(j._inflight) == 1  # started here, in this step
        second = _pass(j, _entry(1, 1))
        assert second is not first and len(j._inflight) == 2
        end = await second.wait()
        assert first.is_durable and first.position < second.position == end == j.durable
        assert j.groups_written == 2 and j.records_written == 3
        # A third group waits for a free syncer when both are busy.
        _pass(j, _entry(1, 2), _entry(1, 3))  # one group
        last = _pass(j, _entry(1, 4))
        _pass(j, _entry(1, 5))
        assert len(j._inflight) == 2 and j.pending_records == 1
        await last.wait()
        await j.close()
        nursery.cancel_scope.cancel()
    path = j.files()[-1]
    assert [(r.ledger_id, r.value) for r in scan_journal_file(path)
            if r.type is RecordType.ENTRY] == [
        (1, 0), (2, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]


@pytest.mark.parametrize("waiting", [1, 500])
async def test_one_syncer_keeps_one_group_in_flight(tmp_path: Path, waiting: int) -> None:
    """What arrives during a sync waits for it, and goes to the syncer as soon as the
    sync ends, however many records it holds: before the finished group's callers hear
    back (the next sync overlaps their replies)."""
    j = Journal(tmp_path, JournalOptions(groups_in_flight=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        first = _pass(j, _entry(1, 0))
        second = _pass(j, *[_entry(1, 1 + i) for i in range(waiting)])
        assert len(j._inflight) == 1 and j.pending_records == waiting
        seen: list[tuple[int, int]] = []
        first.call_when_done(lambda: seen.append((len(j._inflight), j.pending_records)))
        await second.wait()
        assert seen == [(1, 0)]  # the second group was in flight when the first finished
        assert first.position < second.position
        await j.close()
        nursery.cancel_scope.cancel()


class _FailingFirstCollect:
    """A real syncer whose first finished job reports EIO (the disk failed the write)."""

    failures = 1

    def __init__(self, syncer: native.Syncer) -> None:
        self._syncer = syncer

    def fileno(self) -> int:
        return self._syncer.fileno()

    def submit(self, *args: Any, **kwargs: Any) -> None:
        self._syncer.submit(*args, **kwargs)

    def collect(self) -> float | None:
        seconds = self._syncer.collect()
        if seconds is not None and _FailingFirstCollect.failures:
            _FailingFirstCollect.failures -= 1
            raise OSError(errno.EIO, "journal write + fdatasync: Input/output error")
        return seconds

    def close(self) -> None:
        self._syncer.close()


async def _journal_with(tmp_path: Path, wrapper: type[_FailingFirstCollect],
                        **opts: Any) -> Journal:
    """An open journal whose syncers are wrapped in ``wrapper`` (an injected fault)."""
    j = Journal(tmp_path, JournalOptions(**opts))
    await j.open()
    for slot in j._slots:
        slot.syncer = wrapper(slot.syncer)  # type: ignore[assignment]
    return j


async def test_a_failed_group_fails_the_groups_in_flight_after_it(tmp_path: Path) -> None:
    """The second group's sync succeeded, but the first's failed: both fail, and so does
    everything after, since the journal cannot hold a hole before durable records."""
    j = await _journal_with(tmp_path, _FailingFirstCollect, groups_in_flight=2)
    ended: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(_writer, j, StorageError, ended)
        first = _pass(j, _entry(1, 0))
        second = _pass(j, _entry(1, 1))
        assert len(j._inflight) == 2
        with pytest.raises(StorageError, match="Input/output error"):
            await second.wait()
        with pytest.raises(StorageError, match="Input/output error"):
            first.check()
        with pytest.raises(StorageClosedError):
            j.submit(_entry(1, 2))
    assert len(ended) == 1 and "Input/output error" in str(ended[0])  # the writer stops
    assert j.durable.offset == HEADER_SIZE  # never moved past the failed group
    await j.close()


async def test_release_never_starts_a_group_ahead_of_one_the_writer_took(
        tmp_path: Path) -> None:
    """A group on the slow path (here: it needs zeroing ahead) is being written by a
    worker thread; adds released meanwhile must wait for it, or they would be written
    and acknowledged ahead of it, past a hole a crash could leave."""
    j = Journal(tmp_path, JournalOptions(prealloc_mb=1, groups_in_flight=2))
    await j.open()
    gate = threading.Event()
    real = j._write_sync

    def gated(records: list[tuple[int, bytes]], total: int) -> JournalPosition:
        gate.wait(30)
        return real(records, total)

    j._write_sync = gated  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        big = j.submit(_entry(1, 0, size=1_500_000))  # beyond the zeroed first MiB
        await trio.testing.wait_all_tasks_blocked()
        assert j.slow_groups == 1  # the writer is in the slow path, held at the gate
        small = _pass(j, _entry(1, 1))
        assert not j._inflight and j.pending_records == 1
        gate.set()
        await small.wait()
        assert big.is_durable and big.position < small.position
        await j.close()
        nursery.cancel_scope.cancel()
    assert [r.value for r in scan_journal_file(j.files()[-1])
            if r.type is RecordType.ENTRY] == [0, 1]


async def test_the_writer_wakes_to_find_its_group_started_by_release(tmp_path: Path) -> None:
    """A plain ``submit`` wakes the writer; a ``release`` in the same step starts the
    group (both records) before the writer runs. The writer then finds nothing to do: no
    second, empty group (it would take the slow path, as no syncer is free)."""
    j = Journal(tmp_path, JournalOptions(groups_in_flight=1))
    await j.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        for i in range(3):
            j.submit(_entry(1, 2 * i))  # wakes the writer
            with j.batch():
                group = j.submit(_entry(1, 2 * i + 1))
            # The batch's end starts both records as one group, in this step.
            assert len(j._inflight) == 1 and not j.pending_records
            await group.wait()
        assert (j.groups_written, j.slow_groups, j.records_written) == (3, 0, 6)
        await j.close()
        nursery.cancel_scope.cancel()


class _RefusingSubmit(_FailingFirstCollect):
    """A real syncer that refuses the job it is handed (the write never starts)."""

    def submit(self, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EBADF, "journal write: Bad file descriptor")


async def test_a_group_release_cannot_start_fails_the_journal(tmp_path: Path) -> None:
    """``release`` runs in the hub's pass: a group it cannot start fails as one the
    writer could not write (the bookie turns read-only), and the hub's pass goes on."""
    j = await _journal_with(tmp_path, _RefusingSubmit)
    ended: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(_writer, j, StorageError, ended)
        group = _pass(j, _entry(1, 0))  # raises nothing here
        with pytest.raises(StorageError, match="Bad file descriptor"):
            await group.wait()
        with pytest.raises(StorageClosedError):
            j.submit(_entry(1, 1))
    assert len(ended) == 1 and "Bad file descriptor" in str(ended[0])
