"""One seeded run: a writer, recoverers, a tailing reader, crashes, then healing.

``run_seed(seed, mutations)`` builds the world from the seed, runs the fault phase
(lossy, duplicating, reordering network; bookie crashes with or without losing unsynced
data; a writer that may die; recoverers that may race or die), heals everything at
``HEAL_AT``, starts a last recoverer and a last reader, and runs to ``END_AT``.

The invariants are checked after every event (``Checker.check``) and at points where a
fact is learned (an ack, a LAC seen, an entry read, a reader done); the facts go to the
one checker the fault harness also feeds (``ledgerd.testing.history``):

1. no acknowledged entry lost or changed: acknowledged entries are a prefix, each read
   returns the bytes written, and once CLOSED every entry up to the end is durable on
   at least Qa bookies of its write set;
2. all readers agree on a closed ledger's entries and end;
3. no acknowledged entry beyond the closed end, and no LAC seen beyond it;
4. a fenced bookie accepts no plain add;
5. the LAC is monotone and never ahead of the acknowledged prefix;
6. metadata versions increase by one and CLOSED is final (checked by the store);
7. bounded liveness: after healing, the ledger is CLOSED and the last reader has read
   it by ``END_AT``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerState
from ledgerd.testing.history import LedgerFacts
from ledgerd.testing.history import Violation as HistoryViolation
from tests.sim.actors import (
    SimBookie,
    SimMetadata,
    SimReader,
    SimRecoverer,
    SimWriter,
    initial_metadata,
    payload_for,
)
from tests.sim.world import Mutations, Violation, World

__all__ = ["HEAL_AT", "RunResult", "run_seed"]

HEAL_AT = 12.0
END_AT = 60.0
CONFIGS = [(3, 2, 2), (3, 3, 2), (3, 2, 1), (4, 3, 2), (2, 2, 2), (5, 3, 3), (3, 3, 3),
           (4, 2, 2)]


@dataclass
class RunResult:
    seed: int
    events: int
    config: tuple[int, int, int]
    closed_at: int
    acked: int
    violation: str | None
    trace: list[str]


class Checker:
    """The simulator's observer: each fact an actor learns goes to the one invariant
    checker (``ledgerd.testing.history.LedgerFacts``); what only a modelled bookie can
    show (its fence, its durable copies) is checked here after every event."""

    def __init__(self, world: World, meta: SimMetadata, bookies: dict[str, SimBookie]) -> None:
        self.world = world
        self.meta = meta
        self.bookies = bookies
        self.facts = LedgerFacts()
        self._checked_closed: tuple[int, int] | None = None

    @property
    def acked_upto(self) -> int:
        return self.facts.acked_upto

    def _judge(self, violations: list[HistoryViolation]) -> None:
        for v in violations:
            self.world.fail(v.message)

    # facts as they are learned

    def on_acked(self, ids: tuple[int, ...], lac: int) -> None:
        for eid in ids:
            self._judge(self.facts.acked_add(eid, payload_for(eid), who="writer",
                                             in_order=True))
        self._judge(self.facts.saw_lac(lac, who="writer"))

    def on_lac_seen(self, lac: int, who: str) -> None:
        self._judge(self.facts.saw_lac(lac, who=who))

    def on_entry_read(self, eid: int, payload: bytes, who: str) -> None:
        self._judge(self.facts.read(eid, payload, who=who, written=payload_for(eid)))

    def on_reader_done(self, name: str, result: tuple[int, list[bytes]]) -> None:
        last, entries = result
        self._judge(self.facts.ended(last, who=name))
        for eid, payload in enumerate(entries):
            self._judge(self.facts.read(eid, payload, who=name, written=payload_for(eid)))

    # after every event

    def check(self) -> None:
        for b in self.bookies.values():
            if b.fenced_add_accepted:
                self.world.fail(f"fenced bookie {b.name} accepted a plain add")
        md = self.meta.md
        if md.state is not LedgerState.CLOSED:
            return
        last = md.last_entry_id
        self._judge(self.facts.ended(last, who="the metadata"))
        stamp = (self.meta.version, sum(b.durable_changes for b in self.bookies.values()))
        if stamp == self._checked_closed:
            return
        self._checked_closed = stamp
        for eid in range(last + 1):
            ensemble = md.ensemble_for(eid)
            holders = [ensemble[i] for i in write_set(eid, md.ensemble_size, md.write_quorum)
                       if self.bookies[ensemble[i]].ledger.durable.get(eid) is not None]
            if len(holders) < md.ack_quorum:
                self.world.fail(f"closed at {last}: entry {eid} durable on {holders} only, "
                                f"fewer than Qa={md.ack_quorum} of its write set")


def run_seed(seed: int, mutations: Mutations | None = None) -> RunResult:
    world = World(seed, mutations)
    r = world.rng
    e, qw, qa = r.choice(CONFIGS)
    names = [f"b{i}" for i in range(e + r.choice([1, 2, 3]))]
    bookies = {n: SimBookie(world, n) for n in names}
    meta = SimMetadata(world, initial_metadata(world, names, e, qw, qa))
    checker = Checker(world, meta, bookies)
    world.checks.append(checker.check)
    writer = SimWriter(world, meta, bookies, r.randint(10, 60), checker)
    writer.start()
    write_span = writer.total * 0.02
    death = r.random()
    if death < 0.5:
        world.at(r.uniform(0.0, write_span * 1.5), writer.die, "kill writer")
    elif death < 0.8:
        writer.die_after_change = True
    recoverers = [SimRecoverer(world, meta, bookies, f"r{i}", checker)
                  for i in range(r.choice([0, 1, 2, 2]))]
    for rec in recoverers:
        world.at(r.uniform(0.0, write_span * 2), rec.start, f"{rec.name} start")
        if r.random() < 0.3:
            world.at(r.uniform(0.0, write_span * 3), rec.die, f"kill {rec.name}")
    tail = SimReader(world, meta, bookies, "tail", checker, tail=True)
    tail.start()
    for _ in range(r.choice([0, 1, 1, 2, 2, 3])):
        victim = bookies[r.choice(names)]
        lose = r.random() < 0.5
        at = r.uniform(0.0, write_span * 1.2)
        world.at(at, lambda v=victim, lose=lose: v.crash(lose),
                 f"crash {victim.name} lose_unsynced={lose}")
        world.at(at + r.uniform(0.1, 3.0), victim.restart, f"restart {victim.name}")
    violation = None
    try:
        world.run(HEAL_AT)
        world.faulty = False
        for b in bookies.values():
            b.restart()
        final = SimRecoverer(world, meta, bookies, "final", checker)
        world.at(0.5, final.start, "final recoverer start")
        reader = SimReader(world, meta, bookies, "reader", checker, tail=False)
        reader.start()
        world.run(END_AT)
        if meta.md.state is not LedgerState.CLOSED:
            world.fail(f"not CLOSED {END_AT - HEAL_AT:.0f}s after healing "
                       f"(state {meta.md.state.value})")
        if reader.result is None:
            world.fail("the last reader did not finish reading the closed ledger")
    except Violation as exc:
        violation = str(exc)
    return RunResult(seed, world.events, (e, qw, qa), meta.md.last_entry_id,
                     checker.acked_upto + 1, violation, list(world.trace))
