"""The Kafka gateway: stock Kafka clients produce to and consume from ledgerd logs.

A topic is a set of logs, one per partition (``partitions.py``); a Kafka offset counts
records across the log's batches. Several gateways may serve one cluster: each
registers ``<root>/kafka/gateways/<node id>`` (ephemeral) and the owner of a partition
(its only writer, its "leader" in Metadata) or of a consumer group (its coordinator) is
chosen by rendezvous hashing over the live gateways, so every gateway computes the same
answer and a dead gateway's share moves to the others. Any gateway serves reads.

Leadership rests on the gateway's ZooKeeper session, held as a lease (``lease.py``):
the membership refresh (every second) confirms it; a partition's writer and its
producers' sequences are used only while the lease holds, and a gateway that wakes
with it lapsed (stopped, paused) asks ZooKeeper first. A lost session (its expiry
seen as a LOST event, or a confirmation in another session) drops every partition's
writer and producer state before anything more is served; they are rebuilt from the
log when the gateway leads the partition again.

Per connection, requests are read in order; Fetch and Produce are handled in tasks of
their own (a parked Fetch or a Produce awaiting its quorum does not stop the next
request), every other request in turn, before the next is read (so a group's commit
lands before the leave that follows it); responses are written in request order, as
Kafka requires. At most ``max_inflight_requests``
are handled at once per connection; reading pauses beyond that, and while the
requests held over every connection would pass ``max_queued_request_bytes``
(``request_budget.py``). The rest of a request must arrive within
``request_read_timeout_ms`` of its size (plus a second a MiB), or the connection is
closed: the budget is
taken on the size, and peers announcing large requests they never send held it all.
Fetched records are held in a second budget, ``max_held_response_bytes``, from their
read until their response is written (``response_room``); a response not written
within ``response_write_timeout_ms`` (plus a second a MiB) closes the connection. Produce admission
(validation, queueing on the partition) happens in the reading task, so batches of
pipelined requests reach their partition in the order they were sent.

State in ZooKeeper under ``<root>/kafka``, each kind through its typed store in
``metadata/`` (versioned records, compare-and-set changes, paths from
``metadata.paths``); this module makes no store call of its own on these nodes and
writes no JSON:

- ``topics/<topic>``: partition count, configs, low watermarks
  (``metadata.kafka_topics``, read through the cache of ``topics.py``; the topic admin
  APIs are ``topic_admin.py``);
- ``gateways/<id>``: this gateway's registration, ephemeral in its session, and the
  live ones' (``metadata.kafka_gateways.GatewayStore``);
- ``groups/<group>``: generation and protocol type, made by a group's first completed
  join or first commit, deleted with the group (``metadata.kafka_groups``);
- ``producer_ids``: the idempotent producers' id counter
  (``metadata.kafka_gateways.ProducerIdStore``);
- ``transactions/<id>`` and ``txn_partitions/``: the transaction coordinator's
  (``metadata.kafka_txns``, ``transactions.py``);
- ``offset_index/<group>/<topic>``: the partitions each group has committed offsets
  for, so OffsetFetch of all topics and DeleteGroups read only the group's own
  (``metadata.kafka_offsets``, decisions in ``offset_index.py``);
  ``offset_index_complete`` once the offsets committed before the index existed are
  indexed (a one-time migration, run by any gateway that finds it absent).

Committed offsets are cursors of the partitions' logs (``kafka.<group>``,
``metadata.logs``), created only together with their index entry (one multi-op
transaction). A failed write of a partition's log answers the Kafka error its type
says (``storage_errors.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import hmac
import logging
import secrets
import ssl
import struct
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.fanout import each_at_most
from ledgerd.base.logs import fields
from ledgerd.base.principals import load_principals
from ledgerd.base.tls import ANONYMOUS, Principal, pending_alert, principal_of, take_refusal
from ledgerd.errors import LedgerdError
from ledgerd.kafka import (
    cleaner,
    decompressing,
    epochs,
    log_dirs,
    retention,
    scram_admin,
    share_server,
    topic_admin,
    transactions,
    txn_admin,
)
from ledgerd.kafka.acl_admin import GatewayAcls
from ledgerd.kafka.acls import AclSettings, Resource, cluster, parse_super_users
from ledgerd.kafka.api import (
    DECLARED,
    RECORD_BATCH_PRODUCE,
    REQUEST_HEADER,
    REQUESTS,
    RESPONSES,
    SUPPORTED,
    ApiKey,
    ErrorCode,
)
from ledgerd.kafka.authorization import verdict
from ledgerd.kafka.compaction import keyless_records
from ledgerd.kafka.compression import INLINE_CHECK_BYTES, check_batches, recompressed
from ledgerd.kafka.groups import DEAD_SUMMARY, Group, GroupSettings, GroupState, Reply, listed
from ledgerd.kafka.lease import LEASE_FRACTION, Lease
from ledgerd.kafka.legacy_records import legacy_batch
from ledgerd.kafka.metrics import GatewayMetrics
from ledgerd.kafka.offset_index import cursor_groups, indexed_reads
from ledgerd.kafka.partitions import (
    OffsetOutOfRangeError,
    PartitionLog,
    PartitionSettings,
    log_name,
)
from ledgerd.kafka.peer import peer_auth, send_marker
from ledgerd.kafka.records import BatchError, BatchHeader, split_batches, with_log_append_time
from ledgerd.kafka.refusals import refusal
from ledgerd.kafka.replica_selector import NO_PREFERENCE, preferred_read_replica
from ledgerd.kafka.request_budget import ByteBudget
from ledgerd.kafka.schema import ZERO_UUID, KafkaDecodeError, Reader, decode, encode
from ledgerd.kafka.scram import Mechanism, ScramError, ScramServer
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.kafka.topic_configs import TopicPolicy
from ledgerd.kafka.topics import INTERNAL_TOPICS, TopicCache, valid_topic_name
from ledgerd.kafka.txn_coordinator import Marker
from ledgerd.metadata.errors import (
    CorruptMetadataError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)
from ledgerd.metadata.kafka_acls import AclOperation, ResourceType
from ledgerd.metadata.kafka_gateways import GatewayRecord, GatewayStore, ProducerIdStore
from ledgerd.metadata.kafka_groups import GroupStore, group_znode
from ledgerd.metadata.kafka_offsets import OffsetIndex
from ledgerd.metadata.kafka_scram import Credentials, ScramStore
from ledgerd.metadata.kafka_topics import (
    TopicRecord,
    TopicStore,
    new_topic_id,
    origin_record,
    topic_origin,
)
from ledgerd.metadata.logs import CursorRecord
from ledgerd.metadata.paths import kafka_root
from ledgerd.metadata.store import SessionEvent
from ledgerd.wire.status import FencedError

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.kafka.config import GatewayConfig

__all__ = ["Gateway", "serve_gateway"]

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
# A handler's answer that closes the connection instead of replying (acks=0 errors).
_CLOSE: dict[str, Any] = {}
FETCH_MAX_BYTES = 50 << 20  # one fetch response at most (Kafka: fetch.max.bytes)
IDLE_S = 60.0  # a partition unused this long sheds its reader state
MAX_METADATA = 4096  # bytes of a commit's metadata string (Kafka: offset.metadata.max.bytes)
DELETE_FANOUT = 32  # cursor deletions of one DeleteGroups in flight at once
GROUP_DELETE_FANOUT = 8  # groups of one DeleteGroups deleted at once
CLUSTER_ID = "ledgerd"  # Metadata's and DescribeCluster's cluster id
# A topic this gateway deleted is not auto-created again for this long: the deleting
# client's own metadata refresh right after DeleteTopics (librdkafka refreshes the
# topics it knows, and a client allowed to auto-create would bring it straight back)
# finds it gone, as it would while a Kafka broker still processes the deletion.
DELETED_GRACE_S = 10.0
MAX_DELETED_REMEMBERED = 10_000


OFFSET_FETCH_READS = 32  # cursor reads one OffsetFetch has in flight at once

# what this version does that the other gateways must know of before relying on it,
# told in its registration (``metadata.kafka_gateways``): ``offset_index``, it writes
# each group's offset index with the group's offsets
# what this version does that every gateway must before it is used: "offset_index" (the
# groups' offset index), "deferred_deletes" (keeping a log record's deferred deletions
# when rewriting it: file.delete.delay.ms applies only once every live gateway does)
FEATURES = ("offset_index", "deferred_deletes")


def rank(node: int, key: str) -> int:
    """A gateway's rendezvous score for ``key``: the highest-scoring live gateway owns it."""
    return zlib.crc32(f"{node}/{key}".encode())


class ClusterMetadataMissingError(LedgerdError):
    """The cluster's root holds no INSTANCEID: its metadata was lost (and is not yet
    restored or rebuilt)."""

    def __init__(self, root: str) -> None:
        super().__init__(f"the cluster's metadata is missing: no {root}/INSTANCEID in "
                         "ZooKeeper")


def _plain_check(tokens: dict[str, Principal], auth: bytes) -> Principal | None:
    """The principal a SASL PLAIN message (authzid NUL user NUL password) proves: the
    password is a token of the principals file and the user its principal's name."""
    parts = auth.split(b"\x00")
    if len(parts) != 3:
        return None
    principal = tokens.get(hashlib.sha256(parts[2]).hexdigest())
    if principal is None or not hmac.compare_digest(principal.name.encode(), parts[1]):
        return None
    return principal


SCRAM_TTL_S = 1.0  # how stale the credentials a SCRAM login checks may be

# Roles any one of which a request needs when the gateway authenticates (empty: anyone)
_CLIENT = frozenset({"client", "admin"})
_NEEDS: dict[ApiKey, frozenset[str]] = {
    ApiKey.API_VERSIONS: frozenset(), ApiKey.SASL_HANDSHAKE: frozenset(),
    ApiKey.SASL_AUTHENTICATE: frozenset(),
    ApiKey.CREATE_TOPICS: frozenset({"admin"}), ApiKey.DELETE_TOPICS: frozenset({"admin"}),
    # deleting a group or its offsets (Kafka: DELETE on the group) is an admin's act
    ApiKey.DELETE_GROUPS: frozenset({"admin"}), ApiKey.OFFSET_DELETE: frozenset({"admin"}),
    # writing another producer's transaction markers (Kafka: CLUSTER_ACTION)
    ApiKey.WRITE_TXN_MARKERS: frozenset({"admin"}),
    # changing a topic (its configs, partitions, records) is an admin's act too
    ApiKey.ALTER_CONFIGS: frozenset({"admin"}),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: frozenset({"admin"}),
    ApiKey.CREATE_PARTITIONS: frozenset({"admin"}), ApiKey.DELETE_RECORDS: frozenset({"admin"}),
    # the ACLs themselves (Kafka: ALTER / DESCRIBE on the cluster, checked after)
    ApiKey.CREATE_ACLS: frozenset({"admin"}), ApiKey.DELETE_ACLS: frozenset({"admin"}),
    ApiKey.DESCRIBE_ACLS: frozenset({"admin"}),
    # SCRAM credentials (Kafka: DESCRIBE / ALTER on the cluster, checked after)
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: frozenset({"admin"}),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: frozenset({"admin"}),
}


# the largest request a connection may send before it has authenticated, on a gateway
# that requires authentication (Kafka's sasl.server.max.receive.size)
PRE_AUTH_MAX_REQUEST_BYTES = 512 << 10


@dataclass(slots=True)
class _Conn:
    peer: str
    client_id: str = ""
    principal: Principal = ANONYMOUS
    sasl_mechanism: str = ""
    scram: ScramServer | None = None  # a SCRAM exchange under way
    held: int = 0  # bytes of the gateway's request budget its requests hold
    reply_held: int = 0  # bytes of the response budget its fetches' responses hold
    last_written: trio.Event | None = None  # set once its last request's reply is out
    auth_until: float | None = None  # when its SASL authentication runs out (KIP-368)

    @property
    def authenticated(self) -> bool:
        return self.principal.authenticated


@dataclass(slots=True)
class _Slot:
    """One request's place in its connection's response order."""

    done: trio.Event = field(default_factory=trio.Event)
    frame: bytes | None = None  # None: no response (acks=0)
    close: bool = False
    conn: _Conn | None = None  # whose request budget bytes it holds
    held: int = 0  # those bytes (given back once the request is handled)
    reply_held: int = 0  # response budget bytes (given back once the frame is written)
    written: trio.Event = field(default_factory=trio.Event)  # its reply is out (or none)
    ahead: trio.Event | None = None  # the previous request's ``written``


@dataclass(slots=True)
class _Current:
    """The request a handler runs for, while it runs (``slot`` None after): tasks a
    handler starts inherit the context variable, and must not keep the slot (and its
    reply) alive with it."""

    slot: _Slot | None


# set by ``_finish``: what a fetch reads is held in the response budget on that
# request's slot (``Gateway.response_room``)
_CURRENT: contextvars.ContextVar[_Current | None] = contextvars.ContextVar(
    "kafka_request", default=None)
RESPONSE_FLOOR = 1 << 20  # a fetch waits for this much room, or max_batch_bytes if more


class Gateway:
    def __init__(self, client: Client, config: GatewayConfig) -> None:
        self.client = client
        self.config = config
        self.store = client.store
        self.root = kafka_root(config.zk_ledgers_root_path)
        self.port = 0
        self.node_id = -1
        self.nodes: dict[int, tuple[str, int]] = {}
        self.racks: dict[int, str] = {}  # the live gateways' racks (those that have one)
        self.lease = Lease(config.zk_timeout_ms / 1000 * LEASE_FRACTION)
        self._confirming = trio.Lock()  # one membership refresh at a time
        self._members_changed = trio.Event()  # set by the registrations' watch
        self.topics: dict[str, int] = {}  # partition counts as last read
        self.topic_store = TopicCache(TopicStore(self.store, self.root))
        self.topic_names: dict[bytes, str] = {}  # topic id -> name, as last seen
        self._ids_scanned = -1.0  # when every topic's id was last read (an unknown id)
        self.gateway_store = GatewayStore(self.store, self.root)
        self.group_store = GroupStore(self.store, self.root)
        self.producer_ids = ProducerIdStore(self.store, self.root)
        self.partitions: dict[tuple[str, int], PartitionLog] = {}
        self.deleted: dict[str, float] = {}  # topics deleted lately, when (DELETED_GRACE_S)
        self.groups: dict[str, Group] = {}
        self.group_records: set[str] = set()  # groups whose ZooKeeper record exists
        self._index_complete = False  # offset_index_complete seen (it is never removed)
        self.features: dict[int, frozenset[str]] = {}  # live gateway -> its FEATURES
        self._index_migrating = False
        # a group record's save and its deletion never interleave: a save begun before
        # DeleteGroups (its read, then its write) would make the record again after
        self._group_record_lock = trio.Lock()
        self.group_settings = GroupSettings(config.group_initial_rebalance_delay_ms / 1000,
                                            config.group_min_session_timeout_ms,
                                            config.group_max_session_timeout_ms)
        self.part_settings = PartitionSettings(
            config.ensemble_size, config.write_quorum_size, config.ack_quorum_size,
            config.log_roll_bytes, config.tail_cache_bytes, config.max_append_bytes,
            config.read_ahead_bytes, config.gateway_log_headers)
        self.tokens = load_principals(config.gateway_principals_file,
                                      "gateway_principals_file") \
            if config.gateway_principals_file else None
        self.peer_auth = peer_auth(config, self.tokens)  # reaching the other gateways
        # who must prove themselves: everyone, with a principals file or client certificates
        # SCRAM (scram.py): credentials in ZooKeeper (scram_admin.py serves their APIs)
        self.scram_mechanisms = config.scram_mechanisms()
        self.scram_store = ScramStore(self.store, self.root)
        # the credentials logins check, read at most once a second (SCRAM_TTL_S)
        self._scram_cache: tuple[float, Credentials] | None = None
        # an unknown user's fake salt: stable for this gateway's life
        self._scram_fake_secret = secrets.token_bytes(32)
        self._super_users = parse_super_users(config.gateway_super_users)
        self.authorizing = self.tokens is not None or bool(self.scram_mechanisms) or \
            config.gateway_tls_client_auth == "required"
        self.connections = 0
        self.metrics = GatewayMetrics()
        self.metrics.gauge("ledgerd_kafka_open_connections", "Client connections open.",
                           lambda: self.connections)
        self.metrics.gauge("ledgerd_kafka_partitions_written",
                           "Partitions this gateway writes (leads).",
                           lambda: sum(p.writer is not None for p in self.partitions.values()))
        self.metrics.gauge("ledgerd_kafka_groups", "Consumer groups this gateway coordinates "
                           "that have members.",
                           lambda: sum(not g.is_idle for g in self.groups.values()))
        self.metrics.gauge("ledgerd_kafka_group_members", "Members of those groups.",
                           lambda: sum(len(g.members) for g in self.groups.values()))
        self.metrics.gauge("ledgerd_kafka_live_gateways", "Gateways registered in ZooKeeper.",
                           lambda: len(self.nodes))
        self.requests_held = ByteBudget(config.max_queued_request_bytes)
        self.metrics.gauge("ledgerd_kafka_request_bytes_held",
                           "Bytes of requests being handled, over every connection (at "
                           "most max_queued_request_bytes).", lambda: self.requests_held.used)
        self.metrics.counter("ledgerd_kafka_request_budget_waits",
                             "Requests whose connection waited for room in "
                             "max_queued_request_bytes before reading them.",
                             lambda: self.requests_held.waits)
        self.responses_held = ByteBudget(config.max_held_response_bytes)
        self.metrics.gauge("ledgerd_kafka_response_bytes_held",
                           "Bytes of Fetch and ShareFetch responses read or not yet written, "
                           "over every connection (at most max_held_response_bytes, and "
                           "the replies' headers).", lambda: self.responses_held.used)
        self.metrics.counter("ledgerd_kafka_response_budget_waits",
                             "Fetches that waited for room in max_held_response_bytes "
                             "before reading.", lambda: self.responses_held.waits)
        self.nursery: trio.Nursery | None = None
        self.txn = transactions.TxnCoordinator(self)
        self.share = share_server.ShareServer(self)  # share groups (KIP-932)
        # dynamic broker configs (topic_admin.py, broker_configs.py)
        self.broker_configs = topic_admin.BrokerConfigCache(self.store, self.root)
        # ACLs (acl_admin.py): every request is judged after the roles' check
        self.acls = GatewayAcls(self.store, self.root, AclSettings(
            allow_if_no_acl=config.gateway_allow_everyone_if_no_acl_found,
            super_users=parse_super_users(config.gateway_super_users)))
        self.handlers: dict[ApiKey, Callable[[_Conn, int, dict[str, Any]],
                                             Awaitable[dict[str, Any] | None]]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: functools.partial(self.acls.authorized_metadata, self.metadata),
            ApiKey.FETCH: self.fetch, ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.JOIN_GROUP: self.join_group, ApiKey.SYNC_GROUP: self.sync_group,
            ApiKey.HEARTBEAT: self.heartbeat, ApiKey.LEAVE_GROUP: self.leave_group,
            ApiKey.OFFSET_COMMIT: self.offset_commit, ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.SASL_HANDSHAKE: self.sasl_handshake,
            ApiKey.SASL_AUTHENTICATE: self.sasl_authenticate,
            ApiKey.LIST_GROUPS: functools.partial(self.acls.authorized_list_groups,
                                                  self.list_groups),
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups, ApiKey.OFFSET_DELETE: self.offset_delete,
            ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            # transactions: the coordinator's (``transactions.py``)
            ApiKey.ADD_PARTITIONS_TO_TXN: lambda _c, v, b: self.txn.add_partitions(v, b),
            ApiKey.ADD_OFFSETS_TO_TXN: lambda _c, v, b: self.txn.add_offsets(v, b),
            ApiKey.END_TXN: lambda _c, v, b: self.txn.end_txn(v, b),
            ApiKey.TXN_OFFSET_COMMIT: lambda _c, v, b: self.txn.txn_offset_commit(v, b),
            ApiKey.WRITE_TXN_MARKERS: lambda _c, v, b: self.txn.write_txn_markers(v, b),
            # hanging-transaction tooling (KIP-664) and log dirs: ``txn_admin.py``,
            # ``log_dirs.py``
            ApiKey.LIST_TRANSACTIONS: functools.partial(txn_admin.list_transactions, self),
            ApiKey.DESCRIBE_TRANSACTIONS: functools.partial(
                txn_admin.describe_transactions, self),
            ApiKey.DESCRIBE_PRODUCERS: functools.partial(txn_admin.describe_producers, self),
            ApiKey.DESCRIBE_LOG_DIRS: functools.partial(log_dirs.describe_log_dirs, self),
            ApiKey.CREATE_TOPICS: functools.partial(topic_admin.create_topics, self),
            ApiKey.CREATE_PARTITIONS: functools.partial(topic_admin.create_partitions, self),
            ApiKey.DELETE_RECORDS: functools.partial(topic_admin.delete_records, self),
            ApiKey.DESCRIBE_CONFIGS: functools.partial(topic_admin.describe_configs, self),
            ApiKey.ALTER_CONFIGS: functools.partial(topic_admin.alter_configs, self),
            ApiKey.INCREMENTAL_ALTER_CONFIGS: functools.partial(
                topic_admin.incremental_alter_configs, self),
            ApiKey.CREATE_ACLS: self.acls.create_acls,
            ApiKey.DESCRIBE_ACLS: self.acls.describe_acls,
            ApiKey.DELETE_ACLS: self.acls.delete_acls,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_scram,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_scram,
            ApiKey.SHARE_GROUP_HEARTBEAT: self.share.heartbeat,
            ApiKey.SHARE_FETCH: self.share.share_fetch,
            ApiKey.SHARE_ACKNOWLEDGE: self._share_acknowledge,
        }

    # -- membership and ownership -------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``/status``: this gateway, the live ones, what it writes and coordinates."""
        return {"gateway": self.node_id, "port": self.port,
                "gateways": {str(n): f"{h}:{p}" for n, (h, p) in sorted(self.nodes.items())},
                "connections": self.connections,
                "partitions_written": sorted(f"{t}/{p}" for (t, p), part
                                             in self.partitions.items() if part.writer),
                "groups": {g.group_id: {"state": g.state.value, "generation": g.generation,
                                        "members": len(g.members)}
                           for g in self.groups.values() if not g.is_idle}}

    def owner(self, key: str) -> int:
        if not self.nodes:
            return self.node_id
        return max(self.nodes, key=lambda n: rank(n, key))

    def owns(self, key: str) -> bool:
        return self.owner(key) == self.node_id

    async def _register(self) -> None:
        """Register this gateway (ephemeral) — only under a cluster root that exists: a
        gateway never recreates a root that was lost (a wiped ZooKeeper, a deleted root)
        before the operator restores or rebuilds it; it stops serving meanwhile."""
        root = self.config.zk_ledgers_root_path.rstrip("/")
        if await self.store.exists(f"{root}/INSTANCEID") is None:
            raise ClusterMetadataMissingError(root)
        host, port = self.config.advertised(self.port)
        await self.gateway_store.register(self.node_id, GatewayRecord(
            host=host, port=port, rack=self.config.gateway_rack, features=FEATURES))

    async def _refresh(self) -> None:
        """Re-read the live gateways, confirming the lease on leadership (the sending
        time of these reads, in this session); a confirmation in another session than
        the one the partitions' state was built under drops that state first. Then
        release the partitions that moved to another gateway. If cancelled, the view
        and the lease stay as they were."""
        async with self._confirming:
            asked_at = trio.current_time()
            live = await self.gateway_store.live()
            nodes = {node: (record.host, record.port) for node, record in live.items()}
            racks = {node: record.rack for node, record in live.items() if record.rack}
            self.features = {node: frozenset(record.features)
                             for node, record in live.items()}
            self.features[self.node_id] = frozenset(FEATURES)
            session = self.store.session_id
            if self.lease.on_confirmed(session_id=session, asked_at=asked_at):
                await self._session_lost("confirmed in a new ZooKeeper session")
                await self._register()
                nodes[self.node_id] = self.config.advertised(self.port)
                self.lease.on_rebuilt(session_id=session, asked_at=asked_at)
            elif self.node_id not in nodes:
                await self._register()
                nodes[self.node_id] = self.config.advertised(self.port)
            if self.config.gateway_rack:
                racks[self.node_id] = self.config.gateway_rack
            if set(nodes) != set(self.nodes):
                # what this gateway leads or coordinates may have moved (and may come
                # back after another gateway changed it): its share state is read again
                self.share.forget()
            self.nodes, self.racks = nodes, racks
            for (topic, p), part in list(self.partitions.items()):
                if part.writer is not None and not self.owns(f"{topic}/{p}"):
                    log.info("kafka_partition_moved", extra=fields(
                        topic=topic, partition=p, owner=self.owner(f"{topic}/{p}")))
                    await part.release()

    async def _session_lost(self, reason: str) -> None:
        """Drop every partition's writer and producer state (synchronously, before any
        await, so no request is answered from them after this starts), and the share
        groups' members and share partitions, read again when next led."""
        self.share.forget()
        dropped = [(part, part.drop_leadership()) for part in self.partitions.values()]
        if dropped:
            log.warning("kafka_leadership_dropped", extra=fields(
                reason=reason, partitions=len(dropped)))
        async with trio.open_nursery() as nursery:  # each bounded and shielded
            for part, writer in dropped:
                nursery.start_soon(part.let_go, writer, reason)

    async def may_lead(self, key: str) -> bool:
        """True if this gateway may act as ``key``'s leader now: its lease holds (or a
        membership refresh confirms it again, after any state of a lost session was
        dropped) and rendezvous hashing gives it ``key``. False if ZooKeeper cannot
        confirm the session."""
        if not self.lease.is_valid(trio.current_time()):
            try:
                await self._refresh()
            except Exception as exc:
                log.warning("kafka_lease_unconfirmed", extra=fields(key=key,
                                                                    error=repr(exc)))
                return False
            if not self.lease.is_valid(trio.current_time()):
                return False
        return self.owns(key)

    async def _watch_session(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the ZooKeeper session: a lost connection suspends the lease; an
        expired session drops the partitions' state at once (the next refresh
        registers again and confirms the new session)."""
        async with self.store.session_events() as events:
            task_status.started()
            async for event in events:
                if event is SessionEvent.SUSPENDED:
                    self.lease.on_suspended()
                elif event is SessionEvent.LOST:
                    self.lease.on_lost()
                    await self._session_lost("ZooKeeper session expired")

    async def _watch_members(self) -> None:
        """Wake the membership loop when ZooKeeper says a gateway registered or went, so
        that a gateway joining or leaving moves partitions within a round trip, not a
        refresh interval later: until every gateway has seen a new one, two of them
        may each answer Metadata as a partition's leader (safe, as the ledger fencing
        of a takeover stops the old writer, but clients are sent back and forth). If
        the watch cannot be set (ZooKeeper away, metadata wiped), the periodic refresh
        still runs, and the watch is tried again a second later."""
        while True:
            try:
                async with self.gateway_store.changes() as events:
                    async for _ in events:
                        self._members_changed.set()
            except Exception as exc:
                log.debug("kafka_membership_watch_failed", extra=fields(error=repr(exc)))
            await trio.sleep(1.0)

    async def _membership(self) -> None:
        """Refresh the view of the live gateways when the registrations change (the
        watch), and at least every second, or more often if the lease is shorter, so
        that a running gateway's lease never lapses."""
        missing = False
        while True:
            with trio.move_on_after(min(1.0, self.lease.duration / 3)):
                await self._members_changed.wait()
            self._members_changed = trio.Event()
            try:
                await self._refresh()
            except ClusterMetadataMissingError as exc:  # said once, not every second
                if not missing:
                    log.error("cluster_metadata_missing", extra=fields(
                        problem=str(exc), action=(
                            "this gateway does not register or serve partitions until the "
                            "metadata is back: `ledgerd shell metadata restore FILE` (a "
                            "snapshot) or `ledgerd shell metadata rebuild --apply`")))
                    missing = True
            except Exception as exc:  # ZooKeeper away: keep the last view
                log.warning("kafka_membership_refresh_failed", extra=fields(error=repr(exc)))
            else:
                if missing:
                    log.info("cluster_metadata_back", extra=fields(node_id=self.node_id))
                    missing = False
            await self._sweep_idle()

    async def _sweep_idle(self) -> None:
        """Partitions nobody produced to or fetched from for IDLE_S: their reader state
        goes (and the partition itself unless this gateway writes it), so memory follows
        the partitions in use, not every partition ever touched."""
        now = trio.current_time()
        for key, part in list(self.partitions.items()):
            if now - part.last_used < IDLE_S or part.appending:
                continue
            await part.shed()
            if part.writer is None:
                del self.partitions[key]

    async def _tick_groups(self) -> None:
        while True:
            await trio.sleep(0.1)
            now = trio.current_time()
            for group in list(self.groups.values()):
                if self.groups.get(group.group_id) is not group:
                    continue  # deleted (or reloaded) while an earlier group was stored
                group.tick(now)
                if group.generation > group.persisted:
                    try:
                        await self._store_group(group)
                    except Exception as exc:
                        log.warning("kafka_group_store_failed", extra=fields(
                            group=group.group_id, error=repr(exc)))
                elif group.is_idle:  # stored, no members: reloaded from ZooKeeper if used
                    del self.groups[group.group_id]  # (any group id a client names)

    # -- serving ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Listen, register, serve until cancelled; ``task_status.started(port)``."""
        cfg = self.config
        try:
            listeners = await trio.open_tcp_listeners(cfg.gateway_port, host=cfg.gateway_host)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {cfg.gateway_host}:{cfg.gateway_port} "
                                     f"(gateway_port): {exc.strerror}") from exc
        self.port = listeners[0].socket.getsockname()[1]
        self.node_id = cfg.effective_node_id(self.port)
        tls = cfg.tls_server_context()
        self.lease.session_id = self.store.session_id
        await self._register()
        await self._refresh()
        log.info("kafka_gateway_listening", extra=fields(
            host=cfg.gateway_host, port=self.port, node_id=self.node_id,
            tls=tls is not None, sasl=self.tokens is not None))
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                await nursery.start(self._watch_session)
                nursery.start_soon(self._membership)
                nursery.start_soon(self._watch_members)
                nursery.start_soon(self._tick_groups)
                nursery.start_soon(self.txn.run)
                nursery.start_soon(self.share.tick)
                nursery.start_soon(retention.run, self)
                nursery.start_soon(self.broker_configs.run)
                nursery.start_soon(cleaner.run, self)
                nursery.start_soon(self._check_offset_index)
                served: list[Any] = listeners
                if tls is not None:
                    served = [trio.SSLListener(lst, tls, https_compatible=False)
                              for lst in listeners]
                await nursery.start(trio.serve_listeners, self._serve, served)
                task_status.started(self.port)
        finally:
            with trio.move_on_after(10, shield=True):
                for part in self.partitions.values():
                    await part.release()

    async def _serve(self, stream: trio.abc.Stream) -> None:
        peer = _peer(stream)
        if self.connections >= self.config.max_connections:
            self.metrics.connections_refused += 1
            log.warning("kafka_connection_refused", extra=fields(
                peer=peer, reason="max_connections"))
            await trio.aclose_forcefully(stream)
            return
        self.connections += 1
        self.metrics.connections_opened += 1
        conn = _Conn(peer)
        try:
            if isinstance(stream, trio.SSLStream):
                with trio.fail_after(10):
                    await self._handshake(stream, peer)
                cert = stream.getpeercert()
                if cert:
                    conn.principal = principal_of(cert)
            await self._connection(stream, conn)
        except Exception as exc:  # one connection closes; the gateway goes on
            leaves = _leaves(exc)
            if all(isinstance(e, trio.BrokenResourceError | trio.ClosedResourceError | OSError)
                   for e in leaves):
                pass  # the peer went away
            elif all(isinstance(e, KafkaDecodeError) for e in leaves):
                self.metrics.connections_closed_bad += 1
                log.warning("kafka_bad_request", extra=fields(peer=peer, error=str(leaves[0])))
            else:
                log.exception("kafka_connection_failed", extra=fields(peer=peer))
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    async def _handshake(self, stream: trio.SSLStream[Any], peer: str) -> None:
        """The TLS handshake; when it fails (an untrusted or missing client certificate),
        the alert saying why reaches the client, as a Kafka broker's does, and the
        gateway logs it."""
        try:
            await stream.do_handshake()
        except trio.BrokenResourceError as exc:
            cause = exc.__cause__
            if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError):
                # a refused client certificate: the verification error behind the
                # bad_certificate alert (ledgerd.base.tls.refuse_as_bad_certificate)
                refusal = take_refusal()
                log.info("kafka_tls_handshake_failed", extra=fields(
                    peer=peer, reason=cause.reason or str(cause),
                    **({"certificate": refusal} if refusal else {})))
                alert = pending_alert(stream)
                await self._failed_authentication()
                if alert:
                    with trio.move_on_after(1), contextlib.suppress(
                            trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await stream.transport_stream.send_all(alert)
            raise

    async def _connection(self, stream: trio.abc.Stream, conn: _Conn) -> None:
        send, receive = trio.open_memory_channel[_Slot](self.config.max_inflight_requests)
        read_timeout = self.config.request_read_timeout_ms / 1000
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._responder, stream, receive, nursery.cancel_scope)
                buf = bytearray()
                async with send:
                    while True:
                        while len(buf) < 4:
                            data = await stream.receive_some(65536)
                            if not data:
                                return
                            buf += data
                        size = _SIZE.unpack_from(buf)[0]
                        limit = self.config.max_request_bytes
                        if self.authorizing and not conn.authenticated:
                            # before authentication only the small SASL requests come
                            # (Kafka: sasl.server.max.receive.size)
                            limit = min(limit, PRE_AUTH_MAX_REQUEST_BYTES)
                        if not 8 <= size <= limit:
                            self.metrics.connections_closed_bad += 1
                            log.warning("kafka_bad_frame", extra=fields(
                                peer=conn.peer, size=size, limit=limit,
                                authenticated=conn.authenticated))
                            return
                        # room for the whole request before its body is read (or
                        # nothing more is read from this peer until there is)
                        await self.requests_held.take(4 + size)
                        conn.held += 4 + size
                        slot = _Slot(conn=conn, held=4 + size, ahead=conn.last_written)
                        conn.last_written = slot.written
                        # a second a MiB beside it: a large request on a slow link
                        with trio.move_on_after(read_timeout + size / (1 << 20)) as reading:
                            while len(buf) < 4 + size:
                                data = await stream.receive_some(65536)
                                if not data:
                                    return
                                buf += data
                        if reading.cancelled_caught:
                            self.metrics.connections_closed_bad += 1
                            log.warning("kafka_request_read_timeout", extra=fields(
                                peer=conn.peer, size=size, received=len(buf) - 4,
                                timeout_ms=self.config.request_read_timeout_ms))
                            return
                        frame = bytes(buf[4:4 + size])
                        del buf[:4 + size]
                        await send.send(slot)  # waits while max_inflight_requests are open
                        admitted = await self._admit(conn, frame, slot, nursery)
                        if slot.done.is_set():
                            self._handled(slot)
                        if not admitted:
                            return
        finally:
            # what the requests not handled (the connection ended first) still hold,
            # and the responses not written
            self.requests_held.give(conn.held)
            conn.held = 0
            self.responses_held.release(conn.reply_held)
            conn.reply_held = 0

    def _handled(self, slot: _Slot) -> None:
        """Give back the request budget ``slot``'s request held (once handled)."""
        if slot.held and slot.conn is not None:
            self.requests_held.give(slot.held)
            slot.conn.held -= slot.held
            slot.held = 0

    async def _responder(self, stream: trio.abc.Stream,
                         slots: trio.MemoryReceiveChannel[_Slot],
                         scope: trio.CancelScope) -> None:
        write_timeout = self.config.response_write_timeout_ms / 1000
        async with slots:
            async for slot in slots:
                await slot.done.wait()
                self._handled(slot)
                if slot.frame is not None:
                    # a second a MiB beside it: a large response on a slow link
                    with trio.move_on_after(
                            write_timeout + len(slot.frame) / (1 << 20)) as writing:
                        await stream.send_all(slot.frame)
                    if writing.cancelled_caught:
                        self.metrics.connections_closed_bad += 1
                        log.warning("kafka_response_write_timeout", extra=fields(
                            peer=slot.conn.peer if slot.conn else "-",
                            size=len(slot.frame),
                            timeout_ms=self.config.response_write_timeout_ms))
                        break
                    slot.frame = None
                    self._settle_reply(slot, 0)  # written: its bytes go back
                slot.written.set()
                if slot.close:
                    break
        scope.cancel()

    async def response_room(self, want: int, until: float) -> int:
        """Bytes (at most ``want``) a fetch may read now for its response: taken from
        ``max_held_response_bytes`` and held, on the request's slot, until the response
        is written (what an earlier call of the same request held is given back
        first). Waits while not even 1 MiB is free, until ``until`` (the fetch's
        max_wait) at most: then 0, and the fetch answers without records. It must not
        wait longer: the room may be held by its own connection's later responses,
        which are written only after this one (in request order). Outside a request
        (a test), ``want``."""
        current = _CURRENT.get()
        slot = current.slot if current is not None else None
        if slot is None or slot.conn is None:
            return want
        self._settle_reply(slot, 0)
        if slot.ahead is not None:
            # room only once the replies before this one are out: room held by a
            # later reply of its own connection, which waits for this one to be
            # written first, would never come back
            await slot.ahead.wait()
        # room for a whole first batch, which a reply may carry past what it asked
        floor = max(RESPONSE_FLOOR, self.config.max_batch_bytes)
        got = await self.responses_held.take_up_to(max(want, floor), floor, until)
        slot.reply_held += got  # no checkpoint between: a cancel cannot lose it
        slot.conn.reply_held += got
        return min(got, want)

    def response_room_back(self) -> None:
        """A fetch that read nothing gives its room back before it waits for records."""
        current = _CURRENT.get()
        if current is not None and current.slot is not None:
            self._settle_reply(current.slot, 0)

    def _settle_reply(self, slot: _Slot, size: int) -> None:
        """Hold ``size`` bytes for ``slot``'s response (0: give them all back); only
        for a request that took room with ``response_room``."""
        if not slot.reply_held or slot.conn is None:
            return
        change = size - slot.reply_held
        if change > 0:
            self.responses_held.hold(change)
        elif change < 0:
            self.responses_held.release(-change)
        slot.reply_held = size
        slot.conn.reply_held += change

    async def _admit(self, conn: _Conn, frame: bytes, slot: _Slot,
                     nursery: trio.Nursery) -> bool:
        """Parse one request and start handling it; False closes the connection."""
        r = Reader(frame)
        header = decode(REQUEST_HEADER, 1, r, "request header")
        key, version, cid = header["api_key"], header["api_version"], header["correlation_id"]
        conn.client_id = header["client_id"] or ""
        try:
            api = ApiKey(key)
        except ValueError:
            self.metrics.connections_closed_bad += 1
            log.warning("kafka_unknown_api", extra=fields(peer=conn.peer, api_key=key))
            slot.close = True
            slot.done.set()
            return False
        low, high = SUPPORTED[api]
        self.metrics.requests[api] = self.metrics.requests.get(api, 0) + 1
        if api is ApiKey.API_VERSIONS and version > high:
            slot.frame = self._frame(api, 0, cid, {"error_code": ErrorCode.UNSUPPORTED_VERSION,
                                                   "api_keys": _advertised()})
            slot.done.set()
            return True
        declared_low, declared_high = DECLARED[api]
        if not declared_low <= version <= declared_high:
            # neither its body nor a reply it would parse is known: the only answer left
            self.metrics.connections_closed_bad += 1
            log.warning("kafka_unsupported_version", extra=fields(
                peer=conn.peer, api=api.name, version=version, supported=f"{low}-{high}"))
            slot.close = True
            slot.done.set()
            return False
        req_msg = REQUESTS[api]
        if req_msg.is_flexible(version):
            r.skip_tags("request header")
        body = decode(req_msg, version, r, api.name)
        if not low <= version <= high:
            # a client that did not ask ApiVersions first: Kafka's error, in the reply
            # of the version it sent, every entity it named refused
            log.info("kafka_unsupported_version", extra=fields(
                peer=conn.peer, api=api.name, version=version, supported=f"{low}-{high}"))
            self.metrics.error(api, ErrorCode.UNSUPPORTED_VERSION)
            slot.frame = self._frame(api, version, cid,
                                     refusal(api, body, ErrorCode.UNSUPPORTED_VERSION))
            slot.done.set()
            return True
        if self.authorizing:
            need = _NEEDS.get(api, _CLIENT)
            if need and conn.auth_until is not None and trio.current_time() >= conn.auth_until:
                # KIP-368: past connections.max.reauth.ms without authenticating again
                log.warning("kafka_reauthentication_overdue", extra=fields(
                    peer=conn.peer, principal=conn.principal.name, api=api.name))
                slot.close = True
                slot.done.set()
                return False
            if need and not conn.authenticated:
                log.warning("kafka_unauthenticated_request", extra=fields(
                    peer=conn.peer, api=api.name))
                slot.close = True
                slot.done.set()
                return False
            if need and need.isdisjoint(conn.principal.roles):
                log.warning("kafka_unauthorized", extra=fields(
                    peer=conn.peer, principal=conn.principal.name, api=api.name,
                    roles=",".join(sorted(conn.principal.roles)) or "-",
                    needs=",".join(sorted(need))))
                if api in _DENIALS:
                    slot.frame = self._frame(api, version, cid, _denied(api, body))
                    slot.done.set()
                    return True
                slot.close = True  # no error code fits every API: the client sees a close
                slot.done.set()
                return False
        await self._name_topic_ids(api, version, body)  # ACLs and handlers go by name
        refused_topics: frozenset[str] = frozenset()
        if not (await self.acls.current()).is_open:
            judged = verdict(api, body, self.acls.allows(conn))
            if judged.refuse is not None or judged.topics:
                log.warning("kafka_acl_denied", extra=fields(
                    peer=conn.peer, principal=conn.principal.name, api=api.name,
                    error=_code_name(judged.refuse or ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                    topics=",".join(sorted(judged.topics)) or "-"))
            if judged.refuse is not None:
                slot.frame = self._frame(api, version, cid, refusal(api, body, judged.refuse))
                slot.done.set()
                return True
            refused_topics = judged.topics
        if api is ApiKey.PRODUCE:
            started = trio.current_time()
            deadline = started + max(body["timeout_ms"], 0) / 1000
            work = await self._admit_produce(conn, body, deadline, refused_topics,
                                             legacy=version < RECORD_BATCH_PRODUCE)
            nursery.start_soon(self._finish, slot, api, version, cid,
                               self._complete_produce, (body, work, started, deadline))
            return True
        if api is ApiKey.SHARE_FETCH:  # its session and acknowledgements in order, then
            # its wait for records beside what follows, as a Fetch's
            waiting = await self.share.begin_fetch(conn, version, body,
                                                   readable=await self._readable(conn))
            nursery.start_soon(self._finish, slot, api, version, cid, waiting, ())
            return True
        if api is ApiKey.FETCH:  # a parked fetch must not hold up what follows it
            handler = self.handlers[api]
            if refused_topics:  # the others are fetched; these answer the refusal
                handler = functools.partial(self._fetch_refusing, refused_topics)
            nursery.start_soon(self._finish, slot, api, version, cid,
                               handler, (conn, version, body))
        else:  # one at a time, in order, as Kafka does (a commit before its leave)
            await self._finish(slot, api, version, cid, self.handlers[api],
                               (conn, version, body))
        return True

    async def _finish(self, slot: _Slot, api: ApiKey, version: int, cid: int,
                      handler: Callable[..., Awaitable[dict[str, Any] | None]],
                      args: tuple[Any, ...]) -> None:
        current = _Current(slot)
        token = _CURRENT.set(current)
        try:
            reply = await handler(*args)
        except Exception:
            log.exception("kafka_request_failed", extra=fields(api=api.name))
            slot.close = True
            self._settle_reply(slot, 0)
            self._handled(slot)
            slot.done.set()
            return
        finally:
            current.slot = None
            _CURRENT.reset(token)
        if reply is _CLOSE:
            slot.close = True
        elif reply is not None:
            if api not in (ApiKey.PRODUCE, ApiKey.FETCH):
                self.metrics.error(api, reply.get("error_code", 0))
            slot.frame = self._frame(api, version, cid, reply)
        # what the response came to is held until it is written (none: given back)
        self._settle_reply(slot, len(slot.frame) if slot.frame is not None else 0)
        self._handled(slot)
        slot.done.set()

    def _frame(self, api: ApiKey, version: int, cid: int, body: dict[str, Any]) -> bytes:
        pieces = encode(RESPONSES[api], version, body)
        head = struct.pack(">i", cid)
        if RESPONSES[api].is_flexible(version) and api is not ApiKey.API_VERSIONS:
            head += b"\x00"
        size = len(head) + sum(len(p) for p in pieces)
        return b"".join([_SIZE.pack(size), head, *pieces])

    # -- topics -------------------------------------------------------------------------

    @functools.cached_property
    def offset_index(self) -> OffsetIndex:
        """The groups' offset index (made on first use: ``client.logs`` is the
        cluster's log store)."""
        return OffsetIndex(self.store, self.root, self.client.logs.store, log_name)

    async def _offsets_indexed(self) -> bool:
        """True if every committed offset is in the offset index (the migration is
        done); else starts the migration in the background, unless under way."""
        if self._index_complete:
            return True
        if await self.offset_index.complete():
            self._index_complete = True
            return True
        older = sorted(n for n in self.nodes
                       if "offset_index" not in self.features.get(n, ()))
        if older:
            # a gateway of an older version writes offsets without index entries: one
            # it created after the migration would never be listed (nor deleted with
            # its group), so the migration waits until every gateway indexes
            log.info("kafka_offset_index_migration_waits", extra=fields(
                gateways=",".join(map(str, older))))
        elif not self._index_migrating and self.nursery is not None:
            self._index_migrating = True
            self.nursery.start_soon(self._migrate_offset_index)
        return False

    async def _check_offset_index(self) -> None:
        """At start: migrate to the offset index if that was never done (a failure to
        look is logged; the first request that needs the index looks again)."""
        try:
            await self._offsets_indexed()
        except LedgerdError as exc:
            log.warning("kafka_offset_index_migration_failed", extra=fields(error=repr(exc)))

    async def _indexing_gateways(self) -> frozenset[int] | None:
        """The live gateways as registered now, if every one writes the offset index
        (its registration names the ``offset_index`` feature); else None."""
        live = await self.gateway_store.live()
        if any("offset_index" not in record.features for record in live.values()):
            return None
        return frozenset(live)

    async def _migrate_offset_index(self) -> None:
        """Index the offsets committed before the offset index existed: every
        partition's cursor names read once (OFFSET_FETCH_READS at a time), an entry
        added for each group's cursor, then ``offset_index_complete`` made. Run by
        any gateway that finds that node absent, once per cluster (concurrent runs add
        the same entries). A failure is logged; the next request that needs the index
        starts it again."""
        try:
            started = trio.current_time()
            before = await self._indexing_gateways()
            cursors: dict[tuple[str, int], list[str]] = {}

            async def scan(tp: tuple[str, int]) -> None:
                try:
                    cursors[tp] = await self.client.logs.store.cursors(log_name(*tp))
                except NoNodeError:
                    pass

            await each_at_most(OFFSET_FETCH_READS, scan, [
                (topic, p) for topic in await self.all_topics()
                for p in range(self.topics[topic])])
            plan = cursor_groups(cursors)
            entries = 0
            for group, topics in plan.items():
                for topic, parts in topics.items():
                    await self.offset_index.add(group, topic, parts)
                    entries += len(parts)
            after = await self._indexing_gateways()
            if before is None or after != before:
                # a gateway that does not index is live, or the gateways changed while
                # the cursors were read (one that came and went may not have indexed
                # what it committed): not done; the next request that needs the index
                # starts the migration again
                log.info("kafka_offset_index_migration_repeats", extra=fields(
                    before=before is not None and ",".join(map(str, sorted(before))),
                    after=after is not None and ",".join(map(str, sorted(after)))))
                return
            await self.offset_index.mark_complete()
            self._index_complete = True
            log.info("kafka_offset_index_migrated", extra=fields(
                partitions=len(cursors), groups=len(plan), entries=entries,
                seconds=round(trio.current_time() - started, 3)))
        except LedgerdError as exc:
            log.warning("kafka_offset_index_migration_failed", extra=fields(error=repr(exc)))
        finally:
            self._index_migrating = False

    async def partition_count(self, topic: str) -> int | None:
        """The topic's partition count (None: no such topic), from its record as read
        within ``topics.TTL_S`` (partitions added through another gateway show then)."""
        record = await self.topic_store.get(topic)
        if record is None:
            self.topics.pop(topic, None)
            return None
        self.topics[topic] = record.partitions
        return record.partitions

    async def all_topics(self) -> list[str]:
        """Every topic's name, its partition count read (OFFSET_FETCH_READS at a time:
        one after another, a few hundred topics took half a second)."""
        names = await self.topic_store.names()
        await each_at_most(OFFSET_FETCH_READS, self.partition_count, names)
        return [n for n in names if n in self.topics]

    async def each_unused_partition(
            self, visit: Callable[[str, int, PartitionLog], Awaitable[None]], *,
            only: Callable[[str], bool] = lambda _topic: True) -> int:
        """``visit`` (which handles its own errors) each partition of the topics
        ``only`` keeps that this gateway leads and no client uses here (not in
        ``partitions``: nobody produced to or fetched from it since the gateway started,
        or not for IDLE_S), for the background work a Kafka broker does on every log it
        leads (retention, compaction); each is opened for its visit and let go after,
        unless a request took it meanwhile (``uses``). Returns how many were visited;
        raises if the topics cannot be listed (ZooKeeper away)."""
        visited = 0
        for topic in await self.all_topics():
            if not only(topic):
                continue
            for p in range(self.topics.get(topic, 0)):
                key = (topic, p)
                if key in self.partitions or not self.owns(f"{topic}/{p}"):
                    continue
                part = self.partition(topic, p)
                uses = part.uses
                await visit(topic, p, part)
                visited += 1
                if self.partitions.get(key) is part and part.writer is None \
                        and part.uses == uses:
                    del self.partitions[key]
                    await part.shed()
        return visited

    async def create_topic(self, topic: str, partitions: int, *,
                           configs: dict[str, str] | None = None,
                           replicas: tuple[tuple[int, ...], ...] = ()) -> None:
        """Raises NodeExistsError if the topic exists."""
        await self.topic_store.create(topic, TopicRecord(
            partitions=partitions, configs=configs or {}, replicas=replicas,
            topic_id=new_topic_id()))
        self.topics[topic] = partitions
        log.info("kafka_topic_created", extra=fields(
            topic=topic, partitions=partitions, configs=",".join(
                f"{k}={v}" for k, v in sorted((configs or {}).items())) or "-"))

    @property
    def legacy_limiter(self) -> trio.CapacityLimiter:
        """Decompressions of client data at once (``decompressing.py``)."""
        return decompressing.limiter()

    def topic_policy(self, topic: str) -> TopicPolicy:
        """What the topic's configs (as last read), over the dynamic broker configs'
        defaults, make the gateway enforce."""
        record = self.topic_store.cached(topic)
        configs = self.broker_configs.topic_configs(
            self.node_id, record.configs if record is not None else {})
        policy = TopicPolicy.of(configs, max_batch_bytes=self.config.max_batch_bytes)
        if policy.file_delete_delay_ms and any(
                "deferred_deletes" not in self.features.get(n, ()) for n in self.nodes):
            # a gateway of an older version rewriting a log record would drop its
            # deferred deletions (and leak those ledgers): delete at once meanwhile
            policy = dataclasses.replace(policy, file_delete_delay_ms=0)
        return policy

    def partition(self, topic: str, p: int) -> PartitionLog:
        part = self.partitions.get((topic, p))
        if part is None:
            key = f"{topic}/{p}"
            part = self.partitions[(topic, p)] = PartitionLog(
                self.client, topic, p, self.part_settings, self.nursery,
                authority=lambda: self.may_lead(key))
            part.txn_flag = lambda offset: self.txn.partition_flag(topic, p, offset)
            part.rolling = lambda: self.topic_policy(topic).rolling(self.config.log_roll_bytes)
            part.origin = lambda: self._topic_origin(topic, p)
        record = self.topic_store.cached(topic)
        if record is not None:  # DeleteRecords' low watermark, from any gateway
            part.floor = record.start_of(p)
            if record is not part.origin_source:
                # the topic as the partition's next ledger header carries it (configs
                # changed since the writer opened go into the ledgers made after),
                # encoded again only when what the header keeps of it changed (the
                # cache makes a new record object each time it reads the znode)
                part.origin_source = record
                kept = origin_record(record, p)
                if kept != part.origin_record:
                    part.origin_record = kept
                    part.header_extra = topic_origin(topic, p, record)
                    if part.writer is not None:
                        part.writer.header_extra = part.header_extra
        part.uses += 1  # a visit by each_unused_partition lets go only an unused one
        return part

    async def _topic_origin(self, topic: str, p: int) -> bytes:
        """What each new ledger of the partition's log carries of its topic in its log
        header (``TopicOrigin``: ``metadata rebuild`` makes the topic record again from
        it), the record read now and given its topic id first if it has none; b"" if
        the topic is gone."""
        await self.topic_store.topic_id(topic)
        record = await self.topic_store.get(topic, fresh=True)
        if record is None:
            return b""
        part = self.partitions.get((topic, p))
        if part is not None:
            part.origin_source, part.origin_record = record, origin_record(record, p)
        return topic_origin(topic, p, record)

    # -- handlers -----------------------------------------------------------------------

    async def api_versions(self, conn: _Conn, version: int, body: dict[str, Any],
                           ) -> dict[str, Any]:
        return {"error_code": 0, "api_keys": _advertised()}

    async def metadata(self, conn: _Conn, version: int, body: dict[str, Any],
                       ) -> dict[str, Any]:
        wanted = body["topics"]
        topics: list[dict[str, Any]] = []
        if wanted is None or (version == 0 and not wanted):
            names = await self.all_topics()
        else:
            names = []
            for t in wanted:
                name = t["name"]
                if name is None:  # v10+: named by id
                    name = await self.topic_by_id(t["topic_id"])
                    if name is None:
                        topics.append({"error_code": ErrorCode.UNKNOWN_TOPIC_ID,
                                       "name": None, "topic_id": t["topic_id"],
                                       "partitions": []})
                        continue
                names.append(name)
        for name in names:
            count = await self.partition_count(name) if valid_topic_name(name) else None
            if count is None:
                # Kafka's internal topics: no such topic here (the gateway keeps offsets
                # and transactions in ZooKeeper), answered as an invalid one, which
                # librdkafka takes as final: a producer to one fails at once instead of
                # waiting out topic.metadata.propagation.max.ms
                if not valid_topic_name(name) or name in INTERNAL_TOPICS:
                    topics.append({"error_code": ErrorCode.INVALID_TOPIC_EXCEPTION,
                                   "name": name, "partitions": []})
                    continue
                if self.config.auto_create_topics and body["allow_auto_topic_creation"] \
                        and not self._deleted_lately(name) and name not in INTERNAL_TOPICS:
                    try:
                        await self.create_topic(name, self.config.default_partitions)
                    except NodeExistsError:
                        pass
                    count = await self.partition_count(name)
            if count is None:
                topics.append({"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               "name": name, "partitions": []})
                continue
            topic_id = await self.topic_id(name) if version >= 10 else ZERO_UUID
            leader_epochs = await self.leader_epochs(name, count) if version >= 7 \
                else [-1] * count
            parts = []
            for p in range(count):
                leader = self.owner(f"{name}/{p}")
                replicas, isr = self._replicas(name, p, leader)
                parts.append({"error_code": 0, "partition_index": p, "leader_id": leader,
                              "leader_epoch": leader_epochs[p],
                              "replica_nodes": replicas, "isr_nodes": isr})
            topics.append({"error_code": 0, "name": name, "topic_id": topic_id or ZERO_UUID,
                           "partitions": parts})
        brokers = [{"node_id": n, "host": h, "port": p, "rack": self.racks.get(n)}
                   for n, (h, p) in sorted(self.nodes.items())]
        return {"brokers": brokers, "cluster_id": CLUSTER_ID, "controller_id": self.node_id,
                "topics": topics}

    async def topic_id(self, name: str) -> bytes | None:
        """The topic's id (made for a record without one), remembered for lookups."""
        tid = await self.topic_store.topic_id(name)
        if tid is not None:
            self.topic_names[tid] = name
        return tid

    async def _name_topic_ids(self, api: ApiKey, version: int, body: dict[str, Any],
                              ) -> None:
        """Fill in the names of the topics a request names by id (Metadata v10+, Fetch
        v13+), before the ACLs judge it and the handler serves it: an id no topic has
        keeps no name (Metadata: None, Fetch: "") and is answered UNKNOWN_TOPIC_ID."""
        if api is ApiKey.FETCH and version >= 13:
            for t in body["topics"]:
                t["topic"] = await self.topic_by_id(t["topic_id"]) or ""
        elif api is ApiKey.METADATA and version >= 10:
            for t in body["topics"] or ():
                if t["name"] is None:
                    t["name"] = await self.topic_by_id(t["topic_id"])

    async def topic_by_id(self, topic_id: bytes) -> str | None:
        """The name of the topic with ``topic_id`` (None: no such topic now): from the
        ids seen, checked against the topic's record; an id not seen makes every
        topic's record be read, at most once a second."""
        name = self.topic_names.get(topic_id)
        if name is not None:
            record = await self.topic_store.get(name)
            if record is not None and record.topic_id == topic_id.hex():
                return name
            del self.topic_names[topic_id]
        now = trio.current_time()
        if topic_id == ZERO_UUID or now - self._ids_scanned < 1.0:
            return None
        self._ids_scanned = now
        for other in await self.topic_store.names():
            if await self.topic_id(other) == topic_id:
                return other
        return None

    async def leader_epochs(self, topic: str, count: int) -> list[int]:
        """Each partition's leader epoch as its log record holds it now (``epochs.py``):
        the same on every gateway, never lower than what a client saw before (clients
        ignore a Metadata answer whose epoch went down). Reads only."""
        out = [epochs.current_epoch(0)] * count
        limit = trio.CapacityLimiter(32)

        async def one(p: int) -> None:
            async with limit:
                try:
                    record, _ = await self.client.logs.store.get(log_name(topic, p))
                    out[p] = epochs.current_epoch(record.writers)
                except NoNodeError:
                    pass
            part = self.partitions.get((topic, p))
            if part is not None and part.writer is not None:
                out[p] = max(out[p], part.writer.epoch)

        async with trio.open_nursery() as nursery:
            for p in range(count):
                nursery.start_soon(one, p)
        return out

    async def _epoch_error(self, part: PartitionLog, current: int) -> int:
        """The error for a request naming ``current`` as the partition's leader epoch
        (Fetch v9+, ListOffsets v4+, OffsetForLeaderEpoch v2+): 0 if it is -1 or ours.
        A newer one than ours is checked against the log record again first."""
        if current < 0:
            return 0
        code = epochs.check_current_epoch(current, await part.leader_epoch())
        if code == ErrorCode.UNKNOWN_LEADER_EPOCH and part.writer is None:
            code = epochs.check_current_epoch(current, await part.leader_epoch(fresh=True))
        return int(code)

    async def _admit_produce(self, conn: _Conn, body: dict[str, Any], deadline: float,
                             refused: frozenset[str] = frozenset(), *,
                             legacy: bool = False) -> dict[tuple[str, int], Any]:
        """Validate and queue each partition's batches (called in request order, so a
        full partition queue holds this connection's next requests back, as a Kafka
        broker mutes a channel); returns per partition an error code or the queued
        item. The ``refused`` topics' partitions (the ACLs) get
        TOPIC_AUTHORIZATION_FAILED. ``legacy``: Produce v0-2, whose message sets
        (magic 0/1) are up-converted to one RecordBatch v2 each (``legacy_records.py``)."""
        assert self.nursery is not None
        work: dict[tuple[str, int], Any] = {}
        tid = body["transactional_id"]
        for t in body["topic_data"]:
            count = await self.partition_count(t["name"]) if valid_topic_name(t["name"]) else None
            for pd in t["partition_data"]:
                key = (t["name"], pd["index"])
                if t["name"] in refused:
                    work[key] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                    continue
                if t["name"] in INTERNAL_TOPICS:  # Kafka: no appends to internal topics
                    work[key] = ErrorCode.INVALID_TOPIC_EXCEPTION
                    continue
                if count is None or not 0 <= pd["index"] < count:
                    work[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not self.owns(f"{t['name']}/{pd['index']}"):
                    work[key] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    continue
                if pd["records"] is None:
                    work[key] = ErrorCode.INVALID_RECORD
                    continue
                policy = self.topic_policy(t["name"])
                if body["acks"] == -1 and \
                        policy.min_insync_replicas > self.config.ack_quorum_size:
                    # Kafka's check of the ISR against min.insync.replicas; the copies
                    # here are the ledger's ack quorum of bookies' journals
                    work[key] = ErrorCode.NOT_ENOUGH_REPLICAS
                    continue
                try:
                    records = pd["records"]
                    if legacy:  # one batch, compressed as the topic stores it
                        records = await trio.to_thread.run_sync(
                            legacy_batch, records, policy.compression,
                            limiter=self.legacy_limiter)
                    batches = split_batches(
                        records, max_batch_bytes=policy.max_message_bytes,
                        limit_name="the topic's max.message.bytes"
                        if policy.max_message_bytes < self.config.max_batch_bytes
                        else "max_batch_bytes", transactional=tid is not None)
                    # records whole, counted right (small uncompressed ones here)
                    if any(h.attributes & 7 for h, _ in batches) or \
                            sum(len(raw) for _, raw in batches) > INLINE_CHECK_BYTES:
                        await trio.to_thread.run_sync(check_batches, batches,
                                                      limiter=self.legacy_limiter)
                    else:
                        check_batches(batches)
                    if policy.compression is not None:  # the topic's codec, as Kafka does
                        batches = await trio.to_thread.run_sync(
                            recompressed, batches, policy.compression,
                            policy.max_message_bytes, limiter=self.legacy_limiter)
                    if policy.compact:  # keyless records cannot be compacted
                        keyless = await trio.to_thread.run_sync(
                            keyless_records, batches, limiter=self.legacy_limiter)
                        if keyless:
                            work[key] = _keyless_refusal(t["name"], pd["index"], keyless)
                            continue
                except BatchError as exc:
                    log.warning("kafka_bad_batch", extra=fields(
                        peer=conn.peer, topic=t["name"], partition=pd["index"],
                        error=str(exc)))
                    work[key] = exc.code
                    continue
                part = self.partition(*key)
                if not await part.wait_for_room(sum(len(b) for _, b in batches), deadline):
                    work[key] = ErrorCode.REQUEST_TIMED_OUT  # the client retries
                    continue
                if not self.owns(f"{t['name']}/{pd['index']}"):  # moved while it waited
                    work[key] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    continue
                stamp = -1
                if policy.log_append_time:  # the topic's time is the gateway's
                    stamp = int(time.time() * 1000)
                    stamped = [with_log_append_time(raw, stamp) for _, raw in batches]
                    batches = [(BatchHeader.parse(raw), raw) for raw in stamped]
                if tid is not None:  # the coordinator confirms the partition is in it
                    work[key] = await transactions.admit_transactional(self, part, tid, batches)
                else:
                    work[key] = part.enqueue(batches, self.nursery)
                if not isinstance(work[key], int):
                    work[key].append_time = stamp
        return work

    async def _complete_produce(self, body: dict[str, Any], work: dict[tuple[str, int], Any],
                                started: float, deadline: float) -> dict[str, Any] | None:
        out: dict[str, list[dict[str, Any]]] = {}
        for (topic, p), item in work.items():
            entry: dict[str, Any] = {"index": p, "error_code": 0, "base_offset": -1}
            if isinstance(item, int):
                entry["error_code"] = item
            elif isinstance(item, _Refusal):
                entry.update(error_code=item.code, error_message=item.message,
                             record_errors=item.record_errors)
            else:
                with trio.move_on_at(deadline):
                    await item.done.wait()
                if not item.done.is_set():
                    entry["error_code"] = ErrorCode.REQUEST_TIMED_OUT
                elif item.error is not None:
                    entry["error_code"] = storage_error_code(item.error)
                elif item.code:
                    entry["error_code"] = item.code
                else:
                    entry["base_offset"] = item.base_offset
                    entry["log_start_offset"] = -1
                    entry["log_append_time_ms"] = item.append_time
                    self.metrics.records_in += sum(h.record_count for h, _ in item.batches)
                    self.metrics.bytes_in += sum(len(raw) for _, raw in item.batches)
            self.metrics.error(ApiKey.PRODUCE, entry["error_code"])
            out.setdefault(topic, []).append(entry)
        self.metrics.produce_latency.observe(trio.current_time() - started)
        if body["acks"] == 0:
            failed = {f"{t}/{e['index']}": _code_name(e["error_code"])
                      for t, parts in out.items() for e in parts if e["error_code"]}
            if failed:
                # No response tells the producer, so the connection closes (Kafka's rule
                # for acks=0): it sees the error as a disconnect and refreshes metadata.
                log.info("kafka_acks0_produce_failed", extra=fields(
                    partitions=",".join(f"{k}:{v}" for k, v in sorted(failed.items()))))
                return _CLOSE
            return None
        return {"responses": [{"name": t, "partition_responses": parts}
                              for t, parts in out.items()]}

    async def fetch(self, conn: _Conn, version: int, body: dict[str, Any]) -> dict[str, Any]:
        started = trio.current_time()
        # v13+: topic ids that name no topic (``_name_topic_ids`` left their names "")
        unknown = {t["topic_id"] for t in body["topics"] if not t["topic"]} \
            if version >= 13 else set()
        reply = await self._fetch(body, unknown)
        self.metrics.fetch_latency.observe(trio.current_time() - started)
        for t in reply["responses"]:
            for part in t["partitions"]:
                self.metrics.error(ApiKey.FETCH, part["error_code"])
                self.metrics.bytes_out += len(part["records"])
        return reply

    async def _fetch_refusing(self, refused: frozenset[str], conn: _Conn, version: int,
                              body: dict[str, Any]) -> dict[str, Any]:
        """Fetch the topics the ACLs allow; ``refused`` answer TOPIC_AUTHORIZATION_FAILED
        (Kafka's answer per topic)."""
        allowed = {**body, "topics": [t for t in body["topics"] if t["topic"] not in refused]}
        reply = await self.fetch(conn, version, allowed)
        denied = {**body, "topics": [t for t in body["topics"] if t["topic"] in refused]}
        reply["responses"] += refusal(ApiKey.FETCH, denied,
                                      ErrorCode.TOPIC_AUTHORIZATION_FAILED)["responses"]
        return reply

    def _preferred_replica(self, body: dict[str, Any], topic: str, partition: int,
                           part: PartitionLog, offset: int) -> int:
        """Fetch v11+ from a consumer that says its rack, to this partition's leader,
        with gateway_rack_aware_reads: the gateway in that rack to fetch from, or
        NO_PREFERENCE (``replica_selector.py``). Only a consumer reading what a follower
        can already see is sent away (``PartitionLog.visible_end``: one group append
        behind the high watermark): one at the tail stays, or a follower would answer
        it out of range and send it back. The choice is among the partition's replicas
        as Metadata tells them (the Java client refuses any other)."""
        if not self.config.gateway_rack_aware_reads or body.get("replica_id", -1) >= 0:
            return NO_PREFERENCE
        key = f"{topic}/{partition}"
        if not self.owns(key) or part.writer is None or not 0 <= offset < part.visible_end:
            return NO_PREFERENCE  # a follower serves what it is asked
        replicas = set(self._replicas(topic, partition, self.node_id)[0])
        return preferred_read_replica(client_rack=body.get("rack_id") or "",
                                      leader=self.node_id,
                                      racks={n: r for n, r in self.racks.items()
                                             if n in replicas},
                                      partition_key=key)

    def _replicas(self, topic: str, partition: int, leader: int,
                  ) -> tuple[list[int], list[int]]:
        """The partition's replicas and in-sync replicas as Metadata tells them: a
        replica assignment given at creation as given (it places nothing; its live
        gateways are in sync), with the leader put first if it is not in it (it serves
        the partition, and clients and tools take the leader to be one of its replicas
        and in sync), else every live gateway, the leader first: each serves the
        partition's reads from its ledgers (a follower up to what it has learnt is
        acknowledged)."""
        record = self.topic_store.cached(topic)
        if record is not None and partition < len(record.replicas):
            replicas = list(record.replicas[partition])
            if leader >= 0 and leader not in replicas:
                replicas.insert(0, leader)
            return replicas, [n for n in replicas if n in self.nodes]
        every = [leader, *sorted(n for n in self.nodes if n != leader)]
        return every, every

    async def _fetch(self, body: dict[str, Any], unknown: set[bytes]) -> dict[str, Any]:
        deadline = trio.current_time() + max(body["max_wait_ms"], 0) / 1000
        while True:
            # the client's limit, within Kafka's broker-side fetch.max.bytes, and within
            # what the gateway's responses may hold (max_held_response_bytes)
            budget = await self.response_room(
                min(body["max_bytes"] if body["max_bytes"] > 0 else FETCH_MAX_BYTES,
                    FETCH_MAX_BYTES), deadline)
            total = 0
            responses = []
            waits: list[trio.Event] = []
            poll = False  # a partition another gateway writes: look again soon
            for t in body["topics"]:
                count = await self.partition_count(t["topic"]) if valid_topic_name(t["topic"]) \
                    else None
                parts = []
                for pr in t["partitions"]:
                    # records b"" even beside an error: librdkafka cannot parse a null
                    # record set (MessageSetSize -1), so it would never see the error
                    res: dict[str, Any] = {"partition_index": pr["partition"], "error_code": 0,
                                           "high_watermark": -1, "aborted_transactions": [],
                                           "records": b""}
                    parts.append(res)
                    if t["topic_id"] in unknown:
                        res["error_code"] = ErrorCode.UNKNOWN_TOPIC_ID
                        continue
                    if count is None or not 0 <= pr["partition"] < count:
                        res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        continue
                    part = self.partition(t["topic"], pr["partition"])
                    try:  # KIP-320: a client whose leader epoch is not ours is told so
                        res["error_code"] = await self._epoch_error(
                            part, pr["current_leader_epoch"])
                    except (LedgerdError, FencedError) as exc:
                        res["error_code"] = storage_error_code(exc)
                    if res["error_code"]:
                        continue
                    preferred = self._preferred_replica(body, t["topic"], pr["partition"],
                                                        part, pr["fetch_offset"])
                    if preferred != NO_PREFERENCE or total >= budget:
                        # KIP-392: a consumer sent to a gateway in its rack gets no
                        # records here, only where the partition stands; a full response
                        # leaves the rest without records this time
                        try:
                            hw = await part.high_watermark()
                            lso = (await part.stable_view(hw))[0] \
                                if body["isolation_level"] else hw
                        except (LedgerdError, FencedError) as exc:
                            res["error_code"] = storage_error_code(exc)
                            continue
                        res.update(high_watermark=hw, last_stable_offset=lso, records=b"",
                                   preferred_read_replica=preferred,
                                   log_start_offset=await part.start_offset())
                        continue
                    limit = max(1, min(pr["partition_max_bytes"], budget - total))
                    lso = -1
                    try:
                        # only the response's first records may exceed the limits (KIP-74:
                        # a batch larger than them still makes progress); after that a
                        # batch that does not fit waits for the next fetch, so the whole
                        # response stays within the client's fetch.max.bytes
                        records, hw = await part.read(pr["fetch_offset"], limit,
                                                      min_one=total == 0)
                        lso = hw
                        if body["isolation_level"]:  # read_committed: below the LSO only
                            records, lso, aborted = await transactions.read_committed(
                                part, pr["fetch_offset"], records, hw)
                            res["aborted_transactions"] = aborted
                    except OffsetOutOfRangeError as exc:
                        res.update(error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                                   high_watermark=exc.end, last_stable_offset=exc.end,
                                   log_start_offset=exc.start)
                        continue
                    except (LedgerdError, FencedError) as exc:
                        res["error_code"] = storage_error_code(exc)
                        continue
                    res.update(high_watermark=hw, last_stable_offset=lso,
                               log_start_offset=await part.start_offset(), records=records)
                    total += len(records)
                    if not records and part.writer is not None:
                        waits.append(part.changed)
                    elif not records:
                        poll = True
                responses.append({"topic": t["topic"], "topic_id": t["topic_id"],
                                  "partitions": parts})
            now = trio.current_time()
            if total >= body["min_bytes"] or total > 0 or now >= deadline or not (
                    waits or poll):
                return {"session_id": 0, "responses": responses}
            self.response_room_back()  # a parked fetch holds none
            await _wait_any(waits, min(deadline, now + 0.1) if poll else deadline)

    async def list_offsets(self, conn: _Conn, version: int, body: dict[str, Any],
                           ) -> dict[str, Any]:
        topics = []
        for t in body["topics"]:
            count = await self.partition_count(t["name"]) if valid_topic_name(t["name"]) else None
            parts = []
            for pr in t["partitions"]:
                res: dict[str, Any] = {"partition_index": pr["partition_index"],
                                       "error_code": 0, "timestamp": -1, "offset": -1}
                parts.append(res)
                if count is None or not 0 <= pr["partition_index"] < count:
                    res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                part = self.partition(t["name"], pr["partition_index"])
                ts = pr["timestamp"]
                try:
                    res["error_code"] = await self._epoch_error(
                        part, pr["current_leader_epoch"])
                    if res["error_code"]:
                        continue
                    if ts == -1:
                        res["offset"] = await part.high_watermark()
                        if body["isolation_level"]:  # read_committed: the LSO
                            res["offset"] = (await part.stable_view(res["offset"]))[0]
                    elif ts == -2 or (ts == -4 and version >= 8):
                        # EARLIEST, EARLIEST_LOCAL (KIP-405): nothing is tiered away
                        res["offset"] = await part.start_offset()
                    elif ts == -5 and version >= 9:
                        pass  # LATEST_TIERED (KIP-1005): none, -1 as Kafka without tiering
                    elif ts == -3 and version >= 7:  # MAX_TIMESTAMP (KIP-734)
                        found = await part.offset_of_max_timestamp()
                        if found is not None:
                            res["timestamp"], res["offset"] = found
                    elif ts in (-3, -4, -5):  # a sentinel newer than the request
                        res["error_code"] = ErrorCode.UNSUPPORTED_VERSION
                    elif ts < 0:
                        res["error_code"] = ErrorCode.INVALID_REQUEST
                    else:
                        found = await part.offset_for_time(ts)
                        if found is not None:
                            res["timestamp"], res["offset"] = found
                    if version >= 4 and res["offset"] >= 0:
                        res["leader_epoch"] = await part.epoch_of(res["offset"])
                except (LedgerdError, FencedError) as exc:
                    res["error_code"] = storage_error_code(exc)
            topics.append({"name": t["name"], "partitions": parts})
        return {"topics": topics}

    async def offset_for_leader_epoch(self, conn: _Conn, version: int, body: dict[str, Any],
                                      ) -> dict[str, Any]:
        """KIP-101/KIP-320: where each asked epoch ended (``epochs.end_offset_for_epoch``
        over the epoch history the log's ledgers hold). Only the partition's leader
        answers, as in Kafka (its log end is the high watermark it acknowledged)."""
        topics = []
        for t in body["topics"]:
            count = await self.partition_count(t["topic"]) if valid_topic_name(t["topic"]) \
                else None
            parts = []
            for pr in t["partitions"]:
                res: dict[str, Any] = {"partition": pr["partition"], "error_code": 0,
                                       "leader_epoch": -1, "end_offset": -1}
                parts.append(res)
                if count is None or not 0 <= pr["partition"] < count:
                    res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    continue
                if not await self.may_lead(f"{t['topic']}/{pr['partition']}"):
                    res["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    continue
                part = self.partition(t["topic"], pr["partition"])
                try:
                    res["error_code"] = await self._epoch_error(
                        part, pr["current_leader_epoch"])
                    if res["error_code"]:
                        continue
                    res["leader_epoch"], res["end_offset"] = await part.end_offset_for_epoch(
                        pr["leader_epoch"])
                except (LedgerdError, FencedError) as exc:
                    res["error_code"] = storage_error_code(exc)
            topics.append({"topic": t["topic"], "partitions": parts})
        return {"topics": topics}

    async def init_producer_id(self, conn: _Conn, version: int, body: dict[str, Any],
                               ) -> dict[str, Any]:
        if body["transactional_id"] is not None:
            return await self.txn.init_producer_id(version, body)
        return {"error_code": 0, "producer_id": await self.new_producer_id(),
                "producer_epoch": 0}

    async def new_producer_id(self) -> int:
        """A producer id never given before (a CAS counter in ZooKeeper)."""
        return await self.producer_ids.next()

    async def write_marker(self, marker: Marker, *, here_only: bool = False) -> int:
        """Write a transaction marker into its partition's log: here if this gateway
        leads the partition, else sent to the gateway that does (``peer.py``), or
        with ``here_only`` not at all (NOT_LEADER_OR_FOLLOWER)."""
        owner = self.owner(f"{marker.topic}/{marker.partition}")
        if owner == self.node_id or owner not in self.nodes:
            return await self.txn.write_local_marker(marker)
        if here_only:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        host, port = self.nodes[owner]
        return await send_marker(host, port, marker, self.peer_auth)

    # -- groups -------------------------------------------------------------------------

    async def _readable(self, conn: _Conn) -> Callable[[str], bool]:
        """Whether ``conn``'s principal may READ a topic (the ACLs; share requests name
        topics by id and keep them in sessions, so each is judged as it is served)."""
        if (await self.acls.current()).is_open:
            return lambda _topic: True
        decide = self.acls.allows(conn)
        return lambda topic: decide(AclOperation.READ, Resource(ResourceType.TOPIC, topic))

    async def _share_acknowledge(self, conn: _Conn, version: int, body: dict[str, Any],
                                 ) -> dict[str, Any]:
        return await self.share.share_acknowledge(conn, version, body,
                                                  readable=await self._readable(conn))

    async def find_coordinator(self, conn: _Conn, version: int, body: dict[str, Any],
                               ) -> dict[str, Any]:
        if body["key_type"] not in (0, 1):
            return {"error_code": ErrorCode.INVALID_REQUEST,
                    "error_message": f"unknown coordinator key type {body['key_type']}"}
        node = self.owner(f"{'txn' if body['key_type'] else 'group'}/{body['key']}")
        host, port = self.nodes.get(node, self.config.advertised(self.port))
        return {"error_code": 0, "node_id": node, "host": host, "port": port}

    async def _group(self, group_id: str) -> Group | int:
        """The group (a new one if it has neither members nor a record), or an error
        code: INVALID_GROUP_ID, NOT_COORDINATOR (another gateway coordinates it)."""
        found = await self._existing_group(group_id)
        if found is None:
            found = self.groups.setdefault(group_id, Group(group_id, self.group_settings))
        return found

    async def _existing_group(self, group_id: str) -> Group | int | None:
        """As :meth:`_group`, but None where that would make a new group: the admin
        APIs name any group id, and describing one must not create it."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        if not self.owns(f"group/{group_id}"):
            return ErrorCode.NOT_COORDINATOR
        group = self.groups.get(group_id)
        if group is not None:
            return group
        record = await self.group_store.get(group_id)
        if record is None:
            return None
        group = Group(group_id, self.group_settings)
        group.generation = group.persisted = record.generation
        group.protocol_type = record.protocol_type
        return self.groups.setdefault(group_id, group)

    async def _store_group(self, group: Group) -> None:
        gen = group.generation
        async with self._group_record_lock:
            if group.state is GroupState.DEAD or self.groups.get(group.group_id) is not group:
                return  # deleted meanwhile: its record must stay gone
            await self.group_store.save(group.group_id, gen, group.protocol_type)
        group.persisted = max(group.persisted, gen)

    async def _wait(self, reply: Reply) -> dict[str, Any]:
        if reply.value is None:
            reply.waiter = trio.Event()
            await reply.waiter.wait()
        assert reply.value is not None
        return reply.value

    async def join_group(self, conn: _Conn, version: int, body: dict[str, Any],
                         ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        if isinstance(group, int):
            return {"error_code": group, "member_id": body["member_id"]}
        reply = group.join(member_id=body["member_id"], client_id=conn.client_id,
                           protocol_type=body["protocol_type"],
                           protocols=[(p["name"], p["metadata"]) for p in body["protocols"]],
                           session_timeout_ms=body["session_timeout_ms"],
                           rebalance_timeout_ms=body["rebalance_timeout_ms"],
                           now=trio.current_time(), client_host=_client_host(conn.peer),
                           instance_id=body["group_instance_id"])
        return await self._wait(reply)

    async def sync_group(self, conn: _Conn, version: int, body: dict[str, Any],
                         ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        if isinstance(group, int):
            return {"error_code": group}
        reply = group.sync(member_id=body["member_id"], generation=body["generation_id"],
                           assignments=[(a["member_id"], a["assignment"])
                                        for a in body["assignments"]],
                           now=trio.current_time(), instance_id=body["group_instance_id"])
        return await self._wait(reply)

    async def heartbeat(self, conn: _Conn, version: int, body: dict[str, Any],
                        ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        if isinstance(group, int):
            return {"error_code": group}
        return {"error_code": group.heartbeat(member_id=body["member_id"],
                                              generation=body["generation_id"],
                                              now=trio.current_time(),
                                              instance_id=body["group_instance_id"])}

    async def leave_group(self, conn: _Conn, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        if isinstance(group, int):
            return {"error_code": group}
        if version < 3:
            return {"error_code": group.leave(member_id=body["member_id"],
                                              now=trio.current_time())}
        members = [{"member_id": m["member_id"], "group_instance_id": m["group_instance_id"],
                    "error_code": group.leave(member_id=m["member_id"],
                                              instance_id=m["group_instance_id"],
                                              now=trio.current_time())}
                   for m in body["members"]]
        return {"error_code": 0, "members": members}

    async def offset_commit(self, conn: _Conn, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        error = group if isinstance(group, int) else group.check_commit(
            member_id=body["member_id"], generation=body["generation_id"],
            instance_id=body["group_instance_id"])
        topics = []
        for t in body["topics"]:
            count = await self.partition_count(t["name"]) if valid_topic_name(t["name"]) else None
            parts = []
            for pr in t["partitions"]:
                code = error
                meta = pr["committed_metadata"]
                if code == 0 and (count is None or not 0 <= pr["partition_index"] < count):
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif code == 0 and meta is not None and len(meta.encode()) > MAX_METADATA:
                    code = ErrorCode.OFFSET_METADATA_TOO_LARGE
                elif code == 0:
                    try:
                        await self._commit(body["group_id"], t["name"], pr["partition_index"],
                                           pr["committed_offset"], meta,
                                           pr["committed_leader_epoch"])
                    except (LedgerdError, FencedError) as exc:
                        code = storage_error_code(exc)
                parts.append({"partition_index": pr["partition_index"], "error_code": code})
                if code:
                    log.info("kafka_commit_refused", extra=fields(
                        group=body["group_id"], topic=t["name"],
                        partition=pr["partition_index"], error=ErrorCode(code).name))
            topics.append({"name": t["name"], "partitions": parts})
        return {"topics": topics}

    async def _commit(self, group_id: str, topic: str, p: int, offset: int,
                      metadata: str | None, leader_epoch: int = -1) -> None:
        await self._ensure_group_record(group_id)
        part = self.partition(topic, p)
        name = log_name(topic, p)
        lid = eid = entry_offset = 0
        hw = await part.high_watermark()
        try:
            if 0 <= offset < hw:
                lid, eid = await part.locate(offset)
            elif offset >= hw > 0:
                lid, eid = await part.locate(hw - 1)
                eid += 1
            if lid:
                for seg in await self.client.logs.layout(name):
                    if seg.ledger_id == lid and seg.first_offset is not None:
                        entry_offset = seg.first_offset + eid - seg.first_entry
        except LedgerdError:
            pass  # the position is a hint for ledgerd readers; the Kafka offset is kept
        try:
            await self.client.logs.store.get(name)
        except NoNodeError:
            try:
                await self.client.logs.store.create(name)
            except NodeExistsError:
                pass
        record = CursorRecord(entry_offset, lid, eid, kafka_offset=max(offset, 0),
                              kafka_metadata=metadata, kafka_leader_epoch=leader_epoch)
        # a new cursor is created with its offset index entry, in one multi
        await self.offset_index.commit(group_znode(group_id), topic, p, record)

    async def offset_fetch(self, conn: _Conn, version: int, body: dict[str, Any],
                           ) -> dict[str, Any]:
        group = await self._group(body["group_id"])
        if isinstance(group, int):
            return {"error_code": group, "topics": []}
        cursor = "kafka." + group_znode(body["group_id"])
        wanted = body["topics"]
        if wanted is None and await self._offsets_indexed():
            wanted = await self._indexed_partitions(body["group_id"])
        elif wanted is None:  # offsets not indexed yet (the migration is under way)
            wanted = []
            for name in await self.all_topics():
                wanted.append({"name": name,
                               "partition_indexes": list(range(self.topics[name]))})
        # one ZooKeeper read per partition, OFFSET_FETCH_READS at a time (every topic's
        # offsets: the partitions the group's offset index lists)
        found: dict[tuple[str, int], dict[str, Any]] = {}

        async def read(tp: tuple[str, int]) -> None:
            topic, p = tp
            res: dict[str, Any] = {"partition_index": p, "committed_offset": -1,
                                   "metadata": "", "error_code": 0}
            try:
                got = await self.client.logs.store.get_cursor(log_name(topic, p), cursor)
            except (NoNodeError, ValueError):
                got = None
            if got is not None and got[0].kafka_offset is not None:
                res["committed_offset"] = got[0].kafka_offset
                res["metadata"] = got[0].kafka_metadata or ""
                res["committed_leader_epoch"] = got[0].kafka_leader_epoch
            found[(topic, p)] = res

        unstable: set[tuple[str, int]] = set()
        if body.get("require_stable"):
            # KIP-447: a partition a transaction holds offsets of (not committed yet)
            # is answered UNSTABLE_OFFSET_COMMIT, which the client retries. Asked
            # BEFORE the cursors are read: a transaction not pending now has written
            # its offsets already, so the reads below see them
            try:
                unstable = await self.txn.unstable_offsets(body["group_id"])
            except MetadataError:
                return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "topics": []}
        await each_at_most(OFFSET_FETCH_READS, read, [
            (t["name"], p) for t in wanted for p in t["partition_indexes"]])
        if unstable:
            for tp in unstable & found.keys():
                found[tp].update(committed_offset=-1, metadata="", committed_leader_epoch=-1,
                                 error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT)
        topics = []
        for t in wanted:
            parts = [found[(t["name"], p)] for p in t["partition_indexes"]
                     if (t["name"], p) in found]
            if body["topics"] is None:
                parts = [r for r in parts if r["committed_offset"] >= 0 or r["error_code"]]
            topics.append({"name": t["name"], "partitions": parts})
        return {"topics": topics, "error_code": 0}

    async def _indexed_partitions(self, group_id: str) -> list[dict[str, Any]]:
        """The partitions the group's offset index lists, of topics that exist, as
        OffsetFetch's topics: one read for the index's topics, one per topic for its
        entry (and its partition count, cached); a deleted topic's entries dropped."""
        group = group_znode(group_id)
        entries: dict[str, tuple[int, ...]] = {}
        counts: dict[str, int | None] = {}

        async def read(topic: str) -> None:
            entry = await self.offset_index.entry(group, topic)
            if entry is not None:
                entries[topic] = entry.partitions
                counts[topic] = await self.partition_count(topic) \
                    if valid_topic_name(topic) else None

        await each_at_most(OFFSET_FETCH_READS, read, await self.offset_index.topics(group))
        reads, gone = indexed_reads(entries, counts)
        for topic in gone:  # its cursors went with its logs: drop the entries left
            await self.offset_index.remove(group, topic, keep_present=True)
        return [{"name": t, "partition_indexes": ps} for t, ps in reads.items()]

    # -- group and cluster admin --------------------------------------------------------

    async def _ensure_group_record(self, group_id: str) -> None:
        """A group that commits offsets has a record (``groups/<group>``), so ListGroups
        and DeleteGroups know it even if it never joined (a consumer that assigns its
        partitions itself, an admin's AlterConsumerGroupOffsets)."""
        if group_id in self.group_records:
            return
        group = self.groups.get(group_id)
        if group is None or group.persisted < 0:
            await self.group_store.ensure(group_id)
            if group is not None:
                group.persisted = max(group.persisted, 0)
        self.group_records.add(group_id)
        while len(self.group_records) > 10000:  # a memory of records made, not a registry
            self.group_records.pop()

    async def _stored_groups(self) -> dict[str, str]:
        """Group id -> protocol type of the groups with a record in ZooKeeper that this
        gateway coordinates (a record is read only if its name does not say already
        that the group is another gateway's, or in memory here)."""
        out: dict[str, str] = {}
        for child in await self.group_store.names():
            if not child.startswith("x-"):  # a plain name is the group id itself
                if not self.owns(f"group/{child}"):
                    continue
                if child in self.groups:
                    out[child] = self.groups[child].protocol_type
                    continue
            try:
                record = await self.group_store.get_named(child)
            except CorruptMetadataError as exc:  # an unknown format too: named, skipped
                log.warning("kafka_group_record_unreadable", extra=fields(
                    znode=exc.path, error=str(exc)))
                continue
            if record is not None and self.owns(f"group/{record.group_id}"):
                out[record.group_id] = record.protocol_type
        return out

    async def list_groups(self, conn: _Conn, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        """The groups this gateway coordinates (each gateway lists its own share, as
        each Kafka broker does; admin clients ask every broker)."""
        known = await self._stored_groups()
        for gid, live in self.groups.items():
            if live.is_known:
                known.setdefault(gid, live.protocol_type)
        groups = []
        for gid, protocol_type in sorted(known.items()):
            if not self.owns(f"group/{gid}"):
                continue
            group = self.groups.get(gid)
            state = group.state if group is not None else GroupState.EMPTY
            if state is GroupState.DEAD:
                continue
            if group is not None and group.protocol_type:
                protocol_type = group.protocol_type
            if listed(state, body["states_filter"], body["types_filter"]):
                groups.append({"group_id": gid, "protocol_type": protocol_type,
                               "group_state": state.value, "group_type": "classic"})
        # share groups (KIP-932), as Kafka 4.1 lists them: protocol type "share"
        states = {s.lower() for s in body["states_filter"]}
        types = {t.lower() for t in body["types_filter"]}
        for gid, share_state in sorted((await self.share.listed()).items()):
            if self.owns(f"group/{gid}") and gid not in known and \
                    (not states or share_state.lower() in states) and \
                    (not types or "share" in types):
                groups.append({"group_id": gid, "protocol_type": "share",
                               "group_state": share_state, "group_type": "share"})
        return {"error_code": 0, "groups": groups}

    async def describe_groups(self, conn: _Conn, version: int, body: dict[str, Any],
                              ) -> dict[str, Any]:
        out = []
        for gid in body["groups"]:
            res: dict[str, Any] = {"group_id": gid, "error_code": 0, "error_message": None}
            out.append(res)
            group = await self._existing_group(gid)
            if isinstance(group, int):
                res["error_code"] = group
                continue
            if body["include_authorized_operations"]:
                res["authorized_operations"] = self.acls.authorized_operations(
                    conn.principal, Resource(ResourceType.GROUP, gid), peer=conn.peer)
            summary = group.summary() if group is not None and group.is_known \
                else DEAD_SUMMARY
            if summary.state is GroupState.DEAD and version >= 6:  # Kafka 4's answer
                res.update(error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                           error_message=f"group {gid!r} not found")
            res.update(group_state=summary.state.value, protocol_type=summary.protocol_type,
                       protocol_data=summary.protocol, members=[{
                           "member_id": m.member_id, "group_instance_id": m.instance_id,
                           "client_id": m.client_id, "client_host": m.client_host,
                           "member_metadata": m.metadata, "member_assignment": m.assignment}
                           for m in summary.members])
        return {"groups": out}

    async def delete_groups(self, conn: _Conn, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
        """The named groups are deleted side by side (``GROUP_DELETE_FANOUT`` at once):
        each is a few ZooKeeper writes, and a client's request timeout covers them all.
        A name given again is deleted again after the first, as if one by one."""
        names: list[str] = body["groups_names"]
        codes: list[int] = [0] * len(names)
        limiter = trio.CapacityLimiter(GROUP_DELETE_FANOUT)

        async def delete(i: int) -> None:
            async with limiter:
                codes[i] = await self._delete_group_logged(names[i])

        firsts = {gid: i for i, gid in reversed(list(enumerate(names)))}
        async with trio.open_nursery() as nursery:
            for i in firsts.values():
                nursery.start_soon(delete, i)
        for i, gid in enumerate(names):
            if firsts[gid] != i:
                codes[i] = await self._delete_group_logged(gid)
        return {"results": [{"group_id": gid, "error_code": code}
                            for gid, code in zip(names, codes, strict=True)]}

    async def _delete_group_logged(self, gid: str) -> int:
        try:
            return await self._delete_group(gid)
        except LedgerdError as exc:
            log.warning("kafka_group_delete_failed", extra=fields(group=gid,
                                                                  error=repr(exc)))
            return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retriable: the client asks again

    async def _delete_group(self, gid: str) -> int:
        """Mark the group dead (refused if it has members), delete its committed offsets
        (every partition's ``kafka.<group>`` cursor) and its record. If cancelled or
        failed part way the group is forgotten from memory, so a retry starts again
        from what ZooKeeper still holds."""
        group = await self._existing_group(gid)
        if isinstance(group, int):
            return group
        if group is not None and group.members:
            return ErrorCode.NON_EMPTY_GROUP  # (before a share group's state is touched)
        shared = await self.share.delete_group(gid)  # a share group of that id, if any
        if shared in (ErrorCode.NON_EMPTY_GROUP, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
            return shared
        if group is None:  # no record: offsets committed before groups had one, if any
            group = self.groups.setdefault(gid, Group(gid, self.group_settings))
        existed = group.is_known or shared == ErrorCode.NONE
        code = group.delete()
        if code:
            return int(code)
        try:
            found: list[bool] = []
            if not await self._offsets_indexed():
                # offsets not indexed yet: one cursor per partition of every topic,
                # deleted side by side (the index's own entries go below)
                limiter = trio.CapacityLimiter(DELETE_FANOUT)

                async def delete_one(topic: str, p: int) -> None:
                    async with limiter:
                        found.append(await self._delete_offset(gid, topic, p))

                async with trio.open_nursery() as nursery:
                    for topic in await self.all_topics():
                        for p in range(self.topics[topic]):
                            nursery.start_soon(delete_one, topic, p)
            # the cursors the group's offset index lists, each with its entry
            removed = sum(found) + await self.offset_index.drop_group(group_znode(gid))
            await self.txn.forget_group(gid)  # its stale pending-offsets entries
            async with self._group_record_lock:
                await self.group_store.delete(gid)
        finally:
            if self.groups.get(gid) is group:
                del self.groups[gid]
            self.group_records.discard(gid)
        if not existed and not removed:
            return ErrorCode.GROUP_ID_NOT_FOUND
        log.info("kafka_group_deleted", extra=fields(group=gid, offsets=removed))
        return ErrorCode.NONE

    async def _delete_offset(self, gid: str, topic: str, p: int) -> bool:
        try:
            return await self.client.logs.store.delete_cursor(
                log_name(topic, p), "kafka." + group_znode(gid))
        except NoNodeError:
            return False

    async def offset_delete(self, conn: _Conn, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
        gid = body["group_id"]
        group = await self._existing_group(gid)
        if isinstance(group, int):
            return {"error_code": group}
        if group is None or not group.is_known:
            return {"error_code": ErrorCode.GROUP_ID_NOT_FOUND}
        code, per_topic = group.offset_deletion([t["name"] for t in body["topics"]])
        if code:
            return {"error_code": code}
        topics = []
        for t in body["topics"]:
            count = await self.partition_count(t["name"]) if valid_topic_name(t["name"]) else None
            parts = []
            for pr in t["partitions"]:
                p = pr["partition_index"]
                err = per_topic[t["name"]]
                if count is None or not 0 <= p < count:
                    err = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif err == ErrorCode.NONE:
                    try:
                        deleted, listed = await self.offset_index.remove(
                            group_znode(gid), t["name"], (p,))
                        # one the index did not list: committed before it existed
                        if deleted or (not listed and
                                       await self._delete_offset(gid, t["name"], p)):
                            log.info("kafka_offset_deleted", extra=fields(
                                group=gid, topic=t["name"], partition=p))
                    except LedgerdError as exc:
                        err = storage_error_code(exc)
                parts.append({"partition_index": p, "error_code": err})
            topics.append({"name": t["name"], "partitions": parts})
        return {"error_code": 0, "topics": topics}

    async def describe_cluster(self, conn: _Conn, version: int, body: dict[str, Any],
                               ) -> dict[str, Any]:
        """Every live gateway is a broker; the controller is this one (as in Metadata)."""
        if body["endpoint_type"] != 1:  # 2 = controllers: a broker's answer
            return {"error_code": ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                    "error_message": "the gateways are brokers; ledgerd has no "
                                     "controller endpoints", "cluster_id": CLUSTER_ID,
                    "endpoint_type": body["endpoint_type"], "brokers": []}
        ops = self.acls.authorized_operations(conn.principal, cluster(), peer=conn.peer) \
            if body["include_cluster_authorized_operations"] else -2147483648
        return {"error_code": 0, "error_message": None, "endpoint_type": 1,
                "cluster_authorized_operations": ops,
                "cluster_id": CLUSTER_ID, "controller_id": self.node_id,
                "brokers": [{"broker_id": n, "host": h, "port": p, "rack": self.racks.get(n),
                             "is_fenced": False}
                            for n, (h, p) in sorted(self.nodes.items())]}

    # -- topics admin -------------------------------------------------------------------

    def _remember_deleted(self, name: str) -> None:
        now = trio.current_time()
        self.deleted.pop(name, None)  # (kept in the order deleted: the oldest first)
        self.deleted[name] = now
        while self.deleted and (len(self.deleted) > MAX_DELETED_REMEMBERED or
                                now - next(iter(self.deleted.values())) > DELETED_GRACE_S):
            del self.deleted[next(iter(self.deleted))]

    def _deleted_lately(self, name: str) -> bool:
        at = self.deleted.get(name)
        return at is not None and trio.current_time() - at <= DELETED_GRACE_S

    async def delete_topics(self, conn: _Conn, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
        out = []
        for name in body["topic_names"]:
            count = await self.partition_count(name) if valid_topic_name(name) else None
            if count is None:
                out.append({"name": name, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
                continue
            await self.topic_store.delete(name)
            self._remember_deleted(name)
            self.topics.pop(name, None)
            await self.txn.forget_topic(name)
            await self.share.forget_topic(name)
            for p in range(count):
                part = self.partitions.pop((name, p), None)
                if part is not None:
                    await part.release()
                await _delete_log(self.client, log_name(name, p))
            log.info("kafka_topic_deleted", extra=fields(topic=name, partitions=count))
            out.append({"name": name, "error_code": 0})
        return {"responses": out}

    # -- SASL ---------------------------------------------------------------------------

    def _mechanisms(self) -> list[str]:
        """The SASL mechanisms offered: PLAIN with a principals file, and SCRAM's."""
        return (["PLAIN"] if self.tokens is not None else []) + list(self.scram_mechanisms)

    async def sasl_handshake(self, conn: _Conn, version: int, body: dict[str, Any],
                             ) -> dict[str, Any]:
        offered = self._mechanisms()
        if body["mechanism"] not in offered:
            return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                    "mechanisms": offered}
        conn.sasl_mechanism = body["mechanism"]
        conn.scram = None
        return {"error_code": 0, "mechanisms": offered}

    async def _failed_authentication(self) -> None:
        """Wait ``gateway_connection_failed_authentication_delay_ms`` before a refusal
        is told (Kafka's connection.failed.authentication.delay.ms)."""
        await trio.sleep(self.config.gateway_connection_failed_authentication_delay_ms / 1000)

    async def sasl_authenticate(self, conn: _Conn, version: int, body: dict[str, Any],
                                ) -> dict[str, Any]:
        reply = await self._sasl_authenticate(conn, body)
        if reply["error_code"] == ErrorCode.SASL_AUTHENTICATION_FAILED:
            await self._failed_authentication()
        return reply

    async def _sasl_authenticate(self, conn: _Conn, body: dict[str, Any]) -> dict[str, Any]:
        if conn.sasl_mechanism.startswith("SCRAM-"):
            return await self._scram_authenticate(conn, body["auth_bytes"])
        if self.tokens is None or conn.sasl_mechanism != "PLAIN":
            return {"error_code": ErrorCode.ILLEGAL_SASL_STATE,
                    "error_message": "SaslHandshake with a mechanism offered first"}
        principal = _plain_check(self.tokens, body["auth_bytes"])
        if principal is None:
            return self._auth_failed(conn, "Authentication failed: invalid user name or "
                                           "password")
        return self._authenticated(conn, principal, {"error_code": 0, "error_message": None})

    def _authenticated(self, conn: _Conn, principal: Principal, reply: dict[str, Any],
                       mechanism: str = "PLAIN") -> dict[str, Any]:
        """``conn`` proved to be ``principal``: the reply, with how long that lasts
        (KIP-368's session_lifetime_ms). Authenticating again keeps the principal, as
        Kafka's re-authentication does; another is refused."""
        if conn.authenticated and conn.principal.name != principal.name:
            return self._auth_failed(conn, f"Cannot change principals during "
                                           f"re-authentication from {conn.principal.name} "
                                           f"to {principal.name}")
        again = conn.authenticated
        conn.principal = principal
        lifetime = self.config.gateway_connections_max_reauth_ms
        conn.auth_until = trio.current_time() + lifetime / 1000 if lifetime > 0 else None
        reply["session_lifetime_ms"] = lifetime
        log.info("kafka_authenticated", extra=fields(
            peer=conn.peer, principal=principal.name, mechanism=mechanism, again=again))
        return reply

    def _auth_failed(self, conn: _Conn, message: str) -> dict[str, Any]:
        self.metrics.auth_failures += 1
        log.warning("kafka_sasl_failed", extra=fields(peer=conn.peer))
        # a failed re-authentication ends the earlier one too (Kafka closes the
        # connection): the next request but a SASL one closes it
        conn.principal = ANONYMOUS
        conn.auth_until = None
        return {"error_code": ErrorCode.SASL_AUTHENTICATION_FAILED, "error_message": message}

    async def _scram_authenticate(self, conn: _Conn, auth: bytes) -> dict[str, Any]:
        mech = Mechanism.from_sasl_name(conn.sasl_mechanism)
        assert mech is not None
        failed = (f"Authentication failed during authentication due to invalid "
                  f"credentials with SASL mechanism {mech.sasl_name}")
        if conn.scram is None:
            creds = await self._scram_credentials()
            conn.scram = ScramServer(
                mech, lambda name: creds.get(name, {}).get(int(mech)),
                fake_secret=self._scram_fake_secret)
        try:
            reply = conn.scram.step(auth)
        except ScramError as e:
            conn.scram, conn.sasl_mechanism = None, ""
            # the same message for an unknown user and a wrong password
            return {**self._auth_failed(conn, failed), "auth_bytes": f"e={e}".encode()}
        if conn.scram.done:
            assert conn.scram.user is not None
            name = conn.scram.user
            conn.scram, conn.sasl_mechanism = None, ""
            roles = {"client"} | ({"admin"} if f"User:{name}" in self._super_users else set())
            return self._authenticated(
                conn, Principal(name, frozenset(roles), authenticated=True),
                {"error_code": 0, "error_message": None, "auth_bytes": reply},
                mechanism=mech.sasl_name)
        return {"error_code": 0, "error_message": None, "auth_bytes": reply}

    async def _scram_credentials(self) -> Credentials:
        """The stored credentials, read again when a second old (or changed here):
        logins, which anyone may attempt, cost ZooKeeper at most one read a second."""
        now = trio.current_time()
        if self._scram_cache is None or now - self._scram_cache[0] >= SCRAM_TTL_S:
            self._scram_cache = (now, await self.scram_store.credentials())
        return self._scram_cache[1]

    # -- SCRAM credentials (scram_admin.py) -----------------------------------------------

    async def describe_scram(self, conn: _Conn, version: int, body: dict[str, Any],
                             ) -> dict[str, Any]:
        return scram_admin.describe(body, await self.scram_store.credentials())

    async def alter_scram(self, conn: _Conn, version: int, body: dict[str, Any],
                          ) -> dict[str, Any]:
        try:
            results = await scram_admin.alter_stored(self.scram_store, body)
        finally:
            self._scram_cache = None  # this gateway's logins see the change at once
        log.info("kafka_scram_altered", extra=fields(
            peer=conn.peer, principal=conn.principal.name,
            users=",".join(r["user"] for r in results if not r["error_code"]) or "-"))
        return {"results": results}


async def _delete_log(client: Client, name: str) -> None:
    try:
        record, _ = await client.logs.store.get(name)
    except NoNodeError:
        return
    await client.logs.store.delete(name)
    for lid in record.all_ledgers():  # those whose deletion was deferred too
        try:
            await client.delete_ledger(lid)
        except LedgerdError:
            pass


def _advertised() -> list[dict[str, int]]:
    return [{"api_key": int(k), "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(SUPPORTED.items())]


_DENIALS = {ApiKey.CREATE_TOPICS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ApiKey.DELETE_TOPICS: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ApiKey.DELETE_GROUPS: ErrorCode.GROUP_AUTHORIZATION_FAILED,
            ApiKey.OFFSET_DELETE: ErrorCode.GROUP_AUTHORIZATION_FAILED,
            ApiKey.ALTER_CONFIGS: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ApiKey.CREATE_PARTITIONS: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ApiKey.DELETE_RECORDS: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
            ApiKey.CREATE_ACLS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ApiKey.DELETE_ACLS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ApiKey.DESCRIBE_ACLS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: ErrorCode.CLUSTER_AUTHORIZATION_FAILED}


def _denied(api: ApiKey, body: dict[str, Any]) -> dict[str, Any]:
    """The reply to a request the principal's roles do not allow (the APIs of
    ``_DENIALS``; others are closed)."""
    reply = refusal(api, body, _DENIALS[api])
    if api is ApiKey.CREATE_TOPICS:
        for t in reply["topics"]:
            t["error_message"] = "creating topics needs the admin role"
    return reply


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


async def _wait_any(events: list[trio.Event], until: float) -> None:
    with trio.move_on_at(until):
        async with trio.open_nursery() as nursery:
            async def one(ev: trio.Event) -> None:
                await ev.wait()
                nursery.cancel_scope.cancel()
            for ev in events:
                nursery.start_soon(one, ev)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _client_host(peer: str) -> str:
    """A member's host as Kafka's DescribeGroups writes it: ``/<address>``."""
    return "/" + peer.rsplit(":", 1)[0]


def _peer(stream: trio.abc.Stream) -> str:
    inner: Any = getattr(stream, "transport_stream", stream)
    try:
        host, port = inner.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError):
        return "?"


async def serve_gateway(client: Client, config: GatewayConfig, *,
                        task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED,
                        ) -> None:
    """Run a gateway on ``client``'s cluster until cancelled; ``started(gateway)``."""
    gw = Gateway(client, config)
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        task_status.started(gw)



@dataclass(frozen=True, slots=True)
class _Refusal:
    """A partition's produce refused with a message and KIP-467 record errors (v8+)."""

    code: int
    message: str
    record_errors: list[dict[str, Any]]


def _keyless_refusal(topic: str, partition: int, keyless: list[int]) -> _Refusal:
    """A compacted topic's answer to records without a key, Kafka's words: the whole
    batch is refused (nothing written), each keyless record named by its index."""
    why = ("Compacted topic cannot accept message without key in topic partition "
           f"{topic}-{partition}.")
    return _Refusal(ErrorCode.INVALID_RECORD, why,
                    [{"batch_index": i, "batch_index_error_message": why} for i in keyless])
