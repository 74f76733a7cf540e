"""Share groups (KIP-932): the share partition's and the share group's machines, their
stored form, the group configs and the wire declarations. librdkafka's own share
consumer tests (0170-0185 of its suite) run against a real gateway in full conformance
mode (``tests/conformance/librdkafka.toml``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.kafka import share_configs
from ledgerd.kafka.api import REQUESTS, RESPONSES, ApiKey, ErrorCode
from ledgerd.kafka.schema import Reader, decode, encode
from ledgerd.kafka.share_group import Beat, ShareGroup
from ledgerd.kafka.share_partition import (
    AckType,
    BatchView,
    RecordState,
    SharePartition,
    ShareSettings,
    ShareState,
)


def _batches(*ranges: tuple[int, int], control: tuple[int, ...] = ()) -> list[BatchView]:
    return [BatchView(a, b, a not in control) for a, b in ranges]


# -- the share partition -------------------------------------------------------------------

def test_records_go_to_one_member_until_acknowledged_or_their_lock_runs_out() -> None:
    part = SharePartition(0, ShareSettings(lock_s=10, delivery_limit=3))
    got = part.acquire("a", _batches((0, 4), (5, 9)), now=0, max_records=100)
    assert [(g.first, g.last, g.count) for g in got] == [(0, 9, 1)]
    assert part.acquire("b", _batches((0, 4), (5, 9)), now=1, max_records=100) == []
    assert part.acknowledge("a", 0, 4, [AckType.ACCEPT]) == 0
    assert part.start == 5  # the accepted front is done
    # b cannot acknowledge what a holds; a's lock runs out and b gets it, counted twice
    assert part.acknowledge("b", 5, 9, [AckType.ACCEPT]) == ErrorCode.INVALID_RECORD_STATE
    got = part.acquire("b", _batches((5, 9)), now=10, max_records=100)
    assert [(g.first, g.last, g.count) for g in got] == [(5, 9, 2)]


def test_release_redelivers_reject_never_does_and_the_limit_archives() -> None:
    part = SharePartition(0, ShareSettings(lock_s=10, delivery_limit=2))
    part.acquire("a", _batches((0, 2)), now=0, max_records=10)
    assert part.acknowledge("a", 0, 2, [AckType.RELEASE, AckType.REJECT, AckType.ACCEPT]) == 0
    assert part.start == 0 and part.slots[1].state == RecordState.ARCHIVED
    again = part.acquire("b", _batches((0, 2)), now=1, max_records=10)
    assert [(g.first, g.last, g.count) for g in again] == [(0, 0, 2)]
    assert part.acknowledge("b", 0, 0, [AckType.RELEASE]) == 0  # the second delivery
    assert part.start == 3  # archived at the limit: everything is done
    assert part.acquire("c", _batches((0, 2)), now=2, max_records=10) == []


def test_control_batches_and_offsets_no_batch_covers_are_never_handed_out() -> None:
    part = SharePartition(0)
    got = part.acquire("a", _batches((0, 1), (2, 2), (6, 7), control=(2,)), now=0,
                       max_records=10)
    assert [(g.first, g.last) for g in got] == [(0, 1), (6, 7)]
    assert part.acknowledge("a", 0, 1, [AckType.ACCEPT]) == 0
    assert part.start == 6  # 2 (a marker) and 3-5 (no batch) are done


def test_a_batch_is_never_split_and_max_records_stops_at_a_batch_end() -> None:
    part = SharePartition(0)
    got = part.acquire("a", _batches((0, 9), (10, 19)), now=0, max_records=3)
    assert [(g.first, g.last) for g in got] == [(0, 9)]


def test_the_in_flight_window_is_bounded() -> None:
    part = SharePartition(0, ShareSettings(max_locks=10))
    part.acquire("a", _batches((0, 7), (8, 15), (16, 23)), now=0, max_records=100)
    assert part.end == 16  # the second batch began inside the window and was finished
    assert part.first_wanted(0) is None
    part.acknowledge("a", 0, 7, [AckType.ACCEPT])
    assert part.first_wanted(0) == 16


def test_a_member_that_leaves_gives_back_what_it_holds() -> None:
    part = SharePartition(0)
    part.acquire("a", _batches((0, 4)), now=0, max_records=10)
    assert part.release("a")
    assert [(g.first, g.last, g.count)
            for g in part.acquire("b", _batches((0, 4)), now=1, max_records=10)] == [(0, 4, 2)]


def test_bad_acknowledgements_change_nothing() -> None:
    part = SharePartition(0)
    part.acquire("a", _batches((0, 4)), now=0, max_records=10)
    assert part.acknowledge("a", 0, 4, [1, 1]) == ErrorCode.INVALID_REQUEST  # 2 types, 5 offsets
    assert part.acknowledge("a", 0, 4, [9]) == ErrorCode.INVALID_REQUEST
    assert part.acknowledge("a", 3, 7, [1]) == ErrorCode.INVALID_RECORD_STATE  # 5-7: not given
    assert all(s.state == RecordState.ACQUIRED for s in part.slots.values())


def test_the_log_start_moving_past_in_flight_records_drops_them() -> None:
    part = SharePartition(0)
    part.acquire("a", _batches((0, 9)), now=0, max_records=100)
    part.move_start(6)
    assert part.start == 6 and min(part.slots) == 6


_OPS = st.lists(st.tuples(
    st.sampled_from(["acquire", "ack", "release", "tick"]),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 40), st.integers(0, 6), st.sampled_from(list(AckType))), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, limit=st.integers(2, 4))
def test_no_record_is_held_twice_accepted_twice_or_delivered_past_its_limit(
        ops: list[tuple[str, str, int, int, AckType]], limit: int) -> None:
    """Random members acquiring, acknowledging, releasing and waiting: an offset is held
    by one member at a time, an accepted one is never handed out again, no offset is
    delivered more than ``limit`` times, and the stored state read back is the same
    state with the locks given back."""
    batches = _batches(*[(b, b + 2) for b in range(0, 45, 3)], control=(9,))
    part = SharePartition(0, ShareSettings(lock_s=5, delivery_limit=limit, max_locks=20))
    now = 0.0
    holder: dict[int, str] = {}
    accepted: set[int] = set()
    delivered: dict[int, int] = {}
    for op, member, _offset, width, kind in ops:
        if op == "tick":
            now += 3
            for o in [o for o, s in part.slots.items() if o in holder
                      and s.state != RecordState.ACQUIRED]:
                holder.pop(o)
            continue
        if op == "acquire":
            for g in part.acquire(member, batches, now, max_records=5):
                for o in range(g.first, g.last + 1):
                    assert o not in holder or part.slots[o].member == member
                    assert o not in accepted
                    holder[o] = member
                    delivered[o] = delivered.get(o, 0) + 1
                    assert delivered[o] == g.count <= limit
        elif op == "ack":
            mine = sorted(o for o, m in holder.items() if m == member
                          and o in part.slots and part.slots[o].state == RecordState.ACQUIRED
                          and part.slots[o].deadline > now)
            if mine:
                first = mine[0]
                last = first
                while last + 1 in mine and last - first < width:
                    last += 1
                assert part.acknowledge(member, first, last, [kind]) == 0
                for o in range(first, last + 1):
                    holder.pop(o)
                    if kind == AckType.ACCEPT:
                        accepted.add(o)
        else:
            part.release(member)
            for o in [o for o, m in holder.items() if m == member]:
                holder.pop(o)
        assert part.end - part.start <= 20 + 2
        back = SharePartition.from_state(ShareState.from_doc(part.state().to_doc()),
                                         part.settings)
        assert back.start == part.start
        for o in range(part.start, part.end):
            mine_slot, its = part.slots.get(o), back.slots.get(o)
            if mine_slot is None or its is None:
                continue
            want = RecordState.AVAILABLE if mine_slot.state == RecordState.ACQUIRED \
                else mine_slot.state
            assert (its.state, its.count) == (want, mine_slot.count)


def test_every_record_is_delivered_and_accepted_once_by_members_that_accept_all() -> None:
    part = SharePartition(0, ShareSettings(max_locks=16))
    batches = _batches(*[(b, b + 3) for b in range(0, 200, 4)])
    seen: list[int] = []
    now = 0.0
    for turn in range(200):
        member = "abc"[turn % 3]
        for g in part.acquire(member, batches, now, max_records=7):
            seen.extend(range(g.first, g.last + 1))
            assert part.acknowledge(member, g.first, g.last, [AckType.ACCEPT]) == 0
        now += 0.1
    assert sorted(seen) == list(range(200)) and part.start == 200


@pytest.mark.parametrize("doc", [
    {}, {"start": -1}, {"start": 0, "runs": [[3, 2, 0, 0]]},
    {"start": 5, "runs": [[4, 6, 2, 1]]}, {"start": 0, "runs": [[0, 1, 1, 1]]},
    {"start": 0, "runs": [[0, 1, 2]]}, {"start": 0, "runs": [[0, 1, 2, 1], [1, 2, 2, 1]]},
])
def test_a_malformed_stored_state_is_refused_by_name(doc: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="share partition state"):
        ShareState.from_doc(doc)


# -- the share group ------------------------------------------------------------------------

def _beat(group: ShareGroup, member: str, epoch: int, topics: list[str] | None = None,
          now: float = 0, counts: dict[str, int] | None = None) -> Beat:
    return group.heartbeat(member, epoch, None, topics, now, 45,
                           counts if counts is not None else {"t": 4, "u": 1})


def test_members_join_and_share_the_partitions_and_a_leaver_gives_them_back() -> None:
    g = ShareGroup("g")
    a = _beat(g, "a", 0, ["t"])
    assert a.error == 0 and a.assignment == {"t": (0, 1, 2, 3)}
    b = _beat(g, "b", 0, ["t"])
    assert b.assignment is not None and b.assignment["t"] in ((0, 2), (1, 3))
    a2 = _beat(g, "a", a.epoch)
    assert a2.assignment is not None and a2.epoch > a.epoch
    assert set(a2.assignment["t"]) | set(b.assignment["t"]) == {0, 1, 2, 3}
    assert _beat(g, "b", -1).epoch == -1
    a3 = _beat(g, "a", a2.epoch)
    assert a3.assignment == {"t": (0, 1, 2, 3)}


def test_more_members_than_partitions_all_read_one() -> None:
    g = ShareGroup("g")
    beats = [_beat(g, m, 0, ["u"]) for m in "abc"]
    for m, b in zip("abc", beats, strict=True):
        got = _beat(g, m, b.epoch).assignment or b.assignment
        assert got == {"u": (0,)}


def test_stale_and_unknown_members_are_told_to_rejoin() -> None:
    g = ShareGroup("g")
    a = _beat(g, "a", 0, ["t"])
    assert _beat(g, "a", a.epoch + 5).error == ErrorCode.FENCED_MEMBER_EPOCH
    assert _beat(g, "x", 3).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert _beat(g, "", 0, ["t"]).error == ErrorCode.INVALID_REQUEST


def test_a_silent_member_expires_and_a_new_partition_is_assigned() -> None:
    g = ShareGroup("g")
    a = _beat(g, "a", 0, ["t"], now=0)
    _beat(g, "b", 0, ["t"], now=40)
    assert g.expire(50, {"t": 4}) == ["a"]
    b = _beat(g, "b", g.members["b"].epoch, now=51, counts={"t": 6})
    assert b.assignment == {"t": (0, 1, 2, 3, 4, 5)}
    assert a.epoch < b.epoch


# -- the group configs --------------------------------------------------------------------

def test_group_configs_are_checked_and_named() -> None:
    cur = share_configs.altered({}, [("share.auto.offset.reset", 0, "earliest"),
                                     ("share.record.lock.duration.ms", 0, "3000")])
    assert share_configs.settings(cur, 2000).lock_s == 3.0
    assert share_configs.altered(cur, [("share.auto.offset.reset", 1, None)]) == {
        "share.record.lock.duration.ms": "3000"}
    for ops, match in (([("share.nope", 0, "1")], "not a group config"),
                       ([("share.isolation.level", 0, "dirty")], "read_committed"),
                       ([("share.record.lock.duration.ms", 0, "10")], "from 1000"),
                       ([("share.auto.offset.reset", 2, "x")], "APPEND")):
        with pytest.raises(share_configs.ShareConfigError, match=match):
            share_configs.altered(cur, ops)
    assert share_configs.duration_ms("by_duration:PT1H30M") == 5_400_000
    entries = {e["name"]: e for e in share_configs.entries(cur, None)}
    assert entries["share.record.lock.duration.ms"]["value"] == "3000"
    assert entries["share.isolation.level"]["is_default"] is True
    # Kafka 4's consumer group configs are taken for any group, in Kafka's ranges
    kip848 = share_configs.altered({}, [("consumer.session.timeout.ms", 0, "50000")])
    assert kip848 == {"consumer.session.timeout.ms": "50000"}
    with pytest.raises(share_configs.ShareConfigError, match="from 5000 to 15000"):
        share_configs.altered({}, [("consumer.heartbeat.interval.ms", 0, "100")])


# -- the wire -------------------------------------------------------------------------------

def test_the_heartbeat_assignment_is_a_nullable_struct_as_librdkafka_reads_it() -> None:
    msg = RESPONSES[ApiKey.SHARE_GROUP_HEARTBEAT]
    none = b"".join(encode(msg, 1, {"member_id": "m", "member_epoch": 3,
                                    "heartbeat_interval_ms": 5000, "assignment": None}))
    # throttle, error, null message, "m", epoch, interval, then -1: no assignment, tags
    assert none == (bytes(4) + bytes(2) + b"\x00" + b"\x02m" + (3).to_bytes(4, "big")
                    + (5000).to_bytes(4, "big") + b"\xff" + b"\x00")
    some = b"".join(encode(msg, 1, {"member_id": "m", "member_epoch": 3,
                                    "heartbeat_interval_ms": 5000, "assignment": {
                                        "topic_partitions": [{"topic_id": b"\x01" * 16,
                                                              "partitions": [0, 2]}]}}))
    back = decode(msg, 1, Reader(some))
    assert back["assignment"]["topic_partitions"][0]["partitions"] == [0, 2]


def test_a_share_fetch_with_acknowledgements_decodes() -> None:
    msg = REQUESTS[ApiKey.SHARE_FETCH]
    body = {"group_id": "g", "member_id": "m", "share_session_epoch": 2, "max_wait_ms": 500,
            "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500, "batch_size": 500,
            "topics": [{"topic_id": b"\x02" * 16, "partitions": [{
                "partition_index": 1, "acknowledgement_batches": [
                    {"first_offset": 4, "last_offset": 6, "acknowledge_types": [1, 2, 0]}]}]}],
            "forgotten_topics_data": []}
    back = decode(msg, 1, Reader(b"".join(encode(msg, 1, body))))
    assert back["topics"][0]["partitions"][0]["acknowledgement_batches"][0][
        "acknowledge_types"] == [1, 2, 0]


def test_a_topic_made_again_under_its_name_is_assigned_again_with_its_new_id() -> None:
    g = ShareGroup("g")
    a = g.heartbeat("a", 0, None, ["t"], 0, 45, {"t": 2}, {"t": b"\x01" * 16})
    same = g.heartbeat("a", a.epoch, None, None, 1, 45, {"t": 2}, {"t": b"\x01" * 16})
    assert same.assignment is None and same.epoch == a.epoch
    again = g.heartbeat("a", a.epoch, None, None, 2, 45, {"t": 2}, {"t": b"\x02" * 16})
    assert again.epoch > a.epoch and again.assignment == {"t": (0, 1)}
