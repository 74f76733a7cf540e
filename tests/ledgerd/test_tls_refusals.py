"""Refusing a client certificate with bad_certificate (``ledgerd.base._tls``): the
reason stays with the thread whose handshake refused it, the bookie's log keeps it as
the gateway's does, and the failed-authentication delay is bounded. (Found by review;
each test failed before its fix.)"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from pathlib import Path

import pytest
import trustme

from ledgerd.base.logs import _FIELDS_ATTR
from ledgerd.base.settings import ConfigError, load_config
from ledgerd.base.tls import server_context, take_refusal
from ledgerd.bookie_client import BookieConnectionError, open_bookie_client
from ledgerd.kafka.config import GatewayConfig
from tests.ledgerd.inproc import inprocess_cluster
from tests.ledgerd.test_tls import Pki


def _refused_handshake(tmp_path: Path) -> None:
    """One client certificate refused by a server that, like the bookie, never calls
    take_refusal."""
    ca, stranger = trustme.CA(), trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = server_context(str(tmp_path / "server.pem"), "", trust=str(tmp_path / "ca.pem"),
                            client_auth="required")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as t:
                t.sendall(b"ok")
        except ssl.SSLError:
            pass  # no take_refusal(): the bookie's negotiate() does not call it
        finally:
            conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    stranger.issue_cert("client").configure_cert(client)
    with pytest.raises(ssl.SSLError, match="BAD_CERTIFICATE"):
        with client.wrap_socket(socket.create_connection(listener.getsockname()),
                                server_hostname="127.0.0.1") as t:
            t.recv(2)
    thread.join(30)
    listener.close()


def test_a_refusal_in_one_thread_is_not_taken_by_another(tmp_path: Path) -> None:
    """take_refusal() is documented as "the last client certificate refused" for the
    handshake that just failed; a refusal in another thread (the handshake above runs in
    a worker thread) must not be reported for this one. Fix: keep _refusal in a
    threading.local (the callback runs synchronously in the thread calling
    SSL_do_handshake)."""
    take_refusal()
    _refused_handshake(tmp_path)
    assert take_refusal() is None


async def test_the_bookie_log_keeps_why_a_client_certificate_was_refused(
        zk_chroot: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before the change the bookie's tls_handshake_failed said "certificate verify
    failed: unable to get local issuer certificate"; with the callback the SSLError only
    says "certificate rejected", and appliance/security.py never calls take_refusal(),
    so the reason is lost from the bookie's log (and left in the global)."""
    caplog.set_level(logging.INFO, logger="ledgerd.appliance.security")
    pki = Pki(tmp_path)
    (tmp_path / "other").mkdir()
    other = Pki(tmp_path / "other")
    stranger_cert = other.issue("stranger")
    async with inprocess_cluster(zk_chroot, tmp_path, 1, **pki.bookie_settings(
            tls_required=True, tls_client_authentication=True)) as cluster:
        with pytest.raises(BookieConnectionError):  # (the bookie sends no alert: trio drops it)
            async with open_bookie_client(cluster.address(0),
                                          tls=pki.client(stranger_cert)):
                pass
    lines = [str(getattr(r, _FIELDS_ATTR, {})) for r in caplog.records
             if r.getMessage() == "tls_handshake_failed"]
    assert lines, [r.getMessage() for r in caplog.records]
    assert any("unable to get local issuer certificate" in x for x in lines), lines


def test_a_negative_failed_authentication_delay_is_refused() -> None:
    """trio.sleep(-0.001) raises ValueError: every SASL failure would become a
    kafka_request_failed traceback and every TLS refusal a kafka_connection_failed one;
    and a delay >= the 10 s handshake deadline (gateway.py _serve: fail_after(10)) turns
    every refused handshake into a TooSlowError with no alert sent."""
    with pytest.raises(ConfigError):
        load_config(GatewayConfig,
                    overrides={"gateway_connection_failed_authentication_delay_ms": -1})
    with pytest.raises(ConfigError):
        load_config(GatewayConfig,
                    overrides={"gateway_connection_failed_authentication_delay_ms": 10_000})


def test_only_a_standard_library_server_context_is_changed() -> None:
    """A client context, or anything that is not the standard library's own
    ``SSLContext``, is left alone (its memory is never read)."""
    from types import SimpleNamespace

    from ledgerd.base.tls import refuse_as_bad_certificate

    assert not refuse_as_bad_certificate(ssl.create_default_context())
    assert not refuse_as_bad_certificate(SimpleNamespace())  # type: ignore[arg-type]
