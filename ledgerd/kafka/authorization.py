"""What each Kafka request needs the ACLs to allow, and the verdict on it.

Kafka's broker (``KafkaApis``) authorizes each request against the resources it names;
these are its rules, per API (operation on resource):

- Produce: WRITE on the transactional id (if any: else the whole request is
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED), WRITE on each topic (a topic refused gets
  TOPIC_AUTHORIZATION_FAILED, the others are written). Fetch: READ on each topic,
  likewise per topic. ListOffsets: DESCRIBE on the topics.
- Groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit READ on the group
  (and OffsetCommit READ on its topics); OffsetFetch and DescribeGroups DESCRIBE;
  DeleteGroups DELETE; OffsetDelete DELETE on the group and READ on the topics;
  FindCoordinator DESCRIBE on the group or transactional id.
- Transactions: WRITE on the transactional id, and on the topics AddPartitionsToTxn
  names, READ on the group AddOffsetsToTxn and TxnOffsetCommit name (and its topics);
  WriteTxnMarkers CLUSTER_ACTION on the cluster. The hanging-transaction tooling
  (KIP-664): DescribeTransactions DESCRIBE on each transactional id, DescribeProducers
  READ on each topic; ListTransactions is filtered in its handler (only the ids the
  principal may DESCRIBE are listed, ``txn_admin.py``).
- Topic admin: CreateTopics CREATE on the cluster or the topic; DeleteTopics and
  DeleteRecords DELETE; CreatePartitions ALTER; DescribeConfigs DESCRIBE_CONFIGS and
  AlterConfigs / IncrementalAlterConfigs ALTER_CONFIGS on the topic, the group or (a
  broker's) the cluster.
- Cluster: DescribeCluster, DescribeAcls and DescribeLogDirs DESCRIBE on the cluster; CreateAcls and
  DeleteAcls ALTER.
- ApiVersions, SASL and InitProducerId without a transactional id need nothing;
  Metadata and ListGroups are filtered around their handlers
  (``acl_admin.GatewayAcls.authorized_metadata`` / ``authorized_list_groups``).

Kafka answers most denials per entity; the gateway refuses the whole request of any but
Produce and Fetch with the error of the first resource refused (``refusals.py``), so a
request that names one refused group or topic among allowed ones gets the error for all.

Pure: a decoded request body in, a ``Verdict`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ledgerd.kafka.acls import Resource, cluster
from ledgerd.kafka.api import ApiKey, ErrorCode
from ledgerd.metadata.kafka_acls import AclOperation, ResourceType

__all__ = ["DENIAL_CODES", "Need", "Verdict", "needs", "per_topic", "verdict"]

DENIAL_CODES: dict[ResourceType, ErrorCode] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
# DescribeConfigs' resource types (ConfigResource.Type) as ACL resources
_CONFIG_RESOURCES = {2: ResourceType.TOPIC, 4: ResourceType.CLUSTER,
                     8: ResourceType.CLUSTER, 32: ResourceType.GROUP}

Decide = Callable[[AclOperation, Resource], bool]


@dataclass(frozen=True, slots=True)
class Need:
    """One operation on one resource the request needs; ``or_else`` an alternative
    that serves as well (CreateTopics: CREATE on the cluster, or on the topic)."""

    operation: AclOperation
    resource: Resource
    or_else: tuple[AclOperation, Resource] | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """``refuse``: the error for the whole request (None: go on); ``topics``: topics
    of a Produce or Fetch refused one by one (TOPIC_AUTHORIZATION_FAILED)."""

    refuse: int | None = None
    topics: frozenset[str] = frozenset()


def _topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


def _group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


def _txn(name: str) -> Resource:
    return Resource(ResourceType.TRANSACTIONAL_ID, name)


def _topics(op: AclOperation, topics: list[dict[str, Any]] | None,
            key: str = "name") -> list[Need]:
    return [Need(op, _topic(t[key])) for t in topics or ()]


def needs(api: ApiKey, body: dict[str, Any]) -> list[Need]:
    """What the whole request needs, in the order Kafka checks (the first refused
    names the error)."""
    op = AclOperation
    if api is ApiKey.PRODUCE:
        tid = body["transactional_id"]
        return [Need(op.WRITE, _txn(tid))] if tid is not None else []
    if api is ApiKey.LIST_OFFSETS:
        return _topics(op.DESCRIBE, body["topics"])
    if api is ApiKey.OFFSET_FOR_LEADER_EPOCH:
        return _topics(op.DESCRIBE, body["topics"], key="topic")
    if api in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT,
               ApiKey.LEAVE_GROUP):
        return [Need(op.READ, _group(body["group_id"]))]
    if api is ApiKey.SHARE_GROUP_HEARTBEAT:  # and DESCRIBE on the topics it subscribes
        return [Need(op.READ, _group(body["group_id"])),
                *(Need(op.DESCRIBE, _topic(t)) for t in body["subscribed_topic_names"] or ())]
    if api in (ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE):
        # READ on each topic is judged as it is served (share_server: topics by id,
        # and a session's partitions outlive the request that named them)
        return [Need(op.READ, _group(body["group_id"] or ""))]
    if api is ApiKey.OFFSET_COMMIT:
        return [Need(op.READ, _group(body["group_id"])), *_topics(op.READ, body["topics"])]
    if api is ApiKey.OFFSET_FETCH:
        return [Need(op.DESCRIBE, _group(body["group_id"])),
                *_topics(op.DESCRIBE, body["topics"])]
    if api is ApiKey.FIND_COORDINATOR:
        kind = _txn if body["key_type"] == 1 else _group
        return [Need(op.DESCRIBE, kind(body["key"]))]
    if api is ApiKey.DESCRIBE_GROUPS:
        return [Need(op.DESCRIBE, _group(g)) for g in body["groups"]]
    if api is ApiKey.DELETE_GROUPS:
        return [Need(op.DELETE, _group(g)) for g in body["groups_names"]]
    if api is ApiKey.OFFSET_DELETE:
        return [Need(op.DELETE, _group(body["group_id"])), *_topics(op.READ, body["topics"])]
    if api is ApiKey.INIT_PRODUCER_ID:
        tid = body["transactional_id"]
        return [Need(op.WRITE, _txn(tid))] if tid is not None else []
    if api is ApiKey.ADD_PARTITIONS_TO_TXN:
        return [Need(op.WRITE, _txn(body["transactional_id"])),
                *_topics(op.WRITE, body["topics"])]
    if api is ApiKey.ADD_OFFSETS_TO_TXN:
        return [Need(op.WRITE, _txn(body["transactional_id"])),
                Need(op.READ, _group(body["group_id"]))]
    if api is ApiKey.END_TXN:
        return [Need(op.WRITE, _txn(body["transactional_id"]))]
    if api is ApiKey.TXN_OFFSET_COMMIT:
        return [Need(op.WRITE, _txn(body["transactional_id"])),
                Need(op.READ, _group(body["group_id"])), *_topics(op.READ, body["topics"])]
    if api is ApiKey.WRITE_TXN_MARKERS:
        return [Need(op.CLUSTER_ACTION, cluster())]
    if api is ApiKey.DESCRIBE_TRANSACTIONS:
        return [Need(op.DESCRIBE, _txn(tid)) for tid in body["transactional_ids"]]
    if api is ApiKey.DESCRIBE_PRODUCERS:
        return _topics(op.READ, body["topics"])
    if api is ApiKey.CREATE_TOPICS:
        return [Need(op.CREATE, _topic(t["name"]), or_else=(op.CREATE, cluster()))
                for t in body["topics"]]
    if api is ApiKey.DELETE_TOPICS:
        return [Need(op.DELETE, _topic(n)) for n in body["topic_names"]]
    if api is ApiKey.DELETE_RECORDS:
        return _topics(op.DELETE, body["topics"])
    if api is ApiKey.CREATE_PARTITIONS:
        return _topics(op.ALTER, body["topics"])
    if api in (ApiKey.DESCRIBE_CONFIGS, ApiKey.ALTER_CONFIGS,
               ApiKey.INCREMENTAL_ALTER_CONFIGS):
        wanted = op.DESCRIBE_CONFIGS if api is ApiKey.DESCRIBE_CONFIGS else op.ALTER_CONFIGS
        out = []
        for r in body["resources"]:
            rtype = _CONFIG_RESOURCES.get(r["resource_type"])
            if rtype is ResourceType.CLUSTER:
                out.append(Need(wanted, cluster()))
            elif rtype is not None:
                out.append(Need(wanted, Resource(rtype, r["resource_name"])))
        return out
    if api in (ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_ACLS,
               ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, ApiKey.DESCRIBE_LOG_DIRS):
        return [Need(op.DESCRIBE, cluster())]
    if api in (ApiKey.CREATE_ACLS, ApiKey.DELETE_ACLS, ApiKey.ALTER_USER_SCRAM_CREDENTIALS):
        return [Need(op.ALTER, cluster())]
    return []


def per_topic(api: ApiKey, body: dict[str, Any]) -> tuple[AclOperation, list[str]] | None:
    """For Produce and Fetch, the operation each topic needs and the topics named."""
    if api is ApiKey.PRODUCE:
        return AclOperation.WRITE, [t["name"] for t in body["topic_data"]]
    if api is ApiKey.FETCH:
        return AclOperation.READ, [t["topic"] for t in body["topics"]]
    return None


def verdict(api: ApiKey, body: dict[str, Any], allowed: Decide) -> Verdict:
    """The request judged with ``allowed`` (the authorizer, for this connection's
    principal and host)."""
    for need in needs(api, body):
        if allowed(need.operation, need.resource):
            continue
        if need.or_else is not None and allowed(*need.or_else):
            continue
        return Verdict(refuse=DENIAL_CODES[need.resource.type])
    split = per_topic(api, body)
    if split is None:
        return Verdict()
    operation, names = split
    return Verdict(topics=frozenset(n for n in names if not allowed(operation, _topic(n))))
