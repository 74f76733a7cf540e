"""Soak: the fault harness's rounds (tools/faults) for as long as asked.

    python bench/soak.py [--minutes 30] [--rounds N] [--kinds kill-bookie,split-minority]
                         [--seed S] [--hold 3] [--flush-ms 1000] [--json out.json] [--keep]

One cluster (a ZooKeeper and five bookie processes behind the fault proxy) runs round
after round, each with one fault kind (cycling through ``--kinds``, all by default, in
an order the seed shuffles): writers, tail readers, a recoverer, a log writer and reader
under the fault, then heal, recover and read every ledger the round created, and check
the history. It stops after ``--minutes`` or ``--rounds``, whichever comes first, and
reports per fault kind: rounds, operations, acknowledged adds, reads, recoveries,
violations (expected: 0). A failing round prints the smallest failing window of its
history and keeps it as JSON lines next to the cluster (kept with ``--keep``). Payload
sizes run from 1 B to 64 KiB, half of them ending a journal record near a 4096-byte
boundary (tools/faults/payloads.py); after each round every entry is asked of every
bookie of its write set, and one on fewer than Qa of them fails the round. ``--flush-ms``
sets the bookies' checkpoint interval: a long one leaves more to journal replay after a
kill -9. Exit status 1 if any round failed. ``--seed`` replays the same faults with the same aims.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from ledgerd.tools.faults.cluster import FaultCluster
from ledgerd.tools.faults.nemesis import KINDS
from ledgerd.tools.faults.rounds import RoundResult, run_round


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=0, help="stop after this many (0: no limit)")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--hold", type=float, default=3.0, help="seconds each fault is held")
    p.add_argument("--flush-ms", type=int, default=1000,
                   help="the bookies' flush_interval_ms (checkpoint interval)")
    p.add_argument("--json", type=Path, default=None, help="write the per-kind table here")
    p.add_argument("--keep", action="store_true", help="keep the cluster directory")
    args = p.parse_args()
    unknown = [k for k in args.kinds.split(",") if k not in KINDS]
    if unknown:
        p.error(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return args


async def soak(args: argparse.Namespace, base: Path) -> list[RoundResult]:
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"soak: seed {seed} (--seed {seed} replays), {args.minutes} min, base {base}",
          flush=True)
    rng = random.Random(seed)
    kinds = args.kinds.split(",")
    results: list[RoundResult] = []
    deadline = trio.current_time() + args.minutes * 60
    async with trio.open_nursery() as nursery:
        cluster = FaultCluster(base, nursery,
                               bookie_settings={"flush_interval_ms": args.flush_ms})
        try:
            await cluster.start()
            order: list[str] = []
            while trio.current_time() < deadline and (not args.rounds
                                                       or len(results) < args.rounds):
                if not order:
                    order = list(kinds)
                    rng.shuffle(order)
                kind = order.pop()
                n = len(results)
                result = await run_round(cluster, kind, rng.randrange(1 << 31),
                                         hold_s=args.hold,
                                         dump=base / f"history-{n}-{kind}.jsonl")
                results.append(result)
                print(f"round {n + 1}: {result.summary()}", flush=True)
                if not result.ok:
                    print(result.explain(), flush=True)
        finally:
            cluster.stop()
            nursery.cancel_scope.cancel()
    return results


def table(results: list[RoundResult]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        row = out.setdefault(r.kind, {"rounds": 0, "operations": 0, "adds_acked": 0,
                                      "reads": 0, "recoveries": 0, "violations": 0,
                                      "unreadable": 0, "copies_checked": 0, "short": 0})
        row["rounds"] += 1
        row["operations"] += r.operations
        row["adds_acked"] += r.history.count("ok", "add")
        row["reads"] += r.history.count("ok", "read")
        row["recoveries"] += r.history.count("ok", "recover")
        row["violations"] += len(r.violations)
        row["unreadable"] += len(r.unreadable)
        row["copies_checked"] += r.copies_checked
        row["short"] += len(r.short)
    return out


def main() -> None:
    args = _args()
    base = Path(tempfile.mkdtemp(prefix="ledgerd-soak-"))
    results = trio.run(soak, args, base)
    rows = table(results)
    print(f"\n{'fault kind':<24}{'rounds':>7}{'ops':>10}{'acked':>9}{'reads':>9}"
          f"{'recov':>7}{'copies':>9}{'short':>6}{'viol':>6}")
    for kind, row in sorted(rows.items()):
        print(f"{kind:<24}{row['rounds']:>7}{row['operations']:>10}{row['adds_acked']:>9}"
              f"{row['reads']:>9}{row['recoveries']:>7}{row['copies_checked']:>9}"
              f"{row['short']:>6}{row['violations']:>6}")
    total_v = sum(r["violations"] + r["unreadable"] + r["short"] for r in rows.values())
    print(f"{len(results)} rounds, {sum(r['operations'] for r in rows.values())} operations, "
          f"{len(results)} faults injected, {total_v} violations")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    failed = any(not r.ok for r in results)
    if not args.keep and not failed:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"kept {base}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    os.environ.setdefault("LEDGERD_LOG_LEVEL", "WARNING")
    main()
