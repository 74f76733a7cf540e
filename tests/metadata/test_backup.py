"""Snapshot and restore over the in-memory twin of the store (the real ZooKeeper runs in
tests/integration/test_metadata_recovery.py): a restore gives back every node at its
version and moves the id counter past the snapshot's; a non-empty root is refused; a
node that keeps changing while the tree is read is named as unstable."""

from __future__ import annotations

import pytest
import trio

from ledgerd.metadata.backup import (
    advance_counter,
    freeze_state,
    read_tree,
    restore_snapshot,
    take_snapshot,
)
from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.metadata.snapshot import Node, Snapshot, SnapshotError
from ledgerd.metadata.store import NodeStat
from ledgerd.metadata.zookeeper import ZooKeeperStore

MD = LedgerMetadata(ensemble_size=2, write_quorum=2, ack_quorum=1,
                    ensembles=((0, ("b0:1", "b1:1")),))


async def test_restore_gives_back_nodes_versions_and_a_counter_past_the_snapshot() -> None:
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    ids = [(await ledgers.create(MD))[0] for _ in range(3)]
    await ledgers.write(ids[1], MD, 0)
    await ledgers.write(ids[1], MD, 1)
    await store.create("/ledgers/logs/events", b'{"format": 1, "ledgers": []}',
                       make_parents=True)
    snap = await take_snapshot(store, "/ledgers")
    assert snap.passes == 2 and not snap.unstable
    assert snap.ledger_ids() == ids and snap.summary()["logs"] == 1

    fresh = InMemoryStore(InMemoryCluster())
    await restore_snapshot(fresh, "/ledgers", snap, id_gap=5)
    back = await read_tree(fresh, "/ledgers")
    assert {p: (n.data, n.version) for p, n in back.items()} == {
        n.path: (n.data, n.version) for n in snap.nodes}
    assert (await freeze_state(fresh, "/ledgers")) is not None
    new_id = (await LedgerManager(fresh, "/ledgers").create(MD))[0]
    assert new_id >= max(ids) + 5

    with pytest.raises(SnapshotError, match="not empty"):
        await restore_snapshot(fresh, "/ledgers", snap)
    await restore_snapshot(fresh, "/ledgers", snap, replace=True)
    assert not await LedgerManager(fresh, "/ledgers").exists(new_id)


async def test_a_node_changing_through_every_pass_is_named_unstable() -> None:
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    await store.create("/ledgers/logs/events/cursors/busy", b"0", make_parents=True)
    async with trio.open_nursery() as nursery:
        async def commit_forever() -> None:
            n = 0
            while True:
                n += 1
                await store.set("/ledgers/logs/events/cursors/busy", str(n).encode())
                await trio.sleep(0)

        nursery.start_soon(commit_forever)
        snap = await take_snapshot(store, "/ledgers", max_passes=3)
        nursery.cancel_scope.cancel()
    assert snap.passes == 3 and snap.unstable == ("logs/events/cursors/busy",)


async def test_a_replacing_restore_freezes_gc_and_drops_layout_before_any_ledger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie's GC deletes a ledger the metadata lacks unless the root is frozen or has
    no LAYOUT: while ``--replace`` empties the root, every deletion happens with the
    flag set and LAYOUT already gone, so no GC pass sees a cluster missing ledgers."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    ledgers = LedgerManager(store, "/ledgers")
    for _ in range(3):
        await ledgers.create(MD)
    snap = await take_snapshot(store, "/ledgers")
    seen: list[tuple[str, bool, bool]] = []
    delete = store.delete

    async def watched_delete(path: str, *args: object, **kw: object) -> None:
        frozen = await freeze_state(store, "/ledgers") is not None
        layout = await store.exists("/ledgers/LAYOUT") is not None
        seen.append((path, frozen, layout))
        await delete(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "delete", watched_delete)
    await restore_snapshot(store, "/ledgers", snap, replace=True)
    emptied = [s for s in seen if s[0] != "/ledgers/LAYOUT"]
    assert emptied and all(frozen and not layout for _, frozen, layout in emptied), seen
    assert seen[0][:2] == ("/ledgers/LAYOUT", True)
    assert (await LedgerManager(store, "/ledgers").exists(snap.ledger_ids()[0]))


async def test_a_restore_moves_the_kafka_producer_id_counter_past_the_snapshot() -> None:
    """Producer ids handed out after the snapshot must not be handed out again: a
    gateway would take a new producer's first batch for an old one's duplicate."""
    from ledgerd.metadata.backup import PRODUCER_ID_GAP

    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    await store.create("/ledgers/kafka/producer_ids", b"42", make_parents=True)
    snap = await take_snapshot(store, "/ledgers")
    fresh = InMemoryStore(InMemoryCluster())
    await restore_snapshot(fresh, "/ledgers", snap)
    raw, _ = await fresh.get("/ledgers/kafka/producer_ids")
    assert int(raw) == 42 + PRODUCER_ID_GAP


async def test_a_restore_leaves_no_partition_in_a_transaction_nobody_ends() -> None:
    """After the snapshot a producer may have begun a transaction in a flagged
    partition; the restored records make the coordinator abort every such one, and a
    flag made after the snapshot is not brought back (the partition reads as holding
    no transaction)."""
    from ledgerd.kafka.txn_coordinator import markers, time_out
    from ledgerd.metadata.kafka_txns import TxnRecord, TxnState, TxnStore

    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, "/ledgers")
    txns = TxnStore(store, "/ledgers/kafka")
    await txns.partition_start("t", 0, 10)
    await txns.partition_start("t", 1, 20)
    done = TxnRecord(transactional_id="done", producer_id=5, producer_epoch=2,
                     timeout_ms=60_000, state=TxnState.COMPLETE_COMMIT, updated_ms=7)
    going = TxnRecord(transactional_id="going", producer_id=6, producer_epoch=0,
                      timeout_ms=60_000, state=TxnState.ONGOING, partitions=(("t", 0),),
                      groups=("g",), started_ms=1_000, updated_ms=1_000)
    prepared = TxnRecord(transactional_id="prepared", producer_id=7, producer_epoch=0,
                         timeout_ms=60_000, state=TxnState.PREPARE_COMMIT,
                         partitions=(("t", 1),), started_ms=1_000, updated_ms=1_000)
    for r in (done, going, prepared):
        await txns.create(r)
    snap = await take_snapshot(store, "/ledgers")
    await txns.partition_start("later", 0, 5)  # the first transaction there: after it

    await restore_snapshot(store, "/ledgers", snap, replace=True)
    back = TxnStore(store, "/ledgers/kafka")
    assert await back.partition_start("later", 0) is None
    assert await back.partition_start("t", 0) == 10
    now = 10**13
    for tid in ("done", "going"):
        record = await back.get(tid)
        assert record is not None and record.state is TxnState.ONGOING, record
        aborted = time_out(record, now_ms=now)
        assert aborted.state is TxnState.PREPARE_ABORT, aborted
        assert {(m.topic, m.partition) for m in markers(aborted)} == {("t", 0), ("t", 1)}
        assert not any(m.commit for m in markers(aborted))
    assert await back.get("prepared") == prepared
    _, stat = await store.get(back.path("done"))
    assert stat.version == 1  # one past the snapshot's: a cached version cannot CAS


class _CountingStore(ZooKeeperStore):
    """The real ZooKeeper store, counting the single writes a restore makes."""

    sets = 0

    async def set(self, path: str, data: bytes, version: int = -1) -> NodeStat:
        type(self).sets += 1
        return await super().set(path, data, version)


async def test_a_busy_cursors_version_comes_back_in_few_round_trips(zk_chroot: str) -> None:
    version = 4321
    nodes = [Node("LAYOUT", b"ledgerd-layout\t1\nhierarchical", 0), Node("logs", b"", 0),
             Node("logs/events", b"{}", 1), Node("logs/events/cursors", b"", 0),
             Node("logs/events/cursors/busy", b"offset-99", version)]
    nodes += [Node(f"n{i}", b"x%d" % i, 1 + i % 3) for i in range(300)]
    snap = Snapshot(root="/ledgers", nodes=tuple(nodes))
    store = await _CountingStore.connect(zk_chroot)
    try:
        t0 = trio.current_time()
        await restore_snapshot(store, "/ledgers", snap)
        elapsed = trio.current_time() - t0
        back = await read_tree(store, "/ledgers")
    finally:
        await store.close()
    assert {p: (n.data, n.version) for p, n in back.items() if p} == {
        n.path: (n.data, n.version) for n in nodes}
    # Versions are raised in transactions of many writes, not one write each (4,900
    # round trips here before; the freeze flag and the producer id counter are set).
    assert _CountingStore.sets < 10, (_CountingStore.sets, elapsed)


async def test_advancing_the_id_counter_on_zookeeper_reaches_what_was_asked(
        zk_chroot: str) -> None:
    store = await ZooKeeperStore.connect(zk_chroot)
    try:
        await init_new_cluster(store, "/ledgers")
        reached = await advance_counter(store, "/ledgers/idgen", 1234)
        new_id = (await LedgerManager(store, "/ledgers").create(MD))[0]
    finally:
        await store.close()
    # A delete does not move ZooKeeper's sequence; counting it did (half the gap).
    assert 1234 <= reached <= new_id < 1234 + 10


def test_a_restore_leaves_out_the_offset_index_mark() -> None:
    """A snapshot read while group offsets were committed may hold a cursor without its
    offset index entry: the restore leaves out ``offset_index_complete``, so gateways
    started on the restored root index every cursor again."""
    from ledgerd.metadata.backup import settled_nodes

    nodes = [Node("LAYOUT", b"x", 0), Node("kafka", b"", 0),
             Node("kafka/offset_index_complete", b"", 0),
             Node("kafka/offset_index", b"", 3)]
    assert [n.path for n in settled_nodes(nodes)] == ["LAYOUT", "kafka", "kafka/offset_index"]


def test_a_restore_keeps_a_committing_transactions_offsets_pending() -> None:
    """A snapshot may hold a PREPARE_COMMIT record whose offsets' pending entry it
    missed (records are read a depth before the entries): the restore makes the entry,
    so OffsetFetch with require_stable still waits for the commit to complete."""
    from ledgerd.metadata.backup import settled_nodes
    from ledgerd.metadata.kafka_txns import PendingOffset, TxnRecord, TxnState

    committing = TxnRecord(
        transactional_id="tx", producer_id=1, producer_epoch=0, timeout_ms=60000,
        state=TxnState.PREPARE_COMMIT, groups=("a b",), offsets=(PendingOffset(
            group="a b", topic="in", partition=0, offset=9, metadata=None),))
    aborting = TxnRecord(
        transactional_id="ty", producer_id=2, producer_epoch=0, timeout_ms=60000,
        state=TxnState.PREPARE_ABORT, groups=("g",), offsets=(PendingOffset(
            group="g", topic="in", partition=0, offset=3, metadata=None),))
    nodes = [Node("LAYOUT", b"x", 0), Node("kafka", b"", 0),
             Node("kafka/transactions", b"", 0),
             Node("kafka/transactions/tx", committing.to_json(), 4),
             Node("kafka/transactions/ty", aborting.to_json(), 4)]
    paths = [n.path for n in settled_nodes(nodes)]
    assert paths == ["LAYOUT", "kafka", "kafka/transactions", "kafka/transactions/tx",
                     "kafka/transactions/ty", "kafka/pending_offsets",
                     "kafka/pending_offsets/x-612062", "kafka/pending_offsets/x-612062/tx"]
    again = settled_nodes([*nodes, Node("kafka/pending_offsets", b"", 0),
                                   Node("kafka/pending_offsets/x-612062", b"", 0),
                                   Node("kafka/pending_offsets/x-612062/tx", b"", 1)])
    assert len(again) == len(paths)  # an entry the snapshot has is kept as it is
