"""The Kafka APIs the gateway speaks: keys, advertised versions, error codes, schemas.

Every request and response body is declared once here (``schema.Field`` with the
versions that carry it, transcribed from Kafka's ``clients/src/main/resources/common/
message/*.json``); the gateway decodes and encodes through :mod:`ledgerd.kafka.schema`.

Versions are chosen so that librdkafka (kcat, confluent-kafka), kafka-python and
aiokafka negotiate the data path (Produce, Fetch, Metadata, groups) without flexible
encodings; ApiVersions v3-v4 and the group/cluster admin APIs (ListGroups,
DescribeGroups, DeleteGroups, DescribeCluster) are served at every version Kafka
defines, flexible ones included, since admin tools ask for the newest; so are the
topic admin APIs (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs,
CreatePartitions, DeleteRecords), the ACL APIs (DescribeAcls, CreateAcls,
DeleteAcls) and the hanging-transaction tooling (ListTransactions,
DescribeTransactions, DescribeProducers); DescribeLogDirs at 0-4. Produce
advertises 0-8 but answers v0-2 with UNSUPPORTED_VERSION, as Kafka 4 does: librdkafka
drops compression unless Produce's minimum is 0.
"""

from __future__ import annotations

import enum

from ledgerd.kafka.schema import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    STRING,
    UUID,
    Array,
    Field,
    Message,
    array,
    struct_of,
)

__all__ = ["DECLARED", "REQUESTS", "RESPONSES", "SUPPORTED", "ApiKey", "ErrorCode"]


class ApiKey(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    OFFSET_FOR_LEADER_EPOCH = 23
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


class ErrorCode(enum.IntEnum):
    """Kafka's error codes (numbers as in kafka-python's ``kafka/errors.py``)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    INVALID_TIMESTAMP = 32
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    UNKNOWN_TOPIC_ID = 100
    TRANSACTIONAL_ID_NOT_FOUND = 105
    FENCED_MEMBER_EPOCH = 110
    MISMATCHED_ENDPOINT_TYPE = 114
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    SHARE_SESSION_LIMIT_REACHED = 133


# Versions advertised (ApiVersions) and, where narrower, served.
SUPPORTED: dict[ApiKey, tuple[int, int]] = {
    # v8: record_errors and error_message (KIP-467), which a compacted topic's refusal
    # of keyless records fills in
    ApiKey.PRODUCE: (0, 8),
    # the data path at the versions librdkafka 2.15 asks (Fetch 16, Metadata 13,
    # ListOffsets 7, OffsetCommit 9, OffsetForLeaderEpoch 2) and the Java client's
    # (Fetch 17, ListOffsets 10 in 4.0): leader epochs (KIP-320) from Metadata 7,
    # Fetch 9, ListOffsets 4; topic ids from Metadata 10 and Fetch 13
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (1, 10),
    ApiKey.METADATA: (0, 13),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 4),
    ApiKey.OFFSET_COMMIT: (2, 9),
    # OffsetFetch 7: require_stable (KIP-447); 8+ batch several groups, not served
    ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.FIND_COORDINATOR: (0, 2),
    # v3+ of Heartbeat and SyncGroup and v5 of JoinGroup carry group.instance.id
    # (static membership, KIP-345); LeaveGroup v3 leaves by member list
    ApiKey.JOIN_GROUP: (0, 5),
    ApiKey.HEARTBEAT: (0, 3),
    ApiKey.LEAVE_GROUP: (0, 3),
    ApiKey.SYNC_GROUP: (0, 3),
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.CREATE_TOPICS: (0, 4),
    ApiKey.DELETE_TOPICS: (0, 3),
    ApiKey.INIT_PRODUCER_ID: (0, 4),
    # transactions (KIP-98): librdkafka 2.x asks AddPartitionsToTxn and AddOffsetsToTxn
    # 0, EndTxn 0-1, TxnOffsetCommit 0-3, InitProducerId 0-4 (3+: KIP-360's epoch bump
    # to recover from an abortable error); WriteTxnMarkers is the gateways' own
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 3),
    ApiKey.END_TXN: (0, 3),
    ApiKey.WRITE_TXN_MARKERS: (0, 1),
    ApiKey.TXN_OFFSET_COMMIT: (0, 3),
    ApiKey.SASL_AUTHENTICATE: (0, 1),
    # group and cluster admin: every version Kafka 4 defines (librdkafka 2.x asks
    # ListGroups/DescribeGroups up to 5, DeleteGroups 2, OffsetDelete 0; kafka-python 3
    # and the Java admin client take the newest)
    ApiKey.DESCRIBE_GROUPS: (0, 6),
    ApiKey.LIST_GROUPS: (0, 5),
    ApiKey.DELETE_GROUPS: (0, 2),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    # topic admin: every version Kafka 4 defines (librdkafka 2.x asks DescribeConfigs
    # 1, AlterConfigs 2, IncrementalAlterConfigs 1, CreatePartitions 3, DeleteRecords
    # 2; the Java admin client the newest)
    ApiKey.DESCRIBE_CONFIGS: (0, 4),
    ApiKey.ALTER_CONFIGS: (0, 2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ApiKey.CREATE_PARTITIONS: (0, 3),
    ApiKey.DELETE_RECORDS: (0, 2),
    # ACLs (KIP-140; v1 adds pattern types, KIP-290): librdkafka 2.x asks 0-2, the Java
    # admin client 3
    ApiKey.DESCRIBE_ACLS: (0, 3),
    ApiKey.CREATE_ACLS: (0, 3),
    ApiKey.DELETE_ACLS: (0, 3),
    # SCRAM credentials (KIP-554): version 0, the only one Kafka defines, flexible;
    # librdkafka 2.x and the Java admin client ask it
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
    # hanging-transaction tooling (KIP-664: kafka-transactions.sh, kafka-python 3's
    # KafkaAdminClient): DescribeProducers and DescribeTransactions 0, the only versions
    # Kafka defines; ListTransactions 0-2 (v1 DurationFilter, KIP-994; v2
    # TransactionalIdPattern, KIP-1152), all flexible; kafka-python asks the lowest
    # that carries the filters it was given
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
    # topic sizes for Kafka UIs (AKHQ, kafka-ui, Redpanda Console) and kafka-python's
    # describe_log_dirs: 0-4 (flexible from 2; v4 adds the volume's total and usable
    # bytes); the Java admin client asks the newest, librdkafka does not ask it
    ApiKey.DESCRIBE_LOG_DIRS: (0, 4),
    # share groups (KIP-932, Kafka 4.1+): version 1, the first stable one, which
    # librdkafka 2.15's share consumer asks (``share_server.py``)
    ApiKey.SHARE_GROUP_HEARTBEAT: (1, 1),
    ApiKey.SHARE_FETCH: (1, 1),
    ApiKey.SHARE_ACKNOWLEDGE: (1, 1),
}
RECORD_BATCH_PRODUCE = 3  # Produce v0-2 carry message sets (magic 0/1), up-converted

# Versions whose request and response declarations below are faithful to Kafka's
# (wider than SUPPORTED where older versions are declared too): a request at such a
# version that the gateway does not serve is decoded and answered UNSUPPORTED_VERSION
# (``refusals.py``); outside them the gateway cannot read the body or write a reply
# the client would parse, and closes the connection.
DECLARED: dict[ApiKey, tuple[int, int]] = {
    **SUPPORTED,
    ApiKey.FETCH: (0, 17),
    ApiKey.LIST_OFFSETS: (0, 10),
    ApiKey.OFFSET_COMMIT: (0, 9),
    ApiKey.OFFSET_FETCH: (0, 7),
}

THROTTLE = Field("throttle_time_ms", INT32, default=0)
ERROR = Field("error_code", INT16, default=0)

# -- request header (v1; v2 = v1 + tags when the body is flexible) ----------------------
REQUEST_HEADER = Message((
    Field("api_key", INT16), Field("api_version", INT16), Field("correlation_id", INT32),
    Field("client_id", NULLABLE_STRING)))

# an ACL filter (DescribeAcls' body, each of DeleteAcls' filters); 3 = LITERAL
_ACL_FILTER = (
    Field("resource_type_filter", INT8), Field("resource_name_filter", NULLABLE_STRING),
    Field("pattern_type_filter", INT8, since=1, default=3),
    Field("principal_filter", NULLABLE_STRING), Field("host_filter", NULLABLE_STRING),
    Field("operation", INT8), Field("permission_type", INT8))

REQUESTS: dict[ApiKey, Message] = {
    ApiKey.API_VERSIONS: Message((
        Field("client_software_name", STRING, since=3, default=""),
        Field("client_software_version", STRING, since=3, default="")), flexible_from=3),
    ApiKey.METADATA: Message((
        Field("topics", array(Field("topic_id", UUID, since=10, default=bytes(16)),
                              Field("name", NULLABLE_STRING), nullable=True)),
        Field("allow_auto_topic_creation", BOOL, since=4, default=True),
        Field("include_cluster_authorized_operations", BOOL, since=8, until=10,
              default=False),
        Field("include_topic_authorized_operations", BOOL, since=8, default=False)),
        flexible_from=9),
    ApiKey.PRODUCE: Message((
        Field("transactional_id", NULLABLE_STRING, since=3),
        Field("acks", INT16), Field("timeout_ms", INT32),
        Field("topic_data", array(
            Field("name", STRING),
            Field("partition_data", array(Field("index", INT32),
                                          Field("records", NULLABLE_BYTES))))))),
    ApiKey.FETCH: Message((
        # v12+: tagged cluster_id, v15+: tagged replica_state, v17+: each partition's
        # tagged replica_directory_id (skipped: no followers)
        Field("replica_id", INT32, until=14, default=-1),
        Field("max_wait_ms", INT32), Field("min_bytes", INT32),
        Field("max_bytes", INT32, since=3, default=0x7FFFFFFF),
        Field("isolation_level", INT8, since=4, default=0),
        Field("session_id", INT32, since=7, default=0),
        Field("session_epoch", INT32, since=7, default=-1),
        Field("topics", array(
            Field("topic", STRING, until=12, default=""),
            Field("topic_id", UUID, since=13, default=bytes(16)),
            Field("partitions", array(
                Field("partition", INT32),
                Field("current_leader_epoch", INT32, since=9, default=-1),
                Field("fetch_offset", INT64),
                Field("last_fetched_epoch", INT32, since=12, default=-1),
                Field("log_start_offset", INT64, since=5, default=-1),
                Field("partition_max_bytes", INT32))))),
        Field("forgotten_topics_data", array(
            Field("topic", STRING, until=12, default=""),
            Field("topic_id", UUID, since=13, default=bytes(16)),
            Field("partitions", Array.of_scalar(INT32))),
            since=7, default=()),
        Field("rack_id", STRING, since=11, default="")), flexible_from=12),
    ApiKey.LIST_OFFSETS: Message((
        Field("replica_id", INT32),
        Field("isolation_level", INT8, since=2, default=0),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32),
                Field("current_leader_epoch", INT32, since=4, default=-1),
                Field("timestamp", INT64),
                Field("max_num_offsets", INT32, until=0, default=1))))),
        Field("timeout_ms", INT32, since=10, default=0)), flexible_from=6),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: Message((
        Field("replica_id", INT32, since=3, default=-2),
        Field("topics", array(
            Field("topic", STRING),
            Field("partitions", array(
                Field("partition", INT32),
                Field("current_leader_epoch", INT32, since=2, default=-1),
                Field("leader_epoch", INT32)))))), flexible_from=4),
    ApiKey.INIT_PRODUCER_ID: Message((
        Field("transactional_id", NULLABLE_STRING),
        Field("transaction_timeout_ms", INT32),
        Field("producer_id", INT64, since=3, default=-1),
        Field("producer_epoch", INT16, since=3, default=-1)), flexible_from=2),
    ApiKey.ADD_PARTITIONS_TO_TXN: Message((
        Field("transactional_id", STRING), Field("producer_id", INT64),
        Field("producer_epoch", INT16),
        Field("topics", array(Field("name", STRING),
                              Field("partitions", Array.of_scalar(INT32))))),
        flexible_from=3),
    ApiKey.ADD_OFFSETS_TO_TXN: Message((
        Field("transactional_id", STRING), Field("producer_id", INT64),
        Field("producer_epoch", INT16), Field("group_id", STRING)), flexible_from=3),
    ApiKey.END_TXN: Message((
        Field("transactional_id", STRING), Field("producer_id", INT64),
        Field("producer_epoch", INT16), Field("committed", BOOL)), flexible_from=3),
    ApiKey.WRITE_TXN_MARKERS: Message((
        Field("markers", array(
            Field("producer_id", INT64), Field("producer_epoch", INT16),
            Field("transaction_result", BOOL),
            Field("topics", array(Field("name", STRING),
                                  Field("partition_indexes", Array.of_scalar(INT32)))),
            Field("coordinator_epoch", INT32))),), flexible_from=1),
    ApiKey.TXN_OFFSET_COMMIT: Message((
        Field("transactional_id", STRING), Field("group_id", STRING),
        Field("producer_id", INT64), Field("producer_epoch", INT16),
        Field("generation_id", INT32, since=3, default=-1),
        Field("member_id", STRING, since=3, default=""),
        Field("group_instance_id", NULLABLE_STRING, since=3),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32), Field("committed_offset", INT64),
                Field("committed_leader_epoch", INT32, since=2, default=-1),
                Field("committed_metadata", NULLABLE_STRING)))))), flexible_from=3),
    ApiKey.FIND_COORDINATOR: Message((
        Field("key", STRING), Field("key_type", INT8, since=1, default=0))),
    ApiKey.JOIN_GROUP: Message((
        Field("group_id", STRING), Field("session_timeout_ms", INT32),
        Field("rebalance_timeout_ms", INT32, since=1, default=-1),
        Field("member_id", STRING),
        Field("group_instance_id", NULLABLE_STRING, since=5),
        Field("protocol_type", STRING),
        Field("protocols", array(Field("name", STRING), Field("metadata", BYTES))))),
    ApiKey.SYNC_GROUP: Message((
        Field("group_id", STRING), Field("generation_id", INT32), Field("member_id", STRING),
        Field("group_instance_id", NULLABLE_STRING, since=3),
        Field("assignments", array(Field("member_id", STRING),
                                   Field("assignment", BYTES))))),
    ApiKey.HEARTBEAT: Message((
        Field("group_id", STRING), Field("generation_id", INT32),
        Field("member_id", STRING), Field("group_instance_id", NULLABLE_STRING, since=3))),
    ApiKey.LEAVE_GROUP: Message((
        Field("group_id", STRING), Field("member_id", STRING, until=2, default=""),
        Field("members", array(Field("member_id", STRING),
                               Field("group_instance_id", NULLABLE_STRING)),
              since=3, default=()))),
    ApiKey.OFFSET_COMMIT: Message((
        Field("group_id", STRING),
        Field("generation_id", INT32, since=1, default=-1),
        Field("member_id", STRING, since=1, default=""),
        Field("retention_time_ms", INT64, since=2, until=4, default=-1),
        Field("group_instance_id", NULLABLE_STRING, since=7),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32), Field("committed_offset", INT64),
                Field("committed_leader_epoch", INT32, since=6, default=-1),
                Field("commit_timestamp", INT64, since=1, until=1, default=-1),
                Field("committed_metadata", NULLABLE_STRING)))))), flexible_from=8),
    ApiKey.OFFSET_FETCH: Message((
        Field("group_id", STRING),
        Field("topics", array(Field("name", STRING),
                              Field("partition_indexes", Array.of_scalar(INT32)),
                              nullable=True)),
        Field("require_stable", BOOL, since=7, default=False)), flexible_from=6),
    ApiKey.CREATE_TOPICS: Message((
        Field("topics", array(
            Field("name", STRING), Field("num_partitions", INT32),
            Field("replication_factor", INT16),
            Field("assignments", array(Field("partition_index", INT32),
                                       Field("broker_ids", Array.of_scalar(INT32)))),
            Field("configs", array(Field("name", STRING),
                                   Field("value", NULLABLE_STRING))))),
        Field("timeout_ms", INT32),
        Field("validate_only", BOOL, since=1, default=False))),
    ApiKey.DELETE_TOPICS: Message((
        Field("topic_names", Array.of_scalar(STRING)), Field("timeout_ms", INT32))),
    ApiKey.SASL_HANDSHAKE: Message((Field("mechanism", STRING),)),
    ApiKey.SASL_AUTHENTICATE: Message((Field("auth_bytes", BYTES),)),
    ApiKey.LIST_GROUPS: Message((
        Field("states_filter", Array.of_scalar(STRING), since=4, default=()),
        Field("types_filter", Array.of_scalar(STRING), since=5, default=())),
        flexible_from=3),
    ApiKey.DESCRIBE_GROUPS: Message((
        Field("groups", Array.of_scalar(STRING)),
        Field("include_authorized_operations", BOOL, since=3, default=False)),
        flexible_from=5),
    ApiKey.DELETE_GROUPS: Message((Field("groups_names", Array.of_scalar(STRING)),),
                                  flexible_from=2),
    ApiKey.OFFSET_DELETE: Message((
        Field("group_id", STRING),
        Field("topics", array(Field("name", STRING),
                              Field("partitions", array(Field("partition_index", INT32))))))),
    ApiKey.DESCRIBE_CLUSTER: Message((
        Field("include_cluster_authorized_operations", BOOL),
        Field("endpoint_type", INT8, since=1, default=1),
        Field("include_fenced_brokers", BOOL, since=2, default=False)), flexible_from=0),
    ApiKey.DESCRIBE_CONFIGS: Message((
        Field("resources", array(
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("configuration_keys", Array.of_scalar(STRING, nullable=True)))),
        Field("include_synonyms", BOOL, since=1, default=False),
        Field("include_documentation", BOOL, since=3, default=False)), flexible_from=4),
    ApiKey.ALTER_CONFIGS: Message((
        Field("resources", array(
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("configs", array(Field("name", STRING),
                                   Field("value", NULLABLE_STRING))))),
        Field("validate_only", BOOL)), flexible_from=2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: Message((
        Field("resources", array(
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("configs", array(Field("name", STRING), Field("config_operation", INT8),
                                   Field("value", NULLABLE_STRING))))),
        Field("validate_only", BOOL)), flexible_from=1),
    ApiKey.CREATE_PARTITIONS: Message((
        Field("topics", array(
            Field("name", STRING), Field("count", INT32),
            Field("assignments", array(Field("broker_ids", Array.of_scalar(INT32)),
                                       nullable=True)))),
        Field("timeout_ms", INT32), Field("validate_only", BOOL)), flexible_from=2),
    ApiKey.DELETE_RECORDS: Message((
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(Field("partition_index", INT32),
                                      Field("offset", INT64))))),
        Field("timeout_ms", INT32)), flexible_from=2),
    ApiKey.DESCRIBE_ACLS: Message(_ACL_FILTER, flexible_from=2),
    ApiKey.CREATE_ACLS: Message((
        Field("creations", array(
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("resource_pattern_type", INT8, since=1, default=3),
            Field("principal", STRING), Field("host", STRING),
            Field("operation", INT8), Field("permission_type", INT8))),), flexible_from=2),
    ApiKey.DELETE_ACLS: Message((Field("filters", array(*_ACL_FILTER)),), flexible_from=2),
    # users null (or empty): every user
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: Message((
        Field("users", array(Field("name", STRING), nullable=True)),), flexible_from=0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: Message((
        Field("deletions", array(Field("name", STRING), Field("mechanism", INT8))),
        Field("upsertions", array(
            Field("name", STRING), Field("mechanism", INT8), Field("iterations", INT32),
            Field("salt", BYTES), Field("salted_password", BYTES)))), flexible_from=0),
    ApiKey.DESCRIBE_PRODUCERS: Message((
        Field("topics", array(Field("name", STRING),
                              Field("partition_indexes", Array.of_scalar(INT32)))),),
        flexible_from=0),
    ApiKey.DESCRIBE_TRANSACTIONS: Message((
        Field("transactional_ids", Array.of_scalar(STRING)),), flexible_from=0),
    ApiKey.LIST_TRANSACTIONS: Message((
        Field("state_filters", Array.of_scalar(STRING)),
        Field("producer_id_filters", Array.of_scalar(INT64)),
        Field("duration_filter", INT64, since=1, default=-1),
        Field("transactional_id_pattern", NULLABLE_STRING, since=2)), flexible_from=0),
    # topics null: every topic
    ApiKey.DESCRIBE_LOG_DIRS: Message((
        Field("topics", array(Field("topic", STRING),
                              Field("partitions", Array.of_scalar(INT32)), nullable=True)),),
        flexible_from=2),
}

RESPONSES: dict[ApiKey, Message] = {
    ApiKey.API_VERSIONS: Message((
        ERROR,
        Field("api_keys", array(Field("api_key", INT16), Field("min_version", INT16),
                                Field("max_version", INT16))),
        Field("throttle_time_ms", INT32, since=1, default=0)), flexible_from=3),
    ApiKey.METADATA: Message((
        Field("throttle_time_ms", INT32, since=3, default=0),
        Field("brokers", array(Field("node_id", INT32), Field("host", STRING),
                               Field("port", INT32),
                               Field("rack", NULLABLE_STRING, since=1))),
        Field("cluster_id", NULLABLE_STRING, since=2),
        Field("controller_id", INT32, since=1, default=-1),
        Field("topics", array(
            ERROR, Field("name", NULLABLE_STRING),
            Field("topic_id", UUID, since=10, default=bytes(16)),
            Field("is_internal", BOOL, since=1, default=False),
            Field("partitions", array(
                ERROR, Field("partition_index", INT32), Field("leader_id", INT32),
                Field("leader_epoch", INT32, since=7, default=-1),
                Field("replica_nodes", Array.of_scalar(INT32)),
                Field("isr_nodes", Array.of_scalar(INT32)),
                Field("offline_replicas", Array.of_scalar(INT32), since=5, default=()))),
            # INT32_MIN: not requested (Kafka's default); ledgerd has no topic ACLs here
            Field("topic_authorized_operations", INT32, since=8, default=-2147483648))),
        Field("cluster_authorized_operations", INT32, since=8, until=10,
              default=-2147483648),
        Field("error_code", INT16, since=13, default=0)), flexible_from=9),
    ApiKey.PRODUCE: Message((
        Field("responses", array(
            Field("name", STRING),
            Field("partition_responses", array(
                Field("index", INT32), ERROR, Field("base_offset", INT64, default=-1),
                Field("log_append_time_ms", INT64, since=2, default=-1),
                Field("log_start_offset", INT64, since=5, default=-1),
                Field("record_errors", array(
                    Field("batch_index", INT32),
                    Field("batch_index_error_message", NULLABLE_STRING)),
                      since=8, default=()),
                Field("error_message", NULLABLE_STRING, since=8, default=None))))),
        Field("throttle_time_ms", INT32, since=1, default=0))),
    ApiKey.FETCH: Message((
        Field("throttle_time_ms", INT32, since=1, default=0),
        Field("error_code", INT16, since=7, default=0),
        Field("session_id", INT32, since=7, default=0),
        # v12+: the tagged diverging_epoch, current_leader, snapshot_id and (v16+)
        # node_endpoints are written absent
        Field("responses", array(
            Field("topic", STRING, until=12, default=""),
            Field("topic_id", UUID, since=13, default=bytes(16)),
            Field("partitions", array(
                Field("partition_index", INT32), ERROR, Field("high_watermark", INT64),
                Field("last_stable_offset", INT64, since=4, default=-1),
                Field("log_start_offset", INT64, since=5, default=-1),
                Field("aborted_transactions", array(Field("producer_id", INT64),
                                                    Field("first_offset", INT64),
                                                    nullable=True), since=4),
                Field("preferred_read_replica", INT32, since=11, default=-1),
                Field("records", NULLABLE_BYTES)))))), flexible_from=12),
    ApiKey.LIST_OFFSETS: Message((
        Field("throttle_time_ms", INT32, since=2, default=0),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32), ERROR,
                Field("old_style_offsets", Array.of_scalar(INT64), until=0, default=()),
                Field("timestamp", INT64, since=1, default=-1),
                Field("offset", INT64, since=1, default=-1),
                Field("leader_epoch", INT32, since=4, default=-1)))))), flexible_from=6),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: Message((
        Field("throttle_time_ms", INT32, since=2, default=0),
        Field("topics", array(
            Field("topic", STRING),
            Field("partitions", array(
                ERROR, Field("partition", INT32),
                Field("leader_epoch", INT32, since=1, default=-1),
                Field("end_offset", INT64, default=-1)))))), flexible_from=4),
    ApiKey.INIT_PRODUCER_ID: Message((
        THROTTLE, ERROR, Field("producer_id", INT64, default=-1),
        Field("producer_epoch", INT16, default=-1)), flexible_from=2),
    ApiKey.ADD_PARTITIONS_TO_TXN: Message((
        THROTTLE,
        Field("results", array(
            Field("name", STRING),
            Field("results", array(Field("partition_index", INT32), ERROR))))),
        flexible_from=3),
    ApiKey.ADD_OFFSETS_TO_TXN: Message((THROTTLE, ERROR), flexible_from=3),
    ApiKey.END_TXN: Message((THROTTLE, ERROR), flexible_from=3),
    ApiKey.WRITE_TXN_MARKERS: Message((
        Field("markers", array(
            Field("producer_id", INT64),
            Field("topics", array(
                Field("name", STRING),
                Field("partitions", array(Field("partition_index", INT32), ERROR)))))),),
        flexible_from=1),
    ApiKey.TXN_OFFSET_COMMIT: Message((
        THROTTLE,
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(Field("partition_index", INT32), ERROR))))),
        flexible_from=3),
    ApiKey.FIND_COORDINATOR: Message((
        Field("throttle_time_ms", INT32, since=1, default=0), ERROR,
        Field("error_message", NULLABLE_STRING, since=1),
        Field("node_id", INT32, default=-1), Field("host", STRING, default=""),
        Field("port", INT32, default=-1))),
    ApiKey.JOIN_GROUP: Message((
        Field("throttle_time_ms", INT32, since=2, default=0), ERROR,
        Field("generation_id", INT32, default=-1), Field("protocol_name", STRING, default=""),
        Field("leader", STRING, default=""), Field("member_id", STRING, default=""),
        Field("members", array(Field("member_id", STRING),
                               Field("group_instance_id", NULLABLE_STRING, since=5),
                               Field("metadata", BYTES)),
              default=()))),
    ApiKey.SYNC_GROUP: Message((
        Field("throttle_time_ms", INT32, since=1, default=0), ERROR,
        Field("assignment", BYTES, default=b""))),
    ApiKey.HEARTBEAT: Message((Field("throttle_time_ms", INT32, since=1, default=0), ERROR)),
    ApiKey.LEAVE_GROUP: Message((
        Field("throttle_time_ms", INT32, since=1, default=0), ERROR,
        Field("members", array(Field("member_id", STRING),
                               Field("group_instance_id", NULLABLE_STRING), ERROR),
              since=3, default=()))),
    ApiKey.OFFSET_COMMIT: Message((
        Field("throttle_time_ms", INT32, since=3, default=0),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(Field("partition_index", INT32), ERROR))))),
        flexible_from=8),
    ApiKey.OFFSET_FETCH: Message((
        Field("throttle_time_ms", INT32, since=3, default=0),
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32), Field("committed_offset", INT64),
                Field("committed_leader_epoch", INT32, since=5, default=-1),
                Field("metadata", NULLABLE_STRING), ERROR)))),
        Field("error_code", INT16, since=2, default=0)), flexible_from=6),
    ApiKey.CREATE_TOPICS: Message((
        Field("throttle_time_ms", INT32, since=2, default=0),
        Field("topics", array(Field("name", STRING), ERROR,
                              Field("error_message", NULLABLE_STRING, since=1))))),
    ApiKey.DELETE_TOPICS: Message((
        Field("throttle_time_ms", INT32, since=1, default=0),
        Field("responses", array(Field("name", STRING), ERROR)))),
    ApiKey.SASL_HANDSHAKE: Message((ERROR, Field("mechanisms", Array.of_scalar(STRING)))),
    ApiKey.SASL_AUTHENTICATE: Message((
        ERROR, Field("error_message", NULLABLE_STRING), Field("auth_bytes", BYTES, default=b""),
        Field("session_lifetime_ms", INT64, since=1, default=0))),
    ApiKey.LIST_GROUPS: Message((
        Field("throttle_time_ms", INT32, since=1, default=0), ERROR,
        Field("groups", array(
            Field("group_id", STRING), Field("protocol_type", STRING),
            Field("group_state", STRING, since=4, default=""),
            Field("group_type", STRING, since=5, default="classic")), default=())),
        flexible_from=3),
    ApiKey.DESCRIBE_GROUPS: Message((
        Field("throttle_time_ms", INT32, since=1, default=0),
        Field("groups", array(
            ERROR, Field("error_message", NULLABLE_STRING, since=6),
            Field("group_id", STRING),
            Field("group_state", STRING, default=""),
            Field("protocol_type", STRING, default=""),
            Field("protocol_data", STRING, default=""),
            Field("members", array(
                Field("member_id", STRING),
                Field("group_instance_id", NULLABLE_STRING, since=4),
                Field("client_id", STRING), Field("client_host", STRING),
                Field("member_metadata", BYTES), Field("member_assignment", BYTES)),
                default=()),
            # INT32_MIN: not requested (Kafka's default); else the ACLs' bitfield
            Field("authorized_operations", INT32, since=3, default=-2147483648)))),
        flexible_from=5),
    ApiKey.DELETE_GROUPS: Message((
        THROTTLE,
        Field("results", array(Field("group_id", STRING), ERROR))), flexible_from=2),
    ApiKey.OFFSET_DELETE: Message((
        ERROR, THROTTLE,
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(Field("partition_index", INT32), ERROR))),
            default=()))),
    ApiKey.DESCRIBE_CLUSTER: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("endpoint_type", INT8, since=1, default=1),
        Field("cluster_id", STRING, default=""), Field("controller_id", INT32, default=-1),
        Field("brokers", array(
            Field("broker_id", INT32), Field("host", STRING), Field("port", INT32),
            Field("rack", NULLABLE_STRING),
            Field("is_fenced", BOOL, since=2, default=False))),
        Field("cluster_authorized_operations", INT32, default=-2147483648)),
        flexible_from=0),
    ApiKey.DESCRIBE_CONFIGS: Message((
        THROTTLE,
        Field("results", array(
            ERROR, Field("error_message", NULLABLE_STRING),
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("configs", array(
                Field("name", STRING), Field("value", NULLABLE_STRING),
                Field("read_only", BOOL),
                Field("is_default", BOOL, until=0, default=False),
                Field("config_source", INT8, since=1, default=-1),
                Field("is_sensitive", BOOL),
                Field("synonyms", array(Field("name", STRING),
                                        Field("value", NULLABLE_STRING),
                                        Field("source", INT8)), since=1, default=()),
                Field("config_type", INT8, since=3, default=0),
                Field("documentation", NULLABLE_STRING, since=3)), default=())))),
        flexible_from=4),
    ApiKey.ALTER_CONFIGS: Message((
        THROTTLE,
        Field("responses", array(
            ERROR, Field("error_message", NULLABLE_STRING),
            Field("resource_type", INT8), Field("resource_name", STRING)))),
        flexible_from=2),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: Message((
        THROTTLE,
        Field("responses", array(
            ERROR, Field("error_message", NULLABLE_STRING),
            Field("resource_type", INT8), Field("resource_name", STRING)))),
        flexible_from=1),
    ApiKey.CREATE_PARTITIONS: Message((
        THROTTLE,
        Field("results", array(Field("name", STRING), ERROR,
                               Field("error_message", NULLABLE_STRING)))),
        flexible_from=2),
    ApiKey.DELETE_RECORDS: Message((
        THROTTLE,
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(Field("partition_index", INT32),
                                      Field("low_watermark", INT64, default=-1),
                                      ERROR))))),
        flexible_from=2),
    ApiKey.DESCRIBE_ACLS: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("resources", array(
            Field("resource_type", INT8), Field("resource_name", STRING),
            Field("pattern_type", INT8, since=1, default=3),
            Field("acls", array(Field("principal", STRING), Field("host", STRING),
                                Field("operation", INT8), Field("permission_type", INT8)))),
            default=())), flexible_from=2),
    ApiKey.CREATE_ACLS: Message((
        THROTTLE,
        Field("results", array(ERROR, Field("error_message", NULLABLE_STRING)))),
        flexible_from=2),
    ApiKey.DELETE_ACLS: Message((
        THROTTLE,
        Field("filter_results", array(
            ERROR, Field("error_message", NULLABLE_STRING),
            Field("matching_acls", array(
                ERROR, Field("error_message", NULLABLE_STRING),
                Field("resource_type", INT8), Field("resource_name", STRING),
                Field("pattern_type", INT8, since=1, default=3),
                Field("principal", STRING), Field("host", STRING),
                Field("operation", INT8), Field("permission_type", INT8)), default=())))),
        flexible_from=2),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("results", array(
            Field("user", STRING), ERROR, Field("error_message", NULLABLE_STRING),
            Field("credential_infos", array(Field("mechanism", INT8),
                                            Field("iterations", INT32)))), default=())),
        flexible_from=0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: Message((
        THROTTLE,
        Field("results", array(Field("user", STRING), ERROR,
                               Field("error_message", NULLABLE_STRING)))),
        flexible_from=0),
    ApiKey.DESCRIBE_PRODUCERS: Message((
        THROTTLE,
        Field("topics", array(
            Field("name", STRING),
            Field("partitions", array(
                Field("partition_index", INT32), ERROR,
                Field("error_message", NULLABLE_STRING),
                Field("active_producers", array(
                    Field("producer_id", INT64), Field("producer_epoch", INT32),
                    Field("last_sequence", INT32, default=-1),
                    Field("last_timestamp", INT64, default=-1),
                    Field("coordinator_epoch", INT32, default=-1),
                    Field("current_txn_start_offset", INT64, default=-1)), default=())))))),
        flexible_from=0),
    ApiKey.DESCRIBE_TRANSACTIONS: Message((
        THROTTLE,
        Field("transaction_states", array(
            ERROR, Field("transactional_id", STRING),
            Field("transaction_state", STRING, default=""),
            Field("transaction_timeout_ms", INT32, default=0),
            Field("transaction_start_time_ms", INT64, default=-1),
            Field("producer_id", INT64, default=-1),
            Field("producer_epoch", INT16, default=-1),
            Field("topics", array(Field("topic", STRING),
                                  Field("partitions", Array.of_scalar(INT32))),
                  default=())))), flexible_from=0),
    ApiKey.LIST_TRANSACTIONS: Message((
        THROTTLE, ERROR,
        Field("unknown_state_filters", Array.of_scalar(STRING), default=()),
        Field("transaction_states", array(
            Field("transactional_id", STRING), Field("producer_id", INT64),
            Field("transaction_state", STRING)), default=())), flexible_from=0),
    ApiKey.DESCRIBE_LOG_DIRS: Message((
        THROTTLE, Field("error_code", INT16, since=3, default=0),
        Field("results", array(
            ERROR, Field("log_dir", STRING),
            Field("topics", array(
                Field("name", STRING),
                Field("partitions", array(
                    Field("partition_index", INT32), Field("partition_size", INT64),
                    Field("offset_lag", INT64, default=0),
                    Field("is_future_key", BOOL, default=False))))),
            Field("total_bytes", INT64, since=4, default=-1),
            Field("usable_bytes", INT64, since=4, default=-1)))), flexible_from=2),
}
# -- share groups (KIP-932) ----------------------------------------------------------------
_ACK_BATCHES = Field("acknowledgement_batches", array(
    Field("first_offset", INT64), Field("last_offset", INT64),
    Field("acknowledge_types", Array.of_scalar(INT8))))
_LEADER = Field("current_leader", struct_of(Field("leader_id", INT32, default=-1),
                                            Field("leader_epoch", INT32, default=-1)),
                default={})
_NODE_ENDPOINTS = Field("node_endpoints", array(
    Field("node_id", INT32), Field("host", STRING), Field("port", INT32),
    Field("rack", NULLABLE_STRING)), default=())
REQUESTS.update({
    ApiKey.SHARE_GROUP_HEARTBEAT: Message((
        Field("group_id", STRING), Field("member_id", STRING), Field("member_epoch", INT32),
        Field("rack_id", NULLABLE_STRING),
        Field("subscribed_topic_names", Array.of_scalar(STRING, nullable=True))),
        flexible_from=0),
    ApiKey.SHARE_FETCH: Message((
        Field("group_id", NULLABLE_STRING), Field("member_id", NULLABLE_STRING),
        Field("share_session_epoch", INT32), Field("max_wait_ms", INT32),
        Field("min_bytes", INT32), Field("max_bytes", INT32),
        Field("max_records", INT32, since=1, default=500),
        Field("batch_size", INT32, since=1, default=500),
        Field("topics", array(
            Field("topic_id", UUID),
            Field("partitions", array(
                Field("partition_index", INT32),
                Field("partition_max_bytes", INT32, until=0, default=0),
                _ACK_BATCHES)))),
        Field("forgotten_topics_data", array(
            Field("topic_id", UUID), Field("partitions", Array.of_scalar(INT32))))),
        flexible_from=0),
    ApiKey.SHARE_ACKNOWLEDGE: Message((
        Field("group_id", NULLABLE_STRING), Field("member_id", NULLABLE_STRING),
        Field("share_session_epoch", INT32),
        Field("topics", array(
            Field("topic_id", UUID),
            Field("partitions", array(Field("partition_index", INT32), _ACK_BATCHES))))),
        flexible_from=0),
})
RESPONSES.update({
    ApiKey.SHARE_GROUP_HEARTBEAT: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("member_id", NULLABLE_STRING), Field("member_epoch", INT32, default=0),
        Field("heartbeat_interval_ms", INT32, default=0),
        Field("assignment", struct_of(
            Field("topic_partitions", array(Field("topic_id", UUID),
                                            Field("partitions", Array.of_scalar(INT32)))),
            nullable=True))), flexible_from=0),
    ApiKey.SHARE_FETCH: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("acquisition_lock_timeout_ms", INT32, since=1, default=0),
        Field("responses", array(
            Field("topic_id", UUID),
            Field("partitions", array(
                Field("partition_index", INT32), ERROR,
                Field("error_message", NULLABLE_STRING),
                Field("acknowledge_error_code", INT16, default=0),
                Field("acknowledge_error_message", NULLABLE_STRING),
                _LEADER,
                Field("records", NULLABLE_BYTES, default=b""),
                Field("acquired_records", array(
                    Field("first_offset", INT64), Field("last_offset", INT64),
                    Field("delivery_count", INT16)), default=())))), default=()),
        _NODE_ENDPOINTS), flexible_from=0),
    ApiKey.SHARE_ACKNOWLEDGE: Message((
        THROTTLE, ERROR, Field("error_message", NULLABLE_STRING),
        Field("responses", array(
            Field("topic_id", UUID),
            Field("partitions", array(
                Field("partition_index", INT32), ERROR,
                Field("error_message", NULLABLE_STRING), _LEADER))), default=()),
        _NODE_ENDPOINTS), flexible_from=0),
})
assert set(REQUESTS) == set(RESPONSES) == set(SUPPORTED) == set(DECLARED)
assert all(DECLARED[k][0] <= lo and hi <= DECLARED[k][1] for k, (lo, hi) in SUPPORTED.items())
