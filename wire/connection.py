"""Sans-IO connections: bytes in, events out; messages in, bytes out.

Neither class does any I/O. The trio layer feeds whatever it read to ``receive_data``
(``b""`` at end of stream), then calls ``next_event()`` until it returns ``NEED_DATA``,
and writes whatever ``send`` returns.

Client side: correlation ids are allocated here, in order, and this is the one table of
requests in flight: ``send(message, context)`` keeps an opaque ``context`` (the caller's
callback, say) that comes back on the response's event, and ``close()`` hands back the
contexts of every request that will never be answered. At most ``max_inflight``
requests may be outstanding; ``send`` past the cap raises (the caller should wait for
``can_send``).
An ApiVersions response records the peer's ranges; later sends use the highest common
version and refuse an api the peer does not serve.

Server side: each complete frame becomes a :class:`RequestReceived`, or a
:class:`RequestRejected` that says which status to answer and whether to close.
Unknown api keys and versions get UNSUPPORTED_VERSION and the connection carries on;
a frame over ``max_frame_bytes`` or a malformed body gets BAD_REQUEST and the
connection closes, as does a size that cannot even hold a header (no answer possible).
``is_at_capacity`` tells the trio layer to stop reading until responses go out.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from ledgerd.wire.errors import (
    ConnectionClosedError,
    FrameSizeError,
    FrameTooLargeError,
    MessageTooLargeError,
    NoCommonVersionError,
    TooManyInflightError,
    UnexpectedResponseError,
    UnknownApiKeyError,
    UnsupportedVersionError,
    WireError,
)
from ledgerd.wire.frames import (
    DecodedRequest,
    decode_request,
    decode_response,
    encode_add_response,
    encode_request,
    encode_response,
    request_header,
)
from ledgerd.wire.messages import (
    SUPPORTED_VERSIONS,
    AddRequest,
    ApiKey,
    ApiVersionsResponse,
    Message,
)
from ledgerd.wire.status import Status

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "NEED_DATA",
    "AddRun",
    "ClientConnection",
    "ConnectionEnded",
    "RequestReceived",
    "RequestRejected",
    "ResponseReceived",
    "ServerConnection",
]

DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
C = TypeVar("C")  # what a client's caller keeps with each request (``send``'s context)
_SIZE = struct.Struct(">i")
_INT32_MAX = (1 << 31) - 1
# A one-entry Add frame from its size prefix to its entry's length: size, api key,
# version, correlation id, ledger, entry id, flags, master key, term, entry count and the
# entry's length (``layouts.ADD_REQUEST``). Its entry follows; nothing may follow that.
_ADD_ONE = struct.Struct(">ihhiqqH20sqII")
_ADD_ONE_EXTRA = _ADD_ONE.size - _SIZE.size  # ``size`` of a frame whose entry is empty
_ADD_KEY = int(ApiKey.ADD)
_ADD_LOW, _ADD_HIGH = SUPPORTED_VERSIONS[ApiKey.ADD]


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


# A request event is the decoded frame itself (a NamedTuple: correlation_id, api_key,
# api_version, message), so the hot path builds one object per request, not two.
RequestReceived = DecodedRequest


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """A request that gets an error response without reaching a handler."""

    correlation_id: int
    status: Status
    reason: str
    close: bool


@dataclass(frozen=True, slots=True)
class ResponseReceived(Generic[C]):
    """A response, with the request it answers and the context ``send`` was given."""

    correlation_id: int
    api_key: ApiKey
    status: int
    response: Message | None
    request: Message
    context: C | None = None


@dataclass(frozen=True, slots=True)
class ConnectionEnded:
    """The peer closed the stream; ``pending`` lists requests that will never be answered."""

    pending: tuple[tuple[int, Message], ...] = ()
    partial_frame: bool = False


@dataclass(slots=True)
class AddRun:
    """Consecutive Add frames of one ledger, sharing flags, key and term: cut straight
    from a connection's buffer (``ServerConnection.take_add_run``: one-entry frames, entry
    ``first_entry_id + i`` came in the frame with ``correlation_ids[i]``), or Add requests
    adapted (``of_request``, ``extend``: ``counts`` says how many entries each frame
    holds). Each frame decodes to exactly the AddRequest ``decode_request`` gives it."""

    ledger_id: int
    first_entry_id: int
    flags: int
    master_key: bytes
    term: int
    correlation_ids: list[int]
    entries: list[bytes]
    # Entries per frame when a frame holds other than one (Add requests adapted to a
    # run: ``of_request``, ``extend``); None: one each.
    counts: list[int] | None = None

    @classmethod
    def of_request(cls, correlation_id: int, req: AddRequest) -> AddRun:
        """The run of one Add request (of any number of entries)."""
        n = len(req.entries)
        return cls(req.ledger_id, req.first_entry_id, req.flags, req.master_key, req.term,
                   [correlation_id], list(req.entries), None if n == 1 else [n])

    def extend(self, correlation_id: int, req: AddRequest, unmergeable: int) -> bool:
        """Append ``req``'s frame if it continues this run (the same ledger, flags, key
        and term, the next ids, none of the ``unmergeable`` flags); else False."""
        if (req.ledger_id != self.ledger_id or req.flags != self.flags
                or self.flags & unmergeable or req.term != self.term
                or req.master_key != self.master_key
                or req.first_entry_id != self.first_entry_id + len(self.entries)):
            return False
        n = len(req.entries)
        counts = self.counts
        if counts is None and n != 1:
            counts = self.counts = [1] * len(self.correlation_ids)
        if counts is not None:
            counts.append(n)
        self.correlation_ids.append(correlation_id)
        self.entries += req.entries
        return True

    def frame_counts(self) -> list[int]:
        """Entries per frame, in order."""
        return self.counts if self.counts is not None else [1] * len(self.correlation_ids)

    def frames(self) -> list[AddRun]:
        """One run per frame, in order (each decoding to its frame's Add request)."""
        out = []
        first = self.first_entry_id
        entries = self.entries
        k = 0
        for cid, n in zip(self.correlation_ids, self.frame_counts(), strict=True):
            out.append(AddRun(self.ledger_id, first + k, self.flags, self.master_key,
                              self.term, [cid], entries[k:k + n], None if n == 1 else [n]))
            k += n
        return out


class _FrameBuffer:
    """Accumulates bytes and cuts out size-prefixed frames without quadratic copying."""

    __slots__ = ("_buf", "_pos", "eof", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.eof = False
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            self.eof = True
            return
        if self._pos and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def peek_size(self) -> int | None:
        if self.buffered < 4:
            return None
        size: int = _SIZE.unpack_from(self._buf, self._pos)[0]
        return size

    def peek(self, n: int) -> bytes:
        return bytes(self._buf[self._pos + 4 : self._pos + 4 + n])

    def take(self, size: int) -> bytes | None:
        if self.buffered < 4 + size:
            return None
        start = self._pos + 4
        frame = bytes(self._buf[start : start + size])
        self._pos = start + size
        return frame

    def discard_all(self) -> None:
        self._buf.clear()
        self._pos = 0

    def take_add_run(self, limit: int, unmergeable: int) -> AddRun | None:
        """Cut out the longest run (at most ``limit``) of complete frames that are each a
        well-formed one-entry Add of a supported version, for one ledger with consecutive
        entry ids and the same flags (none of ``unmergeable``), key and term; None when
        the next frame is not one. Bookies' writers send mostly these: one unpack per
        frame instead of the general decode and two objects per request."""
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if end - pos < _ADD_ONE.size or limit < 1:
            return None
        unpack = _ADD_ONE.unpack_from
        max_size = self.max_frame_bytes
        cids: list[int] = []
        spans: list[int] = []
        lid = eid = flags = term = 0
        key = b""
        nxt = 0
        while end - pos >= _ADD_ONE.size and len(cids) < limit:
            size, api, version, cid, f_lid, f_eid, f_flags, f_key, f_term, count, length = \
                unpack(buf, pos)
            if (api != _ADD_KEY or not _ADD_LOW <= version <= _ADD_HIGH or count != 1
                    or size != _ADD_ONE_EXTRA + length or size > max_size
                    or end - pos < 4 + size):
                break
            if not cids:
                if f_flags & unmergeable:
                    break
                lid, eid, flags, key, term = f_lid, f_eid, f_flags, f_key, f_term
                nxt = f_eid
            elif (f_eid != nxt or f_lid != lid or f_flags != flags or f_term != term
                    or f_key != key):
                break
            nxt += 1
            cids.append(cid)
            spans.append(pos + _ADD_ONE.size)
            pos += 4 + size
            spans.append(pos)  # the entry ends the frame
        if not cids:
            return None
        with memoryview(buf) as view:
            entries = [bytes(view[spans[i]:spans[i + 1]]) for i in range(0, len(spans), 2)]
        self._pos = pos
        return AddRun(lid, eid, flags, key, term, cids, entries)


class ServerConnection:
    """The bookie's side of one connection."""

    def __init__(self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_inflight: int = 1024) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        self._frames = _FrameBuffer(max_frame_bytes)
        self.max_inflight = max_inflight
        self.inflight: set[int] = set()
        self.closed = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as frames."""
        return self._frames.buffered

    @property
    def is_at_capacity(self) -> bool:
        return len(self.inflight) >= self.max_inflight

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        self._frames.feed(data)

    def take_add_run(self, unmergeable: int = 0) -> AddRun | None:
        """The next frames as one :class:`AddRun` (each counted in flight, up to
        ``max_inflight``), or None: then ``next_event`` takes the next frame. A run ends
        before anything else (another ledger, a gap in the ids, other flags, key or
        term, a frame of another kind, shape or size), which ``next_event`` handles."""
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        run = self._frames.take_add_run(self.max_inflight - len(self.inflight), unmergeable)
        if run is not None:
            self.inflight.update(run.correlation_ids)
        return run

    def next_event(self) -> RequestReceived | RequestRejected | ConnectionEnded | _NeedData:
        """The next complete request, a rejection, the end of the stream, or NEED_DATA.

        Raises FrameSizeError for a size that cannot hold a header: close the connection
        without answering (there is no correlation id to answer to).
        """
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        size = self._frames.peek_size()
        if size is None:
            return self._end_or_need(self._frames.buffered > 0)
        if size < 8:
            self.closed = True
            raise FrameSizeError(size)
        if size > self._frames.max_frame_bytes:
            if self._frames.buffered < 12:
                return self._end_or_need(True)
            _api_key, _version, cid = request_header(self._frames.peek(8))
            self.closed = True
            self._frames.discard_all()
            err = FrameTooLargeError(size, self._frames.max_frame_bytes)
            return RequestRejected(cid, Status.BAD_REQUEST, str(err), close=True)
        frame = self._frames.take(size)
        if frame is None:
            return self._end_or_need(True)
        try:
            decoded = decode_request(frame)
        except (UnknownApiKeyError, UnsupportedVersionError) as exc:
            cid = request_header(frame)[2]
            return RequestRejected(cid, Status.UNSUPPORTED_VERSION, str(exc), close=False)
        except WireError as exc:
            self.closed = True
            cid = request_header(frame)[2]
            return RequestRejected(cid, Status.BAD_REQUEST, str(exc), close=True)
        self.inflight.add(decoded.correlation_id)
        return decoded

    def _end_or_need(self, partial: bool) -> ConnectionEnded | _NeedData:
        if self._frames.eof:
            self.closed = True
            return ConnectionEnded(partial_frame=partial)
        return NEED_DATA

    def send(self, correlation_id: int, status: int, response: Message | None = None) -> bytes:
        """Bytes of the response to request ``correlation_id``."""
        self.inflight.discard(correlation_id)
        return encode_response(correlation_id, status, response)

    def send_add_ok(self, correlation_id: int, ledger_id: int, first_entry_id: int,
                    count: int) -> bytes:
        """``send`` of an OK AddResponse, without building the message."""
        self.inflight.discard(correlation_id)
        return encode_add_response(correlation_id, 0, ledger_id, first_entry_id, count)


class _Pending(Generic[C]):
    __slots__ = ("api_key", "context", "request")

    def __init__(self, api_key: ApiKey, request: Message, context: C | None) -> None:
        self.api_key = api_key
        self.request = request
        self.context = context


@dataclass
class ClientConnection(Generic[C]):
    """The client's side of one connection to a bookie: its requests in flight, each
    with the caller's context (``C``), in one table."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_inflight: int = 1024
    next_correlation_id: int = 0
    peer_versions: dict[ApiKey, tuple[int, int]] | None = None
    closed: bool = False
    _pending: dict[int, _Pending[C]] = field(default_factory=dict)
    _frames: _FrameBuffer = field(init=False)

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        self._frames = _FrameBuffer(self.max_frame_bytes)

    @property
    def inflight(self) -> int:
        return len(self._pending)

    @property
    def can_send(self) -> bool:
        return not self.closed and len(self._pending) < self.max_inflight

    def version_for(self, api_key: ApiKey) -> int:
        """Highest version both sides speak; raises UnsupportedVersionError if none."""
        low, high = SUPPORTED_VERSIONS[api_key]
        if self.peer_versions is None:
            return low
        peer = self.peer_versions.get(api_key)
        if peer is None or peer[1] < low or peer[0] > high:
            raise NoCommonVersionError(api_key, low, high, peer)
        return min(high, peer[1])

    def send(self, message: Message, context: C | None = None) -> bytes:
        """Bytes of a request; ``context`` comes back on its ``ResponseReceived`` (or
        from ``close``). Its correlation id is the ``next_correlation_id`` before the
        call. A request that raises here (too large, no common version) is not kept."""
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        if len(self._pending) >= self.max_inflight:
            raise TooManyInflightError(self.max_inflight)
        cid = self.next_correlation_id
        data = encode_request(message, cid, self.version_for(message.API_KEY))
        if len(data) - 4 > self.max_frame_bytes:
            raise MessageTooLargeError(type(message).__name__, len(data) - 4,
                                       self.max_frame_bytes)
        self.next_correlation_id = 0 if cid == _INT32_MAX else cid + 1
        self._pending[cid] = _Pending(message.API_KEY, message, context)
        return data

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        self._frames.feed(data)

    def next_event(self) -> ResponseReceived[C] | ConnectionEnded | _NeedData:
        """The next response, the end of the stream, or NEED_DATA.

        Raises a WireError if the bookie broke the protocol; the connection is then
        closed, and ``close()`` gives every pending request's context to fail (the
        request whose response was malformed among them).
        """
        if self.closed:
            raise ConnectionClosedError("connection is closed")
        size = self._frames.peek_size()
        if size is None:
            return self._end_or_need()
        try:
            if size < 6:
                raise FrameSizeError(size)
            if size > self.max_frame_bytes:
                raise FrameTooLargeError(size, self.max_frame_bytes)
            frame = self._frames.take(size)
            if frame is None:
                return self._end_or_need()
            cid = struct.unpack_from(">i", frame, 0)[0]
            pending = self._pending.get(cid)
            if pending is None:
                raise UnexpectedResponseError(cid)
            decoded = decode_response(frame, pending.api_key)
        except WireError:
            self.closed = True
            raise
        del self._pending[cid]
        if isinstance(decoded.message, ApiVersionsResponse) and decoded.status == Status.OK:
            self.peer_versions = {}
            for r in decoded.message.versions:
                try:
                    self.peer_versions[ApiKey(r.api_key)] = (r.min_version, r.max_version)
                except ValueError:
                    continue  # an api this build does not know; never used
        return ResponseReceived(cid, pending.api_key, decoded.status, decoded.message,
                                pending.request, pending.context)

    def _end_or_need(self) -> ConnectionEnded | _NeedData:
        if self._frames.eof:
            # The requests stay in the table until ``close()`` hands their contexts back.
            self.closed = True
            pending = tuple((cid, p.request) for cid, p in self._pending.items())
            return ConnectionEnded(pending=pending, partial_frame=self._frames.buffered > 0)
        return NEED_DATA

    def close(self) -> list[C | None]:
        """Close the connection (no more sends or events); returns the contexts of the
        requests still waiting, in send order: none of them will be answered."""
        self.closed = True
        contexts = [p.context for p in self._pending.values()]
        self._pending.clear()
        return contexts


def api_versions_response() -> ApiVersionsResponse:
    """What a server answers to ApiVersions: every key this build serves."""
    from ledgerd.wire.messages import ApiVersionRange

    return ApiVersionsResponse(versions=tuple(
        ApiVersionRange(api_key=int(k), min_version=lo, max_version=hi)
        for k, (lo, hi) in SUPPORTED_VERSIONS.items()))
