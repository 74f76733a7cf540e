"""The groups' offset index (``metadata.kafka_offsets``) on both stores: a cursor is
created only with its entry, deleted with it, and a commit that lands between a
delete's read and its multi makes the delete try again instead of leaving a cursor
without its entry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ledgerd.metadata.kafka_offsets import OffsetIndex
from ledgerd.metadata.logs import CursorRecord, LogStore
from ledgerd.metadata.store import MetadataStore, Op
from tests.metadata.conftest import StoreFactory

KAFKA, LOGS = "/c/kafka", "/c/logs"


def _log(topic: str, p: int) -> str:
    return f"{topic}-{p}"


class _Before:
    """The store, running ``hook`` once just before the first multi matching ``when``."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.hook: Callable[[], Awaitable[None]] | None = None
        self.when: Callable[[Sequence[Op]], bool] = lambda ops: True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def multi(self, ops: Sequence[Op]) -> None:
        hook, self.hook = (self.hook, None) if self.when(ops) else (None, self.hook)
        if hook is not None:
            await hook()
        await self.store.multi(ops)


async def _setup(stores: StoreFactory, *topics: tuple[str, int]) -> tuple[OffsetIndex, _Before]:
    raw = await stores.open()
    store = _Before(raw)
    logs = LogStore(store, LOGS)
    for topic, n in topics:
        for p in range(n):
            await logs.create(_log(topic, p))
    return OffsetIndex(store, KAFKA, logs, _log), store


async def _indexed(index: OffsetIndex, group: str) -> dict[str, tuple[int, ...]]:
    out = {}
    for topic in await index.topics(group):
        entry = await index.entry(group, topic)
        if entry is not None:
            out[topic] = entry.partitions
    return out


async def _cursors(index: OffsetIndex, group: str, topics: dict[str, int],
                   ) -> dict[str, tuple[int, ...]]:
    out = {}
    for topic, n in topics.items():
        have = tuple([p for p in range(n)
                      if await index.logs.get_cursor(_log(topic, p), f"kafka.{group}")])
        if have:
            out[topic] = have
    return out


def _rec(offset: int) -> CursorRecord:
    return CursorRecord(0, 0, 0, kafka_offset=offset)


async def test_commits_index_their_partitions_and_removal_takes_both(
        stores: StoreFactory) -> None:
    topics = {"a": 3, "b": 2}
    index, _ = await _setup(stores, *topics.items())
    for topic, p in (("a", 0), ("a", 2), ("b", 1)):
        await index.commit("g", topic, p, _rec(5))
    entry = await index.entry("g", "a")
    assert entry is not None
    await index.commit("g", "a", 0, _rec(7))  # a rewrite leaves the index alone
    assert await index.entry("g", "a") == entry
    got = await index.logs.get_cursor("a-0", "kafka.g")
    assert got is not None and got[0].kafka_offset == 7
    assert await _indexed(index, "g") == {"a": (0, 2), "b": (1,)}
    assert await _cursors(index, "g", topics) == {"a": (0, 2), "b": (1,)}
    assert await index.remove("g", "a", (2, 1)) == ((2,), False)  # 1 was never listed
    assert await _indexed(index, "g") == await _cursors(index, "g", topics) == {
        "a": (0,), "b": (1,)}
    assert await index.drop_group("g") == 2
    assert await _indexed(index, "g") == await _cursors(index, "g", topics) == {}
    assert await index.store.exists(index.group_path("g")) is None


async def test_a_commit_between_a_deletes_read_and_its_multi_is_not_orphaned(
        stores: StoreFactory) -> None:
    topics = {"t": 2}
    index, store = await _setup(stores, *topics.items())
    await index.commit("g", "t", 0, _rec(1))
    # the group's deletion reads t's entry ([0]) and p0's cursor; then p1's first
    # commit lands (its multi moves the entry's version) before the deletion's multi
    store.when = lambda ops: len(ops) == 2 and "kafka.g" in ops[0].path and \
        ops[0].path.startswith(f"{LOGS}/t-0")
    store.hook = lambda: index.commit("g", "t", 1, _rec(9))
    assert await index.drop_group("g") == 2  # tried again: both cursors deleted
    assert store.hook is None  # (the commit did come between)
    assert await _indexed(index, "g") == await _cursors(index, "g", topics) == {}


async def test_pruning_a_gone_topic_keeps_an_entry_whose_cursor_exists(
        stores: StoreFactory) -> None:
    topics = {"t": 2}
    index, store = await _setup(stores, *topics.items())
    await index.commit("g", "t", 0, _rec(1))
    await index.add("g", "t", (1,))  # an entry without a cursor (the migration's)
    assert await index.remove("g", "t", keep_present=True) == ((), True)
    assert await _indexed(index, "g") == await _cursors(index, "g", topics) == {"t": (0,)}
    # a commit between the prune's read and its multi: the prune reads again
    await index.add("g", "t", (1,))
    store.hook = lambda: index.commit("g", "t", 1, _rec(2))
    store.when = lambda ops: len(ops) == 1
    await index.remove("g", "t", keep_present=True)
    assert store.hook is None
    assert await _indexed(index, "g") == await _cursors(index, "g", topics) == {"t": (0, 1)}


async def test_a_wide_topics_offsets_are_removed_a_bounded_multi_at_a_time(
        stores: StoreFactory, monkeypatch: Any) -> None:
    """ZooKeeper refuses a request past jute.maxbuffer (1 MiB) by dropping the
    connection: a group's offsets on a topic of thousands of partitions go in multis
    of at most REMOVE_CHUNK cursors (here 10), each with its index write, so the
    invariant holds between them; a partition asked for that is not listed is
    reported (a cursor of the old layout may exist)."""
    import ledgerd.metadata.kafka_offsets as kafka_offsets

    monkeypatch.setattr(kafka_offsets, "REMOVE_CHUNK", 10)
    index, store = await _setup(stores, ("w", 35))
    for p in range(35):
        await index.commit("g", "w", p, _rec(p))
    sizes: list[int] = []
    real = store.store.multi

    async def counted(ops: Sequence[Op]) -> None:
        sizes.append(len(ops))
        await real(ops)

    store.store.multi = counted  # type: ignore[method-assign]
    deleted, listed = await index.remove("g", "w", [*range(0, 35, 2), 99])
    assert deleted == tuple(range(0, 35, 2)) and not listed
    assert sizes == [11, 9]  # 10 cursors and the index write, then 8 and the write
    assert await _indexed(index, "g") == {"w": tuple(range(1, 35, 2))}
    assert await _cursors(index, "g", {"w": 35}) == {"w": tuple(range(1, 35, 2))}
    sizes.clear()
    assert await index.drop_group("g") == 17
    assert sizes == [11, 8] and await _indexed(index, "g") == {}
    assert await _cursors(index, "g", {"w": 35}) == {}
