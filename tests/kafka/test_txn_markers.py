"""A marker whose write keeps failing is retried only while its transaction is still
prepared at the same producer and epoch: once another coordinator completes it (and the
producer may begin its next transaction at that epoch), a late marker of the old one
would end the new one, so the retries stop. The record lives in the in-memory twin of
the metadata store; the gateway's marker write is the one thing stood in for."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import trio

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.transactions import TxnCoordinator
from ledgerd.kafka.txn_coordinator import Marker
from ledgerd.metadata.kafka_txns import TxnRecord, TxnState, TxnStore
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore


async def test_a_marker_retry_stops_once_the_transaction_has_moved_on(
        autojump_clock: Any) -> None:
    store = InMemoryStore(InMemoryCluster())
    root = "/ledgers/kafka"
    prepared = TxnRecord(transactional_id="t", producer_id=7, producer_epoch=3,
                         timeout_ms=60000, state=TxnState.PREPARE_COMMIT,
                         partitions=(("orders", 0),))
    await TxnStore(store, root).create(prepared)
    attempts: list[Marker] = []

    async def write_marker(marker: Marker) -> int:
        attempts.append(marker)
        if len(attempts) == 2:  # meanwhile another coordinator completed it
            await TxnStore(store, root).update(
                "t", lambda r: dataclasses.replace(r, state=TxnState.COMPLETE_COMMIT))
        return -1  # the partition's leader cannot be reached

    gw = SimpleNamespace(store=store, root=root, write_marker=write_marker,
                         nodes={}, lease=SimpleNamespace(session_id=1))
    txns = TxnCoordinator(gw)  # type: ignore[arg-type]
    marker = Marker(topic="orders", partition=0, producer_id=7, producer_epoch=3, commit=True)
    with trio.fail_after(60):
        await txns._write_marker(marker, prepared)
    assert len(attempts) == 2


async def test_idle_transactional_ids_expire_and_busy_or_recent_ones_stay(
        autojump_clock: Any) -> None:
    """A transactional id idle (no transaction open) past transactional_id_expiration_ms
    is forgotten, so a client cycling through ids cannot grow ZooKeeper without bound;
    one with a transaction open, or idle for less, stays."""
    from ledgerd.kafka import transactions

    store = InMemoryStore(InMemoryCluster())
    root = "/ledgers/kafka"
    now = transactions._now_ms()
    day = 24 * 3600 * 1000
    records = TxnStore(store, root)
    for tid, state, updated in (("old-done", TxnState.COMPLETE_COMMIT, now - 8 * day),
                                ("old-empty", TxnState.EMPTY, now - 8 * day),
                                ("recent", TxnState.COMPLETE_ABORT, now - day),
                                ("old-open", TxnState.PREPARE_COMMIT, now - 8 * day)):
        await records.create(TxnRecord(transactional_id=tid, producer_id=1, producer_epoch=0,
                                       timeout_ms=60000, state=state, updated_ms=updated,
                                       partitions=(("orders", 0),)))

    async def write_marker(marker: Marker) -> int:
        return 0

    gw = SimpleNamespace(store=store, root=root, write_marker=write_marker, nodes={},
                         lease=SimpleNamespace(session_id=1), owns=lambda _key: True,
                         config=SimpleNamespace(transactional_id_expiration_ms=7 * day))
    txns = TxnCoordinator(gw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        gw.nursery = nursery
        await txns.sweep()
    assert await records.get("old-done") is None and await records.get("old-empty") is None
    assert await records.get("recent") is not None
    assert await records.get("old-open") is not None  # completed now, not forgotten


class _CountingStore:
    """The in-memory store, counting the reads of one path (the record's)."""

    def __init__(self, inner: InMemoryStore, path: str) -> None:
        self.inner, self.path, self.reads = inner, path, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, path: str) -> Any:
        self.reads += path == self.path
        return await self.inner.get(path)


def _coordinator(store: Any, root: str, written: list[Marker], *,
                 here: bool = False) -> TxnCoordinator:
    """A coordinator over ``store`` that owns every id, for a gateway whose marker
    writes succeed (into ``written``); ``here``: it leads the partitions too, so a
    one-partition transaction ends in one phase (else another gateway does, and the
    transactions take two)."""
    async def write_marker(marker: Marker, *, here_only: bool = False) -> int:
        if here_only and not here:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        written.append(marker)
        return 0

    async def partition_count(_topic: str) -> int:
        return 1

    async def new_producer_id() -> int:
        return 7

    gw = SimpleNamespace(store=store, root=root, write_marker=write_marker, nodes={},
                         lease=SimpleNamespace(session_id=1), owns=lambda _key: True,
                         partition_count=partition_count, new_producer_id=new_producer_id,
                         nursery=None, config=SimpleNamespace(
                             transaction_one_phase=True,
                             transactional_id_expiration_ms=7 * 86400000))
    return TxnCoordinator(gw)  # type: ignore[arg-type]


async def _transaction(txns: TxnCoordinator, epoch: int, version: int = 3) -> tuple[int, int]:
    """AddPartitionsToTxn of orders/0, then EndTxn(commit): their error codes."""
    ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
    added = await txns.add_partitions(version, {**ids, "topics": [
        {"name": "orders", "partitions": [0]}]})
    ended = await txns.end_txn(version, {**ids, "committed": True})
    return added["results"][0]["results"][0]["error_code"], ended["error_code"]


async def test_a_steady_producers_transaction_reads_no_record(autojump_clock: Any) -> None:
    """Issue #47's transactional bench: each transaction read its record back four
    times (AddPartitionsToTxn's and EndTxn's compare-and-sets, and completing read it
    twice), one ZooKeeper round trip each. The coordinator now sets against the
    version it last wrote: three writes, no read, the same record at the end."""
    root = "/ledgers/kafka"
    store = _CountingStore(InMemoryStore(InMemoryCluster()), TxnStore(None, root).path("t"))  # type: ignore[arg-type]
    written: list[Marker] = []
    txns = _coordinator(store, root, written)
    init = await txns.init_producer_id(3, {"transactional_id": "t", "producer_id": -1,
                                           "producer_epoch": -1,
                                           "transaction_timeout_ms": 60000})
    assert (init["error_code"], init["producer_id"]) == (0, 7)
    with trio.fail_after(60):
        assert await _transaction(txns, init["producer_epoch"]) == (0, 0)
        store.reads = 0
        for _ in range(3):
            assert await _transaction(txns, init["producer_epoch"]) == (0, 0)
    assert store.reads == 0
    assert [(m.topic, m.partition, m.commit) for m in written] == [("orders", 0, True)] * 4
    record = await TxnStore(store, root).get("t")  # type: ignore[arg-type]
    assert record is not None and record.state is TxnState.COMPLETE_COMMIT
    _, stat = await store.inner.get(store.path)
    assert stat.version == 4 * 3  # ONGOING, PREPARE_COMMIT, COMPLETE_COMMIT each time


async def test_a_record_another_coordinator_changed_is_read_again(
        autojump_clock: Any) -> None:
    """The version this coordinator last wrote is only a guess: once another
    coordinator changed the record (here: a new producer fenced the epoch), the next
    request is decided on the stored record, as before: the old producer is fenced,
    and the record stays as the other coordinator left it."""
    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    txns = _coordinator(store, root, written)
    body = {"transactional_id": "t", "producer_id": -1, "producer_epoch": -1,
            "transaction_timeout_ms": 60000}
    epoch = (await txns.init_producer_id(3, body))["producer_epoch"]
    with trio.fail_after(60):
        assert await _transaction(txns, epoch) == (0, 0)
        other = _coordinator(store, root, written)
        assert (await other.init_producer_id(3, body))["producer_epoch"] == epoch + 1
        fenced = await TxnStore(store, root).get("t")
        added, ended = await _transaction(txns, epoch)
    assert added == ended == ErrorCode.PRODUCER_FENCED
    assert await TxnStore(store, root).get("t") == fenced
    assert fenced is not None and fenced.state is TxnState.EMPTY
    assert len(written) == 1


async def test_the_next_transaction_writes_the_last_ones_completion(
        autojump_clock: Any) -> None:
    """Back-to-back transactions: each AddPartitionsToTxn writes the last transaction's
    COMPLETE_COMMIT with its own ONGOING (two writes per transaction, not three); the
    last one is completed alone once ``FOLD_WAIT_S`` passes, and a sweep meanwhile
    completes it without writing its markers a second time."""
    from ledgerd.kafka.transactions import FOLD_WAIT_S

    root = "/ledgers/kafka"
    store = _CountingStore(InMemoryStore(InMemoryCluster()), TxnStore(None, root).path("t"))  # type: ignore[arg-type]
    records = TxnStore(store, root)  # type: ignore[arg-type]
    written: list[Marker] = []
    txns = _coordinator(store, root, written)
    async with trio.open_nursery() as nursery:
        txns.gw.nursery = nursery
        epoch = (await txns.init_producer_id(3, {
            "transactional_id": "t", "producer_id": -1, "producer_epoch": -1,
            "transaction_timeout_ms": 60000}))["producer_epoch"]
        store.reads = 0
        with trio.fail_after(60):
            for _ in range(4):
                assert await _transaction(txns, epoch) == (0, 0)
            _, stat = await store.inner.get(store.path)
            record = await records.get("t")
            assert record is not None and record.state is TxnState.PREPARE_COMMIT
            assert stat.version == 2 * 4  # ONGOING (with the last COMPLETE), PREPARE
            await trio.sleep(2 * FOLD_WAIT_S)
            record = await records.get("t")
            assert record is not None and record.state is TxnState.COMPLETE_COMMIT
            assert (await store.inner.get(store.path))[1].version == 2 * 4 + 1
            # a fifth, and the sweep finds it prepared before its completion is due
            assert await _transaction(txns, epoch) == (0, 0)
            await txns.sweep()
            await trio.sleep(2 * FOLD_WAIT_S)
        nursery.cancel_scope.cancel()
    record = await records.get("t")
    assert record is not None and record.state is TxnState.COMPLETE_COMMIT
    assert [(m.partition, m.commit) for m in written] == [(0, True)] * 5


async def _init(txns: TxnCoordinator) -> int:
    init = await txns.init_producer_id(3, {"transactional_id": "t", "producer_id": -1,
                                           "producer_epoch": -1,
                                           "transaction_timeout_ms": 60000})
    assert init["error_code"] == 0
    return int(init["producer_epoch"])


async def test_one_partition_transactions_led_here_write_no_record(
        autojump_clock: Any) -> None:
    """Issue #47's transactional bench, one phase: with the partition led by the
    coordinator, EndTxn writes the marker and nothing else, and the next transaction
    begins under the record stored by the first one (ONGOING with that partition), so
    only the first transaction writes the record. The true state is kept in memory
    (a batch after the commit is refused; DescribeTransactions says COMPLETE_COMMIT)
    and stored ``FOLD_WAIT_S`` after the last transaction."""
    from ledgerd.kafka.transactions import FOLD_WAIT_S

    root = "/ledgers/kafka"
    store = _CountingStore(InMemoryStore(InMemoryCluster()), TxnStore(None, root).path("t"))  # type: ignore[arg-type]
    records = TxnStore(store, root)  # type: ignore[arg-type]
    written: list[Marker] = []
    txns = _coordinator(store, root, written, here=True)
    async with trio.open_nursery() as nursery:
        txns.gw.nursery = nursery
        epoch = await _init(txns)
        store.reads = 0
        with trio.fail_after(60):
            for _ in range(5):
                assert await _transaction(txns, epoch) == (0, 0)
            reads = store.reads
            _, stat = await store.inner.get(store.path)
            assert stat.version == 1  # the first AddPartitionsToTxn's ONGOING only
            record = await records.get("t")
            assert record is not None and record.state is TxnState.ONGOING
            assert await txns.verify("t", 7, epoch, "orders", 0) == \
                ErrorCode.INVALID_TXN_STATE  # ended: its late batch is refused
            assert txns.current(record).state is TxnState.COMPLETE_COMMIT
            await trio.sleep(2 * FOLD_WAIT_S)
        nursery.cancel_scope.cancel()
    record = await records.get("t")
    assert record is not None and record.state is TxnState.COMPLETE_COMMIT
    assert (await store.inner.get(store.path))[1].version == 2
    assert reads == 0
    assert [(m.partition, m.commit, m.producer_epoch) for m in written] == \
        [(0, True, epoch)] * 5


async def test_a_one_phase_record_taken_over_ends_as_its_producer_says(
        autojump_clock: Any) -> None:
    """A coordinator that dies after a one-phase commit leaves its record ONGOING
    with the partition. The next coordinator, from that record: a retried EndTxn is
    answered success (its commit marker written again, which changes nothing), and
    the next transaction commits; after that one, also in one phase, a new producer
    instance at a third coordinator fences the old one with an abort marker at a newer
    epoch (which ends nothing: the last one committed)."""
    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    first = _coordinator(store, root, written, here=True)
    epoch = await _init(first)
    with trio.fail_after(60):
        assert await _transaction(first, epoch) == (0, 0)
        ended = await first.end_txn(3, {"transactional_id": "t", "producer_id": 7,
                                        "producer_epoch": epoch, "committed": True})
        assert ended["error_code"] == 0  # a retry, answered from memory
        stored = await TxnStore(store, root).get("t")
        assert stored is not None and stored.state is TxnState.ONGOING
        second = _coordinator(store, root, written, here=True)
        ended = await second.end_txn(3, {"transactional_id": "t", "producer_id": 7,
                                         "producer_epoch": epoch, "committed": True})
        assert ended["error_code"] == 0
        assert await _transaction(second, epoch) == (0, 0)
        stored = await TxnStore(store, root).get("t")
        assert stored is not None and stored.state is TxnState.ONGOING
        third = _coordinator(store, root, written, here=True)
        body = {"transactional_id": "t", "producer_id": -1, "producer_epoch": -1,
                "transaction_timeout_ms": 60000}
        assert (await third.init_producer_id(3, body))["error_code"] == \
            ErrorCode.CONCURRENT_TRANSACTIONS  # the "ongoing" one aborted, epoch bumped
        again = await third.init_producer_id(3, body)
    assert again["error_code"] == 0 and again["producer_epoch"] == epoch + 2
    assert [(m.commit, m.producer_epoch) for m in written] == \
        [(True, epoch)] * 3 + [(False, epoch + 1)]


async def test_a_marker_not_written_in_one_phase_is_decided_in_two(
        autojump_clock: Any) -> None:
    """EndTxn whose one-phase marker is refused (here: the partition says the epoch is
    stale, as it does once another coordinator fenced the producer) writes the
    decision first and the marker again: the record says PREPARE_COMMIT before any
    marker counts, as in every two-phase transaction."""
    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    txns = _coordinator(store, root, written, here=True)
    refused: list[Marker] = []
    stored_at_marker: list[TxnState] = []

    async def write_marker(marker: Marker, *, here_only: bool = False) -> int:
        if here_only and not refused:
            refused.append(marker)
            return ErrorCode.INVALID_PRODUCER_EPOCH
        record = await TxnStore(store, root).get("t")
        assert record is not None
        stored_at_marker.append(record.state)
        written.append(marker)
        return 0

    txns.gw.write_marker = write_marker
    epoch = await _init(txns)
    with trio.fail_after(60):
        assert await _transaction(txns, epoch) == (0, 0)
    assert len(refused) == 1 and len(written) == 1
    assert stored_at_marker == [TxnState.PREPARE_COMMIT]
    record = await TxnStore(store, root).get("t")
    assert record is not None and record.state is TxnState.COMPLETE_COMMIT


async def test_a_record_another_coordinator_wrote_ends_the_one_phase_lease(
        autojump_clock: Any) -> None:
    """Two gateways may both take themselves for the id's coordinator for a moment
    (their views of the live gateways differ). After a one-phase commit at ``a`` the
    producer's next transaction goes to ``b`` (two partitions: written, two phases,
    completed). Its next one is back at ``a``, whose memory says the id is idle under
    the ONGOING record it stored: ``a`` sees that the record moved on, writes the new
    transaction's ONGOING and ends it with its marker, rather than beginning it
    unwritten and then reading the stored COMPLETE_COMMIT as a retried commit of the
    one ``b`` ended (its batches would be left open, its commit answered)."""
    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    a = _coordinator(store, root, written, here=True)
    b = _coordinator(store, root, written, here=True)
    epoch = await _init(a)
    ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
    with trio.fail_after(60):
        assert await _transaction(a, epoch) == (0, 0)
        added = await b.add_partitions(3, {**ids, "topics": [
            {"name": "orders", "partitions": [0]}, {"name": "refunds", "partitions": [0]}]})
        assert {r["error_code"] for t in added["results"] for r in t["results"]} == {0}
        assert (await b.end_txn(3, {**ids, "committed": True}))["error_code"] == 0
        stored = await TxnStore(store, root).get("t")
        assert stored is not None and stored.state is TxnState.COMPLETE_COMMIT
        del written[:]
        assert await _transaction(a, epoch) == (0, 0)
    assert [(m.partition, m.commit) for m in written] == [(0, True)]
    stored = await TxnStore(store, root).get("t")
    assert stored is not None and stored.state is TxnState.ONGOING
    assert stored.partitions == (("orders", 0),)


async def test_one_phase_off_takes_two_phases_for_every_transaction(
        autojump_clock: Any) -> None:
    """``transaction_one_phase = false``: the partition led here changes nothing, each
    transaction writes its record (ONGOING, then PREPARE_COMMIT, COMPLETE_COMMIT)."""
    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    txns = _coordinator(store, root, written, here=True)
    txns.gw.config.transaction_one_phase = False
    epoch = await _init(txns)
    with trio.fail_after(60):
        for _ in range(3):
            assert await _transaction(txns, epoch) == (0, 0)
    assert (await store.get(TxnStore(store, root).path("t")))[1].version == 3 * 3
    assert len(written) == 3


async def test_a_version_read_that_fails_is_answered_as_the_two_phases_answer(
        autojump_clock: Any) -> None:
    """ZooKeeper away during a one-phase EndTxn's version read: the client is told
    COORDINATOR_NOT_AVAILABLE (it retries), not left with a closed connection, and no
    marker is written."""
    from ledgerd.metadata.errors import MetadataUnavailableError

    root = "/ledgers/kafka"
    store = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    txns = _coordinator(store, root, written, here=True)
    epoch = await _init(txns)
    ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
    with trio.fail_after(60):
        added = await txns.add_partitions(3, {**ids, "topics": [
            {"name": "orders", "partitions": [0]}]})
        assert added["results"][0]["results"][0]["error_code"] == 0

        async def away(*_args: Any, **_kwargs: Any) -> Any:
            raise MetadataUnavailableError("127.0.0.1:2181", "connection lost")

        txns.records.store = SimpleNamespace(exists=away, get=away, set=away, sync=away)
        ended = await txns.end_txn(3, {**ids, "committed": True})
    assert ended["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert written == []


class _Follower:
    """The in-memory store as a gateway whose ZooKeeper server is a follower behind
    its leader sees it: a path read once answers that copy until a ``sync``."""

    def __init__(self, inner: InMemoryStore) -> None:
        self.inner = inner
        self.copies: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, path: str) -> Any:
        if path not in self.copies:
            self.copies[path] = await self.inner.get(path)
        return self.copies[path]

    async def sync(self, path: str) -> None:
        await self.inner.sync(path)
        self.copies.pop(path, None)


async def test_a_partition_led_elsewhere_asks_the_leaders_copy_of_the_record(
        autojump_clock: Any) -> None:
    """A partition another gateway leads verifies a transactional batch against the
    stored record. That gateway's ZooKeeper server may be a follower still behind the
    coordinator's write of the end; the marker came after that write, so a late batch
    read against the follower's copy would open a transaction nobody ends. The read
    is synced first: the ended transaction's batch is refused."""
    root = "/ledgers/kafka"
    inner = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    coordinator = _coordinator(inner, root, written)  # two phases: the partition is not here
    leader = _coordinator(_Follower(inner), root, [])
    leader.gw.owns = lambda _key: False  # it leads orders/0, not the transactional id
    async with trio.open_nursery() as nursery:
        coordinator.gw.nursery = leader.gw.nursery = nursery
        epoch = await _init(coordinator)
        ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
        with trio.fail_after(60):
            added = await coordinator.add_partitions(3, {**ids, "topics": [
                {"name": "orders", "partitions": [0]}]})
            assert added["results"][0]["results"][0]["error_code"] == 0
            assert await leader.verify("t", 7, epoch, "orders", 0) == 0
            ended = await coordinator.end_txn(3, {**ids, "committed": False})
            assert ended["error_code"] == 0 and len(written) == 1
            assert await leader.verify("t", 7, epoch, "orders", 0) == \
                ErrorCode.INVALID_TXN_STATE
        nursery.cancel_scope.cancel()
