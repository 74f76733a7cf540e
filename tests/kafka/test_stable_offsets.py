"""OffsetFetch with require_stable (KIP-447) asks which offsets transactions hold
before it reads the committed cursors: a transaction that completes in between has
written its offsets by then, so the pre-transaction offset is never answered as
stable (found by review: the first version read the cursors first)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import trio

from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.gateway import Gateway
from ledgerd.metadata.kafka_groups import group_znode
from ledgerd.metadata.kafka_txns import PendingOffset, TxnRecord, TxnState
from ledgerd.metadata.logs import CursorRecord
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore


def test_require_stable_never_answers_the_offset_before_a_committed_txn() -> None:
    async def main() -> dict[str, Any]:
        store = InMemoryStore(InMemoryCluster())
        cursor = {"offset": 5}
        gw: Gateway

        async def finish_commit() -> None:
            # what the transaction's coordinator does: the offsets, then COMPLETE_COMMIT
            cursor["offset"] = 9
            await gw.txn.records.update("tx", lambda r: replace(
                r, state=TxnState.COMPLETE_COMMIT, offsets=(), groups=(), partitions=()))

        class LogStore:
            async def get_cursor(self, name: str, cur: str) -> Any:
                got = (CursorRecord(0, 0, 0, kafka_offset=cursor["offset"]), 0)
                await finish_commit()  # the transaction completes right after the read
                return got

        class Logs:
            store = LogStore()

        class Client:
            pass

        client = Client()
        client.store = store  # type: ignore[attr-defined]
        client.logs = Logs()  # type: ignore[attr-defined]
        gw = Gateway(client, GatewayConfig())  # type: ignore[arg-type]
        gw.owns = lambda key: True  # type: ignore[method-assign]
        # a transaction committing offset 9 of in/0 for group g (PREPARE_COMMIT)
        await gw.txn.records.create(TxnRecord(
            transactional_id="tx", producer_id=1, producer_epoch=0, timeout_ms=60000,
            state=TxnState.ONGOING, groups=("g",)))
        await gw.txn.records.update_offsets("tx", group_znode("g"), lambda r: replace(
            r, offsets=(PendingOffset(group="g", topic="in", partition=0, offset=9,
                                      metadata=None),)))
        await gw.txn.records.update("tx", lambda r: replace(
            r, state=TxnState.PREPARE_COMMIT))
        return await gw.offset_fetch(None, 7, {  # type: ignore[arg-type]
            "group_id": "g", "require_stable": True,
            "topics": [{"name": "in", "partition_indexes": [0]}]})

    reply = trio.run(main)
    part = reply["topics"][0]["partitions"][0]
    # either UNSTABLE_OFFSET_COMMIT (the client asks again) or the transaction's 9;
    # never 5 as stable: a consume-transform-produce loop would process 5..8 twice
    assert part["error_code"] != 0 or part["committed_offset"] == 9, part


def test_deleting_a_group_drops_its_stale_pending_entries_and_keeps_live_ones() -> None:
    """DeleteGroups leaves nothing of the group in the pending-offsets index but the
    entries of transactions that still hold its offsets."""

    async def main() -> tuple[list[str], list[str], bool]:
        store = InMemoryStore(InMemoryCluster())

        class Client:
            pass

        client = Client()
        client.store = store  # type: ignore[attr-defined]
        gw = Gateway(client, GatewayConfig())  # type: ignore[arg-type]
        for tid, group in (("done", "g"), ("open", "h"), ("done2", "h")):
            await gw.txn.records.create(TxnRecord(
                transactional_id=tid, producer_id=1, producer_epoch=0, timeout_ms=60000,
                state=TxnState.ONGOING, groups=(group,)))
            await gw.txn.records.update_offsets(tid, group_znode(group), lambda r, g=group:
                                                replace(r, offsets=(PendingOffset(
                                                    group=g, topic="in", partition=0,
                                                    offset=9, metadata=None),)))
        for tid in ("done", "done2"):  # committed: their entries are stale
            await gw.txn.records.update(tid, lambda r: replace(
                r, state=TxnState.COMPLETE_COMMIT, offsets=(), groups=()))
        await gw.txn.forget_group("g")
        await gw.txn.forget_group("h")
        gone = await store.exists("/ledgers/kafka/pending_offsets/g") is None
        return (await gw.txn.records.pending("g"), await gw.txn.records.pending("h"), gone)

    g, h, gone = trio.run(main)
    assert g == [] and gone  # g's only entry was stale: its node went with it
    assert h == ["open"]  # a transaction still holding h's offsets keeps its entry
