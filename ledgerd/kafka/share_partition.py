"""A share group's view of one partition (KIP-932): which record goes to whom, and when.

Pure state: the gateway (``share_server.py``) gives it the batches it read, the member
and the clock, and stores what :meth:`SharePartition.state` returns.

Every offset below ``start`` (Kafka's share-partition start offset, SPSO) is done; from
``end`` on nothing has been handed out yet. An offset in between is one of:

- AVAILABLE: may be acquired (again);
- ACQUIRED: locked to one member until its deadline (``lock_s``); the member
  acknowledges it, or the lock runs out and it is AVAILABLE again;
- ACKNOWLEDGED: accepted by a member, done;
- ARCHIVED: done without delivery: rejected, delivered ``delivery_limit`` times, or no
  record for the group (a control batch; an aborted transaction's record under
  read_committed; an offset compaction emptied, acknowledged as a gap).

An offset a batch does not cover (a batch compaction removed whole) is done too: it is
never in ``slots``. Acquisition is by whole batches, as Kafka's: the client drops the
records it was not given and answers GAP for offsets without one.

The in-flight window (``end - start``) is bounded by ``max_locks`` (Kafka's
``group.share.partition.max.record.locks``): no new offset is acquired while it is full,
except to finish the batch it began.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ledgerd.kafka.api import ErrorCode

__all__ = ["AckType", "Acquired", "BatchView", "RecordState", "SharePartition",
           "ShareSettings", "ShareState"]


class RecordState(enum.IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(enum.IntEnum):
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(frozen=True, slots=True)
class ShareSettings:
    lock_s: float = 30.0  # share.record.lock.duration.ms
    delivery_limit: int = 5  # share.delivery.count.limit
    max_locks: int = 2000  # group.share.partition.max.record.locks


@dataclass(frozen=True, slots=True)
class BatchView:
    """What acquisition needs of one batch the gateway read."""

    base: int
    last: int
    deliverable: bool  # False: a control batch, or aborted and read_committed


@dataclass(frozen=True, slots=True)
class Acquired:
    """A run of offsets handed to a member (ShareFetch's AcquiredRecords)."""

    first: int
    last: int
    count: int  # delivery count


@dataclass(frozen=True, slots=True)
class ShareState:
    """What outlives the gateway: the start and the runs of offsets past it that are
    not plain new ones (an ACQUIRED offset is kept as AVAILABLE with its count)."""

    start: int
    runs: tuple[tuple[int, int, int, int], ...] = ()  # (first, last, state, count)

    def to_doc(self) -> dict[str, object]:
        return {"start": self.start, "runs": [list(r) for r in self.runs]}

    @classmethod
    def from_doc(cls, doc: object) -> ShareState:
        if not isinstance(doc, dict) or not isinstance(doc.get("start"), int) \
                or doc["start"] < 0:
            raise ValueError(f"share partition state: no valid start in {doc!r}")
        runs = []
        prev = doc["start"] - 1
        for run in doc.get("runs", ()):
            if not (isinstance(run, list) and len(run) == 4
                    and all(isinstance(x, int) for x in run)):
                raise ValueError(f"share partition state: malformed run {run!r}")
            first, last, state, count = run
            if first <= prev or last < first or state not in RecordState.__members__.values() \
                    or state == RecordState.ACQUIRED or count < 0:
                raise ValueError(f"share partition state: run {run!r} out of order or "
                                 "invalid")
            runs.append((first, last, state, count))
            prev = last
        return cls(doc["start"], tuple(runs))


@dataclass(slots=True)
class _Slot:
    state: RecordState = RecordState.AVAILABLE
    count: int = 0
    member: str = ""
    deadline: float = 0.0


@dataclass(slots=True)
class SharePartition:
    start: int
    settings: ShareSettings = field(default_factory=ShareSettings)
    end: int = -1
    slots: dict[int, _Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.end < self.start:
            self.end = self.start

    @classmethod
    def from_state(cls, state: ShareState, settings: ShareSettings) -> SharePartition:
        part = cls(state.start, settings)
        for first, last, st, count in state.runs:
            for offset in range(first, last + 1):
                part.slots[offset] = _Slot(RecordState(st), count)
            part.end = last + 1
        # offsets between the runs were handed out before (the runs are past them) and
        # are AVAILABLE with no delivery counted: put them back in flight
        for offset in range(part.start, part.end):
            part.slots.setdefault(offset, _Slot())
        part.advance()
        return part

    def state(self) -> ShareState:
        runs: list[tuple[int, int, int, int]] = []
        for offset in range(self.start, self.end):
            slot = self.slots.get(offset)
            if slot is None:
                kept = (int(RecordState.ARCHIVED), 0)
            else:
                st = RecordState.AVAILABLE if slot.state == RecordState.ACQUIRED \
                    else slot.state
                kept = (int(st), slot.count)
            if runs and runs[-1][1] == offset - 1 and runs[-1][2:] == kept:
                runs[-1] = (runs[-1][0], offset, *kept)
            else:
                runs.append((offset, offset, *kept))
        # trailing plain AVAILABLE offsets with no delivery are new ones: not kept
        while runs and runs[-1][2] == RecordState.AVAILABLE and runs[-1][3] == 0:
            runs.pop()
        return ShareState(self.start, tuple(runs))

    # -- handing out --------------------------------------------------------------------

    def first_wanted(self, now: float) -> int | None:
        """The lowest offset a fetch should read from: the first AVAILABLE one in flight,
        else ``end`` while the window has room; None when nothing can be acquired."""
        self.expire(now)
        for offset in range(self.start, self.end):
            slot = self.slots.get(offset)
            if slot is not None and slot.state == RecordState.AVAILABLE:
                return offset
        return self.end if self.end - self.start < self.settings.max_locks else None

    def acquire(self, member: str, batches: Iterable[BatchView], now: float,
                max_records: int) -> list[Acquired]:
        """Lock to ``member`` what ``batches`` (ascending) hold that is AVAILABLE or new,
        batch by batch, until ``max_records`` are taken (a batch is never split)."""
        self.expire(now)
        got: list[Acquired] = []
        taken = 0
        deadline = now + self.settings.lock_s
        for b in batches:
            if taken >= max_records:
                break
            if b.last < self.start:
                continue
            if b.base > self.end and b.base - self.start > self.settings.max_locks:
                break  # past the window: later
            if b.base >= self.end:
                if self.end - self.start >= self.settings.max_locks:
                    break
                self.end = b.base  # offsets no batch covers: done, never in slots
            if not b.deliverable:
                for offset in range(max(self.end, b.base), b.last + 1):
                    self.slots[offset] = _Slot(RecordState.ARCHIVED)
                self.end = max(self.end, b.last + 1)
                continue
            for offset in range(max(b.base, self.start), b.last + 1):
                if offset >= self.end:
                    slot = self.slots[offset] = _Slot()
                    self.end = offset + 1
                else:
                    maybe = self.slots.get(offset)
                    if maybe is None or maybe.state != RecordState.AVAILABLE:
                        continue
                    slot = maybe
                slot.state = RecordState.ACQUIRED
                slot.count += 1
                slot.member = member
                slot.deadline = deadline
                taken += 1
                if got and got[-1].last == offset - 1 and got[-1].count == slot.count:
                    got[-1] = Acquired(got[-1].first, offset, slot.count)
                else:
                    got.append(Acquired(offset, offset, slot.count))
        self.advance()
        return got

    # -- acknowledging ------------------------------------------------------------------

    def acknowledge(self, member: str, first: int, last: int, types: Sequence[int]) -> int:
        """Apply one acknowledgement batch of ``member``; an error code (nothing of the
        batch applied) or 0. ``types`` is one type for the whole range or one per
        offset (Kafka's AcknowledgementBatch)."""
        n = last - first + 1
        if n <= 0 or len(types) not in (1, n) or any(t not in AckType.__members__.values()
                                                     for t in types):
            return ErrorCode.INVALID_REQUEST
        for offset in range(first, last + 1):
            slot = self.slots.get(offset)
            if slot is None or offset < self.start or offset >= self.end or \
                    slot.state != RecordState.ACQUIRED or slot.member != member:
                return ErrorCode.INVALID_RECORD_STATE
        for i, offset in enumerate(range(first, last + 1)):
            slot = self.slots[offset]
            kind = AckType(types[0] if len(types) == 1 else types[i])
            if kind == AckType.ACCEPT:
                slot.state = RecordState.ACKNOWLEDGED
            elif kind == AckType.RELEASE:
                self._give_back(slot)
            else:  # REJECT, GAP
                slot.state = RecordState.ARCHIVED
            slot.member = ""
        self.advance()
        return 0

    def release(self, member: str) -> bool:
        """Give back every offset ``member`` holds (its session closed or it left)."""
        changed = False
        for slot in self.slots.values():
            if slot.state == RecordState.ACQUIRED and slot.member == member:
                self._give_back(slot)
                changed = True
        if changed:
            self.advance()
        return changed

    def expire(self, now: float) -> bool:
        """Locks past their deadline: the offsets are AVAILABLE again (or ARCHIVED at
        the delivery limit)."""
        changed = False
        for slot in self.slots.values():
            if slot.state == RecordState.ACQUIRED and slot.deadline <= now:
                self._give_back(slot)
                changed = True
        if changed:
            self.advance()
        return changed

    def next_deadline(self) -> float | None:
        deadlines = [s.deadline for s in self.slots.values()
                     if s.state == RecordState.ACQUIRED]
        return min(deadlines) if deadlines else None

    def held_by(self, member: str) -> int:
        return sum(1 for s in self.slots.values()
                   if s.state == RecordState.ACQUIRED and s.member == member)

    def _give_back(self, slot: _Slot) -> None:
        slot.member = ""
        slot.state = RecordState.ARCHIVED if slot.count >= self.settings.delivery_limit \
            else RecordState.AVAILABLE

    def advance(self) -> None:
        """Move ``start`` over the done offsets at its front."""
        while self.start < self.end:
            slot = self.slots.get(self.start)
            if slot is not None and slot.state not in DONE:
                break
            self.slots.pop(self.start, None)
            self.start += 1

    def move_start(self, offset: int) -> None:
        """The log's start moved past ``offset`` (retention, DeleteRecords): what is
        below it is gone."""
        if offset <= self.start:
            return
        for o in range(self.start, min(offset, self.end)):
            self.slots.pop(o, None)
        self.start = offset
        self.end = max(self.end, offset)
