"""A local cluster: one ZooKeeper (or a given one) and N bookie processes on loopback.

``ledgerd local`` runs it in the foreground; stops are by PID (SIGTERM to bookies, then
ZooKeeper). With ``--data`` the directories survive, so a restart finds its ledgers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import trio

from ledgerd.base.credentials import generate_secret
from metadata.cluster import init_new_cluster
from metadata.registry import BookieRegistry, BookieSet
from metadata.zookeeper import ZooKeeperStore
from tools.bookieprocess import BookieProcess
from tools.zkserver import ZooKeeperError, ZooKeeperServer, find_free_port

__all__ = ["LocalCluster", "LocalClusterError"]

BASE_PORT = 3181


class LocalClusterError(RuntimeError):
    pass


class LocalCluster:
    def __init__(self, base: Path, *, bookies: int = 3, zk: str | None = None,
                 register_timeout: float = 60.0) -> None:
        self.base = Path(base)
        self.count = bookies
        self.zk = zk or ""
        self.server: ZooKeeperServer | None = None
        self.bookies: list[BookieProcess] = []
        self.register_timeout = register_timeout
        self._dead: set[str] = set()

    def start(self) -> None:
        if not self.zk:
            self.server = ZooKeeperServer(data_dir=self.base / "zookeeper", port=0)
            try:
                self.server.start()
            except ZooKeeperError as exc:
                raise LocalClusterError(str(exc)) from exc
            self.zk = self.server.connect_string
        trio.run(self._init)
        secret = self.base / "cluster.secret"
        if not secret.exists():
            self.base.mkdir(parents=True, exist_ok=True)
            generate_secret(secret)
        # Autorecovery in every bookie, no delay: a killed bookie's ledgers are copied
        # back to full replication at once (docs/autorecovery.md).
        settings = {"cluster_secret_file": str(secret), "auto_recovery_daemon_enabled": True,
                    "lost_bookie_recovery_delay_s": 0,
                    "open_ledger_rereplication_grace_period_ms": 10000}
        for i in range(self.count):
            bookie = BookieProcess(self.base / f"bookie{i}", self.zk, port=self._port(i),
                                   name=f"bookie{i}", settings=settings)
            self.bookies.append(bookie)
            bookie.start()
        trio.run(self._wait_registered)

    def _port(self, i: int) -> int:
        """A stable port per bookie when free (cookies name it), else any free one."""
        settings = self.base / f"bookie{i}" / "bookie.toml"
        if settings.exists():
            for line in settings.read_text().splitlines():
                if line.startswith("bookie_port"):
                    return int(line.split("=")[1])
        return find_free_port()

    async def _init(self) -> None:
        store = await ZooKeeperStore.connect(self.zk)
        try:
            await init_new_cluster(store, "/ledgers")
        finally:
            await store.close()

    async def _wait_registered(self) -> None:
        store = await ZooKeeperStore.connect(self.zk)
        ids = {b.bookie_id for b in self.bookies}

        async def all_registered(listed: BookieSet) -> bool:
            return ids <= listed.writable | listed.read_only

        async def died(bookie: BookieProcess) -> None:
            await bookie.exited()
            raise LocalClusterError(f"{bookie.name} exited:\n{bookie.log_tail()}")

        try:
            with trio.move_on_after(self.register_timeout) as scope:
                try:
                    async with trio.open_nursery() as nursery:
                        for bookie in self.bookies:
                            nursery.start_soon(died, bookie)
                        await BookieRegistry(store, "/ledgers").wait_for(all_registered)
                        nursery.cancel_scope.cancel()
                except ExceptionGroup as group:
                    dead = group.subgroup(LocalClusterError)
                    if dead is None:
                        raise
                    raise dead.exceptions[0] from None
            if scope.cancelled_caught:
                raise LocalClusterError(
                    f"bookies not registered after {self.register_timeout:.0f}s; logs under "
                    f"{self.base}")
        finally:
            await store.close()

    def check(self) -> str:
        """A description of what died so that the cluster cannot go on, or "": ZooKeeper,
        or every bookie. A single dead bookie is reported by ``newly_dead`` instead (its
        ledgers are re-replicated by the others' autorecovery)."""
        if self.server is not None and self.server.process is not None \
                and self.server.process.poll() is not None:
            return f"ZooKeeper (pid {self.server.pid}) exited unexpectedly"
        if self.bookies and not any(b.running for b in self.bookies):
            b = self.bookies[0]
            return f"every bookie exited; {b.name}'s log:\n{b.log_tail()}"
        return ""

    def newly_dead(self) -> list[BookieProcess]:
        """Bookies that exited since the last call."""
        out = [b for b in self.bookies if not b.running and b.name not in self._dead]
        self._dead.update(b.name for b in out)
        return out

    def stop(self) -> None:
        for b in self.bookies:
            if b.running:
                try:
                    b.terminate(timeout=60)
                except subprocess.TimeoutExpired:
                    b.kill9()
        if self.server is not None:
            self.server.stop()
