"""The listener: one task pair per connection, requests pipelined, replies by correlation id.

Per connection, a reader task feeds bytes to the sans-IO ``ServerConnection`` and handles
every complete frame of what it read before reading again. Adds are stored at once and
their replies queued behind the journal group that makes them durable; plain reads are
answered at once; anything that waits runs in a task of its own. A writer task sends
what is queued in one ``send_all`` per pass, after waiting for the groups it needs, so
a whole burst of pipelined adds costs one wake-up and one write.

Backpressure: the reader stops taking requests (and reading the socket) while the
connection has ``max_inflight`` unanswered requests or ``max_reply_bytes`` of replies
waiting to be sent, until replies go out; so a client that stops reading stalls only
itself, in bounded memory (a pipelined burst of range reads could otherwise build
gigabytes of replies). Replies to adds keep only their ids, not the entries. The
journal's memory cap answers TOO_MANY_REQUESTS. Nothing queues without bound.

Bad input closes only its own connection: malformed frames get BAD_REQUEST and a close,
unknown apis UNSUPPORTED_VERSION, and a size that cannot hold a header a plain close.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any

import trio

from ledgerd.appliance.authz import allowed, needed_roles
from ledgerd.appliance.handlers import RequestHandler
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.security import ConnectionSecurity, negotiate
from ledgerd.base.logs import fields
from ledgerd.base.tls import Principal, receive_available
from ledgerd.disk.journal import JournalGroup
from ledgerd.wire.connection import (
    NEED_DATA,
    ConnectionEnded,
    RequestRejected,
    ServerConnection,
)
from ledgerd.wire.errors import FrameSizeError
from ledgerd.wire.frames import DecodedRequest
from ledgerd.wire.messages import (
    AddRequest,
    ApiKey,
    AuthRequest,
    Message,
    ReadLacResponse,
    ReadRangeResponse,
    ReadResponse,
    ReadStrideResponse,
)
from ledgerd.wire.status import Status

__all__ = ["ConnectionOptions", "ReplyItem", "count_sent_adds", "encode_replies", "is_loopback",
           "peer_name", "reply_bytes", "serve_connection"]

log = logging.getLogger(__name__)
_CLOSE_GRACE_S = 5.0
_ADD = int(ApiKey.ADD)
_READ = int(ApiKey.READ)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    max_frame_bytes: int = 8 << 20
    max_inflight: int = 1024
    max_reply_bytes: int = 16 << 20   # replies built and not yet sent, per connection
    idle_timeout: float = 0.0         # close after this long idle (nothing in flight); 0: never


def reply_bytes(resp: Message | None) -> int:
    """What a reply holds in memory until it is sent (entries dominate)."""
    if isinstance(resp, (ReadRangeResponse, ReadStrideResponse)):
        return 64 + sum(map(len, resp.entries))
    if isinstance(resp, ReadResponse):
        return 64 + len(resp.entry)
    if isinstance(resp, ReadLacResponse):
        return 64 + len(resp.explicit_lac) + len(resp.last_entry)
    return 64


ReplyItem = tuple[int, int, int, Any, "JournalGroup | None", float]


def encode_replies(conn: ServerConnection, metrics: BookieMetrics, items: list[ReplyItem]
                   ) -> tuple[bytes, int]:
    """The bytes of ``items``' replies, in order, and the ``reply_bytes`` of the non-add
    ones among them; counts each by api and status and observes the add and read
    latencies. An item is (correlation id, api key, status, response, journal group or
    None, started at); an add's "response" is (ledger id, first entry id, count), and a
    failed journal group turns its OK into IO_ERROR. Shared by the per-connection writer
    and the connection hub."""
    count = metrics.count
    add_latency = metrics.add_latency
    read_latency = metrics.read_latency
    send_add_ok = conn.send_add_ok
    chunks = []
    now = time.perf_counter()
    adds = ok_adds = sent_bytes = 0
    add_t0 = 0.0
    for cid, api, status, resp, group, t0 in items:
        if api == _ADD:
            if group is not None and group.error is not None:
                status = Status.IO_ERROR
            if status == 0:
                chunks.append(send_add_ok(cid, *resp))
                ok_adds += 1
            else:
                chunks.append(conn.send(cid, status, None))
                count(api, status)
            if adds and t0 != add_t0:
                add_latency.observe(now - add_t0, adds)
                adds = 0
            add_t0 = t0
            adds += 1
        else:
            chunks.append(conn.send(cid, status, resp))
            sent_bytes += reply_bytes(resp)
            count(api, status)
            if api == _READ and t0:  # slow-path reads time themselves
                read_latency.observe(now - t0)
    if adds:
        add_latency.observe(now - add_t0, adds)
    if ok_adds:
        count(_ADD, 0, ok_adds)
    return b"".join(chunks), sent_bytes


def count_sent_adds(metrics: BookieMetrics, items: list[ReplyItem]) -> None:
    """Count and time OK add replies that went out already encoded (the journal's
    syncer sent them: ``ConnectionHub``), as ``encode_replies`` would have."""
    observe = metrics.add_latency.observe
    now = time.perf_counter()
    adds = 0
    add_t0 = 0.0
    for item in items:
        t0 = item[5]
        if adds and t0 != add_t0:
            observe(now - add_t0, adds)
            adds = 0
        add_t0 = t0
        adds += 1
    if adds:
        observe(now - add_t0, adds)
        metrics.count(_ADD, 0, len(items))


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
    """Replies waiting to be written, with the journal groups they wait for."""

    __slots__ = ("bytes", "closing", "items", "more", "space", "unsent", "waiting_on")

    def __init__(self) -> None:
        # (correlation id, api key, status, response, group or None, started at); an
        # add's "response" is (ledger id, first entry id, count).
        self.items: list[ReplyItem] = []
        self.more = trio.Event()
        self.space = trio.Event()
        self.closing = False
        self.bytes = 0  # reply_bytes of the non-add replies queued
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
        group = self.items[-1][4]
        if group is None or group.done.is_set():
            self.more.set()
        elif self.waiting_on is not group:
            self.waiting_on = group
            group.call_when_done(self.wake)

    def put(self, cid: int, api: int, status: int, resp: Message | None,
            group: JournalGroup | None, t0: float) -> None:
        self.items.append((cid, api, status, resp, group, t0))
        self.bytes += reply_bytes(resp)
        self.more.set()


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
    outbox = _Outbox()
    metrics = handler.metrics
    metrics.connections_opened += 1
    guard: _Guard | None = None
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
            guard = _Guard(principal, peer, metrics, security)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_writer, stream, conn, outbox, handler, nursery.cancel_scope)
            with reader_scope or trio.CancelScope():
                await _reader(stream, conn, outbox, handler, nursery, trusted,
                              options.max_reply_bytes, options.idle_timeout, first, guard)
            outbox.closing = True
            outbox.more.set()
    finally:
        with trio.move_on_after(1, shield=True):
            await stream.aclose()


class _Guard:
    """One connection's principal: set by its certificate or an AUTH, and checked
    against each request's roles when authorization is on."""

    __slots__ = ("metrics", "peer", "principal", "refused", "security")

    def __init__(self, principal: Principal, peer: str, metrics: BookieMetrics,
                 security: ConnectionSecurity) -> None:
        self.principal = principal
        self.peer = peer
        self.metrics = metrics
        self.security = security
        self.refused = 0

    def authenticate(self, req: AuthRequest) -> tuple[int, Message | None]:
        status, reply, principal = self.security.authenticate(req)
        if principal is not None:
            self.principal = principal
        else:
            log.warning("auth_refused", extra=fields(peer=self.peer, status=Status(status).name))
        return status, reply

    def allows(self, api_key: int, req: Message | None) -> bool:
        if not self.security.authorization or allowed(self.principal.roles, api_key, req):
            return True
        self.refused += 1
        self.metrics.requests_unauthorized += 1
        if self.refused <= 3 or self.refused % 1000 == 0:  # bounded: a loop cannot flood
            log.warning("request_unauthorized", extra=fields(
                principal=self.principal.name, peer=self.peer, api=ApiKey(api_key).name,
                roles=",".join(sorted(self.principal.roles)) or "-",
                needs=",".join(sorted(needed_roles(api_key, req))), refused=self.refused))
        return False


async def _reader(stream: trio.abc.Stream, conn: ServerConnection, outbox: _Outbox,
                  handler: RequestHandler, nursery: trio.Nursery, trusted: bool,
                  max_reply: int, idle_timeout: float, first: Any = None,
                  guard: _Guard | None = None) -> None:
    add = handler.add
    read_now = handler.read_now
    put = outbox.put
    tls = isinstance(stream, trio.SSLStream)
    max_reply_bytes = max_reply
    max_inflight = conn.max_inflight
    now = time.perf_counter()
    while True:
        if (len(conn.inflight) + outbox.unsent >= max_inflight
                or outbox.bytes >= max_reply_bytes):
            # Stop taking requests (frames already read wait in ``conn``) until the
            # writer sends replies: a peer that does not read stalls only itself.
            outbox.more.set()
            while (len(conn.inflight) + outbox.unsent >= max_inflight
                   or outbox.bytes >= max_reply_bytes):
                outbox.space = trio.Event()
                await outbox.space.wait()
        try:
            if first is not None:  # the first request, already read by the TLS negotiation
                ev, first = first, None
            else:
                ev = conn.next_event()
        except FrameSizeError as exc:
            log.info("connection_closed_bad_frame", extra=fields(error=str(exc)))
            return
        if ev is NEED_DATA:
            if outbox.items:
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
            conn.receive_data(data)
            now = time.perf_counter()
            continue
        if type(ev) is DecodedRequest:
            req: Message = ev.message
            if guard is not None:
                if type(req) is AuthRequest:
                    status, reply_msg = guard.authenticate(req)
                    put(ev.correlation_id, ev.api_key, status, reply_msg, None, now)
                    continue
                if not guard.allows(ev.api_key, req):
                    put(ev.correlation_id, ev.api_key, Status.UNAUTHORIZED, None, None, now)
                    continue
            if type(req) is AddRequest:
                status, group = add(req)
                outbox.items.append((ev.correlation_id, _ADD, status,
                                     (req.ledger_id, req.first_entry_id, len(req.entries)),
                                     group, now))
                continue
            reply = read_now(req)
            if reply is not None:
                put(ev.correlation_id, ev.api_key, reply[0], reply[1], None, now)
                continue
            nursery.start_soon(_slow, handler, outbox, ev, trusted, now)
        elif isinstance(ev, RequestRejected):
            log.info("request_rejected", extra=fields(
                correlation_id=ev.correlation_id, status=ev.status.name, reason=ev.reason))
            put(ev.correlation_id, -1, ev.status, None, None, now)
            if ev.close:
                return
        elif isinstance(ev, ConnectionEnded):
            return


async def _slow(handler: RequestHandler, outbox: _Outbox, ev: DecodedRequest, trusted: bool,
                t0: float) -> None:
    status, resp = await handler.handle(ev.message, trusted=trusted)
    outbox.put(ev.correlation_id, ev.api_key, status, resp, None, 0.0)


async def _writer(stream: trio.abc.Stream, conn: ServerConnection, outbox: _Outbox,
                  handler: RequestHandler, scope: trio.CancelScope) -> None:
    metrics = handler.metrics
    while True:
        if not outbox.items:
            if outbox.closing and not conn.inflight:
                scope.cancel()
                return
            outbox.more = trio.Event()
            # A closing connection waits a bounded time for its slow requests.
            with trio.move_on_after(_CLOSE_GRACE_S if outbox.closing else float("inf")):
                await outbox.more.wait()
                continue
            scope.cancel()
            return
        items, outbox.items = outbox.items, []
        # Groups complete in order; wait for each distinct one (most are already done).
        last: JournalGroup | None = None
        for item in items:
            group = item[4]
            if group is not None and group is not last:
                if not group.done.is_set():
                    await group.done.wait()
                last = group
        data, sent_bytes = encode_replies(conn, metrics, items)
        outbox.unsent = len(items)
        del items  # the replies' entries are in ``data`` now
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()  # the peer is gone; what it sent is stored all the same
            return
        outbox.unsent = 0
        outbox.bytes -= sent_bytes
        outbox.space.set()
        if outbox.closing and not outbox.items and not conn.inflight:
            scope.cancel()
            return
