"""A bookie's request path over in-memory streams, for handler tests.

``BookieHarness`` opens a real LedgerStorage in a temp directory, runs its services, and
serves connections made with ``connect()`` (a memory stream pair, or a lockstep pair
when a test needs to see backpressure) through the real ``serve_connection``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
import trio.testing

from ledgerd.appliance.core import BookieCore
from ledgerd.appliance.handlers import AdminHooks, RequestHandler, ServingState
from ledgerd.appliance.hub import ConnectionHub
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.security import ConnectionSecurity
from ledgerd.appliance.server import ConnectionOptions, serve_connection
from ledgerd.base.tls import ReloadingContext, client_context, server_context
from ledgerd.bookie_client import BookieClient, start_tls
from ledgerd.disk.journal import JournalOptions
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.connection import ClientConnection
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.messages import AdminKind

KEY = master_key(b"secret")
OTHER_KEY = master_key(b"other")
D = Digester(DigestType.CRC32C)


def entry(ledger: int, eid: int, lac: int | None = None, payload: bytes = b"") -> bytes:
    body = payload or f"entry {ledger}/{eid}".encode()
    return encode_entry(D, ledger, eid, eid - 1 if lac is None else lac, 0, body)


# How ``running_bookie`` serves connections: "tasks" (``serve_connection`` over memory
# streams), "hub" (the ``ConnectionHub`` over real socket pairs) or "tls" (
# ``serve_connection`` with TLS required: every client connection upgrades with
# START_TLS first). Handler tests run under all three (their ``transport`` fixture sets
# this; tests marked ``no_tls`` are deselected for "tls": half-close does not exist in
# TLS streams).
TRANSPORT = "tasks"


class _Pki:
    """One throwaway CA and bookie certificate for the whole test session."""

    _made: _Pki | None = None

    def __init__(self) -> None:
        import tempfile

        import trustme

        self.dir = Path(tempfile.mkdtemp(prefix="ledgerd-test-tls-"))
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", common_name="test-bookie")
        self.ca, self.cert, self.key = (str(self.dir / n) for n in ("ca.pem", "b.pem", "b.key"))
        ca.cert_pem.write_to_path(self.ca)
        Path(self.cert).write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(self.key)

    @classmethod
    def get(cls) -> _Pki:
        if cls._made is None:
            cls._made = cls()
        return cls._made


class UpgradingStream(trio.abc.Stream):
    """A client end that runs START_TLS and the handshake on first use, then is the
    TLS stream (so the harness's sync ``_pair`` can hand it out)."""

    def __init__(self, raw: trio.abc.Stream, context: ssl.SSLContext) -> None:
        self._raw = raw
        self._context = context
        self._tls: trio.abc.Stream | None = None
        self._lock = trio.Lock()

    async def _ready(self) -> trio.abc.Stream:
        async with self._lock:
            if self._tls is None:
                self._tls = await start_tls("127.0.0.1:1", self._raw, ClientConnection(),
                                            self._context)
            return self._tls

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await (await self._ready()).send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await (await self._ready()).wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await (await self._ready()).receive_some(max_bytes)

    async def aclose(self) -> None:
        await (self._tls or self._raw).aclose()


class BookieHarness:
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
        self.hub: ConnectionHub | None = None
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

    def serve_stream(self, stream: trio.abc.Stream, *, trusted: bool = True) -> trio.Event:
        """Serve ``stream``; the returned event fires when that connection is over."""
        assert self.nursery is not None
        done = trio.Event()

        security = self.security
        if TRANSPORT == "tls":
            pki = _Pki.get()
            security = ConnectionSecurity(ReloadingContext(
                lambda: server_context(pki.cert, pki.key), ()), required=True)

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
        if self.hub is None:
            pair = trio.testing.lockstep_stream_pair if lockstep else \
                trio.testing.memory_stream_pair
            client_end, server_end = pair()
            done = self.serve_stream(server_end, trusted=trusted)
            if TRANSPORT == "tls":
                return UpgradingStream(client_end, client_context(_Pki.get().ca)), done
            return client_end, done
        assert self.nursery is not None
        hub = self.hub
        mine, theirs = socket.socketpair()
        done = trio.Event()

        async def serve() -> None:
            try:
                await hub.serve_socket(theirs, trusted=trusted)
            finally:
                done.set()

        self.nursery.start_soon(serve)
        return trio.SocketStream(trio.socket.from_stdlib_socket(mine)), done

    @asynccontextmanager
    async def connect(self, *, trusted: bool = True, lockstep: bool = False,
                      max_inflight: int = 1024) -> AsyncIterator[BookieClient]:
        """A client over a fresh in-memory connection to this bookie."""
        client_end, _ = self._pair(trusted=trusted, lockstep=lockstep)
        client = BookieClient("memory", client_end,  # type: ignore[arg-type]
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


@asynccontextmanager
async def running_bookie(tmp: Path, *, options: ConnectionOptions | None = None,
                         journal: JournalOptions | None = None,
                         admin_secret: str = "", **storage_kw: Any) -> AsyncIterator[BookieHarness]:
    opts = StorageOptions(journal_dir=tmp / "journal", ledger_dirs=(tmp / "ledgers",),
                          journal=journal or JournalOptions(), **storage_kw)
    storage = LedgerStorage(opts)
    await storage.open()
    harness = BookieHarness(storage, options or ConnectionOptions(), admin_secret)
    async with trio.open_nursery() as nursery:
        harness.nursery = nursery
        await nursery.start(storage.run)
        if TRANSPORT == "hub":
            harness.hub = ConnectionHub(harness.handler, harness.options)
            await nursery.start(harness.hub.run)
        try:
            yield harness
        finally:
            nursery.cancel_scope.cancel()
    await storage.close()


def small_journal(max_memory_bytes: int) -> JournalOptions:
    return replace(JournalOptions(), max_memory_bytes=max_memory_bytes)
