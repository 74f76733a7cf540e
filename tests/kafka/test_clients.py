"""Stock Kafka clients against a real gateway, bookies and ZooKeeper: kcat (librdkafka
from Debian), kafka-python (idempotence on by default), confluent-kafka and aiokafka.
What a user of each does first: produce with keys, headers and compression, consume
from the beginning, consume in a group that rebalances, resume after the committed
offset across a gateway restart, seek by timestamp, list topics."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from typing import Any

from tests.kafka.conftest import KafkaCluster

BOUND_S = 60  # every client call below is bounded; reaching it fails the test


def kcat(cluster: KafkaCluster, *args: str, stdin: str = "") -> str:
    done = subprocess.run(["kcat", "-b", cluster.bootstrap, *args], input=stdin.encode(),
                          capture_output=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_kcat_produce_consume_and_list(kafka_cluster: KafkaCluster) -> None:
    lines = [f"key{i}:value {i}" for i in range(200)]
    kcat(kafka_cluster, "-P", "-t", "kc-plain", "-K:", stdin="\n".join(lines) + "\n")
    out = kcat(kafka_cluster, "-C", "-t", "kc-plain", "-o", "beginning", "-e", "-K:",
               "-f", "%k:%s:%o\n")
    assert out.splitlines() == [f"{line}:{i}" for i, line in enumerate(lines)]
    listing = kcat(kafka_cluster, "-L")
    assert 'topic "kc-plain" with 1 partitions' in listing
    # -o -5: the last five, by offsets from the end
    tail = kcat(kafka_cluster, "-C", "-t", "kc-plain", "-o", "-5", "-e", "-f", "%o\n")
    assert tail.split() == ["195", "196", "197", "198", "199"]


def test_kcat_group_resumes_after_the_committed_offset_across_a_restart(
        kafka_cluster: KafkaCluster) -> None:
    kcat(kafka_cluster, "-P", "-t", "kc-group", stdin="".join(f"a{i}\n" for i in range(10)))
    # (-o with -G would override the committed offset; the reset policy does not)
    earliest = ("-X", "auto.offset.reset=earliest")
    first = kcat(kafka_cluster, "-G", "g-kcat", *earliest, "-e", "kc-group")
    assert first.split() == [f"a{i}" for i in range(10)]
    kafka_cluster.gateway.restart()  # group state and offsets must survive it
    kcat(kafka_cluster, "-P", "-t", "kc-group", stdin="".join(f"b{i}\n" for i in range(5)))
    second = kcat(kafka_cluster, "-G", "g-kcat", *earliest, "-e", "kc-group")
    assert second.split() == [f"b{i}" for i in range(5)]


def test_kafka_python_idempotent_compressed_with_headers_and_timestamps(
        kafka_cluster: KafkaCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    sent = []
    base_ms = int(time.time() * 1000)
    for n, codec in enumerate(("gzip", "zstd", "lz4")):  # a second apart, by timestamp
        producer = KafkaProducer(bootstrap_servers=kafka_cluster.bootstrap,
                                 compression_type=codec, acks="all", linger_ms=5)
        assert producer.config["enable_idempotence"]  # the 3.x default, needs InitProducerId
        futures = [producer.send("kp-topic", key=f"{codec}{i}".encode(), value=b"v" * i,
                                 headers=[("codec", codec.encode())],
                                 timestamp_ms=base_ms + 1000 * n) for i in range(100)]
        producer.flush(BOUND_S)
        sent += [(f.get(BOUND_S).offset, f"{codec}{i}") for i, f in enumerate(futures)]
        producer.close()
    assert [o for o, _ in sent] == list(range(300))
    consumer = KafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap, group_id=None,
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    tp = TopicPartition("kp-topic", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = [m for _, m in zip(range(300), consumer, strict=False)]
    assert [(m.offset, m.key.decode()) for m in got] == sent
    assert got[150].headers == [("codec", b"zstd")] and got[150].value == b"v" * 50
    # seek by time: the zstd messages' timestamp finds the first of them
    found = consumer.offsets_for_times({tp: base_ms + 1000})[tp]
    assert found is not None and found.offset == 100
    consumer.close()


def test_confluent_kafka_group_of_two_rebalances_when_one_leaves(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic("ck-two", num_partitions=2,
                                  replication_factor=1)])["ck-two"].result(BOUND_S)
    for codec in ("gzip", "zstd", "lz4", "snappy"):  # 100 messages each
        producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap,
                             "compression.type": codec})
        for i in range(100):
            n = {"gzip": 0, "zstd": 100, "lz4": 200, "snappy": 300}[codec] + i
            producer.produce("ck-two", key=str(n).encode(), value=f"m{n}".encode(),
                             headers=[("codec", codec.encode())], partition=n % 2)
        assert producer.flush(BOUND_S) == 0
    conf = {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "ck-g",
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500}
    a, b = Consumer(conf), Consumer(conf)
    a.subscribe(["ck-two"])
    b.subscribe(["ck-two"])
    seen: dict[str, list[str]] = {"a": [], "b": []}

    def take(name: str, m: Any) -> None:
        seen[name].append(m.value().decode())
        codec = ("gzip", "zstd", "lz4", "snappy")[int(m.key()) // 100]
        assert m.headers() == [("codec", codec.encode())]  # passed through, per codec
    deadline = time.monotonic() + BOUND_S
    while (not a.assignment() or not b.assignment()) and time.monotonic() < deadline:
        for name, c in (("a", a), ("b", b)):
            m = c.poll(0.2)
            if m is not None and not m.error():
                take(name, m)
    assert len(a.assignment()) == 1 and len(b.assignment()) == 1  # one partition each
    while len(seen["a"]) + len(seen["b"]) < 200 and time.monotonic() < deadline:
        for name, c in (("a", a), ("b", b)):
            m = c.poll(0.1)
            if m is not None and not m.error():
                take(name, m)
    b.close()  # commits and leaves: a gets both partitions
    while len(seen["a"]) + len(seen["b"]) < 400 and time.monotonic() < deadline:
        m = a.poll(0.2)
        if m is not None and not m.error():
            take("a", m)
    assert len(a.assignment()) == 2
    a.close()
    everything = seen["a"] + seen["b"]
    from collections import Counter
    dup = [k for k, n in Counter(everything).items() if n > 1]
    missing = {f"m{i}" for i in range(400)} - set(everything)
    assert not dup and not missing, (len(everything), dup[:10], sorted(missing)[:10])
    assert sorted(everything) == sorted(f"m{i}" for i in range(400))  # each once


def test_aiokafka_produces_and_consumes_in_a_group(kafka_cluster: KafkaCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def main() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap,
                                    compression_type="gzip", enable_idempotence=True)
        await producer.start()
        try:
            for i in range(50):
                await producer.send_and_wait("ak-topic", f"n{i}".encode(), key=b"k",
                                             headers=[("h", b"1")])
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("ak-topic", bootstrap_servers=kafka_cluster.bootstrap,
                                    group_id="ak-g", auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(BOUND_S):
                async for m in consumer:
                    got.append(m.value)
                    if len(got) == 50:
                        break
            await consumer.commit()
            committed = await consumer.committed(next(iter(consumer.assignment())))
            assert committed == 50
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(main()) == [f"n{i}".encode() for i in range(50)]


def _produce_errors(cluster: KafkaCluster) -> dict[str, float]:
    """The gateway's Produce error counters, by error name."""
    import urllib.request

    text = urllib.request.urlopen(cluster.gateway.metrics_url, timeout=30).read().decode()
    prefix = 'ledgerd_kafka_errors_total{api="PRODUCE",error="'
    return {line[len(prefix):].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


def test_a_consumer_reads_across_ledger_rolls_from_the_bookies(
        kafka_cluster: KafkaCluster) -> None:
    """The module's gateway rolls a partition's ledger every MiB and caches only 64 KiB:
    4 MiB read from the beginning, one batch per fetch, come from bookies across four
    ledgers (a fetch at a ledger's end once found nothing, for ever). The producer's
    ~1 MB batches overfill the gateway's 512 KiB produce queue: the gateway holds the
    next request back, never refuses it (a refused batch was retried after the one
    behind it, and read out of order)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    refused = _produce_errors(kafka_cluster)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 20})
    for i in range(4096):
        producer.produce("kc-rolls", value=b"%06d" % i + bytes(1018))
    assert producer.flush(BOUND_S) == 0
    assert _produce_errors(kafka_cluster) == refused
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "rolls",
                         "enable.auto.commit": False,
                         "max.partition.fetch.bytes": 1000})  # one batch per fetch
    consumer.assign([TopicPartition("kc-rolls", 0, 0)])
    got: list[int] = []
    deadline = time.monotonic() + BOUND_S
    while len(got) < 4096 and time.monotonic() < deadline:
        for m in consumer.consume(500, 1):
            assert not m.error(), m.error()
            got.append(int(m.value()[:6]))
    consumer.close()
    assert got == list(range(4096))


def _two_partition_topic(cluster: KafkaCluster, topic: str, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(BOUND_S)
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(count):
        producer.produce(topic, value=f"m{i}".encode(), partition=i % 2)
    assert producer.flush(BOUND_S) == 0


def test_kafka_python_group_of_two_rebalances_and_seeks_by_time(
        kafka_cluster: KafkaCluster) -> None:
    from kafka import KafkaConsumer

    _two_partition_topic(kafka_cluster, "kp-two", 400)

    def consumer() -> KafkaConsumer:
        return KafkaConsumer("kp-two", bootstrap_servers=kafka_cluster.bootstrap,
                             group_id="kp-g", auto_offset_reset="earliest",
                             session_timeout_ms=6000, heartbeat_interval_ms=500)

    # One thread per consumer, as applications run them: kafka-python's poll() blocks
    # in a rebalance until the whole group has rejoined.
    import threading

    seen: dict[str, list[str]] = {"a": [], "b": []}
    sizes: dict[str, int] = {}
    stop = {"a": threading.Event(), "b": threading.Event()}
    consumers = {"a": consumer(), "b": consumer()}
    changed = threading.Condition()  # notified after every poll of either consumer

    def run(name: str) -> None:
        c = consumers[name]
        while not stop[name].is_set():
            records = c.poll(timeout_ms=100)
            with changed:
                for batch in records.values():
                    seen[name] += [r.value.decode() for r in batch]
                sizes[name] = len(c.assignment())
                changed.notify_all()
        if name == "b":
            c.close()  # commits, leaves: a takes both partitions

    threads = {n: threading.Thread(target=run, args=(n,), daemon=True) for n in "ab"}
    for t in threads.values():
        t.start()

    def until(done: Callable[[], bool]) -> None:
        with changed:
            assert changed.wait_for(done, BOUND_S), (sizes, len(seen["a"]), len(seen["b"]))

    until(lambda: sizes.get("a") == 1 and sizes.get("b") == 1
          and len(seen["a"]) + len(seen["b"]) >= 200)
    stop["b"].set()
    threads["b"].join(BOUND_S)
    until(lambda: sizes.get("a") == 2 and len(seen["a"]) + len(seen["b"]) >= 400)
    stop["a"].set()
    threads["a"].join(BOUND_S)
    a = consumers["a"]
    everything = seen["a"] + seen["b"]
    assert sorted(everything) == sorted(f"m{i}" for i in range(400))  # each once
    tp = next(iter(a.assignment()))
    found = a.offsets_for_times({tp: 0})[tp]  # the first batch is after time 0
    assert found is not None and found.offset == 0
    assert a.offsets_for_times({tp: int(time.time() * 1000) + 60000})[tp] is None
    a.close()


def test_aiokafka_group_of_two_rebalances_and_seeks_by_time(
        kafka_cluster: KafkaCluster) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    _two_partition_topic(kafka_cluster, "ak-two", 400)

    async def main() -> None:
        def consumer() -> AIOKafkaConsumer:
            return AIOKafkaConsumer("ak-two", bootstrap_servers=kafka_cluster.bootstrap,
                                    group_id="ak-two-g", auto_offset_reset="earliest",
                                    session_timeout_ms=6000, heartbeat_interval_ms=500)

        a, b = consumer(), consumer()
        await a.start()
        await b.start()
        seen: dict[str, list[str]] = {"a": [], "b": []}

        async def take(name: str, c: AIOKafkaConsumer) -> None:
            for records in (await c.getmany(timeout_ms=100)).values():
                seen[name] += [r.value.decode() for r in records]

        async with asyncio.timeout(BOUND_S):
            while len(seen["a"]) + len(seen["b"]) < 200 or not (
                    a.assignment() and b.assignment()):
                await asyncio.gather(take("a", a), take("b", b))
            assert len(a.assignment()) == 1 and len(b.assignment()) == 1
            await b.stop()  # commits, leaves: a takes both partitions
            while len(seen["a"]) + len(seen["b"]) < 400 or len(a.assignment()) < 2:
                await take("a", a)
        assert len(a.assignment()) == 2
        everything = seen["a"] + seen["b"]
        assert sorted(everything) == sorted(f"m{i}" for i in range(400))
        tp = TopicPartition("ak-two", 0)
        found = await a.offsets_for_times({tp: 0})
        assert found[tp] is not None and found[tp].offset == 0
        await a.stop()

    asyncio.run(main())


def test_confluent_kafka_seeks_by_time(kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "linger.ms": 0})
    base_ms = int(time.time() * 1000)
    stamps = [base_ms + 10 * i for i in range(5)]
    for i in range(5):
        producer.produce("ck-time", value=f"t{i}".encode(), timestamp=stamps[i])
        producer.flush(BOUND_S)  # one batch per message
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "ck-t"})
    found = consumer.offsets_for_times([TopicPartition("ck-time", 0, stamps[3])], BOUND_S)
    assert found[0].offset == 3  # one message per batch: the batch search is exact here
    later = consumer.offsets_for_times([TopicPartition("ck-time", 0, stamps[4] + 60000)],
                                       BOUND_S)
    assert later[0].offset == -1  # none that late: Kafka's "no such offset"
    consumer.close()


def test_metrics_and_status_show_what_the_gateway_did(kafka_cluster: KafkaCluster) -> None:
    import json
    import urllib.request

    kcat(kafka_cluster, "-P", "-t", "kc-metrics", stdin="".join(f"x{i}\n" for i in range(30)))
    kcat(kafka_cluster, "-C", "-t", "kc-metrics", "-o", "beginning", "-e")
    url = kafka_cluster.gateway.metrics_url
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values['ledgerd_kafka_requests_total{api="PRODUCE"}'] >= 1
    assert values['ledgerd_kafka_requests_total{api="FETCH"}'] >= 1
    assert values["ledgerd_kafka_records_produced_total"] >= 30
    assert values["ledgerd_kafka_partitions_written"] >= 1
    assert values["ledgerd_kafka_produce_latency_seconds_count"] >= 1
    status = json.loads(urllib.request.urlopen(url.replace("/metrics", "/status"),
                                               timeout=30).read())
    assert "kc-metrics/0" in status["partitions_written"]
