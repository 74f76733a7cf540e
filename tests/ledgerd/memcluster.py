"""A cluster in one trio run: real bookies over memory streams, in-memory metadata.

Each bookie is the real request path (``serve_connection`` + ``RequestHandler`` + the
core) over a real ``LedgerStorage`` in a temp directory; the client is the real
``open_client`` with an injected ``connect`` that hands it memory streams, and the
metadata store is ``InMemoryStore`` (the same semantics as ZooKeeper's). Tests run under
the autojump clock, so timeouts cost no wall time. Faults are put on a bookie's end of
its connections through its ``Gate``:

- ``freeze()``: the bookie reads and answers nothing more (a silent or paused peer);
- ``reset()``: every open connection ends at once (a reset mid-batch);
- ``refuse_connects``: new connections fail (a dead host).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing

from ledgerd.appliance.core import BookieCore
from ledgerd.appliance.server import ConnectionOptions
from ledgerd.disk.journal import JournalOptions
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.metadata.registry import BookieRegistry
from tests.appliance.harness import BookieHarness

ROOT = "/ledgers"


class Gate:
    """Faults on one bookie's end of its connections."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.open.set()
        self.refuse_connects = False
        self.ends: list[trio.abc.Stream] = []

    def freeze(self) -> None:
        if self.open.is_set():
            self.open = trio.Event()

    def thaw(self) -> None:
        self.open.set()

    async def reset(self) -> None:
        ends, self.ends = self.ends, []
        for end in ends:
            await end.aclose()


class _GatedEnd(trio.abc.Stream):
    """The bookie's end of one connection, through its gate."""

    def __init__(self, inner: trio.abc.Stream, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        await self.gate.open.wait()
        data = await self.inner.receive_some(max_bytes)
        await self.gate.open.wait()  # frozen while the bytes were in flight: hold them
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.gate.open.wait()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


class MemoryBookie:
    def __init__(self, address: str, harness: BookieHarness) -> None:
        self.address = address
        self.harness = harness
        self.gate = Gate()
        self.connects = 0

    @property
    def storage(self) -> LedgerStorage:
        return self.harness.storage

    def count(self, api: int, status: int) -> int:
        return self.harness.metrics.requests.get((api, status), 0)


class MemoryCluster:
    def __init__(self, store: InMemoryStore) -> None:
        self.store = store
        self.bookies: dict[str, MemoryBookie] = {}

    async def connect(self, address: str) -> trio.abc.Stream:
        """The ``connect`` a client is given: a memory stream to that bookie."""
        bookie = self.bookies.get(address)
        if bookie is None or bookie.gate.refuse_connects:
            raise OSError(111, f"connection refused by {address}")
        bookie.connects += 1
        client_end, server_end = trio.testing.memory_stream_pair()
        end = _GatedEnd(server_end, bookie.gate)
        bookie.gate.ends.append(end)
        bookie.harness.serve_stream(end)
        return client_end

    def __getitem__(self, address: str) -> MemoryBookie:
        return self.bookies[address]


# A journal that syncs as soon as its queue is empty: its group wait would otherwise be
# a virtual-clock deadline that only the autojump (after 50 ms of real idleness) passes.
FAST_JOURNAL = JournalOptions(flush_when_queue_empty=True)


@asynccontextmanager
async def memory_cluster(tmp: Path, bookies: int, *,
                         journal: JournalOptions | None = None,
                         journals: dict[int, JournalOptions] | None = None,
                         cluster_secret: bytes = b"", racks: dict[int, str] | None = None,
                         ) -> AsyncIterator[MemoryCluster]:
    """``bookies`` real bookies named ``b0:3181``, ``b1:3181``, ... registered in a fresh
    in-memory cluster; ``journals`` gives some bookies their own journal options."""
    store = InMemoryStore(InMemoryCluster())
    await init_new_cluster(store, ROOT)
    cluster = MemoryCluster(store)
    registry = BookieRegistry(store, ROOT)
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        for i in range(bookies):
            opts = StorageOptions(journal_dir=tmp / f"b{i}" / "journal",
                                  ledger_dirs=(tmp / f"b{i}" / "ledgers",),
                                  journal=(journals or {}).get(i, journal or FAST_JOURNAL))
            storage = LedgerStorage(opts)
            await storage.open()
            stack.push_async_callback(storage.close)
            await nursery.start(storage.run)
            harness = BookieHarness(storage, ConnectionOptions(),
                                    core=BookieCore(recovery_secret=cluster_secret))
            harness.nursery = nursery
            address = f"b{i}:3181"
            cluster.bookies[address] = MemoryBookie(address, harness)
            info: dict[str, str] = {"bookie_id": address}
            if racks and i in racks:
                info["rack"] = racks[i]
            await registry.register(address, info)
        try:
            yield cluster
        finally:
            for b in cluster.bookies.values():
                b.gate.thaw()
            nursery.cancel_scope.cancel()


def client_settings(**overrides: Any) -> dict[str, Any]:
    """Client settings for memory clusters: short timeouts (the clock is virtual)."""
    return {"zk_servers": "memory", "add_entry_timeout_ms": 1000, "read_timeout_ms": 1000,
            "speculative_read_timeout_ms": 400, "connect_timeout_ms": 1000,
            "throttle": 0, **overrides}
