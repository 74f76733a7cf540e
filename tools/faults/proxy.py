"""A userspace TCP fault proxy on loopback: one listening port per link.

Every byte between two processes of the fault harness passes through a ``Link`` (one
per pair: client → bookie, bookie → ZooKeeper, client → ZooKeeper). A link can be

- partitioned: nothing is delivered either way and new connections hang before they
  reach the target (a black hole, as when packets are dropped; TCP's own timers and
  the peers' timeouts decide what breaks); healing delivers what was held;
- slowed: a fixed latency per chunk and a byte-rate cap;
- reset: every open connection sends part of its next chunk (a frame cut mid-way) and
  is then aborted with RST on both sides.

What a link holds is bounded: each direction of a connection queues at most
``QUEUE_CHUNKS`` chunks of at most ``CHUNK`` bytes before it stops reading (TCP
backpressure reaches the sender).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import trio

__all__ = ["CHUNK", "QUEUE_CHUNKS", "FaultProxy", "Link"]

CHUNK = 64 * 1024
QUEUE_CHUNKS = 16
RESET_GRACE_S = 0.5   # a reset connection with no traffic is aborted after this


def _abort(stream: trio.SocketStream) -> None:
    """Close with RST (SO_LINGER 0), not FIN."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    stream.socket.close()


@dataclass(eq=False)
class _Conn:
    client: trio.SocketStream
    upstream: trio.SocketStream | None = None
    reset: trio.Event = field(default_factory=trio.Event)
    done: bool = False

    def abort(self) -> None:
        if self.done:
            return
        self.done = True
        _abort(self.client)
        if self.upstream is not None:
            _abort(self.upstream)


@dataclass(eq=False)
class Link:
    name: str
    target: tuple[str, int]
    port: int = 0
    latency_s: float = 0.0
    rate_bytes_per_s: float | None = None
    conns: set[_Conn] = field(default_factory=set)
    accepted: int = 0
    resets: int = 0
    _open: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self._open.set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def partitioned(self) -> bool:
        return not self._open.is_set()

    def partition(self) -> None:
        if self._open.is_set():
            self._open = trio.Event()

    def heal(self) -> None:
        self._open.set()
        self.latency_s = 0.0
        self.rate_bytes_per_s = None

    def slow(self, latency_s: float = 0.0, rate_bytes_per_s: float | None = None) -> None:
        self.latency_s = latency_s
        self.rate_bytes_per_s = rate_bytes_per_s

    def reset_connections(self) -> int:
        """Cut every open connection mid-frame; returns how many."""
        n = 0
        for conn in list(self.conns):
            if not conn.done:
                conn.reset.set()
                n += 1
        self.resets += n
        return n

    async def wait_open(self) -> None:
        while not self._open.is_set():
            await self._open.wait()

    # -- forwarding -----------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        conn = _Conn(client)
        self.conns.add(conn)
        self.accepted += 1
        try:
            await self.wait_open()
            try:
                conn.upstream = await trio.open_tcp_stream(*self.target)
            except OSError:
                conn.abort()
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reset_watch, conn, nursery)
                async with trio.open_nursery() as pair:
                    pair.start_soon(self._direction, conn, client, conn.upstream, nursery)
                    pair.start_soon(self._direction, conn, conn.upstream, client, nursery)
                nursery.cancel_scope.cancel()
        finally:
            self.conns.discard(conn)
            conn.abort()

    async def _reset_watch(self, conn: _Conn, nursery: trio.Nursery) -> None:
        await conn.reset.wait()
        await trio.sleep(RESET_GRACE_S)
        conn.abort()
        nursery.cancel_scope.cancel()

    async def _direction(self, conn: _Conn, src: trio.SocketStream, dst: trio.SocketStream,
                         nursery: trio.Nursery) -> None:
        send, recv = trio.open_memory_channel[tuple[float, bytes]](QUEUE_CHUNKS)

        async def reader() -> None:
            async with send:
                while True:
                    try:
                        chunk = await src.receive_some(CHUNK)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        conn.abort()  # reset by the peer: pass the reset on
                        nursery.cancel_scope.cancel()
                        return
                    if not chunk:
                        break
                    await send.send((trio.current_time(), chunk))

        async def writer() -> None:
            async with recv:
                async for at, chunk in recv:
                    await self.wait_open()
                    if self.latency_s:
                        await trio.sleep_until(at + self.latency_s)
                    if conn.reset.is_set():
                        cut = max(1, len(chunk) // 2) if len(chunk) > 1 else 0
                        try:
                            if cut:
                                await dst.send_all(chunk[:cut])
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
                        conn.abort()
                        nursery.cancel_scope.cancel()
                        return
                    try:
                        await dst.send_all(chunk)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        conn.abort()  # one side is gone: so is the connection
                        nursery.cancel_scope.cancel()
                        return
                    if self.rate_bytes_per_s:
                        await trio.sleep(len(chunk) / self.rate_bytes_per_s)
            # The source closed: pass the half-close on, the other direction goes on.
            try:
                await dst.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

        async with trio.open_nursery() as inner:
            inner.start_soon(reader)
            inner.start_soon(writer)


class FaultProxy:
    """The links of one harness, served in ``nursery``."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.links: dict[str, Link] = {}

    async def link(self, name: str, target: str) -> Link:
        host, _, port = target.rpartition(":")
        link = Link(name, (host, int(port)))
        await self.nursery.start(link.serve)
        self.links[name] = link
        return link

    def heal_all(self) -> None:
        for link in self.links.values():
            link.heal()
