"""Kafka consumer group records: ``<root>/kafka/groups/<group>``.

The Kafka gateway keeps a group's members in memory (the coordinator's); what outlives a
gateway is here: the generation and the protocol type. JSON::

    {"format": 1, "group": G, "generation": N, "protocol_type": P}

A record is made by a group's first completed join or first offset commit (generation 0:
a consumer that assigns its partitions itself, an admin setting offsets) and deleted
with the group. Its committed offsets are not here: they are cursors of the partitions'
logs (``metadata.logs``), named ``kafka.<znode name>``, listed in the group's offset
index (``metadata.kafka_offsets``).

A group id that is not a plain name is stored as ``x-`` and the start of its hex (the
record names the id). Changes are compare-and-set, and a generation never goes back: a
coordinator that lost the group to another gateway cannot undo the newer one's record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import MetadataError, NodeExistsError, NoNodeError
from ledgerd.metadata.jsondoc import COUNT, STR, decode, encode, json_field
from ledgerd.metadata.paths import KAFKA_GROUPS, kafka_group_path
from ledgerd.metadata.store import MetadataStore

__all__ = ["GroupRecord", "GroupStore", "group_id_of", "group_znode"]

_ATTEMPTS = 100
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")


def group_znode(group_id: str) -> str:
    """A group id as a ZooKeeper (and cursor) name: itself when plain, else ``x-`` and
    the first 180 digits of its hex."""
    return group_id if _SAFE.match(group_id) else "x-" + group_id.encode().hex()[:180]


def group_id_of(znode: str) -> str | None:
    """The group id a znode name stands for (:func:`group_znode` undone); None when
    the name was cut short (an id over 90 bytes) or is not one it makes."""
    if znode.startswith("x-") and len(znode) >= 180 + 2:
        return None  # the hex of a long id, cut short (or of one exactly that long)
    if znode.startswith("x-"):
        try:
            gid = bytes.fromhex(znode[2:]).decode()
        except ValueError:
            gid = None
        if gid and group_znode(gid) == znode:
            return gid
    return znode if group_znode(znode) == znode else None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord:
    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = None  # group records always had a format

    group_id: str = json_field("group", STR)
    generation: int = json_field("generation", COUNT)
    protocol_type: str = json_field("protocol_type", STR, default="")

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("a group id is not empty")

    def to_json(self) -> bytes:
        return encode(self)

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> GroupRecord:
        return decode(cls, raw, path)


class GroupStore:
    """The group records under ``<kafka root>/groups``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.kafka_root = kafka_root

    def path(self, group_id: str) -> str:
        return kafka_group_path(self.kafka_root, group_znode(group_id))

    async def get(self, group_id: str) -> GroupRecord | None:
        """The group's record (None: none)."""
        return await self.get_named(group_znode(group_id))

    async def get_named(self, znode: str) -> GroupRecord | None:
        """The record stored under znode name ``znode`` (None: none)."""
        path = kafka_group_path(self.kafka_root, znode)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        return GroupRecord.from_json(raw, path)

    async def names(self) -> list[str]:
        """The znode names of the records (a plain one is the group id itself)."""
        try:
            return await self.store.children(f"{self.kafka_root}/{KAFKA_GROUPS}")
        except NoNodeError:
            return []

    async def ensure(self, group_id: str) -> bool:
        """Make the group's record at generation 0 unless it has one; True if made."""
        record = GroupRecord(group_id=group_id, generation=0)
        try:
            await self.store.create(self.path(group_id), record.to_json(), make_parents=True)
        except NodeExistsError:
            return False
        return True

    async def save(self, group_id: str, generation: int, protocol_type: str) -> GroupRecord:
        """Record the group at ``generation`` (made if absent) by compare-and-set,
        unless the record holds a newer generation already; returns what it holds. If
        cancelled, the change may or may not have been written."""
        wanted = GroupRecord(group_id=group_id, generation=generation,
                             protocol_type=protocol_type)

        def change(current: GroupRecord) -> GroupRecord:
            if current.generation > generation or current == wanted:
                return current
            return wanted

        for _ in range(_ATTEMPTS):
            try:
                record, _ = await cas_update(self.store, self.path(group_id), change,
                                             decode=GroupRecord.from_json,
                                             encode=GroupRecord.to_json)
                return record
            except NoNodeError:
                pass
            try:
                await self.store.create(self.path(group_id), wanted.to_json(),
                                        make_parents=True)
                return wanted
            except NodeExistsError:
                continue  # made meanwhile: apply the change to it
        raise MetadataError(f"gave up on {self.path(group_id)}: deleted and made again "
                            f"{_ATTEMPTS} times while it was saved")

    async def delete(self, group_id: str) -> bool:
        """Delete the group's record; False if it had none."""
        try:
            await self.store.delete(self.path(group_id))
        except NoNodeError:
            return False
        return True
