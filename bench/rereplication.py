"""Re-replication speed after a bookie loss, and what it costs foreground writers.

    python bench/rereplication.py [--rounds 4] [--ledgers 8] [--entries 8000] [--seconds 6]

Each round starts a fresh cluster in its own ZooKeeper chroot: five bookie processes
(cluster secret set, autorecovery not in them) and one standalone ``ledgerd
autorecovery`` process (``--workers`` 4 ledgers at a time, ``--outstanding`` 16 batches
of ``--batch`` 256 entries in flight per ledger), autorecovery switched off. It preloads ``--ledgers``
closed ledgers of ``--entries`` 1 KiB entries (E3/Qw3/Qa2 by default), kills -9 the
bookie that holds the most of them and waits until it is deregistered. Then:

1. **baseline**: foreground writers (one client, E3/Qw2/Qa2 over the four survivors,
   1 KiB, 200 in flight) for ``--seconds``, nothing re-replicating;
2. **recovery**: autorecovery is switched on (delay 0) and the same writers run from
   that moment for ``--seconds``; re-replication runs until the queue is empty and no
   ledger lists the dead bookie.

Rounds alternate "recovery with writers" and "recovery alone" (no writers in step 2),
so the copy rate is measured both ways on the same data. The copy rate is the bytes the
autorecovery process reports copied (``ledgerd_autorecovery_bytes_copied_total``, entry
bytes as stored) over the time from switching it on to the last ledger done. Every
round is printed, then the medians, with the 1-minute load average at start and end.
The foreground's throughput and p99 while it runs are shown beside the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.base.credentials import generate_secret
from ledgerd.metadata.registry import BookieRegistry, BookieSet
from ledgerd.metadata.underreplication import UnderreplicationManager
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.benchcmd import run_writes
from ledgerd.tools.processcluster import ProcessCluster, process_cluster
from ledgerd.tools.zkserver import find_free_port

ENTRY = 1024


async def _preload(zk: str, ledgers: int, entries: int, quorums: tuple[int, int, int]
                   ) -> list[int]:
    payload = os.urandom(ENTRY)
    ids = []
    async with ledgerd.open_client(zk, throttle=0, max_inflight_per_bookie=4000) as client:
        handles = [await client.create_ledger(*quorums) for _ in range(ledgers)]
        for h in handles:
            window = []
            for _ in range(entries):
                window.append(await h.submit(payload))
                if len(window) >= 500:
                    await window.pop(0)
            for p in window:
                await p
            await h.close()
            ids.append(h.ledger_id)
    return ids


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


async def _round(args: argparse.Namespace, server: str, base: Path, n: int,
                 with_writers: bool) -> dict[str, Any]:
    secret = base / f"secret{n}"
    generate_secret(secret)
    settings = {"log_level": "WARNING", "zk_timeout_ms": 4000, "cluster_secret_file": str(secret),
                "rereplication_entry_batch_size": args.batch, "replication_workers": args.workers,
                "rereplication_outstanding_batches": args.outstanding,
                "rw_rereplicate_backoff_ms": 200}
    # Each round is a cluster of its own under a chroot of the one ZooKeeper.
    cluster = ProcessCluster(base, zk=server, chroot=f"/bench{n}", settings=settings)
    await cluster.init_metadata()
    zk = cluster.zk
    store = await ZooKeeperStore.connect(zk)
    urm = UnderreplicationManager(store, "/ledgers")
    await urm.set_enabled(False)
    await urm.set_lost_bookie_delay(0)
    ar: subprocess.Popen[bytes] | None = None
    try:
        bookies = [cluster.add_bookie(name=f"r{n}b{i}") for i in range(5)]
        await cluster.start_bookies()
        registry = BookieRegistry(store, "/ledgers")
        ar_port = find_free_port()
        conf = bookies[0].config_path.read_text().replace(
            f"admin_port = {bookies[0].admin_port}", f"admin_port = {ar_port}")
        (base / f"ar{n}.toml").write_text(conf)
        ar = subprocess.Popen([sys.executable, "-m", "ledgerd.tools.cli", "autorecovery", "--conf",
                               str(base / f"ar{n}.toml"), "--id", "bench"],
                              stdout=open(base / f"ar{n}.log", "wb"), stderr=subprocess.STDOUT)
        quorums = tuple(int(x) for x in args.quorums.split(","))
        ids = await _preload(zk, args.ledgers, args.entries, quorums)  # type: ignore[arg-type]
        async with ledgerd.open_client(zk) as client:
            count: dict[str, int] = {}
            for lid in ids:
                for b in (await client.ledger_metadata(lid)).ensembles[0][1]:
                    count[b] = count.get(b, 0) + 1
        victim = max(count, key=lambda b: count[b])
        dead = next(b for b in bookies if b.bookie_id == victim)
        dead.kill9()

        async def gone(s: BookieSet) -> bool:
            return victim not in s.writable and victim not in s.read_only
        with trio.fail_after(60):
            await registry.wait_for(gone)
        out: dict[str, Any] = {"round": n, "with_writers": with_writers,
                               "ledgers_on_victim": count[victim]}
        if with_writers:
            out["baseline"] = await run_writes(zk, 3, 2, 2, ENTRY, 4, 200, args.seconds)
        start = trio.current_time()
        await urm.set_enabled(True)
        done_at: list[float] = []

        async def wait_done() -> None:
            while True:
                await trio.sleep(0.1)
                if await urm.count() == 0 and _metric(
                        ar_port, "ledgerd_autorecovery_ledgers_rereplicated_total") >= count[victim]:
                    done_at.append(trio.current_time())
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_done)
            if with_writers:
                out["during"] = await run_writes(zk, 3, 2, 2, ENTRY, 4, 200, args.seconds)
        copied = _metric(ar_port, "ledgerd_autorecovery_bytes_copied_total")
        elapsed = done_at[0] - start
        out.update({"copy_s": round(elapsed, 2), "copied_mb": round(copied / 1e6, 1),
                    "mb_per_s": round(copied / 1e6 / elapsed, 1)})
        return out
    finally:
        if ar is not None:
            ar.terminate()
            ar.wait(30)
        cluster.stop(graceful=False)
        await store.close()


async def _bench(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    rounds = []
    async with process_cluster(base, bookies=0) as zookeeper:
        for n in range(args.rounds):
            r = await _round(args, zookeeper.zk, base, n, with_writers=n % 2 == 0)
            rounds.append(r)
            line = f"round {n + 1}: copy {r['mb_per_s']} MB/s ({r['copied_mb']} MB in " \
                   f"{r['copy_s']} s)"
            if r["with_writers"]:
                b, d = r["baseline"], r["during"]
                line += (f"; writers {b['appends_per_s']:,.0f}/s p99 {b['p99_ms']:.1f} ms "
                         f"-> {d['appends_per_s']:,.0f}/s p99 {d['p99_ms']:.1f} ms")
            else:
                line += "; no writers"
            print(line, flush=True)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ledgers", type=int, default=8)
    parser.add_argument("--entries", type=int, default=8000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--quorums", default="3,3,2", help="E,Qw,Qa of the preloaded ledgers")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--outstanding", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-rerepl-bench-",
                                 dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    try:
        rounds = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rounds": rounds, "load": [load_start, load_end]}))
        return
    alone = [r["mb_per_s"] for r in rounds if not r["with_writers"]]
    loaded = [r for r in rounds if r["with_writers"]]
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    print("| | median | rounds |")
    print("|---|---|---|")
    if alone:
        print(f"| copy MB/s, alone | {statistics.median(alone):.1f} | "
              f"{', '.join(str(a) for a in alone)} |")
    if loaded:
        print(f"| copy MB/s, with writers | {statistics.median(r['mb_per_s'] for r in loaded):.1f}"
              f" | {', '.join(str(r['mb_per_s']) for r in loaded)} |")
        for key, label in (("appends_per_s", "writer appends/s"), ("p99_ms", "writer p99 ms")):
            base_v = [r["baseline"][key] for r in loaded]
            dur_v = [r["during"][key] for r in loaded]
            print(f"| {label}, baseline | {statistics.median(base_v):,.1f} | "
                  f"{', '.join(f'{v:,.1f}' for v in base_v)} |")
            print(f"| {label}, during re-replication | {statistics.median(dur_v):,.1f} | "
                  f"{', '.join(f'{v:,.1f}' for v in dur_v)} |")


if __name__ == "__main__":
    main()
