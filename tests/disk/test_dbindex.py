"""The db storage's index (one LMDB store for every ledger): locations and ledger state
survive write_out + reopen; delete, truncate and trim are range operations that also
hold for what is still in memory; a ledger deleted and re-created before a checkpoint
keeps only its new entries; a storage refuses data of the other kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgerd.disk.dbindex import DbLedgerCache
from ledgerd.disk.errors import StorageError
from ledgerd.disk.storage import LedgerStorage, StorageOptions


def _cache(tmp_path: Path) -> DbLedgerCache:
    c = DbLedgerCache([tmp_path])
    c.load_all()
    return c


def _reopened(c: DbLedgerCache, tmp_path: Path) -> DbLedgerCache:
    c.sync_paths(c.write_out())
    c.close()
    return _cache(tmp_path)


def test_locations_and_state_survive_a_reopen(tmp_path: Path) -> None:
    c = _cache(tmp_path)
    idx = c.get_or_create(7)
    idx.master_key, idx.fenced, idx.term, idx.header_dirty = b"k" * 20, True, 3, True
    c.set_locations(7, 0, [100 + i for i in range(1000)])
    c.set_location(9, 5, 42)
    assert c.location(7, 999) == 1099 and c.location(7, 1000) == 0
    c = _reopened(c, tmp_path)
    got = c.get(7)
    assert got is not None and got.fenced and got.term == 3 and got.master_key == b"k" * 20
    assert got.last_entry_id == 999 and c.location(7, 500) == 600
    assert c.get(9) is not None and c.location(9, 5) == 42 and c.location(9, 4) == 0
    c.close()


def test_delete_truncate_and_trim_are_ranges_in_memory_and_on_disk(tmp_path: Path) -> None:
    c = _cache(tmp_path)
    for lid in (1, 2, 3):
        c.set_locations(lid, 0, [lid * 1000 + e for e in range(100)])
    c = _reopened(c, tmp_path)
    c.set_locations(1, 100, [1100 + e for e in range(10)])  # some only in memory
    assert c.delete(2) is None  # nothing to unlink
    c.truncate_after(1, 49)
    assert c.trim_before(3, 90) == 90
    assert c.location(1, 50) == 0 and c.location(1, 105) == 0 and c.location(1, 49) == 1049
    assert c.location(3, 89) == 0 and c.location(3, 90) == 3090
    assert c.get(2) is None
    c = _reopened(c, tmp_path)
    assert sorted(c.ledgers) == [1, 3]
    assert c.get(1).last_entry_id == 49 and c.location(1, 60) == 0  # type: ignore[union-attr]
    assert c.location(3, 10) == 0 and c.location(3, 99) == 3099
    c.close()


def test_a_ledger_deleted_and_recreated_before_a_checkpoint_keeps_only_new_entries(
        tmp_path: Path) -> None:
    c = _cache(tmp_path)
    c.set_locations(5, 0, [1, 2, 3])
    c = _reopened(c, tmp_path)
    c.delete(5)
    c.set_location(5, 0, 77)  # re-created: entry 0 again, nothing else
    c = _reopened(c, tmp_path)
    assert c.location(5, 0) == 77 and c.location(5, 1) == 0 and c.get(5).last_entry_id == 0  # type: ignore[union-attr]
    c.close()


@pytest.mark.parametrize("kind", ["db", "interleaved"])
async def test_a_storage_refuses_the_other_kinds_data(tmp_path: Path, kind: str) -> None:
    import trio

    other = "interleaved" if kind == "db" else "db"
    base = dict(journal_dir=tmp_path / "j", ledger_dirs=(tmp_path / "l",))
    s = LedgerStorage(StorageOptions(**base, ledger_storage_class=other))  # type: ignore[arg-type]
    await s.open()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        from tests.disk.test_storage import KEY, _entry
        await s.add_entries(1, 0, [_entry(1, 0)], bind_key=KEY)
        nursery.cancel_scope.cancel()
    await s.close()
    with pytest.raises(StorageError, match=f"ledger_storage_class = '{kind}'.*convertstorage"):
        await LedgerStorage(StorageOptions(**base, ledger_storage_class=kind)).open()  # type: ignore[arg-type]
