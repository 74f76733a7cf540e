"""Idempotent producers' state on one partition, as Kafka's broker keeps it: a pure
machine (no I/O) that the partition's appender asks and tells.

Each producer id (pid) is remembered with its last PRODUCER_BATCHES batches: epoch,
first and last sequence, and the offset the batch was written at. A batch is

- a *duplicate* when its (epoch, first sequence, last sequence) is among them and the
  batch it matches is not of a transaction that has ended since: answered with the
  offset it got the first time, not written again (a retry whose answer was lost). A
  transaction's marker ends its batches' retries: its producer waited for them before
  ending it (or, aborting, dropped them unsent), so a batch with one's sequences after
  the marker is a new batch reusing them (librdkafka aborts a transaction whose batch
  a crashed gateway had stored unanswered without bumping its epoch, then sends the
  next transaction's batch with the same sequences). Answering it with the aborted
  batch's offset lost the committed records (an outside audit: 7 of 120 kill, abort,
  commit rounds); it is refused instead (OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka
  refuses a batch matching one's first sequence but not its last: the producer aborts
  and goes on with a new epoch);
- *in sequence* when its epoch is the producer's and its first sequence follows the
  last one (wrapping after 2**31 - 1), or its epoch is newer and it starts at 0, or the
  producer is not known here (Kafka accepts those since 2.5: its state may have
  expired);
- refused otherwise: INVALID_PRODUCER_EPOCH for an older epoch (older than its last
  batch's, or than its last marker's: a coordinator that fenced the producer wrote that
  marker at the bumped epoch, and Kafka's partitions take the epoch from markers too),
  OUT_OF_ORDER_SEQUENCE_NUMBER for a gap.

A transaction marker of an epoch older than one this partition has seen of its
producer (a batch's or a marker's) is *stale*: its coordinator's record has moved on
(the producer was fenced), and the partition refuses it (``stale_marker``). Written, it
would change nothing a reader sees, yet a coordinator that ends a transaction with its
marker alone (``txn_coordinator.one_phase``) would take it for a commit.

The batches of one append group are checked together (``group()``): a batch placed
earlier in the group counts as the producer's last, and a retry of a batch still in
the group rides on the first copy. At most MAX_PRODUCERS producers are remembered per
partition; the least recently heard go first. The state is rebuilt from the log's
last batches when a gateway becomes the partition's writer (``partitions.py``)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

from ledgerd.kafka.api import ErrorCode

__all__ = ["MAX_PRODUCERS", "PRODUCER_BATCHES", "SEQUENCE_WRAP", "GroupAdmission",
           "Producer", "ProducerState"]

PRODUCER_BATCHES = 5  # batches remembered per producer (Kafka: max.in.flight 5)
SEQUENCE_WRAP = 1 << 31  # a producer's sequence goes on from 2**31 - 1 to 0
MAX_PRODUCERS = 10000  # idempotent producers remembered per partition (LRU)

# (producer id, epoch, first sequence, last sequence) of a batch or of a request's batches
Producer = tuple[int, int, int, int]


def last_sequence(first: int, records: int) -> int:
    """The sequence of the last of ``records`` records whose first is ``first``."""
    return (first + records - 1) % SEQUENCE_WRAP


class ProducerState:
    """The producers remembered on one partition (see the module docstring)."""

    def __init__(self, max_producers: int = MAX_PRODUCERS,
                 batches: int = PRODUCER_BATCHES) -> None:
        self.max_producers = max_producers
        self.batches = batches
        # pid -> its last batches: (epoch, first sequence, last sequence, base offset)
        self._recent: OrderedDict[int, deque[tuple[int, int, int, int]]] = OrderedDict()
        self._times: dict[int, int] = {}  # pid -> max timestamp of its last batch
        self._ended: dict[int, int] = {}  # pid -> offset of its last transaction marker
        self._marker_epochs: OrderedDict[int, int] = OrderedDict()  # pid -> its last's epoch

    def __len__(self) -> int:
        return len(self._recent)

    def __contains__(self, pid: object) -> bool:
        return pid in self._recent

    def __iter__(self) -> Iterator[int]:
        return iter(self._recent)

    def clear(self) -> None:
        """Forget every producer (the partition's writer was dropped)."""
        self._recent.clear()
        self._times.clear()
        self._ended.clear()
        self._marker_epochs.clear()

    def latest(self, pid: int) -> tuple[int, int, int] | None:
        """The producer's last batch as remembered: (epoch, last sequence, base
        offset); None if it is not remembered here."""
        recent = self._recent.get(pid)
        if not recent:
            return None
        epoch, _, last, offset = recent[-1]
        return epoch, last, offset

    def last_timestamp(self, pid: int) -> int:
        """The max timestamp of the producer's last batch noted (-1: not known)."""
        return self._times.get(pid, -1)

    def duplicate(self, producer: Producer) -> int | None:
        """The offset the batch got when it was first written, if it was (and its
        transaction, if any, has not ended since)."""
        pid, epoch, seq, last = producer
        ended = self._ended.get(pid, -1)
        for e, s, lst, offset in self._recent.get(pid, ()):
            if e == epoch and s == seq and lst == last and offset > ended:
                return offset
        return None

    def end(self, pid: int, offset: int, epoch: int = -1) -> None:
        """The producer's transaction ended with a marker at ``offset`` (of ``epoch``):
        its batches before it are no longer retried (see the module docstring)."""
        if pid in self._recent:
            self._ended[pid] = offset
        if epoch >= 0:
            self._marker_epochs[pid] = max(epoch, self._marker_epochs.pop(pid, -1))
            while len(self._marker_epochs) > self.max_producers:
                self._marker_epochs.popitem(last=False)

    def marker_epoch(self, pid: int) -> int:
        """The epoch of the producer's last marker remembered here (-1: none)."""
        return self._marker_epochs.get(pid, -1)

    def epoch(self, pid: int) -> int:
        """The newest epoch of the producer seen here, in a batch or a marker (-1: none
        remembered)."""
        recent = self._recent.get(pid)
        return max(recent[-1][0] if recent else -1, self._marker_epochs.get(pid, -1))

    def sequence_error(self, producer: Producer, placed: tuple[int, int] | None = None,
                       ) -> int:
        """0 if the batch continues its producer's sequence (``placed``: the producer's
        (epoch, last sequence) earlier in the same group), else the Kafka error code."""
        pid, epoch, first, _ = producer
        if placed is None:
            recent = self._recent.get(pid)
            if not recent:
                return 0  # a producer not known here: accepted, as Kafka does since 2.5
            placed = recent[-1][0], recent[-1][2]
        known_epoch, last = placed
        if epoch < known_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if epoch > known_epoch:  # a bumped epoch starts its sequence again
            return 0 if first == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        return 0 if first == (last + 1) % SEQUENCE_WRAP \
            else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

    def note(self, pid: int, epoch: int, first: int, last: int, offset: int, *,
             timestamp: int = -1) -> None:
        """A batch of the producer was written at ``offset`` (a batch without a
        sequence, ``first`` < 0, is not an idempotent producer's); ``timestamp``: its
        max timestamp (DescribeProducers' LastTimestamp)."""
        if first < 0:
            return
        recent = self._recent.get(pid)
        if recent is None:
            recent = self._recent[pid] = deque(maxlen=self.batches)
            while len(self._recent) > self.max_producers:  # the least recently heard go
                gone, _ = self._recent.popitem(last=False)
                self._times.pop(gone, None)
                self._ended.pop(gone, None)
        else:
            self._recent.move_to_end(pid)
        recent.append((epoch, first, last, offset))
        if timestamp >= 0:
            self._times[pid] = timestamp

    def group(self) -> GroupAdmission:
        """The check of one append group's batches (nothing is remembered until the
        group is written and each batch ``note``d)."""
        return GroupAdmission(self)


class GroupAdmission:
    """The batches of one append group, checked in the order they will be written."""

    def __init__(self, state: ProducerState) -> None:
        self.state = state
        self._last: dict[int, tuple[int, int]] = {}  # pid -> (epoch, last sequence) placed
        # (pid, epoch, first, last) -> offset
        self._placed: dict[tuple[int, int, int, int], int] = {}
        self._ended: set[int] = set()  # producers whose marker is placed in this group
        self._marker_epochs: dict[int, int] = {}  # pid -> epoch of its marker placed here

    def end(self, pid: int, epoch: int = -1) -> None:
        """A marker of the producer (of ``epoch``) is placed here: no batch before it
        is retried."""
        self._ended.add(pid)
        self._marker_epochs[pid] = max(epoch, self._marker_epochs.get(pid, -1))
        for key in [k for k in self._placed if k[0] == pid]:
            del self._placed[key]

    def stale_marker(self, pid: int, epoch: int) -> bool:
        """True if a marker of ``epoch`` is older than the producer's newest epoch seen
        here or earlier in this group (see the module docstring)."""
        placed = self._last.get(pid, (-1, 0))[0]
        return epoch < max(self.state.epoch(pid), placed, self._marker_epochs.get(pid, -1))

    def admit(self, producer: Producer, offset: int) -> tuple[int | None, int]:
        """``(duplicate's offset, 0)`` for a batch written before (in this group or
        earlier): answered, not written; ``(None, error)`` for one refused;
        ``(None, 0)`` for one to write at ``offset`` (it counts as placed)."""
        pid, epoch, first, last = producer
        dup = self._placed.get((pid, epoch, first, last))
        if dup is None and pid not in self._ended:
            dup = self.state.duplicate(producer)
        if dup is not None:
            return dup, 0
        if epoch < max(self.state.marker_epoch(pid), self._marker_epochs.get(pid, -1)):
            return None, ErrorCode.INVALID_PRODUCER_EPOCH  # fenced by a marker
        code = self.state.sequence_error(producer, self._last.get(pid))
        if code:
            return None, code
        self._last[pid] = (epoch, last)
        self._placed[(pid, epoch, first, last)] = offset
        return None, 0
