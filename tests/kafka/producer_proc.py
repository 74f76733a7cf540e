"""A kafka-python producer (idempotence on, acks=all) run as a process by the gateway
crash test: sends ``n0`` ... ``n{N-1}`` to a topic, a few milliseconds apart, and prints
``acked <i>`` for each acknowledged message as it is acknowledged, then ``done``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

from kafka import KafkaProducer


def main() -> None:
    bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2,
                             enable_idempotence=True, retry_backoff_ms=100,
                             reconnect_backoff_ms=100, request_timeout_ms=10000,
                             delivery_timeout_ms=90000)

    def acked(i: int) -> object:
        return lambda _meta: print(f"acked {i}", flush=True)

    for i in range(count):
        producer.send(topic, f"n{i}".encode()).add_callback(acked(i))
        time.sleep(0.004)
    producer.flush(120)
    producer.close(30)
    print("done", flush=True)


def produce_through_faults(bootstrap: str, topic: str, count: int,
                           on_acked: Callable[[int], None]) -> set[int]:
    """Run this producer as a process; ``on_acked(n)`` after each acknowledgement (the
    test injects its faults there); returns the acknowledged message numbers."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.kafka.producer_proc", bootstrap,
                             topic, str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    acked: set[int] = set()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith(b"acked "):
                acked.add(int(line.split()[1]))
                on_acked(len(acked))
            if line.startswith(b"done"):
                break
        assert proc.wait(150) == 0, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return acked


def read_exactly_once(bootstrap: str, topic: str, partitions: int, acked: set[int],
                      ) -> list[int]:
    """Every message of the topic from the beginning; fails on a duplicate or on an
    acknowledged message that is missing. Returns them in the order read."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    parts = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    got = [int(m.value[1:]) for m in consumer]
    consumer.close()
    dups = [v for v, n in Counter(got).items() if n > 1]
    assert not dups, f"duplicated: {dups[:20]}"
    assert acked <= set(got), f"acknowledged but lost: {sorted(acked - set(got))[:20]}"
    return got


if __name__ == "__main__":
    main()
