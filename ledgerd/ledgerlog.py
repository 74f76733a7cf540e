"""Logs of ledgers: a named, ordered ledger list under ``/logs/<name>``, changed by CAS.

A log is read as its ledgers one after another. Writing follows DESIGN §6:

- ``open_log_writer`` fences the log's last two ledgers (opening them with recovery
  closes any that a previous writer left open), creates a ledger, and adds it to the
  list with compare-and-set. The old writer's next add fails with LedgerFencedError.
- The writer rolls to a new ledger once the current one holds ``roll_entries`` entries
  or ``roll_bytes`` bytes: the new ledger goes onto the list first (a CAS that checks the
  list still ends with ours), then the old one is closed.
- ``append_ledgers`` adds ledgers written elsewhere (the Spark writer's commit) with one
  CAS, after fencing the log's tail so no writer keeps adding behind them.
- ``truncate`` drops whole ledgers before a position and deletes them.

A position is ``(ledger id, entry id)``; the order of positions is the list's order.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledgerd.base.logs import fields
from ledgerd.errors import LedgerdError, NoSuchLedgerError
from metadata.errors import NodeExistsError, NoNodeError
from metadata.logs import LogRecord
from wire.entry import Entry
from wire.status import FencedError

if TYPE_CHECKING:
    from ledgerd.client import Client
    from ledgerd.handles import WriteHandle

__all__ = ["LogFencedError", "LogPosition", "LogWriter", "NoSuchLogError", "append_ledgers",
           "log_ledgers", "log_segments", "open_log_writer", "read_log", "truncate_log"]

log = logging.getLogger(__name__)

FENCE_TAIL = 2  # ledgers at the end of the list a new writer fences


class NoSuchLogError(LedgerdError):
    def __init__(self, name: str) -> None:
        super().__init__(f"log {name!r} does not exist")
        self.name = name


class LogFencedError(FencedError):
    """Another writer (or a committed batch) took over the log: this writer is done."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"log {name!r}: {reason}")
        self.name = name


@dataclass(frozen=True, slots=True)
class LogPosition:
    ledger_id: int
    entry_id: int


async def log_ledgers(client: Client, name: str) -> tuple[int, ...]:
    """The log's ledger ids in order; NoSuchLogError names a missing log."""
    try:
        record, _ = await client.logs.get(name)
    except NoNodeError:
        raise NoSuchLogError(name) from None
    return record.ledgers


async def _ensure(client: Client, name: str, create: bool) -> None:
    if not create:
        await log_ledgers(client, name)
        return
    try:
        await client.logs.create(name)
    except NodeExistsError:
        pass


async def _fence(client: Client, ledger_ids: Iterable[int], password: bytes | str) -> None:
    """Open each ledger with recovery: an open one is fenced and closed."""
    for lid in ledger_ids:
        try:
            md = await client.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue  # deleted (truncated) already: nothing can be added to it
        if not md.is_closed:
            await client.open_ledger(lid, password, recovery=True)


def _append_after(tail: int | None, new: tuple[int, ...],
                  name: str) -> Callable[[LogRecord], LogRecord]:
    """A CAS change adding ``new`` only while the list still ends with ``tail`` (None:
    is still empty)."""
    def change(record: LogRecord) -> LogRecord:
        last = record.ledgers[-1] if record.ledgers else None
        if last != tail:
            raise LogFencedError(name, f"the list no longer ends with ledger {tail} (it ends "
                                       f"{list(record.ledgers[-3:])}); another writer took over")
        return LogRecord(record.ledgers + new)
    return change


async def append_ledgers(client: Client, name: str, ledger_ids: Iterable[int], *,
                         password: bytes | str = b"", create: bool = True) -> tuple[int, ...]:
    """Add closed ledgers to the end of the log with one CAS; returns the new list.

    The log's last ledgers are fenced first, so a writer still adding to the tail fails
    instead of writing behind the new ledgers."""
    new = tuple(ledger_ids)
    for lid in new:
        if not (await client.ledger_metadata(lid)).is_closed:
            raise LedgerdError(f"log {name!r}: ledger {lid} must be closed before it is "
                               "added to a log")
    await _ensure(client, name, create)
    await _fence(client, (await log_ledgers(client, name))[-FENCE_TAIL:], password)

    def change(record: LogRecord) -> LogRecord:
        return LogRecord(record.ledgers + new)

    record, _ = await client.logs.update(name, change)
    log.info("log_ledgers_appended", extra=fields(log=name, ledgers=",".join(map(str, new))))
    return record.ledgers


async def truncate_log(client: Client, name: str, before_ledger: int) -> list[int]:
    """Drop (and delete) every ledger listed before ``before_ledger``; returns them."""
    dropped: list[int] = []

    def change(record: LogRecord) -> LogRecord:
        if before_ledger not in record.ledgers:
            raise LedgerdError(f"log {name!r} has no ledger {before_ledger}")
        cut = record.ledgers.index(before_ledger)
        dropped[:] = record.ledgers[:cut]
        return LogRecord(record.ledgers[cut:]) if cut else record

    try:
        await client.logs.update(name, change)
    except NoNodeError:
        raise NoSuchLogError(name) from None
    for lid in dropped:
        try:
            await client.delete_ledger(lid)
        except NoSuchLedgerError:
            pass
    return dropped


def log_segments(name: str, ledgers: tuple[int, ...],
                 start: LogPosition | None) -> list[tuple[int, int]]:
    """``(ledger, first entry)`` for each ledger a read from ``start`` visits."""
    if start is None:
        return [(lid, 0) for lid in ledgers]
    if start.ledger_id not in ledgers:
        raise LedgerdError(f"log {name!r} has no ledger {start.ledger_id} (truncated, or "
                           "never in this log)")
    begin = ledgers.index(start.ledger_id)
    return [(lid, start.entry_id if i == begin else 0)
            for i, lid in enumerate(ledgers) if i >= begin]


async def read_log(client: Client, name: str, password: bytes | str = b"", *,
                   start: LogPosition | None = None) -> AsyncIterator[Entry]:
    """Every readable entry of the log in order, from ``start`` (inclusive); closed
    ledgers to their end, an open one to its LAC. Nothing is fenced."""
    for lid, first in log_segments(name, await log_ledgers(client, name), start):
        rh = await client.open_ledger(lid, password, recovery=False)
        last = rh.last_add_confirmed if rh.is_closed else await rh.read_lac()
        if first <= last:
            async for entry in rh.read(first, last):
                yield entry


class LogWriter:
    """Appends to a log; see the module docstring. Not safe for concurrent appends from
    several tasks (positions would interleave across a roll)."""

    def __init__(self, client: Client, name: str, handle: WriteHandle, *, password: bytes | str,
                 quorums: tuple[int, int, int], roll_entries: int, roll_bytes: int) -> None:
        self.client = client
        self.name = name
        self.handle = handle
        self.password = password
        self.quorums = quorums
        self.roll_entries = roll_entries
        self.roll_bytes = roll_bytes
        self.closed = False

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    def _due(self) -> bool:
        h = self.handle
        return ((self.roll_entries > 0 and h.last_add_confirmed + 1 >= self.roll_entries)
                or (self.roll_bytes > 0 and h.length >= self.roll_bytes))

    async def append(self, data: bytes) -> LogPosition:
        return (await self.append_many([data]))[0]

    async def append_many(self, items: Iterable[bytes]) -> list[LogPosition]:
        if self.closed:
            raise LogFencedError(self.name, "the writer is closed")
        out: list[LogPosition] = []
        batch: list[bytes] = []
        for data in items:
            batch.append(data)
            if self.roll_entries > 0 and (self.handle.last_add_confirmed + 1 + len(batch)
                                          >= self.roll_entries):
                out += await self._write(batch)
                batch = []
        if batch:
            out += await self._write(batch)
        return out

    async def _write(self, batch: list[bytes]) -> list[LogPosition]:
        lid = self.handle.ledger_id
        ids = await self.handle.append_many(batch)
        if self._due():
            await self.roll()
        return [LogPosition(lid, eid) for eid in ids]

    async def roll(self) -> None:
        """Start a new ledger: onto the list first (only if it still ends with ours),
        then close the old one."""
        old = self.handle
        e, qw, qa = self.quorums
        new = await self.client.create_ledger(e, qw, qa, password=self.password)
        try:
            await self.client.logs.update(
                self.name, _append_after(old.ledger_id, (new.ledger_id,), self.name))
        except BaseException:
            await self.client.delete_ledger(new.ledger_id)
            raise
        self.handle = new
        await old.close()
        log.info("log_rolled", extra=fields(log=self.name, closed=old.ledger_id,
                                            ledger=new.ledger_id))

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.handle.close()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def open_log_writer(client: Client, name: str, ensemble_size: int | None = None,
                          write_quorum: int | None = None, ack_quorum: int | None = None, *,
                          password: bytes | str = b"", roll_entries: int = 0,
                          roll_bytes: int = 256 << 20, create: bool = True) -> LogWriter:
    """Become the log's writer: fence its last two ledgers, add a new one (CAS)."""
    cfg = client.config
    quorums = (cfg.ensemble_size if ensemble_size is None else ensemble_size,
               cfg.write_quorum_size if write_quorum is None else write_quorum,
               cfg.ack_quorum_size if ack_quorum is None else ack_quorum)
    await _ensure(client, name, create)
    for _ in range(10):
        ledgers = await log_ledgers(client, name)
        await _fence(client, ledgers[-FENCE_TAIL:], password)
        handle = await client.create_ledger(*quorums, password=password)
        tail = ledgers[-1] if ledgers else None
        try:
            await client.logs.update(name, _append_after(tail, (handle.ledger_id,), name))
        except LogFencedError:
            await client.delete_ledger(handle.ledger_id)  # another writer got in first
            continue
        except BaseException:
            await client.delete_ledger(handle.ledger_id)
            raise
        log.info("log_writer_opened", extra=fields(log=name, ledger=handle.ledger_id))
        return LogWriter(client, name, handle, password=password, quorums=quorums,
                         roll_entries=roll_entries, roll_bytes=roll_bytes)
    raise LogFencedError(name, "gave up after 10 writers raced to open the log")
