"""What the gateway crash tests (and ``bench/gateway_crash.py``) check from outside, with
a stock client: confluent-kafka (librdkafka), idempotent, acks=all.

An ``AckJournal`` records every acknowledgement as (partition, offset) -> value, every
delivery error and every fatal producer error. ``verify`` reads each partition from the
beginning up to the high watermark the gateway reports and returns the problems: an
acknowledged message missing, or read back at another offset than the one acknowledged
(renumbered), a value stored twice, a high watermark below an acknowledged offset
(stale: it hides acknowledged messages). Values are unique per run, so a value names
its message. ``seeded_rounds`` runs a bench's randomized rounds on one ZooKeeper."""

from __future__ import annotations

import json
import random
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.kafka.conftest import GatewayProcess

BOUND_S = 90  # every wait below is bounded; reaching it fails the caller


@dataclass
class AckJournal:
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # delivery failures
    fatal: list[str] = field(default_factory=list)  # the producer gave up for good

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.value()!r}: {err.name()} {err.str()}")
            if err.fatal():
                self.fatal.append(f"{err.name()} {err.str()}")
            return
        key = (msg.partition(), msg.offset())
        if key in self.acked:
            self.errors.append(f"offset {key} acknowledged twice: {self.acked[key]!r} "
                               f"and {msg.value()!r}")
        self.acked[key] = msg.value()

    def on_error(self, err: Any) -> None:
        if err.fatal():
            self.fatal.append(f"{err.name()} {err.str()}")

    def highest(self, partition: int) -> int:
        """The highest acknowledged offset of ``partition`` (-1: none)."""
        return max((o for p, o in self.acked if p == partition), default=-1)


def idempotent_producer(bootstrap: str, journal: AckJournal, **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                     "acks": "all", "linger.ms": 2, "retry.backoff.ms": 100,
                     "request.timeout.ms": 4000, "message.timeout.ms": BOUND_S * 1000,
                     # a stopped gateway accepts connections and answers nothing: a
                     # Metadata request to it waits socket.timeout.ms (60 s by default)
                     "socket.timeout.ms": 6000,
                     "topic.metadata.refresh.interval.ms": 1000,
                     "error_cb": journal.on_error, **extra})


def produce(producer: Any, journal: AckJournal, topic: str, values: list[bytes],
            partition_of: Callable[[int], int], *, one_at_a_time: bool = False) -> None:
    """Send ``values`` (the i-th to ``partition_of(i)``) and wait for every report."""
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=partition_of(i),
                         on_delivery=journal.on_delivery)
        if one_at_a_time:
            assert producer.flush(BOUND_S) == 0, "a message was not reported in time"
        else:
            producer.poll(0)
    assert producer.flush(BOUND_S) == 0, "a message was not reported in time"


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Each partition's high watermark, asked as a consumer reconnecting first does."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "crash-hw",
                  "enable.auto.commit": False})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), BOUND_S)[1]
                for p in range(partitions)]
    finally:
        c.close()


def read_back(bootstrap: str, topic: str, highs: list[int]) -> list[tuple[int, int, bytes]]:
    """Every record of each partition below its high watermark, from the beginning."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "crash-read",
                  "enable.auto.commit": False})
    got: list[tuple[int, int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                  for p, hw in enumerate(highs) if hw > 0])
        nxt = [0] * len(highs)
        deadline = time.monotonic() + BOUND_S
        while any(n < hw for n, hw in zip(nxt, highs, strict=True)):
            assert time.monotonic() < deadline, f"read {nxt} of {highs} in {BOUND_S} s"
            for m in c.consume(1000, 0.5):
                assert not m.error(), m.error()
                got.append((m.partition(), m.offset(), m.value()))
                nxt[m.partition()] = max(nxt[m.partition()], m.offset() + 1)
    finally:
        c.close()
    return got


def verify(journal: AckJournal, highs: list[int],
           records: list[tuple[int, int, bytes]]) -> list[str]:
    """The problems found (empty: nothing acknowledged lost, renumbered or hidden)."""
    problems = [f"fatal producer error: {e}" for e in journal.fatal]
    stored: dict[tuple[int, int], bytes] = {}
    where: dict[bytes, list[tuple[int, int]]] = {}
    for p, o, v in records:
        if stored.setdefault((p, o), v) != v:
            problems.append(f"offset {(p, o)} read as two values")
        where.setdefault(v, []).append((p, o))
    problems += [f"{v!r} stored {len(at)} times, at {sorted(set(at))}"
                 for v, at in where.items() if len(set(at)) > 1]
    for (p, o), v in sorted(journal.acked.items()):
        if o >= highs[p]:
            problems.append(f"high watermark {highs[p]} of partition {p} hides acknowledged "
                            f"offset {o} ({v!r})")
        elif stored.get((p, o)) != v:
            now = where.get(v)
            problems.append(f"{v!r} acknowledged at {(p, o)}, "
                            + (f"read back at {now}" if now else "lost"))
    return problems


def status(gateway: GatewayProcess) -> dict[str, Any]:
    url = gateway.metrics_url.replace("/metrics", "/status")
    with urllib.request.urlopen(url, timeout=10) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, bound: float = BOUND_S) -> T:
    """Poll ``condition`` (a cheap look at a process's state) until it holds; returns
    what it gave then."""
    deadline = time.monotonic() + bound
    while not (got := condition()):
        assert time.monotonic() < deadline, f"not within {bound} s: {what}"
        time.sleep(0.05)
    return got


def sees_only(gateway: GatewayProcess, *live: GatewayProcess) -> Callable[[], bool]:
    """A condition: ``gateway`` sees exactly ``live`` registered (by port)."""
    ports = sorted(g.port for g in live)

    def check() -> bool:
        try:
            seen = status(gateway)["gateways"].values()
        except OSError:
            return False
        return sorted(int(a.rsplit(":", 1)[1]) for a in seen) == ports
    return check


def seeded_rounds(count: int, seed: int | None, prefix: str,
                  one_round: Callable[[Any, Path, int], dict[str, Any]],
                  describe: Callable[[dict[str, Any]], str],
                  ) -> tuple[int, list[dict[str, Any]]]:
    """``count`` rounds of ``one_round(zookeeper server, directory, round seed)`` on one
    ZooKeeper, the round seeds drawn from ``seed`` (random if None); each round printed
    as ``describe`` says, with its first problems. Returns (seed, rounds)."""
    from ledgerd.testing.cluster import ProcessCluster

    seed = seed if seed is not None else random.randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        zk = ProcessCluster(Path(tmp) / "zk", bookies=0)
        try:
            zk.start_zookeeper()
            assert zk.server is not None
            for i in range(count):
                r = one_round(zk.server, Path(tmp), rng.randrange(1 << 30))
                rounds.append(r)
                print(f"round {i + 1}: {describe(r)}", flush=True)
                for p in r["problems"][:10]:
                    print(f"    {p}", flush=True)
        finally:
            zk.stop()
    return seed, rounds
