"""A cluster in one trio run: real bookies over memory streams, in-memory metadata.

``memory_cluster(tmp, bookies)`` runs each bookie's real request path
(``serve_connection`` + ``RequestHandler`` + the core, as ``BookieHarness``) over a real
``LedgerStorage`` in a temp directory; a client is the real ``open_client`` given the
cluster's ``connect``, which hands it memory streams, and the metadata store is
``InMemoryStore`` (the same semantics as ZooKeeper's). Run it under trio's mock clock
(``MockClock(autojump_threshold=0)``, pytest-trio's ``autojump_clock``) and timeouts cost
no wall time::

    async with memory_cluster(tmp_path, 3) as cluster:
        async with ledgerd.open_client(connect=cluster.connect, store=cluster.store,
                                       **client_settings()) as client:
            ...

Faults are put on a bookie's end of its connections through its ``Gate``:

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
from ledgerd.appliance.handlers import AdminHooks, RequestHandler, ServingState
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.security import ConnectionSecurity
from ledgerd.appliance.server import ConnectionOptions, serve_connection
from ledgerd.bookie_client import BookieClient
from ledgerd.disk.journal import JournalOptions
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.memory import InMemoryCluster, InMemoryStore
from ledgerd.metadata.registry import BookieRegistry
from ledgerd.wire.connection import ClientConnection
from ledgerd.wire.messages import AdminKind

__all__ = ["FAST_JOURNAL", "ROOT", "BookieHarness", "Gate", "MemoryBookie", "MemoryCluster",
           "client_settings", "memory_cluster"]


class BookieHarness:
    """One bookie's real request path (``RequestHandler`` and the core over a real
    ``LedgerStorage``) serving in-memory connections from its ``nursery``."""

    def __init__(self, storage: LedgerStorage, options: ConnectionOptions,
                 admin_secret: str = "", core: BookieCore | None = None) -> None:
        self.storage = storage
        self.state = ServingState()
        self.metrics = BookieMetrics()
        self.triggered: list[AdminKind] = []
        self.admin = AdminHooks(trigger=self._trigger, status=lambda: {"ok": True},
                                secret=admin_secret)
        self.handler = RequestHandler(storage, self.state, self.metrics, admin=self.admin,
                                      max_frame_bytes=options.max_frame_bytes, core=core)
        self.options = options
        self.nursery: trio.Nursery | None = None
        # Connections served from now on check roles with this (plaintext transport).
        self.security: ConnectionSecurity | None = None

    def _trigger(self, kind: AdminKind) -> bool:
        self.triggered.append(kind)
        return True

    async def settled(self) -> None:
        """Until every journal group in flight is collected: the hub's add replies leave
        from the syncer when their group is durable and are counted (metrics) when the
        event loop collects it, which may come after the client has its reply."""
        await self.storage.journal.settle()

    def server_security(self) -> ConnectionSecurity | None:
        """The security connections are served with from now on."""
        return self.security

    def serve_stream(self, stream: trio.abc.Stream, *, trusted: bool = True) -> trio.Event:
        """Serve ``stream``; the returned event fires when that connection is over."""
        assert self.nursery is not None
        done = trio.Event()

        security = self.server_security()

        async def serve() -> None:
            try:
                await serve_connection(stream, self.handler, self.options, trusted=trusted,
                                       security=security)
            finally:
                done.set()

        self.nursery.start_soon(serve)
        return done

    def _pair(self, *, trusted: bool, lockstep: bool = False
              ) -> tuple[trio.abc.Stream, trio.Event]:
        """A client end and the event that fires when the server side is over."""
        pair = trio.testing.lockstep_stream_pair if lockstep else \
            trio.testing.memory_stream_pair
        client_end, server_end = pair()
        return client_end, self.serve_stream(server_end, trusted=trusted)

    @asynccontextmanager
    async def connect(self, *, trusted: bool = True, lockstep: bool = False,
                      max_inflight: int = 1024) -> AsyncIterator[BookieClient]:
        """A client over a fresh in-memory connection to this bookie."""
        client_end, _ = self._pair(trusted=trusted, lockstep=lockstep)
        client = BookieClient("memory", client_end,
                              ClientConnection(max_inflight=max_inflight))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            try:
                yield client
            finally:
                # Close before cancelling: an await in a cancelled scope raises Cancelled,
                # which would replace the body's own exception and then be absorbed by
                # this nursery, so a failing assertion passed silently.
                client.close()
                with trio.CancelScope(shield=True):
                    await client_end.aclose()
                nursery.cancel_scope.cancel()

    def raw_pair(self, *, trusted: bool = True) -> trio.abc.Stream:
        """The client end of a connection, for tests that write raw bytes."""
        return self.raw_connection(trusted=trusted)[0]

    def raw_connection(self, *, trusted: bool = True) -> tuple[trio.abc.Stream, trio.Event]:
        """The client end of a connection and the event that fires when it is over."""
        return self._pair(trusted=trusted)


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
