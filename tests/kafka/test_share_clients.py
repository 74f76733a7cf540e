"""Share groups (KIP-932) from a stock client: confluent-kafka's ShareConsumer
(librdkafka) against real gateway processes. Records are shared among a group's
members, released ones come back, rejected ones do not, and what a member accepted
(commit_sync answered) is never delivered again, across a gateway killed with SIGKILL.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from tests.kafka.conftest import GatewayProcess, running_cluster
from tests.kafka.crash_kit import BOUND_S


def _setup(bootstrap: str, topic: str, partitions: int, group: str, n: int) -> list[bytes]:
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(BOUND_S)
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("share.record.lock.duration.ms", "3000",
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(BOUND_S)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.GROUP, group)])
    got = next(iter(described.values())).result(BOUND_S)
    assert got["share.auto.offset.reset"].value == "earliest"
    values = [b"v%d" % i for i in range(n)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for i, v in enumerate(values):
        producer.produce(topic, v, partition=i % partitions)
    assert producer.flush(BOUND_S) == 0
    return values


def _consumer(bootstrap: str, group: str, topic: str, explicit: bool = False,
              **more: object) -> Any:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit" if explicit else "implicit",
                       **more})
    c.subscribe([topic])
    return c


def test_a_group_shares_the_records_releases_come_back_and_rejects_do_not(
        zk_chroot: str, tmp_path: Path) -> None:
    from confluent_kafka import AcknowledgeType

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        values = _setup(gw.bootstrap, "s", 3, "g", 300)
        a = _consumer(gw.bootstrap, "g", "s", explicit=True)
        b = _consumer(gw.bootstrap, "g", "s", explicit=True)
        seen: dict[bytes, list[tuple[str, int]]] = {}
        released: set[bytes] = set()
        rejected: set[bytes] = set()
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                for name, c in (("a", a), ("b", b)):
                    for m in c.poll(0.5):
                        assert m.error() is None, m.error()
                        v = m.value()
                        seen.setdefault(v, []).append((name, m.delivery_count()))
                        if v.endswith(b"7") and v not in released:
                            released.add(v)  # the first time: given back
                            c.acknowledge(m, AcknowledgeType.RELEASE)
                        elif v.endswith(b"3"):
                            rejected.add(v)
                            c.acknowledge(m, AcknowledgeType.REJECT)
                        else:
                            c.acknowledge(m)
                    for tp, err in c.commit_sync(BOUND_S).items():
                        assert err is None, (tp, err)
                if set(seen) == set(values) and all(len(seen[v]) == 2 for v in released):
                    break
        finally:
            a.close()
            b.close()
        assert set(seen) == set(values)
        assert {name for got in seen.values() for name, _ in got} == {"a", "b"}
        for v, got in seen.items():
            if v in released:  # once released, once accepted, counted 1 then 2
                assert [count for _, count in got] == [1, 2], (v, got)
            else:  # accepted or rejected: never again
                assert len(got) == 1, (v, got)
        assert rejected


def test_what_a_member_accepted_is_not_delivered_again_after_a_gateway_is_killed(
        zk_chroot: str, tmp_path: Path) -> None:
    """A share consumer accepts records (commit_sync answered) while the gateway
    leading the partitions is killed with SIGKILL and started again. Every record is
    delivered, and none it was told it had accepted comes back: acknowledgements are
    stored before they are answered (a record held, not yet accepted, may come back:
    at-least-once)."""
    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    with running_cluster(tmp_path, zk_chroot, 3, gw):
        values = _setup(gw.bootstrap, "k", 2, "g", 400)
        c = _consumer(gw.bootstrap, "g", "k", explicit=True, **{"max.poll.records": 25})
        accepted: set[bytes] = set()
        again: list[bytes] = []
        delivered: set[bytes] = set()
        killed = False
        deadline = time.monotonic() + 120
        quiet_until = 0.0  # after the last record, polls that must deliver nothing
        try:
            while time.monotonic() < deadline:
                if not set(values) - accepted:
                    quiet_until = quiet_until or time.monotonic() + 5  # > the lock time
                    if time.monotonic() > quiet_until:
                        break
                try:
                    batch = c.poll(0.5)
                except Exception:  # the gateway is down: poll again
                    continue
                got = [m for m in batch if m.error() is None]
                for m in got:
                    v = m.value()
                    if v in accepted:
                        again.append(v)
                    delivered.add(v)
                    c.acknowledge(m)
                if not got:
                    continue
                results = c.commit_sync(BOUND_S)
                if results and all(err is None for err in results.values()):
                    accepted.update(m.value() for m in got)
                if not killed and 150 <= len(accepted) < len(values):
                    gw.restart(signal.SIGKILL)
                    killed = True
        finally:
            c.close()
        assert killed
        assert delivered == set(values), sorted(set(values) - delivered)[:10]
        assert again == [], again[:10]


def test_a_share_group_is_listed_deleted_once_empty_and_a_deleted_topic_leaves_no_state(
        zk_chroot: str, tmp_path: Path) -> None:
    """ListGroups lists a share group (type "share"); DeleteGroups refuses it while it
    has members and then deletes its configs and stored share partitions; DeleteTopics
    deletes a topic's share partitions in every share group."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from kazoo.client import KazooClient

    from ledgerd.kafka.api import ApiKey
    from tests.kafka.test_faults import _connect, _reply, _request

    gw = GatewayProcess(zk_chroot, tmp_path / "gateway.log")
    hosts, chroot = zk_chroot.split("/", 1)
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=30)
    root = f"/{chroot}/ledgers/kafka/share_groups"

    def listed() -> dict[str, tuple[str, str]]:
        with _connect(gw) as sock:  # ListGroups v5: every type, every state
            sock.sendall(_request(ApiKey.LIST_GROUPS, 5, {"states_filter": [],
                                                          "types_filter": []}))
            got = _reply(sock, ApiKey.LIST_GROUPS, 5)
        assert got["error_code"] == 0, got
        return {g["group_id"]: (g["group_type"], g["group_state"])
                for g in got["groups"]}  # type: ignore[attr-defined]

    try:
        with running_cluster(tmp_path, zk_chroot, 3, gw):
            admin = AdminClient({"bootstrap.servers": gw.bootstrap})
            for group, topic in (("del-g", "del-s"), ("keep-g", "del-t")):
                values = _setup(gw.bootstrap, topic, 2, group, 20)
                if group == "del-g":  # configs alone do not make a share group
                    assert "del-g" not in listed()
                c = _consumer(gw.bootstrap, group, topic)
                got: set[bytes] = set()
                deadline = time.monotonic() + BOUND_S
                while got != set(values):
                    assert time.monotonic() < deadline, sorted(set(values) - got)
                    got.update(m.value() for m in c.poll(0.5) if m.error() is None)
                c.commit_sync(BOUND_S)
                if group == "del-g":
                    # (librdkafka's list_consumer_groups keeps consumer groups only)
                    assert listed() == {"del-g": ("share", "Stable")}
                    with_members = admin.delete_consumer_groups(["del-g"])["del-g"]
                    try:
                        with_members.result(BOUND_S)
                        raise AssertionError("a share group with members was deleted")
                    except KafkaException as exc:
                        assert exc.args[0].code() == KafkaError.NON_EMPTY_GROUP, exc
                c.close()
            assert sorted(zk.get_children(f"{root}/del-g")) == ["del-s.0", "del-s.1"]
            deadline = time.monotonic() + BOUND_S
            while True:  # the member left on close(); the group is empty
                try:
                    admin.delete_consumer_groups(["del-g"])["del-g"].result(BOUND_S)
                    break
                except KafkaException as exc:
                    assert exc.args[0].code() == KafkaError.NON_EMPTY_GROUP, exc
                    assert time.monotonic() < deadline, "the group never became empty"
                    time.sleep(0.5)
            assert zk.exists(f"{root}/del-g") is None
            assert "del-g" not in listed()
            assert sorted(zk.get_children(f"{root}/keep-g")) == ["del-t.0", "del-t.1"]
            admin.delete_topics(["del-t"])["del-t"].result(BOUND_S)
            assert zk.get_children(f"{root}/keep-g") == []  # its configs stay
    finally:
        zk.stop()
        zk.close()
