"""The ledger manager: id generation, create, read, CAS update, delete, listing, watch.

Ids come from ephemeral-sequential nodes under ``<root>/idgen/ID-`` (the counter is the
id; the node is deleted at once). When that 31-bit counter runs out, ids come from
``<root>/idgen-long/HOB-<high 32 bits>/ID-``, giving ids of 2^31 and above, as
BookKeeper's LongZkLedgerIdGenerator does. Listing walks the hierarchy one directory at a
time, so memory stays bounded by one directory's children, not the whole ledger set.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from ledgerd.metadata.cas import cas_update
from ledgerd.metadata.errors import NodeExistsError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.paths import LEGACY_LIMIT, LedgerLayout, ledger_id_from_path, ledger_path
from ledgerd.metadata.store import MetadataStore, WatchEvent, WatchKind

__all__ = ["LedgerManager"]


class LedgerManager:
    def __init__(self, store: MetadataStore, root: str = "/ledgers",
                 layout: str = LedgerLayout.HIERARCHICAL) -> None:
        self.store = store
        self.root = root
        self.layout = layout

    def path(self, ledger_id: int) -> str:
        return ledger_path(self.root, self.layout, ledger_id)

    async def next_id(self, *, long_ids: bool = False) -> int:
        """A cluster-unique ledger id (``long_ids`` forces the >= 2^31 generator)."""
        if not long_ids:
            node = await self.store.create(f"{self.root}/idgen/ID-", ephemeral=True,
                                           sequential=True)
            await self.store.delete(node)
            seq = int(node.rsplit("-", 1)[1])
            if 0 <= seq < LEGACY_LIMIT:
                return seq
        return await self._next_long_id()

    async def _next_long_id(self) -> int:
        base = f"{self.root}/idgen-long"
        if await self.store.exists(base) is None:
            try:
                await self.store.create(base)
            except NodeExistsError:
                pass
        hobs = sorted(c for c in await self.store.children(base) if c.startswith("HOB-"))
        high = int(hobs[-1][4:]) if hobs else 1
        while True:
            hob = f"{base}/HOB-{high:010d}"
            try:
                await self.store.create(hob)
            except NodeExistsError:
                pass
            node = await self.store.create(f"{hob}/ID-", ephemeral=True, sequential=True)
            await self.store.delete(node)
            low = int(node.rsplit("-", 1)[1])
            if 0 <= low < (1 << 31):
                return (high << 32) | low
            high += 1  # this high word's counter ran out; move to the next one

    async def create(self, metadata: LedgerMetadata, *, ledger_id: int | None = None,
                     long_ids: bool = False) -> tuple[int, int]:
        """Store new metadata; returns ``(ledger_id, version)``.

        With ``ledger_id`` given, raises NodeExistsError if that ledger exists.
        """
        lid = ledger_id if ledger_id is not None else await self.next_id(long_ids=long_ids)
        await self.store.create(self.path(lid), metadata.to_json(), make_parents=True)
        return lid, 0

    async def read(self, ledger_id: int, *, fresh: bool = False) -> tuple[LedgerMetadata, int]:
        """Metadata and its version; NoNodeError if the ledger does not exist. ``fresh``
        syncs first: the answer holds every change that completed before the call, even
        on a ZooKeeper server behind the leader (a follower of an unbounded ledger)."""
        path = self.path(ledger_id)
        if fresh:
            await self.store.sync(path)
        raw, stat = await self.store.get(path)
        return LedgerMetadata.from_json(raw, path), stat.version

    async def write(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """Compare-and-set write; BadVersionError if the version moved. Returns the new one."""
        stat = await self.store.set(self.path(ledger_id), metadata.to_json(), version)
        return stat.version

    async def update(self, ledger_id: int,
                     change: Callable[[LedgerMetadata], LedgerMetadata]) -> tuple[LedgerMetadata, int]:
        """CAS loop: apply ``change`` until it lands or raises ChangeRejectedError."""
        return await cas_update(self.store, self.path(ledger_id), change,
                                decode=LedgerMetadata.from_json,
                                encode=LedgerMetadata.to_json)

    async def delete(self, ledger_id: int, version: int = -1) -> None:
        """Delete (CAS when ``version >= 0``); NoNodeError if already gone."""
        await self.store.delete(self.path(ledger_id), version)

    async def exists(self, ledger_id: int) -> bool:
        return await self.store.exists(self.path(ledger_id)) is not None

    async def iter_ledger_ids(self, start: int = 0, end: int | None = None) -> AsyncIterator[int]:
        """Ledger ids in ``[start, end)`` in increasing order, one directory at a time."""
        if self.layout == LedgerLayout.FLAT:
            for lid in self._leaf_ids(self.root, await self.store.children(self.root), start, end):
                yield lid
            return
        top = await self.store.children(self.root)
        legacy = sorted(n for n in top if len(n) == 2 and n.isdigit())
        long_ = sorted(n for n in top if len(n) == 3 and n.isdigit())
        for prefix_names, depth in ((legacy, 2), (long_, 4)):
            for name in prefix_names:
                async for lid in self._walk(f"{self.root}/{name}", depth - 1, start, end):
                    yield lid

    def _leaf_ids(self, path: str, names: list[str], start: int, end: int | None) -> list[int]:
        """The ledger ids among ``path``'s children ``names`` that fall in [start, end)."""
        ids = []
        for name in names:
            try:
                lid = ledger_id_from_path(self.root, self.layout, f"{path}/{name}")
            except ValueError:
                continue  # a fixed node (LAYOUT, available, ...) or a foreign one
            if lid >= start and (end is None or lid < end):
                ids.append(lid)
        return sorted(ids)

    async def _walk(self, path: str, depth: int, start: int, end: int | None) -> AsyncIterator[int]:
        try:
            names = await self.store.children(path)
        except NoNodeError:
            return  # deleted while we walked
        if depth == 0:
            for lid in self._leaf_ids(path, names, start, end):
                yield lid
            return
        for name in sorted(names):
            if name.isdigit():
                async for lid in self._walk(f"{path}/{name}", depth - 1, start, end):
                    yield lid

    async def listing(self, bookies: set[str]) -> list[int]:
        """The ledgers whose ensembles (any fragment) list one of ``bookies`` (reads
        every ledger's metadata; a ledger deleted meanwhile is skipped)."""
        out = []
        async for lid in self.iter_ledger_ids():
            try:
                md, _ = await self.read(lid)
            except NoNodeError:
                continue
            if any(b in bookies for _, ensemble in md.ensembles for b in ensemble):
                out.append(lid)
        return out

    @asynccontextmanager
    async def watch(self, ledger_id: int) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """Notifications that one ledger's metadata may have changed (re-read on each)."""
        async with self.store.watch(self.path(ledger_id), WatchKind.DATA) as events:
            yield events
