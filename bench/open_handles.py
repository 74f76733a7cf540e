"""Thousands of open write handles in one client.

    python bench/open_handles.py [--ledgers 10000] [--step 1000] [--idle 5]

Starts a real ZooKeeper and three bookie processes, then one client creates
``--ledgers`` ledgers (E3/Qw2/Qa2), appends one 1 KiB entry to each and keeps every
handle open. Per ``--step`` ledgers: creations/s (create + one append), the client's
CPU seconds per ledger, its RSS. Then, with all handles open and idle, the client's CPU
use over ``--idle`` seconds (a handle with nothing to do must cost nothing: no task
wakes per handle) and an append to every handle (each handle still works).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.tools.processcluster import process_cluster

PAYLOAD = bytes(range(256)) * 4


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def _handles(zk: str, n: int, step: int, idle: float) -> dict[str, Any]:
    steps: list[dict[str, float]] = []
    async with ledgerd.open_client(zk) as client:
        handles = []
        concurrency = 16
        for lo in range(0, n, step):
            t0, c0 = time.perf_counter(), _cpu()
            made: list[Any] = []

            async def make(k: int, made: list[Any] = made) -> None:
                for _ in range(k):
                    lh = await client.create_ledger(3, 2, 2)
                    await lh.append(PAYLOAD)
                    made.append(lh)

            count = min(step, n - lo)
            async with trio.open_nursery() as nursery:
                for i in range(concurrency):
                    share = count // concurrency + (1 if i < count % concurrency else 0)
                    nursery.start_soon(make, share)
            handles += made
            seconds = time.perf_counter() - t0
            steps.append({"open": len(handles), "created_per_s": round(count / seconds),
                          "client_cpu_ms_per_ledger": round(1000 * (_cpu() - c0) / count, 2),
                          "rss_mb": _rss_mb()})
            print(json.dumps(steps[-1]), flush=True)
        c0, t0 = _cpu(), time.perf_counter()
        await trio.sleep(idle)
        idle_cpu = (_cpu() - c0) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(concurrency):
                async def append_all(part: list[Any]) -> None:
                    for lh in part:
                        await lh.append(PAYLOAD)
                nursery.start_soon(append_all, handles[i::concurrency])
        again = len(handles) / (time.perf_counter() - t0)
        for lh in handles:
            await lh.close()
    return {"steps": steps, "idle_cpu_fraction": round(idle_cpu, 4),
            "append_to_every_handle_per_s": round(again)}


async def _bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    async with process_cluster(base, bookies=3, chroot="/bench", settings={
            "log_level": "WARNING", "zk_timeout_ms": 8000,
            "ledger_storage_class": args.storage}) as cluster:
        return await _handles(cluster.zk, args.ledgers, args.step, args.idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=10000)
    parser.add_argument("--step", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument("--storage", default="db", choices=("db", "interleaved"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-handles-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    try:
        result = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result["load"] = [load_start, os.getloadavg()[0]]
    if args.json:
        print(json.dumps(result))
        return
    rates = [s["created_per_s"] for s in result["steps"]]
    print(f"\ncreated/s per step: {rates} (first {rates[0]}, last {rates[-1]}, "
          f"median {statistics.median(rates)})")
    print(f"idle CPU with {result['steps'][-1]['open']} handles open: "
          f"{100 * result['idle_cpu_fraction']:.2f}% of a core; one more append to every "
          f"handle: {result['append_to_every_handle_per_s']}/s")
    print(f"load average (1 min): {result['load'][0]:.2f} at start, "
          f"{result['load'][1]:.2f} at end")


if __name__ == "__main__":
    main()
