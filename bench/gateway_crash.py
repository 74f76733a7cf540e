"""Gateway crashes, randomized: is anything acknowledged lost, renumbered or hidden?

    python bench/gateway_crash.py [--rounds 10] [--seed N] [--json]

One ZooKeeper; per round a fresh chroot, three bookie processes and two ``ledgerd
gateway`` processes (ZooKeeper session 3 s, explicit LAC after 5 s, so a gateway killed
right after an acknowledgement leaves its LAC short). A confluent-kafka producer
(librdkafka; idempotent, acks=all) writes to a topic of 1-8 partitions through both.
Each round draws, from the seed: which gateway is stopped (SIGSTOP) past its session
and which is then killed (SIGKILL), how many messages go in each phase, how many are
sent one at a time right before the kill, and whether the stopped gateway is resumed
before or after the killed one's session has expired. After the round every
acknowledged (partition, offset, value) is compared with what reads back up to the high
watermarks the survivor reports (``tests/kafka/crash_kit.py``); when the survivor is
resumed after the killed one's session expired, its first high watermarks (before it
writes) are checked too.

A round that finds a problem prints it with the round's seed; ``--seed`` replays a run.
Issue 47 measured 6 of 21 such rounds failing before the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledgerd.testing.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import (
    AckJournal,
    idempotent_producer,
    produce,
    read_back,
    seeded_rounds,
    sees_only,
    verify,
    wait_until,
    watermarks,
)

ENV = {"LEDGERD_EXPLICIT_LAC_INTERVAL_MS": "5000", "LEDGERD_ZK_TIMEOUT_MS": "3000"}


def one_round(zk_server: Any, base: Path, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    parts = rng.randint(1, 8)
    phases = [rng.randint(20, 300) for _ in range(3)]
    tail = rng.randint(1, 8)
    stopped_first = rng.choice("ab")
    early_resume = rng.random() < 0.3  # resume before the killed one's session expires
    started = time.monotonic()
    journal = AckJournal()
    stale: list[str] = []
    marks: dict[str, float] = {}

    def mark(name: str) -> None:
        marks[name] = round(time.monotonic() - started, 1)
    with fresh_chroot(zk_server, f"crash{seed}") as zk:
        a = GatewayProcess(zk, base / f"a{seed}.log", env=ENV)
        b = GatewayProcess(zk, base / f"b{seed}.log", env=ENV)
        with running_cluster(base / f"r{seed}", zk, 3, a):
            try:
                b.start()
                wait_until(sees_only(a, a, b), "a sees both")
                wait_until(sees_only(b, a, b), "b sees both")
                stop, other = (a, b) if stopped_first == "a" else (b, a)
                from confluent_kafka.admin import AdminClient, NewTopic

                admin = AdminClient({"bootstrap.servers": a.bootstrap})
                admin.create_topics([NewTopic("t", num_partitions=parts)])["t"].result(90)
                producer = idempotent_producer(f"{a.bootstrap},{b.bootstrap}", journal)

                def send(tag: str, n: int, single: bool = False) -> None:
                    produce(producer, journal, "t", [b"%s-%d" % (tag.encode(), i)
                                                     for i in range(n)],
                            lambda i: rng.randrange(parts), one_at_a_time=single)

                mark("up")
                send("both", phases[0])
                mark("both")
                assert stop.process is not None
                os.kill(stop.process.pid, signal.SIGSTOP)
                try:
                    wait_until(sees_only(other, other), "the stopped one's session expires")
                    mark("expired")
                    send("other", phases[1])
                    mark("other")
                    send("tail", tail, single=True)
                    mark("tail")
                    other.stop(signal.SIGKILL)
                finally:
                    os.kill(stop.process.pid, signal.SIGCONT)
                if not early_resume:
                    wait_until(sees_only(stop, stop), "the killed one's session expires")
                    mark("alone")
                    # the survivor's first answers, before it writes: no stale one
                    for p, hw in enumerate(watermarks(stop.bootstrap, "t", parts)):
                        if hw <= journal.highest(p):
                            stale.append(f"high watermark {hw} of partition {p} after the "
                                         f"takeover hides acknowledged offset "
                                         f"{journal.highest(p)}")
                send("again", phases[2])
                mark("again")
                wait_until(sees_only(stop, stop), "the killed one's session expires")
                highs = watermarks(stop.bootstrap, "t", parts)
                problems = stale + verify(journal, highs,
                                          read_back(stop.bootstrap, "t", highs))
            except Exception as exc:  # a wait or a flush that failed (the producer died)
                problems = [*stale, f"round aborted after {marks}: {exc!r}".splitlines()[0]]
                problems += [f"fatal producer error: {e}" for e in journal.fatal]
                problems += [f"delivery failed: {e}" for e in journal.errors[:3]]
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)
    return {"seed": seed, "partitions": parts, "phases": phases, "tail": tail,
            "stopped": stopped_first, "early_resume": early_resume,
            "acked": len(journal.acked), "delivery_errors": len(journal.errors),
            "first_errors": journal.errors[:3],
            "problems": problems, "seconds": round(time.monotonic() - started, 1),
            "marks": marks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seed, rounds = seeded_rounds(
        args.rounds, args.seed, "gateway-crash-", one_round,
        lambda r: f"seed {r['seed']} partitions {r['partitions']} stopped {r['stopped']} "
                  f"early_resume {r['early_resume']} acked {r['acked']} problems "
                  f"{len(r['problems'])} ({r['seconds']} s; {r['marks']})")
    failed = sum(bool(r["problems"]) for r in rounds)
    print(f"{failed} of {len(rounds)} rounds lost, renumbered or hid acknowledged "
          f"messages; {sum(r['acked'] for r in rounds)} acknowledged in all")
    if args.json:
        print(json.dumps({"seed": seed, "rounds": rounds}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
