"""How a gateway reaches the others to write transaction markers (``peer.peer_auth``):
what its own listener requires, it must be able to give; what it lacks is named by the
setting to set, before any connection is tried."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from ledgerd.base.tls import Principal
from ledgerd.kafka.config import GatewayConfig
from ledgerd.kafka.peer import PeerAuthError, peer_auth, send_marker
from ledgerd.kafka.txn_coordinator import Marker

MARKER = Marker(topic="t", partition=0, producer_id=1, producer_epoch=0, commit=True)


def _tokens(name: str, token: bytes) -> dict[str, Principal]:
    return {hashlib.sha256(token).hexdigest(): Principal(name, frozenset({"admin"}))}


def test_a_plain_listener_needs_nothing() -> None:
    auth = peer_auth(GatewayConfig(), None)
    assert auth.tls is None and not auth.user and not auth.problem


def test_a_tls_listener_without_a_trust_path_names_it() -> None:
    auth = peer_auth(GatewayConfig(gateway_tls_certificate_path="/nonexistent.pem"), None)
    assert "gateway_tls_trust_path" in auth.problem
    with pytest.raises(PeerAuthError, match="gateway_tls_trust_path"):
        trio.run(send_marker, "127.0.0.1", 1, MARKER, auth)


def test_required_authentication_uses_the_peer_token_principal(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("s3cret\n")
    auth = peer_auth(GatewayConfig(gateway_peer_token_file=str(tmp_path / "tok")),
                     _tokens("gateways", b"s3cret"))
    assert (auth.user, auth.password, auth.problem) == ("gateways", b"s3cret", "")


def test_required_authentication_without_a_known_token_names_the_setting(
        tmp_path: Path) -> None:
    missing = peer_auth(GatewayConfig(), _tokens("gateways", b"s3cret"))
    assert "gateway_peer_token_file" in missing.problem
    (tmp_path / "tok").write_text("other\n")
    unknown = peer_auth(GatewayConfig(gateway_peer_token_file=str(tmp_path / "tok")),
                        _tokens("gateways", b"s3cret"))
    assert "not in that file" in unknown.problem
