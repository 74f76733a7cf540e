"""The Kafka gateway's typed stores (topics, groups, gateways, producer ids, transactions)
on the in-memory twin and on ZooKeeper: round trips, compare-and-set under a conflicting
writer, unknown formats refused by name, and the documents older gateways wrote read."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from ledgerd.metadata.errors import CorruptMetadataError, NodeExistsError, UnknownFormatError
from ledgerd.metadata.kafka_gateways import GatewayRecord, GatewayStore, ProducerIdStore
from ledgerd.metadata.kafka_groups import GroupRecord, GroupStore, group_id_of, group_znode
from ledgerd.metadata.kafka_topics import TopicRecord, TopicStore
from ledgerd.metadata.kafka_txns import PendingOffset, TxnRecord, TxnStore
from ledgerd.metadata.store import MetadataStore
from tests.metadata.conftest import StoreFactory

ROOT = "/ledgers/kafka"


class Interfering:
    """A real store whose next ``set`` first lets another session write: the CAS that
    follows then conflicts, deterministically, on either store."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.before_set: Callable[[], Awaitable[None]] | None = None
        self.conflicts = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def set(self, path: str, data: bytes, version: int = -1) -> Any:
        if self.before_set is not None:
            write, self.before_set = self.before_set, None
            await write()
            self.conflicts += 1
        return await self.store.set(path, data, version)


async def test_topic_record_round_trip_and_cas_update(stores: StoreFactory) -> None:
    topics = TopicStore(await stores.open(), ROOT)
    assert await topics.get("t") is None and await topics.names() == []
    record = TopicRecord(partitions=3, configs={"retention.ms": "5"}, log_start={1: 40},
                         replicas=((1, 2), (2, 3), (3, 1)))
    await topics.create("t", record)
    with pytest.raises(NodeExistsError):
        await topics.create("t", record)
    assert await topics.get("t") == record and await topics.names() == ["t"]
    grown = await topics.update("t", lambda r: replace(r, partitions=5))
    assert grown == replace(record, partitions=5) == await topics.get("t")
    await topics.delete("t")
    assert await topics.get("t") is None


async def test_topic_update_after_a_conflicting_writer_keeps_both_changes(
        stores: StoreFactory) -> None:
    mine, other = Interfering(await stores.open()), TopicStore(await stores.open(), ROOT)
    topics = TopicStore(mine, ROOT)  # type: ignore[arg-type]
    await topics.create("t", TopicRecord(partitions=2))

    async def configs_changed_meanwhile() -> None:
        await other.update("t", lambda r: replace(r, configs={"cleanup.policy": "delete"}))

    mine.before_set = configs_changed_meanwhile
    moved = await topics.update("t", lambda r: r.with_start(1, 7))
    assert mine.conflicts == 1
    assert moved == TopicRecord(partitions=2, configs={"cleanup.policy": "delete"},
                                log_start={1: 7})
    assert await other.get("t") == moved


async def test_documents_older_gateways_wrote_are_read(stores: StoreFactory) -> None:
    store = await stores.open()
    # bytes as the gateway wrote them before the typed stores (json.dumps, no format
    # field in topic and gateway documents, a bare number for the producer ids)
    await store.create(f"{ROOT}/topics/old", b'{"partitions": 4}', make_parents=True)
    await store.create(f"{ROOT}/topics/old1", json.dumps(
        {"format": 1, "partitions": 2, "configs": {"retention.ms": "9"},
         "log_start": {"0": 3}}).encode())
    odd = "group with spaces/é"
    await store.create(f"{ROOT}/groups/{group_znode(odd)}", json.dumps(
        {"format": 1, "group": odd, "generation": 4, "protocol_type": "consumer"}).encode(),
        make_parents=True)
    await store.create(f"{ROOT}/groups/g0", json.dumps(
        {"format": 1, "group": "g0", "generation": 0, "protocol_type": ""}).encode())
    await store.create(f"{ROOT}/gateways/7", json.dumps(
        {"host": "gw7.example", "port": 9092}).encode(), make_parents=True)
    await store.create(f"{ROOT}/producer_ids", b"41")

    topics = TopicStore(store, ROOT)
    assert await topics.get("old") == TopicRecord(partitions=4)
    assert await topics.get("old1") == TopicRecord(partitions=2, configs={"retention.ms": "9"},
                                                   log_start={0: 3})
    groups = GroupStore(store, ROOT)
    assert group_znode(odd).startswith("x-")
    assert await groups.get(odd) == GroupRecord(group_id=odd, generation=4,
                                                protocol_type="consumer")
    assert await groups.get("g0") == GroupRecord(group_id="g0", generation=0)
    assert sorted(await groups.names()) == sorted(["g0", group_znode(odd)])
    assert await GatewayStore(store, ROOT).live() == {
        7: GatewayRecord(host="gw7.example", port=9092)}
    assert await ProducerIdStore(store, ROOT).next() == 41
    # and what is written now, older gateways read: the same keys, a format beside them
    doc = json.loads(GatewayRecord(host="h", port=1).to_json())
    assert (doc["host"], doc["port"]) == ("h", 1)
    assert json.loads(TopicRecord(partitions=4).to_json()) == {"format": 1, "partitions": 4}


async def test_unknown_formats_are_refused_naming_the_znode_and_never_overwritten(
        stores: StoreFactory) -> None:
    store = await stores.open()
    newer = {"format": 2, "partitions": 1, "group": "g", "generation": 1, "host": "h",
             "port": 1, "transactional_id": "tx"}
    paths = {"topics": f"{ROOT}/topics/t", "groups": f"{ROOT}/groups/g",
             "gateways": f"{ROOT}/gateways/3", "transactions": f"{ROOT}/transactions/tx"}
    for path in paths.values():
        await store.create(path, json.dumps(newer).encode(), make_parents=True)
    reads: dict[str, Callable[[], Awaitable[object]]] = {
        "topics": lambda: TopicStore(store, ROOT).get("t"),
        "groups": lambda: GroupStore(store, ROOT).get("g"),
        "gateways": lambda: GatewayStore(store, ROOT).live(),
        "transactions": lambda: TxnStore(store, ROOT).get("tx"),
    }
    for kind, read in reads.items():
        with pytest.raises(UnknownFormatError) as info:
            await read()
        assert info.value.path == paths[kind] and paths[kind] in str(info.value), kind
        assert "format 2" in str(info.value)
    with pytest.raises(UnknownFormatError):
        await TopicStore(store, ROOT).update("t", lambda r: replace(r, partitions=9))
    with pytest.raises(UnknownFormatError):
        await GroupStore(store, ROOT).save("g", 5, "consumer")
    for path in paths.values():
        raw, stat = await store.get(path)
        assert json.loads(raw) == newer and stat.version == 0
    # a group record was always written with its format: one without it is refused
    await store.create(f"{ROOT}/groups/nofmt", b'{"group": "nofmt", "generation": 1}')
    with pytest.raises(UnknownFormatError, match="without a format"):
        await GroupStore(store, ROOT).get("nofmt")


async def test_malformed_documents_are_corrupt_naming_the_znode(stores: StoreFactory) -> None:
    store = await stores.open()
    await store.create(f"{ROOT}/topics/a", b'{"partitions": 0}', make_parents=True)
    await store.create(f"{ROOT}/topics/b", b"not json")
    await store.create(f"{ROOT}/topics/c", b'{"partitions": 1, "log_start": {"0": -1}}')
    await store.create(f"{ROOT}/gateways/x", b'{"host": "h", "port": 1}', make_parents=True)
    for name in ("a", "b", "c"):
        with pytest.raises(CorruptMetadataError) as info:
            await TopicStore(store, ROOT).get(name)
        assert not isinstance(info.value, UnknownFormatError)
        assert info.value.path == f"{ROOT}/topics/{name}"
    with pytest.raises(CorruptMetadataError, match="gateways/x"):
        await GatewayStore(store, ROOT).live()


async def test_group_save_is_cas_and_never_lowers_the_generation(stores: StoreFactory) -> None:
    mine, other = Interfering(await stores.open()), GroupStore(await stores.open(), ROOT)
    groups = GroupStore(mine, ROOT)  # type: ignore[arg-type]
    assert await groups.ensure("g") is True
    assert await groups.ensure("g") is False
    assert await groups.get("g") == GroupRecord(group_id="g", generation=0)
    assert await groups.save("g", 2, "consumer") == GroupRecord(
        group_id="g", generation=2, protocol_type="consumer")

    async def newer_coordinator_saves() -> None:
        await other.save("g", 5, "consumer")

    mine.before_set = newer_coordinator_saves
    kept = await groups.save("g", 3, "consumer")  # a stale coordinator's save
    assert mine.conflicts == 1
    assert kept.generation == 5 == (await other.get("g") or kept).generation
    assert await groups.ensure("g") is False  # ensure never resets it
    assert (await groups.get("g") or kept).generation == 5
    assert await groups.delete("g") is True and await groups.delete("g") is False
    assert await groups.save("h", 1, "") == GroupRecord(group_id="h", generation=1)


async def test_gateway_registration_replaces_a_previous_sessions_node(
        stores: StoreFactory) -> None:
    first, second = await stores.open(), await stores.open()
    await GatewayStore(first, ROOT).register(1, GatewayRecord(host="a", port=1))
    await GatewayStore(first, ROOT).register(1, GatewayRecord(host="a", port=2))  # rewritten
    await GatewayStore(first, ROOT).register(2, GatewayRecord(host="b", port=3))
    gateways = GatewayStore(second, ROOT)
    assert await gateways.live() == {1: GatewayRecord(host="a", port=2),
                                     2: GatewayRecord(host="b", port=3)}
    await gateways.register(1, GatewayRecord(host="c", port=4))  # a successor on its id
    _, stat = await second.get(gateways.path(1))
    assert stat.ephemeral_owner == second.session_id
    await first.close()  # its other registration goes with its session
    assert await gateways.live() == {1: GatewayRecord(host="c", port=4)}


async def test_producer_ids_are_never_given_twice(stores: StoreFactory) -> None:
    a = ProducerIdStore(await stores.open(), ROOT)
    b = ProducerIdStore(await stores.open(), ROOT)
    assert await a.peek() is None
    got = [await a.next(), await b.next(), await a.next()]
    assert got == [0, 1, 2] and await b.peek() == 3
    assert await b.advance(1000) == 1000 and await a.advance(10) == 1000  # never back
    assert await a.next() == 1000


async def test_txn_records_keep_their_paths(stores: StoreFactory) -> None:
    store = await stores.open()
    txns = TxnStore(store, ROOT)
    record = TxnRecord(transactional_id="tx", producer_id=3, producer_epoch=0,
                       timeout_ms=1000)
    await txns.create(record)
    assert await store.exists(f"{ROOT}/transactions/tx") is not None
    assert await txns.get("tx") == record and await txns.names() == ["tx"]
    assert await txns.partition_start("t", 0, 17) == 17
    assert await store.exists(f"{ROOT}/txn_partitions/t/0") is not None
    await txns.forget_topic("t")
    assert await txns.partition_start("t", 0) is None


async def test_a_record_never_holds_a_groups_offsets_without_its_pending_entry(
        stores: StoreFactory) -> None:
    """KIP-447's index: a write giving a record a group's offsets touches the group's
    entry in the same multi (creating it if missing); an entry dropped at a version
    read before such a write is not dropped."""
    store = await stores.open()
    txns = TxnStore(store, ROOT)
    await txns.create(TxnRecord(transactional_id="tx", producer_id=3, producer_epoch=0,
                                timeout_ms=1000))
    await txns.sync_pending("g")  # no index yet: fine
    assert await txns.pending("g") == []

    def offsets(n: int) -> Callable[[TxnRecord], TxnRecord]:
        return lambda r: replace(r, offsets=(PendingOffset(
            group="g", topic="t", partition=0, offset=n, metadata=None),))

    await txns.update_offsets("tx", "g", offsets(5))
    assert await txns.pending("g") == ["tx"]
    seen = await txns.pending_version("g", "tx")
    assert seen is not None
    _, rv = await txns.get_named_versioned("tx")
    await txns.update_offsets("tx", "g", offsets(6))  # after ``seen`` was read
    assert not await txns.drop_pending("g", "tx", seen, rv)
    assert await txns.pending("g") == ["tx"]
    now = await txns.pending_version("g", "tx")
    assert now is not None and now > seen
    _, rv = await txns.get_named_versioned("tx")
    assert await txns.drop_pending("g", "tx", now, rv)
    assert await txns.pending("g") == [] and await txns.pending_version("g", "tx") is None
    record = await txns.update_offsets("tx", "g", offsets(7))  # the entry made again
    assert await txns.pending("g") == ["tx"]
    assert (await txns.get("tx")) == record and record.offsets[0].offset == 7


@pytest.mark.parametrize("group", ["g", "x-abc", "x-6162", "a b", "ü" * 10, "é" * 44, "-x",
                                   "x-", "a/b"])
def test_a_groups_znode_name_gives_its_id_back(group: str) -> None:
    assert group_id_of(group_znode(group)) == group


def test_a_long_groups_cut_name_gives_no_id() -> None:
    assert group_id_of(group_znode("é" * 60)) is None
    assert group_id_of("x-zz") == "x-zz"  # a plain id that only looks like hex


async def test_a_stale_cleaner_cannot_drop_a_recreated_entry(
        stores: StoreFactory) -> None:
    """Two OffsetFetch cleaners of the same group (every member of a rebalanced group
    fetches at once). Both read the entry's version and the record
    (its transaction over: stale); one drops the entry; the producer's next
    transaction gives the record offsets of the group, re-creating the entry, which
    lands at the same version as the old one (create at 0, SetData to 1). The slow
    cleaner's versioned delete then succeeds: the record holds the group's offsets
    and its entry is gone (ABA on the entry's version)."""
    store = await stores.open()
    txns = TxnStore(store, ROOT)
    await txns.create(TxnRecord(transactional_id="tx", producer_id=3, producer_epoch=0,
                                timeout_ms=1000))

    def offsets(n: int) -> Callable[[TxnRecord], TxnRecord]:
        return lambda r: replace(r, offsets=(PendingOffset(
            group="g", topic="t", partition=0, offset=n, metadata=None),))

    await txns.update_offsets("tx", "g", offsets(5))
    await txns.update("tx", lambda r: replace(r, offsets=()))  # committed: stale entry
    # cleaners 1 and 2 both read the version, then the record (no offsets of g)
    v1 = await txns.pending_version("g", "tx")
    v2 = await txns.pending_version("g", "tx")
    assert v1 is not None and v1 == v2
    stale, rv = await txns.get_named_versioned("tx")
    assert stale is not None and not stale.offsets
    assert await txns.drop_pending("g", "tx", v2, rv)  # cleaner 2 drops it
    await txns.update_offsets("tx", "g", offsets(6))  # the next transaction's offsets
    assert await txns.pending("g") == ["tx"]
    dropped = await txns.drop_pending("g", "tx", v1, rv)  # cleaner 1, late
    record = await txns.get("tx")
    assert record is not None and record.offsets  # the record holds g's offsets...
    # ...so its entry must still be there
    assert not dropped and await txns.pending("g") == ["tx"], \
        "entry dropped while the record holds the group's offsets (ABA)"


async def test_an_entry_of_a_gone_record_is_dropped_only_while_it_is_gone(
        stores: StoreFactory) -> None:
    store = await stores.open()
    txns = TxnStore(store, ROOT)
    await txns.create(TxnRecord(transactional_id="tx", producer_id=3, producer_epoch=0,
                                timeout_ms=1000))
    await txns.update_offsets("tx", "g", lambda r: replace(r, offsets=(PendingOffset(
        group="g", topic="t", partition=0, offset=1, metadata=None),)))
    await store.delete(txns.path("tx"))  # expired
    v = await txns.pending_version("g", "tx")
    assert v is not None
    assert await txns.get_named_versioned("tx") == (None, -1)
    assert await txns.drop_pending("g", "tx", v, -1)
    assert await txns.pending("g") == [] and await txns.get("tx") is None


async def test_a_share_group_delete_goes_again_when_its_state_changes_meanwhile(
        stores: StoreFactory) -> None:
    """A recursive delete is not atomic: a share partition deleted under it (its topic
    deleted: NoNodeError naming the child) or stored under it (a leader's write:
    NotEmptyError) makes ShareStore.delete_group go again, and it still reports that
    the group had state; a group without any reports none."""
    from ledgerd.metadata.errors import NoNodeError, NotEmptyError
    from ledgerd.metadata.kafka_share import ShareStore

    store = await stores.open()
    shares = ShareStore(store, ROOT)
    await shares.save("g", "t", 0, b"\x01" * 16, {"start": 0, "runs": []}, -1)
    await shares.save("g", "t", 1, b"\x01" * 16, {"start": 0, "runs": []}, -1)
    raised: list[type[Exception]] = [NoNodeError, NotEmptyError]

    class Racing:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        async def delete(self, path: str, version: int = -1, *,
                         recursive: bool = False) -> None:
            if recursive and raised:
                kind = raised.pop(0)
                if kind is NoNodeError:  # DeleteTopics took t.1 after the listing
                    await store.delete(shares.path("g", "t", 1))
                    raise NoNodeError(shares.path("g", "t", 1))
                raise NotEmptyError(path)  # a leader stored t.0 again meanwhile
            await store.delete(path, version, recursive=recursive)

    racing = ShareStore(Racing(), ROOT)  # type: ignore[arg-type]
    assert await racing.delete_group("g") and raised == []
    assert await store.exists(shares.path("g")) is None
    assert not await racing.delete_group("g")  # nothing left: no state
