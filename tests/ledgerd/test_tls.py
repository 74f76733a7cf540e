"""TLS on the bookie protocol (START_TLS), principals and roles, with trustme certificates.

Real bookies in the test's trio loop (real sockets, real ZooKeeper); the client and the
bookie build their contexts from PEM files as in production.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import trustme

import ledgerd
from ledgerd.base.logs import _FIELDS_ATTR
from ledgerd.base.tls import (
    RECEIVE_BYTES,
    TLS_DRAIN_BYTES,
    TLS_RECORD_BYTES,
    Principal,
    TlsConfigError,
    client_context,
    principal_of,
    receive_available,
    server_context,
)
from ledgerd.bookie_client import BookieConnectionError, open_bookie_client
from ledgerd.wire.entry import Digester, DigestType, encode_entry
from ledgerd.wire.messages import (
    AddFlags,
    AddRequest,
    AdminStatusRequest,
    GetBookieInfoRequest,
    ReadRangeRequest,
)
from ledgerd.wire.status import Status
from tests.ledgerd.inproc import inprocess_cluster

KEY = b"k" * 20


class Pki:
    """A CA and PEM files for a bookie certificate and client certificates."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.ca = trustme.CA()
        self.ca_path = str(base / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        self.bookie = self.issue("bookie", "127.0.0.1", "localhost", ou="0:bookie,recovery")

    def issue(self, name: str, *hosts: str, ou: str | None = None, ca: Any = None,
              **kw: Any) -> tuple[str, str]:
        cert = (ca or self.ca).issue_cert(*(hosts or (f"{name}.example",)), common_name=name,
                                          organization_unit_name=ou, **kw)
        chain, key = self.base / f"{name}.pem", self.base / f"{name}.key"
        chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key))
        return str(chain), str(key)

    def bookie_settings(self, **more: Any) -> dict[str, Any]:
        return {"tls_certificate_path": self.bookie[0], "tls_key_path": self.bookie[1],
                "tls_trust_path": self.ca_path, **more}

    def client(self, cert: tuple[str, str] | None = None) -> Any:
        return client_context(self.ca_path, certificate=cert[0] if cert else "",
                              key=cert[1] if cert else "")


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def _add(ledger: int, entry: int, flags: int = 0) -> AddRequest:
    body = encode_entry(Digester(DigestType.CRC32C), ledger, entry, entry - 1, 0,
                        b"e%d" % entry)
    return AddRequest(ledger_id=ledger, first_entry_id=entry, flags=flags, master_key=KEY,
                      term=0, entries=(body,))


async def test_round_trip_through_a_tls_only_cluster(pki: Pki, zk_chroot: str,
                                                     tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 3,
                                 **pki.bookie_settings(tls_required=True)) as cluster:
        async with ledgerd.open_client(zk_chroot, tls_trust_path=pki.ca_path,
                                       throttle=0) as client:
            lh = await client.create_ledger(3, 2, 2, password=b"pw")
            await lh.append_many([b"over tls %d" % i for i in range(200)])
            await lh.close()
            rh = await client.open_ledger(lh.ledger_id, b"pw")
            assert [e.payload async for e in rh.read()] == [b"over tls %d" % i
                                                           for i in range(200)]
        assert all(b.metrics.tls_handshakes >= 1 for b in cluster.bookies)

        # Plaintext to a TLS-only bookie: a clear refusal, not silence.
        with pytest.raises(BookieConnectionError, match=r"requires TLS .tls_required.: set "
                                                        r"tls_trust_path"):
            async with open_bookie_client(cluster.address(0)):
                pass
        assert cluster.bookies[0].metrics.tls_failures >= 1


async def test_wrong_ca_wrong_host_and_expired_certificates_fail_clearly(
        pki: Pki, zk_chroot: str, tmp_path: Path) -> None:
    async with inprocess_cluster(zk_chroot, tmp_path, 1, **pki.bookie_settings()) as cluster:
        address = cluster.address(0)
        (tmp_path / "other").mkdir()
        other = Pki(tmp_path / "other")
        with pytest.raises(BookieConnectionError,
                           match=r"TLS handshake failed: the bookie's certificate did not "
                                 r"verify .self-signed certificate in certificate chain.: is "
                                 "tls_trust_path the CA"):
            async with open_bookie_client(address, tls=other.client()):
                pass
        # Plaintext still works on a bookie that does not require TLS.
        async with open_bookie_client(address) as c:
            status, _ = await c.call(GetBookieInfoRequest())
            assert status == Status.OK

    # A bookie whose certificate names another host; then one whose certificate expired.
    for name, hosts, kw, needle in [
            ("elsewhere", ("elsewhere.example",), {}, "IP address mismatch"),
            ("expired", ("127.0.0.1",), {
                "not_before": datetime.datetime(2020, 1, 1),
                "not_after": datetime.datetime(2021, 1, 1)}, "certificate has expired")]:
        cert = pki.issue(name, *hosts, **kw)
        async with inprocess_cluster(zk_chroot, tmp_path / name, 1,
                                     tls_certificate_path=cert[0],
                                     tls_key_path=cert[1]) as cluster:
            with pytest.raises(BookieConnectionError, match=f"TLS handshake failed: .*{needle}"):
                async with open_bookie_client(cluster.address(0), tls=pki.client()):
                    pass


async def test_roles_from_client_certificates(pki: Pki, zk_chroot: str, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ledgerd.appliance.server")
    writer = pki.issue("app-writer", ou="0:client")
    auditor = pki.issue("auditor", ou="0:recovery")
    operator = pki.issue("ops", ou="0:admin;1:cluster-a")
    settings = pki.bookie_settings(tls_required=True, tls_client_authentication=True,
                                   authorization_enabled=True)
    async with inprocess_cluster(zk_chroot, tmp_path, 1, **settings) as cluster:
        address = cluster.address(0)
        async with open_bookie_client(address, tls=pki.client(writer)) as c:
            assert (await c.call(_add(7, 0)))[0] == Status.OK
            assert (await c.call(ReadRangeRequest(ledger_id=7, first_entry_id=0, max_count=1,
                                                  max_bytes=1 << 20)))[0] == Status.OK
            assert (await c.call(AdminStatusRequest()))[0] == Status.UNAUTHORIZED
        async with open_bookie_client(address, tls=pki.client(auditor)) as c:
            assert (await c.call(_add(7, 1)))[0] == Status.UNAUTHORIZED  # no plain adds
            assert (await c.call(_add(7, 1, AddFlags.RECOVERY_ADD)))[0] == Status.OK
            assert (await c.call(ReadRangeRequest(ledger_id=7, first_entry_id=0, max_count=2,
                                                  max_bytes=1 << 20)))[0] == Status.OK
        lines = [getattr(r, _FIELDS_ATTR) for r in caplog.records
                 if r.getMessage() == "request_unauthorized"]
        assert [(x["principal"], x["api"], x["needs"]) for x in lines] == [
            ("app-writer", "ADMIN_STATUS", "admin"), ("auditor", "ADD", "client")]
        async with open_bookie_client(address, tls=pki.client(operator)) as c:
            assert (await c.call(AdminStatusRequest()))[0] == Status.OK
            assert (await c.call(_add(7, 2)))[0] == Status.UNAUTHORIZED
        # No client certificate: the bookie requires one, the handshake fails.
        with pytest.raises(BookieConnectionError, match=r"require a client certificate. "
                                                        r"tls_certificate_path"):
            async with open_bookie_client(address, tls=pki.client()) as c:
                await c.call(GetBookieInfoRequest())
        assert cluster.bookies[0].metrics.requests_unauthorized == 3


async def test_receive_available_takes_what_is_decryptable_in_small_reads(pki: Pki) -> None:
    """Plain streams are read RECEIVE_BYTES at a time; over TLS one record, then every
    record already decryptable, up to TLS_DRAIN_BYTES; the bytes come out whole."""
    payload = bytes(range(256)) * 1200  # 307,200 bytes: more than one drain
    plain_out, plain_in = trio.testing.memory_stream_pair()
    await plain_out.send_all(payload)
    await plain_out.aclose()
    sizes, got = [], b""
    while chunk := await receive_available(plain_in, tls=False):
        sizes.append(len(chunk))
        got += chunk
    assert got == payload and max(sizes) == RECEIVE_BYTES

    left, right = trio.testing.memory_stream_pair()
    server = trio.SSLStream(left, server_context(*pki.bookie), server_side=True)
    client = trio.SSLStream(right, client_context(pki.ca_path), server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    await client.send_all(payload)
    await client.aclose()
    sizes, got = [], b""
    while chunk := await receive_available(server, tls=True):
        sizes.append(len(chunk))
        got += chunk
    assert got == payload
    assert max(sizes) == TLS_DRAIN_BYTES  # drained many records in one call
    assert all(n % TLS_RECORD_BYTES == 0 for n in sizes[:-1])


def test_principal_from_a_certificate_and_bad_files(pki: Pki, tmp_path: Path) -> None:
    assert principal_of({"subject": ((("commonName", "svc"),),
                                     (("organizationalUnitName", "0:client,admin;1:c"),))}) \
        == Principal("svc", frozenset({"client", "admin"}), True)
    assert principal_of(None).name == "anonymous" and not principal_of(None).roles
    with pytest.raises(TlsConfigError, match=r"tls_trust_path: .*missing.pem: no such file"):
        client_context(str(tmp_path / "missing.pem"))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(TlsConfigError, match=r"tls_trust_path: .*junk.pem: not PEM CA"):
        client_context(str(tmp_path / "junk.pem"))
    with pytest.raises(TlsConfigError, match=r"tls_enabled_protocols: 'SSLv3'"):
        client_context(pki.ca_path, protocols="SSLv3")


async def test_rotated_certificate_files_are_picked_up(pki: Pki, zk_chroot: str,
                                                       tmp_path: Path) -> None:
    """tls_cert_refresh_seconds: the bookie re-reads its files when they change; new
    connections get the new certificate, with no restart."""
    settings = pki.bookie_settings(tls_cert_refresh_seconds=1)
    async with inprocess_cluster(zk_chroot, tmp_path, 1, **settings) as cluster:
        address = cluster.address(0)
        (tmp_path / "next").mkdir()
        successor = Pki(tmp_path / "next")  # a new CA and bookie certificate
        with pytest.raises(BookieConnectionError, match="did not verify"):
            async with open_bookie_client(address, tls=successor.client()):
                pass
        # Rotate in place: the bookie's files now hold the successor's certificate.
        for new, old in zip(successor.bookie, pki.bookie, strict=True):
            Path(old).write_bytes(Path(new).read_bytes())
        contexts = cluster.bookies[0].security.contexts
        assert contexts is not None
        # The next connection after the refresh interval uses the new one: move the
        # context's clock past the interval instead of waiting it out.
        contexts.clock = lambda: time.monotonic() + contexts.refresh_s
        async with open_bookie_client(address, tls=successor.client()) as c:
            assert (await c.call(GetBookieInfoRequest()))[0] == Status.OK
        assert contexts.reloads == 1
        with pytest.raises(BookieConnectionError, match="did not verify"):
            async with open_bookie_client(address, tls=pki.client()):
                pass


async def test_token_principals_without_client_certificates(pki: Pki, zk_chroot: str,
                                                            tmp_path: Path) -> None:
    """AUTH with a token after START_TLS: the principals file names who it is and its
    roles; an unknown token is refused at connect, no token is the anonymous principal."""
    tokens = {"writer": b"tok-writer-0123456789", "reader": b"tok-reader-9876543210"}
    roles = {"writer": '["client"]', "reader": '["recovery"]'}
    principals = tmp_path / "principals.toml"
    principals.write_text("".join(
        f'[principals.{n}]\ntoken_sha256 = "{hashlib.sha256(t).hexdigest()}"\n'
        f"roles = {roles[n]}\n" for n, t in tokens.items()))
    settings = pki.bookie_settings(tls_required=True, authorization_enabled=True,
                                   principals_file=str(principals))
    async with inprocess_cluster(zk_chroot, tmp_path, 1, **settings) as cluster:
        address = cluster.address(0)
        async with open_bookie_client(address, tls=pki.client(),
                                      auth_token=tokens["writer"]) as c:
            assert (await c.call(_add(9, 0)))[0] == Status.OK
        async with open_bookie_client(address, tls=pki.client(),
                                      auth_token=tokens["reader"]) as c:
            assert (await c.call(_add(9, 1)))[0] == Status.UNAUTHORIZED
            assert (await c.call(ReadRangeRequest(ledger_id=9, first_entry_id=0, max_count=1,
                                                  max_bytes=1 << 20)))[0] == Status.OK
        with pytest.raises(BookieConnectionError, match=r"refused our token: it is not in "
                                                        r"the bookie's principals_file"):
            async with open_bookie_client(address, tls=pki.client(), auth_token=b"guess"):
                pass
        async with open_bookie_client(address, tls=pki.client()) as c:  # anonymous
            assert (await c.call(GetBookieInfoRequest()))[0] == Status.UNAUTHORIZED
        # The whole client, with the token in a file as an application would have it.
        token_file = tmp_path / "writer.token"
        token_file.write_bytes(tokens["writer"] + b"\n")
        async with ledgerd.open_client(zk_chroot, tls_trust_path=pki.ca_path,
                                       auth_token_file=str(token_file)) as client:
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            await lh.append(b"by token")
            await lh.close()


def test_gentoken_writes_what_the_principals_file_reads(tmp_path: Path) -> None:
    from ledgerd.appliance.security import load_principals
    from ledgerd.base.settings import ConfigError

    token_file = tmp_path / "svc.token"
    done = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "gentoken", "svc",
                           "--roles", "client,admin", "--token-file", str(token_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "p.toml").write_text(done.stdout)
    loaded = load_principals(str(tmp_path / "p.toml"))
    token = token_file.read_text().strip().encode()
    assert token.decode() not in done.stdout  # only its hash goes into the file
    assert loaded == {hashlib.sha256(token).hexdigest():
                      Principal("svc", frozenset({"client", "admin"}), True)}
    (tmp_path / "bad.toml").write_text('[principals.x]\ntoken_sha256 = "abc"\n')
    with pytest.raises(ConfigError, match=r"\[principals.x\] with token_sha256 = 64 hex"):
        load_principals(str(tmp_path / "bad.toml"))


@pytest.mark.parametrize("protocol", ["TLSv1.2", "TLSv1.3"])
def test_an_untrusted_client_certificate_is_refused_as_a_bad_certificate(
        tmp_path: Path, protocol: str) -> None:
    """A server verifying client certificates refuses one from a CA it does not trust
    with the bad_certificate alert (42), as Java's TLS does, not OpenSSL's unknown_ca
    (48); the verification error is kept for the server's log. A trusted one passes."""
    import socket
    import ssl
    import threading

    from ledgerd.base.tls import refuse_as_bad_certificate, take_refusal

    ca, stranger = trustme.CA(), trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = server_context(str(tmp_path / "server.pem"), "", trust=str(tmp_path / "ca.pem"),
                            client_auth="required", protocols=protocol)
    assert refuse_as_bad_certificate(server)  # the helper is built here and matches ssl

    def handshake(client_ca: trustme.CA) -> tuple[str | None, str | None, str | None]:
        """(the client's error, the server's, the refusal's reason)."""
        listener = socket.create_server(("127.0.0.1", 0))
        got: dict[str, str | None] = {"server": None, "reason": None}

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except ssl.SSLError as exc:
                got["server"], got["reason"] = str(exc), take_refusal()
            finally:
                conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        client_ca.issue_cert("client").configure_cert(client)
        error = None
        try:
            with client.wrap_socket(socket.create_connection(listener.getsockname()),
                                    server_hostname="127.0.0.1") as tls:
                assert tls.recv(2) == b"ok"
        except ssl.SSLError as exc:
            error = str(exc)
        thread.join(30)
        listener.close()
        return error, got["server"], got["reason"]

    error, refused, reason = handshake(stranger)
    assert error is not None and "BAD_CERTIFICATE" in error, error
    assert refused is not None and "certificate rejected" in refused, refused
    assert reason is not None and "unable to get local issuer certificate" in reason, reason
    assert handshake(ca) == (None, None, None)
