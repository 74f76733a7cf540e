"""The gateway's view of the topic records (``metadata.kafka_topics``): read through
a cache, so a request does not ask ZooKeeper for every partition it names.

Each gateway caches records for ``TTL_S``: a change made through another gateway is
seen within that. Its own changes (create, update, delete) go through the typed store,
by compare-and-set where they change a record, and refresh the cache at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import trio

from ledgerd.metadata.errors import NoNodeError
from ledgerd.metadata.kafka_topics import TopicRecord, TopicStore, new_topic_id

__all__ = ["INTERNAL_TOPICS", "NAME_RULE", "TTL_S", "TopicCache", "valid_topic_name"]

TTL_S = 0.5  # a cached record is read again after this long (CreatePartitions through
# another gateway shows within it: librdkafka's tests give a producer 1 s, refreshing
# its metadata every 0.5 s)

# A topic's name goes into ZooKeeper paths (its record, its partitions' logs and their
# cursors): Kafka's characters, at most 180 of them (Kafka allows 249; the longest log
# and cursor names must stay within what ZooKeeper paths and the ledgers' custom
# metadata carry), and never "." or ".." (Kafka refuses them too: a path would not
# name a node).
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,180}$")
NAME_RULE = "topic names are 1-180 of [A-Za-z0-9._-], other than '.' and '..'"
# Kafka's own topics, which clients do not make: the gateway keeps committed offsets
# and transactions in ZooKeeper, so these names are never created (auto-creation,
# CreateTopics) and a client asking for them finds no such topic.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def valid_topic_name(name: str) -> bool:
    """Whether ``name`` may name a topic (``NAME_RULE``)."""
    return name not in (".", "..") and _NAME.match(name) is not None


class TopicCache:
    """The topic records of ``store``, cached for ``TTL_S``."""

    def __init__(self, store: TopicStore) -> None:
        self.store = store
        self._cache: dict[str, tuple[float, TopicRecord]] = {}

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
        record = await self.store.get(topic)
        if record is None:
            self._cache.pop(topic, None)
        else:
            self._cache[topic] = (now, record)
        return record

    async def names(self) -> list[str]:
        return await self.store.names()

    async def create(self, topic: str, record: TopicRecord) -> None:
        """Raises NodeExistsError if the topic exists."""
        await self.store.create(topic, record)
        self._cache[topic] = (trio.current_time(), record)

    async def update(self, topic: str, change: Callable[[TopicRecord], TopicRecord],
                     ) -> TopicRecord:
        """Apply ``change`` by compare-and-set (``TopicStore.update``)."""
        record = await self.store.update(topic, change)
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
        await self.store.delete(topic)

    def forget(self, topic: str) -> None:
        self._cache.pop(topic, None)
