"""Underreplication queue, replication locks, the autorecovery switch and auditor election.

Layout under ``<root>/underreplication`` (BookKeeper's):

- ``ledgers/<4 x %04x>/urL%010d``: one node per underreplicated ledger, JSON
  ``{"format": 1, "missing_replicas": [...], "ctime_ms": ...}``;
- ``locks/urL%010d``: ephemeral; its holder is the one worker re-replicating the ledger;
- ``disable``: present means autorecovery is off;
- ``auditorelection/V_<seq>``: ephemeral-sequential candidates; the lowest is the
  auditor; every other candidate watches only its predecessor (no herd on hand-over).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from metadata.cas import cas_update
from metadata.errors import CorruptMetadataError, NodeExistsError, NoNodeError, SessionExpiredError
from metadata.paths import underreplicated_path
from metadata.store import MetadataStore, WatchKind

__all__ = ["AuditorElection", "UnderreplicatedLedger", "UnderreplicationManager"]


@dataclass(frozen=True, slots=True)
class UnderreplicatedLedger:
    ledger_id: int
    missing_replicas: tuple[str, ...]
    ctime_ms: int


def _decode(raw: bytes, path: str) -> UnderreplicatedLedger:
    try:
        doc = json.loads(raw)
        lid = int(path.rsplit("urL", 1)[1])
        return UnderreplicatedLedger(lid, tuple(str(b) for b in doc["missing_replicas"]),
                                     int(doc["ctime_ms"]))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CorruptMetadataError(path, f"not an underreplication record: {exc}") from exc


def _encode(rec: UnderreplicatedLedger) -> bytes:
    return json.dumps({"format": 1, "missing_replicas": sorted(rec.missing_replicas),
                       "ctime_ms": rec.ctime_ms}).encode()


class UnderreplicationManager:
    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.base = f"{root}/underreplication"
        self.root = root

    async def mark_underreplicated(self, ledger_id: int, missing: list[str]) -> None:
        """Add ``missing`` replicas to the ledger's record (created if absent)."""
        path = underreplicated_path(self.root, ledger_id)
        rec = UnderreplicatedLedger(ledger_id, tuple(sorted(set(missing))), int(time.time() * 1000))
        try:
            await self.store.create(path, _encode(rec), make_parents=True)
            return
        except NodeExistsError:
            pass

        def merge(cur: UnderreplicatedLedger) -> UnderreplicatedLedger:
            return UnderreplicatedLedger(ledger_id, tuple(sorted(set(cur.missing_replicas)
                                                                 | set(missing))), cur.ctime_ms)

        await cas_update(self.store, path, merge, decode=_decode, encode=_encode)

    async def get(self, ledger_id: int) -> UnderreplicatedLedger | None:
        path = underreplicated_path(self.root, ledger_id)
        try:
            raw, _ = await self.store.get(path)
        except NoNodeError:
            return None
        return _decode(raw, path)

    async def list_underreplicated(self) -> AsyncIterator[UnderreplicatedLedger]:
        """Every record, walking the four hex levels one directory at a time."""
        async def walk(path: str, depth: int) -> AsyncIterator[str]:
            try:
                names = sorted(await self.store.children(path))
            except NoNodeError:
                return
            for name in names:
                if depth == 0:
                    if name.startswith("urL"):
                        yield f"{path}/{name}"
                else:
                    async for p in walk(f"{path}/{name}", depth - 1):
                        yield p

        async for path in walk(f"{self.base}/ledgers", 4):
            try:
                raw, _ = await self.store.get(path)
            except NoNodeError:
                continue
            yield _decode(raw, path)

    def _lock_path(self, ledger_id: int) -> str:
        return f"{self.base}/locks/urL{ledger_id:010d}"

    async def acquire_lock(self, ledger_id: int) -> bool:
        """Try to become the one worker of this ledger; False if another holds it."""
        try:
            await self.store.create(self._lock_path(ledger_id), ephemeral=True)
            return True
        except NodeExistsError:
            return False

    async def release_lock(self, ledger_id: int) -> None:
        try:
            _, stat = await self.store.get(self._lock_path(ledger_id))
        except NoNodeError:
            return
        if stat.ephemeral_owner == self.store.session_id:
            try:
                await self.store.delete(self._lock_path(ledger_id))
            except NoNodeError:
                pass

    async def mark_replicated(self, ledger_id: int) -> None:
        """The ledger is whole again: delete its record and release our lock."""
        try:
            await self.store.delete(underreplicated_path(self.root, ledger_id))
        except NoNodeError:
            pass
        await self.release_lock(ledger_id)

    # -- the autorecovery switch -------------------------------------------------------

    async def is_enabled(self) -> bool:
        return await self.store.exists(f"{self.base}/disable") is None

    async def set_enabled(self, enabled: bool) -> None:
        path = f"{self.base}/disable"
        try:
            if enabled:
                await self.store.delete(path)
            else:
                await self.store.create(path, b"")
        except (NoNodeError, NodeExistsError):
            pass

    async def wait_enabled(self) -> None:
        """Return once autorecovery is enabled (at once if it is)."""
        async with self.store.watch(f"{self.base}/disable", WatchKind.DATA) as events:
            async for _ in events:
                if await self.is_enabled():
                    return

    async def wait_disabled(self) -> None:
        async with self.store.watch(f"{self.base}/disable", WatchKind.DATA) as events:
            async for _ in events:
                if not await self.is_enabled():
                    return


class AuditorElection:
    """Candidacy in the auditor election for one process."""

    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.base = f"{root}/underreplication/auditorelection"

    @asynccontextmanager
    async def candidacy(self, bookie_id: str) -> AsyncIterator[_Candidate]:
        """Stand for election; the node is removed on exit (shielded)."""
        node = await self.store.create(f"{self.base}/V_", bookie_id.encode(), ephemeral=True,
                                       sequential=True)
        try:
            yield _Candidate(self, node.rsplit("/", 1)[1])
        finally:
            with trio.move_on_after(5, shield=True):
                try:
                    await self.store.delete(node)
                except (NoNodeError, SessionExpiredError):
                    pass  # gone with the session already

    async def current_auditor(self) -> str | None:
        names = sorted(await self.store.children(self.base))
        for name in names:
            try:
                raw, _ = await self.store.get(f"{self.base}/{name}")
                return raw.decode()
            except NoNodeError:
                continue
        return None


@dataclass
class _Candidate:
    election: AuditorElection
    name: str

    async def wait_elected(self) -> None:
        """Return once this candidate is the lowest node; watches only its predecessor.

        Raises NoNodeError if our own node vanished (session expired): stand again.
        """
        store, base = self.election.store, self.election.base
        while True:
            names = sorted(await store.children(base))
            if self.name not in names:
                raise NoNodeError(f"{base}/{self.name}")
            index = names.index(self.name)
            if index == 0:
                return
            predecessor = f"{base}/{names[index - 1]}"
            async with store.watch(predecessor, WatchKind.DATA) as events:
                async for _ in events:
                    if await store.exists(predecessor) is None:
                        break
