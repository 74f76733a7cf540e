"""The share server's I/O against a fake store and log, as two gateways over one
ZooKeeper would see it (findings of a review, each failing before its fix): a gateway
that leads again does not hand out what another leader saw accepted, a copy dropped by
a lost compare-and-set is not used by those waiting for it, a fetch parked by a session
that then closed hands out nothing, state for made-up groups is let go, an error is
answered at once, and a topic's READ is judged as it is served."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from ledgerd.kafka.records import with_base_offset
from ledgerd.kafka.share_server import ShareServer
from ledgerd.metadata.errors import BadVersionError, NodeExistsError

TID = b"\x01" * 16

# virtual time: the lock deadlines and the version check's interval pass without waiting
pytestmark = pytest.mark.usefixtures("autojump_clock")


def _batch(n: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder  # type: ignore[import-untyped]

    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i, headers=[])
    return bytes(b.build())


class FakeStore:
    """ShareStore's interface, with ZooKeeper's compare-and-set."""

    def __init__(self) -> None:
        self.nodes: dict[tuple[str, str, int], tuple[dict[str, Any], int]] = {}

    async def configs(self, gid: str) -> dict[str, str]:
        return {"share.auto.offset.reset": "earliest"}

    async def version(self, gid: str, topic: str, p: int) -> int:
        got = self.nodes.get((gid, topic, p))
        return -1 if got is None else got[1]

    async def load(self, gid: str, topic: str, p: int, tid: bytes,
                   ) -> tuple[dict[str, Any] | None, int]:
        got = self.nodes.get((gid, topic, p))
        return (None, -1) if got is None else (dict(got[0]), got[1])

    async def save(self, gid: str, topic: str, p: int, tid: bytes, state: dict[str, Any],
                   version: int) -> int:
        key = (gid, topic, p)
        if version < 0:
            if key in self.nodes:
                raise NodeExistsError(str(key))
            self.nodes[key] = (state, 0)
            return 0
        if key not in self.nodes:
            raise BadVersionError(str(key), version)
        if self.nodes[key][1] != version:
            raise BadVersionError(str(key), version)
        self.nodes[key] = (state, version + 1)
        return version + 1


class FakeLog:
    def __init__(self) -> None:
        self.data = b""
        self.next = 0
        self.changed = trio.Event()
        self.writer = object()

    def append(self, n: int) -> None:
        self.data += with_base_offset(_batch(n), self.next)
        self.next += n
        self.changed.set()
        self.changed = trio.Event()

    async def start_offset(self) -> int:
        return 0

    async def high_watermark(self) -> int:
        return self.next

    async def read(self, at: int, max_bytes: int, min_one: bool = True,
                   ) -> tuple[bytes, int]:
        from ledgerd.kafka.share_server import _headers

        out, pos = [], 0
        for h in _headers(self.data):
            if h.last_offset >= at:
                out.append(self.data[pos:pos + h.length])
            pos += h.length
        return b"".join(out), self.next


class FakeGateway:
    def __init__(self, node_id: int, log: FakeLog) -> None:
        self.node_id = node_id
        self.log = log
        self.leader = True  # whether this gateway leads t/0 and coordinates the group
        self.store = None
        self.root = "/k"
        self.groups: dict[str, Any] = {}
        self.topic_names = {TID: "t"}
        self.nodes: dict[int, tuple[str, int]] = {}
        self.racks: dict[int, str] = {}

    def owns(self, key: str) -> bool:
        return self.leader

    async def may_lead(self, key: str) -> bool:
        return self.leader

    def owner(self, key: str) -> int:
        return self.node_id if self.leader else 99

    async def topic_by_id(self, tid: bytes) -> str | None:
        return self.topic_names.get(tid)

    async def topic_id(self, name: str) -> bytes | None:
        return TID if name == "t" else None

    async def partition_count(self, name: str) -> int | None:
        return 1 if name == "t" else None

    async def leader_epochs(self, topic: str, count: int) -> list[int]:
        return [7] * count

    def partition(self, topic: str, p: int) -> FakeLog:
        return self.log

    async def response_room(self, want: int, until: float) -> int:
        return want

    def response_room_back(self) -> None:
        pass


def _server(node_id: int, log: FakeLog, store: FakeStore) -> tuple[ShareServer, FakeGateway]:
    gw = FakeGateway(node_id, log)
    srv = ShareServer(gw)  # type: ignore[arg-type]
    srv.store = store  # type: ignore[assignment]
    return srv, gw


def _fetch(mid: str, epoch: int, acks: list[dict[str, Any]] | None = None,
           wait_ms: int = 0) -> dict[str, Any]:
    return {"group_id": "g", "member_id": mid, "share_session_epoch": epoch,
            "max_wait_ms": wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500,
            "batch_size": 500,
            "topics": [{"topic_id": TID, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": acks or []}]}],
            "forgotten_topics_data": []}


def _acquired(reply: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(a["first_offset"], a["last_offset"], a["delivery_count"])
            for t in reply["responses"] for p in t["partitions"]
            for a in p.get("acquired_records", ())]


def _ack_codes(reply: dict[str, Any]) -> list[int]:
    return [p.get("acknowledge_error_code", 0) for t in reply["responses"]
            for p in t["partitions"]]


async def test_a_gateway_that_leads_again_hands_out_what_another_leader_saw_accepted(
        ) -> None:
    """A leads t/0 and has loaded g's share partition; leadership moves to B (A's ZooKeeper
    session expired, or a gateway came and went) and back before A's tick sees it: A
    still has its old copy and hands out again records B's member accepted."""
    log, store = FakeLog(), FakeStore()
    a, gw_a = _server(1, log, store)
    b, _ = _server(2, log, store)
    # A: member m1 opens a session; nothing yet to read, the share partition is loaded
    assert _acquired(await a.share_fetch(None, 1, _fetch("m1", 0))) == []
    assert ("g", "t", 0) in a.held
    # leadership moves to B; three records arrive; m2 reads and accepts them there
    gw_a.leader = False
    log.append(3)
    assert _acquired(await b.share_fetch(None, 1, _fetch("m2", 0))) == [(0, 2, 1)]
    reply = await b.share_fetch(None, 1, _fetch("m2", 1, [
        {"first_offset": 0, "last_offset": 2, "acknowledge_types": [1]}]))
    assert _ack_codes(reply) == [0]  # accepted, stored
    assert store.nodes[("g", "t", 0)][0]["start"] == 3
    # leadership comes back to A, whose view of the live gateways never changed (so
    # nothing made it forget its copy): the copy's stored version tells it is stale
    gw_a.leader = True
    await trio.sleep(0.6)  # past CHECK_S since A last compared (virtual time)
    got = _acquired(await a.share_fetch(None, 1, _fetch("m3", 0)))
    assert got == [], f"accepted records handed out again: {got}"


async def test_a_parked_fetch_hands_records_to_a_session_already_closed() -> None:
    """m1's ShareFetch waits for records; m1 closes its session (ShareAcknowledge epoch
    -1, or the session times out); records arrive: the parked fetch locks them to m1,
    whose session is gone, so nothing gives them back before the lock runs out."""
    log, store = FakeLog(), FakeStore()
    a, _ = _server(1, log, store)
    await a.share_fetch(None, 1, _fetch("m1", 0))
    replies: list[dict[str, Any]] = []

    async def parked() -> None:
        replies.append(await a.share_fetch(None, 1, _fetch("m1", 1, wait_ms=2000)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked)
        await wait_all_tasks_blocked()  # the fetch is parked
        closed = await a.share_acknowledge(None, 1, {
            "group_id": "g", "member_id": "m1", "share_session_epoch": -1, "topics": []})
        assert not closed.get("error_code")
        assert ("g", "m1") not in a.sessions
        log.append(3)
    held = a.held[("g", "t", 0)].part
    assert held.held_by("m1") == 0, \
        f"{held.held_by('m1')} records locked to m1 after its session closed " \
        f"(handed out: {_acquired(replies[0])})"


async def test_a_copy_dropped_by_a_lost_compare_and_set_still_hands_out(
        ) -> None:
    """A fetch that got the share partition from _hold before an acknowledgement's
    compare-and-set lost (so the copy was dropped as stale) waits on its lock and then
    hands out from that stale copy."""
    log, store = FakeLog(), FakeStore()
    a, _ = _server(1, log, store)
    b, _ = _server(2, log, store)
    log.append(3)
    assert _acquired(await a.share_fetch(None, 1, _fetch("m1", 0))) == [(0, 2, 1)]
    # meanwhile B (leading for a moment) had its member accept the same records
    assert _acquired(await b.share_fetch(None, 1, _fetch("m2", 0))) == [(0, 2, 1)]
    await b.share_fetch(None, 1, _fetch("m2", 1, [
        {"first_offset": 0, "last_offset": 2, "acknowledge_types": [1]}]))
    held = a.held[("g", "t", 0)]
    out: list[dict[str, Any]] = []

    async def fetch_m3() -> None:
        out.append(await a.share_fetch(None, 1, _fetch("m3", 0)))  # waits on the lock

    async with trio.open_nursery() as nursery:
        await held.lock.acquire()
        # m1 releases at A: its store will lose the compare-and-set
        nursery.start_soon(a.share_fetch, None, 1, _fetch("m1", 1, [
            {"first_offset": 0, "last_offset": 2, "acknowledge_types": [2]}]))
        await wait_all_tasks_blocked()  # m1's acknowledgement queues on the lock first
        nursery.start_soon(fetch_m3)
        await wait_all_tasks_blocked()
        held.lock.release()
    assert ("g", "t", 0) not in a.held or a.held[("g", "t", 0)] is not held
    assert _acquired(out[0]) == [], f"stale copy handed out {_acquired(out[0])}"


async def test_share_partitions_and_configs_of_groups_no_one_uses_are_let_go() -> None:
    """A client opening and closing sessions under new group ids: the share partitions
    no one holds a record of and the configs read are let go a minute later (the
    stored state of each group id stays: READ on the group, by the ACLs, decides who
    may make one)."""
    log, store = FakeLog(), FakeStore()
    a, _ = _server(1, log, store)
    log.append(3)
    for i in range(200):
        body = _fetch("x", 0)
        body["group_id"] = f"junk-{i}"
        await a.share_fetch(None, 1, body)
        body = {**_fetch("x", -1), "group_id": f"junk-{i}"}
        await a.share_fetch(None, 1, body)
    assert not a.sessions
    a.sweep(trio.current_time() + 61)  # the housekeeping a minute later
    assert len(a.held) == 0 and len(a._configs) == 0, (len(a.held), len(a._configs))


async def test_a_share_fetch_whose_partitions_all_failed_answers_at_once() -> None:
    log, store = FakeLog(), FakeStore()
    a, gw = _server(1, log, store)
    await a.share_fetch(None, 1, _fetch("m1", 0))
    gw.leader = False
    t0 = trio.current_time()
    reply = await a.share_fetch(None, 1, _fetch("m1", 1, wait_ms=1000))
    part = reply["responses"][0]["partitions"][0]
    assert part["error_code"] != 0
    assert part["current_leader"] == {"leader_id": 99, "leader_epoch": 7}
    assert trio.current_time() - t0 < 0.5, "NOT_LEADER_OR_FOLLOWER held back max_wait_ms"


async def test_share_requests_need_read_on_the_topics_they_read() -> None:
    """Kafka: ShareGroupHeartbeat needs DESCRIBE on the subscribed topics (refused as a
    whole), ShareFetch and ShareAcknowledge READ on each topic, judged as it is served:
    TOPIC_AUTHORIZATION_FAILED for that partition, nothing handed out."""
    from ledgerd.kafka.api import ApiKey, ErrorCode
    from ledgerd.kafka.authorization import verdict
    from ledgerd.metadata.kafka_acls import ResourceType

    def group_only(op: object, res: Any) -> bool:  # READ on the group, nothing on topics
        return bool(res.type is ResourceType.GROUP)

    beat = {"group_id": "g", "member_id": "m", "member_epoch": 0, "rack_id": None,
            "subscribed_topic_names": ["secret"]}
    assert verdict(ApiKey.SHARE_GROUP_HEARTBEAT, beat, group_only).refuse == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED
    log, store = FakeLog(), FakeStore()
    a, _ = _server(1, log, store)
    log.append(3)
    fetch = await a.begin_fetch(None, 1, _fetch("m", 0), readable=lambda _t: False)
    reply = await fetch()
    part = reply["responses"][0]["partitions"][0]
    assert part["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert _acquired(reply) == []
    acked = await a.share_acknowledge(None, 1, {
        "group_id": "g", "member_id": "m", "share_session_epoch": 1, "topics": [
            {"topic_id": TID, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
                {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}]}]}]},
        readable=lambda _t: False)
    assert acked["responses"][0]["partitions"][0]["error_code"] == \
        ErrorCode.TOPIC_AUTHORIZATION_FAILED


async def test_a_topic_id_unknown_for_a_moment_stays_in_the_session() -> None:
    """A gateway that has not yet seen a new topic's id answers UNKNOWN_TOPIC_ID for up
    to a second; the partition stays in the session, and once the id is known its
    records are handed out (dropping it stalled librdkafka's 0174: half its partitions
    were never read again, the client naming each only once)."""
    log, store = FakeLog(), FakeStore()
    a, gw = _server(1, log, store)
    log.append(3)
    gw.topic_names = {}
    reply = await a.share_fetch(None, 1, _fetch("m1", 0))
    assert reply["responses"][0]["partitions"][0]["error_code"] == 100  # UNKNOWN_TOPIC_ID
    gw.topic_names = {TID: "t"}
    again = {**_fetch("m1", 1), "topics": []}  # the client names no partition again
    assert _acquired(await a.share_fetch(None, 1, again)) == [(0, 2, 1)]
