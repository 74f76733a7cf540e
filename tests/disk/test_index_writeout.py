"""A checkpoint's index write-out off the event loop (interleaved storage).

``begin_write_out`` takes the dirty pages and headers on the loop and marks them clean;
a worker writes them (``IndexWrite.run``); ``end_write_out`` releases them. Meanwhile
adds go on: a page they change is copied first and is dirty again for the next
checkpoint, the pages being written stay in memory (an evicted page read back from the
file before its write landed would be stale), and only that write writes those
ledgers' headers.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from pathlib import Path

import pytest
import trio

from ledgerd.disk.fdcache import FdCache
from ledgerd.disk.index import INDEX_HEADER_SIZE, IndexWrite, LedgerCache, read_index_file
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.entry import Digester, DigestType, encode_entry

PAGE = 512  # 64 locations a page


def _cache(tmp_path: Path, page_limit: int = 1000) -> LedgerCache:
    return LedgerCache([tmp_path], page_size=PAGE, page_limit=page_limit)


def _on_disk(cache: LedgerCache, ledger: int, entry: int) -> int:
    data = cache.ledgers[ledger].path.read_bytes()
    off = INDEX_HEADER_SIZE + 8 * entry
    return int(struct.unpack_from(">q", data, off)[0]) if len(data) >= off + 8 else 0


def test_what_changes_during_the_write_is_written_by_the_next(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.get_or_create(1).master_key = b"k" * 20
    cache.set_locations(1, 0, [100 + e for e in range(10)])
    job = cache.begin_write_out()
    assert not cache.ledgers[1].dirty_pages and not cache.ledgers[1].header_dirty
    cache.set_location(1, 5, 555)  # the hot page was handed over: dirty again
    cache.set_location(1, 10, 110)
    assert cache.ledgers[1].dirty_pages == {0}
    job.run()
    cache.end_write_out(job)
    assert job.paths == [cache.ledgers[1].path]
    assert [_on_disk(cache, 1, e) for e in (4, 5, 10)] == [104, 105, 0]  # the copy
    assert cache.write_out() == [cache.ledgers[1].path]
    assert [_on_disk(cache, 1, e) for e in (4, 5, 10)] == [104, 555, 110]
    assert read_index_file(cache.ledgers[1].path)[0].master_key == b"k" * 20


def test_truncating_and_trimming_during_the_write_change_a_copy(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.set_locations(1, 0, [100 + e for e in range(10)])
    cache.set_locations(2, 0, [200 + e for e in range(10)])
    job = cache.begin_write_out()
    cache.truncate_after(1, 4)
    cache.trim_before(2, 5)
    job.run()
    cache.end_write_out(job)
    assert [_on_disk(cache, 1, e) for e in (4, 5)] == [104, 105]  # as taken
    assert [_on_disk(cache, 2, e) for e in (4, 5)] == [204, 205]
    cache.write_out()
    assert [_on_disk(cache, 1, e) for e in (4, 5)] == [104, 0]
    assert [_on_disk(cache, 2, e) for e in (4, 5)] == [0, 205]
    assert cache.location(1, 5) == 0 and cache.location(2, 4) == 0


def test_pages_being_written_are_not_evicted(tmp_path: Path) -> None:
    cache = _cache(tmp_path, page_limit=2)
    cache.set_location(1, 0, 7)
    job = cache.begin_write_out()  # the copy of ledger 1's page 0 is not written yet
    for lid in (2, 3, 4, 5):  # more pages than the cache keeps
        cache.set_location(lid, 0, lid)
    assert 0 in cache.ledgers[1].pages  # kept: the file does not have it yet
    assert cache.location(1, 0) == 7
    job.run()
    cache.end_write_out(job)
    for lid in (6, 7):  # now it may go
        cache.set_location(lid, 0, lid)
    assert 0 not in cache.ledgers[1].pages
    assert cache.location(1, 0) == 7  # read back from the file
    assert len(cache._lru) <= 2


def test_a_page_made_while_the_cache_is_all_pinned_stays(tmp_path: Path) -> None:
    """Every cached page is being written: the page an add makes next is the only one
    eviction could take, and it must not (the add writes into it)."""
    cache = _cache(tmp_path, page_limit=2)
    cache.set_location(1, 0, 7)
    cache.set_location(2, 0, 8)
    job = cache.begin_write_out()
    cache.set_location(3, 0, 9)
    assert 0 in cache.ledgers[3].pages and cache.location(3, 0) == 9
    job.run()
    cache.end_write_out(job)
    cache.write_out()  # the new page is dirty and in memory
    assert _on_disk(cache, 3, 0) == 9


def test_an_eviction_during_the_write_leaves_the_header_to_the_next(tmp_path: Path) -> None:
    """A header copied by the job must not land after a newer one: an eviction meanwhile
    writes its page but leaves the header dirty for the next checkpoint."""
    cache = _cache(tmp_path, page_limit=2)
    idx = cache.get_or_create(1)
    cache.set_location(1, 0, 7)
    job = cache.begin_write_out()  # its header copy: not fenced
    idx.fenced = True
    cache.dirty(idx)
    cache.set_location(1, 64, 8)  # page 1, dirty
    for lid in (2, 3, 4):  # evicts ledger 1's page 1 (written now), never page 0
        cache.set_location(lid, 0, lid)
    assert 1 not in idx.pages and 0 in idx.pages
    assert idx.header_dirty
    job.run()
    cache.end_write_out(job)
    assert not read_index_file(idx.path)[0].fenced  # the copy
    cache.write_out()
    assert read_index_file(idx.path)[0].fenced
    assert _on_disk(cache, 1, 64) == 8


def test_a_failed_write_leaves_everything_for_the_next(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    cache = _cache(tmp_path)
    cache.get_or_create(1).master_key = b"k" * 20
    cache.set_locations(1, 0, [1, 2, 3])
    job = cache.begin_write_out()

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError) as info:
        job.run()
    assert info.value.filename == str(cache.ledgers[1].path)
    monkeypatch.undo()
    cache.end_write_out(job)
    idx = cache.ledgers[1]
    assert idx.dirty_pages == {0} and idx.header_dirty and idx.needs_sync
    assert not idx.header_written
    assert cache.write_out() == [idx.path]
    assert [_on_disk(cache, 1, e) for e in range(3)] == [1, 2, 3]
    assert read_index_file(idx.path)[0].master_key == b"k" * 20


def test_one_write_out_at_a_time(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.set_location(1, 0, 1)
    job = cache.begin_write_out()
    with pytest.raises(RuntimeError, match="already in flight"):
        cache.write_out()
    cache.end_write_out(job)
    assert cache.ledgers[1].dirty_pages == {0}  # not run: dirty again


async def test_adds_during_a_checkpoint_are_indexed_by_the_next(tmp_path: Path) -> None:
    """Through the storage: adds while the worker writes the copies; every entry reads
    back, after a restart too."""
    d = Digester(DigestType.CRC32C)
    opts = StorageOptions(journal_dir=tmp_path / "j", ledger_dirs=(tmp_path / "l",),
                          page_size=PAGE, page_limit=4, flush_interval_ms=3_600_000)
    s = LedgerStorage(opts)
    await s.open()
    written: dict[int, int] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)

        added = trio.Event()  # set by each add; the checkpoints wait for one
        done = trio.Event()  # set (and replaced) by each checkpoint's end

        async def writer(lid: int) -> None:
            for e in range(300):
                await s.add_entries(lid, e, [encode_entry(d, lid, e, e - 1, 0, b"x" * 30)],
                                    bind_key=b"k" * 20)
                written[lid] = e
                added.set()
                if e % 15 == 14:  # no more than 15 adds without a checkpoint ending
                    await done.wait()

        checkpoints = 0
        async with trio.open_nursery() as adds:
            for lid in (1, 2, 3):
                adds.start_soon(writer, lid)
            while sum(written.values()) < 3 * 299:  # checkpoints among the adds
                await added.wait()
                added = trio.Event()
                await s.checkpoint()
                checkpoints += 1
                done.set()
                done = trio.Event()
        await s.checkpoint()
        assert checkpoints >= 20
        nursery.cancel_scope.cancel()
    await s.close()
    s = LedgerStorage(opts)
    await s.open()
    try:
        for lid in (1, 2, 3):
            assert written[lid] == 299
            for e in (0, 63, 64, 150, 299):
                entry = s.read_entry(lid, e)
                assert entry[:16] == struct.pack(">qq", lid, e)
    finally:
        await s.close()


def test_a_ledger_being_written_is_not_deleted(tmp_path: Path) -> None:
    """Its copies name the file by path: deleted and re-created meanwhile, the path would
    be the new ledger's. The cache refuses; the storage waits (below)."""
    cache = _cache(tmp_path)
    cache.set_location(1, 0, 7)
    cache.set_location(2, 0, 8)
    job = cache.begin_write_out()
    with pytest.raises(RuntimeError, match="being written"):
        cache.delete(1)
    job.run()
    cache.end_write_out(job)
    path = cache.delete(1)
    assert path is not None and path.exists()


async def test_a_ledger_deleted_during_a_checkpoint_waits_for_its_index_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = Digester(DigestType.CRC32C)
    opts = StorageOptions(journal_dir=tmp_path / "j", ledger_dirs=(tmp_path / "l",),
                          page_size=PAGE, flush_interval_ms=3_600_000)
    s = LedgerStorage(opts)
    await s.open()
    cache = s.cache
    assert isinstance(cache, LedgerCache)
    writing, release = threading.Event(), threading.Event()
    run = IndexWrite.run

    def slow_run(job: IndexWrite) -> None:
        writing.set()
        release.wait(10)
        run(job)
        order.append("written")

    monkeypatch.setattr(IndexWrite, "run", slow_run)
    order: list[str] = []  # appended to by the worker thread, then the loop
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [encode_entry(d, 1, 0, -1, 0, b"x")], bind_key=b"k" * 20)

        async def checkpoint() -> None:
            await s.checkpoint()

        async def delete() -> None:
            await trio.to_thread.run_sync(writing.wait, 10)  # the write has begun
            nursery.start_soon(trio.to_thread.run_sync, release.set)
            await s.delete_ledger(1)
            order.append("delete")

        async with trio.open_nursery() as both:
            both.start_soon(checkpoint)
            both.start_soon(delete)
        nursery.cancel_scope.cancel()
    await s.close()
    assert order[:2] == ["written", "delete"]  # (close checkpoints again)
    assert 1 not in cache.ledgers


def test_many_ledgers_hold_no_descriptor_each(tmp_path: Path) -> None:
    """More dirty ledgers than the process may open files: the write holds no
    descriptor per ledger (the shared cache keeps 64 open)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cache = LedgerCache([tmp_path], page_size=PAGE, page_limit=100_000, fds=FdCache(64))
    limit = len(os.listdir("/proc/self/fd")) + 200
    ledgers = limit + 100
    for lid in range(ledgers):
        cache.set_location(lid, 0, lid + 1)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        job = cache.begin_write_out()
        job.run()
        cache.end_write_out(job)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(job.paths) == ledgers
    assert _on_disk(cache, ledgers - 1, 0) == ledgers


@pytest.mark.parametrize("seed", range(6))
def test_sparse_locations_land_as_one_set_location_each(tmp_path: Path, seed: int) -> None:
    """``set_sparse_locations`` (a SPARSE add's ids, across pages, with gaps) leaves the
    cache as a ``set_location`` per entry does: locations, last entry, dirty pages."""
    import random

    rng = random.Random(seed)
    ids = sorted(rng.sample(range(5, 400), rng.randrange(1, 120)))  # 64 per page
    locations = [rng.randrange(1, 1 << 40) for _ in ids]
    sparse, single = _cache(tmp_path / "a"), _cache(tmp_path / "b")
    for c in (sparse, single):
        c.set_location(1, 2, 7)  # an earlier entry: the ledger's hot page is page 0
    sparse.set_sparse_locations(1, ids, locations)
    for eid, loc in zip(ids, locations, strict=True):
        single.set_location(1, eid, loc)
    for eid in range(0, 420):
        assert sparse.location(1, eid) == single.location(1, eid), eid
    assert sparse.ledgers[1].last_entry_id == single.ledgers[1].last_entry_id == max(ids)
    assert sparse.ledgers[1].dirty_pages == single.ledgers[1].dirty_pages


def test_sparse_locations_whose_page_would_be_read_wait_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SPARSE add whose pages are not in memory does not read them on the loop (the
    OS side of it: tests/disk/test_index_pagein.py): its locations wait aside like a
    single add's, readable at once; with the pages in memory they go in directly."""
    cache = _cache(tmp_path, page_limit=2)
    cache.defer_misses = True
    cache.set_locations(1, 0, list(range(1, 131)))  # pages 0-2 of ledger 1
    cache.write_out()  # in its file, header written
    for lid in (2, 3):  # two other ledgers' pages take the two in memory
        cache.set_location(lid, 0, 9)
    assert not cache.ledgers[1].pages
    monkeypatch.setattr(cache, "_page_nowait", lambda idx, page_no: None)  # on disk only
    ids, locations = [130, 132, 133, 200], [1130, 1132, 1133, 1200]
    cache.set_sparse_locations(1, ids, locations)
    assert cache.deferred[1] == dict(zip(ids, locations, strict=True))
    assert [cache.location(1, e) for e in ids] == locations
    assert cache.ledgers[1].last_entry_id == 200
    monkeypatch.undo()  # page 3 is past the file's end: made now, nothing to wait for
    cache.set_sparse_locations(1, [201, 203], [1201, 1203])
    assert [cache.location(1, e) for e in (201, 203)] == [1201, 1203]
    assert set(cache.deferred[1]) == set(ids) and 3 in cache.ledgers[1].pages


def test_start_up_drops_index_files_whose_header_was_never_written(tmp_path: Path) -> None:
    """Empty, short or zero-headed files are a crash before the header's first write:
    dropped (replay rebuilds them). A written header that fails its checks refuses."""
    from ledgerd.disk.errors import CorruptRecordError
    from ledgerd.disk.index import index_path

    cache = _cache(tmp_path)
    cache.set_location(1, 0, 77)
    cache.flush()
    made = {lid: index_path(tmp_path, lid) for lid in (2, 3, 4)}
    for lid, data in ((2, b""), (3, bytes(100)), (4, bytes(INDEX_HEADER_SIZE + PAGE))):
        made[lid].parent.mkdir(parents=True, exist_ok=True)
        made[lid].write_bytes(data)
    again = _cache(tmp_path)
    again.load_all()
    assert set(again.ledgers) == {1} and again.location(1, 0) == 77
    assert not any(p.exists() for p in made.values())
    bad = index_path(tmp_path, 5)
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"LDIX" + bytes(INDEX_HEADER_SIZE - 4))
    with pytest.raises(CorruptRecordError, match="bad index header"):
        _cache(tmp_path).load_all()
