"""Bookies in the test's own trio loop, registered in the real ZooKeeper.

For client tests that need real bookies (real storage, real wire, real registration)
but not separate processes: ``stop(i)`` cancels one bookie's task, which closes its
connections like a crash does from the client's side. Kill -9 of processes needs the
process cluster (``ledgerd.testing.cluster``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ledgerd.appliance.bookie import Bookie
from ledgerd.appliance.config import BookieConfig
from ledgerd.appliance.main import connect_metadata
from ledgerd.base.settings import load_config
from ledgerd.disk.storage import LedgerStorage
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.testing.cluster import EVENT_BOUND_S, metadata_store
from ledgerd.tools.zkserver import find_free_port

__all__ = ["InProcessCluster", "inprocess_cluster"]


class InProcessCluster:
    def __init__(self, zk: str, base: Path, nursery: trio.Nursery, registry: BookieRegistry,
                 settings: dict[str, Any]) -> None:
        self.zk = zk
        self.base = base
        self.nursery = nursery
        self.registry = registry
        self.settings = settings
        self.bookies: list[Bookie] = []
        self.scopes: list[trio.CancelScope] = []

    async def add_bookie(self) -> Bookie:
        i = len(self.bookies)
        port = find_free_port()
        overrides = {
            "bookie_port": port, "listen_address": "127.0.0.1", "admin_port": find_free_port(),
            "zk_servers": self.zk, "zk_timeout_ms": 4000, "journal_prealloc_mb": 4,
            "journal_directory": str(self.base / f"b{i}" / "journal"),
            "ledger_directories": [str(self.base / f"b{i}" / "ledgers")],
            "log_level": "WARNING", **self.settings,
        }
        config = load_config(BookieConfig, overrides=overrides, env={})
        store = await connect_metadata(config)
        bookie = Bookie(config, LedgerStorage(config.storage_options()), store)
        scope = trio.CancelScope()

        async def run(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await bookie.run(task_status=task_status)
            finally:
                if store is not None:
                    with trio.CancelScope(shield=True):
                        await store.close()

        await self.nursery.start(run)
        self.bookies.append(bookie)
        self.scopes.append(scope)
        await self.wait_writable({bookie.bookie_id})
        return bookie

    async def wait_writable(self, ids: set[str], present: bool = True) -> None:
        async def done(snapshot: BookieSet) -> bool:
            return ids <= snapshot.writable if present else not ids & snapshot.writable
        with trio.fail_after(EVENT_BOUND_S):
            await self.registry.wait_for(done)

    def address(self, i: int) -> str:
        return self.bookies[i].bookie_id

    async def stop(self, i: int) -> None:
        """Cancel bookie ``i`` (its connections drop); waits until it is deregistered."""
        self.scopes[i].cancel()
        await self.wait_writable({self.address(i)}, present=False)


@asynccontextmanager
async def inprocess_cluster(zk: str, base: Path, bookies: int,
                            **settings: Any) -> AsyncIterator[InProcessCluster]:
    async with metadata_store(zk) as store, trio.open_nursery() as nursery:
        cluster = InProcessCluster(zk, base, nursery, BookieRegistry(store, "/ledgers"), settings)
        for _ in range(bookies):
            await cluster.add_bookie()
        yield cluster
        for bookie in cluster.bookies:
            bookie.request_stop()
