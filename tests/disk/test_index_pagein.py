"""Index pages read off the event loop (interleaved storage): a page read by a worker
thread is cached only if no page was written to a file meanwhile (the read could be
older than the file) and the ledger is still the same one."""

from __future__ import annotations

from pathlib import Path

import trio

from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.entry import Digester, DigestType, encode_entry

KEY = b"k" * 20
D = Digester(DigestType.CRC32C)


def _entry(ledger: int, entry: int) -> bytes:
    return encode_entry(D, ledger, entry, entry - 1, 0, b"x" * 20)


async def test_a_page_read_off_the_loop_is_dropped_if_pages_were_written_meanwhile(
        tmp_path: Path) -> None:
    s = LedgerStorage(StorageOptions(journal_dir=tmp_path / "j", ledger_dirs=(tmp_path / "l",),
                                     page_limit=2, page_size=512))
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for lid in (1, 2, 3, 4):
            await s.add_entries(lid, 0, [_entry(lid, e) for e in range(10)], bind_key=KEY)
        await s.checkpoint()
        cache = s.cache
        assert s.pages_missing(1, 5)
        idx = cache.ledgers[1]
        seen = cache.page_writes
        pages = cache.read_pages(idx.path, cache.missing_pages(1, 0, 9))
        assert list(pages) == [0]
        await s.add_entries(2, 10, [_entry(2, 10)])
        await s.checkpoint()  # writes ledger 2's page: the read above may be stale now
        assert cache.install_pages(idx, pages, seen) == 0 and s.pages_missing(1, 5)
        await s.page_in(1, 0, 10)
        assert not s.pages_missing(1, 5) and cache.paged_in == 1
        misses = cache.misses
        assert s.read_entry(1, 5) == _entry(1, 5) and cache.misses == misses
        idx4 = cache.ledgers[4]
        seen = cache.page_writes
        pages4 = cache.read_pages(idx4.path, cache.missing_pages(4, 0, 9))
        assert list(pages4) == [0]
        await s.delete_ledger(4)  # deleted while its page was read
        assert cache.install_pages(idx4, pages4, seen) == 0
        gone = cache.read_pages(tmp_path / "l" / "nope.idx", [0])
        assert gone == {}
        nursery.cancel_scope.cancel()
    await s.close()
