"""Metadata disaster recovery at scale: snapshot, restore and rebuild times for N ledgers
over B bookie processes (issue 49's goal: rebuild of 100,000 ledgers over 5 bookies in
under 5 minutes).

    python bench/metadata_rebuild.py [--ledgers 100000] [--bookies 5] [--entries 2]
                                     [--concurrency 64] [--json]

A cluster of its own (ZooKeeper and B bookie processes under a temporary directory) is
filled with N closed E3/Qw2/Qa2 ledgers of ``--entries`` entries each; then timed, each
through the real CLI: ``metadata snapshot``; the root deleted; ``metadata restore``;
the root deleted again; ``metadata rebuild`` (dry run: gather every bookie's holdings,
read entry 0 of every ledger, plan) and ``rebuild --apply``. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trio

import ledgerd
from ledgerd.testing.cluster import metadata_store, process_cluster


async def _shell(zk: str, *args: str) -> float:
    t0 = time.monotonic()
    done = await trio.run_process(
        [sys.executable, "-m", "ledgerd.tools.cli", "shell", "--zk", zk, "metadata", *args],
        capture_stdout=True, capture_stderr=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"metadata {args[0]} failed: {done.stderr.decode()[-2000:]}")
    return time.monotonic() - t0


async def _count(zk: str) -> int:
    from ledgerd.metadata.ledgers import LedgerManager

    async with metadata_store(zk, init=False) as store:
        return len([lid async for lid in LedgerManager(store, "/ledgers").iter_ledger_ids()])


async def main(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"ledgers": args.ledgers, "bookies": args.bookies,
                              "entries": args.entries}
    with tempfile.TemporaryDirectory(prefix="ledgerd-dr-bench-") as tmp:
        async with process_cluster(Path(tmp), bookies=args.bookies,
                                   settings={"journal_prealloc_mb": 4}) as cluster:
            zk = cluster.zk
            t0 = time.monotonic()
            limit = trio.Semaphore(args.concurrency)
            async with ledgerd.open_client(zk, throttle=0) as client:
                async def one(i: int) -> None:
                    async with limit:
                        lh = await client.create_ledger(3, 2, 2, password=b"pw")
                        for e in range(args.entries):
                            await lh.append(b"entry-%d-%d" % (i, e))
                        await lh.close()

                async with trio.open_nursery() as nursery:
                    for i in range(args.ledgers):
                        nursery.start_soon(one, i)
            out["fill_s"] = round(time.monotonic() - t0, 1)
            snap = Path(tmp) / "meta.snap"
            out["snapshot_s"] = round(await _shell(zk, "snapshot", str(snap)), 1)
            out["snapshot_bytes"] = snap.stat().st_size
            async with metadata_store(zk, init=False) as store:
                await store.delete("/ledgers", recursive=True)
            out["restore_s"] = round(await _shell(zk, "restore", str(snap)), 1)
            if await _count(zk) != args.ledgers:
                raise SystemExit("the restore lost ledgers")
            async with metadata_store(zk, init=False) as store:
                await store.delete("/ledgers", recursive=True)
            named = ",".join(b.address for b in cluster.bookies)
            out["rebuild_dry_run_s"] = round(await _shell(zk, "rebuild", "--bookies", named), 1)
            out["rebuild_apply_s"] = round(await _shell(zk, "rebuild", "--bookies", named,
                                                        "--apply"), 1)
            out["rebuilt_ledgers"] = await _count(zk)
            if out["rebuilt_ledgers"] != args.ledgers:
                raise SystemExit(f"rebuilt {out['rebuilt_ledgers']} of {args.ledgers} ledgers")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--entries", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    print(json.dumps(trio.run(main, parser.parse_args())))
