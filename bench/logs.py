"""Logs that applications consume: follow-reader latency, and a 10,000-fragment ledger.

    python bench/logs.py [--rounds 3] [--rate 1000] [--seconds 5] [--fragments 10000]

One ZooKeeper and three bookie processes, E3/Qw2/Qa2 (the unbounded case E3/Qw3/Qa2),
1 KiB entries. Two cases alternate in each round:

- **follow**: a writer appends on a fixed schedule (``--rate`` entries/s, open loop) to
  a log; a ``client.logs.follow`` reader in another client notes when each entry reaches it.
  The latency is reader-sees minus writer-acknowledged (both on this host's monotonic
  clock), p50/p99/max over the run; ``--kinds`` picks ledger-backed and/or unbounded.
- **fragments**: an unbounded log of ``--fragments`` entries, E3/Qw3/Qa2, whose ledger
  then gets one fragment per entry (a metadata CAS: with Qw = E every bookie holds every
  entry, so each fragment's rotated ensemble is true; writing that many fragments one
  ensemble change at a time takes minutes and measures ZooKeeper); then from a fresh
  client: open the log, seek to the middle offset and read 100 entries. Reported:
  metadata bytes, open+seek+read seconds.

Every round is printed, then the medians, with the 1-minute load at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.tools.processcluster import process_cluster

PAYLOAD = os.urandom(1024)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def _follow(zk: str, name: str, rate: int, seconds: float, unbounded: bool,
                  ) -> dict[str, Any]:
    acked: dict[int, float] = {}
    seen: dict[int, float] = {}
    total = int(rate * seconds)
    async with ledgerd.open_client(zk, throttle=0) as wc, ledgerd.open_client(zk) as rc:
        quorums = (3, 3, 2) if unbounded else (3, 2, 2)
        writer = await wc.logs.open_writer(name, *quorums, unbounded=unbounded,
                                           roll_entries=0 if unbounded else 2000)
        done = trio.Event()

        async def read() -> None:
            async for e in rc.logs.follow(name, poll_s=1.0):
                seen[e.offset] = time.monotonic()
                if len(seen) == total:
                    done.set()
                    return

        async def write_one(i: int, at: float) -> None:
            await writer.append(PAYLOAD)
            acked[i] = time.monotonic()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            start = trio.current_time()
            for i in range(total):
                await trio.sleep_until(start + i / rate)  # open loop: a fixed schedule
                # A log writer takes one append at a time; appends go out in order.
                await write_one(i, start + i / rate)
            with trio.move_on_after(30):
                await done.wait()
            nursery.cancel_scope.cancel()
        await writer.close()
    lat = [(seen[i] - acked[i]) * 1000 for i in range(total) if i in seen and i in acked]
    return {"case": "follow-unbounded" if unbounded else "follow-ledgers",
            "entries": total, "seen": len(lat), "p50_ms": round(_pct(lat, 0.5), 2),
            "p99_ms": round(_pct(lat, 0.99), 2), "max_ms": round(max(lat), 2)}


async def _fragments(zk: str, name: str, fragments: int) -> dict[str, Any]:
    async with ledgerd.open_client(zk, throttle=0) as wc:
        writer = await wc.logs.open_writer(name, 3, 3, 2, unbounded=True)
        t0 = time.monotonic()
        await writer.append_many(PAYLOAD for _ in range(fragments))
        write_s = time.monotonic() - t0
        await writer.close()

        def split(md: LedgerMetadata) -> LedgerMetadata:
            ens = md.ensembles[0][1]
            return replace(md, ensembles=tuple(
                (i, ens[i % 3:] + ens[:i % 3]) for i in range(fragments)))
        await wc.ledgers.update(writer.ledger_id, split)
        md = await wc.ledger_metadata(writer.ledger_id)
        md_bytes = len(md.to_json())
        n_fragments = len(md.ensembles)
    async with ledgerd.open_client(zk) as rc:
        t0 = time.monotonic()
        got = 0
        async for e in rc.logs.follow(name, start=fragments // 2):
            got += 1
            if got == 100:
                assert e.offset == fragments // 2 + 99
                break
        seek_s = time.monotonic() - t0
    return {"case": "fragments", "fragments": n_fragments, "metadata_bytes": md_bytes,
            "write_s": round(write_s, 2), "open_seek_read100_s": round(seek_s, 3)}


async def _bench(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with process_cluster(base, bookies=3, graceful=False,
                               settings={"log_level": "WARNING"}) as cluster:
        zk = cluster.zk
        kinds = [k == "unbounded" for k in args.kinds.split(",")]
        for n in range(args.rounds):
            for unbounded in (kinds if n % 2 == 0 else list(reversed(kinds))):
                r = await _follow(zk, f"f{n}{int(unbounded)}", args.rate, args.seconds,
                                  unbounded)
                r["round"] = n + 1
                results.append(r)
                print(f"round {n + 1}: {r['case']}: {r['seen']}/{r['entries']} seen, "
                      f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms",
                      flush=True)
            if args.fragments:
                r = await _fragments(zk, f"frag{n}", args.fragments)
                r["round"] = n + 1
                results.append(r)
                print(f"round {n + 1}: {r['fragments']} fragments, metadata "
                      f"{r['metadata_bytes']:,} B, written in {r['write_s']} s, open + seek + "
                      f"read 100 in {r['open_seek_read100_s']} s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000, help="entries/s the writer sends")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--kinds", default="ledgers,unbounded")
    parser.add_argument("--fragments", type=int, default=10000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-logs-bench-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    try:
        results = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"rounds": results, "load": [load_start, load_end]}))
        return
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    for case in sorted({r["case"] for r in results}):
        rows = [r for r in results if r["case"] == case]
        keys = [k for k in rows[0] if k.endswith(("_ms", "_s", "_bytes"))]
        print(f"{case}: " + ", ".join(
            f"{k} median {statistics.median(r[k] for r in rows)} "
            f"({', '.join(str(r[k]) for r in rows)})" for k in keys))


if __name__ == "__main__":
    main()
