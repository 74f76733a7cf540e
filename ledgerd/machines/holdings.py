"""What a bookie should hold: the expected entries of every fragment that names it.

Pure (no trio, no I/O), the decision behind the bookie's scrubber
(``appliance.scrubber``), as BookKeeper's local consistency check and
``auditorLedgerVerificationPercentage`` sampling decide it:

- A ledger's fragments come from its metadata (``checker.fragments``). A closed
  ledger's last fragment ends at its ``last_entry_id``; an open ledger's last fragment
  ends at the LAC the caller knows (the scrubber: the highest LAC carried by an entry it
  stores), since nothing past the LAC was promised.
- Bookie ``i`` of a fragment holds entry ``e`` when ``i`` is in ``e``'s write set,
  ``{(e + k) % E | k < Qw}`` (``quorum.write_set``; ``checker.stored_runs`` cuts those
  entries into runs of consecutive ids).
- A bookie may be named by several fragments (and at different positions): each one
  contributes its runs (``expected_runs``).
- A pass checks every expected entry, or a sample of ``percentage`` of them chosen by an
  injected ``random.Random`` (``sample``): 100 checks all, 0 checks none.
- What a scrubber found missing is kept as ranges of entry ids per bookie
  (``missing_ranges``: a whole lost ledger is one range per fragment) and comes back to
  the replication worker; ``reported_failures`` maps them onto the final fragments of the *current*
  metadata as ``(fragment first entry, index)`` pairs, the shape the checker's probes
  use, and drops what no longer applies (the bookie was replaced in that fragment, or
  the entry is past the end). A report in an open ledger's last fragment
  (``reported_in_open_fragment``) is a lost copy there: the worker heals it as for a
  lost bookie, and until then the ledger is not whole.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from ledgerd.machines.checker import fragments
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata

__all__ = ["HeldRun", "MissingRanges", "expected_count", "expected_runs", "holder_index",
           "iter_expected_runs", "missing_ranges", "reported_failures",
           "reported_in_open_fragment", "sample"]


@dataclass(frozen=True, slots=True)
class HeldRun:
    """Entries ``first..last`` that the bookie at ``index`` of the fragment starting at
    ``fragment`` should hold; ``final``: the fragment can no longer grow."""

    fragment: int
    index: int
    first: int
    last: int
    final: bool

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def _runs(first: int, last: int, ensemble_size: int, write_quorum: int,
          index: int) -> Iterator[tuple[int, int]]:
    """``checker.stored_runs`` as a generator: a striped fragment of a billion entries
    yields a run per stripe without holding them all."""
    if first > last:
        return
    if write_quorum == ensemble_size:
        yield first, last
        return
    e, qw = ensemble_size, write_quorum
    start = first - (first - (index - qw + 1)) % e  # the run start at or before first
    while start <= last:
        a, b = max(first, start), min(last, start + qw - 1)
        if a <= b:
            yield a, b
        start += e


def iter_expected_runs(md: LedgerMetadata, bookie_id: str, lac: int = -1
                       ) -> Iterator[HeldRun]:
    """Every run of entries ``bookie_id`` should hold, in entry order. ``lac``: the last
    entry known confirmed, bounding an open ledger's last fragment (ignored when the
    ledger is closed). A generator: memory does not grow with the ledger."""
    for frag in fragments(md, lac):
        last = min(frag.last, md.last_entry_id) if md.is_closed else frag.last
        if last < frag.first:
            continue
        for index, bookie in enumerate(frag.ensemble):
            if bookie != bookie_id:
                continue
            for a, b in _runs(frag.first, last, md.ensemble_size, md.write_quorum, index):
                yield HeldRun(frag.first, index, a, b, frag.final)


def expected_runs(md: LedgerMetadata, bookie_id: str, lac: int = -1) -> list[HeldRun]:
    """``iter_expected_runs`` as a list."""
    return list(iter_expected_runs(md, bookie_id, lac))


def expected_count(runs: Iterable[HeldRun]) -> int:
    return sum(r.count for r in runs)


def sample(runs: Iterable[HeldRun], percentage: float,
           rng: random.Random) -> Iterator[tuple[HeldRun, int]]:
    """``(run, entry id)`` for the entries a pass checks: all of them at 100, each with
    probability ``percentage / 100`` otherwise (0: none)."""
    if not 0 <= percentage <= 100:
        raise ValueError(f"percentage must be within 0..100, got {percentage}")
    if percentage <= 0:
        return
    p = percentage / 100
    for run in runs:
        for e in range(run.first, run.last + 1):
            if p >= 1 or rng.random() < p:
                yield run, e


def holder_index(md: LedgerMetadata, bookie_id: str, entry_id: int) -> int | None:
    """The position of ``bookie_id`` in the ensemble of ``entry_id``'s fragment if it is
    in that entry's write set, else None."""
    ensemble = md.ensemble_for(entry_id)
    if bookie_id not in ensemble:
        return None
    index = ensemble.index(bookie_id)
    if index not in write_set(entry_id, md.ensemble_size, md.write_quorum):
        return None
    return index


def reported_failures(md: LedgerMetadata,
                      reported: Mapping[str, Collection[tuple[int, int]]], *,
                      open_fragment: bool = False) -> set[tuple[int, int]]:
    """The ``(fragment first entry, index)`` pairs of final fragments whose bookie was
    reported missing entries it should hold there (``reported``: bookie id to ranges
    ``(first, last)`` of entry ids). Reports that no longer apply to ``md`` are
    dropped. ``open_fragment``: an open ledger's last fragment counts too, with no end
    (a scrubber reports it up to the LAC it knew; a report there is a copy lost in the
    fragment still being written, which the worker must heal before calling the ledger
    whole)."""
    out: set[tuple[int, int]] = set()
    if not reported:
        return out
    end = md.last_entry_id if md.is_closed else None
    for frag in fragments(md):
        if frag.final:
            last = frag.last if end is None else min(frag.last, end)
        elif open_fragment:
            last = max((b for ranges in reported.values() for _, b in ranges), default=-1)
        else:
            continue
        if last < frag.first:
            continue
        for bookie, ranges in reported.items():
            if bookie not in frag.ensemble:
                continue
            index = frag.ensemble.index(bookie)
            for a, b in ranges:
                a, b = max(a, frag.first), min(b, last)
                if a <= b and next(_runs(a, b, md.ensemble_size, md.write_quorum, index), None):
                    out.add((frag.first, index))
                    break
    return out


def reported_in_open_fragment(md: LedgerMetadata,
                              reported: Mapping[str, Collection[tuple[int, int]]]
                              ) -> set[int]:
    """The indexes of an open ledger's last ensemble whose bookie was reported missing
    entries it should hold in that fragment: lost copies there, to be healed as for a
    lost bookie (a bounded ledger closed after the grace period, an unbounded one's
    fragment split at its LAC) before the ledger counts as whole. Empty for a closed
    ledger."""
    if md.is_closed:
        return set()
    first = md.last_ensemble[0]
    return {i for f, i in reported_failures(md, reported, open_fragment=True) if f == first}


class MissingRanges:
    """Ranges of missing entry ids, fed ``(entry id, present)`` in the order a pass
    checks them, in constant memory per range: a range ends at the next entry found
    present (entries a sample skipped inside a range count as missing with it). Past
    ``cap`` ranges a new one is joined to the last (an overestimate, never less)."""

    def __init__(self, cap: int = 4096) -> None:
        self.cap = cap
        self.ranges: list[tuple[int, int]] = []
        self.missing = 0
        self._open = False

    def add(self, entry_id: int, present: bool) -> None:
        if present:
            self._open = False
            return
        self.missing += 1
        if self._open or (self.ranges and len(self.ranges) >= self.cap):
            self.ranges[-1] = (self.ranges[-1][0], entry_id)
        else:
            self.ranges.append((entry_id, entry_id))
        self._open = True


def missing_ranges(checked: Iterable[tuple[int, bool]]) -> list[tuple[int, int]]:
    """``MissingRanges`` over a whole sequence."""
    collector = MissingRanges()
    for e, present in checked:
        collector.add(e, present)
    return collector.ranges
