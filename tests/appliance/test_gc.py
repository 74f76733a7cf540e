"""The GC service: ledgers gone from metadata are deleted here, then their log space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.appliance.gc import GarbageCollector, GcOptions
from ledgerd.metadata.cluster import delete_root, init_new_cluster
from ledgerd.metadata.errors import SessionExpiredError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.wire.messages import AdminKind
from tests.appliance.harness import KEY, entry, running_bookie


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
        await gc.gc_once()  # one pass finds it missing: a suspect, not yet deleted
        assert sorted(b.storage.list_ledgers()) == sorted([kept, dropped])
        assert gc.suspects == {dropped} and gc.status()["suspects"] == 1
        assert gc.trigger(AdminKind.MINOR_COMPACTION)
        await gc.gc_once(AdminKind.MINOR_COMPACTION)  # the next pass confirms it
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


class _RacingLedgers(LedgerManager):
    """Answers ``exists`` as the store stood when asked, after ``meanwhile`` ran: a
    ledger re-created (and written) while GC's question was in flight."""

    meanwhile: Any = None

    async def exists(self, ledger_id: int) -> bool:
        answer = await super().exists(ledger_id)
        if self.meanwhile is not None:
            hook, self.meanwhile = self.meanwhile, None
            await hook(ledger_id)
        return answer


async def test_a_ledger_recreated_while_gc_checks_it_is_not_deleted(tmp_path: Path) -> None:
    """BookKeeper's classic GC hazard: the id is deleted in metadata, GC asks whether
    it exists (no), and before GC deletes it here the ledger is re-created with the same
    id and writes its first entries. GC must leave them alone."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = _RacingLedgers(store, "/ledgers")
    lid, _ = await ledgers.create(_meta())
    async with running_bookie(tmp_path) as b:
        for e in range(10):
            await b.storage.add_entries(lid, e, [entry(lid, e, payload=b"old")], bind_key=KEY)
        await ledgers.delete(lid)

        async def recreate(ledger_id: int) -> None:
            await ledgers.create(_meta(), ledger_id=ledger_id)
            await b.storage.add_entries(ledger_id, 0, [entry(ledger_id, 0, payload=b"new")],
                                        bind_key=KEY)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(rate=0))
        p = await gc.gc_once()  # a suspect: the next pass checks it and deletes it
        assert p.ledgers_deleted == 0 and gc.suspects == {lid}
        ledgers.meanwhile = recreate
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and b.storage.list_ledgers() == [lid]
        assert b.storage.read_entry(lid, 0) == entry(lid, 0, payload=b"new")
        p = await gc.gc_once()  # now the metadata says it exists
        assert p.ledgers_deleted == 0
        assert b.storage.read_entry(lid, 0) == entry(lid, 0, payload=b"new")


async def test_a_ledger_recreated_after_deletion_keeps_its_new_entries(tmp_path: Path) -> None:
    """Deleted and re-created (same id, same key) before this bookie's GC ran: the new
    incarnation's entries replace the old ones here and survive GC and compaction."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    lid, _ = await ledgers.create(_meta())
    other, _ = await ledgers.create(_meta())
    async with running_bookie(tmp_path, log_size_limit=64 * 1024, write_buffer_size=4096) as b:
        for e in range(100):
            for x in (lid, other):
                await b.storage.add_entries(x, e, [entry(x, e, payload=b"o" * 500)], bind_key=KEY)
        await ledgers.delete(lid)
        await ledgers.create(_meta(), ledger_id=lid)
        for e in range(100):
            await b.storage.add_entries(lid, e, [entry(lid, e, payload=b"n" * 500)],
                                        bind_key=KEY)
        await b.storage.checkpoint()
        # Usage is counted per ledger, so the old copies look live: force every log
        # through compaction (a threshold above 1), which copies only what the index
        # points at, the new incarnation's entries.
        gc = GarbageCollector(b.storage, ledgers, GcOptions(major_threshold=1.01, rate=0))
        p = await gc.gc_once(AdminKind.MAJOR_COMPACTION)
        assert p.ledgers_deleted == 0 and p.logs_compacted > 0
        assert p.entries_moved < 2 * 200  # the old incarnation's copies were not moved
        for e in range(100):
            assert b.storage.read_entry(lid, e) == entry(lid, e, payload=b"n" * 500)
            assert b.storage.read_entry(other, e) == entry(other, e, payload=b"o" * 500)


async def test_a_ledger_deleted_while_compaction_copies_it(tmp_path: Path) -> None:
    """Compaction is copying a ledger's entries when that ledger is deleted here: the
    copies are not indexed for it (it does not come back), the other ledgers lose
    nothing, and the next pass reclaims the rest."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    a, _ = await ledgers.create(_meta())
    victim, _ = await ledgers.create(_meta())
    gone, _ = await ledgers.create(_meta())
    async with running_bookie(tmp_path, log_size_limit=64 * 1024, write_buffer_size=4096) as b:
        for e in range(150):
            for x in (a, victim, gone):
                await b.storage.add_entries(x, e, [entry(x, e, payload=b"p" * 400)], bind_key=KEY)
        await b.storage.checkpoint()
        await ledgers.delete(gone)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(major_threshold=0.9, rate=400))
        await gc.gc_once()  # ``gone`` a suspect: the pass below deletes it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gc.gc_once, AdminKind.MAJOR_COMPACTION)
            with trio.fail_after(30):  # a pass that ends first would leave us waiting
                while gc.current is None or gc.current.progress.entries_moved < 20:
                    await trio.sleep(0.01)
            await ledgers.delete(victim)
            assert await b.storage.delete_ledger(victim)
        assert gc.last is not None and gc.last.error == ""
        assert b.storage.ledger(victim) is None
        for e in range(150):
            assert b.storage.read_entry(a, e) == entry(a, e, payload=b"p" * 400)
        gc.options = GcOptions(major_threshold=0.9, rate=0)
        p = await gc.gc_once(AdminKind.MAJOR_COMPACTION)
        assert p.error == "" and b.storage.ledger(victim) is None
        metas = await b.storage.rolled_log_metas()
        assert all(m.usage(b.storage.cache.ledgers) >= 0.9 for m in metas)
        for e in range(150):
            assert b.storage.read_entry(a, e) == entry(a, e, payload=b"p" * 400)


async def test_minor_and_major_passes_keep_their_own_intervals(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Two hours of trio's clock with a pass every minute: a major pass every 30 min
    (it also counts as the minor), a minor one every 5 min between, plain GC otherwise;
    an admin's forced major comes at once and restarts both intervals."""
    async with running_bookie(tmp_path) as b:
        gc = GarbageCollector(b.storage, None, GcOptions(
            wait_s=60, minor_interval_s=300, major_interval_s=1800, rate=0))
        kinds: list[tuple[int, str]] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(gc.run)
            t0 = trio.current_time()
            while trio.current_time() - t0 < 7200:
                await gc.pass_done.wait()
                assert gc.last is not None
                kinds.append((round(trio.current_time() - t0), gc.last.kind))
            gc.trigger(AdminKind.MAJOR_COMPACTION)
            await gc.pass_done.wait()
            forced_at = trio.current_time()
            assert gc.last is not None and gc.last.kind == "major"
            await gc.pass_done.wait()
            assert gc.last.kind == "gc"  # the intervals restarted at the forced pass
            assert trio.current_time() - forced_at <= 61
            nursery.cancel_scope.cancel()
    majors = [t for t, k in kinds if k == "major"]
    minors = [t for t, k in kinds if k == "minor"]
    assert majors == [1800, 3600, 5400, 7200]
    assert all(t % 300 == 0 and t % 1800 != 0 for t in minors) and len(minors) == 20
    assert sum(1 for _, k in kinds if k == "gc") == len(kinds) - 24


async def test_a_root_deleted_recursively_under_a_pass_loses_no_ledger(tmp_path: Path) -> None:
    """A recursive delete of the root removes ledger znodes before (in no fixed order)
    the LAYOUT the guard checks: a pass running meanwhile sees ledgers gone while the
    metadata still looks whole. It only suspects them; by the next pass the LAYOUT is
    gone too, the guard holds GC back, and nothing is deleted (issue #49)."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    held = [(await ledgers.create(_meta()))[0] for _ in range(3)]
    async with running_bookie(tmp_path) as b:
        for lid in held:
            await b.storage.add_entries(lid, 0, [entry(lid, 0, payload=b"x")], bind_key=KEY)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(rate=0))
        await gc.gc_once()
        assert not gc.suspects  # all listed: nothing suspected
        for lid in held[:2]:  # the recursive delete has reached two ledgers...
            await ledgers.delete(lid)
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and gc.frozen == "" and gc.suspects == set(held[:2])
        await store.delete("/ledgers", recursive=True)  # ...and then the rest
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and "no cluster" in gc.frozen and not gc.suspects
        assert sorted(b.storage.list_ledgers()) == sorted(held)
        for lid in held:
            assert b.storage.read_entry(lid, 0) == entry(lid, 0, payload=b"x")


async def test_only_two_consecutive_trusted_passes_delete_a_ledger(tmp_path: Path) -> None:
    """A frozen pass between two that find a ledger missing resets the count, and so
    does a pass that finds it listed again (metadata put back): each time the ledger
    needs two trusted passes in a row before it goes."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    lid, _ = await ledgers.create(_meta())
    async with running_bookie(tmp_path) as b:
        await b.storage.add_entries(lid, 0, [entry(lid, 0, payload=b"x")], bind_key=KEY)
        await ledgers.delete(lid)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(rate=0))
        await gc.gc_once()
        assert gc.suspects == {lid}
        await store.create("/ledgers/gcfreeze", b"{}")
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and "gcfreeze" in gc.frozen and not gc.suspects
        await store.delete("/ledgers/gcfreeze")
        p = await gc.gc_once()  # trusted again, but the first of two
        assert p.ledgers_deleted == 0 and gc.suspects == {lid}
        await ledgers.create(_meta(), ledger_id=lid)  # listed again (a restore)
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and not gc.suspects
        await ledgers.delete(lid)
        p = await gc.gc_once()
        assert p.ledgers_deleted == 0 and gc.suspects == {lid}
        p = await gc.gc_once()
        assert p.ledgers_deleted == 1 and b.storage.list_ledgers() == []
        assert not gc.suspects


class _DeleteHookStore(InMemoryStore):
    """Runs ``after_delete(path)`` after each node it deletes, one at a time as a
    recursive delete goes: a GC pass landing between two of a slow delete's steps."""

    after_delete: Any = None

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        await super().delete(path, version, recursive=recursive)
        if self.after_delete is not None:
            await self.after_delete(path)


async def test_delete_root_stops_gc_before_any_ledger_goes(tmp_path: Path) -> None:
    """``delete_root`` deletes LAYOUT before the rest: even a recursive delete slow
    enough for two GC passes after each node it removes (more than the two-pass rule
    covers) loses no ledger, because every pass finds the guard failing."""
    store = _DeleteHookStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    held = [(await ledgers.create(_meta()))[0] for _ in range(3)]
    async with running_bookie(tmp_path) as b:
        for lid in held:
            await b.storage.add_entries(lid, 0, [entry(lid, 0, payload=b"x")], bind_key=KEY)
        gc = GarbageCollector(b.storage, ledgers, GcOptions(rate=0))
        deleted: list[str] = []

        async def two_passes(path: str) -> None:
            deleted.append(path)
            for _ in range(2):
                await gc.gc_once()
                assert gc.frozen, f"GC trusted the metadata after {path} was deleted"

        store.after_delete = two_passes
        await delete_root(store, "/ledgers")
        assert deleted[0] == "/ledgers/LAYOUT" and len(deleted) > len(held)
        assert gc.ledgers_deleted == 0 and sorted(b.storage.list_ledgers()) == sorted(held)
