"""The per-connection transport: trio streams (and TLS), a task pair per connection.

The connection's rules live in its sans-IO ``BookieSession`` (``appliance.session``):
framing limits, authentication and authorization, backpressure, what closes it. A
reader task feeds the session what the stream brings and does what it says: stores the
runs of adds it hands out (their replies queued behind the journal group that makes
them durable), answers plain reads at once, and runs anything that waits in a task of
its own. A writer task sends what is owed in one ``send_all`` per pass, after waiting
for the groups it needs, so a whole burst of pipelined adds costs one wake-up and one
write. The connection hub (``appliance.hub``) serves plain sockets over the same
sessions; this transport serves TLS, authorization and streams that are not sockets.
"""

from __future__ import annotations

import ipaddress
import logging
import time

import trio

from ledgerd.appliance.handlers import RequestHandler
from ledgerd.appliance.replies import replies_in
from ledgerd.appliance.security import ConnectionSecurity, negotiate
from ledgerd.appliance.session import (
    CLOSE_GRACE_S,
    NEED_DATA,
    PAUSE,
    BookieSession,
    Close,
    ConnectionOptions,
    Guard,
)
from ledgerd.base.logs import fields
from ledgerd.base.tls import receive_available
from ledgerd.disk.journal import JournalGroup
from ledgerd.wire.connection import AddRun, ServerConnection
from ledgerd.wire.frames import DecodedRequest

__all__ = ["ConnectionOptions", "is_loopback", "peer_name", "serve_connection"]

log = logging.getLogger(__name__)


def is_loopback(stream: trio.abc.Stream) -> bool:
    """True for a TCP peer on a loopback address (or a non-socket test stream)."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return True
    try:
        host = sock.getpeername()[0]
        return ipaddress.ip_address(host).is_loopback
    except (OSError, ValueError):
        return False


class _Outbox:
    """The writer's side of a session's replies owed: wake-ups, and the replies being
    sent."""

    __slots__ = ("closing", "more", "session", "space", "unsent", "waiting_on")

    def __init__(self, session: BookieSession) -> None:
        self.session = session
        self.more = trio.Event()
        self.space = trio.Event()
        self.closing = False
        # Replies encoded (so no longer in ``conn.inflight``) but still being sent: they
        # count toward max_inflight until the peer has taken them.
        self.unsent = 0
        self.waiting_on: JournalGroup | None = None  # the group that will wake the writer

    def wake(self) -> None:
        self.waiting_on = None
        self.more.set()

    def wake_when_ready(self) -> None:
        """Wake the writer once the newest queued reply can go: at once, or when its
        journal group is durable (the group calls back), so the writer task wakes once
        per batch of adds instead of once to find them and again for their group."""
        group = self.session.items[-1].group
        if group is None or group.done.is_set():
            self.more.set()
        elif self.waiting_on is not group:
            self.waiting_on = group
            group.call_when_done(self.wake)


def peer_name(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("memory", 0)
    except OSError:
        return "unknown"
    return f"{host}:{port}"


async def serve_connection(stream: trio.abc.Stream, handler: RequestHandler,
                           options: ConnectionOptions, *, trusted: bool | None = None,
                           reader_scope: trio.CancelScope | None = None,
                           security: ConnectionSecurity | None = None) -> None:
    """Serve one connection until the peer closes it or breaks the protocol.

    Cancelling ``reader_scope`` stops reading requests; replies to those already read
    still go out (the bookie's drain on shutdown). With ``security``, TLS is settled
    first (START_TLS, or TLS_REQUIRED) and, with authorization on, every request is
    checked against the principal's roles.
    """
    conn = ServerConnection(max_frame_bytes=options.max_frame_bytes,
                            max_inflight=options.max_inflight)
    if trusted is None:
        trusted = is_loopback(stream)  # the socket's peer, before any TLS wrapping
    metrics = handler.metrics
    metrics.connections_opened += 1
    guard: Guard | None = None
    first = None
    try:
        if security is not None:
            principal = security.anonymous
            peer = peer_name(stream)  # the socket's, before any TLS wrapping
            if security.active:
                got = await negotiate(stream, conn, security, metrics, peer)
                stream = got.stream
                if got.closed:
                    return
                principal, first = got.principal, got.first
            guard = Guard(principal, peer, metrics, security)
        session = BookieSession(options, trusted=trusted, guard=guard, conn=conn, first=first)
        session.started = time.perf_counter()
        outbox = _Outbox(session)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_writer, stream, outbox, handler, nursery.cancel_scope)
            with reader_scope or trio.CancelScope():
                await _reader(stream, session, outbox, handler, nursery,
                              options.idle_timeout)
            outbox.closing = True
            outbox.more.set()
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


async def _reader(stream: trio.abc.Stream, session: BookieSession, outbox: _Outbox,
                  handler: RequestHandler, nursery: trio.Nursery,
                  idle_timeout: float) -> None:
    """Feed the session what the stream brings and do what it says, until it closes."""
    store = handler.store
    read_now = handler.read_now
    conn = session.conn
    tls = isinstance(stream, trio.SSLStream)
    while True:
        ev = session.next_event(outbox.unsent)
        if type(ev) is AddRun:
            session.put_adds(ev, store([ev])[0], session.started)
            continue
        if type(ev) is DecodedRequest:
            reply = read_now(ev.message)
            if reply is not None:
                session.put(ev.correlation_id, ev.api_key, reply[0], reply[1], session.started)
                outbox.more.set()
                continue
            nursery.start_soon(_slow, handler, outbox, ev, session.trusted)
            continue
        if ev is NEED_DATA:
            if session.items:
                outbox.wake_when_ready()
            idle = idle_timeout if idle_timeout and not conn.inflight else float("inf")
            try:
                with trio.move_on_after(idle) as waited:
                    data = await receive_available(stream, tls=tls)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if waited.cancelled_caught:
                handler.metrics.connections_idle_closed += 1
                log.info("connection_idle_closed", extra=fields(idle_s=idle_timeout))
                return
            session.receive_data(data, time.perf_counter())
            continue
        if ev is PAUSE:
            # Stop taking requests (frames already read wait in the session) until the
            # writer sends replies: a peer that does not read stalls only itself.
            outbox.more.set()
            while session.is_full(outbox.unsent):
                outbox.space = trio.Event()
                await outbox.space.wait()
            continue
        assert type(ev) is Close, ev
        return  # the peer ended, or broke the protocol


async def _slow(handler: RequestHandler, outbox: _Outbox, ev: DecodedRequest,
                trusted: bool) -> None:
    status, resp = await handler.handle(ev.message, trusted=trusted)
    outbox.session.put(ev.correlation_id, ev.api_key, status, resp, 0.0)
    outbox.more.set()


async def _writer(stream: trio.abc.Stream, outbox: _Outbox, handler: RequestHandler,
                  scope: trio.CancelScope) -> None:
    metrics = handler.metrics
    session = outbox.session
    conn = session.conn
    while True:
        if not session.items:
            if outbox.closing and not conn.inflight:
                scope.cancel()
                return
            outbox.more = trio.Event()
            # A closing connection waits a bounded time for its slow requests.
            with trio.move_on_after(CLOSE_GRACE_S if outbox.closing else float("inf")):
                await outbox.more.wait()
                continue
            scope.cancel()
            return
        items, session.items = session.items, []
        # Groups complete in order; wait for each distinct one (most are already done).
        last: JournalGroup | None = None
        for item in items:
            group = item.group
            if group is not None and group is not last:
                if not group.done.is_set():
                    await group.done.wait()
                last = group
        data, sent_bytes = session.encode(metrics, items)
        outbox.unsent = replies_in(items)
        del items  # the replies' entries are in ``data`` now
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()  # the peer is gone; what it sent is stored all the same
            return
        outbox.unsent = 0
        session.replies_sent(sent_bytes)
        outbox.space.set()
        if outbox.closing and not session.items and not conn.inflight:
            scope.cancel()
            return
