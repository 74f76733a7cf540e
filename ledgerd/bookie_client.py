"""One pipelined connection to a bookie, over trio.

``call_many`` writes a whole batch of requests in one ``send_all`` and waits for all
their replies (each reply wakes nothing but a counter; the batch wakes once), so a
caller that has many requests pays one hand-off per batch rather than per request.
``call`` is a batch of one. Replies come back as ``(status, response)``; turning a
status into an exception is the caller's choice (``wire.status.error_for_status``).

If the connection ends or the bookie breaks the protocol, every waiting call raises
``BookieConnectionError`` and the client is closed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from ledgerd.logs import fields
from wire.connection import (
    NEED_DATA,
    ClientConnection,
    ConnectionEnded,
    ResponseReceived,
)
from wire.errors import WireError
from wire.messages import ApiVersionsRequest, Message

__all__ = ["BookieClient", "BookieConnectionError", "open_bookie_client", "parse_address"]

log = logging.getLogger(__name__)
Reply = tuple[int, Message | None]


class BookieConnectionError(ConnectionError):
    """The connection to a bookie failed or ended before a reply came."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"bookie {address}: {reason}")
        self.address = address
        self.reason = reason


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:3181``) -> (host, port); ValueError names the input."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bookie address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class _Batch:
    __slots__ = ("done", "remaining", "replies")

    def __init__(self, n: int) -> None:
        self.replies: list[Reply | None] = [None] * n
        self.remaining = n
        self.done = trio.Event()


class BookieClient:
    def __init__(self, address: str, stream: trio.SocketStream, conn: ClientConnection) -> None:
        self.address = address
        self.stream = stream
        self.conn = conn
        self._waiting: dict[int, tuple[_Batch, int]] = {}
        self._send_lock = trio.Lock()
        self._space = trio.Event()
        self.error: BookieConnectionError | None = None

    @property
    def closed(self) -> bool:
        return self.error is not None

    async def call(self, message: Message) -> Reply:
        reply = (await self.call_many([message]))[0]
        return reply

    async def call_many(self, messages: Sequence[Message]) -> list[Reply]:
        """Send every message pipelined; their replies in the same order."""
        limit = self.conn.max_inflight
        if len(messages) > limit:
            out: list[Reply] = []
            for i in range(0, len(messages), limit):
                out += await self.call_many(messages[i: i + limit])
            return out
        while self.error is None and self.conn.inflight + len(messages) > limit:
            self._space = trio.Event()
            await self._space.wait()
        if self.error is not None:
            raise self.error
        batch = _Batch(len(messages))
        cids = []
        chunks = []
        for i, msg in enumerate(messages):
            cid = self.conn.next_correlation_id
            chunks.append(self.conn.send(msg))
            self._waiting[cid] = (batch, i)
            cids.append(cid)
        try:
            async with self._send_lock:
                try:
                    await self.stream.send_all(b"".join(chunks))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._fail(f"send failed: {exc}")
            await batch.done.wait()
        finally:
            for cid in cids:
                self._waiting.pop(cid, None)
        if self.error is not None and batch.remaining:
            raise self.error
        return [r for r in batch.replies if r is not None]

    async def _read_loop(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        conn = self.conn
        waiting = self._waiting
        while True:
            try:
                data = await self.stream.receive_some(256 * 1024)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(f"receive failed: {exc}")
                return
            try:
                conn.receive_data(data)
                while True:
                    ev = conn.next_event()
                    if ev is NEED_DATA:
                        break
                    if isinstance(ev, ResponseReceived):
                        slot = waiting.pop(ev.correlation_id, None)
                        if slot is not None:
                            batch, i = slot
                            batch.replies[i] = (ev.status, ev.response)
                            batch.remaining -= 1
                            if not batch.remaining:
                                batch.done.set()
                        continue
                    if isinstance(ev, ConnectionEnded):
                        self._fail("connection closed by the bookie")
                        return
            except WireError as exc:
                self._fail(f"protocol error: {exc}")
                return
            if not self._space.is_set() and conn.inflight < conn.max_inflight:
                self._space.set()

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = BookieConnectionError(self.address, reason)
            log.info("bookie_connection_lost", extra=fields(bookie=self.address, reason=reason))
        for batch, _i in list(self._waiting.values()):
            batch.done.set()
        self._waiting.clear()
        self._space.set()


@asynccontextmanager
async def open_bookie_client(address: str, *, connect_timeout: float = 10.0,
                             max_inflight: int = 1024, max_frame_bytes: int = 8 << 20,
                             negotiate: bool = True) -> AsyncIterator[BookieClient]:
    """Connect to ``host:port``; with ``negotiate``, exchange ApiVersions first."""
    host, port = parse_address(address)
    try:
        with trio.fail_after(connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
    except (OSError, trio.TooSlowError) as exc:
        raise BookieConnectionError(address, f"connect failed: {exc!r}") from exc
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = BookieClient(address, stream, ClientConnection(max_frame_bytes=max_frame_bytes,
                                                            max_inflight=max_inflight))
    async with stream, trio.open_nursery() as nursery:
        await nursery.start(client._read_loop)
        if negotiate:
            await client.call(ApiVersionsRequest())
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()
