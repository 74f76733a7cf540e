"""The real ZooKeeper fixture: CAS, ephemeral nodes and per-test chroots."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from ledgerd.tools.zkserver import ZooKeeperServer, ruok


def _client(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10)
    client.start(timeout=30)
    return client


def test_server_answers_ruok(zookeeper: ZooKeeperServer) -> None:
    assert ruok(zookeeper.host, zookeeper.port)
    assert zookeeper.pid is not None


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
