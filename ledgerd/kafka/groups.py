"""Kafka's classic consumer-group protocol, as a state machine per group.

The states and rules are Kafka's ``GroupCoordinator``:

- ``EMPTY`` --join--> ``PREPARING_REBALANCE``: the first join waits the initial
  rebalance delay (more members join meanwhile); a rebalance of a group that had
  members completes when every known member has rejoined or the largest rebalance
  timeout passes (members that did not rejoin are dropped).
- Completing the join bumps the generation, picks the protocol every member supports
  (by the members' votes), names a leader (the previous one if still there) and answers
  every pending JoinGroup at once, the member list only to the leader ->
  ``COMPLETING_REBALANCE``.
- The leader's SyncGroup carries every member's assignment; each member's SyncGroup
  is answered with its own -> ``STABLE``.
- A join, a leave or an expired session starts a new rebalance; members learn of it
  from Heartbeat (REBALANCE_IN_PROGRESS) and rejoin.
- ``EMPTY`` --DeleteGroups--> ``DEAD``: only a group without members may be deleted
  (NON_EMPTY_GROUP otherwise); a dead group takes no joins or commits
  (COORDINATOR_NOT_AVAILABLE: the client asks again and finds a fresh group).

The admin view follows Kafka's ``GroupMetadata.summary``: a group's members are
described with their metadata (for the chosen protocol) and assignment only while it
is ``STABLE``; otherwise with empty bytes and no protocol. OffsetDelete
(``offset_deletion``) deletes anything of an empty group, and of a consumer group with
members only the topics none of them subscribes to (GROUP_SUBSCRIBED_TO_TOPIC); a
member whose subscription does not parse counts as subscribed to every topic (Kafka
would delete: refusing is the side that loses nothing).

Static members (KIP-345, JoinGroup v5+ with a ``group.instance.id``) are members the
group keeps by their instance id: a static member that restarts joins with an empty
member id and its instance id, takes over its old membership under a new member id,
and, if the group is ``STABLE`` and its protocols are unchanged, gets its answer at
once (the current generation, its old assignment at SyncGroup) without a rebalance;
the other members never hear of it. In any other state it rejoins the rebalance in
progress as that member. As in Kafka, the answer names the leader as it was before
the replacement, so a returning leader does not run a trivial assignment, and a
request naming an instance id with another member id than the one that now holds it
(the old process, a zombie) gets FENCED_INSTANCE_ID. A static member still leaves
when its session expires (or by LeaveGroup with its instance id); a clean shutdown
of a static consumer sends no LeaveGroup, so a restart within the session timeout is
not noticed.

The machine takes ``now`` and returns replies; the gateway performs them and calls
:meth:`Group.tick` so deadlines fire. Assignments and member metadata are opaque
bytes (client-side assignors). Only the generation survives a gateway restart (the
gateway stores it): members of a restarted coordinator get UNKNOWN_MEMBER_ID and
rejoin, and committed offsets live in the partitions' cursors.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.schema import (
    INT16,
    STRING,
    Array,
    Field,
    KafkaDecodeError,
    Message,
    Reader,
    decode,
)

__all__ = ["CONSUMER_PROTOCOL", "DEAD_SUMMARY", "Group", "GroupSettings", "GroupState",
           "GroupSummary", "MemberSummary", "Reply", "listed", "subscribed_topics"]

CONSUMER_PROTOCOL = "consumer"  # the protocol type of Kafka's consumers (others: connect)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# A consumer's subscription, the metadata of each of its protocols (Kafka's
# ConsumerProtocolSubscription, never flexible): version int16 | topics [string] | ...
# (user data, owned partitions, generation, rack follow; only the topics matter here).
SUBSCRIPTION = Message((Field("version", INT16), Field("topics", Array.of_scalar(STRING))))


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics a consumer's subscription names, or None if it does not parse."""
    try:
        return frozenset(decode(SUBSCRIPTION, 0, Reader(metadata), "subscription")["topics"])
    except KafkaDecodeError:
        return None


def listed(state: GroupState, states_filter: Iterable[str],
           types_filter: Iterable[str]) -> bool:
    """Does ListGroups (v4 states, v5 types filters; empty = all) list a group in
    ``state``? States compare case-insensitively, as Kafka's parser does; every group
    here is a "classic" one."""
    states = {s.lower() for s in states_filter}
    types = {t.lower() for t in types_filter}
    return (not states or state.value.lower() in states) and (not types or "classic" in types)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberSummary:
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes
    instance_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSummary:
    """What DescribeGroups says of a group."""

    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberSummary, ...]

    def __post_init__(self) -> None:
        if self.state is not GroupState.STABLE and (
                self.protocol or any(m.metadata or m.assignment for m in self.members)):
            raise ValueError("only a stable group reports its protocol and member bytes")


DEAD_SUMMARY = GroupSummary(state=GroupState.DEAD, protocol_type="", protocol="", members=())


@dataclass(frozen=True, slots=True)
class GroupSettings:
    initial_rebalance_delay_s: float = 3.0
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 300000


class Reply:
    """A response that may come later (a join or sync held until the group moves)."""

    __slots__ = ("value", "waiter")

    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None
        self.waiter: Any = None  # set by the I/O layer (a trio.Event)

    def resolve(self, value: dict[str, Any]) -> None:
        if self.value is None:
            self.value = value
            if self.waiter is not None:
                self.waiter.set()


def _now_reply(value: dict[str, Any]) -> Reply:
    r = Reply()
    r.value = value
    return r


@dataclass(slots=True)
class Member:
    member_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    join: Reply | None = None
    sync: Reply | None = None
    assignment: bytes = b""
    client_id: str = ""
    client_host: str = ""
    instance_id: str | None = None  # a static member's group.instance.id


@dataclass(slots=True)
class Group:
    group_id: str
    settings: GroupSettings
    generation: int = 0
    protocol_type: str = ""
    protocol: str = ""
    state: GroupState = GroupState.EMPTY
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    initial_until: float = 0.0  # a first join waits at least until then
    persisted: int = -1  # the generation last stored; the I/O layer stores newer ones
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id

    # -- requests -----------------------------------------------------------------------

    def join(self, *, member_id: str, client_id: str, protocol_type: str,
             protocols: list[tuple[str, bytes]], session_timeout_ms: int,
             rebalance_timeout_ms: int, now: float, client_host: str = "",
             instance_id: str | None = None) -> Reply:
        s = self.settings
        if self.state is GroupState.DEAD:
            return _now_reply(_join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id))
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            return _now_reply(_join_error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id))
        if not protocol_type or not protocols:
            return _now_reply(_join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        held = self.static.get(instance_id) if instance_id is not None else None
        if held is not None and held not in self.members:  # (never: _remove forgets it)
            held = None
        if member_id and held is not None and held != member_id:
            return _now_reply(_join_error(ErrorCode.FENCED_INSTANCE_ID, member_id))
        if self.members and (protocol_type != self.protocol_type or not self._shared(
                [p for p, _ in protocols], exclude=held or member_id)):
            return _now_reply(_join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        if member_id and member_id not in self.members:
            return _now_reply(_join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if held is not None:  # a static member back under a new member id
                assert instance_id is not None
                return self._rejoin_static(held, member_id, instance_id, client_id=client_id,
                                           client_host=client_host, protocols=protocols,
                                           session_timeout_ms=session_timeout_ms,
                                           rebalance_timeout_ms=rebalance_timeout_ms,
                                           now=now)
        rebalance_s = (rebalance_timeout_ms if rebalance_timeout_ms > 0
                       else session_timeout_ms) / 1000
        member = self.members.get(member_id)
        if member is None:
            member = Member(member_id, session_timeout_ms / 1000, rebalance_s,
                            protocols, now, client_id=client_id, client_host=client_host,
                            instance_id=instance_id)
            self.members[member_id] = member
            if instance_id is not None:
                self.static[instance_id] = member_id
        else:
            member.protocols = protocols
            member.session_timeout_s = session_timeout_ms / 1000
            member.rebalance_timeout_s = rebalance_s
            member.last_seen = now
        self.protocol_type = protocol_type
        if member.join is not None:
            member.join.resolve(_join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
        reply = member.join = Reply()
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare(now)
        self._maybe_complete(now)
        return reply

    def _rejoin_static(self, old_id: str, new_id: str, instance_id: str, *,
                       client_id: str, client_host: str, protocols: list[tuple[str, bytes]],
                       session_timeout_ms: int, rebalance_timeout_ms: int,
                       now: float) -> Reply:
        """A static member back under ``new_id``: its membership moves over (the old
        id is fenced); answered at once without a rebalance if the group is stable and
        the member's protocols are unchanged (Kafka's
        ``updateStaticMemberAndRebalance``), else a rejoin."""
        member = self.members.pop(old_id)
        for pending in (member.join, member.sync):
            if pending is not None:
                pending.resolve(_join_error(ErrorCode.FENCED_INSTANCE_ID, old_id))
        member.join = member.sync = None
        unchanged = member.protocols == protocols
        member.member_id = new_id
        member.protocols = protocols
        member.session_timeout_s = session_timeout_ms / 1000
        member.rebalance_timeout_s = (rebalance_timeout_ms if rebalance_timeout_ms > 0
                                      else session_timeout_ms) / 1000
        member.last_seen = now
        member.client_id, member.client_host = client_id, client_host
        self.members[new_id] = member
        self.static[instance_id] = new_id
        leader_before = self.leader
        if self.leader == old_id:
            self.leader = new_id
        if self.state is GroupState.STABLE and unchanged:
            return _now_reply({
                "error_code": 0, "generation_id": self.generation,
                "protocol_name": self.protocol, "leader": leader_before,
                "member_id": new_id, "members": []})
        reply = member.join = Reply()
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare(now)
        self._maybe_complete(now)
        return reply

    def sync(self, *, member_id: str, generation: int,
             assignments: list[tuple[str, bytes]], now: float,
             instance_id: str | None = None) -> Reply:
        error = self._fenced(member_id, instance_id) or self._check(member_id, generation)
        if error is not None:
            return _now_reply({"error_code": error})
        member = self.members[member_id]
        member.last_seen = now
        if self.state is GroupState.PREPARING_REBALANCE:
            return _now_reply({"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
        if self.state is GroupState.STABLE:
            return _now_reply({"error_code": 0, "assignment": member.assignment})
        reply = member.sync = Reply()
        if member_id == self.leader:
            given = dict(assignments)
            for m in self.members.values():
                m.assignment = given.get(m.member_id, b"")
            self.state = GroupState.STABLE
            for m in self.members.values():
                if m.sync is not None:
                    m.sync.resolve({"error_code": 0, "assignment": m.assignment})
                    m.sync = None
        return reply

    def heartbeat(self, *, member_id: str, generation: int, now: float,
                  instance_id: str | None = None) -> int:
        error = self._fenced(member_id, instance_id) or self._check(member_id, generation)
        if error is not None:
            return error
        self.members[member_id].last_seen = now
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, *, member_id: str, now: float, instance_id: str | None = None) -> int:
        """LeaveGroup of one member (v3+: by member id, or a static one by its instance
        id alone)."""
        if instance_id is not None:
            held = self.static.get(instance_id)
            if held is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if member_id and member_id != held:
                return ErrorCode.FENCED_INSTANCE_ID
            member_id = held
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._remove(member_id, now)
        return ErrorCode.NONE

    def check_commit(self, *, member_id: str, generation: int,
                     instance_id: str | None = None) -> int:
        """May this member commit offsets now? (generation -1 and no member: a simple
        commit, as an admin client's AlterConsumerGroupOffsets is, allowed while the
        group has no members; while it has, the committer is not one of them:
        UNKNOWN_MEMBER_ID, as Kafka answers)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        fenced = self._fenced(member_id, instance_id)
        if fenced:
            return fenced
        if generation < 0 and not member_id:
            return ErrorCode.NONE if not self.members else ErrorCode.UNKNOWN_MEMBER_ID
        error = self._check(member_id, generation)
        if error is not None:
            return error
        if self.state is GroupState.COMPLETING_REBALANCE:
            # (Kafka's rule: a member commits what it consumed while the group prepares a
            # rebalance, before it rejoins; only between join and sync is it refused)
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def check_txn_commit(self, *, member_id: str, generation: int,
                         instance_id: str | None) -> int:
        """May a transactional producer commit offsets for this group (TxnOffsetCommit
        v3+, KIP-447)? Named by member, generation or instance, the member must be the
        group's current one at its current generation, so a zombie of a consumer whose
        partitions moved cannot commit through its transaction; named by none (v0-2, or
        a producer outside the group), it may. Unlike a plain commit, not refused while
        the group completes a rebalance (as Kafka)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and not member_id and instance_id is None:
            return ErrorCode.NONE
        fenced = self._fenced(member_id, instance_id)
        if fenced:
            return fenced
        return self._check(member_id, generation) or ErrorCode.NONE

    # -- administration -----------------------------------------------------------------

    def summary(self) -> GroupSummary:
        """DescribeGroups' view (Kafka's ``GroupMetadata.summary``): member bytes and the
        protocol only while the group is stable."""
        stable = self.state is GroupState.STABLE
        members = tuple(MemberSummary(
            member_id=m.member_id, client_id=m.client_id, client_host=m.client_host,
            metadata=dict(m.protocols).get(self.protocol, b"") if stable else b"",
            assignment=m.assignment if stable else b"", instance_id=m.instance_id)
            for m in self.members.values())
        return GroupSummary(state=self.state, protocol_type=self.protocol_type,
                            protocol=self.protocol if stable else "", members=members)

    def delete(self) -> int:
        """DeleteGroups: an empty group becomes DEAD (NONE; the caller then deletes its
        offsets and record); a group with members is refused (NON_EMPTY_GROUP), a dead
        one is gone already (GROUP_ID_NOT_FOUND). Refusals change nothing."""
        if self.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.members:
            return ErrorCode.NON_EMPTY_GROUP
        self.state = GroupState.DEAD
        return ErrorCode.NONE

    def offset_deletion(self, topics: Iterable[str]) -> tuple[int, dict[str, int]]:
        """OffsetDelete (Kafka's ``handleDeleteOffsets``): the group's error, and per
        topic NONE (its offsets may go) or GROUP_SUBSCRIBED_TO_TOPIC. An empty group
        deletes anything; a consumer group with members only topics no member
        subscribes to; a group of another protocol type with members nothing
        (NON_EMPTY_GROUP); a dead group GROUP_ID_NOT_FOUND."""
        if self.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if not self.members:
            return ErrorCode.NONE, dict.fromkeys(topics, ErrorCode.NONE)
        if self.protocol_type != CONSUMER_PROTOCOL:
            return ErrorCode.NON_EMPTY_GROUP, {}
        subscribed = self.subscribed_topics()
        return ErrorCode.NONE, {
            t: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if subscribed is None or t in subscribed
            else ErrorCode.NONE for t in topics}

    def subscribed_topics(self) -> frozenset[str] | None:
        """Every topic a live member's subscription names, under any protocol it offers
        (before the first rebalance completes none is chosen yet); None if one does not
        parse."""
        out: set[str] = set()
        for m in self.members.values():
            for _, metadata in m.protocols:
                topics = subscribed_topics(metadata)
                if topics is None:
                    return None
                out |= topics
        return frozenset(out)

    # -- time ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Expire sessions and complete a rebalance whose time has come."""
        for m in list(self.members.values()):
            waiting = self.state is GroupState.PREPARING_REBALANCE and m.join is not None
            if not waiting and now - m.last_seen > m.session_timeout_s:
                self._remove(m.member_id, now)
        if self.state is GroupState.PREPARING_REBALANCE:
            if now >= self.rebalance_deadline:
                for m in [m for m in self.members.values() if m.join is None]:
                    del self.members[m.member_id]
                    if m.instance_id is not None and \
                            self.static.get(m.instance_id) == m.member_id:
                        del self.static[m.instance_id]
                self._complete(now)
            else:
                self._maybe_complete(now)

    @property
    def is_idle(self) -> bool:
        return not self.members

    @property
    def is_known(self) -> bool:
        """Does the group exist for the admin APIs: members now, or a record (loaded
        from the store, ``persisted`` >= 0, or about to be stored), and not deleted?"""
        return self.state is not GroupState.DEAD and (
            bool(self.members) or self.persisted >= 0 or self.generation > 0)

    # -- internals ----------------------------------------------------------------------

    def _fenced(self, member_id: str, instance_id: str | None) -> int:
        """FENCED_INSTANCE_ID if ``instance_id`` is now held by another member id (the
        request comes from a static member's previous incarnation), else 0."""
        if instance_id is None:
            return 0
        held = self.static.get(instance_id)
        if held is not None and held != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        return 0

    def _check(self, member_id: str, generation: int) -> int | None:
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    def _shared(self, names: list[str], exclude: str = "") -> set[str]:
        common = set(names)
        for m in self.members.values():
            if m.member_id != exclude:
                common &= {p for p, _ in m.protocols}
        return common

    def _prepare(self, now: float) -> None:
        first = self.state is GroupState.EMPTY
        self.state = GroupState.PREPARING_REBALANCE
        timeout = max((m.rebalance_timeout_s for m in self.members.values()), default=0.0)
        self.rebalance_deadline = now + timeout
        self.initial_until = now + self.settings.initial_rebalance_delay_s if first else now
        for m in self.members.values():
            if m.sync is not None:
                m.sync.resolve({"error_code": ErrorCode.REBALANCE_IN_PROGRESS})
                m.sync = None

    def _maybe_complete(self, now: float) -> None:
        if (self.state is GroupState.PREPARING_REBALANCE and now >= self.initial_until
                and all(m.join is not None for m in self.members.values())):
            self._complete(now)

    def _complete(self, now: float) -> None:
        if not self.members:
            self.state = GroupState.EMPTY
            self.leader = self.protocol = ""
            return
        self.generation += 1
        ids = list(self.members)
        if self.leader not in self.members:
            self.leader = ids[0]
        common = self._shared(list(self._ranked(ids[0])))
        votes = Counter(next(p for p, _ in m.protocols if p in common)
                        for m in self.members.values())
        top = max(votes.values())
        self.protocol = next(p for p in self._ranked(self.leader) if votes.get(p) == top)
        self.state = GroupState.COMPLETING_REBALANCE
        listing = [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                    "metadata": dict(m.protocols)[self.protocol]}
                   for m in self.members.values()]
        for m in self.members.values():
            m.last_seen = now
            if m.join is not None:
                m.join.resolve({
                    "error_code": 0, "generation_id": self.generation,
                    "protocol_name": self.protocol, "leader": self.leader,
                    "member_id": m.member_id,
                    "members": listing if m.member_id == self.leader else []})
                m.join = None

    def _ranked(self, member_id: str) -> list[str]:
        return [p for p, _ in self.members[member_id].protocols]

    def _remove(self, member_id: str, now: float) -> None:
        m = self.members.pop(member_id)
        if m.instance_id is not None and self.static.get(m.instance_id) == member_id:
            del self.static[m.instance_id]
        for reply in (m.join, m.sync):
            if reply is not None:
                reply.resolve({"error_code": ErrorCode.UNKNOWN_MEMBER_ID})
        if self.leader == member_id:
            self.leader = ""
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol = ""
            return
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._prepare(now)
        self._maybe_complete(now)


def _join_error(code: int, member_id: str) -> dict[str, Any]:
    return {"error_code": code, "member_id": member_id}
