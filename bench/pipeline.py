"""Reading a log through Spark local[2] beside the same read through the client alone.

    python bench/pipeline.py [--mib 1024] [--entry-size 1024] [--rounds 3]

Starts a real ZooKeeper and three bookie processes (``tools.localcluster``), writes
``--mib`` MiB of ``--entry-size`` entries into a log (E=3 Qw=3 Qa=2, a new ledger every
256k entries), then reads the whole log ``--rounds`` times each way:

- client: one ``SyncClient`` in this process reads every ledger of the log in order
  (``SyncReadHandle.read``, 2048-entry ReadRange windows, one window read ahead), the
  same path a Spark task takes;
- Spark: ``spark.read.format("ledgerd")`` over the log in local[2], and an aggregate
  (``count(*)``, ``sum(length(payload))``) that touches every row, so every entry is read,
  verified, turned into Arrow and handed to the JVM.

Rows/s and MB/s are of payload bytes; the Spark figure includes planning and the job,
not the session start nor the first (untimed) query that starts the Python workers.
Medians over the rounds.
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

import ledgerd
from ledgerd.tools.localcluster import LocalCluster

LOG = "bench-pipeline"


def _write(zk: str, entries: int, size: int) -> list[int]:
    payload = os.urandom(size)
    with ledgerd.SyncClient(zk, throttle=0) as client:  # BookKeeper's 5000/s default off
        with client.open_log_writer(LOG, 3, 3, 2, roll_entries=256 * 1024) as writer:
            chunk = 16_384
            for start in range(0, entries, chunk):
                writer.append_many([payload] * min(chunk, entries - start))
        return list(client.log_ledgers(LOG))


def _client_read(zk: str, ledgers: list[int]) -> tuple[float, int, int]:
    with ledgerd.SyncClient(zk) as client:
        t0 = time.perf_counter()
        rows = size = 0
        for lid in ledgers:
            for entry in client.open_ledger(lid, recovery=False).read(window=2048):
                rows += 1
                size += len(entry.payload)
        return time.perf_counter() - t0, rows, size


def _spark_read(spark: Any, zk: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    row = (spark.read.format("ledgerd").option("zk", zk).option("log", LOG)
           .option("entries_per_partition", "65536").load()
           .selectExpr("count(*) as n", "sum(length(payload)) as bytes").collect()[0])
    return time.perf_counter() - t0, int(row.n), int(row.bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    entries = args.mib * (1 << 20) // args.entry_size
    base = Path(tempfile.mkdtemp(prefix="ledgerd-pipeline-bench-",
                                 dir=os.environ.get("BENCH_DIR")))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    cluster = LocalCluster(base, bookies=3)
    try:
        cluster.start()
        t0 = time.perf_counter()
        ledgers = _write(cluster.zk, entries, args.entry_size)
        write_s = time.perf_counter() - t0
        print(f"wrote {entries:,} entries of {args.entry_size} B into {len(ledgers)} ledgers "
              f"in {write_s:.1f} s", flush=True)
        from pyspark.sql import SparkSession

        import ledgerd.spark

        spark = (SparkSession.builder.master("local[2]").appName("ledgerd-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        ledgerd.spark.register(spark)
        # Warm-up (not timed): starts the Python workers and their clients.
        (spark.read.format("ledgerd").option("zk", cluster.zk).option("ledger", str(ledgers[0]))
         .option("last_entry", "999").load().count())
        runs: dict[str, list[float]] = {"client": [], "spark": []}
        for rnd in range(args.rounds):
            for name in ("client", "spark"):
                secs, rows, size = (_client_read(cluster.zk, ledgers) if name == "client"
                                    else _spark_read(spark, cluster.zk))
                if (rows, size) != (entries, entries * args.entry_size):
                    raise SystemExit(f"{name} read {rows} rows / {size} B, wrote {entries}")
                runs[name].append(secs)
                print(f"round {rnd + 1} {name}: {secs:.1f} s, {rows / secs:,.0f} rows/s, "
                      f"{size / secs / 1e6:.1f} MB/s", flush=True)
        spark.stop()
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    total = entries * args.entry_size
    result = {name: {"seconds": statistics.median(v),
                     "rows_per_s": entries / statistics.median(v),
                     "mb_per_s": total / statistics.median(v) / 1e6} for name, v in runs.items()}
    result["write"] = {"seconds": write_s, "entries_per_s": entries / write_s}
    if args.json:
        print(json.dumps(result))
        return
    print()
    print("| read of the log | seconds | rows/s | MB/s |")
    print("|---|---|---|---|")
    for name, label in (("client", "client alone (one SyncClient)"),
                        ("spark", "Spark local[2], ledgerd source")):
        r = result[name]
        print(f"| {label} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} | "
              f"{r['mb_per_s']:.1f} |")
    print(f"\nSpark / client: {result['spark']['rows_per_s'] / result['client']['rows_per_s']:.2f}")


if __name__ == "__main__":
    main()
