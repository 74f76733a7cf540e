"""Metadata disaster recovery at scale: snapshot, restore and rebuild times for N ledgers
over B bookie processes (issue 49's goal: rebuild of 100,000 ledgers over 5 bookies in
under 5 minutes).

    python bench/metadata_rebuild.py [--ledgers 100000] [--bookies 5] [--entries 2]
                                     [--concurrency 64] [--fill-procs 3]
                                     [--gc-wait-ms MS] [--json]

A cluster of its own (ZooKeeper and B bookie processes under a temporary directory,
deleted at the end) is filled with N closed E3/Qw2/Qa2 ledgers of ``--entries`` entries
each: real ledgers, written through the client to the bookies, by ``--fill-procs``
client processes with ``--concurrency`` ledgers in flight each. Then timed, each
through the real CLI: ``metadata snapshot``; the root deleted; ``metadata restore``;
the root deleted again; ``metadata rebuild`` (dry run: gather every bookie's holdings,
read entry 0 of every ledger, plan) and ``rebuild --apply``. Each step's peak RSS (from
``/usr/bin/time``) and the load average after it are recorded, and the LedgerHoldings
stream each bookie sends (pages, ledgers, ranges, bytes on the wire). Prints one JSON
document.

The root is deleted (``delete_root``: LAYOUT first, then recursively) while the bookies
run, GC included: with ``--gc-wait-ms 1000`` their passes fall inside those deletes. A
plain recursive delete there let GC delete live ledgers (issue #49: 2,243 of 5,000
rebuilt even with GC's two-pass rule, the delete outlasting two 1 s passes).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

import ledgerd
from ledgerd.metadata.cluster import delete_root
from ledgerd.testing.cluster import metadata_store, process_cluster


def _load() -> float:
    return round(os.getloadavg()[0], 2)


PROFILE_DIR: str | None = None  # --profile: each step's cProfile output goes there


async def _shell(out: dict[str, object], step: str, zk: str, *args: str) -> None:
    """Run ``shell metadata ARGS`` under /usr/bin/time; records ``<step>_s``, its peak RSS
    (``<step>_rss_mb``) and the 1-minute load average after it (``<step>_load``)."""
    profile = ["-m", "cProfile", "-o", f"{PROFILE_DIR}/{step}.prof"] if PROFILE_DIR else []
    with tempfile.NamedTemporaryFile(prefix="ledgerd-dr-rss-") as rss:
        t0 = time.monotonic()
        done = await trio.run_process(
            ["/usr/bin/time", "-o", rss.name, "-f", "%M", sys.executable, *profile, "-m",
             "ledgerd.tools.cli", "shell", "--zk", zk, "metadata", *args],
            capture_stdout=True, capture_stderr=True, check=False)
        elapsed = time.monotonic() - t0
        if done.returncode != 0:
            raise SystemExit(f"metadata {args[0]} failed: {done.stderr.decode()[-2000:]}")
        kb = Path(rss.name).read_text().strip().splitlines()[-1]
    out[f"{step}_s"] = round(elapsed, 1)
    out[f"{step}_rss_mb"] = round(int(kb) / 1024, 1)
    out[f"{step}_load"] = _load()
    out[f"{step}_stdout_bytes"] = len(done.stdout)
    if "--json" in args:  # what a rebuild wrote and why not more (a short count fails)
        doc = json.loads(done.stdout)
        ledgers = doc.get("ledgers", [])
        out[f"{step}_written"] = doc.get("written")
        out[f"{step}_planned"] = len(ledgers)
        out[f"{step}_not_rebuildable"] = sum(1 for x in ledgers if x["metadata"] is None)
        out[f"{step}_unreachable"] = doc.get("unreachable")
        problems = sorted({p for x in ledgers for p in x["problems"]})
        out[f"{step}_problems"] = problems[:5]


async def _fill(zk: str, first: int, count: int, entries: int, concurrency: int) -> None:
    """Write ``count`` closed ledgers (one client, ``concurrency`` in flight)."""
    limit = trio.Semaphore(concurrency)
    async with ledgerd.open_client(zk, throttle=0) as client:
        async def one(i: int) -> None:
            async with limit:
                lh = await client.create_ledger(3, 2, 2, password=b"pw")
                for e in range(entries):
                    await lh.append(b"entry-%d-%d" % (i, e))
                await lh.close()

        async with trio.open_nursery() as nursery:
            for i in range(first, first + count):
                nursery.start_soon(one, i)


async def _holdings_stream(address: str) -> dict[str, int]:
    """The LedgerHoldings pages one bookie sends for a full listing (the rebuild's page
    sizes): pages, ledgers, ranges and the bytes of the response frames."""
    from ledgerd.bookie_client import open_bookie_client
    from ledgerd.tools.metadata_rebuild import PAGE_LEDGERS, PAGE_RANGES
    from ledgerd.wire.frames import encode_response
    from ledgerd.wire.messages import LedgerHoldingsRequest, LedgerHoldingsResponse

    got = {"pages": 0, "ledgers": 0, "ranges": 0, "bytes": 0}
    first_ledger, first_entry = 0, 0
    async with open_bookie_client(address, connect_timeout=5) as c:
        while True:
            st, resp = await c.call(LedgerHoldingsRequest(
                first_ledger_id=first_ledger, first_entry_id=first_entry,
                max_ledgers=PAGE_LEDGERS, max_ranges=PAGE_RANGES))
            assert isinstance(resp, LedgerHoldingsResponse), st
            got["pages"] += 1
            got["ledgers"] += len(resp.ledgers)
            got["ranges"] += len(resp.ranges)
            got["bytes"] += len(encode_response(0, st, resp))
            if resp.is_last:
                return got
            first_ledger, first_entry = resp.next_ledger_id, resp.next_entry_id


async def _count(zk: str) -> int:
    from ledgerd.metadata.ledgers import LedgerManager

    async with metadata_store(zk, init=False) as store:
        return len([lid async for lid in LedgerManager(store, "/ledgers").iter_ledger_ids()])


async def main(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"ledgers": args.ledgers, "bookies": args.bookies,
                              "entries": args.entries, "fill_procs": args.fill_procs,
                              "zk_tick_ms": args.zk_tick_ms,
                              "gc_wait_ms": args.gc_wait_ms,
                              "load_start": _load()}
    # ZooKeeper's tick as in production (2 s there; the test clusters' 200 ms caps a
    # session at 4 s, which a shell command reading 100,000 ledgers on a loaded 2-core
    # host outlived: "session expired" in the first 100,000-ledger run).
    from ledgerd.tools import processcluster
    from ledgerd.tools.zkserver import ZooKeeperServer

    processcluster.ZooKeeperServer = functools.partial(  # type: ignore[misc]
        ZooKeeperServer, tick_time_ms=args.zk_tick_ms)
    with tempfile.TemporaryDirectory(prefix="ledgerd-dr-bench-", dir=args.dir) as tmp:
        settings: dict[str, object] = {"journal_prealloc_mb": 4}
        if args.gc_wait_ms:
            settings["gc_wait_time_ms"] = args.gc_wait_ms
        async with process_cluster(Path(tmp), bookies=args.bookies,
                                   settings=settings) as cluster:
            zk = cluster.zk
            t0 = time.monotonic()
            share = -(-args.ledgers // args.fill_procs)

            async def fill_proc(first: int) -> None:
                count = min(share, args.ledgers - first)
                await trio.run_process(
                    [sys.executable, __file__, "--fill-worker", zk, str(first), str(count),
                     "--entries", str(args.entries), "--concurrency", str(args.concurrency)])

            async with trio.open_nursery() as nursery:
                for first in range(0, args.ledgers, share):
                    nursery.start_soon(fill_proc, first)
            out["fill_s"] = round(time.monotonic() - t0, 1)
            out["fill_load"] = _load()
            snap = Path(tmp) / "meta.snap"
            await _shell(out, "snapshot", zk, "snapshot", str(snap))
            out["snapshot_bytes"] = snap.stat().st_size
            async with metadata_store(zk, init=False) as store:
                await delete_root(store, "/ledgers")
            await _shell(out, "restore", zk, "restore", str(snap))
            if await _count(zk) != args.ledgers:
                raise SystemExit("the restore lost ledgers")
            async with metadata_store(zk, init=False) as store:
                await delete_root(store, "/ledgers")
            named = ",".join(b.address for b in cluster.bookies)
            await _shell(out, "rebuild_dry_run", zk, "rebuild", "--bookies", named)
            await _shell(out, "rebuild_apply", zk, "rebuild", "--bookies", named, "--apply",
                         "--json")
            out["holdings"] = {b.address: await _holdings_stream(b.address)
                               for b in cluster.bookies}
            out["rebuilt_ledgers"] = await _count(zk)
            if out["rebuilt_ledgers"] != args.ledgers:
                raise SystemExit(f"rebuilt {out['rebuilt_ledgers']} of {args.ledgers} "
                                 f"ledgers: {json.dumps(out)}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--entries", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64,
                        help="ledgers in flight per filling process")
    parser.add_argument("--fill-procs", type=int, default=3,
                        help="client processes filling the cluster")
    parser.add_argument("--dir", default=None, help="where the cluster's directory goes")
    parser.add_argument("--fill-worker", nargs=3, metavar=("ZK", "FIRST", "COUNT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--zk-tick-ms", type=int, default=2000,
                        help="ZooKeeper's tickTime (sessions may last 20 ticks)")
    parser.add_argument("--gc-wait-ms", type=int, default=0,
                        help="the bookies' gc_wait_time_ms (default: the bookie's own)")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="write each CLI step's cProfile output to DIR/<step>.prof")
    parser.add_argument("--json", action="store_true", help="(the output is JSON anyway)")
    parsed = parser.parse_args()
    PROFILE_DIR = parsed.profile
    if parsed.fill_worker:
        zk, first, count = parsed.fill_worker
        trio.run(_fill, zk, int(first), int(count), parsed.entries, parsed.concurrency)
    else:
        print(json.dumps(trio.run(main, parsed)))
