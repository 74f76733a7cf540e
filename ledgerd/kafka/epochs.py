"""Leader epochs (KIP-101, KIP-320): what a partition's epoch is and what Kafka answers
about it. Pure functions; the gateway feeds them what the log holds.

A partition's **leader epoch** is its log's ``writers`` count (``metadata/logs.py``):
each writer that opens the log (a gateway taking the partition's leadership, or the
same gateway again after its ZooKeeper session was lost) adds one in the same
compare-and-set that adds its first ledger. So it is durable, grows with every new
writer, and every gateway reads the same value from the log record. The writer stamps
it into each batch's ``partitionLeaderEpoch``; as a writer's ledgers hold only its own
batches, the epoch of a ledger's entry 0 is the epoch of the whole ledger, and the
log's *epoch history* is the list of ``(epoch, first offset)`` of its ledgers (those
holding a batch).

A partition never written (``writers`` 0) is at epoch 1, the one its first writer
takes (``current_epoch``): a client that read Metadata before the first produce (as
librdkafka's tests do, then ask ListOffsets) is not told its epoch is stale.

- ``check_current_epoch``: a request's ``current_leader_epoch`` against the leader's
  (Kafka's ``Partition.getLocalLog``): -1 means unchecked; older is
  FENCED_LEADER_EPOCH (the client's metadata is stale), newer UNKNOWN_LEADER_EPOCH
  (ours is).
- ``end_offset_for_epoch``: OffsetForLeaderEpoch's answer (Kafka's
  ``LeaderEpochFileCache.endOffsetFor``): for the current epoch the log end offset;
  for an older one the first offset of the next higher epoch, with the largest epoch
  at or below the one asked; (-1, -1) for an epoch above every epoch known.
"""

from __future__ import annotations

from collections.abc import Iterable

from ledgerd.kafka.api import ErrorCode

__all__ = ["UNDEFINED", "check_current_epoch", "current_epoch", "end_offset_for_epoch",
           "epoch_at", "epoch_history"]

UNDEFINED = -1  # Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET


def current_epoch(writers: int) -> int:
    """The leader epoch of a log whose record counts ``writers`` (see above)."""
    return max(writers, 1)


def check_current_epoch(current: int, leader: int) -> ErrorCode:
    """NONE, FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH for a request that names
    ``current`` as the leader's epoch when it is ``leader``."""
    if current < 0:
        return ErrorCode.NONE
    if current < leader:
        return ErrorCode.FENCED_LEADER_EPOCH
    if current > leader:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return ErrorCode.NONE


def epoch_history(starts: Iterable[tuple[int, int]], current: int, log_end: int,
                  ) -> list[tuple[int, int]]:
    """The epoch history, ``(epoch, first offset)`` in offset order, from the
    ``(epoch, first offset)`` of the log's ledgers in list order: negative epochs
    (batches written before epochs were stamped) are left out, and so is an entry
    whose epoch is not above the one before (a roll keeps its writer's epoch). The
    current epoch starts at ``log_end`` if no batch of it is in the log yet (Kafka's
    leader records its epoch when it is elected, before it writes)."""
    out: list[tuple[int, int]] = []
    for epoch, start in starts:
        if epoch < 0 or (out and epoch <= out[-1][0]):
            continue
        out.append((epoch, start))
    if current >= 0 and (not out or current > out[-1][0]):
        out.append((current, log_end))
    return out


def end_offset_for_epoch(history: list[tuple[int, int]], current: int, log_end: int,
                         requested: int) -> tuple[int, int]:
    """``(leader epoch, end offset)`` answered for ``requested``: see the module
    docstring. ``history`` as ``epoch_history`` makes it."""
    if requested < 0:
        return UNDEFINED, UNDEFINED
    if requested == current:
        return current, log_end
    floor: tuple[int, int] | None = None
    for epoch, start in history:
        if epoch > requested:  # the first higher epoch: where ``requested`` ended
            return (floor[0] if floor is not None else requested), start
        floor = (epoch, start)
    return UNDEFINED, UNDEFINED


def epoch_at(history: list[tuple[int, int]], offset: int) -> int:
    """The epoch of the batch holding ``offset`` (the last epoch starting at or before
    it; -1 if none does): ListOffsets' leader_epoch."""
    found = UNDEFINED
    for epoch, start in history:
        if start > offset:
            break
        found = epoch
    return found
