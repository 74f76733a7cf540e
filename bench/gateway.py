"""The Kafka gateway beside the native client, on one cluster, in alternating rounds.

    python bench/gateway.py [--rounds 3] [--messages 50000] [--consume-mb 256]

One ZooKeeper, three bookie processes, one ``ledgerd gateway`` process; E3/Qw2/Qa2,
1 KiB messages (random bytes, so compression would not help; none is used). Cases,
interleaved in every round (order alternates):

- **kafka**: a confluent-kafka producer (librdkafka; acks=all, default batching,
  idempotence off) sends ``--messages`` messages to a one-partition topic through the
  gateway; messages/s from the first send to the last delivery report.
- **native**: the ledgerd client appends the same number of 1 KiB payloads to a log
  (``LogWriter.append_many`` in chunks of 1,000: one entry per message, pipelined).
- **consume** (after the rounds): a topic of ``--consume-mb`` MiB read from the beginning
  by kcat (librdkafka in C: the gateway's figure) and by a confluent-kafka consumer in
  Python (assign, no group; there the Python loop over messages is the limit); MB/s.

Every round is printed, then the medians, with the 1-minute load at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.tools.processcluster import ProcessCluster
from ledgerd.tools.zkserver import find_free_port

PAYLOAD = os.urandom(1024)


def _kafka_produce(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                  "enable.idempotence": False})
    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    p.produce(topic, PAYLOAD)  # topic metadata and the partition's writer, before timing
    p.flush(60)
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, PAYLOAD, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"{left} undelivered, {len(failed)} failed: {failed[:3]}")
    return n / elapsed


async def _native(zk: str, name: str, n: int) -> float:
    async with ledgerd.open_client(zk, throttle=0) as client:
        writer = await client.logs.open_writer(name, 3, 2, 2)
        await writer.append(PAYLOAD)
        start = time.perf_counter()
        for i in range(0, n, 1000):
            await writer.append_many([PAYLOAD] * min(1000, n - i))
        elapsed = time.perf_counter() - start
        await writer.close()
    return n / elapsed


def _consume(bootstrap: str, topic: str, total_bytes: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench",
                  "enable.auto.commit": False, "fetch.max.bytes": 50 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < total_bytes:
        for m in c.consume(1000, 5):
            if m.error():
                raise RuntimeError(str(m.error()))
            got += len(m.value())
    elapsed = time.perf_counter() - start
    c.close()
    return got / elapsed / 1e6


def _kcat_consume(bootstrap: str, topic: str, messages: int, total_bytes: int) -> float:
    start = time.perf_counter()
    done = subprocess.run(["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning",
                           "-e", "-q", "-f", "%o\n"], capture_output=True, timeout=600,
                          check=True)
    elapsed = time.perf_counter() - start
    offsets = done.stdout.split()
    if len(offsets) != messages or int(offsets[-1]) != messages - 1:
        raise RuntimeError(f"kcat read {len(offsets)} of {messages} messages")
    return total_bytes / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--consume-mb", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-gw-bench-", dir=os.environ.get("BENCH_DIR")))
    load_start = os.getloadavg()[0]
    cluster = ProcessCluster(base, bookies=3, settings={"log_level": "WARNING"})
    port = find_free_port()
    gateway: subprocess.Popen[bytes] | None = None
    kcat_mbs: list[float] = []
    mbs = 0.0
    results: list[dict[str, Any]] = []

    try:
        trio.run(cluster.start)
        zk = cluster.zk
        log = open(base / "gateway.log", "wb")
        gateway = subprocess.Popen(
            [sys.executable, "-m", "ledgerd.tools.cli", "gateway", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "LEDGERD_ZK_SERVERS": zk, "LEDGERD_THROTTLE": "0"})
        while b"kafka gateway on" not in (base / "gateway.log").read_bytes():
            if gateway.poll() is not None:
                raise RuntimeError((base / "gateway.log").read_text())
            time.sleep(0.1)
        bootstrap = f"127.0.0.1:{port}"
        for n in range(args.rounds):
            cases = ["kafka", "native"] if n % 2 == 0 else ["native", "kafka"]
            row: dict[str, Any] = {"round": n + 1}
            for case in cases:
                if case == "kafka":
                    row["kafka_msgs_s"] = round(_kafka_produce(bootstrap, f"p{n}",
                                                               args.messages))
                else:
                    row["native_appends_s"] = round(trio.run(_native, zk, f"n{n}",
                                                             args.messages))
            row["ratio"] = round(row["kafka_msgs_s"] / row["native_appends_s"], 2)
            results.append(row)
            print(f"round {n + 1}: gateway {row['kafka_msgs_s']:,} msgs/s, native "
                  f"{row['native_appends_s']:,} appends/s, ratio {row['ratio']}", flush=True)
        size = args.consume_mb << 20
        _kafka_produce(bootstrap, "consume", size // len(PAYLOAD))
        count = size // len(PAYLOAD) + 1  # and the warm-up message
        kcat_mbs = [round(_kcat_consume(bootstrap, "consume", count, size), 1)
                    for _ in range(args.rounds)]
        mbs = round(_consume(bootstrap, "consume", size), 1)
        print(f"consume: {args.consume_mb} MiB from the beginning: kcat {kcat_mbs} MB/s, "
              f"confluent-kafka (Python loop) {mbs} MB/s", flush=True)
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)
            gateway.wait(30)
        cluster.stop(graceful=False)
        shutil.rmtree(base, ignore_errors=True)
    load_end = os.getloadavg()[0]
    summary = {k: statistics.median(r[k] for r in results)
               for k in ("kafka_msgs_s", "native_appends_s", "ratio")}
    if args.json:
        print(json.dumps({"rounds": results, "median": summary, "consume_mb_s": mbs,
                          "kcat_consume_mb_s": kcat_mbs,
                          "load": [load_start, load_end]}))
        return
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    print("medians: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
