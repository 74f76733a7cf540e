"""One pipelined connection to a bookie, over trio.

``send(message, callback)`` never blocks: it queues the request, and the connection's
writer task encodes everything queued since it last woke into one ``send_all``, each
request carrying its callback as the sans-IO connection's context (that connection
holds the one table of requests in flight). The reader task calls
``callback(status, response, None)`` for each reply, synchronously and in arrival order,
or ``callback(-1, None, error)`` for every request still waiting when the connection
fails. So a ledger handle with thousands of adds in flight pays one
hand-off per batch of bytes, not per request, and needs no task per request.

``call``/``call_many`` are the awaitable form (one event per batch). If the connection
ends or the bookie breaks the protocol, they raise ``BookieConnectionError`` and the
client is closed; ``ended`` fires.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from ledgerd.base.errors import LedgerdError
from ledgerd.base.logs import fields
from ledgerd.base.runs import consecutive_runs
from ledgerd.base.tls import receive_available
from ledgerd.wire.connection import (
    NEED_DATA,
    ClientConnection,
    ConnectionEnded,
    ResponseReceived,
)
from ledgerd.wire.entry import entry_ids
from ledgerd.wire.errors import WireError
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    AddResponse,
    ApiKey,
    ApiVersionsRequest,
    AuthRequest,
    AuthResponse,
    Message,
    StartTlsRequest,
)
from ledgerd.wire.status import Status

__all__ = [
    "BookieClient",
    "BookieConnectionError",
    "Callback",
    "Connect",
    "authenticate",
    "open_bookie_client",
    "parse_address",
    "start_tls",
    "tcp_connect",
]

log = logging.getLogger(__name__)
Reply = tuple[int, Message | None]
Callback = Callable[[int, "Message | None", "BookieConnectionError | None"], None]
_SPARSE = int(AddFlags.SPARSE)


class BookieConnectionError(LedgerdError, ConnectionError):
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
    __slots__ = ("done", "error", "remaining", "replies")

    def __init__(self, n: int) -> None:
        self.replies: list[Reply | None] = [None] * n
        self.remaining = n
        self.error: BookieConnectionError | None = None
        self.done = trio.Event()

    def deliver(self, i: int, status: int, response: Message | None,
                error: BookieConnectionError | None) -> None:
        if error is not None:
            self.error = self.error or error
        else:
            self.replies[i] = (status, response)
        self.remaining -= 1
        if not self.remaining:
            self.done.set()


class _RunsReply:
    """One reply for a SPARSE add sent as consecutive runs (a bookie without ADD v1):
    OK with the sparse request's echo once every run is OK, else the first failure."""

    __slots__ = ("callback", "failure", "remaining", "request")

    def __init__(self, request: AddRequest, runs: int, callback: Callback) -> None:
        self.request = request
        self.remaining = runs
        self.callback = callback
        self.failure: tuple[int, Message | None, BookieConnectionError | None] | None = None

    def deliver(self, status: int, response: Message | None,
                error: BookieConnectionError | None) -> None:
        if self.failure is None and (error is not None or status != Status.OK):
            self.failure = (status, response, error)
        self.remaining -= 1
        if not self.remaining:
            if self.failure is not None:
                self.callback(*self.failure)
            else:
                req = self.request
                self.callback(Status.OK, AddResponse(ledger_id=req.ledger_id,
                                                     first_entry_id=req.first_entry_id,
                                                     count=len(req.entries)), None)


class BookieClient:
    def __init__(self, address: str, stream: trio.abc.Stream,
                 conn: ClientConnection[Callback]) -> None:
        self.address = address
        self.stream = stream
        self.conn = conn
        self._queue: deque[tuple[Message, Callback]] = deque()
        self._wake = trio.Event()
        self.ended = trio.Event()
        self.error: BookieConnectionError | None = None

    @property
    def closed(self) -> bool:
        return self.error is not None

    def send(self, message: Message, callback: Callback) -> None:
        """Queue ``message``; ``callback`` gets its reply (or the connection's failure).

        Raises BookieConnectionError at once if the connection has already failed.
        """
        if self.error is not None:
            raise self.error
        if type(message) is AddRequest and message.flags & _SPARSE \
                and self.conn.version_for(ApiKey.ADD) < 1:
            self._send_runs(message, callback)
        else:
            self._queue.append((message, callback))
        if not self._wake.is_set():
            self._wake.set()

    def _send_runs(self, req: AddRequest, callback: Callback) -> None:
        """A SPARSE add to a bookie that does not speak ADD v1: its consecutive runs."""
        ids = [entry_ids(e)[1] for e in req.entries]
        runs = consecutive_runs(ids)
        joined = _RunsReply(req, len(runs), callback)
        flags = req.flags & ~_SPARSE
        for start, stop in runs:
            self._queue.append((dataclasses.replace(
                req, first_entry_id=ids[start], flags=flags, entries=req.entries[start:stop]),
                joined.deliver))

    async def call(self, message: Message) -> Reply:
        return (await self.call_many([message]))[0]

    async def call_many(self, messages: Sequence[Message]) -> list[Reply]:
        """Send every message pipelined; their replies in the same order."""
        batch = _Batch(len(messages))
        for i, msg in enumerate(messages):
            self.send(msg, partial(batch.deliver, i))
        if messages:
            await batch.done.wait()
        if batch.error is not None:
            raise batch.error
        return [r for r in batch.replies if r is not None]

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The reader and writer tasks; returns when the connection has failed."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_loop)
            nursery.start_soon(self._read_loop)
            task_status.started()
            await self.ended.wait()
            nursery.cancel_scope.cancel()

    async def _write_loop(self) -> None:
        conn = self.conn
        queue = self._queue
        while self.error is None:
            await self._wake.wait()
            self._wake = trio.Event()
            chunks = []
            while queue and conn.can_send:
                msg, cb = queue.popleft()
                try:
                    chunks.append(conn.send(msg, cb))
                except WireError as exc:  # this request cannot be sent (too large, ...)
                    cb(-1, None, BookieConnectionError(self.address, f"cannot send: {exc}"))
            if chunks:
                try:
                    await self.stream.send_all(b"".join(chunks))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._fail(f"send failed: {_io_reason(exc)}")

    async def _read_loop(self) -> None:
        conn = self.conn
        tls = isinstance(self.stream, trio.SSLStream)
        while self.error is None:
            try:
                data = await receive_available(self.stream, tls=tls)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(f"receive failed: {_io_reason(exc)}")
                return
            try:
                conn.receive_data(data)
                while True:
                    ev = conn.next_event()
                    if ev is NEED_DATA:
                        break
                    if isinstance(ev, ResponseReceived):
                        cb = ev.context
                        if cb is not None:
                            cb(ev.status, ev.response, None)
                        continue
                    if isinstance(ev, ConnectionEnded):
                        self._fail("connection closed by the bookie")
                        return
            except WireError as exc:
                self._fail(f"protocol error: {exc}")
                return
            if self._queue and not self._wake.is_set():
                self._wake.set()  # replies made room for queued requests

    def _fail(self, reason: str) -> None:
        if self.error is not None:
            return
        error = self.error = BookieConnectionError(self.address, reason)
        log.info("bookie_connection_lost", extra=fields(bookie=self.address, reason=reason))
        waiting = [cb for cb in self.conn.close() if cb is not None]
        waiting += [cb for _m, cb in self._queue]
        self._queue.clear()
        self._wake.set()
        self.ended.set()
        for cb in waiting:
            cb(-1, None, error)

    def close(self) -> None:
        """Fail everything outstanding and stop (the tasks end)."""
        self._fail("closed by the client")


Connect = Callable[[str], Awaitable[trio.abc.Stream]]


async def tcp_connect(address: str) -> trio.abc.Stream:
    """A TCP stream to ``host:port`` with Nagle off (the pool's default ``connect``)."""
    host, port = parse_address(address)
    stream = await trio.open_tcp_stream(host, port)
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return stream


async def _exchange(address: str, stream: trio.abc.Stream, conn: ClientConnection[Any],
                    request: Message, what: str) -> ResponseReceived[Any]:
    """One request and its reply, on a connection nothing else uses yet."""
    try:
        await stream.send_all(conn.send(request))
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA:
                data = await stream.receive_some(4096)  # nothing follows the reply yet
                if not data:
                    raise BookieConnectionError(address, f"closed the connection at {what}")
                conn.receive_data(data)
                continue
            if isinstance(ev, ResponseReceived):
                return ev
            raise BookieConnectionError(address, f"closed the connection at {what}")
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, WireError) as exc:
        if isinstance(exc, BookieConnectionError):
            raise
        raise BookieConnectionError(address, f"{what} failed: {_io_reason(exc)}") from exc


async def authenticate(address: str, stream: trio.abc.Stream, conn: ClientConnection[Any],
                       token: bytes) -> str:
    """AUTH with a token (after START_TLS); returns the principal the bookie named."""
    ev = await _exchange(address, stream, conn, AuthRequest(mechanism=b"token", token=token),
                         "AUTH")
    if ev.status == Status.OK and isinstance(ev.response, AuthResponse):
        return ev.response.principal.decode("utf-8", "replace")
    if ev.status == Status.UNAUTHORIZED:
        raise BookieConnectionError(address, "refused our token: it is not in the bookie's "
                                    "principals_file (auth_token_file)")
    if ev.status == Status.BAD_REQUEST:
        raise BookieConnectionError(address, "takes no tokens (no principals_file)")
    raise BookieConnectionError(address, f"refused AUTH: {Status(ev.status).name}")


async def start_tls(address: str, stream: trio.abc.Stream, conn: ClientConnection[Any],
                    context: ssl.SSLContext) -> trio.SSLStream[trio.abc.Stream]:
    """Upgrade a fresh connection: START_TLS in clear, the bookie's OK, then the TLS
    handshake (the bookie verified against the context's trust, and its host name or
    IP address unless hostname verification is off). BookieConnectionError says which
    step failed and why."""
    ev = await _exchange(address, stream, conn, StartTlsRequest(), "START_TLS")
    if ev.status == Status.BAD_REQUEST:
        raise BookieConnectionError(address, "has no TLS configured (tls_certificate_path); "
                                    "connect without tls_trust_path")
    if ev.status == Status.UNSUPPORTED_VERSION:
        raise BookieConnectionError(address, "does not speak START_TLS (an older ledgerd)")
    if ev.status != Status.OK:
        raise BookieConnectionError(address, f"refused START_TLS: {Status(ev.status).name}")
    host = parse_address(address)[0]
    tls = trio.SSLStream(stream, context,
                         server_hostname=host if context.check_hostname else None)
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as exc:
        raise BookieConnectionError(address, "TLS handshake failed: "
                                    + _handshake_reason(exc.__cause__ or exc)) from exc
    return tls


def _io_reason(exc: BaseException) -> str:
    """A failed send or receive, said plainly (a TLS alert from the bookie by its name)."""
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLError):
        return "TLS: " + _handshake_reason(cause)
    return repr(exc)


def _handshake_reason(cause: BaseException) -> str:
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (f"the bookie's certificate did not verify ({cause.verify_message}): is "
                "tls_trust_path the CA that issued it, for this host?")
    if isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
        if "CERTIFICATE_REQUIRED" in reason:
            return "the bookie requires a client certificate (tls_certificate_path)"
        if "UNEXPECTED_EOF" in reason:
            return ("the bookie closed the TLS connection (does it require a client "
                    "certificate? tls_certificate_path)")
        if "UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason:
            return f"the bookie refused our certificate ({reason})"
        return reason
    return str(cause) or type(cause).__name__


@asynccontextmanager
async def open_bookie_client(address: str, *, connect: Connect = tcp_connect,
                             connect_timeout: float = 10.0,
                             max_inflight: int = 1024, max_frame_bytes: int = 8 << 20,
                             negotiate: bool = True, tls: ssl.SSLContext | None = None,
                             auth_token: bytes | None = None) -> AsyncIterator[BookieClient]:
    """Connect to ``address`` with ``connect`` (TCP by default; tests pass memory
    streams), upgrade to TLS first when given a ``tls`` context (START_TLS); with
    ``negotiate``, exchange ApiVersions. Raises BookieConnectionError (never inside an
    exception group) when the connect, the upgrade or the ApiVersions exchange fails
    within ``connect_timeout``. If cancelled while connecting, nothing is left open."""
    conn: ClientConnection[Callback] = ClientConnection(max_frame_bytes=max_frame_bytes,
                                                        max_inflight=max_inflight)
    try:
        with trio.fail_after(connect_timeout):
            stream: trio.abc.Stream = await connect(address)
            try:
                if tls is not None:
                    stream = await start_tls(address, stream, conn, tls)
                if auth_token:
                    await authenticate(address, stream, conn, auth_token)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except BookieConnectionError:
        raise
    except (OSError, trio.TooSlowError) as exc:
        raise BookieConnectionError(address, f"connect failed: {exc!r}") from exc
    client = BookieClient(address, stream, conn)
    failure: BookieConnectionError | None = None
    async with stream, trio.open_nursery() as nursery:
        await nursery.start(client.run)
        if negotiate:
            # Raised after the nursery, not in it: inside, trio would wrap the error in an
            # exception group that callers catching BookieConnectionError never see (a
            # bookie that accepted the connection and then said nothing crashed the
            # client's pool this way).
            failure = BookieConnectionError(address, "no ApiVersions reply")
            with trio.move_on_after(connect_timeout):
                try:
                    status, _ = await client.call(ApiVersionsRequest())
                    failure = None
                    if status == Status.TLS_REQUIRED:
                        failure = BookieConnectionError(
                            address, "requires TLS (tls_required): set tls_trust_path to "
                            "the CA that issued the bookies' certificates")
                except BookieConnectionError as exc:
                    failure = exc
        if failure is not None:
            client.close()
            nursery.cancel_scope.cancel()
        else:
            try:
                yield client
            finally:
                client.close()
                nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
