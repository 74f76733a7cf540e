"""A bookie's request path over in-memory streams, for handler tests.

``BookieHarness`` (``ledgerd.testing.memory``'s, over the transport a handler test
chooses) opens a real LedgerStorage in a temp directory, runs its services, and serves
connections made with ``connect()`` (a memory stream pair, or a lockstep pair when a
test needs to see backpressure) through the real ``serve_connection``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import ledgerd.testing.memory as testing_memory
from ledgerd.appliance.core import BookieCore
from ledgerd.appliance.hub import ConnectionHub
from ledgerd.appliance.security import ConnectionSecurity
from ledgerd.appliance.server import ConnectionOptions
from ledgerd.base.tls import ReloadingContext, client_context, server_context
from ledgerd.bookie_client import start_tls
from ledgerd.disk.errors import StorageError
from ledgerd.disk.journal import JournalOptions
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.wire.connection import ClientConnection
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key

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


class BookieHarness(testing_memory.BookieHarness):
    """``ledgerd.testing.memory.BookieHarness`` over the transport ``TRANSPORT`` names."""

    def __init__(self, storage: LedgerStorage, options: ConnectionOptions,
                 admin_secret: str = "", core: BookieCore | None = None) -> None:
        super().__init__(storage, options, admin_secret, core)
        self.hub: ConnectionHub | None = None

    def server_security(self) -> ConnectionSecurity | None:
        if TRANSPORT == "tls":
            pki = _Pki.get()
            return ConnectionSecurity(ReloadingContext(
                lambda: server_context(pki.cert, pki.key), ()), required=True)
        return self.security

    def _pair(self, *, trusted: bool, lockstep: bool = False
              ) -> tuple[trio.abc.Stream, trio.Event]:
        """A client end and the event that fires when the server side is over."""
        if self.hub is None:
            client_end, done = super()._pair(trusted=trusted, lockstep=lockstep)
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
async def running_bookie(tmp: Path, *, options: ConnectionOptions | None = None,
                         journal: JournalOptions | None = None,
                         admin_secret: str = "", storage_may_fail: bool = False,
                         **storage_kw: Any) -> AsyncIterator[BookieHarness]:
    """A bookie over ``TRANSPORT`` on real storage. ``storage_may_fail``: a storage
    failure (a journal write fault) leaves the connections served, as the bookie's
    supervisor does (it goes read-only), instead of ending the harness."""
    opts = StorageOptions(journal_dir=tmp / "journal", ledger_dirs=(tmp / "ledgers",),
                          journal=journal or JournalOptions(), **storage_kw)
    storage = LedgerStorage(opts)
    await storage.open()
    harness = BookieHarness(storage, options or ConnectionOptions(), admin_secret)
    async with trio.open_nursery() as nursery:
        harness.nursery = nursery
        if storage_may_fail:
            async def run_storage(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                                  ) -> None:
                try:
                    await storage.run(task_status=task_status)
                except* StorageError:
                    pass

            await nursery.start(run_storage)
        else:
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


def gate_collection(journal: Any, monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """The journal collects no finished group until the returned event is set (its
    syncer still writes, syncs and sends the replies it was handed)."""
    gate = trio.Event()
    collect = journal._collect_oldest

    async def gated_collect() -> None:
        await gate.wait()
        await collect()

    monkeypatch.setattr(journal, "_collect_oldest", gated_collect)
    return gate
