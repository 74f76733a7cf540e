"""Placement of entries on an ensemble and the quorum rules, as pure functions.

- The write set of entry ``e`` is bookie indexes ``(e + i) % E`` for ``i < Qw``.
- Coverage (``QuorumCoverage.tla``): a property holds for a cohort once
  ``len(cohort) - Qa + 1`` of its members satisfy it, so every ack quorum contains one.
  Fencing covers the last ensemble when *each* of its E write-quorum windows has
  ``Qw - Qa + 1`` definite answers; an entry is absent once ``Qw - Qa + 1`` of its
  write set said NO_SUCH_ENTRY / NO_SUCH_LEDGER.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from ledgerd.wire.status import Status

__all__ = ["EnsembleCoverage", "ReadOutcome", "RecoveryRead", "check_quorums", "is_definite",
           "range_runs",
           "write_set"]


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Raise ValueError unless ``E >= Qw >= Qa >= 1``."""
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise ValueError(f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                         f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Indexes of the ensemble's bookies that store ``entry_id``."""
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum))


def is_definite(status: int) -> bool:
    """A replica's definite answer: it has the entry (OK) or says it has not
    (NO_SUCH_ENTRY, NO_SUCH_LEDGER). Anything else (errors, timeouts) proves nothing.
    Recovery's fence and the reader's LAC coverage both count these."""
    return status == Status.OK or status == Status.NO_SUCH_ENTRY or \
        status == Status.NO_SUCH_LEDGER


def stride_runs(first: int, last: int, ensemble_size: int, write_quorum: int,
                run_limit: int) -> list[tuple[int, int, int]]:
    """For a striped fragment (Qw < E): ``(bookie index, first, last)`` runs of every
    E-th entry, one residue class per bookie, each read with one ReadStride.

    Entry e goes to the bookie at ``(e + Qw - 1) % E``, the last of its write set (the
    same bookie ``range_runs`` picks), so the E classes split the range with no entry
    asked twice. A class longer than ``run_limit`` entries is cut into several runs.
    """
    if run_limit < 1:
        raise ValueError(f"run_limit must be at least 1, got {run_limit}")
    e, qw = ensemble_size, write_quorum
    out = []
    for start in range(first, min(last, first + e - 1) + 1):
        cls_last = last - (last - start) % e
        a = start
        while a <= cls_last:
            b = min(cls_last, a + (run_limit - 1) * e)
            out.append(((a + qw - 1) % e, a, b))
            a = b + e
    return out


def range_runs(first: int, last: int, ensemble_size: int, write_quorum: int,
               run_limit: int) -> list[tuple[int, int, int]]:
    """Split entries ``first..last`` of one fragment into ``(bookie index, first, last)``
    runs that the bookie stores whole, so each run is one ReadRange.

    With Qw == E every bookie stores every entry: runs of ``run_limit`` entries rotate
    over the ensemble. Otherwise the bookie at ``(e + Qw - 1) % E`` stores ``e .. e + Qw
    - 1``, so runs are Qw long and rotate by themselves.
    """
    if run_limit < 1:
        raise ValueError(f"run_limit must be at least 1, got {run_limit}")
    span = run_limit if write_quorum == ensemble_size else min(write_quorum, run_limit)
    out = []
    e = first
    while e <= last:
        end = min(last, e + span - 1)
        index = ((e // span) if write_quorum == ensemble_size else e + write_quorum - 1)
        out.append((index % ensemble_size, e, end))
        e = end + 1
    return out


class EnsembleCoverage:
    """Which bookies of an ensemble gave a definite answer, and whether that covers it."""

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        self.e, self.qw, self.qa = ensemble_size, write_quorum, ack_quorum
        self.definite: set[int] = set()
        self.answered: set[int] = set()

    def record(self, index: int, definite: bool) -> None:
        self.answered.add(index)
        if definite:
            self.definite.add(index)

    @property
    def covered(self) -> bool:
        need = self.qw - self.qa + 1
        return all(sum(1 for i in write_set(start, self.e, self.qw) if i in self.definite) >= need
                   for start in range(self.e))

    @property
    def all_answered(self) -> bool:
        return len(self.answered) == self.e


class ReadOutcome(enum.Enum):
    PENDING = "pending"
    FOUND = "found"
    ABSENT = "absent"
    UNKNOWN = "unknown"  # every replica answered, neither found nor provably absent
    CONFLICT = "conflict"  # corroborating: two replicas answered with different bytes


class RecoveryRead:
    """One entry's recovery read across its write set (``ReadStatus`` in the spec).

    One positive answer (a digest-checked entry) is enough to recover it; absence needs
    ``Qw - Qa + 1`` explicit negatives; anything else once all have answered is UNKNOWN
    and recovery must stop.

    ``corroborate`` (entries that could be checked only without the digest's key): a
    positive answer recovers the entry only once every replica of the write set has
    answered (or failed), and every positive answer must hold the same bytes; two that
    differ make it CONFLICT (``conflict`` names the second replica, ``found_index`` the
    first), as does one answer whose bytes fail the checks (``corrupt``), and recovery
    must stop rather than choose.
    """

    def __init__(self, indexes: Iterable[int], write_quorum: int, ack_quorum: int, *,
                 corroborate: bool = False) -> None:
        self.indexes = tuple(indexes)
        self.need_negative = write_quorum - ack_quorum + 1
        self.negative: set[int] = set()
        self.failed: set[int] = set()
        self.found: bytes | None = None
        self.corroborate = corroborate
        self.positives: set[int] = set()
        self.found_index = -1
        self.conflict: int | None = None
        self.corrupt_reason = ""

    def positive(self, index: int, entry: bytes) -> None:
        self.positives.add(index)
        if self.found is None:
            self.found, self.found_index = entry, index
        elif self.corroborate and self.conflict is None and entry != self.found:
            self.conflict = index

    def corrupt(self, index: int, reason: str) -> None:
        """Corroborating: a replica answered with bytes that fail the checks that need
        no key; nothing it holds can vouch for the entry, or be outvoted by one copy."""
        if self.conflict is None:
            self.conflict, self.corrupt_reason = index, reason

    def negative_answer(self, index: int) -> None:
        self.negative.add(index)

    def failure(self, index: int) -> None:
        self.failed.add(index)

    @property
    def outcome(self) -> ReadOutcome:
        if self.conflict is not None:
            return ReadOutcome.CONFLICT
        if self.found is not None:
            if self.corroborate and \
                    len(self.positives | self.negative | self.failed) < len(self.indexes):
                return ReadOutcome.PENDING  # another replica may yet disagree
            return ReadOutcome.FOUND
        if len(self.negative) >= self.need_negative:
            return ReadOutcome.ABSENT
        if len(self.negative | self.failed) >= len(self.indexes):
            return ReadOutcome.UNKNOWN
        return ReadOutcome.PENDING
