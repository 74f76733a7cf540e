"""MetadataStore semantics, identical for the in-memory twin and ZooKeeper."""

from __future__ import annotations

import pytest
import trio

from ledgerd.metadata.errors import (
    BadVersionError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from ledgerd.metadata.store import Check, Create, Op, Remove, SessionEvent, SetData, WatchKind
from tests.metadata.conftest import StoreFactory


async def test_create_get_set_with_versions(stores: StoreFactory) -> None:
    s = await stores.open()
    assert await s.create("/a", b"x") == "/a"
    data, stat = await s.get("/a")
    assert (data, stat.version, stat.ephemeral_owner) == (b"x", 0, 0)
    stat = await s.set("/a", b"y", 0)
    assert stat.version == 1
    with pytest.raises(BadVersionError):
        await s.set("/a", b"z", 0)
    assert (await s.get("/a"))[0] == b"y"
    await s.set("/a", b"w")  # unconditional
    with pytest.raises(NodeExistsError):
        await s.create("/a")
    with pytest.raises(NoNodeError):
        await s.get("/missing")
    with pytest.raises(NoNodeError):
        await s.create("/no/parent")
    assert await s.create("/deep/er/node", b"1", make_parents=True) == "/deep/er/node"


async def test_delete_with_version_and_children(stores: StoreFactory) -> None:
    s = await stores.open()
    await s.create("/p")
    await s.create("/p/c")
    with pytest.raises(NotEmptyError):
        await s.delete("/p")
    with pytest.raises(BadVersionError):
        await s.delete("/p/c", version=3)
    await s.delete("/p/c", version=0)
    await s.create("/p/d")
    await s.create("/p/d/e")
    await s.delete("/p", recursive=True)
    assert await s.exists("/p") is None
    with pytest.raises(NoNodeError):
        await s.delete("/p")


async def test_sequential_nodes_are_unique_and_increasing(stores: StoreFactory) -> None:
    s = await stores.open()
    await s.create("/seq")
    paths = [await s.create("/seq/n-", sequential=True) for _ in range(5)]
    assert len(set(paths)) == 5
    assert paths == sorted(paths)
    assert all(len(p.rsplit("-", 1)[1]) == 10 for p in paths)
    assert sorted(await s.children("/seq")) == sorted(p.rsplit("/", 1)[1] for p in paths)


async def test_ephemeral_nodes_vanish_with_session_and_cannot_have_children(
        stores: StoreFactory) -> None:
    owner = await stores.open()
    other = await stores.open()
    await owner.create("/eph", b"", ephemeral=True)
    stat = await other.exists("/eph")
    assert stat is not None and stat.ephemeral_owner == owner.session_id
    with pytest.raises(MetadataError):
        await owner.create("/eph/child")
    await owner.close()
    assert await other.exists("/eph") is None


async def test_two_clients_racing_a_cas_exactly_one_wins(stores: StoreFactory) -> None:
    a, b = await stores.open(), await stores.open()
    await a.create("/race", b"0")
    _, stat_a = await a.get("/race")
    _, stat_b = await b.get("/race")
    results = []
    for store, value in ((a, b"a"), (b, b"b")):
        try:
            await store.set("/race", value, stat_a.version if store is a else stat_b.version)
            results.append("won")
        except BadVersionError:
            results.append("lost")
    assert sorted(results) == ["lost", "won"]
    data, stat = await b.get("/race")  # the loser re-reads and sees the winner's value
    assert data == b"a" and stat.version == 1


async def test_data_watch_notifies_on_change_and_delete(stores: StoreFactory) -> None:
    s = await stores.open()
    writer = await stores.open()
    await s.create("/w", b"0")
    seen = []
    with trio.fail_after(20):
        async with s.watch("/w", WatchKind.DATA) as events:
            await events.__anext__()  # the initial notification
            await writer.set("/w", b"1")
            await events.__anext__()
            seen.append((await s.get("/w"))[0])
            await writer.delete("/w")
            await events.__anext__()
            seen.append(await s.exists("/w"))
    assert seen == [b"1", None]


async def test_children_watch(stores: StoreFactory) -> None:
    s = await stores.open()
    writer = await stores.open()
    await s.create("/kids")
    with pytest.raises(NoNodeError):
        async with s.watch("/nothing", WatchKind.CHILDREN):
            pass
    with trio.fail_after(20):
        async with s.watch("/kids", WatchKind.CHILDREN) as events:
            await events.__anext__()
            await writer.create("/kids/one")
            while await s.children("/kids") != ["one"]:
                await events.__anext__()


async def test_session_expiry_is_reported_and_ephemerals_vanish(stores: StoreFactory) -> None:
    s = await stores.open()
    observer = await stores.open()
    await s.create("/mine", ephemeral=True)
    with trio.fail_after(30):
        async with s.session_events() as events:
            await stores.expire(s)
            got = []
            async for ev in events:
                got.append(ev)
                if ev is SessionEvent.CONNECTED and SessionEvent.LOST in got:
                    break
    assert SessionEvent.LOST in got
    assert await observer.exists("/mine") is None
    # The store works again on its new session.
    await s.create("/after", b"ok")
    assert (await observer.get("/after"))[0] == b"ok"


async def test_sync_then_get_sees_another_sessions_write(stores: StoreFactory) -> None:
    a, b = await stores.open(), await stores.open()
    await a.create("/synced", b"1")
    await a.set("/synced", b"2")
    await b.sync("/synced")
    assert (await b.get("/synced"))[0] == b"2"


async def test_multi_applies_all_its_ops_or_none(stores: StoreFactory) -> None:
    s = await stores.open()
    await s.create("/m")
    await s.create("/m/a", b"a")
    await s.multi([Check("/m/a", 0), SetData("/m/a", b"a1", 0), Create("/m/b", b"b"),
                   Create("/m/b/c"), Remove("/m/b/c")])
    assert (await s.get("/m/a"))[0] == b"a1" and (await s.get("/m/b"))[0] == b"b"
    assert await s.exists("/m/b/c") is None
    # each failing op names itself, and nothing before it is applied
    cases: list[tuple[list[Op], type[Exception], str]] = [
        ([SetData("/m/a", b"x"), Check("/m/a", 0)], BadVersionError, "/m/a"),
        ([Create("/m/z"), Create("/m/b")], NodeExistsError, "/m/b"),
        ([Create("/m/z"), Remove("/m/none")], NoNodeError, "/m/none"),
        ([Create("/m/z"), Remove("/m")], NotEmptyError, "/m"),
        ([Remove("/m/b"), Create("/m/b/c")], NoNodeError, "/m/b"),
    ]
    for ops, error, path in cases:
        with pytest.raises(error, match=path):
            await s.multi(ops)
        assert (await s.get("/m/a"))[0] == b"a1" and await s.exists("/m/z") is None
        assert await s.exists("/m/b") is not None
    # create-then-delete in one multi asserts absence and leaves nothing
    await s.multi([Create("/m/y"), Remove("/m/y"), Remove("/m/b", 0)])
    assert await s.children("/m") == ["a"]
