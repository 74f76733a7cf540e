"""Kafka transactions through gateways killed at random: all or nothing, commits kept?

Is every transaction read all or nothing, and every acknowledged commit read?

    python bench/txn_crash.py [--rounds 6] [--seed N] [--json]

One ZooKeeper; per round a fresh chroot, three bookie processes and two ``ledgerd
gateway`` processes (ZooKeeper session 3 s). A confluent-kafka transactional producer
(librdkafka) runs transactions through both gateways on a topic of 1-3 partitions,
each of 1-20 messages, to one partition (which ends in one phase when the coordinator
leads it) or to several (two phases); one in five is aborted on purpose (so a
transaction whose end was lost would be aborted with the next, not committed with it
unseen). Meanwhile a killer, drawn from the round's seed,
kills one gateway or the other with SIGKILL at random moments and starts it again
0-5 s later (past its 3 s session the other takes its transactions and partitions),
or stops it (SIGSTOP) for 0-5 s and lets it resume with what it held.
The producer follows librdkafka's rules: a retriable commit error is retried, an
abortable one aborts the transaction, a fatal one (fenced) makes a new producer with
the same transactional id. Each transaction's outcome is recorded as its producer
learned it: *committed* (commit returned), *aborted* (abort returned) or *unknown*
(the call failed; either outcome is allowed).

After the round a read_committed consumer reads every partition up to a last committed
transaction, and each transaction is checked: a committed one is read whole, exactly
once; an aborted one not at all; an unknown one whole or not at all. A round that
finds a problem prints it with the round's seed; ``--seed`` replays a run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ledgerd.testing.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import seeded_rounds, sees_only, wait_until

ENV = {"LEDGERD_ZK_TIMEOUT_MS": "3000"}
TOPIC = "t"
BOUND_S = 60.0


def _producer(bootstrap: str, tid: str) -> Any:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "transaction.timeout.ms": 10000, "linger.ms": 2,
                  "request.timeout.ms": 4000, "socket.timeout.ms": 4000,
                  "topic.metadata.refresh.interval.ms": 1000, "log_level": 2})
    p.init_transactions(BOUND_S)
    return p


def _one_transaction(p: Any, values: list[tuple[int, bytes]], abort: bool = False) -> str:
    """Begin, produce, commit (or ``abort``): "committed", "aborted" or "unknown"
    (raises ``_Fatal`` when the producer must be replaced)."""
    from confluent_kafka import KafkaException

    p.begin_transaction()
    for partition, v in values:
        p.produce(TOPIC, value=v, partition=partition)
    if abort:
        p.flush(BOUND_S)
        return _abort(p)
    for _ in range(5):
        try:
            p.commit_transaction(BOUND_S)
            return "committed"
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable():
                continue
            if err.txn_requires_abort():
                return _abort(p)
            raise _Fatal(str(exc)) from exc
    return "unknown"


def _abort(p: Any) -> str:
    from confluent_kafka import KafkaException

    try:
        p.abort_transaction(BOUND_S)
        return "aborted"
    except KafkaException as exc:
        if exc.args[0].fatal():
            raise _Fatal(str(exc)) from exc
        return "unknown"


class _Fatal(Exception):
    """The producer is fenced or failed for good: replace it."""


def _read_all(bootstrap: str, parts: int, until: set[bytes]) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-crash-check",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(parts)])
        deadline = time.monotonic() + BOUND_S
        while not until <= set(got):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the last transaction was not read in {BOUND_S} s "
                                   f"(read {len(got)})")
            for m in c.consume(500, 0.5):
                if not m.error():
                    got.append(m.value())
    finally:
        c.close()
    return got


def one_round(zk_server: Any, base: Path, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    parts = rng.randint(1, 3)
    count = rng.randint(40, 120)  # at least; more while the killer is at work
    kills = [(rng.uniform(0.2, 4.0), rng.choice("ab"), rng.uniform(0.0, 5.0),
              rng.random() < 0.4) for _ in range(rng.randint(1, 3))]
    draw = random.Random(rng.randrange(1 << 30))
    plans: list[list[tuple[int, bytes]]] = []
    aborts: list[bool] = []

    def plan(t: int) -> list[tuple[int, bytes]]:
        n = draw.randint(1, 20)
        single = draw.random() < 0.6
        first = draw.randrange(parts)
        return [(first if single else draw.randrange(parts), b"t%d-%d" % (t, i))
                for i in range(n)]
    outcomes: dict[int, str] = {}
    problems: list[str] = []
    started = time.monotonic()
    fatal = 0
    with fresh_chroot(zk_server, f"txncrash{seed}") as zk:
        a = GatewayProcess(zk, base / f"a{seed}.log", env=ENV)
        b = GatewayProcess(zk, base / f"b{seed}.log", env=ENV)
        done = threading.Event()
        with running_cluster(base / f"r{seed}", zk, 3, a):
            try:
                b.start()
                wait_until(sees_only(a, a, b), "a sees both")
                wait_until(sees_only(b, a, b), "b sees both")
                from confluent_kafka.admin import AdminClient, NewTopic

                admin = AdminClient({"bootstrap.servers": a.bootstrap})
                admin.create_topics([NewTopic(TOPIC, num_partitions=parts)])[TOPIC].result(90)
                bootstrap = f"{a.bootstrap},{b.bootstrap}"

                def killer() -> None:
                    for delay, which, down, pause in kills:
                        if done.wait(delay):
                            return
                        gw = a if which == "a" else b
                        if pause and gw.process is not None:
                            # a zombie: its session expires while it is stopped, and it
                            # resumes with what it held
                            os.kill(gw.process.pid, signal.SIGSTOP)
                            time.sleep(down)
                            os.kill(gw.process.pid, signal.SIGCONT)
                            continue
                        gw.stop(signal.SIGKILL)
                        time.sleep(down)
                        gw.start()

                thread = threading.Thread(target=killer, daemon=True)
                thread.start()
                p = _producer(bootstrap, f"app-{seed}")
                t = 0
                while t < count or thread.is_alive():
                    plans.append(plan(t))
                    aborts.append(draw.random() < 0.2)
                    try:
                        outcomes[t] = _one_transaction(p, plans[t], aborts[t])
                    except _Fatal:
                        outcomes[t] = "unknown"
                        fatal += 1
                        p = _producer(bootstrap, f"app-{seed}")
                    t += 1
                done.set()
                thread.join(BOUND_S)
                for gw in (a, b):
                    if not gw.running:
                        gw.start()
                wait_until(sees_only(a, a, b), "a sees both again")
                last = [(q, b"end-%d" % q) for q in range(parts)]
                while _one_transaction(p, last) != "committed":
                    pass
                got = _read_all(bootstrap, parts, {v for _, v in last})
                seen = Counter(got)
                for t, sent in enumerate(plans):
                    values = [v for _, v in sent]
                    present = sum(1 for v in values if seen[v])
                    twice = [v for v in values if seen[v] > 1]
                    outcome = outcomes[t]
                    if twice:
                        problems.append(f"transaction {t} ({outcome}): {len(twice)} "
                                        f"records read twice")
                    if outcome == "committed" and present != len(values):
                        problems.append(f"transaction {t} committed, {present} of "
                                        f"{len(values)} records read")
                    elif outcome == "aborted" and present:
                        problems.append(f"transaction {t} aborted, {present} of "
                                        f"{len(values)} records read")
                    elif outcome == "unknown" and present not in (0, len(values)):
                        problems.append(f"transaction {t} (outcome unknown): {present} "
                                        f"of {len(values)} records read")
            except Exception as exc:
                problems.append(f"round aborted: {exc!r}".splitlines()[0])
            finally:
                done.set()
                if b.running:
                    b.stop(signal.SIGKILL)
    tally = Counter(outcomes.values())
    return {"seed": seed, "partitions": parts, "transactions": len(plans),
            "kills": len(kills), "committed": tally["committed"],
            "aborted": tally["aborted"], "unknown": tally["unknown"], "fatal": fatal,
            "records_committed": sum(len(plans[t]) for t, o in outcomes.items()
                                     if o == "committed"),
            "problems": problems, "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seed, rounds = seeded_rounds(
        args.rounds, args.seed, "txn-crash-", one_round,
        lambda r: f"seed {r['seed']} partitions {r['partitions']} kills {r['kills']} "
                  f"transactions {r['transactions']}: committed {r['committed']} aborted "
                  f"{r['aborted']} unknown {r['unknown']} (fenced {r['fatal']}), "
                  f"{r['records_committed']} committed records; problems "
                  f"{len(r['problems'])} ({r['seconds']} s)")
    failed = sum(bool(r["problems"]) for r in rounds)
    print(f"{failed} of {len(rounds)} rounds broke a transaction; "
          f"{sum(r['committed'] for r in rounds)} commits and "
          f"{sum(r['records_committed'] for r in rounds)} committed records in all")
    if args.json:
        print(json.dumps({"seed": seed, "rounds": rounds}))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
