"""Metadata changes the client makes, as pure functions for a compare-and-set loop.

Each takes the metadata just read and returns the metadata to write, or raises a
``ChangeRejectedError`` subclass saying why the change no longer applies. Returning the
input object unchanged means "nothing to write" (``cas_update`` then writes nothing).
The trio client and the simulator run the same functions.

The rules (seed 000 "Closing a ledger as a writer", bookkeeper-facts §8):
- ensemble change: CLOSED -> LedgerClosed, IN_RECOVERY -> LedgerFenced; the last
  ensemble must still be the one the writer replaced bookies in;
- writer close: OPEN -> CLOSED at the writer's LAC; IN_RECOVERY -> LedgerFenced;
  CLOSED at the same end -> done; CLOSED at another end -> LedgerClosed;
- recovery begin: OPEN or IN_RECOVERY -> IN_RECOVERY; CLOSED -> nothing to recover;
- recovery close: the ensembles chosen during recovery land together with CLOSED; a
  ledger another recoverer closed first is adopted as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ledgerd.machines.writer import FailureKind
from metadata.errors import ChangeRejectedError
from metadata.ledger import LedgerMetadata, LedgerState
from wire.status import FencedError

__all__ = ["ClosedChangeError", "EnsembleConflictError", "FencedChangeError", "begin_recovery",
           "change_ensemble", "close_as_writer", "close_recovered", "failure_kind"]


class ClosedChangeError(ChangeRejectedError):
    """The ledger is CLOSED (at another end than this change wanted)."""


class FencedChangeError(ChangeRejectedError, FencedError):
    """The ledger is IN_RECOVERY: another client fenced it."""


class EnsembleConflictError(ChangeRejectedError):
    """The last ensemble changed under the writer (someone else replaced a bookie)."""


def _writable(md: LedgerMetadata) -> None:
    if md.state is LedgerState.CLOSED:
        raise ClosedChangeError(f"ledger is CLOSED at entry {md.last_entry_id}")
    if md.state is LedgerState.IN_RECOVERY:
        raise FencedChangeError("ledger is IN_RECOVERY (fenced by another client)")


def change_ensemble(md: LedgerMetadata, expected: Sequence[str], first_entry_id: int,
                    new: Sequence[str]) -> LedgerMetadata:
    _writable(md)
    if tuple(md.last_ensemble[1]) != tuple(expected):
        raise EnsembleConflictError(f"last ensemble is {list(md.last_ensemble[1])}, the writer "
                               f"had {list(expected)}")
    return md.with_ensemble(first_entry_id, tuple(new))


def close_as_writer(md: LedgerMetadata, last_entry_id: int, length: int) -> LedgerMetadata:
    if md.state is LedgerState.CLOSED:
        if md.last_entry_id == last_entry_id:
            return md
        raise ClosedChangeError(f"ledger was closed at entry {md.last_entry_id}; this writer "
                           f"acknowledged up to {last_entry_id}")
    if md.state is LedgerState.IN_RECOVERY:
        raise FencedChangeError("ledger is IN_RECOVERY (fenced by another client)")
    return md.closed(last_entry_id, length)


def begin_recovery(md: LedgerMetadata) -> LedgerMetadata:
    if md.state is LedgerState.CLOSED:
        return md
    return md.with_state(LedgerState.IN_RECOVERY)


def close_recovered(md: LedgerMetadata, ensembles: Mapping[int, Sequence[str]],
                    last_entry_id: int, length: int) -> LedgerMetadata:
    if md.state is LedgerState.CLOSED:
        return md  # another recoverer finished first; its end is the end
    for first in sorted(ensembles):
        md = md.with_ensemble(first, tuple(ensembles[first]))
    return md.closed(last_entry_id, length)


def failure_kind(rejected: ChangeRejectedError) -> FailureKind:
    """What a writer's failed ensemble change means for its handle."""
    if isinstance(rejected, ClosedChangeError):
        return FailureKind.CLOSED
    if isinstance(rejected, FencedChangeError):
        return FailureKind.FENCED
    return FailureKind.METADATA
