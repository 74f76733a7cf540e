"""A synchronous facade over the trio client, for scripts and Spark executors.

``SyncClient`` runs the trio client in a thread of its own (no asyncio anywhere) and
carries each call over with ``trio.from_thread``; handles mirror the async ones::

    with ledgerd.SyncClient("127.0.0.1:2181") as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"hello")
        lh.close()
        for entry in client.open_ledger(lh.ledger_id, password=b"pw").read():
            print(entry.payload)

Calls are thread-safe (each runs on the client's trio thread). ``close()`` (or leaving
the ``with`` block) stops the thread and the client's connections.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

import trio

from ledgerd.client import Client, open_client
from ledgerd.handles import ReadHandle, WriteHandle
from metadata.ledger import LedgerMetadata
from wire.entry import Entry

__all__ = ["SyncClient", "SyncReadHandle", "SyncWriteHandle"]

T = TypeVar("T")
_WINDOW = 256


class SyncClient:
    def __init__(self, zk_servers: str | None = None, **settings: Any) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._client: Client | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main, zk_servers, settings),
                                        name="ledgerd-client", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    async def _main(self, zk_servers: str | None, settings: dict[str, Any]) -> None:
        try:
            async with open_client(zk_servers, **settings) as client:
                self._client = client
                self._token = trio.lowlevel.current_trio_token()
                self._stop = trio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
                return
            raise

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self._token is None or self._stop is None or self._stop.is_set():
            raise RuntimeError("SyncClient is closed")

        async def call() -> T:
            return await fn(*args, **kwargs)

        return trio.from_thread.run(call, trio_token=self._token)

    @property
    def client(self) -> Client:
        assert self._client is not None
        return self._client

    def create_ledger(self, ensemble_size: int | None = None, write_quorum: int | None = None,
                      ack_quorum: int | None = None, **kwargs: Any) -> SyncWriteHandle:
        lh = self._run(self.client.create_ledger, ensemble_size, write_quorum, ack_quorum,
                       **kwargs)
        return SyncWriteHandle(self, lh)

    def open_ledger(self, ledger_id: int, password: bytes | str = b"", *,
                    recovery: bool = True) -> SyncReadHandle:
        rh = self._run(self.client.open_ledger, ledger_id, password, recovery=recovery)
        return SyncReadHandle(self, rh)

    def delete_ledger(self, ledger_id: int) -> None:
        self._run(self.client.delete_ledger, ledger_id)

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._run(self.client.ledger_metadata, ledger_id)

    def list_ledgers(self) -> list[int]:
        async def collect() -> list[int]:
            return [lid async for lid in self.client.list_ledgers()]
        return self._run(collect)

    def close(self) -> None:
        if self._token is not None and self._stop is not None and not self._stop.is_set():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SyncHandle:
    def __init__(self, client: SyncClient, handle: WriteHandle | ReadHandle) -> None:
        self._client = client
        self._handle = handle

    @property
    def ledger_id(self) -> int:
        return self._handle.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._handle.last_add_confirmed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._handle.metadata

    def read(self, first: int = 0, last: int | None = None) -> Iterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), fetched 256 at a time."""
        last = self._handle._bounds(first, last)
        for start in range(first, last + 1, _WINDOW):
            yield from self._client._run(self._handle.read_batch, start,
                                         min(last, start + _WINDOW - 1))

    def close(self) -> None:
        self._client._run(self._handle.close)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncWriteHandle(_SyncHandle):
    _handle: WriteHandle

    def append(self, data: bytes) -> int:
        return self._client._run(self._handle.append, data)

    def append_many(self, items: Iterable[bytes]) -> list[int]:
        return self._client._run(self._handle.append_many, list(items))


class SyncReadHandle(_SyncHandle):
    _handle: ReadHandle

    def read_lac(self) -> int:
        return self._client._run(self._handle.read_lac)

    def wait_lac_beyond(self, entry_id: int, timeout: float = 10.0) -> int:
        return self._client._run(self._handle.wait_lac_beyond, entry_id, timeout)

    def refresh(self) -> LedgerMetadata:
        return self._client._run(self._handle.refresh)
