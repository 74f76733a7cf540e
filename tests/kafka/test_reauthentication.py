"""KIP-368 re-authentication (``gateway_connections_max_reauth_ms``): SaslAuthenticate
tells the client how long its authentication lasts, a connection that sends any other
request after that is closed, authenticating again on the same connection keeps it
going, and re-authenticating as another principal (or with a wrong password) is refused
and ends the earlier authentication. librdkafka's own test of it is 0142 in full
conformance mode (on the SASL listener)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.kafka.client import KafkaClientError, KafkaConnection
from tests.kafka.conftest import GatewayProcess, running_cluster

LIFETIME_MS = 1500


async def _login(conn: KafkaConnection, user: str, password: str) -> dict[str, object]:
    got = await conn.call(ApiKey.SASL_HANDSHAKE, {"mechanism": "PLAIN"}, version=1)
    assert got["error_code"] == 0
    return await conn.call(ApiKey.SASL_AUTHENTICATE,
                           {"auth_bytes": b"\0" + user.encode() + b"\0" + password.encode()},
                           version=1)


async def _metadata(conn: KafkaConnection) -> dict[str, object]:
    return await conn.call(ApiKey.METADATA, {"topics": [], "allow_auto_topic_creation": False},
                           version=4)


def test_authentication_runs_out_unless_renewed_and_keeps_its_principal(
        zk_chroot: str, tmp_path: Path) -> None:
    principals = tmp_path / "principals.toml"
    tokens = {}
    for name in ("alice", "bob"):
        made = subprocess.run([sys.executable, "-m", "ledgerd.tools.cli", "shell", "gentoken",
                               name, "--roles", "client", "--token-file", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=60, check=True)
        with principals.open("a") as f:
            f.write(made.stdout)
        tokens[name] = (tmp_path / name).read_text().strip()
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log", env={
        "LEDGERD_GATEWAY_PRINCIPALS_FILE": str(principals),
        "LEDGERD_GATEWAY_CONNECTIONS_MAX_REAUTH_MS": str(LIFETIME_MS)})
    host, port = "127.0.0.1", gw.port

    async def scenario() -> None:
        # renewed before it runs out: the connection goes on past several lifetimes
        async with await KafkaConnection.open(host, port) as conn:
            got = await _login(conn, "alice", tokens["alice"])
            assert (got["error_code"], got["session_lifetime_ms"]) == (0, LIFETIME_MS)
            for _ in range(3):
                await trio.sleep(LIFETIME_MS / 1000 * 0.6)
                assert (await _login(conn, "alice", tokens["alice"]))["error_code"] == 0
                assert (await _metadata(conn))["brokers"]
        # not renewed: the first request after the lifetime closes the connection
        async with await KafkaConnection.open(host, port) as conn:
            assert (await _login(conn, "alice", tokens["alice"]))["error_code"] == 0
            assert (await _metadata(conn))["brokers"]
            await trio.sleep(LIFETIME_MS / 1000 + 0.3)
            with pytest.raises((KafkaClientError, trio.BrokenResourceError,
                                trio.EndOfChannel)):
                await _metadata(conn)
        # re-authenticating as someone else, or with a wrong password, is refused and
        # ends the earlier authentication
        for user, password in (("bob", tokens["bob"]), ("alice", "wrong")):
            async with await KafkaConnection.open(host, port) as conn:
                assert (await _login(conn, "alice", tokens["alice"]))["error_code"] == 0
                got = await _login(conn, user, password)
                assert got["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED, got
                with pytest.raises((KafkaClientError, trio.BrokenResourceError,
                                    trio.EndOfChannel)):
                    await _metadata(conn)

    with running_cluster(tmp_path, zk_chroot, 3, gw):
        trio.run(scenario)
    assert "kafka_reauthentication_overdue" in gw.log_text()
