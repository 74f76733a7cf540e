"""LedgerStorage semantics, replay, entry-log rolling, index eviction and cookies."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio

from ledgerd.disk.cookie import Cookie, check_cookies, stamp_cookies
from ledgerd.disk.entrylog import inspect_entry_log
from ledgerd.disk.errors import (
    CookieMismatchError,
    CorruptRecordError,
    EntryNotFoundError,
    LedgerNotFoundError,
    StorageError,
)
from ledgerd.disk.storage import LedgerStorage, StateRun, StorageOptions
from ledgerd.wire.entry import Digester, DigestType, decode_entry, encode_entry

KEY = b"k" * 20
D = Digester(DigestType.CRC32C)


STORAGE_CLASS = "interleaved"


@pytest.fixture(autouse=True, params=["interleaved", "db"])
def storage_class(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs against both ledger storages (index files, and the db
    index), unless marked ``interleaved_only`` (about index files themselves: the db
    variant is deselected in tests/conftest.py)."""
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "STORAGE_CLASS", request.param)
    return str(request.param)


def _opts(base: Path, **kw: object) -> StorageOptions:
    kw.setdefault("ledger_storage_class", STORAGE_CLASS)
    return StorageOptions(journal_dir=base / "journal", ledger_dirs=(base / "ledgers",),
                          index_dirs=(base / "index",), **kw)  # type: ignore[arg-type]


def _entry(ledger: int, entry: int, size: int = 10) -> bytes:
    return encode_entry(D, ledger, entry, entry - 1, size * (entry + 1), bytes([entry % 251]) * size)


async def _open(opts: StorageOptions) -> LedgerStorage:
    s = LedgerStorage(opts)
    await s.open()
    return s


async def test_add_read_fence_and_replay_after_crash(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(20):
            await s.add_entries(1, e, [_entry(1, e)], bind_key=KEY)
        await s.add_entries(2, 0, [_entry(2, i) for i in range(5)], bind_key=KEY)
        await s.fence(3, bind_key=KEY)
        await s.fence(1)
        # Storage stores what the core accepted: a fenced ledger still stores (the core
        # lets recovery adds through), and a second key binds nothing.
        await s.add_entries(1, 20, [_entry(1, 20)], bind_key=b"x" * 20)
        assert s.master_key(1) == KEY
        assert decode_entry(D, s.read_entry(1, s.last_entry_id(1))).entry_id == 20
        assert s.lac(1) == 19 and s.last_entry_id(1) == 20
        nursery.cancel_scope.cancel()
    # No close: the next open must replay the journal.
    s2 = await _open(opts)
    assert s2.replayed_records > 0
    assert s2.is_fenced(1) and s2.is_fenced(3) and not s2.is_fenced(2)
    assert [decode_entry(D, b).entry_id for b in s2.read_range(1, 0, 100, 1 << 20)] == \
        list(range(21))
    assert s2.read_entry(2, 4) == _entry(2, 4)
    with pytest.raises(EntryNotFoundError):
        s2.read_entry(2, 5)
    with pytest.raises(LedgerNotFoundError):
        s2.read_entry(9, 0)
    await s2.close()
    s3 = await _open(opts)
    assert s3.replayed_records == 0  # the clean close checkpointed
    assert s3.read_entry(1, 7) == _entry(1, 7) and s3.is_fenced(1)
    assert s3.master_key(2) == KEY
    await s3.close()


async def test_read_range_limits(tmp_path: Path) -> None:
    s = await _open(_opts(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, i, 100) for i in range(10)], bind_key=KEY)
        assert len(s.read_range(1, 0, 3, 1 << 20)) == 3
        one = len(_entry(1, 0, 100))
        assert len(s.read_range(1, 2, 100, 2 * one)) == 2
        assert len(s.read_range(1, 2, 100, 1)) == 1  # always at least one
        assert len(s.read_range(1, 8, 100, 1 << 20)) == 2
        nursery.cancel_scope.cancel()
    await s.close()


async def test_terms_and_truncate(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, i) for i in range(6)], bind_key=KEY, new_term=2)
        await s.set_term(1, 5)
        await s.set_term(1, 4)  # a lower term changes nothing
        await s.truncate(1, 3)
        nursery.cancel_scope.cancel()
    s2 = await _open(opts)
    assert s2.term(1) == 5 and s2.last_entry_id(1) == 3
    with pytest.raises(EntryNotFoundError):
        s2.read_entry(1, 4)
    await s2.close()


async def test_a_state_run_storage_fails_binds_no_key_and_adopts_no_term(tmp_path: Path) -> None:
    """A run that would bind the key and raise the term, failed by the engine: nothing
    is journaled, and the ledger's key and term in memory are as they were."""
    s = await _open(_opts(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, 0)], new_term=2)  # held, no key yet

        def failing(*_: object) -> None:
            raise StorageError("injected: the engine's insert")

        insert, s._insert_run = s._insert_run, failing  # type: ignore[method-assign]
        group, failed = s.submit_runs([StateRun(1, 1, [_entry(1, 1)], KEY, 3)])
        assert group is None and isinstance(failed[0], StorageError)
        assert s.master_key(1) == b"" and s.term(1) == 2
        s._insert_run = insert  # type: ignore[method-assign]
        await s.add_entries(1, 1, [_entry(1, 1)], bind_key=KEY, new_term=3)
        assert s.master_key(1) == KEY and s.term(1) == 3
        nursery.cancel_scope.cancel()
    await s.close()


async def test_entry_logs_roll_with_ledgers_map(tmp_path: Path) -> None:
    opts = _opts(tmp_path, log_size_limit=64 * 1024, write_buffer_size=4096, page_limit=2,
                 page_size=512)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(300):
            await s.add_entries(e % 3, e // 3, [_entry(e % 3, e // 3, 1000)], bind_key=KEY)
        # Entries still in the write buffer and in evicted index pages read back.
        if STORAGE_CLASS == "db":
            await s.checkpoint()  # locations move from memory to the store
        assert s.read_entry(2, 99) == _entry(2, 99, 1000)
        assert s.read_entry(0, 0) == _entry(0, 0, 1000)
        assert s.cache.misses > 0
        nursery.cancel_scope.cancel()
    await s.close()
    logs = sorted((tmp_path / "ledgers" / "current").glob("*.log"))
    assert len(logs) >= 4
    ledgers_map, problem, records = inspect_entry_log(logs[0])
    if STORAGE_CLASS == "db":
        # The write cache is flushed sorted by (ledger, entry): ledger 0's 100 entries
        # fill the first log alone, then 1's, then 2's.
        assert ledgers_map is not None and set(ledgers_map) == {0} and problem == ""
        maps = [inspect_entry_log(p)[0] or {} for p in logs]
        assert set().union(*maps) == {0, 1, 2}
        order = [lid for m in maps for lid in sorted(m)]
        assert order == sorted(order)
    else:
        assert ledgers_map is not None and set(ledgers_map) == {0, 1, 2} and problem == ""
    listed = list(records)
    assert all(r.crc_ok for r in listed)
    # Cut in the middle: the intact records before the cut are still listed, the cut
    # record and the lost map are named (it used to fail on the map and list nothing).
    cut = tmp_path / "cut.log"
    middle = listed[len(listed) // 2]
    cut.write_bytes(logs[0].read_bytes()[: middle.offset + 10])
    ledgers_map, problem, records = inspect_entry_log(cut)
    before = list(records)
    assert ledgers_map is None and "ledgers map past end of log" in problem
    assert [r.offset for r in before[:-1]] == [r.offset for r in listed[: len(listed) // 2]]
    assert before[-1].problem.startswith("truncated")
    from click.testing import CliRunner

    from ledgerd.tools.shell import readlog
    out = CliRunner().invoke(readlog, [str(cut)])
    assert out.exit_code == 0, out.output
    assert f"{len(before)} record(s), 1 with problems" in out.output
    assert "ledgers map: unreadable: ledgers map past end of log" in out.output
    s2 = await _open(opts)
    for e in range(300):
        assert s2.read_entry(e % 3, e // 3) == _entry(e % 3, e // 3, 1000)
    await s2.close()


def _cookie(base: Path, **kw: str) -> Cookie:
    fields: dict[str, object] = dict(bookie_id="127.0.0.1:3181", journal_dir=str(base / "j"),
                                     ledger_dirs=(str(base / "l"),), index_dirs=(str(base / "l"),),
                                     instance_id="iid-1")
    fields.update(kw)
    return Cookie(**fields)  # type: ignore[arg-type]


def test_cookie_matrix(tmp_path: Path) -> None:
    cookie = _cookie(tmp_path)
    dirs = [tmp_path / "j", tmp_path / "l"]
    check = check_cookies(cookie, dirs, None)  # brand new: stamp everything
    assert set(check.stamp) == set(dirs) and check.create_remote
    stamp_cookies(cookie, dirs)
    remote = cookie.to_bytes()
    assert check_cookies(cookie, dirs, remote).stamp == ()
    with pytest.raises(CookieMismatchError, match="belongs to cluster instance iid-1, but "
                       "ZooKeeper holds cluster other"):
        check_cookies(_cookie(tmp_path, instance_id="other"), dirs, None)
    with pytest.raises(CookieMismatchError, match="ZooKeeper has none"):
        check_cookies(cookie, dirs, None)
    (tmp_path / "l" / "current" / "1.log").write_bytes(b"data")
    shutil.rmtree(tmp_path / "j")  # a wiped journal directory
    with pytest.raises(CookieMismatchError, match="wiped") as info:
        check_cookies(cookie, dirs, remote)
    assert "bookieformat" in str(info.value)
    (tmp_path / "l" / "current" / "VERSION").unlink()
    with pytest.raises(CookieMismatchError, match="holds data but no cookie"):
        check_cookies(cookie, dirs, remote)
    (tmp_path / "l" / "current" / "VERSION").write_bytes(b"garbage")
    with pytest.raises(CookieMismatchError, match="unreadable"):
        check_cookies(cookie, dirs, remote)


def test_layout_upgrade_rollback_finalize(tmp_path: Path) -> None:
    from dataclasses import replace

    from ledgerd.disk.layout import finalize, rollback, upgrade

    dirs = [tmp_path / "j", tmp_path / "l"]
    v1 = _cookie(tmp_path)
    stamp_cookies(v1, dirs)
    (tmp_path / "l" / "current" / "1.log").write_bytes(b"old")
    v2 = replace(v1, layout_version=2)
    upgrade(dirs, v2)
    assert check_cookies(v2, dirs, v2.to_bytes()).stamp == ()
    with pytest.raises(CookieMismatchError, match="layout_version"):
        check_cookies(v1, dirs, None)
    with pytest.raises(CookieMismatchError, match="finalize or roll back"):
        upgrade(dirs, v2)
    (tmp_path / "l" / "current" / "1.log").write_bytes(b"new")
    rollback(dirs)
    assert (tmp_path / "l" / "current" / "1.log").read_bytes() == b"old"
    assert check_cookies(v1, dirs, v1.to_bytes()).stamp == ()
    upgrade(dirs, v2)
    finalize(dirs)
    assert not (tmp_path / "l" / "previous").exists()
    with pytest.raises(CookieMismatchError, match="no previous layout"):
        rollback(dirs)


async def test_deleted_ledger_directory_refuses_start(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    cookie = Cookie(bookie_id="127.0.0.1:3181", journal_dir=str(opts.journal_dir),
                    ledger_dirs=tuple(map(str, opts.ledger_dirs)),
                    index_dirs=tuple(map(str, opts.index_dirs)), instance_id="iid")
    s = LedgerStorage(opts)
    check = await s.open(cookie, None)
    assert check is not None and check.create_remote  # new bookie: stamp, create the remote copy
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, 0)], bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    remote = cookie.to_bytes()
    s2 = LedgerStorage(opts)
    check = await s2.open(cookie, remote)
    assert check is not None and not check.create_remote and not check.update_remote
    await s2.close()
    shutil.rmtree(tmp_path / "ledgers")
    with pytest.raises(CookieMismatchError, match="wiped"):
        await LedgerStorage(opts).open(cookie, remote)


async def test_missing_marked_journal_file_refuses_start(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, 0)], bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    for f in (tmp_path / "journal" / "current").glob("*.txn"):
        f.unlink()
    from ledgerd.disk.errors import StorageError
    with pytest.raises(StorageError, match="named by lastMark is missing"):
        await LedgerStorage(opts).open()


async def test_batched_adds_roll_logs_and_replay(tmp_path: Path) -> None:
    opts = _opts(tmp_path, log_size_limit=64 * 1024, write_buffer_size=8192)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for first in range(0, 640, 64):
            await s.add_entries(5, first, [_entry(5, e, 300) for e in range(first, first + 64)],
                                bind_key=KEY)
        if STORAGE_CLASS == "db":
            for e in range(640):  # from the write cache
                assert decode_entry(D, s.read_entry(5, e)).entry_id == e
            await s.checkpoint()  # the write cache goes to the entry logs
        assert len(s.entry_logger.paths) >= 3  # several rolls, some inside a batch
        assert s.lac(5) == 638 and s.last_entry_id(5) == 639
        for e in range(640):
            assert decode_entry(D, s.read_entry(5, e)).entry_id == e
        # After the checkpoint: only in the journal (and the write cache) at the crash.
        await s.add_entries(5, 640, [_entry(5, e, 300) for e in range(640, 704)])
        nursery.cancel_scope.cancel()
    s.journal._closed = True  # as a crash: no close, no final checkpoint
    s.entry_logger.close()
    s2 = await _open(opts)
    assert s2.last_entry_id(5) == 703 and s2.lac(5) == 702
    for e in range(0, 704, 7):
        assert decode_entry(D, s2.read_entry(5, e)).entry_id == e
    await s2.close()


async def test_sparse_entries_are_stored_at_their_own_ids_and_replayed(tmp_path: Path) -> None:
    """A SPARSE add's entries (a striped ledger's runs with gaps) land at their ids,
    in the entry logs (or write cache) and in the journal, and replay restores them."""
    opts = _opts(tmp_path)
    s = await _open(opts)
    ids = [0, 2, 3, 5, 6, 8, 9, 40]
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.submit_entries(7, 0, [_entry(7, e) for e in ids], KEY, entry_ids=ids).wait()
        for e in ids:
            assert s.read_entry(7, e) == _entry(7, e)
        for e in (1, 4, 7, 39):
            with pytest.raises(EntryNotFoundError):
                s.read_entry(7, e)
        assert s.last_entry_id(7) == 40 and s.lac(7) == 39
        nursery.cancel_scope.cancel()
    s.journal._closed = True  # as a crash: replay from the journal
    s.entry_logger.close()
    s2 = await _open(opts)
    assert s2.replayed_records > 0 and s2.master_key(7) == KEY
    assert [decode_entry(D, s2.read_entry(7, e)).entry_id for e in ids] == ids
    with pytest.raises(EntryNotFoundError):
        s2.read_entry(7, 1)
    await s2.close()


async def test_entry_log_write_behind_starts_write_out_in_contiguous_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flush_entrylog_bytes: the writer thread starts the write-out of each step it has
    written (sync_file_range WRITE, no wait), in order and without gaps, so the
    checkpoint's fdatasync finds little left; with 0 it never does."""
    from ledgerd import native

    calls: list[tuple[int, int, int, int]] = []
    real = native.sync_file_range_fd

    def spy(fd: int, offset: int, length: int, flags: int, path: object) -> None:
        calls.append((fd, offset, length, flags))
        real(fd, offset, length, flags, path)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "sync_file_range_fd", spy)
    for step, base in ((64 * 1024, tmp_path / "on"), (0, tmp_path / "off")):
        calls.clear()
        s = await _open(_opts(base, flush_entrylog_bytes=step, write_buffer_size=8192))
        async with trio.open_nursery() as nursery:
            await nursery.start(s.run)
            for first in range(0, 400, 50):
                await s.add_entries(3, first, [_entry(3, e, 1000) for e in range(first, first + 50)],
                                    bind_key=KEY)
            await s.checkpoint()
            nursery.cancel_scope.cancel()
        if step:
            assert len(calls) >= 3
            assert all(flags == native.SYNC_FILE_RANGE_WRITE for *_, flags in calls)
            ends = [off + n for _, off, n, _ in calls]
            assert [off for _, off, _, _ in calls] == [0, *ends[:-1]]  # contiguous
            assert all(n >= step for _, _, n, _ in calls)
            assert ends[-1] > 400 * 1000 - step - 8192
        else:
            assert calls == []
        assert decode_entry(D, s.read_entry(3, 399)).entry_id == 399
        await s.close()


def _open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


@pytest.mark.interleaved_only
async def test_open_file_limit_bounds_index_and_log_descriptors(tmp_path: Path) -> None:
    """300 ledgers over many small logs, read back in a scattered order with a tiny page
    cache: descriptors kept open never pass ``open_file_limit``, and every entry reads."""
    s = LedgerStorage(_opts(tmp_path, open_file_limit=16, page_limit=4, page_size=512,
                            log_size_limit=64 * 1024))
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(4):
            for lid in range(300):
                await s.add_entries(lid, e, [_entry(lid, e, 200)], bind_key=KEY)
        await s.checkpoint()
        base = _open_fds() - len(s.open_files)
        assert len({p.parent for p in s.entry_logger.paths.values()}) == 1
        for e in (3, 0, 2, 1):
            for lid in range(299, -1, -7):
                got = decode_entry(D, s.read_entry(lid, e))
                assert (got.ledger_id, got.entry_id) == (lid, e)
                assert len(s.open_files) <= 16
                assert _open_fds() <= base + 16
        assert s.open_files.evictions > 0
        nursery.cancel_scope.cancel()
    await s.close()


@pytest.mark.parametrize("preallocate", [True, False])
async def test_entry_log_preallocation(tmp_path: Path, preallocate: bool) -> None:
    """On: the next log exists before the roll that uses it; off: only at the roll.
    Either way every entry reads back after a restart, and no empty log is left."""
    opts = _opts(tmp_path, log_size_limit=64 * 1024, preallocate_entry_logs=preallocate)
    s = LedgerStorage(opts)
    await s.open()
    current = tmp_path / "ledgers" / "current"
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(400):
            await s.add_entries(1, e, [_entry(1, e, 500)], bind_key=KEY)
            if e % 100 == 99:
                await s.checkpoint()
        rolls = s.entry_logger.current_log_id - 1
        assert rolls >= 3
        await s.checkpoint()  # the writer thread has run what was queued
        nxt = current / f"{s.entry_logger.current_log_id + 1:x}.log"
        assert nxt.exists() == preallocate
        assert s.entry_logger.preallocated == (rolls if preallocate else 0)
        nursery.cancel_scope.cancel()
    await s.close()
    assert sorted(int(p.stem, 16) for p in current.glob("*.log")) == list(range(1, rolls + 2))
    s2 = LedgerStorage(opts)
    await s2.open()
    for e in range(400):
        assert decode_entry(D, s2.read_entry(1, e)).entry_id == e
    await s2.close()


def test_cookie_expansion_takes_only_new_empty_dirs(tmp_path: Path) -> None:
    old = _cookie(tmp_path)
    dirs = [tmp_path / "j", tmp_path / "l"]
    stamp_cookies(old, dirs)
    grown = _cookie(tmp_path, ledger_dirs=(str(tmp_path / "l"), str(tmp_path / "l2")),
                    index_dirs=(str(tmp_path / "l"), str(tmp_path / "l2")))
    wider = [*dirs, tmp_path / "l2"]
    with pytest.raises(CookieMismatchError, match="set allow_storage_expansion = true"):
        check_cookies(grown, wider, old.to_bytes())
    check = check_cookies(grown, wider, old.to_bytes(), allow_expansion=True)
    assert set(check.stamp) == set(wider) and check.update_remote and not check.create_remote
    assert check.added == (tmp_path / "l2",)
    # Stamped, ZooKeeper not yet replaced (a crash between): the next start finishes it.
    stamp_cookies(grown, list(check.stamp))
    again = check_cookies(grown, wider, old.to_bytes(), allow_expansion=True)
    assert again.stamp == () and again.update_remote
    assert check_cookies(grown, wider, grown.to_bytes()).stamp == ()
    # A new directory that holds data is not "empty"; a swap is not an expansion.
    (tmp_path / "l3" / "current").mkdir(parents=True)
    (tmp_path / "l3" / "current" / "7.log").write_bytes(b"x")
    three = _cookie(tmp_path, ledger_dirs=(str(tmp_path / "l"), str(tmp_path / "l2"),
                                           str(tmp_path / "l3")),
                    index_dirs=(str(tmp_path / "l"), str(tmp_path / "l2"), str(tmp_path / "l3")))
    with pytest.raises(CookieMismatchError, match="holds data but no cookie"):
        check_cookies(three, [*wider, tmp_path / "l3"], grown.to_bytes(), allow_expansion=True)
    swapped = _cookie(tmp_path, ledger_dirs=(str(tmp_path / "l2"),),
                      index_dirs=(str(tmp_path / "l2"),))
    with pytest.raises(CookieMismatchError) as info:
        check_cookies(swapped, [tmp_path / "j", tmp_path / "l2"], grown.to_bytes(),
                      allow_expansion=True)
    assert "allow_storage_expansion" not in str(info.value)


async def test_read_buffer_takes_small_entries_in_one_pread(tmp_path: Path) -> None:
    # (No read-ahead: the db storage would take all ten with one read.)
    opts = _opts(tmp_path, read_buffer_size=512, read_ahead_batch=0)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, i, 100 if i % 2 else 2000) for i in range(10)],
                            bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    s = await _open(opts)  # everything on disk now, none in write buffers
    assert [s.read_entry(1, i) for i in range(10)] == \
        [_entry(1, i, 100 if i % 2 else 2000) for i in range(10)]
    assert s.entry_logger.short_reads == 5  # the 100-byte ones; the 2000-byte took two
    await s.close()
    # A corrupt small entry is still caught when the one pread covered it.
    log = next((tmp_path / "ledgers" / "current").glob("*.log"))
    raw = bytearray(log.read_bytes())
    at = raw.find(_entry(1, 1, 100))
    raw[at + 50] ^= 0xFF
    log.write_bytes(bytes(raw))
    s = await _open(opts)
    with pytest.raises(CorruptRecordError, match="checksum"):
        s.read_entry(1, 1)
    await s.close()


def test_open_file_limit_is_lowered_to_what_the_process_may_open(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from ledgerd.disk.storage import FD_HEADROOM, _fd_budget

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (20000, 20000))
    assert _fd_budget(20000) == 20000 - FD_HEADROOM  # else EMFILE at 20,000 ledgers
    assert _fd_budget(4096) == 4096


async def test_disk_probes_from_two_threads_never_fail_a_healthy_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk checker and a client's GetBookieInfo read the usage from worker threads
    at the same time: their probes (write, sync, unlink a file of one name) once
    unlinked each other's file, and the ENOENT took a healthy directory out of
    service. GetBookieInfo reads the usage without probing."""
    s = await _open(_opts(tmp_path))
    try:
        async def probe_many() -> None:
            for _ in range(300):
                errors = [u.error for u in await trio.to_thread.run_sync(s.usage) if u.error]
                assert not errors, errors

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe_many)
            nursery.start_soon(probe_many)
        probe = tmp_path / "ledgers" / "current" / ".ledgerd-probe"
        assert not probe.exists()
        calls: list[str] = []
        real = os.open

        def spy(path: object, *args: object) -> int:
            calls.append(str(path))
            return real(path, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", spy)
        got = s.usage(probe=False)
        monkeypatch.undo()
        assert {u.path for u in got} >= {tmp_path / "ledgers"}
        assert not [c for c in calls if c.endswith(".ledgerd-probe")]
    finally:
        await s.close()
