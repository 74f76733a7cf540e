"""Spark tests: one local[2] SparkSession for the session, one cluster per module.

The cluster is a real ZooKeeper (the session's) and three real bookie processes; the
workers run the driver's Python (``PYSPARK_PYTHON``), so they import this checkout.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot, start_bookies

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    # py4j logs "Closing down clientserver connection" from __del__ at interpreter exit,
    # after pytest has closed the stream its handler writes to.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from pyspark.sql import SparkSession

    import ledgerd.spark

    # Spark's scratch files (blockmgr-*, artifacts-*, spark-*) in the session's own
    # directory, which pytest removes, not in /tmp.
    local = tmp_path_factory.mktemp("spark-local")
    session = (SparkSession.builder.master("local[2]").appName("ledgerd-tests")
               .config("spark.local.dir", str(local))
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={local}")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.task.maxFailures", "1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    ledgerd.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


class SparkCluster:
    def __init__(self, zk: str, bookies: list[BookieProcess]) -> None:
        self.zk = zk
        self.bookies = bookies

    def by_id(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[SparkCluster]:
    base = tmp_path_factory.mktemp("spark-cluster")
    with fresh_chroot(zookeeper, request.module.__name__.rsplit(".", 1)[-1]) as zk:
        made: list[BookieProcess] = []

        def make() -> BookieProcess:
            b = BookieProcess(base / f"bookie{len(made)}", zk,
                              settings={"zk_timeout_ms": 4000, "journal_prealloc_mb": 4})
            made.append(b)
            return b

        try:
            bookies = trio.run(start_bookies, make, zk, 3)
            yield SparkCluster(zk, bookies)
        finally:
            from ledgerd.spark.worker import close_clients

            close_clients()  # this process's cached clients, before their chroot goes
            for b in made:
                if b.running:
                    b.kill9()
