"""Durable journal adds vs the raw disk limit, measured side by side in one run.

The raw loop: aligned O_DIRECT pwrite of one entry's bytes (rounded up to 4 KiB) into a
pre-zeroed file + fdatasync, one thread, i.e. one sync per entry. Then ``disk.journal``
with 1 KiB entries from 1, 16 and 256 concurrent writers and 64 KiB entries from 16
writers, in both group-commit modes: BookKeeper's default (flush after a 2 ms group wait)
and ``journal_flush_when_queue_empty``. Each prints entries/s, MB/s, p50/p99 latency and
the ratio to the raw loop for the same entry size.

Run: ``python bench/journal.py [--seconds 3] [--dir DIR] [--json]`` (DIR on the disk to
measure; default a temp dir under /tmp, which is the work disk here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import trio

from ledgerd import native
from ledgerd.disk.journal import Journal, JournalOptions
from ledgerd.disk.journal_format import RecordType, entry_body


def raw_loop(directory: Path, entry_size: int, seconds: float) -> dict[str, float]:
    block = -(-(entry_size + 25) // 4096) * 4096
    path = directory / "raw.bin"
    span = 256 << 20
    with native.open_file(path, os.O_RDWR | os.O_CREAT, direct=True) as f:
        zero = native.alloc_aligned(1 << 20)
        for off in range(0, span, 1 << 20):
            f.pwrite(zero.view, off)
        f.fdatasync()
        buf = native.alloc_aligned(block)
        buf.view[:] = os.urandom(block)
        lat: list[float] = []
        off = 0
        end = time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            f.pwrite(buf.view, off)
            f.fdatasync()
            lat.append(time.perf_counter() - t0)
            off = (off + block) % span
        took = time.perf_counter() - start
    path.unlink()
    return _summary(len(lat), entry_size, took, lat)


def _summary(n: int, entry_size: int, took: float, lat: list[float]) -> dict[str, float]:
    lat.sort()
    return {"entries_per_s": n / took, "mb_per_s": n * entry_size / took / 1e6,
            "p50_ms": statistics.median(lat) * 1e3 if lat else 0.0,
            "p99_ms": lat[max(0, int(len(lat) * 0.99) - 1)] * 1e3 if lat else 0.0}


async def journal_run(directory: Path, entry_size: int, writers: int, seconds: float,
                      queue_empty: bool) -> dict[str, float]:
    j = Journal(directory, JournalOptions(flush_when_queue_empty=queue_empty))
    await j.open()
    payload = os.urandom(entry_size)
    lat: list[float] = []
    count = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(j.run)
        deadline = trio.current_time() + seconds

        async def writer(w: int) -> None:
            nonlocal count
            k = 0
            while trio.current_time() < deadline:
                t0 = time.perf_counter()
                await j.append([(RecordType.ENTRY, entry_body(w, k, payload))])
                lat.append(time.perf_counter() - t0)
                count += 1
                k += 1

        start = time.perf_counter()
        async with trio.open_nursery() as ws:
            for w in range(writers):
                ws.start_soon(writer, w)
        took = time.perf_counter() - start
        await j.close()
        nursery.cancel_scope.cancel()
    for f in j.files():
        f.unlink()
    return _summary(count, entry_size, took, lat) | {"groups": j.groups_written}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="ledgerd-bench-journal-", dir="/tmp"))
    cases = [(1024, 1), (1024, 16), (1024, 256), (65536, 16)]
    raw = {size: raw_loop(base, size, args.seconds) for size in (1024, 65536)}
    rows = []
    for queue_empty in (False, True):
        for size, writers in cases:
            r = trio.run(journal_run, base, size, writers, args.seconds, queue_empty)
            rows.append({"mode": "queue-empty" if queue_empty else "2ms-wait",
                         "entry_bytes": size, "writers": writers, **r,
                         "ratio_to_raw": r["entries_per_s"] / raw[size]["entries_per_s"]})
    if args.json:
        print(json.dumps({"raw": raw, "journal": rows}, indent=2))
        return
    print(f"{'case':<34} {'entries/s':>10} {'MB/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'x raw':>6}")
    for size, r in raw.items():
        print(f"{'raw O_DIRECT+fdatasync ' + str(size // 1024) + ' KiB':<34} "
              f"{r['entries_per_s']:>10.0f} {r['mb_per_s']:>8.1f} {r['p50_ms']:>7.2f} "
              f"{r['p99_ms']:>7.2f} {1.0:>6.1f}")
    for r in rows:
        name = f"journal {r['mode']} {r['entry_bytes'] // 1024} KiB x{r['writers']}"
        print(f"{name:<34} {r['entries_per_s']:>10.0f} {r['mb_per_s']:>8.1f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['ratio_to_raw']:>6.1f}")


if __name__ == "__main__":
    main()
