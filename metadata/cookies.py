"""Bookie cookies in ZooKeeper: ``<root>/cookies/<bookie id>``, versioned.

The cookie's content (directories, instance id) is built and checked by the storage
layer; here it is opaque bytes with compare-and-set updates.
"""

from __future__ import annotations

from ledgerd.metadata.ledger import check_bookie_id
from ledgerd.metadata.store import MetadataStore

__all__ = ["CookieStore"]


class CookieStore:
    def __init__(self, store: MetadataStore, root: str = "/ledgers") -> None:
        self.store = store
        self.root = root

    def path(self, bookie_id: str) -> str:
        return f"{self.root}/cookies/{check_bookie_id(bookie_id)}"

    async def get(self, bookie_id: str) -> tuple[bytes, int] | None:
        """The cookie and its version, or None if this bookie has none."""
        if await self.store.exists(self.path(bookie_id)) is None:
            return None
        data, stat = await self.store.get(self.path(bookie_id))
        return data, stat.version

    async def create(self, bookie_id: str, cookie: bytes) -> int:
        """Write a first cookie; NodeExistsError if one exists."""
        await self.store.create(self.path(bookie_id), cookie)
        return 0

    async def update(self, bookie_id: str, cookie: bytes, version: int) -> int:
        """Replace the cookie (compare-and-set on ``version``); returns the new version."""
        return (await self.store.set(self.path(bookie_id), cookie, version)).version

    async def delete(self, bookie_id: str, version: int = -1) -> None:
        await self.store.delete(self.path(bookie_id), version)
