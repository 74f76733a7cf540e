"""Entry-log GC and compaction: dead logs go, sparse logs are rewritten, nothing live is lost."""

from __future__ import annotations

from pathlib import Path

import trio

from disk.compaction import compact_entry_logs, read_entry_log_meta
from disk.storage import LedgerStorage, StorageOptions
from wire.entry import Digester, DigestType, decode_entry, encode_entry

KEY = b"k" * 20
D = Digester(DigestType.CRC32C)


def _opts(base: Path) -> StorageOptions:
    return StorageOptions(journal_dir=base / "journal", ledger_dirs=(base / "ledgers",),
                          log_size_limit=32 * 1024, write_buffer_size=4096)


def _entry(ledger: int, entry: int) -> bytes:
    return encode_entry(D, ledger, entry, entry - 1, 0, bytes([ledger, entry % 251]) * 300)


async def _fill(s: LedgerStorage) -> None:
    # Ledger 1 alone fills the first logs; then 2 and 3 interleave.
    for e in range(150):
        await s.add_entries(1, e, [_entry(1, e)], bind_key=KEY)
    for e in range(300):
        await s.add_entries(2 + e % 2, e // 2, [_entry(2 + e % 2, e // 2)], bind_key=KEY)
    await s.checkpoint()


async def test_dead_logs_deleted_sparse_logs_compacted_and_survive_restart(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    s = LedgerStorage(opts)
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        await _fill(s)
        before = await s.rolled_log_metas()
        assert len(before) >= 8
        only_1 = [m.log_id for m in before if set(m.ledgers) == {1}]
        mixed = [m.log_id for m in before if {2, 3} <= set(m.ledgers)]
        assert only_1 and mixed
        await s.delete_ledger(1)
        await s.delete_ledger(3)

        # Threshold 0: only logs with nothing live go.
        result = await compact_entry_logs(s, threshold=0.0)
        assert set(only_1) <= set(result.logs_deleted)
        assert not result.logs_compacted
        for log_id in only_1:
            assert log_id not in s.entry_logger.paths

        # Mixed logs are about half live: a 0.6 threshold compacts them.
        result = await compact_entry_logs(s, threshold=0.6)
        assert set(mixed) & set(result.logs_compacted)
        assert result.entries_moved > 0
        for log_id in result.logs_compacted:
            assert log_id not in s.entry_logger.paths
            assert not any(p.name == f"{log_id:x}.log"
                           for p in (tmp_path / "ledgers" / "current").iterdir())
        for e in range(150):
            got = decode_entry(D, s.read_entry(2, e))
            assert got.entry_id == e and got.payload == bytes([2, e % 251]) * 300
        nursery.cancel_scope.cancel()
    await s.close()

    s2 = LedgerStorage(opts)
    await s2.open()
    assert s2.list_ledgers() == [2]
    for e in range(150):
        assert decode_entry(D, s2.read_entry(2, e)).payload == bytes([2, e % 251]) * 300
    await s2.close()


async def test_meta_of_a_log_that_never_rolled_is_rebuilt_by_scanning(tmp_path: Path) -> None:
    opts = _opts(tmp_path)
    s = LedgerStorage(opts)
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for e in range(10):
            await s.add_entries(7, e, [_entry(7, e)], bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    path = next((tmp_path / "ledgers" / "current").glob("*.log"))
    meta = read_entry_log_meta(path, int(path.stem, 16))
    assert meta.ledgers == {7: 10 * (len(_entry(7, 0)) + 8)}
