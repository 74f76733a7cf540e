"""The real ZooKeeper fixture: CAS, ephemeral nodes and per-test chroots."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from ledgerd.tools.zkserver import ZooKeeperServer, ruok, serving


def _client(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=30)
    return client


def test_server_answers_ruok(zookeeper: ZooKeeperServer) -> None:
    assert ruok(zookeeper.host, zookeeper.port)
    assert zookeeper.pid is not None


def test_start_returns_once_sessions_are_served(tmp_path: Path) -> None:
    """``ruok`` answers about 0.2 s before the server takes sessions; ``start`` waits for
    ``srvr`` to name a mode, so the first client is not dropped (kazoo would log
    "Connection dropped" and retry: what ``ledgerd local`` showed a new user)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    kazoo_log = logging.getLogger("kazoo")
    kazoo_log.addHandler(handler)
    server = ZooKeeperServer(tmp_path / "zk")
    try:
        server.start()
        client = _client(server.connect_string)
        client.stop()
        client.close()
        assert serving(server.host, server.port)
    finally:
        server.stop()
        kazoo_log.removeHandler(handler)
    assert not [r.getMessage() for r in records if "dropped" in r.getMessage()]
    assert not serving(server.host, server.port)  # stopped: nothing answers


def test_create_and_cas_with_stale_version_fails(zk_chroot: str) -> None:
    client = _client(zk_chroot)
    try:
        client.create("/node", b"v0")
        _, stat = client.get("/node")
        client.set("/node", b"v1", version=stat.version)
        with pytest.raises(BadVersionError):
            client.set("/node", b"v2", version=stat.version)
        data, stat2 = client.get("/node")
        assert data == b"v1"
        assert stat2.version == stat.version + 1
    finally:
        client.stop()
        client.close()


def test_ephemeral_node_vanishes_when_session_closes(zk_chroot: str) -> None:
    owner = _client(zk_chroot)
    watcher = _client(zk_chroot)
    try:
        owner.create("/bookie", b"", ephemeral=True)
        assert watcher.exists("/bookie") is not None
        owner.stop()
        owner.close()
        with pytest.raises(NoNodeError):
            watcher.get("/bookie")
    finally:
        watcher.stop()
        watcher.close()


def test_each_test_gets_its_own_chroot(zk_chroot: str, zookeeper: ZooKeeperServer) -> None:
    chroot = zk_chroot[len(zookeeper.connect_string):]
    root = _client(zookeeper.connect_string)
    inner = _client(zk_chroot)
    try:
        inner.create("/mine", b"x")
        assert root.exists(chroot + "/mine") is not None
        assert root.exists("/mine") is None
    finally:
        inner.stop()
        inner.close()
        root.stop()
        root.close()
