"""Real processes behind the fault proxy: one ZooKeeper, N bookies, named clients.

Every connection goes through a ``Link`` of the proxy: each bookie reaches ZooKeeper
through its own link, and each client reaches ZooKeeper and every bookie through links
of its own, so a fault can cut exactly one path. Bookies run with
``LEDGERD_FAULT_PLAN`` set, so storage faults can be armed in them (``native.faults``).
The processes are the one process cluster's (``ProcessCluster``), each bookie given its
own link as its ZooKeeper address. Processes are stopped by their PID only.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

import ledgerd
from ledgerd.base.faultpoints import FAULT_PLAN_ENV, FaultRule
from ledgerd.bookie_client import tcp_connect
from ledgerd.client import Client
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.faults.proxy import FaultProxy, Link
from ledgerd.tools.processcluster import ProcessCluster
from ledgerd.tools.zkserver import ZooKeeperServer

__all__ = ["FaultCluster", "arm_bookie", "fault_env"]

ZK_TIMEOUT_MS = 4000
EVENT_BOUND_S = 90.0


def fault_env(bookie: BookieProcess) -> dict[str, str]:
    """The environment that lets ``arm_bookie`` arm storage faults in ``bookie``."""
    return {FAULT_PLAN_ENV: str(bookie.base / "faultplan.json")}


async def arm_bookie(bookie: BookieProcess, rules: list[FaultRule], generation: int) -> None:
    """Write the plan, signal the bookie (started with ``fault_env``), and wait, on a
    FIFO the bookie writes the plan's generation into, until it has armed the rules."""
    plan = bookie.base / "faultplan.json"
    applied = bookie.base / "faultplan.json.applied"
    if not applied.is_fifo():
        applied.unlink(missing_ok=True)
        os.mkfifo(applied)
    tmp = plan.with_suffix(".tmp")
    tmp.write_text(json.dumps({"generation": generation,
                               "rules": [r.to_json() for r in rules]}))
    tmp.replace(plan)
    assert bookie.pid is not None, f"{bookie.name} is not running"
    fd = os.open(applied, os.O_RDONLY | os.O_NONBLOCK)  # before the signal: no ack lost
    try:
        os.kill(bookie.pid, signal.SIGUSR2)
        with trio.fail_after(30):
            while True:
                await trio.lowlevel.wait_readable(fd)
                data = os.read(fd, 256)
                if data:
                    if max(int(x) for x in data.split()) >= generation:
                        return
                    continue
                # A writer came and went (an older ack): wait for the next one.
                os.close(fd)
                fd = os.open(applied, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(fd)


class FaultCluster:
    def __init__(self, base: Path, nursery: trio.Nursery, *, bookies: int = 5,
                 bookie_settings: dict[str, Any] | None = None,
                 client_settings: dict[str, Any] | None = None) -> None:
        self.base = base
        self.nursery = nursery
        self.n = bookies
        self.bookie_settings = bookie_settings or {}
        self.client_settings = client_settings or {}  # every client's (TLS, for one)
        self.proxy = FaultProxy(nursery)
        self.processes = ProcessCluster(base, bookies=bookies, register_timeout=EVENT_BOUND_S)
        self.bookies = self.processes.bookies
        self.bookie_zk: list[Link] = []           # bookie i -> ZooKeeper
        self.client_zk: dict[str, Link] = {}      # client -> ZooKeeper
        self.client_bookie: dict[str, dict[str, Link]] = {}  # client -> bookie id -> link
        self.paused: set[int] = set()
        self.plan_generation = 0

    # -- start and stop ----------------------------------------------------------------

    @property
    def zk(self) -> ZooKeeperServer:
        assert self.processes.server is not None, "the cluster is not started"
        return self.processes.server

    async def start(self) -> None:
        await trio.to_thread.run_sync(self.processes.start_zookeeper)
        await self.processes.init_metadata()
        for i in range(self.n):
            link = await self.proxy.link(f"b{i}-zk", self.zk.connect_string)
            self.bookie_zk.append(link)
            settings = {"zk_timeout_ms": ZK_TIMEOUT_MS, "journal_prealloc_mb": 4,
                        "flush_interval_ms": 1000, **self.bookie_settings}
            self.processes.add_bookie(name=f"b{i}", directory=f"bookie{i}", zk=link.address,
                                      settings=settings)
        for bookie in self.bookies:
            bookie.start(env=self._env(bookie))
        await self.wait_writable()

    def _env(self, bookie: BookieProcess) -> dict[str, str]:
        return fault_env(bookie)

    def stop(self) -> None:
        for i, bookie in enumerate(self.bookies):
            if i in self.paused and bookie.pid is not None:
                os.kill(bookie.pid, signal.SIGCONT)
        self.processes.stop(graceful=False)

    @asynccontextmanager
    async def admin_store(self) -> AsyncIterator[ZooKeeperStore]:
        """A ZooKeeper session that bypasses the proxy (the harness's own view)."""
        async with self.processes.store() as store:
            yield store

    async def wait_writable(self) -> None:
        """Until every bookie is registered writable by its current process."""
        await self.processes.wait_registered()

    # -- clients -----------------------------------------------------------------------

    @asynccontextmanager
    async def client(self, name: str, **settings: Any) -> AsyncIterator[Client]:
        """A client whose every connection goes through its own links."""
        if name not in self.client_zk:
            self.client_zk[name] = await self.proxy.link(f"{name}-zk", self.zk.connect_string)
            self.client_bookie[name] = {
                b.bookie_id: await self.proxy.link(f"{name}-b{i}", b.bookie_id)
                for i, b in enumerate(self.bookies)}
        links = self.client_bookie[name]

        async def connect(address: str) -> trio.abc.Stream:
            link = links.get(address)
            return await tcp_connect(link.address if link else address)

        opts = {"zk_timeout_ms": ZK_TIMEOUT_MS, "add_entry_timeout_ms": 2000,
                "read_timeout_ms": 2000, "connect_timeout_ms": 2000, **self.client_settings,
                **settings}
        async with ledgerd.open_client(self.client_zk[name].address, connect=connect,
                                       **opts) as client:
            yield client

    def links_to_bookie(self, i: int) -> list[Link]:
        bid = self.bookies[i].bookie_id
        return [links[bid] for links in self.client_bookie.values()]

    # -- process and storage faults ----------------------------------------------------

    def pause(self, i: int) -> None:
        pid = self.bookies[i].pid
        if pid is not None and self.bookies[i].running:
            os.kill(pid, signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        pid = self.bookies[i].pid
        if i in self.paused and pid is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused.discard(i)

    async def kill(self, i: int) -> None:
        self.resume(i)
        await self._stop(i, signal.SIGKILL)

    async def restart(self, i: int, graceful: bool = True) -> None:
        """Stop (SIGTERM, SIGKILL after 20 s; or SIGKILL) and start again. Waits in a
        thread: the proxy, in this process, must keep forwarding the bookie's last
        ZooKeeper requests while it stops."""
        self.resume(i)
        if self.bookies[i].running:
            if not graceful or not await self._stop(i, signal.SIGTERM, 20):
                await self._stop(i, signal.SIGKILL)
        bookie = self.bookies[i]
        bookie.start(env=self._env(bookie))

    async def _stop(self, i: int, sig: signal.Signals, timeout: float = 30) -> bool:
        """Signal bookie ``i`` and wait for it to exit; False if it did not in time."""
        bookie = self.bookies[i]
        if not bookie.running or bookie.pid is None:
            return True
        os.kill(bookie.pid, sig)
        with trio.move_on_after(timeout):
            await bookie.exited()
            bookie.wait(0)
            return True
        return False

    async def arm_storage(self, i: int, rules: list[FaultRule]) -> None:
        """Arm ``rules`` in bookie ``i`` and wait until it has applied them."""
        self.plan_generation += 1
        await arm_bookie(self.bookies[i], rules, self.plan_generation)

    async def restart_zookeeper(self, down_s: float) -> None:
        await trio.to_thread.run_sync(self.zk.stop)
        await trio.sleep(down_s)
        await trio.to_thread.run_sync(self.zk.start)

    async def heal(self) -> None:
        """Every link open, every bookie running and writable, no storage fault armed."""
        self.proxy.heal_all()
        for i in list(self.paused):
            self.resume(i)
        if self.zk.process is None or self.zk.process.poll() is not None:
            await trio.to_thread.run_sync(self.zk.start)
        for i, bookie in enumerate(self.bookies):
            plan = bookie.base / "faultplan.json"
            if plan.exists():
                plan.unlink()
                (bookie.base / "faultplan.json.applied").unlink(missing_ok=True)
                await self.restart(i)   # a journal that failed stays failed: restart the bookie
            elif not bookie.running:
                bookie.start(env=self._env(bookie))
        await self.wait_writable()
