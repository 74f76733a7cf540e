"""The gateway's listener with TLS and SASL PLAIN (issue #24's Kafka side): kcat over
``sasl_ssl`` produces and consumes; a wrong password, plaintext to the TLS port and TLS
without SASL are each refused. Its own cluster: a second gateway on the module's
cluster would take over half of its partitions."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, running_cluster


@pytest.fixture(scope="module")
def secure_gateway(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                   ) -> Iterator[tuple[GatewayProcess, Path]]:
    import trustme

    base = tmp_path_factory.mktemp("kafka-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(base / "gateway.pem"))
    users = base / "users"
    users.write_text(f"alice:{hashlib.sha256(b'wonderland').hexdigest()} client\n")
    with fresh_chroot(zookeeper, "kafka_tls") as zk:
        gateway = GatewayProcess(zk, base / "gateway.log", env={
            "LEDGERD_GATEWAY_TLS_CERTIFICATE_PATH": str(base / "gateway.pem"),
            "LEDGERD_GATEWAY_TLS_KEY_PATH": str(base / "gateway.pem"),
            "LEDGERD_GATEWAY_SASL_USERS_FILE": str(users)})
        with running_cluster(base, zk, 3, gateway):
            yield gateway, base / "ca.pem"


def _kcat(gw: GatewayProcess, *args: str, stdin: str = "") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["kcat", "-b", gw.bootstrap, "-m", "5", *args],
                          input=stdin.encode(), capture_output=True, timeout=60)


def _sasl(ca: Path, password: str) -> list[str]:
    return ["-X", "security.protocol=sasl_ssl", "-X", f"ssl.ca.location={ca}",
            "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice",
            "-X", f"sasl.password={password}"]


def test_kcat_over_sasl_ssl(secure_gateway: tuple[GatewayProcess, Path]) -> None:
    gw, ca = secure_gateway
    put = _kcat(gw, *_sasl(ca, "wonderland"), "-P", "-t", "secure",
                stdin="".join(f"s{i}\n" for i in range(20)))
    assert put.returncode == 0, put.stderr.decode()
    got = _kcat(gw, *_sasl(ca, "wonderland"), "-C", "-t", "secure", "-o", "beginning", "-e")
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout.decode().split() == [f"s{i}" for i in range(20)]


def test_wrong_password_plaintext_and_missing_sasl_are_refused(
        secure_gateway: tuple[GatewayProcess, Path]) -> None:
    gw, ca = secure_gateway
    wrong = _kcat(gw, *_sasl(ca, "guess"), "-L")
    assert wrong.returncode != 0 and b"Authentication failed" in wrong.stderr
    plain = _kcat(gw, "-L")
    assert plain.returncode != 0
    no_sasl = _kcat(gw, "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={ca}", "-L")
    assert no_sasl.returncode != 0
    assert "kafka_unauthenticated_request" in gw.log_text()
