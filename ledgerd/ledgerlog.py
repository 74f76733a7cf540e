"""Logs of ledgers: a named, ordered ledger list under ``/logs/<name>``, changed by CAS.

A log is read as its ledgers one after another. A client reaches its cluster's logs as
``client.logs`` (a ``Logs``: ``open_writer``, ``read``, ``follow``, ``append_ledgers``,
``truncate``, ...). Writing follows DESIGN §6:

- ``open_writer`` fences the log's last two ledgers (opening them with recovery
  closes any that a previous writer left open), creates a ledger, and adds it to the
  list with compare-and-set. The old writer's next add fails with LedgerFencedError.
- The writer rolls to a new ledger once the current one holds ``roll_entries`` entries
  or ``roll_bytes`` bytes (or, at an append, its first entry is ``roll_interval`` old),
  right after that append: the new ledger goes onto the list first (a CAS that checks
  the list still ends with ours), then the old one is closed. An entry that would take
  a ledger holding entries past ``roll_bytes`` goes to a new one (rolled first; the
  entries of the same call before it are written to the old one), so a ledger exceeds
  ``roll_bytes`` only by an entry larger than that. A roll that fails fails the append
  it followed (or came in), although that append's entries before it are in the log
  (the caller drops the writer; the next one fences and closes the ledger).
  Rolls by age wait while the list holds ``AGE_ROLL_MAX_LEDGERS`` ledgers (the list
  is one ZooKeeper record, about 100,000 fit; logged once per writer, read again at
  most once a minute), so a short ``roll_interval`` cannot fill it; rolls by size and
  count go on.
- ``append_ledgers`` adds ledgers written elsewhere (the Spark writer's commit) with one
  CAS, after fencing the log's tail so no writer keeps adding behind them.
- ``truncate`` drops whole ledgers before a position and deletes them.

**Log headers** (``metadata.logheader``): a writer's new ledger gets, as entry 0 and
before it goes onto the list, a header naming the log, the ledger's position in it
(``seq``, counted from the log's creation), the ledger before it and the offset of its
first log entry; the ledger's metadata marks it (``first_log_entry`` is then 1) and every
reader here skips it, so it is not a log entry and has no offset. ``metadata rebuild``
puts the log back from these headers when no snapshot has it. Ledgers added with
``append_ledgers`` (written elsewhere), logs written before headers and logs backed by an
unbounded ledger have none (``header=False`` leaves them out on purpose). A writer may
add its own bytes to each header (``header_extra``: the Kafka gateway puts its topic
there, so ``metadata rebuild`` makes the topic record again), and each header records
the log's ``writers`` count (the writer's term) so a rebuilt log counts on from it.

A position is ``(ledger id, entry id)``; the order of positions is the list's order.
Every entry also has a dense 64-bit **offset**: the count of entries before it in the
log. A ledger's first offset is the record's ``base`` (entries truncated away) plus the
entry counts of the closed ledgers listed before it, so offsets never move.

A log can instead be backed by **one unbounded ledger** (``open_writer(...,
unbounded=True)`` when the log is created): a new writer takes the ledger over (raising
its term) instead of adding a ledger, positions are ``(that ledger, entry)``, and the
offset of entry *e* is *e* minus the no-op entries before it.

**Readers**: ``follow`` is an async iterator of ``LogEntry`` (position, offset,
payload) that returns every entry once, in order, across ledgers and terms, waits for
new ones (long polls), and never shows an entry past the LAC. It starts at the start,
the end, a position, an offset, or a named cursor (``open_cursor``), which stores a
consumer's next position durably with compare-and-set (``open_cursor``).

This module knows the client only as ``LedgerClient`` (the ledger calls it uses): the
client imports it, not the other way round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import trio

from ledgerd.base.logs import fields
from ledgerd.config import ClientConfig
from ledgerd.errors import LedgerdError, NoSuchLedgerError
from ledgerd.handles import ReadHandle, WriteHandle
from ledgerd.metadata.errors import BadVersionError, NodeExistsError, NoNodeError
from ledgerd.metadata.ledger import LedgerMetadata
from ledgerd.metadata.logheader import (
    HEADER_KEY,
    LogHeader,
    decode_log_header,
    encode_log_header,
    first_log_entry,
)
from ledgerd.metadata.logs import CursorRecord, LogRecord, LogStore
from ledgerd.metadata.store import MetadataStore
from ledgerd.wire.entry import Entry
from ledgerd.wire.status import FencedError

__all__ = ["AGE_ROLL_MAX_LEDGERS", "MAX_DEFERRED", "BatchAlreadyAppendedError", "LedgerClient",
           "LogCursor", "LogEntry", "LogFencedError", "LogPosition", "LogSegment", "LogWriter",
           "Logs", "NoSuchLogError",
           "Start", "entry_for_offset", "log_entry_count", "log_segments"]

log = logging.getLogger(__name__)
# a roll by age waits while the log's list holds this many ledgers (a tenth of what
# its one ZooKeeper record holds); read the list again this often while it waits
AGE_ROLL_MAX_LEDGERS = 10_000
AGE_ROLL_RECHECK_S = 60.0
# the most ledgers a log's record keeps waiting for deletion (``deferred``); a drop
# that would keep more deletes the earliest due at once
MAX_DEFERRED = 1000

FENCE_TAIL = 2  # ledgers at the end of the list a new writer fences


class LedgerClient(Protocol):
    """The client calls logs are made of (``ledgerd.Client`` is one): logs know ledgers
    only through these, so this module never imports the client."""

    config: ClientConfig
    store: MetadataStore

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata: ...

    async def open_ledger(self, ledger_id: int, password: bytes | str = b"", *,
                          recovery: bool = True) -> ReadHandle: ...

    async def create_ledger(self, ensemble_size: int | None = None,
                            write_quorum: int | None = None, ack_quorum: int | None = None, *,
                            password: bytes | str = b"",
                            custom_metadata: Mapping[str, str] | None = None,
                            ) -> WriteHandle: ...

    async def create_unbounded_ledger(self, ensemble_size: int | None = None,
                                      write_quorum: int | None = None,
                                      ack_quorum: int | None = None, *,
                                      password: bytes | str = b"") -> WriteHandle: ...

    async def take_over_ledger(self, ledger_id: int,
                               password: bytes | str = b"") -> WriteHandle: ...

    async def trim_ledger(self, ledger_id: int, before_entry: int) -> LedgerMetadata: ...

    async def delete_ledger(self, ledger_id: int) -> None: ...


class NoSuchLogError(LedgerdError):
    def __init__(self, name: str) -> None:
        super().__init__(f"log {name!r} does not exist")
        self.name = name


class BatchAlreadyAppendedError(LedgerdError):
    """A numbered batch was appended to the log before (a replay): nothing changed."""

    def __init__(self, log: str, writer: str, batch: int, last: int) -> None:
        super().__init__(f"log {log!r}: writer {writer!r} already appended batch {batch} "
                         f"(its last is {last})")
        self.log, self.writer, self.batch, self.last = log, writer, batch, last


class LogFencedError(FencedError):
    """Another writer (or a committed batch) took over the log: this writer is done."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"log {name!r}: {reason}")
        self.name = name


@dataclass(frozen=True, slots=True)
class LogPosition:
    ledger_id: int
    entry_id: int


def _append_after(tail: int | None, new: tuple[int, ...], name: str, *,
                  writer: bool = False, seq: int | None = None
                  ) -> Callable[[LogRecord], LogRecord]:
    """A CAS change adding ``new`` only while the list still ends with ``tail`` (None:
    is still empty) and, given ``seq`` (its log header's), the new ledger still gets
    that position in the log; ``writer``: a new writer's first ledger, counted in
    ``writers``."""
    def change(record: LogRecord) -> LogRecord:
        last = record.ledgers[-1] if record.ledgers else None
        if last != tail:
            raise LogFencedError(name, f"the list no longer ends with ledger {tail} (it ends "
                                       f"{list(record.ledgers[-3:])}); another writer took over")
        if seq is not None and record.next_seq != seq:
            raise LogFencedError(name, f"the next ledger's position is {record.next_seq}, "
                                       f"not {seq}; another writer took over")
        if record.unbounded:
            raise LogFencedError(name, "the log is backed by an unbounded ledger")
        return replace(record, ledgers=record.ledgers + new,
                       writers=record.writers + 1 if writer else record.writers)
    return change


class _Deferral:
    """What a drop's compare-and-set writes as the record's deferred deletions
    (``apply``, run for each version it tries), and which ledgers the dropper deletes
    itself right after (``now``): every dropped one without a delay; with one, only
    those past ``MAX_DEFERRED`` (the earliest due), so the record stays bounded."""

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.now: tuple[int, ...] = ()

    def apply(self, record: LogRecord, dropped: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        if self.delay_ms <= 0:
            self.now = dropped
            return record.deferred
        due = int(time.time() * 1000) + self.delay_ms
        kept = sorted(record.deferred + tuple((lid, due) for lid in dropped),
                      key=lambda d: d[1])
        over = max(0, len(kept) - MAX_DEFERRED)
        self.now = tuple(lid for lid, _ in kept[:over])
        return tuple(kept[over:])


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


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry as a log reader returns it."""

    position: LogPosition
    offset: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class LogSegment:
    """One listed ledger: its first entry's offset (None while an earlier ledger is still
    open: not known yet), its entry count (None while it is open) and the entry id of
    its first log entry (1 when entry 0 is its log header)."""

    ledger_id: int
    first_offset: int | None
    count: int | None
    first_entry: int = 0


def log_entry_count(md: LedgerMetadata) -> int:
    """A closed ledger's log entries (its header, if any, is not one)."""
    return max(0, md.last_entry_id + 1 - first_log_entry(md.custom_metadata))


def entry_for_offset(md: LedgerMetadata, offset: int) -> int:
    """An unbounded ledger's entry id holding log offset ``offset`` (no-ops skipped)."""
    eid = offset
    for noop in md.noops:
        if noop <= eid:
            eid += 1
        else:
            break
    return eid


Start = Literal["start", "end"] | LogPosition | int


class LogCursor:
    """A consumer's durable position in a log (``Logs.open_cursor``): ``commit(entry)``
    stores "next read the entry after this one" by compare-and-set; a commit never moves
    the cursor backwards (a slower consumer sharing the name loses to a faster one)."""

    def __init__(self, store: LogStore, log_name: str, name: str,
                 record: CursorRecord | None, version: int | None) -> None:
        self.store = store
        self.log_name = log_name
        self.name = name
        self.record = record
        self.version = version

    @property
    def offset(self) -> int | None:
        """The next offset to read (None: never committed, reads from the start)."""
        return None if self.record is None else self.record.offset

    async def commit(self, entry: LogEntry) -> None:
        new = CursorRecord(entry.offset + 1, entry.position.ledger_id,
                           entry.position.entry_id + 1)
        logs = self.store
        while True:
            if self.record is not None and self.record.offset >= new.offset:
                return
            try:
                self.version = await logs.put_cursor(self.log_name, self.name, new,
                                                     self.version)
                self.record = new
                return
            except (BadVersionError, NodeExistsError):
                got = await logs.get_cursor(self.log_name, self.name)
                self.record, self.version = got if got is not None else (None, None)


class LogWriter:
    """Appends to a log; see the module docstring. Not safe for concurrent appends from
    several tasks (positions would interleave across a roll)."""

    def __init__(self, logs: Logs, name: str, handle: WriteHandle, *, password: bytes | str,
                 quorums: tuple[int, int, int], roll_entries: int, roll_bytes: int,
                 roll_interval: float = 0.0, unbounded: bool = False, epoch: int = 0,
                 header: tuple[int, int] | None = None, header_extra: bytes = b"",
                 listed: int = 0) -> None:
        self.logs = logs
        # this writer's term: a ledger-backed log's ``writers`` count after its open (one
        # more than any earlier writer's), an unbounded ledger's term
        self.epoch = epoch
        self.name = name
        self.handle = handle
        self.password = password
        self.quorums = quorums
        self.roll_entries = roll_entries
        self.roll_bytes = roll_bytes
        self.roll_interval = roll_interval
        self.unbounded = unbounded
        # when the current ledger took its first log entry (None: none yet): its age for
        # ``roll_interval``, as Kafka ages a segment from its first record, so a quiet
        # log does not roll a ledger for each entry that comes after a long pause
        self.opened_at: float | None = None
        self.closed = False
        # (seq, first offset) of the current ledger's log header; None: no headers
        self.header = header
        self.header_extra = header_extra  # carried by each of its ledgers' headers
        # the ledgers on the log's list as of this writer's last compare-and-set (or
        # read, while rolls by age wait for room), and when it was read for that
        self.listed = listed
        self._listed_read: float | None = None

    @property
    def ledger_id(self) -> int:
        return self.handle.ledger_id

    def _entries(self, handle: WriteHandle) -> int:
        """Log entries acknowledged in ``handle``'s ledger (its header is not one)."""
        return handle.last_add_confirmed + 1 - first_log_entry(handle.metadata.custom_metadata)

    def _due(self) -> bool:
        """The current ledger is full (by count or size)."""
        if self.unbounded:
            return False  # an unbounded ledger rolls fragments, not ledgers
        h = self.handle
        return ((self.roll_entries > 0 and self._entries(h) >= self.roll_entries)
                or (self.roll_bytes > 0 and h.length >= self.roll_bytes))

    def _aged(self) -> bool:
        """The current ledger's first entry is ``roll_interval`` old."""
        return (not self.unbounded and self.roll_interval > 0 and self.opened_at is not None
                and trio.current_time() - self.opened_at >= self.roll_interval)

    async def _room_to_age_roll(self) -> bool:
        """A roll by age adds a ledger to the list: only while it holds fewer than
        ``AGE_ROLL_MAX_LEDGERS`` (read again, at most every ``AGE_ROLL_RECHECK_S``,
        while it is full: retention may have shortened it)."""
        if self.listed < AGE_ROLL_MAX_LEDGERS:
            return True
        now = trio.current_time()
        if self._listed_read is not None and now - self._listed_read < AGE_ROLL_RECHECK_S:
            return False
        first = self._listed_read is None
        self._listed_read = now
        record, _ = await self.logs._record(self.name)
        self.listed = len(record.ledgers)
        if self.listed < AGE_ROLL_MAX_LEDGERS:
            self._listed_read = None
            return True
        if first:
            log.warning("log_age_rolls_wait", extra=fields(
                log=self.name, ledgers=self.listed, limit=AGE_ROLL_MAX_LEDGERS))
        return False

    def _overflows(self, pending: int, more: int) -> bool:
        """Would ``more`` bytes (the last of them one entry, after ``pending`` entries
        not written yet) take the current ledger past ``roll_bytes`` while it would
        hold other entries? (An empty ledger takes any one entry.)"""
        return (not self.unbounded and self.roll_bytes > 0
                and (pending > 0 or self._entries(self.handle) > 0)
                and self.handle.length + more > self.roll_bytes)

    async def append(self, data: bytes) -> LogPosition:
        return (await self.append_many([data]))[0]

    async def append_many(self, items: Iterable[bytes]) -> list[LogPosition]:
        if self.closed:
            raise LogFencedError(self.name, "the writer is closed")
        out: list[LogPosition] = []
        batch: list[bytes] = []
        pending = 0  # bytes in ``batch``
        for data in items:
            if self._overflows(len(batch), pending + len(data)):
                # the ledger holds entries and these would take it past roll_bytes:
                # what fits goes first, then (unless that filled it and it rolled) a
                # new ledger, as Kafka rolls before an append its segment cannot take
                if batch:
                    out += await self._write(batch)
                    batch, pending = [], 0
                if self._overflows(0, len(data)):
                    await self.roll()
            batch.append(data)
            pending += len(data)
            if not self.unbounded and self.roll_entries > 0 and (
                    self._entries(self.handle) + len(batch) >= self.roll_entries):
                out += await self._write(batch)
                batch, pending = [], 0
        if batch:
            out += await self._write(batch)
        return out

    async def _write(self, batch: list[bytes]) -> list[LogPosition]:
        lid = self.handle.ledger_id
        ids = await self.handle.append_many(batch)
        if self.opened_at is None:
            self.opened_at = trio.current_time()
        if self._due() or (self._aged() and await self._room_to_age_roll()):
            await self.roll()
        return [LogPosition(lid, eid) for eid in ids]

    async def roll(self) -> None:
        """Start a new ledger: onto the list first (only if it still ends with ours),
        then close the old one."""
        if self.unbounded:
            raise LedgerdError(f"log {self.name!r} is one unbounded ledger: it does not roll")
        old = self.handle
        client = self.logs.client
        header: tuple[int, int] | None = None
        if self.header is not None:
            # Every add to ``old`` was awaited: its acknowledged entries are its end.
            seq, first = self.header
            header = (seq + 1, -1 if first < 0 else first + self._entries(old))
        new = await self.logs._new_ledger(self.name, self.quorums, self.password,
                                          old.ledger_id, header, writers=self.epoch,
                                          extra=self.header_extra)
        try:
            record, _ = await self.logs.store.update(
                self.name, _append_after(old.ledger_id, (new.ledger_id,), self.name,
                                         seq=None if header is None else header[0]))
        except BaseException:
            with trio.move_on_after(5, shield=True):
                await client.delete_ledger(new.ledger_id)
            raise
        self.handle = new
        self.header = header
        self.opened_at = None
        self.listed = len(record.ledgers)
        await old.close()
        log.info("log_rolled", extra=fields(log=self.name, closed=old.ledger_id,
                                            ledger=new.ledger_id))

    async def close(self) -> None:
        """Close the writer. A ledger-backed log's current ledger is closed; an unbounded
        one stays open (another writer takes it over when it needs to)."""
        if not self.closed:
            self.closed = True
            if self.unbounded:
                await self.handle.abandon()
            else:
                await self.handle.close()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Logs:
    """The logs of a client's cluster, as ``client.logs`` (kazoo's recipe style: the
    recipe takes the client; the client does not know the recipe's calls). Each call
    names the log; see the module docstring for the rules."""

    def __init__(self, client: LedgerClient) -> None:
        self.client = client
        # Logs belong to their cluster: under its root, so a second cluster in the same
        # ZooKeeper keeps its own and metaformat wipes them with the ledgers they list.
        root = client.config.zk_ledgers_root_path
        self.store = LogStore(client.store, f"{root.rstrip('/')}/logs")

    async def names(self) -> list[str]:
        """Every log's name."""
        return await self.store.names()

    async def delete(self, name: str, *, delete_ledgers: bool = True) -> None:
        """Remove the log record (and, by default, its ledgers, those whose deletion was
        deferred too)."""
        ledgers = (await self._record(name))[0].all_ledgers()
        await self.store.delete(name)
        for lid in ledgers if delete_ledgers else ():
            try:
                await self.client.delete_ledger(lid)
            except NoSuchLedgerError:
                pass

    async def open_writer(self, name: str, ensemble_size: int | None = None,
                          write_quorum: int | None = None, ack_quorum: int | None = None, *,
                          password: bytes | str = b"", roll_entries: int = 0,
                          roll_bytes: int = 256 << 20, roll_interval: float = 0.0,
                          unbounded: bool | None = None, create: bool = True,
                          header: bool = True, header_extra: bytes = b"") -> LogWriter:
        """Become the log's writer.

        A ledger-backed log: fence its last two ledgers, add a new one (CAS). A log backed
        by an unbounded ledger: take the ledger over (raise its term). ``unbounded`` chooses
        the kind when the log is created (default: ledgers); for an existing log it must
        match (None: whatever the log is). ``roll_interval`` (seconds) rolls a ledger-backed
        log's ledger by age too (counted from its first entry), checked after each
        append. ``header`` (ledger-backed
        logs): each ledger this writer adds starts with a log header (the module doc),
        carrying ``header_extra`` (at most ``logheader.MAX_EXTRA`` bytes: what the caller
        wants ``metadata rebuild`` to find, e.g. the Kafka gateway's topic); False adds
        plain ledgers, whose log ``metadata rebuild`` cannot put back."""
        cfg = self.client.config
        quorums = (cfg.ensemble_size if ensemble_size is None else ensemble_size,
                   cfg.write_quorum_size if write_quorum is None else write_quorum,
                   cfg.ack_quorum_size if ack_quorum is None else ack_quorum)
        await self._ensure(name, create)
        record, _ = await self._record(name)
        if unbounded is None:
            unbounded = record.unbounded
        if record.ledgers and unbounded != record.unbounded:
            kind = "an unbounded ledger" if record.unbounded else "ledgers"
            raise LedgerdError(f"log {name!r} is backed by {kind}; its kind is chosen when it "
                               "is created")
        if unbounded:
            return await self._open_unbounded(name, record, quorums, password)
        for _ in range(10):
            record, _ = await self._record(name)
            ledgers = record.ledgers
            await self._fence(ledgers[-FENCE_TAIL:], password)
            tail = ledgers[-1] if ledgers else None
            place = (record.next_seq, await self._next_offset(name, record, password)) \
                if header else None
            handle = await self._new_ledger(name, quorums, password,
                                            -1 if tail is None else tail, place,
                                            writers=record.writers + 1, extra=header_extra)
            try:
                opened, _ = await self.store.update(name, _append_after(
                    tail, (handle.ledger_id,), name, writer=True,
                    seq=None if place is None else place[0]))
            except LogFencedError:
                await self.client.delete_ledger(handle.ledger_id)  # another writer got in first
                continue
            except BaseException:
                with trio.move_on_after(5, shield=True):
                    await self.client.delete_ledger(handle.ledger_id)
                raise
            log.info("log_writer_opened", extra=fields(log=name, ledger=handle.ledger_id,
                                                       epoch=opened.writers))
            return LogWriter(self, name, handle, password=password, quorums=quorums,
                             roll_entries=roll_entries, roll_bytes=roll_bytes,
                             roll_interval=roll_interval, epoch=opened.writers,
                             header=place, header_extra=header_extra,
                             listed=len(opened.ledgers))
        raise LogFencedError(name, "gave up after 10 writers raced to open the log")

    async def _new_ledger(self, name: str, quorums: tuple[int, int, int],
                          password: bytes | str, prev: int,
                          place: tuple[int, int] | None, *, writers: int = 0,
                          extra: bytes = b"", custom: Mapping[str, str] | None = None,
                          ) -> WriteHandle:
        """A new ledger for the log; with ``place = (seq, first offset)`` its entry 0 is
        the log header (with ``writers``, the log's count once it is listed, and
        ``extra``), written (acknowledged) before the ledger can go onto the list.
        If the header cannot be written the ledger is deleted; if cancelled, a ledger
        with only its header may remain, on no list (``metadata rebuild`` names it)."""
        if place is None:
            return await self.client.create_ledger(*quorums, password=password,
                                                   custom_metadata=custom)
        handle = await self.client.create_ledger(*quorums, password=password,
                                                 custom_metadata={**(custom or {}),
                                                                  HEADER_KEY: "1"})
        md = handle.metadata
        try:
            await handle.append(encode_log_header(LogHeader(
                name=name, seq=place[0], prev_ledger_id=prev, first_offset=place[1],
                ensemble_size=md.ensemble_size, write_quorum=md.write_quorum,
                ack_quorum=md.ack_quorum, writers=writers, extra=extra)))
        except BaseException:
            with trio.move_on_after(5, shield=True):
                await handle.abandon()
                await self.client.delete_ledger(handle.ledger_id)
            raise
        return handle

    async def _next_offset(self, name: str, record: LogRecord, password: bytes | str) -> int:
        """The offset the log's next ledger starts at, its last ledger closed (fenced):
        from that ledger's header and count, else from the layout (-1: not known)."""
        if not record.ledgers:
            return record.base
        tail = record.ledgers[-1]
        try:
            md = await self.client.ledger_metadata(tail)
            if md.is_closed and first_log_entry(md.custom_metadata) and md.last_entry_id >= 0:
                rh = await self.client.open_ledger(tail, password, recovery=False)
                got = decode_log_header((await rh.read_batch(0, 0))[0].payload)
                if got is not None and got.first_offset >= 0:
                    return got.first_offset + log_entry_count(md)
            seg = (await self.layout(name))[-1]
        except (LedgerdError, ValueError):
            return -1
        if seg.first_offset is None or seg.count is None:
            return -1
        return seg.first_offset + seg.count

    async def _open_unbounded(self, name: str, record: LogRecord,
                              quorums: tuple[int, int, int], password: bytes | str) -> LogWriter:
        if record.ledgers:
            handle = await self.client.take_over_ledger(record.ledgers[0], password)
        else:
            handle = await self.client.create_unbounded_ledger(*quorums, password=password)
            lid = handle.ledger_id

            def claim(current: LogRecord) -> LogRecord:
                if current.ledgers:
                    return current  # another writer created it first
                return replace(current, ledgers=(lid,), unbounded=True)

            record, _ = await self.store.update(name, claim)
            if record.ledgers != (lid,):
                await handle.abandon()
                await self.client.delete_ledger(lid)
                if not record.unbounded:
                    raise LogFencedError(name, "another writer created it backed by ledgers")
                handle = await self.client.take_over_ledger(record.ledgers[0], password)
        log.info("log_writer_opened", extra=fields(log=name, ledger=handle.ledger_id,
                                                   term=handle.term))
        return LogWriter(self, name, handle, password=password, quorums=quorums,
                         roll_entries=0, roll_bytes=0, unbounded=True, epoch=handle.term)

    async def ledgers(self, name: str) -> tuple[int, ...]:
        """The log's ledger ids in order; NoSuchLogError names a missing log."""
        try:
            record, _ = await self.store.get(name)
        except NoNodeError:
            raise NoSuchLogError(name) from None
        return record.ledgers

    async def append_ledgers(self, name: str, ledger_ids: Iterable[int], *,
                             password: bytes | str = b"", create: bool = True,
                             batch: tuple[str, int] | None = None) -> tuple[int, ...]:
        """Add closed ledgers to the end of the log with one CAS; returns the new list.

        The log's last ledgers are fenced first, so a writer still adding to the tail fails
        instead of writing behind the new ledgers. With ``batch = (writer, n)`` the same CAS
        records that ``writer`` appended its batch ``n``; a batch at or below the last one
        recorded for that writer raises BatchAlreadyAppendedError and changes nothing (a
        replay after a crash: the ledgers are the caller's to delete)."""
        new = tuple(ledger_ids)
        if batch is not None and (not batch[0] or batch[1] < 0):
            raise ValueError(f"batch must be (a writer name, a number >= 0), got {batch!r}")
        for lid in new:
            if not (await self.client.ledger_metadata(lid)).is_closed:
                raise LedgerdError(f"log {name!r}: ledger {lid} must be closed before it is "
                                   "added to a log")
        await self._ensure(name, create)
        await self._fence((await self.ledgers(name))[-FENCE_TAIL:], password)

        def change(record: LogRecord) -> LogRecord:
            if record.unbounded:
                raise LedgerdError(f"log {name!r} is backed by an unbounded ledger; ledgers "
                                   "cannot be added to it")
            if batch is None:
                return replace(record, ledgers=record.ledgers + new)
            writer, n = batch
            if record.last_batch(writer) >= n:
                raise BatchAlreadyAppendedError(name, writer, n, record.last_batch(writer))
            return replace(record, ledgers=record.ledgers + new,
                           commits=record.with_batch(writer, n))

        record, _ = await self.store.update(name, change)
        log.info("log_ledgers_appended", extra=fields(log=name, ledgers=",".join(map(str, new))))
        return record.ledgers

    async def new_replacement(self, name: str, old_ledger_id: int, prev: int, *,
                              password: bytes | str = b"",
                              custom: Mapping[str, str] | None = None) -> WriteHandle:
        """An open ledger to take the place of closed ledger ``old_ledger_id`` of the log
        (``replace_ledgers``): the same quorums and custom metadata (with ``custom``
        added) and, if the old one starts with a log header, a header with the same
        place (``seq``, first offset, writers, extra) and ``prev`` as the ledger listed
        before it. The caller appends the entries and closes it. If cancelled, the
        ledger may remain, on no list (the caller tags it to find it again)."""
        md = await self.client.ledger_metadata(old_ledger_id)
        tags = {**dict(md.custom_metadata), **(custom or {})}
        tags.pop(HEADER_KEY, None)
        quorums = (md.ensemble_size, md.write_quorum, md.ack_quorum)
        if not first_log_entry(md.custom_metadata):
            return await self._new_ledger(name, quorums, password, prev, None, custom=tags)
        rh = await self.client.open_ledger(old_ledger_id, password, recovery=False)
        try:
            old = decode_log_header((await rh.read_batch(0, 0))[0].payload)
        finally:
            await rh.close()
        if old is None:
            raise LedgerdError(f"log {name!r}: ledger {old_ledger_id} has no log header")
        return await self._new_ledger(name, quorums, password, prev,
                                      (old.seq, old.first_offset), writers=old.writers,
                                      extra=old.extra, custom=tags)

    async def replace_ledgers(self, name: str, swap: Mapping[int, int], *,
                              deleted: Callable[[], None] | None = None,
                              delay_ms: int = 0) -> tuple[int, ...]:
        """Put each closed ledger ``new`` in the place of ``old`` (``swap``: old ->
        new, same entry counts) with one compare-and-set of the ledger list, refused
        (LogFencedError, nothing changed) unless every old one is still listed; then
        delete the old ledgers, or with ``delay_ms`` defer that (``reap``). Returns the
        new list. A crash before the CAS leaves the old ledgers listed (the new ones on
        no list); after it, the new ones (the old ones, if not deleted yet, on no list,
        or deferred)."""
        for new in swap.values():
            if not (await self.client.ledger_metadata(new)).is_closed:
                raise LedgerdError(f"log {name!r}: ledger {new} must be closed before it "
                                   "replaces another")

        def change(record: LogRecord) -> LogRecord:
            missing = [lid for lid in swap if lid not in record.ledgers]
            if missing or record.unbounded:
                raise LogFencedError(name, f"ledgers {missing} are no longer listed; the "
                                           "list changed during compaction")
            return replace(record, ledgers=tuple(swap.get(lid, lid)
                                                 for lid in record.ledgers),
                           deferred=deferral.apply(record, tuple(swap)))

        deferral = _Deferral(delay_ms)
        try:
            record, _ = await self.store.update(name, change)
        except NoNodeError:
            raise NoSuchLogError(name) from None
        if delay_ms > 0 and deleted is not None:
            deleted()  # swapped; the deletions are the record's now
        for old in deferral.now:
            if deleted is not None and delay_ms <= 0:
                deleted()
            try:
                await self.client.delete_ledger(old)
            except NoSuchLedgerError:
                pass
        log.info("log_ledgers_replaced", extra=fields(
            log=name, replaced=",".join(f"{o}->{n}" for o, n in swap.items())))
        return record.ledgers

    async def truncate(self, name: str, before_ledger: int, *, delay_ms: int = 0,
                       mark: int = 0) -> list[int]:
        """Drop (and delete, or with ``delay_ms`` defer that: ``reap``) every ledger
        listed before ``before_ledger``; returns them. The record's ``base`` grows by
        their entries, so offsets do not move; its ``mark`` becomes at least ``mark``
        in the same compare-and-set (the application's lower bound of the log's next
        position, for when the dropped ledgers held the last of it)."""
        record, _ = await self._record(name)
        if before_ledger not in record.ledgers:
            raise LedgerdError(f"log {name!r} has no ledger {before_ledger}")
        cut = record.ledgers.index(before_ledger)
        counts = [await self._closed_count(name, lid) for lid in record.ledgers[:cut]]
        return await self._drop_front(name, record.ledgers[:cut], sum(counts),
                                      delay_ms=delay_ms, mark=mark)

    async def truncate_before(self, name: str, offset: int) -> dict[str, int]:
        """Retention by offset: drop whatever holds only entries before ``offset`` — whole
        closed ledgers, or an unbounded ledger's whole fragments. Returns what was dropped
        (``ledgers`` or ``fragments``) and the log's new first offset (``start``)."""
        record, _ = await self._record(name)
        if record.unbounded:
            lid = record.ledgers[0]
            md = await self.client.ledger_metadata(lid)
            before = len(md.ensembles)
            md = await self.client.trim_ledger(lid, entry_for_offset(md, offset))
            return {"fragments": before - len(md.ensembles),
                    "start": md.start_entry - md.noops_before(md.start_entry)}
        layout = await self.layout(name)
        drop: list[int] = []
        entries = 0
        for seg in layout[:-1]:
            if seg.count is None or seg.first_offset is None or \
                    seg.first_offset + seg.count > offset:
                break
            drop.append(seg.ledger_id)
            entries += seg.count
        await self._drop_front(name, tuple(drop), entries)
        return {"ledgers": len(drop), "start": record.base + entries}

    async def read(self, name: str, password: bytes | str = b"", *,
                   start: LogPosition | None = None) -> AsyncIterator[Entry]:
        """Every readable entry of the log in order, from ``start`` (inclusive); closed
        ledgers to their end, an open one to its LAC. Nothing is fenced."""
        for lid, first in log_segments(name, await self.ledgers(name), start):
            rh = await self.client.open_ledger(lid, password, recovery=False)
            first = max(first, first_log_entry(rh.metadata.custom_metadata))
            last = rh.last_add_confirmed if rh.is_closed else await rh.read_lac()
            if first <= last:
                async for entry in rh.read(first, last):
                    yield entry

    async def follow(self, name: str, password: bytes | str = b"", *,
                     start: Start | LogCursor = "start", poll_s: float = 1.0,
                     ) -> AsyncGenerator[LogEntry, None]:
        """Every entry of the log from ``start`` on, once, in order, across ledgers and
        terms; then wait for new ones (long polls of ``poll_s``) for as long as the caller
        iterates. Only acknowledged entries are returned (nothing past the LAC); an idle
        writer's last entry shows within its ``explicit_lac_interval_ms``. Nothing is fenced.
        """
        if isinstance(start, LogCursor):
            cursor = start
            begin: Start = "start" if cursor.record is None else cursor.record.offset
        else:
            begin = start
        index, eid, offset = await self._resolve(name, password, begin)
        record, _ = await self._record(name)
        while not record.ledgers:  # empty: wait for a first ledger
            await trio.sleep(poll_s)
            record, _ = await self._record(name)
        lid = record.ledgers[index]
        while True:
            rh = await self.client.open_ledger(lid, password, recovery=False)
            eid = max(eid, first_log_entry(rh.metadata.custom_metadata))  # skip its header
            if not rh.is_closed:
                await rh.read_lac()
            while True:
                last = rh.last_add_confirmed
                if eid <= last:
                    top = min(last, eid + 255)
                    for entry in await rh.read_batch(eid, top):
                        yield LogEntry(LogPosition(lid, entry.entry_id), offset, entry.payload)
                        offset += 1
                    eid = top + 1
                    continue
                if rh.is_closed:
                    break
                if await rh.wait_lac_beyond(eid - 1, timeout=poll_s) < eid:
                    await rh.refresh()  # nothing new: closed meanwhile (a roll)?
            # The ledger is closed and read to its end: on to the next one listed.
            while True:
                record, _ = await self._record(name)
                if lid not in record.ledgers:
                    raise LedgerdError(f"log {name!r}: ledger {lid} was truncated away while "
                                       "being read")
                i = record.ledgers.index(lid)
                if i + 1 < len(record.ledgers):
                    lid, eid = record.ledgers[i + 1], 0
                    break
                await trio.sleep(poll_s / 4)

    async def open_cursor(self, name: str, cursor: str) -> LogCursor:
        """The named cursor of a log, as last committed (a new one starts at the start)."""
        await self._record(name)
        got = await self.store.get_cursor(name, cursor)
        if got is None:
            return LogCursor(self.store, name, cursor, None, None)
        return LogCursor(self.store, name, cursor, got[0], got[1])

    async def layout(self, name: str) -> list[LogSegment]:
        """The log's ledgers with their offsets (an unbounded log: its one ledger, from its
        first kept entry's offset)."""
        record, _ = await self._record(name)
        out: list[LogSegment] = []
        offset: int | None = record.base
        for lid in record.ledgers:
            try:
                md = await self.client.ledger_metadata(lid)
            except NoSuchLedgerError:
                raise LedgerdError(f"log {name!r}: listed ledger {lid} is gone") from None
            if record.unbounded:
                out.append(LogSegment(lid, md.start_entry - md.noops_before(md.start_entry),
                                      None))
                break
            count = log_entry_count(md) if md.is_closed else None
            out.append(LogSegment(lid, offset, count, first_log_entry(md.custom_metadata)))
            offset = None if offset is None or count is None else offset + count
        return out

    async def _ensure(self, name: str, create: bool) -> None:
        if not create:
            await self.ledgers(name)
            return
        try:
            await self.store.create(name)
        except NodeExistsError:
            pass

    async def _fence(self, ledger_ids: Iterable[int], password: bytes | str) -> None:
        """Open each ledger with recovery: an open one is fenced and closed."""
        for lid in ledger_ids:
            try:
                md = await self.client.ledger_metadata(lid)
            except NoSuchLedgerError:
                continue  # deleted (truncated) already: nothing can be added to it
            if not md.is_closed:
                await self.client.open_ledger(lid, password, recovery=True)

    async def _closed_count(self, name: str, lid: int) -> int:
        try:
            md = await self.client.ledger_metadata(lid)
        except NoSuchLedgerError:
            raise LedgerdError(f"log {name!r}: listed ledger {lid} is gone") from None
        if not md.is_closed:
            raise LedgerdError(f"log {name!r}: ledger {lid} is still open; truncation drops "
                               "closed ledgers only (open the log's writer to close it)")
        return log_entry_count(md)

    async def _drop_front(self, name: str, drop: tuple[int, ...], entries: int, *,
                          delay_ms: int = 0, mark: int = 0) -> list[int]:
        def change(record: LogRecord) -> LogRecord:
            if record.ledgers[:len(drop)] != drop:
                raise LogFencedError(name, "the log's front changed during truncation")
            return replace(record, ledgers=record.ledgers[len(drop):], base=record.base + entries,
                           first_seq=record.first_seq + len(drop),
                           deferred=deferral.apply(record, drop),
                           mark=max(record.mark, mark))

        if not drop:
            return []
        deferral = _Deferral(delay_ms)
        try:
            await self.store.update(name, change)
        except NoNodeError:
            raise NoSuchLogError(name) from None
        for lid in deferral.now:
            try:
                await self.client.delete_ledger(lid)
            except NoSuchLedgerError:
                pass
        log.info("log_truncated", extra=fields(log=name, dropped=",".join(map(str, drop)),
                                               delete_in_ms=max(delay_ms, 0)))
        return list(drop)

    async def reap(self, name: str, *, now_ms: int | None = None) -> list[int]:
        """Delete the log's ledgers whose deferred deletion is due (``truncate`` or
        ``replace_ledgers`` with ``delay_ms``) and take them off the record (one
        compare-and-set); returns them. A crash between the deletions and the
        compare-and-set leaves them on the record, and the next call finds them gone."""
        record, _ = await self._record(name)
        now = int(time.time() * 1000) if now_ms is None else now_ms
        due = tuple(lid for lid, at in record.deferred if at <= now)
        if not due:
            return []
        for lid in due:
            try:
                await self.client.delete_ledger(lid)
            except NoSuchLedgerError:
                pass

        def change(current: LogRecord) -> LogRecord:
            return replace(current, deferred=tuple(d for d in current.deferred
                                                   if d[0] not in due))

        try:
            await self.store.update(name, change)
        except NoNodeError:
            return list(due)  # the log went (its deletion took the rest)
        log.info("log_deferred_deleted", extra=fields(log=name,
                                                      ledgers=",".join(map(str, due))))
        return list(due)

    async def _record(self, name: str) -> tuple[LogRecord, int]:
        try:
            return await self.store.get(name)
        except NoNodeError:
            raise NoSuchLogError(name) from None

    async def _resolve(self, name: str, password: bytes | str, start: Start,
                       ) -> tuple[int, int, int]:
        """``(segment index, entry id, offset)`` where a read from ``start`` begins."""
        record, _ = await self._record(name)
        if not record.ledgers:
            if start in ("start", "end") or start == record.base:
                return 0, 0, record.base
            raise LedgerdError(f"log {name!r} is empty; it has no {start!r}")
        if record.unbounded:
            md = await self.client.ledger_metadata(record.ledgers[0])
            first = md.start_entry - md.noops_before(md.start_entry)
            if start == "start":
                return 0, md.start_entry, first
            if start == "end":
                rh = await self.client.open_ledger(record.ledgers[0], password, recovery=False)
                lac = await rh.read_lac()
                return 0, lac + 1, lac + 1 - rh.metadata.noops_before(lac + 1)
            if isinstance(start, LogPosition):
                if start.ledger_id != record.ledgers[0]:
                    raise LedgerdError(f"log {name!r} has no ledger {start.ledger_id}")
                return 0, start.entry_id, start.entry_id - md.noops_before(start.entry_id)
            if start < first:
                raise LedgerdError(f"log {name!r}: offset {start} was truncated (the log starts "
                                   f"at {first})")
            return 0, entry_for_offset(md, start), start
        layout = await self.layout(name)
        if start == "start":
            return 0, layout[0].first_entry, record.base
        if start == "end":
            last = layout[-1]
            if last.first_offset is None:
                raise LedgerdError(f"log {name!r}: its end is not known while an earlier "
                                   "ledger is still open (a writer is taking over)")
            if last.count is not None:
                return (len(layout) - 1, last.first_entry + last.count,
                        last.first_offset + last.count)
            rh = await self.client.open_ledger(last.ledger_id, password, recovery=False)
            lac = max(await rh.read_lac(), last.first_entry - 1)
            return len(layout) - 1, lac + 1, last.first_offset + lac + 1 - last.first_entry
        if isinstance(start, LogPosition):
            for i, seg in enumerate(layout):
                if seg.ledger_id == start.ledger_id:
                    if seg.first_offset is None:
                        raise LedgerdError(f"log {name!r}: ledger {seg.ledger_id}'s offsets are "
                                           "not known yet (an earlier ledger is still open)")
                    eid = max(start.entry_id, seg.first_entry)
                    return i, eid, seg.first_offset + eid - seg.first_entry
            raise LedgerdError(f"log {name!r} has no ledger {start.ledger_id} (truncated, or "
                               "never in this log)")
        if start < record.base:
            raise LedgerdError(f"log {name!r}: offset {start} was truncated (the log starts at "
                               f"{record.base})")
        for i, seg in enumerate(layout):
            if seg.first_offset is None:
                break
            if seg.count is None or start < seg.first_offset + seg.count:
                return i, start - seg.first_offset + seg.first_entry, start
        raise LedgerdError(f"log {name!r}: offset {start} is past the end of its closed ledgers")
