"""One-phase transactions (``transactions.py``) against the races an outside review
found in them (each test failed before the fix): a transaction begun while the last
one's end is being stored, concurrent changes of one id, and a view change before the
end is stored. Stat reads and writes here take a ZooKeeper round trip (``_SlowStat``),
and the coordinator's clock follows trio's."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from ledgerd.kafka.txn_coordinator import Marker
from ledgerd.metadata.kafka_txns import TxnState, TxnStore
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from tests.kafka.test_txn_markers import _coordinator, _init, _transaction


@pytest.fixture(autouse=True)
def _trio_wall_clock(monkeypatch: Any) -> None:
    """The coordinator's wall-clock milliseconds follow trio's (autojump) clock, so
    transaction timeouts pass in the tests."""
    from ledgerd.kafka import transactions

    base = transactions._now_ms()
    monkeypatch.setattr(transactions, "_now_ms",
                        lambda: base + int(trio.current_time() * 1000))


class _SlowStat:
    """The in-memory store whose stat read is answered as the tree was when the
    server took it, its reply arriving ``delay`` later (a ZooKeeper round trip: a
    write sent after the read is applied before the reply arrives)."""

    def __init__(self, inner: InMemoryStore, delay: float = 0.01,
                 set_delay: float = 0.0) -> None:
        self.inner, self.delay, self.set_delay = inner, delay, set_delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def exists(self, path: str) -> Any:
        stat = await self.inner.exists(path)
        await trio.sleep(self.delay)
        return stat

    async def set(self, path: str, data: bytes, version: int = -1) -> Any:
        stat = await self.inner.set(path, data, version)  # applied now, answered later
        if self.set_delay:
            await trio.sleep(self.set_delay)
        return stat


async def _race(store: Any, root: str, written: list[Marker], nursery: Any,
                ) -> tuple[Any, dict[str, Any]]:
    """txn1 in one phase, then txn2's AddPartitionsToTxn timed so that its stat read is
    in flight when ``_store_later`` writes txn1's COMPLETE_COMMIT."""
    from ledgerd.kafka.transactions import FOLD_WAIT_S

    txns = _coordinator(store, root, written, here=True)
    txns.gw.nursery = nursery
    epoch = await _init(txns)
    ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
    assert await _transaction(txns, epoch) == (0, 0)  # txn1, one phase
    await trio.sleep(FOLD_WAIT_S - 0.005)
    added = await txns.add_partitions(3, {**ids, "topics": [
        {"name": "orders", "partitions": [0]}]})
    assert added["results"][0]["results"][0]["error_code"] == 0
    assert await txns.verify("t", 7, epoch, "orders", 0) == 0  # txn2's batches accepted
    return txns, ids


async def test_a_transaction_begun_while_the_last_end_is_stored_stays_covered(
        autojump_clock: Any) -> None:
    """txn2 begins as ``_store_later`` writes txn1's COMPLETE_COMMIT (its stat read in
    flight meanwhile). It must not begin unwritten under a record that no longer
    covers it: when its coordinator dies after txn2's batches are accepted, the next
    one finds txn2 ONGOING and aborts it past the timeout (a hanging transaction
    otherwise)."""
    root = "/ledgers/kafka"
    inner = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(600):
            await _race(_SlowStat(inner), root, written, nursery)
            stored = await TxnStore(inner, root).get("t")
            print("\nstored while txn2 is open:", stored.state, stored.partitions)
            # the coordinator dies here; another takes over, the producer is gone
            del written[:]
            b = _coordinator(inner, root, written, here=True)
            b.gw.nursery = nursery
            b.gw.config = type("C", (), {"transactional_id_expiration_ms": 7 * 86400000,
                                 "transaction_one_phase": True})
            await trio.sleep(120)  # twice the transaction timeout
            await b.sweep()
            await trio.sleep(1)
            print("markers written by the new coordinator:", written)
        nursery.cancel_scope.cancel()
    assert stored.state is TxnState.ONGOING and ("orders", 0) in stored.partitions
    assert written  # txn2 must be ended (aborted) somewhere


async def test_a_transaction_begun_while_the_last_end_is_stored_gets_its_marker(
        autojump_clock: Any) -> None:
    """As above, the write's reply arriving after the stat read's: txn2's
    EndTxn(commit) must write txn2's marker, not take the stored COMPLETE_COMMIT for a
    retry of txn1's commit and answer success without it (a lost commit)."""
    root = "/ledgers/kafka"
    inner = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            txns, ids = await _race(_SlowStat(inner, set_delay=0.02), root, written,
                                    nursery)
            await trio.sleep(0.05)
            ended = await txns.end_txn(3, {**ids, "committed": True})
            print("\ntxn2 EndTxn:", ended, "markers:",
                  [(m.partition, m.commit) for m in written])
        nursery.cancel_scope.cancel()
    assert ended["error_code"] == 0
    assert [(m.partition, m.commit) for m in written] == [(0, True)] * 2


async def test_an_idle_producer_is_not_fenced_after_a_view_change(autojump_clock: Any) -> None:
    """A one-phase commit, then the live gateways change within FOLD_WAIT_S (a gateway
    joins): the cache is dropped, and the end it held must still be stored, or the
    stored ONGOING record would time out past transaction.timeout.ms and fence a
    producer with no transaction open (Kafka would not)."""
    root = "/ledgers/kafka"
    inner = InMemoryStore(InMemoryCluster())
    written: list[Marker] = []
    txns = _coordinator(inner, root, written, here=True)
    txns.gw.config = type("C", (), {"transactional_id_expiration_ms": 7 * 86400000,
                                 "transaction_one_phase": True})
    async with trio.open_nursery() as nursery:
        txns.gw.nursery = nursery
        epoch = await _init(txns)
        with trio.fail_after(600):
            assert await _transaction(txns, epoch) == (0, 0)
            txns.gw.nodes = {2: ("other", 9092)}  # a gateway joined
            await trio.sleep(61)  # the producer is idle past its timeout
            await txns.sweep()
            await trio.sleep(1)
            ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
            added = await txns.add_partitions(3, {**ids, "topics": [
                {"name": "orders", "partitions": [0]}]})
            print("\nmarkers:", [(m.commit, m.producer_epoch) for m in written],
                  "next AddPartitionsToTxn:", added["results"][0]["results"][0])
        nursery.cancel_scope.cancel()
    assert added["results"][0]["results"][0]["error_code"] == 0


async def test_concurrent_add_partitions_leave_the_store_covering_the_cache(
        autojump_clock: Any) -> None:
    """Two AddPartitionsToTxn of one id at once after a one-phase commit (a client's
    retry on a new connection while the first is still served): orders/0 would be
    covered, refunds/0 written. One change at a time, the stored record ends up
    covering every partition the cache (which decides ``verify``) admits, and the
    next coordinator ends them all."""
    root = "/ledgers/kafka"
    inner = InMemoryStore(InMemoryCluster())
    records = TxnStore(inner, root)
    written: list[Marker] = []
    txns = _coordinator(_SlowStat(inner), root, written, here=True)
    async with trio.open_nursery() as nursery:
        txns.gw.nursery = nursery
        epoch = await _init(txns)
        ids = {"transactional_id": "t", "producer_id": 7, "producer_epoch": epoch}
        with trio.fail_after(600):
            assert await _transaction(txns, epoch) == (0, 0)
            codes: list[int] = []

            async def add(topic: str) -> None:
                r = await txns.add_partitions(3, {**ids, "topics": [
                    {"name": topic, "partitions": [0]}]})
                codes.append(r["results"][0]["results"][0]["error_code"])

            async with trio.open_nursery() as n:
                n.start_soon(add, "orders")
                await trio.sleep(0.001)
                n.start_soon(add, "refunds")
            stored = await records.get("t")
            cached = txns.cache["t"]
            print("\ncodes", codes, "stored:", stored.state, stored.partitions,
                  "cache:", cached.state, cached.partitions, "_stored:", "t" in txns._stored)
            print("verify orders/0:", await txns.verify("t", 7, epoch, "orders", 0),
                  "refunds/0:", await txns.verify("t", 7, epoch, "refunds", 0))
            # the producer writes into orders/0 (accepted); the coordinator dies
            del written[:]
            b = _coordinator(inner, root, written, here=True)
            b.gw.nursery = nursery
            b.gw.config = type("C", (), {"transactional_id_expiration_ms": 7 * 86400000,
                                 "transaction_one_phase": True})
            await trio.sleep(61)
            await b.sweep()
            await trio.sleep(1)
            print("markers by the next coordinator after the timeout:",
                  [(m.topic, m.commit) for m in written])
        nursery.cancel_scope.cancel()
    assert codes == [0, 0]
    assert set(cached.partitions) <= set(stored.partitions)
