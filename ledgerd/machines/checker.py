"""The ledger checker: which fragments of a ledger lack which bookie, and how to copy them.

Pure (no trio, no I/O), as BookKeeper's LedgerChecker and LedgerFragmentReplicator
decide it:

- A ledger's fragments are its ensembles' entry ranges. A fragment is *final* when its
  range can no longer change: every fragment of a closed ledger, and every fragment but
  the last of an open one. Only final fragments are copied; an open ledger's last
  fragment is first closed by recovery (the worker waits a grace period for its writer).
- Bookie ``i`` of a fragment must hold the entries whose write set contains ``i``
  (``stored_runs``). It *lacks* them when it is gone (not registered), or when a probe
  of the first and last entry it should hold (``probes``) does not answer OK.
- Copying bookie ``i``'s entries to a replacement reads each entry from another member
  of its write set (``copy_batches`` cuts the entries into runs that one source holds
  whole, so each run is one ReadRange and one multi-entry RECOVERY_ADD).
- An unbounded ledger is never closed, so its open fragment is healed where it stands:
  its entries up to a LAC the bookies hold are copied and split off as a final fragment
  (``changes.split_open_fragment``). ``entries_below_qw`` counts what is still short of
  Qw copies (final fragments, and the open one up to a known LAC): a ledger is reported
  whole only when it is 0.
- An unbounded ledger left IN_RECOVERY (``takeover_unfinished``: a takeover raised its
  term and never opened it) accepts no split: only a new takeover moves it on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata, LedgerState

__all__ = ["CopyBatch", "Fragment", "Probe", "bad_fragments", "copy_batches",
           "entries_below_qw", "fragments", "last_fragment_at_risk", "probes", "stored_runs",
           "takeover_unfinished"]


@dataclass(frozen=True, slots=True)
class Fragment:
    """Entries ``first..last`` of one ensemble (``last < first``: empty). ``final``: the
    range can no longer change."""

    first: int
    last: int
    ensemble: tuple[str, ...]
    final: bool

    @property
    def empty(self) -> bool:
        return self.last < self.first


@dataclass(frozen=True, slots=True)
class Probe:
    """Read these entries from bookie ``index`` of the fragment starting at ``first``."""

    first: int
    index: int
    bookie: str
    entries: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CopyBatch:
    """Entries ``first..last``, each held by every bookie in ``sources`` (in preference
    order)."""

    first: int
    last: int
    sources: tuple[str, ...]

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def fragments(md: LedgerMetadata, lac: int = -1) -> list[Fragment]:
    """The ledger's fragments; an open ledger's last one reaches ``lac`` (not final)."""
    out = []
    for i, (first, bookies) in enumerate(md.ensembles):
        if i + 1 < len(md.ensembles):
            out.append(Fragment(first, md.ensembles[i + 1][0] - 1, bookies, True))
        elif md.is_closed:
            out.append(Fragment(first, md.last_entry_id, bookies, True))
        else:
            out.append(Fragment(first, max(lac, first - 1), bookies, False))
    return out


def stored_runs(first: int, last: int, ensemble_size: int, write_quorum: int,
                index: int) -> list[tuple[int, int]]:
    """The runs of consecutive entries in ``first..last`` whose write set holds
    ``index``: all of them when Qw == E; otherwise bookie ``i`` holds the Qw entries
    starting at each ``e`` with ``e % E == (i - Qw + 1) % E``."""
    if first > last:
        return []
    if write_quorum == ensemble_size:
        return [(first, last)]
    e, qw = ensemble_size, write_quorum
    start = first - (first - (index - qw + 1)) % e  # the run start at or before first
    runs = []
    while start <= last:
        a, b = max(first, start), min(last, start + qw - 1)
        if a <= b:
            runs.append((a, b))
        start += e
    return runs


def bad_fragments(md: LedgerMetadata, available: Collection[str],
                  failed_probes: Iterable[tuple[int, int]] = ()) -> dict[int, set[int]]:
    """``{fragment first entry: bad indexes}`` over the final fragments: an index is bad
    when its bookie is not ``available`` or one of its probes failed (``failed_probes``
    holds ``(fragment first, index)``). A bookie that should hold nothing of a fragment
    (an empty one) is still replaced, so that no metadata references it any more."""
    failed = set(failed_probes)
    out: dict[int, set[int]] = {}
    for frag in fragments(md):
        if not frag.final:
            continue
        bad = {i for i, b in enumerate(frag.ensemble)
               if b not in available or (frag.first, i) in failed}
        if bad:
            out[frag.first] = bad
    return out


def last_fragment_at_risk(md: LedgerMetadata, available: Collection[str]) -> bool:
    """An open ledger whose last ensemble holds a bookie that is gone (its writer, if
    alive, should change ensemble; if not, recovery must close the ledger)."""
    return not md.is_closed and any(b not in available for b in md.last_ensemble[1])


def takeover_unfinished(md: LedgerMetadata) -> bool:
    """An unbounded ledger IN_RECOVERY: a takeover raised its term (in the
    metadata first) and never opened it: refused by the bookies, or its leader died or
    was cancelled. Terms never go back, so it stays so until the next takeover; no
    writer can change it meanwhile, and its open fragment cannot be split."""
    return md.unbounded and md.state is LedgerState.IN_RECOVERY


def entries_below_qw(md: LedgerMetadata, available: Collection[str], lac: int = -1,
                     failed_probes: Iterable[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of entries some member of their write set lacks (a
    bookie not ``available``, or a failed probe), merged: every final fragment, and an
    open ledger's last fragment up to ``lac`` (the entries known acknowledged). Empty
    means every entry is at Qw."""
    failed = set(failed_probes)
    runs: list[tuple[int, int]] = []
    for frag in fragments(md, lac):
        for i, bookie in enumerate(frag.ensemble):
            if bookie not in available or (frag.first, i) in failed:
                runs.extend(stored_runs(frag.first, frag.last, md.ensemble_size,
                                        md.write_quorum, i))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def probes(md: LedgerMetadata, available: Collection[str]) -> list[Probe]:
    """The cheap check of the final fragments: the first and last entry each available
    bookie should hold (a bookie that is gone needs no probe: it is bad already)."""
    out = []
    for frag in fragments(md):
        if not frag.final or frag.empty:
            continue
        for i, bookie in enumerate(frag.ensemble):
            if bookie not in available:
                continue
            runs = stored_runs(frag.first, frag.last, md.ensemble_size, md.write_quorum, i)
            if runs:
                ends = sorted({runs[0][0], runs[-1][1]})
                out.append(Probe(frag.first, i, bookie, tuple(ends)))
    return out


def copy_batches(frag: Fragment, index: int, ensemble_size: int, write_quorum: int,
                 bad: Collection[int], batch_size: int,
                 prefer: Mapping[str, int] | None = None) -> list[CopyBatch]:
    """Bookie ``index``'s entries of ``frag``, cut into batches of at most
    ``batch_size`` consecutive entries that one source holds whole. Sources are the
    other members of each entry's write set, good ones first (``bad`` indexes last, in
    case they still answer); ``prefer`` ranks bookies (lower first) to spread reads."""
    rank = prefer or {}
    out: list[CopyBatch] = []
    for a, b in stored_runs(frag.first, frag.last, ensemble_size, write_quorum, index):
        e = a
        while e <= b:
            common = set(write_set(e, ensemble_size, write_quorum)) - {index}
            end = e
            while end < b and end - e + 1 < batch_size:
                nxt = common & set(write_set(end + 1, ensemble_size, write_quorum))
                if not nxt - set(bad) and common - set(bad):
                    break  # the next entry would leave no good common source
                if not nxt:
                    break
                common = nxt
                end += 1
            members = sorted(common, key=lambda i: (i in bad, rank.get(frag.ensemble[i], 0), i))
            out.append(CopyBatch(e, end, tuple(frag.ensemble[i] for i in members)))
            e = end + 1
    return out
