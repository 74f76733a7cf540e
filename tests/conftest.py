"""Shared fixtures: trio mode (see pyproject), a real ZooKeeper, a chroot per test.

The ZooKeeper server comes from the Debian ``zookeeper`` package that ``make test``
installs. It is started once per session on a free loopback port and stopped by its
PID at the end. Tests never skip when it is missing: a missing dependency is a failure.
Both it and the bookie processes of ``bookie_factory`` come from the one process
cluster (``ledgerd.testing.cluster.ProcessCluster``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.testing.cluster import BookieProcess, ProcessCluster, ZooKeeperServer, fresh_chroot


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One real ZooKeeper for the whole test session."""
    cluster = ProcessCluster(tmp_path_factory.mktemp("zookeeper"), bookies=0)
    try:
        cluster.start_zookeeper()
        assert cluster.server is not None
        yield cluster.server
    finally:
        cluster.stop()


@pytest.fixture
def zk_chroot(zookeeper: ZooKeeperServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh chroot for this test; yields ``host:port/chroot`` for clients to use."""
    with fresh_chroot(zookeeper, request.node.name) as zk:
        yield zk


@pytest.fixture
def scratch_dir(tmp_path: Path) -> Path:
    """A directory on the work disk (ext4), never tmpfs, for O_DIRECT tests."""
    return tmp_path


@pytest.fixture
def bookie_factory(zk_chroot: str, tmp_path: Path) -> Iterator[Callable[..., BookieProcess]]:
    """Makes bookie processes on this test's ZooKeeper chroot; kills leftovers by PID."""
    cluster = ProcessCluster(tmp_path, zk=zk_chroot, settings={"zk_timeout_ms": 4000,
                                                               "journal_prealloc_mb": 4})

    def make(**settings: Any) -> BookieProcess:
        return cluster.add_bookie(settings=settings)

    yield make
    cluster.stop(graceful=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (not skip) the TLS variant of handler tests marked ``no_tls``: they drive
    a raw stream of their own, which a TLS-only bookie refuses by design; and the db
    variant of storage tests marked ``interleaved_only`` (about index files)."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if (params.get("transport") == "tls" and item.get_closest_marker("no_tls")) or (
                params.get("storage_class") == "db"
                and item.get_closest_marker("interleaved_only")):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
