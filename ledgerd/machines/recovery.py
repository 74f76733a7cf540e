"""Ledger recovery as a pure state machine (seeds 000/004; bookkeeper-facts §8).

The caller has already moved the metadata from OPEN to IN_RECOVERY (a CAS). Then:

1. **Fence**: a fencing read of entry -1 goes to every bookie of the *last* ensemble.
   An answer is definite when it is OK (the bookie's last entry, whose LAC field the
   caller decoded after checking the digest) or NO_SUCH_ENTRY / NO_SUCH_LEDGER.
   UNAUTHORIZED aborts. Once every write-quorum window of the ensemble has
   ``Qw - Qa + 1`` definite answers, the fence covers the ledger: no ack quorum of the
   old writer can still form.
2. **Start** from ``max(highest LAC seen, first entry of the last fragment - 1)``; never
   from -1 when the last fragment starts later (apache/bookkeeper#2615).
3. **Read forward** entry by entry with fencing reads (so negatives stay negative,
   apache/bookkeeper#2614) to the entry's write set. One positive answer recovers the
   entry; ``Qw - Qa + 1`` NO_SUCH_ENTRY answers prove it absent and end the ledger just
   before it; anything else once all have answered aborts recovery.
4. **Rewrite** every recovered entry with RECOVERY_ADD (the caller feeds ``Rewrite``
   effects to a recovery-mode ``LedgerWriter``; its ensemble changes stay local).
5. **Close**: once the read has ended and every rewrite is acknowledged, ``Finished``
   carries the last entry id and length for the CAS to CLOSED.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from ledgerd.machines.quorum import EnsembleCoverage, ReadOutcome, RecoveryRead, write_set
from ledgerd.machines.writer import FailureKind
from wire.status import Status

__all__ = ["Aborted", "Finished", "LedgerRecovery", "Phase", "Rewrite", "SendFenceRead",
           "SendRecoveryRead"]

_NEGATIVE = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)


class Phase(enum.Enum):
    FENCING = "fencing"
    READING = "reading"
    WRITING = "writing"
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class SendFenceRead:
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class SendRecoveryRead:
    entry_id: int
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class Rewrite:
    entry_id: int
    entry: bytes
    length: int  # the entry's cumulative ledger length


@dataclass(frozen=True, slots=True)
class Finished:
    last_entry_id: int
    length: int


@dataclass(frozen=True, slots=True)
class Aborted:
    """Recovery stopped; ``kind`` says why (drivers branch on it), ``reason`` tells a human."""

    kind: FailureKind
    reason: str


RecoveryEffect = SendFenceRead | SendRecoveryRead | Rewrite | Finished | Aborted


class LedgerRecovery:
    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                 ensemble: Sequence[str], last_fragment_first_entry: int, *,
                 start_from_minus_one: bool = False) -> None:
        self.e, self.qw, self.qa = ensemble_size, write_quorum, ack_quorum
        self.ensemble = list(ensemble)
        self.first_of_last = last_fragment_first_entry
        self.coverage = EnsembleCoverage(ensemble_size, write_quorum, ack_quorum)
        self.max_lac = -1
        self.max_lac_length = 0
        self.phase = Phase.FENCING
        self.start = -1
        self.reading: RecoveryRead | None = None
        self.reading_id = -1
        self.last_found = -1
        self.last_length = 0
        self.read_ended = False
        self.rewrites_pending: set[int] = set()
        # Mutation switch for the simulator's self-test only (#2615 re-introduced).
        self._start_from_minus_one = start_from_minus_one

    def begin(self) -> list[RecoveryEffect]:
        return [SendFenceRead(i, b) for i, b in enumerate(self.ensemble)]

    # -- phase 1: fence ----------------------------------------------------------------

    def on_fence_answer(self, index: int, status: int, lac: int = -1,
                        length: int = 0) -> list[RecoveryEffect]:
        """A fencing read's answer; with OK, ``lac`` and ``length`` from the entry header."""
        if self.phase is not Phase.FENCING:
            return []
        if status == Status.UNAUTHORIZED:
            return self._abort(FailureKind.UNAUTHORIZED,
                               f"bookie {self.ensemble[index]} refused the master key")
        definite = status == Status.OK or status in _NEGATIVE
        self.coverage.record(index, definite)
        if status == Status.OK and lac > self.max_lac:
            self.max_lac, self.max_lac_length = lac, length
        if self.coverage.covered:
            return self._start_reading()
        if self.coverage.all_answered:
            return self._abort(FailureKind.UNAVAILABLE,
                               "fencing did not reach quorum coverage of the last ensemble")
        return []

    def on_fence_timeout(self, index: int) -> list[RecoveryEffect]:
        return self.on_fence_answer(index, Status.IO_ERROR)

    def _start_reading(self) -> list[RecoveryEffect]:
        self.phase = Phase.READING
        self.start = self.max_lac if self._start_from_minus_one else \
            max(self.max_lac, self.first_of_last - 1)
        self.last_found = self.start
        self.last_length = self.max_lac_length
        return self._read(self.start + 1)

    # -- phase 2: read forward ---------------------------------------------------------

    def _read(self, entry_id: int) -> list[RecoveryEffect]:
        indexes = write_set(entry_id, self.e, self.qw)
        self.reading_id = entry_id
        self.reading = RecoveryRead(indexes, self.qw, self.qa)
        return [SendRecoveryRead(entry_id, i, self.ensemble[i]) for i in indexes]

    def on_read_answer(self, entry_id: int, index: int, status: int, entry: bytes = b"",
                       length: int = 0) -> list[RecoveryEffect]:
        """A recovery read's answer; ``entry`` only when OK *and* its digest checked."""
        if self.phase is not Phase.READING or entry_id != self.reading_id:
            return []
        r = self.reading
        assert r is not None
        if status == Status.OK and entry:
            r.positive(index, entry)
        elif status in _NEGATIVE:
            r.negative_answer(index)
        elif status == Status.UNAUTHORIZED:
            return self._abort(FailureKind.UNAUTHORIZED,
                               f"bookie {self.ensemble[index]} refused the master key")
        else:
            r.failure(index)
        outcome = r.outcome
        if outcome is ReadOutcome.FOUND:
            assert r.found is not None
            self.last_found, self.last_length = entry_id, length
            self.rewrites_pending.add(entry_id)
            return [Rewrite(entry_id, r.found, length), *self._read(entry_id + 1)]
        if outcome is ReadOutcome.ABSENT:
            self.read_ended = True
            self.phase = Phase.WRITING
            return self._maybe_finish()
        if outcome is ReadOutcome.UNKNOWN:
            return self._abort(FailureKind.UNAVAILABLE,
                               f"entry {entry_id}: neither found nor provably absent")
        return []

    def on_read_timeout(self, entry_id: int, index: int) -> list[RecoveryEffect]:
        return self.on_read_answer(entry_id, index, Status.IO_ERROR)

    # -- phase 3: rewrites -------------------------------------------------------------

    def on_rewritten(self, entry_ids: Sequence[int]) -> list[RecoveryEffect]:
        self.rewrites_pending.difference_update(entry_ids)
        return self._maybe_finish()

    def _maybe_finish(self) -> list[RecoveryEffect]:
        if self.phase is Phase.WRITING and self.read_ended and not self.rewrites_pending:
            self.phase = Phase.DONE
            return [Finished(self.last_found, self.last_length)]
        return []

    def _abort(self, kind: FailureKind, reason: str) -> list[RecoveryEffect]:
        if self.phase in (Phase.DONE, Phase.ABORTED):
            return []
        self.phase = Phase.ABORTED
        return [Aborted(kind, reason)]
