"""The db storage's index store: LMDB (what ``disk/dbindex.py`` uses) beside RocksDB
(``rocksdict``), on the db storage's own access pattern.

    python bench/index_store.py [--ledgers 100000] [--entries 5] [--checkpoint 70000]
                                [--rounds 5]

Keys as ``dbindex.py`` lays them out: (ledger, entry) big-endian -> 8-byte location.
Each store is loaded with ``--ledgers`` x ``--entries`` keys, then, per round, the
stores alternating:

- **checkpoint**: ``--checkpoint`` new keys, one more entry of that many ledgers spread
  over all of them (round-robin writers), written as one sorted batch and made durable
  (LMDB: one write transaction, then ``env.sync``; RocksDB: one ``WriteBatch`` through
  its write-ahead log, then ``flush_wal(sync=True)``, BookKeeper's way);
- **lookups**: 100,000 random point reads;
- after the rounds, **GC**: half of the ledgers deleted (LMDB: a cursor walk per
  ledger in one transaction; RocksDB: ``delete_range`` per ledger), made durable.

The figures go to bench/RESULTS.md with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KEY = struct.Struct(">qq")
LOC = struct.Struct(">q")


class Lmdb:
    name = "lmdb"

    def __init__(self, path: Path) -> None:
        import lmdb

        self.env = lmdb.open(str(path), map_size=1 << 40, max_dbs=2, sync=False,
                             metasync=True, readahead=False)
        self.db = self.env.open_db(b"loc")

    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor(db=self.db).putmulti(items)
        self.env.sync(True)

    def get(self, key: bytes) -> bytes | None:
        with self.env.begin(db=self.db) as txn:
            return txn.get(key)  # type: ignore[no-any-return]

    def delete_ledgers(self, ledgers: list[int]) -> None:
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor(db=self.db)
            for lid in ledgers:
                if cursor.set_range(KEY.pack(lid, 0)):
                    while True:
                        k = cursor.key()
                        if len(k) != KEY.size or KEY.unpack(k)[0] != lid or not cursor.delete():
                            break
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()


class Rocks:
    name = "rocksdb"

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self.db = Rdict(str(path), opts)
        self.wo = WriteOptions()

    def write(self, items: list[tuple[bytes, bytes]]) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, v in items:
            wb.put(k, v)
        self.db.write(wb, self.wo)
        self.db.flush_wal(True)

    def get(self, key: bytes) -> bytes | None:
        return self.db.get(key)  # type: ignore[no-any-return]

    def delete_ledgers(self, ledgers: list[int]) -> None:
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for lid in ledgers:
            wb.delete_range(KEY.pack(lid, 0), KEY.pack(lid + 1, 0))
        self.db.write(wb, self.wo)
        self.db.flush_wal(True)

    def close(self) -> None:
        self.db.close()


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--entries", type=int, default=5)
    parser.add_argument("--checkpoint", type=int, default=70_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-index-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    stores: list[Any] = []
    out: dict[str, Any] = {}
    try:
        for cls in (Lmdb, Rocks):
            (base / cls.name).mkdir()
            store = cls(base / cls.name)
            t = time.perf_counter()
            for e in range(args.entries):
                store.write([(KEY.pack(lid, e), LOC.pack(lid * 7 + e))
                             for lid in range(args.ledgers)])
            out[cls.name] = {"load_s": round(time.perf_counter() - t, 2), "checkpoint_s": [],
                             "lookups_per_s": []}
            stores.append(store)
        next_entry = [args.entries] * args.ledgers
        rr = 0
        rng = random.Random(1)
        for rnd in range(args.rounds):
            batch = []
            for _ in range(args.checkpoint):
                lid = rr % args.ledgers
                rr += 1
                batch.append((KEY.pack(lid, next_entry[lid]), LOC.pack(rr)))
                next_entry[lid] += 1
            batch.sort()
            keys = [KEY.pack(lid, rng.randrange(next_entry[lid]))
                    for lid in (rng.randrange(args.ledgers) for _ in range(100_000))]
            order = stores if rnd % 2 == 0 else list(reversed(stores))
            for store in order:
                t = time.perf_counter()
                store.write(batch)
                out[store.name]["checkpoint_s"].append(round(time.perf_counter() - t, 3))
                t = time.perf_counter()
                for k in keys:
                    store.get(k)
                out[store.name]["lookups_per_s"].append(round(100_000 / (time.perf_counter() - t)))
            print(json.dumps({"round": rnd + 1, **{s.name: {
                "checkpoint_s": out[s.name]["checkpoint_s"][-1],
                "lookups_per_s": out[s.name]["lookups_per_s"][-1]} for s in stores}}),
                flush=True)
        half = list(range(0, args.ledgers, 2))
        for store in stores:
            t = time.perf_counter()
            store.delete_ledgers(half)
            out[store.name]["gc_ledgers_per_s"] = round(len(half) / (time.perf_counter() - t))
            out[store.name]["disk_mb"] = round(_du(base / store.name) / 1e6, 1)
            out[store.name]["checkpoint_median_s"] = statistics.median(
                out[store.name]["checkpoint_s"])
            out[store.name]["lookups_median_per_s"] = statistics.median(
                out[store.name]["lookups_per_s"])
    finally:
        for store in stores:
            store.close()
        shutil.rmtree(base, ignore_errors=True)
    out["load"] = [load_start, os.getloadavg()[0]]
    out["args"] = vars(args)
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
