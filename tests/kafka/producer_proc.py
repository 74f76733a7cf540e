"""A kafka-python producer (idempotence on, acks=all) run as a process by the gateway
crash test: sends ``n0`` ... ``n{N-1}`` to a topic, a few milliseconds apart, and prints
``acked <i>`` for each acknowledged message as it is acknowledged, then ``done``."""

from __future__ import annotations

import sys
import time

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


if __name__ == "__main__":
    main()
