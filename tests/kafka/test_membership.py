"""A gateway's view of the live gateways follows ZooKeeper's registrations as they change
(a watch), not only at its periodic refresh: until every gateway has seen one arrive or
go, two of them can each answer Metadata as a partition's leader."""

from __future__ import annotations

import trio
import trio.testing

from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.gateway import Gateway
from ledgerd.metadata.kafka_gateways import GatewayRecord, GatewayStore
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore


class _Client:
    def __init__(self, store: InMemoryStore) -> None:
        self.store = store


async def test_a_gateway_sees_another_arrive_and_go_before_its_periodic_refresh(
        mock_clock: trio.testing.MockClock) -> None:
    """The clock stands still (no periodic refresh ever comes due): the view changes
    only because ZooKeeper said the registrations changed."""
    cluster = InMemoryCluster()
    mine, theirs = InMemoryStore(cluster), InMemoryStore(cluster)
    config = GatewayConfig()
    await mine.create(f"{config.zk_ledgers_root_path.rstrip('/')}/INSTANCEID", b"i",
                      make_parents=True)
    gw = Gateway(_Client(mine), config)  # type: ignore[arg-type]
    gw.port, gw.node_id = 9092, 1
    gw.lease.session_id = mine.session_id
    await gw._register()
    await gw._refresh()
    assert set(gw.nodes) == {1}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gw._membership)
        nursery.start_soon(gw._watch_members)
        await trio.testing.wait_all_tasks_blocked()
        await GatewayStore(theirs, gw.root).register(2, GatewayRecord(host="h", port=1))
        await trio.testing.wait_all_tasks_blocked()
        assert set(gw.nodes) == {1, 2}
        assert gw.owner("t/0") in (1, 2)
        await theirs.close()  # its session ends: its registration goes
        await trio.testing.wait_all_tasks_blocked()
        assert set(gw.nodes) == {1}
        assert trio.current_time() == 0  # no refresh came due meanwhile
        nursery.cancel_scope.cancel()
