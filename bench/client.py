"""Client throughput and latency: E=Qw=Qa=1 on one bookie vs E=3 Qw=2 Qa=2 on three.

    python bench/client.py [--seconds 8] [--rounds 3] [--window 800]

Starts a real ZooKeeper and three bookie processes (temp directories on the work disk),
then, in this process, one client task appends 1 KiB entries through
``WriteHandle.submit`` with ``--window`` appends in flight (pipelined from one task, no
task per entry; 800 by default, the raw bookie's 4 connections x 200, so the two sides
of the E3 / raw comparison have the same concurrency) for ``--seconds`` after a 1 s
warm-up; and again through
``submit_many`` in batches of ``--batch`` with ``--batch-window`` in flight. An append
counts when it is
durable on its ack quorum (each bookie acknowledges after its journal fdatasync);
latency is from ``submit`` to completion. Rounds alternate the two layouts; medians are
reported.

Reads: a closed ledger of ``--read-entries`` 1 KiB entries per layout (E1, and E3/Qw2
striped over three bookies), read whole through ``ReadHandle.read`` from a fresh client
in every round, the two layouts alternating.

Then the tail-read latency: a writer appends one entry every 20 ms (explicit LAC after
10 ms idle) while a reader in another client follows with ``wait_lac_beyond``; the
latency is from the writer's completion to the reader's long poll returning with a LAC
at or past the entry.

On a 2-core machine the client and the three bookies share the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from bench.bookie import _run_ledgerd
from ledgerd.tools.benchcmd import percentile, run_writes
from ledgerd.tools.processcluster import process_cluster

ENTRY = 1024


async def _appends(zk: str, e: int, qw: int, qa: int, seconds: float,
                   window: int, batch: int = 1) -> dict[str, float]:
    r = await run_writes(zk, e, qw, qa, ENTRY, 1, window, seconds, warmup=1.0, batch=batch)
    return {k: r[k] for k in ("appends_per_s", "p50_ms", "p99_ms", "ensemble_changes")}


async def _tail(zk: str, entries: int) -> dict[str, float]:
    async with ledgerd.open_client(zk, explicit_lac_interval_ms=10) as wc, \
            ledgerd.open_client(zk) as rc:
        lh = await wc.create_ledger(3, 2, 2)
        rh = await rc.open_ledger(lh.ledger_id, recovery=False)
        completed: dict[int, float] = {}
        seen: dict[int, float] = {}

        async def follow() -> None:
            lac = -1
            while lac < entries - 1:
                lac = await rh.wait_lac_beyond(lac, timeout=5)
                now = trio.current_time()
                for eid in range(len(seen), lac + 1):
                    seen[eid] = now

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            for _ in range(entries):
                eid = await lh.append(b"x" * ENTRY)
                completed[eid] = trio.current_time()
                await trio.sleep(0.02)
        await lh.close()
        lat = [seen[e] - completed[e] for e in range(entries)]
        return {"p50_ms": 1000 * percentile(lat, 0.5), "p99_ms": 1000 * percentile(lat, 0.99)}


async def _write_ledger(zk: str, e: int, qw: int, qa: int, entries: int) -> int:
    """A closed ledger of ``entries`` 1 KiB entries, for the read rounds."""
    payload = bytes(range(256)) * (ENTRY // 256)
    async with ledgerd.open_client(zk) as client:
        lh = await client.create_ledger(e, qw, qa)
        for start in range(0, entries, 1000):
            await lh.append_many([payload] * min(1000, entries - start))
        await lh.close()
        return lh.ledger_id


async def _reads(zk: str, ledger_id: int) -> dict[str, float]:
    """Entries/s reading the whole ledger from a fresh client, verified."""
    async with ledgerd.open_client(zk) as client:
        rh = await client.open_ledger(ledger_id, recovery=False)
        t0 = trio.current_time()
        n = nbytes = 0
        async for entry in rh.read():
            n += 1
            nbytes += len(entry.payload)
        seconds = trio.current_time() - t0
    return {"entries_per_s": n / seconds, "mb_per_s": nbytes / seconds / 1e6, "entries": n}


async def _bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    async with process_cluster(base, bookies=3, chroot="/bench", settings={
            "log_level": "WARNING", "zk_timeout_ms": 4000}) as cluster:
        zk, bookies = cluster.zk, cluster.bookies
        runs: dict[str, list[dict[str, float]]] = {"e1": [], "e3": [], "raw": [],
                                                   "e1_batch": [], "e3_batch": [],
                                                   "read_e1": [], "read_e3": []}
        read_ledgers = {"read_e1": await _write_ledger(zk, 1, 1, 1, args.read_entries),
                        "read_e3": await _write_ledger(zk, 3, 2, 2, args.read_entries)}
        for rnd in range(args.rounds):
            for key, quorums in (("e1", (1, 1, 1)), ("e3", (3, 2, 2))):
                os.sync()
                runs[key].append(await _appends(zk, *quorums, args.seconds, args.window))
                # submit_many in batches of --batch, --batch-window appends in flight.
                os.sync()
                runs[key + "_batch"].append(await _appends(
                    zk, *quorums, args.seconds, args.batch_window, args.batch))
            os.sync()
            # The raw bookie beside them: one of the same bookies, 1 KiB one-entry frames
            # from a separate driver process, 4 connections x 200 in flight.
            raw = await trio.to_thread.run_sync(_run_ledgerd, bookies[0].port, 1, 200,
                                                args.seconds)
            runs["raw"].append({k: raw[k] for k in ("entries_per_s", "p50_ms", "p99_ms")})
            order = list(read_ledgers) if rnd % 2 == 0 else list(reversed(read_ledgers))
            for key in order:
                runs[key].append(await _reads(zk, read_ledgers[key]))
            print(f"round {rnd + 1}: reads E1 {runs['read_e1'][-1]['entries_per_s']:,.0f}/s, "
                  f"E3/Qw2 {runs['read_e3'][-1]['entries_per_s']:,.0f}/s (E3 / E1 "
                  f"{runs['read_e3'][-1]['entries_per_s'] / runs['read_e1'][-1]['entries_per_s']:.2f})",
                  flush=True)
            print(f"round {rnd + 1}: submit_many x {args.batch}: E1 "
                  f"{runs['e1_batch'][-1]['appends_per_s']:,.0f}/s, E3/Qw2/Qa2 "
                  f"{runs['e3_batch'][-1]['appends_per_s']:,.0f}/s", flush=True)
            print(f"round {rnd + 1}: E1 {runs['e1'][-1]['appends_per_s']:,.0f}/s, "
                  f"E3/Qw2/Qa2 {runs['e3'][-1]['appends_per_s']:,.0f}/s, raw bookie "
                  f"{raw['entries_per_s']:,.0f}/s (E3 / raw "
                  f"{runs['e3'][-1]['appends_per_s'] / raw['entries_per_s']:.2f})", flush=True)
        tail = await _tail(zk, args.tail_entries)
        med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
        ratios = [e3["appends_per_s"] / raw["entries_per_s"]
                  for e3, raw in zip(runs["e3"], runs["raw"], strict=True)]
        read_ratios = [e3["entries_per_s"] / e1["entries_per_s"]
                       for e3, e1 in zip(runs["read_e3"], runs["read_e1"], strict=True)]
        return {"appends": med, "tail": tail, "e3_over_raw": ratios, "rounds": runs,
                "read_e3_over_e1": read_ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=800)
    parser.add_argument("--batch", type=int, default=100,
                        help="appends per submit_many call in the batched runs")
    parser.add_argument("--batch-window", type=int, default=4000,
                        help="appends in flight in the batched runs")
    parser.add_argument("--tail-entries", type=int, default=300)
    parser.add_argument("--read-entries", type=int, default=50_000,
                        help="entries of the ledgers read in each round (1 KiB each)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-client-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        result = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    a, t = result["appends"], result["tail"]
    ratio = a["e3"]["appends_per_s"] / a["e1"]["appends_per_s"]
    print()
    print("| run | durable appends/s | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    print(f"| E=Qw=Qa=1, one bookie | {a['e1']['appends_per_s']:,.0f} | "
          f"{a['e1']['p50_ms']:.2f} | {a['e1']['p99_ms']:.2f} |")
    print(f"| E=3 Qw=2 Qa=2, three bookies | {a['e3']['appends_per_s']:,.0f} | "
          f"{a['e3']['p50_ms']:.2f} | {a['e3']['p99_ms']:.2f} |")
    for key, name in (("e1_batch", "E=Qw=Qa=1"), ("e3_batch", "E=3 Qw=2 Qa=2")):
        print(f"| {name}, submit_many x {args.batch}, {args.batch_window} in flight | "
              f"{a[key]['appends_per_s']:,.0f} | {a[key]['p50_ms']:.2f} | "
              f"{a[key]['p99_ms']:.2f} |")
    print(f"| tail read (writer ack -> reader's long poll) | | {t['p50_ms']:.2f} | "
          f"{t['p99_ms']:.2f} |")
    print(f"| raw bookie, 1 entry/frame, 4 conns x 200 (driver process) | "
          f"{a['raw']['entries_per_s']:,.0f} | {a['raw']['p50_ms']:.2f} | "
          f"{a['raw']['p99_ms']:.2f} |")
    print(f"\n3-bookie / 1-bookie: {ratio:.2f} (goal >= 0.5)")
    r = result["e3_over_raw"]
    print(f"E3/Qw2/Qa2 / raw bookie per round: {', '.join(f'{x:.2f}' for x in r)}; median "
          f"{statistics.median(r):.2f} (goal >= 0.6)")
    print("\n| reads, whole ledger, fresh client | entries/s (median) | MB/s |")
    print("|---|---|---|")
    for key, name in (("read_e1", "E=Qw=1, one bookie"), ("read_e3", "E=3 Qw=2, three bookies")):
        print(f"| {name} | {a[key]['entries_per_s']:,.0f} | {a[key]['mb_per_s']:.1f} |")
    rr = result["read_e3_over_e1"]
    print(f"read E3 / E1 per round: {', '.join(f'{x:.2f}' for x in rr)}; median "
          f"{statistics.median(rr):.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
