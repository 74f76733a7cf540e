"""The GC service: ledgers gone from metadata are deleted here, then their log space."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.gc import GarbageCollector, GcOptions
from metadata.cluster import init_new_cluster
from metadata.errors import SessionExpiredError
from metadata.ledger import LedgerMetadata
from metadata.ledgers import LedgerManager
from metadata.memory import InMemoryCluster, InMemoryStore
from tests.appliance.harness import KEY, entry, running_bookie
from wire.messages import AdminKind


def _meta() -> LedgerMetadata:
    return LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                          ensembles=((0, ("127.0.0.1:3181",)),))


async def test_gc_deletes_ledgers_missing_from_metadata_and_reclaims_logs(tmp_path: Path) -> None:
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    kept, _ = await ledgers.create(_meta())
    dropped, _ = await ledgers.create(_meta())
    never, _ = await ledgers.create(_meta())
    async with running_bookie(tmp_path, log_size_limit=64 * 1024, write_buffer_size=4096) as b:
        for e in range(200):  # interleaved: every log is about half of each
            for lid in (kept, dropped):
                await b.storage.add_entries(lid, e, [entry(lid, e, payload=b"p" * 500)], bind_key=KEY)
        await b.storage.checkpoint()
        await ledgers.delete(dropped)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(minor_threshold=0.6, rate=0))
        before = len(b.storage.entry_logger.paths)
        assert gc.trigger(AdminKind.MINOR_COMPACTION)
        await gc.gc_once(AdminKind.MINOR_COMPACTION)
        assert b.storage.list_ledgers() == [kept]
        assert gc.ledgers_deleted == 1 and gc.logs_compacted >= 1
        assert len(b.storage.entry_logger.paths) < before
        for e in range(200):
            assert b.storage.read_entry(kept, e)
        # A ledger this bookie never held is not a problem; a failed scan deletes nothing.
        assert never not in b.storage.list_ledgers()
        await store.close()
        with pytest.raises(SessionExpiredError):
            await gc.gc_once()
        assert b.storage.list_ledgers() == [kept]


async def test_gc_drops_what_retention_trimmed_and_reports_its_pass(tmp_path: Path) -> None:
    """An unbounded ledger whose metadata starts at 200: entries below go from the
    index and the logs holding only them are deleted; the pass is summarised."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1, unbounded=True, term=1,
                        ensembles=((0, ("127.0.0.1:3181",)), (200, ("127.0.0.1:3181",))))
    lid, version = await ledgers.create(md)
    async with running_bookie(tmp_path, log_size_limit=64 * 1024, write_buffer_size=4096) as b:
        for e in range(400):
            await b.storage.add_entries(lid, e, [entry(lid, e, payload=b"p" * 500)],
                                        bind_key=KEY, new_term=1)
        await b.storage.checkpoint()
        gc = GarbageCollector(b.storage, ledgers, GcOptions(rate=0))
        p = await gc.gc_once()
        assert (p.entries_trimmed, p.logs_deleted) == (0, 0)
        await ledgers.write(lid, md.trimmed_before(250), version)  # fragment [0, 200) goes
        before = len(b.storage.entry_logger.paths)
        p = await gc.gc_once(AdminKind.MAJOR_COMPACTION)
        assert p.kind == "major" and p.entries_trimmed == 200 and p.logs_deleted >= 1
        assert p.bytes_reclaimed > 0 and p.seconds > 0 and p.phase == "done"
        assert len(b.storage.entry_logger.paths) == before - p.logs_deleted
        assert gc.status()["last"]["entries_trimmed"] == 200
        for e in range(200, 400):
            assert b.storage.read_entry(lid, e)
        p = await gc.gc_once()
        assert p.entries_trimmed == 0  # the start did not move
