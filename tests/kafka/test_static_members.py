"""Static membership (group.instance.id, KIP-345) in the group machine, without
sockets: a static member that comes back under a new member id while the group is
stable is answered at once, keeps its assignment and causes no rebalance; its old
incarnation is fenced; a changed subscription or another state means a rebalance; it
leaves by session expiry or by instance id."""

from __future__ import annotations

import time
from typing import Any

from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.groups import SUBSCRIPTION, Group, GroupSettings, GroupState
from ledgerd.kafka.schema import encode
from tests.kafka.conftest import KafkaCluster

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


def _subscription(*topics: str) -> bytes:
    return b"".join(encode(SUBSCRIPTION, 0, {"version": 0, "topics": list(topics)}))


def _join(g: Group, member: str, now: float, instance: str | None, *topics: str) -> Any:
    return g.join(member_id=member, client_id="c", protocol_type="consumer",
                  protocols=[("range", _subscription(*(topics or ("t",))))],
                  session_timeout_ms=10000, rebalance_timeout_ms=5000, now=now,
                  instance_id=instance)


def _two_static_members() -> tuple[Group, str, str]:
    """A stable group of static members a (the leader) and b."""
    g = Group("g", GroupSettings(initial_rebalance_delay_s=0.05))
    ja = _join(g, "", 0.0, "inst-a")
    jb = _join(g, "", 0.0, "inst-b")
    g.tick(0.05)
    a, b = ja.value["member_id"], jb.value["member_id"]
    assert ja.value["leader"] == a and ja.value["generation_id"] == 1
    assert {m["group_instance_id"] for m in ja.value["members"]} == {"inst-a", "inst-b"}
    g.sync(member_id=a, generation=1, assignments=[(a, b"A"), (b, b"B")], now=0.1)
    sb = g.sync(member_id=b, generation=1, assignments=[], now=0.1)
    assert sb.value == {"error_code": 0, "assignment": b"B"}
    assert g.state is GroupState.STABLE
    return g, a, b


def test_a_restarted_static_member_rejoins_a_stable_group_without_a_rebalance() -> None:
    g, a, b = _two_static_members()
    back = _join(g, "", 1.0, "inst-b").value  # b's process restarted: no member id
    new_b = back["member_id"]
    assert back["error_code"] == 0 and new_b != b
    assert back["generation_id"] == 1 and back["leader"] == a and back["members"] == []
    assert g.state is GroupState.STABLE and g.generation == 1
    assert g.sync(member_id=new_b, generation=1, assignments=[], now=1.1).value == \
        {"error_code": 0, "assignment": b"B"}
    assert g.heartbeat(member_id=a, generation=1, now=1.2) == ErrorCode.NONE  # no rebalance
    # the old incarnation is fenced, whatever it sends
    assert g.heartbeat(member_id=b, generation=1, now=1.2,
                       instance_id="inst-b") == ErrorCode.FENCED_INSTANCE_ID
    assert _join(g, b, 1.3, "inst-b").value["error_code"] == ErrorCode.FENCED_INSTANCE_ID
    assert g.check_commit(member_id=b, generation=1,
                          instance_id="inst-b") == ErrorCode.FENCED_INSTANCE_ID
    assert g.check_commit(member_id=new_b, generation=1, instance_id="inst-b") == 0
    assert {m.instance_id for m in g.summary().members} == {"inst-a", "inst-b"}


def test_a_returning_leader_is_not_told_it_leads() -> None:
    g, a, _ = _two_static_members()
    back = _join(g, "", 1.0, "inst-a").value
    assert back["leader"] == a != back["member_id"]  # the old id: no trivial assignment
    assert g.leader == back["member_id"] and g.state is GroupState.STABLE


def test_a_static_member_with_a_new_subscription_causes_a_rebalance() -> None:
    g, a, _ = _two_static_members()
    pending = _join(g, "", 1.0, "inst-b", "t", "u")
    assert pending.value is None and g.state is GroupState.PREPARING_REBALANCE
    assert g.heartbeat(member_id=a, generation=1, now=1.1) == ErrorCode.REBALANCE_IN_PROGRESS


def test_a_dynamic_member_still_causes_a_rebalance() -> None:
    g, _, _ = _two_static_members()
    assert _join(g, "", 1.0, None).value is None
    assert g.state is GroupState.PREPARING_REBALANCE


def test_a_static_member_leaves_by_session_expiry_or_by_instance_id() -> None:
    g, a, b = _two_static_members()
    g.heartbeat(member_id=a, generation=1, now=9.0)
    g.tick(10.5)  # b silent for over its 10 s session: gone, its instance id free
    assert b not in g.members and "inst-b" not in g.static
    g, a, b = _two_static_members()
    assert g.leave(member_id="", instance_id="inst-b", now=1.0) == ErrorCode.NONE
    assert b not in g.members and g.state is GroupState.PREPARING_REBALANCE
    assert g.leave(member_id="other", instance_id="inst-a",
                   now=1.0) == ErrorCode.FENCED_INSTANCE_ID
    assert g.leave(member_id="", instance_id="nobody", now=1.0) == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_restarted_static_consumer_gets_its_partitions_back_without_a_rebalance(
        kafka_cluster: KafkaCluster) -> None:
    """confluent-kafka (JoinGroup v5, SyncGroup/Heartbeat v3): two static consumers
    share a topic; one is closed (a static member sends no LeaveGroup) and a new
    process with its instance id starts: it gets the same partitions, and the other
    consumer's assignment is never revoked."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = "static-a", "static-g"
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 4)])[topic].result(BOUND_S)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    for p in range(4):
        producer.produce(topic, value=b"x", partition=p)
    assert producer.flush(BOUND_S) == 0

    events: dict[str, list[str]] = {"a": [], "b": [], "b2": []}

    def consumer(name: str, instance: str) -> Any:
        c = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group,
                      "group.instance.id": instance, "session.timeout.ms": 30000,
                      "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})
        c.subscribe([topic],
                    on_assign=lambda _c, parts: events[name].append(
                        "assign " + ",".join(str(p.partition) for p in parts)),
                    on_revoke=lambda _c, parts: events[name].append(
                        "revoke " + ",".join(str(p.partition) for p in parts)))
        return c

    a, b = consumer("a", "inst-a"), consumer("b", "inst-b")
    try:
        _poll_until("both are assigned two partitions", [a, b],
                    lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2)
        mine = sorted(p.partition for p in b.assignment())
        b.close()
        b2 = consumer("b2", "inst-b")
        try:
            _poll_until("the restarted consumer has its partitions", [a, b2],
                        lambda: sorted(p.partition for p in b2.assignment()) == mine)
            for _ in range(10):  # a second more: still no rebalance for a
                a.poll(0.1)
                b2.poll(0.0)
            assert events["a"] == [events["a"][0]] and events["a"][0].startswith("assign")
            assert len(a.assignment()) == 2
        finally:
            b2.close()
    finally:
        a.close()


def _poll_until(what: str, consumers: list[Any], check: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.1)
        if check():
            return
    raise AssertionError(f"not within {BOUND_S} s: {what}")
