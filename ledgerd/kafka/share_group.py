"""A share group's members and their assignments, at its coordinator (KIP-932).

Pure state: ``share_server.py`` hands it each ShareGroupHeartbeat and the topics the
members subscribe to, and sends back what :meth:`ShareGroup.heartbeat` answers.

The member chooses its id (KIP-1082) and joins with epoch 0; every heartbeat after
carries the epoch it was last given. A change of members, subscriptions or partition
counts bumps the group epoch and assigns again; a member whose partitions changed gets
the new epoch and its assignment in its next heartbeat. Share groups need no revocation
step: a partition may be read by several members at once (the share-partition leader
locks each record to one), so a new assignment takes effect at once.

Assignment (Kafka's simple assignor, in outline): per topic, the members subscribed to
it in id order; with at least as many partitions as members, partition p goes to member
p mod members; with fewer, member i reads partition i mod partitions, so every member
has one and no partition is unread.

A member not heard from for ``session_s`` (share.session.timeout.ms) is removed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ledgerd.kafka.api import ErrorCode

__all__ = ["Beat", "ShareGroup", "ShareMember"]

MAX_MEMBERS = 200  # group.share.max.size


@dataclass(slots=True)
class ShareMember:
    member_id: str
    epoch: int
    topics: tuple[str, ...]
    rack: str | None
    deadline: float
    assignment: dict[str, tuple[int, ...]] = field(default_factory=dict)  # topic -> parts
    sent_epoch: int = -1  # the epoch whose assignment the member was last sent


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat's answer: an error, or the member's epoch and, when it changed, its
    assignment (topic name -> partitions)."""

    error: int = 0
    message: str | None = None
    member_id: str | None = None
    epoch: int = 0
    assignment: Mapping[str, tuple[int, ...]] | None = None


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)  # as last assigned
    ids: dict[str, bytes] = field(default_factory=dict)  # their topic ids, as last assigned

    @property
    def subscribed(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topics}

    def heartbeat(self, member_id: str, member_epoch: int, rack: str | None,
                  topics: Sequence[str] | None, now: float, session_s: float,
                  counts: Mapping[str, int], ids: Mapping[str, bytes] | None = None,
                  ) -> Beat:
        """One ShareGroupHeartbeat. ``counts``: partition counts of the topics the
        group subscribes to (after this heartbeat's subscription), existing ones only;
        ``ids``: their topic ids (a topic deleted and made again under the same name
        and partition count is assigned again, so its readers learn the new id)."""
        ids = ids or {}
        if not member_id:
            return Beat(ErrorCode.INVALID_REQUEST, "a share member chooses its member id")
        member = self.members.get(member_id)
        if member_epoch == -1:  # leaving
            if member is not None:
                del self.members[member_id]
                self._assign(counts, ids)
            return Beat(member_id=member_id, epoch=-1)
        if member_epoch == 0:
            if member is None:
                if len(self.members) >= MAX_MEMBERS:
                    return Beat(ErrorCode.GROUP_MAX_SIZE_REACHED,
                                f"share group {self.group_id} has {MAX_MEMBERS} members")
                if topics is None:
                    return Beat(ErrorCode.INVALID_REQUEST,
                                "a joining share member names its topics")
                member = self.members[member_id] = ShareMember(
                    member_id, 0, tuple(sorted(set(topics))), rack, now + session_s)
                self._assign(counts, ids)
            member.sent_epoch = -1  # a rejoin (lost answer): send the assignment again
        elif member is None:
            return Beat(ErrorCode.UNKNOWN_MEMBER_ID,
                        f"{member_id} is not a member of share group {self.group_id}")
        elif member_epoch > member.epoch or member_epoch < member.sent_epoch:
            return Beat(ErrorCode.FENCED_MEMBER_EPOCH,
                        f"epoch {member_epoch} of {member_id}; the group gave it "
                        f"{member.epoch}")
        member.deadline = now + session_s
        if rack is not None:
            member.rack = rack
        if topics is not None and tuple(sorted(set(topics))) != member.topics:
            member.topics = tuple(sorted(set(topics)))
            self._assign(counts, ids)
        elif self._readable(counts) != self.partitions or \
                {t: i for t, i in ids.items() if t in self.partitions} != self.ids:
            self._assign(counts, ids)  # a topic made, deleted, made again or enlarged
        if member.sent_epoch != member.epoch:
            member.sent_epoch = member.epoch
            return Beat(member_id=member_id, epoch=member.epoch,
                        assignment=dict(member.assignment))
        return Beat(member_id=member_id, epoch=member.epoch)

    def expire(self, now: float, counts: Mapping[str, int],
               ids: Mapping[str, bytes] | None = None) -> list[str]:
        """Remove the members not heard from in time; their ids."""
        gone = [m for m, member in self.members.items() if member.deadline <= now]
        for m in gone:
            del self.members[m]
        if gone:
            self._assign(counts, ids or {})
        return gone

    def _readable(self, counts: Mapping[str, int]) -> dict[str, int]:
        subscribed = self.subscribed
        return {t: n for t, n in counts.items() if t in subscribed and n > 0}

    def _assign(self, counts: Mapping[str, int], ids: Mapping[str, bytes]) -> None:
        wanted: dict[str, dict[str, tuple[int, ...]]] = {m: {} for m in self.members}
        self.partitions = self._readable(counts)
        new_ids = {t: i for t, i in ids.items() if t in self.partitions}
        remade = {t for t, i in new_ids.items() if self.ids.get(t, i) != i}
        self.ids = new_ids
        for topic, n in sorted(self.partitions.items()):
            readers = sorted(m for m, member in self.members.items() if topic in member.topics)
            if not readers:
                continue
            got: dict[str, list[int]] = {m: [] for m in readers}
            if n >= len(readers):
                for p in range(n):
                    got[readers[p % len(readers)]].append(p)
            else:
                for i, m in enumerate(readers):
                    got[m].append(i % n)
            for m, parts in got.items():
                if parts:
                    wanted[m][topic] = tuple(parts)
        changed = [m for m, member in self.members.items()
                   if member.assignment != wanted[m] or remade & set(wanted[m])]
        if changed or not self.epoch:
            self.epoch += 1
        for m in changed:
            self.members[m].assignment = wanted[m]
            self.members[m].epoch = self.epoch
        for member in self.members.values():
            if member.epoch == 0:  # joined with nothing to read
                member.epoch = self.epoch
