"""Hanging-transaction tooling (KIP-664): ListTransactions, DescribeTransactions and
DescribeProducers, as ``kafka-transactions.sh`` and kafka-python 3's KafkaAdminClient
(``list_transactions``, ``describe_transactions``, ``describe_producers``,
``find_hanging_transactions``) ask them. The fourth API of the tooling, the abort, is
WriteTxnMarkers (``transactions.py``).

- ListTransactions: each gateway lists the transactional ids it coordinates (as each
  Kafka broker lists those of its ``__transaction_state`` partitions; clients ask every
  broker and merge), from their ZooKeeper records (``metadata.kafka_txns``), read
  ``TXN_ADMIN_READS`` at a time, filtered as Kafka's
  ``TransactionStateManager.listTransactionStates`` filters: by state (a name Kafka does
  not know is answered in UnknownStateFilters; a known one matches only its state), by
  producer id, by duration (v1: only transactions whose start is more than that long
  ago) and by a regular expression the whole id must match (v2, KIP-1152; one that
  does not compile is refused INVALID_REQUEST). Only the ids the principal may
  DESCRIBE are listed.
- DescribeTransactions: per id, NOT_COORDINATOR if another gateway coordinates it (the
  client asks FindCoordinator), TRANSACTIONAL_ID_NOT_FOUND if it has no record, else
  its state, timeout, start time, producer id and epoch and the partitions of the open
  transaction grouped by topic (the record forgets them when the transaction completes,
  as Kafka does; a PREPARE_* record lists them all, markers written or not).
- DescribeProducers: per partition, answered by its leader only (NOT_LEADER_OR_FOLLOWER
  elsewhere): the producers the partition's writer remembers (``producer_state.py``:
  epoch, last sequence, and LastTimestamp, the max timestamp of its last batch; the
  coordinator epoch is -1: ledgerd has none) and, for each producer with a transaction open in the
  partition (its ``control_records.TxnIndex``), CurrentTxnStartOffset, its first
  offset; such a producer is listed even if the sequence memory forgot it (its epoch
  then read from that first batch).

The filters and groupings are pure functions (``list_filter``, ``describe_record``,
``grouped``, ``active_producers``); the handlers do the reads.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ledgerd.base.fanout import each_at_most
from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError
from ledgerd.kafka.acls import Resource
from ledgerd.kafka.api import ErrorCode
from ledgerd.kafka.producer_state import ProducerState
from ledgerd.kafka.storage_errors import storage_error_code
from ledgerd.kafka.topics import valid_topic_name
from ledgerd.metadata.errors import MetadataError
from ledgerd.metadata.kafka_acls import AclOperation, ResourceType
from ledgerd.metadata.kafka_txns import TxnRecord, TxnState
from ledgerd.wire.status import FencedError

if TYPE_CHECKING:
    from ledgerd.kafka.gateway import Gateway

__all__ = ["KAFKA_STATES", "TXN_ADMIN_READS", "ListFilter", "active_producers",
           "describe_producers", "describe_record", "describe_transactions", "grouped",
           "list_filter", "list_transactions"]

log = logging.getLogger(__name__)

TXN_ADMIN_READS = 32  # records (or partitions) one request reads at once (as OffsetFetch)

# every state name Kafka's coordinator knows (TransactionState.fromName): a filter
# naming one of them is a known filter even where ledgerd has no such state (Dead,
# PrepareEpochFence: it matches nothing); any other name is an unknown filter
KAFKA_STATES = frozenset({*(s.value for s in TxnState), "Dead", "PrepareEpochFence"})


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class ListFilter:
    """ListTransactions' filters, parsed (``list_filter``)."""

    states: frozenset[str]  # known state names (empty: every state)
    unknown_states: tuple[str, ...]  # answered in UnknownStateFilters
    producer_ids: frozenset[int]  # empty: every producer id
    duration_ms: int  # < 0: no duration filter
    pattern: re.Pattern[str] | None

    def includes(self, record: TxnRecord, now_ms: int) -> bool:
        """Kafka's rule (``listTransactionStates``): every filter given must match."""
        if self.producer_ids and record.producer_id not in self.producer_ids:
            return False
        if self.states and record.state.value not in self.states:
            return False
        if self.duration_ms >= 0 and now_ms - record.started_ms <= self.duration_ms:
            return False
        return self.pattern is None or self.pattern.fullmatch(record.transactional_id) \
            is not None


def list_filter(body: Mapping[str, Any]) -> ListFilter:
    """The filters of a ListTransactions request (any version: absent ones are off).
    Raises ``re.error`` for a TransactionalIdPattern that does not compile."""
    states = list(dict.fromkeys(body["state_filters"]))
    raw = body.get("transactional_id_pattern")
    return ListFilter(
        states=frozenset(s for s in states if s in KAFKA_STATES),
        unknown_states=tuple(s for s in states if s not in KAFKA_STATES),
        producer_ids=frozenset(body["producer_id_filters"]),
        duration_ms=body.get("duration_filter", -1),
        pattern=re.compile(raw) if raw else None)


def grouped(partitions: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """Partitions grouped by topic, in the order first named (DescribeTransactions'
    Topics)."""
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        wanted = by_topic.setdefault(topic, [])
        if p not in wanted:
            wanted.append(p)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def describe_record(transactional_id: str, record: TxnRecord | None, *,
                    coordinates: bool) -> dict[str, Any]:
    """DescribeTransactions' answer for one id: NOT_COORDINATOR if this gateway does
    not coordinate it, TRANSACTIONAL_ID_NOT_FOUND without a record, else the record."""
    if not coordinates:
        return {"error_code": ErrorCode.NOT_COORDINATOR, "transactional_id": transactional_id}
    if record is None:
        return {"error_code": ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                "transactional_id": transactional_id}
    return {"error_code": 0, "transactional_id": transactional_id,
            "transaction_state": record.state.value,
            "transaction_timeout_ms": record.timeout_ms,
            "transaction_start_time_ms": record.started_ms,
            "producer_id": record.producer_id, "producer_epoch": record.producer_epoch,
            "topics": grouped(record.partitions)}


def active_producers(producers: ProducerState, ongoing: Mapping[int, int],
                     epochs: Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """DescribeProducers' ActiveProducers of one partition: every producer its writer
    remembers, then those with a transaction open (``ongoing``: producer id -> first
    offset of it) that it forgot (``epochs``: their epochs where known, else -1)."""
    out = []
    for pid in producers:
        latest = producers.latest(pid)
        if latest is None:
            continue
        epoch, last, _ = latest
        out.append({"producer_id": pid, "producer_epoch": epoch, "last_sequence": last,
                    "last_timestamp": producers.last_timestamp(pid), "coordinator_epoch": -1,
                    "current_txn_start_offset": ongoing.get(pid, -1)})
    for pid, first in ongoing.items():
        if pid not in producers:
            out.append({"producer_id": pid, "producer_epoch": (epochs or {}).get(pid, -1),
                        "last_sequence": -1, "last_timestamp": -1, "coordinator_epoch": -1,
                        "current_txn_start_offset": first})
    return out


# -- handlers ---------------------------------------------------------------------------

async def _read_records(gw: Gateway) -> list[TxnRecord]:
    """The records of the transactional ids this gateway coordinates, read
    ``TXN_ADMIN_READS`` at a time (a hashed znode name is read to learn its id)."""
    store = gw.txn.records
    names = [n for n in await store.names() if n.startswith("x-") or gw.txn.owns(n)]
    found: list[TxnRecord] = []

    async def read(name: str) -> None:
        record = await store.get_named(name)
        if record is not None and gw.txn.owns(record.transactional_id):
            found.append(gw.txn.current(record))

    await each_at_most(TXN_ADMIN_READS, read, names)
    return sorted(found, key=lambda r: r.transactional_id)


async def list_transactions(gw: Gateway, conn: Any, version: int, body: dict[str, Any],
                            ) -> dict[str, Any]:
    try:
        wanted = list_filter(body)
    except re.error as exc:
        log.info("kafka_list_transactions_refused", extra=fields(
            pattern=body.get("transactional_id_pattern"), error=str(exc)))
        return {"error_code": ErrorCode.INVALID_REQUEST}
    try:
        records = await _read_records(gw)
    except MetadataError as exc:
        log.warning("kafka_list_transactions_failed", extra=fields(error=repr(exc)))
        return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE}
    now = _now_ms()
    listed = [r for r in records if wanted.includes(r, now)]
    if not (await gw.acls.current()).is_open:  # Kafka: DESCRIBE on each id, no bypass
        allowed = gw.acls.allows(conn)
        listed = [r for r in listed if allowed(
            AclOperation.DESCRIBE, Resource(ResourceType.TRANSACTIONAL_ID, r.transactional_id))]
    return {"error_code": 0, "unknown_state_filters": list(wanted.unknown_states),
            "transaction_states": [{"transactional_id": r.transactional_id,
                                    "producer_id": r.producer_id,
                                    "transaction_state": r.state.value} for r in listed]}


async def describe_transactions(gw: Gateway, conn: Any, version: int, body: dict[str, Any],
                                ) -> dict[str, Any]:
    ids = body["transactional_ids"]
    out: list[dict[str, Any]] = [{} for _ in ids]

    async def one(at: tuple[int, str]) -> None:
        i, tid = at
        coordinates = gw.txn.owns(tid)
        record = None
        if coordinates and tid:
            try:
                record = await gw.txn.get(tid)
                record = None if record is None else gw.txn.current(record)
            except MetadataError as exc:
                log.warning("kafka_describe_transaction_failed", extra=fields(
                    transactional_id=tid, error=repr(exc)))
                out[i] = {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                          "transactional_id": tid}
                return
        out[i] = describe_record(tid, record, coordinates=coordinates)

    await each_at_most(TXN_ADMIN_READS, one, enumerate(ids))
    return {"transaction_states": out}


async def _partition_producers(gw: Gateway, topic: str, p: int) -> dict[str, Any]:
    res: dict[str, Any] = {"partition_index": p, "error_code": 0, "error_message": None,
                           "active_producers": []}
    count = await gw.partition_count(topic) if valid_topic_name(topic) else None
    if count is None or not 0 <= p < count:
        res["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return res
    if not await gw.may_lead(f"{topic}/{p}"):
        res["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
        return res
    part = gw.partition(topic, p)
    try:
        _, index = await part.stable_view(await part.high_watermark())
        ongoing = dict(index.ongoing) if index is not None else {}
        epochs: dict[int, int] = {}
        for pid, first in ongoing.items():
            if pid in part.producers:
                continue
            verified = part.txn_verified.get(pid)
            if verified is not None:
                epochs[pid] = verified
                continue
            lid, eid = await part.locate(first)
            epochs[pid] = (await part.batch_header(lid, eid)).producer_epoch
        res["active_producers"] = active_producers(part.producers, ongoing, epochs)
    except (LedgerdError, FencedError) as exc:
        res["error_code"] = storage_error_code(exc)
        res["error_message"] = str(exc)
    return res


async def describe_producers(gw: Gateway, conn: Any, version: int, body: dict[str, Any],
                             ) -> dict[str, Any]:
    topics: list[dict[str, Any]] = []
    limit = trio.Semaphore(TXN_ADMIN_READS)

    async def one(into: list[dict[str, Any]], i: int, topic: str, p: int) -> None:
        async with limit:
            into[i] = await _partition_producers(gw, topic, p)

    async with trio.open_nursery() as nursery:
        for t in body["topics"]:
            parts: list[dict[str, Any]] = [{} for _ in t["partition_indexes"]]
            topics.append({"name": t["name"], "partitions": parts})
            for i, p in enumerate(t["partition_indexes"]):
                nursery.start_soon(one, parts, i, t["name"], p)
    return {"topics": topics}
