"""Reads as pure machines: which replica to ask, when to ask the next, when to give up.

The trio driver (``ledgerd/reads.py``) sends what these ask for, verifies what comes back
(digest, ids, decompression) and feeds the outcome in; time comes in as ``now``, and the
driver sleeps until ``next_deadline()``.

- ``EntryReads``: each entry goes to one replica of its write set at a time, in the order
  given (healthy replicas first). A failure (an error status, a dead connection, a bad
  digest) moves to the next replica; a replica silent past ``speculative_timeout`` gets
  the next one asked too (the first good answer wins); once every replica was asked and
  ``read_timeout`` has passed since the last ask, the entry has failed.
- ``RangeReads``: a range is cut into runs one bookie stores whole
  (``quorum.range_runs``); each run is one ReadRange, continued while answers stop at the
  byte limit. A run that fails or is silent past the speculative timeout ends, and its
  bookie is asked last for what it did not deliver (``EntryReads`` takes over).
- ``LacTally``: ReadLac answers from the last ensemble; the highest LAC counts once every
  write quorum has ``Qw - Qa + 1`` definite answers (``quorum.is_definite``, the rule
  recovery's fence uses).
- ``LongPollTally``: the first answer whose LAC passes the mark ends a long poll, or
  every bookie having answered.
- ``FollowerLac``: how far a follower of an unbounded ledger may read with the metadata
  it holds: only up to a LAC it learned *before* that metadata was read (the
  unbounded ledger's terms; see docs/protocol.md "Following an unbounded ledger").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ledgerd.machines.quorum import EnsembleCoverage, is_definite, range_runs, stride_runs

__all__ = [
    "EntryReads",
    "FollowerLac",
    "LacTally",
    "LongPollTally",
    "RangeReads",
    "RangeRun",
    "SendRange",
    "SendRead",
]


@dataclass(frozen=True, slots=True)
class SendRead:
    entry_id: int
    bookie: str


@dataclass(frozen=True, slots=True)
class SendRange:
    run: int          # index into RangeReads.runs
    bookie: str
    first_entry_id: int
    max_count: int
    stride: int = 1   # > 1: a ReadStride (every stride-th entry)


@dataclass
class _Entry:
    entry_id: int
    replicas: list[str]
    next: int = 0
    outstanding: int = 0
    last_sent: float = 0.0
    found: bool = False
    failed: bool = False
    failures: list[tuple[str, Exception]] = field(default_factory=list)

    @property
    def is_open(self) -> bool:
        return not (self.found or self.failed)


class EntryReads:
    """Reads of single entries with failover and speculation (see the module's theory)."""

    def __init__(self, replicas: Sequence[tuple[int, Sequence[str]]], *,
                 speculative_timeout: float, read_timeout: float) -> None:
        self.entries = {eid: _Entry(eid, list(reps)) for eid, reps in replicas}
        # A speculative timeout of 0 means "off": the next replica only after a failure.
        self.speculative = speculative_timeout or read_timeout
        self.read_timeout = read_timeout
        self.open = len(self.entries)
        self.timed_out: list[int] = []

    @property
    def is_done(self) -> bool:
        return self.open == 0

    def begin(self, now: float) -> list[SendRead]:
        out: list[SendRead] = []
        for e in self.entries.values():
            if e.replicas:
                out.append(self._send_next(e, now))
            else:
                self._fail(e)
        return out

    def _send_next(self, e: _Entry, now: float) -> SendRead:
        bookie = e.replicas[e.next]
        e.next += 1
        e.outstanding += 1
        e.last_sent = now
        return SendRead(e.entry_id, bookie)

    def _fail(self, e: _Entry) -> None:
        e.failed = True
        self.open -= 1

    def on_found(self, entry_id: int, now: float) -> list[SendRead]:
        """A replica returned the entry and it verified."""
        e = self.entries[entry_id]
        e.outstanding -= 1
        if e.is_open:
            e.found = True
            self.open -= 1
        return []

    def on_failure(self, entry_id: int, bookie: str, error: Exception,
                   now: float) -> list[SendRead]:
        """A replica could not serve the entry (``error`` says why, for the report)."""
        e = self.entries[entry_id]
        e.outstanding -= 1
        if not e.is_open:
            return []
        e.failures.append((bookie, error))
        if e.next < len(e.replicas):
            return [self._send_next(e, now)]
        if e.outstanding == 0:
            self._fail(e)
        return []

    def next_deadline(self) -> float | None:
        earliest: float | None = None
        for e in self.entries.values():
            if not e.is_open:
                continue
            wait = self.speculative if e.next < len(e.replicas) else self.read_timeout
            at = e.last_sent + wait
            if earliest is None or at < earliest:
                earliest = at
        return earliest

    def on_timer(self, now: float) -> list[SendRead]:
        """Speculate on slow replicas; fail entries nobody answered in ``read_timeout``.
        Entries that timed out are listed in ``timed_out``."""
        out: list[SendRead] = []
        for e in self.entries.values():
            if not e.is_open:
                continue
            if e.next < len(e.replicas):
                if e.last_sent + self.speculative <= now:
                    out.append(self._send_next(e, now))  # the slow one may still win
            elif e.last_sent + self.read_timeout <= now:
                self.timed_out.append(e.entry_id)
                self._fail(e)
        return out

    def failures(self, entry_id: int) -> list[tuple[str, Exception]]:
        return self.entries[entry_id].failures

    def failed(self) -> list[int]:
        return [eid for eid, e in self.entries.items() if e.failed]


@dataclass
class RangeRun:
    bookie: str
    next: int
    last: int
    stride: int = 1
    sent_at: float = 0.0
    over: bool = False


class RangeReads:
    """ReadRange runs over the fragments of a range (see the module's theory)."""

    def __init__(self, fragments: Sequence[tuple[int, int, Sequence[str]]], first: int,
                 last: int, *, ensemble_size: int, write_quorum: int, run_limit: int,
                 skip: frozenset[str], speculative_timeout: float,
                 strided: bool = False) -> None:
        self.runs: list[RangeRun] = []
        # Striped fragments (Qw < E) hold runs of only Qw consecutive entries on a
        # bookie: with ``strided``, each bookie is asked once for every E-th entry.
        stride = ensemble_size if strided and write_quorum < ensemble_size else 1
        cut = stride_runs if stride > 1 else range_runs
        for f_first, f_last, ensemble in fragments:
            lo, hi = max(first, f_first), (last if f_last < 0 else min(last, f_last))
            if lo > hi:
                continue
            for index, a, b in cut(lo, hi, ensemble_size, write_quorum, run_limit):
                if ensemble[index] not in skip:  # left to the per-entry reads
                    self.runs.append(RangeRun(ensemble[index], a, b, stride))
        self.speculative = speculative_timeout
        self.pending = len(self.runs)
        self.avoid: set[str] = set()  # bookies whose runs failed: asked last afterwards

    @property
    def is_done(self) -> bool:
        return self.pending == 0

    def begin(self, now: float) -> list[SendRange]:
        return [self._send(i, now) for i in range(len(self.runs))]

    def _send(self, i: int, now: float) -> SendRange:
        run = self.runs[i]
        run.sent_at = now
        return SendRange(i, run.bookie, run.next, (run.last - run.next) // run.stride + 1,
                         run.stride)

    def _end(self, run: RangeRun, failed: bool) -> None:
        run.over = True
        if failed:
            self.avoid.add(run.bookie)
        self.pending -= 1

    def wanted(self, i: int) -> int:
        """How many entries run ``i`` still wants (0: it is over)."""
        run = self.runs[i]
        return 0 if run.over else (run.last - run.next) // run.stride + 1

    def on_answer(self, i: int, delivered: int, failed: bool, now: float) -> list[SendRange]:
        """Run ``i`` answered with ``delivered`` verified entries from its next one (every
        ``stride``-th); ``failed`` if the answer was an error, empty, or an entry did not
        verify."""
        run = self.runs[i]
        if run.over:
            return []
        run.next += delivered * run.stride
        if failed or delivered == 0:
            self._end(run, failed=True)
            return []
        if run.next > run.last:
            self._end(run, failed=False)
            return []
        return [self._send(i, now)]  # stopped at max_bytes, or before an entry it lacks

    def next_deadline(self) -> float | None:
        times = [r.sent_at + self.speculative for r in self.runs if not r.over]
        return min(times) if times else None

    def on_timer(self, now: float) -> None:
        for run in self.runs:
            if not run.over and run.sent_at + self.speculative <= now:
                self._end(run, failed=True)  # slow: the rest goes to the other replicas


class LacTally:
    """ReadLac answers of the last ensemble, and the LAC they prove."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        self.coverage = EnsembleCoverage(ensemble_size, write_quorum, ack_quorum)
        self.best = -1

    def on_answer(self, index: int, status: int, lac: int = -1) -> None:
        """An answer; ``lac`` is the highest LAC its verified bytes carry (with OK)."""
        self.coverage.record(index, is_definite(status))
        if lac > self.best:
            self.best = lac

    @property
    def is_done(self) -> bool:
        return self.coverage.all_answered

    @property
    def covered(self) -> bool:
        return self.coverage.covered


class LongPollTally:
    """A long poll over the last ensemble: done at the first LAC past the mark, or once
    every bookie answered (the LAC stayed where it was)."""

    def __init__(self, bookies: int, previous_lac: int) -> None:
        self.bookies = bookies
        self.previous_lac = previous_lac
        self.answered = 0
        self.best = previous_lac

    def on_answer(self, lac: int | None) -> None:
        """An answer (``lac`` None: an error or a dead connection)."""
        self.answered += 1
        if lac is not None and lac > self.best:
            self.best = lac

    @property
    def is_done(self) -> bool:
        return self.best > self.previous_lac or self.answered >= self.bookies


class FollowerLac:
    """The LAC a follower learned, and how far the metadata it holds lets it read.

    A bounded ledger has one writer, so an id has one value wherever it is stored: any
    bookie the metadata names for an id holds that value or nothing, however old the
    metadata. An unbounded ledger has a writer per term, and an id above the point where
    a term's recovery truncated can hold a deposed leader's value on a bookie that left
    the write set (an ensemble change of that leader, or of the recovery, moved the id
    to other bookies; the TRUNCATE no-op reaches only the ensemble of its time). A LAC
    learned from a bookie that is in both the old and the new ensemble says nothing of
    that: read with the fragment list from before the move, the id goes to the bookie
    that still holds the unacknowledged value.

    The rule: an id of an unbounded ledger is read only with metadata whose read began
    after a LAC at or past that id was learned. Every fragment holding an id at or below
    a LAC was in the metadata before that LAC existed (a writer CASes a fragment before
    it sends to it; a term's fragments land with its opening CAS), so such metadata
    names, for every id up to that LAC, bookies that hold its acknowledged value or
    nothing.

    ``on_lac(lac)`` records a LAC and says whether the metadata must be re-read before
    reading up to it; ``metadata_read_begins()`` is called as that read starts and its
    result passed to ``on_metadata`` with the answer. ``readable`` is how far reads may
    go; a bounded ledger reads up to every LAC at once.
    """

    __slots__ = ("lac", "readable", "unbounded")

    def __init__(self, *, unbounded: bool, lac: int = -1) -> None:
        self.unbounded = unbounded
        self.lac = lac
        self.readable = lac

    def on_lac(self, lac: int) -> bool:
        """A LAC heard from a bookie; True when the metadata must be re-read (after
        this call) before reading past ``readable``."""
        if lac > self.lac:
            self.lac = lac
        if not self.unbounded:
            self.readable = self.lac
        return self.readable < self.lac

    def metadata_read_begins(self) -> int:
        """Call as a metadata read starts; pass the result to ``on_metadata``."""
        return self.lac

    def on_metadata(self, covers: int, *, last_entry_id: int | None = None) -> None:
        """The metadata read that began when ``metadata_read_begins()`` returned
        ``covers`` answered; ``last_entry_id``: the ledger is closed there (its end
        is known, whatever the bookies said)."""
        if last_entry_id is not None:
            self.lac = max(self.lac, last_entry_id)
            covers = max(covers, last_entry_id)
        self.readable = max(self.readable, min(covers, self.lac))
