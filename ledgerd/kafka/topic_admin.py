"""The topic administration APIs: CreateTopics (with configs and replica assignments),
CreatePartitions, DeleteRecords, DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs.

Each handler takes the gateway and a decoded request and returns the response body;
the decisions are :mod:`ledgerd.kafka.topic_configs`' (which configs, which values),
``retention``'s (which ledgers go) and the checks below; the state is the topic
record (``topics.py``), changed by compare-and-set.

- CreateTopics validates every config first (an unknown or unhonoured one refuses the
  topic, naming it, and nothing is created) and honours ``validate_only``. A replica
  assignment (one broker list per partition, instead of a count) is accepted when it
  names live gateways, each list without repeats, and is recorded as given: the
  brokers of a Kafka assignment are the gateways, but a gateway holds no replica (the
  partition's data is on its ledgers' bookies) and the partition's leader is the
  gateway rendezvous hashing picks, so the assignment places nothing.
- CreatePartitions grows a topic (the new partitions' logs start empty); asking for
  fewer or as many partitions as the topic has gets INVALID_PARTITIONS naming both
  counts.
- DeleteRecords moves a partition's low watermark (the partition's leader only, as
  in Kafka): it is written to the topic record, Fetch and ListOffsets (earliest) follow
  it at once on this gateway and within ``topics.TTL_S`` on the others, and the
  ledgers wholly before it are dropped (or at the next retention round, if one is
  still open).
- DescribeConfigs answers a topic's configs (every one the gateway knows: set on the
  topic, set by a dynamic broker config, or default) and a broker's (this gateway's
  settings under Kafka's names, read-only, and the dynamic broker configs).
  AlterConfigs replaces a topic's set configs; IncrementalAlterConfigs applies SET,
  DELETE, APPEND and SUBTRACT; both honour ``validate_only``. On resource BROKER they
  change the dynamic broker configs (``broker_configs.py``) of this gateway (name
  ``"<id>"``, as Kafka's brokers take only their own) or of every gateway (name
  ``""``); every gateway reads them within ``topics.TTL_S``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError
from ledgerd.kafka import retention, share_configs
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.broker_configs import (
    broker_altered,
    broker_entries,
    broker_incrementally_altered,
    effective_topic_configs,
    topic_defaults,
)
from ledgerd.kafka.topic_configs import (
    ConfigRefusedError,
    ResourceType,
    altered,
    incrementally_altered,
    topic_entries,
)
from ledgerd.kafka.topics import INTERNAL_TOPICS, NAME_RULE, TTL_S, valid_topic_name
from ledgerd.metadata.errors import (
    ChangeRejectedError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
)
from ledgerd.metadata.kafka_broker_configs import BrokerConfigRecord, BrokerConfigStore
from ledgerd.metadata.kafka_topics import TopicRecord
from ledgerd.metadata.store import MetadataStore

if TYPE_CHECKING:
    from ledgerd.kafka.gateway import Gateway

__all__ = ["alter_configs", "create_partitions", "create_topics", "delete_records",
           "describe_configs", "incremental_alter_configs"]

log = logging.getLogger(__name__)

MAX_PARTITIONS = 10000


class _Refused(ChangeRejectedError):
    """A CAS change that no longer applies (carries the Kafka error to answer)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(message)


def _assignment_error(gw: Gateway, lists: list[list[int]]) -> str | None:
    """Why a replica assignment cannot be taken (None: it can)."""
    for i, brokers in enumerate(lists):
        if not brokers:
            return f"partition {i}: an empty replica list"
        if len(set(brokers)) != len(brokers):
            return f"partition {i}: broker repeated in {brokers}"
        unknown = sorted(set(brokers) - set(gw.nodes))
        if unknown:
            return f"partition {i}: no live gateway (broker) {unknown}; live: " \
                   f"{sorted(gw.nodes)}"
    return None


async def create_topics(gw: Gateway, conn: object, version: int, body: dict[str, Any],
                        ) -> dict[str, Any]:
    out = []
    for t in body["topics"]:
        name, n = t["name"], t["num_partitions"]
        res: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
        out.append(res)
        replicas: tuple[tuple[int, ...], ...] = ()
        try:
            if not valid_topic_name(name):
                raise ConfigRefusedError(ErrorCode.INVALID_TOPIC_EXCEPTION, NAME_RULE)
            if name in INTERNAL_TOPICS:
                raise ConfigRefusedError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"{name} is Kafka's internal topic, which clients do not create (the "
                    "gateway keeps offsets and transactions in ZooKeeper)")
            if t["assignments"]:
                if n != -1 or t["replication_factor"] != -1:
                    raise ConfigRefusedError(
                        ErrorCode.INVALID_REQUEST, "a replica assignment comes without a "
                        "partition count and replication factor (both -1)")
                by_index = {a["partition_index"]: list(a["broker_ids"])
                            for a in t["assignments"]}
                if sorted(by_index) != list(range(len(t["assignments"]))):
                    raise ConfigRefusedError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"the assignment must number partitions 0-{len(by_index) - 1} "
                        f"once each, got {sorted(by_index)}")
                lists = [by_index[i] for i in range(len(by_index))]
                why = _assignment_error(gw, lists)
                if why is not None:
                    raise ConfigRefusedError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, why)
                n = len(lists)
                replicas = tuple(tuple(b) for b in lists)
            if n == -1:
                n = gw.config.default_partitions
            if not 1 <= n <= MAX_PARTITIONS:
                raise ConfigRefusedError(ErrorCode.INVALID_PARTITIONS,
                                         f"{n} partitions: allowed 1-{MAX_PARTITIONS}")
            configs = altered([(c["name"], c["value"]) for c in t["configs"]],
                              max_batch_bytes=gw.config.max_batch_bytes)
            if await gw.partition_count(name) is not None:
                raise ConfigRefusedError(ErrorCode.TOPIC_ALREADY_EXISTS,
                                         f"topic {name!r} already exists")
            if not body["validate_only"]:
                await gw.create_topic(name, n, configs=configs, replicas=replicas)
        except ConfigRefusedError as exc:
            res.update(error_code=exc.code, error_message=exc.message)
        except NodeExistsError:
            res.update(error_code=ErrorCode.TOPIC_ALREADY_EXISTS,
                       error_message=f"topic {name!r} already exists")
    return {"topics": out}


async def create_partitions(gw: Gateway, conn: object, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
    results = []
    for t in body["topics"]:
        name, count = t["name"], t["count"]
        res: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
        results.append(res)
        record = await gw.topic_store.get(name, fresh=True) if valid_topic_name(name) else None
        try:
            if record is None:
                raise _Refused(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               f"topic {name!r} does not exist")

            def grow(current: TopicRecord, name: str = name, count: int = count,
                     assignments: Any = t["assignments"]) -> TopicRecord:
                if count <= current.partitions:
                    raise _Refused(ErrorCode.INVALID_PARTITIONS,
                                   f"topic {name!r} has {current.partitions} partitions; "
                                   f"asked for {count}: partitions can only be added")
                if count > MAX_PARTITIONS:
                    raise _Refused(ErrorCode.INVALID_PARTITIONS,
                                   f"{count} partitions: allowed 1-{MAX_PARTITIONS}")
                replicas = current.replicas
                if assignments is not None:
                    lists = [list(a["broker_ids"]) for a in assignments]
                    if len(lists) != count - current.partitions:
                        raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                       f"{len(lists)} replica lists for "
                                       f"{count - current.partitions} new partitions")
                    why = _assignment_error(gw, lists)
                    if why is not None:
                        raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT, why)
                    if replicas:
                        replicas = replicas + tuple(tuple(b) for b in lists)
                return replace(current, partitions=count, replicas=replicas)

            if body["validate_only"]:
                grow(record)
                continue
            new = await gw.topic_store.update(name, grow)
            gw.topics[name] = new.partitions
            log.info("kafka_partitions_created", extra=fields(
                topic=name, partitions=new.partitions, before=record.partitions))
        except _Refused as exc:
            res.update(error_code=exc.code, error_message=exc.message)
        except NoNodeError:
            res.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                       error_message=f"topic {name!r} does not exist")
    return {"results": results}


async def delete_records(gw: Gateway, conn: object, version: int, body: dict[str, Any],
                         ) -> dict[str, Any]:
    topics = []
    for t in body["topics"]:
        name = t["name"]
        record = await gw.topic_store.get(name) if valid_topic_name(name) else None
        parts = []
        for pr in t["partitions"]:
            p = pr["partition_index"]
            res: dict[str, Any] = {"partition_index": p, "low_watermark": -1,
                                   "error_code": 0}
            parts.append(res)
            if record is None or not 0 <= p < record.partitions:
                res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if not await gw.may_lead(f"{name}/{p}"):
                res["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            part = gw.partition(name, p)
            try:
                hw = await part.high_watermark()
                offset = hw if pr["offset"] == -1 else pr["offset"]
                if not 0 <= offset <= hw:
                    res.update(error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                               low_watermark=await part.start_offset())
                    continue
                if offset > await part.start_offset():
                    moved = await gw.topic_store.update(
                        name, functools.partial(TopicRecord.with_start, partition=p,
                                                offset=offset))
                    part.floor = max(part.floor, moved.start_of(p))
                    log.info("kafka_records_deleted", extra=fields(
                        topic=name, partition=p, before=offset))
                res["low_watermark"] = await part.start_offset()
            except NoNodeError:
                res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            except LedgerdError as exc:
                res["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
                log.warning("kafka_delete_records_failed", extra=fields(
                    topic=name, partition=p, error=repr(exc)))
                continue
            try:
                await retention.drop_before(
                    gw.client, part, part.floor,
                    delay_ms=gw.topic_policy(name).file_delete_delay_ms)
            except LedgerdError as exc:  # the retention rounds try again
                log.info("kafka_ledgers_not_dropped_yet", extra=fields(
                    topic=name, partition=p, error=repr(exc)))
        topics.append({"name": name, "partitions": parts})
    return {"topics": topics}


def broker_settings(gw: Gateway) -> dict[str, str]:
    """This gateway's settings under Kafka's broker config names (DescribeConfigs)."""
    c = gw.config
    return {
        "broker.id": str(gw.node_id),
        "auto.create.topics.enable": "true" if c.auto_create_topics else "false",
        "num.partitions": str(c.default_partitions),
        "message.max.bytes": str(c.max_batch_bytes),
        "socket.request.max.bytes": str(c.max_request_bytes),
        "log.segment.bytes": str(c.log_roll_bytes),
        "log.retention.ms": "-1",
        "log.retention.bytes": "-1",
        "log.cleanup.policy": "delete",
        "log.message.timestamp.type": "CreateTime",
        "compression.type": "producer",
        "group.initial.rebalance.delay.ms": str(c.group_initial_rebalance_delay_ms),
        "group.min.session.timeout.ms": str(c.group_min_session_timeout_ms),
        "group.max.session.timeout.ms": str(c.group_max_session_timeout_ms),
        "max.connections": str(c.max_connections),
        "connections.max.reauth.ms": str(c.gateway_connections_max_reauth_ms),
        **({"broker.rack": c.gateway_rack} if c.gateway_rack else {}),
        "replica.selector.class": "org.apache.kafka.common.replica.RackAwareReplicaSelector"
        if c.gateway_rack_aware_reads else "",
    }


class BrokerConfigCache:
    """The dynamic broker configs as this gateway last read them (within ``TTL_S``
    while ``run`` runs; at once after a change made through this gateway)."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = BrokerConfigStore(store, kafka_root)
        self.record = BrokerConfigRecord()
        self.version = -1  # the znode version of ``record``

    def keep(self, record: BrokerConfigRecord, version: int) -> None:
        """Take ``record`` unless the one held is newer (a read that began before a
        change this gateway made, and ended after it, does not undo it here)."""
        if version >= self.version:
            self.record, self.version = record, version

    async def refresh(self) -> BrokerConfigRecord:
        try:
            self.keep(*await self.store.get())
        except MetadataError as exc:
            log.warning("kafka_broker_configs_unread", extra=fields(error=str(exc)))
        return self.record

    async def run(self) -> None:
        while True:
            await self.refresh()
            await trio.sleep(TTL_S)

    def topic_configs(self, node_id: int, configs: Mapping[str, str]) -> dict[str, str]:
        """A topic's ``configs`` with the dynamic broker configs' defaults under them."""
        return effective_topic_configs(configs, self.record.default,
                                       self.record.of(node_id))


def _is_this_broker(gw: Gateway, name: str) -> bool:
    return name == str(gw.node_id)


async def describe_configs(gw: Gateway, conn: object, version: int, body: dict[str, Any],
                           ) -> dict[str, Any]:
    results = []
    for r in body["resources"]:
        rtype, name = r["resource_type"], r["resource_name"]
        keys = r["configuration_keys"]  # null: every config; [] none (Kafka's rule)
        res: dict[str, Any] = {"resource_type": rtype, "resource_name": name,
                               "error_code": 0, "error_message": None, "configs": []}
        results.append(res)
        options = {"include_synonyms": body["include_synonyms"],
                   "include_docs": body["include_documentation"]}
        if rtype == ResourceType.TOPIC:
            record = await gw.topic_store.get(name) if valid_topic_name(name) else None
            if record is None:
                res.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                           error_message=f"topic {name!r} does not exist")
                continue
            dynamic = await gw.broker_configs.refresh()
            res["configs"] = topic_entries(
                version, record.configs, keys, max_batch_bytes=gw.config.max_batch_bytes,
                broker_defaults=topic_defaults(dynamic.default, dynamic.of(gw.node_id)),
                static_defaults={"segment.bytes": str(gw.config.log_roll_bytes)}, **options)
        elif rtype == ResourceType.BROKER and (name == "" or _is_this_broker(gw, name)):
            dynamic = await gw.broker_configs.refresh()
            res["configs"] = broker_entries(
                version, broker_settings(gw), dynamic.default,
                None if name == "" else dynamic.of(gw.node_id), keys, **options)
        elif rtype == ResourceType.BROKER:
            res.update(error_code=ErrorCode.INVALID_REQUEST,
                       error_message=f"broker {name!r}: this is gateway {gw.node_id}; ask "
                                     "that broker for its own configs")
        elif rtype == ResourceType.GROUP and name:
            res["configs"] = share_configs.entries(
                await gw.share.configs(name, fresh=True), keys)
        else:
            res.update(error_code=ErrorCode.INVALID_REQUEST,
                       error_message=f"resource type {rtype}: only topics (2), brokers "
                                     "(4) and groups (32) have configs here")
    return {"results": results}


async def _alter_broker(gw: Gateway, name: str, validate_only: bool, change: Any) -> None:
    """Apply ``change(current values) -> new values`` to this gateway's dynamic broker
    configs (``name`` its id) or the cluster-wide default (``name`` "") by CAS. A live
    gateway's own configs change only through it (as Kafka's brokers take only their
    own); those of a gateway that is gone may be deleted through any, so an operator
    can clear what a departed gateway left."""
    other: int | None = None
    if name and not _is_this_broker(gw, name):
        other = int(name) if name.isdigit() else -1
        if other < 0 or other in gw.nodes:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                     f"broker {name!r}: this is gateway {gw.node_id}; a "
                                     "live broker's own configs are changed through that "
                                     "broker")
        given = change

        def change(old: Any) -> Any:
            new = given(old)
            if any(old.get(k) != v for k, v in new.items()):
                raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                         f"broker {name}: not a live gateway; its configs "
                                         "can only be deleted")
            return new
    broker = other if other is not None else (gw.node_id if name else None)
    if validate_only:
        change((await gw.broker_configs.refresh()).of(broker))
        return
    try:
        gw.broker_configs.keep(*await gw.broker_configs.store.update(broker, change))
    except ChangeRejectedError as exc:  # the record's size limit
        raise ConfigRefusedError(ErrorCode.POLICY_VIOLATION, str(exc)) from None
    log.info("kafka_broker_configs_altered", extra=fields(
        broker=name or "default", configs=",".join(
            f"{k}={v}" for k, v in sorted(gw.broker_configs.record.of(broker).items()))
        or "-"))


async def _alter(gw: Gateway, r: dict[str, Any], validate_only: bool,
                 change: Any, broker_change: Any, group_change: Any = None,
                 ) -> dict[str, Any]:
    """Apply ``change(current configs) -> new configs`` to resource ``r`` by CAS
    (``broker_change`` to a broker's dynamic configs, ``group_change`` to a share
    group's: IncrementalAlterConfigs only, as Kafka's)."""
    rtype, name = r["resource_type"], r["resource_name"]
    res: dict[str, Any] = {"resource_type": rtype, "resource_name": name,
                           "error_code": 0, "error_message": None}
    try:
        if rtype == ResourceType.BROKER:
            await _alter_broker(gw, name, validate_only, broker_change)
            return res
        if rtype == ResourceType.GROUP and group_change is not None and name:
            try:
                await gw.share.alter_configs(name, group_change, validate_only)
            except share_configs.ShareConfigError as exc:
                raise ConfigRefusedError(exc.code, exc.message) from None
            return res
        if rtype != ResourceType.TOPIC:
            raise ConfigRefusedError(ErrorCode.INVALID_REQUEST,
                                     f"resource type {rtype}: only topic, broker and group "
                                     "configs change")
        record = await gw.topic_store.get(name, fresh=True) if valid_topic_name(name) else None
        if record is None:
            raise ConfigRefusedError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                     f"topic {name!r} does not exist")
        if validate_only:
            change(record.configs)
        else:
            await gw.topic_store.update(
                name, lambda cur: replace(cur, configs=change(cur.configs)))
            log.info("kafka_topic_configs_altered", extra=fields(topic=name))
    except ConfigRefusedError as exc:
        res.update(error_code=exc.code, error_message=exc.message)
    except NoNodeError:
        res.update(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                   error_message=f"topic {name!r} does not exist")
    return res


async def alter_configs(gw: Gateway, conn: object, version: int, body: dict[str, Any],
                        ) -> dict[str, Any]:
    limit = gw.config.max_batch_bytes
    out = []
    for r in body["resources"]:
        pairs = [(c["name"], c["value"]) for c in r["configs"]]
        out.append(await _alter(gw, r, body["validate_only"],
                                lambda _cur, pairs=pairs: altered(
                                    pairs, max_batch_bytes=limit, last_wins=True),
                                lambda _cur, pairs=pairs: broker_altered(
                                    pairs, broker_settings(gw), max_batch_bytes=limit)))
    return {"responses": out}


async def incremental_alter_configs(gw: Gateway, conn: object, version: int,
                                    body: dict[str, Any]) -> dict[str, Any]:
    limit = gw.config.max_batch_bytes
    out = []
    for r in body["resources"]:
        ops = [(c["name"], c["config_operation"], c["value"]) for c in r["configs"]]
        out.append(await _alter(gw, r, body["validate_only"],
                                lambda cur, ops=ops: incrementally_altered(
                                    cur, ops, max_batch_bytes=limit),
                                lambda cur, ops=ops: broker_incrementally_altered(
                                    cur, ops, broker_settings(gw), max_batch_bytes=limit),
                                lambda cur, ops=ops: share_configs.altered(cur, ops)))
    return {"responses": out}
