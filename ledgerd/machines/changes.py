"""Metadata changes the client makes, as pure functions for a compare-and-set loop.

Each takes the metadata just read and returns the metadata to write, or raises a
``ChangeRejectedError`` subclass saying why the change no longer applies. Returning the
input object unchanged means "nothing to write" (``cas_update`` then writes nothing).
The trio client and the simulator run the same functions.

The rules (BookKeeper's, for closing a ledger as its writer):
- ensemble change: CLOSED -> LedgerClosed, IN_RECOVERY -> LedgerFenced; the last
  ensemble must still be the one the writer replaced bookies in;
- writer close: OPEN -> CLOSED at the writer's LAC; IN_RECOVERY -> LedgerFenced;
  CLOSED at the same end -> done; CLOSED at another end -> LedgerClosed;
- recovery begin: OPEN or IN_RECOVERY -> IN_RECOVERY; CLOSED -> nothing to recover;
  a recovery the bookies refused before its fence covered the ledger puts OPEN back
  (``abandon_recovery``), at the version its begin wrote only;
- recovery close: the ensembles chosen during recovery land together with CLOSED; a
  ledger another recoverer closed first is adopted as it is.
- terms (unbounded ledgers): a writer that takes over raises the term by CAS
  (``begin_term``: OPEN or IN_RECOVERY -> IN_RECOVERY, term + 1); its recovery's
  ensembles, the no-op entries it found or wrote, and OPEN land with one CAS
  (``open_term``) that holds only while the term is still its own. Every change a
  writer makes to an unbounded ledger (ensemble change, close) carries its term, and a
  raised term rejects it with TermChangedError: that writer lost the leadership;
- re-replication (``replace_in_fragment``): only the copied fragment's ensemble changes,
  and only while that fragment still covers the entries copied (same first and last
  entry, still final) and each replaced bookie still sits where it was read; a bookie
  already replaced by the same copy is a no-op (the CAS landed before a retry);
- healing an unbounded ledger's open fragment (``split_open_fragment``): its entries up
  to a LAC the bookies hold become a final fragment on the replacement bookies, and the
  writer's ensemble goes on from LAC + 1, unchanged. Only while the term, the OPEN
  state and that ensemble are as read: a live writer's own ensemble change starts at
  its LAC + 1, never below a LAC a bookie holds, so it lands after the split and the
  split never lands under it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ledgerd.machines.writer import FailureKind
from ledgerd.metadata.errors import ChangeRejectedError
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState
from ledgerd.wire.status import FencedError

__all__ = [
    "ClosedChangeError",
    "EnsembleConflictError",
    "FencedChangeError",
    "FragmentChangedError",
    "TermChangedError",
    "abandon_recovery",
    "begin_recovery",
    "begin_term",
    "change_ensemble",
    "close_as_writer",
    "close_recovered",
    "failure_kind",
    "open_term",
    "replace_in_fragment",
    "split_open_fragment",
]


class ClosedChangeError(ChangeRejectedError):
    """The ledger is CLOSED (at another end than this change wanted)."""


class FencedChangeError(ChangeRejectedError, FencedError):
    """The ledger is IN_RECOVERY: another client fenced it."""


class EnsembleConflictError(ChangeRejectedError):
    """The last ensemble changed under the writer (someone else replaced a bookie)."""


class TermChangedError(ChangeRejectedError):
    """Another writer raised the unbounded ledger's term: this one lost the leadership."""


def _check_term(md: LedgerMetadata, term: int) -> None:
    if md.unbounded and md.term != term:
        raise TermChangedError(f"ledger term is {md.term}, this writer holds term {term}")


def _writable(md: LedgerMetadata, term: int = 0) -> None:
    _check_term(md, term)
    if md.state is LedgerState.CLOSED:
        raise ClosedChangeError(f"ledger is CLOSED at entry {md.last_entry_id}")
    if md.state is LedgerState.IN_RECOVERY:
        raise FencedChangeError("ledger is IN_RECOVERY (fenced by another client)")


def change_ensemble(md: LedgerMetadata, expected: Sequence[str], first_entry_id: int,
                    new: Sequence[str], term: int = 0) -> LedgerMetadata:
    _writable(md, term)
    if tuple(md.last_ensemble[1]) != tuple(expected):
        raise EnsembleConflictError(f"last ensemble is {list(md.last_ensemble[1])}, the writer "
                               f"had {list(expected)}")
    return md.with_ensemble(first_entry_id, tuple(new))


def close_as_writer(md: LedgerMetadata, last_entry_id: int, length: int,
                    term: int = 0) -> LedgerMetadata:
    if md.state is not LedgerState.CLOSED:
        _check_term(md, term)
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


def abandon_recovery(md: LedgerMetadata) -> LedgerMetadata:
    """IN_RECOVERY back to OPEN: the one move against the state table, for a recovery
    the bookies refused before its fence covered the ledger. Its caller writes it only
    at the version its own ``begin_recovery`` wrote (``ledgerd.recovery``), so no other
    recovery can have begun meanwhile."""
    if md.state is not LedgerState.IN_RECOVERY or md.unbounded:
        raise ChangeRejectedError(f"ledger is {md.state.value}; only a bounded ledger in "
                                  "recovery can be put back OPEN")
    return replace(md, state=LedgerState.OPEN)


def begin_term(md: LedgerMetadata) -> LedgerMetadata:
    """Take over an unbounded ledger: IN_RECOVERY with the term raised by one."""
    if not md.unbounded:
        raise ChangeRejectedError("not an unbounded ledger: terms need one")
    if md.state is LedgerState.CLOSED:
        raise ClosedChangeError(f"ledger is CLOSED at entry {md.last_entry_id}")
    return replace(md, state=LedgerState.IN_RECOVERY, term=md.term + 1)


def open_term(md: LedgerMetadata, term: int, ensembles: Mapping[int, Sequence[str]],
              noops: Sequence[int]) -> LedgerMetadata:
    """End a term's recovery: its ensembles and no-op entries land, and the ledger is
    OPEN for writes at ``term + 1``. Rejected if another writer raised the term since.

    Writes use the next term, not the recovery's: a recovery add (the TRUNCATE no-op
    above all) held up in the network and delivered after the writes began would drop
    them; at ``term + 1`` every bookie that took a write refuses it (INVALID_TERM). The
    simulator found this with a delayed no-op and a later fragment on the same bookie."""
    if md.state is LedgerState.OPEN and md.term == term + 1:
        return md  # our CAS landed before a retry
    _check_term(md, term)
    if md.state is LedgerState.CLOSED:
        raise ClosedChangeError(f"ledger is CLOSED at entry {md.last_entry_id}")
    if md.state is LedgerState.OPEN:
        raise TermChangedError(f"ledger is OPEN at term {md.term}, not in term {term}'s "
                               "recovery")
    for first in sorted(ensembles):
        if first < md.last_ensemble[0]:
            continue  # a fragment a trim removed meanwhile cannot be re-added
        md = md.with_ensemble(first, tuple(ensembles[first]))
    merged = tuple(sorted(set(md.noops) | {n for n in noops if n >= md.start_entry}))
    return replace(md, state=LedgerState.OPEN, noops=merged, term=term + 1)


def close_recovered(md: LedgerMetadata, ensembles: Mapping[int, Sequence[str]],
                    last_entry_id: int, length: int) -> LedgerMetadata:
    if md.state is LedgerState.CLOSED:
        return md  # another recoverer finished first; its end is the end
    for first in sorted(ensembles):
        md = md.with_ensemble(first, tuple(ensembles[first]))
    return md.closed(last_entry_id, length)


class FragmentChangedError(ChangeRejectedError):
    """The fragment a copy was made for is no longer as it was read."""


def replace_in_fragment(md: LedgerMetadata, first: int, last: int,
                        replacements: Mapping[int, tuple[str, str]]) -> LedgerMetadata:
    """Replace bookies in the fragment starting at ``first`` only: ``{index: (old,
    new)}``. Rejected unless the fragment still spans ``first..last`` and is final, and
    each index still holds ``old`` (or already ``new``)."""
    starts = [f for f, _ in md.ensembles]
    if first not in starts:
        raise FragmentChangedError(f"no fragment starts at entry {first} any more")
    pos = starts.index(first)
    final = pos + 1 < len(starts) or md.is_closed
    end = starts[pos + 1] - 1 if pos + 1 < len(starts) else md.last_entry_id
    if not final or end != last:
        raise FragmentChangedError(
            f"fragment at entry {first} is now {'open' if not final else f'{first}..{end}'}; "
            f"the copy covered {first}..{last}")
    ensemble = list(md.ensembles[pos][1])
    changed = False
    for index, (old, new) in sorted(replacements.items()):
        if ensemble[index] == new:
            continue
        if ensemble[index] != old:
            raise FragmentChangedError(
                f"fragment at entry {first} holds {ensemble[index]} at index {index}, "
                f"not {old}")
        if new in ensemble:
            raise FragmentChangedError(f"{new} is already in the fragment at entry {first}")
        ensemble[index] = new
        changed = True
    if not changed:
        return md
    ensembles = list(md.ensembles)
    ensembles[pos] = (first, tuple(ensemble))
    return replace(md, ensembles=tuple(ensembles))


def split_open_fragment(md: LedgerMetadata, first: int, last: int,
                        replacements: Mapping[int, tuple[str, str]],
                        term: int) -> LedgerMetadata:
    """Heal an unbounded ledger's open fragment up to ``last`` (a LAC some bookie holds:
    every entry up to it is acknowledged and its writer never sends it again): entries
    ``first..last`` become a final fragment with ``{index: (old, new)}`` replaced, and
    the writer's ensemble, unchanged, holds the entries from ``last + 1`` on.

    Rejected (FragmentChangedError, TermChangedError) unless the fragment starting at
    ``first`` is still the last one, OPEN, at ``term``, with the ``old`` bookies where
    they were read. A split that landed already (a retry) returns ``md`` unchanged."""
    starts = [f for f, _ in md.ensembles]
    if first not in starts:
        raise FragmentChangedError(f"no fragment starts at entry {first} any more")
    pos = starts.index(first)
    ensemble = md.ensembles[pos][1]
    healed = tuple(replacements[i][1] if i in replacements else b
                   for i, b in enumerate(ensemble))
    if pos + 1 < len(starts):
        if starts[pos + 1] == last + 1 and all(ensemble[i] == new
                                               for i, (_, new) in replacements.items()):
            return md  # our split landed before a retry
        raise FragmentChangedError(f"fragment at entry {first} is final now (its writer "
                                   "moved on): copy it as a final fragment")
    if not md.unbounded:
        raise ChangeRejectedError("only an unbounded ledger's open fragment is split")
    _check_term(md, term)
    if md.state is not LedgerState.OPEN:
        raise FragmentChangedError(f"ledger is {md.state.name}, not OPEN")
    for index, (old, new) in replacements.items():
        if ensemble[index] != old:
            raise FragmentChangedError(f"fragment at entry {first} holds {ensemble[index]} "
                                       f"at index {index}, not {old}")
        if new in ensemble:
            raise FragmentChangedError(f"{new} is already in the fragment at entry {first}")
    if last < first:
        return md  # nothing acknowledged in it yet: nothing to re-point
    ensembles = list(md.ensembles)
    ensembles[pos] = (first, healed)
    ensembles.append((last + 1, ensemble))
    return replace(md, ensembles=tuple(ensembles))


def failure_kind(rejected: ChangeRejectedError) -> FailureKind:
    """What a writer's failed ensemble change means for its handle."""
    if isinstance(rejected, ClosedChangeError):
        return FailureKind.CLOSED
    if isinstance(rejected, TermChangedError):
        return FailureKind.TERM
    if isinstance(rejected, FencedChangeError):
        return FailureKind.FENCED
    return FailureKind.METADATA
