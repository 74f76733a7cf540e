"""Kafka transaction records: ``<root>/kafka/transactions/<transactional id>``.

The Kafka gateway's transaction coordinator (``ledgerd/kafka/txn_coordinator.py`` for
its decisions, ``ledgerd/kafka/transactions.py`` for its I/O) keeps one record per
transactional id: the producer id and epoch it last gave out, the state of the current
transaction, the partitions and consumer groups it touched and the offsets it commits
(applied only when it commits). JSON::

    {"format": 1, "transactional_id": T, "producer_id": P, "producer_epoch": E,
     "last_epoch": E0, "timeout_ms": N, "state": "Ongoing",
     "partitions": [[topic, p], ...], "groups": [g, ...],
     "offsets": [[group, topic, p, offset, metadata, leader_epoch], ...],
     "started_ms": T0, "updated_ms": T1}

Every change is a compare-and-set (``TxnStore.update``). A transactional id that is not
a plain name is stored under ``x-`` and its SHA-256; the record names the id.

Beside them, ``<root>/kafka/pending_offsets/<group>/<transactional id>`` indexes the
transactions that hold offsets of a group they have not committed yet (KIP-447:
OffsetFetch with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for those
partitions). Every write of a record that gives it offsets of a group also writes the
group's entry, in one multi-op transaction (``update_offsets``; the entry is created
first if missing), so a record never holds a group's pending offsets without the
entry. An entry outlives its transaction (the producer's next one writes it again in
the same multi); whoever finds it stale removes it only if neither it nor the record
changed since it read them (``drop_pending``): a transaction that gave the group
offsets since has moved the record's version, so the removal fails (the entry's own
version is not enough: dropped and made again, it is back at the version read).

And ``<root>/kafka/txn_partitions/<topic>/<partition>`` holds the offset from
which a partition's log may hold transactional batches (written by the partition's
leader before its first one), so readers that rebuild a partition's transaction index
read the log from there, and not at all for a partition that never had one.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import (
    BadVersionError,
    CorruptMetadataError,
    MetadataError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    UnknownFormatError,
)
from ledgerd.metadata.paths import (
    KAFKA_TRANSACTIONS,
    kafka_pending_offsets_path,
    kafka_txn_flag_path,
    kafka_txn_path,
)
from ledgerd.metadata.store import Check, Create, MetadataStore, Remove, SetData

__all__ = ["MAX_EPOCH", "PendingOffset", "TxnRecord", "TxnState", "TxnStore", "znode_name"]

MAX_EPOCH = 32766  # an epoch this high gets a new producer id instead of a bump
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,150}$")


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingOffset:
    group: str
    topic: str
    partition: int
    offset: int
    metadata: str | None
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnRecord:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    last_epoch: int = -1  # the epoch before the last fencing bump (-1: none)
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: tuple[tuple[str, int], ...] = ()
    groups: tuple[str, ...] = ()
    offsets: tuple[PendingOffset, ...] = ()
    started_ms: int = -1  # when the transaction became ONGOING
    updated_ms: int = 0

    def __post_init__(self) -> None:
        if not self.transactional_id:
            raise ValueError("a transactional id is not empty")
        if self.producer_id < 0 or not 0 <= self.producer_epoch <= MAX_EPOCH + 1:
            raise ValueError(f"producer {self.producer_id} epoch {self.producer_epoch}")

    def to_json(self) -> bytes:
        return json.dumps({
            "format": 1, "transactional_id": self.transactional_id,
            "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
            "last_epoch": self.last_epoch, "timeout_ms": self.timeout_ms,
            "state": self.state.value, "partitions": [list(p) for p in self.partitions],
            "groups": list(self.groups),
            "offsets": [[o.group, o.topic, o.partition, o.offset, o.metadata,
                         o.leader_epoch] for o in self.offsets],
            "started_ms": self.started_ms, "updated_ms": self.updated_ms}).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> TxnRecord:
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise TypeError("not a JSON object")
        except (ValueError, TypeError) as exc:
            raise CorruptMetadataError(path, str(exc)) from exc
        if doc.get("format") != 1:
            raise UnknownFormatError(path, doc.get("format"), 1)
        try:
            return cls(
                transactional_id=str(doc["transactional_id"]),
                producer_id=int(doc["producer_id"]),
                producer_epoch=int(doc["producer_epoch"]),
                last_epoch=int(doc.get("last_epoch", -1)),
                timeout_ms=int(doc["timeout_ms"]), state=TxnState(doc["state"]),
                partitions=tuple((str(t), int(p)) for t, p in doc["partitions"]),
                groups=tuple(str(g) for g in doc["groups"]),
                offsets=tuple(PendingOffset(group=str(o[0]), topic=str(o[1]),
                                            partition=int(o[2]), offset=int(o[3]),
                                            metadata=o[4], leader_epoch=int(o[5]))
                              for o in doc["offsets"]),
                started_ms=int(doc["started_ms"]), updated_ms=int(doc["updated_ms"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptMetadataError(path, str(exc)) from exc


def znode_name(transactional_id: str) -> str:
    """A transactional id as a ZooKeeper name: itself when plain, else ``x-`` and its
    SHA-256 (the record inside names the id)."""
    return transactional_id if _SAFE.match(transactional_id) \
        else "x-" + hashlib.sha256(transactional_id.encode()).hexdigest()


class TxnStore:
    """The transaction records and partition flags under ``kafka_root``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.kafka_root = kafka_root
        self.root = f"{kafka_root}/{KAFKA_TRANSACTIONS}"

    def path(self, transactional_id: str) -> str:
        return kafka_txn_path(self.kafka_root, znode_name(transactional_id))

    async def get(self, transactional_id: str, *, fresh: bool = False) -> TxnRecord | None:
        return await self.get_named(znode_name(transactional_id), fresh=fresh)

    async def get_named(self, name: str, *, fresh: bool = False) -> TxnRecord | None:
        """The record stored under znode ``name`` (None: none). ``fresh`` syncs first:
        the answer holds every change that completed before the call, even on a
        ZooKeeper server behind the leader."""
        path = kafka_txn_path(self.kafka_root, name)
        if fresh:
            await self.store.sync(path)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        return TxnRecord.from_json(raw, path)

    async def create(self, record: TxnRecord) -> None:
        """Raises NodeExistsError if the id has a record already."""
        await self.store.create(self.path(record.transactional_id), record.to_json(),
                                make_parents=True)

    async def update(self, transactional_id: str,
                     change: Callable[[TxnRecord], TxnRecord]) -> TxnRecord:
        """``change`` applied under compare-and-set; raises what it raises, and
        NoNodeError if there is no record. If cancelled, the change may or may not
        have been written."""
        record, _ = await self.update_versioned(transactional_id, change)
        return record

    async def expire(self, transactional_id: str,
                     expired: Callable[[TxnRecord], bool]) -> bool:
        """Delete the record if ``expired`` says so of it as stored, unless it changed
        meanwhile (compare-and-set on its version). True if deleted."""
        path = self.path(transactional_id)
        try:
            raw, stat = await self.store.get(path)
            if not expired(TxnRecord.from_json(raw, path)):
                return False
            await self.store.delete(path, stat.version)
        except (NoNodeError, BadVersionError):
            return False
        return True

    async def update_versioned(self, transactional_id: str,
                               change: Callable[[TxnRecord], TxnRecord], *,
                               known: tuple[TxnRecord, int] | None = None,
                               ) -> tuple[TxnRecord, int]:
        """As :meth:`update`, with the record's new version; ``known`` (the record
        last written, and its version) saves the read when it is still current
        (``metadata.cas``)."""
        return await cas_update(self.store, self.path(transactional_id), change,
                                decode=TxnRecord.from_json, encode=TxnRecord.to_json,
                                known=known)

    async def version(self, transactional_id: str) -> int | None:
        """The record's version (a stat read from this session's server), None if
        there is none."""
        stat = await self.store.exists(self.path(transactional_id))
        return None if stat is None else stat.version

    async def set_versioned(self, record: TxnRecord, version: int) -> int:
        """Write ``record`` over the stored one if that is still at ``version``; its new
        version. Raises BadVersionError if it changed, NoNodeError if it is gone."""
        stat = await self.store.set(self.path(record.transactional_id), record.to_json(),
                                    version)
        return stat.version

    async def update_offsets(self, transactional_id: str, group: str,
                             change: Callable[[TxnRecord], TxnRecord],
                             max_attempts: int = 100) -> TxnRecord:
        """As :meth:`update`, for a change that gives the record offsets of ``group``
        (its znode name): the write also touches the group's pending-offsets entry, in
        one multi-op transaction, creating the entry first if it is missing."""
        path = self.path(transactional_id)
        entry = kafka_pending_offsets_path(self.kafka_root, group, znode_name(transactional_id))
        for _ in range(max_attempts):
            raw, stat = await self.store.get(path)
            current = TxnRecord.from_json(raw, path)
            wanted = change(current)
            if wanted is current:
                return current
            try:
                await self.store.multi([SetData(entry, b""),
                                        SetData(path, wanted.to_json(), stat.version)])
            except NoNodeError as exc:
                if exc.path != entry:
                    raise
                try:
                    await self.store.create(entry, b"", make_parents=True)
                except NodeExistsError:
                    pass
                continue
            except BadVersionError:
                continue
            return wanted
        raise MetadataError(f"gave up on {path} after {max_attempts} version conflicts")

    async def pending(self, group: str) -> list[str]:
        """The znode names of the transactional ids with an entry in the group's
        pending-offsets index."""
        try:
            return await self.store.children(kafka_pending_offsets_path(self.kafka_root,
                                                                        group))
        except NoNodeError:
            return []

    async def sync_pending(self, group: str) -> None:
        """Bring this session's view of the group's index and of the records up to
        ZooKeeper's leader (``MetadataStore.sync``)."""
        await self.store.sync(kafka_pending_offsets_path(self.kafka_root, group))

    async def pending_version(self, group: str, name: str) -> int | None:
        """The version of the group's entry for transaction ``name`` (None: gone); read
        it before the record, to drop the entry if the record shows it stale."""
        stat = await self.store.exists(kafka_pending_offsets_path(self.kafka_root, group,
                                                                  name))
        return None if stat is None else stat.version

    async def get_named_versioned(self, name: str) -> tuple[TxnRecord | None, int]:
        """The record stored under znode ``name`` and its version (None, -1: none)."""
        path = kafka_txn_path(self.kafka_root, name)
        try:
            raw, stat = await self.store.get(path)
        except NoNodeError:
            return None, -1
        return TxnRecord.from_json(raw, path), stat.version

    async def drop_pending(self, group: str, name: str, version: int,
                           record_version: int) -> bool:
        """Remove the group's entry for transaction ``name`` if still at ``version``
        AND the record is still at ``record_version`` (-1: still absent), as read
        when it showed the entry stale: any write giving the record offsets since
        moved the record's version, whatever became of the entry meanwhile (a
        versioned delete of the entry alone is ABA-prone: dropped and re-created, it
        is back at the version read). True if removed."""
        record = kafka_txn_path(self.kafka_root, name)
        guard: list[Check | Create | Remove] = [Check(record, record_version)] \
            if record_version >= 0 else [Create(record), Remove(record)]  # still absent
        try:
            await self.store.multi([*guard, Remove(kafka_pending_offsets_path(
                self.kafka_root, group, name), version)])
        except (NoNodeError, BadVersionError, NodeExistsError):
            return False
        return True

    async def drop_pending_group(self, group: str) -> bool:
        """Remove the group's node of the index if it holds no entry. True if
        removed."""
        try:
            await self.store.delete(kafka_pending_offsets_path(self.kafka_root, group))
        except (NoNodeError, NotEmptyError):
            return False
        return True

    async def names(self) -> list[str]:
        try:
            return await self.store.children(self.root)
        except NoNodeError:
            return []

    async def partition_start(self, topic: str, partition: int,
                              offset: int | None = None) -> int | None:
        """The offset from which the partition may hold transactions: read (None: it
        has none yet), or with ``offset`` recorded there unless one is already."""
        path = kafka_txn_flag_path(self.kafka_root, topic, partition)
        if offset is not None:
            try:
                await self.store.create(path, str(offset).encode(), make_parents=True)
                return offset
            except NodeExistsError:
                pass
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        try:
            return int(raw)
        except ValueError as exc:
            raise CorruptMetadataError(path, f"not an offset: {raw!r}") from exc

    async def forget_topic(self, topic: str) -> None:
        try:
            await self.store.delete(kafka_txn_flag_path(self.kafka_root, topic),
                                    recursive=True)
        except NoNodeError:
            pass


# -- after a metadata restore ------------------------------------------------------------

PREPARED_STATES = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


def settle_after_restore(records: list[TxnRecord], flagged: list[tuple[str, int]]
                         ) -> list[TxnRecord]:
    """The transaction records a restored snapshot gets instead of its own, so that no
    partition is left in a transaction nobody will end (pure).

    After the snapshot a producer may have begun a transaction (same producer id and
    epoch as its record, or the ONGOING one going on) in any partition flagged as
    transactional; its batches are in the log, its record is not. The coordinator ends
    only what records name, so every record that is not PREPARE_* becomes ONGOING over
    every flagged partition (and those it named), already past its timeout: the
    coordinator's recovery aborts it at its next tick, bumping the producer's epoch
    (the producer is fenced and starts again) and writing an abort marker to each of
    those partitions (a marker for a producer with nothing open there is ignored).
    PREPARE_* records are kept: their decision was made before the snapshot and
    recovery completes it. Flags not in the snapshot are not restored: those
    partitions read as holding no transaction (LSO = high watermark), never stuck.
    Returns only the records changed."""
    out = []
    for r in records:
        if r.state in PREPARED_STATES:
            continue
        partitions = tuple(sorted(set(r.partitions) | set(flagged)))
        if not partitions:
            continue
        out.append(TxnRecord(
            transactional_id=r.transactional_id, producer_id=r.producer_id,
            producer_epoch=r.producer_epoch, last_epoch=r.last_epoch,
            timeout_ms=r.timeout_ms, state=TxnState.ONGOING, partitions=partitions,
            groups=(), offsets=(), started_ms=0, updated_ms=r.updated_ms))
    return out


__all__ += ["settle_after_restore"]
