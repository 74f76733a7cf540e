"""Durability debt: how many acknowledged entries have fewer than Qw copies, as numbers.

Pure (no trio, no I/O). The auditor (``appliance.durability``) and ``ledgerd shell
durability`` feed it the ledgers' metadata, the registered bookies, the LAC of open
ledgers that need one, and the underreplication queue; it returns one ``LedgerDebt``
per ledger and a ``DurabilityReport`` over all of them.

**Copies of an entry.** Entry ``e`` of a fragment should be on the Qw bookies of its
write set ``{(e + k) % E | k < Qw}``. A copy is missing when that bookie is not
registered (writable or read-only), or when a scrubber (``appliance.scrubber``)
reported it missing there (as ranges of entry ids: a bookie that lost a whole ledger
reports one range per fragment). Entries are counted by residue class ``e % E`` (every
entry of a class has the same write set), in pieces cut where a reported range starts
or ends, so a fragment of a billion entries costs E steps per piece.

- *below Qw*: fewer copies than Qw; *single copy*: exactly one (held by one bookie
  only); *no copy*: none registered (lost unless a bookie comes back).
- An open ledger's last fragment counts up to the LAC the caller read; when it could
  not be read, the fragment's extent is unknown: the ledger is short, with no count.
- A queue record naming a registered bookie without entry ids (the auditor's
  first/last probe, ``ledgerd audit --mark``) is a shortfall of unknown extent too.
- Bytes are entries times the ledger's mean entry size (its length over its entries:
  the metadata's for a closed ledger, the LAC entry's for an open one).

**Marked and short must agree.** A ledger *needs a mark* when it is short or its
metadata still names a bookie that is gone (even in an empty fragment: the workers
replace those too). ``unmarked`` lists ledgers that need a mark and have none (debt
nobody works on: the lost-bookie delay, or a bug); ``stale_marks`` lists marked
ledgers that need none. Both empty means the queue and the metadata agree.

**Time to full redundancy** (``RepairRate``): the debt's bytes sampled over a sliding
window; while it falls, the estimate is the debt over the rate it falls at. While it
does not fall there is no estimate (None): copying is stalled or losses outrun it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from ledgerd.machines.checker import fragments
from ledgerd.machines.quorum import write_set
from ledgerd.metadata.ledger import LedgerMetadata

__all__ = ["DurabilityReport", "LedgerDebt", "RepairRate", "ledger_debt", "mean_entry_bytes",
           "summarize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerDebt:
    ledger_id: int
    entries_below_qw: int = 0
    entries_single_copy: int = 0
    entries_no_copy: int = 0
    bytes_below_qw: float = 0.0
    bytes_single_copy: float = 0.0
    unknown_extent: bool = False      # short by an amount nobody could count
    references_lost: bool = False     # the metadata names a bookie that is gone
    lost_bookies: tuple[str, ...] = ()

    @property
    def is_short(self) -> bool:
        return self.entries_below_qw > 0 or self.unknown_extent

    @property
    def needs_mark(self) -> bool:
        return self.is_short or self.references_lost


def mean_entry_bytes(md: LedgerMetadata, lac: int = -1, length_at_lac: int = 0) -> float:
    """A ledger's mean entry size: its length over its entries (closed: the metadata's;
    open: the cumulative length carried by its LAC entry). 0 when nothing is known."""
    if md.is_closed:
        n = md.last_entry_id + 1
        return md.length / n if n > 0 else 0.0
    return length_at_lac / (lac + 1) if lac >= 0 and length_at_lac > 0 else 0.0


def _in_class(first: int, last: int, modulus: int, residue: int) -> int:
    """How many ``e`` in ``first..last`` have ``e % modulus == residue``."""
    if last < first:
        return 0
    return (last - residue) // modulus - (first - 1 - residue) // modulus


def ledger_debt(ledger_id: int, md: LedgerMetadata, available: Collection[str], *,
                lac: int | None = None,
                reported: Mapping[str, Collection[tuple[int, int]]] | None = None,
                reported_unknown: Collection[str] = (),
                entry_bytes: float = 0.0) -> LedgerDebt:
    """One ledger's debt (see the module docstring).

    ``lac``: an open ledger's last confirmed entry (None: not known; only needed when
    its last fragment is short). ``reported``: bookie id to ranges ``(first, last)``
    in which every entry that bookie should hold was reported missing there; ``reported_unknown``: registered bookies reported missing something
    unspecified. ``entry_bytes``: the mean entry size (``mean_entry_bytes``)."""
    e_size, qw = md.ensemble_size, md.write_quorum
    reported = reported or {}
    below = single = none = 0
    unknown = False
    lost: set[str] = set()
    for frag in fragments(md, lac if lac is not None else -1):
        gone = {i for i, b in enumerate(frag.ensemble) if b not in available}
        lost.update(frag.ensemble[i] for i in gone)
        if not frag.final and lac is None and (gone or any(
                b in reported_unknown for b in frag.ensemble)):
            unknown = True  # an open fragment of unknown extent lacks a copy
            continue
        last = min(frag.last, md.last_entry_id) if md.is_closed else frag.last
        if last < frag.first:
            continue  # no entries (a closed ledger may end before its last fragment)
        # The fragment is cut where a reported range starts or ends; within a piece
        # the reporting bookies are the same, so copies go by residue class again.
        reporters: list[tuple[int, int, int]] = []  # (first, last, index)
        for bookie, ranges in reported.items():
            if bookie not in frag.ensemble:
                continue
            index = frag.ensemble.index(bookie)
            if index in gone:
                continue  # counted already: the bookie is gone
            for a, b in ranges:
                a, b = max(a, frag.first), min(b, last)
                if a <= b:
                    reporters.append((a, b, index))
        cuts = sorted({frag.first, last + 1} | {a for a, _, _ in reporters}
                      | {b + 1 for _, b, _ in reporters})
        counts: dict[int, int] = {}
        for lo, hi in pairwise(cuts):
            lacking = {i for a, b, i in reporters if a <= lo and hi - 1 <= b}
            for r in range(e_size):
                n = _in_class(lo, hi - 1, e_size, r)
                if n:
                    c = sum(1 for i in write_set(r, e_size, qw)
                            if i not in gone and i not in lacking)
                    counts[c] = counts.get(c, 0) + n
        if any(b in reported_unknown and frag.ensemble.index(b) not in gone
               for b in frag.ensemble):
            unknown = True
        below += sum(n for c, n in counts.items() if c < qw)
        single += counts.get(1, 0)
        none += counts.get(0, 0)
    return LedgerDebt(ledger_id=ledger_id, entries_below_qw=below, entries_single_copy=single,
                      entries_no_copy=none, bytes_below_qw=below * entry_bytes,
                      bytes_single_copy=single * entry_bytes, unknown_extent=unknown,
                      references_lost=bool(lost), lost_bookies=tuple(sorted(lost)))


@dataclass(frozen=True, slots=True, kw_only=True)
class DurabilityReport:
    ledgers: int = 0
    short_ledgers: int = 0
    marked_ledgers: int = 0
    entries_below_qw: int = 0
    bytes_below_qw: float = 0.0
    entries_single_copy: int = 0
    bytes_single_copy: float = 0.0
    entries_no_copy: int = 0
    unknown_extent_ledgers: int = 0
    oldest_underreplicated_age_s: float | None = None
    unmarked: tuple[int, ...] = ()
    stale_marks: tuple[int, ...] = ()
    repair_rate_bytes_per_s: float | None = None
    eta_s: float | None = None
    short: tuple[int, ...] = field(default=())

    @property
    def agrees(self) -> bool:
        """The queue and the metadata agree: every ledger needing a mark has one, and
        no mark is stale."""
        return not self.unmarked and not self.stale_marks

    def to_json(self) -> dict[str, Any]:
        return {
            "ledgers": self.ledgers, "short_ledgers": self.short_ledgers,
            "marked_ledgers": self.marked_ledgers,
            "entries_below_qw": self.entries_below_qw,
            "bytes_below_qw": round(self.bytes_below_qw),
            "entries_single_copy": self.entries_single_copy,
            "bytes_single_copy": round(self.bytes_single_copy),
            "entries_no_copy": self.entries_no_copy,
            "unknown_extent_ledgers": self.unknown_extent_ledgers,
            "oldest_underreplicated_age_s": self.oldest_underreplicated_age_s,
            "repair_rate_bytes_per_s": self.repair_rate_bytes_per_s,
            "eta_s": self.eta_s, "agrees": self.agrees,
            "short": list(self.short), "unmarked": list(self.unmarked),
            "stale_marks": list(self.stale_marks)}


def summarize(debts: Iterable[LedgerDebt], marks: Mapping[int, int], *, now_ms: int,
              rate: RepairRate | None = None) -> DurabilityReport:
    """Totals over ``debts``; ``marks``: ledger id to the queue record's ctime (ms)."""
    n = short = unknown = below = single = none = 0
    b_below = b_single = 0.0
    short_ids: list[int] = []
    need: set[int] = set()
    for d in debts:
        n += 1
        below += d.entries_below_qw
        single += d.entries_single_copy
        none += d.entries_no_copy
        b_below += d.bytes_below_qw
        b_single += d.bytes_single_copy
        unknown += d.unknown_extent
        if d.is_short:
            short += 1
            short_ids.append(d.ledger_id)
        if d.needs_mark:
            need.add(d.ledger_id)
    oldest = (max(0.0, (now_ms - min(marks.values())) / 1000) if marks else None)
    eta = rate.eta(b_below, below) if rate is not None else None
    return DurabilityReport(
        ledgers=n, short_ledgers=short, marked_ledgers=len(marks), entries_below_qw=below,
        bytes_below_qw=b_below, entries_single_copy=single, bytes_single_copy=b_single,
        entries_no_copy=none, unknown_extent_ledgers=unknown,
        oldest_underreplicated_age_s=oldest, unmarked=tuple(sorted(need - set(marks))),
        stale_marks=tuple(sorted(set(marks) - need)),
        repair_rate_bytes_per_s=rate.rate() if rate is not None else None, eta_s=eta,
        short=tuple(sorted(short_ids)))


class RepairRate:
    """How fast the debt falls, from samples over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 600.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._samples: deque[tuple[float, float, int]] = deque()

    def observe(self, now: float, debt_bytes: float, debt_entries: int) -> None:
        self._samples.append((now, debt_bytes, debt_entries))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def _fall(self, k: int) -> float | None:
        if len(self._samples) < 2:
            return None
        t0, t1 = self._samples[0][0], self._samples[-1][0]
        fall = self._samples[0][k] - self._samples[-1][k]
        if t1 <= t0 or fall <= 0:
            return None
        return float(fall / (t1 - t0))

    def rate(self) -> float | None:
        """Bytes per second the debt fell at over the window (None: it did not fall)."""
        return self._fall(1)

    def eta(self, debt_bytes: float, debt_entries: int) -> float | None:
        """Seconds to no debt at the current rate: 0 with no debt, None when the debt
        is not falling. Entries stand in for bytes when no sizes are known."""
        if debt_entries <= 0 and debt_bytes <= 0:
            return 0.0
        if debt_bytes > 0:
            r = self._fall(1)
            return debt_bytes / r if r else None
        r = self._fall(2)
        return debt_entries / r if r else None
