"""Shared fixtures: trio mode (see pyproject), a real ZooKeeper, a chroot per test.

The ZooKeeper server comes from the Debian ``zookeeper`` package that ``make test``
installs. It is started once per session on a free loopback port and stopped by its
PID at the end. Tests never skip when it is missing: a missing dependency is a failure.
Both it and the bookie processes of ``bookie_factory`` come from the one process
cluster (``ledgerd.testing.cluster.ProcessCluster``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from math import inf
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ledgerd.testing.cluster import BookieProcess, ProcessCluster, ZooKeeperServer, fresh_chroot


def _autojump_waits_for_real_work(clock: trio.testing.MockClock,
                                  monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """The clock's autojump held off while its run waits on real work: a
    ``trio.to_thread.run_sync`` call, or a journal group on a native syncer thread
    (``native.Syncer``: submitted, not yet collected).

    The autojump moves virtual time to the next deadline once every task has waited
    ``autojump_threshold`` of real time, and a task waiting on a thread counts as
    waiting. On a loaded host a journal write and its fdatasync (or the entry log's
    flush, the zeroer) can take longer than that, and the jump then fires virtual
    timeouts (an add's 1 s, a poll's 3 s) on work that was never late. Holding the
    threshold at infinity meanwhile, virtual time moves only when every task waits on
    the clock itself. (MockClock cannot be subclassed.)"""
    from ledgerd import native

    threads = 0
    syncers: set[int] = set()  # id() of the syncers with a job in flight
    held = clock.autojump_threshold

    def ours() -> bool:
        try:
            return trio.lowlevel.current_clock() is clock
        except RuntimeError:  # not in a trio run
            return False

    def update(was_busy: bool) -> None:
        nonlocal held
        busy = bool(threads or syncers)
        if busy and not was_busy:
            held, clock.autojump_threshold = clock.autojump_threshold, inf
        elif was_busy and not busy:
            clock.autojump_threshold = held

    run_sync = trio.to_thread.run_sync

    async def run_sync_holding_the_clock(*args: Any, **kwargs: Any) -> Any:
        nonlocal threads
        if not ours():  # another trio run (a sync client's)
            return await run_sync(*args, **kwargs)
        was_busy = bool(threads or syncers)
        threads += 1
        update(was_busy)
        try:
            return await run_sync(*args, **kwargs)
        finally:
            was_busy = bool(threads or syncers)
            threads -= 1
            update(was_busy)

    submit, collect, close = native.Syncer.submit, native.Syncer.collect, native.Syncer.close

    def job_done(syncer: native.Syncer) -> None:
        if id(syncer) in syncers:
            was_busy = bool(threads or syncers)
            syncers.discard(id(syncer))
            update(was_busy)

    def submit_holding_the_clock(self: native.Syncer, *args: Any, **kwargs: Any) -> None:
        submit(self, *args, **kwargs)
        if ours():
            was_busy = bool(threads or syncers)
            syncers.add(id(self))
            update(was_busy)

    def collect_releasing_the_clock(self: native.Syncer) -> float | None:
        try:
            seconds = collect(self)
        except OSError:
            job_done(self)
            raise
        if seconds is not None:
            job_done(self)
        return seconds

    def close_releasing_the_clock(self: native.Syncer) -> None:
        close(self)
        job_done(self)

    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync_holding_the_clock)
    monkeypatch.setattr(native.Syncer, "submit", submit_holding_the_clock)
    monkeypatch.setattr(native.Syncer, "collect", collect_releasing_the_clock)
    monkeypatch.setattr(native.Syncer, "close", close_releasing_the_clock)
    return clock


@pytest.fixture
def mock_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """pytest-trio's ``mock_clock``, its autojump (if a test sets one) waiting for real
    work (``_autojump_waits_for_real_work``)."""
    return _autojump_waits_for_real_work(trio.testing.MockClock(), monkeypatch)


@pytest.fixture
def autojump_clock(monkeypatch: pytest.MonkeyPatch) -> trio.testing.MockClock:
    """pytest-trio's ``autojump_clock``, its autojump waiting for real work
    (``_autojump_waits_for_real_work``)."""
    return _autojump_waits_for_real_work(trio.testing.MockClock(autojump_threshold=0),
                                       monkeypatch)


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
