"""ACLs through a stock client: confluent-kafka's AdminClient creates, describes and
deletes them, and the gateway enforces them on producers and consumers."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.kafka.conftest import KafkaCluster

BOUND_S = 60


@pytest.fixture
def admin(kafka_cluster: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})


def _binding(topic: str, op: str, permission: str, principal: str = "User:ANONYMOUS",
             pattern: str = "LITERAL") -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType[pattern], principal,
                      "*", AclOperation[op], AclPermissionType[permission])


def test_admin_client_creates_describes_and_deletes_acls(admin: AdminClient) -> None:
    made = [_binding("acl-orders", "READ", "ALLOW", "User:alice"),
            _binding("acl-orders-", "WRITE", "ALLOW", "User:bob", pattern="PREFIXED"),
            _binding("acl-other", "DESCRIBE", "DENY", "User:carol")]
    for future in admin.create_acls(made).values():
        assert future.result(BOUND_S) is None
    # MATCH: every binding that applies to the topic acl-orders-eu
    match = AclBindingFilter(ResourceType.TOPIC, "acl-orders-eu", ResourcePatternType.MATCH,
                             None, None, AclOperation.ANY, AclPermissionType.ANY)
    assert admin.describe_acls(match).result(BOUND_S) == [made[1]]
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert sorted(admin.describe_acls(every).result(BOUND_S)) == sorted(made)
    by_alice = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY,
                                "User:alice", None, AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([by_alice])
    assert [f.result(BOUND_S) for f in deleted.values()] == [[made[0]]]
    assert sorted(admin.describe_acls(every).result(BOUND_S)) == sorted(made[1:])
    for future in admin.delete_acls([every]).values():
        assert sorted(future.result(BOUND_S)) == sorted(made[1:])
    assert admin.describe_acls(every).result(BOUND_S) == []


def test_a_deny_acl_refuses_a_producer_and_a_consumer_until_deleted(
        kafka_cluster: KafkaCluster, admin: AdminClient) -> None:
    topic = "acl-denied"
    admin.create_topics([NewTopic(topic, 1)])[topic].result(BOUND_S)
    for future in admin.create_acls([_binding(topic, "WRITE", "DENY"),
                                     _binding(topic, "READ", "DENY", "User:*"),
                                     _binding(topic, "DESCRIBE", "ALLOW")]).values():
        future.result(BOUND_S)
    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "retries": 0,
                         "message.timeout.ms": 20000})
    producer.produce(topic, b"refused", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(BOUND_S) == 0
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msg = consumer.poll(BOUND_S)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()

    # the denials deleted, a producer's records go through (librdkafka keeps the topic
    # errored in the refused producer until its next metadata refresh)
    denials = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                               None, None, AclOperation.ANY, AclPermissionType.DENY)
    for future in admin.delete_acls([denials]).values():
        assert len(future.result(BOUND_S)) == 2
    # the DESCRIBE binding left still refuses WRITE: the topic has ACLs, none allows it
    errors.clear()
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "retries": 0})
    producer.produce(topic, b"refused", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(BOUND_S) == 0
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    rest = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.ANY, None,
                            None, AclOperation.ANY, AclPermissionType.ANY)
    for future in admin.delete_acls([rest]).values():
        assert len(future.result(BOUND_S)) == 1
    errors.clear()
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    producer.produce(topic, b"accepted", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(BOUND_S) == 0
    assert errors == [None]


def test_describe_groups_reports_the_operations_the_acls_allow(
        kafka_cluster: KafkaCluster, admin: AdminClient) -> None:
    """DescribeGroups v3+ with include_authorized_operations: the bitfield of what the
    caller may do to the group."""
    group = "acl-group"
    admin.create_topics([NewTopic("acl-group-topic", 1)])["acl-group-topic"].result(BOUND_S)
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group})
    try:  # a commit makes the group
        consumer.commit(offsets=[TopicPartition("acl-group-topic", 0, 1)], asynchronous=False)
    finally:
        consumer.close()

    def operations() -> set[AclOperation]:
        [future] = admin.describe_consumer_groups(
            [group], include_authorized_operations=True).values()
        return set(future.result(BOUND_S).authorized_operations)

    # every one a group has (DESCRIBE_CONFIGS and ALTER_CONFIGS since Kafka 4.0)
    assert operations() == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
                            AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    read = AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL,
                      "User:ANONYMOUS", "*", AclOperation.READ, AclPermissionType.ALLOW)
    admin.create_acls([read])[read].result(BOUND_S)
    assert operations() == {AclOperation.READ, AclOperation.DESCRIBE}  # DESCRIBE implied

    def listed() -> set[str]:
        return {g.group_id for g in admin.list_consumer_groups().result(BOUND_S).valid}

    assert group in listed()
    # ListGroups lists every group to a principal that may DESCRIBE the cluster, else
    # the groups it may DESCRIBE: the cluster's DESCRIBE denied (ALTER kept, for the
    # ACL APIs), a group denied too is not listed
    hide = [AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL, "User:*",
                       "*", AclOperation.DESCRIBE, AclPermissionType.DENY),
            AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                       "User:*", "*", AclOperation.DESCRIBE, AclPermissionType.DENY),
            AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                       "User:ANONYMOUS", "*", AclOperation.ALTER, AclPermissionType.ALLOW)]
    for future in admin.create_acls(hide[1:]).values():
        future.result(BOUND_S)
    assert group in listed()
    admin.create_acls(hide[:1])[hide[0]].result(BOUND_S)
    assert group not in listed()
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None,
                             None, AclOperation.ANY, AclPermissionType.ANY)
    assert sorted(admin.delete_acls([every])[every].result(BOUND_S)) == sorted([read, *hide])
    assert group in listed()


def test_metadata_hides_topics_the_principal_may_not_describe(
        kafka_cluster: KafkaCluster, admin: AdminClient) -> None:
    hidden, shown = "acl-hidden", "acl-shown"
    for topic in (hidden, shown):
        admin.create_topics([NewTopic(topic, 1)])[topic].result(BOUND_S)
    deny = _binding(hidden, "DESCRIBE", "DENY", "User:*")
    admin.create_acls([deny])[deny].result(BOUND_S)
    try:
        listed = admin.list_topics(timeout=BOUND_S).topics
        assert shown in listed and hidden not in listed
        named = admin.list_topics(topic=hidden, timeout=BOUND_S).topics[hidden]
        assert named.error is not None
        assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        on_topic = AclBindingFilter(ResourceType.TOPIC, hidden, ResourcePatternType.ANY,
                                    None, None, AclOperation.ANY, AclPermissionType.ANY)
        admin.delete_acls([on_topic])[on_topic].result(BOUND_S)
    assert hidden in admin.list_topics(timeout=BOUND_S).topics


def test_describe_topics_and_cluster_report_the_operations_the_acls_allow(
        kafka_cluster: KafkaCluster, admin: AdminClient) -> None:
    """librdkafka's DescribeTopics and DescribeCluster with
    include_authorized_operations read the bitfields from Metadata v8+ (KIP-430)."""
    from confluent_kafka import TopicCollection

    topic = "acl-ops-topic"
    admin.create_topics([NewTopic(topic, 1)])[topic].result(BOUND_S)

    def topic_ops() -> set[AclOperation]:
        [future] = admin.describe_topics(TopicCollection([topic]),
                                         include_authorized_operations=True).values()
        return set(future.result(BOUND_S).authorized_operations)

    def cluster_ops() -> set[AclOperation]:
        return set(admin.describe_cluster(include_authorized_operations=True)
                   .result(BOUND_S).authorized_operations)

    every_topic_op = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE,
                      AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE,
                      AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    assert topic_ops() == every_topic_op  # no ACL: everyone may (the default)
    assert AclOperation.DESCRIBE in cluster_ops()
    read = _binding(topic, "READ", "ALLOW")
    admin.create_acls([read])[read].result(BOUND_S)
    try:
        assert topic_ops() == {AclOperation.READ, AclOperation.DESCRIBE}  # DESCRIBE implied
    finally:
        match = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                 "User:ANONYMOUS", "*", AclOperation.READ,
                                 AclPermissionType.ALLOW)
        admin.delete_acls([match])[match].result(BOUND_S)
