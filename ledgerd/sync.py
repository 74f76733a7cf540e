"""A synchronous facade over the trio client, for scripts and Spark executors.

``SyncClient`` runs the trio client in a thread of its own (no asyncio anywhere) and
carries each call over with ``trio.from_thread``; handles mirror the async ones::

    with ledgerd.SyncClient("127.0.0.1:2181") as client:
        lh = client.create_ledger(3, 2, 2, password=b"pw")
        lh.append(b"hello")
        lh.close()
        for entry in client.open_ledger(lh.ledger_id, password=b"pw").read():
            print(entry.payload)

Logs are ``client.logs`` as on the async client (``SyncLogs``). Calls are thread-safe
(each runs on the client's trio thread). ``close()`` (or leaving the ``with`` block)
stops the thread and the client's connections.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

import trio

from ledgerd.base.logs import fields
from ledgerd.client import Client, open_client
from ledgerd.errors import ClientClosedError, LedgerClosedError
from ledgerd.handles import PendingAppend, ReadHandle, WriteHandle
from ledgerd.ledgerlog import (
    LogCursor,
    LogEntry,
    LogPosition,
    LogSegment,
    LogWriter,
    Start,
    log_segments,
)
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.logheader import first_log_entry
from ledgerd.wire.entry import Entry

__all__ = ["SyncClient", "SyncLogWriter", "SyncLogs", "SyncReadHandle", "SyncWriteHandle"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_WINDOW = 256


class SyncClient:
    def __init__(self, zk_servers: str | None = None, **settings: Any) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._client: Client | None = None
        self.logs = SyncLogs(self)
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
            self._error = exc
            if not self._ready.is_set():
                self._ready.set()
                return
            if not isinstance(exc, Exception):
                raise
            # The client failed under a live facade (e.g. its ZooKeeper session or the
            # cluster's nodes went away): later calls raise ClientClosedError naming it.
            log.warning("sync_client_failed", extra=fields(error=f"{type(exc).__name__}: {exc}"))

    def _run(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        if self.closed:
            cause = f": it failed with {self._error!r}" if self._error is not None else ""
            raise ClientClosedError(f"the SyncClient is closed{cause}")

        async def call() -> T:
            return await fn(*args, **kwargs)

        return trio.from_thread.run(call, trio_token=self._token)

    def _submit(self, fn: Callable[..., Awaitable[T]], *args: Any) -> Future[T]:
        """Start ``fn`` on the client's thread and return at once (read-ahead)."""
        future: Future[T] = Future()

        async def call() -> None:
            try:
                future.set_result(await fn(*args))
            except Exception as exc:
                future.set_exception(exc)
            except BaseException:
                future.set_exception(ClientClosedError("the client closed during the call"))
                raise

        self._run(self._spawn, call)
        return future

    async def _spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        self.client.nursery.start_soon(fn)

    @property
    def closed(self) -> bool:
        return self._stop is None or self._stop.is_set() or not self._thread.is_alive()

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``await fn(*args, **kwargs)`` on the client's trio thread (for tools that
        use the async client's parts, e.g. the audit's per-bookie reads)."""
        return self._run(fn, *args, **kwargs)

    @property
    def client(self) -> Client:
        assert self._client is not None
        return self._client

    def metrics_collector(self) -> Any:
        """The client's Prometheus collector (see ``Client.metrics_collector``)."""
        return self.client.metrics_collector()

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


class SyncLogs:
    """``Client.logs`` for threads (``SyncClient.logs``): the same calls, blocking;
    ``open_writer`` gives a ``SyncLogWriter``, ``read`` and ``follow`` plain iterators."""

    def __init__(self, client: SyncClient) -> None:
        self._client = client

    def open_writer(self, name: str, ensemble_size: int | None = None,
                    write_quorum: int | None = None, ack_quorum: int | None = None,
                    **kwargs: Any) -> SyncLogWriter:
        writer = self._client._run(self._client.client.logs.open_writer, name, ensemble_size,
                                   write_quorum, ack_quorum, **kwargs)
        return SyncLogWriter(self._client, writer)

    def ledgers(self, name: str) -> tuple[int, ...]:
        return self._client._run(self._client.client.logs.ledgers, name)

    def names(self) -> list[str]:
        return self._client._run(self._client.client.logs.names)

    def append_ledgers(self, name: str, ledger_ids: list[int], **kwargs: Any
                       ) -> tuple[int, ...]:
        return self._client._run(self._client.client.logs.append_ledgers, name, ledger_ids,
                                 **kwargs)

    def truncate(self, name: str, before_ledger: int) -> list[int]:
        return self._client._run(self._client.client.logs.truncate, name, before_ledger)

    def truncate_before(self, name: str, offset: int) -> dict[str, int]:
        return self._client._run(self._client.client.logs.truncate_before, name, offset)

    def delete(self, name: str, *, delete_ledgers: bool = True) -> None:
        self._client._run(self._client.client.logs.delete, name,
                          delete_ledgers=delete_ledgers)

    def layout(self, name: str) -> list[LogSegment]:
        return self._client._run(self._client.client.logs.layout, name)

    def read(self, name: str, password: bytes | str = b"", *,
             start: LogPosition | None = None) -> Iterator[Entry]:
        """The log's entries in order (closed ledgers to their end, an open one to its
        LAC), from ``start`` inclusive; nothing is fenced."""
        for lid, first in log_segments(name, self.ledgers(name), start):
            rh = self._client.open_ledger(lid, password, recovery=False)
            first = max(first, first_log_entry(rh.metadata.custom_metadata))  # its header
            last = rh.last_add_confirmed if rh.metadata.is_closed else rh.read_lac()
            if first <= last:
                yield from rh.read(first, last)

    def follow(self, name: str, password: bytes | str = b"", *,
               start: Start | LogCursor = "start", poll_s: float = 1.0) -> Iterator[LogEntry]:
        """``Logs.follow`` as a plain iterator: every entry from ``start`` on, then new
        ones as they are acknowledged (blocks between them; break out to stop)."""
        client = self._client
        gen = client.client.logs.follow(name, password, start=start, poll_s=poll_s)
        try:
            while True:
                try:
                    yield client._run(gen.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            if not client.closed:
                client._run(gen.aclose)

    def open_cursor(self, name: str, cursor: str) -> LogCursor:
        """The named cursor; commit with ``client.call(cursor.commit, entry)``."""
        return self._client._run(self._client.client.logs.open_cursor, name, cursor)


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

    def read(self, first: int = 0, last: int | None = None, *,
             window: int = _WINDOW) -> Iterator[Entry]:
        """Entries ``first..last`` (default: to the LAC), ``window`` at a time, the next
        window already being fetched while this one is consumed."""
        last = self._handle._bounds(first, last)
        starts = range(first, last + 1, max(1, window))
        pending: Future[list[Entry]] | None = None
        for i, start in enumerate(starts):
            if pending is None:
                pending = self._client._submit(self._handle.read_batch, start,
                                               min(last, start + window - 1))
            ahead = (self._client._submit(self._handle.read_batch, starts[i + 1],
                                          min(last, starts[i + 1] + window - 1))
                     if i + 1 < len(starts) else None)
            yield from pending.result()
            pending = ahead

    def close(self) -> None:
        self._client._run(self._handle.close)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncWriteHandle(_SyncHandle):
    _handle: WriteHandle

    # Submits handed to the client's thread and not yet sent: the caller blocks past this
    # many (the handle's own outstanding cap then applies on the client's side).
    SUBMIT_QUEUE = 4096

    def __init__(self, client: SyncClient, handle: WriteHandle) -> None:
        super().__init__(client, handle)
        self._room = threading.BoundedSemaphore(self.SUBMIT_QUEUE)
        self._pending: collections.deque[tuple[bytes, Future[int]] | None] = \
            collections.deque()
        self._pump_waiting = False  # the pump sleeps: the next submit must wake it
        self._pump_kick: trio.Event | None = None
        self._pump_done: trio.Event | None = None

    def append(self, data: bytes) -> int:
        return self._client._run(self._handle.append, data)

    def append_many(self, items: Iterable[bytes]) -> list[int]:
        return self._client._run(self._handle.append_many, list(items))

    def submit(self, data: bytes) -> Future[int]:
        """Send one entry without waiting: a ``concurrent.futures.Future`` of its entry
        id, done once it is durable on its ack quorum (or failed: MessageTooLargeError,
        the handle's error). Submits pipeline, in order, where ``append`` waits for each
        entry in turn::

            futures = [lh.submit(b"event %d" % i) for i in range(10_000)]
            ids = [f.result() for f in futures]

        Entries go to the client's thread through a queue of ``SUBMIT_QUEUE`` entries
        (the caller blocks when it is full); one task there sends them in order and is
        woken only when it has run dry, so submits pay a thread hand-off per batch, not
        per entry."""
        if self._pump_done is not None and self._pump_done.is_set():
            raise LedgerClosedError(self.ledger_id, "handle is closed")
        self._handle._check_usable()  # a closed or failed handle raises here, at once
        if self._pump_done is None:
            self._client._run(self._start_pump)
        future: Future[int] = Future()
        self._room.acquire()
        self._pending.append((data, future))
        if self._pump_waiting:
            self._pump_waiting = False
            self._wake_pump()
        return future

    def _wake_pump(self) -> None:
        token = self._client._token
        kick = self._pump_kick
        assert token is not None and kick is not None
        try:
            token.run_sync_soon(kick.set)
        except trio.RunFinishedError:
            raise ClientClosedError("the SyncClient is closed") from None

    async def _start_pump(self) -> None:
        if self._pump_done is None:
            self._pump_kick = trio.Event()
            self._pump_done = trio.Event()
            self._client.client.nursery.start_soon(self._pump)

    async def _pump(self) -> None:
        """Send queued entries in order; each future settles when its entry does."""
        def settle(future: Future[int], p: PendingAppend) -> None:
            if p.error is not None:
                future.set_exception(p.error)
            else:
                future.set_result(p.entry_id)

        pending = self._pending
        try:
            while True:
                if not pending:
                    # Say we sleep, then look again: a submit that came in between
                    # either is seen here or sees the flag and wakes us.
                    self._pump_waiting = True
                    if not pending:
                        assert self._pump_kick is not None
                        await self._pump_kick.wait()
                        self._pump_kick = trio.Event()
                    self._pump_waiting = False
                    continue
                item = pending.popleft()
                if item is None:
                    return
                data, future = item
                try:
                    p = await self._handle.submit(data)
                except Exception as exc:
                    future.set_exception(exc)
                else:
                    p.on_done(partial(settle, future))
                finally:
                    self._room.release()
        finally:
            assert self._pump_done is not None
            self._pump_done.set()

    async def _close_pump(self) -> None:
        """Send what is queued, then end the pump (before the handle closes)."""
        if self._pump_done is not None and not self._pump_done.is_set():
            assert self._pump_kick is not None
            self._pending.append(None)
            self._pump_kick.set()
            await self._pump_done.wait()

    def close(self) -> None:
        self._client._run(self._close_pump)
        super().close()


class SyncLogWriter:
    """``LogWriter`` for threads: positions are ``LogPosition(ledger_id, entry_id)``."""

    def __init__(self, client: SyncClient, writer: LogWriter) -> None:
        self._client = client
        self._writer = writer

    @property
    def ledger_id(self) -> int:
        return self._writer.ledger_id

    def append(self, data: bytes) -> LogPosition:
        return self._client._run(self._writer.append, data)

    def append_many(self, items: Iterable[bytes]) -> list[LogPosition]:
        return self._client._run(self._writer.append_many, list(items))

    def roll(self) -> None:
        self._client._run(self._writer.roll)

    def close(self) -> None:
        self._client._run(self._writer.close)

    def __enter__(self) -> SyncLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncReadHandle(_SyncHandle):
    _handle: ReadHandle

    def read_lac(self) -> int:
        return self._client._run(self._handle.read_lac)

    def wait_lac_beyond(self, entry_id: int, timeout: float = 10.0) -> int:
        return self._client._run(self._handle.wait_lac_beyond, entry_id, timeout)

    def refresh(self) -> LedgerMetadata:
        return self._client._run(self._handle.refresh)
