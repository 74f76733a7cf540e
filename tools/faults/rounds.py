"""Fault rounds: a workload under one injected fault, then heal, recover, read, check.

A round: writers, tail readers, two recoverers and a log writer and reader run for
``warmup_s``; one fault (``nemesis.KINDS``) is injected and held for ``hold_s``; it is
undone and the workload goes on for ``settle_s``; the workload stops (adds still in
flight end as they end); the cluster is healed (links, processes, storage); then a
fresh client opens every ledger the round created with recovery and reads it whole,
recording the final end and every entry; the checker judges the round's history.
Reads that succeed from any one replica would hide a bookie that lost entries it
acknowledged (issue 45's journal padding did exactly that), so every entry of every
recovered ledger is also asked of each bookie of its write set: fewer than Qa copies of
an entry is a failed round (``short``).

Seeded: ``RoundPlan(seed)`` decides every fault's kind order and aim and the workload's
choices, so a failing seed replays the same faults (process timing still varies).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ledgerd.client import Client
from ledgerd.errors import NoSuchLedgerError
from ledgerd.machines.checker import fragments
from ledgerd.machines.quorum import write_set
from ledgerd.tools.faults import nemesis
from ledgerd.tools.faults.cluster import FaultCluster
from ledgerd.tools.faults.history import History, Violation, check, report
from ledgerd.tools.faults.workload import PASSWORD, Workload
from ledgerd.wire.messages import ReadRequest
from ledgerd.wire.status import Status

__all__ = ["RoundResult", "run_round"]


@dataclass
class RoundResult:
    kind: str
    seed: int
    history: History
    violations: list[Violation]
    unreadable: list[str] = field(default_factory=list)
    short: list[str] = field(default_factory=list)  # entries on fewer than Qa bookies
    ledgers: int = 0
    copies_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unreadable and not self.short

    @property
    def operations(self) -> int:
        return sum(1 for e in self.history.events if e.kind in ("ok", "fail"))

    def summary(self) -> str:
        h = self.history
        return (f"{self.kind}: seed {self.seed}, {self.ledgers} ledgers, "
                f"{h.count('ok', 'add')} adds acked / {h.count('fail', 'add')} failed, "
                f"{h.count('ok', 'read')} reads, {h.count('ok', 'recover')} recoveries, "
                f"{len(self.violations)} violations"
                + (f", unreadable: {self.unreadable}" if self.unreadable else "")
                + (f", short of Qa: {self.short[:5]}" if self.short else ""))

    def explain(self) -> str:
        text = report(self.history, self.violations)
        if self.unreadable:
            text += "\nunreadable at the end: " + "; ".join(self.unreadable)
        if self.short:
            text += "\nentries on fewer than Qa bookies: " + "; ".join(self.short)
        return text


async def run_round(cluster: FaultCluster, kind: str, seed: int, *, warmup_s: float = 1.5,
                    hold_s: float = 3.0, settle_s: float = 1.5, dump: Path | None = None
                    ) -> RoundResult:
    rng = random.Random(seed)
    history = History()
    t0 = trio.current_time()

    def now() -> float:
        return trio.current_time() - t0

    work = Workload(history, now, random.Random(rng.random()), log_name=f"faults-{seed}")
    async with cluster.client("writer") as writer, cluster.client("reader") as reader:
        async with trio.open_nursery() as nursery:
            writers = await nursery.start(_writers, work, writer)
            nursery.start_soon(work.tail_reader, "r0", reader)
            nursery.start_soon(work.tail_reader, "r1", reader)
            nursery.start_soon(work.recoverer, "rec", reader)
            nursery.start_soon(work.recoverer, "rec2", writer)   # recoverers race
            nursery.start_soon(work.log_writer, "lw", writer)
            nursery.start_soon(work.log_reader, "lr", reader)
            await trio.sleep(warmup_s)
            await nemesis.inject(kind, cluster, rng, history, now, hold_s)
            await trio.sleep(settle_s)
            work.stop.set()
            # Adds in flight end by themselves (timeouts bound them): the writers return
            # once theirs have; then the rest stop.
            with trio.move_on_after(30):
                await writers.wait()
            nursery.cancel_scope.cancel()
    await cluster.heal()
    result = RoundResult(kind, seed, history, [])
    async with cluster.client("checker") as checker:
        try:
            for lid in await checker.logs.ledgers(work.log_name):
                work.ledgers.add(lid)
        except Exception as exc:
            result.unreadable.append(f"log {work.log_name}: {exc!r}")
        for lid in sorted(work.ledgers):
            problem = await _final_read(checker, lid, history, now, cluster.wait_writable)
            if problem:
                result.unreadable.append(problem)
            else:
                result.copies_checked += await _check_copies(checker, lid, result.short)
    result.ledgers = len(work.ledgers)
    result.violations = check(history)
    if dump is not None and not result.ok:
        history.dump(dump)
    return result


async def _writers(work: Workload, client: Client, *,
                   task_status: trio.TaskStatus[trio.Event] = trio.TASK_STATUS_IGNORED) -> None:
    """Three writers; the event is set once all of them have returned."""
    done = trio.Event()
    task_status.started(done)
    try:
        async with trio.open_nursery() as nursery:
            for w in range(3):
                nursery.start_soon(work.writer, f"w{w}", client)
    finally:
        done.set()


async def _final_read(client: Client, lid: int, history: History, clock: Callable[[], float],
                      ready: Callable[[], Awaitable[None]]) -> str | None:
    """Recover and read ``lid`` whole into the history; a problem as text, or None.
    After a failure, retried once ``ready`` says every bookie is writable again."""
    last_error: Exception | None = None
    for _ in range(3):
        try:
            rh = await client.open_ledger(lid, PASSWORD, recovery=True)
            entries = []
            if rh.last_add_confirmed >= 0:
                entries = [e async for e in rh.read(0, rh.last_add_confirmed)]
        except NoSuchLedgerError:
            acked = [e for e in history.events if e.ledger == lid and e.op == "add"
                     and e.kind == "ok"]
            return f"L{lid} deleted with {len(acked)} acked adds" if acked else None
        except Exception as exc:
            last_error = exc
            await ready()
            continue
        history.record(clock(), "final", "ok", "final", ledger=lid,
                       entry=rh.last_add_confirmed)
        for e in entries:
            history.record(clock(), "final", "ok", "final", ledger=lid,
                           entry=e.entry_id, value=bytes(e.payload))
        return None
    return f"L{lid}: {last_error!r}"


async def _check_copies(client: Client, lid: int, short: list[str]) -> int:
    """Ask every bookie of each entry's write set for it (a recovered, closed ledger):
    an entry with fewer than Qa copies goes to ``short``. Returns the reads made."""
    try:
        rh = await client.open_ledger(lid, PASSWORD, recovery=False)
    except NoSuchLedgerError:
        return 0
    md = rh.metadata
    limit = trio.Semaphore(64)
    copies: dict[int, int] = {}
    reads = 0

    async def one(bookie: str, entry: int) -> None:
        async with limit:
            for _ in range(3):  # no answer (-1) is asked again; NO_SUCH_ENTRY is final
                status, _, _ = await client.pool.call(
                    bookie, ReadRequest(ledger_id=lid, entry_id=entry), 10.0)
                if status != -1:
                    break
        if status == Status.OK:
            copies[entry] += 1

    async with trio.open_nursery() as nursery:
        for frag in fragments(md, rh.last_add_confirmed):
            for entry in range(frag.first, frag.last + 1):
                copies.setdefault(entry, 0)
                for i in write_set(entry, md.ensemble_size, md.write_quorum):
                    reads += 1
                    nursery.start_soon(one, frag.ensemble[i], entry)
    for entry, n in sorted(copies.items()):
        if n < md.ack_quorum:
            short.append(f"L{lid} entry {entry} on {n} of {md.write_quorum} bookies "
                         f"(Qa {md.ack_quorum})")
    return reads
