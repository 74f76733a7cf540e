"""The group and cluster admin decisions without sockets: what DescribeGroups says of a
group in each state, which groups DeleteGroups and which offsets OffsetDelete may
delete, ListGroups' filters, and the refusal of a request at a version the gateway
does not serve (every declared version encodes, every entity refused)."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerd.kafka.api import DECLARED, REQUESTS, RESPONSES, SUPPORTED, ApiKey, ErrorCode
from ledgerd.kafka.groups import (
    SUBSCRIPTION,
    Group,
    GroupSettings,
    GroupState,
    GroupSummary,
    listed,
    subscribed_topics,
)
from ledgerd.kafka.refusals import refusal
from ledgerd.kafka.schema import (
    BOOL,
    BYTES,
    STRING,
    UUID,
    Array,
    Field,
    Reader,
    decode,
    encode,
)


def _subscription(*topics: str) -> bytes:
    """A consumer's subscription as Kafka's clients write it (v1: + user data, owned
    partitions, which the parser skips)."""
    head = b"".join(encode(SUBSCRIPTION, 0, {"version": 1, "topics": list(topics)}))
    return head + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00"


def _join(g: Group, member: str, now: float, *topics: str, client: str = "c",
          protocol_type: str = "consumer") -> Any:
    return g.join(member_id=member, client_id=client, protocol_type=protocol_type,
                  protocols=[("range", _subscription(*topics)),
                             ("roundrobin", _subscription(*topics) + b"rr")],
                  session_timeout_ms=10000, rebalance_timeout_ms=5000, now=now,
                  client_host="/10.0.0.7")


def _stable(*topics: str, protocol_type: str = "consumer") -> tuple[Group, str]:
    g = Group("g", GroupSettings(initial_rebalance_delay_s=0.0))
    joined = _join(g, "", 0.0, *topics, protocol_type=protocol_type).value
    me = joined["member_id"]
    g.sync(member_id=me, generation=joined["generation_id"], assignments=[(me, b"mine")],
           now=0.1)
    assert g.state is GroupState.STABLE
    return g, me


def test_subscriptions_parse_to_their_topics_and_garbage_to_none() -> None:
    assert subscribed_topics(_subscription("a", "b")) == frozenset({"a", "b"})
    assert subscribed_topics(b"\x00\x01\x00\x00\x00\x05") is None  # 5 topics, no bytes
    assert subscribed_topics(b"") is None


def test_a_stable_group_describes_its_members_with_their_bytes() -> None:
    g, me = _stable("t1")
    s = g.summary()
    assert (s.state, s.protocol_type, s.protocol) == (GroupState.STABLE, "consumer", "range")
    [m] = s.members
    assert (m.member_id, m.client_id, m.client_host) == (me, "c", "/10.0.0.7")
    assert m.metadata == _subscription("t1") and m.assignment == b"mine"


def test_a_rebalancing_group_describes_members_without_bytes_or_protocol() -> None:
    g, _ = _stable("t1")
    _join(g, "", 1.0, "t1", client="d")  # a second member: the group prepares a rebalance
    s = g.summary()
    assert s.state is GroupState.PREPARING_REBALANCE and s.protocol == ""
    assert len(s.members) == 2 and all(not m.metadata and not m.assignment for m in s.members)
    with pytest.raises(ValueError, match="stable"):
        GroupSummary(state=GroupState.EMPTY, protocol_type="", protocol="range", members=())


def test_only_an_empty_group_is_deleted_and_a_dead_one_takes_no_joins_or_commits() -> None:
    g, me = _stable("t1")
    assert g.delete() == ErrorCode.NON_EMPTY_GROUP and g.state is GroupState.STABLE
    assert g.leave(member_id=me, now=1.0) == 0 and g.state is GroupState.EMPTY
    assert g.delete() == ErrorCode.NONE and g.state is GroupState.DEAD
    assert g.delete() == ErrorCode.GROUP_ID_NOT_FOUND
    late = _join(g, "", 2.0, "t1").value
    assert late["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE and not g.members
    assert g.check_commit(member_id="", generation=-1) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert g.offset_deletion(["t1"]) == (ErrorCode.GROUP_ID_NOT_FOUND, {})


def test_a_group_is_known_with_members_or_a_record_until_deleted() -> None:
    fresh = Group("new", GroupSettings())
    assert not fresh.is_known  # a name a client mentioned, nothing more
    fresh.persisted = 0  # its record was read (or made by a commit)
    assert fresh.is_known
    g, me = _stable("t1")
    assert g.is_known and g.persisted == -1  # generation 1 not stored yet: still known
    g.leave(member_id=me, now=1.0)
    assert g.is_known  # no members, the record of generation 1 about to be stored
    g.delete()
    assert not g.is_known


def test_offset_delete_refuses_the_topics_a_live_member_subscribes_to() -> None:
    g, me = _stable("t1", "t2")
    assert g.offset_deletion(["t1", "t3"]) == (
        ErrorCode.NONE, {"t1": ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC, "t3": ErrorCode.NONE})
    g.leave(member_id=me, now=1.0)  # empty: every offset may go
    assert g.offset_deletion(["t1"]) == (ErrorCode.NONE, {"t1": ErrorCode.NONE})
    other, _ = _stable("t1", protocol_type="connect")  # not consumers: nothing while live
    assert other.offset_deletion(["t9"]) == (ErrorCode.NON_EMPTY_GROUP, {})
    odd = Group("odd", GroupSettings(initial_rebalance_delay_s=0.0))
    odd.join(member_id="", client_id="c", protocol_type="consumer",
             protocols=[("range", b"\x00")], session_timeout_ms=10000,
             rebalance_timeout_ms=0, now=0)
    # a subscription that does not parse may name any topic: refuse them all
    assert odd.offset_deletion(["t9"]) == (
        ErrorCode.NONE, {"t9": ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC})


def test_list_filters_compare_states_case_insensitively_and_every_group_is_classic() -> None:
    assert listed(GroupState.STABLE, [], [])
    assert listed(GroupState.STABLE, ["stable", "Empty"], [])
    assert not listed(GroupState.PREPARING_REBALANCE, ["Stable"], [])
    assert listed(GroupState.EMPTY, [], ["Classic"])
    assert not listed(GroupState.EMPTY, [], ["consumer", "share"])


def _sample(fields: tuple[Field, ...]) -> dict[str, Any]:
    """One of everything: arrays hold one element, so a refusal has entities to refuse."""
    out: dict[str, Any] = {}
    for f in fields:
        kind = f.kind
        if isinstance(kind, Array):
            out[f.name] = [_sample(kind.fields)] if kind.of is None else [
                _scalar(kind.of)]
        else:
            out[f.name] = _scalar(kind)
    return out


def _scalar(kind: Any) -> Any:
    if kind in (STRING,):
        return "s"
    if kind in (BYTES,):
        return b"b"
    if kind is BOOL:
        return False
    if kind is UUID:
        return bytes(16)
    return 1 if kind.fmt else None


def _error_codes(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "error_code"] + [
            c for v in value.values() for c in _error_codes(v)]
    if isinstance(value, list):
        return [c for v in value for c in _error_codes(v)]
    return []


@pytest.mark.parametrize("api", list(ApiKey))
def test_a_refusal_encodes_at_every_declared_version_and_refuses_every_entity(
        api: ApiKey) -> None:
    low, high = DECLARED[api]
    for version in range(low, high + 1):
        raw = b"".join(encode(REQUESTS[api], version, _sample(REQUESTS[api].fields)))
        body = decode(REQUESTS[api], version, Reader(raw))
        reply = refusal(api, body, ErrorCode.UNSUPPORTED_VERSION)
        wire = b"".join(encode(RESPONSES[api], version, reply))
        back = decode(RESPONSES[api], version, Reader(wire))
        if not any(f.name == "error_code" and f.present(version)
                   for f in RESPONSES[api].fields):
            back.pop("error_code", None)  # (Fetch before v7: a default, not on the wire)
        codes = _error_codes(back)
        assert codes and set(codes) == {ErrorCode.UNSUPPORTED_VERSION}, (api, version, back)


def test_the_old_versions_declared_but_not_served_are_the_ones_refused() -> None:
    unserved = {api: [v for v in range(DECLARED[api][0], DECLARED[api][1] + 1)
                      if not SUPPORTED[api][0] <= v <= SUPPORTED[api][1]] for api in ApiKey}
    assert {api: vs for api, vs in unserved.items() if vs} == {
        ApiKey.FETCH: [0, 1, 2, 3], ApiKey.LIST_OFFSETS: [0], ApiKey.OFFSET_COMMIT: [0, 1],
        ApiKey.OFFSET_FETCH: [0]}
    # ListOffsets v0 and OffsetCommit v1 carry fields of their own (Kafka's JSON)
    v0 = b"".join(encode(REQUESTS[ApiKey.LIST_OFFSETS], 0, _sample(
        REQUESTS[ApiKey.LIST_OFFSETS].fields)))
    assert len(v0) == 4 + 4 + 3 + 4 + 4 + 8 + 4  # replica, topics, "s", parts, index, ts, max


def test_a_transactional_commit_is_checked_against_the_member_and_generation_it_names(
        ) -> None:
    """KIP-447: TxnOffsetCommit v3 names the consumer's member, generation and instance;
    a zombie (an old generation, a member the group no longer has) is refused, so its
    transaction cannot commit offsets of partitions that moved. One naming none (v0-2)
    commits as before, even while the group has members."""
    g, me = _stable("t1")
    gen = g.generation
    assert g.check_txn_commit(member_id=me, generation=gen, instance_id=None) == 0
    assert g.check_txn_commit(member_id="", generation=-1, instance_id=None) == 0
    assert g.check_commit(member_id="", generation=-1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert g.check_txn_commit(member_id=me, generation=gen - 1, instance_id=None) \
        == ErrorCode.ILLEGAL_GENERATION
    assert g.check_txn_commit(member_id="gone", generation=gen, instance_id=None) \
        == ErrorCode.UNKNOWN_MEMBER_ID
    # a rebalance: the member rejoined, the group completes it; a transactional commit
    # of the new generation is not held up meanwhile (a plain one is)
    joined = _join(g, me, 1.0, "t1").value
    assert g.state is GroupState.COMPLETING_REBALANCE
    new = joined["generation_id"]
    assert g.check_commit(member_id=me, generation=new) == ErrorCode.REBALANCE_IN_PROGRESS
    assert g.check_txn_commit(member_id=me, generation=new, instance_id=None) == 0
    assert g.check_txn_commit(member_id=me, generation=gen, instance_id=None) \
        == ErrorCode.ILLEGAL_GENERATION
    assert g.leave(member_id=me, now=2.0) == 0 and g.delete() == 0
    assert g.check_txn_commit(member_id="", generation=-1, instance_id=None) \
        == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_the_offset_index_reads_listed_partitions_of_live_topics_and_migrates_group_cursors(
        ) -> None:
    from ledgerd.kafka.offset_index import cursor_groups, indexed_reads

    # a partition beyond the topic's count is not read; a topic gone is to be dropped
    assert indexed_reads({"b": (1, 0, 7), "a": (0,), "gone": (0,)},
                         {"a": 1, "b": 2, "gone": None}) == ({"a": [0], "b": [0, 1]},
                                                             ["gone"])
    # only Kafka groups' cursors (kafka.<group znode>) are indexed
    assert cursor_groups({("t", 0): ["kafka.g", "reader", "kafka.x-6869"],
                          ("t", 1): ["kafka.g"], ("u", 0): ["kafka.", "kafka...", "kafka.h"]}) \
        == {"g": {"t": {0, 1}}, "x-6869": {"t": {0}}, "h": {"u": {0}}}
