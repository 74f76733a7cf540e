"""SASL SCRAM with real clients: a gateway offering PLAIN (an admin from a principals
file) and SCRAM-SHA-256/512; confluent-kafka's AdminClient makes and describes a SCRAM
credential (AlterUserScramCredentials, DescribeUserScramCredentials), then produces and
consumes as that user over SASL_PLAINTEXT with each mechanism; a wrong password and an
unknown user are refused alike. Its own cluster, as test_security.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, running_cluster

TIMEOUT = 60


@pytest.fixture(scope="module")
def scram_gateway(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[tuple[GatewayProcess, str]]:
    base = tmp_path_factory.mktemp("kafka-scram")
    made = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "gentoken",
                           "root", "--roles", "admin", "--token-file", str(base / "root")],
                          capture_output=True, text=True, timeout=60, check=True)
    (base / "principals.toml").write_text(made.stdout)
    with fresh_chroot(zookeeper, "kafka_scram") as zk:
        gateway = GatewayProcess(zk, base / "gateway.log", env={
            "LEDGERD_GATEWAY_PRINCIPALS_FILE": str(base / "principals.toml"),
            "LEDGERD_GATEWAY_SASL_MECHANISMS": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"})
        with running_cluster(base, zk, 3, gateway):
            yield gateway, (base / "root").read_text().strip()


def _conf(gw: GatewayProcess, mech: str, user: str, password: str) -> dict[str, object]:
    return {"bootstrap.servers": gw.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mech, "sasl.username": user, "sasl.password": password}


def test_scram_credentials_then_produce_and_consume(
        scram_gateway: tuple[GatewayProcess, str]) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import (
        AdminClient,
        NewTopic,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    gw, root_token = scram_gateway
    root = AdminClient(_conf(gw, "PLAIN", "root", root_token))
    futures = root.alter_user_scram_credentials([
        UserScramCredentialUpsertion(
            "sam", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"sam-256"),
        UserScramCredentialUpsertion(
            "sam", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"sam-512")])
    for f in futures.values():
        f.result(TIMEOUT)
    described = root.describe_user_scram_credentials(["sam"])["sam"].result(TIMEOUT)
    assert sorted((i.mechanism.value, i.iterations)
                  for i in described.scram_credential_infos) == [(1, 8192), (2, 4096)]
    root.create_topics([NewTopic("scram-topic", 1)])["scram-topic"].result(TIMEOUT)

    for mech, password in (("SCRAM-SHA-256", "sam-256"), ("SCRAM-SHA-512", "sam-512")):
        producer = Producer(_conf(gw, mech, "sam", password))
        producer.produce("scram-topic", value=mech.encode())
        assert producer.flush(TIMEOUT) == 0
        consumer = Consumer({**_conf(gw, mech, "sam", password), "group.id": f"g-{mech}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["scram-topic"])
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + TIMEOUT
            while mech.encode() not in got and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
        finally:
            consumer.close()
        assert mech.encode() in got
    deadline = time.monotonic() + TIMEOUT
    while "principal=sam" not in gw.log_text():
        assert time.monotonic() < deadline, "sam's login was not logged"
        time.sleep(0.1)

    # sam is a client, not an admin: the credential APIs need the admin role (Alter
    # here: confluent-kafka 2.16 aborts the process on a refused Describe)
    sam = AdminClient(_conf(gw, "SCRAM-SHA-256", "sam", "sam-256"))
    refused = sam.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "sam", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"mine")])
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED"):
        refused["sam"].result(TIMEOUT)
    # the gateway's log reaches its file through a copying thread: wait for the line
    deadline = time.monotonic() + TIMEOUT
    while "principal=sam api=ALTER_USER_SCRAM_CREDENTIALS" not in gw.log_text():
        assert time.monotonic() < deadline, "the refusal was not logged"
        time.sleep(0.1)


@pytest.mark.parametrize(("user", "password"), [("sam", "wrong"), ("nobody", "x")])
def test_wrong_password_or_unknown_user_is_refused(
        scram_gateway: tuple[GatewayProcess, str], user: str, password: str) -> None:
    import threading

    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    gw, _ = scram_gateway
    errors: list[KafkaError] = []
    seen = threading.Event()

    def on_error(err: KafkaError) -> None:
        errors.append(err)
        if err.code() == KafkaError._AUTHENTICATION:
            seen.set()

    admin = AdminClient({**_conf(gw, "SCRAM-SHA-256", user, password), "error_cb": on_error})
    deadline = time.monotonic() + TIMEOUT
    while not seen.is_set() and time.monotonic() < deadline:
        admin.poll(0.1)
    assert seen.is_set(), errors
    assert any("invalid credentials" in e.str() for e in errors), errors


def test_kafka_configs_makes_describes_and_deletes_a_users_credentials(
        scram_gateway: tuple[GatewayProcess, str], tmp_path: pytest.TempPathFactory) -> None:
    """``ledgerd kafka-configs --entity-type users`` as Kafka's tool: the salted
    password made on the client side works for a real client's SCRAM login."""
    import json
    from pathlib import Path

    from click.testing import CliRunner
    from confluent_kafka import Producer

    from ledgerd.tools.cli import cli

    gw, root_token = scram_gateway
    props = Path(str(tmp_path)) / "admin.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     f"sasl.username=root\nsasl.password={root_token}\n")

    def tool(*args: str) -> str:
        got = CliRunner().invoke(cli, ["kafka-configs", "--bootstrap-server", gw.bootstrap,
                                       "--command-config", str(props), *args])
        assert got.exit_code == 0, got.output
        return got.stdout

    assert tool("--alter", "--entity-type", "users", "--entity-name", "tia", "--add-config",
                "SCRAM-SHA-512=[iterations=8192,password=tia-secret],"
                "SCRAM-SHA-256=[password=tia-256]") == "Completed updating config for user tia.\n"
    assert tool("--describe", "--user", "tia") == (
        "SCRAM credential configs for user-principal 'tia' are "
        "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=8192\n")
    producer = Producer(_conf(gw, "SCRAM-SHA-512", "tia", "tia-secret"))
    producer.produce("scram-tool", value=b"v")
    assert producer.flush(TIMEOUT) == 0
    tool("--alter", "--user", "tia", "--delete-config", "SCRAM-SHA-512")
    assert json.loads(tool("--describe", "--user", "tia", "--json")) == [
        {"user": "tia", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 4096}]}]
    bad = CliRunner().invoke(cli, ["kafka-configs", "--bootstrap-server", gw.bootstrap,
                                   "--alter", "--user", "tia", "--add-config",
                                   "producer_byte_rate=1024"])
    assert bad.exit_code == 2 and "SCRAM-SHA-256 and SCRAM-SHA-512" in bad.output
