"""Kafka topic records: ``<root>/kafka/topics/<topic>``, changed by compare-and-set.

JSON ``{"format": 1, "partitions": N, "configs": {name: value}, "log_start":
{"<partition>": offset}, "replicas": [[broker, ...], ...]}``; only ``partitions`` is
required, and a document without ``format`` is format 1 (records written before
configs existed hold only ``partitions``).

- ``configs``: the topic configs set on it (``ledgerd/kafka/topic_configs.py``),
  validated before they are written.
- ``log_start``: a partition's low watermark moved by DeleteRecords, the Kafka offset
  below which nothing is served (the ledgers wholly before it are then dropped; the
  batch holding it stays, and a consumer skips the records before it, as with any
  fetch from inside a batch).
- ``topic_id``: the topic's Kafka id (Metadata v10+, Fetch v13+), a random UUID as 32
  lowercase hex digits, given when the gateway creates the topic; a record from before
  ids exist has none (``""``) until it is first asked for, then gets one by
  compare-and-set (``ledgerd/kafka/topics.py``), so every gateway answers the same. A
  topic deleted and created again has a new id, as in Kafka.
- ``replicas``: a replica assignment given at creation, recorded as asked; it places
  nothing (a partition's data is on its ledgers' bookie ensembles, its leader is
  chosen by rendezvous hashing over the live gateways).

A partition log's ledgers carry their topic in their log header's extra field
(``TopicOrigin``: the topic's name, the partition, and this record as it was when the
ledger was made), so ``metadata rebuild`` can make the record again without a snapshot.

Every change is a compare-and-set on the record (:meth:`TopicStore.update`), so a
partition count that grows, a config change and a low watermark that moves, from any
gateway, never undo each other. The gateway caches records (``ledgerd/kafka/topics.py``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from ledgerd.metadata.errors import CorruptMetadataError, NoNodeError, UnknownFormatError
from ledgerd.metadata.jsondoc import (
    COUNT,
    INT_LISTS,
    INT_MAP,
    STR,
    STR_MAP,
    Codec,
    decode,
    encode,
    json_field,
)
from ledgerd.metadata.logheader import MAX_EXTRA
from ledgerd.metadata.paths import KAFKA_TOPICS, kafka_topic_path

if TYPE_CHECKING:  # the records are pure (``metadata.rebuild`` plans with them)
    from ledgerd.metadata.store import MetadataStore

__all__ = ["TopicOrigin", "TopicRecord", "TopicStore", "new_topic_id",
           "origin_record", "partition_log_name", "topic_origin"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicRecord:
    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = 1

    partitions: int = json_field("partitions", COUNT)
    configs: Mapping[str, str] = json_field("configs", STR_MAP, default_factory=dict,
                                            omit_default=True)
    log_start: Mapping[int, int] = json_field("log_start", INT_MAP, default_factory=dict,
                                              omit_default=True)
    replicas: tuple[tuple[int, ...], ...] = json_field("replicas", INT_LISTS, default=(),
                                                       omit_default=True)
    topic_id: str = json_field("topic_id", STR, default="", omit_default=True)  # "": none yet

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {self.partitions!r}")
        if self.topic_id and (len(self.topic_id) != 32 or
                              self.topic_id.strip("0123456789abcdef")):
            raise ValueError(f"topic_id must be 32 lowercase hex digits, got "
                             f"{self.topic_id!r}")

    def start_of(self, partition: int) -> int:
        """The partition's low watermark set by DeleteRecords (0: none)."""
        return self.log_start.get(partition, 0)

    def with_start(self, partition: int, offset: int) -> TopicRecord:
        if offset <= self.start_of(partition):
            return self
        return replace(self, log_start={**self.log_start, partition: offset})

    def to_json(self) -> bytes:
        return encode(self)

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> TopicRecord:
        return decode(cls, raw, path)


def _record_doc(value: object) -> TopicRecord:
    if not isinstance(value, dict):
        raise TypeError(f"expected a topic record, got {value!r}")
    try:
        return decode(TopicRecord, json.dumps(value).encode(), "record")
    except (CorruptMetadataError, UnknownFormatError) as exc:
        raise ValueError(str(exc)) from exc


TOPIC_RECORD: Codec[TopicRecord] = Codec(lambda r: json.loads(encode(r)), _record_doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicOrigin:
    """A Kafka partition log's topic, as each of its ledgers' log headers carries it
    (``extra``): the topic's name, the partition, and the topic record as it was when
    the ledger was made (configs changed later are not in it)."""

    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = None

    topic: str = json_field("kafka_topic", STR)
    partition: int = json_field("partition", COUNT)
    record: TopicRecord = json_field("record", TOPIC_RECORD)  # noqa: RUF009 (frozen)

    def to_json(self) -> bytes:
        return encode(self)

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> TopicOrigin:
        return decode(cls, raw, path)

    @classmethod
    def from_extra(cls, extra: bytes) -> TopicOrigin | None:
        """The origin a log header's ``extra`` holds (None: none, or not one)."""
        if not extra.startswith(b"{"):
            return None
        try:
            return cls.from_json(extra, "log header")
        except (CorruptMetadataError, UnknownFormatError):
            return None


def partition_log_name(topic: str, partition: int) -> str:
    """The log holding a partition's batches: ``kafka.<topic>.<partition>``."""
    return f"kafka.{topic}.{partition}"


def origin_record(record: TopicRecord, partition: int) -> TopicRecord:
    """What of ``record`` a ledger header of ``partition`` carries: everything but the
    replica assignment (informational here: the gateways place no replicas) and the
    other partitions' DeleteRecords low watermarks (each partition's own headers carry
    its own), so its size does not grow with the partition count."""
    start = record.start_of(partition)
    return replace(record, replicas=(), log_start={partition: start} if start else {})


def topic_origin(topic: str, partition: int, record: TopicRecord) -> bytes:
    """The ``TopicOrigin`` a partition log's ledger header carries (its ``extra``): the
    topic's :func:`origin_record`; its configs left out if they would not fit
    (``logheader.MAX_EXTRA``), and nothing (b"") if even that would not (a header never
    fails a writer's roll: the topic then comes back only from a snapshot)."""
    kept = origin_record(record, partition)
    raw = TopicOrigin(topic=topic, partition=partition, record=kept).to_json()
    if len(raw) > MAX_EXTRA:
        raw = TopicOrigin(topic=topic, partition=partition,
                          record=replace(kept, configs={})).to_json()
    return raw if len(raw) <= MAX_EXTRA else b""


def new_topic_id() -> str:
    """A fresh topic id for a record (a random UUID, as Kafka makes them)."""
    return uuid.uuid4().hex


class TopicStore:
    """The topic records under ``<kafka root>/topics``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.kafka_root = kafka_root

    def path(self, topic: str) -> str:
        return kafka_topic_path(self.kafka_root, topic)

    async def get(self, topic: str) -> TopicRecord | None:
        """The topic's record (None: no such topic)."""
        path = self.path(topic)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        return TopicRecord.from_json(raw, path)

    async def names(self) -> list[str]:
        try:
            return sorted(await self.store.children(f"{self.kafka_root}/{KAFKA_TOPICS}"))
        except NoNodeError:
            return []

    async def create(self, topic: str, record: TopicRecord) -> None:
        """Raises NodeExistsError if the topic exists."""
        await self.store.create(self.path(topic), record.to_json(), make_parents=True)

    async def update(self, topic: str,
                     change: Callable[[TopicRecord], TopicRecord]) -> TopicRecord:
        """Apply ``change`` by compare-and-set; raises NoNodeError if the topic is gone
        and whatever ``change`` raises (nothing written then). If cancelled, the change
        may or may not have been written."""
        from ledgerd.metadata.cas import cas_update

        record, _ = await cas_update(self.store, self.path(topic), change,
                                     decode=TopicRecord.from_json,
                                     encode=TopicRecord.to_json)
        return record

    async def delete(self, topic: str) -> None:
        """Raises NoNodeError if there is no such topic."""
        await self.store.delete(self.path(topic))
