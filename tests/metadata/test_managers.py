"""Ledger manager, registry, underreplication, election, logs and cluster ops on both stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.metadata.cluster import check_layout, init_new_cluster, instance_id, metaformat
from ledgerd.metadata.cookies import CookieStore
from ledgerd.metadata.errors import (
    BadVersionError,
    ChangeRejectedError,
    CorruptMetadataError,
    LayoutMismatchError,
    NodeExistsError,
)
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.logs import LogRecord, LogStore
from ledgerd.metadata.paths import LedgerLayout
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.metadata.store import WatchKind
from ledgerd.metadata.underreplication import AuditorElection, UnderreplicationManager
from tests.metadata.conftest import StoreFactory

ROOT = "/ledgers"


def _meta(**kw: object) -> LedgerMetadata:
    base: dict[str, object] = dict(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                   ensembles=((0, ("b1:3181", "b2:3181", "b3:3181")),))
    base.update(kw)
    return LedgerMetadata(**base)  # type: ignore[arg-type]


async def _cluster(stores: StoreFactory, layout: str = LedgerLayout.HIERARCHICAL) -> LedgerManager:
    s = await stores.open()
    await init_new_cluster(s, ROOT, layout)
    return LedgerManager(s, ROOT, layout)


async def test_init_is_idempotent_and_refuses_other_layout(stores: StoreFactory) -> None:
    s = await stores.open()
    iid = await init_new_cluster(s, ROOT, LedgerLayout.FLAT)
    assert iid is not None and await instance_id(s, ROOT) == iid
    assert await init_new_cluster(s, ROOT, LedgerLayout.FLAT) is None
    with pytest.raises(LayoutMismatchError):
        await init_new_cluster(s, ROOT, LedgerLayout.HIERARCHICAL)
    with pytest.raises(LayoutMismatchError, match="configured for hierarchical"):
        await check_layout(s, ROOT, LedgerLayout.HIERARCHICAL)
    await s.create(f"{ROOT}/L0000000001", b"x")
    new_iid = await metaformat(s, ROOT, LedgerLayout.HIERARCHICAL)
    assert new_iid != iid
    assert await s.exists(f"{ROOT}/L0000000001") is None
    assert await check_layout(s, ROOT) == LedgerLayout.HIERARCHICAL
    with pytest.raises(LayoutMismatchError, match="initnewcluster"):
        await check_layout(s, "/elsewhere")


async def test_foreign_layout_node_is_refused(stores: StoreFactory) -> None:
    s = await stores.open()
    await s.create("/foreign", b"")
    await s.create("/foreign/LAYOUT", b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1")
    with pytest.raises(LayoutMismatchError, match="not a ledgerd layout"):
        await check_layout(s, "/foreign")


async def test_ledger_ids_unique_under_concurrent_creates(stores: StoreFactory) -> None:
    managers = [await _cluster(stores)]
    for _ in range(2):
        managers.append(LedgerManager(await stores.open(), ROOT))
    ids: list[int] = []

    async def creator(m: LedgerManager) -> None:
        for _ in range(15):
            lid, version = await m.create(_meta())
            assert version == 0
            ids.append(lid)

    async with trio.open_nursery() as nursery:
        for m in managers:
            nursery.start_soon(creator, m)
    assert len(ids) == 45 and len(set(ids)) == 45
    listed = [lid async for lid in managers[0].iter_ledger_ids()]
    assert listed == sorted(ids)


@pytest.mark.parametrize("layout", LedgerLayout.ALL)
async def test_layouts_round_trip_including_large_ids(stores: StoreFactory, layout: str) -> None:
    m = await _cluster(stores, layout)
    wanted = [0, 7, 9_999, 2**31 - 2, 2**31 - 1, 2**31, 9_999_999_999]
    if layout == LedgerLayout.HIERARCHICAL:
        wanted += [2**40 + 3, 2**62]
    for lid in wanted:
        await m.create(_meta(custom_metadata={"n": str(lid)}), ledger_id=lid)
    with pytest.raises(NodeExistsError):
        await m.create(_meta(), ledger_id=7)
    for lid in wanted:
        meta, version = await m.read(lid)
        assert meta.custom_metadata == {"n": str(lid)} and version == 0
    assert [x async for x in m.iter_ledger_ids()] == sorted(wanted)
    assert [x async for x in m.iter_ledger_ids(5, 2**31)] == [7, 9_999, 2**31 - 2, 2**31 - 1]
    if layout == LedgerLayout.HIERARCHICAL:
        lid = await m.next_id(long_ids=True)
        assert lid >= 2**32
        await m.create(_meta(), ledger_id=lid)
        assert (await m.read(lid))[0].ensemble_size == 3


async def test_cas_update_close_and_rejection(stores: StoreFactory) -> None:
    m = await _cluster(stores)
    lid, _ = await m.create(_meta())
    other = LedgerManager(await stores.open(), ROOT)
    meta, version = await m.read(lid)
    await other.update(lid, lambda md: md.with_ensemble(5, ("b1:3181", "b4:3181", "b3:3181")))
    with pytest.raises(BadVersionError):
        await m.write(lid, meta.closed(4, 100), version)
    closed, v2 = await m.update(lid, lambda md: md.closed(4, 100))
    assert closed.state is LedgerState.CLOSED and closed.ensembles[1][0] == 5 and v2 == 2
    with pytest.raises(ChangeRejectedError, match="CLOSED"):
        await other.update(lid, lambda md: md.with_state(LedgerState.IN_RECOVERY))
    await m.delete(lid, version=v2)
    assert not await m.exists(lid)


async def test_cas_update_from_a_known_version_falls_back_to_the_stored_value(
        stores: StoreFactory) -> None:
    """``known`` (the value a caller last wrote, and its version) saves the read only
    while it is current: once another writer moved the node on, the change applies to
    the stored value, even where it refused or kept the stale one."""
    from ledgerd.metadata.cas import cas_update

    s = await stores.open()
    await s.create("/cas-known", b"1", make_parents=True)

    def add(n: int) -> Callable[[int], int]:
        return lambda v: v + n

    def decode(raw: bytes, _path: str) -> int:
        return int(raw)

    def encode(v: int) -> bytes:
        return str(v).encode()

    def update(change: Callable[[int], int], known: tuple[int, int]) -> Any:
        return cas_update(s, "/cas-known", change, decode=decode, encode=encode,
                          known=known)

    assert await update(add(1), (1, 0)) == (2, 1)  # current: written from it
    assert await update(add(10), (1, 0)) == (12, 2)  # stale: 10 added to the stored 2

    def refuse_stale(v: int) -> int:
        if v == 2:
            raise ChangeRejectedError("only the stale value is refused")
        return v if v == 12 else v + 1

    assert await update(refuse_stale, (2, 1)) == (12, 2)  # kept: the stored 12 decides
    assert (await s.get("/cas-known"))[0] == b"12"


async def test_racing_cas_updates_all_apply(stores: StoreFactory) -> None:
    m = await _cluster(stores)
    lid, _ = await m.create(_meta())
    managers = [m, LedgerManager(await stores.open(), ROOT)]

    def bump(md: LedgerMetadata) -> LedgerMetadata:
        n = int(md.custom_metadata.get("n", "0"))
        from dataclasses import replace
        return replace(md, custom_metadata={"n": str(n + 1)})

    async with trio.open_nursery() as nursery:
        for mgr in managers:
            for _ in range(10):
                nursery.start_soon(mgr.update, lid, bump)
    meta, version = await m.read(lid)
    assert meta.custom_metadata == {"n": "20"} and version == 20


async def test_corrupt_ledger_node_names_path(stores: StoreFactory) -> None:
    m = await _cluster(stores)
    await m.store.create(m.path(3), b"{not json", make_parents=True)
    with pytest.raises(CorruptMetadataError, match=m.path(3)):
        await m.read(3)


async def test_watch_one_ledger(stores: StoreFactory) -> None:
    m = await _cluster(stores)
    lid, _ = await m.create(_meta())
    other = LedgerManager(await stores.open(), ROOT)
    with trio.fail_after(20):
        async with m.watch(lid) as events:
            await events.__anext__()
            await other.update(lid, lambda md: md.closed(-1, 0))
            while not (await m.read(lid))[0].is_closed:
                await events.__anext__()


async def test_registry_membership_events_on_session_close(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    watcher = BookieRegistry(s, ROOT)
    b1 = BookieRegistry(await stores.open(), ROOT)
    b2 = BookieRegistry(await stores.open(), ROOT)
    with trio.fail_after(30):
        async with watcher.watch_bookies() as snapshots:
            assert await snapshots.__anext__() == BookieSet(frozenset(), frozenset())
            await b1.register("127.0.0.1:3181", {"port": 3181})
            await b2.register("127.0.0.1:3182", {"port": 3182}, read_only=True)
            want = BookieSet(frozenset({"127.0.0.1:3181"}), frozenset({"127.0.0.1:3182"}))
            while await snapshots.__anext__() != want:
                pass
            assert await watcher.bookie_info("127.0.0.1:3182") == {"port": 3182}
            await b1.store.close()
            want = BookieSet(frozenset(), frozenset({"127.0.0.1:3182"}))
            while await snapshots.__anext__() != want:
                pass
            await b2.register("127.0.0.1:3182", {"port": 3182}, read_only=False)
            want = BookieSet(frozenset({"127.0.0.1:3182"}), frozenset())
            while await snapshots.__anext__() != want:
                pass


async def test_registry_refuses_id_held_by_live_session(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    await BookieRegistry(s, ROOT).register("b:1", {})
    from ledgerd.metadata.errors import BookieIdInUseError
    with pytest.raises(BookieIdInUseError, match="b:1"):
        await BookieRegistry(await stores.open(), ROOT).register("b:1", {}, stale_wait=0.5)


async def test_registered_by_names_the_registering_process(stores: StoreFactory) -> None:
    """A listed id is not enough: the registration must name the process waited for (a
    killed one's stays listed until its session expires); read-only counts only when
    asked for."""
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    reg = BookieRegistry(s, ROOT)
    await reg.register("b:1", {"pid": 101})
    await reg.register("b:2", {"pid": 102}, read_only=True)
    await reg.register("b:3", {})
    snap = await reg.list_bookies()
    assert await reg.registered_by(snap, {"b:1": 101})
    assert not await reg.registered_by(snap, {"b:1": 999})  # another process's
    assert not await reg.registered_by(snap, {"b:1": None})  # not started
    assert not await reg.registered_by(snap, {"b:2": 102})  # read-only
    assert await reg.registered_by(snap, {"b:1": 101, "b:2": 102}, writable=False)
    assert not await reg.registered_by(snap, {"b:3": 0})  # names no pid
    assert not await reg.registered_by(snap, {"b:4": 104})  # not registered
    assert await reg.registered_pid("b:2") == 102 and await reg.registered_pid("b:4") is None


async def test_registered_as_waits_for_a_move_between_the_lists_to_end(
        stores: StoreFactory) -> None:
    """``register`` creates the new node before it removes the old one: a bookie just
    turned read-only is listed writable too for a moment. A waiter for "writable" that
    took that stale node sent adds refused READ_ONLY; the move counts once the old node
    of the same process is gone (another process's lingering node does not hold it)."""
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    reg = BookieRegistry(s, ROOT)
    await reg.register("b:1", {"pid": 101})
    # read-only now, the writable node not yet removed
    await s.create(reg.registration_path("b:1", read_only=True), b'{"pid": 101}',
                   ephemeral=True)
    snap = await reg.list_bookies()
    assert "b:1" in snap.writable and "b:1" in snap.read_only
    assert not await reg.registered_by(snap, {"b:1": 101})
    assert not await reg.registered_as(snap, "b:1", 101, read_only=False)
    assert not await reg.registered_as(snap, "b:1", 101, read_only=True)
    assert await reg.registered_by(snap, {"b:1": 101}, writable=False)
    await s.delete(reg.registration_path("b:1", read_only=False))
    snap = await reg.list_bookies()
    assert await reg.registered_as(snap, "b:1", 101, read_only=True)
    assert not await reg.registered_as(snap, "b:1", 101, read_only=False)
    # a writable node naming another (killed) process does not hold up "read-only"
    await s.create(reg.registration_path("b:1", read_only=False), b'{"pid": 99}',
                   ephemeral=True)
    snap = await reg.list_bookies()
    assert await reg.registered_as(snap, "b:1", 101, read_only=True)
    assert await reg.registered_pid("b:1", read_only=False) == 99
    assert await reg.registered_pid("b:1", read_only=True) == 101


async def test_keep_registered_survives_session_expiry(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    observer = BookieRegistry(await stores.open(), ROOT)
    reg = BookieRegistry(s, ROOT)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            await nursery.start(reg.keep_registered, "b:1", lambda: {"v": 1}, lambda: False)
            assert (await observer.list_bookies()).writable == {"b:1"}
            old_session = s.session_id
            path = f"{ROOT}/available/b:1"
            async with observer.store.watch(path, WatchKind.DATA) as events:
                await stores.expire(s)
                # The node went with the old session; the registrar re-creates it on the
                # new one (which is what its owner id tells us).
                async for _ in events:
                    stat = await observer.store.exists(path)
                    if stat is not None and stat.ephemeral_owner not in (0, old_session):
                        break
            assert s.session_id != old_session
            nursery.cancel_scope.cancel()
    assert (await observer.list_bookies()).writable == frozenset()


async def test_lock_exclusivity_between_workers(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    w1 = UnderreplicationManager(s, ROOT)
    w2 = UnderreplicationManager(await stores.open(), ROOT)
    await w1.mark_underreplicated(42, ["b1:3181"])
    await w2.mark_underreplicated(42, ["b2:3181"])
    await w1.mark_underreplicated(2**40, ["b3:3181"])
    records = [r async for r in w2.list_underreplicated()]
    assert [(r.ledger_id, r.missing_replicas) for r in records] == [
        (42, ("b1:3181", "b2:3181")), (2**40, ("b3:3181",))]
    assert await w1.acquire_lock(42, "w1") == 1  # the record's version: merged once
    assert await w2.acquire_lock(42) is None
    assert await w2.lock_holder(42) == "w1"
    await w2.release_lock(42)  # not ours: no effect
    assert await w2.acquire_lock(42) is None
    await w1.release_lock(42)
    assert await w2.acquire_lock(42) is not None
    await w2.store.close()  # a dead worker's lock goes with its session
    version = await w1.acquire_lock(42)
    assert version is not None
    # Re-marked while w1 worked: the record stays (the version moved), lock released.
    await w1.mark_underreplicated(42, ["b9:3181"])
    assert not await w1.mark_replicated(42, version)
    assert (await w1.get(42)).missing_replicas == ("b1:3181", "b2:3181", "b9:3181")
    assert await w1.lock_holder(42) is None
    version = await w1.acquire_lock(42)
    assert version is not None and await w1.mark_replicated(42, version)
    assert await w1.get(42) is None
    assert [r.ledger_id async for r in w1.list_underreplicated()] == [2**40]
    # pick: a shuffled walk that skips locked ledgers
    import random
    assert await w1.pick(random.Random(1), "w1") == (2**40, 0)
    assert await w1.pick(random.Random(1), "w1") is None
    assert await w1.count() == 1


async def test_lost_bookie_delay_node(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    m = UnderreplicationManager(s, ROOT)
    assert await m.get_lost_bookie_delay() is None
    assert await m.ensure_lost_bookie_delay(30) == 30
    assert await m.ensure_lost_bookie_delay(5) == 30  # an existing value wins
    await m.set_lost_bookie_delay(0)
    assert await m.get_lost_bookie_delay() == 0
    with pytest.raises(ValueError):
        await m.set_lost_bookie_delay(-1)


async def test_disable_switch_seen_by_watcher(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    admin = UnderreplicationManager(s, ROOT)
    worker = UnderreplicationManager(await stores.open(), ROOT)
    assert await worker.is_enabled()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def wait_off() -> None:
                await worker.wait_disabled()
                done.set()

            nursery.start_soon(wait_off)
            # No need to wait for the watcher: its first notification re-reads the state.
            await admin.set_enabled(False)
            await done.wait()
        assert not await worker.is_enabled()
        await admin.set_enabled(True)
        await worker.wait_enabled()


async def test_election_hands_over_when_auditor_session_ends(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    first = AuditorElection(await stores.open(), ROOT)
    second = AuditorElection(await stores.open(), ROOT)
    observer = AuditorElection(s, ROOT)
    with trio.fail_after(30):
        async with first.candidacy("b1:3181") as c1:
            await c1.wait_elected()
            async with second.candidacy("b2:3181") as c2:
                assert await observer.current_auditor() == "b1:3181"
                elected = trio.Event()

                async def wait_second() -> None:
                    await c2.wait_elected()
                    elected.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait_second)
                    await trio.testing.wait_all_tasks_blocked()
                    assert not elected.is_set()  # b1 still holds the lowest node
                    await first.store.close()  # the auditor's session ends
                    await elected.wait()
                assert await observer.current_auditor() == "b2:3181"


async def test_cookies_versioned(stores: StoreFactory) -> None:
    s = await stores.open()
    await init_new_cluster(s, ROOT)
    cookies = CookieStore(s, ROOT)
    assert await cookies.get("b:1") is None
    await cookies.create("b:1", b"c1")
    with pytest.raises(NodeExistsError):
        await cookies.create("b:1", b"again")
    assert await cookies.get("b:1") == (b"c1", 0)
    assert await cookies.update("b:1", b"c2", 0) == 1
    with pytest.raises(BadVersionError):
        await cookies.update("b:1", b"c3", 0)


async def test_log_records(stores: StoreFactory) -> None:
    s = await stores.open()
    logs = LogStore(s, "/logs")
    assert await logs.names() == []
    await logs.create("events")
    rec, v = await logs.get("events")
    assert rec == LogRecord() and v == 0
    await logs.update("events", lambda r: LogRecord((*r.ledgers, 5)))
    with pytest.raises(BadVersionError):
        await logs.write("events", LogRecord((9,)), 0)
    assert (await logs.get("events"))[0].ledgers == (5,)
    assert await logs.names() == ["events"]
    await s.set("/logs/events", b'{"format": 1, "ledgers": [-1]}')
    with pytest.raises(CorruptMetadataError, match="/logs/events"):
        await logs.get("events")
    with pytest.raises(ValueError, match="invalid log name"):
        logs.path("../x")
