"""Topic records: ``<root>/kafka/topics/<topic>`` in ZooKeeper, changed by CAS.

JSON ``{"format": 1, "partitions": N, "configs": {name: value}, "log_start":
{"<partition>": offset}, "replicas": [[broker, ...], ...]}``; only ``partitions`` is
required (records written before configs existed hold only it).

- ``configs``: the topic configs set on it (``topic_configs.py``), validated before
  they are written.
- ``log_start``: a partition's low watermark moved by DeleteRecords, the Kafka offset
  below which nothing is served (the ledgers wholly before it are then dropped; the
  batch holding it stays, and a consumer skips the records before it, as with any
  fetch from inside a batch).
- ``topic_id``: the topic's Kafka id (Metadata v10+, Fetch v13+), a random UUID as 32
  hex digits, given to the record when the gateway creates the topic; a record written before ids existed gets one the
  first time it is asked for (``TopicStore.topic_id``, by CAS: every gateway sees the
  same). A topic deleted and made again has a new id, as in Kafka.
- ``replicas``: a replica assignment given at creation, recorded as asked; it places
  nothing (a partition's data is on its ledgers' bookie ensembles, its leader is
  chosen by rendezvous hashing over the live gateways).

Every change is a compare-and-set on the record (``TopicStore.update``), so a
partition count that grows, a config change and a low watermark that moves, from any
gateway, never undo each other. Each gateway caches records for ``TTL_S``: a change
made through another gateway is seen within that.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import trio

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import CorruptMetadataError, NoNodeError
from ledgerd.metadata.store import MetadataStore

__all__ = ["TTL_S", "TopicRecord", "TopicStore", "new_topic_id"]

TTL_S = 1.0  # a cached record is read again after this long


def _count(value: object, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicRecord:
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    log_start: Mapping[int, int] = field(default_factory=dict)
    replicas: tuple[tuple[int, ...], ...] = ()
    topic_id: str = ""  # 32 hex digits ("": none yet; ``new_topic_id``)

    def __post_init__(self) -> None:
        _count(self.partitions, "partitions", 1)
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
        doc: dict[str, object] = {"format": 1, "partitions": self.partitions}
        if self.configs:
            doc["configs"] = dict(sorted(self.configs.items()))
        if self.log_start:
            doc["log_start"] = {str(p): o for p, o in sorted(self.log_start.items())}
        if self.replicas:
            doc["replicas"] = [list(r) for r in self.replicas]
        if self.topic_id:
            doc["topic_id"] = self.topic_id
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> TopicRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format", 1) != 1:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            configs = doc.get("configs", {})
            if not isinstance(configs, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
                raise ValueError("configs must map names to string values")
            starts = doc.get("log_start", {})
            if not isinstance(starts, dict):
                raise ValueError("log_start must map partitions to offsets")
            log_start = {_count(int(p), "a log_start partition"): _count(o, "log_start")
                         for p, o in starts.items()}
            replicas = tuple(tuple(_count(b, "a replica") for b in r)
                             for r in doc.get("replicas", []))
            topic_id = doc.get("topic_id", "")
            if not isinstance(topic_id, str):
                raise ValueError("topic_id must be a string")
            return cls(partitions=_count(doc["partitions"], "partitions", 1),
                       configs=configs, log_start=log_start, replicas=replicas,
                       topic_id=topic_id)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not a topic record: {exc}") from exc


def new_topic_id() -> str:
    """A fresh topic id for a record (a random UUID, as Kafka makes them)."""
    return uuid.uuid4().hex


class TopicStore:
    """The topic records under ``<root>/topics``, cached for ``TTL_S``."""

    def __init__(self, store: MetadataStore, root: str) -> None:
        self.store = store
        self.root = f"{root}/topics"
        self._cache: dict[str, tuple[float, TopicRecord]] = {}

    def path(self, topic: str) -> str:
        return f"{self.root}/{topic}"

    def cached(self, topic: str) -> TopicRecord | None:
        """The record as last read (however old), without I/O."""
        hit = self._cache.get(topic)
        return None if hit is None else hit[1]

    async def get(self, topic: str, *, fresh: bool = False) -> TopicRecord | None:
        """The topic's record (None: no such topic), read again if the cached one is
        older than ``TTL_S`` or ``fresh``."""
        now = trio.current_time()
        hit = self._cache.get(topic)
        if hit is not None and not fresh and now - hit[0] < TTL_S:
            return hit[1]
        try:
            raw, _ = await self.store.get(self.path(topic))
        except NoNodeError:
            self._cache.pop(topic, None)
            return None
        record = TopicRecord.from_json(raw, self.path(topic))
        self._cache[topic] = (now, record)
        return record

    async def names(self) -> list[str]:
        try:
            return sorted(await self.store.children(self.root))
        except NoNodeError:
            return []

    async def create(self, topic: str, record: TopicRecord) -> None:
        """Raises NodeExistsError if the topic exists."""
        await self.store.create(self.path(topic), record.to_json(), make_parents=True)
        self._cache[topic] = (trio.current_time(), record)

    async def update(self, topic: str, change: Callable[[TopicRecord], TopicRecord],
                     ) -> TopicRecord:
        """Apply ``change`` by compare-and-set; raises NoNodeError if the topic is gone
        and whatever ``change`` raises (nothing written then)."""
        record, _ = await cas_update(self.store, self.path(topic), change,
                                     decode=TopicRecord.from_json,
                                     encode=TopicRecord.to_json)
        self._cache[topic] = (trio.current_time(), record)
        return record

    async def topic_id(self, topic: str) -> bytes | None:
        """The topic's id as 16 bytes (None: no such topic), given to a record that has
        none by compare-and-set (whoever sets it first, every gateway reads that one).
        If cancelled, the id may have been written: the next call reads it."""
        record = await self.get(topic)
        if record is None:
            return None
        if not record.topic_id:
            fresh = new_topic_id()
            try:
                record = await self.update(
                    topic, lambda r: r if r.topic_id else replace(r, topic_id=fresh))
            except NoNodeError:
                return None
        return bytes.fromhex(record.topic_id)

    async def delete(self, topic: str) -> None:
        self._cache.pop(topic, None)
        await self.store.delete(self.path(topic))

    def forget(self, topic: str) -> None:
        self._cache.pop(topic, None)
