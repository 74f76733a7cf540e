"""Many ledgers per bookie: the interleaved storage (an index file per ledger) beside the
db storage (one LMDB index), in one run.

    python bench/ledgers_scale.py [--counts 1,1000,10000,100000] [--seconds 5]
                                  [--restart-ledgers 100000] [--json]

Two parts, each storage in turn (the order alternates per size):

- **adds** (wire): one bookie process per case, E1 single-entry 1 KiB adds, 2
  connections x 400 in flight (800), written round-robin over N ledgers
  (``bench/drivers.closed_loop``; the measured seconds start after a first round has
  created every ledger, and checkpoints run every ``--flush-ms`` inside them): adds/s,
  p99 latency, checkpoints and their mean time, the bookie's RSS after the run. Then
  random single-entry reads of what was written (2 x 64 in flight,
  ``bench/drivers.read_loop``), warm, and cold: the bookie restarted with its files
  evicted from the page cache (``posix_fadvise``, only its own files).
- **restart and GC** (storage API, in process): ``--restart-ledgers`` ledgers of one
  entry each are written through ``LedgerStorage.add_entries`` (batched, concurrent),
  then the storage is closed and opened again (time to ready), a checkpoint after
  touching every ledger once more is timed, and half of the ledgers are deleted
  (``delete_ledger`` + the checkpoint that makes it durable): ledgers/s.

Every case is printed as it finishes, then a table; the 1-minute load at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from bench.drivers import closed_loop, read_loop
from ledgerd.disk.storage import LedgerStorage, StorageOptions
from ledgerd.tools.bookieprocess import BookieProcess
from ledgerd.wire.entry import Digester, DigestType, encode_entry

KEY = b"k" * 20
KINDS = ("interleaved", "db")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _metrics(b: BookieProcess) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{b.admin_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("ledgerd_") and " " in line and "{" not in line}


def _drop_page_cache(root: Path) -> None:
    """Evict the bookie's own files from the OS page cache (posix_fadvise DONTNEED on
    each; nothing else on the host is touched), so reads after it come from the disk."""
    for p in root.rglob("*"):
        if p.is_file():
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _adds(base: Path, kind: str, ledgers: int, seconds: float,
          flush_ms: int) -> dict[str, Any]:
    """Adds round-robin over ``ledgers`` (after a first round that creates them), with
    checkpoints every ``flush_ms`` inside the measured seconds; then random single-entry
    reads of what was written, warm (right after) and cold (bookie restarted and its
    files evicted from the page cache)."""
    root = base / f"{kind}-{ledgers}"
    b = BookieProcess(root, "", settings={
        "ledger_storage_class": kind, "log_level": "INFO", "journal_prealloc_mb": 64,
        "flush_interval_ms": flush_ms})
    try:
        b.start_ready()
        before = _metrics(b)
        r = closed_loop(b.port, 2, 400, seconds, ledgers=ledgers, warmup=1.0)
        rss = _rss_mb(b.pid or 0)
        after = _metrics(b)
        n_cp = after["ledgerd_storage_checkpoint_seconds_count"] - \
            before["ledgerd_storage_checkpoint_seconds_count"]
        cp_s = after["ledgerd_storage_checkpoint_seconds_sum"] - \
            before["ledgerd_storage_checkpoint_seconds_sum"]
        written = r["entries_written"]
        rng = random.Random(ledgers)

        def pick() -> tuple[int, int]:
            return 1000 + rng.randrange(ledgers), rng.randrange(written)

        warm = read_loop(b.port, 2, 64, min(seconds, 3.0), pick)
        b.terminate(timeout=300)
        _drop_page_cache(root)
        b.start_ready()
        t = time.monotonic()
        # The port opens before the storage is ready (the interleaved storage reads
        # every index file): wait for one read to be answered (a few entries warm).
        while read_loop(b.port, 1, 1, 0.2, pick, warmup=0.0)["reads_per_s"] == 0:
            if time.monotonic() - t > 300:
                raise RuntimeError("the restarted bookie answered no read in 300 s")
        ready_s = time.monotonic() - t
        cold = read_loop(b.port, 2, 64, min(seconds, 3.0), pick, warmup=0.0)
        rss_after_reads = _rss_mb(b.pid or 0)
    finally:
        b.terminate(timeout=300)
    shutil.rmtree(root, ignore_errors=True)
    return {"case": "adds", "storage": kind, "ledgers": ledgers,
            "adds_s": round(r["entries_per_s"]), "p99_ms": round(r["p99_ms"], 1),
            "errors": r["errors"] + warm["errors"] + cold["errors"],
            "checkpoints": int(n_cp), "checkpoint_mean_s": round(cp_s / n_cp, 3) if n_cp else None,
            "rss_mb": rss, "reads_warm_s": round(warm["reads_per_s"]),
            "reads_warm_p99_ms": round(warm["p99_ms"], 1),
            "reads_cold_s": round(cold["reads_per_s"]),
            "reads_cold_p99_ms": round(cold["p99_ms"], 1), "rss_after_reads_mb": rss_after_reads,
            "restart_to_first_read_s": round(ready_s, 2)}


async def _restart_and_gc(base: Path, kind: str, n: int) -> dict[str, Any]:
    d = Digester(DigestType.CRC32C)
    opts = StorageOptions(journal_dir=base / "journal", ledger_dirs=(base / "ledgers",),
                          ledger_storage_class=kind, flush_interval_ms=3_600_000)
    s = LedgerStorage(opts)
    await s.open()
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        batch = 2000

        async def write(lo: int, hi: int, entry_id: int) -> None:
            for lid in range(lo, hi):
                await s.add_entries(lid, entry_id, [encode_entry(d, lid, entry_id, -1, 8,
                                                                 b"x" * 8)], bind_key=KEY)

        for lo in range(1, n + 1, batch):
            async with trio.open_nursery() as group:
                for k in range(lo, min(lo + batch, n + 1), batch // 16):
                    group.start_soon(write, k, min(k + batch // 16, lo + batch, n + 1), 0)
        write_s = time.perf_counter() - t0
        t = time.perf_counter()
        await s.checkpoint()
        first_checkpoint_s = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    await s.close()
    t = time.perf_counter()
    s = LedgerStorage(opts)
    await s.open()
    restart_s = time.perf_counter() - t
    assert len(s.list_ledgers()) == n
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for lo in range(1, n + 1, batch):  # one more entry in every ledger
            async with trio.open_nursery() as group:
                for k in range(lo, min(lo + batch, n + 1), batch // 16):
                    group.start_soon(write, k, min(k + batch // 16, lo + batch, n + 1), 1)
        t = time.perf_counter()
        await s.checkpoint()
        touched_checkpoint_s = time.perf_counter() - t
        t = time.perf_counter()
        for lid in range(1, n + 1, 2):
            await s.delete_ledger(lid)
        await s.checkpoint(sync_index_dirs=True)
        gc_s = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    await s.close()
    return {"case": "restart", "storage": kind, "ledgers": n,
            "write_s": round(write_s, 1), "first_checkpoint_s": round(first_checkpoint_s, 2),
            "restart_s": round(restart_s, 2),
            "checkpoint_all_touched_s": round(touched_checkpoint_s, 2),
            "gc_ledgers_s": round((n // 2) / gc_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,1000,10000,100000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flush-ms", type=int, default=2000,
                        help="checkpoint interval of the adds part (several inside the "
                             "measured seconds)")
    parser.add_argument("--kinds", default="interleaved,db",
                        help="storages for the adds part")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the adds part (cases alternate within a round)")
    parser.add_argument("--restart-ledgers", type=int, default=100000)
    parser.add_argument("--restart-kinds", default="interleaved,db",
                        help="storages for the restart part (1M ledgers: db alone; the "
                             "interleaved one needs a file per ledger)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-scale-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    try:
        kinds = tuple(k for k in args.kinds.split(",") if k)
        for rnd in range(args.rounds):
            for i, n in enumerate(int(c) for c in args.counts.split(",") if c):
                for kind in kinds if (i + rnd) % 2 == 0 else tuple(reversed(kinds)):
                    r = {"round": rnd + 1, **_adds(base, kind, n, args.seconds, args.flush_ms)}
                    results.append(r)
                    print(json.dumps(r), flush=True)
        if args.restart_ledgers:
            for kind in args.restart_kinds.split(","):
                r = trio.run(_restart_and_gc, base / f"restart-{kind}", kind,
                             args.restart_ledgers)
                results.append(r)
                print(json.dumps(r), flush=True)
                shutil.rmtree(base / f"restart-{kind}", ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"results": results, "load": [load_start, load_end]}))
        return
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    for r in results:
        print("  ".join(f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
