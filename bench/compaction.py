"""Compaction: how fast it copies live data, and what it costs the foreground.

    python bench/compaction.py [--rounds 4] [--seconds 5] [--fill-mb 24]

One ZooKeeper and two bookie processes (journal and entry logs under a temp directory):
``paced`` runs compaction at the default ``compaction_rate`` (1,000 entries/s), as an
operator's cluster would; ``free`` at 1,000,000 entries/s, to measure the engine.

Each round first gives both bookies sparse entry logs: ``--fill-mb`` of 1 KiB entries
alternating between two ledgers, then one ledger's metadata is deleted (so every log is
half live) and a checkpoint makes the logs durable. Then, in an order that alternates
between rounds, on ``paced``:

- **quiet**: the foreground load (4 connections x 200 pipelined 1-entry adds, 1 KiB,
  the `bench/bookie.py` driver in its own process) for ``--seconds``;
- **compacting**: a major GC pass is started, then the same load for the same time
  while it copies; the pass is then waited out so the next case is quiet again.

and on ``free``, a major pass alone: live MB copied per second of the pass.

Every round is printed, then the medians, with the load.
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
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from ledgerd.bookie_client import open_bookie_client
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.ledgers import LedgerManager
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.tools.processcluster import process_cluster
from ledgerd.wire.entry import Digester, DigestType, encode_entry, master_key
from ledgerd.wire.messages import AddRequest, AdminKind, AdminStatusRequest, AdminTriggerRequest
from ledgerd.wire.status import Status

KEY = master_key(b"bench")
D = Digester(DigestType.CRC32C)
PAYLOAD = os.urandom(1000)
FOREGROUND = range(1000, 1004)  # the bench/bookie.py driver's ledgers (4 connections)
SETTINGS = {"log_level": "WARNING", "log_size_limit": 4 << 20, "flush_interval_ms": 1000,
            "gc_wait_time_ms": 86_400_000, "minor_compaction_interval_s": 0,
            "major_compaction_interval_s": 0, "major_compaction_threshold": 0.9}


async def _fill(bookie: BookieProcess, ledgers: LedgerManager, mb: int) -> None:
    """``mb`` MiB of 1 KiB entries alternating between two new ledgers; then one is
    deleted in metadata, so every log written holds half live data."""
    md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                        ensembles=((0, (bookie.bookie_id,)),))
    keep, drop = (await ledgers.create(md))[0], (await ledgers.create(md))[0]
    n = mb * 1024 // 2
    async with open_bookie_client(bookie.address) as c:
        async def one(lid: int, first: int) -> None:
            entries = tuple(encode_entry(D, lid, first + i, first + i - 1, 0, PAYLOAD)
                            for i in range(64))
            st, _ = await c.call(AddRequest(ledger_id=lid, first_entry_id=first,
                                            master_key=KEY, entries=entries))
            assert st == Status.OK, Status(st).name

        for first in range(0, n, 64 * 8):
            async with trio.open_nursery() as nursery:
                for f in range(first, min(n, first + 64 * 8), 64):
                    nursery.start_soon(one, keep, f)
                    nursery.start_soon(one, drop, f)
    await ledgers.delete(drop)


async def _status(bookie: BookieProcess) -> dict[str, Any]:
    async with open_bookie_client(bookie.address) as c:
        st, resp = await c.call(AdminStatusRequest())
        assert st == Status.OK
        return dict(json.loads(resp.status_json)["gc"])  # type: ignore[union-attr]


async def _major(bookie: BookieProcess) -> int:
    """Start a major pass; returns the pass count it will reach when done."""
    before = (await _status(bookie))["passes"]
    async with open_bookie_client(bookie.address) as c:
        st, resp = await c.call(AdminTriggerRequest(kind=int(AdminKind.MAJOR_COMPACTION)))
        assert st == Status.OK
    return int(before) + (1 if resp.started else 2)  # type: ignore[union-attr]


async def _wait_pass(bookie: BookieProcess, target: int) -> dict[str, Any]:
    while True:
        s = await _status(bookie)
        if s["passes"] >= target:
            return dict(s["last"])
        await trio.sleep(0.2)


def _drive(port: int, seconds: float) -> dict[str, float]:
    cmd = [sys.executable, str(Path(__file__).parent / "bookie.py"), "drive", "--port",
           str(port), "--batch", "1", "--conns", "4", "--window", "200", "--seconds",
           str(seconds)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def _round(n: int, args: argparse.Namespace, paced: BookieProcess, free: BookieProcess,
                 ledgers: LedgerManager) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    for b in (paced, free):
        await _fill(b, ledgers, args.fill_mb)
    await trio.sleep(2.5)  # two checkpoints: the filled logs are durable GC candidates
    out: dict[str, Any] = {"round": n + 1, "load_start": load0}
    for case in (("quiet", "compacting") if n % 2 == 0 else ("compacting", "quiet")):
        os.sync()
        if case == "quiet":
            out["quiet"] = await trio.to_thread.run_sync(_drive, paced.port, args.seconds)
            continue
        target = await _major(paced)
        out["compacting"] = await trio.to_thread.run_sync(_drive, paced.port, args.seconds)
        p = await _wait_pass(paced, target)
        out["paced_pass"] = {k: p[k] for k in ("seconds", "bytes_moved", "entries_moved",
                                                "logs_compacted", "bytes_reclaimed")}
    os.sync()
    target = await _major(free)
    p = await _wait_pass(free, target)
    out["free_pass"] = {k: p[k] for k in ("seconds", "bytes_moved", "entries_moved",
                                          "logs_compacted", "bytes_reclaimed")}
    out["free_mb_s"] = p["bytes_moved"] / 1e6 / p["seconds"] if p["seconds"] else 0.0
    out["load_end"] = os.getloadavg()[0]
    q, c = out["quiet"], out["compacting"]
    out["throughput_ratio"] = c["entries_per_s"] / q["entries_per_s"]
    out["p99_ratio"] = c["p99_ms"] / q["p99_ms"] if q["p99_ms"] else 0.0
    pp = out["paced_pass"]
    out["paced_mb_s"] = pp["bytes_moved"] / 1e6 / pp["seconds"] if pp["seconds"] else 0.0
    print(f"round {n + 1} (load {load0:.2f} -> {out['load_end']:.2f}): quiet "
          f"{q['entries_per_s']:,.0f}/s p99 {q['p99_ms']:.1f} ms | compacting "
          f"{c['entries_per_s']:,.0f}/s p99 {c['p99_ms']:.1f} ms | ratios "
          f"{out['throughput_ratio']:.2f}x, p99 {out['p99_ratio']:.2f}x | paced pass "
          f"{pp['entries_moved']} entries in {pp['seconds']:.1f} s ({out['paced_mb_s']:.2f} "
          f"MB/s) | free pass {out['free_mb_s']:.1f} MB/s", flush=True)
    return out


async def _bench(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    async with process_cluster(base, bookies=0, settings=SETTINGS) as cluster:
        paced = cluster.add_bookie(name="paced")
        free = cluster.add_bookie(name="free", settings={"compaction_rate": 1_000_000})
        async with cluster.store() as store:
            ledgers = LedgerManager(store, "/ledgers")
            md = LedgerMetadata(ensemble_size=1, write_quorum=1, ack_quorum=1,
                                ensembles=((0, (paced.bookie_id,)),))
            for lid in FOREGROUND:  # so GC keeps the foreground's ledgers
                await ledgers.create(md, ledger_id=lid)
            await cluster.start_bookies()
            return [await _round(n, args, paced, free, ledgers) for n in range(args.rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--fill-mb", type=int, default=24)
    parser.add_argument("--json", action="store_true", help="Print the rounds as JSON too.")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-compaction-", dir=os.environ.get("BENCH_DIR")))
    try:
        rounds = trio.run(_bench, args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(f: Any) -> float:
        return statistics.median(f(r) for r in rounds)
    print()
    print("| median of rounds | quiet | while compacting | ratio | goal |")
    print("|---|---|---|---|---|")
    print(f"| foreground adds/s | {med(lambda r: r['quiet']['entries_per_s']):,.0f} | "
          f"{med(lambda r: r['compacting']['entries_per_s']):,.0f} | "
          f"{med(lambda r: r['throughput_ratio']):.2f}x | >= 0.8x |")
    print(f"| foreground p99 ms | {med(lambda r: r['quiet']['p99_ms']):.1f} | "
          f"{med(lambda r: r['compacting']['p99_ms']):.1f} | "
          f"{med(lambda r: r['p99_ratio']):.2f}x | <= 2x |")
    held = sum(1 for r in rounds if r["throughput_ratio"] >= 0.8 and r["p99_ratio"] <= 2)
    print(f"\ngoal held in {held} of {len(rounds)} rounds")
    print(f"compaction at the default rate: {med(lambda r: r['paced_mb_s']):.2f} MB/s of live "
          f"data; unthrottled: {med(lambda r: r['free_mb_s']):.1f} MB/s")
    if args.json:
        print(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
