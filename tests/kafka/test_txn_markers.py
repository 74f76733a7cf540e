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
