"""A bookie's connection security: TLS by START_TLS, principals, authorization.

Built once from the configuration (a bad file or setting stops the start with one line
naming it). ``negotiate`` runs before a connection is served: a first request of
START_TLS is answered OK in clear and the socket becomes a ``trio.SSLStream`` (the
principal comes from the client certificate); any other first request is refused with
TLS_REQUIRED when TLS is required, and otherwise served in plaintext as the anonymous
principal. START_TLS later on a connection is a BAD_REQUEST: the upgrade is only ever
the first thing said, so no plaintext reply can follow a TLS one.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from dataclasses import dataclass, field
from typing import Any

import trio

from ledgerd.appliance.authz import parse_roles
from ledgerd.appliance.config import BookieConfig
from ledgerd.appliance.metrics import BookieMetrics
from ledgerd.base.logs import fields
from ledgerd.base.principals import load_principals
from ledgerd.base.tls import (
    ANONYMOUS,
    Principal,
    ReloadingContext,
    principal_of,
    server_context,
    take_refusal,
)
from ledgerd.wire.connection import NEED_DATA, RequestRejected, ServerConnection
from ledgerd.wire.frames import DecodedRequest
from ledgerd.wire.messages import ApiKey, AuthRequest, AuthResponse, Message, StartTlsResponse
from ledgerd.wire.status import Status

__all__ = ["ConnectionSecurity", "Negotiated", "load_principals", "negotiate"]

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_S = 10.0  # BookKeeper's startTLSTimeoutSecs
_RECEIVE = 64 * 1024


@dataclass
class ConnectionSecurity:
    contexts: ReloadingContext | None  # None: TLS off
    required: bool = False
    authorization: bool = False
    anonymous: Principal = ANONYMOUS
    tokens: dict[str, Principal] = field(default_factory=dict)  # sha256 hex -> principal

    def authenticate(self, req: AuthRequest) -> tuple[int, Message | None, Principal | None]:
        """AUTH: (status, reply, principal). BAD_REQUEST without a principals file or for
        another mechanism; UNAUTHORIZED for a token nobody has."""
        if not self.tokens or req.mechanism != b"token":
            return Status.BAD_REQUEST, None, None
        principal = self.tokens.get(hashlib.sha256(req.token).hexdigest())
        if principal is None:
            return Status.UNAUTHORIZED, None, None
        return Status.OK, AuthResponse(principal=principal.name.encode()), principal

    @classmethod
    def from_config(cls, config: BookieConfig) -> ConnectionSecurity:
        contexts = None
        if config.tls_certificate_path:
            auth = ("required" if config.tls_client_authentication
                    else "optional" if config.tls_trust_path else "none")

            def build() -> ssl.SSLContext:
                return server_context(
                    config.tls_certificate_path, config.tls_key_path,
                    trust=config.tls_trust_path, client_auth=auth,
                    protocols=config.tls_enabled_protocols,
                    ciphers=config.tls_enabled_cipher_suites)

            def failed(exc: Exception) -> None:
                log.error("tls_reload_failed", extra=fields(error=str(exc)))

            contexts = ReloadingContext(
                build, (config.tls_certificate_path, config.tls_key_path, config.tls_trust_path),
                float(config.tls_cert_refresh_seconds), failed)
        roles = parse_roles(config.anonymous_roles, "anonymous_roles")
        tokens = load_principals(config.principals_file) if config.principals_file else {}
        return cls(contexts, config.tls_required, config.authorization_enabled,
                   Principal("anonymous", roles), tokens)

    @property
    def tls(self) -> bool:
        return self.contexts is not None

    @property
    def active(self) -> bool:
        """Anything to do before serving a connection."""
        return self.contexts is not None or self.required


@dataclass
class Negotiated:
    stream: trio.abc.Stream
    principal: Principal
    first: Any = None  # the first event, when it was not START_TLS: the server handles it
    closed: bool = False                 # refused (TLS_REQUIRED, failed handshake)


async def negotiate(stream: trio.abc.Stream, conn: ServerConnection,
                    security: ConnectionSecurity, metrics: BookieMetrics,
                    peer: str) -> Negotiated:
    """Read the connection's first request and settle TLS (see the module docstring)."""
    with trio.move_on_after(HANDSHAKE_TIMEOUT_S * 3):  # a peer that says nothing at all
        while True:
            ev = conn.next_event()
            if ev is not NEED_DATA:
                break
            try:
                data = await stream.receive_some(_RECEIVE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return Negotiated(stream, security.anonymous, closed=True)
            conn.receive_data(data)
            if not data:
                ev = conn.next_event()
                break
    if ev is NEED_DATA:  # timed out
        return Negotiated(stream, security.anonymous, closed=True)
    if type(ev) is not DecodedRequest or ev.api_key != ApiKey.START_TLS:
        if not isinstance(ev, (DecodedRequest, RequestRejected)):  # the end
            return Negotiated(stream, security.anonymous, closed=True)
        if security.required:
            return await _refuse(stream, conn, ev.correlation_id, metrics, peer)
        return Negotiated(stream, security.anonymous, first=ev)  # served in plaintext
    if security.contexts is None:
        await _send(stream, conn.send(ev.correlation_id, Status.BAD_REQUEST, None))
        return Negotiated(stream, security.anonymous)
    if conn.buffered:  # bytes after START_TLS, before our answer: not a TLS client
        log.info("tls_refused", extra=fields(peer=peer, reason="data after START_TLS"))
        metrics.tls_failures += 1
        return Negotiated(stream, security.anonymous, closed=True)
    if not await _send(stream, conn.send(ev.correlation_id, Status.OK, StartTlsResponse())):
        return Negotiated(stream, security.anonymous, closed=True)
    tls = trio.SSLStream(stream, security.contexts.current(), server_side=True)
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await tls.do_handshake()
    except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
        metrics.tls_failures += 1
        refusal = take_refusal()  # why a client certificate was refused, if it was
        log.info("tls_handshake_failed", extra=fields(
            peer=peer, error=str(cause or exc), **({"certificate": refusal} if refusal else {})))
        return Negotiated(tls, security.anonymous, closed=True)
    metrics.tls_handshakes += 1
    cert = tls.getpeercert()
    principal = principal_of(cert) if cert else security.anonymous
    log.debug("tls_established", extra=fields(peer=peer, principal=principal.name,
                                               version=tls.version()))
    return Negotiated(tls, principal)


async def _send(stream: trio.abc.Stream, data: bytes) -> bool:
    try:
        await stream.send_all(data)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False


async def _refuse(stream: trio.abc.Stream, conn: ServerConnection, cid: int,
                  metrics: BookieMetrics, peer: str) -> Negotiated:
    metrics.tls_failures += 1
    log.info("tls_required_refused", extra=fields(peer=peer))
    await _send(stream, conn.send(cid, Status.TLS_REQUIRED, None))
    return Negotiated(stream, ANONYMOUS, closed=True)
