"""Where a Kafka transaction's time goes: each request timed inside the gateway.

    python bench/txn_phases.py [--transactions 200] [--records 100] [--rounds 3]

One ZooKeeper, three bookie processes and one ``ledgerd gateway`` process (E3/Qw2/Qa2, as
``bench/gateway.py``), but the gateway runs with timing wrappers (``--serve``, below):
every request it answers (by Kafka API), each partition group append (data, and the
transaction markers), and each ZooKeeper get / set / create. A confluent-kafka producer
(acks=all, idempotent, linger.ms 5, a ``transactional.id``) runs ``--transactions``
transactions of ``--records`` 1 KiB records (begin, produce, commit) per round; the
client times its produce loop and its ``commit_transaction`` (which flushes first).

Printed per round: transactions/s and records/s, the client's commit p50, and per
timed step its count per transaction, p50 and total milliseconds per transaction. A
transaction is serial for the client (AddPartitionsToTxn, then the produce, then
EndTxn), so the per-transaction totals of those three requests, beside the commit p50,
show what the gateway's time is and what is left for the client and the network.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
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

PAYLOAD = os.urandom(1024)


def _serve(out: str, argv: list[str]) -> None:
    """Run ``ledgerd gateway`` with the timing wrappers; write the samples to ``out``
    (JSON: step -> [seconds, ...]) on SIGUSR1 and at exit."""
    from ledgerd.kafka import gateway, partitions
    from ledgerd.metadata import zookeeper
    from ledgerd.tools.cli import main

    samples: dict[str, list[float]] = collections.defaultdict(list)

    def timed(name: Any, fn: Any) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                samples[name(args) if callable(name) else name].append(
                    time.perf_counter() - start)
        return wrapper

    finish = gateway.Gateway._finish
    gateway.Gateway._finish = timed(lambda a: a[2].name, finish)  # type: ignore[method-assign]
    append = partitions.PartitionLog._append
    partitions.PartitionLog._append = timed(  # type: ignore[method-assign]
        lambda a: "group append (markers)" if any(i.marker for i in a[1])
        else "group append", append)
    for op in ("get", "set", "create"):
        setattr(zookeeper.ZooKeeperStore, op,
                timed(f"zookeeper {op}", getattr(zookeeper.ZooKeeperStore, op)))

    def dump(*_: object) -> None:
        Path(out).write_text(json.dumps(samples))
    atexit.register(dump)
    signal.signal(signal.SIGUSR1, dump)
    sys.argv = ["ledgerd", *argv]
    main()


def _round(bootstrap: str, topic: str, transactions: int, records: int) -> dict[str, float]:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "transactional.id": f"phases-{topic}"})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce(topic, PAYLOAD)
    p.commit_transaction(60)
    commits: list[float] = []
    start = time.perf_counter()
    for _ in range(transactions):
        p.begin_transaction()
        for _ in range(records):
            p.produce(topic, PAYLOAD)
        at = time.perf_counter()
        p.commit_transaction(60)
        commits.append(time.perf_counter() - at)
    elapsed = time.perf_counter() - start
    return {"txn_per_s": transactions / elapsed, "records_per_s": transactions * records / elapsed,
            "ms_per_txn": elapsed / transactions * 1000,
            "commit_p50_ms": statistics.median(commits) * 1000}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import trio

    from ledgerd.tools.processcluster import ProcessCluster
    from ledgerd.tools.zkserver import find_free_port

    base = Path(tempfile.mkdtemp(prefix="ledgerd-txn-phases-", dir=os.environ.get("BENCH_DIR")))
    samples_path = base / "samples.json"
    cluster = ProcessCluster(base, bookies=3, settings={"log_level": "WARNING"})
    port = find_free_port()
    gw: subprocess.Popen[bytes] | None = None
    results: list[dict[str, Any]] = []
    load = [os.getloadavg()[0]]
    try:
        trio.run(cluster.start)
        log = open(base / "gateway.log", "wb")
        gw = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(samples_path), "gateway", "--port",
             str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "LEDGERD_ZK_SERVERS": cluster.zk, "LEDGERD_THROTTLE": "0"})
        while b"kafka gateway on" not in (base / "gateway.log").read_bytes():
            if gw.poll() is not None:
                raise RuntimeError((base / "gateway.log").read_text())
            time.sleep(0.1)
        seen: dict[str, int] = {}
        for n in range(args.rounds):
            round_load = os.getloadavg()[0]
            got = _round(f"127.0.0.1:{port}", f"phases{n}", args.transactions, args.records)
            samples_path.unlink(missing_ok=True)
            gw.send_signal(signal.SIGUSR1)
            while not samples_path.exists():
                time.sleep(0.05)
            time.sleep(0.2)
            every = json.loads(samples_path.read_text())
            steps: dict[str, dict[str, float]] = {}
            for step, values in sorted(every.items()):
                new = values[seen.get(step, 0):]  # this round's
                seen[step] = len(values)
                if new:
                    steps[step] = {"per_txn": len(new) / args.transactions,
                                   "p50_ms": statistics.median(new) * 1000,
                                   "ms_per_txn": sum(new) * 1000 / args.transactions}
            results.append({"load": round_load, **got, "steps": steps})
            if not args.json:
                print(f"round {n + 1} (load {round_load:.2f}): {got['txn_per_s']:.0f} txn/s, "
                      f"{got['records_per_s']:,.0f} records/s, {got['ms_per_txn']:.2f} ms a "
                      f"transaction, commit p50 {got['commit_p50_ms']:.2f} ms", flush=True)
                for step, s in steps.items():
                    print(f"  {step:26s} {s['per_txn']:5.2f}/txn  p50 {s['p50_ms']:7.3f} ms  "
                          f"{s['ms_per_txn']:7.3f} ms/txn", flush=True)
    finally:
        if gw is not None and gw.poll() is None:
            gw.send_signal(signal.SIGTERM)
            gw.wait(30)
        cluster.stop(graceful=False)
    load.append(os.getloadavg()[0])
    if args.json:
        print(json.dumps({"rounds": results, "load": load}))
    else:
        print(f"load average (1 min): {load[0]:.2f} at start, {load[1]:.2f} at end")


if __name__ == "__main__":
    main()
