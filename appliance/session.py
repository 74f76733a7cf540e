"""One bookie connection's rules, sans-IO: bytes in; adds to store, requests to answer,
replies owed, pause and close out.

The bookie serves connections over two transports: the connection hub (``hub.py``,
plain sockets in one epoll set) and the per-connection server (``server.py``, trio
streams and TLS). Both feed a ``BookieSession`` what they read and do what its events
say; every rule of the connection lives here once, in the style of
``wire.connection`` (which the session wraps for framing):

- Framing: a frame over ``max_frame_bytes`` is refused (BAD_REQUEST, then close), an
  unknown api gets UNSUPPORTED_VERSION, and a size that cannot hold a header closes the
  connection without an answer (there is no correlation id to answer to).
- Adds come out as ``AddRun``: one-entry frames continuing a ledger are cut from the
  buffer as a run (``ServerConnection.take_add_run``: one unpack per frame, no request
  objects), and consecutive Add requests continuing one are merged into one, so the run
  is stored as one add. A transport must store the runs an event loop turn yields
  before it answers any later request (``next_event`` hands them out in the order they
  were read), so a read sees the adds sent before it.
- Authentication and authorization (with a ``Guard``): AUTH is answered here; a request
  the principal's roles do not allow is answered UNAUTHORIZED here. Runs are cut only
  where no per-request check applies (no guard).
- Backpressure: with ``max_inflight`` requests unanswered (replies the transport is
  still sending count too) or ``max_reply_bytes`` of replies built and not yet sent, the
  session says ``PAUSE``: stop reading until replies go out. A peer that does not read
  stalls only itself, in bounded memory.
- Replies owed (``items``) go out in request order; an add's waits for its journal
  group, whose failure turns its OK into IO_ERROR (``appliance.replies``).
- Closing: the peer's end of stream, or a rejection that closes, ends reading
  (``Close``); replies owed still go out, slow ones for at most ``CLOSE_GRACE_S``.
  ``idle_timeout`` closes a connection with nothing in flight after that long without
  a request.

Nothing here does I/O or touches trio; the transports read, write, wait and spawn.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ledgerd.appliance.authz import allowed, needed_roles
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.appliance.replies import ReplyItem, encode_replies, reply_bytes
from ledgerd.base.logs import fields
from ledgerd.wire.connection import (
    NEED_DATA,
    AddRun,
    ConnectionEnded,
    RequestRejected,
    ServerConnection,
    _NeedData,
)
from ledgerd.wire.errors import FrameSizeError
from ledgerd.wire.frames import DecodedRequest
from ledgerd.wire.messages import AddFlags, AddRequest, ApiKey, AuthRequest, Message
from ledgerd.wire.status import Status

if TYPE_CHECKING:
    from ledgerd.appliance.security import ConnectionSecurity
    from ledgerd.base.tls import Principal
    from ledgerd.disk.journal import JournalGroup

__all__ = ["CLOSE_GRACE_S", "NEED_DATA", "PAUSE", "STORE", "UNMERGED_ADD_FLAGS", "BookieSession",
           "Close", "ConnectionOptions", "Guard"]

log = logging.getLogger(__name__)

CLOSE_GRACE_S: Final = 5.0  # how long replies owed may take once reading stopped
# Adds with these flags are stored alone, never merged into a run.
UNMERGED_ADD_FLAGS: Final = int(AddFlags.SPARSE | AddFlags.TRUNCATE)
_ADD: Final = int(ApiKey.ADD)


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Per-connection limits (the bookie sets them from its ``BookieConfig``)."""

    max_frame_bytes: int = 8 << 20
    max_inflight: int = 1024
    max_reply_bytes: int = 16 << 20   # replies built and not yet sent, per connection
    idle_timeout: float = 0.0         # close after this long idle (nothing in flight); 0: never


class _Pause:
    def __repr__(self) -> str:
        return "PAUSE"


PAUSE: Final = _Pause()  # stop reading until replies go out, then ask again


class _Store:
    def __repr__(self) -> str:
        return "STORE"


STORE: Final = _Store()  # store the runs handed out (``put_adds`` each), then ask again


@dataclass(frozen=True, slots=True)
class _Answer:
    """A reply the session decided itself (AUTH, UNAUTHORIZED), owed in its turn."""

    correlation_id: int
    api_key: int
    status: int
    message: Message | None


@dataclass(frozen=True, slots=True)
class Close:
    """Reading ends: ``reason`` is "ended" (the peer's end of stream), "rejected" (a
    rejection that closes, its reply owed) or "bad frame" (close without answering)."""

    reason: str


SessionEvent = AddRun | DecodedRequest | Close | _Pause | _Store | _NeedData


class Guard:
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


class BookieSession:
    """One connection's state and rules (see the module docstring).

    Feed it ``receive_data``; take ``next_event`` until NEED_DATA, PAUSE or ``Close``:

    - ``AddRun``: adds to store (``RequestHandler.store``), then ``put_adds`` their
      outcomes; at once, or later with other connections' runs;
    - ``STORE``: store the runs handed out now (requests are decided in the order they
      came, so nothing else comes out while runs handed out wait), then ask again;
    - ``DecodedRequest``: a request to answer (at once, or in a task of its own), then
      ``put`` the reply;
    - ``PAUSE``: stop reading until replies went out, then ask again;
    - NEED_DATA: read more;
    - ``Close``: stop reading; send what is owed, then close.

    Replies owed wait in ``items``; ``encode`` turns a ready prefix of them into bytes.
    """

    __slots__ = ("_first", "_pending", "_stashed", "_unstored", "conn", "guard", "items", "last_active",
                 "max_reply_bytes", "queued_bytes", "started", "trusted")

    def __init__(self, options: ConnectionOptions, *, trusted: bool,
                 guard: Guard | None = None, conn: ServerConnection | None = None,
                 first: DecodedRequest | RequestRejected | None = None) -> None:
        self.conn = conn or ServerConnection(max_frame_bytes=options.max_frame_bytes,
                                             max_inflight=options.max_inflight)
        self.max_reply_bytes = options.max_reply_bytes
        self.trusted = trusted
        self.guard = guard
        self.items: list[ReplyItem] = []
        self.queued_bytes = 0  # reply_bytes of the non-add replies owed or being sent
        self.started = 0.0     # when the frames being taken were read
        self.last_active = 0.0
        # The first request, already read by a TLS negotiation.
        self._first = first
        # Add requests read and merged, not handed out yet; then the event read after.
        self._pending: AddRun | None = None
        self._stashed: object = None
        self._unstored = 0  # runs handed out whose outcomes are not back (``put_adds``)

    # -- bytes in ------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """Bytes read from the peer (b"" at its end of stream), at ``now``."""
        self.conn.receive_data(data)
        self.started = now

    def is_full(self, unsent_replies: int = 0, unsent_bytes: int = 0) -> bool:
        """Whether to stop taking requests: ``max_inflight`` unanswered (with the
        ``unsent_replies`` encoded but not yet taken by the peer), or ``max_reply_bytes``
        of replies built and not sent (with the transport's ``unsent_bytes``)."""
        conn = self.conn
        return (len(conn.inflight) + unsent_replies >= conn.max_inflight
                or self.queued_bytes + unsent_bytes >= self.max_reply_bytes)

    def next_event(self, unsent_replies: int = 0, unsent_bytes: int = 0) -> SessionEvent:
        """The next thing to do (see the class docstring)."""
        conn = self.conn
        # ``is_full``, inline: this runs once per event on the bookie's hottest path.
        if (len(conn.inflight) + unsent_replies >= conn.max_inflight
                or self.queued_bytes + unsent_bytes >= self.max_reply_bytes):
            if self._pending is not None:
                return self._hand_out()
            return PAUSE
        while True:
            ev: object
            if self._stashed is not None:
                ev, self._stashed = self._stashed, None
            else:
                if self._first is not None:
                    ev, self._first = self._checked(self._first), None
                else:
                    if self.guard is None and self._pending is None:
                        # Most frames are one-entry adds continuing a ledger.
                        cut = conn.take_add_run(UNMERGED_ADD_FLAGS)
                        if cut is not None:
                            self._unstored += 1
                            return cut
                    try:
                        ev = conn.next_event()
                        if self.guard is not None:
                            ev = self._checked(ev)
                    except FrameSizeError as exc:
                        log.info("connection_closed_bad_frame", extra=fields(error=str(exc)))
                        ev = Close("bad frame")
                if type(ev) is DecodedRequest and type(ev.message) is AddRequest:
                    req = ev.message
                    pending = self._pending
                    if pending is None:
                        self._pending = AddRun.of_request(ev.correlation_id, req)
                    elif not pending.extend(ev.correlation_id, req, UNMERGED_ADD_FLAGS):
                        self._pending = AddRun.of_request(ev.correlation_id, req)
                        self._unstored += 1
                        return pending
                    if self.is_full(unsent_replies, unsent_bytes):
                        return self._hand_out()
                    continue
            if self._pending is not None:
                # Adds read before this event are handed out before it.
                self._stashed = ev
                return self._hand_out()
            if ev is NEED_DATA:
                return NEED_DATA
            if self._unstored:
                # Requests are decided in the order they came: the adds before this one
                # are stored first.
                self._stashed = ev
                return STORE
            if type(ev) is DecodedRequest:
                return ev
            if type(ev) is _Answer:
                self.put(ev.correlation_id, ev.api_key, ev.status, ev.message, self.started)
                continue
            if type(ev) is Close:
                return ev
            if isinstance(ev, RequestRejected):
                log.info("request_rejected", extra=fields(
                    correlation_id=ev.correlation_id, status=ev.status.name, reason=ev.reason))
                self.put(ev.correlation_id, -1, ev.status, None, self.started)
                if ev.close:
                    return Close("rejected")
                continue
            assert isinstance(ev, ConnectionEnded), ev
            return Close("ended")

    def _hand_out(self) -> AddRun:
        run = self._pending
        assert run is not None
        self._pending = None
        self._unstored += 1
        return run

    def _checked(self, ev: object) -> object:
        """``ev``, or with a guard, the answer it gets here: AUTH is answered, and a
        request the principal may not make is refused (in the order read)."""
        guard = self.guard
        if guard is None or type(ev) is not DecodedRequest:
            return ev
        req = ev.message
        if type(req) is AuthRequest:
            status, reply = guard.authenticate(req)
            return _Answer(ev.correlation_id, ev.api_key, status, reply)
        if not guard.allows(ev.api_key, req):
            return _Answer(ev.correlation_id, ev.api_key, Status.UNAUTHORIZED, None)
        return ev

    # -- replies owed ---------------------------------------------------------------

    def put(self, correlation_id: int, api_key: int, status: int, message: Message | None,
            started: float) -> None:
        """A reply to a request other than an add, ready to go in its turn."""
        self.items.append(ReplyItem(correlation_id, api_key, status, message, None, started))
        self.queued_bytes += reply_bytes(message)

    def put_adds(self, run: AddRun, outcomes: list[tuple[int, JournalGroup | None]],
                 started: float) -> None:
        """The replies to ``run``'s frames, given their outcomes (one per frame)."""
        self._unstored -= 1
        lid = run.ledger_id
        eid = run.first_entry_id
        items = self.items
        if run.counts is None:
            if len(outcomes) == 1:
                status, group = outcomes[0]
                items.append(ReplyItem(run.correlation_ids[0], _ADD, status, None, group,
                                       started, lid, eid, 1))
                return
            cids = run.correlation_ids
            first = outcomes[0]
            if len(outcomes) == len(cids) and outcomes.count(first) == len(outcomes):
                # One outcome for the whole run (the usual case): one item.
                items.append(ReplyItem(cids[0], _ADD, first[0], None, first[1], started,
                                       lid, eid, 1, list(cids)))
                return
            items += [ReplyItem(cid, _ADD, status, None, group, started, lid, eid + i, 1)
                      for i, (cid, (status, group)) in enumerate(
                          zip(cids, outcomes, strict=True))]
            return
        for cid, n, (status, group) in zip(run.correlation_ids, run.counts, outcomes,
                                           strict=True):
            items.append(ReplyItem(cid, _ADD, status, None, group, started, lid, eid, n))
            eid += n

    def encode(self, metrics: BookieMetrics, items: list[ReplyItem]) -> tuple[bytes, int]:
        """The bytes of ``items`` (taken from ``self.items``), and the ``reply_bytes``
        they held (``replies_sent`` once the peer took them)."""
        return encode_replies(self.conn, metrics, items)

    def replies_sent(self, nbytes: int) -> None:
        """Replies holding ``nbytes`` (``encode``'s second value) left this session."""
        self.queued_bytes -= nbytes

    # -- closing ------------------------------------------------------------------

    @property
    def owes_nothing(self) -> bool:
        """No reply owed and no request unanswered."""
        return not self.items and not self.conn.inflight

    def is_idle(self, now: float, idle_timeout: float) -> bool:
        """Whether ``idle_timeout`` (0: never) closes it at ``now``: nothing in flight
        and no request read for that long."""
        return bool(idle_timeout) and self.owes_nothing and now - self.last_active > idle_timeout
