"""A real cluster for the Kafka gateway tests: ZooKeeper, four bookie processes and a
``ledgerd gateway`` process, shared by a module (starting one per test would triple the
suite's time). Every test uses its own topics and groups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import trio

from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperServer, find_free_port
from tests.cluster import fresh_chroot, metadata_store, wait_registered

GATEWAY_ENV = {
    "LEDGERD_GROUP_INITIAL_REBALANCE_DELAY_MS": "200",
    "LEDGERD_EXPLICIT_LAC_INTERVAL_MS": "100",
    # small ledgers and a small tail cache: reads cross ledger rolls and go to bookies
    "LEDGERD_LOG_ROLL_BYTES": str(1 << 20),
    "LEDGERD_TAIL_CACHE_BYTES": str(64 << 10),
    "LEDGERD_MAX_APPEND_BYTES": str(64 << 10),
    "LEDGERD_GATEWAY_ADMIN_PORT": "0",
}


@dataclass
class GatewayProcess:
    """``ledgerd gateway`` on a fixed port (so a restart keeps the clients' address)."""

    zk: str
    log_path: Path
    port: int = field(default_factory=find_free_port)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    start_line: str = ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait (on its output, not the clock) for its "kafka gateway on"
        line; its output goes on to ``log_path`` from a thread."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ledgerd.tools.cli", "gateway", "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **GATEWAY_ENV, "LEDGERD_ZK_SERVERS": self.zk, **self.env},
            start_new_session=True)
        started = threading.Event()  # the start line, or end of output
        self.start_line = ""

        def copy(stream: IO[bytes]) -> None:
            with open(self.log_path, "ab") as log:
                for line in stream:
                    log.write(line)
                    log.flush()
                    if line.startswith(b"kafka gateway on"):
                        self.start_line = line.decode().strip()
                        started.set()
            started.set()

        assert self.process.stdout is not None
        threading.Thread(target=copy, args=(self.process.stdout,), daemon=True).start()
        started.wait(60)
        if not self.start_line:
            raise AssertionError("gateway did not start:\n" + self.log_text())

    @property
    def metrics_url(self) -> str:
        """From the start line: "kafka gateway on H:P (node N), metrics URL"."""
        return self.start_line.rsplit("metrics ", 1)[1]

    @property
    def node_id(self) -> int:
        """From the start line: "kafka gateway on H:P (node N), ..."."""
        return int(self.start_line.split("(node ")[1].split(")")[0])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
        return self.process.wait(30)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()


@dataclass
class KafkaCluster:
    zk: str
    bookies: list[BookieProcess]
    gateway: GatewayProcess

    @property
    def bootstrap(self) -> str:
        return self.gateway.bootstrap


@pytest.fixture(scope="module")
def kafka_cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[KafkaCluster]:
    base = tmp_path_factory.mktemp("kafka")
    with fresh_chroot(zookeeper, "kafka") as zk:
        with running_cluster(base, zk, 4, GatewayProcess(zk, base / "gateway.log")) as c:
            yield c


@contextmanager
def running_cluster(base: Path, zk: str, n: int, gateway: GatewayProcess,
                    settings: dict[str, object] | None = None) -> Iterator[KafkaCluster]:
    """``n`` registered bookie processes (``settings`` added to theirs) and ``gateway``
    started; all killed after."""
    bookies = [BookieProcess(base / f"bookie{i}", zk, settings={
        "zk_timeout_ms": 4000, "journal_prealloc_mb": 4, **(settings or {})})
        for i in range(n)]

    async def up() -> None:
        async with metadata_store(zk) as store:
            for b in bookies:
                b.start()
            for b in bookies:
                await wait_registered(store, b)

    try:
        trio.run(up)
        gateway.start()
        yield KafkaCluster(zk, bookies, gateway)
    finally:
        if gateway.running:
            gateway.stop(signal.SIGKILL)
        for b in bookies:
            if b.running:
                b.kill9()
