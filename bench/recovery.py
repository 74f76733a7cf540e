"""Recovery of an open ledger with a long tail: fence, read forward, rewrite, close.

    python bench/recovery.py [--rounds 3] [--tails 1000,10000] [--quorums 3,2,2]

One ZooKeeper and three bookie processes (E3/Qw2/Qa2 by default, 1 KiB entries). Per
case, a ledger's metadata is created OPEN and its entries are written straight to each
entry's write set with LAC -1 in every entry, as a writer that died before any LAC
reached the bookies leaves them: recovery must fence, read every entry forward and
rewrite them all. The time measured is ``open_ledger(recovery=True)`` from a fresh
client, which then checks that the ledger closed at the last entry.

Cases alternate in each round (the tail sizes, in turn), every round is printed, then
the medians, with the 1-minute load average at start and end.
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
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.bookie_client import open_bookie_client
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata, password_check
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.metadata.zookeeper import ZooKeeperStore
from ledgerd.tools.processcluster import process_cluster
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.messages import AddRequest
from ledgerd.wire.status import Status

ENTRY = 1024
PASSWORD = b"bench"


async def _write_tail(zk: str, ensemble: tuple[str, ...], quorums: tuple[int, int, int],
                      tail: int) -> int:
    """An OPEN ledger whose ``tail`` entries sit on their write sets with LAC -1."""
    e, qw, qa = quorums
    store = await ZooKeeperStore.connect(zk)
    try:
        key = master_key(PASSWORD)
        md = LedgerMetadata(ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                            ensembles=((0, ensemble[:e]),), digest_type=DigestType.CRC32C.value,
                            password_check=password_check(key),
                            ctime_ms=int(time.time() * 1000))
        lid, _version = await LedgerManager(store, "/ledgers").create(md)
    finally:
        await store.close()
    digester = Digester(DigestType.CRC32C, PASSWORD)
    payload = os.urandom(ENTRY - 64)
    per_bookie: dict[int, list[AddRequest]] = {i: [] for i in range(e)}
    length = 0
    for eid in range(tail):
        length += len(payload)
        entry = encode_entry(digester, lid, eid, -1, length, payload)
        for i in write_set(eid, e, qw):
            per_bookie[i].append(AddRequest(ledger_id=lid, first_entry_id=eid,
                                            master_key=key, entries=(entry,)))

    async def send(i: int) -> None:
        async with open_bookie_client(ensemble[i]) as bc:
            reqs = per_bookie[i]
            for start in range(0, len(reqs), 500):
                for status, _ in await bc.call_many(reqs[start:start + 500]):
                    if status != Status.OK:
                        raise RuntimeError(f"preload add to {ensemble[i]}: {Status(status).name}")

    async with trio.open_nursery() as nursery:
        for i in range(e):
            nursery.start_soon(send, i)
    return lid


async def _case(zk: str, ensemble: tuple[str, ...], quorums: tuple[int, int, int],
                tail: int) -> dict[str, Any]:
    lid = await _write_tail(zk, ensemble, quorums, tail)
    async with ledgerd.open_client(zk) as client:
        t0 = trio.current_time()
        rh = await client.open_ledger(lid, PASSWORD)
        elapsed = trio.current_time() - t0
        if rh.metadata.last_entry_id != tail - 1:
            raise RuntimeError(f"ledger {lid} closed at {rh.metadata.last_entry_id}, "
                               f"expected {tail - 1}")
    return {"tail": tail, "seconds": round(elapsed, 3),
            "ms_per_entry": round(elapsed * 1000 / tail, 3)}


async def _bench(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    quorums: tuple[int, int, int] = tuple(int(x) for x in args.quorums.split(","))  # type: ignore[assignment]
    tails = [int(t) for t in args.tails.split(",")]
    results: list[dict[str, Any]] = []
    async with process_cluster(base, bookies=quorums[0], graceful=False,
                               settings={"log_level": "WARNING"}) as cluster:
        zk = cluster.zk
        ensemble = tuple(b.address for b in cluster.bookies)
        for n in range(args.rounds):
            order = tails if n % 2 == 0 else list(reversed(tails))
            for tail in order:
                r = await _case(zk, ensemble, quorums, tail)
                r["round"] = n + 1
                results.append(r)
                print(f"round {n + 1}: {tail:,}-entry tail recovered in {r['seconds']:.3f} s "
                      f"({r['ms_per_entry']:.3f} ms/entry)", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tails", default="1000,10000", help="tail sizes, comma-separated")
    parser.add_argument("--quorums", default="3,2,2", help="E,Qw,Qa")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-recovery-bench-",
                                 dir=os.environ.get("BENCH_DIR")))
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
    print("| tail entries | median s | rounds (s) |")
    print("|---|---|---|")
    for tail in sorted({r["tail"] for r in results}):
        vals = [r["seconds"] for r in results if r["tail"] == tail]
        print(f"| {tail:,} | {statistics.median(vals):.3f} | "
              f"{', '.join(f'{v:.3f}' for v in vals)} |")


if __name__ == "__main__":
    main()
