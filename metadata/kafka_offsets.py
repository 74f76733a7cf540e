"""The consumer groups' offset index: ``<root>/kafka/offset_index/<group>/<topic>``.

A group's committed offsets are cursors of the partitions' logs (``metadata.logs``),
named ``kafka.<group znode>`` (``kafka_groups.group_znode``). To find them without
reading a cursor of every partition of every topic (OffsetFetch of all topics,
DeleteGroups), each group has an index: a node named as the group's cursors, with a
child per topic it committed offsets to, JSON ``{"format": 1, "partitions": [p, ...]}``
(sorted, no duplicates). A group's index is bounded by what it committed: one node per
topic, one number per partition, the same count as its cursors.

The invariant: **a group's cursor on a partition exists only while the partition is
listed in the group's index node of its topic**. Every change keeps it, each one a
single compare-and-set or ZooKeeper multi-op transaction (``MetadataStore.multi``):

- a cursor is *created* only in a multi that also writes its topic's index node (creates
  it, or compare-and-sets it to a list holding the partition, even if it held it
  already): every cursor created moves that node's version;
- a cursor that exists is *rewritten* by its own compare-and-set (its existence proves
  its entry's, and a rewrite changes no existence);
- an entry *leaves* the index only in a multi that compare-and-sets (or deletes at its
  version) the topic's index node as read and deletes every listed cursor that was
  read present: a cursor created since moved the node's version, one deleted since
  fails its delete; either way the multi changes nothing and is tried again from a
  fresh read.

A crash between any two of these leaves the tree as one of them did: never a cursor
without its entry. An entry without a cursor (the cursor went with its topic's
deletion, or a commit's multi lost to a delete) reads as "no offset"; the gateway drops
a deleted topic's entries at the group's next listing or deletion.

**Upgrade.** Offsets committed before the index existed have no entries. A one-time
migration (the gateway's, ``kafka/gateway.py``) lists every partition's cursors, adds
the entries they need (:meth:`OffsetIndex.add`: a compare-and-set that only adds) and
then makes ``<root>/kafka/offset_index_complete`` (``{"format": 1}``). Until that node
exists, readers find a group's offsets by the old scan of every partition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from ledgerd.base.fanout import each_at_most
from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import (
    BadVersionError,
    CorruptMetadataError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from ledgerd.metadata.logs import CursorRecord, LogStore
from ledgerd.metadata.paths import (
    kafka_offset_index_complete_path,
    kafka_offset_index_path,
)
from ledgerd.metadata.store import Create, MetadataStore, Op, Remove, SetData

__all__ = ["CURSOR_PREFIX", "IndexEntry", "OffsetIndex", "with_partitions", "without_partitions"]

CURSOR_PREFIX = "kafka."  # a group's cursor is this and the group's znode name
_ATTEMPTS = 100
REMOVE_CHUNK = 500  # cursors one removal multi deletes at most (well within 1 MiB)
PRESENT_READS = 32  # cursor reads in flight while a removal looks which exist


def with_partitions(partitions: tuple[int, ...], added: Iterable[int]) -> tuple[int, ...]:
    """An entry's partitions with ``added`` too (sorted, each once)."""
    return tuple(sorted(set(partitions) | set(added)))


def without_partitions(partitions: tuple[int, ...], removed: Collection[int],
                       ) -> tuple[int, ...]:
    """An entry's partitions without ``removed``."""
    return tuple(p for p in partitions if p not in removed)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The partitions of one topic a group has committed offsets for (as read, with
    the node's version)."""

    partitions: tuple[int, ...]
    version: int = -1

    def to_json(self) -> bytes:
        return json.dumps({"format": 1, "partitions": list(self.partitions)}).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str, version: int = -1) -> IndexEntry:
        try:
            doc = json.loads(raw)
            if doc.get("format") != 1:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            parts = doc["partitions"]
            if not isinstance(parts, list) or not all(
                    isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
                raise ValueError("partitions must be a list of integers >= 0")
            return cls(tuple(sorted(set(parts))), version)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not an offset index entry: {exc}") from exc


class OffsetIndex:
    """The groups' offset index under ``<kafka root>/offset_index``, and the cursor
    changes that must go with it (``logs``: the cluster's log store). Groups are named
    by their znode names (``kafka_groups.group_znode``); ``log_of(topic, partition)``
    names a partition's log."""

    def __init__(self, store: MetadataStore, kafka_root: str, logs: LogStore,
                 log_of: Callable[[str, int], str]) -> None:
        self.store = store
        self.kafka_root = kafka_root
        self.logs = logs
        self.log_of = log_of

    def group_path(self, group: str) -> str:
        return kafka_offset_index_path(self.kafka_root, group)

    def topic_path(self, group: str, topic: str) -> str:
        return kafka_offset_index_path(self.kafka_root, group, topic)

    def _cursor_path(self, group: str, topic: str, partition: int) -> str:
        return self.logs.cursor_path(self.log_of(topic, partition), CURSOR_PREFIX + group)

    # -- the migration's marker ----------------------------------------------------------

    async def complete(self) -> bool:
        """True once every offset committed before the index existed is indexed."""
        return await self.store.exists(kafka_offset_index_complete_path(
            self.kafka_root)) is not None

    async def mark_complete(self) -> None:
        try:
            await self.store.create(kafka_offset_index_complete_path(self.kafka_root),
                                    json.dumps({"format": 1}).encode(), make_parents=True)
        except NodeExistsError:
            pass

    # -- reads ---------------------------------------------------------------------------

    async def entry(self, group: str, topic: str) -> IndexEntry | None:
        path = self.topic_path(group, topic)
        try:
            raw, stat = await self.store.get(path)
        except NoNodeError:
            return None
        return IndexEntry.from_json(raw, path, stat.version)

    async def topics(self, group: str) -> list[str]:
        """The topics the group's index has a node for (one read)."""
        try:
            return await self.store.children(self.group_path(group))
        except NoNodeError:
            return []

    # -- changes -------------------------------------------------------------------------

    async def commit(self, group: str, topic: str, partition: int,
                     record: CursorRecord) -> None:
        """Write the group's cursor on the partition (its log's record must exist): a
        compare-and-set if it exists, else a multi that creates it and lists the
        partition in the index. If cancelled, the commit may or may not have landed."""
        name, cursor = self.log_of(topic, partition), CURSOR_PREFIX + group
        for _ in range(_ATTEMPTS):
            got = await self.logs.get_cursor(name, cursor)
            if got is not None:
                try:
                    await self.logs.put_cursor(name, cursor, record, got[1])
                    return
                except (BadVersionError, NoNodeError):
                    continue
            entry = await self.entry(group, topic)
            op: Op
            if entry is None:
                try:
                    await self.store.create(self.group_path(group), make_parents=True)
                except NodeExistsError:
                    pass
                op = Create(self.topic_path(group, topic), IndexEntry((partition,)).to_json())
            else:
                op = SetData(self.topic_path(group, topic), IndexEntry(with_partitions(
                    entry.partitions, (partition,))).to_json(), entry.version)
            await self.logs.ensure_cursors(name)
            try:
                await self.store.multi([op, Create(self.logs.cursor_path(name, cursor),
                                                   record.to_json())])
                return
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # another commit or a delete came first: read again
        raise MetadataError(f"gave up committing {cursor} on {name}: {_ATTEMPTS} conflicts")

    async def remove(self, group: str, topic: str,
                     partitions: Collection[int] | None = None, *,
                     keep_present: bool = False) -> tuple[tuple[int, ...], bool]:
        """Delete the group's cursors on ``partitions`` of the topic (None: all it
        lists) with their entries, REMOVE_CHUNK cursors a multi. Returns those whose cursors
        were deleted, and whether the index listed every one asked for (False: a
        cursor of the old layout may exist for the others). ``keep_present``: delete
        no cursor, only the entries of those that do not exist (a deleted topic's)."""
        wanted = None if partitions is None else set(partitions)
        deleted: list[int] = []
        done: set[int] = set()  # asked for and no longer listed (each multi's share)
        all_listed: bool | None = None
        attempts = 0
        while attempts < _ATTEMPTS:
            entry = await self.entry(group, topic)
            listed = entry.partitions if entry is not None else ()
            if all_listed is None:  # as first read
                all_listed = wanted is None or wanted <= set(listed)
            targets = tuple(p for p in listed if (wanted is None or p in wanted)
                            and p not in done)
            if entry is None or not targets:
                return tuple(sorted(deleted)), all_listed
            # at most REMOVE_CHUNK cursors a multi: ZooKeeper refuses a request past
            # jute.maxbuffer (1 MiB) by dropping the connection
            chunk = targets[:REMOVE_CHUNK]
            present = await self._present(group, topic, chunk)
            if keep_present:
                chunk = tuple(p for p in chunk if p not in present)
                present = []
                if not chunk:
                    done.update(targets[:REMOVE_CHUNK])
                    continue
            ops: list[Op] = [Remove(self._cursor_path(group, topic, p)) for p in present]
            keep = without_partitions(listed, set(chunk))
            path = self.topic_path(group, topic)
            ops.append(SetData(path, IndexEntry(keep).to_json(), entry.version) if keep
                       else Remove(path, entry.version))
            try:
                await self.store.multi(ops)
            except (BadVersionError, NoNodeError, NotEmptyError):
                attempts += 1
                continue  # a commit or another delete came first: read again
            deleted += present
            done.update(targets[:REMOVE_CHUNK])
        raise MetadataError(f"gave up deleting offsets of {group} on {topic}: "
                            f"{_ATTEMPTS} conflicts")

    async def _present(self, group: str, topic: str, partitions: Sequence[int]) -> list[int]:
        """Those of ``partitions`` on which the group has a cursor (PRESENT_READS reads
        at a time)."""
        found: list[int] = []

        async def look(p: int) -> None:
            if await self.logs.get_cursor(self.log_of(topic, p),
                                          CURSOR_PREFIX + group) is not None:
                found.append(p)

        await each_at_most(PRESENT_READS, look, partitions)
        return sorted(found)

    async def drop_group(self, group: str) -> int:
        """Delete every cursor the group's index lists, with the index; returns how many
        cursors were deleted. A commit racing it may leave the group's node (with what
        it committed)."""
        removed = 0
        for topic in await self.topics(group):
            removed += len((await self.remove(group, topic))[0])
        try:
            await self.store.delete(self.group_path(group))
        except (NoNodeError, NotEmptyError):
            pass
        return removed

    async def add(self, group: str, topic: str, partitions: Collection[int]) -> None:
        """List ``partitions`` in the group's index for the topic (the migration's
        change: an entry without a cursor is harmless, so adding needs no cursor)."""
        path = self.topic_path(group, topic)
        wanted = tuple(partitions)

        def change(current: IndexEntry) -> IndexEntry:
            merged = with_partitions(current.partitions, wanted)
            return current if merged == current.partitions else IndexEntry(merged)

        for _ in range(_ATTEMPTS):
            try:
                await cas_update(self.store, path, change, decode=IndexEntry.from_json,
                                 encode=IndexEntry.to_json)
                return
            except NoNodeError:
                pass
            try:
                await self.store.create(path, IndexEntry(with_partitions((), wanted)).to_json(),
                                        make_parents=True)
                return
            except NodeExistsError:
                continue
        raise MetadataError(f"gave up on {path}: deleted and made again {_ATTEMPTS} times")
