"""Errors of the wire package: one root, leaves named for what the peer got wrong.

Whose fault it is is in the type, as in h11: what decoding untrusted bytes can raise is a
:class:`RemoteProtocolError` (close the one connection that sent it, keep serving the
others); what our own sends can raise is a :class:`LocalProtocolError` (that call fails,
the connection is fine). The status errors
(a bookie answered with a non-OK status) live in :mod:`wire.status`.
"""

from __future__ import annotations

from ledgerd.base.errors import LedgerdError

__all__ = [
    "ConnectionClosedError",
    "DecompressionError",
    "DigestMismatchError",
    "EntryCountMismatchError",
    "EntryFormatError",
    "FrameSizeError",
    "FrameTooLargeError",
    "LocalProtocolError",
    "MalformedBodyError",
    "MessageTooLargeError",
    "NoCommonVersionError",
    "RemoteProtocolError",
    "TooManyInflightError",
    "TruncatedFrameError",
    "UnencodableMessageError",
    "UnexpectedResponseError",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "WireError",
]


class WireError(LedgerdError):
    """Root of every error of the protocol package (and of bookie statuses, ``wire.status``)."""


class LocalProtocolError(WireError):
    """We broke the protocol (a bug, or a request that cannot be sent): nothing was sent,
    the connection is intact, and only the call that raised it failed."""


class RemoteProtocolError(WireError):
    """The peer broke the protocol: close that connection; the others keep serving."""


class FrameSizeError(RemoteProtocolError):
    """A frame's size field is negative or too small to hold a header."""

    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"frame size {size} is not valid (negative or shorter than its header)")


class FrameTooLargeError(RemoteProtocolError):
    """A frame's size field is over ``max_frame_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds max_frame_bytes={limit}")


class TruncatedFrameError(RemoteProtocolError):
    """A body ended before a field it declares (the frame is shorter than its contents)."""

    def __init__(self, what: str, needed: int, available: int) -> None:
        self.what = what
        self.needed = needed
        self.available = available
        super().__init__(f"{what}: needs {needed} bytes, only {available} left in the frame")


class MalformedBodyError(RemoteProtocolError):
    """A body's bytes do not match its declared layout (trailing bytes, bad values)."""


class EntryCountMismatchError(MalformedBodyError):
    """An array's count disagrees with the bytes that follow it."""

    def __init__(self, what: str, count: int, reason: str) -> None:
        self.what = what
        self.count = count
        super().__init__(f"{what}: count {count} disagrees with the frame: {reason}")


class UnknownApiKeyError(RemoteProtocolError):
    """A request names an api key this side does not know."""

    def __init__(self, api_key: int) -> None:
        self.api_key = api_key
        super().__init__(f"unknown api key {api_key}")


class UnsupportedVersionError(RemoteProtocolError):
    """A request names a version of a known api outside the supported range."""

    def __init__(self, api_key: int, version: int, low: int, high: int) -> None:
        self.api_key = api_key
        self.version = version
        super().__init__(f"api key {api_key} version {version} unsupported (supported {low}..{high})")


class UnexpectedResponseError(RemoteProtocolError):
    """A response carries a correlation id with no request in flight."""

    def __init__(self, correlation_id: int) -> None:
        self.correlation_id = correlation_id
        super().__init__(f"response for correlation id {correlation_id}, which is not in flight")


class TooManyInflightError(LocalProtocolError):
    """The caller tried to send past the connection's in-flight cap (a local bug, not the peer's)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"{limit} requests already in flight on this connection")


class ConnectionClosedError(LocalProtocolError):
    """The connection was closed after a protocol error; nothing more can be sent or read."""


class EntryFormatError(RemoteProtocolError):
    """Entry bytes are too short for their header and digest, or carry bad ids."""


class DigestMismatchError(RemoteProtocolError):
    """An entry's digest does not match its bytes; the reader should try another replica."""

    def __init__(self, ledger_id: int, entry_id: int, digest_type: str) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.digest_type = digest_type
        super().__init__(
            f"digest mismatch for ledger {ledger_id} entry {entry_id} ({digest_type})")


class DecompressionError(RemoteProtocolError):
    """A compressed payload is corrupt or would decompress beyond the allowed size."""


class MessageTooLargeError(LocalProtocolError):
    """A message we were asked to send encodes to more than the frame limit; not sent."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"{what} needs a {size}-byte frame; the limit is {limit} bytes "
                         "(max_frame_bytes)")


class UnencodableMessageError(LocalProtocolError):
    """A message's fields cannot be encoded (a value out of its field's range)."""


class NoCommonVersionError(LocalProtocolError):
    """The peer speaks no version of an api that we speak; the request was not sent."""

    def __init__(self, api_key: int, low: int, high: int, peer: tuple[int, int] | None) -> None:
        self.api_key = api_key
        theirs = f"{peer[0]}..{peer[1]}" if peer else "none"
        super().__init__(f"api key {api_key}: we speak versions {low}..{high}, the peer {theirs}")
