"""``ledgerd bench writes`` / ``ledgerd bench reads`` against a running cluster.

In the spirit of BookKeeper's BenchThroughputLatency and BenchReadThroughputLatency:
``writes`` keeps ``--outstanding`` appends in flight over ``--ledgers`` ledgers from one
task (``WriteHandle.submit``) for ``--duration`` seconds, printing a live progress line,
then a table of throughput and latency percentiles. ``reads`` writes ``--entries``
entries to one ledger, closes it and reads it back ``--passes`` times.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
import trio

import ledgerd

__all__ = ["latency_summary", "percentile", "reads_cmd", "run_writes", "writes_cmd"]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def latency_summary(lat: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(1000 * percentile(lat, q / 100), 3) for q in (50, 95, 99, 99.9)} | {
        "max_ms": round(1000 * max(lat, default=0.0), 3)}


def _live(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r{text}\x1b[K")
        sys.stderr.flush()


async def run_writes(zk: str, e: int, qw: int, qa: int, size: int, ledgers: int,
                     outstanding: int, duration: float, warmup: float = 0.0) -> dict[str, Any]:
    """Keep ``outstanding`` appends in flight for ``warmup + duration`` seconds; counts
    and latencies cover appends submitted after the warm-up and durable before the end."""
    payload = os.urandom(size)
    async with ledgerd.open_client(zk, throttle=0,
                                   max_inflight_per_bookie=max(1000, 4 * outstanding)) as client:
        handles = [await client.create_ledger(e, qw, qa) for _ in range(ledgers)]
        inflight: list[ledgerd.PendingAppend] = []
        lat: list[float] = []
        start = trio.current_time() + warmup
        end = start + duration
        last_report = trio.current_time()
        count = i = 0
        while trio.current_time() < end:
            while len(inflight) < outstanding:
                inflight.append(await handles[i % ledgers].submit(payload))
                i += 1
            await inflight[0]
            keep = []
            for p in inflight:
                if not p.done:
                    keep.append(p)
                elif p.submitted_at >= start and p.completed_at < end:
                    count += 1
                    lat.append(p.completed_at - p.submitted_at)
            inflight = keep
            now = trio.current_time()
            if now - last_report >= 0.5 and now > start:
                last_report = now
                _live(f"{now - start:5.1f}s  {count:,} appends  {count / (now - start):,.0f}/s")
        for p in inflight:
            await p
        for h in handles:
            await h.close()
        changes = sum(h.ensemble_changes for h in handles)
    _live("")
    return {"kind": "writes", "ensemble": e, "write_quorum": qw, "ack_quorum": qa,
            "entry_size": size, "ledgers": ledgers, "outstanding": outstanding,
            "seconds": duration, "appends": count,
            "appends_per_s": round(count / duration, 1),
            "mb_per_s": round(count * size / duration / 1e6, 2), **latency_summary(lat),
            "ensemble_changes": changes}


async def _reads(zk: str, e: int, qw: int, qa: int, size: int, entries: int,
                 passes: int) -> dict[str, Any]:
    payload = os.urandom(size)
    async with ledgerd.open_client(zk, throttle=0) as client:
        lh = await client.create_ledger(e, qw, qa)
        await lh.append_many(payload for _ in range(entries))
        await lh.close()
        rh = await client.open_ledger(lh.ledger_id)
        lat: list[float] = []
        start = trio.current_time()
        n = 0
        for _ in range(passes):
            for first in range(0, entries, 256):
                t0 = trio.current_time()
                got = await rh.read_batch(first, min(entries - 1, first + 255))
                lat.append(trio.current_time() - t0)
                n += len(got)
                _live(f"{n:,} entries read")
        elapsed = trio.current_time() - start
        await client.delete_ledger(lh.ledger_id)
    _live("")
    return {"kind": "reads", "ensemble": e, "write_quorum": qw, "ack_quorum": qa,
            "entry_size": size, "entries_read": n, "seconds": round(elapsed, 3),
            "entries_per_s": round(n / elapsed, 1),
            "mb_per_s": round(n * size / elapsed / 1e6, 2),
            **{f"batch_{k}": v for k, v in latency_summary(lat).items()}}


def _quiet() -> None:
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("kazoo.client").setLevel(logging.CRITICAL)


def _show(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result))
        return
    width = max(map(len, result))
    for k, v in result.items():
        click.echo(f"{k:{width}}  {v:,}" if isinstance(v, int | float) else f"{k:{width}}  {v}")


_common = [
    click.option("--zk", envvar="LEDGERD_ZK_SERVERS", default="127.0.0.1:2181",
                 show_default=True),
    click.option("--ensemble", "-e", default=3, show_default=True),
    click.option("--write-quorum", "-w", default=2, show_default=True),
    click.option("--ack-quorum", "-a", default=2, show_default=True),
    click.option("--entry-size", default=1024, show_default=True),
    click.option("--json", "as_json", is_flag=True),
]


def _with_common(f: Any) -> Any:
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.command("writes")
@_with_common
@click.option("--ledgers", default=1, show_default=True)
@click.option("--outstanding", default=500, show_default=True, help="Appends in flight.")
@click.option("--duration", default=10.0, show_default=True, help="Seconds.")
def writes_cmd(zk: str, ensemble: int, write_quorum: int, ack_quorum: int, entry_size: int,
               as_json: bool, ledgers: int, outstanding: int, duration: float) -> None:
    """Write throughput and latency."""
    _quiet()
    _show(trio.run(run_writes, zk, ensemble, write_quorum, ack_quorum, entry_size, ledgers,
                   outstanding, duration), as_json)


@click.command("reads")
@_with_common
@click.option("--entries", default=20000, show_default=True)
@click.option("--passes", default=3, show_default=True)
def reads_cmd(zk: str, ensemble: int, write_quorum: int, ack_quorum: int, entry_size: int,
              as_json: bool, entries: int, passes: int) -> None:
    """Read throughput (batches of 256 entries) of a closed ledger."""
    _quiet()
    _show(trio.run(_reads, zk, ensemble, write_quorum, ack_quorum, entry_size, entries, passes),
          as_json)
