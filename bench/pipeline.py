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

Then the streaming copy (``--stream-rate`` entries/s for ``--stream-seconds``; 0 skips
it): a writer appends to log ``bench-src`` at a steady rate, each payload starting with
its send time; a streaming query (``readStream`` ledgerd -> ``writeStream`` ledgerd, the
exactly-once sink, ``--trigger``) copies it to ``bench-dst``; a follower polls
``bench-dst``'s ledger list every 20 ms, and an entry's lag is the time its ledger
appeared in the list (the batch's CAS: the moment a reader of B can see it) minus its
send time. Reported: entries/s copied (from the first send to the last entry visible)
and lag p50/p99/max.
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
        with client.logs.open_writer(LOG, 3, 3, 2, roll_entries=256 * 1024) as writer:
            chunk = 16_384
            for start in range(0, entries, chunk):
                writer.append_many([payload] * min(chunk, entries - start))
        return list(client.logs.ledgers(LOG))


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


def _stream_copy(spark: Any, zk: str, rate: float, seconds: float, size: int,
                 trigger: str, base: Path) -> dict[str, float]:
    import struct
    import threading

    src, dst = "bench-src", "bench-dst"
    total = int(rate * seconds)
    pad = b"x" * max(0, size - 8)
    visible: dict[int, float] = {}  # dst ledger -> when it appeared in the list
    stop = threading.Event()
    with ledgerd.SyncClient(zk, throttle=0) as client:
        client.call(client.client.logs.store.create, dst)

        def follow() -> None:
            while not stop.is_set():
                now = time.perf_counter()
                for lid in client.logs.ledgers(dst):
                    visible.setdefault(lid, now)
                stop.wait(0.02)

        query = (spark.readStream.format("ledgerd").option("zk", zk).option("log", src)
                 .load().select("payload")
                 .writeStream.format("ledgerd").option("zk", zk).option("log", dst)
                 .option("ensemble_size", "3").option("write_quorum", "2")
                 .option("ack_quorum", "2")
                 .option("checkpointLocation", str(base / "stream-ckpt"))
                 .trigger(processingTime=trigger))
        with client.logs.open_writer(src, 3, 2, 2, roll_entries=20_000) as writer:
            writer.append(struct.pack(">d", time.perf_counter()) + pad)  # the log exists
            running = query.start()
            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            while not visible:  # the query's first batch (the first entry) is through
                if not running.isActive:
                    raise SystemExit(f"streaming copy failed: {running.exception()}")
                time.sleep(0.05)
            t0 = time.perf_counter()
            sent = 1
            while sent < total:  # every 10 ms, the entries due by now, stamped when due
                now = time.perf_counter()
                due = min(total, 1 + int((now - t0) * rate))
                if due > sent:
                    writer.append_many([struct.pack(">d", t0 + k / rate) + pad
                                        for k in range(sent, due)])
                    sent = due
                time.sleep(0.01)
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            if sum(client.ledger_metadata(lid).last_entry_id + 1
                   for lid in list(visible)) >= total:
                break
            time.sleep(0.1)
        stop.set()
        follower.join()
        progress = running.lastProgress or {}
        source = (progress.get("sources") or [{}])[0]
        running.stop()
        lags, last_visible, copied = [], 0.0, 0
        for lid, seen in visible.items():
            for entry in client.open_ledger(lid).read():
                copied += 1
                stamp = struct.unpack(">d", entry.payload[:8])[0]
                if stamp >= t0:  # not the first entry, copied before the clock started
                    lags.append(seen - stamp)
                    last_visible = max(last_visible, seen)
    if copied != total:
        raise SystemExit(f"streaming copy: {copied} entries in {dst}, {total} sent")
    lags.sort()
    return {"entries": total, "entries_per_s": (total - 1) / (last_visible - t0),
            "lag_p50_s": lags[len(lags) // 2], "lag_p99_s": lags[int(len(lags) * 0.99)],
            "lag_max_s": lags[-1], "rate": rate, "trigger": trigger,
            "last_progress_source": {k: source.get(k) for k in
                                     ("startOffset", "endOffset", "latestOffset",
                                      "numInputRows")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--entry-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-rate", type=float, default=2000,
                        help="entries/s into the streaming copy's source (0: skip it)")
    parser.add_argument("--stream-seconds", type=float, default=30)
    parser.add_argument("--trigger", default="1 second", help="the copy's processingTime")
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
        stream = None
        if args.stream_rate > 0:
            stream = _stream_copy(spark, cluster.zk, args.stream_rate, args.stream_seconds,
                                  args.entry_size, args.trigger, base)
            print(f"streaming copy at {args.stream_rate:,.0f}/s for {args.stream_seconds:.0f} s "
                  f"(trigger {args.trigger}): {stream['entries_per_s']:,.0f} entries/s, lag "
                  f"p50 {stream['lag_p50_s']:.2f} s, p99 {stream['lag_p99_s']:.2f} s, max "
                  f"{stream['lag_max_s']:.2f} s", flush=True)
        spark.stop()
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    total = entries * args.entry_size
    result = {name: {"seconds": statistics.median(v),
                     "rows_per_s": entries / statistics.median(v),
                     "mb_per_s": total / statistics.median(v) / 1e6} for name, v in runs.items()}
    result["write"] = {"seconds": write_s, "entries_per_s": entries / write_s}
    if stream is not None:
        result["stream"] = stream
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
    if stream is not None:
        print(f"\n| streaming copy (trigger {stream['trigger']}) | input /s | copied /s | lag p50 s "
              "| lag p99 s | lag max s |\n|---|---|---|---|---|---|\n"
              f"| ledgerd -> ledgerd, exactly once | {stream['rate']:,.0f} | "
              f"{stream['entries_per_s']:,.0f} | {stream['lag_p50_s']:.2f} | "
              f"{stream['lag_p99_s']:.2f} | {stream['lag_max_s']:.2f} |")


if __name__ == "__main__":
    main()
