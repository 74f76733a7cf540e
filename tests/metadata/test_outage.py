"""A ZooKeeper that cannot be reached gives a bounded wait and an error naming the servers."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from ledgerd.metadata.errors import MetadataUnavailableError
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.zkserver import ZooKeeperServer, find_free_port


async def test_unreachable_servers_are_named() -> None:
    servers = f"127.0.0.1:{find_free_port()}"
    with trio.fail_after(30):
        with pytest.raises(MetadataUnavailableError) as info:
            await ZooKeeperStore.connect(servers, connect_timeout=2.0)
    assert servers in str(info.value)


async def test_outage_mid_session_retries_then_names_servers(tmp_path: Path) -> None:
    """A dedicated server (not the shared fixture) is stopped under a live session."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    server.start()
    try:
        store = await ZooKeeperStore.connect(server.connect_string, session_timeout=10.0,
                                             operation_timeout=1.0, retries=3)
        await store.create("/x", b"1")
        server.stop()
        with trio.fail_after(60):
            with pytest.raises(MetadataUnavailableError) as info:
                await store.get("/x")
        assert server.connect_string in str(info.value)
        assert "3 times" in str(info.value)
        await store.close()
    finally:
        server.stop()


async def test_cancelled_calls_leak_no_threads(zk_chroot: str) -> None:
    store = await ZooKeeperStore.connect(zk_chroot)
    try:
        await store.create("/c", b"")
        before = threading.active_count()
        for i in range(20):
            with trio.move_on_after(0):
                await store.create(f"/c/n{i}", b"")
            with trio.move_on_after(0.001):
                await store.get("/c")
        # Every cancelled call waited for its thread; nodes that were created are whole.
        names = await store.children("/c")
        for name in names:
            assert (await store.get(f"/c/{name}"))[0] == b""
        assert threading.active_count() <= before + 16  # at most the limiter's workers
        assert await store.exists("/c") is not None
    finally:
        await store.close()


async def test_a_read_in_flight_is_abandoned_when_its_caller_is_cancelled(
        tmp_path: Path) -> None:
    """ZooKeeper gone, a read waiting out its operation timeout: cancelling the caller (a
    bookie's stop) returns at once, not after the timeout (writes still wait: a write
    must not land behind a caller that gave up on it)."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk")
    server.start()
    try:
        store = await ZooKeeperStore.connect(server.connect_string, session_timeout=20.0,
                                             operation_timeout=15.0, retries=1)
        await store.create("/x", b"1")
        server.stop()
        for read in (store.children, store.get, store.exists):
            t0 = trio.current_time()
            with trio.move_on_after(0.5):
                await read("/x")
            assert trio.current_time() - t0 < 5, read.__name__
        await store.close()
    finally:
        server.stop()
