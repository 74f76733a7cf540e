"""Log records: ``<logs root>/<name>`` holds the ordered list of a log's ledgers.

A log built from ledgers is a name and a ledger list, changed only by compare-and-set:
a writer that opens the log appends a new ledger; truncation drops whole ledgers from
the front. JSON ``{"format": 1, "ledgers": [id, ...]}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from metadata.cas import cas_update
from metadata.errors import CorruptMetadataError
from metadata.store import MetadataStore

__all__ = ["LogRecord", "LogStore"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True, slots=True)
class LogRecord:
    ledgers: tuple[int, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps({"format": 1, "ledgers": list(self.ledgers)}).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> LogRecord:
        try:
            doc = json.loads(raw)
            if doc.get("format") != 1:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            ledgers = tuple(doc["ledgers"])
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                       for x in ledgers):
                raise ValueError("ledgers must be non-negative integers")
            return cls(ledgers)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(path, f"not a log record: {exc}") from exc


class LogStore:
    def __init__(self, store: MetadataStore, root: str = "/logs") -> None:
        self.store = store
        self.root = root

    def path(self, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"invalid log name {name!r} (letters, digits, . _ -; up to 200)")
        return f"{self.root}/{name}"

    async def create(self, name: str, record: LogRecord = LogRecord()) -> int:
        await self.store.create(self.path(name), record.to_json(), make_parents=True)
        return 0

    async def get(self, name: str) -> tuple[LogRecord, int]:
        path = self.path(name)
        raw, stat = await self.store.get(path)
        return LogRecord.from_json(raw, path), stat.version

    async def write(self, name: str, record: LogRecord, version: int) -> int:
        return (await self.store.set(self.path(name), record.to_json(), version)).version

    async def update(self, name: str,
                     change: Callable[[LogRecord], LogRecord]) -> tuple[LogRecord, int]:
        return await cas_update(self.store, self.path(name), change,
                                decode=LogRecord.from_json, encode=LogRecord.to_json)

    async def delete(self, name: str, version: int = -1) -> None:
        await self.store.delete(self.path(name), version)

    async def names(self) -> list[str]:
        if await self.store.exists(self.root) is None:
            return []
        return sorted(await self.store.children(self.root))
