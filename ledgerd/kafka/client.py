"""A small Kafka client: one connection, one request at a time, the gateway's own schemas.

What the gateways use to reach each other (``peer.py``: WriteTxnMarkers) and what the
Kafka-style command-line tools use to reach a gateway (``tools/kafka_tools.py``:
kafka-topics, kafka-acls, kafka-configs). Requests and responses are written and read
with the declarations the gateway serves them by (``api.py``, ``schema.py``), so the two
sides share one layout.

- **Framing** (Kafka's): a 4-byte size, then the header and body. Request header v1
  (api key, version, correlation id, client id), v2 (v1 + empty tagged fields) when the
  body's version is flexible; response header v0 (the correlation id), v1 (+ tagged
  fields) when flexible, except ApiVersions' (always v0). A reply larger than
  ``max_reply`` bytes is refused before it is read (a peer cannot grow the buffer).
- **Versions**: ``KafkaConnection.open`` asks ApiVersions v0 first and ``call`` then uses,
  per API, the highest version both this module's declarations and the server serve;
  ``KafkaClientError`` names the API when there is none.
- **Security** (``ClientSecurity``): plain TCP or TLS (a client context of
  ``base/tls.py``), and SASL PLAIN after the handshake when a user is set.
"""

from __future__ import annotations

import ssl
import struct
from dataclasses import dataclass, field
from typing import Any

import trio

from ledgerd.errors import LedgerdError
from ledgerd.kafka.api import (
    DECLARED,
    REQUEST_HEADER,
    REQUESTS,
    RESPONSES,
    SUPPORTED,
    ApiKey,
    ErrorCode,
)
from ledgerd.kafka.schema import INT32, KafkaDecodeError, Reader, decode, encode

__all__ = [
    "ClientSecurity", "KafkaClientError", "KafkaConnection", "SaslRefusedError", "exchange",
    "reply_body", "request_frame",
]

_SIZE = struct.Struct(">i")
MAX_REPLY = 64 << 20


class KafkaClientError(LedgerdError):
    """The server cannot be asked what was wanted (no common API version, a reply that
    is not the answer to the request)."""


class SaslRefusedError(KafkaClientError):
    """The server refused the SASL mechanism or the credentials."""


@dataclass(frozen=True)
class ClientSecurity:
    """How to connect: ``tls`` (None: plain TCP) and SASL PLAIN credentials (``user``
    empty: no SASL)."""

    tls: ssl.SSLContext | None = None
    user: str = ""
    password: bytes = field(default=b"", repr=False)


def request_frame(api: ApiKey, version: int, body: dict[str, Any], correlation_id: int,
                  client_id: str) -> bytes:
    """The framed request: size, header (v2 when the body's version is flexible), body."""
    pieces = encode(REQUEST_HEADER, 1, {
        "api_key": int(api), "api_version": version,
        "correlation_id": correlation_id, "client_id": client_id})
    if REQUESTS[api].is_flexible(version):
        pieces.append(b"\x00")  # the header's tagged fields: none
    payload = b"".join([*pieces, *encode(REQUESTS[api], version, body)])
    return _SIZE.pack(len(payload)) + payload


def reply_body(frame: bytes, api: ApiKey, version: int, correlation_id: int) -> dict[str, Any]:
    """The decoded response in ``frame`` (without its size prefix). Raises
    KafkaDecodeError if it does not parse or answers another request."""
    r = Reader(frame)
    if r.scalar(INT32, "correlation id") != correlation_id:
        raise KafkaDecodeError(f"{api.name} reply to another request")
    if RESPONSES[api].is_flexible(version) and api is not ApiKey.API_VERSIONS:
        r.skip_tags("response header")
    return decode(RESPONSES[api], version, r, api.name)


async def exchange(stream: trio.abc.Stream, request: bytes, where: str,
                   max_reply: int = MAX_REPLY) -> bytes:
    """Send one framed request and read its framed reply (returned without the size
    prefix). Raises KafkaDecodeError for a reply size outside 4..max_reply and
    trio.BrokenResourceError when the server closes the connection first."""
    await stream.send_all(request)
    buf = bytearray()
    size = -1
    while size < 0 or len(buf) < 4 + size:
        data = await stream.receive_some(65536)
        if not data:
            raise trio.BrokenResourceError(f"{where} closed the connection")
        buf += data
        if size < 0 and len(buf) >= 4:
            size = _SIZE.unpack_from(buf)[0]
            if not 4 <= size <= max_reply:  # checked before the size is used
                raise KafkaDecodeError(f"a reply of {size} bytes from {where} (at least 4, "
                                       f"at most {max_reply} are read)")
    return bytes(buf[4:4 + size])


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class KafkaConnection:
    """One open connection to a Kafka server (a gateway, or Kafka itself)."""

    def __init__(self, stream: trio.abc.Stream, where: str, client_id: str) -> None:
        self.stream = stream
        self.where = where
        self.client_id = client_id
        self.versions: dict[ApiKey, tuple[int, int]] = {}
        self._cid = 0

    @classmethod
    async def open(cls, host: str, port: int, security: ClientSecurity = ClientSecurity(),
                   *, client_id: str = "ledgerd-tools",
                   negotiate: bool = True) -> KafkaConnection:
        """Connect (TLS and SASL PLAIN as ``security`` says) and, when ``negotiate``,
        learn the server's API versions. The caller closes it (``aclose``; or
        ``async with``)."""
        where = f"{host}:{port}"
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        try:
            if security.tls is not None:
                stream = trio.SSLStream(stream, security.tls, server_hostname=host)
                await stream.do_handshake()
            conn = cls(stream, where, client_id)
            if negotiate:
                got = await conn.call(ApiKey.API_VERSIONS, {}, version=0)
                if got["error_code"]:
                    raise KafkaClientError(f"{where} refused ApiVersions "
                                           f"(error {got['error_code']})")
                conn.versions = {ApiKey(k["api_key"]): (k["min_version"], k["max_version"])
                                 for k in got["api_keys"]
                                 if k["api_key"] in ApiKey._value2member_map_}
            if security.user:
                await conn._sasl_plain(security)
            return conn
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def __aenter__(self) -> KafkaConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def version_of(self, api: ApiKey) -> int:
        """The highest version of ``api`` both sides serve."""
        ours = SUPPORTED.get(api) or DECLARED.get(api)
        theirs = self.versions.get(api)
        if ours is None:
            raise KafkaClientError(f"{api.name} is not declared in ledgerd.kafka.api")
        if theirs is None:
            if not self.versions:  # not negotiated: the lowest version we declare
                return ours[0]
            raise KafkaClientError(f"{self.where} does not serve {api.name}")
        low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
        if low > high:
            raise KafkaClientError(f"{self.where} serves {api.name} {theirs[0]}-{theirs[1]}, "
                                   f"this client {ours[0]}-{ours[1]}: no version in common")
        return high

    async def call(self, api: ApiKey, body: dict[str, Any], *,
                   version: int | None = None) -> dict[str, Any]:
        """Send ``body`` as ``api`` (at ``version``, or the highest both serve) and
        return the decoded reply."""
        v = self.version_of(api) if version is None else version
        self._cid += 1
        frame = await exchange(self.stream, request_frame(api, v, body, self._cid,
                                                          self.client_id), self.where)
        return reply_body(frame, api, v, self._cid)

    async def _sasl_plain(self, security: ClientSecurity) -> None:
        got = await self.call(ApiKey.SASL_HANDSHAKE, {"mechanism": "PLAIN"}, version=1)
        if got["error_code"]:
            raise SaslRefusedError(f"{self.where} refused SASL PLAIN "
                                   f"({_code_name(got['error_code'])}; it offers "
                                   f"{', '.join(got['mechanisms']) or 'nothing'})")
        plain = b"\0" + security.user.encode() + b"\0" + security.password
        got = await self.call(ApiKey.SASL_AUTHENTICATE, {"auth_bytes": plain}, version=1)
        if got["error_code"]:
            raise SaslRefusedError(f"{self.where} refused the credentials of "
                                   f"{security.user!r}: {_code_name(got['error_code'])}"
                                   + (f": {got['error_message']}" if got["error_message"]
                                      else ""))
