"""``ledgerd bench writes`` / ``ledgerd bench reads`` against a running cluster.

In the spirit of BookKeeper's BenchThroughputLatency and BenchReadThroughputLatency:
``writes`` keeps ``--outstanding`` appends in flight over ``--ledgers`` ledgers from one
task (``WriteHandle.submit``, or ``submit_many`` in batches of ``--batch``) for
``--duration`` seconds, printing progress (a live line
on a terminal, a line a second otherwise), then a table of throughput and latency
percentiles; Ctrl-C ends it early with the partial result, and its ledgers are deleted
unless ``--keep``. ``reads`` writes ``--entries``
entries to one ledger, closes it and reads it back ``--passes`` times.
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from functools import partial
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


class _Progress:
    """Progress on stderr: a live line on a terminal, else one plain line a second."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, now: float, text: str) -> None:
        if self.tty and now - self.last >= 0.5:
            _live(text)
            self.last = now
        elif not self.tty and now - self.last >= 1.0:
            print(text, file=sys.stderr, flush=True)
            self.last = now

    def done(self) -> None:
        _live("")


async def run_writes(zk: str, e: int, qw: int, qa: int, size: int, ledgers: int,
                     outstanding: int, duration: float, warmup: float = 0.0, *,
                     keep: bool = False, interruptible: bool = False,
                     batch: int = 1, rate: float = 0.0) -> dict[str, Any]:
    """Keep ``outstanding`` appends in flight for ``warmup + duration`` seconds; counts
    and latencies cover appends submitted after the warm-up and durable before the end.

    With ``rate`` (appends/s, one entry each), appends are submitted on that schedule
    instead, ``outstanding`` only capping how many may be in flight: the latency at a
    given load rather than at saturation (the loop never waits on an append past the
    next one's due time, so a slow append does not delay the ones after it).

    The ledgers are closed, then deleted unless ``keep``. With ``interruptible``, SIGINT
    (Ctrl-C) ends the run early: what is in flight completes, the ledgers are closed
    (and deleted), and the result covers the seconds actually run (``interrupted``)."""
    payload = os.urandom(size)
    progress = _Progress()
    interrupted = False
    async with ledgerd.open_client(zk, throttle=0,
                                   max_inflight_per_bookie=max(1000, 4 * outstanding)) as client, \
            trio.open_nursery() as nursery:
        if rate and batch > 1:
            raise ValueError("a paced run appends one entry at a time (batch=1)")
        handles = [await client.create_ledger(e, qw, qa) for _ in range(ledgers)]
        begun = trio.current_time()
        start = begun + warmup
        end = start + duration

        if interruptible:
            async def on_sigint() -> None:
                nonlocal end, interrupted
                import signal

                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        interrupted = True
                        end = min(end, trio.current_time())
                        return

            nursery.start_soon(on_sigint)
        inflight: deque[ledgerd.PendingAppend] = deque()
        lat: list[float] = []
        count = i = 0
        while trio.current_time() < end:
            while len(inflight) < outstanding:
                if rate and begun + i / rate > trio.current_time():
                    break  # the next append is not due yet
                if batch > 1:
                    inflight += await handles[i % ledgers].submit_many(
                        [payload] * min(batch, outstanding - len(inflight)))
                else:
                    inflight.append(await handles[i % ledgers].submit(payload))
                i += 1
            if rate and len(inflight) < outstanding:
                with trio.move_on_at(begun + i / rate):
                    if inflight:
                        await inflight[0]
                    else:
                        await trio.sleep_forever()
            else:
                await inflight[0]
            # One ledger's appends complete in order: take the done ones off the front
            # (scanning all ``outstanding`` after every wake-up cost the client ~5% of
            # its CPU at 800). Several ledgers complete in any order: keep what is not done.
            done: list[ledgerd.PendingAppend] = []
            if ledgers == 1:
                while inflight and inflight[0].done:
                    done.append(inflight.popleft())
            else:
                pending: deque[ledgerd.PendingAppend] = deque()
                for p in inflight:
                    (done if p.done else pending).append(p)
                inflight = pending
            for p in done:
                if p.submitted_at >= start and p.completed_at < end:
                    count += 1
                    lat.append(p.completed_at - p.submitted_at)
            now = trio.current_time()
            if now > start:
                progress.show(now, f"{now - start:5.1f}s  {count:,} appends  "
                                   f"{count / (now - start):,.0f}/s")
        for p in inflight:
            await p
        for h in handles:
            await h.close()
        changes = sum(h.ensemble_changes for h in handles)
        ran = max(1e-9, min(duration, end - start))
        if not keep:
            for h in handles:
                await client.delete_ledger(h.ledger_id)
        nursery.cancel_scope.cancel()
    progress.done()
    result = {"kind": "writes", "ensemble": e, "write_quorum": qw, "ack_quorum": qa,
              "entry_size": size, "ledgers": ledgers, "outstanding": outstanding,
              "batch": batch, **({"rate": rate} if rate else {}),
              "seconds": round(ran, 3), "appends": count,
              "appends_per_s": round(count / ran, 1),
              "mb_per_s": round(count * size / ran / 1e6, 2), **latency_summary(lat),
              "ensemble_changes": changes}
    if interrupted:
        result["interrupted"] = True
    if keep:
        result["ledger_ids"] = ",".join(str(h.ledger_id) for h in handles)
    return result


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
        shown = ("yes" if v else "no") if isinstance(v, bool) else \
            f"{v:,}" if isinstance(v, int | float) else v
        click.echo(f"{k:{width}}  {shown}")


_common = [
    click.option("--zk", default=None,
                 help="ZooKeeper (default: $LEDGERD_ZK_SERVERS, else the one running "
                      "`ledgerd local`, else 127.0.0.1:2181)."),
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
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1, 100_000),
              help="Appends per submit_many call (1: one submit per append).")
@click.option("--keep", is_flag=True, help="Keep the ledgers written (default: deleted).")
def writes_cmd(zk: str | None, ensemble: int, write_quorum: int, ack_quorum: int,
               entry_size: int, as_json: bool, ledgers: int, outstanding: int,
               duration: float, batch: int, keep: bool) -> None:
    """Write throughput and latency (progress each second; Ctrl-C ends it early and
    prints what was measured; the ledgers are deleted unless --keep)."""
    from ledgerd.tools.shell import find_cluster

    zk = str(find_cluster(zk, "bench").zk)
    _quiet()
    _show(trio.run(partial(run_writes, zk, ensemble, write_quorum, ack_quorum, entry_size,
                           ledgers, outstanding, duration, keep=keep, interruptible=True,
                           batch=batch)),
          as_json)


@click.command("reads")
@_with_common
@click.option("--entries", default=20000, show_default=True)
@click.option("--passes", default=3, show_default=True)
def reads_cmd(zk: str | None, ensemble: int, write_quorum: int, ack_quorum: int,
              entry_size: int, as_json: bool, entries: int, passes: int) -> None:
    """Read throughput (batches of 256 entries) of a closed ledger."""
    from ledgerd.tools.shell import find_cluster

    zk = str(find_cluster(zk, "bench").zk)
    _quiet()
    _show(trio.run(_reads, zk, ensemble, write_quorum, ack_quorum, entry_size, entries, passes),
          as_json)
