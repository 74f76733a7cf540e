"""The groups' offset index against a real gateway, bookies and ZooKeeper: OffsetFetch
of all topics (topics = null: kafka-python's ``list_group_offsets``, KafkaJS's
``fetchOffsets``, ``kafka-consumer-groups --describe``) answers exactly the partitions
the group committed, after commits to several topics, OffsetDelete, a topic's deletion,
a transaction's offsets and DeleteGroups; it reads ZooKeeper in proportion to the group,
not to the cluster's 200 other topics; and offsets committed before the index existed
(no entries, no ``offset_index_complete``) are still found, then indexed."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import trio
import trio.testing

import ledgerd
from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.gateway import Gateway
from ledgerd.kafka.partitions import log_name
from ledgerd.metadata.kafka_groups import group_znode
from ledgerd.metadata.kafka_offsets import OffsetIndex
from ledgerd.metadata.logs import CursorRecord
from ledgerd.metadata.paths import kafka_offset_index_complete_path, kafka_root
from ledgerd.metadata.store import MetadataStore, Op
from tests.cluster import metadata_store
from tests.kafka.conftest import KafkaCluster
from tests.kafka.crash_kit import wait_until

BOUND_S = 60  # every wait below is bounded; reaching it fails the test
KAFKA = kafka_root("/ledgers")


@pytest.fixture(scope="module")
def admin(kafka_cluster: KafkaCluster) -> Iterator[Any]:
    from kafka.admin import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    yield client
    client.close()


def _create(cluster: KafkaCluster, topics: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=n) for t, n in topics.items()])
    for f in futures.values():
        f.result(BOUND_S)


def _commit(admin: Any, group: str, offsets: dict[tuple[str, int], int]) -> None:
    from kafka import TopicPartition
    from kafka.errors import NoError
    from kafka.structs import OffsetAndMetadata

    got = admin.alter_group_offsets(group, {TopicPartition(t, p): OffsetAndMetadata(o, "m", -1)
                                            for (t, p), o in offsets.items()})
    assert set(got.values()) == {NoError}


def _fetch_all(admin: Any, group: str) -> dict[tuple[str, int], int]:
    """OffsetFetch with topics = null, as the client sends it."""
    got = admin.list_group_offsets(group)[group]
    return {(tp.topic, tp.partition): om.offset for tp, om in got.items()}


def _index(cluster: KafkaCluster, group: str) -> dict[str, tuple[int, ...]]:
    """The group's offset index as ZooKeeper holds it."""
    async def read() -> dict[str, tuple[int, ...]]:
        async with ledgerd.open_client(cluster.zk) as client:
            index = OffsetIndex(client.store, KAFKA, client.logs.store, log_name)
            out = {}
            for topic in await index.topics(group_znode(group)):
                entry = await index.entry(group_znode(group), topic)
                if entry is not None:
                    out[topic] = entry.partitions
            return out
    return trio.run(read)


def test_fetch_of_all_topics_answers_exactly_the_groups_committed_partitions(
        kafka_cluster: KafkaCluster, admin: Any) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from kafka import TopicPartition as KTP
    from kafka.errors import NoError

    _create(kafka_cluster, {"oi-a": 3, "oi-b": 2, "oi-c": 1, "oi-o": 2})
    _commit(admin, "oi-g", {("oi-a", 0): 5, ("oi-a", 2): 7, ("oi-b", 1): 3, ("oi-c", 0): 1})
    _commit(admin, "oi-h", {("oi-o", 1): 4, ("oi-a", 1): 2})  # another group's
    _commit(admin, "oi-g", {("oi-a", 0): 6})  # a rewrite
    assert _fetch_all(admin, "oi-g") == {("oi-a", 0): 6, ("oi-a", 2): 7, ("oi-b", 1): 3,
                                         ("oi-c", 0): 1}
    assert _index(kafka_cluster, "oi-g") == {"oi-a": (0, 2), "oi-b": (1,), "oi-c": (0,)}
    # OffsetDelete takes the offset and its entry
    assert admin.delete_group_offsets("oi-g", [KTP("oi-a", 2)]) == {KTP("oi-a", 2): NoError}
    assert _fetch_all(admin, "oi-g") == {("oi-a", 0): 6, ("oi-b", 1): 3, ("oi-c", 0): 1}
    assert _index(kafka_cluster, "oi-g")["oi-a"] == (0,)
    # a deleted topic's offsets are gone, its entries dropped by the next fetch, and a
    # topic made again under its name has none
    admin.delete_topics(["oi-c"])
    assert _fetch_all(admin, "oi-g") == {("oi-a", 0): 6, ("oi-b", 1): 3}
    assert "oi-c" not in _index(kafka_cluster, "oi-g")
    _create(kafka_cluster, {"oi-c": 1})
    assert _fetch_all(admin, "oi-g") == {("oi-a", 0): 6, ("oi-b", 1): 3}
    # a transaction's offsets are the group's (and indexed) once it commits
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "oi-g",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("oi-b", 0, 0)])
    p = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": "oi-app",
                  "linger.ms": 5})
    try:
        p.init_transactions(BOUND_S)
        p.begin_transaction()
        p.produce("oi-o", value=b"x", partition=0)
        p.send_offsets_to_transaction([TopicPartition("oi-b", 0, 9)],
                                      consumer.consumer_group_metadata(), BOUND_S)
        assert ("oi-b", 0) not in _fetch_all(admin, "oi-g")  # pending: not the group's
        p.commit_transaction(BOUND_S)
    finally:
        consumer.close()
    wait_until(lambda: ("oi-b", 0) in _fetch_all(admin, "oi-g"),
               "the transaction's offset is the group's")
    assert _fetch_all(admin, "oi-g") == {("oi-a", 0): 6, ("oi-b", 0): 9, ("oi-b", 1): 3}
    assert _index(kafka_cluster, "oi-g") == {"oi-a": (0,), "oi-b": (0, 1)}
    # DeleteGroups takes every offset and the index; the other group keeps its own
    assert admin.delete_groups(["oi-g"]) == {"oi-g": "OK"}
    assert _fetch_all(admin, "oi-g") == {}
    assert _index(kafka_cluster, "oi-g") == {}
    assert _fetch_all(admin, "oi-h") == {("oi-o", 1): 4, ("oi-a", 1): 2}


class _Counting:
    """The store, counting its reads (get, children, exists) of the Kafka gateway's
    nodes and the logs' (not the client's own of the bookies' registrations)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.reads = 0

    def _count(self, path: str) -> None:
        if path.startswith(("/ledgers/kafka/", "/ledgers/logs/")):
            self.reads += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get(self, path: str) -> Any:
        self._count(path)
        return await self.store.get(path)

    async def children(self, path: str) -> list[str]:
        self._count(path)
        return await self.store.children(path)

    async def exists(self, path: str) -> Any:
        self._count(path)
        return await self.store.exists(path)

    async def multi(self, ops: Sequence[Op]) -> None:
        await self.store.multi(ops)


def test_fetch_of_all_topics_reads_the_groups_partitions_not_the_clusters(
        kafka_cluster: KafkaCluster, admin: Any) -> None:
    """200 topics that are not the group's: OffsetFetch(all) reads the group's index and
    its 6 partitions' cursors (with the topics' records), not every partition's."""
    _create(kafka_cluster, {f"oi-noise-{i}": 1 for i in range(200)})
    mine = {("oi-n1", 0): 1, ("oi-n1", 1): 2, ("oi-n2", 0): 3, ("oi-n2", 1): 4,
            ("oi-n3", 0): 5, ("oi-n3", 1): 6}
    _create(kafka_cluster, {"oi-n1": 2, "oi-n2": 2, "oi-n3": 2})
    _commit(admin, "oi-count", mine)
    assert _fetch_all(admin, "oi-count") == mine

    async def fetch(indexed: bool) -> tuple[int, dict[tuple[str, int], int], float]:
        """OffsetFetch(all) by a gateway in this process (the gateway's own code, on a
        store that counts reads), through the index or through the scan of every
        partition that came before it (for comparison)."""
        async with metadata_store(kafka_cluster.zk, init=False) as raw:
            store = _Counting(raw)
            async with ledgerd.open_client(kafka_cluster.zk, store=store) as client:
                gw = Gateway(client, GatewayConfig())
                gw.owns = lambda key: True  # type: ignore[method-assign]
                if not indexed:
                    async def scan() -> bool:
                        return False
                    gw._offsets_indexed = scan  # type: ignore[method-assign]
                store.reads = 0
                started = time.monotonic()
                reply = await gw.offset_fetch(None, 5, {"group_id": "oi-count",  # type: ignore[arg-type]
                                                        "topics": None})
                took = time.monotonic() - started
        assert reply["error_code"] == 0
        return store.reads, {(t["name"], p["partition_index"]): p["committed_offset"]
                             for t in reply["topics"] for p in t["partitions"]}, took

    reads, got, took = trio.run(fetch, True)
    scan_reads, scan_got, scan_took = trio.run(fetch, False)
    print(f"OffsetFetch(all), 6 partitions of 209+ topics: indexed {reads} reads "
          f"{took * 1000:.0f} ms; scan {scan_reads} reads {scan_took * 1000:.0f} ms")
    assert got == scan_got == mine
    # group record 1, index topics 1, entries 3, topic records 3, cursors 6 (+ the
    # completion marker 1): the group's size, nothing of the 200 other topics
    assert reads <= 16, reads
    assert scan_reads > 200, scan_reads  # what the scan of every partition costs


def test_offsets_committed_before_the_index_existed_are_found_then_indexed(
        kafka_cluster: KafkaCluster, admin: Any) -> None:
    """The old layout: cursors with no index entries and no ``offset_index_complete``
    (a cluster upgraded to this version). After a restart the gateway answers from the
    scan until its migration has indexed them, then from the index."""
    _create(kafka_cluster, {"oi-old-a": 2, "oi-old-b": 1})
    _commit(admin, "oi-new", {("oi-old-a", 1): 8})  # indexed, by the new code

    async def old_layout() -> None:
        async with ledgerd.open_client(kafka_cluster.zk) as client:
            logs = client.logs.store
            for (topic, p), offset in {("oi-old-a", 0): 11, ("oi-old-b", 0): 12}.items():
                name = log_name(topic, p)
                if await client.store.exists(logs.path(name)) is None:
                    await logs.create(name)
                await logs.put_cursor(name, "kafka." + group_znode("oi-old"),
                                      CursorRecord(0, 0, 0, kafka_offset=offset), None)
            await client.store.delete(kafka_offset_index_complete_path(KAFKA))

    trio.run(old_layout)
    assert _index(kafka_cluster, "oi-old") == {}
    gw = kafka_cluster.gateway
    logged = gw.log_path.stat().st_size  # this run's lines come after
    gw.restart()  # the upgraded gateway, on the old layout

    async def complete() -> bool:
        async with metadata_store(kafka_cluster.zk, init=False) as store:
            return await store.exists(kafka_offset_index_complete_path(KAFKA)) is not None

    from kafka.admin import KafkaAdminClient

    admin.close()  # (the module's client: this test is the file's last)
    after = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    try:
        # whether the migration has run yet or not, the old offsets are there
        assert _fetch_all(after, "oi-old") == {("oi-old-a", 0): 11, ("oi-old-b", 0): 12}
        wait_until(lambda: trio.run(complete), "the migration is done")

        def migrated() -> list[str]:
            # the gateway logs it after it made the completion node, and the line
            # reaches the file through a copying thread: waited for, not read at once
            with open(gw.log_path, "rb") as f:
                f.seek(logged)
                return [line for line in f.read().decode(errors="replace").splitlines()
                        if "kafka_offset_index_migrated" in line]

        this_run = wait_until(migrated, "the migration logged")
        assert len(this_run) == 1 and "groups=0" not in this_run[0], this_run  # found old cursors
        assert _index(kafka_cluster, "oi-old") == {"oi-old-a": (0,), "oi-old-b": (0,)}
        assert _fetch_all(after, "oi-old") == {("oi-old-a", 0): 11, ("oi-old-b", 0): 12}
        assert _fetch_all(after, "oi-new") == {("oi-old-a", 1): 8}
        assert after.delete_groups(["oi-old"]) == {"oi-old": "OK"}
        assert _fetch_all(after, "oi-old") == {}
        assert _index(kafka_cluster, "oi-old") == {}
    finally:
        after.close()


def test_the_migration_waits_until_every_live_gateway_indexes() -> None:
    """A gateway of an older version (its registration names no ``offset_index``
    feature) commits offsets without index entries; one it created after the migration
    would never be listed or deleted with its group. So the migration starts only once
    every live gateway indexes (a rolling upgrade finished)."""
    from ledgerd.kafka.gateway import FEATURES

    class Client:
        store = None

    class Index:
        async def complete(self) -> bool:
            return False

    async def main() -> None:
        gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
        gw.__dict__["offset_index"] = Index()  # the cached property, stubbed
        started: list[bool] = []

        async def migrate() -> None:
            started.append(True)

        gw._migrate_offset_index = migrate  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            gw.nursery = nursery
            gw.node_id = 1
            gw.nodes = {1: ("h", 1), 2: ("h", 2)}
            gw.features = {1: frozenset(FEATURES), 2: frozenset()}  # 2: the old version
            assert not await gw._offsets_indexed()
            await trio.testing.wait_all_tasks_blocked()
            assert started == []
            gw.features[2] = frozenset(FEATURES)  # upgraded
            assert not await gw._offsets_indexed()  # answered from the scan meanwhile
            await trio.testing.wait_all_tasks_blocked()
            assert started == [True]

    trio.run(main)


def test_the_migration_is_not_done_when_the_gateways_changed_while_it_read() -> None:
    """The gateways are read before and after the cursors: a gateway that does not
    index came (or any gateway came or went) meanwhile, and the migration is not
    marked done (the next request that needs the index starts it again)."""
    from ledgerd.kafka.gateway import FEATURES
    from ledgerd.metadata.kafka_gateways import GatewayRecord

    new = GatewayRecord(host="h", port=1, features=FEATURES)
    old = GatewayRecord(host="h", port=2)

    class Client:
        store = None

        class logs:
            class store:
                @staticmethod
                async def cursors(name: str) -> list[str]:
                    return ["kafka.g"]

    class Index:
        def __init__(self) -> None:
            self.added: list[tuple[str, str]] = []
            self.marked = False

        async def add(self, group: str, topic: str, parts: Sequence[int]) -> None:
            self.added.append((group, topic))

        async def mark_complete(self) -> None:
            self.marked = True

    async def run(views: list[dict[int, GatewayRecord]]) -> Index:
        gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
        index = Index()
        gw.__dict__["offset_index"] = index

        class Registrations:
            @staticmethod
            async def live() -> dict[int, GatewayRecord]:
                return views.pop(0)

        async def all_topics() -> list[str]:
            return ["t"]

        gw.gateway_store = Registrations()  # type: ignore[assignment]
        gw.all_topics = all_topics  # type: ignore[method-assign]
        gw.topics["t"] = 1
        await gw._migrate_offset_index()
        return index

    done = trio.run(run, [{1: new, 2: new}, {1: new, 2: new}])
    assert done.added == [("g", "t")] and done.marked
    joined = trio.run(run, [{1: new}, {1: new, 2: new}])  # came while it read
    assert joined.added and not joined.marked
    older = trio.run(run, [{1: new}, {1: new, 3: old}])  # an old one came
    assert not older.marked


def test_file_delete_delay_applies_once_every_live_gateway_keeps_deferred_deletions() -> None:
    """A gateway of an older version (no ``deferred_deletes`` feature) rewriting a log
    record would drop its deferred deletions and leak those ledgers: until every live
    gateway has the feature, the topics' file.delete.delay.ms is enforced as 0."""
    from ledgerd.kafka.gateway import FEATURES

    class Client:
        store = None

    gw = Gateway(Client(), GatewayConfig())  # type: ignore[arg-type]
    gw.node_id = 1
    gw.nodes = {1: ("h", 1), 2: ("h", 2)}
    gw.features = {1: frozenset(FEATURES), 2: frozenset({"offset_index"})}  # 2: older
    assert gw.topic_policy("t").file_delete_delay_ms == 0
    gw.features[2] = frozenset(FEATURES)  # upgraded
    assert gw.topic_policy("t").file_delete_delay_ms == 60_000
