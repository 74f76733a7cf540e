"""Share groups at the gateway (KIP-932): ShareGroupHeartbeat, ShareFetch, ShareAcknowledge.

The decisions are the pure machines': ``share_group.ShareGroup`` (members, epochs,
assignments; at the group's coordinator, the gateway FindCoordinator names for it, as
for a consumer group) and ``share_partition.SharePartition`` (which record is locked to
whom; at the partition's leader, the gateway that writes it). This module does their
I/O: it reads the partition's batches, stores what a share partition must not forget
(``metadata.kafka_share``) and keeps each member's share session.

- **Sessions.** A member's ShareFetch with epoch 0 opens its session on this gateway
  (its partitions: those it names), each later request carries the next epoch (a wrong
  one: INVALID_SHARE_SESSION_EPOCH; none open: SHARE_SESSION_NOT_FOUND), and epoch -1
  closes it: its acknowledgements are applied, then every record the member still
  holds here is given back. A session idle for the group's share.session.timeout.ms is
  closed the same way. At most MAX_SESSIONS are open (SHARE_SESSION_LIMIT_REACHED).
- **Acknowledgements** (in ShareFetch or ShareAcknowledge) are answered only once the
  partition's state is stored: an accepted record is never handed out again, whatever
  gateway leads next. The locks of records handed out are not stored: a leader that
  takes over makes them available again (a record may then be delivered again:
  at-least-once, as Kafka's), with the delivery counts last stored.
- **Fetching.** For each partition of the session, from the first available offset:
  whole batches, below the last stable offset under read_committed (a control batch and
  an aborted transaction's batch are archived, never handed out), at most the request's
  max_records (a batch is never split) and max_bytes. With nothing to hand out it waits
  up to max_wait_ms for new records, released ones or a lock running out.
- **A new share partition** starts where the group's share.auto.offset.reset says
  (latest: the high watermark when first read), stored at once so it stays there.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError
from ledgerd.kafka import share_configs, transactions
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.partitions import OffsetOutOfRangeError, PartitionLog
from ledgerd.kafka.records import CONTROL, HEADER_SIZE, BatchHeader
from ledgerd.kafka.share_group import ShareGroup
from ledgerd.kafka.share_partition import Acquired, BatchView, SharePartition, ShareState
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.metadata.errors import BadVersionError, MetadataError, NodeExistsError, NoNodeError
from ledgerd.metadata.kafka_groups import group_id_of
from ledgerd.metadata.kafka_share import ShareStore
from ledgerd.wire.status import FencedError

if TYPE_CHECKING:
    from ledgerd.kafka.gateway import Gateway

__all__ = ["ShareServer"]

log = logging.getLogger("ledgerd.kafka.share")

MAX_SESSIONS = 2000  # group.share.max.share.sessions
MAX_SESSION_PARTITIONS = 10_000  # partitions one share session may name
IDLE_S = 60.0  # a share partition no one holds a record of is let go after this
MAX_LOCKS = 2000  # group.share.partition.max.record.locks
CONFIG_TTL_S = 1.0  # a group's configs are read again after this (a fetch reads them
# on each pass: share_fetch)
CHECK_S = 0.5  # a share partition's copy is checked against the stored version this often
TICK_S = 0.5
FETCH_MAX_BYTES = 50 << 20


class _Lost(LedgerdError):
    """Another gateway stored this share partition's state since this one read it."""


@dataclass(slots=True)
class _Held:
    part: SharePartition
    version: int  # of the stored state (-1: none stored)
    topic_id: bytes
    lock: trio.Lock = field(default_factory=trio.Lock)
    used: float = 0.0  # when last served
    checked: float = 0.0  # when its version was last compared with the stored one


@dataclass(slots=True)
class _Session:
    epoch: int  # the epoch the next request must carry
    parts: set[tuple[bytes, int]]  # (topic id, partition)
    last: float
    turn: int = 0  # which partition a fetch starts from: each in turn goes first


def _aborted_batches(data: bytes, aborted: list[dict[str, int]]) -> set[int]:
    """The base offsets of the batches of aborted transactions in ``data`` (the
    consumer's rule: a producer's batches from an aborted transaction's first offset up
    to its ABORT marker)."""
    if not aborted:
        return set()
    starts: dict[int, list[int]] = {}
    for a in aborted:
        starts.setdefault(a["producer_id"], []).append(a["first_offset"])
    active: set[int] = set()
    out: set[int] = set()
    for h in _headers(data):
        pid = h.producer_id
        if pid in starts and any(first <= h.base_offset for first in starts[pid]):
            if h.attributes & CONTROL:
                active.discard(pid)
                starts[pid] = [f for f in starts[pid] if f > h.base_offset]
                continue
            active.add(pid)
        if pid in active and not h.attributes & CONTROL:
            out.add(h.base_offset)
    return out


def _headers(data: bytes) -> Iterable[BatchHeader]:
    at = 0
    while len(data) - at >= HEADER_SIZE:
        h = BatchHeader.parse(data, at)
        if h.length > len(data) - at:
            return
        yield h
        at += h.length


def _batches_holding(data: bytes, got: list[Acquired]) -> bytes:
    """The whole batches of ``data`` holding an acquired offset."""
    out = []
    at = 0
    for h in _headers(data):
        if any(a.first <= h.last_offset and h.base_offset <= a.last for a in got):
            out.append(data[at:at + h.length])
        at += h.length
    return b"".join(out)


class ShareServer:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.store = ShareStore(gw.store, gw.root)
        self.groups: dict[str, ShareGroup] = {}
        self.held: dict[tuple[str, str, int], _Held] = {}
        self.sessions: dict[tuple[str, str], _Session] = {}
        self.changed = trio.Event()  # set (and replaced) when records are given back
        self._configs: dict[str, tuple[float, dict[str, str]]] = {}
        self._loading = trio.Lock()
        self._deleting: set[str] = set()  # DeleteGroups under way: no member joins

    def forget(self) -> None:
        """Drop the members and share partitions held here (the ZooKeeper session was
        lost, or the live gateways changed: what this gateway leads or coordinates
        may have moved and come back changed). Synchronous: no request is served from
        them after this; a task holding one finds it gone after its lock (``_held``)."""
        self.held.clear()
        self.groups.clear()

    # -- the group's admin: ListGroups, DeleteGroups -------------------------------------

    async def listed(self) -> dict[str, str]:
        """The share groups known here, with stored share partitions or with members,
        and their states (Kafka's share group states: Empty, Stable); the caller keeps
        the ones it coordinates. A group with configs only is not one yet; a stored
        group whose id its znode name cannot give back (a long one, hashed) is left
        out. One ZooKeeper read per stored group this gateway coordinates."""
        out = {}
        for name in await self.store.groups():
            gid = group_id_of(name)
            if gid is not None and self.gw.owns(f"group/{gid}") and \
                    await self.store.has_state(gid):
                out[gid] = "Empty"
        for gid, group in self.groups.items():
            if group.members:
                out[gid] = "Stable"
        return out

    async def delete_group(self, gid: str) -> int:
        """DeleteGroups of a share group, on its coordinator: refused while it has
        members (NON_EMPTY_GROUP); else its configs and every share partition's state
        are deleted (GROUP_ID_NOT_FOUND if there were none). A leader holding one of
        its share partitions finds the stored version gone at its next check
        (``CHECK_S``) and starts it afresh."""
        group = self.groups.get(gid)
        if group is not None and group.members:
            return ErrorCode.NON_EMPTY_GROUP
        if gid in self._deleting:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        self._deleting.add(gid)  # a heartbeat meanwhile is told to retry
        try:
            removed = await self.store.delete_group(gid)
        finally:
            self._deleting.discard(gid)
        self.groups.pop(gid, None)
        self._configs.pop(gid, None)
        for key in [k for k in self.held if k[0] == gid]:
            del self.held[key]
        if removed:
            log.info("kafka_share_group_deleted", extra=fields(group=gid))
        return ErrorCode.NONE if removed or group is not None else ErrorCode.GROUP_ID_NOT_FOUND

    async def forget_topic(self, topic: str) -> None:
        """A deleted topic's share partitions: dropped here and in every share group's
        stored state."""
        for key in [k for k in self.held if k[1] == topic]:
            del self.held[key]
        await self.store.forget_topic(topic)

    # -- configs -------------------------------------------------------------------------

    async def configs(self, group_id: str, *, fresh: bool = False) -> dict[str, str]:
        now = trio.current_time()
        cached = self._configs.get(group_id)
        if cached is not None and not fresh and now - cached[0] < CONFIG_TTL_S:
            return cached[1]
        configs = await self.store.configs(group_id)
        self._configs[group_id] = (now, configs)
        return configs

    async def alter_configs(self, group_id: str, change: Any, validate_only: bool) -> None:
        """Apply ``change(current) -> new`` (raises ShareConfigError) and store it."""
        new = change(await self.configs(group_id, fresh=True))
        if not validate_only:
            await self.store.set_configs(group_id, new)
            self._configs.pop(group_id, None)

    # -- the coordinator: ShareGroupHeartbeat -------------------------------------------

    async def heartbeat(self, conn: object, version: int, body: dict[str, Any],
                        ) -> dict[str, Any]:
        gid = body["group_id"]
        if not gid:
            return {"error_code": ErrorCode.INVALID_GROUP_ID,
                    "error_message": "a share group needs a group id"}
        if not self.gw.owns(f"group/{gid}"):
            return {"error_code": ErrorCode.NOT_COORDINATOR,
                    "error_message": f"gateway {self.gw.node_id} does not coordinate "
                                     f"{gid}; ask FindCoordinator again"}
        if gid in self._deleting:
            return {"error_code": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                    "error_message": f"{gid} is being deleted"}
        classic = self.gw.groups.get(gid)
        if classic is not None and not classic.is_idle:
            return {"error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    "error_message": f"{gid} is a consumer group with members"}
        configs = await self.configs(gid)
        topics = body["subscribed_topic_names"]
        for _ in range(3):  # the topics read, then the group as it is after the reads
            known = self.groups.get(gid)
            wanted = (known.subscribed if known is not None else set()) | set(topics or ())
            counts, ids = await self._topics(wanted)
            group = self.groups.setdefault(gid, ShareGroup(gid))
            if group.subscribed | set(topics or ()) <= wanted:
                break
        beat = group.heartbeat(
            body["member_id"], body["member_epoch"], body["rack_id"], topics,
            trio.current_time(), int(share_configs.value(configs, "share.session.timeout.ms"))
            / 1000, counts, ids)
        if beat.error:
            return {"error_code": beat.error, "error_message": beat.message}
        reply: dict[str, Any] = {
            "member_id": beat.member_id, "member_epoch": beat.epoch,
            "heartbeat_interval_ms": int(share_configs.value(
                configs, "share.heartbeat.interval.ms")),
            "assignment": None}
        if beat.assignment is not None:
            parts = []
            for topic, ps in sorted(beat.assignment.items()):
                tid = await self.gw.topic_id(topic)
                if tid is not None:
                    parts.append({"topic_id": tid, "partitions": list(ps)})
            reply["assignment"] = {"topic_partitions": parts}
        if body["member_epoch"] in (0, -1):
            log.info("kafka_share_member", extra=fields(
                group=gid, member=body["member_id"], epoch=beat.epoch,
                members=len(group.members)))
        if not group.members:
            self.groups.pop(gid, None)
        return reply

    async def _topics(self, names: Iterable[str]) -> tuple[dict[str, int], dict[str, bytes]]:
        """The partition counts and topic ids of the topics of ``names`` that exist."""
        counts: dict[str, int] = {}
        ids: dict[str, bytes] = {}
        for t in sorted(names):
            n = await self.gw.partition_count(t)
            tid = await self.gw.topic_id(t) if n else None
            if n and tid is not None:
                counts[t] = n
                ids[t] = tid
        return counts, ids

    # -- the leader: ShareFetch, ShareAcknowledge ---------------------------------------

    def _session(self, gid: str, mid: str, epoch: int, parts: Iterable[tuple[bytes, int]],
                 now: float) -> tuple[int, _Session | None]:
        key = (gid, mid)
        session = self.sessions.get(key)
        if epoch == 0:
            if session is None and len(self.sessions) >= MAX_SESSIONS:
                return ErrorCode.SHARE_SESSION_LIMIT_REACHED, None
            session = self.sessions[key] = _Session(1, set(parts), now)
            return 0, session
        if session is None:
            return ErrorCode.SHARE_SESSION_NOT_FOUND, None
        if epoch == -1:
            return 0, session
        if epoch != session.epoch:
            return ErrorCode.INVALID_SHARE_SESSION_EPOCH, None
        session.epoch += 1
        session.last = now
        session.parts.update(parts)
        return 0, session

    async def share_fetch(self, conn: object, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        return await (await self.begin_fetch(conn, version, body))()

    async def begin_fetch(self, conn: object, version: int, body: dict[str, Any], *,
                          readable: Callable[[str], bool] = lambda _t: True,
                          ) -> Callable[[], Awaitable[dict[str, Any]]]:
        """A ShareFetch's session check, acknowledgements and forgotten partitions, in
        the connection's order; then what waits for records, which the gateway runs
        beside the requests after it (as a Fetch)."""
        gid, mid, epoch = body["group_id"], body["member_id"], body["share_session_epoch"]

        async def answer(reply: dict[str, Any]) -> dict[str, Any]:
            return reply

        if not gid or not mid:
            return functools.partial(answer, {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "ShareFetch names its group and member"})
        named: list[tuple[bytes, int]] = []
        acks: dict[tuple[bytes, int], list[dict[str, Any]]] = {}
        for t in body["topics"]:
            for p in t["partitions"]:
                tp = (t["topic_id"], p["partition_index"])
                if tp not in acks:
                    named.append(tp)
                acks.setdefault(tp, []).extend(p["acknowledgement_batches"])
        forgotten = {(t["topic_id"], p) for t in body["forgotten_topics_data"]
                     for p in t["partitions"]}
        if epoch == 0 and any(acks.values()):
            return functools.partial(answer, {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "a share session's first fetch acknowledges nothing"})
        if epoch == -1 and forgotten:
            return functools.partial(answer, {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": "a share session's last fetch forgets nothing"})
        now = trio.current_time()
        code, session = self._session(gid, mid, epoch, named, now)
        if session is not None and len(session.parts) > MAX_SESSION_PARTITIONS:
            self.sessions.pop((gid, mid), None)
            await self._release(gid, mid, session.parts)
            return functools.partial(answer, {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": f"a share session names at most {MAX_SESSION_PARTITIONS} "
                                 "partitions; this one was closed"})
        if session is None:
            return functools.partial(answer, {
                "error_code": code,
                "error_message": f"share session of {mid} in {gid}, epoch {epoch}"})
        configs = await self.configs(gid)
        results: dict[tuple[bytes, int], dict[str, Any]] = {}
        for tp, batches in acks.items():
            if batches:
                code, leader = await self._acknowledge(gid, mid, tp, batches, configs,
                                                       readable)
                results[tp] = {"acknowledge_error_code": code, **leader}
        if forgotten:
            session.parts -= forgotten
            await self._release(gid, mid, forgotten)
        if epoch == -1:
            self.sessions.pop((gid, mid), None)
            await self._release(gid, mid, session.parts)
            return functools.partial(answer, self._reply(results, configs, fetch=True))

        async def fetched() -> dict[str, Any]:
            assert session is not None
            await self._fetch(gid, mid, session, body, configs, results, readable)
            return self._reply(results, configs, fetch=True)

        return fetched

    async def share_acknowledge(self, conn: object, version: int, body: dict[str, Any], *,
                                readable: Callable[[str], bool] = lambda _t: True,
                                ) -> dict[str, Any]:
        gid, mid, epoch = body["group_id"], body["member_id"], body["share_session_epoch"]
        if not gid or not mid:
            return {"error_code": ErrorCode.INVALID_REQUEST,
                    "error_message": "ShareAcknowledge names its group and member"}
        if epoch == 0:
            return {"error_code": ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                    "error_message": "ShareAcknowledge continues a session (epoch 0 opens "
                                     "one, with ShareFetch)"}
        code, session = self._session(gid, mid, epoch, (), trio.current_time())
        if session is None:
            return {"error_code": code,
                    "error_message": f"share session of {mid} in {gid}, epoch {epoch}"}
        configs = await self.configs(gid)
        acks: dict[tuple[bytes, int], list[dict[str, Any]]] = {}
        for t in body["topics"]:
            for p in t["partitions"]:
                acks.setdefault((t["topic_id"], p["partition_index"]), []).extend(
                    p["acknowledgement_batches"])
        results: dict[tuple[bytes, int], dict[str, Any]] = {}
        for tp, batches in acks.items():
            code, leader = await self._acknowledge(gid, mid, tp, batches, configs, readable)
            results[tp] = {"error_code": code, **leader}
        if epoch == -1:
            self.sessions.pop((gid, mid), None)
            await self._release(gid, mid, session.parts)
        return self._reply(results, configs, fetch=False)

    def _reply(self, results: dict[tuple[bytes, int], dict[str, Any]],
               configs: dict[str, str], *, fetch: bool) -> dict[str, Any]:
        by_topic: dict[bytes, list[dict[str, Any]]] = {}
        leaders: set[int] = set()
        for (tid, p), res in sorted(results.items()):
            res["partition_index"] = p
            res.setdefault("error_code", 0)
            leader = res.pop("leader", -1)
            res["current_leader"] = {"leader_id": leader,
                                     "leader_epoch": res.pop("leader_epoch", -1)}
            if leader >= 0:
                leaders.add(leader)
            by_topic.setdefault(tid, []).append(res)
        nodes = [{"node_id": n, "host": h, "port": port, "rack": self.gw.racks.get(n)}
                 for n, (h, port) in sorted(self.gw.nodes.items()) if n in leaders]
        reply: dict[str, Any] = {
            "responses": [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()],
            "node_endpoints": nodes}
        if fetch:
            reply["acquisition_lock_timeout_ms"] = int(share_configs.value(
                configs, "share.record.lock.duration.ms"))
        return reply

    # -- share partitions -----------------------------------------------------------------

    async def _locate(self, tp: tuple[bytes, int]) -> tuple[str | None, int]:
        """The topic's name (None: no such topic) and the partition's leader (-1: this
        gateway may lead it; else the gateway that does)."""
        topic = await self.gw.topic_by_id(tp[0])
        if topic is None:
            return None, -1
        key = f"{topic}/{tp[1]}"
        if await self.gw.may_lead(key):
            return topic, -1
        return topic, self.gw.owner(key)

    async def _hold(self, gid: str, topic: str, p: int, tid: bytes,
                    configs: dict[str, str]) -> _Held:
        key = (gid, topic, p)
        settings = share_configs.settings(configs, MAX_LOCKS)
        held = self.held.get(key)
        if held is None or held.topic_id != tid:
            # one load at a time: two fetches loading the same share partition would
            # each hand out records from their own copy
            async with self._loading:
                held = self.held.get(key)
                if held is None or held.topic_id != tid:
                    held = await self._load(gid, topic, p, tid, configs)
                    self.held[key] = held
        held.part.settings = settings
        held.used = trio.current_time()
        return held

    async def _leader(self, topic: str, p: int) -> dict[str, int]:
        """Where a client told NOT_LEADER_OR_FOLLOWER should go: the leader and its
        epoch (librdkafka takes the hint only with an epoch)."""
        count = await self.gw.partition_count(topic) or 0
        epoch = (await self.gw.leader_epochs(topic, count))[p] if p < count else -1
        return {"leader": self.gw.owner(f"{topic}/{p}"), "leader_epoch": epoch}

    async def _load(self, gid: str, topic: str, p: int, tid: bytes,
                    configs: dict[str, str]) -> _Held:
        settings = share_configs.settings(configs, MAX_LOCKS)
        doc, version = await self.store.load(gid, topic, p, tid)
        if doc is not None:
            part = SharePartition.from_state(ShareState.from_doc(doc), settings)
            return _Held(part, version, tid)
        plog = self.gw.partition(topic, p)
        start = await self._initial_start(plog, share_configs.reset_policy(configs))
        held = _Held(SharePartition(start, settings), version, tid)
        await self._store(gid, topic, p, held)
        return held

    async def _initial_start(self, plog: PartitionLog, policy: str) -> int:
        if policy == "earliest":
            return await plog.start_offset()
        if policy == "latest":
            return await plog.high_watermark()
        ts = int(time.time() * 1000) - share_configs.duration_ms(policy)
        found = await plog.offset_for_time(ts)
        return found[0] if found is not None else await plog.high_watermark()

    async def _store(self, gid: str, topic: str, p: int, held: _Held) -> None:
        try:
            held.version = await self.store.save(gid, topic, p, held.topic_id,
                                                 held.part.state().to_doc(), held.version)
        except (BadVersionError, NodeExistsError, NoNodeError):  # (deleted: DeleteGroups)
            if self.held.get((gid, topic, p)) is held:
                del self.held[(gid, topic, p)]
            raise _Lost(f"share partition {topic}/{p} of {gid}: another gateway stored "
                        "its state") from None

    async def _acknowledge(self, gid: str, mid: str, tp: tuple[bytes, int],
                           batches: list[dict[str, Any]], configs: dict[str, str],
                           readable: Callable[[str], bool],
                           ) -> tuple[int, dict[str, int]]:
        """Apply a member's acknowledgement batches of one partition and store the
        result; its error code, and where its leader is when it is not here."""
        topic, leader = await self._locate(tp)
        if topic is None:
            return ErrorCode.UNKNOWN_TOPIC_ID, {}
        if not readable(topic):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED, {}
        if leader >= 0:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, await self._leader(topic, tp[1])
        key = (gid, topic, tp[1])
        try:
            for _ in range(3):
                held = await self._hold(gid, topic, tp[1], tp[0], configs)
                async with held.lock:
                    if self.held.get(key) is not held:
                        continue  # dropped while this waited: read again
                    code = 0
                    prev = -1
                    for b in batches:
                        if b["first_offset"] <= prev:
                            code = ErrorCode.INVALID_REQUEST
                            continue
                        prev = b["last_offset"]
                        code = held.part.acknowledge(mid, b["first_offset"], b["last_offset"],
                                                     b["acknowledge_types"]) or code
                    await self._store(gid, topic, tp[1], held)
                    break
            else:
                return ErrorCode.NOT_LEADER_OR_FOLLOWER, await self._leader(topic, tp[1])
        except _Lost:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, await self._leader(topic, tp[1])
        except (LedgerdError, FencedError, MetadataError) as exc:
            return storage_error_code(exc), {}
        self._wake()
        return code, {}

    async def _release(self, gid: str, mid: str, parts: Iterable[tuple[bytes, int]]) -> None:
        released = False
        for tid, p in parts:
            topic = self.gw.topic_names.get(tid)
            held = self.held.get((gid, topic, p)) if topic is not None else None
            if held is not None:
                async with held.lock:
                    released = held.part.release(mid) or released
        if released:
            self._wake()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def _fetch(self, gid: str, mid: str, session: _Session, body: dict[str, Any],
                     configs: dict[str, str], results: dict[tuple[bytes, int], dict[str, Any]],
                     readable: Callable[[str], bool]) -> None:
        deadline = trio.current_time() + max(body["max_wait_ms"], 0) / 1000
        asked = min(max(body["max_bytes"], 0), FETCH_MAX_BYTES)  # 0: acknowledge only
        max_records = body["max_records"] if body["max_records"] > 0 else 500
        while True:
            # within what the gateway's responses may hold (max_held_response_bytes)
            budget = await self.gw.response_room(asked, deadline) if asked else 0
            if self.sessions.get((gid, mid)) is not session:
                return  # closed, or opened again, while this waited: hand out nothing
            # read on each pass, not from the cache: a change of share.isolation.level
            # answered by another gateway applies to every record produced after it
            configs = await self.configs(gid, fresh=True)
            committed = share_configs.read_committed(configs)
            taken = size = 0
            failed = False
            waits: list[trio.Event] = [self.changed]
            wake = deadline
            order = sorted(session.parts)
            if order:
                first = session.turn % len(order)
                order = order[first:] + order[:first]
            for tp in order:
                if taken >= max_records or size >= budget:
                    break
                res = results.setdefault(tp, {})
                for k in ("error_code", "leader", "leader_epoch"):
                    res.pop(k, None)
                topic, leader = await self._locate(tp)
                # an error stays in the session (the client forgets the partition when
                # it learns so): an id this gateway has not seen yet is unknown for up
                # to a second, and dropping it lost a new topic's partitions for good
                if topic is None:
                    res["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID
                elif not readable(topic):
                    res["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                elif leader >= 0:
                    res.update(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                               **await self._leader(topic, tp[1]))
                if "error_code" in res:
                    failed = True
                    continue
                assert topic is not None
                try:
                    got, records, plog = await self._acquire(
                        gid, mid, topic, tp, configs, max_records - taken, budget - size,
                        committed, first=size == 0)
                except _Lost:
                    res.update(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                               **await self._leader(topic, tp[1]))
                    failed = True
                    continue
                except (LedgerdError, FencedError, MetadataError) as exc:
                    res["error_code"] = storage_error_code(exc)
                    failed = True
                    continue
                if got:
                    res.update(records=records, acquired_records=[
                        {"first_offset": a.first, "last_offset": a.last,
                         "delivery_count": a.count} for a in got])
                    taken += sum(a.last - a.first + 1 for a in got)
                    size += len(records)
                else:
                    waits.append(plog.changed)
                    held = self.held.get((gid, topic, tp[1]))
                    due = held.part.next_deadline() if held is not None else None
                    if due is not None:
                        wake = min(wake, due)
                    if plog.writer is None:
                        wake = min(wake, trio.current_time() + 0.1)
            for tp in [tp for tp, res in results.items() if not res]:
                del results[tp]
            # an error goes back at once (the client finds the new leader), as Kafka's
            if taken or failed or trio.current_time() >= deadline:
                session.turn += 1
                return
            self.gw.response_room_back()  # a parked fetch holds none
            with trio.move_on_at(wake):
                async with trio.open_nursery() as nursery:
                    for ev in waits:
                        nursery.start_soon(_set_then_cancel, ev, nursery.cancel_scope)

    async def _acquire(self, gid: str, mid: str, topic: str, tp: tuple[bytes, int],
                       configs: dict[str, str], max_records: int, budget: int,
                       committed: bool, *, first: bool = True,
                       ) -> tuple[list[Acquired], bytes, PartitionLog]:
        p = tp[1]
        plog = self.gw.partition(topic, p)
        for _ in range(3):
            held = await self._hold(gid, topic, p, tp[0], configs)
            async with held.lock:
                if self.held.get((gid, topic, p)) is not held:
                    continue  # dropped while this waited (a lost write, a move): read again
                if trio.current_time() - held.checked > CHECK_S:
                    # another gateway may have led it meanwhile (a view of the live
                    # gateways this one never saw change) and stored acknowledgements:
                    # records it saw accepted must not be handed out from this copy
                    if await self.store.version(gid, topic, p) != held.version:
                        if self.held.get((gid, topic, p)) is held:
                            del self.held[(gid, topic, p)]
                        continue
                    held.checked = trio.current_time()
                return await self._acquire_held(held, plog, mid, max_records, budget,
                                                committed, first=first)
        raise _Lost(f"share partition {topic}/{p} of {gid} keeps changing hands")

    async def _acquire_held(self, held: _Held, plog: PartitionLog, mid: str, max_records: int,
                            budget: int, committed: bool, *, first: bool = True,
                            ) -> tuple[list[Acquired], bytes, PartitionLog]:
        """``first``: nothing is in the response yet, so a batch larger than ``budget``
        is read all the same (progress, as Fetch's KIP-74 rule); after that a batch
        that does not fit waits for the next fetch, and the response stays within
        its room."""
        now = trio.current_time()
        log_start = await plog.start_offset()
        if held.part.start < log_start:
            held.part.move_start(log_start)
        at = held.part.first_wanted(now)
        if at is None:
            return [], b"", plog
        try:
            data, hw = await plog.read(at, max(1, budget), min_one=first)
        except OffsetOutOfRangeError as exc:
            if at < exc.start:
                held.part.move_start(exc.start)
            return [], b"", plog
        aborted: list[dict[str, int]] = []
        if committed:
            data, _lso, aborted = await transactions.read_committed(plog, at, data, hw)
        dropped = _aborted_batches(data, aborted)
        views = [BatchView(h.base_offset, h.last_offset,
                           not h.attributes & CONTROL and h.base_offset not in dropped)
                 for h in _headers(data)]
        got = held.part.acquire(mid, views, now, max_records)
        return got, _batches_holding(data, got) if got else b"", plog

    # -- housekeeping -------------------------------------------------------------------

    async def tick(self) -> None:
        """Members not heard from, sessions left idle, share partitions this gateway no
        longer leads or that no one used lately (none of their records held), configs
        read long ago."""
        while True:
            await trio.sleep(TICK_S)
            now = trio.current_time()
            for gid, group in list(self.groups.items()):
                counts, ids = await self._topics(group.subscribed)
                gone = group.expire(now, counts, ids)
                if gone:
                    log.info("kafka_share_members_expired", extra=fields(
                        group=gid, members=",".join(gone)))
                if not group.members and self.groups.get(gid) is group:
                    del self.groups[gid]
            for (gid, mid), session in list(self.sessions.items()):
                configs = await self.configs(gid)
                timeout = int(share_configs.value(configs, "share.session.timeout.ms")) / 1000
                if now - session.last > timeout and self.sessions.get((gid, mid)) is session:
                    del self.sessions[(gid, mid)]
                    await self._release(gid, mid, session.parts)
            self.sweep(now)

    def sweep(self, now: float) -> None:
        """Let go of the share partitions this gateway no longer leads or that no one
        used for IDLE_S (none of their records held), and configs read long ago; give
        back the records whose locks ran out."""
        for key, held in list(self.held.items()):
            moved = not self.gw.owns(f"{key[1]}/{key[2]}")
            idle = now - held.used > IDLE_S and held.part.next_deadline() is None
            if (moved or idle) and not held.lock.locked():
                del self.held[key]
        for gid in [g for g, (at, _) in self._configs.items() if now - at > CONFIG_TTL_S]:
            del self._configs[gid]
        if any(h.part.expire(now) for h in self.held.values()):
            self._wake()


async def _set_then_cancel(ev: trio.Event, scope: trio.CancelScope) -> None:
    await ev.wait()
    scope.cancel()
