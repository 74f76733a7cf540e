"""The one way to bring up ZooKeeper and bookie processes on this machine.

``ProcessCluster`` is a ZooKeeper (started here, or one given by its connect string)
with the cluster's metadata initialised under ``root``, and bookie processes
(``BookieProcess``: a TOML config each, run as ``ledgerd bookie``) each on a free
loopback port with its own directories under ``base``. ``ledgerd local``
(``LocalCluster``), the fault harness (``FaultCluster``), the tests
(``ledgerd.testing.process_cluster``) and the bench scripts all start their clusters
through it, so a bring-up rule (initialise the metadata before the first bookie, wait on
the registry's watch and never on the clock, fail at once with a bookie's log when it
exits while awaited) lives here only.

Every process is stopped by the PID this process started: ``stop()`` sends SIGTERM (the
graceful path: drain, checkpoint, deregister) and SIGKILL after ``stop_timeout``;
``stop(graceful=False)`` sends SIGKILL at once.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ledgerd.metadata.cluster import init_new_cluster
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperError, ZooKeeperServer

__all__ = ["ClusterError", "ProcessCluster", "process_cluster"]


class ClusterError(RuntimeError):
    """The cluster could not be brought up: ZooKeeper did not start, or a bookie exited
    or did not register in time (the message carries its log's tail)."""


class ProcessCluster:
    """ZooKeeper and bookie processes; see the module docstring.

    ``settings`` are every bookie's (``add_bookie`` takes more); ``env`` and ``cwd``
    are the bookie processes' (``cwd`` runs another checkout's code); ``chroot`` (a
    node such as ``/bench``, created when missing) puts the whole cluster under it.
    """

    def __init__(self, base: Path, *, bookies: int = 3, zk: str | None = None,
                 root: str = "/ledgers", layout: str = "hierarchical", chroot: str = "",
                 settings: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 register_timeout: float = 120.0, stop_timeout: float = 60.0) -> None:
        self.base = Path(base)
        self.count = bookies
        self.zk = zk or ""                     # the connect string, once known
        self.root = root
        self.layout = layout
        self.chroot = chroot
        self.settings: dict[str, Any] = dict(settings or {})
        self.env = dict(env or {})
        self.cwd = cwd
        self.register_timeout = register_timeout
        self.stop_timeout = stop_timeout
        self.server: ZooKeeperServer | None = None
        self.bookies: list[BookieProcess] = []

    # -- bring-up -------------------------------------------------------------------

    def start_zookeeper(self) -> str:
        """Start our own ZooKeeper unless one was given; its connect string. Blocks
        until it serves (run it in a thread from async code)."""
        if not self.zk:
            self.server = ZooKeeperServer(data_dir=self.base / "zookeeper", port=0)
            try:
                self.server.start()
            except ZooKeeperError as exc:
                raise ClusterError(str(exc)) from exc
            self.zk = self.server.connect_string
        return self.zk

    async def init_metadata(self) -> None:
        """Create the chroot, if any, and the cluster's nodes under ``root``
        (idempotent)."""
        if self.chroot and not self.zk.endswith(self.chroot):
            async with self.store() as store:
                if await store.exists(self.chroot) is None:
                    await store.create(self.chroot)
            self.zk += self.chroot
        async with self.store() as store:
            await init_new_cluster(store, self.root, self.layout)

    @asynccontextmanager
    async def store(self) -> AsyncIterator[ZooKeeperStore]:
        """A metadata session of our own to this cluster's ZooKeeper."""
        store = await ZooKeeperStore.connect(self.zk)
        try:
            yield store
        finally:
            with trio.CancelScope(shield=True):
                await store.close()

    def add_bookie(self, *, name: str | None = None, port: int = 0, zk: str | None = None,
                   settings: Mapping[str, Any] | None = None,
                   directory: str | None = None) -> BookieProcess:
        """A new bookie (not started) under ``base/<directory>`` (default: its name),
        reaching ZooKeeper at ``zk`` (default: the cluster's connect string)."""
        name = name or f"bookie{len(self.bookies)}"
        bookie = BookieProcess(self.base / (directory or name),
                               zk if zk is not None else self.zk,
                               port=port, name=name, settings={**self.settings,
                                                               **(settings or {})})
        self.bookies.append(bookie)
        return bookie

    def start_bookie(self, bookie: BookieProcess, env: Mapping[str, str] | None = None
                     ) -> None:
        bookie.start(env={**self.env, **(env or {})}, cwd=self.cwd)

    async def start(self) -> None:
        """Bring the whole cluster up: ZooKeeper, the metadata, ``bookies`` bookies (or
        the ones already added), each running and registered writable."""
        await trio.to_thread.run_sync(self.start_zookeeper)
        await self.init_metadata()
        while len(self.bookies) < self.count:
            self.add_bookie()
        await self.start_bookies()

    async def start_bookies(self, bookies: Sequence[BookieProcess] | None = None) -> None:
        """Start ``bookies`` (default: every one added and not running) and wait until
        they are registered writable."""
        waited = [b for b in (self.bookies if bookies is None else bookies) if not b.running]
        for bookie in waited:
            self.start_bookie(bookie)
        await self.wait_registered(waited, full_disk_fails=True)

    async def wait_registered(self, bookies: Sequence[BookieProcess] | None = None, *,
                              writable: bool = True, full_disk_fails: bool = False) -> None:
        """Until ``bookies`` (default: all) are registered by the processes we started
        (writable, or with ``writable=False`` read-only too). ClusterError, with its
        log, if one exits first; ClusterError after ``register_timeout`` seconds, naming
        the disk if one is read-only for a full disk (at once with ``full_disk_fails``:
        a bring-up, where nobody will free space)."""
        waited = list(self.bookies if bookies is None else bookies)
        pids = {b.bookie_id: b.pid for b in waited}

        async def died(bookie: BookieProcess) -> None:
            # Polled, not waited for in a thread: an abandoned thread would stay blocked
            # in waitpid, holding one of trio's worker-thread tokens, as long as the
            # bookie lives, and a harness that waits often would run out of them.
            while bookie.running:
                await trio.sleep(0.05)
            code = bookie.process.returncode if bookie.process is not None else None
            raise ClusterError(f"{bookie.name} exited with {code}:\n{bookie.log_tail()}")

        async with self.store() as store:
            registry = BookieRegistry(store, self.root)

            async def all_registered(listed: BookieSet) -> bool:
                if (writable and full_disk_fails
                        and (full := await registry.full_disk_reason(listed, pids))):
                    raise ClusterError(f"bookie registered read-only, not writable: {full}. "
                                       f"Free disk space (or raise disk_usage_threshold).")
                return await registry.registered_by(listed, pids, writable=writable)

            with trio.move_on_after(self.register_timeout) as scope:
                try:
                    async with trio.open_nursery() as nursery:
                        for bookie in waited:
                            nursery.start_soon(died, bookie)
                        await registry.wait_for(all_registered)
                        nursery.cancel_scope.cancel()
                except ExceptionGroup as group:
                    first: BaseException | None = group.subgroup(ClusterError)
                    if first is None:
                        raise
                    while isinstance(first, BaseExceptionGroup):
                        first = first.exceptions[0]
                    raise first from None
            if scope.cancelled_caught:
                full = (await registry.full_disk_reason(await registry.list_bookies(), pids)
                        if writable else None)
                why = f" (read-only for a full disk: {full})" if full else ""
                raise ClusterError(f"bookies not registered after "
                                   f"{self.register_timeout:.0f}s{why}; logs under {self.base}")

    # -- stop -----------------------------------------------------------------------

    def stop(self, *, graceful: bool = True) -> None:
        """Stop every running bookie (SIGTERM, SIGKILL after ``stop_timeout``; or SIGKILL
        at once), then our ZooKeeper. Blocks (run it in a thread from async code)."""
        for bookie in self.bookies:
            if not bookie.running:
                continue
            if graceful:
                try:
                    bookie.terminate(timeout=self.stop_timeout)
                    continue
                except subprocess.TimeoutExpired:
                    pass
            bookie.kill9()
        if self.server is not None:
            self.server.stop()


@asynccontextmanager
async def process_cluster(base: Path, *, bookies: int = 3, graceful: bool = True,
                          **options: Any) -> AsyncIterator[ProcessCluster]:
    """A running ``ProcessCluster`` (see it for ``options``) for the body; stopped after
    it, also when it raises or is cancelled (the stop is shielded)::

        async with process_cluster(tmp_path, bookies=3) as cluster:
            async with ledgerd.open_client(cluster.zk) as client:
                ...
    """
    cluster = ProcessCluster(base, bookies=bookies, **options)
    try:
        await cluster.start()
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: cluster.stop(graceful=graceful))
