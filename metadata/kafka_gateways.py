"""The Kafka gateways' registrations and the producer id counter they share.

``<root>/kafka/gateways/<node id>`` is an ephemeral node per live gateway, owned by its
ZooKeeper session: the set of these is the membership every gateway hashes partitions
and groups over (``ledgerd/kafka/gateway.py``). JSON ``{"format": 1, "host": H, "port":
P}``, the address clients are sent to; registrations written before the format field
existed hold only ``host`` and ``port`` (format 1). ``rack`` (Kafka's ``broker.rack``) is
written only when the gateway has one; ``features``, the names of what this gateway's
version does that the others must know of before relying on it (``offset_index``: it
writes each group's offset index), only when it has any. Readers ignore keys they do
not know, so a new key needs no new format.

``<root>/kafka/producer_ids`` hands out idempotent producers' ids: the next id as a
decimal number (not JSON: the node has held a bare number since the first gateway, and
``metadata.backup`` moves it past a restored snapshot's value), bumped by
compare-and-set so no id is given twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import ClassVar

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import CorruptMetadataError, NodeExistsError, NoNodeError
from ledgerd.metadata.jsondoc import PORT, STR, STR_LIST, decode, encode, json_field
from ledgerd.metadata.paths import KAFKA_GATEWAYS, kafka_gateway_path, kafka_producer_ids_path
from ledgerd.metadata.store import MetadataStore, WatchEvent, WatchKind

__all__ = ["GatewayRecord", "GatewayStore", "ProducerIdStore"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayRecord:
    FORMAT: ClassVar[int] = 1
    UNVERSIONED: ClassVar[int | None] = 1

    host: str = json_field("host", STR)
    port: int = json_field("port", PORT)
    rack: str = json_field("rack", STR, default="", omit_default=True)
    features: tuple[str, ...] = json_field("features", STR_LIST, default=(),
                                           omit_default=True)

    def to_json(self) -> bytes:
        return encode(self)

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> GatewayRecord:
        return decode(cls, raw, path)


class GatewayStore:
    """The live gateways' registrations under ``<kafka root>/gateways``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.kafka_root = kafka_root

    def path(self, node_id: int) -> str:
        return kafka_gateway_path(self.kafka_root, node_id)

    async def register(self, node_id: int, record: GatewayRecord) -> None:
        """Register this session's gateway as ``node_id`` (ephemeral). A node left by
        a previous session (ours before an expiry, or a killed predecessor's on this
        port, not yet expired) is replaced; one of this session is rewritten. If
        cancelled, the gateway may or may not be registered; register again."""
        path, data = self.path(node_id), record.to_json()
        try:
            await self.store.create(path, data, ephemeral=True, make_parents=True)
            return
        except NodeExistsError:
            pass
        try:
            owner = (await self.store.get(path))[1].ephemeral_owner
        except NoNodeError:
            owner = 0
        if owner and owner == self.store.session_id:
            await self.store.set(path, data)
            return
        try:
            await self.store.delete(path)
        except NoNodeError:
            pass
        await self.store.create(path, data, ephemeral=True, make_parents=True)

    @asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Notifications that a gateway registered or went (one at once, then one per
        change; they coalesce). NoNodeError if no gateway ever registered here."""
        async with self.store.watch(f"{self.kafka_root}/{KAFKA_GATEWAYS}",
                                    WatchKind.CHILDREN) as events:
            yield events

    async def live(self) -> dict[int, GatewayRecord]:
        """Node id -> registration of every live gateway. Raises CorruptMetadataError
        for a child that is not a node id or not a registration."""
        parent = f"{self.kafka_root}/{KAFKA_GATEWAYS}"
        try:
            children = await self.store.children(parent)
        except NoNodeError:
            return {}
        out: dict[int, GatewayRecord] = {}
        for child in children:
            path = f"{parent}/{child}"
            if not child.isdigit():
                raise CorruptMetadataError(path, "not a gateway's node id")
            try:
                raw, _ = await self.store.get(path)
            except NoNodeError:
                continue  # that gateway's session ended meanwhile
            out[int(child)] = GatewayRecord.from_json(raw, path)
        return out


class ProducerIdStore:
    """The producer id counter, ``<kafka root>/producer_ids``."""

    def __init__(self, store: MetadataStore, kafka_root: str) -> None:
        self.store = store
        self.path = kafka_producer_ids_path(kafka_root)

    @staticmethod
    def _decode(raw: bytes, path: str) -> int:
        try:
            value = int(raw or b"0")
        except ValueError:
            value = -1
        if value < 0:
            raise CorruptMetadataError(path, f"not a producer id counter: {raw[:40]!r}")
        return value

    @staticmethod
    def _encode(value: int) -> bytes:
        return str(value).encode()

    async def _ensure(self) -> None:
        try:
            await self.store.create(self.path, b"0", make_parents=True)
        except NodeExistsError:
            pass

    async def next(self) -> int:
        """A producer id never given before (the counter's value, bumped by CAS). If
        cancelled, the id may have been used up without being returned."""
        await self._ensure()
        got: list[int] = []

        def bump(current: int) -> int:
            got[:] = [current]
            return current + 1

        await cas_update(self.store, self.path, bump, decode=self._decode,
                         encode=self._encode)
        return got[0]

    async def advance(self, at_least: int) -> int:
        """Move the counter to ``at_least`` unless it is there or beyond (a restore
        skips the ids given out since its snapshot); returns its value."""
        await self._ensure()

        def move(current: int) -> int:
            return current if current >= at_least else at_least

        value, _ = await cas_update(self.store, self.path, move, decode=self._decode,
                                    encode=self._encode)
        return value

    async def peek(self) -> int | None:
        """The next id to be given (None: none given yet)."""
        try:
            raw, _ = await self.store.get(self.path)
        except NoNodeError:
            return None
        return self._decode(raw, self.path)
