"""DeleteGroups of a share group checks for members, then deletes the stored state
(several ZooKeeper round trips), then forgets the group in memory: a member that
joins in between is told to retry (COORDINATOR_LOAD_IN_PROGRESS), never forgotten
while DeleteGroups answers success (found by review)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.gateway import Gateway
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore


def test_a_member_joining_during_delete_is_not_silently_dropped() -> None:
    async def main() -> tuple[int, dict[str, Any], bool]:
        store = InMemoryStore(InMemoryCluster())

        class Client:
            pass

        client = Client()
        client.store = store  # type: ignore[attr-defined]
        gw = Gateway(client, GatewayConfig())  # type: ignore[arg-type]
        gw.owns = lambda key: True  # type: ignore[method-assign]
        share = gw.share
        await share.store.set_configs("sg", {})  # a stored (empty) share group
        gate = trio.Event()
        real_delete = share.store.delete_group

        async def slow_delete(gid: str) -> bool:
            await gate.wait()  # ZooKeeper round trips
            return await real_delete(gid)

        share.store.delete_group = slow_delete  # type: ignore[method-assign]
        out: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            async def delete() -> None:
                out["code"] = await share.delete_group("sg")
            nursery.start_soon(delete)
            await trio.testing.wait_all_tasks_blocked()
            out["beat"] = await share.heartbeat(None, 1, {
                "group_id": "sg", "member_id": "m1", "member_epoch": 0, "rack_id": None,
                "subscribed_topic_names": []})
            gate.set()
        group = share.groups.get("sg")
        return out["code"], out["beat"], group is not None and "m1" in group.members

    code, beat, kept = trio.run(main)
    joined = beat.get("error_code", 0) == 0
    # a member told it joined is not silently forgotten by a delete answered NONE
    assert not (joined and code == ErrorCode.NONE and not kept), (code, beat, kept)
