"""Restoring a busy cursor's version (issue 49 review): a node at version V brought back
by one compare-and-set write per version (the restore before) and by
``ZooKeeperStore.raise_versions`` (transactions of 1,000 writes, pipelined), on a real
ZooKeeper of its own.

    python bench/metadata_versions.py [--versions 1000000] [--old-versions 10000]

Prints one JSON document: seconds for each, and the version reached.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import trio

from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.testing.cluster import ProcessCluster


async def main(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"load_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="ledgerd-versions-bench-") as tmp:
        cluster = ProcessCluster(Path(tmp), bookies=0)
        try:
            cluster.start_zookeeper()
            assert cluster.server is not None
            store = await ZooKeeperStore.connect(cluster.server.connect_string)
            try:
                await store.create("/old", b"cursor")
                t0 = time.monotonic()
                have = 0
                while have < args.old_versions:
                    have = (await store.set("/old", b"cursor", have)).version
                out["one_write_per_version"] = {
                    "versions": have, "s": round(time.monotonic() - t0, 2)}
                await store.create("/new", b"cursor")
                t0 = time.monotonic()
                errors = await store.raise_versions([("/new", b"cursor", 0, args.versions)])
                assert errors == [None], errors
                data, stat = await store.get("/new")
                assert (data, stat.version) == (b"cursor", args.versions)
                out["transactions"] = {"versions": stat.version,
                                       "s": round(time.monotonic() - t0, 2)}
            finally:
                await store.close()
        finally:
            cluster.stop()
    out["load_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=1_000_000)
    parser.add_argument("--old-versions", type=int, default=10_000)
    print(json.dumps(trio.run(main, parser.parse_args())))
