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
  use, and drops what no longer applies (the bookie was replaced in that fragment, the
  entry is past the end, or the fragment is still open).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from ledgerd.machines.checker import fragments, stored_runs
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata

__all__ = ["HeldRun", "expected_count", "expected_runs", "holder_index", "missing_ranges",
           "reported_failures", "sample"]


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


def expected_runs(md: LedgerMetadata, bookie_id: str, lac: int = -1) -> list[HeldRun]:
    """Every run of entries ``bookie_id`` should hold, in entry order. ``lac``: the last
    entry known confirmed, bounding an open ledger's last fragment (ignored when the
    ledger is closed)."""
    out: list[HeldRun] = []
    for frag in fragments(md, lac):
        last = min(frag.last, md.last_entry_id) if md.is_closed else frag.last
        if last < frag.first:
            continue
        for index, bookie in enumerate(frag.ensemble):
            if bookie != bookie_id:
                continue
            for a, b in stored_runs(frag.first, last, md.ensemble_size,
                                    md.write_quorum, index):
                out.append(HeldRun(frag.first, index, a, b, frag.final))
    return out


def expected_count(runs: Collection[HeldRun]) -> int:
    return sum(r.count for r in runs)


def sample(runs: Collection[HeldRun], percentage: float,
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
                      reported: Mapping[str, Collection[tuple[int, int]]]
                      ) -> set[tuple[int, int]]:
    """The ``(fragment first entry, index)`` pairs of final fragments whose bookie was
    reported missing entries it should hold there (``reported``: bookie id to ranges
    ``(first, last)`` of entry ids). Reports that no longer apply to ``md`` are
    dropped."""
    out: set[tuple[int, int]] = set()
    if not reported:
        return out
    end = md.last_entry_id if md.is_closed else None
    for frag in fragments(md):
        last = frag.last if end is None else min(frag.last, end)
        if not frag.final or last < frag.first:
            continue
        for bookie, ranges in reported.items():
            if bookie not in frag.ensemble:
                continue
            index = frag.ensemble.index(bookie)
            for a, b in ranges:
                a, b = max(a, frag.first), min(b, last)
                if a <= b and stored_runs(a, b, md.ensemble_size, md.write_quorum, index):
                    out.add((frag.first, index))
                    break
    return out


def missing_ranges(checked: Iterable[tuple[int, bool]]) -> list[tuple[int, int]]:
    """``(entry id, present)`` in the order a pass checked them, to ranges of missing
    ids: a range ends at the next entry found present (entries the sample skipped
    inside a range count as missing with it)."""
    out: list[tuple[int, int]] = []
    start = prev = None
    for e, present in checked:
        if present:
            if start is not None and prev is not None:
                out.append((start, prev))
            start = prev = None
        else:
            start = e if start is None else start
            prev = e
    if start is not None and prev is not None:
        out.append((start, prev))
    return out
