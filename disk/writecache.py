"""The db storage's entry caches: the write cache and the read-ahead cache
(BookKeeper's DbLedgerStorage ``WriteCache`` and ``ReadCache``).

**Write cache.** An add puts the entry here (and into the journal); a checkpoint swaps
the cache for an empty one and writes the swapped one into the entry log sorted by
(ledger, entry), so each ledger's entries of a flush are one contiguous run on disk, and
records their locations in one sorted index transaction. Reads look in the active cache,
then in the one being flushed. The cache is bounded: past ``max_bytes`` an add writes
through to the entry log as the interleaved storage does (unsorted, never blocked), and
past half of it the storage asks for an early checkpoint.

**Read-ahead cache.** A read that misses both write caches reads its entry from the
entry log and, when the ledger's next entries follow it in the same log (they do after a
sorted flush), up to ``batch`` of them with the same read; those wait here for the
reader's next requests. Bounded by bytes, oldest first out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

__all__ = ["ReadAheadCache", "WriteCache"]


class WriteCache:
    """Entries by ledger, then entry id; ``size`` counts their bytes."""

    __slots__ = ("count", "ledgers", "size")

    def __init__(self) -> None:
        self.ledgers: dict[int, dict[int, bytes]] = {}
        self.size = 0
        self.count = 0

    def put(self, ledger_id: int, entry_id: int, entry: bytes) -> None:
        d = self.ledgers.get(ledger_id)
        if d is None:
            d = self.ledgers[ledger_id] = {}
        old = d.get(entry_id)
        if old is not None:
            self.size -= len(old)
            self.count -= 1
        d[entry_id] = entry
        self.size += len(entry)
        self.count += 1

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        d = self.ledgers.get(ledger_id)
        return None if d is None else d.get(entry_id)

    def discard(self, ledger_id: int, entry_id: int) -> None:
        d = self.ledgers.get(ledger_id)
        if d is not None:
            old = d.pop(entry_id, None)
            if old is not None:
                self.size -= len(old)
                self.count -= 1

    def drop(self, ledger_id: int, lo: int = 0, hi: int = (1 << 63) - 1) -> None:
        """Forget the ledger's entries ``lo``..``hi`` (all of them by default)."""
        d = self.ledgers.get(ledger_id)
        if d is None:
            return
        gone = [e for e in d if lo <= e <= hi]
        for e in gone:
            self.size -= len(d.pop(e))
        self.count -= len(gone)
        if not d:
            del self.ledgers[ledger_id]

    def __len__(self) -> int:
        return self.count


class ReadAheadCache:
    """(ledger, entry) -> bytes, at most ``max_bytes``; the oldest insertions go first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self.by_ledger: dict[int, set[int]] = {}
        self.size = 0
        self.hits = 0
        self.misses = 0
        self.inserted = 0  # entries read ahead
        self.evicted = 0

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        data = self.entries.get((ledger_id, entry_id))
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        return data

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        n = len(data)
        if n > self.max_bytes:
            return
        key = (ledger_id, entry_id)
        old = self.entries.pop(key, None)
        if old is not None:
            self.size -= len(old)
        else:
            self.by_ledger.setdefault(ledger_id, set()).add(entry_id)
        self.entries[key] = data
        self.size += n
        self.inserted += 1
        while self.size > self.max_bytes:
            (lid, eid), old = self.entries.popitem(last=False)
            self.size -= len(old)
            self.evicted += 1
            ids = self.by_ledger[lid]
            ids.discard(eid)
            if not ids:
                del self.by_ledger[lid]

    def drop(self, ledger_id: int, lo: int = 0, hi: int = (1 << 63) - 1) -> None:
        """Forget the ledger's entries ``lo``..``hi`` (a delete, truncate or trim)."""
        ids = self.by_ledger.get(ledger_id)
        if not ids:
            return
        for eid in [e for e in ids if lo <= e <= hi]:
            ids.discard(eid)
            self.size -= len(self.entries.pop((ledger_id, eid)))
        if not ids:
            del self.by_ledger[ledger_id]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
