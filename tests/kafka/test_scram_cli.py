"""``ledgerd shell kafka scram`` (tools/kafka_cmds.py): SCRAM credentials written
straight to ZooKeeper, the way in for a gateway offering only SCRAM with no super user.

A set/list/delete round trip against a real ZooKeeper (the keys stored authenticate an
RFC 5802 exchange, the listing never shows them, every refusal is one line), the
terminal prompt through a pseudo-terminal, and end to end: a gateway with SCRAM only
and no super users, a credential made by the CLI, a confluent-kafka producer and
consumer authenticating with it, a wrong password refused, and after ``delete`` a new
connection refused."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.kafka.scram import Mechanism, ScramClient, ScramError, ScramServer
from ledgerd.metadata.kafka_scram import Credentials, ScramStore
from ledgerd.metadata.paths import kafka_root
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot, metadata_store
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import wait_until

TIMEOUT = 60
SHA256, SHA512 = int(Mechanism.SCRAM_SHA_256), int(Mechanism.SCRAM_SHA_512)


def scram(zk: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``ledgerd shell --zk ZK kafka scram ARGS``; stdin is never a terminal here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_ZK_")}
    return subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk,
                           "kafka", "scram", *args], input=stdin, text=True,
                          stdin=subprocess.DEVNULL if stdin is None else None,
                          capture_output=True, timeout=TIMEOUT, env=env)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def refused(done: subprocess.CompletedProcess[str], expected: str) -> None:
    """Exit 1 with one line on stderr naming what was wrong."""
    assert done.returncode != 0, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert lines[0].startswith("ledgerd: error: "), done.stderr


async def stored(zk: str) -> Credentials:
    async with metadata_store(zk, init=False) as store:
        return await ScramStore(store, kafka_root("/ledgers")).credentials()


def authenticates(creds: Credentials, mech: Mechanism, user: str, password: str) -> bool:
    """An RFC 5802 exchange against the stored keys, as the gateway runs it."""
    server = ScramServer(mech, lambda n: creds.get(n, {}).get(int(mech)), fake_secret=b"k")
    client = ScramClient(mech, user, password)
    try:
        client.check(server.step(client.final(server.step(client.first()))))
    except ScramError:
        return False
    return server.user == user


async def test_set_list_delete_round_trip_and_refusals(zk_chroot: str, tmp_path: Path) -> None:
    zk = zk_chroot
    # no cluster under the root yet: said in one line
    refused(scram(zk, "list"), "no cluster at /ledgers")
    async with metadata_store(zk):  # initialises the cluster
        pass
    assert json.loads(ok(scram(zk, "list", "--json"))) == {
        "path": "/ledgers/kafka/scram", "users": []}
    assert "no SCRAM credentials in" in ok(scram(zk, "list"))

    out = ok(scram(zk, "set", "alice", "--password-stdin", stdin="alice-pw\n"))
    assert "alice" in out and "SCRAM-SHA-256" in out and "4096 iterations" in out
    pw_file = tmp_path / "pw"
    pw_file.write_text("alice-512\n")
    doc = json.loads(ok(scram(zk, "set", "alice", "--mechanism", "scram-sha-512",
                              "--iterations", "16384", "--password-file", str(pw_file),
                              "--json")))
    assert doc == {"user": "alice", "mechanism": "SCRAM-SHA-512", "iterations": 16384,
                   "path": "/ledgers/kafka/scram"}
    ok(scram(zk, "set", "bob,=x", "--iterations", "8192", "--password-stdin", stdin="b"))

    creds = await stored(zk)
    assert authenticates(creds, Mechanism.SCRAM_SHA_256, "alice", "alice-pw")
    assert authenticates(creds, Mechanism.SCRAM_SHA_512, "alice", "alice-512")
    assert authenticates(creds, Mechanism.SCRAM_SHA_256, "bob,=x", "b")
    assert not authenticates(creds, Mechanism.SCRAM_SHA_256, "alice", "alice-512")
    listed = json.loads(ok(scram(zk, "list", "--json")))
    assert listed["users"] == [
        {"user": "alice", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 4096},
                                          {"mechanism": "SCRAM-SHA-512", "iterations": 16384}]},
        {"user": "bob,=x", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 8192}]}]
    human = ok(scram(zk, "list"))
    assert human.split("\n")[0].split() == ["user", "mechanism", "iterations"]
    assert [line.split() for line in human.strip().split("\n")[1:]] == [
        ["alice", "SCRAM-SHA-256", "4096"], ["alice", "SCRAM-SHA-512", "16384"],
        ["bob,=x", "SCRAM-SHA-256", "8192"]], human
    import base64
    for mechs in creds.values():  # never a key, never a salt
        for c in mechs.values():
            for secret in (c.stored_key, c.server_key, c.salt):
                text = base64.b64encode(secret).decode()
                assert text not in human and text not in json.dumps(listed)

    # change: the old password no longer holds, the new one does
    ok(scram(zk, "set", "alice", "--password-stdin", stdin="alice-new\r\n"))
    creds = await stored(zk)
    assert authenticates(creds, Mechanism.SCRAM_SHA_256, "alice", "alice-new")
    assert not authenticates(creds, Mechanism.SCRAM_SHA_256, "alice", "alice-pw")
    assert authenticates(creds, Mechanism.SCRAM_SHA_512, "alice", "alice-512")

    # refusals: one line each, and nothing changes
    before = await stored(zk)
    refused(scram(zk, "set", "carol", "--mechanism", "SCRAM-SHA-1", "--password-stdin",
                  stdin="x"), "--mechanism 'SCRAM-SHA-1': not a SCRAM mechanism")
    refused(scram(zk, "delete", "alice", "--mechanism", "PLAIN"),
            "--mechanism 'PLAIN': not a SCRAM mechanism")
    refused(scram(zk, "set", "carol", "--iterations", "4095", "--password-stdin", stdin="x"),
            "Iterations 4095 not in the range 4096..16384")
    refused(scram(zk, "set", "carol", "--iterations", "16385", "--password-stdin", stdin="x"),
            "Iterations 16385 not in the range 4096..16384")
    refused(scram(zk, "set", "carol", "--password-stdin", stdin="\n"),
            "--password-stdin: empty password")
    (tmp_path / "empty").write_text("")
    refused(scram(zk, "set", "carol", "--password-file", str(tmp_path / "empty")),
            "empty password")
    refused(scram(zk, "set", "carol", "--password-stdin", stdin="a\nb\n"),
            "the password must be one line")
    refused(scram(zk, "set", "carol", "--password-file", str(tmp_path / "missing")),
            "cannot read --password-file")
    refused(scram(zk, "set", "carol", "--password-stdin", "--password-file", str(pw_file)),
            "give one of --password-file, --password-stdin")
    refused(scram(zk, "set", "carol"), "no terminal to prompt on")
    refused(scram(zk, "set", "", "--password-stdin", stdin="x"), "Username must not be empty")
    refused(scram(zk, "delete", "bob,=x", "--mechanism", "SCRAM-SHA-512"),
            "Attempt to delete a user credential that does not exist")
    refused(scram(zk, "delete", "nobody", "--mechanism", "SCRAM-SHA-256"),
            "cannot delete the SCRAM-SHA-256 credential of user 'nobody'")
    assert await stored(zk) == before

    # delete one mechanism: the other stays; the last one: the user goes
    doc = json.loads(ok(scram(zk, "delete", "alice", "--mechanism", "SCRAM-SHA-512",
                              "--json")))
    assert doc == {"user": "alice", "mechanism": "SCRAM-SHA-512",
                   "path": "/ledgers/kafka/scram"}
    assert "credential of user 'bob,=x' from" in ok(scram(zk, "delete", "bob,=x", "--mechanism",
                                               "SCRAM-SHA-256"))
    assert json.loads(ok(scram(zk, "list", "--json")))["users"] == [
        {"user": "alice", "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 4096}]}]


def test_the_password_is_asked_twice_on_a_terminal(zk_chroot: str) -> None:
    """On a terminal: the prompt, hidden, then its confirmation; a mismatch asks again."""
    import pty

    import trio

    async def init() -> None:
        async with metadata_store(zk_chroot):
            pass

    trio.run(init)
    argv = [sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk_chroot, "kafka",
            "scram", "set", "tty-user", "--mechanism", "SCRAM-SHA-512"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pseudo-terminal is its terminal
        try:
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)
    seen = b""
    pos = 0  # output before this was matched already

    def read_until(marker: bytes) -> None:
        """Wait for ``marker`` in the output after the last one matched."""
        nonlocal seen, pos
        deadline = time.monotonic() + TIMEOUT
        while marker not in seen[pos:]:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} in {seen!r}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                assert chunk, f"the terminal closed before {marker!r}: {seen!r}"
                seen += chunk
        pos = seen.index(marker, pos) + len(marker)

    try:
        read_until(b"SCRAM-SHA-512 password for tty-user: ")
        os.write(fd, b"tty-pw\n")
        read_until(b"Repeat for confirmation: ")
        os.write(fd, b"other\n")  # a mismatch: asked again
        read_until(b"do not match")
        read_until(b"SCRAM-SHA-512 password for tty-user: ")
        os.write(fd, b"tty-pw\n")
        read_until(b"Repeat for confirmation: ")
        os.write(fd, b"tty-pw\n")
        read_until(b"gateways check it within a second")
    finally:
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:  # it waits for input that will not come: end it
            deadline = time.monotonic() + TIMEOUT
            while not done and time.monotonic() < deadline:
                ready, _, _ = select.select([fd], [], [], 0.5)  # EOF once it exits
                if ready:
                    try:
                        seen += os.read(fd, 4096)
                    except OSError:
                        pass
                done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"tty-pw" not in seen  # hidden input
    creds = trio.run(stored, zk_chroot)
    assert authenticates(creds, Mechanism.SCRAM_SHA_512, "tty-user", "tty-pw")


# -- end to end ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scram_only_gateway(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                       ) -> Iterator[GatewayProcess]:
    """A gateway offering only SCRAM, with no principals file and no super user: no
    credential can be made through the Kafka API."""
    base = tmp_path_factory.mktemp("kafka-scram-cli")
    with fresh_chroot(zookeeper, "kafka_scram_cli") as zk:
        gateway = GatewayProcess(zk, base / "gateway.log", env={
            "LEDGERD_GATEWAY_SASL_MECHANISMS": "SCRAM-SHA-256,SCRAM-SHA-512",
            "LEDGERD_GATEWAY_SUPER_USERS": ""})
        with running_cluster(base, zk, 3, gateway):
            yield gateway


def _conf(gw: GatewayProcess, user: str, password: str,
          mech: str = "SCRAM-SHA-256") -> dict[str, Any]:
    return {"bootstrap.servers": gw.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mech, "sasl.username": user, "sasl.password": password}


def login(gw: GatewayProcess, user: str, password: str, mech: str = "SCRAM-SHA-256") -> bool:
    """A new client's login: True once it gets metadata, False once SCRAM refuses it."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    refusal = threading.Event()

    def on_error(err: KafkaError) -> None:
        if err.code() == KafkaError._AUTHENTICATION and "invalid credentials" in err.str():
            refusal.set()

    admin = AdminClient({**_conf(gw, user, password, mech), "error_cb": on_error})
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        admin.poll(0.1)  # serves error_cb
        if refusal.is_set():
            return False
        try:
            admin.list_topics(timeout=0.5)
            return True
        except KafkaException:
            continue
    raise AssertionError(f"{user}: neither authenticated nor refused in {TIMEOUT}s")


def wait_login(gw: GatewayProcess, user: str, password: str, want: bool) -> None:
    """New connections until one's login comes out ``want`` (a gateway reads the
    credentials again at most a second after its last read)."""
    wait_until(lambda: login(gw, user, password) is want,
               f"{user}'s login comes out {want}", TIMEOUT)


def test_a_scram_only_gateway_takes_a_credential_made_by_the_cli(
        scram_only_gateway: GatewayProcess) -> None:
    from confluent_kafka import Consumer, Producer

    gw = scram_only_gateway
    zk = gw.zk
    # no credential yet: refused (and the gateway has read the empty record)
    assert not login(gw, "alice", "alice-pw")
    ok(scram(zk, "set", "alice", "--password-stdin", stdin="alice-pw\n"))
    wait_login(gw, "alice", "alice-pw", True)

    producer = Producer(_conf(gw, "alice", "alice-pw"))
    for i in range(3):
        producer.produce("scram-cli-topic", value=f"m{i}".encode())
    assert producer.flush(TIMEOUT) == 0
    consumer = Consumer({**_conf(gw, "alice", "alice-pw"), "group.id": "scram-cli",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["scram-cli-topic"])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value() or b"")
    finally:
        consumer.close()
    assert got == [b"m0", b"m1", b"m2"]

    # Debian's kcat (librdkafka 2.0: client-final repeats the client nonce, which
    # Kafka 3.x accepts) logs in too
    listed = subprocess.run(
        ["kcat", "-b", gw.bootstrap, "-X", "security.protocol=sasl_plaintext",
         "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=alice",
         "-X", "sasl.password=alice-pw", "-L", "-t", "scram-cli-topic", "-m", "10"],
        capture_output=True, text=True, timeout=TIMEOUT)
    assert listed.returncode == 0 and "scram-cli-topic" in listed.stdout, listed.stderr
    assert not login(gw, "alice", "wrong")
    assert not login(gw, "alice", "alice-pw", "SCRAM-SHA-512")  # no credential for 512
    wait_until(lambda: "principal=alice mechanism=SCRAM-SHA-256" in gw.log_text(),
               "alice's login logged", TIMEOUT)

    ok(scram(zk, "delete", "alice", "--mechanism", "SCRAM-SHA-256"))
    wait_login(gw, "alice", "alice-pw", False)
    assert not login(gw, "alice", "alice-pw")  # and it stays refused
