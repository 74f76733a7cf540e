"""The writer's side of a ledger as a pure state machine: no I/O, time passed in.

The caller (the trio handle, or the simulator) asks the machine what to do and feeds back
what happened; every method returns a list of effects to carry out:

- ``SendAdd(entry_id, index, bookie)``: send entry ``entry_id`` to that bookie;
- ``ChangeEnsemble(first_entry_id, failed)``: pick replacements for the failed indexes
  and CAS the metadata (``with_ensemble``), then call ``ensemble_changed`` or
  ``ensemble_change_failed``;
- ``Completed(entry_ids, lac)``: these appends are durable, in entry order;
- ``Failed(reason, error)``: the handle is dead; every pending append fails.

Rules (BookKeeper's ``PendingAddOp`` and ensemble change):
- entry ``e`` goes to the write set ``(e + i) % E``, ``i < Qw``, of the last ensemble;
- it is complete at Qa acks; completions are reported strictly in entry order, so the
  LAC (last add confirmed) is the end of the completed prefix;
- an error other than FENCED/UNAUTHORIZED, or no answer within ``add_timeout``, starts
  an ensemble change from LAC + 1; no completion is reported while it runs; once the
  metadata CAS succeeds, pending adds are re-sent to the replacement bookies (their
  acks from the replaced bookie no longer count);
- a failure (or timeout) of a bookie for an entry already complete at Qa still starts
  an ensemble change (BookKeeper's ``notifyWriteFailed``): the entries after the LAC go
  to a replacement, and the completed ones it missed are re-replication's to copy; a
  writer that ignored it would keep every later entry at Qw - 1 copies;
- FENCED or UNAUTHORIZED fails the handle (another client is recovering the ledger, or
  the password is wrong); a CAS that finds the ledger CLOSED or IN_RECOVERY fails it too.
- INVALID_TERM (unbounded ledgers) fails the handle with ``FailureKind.TERM``: another
  writer took the ledger over; it is never a reason for an ensemble change.

Unbounded ledgers add two rules (BookKeeper's TLA+ spec, "guaranteed write quorum"):

- ``guaranteed_write_quorum``: an entry completes at Qa as before, but it stays tracked
  until its whole write set has it; an ensemble change starts from the LAFR + 1 (last
  add fully replicated) instead of LAC + 1, and re-sends every tracked entry to the
  replacement, so every fragment but the last holds each entry on its whole write set.
  ``Released`` reports the entries that reached it (drivers may drop their bytes).
- ``fragment_entries``: once the last fragment holds that many entries, the next entry
  waits until everything before it is fully replicated, then opens a new fragment
  (``ChangeEnsemble`` with no failed bookie: the driver picks a fresh ensemble).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

from ledgerd.machines.quorum import check_quorums, write_set
from ledgerd.wire.status import Status

__all__ = ["ChangeEnsemble", "Completed", "Effect", "Failed", "FailureKind", "LedgerWriter",
           "Released", "SendAdd", "SendAdds"]


class FailureKind(enum.Enum):
    FENCED = "fenced"            # another client fenced the ledger (recovery)
    CLOSED = "closed"            # metadata says CLOSED
    UNAUTHORIZED = "unauthorized"
    NO_BOOKIES = "no_bookies"    # an ensemble change found no replacement
    METADATA = "metadata"        # the metadata store failed
    UNAVAILABLE = "unavailable"  # too few bookies answered to decide (recovery)
    TERM = "term"                # another writer raised the term (unbounded ledgers)
    CORRUPT = "corrupt"          # replicas disagree, or fail the checks that need no key


@dataclass(frozen=True, slots=True)
class SendAdd:
    entry_id: int
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class SendAdds:
    """``SendAdd`` for several entries to one bookie (``append_many``'s batch)."""

    entry_ids: tuple[int, ...]
    index: int
    bookie: str


@dataclass(frozen=True, slots=True)
class ChangeEnsemble:
    first_entry_id: int
    failed: dict[int, str]  # index -> bookie being replaced


@dataclass(frozen=True, slots=True)
class Completed:
    entry_ids: tuple[int, ...]
    lac: int


@dataclass(frozen=True, slots=True)
class Failed:
    kind: FailureKind
    reason: str
    entry_ids: tuple[int, ...]  # pending appends that fail with the handle


@dataclass(frozen=True, slots=True)
class Released:
    """Entries complete earlier that now reached their whole write set (GWQ mode)."""

    entry_ids: tuple[int, ...]


Effect = SendAdd | SendAdds | ChangeEnsemble | Completed | Failed | Released


def _mask(indexes: Iterable[int]) -> int:
    """A set of ensemble indexes as a bit mask (bit ``i`` for index ``i``)."""
    m = 0
    for i in indexes:
        m |= 1 << i
    return m


def _indexes(mask: int) -> list[int]:
    """The ensemble indexes of a bit mask, ascending."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


class _Pending:
    """One entry not yet complete (a plain slotted class: one is made per append).

    ``acks`` and ``waiting`` are bit masks of ensemble indexes (bit ``i`` for index
    ``i``): cheaper than two sets per append on ``append_many``'s path."""

    __slots__ = ("acks", "entry_id", "length", "sent", "sent_at", "waiting")

    def __init__(self, entry_id: int, length: int, sent_at: float, waiting: int = 0,
                 sent: bool = False) -> None:
        self.entry_id = entry_id
        self.length = length
        self.sent_at = sent_at
        self.acks = 0             # indexes that acknowledged
        self.waiting = waiting    # indexes sent to, not answered
        self.sent = sent


class LedgerWriter:
    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int,
                 ensemble: Sequence[str], *, last_add_confirmed: int = -1, length: int = 0,
                 add_timeout: float = 5.0, complete_out_of_order: bool = False,
                 guaranteed_write_quorum: bool = False, fragment_first: int = 0,
                 fragment_entries: int = 0) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        if len(ensemble) != ensemble_size:
            raise ValueError(f"ensemble has {len(ensemble)} bookies, expected {ensemble_size}")
        self.e, self.qw, self.qa = ensemble_size, write_quorum, ack_quorum
        # Entry e's write set depends only on e % E: computed once, not per entry.
        self._sets = tuple(write_set(i, ensemble_size, write_quorum)
                           for i in range(ensemble_size))
        self._masks = tuple(_mask(ws) for ws in self._sets)
        self.ensemble = list(ensemble)
        self.lac = last_add_confirmed
        self.last_pushed = last_add_confirmed
        self.length = length
        self.add_timeout = add_timeout
        self.pending: dict[int, _Pending] = {}
        # Complete entries some bookie of the write set has not answered yet.
        self.lagging: dict[int, _Pending] = {}
        self.changing: dict[int, str] | None = None  # failed indexes during a change
        self.queued_failures: dict[int, str] = {}
        self.failed: FailureKind | None = None
        self.lengths: dict[int, int] = {}  # cumulative length per pending entry
        # Mutation switch for the simulator's self-test only: report an entry complete
        # as soon as it has Qa acks, even before earlier entries.
        self._out_of_order = complete_out_of_order
        self.gwq = guaranteed_write_quorum
        self.fragment_first = fragment_first
        self.fragment_entries = fragment_entries
        self.rotate_at = -1  # the entry that opens a new fragment, waiting to (-1: none)
        self._lagging_unordered = complete_out_of_order
        self.pinned: set[int] = set()  # failed bookies that cannot be replaced yet (GWQ)
        self.change_from = 0           # the first entry of the change in progress
        self.reserved = 0  # ids handed out by ``reserve`` that no append has taken yet

    # -- appends ---------------------------------------------------------------------

    def reserve(self) -> int:
        """Hand out the id of an append to come, before it is made: the next appends
        take the reserved ids first, in order (a driver that gathers entries to append
        them in one ``append_many`` answers each with its id at once). Nothing is sent
        and no state but the count changes; a failed handle's reservations lapse."""
        eid = self.last_pushed + 1 + self.reserved
        self.reserved += 1
        return eid

    def append(self, length: int, now: float) -> tuple[int, list[Effect]]:
        """Allocate the next entry id (a reserved one first); returns it with the sends
        to make.

        The caller encodes the entry (its LAC field is ``self.lac`` at this moment and
        its cumulative length ``self.lengths[entry_id]``)."""
        if self.failed is not None:
            raise RuntimeError(f"ledger handle failed: {self.failed.value}")
        if self.reserved:
            self.reserved -= 1
        self.last_pushed += 1
        eid = self.last_pushed
        previous = self.lengths.get(eid - 1, self.length)
        self.lengths[eid] = previous + length
        p = _Pending(eid, length, now)
        self.pending[eid] = p
        effects: list[Effect] = []
        if (self.fragment_entries and self.rotate_at < 0 and self.changing is None
                and eid - self.fragment_first >= self.fragment_entries):
            self.rotate_at = eid
            return eid, self._maybe_rotate()
        if self.changing is None and self.rotate_at < 0:
            effects = self._send(p)
        return eid, effects

    def append_many(self, lengths: Sequence[int], now: float) -> tuple[int, list[Effect]]:
        """``append`` for ``len(lengths)`` entries at once: returns the first id and the
        sends, one ``SendAdds`` per bookie. The same state as that many ``append`` calls
        (tests/ledgerd/test_machines.py checks it), at a fraction of the per-entry cost;
        when a fragment may fill or the ensemble is changing, it is those calls."""
        if self.failed is not None:
            raise RuntimeError(f"ledger handle failed: {self.failed.value}")
        first = self.last_pushed + 1
        n = len(lengths)
        if (self.changing is not None or self.rotate_at >= 0 or (
                self.fragment_entries
                and first + n - 1 - self.fragment_first >= self.fragment_entries)):
            effects: list[Effect] = []
            for length in lengths:
                effects += self.append(length, now)[1]
            return first, effects
        pending = self.pending
        cumulative = self.lengths
        total = cumulative.get(first - 1, self.length)
        masks = self._masks
        e = self.e
        eid = first
        for length in lengths:
            total += length
            cumulative[eid] = total
            pending[eid] = _Pending(eid, length, now, masks[eid % e], True)
            eid += 1
        self.last_pushed = eid - 1
        self.reserved = max(0, self.reserved - n)
        # Each bookie's ids: the entries whose id % E puts it in the write set, one
        # stride-E range per such residue (merged in order where there are several).
        runs: dict[int, list[range]] = {}
        for r, ws in enumerate(self._sets):
            ids = range(first + (r - first) % e, eid, e)
            if ids:
                for index in ws:
                    runs.setdefault(index, []).append(ids)
        ensemble = self.ensemble
        return first, [SendAdds(tuple(rs[0]) if len(rs) == 1 else tuple(sorted(chain(*rs))),
                                index, ensemble[index])
                       for index, rs in sorted(runs.items())]

    @property
    def lafr(self) -> int:
        """Last add fully replicated (GWQ mode): every entry up to it reached its whole
        write set. Without GWQ, the last entry before any still pending."""
        low = self.last_pushed + 1
        if self.pending:  # dicts keep insertion order, and ids are inserted ascending
            low = min(low, next(iter(self.pending)))
        if self.gwq and self.lagging:
            low = min(low, min(self.lagging) if self._lagging_unordered
                      else next(iter(self.lagging)))
        return low - 1

    @property
    def published_lac(self) -> int:
        """The LAC entries carry to readers: the LAC, or with GWQ the LAFR, so that a new
        term's recovery (which starts at the highest LAC it finds) rewrites every entry
        that may not have reached its whole write set."""
        return min(self.lac, self.lafr) if self.gwq else self.lac

    def _maybe_rotate(self) -> list[Effect]:
        """Open the next fragment once every entry before ``rotate_at`` is settled."""
        if self.rotate_at < 0 or self.changing is not None or self.failed is not None:
            return []
        if self.lafr + 1 < self.rotate_at:
            return []
        self.changing = {}
        self.change_from = self.rotate_at
        return [ChangeEnsemble(self.rotate_at, {})]

    def _send(self, p: _Pending, only: set[int] | None = None) -> list[Effect]:
        p.sent = True
        out: list[Effect] = []
        for index in self._sets[p.entry_id % self.e]:
            if only is not None and index not in only:
                continue
            p.waiting |= 1 << index
            out.append(SendAdd(p.entry_id, index, self.ensemble[index]))
        return out

    # -- answers ---------------------------------------------------------------------

    def on_ack(self, entry_id: int, bookie: str, now: float) -> list[Effect]:
        return self.on_ack_run(entry_id, 1, bookie, now)

    def on_ack_run(self, first: int, count: int, bookie: str, now: float) -> list[Effect]:
        """``on_ack`` for entries ``first .. first + count - 1`` from one bookie (one
        multi-entry AddRequest's answer), completing in order once at the end."""
        return self.on_ack_entries(range(first, first + count), bookie, now)

    def on_ack_entries(self, entry_ids: Iterable[int], bookie: str,
                       now: float) -> list[Effect]:
        """``on_ack`` for each of ``entry_ids`` from one bookie (one AddRequest's answer,
        consecutive or SPARSE), completing in order once at the end."""
        pending = self.pending
        touched = False
        late = False
        failed = self.failed is not None
        e = self.e
        ensemble = self.ensemble
        # The bookie's bit in each write set (by entry id % E), 0 where it is not.
        where = [next((1 << i for i in ws if ensemble[i] == bookie), 0) for ws in self._sets]
        for entry_id in entry_ids:
            p = pending.get(entry_id)
            if p is None or failed:
                if self.lagging and self._late_answer(entry_id, bookie) is not None:
                    late = True
                continue
            bit = where[entry_id % e]
            if not bit:
                continue
            p.waiting &= ~bit
            p.acks |= bit
            touched = True
        out = self._complete_prefix() if touched else []
        if late and self.gwq:
            out += self._release()
        return out

    def on_error(self, entry_id: int, bookie: str, status: int, now: float) -> list[Effect]:
        if self.failed is not None:
            return []
        if status == Status.INVALID_TERM:
            return self._fail(FailureKind.TERM, f"bookie {bookie} holds a higher term: "
                                                "another writer took the ledger over")
        if entry_id not in self.pending:
            # A bookie failed an entry already complete at Qa: replace it for what follows.
            # (With GWQ the entry keeps waiting for it: the change re-sends it.)
            index = self._late_answer(entry_id, bookie, failed=True)
            if index is None or status in (Status.FENCED, Status.UNAUTHORIZED):
                return []  # the next add learns of a fence or a bad key
            return self._replace_or_pin(index)
        if status == Status.FENCED:
            return self._fail(FailureKind.FENCED, f"bookie {bookie} says the ledger is fenced")
        if status == Status.UNAUTHORIZED:
            return self._fail(FailureKind.UNAUTHORIZED,
                              f"bookie {bookie} answered UNAUTHORIZED")
        index = self._index_of(bookie, entry_id)
        if index is None:
            return []
        self.pending[entry_id].waiting &= ~(1 << index)
        return self._replace_or_pin(index)

    def next_deadline(self) -> float | None:
        """When ``on_timer`` has something to do: the earliest moment an unanswered add
        times out, or None while nothing waits for an answer (drivers sleep until then)."""
        if self.failed is not None:
            return None
        # Bookies already being replaced (or queued for it) time out no further.
        skip = _mask(self.changing) | _mask(self.queued_failures) if self.changing else 0
        earliest: float | None = None
        for group in (self.pending, self.lagging):
            for p in group.values():
                if p.waiting and (earliest is None or p.sent_at < earliest) and (
                        not skip or p.waiting & ~skip):
                    earliest = p.sent_at
        return None if earliest is None else earliest + self.add_timeout

    def on_timer(self, now: float) -> list[Effect]:
        """Timeouts: a bookie that has not answered an add within ``add_timeout`` failed."""
        if self.failed is not None:
            return []
        slow = 0  # a mask of indexes
        for p in self.pending.values():
            # The same expression as next_deadline, so a timer at that deadline fires.
            if p.waiting and p.sent_at + self.add_timeout <= now:
                slow |= p.waiting
        for eid, p in list(self.lagging.items()):
            if p.waiting and p.sent_at + self.add_timeout <= now:
                slow |= p.waiting
                if self.gwq:
                    p.sent_at = now  # a pinned bookie gets it again; else the change does
                else:
                    del self.lagging[eid]
        effects: list[Effect] = []
        for index in _indexes(slow):
            if self.gwq and self._is_pinned(index):
                effects += self._pin(index, now)
            else:
                effects += self._bookie_failed(index)
        return effects

    def _is_pinned(self, index: int) -> bool:
        """GWQ: the bookie at ``index`` holds a copy some acknowledged entry needs to
        count Qa copies; replaced from the LAFR, a recovery could prove that entry absent
        with the replacement's negative answer (the spec's ``BookiePinned``)."""
        qa = self.qa
        return any(p.acks >> index & 1 and p.acks.bit_count() - 1 < qa
                   for p in self.lagging.values())

    def _replace_or_pin(self, index: int) -> list[Effect]:
        """A bookie failed: replace it, unless (GWQ) it is pinned; then the timeouts send
        it again what it owes until it is no longer pinned."""
        if self.gwq and self._is_pinned(index):
            self.pinned.add(index)
            return []
        return self._bookie_failed(index)

    def _pin(self, index: int, now: float) -> list[Effect]:
        """Keep a pinned bookie: send it again what it still owes; it is replaced once
        the entries that pin it reached their whole write set."""
        self.pinned.add(index)
        bookie = self.ensemble[index]
        out: list[Effect] = []
        for group in (self.lagging, self.pending):
            for p in group.values():
                if p.waiting >> index & 1:
                    p.sent_at = now
                    out.append(SendAdd(p.entry_id, index, bookie))
        return out

    def _late_answer(self, entry_id: int, bookie: str, failed: bool = False) -> int | None:
        """A complete entry's bookie answered: it waits no more (with GWQ, a failure
        keeps it waiting for the replacement). Returns its index in the current ensemble
        (None if it was not waited for, or was replaced since)."""
        p = self.lagging.get(entry_id)
        if p is None or bookie not in self.ensemble:
            return None
        index = self.ensemble.index(bookie)  # waiting holds write-set indexes only
        bit = 1 << index
        if not p.waiting & bit:
            return None
        if failed and self.gwq:
            return index
        p.waiting &= ~bit
        p.acks |= bit
        if not p.waiting and not self.gwq:
            del self.lagging[entry_id]
        return index

    def _index_of(self, bookie: str, entry_id: int) -> int | None:
        for index in self._sets[entry_id % self.e]:
            if self.ensemble[index] == bookie:
                return index
        return None

    def _complete_prefix(self) -> list[Effect]:
        if self.changing is not None:
            return []  # no completions while the ensemble changes (BookKeeper's rule)
        done: list[int] = []
        if self._out_of_order:
            return self._complete_any()
        nxt = self.lac + 1
        gwq = self.gwq
        qa = self.qa
        while (p := self.pending.get(nxt)) is not None and p.acks.bit_count() >= qa:
            del self.pending[nxt]
            if p.waiting or gwq:
                self.lagging[nxt] = p
            self.length = self.lengths.pop(nxt)
            done.append(nxt)
            nxt += 1
        if not done:
            return []
        self.lac = done[-1]
        out: list[Effect] = [Completed(tuple(done), self.lac)]
        if gwq:
            out += self._release()
        return out

    def _release(self) -> list[Effect]:
        """GWQ: drop the front of ``lagging`` that reached its whole write set (kept till
        then: an ensemble change from the LAFR re-sends every one of them)."""
        lagging = self.lagging
        released: list[int] = []
        # During a change from F, entries from F on stay: the new bookie gets them all.
        stop = self.change_from if self.changing is not None else None
        while lagging:
            eid = next(iter(lagging))
            if lagging[eid].waiting or (stop is not None and eid >= stop):
                break
            del lagging[eid]
            released.append(eid)
        out: list[Effect] = [Released(tuple(released))] if released else []
        if self.pinned:
            for index in sorted(self.pinned):
                if self._is_pinned(index):
                    continue
                self.pinned.discard(index)
                if any(p.waiting >> index & 1 for p in self.lagging.values()) or any(
                        p.waiting >> index & 1 for p in self.pending.values()):
                    out += self._bookie_failed(index)
        if self.rotate_at >= 0:
            out += self._maybe_rotate()
        return out

    def _complete_any(self) -> list[Effect]:
        done = sorted(e for e, p in self.pending.items() if p.acks.bit_count() >= self.qa)
        for eid in done:
            if self.pending[eid].waiting:
                self.lagging[eid] = self.pending[eid]
            del self.pending[eid]
            self.length = self.lengths.pop(eid)
        if not done:
            return []
        self.lac = max(self.lac, done[-1])
        return [Completed(tuple(done), self.lac)]

    # -- ensemble change ---------------------------------------------------------------

    def _bookie_failed(self, index: int) -> list[Effect]:
        if self.changing is not None:
            if index not in self.changing:
                self.queued_failures[index] = self.ensemble[index]
            return []
        self.changing = {index: self.ensemble[index]}
        self.change_from = self.lafr + 1 if self.gwq else self.lac + 1
        return [ChangeEnsemble(self.change_from, dict(self.changing))]

    def ensemble_changed(self, first_entry_id: int, new_ensemble: Sequence[str],
                         now: float) -> list[Effect]:
        """The metadata CAS succeeded: adopt the ensemble, re-send to replaced bookies."""
        assert self.changing is not None, "no ensemble change in progress"
        replaced = {i for i in range(self.e) if new_ensemble[i] != self.ensemble[i]}
        self.ensemble = list(new_ensemble)
        self.changing = None
        self.fragment_first = max(self.fragment_first, first_entry_id)
        effects: list[Effect] = []
        if self.rotate_at == first_entry_id:
            self.rotate_at = -1
        for eid, p in list(self.lagging.items()):
            targets = replaced & set(self._sets[eid % self.e])
            if not targets:
                continue
            if self.gwq:  # the replacement gets a copy: the fragment reaches Qw
                p.acks &= ~_mask(targets)
                p.sent_at = now
                effects += self._send(p, targets)
                continue
            p.waiting &= ~_mask(targets)  # what they miss is re-replication's to copy
            if not p.waiting:
                del self.lagging[eid]
        for p in sorted(self.pending.values(), key=lambda q: q.entry_id):
            if not p.sent:  # appended during the change (or while a fragment filled)
                if (self.rotate_at < 0 and self.fragment_entries
                        and p.entry_id - self.fragment_first >= self.fragment_entries):
                    self.rotate_at = p.entry_id  # the new fragment is full already
                if 0 <= self.rotate_at <= p.entry_id:
                    continue  # waits for the new fragment
                p.sent_at = now
                effects += self._send(p)
                continue
            targets = replaced & set(write_set(p.entry_id, self.e, self.qw))
            if targets:
                tmask = _mask(targets)
                p.acks &= ~tmask
                p.waiting &= ~tmask
                p.sent_at = now
                effects += self._send(p, targets)
        effects += self._complete_prefix()
        if self.gwq:
            effects += self._release()
        if self.queued_failures:
            queued = {i: b for i, b in self.queued_failures.items() if self.ensemble[i] == b}
            self.queued_failures = {}
            for index in sorted(queued):  # pinned now? (the change moved acks)
                effects += self._replace_or_pin(index)
        if self.rotate_at >= 0:
            effects += self._maybe_rotate()
        return effects

    def ensemble_change_failed(self, kind: FailureKind, reason: str) -> list[Effect]:
        return self._fail(kind, reason)

    def _fail(self, kind: FailureKind, reason: str) -> list[Effect]:
        if self.failed is not None:
            return []
        self.failed = kind
        self.reserved = 0
        ids = tuple(sorted(self.pending))
        self.pending.clear()
        self.lagging.clear()
        return [Failed(kind, reason, ids)]

    # -- close -------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return not self.pending and self.changing is None
