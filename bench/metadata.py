"""Ledger create + close metadata operations/s against a real ZooKeeper.

Starts its own ZooKeeper (Debian package) on a free loopback port, initialises a cluster,
then for ``--seconds`` runs ``--concurrency`` tasks that each loop: generate an id, create
the ledger's metadata, close it with a CAS update. One "ledger" = 4 ZooKeeper writes
(idgen create + delete, metadata create, CAS set) and 1 read.

Run: ``python bench/metadata.py [--seconds 10] [--concurrency 1,16]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This script is named like the `metadata` package it measures; drop its own directory
# from the import path so `import metadata` finds the package, not this file.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import trio  # noqa: E402

from ledgerd.metadata.cluster import init_new_cluster  # noqa: E402
from ledgerd.metadata.ledger import LedgerMetadata  # noqa: E402
from ledgerd.metadata.ledgers import LedgerManager  # noqa: E402
from ledgerd.metadata.zookeeper import ZooKeeperStore  # noqa: E402
from ledgerd.tools.processcluster import ProcessCluster  # noqa: E402


async def run(servers: str, seconds: float, concurrency: int) -> dict[str, float]:
    store = await ZooKeeperStore.connect(servers)
    try:
        await init_new_cluster(store, "/ledgers")
        mgr = LedgerManager(store, "/ledgers")
        meta = LedgerMetadata(ensemble_size=3, write_quorum=2, ack_quorum=2,
                              ensembles=((0, ("127.0.0.1:3181", "127.0.0.1:3182",
                                              "127.0.0.1:3183")),))
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                lid, _ = await mgr.create(meta)
                await mgr.update(lid, lambda m: m.closed(99, 1024 * 100))
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        took = time.perf_counter() - start
    finally:
        await store.close()
    latencies.sort()
    return {
        "concurrency": concurrency,
        "ledgers_per_s": len(latencies) / took,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ledgerd-bench-zk-") as tmp:
        cluster = ProcessCluster(Path(tmp), bookies=0)  # ZooKeeper alone
        try:
            zk = cluster.start_zookeeper()
            results = [trio.run(run, zk, args.seconds, int(c))
                       for c in args.concurrency.split(",")]
        finally:
            cluster.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'concurrency':>11} {'ledgers/s':>10} {'ZK ops/s':>9} {'p50 ms':>7} {'p99 ms':>7}")
    for r in results:
        print(f"{r['concurrency']:>11} {r['ledgers_per_s']:>10.0f} {r['ledgers_per_s'] * 5:>9.0f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}")


if __name__ == "__main__":
    main()
