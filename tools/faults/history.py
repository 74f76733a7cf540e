"""The history of a fault run, and the checker over it (pure: no I/O, no clock).

Every operation a workload process starts is recorded as an ``invoke`` event and ends
as ``ok`` or ``fail``; the nemesis records each fault as ``info`` events (``fault`` and
``heal``); after the faults are healed the harness recovers and reads every ledger and
records what it found as ``final`` events. The checker holds the history to the
invariants the simulator checks on modelled bookies (../shared/reference TLA+ notes):

- ``acked-lost``: an acknowledged add is readable at the end with its bytes;
- ``read-differs``: every entry a reader saw is, at the end, that entry with those
  bytes (so all readers agree, and no reader saw an entry that is later absent);
- ``lac-beyond-end``: no reader saw a LAC beyond the ledger's final end;
- ``end-differs``: every recovery, every close and the final read agree on the end;
- ``fenced-ack``: an add started after a recovery of its ledger had finished (the
  ledger fenced) is never acknowledged.

A violation names the events that contradict each other; its window is the span of the
history between the first and the last of them, and ``report`` shows the smallest one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Event", "History", "Violation", "check", "report"]


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


@dataclass
class _Ledger:
    final: Event | None = None                       # the final end (entry = last id)
    entries: dict[int, Event] = field(default_factory=dict)   # final reads
    ends: list[Event] = field(default_factory=list)  # recover ok / close ok
    acked: list[Event] = field(default_factory=list)
    reads: list[Event] = field(default_factory=list)
    lacs: list[Event] = field(default_factory=list)


def _index(events: Iterable[Event]) -> dict[int, _Ledger]:
    ledgers: dict[int, _Ledger] = {}
    for e in events:
        if e.ledger is None:
            continue
        led = ledgers.setdefault(e.ledger, _Ledger())
        if e.op == "final" and e.kind == "ok":
            if e.entry is not None and e.value is not None:
                led.entries[e.entry] = e
            else:
                led.final = e
        elif e.op in ("recover", "close") and e.kind == "ok" and e.entry is not None:
            led.ends.append(e)
        elif e.op == "add" and e.kind == "ok":
            led.acked.append(e)
        elif e.op == "read" and e.kind == "ok":
            led.reads.append(e)
        elif e.op == "lac" and e.kind == "ok" and e.entry is not None:
            led.lacs.append(e)
    return ledgers


def _invokes(events: Iterable[Event]) -> dict[tuple[str, str], Event]:
    """Each add's invoke, keyed by (process, detail): workloads tag an add's invoke and
    its outcome with the same ``detail`` (a per-process sequence number)."""
    return {(e.process, e.detail): e for e in events if e.op == "add" and e.kind == "invoke"}


def check(history: History) -> list[Violation]:
    """Every violation of the invariants in ``history`` (empty when it is correct).
    Ledgers without a final end are not judged (the harness records one for every ledger
    it created; a missing one is reported by the harness itself)."""
    out: list[Violation] = []
    invokes = _invokes(history.events)
    for lid, led in sorted(_index(history.events).items()):
        final = led.final
        if final is None:
            continue
        last = final.entry if final.entry is not None else -1
        for end in led.ends:
            if end.entry != last:
                out.append(Violation("end-differs", lid, f"{end.process} {end.op} ended L{lid} "
                                     f"at e{end.entry}; the final read ends at e{last}",
                                     (end.index, final.index)))
        for ack in led.acked:
            assert ack.entry is not None
            got = led.entries.get(ack.entry)
            if ack.entry > last or got is None or got.value != ack.value:
                # The first end decided after the ack that leaves the entry out, if any.
                decided = next((e for e in led.ends if e.index > ack.index
                                and (e.entry if e.entry is not None else -1) < ack.entry),
                               got or final)
                out.append(Violation("acked-lost", lid, f"add of e{ack.entry} was acknowledged "
                                     f"({ack.value!r}); at the end: "
                                     f"{got.value if got else 'absent'!r}",
                                     (ack.index, decided.index)))
            recover = next((e for e in led.ends if e.op == "recover"), None)
            invoke = invokes.get((ack.process, ack.detail))
            if recover is not None and invoke is not None and invoke.index > recover.index:
                out.append(Violation("fenced-ack", lid, f"add of e{ack.entry} started after "
                                     f"{recover.process} recovered L{lid} and was acknowledged",
                                     (recover.index, invoke.index, ack.index)))
        for read in led.reads:
            assert read.entry is not None
            got = led.entries.get(read.entry)
            if got is None or got.value != read.value:
                out.append(Violation("read-differs", lid, f"{read.process} read e{read.entry} as "
                                     f"{read.value!r}; at the end: "
                                     f"{got.value if got else 'absent'!r}",
                                     (read.index, (got or final).index)))
        for lac in led.lacs:
            if lac.entry is not None and lac.entry > last:
                out.append(Violation("lac-beyond-end", lid, f"{lac.process} saw LAC e{lac.entry}"
                                     f" beyond the final end e{last}", (lac.index, final.index)))
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
