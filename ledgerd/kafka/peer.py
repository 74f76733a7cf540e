"""One gateway asking another to write a transaction marker (Kafka's WriteTxnMarkers).

A transaction's coordinator writes the markers of the partitions it leads itself; a
partition that another gateway leads gets its marker through that gateway, as a
Kafka broker's coordinator sends WriteTxnMarkers to each partition's leader. It uses
the small Kafka client of ``client.py``: one connection per marker, WriteTxnMarkers v0
(request header v1), the partition's error code back. The gateway that receives it
writes the marker only if it leads the partition (NOT_LEADER_OR_FOLLOWER otherwise,
and the coordinator asks again where rendezvous hashing now points).

A secure listener is met as a client meets it (``PeerAuth``): over TLS when the
gateways listen with TLS (the peer's certificate checked against the gateways' CA,
this gateway's own certificate presented for mutual TLS), and with SASL PLAIN when
they require authentication (this gateway's principal, the one its ``gateway_peer_token_file``
names in the principals file). WriteTxnMarkers needs the admin role, so that principal
(or the certificate's OU ``0:admin``) must have it. A gateway that cannot authenticate
raises PeerAuthError naming what to set; the coordinator logs it and retries.
"""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.tls import client_context
from ledgerd.errors import LedgerdError
from ledgerd.kafka.api import RESPONSES, ApiKey
from ledgerd.kafka.client import exchange, reply_body, request_frame
from ledgerd.kafka.schema import INT32, KafkaDecodeError, Reader, decode
from ledgerd.kafka.txn_coordinator import Marker

if TYPE_CHECKING:
    from ledgerd.base.tls import Principal
    from ledgerd.kafka.config import GatewayConfig

__all__ = ["PeerAuth", "PeerAuthError", "peer_auth", "send_marker"]

PEER_TIMEOUT_S = 10.0
MAX_REPLY = 1 << 20


class PeerAuthError(LedgerdError):
    """This gateway cannot authenticate to another one (a setting is missing, or the
    other gateway refused its credentials)."""


@dataclass(frozen=True)
class PeerAuth:
    """How this gateway connects to the others: ``tls`` (None: plain TCP), SASL PLAIN
    credentials (``user`` empty: none), and ``problem``, set when the listeners need
    something this gateway lacks (the text names the setting)."""

    tls: ssl.SSLContext | None = None
    user: str = ""
    password: bytes = b""
    problem: str = ""


def _request(api: ApiKey, version: int, body: dict[str, Any], correlation_id: int) -> bytes:
    return request_frame(api, version, body, correlation_id, "ledgerd-txn-coordinator")


def marker_request(marker: Marker, correlation_id: int = 1) -> bytes:
    """The framed WriteTxnMarkers v0 request for one marker."""
    return _request(ApiKey.WRITE_TXN_MARKERS, 0, {"markers": [{
        "producer_id": marker.producer_id, "producer_epoch": marker.producer_epoch,
        "transaction_result": marker.commit, "coordinator_epoch": 0,
        "topics": [{"name": marker.topic, "partition_indexes": [marker.partition]}]}]},
        correlation_id)


def marker_reply(frame: bytes, marker: Marker, correlation_id: int = 1) -> int:
    """The partition's error code in a WriteTxnMarkers v0 response (without its size
    prefix). Raises KafkaDecodeError if it is not one."""
    r = Reader(frame)
    if r.scalar(INT32, "correlation id") != correlation_id:
        raise KafkaDecodeError("WriteTxnMarkers reply to another request")
    body = decode(RESPONSES[ApiKey.WRITE_TXN_MARKERS], 0, r, "WriteTxnMarkers")
    for m in body["markers"]:
        for t in m["topics"]:
            for p in t["partitions"]:
                if t["name"] == marker.topic and p["partition_index"] == marker.partition:
                    return int(p["error_code"])
    raise KafkaDecodeError("WriteTxnMarkers reply without the partition asked for")


async def _exchange(stream: trio.abc.Stream, request: bytes, where: str) -> bytes:
    """Send one framed request and read its framed reply (without the size prefix)."""
    return await exchange(stream, request, f"gateway {where}", max_reply=MAX_REPLY)


def _reply(frame: bytes, api: ApiKey, version: int, correlation_id: int) -> dict[str, Any]:
    return reply_body(frame, api, version, correlation_id)


async def _authenticate(stream: trio.abc.Stream, auth: PeerAuth, where: str) -> None:
    """SASL PLAIN, as a Kafka client does it: SaslHandshake v1, then SaslAuthenticate."""
    got = _reply(await _exchange(stream, _request(
        ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}, 101), where),
        ApiKey.SASL_HANDSHAKE, 1, 101)
    if got["error_code"]:
        raise PeerAuthError(f"gateway {where} refused SASL PLAIN (error {got['error_code']}; "
                            f"it offers {', '.join(got['mechanisms']) or 'nothing'})")
    plain = b"\0" + auth.user.encode() + b"\0" + auth.password
    got = _reply(await _exchange(stream, _request(
        ApiKey.SASL_AUTHENTICATE, 1, {"auth_bytes": plain}, 102), where),
        ApiKey.SASL_AUTHENTICATE, 1, 102)
    if got["error_code"]:
        raise PeerAuthError(f"gateway {where} refused this gateway's credentials (principal "
                            f"{auth.user!r} of gateway_peer_token_file): "
                            f"{got['error_message'] or got['error_code']}")


async def send_marker(host: str, port: int, marker: Marker,
                      auth: PeerAuth = PeerAuth()) -> int:
    """Ask the gateway at ``host:port`` to write ``marker``: its error code (0: written).
    Raises PeerAuthError if this gateway cannot authenticate to it, OSError /
    trio.BrokenResourceError / KafkaDecodeError / ssl.SSLError if it cannot be asked,
    trio.TooSlowError after PEER_TIMEOUT_S. If cancelled, the marker may have been
    written (writing it again is harmless)."""
    if auth.problem:
        raise PeerAuthError(auth.problem)
    where = f"{host}:{port}"
    with trio.fail_after(PEER_TIMEOUT_S):
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if auth.tls is not None:
            stream = trio.SSLStream(stream, auth.tls, server_hostname=host)
        async with stream:
            if auth.user:
                await _authenticate(stream, auth, where)
            return marker_reply(await _exchange(stream, marker_request(marker), where), marker)


def peer_auth(config: GatewayConfig, tokens: dict[str, Principal] | None) -> PeerAuth:
    """How this gateway reaches the others, from its own listener's settings (every
    gateway of a cluster listens alike): TLS if it listens with TLS, SASL PLAIN as the
    principal of ``auth_token_file`` if it requires authentication (``tokens``: its
    principals file, by token digest). Raises ConfigError for an unreadable token file."""
    tls = None
    problems = []
    if config.gateway_tls_certificate_path:
        trust = config.gateway_tls_trust_path or config.tls_trust_path
        if not trust:
            problems.append("the gateways listen with TLS, so gateway_tls_trust_path (or "
                            "tls_trust_path) must name the CA of their certificates for "
                            "one gateway to reach another")
        else:
            tls = client_context(trust, certificate=config.gateway_tls_certificate_path,
                                 key=config.gateway_tls_key_path,
                                 verify_hostname=config.tls_hostname_verification,
                                 protocols=config.tls_enabled_protocols)
    user, password = "", b""
    if tokens is not None:
        token = config.peer_token()
        principal = tokens.get(hashlib.sha256(token).hexdigest()) if token else None
        if principal is not None:
            user, password = principal.name, token or b""
        elif tls is None or config.gateway_tls_client_auth == "none":
            # (with client certificates asked for, this gateway's own certificate may
            # prove an admin principal: the other gateway decides)
            problems.append("the gateways require authentication, so gateway_peer_token_file "
                            "(or auth_token_file) must hold the token of a principal of "
                            "gateway_principals_file with the admin role for one gateway "
                            "to reach another"
                            + ("" if token is None else " (its token is not in that file)"))
    return PeerAuth(tls=tls, user=user, password=password, problem="; ".join(problems))
