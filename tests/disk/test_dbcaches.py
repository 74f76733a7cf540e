"""The db storage's write cache, sorted flush, read-ahead cache and index commits.

- Entries wait in the write cache (readable, not in any entry log) until a checkpoint
  writes them sorted by (ledger, entry); a full cache writes through and asks for an
  early checkpoint; everything survives a crash either way.
- A truncate, delete or re-create between a flush's chunks is honoured.
- A read that misses reads the ledger's next entries ahead; delete and truncate drop
  them from the cache.
- The index commit runs apart from the generation after it: lookups see the newer
  generation first, a failed commit is absorbed by the next, and meta records written
  by the first version (with a last entry id) still load.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from ledgerd.disk import dbstorage as storage_mod
from ledgerd.disk.dbindex import HEAD_BYTES, DbLedgerCache
from ledgerd.disk.entrylog import ENTRY_LOG_HEADER_SIZE
from ledgerd.disk.errors import EntryNotFoundError
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.entry import Digester, DigestType, decode_entry, encode_entry

KEY = b"k" * 20
D = Digester(DigestType.CRC32C)


def _opts(base: Path, **kw: object) -> StorageOptions:
    kw.setdefault("flush_interval_ms", 3_600_000)  # checkpoints only when a test asks
    return StorageOptions(journal_dir=base / "journal", ledger_dirs=(base / "ledgers",),
                          ledger_storage_class="db", **kw)  # type: ignore[arg-type]


def _entry(ledger: int, entry: int, size: int = 1000) -> bytes:
    return encode_entry(D, ledger, entry, entry - 1, 0, bytes([ledger, entry % 251]) * (size // 2))


def _crash(s: LedgerStorage) -> None:
    s.journal._closed = True  # no close, no final checkpoint
    s.entry_logger.close()


async def _open(opts: StorageOptions) -> LedgerStorage:
    s = LedgerStorage(opts)
    await s.open()
    return s


async def test_write_cache_holds_entries_until_a_checkpoint_writes_them_sorted(
        tmp_path: Path) -> None:
    s = await _open(_opts(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(30):
            for lid in (3, 1, 2):
                await s.add_entries(lid, e, [_entry(lid, e)], bind_key=KEY)
        assert len(s.engine.write_cache) == 90
        cur = s.entry_logger._current
        assert cur is not None and cur.size + len(cur.buffer) == ENTRY_LOG_HEADER_SIZE
        assert s.read_entry(2, 17) == _entry(2, 17) and s.last_entry_id(1) == 29
        await s.checkpoint()
        assert len(s.engine.write_cache) == 0 and s.engine.flushing is None
        assert s.engine.write_cache_flushes == 1
        # Sorted: every location of ledger 1 before ledger 2's, 2's before 3's, and
        # each ledger's entries in order.
        locs = [s.cache.location(lid, e) for lid in (1, 2, 3) for e in range(30)]
        assert locs == sorted(locs) and all(locs)
        assert s.read_entry(3, 29) == _entry(3, 29)
        nursery.cancel_scope.cancel()
    await s.close()


async def test_full_write_cache_writes_through_and_asks_for_a_checkpoint(
        tmp_path: Path) -> None:
    opts = _opts(tmp_path, write_cache_max_bytes=40_000)  # halves of 20,000 bytes
    s = await _open(opts)
    checkpointed = trio.Event()
    s.on_checkpoint = lambda _seconds: checkpointed.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        groups = [s.submit_entries(1, e, [_entry(1, e)], bind_key=KEY) for e in range(40)]
        for g in groups:
            await g.wait()
        # 20 entries fit a half (~20 KB); the rest went straight to the entry log.
        assert s.engine.write_through > 0 and len(s.engine.write_cache) < 40
        for e in range(40):
            assert s.read_entry(1, e) == _entry(1, e)
        with trio.fail_after(10):  # past a quarter the checkpoint loop was woken
            await checkpointed.wait()
        await s.add_entries(1, 40, [_entry(1, 40)])
        nursery.cancel_scope.cancel()
    _crash(s)
    s2 = await _open(opts)
    assert s2.last_entry_id(1) == 40
    for e in range(41):
        assert s2.read_entry(1, e) == _entry(1, e)
    await s2.close()


async def test_truncate_delete_and_recreate_between_flush_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flush lets requests run between chunks; what they drop is not written, and a
    ledger re-created meanwhile keeps only its new entries."""
    monkeypatch.setattr(storage_mod, "FLUSH_YIELD_BYTES", 1)  # a chunk per entry
    opts = _opts(tmp_path)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for lid in (1, 2, 3):
            await s.add_entries(lid, 0, [_entry(lid, e) for e in range(20)], bind_key=KEY)
        real_add_sorted = s.entry_logger.add_sorted
        fired = []

        def add_sorted(items: list[tuple[int, int, bytes]]) -> list[int]:
            out = real_add_sorted(items)
            if not fired:  # after ledger 1's first chunk, as a request between chunks
                assert [(lid, eid) for lid, eid, _ in items] == [(1, 0)]
                fired.append(1)
                s._truncate_after(2, 9)
                s.cache.delete(3)
                s.engine.drop_cached(3)
                s.submit_entries(3, 0, [_entry(3, 100)], bind_key=KEY)
            return out

        monkeypatch.setattr(s.entry_logger, "add_sorted", add_sorted)
        await s.checkpoint()
        assert fired and s.engine.flushing is None
        assert s.last_entry_id(2) == 9 and s.read_entry(2, 9) == _entry(2, 9)
        with pytest.raises(EntryNotFoundError):
            s.read_entry(2, 10)
        assert s.last_entry_id(3) == 0 and s.read_entry(3, 0) == _entry(3, 100)
        await s.force()
        nursery.cancel_scope.cancel()
    await s.close()
    s2 = await _open(opts)
    assert s2.last_entry_id(1) == 19 and s2.read_entry(1, 19) == _entry(1, 19)
    assert s2.last_entry_id(2) == 9
    with pytest.raises(EntryNotFoundError):
        s2.read_entry(2, 10)
    assert s2.last_entry_id(3) == 0 and s2.read_entry(3, 0) == _entry(3, 100)
    await s2.close()


async def test_a_read_that_misses_reads_the_ledger_ahead(tmp_path: Path) -> None:
    opts = _opts(tmp_path, read_ahead_batch=50)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(120):
            for lid in (1, 2):
                await s.add_entries(lid, e, [_entry(lid, e)], bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    s = await _open(opts)  # caches empty, entries in the log sorted by ledger
    rc = s.engine.read_cache
    assert s.read_entry(1, 7) == _entry(1, 7)
    assert s.read_entry(2, 90) == _entry(2, 90)
    assert rc.inserted == 0  # reads that do not follow one another read one entry
    assert s.read_entry(1, 0) == _entry(1, 0)
    assert s.read_entry(1, 1) == _entry(1, 1)  # going forward: the next 50 come along
    assert rc.inserted == 50 and len(rc) == 50
    for e in range(2, 52):
        assert decode_entry(D, s.read_entry(1, e)).entry_id == e
    assert rc.hits == 50
    assert s.read_entry(1, 52) == _entry(1, 52)  # a miss after a hit: the next 50
    assert rc.inserted == 100
    s.read_entry(2, 0)
    s.read_entry(2, 1)
    assert set(rc.by_ledger) == {1, 2}
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.delete_ledger(1)
        assert 1 not in rc.by_ledger and all(k[0] == 2 for k in rc)
        with trio.fail_after(10):
            await s.truncate(2, 5)
        assert sorted(rc.by_ledger[2]) == [2, 3, 4, 5]
        with pytest.raises(EntryNotFoundError):
            s.read_entry(2, 6)
        nursery.cancel_scope.cancel()
    await s.close()


async def test_read_ahead_stays_within_its_bytes(tmp_path: Path) -> None:
    opts = _opts(tmp_path, read_cache_max_bytes=20_000)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, e) for e in range(200)], bind_key=KEY)
        await s.checkpoint()
        nursery.cancel_scope.cancel()
    await s.close()
    s = await _open(opts)
    for e in range(200):
        assert decode_entry(D, s.read_entry(1, e)).entry_id == e
        assert s.engine.read_cache.size <= 20_000
    assert s.engine.read_cache.hits > 150 and s.engine.read_cache.evicted > 0
    await s.close()


async def test_read_ahead_over_an_entry_added_again_further_on(tmp_path: Path) -> None:
    """A recovery adds an entry again after its successors were written: its new
    location is further on in the log than theirs. A reader going forward reads ahead
    from the entry before it; the span stops there instead of running backwards (a
    negative offset into the read, which closed the reader's connection)."""
    opts = _opts(tmp_path, read_ahead_batch=50)
    s = await _open(opts)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await s.add_entries(1, 0, [_entry(1, e) for e in range(10)], bind_key=KEY)
        await s.checkpoint()
        await s.add_entries(2, 0, [_entry(2, e) for e in range(20)], bind_key=KEY)
        for e in (2, 9):
            await s.add_entries(1, e, [_entry(1, e)], bind_key=KEY)
        await s.checkpoint()
        nursery.cancel_scope.cancel()
    await s.close()
    s = await _open(opts)
    for e in range(10):
        assert s.read_entry(1, e) == _entry(1, e)
    assert s.engine.read_cache.inserted >= 1  # the read-ahead ran
    await s.close()


def test_lookups_see_the_newer_generation_over_a_commit_in_flight(tmp_path: Path) -> None:
    c = DbLedgerCache([tmp_path])
    c.load_all()
    c.get_or_create(1)
    c.set_locations(1, 0, [100 + e for e in range(10)])
    job = c.begin_write_out()
    assert c.pending == {} and c.location(1, 5) == 105  # from the commit in flight
    c.truncate_after(1, 4)  # the next generation
    c.set_location(2, 0, 7)
    assert c.location(1, 5) == 0 and c.location(1, 4) == 104
    job.run()
    c.end_write_out(job)
    assert c.committing is None and c.commits == 1
    assert c.location(1, 5) == 0 and c.location(2, 0) == 7
    c.sync_paths(c.write_out())
    c.close()
    c = DbLedgerCache([tmp_path])
    c.load_all()
    assert c.get(1).last_entry_id == 4 and c.location(1, 5) == 0  # type: ignore[union-attr]
    assert c.get(2).last_entry_id == 0 and c.location(2, 0) == 7  # type: ignore[union-attr]
    c.close()


def test_a_failed_commit_is_absorbed_by_the_next(tmp_path: Path) -> None:
    c = DbLedgerCache([tmp_path])
    c.load_all()
    c.get_or_create(1)
    c.set_locations(1, 0, [100, 101, 102])
    c.get_or_create(3)
    c.set_location(3, 0, 300)
    job = c.begin_write_out()
    c.end_write_out(job)  # not run: as a commit that raised (a full disk)
    assert c.committing is job and c.location(1, 2) == 102
    c.truncate_after(1, 0)
    c.delete(3)
    c.set_location(4, 0, 400)
    c.sync_paths(c.write_out())
    assert c.committing is None
    c.close()
    c = DbLedgerCache([tmp_path])
    c.load_all()
    assert sorted(c.ledgers) == [1, 4]
    assert c.get(1).last_entry_id == 0 and c.location(1, 1) == 0  # type: ignore[union-attr]
    assert c.location(4, 0) == 400
    c.close()


def test_meta_records_of_the_first_version_still_load(tmp_path: Path) -> None:
    c = DbLedgerCache([tmp_path])
    c.load_all()
    idx = c.get_or_create(9)
    idx.term = 4
    c.set_locations(9, 0, [1, 2, 3])
    c.sync_paths(c.write_out())
    with c.env.begin(write=True, db=c.meta) as txn:  # as the first version wrote it
        key = struct.pack(">q", 9)
        value = txn.get(key)
        assert len(value) == HEAD_BYTES
        txn.put(key, value + struct.pack(">q", 77))  # a stale last entry: ignored
    c.sync_paths([c.path])
    c.close()
    c = DbLedgerCache([tmp_path])
    c.load_all()
    got = c.get(9)
    assert got is not None and got.term == 4 and got.last_entry_id == 2
    c.close()
