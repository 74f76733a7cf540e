"""``wait_registered`` on a bookie whose disk is over its threshold: it registers
read-only, and the wait fails naming the disk, not with a bare TooSlowError (as CI saw
when its disk filled): at once at a bring-up (``full_disk_fails``, ``start_bookies``,
``ProcessCluster.start``), at ``EVENT_BOUND_S`` otherwise (a test may be freeing space,
as tests/integration/test_disk_full.py does)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerd.testing.cluster import BookieProcess, BookieReadOnly, ClusterError, ProcessCluster
from tests.cluster import metadata_store, wait_registered


async def test_a_bookie_read_only_for_a_full_disk_fails_the_wait_at_once(
        zk_chroot: str, bookie_factory: Callable[..., BookieProcess]) -> None:
    # Threshold 0: every directory counts as full, as on a disk past 95%.
    b = bookie_factory(disk_usage_threshold=0.0, disk_usage_lwm_threshold=0.0)
    async with metadata_store(zk_chroot) as store:
        b.start()
        await wait_registered(store, b, read_only=True)
        t0 = time.monotonic()
        with pytest.raises(BookieReadOnly, match=r"read-only, not writable: .*full"):
            await wait_registered(store, b, full_disk_fails=True)
        assert time.monotonic() - t0 < 10


async def test_a_wait_that_runs_out_on_a_full_disk_names_the_disk(
        zk_chroot: str, bookie_factory: Callable[..., BookieProcess],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ledgerd.testing.cluster as cluster

    b = bookie_factory(disk_usage_threshold=0.0, disk_usage_lwm_threshold=0.0)
    async with metadata_store(zk_chroot) as store:
        b.start()
        # the process's start under the usual bound (a loaded CI host took over 2 s)
        await wait_registered(store, b, read_only=True)
        monkeypatch.setattr(cluster, "EVENT_BOUND_S", 2)  # then a wait that runs out
        with pytest.raises(BookieReadOnly, match=r"read-only, not writable: .*full"):
            await wait_registered(store, b)


async def test_a_writable_bookie_still_passes_the_wait(
        zk_chroot: str, bookie_factory: Callable[..., BookieProcess]) -> None:
    b = bookie_factory()
    async with metadata_store(zk_chroot) as store:
        b.start()
        await wait_registered(store, b)


async def test_a_process_cluster_on_a_full_disk_fails_its_start_naming_the_disk(
        zk_chroot: str, tmp_path: Path) -> None:
    """``ledgerd local``, the fault harness and the bench scripts start through
    ``ProcessCluster``: the same full disk stops its start at once, not after
    ``register_timeout``."""
    cluster = ProcessCluster(tmp_path, bookies=1, zk=zk_chroot, register_timeout=60,
                             settings={"disk_usage_threshold": 0.0,
                                       "disk_usage_lwm_threshold": 0.0})
    t0 = time.monotonic()
    try:
        with pytest.raises(ClusterError, match=r"read-only, not writable: 127\.0\.0\.1:\d+: "
                                               r"journal directory unusable .*full"):
            await cluster.start()
    finally:
        cluster.stop(graceful=False)
    assert time.monotonic() - t0 < 30
