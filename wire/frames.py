"""Whole frames: header + body, encoded with the derived codecs.

``encode_request``/``encode_response`` build complete frames (size prefix included);
``decode_request``/``decode_response`` take a frame *without* its size prefix (the
connection has already cut it out) and raise only :class:`wire.errors.WireError`.
The ``construct_*`` twins do the same through construct, for tests and tools.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ledgerd.wire import layouts
from ledgerd.wire.codec import construct_decode, construct_encode, fast_codec
from ledgerd.wire.errors import (
    FrameSizeError,
    MalformedBodyError,
    TruncatedFrameError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from ledgerd.wire.messages import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    SUPPORTED_VERSIONS,
    AddRequest,
    ApiKey,
    Message,
)
from ledgerd.wire.status import Status

__all__ = [
    "REQUEST_HEADER_SIZE",
    "RESPONSE_HEADER_SIZE",
    "DecodedRequest",
    "DecodedResponse",
    "add_request",
    "construct_encode_request",
    "construct_encode_response",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "request_header",
]

_REQ = struct.Struct(">ihhi")
_RESP = struct.Struct(">iih")
_REQ_AFTER_SIZE = struct.Struct(">hhi")
_RESP_AFTER_SIZE = struct.Struct(">ih")
REQUEST_HEADER_SIZE = _REQ.size
RESPONSE_HEADER_SIZE = _RESP.size
assert REQUEST_HEADER_SIZE == layouts.REQUEST_HEADER.sizeof()
assert RESPONSE_HEADER_SIZE == layouts.RESPONSE_HEADER.sizeof()

_API_KEYS = {int(k): k for k in ApiKey}
_REQ_ENCODERS = {cls: (cls.API_KEY, fast_codec(cls).encode_request)
                 for cls in REQUEST_TYPES.values()}
_RESP_ENCODERS = {cls: fast_codec(cls).encode_response for cls in RESPONSE_TYPES.values()}
# api key -> (ApiKey, lowest version, highest version, body decoder)
_REQ_TABLE = {int(key): (key, *SUPPORTED_VERSIONS[key], fast_codec(cls).decode)
              for key, cls in REQUEST_TYPES.items()}
_RESP_DECODERS = {key: fast_codec(cls).decode for key, cls in RESPONSE_TYPES.items()}


# Decoded frames are NamedTuples rather than dataclasses: one is built per frame on the
# hot path, and a tuple costs a tenth of a frozen dataclass.
class DecodedRequest(NamedTuple):
    correlation_id: int
    api_key: ApiKey
    api_version: int
    message: Message


class DecodedResponse(NamedTuple):
    correlation_id: int
    status: int
    message: Message | None


def encode_request(msg: Message, correlation_id: int, api_version: int = 0) -> bytes:
    """A complete request frame for ``msg``."""
    try:
        api_key, encode = _REQ_ENCODERS[type(msg)]
        return encode(msg, api_key, api_version, correlation_id)
    except KeyError:
        raise MalformedBodyError(f"{type(msg).__name__} is not a request") from None
    except (struct.error, TypeError) as exc:
        raise MalformedBodyError(f"cannot encode {msg!r}: {exc}") from exc


def encode_response(correlation_id: int, status: int, msg: Message | None) -> bytes:
    """A complete response frame; ``msg`` None gives an empty body (errors only)."""
    try:
        if msg is None:
            return _RESP.pack(6, correlation_id, status)
        return _RESP_ENCODERS[type(msg)](msg, correlation_id, status)
    except KeyError:
        raise MalformedBodyError(f"{type(msg).__name__} is not a response") from None
    except (struct.error, TypeError) as exc:
        raise MalformedBodyError(f"cannot encode {msg!r}: {exc}") from exc


_ADD_OK = struct.Struct(">iihqqi")


def encode_add_response(correlation_id: int, status: int, ledger_id: int, first_entry_id: int,
                        count: int) -> bytes:
    """An AddResponse frame without building the message (the bookie's hot path);
    byte-identical to ``encode_response`` with an AddResponse (tested)."""
    return _ADD_OK.pack(_ADD_OK.size - 4, correlation_id, status, ledger_id, first_entry_id,
                        count)


_ADD_NEW = object.__new__
(_SET_LEDGER, _SET_FIRST, _SET_FLAGS, _SET_KEY, _SET_TERM, _SET_ENTRIES) = (
    AddRequest.__dict__[name].__set__ for name in (
        "ledger_id", "first_entry_id", "flags", "master_key", "term", "entries"))


def add_request(ledger_id: int, first_entry_id: int, flags: int, master_key: bytes,
                term: int, entries: tuple[bytes, ...]) -> AddRequest:
    """An AddRequest built as the decoder builds one, through its slots (a third of the
    dataclass ``__init__``'s cost; the bookie's hot path): the caller vouches for what
    ``__post_init__`` would check, a ``MASTER_KEY_SIZE``-byte key."""
    m: AddRequest = _ADD_NEW(AddRequest)
    _SET_LEDGER(m, ledger_id)
    _SET_FIRST(m, first_entry_id)
    _SET_FLAGS(m, flags)
    _SET_KEY(m, master_key)
    _SET_TERM(m, term)
    _SET_ENTRIES(m, entries)
    return m


def request_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a frame without its size prefix."""
    if len(frame) < _REQ_AFTER_SIZE.size:
        raise FrameSizeError(len(frame))
    api_key, api_version, correlation_id = _REQ_AFTER_SIZE.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def check_version(api_key: int, api_version: int) -> ApiKey:
    """The ApiKey for a supported (key, version); raises UnknownApiKey/UnsupportedVersion."""
    key = _API_KEYS.get(api_key)
    if key is None:
        raise UnknownApiKeyError(api_key)
    low, high = SUPPORTED_VERSIONS[key]
    if not low <= api_version <= high:
        raise UnsupportedVersionError(api_key, api_version, low, high)
    return key


def decode_request(frame: bytes) -> DecodedRequest:
    """Decode a request frame (without its size prefix). Raises WireError only."""
    if len(frame) < 8:
        raise FrameSizeError(len(frame))
    api_key, api_version, correlation_id = _REQ_AFTER_SIZE.unpack_from(frame, 0)
    entry = _REQ_TABLE.get(api_key)
    if entry is None:
        raise UnknownApiKeyError(api_key)
    key, low, high, decode = entry
    if not low <= api_version <= high:
        raise UnsupportedVersionError(api_key, api_version, low, high)
    return DecodedRequest(correlation_id, key, api_version, decode(frame, 8, len(frame)))


def decode_response(frame: bytes, api_key: ApiKey) -> DecodedResponse:
    """Decode a response frame (without size prefix) to a request of ``api_key``.

    A non-OK status with an empty body gives ``message=None``.
    """
    if len(frame) < _RESP_AFTER_SIZE.size:
        raise TruncatedFrameError("response header", _RESP_AFTER_SIZE.size, len(frame))
    correlation_id, status = _RESP_AFTER_SIZE.unpack_from(frame, 0)
    if status != Status.OK and len(frame) == _RESP_AFTER_SIZE.size:
        return DecodedResponse(correlation_id, status, None)
    return DecodedResponse(correlation_id, status, _RESP_DECODERS[api_key](frame, 6, len(frame)))


def construct_encode_request(msg: Message, correlation_id: int, api_version: int = 0) -> bytes:
    body = construct_encode(msg)
    header = layouts.REQUEST_HEADER.build(
        {"size": len(body) + 8, "api_key": msg.API_KEY, "api_version": api_version,
         "correlation_id": correlation_id})
    return bytes(header) + body


def construct_encode_response(correlation_id: int, status: int, msg: Message | None) -> bytes:
    body = b"" if msg is None else construct_encode(msg)
    header = layouts.RESPONSE_HEADER.build(
        {"size": len(body) + 6, "correlation_id": correlation_id, "status": status})
    return bytes(header) + body


def construct_decode_request(frame: bytes) -> DecodedRequest:
    """decode_request through construct (slow reference)."""
    api_key, api_version, correlation_id = request_header(frame)
    key = check_version(api_key, api_version)
    return DecodedRequest(correlation_id, key, api_version,
                          construct_decode(REQUEST_TYPES[key], frame[8:]))
