"""One checker of the protocol invariants, fed by the simulator and the fault harness.

The invariants (BookKeeper's, as the TLA+ specifications state them) are facts about one
ledger that every observer must agree with, however it learned them:

- ``ack-changed`` / ``acked-lost``: an acknowledged entry keeps its bytes for good: no
  second value is acknowledged at its id, the ledger's end never leaves it out, and the
  final read returns it;
- ``ack-order``: on a bounded ledger the acknowledged ids are a prefix (0, 1, 2, ...);
- ``read-differs``: every entry a reader saw is that entry with those bytes (the value
  written, the value acknowledged, the value other readers saw, the value at the end);
- ``dirty-lac`` / ``lac-beyond-end``: no reader (nor the writer) sees a LAC beyond what
  is committed (acknowledged, or ended by a recovery), nor beyond the ledger's end;
- ``end-differs``: every recovery, every close, every reader and the final read agree
  on the end;
- ``fenced-ack``: an add started after a recovery of its ledger had finished (the
  ledger fenced) is never acknowledged.

``LedgerFacts`` checks each fact as it is learned and returns the violations it makes
(pure: no I/O, no clock). The simulator feeds it live, from its modelled actors
(tests/sim); the fault harness records a ``History`` of real operations (``invoke``,
``ok``, ``fail``; the nemesis's ``info``; the harness's ``final`` reads after healing)
and ``check`` feeds that history to it, the final reads first, as the truth the rest is
held to. A violation names the events that contradict each other; its window is the
span of the history between the first and the last of them, and ``report`` shows the
smallest one. Invariants about what a modelled bookie holds inside (durable copies on
Qa bookies, log divergence, a fenced bookie taking an add) are the simulator's own: the
harness checks the copies on real bookies by asking each of them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Event", "History", "LedgerFacts", "Violation", "check", "report"]


@dataclass(frozen=True, slots=True)
class Event:
    index: int
    time: float
    process: str
    kind: str            # invoke | ok | fail | info
    op: str              # create add read lac recover close final fault heal
    ledger: int | None = None
    entry: int | None = None
    value: bytes | None = None
    detail: str = ""

    def line(self) -> str:
        parts = [f"{self.index:6d} {self.time:9.3f} {self.process:<10} {self.kind:<6} {self.op}"]
        if self.ledger is not None:
            parts.append(f"L{self.ledger}")
        if self.entry is not None:
            parts.append(f"e{self.entry}")
        if self.value is not None:
            parts.append(repr(self.value[:40]))
        if self.detail:
            parts.append(self.detail)
        return " ".join(parts)


@dataclass
class History:
    events: list[Event] = field(default_factory=list)

    def record(self, time: float, process: str, kind: str, op: str, *, ledger: int | None = None,
               entry: int | None = None, value: bytes | None = None, detail: str = "") -> Event:
        event = Event(len(self.events), time, process, kind, op, ledger, entry, value, detail)
        self.events.append(event)
        return event

    def count(self, kind: str, op: str) -> int:
        return sum(1 for e in self.events if e.kind == kind and e.op == op)

    def dump(self, path: Path) -> None:
        with open(path, "w") as out:
            for e in self.events:
                raw = asdict(e)
                raw["value"] = e.value.hex() if e.value is not None else None
                out.write(json.dumps(raw) + "\n")


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    ledger: int
    message: str
    events: tuple[int, ...]

    @property
    def window(self) -> tuple[int, int]:
        return min(self.events), max(self.events)

    @property
    def span(self) -> int:
        lo, hi = self.window
        return hi - lo


Ref = tuple[int, ...]


@dataclass
class LedgerFacts:
    """What is known about one ledger, each fact checked against the others as it comes.

    Every method returns the violations the new fact makes (empty: it agrees) and then
    records it. ``ref`` is the fact's event index in a ``History`` (the simulator, which
    has none, leaves it -1); a violation's ``events`` are the refs that contradict.
    """

    ledger: int = 0
    acked: dict[int, tuple[bytes | None, int]] = field(default_factory=dict)
    acked_upto: int = -1                      # the highest acknowledged id
    committed: int = -1                       # highest id acknowledged or recovered
    seen: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    final: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    end: tuple[int, int] | None = None        # (last entry id, ref)
    lac_seen: tuple[int, int] = (-1, -1)      # the highest LAC seen, and where
    fenced_at: int | None = None              # ref of the first finished recovery
    has_final: bool = False                   # the final read is known: the truth

    def _v(self, kind: str, message: str, *refs: int) -> list[Violation]:
        return [Violation(kind, self.ledger, message, tuple(refs))]

    def acked_add(self, entry: int, value: bytes | None, *, who: str, ref: int = -1,
                  in_order: bool = False, invoked: int | None = None) -> list[Violation]:
        """``who`` had the add of ``entry`` (``value``) acknowledged; ``in_order``: ids
        must be acknowledged as a prefix; ``invoked``: the ref of the add's start."""
        out: list[Violation] = []
        if in_order and entry != self.acked_upto + 1:
            out += self._v("ack-order", f"entry {entry} acknowledged before entry "
                           f"{self.acked_upto + 1}", ref)
        old = self.acked.get(entry)
        if old is not None and old[0] != value:
            out += self._v("ack-changed", f"{who}: id {entry} acknowledged as {value!r}, "
                           f"earlier as {old[0]!r}", old[1], ref)
        if self.end is not None:
            last, decided = self.end
            got = self.final.get(entry)
            if entry > last or (self.has_final and (got is None or got[0] != value)):
                out += self._v("acked-lost", f"add of e{entry} was acknowledged ({value!r}); "
                               f"at the end: {got[0] if got else 'absent'!r}"
                               if self.has_final else f"entry {entry} was acknowledged but "
                               f"the ledger closed at {last}", ref,
                               got[1] if got is not None else decided)
        if self.fenced_at is not None and invoked is not None and invoked > self.fenced_at:
            out += self._v("fenced-ack", f"add of e{entry} started after a recovery of "
                           f"L{self.ledger} had finished and was acknowledged",
                           self.fenced_at, invoked, ref)
        self.acked[entry] = (value, ref)
        self.acked_upto = max(self.acked_upto, entry)
        self.committed = max(self.committed, entry)
        return out

    def committed_upto(self, last: int) -> None:
        """A recovery ended a term at ``last``: ids up to it are committed."""
        self.committed = max(self.committed, last)

    def saw_lac(self, lac: int, *, who: str, ref: int = -1) -> list[Violation]:
        """``who`` (a reader, or the writer itself) saw ``lac`` as the LAC."""
        out: list[Violation] = []
        if not self.has_final and lac > self.committed:
            out += self._v("dirty-lac", f"{who} saw LAC {lac}; only ids up to "
                           f"{self.committed} are committed (a dirty read)", ref)
        if self.end is not None and lac > self.end[0]:
            out += self._v("lac-beyond-end", f"{who} saw LAC e{lac} beyond the final end "
                           f"e{self.end[0]}", ref, self.end[1])
        if lac > self.lac_seen[0]:
            self.lac_seen = (lac, ref)
        return out

    def read(self, entry: int, value: bytes, *, who: str, ref: int = -1,
             written: bytes | None = None) -> list[Violation]:
        """``who`` read ``entry`` as ``value``; ``written``: the only value ever written
        there, when one writer owns the id (a bounded ledger)."""
        out: list[Violation] = []
        final = self.final.get(entry)
        old = self.seen.get(entry)
        acked = self.acked.get(entry)
        if written is not None and value != written:
            out += self._v("read-differs", f"{who} read entry {entry} as {value!r}", ref)
        elif self.has_final:
            if final is None or final[0] != value:
                there = final[1] if final else (self.end[1] if self.end else -1)
                out += self._v("read-differs", f"{who} read e{entry} as {value!r}; at the "
                               f"end: {final[0] if final else 'absent'!r}", ref, there)
        elif old is not None and old[0] != value:
            out += self._v("read-differs", f"{who} read id {entry} as {value!r}; it was read "
                           f"as {old[0]!r} (an entry a reader saw disappeared)", old[1], ref)
        elif acked is not None and acked[0] != value:
            out += self._v("read-differs", f"{who} read id {entry} as {value!r}, acknowledged "
                           f"as {acked[0]!r}", acked[1], ref)
        if old is None:
            self.seen[entry] = (value, ref)
        return out

    def ended(self, last: int, *, who: str, ref: int = -1, recovered: bool = False
              ) -> list[Violation]:
        """``who`` found the ledger ended at ``last`` (a close, a recovery, a reader of
        the closed ledger, the final read); ``recovered``: a recovery finished (the
        ledger is fenced from then on)."""
        out: list[Violation] = []
        if recovered and self.fenced_at is None:
            self.fenced_at = ref
        if self.end is not None:
            if self.end[0] != last:
                out += self._v("end-differs", f"{who} ended L{self.ledger} at e{last}; "
                               f"it was ended at e{self.end[0]}", ref, self.end[1])
            return out
        self.end = (last, ref)
        if self.acked_upto > last:
            out += self._v("acked-lost", f"entry {self.acked_upto} was acknowledged but the "
                           f"ledger closed at {last}", self.acked[self.acked_upto][1], ref)
        if self.lac_seen[0] > last:
            out += self._v("lac-beyond-end", f"LAC {self.lac_seen[0]} was seen but the "
                           f"ledger closed at {last}", self.lac_seen[1], ref)
        return out

    def final_end(self, last: int, *, who: str = "final", ref: int = -1) -> list[Violation]:
        """After healing, the final read found the ledger ended at ``last``: from now on
        every fact is held to the final read (fed before the others)."""
        out = self.ended(last, who=who, ref=ref)
        self.has_final = True
        return out

    def final_entry(self, entry: int, value: bytes, *, ref: int = -1) -> None:
        """After healing, the final read found ``entry`` holding ``value``."""
        self.final[entry] = (value, ref)


def check(history: History) -> list[Violation]:
    """Every violation of the invariants in ``history`` (empty when it is correct).
    Ledgers without a final end are not judged (the harness records one for every ledger
    it created; a missing one is reported by the harness itself)."""
    ledgers: dict[int, LedgerFacts] = {}
    for e in history.events:
        if e.ledger is None or e.op != "final" or e.kind != "ok":
            continue
        facts = ledgers.setdefault(e.ledger, LedgerFacts(ledger=e.ledger))
        if e.entry is not None and e.value is not None:
            facts.final_entry(e.entry, e.value, ref=e.index)
        else:
            facts.final_end(e.entry if e.entry is not None else -1, who=e.process,
                            ref=e.index)
    invokes: dict[tuple[str, str], int] = {}
    out: list[Violation] = []
    for e in history.events:
        judged = ledgers.get(e.ledger) if e.ledger is not None else None
        if judged is None:
            continue
        facts = judged
        if e.op == "add" and e.kind == "invoke":
            # Workloads tag an add's invoke and its outcome with the same ``detail`` (a
            # per-process sequence number).
            invokes[(e.process, e.detail)] = e.index
        elif e.kind != "ok" or e.op == "final":
            continue
        elif e.op in ("recover", "close") and e.entry is not None:
            out += facts.ended(e.entry, who=f"{e.process} {e.op}", ref=e.index,
                               recovered=e.op == "recover")
        elif e.op == "add" and e.entry is not None:
            out += facts.acked_add(e.entry, e.value, who=e.process, ref=e.index,
                                   invoked=invokes.get((e.process, e.detail)))
        elif e.op == "read" and e.entry is not None and e.value is not None:
            out += facts.read(e.entry, e.value, who=e.process, ref=e.index)
        elif e.op == "lac" and e.entry is not None:
            out += facts.saw_lac(e.entry, who=e.process, ref=e.index)
    return out


def report(history: History, violations: list[Violation], *, context: int = 3) -> str:
    """The smallest failing window: its violation, the events in it that touch the ledger,
    and every fault or heal in it."""
    if not violations:
        return "no violations"
    worst = min(violations, key=lambda v: (v.span, v.window))
    lo, hi = worst.window
    lines = [f"{len(violations)} violation(s); smallest window: events {lo}..{hi} "
             f"({worst.kind}, L{worst.ledger}): {worst.message}"]
    for e in history.events[max(0, lo - context):hi + 1]:
        if e.index in worst.events or e.ledger == worst.ledger or e.op in ("fault", "heal"):
            mark = ">>" if e.index in worst.events else "  "
            lines.append(f"{mark} {e.line()}")
    kinds: dict[str, int] = {}
    for v in violations:
        kinds[v.kind] = kinds.get(v.kind, 0) + 1
    lines.append("by kind: " + ", ".join(f"{k}={n}" for k, n in sorted(kinds.items())))
    return "\n".join(lines)
