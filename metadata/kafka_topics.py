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

Every change is a compare-and-set on the record (:meth:`TopicStore.update`), so a
partition count that grows, a config change and a low watermark that moves, from any
gateway, never undo each other. The gateway caches records (``ledgerd/kafka/topics.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.jsondoc import (
    COUNT,
    INT_LISTS,
    INT_MAP,
    STR,
    STR_MAP,
    decode,
    encode,
    json_field,
)
from ledgerd.metadata.paths import KAFKA_TOPICS, kafka_topic_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["TopicRecord", "TopicStore", "new_topic_id"]


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
        record, _ = await cas_update(self.store, self.path(topic), change,
                                     decode=TopicRecord.from_json,
                                     encode=TopicRecord.to_json)
        return record

    async def delete(self, topic: str) -> None:
        """Raises NoNodeError if there is no such topic."""
        await self.store.delete(self.path(topic))
