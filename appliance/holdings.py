"""LedgerHoldings: one page of what this bookie holds, for rebuilding lost metadata.

A bookie knows, per ledger, which entry ids it stores, whether the ledger is fenced,
its term, the highest LAC its entries carry, and its master key (of which only a check
leaves: the metadata's ``password_check``). ``metadata rebuild`` asks every bookie for
this, page by page (``LedgerHoldingsRequest``), and works out the ledgers' metadata.

Paging: ledgers in increasing id order from the request's ``first_ledger_id`` (entry
ids of that first ledger from ``first_entry_id``); a page ends after ``max_ledgers``
ledgers, ``max_ranges`` ranges or ``SCAN_BUDGET`` entry ids looked at (a bookie caps
the first two at ``MAX_LEDGERS`` and ``MAX_RANGES``), so one reply stays bounded
whatever the peer asks and a ledger of millions of entries takes several pages. Index
pages are read off the event loop (``page_in``) in chunks of ``CHUNK`` entries.

``entry_ranges`` (pure) turns presence into ranges.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from ledgerd.disk.storage import LedgerStorage
from ledgerd.metadata.ledger import password_check
from ledgerd.wire.layouts import KEY_CHECK_SIZE
from ledgerd.wire.messages import (
    HeldLedger,
    HeldRange,
    HoldingFlags,
    LedgerHoldingsRequest,
    LedgerHoldingsResponse,
)

__all__ = ["MAX_LEDGERS", "MAX_RANGES", "SCAN_BUDGET", "entry_ranges", "list_holdings"]

MAX_LEDGERS = 10_000  # ledgers in one reply (about 650 KB)
MAX_RANGES = 100_000  # ranges in one reply (2.4 MB, below the frame limit)
SCAN_BUDGET = 1 << 20  # entry ids looked at for one reply
CHUNK = 4096


def entry_ranges(ids: Iterable[int]) -> list[tuple[int, int]]:
    """Increasing entry ids as inclusive ``(first, last)`` ranges."""
    out: list[tuple[int, int]] = []
    for e in ids:
        if out and e == out[-1][1] + 1:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


def key_check(master_key: bytes) -> bytes:
    """The metadata's password check of a master key, as 32 bytes (zeros: no key)."""
    if not master_key:
        return bytes(KEY_CHECK_SIZE)
    return bytes.fromhex(password_check(master_key))


async def list_holdings(storage: LedgerStorage, req: LedgerHoldingsRequest
                        ) -> LedgerHoldingsResponse:
    """One page (see the module doc). A ledger deleted while listed is left out. If
    cancelled, nothing changed (index pages read in may stay cached)."""
    max_ledgers = max(1, min(req.max_ledgers, MAX_LEDGERS))
    max_ranges = max(1, min(req.max_ranges, MAX_RANGES))
    ids = [lid for lid in storage.list_ledgers() if lid >= req.first_ledger_id]
    ledgers: list[HeldLedger] = []
    ranges: list[HeldRange] = []
    scanned = 0
    for n, lid in enumerate(ids):
        if len(ledgers) >= max_ledgers:
            return _page(ledgers, ranges, lid, 0)
        idx = storage.ledger(lid)
        if idx is None:
            continue
        flags = (HoldingFlags.FENCED if idx.fenced else 0) | (
            HoldingFlags.HAS_KEY if idx.master_key else 0)
        lac = storage.lac(lid) if idx.last_entry_id >= 0 else idx.lac
        ledgers.append(HeldLedger(ledger_id=lid, flags=int(flags), term=idx.term, lac=lac,
                                  last_entry_id=idx.last_entry_id,
                                  key_check=key_check(idx.master_key)))
        first = req.first_entry_id if n == 0 and lid == req.first_ledger_id else 0
        e = max(0, first)
        current: tuple[int, int] | None = None
        while e <= idx.last_entry_id:
            chunk_end = min(idx.last_entry_id, e + CHUNK - 1)
            await storage.page_in(lid, e, chunk_end - e + 1)
            if storage.ledger(lid) is not idx:
                break  # deleted (or re-created) meanwhile
            for eid in range(e, chunk_end + 1):
                if not storage.has_entry(lid, eid):
                    continue
                if current is not None and eid == current[1] + 1:
                    current = (current[0], eid)
                    continue
                if current is not None:
                    ranges.append(HeldRange(ledger_id=lid, first_entry_id=current[0],
                                            last_entry_id=current[1]))
                    if len(ranges) >= max_ranges:
                        return _page(ledgers, ranges, lid, eid)
                current = (eid, eid)
            scanned += chunk_end - e + 1
            e = chunk_end + 1
            if scanned >= SCAN_BUDGET and e <= idx.last_entry_id:
                if current is not None:
                    ranges.append(HeldRange(ledger_id=lid, first_entry_id=current[0],
                                            last_entry_id=current[1]))
                return _page(ledgers, ranges, lid, e)
            await trio.sleep(0)
        if current is not None:
            ranges.append(HeldRange(ledger_id=lid, first_entry_id=current[0],
                                    last_entry_id=current[1]))
            if len(ranges) >= max_ranges and n + 1 < len(ids):
                return _page(ledgers, ranges, ids[n + 1], 0)
    return _page(ledgers, ranges, -1, -1)


def _page(ledgers: list[HeldLedger], ranges: list[HeldRange], next_ledger: int,
          next_entry: int) -> LedgerHoldingsResponse:
    return LedgerHoldingsResponse(next_ledger_id=next_ledger, next_entry_id=next_entry,
                                  ledgers=tuple(ledgers), ranges=tuple(ranges))
