"""Index pages read off the event loop (interleaved storage).

- A page the OS page cache holds is read on the loop (``preadv2`` with RWF_NOWAIT);
  one it does not (evicted here, ``page_cache.evict``, or said so) is read in a worker
  thread.
- Reads: a page read by a worker thread is cached only if its ledger's file was not
  written meanwhile (the read could be older than the file) and the ledger is still the
  same one.
- Adds: a location whose page is not in memory waits aside (readable at once) while
  the page-in task reads the page in a worker thread; a checkpoint writes every waiting
  location first; nothing is lost to a crash either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ledgerd.disk.index import LedgerCache
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from tests.disk.page_cache import evict, kernel_would_block

KEY = b"k" * 20
D = Digester(DigestType.CRC32C)


def _entry(ledger: int, entry: int) -> bytes:
    return encode_entry(D, ledger, entry, entry - 1, 0, b"x" * 20)


def _not_in_memory(cache: LedgerCache) -> int:
    """Ledgers 1-40 whose page 0 the cache does not hold (the OS page cache does not
    either, after ``evict``)."""
    return sum(0 not in cache.ledgers[lid].pages for lid in range(1, 41))


def _opts(tmp_path: Path) -> StorageOptions:
    return StorageOptions(journal_dir=tmp_path / "j", ledger_dirs=(tmp_path / "l",),
                          page_limit=2, page_size=512, flush_interval_ms=3_600_000)


async def test_a_page_read_off_the_loop_is_dropped_if_its_file_was_written_meanwhile(
        tmp_path: Path) -> None:
    s = LedgerStorage(_opts(tmp_path))
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for lid in (1, 2, 3, 4):
            await s.add_entries(lid, 0, [_entry(lid, e) for e in range(10)], bind_key=KEY)
        await s.checkpoint()
        cache = s.cache
        assert isinstance(cache, LedgerCache)
        idx = cache.ledgers[1]
        assert 0 not in idx.pages
        assert not s.pages_missing(1, 5)  # in the OS page cache: read on the loop
        assert 0 in idx.pages
        for lid in (2, 3, 4):  # push ledger 1's page out again, and out of the OS cache
            s.read_entry(lid, 0)
        evict(idx.path)
        assert s.pages_missing(1, 5)
        seen = idx.file_writes
        pages = cache.read_pages(idx.path, [0])
        assert list(pages) == [0]
        await s.add_entries(1, 10, [_entry(1, 10)])
        await s.checkpoint()  # writes ledger 1's page: the read above may be stale now
        assert cache.install_pages(idx, pages, seen) == 0
        for lid in (2, 3, 4):  # push ledger 1's page out again
            s.read_entry(lid, 0)
        evict(idx.path)
        assert s.pages_missing(1, 5)
        await s.page_in(1, 0, 11)  # (the NOWAIT attempt may have started the disk read)
        assert not s.pages_missing(1, 5) and 0 in idx.pages
        misses = cache.misses
        assert s.read_entry(1, 10) == _entry(1, 10) and cache.misses == misses
        idx4 = cache.ledgers[4]
        seen = idx4.file_writes
        idx4.pages.clear()  # (as if evicted)
        pages4 = cache.read_pages(idx4.path, [0])
        assert list(pages4) == [0]
        await s.delete_ledger(4)  # deleted while its page was read
        assert cache.install_pages(idx4, pages4, seen) == 0
        assert cache.read_pages(tmp_path / "l" / "nope.idx", [0]) == {}
        nursery.cancel_scope.cancel()
    await s.close()


async def test_adds_whose_page_is_not_in_memory_do_not_read_it_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = _opts(tmp_path)
    s = LedgerStorage(opts)
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for lid in range(1, 41):
            await s.add_entries(lid, 0, [_entry(lid, e) for e in range(10)], bind_key=KEY)
        await s.checkpoint()  # every file written; two pages stay in memory
        cache = s.cache
        assert isinstance(cache, LedgerCache)
        paths = [cache.ledgers[lid].path for lid in range(1, 41)]
        kernel_would_block(monkeypatch, *paths)
        assert cache.defer_misses, "the page-in task is not running"
        cold = _not_in_memory(cache)
        groups = [s.submit_entries(lid, 10, [_entry(lid, 10)]) for lid in range(1, 41)]
        assert cache.deferred_count == cold >= 30  # their pages are on disk only: not read
        assert s.read_entry(7, 10) == _entry(7, 10) and s.last_entry_id(7) == 10
        for g in groups:
            await g.wait()
        with trio.fail_after(10):
            await s.deferred_applied_wait()
        assert not cache.deferred and s.engine.deferred_applied >= 1
        assert cache.paged_in >= 38
        # Deferred again, then a checkpoint writes them into their pages first.
        await s.checkpoint()
        cold = _not_in_memory(cache)
        groups = [s.submit_entries(lid, 11, [_entry(lid, 11)]) for lid in range(1, 41)]
        assert cache.deferred_count == cold >= 30
        await s.checkpoint()
        assert not cache.deferred
        for g in groups:
            await g.wait()
        # And some left waiting at a crash: the journal brings them back.
        cold = _not_in_memory(cache)
        groups = [s.submit_entries(lid, 12, [_entry(lid, 12)]) for lid in range(1, 41)]
        assert cache.deferred_count == cold >= 30
        for g in groups:
            await g.wait()
        nursery.cancel_scope.cancel()
    s.journal._closed = True  # as a crash: no close, no final checkpoint
    s.entry_logger.close()
    s2 = LedgerStorage(opts)
    await s2.open()
    for lid in range(1, 41):
        assert s2.last_entry_id(lid) == 12
        for e in range(13):
            assert s2.read_entry(lid, e) == _entry(lid, e)
    await s2.close()
