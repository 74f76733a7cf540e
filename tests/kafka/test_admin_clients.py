"""Group and cluster administration through stock admin clients against a real gateway,
bookies and ZooKeeper: confluent-kafka's AdminClient (librdkafka: ListGroups v5,
DescribeGroups v5, DeleteGroups v2, OffsetCommit/OffsetFetch for a group's offsets,
Metadata for the cluster) and kafka-python 3's KafkaAdminClient (the newest versions:
DescribeGroups v6, DescribeCluster v2, OffsetDelete). A group with a member is not
deleted, a deleted group's offsets are gone from ZooKeeper, a subscribed topic's
offsets are not deleted; requests sent without ApiVersions at versions the gateway does
not serve are answered UNSUPPORTED_VERSION instead of a closed connection."""

from __future__ import annotations

import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import ledgerd
from ledgerd.kafka.api import RESPONSES, ApiKey, ErrorCode
from ledgerd.kafka.partitions import log_name
from ledgerd.kafka.schema import Reader, decode
from ledgerd.tools.zkserver import ZooKeeperServer
from tests.cluster import fresh_chroot
from tests.kafka.conftest import GatewayProcess, KafkaCluster, running_cluster
from tests.kafka.crash_kit import sees_only, wait_until
from tests.kafka.test_faults import _closed, _connect, _recv, _request
from tests.kafka.test_security import secure_gateway  # noqa: F401 (the fixture)

BOUND_S = 60  # every wait below is bounded; reaching it fails the test


def _produce(cluster: KafkaCluster, topic: str, partitions: int, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for i in range(n):
        producer.produce(topic, value=b"m%d" % i, partition=i % partitions)
    assert producer.flush(BOUND_S) == 0


def _until(what: str, check: Any, step: Any) -> None:
    """Run ``step`` (a client's poll, which waits a little) until ``check()``."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        step()
        if check():
            return
    raise AssertionError(f"not within {BOUND_S} s: {what}")


def _field(value: Any, name: str) -> Any:
    """A decoded consumer-protocol struct's field (an object or its dict form)."""
    return value[name] if isinstance(value, dict) else getattr(value, name)


def _reply(sock: Any, api: ApiKey, version: int) -> dict[str, Any]:
    """The next response on ``sock`` (a flexible one's header has tags after the
    correlation id: response header v1)."""
    size = int.from_bytes(_recv(sock, 4), "big", signed=True)
    r = Reader(_recv(sock, size), 4)
    if RESPONSES[api].is_flexible(version):
        r.skip_tags("response header")
    return decode(RESPONSES[api], version, r)


def _cursors(cluster: KafkaCluster, group: str, topic: str, partitions: int,
             ) -> list[object]:
    """The group's committed-offset cursors in ZooKeeper, read there directly."""
    async def read() -> list[object]:
        async with ledgerd.open_client(cluster.zk) as client:
            return [await client.logs.store.get_cursor(log_name(topic, p), f"kafka.{group}")
                    for p in range(partitions)]
    return trio.run(read)


def test_confluent_admin_lists_describes_and_deletes_groups(
        kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import (
        Consumer,
        ConsumerGroupState,
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    topic = "adm-ck"
    admin.create_topics([NewTopic(topic, num_partitions=2,
                                  replication_factor=1)])[topic].result(BOUND_S)
    _produce(kafka_cluster, topic, 2, 20)
    # an offsets-only group, made by the admin client (a commit without a member)
    idle = ConsumerGroupTopicPartitions("adm-ck-idle", [TopicPartition(topic, 0, 3),
                                                        TopicPartition(topic, 1, 2)])
    admin.alter_consumer_group_offsets([idle])["adm-ck-idle"].result(BOUND_S)
    live = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "adm-ck-live",
                     "client.id": "live-client", "auto.offset.reset": "earliest",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    live.subscribe([topic])
    try:
        _until("the live group is stable with both partitions",
               lambda: len(live.assignment()) == 2, lambda: live.poll(0.1))
        listing = admin.list_consumer_groups().result(BOUND_S)
        assert not listing.errors
        states = {g.group_id: g.state for g in listing.valid}
        assert states["adm-ck-live"] == ConsumerGroupState.STABLE
        assert states["adm-ck-idle"] == ConsumerGroupState.EMPTY
        stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(BOUND_S)
        assert {g.group_id for g in stable.valid} >= {"adm-ck-live"}
        assert "adm-ck-idle" not in {g.group_id for g in stable.valid}

        described = admin.describe_consumer_groups(["adm-ck-live", "adm-ck-idle"])
        d = described["adm-ck-live"].result(BOUND_S)
        assert d.state == ConsumerGroupState.STABLE and not d.is_simple_consumer_group
        assert d.partition_assignor in ("range", "roundrobin")
        [member] = d.members
        assert member.client_id == "live-client" and member.host == "/127.0.0.1"
        assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) \
            == [(topic, 0), (topic, 1)]
        e = described["adm-ck-idle"].result(BOUND_S)
        assert e.state == ConsumerGroupState.EMPTY and e.members == []
        offsets = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions("adm-ck-idle")])["adm-ck-idle"].result(BOUND_S)
        assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == \
            [(0, 3), (1, 2)]

        with pytest.raises(KafkaException) as refused:
            admin.delete_consumer_groups(["adm-ck-live"])["adm-ck-live"].result(BOUND_S)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
        assert all(c is not None for c in _cursors(kafka_cluster, "adm-ck-idle", topic, 2))
        admin.delete_consumer_groups(["adm-ck-idle"])["adm-ck-idle"].result(BOUND_S)
        assert _cursors(kafka_cluster, "adm-ck-idle", topic, 2) == [None, None]
        listing = admin.list_consumer_groups().result(BOUND_S)
        assert "adm-ck-idle" not in {g.group_id for g in listing.valid}
        gone = admin.describe_consumer_groups(["adm-ck-idle"])["adm-ck-idle"].result(BOUND_S)
        assert gone.state == ConsumerGroupState.DEAD
    finally:
        live.close()  # leaves the group: now it may go
    admin.delete_consumer_groups(["adm-ck-live"])["adm-ck-live"].result(BOUND_S)
    listing = admin.list_consumer_groups().result(BOUND_S)
    assert "adm-ck-live" not in {g.group_id for g in listing.valid}
    cluster = admin.describe_cluster().result(BOUND_S)
    assert cluster.cluster_id == "ledgerd"
    assert [n.port for n in cluster.nodes] == [kafka_cluster.gateway.port]


def test_kafka_python_admin_describes_deletes_offsets_and_groups(
        kafka_cluster: KafkaCluster) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupSubscribedToTopicError, NoError
    from kafka.structs import OffsetAndMetadata

    a, b = TopicPartition("adm-kp-a", 0), TopicPartition("adm-kp-b", 0)
    _produce(kafka_cluster, "adm-kp-a", 1, 5)
    _produce(kafka_cluster, "adm-kp-b", 1, 5)
    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    try:
        # b's offset is committed while the group is empty; then a member reads a
        assert admin.alter_group_offsets("adm-kp", {b: OffsetAndMetadata(4, "m", -1)}) == \
            {b: NoError}
        consumer = KafkaConsumer("adm-kp-a", bootstrap_servers=kafka_cluster.bootstrap,
                                 group_id="adm-kp", client_id="kp-client",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        try:
            got: list[Any] = []
            _until("the member reads adm-kp-a",
                   lambda: len(got) >= 5,
                   lambda: got.extend(m for ms in consumer.poll(100).values() for m in ms))
            consumer.commit()
            listed = {g["group_id"]: g for g in admin.list_groups()}
            assert listed["adm-kp"]["protocol_type"] == "consumer"
            assert listed["adm-kp"]["group_state"] == "Stable"
            desc = admin.describe_groups(["adm-kp"])["adm-kp"]
            assert desc["error"] is None and desc["group_state"] == "Stable"
            assert desc["protocol_type"] == "consumer" and desc["protocol_data"]
            [member] = desc["members"]
            assert member["client_id"] == "kp-client"
            assert list(_field(member["member_metadata"], "topics")) == ["adm-kp-a"]
            assert member["member_assignment"]  # the leader's assignment, decoded
            # a live member subscribes to adm-kp-a: only b's offset may go
            assert admin.delete_group_offsets("adm-kp", [a, b]) == {
                a: GroupSubscribedToTopicError, b: NoError}
            assert _cursors(kafka_cluster, "adm-kp", "adm-kp-b", 1) == [None]
            assert _cursors(kafka_cluster, "adm-kp", "adm-kp-a", 1) != [None]
            assert admin.delete_groups(["adm-kp"]) == {"adm-kp": "NonEmptyGroupError"}
        finally:
            consumer.close()  # commits nothing more and leaves
        assert admin.delete_groups(["adm-kp"]) == {"adm-kp": "OK"}
        assert _cursors(kafka_cluster, "adm-kp", "adm-kp-a", 1) == [None]
        assert "adm-kp" not in {g["group_id"] for g in admin.list_groups()}
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == "ledgerd"
        assert [(br["host"], br["port"]) for br in cluster["brokers"]] == [
            ("127.0.0.1", kafka_cluster.gateway.port)]
        assert cluster["controller_id"] == cluster["brokers"][0]["broker_id"]
    finally:
        admin.close()


def test_requests_without_api_versions_get_answers_not_a_closed_connection(
        kafka_cluster: KafkaCluster) -> None:
    """A client that never asked ApiVersions: the group admin APIs at their oldest and
    newest versions are served, old Fetch/ListOffsets/OffsetCommit versions refused
    entity by entity with UNSUPPORTED_VERSION, and the connection stays open."""
    _produce(kafka_cluster, "adm-raw", 1, 3)
    with _connect(kafka_cluster) as sock:
        for version in (0, 5):
            sock.sendall(_request(ApiKey.LIST_GROUPS, version, {}))
            assert _reply(sock, ApiKey.LIST_GROUPS, version)["error_code"] == 0
        sock.sendall(_request(ApiKey.DESCRIBE_GROUPS, 6, {"groups": ["nobody"]}))
        [nobody] = _reply(sock, ApiKey.DESCRIBE_GROUPS, 6)["groups"]  # type: ignore[misc]
        assert nobody["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND
        sock.sendall(_request(ApiKey.DELETE_GROUPS, 0, {"groups_names": ["nobody"]}))
        assert _reply(sock, ApiKey.DELETE_GROUPS, 0)["results"] == [
            {"group_id": "nobody", "error_code": ErrorCode.GROUP_ID_NOT_FOUND}]
        fetch = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "topics": [
            {"topic": "adm-raw", "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
        sock.sendall(_request(ApiKey.FETCH, 3, fetch))
        [t] = _reply(sock, ApiKey.FETCH, 3)["responses"]  # type: ignore[misc]
        assert t["partitions"][0]["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        sock.sendall(_request(ApiKey.LIST_OFFSETS, 0, {"replica_id": -1, "topics": [
            {"name": "adm-raw", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}))
        [t] = _reply(sock, ApiKey.LIST_OFFSETS, 0)["topics"]  # type: ignore[misc]
        assert t["partitions"][0]["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        sock.sendall(_request(ApiKey.OFFSET_COMMIT, 1, {
            "group_id": "raw", "generation_id": -1, "member_id": "", "topics": [
                {"name": "adm-raw", "partitions": [
                    {"partition_index": 0, "committed_offset": 1,
                     "committed_metadata": None}]}]}))
        [t] = _reply(sock, ApiKey.OFFSET_COMMIT, 1)["topics"]  # type: ignore[misc]
        assert t["partitions"][0]["error_code"] == ErrorCode.UNSUPPORTED_VERSION
        # and the same connection goes on: the current version of Fetch reads records
        sock.sendall(_request(ApiKey.FETCH, 11, fetch))
        [t] = _reply(sock, ApiKey.FETCH, 11)["responses"]  # type: ignore[misc]
        assert t["partitions"][0]["error_code"] == 0 and t["partitions"][0]["records"]
    with _connect(kafka_cluster) as sock:  # a version Kafka never defined: nothing to say
        sock.sendall(_request(ApiKey.LIST_GROUPS, 5, {})[:6] + b"\x00\x09" +
                     _request(ApiKey.LIST_GROUPS, 5, {})[8:])
        assert _closed(sock)


@pytest.fixture
def two_gateways(zookeeper: ZooKeeperServer, tmp_path: Path,
                 ) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with fresh_chroot(zookeeper, "admin_two") as zk:
        a = GatewayProcess(zk, tmp_path / "a.log")
        with running_cluster(tmp_path, zk, 3, a):
            b = GatewayProcess(zk, tmp_path / "b.log")
            b.start()
            # until both see both, each may answer Metadata as a partition's leader
            wait_until(sees_only(a, a, b), "a sees both gateways")
            wait_until(sees_only(b, a, b), "b sees both gateways")
            try:
                yield a, b
            finally:
                if b.running:
                    b.stop(signal.SIGKILL)


def test_each_gateway_lists_the_groups_it_coordinates_and_clients_see_each_once(
        two_gateways: tuple[GatewayProcess, GatewayProcess]) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    a, b = two_gateways
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    _until("both gateways are brokers",
           lambda: len(admin.list_topics(timeout=BOUND_S).brokers) == 2, lambda: None)
    _produce_to(a.bootstrap, "adm-two", 2)
    groups = [f"adm-two-{i}" for i in range(12)]
    for g in groups:  # each commit goes to its group's coordinator
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
            g, [TopicPartition("adm-two", 0, 1)])])[g].result(BOUND_S)
    listed = [x.group_id for x in admin.list_consumer_groups().result(BOUND_S).valid]
    assert Counter(listed) == Counter(groups)  # from both gateways, each group once
    shares = []
    for gw in (a, b):
        host, port = gw.bootstrap.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(_request(ApiKey.LIST_GROUPS, 4, {}))
            shares.append({x["group_id"] for x in _reply(sock, ApiKey.LIST_GROUPS, 4)["groups"]})
    assert shares[0] and shares[1] and not shares[0] & shares[1]  # each its own share
    deleted = admin.delete_consumer_groups(groups)
    for g in groups:
        deleted[g].result(BOUND_S)
    assert admin.list_consumer_groups().result(BOUND_S).valid == []


def _produce_to(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        producer.produce(topic, value=b"m%d" % i, partition=0)
    assert producer.flush(BOUND_S) == 0


def sasl_admin(gw: GatewayProcess, base: Path, user: str) -> Any:
    """confluent-kafka's AdminClient as ``user`` of the secure gateway (sasl_ssl, PLAIN;
    ``alice`` is a client, ``root`` an admin)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": gw.bootstrap, "security.protocol": "sasl_ssl",
                        "ssl.ca.location": str(base / "ca.pem"),
                        "sasl.mechanisms": "PLAIN", "sasl.username": user,
                        "sasl.password": (base / user).read_text().strip()})


def test_deleting_groups_and_their_offsets_needs_the_admin_role(
        secure_gateway: tuple[GatewayProcess, Path],  # noqa: F811
) -> None:
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupAuthorizationFailedError

    gw, base = secure_gateway
    alice, root = sasl_admin(gw, base, "alice"), sasl_admin(gw, base, "root")
    root.list_topics("sec-t", timeout=BOUND_S)  # (made on first mention)
    root.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        "sec-g", [TopicPartition("sec-t", 0, 0)])])["sec-g"].result(BOUND_S)
    assert "sec-g" in {g.group_id for g in alice.list_consumer_groups().result(BOUND_S).valid}
    with pytest.raises(KafkaException) as refused:
        alice.delete_consumer_groups(["sec-g"])["sec-g"].result(BOUND_S)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    # (the gateway logs before it answers; its output reaches the file through a thread)
    wait_until(lambda: "principal=alice api=DELETE_GROUPS roles=client needs=admin"
               in gw.log_text(), "the refusal logged")
    kp = KafkaAdminClient(bootstrap_servers=gw.bootstrap, security_protocol="SASL_SSL",
                          ssl_cafile=str(base / "ca.pem"), sasl_mechanism="PLAIN",
                          sasl_plain_username="alice",
                          sasl_plain_password=(base / "alice").read_text().strip())
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            kp.delete_group_offsets("sec-g", [TopicPartition("sec-t", 0)])
    finally:
        kp.close()
    root.delete_consumer_groups(["sec-g"])["sec-g"].result(BOUND_S)
