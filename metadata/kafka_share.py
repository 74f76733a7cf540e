"""Kafka share groups' records (KIP-932): ``<root>/kafka/share_groups/<group>``.

The group's node holds its configs (IncrementalAlterConfigs on a GROUP resource:
``share.auto.offset.reset``, ``share.isolation.level``, ``share.record.lock.duration.ms``,
``share.delivery.count.limit``)::

    {"format": 1, "group": G, "configs": {name: value}}

Below it, one node per share partition the group has read, ``<topic>.<partition>``,
holds what the share-partition leader must not forget (``share_partition.ShareState``)::

    {"format": 1, "topic_id": hex, "start": N, "runs": [[first, last, state, count], ...]}

The members and their assignments stay in the coordinator's memory (a coordinator that
takes over has them join again), as do the locks of records handed out: a leader that
takes over makes them available again, with the delivery counts last written.

Every write is compare-and-set against the version the writer last read or wrote: a
gateway that lost a partition to another cannot overwrite what the newer leader wrote.
A state naming another topic id is a deleted topic's: the new topic's partition starts
afresh. DeleteGroups deletes a share group's node with everything below it
(``delete_group``), DeleteTopics a deleted topic's partitions in every share group
(``forget_topic``).
"""

from __future__ import annotations

import json
from typing import Any

from ledgerd.metadata.errors import MetadataError, NodeExistsError, NoNodeError, NotEmptyError
from ledgerd.metadata.kafka_groups import group_znode
from ledgerd.metadata.paths import KAFKA_SHARE_GROUPS, kafka_share_group_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["ShareStore", "ShareStoreError"]

FORMAT = 1
MAX_CONFIGS_BYTES = 16 * 1024
DELETE_ATTEMPTS = 5


class ShareStoreError(MetadataError):
    """A share group record that is not what this module writes."""


def _load(raw: bytes, path: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ShareStoreError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ShareStoreError(f"{path}: not a share group record of format {FORMAT}")
    return doc


class ShareStore:
    """The share group records under ``<kafka root>/share_groups``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.kafka_root = kafka_root

    def path(self, group_id: str, topic: str | None = None, partition: int = 0) -> str:
        return kafka_share_group_path(self.kafka_root, group_znode(group_id), topic, partition)

    # -- the group's configs ----------------------------------------------------------

    async def configs(self, group_id: str) -> dict[str, str]:
        path = self.path(group_id)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return {}
        if not raw:  # made as the parent of a partition's state
            return {}
        configs = _load(raw, path).get("configs", {})
        if not isinstance(configs, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
            raise ShareStoreError(f"{path}: configs are not names and values")
        return configs

    async def set_configs(self, group_id: str, configs: dict[str, str]) -> None:
        """Replace the group's configs (the caller validated them)."""
        path = self.path(group_id)
        raw = json.dumps({"format": FORMAT, "group": group_id, "configs": configs},
                         sort_keys=True).encode()
        if len(raw) > MAX_CONFIGS_BYTES:
            raise ShareStoreError(f"share group {group_id}: configs over "
                                  f"{MAX_CONFIGS_BYTES} bytes")
        try:
            await self.store.set(path, raw)
        except NoNodeError:
            try:
                await self.store.create(path, raw, make_parents=True)
            except NodeExistsError:
                await self.store.set(path, raw)

    # -- share partitions -------------------------------------------------------------

    async def load(self, group_id: str, topic: str, partition: int, topic_id: bytes,
                   ) -> tuple[dict[str, Any] | None, int]:
        """The partition's stored state (None: none, or a deleted topic's) and the
        node's version (-1: no node)."""
        path = self.path(group_id, topic, partition)
        try:
            raw, stat = await self.store.get(path)
        except NoNodeError:
            return None, -1
        doc = _load(raw, path)
        if doc.get("topic_id") != topic_id.hex():
            return None, stat.version
        return doc, stat.version

    async def version(self, group_id: str, topic: str, partition: int) -> int:
        """The stored state's node version (-1: none): a copy read at another version
        is stale (another gateway stored since)."""
        stat = await self.store.exists(self.path(group_id, topic, partition))
        return -1 if stat is None else stat.version

    async def save(self, group_id: str, topic: str, partition: int, topic_id: bytes,
                   state: dict[str, Any], version: int) -> int:
        """Write the state over ``version`` (-1: make the node); the new version.
        Raises BadVersionError / NodeExistsError when another gateway wrote since."""
        path = self.path(group_id, topic, partition)
        raw = json.dumps({"format": FORMAT, "topic_id": topic_id.hex(), **state},
                         sort_keys=True).encode()
        if version < 0:
            await self.store.create(path, raw, make_parents=True)
            return 0
        return (await self.store.set(path, raw, version)).version

    async def groups(self) -> list[str]:
        """The share groups' znode names (``group_znode``)."""
        try:
            return await self.store.children(f"{self.kafka_root}/{KAFKA_SHARE_GROUPS}")
        except NoNodeError:
            return []

    async def has_state(self, group_id: str) -> bool:
        """Whether the group has stored any share partition (not only configs)."""
        stat = await self.store.exists(self.path(group_id))
        return stat is not None and stat.num_children > 0

    async def delete_group(self, group_id: str) -> bool:
        """Delete the group's configs and every share partition's state. True if it had
        any. A recursive delete is not atomic: a share partition deleted meanwhile (its
        topic deleted) or stored meanwhile (a leader's write) makes it go again."""
        path = self.path(group_id)
        existed = False
        for _ in range(DELETE_ATTEMPTS):
            try:
                await self.store.delete(path, recursive=True)
                return True
            except NoNodeError as exc:
                if exc.path == path:
                    return existed
                existed = True
            except NotEmptyError:
                existed = True
        raise ShareStoreError(f"{path}: still changing after {DELETE_ATTEMPTS} deletes")

    async def forget_topic(self, topic: str) -> int:
        """Delete the state of ``topic``'s share partitions in every share group (the
        topic was deleted); how many were deleted. One read per share group."""
        root = f"{self.kafka_root}/{KAFKA_SHARE_GROUPS}"
        deleted = 0
        for group in await self.groups():
            try:
                names = await self.store.children(f"{root}/{group}")
            except NoNodeError:
                continue
            for name in names:
                head, _, p = name.rpartition(".")
                if head == topic and p.isdigit():
                    try:
                        await self.store.delete(f"{root}/{group}/{name}")
                        deleted += 1
                    except NoNodeError:
                        pass
        return deleted
