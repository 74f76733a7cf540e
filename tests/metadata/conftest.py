"""A store factory parametrized over the in-memory twin and the real ZooKeeper.

Every behavioural test in this package that takes ``stores`` runs twice, once against
each implementation, so the twin cannot drift from ZooKeeper's semantics.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from kazoo.client import KazooClient

from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.metadata.store import MetadataStore
from ledgerd.metadata.zookeeper import ZooKeeperStore


class StoreFactory:
    def __init__(self, kind: str, servers: str) -> None:
        self.kind = kind
        self.servers = servers
        self.cluster = InMemoryCluster()
        self.opened: list[Any] = []

    async def open(self) -> MetadataStore:
        store: Any
        if self.kind == "memory":
            store = InMemoryStore(self.cluster)
        else:
            store = await ZooKeeperStore.connect(self.servers, session_timeout=4.0)
        self.opened.append(store)
        return store  # type: ignore[no-any-return]

    async def expire(self, store: Any) -> None:
        """Expire ``store``'s session the way the server would."""
        if self.kind == "memory":
            store.expire_session()
            return
        # The classic technique: a second client attaches to the same session and closes
        # it, which expires it on the server; the first client then sees LOST.
        host = self.servers.split("/", 1)[0]
        sid, pwd = store.session_id, store.session_password

        def hijack() -> None:
            other = KazooClient(hosts=host, client_id=(sid, pwd), timeout=4.0)
            other.start(timeout=15)
            other.stop()
            other.close()

        await trio.to_thread.run_sync(hijack)

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


@pytest.fixture(params=["memory", "zookeeper"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    servers = ""
    if request.param == "zookeeper":
        servers = request.getfixturevalue("zk_chroot")
    factory = StoreFactory(request.param, servers)
    try:
        yield factory
    finally:
        await factory.close_all()
