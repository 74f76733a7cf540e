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
- **txn** against **idem** (issue #47, goal txn >= 0.7x idem): the same confluent-kafka
  producer (acks=all, enable.idempotence, linger.ms 5) sends ``--txn-messages`` messages
  to a fresh one-partition topic, with a ``transactional.id`` in transactions of
  ``--txn-records`` (begin, produce, commit, in a loop), and without; messages/s from
  the first send to the last commit (txn) or delivery report (idem), and txn / idem.
- **e2e**: the idem producer at half the round's idem rate (open loop: each message is
  due on a schedule and stamped with its due time, so a stall delays every message due
  during it instead of pausing the clock) for ``--e2e-seconds``, while a
  ``read_committed`` consumer in a thread of the same process (assign, no group)
  notes when each arrives; p50/p99/max of due time to arrival, every message checked
  to arrive; beside them the producer's own due-time-to-delivery-report (acks=all)
  p50/p99. Beside it, in the same round and at the same rate, the native client's
  appends (``run_writes`` of ``ledgerd bench writes``, paced, one 1 KiB entry each, at
  most ``--native-window`` in flight) and their p99 from submit to durable.
- **consume** (after the rounds): a topic of ``--consume-mb`` MiB read from the beginning
  by kcat (librdkafka in C: the gateway's figure) and by a confluent-kafka consumer in
  Python (assign, no group; there the Python loop over messages is the limit); MB/s.

``--cases`` picks among ``produce`` (kafka against native), ``txn`` (txn against idem),
``e2e`` (needs ``txn`` for its rate, or ``--e2e-rate``) and ``consume``; in each pair
the order alternates between rounds. Every round is printed, then the medians, with
the 1-minute load at start and end of the run and at the start of each round.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

import ledgerd
from ledgerd.tools.benchcmd import latency_summary, run_writes
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


def _idem_config(bootstrap: str) -> dict[str, Any]:
    """The producer of the txn, idem and e2e cases (librdkafka's linger.ms 5 stated, as
    its default has changed between versions)."""
    return {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5}


def _produce_one(p: Any, topic: str, value: bytes, report: Any = None) -> None:
    while True:
        try:
            p.produce(topic, value, on_delivery=report)
            return
        except BufferError:
            p.poll(0.01)


def _txn_produce(bootstrap: str, topic: str, n: int, per_txn: int,
                 transactional: bool) -> float:
    """Messages/s of ``n`` messages, in transactions of ``per_txn`` or (not
    ``transactional``) without, the producer's config otherwise the same."""
    from confluent_kafka import Producer

    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    config = _idem_config(bootstrap)
    if transactional:
        config["transactional.id"] = f"bench-{topic}"
    p = Producer(config)
    # the producer id, topic metadata and the partition's writer, before timing
    if transactional:
        p.init_transactions(60)
        p.begin_transaction()
    p.produce(topic, PAYLOAD)
    if transactional:
        p.commit_transaction(60)
    p.flush(60)
    start = time.perf_counter()
    if transactional:
        for i in range(0, n, per_txn):
            p.begin_transaction()
            for _ in range(min(per_txn, n - i)):
                _produce_one(p, topic, PAYLOAD, report)
            p.commit_transaction(60)  # flushes first
    else:
        for _ in range(n):
            _produce_one(p, topic, PAYLOAD, report)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"{left} undelivered, {len(failed)} failed: {failed[:3]}")
    return n / elapsed


_STAMP = struct.Struct("<d")  # a message's due time (perf_counter), its first 8 bytes


def _e2e(bootstrap: str, topic: str, rate: float, seconds: float) -> dict[str, Any]:
    """Produce at ``rate`` messages/s (acks=all, idempotent) for ``seconds`` while a
    read_committed consumer notes each message's arrival: latency from the message's
    due time to the ``consume`` call that returned it."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    p = Producer(_idem_config(bootstrap))
    p.produce(topic, _STAMP.pack(0.0) + PAYLOAD[8:])  # creates the topic; not counted
    if p.flush(60):
        raise RuntimeError("the e2e warm-up message was not delivered")
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    acks: list[float] = []  # due time to the delivery report (acks=all), beside them

    def acked(err: object, msg: Any) -> None:
        if err is None:
            acks.append(time.perf_counter() - _STAMP.unpack_from(msg.value())[0])
    ready = threading.Event()
    failure: list[BaseException] = []

    def consume() -> None:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-e2e",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        try:
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            deadline = time.perf_counter() + seconds + 60
            while len(latencies) < total and time.perf_counter() < deadline:
                # one message per call: ``consume(n, timeout)`` would wait to fill n
                m = c.poll(0.2)
                now = time.perf_counter()
                if m is None:
                    continue
                if m.error():
                    raise RuntimeError(str(m.error()))
                (due,) = _STAMP.unpack_from(m.value() or b"")
                if due == 0.0:
                    ready.set()  # the warm-up message: the fetch session is up
                else:
                    latencies.append(now - due)
        except BaseException as exc:
            failure.append(exc)
        finally:
            ready.set()
            c.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    if not ready.wait(60) or failure:
        raise RuntimeError(f"the e2e consumer did not start: {failure}")
    start = time.perf_counter() + 0.01
    for i in range(total):
        due = start + i / rate
        p.poll(0)  # delivery reports as they come (their latency is the ack's)
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(max(wait, 0.0005))
        _produce_one(p, topic, _STAMP.pack(due) + PAYLOAD[8:], acked)
    if p.flush(60):
        raise RuntimeError("e2e: messages undelivered after 60 s")
    consumer.join(seconds + 90)
    if failure:
        raise RuntimeError(f"e2e consumer: {failure[0]!r}") from failure[0]
    if len(latencies) != total:
        raise RuntimeError(f"e2e: {len(latencies)} of {total} messages consumed")
    ack = latency_summary(acks)
    return {"rate": round(rate), "messages": total, **latency_summary(latencies),
            "ack_p50_ms": ack["p50_ms"], "ack_p99_ms": ack["p99_ms"]}


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


CASES = ("produce", "txn", "e2e", "consume")


def _pair(n: int, first: str, second: str) -> list[str]:
    return [first, second] if n % 2 == 0 else [second, first]


def _round(args: argparse.Namespace, cases: set[str], n: int, bootstrap: str,
           zk: str) -> dict[str, Any]:
    """One round of every case asked for (each pair's order alternating with ``n``),
    printed as it ends."""
    row: dict[str, Any] = {"round": n + 1, "load": round(os.getloadavg()[0], 2)}
    line = [f"round {n + 1} (load {row['load']:.2f}):"]
    if "produce" in cases:
        for case in _pair(n, "kafka", "native"):
            if case == "kafka":
                row["kafka_msgs_s"] = round(_kafka_produce(bootstrap, f"p{n}", args.messages))
            else:
                row["native_appends_s"] = round(trio.run(_native, zk, f"n{n}", args.messages))
        row["ratio"] = round(row["kafka_msgs_s"] / row["native_appends_s"], 2)
        line.append(f"gateway {row['kafka_msgs_s']:,} msgs/s, native "
                    f"{row['native_appends_s']:,} appends/s, ratio {row['ratio']};")
    if "txn" in cases:
        for case in _pair(n, "txn", "idem"):
            row[f"{case}_msgs_per_s"] = round(_txn_produce(
                bootstrap, f"{case}{n}", args.txn_messages, args.txn_records,
                transactional=case == "txn"))
        row["txn_ratio"] = round(row["txn_msgs_per_s"] / row["idem_msgs_per_s"], 3)
        line.append(f"txn x {args.txn_records} {row['txn_msgs_per_s']:,} msgs/s, idem "
                    f"{row['idem_msgs_per_s']:,} msgs/s, txn / idem {row['txn_ratio']};")
    if "e2e" in cases:
        rate = args.e2e_rate or row["idem_msgs_per_s"] / 2
        for case in _pair(n, "e2e", "native_paced"):
            if case == "e2e":
                row["e2e"] = _e2e(bootstrap, f"e{n}", rate, args.e2e_seconds)
            else:
                r = trio.run(functools.partial(
                    run_writes, zk, 3, 2, 2, len(PAYLOAD), 1, args.native_window,
                    args.e2e_seconds, warmup=0.5, rate=rate))
                row["native_paced"] = {k: r[k] for k in (
                    "rate", "appends_per_s", "p50_ms", "p99_ms", "max_ms")}
        e, a = row["e2e"], row["native_paced"]
        line.append(f"e2e at {e['rate']:,}/s p50 {e['p50_ms']:.1f} p99 {e['p99_ms']:.1f} "
                    f"max {e['max_ms']:.1f} ms (producer's ack p50 {e['ack_p50_ms']:.1f} "
                    f"p99 {e['ack_p99_ms']:.1f}), native append p50 {a['p50_ms']:.1f} "
                    f"p99 {a['p99_ms']:.1f} ms ({a['appends_per_s']:,.0f}/s)")
    print(" ".join(line), flush=True)
    return row


def _summary(results: list[dict[str, Any]]) -> dict[str, float]:
    """The medians of every figure the rounds have."""
    flat: dict[str, list[float]] = {}
    for r in results:
        for k, v in r.items():
            for key, value in (v.items() if isinstance(v, dict) else [(k, v)]):
                name = f"{k}_{key}" if isinstance(v, dict) else key
                if name != "round":
                    flat.setdefault(name, []).append(value)
    return {k: statistics.median(v) for k, v in flat.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50000)
    parser.add_argument("--consume-mb", type=int, default=1024)
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--txn-messages", type=int, default=20000,
                        help="messages of each txn and idem run")
    parser.add_argument("--txn-records", type=int, default=100,
                        help="messages per transaction")
    parser.add_argument("--e2e-seconds", type=float, default=5.0)
    parser.add_argument("--e2e-rate", type=float, default=0.0,
                        help="messages/s of e2e (default: half the round's idem rate)")
    parser.add_argument("--native-window", type=int, default=800,
                        help="most native appends in flight beside e2e")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    if cases - set(CASES) or ("e2e" in cases and "txn" not in cases and not args.e2e_rate):
        parser.error(f"--cases: of {', '.join(CASES)}; e2e needs txn or --e2e-rate")
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
            results.append(_round(args, cases, n, bootstrap, zk))
        if "consume" in cases:
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
    summary = _summary(results)
    if args.json:
        print(json.dumps({"rounds": results, "median": summary, "consume_mb_s": mbs,
                          "kcat_consume_mb_s": kcat_mbs,
                          "load": [load_start, load_end]}))
        return
    print(f"\nload average (1 min): {load_start:.2f} at start, {load_end:.2f} at end")
    print("medians: " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if "txn" in cases:
        held = sum(r["txn_ratio"] >= 0.7 for r in results)
        print(f"txn / idem >= 0.7 in {held} of {len(results)} rounds")


if __name__ == "__main__":
    main()
