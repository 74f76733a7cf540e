"""The gateway's listener with TLS and SASL PLAIN on the bookies' principals (issue #24's
Kafka side): tokens made by ``ledgerd shell gentoken`` are SASL PLAIN passwords; kcat
over ``sasl_ssl`` produces and consumes as a client; creating a topic needs the admin
role; a wrong password, plaintext to the TLS port and TLS without SASL are each refused.
Its own cluster: a second gateway on the module's cluster would take over half of its
partitions."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import wait_until


@pytest.fixture(scope="module")
def secure_gateway(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                   ) -> Iterator[tuple[GatewayProcess, Path]]:
    import trustme

    base = tmp_path_factory.mktemp("kafka-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(base / "gateway.pem"))
    # a client certificate: CN names the principal, OU "0:client" gives its role
    mine = ca.issue_cert("etl.example", common_name="etl", organization_unit_name="0:client")
    mine.private_key_and_cert_chain_pem.write_to_path(str(base / "etl.pem"))
    principals = base / "principals.toml"
    for name, roles in (("alice", "client"), ("root", "admin")):
        made = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "gentoken",
                               name, "--roles", roles, "--token-file", str(base / name)],
                              capture_output=True, text=True, timeout=60, check=True)
        with principals.open("a") as f:
            f.write(made.stdout)
    with fresh_chroot(zookeeper, "kafka_tls") as zk:
        gateway = GatewayProcess(zk, base / "gateway.log", env={
            "LEDGERD_GATEWAY_TLS_CERTIFICATE_PATH": str(base / "gateway.pem"),
            "LEDGERD_GATEWAY_TLS_KEY_PATH": str(base / "gateway.pem"),
            "LEDGERD_GATEWAY_PRINCIPALS_FILE": str(principals),
            "LEDGERD_GATEWAY_TLS_CLIENT_AUTH": "optional",
            "LEDGERD_GATEWAY_TLS_TRUST_PATH": str(base / "ca.pem")})
        with running_cluster(base, zk, 3, gateway):
            yield gateway, base


def _kcat(gw: GatewayProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["kcat", "-b", gw.bootstrap, "-m", "5", *args],
                          input=stdin.encode(), capture_output=True, timeout=60)


def _sasl(base: Path, user: str, password: str | None = None) -> list[str]:
    if password is None:
        password = (base / user).read_text().strip()  # the token gentoken wrote
    return ["-X", "security.protocol=sasl_ssl", "-X", f"ssl.ca.location={base / 'ca.pem'}",
            "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={user}",
            "-X", f"sasl.password={password}"]


def test_kcat_over_sasl_ssl(secure_gateway: tuple[GatewayProcess, Path]) -> None:
    gw, base = secure_gateway
    put = _kcat(gw, *_sasl(base, "alice"), "-P", "-t", "secure",
                stdin="".join(f"s{i}\n" for i in range(20)))
    assert put.returncode == 0, put.stderr.decode()
    got = _kcat(gw, *_sasl(base, "alice"), "-C", "-t", "secure", "-o", "beginning", "-e")
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout.decode().split() == [f"s{i}" for i in range(20)]


def test_kcat_over_ssl_with_a_client_certificate(
        secure_gateway: tuple[GatewayProcess, Path]) -> None:
    gw, base = secure_gateway
    ssl = ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={base / 'ca.pem'}",
           "-X", f"ssl.certificate.location={base / 'etl.pem'}",
           "-X", f"ssl.key.location={base / 'etl.pem'}"]
    put = _kcat(gw, *ssl, "-P", "-t", "by-cert", stdin="c0\nc1\n")
    assert put.returncode == 0, put.stderr.decode()
    got = _kcat(gw, *ssl, "-C", "-t", "by-cert", "-o", "beginning", "-e")
    assert got.returncode == 0 and got.stdout.decode().split() == ["c0", "c1"]


def test_wrong_password_plaintext_and_missing_sasl_are_refused(
        secure_gateway: tuple[GatewayProcess, Path]) -> None:
    gw, base = secure_gateway
    # Each refused kcat waits out its metadata timeout: the four run side by side.
    with ThreadPoolExecutor(4) as pool:
        wrong, other, plain, no_sasl = pool.map(lambda args: _kcat(gw, *args, "-L"), [
            _sasl(base, "alice", "guess"),
            _sasl(base, "root", (base / "alice").read_text().strip()),
            [],
            ["-X", "security.protocol=ssl", "-X", f"ssl.ca.location={base / 'ca.pem'}"]])
    assert wrong.returncode != 0 and b"Authentication failed" in wrong.stderr
    assert other.returncode != 0  # alice's token does not make you root
    assert plain.returncode != 0
    assert no_sasl.returncode != 0
    wait_until(lambda: "kafka_unauthenticated_request" in gw.log_text(), "the refusal logged")


def test_a_refused_client_certificate_gets_the_tls_alert_saying_why(
        secure_gateway: tuple[GatewayProcess, Path], tmp_path: Path) -> None:
    """A certificate from a CA the gateway does not trust fails the handshake with the
    bad_certificate alert, as a Kafka broker's (Java's TLS) refusal does, where OpenSSL
    would choose unknown_ca: the client learns why, instead of a connection closed
    without a word (trio's SSLStream drops the alert it was about to send when the
    handshake fails). The gateway's log keeps the verification error behind it."""
    import socket
    import ssl

    import trustme

    gw, base = secure_gateway
    stranger = trustme.CA().issue_cert("etl.example", common_name="etl",
                                       organization_unit_name="0:client")
    stranger.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "stranger.pem"))
    ctx = ssl.create_default_context(cafile=str(base / "ca.pem"))
    ctx.load_cert_chain(str(tmp_path / "stranger.pem"))
    host, port = gw.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as tls:
        # TLS 1.3: the client's side of the handshake is done before the gateway
        # checks its certificate; the alert arrives on the first read
        started = time.monotonic()
        with pytest.raises(ssl.SSLError, match=r"(?i)alert.bad.certificate"):
            tls.recv(1)
        # told gateway_connection_failed_authentication_delay_ms (100) late, as Kafka
        assert time.monotonic() - started >= 0.09
    wait_until(lambda: "kafka_tls_handshake_failed" in gw.log_text(), "the handshake logged")
    assert "unable to get local issuer certificate" in gw.log_text()


def test_before_authenticating_only_small_requests_are_read(
        secure_gateway: tuple[GatewayProcess, Path]) -> None:
    """A connection that has not authenticated may announce no request over 512 KiB
    (Kafka's sasl.server.max.receive.size): it cannot make the gateway hold
    max_request_bytes for it; one that has (its client certificate) may."""
    import socket
    import ssl
    import struct

    gw, base = secure_gateway
    host, port = gw.bootstrap.rsplit(":", 1)

    def announce(size: int, cert: Path | None) -> bool:
        """Whether the gateway closes the connection after the size alone."""
        ctx = ssl.create_default_context(cafile=str(base / "ca.pem"))
        if cert is not None:
            ctx.load_cert_chain(str(cert))
        with socket.create_connection((host, int(port)), timeout=20) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(struct.pack(">i", size))
            tls.settimeout(1.0)
            try:
                return tls.recv(1) == b""
            except TimeoutError:
                return False  # still reading the body
            except (ConnectionResetError, ssl.SSLError):
                return True

    assert announce(1 << 20, None)
    wait_until(lambda: "authenticated=False" in gw.log_text()
               and "limit=524288" in gw.log_text(), "the bad frame logged")
    assert not announce(1 << 20, base / "etl.pem")
    assert not announce(400 << 10, None)


def test_creating_topics_needs_the_admin_role(secure_gateway: tuple[GatewayProcess, Path],
                                              ) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    gw, base = secure_gateway

    def admin(user: str) -> AdminClient:
        token = (base / user).read_text().strip()
        return AdminClient({"bootstrap.servers": gw.bootstrap,
                            "security.protocol": "sasl_ssl",
                            "ssl.ca.location": str(base / "ca.pem"),
                            "sasl.mechanisms": "PLAIN", "sasl.username": user,
                            "sasl.password": token})

    alice, root = admin("alice"), admin("root")  # (a collected client cancels its futures)
    refused = alice.create_topics([NewTopic("by-alice", 1)])["by-alice"]
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        refused.result(60)
    wait_until(lambda: "principal=alice api=CREATE_TOPICS roles=client needs=admin"
               in gw.log_text(), "the refusal logged")
    root.create_topics([NewTopic("by-root", 3)])["by-root"].result(60)


def test_acls_name_the_authenticated_principal(secure_gateway: tuple[GatewayProcess, Path],
                                               ) -> None:
    """An ACL for ``User:alice`` applies to the connection that proved alice (SASL
    PLAIN), and to no one else; the ACL APIs need the admin role first."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    from tests.kafka.test_admin_clients import sasl_admin

    gw, base = secure_gateway
    root, alice = sasl_admin(gw, base, "root"), sasl_admin(gw, base, "alice")
    root.create_topics([NewTopic("acl-secure", 1)])["acl-secure"].result(60)

    def write_acl(user: str) -> AclBinding:
        return AclBinding(ResourceType.TOPIC, "acl-secure", ResourcePatternType.LITERAL,
                          f"User:{user}", "*", AclOperation.WRITE, AclPermissionType.ALLOW)

    refused = alice.create_acls([write_acl("alice")])[write_acl("alice")]
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        refused.result(60)  # a client may not grant itself
    root.create_acls([write_acl("etl")])[write_acl("etl")].result(60)

    def produce_as_alice() -> KafkaError | None:
        errors: list[KafkaError | None] = []
        producer = Producer({"bootstrap.servers": gw.bootstrap, "security.protocol": "sasl_ssl",
                             "ssl.ca.location": str(base / "ca.pem"),
                             "sasl.mechanisms": "PLAIN", "sasl.username": "alice",
                             "sasl.password": (base / "alice").read_text().strip(),
                             "retries": 0})
        producer.produce("acl-secure", b"x", on_delivery=lambda e, _m: errors.append(e))
        assert producer.flush(60) == 0
        return errors[0]

    denied = produce_as_alice()  # the topic's ACLs name etl only
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    root.create_acls([write_acl("alice")])[write_acl("alice")].result(60)
    assert produce_as_alice() is None


def test_kafka_tools_over_sasl_ssl_and_with_a_client_certificate(
        secure_gateway: tuple[GatewayProcess, Path], tmp_path: Path) -> None:
    """``ledgerd kafka-topics --command-config``: Kafka's client properties for SASL_SSL
    (PLAIN, a JAAS line) and SSL with a client certificate; the principal's roles decide;
    what lacks them, or the listener's TLS, is named in one line."""
    import trustme

    gw, base = secure_gateway

    def props(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)

    def sasl(user: str, ca: Path = base / "ca.pem") -> str:
        token = (base / user).read_text().strip()
        return props(f"{user}-{ca.name}.properties", (
            f"security.protocol=SASL_SSL\nssl.ca.location={ca}\nsasl.mechanism=PLAIN\n"
            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
            f'required username="{user}" password="{token}";\n'))

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "kafka-topics",
                               "--bootstrap-server", gw.bootstrap, *args],
                              capture_output=True, text=True, timeout=60)

    made = tool("--create", "--topic", "tools-secure", "--command-config", sasl("root"))
    assert (made.returncode, made.stdout) == (0, "Created topic tools-secure.\n"), made.stderr
    refused = tool("--create", "--topic", "tools-alice", "--command-config", sasl("alice"))
    assert refused.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    cert = props("etl.properties", f"security.protocol=SSL\nssl.ca.location={base / 'ca.pem'}\n"
                 f"ssl.certificate.location={base / 'etl.pem'}\n"
                 f"ssl.key.location={base / 'etl.pem'}\n")
    listed = tool("--list", "--command-config", cert)
    assert listed.returncode == 0 and "tools-secure" in listed.stdout.split(), listed.stderr
    bare = tool("--list")
    assert bare.returncode == 1 and "give --command-config" in bare.stderr, bare.stderr
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    wrong_ca = tool("--list", "--command-config", sasl("root", other))
    assert wrong_ca.returncode == 1 and "TLS handshake failed" in wrong_ca.stderr, \
        wrong_ca.stderr
